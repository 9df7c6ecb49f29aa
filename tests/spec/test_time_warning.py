"""A time limit must leave the job time to work before SLURM's warning signal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.errors import SpecError
from hpcdist.spec.options import spec_from_options


@pytest.mark.parametrize(
    ("time", "signal", "ok"),
    [
        ("1:30", "USR2@90", False),  # warned at the very start
        ("1:31", "USR2@90", True),  # one second to work: SLURM's own business
        ("1", "USR2@30", True),  # the faults tests' short job
        ("1", "USR2", False),  # no @: sbatch warns 60 s before the end
        ("2", "USR2", True),
        ("10", "USR1@600", False),
        ("11", "USR1@600", True),
    ],
)
def test_a_warning_at_or_before_the_start_is_refused_with_the_numbers(
    time: str, signal: str, ok: bool
) -> None:
    options = {"profile": None, "mode": "gloo", "time": time, "signal": signal}
    if ok:
        assert spec_from_options(options).signal == signal
        return
    with pytest.raises(SpecError) as caught:
        spec_from_options(options)
    assert f"--time {time!r}" in str(caught.value)
    assert f"--signal {signal!r}" in str(caught.value)


def test_the_default_warning_refuses_a_one_minute_job_in_render_and_local_submit(
    tmp_path: Path,
) -> None:
    for command in (["render"], ["submit", "--executor", "local", "--mode", "threads"]):
        proc = subprocess.run(
            [sys.executable, "-m", "hpcdist.cli.main", *command, "--time", "1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "hpcdist: error: --time '1' (60 s) leaves no time before --signal 'USR2@90' warns "
            "90 s before the end; give a --time over 90 s or a shorter warning"
        ]
        assert list(tmp_path.iterdir()) == []  # nothing written, nothing queued
