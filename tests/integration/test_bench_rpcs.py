"""The controller benchmark's short mode on the testbed: a small array followed by hpcdist's
waiter and ten watchers and by submitit's watcher, their query RPCs counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_controller_rpcs_short_mode_counts_both_followers(tmp_path: Path) -> None:
    out = tmp_path / "rpcs.json"
    argv = ["--tasks", "4", "--status-every", "2", "--timeout", "300", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.controller_rpcs", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert sorted(result["ends_s"]) == ["submitit", "waiter", "watchers"]
    assert result["calls"].get("hpcdist scontrol", 0) >= 1  # the shared view
    assert result["submitit_rpcs"] == result["calls"]["submitit sacct"] >= 1
    assert result["controller_queries"]["REQUEST_JOB_INFO"] >= 1
    # one query a look: no partition loaded beside the jobs, as squeue does
    assert "REQUEST_PARTITION_INFO" not in result["controller_queries"]
    assert "| submitit's watcher alone |" in proc.stdout
