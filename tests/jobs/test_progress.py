"""The arithmetic of `hpcdist status`'s progress: rate, predicted end, whether the run fits
in the time limit or how many more jobs it needs, and when a heartbeat is too old; the
predicted end along whole trainings, their heartbeats written by rank 0's writer and read
back as `status` reads them, on synthetic clocks."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcdist.distributed.heartbeat import HeartbeatWriter
from hpcdist.facts.heartbeat import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_FILE,
    STALE_AFTER_S,
    Heartbeat,
    parse,
)
from hpcdist.jobs.progress import forecast, piece_steps_per_s, pieces_needed, steps_per_s


def _beat(**values: object) -> Heartbeat:
    base: dict[str, object] = {
        "step": 300,
        "steps": 1000,
        "piece_step": 100,
        "piece_started": 1000.0,
        "time": 1100.0,
        "phase": "training",
    }
    return Heartbeat(**{**base, **values})  # type: ignore[arg-type]


def test_rate_is_the_pieces_steps_over_its_time() -> None:
    assert steps_per_s(_beat()) == pytest.approx(200 / 100)


def test_a_piece_without_steps_yet_uses_the_samples_rate() -> None:
    fresh = _beat(step=100, samples_per_s=5000.0)
    assert steps_per_s(fresh) is None
    assert steps_per_s(fresh, rows_per_step=1000.0) == pytest.approx(5.0)


def test_predicted_end_is_the_steps_left_at_that_rate() -> None:
    found = forecast(_beat(), now=1101.0)
    assert found is not None and found.fraction == pytest.approx(0.3)
    assert found.end == pytest.approx(1100.0 + 700 / 2.0)  # 1450
    assert found.fits is None and found.more_pieces is None  # no time limit known


@pytest.mark.parametrize(
    ("job_end", "fits", "more"),
    [
        (1450.0, True, 0),  # ends exactly at the limit: fits
        (1449.0, False, 1),  # a second short: one more job
        (2000.0, True, 0),
    ],
)
def test_fits_in_the_time_limit_on_both_sides(job_end: float, fits: bool, more: int) -> None:
    found = forecast(_beat(), now=1101.0, job_end=job_end, limit_s=600.0, job_start=950.0)
    assert found is not None and (found.fits, found.more_pieces) == (fits, more)


def test_more_pieces_count_each_jobs_startup() -> None:
    # 1000 s left after this job; each job of 300 s spends 50 s starting: 250 useful.
    assert pieces_needed(end=2000.0, job_end=1000.0, limit_s=300.0, startup_s=50.0) == 4
    assert pieces_needed(end=2001.0, job_end=1000.0, limit_s=300.0, startup_s=50.0) == 5
    assert pieces_needed(end=1000.0, job_end=1000.0, limit_s=300.0, startup_s=50.0) == 0
    # A start-up longer than the limit still counts every job as making some progress.
    assert pieces_needed(end=1010.0, job_end=1000.0, limit_s=10.0, startup_s=50.0) == 10


def test_with_startup_from_the_job_start() -> None:
    # Ends at 1450; the job ends at 1200 with a 300 s limit; it started at 900 and took
    # its first step at 1000: 100 s start-up, so 200 useful seconds a job: 2 more.
    found = forecast(_beat(), now=1101.0, job_end=1200.0, limit_s=300.0, job_start=900.0)
    assert found is not None and found.more_pieces == 2


def test_an_old_heartbeat_of_a_training_is_stale_on_both_sides_of_the_limit() -> None:
    at = 1100.0 + STALE_AFTER_S
    just = forecast(_beat(), now=at)
    assert just is not None and just.stale_s is None
    later = forecast(_beat(), now=at + 1)
    assert later is not None and later.stale_s == pytest.approx(STALE_AFTER_S + 1)
    done = forecast(_beat(phase="done"), now=at + 1000)
    assert done is not None and done.stale_s is None


def test_no_forecast_without_a_step() -> None:
    assert forecast(Heartbeat(time=5.0), now=6.0) is None
    bare = forecast(Heartbeat(step=5, time=5.0), now=6.0)
    assert bare is not None and bare.end is None and bare.fraction is None


def test_the_recent_rate_comes_before_the_pieces_average() -> None:
    assert steps_per_s(_beat(recent_steps_per_s=5.0)) == 5.0
    found = forecast(_beat(recent_steps_per_s=5.0), now=1101.0)
    assert found is not None and found.end == pytest.approx(1100.0 + 700 / 5.0)


@pytest.mark.parametrize(
    ("piece_started", "time", "has_end"),
    [
        (899.0, 1100.0, False),  # the piece began a second before this start: an earlier one
        (900.0, 1100.0, True),  # at this start
        (None, 899.0, False),  # no piece start: the time it was written
        (None, 900.0, True),
    ],
)
def test_a_heartbeat_from_before_this_start_gives_no_rate_and_no_end(
    piece_started: float | None, time: float, has_end: bool
) -> None:
    beat = _beat(piece_started=piece_started, time=time, recent_steps_per_s=2.0)
    found = forecast(beat, now=1200.0, job_end=5000.0, limit_s=4100.0, job_start=900.0)
    assert found is not None and found.step == 300
    assert (found.end is not None, found.steps_per_s is not None) == (has_end, has_end)
    assert (found.fits is not None, found.more_pieces is not None) == (has_end, has_end)
    if found.end is not None:
        assert found.end >= 900.0


def test_a_requeued_jobs_old_heartbeat_is_stale_from_the_new_start_on() -> None:
    old = _beat(piece_started=100.0, time=200.0)  # the piece before the requeue
    start = 5000.0
    fresh = forecast(old, now=start + STALE_AFTER_S, job_start=start)
    assert fresh is not None and fresh.stale_s is None and fresh.end is None
    silent = forecast(old, now=start + STALE_AFTER_S + 1, job_start=start)
    assert silent is not None and silent.stale_s == pytest.approx(STALE_AFTER_S + 1)


# A whole training: 12,000 steps of 1,000 rows, rank 0's heartbeat every 5 s on a clock
# that the steps move; `status` reads the heartbeat file as it is when a beat was written.
STEPS = 12_000
T0 = 1_800_000_000.0


def _timeline(folder: Path, step_s: Callable[[int], float]) -> tuple[list[Heartbeat], float]:
    """The heartbeats a training whose step ``s`` takes ``step_s(s)`` seconds writes, as read
    back from its file, and the time it ends."""
    clock = [0.0]
    fixed = Heartbeat(epochs=24, steps=STEPS, piece_step=0, phase="training")
    writer = HeartbeatWriter(
        folder, fixed, HEARTBEAT_EVERY_S, lambda: clock[0], lambda: T0 + clock[0]
    )
    beats = []
    for step in range(1, STEPS + 1):
        clock[0] += step_s(step)
        if writer.due():
            writer.beat(step, 1000.0)
            beat = parse((folder / HEARTBEAT_FILE).read_bytes())
            assert beat is not None
            beats.append(beat)
    return beats, T0 + clock[0]


def _off(beat: Heartbeat, end: float, rate: float | None) -> float:
    """How far an end predicted at ``rate`` from this heartbeat is from the real end, as a
    fraction of the time that was left."""
    assert rate and beat.time is not None
    predicted = beat.time + (STEPS - (beat.step or 0)) / rate
    return (predicted - end) / (end - beat.time)


def _noise(seed: int, load: float = 0.1, jitter: float = 0.3) -> Callable[[float], float]:
    """A step's time factor: each step its own jitter, and bursts of other load (1-4 s long,
    up to ``load`` either way)."""
    rng = random.Random(seed)
    burst = {"factor": 1.0, "until": 0.0, "now": 0.0}

    def factor(seconds: float) -> float:
        if burst["now"] >= burst["until"]:
            burst["factor"] = rng.uniform(1 - load, 1 + load)
            burst["until"] = burst["now"] + rng.uniform(1.0, 4.0)
        burst["now"] += seconds
        return burst["factor"] * rng.uniform(1 - jitter, 1 + jitter)

    return factor


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
def test_a_rate_that_doubles_is_followed_within_20_percent(
    tmp_path: Path, seed: int | None
) -> None:
    # 20 steps/s for the first 2,000 steps (17% of them), then 40 (the other load left):
    # 100 s, then 250 s; at a quarter of the steps the new rate has run for 25 s.
    noise = _noise(seed, load=0.05) if seed is not None else (lambda seconds: 1.0)

    def step_s(step: int) -> float:
        seconds = 1 / 20 if step <= 2000 else 1 / 40
        return seconds * noise(seconds)

    beats, end = _timeline(tmp_path, step_s)
    for fraction in (0.25, 0.5, 0.75):
        beat = next(b for b in beats if (b.step or 0) >= fraction * STEPS)
        found = forecast(beat, now=beat.time or 0.0)
        assert found is not None and found.end is not None
        assert abs(found.end - end) <= 0.2 * (end - (beat.time or 0.0)), (fraction, found)
    # The piece's average, the same heartbeat at a quarter: more than half the time left off.
    quarter = next(b for b in beats if (b.step or 0) >= STEPS / 4)
    assert _off(quarter, end, piece_steps_per_s(quarter)) > 0.5


@pytest.mark.parametrize(
    ("epoch_steps", "pause_s"),
    [(0, 0.0), (500, 1.0), (2000, 2.0)],  # no pauses; validations of 1 s or 2 s an epoch
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_steady_rate_with_noise_and_pauses_stays_within_a_few_percent(
    tmp_path: Path, seed: int, epoch_steps: int, pause_s: float
) -> None:
    noise = _noise(seed)

    def step_s(step: int) -> float:
        pause = pause_s if epoch_steps and step % epoch_steps == 0 else 0.0
        return noise(1 / 40) / 40 + pause

    beats, end = _timeline(tmp_path, step_s)
    seen = [b for b in beats if 0.1 * STEPS <= (b.step or 0) <= 0.9 * STEPS]
    worst = max(abs(_off(b, end, steps_per_s(b))) for b in seen)
    assert worst <= 0.06
    # The same heartbeats' last interval alone swings further: the noise is there to steady.
    last = max(abs(_off(b, end, (b.samples_per_s or 0) / 1000)) for b in seen)
    assert last > worst + 0.02
