"""The forecast benchmark's short mode on the testbed: a training of some seconds under other
load until a fifth of its steps, its predicted end read from ``hpcdist status --json`` while
it runs, the end at the recent rate and at the piece's average rate both set against its real
end. The accuracy itself is the benchmark's to report (docs/benchmarks.md): it depends on the
machine's load, which no test may."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.facts.heartbeat import HEARTBEAT_EVERY_S
from tests.integration.conftest import SlurmCluster

ROOT = Path(__file__).resolve().parents[2]


# The default tier's training is short (statuses are asked where it outlasts a few
# heartbeats); the full tier's, 800 epochs, is the one the benchmark's short mode reports.
@pytest.mark.parametrize("epochs", [100, pytest.param(800, marks=pytest.mark.full)])
def test_forecast_short_mode_sets_predictions_against_the_real_end(
    slurm_cluster: SlurmCluster, tmp_path: Path, epochs: int
) -> None:
    out = tmp_path / "forecast.json"
    argv = ["--epochs", str(epochs), "--every", "1", "--timeout", "400", "--json", str(out)]
    argv += ["--load-until", "0.2"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.forecast", *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert result["epochs"] == epochs and result["training_s"] > 0
    assert result["load_until"] == 0.2
    unloaded = result["load_ended_at_fraction"]
    assert unloaded is None or 0.2 <= unloaded <= 1.0
    # At least one status while it trained, where the training outlasted a few heartbeats
    # (about 40 s here; a machine several times faster may finish before the first one).
    if result["training_s"] >= 4 * HEARTBEAT_EVERY_S:
        assert result["rows"], proc.stdout
    fractions = [row["fraction"] for row in result["rows"]]
    assert fractions == sorted(fractions) and set(fractions) <= {0.1, 0.25, 0.5, 0.75}
    for row in result["rows"]:
        assert row["seen_at_fraction"] >= row["fraction"]
        assert math.isfinite(row["error_s"]) and row["of_time_left"] >= 0
        # The end at the piece's average rate beside it, known from the same heartbeat.
        assert math.isfinite(row["average_error_s"]) and row["average_of_time_left"] >= 0
    header = "| from | status at | recent rate: predicted - real (s) | error / time left "
    assert header in proc.stdout and "| piece's average: predicted - real (s) |" in proc.stdout
    if result["rows"]:
        assert "(the piece's average: worst " in proc.stdout
    # How much the rate itself moved: a quarter's rate where statuses were read through it.
    quarters = result["steps_per_s_by_quarter"]
    assert len(quarters) == 4 and all(rate is None or rate > 0 for rate in quarters)
    assert "The rate in each quarter of the steps: " in proc.stdout
    print(proc.stdout)
