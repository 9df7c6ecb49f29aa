from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ufsemulator.checkpoints.checkpoint import (
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from ufsemulator.errors import CheckpointError

REPO = Path(__file__).resolve().parents[3]


def state(value: float) -> dict[str, object]:
    return {
        "model": {"w": torch.full((4, 4), value)},
        "model_config": {"hidden_sizes": [4]},
        "epoch": int(value),
        "config": {},
        "rng": capture_rng(),
    }


def test_save_then_load_round_trips_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = save_checkpoint(state(3.0), tmp_path / "checkpoint.pt")
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], torch.full((4, 4), 3.0))
    assert loaded["epoch"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_failure_during_write_keeps_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = save_checkpoint(state(1.0), tmp_path / "checkpoint.pt")

    def half_written(obj: object, handle: object) -> None:
        handle.write(b"PK\x03\x04 half a zip")  # type: ignore[attr-defined]
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(state(2.0), path)
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_process_killed_mid_write_keeps_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(state(1.0), path)
    # The new file is fully written but the process dies (os._exit, no cleanup)
    # before the rename: the previous checkpoint must still be the one on disk.
    script = textwrap.dedent(
        f"""
        import os, torch
        from ufsemulator.checkpoints import checkpoint
        def die(fd): os._exit(9)
        checkpoint.os.fsync = die
        checkpoint.save_checkpoint({{"model": {{}}, "model_config": {{}}, "epoch": 2,
                                    "config": {{}}}}, {str(path)!r})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, check=False)
    assert proc.returncode == 9
    assert load_checkpoint(path)["epoch"] == 1


@pytest.mark.parametrize(
    "content",
    [b"", b"not a checkpoint at all", b"PK\x03\x04" + b"\x00" * 64],
    ids=["empty", "garbage", "zip-header"],
)
def test_garbage_file_is_a_checkpoint_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"bad\.pt"):
        load_checkpoint(path)


def test_truncated_file_is_a_checkpoint_error(tmp_path: Path) -> None:
    good = save_checkpoint(state(1.0), tmp_path / "good.pt").read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"truncated\.pt"):
        load_checkpoint(truncated)


def test_missing_file_and_wrong_content_are_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "absent.pt")
    torch.save({"model": {}}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="lacks key"):
        load_checkpoint(tmp_path / "partial.pt")


def test_rng_state_survives_a_checkpoint(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    path = save_checkpoint(state(0.0), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    restore_rng(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_file_with_foreign_objects_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pickled.pt"
    torch.save({"model": {}, "model_config": {}, "epoch": 0, "config": {}, "evil": Path("/")}, path)
    with pytest.raises(CheckpointError, match="objects other than tensors"):
        load_checkpoint(path)


def test_damaged_member_of_a_complete_zip_is_a_checkpoint_error(tmp_path: Path) -> None:
    path = save_checkpoint(state(1.0), tmp_path / "flipped.pt")
    data = bytearray(path.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"flipped\.pt"):
        load_checkpoint(path)


@pytest.mark.slow
def test_sigkill_at_random_moments_of_writing_never_tears_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A real kill -9 while a writer rewrites an 8 MB checkpoint in a loop."""
    path = tmp_path / "checkpoint.pt"
    script = textwrap.dedent(
        f"""
        import sys, torch
        from ufsemulator.checkpoints.checkpoint import save_checkpoint
        weights = torch.arange(2_000_000, dtype=torch.float32)
        epoch = 0
        while True:
            epoch += 1
            save_checkpoint({{"model": {{"w": weights + epoch}}, "model_config": {{}},
                             "epoch": epoch, "config": {{}}}}, {str(path)!r})
            print(epoch, flush=True)
        """
    )
    rng = random.Random(7)
    last = 0
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one checkpoint is complete
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = load_checkpoint(path)
        epoch = loaded["epoch"]
        assert epoch >= 1
        assert torch.equal(loaded["model"]["w"][:3], torch.tensor([0.0, 1.0, 2.0]) + epoch)
        last = epoch
    assert last >= 1
