"""The training state: the checkpoint format, its document, the run summary."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from ufsemulator.checkpoints.checkpoint import capture_rng, save_checkpoint
from ufsemulator.checkpoints.state import (
    HISTORY_KEYS,
    EpochRecord,
    RunProgress,
    TrainingState,
    checkpoint_keys,
    read_state,
)
from ufsemulator.config import load_config
from ufsemulator.errors import CheckpointError
from ufsemulator.model.emulator import ModelConfig
from ufsemulator.training.summary import RunSummary

CONTRACTS = Path(__file__).resolve().parents[3] / "docs" / "CONTRACTS.md"


def _documented_rows() -> dict[str, str]:
    """key -> 'what' column of the checkpoint table in docs/CONTRACTS.md, in order."""
    text = CONTRACTS.read_text()
    section = text.split("## Checkpoint files", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|[^|]*\| (.*) \|$", section, flags=re.MULTILINE)
    return dict(rows)


def test_contract_document_lists_the_checkpoint_keys_in_order() -> None:
    assert list(_documented_rows()) == list(checkpoint_keys())


def test_contract_document_lists_the_history_keys() -> None:
    history = _documented_rows()["history"]
    assert tuple(re.findall(r"`(\w+)`", history)) == HISTORY_KEYS


def record(val_loss: float, step: int = 4) -> EpochRecord:
    return EpochRecord(
        step=step,
        train_loss=0.5,
        val_loss=val_loss,
        val_r2=0.9,
        epoch_time_s=2.0,
        train_time_s=1.5,
        samples=100.0,
    )


def state(progress: RunProgress) -> TrainingState:
    return TrainingState(
        model={"w": torch.arange(6.0).reshape(2, 3)},
        model_config=ModelConfig(hidden=(8,)),
        optimizer={"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        config=load_config(None),
        rng=capture_rng(),
        world_size=4,
        progress=progress,
    )


def test_state_round_trips_through_a_checkpoint_file(tmp_path: Path) -> None:
    progress = RunProgress().after_epoch(record(0.25)).stopped_at(7, 3, [12.5, 300.0], 0.75)
    path = save_checkpoint(state(progress).to_dict(), tmp_path / "checkpoint.pt")
    read = read_state(path)
    assert read.progress == progress
    assert (read.progress.step, read.progress.step_in_epoch, read.progress.partial) == (
        7,
        3,
        (12.5, 300.0),
    )
    assert torch.equal(read.model["w"], torch.arange(6.0).reshape(2, 3))
    assert read.model_config == ModelConfig(hidden=(8,))
    assert read.config == load_config(None)
    assert (read.world_size, read.optimizer["param_groups"][0]["lr"]) == (4, 1e-3)
    assert list(torch.load(path, weights_only=True)) == list(checkpoint_keys())


def test_a_checkpoint_without_the_run_state_is_refused_in_one_line(tmp_path: Path) -> None:
    data = state(RunProgress()).to_dict()
    del data["partial_time"], data["bad_epochs"]
    path = save_checkpoint(data, tmp_path / "old.pt")
    with pytest.raises(CheckpointError) as info:
        read_state(path)
    message = str(info.value)
    assert "old.pt" in message and "partial_time, bad_epochs" in message
    assert "\n" not in message


def test_a_checkpoint_with_a_bad_value_is_refused_naming_the_file(tmp_path: Path) -> None:
    data = state(RunProgress()).to_dict()
    data["partial"] = [1.0, 2.0, 3.0]
    with pytest.raises(CheckpointError, match=r"'x\.pt' is not a training state"):
        TrainingState.from_dict(data, "x.pt")


def test_partial_sums_stored_as_a_tensor_still_load() -> None:
    data = state(RunProgress()).to_dict()
    data["partial"] = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert TrainingState.from_dict(data, "x.pt").progress.partial == (3.0, 4.0)


@pytest.mark.parametrize(
    ("losses", "best", "best_epoch", "bad"),
    [
        ([0.5, 0.4, 0.3], 0.3, 3, 0),
        ([0.5, 0.6, 0.7], 0.5, 1, 2),
        ([0.5, 0.5], 0.5, 1, 1),  # equal is no improvement
        ([0.5, math.nan, 0.4], 0.4, 3, 0),  # NaN never is
        ([math.nan], math.inf, 0, 1),
    ],
)
def test_after_epoch_tracks_the_best_epoch(
    losses: list[float], best: float, best_epoch: int, bad: int
) -> None:
    progress = RunProgress()
    for i, loss in enumerate(losses):
        progress = progress.after_epoch(record(loss, step=4 * (i + 1)))
    assert (progress.best_val, progress.best_epoch, progress.bad_epochs) == (best, best_epoch, bad)
    assert (progress.epoch, progress.step, progress.step_in_epoch) == (
        len(losses),
        4 * len(losses),
        0,
    )
    assert progress.improved == (best_epoch == len(losses))
    assert len(progress.history["val_loss"]) == len(losses)


def test_a_stop_keeps_the_epoch_time_so_far_and_the_epoch_end_clears_it() -> None:
    progress = RunProgress().stopped_at(2, 2, [1.0, 20.0], 0.5).stopped_at(3, 3, [2.0, 30.0], 0.25)
    assert progress.partial_time == (0.75, 0.75) and progress.partial == (2.0, 30.0)
    ended = progress.after_epoch(record(0.1))
    assert (ended.partial, ended.partial_time) == ((0.0, 0.0), (0.0, 0.0))


def summary(progress: RunProgress, status: str = "completed") -> RunSummary:
    return RunSummary(
        status=status,
        progress=progress,
        n_train=100,
        n_val=20,  # type: ignore[arg-type]
        cuda_graph="off",
        grad_allreduce="backend",
    )


def test_summary_of_a_run_without_a_finished_epoch() -> None:
    empty = summary(RunProgress().stopped_at(1, 1, [0.5, 10.0], 0.1), "preempted")
    results = empty.to_json()
    assert (results["epochs_run"], results["samples_per_second"]) == (0, 0.0)
    for key in (
        "final_train_loss",
        "final_val_loss",
        "final_val_r2",
        "best_val_loss",
        "best_val_r2",
    ):
        assert results[key] is None, key
    assert math.isnan(empty.final("val_loss")) and empty.best_val_loss == math.inf


def test_summary_numbers_come_from_the_history() -> None:
    progress = (
        RunProgress()
        .after_epoch(record(0.3))
        .after_epoch(
            EpochRecord(
                step=8,
                train_loss=0.2,
                val_loss=0.4,
                val_r2=0.7,
                epoch_time_s=3.0,
                train_time_s=2.5,
                samples=300.0,
            )
        )
    )
    results = summary(progress).to_json()
    assert results["epochs_run"] == 2 and results["train_time_s"] == 4.0
    assert results["samples_per_second"] == 100.0  # 400 rows in 4 s
    assert results["epoch_samples_per_second"] == [100 / 1.5, 120.0]
    assert (results["best_epoch"], results["best_val_loss"], results["best_val_r2"]) == (
        1,
        0.3,
        0.9,
    )
    assert (results["final_val_loss"], results["final_val_r2"]) == (0.4, 0.7)
    assert results["history"]["val_loss"] == [0.3, 0.4]
