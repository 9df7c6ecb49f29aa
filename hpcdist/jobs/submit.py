"""Submit a JobSpec: submitit queues the very script ``hpcdist render`` prints.

A submission is planned, then carried out. ``plan_submission`` renders the script once and
refuses what cannot be submitted; ``--dry-run`` prints that plan (the script included) and
``carry_out`` asks SLURM about those very bytes (``sbatch --test-only``), then hands them to
submitit, which queues them (``hpcdist.jobs.scriptexec``) and keeps the job handle. On a
machine without SLURM the local executor runs the same script's steps here
(``hpcdist.distributed.localstep``). Nothing of the job is worked out twice: the job
protocol (requeue, warning, torchrun, secret, array points, log records, GPU count) is the
script's, run inside the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.errors import SpecError, UserError
from hpcdist.facts.protocol import is_inherited
from hpcdist.jobs.localflags import check_local_launcher, local_refusals, warning_lead_s
from hpcdist.jobs.localjob import identify
from hpcdist.jobs.records import JobRecord, save_record
from hpcdist.jobs.sweeparrays import SweepArray, first_array_args, queue_sweep, sweep_parts
from hpcdist.render.script import render
from hpcdist.slurm import rest
from hpcdist.slurm.cluster import require_controller, sbatch_test_only, slurm_config
from hpcdist.slurm.timelimit import time_limit_minutes
from hpcdist.slurm.userjobs import mark_stale
from hpcdist.spec.dependency import check_known
from hpcdist.spec.jobspec import JOB_OPTIONS, JobSpec
from hpcdist.spec.sweep import points
from hpcdist.state.folders import jobs_root, project_base, state_dir
from hpcdist.state.private import replaceable_by_others, write_private
from hpcdist.state.snapshot import FolderSnapshot
from hpcdist.state.statehome import shared_reason
from hpcdist.state.workfolder import check_working_folder

EXECUTORS = ("auto", "slurm", "local")
CHECK_DEPENDENCIES = "the controller knows every --after job (squeue)"
CHECK_PREFLIGHT = "SLURM would run the rendered script (sbatch --test-only)"


@dataclass(frozen=True)
class Submission:
    record: JobRecord
    executor: str


def choose_executor(kind: str) -> str:
    """``auto``: SLURM wherever a cluster is configured, else this machine. A configured
    controller that does not answer is an error, never a silent run on the login node.
    Over slurmrestd (``--transport rest``) SLURM is the daemon's: no sbatch is needed here."""
    if kind in ("auto", "slurm") and rest.chosen():
        rest.client().ping()  # the daemon answers this user's token, or one line says why
        return "slurm"
    if kind == "auto":
        config = slurm_config()
        if config is None:
            return "local"
        require_controller(config)
        return "slurm"
    if kind == "slurm" and not shutil.which("sbatch"):
        raise UserError("--executor slurm: no sbatch on PATH; expected a SLURM login node")
    return kind


@contextmanager
def clean_slurm_environment() -> Iterator[None]:
    """Hide the surrounding job's SLURM_*/SBATCH_* variables while submitting a new one.

    sbatch reads SBATCH_* as options and exports the whole environment into the new job, so
    a submit from inside a running job would otherwise inherit its node list and ranks.
    """
    hidden = {k: v for k, v in os.environ.items() if is_inherited(k)}
    for key in hidden:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(hidden)


@dataclass(frozen=True)
class SubmitPlan:
    """Everything a submission will do, worked out once from a JobSpec (terraform's plan,
    torchx's dry-run request): ``--dry-run`` prints it, ``carry_out`` does it."""

    spec: JobSpec
    executor: str  # "slurm" or "local"
    script: str  # the batch script: what render prints, what is checked and queued
    checks: tuple[str, ...]  # what asks SLURM before anything is written
    tasks: int  # ranks with a log of their own (local) or a label (SLURM); 1 if counted later
    workdir: str  # the folder the job runs in: where its runs/ are (``hpcdist report``)

    @property
    def swept(self) -> bool:
        return bool(self.spec.sweep)

    def describe(self) -> dict[str, Any]:
        """What ``--dry-run`` shows: the executor, the checks and the script, byte for byte
        what ``hpcdist render`` prints (no value of it is made at submit time)."""
        described: dict[str, Any] = {
            "executor": self.executor,
            "checks": list(self.checks),
            "workdir": self.workdir,
            "script": self.script,
        }
        if self.swept:
            described["points"] = points(self.spec)  # array task i runs point i
        return described


