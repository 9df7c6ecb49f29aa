"""``hpcdist status``, ``logs`` and ``list`` for any SLURM job, not only this folder's.

A job submitted with ``hpcdist submit`` from this folder has a record (its per-rank logs,
or a local executor); any other job id is looked up in SLURM (``hpcdist.slurm.query``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from hpcdist.errors import UserError
from hpcdist.facts.launch import rank_log_pattern
from hpcdist.facts.protocol import REQUEUE_EXIT_CODE, WARNING_KILLED
from hpcdist.jobs.badnodeview import describe_held, held_nodes
from hpcdist.jobs.logpaths import (
    array_logs_line,
    array_tasks,
    job_logs,
    missing_log,
    no_log_line,
)
from hpcdist.jobs.logread import one_line, printable, read_log_bytes, read_log_text
from hpcdist.jobs.records import (
    FINAL_STATES,
    JobRecord,
    check_job_id,
    find_record,
    job_state,
    list_records,
    local_elapsed,
    read_log,
    scan_records,
)
from hpcdist.slurm import freshness, userjobs
from hpcdist.slurm.freshness import UNANSWERED
from hpcdist.slurm.parse import format_duration
from hpcdist.slurm.query import JobInfo, pick_job, query_job, query_jobs

# A job SLURM no longer knows has ended too, as far as following its log goes.
_ENDED = FINAL_STATES | {"UNKNOWN"}


def unknown_job(job_id: str) -> UserError:
    """A job id neither this folder's records nor SLURM know."""
    return UserError(
        f"job {job_id!r} was not submitted from this folder and SLURM does not "
        "know it (scontrol show job, sacct); expected an id from `hpcdist list`"
    )


def _newest_id() -> str:
    records = list_records()
    if not records:
        raise click.UsageError("no jobs submitted from this folder yet; name a job id")
    return records[0].job_id


# How long `status` waits for SLURM's database to finish an ended job's record.
FINAL_RECORD_WAIT_S = 10.0
_NOT_FINAL = (
    "not final yet: SLURM's database has not finished the job's record; ask again in a few seconds"
)


def _efficiency(infos: Sequence[JobInfo]) -> dict[str, tuple[Any, str, str | None]]:
    """job id -> (Efficiency, summary line, advice) for the jobs that have ended, from
    sacct's final record of them (one read as the job ran or ended lacks its CPU time)."""
    ended = [info for info in infos if info.state in FINAL_STATES]
    if not ended:
        return {}
    from hpcdist.jobs import efficiency as eff
    from hpcdist.jobs.logpaths import job_record
    from hpcdist.slurm.query import sacct_rows

    asked = ended[0].job_id.split("_")[0] if len(ended) > 1 else ended[0].job_id
    ids = [info.job_id for info in ended]
    final = eff.final_rows(lambda fresh: sacct_rows(asked, fresh), ids, FINAL_RECORD_WAIT_S)
    if final is None:
        return {info.job_id: (None, _NOT_FINAL, None) for info in ended}
    rows = final
    out = {}
    for info in ended:
        found = eff.efficiency(rows, info.job_id)
        if found is not None and found.limit_s is None and info.limit_s is not None:
            # A row written as the job ended can lack its limit for a moment (seen on SLURM
            # 22.05); the controller's record (or the view) holds it.
            found = dataclasses.replace(found, limit_s=info.limit_s)
        if found is not None:
            request = eff.Request.from_record(job_record(info, [Path.cwd()]))
            out[info.job_id] = (found, eff.summary(found), eff.advice(found, request))
    return out


def exit_text(code: int, signal_number: int, reason: str | None) -> str:
    """``3``, ``0, killed by signal 9 (SIGKILL)``; SLURM also writes numbers there that are
    no signal (a launch failure reads 0:53): said as such, with the reason."""
    if signal_number == 0:
        return _shell_status(code)
    try:
        name = signal.Signals(signal_number).name
    except ValueError:
        name = None
    if name is not None and signal_number < signal.SIGRTMIN:
        return (
            f"{code}, killed by signal {signal_number} ({name}){_OOM if signal_number == 9 else ''}"
        )
    why = f"; reason {reason}" if reason else ""
    return f"{code} (no signal: SLURM's signal field reads {signal_number}{why})"


_OOM = ": likely out of memory (the OOM killer's signal), see the memory under efficiency"


