"""Rank 0's heartbeat (``hpcdist.facts.heartbeat``) and its record of the piece it trains.

``HeartbeatWriter`` costs the step loop one clock read per step: ``due()`` compares it with
the time of the next beat; only then does the loop gather its numbers and ``beat`` replaces
``heartbeat.json`` atomically (a rename, no fsync). A write that fails (a full disk) is said
once and the heartbeat stops: it never ends a training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hpcdist.distributed.requeue import restarts_so_far
from hpcdist.distributed.runpiece import TRAIN_SUFFIX
from hpcdist.facts.heartbeat import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_FILE,
    PACE_BEATS,
    PACE_CHANGE,
    Heartbeat,
    parse,
)
from hpcdist.facts.runs import (
    RUN_ID_VAR,
    RUN_RECORD_VAR,
    TRACKER_ENV_VAR,
    run_id_problem,
    run_name,
)
from hpcdist.state.fileutil import write_atomic
from hpcdist.state.outputs import output_mode
from hpcdist.state.private import PrivacyError, write_private
from hpcdist.state.runroot import run_folder_fd, walked_path
from hpcdist.state.trustedfile import read_at, read_private


class HeartbeatWriter:
    """The heartbeat file of one piece of a run; ``fixed`` holds what does not change."""

    def __init__(
        self,
        folder: Path,
        fixed: Heartbeat,
        every_s: float = HEARTBEAT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = folder / HEARTBEAT_FILE
        self.fixed, self.every_s = fixed, every_s
        self._clock, self._wall = clock, wall
        self._next = clock()  # the first step's beat says the training has begun
        if fixed.piece_started is None:  # made as the piece's first step begins
            self.fixed = dataclasses.replace(fixed, piece_started=wall())
        self._last: tuple[float, int] | None = None  # (clock, step) of the last beat
        self.recent = RecentRate()
        self.written = 0
        self.stopped = False

    def due(self) -> bool:
        """Whether a beat is due: the step loop's only cost while none is."""
        return self._clock() >= self._next

    def beat(self, step: int, rows_per_step: float, **values: Any) -> Heartbeat | None:
        """Write the heartbeat of step ``step`` (``values``: the other fields that change);
        the samples' rate is that since the last beat, the recent rate that of
        ``RecentRate``. Returns what was written."""
        now = self._clock()
        self._next = now + self.every_s
        if self.stopped:
            return None
        rate = None
        if self._last is not None and now > self._last[0] and step >= self._last[1]:
            self.recent = self.recent.add(self._last, (now, step))
            if step > self._last[1]:
                rate = (step - self._last[1]) * rows_per_step / (now - self._last[0])
        self._last = (now, step)
        beat = dataclasses.replace(
            self.fixed,
            step=step,
            samples_per_s=rate,
            recent_steps_per_s=self.recent.steps_per_s(self._last),
            time=self._wall(),
            **values,
        )
        try:
            replace_file(self.path, beat.to_bytes())
        except (OSError, PrivacyError) as exc:  # a folder swapped: the checkpoint says so
            self.stopped = True
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            print(f"hpcdist: heartbeat stopped: {self.path}: {why}", file=sys.stderr)
            return None
        self.written += 1
        return beat


Mark = tuple[float, int]  # (clock, step)


@dataclasses.dataclass(frozen=True)
class RecentRate:
    """The rate since the steps last changed pace (``hpcdist.jobs.progress`` says why): the
    average from ``since``, which moves to where ``PACE_BEATS`` intervals in a row ran more
    than ``PACE_CHANGE`` faster (or all slower) than that average."""

    since: Mark | None = None  # where the current pace began
    # Intervals in a row off the pace, the same way: where the first began, how many, +1/-1.
    off: tuple[Mark, int, int] | None = None

    def add(self, start: Mark, end: Mark) -> RecentRate:
        """The rate after the interval from ``start`` to ``end`` (later than ``start``)."""
        since = self.since or start
        pace = _rate(since, self.off[0] if self.off else start)
        interval = _rate(start, end)
        if not pace or interval is None or abs(interval / pace - 1) <= PACE_CHANGE:
            return RecentRate(since, None)
        way = 1 if interval > pace else -1
        first, count = start, 1
        if self.off is not None and self.off[2] == way:
            first, count = self.off[0], self.off[1] + 1
        if count >= PACE_BEATS:  # a new pace: its rate from where it began
            return RecentRate(first, None)
        return RecentRate(since, (first, count, way))

    def steps_per_s(self, end: Mark) -> float | None:
        return None if self.since is None else _rate(self.since, end)


def _rate(start: Mark, end: Mark) -> float | None:
    return (end[1] - start[1]) / (end[0] - start[0]) if end[0] > start[0] else None


