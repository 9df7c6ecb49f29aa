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


# One training across its pieces (requeues, resubmissions, --continue chains): its id, in
# every piece's environment, results and exported model. The job's script decides it
# (``hpcdist.distributed.jobstep prepare``) and records each piece in the private state:
#     .hpcdist/runs/<run id>/<job id>-<restart>.json    the piece, as the script started it
#     .hpcdist/runs/<run id>/<job id>-<restart>.train.json  where its training resumed from
RUN_ID_VAR = "HPCDIST_RUN_ID"
RUN_RECORD_VAR = "HPCDIST_RUN_RECORD"  # the piece's file of the run's record, for the training
RUN_STATE_DIR = ".hpcdist/runs"
# ``--continue JOB``: the run of that job (decided when this job starts, after JOB's).
CONTINUE_JOB_VAR = "HPCDIST_CONTINUE_JOB"
# The tracker variables (``--tracker-env``) the script set from the run id.
TRACKER_ENV_VAR = "HPCDIST_TRACKER_ENV"
_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def run_id_problem(text: str) -> str:
    """Why ``text`` cannot be a run id ("" if it can): it names a folder of the private
    state and a tracker's run, so letters, digits, '_', '-', '.' only, 1..64 of them."""
    if not text or len(text) > 64 or text.startswith(".") or not set(text) <= _RUN_ID_CHARS:
        return f"{text!r} is not a run id; expected 1-64 letters, digits, '_', '-' or '.'"
    return ""


def is_job_id(text: str) -> bool:
    """``1234`` or ``1234_5`` (an array task): a job's id, never a run id (which has a '-')."""
    head, sep, task = text.partition("_")
    return head.isdigit() and (not sep or task.isdigit()) and text.isascii()


def new_run_id(first_job: str, token: str) -> str:
    """A new run's id: its first job's name (``run_name``) and a random token, so that a
    cluster's job ids, which start again at 1 when its state is wiped, never merge runs."""
    return f"{first_job}-{token}"


def piece_name(job: str, restart: int) -> str:
    """A piece's file name (without suffix) in its run's record."""
    return f"{job}-{restart}"


def glob_quote(text: str) -> str:
    """``text`` matched literally by a glob pattern (a job id such as ``12_[3]``)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)
