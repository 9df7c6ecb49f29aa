"""DDP's gradient all-reduce without a network round trip, for ranks on one host.

The model's gradients are 37 KB, so the all-reduce every step waits for is all latency.
When every rank is on the same host (``training.grad_allreduce: local``; ``auto`` on
the CPU, and on GPUs for long runs), the ranks can
read each other's gradients directly instead of sending them through the backend:

- CPU ranks (gloo): a shared-memory segment in ``/dev/shm`` with one slot per rank.
  Each rank writes its gradients and a step counter, waits until every counter has
  reached the step, and sums all slots in rank order. gloo instead sends the 37 KB over
  loopback TCP in 2 (N-1) exchanges, each through its worker threads: about 0.6 ms at 4
  ranks on a 64-core host, against a 1.4 ms step (docs/benchmarks.md).
- GPU ranks (NCCL): PyTorch's symmetric memory maps every rank's buffer into every GPU of
  the host; its one-shot all-reduce is one kernel (signal, read all copies, sum in rank
  order, signal), which a CUDA graph can hold.

Every rank gets the same bits (the same sum in the same order). Set-up is collective and
every rank gets the same answer; where it cannot work on every rank (ranks on several
hosts, no ``/dev/shm``, no peer access) or the gradients are large (over 16 MiB, where
the backend's bandwidth is what counts), DDP keeps the backend's all-reduce.
"""

from __future__ import annotations

import os
import platform
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hpcdist.distributed import DistContext, collective_timeout_s
from ufsemulator.training import crossnode

SHM_DIR = Path("/dev/shm")
# A rank that is alive but never arrives (hung) must not leave the others spinning for
# ever: they wait the job's --collective-timeout, this long without one; one that has exited
# is noticed within a second (its process id is in the segment).
ARRIVAL_TIMEOUT_S = 600.0
_BUSY_SPINS = 50  # looks at the counters (about 1 us each) before yielding the core
# A wait longer than this (a slow or hung peer, not a step's jitter) sleeps between looks:
# yielding alone kept every waiting rank's core at 100% for as long as the peer took.
_NAP_AFTER_S = 0.02
_NAP_S = 0.0005  # at most half a millisecond added to a wait of 20 ms or more
# A yield that took this long ran another thread: the host has more runnable threads than
# cores (a rank per core and a busy neighbour, or more ranks than cores), so the wait sleeps
# from the start. A yield on a core of its own returns in about a microsecond. 4 ranks on 2
# cores trained 300 epochs in 17% less time and CPU so; 2 ranks on 2 cores as before.
_CONTENDED_S = 0.0002
# The symmetric memory's set-up (allocate, map every GPU's buffer, test) made a 2-GPU job
# on one host 3-3.5 s slower to start than NCCL's all-reduce alone (default job, 2x H200,
# docs/benchmarks.md); its one-shot all-reduce saves about 11 us a step against NCCL's (4
# GPUs, 0.130 ms steps). It pays from about 300,000 steps on: ``auto`` asks for it from
# this many planned steps (epochs x steps an epoch), ``local`` always.
SYMMETRIC_MIN_STEPS = 300_000
# Sharing memory wins where an all-reduce is latency, i.e. small. Larger gradients keep the
# backend: its bandwidth is fine there, and /dev/shm (a tmpfs: a write beyond free memory
# kills the process with SIGBUS) is never asked for much.
MAX_BYTES = 16 * 2**20


class LocalAllReduce(Protocol):
    name: str  # for logs: how the gradients travel

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor: ...


