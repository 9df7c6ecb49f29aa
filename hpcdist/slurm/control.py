"""What a job asks of SLURM about itself: was it picked for preemption, requeue it, or
submit its script again. Called inside the job, where ``scontrol`` may be missing (then
each answers False rather than raising)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

SCONTROL_TIMEOUT_S = 30.0
# A job SLURM picked for preemption shows when (``scontrol show job``); others show None.
_PREEMPTED = re.compile(r"PreemptTime=[0-9]")
_EXCLUDED = re.compile(r"\bExcNodeList=(\S+)")
# When SLURM will end the job (its time limit), in the controller's local time.
_END_TIME = re.compile(r"\bEndTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\b")


def has_scontrol() -> bool:
    return shutil.which("scontrol") is not None


def _show_job(job: str) -> str:
    """``scontrol show job``'s text; "" where scontrol cannot say."""
    try:
        return subprocess.run(
            ["scontrol", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass(frozen=True)
class JobView:
    """What the controller says of a running job about to be requeued.

    ``state``: ``RUNNING`` while nothing ends it; a user's ``scancel`` (or the time limit)
    turns it ``COMPLETING`` at once, before any signal reaches the job, and a requeue
    (``scontrol requeue``, by anyone) raises ``restarts``. "" where scontrol did not say."""

    state: str
    restarts: int | None
    preempted: bool


_STATE = re.compile(r"\bJobState=(\S+)")
_RESTARTS = re.compile(r"\bRestarts=([0-9]+)")


def parse_job_view(shown: str) -> JobView:
    """``scontrol show job``'s text as a JobView. Pure."""
    state, restarts = _STATE.search(shown), _RESTARTS.search(shown)
    return JobView(
        state=state[1] if state else "",
        restarts=int(restarts[1]) if restarts else None,
        preempted=_PREEMPTED.search(shown) is not None,
    )


def show_job(job: str) -> JobView | None:
    """The controller's view of ``job``; None where scontrol cannot say."""
    shown = _show_job(job)
    return parse_job_view(shown) if shown.strip() else None


def is_preempted(job: str) -> bool:
    """Whether SLURM picked ``job`` for preemption (False where scontrol cannot say)."""
    return _PREEMPTED.search(_show_job(job)) is not None


def end_time(shown: str) -> float | None:
    """The ``EndTime`` of ``scontrol show job``'s text as seconds since the epoch (scontrol
    prints local time, that of the node it runs on, which is this one); None if it has
    none. Pure."""
    found = _END_TIME.search(shown)
    return datetime.fromisoformat(found.group(1)).timestamp() if found else None


def job_end_time(job: str) -> float | None:
    """When SLURM will end ``job`` (``EndTime``), None where scontrol cannot say."""
    return end_time(_show_job(job))


def excluded_nodes(job: str) -> list[str]:
    """The nodes ``job`` is kept off now (``ExcNodeList``, as SLURM writes it)."""
    found = _EXCLUDED.search(_show_job(job))
    return [found.group(1)] if found and found.group(1) != "(null)" else []


def exclude_nodes(job: str, nodes: Sequence[str]) -> bool:
    """Keep pending ``job``'s next run off ``nodes``; whether SLURM took it. SLURM refuses
    this for a running job ("Job is no longer pending execution"): a requeued job is
    updated right after ``requeue``, while it waits out the requeue's hold (BeginTime)."""
    # The job's own exclusions (its --exclude, earlier pieces') are kept.
    listed = ",".join([*excluded_nodes(job), *nodes])
    return _changed(["scontrol", "update", f"JobId={job}", f"ExcNodeList={listed}"])


_RESTARTS = re.compile(r"\bRestarts=([0-9]+)")


def requeued_by_slurm(job: str, restart_count: str | None) -> bool:
    """Whether SLURM itself is requeuing ``job`` (``scontrol requeue``, a node that failed
    under ``--requeue``): it counts the restart as it ends the job, so its ``Restarts``
    runs ahead of the job's own ``SLURM_RESTART_COUNT`` (seen on 22.05: JobState
    COMPLETING, Restarts=1 in the TERM trap of a first run)."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    found = _RESTARTS.search(shown)
    started = int(restart_count) if restart_count and restart_count.strip().isdigit() else 0
    return found is not None and int(found.group(1)) > started


def requeue(target: str) -> bool:
    """``scontrol requeue`` a job or an array task; whether SLURM did."""
    return _changed(["scontrol", "requeue", target])


def _changed(argv: list[str]) -> bool:
    """Run an ``scontrol`` that changes this job; whether it succeeded. The requeue ends
    the job's processes with TERM: the command ignores it (``_ignore_term``), so that one
    still running when it comes (the requeue's own, the exclusion after it, seconds
    later on a loaded host) is not killed half-way and taken for a refusal."""
    try:
        done = subprocess.run(argv, timeout=SCONTROL_TIMEOUT_S, preexec_fn=_ignore_term)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def resubmit(
    script: str, array_task: str, env: Mapping[str, str], exclude: Sequence[str] = ()
) -> str:
    """``sbatch`` ``script`` again (as a one-task array with ``array_task``'s id, if any;
    kept off the nodes ``exclude``), in ``env``; "" if it was queued, else why not."""
    argv: Sequence[str] = [
        "sbatch",
        *([f"--array={array_task}"] if array_task else []),
        *([f"--exclude={','.join(exclude)}"] if exclude else []),
        script,
    ]
    try:
        code = subprocess.run(argv, env=dict(env)).returncode
    except OSError as exc:
        return str(exc)
    return "" if code == 0 else f"sbatch exited {code}"
