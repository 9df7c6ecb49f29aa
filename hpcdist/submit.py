"""Submit a JobSpec through submitit: on SLURM, or as local processes where there is none.

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

from hpcdist.container import container_prefix
from hpcdist.dependency import check_known
from hpcdist.directives import sbatch_directives, srun_options
from hpcdist.errors import SpecError, UserError
from hpcdist.fileutil import current_umask
from hpcdist.jobs import JobRecord, jobs_root, project_base, save_record, state_dir
from hpcdist.jobsecret import create_secret_file
from hpcdist.localjob import identify
from hpcdist.private import replaceable_by_others, strict_umask
from hpcdist.protocol import SECRET_DIR, SECRET_VAR, SIGNAL_VAR, is_inherited
from hpcdist.render import render
from hpcdist.slurmtime import time_limit_minutes
from hpcdist.spec import JobSpec
from hpcdist.statehome import shared_reason
from hpcdist.sweep import points, task_command

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
        signal_name, _, delay = spec.signal.removeprefix("B:").partition("@")
        if signal_name != "USR2":
            raise SpecError(
                f"--signal {spec.signal!r}: submitit jobs warn with USR2; "
                "expected USR2@SECONDS (plain sbatch scripts take any signal)"
            )
        params["signal_delay_s"] = int(delay or 60)
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


def preflight(spec: JobSpec) -> None:
    """Ask SLURM whether it would run this job (``sbatch --test-only``) before submitting."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
        handle.write(render(spec))
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
    """A new job secret in the private secrets folder (see hpcdist.jobsecret)."""
    path = state_dir(*Path(SECRET_DIR).parts[1:], project_dir=project_dir) / (
        f"submit-{secrets.token_hex(8)}"
    )
    create_secret_file(path)
    return path