def _shell_status(code: int) -> str:
    """An exit code as the shell reports a death by signal (128 + N): the batch script's
    runner exits 137 where srun saw a rank die of SIGKILL."""
    try:
        name = signal.Signals(code - 128).name if 128 < code < 128 + signal.SIGRTMIN else None
    except ValueError:
        name = None
    if code == REQUEUE_EXIT_CODE:
        return (
            f"{code} (the command checkpointed and asked for a requeue, which was not made; "
            "the job's log says why)"
        )
    if name is None:
        return str(code)
    oom = _OOM if code == 137 else ""
    return f"{code} (128 + {code - 128}: a rank was killed by signal {code - 128}, {name}){oom}"


def reason_text(info: JobInfo) -> str:
    """SLURM's reason, said true: it names a batch shell that a signal killed after it ran
    JobLaunchFailure (22.05), though the job launched."""
    reason = info.reason or ""
    if reason == "JobLaunchFailure" and info.signal and (info.elapsed_s or 0) > 0:
        return (
            f"{reason} (SLURM's word here for a batch shell killed by signal {info.signal} "
            f"after it ran {format_duration(info.elapsed_s or 0)}: the job did launch)"
        )
    return reason


def _describe(info: JobInfo, summary: str | None, advice: str | None) -> list[str]:
    lines = [f"{one_line(info.job_id)} {freshness.shown(info.state, info.seen)}"]
    rows: list[tuple[str, str]] = [("name", info.name)]
    if info.state == UNANSWERED:  # nothing the controller said: no nodes, times or code
        return [*lines, *(f"  {key + ':':<11} {one_line(value)}" for key, value in rows)]
    if info.reason is not None:
        rows.append(("reason", reason_text(info)))
    rows.append(("nodes", f"{info.nodes} ({info.num_nodes})" if info.nodes else "none yet"))
    rows.append(
        ("elapsed", f"{format_duration(info.elapsed_s or 0)} of {format_duration(info.limit_s)}")
    )
    if info.state not in ("PENDING", "RUNNING"):
        rows.append(("exit code", exit_text(info.exit_code, info.signal, info.reason)))
        killed = warning_killed(info.stdout)
        if killed is not None:
            rows.append(("warning", killed))
    rows.append(("restarts", str(info.restarts)))
    if info.stdout is None and info.guessed_log:
        rows.append(("logs", f"{info.guessed_log} ({_GUESSED})"))
    else:
        rows.append(("stdout", info.stdout or "unknown"))
    if info.stderr and info.stderr != info.stdout:
        rows.append(("stderr", info.stderr))
    if summary is not None:
        rows.append(("efficiency", summary))
    if advice is not None:
        rows.append(("advice", advice))
    lines.extend(f"  {key + ':':<11} {one_line(value)}" for key, value in rows)
    return lines


def warning_killed(log: str | None) -> str | None:
    """The runner's line in the job's log saying that the warning signal killed the command
    (it did not catch it) and what makes it checkpoint; None where there is none."""
    if not log:
        return None
    try:
        text = read_log_text(Path(log))
    except (OSError, UserError):
        return None
    lines = [line for line in text.splitlines() if WARNING_KILLED in line]
    return lines[-1].partition("hpcdist: ")[2] or lines[-1] if lines else None


@click.command()
@click.argument("job_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per job, for scripts.")
def status(job_id: str | None, as_json: bool) -> int:
    """State of any SLURM job (default: the newest submitted from this folder): the reason
    while it waits; nodes, elapsed time against the limit, exit code and signal, restarts
    and log paths; after the end, how well it used its CPUs, memory and time. Of a run
    (RUN of `hpcdist list`, or a job of one): its pieces and the training's progress."""
    from hpcdist.cli import runs

    run = runs.run_or_job(job_id)
    if run is not None:  # a run id: the whole run
        return runs.show_run(run, as_json)
    job_id = check_job_id(job_id) if job_id is not None else _newest_id()
    record = find_record(job_id)
    infos = (
        [] if record is not None and record.executor != "slurm" else _slurm_infos(job_id, record)
    )
    if not infos:
        if record is None:
            raise unknown_job(job_id)
        state = job_state(record)
        click.echo(
            json.dumps({"job_id": job_id, "state": state, "executor": record.executor})
            if as_json
            else f"{job_id} {state}"
        )
        return 0
    if len(infos) > SUMMARY_ABOVE and not as_json:
        click.echo("\n".join(_summary(job_id, infos)))
        return 0
    effs = _efficiency(infos)
    run = runs.run_of_job(job_id)  # the run this job is a piece of, and its progress
    for info in infos:
        info = _with_log_paths(info)
        eff, summary, advice = effs.get(info.job_id, (None, None, None))
        held = held_nodes(_bad_node_key(run, info.job_id))  # the run's next pieces avoid
        if as_json:
            data = _job_json(info, eff, summary, advice)
            data["excluded_nodes"] = [record.to_dict() for record in held]
            data["run"] = None if run is None else runs.run_json(run)
            click.echo(json.dumps(data))
        else:
            lines = _describe(info, summary, advice)
            if held:
                lines.append(f"  {'excluded:':<11} {describe_held(held)}")
            click.echo("\n".join(lines))
    if run is not None and not as_json:
        click.echo("\n".join(runs.run_lines(run)))
    return 0


