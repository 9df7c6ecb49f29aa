"""The rendezvous at hundreds of ranks: hpcdist's authenticated group against torch's plain one.

    python3 -m bench.rendezvous --ranks 256 --store-ranks 1024      # a 64-core host
    python3 -m bench.rendezvous --ranks 8 --store-ranks 16          # a short CPU run

One process imports torch once and forks every rank from it, so what is timed is the
joining alone (no import, no step): the ranks are released together and each notes when
its first all-reduce (of one float) has returned. In the same run, alternately:

- ``hpcdist``: ``setup_distributed(backend="gloo")`` with a job secret, as a job's ranks
  call it: the store (rank 0 serves, every other rank first polls its port), the gloo
  group, and the secret check of every rank (``hpcdist.distributed.jobsecret``);
- ``torch``: ``init_process_group("gloo", init_method="env://")``, torch's own rendezvous
  with no authentication.

And the store-only path (no process group: gloo's full mesh of N x (N - 1) / 2
connections is not made) at ``--store-ranks``: every rank joins rank 0's TCPStore as
``setup_distributed`` does (polling the port first), then one barrier through the store;
beside it the same with torch's TCPStore alone.

Each figure is the time from the release to the last rank's first all-reduce (or store
barrier), and the median rank's, over ``--repeats`` runs (the median run is shown).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.launch import free_port, without_launcher
from bench.report import machine, table, write_json

_RECORD = struct.Struct("=iid")  # rank, ok, seconds from the release
MODES = ("hpcdist", "torch")
STORE_MODES = ("hpcdist-store", "torch-store")


def _join_hpcdist(rank: int, world: int, timeout_s: float) -> Any:
    import torch
    import torch.distributed as dist

    from hpcdist.distributed import setup_distributed

    setup_distributed(timeout_s=timeout_s, backend="gloo")  # CPU ranks on a GPU host too
    dist.all_reduce(torch.ones(1))
    return None


def _join_torch(rank: int, world: int, timeout_s: float) -> Any:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(1))
    return None


def _store(rank: int, world: int, timeout_s: float, poll_first: bool) -> Any:
    import torch.distributed as dist

    from hpcdist.distributed import group

    port = int(os.environ["MASTER_PORT"])
    deadline = time.monotonic() + timeout_s
    if poll_first and rank != 0:
        group._wait_for_master("127.0.0.1", port, deadline)  # as setup_distributed does
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world,
        is_master=rank == 0,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=True,
    )
    _store_count(store, "arrived", world, deadline)
    return store  # kept by the caller until every rank has its time: rank 0 serves


def _store_count(store: Any, key: str, world: int, deadline: float) -> None:
    store.add(key, 1)
    while int(store.add(key, 0)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {key!r}")
        time.sleep(0.001)


JOINS: dict[str, Callable[[int, int, float], Any]] = {
    "hpcdist": _join_hpcdist,
    "torch": _join_torch,
    "hpcdist-store": lambda r, w, t: _store(r, w, t, True),
    "torch-store": lambda r, w, t: _store(r, w, t, False),
}


def run_once(mode: str, world: int, timeout_s: float, secret: Path, log: Path) -> dict[str, Any]:
    """Fork ``world`` ranks joining by ``mode``; release them together; collect each
    rank's seconds to its first all-reduce."""
    port = free_port()
    start_r, start_w = os.pipe()
    done_r, done_w = os.pipe()
    children: list[int] = []
    for rank in range(world):
        try:
            pid = os.fork()
        except OSError as exc:  # the host's process limit: the started ranks read no start
            for fd in (start_r, start_w, done_r, done_w):
                os.close(fd)
            for child in children:
                os.waitpid(child, 0)
            return {
                "ranks": world,
                "ok": 0,
                "last_s": None,
                "median_s": None,
                "error": f"fork of rank {rank}: {exc}",
            }
        if pid == 0:  # the rank: never returns
            os.close(start_w)
            os.close(done_r)
            _child(mode, rank, world, port, timeout_s, secret, log, start_r, done_w)
        children.append(pid)
    os.close(start_r)
    os.close(done_w)
    released = time.monotonic()
    os.write(start_w, struct.pack("=d", released) * world)
    os.close(start_w)
    records = _collect(done_r, world, timeout_s + 30)
    for pid in children:
        os.waitpid(pid, 0)
    seconds = sorted(s for _, ok, s in records if ok)
    return {
        "ranks": world,
        "ok": len(seconds),
        "last_s": seconds[-1] if len(seconds) == world else None,
        "median_s": statistics.median(seconds) if seconds else None,
    }


def _child(
    mode: str,
    rank: int,
    world: int,
    port: int,
    timeout_s: float,
    secret: Path,
    log: Path,
    start_r: int,
    done_w: int,
) -> None:
    code = 1
    try:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(_rank_env(rank, world, port, secret, mode))
        released = struct.unpack("=d", os.read(start_r, 8))[0]
        ok, store = 0, None
        try:
            store = JOINS[mode](rank, world, timeout_s)
            ok = 1
        except Exception as exc:
            print(f"[{mode} rank {rank}] {type(exc).__name__}: {exc}", flush=True)
        os.write(done_w, _RECORD.pack(rank, ok, time.monotonic() - released))
        _leave_together(store, world, timeout_s)
        code = 0
    finally:
        os._exit(code)  # no teardown: gloo's threads, the store's server die with it


