"""Every spelling of ``--signal`` that SLURM takes reaches the ranks: render, the script's
runner (``jobstep run``) and the local executor read it through one parser
(``hpcdist.facts.warning``), so a batch-shell warning spelt ``RB:``, ``b:`` or ``SIG12`` is
passed on as ``B:USR2`` is."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.distributed.localstep import script_warning
from hpcdist.distributed.requeue import warning_signal
from hpcdist.facts.leads import signal_lead_s
from hpcdist.facts.warning import parse_warning
from hpcdist.render.script import render, runner_options
from hpcdist.spec.options import spec_from_options

# (the value given, the batch shell alone warned, the lead)
SPELLINGS = [
    ("B:USR2@60", True, 60),
    ("RB:USR2@60", True, 60),
    ("b:USR2@60", True, 60),
    ("bR:usr2@70", True, 70),
    ("B:SIGUSR2@60", True, 60),
    ("B:12@60", True, 60),
    ("B:sigusr2", True, 60),
    ("R:USR2@60", False, 60),
    ("r:Sigusr2@90", False, 90),
    ("12", False, 60),
    ("usr2@", False, 60),
]

_CHILD = (
    "import pathlib, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
    "folder = pathlib.Path(sys.argv[1])\n"
    "(folder / 'ready').touch()\n"
    "signal.sigwait({signal.SIGUSR2})\n"
    "(folder / 'warned').touch()\n"
)


@pytest.mark.parametrize(("given", "batch_shell", "lead"), SPELLINGS)
def test_every_side_reads_the_same_warning(given: str, batch_shell: bool, lead: int) -> None:
    spec = spec_from_options({"profile": None, "signal": given, "time": "1-00:00:00"})
    assert (spec.warning_signal, spec.warns_batch_shell) == ("USR2", batch_shell)
    assert warning_signal(given) == signal.SIGUSR2
    assert script_warning(render(spec)) == (signal.SIGUSR2, batch_shell)
    assert signal_lead_s(given) == lead
    assert f"export HPCDIST_SIGNAL_LEAD={lead}\n" in render(spec)
    assert ("--relay" in runner_options(spec)[0]) is batch_shell


@pytest.mark.parametrize(
    "given", ["USR2@65536", "USR2@0065536", "0@60", "B:", "X:USR2", "USR3", "USR2@1" + "0" * 5000]
)
def test_a_value_slurm_refuses_is_no_warning(given: str) -> None:
    assert parse_warning(given) is None
    assert warning_signal(given) is None and signal_lead_s(given) is None


def _wait_for(path: Path, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return path.exists()


@pytest.mark.parametrize("given", [s[0] for s in SPELLINGS if s[1]])
def test_the_runner_passes_a_batch_shell_warning_of_every_spelling_on(
    given: str, tmp_path: Path
) -> None:
    """SLURM warns the batch shell alone (any spelling with B); the runner, which takes its
    place, must pass the warning on to the step, whose rank waits for it."""
    child = tmp_path / "child.py"
    child.write_text(_CHILD)
    runner = subprocess.Popen(
        [
            *(sys.executable, "-m", "hpcdist.distributed.jobstep", "run"),
            *(f"--warning={given}", "--relay", "--warned=0", "--"),
            *(sys.executable, str(child), str(tmp_path)),
        ],
        cwd=tmp_path,
    )
    try:
        assert _wait_for(tmp_path / "ready")
        runner.send_signal(signal.SIGUSR2)
        assert runner.wait(timeout=30) == 0
        assert (tmp_path / "warned").exists()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
