"""DistEnv.from_environ over a table of real-looking environments, and setup_distributed.

The environments are what torchrun, srun (SLURM 22.05) and submitit 1.5.4's LocalExecutor
set; the expectations are what every rank must compute on its own, without talking.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import FrozenInstanceError

import pytest

from hpcdist.distributed import (
    DistEnv,
    DistEnvError,
    DistributedInitError,
    NodeListError,
    cleanup_distributed,
    derive_port,
    distributed,
    select_device,
    setup_distributed,
)

HOST = socket.gethostname()


def srun(
    rank: int,
    ntasks: int,
    nodelist: str,
    tasks_per_node: str,
    *,
    local: int | None = None,
    node: int | None = None,
    job: int = 1234,
    step: int = 0,
    **extra: str,
) -> dict[str, str]:
    """The variables srun gives one task of a step (the subset DistEnv reads)."""
    env = {
        "SLURM_JOB_ID": str(job),
        "SLURM_STEP_ID": str(step),
        "SLURM_PROCID": str(rank),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
    }
    if local is not None:
        env["SLURM_LOCALID"] = str(local)
    if node is not None:
        env["SLURM_NODEID"] = str(node)
    env.update(extra)
    return env


def torchrun(
    rank: int, world: int, local: int, local_world: int, group: int, **extra: str
) -> dict[str, str]:
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(group),
        "ROLE_RANK": str(rank),
        "MASTER_ADDR": "node01",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "none",
        "OMP_NUM_THREADS": "1",
    }
    env.update(extra)
    return env


def submitit_local(rank: int, ntasks: int, **extra: str) -> dict[str, str]:
    # Exactly what submitit 1.5.4's local controller and its tasks set (local/local.py).
    env = {
        "SUBMITIT_EXECUTOR": "local",
        "SUBMITIT_LOCAL_NTASKS": str(ntasks),
        "SUBMITIT_LOCAL_COMMAND": "python -u -m submitit.core._submit /tmp/x",
        "SUBMITIT_LOCAL_TIMEOUT_S": "300",
        "SUBMITIT_LOCAL_SIGNAL_DELAY_S": "30",
        "SUBMITIT_LOCAL_NODEID": "0",
        "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
        "SUBMITIT_STDERR_TO_STDOUT": "",
        "SUBMITIT_LOCAL_WITH_SHELL": "",
        "CUDA_VISIBLE_DEVICES": "",
        "SUBMITIT_LOCAL_LOCALID": str(rank),
        "SUBMITIT_LOCAL_GLOBALID": str(rank),
        "SUBMITIT_LOCAL_JOB_ID": "4242",
    }
    env.update(extra)
    return env


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


# (rank, local_rank, world_size, local_world_size, node_rank, master_addr, master_port,
#  num_threads, source, hostname)
Expected = tuple[int, int, int, int, int, str, int, int | None, str, str]

RESOLVES: dict[str, tuple[dict[str, str], Expected]] = {
    "torchrun-2-nodes-x-4": (
        torchrun(5, 8, 1, 4, 1),
        (5, 1, 8, 4, 1, "node01", 29500, 1, "torchrun", HOST),
    ),
    "torchrun-inside-srun-wins-over-slurm": (
        {**srun(1, 2, "node[1-2]", "1(x2)", local=0, node=1), **torchrun(6, 8, 2, 4, 1)},
        (6, 2, 8, 4, 1, "node01", 29500, 1, "torchrun", HOST),
    ),
    "torchrun-single-process-without-local-vars": (
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"},
        (0, 0, 1, 1, 0, "127.0.0.1", 29400, None, "torchrun", HOST),
    ),
    "submitit-export-without-group-rank": (
        without(torchrun(5, 8, 1, 4, 0), "GROUP_RANK", "OMP_NUM_THREADS"),
        (5, 1, 8, 4, 1, "node01", 29500, None, "torchrun", HOST),
    ),
    "srun-one-task-per-node": (
        srun(2, 4, "node[1-4]", "1(x4)", local=0, node=2, SLURM_CPUS_PER_TASK="2"),
        (2, 0, 4, 1, 2, "node1", derive_port(1234, 0), 2, "slurm", "node3"),
    ),
    "srun-many-tasks-per-node": (
        srun(3, 4, "node[1-2]", "2(x2)", local=1, node=1, SLURMD_NODENAME="node2.ib"),
        (3, 1, 4, 2, 1, "node1", derive_port(1234, 0), None, "slurm", "node2.ib"),
    ),
    "srun-8-gpus-x-2-nodes": (
        srun(15, 16, "gpu-[07-08]", "8(x2)", local=7, node=1, SLURM_CPUS_PER_TASK="6"),
        (15, 7, 16, 8, 1, "gpu-07", derive_port(1234, 0), 6, "slurm", "gpu-08"),
    ),
    "uneven-layout-last-node": (
        srun(6, 7, "gpu-[01-03,07]", "2(x3),1", local=0, node=3),
        (6, 0, 7, 1, 3, "gpu-01", derive_port(1234, 0), None, "slurm", "gpu-07"),
    ),
    "uneven-layout-placed-from-layout-alone": (
        without(srun(5, 7, "gpu-[01-03,07]", "2(x3),1"), "SLURM_LOCALID", "SLURM_NODEID"),
        (5, 1, 7, 2, 2, "gpu-01", derive_port(1234, 0), None, "slurm", "gpu-03"),
    ),
    "rank-0-host-comes-from-layout-not-first-host": (
        srun(1, 3, "node[1-3]", "0,2,1", local=1, node=1),
        (1, 1, 3, 2, 1, "node2", derive_port(1234, 0), None, "slurm", "node2"),
    ),
    "cyclic-distribution-keeps-srun-placement": (
        srun(1, 4, "node[1-2]", "2(x2)", local=0, node=1),
        (1, 0, 4, 2, 1, "node1", derive_port(1234, 0), None, "slurm", "node2"),
    ),
    "step-inside-a-larger-job": (
        {
            **srun(1, 8, "node[1-8]", "1(x8)", job=777),
            "SLURM_STEP_ID": "3",
            "SLURM_STEP_NUM_TASKS": "4",
            "SLURM_STEP_NODELIST": "node[5-6]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_NODEID": "0",
            "SLURM_LOCALID": "1",
        },
        (1, 1, 4, 2, 0, "node5", derive_port(777, 3), None, "slurm", "node5"),
    ),
    "job-variables-only-npros-and-nodelist-fallbacks": (
        {
            "SLURM_JOB_ID": "99",
            "SLURM_STEPID": "0",  # the older spelling
            "SLURM_PROCID": "1",
            "SLURM_NPROCS": "2",
            "SLURM_NODELIST": "cn[0100-0101]",
            "SLURM_TASKS_PER_NODE": "1(x2)",
        },
        (1, 0, 2, 1, 1, "cn0100", derive_port(99, 0), None, "slurm", "cn0101"),
    ),
    "slurm-keeps-exported-master-addr-and-port": (
        srun(1, 2, "node[1-2]", "1(x2)", MASTER_ADDR="10.0.0.5", MASTER_PORT="23456"),
        (1, 0, 2, 1, 1, "10.0.0.5", 23456, None, "slurm", "node2"),
    ),
    "slurm-threads-fall-back-to-omp": (
        srun(0, 1, "node1", "1", OMP_NUM_THREADS="3"),
        (0, 0, 1, 1, 0, "node1", derive_port(1234, 0), 3, "slurm", "node1"),
    ),
    "slurm-with-agreeing-torch-exports": (
        srun(1, 2, "node[1-2]", "1(x2)", WORLD_SIZE="2", LOCAL_RANK="0"),
        (1, 0, 2, 1, 1, "node1", derive_port(1234, 0), None, "slurm", "node2"),
    ),
    "submitit-local-executor": (
        submitit_local(1, 2),
        (1, 1, 2, 2, 0, "127.0.0.1", derive_port(4242, 0), None, "submitit-local", HOST),
    ),
    "slurm-and-submitit-local-agreeing": (
        {**srun(0, 1, "node1", "1", local=0, node=0), **submitit_local(0, 1)},
        (0, 0, 1, 1, 0, "node1", derive_port(1234, 0), None, "slurm", "node1"),
    ),
    # Secondary variables set to values their defaults would not produce: each is read.
    "torchrun-group-rank-is-read-not-derived": (
        torchrun(5, 8, 1, 4, 3),
        (5, 1, 8, 4, 3, "node01", 29500, 1, "torchrun", HOST),
    ),
    "torchrun-multi-rank-local-rank-0": (
        torchrun(4, 8, 0, 4, 1, SLURMD_NODENAME="gpu-02"),
        (4, 0, 8, 4, 1, "node01", 29500, 1, "torchrun", "gpu-02"),
    ),
    "torchrun-highest-port": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="65535"),
        (1, 1, 2, 2, 0, "node01", 65535, 1, "torchrun", HOST),
    ),
    "torchrun-lowest-port": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="1"),
        (1, 1, 2, 2, 0, "node01", 1, 1, "torchrun", HOST),
    ),
    "submitit-local-second-node": (
        submitit_local(
            3,
            4,
            SUBMITIT_LOCAL_JOB_NUM_NODES="2",
            SUBMITIT_LOCAL_NODEID="1",
            SUBMITIT_LOCAL_LOCALID="1",
            OMP_NUM_THREADS="2",
            SLURMD_NODENAME="n7",
        ),
        (3, 1, 4, 2, 1, "127.0.0.1", derive_port(4242, 0), 2, "submitit-local", "n7"),
    ),
    "submitit-local-keeps-exported-master": (
        submitit_local(0, 2, MASTER_ADDR="10.1.1.1", MASTER_PORT="23456"),
        (0, 0, 2, 2, 0, "10.1.1.1", 23456, None, "submitit-local", HOST),
    ),
    "submitit-local-rank-without-localid": (
        without(submitit_local(1, 2), "SUBMITIT_LOCAL_LOCALID"),
        (1, 1, 2, 2, 0, "127.0.0.1", derive_port(4242, 0), None, "submitit-local", HOST),
    ),
    "srun-one-task-step-without-step-id": (
        without(srun(0, 1, "node1", "1", job=77), "SLURM_STEP_ID"),
        (0, 0, 1, 1, 0, "node1", derive_port(77, 0), None, "slurm", "node1"),
    ),
    "srun-step-id-read-for-the-port": (
        srun(1, 2, "node[1-2]", "1(x2)", job=77, step=5),
        (1, 0, 2, 1, 1, "node1", derive_port(77, 5), None, "slurm", "node2"),
    ),
    "torchrun-one-process-per-node": (
        torchrun(1, 2, 0, 1, 1),
        (1, 0, 2, 1, 1, "node01", 29500, 1, "torchrun", HOST),
    ),
    "slurm-job-nodelist-alone": (
        without(srun(1, 2, "cn[7-8]", "1(x2)"), "SLURM_STEP_NODELIST", "SLURM_NODELIST"),
        (1, 0, 2, 1, 1, "cn7", derive_port(1234, 0), None, "slurm", "cn8"),
    ),
    "slurm-first-job-id": (
        srun(0, 1, "node1", "1", job=1),
        (0, 0, 1, 1, 0, "node1", derive_port(1, 0), None, "slurm", "node1"),
    ),
    "submitit-local-without-node-variables": (
        without(submitit_local(1, 2), "SUBMITIT_LOCAL_JOB_NUM_NODES", "SUBMITIT_LOCAL_NODEID"),
        (1, 1, 2, 2, 0, "127.0.0.1", derive_port(4242, 0), None, "submitit-local", HOST),
    ),
    "block-placement-third-node": (
        without(srun(5, 6, "n[1-3]", "1,3,2"), "SLURM_LOCALID", "SLURM_NODEID"),
        (5, 1, 6, 2, 2, "n1", derive_port(1234, 0), None, "slurm", "n3"),
    ),
    "block-placement-first-rank-of-a-node": (
        without(srun(4, 6, "n[1-3]", "1,3,2"), "SLURM_LOCALID", "SLURM_NODEID"),
        (4, 0, 6, 2, 2, "n1", derive_port(1234, 0), None, "slurm", "n3"),
    ),
    "single-process-exported-address": (
        {"MASTER_ADDR": "10.2.2.2", "MASTER_PORT": "65535"},
        (0, 0, 1, 1, 0, "10.2.2.2", 65535, None, "single", HOST),
    ),
    "single-process": (
        {},
        (0, 0, 1, 1, 0, "127.0.0.1", 0, None, "single", HOST),
    ),
    "single-process-with-port-and-threads": (
        {"MASTER_PORT": "29999", "OMP_NUM_THREADS": "4", "SLURMD_NODENAME": "login1"},
        (0, 0, 1, 1, 0, "127.0.0.1", 29999, 4, "single", "login1"),
    ),
}


@pytest.mark.parametrize(("env", "expected"), list(RESOLVES.values()), ids=list(RESOLVES))
def test_distenv_resolves(env: dict[str, str], expected: Expected) -> None:
    got = DistEnv.from_environ(env)
    counts = (got.rank, got.local_rank, got.world_size, got.local_world_size, got.node_rank)
    assert all(type(count) is int for count in counts), counts
    assert (
        got.rank,
        got.local_rank,
        got.world_size,
        got.local_world_size,
        got.node_rank,
        got.master_addr,
        got.master_port,
        got.num_threads,
        got.source,
        got.hostname,
    ) == expected


def test_every_rank_of_an_uneven_job_agrees_on_master_and_port() -> None:
    layout, nodes = "2(x3),1", ["gpu-01", "gpu-02", "gpu-03", "gpu-07"]
    placements = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
    envs = [
        DistEnv.from_environ(srun(rank, 7, "gpu-[01-03,07]", layout, local=lr, node=nr))
        for rank, (nr, lr) in enumerate(placements)
    ]
    assert {(e.master_addr, e.master_port) for e in envs} == {("gpu-01", derive_port(1234, 0))}
    assert [e.hostname for e in envs] == [nodes[nr] for nr, _ in placements]


def test_distenv_two_jobs_on_the_same_nodes_get_different_ports() -> None:
    first = DistEnv.from_environ(srun(0, 2, "node[1-2]", "1(x2)", job=500))
    second = DistEnv.from_environ(srun(0, 2, "node[1-2]", "1(x2)", job=501))
    assert first.master_port != second.master_port


def test_distenv_reads_only_the_mapping_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURM_PROCID", "3")
    assert DistEnv.from_environ({}).source == "single"


def test_distenv_is_frozen() -> None:
    env = DistEnv.from_environ({})
    with pytest.raises(FrozenInstanceError):
        env.rank = 1  # type: ignore[misc]


# (environment, words the error must contain)
REJECTS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "batch-script-without-srun": (
        # What SLURM 22.05 sets in the batch script of --nodes=2 --ntasks-per-node=2
        {
            "SLURM_JOB_ID": "9566621",
            "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_NODELIST": "node[1-2]",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NPROCS": "4",
            "SLURM_NTASKS": "4",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_PROCID": "0",
            "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_CPUS_PER_TASK": "1",
        },
        ("SLURM_STEP_ID", "batch script", "srun"),
    ),
    "stale-procid-alone": ({"SLURM_PROCID": "0"}, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")),
    "procid-without-nodelist": (
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"},
        ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
    ),
    "procid-without-tasks-per-node": (
        without(
            srun(0, 2, "node[1-2]", "1(x2)"), "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"
        ),
        ("SLURM_TASKS_PER_NODE",),
    ),
    "no-job-id-for-the-port": (
        without(srun(0, 2, "node[1-2]", "1(x2)"), "SLURM_JOB_ID"),
        ("SLURM_JOB_ID",),
    ),
    "procid-beyond-world": (srun(4, 4, "node[1-4]", "1(x4)"), ("SLURM_PROCID=4", "0..3")),
    "layout-and-nodelist-disagree": (
        srun(0, 4, "node[1-3]", "2(x2)"),
        ("SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST", "'node[1-3]'"),
    ),
    "layout-and-ntasks-disagree": (
        srun(0, 5, "node[1-2]", "2(x2)"),
        ("SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"),
    ),
    "step-world-with-job-nodelist": (
        without(
            {**srun(0, 8, "node[1-8]", "1(x8)"), "SLURM_STEP_NUM_TASKS": "4"},
            "SLURM_STEP_NODELIST",
            "SLURM_STEP_TASKS_PER_NODE",
        ),
        ("SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"),
    ),
    "localid-beyond-node": (
        srun(1, 4, "node[1-2]", "2(x2)", local=2, node=0),
        ("SLURM_LOCALID=2",),
    ),
    "nodeid-beyond-nodelist": (srun(1, 2, "node[1-2]", "1(x2)", node=2), ("SLURM_NODEID=2",)),
    "procid-not-a-number": (
        srun(0, 2, "node[1-2]", "1(x2)", SLURM_PROCID="x"),
        ("SLURM_PROCID", "'x'"),
    ),
    "ntasks-zero": (srun(0, 0, "node1", "1"), ("SLURM_STEP_NUM_TASKS", "'0'")),
    "cpus-per-task-zero": (
        srun(0, 1, "node1", "1", SLURM_CPUS_PER_TASK="0"),
        ("SLURM_CPUS_PER_TASK",),
    ),
    "malformed-tasks-per-node": (
        srun(0, 2, "node[1-2]", "2(x"),
        ("SLURM_STEP_TASKS_PER_NODE", "'2(x'"),
    ),
    "torchrun-rank-without-world": ({"RANK": "0"}, ("WORLD_SIZE",)),
    "torchrun-rank-beyond-world": (torchrun(8, 8, 0, 4, 2), ("RANK=8", "WORLD_SIZE")),
    "torchrun-without-local-rank": (
        without(torchrun(1, 2, 1, 2, 0), "LOCAL_RANK"),
        ("LOCAL_RANK",),
    ),
    "torchrun-without-master-addr": (
        without(torchrun(1, 2, 1, 2, 0), "MASTER_ADDR"),
        ("MASTER_ADDR",),
    ),
    "torchrun-port-out-of-range": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="70000"),
        ("MASTER_PORT", "'70000'"),
    ),
    "torchrun-port-one-past-the-highest": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="65536"),
        ("MASTER_PORT must be a TCP port 1..65535, got '65536'",),
    ),
    "torchrun-port-zero": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="0"),
        ("MASTER_PORT must be an integer >= 1, got '0'",),
    ),
    "submitit-local-tasks-not-a-multiple-of-nodes": (
        submitit_local(0, 3, SUBMITIT_LOCAL_JOB_NUM_NODES="2"),
        ("SUBMITIT_LOCAL_NTASKS=3 is not a multiple of SUBMITIT_LOCAL_JOB_NUM_NODES=2",),
    ),
    "submitit-local-localid-beyond-node": (
        submitit_local(1, 2, SUBMITIT_LOCAL_JOB_NUM_NODES="2", SUBMITIT_LOCAL_LOCALID="1"),
        ("SUBMITIT_LOCAL_LOCALID=1 is out of range: tasks per node allows 0..0",),
    ),
    "batch-script-of-two-tasks": (
        without(srun(0, 2, "node[1-2]", "1(x2)"), "SLURM_STEP_ID"),
        ("no SLURM_STEP_ID",),
    ),
    "slurm-job-id-zero": (srun(0, 1, "node1", "1", job=0), ("SLURM_JOB_ID",)),
    "submitit-local-job-id-zero": (
        submitit_local(0, 2, SUBMITIT_LOCAL_JOB_ID="0"),
        ("SUBMITIT_LOCAL_JOB_ID",),
    ),
    "torchrun-without-local-world-size": (
        without(torchrun(1, 2, 1, 2, 0), "LOCAL_WORLD_SIZE"),
        ("LOCAL_WORLD_SIZE",),
    ),
    "torchrun-local-rank-beyond-local-world": (torchrun(1, 2, 1, 1, 0), ("LOCAL_RANK=1",)),
    "stale-local-world-size-without-rank": (
        srun(1, 4, "node[1-2]", "2(x2)", local=1, node=0, LOCAL_WORLD_SIZE="3"),
        ("LOCAL_WORLD_SIZE='3'",),
    ),
    "empty-master-port-alone": ({"MASTER_PORT": ""}, ("MASTER_PORT",)),
    "torchrun-port-not-a-number": (
        torchrun(1, 2, 1, 2, 0, MASTER_PORT="http"),
        ("MASTER_PORT", "'http'"),
    ),
    "stale-world-size-without-rank": (
        srun(1, 4, "node[1-4]", "1(x4)", WORLD_SIZE="8"),
        ("WORLD_SIZE='8'", "slurm", "4"),
    ),
    "stale-local-rank-without-rank": ({"LOCAL_RANK": "3"}, ("LOCAL_RANK='3'", "single")),
    "stale-world-size-on-a-laptop": ({"WORLD_SIZE": "2"}, ("WORLD_SIZE='2'",)),
    "slurm-and-submitit-local-disagree": (
        {**srun(0, 4, "node[1-4]", "1(x4)"), **submitit_local(1, 2)},
        ("SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID", "clean_env"),
    ),
    "submitit-local-without-ntasks": (
        without(submitit_local(0, 2), "SUBMITIT_LOCAL_NTASKS"),
        ("SUBMITIT_LOCAL_NTASKS",),
    ),
    "submitit-local-without-job-id": (
        without(submitit_local(0, 2), "SUBMITIT_LOCAL_JOB_ID"),
        ("SUBMITIT_LOCAL_JOB_ID",),
    ),
    "submitit-local-rank-beyond-ntasks": (submitit_local(2, 2), ("SUBMITIT_LOCAL_GLOBALID=2",)),
}


@pytest.mark.parametrize(("env", "words"), list(REJECTS.values()), ids=list(REJECTS))
def test_distenv_rejects_stale_missing_or_malformed_variables(
    env: dict[str, str], words: tuple[str, ...]
) -> None:
    with pytest.raises(DistEnvError) as info:
        DistEnv.from_environ(env)
    for word in words:
        assert word in str(info.value)


# The whole message of each rejected environment: the variable, its value, what was expected.
REJECT_MESSAGES: dict[str, str] = {
    "batch-script-without-srun": (
        "SLURM_PROCID=0 and SLURM_NTASKS=4 but no SLURM_STEP_ID: this is the batch script, not "
        "a task of a job step; start the program with srun (or torchrun)"
    ),
    "stale-procid-alone": (
        "SLURM_STEP_NUM_TASKS or SLURM_NTASKS or SLURM_NPROCS is not set although "
        "SLURM_PROCID='0' is; variables inherited from another job? start the program with "
        "srun or torchrun"
    ),
    "procid-without-nodelist": (
        "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST or SLURM_NODELIST is not set although "
        "SLURM_PROCID='0' is; variables inherited from another job? start the program with "
        "srun or torchrun"
    ),
    "procid-without-tasks-per-node": (
        "SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE is not set although "
        "SLURM_PROCID='0' is; variables inherited from another job? start the program with "
        "srun or torchrun"
    ),
    "no-job-id-for-the-port": (
        "SLURM_JOB_ID is not set although SLURM_PROCID='0' is; variables inherited from "
        "another job? start the program with srun or torchrun"
    ),
    "procid-beyond-world": (
        "SLURM_PROCID=4 is out of range: SLURM_STEP_NUM_TASKS allows 0..3; stale variables "
        "from another job?"
    ),
    "layout-and-nodelist-disagree": (
        "SLURM_STEP_TASKS_PER_NODE='2(x2)' describes 2 nodes but "
        "SLURM_STEP_NODELIST='node[1-3]' has 3; stale variables from another job?"
    ),
    "layout-and-ntasks-disagree": (
        "SLURM_STEP_TASKS_PER_NODE='2(x2)' places 4 tasks but SLURM_STEP_NUM_TASKS='5'; stale "
        "variables from another job?"
    ),
    "step-world-with-job-nodelist": (
        "SLURM_TASKS_PER_NODE='1(x8)' places 8 tasks but SLURM_STEP_NUM_TASKS='4'; stale "
        "variables from another job?"
    ),
    "localid-beyond-node": (
        "SLURM_LOCALID=2 is out of range: SLURM_STEP_TASKS_PER_NODE on that node allows 0..1; "
        "stale variables from another job?"
    ),
    "nodeid-beyond-nodelist": (
        "SLURM_NODEID=2 is out of range: the 2 nodes of SLURM_STEP_NODELIST allows 0..1; stale "
        "variables from another job?"
    ),
    "procid-not-a-number": "SLURM_PROCID must be an integer >= 0, got 'x'",
    "ntasks-zero": "SLURM_STEP_NUM_TASKS must be an integer >= 1, got '0'",
    "cpus-per-task-zero": "SLURM_CPUS_PER_TASK must be an integer >= 1, got '0'",
    "malformed-tasks-per-node": (
        "bad SLURM_STEP_TASKS_PER_NODE '2(x'; expected e.g. '4' or '2(x3),1'"
    ),
    "torchrun-rank-without-world": "WORLD_SIZE is not set although RANK='0' is",
    "torchrun-rank-beyond-world": (
        "RANK=8 is out of range: WORLD_SIZE allows 0..7; stale variables from another job?"
    ),
    "torchrun-without-local-rank": "LOCAL_RANK is not set although RANK='1' is",
    "torchrun-without-master-addr": "MASTER_ADDR is not set although RANK='1' is",
    "torchrun-port-out-of-range": "MASTER_PORT must be a TCP port 1..65535, got '70000'",
    "torchrun-port-one-past-the-highest": "MASTER_PORT must be a TCP port 1..65535, got '65536'",
    "torchrun-port-zero": "MASTER_PORT must be an integer >= 1, got '0'",
    "submitit-local-tasks-not-a-multiple-of-nodes": (
        "SUBMITIT_LOCAL_NTASKS=3 is not a multiple of SUBMITIT_LOCAL_JOB_NUM_NODES=2"
    ),
    "submitit-local-localid-beyond-node": (
        "SUBMITIT_LOCAL_LOCALID=1 is out of range: tasks per node allows 0..0; stale variables "
        "from another job?"
    ),
    "batch-script-of-two-tasks": (
        "SLURM_PROCID=0 and SLURM_STEP_NUM_TASKS=2 but no SLURM_STEP_ID: this is the batch "
        "script, not a task of a job step; start the program with srun (or torchrun)"
    ),
    "slurm-job-id-zero": "SLURM_JOB_ID must be an integer >= 1, got '0'",
    "submitit-local-job-id-zero": "SUBMITIT_LOCAL_JOB_ID must be an integer >= 1, got '0'",
    "torchrun-without-local-world-size": "LOCAL_WORLD_SIZE is not set although RANK='1' is",
    "torchrun-local-rank-beyond-local-world": (
        "LOCAL_RANK=1 is out of range: LOCAL_WORLD_SIZE allows 0..0; "
        "stale variables from another job?"
    ),
    "stale-local-world-size-without-rank": (
        "LOCAL_WORLD_SIZE='3' is set without RANK and contradicts the slurm environment "
        "(local_world_size 2); stale export? unset it"
    ),
    "empty-master-port-alone": "MASTER_PORT is not set although a launcher variable is",
    "torchrun-port-not-a-number": "MASTER_PORT must be an integer >= 1, got 'http'",
    "stale-world-size-without-rank": (
        "WORLD_SIZE='8' is set without RANK and contradicts the slurm environment (world_size "
        "4); stale export? unset it"
    ),
    "stale-local-rank-without-rank": (
        "LOCAL_RANK='3' is set without RANK and contradicts the single environment (local_rank "
        "0); stale export? unset it"
    ),
    "stale-world-size-on-a-laptop": (
        "WORLD_SIZE='2' is set without RANK and contradicts the single environment (world_size "
        "1); stale export? unset it"
    ),
    "slurm-and-submitit-local-disagree": (
        "SLURM says rank 0 of 4 (SLURM_PROCID) but submitit's local executor says rank 1 of 2 "
        "(SUBMITIT_LOCAL_GLOBALID); one set is inherited: unset SLURM_* inside a local "
        "executor (submitit.helpers.clean_env()) or SUBMITIT_LOCAL_* inside srun"
    ),
    "submitit-local-without-ntasks": (
        "SUBMITIT_LOCAL_NTASKS is not set although SUBMITIT_LOCAL_GLOBALID='0' is; variables "
        "inherited from another job? start the program with srun or torchrun"
    ),
    "submitit-local-without-job-id": (
        "SUBMITIT_LOCAL_JOB_ID is not set although SUBMITIT_LOCAL_GLOBALID='0' is; variables "
        "inherited from another job? start the program with srun or torchrun"
    ),
    "submitit-local-rank-beyond-ntasks": (
        "SUBMITIT_LOCAL_GLOBALID=2 is out of range: SUBMITIT_LOCAL_NTASKS allows 0..1; stale "
        "variables from another job?"
    ),
}


@pytest.mark.parametrize("name", list(REJECTS))
def test_distenv_rejection_message_in_full(name: str) -> None:
    with pytest.raises(DistEnvError) as info:
        DistEnv.from_environ(REJECTS[name][0])
    assert str(info.value) == REJECT_MESSAGES[name]


def test_distenv_malformed_nodelist_names_the_variable() -> None:
    with pytest.raises(NodeListError, match=r"SLURM_STEP_NODELIST 'node\[1-2'"):
        DistEnv.from_environ(srun(0, 2, "node[1-2", "1(x2)"))


def test_distenv_errors_are_value_errors() -> None:
    assert issubclass(DistEnvError, ValueError)
    assert issubclass(NodeListError, ValueError)


# ------------------------------------------------------------------------ devices


@pytest.mark.parametrize(
    ("local_rank", "gpus", "requested", "expected"),
    [
        (0, 0, None, ("gloo", "cpu")),
        (3, 0, None, ("gloo", "cpu")),
        (0, 4, None, ("nccl", "cuda:0")),
        (3, 4, None, ("nccl", "cuda:3")),
        (7, 8, None, ("nccl", "cuda:7")),
        (5, 1, None, ("nccl", "cuda:0")),  # CUDA_VISIBLE_DEVICES shows this task's one GPU
        (2, 4, "gloo", ("gloo", "cpu")),
        (2, 4, "nccl", ("nccl", "cuda:2")),
    ],
)
def test_select_device(
    local_rank: int, gpus: int, requested: str | None, expected: tuple[str, str]
) -> None:
    assert select_device(local_rank, gpus, requested) == expected


@pytest.mark.parametrize(
    ("local_rank", "gpus", "requested", "words"),
    [
        (4, 4, None, ("local rank 4", "4 are visible")),
        (0, 0, "nccl", ("nccl", "none")),
        (0, 1, "mpi", ("'mpi'",)),
    ],
)
def test_select_device_rejects(
    local_rank: int, gpus: int, requested: str | None, words: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as info:
        select_device(local_rank, gpus, requested)
    for word in words:
        assert word in str(info.value)


# ----------------------------------------------------------- the module stays light


def test_importing_distributed_does_not_import_torch() -> None:
    # What the import costs is measured by bench/bench_cli.py; here only what it pulls in.
    code = "import sys; import hpcdist.distributed; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


# ------------------------------------------------------- setup_distributed, in process

_EXPORTED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def clean_process_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Remove launcher variables for the test and restore them (and torch's threads, and
    the CPUs this process may use: a rank's set-up binds it to its own) after."""
    import torch

    for name in list(os.environ):
        if name.startswith(("SLURM_", "SUBMITIT_")) or name in _EXPORTED:
            monkeypatch.delenv(name)
    for name in _EXPORTED:  # setdefault by the code under test must be undone too
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    cpus = os.sched_getaffinity(0)
    yield
    cleanup_distributed()
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, cpus)


