"""One shared, rate-limited view of this user's jobs for every hpcdist process of the user
on this machine, so that ten terminals following one sweep ask the controller what one does.

The view is ``scontrol -o show job``, filtered to this user's jobs: one query RPC to the
controller (``squeue`` sends two, every partition loaded beside the jobs to sort by priority
tier; ``squeue --me`` still asks for every job and filters them itself, as this does). A
look whose rows are new or changed asks the controller for those jobs by number (or
``squeue --me`` for the user's job numbers, where they are many): answers no other user's
text can pose in (``unvouched``). The
pending tasks of an array, one record there, become one row each, as ``squeue -r`` shows
them. Asked at most once per refresh interval for every process and kept in a
private file of the user's state folder (``~/.local/state/hpcdist/slurm/``; 0600 in a 0700
folder, its owner and mode checked on the descriptor it is read from, written atomically).
One process refreshes it at a time, under an ``flock``; the others read what it wrote. Tasks
the controller forgets (``MinJobAge`` after their end) stay in the view with their last
state. Other answers a command needs (``sacct`` rows of a job, ``scontrol`` of another
user's job) are kept beside it, keyed by their command line, on the same interval.

The interval follows the youngest unfinished job, as submitit's watcher does: half its age
(each look comes when the job is twice as old as at the last, so a job that ends is seen at
most its age later, never later than the longest interval), at least ``MIN_INTERVAL_S``, at
most ``MAX_INTERVAL_S`` (below SLURM's default MinJobAge of 300 s, so a task that ends
between two looks is still in the next where the site keeps the default; sacct answers for
one the controller forgot). A command's first question about a job (``status`` typed now)
sees it as it is, unless another command had that fresh look at the job in the last
``ONE_SHOT_EVERY_S`` (ten terminals running ``watch hpcdist status`` cost one look per
interval, and one more at most every ``ONE_SHOT_EVERY_S``); a process that asks again
(``logs --follow``, ``submit --wait``) follows on the interval. A controller that refuses or
fails is left alone for a growing pause (``BACKOFF_S`` doubling to ``MAX_BACKOFF_S``), and
one that answers slowly sets the next interval to ten times its answer. The view keeps since
when the controller has not answered (a failed look, or one still waiting after
``SILENT_AFTER_S``): a command shows the last state with that (``hpcdist.slurm.freshness``)
rather than wait for the look another process has in flight. A process that waits for a job
for a person (``submit --wait``) asks with ``within``: the view no older than that, whatever
the interval, a slow answer or a pause after a failure (one question at a time, as
``sbatch --wait`` asks), so that it sees the job's end within seconds.
``HPCDIST_SLURM_VIEW=off`` asks SLURM directly each time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdist.errors import UserError
from hpcdist.slurm import rest
from hpcdist.slurm.freshness import Seen
from hpcdist.slurm.parse import (
    FINAL_STATES,
    ambiguity,
    config_values,
    expand_task_ids,
    parse_exit_code,
    parse_key_values,
    parse_timestamp,
)
from hpcdist.slurm.tools import slurm_tool
from hpcdist.state.fileutil import write_atomic
from hpcdist.state.private import PRIVATE_FILE_MODE, private_dir
from hpcdist.state.statehome import make_state_base
from hpcdist.state.trustedfile import read_private

MIN_INTERVAL_S = 2.0
AGE_FRACTION = 1.0 / 2.0  # of the youngest unfinished job's age: the view's interval
MAX_INTERVAL_S = 120.0
ONE_SHOT_AGE_S = 1.0  # a command's first question: the view may be this old
ONE_SHOT_EVERY_S = 300.0  # ... or older, where a command had a fresh look lately
BACKOFF_S = 10.0
MAX_BACKOFF_S = 300.0
SLOW_FACTOR = 10.0  # an answer that took d seconds: the next one no sooner than 10 d later
LOCK_WAIT_S = 60.0
SILENT_AFTER_S = 5.0  # a look unanswered this long: the controller is not answering
KEEP_ENDED_S = 2 * 86400.0  # how long the view keeps a job the controller forgot
ENV_SWITCH = "HPCDIST_SLURM_VIEW"
FORMAT_VERSION = 4

# The view's row keys (squeue's --Format names, which the rest of hpcdist reads), each
# from the scontrol field of the same meaning.
FROM_SCONTROL = {
    "JobID": "JobId",
    "ArrayJobID": "ArrayJobId",
    "ArrayTaskID": "ArrayTaskId",
    "State": "JobState",
    "Reason": "Reason",
    "NodeList": "NodeList",
    "NumNodes": "NumNodes",
    "TimeUsed": "RunTime",
    "TimeLimit": "TimeLimit",
    "RestartCnt": "Restarts",
    "STDOUT": "StdOut",
    "STDERR": "StdErr",
    "WorkDir": "WorkDir",
    "SubmitTime": "SubmitTime",
    "StartTime": "StartTime",
    "EndTime": "EndTime",
    "Dependency": "Dependency",
    "Name": "JobName",
}
FIELDS = ("JobArrayID", *FROM_SCONTROL, "exit_code", "UserName")
# What scontrol prints for %a in the log path of an array's still pending tasks (NO_VAL - 1).
_PENDING_TASK = "4294967294"

Row = dict[str, str]
Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def view_argv() -> list[str]:
    return ["scontrol", "-o", "show", "job"]


def parse_rows(text: str, uid: int | None = None) -> list[Row]:
    """``scontrol -o show job`` records of user ``uid`` (this process's user by default) ->
    one row per job or array task, the pending tasks of an array one row each."""
    owner = f"({os.getuid() if uid is None else uid})"
    rows = []
    for line in text.splitlines():
        if not line.startswith("JobId=") or owner not in line:
            continue  # "No jobs in the system", or (most lines of a big cluster) not ours
        if len(_USER_ID.findall(line)) != 1:
            continue  # another user's name or command that spells "UserId=": not ours to read
        record = parse_key_values(line)
        if not record.get("UserId", "").endswith(owner):
            continue
        rows += _task_rows(record)
    return rows


# A record's owner. scontrol prints its fields unquoted, and a job's name, command and
# comment are its owner's text: a name of "x UserId=alice(1000) JobState=COMPLETED" would
# read as alice's finished job. The real UserId is always printed, so a record that spells
# it twice is another user's disguise (or one's own odd name) and is left out of the view.
_USER_ID = re.compile(r"(?:^|\s)UserId=")


def own_rows(runner: Runner) -> list[Row] | None:
    """The user's rows where ``scontrol -o show job`` of every job is ambiguous (another
    user's job holds a newline and could pose as the user's): the user's own jobs, listed by
    their numbers alone (``squeue --me``, which filters them by user id), each asked of the
    controller on its own, so no other user's text is read. None: the controller failed."""
    listed = runner(["squeue", "--me", "--noheader", "--states=all", "--format=%F"])
    if listed.returncode != 0:
        return None
    rows: list[Row] = []
    for head in sorted({word for word in listed.stdout.split() if word.isdigit()}, key=int):
        proc = runner(["scontrol", "-o", "show", "job", head])
        if proc.returncode == 0 and not ambiguity(proc.stdout):  # one's own newline: left out
            rows += parse_rows(proc.stdout)
    return rows


