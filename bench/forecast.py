"""How right ``hpcdist status`` is about when a running training ends: its predicted end,
read as a user reads it (``hpcdist status --json JOB``) at a tenth, a quarter, half and three
quarters of the steps, against the end the training really had (the time of rank 0's last
heartbeat, written as it finished), in one run.

    python3 -m bench.forecast                       # a training of a few minutes (600 epochs)
    python3 -m bench.forecast --epochs 40 --json out.json   # CI's short mode

Needs a SLURM cluster (the testbed: ``scripts/slurm-testbed up`` and its ``SLURM_CONF``). The
job is the README's gloo training on 2 nodes, rendered by hpcdist and queued with sbatch;
``status`` is asked every ``--every`` seconds, as ``watch hpcdist status`` would. The error of
a prediction is given against the time that was left when it was made (the harder measure)
and against the training's whole length.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.1, 0.25, 0.5, 0.75)
TARGET = 0.20  # the predicted end within 20% of the real one

CONFIG = """\
data: {{mask: ocean}}
training: {{epochs: {epochs}, lr: 1.0e-3, early_stopping_patience: 0, checkpoint_every: 10}}
"""


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _submit(folder: Path, epochs: int) -> int:
    """Queue the training; its job id."""
    from hpcdist.render.script import render
    from hpcdist.spec.options import spec_from_options

    config = folder / "forecast.yaml"
    config.write_text(CONFIG.format(epochs=epochs))
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "job_name": "forecast",
            "time": "60:00",
            "command": f"python3 -m ufsemulator train --config {config}",
        }
    )
    script = folder / "forecast.sh"
    script.write_text(render(spec))
    done = _run(["sbatch", "--parsable", str(script)], folder)
    if done.returncode != 0:
        raise SystemExit(f"bench.forecast: sbatch failed: {done.stderr.strip()}")
    return int(done.stdout.strip().split(";")[0])


def _status(folder: Path, job: int) -> dict[str, Any] | None:
    shown = _run([sys.executable, "-m", "hpcdist.cli.main", "status", "--json", str(job)], folder)
    if shown.returncode != 0:
        return None
    run = json.loads(shown.stdout).get("run") or {}
    return run.get("forecast")


def _queued(job: int, folder: Path) -> bool:
    return bool(_run(["squeue", "-h", "-j", str(job), "-o", "%T"], folder).stdout.strip())


def measure(epochs: int, every: float, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        folder = Path(tmp)
        job = _submit(folder, epochs)
        beat_file = folder / "runs" / str(job) / "heartbeat.json"
        # wanted fraction: (when asked, the predicted end, the fraction status said)
        predictions: dict[float, tuple[float, float, float]] = {}
        deadline = time.monotonic() + timeout
        while _queued(job, folder):
            if time.monotonic() > deadline:
                _run(["scancel", str(job)], folder)
                raise SystemExit(f"bench.forecast: job {job} still running after {timeout:.0f} s")
            found = _status(folder, job)
            if found and found.get("end") and found.get("steps"):
                fraction = found["step"] / found["steps"]
                for wanted in FRACTIONS:
                    if fraction >= wanted and wanted not in predictions:
                        predictions[wanted] = (time.time(), found["end"], fraction)
            time.sleep(every)
        beat = json.loads(beat_file.read_text()) if beat_file.is_file() else {}
        if beat.get("phase") != "done":
            raise SystemExit(f"bench.forecast: job {job}'s training did not finish: {beat}")
        real_end, started = float(beat["time"]), float(beat["piece_started"])
    rows = []
    for wanted, (made, end, fraction) in sorted(predictions.items()):
        error = end - real_end
        rows.append(
            {
                "fraction": wanted,
                "seen_at_fraction": round(fraction, 3),
                "error_s": round(error, 2),
                "of_time_left": round(abs(error) / max(real_end - made, 1e-9), 3),
                "of_training": round(abs(error) / max(real_end - started, 1e-9), 3),
            }
        )
    return {"job": job, "epochs": epochs, "training_s": round(real_end - started, 1), "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"Predicted end vs real end, {result['epochs']} epochs on 2 nodes "
        f"(training {result['training_s']} s, job {result['job']}):",
        "",
        "| from | status at | predicted - real (s) | error / time left | error / training |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['fraction']:.0%} | {row['seen_at_fraction']:.0%} of the steps "
            f"| {row['error_s']:+.1f} "
            f"| {row['of_time_left']:.1%} | {row['of_training']:.1%} |"
        )
    worst = max((row["of_time_left"] for row in result["rows"]), default=None)
    verdict = "no prediction" if worst is None else f"worst {worst:.1%} of the time left"
    lines += ["", f"Target: within {TARGET:.0%}; {verdict}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forecast")
    parser.add_argument("--epochs", type=int, default=600, help="the training's length")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between statuses")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after (s)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    result = measure(args.epochs, args.every, args.timeout)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
