"""The distributed contract: environment -> DistEnv -> process group.

Everything up to ``DistEnv.from_environ`` is a pure function of strings, so the CLI can
import this module (and ``hpcdist env --simulate`` can run) without torch. torch is
imported only inside the functions that start or stop a process group.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from itertools import product
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

Source = Literal["torchrun", "slurm", "submitit-local", "single"]

# SLURM refuses a single range of more than 64Ki hosts; a whole list of more than 1Mi
# hosts is not an allocation but a typo, and expanding it would only eat memory.
_MAX_RANGE = 1 << 16
_MAX_HOSTS = 1 << 20
# Below the Linux ephemeral range (32768+), so an outgoing connection never holds it.
PORT_LOW, PORT_HIGH = 20000, 32767
_SEPARATORS = re.compile(r"[,\s]+")
_LAYOUT_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")

_IFNAME_HINT = (
    "on nodes with several networks set GLOO_SOCKET_IFNAME (gloo) or NCCL_SOCKET_IFNAME "
    "(nccl) to the interface that reaches the master, e.g. ib0 or eth0"
)


class NodeListError(ValueError):
    """A SLURM node list that SLURM itself would not expand."""


class DistEnvError(ValueError):
    """Environment variables that are missing, malformed or contradict each other."""


class DistributedInitError(RuntimeError):
    """The process group could not be formed; the message names master address and port."""

    def __init__(self, message: str, master_addr: str, master_port: int) -> None:
        super().__init__(message)
        self.master_addr = master_addr
        self.master_port = master_port


# --------------------------------------------------------------------------- node lists


def expand_nodelist(nodelist: str, what: str = "node list") -> list[str]:
    """Expand a SLURM host list (``gpu-[01-03,07],cpu[1-2]``) in SLURM's own order.

    ``what`` names the list in error messages (e.g. the variable it came from).
    """
    hosts: list[str] = []
    for token in _split_top_level(nodelist, what):
        if "[" not in token:
            hosts.append(token)
            continue
        hosts.extend(_expand_token(token, nodelist, what))
        if len(hosts) > _MAX_HOSTS:
            raise NodeListError(f"{what} {nodelist!r} expands to more than {_MAX_HOSTS} hosts")
    if not hosts:
        raise NodeListError(f"{what} {nodelist!r} is empty; expected e.g. 'node[01-04]'")
    return hosts


def _split_top_level(nodelist: str, what: str) -> list[str]:
    """Split at commas (and, like SLURM, whitespace) outside brackets."""
    if any(space in nodelist for space in " \t\n\r"):
        depth = 0
        for char in nodelist:  # rare path: SLURM itself never writes whitespace
            depth += (char == "[") - (char == "]")
            if depth > 0 and char.isspace():
                raise NodeListError(f"whitespace inside brackets in {what} {nodelist!r}")
        pieces = _SEPARATORS.split(nodelist)
    else:
        pieces = nodelist.split(",")  # str.split: a 10,000-host list must take milliseconds
    tokens: list[str] = []
    open_token: list[str] = []
    depth = 0
    for piece in pieces:
        if not open_token and "[" not in piece and "]" not in piece:
            if piece:
                tokens.append(piece)
            continue
        open_token.append(piece)
        depth += piece.count("[") - piece.count("]")
        if depth < 0:
            raise NodeListError(f"unbalanced ']' in {what} {nodelist!r}")
        if depth == 0:
            tokens.append(",".join(open_token))
            open_token = []
    if open_token:
        raise NodeListError(f"unbalanced '[' in {what} {nodelist!r}")
    return tokens


def _expand_token(token: str, nodelist: str, what: str) -> list[str]:
    prefix, _, rest = token.partition("[")
    if "]" in prefix:
        raise NodeListError(f"unbalanced ']' in {what} {nodelist!r}")
    if "[" not in rest:  # one bracket group: by far the most common form
        inner, closed, tail = rest.partition("]")
        if not closed or "]" in tail:
            raise NodeListError(f"nested or unbalanced brackets in {what} {nodelist!r}")
        return [prefix + v + tail for v in _expand_ranges(inner, nodelist, what)]
    literals = [prefix]
    groups: list[list[str]] = []
    for piece in rest.split("["):
        inner, closed, literal = piece.partition("]")
        if not closed or "]" in literal:
            raise NodeListError(f"nested or unbalanced brackets in {what} {nodelist!r}")
        groups.append(_expand_ranges(inner, nodelist, what))
        literals.append(literal)
    count = 1
    for group in groups:
        count *= len(group)
    if count > _MAX_HOSTS:
        raise NodeListError(f"{what} {nodelist!r} expands to more than {_MAX_HOSTS} hosts")
    # SLURM's order (hostlist.c, checked against `scontrol show hostnames`): the last
    # bracket varies fastest, the others nest from the second-to-last (outermost) back
    # to the first. For two groups this is the plain product a1b1, a1b2, a2b1, a2b2.
    *outer, last = groups
    tail = literals[-1]
    hosts: list[str] = []
    for combo in product(*reversed(outer)):
        values = combo[::-1]
        head = literals[0] + "".join(v + lit for v, lit in zip(values, literals[1:-1], strict=True))
        hosts.extend([head + v + tail for v in last])
    return hosts


def _expand_ranges(inner: str, nodelist: str, what: str) -> list[str]:
    items = inner.split(",")
    digits = inner.replace(",", "").replace("-", "")
    if not (all(items) and digits.isdigit() and digits.isascii()):
        raise NodeListError(
            f"bad range {'[' + inner + ']'!r} in {what} {nodelist!r}; "
            "expected numbers N or LO-HI separated by commas"
        )
    if "-" not in inner:
        return items  # single numbers, each keeping its own padding
    values: list[str] = []
    for item in items:
        lo_s, dash, hi_s = item.partition("-")
        if not dash:
            values.append(lo_s)
            continue
        if not lo_s or not hi_s or "-" in hi_s:
            raise NodeListError(f"bad range {item!r} in {what} {nodelist!r}; expected LO-HI")
        lo, hi = int(lo_s), int(hi_s)
        if lo > hi:
            raise NodeListError(
                f"range {item!r} in {what} {nodelist!r} runs backwards; expected LO <= HI"
            )
        if hi - lo >= _MAX_RANGE:
            raise NodeListError(
                f"range {item!r} in {what} {nodelist!r} has more than {_MAX_RANGE} hosts"
            )
        width = len(lo_s)  # SLURM pads every number of a range to the width of its start
        if width == 1 or lo_s[0] != "0":
            values.extend(map(str, range(lo, hi + 1)))
        elif hi - lo < 8:  # short ranges dominate fragmented lists; skip the comprehension
            for n in range(lo, hi + 1):
                values.append(str(n).zfill(width))
        else:
            values.extend([str(n).zfill(width) for n in range(lo, hi + 1)])
    return values


@functools.lru_cache(maxsize=64)
def _hosts_cached(nodelist: str, what: str) -> tuple[str, ...]:
    # Simulating an allocation resolves the same list once per rank.
    return tuple(expand_nodelist(nodelist, what))


def expand_tasks_per_node(layout: str, what: str = "tasks-per-node") -> list[int]:
    """Expand SLURM's compressed tasks-per-node string: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in layout.split(","):
        match = _LAYOUT_ITEM.fullmatch(item.strip())
        if match is None:
            raise DistEnvError(f"bad {what} {layout!r}; expected e.g. '4' or '2(x3),1'")
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1 or len(counts) + repeat > _MAX_HOSTS:
            raise DistEnvError(f"bad repeat count in {what} {layout!r}")
        counts.extend([tasks] * repeat)
    if sum(counts) < 1:
        raise DistEnvError(f"{what} {layout!r} places no task at all")
    return counts


