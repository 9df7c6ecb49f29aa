"""`hpcdist report`, the array task states it reads, and the overrides a training records."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.jobs.records import JobRecord, save_record
from hpcdist.jobs.report import Row, collect, failure_reason, mark_best, plot, table, task_ids
from hpcdist.slurm.arrays import parse_task_states
from hpcdist.slurm.parse import expand_task_ids
from hpcdist.slurm.query import JobInfo
from hpcdist.state.folders import state_dir
from hpcdist.state.outputs import book_for, write_output
from ufsemulator.config import Config, ConfigError
from ufsemulator.overrides import apply_to, overrides_record
from ufsemulator.training.runfiles import default_run_dir


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("123_4", ["123_4"]),
        ("123_[5-7%2]", ["123_5", "123_6", "123_7"]),
        ("123_[1,3-4]", ["123_1", "123_3", "123_4"]),
        ("123_[2]", ["123_2"]),
        ("123", []),
        ("123.batch", []),
    ],
)
def test_array_task_ids_expand_as_squeue_folds_them(text: str, ids: list[str]) -> None:
    assert expand_task_ids(text) == ids


def test_task_states_take_the_last_line_of_each_task() -> None:
    lines = "9_0|COMPLETED\n9_1|FAILED\n9_[2-3%2]|PENDING\n9_1|REQUEUED\n9_2|CANCELLED by 0\n"
    assert parse_task_states(lines) == {
        "9_0": "COMPLETED",
        "9_1": "REQUEUED",
        "9_2": "CANCELLED",
        "9_3": "PENDING",
    }


def _row(job: str, loss: float | None, state: str = "COMPLETED", **extra: object) -> Row:
    return Row(
        job_id=job,
        overrides=["training.epochs=20", f"training.lr={job}"],
        state=state,
        best_val_loss=loss,
        val_r2=None if loss is None else 1 - loss,
        epochs=None if loss is None else 20,
        wall_time_s=None if loss is None else 6.5,
        run_dir=f"runs/{job}",
        val_curve=() if loss is None else (1.0, loss),
        **extra,  # type: ignore[arg-type]
    )


def test_rows_sort_by_validation_loss_the_best_marked_failures_last() -> None:
    rows = mark_best(
        [_row("5_0", 0.2), _row("5_1", None, "FAILED", reason="boom"), _row("5_2", 0.1)]
    )
    assert [(r.job_id, r.best) for r in rows] == [("5_2", True), ("5_0", False), ("5_1", False)]
    text = table(rows)
    lines = text.splitlines()
    assert lines[0].split() == [
        "job",
        "overrides",
        "state",
        "best",
        "val",
        "loss",
        "R^2",
        "epochs",
        "wall",
        "s",
    ]
    # The overrides every point shares (training.epochs=20) are left out of the table.
    assert lines[1].split() == [
        "*",
        "5_2",
        "training.lr=5_2",
        "COMPLETED",
        "0.1",
        "0.9000",
        "20",
        "6.5",
    ]
    assert lines[3].split() == ["5_1", "training.lr=5_1", "FAILED", "-", "-", "-", "-"]
    assert lines[4] == "5_1 FAILED: boom"
    assert lines[5] == "best: 5_2 (runs/5_2)"


def test_the_table_prints_every_value_with_its_control_characters_escaped() -> None:
    # A reason is a line of a log, a folder is SLURM's WorkDir: another user's text where
    # the job is theirs (a name with newlines posed as rows; ESC ] 0 retitles a terminal).
    rows = mark_best(
        [
            dataclasses.replace(_row("5_0", 0.1), run_dir="/p/\x1b]0;pwned\x07\n5_1 COMPLETED"),
            _row("5_1", None, "FAILED\x1b[2J", reason="\x1b]0;pwned\x07disk\tfull\nbest: 5_1"),
        ]
    )
    lines = table(rows).splitlines()
    assert lines[1:] == [
        "*  5_0  training.lr=5_0  COMPLETED      0.1            0.9000  20      6.5",
        "   5_1  training.lr=5_1  FAILED\\x1b[2J  -              -       -       -",
        "5_1 FAILED\\x1b[2J: \\x1b]0;pwned\\x07disk\\x09full\\x0abest: 5_1",
        "best: 5_0 (/p/\\x1b]0;pwned\\x07\\x0a5_1 COMPLETED)",
    ]
    plain = mark_best([_row("5_0", 0.1), _row("5_1", None, "FAILED", reason="disk full")])
    assert table(plain).splitlines()[3:] == ["5_1 FAILED: disk full", "best: 5_0 (runs/5_0)"]


def test_report_of_a_job_slurm_knows_escapes_its_logs_error_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "emu-77.out"
    log.write_text("Epoch 1/3\nerror: \x1b]0;pwned\x07data file gone\n")
    info = dataclasses.replace(_slurm_info("77", str(tmp_path)), state="FAILED", stdout=str(log))
    monkeypatch.setattr("hpcdist.jobs.report.query_jobs", lambda job: [info])
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["report", "77"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2:] == ["77 FAILED: \\x1b]0;pwned\\x07data file gone"]


def test_no_row_is_best_when_no_training_finished_an_epoch() -> None:
    rows = mark_best([_row("5_0", None, "FAILED"), _row("5_1", None, "FAILED")])
    assert [r.best for r in rows] == [False, False]


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        (
            "Epoch 1/3\nerror: data file '/x.nc' does not exist\nTraceback\nValueError: x\n",
            "data file '/x.nc' does not exist",
        ),
        (
            "Traceback (most recent call last):\nRuntimeError: gloo timed out\n",
            "RuntimeError: gloo timed out",
        ),
        ("Epoch 1/3\nkilled\n", None),
        # srun --label's rank before each line of the job's log
        (
            "0: Epoch 1/3\n0: error: data file '/x.nc' does not exist\nsrun: error: node1\n",
            "data file '/x.nc' does not exist",
        ),
        ("1: Traceback (most recent call last):\n1: OSError: disk full\n", "OSError: disk full"),
    ],
)
def test_a_failed_task_is_explained_by_the_last_error_of_its_rank_0_log(
    log: str, reason: str | None, tmp_path: Path
) -> None:
    record = _record("7_1", tmp_path)
    (tmp_path / "7_1_0_log.out").write_text(log)
    assert failure_reason([record.log_path(0), record.log_path(0, "err")]) == reason


@pytest.mark.parametrize("planted", ["link", "foreign", None])
def test_a_failed_tasks_reason_is_never_read_through_a_link_or_from_anothers_file(
    planted: str | None, tmp_path: Path
) -> None:
    # A job found through SLURM may be another user's: its StdOut, a link to your secret.
    secret = tmp_path / "secret"
    secret.write_text("error: the victim's token 1234\n")
    log = tmp_path / "emu-9.out"
    if planted == "link":
        log.symlink_to(secret)
    else:
        log.write_text("Epoch 1/3\nerror: data file gone\n")
        if planted == "foreign":
            if os.geteuid() != 0:
                pytest.skip("chown to another user needs root")
            os.chown(log, 65534, 65534)
    reason = failure_reason([log])
    assert reason == (None if planted else "data file gone")


def _record(
    job: str,
    folder: Path,
    points: list[list[str]] | None = None,
    workdir: Path | None = None,
) -> JobRecord:
    # A record without the folder the job ran in is one written before it was kept.
    ran_in: dict[str, Any] = {} if workdir is None else {"workdir": str(workdir)}
    return JobRecord(
        job_id=job,
        executor="slurm",
        name="n",
        mode="gloo",
        nodes=2,
        tasks=2,
        folder=str(folder),
        submitted=time.time(),
        command=["python3"],
        points=points,
        **ran_in,
    )


def test_an_array_record_reads_each_task_its_run_folder_and_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = [["training.lr=1e-3"], ["training.lr=3e-3"]]
    array = _record("40", tmp_path, points)
    assert task_ids(array) == [("40_0", points[0]), ("40_1", points[1])]
    assert task_ids(_record("40_1", tmp_path, [points[1]])) == [("40_1", points[1])]
    assert task_ids(_record("41", tmp_path)) == [("41", [])]
    for record in (array, _record("40_0", tmp_path, [points[0]]), _record("40_1", tmp_path)):
        save_record(record, tmp_path)
    results = {"best_val_loss": 0.05, "best_val_r2": 0.95, "epochs_run": 20, "wall_time_s": 6.0}
    run = tmp_path / "runs" / "40_1"
    run.mkdir(parents=True)
    _written(run / "training_results.json", {**results, "history": {"val_loss": [0.5, 0.05]}})
    # The job's log, where SLURM says (srun's labels before the ranks' lines).
    (tmp_path / "emu-41.out").write_text("0: error: no such file\nsrun: error: node1\n")
    info = dataclasses.replace(
        _slurm_info("40_0", str(tmp_path)), stdout=str(tmp_path / "emu-41.out")
    )
    monkeypatch.setattr("hpcdist.jobs.report.query_jobs", lambda job: [info])
    monkeypatch.setattr(
        "hpcdist.jobs.report.sweep_states",
        lambda job, count, arrays: {"40_0": "FAILED", "40_1": "COMPLETED"},
    )
    rows = collect("40", tmp_path)
    assert [(r.job_id, r.state, r.best_val_loss, r.best, r.reason) for r in rows] == [
        ("40_1", "COMPLETED", 0.05, True, None),
        ("40_0", "FAILED", None, False, "no such file"),
    ]
    assert rows[0].val_curve == (0.5, 0.05) and rows[0].epochs == 20
    plot(rows, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


_RESULTS = {"best_val_loss": 0.25, "best_val_r2": 0.75, "epochs_run": 3, "wall_time_s": 2.0}


def _written(path: Path, results: object) -> None:
    """A results file as a training in the folder above ``runs/`` writes it: its digest in
    that folder's private state."""
    text = results if isinstance(results, str) else json.dumps(results)
    write_output(path, text.encode(), book_for(path.parent.parent.parent))


