"""Latency of the collective every training step waits for: one all-reduce of the model's
gradients (9,345 float32, 37 KB).

    python3 -m bench.collectives --device cuda --ranks 1,2,4 --json collectives.json
    python3 -m bench.collectives --device cpu --ranks 1,2,4 --threads-per-rank 4 --bind-cores

On GPUs (one per rank, NCCL): ``dist.all_reduce`` queued back to back, and the same inside
a CUDA graph (as the training step replays it); and PyTorch's symmetric-memory one-shot
all-reduce (each GPU reads its peers' buffers over NVLink, no NCCL kernel) inside a CUDA
graph. On the CPU: gloo's ``dist.all_reduce`` back to back, and the shared-memory
all-reduce of ``ufsemulator.training.gradreduce`` (what training uses on one host). Every number
is microseconds per all-reduce, rank 0's clock, median over ``--chunks`` timed chunks.
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

NUMEL = 9345  # EmulatorMLP 14-64-64-64-1: its parameters, so its gradients


# ------------------------------------------------------------------------- in each rank


def measure(ctx: Any, job: dict[str, Any], result: dict[str, Any]) -> None:
    """Runs in every rank (``bench.worker``, job kind ``collectives``)."""
    import torch
    import torch.distributed as dist

    numel, per_chunk, chunks = job["numel"], job["per_chunk"], job["chunks"]
    result["us"] = {}
    result["errors"] = {}
    cuda = ctx.device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(ctx.device)

    def timed(name: str, run_chunk: Callable[[], None]) -> None:
        try:
            run_chunk()  # warm-up
            sync()
            dist.barrier()
            times = []
            for _ in range(chunks):
                start = time.perf_counter()
                run_chunk()
                sync()
                times.append(1e6 * (time.perf_counter() - start) / per_chunk)
            result["us"][name] = statistics.median(times)
        except Exception as exc:  # a probe that cannot run here is reported, not fatal
            result["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            sync()
        dist.barrier()

    grads = torch.zeros(numel, device=ctx.device)

    def queued() -> None:
        for _ in range(per_chunk):
            dist.all_reduce(grads)

    timed("all_reduce", queued)
    if not cuda:
        if ctx.env.world_size > 1:
            from ufsemulator.training.gradreduce import shared_memory_allreduce

            shm = shared_memory_allreduce(numel, ctx)

            def shared() -> None:
                for _ in range(per_chunk):
                    shm.reduce_(grads)

            timed("shared_memory", shared)
        return
    stream = torch.cuda.Stream(ctx.device)
    stream.wait_stream(torch.cuda.current_stream(ctx.device))
    with torch.cuda.stream(stream):
        dist.all_reduce(grads)  # the communicator exists before a capture
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(per_chunk):
                    dist.all_reduce(grads)
        except Exception as exc:
            result["errors"]["all_reduce_graph"] = f"{type(exc).__name__}: {exc}"
        else:
            timed("all_reduce_graph", graph.replay)
        one_shot = _one_shot_graph(ctx, numel, per_chunk, stream, result)
        if one_shot is not None:
            timed("one_shot_graph", one_shot.replay)


def _one_shot_graph(ctx: Any, numel: int, count: int, stream: Any, result: dict[str, Any]) -> Any:
    """A CUDA graph of ``count`` symmetric-memory one-shot all-reduces, or None."""
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed import _symmetric_memory as symm_mem

        group = dist.group.WORLD
        assert group is not None
        buf = symm_mem.empty(numel, dtype=torch.float32, device=ctx.device)
        buf.zero_()
        symm_mem.rendezvous(buf, group)
        out = torch.empty_like(buf)
        op = torch.ops.symm_mem.one_shot_all_reduce_out
        op(buf, "sum", group.group_name, out)
        torch.cuda.synchronize(ctx.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(count):
                op(buf, "sum", group.group_name, out)
        graph.keep = (buf, out)  # type: ignore[attr-defined]  # alive as long as the graph
        return graph
    except Exception as exc:
        result["errors"]["one_shot_graph"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        torch.cuda.synchronize(ctx.device)
        return None


# ------------------------------------------------------------------------------ command


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m bench.collectives",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--ranks", default="1,2,4", help="world sizes (1,2,4)")
    p.add_argument("--threads-per-rank", type=int, default=4)
    p.add_argument("--bind-cores", action="store_true", help="each rank on cores of its own")
    p.add_argument("--per-chunk", type=int, default=200, help="all-reduces per timed chunk")
    p.add_argument("--chunks", type=int, default=7)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        worlds = [int(v) for v in args.ranks.split(",")]
    except ValueError:
        print(f"error: --ranks expects integers like 1,2,4, got {args.ranks!r}", file=sys.stderr)
        return 2
    job = {
        "kind": "collectives",
        "device": args.device,
        "numel": NUMEL,
        "per_chunk": args.per_chunk,
        "chunks": args.chunks,
    }
    results: dict[int, dict[str, Any]] = {}
    failed = False
    for world in worlds:
        try:
            results[world] = run_ranks(
                job, world, args.threads_per_rank, args.timeout, bind=args.bind_cores
            )
        except LaunchError as exc:
            print(f"{world} ranks failed: {exc}", flush=True)
            failed = True
    names = sorted({name for r in results.values() for name in r["us"]})
    print(
        f"\nOne all-reduce of {NUMEL} float32 ({4 * NUMEL / 1e3:.0f} KB), {args.device}, "
        f"us each (median of {args.chunks} x {args.per_chunk})"
        f"{', ranks bound to cores' if args.bind_cores else ''}\n"
    )
    print(
        table(
            ["probe", *[f"{w} ranks" for w in sorted(results)]],
            [
                [
                    name,
                    *[
                        f"{results[w]['us'][name]:.1f}" if name in results[w]["us"] else "-"
                        for w in sorted(results)
                    ],
                ]
                for name in names
            ],
        )
    )
    for world, r in sorted(results.items()):
        for name, error in r["errors"].items():
            print(f"{name}, {world} ranks: {error}")
    if args.json is not None:
        write_json(
            args.json,
            {
                "machine": machine(),
                "argv": sys.argv[1:] if argv is None else argv,
                "job": job,
                "bind_cores": args.bind_cores,
                "per_world": {str(k): v for k, v in results.items()},
            },
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
