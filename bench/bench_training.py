"""Emulator training throughput and weak scaling, the project's loop beside two references.

    python3 -m bench.bench_training --device cpu --ranks 1,2,4 --threads-per-rank 4
    python3 -m bench.bench_training --device cuda --ranks 1,2,4 --time-to-target

For each world size the ranks are started once (local processes, torchrun's variables)
and run, in the same processes and on the same rows, batch and model: ``dataloader``
(DataLoader + DistributedSampler), ``resident`` (rows on the device, index per step) and
``ours`` (ufsemulator's ``Loop.run()``, what ``python -m ufsemulator train`` runs), plus
any ``--variant`` of ours. Warm-up epochs are not timed; every timed epoch starts and
ends with a device synchronisation and a barrier (ours: its own per-epoch time, the
device synchronised). Weak scaling: batch and rows per rank are fixed, so efficiency at N
ranks is total throughput / (N x throughput at 1 rank).

``--time-to-target`` trains the project's loop on a fixed data set (the project's split
and normalisation, lr scaled with the world size) at each of ``--ttt-ranks`` and reports
the wall time from the loop's first step to the end of the epoch whose validation loss
(normalised MSE) first reaches each target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.launch import NO_MULTICAST, LaunchError, run_ranks
from bench.report import machine, rate, table, write_json
from bench.synthdata import Grid, cached_arrays
from ufsemulator.config import Config, ConfigError, load_config

LOOPS = ("dataloader", "resident", "ours")
Save = Callable[[str, dict[str, Any]], None]
FAIL_CAPTURE = "fail_capture"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1 like 1,2,4, got {text!r}")
    return values


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.02,0.01, got {text!r}") from None


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,...`` -> (NAME, training config changes), checked as the config is."""
    name, sep, rest = text.partition(":")
    if not sep or not name or name in LOOPS:
        raise argparse.ArgumentTypeError(
            f"expected NAME:key=value,... with a new NAME, e.g. compiled:compile=true, got {text!r}"
        )
    return name, _changes(rest, f"--variant {text!r}")


def _ours(text: str) -> dict[str, Any]:
    """``key=value,...``: training config changes for ``ours`` itself (default: none)."""
    return _changes(text, f"--ours {text!r}")


