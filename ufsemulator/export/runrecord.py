"""What a finished run records about itself: its exports with provenance, and the config
and data blocks of ``training_results.json``.

Paths are absolute (a run folder is read from elsewhere: a DA system, a sweep's report),
and only the blocks that apply are written: the ``synthetic`` block only when the run
trained on the synthetic file.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ufsemulator.config import Config
from ufsemulator.data.sources import PathSpec, expand_paths
from ufsemulator.export import provenance


def _absolute(spec: PathSpec | None, what: str = "data file") -> list[str] | None:
    if spec is None:
        return None
    return [str(path.resolve()) for path in expand_paths(spec, what)]


def results_config(config: Config, data_path: PathSpec | None) -> dict[str, Any]:
    """``config.to_dict()`` with the files actually read, as absolute paths, without the
    ``synthetic`` block when the data were real files, and strict JSON (a NaN fill value
    as "nan")."""
    record = provenance.finite(config.to_dict())
    data = dict(record["data"])
    data["path"] = _absolute(data_path if data_path is not None else config.data.path)
    data["atmosphere"] = _absolute(config.data.atmosphere, "atmosphere file")
    if config.data.path is not None:
        data.pop("synthetic", None)
    record["data"] = data
    return record


def data_record(
    config: Config,
    data_path: PathSpec,
    read: Mapping[str, tuple[str, int]] | None = None,
    times: tuple[str | None, str | None] | None = None,
) -> dict[str, Any]:
    """The identity of the training data: files, first and last record times, hash. With
    ``read`` (resolved path -> SHA-256 and size, computed while the training read them) and
    ``times``, of the bytes trained on, nothing read again."""
    files = expand_paths(data_path)
    record = provenance.data_identity(files, config.data.time, read, times)
    if config.data.atmosphere is not None:
        atmosphere = expand_paths(config.data.atmosphere, "atmosphere file")
        if read is not None:
            atmosphere = [p for p in atmosphere if str(p.resolve()) in read]
        record["atmosphere_paths"] = [str(p.resolve()) for p in atmosphere]
        if read is not None:  # as the training read them
            digests = [read[str(p.resolve())][0] for p in atmosphere]
            sizes: list[int] | None = [read[str(p.resolve())][1] for p in atmosphere]
        else:
            digests, sizes = provenance.files_sha256(atmosphere), None
        record["atmosphere_sha256"] = provenance.content_sha256(atmosphere, digests, sizes)
        record["atmosphere_files_sha256"] = digests
    record["synthetic"] = config.data.path is None
    return record


def data_record_later(config: Config, data_path: PathSpec) -> Future[dict[str, Any]]:
    """:func:`data_record` on a thread of its own: a GPU training hashes its data (about
    3 s for 4 GB on one core) while its steps run, not after them."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="data-record")
    try:
        return pool.submit(data_record, config, data_path)
    finally:
        pool.shutdown(wait=False)


def export_run(
    source: Path,
    run_dir: Path,
    config: Config,
    data: Mapping[str, Any],
    run: Mapping[str, Any],
    run_id: str | None = None,
) -> list[Path]:
    """model.pt (and model.pt2 with ``export.aoti``) of the run's best checkpoint, with
    its provenance; the files written."""
    from hpcdist.state import book_for, read_output
    from ufsemulator.export.torchscript import export_checkpoint

    origin = provenance.build(
        config=config.to_dict(),
        data=data,
        metrics={key: run.get(key) for key in provenance.METRICS},
        source=str(source.resolve()),
        run_id=run_id,
    )
    # The checkpoint as this run wrote it (its digest is in the private state), not
    # whatever its name holds now.
    book = book_for()
    checked = read_output(source, book, "checkpoint").data
    out = run_dir / "model.pt"
    written = [export_checkpoint(source, out, config.export, origin, data=checked, book=book)]
    if config.export.aoti:
        from ufsemulator.export.aoti import package_export

        written.append(package_export(written[0], run_dir / "model.pt2"))
    return written
