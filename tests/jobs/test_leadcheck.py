"""`render` and `submit` say when --signal's lead is shorter than the run folder's last
checkpoint needs; the bad-node flags reach the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdist.cli.main import main
from hpcdist.distributed.warnlead import record_checkpoint_time
from hpcdist.facts.leads import CheckpointTiming
from hpcdist.jobs.leadcheck import lead_warning, run_folders
from hpcdist.spec.options import spec_from_options


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """runs/12 whose last checkpoint took 40 s (it needs a lead of 50 s)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    run = tmp_path / "runs" / "12"
    run.mkdir(parents=True)
    record_checkpoint_time(run, CheckpointTiming(40.0, 1.0e9, 7))
    return run


def _render(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = main(["render", "--mode", "gloo", "--nodes", "2", *flags])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("lead", "warned"), [("49", True), ("50", False)])
def test_render_warns_on_stderr_when_the_lead_is_shorter_than_the_checkpoint_needs(
    recorded: Path, capsys: pytest.CaptureFixture[str], lead: str, warned: bool
) -> None:
    command = "python3 -m ufsemulator train --run-dir runs/12"
    code, out, err = _render(capsys, f"--signal=USR2@{lead}", "--command", command)
    assert code == 0 and out.startswith("#!/bin/bash")
    assert ("last checkpoint in runs/12 (40.0 s)" in err) is warned
    assert "last checkpoint" not in out and f"export HPCDIST_SIGNAL_LEAD={lead}\n" in out
    if warned:
        assert err.count("\n") == 1 and "--signal=...@50 or more" in err


@pytest.mark.parametrize(
    ("options", "folder"),
    [
        ({"command": "python3 -m ufsemulator train --resume runs/12/checkpoint.pt"}, "runs/12"),
        ({"command": "python3 -m ufsemulator train --run-dir=runs/12"}, "runs/12"),
        ({"overrides": ("output.run_dir=runs/12",)}, "runs/12"),
        ({"env": ("HPCDIST_RUN_DIR=runs/12",)}, "runs/12"),
        ({}, None),
    ],
)
def test_the_run_folder_comes_from_the_command_the_config_or_the_environment(
    recorded: Path, options: dict[str, object], folder: str | None
) -> None:
    spec = spec_from_options({"mode": "gloo", "nodes": 2, "signal": "USR2@10", **options})
    assert run_folders(spec) == ([Path(folder)] if folder else [])
    assert bool(lead_warning(spec)) is bool(folder)


def test_bad_node_flags_reach_the_script_and_a_bad_hold_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert "export HPCDIST_BAD_NODE_HOLD=3600\n" in _render(capsys)[1]
    assert "export HPCDIST_BAD_NODE_HOLD=600\n" in _render(capsys, "--bad-node-hold", "600")[1]
    assert "HPCDIST_BAD_NODE_HOLD" not in _render(capsys, "--no-exclude-bad-nodes")[1]
    assert "HPCDIST_BAD_NODE_HOLD" not in _render(capsys, "--no-requeue")[1]
    code, out, err = _render(capsys, "--bad-node-hold", "0")
    assert (code, out) == (2, "")
    assert err.strip() == "hpcdist: error: --bad-node-hold must be >= 1 second, got 0"
    assert _render(capsys, "--bad-node-hold", "1")[0] == 0


@pytest.mark.parametrize(("given", "found"), [("41-ab", True), ("41", True), ("42", False)])
def test_a_continued_run_is_checked_in_the_folder_its_records_name(
    recorded: Path, tmp_path: Path, given: str, found: bool
) -> None:
    # --continue RUN (or JOB): the run's last piece trained in runs/12, which the flag
    # itself never names.
    piece = tmp_path / ".hpcdist" / "runs" / "41-ab" / "41-0.json"
    piece.parent.mkdir(parents=True, mode=0o700)
    (tmp_path / ".hpcdist").chmod(0o700)
    (tmp_path / ".hpcdist" / "runs").chmod(0o700)
    record = {"job_id": "41", "restart": 0, "started": 1, "run_dir": str(recorded)}
    piece.write_text(json.dumps({**record, "workdir": str(tmp_path)}))
    piece.chmod(0o600)
    spec = spec_from_options(
        {"mode": "gloo", "nodes": 2, "signal": "USR2@10", "continue_run": given}
    )
    assert run_folders(spec) == ([recorded] if found else [])
    assert ("last checkpoint in" in lead_warning(spec)) is found


@pytest.mark.parametrize(
    ("flags", "warned"),
    [
        # The job runs in work/: its run folder ../runs/12 is the recorded one.
        (["--chdir", "work", "--set", "output.run_dir=../runs/12"], True),
        # work/runs/12 holds no checkpoint: ./runs/12 is not the job's.
        (["--chdir", "work", "--set", "output.run_dir=runs/12"], False),
        (["--set", "output.run_dir=runs/12"], True),
    ],
)
def test_a_relative_run_folder_is_the_one_below_the_jobs_working_folder(
    recorded: Path, capsys: pytest.CaptureFixture[str], flags: list[str], warned: bool
) -> None:
    (recorded.parents[1] / "work").mkdir()
    code, _, err = _render(capsys, "--signal=USR2@30", *flags)
    assert code == 0
    assert ("the lead of 30 s is shorter than the last checkpoint" in err) is warned
