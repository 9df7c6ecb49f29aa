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
    # One query a look: scontrol loads no partition beside the jobs, as squeue does. hpcdist
    # asks squeue only where scontrol's answer is ambiguous (a job of the testbed's, perhaps an
    # earlier test's, named with a newline): then one partition load each, and never more.
    squeues = sum(n for who, n in result["calls"].items() if who.endswith(" squeue"))
    partitions = result["controller_queries"].get("REQUEST_PARTITION_INFO", 0)
    assert partitions <= squeues, result
    assert "| submitit's watcher alone |" in proc.stdout