# An array of more tasks than this is summarised by state (--json still lists every task).
SUMMARY_ABOVE = 20


def _slurm_infos(job_id: str, record: JobRecord | None) -> list[JobInfo]:
    """What SLURM knows of a job, an array, or every array a sweep was queued as."""
    if record is not None and record.arrays and len(record.arrays) > 1:
        return [info for array in record.arrays for info in query_jobs(str(array[0]))]
    return query_jobs(job_id)


def _summary(job_id: str, infos: Sequence[JobInfo]) -> list[str]:
    """A big array's (or sweep's) tasks counted by state, those that failed named."""
    from hpcdist.jobs.arrays import summary

    states = [
        (i.job_id, i.state, f"exit code {exit_text(i.exit_code, i.signal, i.reason)}")
        for i in infos
    ]
    return [one_line(line) for line in [f"{job_id} {summary(states)[0]}", *summary(states)[1:]]]


def _job_json(info: JobInfo, eff: Any, summary: str | None, advice: str | None) -> dict[str, Any]:
    data: dict[str, Any] = dataclasses.asdict(info)
    data["warning"] = warning_killed(info.stdout) if info.state in FINAL_STATES else None
    data["efficiency"] = (
        None
        if eff is None
        else {
            **dataclasses.asdict(eff),
            "cpu_fraction": eff.cpu_fraction,
            "memory_fraction": eff.memory_fraction,
            "time_fraction": eff.time_fraction,
            "summary": summary,
            "advice": advice,
        }
    )
    return data


# srun --label's prefix of each line (--rank-logs label): the task number, padded.
_LABEL = re.compile(r"^ *([0-9]+): ")


def _rank_filter(rank: int | None) -> Callable[[str], bool]:
    """A rank's lines: labelled with its number by srun, or printed as '[Rank N]'."""
    if rank is None:
        return lambda line: True
    prefix = f"[Rank {rank}]"

    def keep(line: str) -> bool:
        label = _LABEL.match(line)
        return label.group(1) == str(rank) if label else line.startswith(prefix)

    return keep


def _unlabel(rank: int | None) -> Callable[[str], str]:
    """One rank's lines as it printed them, without srun's label."""
    if rank is None:
        return lambda line: line
    return lambda line: _LABEL.sub("", line, count=1)


def follow(record: JobRecord, rank: int, poll_s: float = 1.0, within: float | None = None) -> str:
    """Print rank ``rank``'s log as it grows until the job reaches a final state; return
    it. A SLURM job's log is the one its script names: the rank's labelled lines (label
    removed) and the batch shell's own lines, which carry no label. ``within``: the longest
    wait between looks at the job (``submit --wait``: userjobs.SharedView.current); a
    silent controller is said on stderr, and waited through."""
    if record.executor == "local":
        paths = [(record.log_path(rank, "out"), False), (record.log_path(rank, "err"), True)]
        return follow_files(paths, lambda: job_state(record), lambda line: True, poll_s)
    tell = _silence_teller()
    info = _with_log(record.job_id, rank, poll_s, tell)
    paths, keep, shown = _slurm_view(info, rank)

    def rank_or_batch(line: str) -> bool:
        return keep(line) or (_LABEL.match(line) is None and not line.startswith("[Rank "))

    def state() -> str:
        return tell(job_state(record, within))

    return follow_files(paths, state, rank_or_batch, poll_s, shown)


