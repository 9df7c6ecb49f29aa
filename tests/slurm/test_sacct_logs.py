"""Log paths from sacct: SLURM >= 23.02 keeps StdOut/StdErr as the patterns the job gave
(``/w/%x-%j.out``); scontrol and the files on disk have them expanded."""

from __future__ import annotations

import pytest

from hpcdist.slurm.query import current_reason, from_sacct, sacct_log_path

ROW = {
    "JobID": "4711",
    "JobIDRaw": "4711",
    "JobName": "train",
    "User": "alice",
    "NodeList": "gpu-[07-08]",
    "State": "COMPLETED",
    "ExitCode": "0:0",
    "WorkDir": "/w",
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/w/%x-%j.out", "/w/train-4711.out"),  # what 23.02+ sacct prints
        ("/w/train-4711.out", "/w/train-4711.out"),  # already a file name
        ("/w/slurm-%j.out", "/w/slurm-4711.out"),  # sbatch's default
        ("/w/%u/%N-%n-%8j.log", "/w/alice/gpu-07-0-00004711.log"),
        ("/w/100%%-%j.out", "/w/100%-4711.out"),
        ("/w/%x-%j-%t.out", "/w/train-4711-%t.out"),  # the task stays for the rank's reader
        ("", None),
        (None, None),
    ],
)
def test_sacct_patterns_are_expanded_as_slurm_does(value: str | None, expected: str | None) -> None:
    assert sacct_log_path(value, ROW) == expected


def test_array_task_ids_come_from_the_task_row() -> None:
    row = {**ROW, "JobID": "4711_3", "JobIDRaw": "4714"}
    assert sacct_log_path("/w/%A_%a-%j.out", row) == "/w/4711_3-4714.out"


def test_a_forgotten_jobs_stdout_is_the_expanded_file() -> None:
    rows = [{**ROW, "StdOut": "/w/%x-%j.out", "StdErr": "/w/%x-%j.err"}]
    info = from_sacct(rows, "4711")
    assert info is not None
    assert (info.stdout, info.stderr) == ("/w/train-4711.out", "/w/train-4711.err")


@pytest.mark.parametrize(
    ("state", "reason", "shown"),
    [
        ("PENDING", "Resources", "Resources"),
        ("PENDING", "Dependency (afterok:5(unfulfilled))", "Dependency (afterok:5(unfulfilled))"),
        ("REQUEUE_HOLD", "JobHeldAdmin", "JobHeldAdmin"),
        ("CANCELLED", "Resources", None),  # cancelled while it waited: nothing to wait for
        ("COMPLETED", "Priority", None),
        ("RUNNING", "BeginTime (starts no earlier than 2026-11-27T10:00:00)", None),
        ("CANCELLED", "Dependency", None),
        ("FAILED", "NonZeroExitCode", "NonZeroExitCode"),  # why it ended stays
        ("CANCELLED", "DependencyNeverSatisfied", "DependencyNeverSatisfied"),
        ("NODE_FAIL", "NodeDown", "NodeDown"),
        ("TIMEOUT", "TimeLimit", "TimeLimit"),
    ],
)
def test_a_waiting_reason_is_shown_only_while_the_job_waits(
    state: str, reason: str, shown: str | None
) -> None:
    assert current_reason(state, reason) == shown
    rows = [{"JobID": "5", "State": state, "Reason": reason, "ExitCode": "0:0"}]
    info = from_sacct(rows, "5")
    assert info is not None and info.reason == shown
