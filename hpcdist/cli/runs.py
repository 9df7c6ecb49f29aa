"""One training across its jobs: ``hpcdist status RUN``, ``logs RUN``, the run of a job in
``status JOB`` and the RUN column of ``list``.

A run's pieces come from its private record (``hpcdist.jobs.runs``), their queue and run
times from SLURM (``hpcdist.slurm.query.job_attempts``), its progress from its heartbeat.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import click

from hpcdist.errors import UserError
from hpcdist.facts.heartbeat import Heartbeat
from hpcdist.facts.runs import is_job_id
from hpcdist.jobs.logread import one_line, read_log_text
from hpcdist.jobs.progress import Forecast, forecast
from hpcdist.jobs.runs import Piece, Run, load_run, read_heartbeat, run_of_job
from hpcdist.slurm.parse import format_duration
from hpcdist.slurm.query import Attempt, job_attempts, query_job


def find_run(name: str) -> Run | None:
    """The run ``name`` is the id of, else the run of job ``name``."""
    return load_run(name) or run_of_job(name)


def run_or_job(name: str | None) -> Run | None:
    """The run ``name`` names (``status``, ``logs``); None for a job id (or no name); one
    line for a name that is neither."""
    if name is None or is_job_id(name):
        return None
    run = load_run(name)
    if run is None:
        raise UserError(
            f"{name!r} is neither a job id (1234, 1234_5) nor a run started from this folder; "
            "expected one of `hpcdist list`"
        )
    return run


def attempts_of(run: Run) -> dict[tuple[str, int], Attempt]:
    """(job id, restart) -> SLURM's record of that start: one query per job of the run."""
    found: dict[tuple[str, int], Attempt] = {}
    for job in run.job_ids:
        for restart, attempt in enumerate(job_attempts(job)):
            found[(job, restart)] = attempt
    return found


