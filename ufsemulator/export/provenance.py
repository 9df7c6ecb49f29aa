"""Where an exported model came from: code, torch, training data, configuration, metrics.

An export carries this as extra files in ``model.pt`` (``provenance.json`` beside
``signature.json``, see :mod:`ufsemulator.export.signature`) and in ``model.pt2``'s metadata,
and a short model card (``model.md``) is written next to it, so a file found on a DA
system's disk can be traced to the run, the data and the code that made it.

The data's identity is the files' absolute paths, the times of the first and last
records used, each file's SHA-256 (what ``sha256sum FILE`` prints) and one SHA-256 over the
files' sizes and digests in order. A training passes the digests of the bytes its ranks
read, computed while they read them (``ufsemulator.data.onceread``): nothing is read again.
Without them (an identity asked for files alone), every byte is read once more, hashed side
by side on several threads (SHA-256 runs at about 1.4 GB/s on one core; hashlib releases
the interpreter lock).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcdist.state import DigestBook

# 1: TorchScript with names/units/levels attributes only. 2: signature.json and
# provenance.json extra files, input ranges, row_flags, fill_value.
FORMAT_VERSION = 2
_CHUNK = 8 << 20

# The final numbers a model card and provenance.json carry (from RunSummary.to_json()).
METRICS = (
    "status",
    "epochs_run",
    "best_epoch",
    "best_val_loss",
    "best_val_r2",
    "final_train_loss",
    "final_val_loss",
    "final_val_r2",
    "n_train",
    "n_val",
)


def package_version() -> str:
    try:
        return importlib.metadata.version("hpcdist")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def git_commit(where: Path | None = None) -> str | None:
    """The commit of the checkout holding this package (``+dirty`` if it has changes);
    None when it is installed from a wheel or git is missing."""
    folder = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def file_sha256(path: Path) -> str:
    """The SHA-256 of one file's bytes, as ``sha256sum`` prints it."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_sha256(paths: Sequence[Path], workers: int | None = None) -> list[str]:
    """Each file's SHA-256, in order, hashed by up to ``workers`` threads at once (default:
    the CPUs this process may use, at most 8)."""
    if workers is None:
        workers = min(8, len(os.sched_getaffinity(0)))
    if workers <= 1 or len(paths) <= 1:
        return [file_sha256(path) for path in paths]
    with ThreadPoolExecutor(max_workers=min(workers, len(paths))) as pool:
        return list(pool.map(file_sha256, paths))


def content_sha256(
    paths: Sequence[Path],
    digests: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
) -> str:
    """One SHA-256 over each file's size and SHA-256, in order (``digests`` and ``sizes``:
    the files' own, if already known), so moving bytes from one file to the next changes it."""
    digests = files_sha256(paths) if digests is None else digests
    sizes = [path.stat().st_size for path in paths] if sizes is None else sizes
    combined = hashlib.sha256()
    for size, digest in zip(sizes, digests, strict=True):
        combined.update(f"{size} {digest}\n".encode())
    return combined.hexdigest()


def record_times(paths: Sequence[Path], time: int | str = "all") -> tuple[str | None, str | None]:
    """ISO times of the first and last records ``time`` selects over ``paths`` (their
    ``time`` variables, one file after the other); None where a file has no time axis."""
    import netCDF4

    from ufsemulator.data.sources import parse_time

    stamps: list[str | None] = []
    for path in paths:
        with netCDF4.Dataset(path, "r") as ds:
            var = ds.variables.get("time")
            if var is None or var.ndim != 1:
                stamps.append(None)
                continue
            values = var[:]
            units = getattr(var, "units", None)
            if units is None:
                stamps.extend(str(float(v)) for v in values)
                continue
            dates: Any = netCDF4.num2date(values, units, getattr(var, "calendar", "standard"))
            stamps.extend(d.isoformat() for d in dates)
    picked = parse_time(time).pick(len(stamps))
    if not picked:
        return None, None
    return stamps[picked[0]], stamps[picked[-1]]


def data_identity(
    paths: Sequence[Path],
    time: int | str = "all",
    read: Mapping[str, tuple[str, int]] | None = None,
    times: tuple[str | None, str | None] | None = None,
) -> dict[str, Any]:
    """The data's identity. With ``read`` (resolved path -> SHA-256 and size of the bytes
    the training read, hashed while it read them) and ``times``, nothing is read again:
    the record names the files that were read and the bytes that were trained on."""
    absolute = [Path(p).resolve() for p in paths]
    if read is None:
        first, last = record_times(absolute, time)
        digests = files_sha256(absolute)
        sizes = None
    else:
        absolute = [p for p in absolute if str(p) in read]
        first, last = times if times is not None else (None, None)
        digests = [read[str(p)][0] for p in absolute]
        sizes = [read[str(p)][1] for p in absolute]
    return {
        "paths": [str(p) for p in absolute],
        "time_selection": str(time),
        "first_record_time": first,
        "last_record_time": last,
        "sha256": content_sha256(absolute, digests, sizes),
        "files_sha256": digests,
    }


def build(
    config: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    source: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """The provenance record; what is not known (an export of a bare model) is null.
    ``run_id``: the training's id across its requeued and resubmitted jobs."""
    import torch

    return {
        "run_id": run_id,
        "format_version": FORMAT_VERSION,
        "package": "hpcdist (ufsemulator)",
        "package_version": package_version(),
        "git_commit": git_commit(),
        "torch_version": torch.__version__,
        "checkpoint": source,
        "training_data": dict(data) if data is not None else None,
        "metrics": dict(metrics) if metrics is not None else None,
        "config": dict(config) if config is not None else None,
    }


def to_json(record: Mapping[str, Any]) -> str:
    """Strict JSON (a NaN fill value becomes the string "nan"): C++ and jq read it."""
    return json.dumps(finite(record), indent=2)


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float written as a string ("nan", "inf"),
    which the config reads back as the number."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def checkpoint_origin(
    checkpoint: Path, config: Mapping[str, Any] | None, book: DigestBook | None = None
) -> dict[str, Any]:
    """The provenance of an export made later from a run's checkpoint: the checkpoint's
    config, and the data and metrics its run recorded in ``training_results.json`` beside
    it (null where the checkpoint was moved away from its run folder, or where that file is
    not as the training wrote it: its digest is checked in ``book``, default this folder's)."""
    results = _run_results(checkpoint.parent / "training_results.json", book)
    data = results.get("data")
    return build(
        config=config,
        data=data if isinstance(data, Mapping) else None,
        metrics={key: results.get(key) for key in METRICS} if results else None,
        source=str(checkpoint.resolve()),
    )


def _run_results(path: Path, book: DigestBook | None) -> dict[str, Any]:
    """The run's recorded results, read once and checked like every run file (this user's,
    nobody else can write it, the digest its training recorded); {} where there is none or
    it is refused (said on stderr: the export goes on without that record)."""
    from hpcdist.state import OutputRefused, book_for, read_output

    try:
        raw = read_output(path, book if book is not None else book_for(), "training results")
        results = json.loads(raw.data)
    except FileNotFoundError:
        return {}
    except OutputRefused as exc:
        print(f"Warning: {exc}; the export records no data or metrics", file=sys.stderr)
        return {}
    except (OSError, ValueError):
        return {}
    return results if isinstance(results, dict) else {}