def test_setup_single_process_initialises_a_group_and_cleans_up(
    clean_process_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    import torch.distributed as dist

    with distributed(timeout_s=30, environ={"OMP_NUM_THREADS": "2"}) as ctx:
        assert dist.is_initialized()
        assert (ctx.backend, str(ctx.device), ctx.is_main) == ("gloo", "cpu", True)
        assert ctx.env.world_size == 1
        assert 0 < ctx.env.master_port < 65536  # a free port was picked
        assert os.environ["MASTER_PORT"] == str(ctx.env.master_port)
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")
        assert torch.get_num_threads() == 2
        value = torch.ones(1)
        dist.all_reduce(value)
        assert value.item() == 1.0
    assert not dist.is_initialized()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[Rank 0] host ")
    assert "device cpu, threads 2" in out[0]
    assert out[1] == "Distributed training initialized: gloo backend, 1 process"
    assert out[2] == f"Master: 127.0.0.1:{ctx.env.master_port}"


def test_setup_never_overwrites_what_a_launcher_exported(
    clean_process_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", str(port))
    with distributed(timeout_s=30) as ctx:
        assert (ctx.env.master_addr, ctx.env.master_port) == ("localhost", port)
        assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("localhost", str(port))


def test_setup_fails_within_timeout_naming_master_when_nobody_listens(
    clean_process_env: None,
) -> None:
    import torch.distributed as dist

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = torchrun(1, 2, 1, 2, 0, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    start = time.monotonic()
    with pytest.raises(DistributedInitError) as info:
        setup_distributed(timeout_s=2, environ=env)
    elapsed = time.monotonic() - start
    # The 2 s timeout, not the default (120 s): a bound between them, whatever the load.
    assert elapsed < 60, f"took {elapsed:.1f} s with a 2 s timeout"
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message
    assert "GLOO_SOCKET_IFNAME" in message and "NCCL_SOCKET_IFNAME" in message
    assert (info.value.master_addr, info.value.master_port) == ("127.0.0.1", port)
    assert not dist.is_initialized()


def test_setup_rejects_a_non_positive_timeout(clean_process_env: None) -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        setup_distributed(timeout_s=0, environ={})


def test_cleanup_is_safe_uninitialised_and_twice() -> None:
    cleanup_distributed()
    cleanup_distributed()


def test_distributed_context_cleans_up_after_an_exception(clean_process_env: None) -> None:
    import torch.distributed as dist

    with pytest.raises(RuntimeError, match="boom"), distributed(timeout_s=30, environ={}):
        raise RuntimeError("boom")
    assert not dist.is_initialized()


SECRET = "0000abcd" + "f" * 56  # port seed 0xabcd


@pytest.mark.parametrize(
    ("env", "port"),
    [
        (srun(1, 2, "node[1-2]", "1(x2)", job=77, step=3), derive_port(0xABCD, 3)),
        (
            {**srun(0, 1, "node1", "1", local=0, node=0), **submitit_local(0, 1)},
            derive_port(0xABCD, 0),
        ),
        (submitit_local(1, 2), derive_port(0xABCD, 0)),
    ],
    ids=["slurm-step-3", "slurm-and-local-agreeing", "submitit-local"],
)
def test_the_port_comes_from_the_secret_not_the_job_id(env: dict[str, str], port: int) -> None:
    assert DistEnv.from_environ(env, SECRET).master_port == port
    assert DistEnv.from_environ(env).master_port != port  # without it: the public job id


def test_a_secret_does_not_override_an_exported_port() -> None:
    env = srun(1, 2, "node[1-2]", "1(x2)", MASTER_PORT="23456")
    assert DistEnv.from_environ(env, SECRET).master_port == 23456
