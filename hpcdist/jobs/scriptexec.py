"""submitit queues a rendered script and keeps the job's handle.

submitit's executors write a batch script of their own around a pickled function. Here the
script is the one ``hpcdist render`` prints: ``ScriptExecutor`` hands submitit that file's
bytes as its submission file, so the job submitit queues (``sbatch FILE``), follows
(``Job.state``, its watcher) and cancels (``Job.cancel``) is that script, and no pickle is
written. A job array is the script's own ``--array``; each task gets its handle.

Over slurmrestd (``--transport rest``) there is no sbatch for submitit to run: the same
bytes go to the daemon with their directives as the job description (``queue_rest``), and
the handle is the job id and its folder, as submitit's.

On a machine without SLURM, submitit's local executor runs one task:
``hpcdist.distributed.localstep batch``, the same script as this machine's batch shell.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from hpcdist.slurm import rest


class ScriptExecutor(submitit.SlurmExecutor):
    """A SlurmExecutor whose submission file is a given script, not one it writes."""

    def __init__(
        self, folder: Path, script: str, tasks: int, sbatch_args: tuple[str, ...] = ()
    ) -> None:
        super().__init__(folder)
        self._script = script
        self._tasks = tasks
        self._sbatch_args = sbatch_args

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # The options of one array of a split sweep (its tasks, its first point); the
        # script's bytes stay those render printed.
        return ["sbatch", *self._sbatch_args, str(submission_file_path)]

    def _num_tasks(self) -> int:
        return self._tasks

    def queue(self) -> Any:
        """``sbatch`` the script; submitit's handle of the job. submitit keeps its copy of
        the script in the job's folder: both made private, as the script may carry --env."""
        job = self._submit_command("")
        job.paths.folder.chmod(0o700)
        job.paths.submission_file.chmod(0o600)
        return job


def queue_slurm(
    folder: Path,
    script: Path,
    tasks: int,
    array_tasks: int | None,
    sbatch_args: tuple[str, ...] = (),
) -> list[Any]:
    """Queue ``script`` through submitit; one handle, or one per array task."""
    if rest.chosen():
        return queue_rest(folder, script, array_tasks, sbatch_args)
    executor = ScriptExecutor(folder, script.read_text(encoding="utf-8"), tasks, sbatch_args)
    job = executor.queue()
    if array_tasks is None:
        return [job]
    return [
        submitit.SlurmJob(folder=folder, job_id=f"{job.job_id}_{index}", tasks=list(range(tasks)))
        for index in range(array_tasks)
    ]


@dataclass(frozen=True)
class RestPaths:
    folder: Path


@dataclass(frozen=True)
class RestJob:
    """A job queued over slurmrestd: what the records keep of submitit's handle."""

    job_id: str
    paths: RestPaths


def queue_rest(
    folder: Path, script: Path, array_tasks: int | None, sbatch_args: tuple[str, ...] = ()
) -> list[Any]:
    """Queue ``script``'s bytes through slurmrestd; ``sbatch_args`` (a split sweep's
    --array, --export and --dependency) override the script's lines as sbatch's would."""
    text = script.read_text(encoding="utf-8")
    client = rest.client()
    env = rest.job_environment()
    overrides: dict[str, str] = {}
    for arg in sbatch_args:
        option, _, value = arg.removeprefix("--").partition("=")
        overrides[option] = value
    job_id = client.submit(text, env, os.getcwd(), overrides)
    job_folder = Path(str(folder).replace("%j", job_id))
    job_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = RestPaths(job_folder)
    if array_tasks is None:
        return [RestJob(job_id, paths)]
    return [RestJob(f"{job_id}_{index}", paths) for index in range(array_tasks)]


def queue_local(
    folder: Path, script: Path, workdir: str, timeout_min: float, lead_s: int | None = None
) -> Any:
    """Run ``script`` on this machine through submitit's local executor; its handle.
    ``lead_s``: the script's warning comes that long before the time limit (submitit's
    controller signals the batch task, which delivers the script's own signal)."""
    executor = submitit.LocalExecutor(folder=folder)
    # One task: the batch shell, which starts the ranks itself (localstep's srun).
    executor.update_parameters(tasks_per_node=1, timeout_min=timeout_min)
    if lead_s is not None:
        executor.update_parameters(signal_delay_s=lead_s)
    argv = [
        sys.executable,
        "-m",
        "hpcdist.distributed.localstep",
        "batch",
        str(folder),
        str(script),
        "--chdir",
        workdir,
    ]
    # A Ctrl-C in the terminal that submits (submit --wait) reaches every process of its
    # group: submitit's controller starts with SIGINT ignored, and the batch task leaves
    # the group (localstep), so that it stops the following, never the job, as with SLURM.
    ignored = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignored else None
    try:
        return executor._submit_command(shlex.join(argv))
    finally:
        if ignored:
            signal.signal(signal.SIGINT, previous)