def replace_file(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` at once (a temporary file beside it, renamed over it), so
    a reader sees the old or the new heartbeat, never half of one. The run folder is walked
    to as every run file's is (``hpcdist.state.runroot``) and both go through its
    descriptor: a folder renamed or linked meanwhile is refused, never written. No fsync,
    unlike a checkpoint: a heartbeat lost in a crash is worth nothing, while an fsync every
    few seconds on a busy shared file system would cost the step loop milliseconds."""
    tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with run_folder_fd(path.parent) as folder:
        fd = os.open(tmp, flags, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                os.fchmod(handle.fileno(), output_mode())  # never writable by others
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise


def heartbeat_for(
    folder: Path, epochs: int, steps: int, step: int, environ: Mapping[str, str] | None = None
) -> HeartbeatWriter:
    """The writer of a piece that starts at ``step`` of ``steps`` (``epochs`` epochs)."""
    env = os.environ if environ is None else environ
    fixed = Heartbeat(
        run_id=env.get(RUN_ID_VAR, "").strip() or None,
        run_dir=str(walked_path(folder)),
        job_id=run_name(env),
        restart=restarts_so_far(env),
        epochs=epochs,
        steps=steps,
        piece_step=step,
        phase="training",
    )
    return HeartbeatWriter(folder, fixed)


def record_piece(
    run_dir: Path,
    resumed: Mapping[str, Any] | None,
    environ: Mapping[str, str] | None = None,
    chosen_by: str | None = None,
) -> Path | None:
    """Rank 0's note, in the run's private record (the file the job's script named in
    ``HPCDIST_RUN_RECORD``), of where this piece trains, what chose that folder
    (``chosen_by``: "config" where the training's configuration named it, which the job's
    script then does not know) and which checkpoint it resumed from (``{"epoch", "step",
    "time", "path"}``; None: from the start). None outside a script of hpcdist's."""
    env = os.environ if environ is None else environ
    where = env.get(RUN_RECORD_VAR, "").strip()
    if not where:
        return None
    record = {
        "run_id": env.get(RUN_ID_VAR, "").strip() or None,
        "run_dir": os.path.abspath(run_dir),
        "run_dir_from": chosen_by,
        "resumed_from": dict(resumed) if resumed is not None else None,
        "time": time.time(),
    }
    path = Path(where)
    try:
        write_atomic(path, json.dumps(record) + "\n", mode=0o600)
    except OSError as exc:
        print(f"hpcdist: run record not written: {path}: {exc.strerror}", file=sys.stderr)
        return None
    return path


def continue_run(
    checkpoint_dir: Path, environ: MutableMapping[str, str] | None = None
) -> str | None:
    """Rank 0 of a training that resumes a checkpoint (``--resume``, a run folder of the
    config) written by another run: that run's id, from the heartbeat beside the checkpoint,
    becomes this job's (``HPCDIST_RUN_ID``, for its results and export, and the variables of
    ``--tracker-env``, in this process: a tracker started after this call), and this piece's
    record moves to that run's where it is of the same folder. None: nothing changed."""
    env = os.environ if environ is None else environ
    mine = env.get(RUN_ID_VAR, "").strip()
    try:
        with run_folder_fd(checkpoint_dir) as fd:
            found = read_at(fd, checkpoint_dir / HEARTBEAT_FILE, "heartbeat")
    except (OSError, PrivacyError):
        return None
    beat = parse(found.data)
    theirs = beat.run_id if beat is not None else None
    if not theirs or theirs == mine or run_id_problem(theirs):
        return None
    env[RUN_ID_VAR] = theirs
    for var in filter(None, env.get(TRACKER_ENV_VAR, "").split(",")):
        if env.get(var) == mine:  # --tracker-env: the tracker continues that run too
            env[var] = theirs
    record = env.get(RUN_RECORD_VAR, "").strip()
    if record:
        moved = _move_piece(Path(record), theirs)
        if moved is not None:
            env[RUN_RECORD_VAR] = str(moved)
    print(
        f"hpcdist: continuing run {theirs}, whose checkpoint this job resumes "
        f"(it was started as run {mine or 'none'})",
        file=sys.stderr,
        flush=True,
    )
    return theirs


def _move_piece(record: Path, run_id: str) -> Path | None:
    """This piece's file, from its run's record to run ``run_id``'s beside it; the new path
    of the training's note. None where that run has no record here."""
    target = record.parent.parent / run_id
    piece = record.with_name(record.name.removesuffix(TRAIN_SUFFIX) + ".json")
    if not target.is_dir():
        return None
    try:
        data = json.loads(read_private(piece, "run record"))
        data["run_id"] = run_id
        write_private(target / piece.name, json.dumps(data) + "\n", "hpcdist's run record")
        piece.unlink()
        with contextlib.suppress(OSError):  # the run this job was started as: now empty
            record.parent.rmdir()
    except (OSError, ValueError, PrivacyError):
        return None
    return target / record.name


def foreign_heartbeat(dir_fd: int, run_dir: Path) -> str:
    """Why the run folder ``run_dir`` (open as ``dir_fd``) holds another run folder's files:
    its heartbeat was written for another path (a folder renamed or moved into this name);
    "" where it has none, or one written here."""
    try:
        found = read_at(dir_fd, Path(run_dir) / HEARTBEAT_FILE, "heartbeat")
    except FileNotFoundError:
        return ""
    beat = parse(found.data)
    here = str(walked_path(Path(run_dir)))
    if beat is None or not beat.run_dir or beat.run_dir == here:
        return ""
    return (
        f"run folder {str(run_dir)!r} holds the files of run {beat.run_id or 'unknown'}, "
        f"written in {beat.run_dir!r} (moved or renamed into this name)"
    )
