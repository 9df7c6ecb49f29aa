"""The sweep benchmark's short mode: a sweep split at a small MaxArraySize, rendered,
submitted (held), summarised and reported, on stand-in SLURM tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_sweep_scale_short_mode_splits_and_reports_every_point(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    argv = ["--points", "40", "--fake-slurm", "--max-array-size", "15", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.sweep_scale", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    small, big = result["small"], result["big"]
    assert (small["points"], small["arrays"], big["points"], big["arrays"]) == (4, 1, 40, 3)
    assert big["status_head"].endswith("40 tasks: 40 PENDING")
    assert (big["results"], big["report_rows"]) == (40, 40)
    assert all(big[key] > 0 for key in ("render_s", "submit_s", "status_s", "report_s"))
    assert "| render + submit |" in proc.stdout and "<= 10" in proc.stdout