def _clock(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%H:%M:%S", time.localtime(seconds))


def _resumed(piece: Piece) -> str:
    """Where the piece's training began: a checkpoint, the start, or "-" until it says."""
    point = piece.resumed_from
    if not piece.noted:
        return "-"
    if point is None:
        return "start"
    written = point.get("time")
    when = f" ({_clock(float(written))})" if isinstance(written, (int, float)) else ""
    return f"epoch {point.get('epoch')}, step {point.get('step')}{when}"


def piece_rows(run: Run, attempts: dict[tuple[str, int], Attempt]) -> list[str]:
    lines = [
        f"  {'PIECE':<5} {'JOB':<10} {'RESTART':<7} {'STATE':<11} {'QUEUED':>8} "
        f"{'RAN':>8}  RESUMED FROM"
    ]
    for number, piece in enumerate(run.pieces, 1):
        attempt = attempts.get((piece.job_id, piece.restart))
        state = attempt.state if attempt is not None else "UNKNOWN"
        queued = (
            format_duration(attempt.queued_s) if attempt and attempt.queued_s is not None else "-"
        )
        ran = (
            format_duration(attempt.elapsed_s) if attempt and attempt.elapsed_s is not None else "-"
        )
        lines.append(
            f"  {number:<5} {one_line(piece.job_id):<10} {piece.restart:<7} {state:<11} "
            f"{queued:>8} {ran:>8}  {_resumed(piece)}"
        )
    return lines


def current_attempt(run: Run, attempts: dict[tuple[str, int], Attempt]) -> Attempt | None:
    """The newest start of the run's last job: a job requeued since its last piece was
    recorded (queued again, or started and not yet recorded) is that requeue, not the start
    before it."""
    job = run.last.job_id
    mine = [(restart, attempt) for (name, restart), attempt in attempts.items() if name == job]
    return max(mine, key=lambda item: item[0])[1] if mine else None


def forecast_of(beat: Heartbeat, attempt: Attempt | None, now: float) -> Forecast | None:
    """The heartbeat's forecast for this start of the job (``attempt``): a heartbeat from
    before it (a requeue) gives no rate and no end."""
    running = attempt is not None and attempt.state == "RUNNING"
    job_end = attempt.end if running and attempt is not None else None
    limit = attempt.limit_s if attempt is not None else None
    since = None
    if attempt is not None and attempt.state == "REQUEUED":  # its next start not seen yet
        since = attempt.end
    elif attempt is not None:  # a requeued job not started again: since its requeue
        started = attempt.start if attempt.state != "PENDING" else None
        since = started if started is not None else attempt.submit
    return forecast(beat, now, job_end, limit, since)


def progress_lines(beat: Heartbeat, attempt: Attempt | None, now: float) -> list[str]:
    """What the heartbeat says of a running piece: progress, rate, end, fit, hang."""
    found = forecast_of(beat, attempt, now)
    running = attempt is not None and attempt.state == "RUNNING"
    job_end = attempt.end if running and attempt is not None else None
    rows: list[tuple[str, str]] = []
    if found is not None:
        rows.append(("progress", _progress_text(beat, found)))
        if running and found.end is not None:
            rows.append(("ends", _end_text(found, job_end, now)))
    if beat.checkpoint_step is not None:
        took = f", took {beat.checkpoint_s:.2f} s" if beat.checkpoint_s is not None else ""
        rows.append(
            (
                "checkpoint",
                f"epoch {beat.checkpoint_epoch}, step {beat.checkpoint_step}, "
                f"{_clock(beat.checkpoint_time)}{took}",
            )
        )
    age = beat.age_s(now)
    if age is not None:
        rows.append(("heartbeat", f"{age:.0f} s ago ({beat.phase or 'unknown'})"))
    if running and found is not None and found.stale_s is not None:
        from hpcdist.distributed.hangs import hang_advice

        rows.append(
            (
                "warning",
                f"no heartbeat for {format_duration(found.stale_s)} while the job runs: "
                f"the training may hang; {hang_advice()}",
            )
        )
    return [f"  {key + ':':<11} {value}" for key, value in rows]


def _progress_text(beat: Heartbeat, found: Forecast) -> str:
    parts = [f"step {found.step}" + (f" of {found.steps}" if found.steps else "")]
    if found.fraction is not None:
        parts[0] += f" ({100 * found.fraction:.0f}%)"
    if beat.epoch is not None:
        parts.append(f"epoch {beat.epoch}" + (f" of {beat.epochs}" if beat.epochs else ""))
    if found.steps_per_s:
        parts.append(f"{found.steps_per_s:.3g} steps/s")
    if beat.samples_per_s:
        parts.append(f"{beat.samples_per_s:.0f} samples/s")
    if beat.loss is not None:
        parts.append(f"loss {beat.loss:.5g}")
    return ", ".join(parts)


def _end_text(found: Forecast, job_end: float | None, now: float) -> str:
    assert found.end is not None
    text = f"{_clock(found.end)} (in {format_duration(max(0.0, found.end - now))})"
    if found.fits is None or job_end is None:
        return text
    if found.fits:
        return f"{text}; fits in the time limit (the job ends by {_clock(job_end)})"
    more = found.more_pieces
    return (
        f"{text}; does not fit: the time limit ends this job at {_clock(job_end)}, "
        f"{more} more job{'s' if more != 1 else ''} (requeues) needed"
    )


def run_lines(run: Run, now: float | None = None) -> list[str]:
    """``status RUN``: the pieces, then the progress of the last."""
    now = time.time() if now is None else now
    attempts = attempts_of(run)
    last = run.last
    current = current_attempt(run, attempts)
    pieces = len(run.pieces)
    lines = [
        f"run {run.run_id}: {pieces} piece{'s' if pieces != 1 else ''}, "
        f"jobs {', '.join(run.job_ids)}"
    ]
    lines += piece_rows(run, attempts)
    lines.append(f"  {'run folder:':<11} {last.run_dir}")
    beat, why = read_heartbeat(run)
    if beat is None:
        lines.append(f"  {'heartbeat:':<11} {why}")
    else:
        lines += progress_lines(beat, current, now)
    # Nodes and folders are SLURM's and the file system's words: control characters escaped.
    return [one_line(line) for line in lines]


def run_json(run: Run, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    attempts = attempts_of(run)
    pieces = []
    for piece in run.pieces:
        attempt = attempts.get((piece.job_id, piece.restart))
        item: dict[str, Any] = dataclasses.asdict(piece)
        item["attempt"] = (
            None
            if attempt is None
            else {**dataclasses.asdict(attempt), "queued_s": attempt.queued_s}
        )
        pieces.append(item)
    beat, why = read_heartbeat(run)
    found = None
    if beat is not None:
        found = forecast_of(beat, current_attempt(run, attempts), now)
    return {
        "run_id": run.run_id,
        "pieces": pieces,
        "heartbeat": None if beat is None else beat.to_dict(),
        "heartbeat_problem": why or None,
        "forecast": None if found is None else dataclasses.asdict(found),
    }


def show_run(run: Run, as_json: bool) -> int:
    if as_json:
        click.echo(json.dumps(run_json(run)))
    else:
        click.echo("\n".join(run_lines(run)))
    return 0


# The line every piece's script prints first (templates/base.sh.j2).
_PIECE_LINE = re.compile(r"^hpcdist: job (\S+) on \S+, restart (\d+)$")


def merged_log(run: Run) -> str:
    """The run's logs in one: per piece, a header line and the lines of that start (a
    requeued job's log holds every start, each from its script's first line on)."""
    out: list[str] = []
    for number, piece in enumerate(run.pieces, 1):
        header = (
            f"==> run {run.run_id}, piece {number}: job {piece.job_id}, restart "
            f"{piece.restart}, on {piece.nodes or '?'}, "
            + (f"resumed from {_resumed(piece)}" if piece.noted else "training not begun")
            + " <=="
        )
        out.append(header + "\n")
        text = _piece_text(piece)
        out.append(text if text else "(no log found)\n")
    return "".join(out)


def _piece_text(piece: Piece) -> str:
    info = query_job(piece.job_id)
    if info is None or info.stdout is None:
        return ""
    try:
        text = read_log_text(Path(info.stdout))
    except (OSError, UserError):
        return ""
    return start_of(text, piece.restart)


def start_of(text: str, restart: int) -> str:
    """The lines of one start (``restart``) of a job in its log, which holds every start
    (appended), each from its script's first line on; "" if that start is not there."""
    lines = text.splitlines(keepends=True)
    starts = [
        (index, int(match.group(2)))
        for index, line in enumerate(lines)
        if (match := _PIECE_LINE.match(line.rstrip("\n")))
    ]
    mine = [i for i, (_, number) in enumerate(starts) if number == restart]
    if not mine:
        return text if restart == 0 and not starts else ""
    begin = 0 if mine[-1] == 0 else starts[mine[-1]][0]
    end = starts[mine[-1] + 1][0] if mine[-1] + 1 < len(starts) else len(lines)
    return "".join(lines[begin:end])


def group_by_run(
    rows: list[tuple[str, ...]], run_of: dict[str, str]
) -> list[tuple[str, tuple[str, ...]]]:
    """``list``'s rows (newest first, job id first) with their run ("-": none), the jobs of
    one run together where the run's newest job is."""
    order: dict[str, list[tuple[str, ...]]] = {}
    for row in rows:
        run = run_of.get(row[0], "")
        order.setdefault(run or f"\0{row[0]}", []).append(row)
    return [
        (key if not key.startswith("\0") else "-", row)
        for key, group in order.items()
        for row in group
    ]
