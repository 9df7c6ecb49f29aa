"""`hpcdist run` inside an allocation: detection, defaults, and the script's own srun line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.cli.run import Allocation, allocation_from_environ, run_options, step_environ
from hpcdist.errors import UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        (
            {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_CPUS_PER_NODE": "1(x2)"},
            Allocation("5", 2, 1, in_step=False),
        ),  # salloc -N 2, as seen on the testbed
        (
            {"SLURM_JOBID": "6", "SLURM_NNODES": "3", "SLURM_JOB_CPUS_PER_NODE": "8,4(x2)"},
            Allocation("6", 3, 4, in_step=False),
        ),
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_JOB_NUM_NODES": "1",
                "SLURM_JOB_CPUS_PER_NODE": "2",
                "SLURM_STEP_ID": "0",
            },
            Allocation("7", 1, 2, in_step=True),
        ),  # srun --pty bash
        (
            {
                "SLURM_JOB_ID": "8",
                "SLURM_JOB_NUM_NODES": "1",
                "SLURM_JOB_CPUS_PER_NODE": "2",
                "SLURM_STEP_ID": "4294967290",
            },
            Allocation("8", 1, 2, in_step=False),
        ),  # interactive
    ],
    ids=["none", "salloc", "uneven-cpus", "in-step", "interactive-step"],
)
def test_allocation_from_environ(env: dict[str, str], expected: Allocation | None) -> None:
    assert allocation_from_environ(env) == expected


def test_bad_node_count_quotes_it() -> None:
    with pytest.raises(UserError, match="SLURM_JOB_NUM_NODES 'x'"):
        allocation_from_environ({"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "x"})


def test_defaults_come_from_the_allocation_and_flags_win() -> None:
    alloc = Allocation("5", 4, 8, in_step=False)
    assert run_options({"nodes": None, "tasks_per_node": 2}, alloc) == {
        "nodes": 4,
        "tasks_per_node": 2,
        "cpus_per_task": 4,
        "requeue": False,
    }
    assert run_options({"nodes": 2, "cpus_per_task": 1, "requeue": True}, alloc) == {
        "nodes": 2,
        "cpus_per_task": 1,
        "requeue": True,
    }
    assert "cpus_per_task" not in run_options({"mode": "nccl"}, alloc)  # counted at run time


def test_step_environment_drops_task_counts_and_overlaps_inside_a_step() -> None:
    env = {"SLURM_NTASKS": "1", "SLURM_NPROCS": "1", "SLURM_JOB_ID": "5", "PATH": "/bin"}
    assert step_environ(env, Allocation("5", 1, 1, in_step=True)) == {
        "SLURM_JOB_ID": "5",
        "PATH": "/bin",
        "SLURM_OVERLAP": "1",
    }
    assert "SLURM_OVERLAP" not in step_environ(env, Allocation("5", 1, 1, in_step=False))


def _hpcdist(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_"))}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_outside_an_allocation_is_one_line_and_exit_2() -> None:
    proc = _hpcdist(["run", "--mode", "test"], _clean_env())
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "not inside a SLURM allocation (SLURM_JOB_ID is unset)" in proc.stderr


def test_runs_the_rendered_srun_line(tmp_path: Path) -> None:
    # A stand-in srun prints what it was asked: the flags of the batch script's srun line.
    fake = tmp_path / "srun"
    fake.write_text(
        '#!/bin/bash\necho "srun $*"\necho "OMP=$OMP_NUM_THREADS NTASKS=${SLURM_NTASKS:-unset}"\n'
    )
    fake.chmod(0o755)
    env = _clean_env()
    env.update(
        PATH=f"{tmp_path}:{env['PATH']}",
        SLURM_JOB_ID="5",
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_CPUS_PER_NODE="1(x2)",
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_NTASKS="2",
        SLURM_CPUS_PER_TASK="1",
    )
    proc = _hpcdist(["run", "--mode", "test", "--profile", "local"], env)
    assert proc.returncode == 0, proc.stderr
    assert (
        "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --label "
        "python3 -m hpcdist.distributed.rankenv -- "
        "python3 -m hpcdist.distributed.commcheck --timeout 60"
    ) in proc.stdout
    assert "OMP=1 NTASKS=unset" in proc.stdout
    assert "hpcdist: job 5 on node[1-2], restart 0" in proc.stdout
    assert "running the test step in allocation 5 (2 nodes x 1 tasks)" in proc.stderr


def test_more_nodes_than_the_allocation_is_refused() -> None:
    env = _clean_env()
    env.update(SLURM_JOB_ID="5", SLURM_JOB_NUM_NODES="1", SLURM_JOB_CPUS_PER_NODE="2")
    proc = _hpcdist(["run", "--mode", "test", "--profile", "local", "--nodes", "2"], env)
    assert proc.returncode == 2
    assert "--nodes 2 exceeds allocation 5 of 1 nodes" in proc.stderr


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--sweep", "training.lr=1e-3,3e-3"], "--sweep"),
        (["--after", "12"], "--after"),
        (["--array", "0-3"], "--array"),
    ],
)
def test_a_sweep_or_a_dependency_is_refused_inside_an_allocation(
    args: list[str], flag: str
) -> None:
    env = _clean_env()
    env.update(SLURM_JOB_ID="5", SLURM_JOB_NUM_NODES="2", SLURM_JOB_CPUS_PER_NODE="2(x2)")
    proc = _hpcdist(["run", "--profile", "local", *args], env)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"hpcdist: error: {flag} needs a job of its own (a job array, a dependency); expected "
        "`hpcdist submit` or `hpcdist render`, or --set for one point here\n"
    )
