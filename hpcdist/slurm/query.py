"""Any SLURM job, however it was started, as the controller (scontrol) or the accounting
database (sacct) knows it: state, reason, nodes, times, exit code, restarts, log paths.

The controller comes first: sacct lags it by seconds and knows no log paths before SLURM
23.02. sacct answers once the controller has forgotten the job (MinJobAge after its end).
Every question goes through the user's shared view (``hpcdist.slurm.userjobs``): one squeue
for all of the user's jobs per refresh interval, shared by every hpcdist process.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.slurm import rest, userjobs
from hpcdist.slurm.freshness import UNANSWERED, Seen
from hpcdist.slurm.nodelist import NodeListError, expand_nodelist
from hpcdist.slurm.parse import (
    FINAL_STATES,
    SlurmOutputError,
    base_state,
    parse_duration,
    parse_exit_code,
    parse_sacct,
    parse_scontrol_records,
    parse_timestamp,
)
from hpcdist.slurm.tools import slurm_tool

# Fields of `sacct --format` this module and hpcdist.jobs.efficiency read.
SACCT_FIELDS = (
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Elapsed",
    "Timelimit",
    "TotalCPU",
    "AllocCPUS",
    "MaxRSS",
    "AveRSS",
    "NTasks",
    "ReqMem",
    "NNodes",
    "NodeList",
    "Reason",
    "Start",
    "End",
    "Submit",
    "WorkDir",
    "JobIDRaw",
    "User",
)
# SLURM >= 23.02 also keeps the log paths in the database.
SACCT_LOG_FIELDS = ("StdOut", "StdErr")


@dataclass(frozen=True)
class JobInfo:
    """One job (or one array task) as SLURM reports it."""

    job_id: str  # "123", or "123_4" for an array task
    name: str
    state: str  # base state: PENDING, RUNNING, COMPLETED, TIMEOUT, ...
    reason: str | None  # why it waits (or why it ended); None for SLURM's "None"
    nodes: str | None  # the node list; None while pending
    num_nodes: int
    elapsed_s: float | None
    limit_s: float | None  # None: no limit
    exit_code: int
    signal: int
    restarts: int
    stdout: str | None
    stderr: str | None
    workdir: str | None
    source: str  # "scontrol" or "sacct"
    # The job's own id (an array task's differs from "123_4"): its %j, its log record's name.
    raw_id: str | None = None
    # A log in WorkDir whose name holds the id, where SLURM (< 23.02 sacct) names none: a
    # guess, read only where the job's own log record is missing, never taken for SLURM's.
    guessed_log: str | None = None
    # When the controller gave this (the user's view); None: asked now, or a final record.
    seen: Seen | None = None


def _none(value: str | None) -> str | None:
    if value is None or value.strip() in ("", "(null)", "None", "None assigned", "Unknown"):
        return None
    return value.strip()


def _int(value: str | None, default: int = 0) -> int:
    return int(value) if value is not None and value.strip().isdigit() else default


def task_id(record: Mapping[str, str]) -> str:
    """``123_4`` for an array task (scontrol gives its own JobId, which is not that);
    ``123_[5-9%2]`` for the tasks of an array that have not started."""
    array_job, array_task = record.get("ArrayJobId"), record.get("ArrayTaskId")
    if array_job and array_task and array_task.isdigit():
        return f"{array_job}_{array_task}"
    if array_job and _none(array_task):  # the tasks that wait, as squeue shows them
        return f"{array_job}_[{array_task}]"
    return record["JobId"]


def from_scontrol(record: Mapping[str, str]) -> JobInfo:
    """A JobInfo from one parsed ``scontrol show job -o`` record."""
    code, signal = parse_exit_code(record.get("ExitCode", "0:0"))
    return JobInfo(
        job_id=task_id(record),
        name=record.get("JobName", ""),
        state=base_state(record.get("JobState", "")),
        reason=current_reason(base_state(record.get("JobState", "")), _pending_reason(record)),
        nodes=_none(record.get("NodeList")),
        num_nodes=_int(record.get("NumNodes"), 0),
        elapsed_s=parse_duration(record.get("RunTime", "")),
        limit_s=parse_duration(record.get("TimeLimit", "")),
        exit_code=code,
        signal=signal,
        restarts=_int(record.get("Restarts")),
        stdout=_none(record.get("StdOut")),
        stderr=_none(record.get("StdErr")),
        workdir=_none(record.get("WorkDir")),
        source="scontrol",
        raw_id=_none(record.get("JobId")),
    )


def _pending_reason(record: Mapping[str, str]) -> str | None:
    """SLURM's reason, with what it waits for where the reason names it: the time of a
    ``BeginTime``, the jobs of a ``Dependency``."""
    reason = _none(record.get("Reason"))
    if reason == "BeginTime" and _none(record.get("StartTime")):
        return f"BeginTime (starts no earlier than {record['StartTime']})"
    if reason == "Dependency" and _none(record.get("Dependency")):
        return f"Dependency ({record['Dependency']})"
    return reason


# Why a job waits (squeue(1), "JOB REASON CODES"): SLURM leaves the last one on a job that
# ran, or was cancelled while it waited, where it no longer says anything true.
_WAITING_REASON = re.compile(
    r"(Resources|Priority|Dependency|BeginTime|Licenses|Cleaning|JobHeld\w*|JobArrayTaskLimit"
    r"|ReqNodeNotAvail|Reservation\w*|Partition\w*|Assoc\w*|QOS\w*|Nodes required)\b.*"
)
# States in which the job still waits for something, and a waiting reason is current.
_WAITING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "RESV_DEL_HOLD"}
)


def current_reason(state: str, reason: str | None) -> str | None:
    """SLURM's reason where it is true now: why a job waits while it waits, why it ended
    (NonZeroExitCode, TimeLimit, NodeDown, ...) after; never a stale waiting reason."""
    if reason is None or state in _WAITING_STATES:
        return reason
    return None if _WAITING_REASON.fullmatch(reason) else reason


def job_rows(rows: Sequence[Mapping[str, str]]) -> list[Mapping[str, str]]:
    """The job-level rows of a sacct table (``123``, ``123_4``), not its steps (``123.0``)."""
    return [row for row in rows if "." not in row.get("JobID", "")]


def from_sacct(rows: Sequence[Mapping[str, str]], job_id: str) -> JobInfo | None:
    """A JobInfo for ``job_id`` from ``sacct -D`` rows: the last attempt of a requeued job
    (every earlier one is a row of its own, so the rows count the restarts)."""
    attempts = [row for row in job_rows(rows) if row.get("JobID") == job_id]
    if not attempts:
        return None
    row = attempts[-1]
    code, signal = parse_exit_code(row.get("ExitCode", "0:0"))
    workdir = _none(row.get("WorkDir"))
    stdout = sacct_log_path(row.get("StdOut"), row)
    guessed = guess_log(Path(workdir), job_id) if stdout is None and workdir else None
    return JobInfo(
        job_id=job_id,
        name=row.get("JobName", ""),
        state=base_state(row.get("State", "")),
        reason=current_reason(base_state(row.get("State", "")), _none(row.get("Reason"))),
        nodes=_none(row.get("NodeList")),
        num_nodes=_int(row.get("NNodes"), 0),
        elapsed_s=parse_duration(row.get("Elapsed", "")),
        limit_s=parse_duration(row.get("Timelimit", "")),
        exit_code=code,
        signal=signal,
        restarts=len(attempts) - 1,
        stdout=stdout,
        stderr=sacct_log_path(row.get("StdErr"), row) or stdout,
        workdir=workdir,
        source="sacct",
        raw_id=_none(row.get("JobIDRaw")),
        guessed_log=guessed,
    )


# SLURM's filename pattern letters that a job's own record decides (sbatch(1)); %t (the task)
# and %s (the step) name no single file of the job and stay for the caller.
_LOG_PATTERN = re.compile(r"%(\d*)([%AajJNnux])")


def sacct_log_path(value: str | None, row: Mapping[str, str]) -> str | None:
    """sacct's StdOut/StdErr as a file name. sacct (SLURM >= 23.02) keeps the pattern as
    given (``/w/%x-%j.out``), unlike scontrol, which prints it expanded: expanded here as
    SLURM expands it for the batch step (the first node is %N, node index 0)."""
    path = _none(value)
    if path is None or "%" not in path:
        return path
    job_id = row.get("JobID", "")
    array_job, _, array_task = job_id.partition("_")
    first_node = ""
    nodes = _none(row.get("NodeList"))
    if nodes:
        try:
            first_node = expand_nodelist(nodes)[0]
        except NodeListError:
            first_node = nodes
    values = {
        "j": row.get("JobIDRaw") or job_id,
        "J": row.get("JobIDRaw") or job_id,
        "A": array_job,
        "a": array_task or "4294967294",  # what SLURM writes for a job outside an array
        "x": row.get("JobName", ""),
        "u": row.get("User", ""),
        "N": first_node,
        "n": "0",
    }

    def one(match: re.Match[str]) -> str:
        width, letter = match.groups()
        if letter == "%":
            return "%"
        value = values.get(letter) or match.group(0)
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _LOG_PATTERN.sub(one, path)


def guess_log(workdir: Path, job_id: str) -> str | None:
    """A log in the job's working directory whose name holds its id (``slurm-123.out``,
    ``name-123.out``): SLURM < 23.02 keeps no log path once the controller forgot the job."""
    named = re.compile(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])")
    try:
        found = sorted(
            (_looks_like_stderr(path.name), path)
            for path in workdir.iterdir()
            if path.suffix in (".out", ".log") and named.search(path.name) and path.is_file()
        )
    except OSError:
        return None
    return str(found[0][1]) if found else None


def _looks_like_stderr(name: str) -> bool:
    """``e-123.log``, ``x-123.err.log``: a guess's last choice for a job's stdout."""
    return bool(re.search(r"(^e[-_.]|err)", name))


def _run(argv: Sequence[str], fresh: bool = False) -> subprocess.CompletedProcess[str] | None:
    """A SLURM client's output, shared through the user's view (``fresh``: asked now); None
    where the client is not installed (a silent controller is one line, from
    slurm.tools.slurm_tool)."""
    if shutil.which(argv[0]) is None:
        return None
    return userjobs.shared_answer(list(argv), fresh)


def view_record(row: Mapping[str, str]) -> dict[str, str]:
    """A row of the user's view (squeue's fields) as ``scontrol show job -o`` names them;
    the log paths expanded as scontrol prints them."""
    task = row.get("ArrayTaskID", "")
    raw = int(row["exit_code"]) if row.get("exit_code", "").isdigit() else 0
    names = {
        "JobID": row.get("JobArrayID", ""),
        "JobIDRaw": row.get("JobID", ""),
        "JobName": row.get("Name", ""),
        "User": row.get("UserName", ""),
        "NodeList": row.get("NodeList", ""),
    }
    return {
        "JobId": row.get("JobID", ""),
        "ArrayJobId": row.get("ArrayJobID", "") if task.isdigit() else "",
        "ArrayTaskId": task if task.isdigit() else "",
        "JobName": row.get("Name", ""),
        "JobState": row.get("State", ""),
        "Reason": row.get("Reason", ""),
        "NodeList": row.get("NodeList", ""),
        "NumNodes": row.get("NumNodes", ""),
        "RunTime": row.get("TimeUsed", ""),
        "TimeLimit": row.get("TimeLimit", ""),
        # squeue gives the wait status: the code in its high byte, a signal in its low bits
        "ExitCode": f"{raw >> 8}:{raw & 0x7F}",
        "Restarts": row.get("RestartCnt", ""),
        "StdOut": sacct_log_path(row.get("STDOUT"), names) or "",
        "StdErr": sacct_log_path(row.get("STDERR"), names) or "",
        "WorkDir": row.get("WorkDir", ""),
        "SubmitTime": row.get("SubmitTime", ""),
        "StartTime": row.get("StartTime", ""),
        "EndTime": row.get("EndTime", ""),
        "Dependency": row.get("Dependency", ""),
    }


def scontrol_records(job_id: str) -> list[dict[str, str]]:
    """The controller's records of a job (several for an array); [] once it forgot it.
    The user's own jobs come from the shared view; another user's from scontrol; over
    slurmrestd, from the daemon."""
    if rest.chosen():
        return rest.client().job_records(job_id)
    rows = userjobs.user_rows(job_id)
    if rows:
        return [view_record(row) for row in rows]
    proc = _run(["scontrol", "show", "job", "-o", job_id])
    if proc is None or proc.returncode != 0:
        return []  # "Invalid job id specified": unknown, or ended more than MinJobAge ago
    return parse_scontrol_records(proc.stdout)


def sacct_rows(job_id: str, fresh: bool = False) -> list[dict[str, str]]:
    """sacct's rows of a job, its steps and every attempt (``-D``); [] when unknown.
    ``fresh``: asked now, not the answer the user's view keeps."""
    if rest.chosen():
        return rest.client().db_rows(job_id)
    base = ["sacct", "-j", job_id, "-P", "-D"]
    proc = _run([*base, "--format=" + ",".join(SACCT_FIELDS + SACCT_LOG_FIELDS)], fresh)
    if proc is not None and proc.returncode != 0 and "Invalid field" in proc.stderr:
        proc = _run([*base, "--format=" + ",".join(SACCT_FIELDS)], fresh)  # SLURM < 23.02
    if proc is None or proc.returncode != 0:
        return []
    return parse_sacct(proc.stdout)


