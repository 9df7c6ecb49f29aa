"""This rank's data, read while torch, CUDA and NCCL start.

What a rank reads follows from the configuration and its place in the world, and both are
known before torch is imported: the files (``data.path`` or ``--data``), the options, and
the rank and world size from the launcher's environment (``DistEnv``, no torch). So the CLI
starts the read in a thread (``start``) before it imports the training, and ``train``
takes the result (``EarlyRead.take``) once its process group is up, where it would have
started reading. The thread's time goes mostly to netCDF's reads and numpy, both of which
let go of the GIL, while the main thread imports torch and joins the group.

Only where the data is given (the synthetic file may still have to be written by rank 0),
and only the very read ``train`` asks for: ``take`` compares the request and gives None on
any difference, and ``train`` then reads as it would have. An error of the read (a
missing variable, a file that is no netCDF) is raised by ``take``, where the read would
have raised it. No torch here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from hpcdist.distributed.distenv import DistEnv, DistEnvError
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
    """A read running in a thread of its own since ``started`` (perf_counter)."""

    def __init__(self, request: ReadRequest) -> None:
        self.request = request
        self.started = time.perf_counter()
        self.seconds = 0.0  # the read's own duration, once done
        self._dataset: Dataset | None = None
        self._error: BaseException | None = None
        # A daemon: a job stopped while it reads does not wait for the read to end.
        self._thread = threading.Thread(target=self._run, name="early-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        request = self.request
        try:
            self._dataset = load_dataset(
                request.path, request.options, atmosphere=request.atmosphere, share=request.share
            )
        except BaseException as exc:  # raised again by take(), in the main thread
            self._error = exc
        self.seconds = time.perf_counter() - self.started

    def take(self, request: ReadRequest) -> Dataset | None:
        """The dataset, once read, if ``request`` is the read that was started; else None.
        Raises what the read raised."""
        if request != self.request:
            return None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._dataset


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
