"""``hpcdist submit`` and ``cancel``; ``status``, ``logs`` and ``list`` are in cli_follow."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hpcdist.cli.follow import follow, record_log_names, unknown_job
from hpcdist.jobs.logpaths import expand_pattern
from hpcdist.jobs.logread import one_line
from hpcdist.jobs.records import (
    FINAL_STATES,
    JobRecord,
    cancel,
    find_record,
    job_state,
    shown_state,
)
from hpcdist.jobs.submit import EXECUTORS
from hpcdist.render.directives import warning_text
from hpcdist.slurm.freshness import shown
from hpcdist.slurm.userjobs import seen
from hpcdist.spec.options import job_options, spec_and_profile


@click.command()
@job_options
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="auto",
    help="slurm, local processes, or auto: slurm where sbatch is on PATH.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow rank 0's log; exit 0 only if COMPLETED.")
@click.option("--no-preflight", is_flag=True, help="Skip `sbatch --test-only`.")
def submit(executor: str, dry_run: bool, wait: bool, no_preflight: bool, **options: Any) -> int:
    """Queue the script `render` prints through submitit; print its id, state and logs."""
    from hpcdist.jobs import submit as submission
    from hpcdist.jobs.leadcheck import lead_warning

    spec, profile = spec_and_profile(options)
    # --transport (set already) > $HPCDIST_TRANSPORT > the profile's keys.
    for var, value in (
        ("HPCDIST_TRANSPORT", profile.transport),
        ("HPCDIST_SLURMRESTD", profile.slurmrestd),
    ):
        if value and not os.environ.get(var):
            os.environ[var] = value
    if warning := lead_warning(spec):
        click.echo(warning, err=True)
    # One plan: --dry-run prints it, a submission carries it out.
    plan = submission.plan_submission(spec, executor, preflight_check=not no_preflight)
    if dry_run:
        click.echo(json.dumps(plan.describe(), indent=2, default=list))
        return 0
    result = submission.carry_out(plan)
    record = result.record
    click.echo(f"Submitted job {record.job_id} ({result.executor}, {spec.mode}, {spec.shape})")
    if record.points is not None and "_" not in record.job_id and len(record.points) > 1:
        return _submitted_array(record, spec.max_parallel, wait, spec.output)
    click.echo(f"  state: {shown_state(record, states_line(job_state(record)))}")
    click.echo(f"  warning: {warning_text(spec)}")
    logs = [("logs", tasks_logs(record, spec.output))] if spec.array else []
    for label, path in logs or record_log_names(record):
        click.echo(f"  {label}: {path}")
    if not wait:
        return 0
    try:
        state = follow(record, rank=0, within=WAIT_LOOK_S)
    except KeyboardInterrupt:
        return _stopped_following(record)
    click.echo(f"Job {record.job_id} ended {state}")
    return 0 if state == "COMPLETED" else 1


# submit --wait looks at its job at least this often, so that it reports the job's end
# within seconds of SLURM's: about 10 controller queries a minute while one job is waited for
# (sbatch --wait asks every 32 s at most; a person waiting is told the end late otherwise).
WAIT_LOOK_S = 6.0


def _stopped_following(record: JobRecord) -> int:
    """Ctrl-C stops the following, not the job: say so, and how to reach it again; a job
    that has ended (by then, or of the Ctrl-C) is said to have ended, with its state."""
    job_id = record.job_id
    state = job_state(record)
    if all(one in FINAL_STATES for one in state.splitlines()):
        click.echo(f"\nhpcdist: aborted; job {job_id} ended {states_line(state)}", err=True)
        return 130
    click.echo(
        f"\nhpcdist: aborted; job {job_id} keeps running ({states_line(state)}): hpcdist status "
        f"{job_id}, hpcdist logs {job_id} --follow, hpcdist cancel {job_id}",
        err=True,
    )
    return 130


def states_line(state: str) -> str:
    """A job's state; an array's (one line a task) counted on one line:
    ``3 PENDING, 1 RUNNING (4 tasks)``."""
    states = state.splitlines()
    if len(states) <= 1:
        return state
    counted = ", ".join(f"{n} {one}" for one, n in Counter(states).items())
    return f"{counted} ({len(states)} tasks)"


def task_log(record: JobRecord, output: str, task_id: str) -> str | None:
    """The log of an array's task where its name is known now (``%A_%a``); None where it
    holds the task's own job id (``%j``), which SLURM gives the task when it starts."""
    if re.search(r"%[0-9]*[jJ]", output):
        return None
    path = Path(expand_pattern(output, task_id, record.name))
    return str(path if path.is_absolute() else Path(record.workdir or record.folder) / path)


