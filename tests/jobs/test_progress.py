"""The arithmetic of `hpcdist status`'s progress: rate, predicted end, whether the run fits
in the time limit or how many more jobs it needs, and when a heartbeat is too old."""

from __future__ import annotations

import pytest

from hpcdist.facts.heartbeat import STALE_AFTER_S, Heartbeat
from hpcdist.jobs.progress import forecast, pieces_needed, steps_per_s


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
