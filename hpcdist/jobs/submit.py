"""Submit a JobSpec through submitit: on SLURM, or as local processes where there is none.

A submission is planned, then carried out: ``plan_submission`` works out everything it will
do (executor, submitit's parameters, each task's command and environment, the secrets to
create, the checks SLURM is asked) and refuses what cannot be submitted; ``--dry-run``
prints that plan and ``carry_out`` executes it without working anything out again.

The SLURM request comes from the same JobSpec as the rendered script (``slurm_parameters``);
a test compares the script submitit writes with the rendered directives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.distributed.jobsecret import create_secret_file
from hpcdist.distributed.protocol import (
    SECRET_DIR,
    SECRET_VAR,
    SIGNAL_VAR,
    SUBMITIT_WARNING_SIGNAL,
    is_inherited,
)
from hpcdist.errors import SpecError, UserError
from hpcdist.jobs.localjob import identify
from hpcdist.jobs.records import JobRecord, save_record
from hpcdist.render.container import container_prefix
from hpcdist.render.directives import sbatch_directives, srun_options
from hpcdist.render.script import render
from hpcdist.slurm.timelimit import time_limit_minutes
from hpcdist.spec.dependency import check_known
from hpcdist.spec.jobspec import JOB_OPTIONS, Count, JobSpec
from hpcdist.spec.sweep import points, task_command
from hpcdist.state.fileutil import current_umask
from hpcdist.state.folders import jobs_root, project_base, state_dir
from hpcdist.state.private import replaceable_by_others, strict_umask
from hpcdist.state.snapshot import FolderSnapshot
from hpcdist.state.statehome import shared_reason

EXECUTORS = ("auto", "slurm", "local")
# submitit needs the task count when it submits; a script that counts GPUs at run time is
# only what render writes (and the local executor would need torch to count them).
AUTO_GPUS_REFUSED = (
    "--mode nccl with no GPU count is supported by render/sbatch only; "
    "pass --gpus-per-node N for submit"
)


@dataclass(frozen=True)
class Submission:
    record: JobRecord
    executor: str


def choose_executor(kind: str) -> str:
    """``auto``: SLURM wherever a cluster is configured, else this machine. A configured
    controller that does not answer is an error, never a silent run on the login node."""
    if kind == "auto":
        config = slurm_config()
        if config is None:
            return "local"
        _require_controller(config)
        return "slurm"
    if kind == "slurm" and not shutil.which("sbatch"):
        raise UserError("--executor slurm: no sbatch on PATH; expected a SLURM login node")
    return kind


# Where SLURM's tools find the cluster's configuration when SLURM_CONF is not set; the last
# two are slurmd's caches on a configless cluster.
_SLURM_CONFIGS = (
    "/etc/slurm/slurm.conf",
    "/etc/slurm-llnl/slurm.conf",
    "/usr/local/etc/slurm.conf",
    "/var/spool/slurmd/conf-cache/slurm.conf",
    "/run/slurm/conf/slurm.conf",
)


def slurm_config() -> str | None:
    """The SLURM configuration this machine's tools would use, or None: no cluster here."""
    if shutil.which("sbatch") is None:
        return None
    if os.environ.get("SLURM_CONF"):
        return f"SLURM_CONF={os.environ['SLURM_CONF']}"
    return next((path for path in _SLURM_CONFIGS if os.path.isfile(path)), None)


def _require_controller(config: str) -> None:
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


@dataclass(frozen=True)
class Shape:
    """The task counts of a job whose GPUs are counted when it is submitted."""

    tasks_per_node: int
    cpus_per_task: int

    def world_size(self, nodes: int) -> int:
        return nodes * self.tasks_per_node


def refuse_auto_gpus(spec: JobSpec) -> Shape:
    """submit needs a GPU count: raise SpecError for a spec that counts them at run time."""
    tasks, cpus = spec.tasks_per_node, spec.cpus_per_task
    if spec.gpus_auto or not isinstance(tasks, int) or not isinstance(cpus, int):
        raise SpecError(AUTO_GPUS_REFUSED)
    return Shape(tasks, cpus)


# Directives that submitit writes itself: its append mode, and the warning signal, which
# must be USR2 because its handler catches that one.
SUBMITIT_OWNS = ("open-mode", "signal")


