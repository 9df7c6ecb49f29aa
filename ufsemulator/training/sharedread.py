"""Training on a multi-file data set that no rank reads whole.

Rank ``r`` of ``W`` reads the ``r``-th contiguous block of the files (or, with a time
selection, of the selected records): ``load_dataset(share=(r, W))``. Then, collectively:

1. Each row goes to validation or training by a hash of (seed, file, record in the file,
   grid point), so
   the split is the same whichever rank read the row and however many ranks there are.
2. The training rows, in record order across the ranks, are cut into ``W`` equal blocks
   (the remainder of fewer than ``W`` rows is left out) and moved to their ranks by one
   all-to-all on the device: every rank runs the same number of steps.
3. The normalisation statistics come from all-reduced sums over all training rows
   (float64, on the device), as for a single file.

The rows then live on the device only; the host keeps nothing of them (``read_share``'s
caller drops the arrays it read). Validation rows stay with the rank that read them.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from hpcdist.distributed import DistContext
from ufsemulator.config import Config
from ufsemulator.data.read import Dataset
from ufsemulator.errors import DataError
from ufsemulator.model.emulator import EmulatorMLP
from ufsemulator.model.normalization import MIN_STD, Stats, input_range
from ufsemulator.training.loop import Shards
from ufsemulator.training.parallel import grouped

_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 20  # rows per float64 pass of the statistics


def validation_rows(
    file: npt.NDArray[np.int64],
    record: npt.NDArray[np.int64],
    index: npt.NDArray[np.int64],
    seed: int,
    fraction: float,
) -> npt.NDArray[np.bool_]:
    """Which rows are validation rows: a seeded hash (splitmix64) of each row's file,
    record in that file and grid point, uniform in [0, 1), below ``fraction``. Pure: any
    rank, any world size, whichever files a rank read."""
    with np.errstate(over="ignore"):
        seeded = np.uint64((seed * 0x9E3779B97F4A7C15) & _MASK64)
        z = file.astype(np.uint64)  # the one new array: every later pass is in place
        z <<= np.uint64(24)
        z += record.astype(np.uint64, copy=False)
        z += seeded
        _splitmix(z)
        z ^= index.astype(np.uint64, copy=False)
        _splitmix(z)
    return z < np.uint64(_hash_below(fraction)) if fraction < 1 else np.ones(z.shape, bool)


def _hash_below(fraction: float) -> int:
    """The bound of the hash for ``(z >> 11) / 2**53 < fraction``, in integers: the
    division by a power of two is exact, so that holds iff ``z >> 11 < ceil(fraction *
    2**53)``, iff ``z < ceil(fraction * 2**53) << 11`` (below 2**64 for fraction < 1)."""
    return math.ceil(max(fraction, 0.0) * float(1 << 53)) << 11


def _splitmix(z: npt.NDArray[np.uint64]) -> None:
    """splitmix64's finaliser, in place (callers silence numpy's overflow warnings: it
    wraps)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)


def block_moves(counts: list[int], rank: int) -> tuple[list[int], list[int], int]:
    """(rows this rank sends to each rank, rows it receives from each, rows per rank) when
    the rows, rank 0's first, are cut into ``len(counts)`` equal blocks. Pure."""
    world = len(counts)
    per = sum(counts) // world
    starts = [sum(counts[:i]) for i in range(world)]

    def overlap(a0: int, a1: int, b0: int, b1: int) -> int:
        return max(0, min(a1, b1) - max(a0, b0))

    mine = (starts[rank], starts[rank] + counts[rank])
    send = [overlap(*mine, j * per, (j + 1) * per) for j in range(world)]
    receive = [
        overlap(starts[i], starts[i] + counts[i], rank * per, (rank + 1) * per)
        for i in range(world)
    ]
    return send, receive, per