def _with_log(job_id: str, rank: int, poll_s: float, tell: Callable[[str], str]) -> JobInfo:
    """The job once SLURM (or its log record) names its log, or once it has ended: a job
    just queued may be known only to SLURM's database, which names no log before 23.02,
    and a silent controller names nothing until it answers."""
    while True:
        info = query_job(job_id)
        tell(UNANSWERED if info is None else info.state)
        if info is None and not _silent():
            raise unknown_job(job_id)
        if info is not None and (
            info.state in _ENDED or job_logs(info, rank, [Path.cwd()]).files()
        ):
            return info
        time.sleep(poll_s)


def _silent() -> bool:
    """Whether the controller is not answering the user's view now."""
    seen = userjobs.seen()
    return seen is not None and seen.silent


def _silence_teller() -> Callable[[str], str]:
    """A function of the state last seen that says on stderr when the controller stops
    answering (since when, and that state) and when it answers again; returns the state."""
    said: list[float | None] = [None]

    def tell(state: str) -> str:
        seen = userjobs.seen()
        since = None if seen is None or state in _ENDED else seen.silent_since
        if since != said[0] and since is not None:
            note = freshness.note(state, seen, time.time())
            click.echo(f"hpcdist: {note}; still waiting", err=True)
        elif since != said[0]:
            click.echo(f"hpcdist: the controller answers again ({_now()})", err=True)
        said[0] = since
        return state

    return tell


def _now() -> str:
    return freshness.clock(time.time())


def record_log_names(record: JobRecord) -> list[tuple[str, str]]:
    """(what, path) of the logs a user follows for a job of this folder."""
    if record.executor == "local":
        return [
            ("rank 0 log", str(record.log_path(0))),
            ("rank 0 err", str(record.log_path(0, "err"))),
        ]
    info = query_job(record.job_id)
    found = job_logs(info, None, [Path.cwd()]) if info is not None else None
    if found is not None and found.guessed:
        return [("log", f"{', '.join(map(str, found.guesses))} ({_GUESSED})")]
    if found is None or found.stdout is None:
        return [("log", "unknown (SLURM does not name it yet)")]
    names = [("log", str(found.stdout))]
    if found.stderr is not None and found.stderr != found.stdout:
        names.append(("err", str(found.stderr)))
    return names


def follow_files(
    paths: Sequence[tuple[Path, bool]],
    state: Callable[[], str],
    keep: Callable[[str], bool],
    poll_s: float = 1.0,
    shown: Callable[[str], str] = str,
) -> str:
    """Print the lines of ``(path, to_stderr)`` files as they grow, those ``keep`` accepts,
    until ``state()`` is final; return that state. A line is printed once it is whole."""
    offsets = {path: 0 for path, _ in paths}
    partial = {path: b"" for path, _ in paths}
    while True:
        current = state()
        for path, to_stderr in paths:
            chunk = read_log_bytes(path, offsets[path])
            offsets[path] += len(chunk)
            *whole, partial[path] = (partial[path] + chunk).split(b"\n")
            if current in _ENDED and partial[path]:
                whole, partial[path] = [*whole, partial[path]], b""
            for raw in whole:
                line = printable(raw.decode(errors="replace"))
                if keep(line):
                    click.echo(shown(line), err=to_stderr)
        if current in _ENDED:
            return current
        time.sleep(poll_s)


def _with_log_paths(info: JobInfo) -> JobInfo:
    """``info`` with the log paths its log record gives (SLURM's own otherwise); files
    named for the job, where none names its logs, as its guessed log, never as stdout."""
    found = job_logs(info, None, [Path.cwd()])
    return dataclasses.replace(
        info,
        stdout=None if found.stdout is None else str(found.stdout),
        stderr=None if found.stderr is None else str(found.stderr),
        guessed_log=", ".join(map(str, found.guesses)) or None,
    )


# What a guessed log is, where status and submit name one.
_GUESSED = (
    "files named for the job: SLURM no longer names its logs, and which of them is its "
    "stdout is not known"
)


def _record_in(folder: Path, job_id: str) -> JobRecord | None:
    """The job's record in the state of the folder it ran in, if it has one there."""
    try:
        return find_record(job_id, folder)
    except (UserError, OSError):
        return None


def _split_logs(paths: list[tuple[Path, bool]], rank: int | None) -> list[tuple[Path, bool]]:
    """A rank's own files beside the job's log (``--rank-logs split``), where they exist."""
    if rank is None:
        return []
    found = [(Path(rank_log_pattern(str(path), str(rank))), err) for path, err in paths]
    return [(path, err) for path, err in found if path.is_file()]


