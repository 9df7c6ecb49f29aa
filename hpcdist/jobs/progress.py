"""How far a running training is and when it will end, from its heartbeat
(``hpcdist.facts.heartbeat``) and its job's time limit. Pure: the caller reads the clock.

The predicted end is where the steps left end at the piece's recent rate
(``recent_steps_per_s``, kept by rank 0's writer, ``hpcdist.distributed.heartbeat``): the
average rate since the steps last changed pace. That average starts at the piece's first
heartbeat (after its first step, warm-up and all), so it is known from the second, and starts
again where three intervals between heartbeats in a row (``PACE_BEATS``, 15 s) ran more than
20% faster, or all more than 20% slower, than it (``PACE_CHANGE``). Why:

- The piece's average since its first step follows a change late: when other load leaves the
  nodes and the steps go twice as fast, the average still holds the slow part, and the end
  from it was 40-80% of the time left off for the rest of the run.
- A window of the last seconds or an exponentially weighted rate follows a change, but takes
  every pause as one: a validation of 2 s in each epoch of 50 s put the end from a rate
  weighted over 10 s up to 20% of the time left off right after each, where this rate stays
  within 6% (the noisy timelines of ``tests/jobs/test_progress.py``). One slow interval is a
  pause, three in a row are a new pace: the pauses stay in the average, at their real cost.
- So a steady rate, noise and pauses included, is forecast as well as by the whole average,
  and a rate that doubles is followed three heartbeats after the change, from where it began.

A rate that drifts by less than 20% is followed only as the average moves. A heartbeat of an
older writer, without the recent rate, falls back to the piece's average
(``piece_steps_per_s``); a piece too new for either, to the last interval's samples a second.

A heartbeat written before this start of the job (a requeued job, before its new piece's
first heartbeat) says how far the run got, never when it ends: its rate and end are those of
a piece that is over.
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
    """The piece's rate in steps a second: its recent rate, else its average since its first
    step, else from the last interval's samples per second and the rows of a step."""
    if beat.recent_steps_per_s:
        return beat.recent_steps_per_s
    average = piece_steps_per_s(beat)
    if average is not None:
        return average
    if beat.samples_per_s and rows_per_step:
        return beat.samples_per_s / rows_per_step
    return None


def piece_steps_per_s(beat: Heartbeat) -> float | None:
    """The piece's average rate since its first step; None before its second beat."""
    if (
        beat.step is not None
        and beat.piece_step is not None
        and beat.piece_started is not None
        and beat.time is not None
        and beat.step > beat.piece_step
        and beat.time > beat.piece_started
    ):
        return (beat.step - beat.piece_step) / (beat.time - beat.piece_started)
    return None


def of_this_start(beat: Heartbeat, job_start: float | None) -> bool:
    """Whether the heartbeat was written by the start of the job that began (or was
    requeued, not started yet) at ``job_start``: its piece's first step came no earlier.
    True where that is not known."""
    began = beat.piece_started if beat.piece_started is not None else beat.time
    return job_start is None or began is None or began >= job_start


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
    ``job_end``: when its time limit ends it; ``job_start``: when this start of the job
    began, or a requeued job not started again, when it was requeued (its start-up, until the
    first step, is counted against every later piece as well). A heartbeat written before
    ``job_start`` gives the step only: no rate, no end."""
    if beat.step is None:
        return None
    current = of_this_start(beat, job_start)
    rate = steps_per_s(beat) if current else None
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
    if age is not None and job_start is not None:  # no beat is due before the start
        age = min(age, max(0.0, now - job_start))
    finished = beat.phase in ("done", "stopped")
    stale = age if age is not None and age > STALE_AFTER_S and not finished else None
    return Forecast(beat.step, beat.steps, rate, end, fits, more, stale)
