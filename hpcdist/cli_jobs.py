"""``hpcdist submit``, ``status``, ``logs``, ``cancel`` and ``list``."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from hpcdist.jobs import (
    FINAL_STATES,
    JobRecord,
    cancel,
    job_state,
    list_records,
    load_record,
    read_log,
)
from hpcdist.options import job_options, spec_from_options


@click.command()
@job_options
@click.option("--executor", type=click.Choice(("auto", "slurm", "local")), default="auto",
              help="slurm, local processes, or auto: slurm where sbatch is on PATH.")
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; submit nothing.")
@click.option("--wait", is_flag=True, help="Follow rank 0's log; exit 0 only if COMPLETED.")
@click.option("--no-preflight", is_flag=True, help="Skip `sbatch --test-only`.")
def submit(executor: str, dry_run: bool, wait: bool, no_preflight: bool, **options: Any) -> int:
    """Submit a job through submitit and print its id, state and log paths."""
    from hpcdist import submit as submission

    spec = spec_from_options(options)
    if dry_run:
        click.echo(json.dumps(submission.describe(spec, executor), indent=2, default=list))
        return 0
    result = submission.submit(spec, executor, preflight_check=not no_preflight)
    record = result.record
    click.echo(f"Submitted job {record.job_id} ({result.executor}, {spec.mode}, "
               f"{spec.nodes} nodes x {spec.tasks_per_node} tasks)")
    click.echo(f"  state: {job_state(record)}")
    click.echo(f"  rank 0 log: {record.log_path(0)}")
    if spec.error is not None or result.executor == "local":
        click.echo(f"  rank 0 err: {record.log_path(0, 'err')}")
    if not wait:
        return 0
    state = follow(record, rank=0)
    click.echo(f"Job {record.job_id} ended {state}")
    return 0 if state == "COMPLETED" else 1


def follow(record: JobRecord, rank: int, poll_s: float = 1.0) -> str:
    """Print a rank's log as it grows until the job reaches a final state; return it."""
    offsets = {"out": 0, "err": 0}
    state = job_state(record)
    while True:
        for stream in offsets:
            path = record.log_path(rank, stream)
            if path.is_file():
                with path.open("rb") as handle:
                    handle.seek(offsets[stream])
                    chunk = handle.read()
                offsets[stream] += len(chunk)
                if chunk:
                    click.echo(chunk.decode(errors="replace"), nl=False,
                               err=(stream == "err"))
        if state in FINAL_STATES:
            return state
        time.sleep(poll_s)
        state = job_state(record)


@click.command()
@click.argument("job_id", required=False)
def status(job_id: str | None) -> int:
    """State of a job (default: the newest submitted from this folder)."""
    record = load_record(job_id) if job_id is not None else _newest()
    click.echo(f"{record.job_id} {job_state(record)}")
    return 0


@click.command()
@click.argument("job_id")
@click.option("--rank", type=int, default=0, show_default=True)
@click.option("--follow", "follow_", is_flag=True, help="Keep printing until the job ends.")
def logs(job_id: str, rank: int, follow_: bool) -> int:
    """Print one rank's log (stdout, then stderr)."""
    record = load_record(job_id)
    if not 0 <= rank < record.tasks:
        raise click.BadParameter(f"{rank} is not a rank of job {job_id}; expected 0.."
                                 f"{record.tasks - 1}", param_hint="--rank")
    if follow_:
        follow(record, rank)
        return 0
    text = read_log(record, rank)
    if not text and not record.log_path(rank).is_file():
        click.echo(f"hpcdist: no log yet for rank {rank} of job {job_id} "
                   f"({job_state(record)}); expected {record.log_path(rank)}", err=True)
        return 1
    click.echo(text, nl=False)
    return 0


@click.command(name="cancel")
@click.argument("job_id")
def cancel_command(job_id: str) -> int:
    """Cancel a job."""
    record = load_record(job_id)
    state = cancel(record)
    if state in FINAL_STATES:
        click.echo(f"Job {job_id} had already ended ({state}); nothing to cancel")
    else:
        click.echo(f"Cancelled job {job_id} (was {state})")
    return 0


@click.command(name="list")
def list_command() -> int:
    """Jobs submitted from this folder, newest first, with state and elapsed time."""
    now = time.time()
    click.echo(f"{'JOB':>10}  {'STATE':<11} {'ELAPSED':>9}  {'EXECUTOR':<8} NAME")
    for record in list_records():
        elapsed = _hms(now - record.submitted)
        click.echo(f"{record.job_id:>10}  {job_state(record):<11} {elapsed:>9}  "
                   f"{record.executor:<8} {record.name}")
    return 0


def _newest() -> JobRecord:
    records = list_records()
    if not records:
        raise click.UsageError("no jobs submitted from this folder yet")
    return records[0]


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


JOB_COMMANDS = (submit, status, logs, cancel_command, list_command)