@click.command()
@click.argument("job_id")
@click.option(
    "--rank",
    type=int,
    default=None,
    help="Only this rank's lines (its label, its own file, or '[Rank N]'); a job of this "
    "folder: its log file (default 0).",
)
@click.option("--follow", "follow_", is_flag=True, help="Keep printing until the job ends.")
def logs(job_id: str, rank: int | None, follow_: bool) -> int:
    """Print a job's log (stdout, then stderr): any SLURM job, or one of this folder; a run's
    (``hpcdist list``'s RUN): every piece's, one after the other."""
    from hpcdist.cli import runs

    run = runs.run_or_job(job_id)
    if run is not None:
        if follow_:  # the pieces before it have ended: follow the last
            job_id = run.last.job_id
        else:
            click.echo(runs.merged_log(run), nl=False)
            return 0
    record = find_record(job_id)
    info = None
    if record is None or record.executor == "slurm":
        found = query_jobs(job_id)
        tasks = array_tasks(job_id, found)
        if tasks:  # each task has a log of its own: say which exist and how to pick one
            raise UserError(array_logs_line(job_id, tasks))
        info = pick_job(found, job_id)
        # A job of `hpcdist submit` from another folder: its record is in the folder it ran in.
        if record is None and info is not None and info.workdir:
            record = _record_in(Path(info.workdir), job_id)
    if record is not None and rank is not None and not 0 <= rank < record.tasks:
        raise click.BadParameter(
            f"{rank} is not a rank of job {job_id}; expected 0..{record.tasks - 1}",
            param_hint="--rank",
        )
    if record is not None and record.executor == "local":
        return _local_logs(record, job_id, 0 if rank is None else rank, follow_)
    if info is None:
        raise unknown_job(job_id)
    return _slurm_logs(info, job_id, rank, follow_)


def _local_logs(record: JobRecord, job_id: str, rank: int, follow_: bool) -> int:
    """A job of this folder's local executor: its rank's log file."""
    where = record.log_path(rank)
    if follow_:
        state = follow(record, rank)
        if not where.is_file():
            raise UserError(missing_log(f"rank {rank} of job {job_id}", state, [where]))
        return 0
    text = read_log(record, rank)
    if not text:  # nothing found never looks like an empty log
        state = job_state(record)
        if not where.is_file():
            raise UserError(missing_log(f"rank {rank} of job {job_id}", state, [where]))
        said = "is empty" if state in FINAL_STATES else "is empty so far"
        raise UserError(f"rank {rank} of job {job_id} ({state}): its log {where} {said}")
    click.echo(text, nl=False)
    return 0


def _slurm_logs(info: JobInfo, job_id: str, rank: int | None, follow_: bool) -> int:
    """A SLURM job: its log files, rank ``rank``'s lines of them (all: None)."""
    paths, keep, shown = _slurm_view(info, rank)
    if follow_:
        tell = _silence_teller()

        def current() -> str:
            found = query_job(job_id)
            if found is None:
                return tell(UNANSWERED if _silent() else "UNKNOWN")
            return tell(found.state)

        state = follow_files(paths, current, keep, shown=shown)
    else:
        state = info.state
    if not any(path.is_file() for path, _ in paths):  # nothing followed is no success
        where = [path for path, _ in paths]
        said = freshness.shown(state, info.seen)
        raise UserError(no_log_line(info, said, rank, where, [Path.cwd()]))
    if follow_:
        return 0
    printed = ""
    for path, _ in paths:  # both to stdout, as for a job of this folder
        if path.is_file():
            text = read_log_text(path)
            lines = text.splitlines(keepends=True)
            printed += "".join(shown(ln) for ln in lines if keep(ln))
    if not printed:  # nothing found never looks like an empty log
        whose = f"rank {rank} of job {job_id}" if rank is not None else f"job {job_id}"
        looked = ", ".join(str(path) for path, _ in paths)
        said = freshness.shown(info.state, info.seen)
        raise UserError(f"nothing for {whose} ({said}) in {looked}")
    click.echo(printed, nl=False)
    return 0