def slurm_parameters(spec: JobSpec) -> dict[str, Any]:
    """submitit SlurmExecutor parameters: the rendered script's directives and srun options."""
    refuse_auto_gpus(spec)
    directives = {d.option: d.value for d in sbatch_directives(spec)}
    # submitit counts a job's tasks from these two, so they are named as well as passed on.
    params: dict[str, Any] = {
        "nodes": directives["nodes"],
        "ntasks_per_node": directives["ntasks-per-node"],
        "srun_args": srun_options(spec),
        "setup": list(spec.setup),
        # Without --error a rendered script keeps stderr with stdout: so does each rank here.
        "stderr_to_stdout": spec.error is None,
        # Written after submitit's own parameters, so these win wherever both name an option.
        # The job's own --output/--error take the batch shell's log (as in a rendered
        # script); each rank's log stays in submitit's folder, where `hpcdist logs` reads it.
        "additional_parameters": {
            option.replace("-", "_"): _submitit_value(value)
            for option, value in directives.items()
            if option not in SUBMITIT_OWNS
        },
    }
    if spec.signal is not None:
        # The warning reaches the tasks, whose CommandJob answers it (a rendered script's
        # batch shell passes a B: warning on to its ranks: the same end).
        signal_name, _, delay = spec.signal.removeprefix("B:").partition("@")
        params["signal_delay_s"] = int(delay or 60)
        if signal_name != SUBMITIT_WARNING_SIGNAL:
            # Written after submitit's own --signal=USR2@..., so SLURM warns with this one.
            params["additional_parameters"]["signal"] = f"{signal_name}@{int(delay or 60)}"
    return params


def _submitit_value(value: str | int | None) -> str | int | bool:
    """A directive's value as submitit writes it: shell-quoted, which sbatch's own parser
    reads like a shell except that a backslash escapes the next character even inside
    single quotes, so backslashes are doubled here to reach sbatch as they were given."""
    if value is None:
        return True  # a flag such as --requeue
    return value.replace("\\", "\\\\") if isinstance(value, str) else value


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


