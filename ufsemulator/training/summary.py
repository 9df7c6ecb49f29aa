"""What a finished (or stopped) run reports: computed once from its ``RunProgress``.

``Loop.run`` returns a ``RunSummary``; ``train`` builds its ``TrainResult`` and rank 0's
``training_results.json`` from that one object, so the two cannot disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ufsemulator.checkpoints.state import RunProgress
from ufsemulator.training.timings import Timings

Status = Literal["completed", "early_stopped", "preempted"]


@dataclass
class LoopTimes:
    """What the loop adds up as it runs (mutable for that reason), for ``Timings``."""

    first_step_at: float | None = None  # time.perf_counter() when the first step began
    validation_s: float = 0.0  # epoch ends: validation, the all-reduce, the host sync
    checkpoint_s: float = 0.0  # taking the state, handing it over, the final wait


@dataclass(frozen=True)
class RunSummary:
    status: Status
    progress: RunProgress  # counters and the per-epoch history
    n_train: int  # training rows, all ranks
    n_val: int
    cuda_graph: str  # how the steps ran (Loop.cuda_graph_status)
    grad_allreduce: str  # which gradient all-reduce (Loop.grad_allreduce_status)
    loop_times: LoopTimes | None = None
    timings: Timings | None = None  # the whole job's, once train() has them

    @property
    def outside_steps_s(self) -> float:
        """Epoch time spent outside the steps (validation, checkpoints, logging)."""
        history = self.progress.history
        return sum(
            e - t for e, t in zip(history["epoch_time_s"], history["train_time_s"], strict=True)
        )

    @property
    def epochs_run(self) -> int:
        return len(self.progress.history["train_loss"])

    @property
    def best_epoch(self) -> int:  # 1-based; 0 if no epoch finished
        return self.progress.best_epoch

    @property
    def best_val_loss(self) -> float:  # inf if no epoch finished
        return self.progress.best_val

    @property
    def train_time_s(self) -> float:  # the steps of all epochs
        return sum(self.progress.history["train_time_s"])

    @property
    def samples_per_second(self) -> float:
        """Training rows per second of step time, all ranks together."""
        seconds = self.train_time_s
        return sum(self.progress.history["samples"]) / seconds if seconds else 0.0

    def final(self, key: str) -> float:
        """The last epoch's value of the history ``key``; NaN if no epoch finished."""
        values = self.progress.history[key]
        return values[-1] if values else math.nan

    @property
    def best_val_r2(self) -> float:  # NaN if no epoch finished
        best = self.progress.best_epoch
        return self.progress.history["val_r2"][best - 1] if best else math.nan

    def to_json(self) -> dict[str, Any]:
        """The run's part of ``training_results.json``; what no epoch measured is null."""
        history = self.progress.history
        ran = self.epochs_run > 0
        return {
            "status": self.status,
            "cuda_graph": self.cuda_graph,
            "grad_allreduce": self.grad_allreduce,
            "epochs_run": self.epochs_run,
            "n_train": self.n_train,
            "n_val": self.n_val,
            "epoch_times_s": list(history["epoch_time_s"]),
            "samples_per_second": self.samples_per_second,
            "epoch_samples_per_second": [
                s / t if t else 0.0
                for s, t in zip(history["samples"], history["train_time_s"], strict=True)
            ],
            "train_time_s": self.train_time_s,
            "final_train_loss": self.final("train_loss") if ran else None,
            "final_val_loss": self.final("val_loss") if ran else None,
            "final_val_r2": self.final("val_r2") if ran else None,
            "best_epoch": self.best_epoch,
            "best_val_loss": self.best_val_loss if ran else None,
            "best_val_r2": self.best_val_r2 if self.best_epoch else None,
            "history": {key: list(history[key]) for key in ("train_loss", "val_loss", "val_r2")},
            "timings": self.timings.to_json() if self.timings is not None else None,
        }
