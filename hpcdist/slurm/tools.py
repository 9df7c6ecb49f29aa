"""Running SLURM's client tools (squeue, sacct, scontrol, sinfo): one call, one-line errors."""

from __future__ import annotations

import subprocess

from hpcdist.errors import UserError

SLURM_TIMEOUT_S = 30.0  # how long a SLURM client may take to answer


def slurm_tool(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command; a missing tool or a silent controller is one line."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except FileNotFoundError as exc:
        raise UserError(
            f"{argv[0]} is not on PATH; expected SLURM's client tools "
            "(module load slurm, or run on a login node)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise UserError(
            f"{argv[0]} got no answer from the SLURM controller in {SLURM_TIMEOUT_S:.0f} s"
        ) from exc