def _results(run: Path) -> None:
    run.mkdir(parents=True)
    _written(run / "training_results.json", _RESULTS)


def _slurm_info(job: str, workdir: str | None) -> JobInfo:
    return JobInfo(
        job_id=job,
        name="n",
        state="COMPLETED",
        reason=None,
        nodes="node1",
        num_nodes=1,
        elapsed_s=10.0,
        limit_s=60.0,
        exit_code=0,
        signal=0,
        restarts=0,
        stdout=None,
        stderr=None,
        workdir=workdir,
        source="sacct",
    )


def test_report_from_the_submit_folder_reads_the_run_folder_of_a_job_with_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "scratch run"
    project.mkdir()
    _results(elsewhere / "runs" / "41")
    save_record(_record("41", project, workdir=elsewhere), project)
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: "COMPLETED")
    monkeypatch.setattr("hpcdist.jobs.report.query_jobs", _no_slurm_query)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(cli, ["report", "41"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["*", "41", "-", "COMPLETED", "0.25", "0.7500", "3", "2.0"]
    assert lines[2] == f"best: 41 ({elsewhere / 'runs' / '41'})"


@pytest.mark.parametrize("piece", [True, False])
def test_report_reads_the_run_folder_the_runs_record_names(
    piece: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HPCDIST_RUN_DIR (or --continue) trained the job in a folder of its own: the job's
    # piece of its run, in the private state, says where; without one, runs/<job>.
    project, elsewhere = tmp_path / "project", tmp_path / "scratch" / "exp1"
    project.mkdir()
    elsewhere.mkdir(parents=True)
    write_output(
        elsewhere / "training_results.json", json.dumps(_RESULTS).encode(), book_for(project)
    )
    save_record(_record("46", project, workdir=project), project)
    if piece:
        record = state_dir("runs", "46-ab", project_dir=project) / "46-0.json"
        record.write_text(json.dumps({"job_id": "46", "run_dir": str(elsewhere), "started": 1}))
        record.chmod(0o600)
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: "COMPLETED")
    monkeypatch.setattr("hpcdist.jobs.report.query_jobs", _no_slurm_query)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    monkeypatch.chdir(project)
    result = CliRunner().invoke(cli, ["report", "46"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    if piece:
        assert lines[1:] == [
            "*  46   -          COMPLETED  0.25           0.7500  3       2.0",
            f"best: 46 ({elsewhere})",
        ]
    else:
        assert lines[1:] == [
            "  46   -          COMPLETED  -              -    -       -",
            f"46 COMPLETED: no training_results.json in '{project / 'runs' / '46'}'",
        ]


def _no_slurm_query(job: str) -> list[JobInfo]:
    raise AssertionError("a record that names its folder needs no SLURM query")


def test_an_older_record_finds_the_run_folder_from_slurms_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    _results(elsewhere / "runs" / "42")
    save_record(_record("42", project), project)  # no workdir: written before it was kept
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: "COMPLETED")
    monkeypatch.setattr(
        "hpcdist.jobs.report.query_jobs", lambda job: [_slurm_info(job, str(elsewhere))]
    )
    [row] = collect("42", project)
    assert (row.best_val_loss, row.run_dir, row.reason) == (
        0.25,
        str(elsewhere / "runs" / "42"),
        None,
    )


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("COMPLETED", "no training_results.json in '{runs}/43'"),
        ("UNKNOWN", "no training_results.json in '{runs}/43'"),
        ("FAILED", "ended FAILED; no training_results.json in '{runs}/43'"),
        ("RUNNING", None),  # no results yet is what running means
        ("PENDING", None),
    ],
)
def test_a_row_without_results_says_which_folder_was_looked_in(
    state: str, reason: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    save_record(_record("43", project), project)
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: state)
    monkeypatch.setattr("hpcdist.jobs.report.query_jobs", lambda job: [_slurm_info(job, None)])
    [row] = collect("43", project)
    runs = project / "runs"
    assert row.reason == (None if reason is None else reason.format(runs=runs))
    if reason is not None:
        assert table([row]).splitlines()[2] == f"43 {state}: {reason.format(runs=runs)}"


def test_an_unreadable_results_file_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    (project / "runs" / "44").mkdir(parents=True)
    _written(project / "runs" / "44" / "training_results.json", "{not json")
    save_record(_record("44", project, workdir=project), project)
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: "COMPLETED")
    [row] = collect("44", project)
    assert row.reason == (
        f"{str(project / 'runs' / '44' / 'training_results.json')!r} cannot be read as the "
        "training's results"
    )


