"""DistEnv: who this process is in a distributed job, from environment variables alone.

``DistEnv.from_environ`` is a pure function of a mapping of strings, so a table of
environments tests it without processes, and ``hpcdist env --simulate`` needs no torch.
"""

from __future__ import annotations

import re
import socket
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from hpcdist.facts.protocol import derive_port, port_seed
from hpcdist.slurm.nodelist import MAX_HOSTS, hosts_cached

Source = Literal["torchrun", "slurm", "submitit-local", "single"]

_LAYOUT_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


class DistEnvError(ValueError):
    """Environment variables that are missing, malformed or contradict each other."""


def expand_tasks_per_node(layout: str, what: str = "tasks-per-node") -> list[int]:
    """Expand SLURM's compressed tasks-per-node string: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in layout.split(","):
        match = _LAYOUT_ITEM.fullmatch(item.strip())
        if match is None:
            raise DistEnvError(f"bad {what} {layout!r}; expected e.g. '4' or '2(x3),1'")
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise DistEnvError(f"bad repeat count in {what} {layout!r}")
        counts.extend([tasks] * repeat)
    if sum(counts) < 1:
        raise DistEnvError(f"{what} {layout!r} places no task at all")
    return counts


# ------------------------------------------------------------------------------ DistEnv


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job: resolved from environment variables only."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int  # 0: a free port is chosen when the (single-process) group starts
    num_threads: int | None
    source: Source
    hostname: str

    @classmethod
    def from_environ(cls, env: Mapping[str, str], secret: str | None = None) -> DistEnv:
        """Resolve the contract: torchrun > SLURM > submitit local executor > single.

        ``secret``: the job's secret (hpcdist.distributed.jobsecret); the port is derived from it
        where no MASTER_PORT is given, else (a job hpcdist did not start) from the job id."""
        if "RANK" in env:
            own = _exported_by_hpcdist(env, secret)
            return own if own is not None else _from_torchrun(env)
        return _from_launcher(env, secret)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torch_variables(env: DistEnv) -> dict[str, str]:
    """torch's ``env://`` variables for ``env``'s rank, as torchrun sets them for a worker
    (and Lightning's ``NODE_RANK``): what ``hpcdist.distributed.rankenv`` exports."""
    return {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "GROUP_RANK": str(env.node_rank),
        "NODE_RANK": str(env.node_rank),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
    }


# Set by hpcdist.distributed.rankenv beside the torch variables it exported: the launcher
# they were computed from (slurm, submitit-local).
RANK_ENV_VAR = "HPCDIST_RANK_ENV"


def _exported_by_hpcdist(env: Mapping[str, str], secret: str | None) -> DistEnv | None:
    """The launcher's own view where the torch variables are the ones hpcdist derived from
    it (so the source stays srun's); None where a launcher started since (torchrun inside
    the rank) set others, or where nothing says hpcdist exported them."""
    if not env.get(RANK_ENV_VAR):
        return None
    try:
        resolved = _from_launcher(env, secret)
    except DistEnvError:
        return None
    exported = torch_variables(resolved)
    if any(env.get(var, "").strip() != value for var, value in exported.items()):
        return None
    return resolved


def _from_launcher(env: Mapping[str, str], secret: str | None) -> DistEnv:
    """SLURM > submitit's local executor > single, with torch variables that agree."""
    if "SLURM_PROCID" in env:
        resolved = _from_slurm(env, secret)
        if "SUBMITIT_LOCAL_GLOBALID" in env:
            _check_same_task(resolved, _from_submitit_local(env, secret))
    elif "SUBMITIT_LOCAL_GLOBALID" in env:
        resolved = _from_submitit_local(env, secret)
    else:
        resolved = _single(env)
    _check_torch_vars_agree(env, resolved)
    return resolved


def _from_torchrun(env: Mapping[str, str]) -> DistEnv:
    rank = _int(env, "RANK", 0)
    world = _int(env, "WORLD_SIZE", 1)
    _check_below(rank, "RANK", world, "WORLD_SIZE")
    single = world == 1
    # torchrun always sets both; a hand-made env:// setup may omit them for one process
    local_rank = _int(env, "LOCAL_RANK", 0, default=0 if single else None)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1, default=1 if single else None)
    _check_below(local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
    node_rank = _int(env, "GROUP_RANK", 0, default=rank // local_world)
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=_str(env, "MASTER_ADDR"),
        master_port=_port(env),
        num_threads=_threads(env, ("OMP_NUM_THREADS",)),
        source="torchrun",
        hostname=env.get("SLURMD_NODENAME") or socket.gethostname(),
    )


def _from_slurm(env: Mapping[str, str], secret: str | None = None) -> DistEnv:
    rank = _int(env, "SLURM_PROCID", 0)
    world_var = _first_present(env, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"))
    world = _int(env, world_var, 1)
    _check_below(rank, "SLURM_PROCID", world, world_var)
    step_var = "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID"
    if world > 1 and step_var not in env:
        # The batch script itself has SLURM_PROCID=0 and the job's task count but no step:
        # started there, this process would wait for ranks that nothing starts.
        raise DistEnvError(
            f"SLURM_PROCID={rank} and {world_var}={world} but no SLURM_STEP_ID: this is the "
            "batch script, not a task of a job step; start the program with srun (or torchrun)"
        )
    nodes_var = _first_present(env, ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    hosts = hosts_cached(env[nodes_var], nodes_var)
    layout_var = _first_present(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    layout = expand_tasks_per_node(env[layout_var], layout_var)
    if len(layout) != len(hosts):
        raise DistEnvError(
            f"{layout_var}={env[layout_var]!r} describes {len(layout)} nodes but "
            f"{nodes_var}={env[nodes_var]!r} has {len(hosts)}; stale variables from another job?"
        )
    if sum(layout) != world:
        raise DistEnvError(
            f"{layout_var}={env[layout_var]!r} places {sum(layout)} tasks but "
            f"{world_var}={env[world_var]!r}; stale variables from another job?"
        )
    block_node, block_local = _place(layout, rank)
    # srun states the node and local rank; block placement only fills in what is missing
    # (and stays right for rank 0 under cyclic distribution too).
    node_rank = _int(env, "SLURM_NODEID", 0, default=block_node)
    _check_below(node_rank, "SLURM_NODEID", len(hosts), f"the {len(hosts)} nodes of {nodes_var}")
    local_rank = _int(env, "SLURM_LOCALID", 0, default=block_local)
    _check_below(local_rank, "SLURM_LOCALID", layout[node_rank], f"{layout_var} on that node")
    if "MASTER_PORT" in env:
        port = _port(env)
    else:
        step = _int(env, step_var, 0, default=0)
        job = _int(env, _first_present(env, ("SLURM_JOB_ID",)), 1)
        port = derive_port(job if secret is None else port_seed(secret), step)
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=layout[node_rank],
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR") or hosts[_place(layout, 0)[0]],
        master_port=port,
        # The script's CPU layout (OMP_NUM_THREADS) first: it may keep some of the task's
        # CPUs free for the gradient exchange (hpcdist.facts.cpulayout).
        num_threads=_threads(env, ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK")),
        source="slurm",
        hostname=env.get("SLURMD_NODENAME") or hosts[node_rank],
    )


def _from_submitit_local(env: Mapping[str, str], secret: str | None = None) -> DistEnv:
    # submitit 1.5.4 LocalExecutor: the controller sets NTASKS, NODEID=0, JOB_NUM_NODES=1;
    # each task gets LOCALID, GLOBALID and JOB_ID (the controller's pid). No SLURM_*.
    rank = _int(env, "SUBMITIT_LOCAL_GLOBALID", 0)
    world = _int(env, _first_present(env, ("SUBMITIT_LOCAL_NTASKS",)), 1)
    _check_below(rank, "SUBMITIT_LOCAL_GLOBALID", world, "SUBMITIT_LOCAL_NTASKS")
    nodes = _int(env, "SUBMITIT_LOCAL_JOB_NUM_NODES", 1, default=1)
    if world % nodes:
        raise DistEnvError(
            f"SUBMITIT_LOCAL_NTASKS={world} is not a multiple of "
            f"SUBMITIT_LOCAL_JOB_NUM_NODES={nodes}"
        )
    local_world = world // nodes
    local_rank = _int(env, "SUBMITIT_LOCAL_LOCALID", 0, default=rank)
    _check_below(local_rank, "SUBMITIT_LOCAL_LOCALID", local_world, "tasks per node")
    node_rank = _int(env, "SUBMITIT_LOCAL_NODEID", 0, default=0)
    if "MASTER_PORT" in env:
        port = _port(env)
    else:
        job = _int(env, _first_present(env, ("SUBMITIT_LOCAL_JOB_ID",)), 1)
        port = derive_port(job if secret is None else port_seed(secret), 0)
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=port,
        num_threads=_threads(env, ("OMP_NUM_THREADS",)),
        source="submitit-local",
        hostname=env.get("SLURMD_NODENAME") or socket.gethostname(),
    )


def _single(env: Mapping[str, str]) -> DistEnv:
    return DistEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_port(env) if "MASTER_PORT" in env else 0,
        num_threads=_threads(env, ("OMP_NUM_THREADS",)),
        source="single",
        hostname=env.get("SLURMD_NODENAME") or socket.gethostname(),
    )


def _check_same_task(slurm: DistEnv, local: DistEnv) -> None:
    # The LocalExecutor started inside an allocation, or srun started from a local task:
    # one set was inherited and nothing says which. Agreeing sets are harmless.
    if (slurm.rank, slurm.world_size) != (local.rank, local.world_size):
        raise DistEnvError(
            f"SLURM says rank {slurm.rank} of {slurm.world_size} (SLURM_PROCID) but submitit's "
            f"local executor says rank {local.rank} of {local.world_size} "
            "(SUBMITIT_LOCAL_GLOBALID); one set is inherited: unset SLURM_* inside a local "
            "executor (submitit.helpers.clean_env()) or SUBMITIT_LOCAL_* inside srun"
        )


def _check_torch_vars_agree(env: Mapping[str, str], resolved: DistEnv) -> None:
    # Without RANK these are leftovers or hand exports; setup_distributed keeps them, so
    # they must say the same as the launcher that actually started us.
    for var, value in (
        ("WORLD_SIZE", resolved.world_size),
        ("LOCAL_RANK", resolved.local_rank),
        ("LOCAL_WORLD_SIZE", resolved.local_world_size),
    ):
        if var in env and env[var].strip() != str(value):
            raise DistEnvError(
                f"{var}={env[var]!r} is set without RANK and contradicts the {resolved.source} "
                f"environment ({var.lower()} {value}); stale export? unset it"
            )


def _place(layout: Sequence[int], rank: int) -> tuple[int, int]:
    """(node index, local rank) of ``rank`` under block distribution; callers checked that
    the layout holds the rank."""
    ends = list(accumulate(layout))  # one past the last rank of each node
    node = bisect_right(ends, rank)
    return node, rank - (ends[node] - layout[node])


def _first_present(env: Mapping[str, str], names: Sequence[str]) -> str:
    for name in names:
        if env.get(name, "").strip():
            return name
    alternatives = " or ".join(names)
    raise DistEnvError(
        f"{alternatives} is not set although {_launcher_hint(env)} is; "
        "variables inherited from another job? start the program with srun or torchrun"
    )


def _launcher_hint(env: Mapping[str, str]) -> str:
    for var in ("RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID"):
        if var in env:
            return f"{var}={env[var]!r}"
    return "a launcher variable"


def _str(env: Mapping[str, str], var: str) -> str:
    value = env.get(var, "").strip()
    if not value:
        raise DistEnvError(f"{var} is not set although {_launcher_hint(env)} is")
    return value


def _int(env: Mapping[str, str], var: str, minimum: int, default: int | None = None) -> int:
    """``env[var]`` as an integer >= minimum; ``default`` (if given) when unset or empty."""
    if default is not None and not env.get(var, "").strip():
        return default
    raw = _str(env, var)
    try:
        value = int(raw)
    except ValueError:
        raise DistEnvError(f"{var} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise DistEnvError(f"{var} must be an integer >= {minimum}, got {raw!r}")
    return value


def _port(env: Mapping[str, str]) -> int:
    port = _int(env, "MASTER_PORT", 1)
    if port > 65535:
        raise DistEnvError(f"MASTER_PORT must be a TCP port 1..65535, got {env['MASTER_PORT']!r}")
    return port


def _threads(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    for name in names:
        if env.get(name, "").strip():
            return _int(env, name, 1)
    return None


def _check_below(value: int, var: str, limit: int, limit_name: str) -> None:
    if value >= limit:
        raise DistEnvError(
            f"{var}={value} is out of range: {limit_name} allows 0..{limit - 1}; "
            "stale variables from another job?"
        )


# --------------------------------------------------------------------- process groups