def _slurm_view(
    info: JobInfo, rank: int | None
) -> tuple[list[tuple[Path, bool]], Callable[[str], bool], Callable[[str], str]]:
    """A SLURM job's log files, and which of their lines are rank ``rank``'s (all: None)."""
    found = job_logs(info, rank, [Path.cwd()])
    if not found.files():
        from hpcdist.slurm import rest

        where = (
            " (slurmrestd serves no file: logs are read where the job wrote them, which this "
            "machine must mount)"
            if rest.chosen()
            else ""
        )
        raise UserError(
            f"no log of job {info.job_id} ({freshness.shown(info.state, info.seen)}) found; "
            f"looked in: {'; '.join(found.looked)}{where}"
        )
    paths = found.files()
    keep, shown = _rank_filter(rank), _unlabel(rank)
    if found.per_rank:  # the job's --rank-logs split files of this rank
        keep = _rank_filter(None)
    elif split := _split_logs(paths, rank):  # a job without a log record: its split files
        paths, keep = split, _rank_filter(None)
    return paths, keep, shown


@click.command(name="list")
def list_command() -> int:
    """This folder's jobs and this user's SLURM jobs of the last day, newest first, the
    jobs of one run (RUN) together."""
    from hpcdist.slurm.query import recent_jobs

    now = time.time()
    found, problems = scan_records()
    for problem in problems:  # one bad record is named, and spares the others
        click.echo(f"hpcdist: skipped: {problem}", err=True)
    records = {record.job_id: record for record in found}
    # One sacct call reaches back to the oldest SLURM record too: no query per record.
    since = min([now - 86400] + [r.submitted for r in records.values() if r.executor == "slurm"])
    click.echo(f"{'JOB':>12}  {'STATE':<11} {'ELAPSED':>10}  {'EXECUTOR':<8} {'RUN':<16} NAME")
    slurm = {
        job.job_id: job
        for job in recent_jobs(time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 60)))
    }
    rows: list[tuple[str, str, str, str, str]] = []
    for record in records.values():
        job = slurm.pop(record.job_id, None) if record.executor == "slurm" else None
        if record.executor == "slurm":
            state = job.state if job is not None else "UNKNOWN"
            elapsed = job.elapsed_s if job is not None else None
            starts = job.starts if job is not None else 1
        else:
            state = job_state(record)  # a local process: no SLURM query
            elapsed = local_elapsed(record)
            starts = 1
        shown = "-" if elapsed is None else format_duration(elapsed)
        if starts > 1:  # a requeued job: the time of all its starts, and how many
            shown += f" ({starts} starts)"
        rows.append((record.job_id, state, shown, record.executor, record.name))
    rows.extend(
        (
            job.job_id,
            job.state,
            format_duration(job.elapsed_s or 0)
            + (f" ({job.starts} starts)" if job.starts > 1 else ""),
            "-",
            job.name,
        )
        for job in slurm.values()
    )
    from hpcdist.cli.runs import group_by_run
    from hpcdist.jobs.runs import runs_by_job

    for run, row in group_by_run(sorted(rows, key=_newest_first), runs_by_job()):
        job_id, shown_state, shown_elapsed, executor, name = row
        click.echo(
            f"{job_id:>12}  {shown_state:<11} {shown_elapsed:>10}  {executor:<8} "
            f"{one_line(run):<16} {one_line(name)}"
        )
    waiting = [row[1] for row in rows if row[3] != "local" and row[1] not in FINAL_STATES]
    said = list_note(waiting, userjobs.seen(), now)
    if said:
        click.echo(said)
    return 0


def list_note(states: Sequence[str], seen: freshness.Seen | None, now: float) -> str:
    """The line under `list`'s table where SLURM's states of jobs that have not ended are
    old or the controller is silent ('' where they are current)."""
    said = next((note for one in states if (note := freshness.note(one, seen, now))), "")
    if not said or seen is None:
        return ""
    if seen.silent_since is not None:
        last = f"states as last seen at {freshness.clock(seen.at)}" if seen.at else "no states"
        return f"controller not answering since {freshness.clock(seen.silent_since)}; {last}"
    return f"states of jobs not ended: {said}"


def _newest_first(row: tuple[str, ...]) -> tuple[int, int, str]:
    head, _, task = row[0].partition("_")
    return (-int(head) if head.isdigit() else 0, -int(task) if task.isdigit() else 0, row[0])


def _bad_node_key(run: Any, job_id: str) -> str:
    """Whose bad-node record a job's status shows: its run folder's name, as the job keys
    it (``hpcdist.distributed.badnodes.run_key``; a ``--continue`` piece trains in the
    first job's folder), else the job id."""
    run_dir = run.last.run_dir if run is not None and run.pieces else ""
    return Path(run_dir).name if run_dir else job_id
