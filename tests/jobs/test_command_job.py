"""What a submitit task runs under the torchrun launcher, and the job's warning signal."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from hpcdist.jobs.command_job import CommandJob
from ufsemulator.training.earlysignal import job_signal


def test_torchrun_argv_meets_at_rank_zeros_node_of_the_step() -> None:
    # Task 1 of a submitit step with one task on each of node[3-4].
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[3-4]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NODELIST": "node[3-4]",
        "SLURM_NTASKS": "2",
    }
    job = CommandJob(("python3", "-m", "ufsemulator", "train"), torchrun_nproc=4)
    argv = job.torchrun_argv(env)
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nnodes=2" in argv and "--nproc-per-node=4" in argv and "--node-rank=1" in argv
    endpoint = next(a for a in argv if a.startswith("--rdzv-endpoint="))
    assert endpoint.startswith("--rdzv-endpoint=node3:")
    assert "--rdzv-id=4242" in argv
    assert argv[-3:] == ["-m", "ufsemulator", "train"]  # python's words go to torchrun
    shell = CommandJob(("./run.sh", "x"), torchrun_nproc=2).torchrun_argv(env)
    assert shell[-3:] == ["--no-python", "./run.sh", "x"]


def test_job_signal_names() -> None:
    assert job_signal({"HPCDIST_SIGNAL": "USR1"}) is signal.SIGUSR1
    assert job_signal({"HPCDIST_SIGNAL": "sigterm"}) is signal.SIGTERM
    assert job_signal({}) is None
    assert job_signal({"HPCDIST_SIGNAL": "NOPE"}) is None


def test_torchrun_task_waits_for_the_requeue_when_rank_zero_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun turns rank 0's exit 85 into its own 1; the marker file rank 0 leaves still
    tells the task to wait for submitit's requeue instead of failing at once."""
    from hpcdist.jobs import command_job

    slept: list[float] = []
    monkeypatch.setattr(command_job.time, "sleep", slept.append)
    env = {
        "SLURM_JOB_ID": "31337",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NTASKS": "1",
        "SLURM_RESTART_COUNT": "2",
    }
    for key in [
        k
        for k in os.environ
        if k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    ]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    leaves_marker = (
        "import os, pathlib; "
        "pathlib.Path(os.environ['HPCDIST_REQUEUE_MARKER']).write_text('ckpt'); "
        "raise SystemExit(85)"
    )
    job = CommandJob(("python3", "-c", leaves_marker), record_dir=str(tmp_path), torchrun_nproc=1)
    with pytest.raises(command_job.CommandFailed):
        job()
    assert (tmp_path / "requeue-marker.2").read_text() == "ckpt"
    assert slept == [command_job.CHECKPOINT_GRACE_S]
    assert json.loads((tmp_path / "exit_0.json").read_text())["returncode"] != 0


def test_torchrun_takes_modules_and_scripts_but_not_other_interpreter_options() -> None:
    from hpcdist.render.directives import torchrun_command

    assert torchrun_command(["torchrun"], ["python3", "-m", "pkg"]) == ["torchrun", "-m", "pkg"]
    assert torchrun_command(["torchrun"], ["python", "train.py"]) == ["torchrun", "train.py"]
    assert torchrun_command(["torchrun"], ["python3", "-c", "x"]) == [
        "torchrun",
        "--no-python",
        "python3",
        "-c",
        "x",
    ]


def test_no_requeue_job_that_checkpointed_ends_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.jobs import command_job

    slept: list[float] = []
    monkeypatch.setattr(command_job.time, "sleep", slept.append)
    monkeypatch.setenv("SLURM_PROCID", "0")
    job = CommandJob(
        (sys.executable, "-c", "raise SystemExit(85)"), record_dir=str(tmp_path), requeue=False
    )
    with pytest.raises(command_job.CommandFailed, match=r"not requeued \(--no-requeue\)$"):
        job()
    assert slept == []
    assert job.checkpoint() is None  # submitit then ends the job instead of requeueing it


def test_requeue_job_that_checkpointed_waits_and_is_requeued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.jobs import command_job

    slept: list[float] = []
    monkeypatch.setattr(command_job.time, "sleep", slept.append)
    monkeypatch.setenv("SLURM_PROCID", "0")
    job = CommandJob((sys.executable, "-c", "raise SystemExit(85)"), record_dir=str(tmp_path))
    with pytest.raises(command_job.CommandFailed, match="exited with code 85"):
        job()
    assert slept == [command_job.CHECKPOINT_GRACE_S]
    fresh = job.checkpoint()
    assert fresh is not None and fresh.function.requeue is True
