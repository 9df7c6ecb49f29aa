"""What a submitit task runs under the torchrun launcher, and the job's warning signal."""

from __future__ import annotations

import signal
import sys

from hpcdist.command_job import CommandJob
from ufsemulator.earlysignal import job_signal


def test_torchrun_argv_meets_at_rank_zeros_node_of_the_step() -> None:
    # Task 1 of a submitit step with one task on each of node[3-4].
    env = {
        "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "node[3-4]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NODELIST": "node[3-4]", "SLURM_NTASKS": "2",
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