def derive_port(job_id: int, step_id: int) -> int:
    """A port in [PORT_LOW, PORT_HIGH] that differs between jobs and steps sharing a node.

    101 is coprime with the span, so two jobs whose ids differ by less than the span
    never collide at the same step id.
    """
    if job_id < 0 or step_id < 0:
        raise ValueError(f"job id and step id must be >= 0, got {job_id} and {step_id}")
    span = PORT_HIGH - PORT_LOW + 1
    return PORT_LOW + (job_id * 101 + step_id) % span


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
    def from_environ(cls, env: Mapping[str, str]) -> DistEnv:
        """Resolve the contract: torchrun > SLURM > submitit local executor > single."""
        if "RANK" in env:
            return _from_torchrun(env)
        if "SLURM_PROCID" in env:
            resolved = _from_slurm(env)
            if "SUBMITIT_LOCAL_GLOBALID" in env:
                _check_same_task(resolved, _from_submitit_local(env))
        elif "SUBMITIT_LOCAL_GLOBALID" in env:
            resolved = _from_submitit_local(env)
        else:
            resolved = _single(env)
        _check_torch_vars_agree(env, resolved)
        return resolved

    @property
    def is_main(self) -> bool:
        return self.rank == 0


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


def _from_slurm(env: Mapping[str, str]) -> DistEnv:
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
    hosts = _hosts_cached(env[nodes_var], nodes_var)
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
        port = derive_port(_int(env, _first_present(env, ("SLURM_JOB_ID",)), 0), step)
    return DistEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=layout[node_rank],
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR") or hosts[_place(layout, 0)[0]],
        master_port=port,
        num_threads=_threads(env, ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS")),
        source="slurm",
        hostname=env.get("SLURMD_NODENAME") or hosts[node_rank],
    )