def _leave_together(store: Any, world: int, timeout_s: float) -> None:
    """Wait for every rank before leaving: rank 0's exit ends the store's server (and
    its part of gloo's connections) under ranks still finishing."""
    try:
        if store is not None:
            _store_count(store, "left", world, time.monotonic() + timeout_s)
        else:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
    except Exception as exc:  # the time is already recorded
        print(f"leaving: {type(exc).__name__}: {exc}", flush=True)


def _rank_env(rank: int, world: int, port: int, secret: Path, mode: str) -> dict[str, str]:
    env = without_launcher(_BASE_ENV)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    if mode == "hpcdist":
        from hpcdist.facts.protocol import SECRET_VAR

        env[SECRET_VAR] = str(secret)
    return env


_BASE_ENV = dict(os.environ)


def _collect(fd: int, world: int, timeout_s: float) -> list[tuple[int, int, float]]:
    records: list[tuple[int, int, float]] = []
    buffer = b""
    deadline = time.monotonic() + timeout_s
    os.set_blocking(fd, False)
    while len(records) < world and time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.005)
            continue
        if not chunk:
            break  # every rank has exited
        buffer += chunk
        while len(buffer) >= _RECORD.size:
            records.append(_RECORD.unpack(buffer[: _RECORD.size]))
            buffer = buffer[_RECORD.size :]
    os.close(fd)
    return records


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.rendezvous",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--ranks", type=int, default=256, help="ranks of the process groups (256)")
    p.add_argument("--store-ranks", type=int, default=1024, help="ranks of the store-only path")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="per rendezvous, seconds")
    p.add_argument("--json", type=Path)
    p.add_argument("--log", type=Path, help="every rank's output (default: a temp file)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.ranks < 2 or args.store_ranks < 2 or args.repeats < 1:
        print(
            f"error: need --ranks, --store-ranks >= 2 and --repeats >= 1, got "
            f"{args.ranks}, {args.store_ranks}, {args.repeats}",
            file=sys.stderr,
        )
        return 2
    import torch.distributed  # noqa: F401  # once, before the forks: no rank imports

    import hpcdist.distributed  # noqa: F401
    from hpcdist.distributed.jobsecret import create_secret_file

    _raise_file_limit(2 * max(args.ranks, args.store_ranks) + 256)
    with tempfile.TemporaryDirectory(prefix="hpcdist-rdzv-") as tmp:
        secret = Path(tmp) / "secret"
        create_secret_file(secret)
        log = args.log or Path(tmp) / "ranks.log"
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in (*MODES, *STORE_MODES)}
        for repeat in range(args.repeats):
            order = MODES[::-1] if repeat % 2 == 0 else MODES  # torch's first
            for mode in order:
                runs[mode].append(run_once(mode, args.ranks, args.timeout, secret, log))
                print(f"  {mode}, {args.ranks} ranks: {_show(runs[mode][-1])}", flush=True)
            for mode in STORE_MODES if repeat % 2 == 0 else STORE_MODES[::-1]:
                runs[mode].append(run_once(mode, args.store_ranks, args.timeout, secret, log))
                print(f"  {mode}, {args.store_ranks} ranks: {_show(runs[mode][-1])}", flush=True)
        failed = any(r["last_s"] is None for rs in runs.values() for r in rs)
        if failed:
            print("some ranks failed; the last lines of their log:\n" + _tail(log), file=sys.stderr)
    print(_summary(args, runs))
    if args.json is not None:
        write_json(
            args.json,
            {
                "machine": machine(),
                "argv": sys.argv[1:] if argv is None else argv,
                "runs": runs,
                "cpus": len(os.sched_getaffinity(0)),
            },
        )
    return 1 if failed else 0


def _summary(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> str:
    def median(mode: str, key: str) -> float | None:
        values = [r[key] for r in runs[mode] if r[key] is not None]
        return statistics.median(values) if values else None

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    rows = []
    for ours, theirs in (("hpcdist", "torch"), ("hpcdist-store", "torch-store")):
        a, b = median(ours, "last_s"), median(theirs, "last_s")
        ranks = runs[ours][0]["ranks"]
        ratio = "-" if a is None or b is None else f"{a / b:.2f}x"
        rows.append(
            [
                f"{ranks}",
                ours,
                seconds(a),
                seconds(median(ours, "median_s")),
                theirs,
                seconds(b),
                seconds(median(theirs, "median_s")),
                ratio,
            ]
        )
    cpus = len(os.sched_getaffinity(0))
    return (
        f"\nRendezvous on {cpus} CPUs, ranks forked from one process; seconds from the "
        f"release to the first all-reduce (store: a store barrier), median of "
        f"{args.repeats}\n\n"
        + table(
            [
                "ranks",
                "ours",
                "last rank s",
                "median rank s",
                "reference",
                "last rank s",
                "median rank s",
                "ours / reference",
            ],
            rows,
        )
    )


def _show(run: dict[str, Any]) -> str:
    if run["last_s"] is None:
        return f"{run['ok']} of {run['ranks']} ranks joined {run.get('error', '')}".strip()
    return f"last rank {run['last_s']:.2f} s, median {run['median_s']:.2f} s"


def _tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    except OSError:
        return "(no log)"


def _raise_file_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


if __name__ == "__main__":
    sys.exit(main())