def test_overrides_apply_after_the_config_and_are_recorded_as_used() -> None:
    config = apply_to(Config(), ["training.lr=3e-4", "model.hidden_sizes=[8, 8]", "data.thin=2"])
    assert (config.training.lr, config.model.hidden_sizes, config.data.thin) == (3e-4, (8, 8), 2)
    assert overrides_record(config, ["training.lr=3e-4", "model.hidden_sizes=[8, 8]"]) == {
        "training.lr": 3e-4,
        "model.hidden_sizes": [8, 8],
    }
    assert apply_to(config, []) is config
    with pytest.raises(ConfigError, match=r"unknown key 'model\.width'"):
        apply_to(Config(), ["model.width=3"])


@pytest.mark.parametrize(
    ("environ", "name"),
    [
        ({"SLURM_JOB_ID": "102", "SLURM_ARRAY_JOB_ID": "100", "SLURM_ARRAY_TASK_ID": "2"}, "100_2"),
        ({"SLURM_JOB_ID": "102"}, "102"),
        (
            {
                "SLURM_JOB_ID": "102",
                "SLURM_ARRAY_JOB_ID": "100",
                "SLURM_ARRAY_TASK_ID": "2",
                "HPCDIST_RUN_DIR": "runs/90_2",
            },
            None,
        ),
    ],
)
def test_an_array_task_trains_in_runs_array_underscore_task(
    environ: dict[str, str], name: str | None
) -> None:
    path = default_run_dir(environ, base=Path("/scratch"))
    assert path == (Path("/scratch/runs") / name if name else Path("/scratch/runs/90_2"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "training.lrr=1"], "error: unknown key 'training.lrr' in config; allowed in "),
        (["--set", "training.lr=x"], "error: 'training.lr' must be a number, got 'x'\n"),
        (["--set", "oops"], "error: --set 'oops'; expected KEY=VALUE with a dotted config key\n"),
    ],
)
def test_ufsemulator_train_set_refuses_a_bad_override_in_one_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ufsemulator", "train", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("change", ["rewritten", "foreign", "unrecorded"])
def test_results_not_as_the_training_wrote_them_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    project = tmp_path / "project"
    path = project / "runs" / "45" / "training_results.json"
    path.parent.mkdir(parents=True)
    _written(path, _RESULTS)
    if change == "rewritten":  # in place, as a group-writable file allowed
        path.write_text(json.dumps({**_RESULTS, "best_val_loss": 1e-06}))
        said = "its SHA-256"
    elif change == "foreign":
        os.chown(path, 4242, -1)
        said = "is owned by uid 4242"
    else:
        book_for(project).record_path(path).unlink()  # as a file the user never wrote
        said = "no digest of it was recorded"
    save_record(_record("45", project, workdir=project), project)
    monkeypatch.setattr("hpcdist.jobs.report.job_state", lambda record: "COMPLETED")
    [row] = collect("45", project)
    assert row.best_val_loss is None and row.reason is not None
    assert (
        row.reason.startswith(f"refusing training results {str(path)!r}: ") and said in row.reason
    )
    assert "\n" not in row.reason
