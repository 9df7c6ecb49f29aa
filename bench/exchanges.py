"""The CPU gradient exchanges alone: microseconds and bytes sent per all-reduce, by N and size.

    python3 -m bench.exchanges --ranks 2,4,8 --numels 9345,262144
    python3 -m bench.exchanges --ranks 8,16 --netns                    # a host per rank
    python3 -m bench.exchanges --ranks 8 --netns --delay-us 25 --rate-gbit 10

Every rank runs ``reduce_`` of each exchange back to back on a tensor of ``--numels``
float32 (9,345: the emulator's gradients): ``direct`` (every rank to every rank,
``meshreduce``), ``halving`` (recursive halving/doubling, ``halvingreduce``), ``gloo``
(``dist.all_reduce``, gloo's own algorithm and threads) and, with every rank on one host,
``shm`` (``gradreduce``'s shared memory). Each number is rank 0's microseconds per
all-reduce, the median of ``--chunks`` timed chunks, and the TCP bytes the busiest rank
sent per all-reduce over the tensor's size, counted by the kernel on its sockets
(``bench.socketbytes``). These tables give ``auto``'s rule across nodes
(``ufsemulator.training.crossnode``).

``--netns`` puts each rank in a network namespace of its own with its own address, joined
through a bridge (``bench.netns``; root and pyroute2): ranks then talk as separate hosts
do. ``--delay-us``/``--rate-gbit`` add a one-way delay and a rate limit to every rank's
link (netem) and print each exchange's alpha-beta model beside the measurement: rounds x
delay + bytes on the busiest link / rate.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.launch import LaunchError, run_ranks
from bench.report import machine, table, write_json

EXCHANGES = ("direct", "halving", "gloo", "shm")


# ------------------------------------------------------------------------- in each rank


def measure(ctx: Any, job: dict[str, Any], result: dict[str, Any]) -> None:
    """Runs in every rank (``bench.worker``, job kind ``exchanges``)."""
    import torch
    import torch.distributed as dist

    from bench.socketbytes import tcp_bytes_sent
    from ufsemulator.training import crossnode, gradreduce

    result.update(us={}, bytes_per_call={}, errors={})
    for numel in job["numels"]:
        calls = max(3, min(job["per_chunk"], int(4e7 // (4 * numel))))
        for name in job["exchanges"]:
            key = f"{name}/{numel}"
            grads = torch.ones(numel)
            run: Callable[[torch.Tensor], Any]
            try:
                if name == "gloo":
                    run = dist.all_reduce
                elif name == "shm":
                    run = gradreduce.shared_memory_allreduce(numel, ctx).reduce_
                else:
                    run = crossnode.MAKERS[name](numel, ctx).reduce_
                run(grads)  # warm-up
                dist.barrier()
                times, before = [], tcp_bytes_sent()
                for _ in range(job["chunks"]):
                    start = time.perf_counter()
                    for _ in range(calls):
                        run(grads)
                    times.append(1e6 * (time.perf_counter() - start) / calls)
                sent = (tcp_bytes_sent() - before) / (calls * job["chunks"])
                result["us"][key] = statistics.median(times)
            except Exception as exc:  # reported, not fatal: the others still run
                result["errors"][key] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                sent = -1.0
            everyone: list[Any] = [None] * ctx.env.world_size
            dist.all_gather_object(everyone, sent)
            result["bytes_per_call"][key] = max(everyone)
            dist.barrier()


# ------------------------------------------------------------------------------ model


def alpha_beta_us(
    exchange: str, world: int, nbytes: int, delay_us: float, rate_gbit: float
) -> float:
    """The alpha-beta model of one all-reduce: rounds x one-way delay + the bytes the
    busiest link carries / its rate. gloo is modelled as a ring (2 (N - 1) rounds of
    nbytes / N). Pure."""
    beta_us = 8e-3 / rate_gbit  # microseconds a byte
    power = 1 << (world.bit_length() - 1)
    if exchange == "direct":
        rounds, busiest = 1, (world - 1) * nbytes
    elif exchange == "halving":
        log = power.bit_length() - 1
        folded = world != power
        rounds = 2 * log + (2 if folded else 0)
        busiest = 2 * nbytes * (power - 1) // power + (2 * nbytes if folded else 0)
    elif exchange == "gloo":
        rounds, busiest = 2 * (world - 1), 2 * nbytes * (world - 1) // world
    else:
        raise ValueError(f"no model of exchange {exchange!r}; expected direct, halving or gloo")
    return rounds * delay_us + busiest * beta_us


# ------------------------------------------------------------------------------ command


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} expects integers like 2,4,8, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{flag} expects integers >= 1, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.exchanges",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", type=lambda t: _ints(t, "--ranks"), default=[2, 4])
    p.add_argument("--numels", type=lambda t: _ints(t, "--numels"), default=[9345])
    p.add_argument("--exchanges", default="direct,halving,gloo,shm")
    p.add_argument("--threads-per-rank", type=int, default=1)
    p.add_argument("--bind-cores", action="store_true", help="each rank on cores of its own")
    p.add_argument("--per-chunk", type=int, default=100, help="all-reduces per timed chunk")
    p.add_argument("--chunks", type=int, default=5)
    p.add_argument("--netns", action="store_true", help="each rank a host of its own")
    p.add_argument("--delay-us", type=float, default=0.0, help="netem one-way delay (--netns)")
    p.add_argument("--rate-gbit", type=float, help="netem rate of each link (--netns)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    exchanges = [e.strip() for e in args.exchanges.split(",") if e.strip()]
    if not exchanges or any(e not in EXCHANGES for e in exchanges):
        print(
            f"error: --exchanges {args.exchanges!r}: expected some of {EXCHANGES}", file=sys.stderr
        )
        return 2
    shaped = args.delay_us > 0 or args.rate_gbit is not None
    if shaped and not args.netns:
        print("error: --delay-us and --rate-gbit shape the links of --netns", file=sys.stderr)
        return 2
    if args.netns and "shm" in exchanges:
        exchanges.remove("shm")  # no shared host: each rank is a host of its own
    job = {
        "kind": "exchanges",
        "device": "cpu",
        "numels": args.numels,
        "exchanges": exchanges,
        "per_chunk": args.per_chunk,
        "chunks": args.chunks,
    }
    results, failed = _run_worlds(args, job)
    rows = _rows(args, results, exchanges)
    where = "a network namespace per rank" if args.netns else "one host"
    link = f", links {args.delay_us:g} us one way, {args.rate_gbit} Gbit/s" if shaped else ""
    print(
        f"\nCPU gradient exchanges, {where}{link}; rank 0's us per all-reduce (median of "
        f"{args.chunks} chunks), bytes sent by the busiest rank over the tensor's\n"
    )
    headers = ["ranks", "KB", "exchange", "us", "sent/size"] + (["model us"] if shaped else [])
    print(table(headers, rows))
    if args.json is not None:
        write_json(
            args.json,
            {
                "machine": machine(),
                "argv": sys.argv[1:] if argv is None else argv,
                "job": job,
                "netns": args.netns,
                "delay_us": args.delay_us,
                "rate_gbit": args.rate_gbit,
                "per_world": {str(k): v for k, v in results.items()},
            },
        )
    return 1 if failed else 0


def _run_worlds(args: argparse.Namespace, job: dict[str, Any]) -> tuple[dict[int, Any], bool]:
    from contextlib import nullcontext

    results: dict[int, dict[str, Any]] = {}
    failed = False
    for world in args.ranks:
        try:
            if args.netns:
                from bench.netns import Shaping, namespaces

                shaping = (
                    Shaping(args.delay_us, args.rate_gbit)
                    if args.delay_us or args.rate_gbit
                    else None
                )
                hosts: Any = namespaces(world, shaping)
            else:
                hosts = nullcontext(None)
            with hosts as nets:
                results[world] = run_ranks(
                    job, world, args.threads_per_rank, args.timeout, bind=args.bind_cores, nets=nets
                )
            for key, us in results[world]["us"].items():  # as it comes: a later world may hang
                sent = results[world]["bytes_per_call"][key] / (4 * int(key.split("/")[1]))
                print(f"  {world} ranks, {key}: {us:.1f} us, sent {sent:.2f}x", flush=True)
        except (LaunchError, RuntimeError) as exc:
            print(f"{world} ranks failed: {exc}", flush=True)
            failed = True
        for key, error in results.get(world, {}).get("errors", {}).items():
            print(f"{world} ranks, {key}: {error}", flush=True)
            failed = True
    return results, failed


def _rows(
    args: argparse.Namespace, results: dict[int, Any], exchanges: list[str]
) -> list[list[str]]:
    shaped = args.delay_us > 0 or args.rate_gbit is not None
    rows = []
    for world, result in sorted(results.items()):
        for numel in args.numels:
            for name in exchanges:
                key = f"{name}/{numel}"
                us = result["us"].get(key)
                sent = result["bytes_per_call"].get(key, -1)
                row = [
                    str(world),
                    f"{4 * numel / 1e3:.0f}",
                    name,
                    "-" if us is None else f"{us:.1f}",
                    "-" if sent < 0 else f"{sent / (4 * numel):.2f}x",
                ]
                if shaped and name != "shm":
                    rate = args.rate_gbit or 1e6
                    row.append(f"{alpha_beta_us(name, world, 4 * numel, args.delay_us, rate):.1f}")
                elif shaped:
                    row.append("-")
                rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
