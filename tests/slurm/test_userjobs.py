"""The user's shared view of their jobs: one scontrol per interval for every process, a pause
when the controller refuses, private and atomic on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdist.errors import UserError
from hpcdist.slurm import userjobs
from hpcdist.slurm.query import from_scontrol, view_record
from hpcdist.slurm.userjobs import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    Runner,
    SharedView,
    interval_s,
    merge_rows,
    parse_rows,
    rows_of,
)

SUBMITTED = "2026-11-27T12:00:00"
T0 = time.mktime(time.strptime(SUBMITTED, "%Y-%m-%dT%H:%M:%S"))


def line(job: str, state: str = "RUNNING", uid: int | None = None, **extra: str) -> str:
    """One record of ``scontrol -o show job`` as SLURM prints it: ``123_4`` a started task,
    ``123_[5-7]`` an array's pending tasks (one record), ``99`` a job; this user's."""
    head, _, task = job.partition("_")
    task = task.strip("[]")
    fields = {
        "JobId": str(int(head) + int(task) + 1) if task.isdigit() else head,
        **({"ArrayJobId": head, "ArrayTaskId": task} if task else {}),
        "JobName": "train",
        "UserId": f"alice({os.getuid() if uid is None else uid})",
        "JobState": state,
        "Reason": "None",
        "Dependency": "(null)",
        "Restarts": "0",
        "ExitCode": "0:0",
        "RunTime": "00:01:05",
        "TimeLimit": "UNLIMITED",
        "SubmitTime": SUBMITTED,
        "NodeList": "node1",
        "NumNodes": "1",
        "WorkDir": "/w",
        "StdErr": f"/w/train-{head}_{task if task.isdigit() else '4294967294'}.out",
        "StdOut": f"/w/train-{head}_{task if task.isdigit() else '4294967294'}.out",
    }
    fields.update(extra)
    return " ".join(f"{key}={value}" for key, value in fields.items())


def test_scontrol_records_become_the_users_rows() -> None:
    rows = parse_rows(line("123_4", "FAILED", ExitCode="3:0", JobName="a|b c") + "\n")
    info = from_scontrol(view_record(rows[0]))
    assert (info.job_id, info.state, info.exit_code, info.signal) == ("123_4", "FAILED", 3, 0)
    assert info.name == "a|b c"
    assert info.stdout == "/w/train-123_4.out"
    assert info.elapsed_s == 65.0
    killed = from_scontrol(view_record(parse_rows(line("7", "CANCELLED", ExitCode="0:9"))[0]))
    assert (killed.job_id, killed.exit_code, killed.signal) == ("7", 0, 9)


def test_an_arrays_pending_tasks_become_a_row_each_and_other_users_none() -> None:
    text = "\n".join(
        [
            line("8_[1-3,5]", "PENDING"),
            line("8_0"),
            line("9", uid=os.getuid() + 1),  # another user's job, shown without PrivateData
            line("10", uid=os.getuid() + 10),  # a uid that ends in this user's digits
        ]
    )
    rows = parse_rows(text)
    assert [(r["JobArrayID"], r["State"]) for r in rows] == [
        ("8_1", "PENDING"),
        ("8_2", "PENDING"),
        ("8_3", "PENDING"),
        ("8_5", "PENDING"),
        ("8_0", "RUNNING"),
    ]
    assert rows[1]["STDOUT"] == "/w/train-8_2.out"  # scontrol's %a of a pending task, mended
    assert rows[1]["JobID"] == "8"
    assert parse_rows("No jobs in the system\n") == []


def test_another_users_record_that_spells_this_users_id_is_left_out() -> None:
    me = os.getuid()
    name = f"x UserId=alice({me}) JobState=COMPLETED"
    disguised = line("12", "PENDING", uid=me + 1, JobName=name)
    assert disguised.index(f"alice({me})") < disguised.index(f"alice({me + 1})")  # name first
    in_command = line("13", uid=me + 1) + f" Command=/bin/true UserId=alice({me})"
    assert parse_rows("\n".join([disguised, in_command, line("14")])) == parse_rows(line("14"))
    assert [r["JobArrayID"] for r in parse_rows(line("14"))] == ["14"]


def test_rows_of_an_array_a_task_and_a_job() -> None:
    rows = parse_rows("\n".join([line("123_0"), line("123_1"), line("99")]))
    assert [r["JobArrayID"] for r in rows_of(rows, "123")] == ["123_0", "123_1"]
    assert [r["JobArrayID"] for r in rows_of(rows, "123_1")] == ["123_1"]
    assert [r["JobArrayID"] for r in rows_of(rows, "99")] == ["99"]
    assert rows_of(rows, "12") == []


@pytest.mark.parametrize(
    ("age_s", "call_s", "expected"),
    [
        (0.0, 0.0, MIN_INTERVAL_S),
        (2 * MIN_INTERVAL_S, 0.0, MIN_INTERVAL_S),
        (2 * MIN_INTERVAL_S + 2, 0.0, MIN_INTERVAL_S + 1),
        (2 * MAX_INTERVAL_S - 2, 0.0, MAX_INTERVAL_S - 1),
        (2 * MAX_INTERVAL_S, 0.0, MAX_INTERVAL_S),
        (2 * MAX_INTERVAL_S + 10, 0.0, MAX_INTERVAL_S),
        (0.0, 3.0, 30.0),
    ],
)
def test_interval_is_half_the_youngest_jobs_age_within_bounds(
    age_s: float, call_s: float, expected: float
) -> None:
    rows = parse_rows(line("5"))
    assert interval_s(rows, T0 + age_s, call_s) == pytest.approx(expected)


def test_an_ended_job_does_not_keep_the_view_young() -> None:
    rows = parse_rows("\n".join([line("5", "COMPLETED"), line("6", "PENDING")]))
    assert interval_s(rows[:1], T0 + 1, 0.0) == MAX_INTERVAL_S
    assert interval_s(rows, T0 + 1, 0.0) == MIN_INTERVAL_S


def test_forgotten_ended_tasks_stay_running_ones_do_not() -> None:
    old = parse_rows("\n".join([line("8_0", "COMPLETED"), line("8_1", "RUNNING"), line("8_2")]))
    new = parse_rows(line("8_2", "COMPLETED"))
    merged = {r["JobArrayID"]: r["State"] for r in merge_rows(old, new, T0 + 60)}
    assert merged == {"8_0": "COMPLETED", "8_2": "COMPLETED"}
    assert merge_rows(old, new, T0 + userjobs.KEEP_ENDED_S + 1) == new


class FakeScontrol:
    """The controller: ``scontrol -o show job`` answers ``text`` (``calls`` counts these
    looks); a job asked by number (``asks``) answers its own records of ``text``, and
    ``squeue --me`` lists the user's jobs and tasks of it by number (``listings``)."""

    def __init__(self, text: str, code: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.asks: list[list[str]] = []
        self.listings: list[list[str]] = []
        self.text, self.code = text, code
        self.config, self.configs = "", 0

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            self.listings.append(argv)
            ids = "".join(f"{row['JobArrayID']}\n" for row in parse_rows(self.text))
            return subprocess.CompletedProcess(argv, self.code, ids, "")
        if argv == ["scontrol", "show", "config"]:
            self.configs += 1
            return subprocess.CompletedProcess(argv, 0, self.config, "")
        if argv != userjobs.view_argv():
            self.asks.append(argv)
            head = f"JobId={argv[-1]} "
            own = [one for one in self.text.splitlines() if one.startswith(head)]
            own += [one for one in self.text.splitlines() if f" ArrayJobId={argv[-1]} " in one]
            return subprocess.CompletedProcess(argv, self.code, "\n".join(dict.fromkeys(own)), "")
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, self.code, self.text, "")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_readers_share_one_answer_per_interval(tmp_path: Path) -> None:
    # Asked 40 s after the job's submission: asked again once the view is older than half
    # the job's age, 80 s after the submission (twice as old).
    scontrol, clock = FakeScontrol(line("5")), Clock(T0 + 40)
    views = [SharedView(tmp_path / "v" / "view.json", scontrol, clock) for _ in range(10)]
    for view in views:
        assert [r["JobArrayID"] for r in view.rows()] == ["5"]
    assert len(scontrol.calls) == 1
    clock.now = T0 + 80
    assert all(view.rows() for view in views)
    assert len(scontrol.calls) == 1  # exactly half its age: still fresh
    clock.now += 1
    assert all(view.rows() for view in views)
    assert len(scontrol.calls) == 2