def unvouched(
    rows: Sequence[Row],
    before: Sequence[Row],
    since_s: float,
    min_job_age_s: Callable[[], float] = lambda: 0.0,
) -> list[Row]:
    """The rows of a look that only the controller, asked by job number, can vouch for.

    A record that names this user's id on a line of ``scontrol -o`` may be another user's
    text: a name with newlines can hold whole records, and where the job it names is one
    the controller does not have (forgotten ``MinJobAge`` after its end, or never had),
    nothing in the output repeats or contradicts it; where the controller has the job, its
    own record comes too and ``ambiguity`` refuses the pair. So: a row new to the view; a
    changed row of a job the view last saw ended; a changed row of any job where the last
    look is at least ``min_job_age_s()`` old (the site's MinJobAge, asked only then: a job
    the last look saw running may have ended and been forgotten since). A row printed again
    as the view had it tells nothing new."""
    last = {row["JobArrayID"]: row for row in before}
    changed = [row for row in rows if _moved(last.get(row["JobArrayID"]), row)]
    doubtful = [
        row for row in changed if row["JobArrayID"] not in last or _ended(last[row["JobArrayID"]])
    ]
    if len(doubtful) < len(changed) and since_s >= min_job_age_s():
        return changed
    return doubtful


def _ended(row: Row) -> bool:
    return _state(row) in FINAL_STATES


def _state(row: Row) -> str:
    """The row's state word ("CANCELLED" of "CANCELLED by 0"); "" for none."""
    return (row.get("State", "").split() or [""])[0]


