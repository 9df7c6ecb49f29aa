"""How right ``hpcdist status`` is about when a running training ends: its predicted end,
read as a user reads it (``hpcdist status --json JOB``) at a tenth, a quarter, half and three
quarters of the steps, against the end the training really had (the time of rank 0's last
heartbeat, written as it finished), in one run. Beside it, from the same heartbeat, the end
at the piece's average rate since its first step (what ``status`` said before it followed
the recent rate).

    python3 -m bench.forecast                       # a training of a few minutes (600 epochs)
    python3 -m bench.forecast --load-until 0.15     # other load on the CPUs until 15% of the steps
    python3 -m bench.forecast --epochs 40 --json out.json   # CI's short mode

Needs a SLURM cluster (the testbed: ``scripts/slurm-testbed up`` and its ``SLURM_CONF``). The
job is the README's gloo training on 2 nodes, rendered by hpcdist and queued with sbatch;
``status`` is asked every ``--every`` seconds, as ``watch hpcdist status`` would. The error of
a prediction is given against the time that was left when it was made (the harder measure)
and against the training's whole length. ``--load-until F``: one busy process a CPU of this
machine (the testbed's nodes share it) from the submission until ``status`` says F of the
steps are done, so the rate jumps there, as when other work leaves a node.
"""

from __future__ import annotations

import argparse
import itertools
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
FRACTIONS_OF_PACE = (0.0, 0.25, 0.5, 0.75, 1.0)

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
    """``status``'s forecast, with ``average_end``: the end at the piece's average rate."""
    from hpcdist.facts.heartbeat import Heartbeat
    from hpcdist.jobs.progress import piece_steps_per_s

    shown = _run([sys.executable, "-m", "hpcdist.cli.main", "status", "--json", str(job)], folder)
    if shown.returncode != 0:
        return None
    run = json.loads(shown.stdout).get("run") or {}
    found = run.get("forecast")
    if not found or not run.get("heartbeat"):
        return found
    beat = Heartbeat.from_dict(run["heartbeat"])
    rate = piece_steps_per_s(beat)
    average = None
    if rate and beat.time is not None and beat.steps is not None and beat.step is not None:
        average = beat.time + max(0, beat.steps - beat.step) / rate
    return {**found, "average_end": average, "beat_time": beat.time}


def _load(seconds: float) -> list[subprocess.Popen[bytes]]:
    """One busy process a CPU, each ending by itself after ``seconds`` at the latest."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]


def _unload(load: list[subprocess.Popen[bytes]]) -> None:
    for proc in load:
        proc.terminate()
    for proc in load:
        proc.wait()


def _queued(job: int, folder: Path) -> bool:
    return bool(_run(["squeue", "-h", "-j", str(job), "-o", "%T"], folder).stdout.strip())


def measure(
    epochs: int, every: float, timeout: float, load_until: float | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        folder = Path(tmp)
        job = _submit(folder, epochs)
        load = _load(timeout) if load_until is not None else []
        try:
            predictions, unloaded, seen = _watch(folder, job, (every, timeout), load_until, load)
        finally:
            _unload(load)
        beat_file = folder / "runs" / str(job) / "heartbeat.json"
        beat = json.loads(beat_file.read_text()) if beat_file.is_file() else {}
        if beat.get("phase") != "done":
            raise SystemExit(f"bench.forecast: job {job}'s training did not finish: {beat}")
        real_end, started = float(beat["time"]), float(beat["piece_started"])
    rows = [
        _row(wanted, made, found, real_end, started)
        for wanted, (made, found) in sorted(predictions.items())
    ]
    return {
        "job": job,
        "epochs": epochs,
        "training_s": round(real_end - started, 1),
        "load_until": load_until,
        "load_ended_at_fraction": unloaded,
        "steps_per_s_by_quarter": quarter_rates(seen, int(beat.get("steps") or 0)),
        "rows": rows,
    }


def _watch(
    folder: Path,
    job: int,
    every_timeout: tuple[float, float],
    load_until: float | None,
    load: list[subprocess.Popen[bytes]],
) -> tuple[dict[float, tuple[float, dict[str, Any]]], float | None, list[tuple[float, int]]]:
    """Ask ``status`` until the job has left the queue: per wanted fraction, when it was asked
    and the forecast it gave first at or past it; where the load was taken away; the
    heartbeats' (time, step) it read."""
    predictions: dict[float, tuple[float, dict[str, Any]]] = {}
    unloaded = None
    every, timeout = every_timeout
    seen: list[tuple[float, int]] = []  # the heartbeats' (time, step), for the rate's pace
    deadline = time.monotonic() + timeout
    while _queued(job, folder):
        if time.monotonic() > deadline:
            _run(["scancel", str(job)], folder)
            raise SystemExit(f"bench.forecast: job {job} still running after {timeout:.0f} s")
        found = _status(folder, job)
        if found and found.get("steps"):
            fraction = found["step"] / found["steps"]
            if found.get("beat_time") is not None:
                seen.append((found["beat_time"], found["step"]))
            if load and unloaded is None and load_until is not None and fraction >= load_until:
                _unload(load)
                unloaded = round(fraction, 3)
            for wanted in FRACTIONS:
                if found.get("end") and fraction >= wanted and wanted not in predictions:
                    predictions[wanted] = (time.time(), {**found, "fraction": fraction})
        time.sleep(every)
    return predictions, unloaded, seen


