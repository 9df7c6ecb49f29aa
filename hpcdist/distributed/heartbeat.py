"""Rank 0's heartbeat (``hpcdist.facts.heartbeat``) and its record of the piece it trains.

``HeartbeatWriter`` costs the step loop one clock read per step: ``due()`` compares it with
the time of the next beat; only then does the loop gather its numbers and ``beat`` replaces
``heartbeat.json`` atomically. A write that fails (a full disk) is said once and the
heartbeat stops: it never ends a training.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpcdist.distributed.requeue import restarts_so_far
from hpcdist.facts.heartbeat import HEARTBEAT_EVERY_S, HEARTBEAT_FILE, Heartbeat
from hpcdist.facts.runs import RUN_ID_VAR, RUN_RECORD_VAR, run_name
from hpcdist.state.fileutil import write_atomic


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
        self.written = 0
        self.stopped = False

    def due(self) -> bool:
        """Whether a beat is due: the step loop's only cost while none is."""
        return self._clock() >= self._next

    def beat(self, step: int, rows_per_step: float, **values: Any) -> Heartbeat | None:
        """Write the heartbeat of step ``step`` (``values``: the other fields that change);
        the rate is that since the last beat. Returns what was written."""
        now = self._clock()
        self._next = now + self.every_s
        if self.stopped:
            return None
        rate = None
        if self._last is not None and now > self._last[0] and step > self._last[1]:
            rate = (step - self._last[1]) * rows_per_step / (now - self._last[0])
        self._last = (now, step)
        beat = dataclasses.replace(
            self.fixed, step=step, samples_per_s=rate, time=self._wall(), **values
        )
        try:
            write_atomic(self.path, beat.to_bytes())
        except OSError as exc:
            self.stopped = True
            print(f"hpcdist: heartbeat stopped: {self.path}: {exc.strerror}", file=sys.stderr)
            return None
        self.written += 1
        return beat


def heartbeat_for(
    folder: Path, epochs: int, steps: int, step: int, environ: Mapping[str, str] | None = None
) -> HeartbeatWriter:
    """The writer of a piece that starts at ``step`` of ``steps`` (``epochs`` epochs)."""
    env = os.environ if environ is None else environ
    fixed = Heartbeat(
        run_id=env.get(RUN_ID_VAR, "").strip() or None,
        job_id=run_name(env),
        restart=restarts_so_far(env),
        epochs=epochs,
        steps=steps,
        piece_step=step,
        phase="training",
    )
    return HeartbeatWriter(folder, fixed)


def record_piece(
    run_dir: Path, resumed: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Rank 0's note, in the run's private record (the file the job's script named in
    ``HPCDIST_RUN_RECORD``), of where this piece trains and which checkpoint it resumed
    from (``{"epoch", "step", "time", "path"}``; None: from the start). None outside a
    script of hpcdist's."""
    env = os.environ if environ is None else environ
    where = env.get(RUN_RECORD_VAR, "").strip()
    if not where:
        return None
    record = {
        "run_id": env.get(RUN_ID_VAR, "").strip() or None,
        "run_dir": os.path.abspath(run_dir),
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
