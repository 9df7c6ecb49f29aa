"""The training state: what a checkpoint file holds, as types.

``TrainingState.to_dict`` is the file's layout and ``TrainingState.from_dict`` its only
reader, so the format is written down in one place (docs/CONTRACTS.md lists the same
keys; a test compares the two). The dict holds tensors, numbers, strings, lists and
dicts only, so ``torch.load(weights_only=True)`` reads it without unpickling objects.

``RunProgress`` is where a run stands at a step boundary: the counters, the early-stopping
state and the per-epoch history. ``Loop`` keeps one and replaces it at every epoch end and
stop; its fields are stored flat in the file beside the weights.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ufsemulator.checkpoints.checkpoint import load_checkpoint, load_checkpoint_bytes
from ufsemulator.config import Config
from ufsemulator.errors import CheckpointError
from ufsemulator.model.emulator import ModelConfig

# Per-epoch records, one value per finished epoch.
HISTORY_KEYS = ("train_loss", "val_loss", "val_r2", "epoch_time_s", "train_time_s", "samples")

History = Mapping[str, tuple[float, ...]]


def _empty_history() -> History:
    return {key: () for key in HISTORY_KEYS}


@dataclass(frozen=True)
class EpochRecord:
    """One finished epoch, as the loop measured it (all ranks together)."""

    step: int  # optimiser steps done at the epoch's end, all epochs
    train_loss: float
    val_loss: float
    val_r2: float
    epoch_time_s: float  # the whole epoch: steps, validation, checkpoint hand-off
    train_time_s: float  # the steps alone (the device synchronised)
    samples: float  # training rows of the epoch, all ranks


@dataclass(frozen=True)
class RunProgress:
    """Where a run stands; a stop mid-epoch keeps that epoch's partial sums and times so a
    resumed run reports the same epoch as an uninterrupted one."""

    epoch: int = 0  # completed epochs
    step: int = 0  # optimiser steps, all epochs
    step_in_epoch: int = 0  # steps done in the epoch in progress
    partial: tuple[float, float] = (0.0, 0.0)  # that epoch's training loss sum and rows
    partial_time: tuple[float, float] = (0.0, 0.0)  # its epoch and training seconds so far
    best_val: float = math.inf  # best validation loss (inf: no epoch finished)
    best_epoch: int = 0  # 1-based; 0: no epoch finished
    bad_epochs: int = 0  # epochs since the best one
    history: History = field(default_factory=_empty_history)

    def stopped_at(
        self, step: int, step_in_epoch: int, partial: Sequence[float], elapsed_s: float
    ) -> RunProgress:
        """The state of a run stopped at a step boundary inside an epoch."""
        epoch_s, train_s = self.partial_time
        return dataclasses.replace(
            self,
            step=step,
            step_in_epoch=step_in_epoch,
            partial=(float(partial[0]), float(partial[1])),
            partial_time=(epoch_s + elapsed_s, train_s + elapsed_s),
        )

    def after_epoch(self, record: EpochRecord) -> RunProgress:
        """The state after ``record``'s epoch; a lower validation loss is the new best
        (NaN never is)."""
        epoch = self.epoch + 1
        improved = record.val_loss < self.best_val
        values = {key: getattr(record, key) for key in HISTORY_KEYS}
        return RunProgress(
            epoch=epoch,
            step=record.step,
            best_val=record.val_loss if improved else self.best_val,
            best_epoch=epoch if improved else self.best_epoch,
            bad_epochs=0 if improved else self.bad_epochs + 1,
            history={key: (*self.history[key], values[key]) for key in HISTORY_KEYS},
        )

    @property
    def improved(self) -> bool:
        """Whether the last finished epoch is the best so far."""
        return self.epoch > 0 and self.best_epoch == self.epoch


@dataclass(frozen=True, eq=False)
class TrainingState:
    """Everything a resumed run needs to go on bitwise as if never stopped."""

    model: dict[str, Any]  # tensors: full (unsharded) weights and normalisation buffers
    model_config: ModelConfig
    optimizer: dict[str, Any]  # full (unsharded) optimiser state_dict
    config: Config  # the run's configuration
    rng: dict[str, Any]  # torch, numpy and Python RNG states (checkpoint.capture_rng)
    world_size: int  # ranks that wrote it; another world size resumes with other shards
    progress: RunProgress

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint file's dict: the fields above, ``progress`` flattened into them."""
        progress = self.progress
        return {
            "model": self.model,
            "model_config": self.model_config.to_dict(),
            "optimizer": self.optimizer,
            "config": self.config.to_dict(),
            "rng": self.rng,
            "world_size": self.world_size,
            "epoch": progress.epoch,
            "step": progress.step,
            "step_in_epoch": progress.step_in_epoch,
            "partial": list(progress.partial),
            "partial_time": list(progress.partial_time),
            "best_val": progress.best_val,
            "best_epoch": progress.best_epoch,
            "bad_epochs": progress.bad_epochs,
            "history": {key: list(values) for key, values in progress.history.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | Path) -> TrainingState:
        """Read what ``to_dict`` wrote; anything else is a ``CheckpointError`` naming
        ``source`` in one line."""
        missing = [key for key in checkpoint_keys() if key not in data]
        if missing:
            raise CheckpointError(
                f"checkpoint '{source}' lacks {', '.join(missing)}: not written by this "
                f"version of ufsemulator (expected keys: {', '.join(checkpoint_keys())})"
            )
        try:
            progress = RunProgress(
                epoch=int(data["epoch"]),
                step=int(data["step"]),
                step_in_epoch=int(data["step_in_epoch"]),
                partial=_pair(data["partial"]),
                partial_time=_pair(data["partial_time"]),
                best_val=float(data["best_val"]),
                best_epoch=int(data["best_epoch"]),
                bad_epochs=int(data["bad_epochs"]),
                history={
                    key: tuple(float(v) for v in data["history"][key]) for key in HISTORY_KEYS
                },
            )
            return cls(
                model=dict(data["model"]),
                model_config=ModelConfig.from_dict(data["model_config"]),
                optimizer=dict(data["optimizer"]),
                config=Config.from_dict(data["config"]),
                rng=dict(data["rng"]),
                world_size=int(data["world_size"]),
                progress=progress,
            )
        except (KeyError, TypeError, ValueError) as exc:  # ConfigError is a ValueError
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
            raise CheckpointError(
                f"checkpoint '{source}' is not a training state: {reason}"
            ) from exc


def _pair(value: Any) -> tuple[float, float]:
    # Also a float64 tensor of two values: how older files stored ``partial``.
    first, second = (float(v) for v in value)
    return first, second


def checkpoint_keys() -> tuple[str, ...]:
    """The checkpoint file's keys, in the order ``to_dict`` writes them."""
    own = [f.name for f in dataclasses.fields(TrainingState) if f.name != "progress"]
    return (*own, *(f.name for f in dataclasses.fields(RunProgress)))


def read_state(path: str | Path) -> TrainingState:
    """The training state in the checkpoint file ``path`` (on the CPU)."""
    return TrainingState.from_dict(load_checkpoint(path), path)


def state_from_bytes(data: bytes, path: str | Path) -> TrainingState:
    """The training state in a checkpoint's bytes (those that were checked and hashed)."""
    return TrainingState.from_dict(load_checkpoint_bytes(data, path), path)
