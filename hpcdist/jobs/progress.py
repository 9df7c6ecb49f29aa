"""How far a running training is and when it will end, from its heartbeat
(``hpcdist.facts.heartbeat``) and its job's time limit. Pure: the caller reads the clock.

The rate is the piece's whole rate since its first step (validation, checkpoints and the
epochs' ends included), so the predicted end is where the steps left at that rate end; a
piece too new to have one uses the last interval's samples per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpcdist.facts.heartbeat import STALE_AFTER_S, Heartbeat


@dataclass(frozen=True)
class Forecast:
    """What ``status`` says of a running training."""

    step: int
    steps: int | None
    steps_per_s: float | None
    end: float | None  # predicted end of the training (seconds since the epoch)
    fits: bool | None  # the end comes before the job's time limit; None: not known
    more_pieces: int | None  # jobs (requeues) still needed after this one; 0 if it fits
    stale_s: float | None  # age of a heartbeat old enough to suggest a hang; else None

    @property
    def fraction(self) -> float | None:
        return None if not self.steps else min(1.0, self.step / self.steps)


def steps_per_s(beat: Heartbeat, rows_per_step: float | None = None) -> float | None:
    """The piece's rate in steps a second: since its first step, else from the last
    interval's samples per second and the rows of a step."""
    if (
        beat.step is not None
        and beat.piece_step is not None
        and beat.piece_started is not None
        and beat.time is not None
        and beat.step > beat.piece_step
        and beat.time > beat.piece_started
    ):
        return (beat.step - beat.piece_step) / (beat.time - beat.piece_started)
    if beat.samples_per_s and rows_per_step:
        return beat.samples_per_s / rows_per_step
    return None


def pieces_needed(end: float, job_end: float, limit_s: float, startup_s: float) -> int:
    """Jobs still needed after this one, each the time limit long less its start-up, for a
    training predicted to end at ``end`` when this job ends at ``job_end``."""
    if end <= job_end:
        return 0
    useful = max(limit_s - startup_s, 1.0)
    return math.ceil((end - job_end) / useful)


def forecast(
    beat: Heartbeat,
    now: float,
    job_end: float | None = None,
    limit_s: float | None = None,
    job_start: float | None = None,
) -> Forecast | None:
    """The forecast of a running job's training; None without a step to go by.
    ``job_end``: when its time limit ends it; ``job_start``: when it started (its start-up,
    until the first step, is counted against every later piece as well)."""
    if beat.step is None:
        return None
    rate = steps_per_s(beat)
    end = None
    if rate and beat.steps is not None and beat.time is not None:
        end = beat.time + max(0, beat.steps - beat.step) / rate
    fits, more = None, None
    if end is not None and job_end is not None:
        fits = end <= job_end
        if limit_s is not None:
            startup = 0.0
            if job_start is not None and beat.piece_started is not None:
                startup = max(0.0, beat.piece_started - job_start)
            more = pieces_needed(end, job_end, limit_s, startup)
    age = beat.age_s(now)
    finished = beat.phase in ("done", "stopped")
    stale = age if age is not None and age > STALE_AFTER_S and not finished else None
    return Forecast(beat.step, beat.steps, rate, end, fits, more, stale)
