"""Where a training's files are: its run folder's name and the results file in it.

The job writes them (``ufsemulator``'s run files), the login node reads them (``hpcdist
report``), and a job resubmitted as a new job id is pointed back at the first one's folder
(``hpcdist.distributed.requeue``): one naming for all three.
"""

from __future__ import annotations

from collections.abc import Mapping

RUNS_DIR = "runs"
RESULTS_FILE = "training_results.json"
# The job's id, as SLURM or submitit's local executor names it.
_JOB_ID_VARS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


def run_name(env: Mapping[str, str]) -> str | None:
    """``<array job id>_<task id>`` for an array task (the name squeue and ``hpcdist
    report`` use, rather than the task's own job id), else the job's id; None outside a
    job."""
    array = env.get("SLURM_ARRAY_JOB_ID", "").strip()
    task = env.get("SLURM_ARRAY_TASK_ID", "").strip()
    if array and task:
        return f"{array}_{task}"
    return next((env[var].strip() for var in _JOB_ID_VARS if env.get(var, "").strip()), None)