@dataclass
class SplitTimes:
    """Seconds of each stage of ``split_share`` on one rank, in order (CUDA work waited
    for at the end of each stage, so a stage holds its own device time)."""

    device: float = 0.0  # the first device op: CUDA's context where none exists yet
    hash: float = 0.0  # validation_rows on the host
    rows: float = 0.0  # the rows gathered and moved to the device
    wait: float = 0.0  # the first collective: waits for the slowest reader
    exchange: float = 0.0  # the all-to-all of the training rows
    statistics: float = 0.0  # statistics, input range and normalised shards

    def describe(self, rank: int) -> str:
        stages = ", ".join(f"{f.name} {getattr(self, f.name):.3f}" for f in fields(self))
        total = sum(getattr(self, f.name) for f in fields(self))
        return f"[Rank {rank}] Split {total:.2f} s: {stages}"


class _Stopwatch:
    def __init__(self, times: SplitTimes, device: torch.device) -> None:
        self.times, self.device = times, device
        self.last = time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        setattr(self.times, stage, getattr(self.times, stage) + now - self.last)
        self.last = now


def split_share(
    ctx: DistContext,
    config: Config,
    dataset: Dataset,
    model: EmulatorMLP,
    times: SplitTimes | None = None,
) -> Shards:
    """This rank's share of a data set read in shares: its equal block of the training
    rows and the validation rows it read, normalised, on ``ctx.device``; the statistics
    set on ``model``; how long each stage took in ``times``. Collective."""
    device, world = ctx.device, ctx.env.world_size
    watch = _Stopwatch(times if times is not None else SplitTimes(), device)
    counts = torch.zeros(2 * world, dtype=torch.int64, device=device)
    watch.lap("device")
    is_val = validation_rows(
        dataset.file,
        dataset.record,
        dataset.index,
        config.training.seed,
        config.training.val_fraction,
    )
    watch.lap("hash")
    n_in = dataset.inputs.shape[1]
    gather = host_rows if device.type == "cpu" else device_rows
    train_rows, val_rows = gather(dataset, is_val, device)
    watch.lap("rows")
    counts[ctx.env.rank] = train_rows.shape[0]
    counts[world + ctx.env.rank] = val_rows.shape[0]
    _sum(counts)
    listed = counts.tolist()
    train_counts, val_counts = listed[:world], listed[world:]
    watch.lap("wait")
    n_val = sum(val_counts)
    _check_enough(sum(train_counts), n_val, world)
    send, receive, per = block_moves(train_counts, ctx.env.rank)
    local = train_rows[: sum(send)]
    del train_rows
    if grouped():
        mine = local.new_empty((sum(receive), n_in + 1))
        dist.all_to_all_single(mine, local, receive, send)
    else:
        mine = local
    del local
    watch.lap("exchange")
    stats = _stats(mine, n_in, _sum)
    model.set_normalization(stats)
    model.set_input_range(*input_range(mine[:, :n_in], grouped()))
    shards = Shards(
        x_train=_normalise(mine[:, :n_in], stats.input_mean, stats.input_std),
        y_train=_normalise(mine[:, n_in:], stats.output_mean, stats.output_std),
        x_val=_normalise(val_rows[:, :n_in], stats.input_mean, stats.input_std),
        y_val=_normalise(val_rows[:, n_in:], stats.output_mean, stats.output_std),
        n_train=per * world,
        n_val=n_val,
    )
    watch.lap("statistics")
    return shards


def _check_enough(n_train: int, n_val: int, world: int) -> None:
    if n_train < world or n_val < 1:
        raise DataError(
            f"{n_train} training and {n_val} validation rows cannot be shared by "
            f"{world} ranks; use more data (more records, thin: 1) or fewer ranks"
        )


Rows = tuple[torch.Tensor, torch.Tensor]


def host_rows(dataset: Dataset, is_val: npt.NDArray[np.bool_], device: torch.device) -> Rows:
    """(training rows, validation rows), inputs and target side by side ``[n, n_in + 1]``,
    gathered on the host (numpy's gather of rows is about twice as fast as torch's on one
    CPU thread): for a CPU device, where they stay."""
    return (
        torch.from_numpy(_gathered(dataset, ~is_val)).to(device),
        torch.from_numpy(_gathered(dataset, is_val)).to(device),
    )


