"""``hpcdist run``: the job's step inside an allocation that exists already (``salloc``, an
interactive job), for debugging.

It runs the very script ``hpcdist render`` prints, with bash instead of sbatch: the
``#SBATCH`` lines are then comments, and the script's own srun line starts the same step,
with the same flags, contract and environment, in the allocation at hand.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from hpcdist.distributed.distenv import expand_tasks_per_node
from hpcdist.errors import UserError
from hpcdist.facts.cpulayout import cpus_per_task
from hpcdist.spec.options import job_options, spec_from_options

# Step ids SLURM gives its special steps (slurm.h): pending, batch, extern and the
# interactive step of `salloc` under LaunchParameters=use_interactive_step. A shell in
# one of them is not inside a step that holds the allocation's CPUs.
_FIRST_SPECIAL_STEP_ID = 0xFFFFFFF0
# Set by `salloc -n` / `srun -n` for the outer command; srun reads them as its -n, which
# would fight the script's explicit --nodes and --ntasks-per-node.
_TASK_COUNT_VARS = ("SLURM_NTASKS", "SLURM_NPROCS")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: int
    cpus_per_node: int  # the fewest CPUs the allocation has on any of its nodes
    in_step: bool  # a shell inside a job step (`srun --pty bash`), which holds its CPUs


def allocation_from_environ(env: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in, from SLURM's variables; None outside one."""
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    nodes_text = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    if not nodes_text.isdigit() or int(nodes_text) < 1:
        raise UserError(f"SLURM_JOB_NUM_NODES {nodes_text!r}; expected a node count >= 1")
    layout = env.get("SLURM_JOB_CPUS_PER_NODE") or env.get("SLURM_CPUS_ON_NODE") or "1"
    cpus = expand_tasks_per_node(layout, what="SLURM_JOB_CPUS_PER_NODE")
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or ""
    in_step = step.isdigit() and int(step) < _FIRST_SPECIAL_STEP_ID
    return Allocation(job_id, int(nodes_text), min(cpus), in_step)


def run_options(options: Mapping[str, Any], allocation: Allocation) -> dict[str, Any]:
    """The flags, with what was left out taken from the allocation: all of its nodes, its
    CPUs shared by the tasks of a node; never a requeue (of the whole allocation)."""
    out = dict(options)
    if out.get("nodes") is None:
        out["nodes"] = allocation.nodes
    mode = out.get("mode") or out.get("backend")
    if out.get("cpus_per_task") is None and mode != "nccl":
        tasks = out.get("tasks_per_node") or out.get("gpus_per_node") or 1
        out["cpus_per_task"] = cpus_per_task(allocation.cpus_per_node, int(tasks))
    if out.get("requeue") is None:
        out["requeue"] = False
    return out


def step_environ(env: Mapping[str, str], allocation: Allocation) -> dict[str, str]:
    """The environment the script runs in: this one, less what would mislead its srun."""
    out = {k: v for k, v in env.items() if k not in _TASK_COUNT_VARS}
    if allocation.in_step:
        # The interactive step holds the CPUs: the new step shares them (srun --overlap).
        out["SLURM_OVERLAP"] = "1"
    return out


@click.command()
@job_options
def run(**options: Any) -> int:
    """Start the job's step in the allocation you are in (salloc, an interactive job): the
    srun line of the script `hpcdist render` prints, with the same flags and environment."""
    allocation = allocation_from_environ(os.environ)
    if allocation is None:
        raise UserError(
            "not inside a SLURM allocation (SLURM_JOB_ID is unset); start one with "
            "`salloc -N 2` and run this inside it, or use `hpcdist submit`"
        )
    from hpcdist.render.script import render

    spec = spec_from_options(run_options(options, allocation))
    if spec.sweep or spec.after or spec.array:
        # An allocation runs one step now: a sweep or --array is a job array and --after a
        # wait in the queue, which only sbatch (submit, or the rendered script) can ask for.
        flag = "--sweep" if spec.sweep else "--array" if spec.array else "--after"
        raise UserError(
            f"{flag} needs a job of its own (a job array, a dependency); expected "
            "`hpcdist submit` or `hpcdist render`, or --set for one point here"
        )
    if spec.nodes > allocation.nodes:
        raise UserError(
            f"--nodes {spec.nodes} exceeds allocation {allocation.job_id} of "
            f"{allocation.nodes} nodes"
        )
    click.echo(
        f"hpcdist: running the {spec.mode} step in allocation {allocation.job_id} "
        f"({spec.nodes} nodes x {spec.srun_tasks_per_node or 'one per GPU'} tasks)",
        err=True,
    )
    proc = subprocess.run(
        ["bash", "-c", render(spec), "hpcdist-run"],
        env=step_environ(os.environ, allocation),
        check=False,
    )
    return proc.returncode
