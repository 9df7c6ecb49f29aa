"""Ranges and numbers a login node checks without listing them: ``--array 0-2147483648`` or a
5000-digit ``--time`` is refused in one line, exit code 2, in the memory any refusal takes
(the command runs with its address space capped, so a listing fails rather than fills the
machine)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

# A cap on the command's address space: room for Python and its imports, none for a list of
# millions of ids. Its peak resident memory must stay under the 100 MB.
_ADDRESS_SPACE = 1 << 30
_MOST_RSS_KB = 100 * 1024
_HUGE = "9" * 5000


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def _render(tmp_path: Path, *flags: str) -> tuple[int, str, int]:
    """Exit code, stderr and the peak resident KB of ``hpcdist render FLAGS``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdist.cli.main", "render", *flags],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_capped,
        text=True,
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, err, usage.ru_maxrss


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--array", "0-2147483648"], "--array '0-2147483648' has task id 2147483648;"),
        (["--array", "0-30000000"], "--array '0-30000000' has task id 30000000;"),
        (["--array", "0-1001"], "--array '0-1001' has task id 1001; expected ids up to 1000"),
        (["--array", f"0-{_HUGE}"], f"--array '0-{_HUGE}' is not a SLURM job array"),
        (["--nodes", "1-3000000000"], "--nodes '1-3000000000' lets SLURM choose among the"),
        (["--nodes", _HUGE], f"--nodes '{_HUGE}' is not a SLURM node count"),
        (["--time", _HUGE], f"--time '{_HUGE}' is not a SLURM time limit"),
        (["--signal", f"USR2@{_HUGE}"], f"--signal 'USR2@{_HUGE}' is not a SLURM signal"),
    ],
    ids=lambda value: " ".join(value)[:40] if isinstance(value, list) else "",
)
def test_a_huge_value_is_refused_in_one_line_and_little_memory(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    code, err, rss_kb = _render(tmp_path, *flags)
    assert (code, err.count("\n")) == (2, 1), err[-2000:]
    assert err.startswith(f"hpcdist: error: {said}"), err[:300]
    assert rss_kb < _MOST_RSS_KB
    assert not list(tmp_path.iterdir())


def test_the_largest_id_of_the_default_array_size_is_taken(tmp_path: Path) -> None:
    code, err, rss_kb = _render(tmp_path, "--array", "0-1000")
    assert (code, err) == (0, "") and rss_kb < _MOST_RSS_KB
