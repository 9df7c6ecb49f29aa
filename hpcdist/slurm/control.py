"""What a job asks of SLURM about itself: was it picked for preemption, requeue it, or
submit its script again. Called inside the job, where ``scontrol`` may be missing (then
each answers False rather than raising)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

SCONTROL_TIMEOUT_S = 30.0
# A job SLURM picked for preemption shows when (``scontrol show job``); others show None.
_PREEMPTED = re.compile(r"PreemptTime=[0-9]")


def has_scontrol() -> bool:
    return shutil.which("scontrol") is not None


def is_preempted(job: str) -> bool:
    """Whether SLURM picked ``job`` for preemption (False where scontrol cannot say)."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", job],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return _PREEMPTED.search(shown) is not None


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
    try:
        argv = ["scontrol", "requeue", target]
        return subprocess.run(argv, timeout=SCONTROL_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def resubmit(script: str, array_task: str, env: Mapping[str, str]) -> str:
    """``sbatch`` ``script`` again (as a one-task array with ``array_task``'s id, if any), in
    ``env``; "" if it was queued, else why not."""
    argv: Sequence[str] = ["sbatch", *([f"--array={array_task}"] if array_task else []), script]
    try:
        code = subprocess.run(argv, env=dict(env)).returncode
    except OSError as exc:
        return str(exc)
    return "" if code == 0 else f"sbatch exited {code}"