def tasks_logs(record: JobRecord, output: str) -> str:
    """Where an array's tasks write, in one line."""
    example = f"hpcdist logs {record.job_id}_<task>"
    if task_log(record, output, f"{record.job_id}_0") is None:
        return (
            f"each task's own, named by the job id SLURM gives the task when it starts "
            f"({output}): {example}"
        )
    return f"each task's own ({output}): {example}"


def _submitted_array(record: JobRecord, max_parallel: int | None, wait: bool, output: str) -> int:
    """An array's tasks, each with its point and log (a big sweep: each array it was
    queued as); with --wait, every task to its end."""
    from hpcdist.jobs.arrays import wait_for_tasks
    from hpcdist.jobs.report import record_arrays, task_ids

    points = record.points or []
    arrays = record_arrays(record)
    at_once = f", at most {max_parallel} at once" if max_parallel else ""
    click.echo(f"  array: {len(points)} tasks{at_once}")
    if arrays is not None and len(arrays) > 1:
        click.echo(f"  queued as {len(arrays)} arrays (the site's MaxArraySize):")
        for array in arrays:
            last = array.first + array.count - 1
            click.echo(f"    {array.array_id}: points {array.first}-{last}")
    tasks = task_ids(record)
    if task_log(record, output, record.job_id) is None:
        click.echo(f"  logs: {tasks_logs(record, output)}")
    for task_id, point in tasks[:LISTED_TASKS]:
        log = task_log(record, output, task_id)
        click.echo(f"  {task_id}: {' '.join(point)}" + ("" if log is None else f"; log: {log}"))
    if len(tasks) > LISTED_TASKS:
        click.echo(f"  ... {len(tasks) - LISTED_TASKS} more (hpcdist status {record.job_id})")
    if not wait:
        return 0
    try:
        states = wait_for_tasks(
            record.job_id,
            len(points),
            _task_reporter(len(points)),
            arrays=arrays,
        )
    except KeyboardInterrupt:
        return _stopped_following(record)
    ended = sum(state == "COMPLETED" for state in states.values())
    click.echo(f"Job {record.job_id} ended: {ended} of {len(states)} tasks COMPLETED")
    from hpcdist.jobs.report import collect, table

    click.echo(table(collect(record.job_id)), nl=False)  # what `hpcdist report` prints
    return 0 if ended == len(states) else 1


# Tasks of an array named one by one; a bigger one is followed by its counts.
LISTED_TASKS = 20


def _task_reporter(count: int) -> Callable[[str, str], None]:
    """Each task's change of state, for a small array; a big one's count of ended tasks,
    at most once a second."""
    if count <= LISTED_TASKS:
        return lambda task, state: click.echo(f"  {task} {one_line(shown(state, seen()))}")
    ended: dict[str, bool] = {}
    said = [0.0, -1]

    def report(task: str, state: str) -> None:
        ended[task] = state in FINAL_STATES
        done = sum(ended.values())
        if done != said[1] and (time.monotonic() - said[0] >= 1.0 or done == count):
            click.echo(f"  {done} of {count} tasks ended")
            said[:] = [time.monotonic(), done]

    return report


@click.command(name="cancel")
@click.argument("job_id")
def cancel_command(job_id: str) -> int:
    """Cancel a job."""
    record = find_record(job_id)
    # An array answers one state per task: said once each, in order.
    answer = cancel(record) if record is not None else _cancel_slurm_job(job_id)
    states = list(dict.fromkeys(s.strip() for s in answer.splitlines() if s.strip()))
    state = one_line(", ".join(states))  # SLURM's words of a job found there: escaped
    if states and all(one in FINAL_STATES for one in states):
        click.echo(f"Job {job_id} had already ended ({state}); nothing to cancel")
    else:
        click.echo(f"Cancelled job {job_id} (was {state})")
    return 0


def _cancel_slurm_job(job_id: str) -> str:
    """A job that `hpcdist list` shows without a record here (``sbatch hpc/train.sh``, or
    another folder's): SLURM's own, cancelled there; SLURM refuses other users' jobs."""
    import shutil

    from hpcdist.slurm.cluster import scancel
    from hpcdist.slurm.query import query_jobs

    # An array answers one JobInfo per task (and one for its tasks that wait).
    found = query_jobs(job_id) if shutil.which("scontrol") or shutil.which("sacct") else []
    if not found:
        raise unknown_job(job_id)
    states = "\n".join(info.state for info in found)
    if all(info.state in FINAL_STATES for info in found):
        return states
    scancel(job_id)
    return states
