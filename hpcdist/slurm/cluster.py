"""The cluster a login node submits to: is one configured, does its controller answer, would
it run this script (``sbatch --test-only``), and cancelling a job."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hpcdist.errors import UserError
from hpcdist.slurm import rest, userjobs
from hpcdist.slurm.tools import slurm_tool

# Where SLURM's tools find the cluster's configuration when SLURM_CONF is not set; the last
# two are slurmd's caches on a configless cluster.
_SLURM_CONFIGS = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/var/spool/slurmd/conf-cache/slurm.conf",
    "/run/slurm/conf/slurm.conf",
)
TEST_ONLY_TIMEOUT_S = 60


def slurm_config() -> str | None:
    """The SLURM configuration this machine's tools would use, or None: no cluster here."""
    if shutil.which("sbatch") is None:
        return None
    if os.environ.get("SLURM_CONF"):
        return f"SLURM_CONF={os.environ['SLURM_CONF']}"
    return next((path for path in _SLURM_CONFIGS if os.path.isfile(path)), None)


def require_controller(config: str) -> None:
    """UserError, in one line, where the configured controller does not answer."""
    try:
        proc = subprocess.run(
            ["sinfo", "--noheader", "--format=%P"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc = subprocess.CompletedProcess(["sinfo"], 1, "", str(exc))
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(
            f"SLURM is configured here ({config}) but its controller does not "
            f"answer (sinfo: {reason}); pass --executor local to run on this "
            "machine instead"
        )


def sbatch_test_only(script: Path, options: tuple[str, ...] = ()) -> str:
    """Why SLURM would not run ``script`` (``sbatch --test-only``, with ``options`` as the
    queued job will have them); "" if it would."""
    proc = subprocess.run(
        ["sbatch", "--test-only", *options, str(script)],
        capture_output=True,
        text=True,
        timeout=TEST_ONLY_TIMEOUT_S,
    )
    return "" if proc.returncode == 0 else sbatch_reason(proc.stderr)


def sbatch_reason(stderr: str) -> str:
    """The line of sbatch's stderr that says why."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower():
            return line.split("error:", 1)[-1].strip()
    return lines[-1] if lines else "sbatch --test-only failed without a message"


def scancel(job_id: str) -> None:
    """Cancel a SLURM job; UserError, in one line, where SLURM refuses."""
    if rest.chosen():
        rest.client().cancel(job_id)
        return
    proc = slurm_tool(["scancel", job_id])
    userjobs.mark_stale()
    if proc.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {proc.stderr.strip()}")
