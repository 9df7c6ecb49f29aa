"""Checkpoint files: atomic writes, safe loads, RNG state as plain tensors.

A checkpoint is a dict of tensors and primitives only, so ``torch.load(weights_only=True)``
reads it without unpickling arbitrary objects. This module moves such dicts to and from
disk; what the dict holds is ``ufsemulator.checkpoints.state.TrainingState`` (its ``to_dict`` and
``from_dict``), listed in docs/CONTRACTS.md.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdist.state.digests import DigestBook, sha256_file
from hpcdist.state.fileutil import umask_mode
from ufsemulator.errors import CheckpointError

REQUIRED_KEYS = ("model", "model_config", "epoch", "config")


def save_checkpoint(
    state: Mapping[str, Any], path: str | Path, digests: DigestBook | None = None
) -> Path:
    """Write ``state`` to ``path`` so that a crash at any moment leaves either the old
    file or the new one, never a torn one: temp file in the same directory, fsync,
    ``os.replace`` (atomic on POSIX within one file system), fsync of the directory.

    With ``digests``, the file's SHA-256 is recorded there (around the rename), so that
    auto-resume can tell this file from one another user put in its place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())  # mkstemp's 0600, widened as far as the umask allows
        with os.fdopen(fd, "wb") as handle:
            torch.save(dict(state), handle)
            handle.flush()
            os.fsync(handle.fileno())
        digest = sha256_file(Path(tmp_name)) if digests is not None else ""
        if digests is not None:
            digests.expect(path, digest)
        os.replace(tmp_name, path)
        if digests is not None:
            digests.settle(path, digest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)
    return path


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; some file systems refuse to open a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint on the CPU; any unreadable file is a ``CheckpointError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    if not zipfile.is_zipfile(path):  # also what a truncated file looks like
        raise CheckpointError(
            f"checkpoint '{path}' is truncated or not a checkpoint (no complete torch zip file)"
        )
    try:
        # torch does not check the CRCs it writes: a flipped byte would load as a weight.
        with zipfile.ZipFile(path) as archive:
            bad_member = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"checkpoint '{path}' is damaged ({exc})") from exc
    if bad_member is not None:
        raise CheckpointError(f"checkpoint '{path}' is damaged (CRC mismatch in {bad_member})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"checkpoint '{path}' holds objects other than tensors and plain values; "
            "not written by ufsemulator?"
        ) from exc
    except Exception as exc:  # torch raises RuntimeError, EOFError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint '{path}' is damaged ({reason})") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint '{path}' holds {type(state).__name__}, not a dict")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"checkpoint '{path}' lacks key(s) {', '.join(missing)}")
    return state


def capture_rng() -> dict[str, Any]:
    """torch CPU, numpy and Python RNG states as tensors and primitives."""
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    py_version, py_state, py_gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(np_kind),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_gauss),
        },
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_state, dtype=torch.int64),
            "gauss_next": py_gauss,
        },
    }


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    npy = rng["numpy"]
    np.random.set_state(
        (
            npy["kind"],
            npy["keys"].numpy().astype(np.uint32),
            npy["pos"],
            npy["has_gauss"],
            npy["cached_gaussian"],
        )
    )
    py = rng["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"]))
