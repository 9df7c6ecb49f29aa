"""Rank 0's checkpoint times and its stop before SLURM's kill.

Every checkpoint write is timed; the last time goes to the run folder
(``checkpoint_timing.json``), where the run's next piece and ``hpcdist render``/``submit``
read it. While the loop runs, ``hpcdist.distributed.warnlead`` watches the job's end: where
the warning lead is shorter than a checkpoint needs, it sets the stop flag itself, in time.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpcdist.distributed import (
    CheckpointTiming,
    last_checkpoint_time,
    record_checkpoint_time,
    watch_job_end,
)
from hpcdist.state import default_book
from ufsemulator.checkpoints.ckptwriter import CheckpointWriter


def timed_writer(run_dir: Path, anchor: Path, delay_s: float = 0.0) -> CheckpointWriter:
    """Rank 0's checkpoint writer, which records what each write took in ``run_dir``."""

    def written(state: dict[str, Any], seconds: float) -> None:
        timing = CheckpointTiming(seconds, time.time(), int(state.get("epoch", 0)))
        try:
            record_checkpoint_time(run_dir, timing)
        except (OSError, ValueError) as exc:  # the checkpoint itself is on disk
            print(f"Warning: checkpoint time not recorded: {exc}", flush=True)

    return CheckpointWriter(default_book(), anchor, on_written=written, delay_s=delay_s)


@contextlib.contextmanager
def stop_before_the_end(
    writer: CheckpointWriter | None, stop: Callable[[], None], run_dir: Path
) -> Iterator[None]:
    """While the loop runs (rank 0: ``writer`` given), stop early where SLURM's warning
    would leave too little time for a checkpoint (measured here, else by the run's last
    piece)."""
    if writer is None:
        yield
        return
    recorded = last_checkpoint_time(run_dir)

    def measure() -> float | None:
        seconds = writer.last_seconds
        return recorded.seconds if seconds is None and recorded is not None else seconds

    watcher = watch_job_end(os.environ, measure, stop)
    try:
        yield
    finally:
        if watcher is not None:
            watcher.close()
