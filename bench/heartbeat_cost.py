"""The heartbeat's cost in the step loop: the same training loop (one CPU process, the
default model, batch 1000) with rank 0's heartbeat off, at its interval (5 s) and written at
every step's chance 50x more often (0.1 s), taking turns in one process, so that the
machine's state is the same for each. Per variant: the median time a step takes in the
timed epochs (the steps alone: validation and checkpoints are outside them), and its ratio to
the loop without the heartbeat, of the medians and of the fastest runs (on a shared machine
the fastest run is the one least disturbed). Then the two costs themselves, timed alone: the
check a step makes (``due()``) and one write of the heartbeat (``beat()``: write, fsync,
rename), and what they add to a step at the default interval.

    python -m bench.heartbeat_cost                  # 100,000 rows, 6 epochs, 15 rounds
    python -m bench.heartbeat_cost --short          # CI: 4,000 rows, 2 epochs, 1 round
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from hpcdist.distributed import HeartbeatWriter, single_process
from hpcdist.facts.heartbeat import Heartbeat
from ufsemulator.config import load_config
from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.training.loop import Loop, Shards, StopFlag

VARIANTS: dict[str, float | None] = {"off": None, "every 5 s": 5.0, "every 0.1 s": 0.1}


def _shards(rows: int) -> Shards:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 14, generator=generator)
    y = torch.rand(rows, 1, generator=generator)
    val = max(rows // 10, 1)
    return Shards(x, y, x[:val], y[:val], n_train=rows, n_val=val)


def one_run(shards: Shards, epochs: int, every_s: float | None) -> float:
    """Seconds a step takes in the epochs after the first (the first warms up)."""
    base = load_config(None)
    config = dataclasses.replace(
        base,
        training=dataclasses.replace(
            base.training,
            epochs=epochs,
            batch_size=1000,
            early_stopping_patience=0,
            checkpoint_every=10_000,
        ),
    )
    torch.manual_seed(0)
    model = EmulatorMLP(ModelConfig())
    with contextlib.redirect_stdout(io.StringIO()):
        ctx = single_process()
    with tempfile.TemporaryDirectory(prefix="bench-heartbeat-") as run_dir:
        loop = Loop(ctx, config, model, shards, Path(run_dir), StopFlag())
        loop.heartbeat_on = every_s is not None
        if every_s is not None:
            fixed = Heartbeat(run_id="bench", epochs=epochs, piece_step=0, phase="training")
            loop.heartbeat = HeartbeatWriter(Path(run_dir), fixed, every_s)
        with contextlib.redirect_stdout(io.StringIO()):  # the loop's epoch lines
            summary = loop.run()
    history = summary.progress.history
    seconds = sum(history["train_time_s"][1:])
    steps_per_epoch = summary.progress.step // max(len(history["train_time_s"]), 1)
    return seconds / max(steps_per_epoch * (len(history["train_time_s"]) - 1), 1)


def measure(rows: int, epochs: int, rounds: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    shards = _shards(rows)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(rounds):  # in turns: a slow moment of the machine hits every variant
        for name, every in VARIANTS.items():
            times[name].append(one_run(shards, epochs, every))
    medians = {name: statistics.median(values) for name, values in times.items()}
    parts = costs(calls=200_000 if rounds > 1 else 2_000, writes=50 if rounds > 1 else 3)
    return {
        "rows": rows,
        "epochs": epochs,
        "rounds": rounds,
        "times": times,
        "medians": medians,
        **parts,
    }


def costs(calls: int, writes: int) -> dict[str, float]:
    """Seconds of one ``due()`` (no beat due) and of one ``beat()`` (a write), medians."""
    with tempfile.TemporaryDirectory(prefix="bench-heartbeat-") as folder:
        writer = HeartbeatWriter(Path(folder), Heartbeat(run_id="bench", steps=10**6))
        writer.beat(1, 1000.0)  # the next is due in 5 s: every due() below says no
        due = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(calls):
                writer.due()
            due.append((time.perf_counter() - started) / calls)
        beats = []
        for step in range(writes):
            started = time.perf_counter()
            writer.beat(step + 2, 1000.0, epoch=1, loss=0.5)
            beats.append(time.perf_counter() - started)
    return {"due_s": statistics.median(due), "beat_s": statistics.median(beats)}


def table(result: dict[str, Any]) -> str:
    off = result["medians"]["off"]
    lines = [
        f"step loop, {result['rows']} rows, batch 1000, {result['epochs']} epochs (first "
        f"untimed), {result['rounds']} rounds in turns",
        f"{'heartbeat':<12} {'ms/step':>9} {'min':>9} {'max':>9} {'ratio':>7}",
    ]
    for name, median in result["medians"].items():
        values = result["times"][name]
        lines.append(
            f"{name:<12} {1e3 * median:>9.4f} {1e3 * min(values):>9.4f} "
            f"{1e3 * max(values):>9.4f} {median / off:>6.3f}x"
        )
    step = result["medians"]["off"]
    added = result["due_s"] / step + result["beat_s"] / 5.0  # a share of the time
    lines.append(
        f"due() {1e9 * result['due_s']:.0f} ns a step, beat() {1e3 * result['beat_s']:.3f} ms "
        f"a write: at one write per 5 s, {100 * added:.4f}% of a {1e3 * step:.3f} ms step"
    )
    fastest = {name: min(values) for name, values in result["times"].items()}
    ratios = ", ".join(f"{n} {v / fastest['off']:.3f}x" for n, v in fastest.items() if n != "off")
    lines.append(f"fastest runs against the fastest without: {ratios}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.heartbeat_cost")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--short", action="store_true", help="CI: a few seconds")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.short:
        args.rows, args.epochs, args.rounds = 4_000, 2, 1
    result = measure(args.rows, args.epochs, args.rounds)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
