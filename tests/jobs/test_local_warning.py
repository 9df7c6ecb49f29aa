"""The warning under ``submit --executor local``: the ranks get the signal ``--signal``
names, that many seconds before the time limit, in the place of submitit's own (USR2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Runs until the warning comes: it reports which signal came, or dies of an uncaught one.
WAITS = """\
import os, signal, sys, time
caught = []
for name in sys.argv[1:]:
    signal.signal(signal.Signals[name], lambda signum, _: caught.append(signum))
while not caught:
    time.sleep(0.1)
print("GOT", signal.Signals(caught[0]).name, "rank", os.environ["RANK"], flush=True)
"""


def _submit(tmp_path: Path, signal_value: str, catches: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "waits.py").write_text(WAITS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    argv = [sys.executable, "-m", "hpcdist.cli.main", "submit", "--executor=local"]
    argv += ["--nodes=1", "--tasks-per-node=2", "--cpus-per-task=1", "--backend=gloo"]
    argv += ["--time=1", f"--signal={signal_value}", "--wait"]
    argv += ["--command", f"{sys.executable} waits.py {catches}"]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _logs(tmp_path: Path, stream: str) -> str:
    found = sorted((tmp_path / ".hpcdist" / "submitit").glob(f"local-*/*_log.{stream}"))
    return "".join(path.read_text() for path in found)


@pytest.mark.parametrize("signal_value", ["USR1@55", "B:USR1@55"])
def test_local_ranks_get_the_named_warning_and_no_other(tmp_path: Path, signal_value: str) -> None:
    # A minute's limit and a 55 s warning: it comes 5 s after the start. Both USR1 and USR2
    # are caught: the one that comes is the one --signal names.
    proc = _submit(tmp_path, signal_value, "SIGUSR1 SIGUSR2")
    out = _logs(tmp_path, "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr + out
    assert sorted(line for line in out.splitlines() if line.startswith("GOT")) == [
        "GOT SIGUSR1 rank 0",
        "GOT SIGUSR1 rank 1",
    ]
    assert "warning: SIGUSR1 about 55 s before the time limit" in proc.stdout


def test_a_local_command_killed_by_the_warning_is_told_so(tmp_path: Path) -> None:
    proc = _submit(tmp_path, "USR2@55", "SIGUSR1")  # catches another signal only
    assert proc.returncode == 1 and "ended FAILED" in proc.stdout, proc.stdout
    said = "the command was killed by the warning signal SIGUSR2 (--signal USR2@55)"
    assert said in _logs(tmp_path, "err")