def _moved(old: Row | None, new: Row) -> bool:
    return old is None or any(old.get(key) != new.get(key) for key in new if key != "TimeUsed")


# How often the view asks the controller's MinJobAge (``unvouched``); its value there: "300 sec".
CONFIG_EVERY_S = 3600.0
_SECONDS = re.compile(r"(\d+) sec")
# At most this many jobs of a look are asked one by one (one small RPC each); more are
# checked against one listing of the user's jobs (squeue: two RPCs, every job and partition).
ONE_BY_ONE = 3
# scontrol's words for a job number the controller does not have (forgotten, or never had).
_UNKNOWN_JOB = "Invalid job id"


def listed_by_the_controller(rows: Sequence[Row], runner: Runner) -> bool:
    """Whether every row is a job or task of this user that the controller lists by number
    (``squeue --me`` filters by the numeric user id, and prints no other user's text)."""
    listed = runner(["squeue", "--me", "--noheader", "--states=all", "--array", "--format=%i"])
    if listed.returncode != 0:
        return False
    known = set(listed.stdout.split())
    return all(row["JobArrayID"] in known for row in rows)


def _task_rows(record: Mapping[str, str]) -> list[Row]:
    row = {key: record.get(name, "").strip() for key, name in FROM_SCONTROL.items()}
    code, signal = parse_exit_code(record.get("ExitCode", "0:0"))
    row["exit_code"] = str((code << 8) | signal)  # the wait status, as squeue gives it
    row["UserName"] = record.get("UserId", "").partition("(")[0]
    head, task = row["ArrayJobID"], row["ArrayTaskID"]
    if not head or not task:
        return [{**row, "JobArrayID": row["JobID"], "ArrayJobID": row["JobID"]}]
    if task.isdigit():
        return [{**row, "JobArrayID": f"{head}_{task}"}]
    rows = []
    for one in expand_task_ids(f"{head}_[{task}]"):
        number = one.partition("_")[2]
        paths = {k: row[k].replace(_PENDING_TASK, number) for k in ("STDOUT", "STDERR")}
        rows.append({**row, **paths, "JobArrayID": one, "ArrayTaskID": number})
    return rows


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The view is squeue's: off where the user switched it off, and over slurmrestd
    (each question goes to the daemon)."""
    env = os.environ if environ is None else environ
    if rest.chosen(env):
        return False
    return env.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "no")


def youngest_submit(rows: Sequence[Row]) -> float | None:
    """When the youngest unfinished job was submitted (None: none is unfinished)."""
    stamps = {row.get("SubmitTime", "") for row in rows if _state(row) and not _ended(row)}
    found = [stamp for text in stamps if (stamp := parse_timestamp(text)) is not None]
    return max(found) if found else None


def interval_s(
    rows: Sequence[Row], now: float, last_call_s: float = 0.0, youngest: float | None = -1.0
) -> float:
    """How old the view may be: AGE_FRACTION of the age of the youngest unfinished job
    (submitit's watcher backs off the same way), within [MIN_INTERVAL_S,
    MAX_INTERVAL_S]; at least SLOW_FACTOR times the last answer's duration. ``youngest``:
    that job's submission, if known (else it is found in ``rows``)."""
    submitted = youngest_submit(rows) if youngest == -1.0 else youngest
    age = now - submitted if submitted is not None else MAX_INTERVAL_S * 2
    wanted = min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, age * AGE_FRACTION))
    return max(wanted, SLOW_FACTOR * last_call_s)


def merge_rows(old: Sequence[Row], new: Sequence[Row], now: float) -> list[Row]:
    """The controller's rows, and the ended ones it has forgotten since (kept KEEP_ENDED_S
    after their submission), so that a task that ended between two looks keeps its state."""
    seen = {row["JobArrayID"] for row in new}
    kept = [
        row
        for row in old
        if row["JobArrayID"] not in seen
        and _ended(row)
        and now - (parse_timestamp(row.get("SubmitTime", "")) or now) < KEEP_ENDED_S
    ]
    return [*new, *kept]


def rows_of(rows: Sequence[Row], job_id: str) -> list[Row]:
    """The rows ``job_id`` names: a job, every task of an array (``123``), one task
    (``123_4``), or a task by its own id."""
    return [
        row
        for row in rows
        if job_id in (row.get("JobArrayID"), row.get("ArrayJobID"))
        or (row.get("JobID") == job_id and row.get("ArrayTaskID", "").isdigit())
    ]


