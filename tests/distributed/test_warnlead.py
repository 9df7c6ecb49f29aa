"""The warning lead that fits: the job's end from SLURM, the measured checkpoint, and the
early checkpoint where SLURM's warning would come too late for it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from hpcdist.distributed import warnlead
from hpcdist.distributed.warnlead import EarlyCheckpoint, job_end_time, stop_at
from hpcdist.facts.leads import CheckpointTiming, needed_lead_s, signal_lead_s
from hpcdist.slurm import control


@pytest.mark.parametrize(
    ("signal", "lead"),
    [("USR2@90", 90), ("B:USR1@10", 10), ("USR2", 60), (None, None), ("USR2@x", None)],
)
def test_signal_lead_of_the_flag(signal: str | None, lead: int | None) -> None:
    assert signal_lead_s(signal) == lead


def test_needed_lead_is_the_checkpoint_plus_a_margin_of_at_least_5_s() -> None:
    assert needed_lead_s(4.0) == 9.0
    assert needed_lead_s(40.0) == 50.0


def test_end_time_from_scontrol_and_from_slurm_job_end_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = "   StartTime=2026-11-27T18:18:06 EndTime=2026-11-27T18:19:06 Deadline=N/A\n"
    expected = datetime(2026, 11, 27, 18, 19, 6).timestamp()
    assert control.end_time(shown) == expected
    assert control.end_time("EndTime=Unknown") is None
    assert job_end_time({"SLURM_JOB_END_TIME": "1764267546"}) == 1764267546.0
    monkeypatch.setattr(control, "has_scontrol", lambda: True)
    monkeypatch.setattr(control, "_show_job", lambda job: shown if job == "5" else "")
    assert job_end_time({"SLURM_JOB_ID": "5"}) == expected
    assert job_end_time({}) is None


def _watch(lead: float, seconds: float | None) -> tuple[EarlyCheckpoint, list[str]]:
    said: list[str] = []
    stops: list[bool] = []
    watch = EarlyCheckpoint(
        end=1000.0,
        lead_s=lead,
        measure=lambda: seconds,
        stop=lambda: stops.append(True),
        say=said.append,
    )
    return watch, said


def test_a_checkpoint_longer_than_the_lead_stops_at_the_end_minus_two_of_it() -> None:
    watch, said = _watch(lead=10, seconds=40.0)
    due = stop_at(1000.0, 40.0)
    assert due == 1000.0 - 40.0 - 50.0  # one write just begun, the stop's, the margin
    assert not watch.check(due - 0.5)
    assert "shorter than the last checkpoint (40.0 s)" in said[0]
    assert watch.check(due) and watch.fired
    assert "checkpointing early, 90 s before SLURM ends the job" in said[-1]
    assert watch.check(due + 100) and len(said) == 2  # once


@pytest.mark.parametrize(("lead", "fires"), [(50, False), (49, True)])
def test_a_lead_that_fits_the_checkpoint_leaves_the_stop_to_the_warning(
    lead: int, fires: bool
) -> None:
    watch, said = _watch(lead=lead, seconds=40.0)
    assert watch.check(999.0) is fires
    assert bool(said) is fires


def test_nothing_measured_yet_means_no_early_stop() -> None:
    watch, said = _watch(lead=10, seconds=None)
    assert not watch.check(999.0) and said == []


def test_watch_needs_a_lead_and_an_end(monkeypatch: pytest.MonkeyPatch) -> None:
    assert warnlead.watch_job_end({}, lambda: 1.0, lambda: None) is None
    env = {"HPCDIST_SIGNAL_LEAD": "10"}
    monkeypatch.setattr(warnlead, "job_end_time", lambda env: None)
    assert warnlead.watch_job_end(env, lambda: 1.0, lambda: None) is None


def test_recorded_checkpoint_time_round_trips_through_the_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    run = tmp_path / "runs" / "12"
    run.mkdir(parents=True)
    assert warnlead.last_checkpoint_time(run) is None
    warnlead.record_checkpoint_time(run, CheckpointTiming(12.5, 1.0e9, 3))
    assert warnlead.last_checkpoint_time(run) == CheckpointTiming(12.5, 1.0e9, 3)
    # Changed behind the training's back: its digest no longer matches, so it is not used.
    (run / "checkpoint_timing.json").write_text('{"seconds": 0.1, "written_at": 1}')
    assert warnlead.last_checkpoint_time(run) is None


@pytest.mark.parametrize(
    "data",
    [{"seconds": -1, "written_at": 1}, {"seconds": "x", "written_at": 1}, [], {"seconds": 1}],
)
def test_a_timing_record_that_is_none_is_refused(data: object) -> None:
    assert CheckpointTiming.from_dict(data) is None