def device_rows(dataset: Dataset, is_val: npt.NDArray[np.bool_], device: torch.device) -> Rows:
    """As ``host_rows``, gathered on the device: the host only copies the arrays it read,
    whole (no host pass per row, no pages of new host arrays to fault in)."""
    rows = torch.cat(
        [
            torch.from_numpy(dataset.inputs).to(device),
            torch.from_numpy(dataset.targets[:, :1]).to(device),
        ],
        dim=1,
    )
    val = torch.from_numpy(is_val).to(device)
    return rows[~val], rows[val]


def _gathered(dataset: Dataset, selected: npt.NDArray[np.bool_]) -> npt.NDArray[np.float32]:
    """Inputs and target side by side ``[n, n_in + 1]``: one array to move, one copy."""
    index = np.flatnonzero(selected)
    n_in = dataset.inputs.shape[1]
    rows = np.empty((index.size, n_in + 1), dtype=np.float32)
    np.take(dataset.inputs, index, axis=0, out=rows[:, :n_in])
    rows[:, n_in] = dataset.targets[index, 0]
    return rows


def _sum(tensor: torch.Tensor) -> None:
    if grouped():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)


def _stats(rows: torch.Tensor, n_in: int, reduce: Callable[[torch.Tensor], None]) -> Stats:
    """Mean and population std of every column over all ranks' rows (float64 sums, in
    chunks, so no float64 copy of the whole shard is made)."""
    width = rows.shape[1]
    head = torch.zeros(width + 1, dtype=torch.float64, device=rows.device)
    head[0] = rows.shape[0]
    for chunk in rows.split(_CHUNK):
        head[1:] += chunk.sum(0, dtype=torch.float64)
    reduce(head)
    count = head[0]
    mean = head[1:] / count
    squares = torch.zeros(width, dtype=torch.float64, device=rows.device)
    for chunk in rows.split(_CHUNK):
        deviation = chunk.double()
        deviation -= mean
        squares += deviation.square_().sum(0)
    reduce(squares)
    std = torch.sqrt(squares / count)
    std = torch.where(std <= MIN_STD, torch.ones_like(std), std)
    mean_np, std_np = mean.cpu().numpy(), std.cpu().numpy()
    return Stats(
        input_mean=mean_np[:n_in],
        input_std=std_np[:n_in],
        output_mean=mean_np[n_in:],
        output_std=std_np[n_in:],
    )


def _normalise(values: torch.Tensor, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """As the model's float32 buffers normalise: (x - mean) / std."""
    m = torch.as_tensor(mean, dtype=torch.float32, device=values.device)
    s = torch.as_tensor(std, dtype=torch.float32, device=values.device)
    return ((values - m) / s).contiguous()


def peak_host_memory_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def host_memory_bytes() -> int:
    """This process's resident memory now (Linux; 0 where it cannot be told)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def describe_read(dataset: Dataset, rank: int, seconds: float, before_bytes: int) -> str:
    """The per-rank log line: what it read, how much, how fast, and the host memory it
    took (the peak above what the process held before reading: torch and CUDA alone
    hold over a GB)."""
    mb = dataset.bytes_read / 1e6
    speed = mb / seconds if seconds > 0 else math.inf
    peak = peak_host_memory_bytes()
    return (
        f"[Rank {rank}] Read {dataset.records_text()}: {len(dataset)} rows, {mb:.0f} MB in "
        f"{seconds:.2f} s ({speed:.0f} MB/s), {dataset.inputs.nbytes / 1e6:.0f} MB of rows; "
        f"peak host memory {peak / 1e6:.0f} MB, {(peak - before_bytes) / 1e6:.0f} MB above "
        "the start of reading"
    )
