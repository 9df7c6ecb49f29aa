"""Ranges and numbers a login node checks without listing them: ``--array 0-2147483648`` or a
5000-digit ``--time`` is refused in one line, exit code 2, in the memory any refusal takes
(the command runs with its address space capped, so a listing fails rather than fills the
machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# A cap on the command's address space: room for Python and its imports, none for a list of
# millions of ids. Its peak resident memory must stay under the 100 MB.
_ADDRESS_SPACE = 1 << 30
_MOST_RSS_KB = 100 * 1024
_HUGE = "9" * 5000


# Started from a small launcher, not from pytest: a process forked from the test process
# (a worker that has imported torch) reports that process's resident memory as its own peak.
# The launcher caps the command's address space, runs it, and writes its exit status and
# peak resident KB (wait4) to its stdout; the command's stderr is passed through.
_LAUNCH = """
import os, resource, sys
pid = os.fork()
if pid == 0:
    resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _render(tmp_path: Path, *flags: str) -> tuple[int, str, int]:
    """Exit code, stderr and the peak resident KB of ``hpcdist render FLAGS``."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _LAUNCH,
            str(_ADDRESS_SPACE),
            "-m",
            "hpcdist.cli.main",
            "render",
            *flags,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    code, rss_kb = proc.stdout.split()[-2:]
    return int(code), proc.stderr, int(rss_kb)


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