def plan_submission(
    spec: JobSpec, executor: str = "auto", preflight_check: bool = True
) -> SubmitPlan:
    """The plan of submitting ``spec``: refuses what submit cannot do, asks SLURM nothing."""
    kind = choose_executor(executor)
    workdir = job_workdir(spec)
    # The job's runner would refuse it when it starts: said now, before anything is queued,
    # and first: in such a folder the log was moved to a private one (private_logs), which
    # the local executor would otherwise take for an -o of the user's.
    refused = check_working_folder(Path(workdir))
    if refused:
        raise SpecError(refused)
    require_slurm_for_arrays(spec, kind)
    checks: list[str] = []
    if kind == "slurm" and spec.after:
        checks.append(CHECK_DEPENDENCIES)
    if kind == "slurm" and preflight_check and not rest.chosen():  # no --test-only there
        checks.append(CHECK_PREFLIGHT)
    return SubmitPlan(
        spec=spec,
        executor=kind,
        script=render(spec),
        checks=tuple(checks),
        tasks=spec.srun_tasks or spec.nodes,
        workdir=workdir,
    )


def job_workdir(spec: JobSpec) -> str:
    """The folder the job runs in: --chdir read from the folder submit runs in (this one,
    as sbatch reads it), else this one. The local executor's script starts there too."""
    here = os.getcwd()
    if spec.workdir is not None:
        return os.path.abspath(os.path.join(here, spec.workdir))
    return here


def submit(
    spec: JobSpec,
    executor: str = "auto",
    project_dir: Path | None = None,
    preflight_check: bool = True,
) -> Submission:
    """Plan the submission, then carry the plan out."""
    return carry_out(plan_submission(spec, executor, preflight_check), project_dir)


def carry_out(plan: SubmitPlan, project_dir: Path | None = None) -> Submission:
    """Do what ``plan`` says: its checks, then submitit queues the script; records."""
    root = jobs_root(project_dir)
    # What existed before anything is created: a refusal removes every folder and file made
    # from here on (the state folders, submitit's folder and its copy of the script).
    snapshot = FolderSnapshot.take(root)
    try:
        if CHECK_DEPENDENCIES in plan.checks:
            check_known(plan.spec.after)
        _say_where_state_lives(root, project_dir)
        folder = state_dir("submitit", project_dir=project_dir)
        script = write_private(folder / f"job-{secrets.token_hex(8)}.sh", plan.script)
        with clean_slurm_environment():
            # A sweep: the arrays the site's limits require (scontrol show config).
            parts = sweep_parts(plan.spec) if plan.swept and plan.executor == "slurm" else []
            if CHECK_PREFLIGHT in plan.checks:
                preflight(plan, script, first_array_args(plan.spec, parts) if parts else ())
            jobs, arrays = _queue(plan, folder, script, parts)
    except BaseException:
        snapshot.remove_made()
        raise
    record = _save_records(plan, jobs, arrays, project_dir)
    return Submission(record=record, executor=plan.executor)


def preflight(plan: SubmitPlan, script: Path, options: tuple[str, ...] = ()) -> None:
    """Ask SLURM whether it would run the file about to be queued (``sbatch --test-only``;
    a split sweep's first array with its own options)."""
    reason = sbatch_test_only(script, options)
    if reason:
        spec = plan.spec
        raise SpecError(
            f"SLURM rejects the request ({spec.nodes} nodes x {spec.srun_tasks_per_node} tasks x "
            f"{spec.cpus_per_task} CPUs, {spec.gpus_per_node} GPUs/node, partition "
            f"{spec.partition!r}, time {spec.time}): {reason}"
        )


def _queue(
    plan: SubmitPlan, folder: Path, script: Path, parts: list[tuple[int, int]]
) -> tuple[list[Any], list[SweepArray] | None]:
    """submitit queues the script: one job, or one handle per array task (and the arrays
    a sweep took, as many as the site's MaxArraySize requires)."""
    from hpcdist.jobs.scriptexec import queue_local, queue_slurm

    try:
        # submitit echoes sbatch's stderr; the one line below says what went wrong.
        with contextlib.redirect_stderr(io.StringIO()):
            if plan.executor == "slurm":
                try:
                    if plan.swept:
                        return queue_sweep(plan.spec, folder, script, plan.tasks, parts)
                    return queue_slurm(folder / "%j", script, plan.tasks, None), None
                finally:
                    mark_stale()  # the user's shared view asks the controller again
            timeout = time_limit_minutes(plan.spec.time)
            # One folder per local job, made now: the job starts before its id is known.
            job_folder = folder / f"local-{script.stem}"
            job_folder.mkdir(mode=0o700)
            lead = warning_lead_s(plan.spec.signal)
            return [queue_local(job_folder, script, plan.workdir, timeout, lead)], None
    except (OSError, RuntimeError) as exc:  # sbatch missing, refused, or no controller
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise UserError(f"the {plan.executor} executor could not submit the job: {reason}") from exc