@dataclass
class ViewState:
    """What the view file holds."""

    rows: list[Row] = field(default_factory=list)
    at: float = float("-inf")  # when the controller last answered
    call_s: float = 0.0  # how long that answer took
    stale: bool = False  # a submit or cancel since: the next reader asks again
    failures: int = 0
    paused_until: float = float("-inf")
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # argv -> result
    forced: dict[str, float] = field(default_factory=dict)  # job -> its last fresh look
    silent_since: float | None = None  # the first look unanswered since the last answer
    asking_since: float | None = None  # a look in flight since then
    min_job_age_s: float = 0.0  # the site's MinJobAge, asked at config_at
    config_at: float = float("-inf")
    _index: dict[str, list[Row]] | None = field(default=None, repr=False, compare=False)
    _max_id: int | None = field(default=None, repr=False, compare=False)
    _youngest: float | None = field(default=-1.0, repr=False, compare=False)

    def interval(self, now: float) -> float:
        """``interval_s`` of this view (its youngest job found once)."""
        if self._youngest == -1.0:
            self._youngest = youngest_submit(self.rows)
        return interval_s(self.rows, now, self.call_s, self._youngest)

    def max_id(self) -> int:
        """The highest job id in the view (0 for none)."""
        if self._max_id is None:
            self._max_id = max(
                (
                    int(row[key])
                    for row in self.rows
                    for key in ("JobID", "ArrayJobID")
                    if row.get(key, "").isdigit()
                ),
                default=0,
            )
        return self._max_id

    def rows_of(self, job_id: str) -> list[Row]:
        """``rows_of(self.rows, job_id)``, from an index built once per view."""
        if self._index is None:
            index: dict[str, list[Row]] = {}
            for row in self.rows:
                keys = {row.get("JobArrayID", ""), row.get("ArrayJobID", "")}
                if row.get("ArrayTaskID", "").isdigit():
                    keys.add(row.get("JobID", ""))
                for key in keys - {""}:
                    index.setdefault(key, []).append(row)
            self._index = index
        return list(self._index.get(job_id, []))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "rows": self.rows,
            "at": self.at if self.at != float("-inf") else None,
            "call_s": self.call_s,
            "stale": self.stale,
            "failures": self.failures,
            "paused_until": None if self.paused_until == float("-inf") else self.paused_until,
            "answers": self.answers,
            "forced": self.forced,
            "silent_since": self.silent_since,
            "asking_since": self.asking_since,
            "min_job_age_s": self.min_job_age_s,
            "config_at": None if self.config_at == float("-inf") else self.config_at,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ViewState:
        if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
            return cls()
        try:
            return cls(
                rows=[{str(k): str(v) for k, v in row.items()} for row in data["rows"]],
                at=float("-inf") if data["at"] is None else float(data["at"]),
                call_s=float(data["call_s"]),
                stale=bool(data["stale"]),
                failures=int(data["failures"]),
                paused_until=(
                    float("-inf") if data["paused_until"] is None else float(data["paused_until"])
                ),
                answers=dict(data["answers"]),
                forced={str(k): float(v) for k, v in data.get("forced", {}).items()},
                silent_since=_moment(data.get("silent_since")),
                asking_since=_moment(data.get("asking_since")),
                min_job_age_s=float(data.get("min_job_age_s", 0.0)),
                config_at=_moment(data.get("config_at")) or float("-inf"),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return cls()  # a view of another version or a torn one: asked again

    def fresh(
        self,
        now: float,
        newer_than: str | None = None,
        first: bool = False,
        within: float | None = None,
    ) -> bool:
        """Whether the view may answer now without asking the controller; ``first``: the
        process's first question about ``newer_than`` (a command typed now); ``within``:
        a waiter's longest wait between looks (module docstring)."""
        if now < self.paused_until:  # the controller is left alone; the last answer stands
            return within is None or now - self.paused_until + _pause(self.failures) < within
        age = now - self.at
        if self.stale:  # a submit or cancel of the user's since: asked once more, now
            return age < SLOW_FACTOR * self.call_s
        if first and self.one_shot_due(now, newer_than):
            return False
        allowed = self.interval(now)
        if newer_than is not None and _newer(newer_than, self):
            allowed = max(MIN_INTERVAL_S, SLOW_FACTOR * self.call_s)
        return age <= (allowed if within is None else min(allowed, within))

    def seen(self, now: float, asking_elsewhere: bool) -> Seen:
        """When the controller last answered, and since when it has not: a failed look, or
        one another process (``asking_elsewhere``) has had in flight over SILENT_AFTER_S."""
        silent = self.silent_since
        if silent is None and asking_elsewhere and self.asking_since is not None:
            silent = self.asking_since if now - self.asking_since > SILENT_AFTER_S else None
        return Seen(None if self.at == float("-inf") else self.at, silent)

    def one_shot_due(self, now: float, job_id: str | None) -> bool:
        """Whether a command's first question about a job earns a fresh look: the view is
        older than ONE_SHOT_AGE_S and nobody had one for that job (an array: for any of
        its tasks) in the last ONE_SHOT_EVERY_S."""
        last = self.forced.get(_job_key(job_id), float("-inf"))
        return now - self.at > ONE_SHOT_AGE_S and now - last > ONE_SHOT_EVERY_S


def _moment(value: Any) -> float | None:
    return None if value is None else float(value)


def _pause(failures: int) -> float:
    """How long the controller is left alone after its ``failures``-th failure in a row."""
    return min(MAX_BACKOFF_S, BACKOFF_S * 2 ** (failures - 1)) if failures else 0.0


def _job_key(job_id: str | None) -> str:
    return "" if job_id is None else job_id.partition("_")[0]


def _newer(job_id: str, state: ViewState) -> bool:
    """A job id above every id in the view: submitted since it was asked."""
    head = job_id.partition("_")[0]
    return head.isdigit() and int(head) > state.max_id()


def view_path(environ: Mapping[str, str] | None = None) -> Path:
    """The user's view file of the cluster this machine's tools talk to (SLURM_CONF and
    its modification time tell clusters, and restarted testbeds, apart)."""
    env = os.environ if environ is None else environ
    conf = env.get("SLURM_CONF", "").strip() or "/etc/slurm/slurm.conf"
    with contextlib.suppress(OSError):
        conf += f"@{os.stat(conf).st_mtime_ns}"
    key = hashlib.sha256(conf.encode()).hexdigest()[:16]
    return make_state_base(environ) / "slurm" / f"view-{key}.json"


class SharedView:
    """The view file of one cluster, read and refreshed as the module docstring says."""

    def __init__(self, path: Path, runner: Runner, clock: Callable[[], float] = time.time):
        self.path = path
        self.runner = runner
        self.clock = clock
        self._memo: tuple[tuple[int, int, int], ViewState] | None = None
        self._asked: set[str] = set()  # the jobs this process asked about

    def read(self) -> ViewState:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return ViewState()
        mark = (info.st_ino, info.st_mtime_ns, info.st_size)  # a write is a new inode
        if self._memo is not None and self._memo[0] == mark:
            return self._memo[1]
        text = read_private(self.path, "SLURM view")  # another user's, or writable: refused
        try:
            state = ViewState.from_dict(json.loads(text))
        except ValueError:
            state = ViewState()  # torn or of another version: asked again
        self._memo = (mark, state)
        return state

    def write(self, state: ViewState) -> None:
        private_dir(self.path.parent, "hpcdist's SLURM view folder")
        write_atomic(self.path, json.dumps(state.to_dict()), mode=PRIVATE_FILE_MODE)

    @contextlib.contextmanager
    def _locked(self, give_up: Callable[[], bool] = lambda: False) -> Any:
        """The view's lock (yields True), or False once ``give_up()`` holds while waiting."""
        private_dir(self.path.parent, "hpcdist's SLURM view folder")
        fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if give_up():
                        yield False
                        return
                    if time.monotonic() > deadline:
                        raise UserError(
                            f"the SLURM view {self.path} stayed locked {LOCK_WAIT_S:.0f} s; "
                            f"another hpcdist process holds it (set {ENV_SWITCH}=off to skip it)"
                        ) from None
                    time.sleep(0.05)
            yield True
        finally:
            os.close(fd)

    def rows(self, newer_than: str | None = None) -> list[Row]:
        """The user's rows, asking the controller only when the view is too old."""
        return self.current(newer_than).rows

    def current(self, newer_than: str | None = None, within: float | None = None) -> ViewState:
        """The view, asked again of the controller only when it is too old. A process's
        first question about a job is a command typed now (``status``, ``report``): it may
        see the job as it is, at most once per ONE_SHOT_EVERY_S for the job whatever the
        number of processes; a process that asks again is following, on the interval (or
        ``within``). A look another process has had in flight over SILENT_AFTER_S is not
        waited for: the view answers as it is, the controller silent."""
        first = _job_key(newer_than) not in self._asked
        self._asked.add(_job_key(newer_than))
        state = self.read()
        if state.fresh(self.clock(), newer_than, first, within):
            return state
        if self._hung(state):
            return state
        with self._locked(give_up=lambda: self._hung(self.read())) as locked:
            if not locked:  # the look in flight elsewhere went silent while this one waited
                return self.read()
            state = self.read()  # another process may have asked while this one waited
            now = self.clock()
            if state.fresh(now, newer_than, first, within):
                return state
            forced = first and state.one_shot_due(now, newer_than)
            state = self._refresh(state)
            if forced:
                state.forced = {k: t for k, t in state.forced.items() if now - t < 3600}
                state.forced[_job_key(newer_than)] = now
            self.write(state)
            return self.read()

    def _refresh(self, state: ViewState) -> ViewState:
        """Ask the controller (the look in flight written first, for the other readers)."""
        started = self.clock()
        self.write(dataclasses.replace(state, asking_since=started))
        state = dataclasses.replace(
            state, _index=None, _max_id=None, _youngest=-1.0, asking_since=None
        )
        try:
            rows = self._rows(
                self.runner(view_argv()),
                state.rows,
                started - state.at,
                lambda: self._min_job_age(state, started),
            )
        except UserError:  # no answer in time
            rows = None
        now = self.clock()
        if rows is None:
            state.failures += 1
            state.paused_until = now + _pause(state.failures)
            state.silent_since = started if state.silent_since is None else state.silent_since
            return state
        state.rows = merge_rows(state.rows, rows, now)
        state.at, state.call_s = now, now - started
        state.stale, state.failures, state.paused_until = False, 0, float("-inf")
        state.silent_since = None
        return state

    def _rows(
        self,
        proc: subprocess.CompletedProcess[str],
        before: Sequence[Row] = (),
        since_s: float = float("inf"),
        min_job_age_s: Callable[[], float] = lambda: 0.0,
    ) -> list[Row] | None:
        """The user's rows of the controller's answer (None: it failed); where its records
        cannot be told apart, asked again job by job (``own_rows``). Rows the view cannot
        take on their word (``unvouched``) are asked of the controller job by job, where
        they are few (``ONE_BY_ONE``), or checked against its listing of the user's jobs.
        ``before``: the view's rows of its last look, ``since_s`` ago."""
        if proc.returncode != 0:
            return None
        if ambiguity(proc.stdout):
            return own_rows(self.runner)
        rows = parse_rows(proc.stdout)
        doubtful = unvouched(rows, before, since_s, min_job_age_s)
        heads = sorted({row["ArrayJobID"] for row in doubtful})
        if not heads:
            return rows
        if len(heads) > ONE_BY_ONE:
            return rows if listed_by_the_controller(rows, self.runner) else own_rows(self.runner)
        kept = [row for row in rows if row["ArrayJobID"] not in heads]
        for head in heads:
            asked = self.runner(["scontrol", "-o", "show", "job", head])
            if asked.returncode != 0 and _UNKNOWN_JOB not in asked.stderr:
                return None
            if asked.returncode == 0 and not ambiguity(asked.stdout):  # own newline: left out
                kept += parse_rows(asked.stdout)
        return kept

    def _min_job_age(self, state: ViewState, now: float) -> float:
        """The site's MinJobAge in seconds, asked at most once per ``CONFIG_EVERY_S`` (kept
        in the view); 0 where the controller does not say (every changed row vouched for)."""
        if now - state.config_at < CONFIG_EVERY_S:
            return state.min_job_age_s
        proc = self.runner(["scontrol", "show", "config"])
        said = config_values(proc.stdout).get("MinJobAge", "") if proc.returncode == 0 else ""
        found = _SECONDS.fullmatch(said)
        state.min_job_age_s = float(found[1]) if found else 0.0
        state.config_at = now if found else float("-inf")
        return state.min_job_age_s

    def _lock_held(self) -> bool:
        """Whether another process holds the view's lock now (a look in flight)."""
        try:
            fd = os.open(self.path.with_suffix(".lock"), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing releases a lock taken here
        return False

    def _hung(self, state: ViewState) -> bool:
        """Whether another process's look has waited on the controller over SILENT_AFTER_S."""
        asking = state.asking_since
        return asking is not None and self.clock() - asking > SILENT_AFTER_S and self._lock_held()

    def seen(self) -> Seen:
        """When the controller last answered the view, and since when it has not."""
        state = self.read()
        return state.seen(self.clock(), state.asking_since is not None and self._lock_held())

    def answer(self, argv: list[str], fresh: bool = False) -> subprocess.CompletedProcess[str]:
        """Another command's answer (sacct rows, another user's job), shared on the same
        interval as the view: asked again once it is older than the view may be (``fresh``:
        asked now). While another process's look waits on a silent controller, sacct (the
        database) is asked at once and the controller not at all."""
        key = "\x00".join(argv)
        state = self.read()
        now = self.clock()
        kept = state.answers.get(key)
        allowed = state.interval(now)
        if kept is not None and not fresh and now - float(kept["at"]) <= allowed:
            return subprocess.CompletedProcess(argv, int(kept["rc"]), kept["out"], kept["err"])
        hung = self._hung(state)
        if argv[0] != "sacct" and (now < state.paused_until or hung):
            return subprocess.CompletedProcess(argv, 1, "", "the controller is not answering")
        if hung:
            return self.runner(argv)
        with self._locked():
            state = self.read()
            kept = state.answers.get(key)
            if kept is not None and not fresh and self.clock() - float(kept["at"]) <= allowed:
                return subprocess.CompletedProcess(argv, kept["rc"], kept["out"], kept["err"])
            proc = self.runner(argv)
            at = self.clock()
            state = dataclasses.replace(state)
            state.answers = {k: v for k, v in state.answers.items() if at - v["at"] <= allowed}
            state.answers[key] = {"at": at, "rc": proc.returncode, "out": proc.stdout, "err": ""}
            state.answers[key]["err"] = proc.stderr
            self.write(state)
            return proc

    def mark_stale(self) -> None:
        """A job was submitted or cancelled: the next reader asks the controller again."""
        with self._locked():
            self.write(dataclasses.replace(self.read(), stale=True))


_VIEWS: dict[Path, SharedView] = {}


def shared_view(runner: Runner = slurm_tool) -> SharedView | None:
    """This process's handle on the user's view; None when it is switched off or scontrol
    is not on PATH (no SLURM here)."""
    if not enabled() or shutil.which("scontrol") is None:
        return None
    path = view_path()
    if path not in _VIEWS:
        _VIEWS[path] = SharedView(path, runner)
    return _VIEWS[path]


def user_rows(job_id: str, within: float | None = None) -> list[Row] | None:
    """The view's rows of ``job_id`` ([] when the user has no such job the controller
    knows); None when the view is off. A running job's TimeUsed is brought up to now (the
    view's age added). ``within``: a waiter's question (SharedView.current)."""
    view = shared_view()
    if view is None:
        return None
    state = view.current(newer_than=job_id, within=within)
    rows = state.rows_of(job_id)
    age = max(0.0, view.clock() - state.at) if state.at != float("-inf") else 0.0
    return [_aged(row, age) if row.get("State") == "RUNNING" and age >= 1 else row for row in rows]


def _aged(row: Row, age_s: float) -> Row:
    used = _seconds(row.get("TimeUsed", ""))
    return row if used is None else {**row, "TimeUsed": str(int(used + age_s))}


def _seconds(text: str) -> float | None:
    """squeue's TimeUsed (``[D-][H:]M:SS``) in seconds; None if it is not one."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not all(part.isdigit() for part in parts) or (not days.isdigit() and days):
        return None
    seconds = sum(int(v) * m for v, m in zip(reversed(parts), (1, 60, 3600), strict=False))
    return seconds + 86400 * int(days or 0)


def shared_answer(argv: list[str], fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """A query's answer, shared with the user's other processes through the view when it is
    on; else the command's own answer. ``fresh``: asked now, whatever answer is kept."""
    view = shared_view()
    return slurm_tool(argv) if view is None else view.answer(argv, fresh)


def seen() -> Seen | None:
    """When the controller last answered the user's view, and since when it has not; None
    when the view is off (every question is asked at once)."""
    view = shared_view()
    return None if view is None else view.seen()


def mark_stale() -> None:
    """After a submit or a cancel: the next reader asks the controller (once) again."""
    view = shared_view()
    if view is not None:
        with contextlib.suppress(OSError, UserError):
            view.mark_stale()
