"""Which run a job is a piece of (hpcdist.distributed.runpiece): a new run for a new job,
the same run for a requeue (same job id), a resubmission and a --continue (the id given)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hpcdist.distributed.runpiece import decide_run_id, start_piece
from hpcdist.errors import UserError


def _exports(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        name, _, value = line.removeprefix("export ").partition("=")
        out[name] = shlex.split(value)[0]
    return out


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / ".hpcdist" / "runs"
    folder.mkdir(parents=True, mode=0o700)
    return folder


def test_a_new_job_starts_a_new_run_named_for_it(root: Path) -> None:
    assert decide_run_id({"SLURM_JOB_ID": "41"}, root, token="a1b2c3") == "41-a1b2c3"
    array = {"SLURM_JOB_ID": "50", "SLURM_ARRAY_JOB_ID": "48", "SLURM_ARRAY_TASK_ID": "2"}
    assert decide_run_id(array, root, token="ff") == "48_2-ff"


def test_a_requeued_job_stays_in_its_run_and_folder(root: Path) -> None:
    first = _exports(start_piece({"SLURM_JOB_ID": "41"}, root, now=10.0))
    run_id = first["HPCDIST_RUN_ID"]
    assert run_id.startswith("41-") and first["HPCDIST_RUN_DIR"] == "runs/41"
    again = _exports(start_piece({"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "1"}, root))
    assert again["HPCDIST_RUN_ID"] == run_id
    assert again["HPCDIST_RUN_RECORD"] == str(root / run_id / "41-1.train.json")
    pieces = sorted(path.name for path in (root / run_id).iterdir())
    assert pieces == ["41-0.json", "41-1.json"]
    record = json.loads((root / run_id / "41-0.json").read_text())
    assert record["run_id"] == run_id and record["started"] == 10.0 and record["restart"] == 0
    assert (root / run_id / "41-0.json").stat().st_mode & 0o777 == 0o600
    # The same job id, restart 0 again (a cluster whose ids started over): a new run.
    assert _exports(start_piece({"SLURM_JOB_ID": "41"}, root))["HPCDIST_RUN_ID"] != run_id


def test_a_resubmitted_or_continued_job_keeps_the_id_it_was_given(root: Path) -> None:
    first = _exports(start_piece({"SLURM_JOB_ID": "41"}, root))
    run_id = first["HPCDIST_RUN_ID"]
    note = root / run_id / "41-0.train.json"
    note.write_text(json.dumps({"run_dir": "/data/runs/elsewhere"}))
    note.chmod(0o600)
    # --continue: the id alone; the run folder is where the run's last piece trained.
    cont = _exports(start_piece({"SLURM_JOB_ID": "60", "HPCDIST_RUN_ID": run_id}, root))
    assert cont["HPCDIST_RUN_ID"] == run_id
    assert cont["HPCDIST_RUN_DIR"] == "/data/runs/elsewhere"
    # A resubmission carries the folder as well.
    env = {"SLURM_JOB_ID": "61", "HPCDIST_RUN_ID": run_id, "HPCDIST_RUN_DIR": "runs/41"}
    assert _exports(start_piece(env, root))["HPCDIST_RUN_DIR"] == "runs/41"
    assert sorted(p.name for p in (root / run_id).glob("*-0.json")) == [
        "41-0.json",
        "60-0.json",
        "61-0.json",
    ]


@pytest.mark.parametrize("bad", ["../x", "a b", "", "x" * 65, ".hidden", "a/b"])
def test_a_bad_given_run_id_is_refused(root: Path, bad: str) -> None:
    env = {"SLURM_JOB_ID": "41", "HPCDIST_RUN_ID": bad}
    if not bad:  # empty: not given at all
        assert decide_run_id(env, root, token="aa") == "41-aa"
        return
    with pytest.raises(UserError, match=r"HPCDIST_RUN_ID: .* is not a run id"):
        decide_run_id(env, root)


def test_continue_job_finds_that_jobs_run_when_this_job_starts(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _exports(start_piece({"SLURM_JOB_ID": "41"}, root))
    chained = _exports(start_piece({"SLURM_JOB_ID": "42", "HPCDIST_CONTINUE_JOB": "41"}, root))
    assert chained["HPCDIST_RUN_ID"] == first["HPCDIST_RUN_ID"]
    # Where the run's last piece was pointed (its training has not said otherwise).
    assert chained["HPCDIST_RUN_DIR"] == str(root.parent.parent / "runs" / "41")
    alone = _exports(start_piece({"SLURM_JOB_ID": "43", "HPCDIST_CONTINUE_JOB": "40"}, root))
    assert alone["HPCDIST_RUN_ID"].startswith("43-") and alone["HPCDIST_RUN_DIR"] == "runs/43"
    assert "job 40 started no run from this folder" in capsys.readouterr().err
