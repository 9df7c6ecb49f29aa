"""``--continue RUN`` and ``--tracker-env VAR``: one run across jobs (``hpcdist.facts.runs``).

The rendered script sets ``HPCDIST_RUN_ID`` to RUN before hpcdist's runner records the job
as a piece of that run (or, for ``--continue JOB``, ``HPCDIST_CONTINUE_JOB``: the runner
finds JOB's run when this job starts, so a chain ``--after JOB --continue JOB`` can be
submitted before JOB has started), and each tracker variable to the run id once it is
decided.
"""

from __future__ import annotations

import re
from pathlib import Path

from hpcdist.errors import SpecError
from hpcdist.facts.protocol import is_inherited
from hpcdist.facts.runs import RUN_STATE_DIR, is_job_id, run_id_problem
from hpcdist.spec.jobspec import JobSpec
from hpcdist.state.folders import jobs_root

_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_run_options(spec: JobSpec) -> None:
    """Raise SpecError naming a bad --continue or --tracker-env value."""
    for var in spec.tracker_env:
        if not _VAR.match(var):
            raise SpecError(
                f"--tracker-env {var!r} is not an environment variable name; expected e.g. "
                "WANDB_RUN_ID"
            )
        if var.startswith("HPCDIST_") or is_inherited(var):
            raise SpecError(
                f"--tracker-env {var!r} is a variable of hpcdist's or SLURM's own; expected "
                "your tracker's, e.g. WANDB_RUN_ID"
            )
    run = spec.continue_run
    if run is None:
        return
    if spec.sweep:
        raise SpecError(
            f"--continue {run!r} with --sweep: a run is one training, a sweep many; "
            "continue one point's run at a time"
        )
    if is_job_id(run):  # the run of that job, known once it has started (--after JOB)
        return
    problem = run_id_problem(run)
    if problem:
        raise SpecError(f"--continue {problem}")
    if not (run_records() / run).is_dir():
        raise SpecError(
            f"--continue {run!r}: no run of that id was started from this folder; expected "
            "a run id of `hpcdist list`"
        )


def run_records(project_dir: Path | None = None) -> Path:
    """This folder's run records (``.hpcdist/runs``; ``project_dir``'s if given), whether or
    not they exist yet."""
    return jobs_root(project_dir) / Path(RUN_STATE_DIR).relative_to(".hpcdist")