def preflight(spec: JobSpec, script: str | None = None) -> None:
    """Ask SLURM whether it would run this job (``sbatch --test-only``) before submitting;
    ``script`` is the plan's rendered script (rendered here when not given)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
        handle.write(render(spec) if script is None else script)
    try:
        with clean_slurm_environment():
            proc = subprocess.run(
                ["sbatch", "--test-only", handle.name], capture_output=True, text=True, timeout=60
            )
    finally:
        os.unlink(handle.name)
    if proc.returncode != 0:
        reason = _sbatch_reason(proc.stderr)
        raise SpecError(
            f"SLURM rejects the request ({spec.nodes} nodes x {spec.srun_tasks_per_node} tasks x "
            f"{spec.cpus_per_task} CPUs, {spec.gpus_per_node} GPUs/node, partition "
            f"{spec.partition!r}, time {spec.time}): {reason}"
        )


def _sbatch_reason(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if "error" in line.lower():
            return line.split("error:", 1)[-1].strip()
    return lines[-1] if lines else "sbatch --test-only failed without a message"


def _new_secret_file(project_dir: Path | None) -> Path:
    """A new job secret in the private secrets folder (see hpcdist.distributed.jobsecret)."""
    path = state_dir(*Path(SECRET_DIR).parts[1:], project_dir=project_dir) / (
        f"submit-{secrets.token_hex(8)}"
    )
    create_secret_file(path)
    return path


def _local_threads(spec: JobSpec, shape: Shape) -> int:
    """Local ranks share this machine's cores instead of each taking a cluster node's."""
    cores = os.cpu_count() or 1
    return max(1, min(shape.cpus_per_task, cores // max(1, shape.world_size(spec.nodes))))


def layout_env(spec: JobSpec, cpus: Count) -> dict[str, str]:
    """The CPU layout's variables (``JobSpec.cpu_layout_for``) for ranks of ``cpus`` CPUs
    each, as the rendered script exports them; none for a GPU job."""
    layout = spec.cpu_layout_for(cpus)
    return {} if layout is None else dict(layout.env())


@dataclass(frozen=True)
class SubmitPlan:
    """Everything a submission will do, worked out once from a JobSpec (terraform's plan,
    torchx's dry-run request): ``--dry-run`` prints it (``describe``), ``submit`` carries
    it out (``carry_out``) and works nothing out again."""

    spec: JobSpec
    executor: str  # "slurm" or "local"
    parameters: Mapping[str, Any]  # submitit's executor parameters
    command: tuple[str, ...]  # the job's command with its --set values (what --dry-run shows)
    task_commands: tuple[tuple[str, ...], ...]  # one per submitit task, container included
    task_points: tuple[tuple[str, ...], ...]  # each task's --set values (array task i: point i)
    env: Mapping[str, str]  # every task's extra environment; each also gets its own secret
    secrets: int  # job secrets to create before anything is queued (one per array task)
    checks: tuple[str, ...]  # what asks SLURM before anything is written
    script: str | None  # the rendered script that ``sbatch --test-only`` checks
    threads: int | None  # threads per local rank
    torchrun_nproc: int | None  # ranks torchrun starts per node
    log_tasks: int  # submitit tasks, each with its own log
    workdir: str  # the folder the job runs in: where its runs/ are (``hpcdist report``)

    @property
    def swept(self) -> bool:
        return bool(self.spec.sweep)

    def describe(self) -> dict[str, Any]:
        """What ``--dry-run`` shows: the executor and the exact parameters it is given."""
        if self.executor == "slurm":
            described: dict[str, Any] = {
                "executor": self.executor,
                "parameters": dict(self.parameters),
                "environment": dict(self.env),  # every task's, beside its own secret
                "command": self.command,
            }
            if self.swept:
                described["points"] = points(self.spec)  # array task i adds --set for point i
            return described
        return {
            "executor": self.executor,
            "tasks": self.parameters["tasks_per_node"],
            "threads_per_task": self.threads,
            "environment": dict(self.env),
            "timeout_min": self.parameters["timeout_min"],
            "command": self.command,
        }


CHECK_DEPENDENCIES = "the controller knows every --after job (squeue)"
CHECK_PREFLIGHT = "SLURM would run the rendered script (sbatch --test-only)"


def plan_submission(
    spec: JobSpec, executor: str = "auto", preflight_check: bool = True
) -> SubmitPlan:
    """The plan of submitting ``spec``: refuses what submit cannot do, asks SLURM nothing."""
    shape = refuse_auto_gpus(spec)
    kind = choose_executor(executor)
    require_slurm_for_arrays(spec, kind)
    sweep_points = points(spec)
    env = dict(spec.env)
    if spec.warning_signal:
        env[SIGNAL_VAR] = spec.warning_signal
    # In a container (apptainer/singularity) the runtime wraps the rank's command.
    wrapper = container_prefix(spec)
    checks: list[str] = []
    if kind == "slurm":
        parameters: dict[str, Any] = slurm_parameters(spec)
        task_commands = tuple(
            (*wrapper, *task_command(spec, point)) for point in sweep_points or [()]
        )
        if spec.after:
            checks.append(CHECK_DEPENDENCIES)
        if preflight_check:
            checks.append(CHECK_PREFLIGHT)
        threads = None
        env.update(layout_env(spec, spec.cpus_per_task))
        # submitit's tasks, each with its log: under torchrun one per node, holding its ranks.
        log_tasks = spec.nodes * (1 if spec.launcher == "torchrun" else shape.tasks_per_node)
    else:
        parameters = {
            "tasks_per_node": shape.world_size(spec.nodes),
            "timeout_min": time_limit_minutes(spec.time),
        }
        task_commands = ((*wrapper, *task_command(spec)),)
        threads = _local_threads(spec, shape)
        env.update(layout_env(spec, threads))
        log_tasks = shape.world_size(spec.nodes)
    return SubmitPlan(
        spec=spec,
        executor=kind,
        parameters=parameters,
        command=task_command(spec),
        # One task's --set values per array task (a plain job: its own, if any).
        task_points=tuple((*spec.overrides, *point) for point in sweep_points)
        or (tuple(spec.overrides),),
        task_commands=task_commands,
        env=env,
        # Each array task has its own secret: the rendezvous port follows the secret, and
        # two tasks on one node must not meet on the same port.
        secrets=len(task_commands),
        checks=tuple(checks),
        script=render(spec) if CHECK_PREFLIGHT in checks else None,
        threads=threads,
        torchrun_nproc=shape.tasks_per_node
        if kind == "slurm" and spec.launcher == "torchrun"
        else None,
        log_tasks=log_tasks,
        workdir=job_workdir(spec, kind),
    )


def job_workdir(spec: JobSpec, kind: str) -> str:
    """The folder the job runs in: --chdir read from the folder submit runs in (this one,
    as sbatch reads it), else this one. The local executor's ranks start there too."""
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
    """Do what ``plan`` says: its checks, the job's secrets, submitit's submission, records."""
    spec = plan.spec
    # Every check before anything is written: a refused job leaves no trace.
    if CHECK_DEPENDENCIES in plan.checks:
        check_known(spec.after)
    if plan.script is not None:
        preflight(spec, plan.script)
    root = jobs_root(project_dir)
    # What existed before anything is created: a refusal removes every folder and file made
    # from here on (the state folders, the secrets, submitit's folder, pickle and script).
    snapshot = FolderSnapshot.take(root)
    try:
        ex, commands = _prepare(plan, root, project_dir)
    except BaseException:
        snapshot.remove_made()
        raise
    # submitit creates the job's folder, pickles and script: none of them for other eyes.
    with clean_slurm_environment(), strict_umask():
        try:
            # submitit echoes sbatch's stderr; the one line below says what went wrong.
            with contextlib.redirect_stderr(io.StringIO()):
                if plan.swept:
                    # One sbatch: a job array whose task i unpickles commands[i].
                    with ex.batch():
                        jobs = [ex.submit(command) for command in commands]
                else:
                    jobs = [ex.submit(commands[0])]
        except (OSError, RuntimeError) as exc:  # sbatch missing, refused, or no controller
            snapshot.remove_made()
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise UserError(
                f"the {plan.executor} executor could not submit the job: {reason}"
            ) from exc
    return Submission(record=_save_records(plan, jobs, project_dir), executor=plan.executor)


def _prepare(plan: SubmitPlan, root: Path, project_dir: Path | None) -> tuple[Any, list[Any]]:
    """The executor and each task's CommandJob, with the private folders and secrets they
    need (created here, after the snapshot ``carry_out`` takes)."""
    import submitit

    # command_job subclasses submitit's Checkpointable: both load only when a job is submitted.
    from hpcdist.jobs.command_job import CommandJob

    spec = plan.spec
    # submitit's pickles run as this user when the job starts: their folder is ours alone.
    folder = state_dir("submitit", project_dir=project_dir) / "%j"
    shared = replaceable_by_others(root)
    reason = shared_reason(project_base(project_dir))
    if reason and shared is None:
        print(
            f"hpcdist: note: {reason}: this job's pickles, record and secret are kept in "
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
    # The job's secret, before any rank can start: its file's path travels in the job.
    secret_files = [_new_secret_file(project_dir) for _ in range(plan.secrets)]
    commands = [
        CommandJob(
            command,
            {**plan.env, SECRET_VAR: str(secret)},
            record_dir=None,
            torchrun_nproc=plan.torchrun_nproc,
            requeue=spec.requeue,
            max_restarts=spec.max_restarts,
            umask=current_umask(),
            # sbatch's --chdir moves a SLURM job's tasks; a local job's, this.
            workdir=plan.workdir if plan.executor == "local" else None,
        )
        for command, secret in zip(plan.task_commands, secret_files, strict=True)
    ]
    ex: Any
    if plan.executor == "slurm":
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.max_restarts)
        # The array's --array and --dependency travel in additional_parameters, written
        # after submitit's own array option: the rendered script's values win.
        ex.update_parameters(**plan.parameters)
    else:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(**plan.parameters)
    return ex, commands


def _save_records(plan: SubmitPlan, jobs: list[Any], project_dir: Path | None) -> JobRecord:
    """One record per submitted task (and one for an array as a whole); the first."""
    spec = plan.spec
    submitted = time.time()
    records = []
    for job, point in zip(jobs, plan.task_points, strict=True):
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
                tasks=plan.log_tasks,
                folder=str(Path(str(job.paths.folder))),
                submitted=submitted,
                command=list(spec.command),
                start_ticks=None if process is None else process.start_ticks,
                points=[list(point)] if point else None,
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
                points=[list(point) for point in plan.task_points],
            ),
        )
    for record in records:
        save_record(record, project_dir)
    return records[0]


# What only SLURM can honour: the local executor runs on this machine, whatever they ask.
_SLURM_ONLY = (
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
        if asked:
            raise SpecError(
                f"{', '.join(asked)} need{'s' if len(asked) == 1 else ''} SLURM; the {kind} "
                "executor runs on this machine and cannot honour "
                f"{'it' if len(asked) == 1 else 'them'}: leave "
                f"{'it' if len(asked) == 1 else 'them'} out (flag or profile) or submit to a "
                "SLURM cluster"
            )
    if kind != "slurm" and (spec.sweep or spec.after):
        flag = "--sweep" if spec.sweep else "--after"
        raise SpecError(
            f"{flag} needs SLURM (a job array, a dependency); the {kind} executor has "
            "neither: expected a SLURM cluster (render prints the script)"
        )


def describe(spec: JobSpec, executor: str) -> Mapping[str, Any]:
    """What ``--dry-run`` shows: the plan's description (nothing is asked of SLURM)."""
    return plan_submission(spec, executor, preflight_check=False).describe()