def test_a_new_job_or_a_submit_asks_again_after_the_minimum(tmp_path: Path) -> None:
    scontrol, clock = FakeScontrol(line("5")), Clock(T0 + 100)
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    for job in (None, "6", "4"):  # this process follows them from now on
        view.rows(newer_than=job)
    assert len(scontrol.calls) == 1
    clock.now += MIN_INTERVAL_S
    view.rows(newer_than="6")
    assert len(scontrol.calls) == 1
    clock.now += 0.5
    view.rows(newer_than="4")  # an older id the view lacks: another user's, or forgotten
    assert len(scontrol.calls) == 1
    view.rows(newer_than="6")
    assert len(scontrol.calls) == 2
    view.mark_stale()
    view.rows()
    assert len(scontrol.calls) == 3  # at once: the job just submitted is asked about next
    view.rows()
    assert len(scontrol.calls) == 3


def test_a_commands_first_question_sees_the_job_now_once_per_period(tmp_path: Path) -> None:
    start = T0 + 1000  # the job's age gives the longest interval
    scontrol, clock = FakeScontrol(line("5")), Clock(start)
    path = tmp_path / "view.json"
    follower = SharedView(path, scontrol, clock)  # `logs --follow`: asks again and again

    def command(job: str) -> None:  # one `hpcdist status JOB`: a process of its own
        SharedView(path, scontrol, clock).rows(newer_than=job)

    def follow_until(until: float) -> None:
        while clock.now < until:
            clock.now = min(until, clock.now + 10)
            follower.rows(newer_than="5")

    command("5")
    clock.now += userjobs.ONE_SHOT_AGE_S + 0.5
    command("5")
    command("5_3")  # a task of the same array: the array had its look
    assert len(scontrol.calls) == 1
    follow_until(start + userjobs.ONE_SHOT_EVERY_S - 1)  # a look each longest interval
    follows = len(scontrol.calls)
    assert follows == 1 + int((userjobs.ONE_SHOT_EVERY_S - 1) // MAX_INTERVAL_S)
    command("5_3")  # the view is older than a fresh look's, but the array had one lately
    assert len(scontrol.calls) == follows
    clock.now = start + userjobs.ONE_SHOT_EVERY_S + 0.5
    command("5_3")
    assert len(scontrol.calls) == follows + 1
    command("5")
    clock.now += 10
    follower.rows(newer_than="5")  # following: the interval
    assert len(scontrol.calls) == follows + 1


def test_a_refusing_controller_is_left_alone_for_a_growing_pause(tmp_path: Path) -> None:
    scontrol, clock = FakeScontrol("", code=1), Clock(T0)
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    view.rows()
    clock.now += userjobs.BACKOFF_S - 0.5
    view.rows()
    assert len(scontrol.calls) == 1
    clock.now += 1
    view.rows()
    assert len(scontrol.calls) == 2
    clock.now += 2 * userjobs.BACKOFF_S - 0.5  # the second pause is twice the first
    view.rows()
    assert len(scontrol.calls) == 2
    assert view.answer(["scontrol", "show", "job", "5"]).returncode == 1
    assert len(scontrol.calls) == 2


def test_a_view_file_others_can_write_is_refused(tmp_path: Path) -> None:
    view = SharedView(tmp_path / "view.json", FakeScontrol(line("5")), Clock(T0))
    view.rows()
    os.chmod(view.path, 0o666)
    with pytest.raises(UserError, match="writable by"):
        SharedView(view.path, FakeScontrol(line("5")), Clock(T0 + 1000)).rows()
    assert (os.stat(view.path.parent).st_mode & 0o777) == 0o700


_READER = """
import sys
from pathlib import Path
from hpcdist.slurm.userjobs import SharedView
from hpcdist.slurm.tools import slurm_tool
view = SharedView(Path(sys.argv[1]), slurm_tool)
for _ in range(5):
    assert view.rows()
"""


def test_processes_at_once_ask_scontrol_once(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "scontrol"
    # The look (`scontrol -o show job`) counted; the job asked by its number after it not.
    look = f'[ "$#" -eq 3 ] && echo x >> {calls}'
    fake.write_text(f"#!/bin/sh\n{look}\nsleep 0.3\nprintf '%s\\n' '{line('5')}'\n")
    fake.chmod(0o755)
    listing = bin_dir / "squeue"  # the controller's listing of the user's jobs by number
    listing.write_text("#!/bin/sh\necho 5\n")
    listing.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    view = tmp_path / "state" / "view.json"
    procs = [
        subprocess.Popen([sys.executable, "-c", _READER, str(view)], env=env) for _ in range(6)
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0] * 6
    assert calls.read_text().count("x") == 1


@pytest.mark.parametrize(
    ("tasks", "shown"),
    [
        ([("5_0", "RUNNING"), ("5_1", "PENDING"), ("5_2", "PENDING")], ["5_0", "5_[1-2]"]),
        ([("5_1", "PENDING"), ("5_2", "PENDING"), ("5_4", "PENDING")], ["5_[1-2,4]"]),
        ([("6_3", "PENDING"), ("7", "PENDING")], ["7", "6_3"]),
    ],
)
def test_list_folds_an_arrays_pending_tasks_as_squeue_does(
    tasks: list[tuple[str, str]], shown: list[str]
) -> None:
    from hpcdist.slurm.query import JobSummary, fold_pending

    jobs = [JobSummary(job, state, 0.0, "sweep") for job, state in tasks]
    assert [job.job_id for job in fold_pending(jobs)] == shown


def test_a_running_jobs_time_used_is_brought_up_to_now() -> None:
    from hpcdist.slurm.userjobs import _aged, _seconds

    assert [_seconds(t) for t in ("1:05", "2:01:05", "1-00:00:01", "N/A")] == [
        65,
        7265,
        86401,
        None,
    ]
    assert _aged({"TimeUsed": "1:05"}, 10.4)["TimeUsed"] == "75"
    assert _aged({"TimeUsed": "INVALID"}, 10.4)["TimeUsed"] == "INVALID"


class StalledScontrol(FakeScontrol):
    """A controller that answers ``text`` or, while ``stalled``, fails after ``hang_s``
    (scontrol's own timeout), the clock moved on by that much."""

    def __init__(self, text: str, clock: Clock, hang_s: float = 20.0) -> None:
        super().__init__(text)
        self.clock, self.hang_s, self.stalled = clock, hang_s, False

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if not self.stalled:
            return super().__call__(argv)
        self.calls.append(argv)
        self.clock.now += self.hang_s
        return subprocess.CompletedProcess(argv, 1, "", "Socket timed out on send/recv")


def test_a_failed_look_is_silence_from_when_it_began_until_an_answer(tmp_path: Path) -> None:
    clock = Clock(T0 + 100)
    scontrol = StalledScontrol(line("5"), clock)
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    view.rows(newer_than="5")
    assert view.seen() == userjobs.Seen(T0 + 100, None)
    scontrol.stalled = True
    clock.now = T0 + 250  # the view is older than half the job's age: asked again
    rows = view.rows(newer_than="5")
    assert [(r["JobArrayID"], r["State"]) for r in rows] == [("5", "RUNNING")]  # kept
    assert view.seen() == userjobs.Seen(T0 + 100, T0 + 250)
    clock.now += userjobs.BACKOFF_S + 1
    view.rows(newer_than="5")  # failed again: silent since the first failed look
    assert view.seen() == userjobs.Seen(T0 + 100, T0 + 250)
    scontrol.stalled = False
    clock.now += 2 * userjobs.BACKOFF_S + 1
    view.rows(newer_than="5")
    assert view.seen() == userjobs.Seen(clock.now, None)


@pytest.mark.parametrize(
    ("in_flight_s", "silent"),
    [(userjobs.SILENT_AFTER_S, False), (userjobs.SILENT_AFTER_S + 0.5, True)],
)
def test_a_look_another_process_has_in_flight_too_long_is_silence_not_a_wait(
    tmp_path: Path, in_flight_s: float, silent: bool
) -> None:
    import fcntl

    clock = Clock(T0 + 1000)
    scontrol = FakeScontrol(line("5"))
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    view.rows(newer_than="5")
    asking = T0 + 2000
    view.write(userjobs.ViewState.from_dict({**view.read().to_dict(), "asking_since": asking}))
    clock.now = asking + in_flight_s
    assert view.seen() == userjobs.Seen(T0 + 1000, None)  # nobody holds the lock: no look
    fd = os.open(view.path.with_suffix(".lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the other process, its look in flight
        assert view.seen() == userjobs.Seen(T0 + 1000, asking if silent else None)
        if silent:  # answered at once, from the view as it is: no wait for the lock
            fresh = SharedView(view.path, scontrol, clock)
            assert [r["State"] for r in fresh.rows(newer_than="5")] == ["RUNNING"]
            assert len(scontrol.calls) == 1
    finally:
        os.close(fd)


@pytest.mark.parametrize("within", [None, 6.0])
def test_a_waiter_looks_within_its_bound_whatever_the_interval_or_pause(
    tmp_path: Path, within: float | None
) -> None:
    clock = Clock(T0 + 1000)  # the job's age gives the longest interval
    scontrol = StalledScontrol(line("5"), clock, hang_s=0.0)
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    view.current("5", within)
    clock.now += 6.0
    view.current("5", within)
    assert len(scontrol.calls) == 1  # exactly 6 s old: still fresh
    clock.now += 0.5
    view.current("5", within)
    assert len(scontrol.calls) == (1 if within is None else 2)
    scontrol.stalled = True  # fails at once: the pause after it is BACKOFF_S
    clock.now += MAX_INTERVAL_S + 1
    view.current("5", within)
    calls = len(scontrol.calls)
    clock.now += 6.5
    view.current("5", within)
    assert len(scontrol.calls) == calls + (0 if within is None else 1)


@pytest.mark.parametrize(
    ("sacct", "silent", "expected"),
    [
        ("77|PENDING\n", True, "UNANSWERED"),  # the database lags: never taken for the state
        ("", True, "UNANSWERED"),  # not even recorded yet: not UNKNOWN
        ("77|COMPLETED\n", True, "COMPLETED"),  # an end is final wherever it is read
        ("77|PENDING\n", False, "PENDING"),
        ("", False, "UNKNOWN"),
    ],
)
def test_a_failed_question_never_becomes_a_state(
    monkeypatch: pytest.MonkeyPatch, sacct: str, silent: bool, expected: str
) -> None:
    from hpcdist.slurm import query

    def answer(argv: list[str], fresh: bool = False) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sacct":
            return subprocess.CompletedProcess(argv, 0, sacct, "")
        return subprocess.CompletedProcess(argv, 1, "", "the controller is not answering")

    seen = userjobs.Seen(T0, T0 + 12 if silent else None)
    monkeypatch.setattr(userjobs, "user_rows", lambda job_id, within=None: [])
    monkeypatch.setattr(userjobs, "shared_answer", answer)
    monkeypatch.setattr(userjobs, "seen", lambda: seen)
    assert query.slurm_job_state("77") == expected


def test_a_completing_jobs_end_comes_from_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter and a typed status say the same state of a job that is COMPLETING: its end
    as SLURM's database has it, once written there."""
    from hpcdist.slurm import query

    asked: list[bool] = []
    sacct = ["77|RUNNING\n"]

    def answer(argv: list[str], fresh: bool = False) -> subprocess.CompletedProcess[str]:
        asked.append(fresh)
        return subprocess.CompletedProcess(argv, 0, sacct[0], "")

    rows = parse_rows(line("77", "COMPLETING"))
    monkeypatch.setattr(userjobs, "user_rows", lambda job_id, within=None: rows)
    monkeypatch.setattr(userjobs, "shared_answer", answer)
    assert query.slurm_job_state("77", within=6.0) == "COMPLETING"  # not written there yet
    assert query.slurm_job_state("77") == "COMPLETING"
    sacct[0] = "77|CANCELLED by 0\n"
    assert query.slurm_job_state("77", within=6.0) == "CANCELLED"
    assert query.slurm_job_state("77") == "CANCELLED"  # a typed status after the waiter
    assert asked == [True] * 4  # asked now, never an answer kept from before the end


def _line(job: int, uid: int, state: str, name: str = "n") -> str:
    return f"JobId={job} JobName={name} UserId=u({uid}) GroupId=g(0) JobState={state} Reason=None"


def test_a_name_with_newlines_makes_the_view_ask_job_by_job() -> None:
    from hpcdist.slurm.parse import ambiguity

    me = os.getuid()
    mine = _line(10, me, "PENDING")
    forged = _line(11, 4242, "PENDING", name=f"x\n{_line(10, me, 'COMPLETED')}\nJobId=9 JobName=y")
    assert ambiguity(mine) == "" and ambiguity(f"{mine}\n{_line(12, me, 'RUNNING')}") == ""
    assert ambiguity(f"{mine}\n{forged}") == "line 2 names an owner 0 times"
    assert ambiguity(f"{mine}\nmore name") == "line 2 starts no record (a field holds a newline)"
    assert ambiguity(f"{mine}\n{mine}") == "line 2 repeats job 10"
    assert "names an owner 2 times" in ambiguity(f"{mine} UserId=u({me})")
    asked: list[list[str]] = []

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        out = {"scontrol -o show job": f"{mine}\n{forged}", "squeue": "10\n"}
        out["scontrol -o show job 10"] = mine
        key = "squeue" if argv[0] == "squeue" else " ".join(argv)
        return subprocess.CompletedProcess(argv, 0, out[key], "")

    view = SharedView(Path(os.devnull), runner)
    rows = view._rows(runner(userjobs.view_argv()))
    assert [(row["JobID"], row["State"]) for row in rows or []] == [("10", "PENDING")]
    assert asked[1][:2] == ["squeue", "--me"] and asked[2] == [
        "scontrol",
        "-o",
        "show",
        "job",
        "10",
    ]
    # Without a newline anywhere, of a job the last look had: the one answer, nothing
    # asked again.
    asked.clear()
    answer = runner(["scontrol", "-o", "show", "job", "10"])
    assert [row["JobID"] for row in view._rows(answer, parse_rows(mine), 5.0) or []] == ["10"]
    assert len(asked) == 1


def test_one_line_escapes_every_control_character() -> None:
    from hpcdist.jobs.logread import one_line

    assert one_line("a\x1b]0;t\x07\nb\tc\x7f") == "a\\x1b]0;t\\x07\\x0ab\\x09c\\x7f"
    assert one_line("plain name-1") == "plain name-1"


def test_status_of_a_completing_job_says_its_end_once_the_database_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``status`` reads a job's record (query_jobs), not slurm_job_state: the same end."""
    from hpcdist.slurm import query

    record = {"JobId": "77", "JobState": "COMPLETING", "RunTime": "00:00:09"}
    sacct = ["77|RUNNING\n"]
    asked: list[bool] = []

    def answer(argv: list[str], fresh: bool = False) -> subprocess.CompletedProcess[str]:
        asked.append(fresh)
        return subprocess.CompletedProcess(argv, 0, sacct[0], "")

    monkeypatch.setattr(query, "scontrol_records", lambda job: [record])
    monkeypatch.setattr(userjobs, "shared_answer", answer)
    assert [info.state for info in query.query_jobs("77")] == ["COMPLETING"]  # not written yet
    sacct[0] = "77|CANCELLED by 0\n"
    assert [info.state for info in query.query_jobs("77")] == ["CANCELLED"]
    running = {**record, "JobState": "RUNNING"}
    monkeypatch.setattr(query, "scontrol_records", lambda job: [running])
    assert [info.state for info in query.query_jobs("77")] == ["RUNNING"]
    assert asked == [True, True]  # the database asked only of a job COMPLETING, and now


def _controller(printed: str, real: str) -> tuple[Runner, list[list[str]]]:
    """A controller whose ``scontrol -o show job`` prints ``printed`` (other users'
    names and all) and whose own jobs are the records of ``real``: ``squeue --me`` lists
    their numbers, ``scontrol -o show job N`` prints N's record alone (or that it has no
    job N)."""
    asked: list[list[str]] = []
    jobs = {one.split()[0].removeprefix("JobId="): one for one in real.splitlines()}

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv)
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, "".join(f"{j}\n" for j in jobs), "")
        if len(argv) == 5:  # one job by its number
            if argv[4] not in jobs:
                invalid = "slurm_load_jobs error: Invalid job id specified\n"
                return subprocess.CompletedProcess(argv, 1, "", invalid)
            return subprocess.CompletedProcess(argv, 0, jobs[argv[4]], "")
        return subprocess.CompletedProcess(argv, 0, printed, "")

    return runner, asked


def test_a_record_of_a_job_the_controller_forgot_is_not_taken_on_its_word() -> None:
    # Another user's pending job is named "x UserId=her(1001) ...\n<a record of job 10, this
    # user's, COMPLETED, its log /etc/shadow>\nJobId=9 JobName=y": job 10 ended and the
    # controller forgot it (a site with MinJobAge=2), so nothing repeats or contradicts the
    # record. The view last saw job 10 RUNNING, 5 s ago.
    forged = line("10", "COMPLETED", StdOut="/etc/shadow")
    assert parse_rows(forged)[0]["State"] == "COMPLETED"  # what it would read as
    runner, asked = _controller(f"{line('12')}\n{forged}", real=line("12"))
    view = SharedView(Path(os.devnull), runner)
    before = parse_rows(f"{line('10')}\n{line('12')}")
    rows = view._rows(runner(userjobs.view_argv()), before, 5.0, lambda: 2.0) or []
    assert [(row["JobID"], row["State"]) for row in rows] == [("12", "RUNNING")]
    # Job 10 changed: asked by its number, which the controller does not have. Job 12 as
    # the last look had it: taken from the look.
    assert asked[1:] == [["scontrol", "-o", "show", "job", "10"]]
    # Where more jobs changed than are asked one by one: the listing by number decides.
    many = [line(str(n), "COMPLETED") for n in range(20, 20 + userjobs.ONE_BY_ONE)]
    printed, real = "\n".join([line("12"), forged, *many]), "\n".join([line("12"), *many])
    runner, asked = _controller(printed, real)
    rows = SharedView(Path(os.devnull), runner)._rows(runner(userjobs.view_argv()), before, 5.0)
    assert sorted(row["JobID"] for row in rows or []) == ["12", "20", "21", "22"]
    assert [argv[0] for argv in asked[1:3]] == ["squeue", "squeue"]  # listed, then own_rows


@pytest.mark.parametrize(
    ("before", "since_s", "asks"),
    [
        ("FAILED", 5.0, False),  # printed again as the last look had it: nothing new
        ("FAILED", 86400.0, False),
        (None, 5.0, True),  # new to the view
        ("COMPLETED", 5.0, True),  # a job the view saw ended, changed
        # A job the view saw running, now ended: forgotten, a forged record could say so,
        # only where the last look is MinJobAge (300 s here) old or more.
        ("RUNNING", 299.0, False),
        ("RUNNING", 300.0, True),
    ],
)
def test_the_controller_is_asked_only_for_rows_it_must_vouch_for(
    before: str | None, since_s: float, asks: bool
) -> None:
    now = line("12", "FAILED", ExitCode="1:0", RunTime="00:02:00")
    runner, asked = _controller(now, real=now)
    view = SharedView(Path(os.devnull), runner)
    old = parse_rows(line("12", before, ExitCode="1:0")) if before else []  # RunTime 1:05
    rows = view._rows(runner(userjobs.view_argv()), old, since_s, lambda: 300.0) or []
    assert [(row["JobID"], row["State"]) for row in rows] == [("12", "FAILED")]
    by_number = ["scontrol", "-o", "show", "job", "12"]
    assert asked == [userjobs.view_argv(), *([by_number] if asks else [])]


def test_the_sites_min_job_age_is_asked_once_an_hour_and_only_when_needed(tmp_path: Path) -> None:
    config = "Configuration data as of 2026-12-07T12:00:00\nMinJobAge               = 120 sec\n"
    scontrol, clock = FakeScontrol(line("5", "PENDING")), Clock(T0 + 1000)
    scontrol.config = config
    view = SharedView(tmp_path / "view.json", scontrol, clock)
    view.current(
        within=1.0
    )  # a waiter's looks. New: asked by number; nothing ran before, so no MinJobAge needed
    assert (scontrol.configs, len(scontrol.asks)) == (0, 1)
    scontrol.text = line("5", "RUNNING")
    clock.now += 200  # older than MinJobAge, once known
    view.current(within=1.0)
    assert scontrol.configs == 1 and view.read().min_job_age_s == 120.0
    assert len(scontrol.asks) == 2  # 200 s >= 120 s: the changed job asked by number
    scontrol.text = line("5", "COMPLETED")
    clock.now += 100
    view.current(within=1.0)
    assert len(scontrol.calls) == 3  # three looks
    assert scontrol.configs == 1 and len(scontrol.asks) == 2  # 100 s < 120 s: as printed
    clock.now += userjobs.CONFIG_EVERY_S
    scontrol.text = line("5", "COMPLETED", ExitCode="1:0")
    view.current(within=1.0)
    assert scontrol.configs == 1  # an ended job that changed is asked, MinJobAge or not
    assert len(scontrol.asks) == 3
