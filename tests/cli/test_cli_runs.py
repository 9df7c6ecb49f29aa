"""One run across its jobs on the login node: the record's pieces in their order, the run a
job belongs to, `list`'s grouping, the heartbeat read only where the user alone could write
it, one start of a requeued job's log, and the lines `status` prints for a running job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpcdist.cli.runs import group_by_run, progress_lines, start_of
from hpcdist.facts.heartbeat import Heartbeat
from hpcdist.jobs.runs import (
    load_run,
    read_heartbeat,
    run_ids,
    run_of_job,
    runs_by_job,
    trained_in,
)
from hpcdist.slurm.query import Attempt


def _write(path: Path, data: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(json.dumps(data))
    path.chmod(0o600)


@pytest.fixture
def records(tmp_path: Path) -> Path:
    root = tmp_path / ".hpcdist" / "runs"
    run_dir = tmp_path / "runs" / "41"
    run_dir.mkdir(parents=True)
    base = {"workdir": str(tmp_path), "run_dir": str(run_dir), "nodes": "node[1-2]"}
    _write(root / "41-ab" / "41-0.json", {**base, "job_id": "41", "restart": 0, "started": 10})
    _write(root / "41-ab" / "41-1.json", {**base, "job_id": "41", "restart": 1, "started": 20})
    _write(root / "41-ab" / "45-0.json", {**base, "job_id": "45", "restart": 0, "started": 30})
    resumed = {"epoch": 3, "step": 90, "time": 15.0}
    _write(root / "41-ab" / "41-0.train.json", {"run_dir": str(run_dir), "resumed_from": None})
    _write(root / "41-ab" / "41-1.train.json", {"run_dir": str(run_dir), "resumed_from": resumed})
    _write(root / "50-cd" / "50-0.json", {**base, "job_id": "50", "restart": 0, "started": 40})
    os.utime(root / "41-ab", (1, 1))
    return root


def test_a_run_lists_its_pieces_in_the_order_they_started(records: Path) -> None:
    run = load_run("41-ab", records)
    assert run is not None
    assert [(p.job_id, p.restart) for p in run.pieces] == [("41", 0), ("41", 1), ("45", 0)]
    assert run.job_ids == ["41", "45"]
    assert run.pieces[0].resumed_from is None
    assert run.pieces[1].resumed_from == {"epoch": 3, "step": 90, "time": 15.0}
    assert load_run("99-zz", records) is None and load_run("../x", records) is None


def test_the_run_of_a_job_and_the_newest_first(records: Path) -> None:
    assert run_ids(records) == ["50-cd", "41-ab"]
    found = run_of_job("45", records)
    assert found is not None and found.run_id == "41-ab"
    assert run_of_job("4", records) is None  # a prefix of a job id is another job
    assert runs_by_job(records) == {"41": "41-ab", "45": "41-ab", "50": "50-cd"}


def test_a_record_file_others_could_write_is_not_read(records: Path) -> None:
    (records / "41-ab" / "45-0.json").chmod(0o622)
    run = load_run("41-ab", records)
    assert run is not None and run.job_ids == ["41"]


def test_list_keeps_the_jobs_of_one_run_together() -> None:
    rows = [("50",), ("49",), ("45",), ("41",)]
    grouped = group_by_run(rows, {"45": "41-ab", "41": "41-ab", "50": "50-cd"})  # type: ignore[arg-type]
    assert grouped == [("50-cd", ("50",)), ("-", ("49",)), ("41-ab", ("45",)), ("41-ab", ("41",))]
    rows = [("50",), ("45",), ("44",), ("41",)]
    grouped = group_by_run(rows, {"50": "41-ab", "41": "41-ab"})  # type: ignore[arg-type]
    assert [run for run, _ in grouped] == ["41-ab", "41-ab", "-", "-"]
    assert [row[0] for _, row in grouped] == ["50", "41", "45", "44"]


def test_the_heartbeat_is_read_only_where_nobody_else_could_write_it(records: Path) -> None:
    run = load_run("41-ab", records)
    assert run is not None
    beat, why = read_heartbeat(run)
    assert beat is None and "no heartbeat yet" in why
    path = Path(run.last.run_dir) / "heartbeat.json"
    path.write_bytes(Heartbeat(step=5, time=1.0).to_bytes())
    path.chmod(0o644)
    assert read_heartbeat(run) == (Heartbeat(step=5, time=1.0), "")
    path.chmod(0o666)
    beat, why = read_heartbeat(run)
    assert beat is None and "heartbeat not read" in why and "writable" in why


LOG = """\
hpcdist: job 41 on node[1-2], restart 0
Epoch 1/9
hpcdist: job 41 on node[1-2], restart 1
Resuming from runs/41/checkpoint.pt
hpcdist: job 41 on node[3-4], restart 2
Training completed
"""


@pytest.mark.parametrize(
    ("restart", "first", "last"),
    [
        (0, "hpcdist: job 41 on node[1-2], restart 0", "Epoch 1/9"),
        (1, "hpcdist: job 41 on node[1-2], restart 1", "Resuming from runs/41/checkpoint.pt"),
        (2, "hpcdist: job 41 on node[3-4], restart 2", "Training completed"),
    ],
)
def test_one_start_of_a_requeued_jobs_log(restart: int, first: str, last: str) -> None:
    lines = start_of(LOG, restart).splitlines()
    assert (lines[0], lines[-1], len(lines)) == (first, last, 2)


def test_a_start_missing_from_the_log_is_nothing() -> None:
    assert start_of(LOG, 3) == ""
    assert start_of("no script line\n", 0) == "no script line\n"


def _attempt(state: str, start: float, end: float, limit: float) -> Attempt:
    return Attempt("41", state, start - 5, start, end, end - start, limit, "node1")


def test_status_of_a_running_job_shows_progress_rate_and_end() -> None:
    beat = Heartbeat(
        step=300,
        steps=1000,
        epoch=2,
        epochs=5,
        piece_step=100,
        piece_started=1000.0,
        time=1100.0,
        samples_per_s=2000.0,
        loss=0.25,
        phase="training",
        checkpoint_epoch=1,
        checkpoint_step=200,
        checkpoint_time=1090.0,
        checkpoint_s=0.5,
    )
    lines = progress_lines(beat, _attempt("RUNNING", 990.0, 1290.0, 300.0), now=1105.0)
    text = "\n".join(lines)
    assert "progress:   step 300 of 1000 (30%), epoch 2 of 5, 2 steps/s" in text
    assert "2000 samples/s, loss 0.25" in text
    assert (
        "does not fit" in text and "1 more job (requeues) needed" in text
    )  # 160 s left, 290 a job
    assert "took 0.50 s" in text and "heartbeat:  5 s ago (training)" in text
    assert "warning" not in text
    fits = progress_lines(beat, _attempt("RUNNING", 990.0, 1500.0, 510.0), now=1105.0)
    assert "fits in the time limit" in "\n".join(fits)


def test_a_silent_running_job_is_called_a_possible_hang_with_advice() -> None:
    beat = Heartbeat(step=300, steps=1000, time=1000.0, phase="training")
    lines = "\n".join(progress_lines(beat, _attempt("RUNNING", 900.0, 5000.0, 4100.0), 1400.0))
    assert "no heartbeat for 0:06:40 while the job runs: the training may hang" in lines
    assert "--collective-timeout" in lines
    ended = "\n".join(progress_lines(beat, _attempt("COMPLETED", 900.0, 1001.0, 4100.0), 1400.0))
    assert "may hang" not in ended and "ends:" not in ended


def test_status_and_logs_of_a_run_through_the_command_line(
    records: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from hpcdist.cli import runs
    from hpcdist.cli.main import cli

    monkeypatch.chdir(records.parent.parent)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    ended = Attempt("41", "REQUEUED", 4.0, 10.0, 19.0, 9.0, 600.0, "node1")
    monkeypatch.setattr(runs, "job_attempts", lambda job: [ended] if job == "41" else [])
    monkeypatch.setattr(runs, "query_job", lambda job: None)
    result = CliRunner().invoke(cli, ["status", "41-ab"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "run 41-ab: 3 pieces, jobs 41, 45"
    assert lines[2].split() == ["1", "41", "0", "REQUEUED", "0:00:06", "0:00:09", "start"]
    assert lines[3].split()[:4] == ["2", "41", "1", "UNKNOWN"]
    assert "no heartbeat yet" in result.stdout
    logs = CliRunner().invoke(cli, ["logs", "41-ab"])
    assert logs.exit_code == 0
    assert logs.stdout.count("==> run 41-ab, piece ") == 3 and "(no log found)" in logs.stdout
    bad = CliRunner().invoke(cli, ["status", "41-zz"])
    assert bad.exit_code == 2 and "neither a job id" in bad.stderr


def test_status_reads_the_bad_nodes_of_the_folder_the_run_trains_in(records: Path) -> None:
    # The job keys its bad-node record by its run folder's name (a --continue piece trains
    # in the first job's folder); status looks it up the same way, else by the job id.
    from hpcdist.cli.follow import _bad_node_key

    run = load_run("41-ab", records)
    assert _bad_node_key(run, "45") == "41"
    assert _bad_node_key(None, "45") == "45"


# A run of one job, requeued (preempted) at 1110 near its end: its piece before the requeue
# wrote its last heartbeat at 1100, step 990 of 1000 at 2 steps/s, an end of 1105.
REQUEUED_AT = 1110.0
BEFORE = Heartbeat(
    step=990,
    steps=1000,
    piece_step=0,
    piece_started=500.0,
    recent_steps_per_s=2.0,
    time=1100.0,
    phase="stopped",
)
# The piece after it resumed step 900 and took its first step at 1230.
AFTER = Heartbeat(
    step=960,
    steps=1000,
    piece_step=900,
    piece_started=1230.0,
    recent_steps_per_s=2.0,
    time=1260.0,
    phase="training",
)
FIRST = Attempt("60", "REQUEUED", 400.0, 450.0, REQUEUED_AT, 660.0, 3600.0, "node1")
RUNS = Attempt("60", "RUNNING", 400.0, 450.0, 4050.0, 650.0, 3600.0, "node1")
QUEUED = Attempt("60", "PENDING", REQUEUED_AT, None, None, None, 3600.0, None)
RERUN = Attempt("60", "RUNNING", REQUEUED_AT, 1200.0, 4800.0, 60.0, 3600.0, "node2")


@pytest.mark.parametrize(
    ("attempts", "beat", "end"),
    [
        ([RUNS], BEFORE, 1105.0),  # not requeued: the piece's own end
        ([FIRST], BEFORE, None),  # requeued, its next start not seen yet
        ([FIRST, QUEUED], BEFORE, None),  # queued again: no end from the piece before
        ([FIRST, RERUN], BEFORE, None),  # started again, no heartbeat of its own yet
        ([FIRST, RERUN], AFTER, 1260.0 + 40 / 2.0),  # its own heartbeat: its own end
    ],
)
def test_status_json_never_predicts_an_end_before_a_requeue(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    attempts: list[Attempt],
    beat: Heartbeat,
    end: float | None,
) -> None:
    from click.testing import CliRunner

    from hpcdist.cli import runs
    from hpcdist.cli.main import cli

    run_dir = tmp_path / "runs" / "60"
    run_dir.mkdir(parents=True)
    piece = {"workdir": str(tmp_path), "run_dir": str(run_dir), "job_id": "60", "restart": 0}
    _write(tmp_path / ".hpcdist" / "runs" / "60-ef" / "60-0.json", {**piece, "started": 450})
    (run_dir / "heartbeat.json").write_bytes(beat.to_bytes())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    monkeypatch.setattr(runs, "job_attempts", lambda job: attempts if job == "60" else [])
    result = CliRunner().invoke(cli, ["status", "--json", "60-ef"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["forecast"]
    assert found["step"] == beat.step and found["end"] == end
    if attempts != [RUNS]:  # requeued: an end, if any, after the requeue
        assert end is None or end >= REQUEUED_AT
        assert found["steps_per_s"] == (None if end is None else 2.0)


def test_status_of_a_run_prints_nodes_and_folders_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.cli import runs

    root = tmp_path / ".hpcdist" / "runs"
    run_dir = str(tmp_path / "runs" / "\x1b]0;pwned\x07\n61")
    piece = {"workdir": str(tmp_path), "run_dir": run_dir, "nodes": "node1", "started": 10}
    _write(root / "61-ab" / "61-0.json", {**piece, "job_id": "61\x1b[2J", "restart": 0})
    monkeypatch.setattr(runs, "job_attempts", lambda job: [])
    monkeypatch.setattr(runs, "query_job", lambda job: None)
    run = load_run("61-ab", root)
    assert run is not None
    escaped = f"{tmp_path}/runs/\\x1b]0;pwned\\x07\\x0a61"
    assert runs.run_lines(run, now=20.0) == [
        "run 61-ab: 1 piece, jobs 61\\x1b[2J",
        "  PIECE JOB        RESTART STATE         QUEUED      RAN  RESUMED FROM",
        "  1     61\\x1b[2J  0       UNKNOWN            -        -  -",
        f"  run folder: {escaped}",
        f"  heartbeat:  no heartbeat yet in {escaped}",
    ]


def test_a_job_trained_where_its_script_pointed_it_not_where_a_later_training_went(
    records: Path, tmp_path: Path
) -> None:
    # Job 45's command ran a second training with --run-dir elsewhere: its note says so,
    # and report still reads the folder the job's script gave its training (HPCDIST_RUN_DIR).
    _write(records / "41-ab" / "45-0.train.json", {"run_dir": str(tmp_path / "other")})
    moved = tmp_path / "scratch" / "exp"
    piece = {"workdir": str(tmp_path), "run_dir": str(moved), "job_id": "50", "started": 50}
    _write(records / "50-cd" / "50-1.json", {**piece, "restart": 1})
    assert trained_in(["41", "45", "50", "99"], records) == {
        "41": tmp_path / "runs" / "41",
        "45": tmp_path / "runs" / "41",
        "50": moved,  # its newest piece's
    }


@pytest.mark.parametrize(
    ("chosen_by", "found"), [("config", "elsewhere"), ("argument", "runs/60"), (None, "runs/60")]
)
def test_a_folder_the_trainings_config_chose_is_found_where_the_script_named_another(
    records: Path, tmp_path: Path, chosen_by: str | None, found: str
) -> None:
    # `--set output.run_dir=elsewhere`: the script exported its default folder (runs/60), the
    # training's config chose another, and its note says so; a second training of the job's
    # command given --run-dir (or a note that says nothing) leaves the script's word.
    piece = {"workdir": str(tmp_path), "run_dir": str(tmp_path / "runs" / "60"), "job_id": "60"}
    _write(records / "60-ef" / "60-0.json", {**piece, "started": 60, "restart": 0})
    note = {"run_dir": str(tmp_path / "elsewhere"), "run_dir_from": chosen_by}
    _write(records / "60-ef" / "60-0.train.json", note)
    assert trained_in(["60"], records) == {"60": tmp_path / found}


@pytest.mark.parametrize(
    ("note", "shown"),
    [
        (None, "-"),  # the training has not said where it starts: not "start"
        ({"run_dir": "/r", "resumed_from": None}, "start"),
        ({"run_dir": "/r", "resumed_from": {"epoch": 3, "step": 30}}, "epoch 3, step 30"),
    ],
)
def test_a_piece_resumed_from_only_what_its_training_said(
    note: dict[str, object] | None, shown: str
) -> None:
    from hpcdist.cli import runs
    from hpcdist.jobs.runs import Piece

    piece = Piece.from_files({"job_id": "7", "restart": 1, "started": 1.0}, note)
    assert runs._resumed(piece) == shown
