"""bench/heartbeat_cost.py in its short CPU mode: it runs, and compares every variant with
the loop without a heartbeat, measured in the same process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_heartbeat_cost_short_mode_prints_ratios_against_the_loop_without(
    tmp_path: Path,
) -> None:
    out = tmp_path / "hb.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.heartbeat_cost", "--short", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:]}
    assert rows["off"].endswith("1.000x")
    result = json.loads(out.read_text())
    assert set(result["medians"]) == {"off", "every 5 s", "every 0.1 s"}
    assert all(value > 0 for value in result["medians"].values())
    assert result["due_s"] > 0 and result["beat_s"] > 0
    assert "due() " in proc.stdout and "% of a " in proc.stdout
    assert "Epoch" not in proc.stdout  # the loop's own lines are not the table's
