"""Read CICE history files (real or synthetic) into per-point training arrays.

One reader for every layout (see ``ufsemulator.data.ncread`` for how a field is found): CICE
history streams with any suffix, the CF-named ocean/ice + atmosphere pair, one record or
many, one file or a time series of them (``ufsemulator.data.sources``). Selected points of each
selected record become rows of ``inputs [N, n_in]`` (columns in the order of
``options.inputs``, by default the 14 of ``INPUT_NAMES``) and ``targets [N, 1]``.

Mask modes (all of them only ever select ocean points, i.e. ``tmask`` > 0.5 when the file
has a mask, and drop points where an input or the target is missing):

- ``sea_ice``: points with ice, ``aice > 0``.
- ``ocean``: every ocean point.
- ``both``: every ice point plus an evenly strided sample of the open-water points, about
  as many as there are ice points. The model sees the ice edge from both sides without
  the open ocean (three quarters of a global grid) swamping the loss.

Thinning (``thin=k``) then keeps every k-th selected point of a record in grid order.
``aice`` is read whatever the target, since every mask mode needs it.

With ``share=(rank, world)`` only that rank's part of a multi-file data set is read, not
all of it: with ``time: all``, a contiguous block of the files balanced by their bytes
(``ufsemulator.data.shares``), and a rank opens only its own files; with a time selection
(which counts records over all files), the selected records cut into ``world``
contiguous blocks. Each row keeps its file's number and its record in that file, so a row
is named the same whichever rank read it.

Consecutive files on the same grid (the same coordinate and mask variables, attributes
and values, compared raw) share one converted grid (``ufsemulator.data.ncread.Grid``).

Every file is read once, through one descriptor, and hashed on the way
(``ufsemulator.data.onceread``): ``Dataset.file_digests`` are the SHA-256 of the bytes the
arrays were made from, which the provenance records (nothing is read again for it).

With ``cache_dir`` set, the selected arrays are kept in an ``.npz`` named by a hash of
every source file (resolved path, device, inode, size, mtime and ctime, in order) and the
options, so a rerun skips netCDF. The cache names the digests of the data bytes it was made
from, lives only where the user alone can write and is used only as written
(``ufsemulator.data.arraycache``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ufsemulator.data import background
from ufsemulator.data.arraycache import load_bytes, save_bytes
from ufsemulator.data.heap import heap_kept
from ufsemulator.data.onceread import Identity, identity
from ufsemulator.data.select import select_points, select_record
from ufsemulator.data.shares import file_blocks
from ufsemulator.data.sources import PathSpec, TimeSelection, expand_paths, pair_groups, parse_time
from ufsemulator.data.synthfiles import make_synthetic
from ufsemulator.errors import DataError
from ufsemulator.variables import (
    CICE_NAMES,
    CICE_SUFFIXES,
    INPUT_NAMES,
    MASK_MODES,
    OTHER_NAMES,
    TARGET_NAMES,
    check_inputs,
)

if TYPE_CHECKING:
    from ufsemulator.data.ncread import Grid, GroupReader

__all__ = [
    "INPUT_NAMES",
    "MASK_MODES",
    "TARGET_NAMES",
    "DataError",
    "DataOptions",
    "Dataset",
    "load_dataset",
    "make_synthetic",
    "select_points",
]

# Plain names of each field, the hourly stream's first (what make_synthetic writes).
VARIABLE_NAMES: dict[str, tuple[str, ...]] = {
    name: tuple(base + s for s in CICE_SUFFIXES) + OTHER_NAMES.get(name, ())
    for name, base in CICE_NAMES.items()
}
_CACHE_VERSION = 5  # 4: record within its file, file, files_read; 5: file digests

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class DataOptions:
    mask: str = "sea_ice"
    thin: int = 1
    target: str = "aice"
    cache_dir: Path | None = None
    time: str | int = "all"  # all | INDEX | START:STOP over the records of all files
    inputs: tuple[str, ...] = INPUT_NAMES

    def __post_init__(self) -> None:
        if self.mask not in MASK_MODES:
            raise ValueError(f"mask must be one of {', '.join(MASK_MODES)}, got {self.mask!r}")
        if self.target not in TARGET_NAMES:
            raise ValueError(
                f"target must be one of {', '.join(TARGET_NAMES)}, got {self.target!r}"
            )
        if isinstance(self.thin, bool) or not isinstance(self.thin, int) or self.thin < 1:
            raise ValueError(f"thin must be an integer >= 1, got {self.thin!r}")
        parse_time(self.time)  # raises on a malformed selection
        object.__setattr__(self, "inputs", check_inputs(self.inputs))
        if self.cache_dir is not None and not isinstance(self.cache_dir, Path):
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    def cache_key_fields(self) -> dict[str, Any]:
        """The options that change the arrays (not where they are cached)."""
        return {
            "mask": self.mask,
            "thin": self.thin,
            "target": self.target,
            "time": str(self.time),
            "inputs": list(self.inputs),
        }


@dataclass(frozen=True, eq=False)
class Dataset:
    """Selected points of the selected records; rows of all arrays correspond."""

    inputs: npt.NDArray[np.float32]  # [N, n_in], columns in input_names order, our units
    targets: npt.NDArray[np.float32]  # [N, 1]
    lat: npt.NDArray[np.float32]  # [N] degrees north
    lon: npt.NDArray[np.float32]  # [N] degrees east
    index: npt.NDArray[np.int64]  # [N] flat (row-major) index into the nj x ni grid
    grid_shape: tuple[int, int]  # (nj, ni)
    target_names: tuple[str, ...]
    source: str
    input_names: tuple[str, ...] = INPUT_NAMES
    record: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )  # [N] record number within its file
    file: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64)
    )  # [N] the file's (or paired group's) number in the series, from 0
    notes: tuple[str, ...] = ()  # what the reader decided that a user should know
    bytes_read: int = 0  # of the files, in proportion to the records read (or the cache's)
    # [first, last) record numbers read, counted over all files in order (None where a
    # share of the files was read without counting the records of the others), the
    # [first, last) file numbers read, the number of records read and the times of the
    # first and last of them (ISO 8601; None without a time variable).
    records_read: tuple[int, int] | None = (0, 0)
    record_times: tuple[str | None, str | None] = (None, None)
    files_read: tuple[int, int] = (0, 1)
    n_records: int = 1
    # (file number, resolved path, SHA-256, size) of every file read, in order: the bytes
    # the arrays were made from, hashed while they were read.
    file_digests: tuple[tuple[int, str, str, int], ...] = ()

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def records_text(self) -> str:
        """``records 2..3 (2 of a 320x384 grid, 2000-01-03T00:00:00 .. 2000-01-04T00:00:00)``:
        record numbers counted over all files, as the log lines give them; ``files 7..14
        (8 records of ...)`` for a share of the files."""
        start, end = self.record_times
        nj, ni = self.grid_shape
        what = f"{self.n_records} of a {nj}x{ni} grid, {start} .. {end}"
        if self.records_read is None:
            first, last = self.files_read
            return f"files {first}..{last - 1} ({what.replace(' of a', ' records of a', 1)})"
        first, last = self.records_read
        return f"records {first}..{last - 1} ({what})"


def load_dataset(
    path: PathSpec,
    options: DataOptions | None = None,
    atmosphere: PathSpec | None = None,
    share: tuple[int, int] | None = None,
    *,
    cache_in_background: bool = False,
) -> Dataset:
    """Select and flatten the points of the files named by ``path`` (a file, a glob or a
    list, in time order), each paired with the same-numbered ``atmosphere`` file if given;
    with ``share=(rank, world)``, of that rank's block of the records only.

    With ``options.cache_dir`` the arrays read are written there for the next read of the
    same files; ``cache_in_background``: by a thread, after this returns
    (``ufsemulator.data.background``), for a caller with better things to do meanwhile.

    Raises ``DataError`` (naming the file, and every variable that is missing) when a file
    cannot be read or no point is selected.
    """
    options = options or DataOptions()
    files = expand_paths(path)
    atm_files = expand_paths(atmosphere, "atmosphere file") if atmosphere is not None else None
    groups = pair_groups(files, atm_files)
    first, last = (" + ".join(map(str, group)) for group in (groups[0], groups[-1]))
    source = first if len(groups) == 1 else f"{first} .. {last} ({len(groups)} files)"
    if share is not None and not 0 <= share[0] < share[1]:
        raise ValueError(f"share must be (rank, world) with 0 <= rank < world, got {share}")
    cache_file, seen = None, {}
    if options.cache_dir is not None:
        seen = _identities(groups)
        cache_file = _cache_path(groups, options, seen, share)
        cached = _load_cache(cache_file)
        if cached is not None:
            return dataclasses.replace(cached, source=source)
    read: dict[str, Identity] = {}
    with heap_kept():
        dataset = dataclasses.replace(_read(groups, options, share, read), source=source)
    if any(seen.get(name) != ident for name, ident in read.items()):
        cache_file = None  # a file changed between the look-up and the read: not cached
    if cache_file is not None and cache_in_background:
        background.start(f"array cache {cache_file}", lambda: _save_cache(cache_file, dataset))
    elif cache_file is not None:
        _save_cache(cache_file, dataset)
    return dataset


def _read(
    groups: list[tuple[Path, ...]],
    options: DataOptions,
    share: tuple[int, int] | None = None,
    read: dict[str, Identity] | None = None,
) -> Dataset:
    """The arrays of the plan's files; ``read`` gets the identity of every file read."""
    names = list(dict.fromkeys((*options.inputs, "aice", options.target)))
    selection = parse_time(options.time)
    plan: list[tuple[int, tuple[Path, ...], list[int] | None]]  # file, group, its records
    picked: list[int] | None = None
    if selection.everything:  # whole files: no file is opened only to count its records
        rank, world = share if share is not None else (0, 1)
        first_file, last_file = file_blocks([_size(group) for group in groups], world)[rank]
        plan = [(k, groups[k], None) for k in range(first_file, last_file)]
    else:
        plan, picked = _plan_records(groups, names, selection, share)
    notes: dict[str, int] = {}
    n_bytes = 0.0
    times: list[str | None] = []
    parts: list[dict[str, npt.NDArray[Any]]] = []
    grid: Grid | None = None
    digests: list[tuple[int, str, str, int]] = []
    for number, group, wanted in plan:
        with _reader(group, names, known=grid) as reader:
            for found in reader.read:
                resolved = str(found.path.resolve())
                digests.append((number, resolved, found.sha256, len(found.data)))
                if read is not None:
                    read[resolved] = found.identity
            for note in dict.fromkeys(reader.notes):
                notes[note] = notes.get(note, 0) + 1
            if grid is not None and reader.grid.lat.shape != grid.lat.shape:
                raise DataError(
                    f"{reader.where} is on a {reader.grid.lat.shape} grid, the files "
                    f"before it on {grid.lat.shape}"
                )
            grid = reader.grid
            records = list(range(reader.n_records)) if wanted is None else wanted
            n_bytes += _size(group) * len(records) / reader.n_records
            for r in records:
                parts.append(select_record(reader, options, r, number))
            times += [reader.time_of(records[0]), reader.time_of(records[-1])]
    assert grid is not None
    where = " + ".join(map(str, groups[0])) + (" ..." if len(groups) > 1 else "")
    n_records = len(parts)
    total = sum(part["index"].size for part in parts)
    if total == 0:
        ocean = int(sum(part["n_ocean"] for part in parts))
        valid = int(sum(part["n_valid"] for part in parts))
        kind = "ice " if options.mask == "sea_ice" else ""
        raise DataError(
            f"no points selected from '{where}' with mask '{options.mask}' "
            f"(ocean points: {ocean}, valid {kind}points: {valid}, records: {n_records})"
        )
    summary = tuple(
        note if count == len(plan) else f"{note} ({count} of {len(plan)} files)"
        for note, count in notes.items()
    )
    return Dataset(
        inputs=np.concatenate([p["inputs"] for p in parts]),
        targets=np.concatenate([p["targets"] for p in parts]),
        lat=np.concatenate([p["lat"] for p in parts]),
        lon=np.concatenate([p["lon"] for p in parts]),
        index=np.concatenate([p["index"] for p in parts]),
        record=np.concatenate([p["record"] for p in parts]),
        file=np.concatenate([p["file"] for p in parts]),
        grid_shape=(int(grid.lat.shape[0]), int(grid.lat.shape[1])),
        target_names=(options.target,),
        source=where,
        input_names=options.inputs,
        notes=summary,
        bytes_read=round(n_bytes),
        records_read=_records_read(picked, n_records, share),
        record_times=(times[0], times[-1]),
        files_read=(plan[0][0], plan[-1][0] + 1),
        n_records=n_records,
        file_digests=tuple(digests),
    )


