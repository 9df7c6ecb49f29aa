"""Every start of a requeued job (hpcdist.slurm.query.job_attempts): the database's rows of
the ended starts, the controller's view of the latest, and each one's wait in the queue."""

from __future__ import annotations

import time

import pytest

from hpcdist.slurm import query


def _ts(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


SACCT = [
    {"JobID": "41", "State": "REQUEUED", "Submit": "2026-11-27T18:26:20",
     "Start": "2026-11-27T18:26:22", "End": "2026-11-27T18:26:27", "Elapsed": "00:00:05",
     "Timelimit": "00:20:00", "NodeList": "node[1-2]"},
    {"JobID": "41.0", "State": "CANCELLED", "Submit": "2026-11-27T18:26:22"},
    {"JobID": "41", "State": "RUNNING", "Submit": "2026-11-27T18:26:28",
     "Start": "2026-11-27T18:28:33", "End": "Unknown", "Elapsed": "00:00:01",
     "Timelimit": "00:20:00", "NodeList": "node[3-4]"},
]  # fmt: skip
LIVE = {"JobId": "41", "JobState": "RUNNING", "SubmitTime": "2026-11-27T18:26:28",
        "StartTime": "2026-11-27T18:28:33", "EndTime": "2026-11-27T18:48:33",
        "RunTime": "00:00:09", "TimeLimit": "00:20:00", "NodeList": "node[3-4]"}  # fmt: skip


def test_a_requeued_running_job_has_its_ended_start_and_the_controllers_latest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(query, "sacct_rows", lambda job: SACCT)
    monkeypatch.setattr(query, "scontrol_records", lambda job: [LIVE])
    first, now = query.job_attempts("41")
    assert (first.state, first.queued_s, first.elapsed_s) == ("REQUEUED", 2.0, 5.0)
    assert first.end == _ts("2026-11-27T18:26:27")
    # The second start waited from the requeue (its submit) to its start: 2 min 5 s.
    assert (now.state, now.queued_s, now.elapsed_s) == ("RUNNING", 125.0, 9.0)
    assert now.end == _ts("2026-11-27T18:48:33") and now.limit_s == 1200.0


def test_once_the_controller_forgot_it_the_database_has_every_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ended = [*SACCT[:2], {**SACCT[2], "State": "COMPLETED", "End": "2026-11-27T18:29:00"}]
    monkeypatch.setattr(query, "sacct_rows", lambda job: ended)
    monkeypatch.setattr(query, "scontrol_records", lambda job: [])
    states = [a.state for a in query.job_attempts("41")]
    assert states == ["REQUEUED", "COMPLETED"]


def test_a_pending_start_has_not_waited_yet() -> None:
    pending = query.Attempt("41", "PENDING", 10.0, 50.0, None, None, 60.0, None)
    assert pending.queued_s is None
    started = query.Attempt("41", "RUNNING", 10.0, 9.0, None, 0.0, 60.0, "n1")
    assert started.queued_s == 0.0  # a start before the submit (clock skew) is no wait


@pytest.mark.parametrize("text", ["Unknown", "None", "", "(null)", "yesterday"])
def test_times_slurm_does_not_know_are_none(text: str) -> None:
    assert query.parse_time(text) is None