def query_jobs(job_id: str) -> list[JobInfo]:
    """What SLURM knows of ``job_id`` (one JobInfo, or one per task of an array); [] if
    neither the controller nor the database knows it."""
    records = scontrol_records(job_id)
    seen = userjobs.seen()
    if records:
        infos = [dataclasses.replace(from_scontrol(record), seen=seen) for record in records]
        return [_ended(infos[0])] if len(infos) == 1 else infos
    rows = sacct_rows(job_id)
    ids = list(dict.fromkeys(row["JobID"] for row in job_rows(rows)))
    found = [from_sacct(rows, one) for one in ids]
    return [_unanswered(info, seen) for info in found if info is not None]


def _ended(info: JobInfo) -> JobInfo:
    """A job COMPLETING with its end as SLURM's database has it, once written there (as
    slurm_job_state gives a waiter): a status after ``submit --wait`` says the same end."""
    if info.state != "COMPLETING":
        return info
    return dataclasses.replace(info, state=_completing_end(info.job_id))


def _completing_end(job_id: str) -> str:
    """The final state of a job the controller shows COMPLETING, asked of SLURM's database
    now (it writes the end there as the job ends); COMPLETING until it is written."""
    final = _sacct_state(userjobs.shared_answer, job_id, fresh=True)
    return final if final in FINAL_STATES else "COMPLETING"