def _plan_records(
    groups: list[tuple[Path, ...]],
    names: list[str],
    selection: TimeSelection,
    share: tuple[int, int] | None,
) -> tuple[list[tuple[int, tuple[Path, ...], list[int] | None]], list[int]]:
    """The selected records (of this share), by file: a time selection counts over the
    records of all files, so every file is opened first to count its own."""
    counts = []
    for group in groups:  # one file open at a time: a long series may be hundreds of files
        with _reader(group, names, grid=False) as reader:
            counts.append(reader.n_records)
    picked = selection.pick(sum(counts))
    if share is not None:
        rank, world = share
        if len(picked) < world:
            raise DataError(
                f"{len(picked)} selected record(s) cannot be shared by {world} ranks: give "
                "more files or records, or use fewer ranks"
            )
        picked = picked[rank * len(picked) // world : (rank + 1) * len(picked) // world]
    plan: list[tuple[int, tuple[Path, ...], list[int] | None]] = []
    first = 0
    for number, (group, count) in enumerate(zip(groups, counts, strict=True)):
        mine = [r - first for r in picked if first <= r < first + count]
        if mine:
            plan.append((number, group, mine))
        first += count
    return plan, picked


def _records_read(
    picked: list[int] | None, n_records: int, share: tuple[int, int] | None
) -> tuple[int, int] | None:
    if picked is not None:
        return (picked[0], picked[-1] + 1)
    return (0, n_records) if share is None else None  # a share of files: not counted


def _size(group: tuple[Path, ...]) -> int:
    try:
        return sum(path.stat().st_size for path in group)
    except OSError as exc:
        raise DataError(f"cannot read data file '{exc.filename}': {exc.strerror}") from exc


def _reader(group: Any, names: Any, grid: bool = True, known: Grid | None = None) -> GroupReader:
    # netCDF4 is imported where a file is read: the benchmarks and the model use this module's
    # names and selection without it.
    from ufsemulator.data.ncread import GroupReader

    return GroupReader(group, names, grid, known)


def _identities(groups: list[tuple[Path, ...]]) -> dict[str, Identity]:
    """Each file's identity now, by resolved path (``ufsemulator.data.onceread.identity``)."""
    found = {}
    for group in groups:
        for path in group:
            try:
                found[str(path.resolve())] = identity(path.stat())
            except OSError as exc:
                raise DataError(f"cannot read data file '{path}': {exc.strerror}") from exc
    return found


def _cache_path(
    groups: list[tuple[Path, ...]],
    options: DataOptions,
    seen: dict[str, Identity],
    share: tuple[int, int] | None = None,
) -> Path:
    assert options.cache_dir is not None
    files = [[name, *ident] for name, ident in seen.items()]
    key = {
        "version": _CACHE_VERSION,
        "files": files,
        "paired": len(groups[0]),
        "options": options.cache_key_fields(),
        **({"share": list(share)} if share is not None else {}),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return options.cache_dir / f"{groups[0][0].stem}.{digest}.npz"


_ARRAYS = ("inputs", "targets", "lat", "lon", "index", "record", "file")


def _load_cache(path: Path) -> Dataset | None:
    data = load_bytes(path)
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            arrays = {name: z[f"array_{name}"] for name in _ARRAYS}
            return Dataset(
                **arrays,
                grid_shape=tuple(meta["grid_shape"]),
                target_names=tuple(meta["target_names"]),
                source=meta["source"],
                input_names=tuple(meta["input_names"]),
                notes=tuple(meta["notes"]),
                records_read=tuple(meta["records_read"]) if meta["records_read"] else None,
                record_times=tuple(meta["record_times"]),
                files_read=tuple(meta["files_read"]),
                n_records=int(meta["n_records"]),
                file_digests=tuple(tuple(d) for d in meta["file_digests"]),
                bytes_read=len(data),
            )
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # a damaged cache is rebuilt, not fatal


def _save_cache(path: Path, dataset: Dataset) -> None:
    meta = {
        "grid_shape": list(dataset.grid_shape),
        "target_names": list(dataset.target_names),
        "input_names": list(dataset.input_names),
        "source": dataset.source,
        "notes": list(dataset.notes),
        "records_read": list(dataset.records_read) if dataset.records_read else None,
        "record_times": list(dataset.record_times),
        "files_read": list(dataset.files_read),
        "n_records": dataset.n_records,
        "file_digests": [list(d) for d in dataset.file_digests],
    }
    out = io.BytesIO()
    np.savez(
        out,
        meta=np.array(json.dumps(meta)),
        # Prefixed: np.savez's own first parameter is called "file".
        **{f"array_{name}": getattr(dataset, name) for name in _ARRAYS},
    )
    save_bytes(path, out.getvalue())
