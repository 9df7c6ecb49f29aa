"""Checkpoint files: atomic writes, safe loads, RNG state as plain tensors.

A checkpoint is a dict of tensors and primitives only, so ``torch.load(weights_only=True)``
reads it without unpickling arbitrary objects. This module moves such dicts to and from
disk; what the dict holds is ``ufsemulator.checkpoints.state.TrainingState`` (its ``to_dict`` and
``from_dict``), listed in docs/CONTRACTS.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdist.state import (
    DigestBook,
    PrivacyError,
    Refused,
    open_folder,
    open_run_folder,
    pause,
    read_once,
    sha256_bytes,
    umask_mode,
    write_at,
)
from ufsemulator.errors import CheckpointError

REQUIRED_KEYS = ("model", "model_config", "epoch", "config")


def checkpoint_bytes(state: Mapping[str, Any]) -> bytes:
    """A state as the bytes of a checkpoint file: what is hashed is what is written."""
    buffer = io.BytesIO()
    torch.save(dict(state), buffer)
    return buffer.getvalue()


def checkpoint_mode() -> int:
    """What the umask allows, never group- or other-writable: a file others could rewrite
    would not be resumed."""
    return umask_mode() & ~0o022


def save_checkpoint(
    state: Mapping[str, Any],
    path: str | Path,
    digests: DigestBook | None = None,
    anchor: Path | None = None,
) -> Path:
    """Write ``state`` to ``path`` so that a crash at any moment leaves either the old
    file or the new one, never a torn one: temp file in the same directory, fsync,
    rename (atomic on POSIX within one file system), fsync of the directory.

    The folder is opened once, walked to as a run folder is (``anchor`` given: the start
    ``ufsemulator.training.runfiles.run_anchor`` names; ``hpcdist.state.runroot``) or, with
    None, from the folder itself, which must be the user's alone; every folder below is
    checked by what was opened; the temporary file and the
    rename go through that descriptor, so a rename of a folder meanwhile cannot move the
    write elsewhere. With ``digests``, the SHA-256 of the very bytes written is recorded
    there (around the rename), so that auto-resume can tell this file from another."""
    path = Path(os.path.abspath(path))
    write_bytes(checkpoint_bytes(state), [path], digests, anchor)
    return path


def write_bytes(
    data: bytes, paths: list[Path], digests: DigestBook | None = None, anchor: Path | None = None
) -> None:
    """``data`` as every file of ``paths`` (see ``save_checkpoint``); files of one folder
    after the first are further names of it (hard links), where the file system allows."""
    digest = sha256_bytes(data) if digests is not None else ""
    mode = checkpoint_mode()
    first: dict[Path, str] = {}  # folder -> the name written there
    for path in (Path(os.path.abspath(p)) for p in paths):
        folder = path.parent
        if anchor is None:
            folder.mkdir(parents=True, exist_ok=True)
        with _checked_folder(folder, anchor) as fd:
            pause("checkpoint-write")
            if digests is not None:
                digests.expect(path, digest)
            if folder not in first or not _link_at(fd, first[folder], path.name):
                write_at(fd, path.name, data, mode)
                first.setdefault(folder, path.name)
            if digests is not None:
                digests.settle(path, digest)


@contextlib.contextmanager
def _checked_folder(folder: Path, anchor: Path | None) -> Iterator[int]:
    try:
        if anchor is None:  # a folder the caller named: the start, the user's alone
            fd = open_folder(folder, None, "checkpoint folder")
        else:  # a run folder: walked from a root the user trusts (hpcdist.state.runroot)
            fd = open_run_folder(folder, "checkpoint folder")
    except Refused as exc:
        raise PrivacyError(
            f"checkpoint folder {str(exc.path)!r} {exc.problem}; refusing to write the "
            "checkpoint there (was the run folder replaced while the job ran?)"
        ) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def _link_at(dir_fd: int, existing: str, name: str) -> bool:
    tmp = f".{name}.{os.getpid()}.link"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        os.link(existing, tmp, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        return False
    with contextlib.suppress(OSError):
        os.fsync(dir_fd)
    return True


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
    """Load a checkpoint on the CPU, opened and read once; any unreadable file is a
    ``CheckpointError`` naming it."""
    path = Path(path)
    try:
        data = read_once(path).data
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint '{path}' does not exist") from exc
    except OSError as exc:
        raise CheckpointError(f"checkpoint '{path}' cannot be read ({exc})") from exc
    return load_checkpoint_bytes(data, path)


def load_checkpoint_bytes(data: bytes, path: str | Path) -> dict[str, Any]:
    """A checkpoint from its bytes (those that were checked and hashed), on the CPU; ``path``
    only names it in errors."""
    buffer = io.BytesIO(data)
    if not zipfile.is_zipfile(buffer):  # also what a truncated file looks like
        raise CheckpointError(
            f"checkpoint '{path}' is truncated or not a checkpoint (no complete torch zip file)"
        )
    try:
        # torch does not check the CRCs it writes: a flipped byte would load as a weight.
        with zipfile.ZipFile(buffer) as archive:
            bad_member = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"checkpoint '{path}' is damaged ({exc})") from exc
    if bad_member is not None:
        raise CheckpointError(f"checkpoint '{path}' is damaged (CRC mismatch in {bad_member})")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
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