def _from_submitit_local(env: Mapping[str, str]) -> DistEnv:
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
        port = derive_port(_int(env, _first_present(env, ("SUBMITIT_LOCAL_JOB_ID",)), 0), 0)
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
    """(node index, local rank) of ``rank`` under block distribution."""
    for node, tasks in enumerate(layout):
        if rank < tasks:
            return node, rank
        rank -= tasks
    raise DistEnvError(f"rank beyond the layout {list(layout)!r}")  # callers checked the sum


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


@dataclass(frozen=True)
class DistContext:
    env: DistEnv
    backend: str  # "gloo" | "nccl"
    device: torch.device
    is_main: bool


def select_device(
    local_rank: int, visible_gpus: int, backend: str | None = None
) -> tuple[str, str]:
    """(backend, device) for a task that sees ``visible_gpus`` GPUs. Pure, for tests."""
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "gloo" or (backend is None and visible_gpus == 0):
        return "gloo", "cpu"
    if visible_gpus == 0:
        raise ValueError("backend 'nccl' needs a GPU but this task sees none")
    if visible_gpus == 1:
        return "nccl", "cuda:0"  # SLURM bound one GPU per task (CUDA_VISIBLE_DEVICES)
    if local_rank >= visible_gpus:
        raise ValueError(
            f"local rank {local_rank} needs a GPU but only {visible_gpus} are visible; "
            "run at most one task per GPU"
        )
    return "nccl", f"cuda:{local_rank}"