def quarter_rates(seen: list[tuple[float, int]], steps: int) -> list[float | None]:
    """Steps a second in each quarter of the steps, from the heartbeats ``status`` read
    (time, step): how much the rate itself moved while the forecast was asked."""
    rates: list[float | None] = []
    for low, high in itertools.pairwise(FRACTIONS_OF_PACE):
        before = [mark for mark in seen if mark[1] <= low * steps]
        after = [mark for mark in seen if mark[1] >= high * steps]
        first = before[-1] if before else (seen[0] if seen else None)
        last = after[0] if after else (seen[-1] if seen else None)
        if first is None or last is None or last[0] <= first[0]:
            rates.append(None)
        else:
            rates.append(round((last[1] - first[1]) / (last[0] - first[0]), 1))
    return rates


def _row(
    wanted: float, made: float, found: dict[str, Any], real_end: float, started: float
) -> dict[str, Any]:
    left, length = max(real_end - made, 1e-9), max(real_end - started, 1e-9)
    error = found["end"] - real_end
    row = {
        "fraction": wanted,
        "seen_at_fraction": round(found["fraction"], 3),
        "error_s": round(error, 2),
        "of_time_left": round(abs(error) / left, 3),
        "of_training": round(abs(error) / length, 3),
        "average_error_s": None,
        "average_of_time_left": None,
    }
    if found.get("average_end") is not None:
        average = found["average_end"] - real_end
        row["average_error_s"] = round(average, 2)
        row["average_of_time_left"] = round(abs(average) / left, 3)
    return row


def table(result: dict[str, Any]) -> str:
    load = result.get("load_until")
    loaded = (
        f", other load on every CPU until {result['load_ended_at_fraction']:.0%} of the steps"
        if load is not None and result.get("load_ended_at_fraction") is not None
        else ""
    )
    lines = [
        f"Predicted end vs real end, {result['epochs']} epochs on 2 nodes "
        f"(training {result['training_s']} s, job {result['job']}{loaded}):",
        "",
        "| from | status at | recent rate: predicted - real (s) | error / time left "
        "| error / training | piece's average: predicted - real (s) | error / time left |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        average = "| - | - |"
        if row["average_error_s"] is not None:
            average = f"| {row['average_error_s']:+.1f} | {row['average_of_time_left']:.1%} |"
        lines.append(
            f"| {row['fraction']:.0%} | {row['seen_at_fraction']:.0%} of the steps "
            f"| {row['error_s']:+.1f} "
            f"| {row['of_time_left']:.1%} | {row['of_training']:.1%} {average}"
        )
    pace = " / ".join("-" if r is None else f"{r:.0f}" for r in result["steps_per_s_by_quarter"])
    lines += [
        "",
        f"The rate in each quarter of the steps: {pace} steps/s.",
        f"Target: within {TARGET:.0%}; {_verdict(result['rows'])}.",
    ]
    return "\n".join(lines)


def _verdict(rows: list[dict[str, Any]]) -> str:
    worst = max((row["of_time_left"] for row in rows), default=None)
    if worst is None:
        return "no prediction"
    averages = [row["average_of_time_left"] for row in rows if row["average_of_time_left"]]
    beside = f" (the piece's average: worst {max(averages):.1%})" if averages else ""
    return f"worst {worst:.1%} of the time left{beside}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.forecast")
    parser.add_argument("--epochs", type=int, default=600, help="the training's length")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between statuses")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after (s)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument(
        "--load-until",
        type=float,
        metavar="F",
        help="a busy process a CPU until this fraction of the steps (0 < F < 1)",
    )
    args = parser.parse_args(argv)
    if args.load_until is not None and not 0 < args.load_until < 1:
        parser.error(f"--load-until must be between 0 and 1, got {args.load_until}")
    result = measure(args.epochs, args.every, args.timeout, args.load_until)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