def _changes(text: str, what: str) -> dict[str, Any]:
    """Training config changes, plus the harness's own ``fail_capture=true`` (the CUDA-graph
    capture fails on purpose, after backward: the loop's fallback, measured)."""
    changes: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"expected key=value in {what}, got {item!r}")
        changes[key.strip()] = yaml.safe_load(value)
    harness = {key: bool(changes.pop(key)) for key in [FAIL_CAPTURE] if key in changes}
    merged = load_config(None).to_dict()
    merged["training"].update(changes)
    try:
        training = Config.from_dict(merged).training
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"{what}: {exc}") from None
    return {**{key: getattr(training, key) for key in changes}, **harness}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.bench_training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: gloo; cuda: nccl, one GPU per rank (default cpu)",
    )
    p.add_argument("--ranks", type=_ints, default=[1, 2, 4], help="world sizes (1,2,4)")
    p.add_argument("--threads-per-rank", type=int, default=4, help="OMP/torch threads (4)")
    p.add_argument(
        "--bind-cores",
        action="store_true",
        help="each rank on cores of its own (as srun --cpu-bind=cores)",
    )
    p.add_argument("--batch", type=int, default=1000, help="rows per rank and step (1000)")
    p.add_argument("--steps", type=int, default=300, help="steps per epoch and rank (300)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per loop (2)")
    p.add_argument("--warmup-epochs", type=int, default=1, help="untimed epochs first (1)")
    p.add_argument("--repeats", type=int, default=3, help="each loop this often; median (3)")
    p.add_argument("--loops", default=",".join(LOOPS), help=f"subset of {','.join(LOOPS)}")
    p.add_argument(
        "--variant",
        type=_variant,
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="another run of ours with training config changes, e.g. "
        "compiled:compile=true or buckets:ddp_bucket_cap_mb=0.016; also "
        "timed to the target with --time-to-target",
    )
    p.add_argument(
        "--ours",
        type=_ours,
        default={},
        metavar="KEY=VALUE,...",
        help="training config changes for ours itself (default: the project's "
        "default config), e.g. grad_allreduce=local; every --variant starts from them",
    )
    p.add_argument("--grid", default="384x320", help="synthetic grid of the rows (384x320)")
    p.add_argument("--no-throughput", action="store_true", help="only --time-to-target")
    p.add_argument("--time-to-target", action="store_true", help="also time to a val loss")
    p.add_argument("--ttt-ranks", type=_ints, default=[1, 4], help="world sizes (1,4)")
    p.add_argument(
        "--ttt-grid",
        default="1440x1080",
        help="synthetic grid, sea-ice points (1440x1080: a quarter degree)",
    )
    p.add_argument(
        "--ttt-targets",
        type=_floats,
        default=[0.02, 0.01, 0.005],
        help="normalised validation MSE targets (0.02,0.01,0.005)",
    )
    p.add_argument("--ttt-max-epochs", type=int, default=40)
    p.add_argument("--work-dir", type=Path, help="cache of generated arrays (a temp folder)")
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--log", type=Path, help="append every rank's output here")
    p.add_argument("--timeout", type=float, default=600.0, help="per launch, seconds (600)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    loops = [name.strip() for name in args.loops.split(",") if name.strip()]
    unknown = [name for name in loops if name not in LOOPS]
    if unknown:
        print(
            f"error: --loops {args.loops!r}: unknown {unknown}; expected {LOOPS}", file=sys.stderr
        )
        return 2
    if args.device == "cuda":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        wanted = max(
            ([] if args.no_throughput else args.ranks)
            + (args.ttt_ranks if args.time_to_target else [1])
        )
        if gpus < wanted:
            print(
                f"error: --device cuda needs {wanted} GPUs (one per rank), this machine has {gpus}",
                file=sys.stderr,
            )
            return 2
    with tempfile.TemporaryDirectory(prefix="hpcdist-bench-data-") as tmp:
        work = args.work_dir or Path(tmp)
        report: dict[str, Any] = {
            "machine": machine(),
            "argv": sys.argv[1:] if argv is None else argv,
            "no_multicast_env": NO_MULTICAST,
        }
        failed = False

        def save(key: str, part: dict[str, Any]) -> None:
            # After every launch: a run cut short by its time limit keeps what it measured.
            report[key] = part
            if args.json is not None:
                write_json(args.json, report)

        if not args.no_throughput:
            failed |= bool(_throughput(args, loops, work, save)["failures"])
        if args.time_to_target:
            failed |= bool(_time_to_target(args, work, save)["failures"])
    return 1 if failed else 0


def _data(grid: Grid, work: Path) -> Path:
    start = time.perf_counter()
    path = cached_arrays(grid, work)
    print(
        f"Data: synthetic {grid.name} in {path} ({time.perf_counter() - start:.1f} s)", flush=True
    )
    return path


# ------------------------------------------------------------------------------ throughput


def _throughput(
    args: argparse.Namespace, loops: list[str], work: Path, save: Save
) -> dict[str, Any]:
    data = _data(Grid.parse(args.grid), work)
    job = {
        "kind": "throughput",
        "device": args.device,
        "data": str(data),
        "batch": args.batch,
        "steps": args.steps,
        "epochs": args.epochs,
        "warmup_epochs": args.warmup_epochs,
        "repeats": args.repeats,
        "loops": loops,
        "val_rows": 4096,
        "variants": dict(args.variant),
        "ours": args.ours,
    }
    results: dict[int, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    names = loops + [name for name, _ in args.variant]
    for world in args.ranks:
        print(f"Throughput: {world} rank(s), {args.device}...", flush=True)
        start = time.perf_counter()
        try:
            results[world] = run_ranks(
                {**job, "label": f"{world} ranks"},
                world,
                args.threads_per_rank,
                args.timeout,
                args.log,
                bind=args.bind_cores,
            )
        except LaunchError as exc:
            failures[str(world)] = str(exc)
            print(f"  failed: {exc}", flush=True)
            if exc.partial is not None:
                results[world] = exc.partial
        else:
            print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
        save(
            "throughput",
            {
                "job": job,
                "per_world": {str(k): v for k, v in results.items()},
                "rows": _summarise(results, names),
                "failures": failures,
            },
        )
    rows = _summarise(results, names)
    first = next(iter(results.values()), {})
    where = first.get("device", args.device)
    print(
        f"\nTraining throughput: {where}, {first.get('backend', '?')}, "
        f"{first.get('threads', '?')} threads per rank, batch {args.batch} per rank, "
        f"{args.steps} steps x {args.epochs} epochs timed, median of {args.repeats}\n"
    )
    if args.ours:
        print(f"(ours with {args.ours}, not the default config)")
    print(_table(rows))
    print()
    for line in _graph_notes(results, ["ours"] + [name for name, _ in args.variant]):
        print(line)
    ours = [r for r in rows if r["loop"] == "ours"]
    if ours:
        # The targets (docs/benchmarks.md), read off this run.
        low = min((r["vs_dataloader"] for r in ours if r["vs_dataloader"]), default=None)
        top = max(ours, key=lambda r: r["ranks"])
        goal = 0.95 if args.device == "cuda" else 0.85
        if low is not None:
            # Issue 7's 5x target is per GPU; on the CPU the ratio is for information.
            verdict = "met" if low >= 5 else "missed"
            if args.device != "cuda":
                verdict = "no target on the CPU"
            print(f"\nours/DataLoader per rank: at least {low:.2f}x (target 5x per GPU): {verdict}")
        if top["efficiency"] is not None and top["ranks"] > 1:
            print(
                f"ours weak-scaling efficiency at {top['ranks']} ranks: "
                f"{100 * top['efficiency']:.0f}% (target {100 * goal:.0f}%): "
                f"{'met' if top['efficiency'] >= goal else 'missed'}"
            )
    return {"failures": failures}


def _graph_notes(results: dict[int, dict[str, Any]], names: Sequence[str]) -> list[str]:
    """Per world size: whether each run of the project's loop ran as a CUDA graph, and its
    final losses beside ours' (the same training, so the same numbers are expected)."""
    lines = []
    for world, result in sorted(results.items()):
        runs = result.get("runs", {})
        base = (runs.get("ours") or [{}])[-1]
        for name in names:
            last = (runs.get(name) or [{}])[-1]
            if "cuda_graph" not in last:
                continue
            same = ""
            if name != "ours" and "val_loss" in base:
                equal = (last["val_loss"], last["train_loss"]) == (
                    base["val_loss"],
                    base["train_loss"],
                )
                diff = abs(last["val_loss"] - base["val_loss"]) / abs(base["val_loss"] or 1.0)
                same = (
                    ", bitwise the same as ours"
                    if equal
                    else f", val loss {diff:.1e} relative from ours'"
                )
            waits = last.get("wait_ms") or []
            if any(w is not None for w in waits):
                same += (
                    "; mean wait for the other ranks per step, by rank: "
                    + ", ".join(f"{w:.3f}" for w in waits)
                    + " ms"
                )
            lines.append(
                f"{name}, {world} rank(s): CUDA graph {last['cuda_graph']}; gradient "
                f"all-reduce {last.get('grad_allreduce', '?')}; last "
                f"train / val loss {last['train_loss']:.6g} / {last['val_loss']:.6g}"
                f"{same}"
            )
    return lines


def _summarise(results: dict[int, dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (loop, world): medians over repeats, efficiency, ratios to the references."""
    per_rank: dict[tuple[str, int], float] = {}
    step_ms: dict[tuple[str, int], float] = {}
    for world, result in results.items():
        for name, runs in result.get("runs", {}).items():
            rates = [r["rows"] / r["seconds"] for r in runs if r["seconds"] > 0]
            steps = [1e3 * r["seconds"] / r["steps"] for r in runs if r["steps"] > 0]
            if rates:
                per_rank[name, world] = statistics.median(rates)
                step_ms[name, world] = statistics.median(steps)
    rows = []
    for name in names:
        for world in sorted(results):
            if (name, world) not in per_rank:
                continue
            mine = per_rank[name, world]
            one = per_rank.get((name, 1))
            row: dict[str, Any] = {
                "loop": name,
                "ranks": world,
                "per_rank": mine,
                "total": mine * world,
                "step_ms": step_ms[name, world],
                "efficiency": mine / one if one else None,
            }
            for ref in ("dataloader", "resident"):
                other = per_rank.get((ref, world))
                row[f"vs_{ref}"] = mine / other if other and name not in LOOPS[:2] else None
            rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.0f}%"

    def times(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    return table(
        [
            "loop",
            "ranks",
            "samples/s per rank",
            "total",
            "step ms",
            "efficiency",
            "ours/DataLoader",
            "ours/resident",
        ],
        [
            [
                r["loop"],
                str(r["ranks"]),
                rate(r["per_rank"]),
                rate(r["total"]),
                f"{r['step_ms']:.3f}",
                pct(r["efficiency"]),
                times(r["vs_dataloader"]),
                times(r["vs_resident"]),
            ]
            for r in rows
        ],
    )


# --------------------------------------------------------------------------- time to target


def _time_to_target(args: argparse.Namespace, work: Path, save: Save) -> dict[str, Any]:
    data = _data(Grid.parse(args.ttt_grid), work)
    job = {
        "kind": "ttt",
        "device": args.device,
        "data": str(data),
        "targets": args.ttt_targets,
        "max_epochs": args.ttt_max_epochs,
        "training": {"batch_size": args.batch},
        "ours": args.ours,
        "variants": dict(args.variant),
    }
    results: dict[int, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for world in args.ttt_ranks:
        print(f"Time to target: {world} rank(s), {args.device}...", flush=True)
        try:
            results[world] = run_ranks(
                {**job, "label": f"{world} ranks"},
                world,
                args.threads_per_rank,
                args.timeout,
                args.log,
                bind=args.bind_cores,
            )
        except LaunchError as exc:
            failures[str(world)] = str(exc)
            print(f"  failed: {exc}", flush=True)
        else:
            r = results[world]
            print(
                f"  {r['epochs_run']} epochs of {r['steps_per_epoch']} steps in "
                f"{r['total_s']:.2f} s",
                flush=True,
            )
        save(
            "time_to_target",
            {
                "job": job,
                "per_world": {str(k): v for k, v in results.items()},
                "rows": _ttt_rows(args.ttt_targets, results),
                "variant_rows": {
                    name: _ttt_rows(args.ttt_targets, _ttt_variant(results, name))
                    for name, _ in args.variant
                },
                "failures": failures,
            },
        )
    base = min(results) if results else None
    first = next(iter(results.values()), {})
    print(
        f"\nTime to target validation loss (normalised MSE): {first.get('device', '?')}, "
        f"{first.get('n_train', '?')} training rows, batch {args.batch} per rank, "
        f"lr 1e-4 x ranks\n"
    )
    if args.ours:
        print(f"(ours with {args.ours}, not the default config)")
    loops = {"ours": results, **{name: _ttt_variant(results, name) for name, _ in args.variant}}
    rows = [
        {"loop": name, **r} for name, res in loops.items() for r in _ttt_rows(args.ttt_targets, res)
    ]
    print(
        table(
            [
                "loop",
                "target",
                "ranks",
                "lr",
                "seconds",
                "epoch",
                "steps",
                f"speedup vs {base} rank(s)",
            ],
            [
                [
                    r["loop"],
                    f"{r['target']:g}",
                    str(r["ranks"]),
                    f"{r['lr']:.0e}",
                    "not reached" if r["seconds"] is None else f"{r['seconds']:.2f}",
                    str(r["epoch"] or "-"),
                    str(r["step"] or "-"),
                    "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
                ]
                for r in rows
            ],
        )
    )
    print()
    for name, res in loops.items():
        for world, r in sorted(res.items()):
            print(
                f"{name}, {world} rank(s): CUDA graph {r.get('cuda_graph', '?')}; gradient "
                f"all-reduce {r.get('grad_allreduce', '?')}; "
                f"{_outside_steps(r)}"
            )
    for r in rows:
        if r["speedup"] is not None and r["loop"] == "ours":
            print(
                f"time to {r['target']:g} at {r['ranks']} ranks: {r['speedup']:.2f}x shorter "
                f"than at {base} (target 3x): {'met' if r['speedup'] >= 3 else 'missed'}"
            )
    return {"failures": failures}


def _ttt_variant(results: dict[int, dict[str, Any]], name: str) -> dict[int, dict[str, Any]]:
    """A variant's time-to-target results per world size, shaped like ours'."""
    return {
        world: r["variants"][name] for world, r in results.items() if name in r.get("variants", {})
    }


def _outside_steps(r: dict[str, Any]) -> str:
    """Per epoch: training time (steps, shuffle) and the rest of the epoch's wall time
    (validation, checkpoint, stop check), from the loop's own clocks."""
    ends, train = r.get("epoch_end_s") or [], r.get("train_time_s") or []
    if not ends or len(ends) != len(train):
        return "no per-epoch clock"
    walls = [b - a for a, b in zip([0.0, *ends[:-1]], ends, strict=True)]
    rest = [1e3 * (w - t) for w, t in zip(walls, train, strict=True)]
    later = rest[1:] or rest
    return (
        f"per epoch {1e3 * statistics.median(train):.1f} ms of steps (median), "
        f"{statistics.median(later):.1f} ms outside them (median of epochs 2+; epoch 1: "
        f"{1e3 * train[0]:.1f} ms steps, {rest[0]:.1f} ms outside)"
    )


def _ttt_rows(targets: list[float], results: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (target, world): seconds to it and the speed-up over the fewest ranks."""
    base = min(results) if results else None
    rows = []
    for target in targets:
        for world, r in sorted(results.items()):
            hit = r["reached"].get(str(target))
            ref = results[base]["reached"].get(str(target)) if base is not None else None
            speedup = ref["seconds"] / hit["seconds"] if hit and ref and world != base else None
            rows.append(
                {
                    "target": target,
                    "ranks": world,
                    "lr": r["lr"],
                    "seconds": hit["seconds"] if hit else None,
                    "epoch": hit["epoch"] if hit else None,
                    "step": hit["step"] if hit else None,
                    "speedup": speedup,
                }
            )
    return rows


if __name__ == "__main__":
    sys.exit(main())