def setup_distributed(
    timeout_s: float = 120.0,
    environ: Mapping[str, str] | None = None,
    *,
    backend: str | None = None,
) -> DistContext:
    """Join (or, alone, form) the process group; always initialises one, even for 1 rank."""
    import torch
    import torch.distributed as dist

    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; call cleanup_distributed()")
    source_env = os.environ if environ is None else environ
    env = DistEnv.from_environ(source_env)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, device_name = select_device(env.local_rank, gpus, backend)
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.num_threads is not None:
        torch.set_num_threads(env.num_threads)
    timeout = timedelta(seconds=timeout_s)
    deadline = time.monotonic() + timeout_s
    # torchrun's agent already serves a store at MASTER_ADDR:MASTER_PORT; every worker is
    # then a client, as in torch's own env:// rendezvous.
    agent_store = source_env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    serves = env.rank == 0 and not agent_store
    try:
        if not serves:
            _wait_for_master(env.master_addr, env.master_port, deadline)
        store = dist.TCPStore(
            # The server listens on every interface; rank 0's own client takes loopback, so
            # only the other ranks depend on MASTER_ADDR (and fail with it if it is wrong).
            "127.0.0.1" if serves else env.master_addr,
            env.master_port,
            env.world_size,
            is_master=serves,
            timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)),
            wait_for_workers=True,  # clients must check in too: rank 0 counts them
        )
        store.set_timeout(timeout)
        if env.master_port == 0:
            env = dataclasses.replace(env, master_port=store.port)
        _export_missing(env)
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("default_pg", store),  # as torch's env:// does
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
        )
    except Exception as exc:
        cleanup_distributed()
        message = _init_failure(env, backend, timeout_s, exc)
        raise DistributedInitError(message, env.master_addr, env.master_port) from exc
    print(
        f"[Rank {env.rank}] host {env.hostname}, local rank {env.local_rank}/"
        f"{env.local_world_size}, node {env.node_rank}, device {device}, "
        f"threads {torch.get_num_threads()}",
        flush=True,
    )
    if env.is_main:
        print(
            f"Distributed training initialized: {backend} backend, {env.world_size} "
            f"{'process' if env.world_size == 1 else 'processes'}\n"
            f"Master: {env.master_addr}:{env.master_port}",
            flush=True,
        )
    return DistContext(env=env, backend=backend, device=device, is_main=env.is_main)


def _wait_for_master(addr: str, port: int, deadline: float) -> None:
    """Poll until the master's port accepts a connection or the deadline passes.

    TCPStore's own client retries with a backoff that overshoots its timeout (a 10 s
    timeout against a closed port took 13-26 s with torch 2.13); this keeps the promise.
    """
    last: OSError | None = None
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((addr, port), timeout=min(remaining, 5.0)):
                return
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve master address {addr!r}: {exc}") from exc
        except OSError as exc:
            last = exc
        time.sleep(min(0.25, max(deadline - time.monotonic(), 0.0)))
    raise TimeoutError(f"nothing accepted a connection at {addr}:{port} ({last})")


def _export_missing(env: DistEnv) -> None:
    # Code below us (and torch's env:// users) may read these; never overwrite a launcher.
    for var, value in (
        ("MASTER_ADDR", env.master_addr),
        ("MASTER_PORT", str(env.master_port)),
        ("RANK", str(env.rank)),
        ("WORLD_SIZE", str(env.world_size)),
        ("LOCAL_RANK", str(env.local_rank)),
        ("LOCAL_WORLD_SIZE", str(env.local_world_size)),
    ):
        os.environ.setdefault(var, value)


def _init_failure(env: DistEnv, backend: str, timeout_s: float, exc: BaseException) -> str:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return (
        f"rank {env.rank}/{env.world_size} on {env.hostname} could not join the {backend} "
        f"process group at master {env.master_addr}:{env.master_port} within {timeout_s:g} s "
        f"({reason}). Check that {env.master_addr} is reachable from {env.hostname}, that port "
        f"{env.master_port} is free there and that all {env.world_size} ranks were started; "
        f"{_IFNAME_HINT}"
    )


def cleanup_distributed() -> None:
    """Destroy the process group if there is one; safe to call twice or uninitialised."""
    if "torch" not in sys.modules:
        return  # nothing can have been initialised without torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def distributed(
    timeout_s: float = 120.0,
    environ: Mapping[str, str] | None = None,
    *,
    backend: str | None = None,
) -> Iterator[DistContext]:
    """``with distributed() as ctx:`` -- the process group is destroyed however it ends."""
    try:
        yield setup_distributed(timeout_s, environ, backend=backend)
    finally:
        cleanup_distributed()
