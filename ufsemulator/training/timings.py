"""Where a training job's time goes, from process start to ``model.pt``.

The steps of a small model are a fraction of what a user waits for: the interpreter and
imports, the process group, reading the data, building the model, validation and
checkpoints between epochs, the export. ``Timings`` holds each part once, for
``training_results.json`` (``timings``) and for the breakdown the job log ends with.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc``, 10 ms resolution); None where
    it cannot be told."""
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        # Field 22 of /proc/self/stat, counted after the command's closing parenthesis
        # (the command itself may hold spaces): clock ticks since boot at its start.
        fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()
        started = int(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    if ticks <= 0:
        return None
    return max(0.0, uptime - started / ticks)


def process_start() -> float:
    """This process's start on the ``time.perf_counter`` clock (now, if unknown)."""
    age = process_age_s()
    return time.perf_counter() - (age if age is not None else 0.0)


@dataclass(frozen=True)
class Timings:
    """Seconds, this rank (rank 0 writes them). ``total_s`` runs from the process start to
    ``model.pt`` on disk; ``startup_s`` from the process start to the first step, made of
    ``imports_s`` (interpreter and imports, until training starts), ``process_group_s``,
    ``data_s`` (read, split, statistics, rows to the device) and ``setup_s`` (model,
    parallel wrapper, optimiser, until the first step begins). Between epochs:
    ``validation_s`` (with the epoch's one all-reduce and host synchronisation) and
    ``checkpoint_s`` (what checkpoints cost the training thread: taking the state and
    waiting for the writer at the end); together with logging they are
    ``outside_steps_s``."""

    total_s: float
    startup_s: float
    imports_s: float
    process_group_s: float
    data_s: float
    setup_s: float
    steps_s: float
    epochs: int
    outside_steps_s: float
    outside_steps_per_epoch_s: float
    validation_s: float
    checkpoint_s: float
    export_s: float

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)

    def breakdown(self) -> str:
        """Lines for the job log: the same numbers as ``to_json``."""
        return (
            f"Time: {self.total_s:.2f} s from process start to model.pt\n"
            f"  start-up to the first step {self.startup_s:.2f} s (imports "
            f"{self.imports_s:.2f}, process group {self.process_group_s:.2f}, data "
            f"{self.data_s:.2f}, set-up {self.setup_s:.2f})\n"
            f"  steps {self.steps_s:.2f} s over {self.epochs} epochs; outside them "
            f"{self.outside_steps_s:.2f} s ({1000 * self.outside_steps_per_epoch_s:.1f} ms "
            f"per epoch: validation {self.validation_s:.2f} s, checkpoints "
            f"{self.checkpoint_s:.2f} s)\n"
            f"  export {self.export_s:.2f} s"
        )