def _local_threads(spec: JobSpec, shape: Shape) -> int:
    """Local ranks share this machine's cores instead of each taking a cluster node's."""
    cores = os.cpu_count() or 1
    return max(1, min(shape.cpus_per_task, cores // max(1, shape.world_size(spec.nodes))))


def submit(
    spec: JobSpec,
    executor: str = "auto",
    project_dir: Path | None = None,
    preflight_check: bool = True,
) -> Submission:
    import submitit

    from hpcdist.command_job import CommandJob

    shape = refuse_auto_gpus(spec)
    kind = choose_executor(executor)
    # Every check before anything is written: a refused job leaves no trace.
    require_slurm_for_arrays(spec, kind)
    if kind == "slurm":
        if spec.after:
            check_known(spec.after)
        if preflight_check:
            preflight(spec)
    root = jobs_root(project_dir)
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
    sweep_points = points(spec)
    extra_env = dict(spec.env)
    # The job's secret, before any rank can start: its file's path travels in the job. Each
    # array task has its own: the rendezvous port follows the secret, and two tasks on one
    # node must not meet on the same port.
    secret_files = [_new_secret_file(project_dir) for _ in sweep_points or [()]]
    extra_env[SECRET_VAR] = str(secret_files[0])
    # In a container (apptainer/singularity) the runtime wraps the rank's command.
    wrapper = container_prefix(spec)
    if spec.warning_signal:
        extra_env[SIGNAL_VAR] = spec.warning_signal

    # One task's --set values per array task (a plain job: its own, if any).
    task_points = [[*spec.overrides, *point] for point in sweep_points] or [[*spec.overrides]]

    ex: Any
    if kind == "slurm":
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=spec.max_restarts)
        # The array's --array and --dependency travel in additional_parameters, written
        # after submitit's own array option: the rendered script's values win.
        ex.update_parameters(**slurm_parameters(spec))
        nproc = shape.tasks_per_node if spec.launcher == "torchrun" else None
        commands = [
            CommandJob(
                (*wrapper, *task_command(spec, point)),
                {**extra_env, SECRET_VAR: str(secret)},
                record_dir=None,
                torchrun_nproc=nproc,
                requeue=spec.requeue,
                umask=current_umask(),
            )
            for point, secret in zip(sweep_points or [()], secret_files, strict=True)
        ]
    else:
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(
            tasks_per_node=shape.world_size(spec.nodes), timeout_min=time_limit_minutes(spec.time)
        )
        commands = [
            CommandJob(
                (*wrapper, *task_command(spec)),
                extra_env,
                record_dir=None,
                threads=_local_threads(spec, shape),
                requeue=spec.requeue,
                umask=current_umask(),
            )
        ]
    before = _files_under(root) - set(secret_files)
    # submitit creates the job's folder, pickles and script: none of them for other eyes.
    with clean_slurm_environment(), strict_umask():
        try:
            # submitit echoes sbatch's stderr; the one line below says what went wrong.
            with contextlib.redirect_stderr(io.StringIO()):
                if sweep_points:
                    # One sbatch: a job array whose task i unpickles commands[i].
                    with ex.batch():
                        jobs = [ex.submit(command) for command in commands]
                else:
                    jobs = [ex.submit(commands[0])]
        except (OSError, RuntimeError) as exc:  # sbatch missing, refused, or no controller
            _remove_new_files(root, before)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise UserError(f"the {kind} executor could not submit the job: {reason}") from exc
    # submitit's tasks, each with its log: under torchrun one per node, holding its ranks.
    srun_tasks = 1 if spec.launcher == "torchrun" else shape.tasks_per_node
    tasks = spec.nodes * srun_tasks if kind == "slurm" else shape.world_size(spec.nodes)
    submitted = time.time()
    records = []
    for job, point in zip(jobs, task_points, strict=True):
        # A local job is a process: its start time tells it apart from a later reuse of
        # its pid.
        process = identify(int(job.job_id)) if kind == "local" else None
        records.append(
            JobRecord(
                job_id=str(job.job_id),
                executor=kind,
                name=spec.job_name,
                mode=spec.mode,
                nodes=spec.nodes,
                tasks=tasks,
                folder=str(Path(str(job.paths.folder))),
                submitted=submitted,
                command=list(spec.command),
                start_ticks=None if process is None else process.start_ticks,
                points=[point] if point else None,
            )
        )
    if sweep_points:
        # The array as a whole (its tasks are <id>_0, <id>_1, ...): what report reads.
        array_id = records[0].job_id.partition("_")[0]
        records.insert(
            0,
            dataclasses.replace(
                records[0],
                job_id=array_id,
                folder=str(Path(records[0].folder).parent),
                points=task_points,
            ),
        )
    for record in records:
        save_record(record, project_dir)
    return Submission(record=records[0], executor=kind)


def require_slurm_for_arrays(spec: JobSpec, kind: str) -> None:
    """A sweep is a SLURM job array and --after a SLURM dependency: no local twin."""
    if kind != "slurm" and (spec.sweep or spec.after):
        flag = "--sweep" if spec.sweep else "--after"
        raise SpecError(
            f"{flag} needs SLURM (a job array, a dependency); the {kind} executor has "
            "neither: expected a SLURM cluster (render prints the script)"
        )


def _files_under(root: Path) -> set[Path]:
    return set(root.rglob("*")) | {root} if root.exists() else set()


def _remove_new_files(root: Path, before: set[Path]) -> None:
    """A submission that failed leaves nothing behind: what submitit wrote before sbatch
    refused (its pickle, its script, the folders it made) goes again."""
    for path in sorted(_files_under(root) - before, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir() if path.is_dir() else path.unlink()


def describe(spec: JobSpec, executor: str) -> Mapping[str, Any]:
    """What ``--dry-run`` shows: the executor and the exact parameters it would be given."""
    shape = refuse_auto_gpus(spec)
    kind = choose_executor(executor)
    require_slurm_for_arrays(spec, kind)
    if kind == "slurm":
        described: dict[str, Any] = {
            "executor": kind,
            "parameters": slurm_parameters(spec),
            "command": task_command(spec),
        }
        if spec.sweep:
            described["points"] = points(spec)  # array task i adds --set for point i
        return described
    return {
        "executor": kind,
        "tasks": shape.world_size(spec.nodes),
        "threads_per_task": _local_threads(spec, shape),
        "timeout_min": time_limit_minutes(spec.time),
        "command": task_command(spec),
    }
