"""This rank's data, read while torch, CUDA and NCCL start.

What a rank reads follows from the configuration and its place in the world, and both are
known before torch is imported: the files (``data.path`` or ``--data``), the options, and
the rank and world size from the launcher's environment (``DistEnv``, no torch). So the CLI
starts the read (``start``) before it imports the training, and ``train`` takes the result
(``EarlyRead.take``) once its process group is up, where it would have started reading.

The read runs in a child process (``python -m ufsemulator.training.earlyread``), not a
thread: between its netCDF and numpy calls the reader needs the GIL, and beside a thread
that holds it (torch's import is Python) a read of 8 quarter-degree files took 2.6 s
instead of 0.9 s. The child leaves its arrays in the array cache (``data.cache_dir``:
``$HPCDIST_DATA_DIR``), which every read writes anyway; ``take`` loads them from there.

Only where the data is given (the synthetic file may still have to be written by rank 0),
and only the very read ``train`` asks for: ``take`` compares the request and gives None on
any difference or failure, and ``train`` then reads as it would have (and meets the error
of a bad file itself). No torch here.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.distributed import DistEnv, DistEnvError
from ufsemulator.config import Config
from ufsemulator.data.read import DataOptions, Dataset, load_dataset
from ufsemulator.data.sources import PathSpec, data_dir, expand_paths
from ufsemulator.errors import DataError


@dataclass(frozen=True)
class ReadRequest:
    """One rank's read: what ``load_dataset`` is called with."""

    path: PathSpec
    options: DataOptions
    atmosphere: PathSpec | None
    share: tuple[int, int] | None  # (rank, world) where the files are read in shares


def in_shares(path: PathSpec, world_size: int) -> bool:
    """Whether each rank reads only its share: several files, at least one per rank."""
    files = len(expand_paths(path))
    return files > 1 and files >= world_size


def read_request(
    config: Config, path: PathSpec, rank: int, world_size: int, environ: Mapping[str, str]
) -> ReadRequest:
    """The read of rank ``rank`` of ``world_size`` on the files ``path``. Pure but for the
    file names a glob expands to."""
    options = DataOptions(
        mask=config.data.mask,
        thin=config.data.thin,
        target=config.data.target,
        cache_dir=data_dir(environ),
        time=config.data.time,
        inputs=config.data.inputs,
    )
    share = (rank, world_size) if in_shares(path, world_size) else None
    return ReadRequest(path, options, config.data.atmosphere, share)


class EarlyRead:
    """A read running in a child process since ``started`` (perf_counter)."""

    def __init__(self, request: ReadRequest) -> None:
        if request.options.cache_dir is None:
            raise ValueError("an early read leaves its arrays in the cache: give a cache_dir")
        self.request = request
        self.started = time.perf_counter()
        self.seconds = 0.0  # the read's own duration, once taken
        self.finished = 0.0  # perf_counter at its end, once taken
        self._child = subprocess.Popen(
            [sys.executable, "-m", "ufsemulator.training.earlyread", _to_json(request)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # a failed read fails again, and says why, in train
            text=True,
        )

    def take(self, request: ReadRequest) -> Dataset | None:
        """The dataset if ``request`` is the read that was started and it succeeded (from
        the cache it left); else None, the child stopped."""
        if request != self.request:
            self.stop()
            return None
        out, _ = self._child.communicate()
        if self._child.returncode != 0:
            return None
        report = json.loads(out)
        # The child's clock is the wall clock: its end, in this process's perf_counter.
        self.finished = time.perf_counter() - (time.time() - report["finished"])
        self.seconds = report["seconds"]
        dataset = load_dataset(
            request.path, request.options, atmosphere=request.atmosphere, share=request.share
        )
        # The bytes of the netCDF files the child read, not those of the cache.
        return dataclasses.replace(dataset, bytes_read=report["bytes_read"])

    def stop(self) -> None:
        if self._child.poll() is None:
            self._child.kill()
        self._child.communicate()


def _to_json(request: ReadRequest) -> str:
    options = request.options
    return json.dumps(
        {
            "path": _plain(request.path),
            "atmosphere": _plain(request.atmosphere),
            "share": request.share,
            "options": {
                "mask": options.mask,
                "thin": options.thin,
                "target": options.target,
                "cache_dir": str(options.cache_dir),
                "time": options.time,
                "inputs": list(options.inputs),
            },
        }
    )


def _from_json(text: str) -> ReadRequest:
    data = json.loads(text)
    options = data["options"]
    return ReadRequest(
        path=data["path"],
        options=DataOptions(
            mask=options["mask"],
            thin=options["thin"],
            target=options["target"],
            cache_dir=Path(options["cache_dir"]),
            time=options["time"],
            inputs=tuple(options["inputs"]),
        ),
        atmosphere=data["atmosphere"],
        share=tuple(data["share"]) if data["share"] is not None else None,
    )


def _plain(path: PathSpec | None) -> Any:
    if path is None or isinstance(path, (str, Path)):
        return None if path is None else str(path)
    return [str(p) for p in path]


def _child(argv: list[str]) -> int:
    """The child's read: into the cache; its duration and end on stdout."""
    request = _from_json(argv[0])
    started = time.perf_counter()
    dataset = load_dataset(
        request.path, request.options, atmosphere=request.atmosphere, share=request.share
    )
    report = {
        "seconds": time.perf_counter() - started,
        "finished": time.time(),
        "bytes_read": dataset.bytes_read,
    }
    print(json.dumps(report), flush=True)
    return 0


def start(config: Config, environ: Mapping[str, str]) -> EarlyRead | None:
    """Start this rank's read where everything it needs is known now; else None."""
    if not config.data.read_early or config.data.path is None:
        return None
    try:
        env = DistEnv.from_environ(environ)
        request = read_request(config, config.data.path, env.rank, env.world_size, environ)
    except (DistEnvError, DataError):
        return None  # said again, with its context, where the training meets it
    return EarlyRead(request)


if __name__ == "__main__":
    raise SystemExit(_child(sys.argv[1:]))
