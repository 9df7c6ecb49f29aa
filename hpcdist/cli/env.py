"""``hpcdist env``: the distributed contract as this rank (or every rank of a layout) sees it.

Inside a job it prints what ``DistEnv.from_environ`` resolves for this process. With
``--simulate`` it builds the environment srun would give every task of an allocation and
feeds each through the same function, so the table is what the job will compute, without
SLURM and without torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import click

from hpcdist.distributed import (
    DistEnv,
    DistEnvError,
    NodeListError,
    expand_nodelist,
    expand_tasks_per_node,
    resolve_env,
    select_device,
)
from hpcdist.errors import UserError

_COLUMNS = ("rank", "local", "node", "master", "threads", "device")


@click.command("env")
@click.option("--simulate", is_flag=True, help="Show every rank of the allocation given below.")
@click.option("--nodelist", metavar="LIST", help="SLURM node list, e.g. 'gpu-[01-03,07]'.")
@click.option(
    "--tasks-per-node",
    metavar="N|LAYOUT",
    help="Tasks on every node (4), or SLURM's per-node layout ('2(x3),1'). Default 1.",
)
@click.option("--job-id", type=click.IntRange(min=0), help="SLURM job id (sets the port).")
@click.option("--step-id", type=click.IntRange(min=0), help="SLURM step id. Default 0.")
@click.option("--cpus-per-task", type=click.IntRange(min=1), help="Threads per rank.")
@click.option(
    "--gpus-per-node", type=click.IntRange(min=0), help="GPUs per node (0: CPU only). Default 0."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def env_command(
    simulate: bool,
    nodelist: str | None,
    tasks_per_node: str | None,
    job_id: int | None,
    step_id: int | None,
    cpus_per_task: int | None,
    gpus_per_node: int | None,
    as_json: bool,
) -> int:
    """Print rank, world size, master address and port as this process resolves them.

    With --simulate, print them for every rank of an allocation instead, e.g.
    hpcdist env --simulate --nodelist 'gpu-[01-03,07]' --tasks-per-node 4 --job-id 1234
    """
    allocation = {
        "--nodelist": nodelist,
        "--tasks-per-node": tasks_per_node,
        "--job-id": job_id,
        "--step-id": step_id,
        "--cpus-per-task": cpus_per_task,
        "--gpus-per-node": gpus_per_node,
    }
    if not simulate:
        given = [name for name, value in allocation.items() if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only meaningful with --simulate")
        _print_own(as_json)
        return 0
    if nodelist is None or job_id is None:
        raise click.UsageError("--simulate needs --nodelist and --job-id")
    rows = simulate_allocation(
        nodelist, tasks_per_node or "1", job_id, step_id or 0, cpus_per_task, gpus_per_node or 0
    )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _print_table(rows)
        click.echo(PORT_NOTE, err=True)
    return 0


# A job that hpcdist renders or submits makes a new secret for every run and derives its
# port from it, so no port can be shown before it runs; the job-id port is what a job
# without one (a script hpcdist did not write) uses.
PORT_NOTE = (
    "note: the port shown is a job's without an hpcdist secret (from the job id and step); "
    "a job hpcdist rendered or submitted derives it from its own secret when it starts"
)


def _print_own(as_json: bool) -> None:
    try:
        env = resolve_env(os.environ)
    except (DistEnvError, NodeListError, UserError) as exc:
        raise click.UsageError(
            f"cannot resolve this process's distributed environment: {exc}"
        ) from None
    fields = dataclasses.asdict(env)
    if as_json:
        click.echo(json.dumps(fields, indent=2))
        return
    width = max(len(key) for key in fields)
    for key, value in fields.items():
        if value is None:
            value = "-"
        elif key == "master_port" and value == 0:
            value = "0 (a free port is picked when the process group starts)"
        click.echo(f"{key + ':':<{width + 1}} {value}")


def simulate_allocation(
    nodelist: str,
    tasks_per_node: str,
    job_id: int,
    step_id: int,
    cpus_per_task: int | None,
    gpus_per_node: int,
) -> list[dict[str, Any]]:
    """One row per rank, each computed by DistEnv.from_environ from what srun would set."""
    hosts, layout, tasks_per_node = _allocation(nodelist, tasks_per_node, gpus_per_node)
    common = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_ID": str(step_id),
        "SLURM_STEP_NUM_TASKS": str(sum(layout)),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NTASKS": str(sum(layout)),
    }
    if cpus_per_task is not None:
        common["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)
    rows: list[dict[str, Any]] = []
    rank = 0
    for node, (host, tasks) in enumerate(zip(hosts, layout, strict=True)):
        for local in range(tasks):
            env = DistEnv.from_environ(
                {
                    **common,
                    "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(local),
                    "SLURM_NODEID": str(node),
                    "SLURMD_NODENAME": host,
                }
            )
            _, device = select_device(env.local_rank, gpus_per_node)
            rows.append({**dataclasses.asdict(env), "device": device})
            rank += 1
    return rows


def _allocation(
    nodelist: str, tasks_per_node: str, gpus_per_node: int
) -> tuple[list[str], list[int], str]:
    """The hosts, the tasks on each, and SLURM_STEP_TASKS_PER_NODE as srun writes it (one
    count for all nodes: ``N(xM)``); a flag that cannot describe an allocation is refused."""
    try:
        hosts = expand_nodelist(nodelist, "--nodelist")
    except NodeListError as exc:
        raise click.BadParameter(str(exc), param_hint="--nodelist") from None
    try:
        layout = expand_tasks_per_node(tasks_per_node, "--tasks-per-node")
    except DistEnvError as exc:
        raise click.BadParameter(str(exc), param_hint="--tasks-per-node") from None
    if len(layout) == 1:
        layout *= len(hosts)
        tasks_per_node = f"{layout[0]}(x{len(hosts)})"
    if len(layout) != len(hosts):
        raise click.BadParameter(
            f"{tasks_per_node!r} describes {len(layout)} nodes but {nodelist!r} has "
            f"{len(hosts)}; give one count for all nodes or one per node",
            param_hint="--tasks-per-node",
        )
    if min(layout) < 1:
        raise click.BadParameter(
            f"{tasks_per_node!r} leaves a node without tasks; srun starts >= 1 on each",
            param_hint="--tasks-per-node",
        )
    if 0 < gpus_per_node < max(layout):
        raise click.BadParameter(
            f"{gpus_per_node} GPUs per node cannot serve {max(layout)} tasks on a node "
            "(nccl needs one GPU per task); use --gpus-per-node 0 for CPU tasks",
            param_hint="--gpus-per-node",
        )
    return hosts, layout, tasks_per_node


def _print_table(rows: list[dict[str, Any]]) -> None:
    cells = [
        (
            str(row["rank"]),
            str(row["local_rank"]),
            row["hostname"],
            f"{row['master_addr']}:{row['master_port']}",
            "-" if row["num_threads"] is None else str(row["num_threads"]),
            row["device"],
        )
        for row in rows
    ]
    widths = [max(len(c) for c in column) for column in zip(_COLUMNS, *cells, strict=True)]
    for line in (_COLUMNS, *cells):
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
