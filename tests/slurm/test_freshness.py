"""The words beside a state: its age past 10 s, the controller's silence, never a guess."""

from __future__ import annotations

import time

import pytest

from hpcdist.slurm.freshness import FRESH_S, UNANSWERED, Seen, clock, shown

AT = time.mktime(time.strptime("2026-12-07T12:02:58", "%Y-%m-%dT%H:%M:%S"))


def test_clock_is_the_local_time_of_day() -> None:
    assert clock(AT) == "12:02:58"


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        (0.0, "RUNNING"),
        (FRESH_S, "RUNNING"),
        (FRESH_S + 0.6, "RUNNING (as of 12:02:58, 11 s ago)"),
        (40.0, "RUNNING (as of 12:02:58, 40 s ago)"),
    ],
)
def test_a_state_older_than_ten_seconds_says_when_it_was_seen(age_s: float, expected: str) -> None:
    assert shown("RUNNING", Seen(AT), AT + age_s) == expected


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"])
def test_a_final_state_is_true_however_old(state: str) -> None:
    assert shown(state, Seen(AT), AT + 3600) == state
    assert shown(state, Seen(AT, silent_since=AT + 12), AT + 3600) == state


@pytest.mark.parametrize("age_s", [1.0, FRESH_S + 1])
def test_a_silent_controller_is_said_with_the_last_state_it_gave(age_s: float) -> None:
    seen = Seen(AT, silent_since=AT + 12)
    assert shown("RUNNING", seen, AT + age_s) == (
        "RUNNING (controller not answering since 12:03:10; last seen RUNNING at 12:02:58)"
    )


def test_a_job_the_silent_controller_never_described_has_no_state() -> None:
    expected = (
        f"{UNANSWERED} (controller not answering since 12:03:10; "
        "job not seen since it was submitted)"
    )
    assert shown(UNANSWERED, Seen(None, silent_since=AT + 12), AT + 20) == expected
    assert shown(UNANSWERED, Seen(AT, silent_since=AT + 12), AT + 20) == expected


def test_no_view_means_asked_now() -> None:
    assert shown("PENDING", None, AT + 1000) == "PENDING"
    assert shown("PENDING", Seen(None), AT + 1000) == "PENDING"