def comm_hook(reducer: LocalAllReduce) -> Any:
    """``reducer`` as a DDP communication hook (a function of ``(state, bucket)``)."""

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        # DDP waits on the future and takes its value as the bucket's reduced gradients.
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(reducer.reduce_(bucket.buffer()))
        return future

    # DDP compares the annotations with the classes themselves, not with their names.
    hook.__annotations__ = {
        "state": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    return hook


class SharedMemoryAllReduce:
    """Mean over the ranks of one host through a shared-memory segment (CPU tensors).

    Layout: one 64-byte line per rank (its step counter, then its process id), then two
    sets of ``world`` slots of ``numel`` float32. Step k writes set k % 2: a rank reaches
    step k + 2 only after every rank has reached k + 1, that is, after every rank has
    finished reading step k's set. A step is one call: DDP reduces its buckets in the
    same order on every rank, one call each."""

    name = "shared memory (this host)"

    def __init__(self, segment: torch.Tensor, numel: int, rank: int, world: int) -> None:
        # NumPy views: reading or writing an element is a plain memory access, no torch op.
        lines = segment[: _counter_bytes(world)].view(torch.int64).view(world, 8).numpy()
        self.counters = lines[:, 0]
        self._pids = lines[:, 1]
        self._pids[rank] = os.getpid()  # so that a waiting peer can tell we are gone
        self.slots = segment[_counter_bytes(world) :].view(torch.float32).view(2, world, numel)
        self.rank, self.world = rank, world
        self.step = 0
        self.waited_s = 0.0  # for benchmarks: time spent waiting for the other ranks

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor:
        self.step += 1
        slots = self.slots[self.step % 2, :, : grads.numel()]
        torch.div(grads, self.world, out=slots[self.rank])  # as DDP: divide, then sum
        # x86-64 keeps stores in order (hence _blocker): a peer that sees the counter
        # sees the gradients written before it.
        self.counters[self.rank] = self.step
        start = time.perf_counter()
        self._wait(self.step)
        self.waited_s += time.perf_counter() - start
        return torch.sum(slots, dim=0, out=grads)  # rank order, the same on every rank

    def _wait(self, step: int) -> None:
        counters = self.counters
        spins, napping = 0, False
        started = time.monotonic()
        next_look = started + 1.0
        while (counters < step).any():
            spins += 1
            if spins < _BUSY_SPINS:
                continue  # peers on cores of their own arrive within microseconds
            # Then give the core away at every look: on a host with more threads than
            # cores, the peer this rank waits for may need it to arrive at all.
            if napping:
                time.sleep(_NAP_S)
            else:
                before = time.monotonic()
                os.sched_yield()
                napping = time.monotonic() - before > _CONTENDED_S
            if (napping or spins % 1024 == 0) and (now := time.monotonic()) > next_look:
                next_look = now + 1.0
                self._check_peers(step, now - started)
            if not napping and spins % 1024 == 0:
                napping = time.monotonic() - started > _NAP_AFTER_S

    def _check_peers(self, step: int, waited: float) -> None:
        """Raise if a late rank's process is gone (a crashed rank never arrives) or the
        wait has lasted the job's collective timeout (``ARRIVAL_TIMEOUT_S`` without one)."""
        late = [r for r in range(self.world) if self.counters[r] < step]
        for r in late:
            pid = int(self._pids[r])
            if pid > 0 and not _process_exists(pid):
                raise RuntimeError(
                    f"shared-memory all-reduce: rank {r} (process {pid}) has "
                    f"exited; step {step} cannot complete"
                )
        limit = collective_timeout_s(os.environ, default=ARRIVAL_TIMEOUT_S)
        if waited > limit:
            raise RuntimeError(
                f"shared-memory all-reduce: rank(s) {late} did not reach "
                f"step {step} within {limit:g} s"
            )


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: it exists
    return True


def _counter_bytes(world: int) -> int:
    return 64 * world


def _segment_bytes(world: int, numel: int) -> int:
    return _counter_bytes(world) + 2 * world * numel * 4


def shared_memory_allreduce(numel: int, ctx: DistContext) -> SharedMemoryAllReduce:
    """Rank 0 creates the segment; every rank maps it; rank 0 then removes its name (the
    memory lives while mapped, so nothing is left behind if a rank dies). Collective:
    every rank returns, or every rank raises."""
    rank, world = ctx.env.rank, ctx.env.world_size
    size = _segment_bytes(world, numel)
    name, error = [""], ""
    if rank == 0:
        try:
            name[0] = str(_create_segment(size))
        except OSError as exc:
            error = f"cannot create a segment of {size} bytes in {SHM_DIR}: {exc}"
    dist.broadcast_object_list(name, src=0)  # "": every rank skips the mapping
    segment = None
    try:
        if name[0]:
            try:
                segment = torch.from_file(name[0], shared=True, size=size, dtype=torch.uint8)
            except Exception as exc:  # another host's /dev/shm: no such file here
                error = f"{type(exc).__name__}: {exc}"
        everyone = _agree(segment is not None, ctx)
    finally:
        if rank == 0 and name[0]:
            Path(name[0]).unlink(missing_ok=True)
    if segment is None or not everyone:
        raise RuntimeError(error or "another rank could not map the segment")
    return SharedMemoryAllReduce(segment, numel, rank, world)


def _create_segment(size: int) -> Path:
    path = SHM_DIR / f"hpcdist-grads-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        # Zeros (every counter at step 0), and the memory taken now: a tmpfs file grown by
        # truncate would get its pages at the first write, and with no memory left that
        # write is SIGBUS in the middle of training.
        os.posix_fallocate(fd, 0, size)
    except OSError:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return path


def _agree(ok: bool, ctx: DistContext) -> bool:
    """Whether ``ok`` holds on every rank (one all-reduce); every rank gets the answer."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


class SymmetricAllReduce:
    """Mean over the ranks of one host by PyTorch's symmetric-memory one-shot all-reduce
    (CUDA tensors)."""

    name = "symmetric memory, one-shot (this host's GPUs)"

    def __init__(self, buffer: torch.Tensor, group_name: str, world: int) -> None:
        self.buffer, self.group_name, self.world = buffer, group_name, world
        ops = torch.ops.symm_mem
        # One kernel that also copies the local gradients in (newer torch), else a copy.
        self._copy_out = getattr(ops, "one_shot_all_reduce_copy_out", None)
        self._out = ops.one_shot_all_reduce_out

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor:
        grads.div_(self.world)  # as DDP's own all-reduce: divide, then sum
        symm = self.buffer[: grads.numel()]
        if self._copy_out is not None:
            self._copy_out(symm, grads, "sum", self.group_name, grads)
        else:
            symm.copy_(grads)
            self._out(symm, "sum", self.group_name, grads)
        return grads


def symmetric_allreduce(numel: int, ctx: DistContext) -> SymmetricAllReduce:
    """The symmetric buffer for ``numel`` gradients, mapped on every GPU. Collective."""
    from torch.distributed import _symmetric_memory as symm_mem

    group = dist.group.WORLD
    assert group is not None
    try:
        buffer: torch.Tensor | None = symm_mem.empty(numel, dtype=torch.float32, device=ctx.device)
        error = ""
    except Exception as exc:
        buffer, error = None, f"{type(exc).__name__}: {exc}"
    if buffer is None or not _agree(buffer is not None, ctx):  # before the exchange
        raise RuntimeError(error or "another rank could not allocate symmetric memory")
    symm_mem.rendezvous(buffer, group)
    return SymmetricAllReduce(buffer, group.group_name, ctx.env.world_size)


def local_allreduce(
    numel: int, ctx: DistContext, planned_steps: int | None = None
) -> tuple[LocalAllReduce | None, str]:
    """The host-local all-reduce for ``numel`` gradient elements, or None and why not.
    With ``planned_steps`` (``auto``), GPUs take it only for a run of at least
    ``SYMMETRIC_MIN_STEPS`` steps. Collective (except with one rank): every rank gets the
    same answer, also where one rank alone cannot take part (its /dev/shm, its GPU)."""
    if ctx.env.world_size < 2:
        return None, "one rank"
    short = planned_steps is not None and planned_steps < SYMMETRIC_MIN_STEPS
    if ctx.device.type == "cuda" and short:  # the same on every rank: no need to agree
        return None, (
            f"auto: {planned_steps:,} steps planned, symmetric memory pays from "
            f"{SYMMETRIC_MIN_STEPS:,}"
        )
    reason = _blocker(ctx, numel)
    if not _agree(reason is None, ctx):
        return None, reason or "not possible on another rank"
    if ctx.device.type == "cuda":
        return _tested(symmetric_allreduce, numel, ctx)
    return _tested(shared_memory_allreduce, numel, ctx)


def _tested(
    make: Callable[[int, DistContext], LocalAllReduce], numel: int, ctx: DistContext
) -> tuple[LocalAllReduce | None, str]:
    """``make(numel, ctx)`` and one test all-reduce with it, or None and why not.
    Collective: where it fails on any rank, every rank keeps the backend's all-reduce."""
    reducer: LocalAllReduce | None = None
    try:
        reducer = make(numel, ctx)
        probe = torch.full((numel,), float(ctx.env.rank + 1), device=ctx.device)
        reducer.reduce_(probe)  # the mean of 1..world on every rank
        expected = (ctx.env.world_size + 1) / 2
        if not torch.allclose(probe, torch.full_like(probe, expected)):
            raise RuntimeError(f"a test all-reduce gave {probe[0].item()}, not {expected}")
        reason = ""
    except Exception as exc:  # not possible here: the backend's all-reduce, on every rank
        reducer, reason = None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    if not _agree(reducer is not None, ctx):
        return None, reason or "not possible on another rank"
    return reducer, ""


def gradient_allreduce(
    mode: str, numel: int, ctx: DistContext, planned_steps: int | None = None
) -> tuple[LocalAllReduce | None, str]:
    """The all-reduce ``training.grad_allreduce`` asks for, or None (the backend's) and why.

    ``local``: the host-local one (``local_allreduce``); ``direct`` (every rank to every
    rank) and ``halving`` (recursive halving and doubling): CPU ranks over TCP on any
    hosts (``crossnode``); ``auto``: the host-local one where every rank is on one host,
    else on CPUs the exchange ``crossnode.choose`` picks from N and the gradients' size.
    Collective."""
    if mode in ("auto", "local"):
        reducer, why = local_allreduce(numel, ctx, planned_steps if mode == "auto" else None)
        if reducer is not None or mode == "local" or why != _SEVERAL_HOSTS:
            return reducer, why
    if ctx.device.type != "cpu":
        return None, f"the {mode} exchange is for CPU ranks, not {ctx.device.type}"
    chosen, why = crossnode.choose(mode, ctx.env.world_size, 4 * numel)
    if chosen == "backend":
        return None, why
    return _tested(crossnode.MAKERS[chosen], numel, ctx)


_SEVERAL_HOSTS = "ranks on several hosts"


def _blocker(ctx: DistContext, numel: int) -> str | None:
    """Why this rank cannot take part (None: it can); the ranks then agree."""
    if 4 * numel > MAX_BYTES:
        return (
            f"{4 * numel / 2**20:.0f} MiB of gradients, more than the "
            f"{MAX_BYTES // 2**20} MiB where sharing memory pays"
        )
    if ctx.env.local_world_size != ctx.env.world_size:
        return _SEVERAL_HOSTS
    if ctx.device.type == "cuda":
        if ctx.backend != "nccl":
            return f"backend {ctx.backend!r} on GPUs"
        if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out"):
            return f"torch {torch.__version__} has no symmetric-memory all-reduce"
    elif platform.machine() not in ("x86_64", "AMD64"):
        return f"{platform.machine()}: the shared-memory all-reduce relies on x86-64 store order"
    elif not SHM_DIR.is_dir():
        return f"no {SHM_DIR}"
    else:
        stat = os.statvfs(SHM_DIR)
        if stat.f_bavail * stat.f_frsize < 4 * _segment_bytes(ctx.env.world_size, numel):
            return f"too little free space in {SHM_DIR}"
    return None
