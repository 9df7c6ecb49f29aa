"""CPU data parallelism against its physical limit: N ranks beside N independent copies.

    python3 -m bench.cpu_scaling --ranks 4 --cpus-per-rank 16
    taskset -c 0,1 python3 -m bench.cpu_scaling --ranks 2 --cpus-per-rank 1
    python3 -m bench.cpu_scaling --layout passive:threads=16,OMP_WAIT_POLICY=PASSIVE

Each rank is given ``--cpus-per-rank`` cores of its own (as ``srun --cpu-bind=cores``
does). For every thread layout (how a rank uses its cores: compute threads, OpenMP's
wait policy; ``hpcdist`` is the layout the rendered scripts and launchers set, ``plain``
one OpenMP thread per core and nothing else), in the same run and on the same rows:

- ``alone``: one rank training alone on its cores;
- ``copies``: N single-rank trainings started together, each on cores of its own,
  exchanging nothing. Memory bandwidth, caches and clocks are still shared, so the
  slowest copy's step is the most N data-parallel ranks can reach on this host;
- ``shm``: N ranks of one data-parallel training, the gradients averaged through shared
  memory (``grad_allreduce: auto`` on one host);
- ``direct``: the same through the TCP exchange of every rank to every rank
  (``grad_allreduce: direct``);
- ``halving``: the same through the recursive halving/doubling TCP exchange
  (``grad_allreduce: halving``);
- ``gloo``: the same through gloo's all-reduce (``grad_allreduce: backend``).

With ``--netns`` every rank of an exchange runs in a network namespace of its own with its
own address, joined to the others through a bridge (``bench.netns``): the ranks then talk
as separate hosts do (``LOCAL_WORLD_SIZE`` 1, ``GLOO_SOCKET_IFNAME`` its interface).

The table gives each step time, the N-rank steps against the slowest copy (1.00x: the
physical limit), the efficiency against one rank alone (its step / the N-rank step) and
the bytes the busiest rank sent per step over TCP as a multiple of the gradients' size,
counted by the kernel on the rank's sockets (``bench.socketbytes``); ``--json`` holds
each exchange's ``bytes_per_rank_step`` (the busiest rank's, and every rank's) beside
its ``step_ms``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.collectives import NUMEL
from bench.launch import LaunchError, run_copies, run_ranks
from bench.report import machine, table, write_json
from bench.synthdata import Grid, cached_arrays
from hpcdist.facts.cpulayout import cpu_layout

EXCHANGES = {"shm": "auto", "direct": "direct", "halving": "halving", "gloo": "backend"}
GRADIENT_BYTES = 4 * NUMEL  # the emulator's gradients, float32


@dataclass(frozen=True)
class Layout:
    """How each rank uses its cores: ``threads`` compute threads, ``env`` on top."""

    name: str
    threads: int
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return f"{self.threads} threads" + (f", {extra}" if extra else "")


def builtin_layouts(cpus: int, ranks: int) -> dict[str, Layout]:
    chosen = cpu_layout(cpus, ranks)
    return {
        "hpcdist": Layout("hpcdist", chosen.threads, dict(chosen.env())),
        "plain": Layout("plain", cpus),
    }


def _layout(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:threads=T,VAR=VALUE,...`` (threads defaults to --cpus-per-rank)."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"expected NAME:threads=T,VAR=VALUE,..., e.g. passive:OMP_WAIT_POLICY=PASSIVE, "
            f"got {text!r}"
        )
    settings: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(
                f"expected VAR=VALUE in --layout {text!r}, got {item!r}"
            )
        settings[key.strip()] = value.strip()
    if "threads" in settings:
        try:
            if int(settings["threads"]) < 1:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"threads must be an integer >= 1 in --layout {text!r}"
            ) from None
    return name, settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.cpu_scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", type=int, default=4, help="data-parallel ranks (4)")
    p.add_argument("--cpus-per-rank", type=int, default=16, help="cores of each rank (16)")
    p.add_argument(
        "--layouts",
        default="hpcdist,plain",
        help="built-in layouts to measure: hpcdist, plain (default both)",
    )
    p.add_argument(
        "--layout",
        type=_layout,
        action="append",
        default=[],
        metavar="NAME:threads=T,VAR=VALUE,...",
        help="another layout, e.g. passive:OMP_WAIT_POLICY=PASSIVE (repeatable)",
    )
    p.add_argument(
        "--exchanges",
        default="shm,direct,halving,gloo",
        help="shm (shared memory, one host), direct (TCP, every rank to every rank), "
        "halving (TCP, recursive halving/doubling), gloo (gloo's all-reduce) (default all)",
    )
    p.add_argument(
        "--netns",
        action="store_true",
        help="each rank of an exchange a host of its own: a network namespace behind a bridge "
        "(bench.netns; root and pyroute2); shm is then not possible",
    )
    p.add_argument("--batch", type=int, default=1000, help="rows per rank and step (1000)")
    p.add_argument("--steps", type=int, default=200, help="steps per epoch and rank (200)")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs (2)")
    p.add_argument("--warmup-epochs", type=int, default=1, help="untimed epochs first (1)")
    p.add_argument("--repeats", type=int, default=1, help="each measurement this often (1)")
    p.add_argument("--grid", default="384x320", help="synthetic grid of the rows (384x320)")
    p.add_argument("--work-dir", type=Path, help="cache of generated arrays (a temp folder)")
    p.add_argument("--json", type=Path, help="write all results here")
    p.add_argument("--log", type=Path, help="append every process's output here")
    p.add_argument("--timeout", type=float, default=300.0, help="per launch, seconds (300)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ranks < 2 or args.cpus_per_rank < 1:
        print(
            f"error: need --ranks >= 2 and --cpus-per-rank >= 1, got {args.ranks} and "
            f"{args.cpus_per_rank}",
            file=sys.stderr,
        )
        return 2
    have = len(os.sched_getaffinity(0))
    if args.ranks * args.cpus_per_rank > have:
        print(
            f"error: {args.ranks} ranks x {args.cpus_per_rank} CPUs need "
            f"{args.ranks * args.cpus_per_rank} CPUs, this process may use {have}",
            file=sys.stderr,
        )
        return 2
    exchanges = [e.strip() for e in args.exchanges.split(",") if e.strip()]
    if not exchanges or any(e not in EXCHANGES for e in exchanges):
        print(
            f"error: --exchanges {args.exchanges!r}: expected some of {', '.join(EXCHANGES)}",
            file=sys.stderr,
        )
        return 2
    if args.netns and "shm" in exchanges:
        print("error: --netns puts every rank on a host of its own: no shm", file=sys.stderr)
        return 2
    builtin = builtin_layouts(args.cpus_per_rank, args.ranks)
    layouts: list[Layout] = []
    for name in (n.strip() for n in args.layouts.split(",") if n.strip()):
        if name not in builtin:
            print(
                f"error: --layouts: unknown {name!r}; expected {sorted(builtin)}", file=sys.stderr
            )
            return 2
        layouts.append(builtin[name])
    for name, settings in args.layout:
        threads = int(settings.pop("threads", args.cpus_per_rank))
        layouts.append(Layout(name, threads, settings))
    report: dict[str, Any] = {
        "machine": machine(),
        "argv": sys.argv[1:] if argv is None else argv,
        "layouts": {},
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="hpcdist-bench-data-") as tmp:
        data = cached_arrays(Grid.parse(args.grid), args.work_dir or Path(tmp))
        job = {
            "kind": "throughput",
            "device": "cpu",
            "data": str(data),
            "batch": args.batch,
            "steps": args.steps,
            "epochs": args.epochs,
            "warmup_epochs": args.warmup_epochs,
            "repeats": args.repeats,
            "loops": ["ours"],
            "val_rows": 4096,
        }
        rows = []
        for layout in layouts:
            print(f"Layout {layout.name}: {layout.describe()}", flush=True)
            measured, sent, errors = _measure(args, job, layout, exchanges)
            failed |= bool(errors)
            report["layouts"][layout.name] = {
                "threads": layout.threads,
                "env": layout.env,
                "step_ms": measured,
                "bytes_per_rank_step": {k: max(v) for k, v in sent.items()},
                "bytes_per_rank_step_each": sent,
                "gradient_bytes": GRADIENT_BYTES,
                "errors": errors,
            }
            if args.json is not None:
                write_json(args.json, report)
            rows.append(_row(layout, measured, sent, exchanges))
    print(
        f"\nCPU data parallelism: {args.ranks} ranks x {args.cpus_per_rank} cores, batch "
        f"{args.batch} per rank, {args.steps} steps x {args.epochs} epochs timed, "
        f"{report['machine']['cpus']} CPUs ({report['machine']['cpu']})\n"
    )
    headers = ["layout", "alone ms", "copies ms (slowest)"]
    for name in exchanges:
        headers += [f"{name} ms", f"{name}/copies", f"{name} eff.", f"{name} sent"]
    print(table(headers, rows))
    print("\nx/copies: the N-rank step over the slowest independent copy's (1.00x: the limit)")
    print("eff.: one rank alone's step over the N-rank step")
    print(
        f"sent: TCP bytes the busiest rank sent per step, counted on its sockets, over the "
        f"gradients' {GRADIENT_BYTES:,} bytes"
    )
    return 1 if failed else 0


def _measure(
    args: argparse.Namespace, job: dict[str, Any], layout: Layout, exchanges: list[str]
) -> tuple[dict[str, Any], dict[str, list[float]], dict[str, str]]:
    """Step ms of alone, each copy, and each exchange for one layout; each exchange's
    TCP bytes sent per step by each rank."""
    common = {
        "threads": layout.threads,
        "timeout_s": args.timeout,
        "log": args.log,
        "cpus_per_rank": args.cpus_per_rank,
        "env": layout.env,
    }
    measured: dict[str, Any] = {}
    sent: dict[str, list[float]] = {}
    errors: dict[str, str] = {}
    steps: list[tuple[str, Any]] = [("alone", None), ("copies", None)]
    steps += [(name, EXCHANGES[name]) for name in exchanges]
    for what, allreduce in steps:
        start = time.perf_counter()
        label = {**job, "label": f"{layout.name} {what}"}
        try:
            if what == "alone":
                results = [run_ranks({**label, "ours": {}}, 1, bind=True, **common)]
            elif what == "copies":
                results = run_copies({**label, "ours": {}}, args.ranks, **common)
            else:
                ours = {"grad_allreduce": allreduce}
                results = [_exchange(args, {**label, "ours": ours}, common)]
        except LaunchError as exc:
            errors[what] = str(exc)
            print(f"  {what}: failed: {exc}", flush=True)
            continue
        per = [_step_ms(r) for r in results]
        measured[what] = per if what == "copies" else per[0]
        last = results[0].get("runs", {}).get("ours", [{}])[-1]
        if what in exchanges:
            sent[what] = [b for b in last.get("bytes_sent_per_step") or [] if b is not None]
        waits = last.get("wait_ms")
        shown = ", ".join(f"{ms:.3f}" for ms in per)
        note = (
            f" (waits {', '.join(f'{w:.2f}' for w in waits if w is not None)} ms)"
            if waits and any(w is not None for w in waits)
            else ""
        )
        print(
            f"  {what}: {shown} ms a step{note} ({time.perf_counter() - start:.0f} s)", flush=True
        )
    return measured, sent, errors


def _exchange(args: argparse.Namespace, job: dict[str, Any], common: dict[str, Any]) -> Any:
    """The N-rank training, with ``--netns`` each rank a host of its own."""
    if not args.netns:
        return run_ranks(job, args.ranks, bind=True, **common)
    from bench.netns import namespaces

    with namespaces(args.ranks) as nets:
        return run_ranks(job, args.ranks, bind=True, nets=nets, **common)


def _step_ms(result: dict[str, Any]) -> float:
    runs = result["runs"]["ours"]
    return sorted(1e3 * r["seconds"] / r["steps"] for r in runs)[len(runs) // 2]


def _row(
    layout: Layout, measured: dict[str, Any], sent: dict[str, list[float]], exchanges: list[str]
) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    alone = measured.get("alone")
    copies = measured.get("copies") or []
    slowest = max(copies) if copies else None
    row = [f"{layout.name} ({layout.describe()})", ms(alone), ms(slowest)]
    for name in exchanges:
        step = measured.get(name)
        row.append(ms(step))
        row.append("-" if step is None or slowest is None else f"{step / slowest:.2f}x")
        row.append("-" if step is None or alone is None else f"{100 * alone / step:.0f}%")
        most = max(sent.get(name) or [-1.0])
        row.append("-" if most < 0 else f"{most / GRADIENT_BYTES:.2f}x")
    return row


if __name__ == "__main__":
    sys.exit(main())
