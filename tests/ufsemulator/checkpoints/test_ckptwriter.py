"""The background checkpoint writer keeps what a checkpoint holds and where it is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from ufsemulator.checkpoints.checkpoint import load_checkpoint
from ufsemulator.checkpoints.ckptwriter import CheckpointWriter, snapshot, write_all


def test_a_snapshot_does_not_follow_the_live_weights() -> None:
    weight = torch.zeros(3)
    state = {"model": {"w": weight}, "history": {"loss": [1.0]}, "epoch": 2}
    snap = snapshot(state)
    weight.add_(1.0)
    state["history"]["loss"].append(0.5)
    assert torch.equal(snap["model"]["w"], torch.zeros(3))
    assert snap["history"]["loss"] == [1.0] and snap["epoch"] == 2


def test_best_model_is_another_name_that_survives_the_next_checkpoint(tmp_path: Path) -> None:
    ckpt, best = tmp_path / "checkpoint.pt", tmp_path / "best_model.pt"
    write_all({"epoch": 1}, [ckpt, best])
    assert os.path.samefile(ckpt, best)
    write_all({"epoch": 2}, [ckpt])
    assert torch.load(ckpt, weights_only=True)["epoch"] == 2
    assert torch.load(best, weights_only=True)["epoch"] == 1
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_the_writer_writes_in_order_and_wait_raises_its_error(tmp_path: Path) -> None:
    writer = CheckpointWriter()
    weight = torch.zeros(2)
    state = {"model": {"w": weight}, "model_config": {}, "epoch": 1, "config": {}}
    writer.submit(state, [tmp_path / "checkpoint.pt"])
    weight.add_(5.0)  # the live weights move on while the file is written
    writer.submit({**state, "epoch": 2}, [tmp_path / "best_model.pt"])
    writer.close()
    assert torch.equal(load_checkpoint(tmp_path / "checkpoint.pt")["model"]["w"], torch.zeros(2))
    assert load_checkpoint(tmp_path / "best_model.pt")["epoch"] == 2
    (tmp_path / "sub").write_text("a file, not a folder")
    writer.submit(state, [tmp_path / "sub" / "checkpoint.pt"])
    with pytest.raises(OSError):
        writer.wait()
    writer.close()


def test_a_newer_state_replaces_one_not_yet_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from ufsemulator.checkpoints import ckptwriter

    started, release, written = threading.Event(), threading.Event(), []

    def slow_write(
        state: dict[str, object], paths: list[Path], digests: object = None, anchor: object = None
    ) -> None:
        started.set()
        release.wait(10)  # the disk is slower than the epochs
        written.append((state["epoch"], [p.name for p in paths]))

    monkeypatch.setattr(ckptwriter, "write_all", slow_write)
    writer = CheckpointWriter()
    ckpt, best = tmp_path / "checkpoint.pt", tmp_path / "best_model.pt"
    writer.submit({"epoch": 1}, [ckpt, best])
    assert started.wait(10)  # being written
    writer.submit({"epoch": 2}, [ckpt, best])  # waits ...
    writer.submit({"epoch": 3}, [ckpt])  # ... and loses checkpoint.pt to this one
    release.set()
    writer.close()
    assert written == [
        (1, ["checkpoint.pt", "best_model.pt"]),
        (2, ["best_model.pt"]),
        (3, ["checkpoint.pt"]),
    ]
    assert writer.superseded == 1


def test_every_write_is_timed_and_reported_with_its_state(tmp_path: Path) -> None:
    reported: list[tuple[int, float]] = []
    writer = CheckpointWriter(
        on_written=lambda state, seconds: reported.append((state["epoch"], seconds)),
        delay_s=0.2,
    )
    state = {"model": {"w": torch.zeros(2)}, "model_config": {}, "epoch": 3, "config": {}}
    assert writer.last_seconds is None  # nothing written yet
    writer.submit(state, [tmp_path / "checkpoint.pt"])
    writer.close()
    assert [epoch for epoch, _ in reported] == [3]
    assert reported[0][1] >= 0.2 and writer.last_seconds == reported[0][1]