def _unanswered(info: JobInfo, seen: Seen | None) -> JobInfo:
    """A record of SLURM's database while the controller is silent: its end is final, any
    other state lags the controller's (a running job can read PENDING there)."""
    if seen is None or not seen.silent or info.state in FINAL_STATES:
        return info
    return dataclasses.replace(info, state=UNANSWERED, seen=Seen(None, seen.silent_since))


def query_job(job_id: str) -> JobInfo | None:
    """The one job (or array task) ``job_id`` names; None if SLURM does not know it."""
    return pick_job(query_jobs(job_id), job_id)


def pick_job(found: Sequence[JobInfo], job_id: str) -> JobInfo | None:
    """The one of ``found`` (query_jobs' answer) that ``job_id`` names; None if none."""
    exact = [info for info in found if info.job_id == job_id]
    if exact:
        return exact[0]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class JobSummary:
    """One line of ``hpcdist list``: a job of this user that SLURM knows."""

    job_id: str
    state: str
    elapsed_s: float | None  # every start's time in all (the latest one's: the queue's)
    name: str
    starts: int = 1  # a requeued job starts again under its id: sacct -D has a row per start
    before_s: float = 0.0  # the time of the starts before the latest


def accounted_summaries(text: str) -> list[JobSummary]:
    """``sacct -D`` lines (one per start of a requeued job, the latest last): one summary
    per job, its time that of every start, its state the latest's."""
    jobs: dict[str, JobSummary] = {}
    for job in _summaries(text):
        earlier = jobs.get(job.job_id)
        if earlier is not None:
            before = earlier.elapsed_s or 0.0  # every start before this one
            job = dataclasses.replace(
                job,
                elapsed_s=before + (job.elapsed_s or 0.0),
                starts=earlier.starts + 1,
                before_s=before,
            )
        jobs[job.job_id] = job
    return list(jobs.values())