def _say_where_state_lives(root: Path, project_dir: Path | None) -> None:
    shared = replaceable_by_others(root)
    reason = shared_reason(project_base(project_dir))
    if reason and shared is None:
        print(
            f"hpcdist: note: {reason}: this job's script, record and secret are kept in "
            f"{root} (set HPCDIST_HOME to choose)",
            file=sys.stderr,
        )
    elif shared is not None:
        print(
            f"hpcdist: warning: {shared} is writable by others: they could put their own "
            f"{root.name} in place of yours before the job starts; set HPCDIST_HOME to a "
            "folder only you can write",
            file=sys.stderr,
        )


def _save_records(
    plan: SubmitPlan,
    jobs: list[Any],
    arrays: list[SweepArray] | None,
    project_dir: Path | None,
) -> JobRecord:
    """One record per submitted job or array task (and one for an array as a whole)."""
    spec = plan.spec
    submitted = time.time()
    task_points = [[*spec.overrides, *point] for point in points(spec)] or [list(spec.overrides)]
    records = []
    for job, point in zip(jobs, task_points, strict=False):
        # A local job is a process: its start time tells it apart from a later reuse of
        # its pid.
        process = identify(int(job.job_id)) if plan.executor == "local" else None
        records.append(
            JobRecord(
                job_id=str(job.job_id),
                executor=plan.executor,
                name=spec.job_name,
                mode=spec.mode,
                nodes=spec.nodes,
                tasks=plan.tasks,
                folder=str(Path(str(job.paths.folder))),
                submitted=submitted,
                command=list(spec.command),
                start_ticks=None if process is None else process.start_ticks,
                points=[point] if point else None,
                workdir=plan.workdir,
            )
        )
    if plan.swept:
        # The array as a whole (its tasks are <id>_0, <id>_1, ...): what report reads.
        array_id = records[0].job_id.partition("_")[0]
        records.insert(
            0,
            dataclasses.replace(
                records[0],
                job_id=array_id,
                folder=str(Path(records[0].folder).parent),
                points=task_points,
                arrays=[array.to_list() for array in arrays or []] or None,
            ),
        )
    # A sweep's tasks first, without an fsync each (10,000 of them take seconds with): its
    # own record, durable, is written last and holds every point.
    folder = state_dir("jobs", project_dir=project_dir)  # checked once for all of them
    for record in records[1:] if plan.swept else []:
        save_record(record, project_dir, durable=False, folder=folder)
    for record in records[:1] if plan.swept else records:
        save_record(record, project_dir)
    return records[0]


# What only SLURM can honour: the local executor runs on this machine, whatever they ask.
_SLURM_ONLY = (
    "array",
    "constraint",
    "exclusive",
    "reservation",
    "memory",
    "mem_per_gpu",
    "nodelist",
    "exclude",
    "gpu_type",
    "mail_type",
    "mail_user",
    "sbatch_options",
)


def require_slurm_for_arrays(spec: JobSpec, kind: str) -> None:
    """A sweep is a SLURM job array and --after a SLURM dependency: no local twin. Nor
    have the site options (a node feature, memory, exclusive nodes, ...): a local run
    that ignored them would not be the job that was asked for."""
    if kind != "slurm":
        flags = {o.name: o.flag.split("/")[0] for o in JOB_OPTIONS}
        unset = (None, False, ())
        asked = [flags[name] for name in _SLURM_ONLY if getattr(spec, name) not in unset]
        asked += local_refusals(spec)
        if asked:
            raise SpecError(
                f"{', '.join(asked)} need{'s' if len(asked) == 1 else ''} SLURM; the {kind} "
                "executor runs on this machine and cannot honour "
                f"{'it' if len(asked) == 1 else 'them'}: leave "
                f"{'it' if len(asked) == 1 else 'them'} out (flag or profile) or submit to a "
                "SLURM cluster"
            )
    if kind != "slurm":
        check_local_launcher(spec)
    if kind != "slurm" and (spec.sweep or spec.after):
        flag = "--sweep" if spec.sweep else "--after"
        raise SpecError(
            f"{flag} needs SLURM (a job array, a dependency); the {kind} executor has "
            "neither: expected a SLURM cluster (render prints the script)"
        )


def describe(spec: JobSpec, executor: str) -> Mapping[str, Any]:
    """What ``--dry-run`` shows: the plan's description (nothing is asked of SLURM)."""
    return plan_submission(spec, executor, preflight_check=False).describe()
