"""Parsing scontrol and sacct output: captured from the SLURM 22.05 testbed
(tests/fixtures/slurm), plus generated Key=value lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdist.slurm.parse import (
    SlurmOutputError,
    base_state,
    format_duration,
    parse_duration,
    parse_exit_code,
    parse_key_values,
    parse_memory_mb,
    parse_sacct,
    parse_scontrol_records,
)
from hpcdist.slurm.query import (
    JobSummary,
    accounted_summaries,
    from_sacct,
    from_scontrol,
    merge_summaries,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def _scontrol(job_id: str) -> list[dict[str, str]]:
    return parse_scontrol_records((FIXTURES / f"scontrol_{job_id}.txt").read_text())


def _sacct(job_id: str) -> list[dict[str, str]]:
    return parse_sacct((FIXTURES / f"sacct_{job_id}.txt").read_text())


@pytest.mark.parametrize(
    ("job_id", "state", "reason", "nodes", "elapsed", "limit", "exit_code", "signal", "stdout"),
    [
        (
            "9569844",
            "COMPLETED",
            None,
            "node[3-4]",
            4.0,
            1800.0,
            0,
            0,
            "/tmp/jobsfx/hpcdist-commcheck-9569844.out",
        ),
        (
            "9569845",
            "PENDING",
            "BeginTime (starts no earlier than 2026-11-26T11:20:51)",
            None,
            0.0,
            None,
            0,
            0,
            "/tmp/jobsfx/held-9569845.out",
        ),
        (
            "9569850",
            "TIMEOUT",
            "TimeLimit",
            "node1",
            87.0,
            60.0,
            0,
            15,
            "/tmp/jobsfx/to-9569850.out",
        ),
        (
            "9569851",
            "FAILED",
            "NonZeroExitCode",
            "node2",
            0.0,
            None,
            3,
            0,
            "/tmp/jobsfx/fail-9569851.out",
        ),
        (
            "9569852",
            "FAILED",
            "JobLaunchFailure",
            "node3",
            0.0,
            None,
            0,
            9,
            "/tmp/jobsfx/kill-9569852.out",
        ),
    ],
    ids=["completed", "held", "timeout", "exit-3", "killed"],
)
def test_scontrol_records_of_the_testbed(
    job_id: str,
    state: str,
    reason: str | None,
    nodes: str | None,
    elapsed: float,
    limit: float | None,
    exit_code: int,
    signal: int,
    stdout: str,
) -> None:
    (record,) = _scontrol(job_id)
    info = from_scontrol(record)
    assert (info.job_id, info.state, info.reason, info.nodes) == (job_id, state, reason, nodes)
    assert (info.elapsed_s, info.limit_s) == (elapsed, limit)
    assert (info.exit_code, info.signal, info.restarts) == (exit_code, signal, 0)
    assert info.stdout == stdout


def test_scontrol_values_with_equals_signs_and_empty_values_stay_whole() -> None:
    (record,) = _scontrol("9569844")
    assert record["TRES"] == "cpu=4,node=2,billing=4"
    assert record["NtasksPerN:B:S:C"] == "1:0:*:*"
    assert record["CPUs/Task"] == "2"
    assert record["Power"] == ""
    assert record["Command"] == "/work/wt-jobs/hpc/test_distributed.sh"


def test_array_tasks_are_named_job_underscore_task() -> None:
    records = _scontrol("9569846")
    assert sorted(from_scontrol(r).job_id for r in records) == ["9569846_0", "9569846_1"]
    (one,) = _scontrol("9569846_1")
    assert from_scontrol(one).stdout == "/tmp/jobsfx/arr-9569846_1.out"


def test_sacct_rows_of_the_testbed() -> None:
    rows = _sacct("9569844")
    assert [row["JobID"] for row in rows] == ["9569844", "9569844.batch", "9569844.0"]
    info = from_sacct(rows, "9569844")
    assert info is not None
    assert (info.state, info.exit_code, info.elapsed_s, info.limit_s, info.num_nodes) == (
        "COMPLETED",
        0,
        4.0,
        1800.0,
        2,
    )
    pending = from_sacct(_sacct("9569845"), "9569845")
    assert pending is not None and (pending.nodes, pending.reason) == (None, "BeginTime")
    assert pending.limit_s is None  # Partition_Limit
    assert from_sacct(rows, "123") is None


def test_sacct_counts_requeued_attempts_as_restarts() -> None:
    rows = parse_sacct(
        "JobID|State|ExitCode|Elapsed|Timelimit|NNodes\n"
        "77|REQUEUED|0:15|00:01:00|00:10:00|1\n"
        "77.batch|CANCELLED|0:15|00:01:00||1\n"
        "77|COMPLETED|0:0|00:02:00|00:10:00|1\n"
    )
    info = from_sacct(rows, "77")
    assert info is not None and (info.state, info.restarts, info.elapsed_s) == ("COMPLETED", 1, 120)


def test_sacct_row_with_a_missing_field_is_an_error_quoting_it() -> None:
    with pytest.raises(SlurmOutputError, match=r"'1\|COMPLETED' has 2 fields; expected 3"):
        parse_sacct("JobID|State|Elapsed\n1|COMPLETED\n")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1-02:03:04", 93784),
        ("02:03:04", 7384),
        ("03:04", 184),
        ("03:04.512", 184.512),
        ("00:00:00", 0),
        ("4", 4),
        ("UNLIMITED", None),
        ("Partition_Limit", None),
        ("", None),
    ],
)
def test_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "ab", "1.5:00", "-1"])
def test_bad_duration_quotes_it(text: str) -> None:
    with pytest.raises(SlurmOutputError, match=repr(text)):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10 * 86400))
def test_format_then_parse_duration_round_trips(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "bare", "expected"),
    [
        ("4000M", "M", (4000.0, "job")),
        ("1.5G", "M", (1536.0, "job")),
        ("2000Mn", "M", (2000.0, "node")),
        ("500Mc", "M", (500.0, "cpu")),
        ("1048576K", "K", (1024.0, "job")),
        ("0", "K", (0.0, "job")),
        ("", "M", None),
    ],
)
def test_memory_sizes(text: str, bare: str, expected: tuple[float, str] | None) -> None:
    assert parse_memory_mb(text, bare_unit=bare) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("0:0", (0, 0)), ("3:0", (3, 0)), ("0:9", (0, 9)), ("0:15", (0, 15))]
)
def test_exit_codes(text: str, expected: tuple[int, int]) -> None:
    assert parse_exit_code(text) == expected


def test_cancelled_by_uid_is_cancelled() -> None:
    assert base_state("CANCELLED by 0") == "CANCELLED"


def test_queue_view_wins_over_the_lagging_database_newest_first() -> None:
    live = [JobSummary("12", "RUNNING", 5.0, "a")]
    accounted = [
        JobSummary("12", "PENDING", 0.0, "a"),
        JobSummary("9_1", "COMPLETED", 1, "b"),
        JobSummary("100", "FAILED", 2, "c"),
    ]
    merged = merge_summaries(live, accounted)
    assert [(job.job_id, job.state) for job in merged] == [
        ("100", "FAILED"),
        ("12", "RUNNING"),
        ("9_1", "COMPLETED"),
    ]


_KEYS = st.from_regex(r"[A-Za-z][A-Za-z0-9_/:]{0,12}", fullmatch=True)
# A value: words without whitespace ('=' and ',' allowed, as in TRES=cpu=4,node=2); words
# after a space hold no '=', or they would read as a new pair (as in SLURM's own output).
_FIRST_WORD = st.text(st.characters(blacklist_categories=("Z", "C")), max_size=20)
_MORE_WORDS = st.lists(
    st.text(
        st.characters(blacklist_categories=("Z", "C"), blacklist_characters="="),
        min_size=1,
        max_size=8,
    ),
    max_size=2,
)
_VALUES = st.builds(
    lambda first, more: " ".join([first, *more]) if first else first, _FIRST_WORD, _MORE_WORDS
)


@given(st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=12))
def test_generated_key_value_lines_parse_back(pairs: dict[str, str]) -> None:
    line = " ".join(f"{key}={value}" for key, value in pairs.items())
    assert parse_key_values(line) == pairs


@pytest.mark.parametrize("line", ["no pairs here", "junk JobId=1"])
def test_lines_without_pairs_are_errors(line: str) -> None:
    with pytest.raises(SlurmOutputError, match="scontrol -o"):
        parse_key_values(line)


def test_a_requeued_jobs_time_is_every_starts_and_the_queue_adds_the_latest() -> None:
    # sacct -D: a row per start, the latest last (REQUEUED, then the run going on).
    text = "41|REQUEUED|00:05:00|train\n41|RUNNING|00:03:00|train\n42|COMPLETED|00:01:00|x\n"
    accounted = {job.job_id: job for job in accounted_summaries(text)}
    assert accounted["41"] == JobSummary("41", "RUNNING", 480.0, "train", 2, 300.0)
    assert accounted["42"] == JobSummary("42", "COMPLETED", 60.0, "x", 1, 0.0)
    # The queue's view of the running start (3:20 now) plus the 5 minutes before it.
    live = [JobSummary("41", "RUNNING", 200.0, "train")]
    merged = {job.job_id: job for job in merge_summaries(live, list(accounted.values()))}
    assert merged["41"] == JobSummary("41", "RUNNING", 500.0, "train", 2, 300.0)
    one = merge_summaries([JobSummary("42", "RUNNING", 7.0, "x")], [accounted["42"]])
    assert one == [JobSummary("42", "RUNNING", 7.0, "x")]  # one start: the queue's time