def _summaries(text: str) -> list[JobSummary]:
    """``ID|STATE|ELAPSED|NAME`` lines (the name last: it may hold '|')."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        job_id, state, elapsed, name = [*line.split("|", 3), "", "", ""][:4]
        out.append(JobSummary(job_id.strip(), base_state(state), parse_duration(elapsed), name))
    return out


def merge_summaries(
    live: Sequence[JobSummary], accounted: Sequence[JobSummary]
) -> list[JobSummary]:
    """The queue's view of a job wins over the database's (which lags it), the time of its
    earlier starts added (the queue counts the latest start's only); newest first."""
    merged = {job.job_id: job for job in accounted}
    for job in live:
        known = merged.get(job.job_id)
        if known is not None and known.starts > 1:
            total = (job.elapsed_s or 0.0) + known.before_s
            job = dataclasses.replace(
                job, elapsed_s=total, starts=known.starts, before_s=known.before_s
            )
        merged[job.job_id] = job

    def order(job: JobSummary) -> tuple[int, str]:
        head = job.job_id.split("_")[0]
        return (int(head) if head.isdigit() else -1, job.job_id)

    return sorted(merged.values(), key=order, reverse=True)


def recent_jobs(since: str = "now-1days") -> list[JobSummary]:
    """This user's jobs in the queue and those accounted for since ``since`` (sacct's
    ``--starttime``: ``now-1days``, ``2026-11-26T09:00:00``): one squeue and one sacct
    call for all of them."""
    if rest.chosen():
        live = [
            JobSummary(task_id(r), base_state(r["JobState"]), _duration(r["RunTime"]), r["JobName"])
            for r in rest.client().user_records()
        ]
        return merge_summaries(fold_pending(live), [])
    fields = "--format=JobID,State,Elapsed,JobName"
    # -t all: the controller also knows the jobs that ended in the last MinJobAge seconds,
    # which sacct may not list yet (its rows lag the end by a few seconds).
    view = userjobs.shared_view()
    if view is not None:
        rows = view.rows()
        live = fold_pending(
            [
                JobSummary(
                    r["JobArrayID"], base_state(r["State"]), _duration(r["TimeUsed"]), r["Name"]
                )
                for r in rows
            ]
        )
    else:
        proc = _run(["squeue", "--me", "-t", "all", "-h", "-o", "%i|%T|%M|%j"])
        live = _summaries(proc.stdout) if proc is not None and proc.returncode == 0 else []
    # -D: a row per start of a requeued job, so that its time is every start's.
    accounted = _run(["sacct", "-X", "-D", "-P", "-n", "-S", since, fields])
    text = accounted.stdout if accounted is not None and accounted.returncode == 0 else ""
    return merge_summaries(live, accounted_summaries(text))


def fold_pending(jobs: Sequence[JobSummary]) -> list[JobSummary]:
    """The pending tasks of an array as one row, ``123_[5-999]``, as squeue shows them (a
    sweep of thousands is one line until its tasks start)."""
    out: list[JobSummary] = []
    pending: dict[str, list[int]] = {}
    for job in jobs:
        array, _, task = job.job_id.partition("_")
        if job.state == "PENDING" and task.isdigit():
            pending.setdefault(array, []).append(int(task))
        else:
            out.append(job)
    names = {job.job_id.partition("_")[0]: job.name for job in jobs}
    for array, tasks in pending.items():
        tasks.sort()
        runs, start = [], tasks[0]
        for before, after in zip(tasks, [*tasks[1:], None], strict=True):
            if after != before + 1:
                runs.append(f"{start}-{before}" if before != start else str(start))
                start = after if after is not None else start
        shown = runs[0] if len(tasks) == 1 else f"[{','.join(runs)}]"
        out.append(JobSummary(f"{array}_{shown}", "PENDING", 0.0, names[array]))
    return out


def _duration(text: str) -> float | None:
    try:
        return parse_duration(text)
    except SlurmOutputError:
        return None


def slurm_job_state(job_id: str, within: float | None = None) -> str:
    """The one answer to "what state is job X" for a job of SLURM's. The controller's view
    first: sacct lags it and, while a job is being requeued, can briefly report the ending
    attempt as FAILED. sacct answers once the controller has forgotten the job (MinJobAge
    after it ended). While the controller is silent, sacct's final state, else UNANSWERED.
    ``within``: a waiter's question (userjobs.SharedView.current). A job COMPLETING has its
    final state in sacct already (SLURM wrote it there as the job ended): a waiter and a
    status after it say the same state."""
    if rest.chosen():
        return _rest_state(job_id)
    rows = userjobs.user_rows(job_id, within)
    if rows:
        own = [row for row in rows if row["JobArrayID"] == job_id]
        if own and base_state(own[0]["State"]) == "COMPLETING":
            return _completing_end(job_id)
        if own:  # a job, or one task
            return base_state(own[0]["State"])
        return "\n".join(base_state(row["State"]) for row in rows)  # an array: one line a task
    ask = slurm_tool if rows is None else userjobs.shared_answer
    queue = ask(["squeue", "-t", "all", "-h", "-j", job_id, "-o", "%T"])
    live = queue.stdout.strip().upper()
    if queue.returncode == 0 and live:
        return live
    state = _sacct_state(ask, job_id)
    seen = userjobs.seen() if rows is not None else None
    ended = all(one in FINAL_STATES for one in state.splitlines())  # an array: every task
    silent = seen is not None and seen.silent and not ended
    return UNANSWERED if silent else state


def _rest_state(job_id: str) -> str:
    """slurm_job_state over slurmrestd: the controller's record, else the database's."""
    records = rest.client().job_records(job_id)
    own = [r for r in records if task_id(r) == job_id]
    if own or records:
        states = [base_state(r["JobState"]) for r in own or records]
        if len(states) == 1 and states[0] == "COMPLETING":
            ended = [r for r in sacct_rows(job_id) if r["JobID"] == job_id]
            return base_state(ended[-1]["State"]) if ended else "COMPLETING"
        return "\n".join(states)
    rows = [row for row in job_rows(sacct_rows(job_id)) if row["JobID"] == job_id]
    return base_state(rows[-1]["State"]) if rows else "UNKNOWN"


def _sacct_state(ask: Callable[..., Any], job_id: str, fresh: bool = False) -> str:
    argv = ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State"]
    return sacct_state((ask(argv, True) if fresh else ask(argv)).stdout, job_id)


def sacct_state(text: str, job_id: str) -> str:
    """The state of ``job_id`` from ``sacct -X -n -P -o JobID,State``: "CANCELLED by 0" is
    CANCELLED; a requeued job lists its latest attempt last. An array's own row stands for
    its tasks that have not started and reads PENDING while they run: where its tasks have
    rows, their states answer (one line each, as squeue's do)."""
    rows = [line.split("|", 1) for line in text.splitlines() if "|" in line]
    states = {}
    for row_id, state in rows:
        if state.strip():
            states[row_id.strip()] = state.split()[0].upper()
    tasks = [state for row_id, state in states.items() if row_id.startswith(job_id + "_")]
    if tasks:
        return "\n".join(tasks)
    own = [state.split()[0].upper() for row_id, state in rows if row_id.strip() == job_id]
    return own[-1] if own else "UNKNOWN"


def controller_knows(job: str) -> bool:
    """Whether the controller knows ``job`` (queued, running or recently ended: squeue)."""
    if rest.chosen():
        return bool(rest.client().job_records(job))
    if userjobs.user_rows(job):
        return True
    proc = slurm_tool(["squeue", "-t", "all", "-h", "-j", job, "-o", "%i"])
    return proc.returncode == 0 and bool(proc.stdout.strip())


@dataclass(frozen=True)
class Attempt:
    """One start of a job: a requeued job has one per start (sacct ``-D``), each with its
    own submit (the requeue), start and end."""

    job_id: str
    state: str
    submit: float | None  # seconds since the epoch
    start: float | None
    end: float | None
    elapsed_s: float | None
    limit_s: float | None
    nodes: str | None

    @property
    def queued_s(self) -> float | None:
        """Seconds it waited in the queue (None before it starts)."""
        if self.submit is None or self.start is None or self.state == "PENDING":
            return None
        return max(0.0, self.start - self.submit)


parse_time = parse_timestamp  # the name status and its tests know


def _attempt(job_id: str, fields: Mapping[str, str], names: Mapping[str, str]) -> Attempt:
    return Attempt(
        job_id=job_id,
        state=base_state(fields.get(names["state"], "")),
        submit=parse_time(fields.get(names["submit"])),
        start=parse_time(fields.get(names["start"])),
        end=parse_time(fields.get(names["end"])),
        elapsed_s=parse_duration(fields.get(names["elapsed"], "")),
        limit_s=parse_duration(fields.get(names["limit"], "")),
        nodes=_none(fields.get(names["nodes"])),
    )


_SACCT_NAMES = {
    "state": "State",
    "submit": "Submit",
    "start": "Start",
    "end": "End",
    "elapsed": "Elapsed",
    "limit": "Timelimit",
    "nodes": "NodeList",
}
_SCONTROL_NAMES = {
    "state": "JobState",
    "submit": "SubmitTime",
    "start": "StartTime",
    "end": "EndTime",
    "elapsed": "RunTime",
    "limit": "TimeLimit",
    "nodes": "NodeList",
}


def job_attempts(job_id: str) -> list[Attempt]:
    """Every start of ``job_id``, oldest first: the database's rows of the ended ones, the
    controller's view of the latest (the database lags it)."""
    rows = [row for row in job_rows(sacct_rows(job_id)) if row.get("JobID") == job_id]
    attempts = [_attempt(job_id, row, _SACCT_NAMES) for row in rows]
    live = [rec for rec in scontrol_records(job_id) if task_id(rec) == job_id]
    if not live:
        return attempts
    now = _attempt(job_id, live[0], _SCONTROL_NAMES)
    ended = [
        a
        for a in attempts
        if a.state not in ("PENDING", "RUNNING") and (a.start is None or a.start != now.start)
    ]
    return [*ended, now]
