"""The local executor honours what one machine can (the warning at its lead, torchrun where
installed) and refuses in one line what it cannot (SLURM's log names and layout, srun's
binding and options, a queue the user asked for)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.distributed.localstep import script_warning
from hpcdist.jobs import localflags
from hpcdist.jobs.localflags import warning_lead_s
from hpcdist.jobs.records import load_record, wait_for_final_state
from hpcdist.jobs.submit import submit
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.private import user_name


def _submit_local(tmp_path: Path, *flags: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli,
        ["submit", "--executor", "local", "--mode", "threads", *flags, "--command", "true"],
        env={"HPCDIST_STATE_HOME": str(tmp_path / "home")},
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["-o", "x-%j.log"], "-o/--output"),
        (["-e", "e-%j.log"], "-e/--error"),
        (["--rank-logs", "split"], "--rank-logs"),
        (["--rank-logs", "none"], "--rank-logs"),
        (["--cpu-bind", "cores"], "--cpu-bind"),
        (["--srun-arg=--exclusive"], "--srun-arg"),
        (["--account", "proj7"], "-A/--account"),
        (["--qos", "high"], "--qos"),
    ],
)
def test_a_flag_the_local_executor_cannot_honour_is_refused_in_one_line(
    flags: list[str], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _submit_local(tmp_path, *flags)
    assert (code, out) == (2, "")
    assert err == (
        f"hpcdist: error: {named} needs SLURM; the local executor runs on this machine and "
        "cannot honour it: leave it out (flag or profile) or submit to a SLURM cluster\n"
    )
    assert not (tmp_path / ".hpcdist").exists()  # nothing written, nothing started


@pytest.mark.parametrize(
    "flags", [[], ["--partition", "debug"], ["--rank-logs", "label"], ["-o", "%x-%j.out"]]
)
def test_defaults_and_the_profiles_own_queue_are_not_refused(
    flags: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _submit_local(tmp_path, "--dry-run", *flags)
    assert code == 0, err
    assert '"executor": "local"' in out


@pytest.mark.parametrize(("mode", "refused"), [(0o777, True), (0o775, True), (0o755, False)])
def test_a_folder_others_can_write_is_refused_for_what_it_is_not_for_a_log_name(
    mode: int, refused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its log was moved to a folder of the user's own (private_logs): no -o was given, and
    # the refusal names the folder, not -o/--output.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.chdir(shared)
    code, out, err = _submit_local(tmp_path, "--dry-run")
    if not refused:
        assert (code, err) == (0, "")
        assert '"executor": "local"' in out
        return
    assert (code, out) == (2, "")
    assert err == (
        f"hpcdist: error: the job's working folder '{shared}' can be written by others (owner "
        f"{user_name(os.geteuid())}, mode {mode:04o}): Python would import a module put there; "
        "run the job from a folder that only you can write, below folders that only you (or "
        "root) can write: sbatch --chdir or hpcdist --chdir DIR, e.g. a folder in your home\n"
    )
    private = tmp_path / "private"
    private.mkdir(mode=0o755)
    code, out, err = _submit_local(tmp_path, "--dry-run", "--chdir", str(private))
    assert (code, err) == (0, "")  # the advice works
    assert f'"workdir": "{private}"' in out


def test_torchrun_is_refused_only_where_it_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    flags = ["--dry-run", "--mode", "gloo", "--tasks-per-node", "2", "--launcher", "torchrun"]
    monkeypatch.setattr(localflags.shutil, "which", lambda name: None)
    code, _, err = _submit_local(tmp_path, *flags)
    assert code == 2
    assert err.startswith("hpcdist: error: --launcher torchrun: torchrun is not on PATH here")
    monkeypatch.setattr(localflags.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert _submit_local(tmp_path, *flags)[0] == 0


@pytest.mark.parametrize(
    ("flag", "warning", "lead"),
    [
        ("USR2@90", (signal.SIGUSR2, False), 90),
        ("B:USR1@120", (signal.SIGUSR1, True), 120),
        ("USR2", (signal.SIGUSR2, False), 60),  # SLURM's default lead
    ],
)
def test_the_scripts_warning_and_its_lead_are_read_as_slurm_reads_them(
    flag: str, warning: tuple[signal.Signals, bool], lead: int
) -> None:
    spec = spec_from_options({"profile": "local", "signal": flag, "time": "10"})
    assert script_warning(render(spec)) == warning
    assert warning_lead_s(spec.signal) == lead
    assert script_warning("#!/bin/bash\ntrue\n") is None
    assert warning_lead_s(None) is None


WAITER = (
    "import os, signal, sys, time\n"
    "got = []\n"
    "signal.signal(getattr(signal, 'SIG' + sys.argv[1]), lambda s, f: got.append(s))\n"
    "while not got:\n"
    "    time.sleep(0.05)\n"
    "print('rank', os.environ['SUBMITIT_LOCAL_GLOBALID'], 'warned by', sys.argv[1])\n"
)


@pytest.mark.parametrize(("flag", "name"), [("USR2@90", "USR2"), ("B:USR1@90", "USR1")])
def test_a_local_job_is_warned_with_its_signal_before_its_time_limit(
    flag: str, name: str, tmp_path: Path
) -> None:
    """--time 2 with a 90 s lead: the ranks wait until the warning comes (30 s in), whatever
    the machine's speed; without it they would run into the limit and fail. (At 5 s in, ranks
    still starting on a loaded machine died of the signal before their handler was set.)"""
    waiter = tmp_path / "waiter.py"
    waiter.write_text(WAITER)
    spec = spec_from_options(
        {
            "profile": None,
            "mode": "gloo",
            "nodes": 1,
            "tasks_per_node": 2,
            "cpus_per_task": 1,
            "time": "2",
            "signal": flag,
            "command": f"{sys.executable} {waiter} {name}",
        }
    )
    record = submit(spec, "local", project_dir=tmp_path).record
    assert wait_for_final_state(record, timeout_s=240, poll_s=0.2) == "COMPLETED"
    logs = [load_record(record.job_id, tmp_path).log_path(r).read_text() for r in (0, 1)]
    assert f"rank 0 warned by {name}" in logs[0] and f"rank 1 warned by {name}" in logs[1]
