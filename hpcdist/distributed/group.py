"""The distributed contract: environment -> DistEnv -> process group.

The pure parts live in ``hpcdist.slurm.nodelist`` and ``hpcdist.distributed.distenv`` and
are re-exported here, so callers import the whole contract from one place. torch is imported
only inside the functions that start or stop a process group: the CLI imports this module
freely.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import os
import socket
import struct
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hpcdist.distributed.cpubind import bind_cpu_rank, cpus_per_rank, describe

# Re-exported ("X as X"): hpcdist.distributed's public API (its __all__) is this module's.
from hpcdist.distributed.distenv import DistEnv
from hpcdist.distributed.distenv import DistEnvError as DistEnvError
from hpcdist.distributed.distenv import Source as Source
from hpcdist.distributed.distenv import expand_tasks_per_node as expand_tasks_per_node
from hpcdist.distributed.gpus import GPU_VARS, allocated_gpus
from hpcdist.distributed.hangs import (
    COLLECTIVE_TIMEOUT_ENV as COLLECTIVE_TIMEOUT_ENV,
)
from hpcdist.distributed.hangs import (
    collective_timeout_s,
    flight_recorder_files,
    network_hint,
)
from hpcdist.distributed.jobsecret import (
    RendezvousAuthError,
    authenticate,
    load_secret,
    store_prefix,
    stranger_note,
)
from hpcdist.distributed.netif import use_rank_network
from hpcdist.facts.protocol import PORT_HIGH as PORT_HIGH
from hpcdist.facts.protocol import PORT_LOW as PORT_LOW
from hpcdist.facts.protocol import SECRET_VAR
from hpcdist.facts.protocol import derive_port as derive_port
from hpcdist.slurm.nodelist import NodeListError as NodeListError
from hpcdist.slurm.nodelist import expand_nodelist

if TYPE_CHECKING:
    import torch


class DistributedInitError(RuntimeError):
    """The process group could not be formed; the message names master address and port."""

    def __init__(self, message: str, master_addr: str, master_port: int) -> None:
        super().__init__(message)
        self.master_addr = master_addr
        self.master_port = master_port


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


def task_device(
    env: Mapping[str, str], local_rank: int, visible_gpus: int, backend: str | None = None
) -> tuple[str, str]:
    """(backend, device) for this task: ``select_device`` over the GPUs allocated to it."""
    gpus = allocated_gpus(env, visible_gpus)
    if backend == "nccl" and gpus == 0 < visible_gpus:
        raise ValueError(
            f"backend 'nccl' needs a GPU but SLURM allocated this task none ({visible_gpus} "
            f"visible, none of {', '.join(GPU_VARS)} set); ask for GPUs with --gpus-per-node"
        )
    return select_device(local_rank, gpus, backend)


def _torch_gpus(backend: str | None, environ: Mapping[str, str]) -> int:
    """The GPUs torch sees (CUDA_VISIBLE_DEVICES honoured): ``visible`` for count_gpus.

    Not asked where the answer changes nothing: a gloo group's ranks compute on the CPU
    whatever the host has, and an empty CUDA_VISIBLE_DEVICES hides every GPU. Asking starts
    the CUDA driver in every rank (1 s in one process on a 4-GPU host): 256 CPU ranks there
    took 40 s to their first all-reduce, against 3 s for torch's own rendezvous."""
    if backend == "gloo" or environ.get("CUDA_VISIBLE_DEVICES") == "":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def process_group_options(init: Any, backend: str, device: torch.device) -> dict[str, Any]:
    """Extra init_process_group arguments: ``device_id`` binds NCCL to the rank's GPU.

    With it the communicator is set up eagerly and barrier() knows its device; torch < 2.3
    has no such parameter, so it is passed only where the signature takes it.
    """
    if backend != "nccl":
        return {}
    try:
        takes_device = "device_id" in inspect.signature(init).parameters
    except (TypeError, ValueError):  # a builtin without a signature: pass nothing new
        takes_device = False
    return {"device_id": device} if takes_device else {}


def setup_distributed(
    timeout_s: float | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    backend: str | None = None,
) -> DistContext:
    """Join (or, alone, form) the process group; always initialises one, even for 1 rank.

    ``timeout_s`` bounds the join and every collective of the group (a hung peer fails the
    job instead of holding it to its time limit); None: the job's --collective-timeout,
    else 120 s."""
    import torch
    import torch.distributed as dist

    source_env = os.environ if environ is None else environ
    if timeout_s is None:
        timeout_s = collective_timeout_s(source_env)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; call cleanup_distributed()")
    secret = load_secret(source_env)
    env = DistEnv.from_environ(source_env, secret)
    backend, device_name = task_device(
        source_env, env.local_rank, _torch_gpus(backend, source_env), backend
    )
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "nccl":
        _prepare_flight_recorder(source_env)
    bound = None
    if device.type == "cpu":  # before the threads exist: they inherit the rank's CPUs
        bound = bind_cpu_rank(
            env.local_rank,
            env.local_world_size,
            env.num_threads,
            source_env,
            cpus_per_rank(source_env),
        )
    if env.num_threads is not None:
        torch.set_num_threads(env.num_threads)
    # gloo and NCCL read their interface when the group is made: on the route to rank 0.
    network = use_rank_network(env.master_addr, source_env)
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
            # Keys only the job's ranks can name: a stranger at the port is never a rank.
            store=dist.PrefixStore(store_prefix(secret), store),
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            **process_group_options(dist.init_process_group, backend, device),
        )
    except Exception as exc:
        cleanup_distributed()
        message = _init_failure(env, backend, timeout_s, exc, source_env)
        raise DistributedInitError(message, env.master_addr, env.master_port) from exc
    _authenticate(env, secret, serves, device, source_env)
    print(
        f"[Rank {env.rank}] host {env.hostname}, local rank {env.local_rank}/"
        f"{env.local_world_size}, node {env.node_rank}, device {device}, "
        f"threads {torch.get_num_threads()}"
        + (f", CPUs {describe(bound)}" if bound is not None else "")
        + f", {network.describe()}",
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


def single_process(
    environ: Mapping[str, str] | None = None, *, backend: str | None = None
) -> DistContext:
    """The context of a job of one process, without a process group: its device and
    threads as ``setup_distributed`` would choose them, none of its start-up (a store,
    NCCL communicators, a rendezvous). Code run with it must not call collectives (check
    ``torch.distributed.is_initialized()``)."""
    import torch

    source_env = os.environ if environ is None else environ
    env = DistEnv.from_environ(source_env)
    if env.world_size != 1:
        raise ValueError(f"single_process is for a world of 1, got {env.world_size} ranks")
    backend, device_name = task_device(
        source_env, env.local_rank, _torch_gpus(backend, source_env), backend
    )
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.num_threads is not None:
        torch.set_num_threads(env.num_threads)
    print(
        f"[Rank 0] host {env.hostname}, device {device}, threads {torch.get_num_threads()}\n"
        "Single process: no process group",
        flush=True,
    )
    return DistContext(env=env, backend=backend, device=device, is_main=True)


def _authenticate(
    env: DistEnv, secret: str | None, serves: bool, device: torch.device, source: Mapping[str, str]
) -> None:
    """Before anything else crosses the group: the store's connections come from the job's
    nodes and every rank proves that it holds the job's secret (hpcdist.distributed.jobsecret)."""
    if secret is None:
        if env.is_main and env.world_size > 1 and "SLURM_JOB_ID" in source:
            print(
                f"Warning: no job secret ({SECRET_VAR} unset): this rendezvous is not "
                "authenticated; jobs started by hpcdist submit or a rendered script are",
                flush=True,
            )
        return
    try:
        nodes_var = next((v for v in _NODELIST_VARS if source.get(v, "").strip()), None)
        if serves and nodes_var is not None:
            note = stranger_note(env.master_port, expand_nodelist(source[nodes_var]))
            if note:
                print(note, flush=True)
        job_id = next((source[v] for v in _JOB_ID_VARS if source.get(v, "").strip()), "")
        authenticate(secret, job_id, env.rank, env.world_size, device)
    except Exception as exc:
        cleanup_distributed()
        where = f"rank {env.rank}/{env.world_size} on {env.hostname}"
        if isinstance(exc, RendezvousAuthError):
            message = f"{where}: {exc} (rendezvous {env.master_addr}:{env.master_port})"
        else:  # the stranger broke the collective itself
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            message = (
                f"{where}: the secret check of the rendezvous at {env.master_addr}:"
                f"{env.master_port} failed ({reason}); a process outside the job may have "
                "joined; stopped before any weights or gradients were exchanged"
            )
        raise DistributedInitError(message, env.master_addr, env.master_port) from exc


_NODELIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
_JOB_ID_VARS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


def resolve_env(environ: Mapping[str, str]) -> DistEnv:
    """``DistEnv.from_environ`` with the job's secret (the port is derived from it)."""
    return DistEnv.from_environ(environ, load_secret(environ))


_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
# Between probes of the master's port: 5 ms at first (rank 0 listens within milliseconds of
# a job's start: a fixed 0.25 s cost every other rank 0.25 s at every start), doubling to
# 0.25 s (a master that is late, or restarting, is not hammered).
_FIRST_PROBE_PAUSE_S = 0.005
_LAST_PROBE_PAUSE_S = 0.25


def _wait_for_master(addr: str, port: int, deadline: float) -> None:
    """Poll until the master's port accepts a connection or the deadline passes.

    TCPStore's own client retries with a backoff that overshoots its timeout (a 10 s
    timeout against a closed port took 13-26 s with torch 2.13); this keeps the promise.

    The probe is reset (SO_LINGER 0), not closed: closed the ordinary way, the probes held
    torch's store about 5 s before it served the ranks' own connections (24 ranks on 2
    CPUs: 5.2-5.6 s to the first all-reduce in most runs, 0.4-0.6 s with the reset, torch's
    plain rendezvous 0.5-0.6 s).
    """
    last: OSError | None = None
    pause = _FIRST_PROBE_PAUSE_S
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((addr, port), timeout=min(remaining, 5.0)) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                return
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve master address {addr!r}: {exc}") from exc
        except OSError as exc:
            last = exc
        time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
        pause = min(2 * pause, _LAST_PROBE_PAUSE_S)
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


def _prepare_flight_recorder(env: Mapping[str, str]) -> None:
    # ProcessGroupNCCL reads these when it is created: set them before init_process_group.
    files = flight_recorder_files(env)
    for var, value in files.items():
        os.environ.setdefault(var, value)
    if files:
        os.makedirs(os.path.dirname(next(iter(files.values()))), exist_ok=True)


def _init_failure(
    env: DistEnv, backend: str, timeout_s: float, exc: BaseException, source_env: Mapping[str, str]
) -> str:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return (
        f"rank {env.rank}/{env.world_size} on {env.hostname} could not join the {backend} "
        f"process group at master {env.master_addr}:{env.master_port} within {timeout_s:g} s "
        f"({reason}). Check that {env.master_addr} is reachable from {env.hostname}, that port "
        f"{env.master_port} is free there and that all {env.world_size} ranks were started; "
        f"{network_hint(source_env)}"
    )


def cleanup_distributed(after_error: bool = False) -> None:
    """Destroy the process group if there is one; safe to call twice or uninitialised.

    ``after_error``: this rank is leaving on an exception while others may be waiting in a
    collective for it. NCCL's graceful destroy can then wait for them (a rank that failed
    before a barrier sat there until the collective timeout instead of exiting, and the
    launcher, which ends the others when one exits, never got to); its communicators are
    aborted instead, so the rank exits at once with its own error."""
    if "torch" not in sys.modules:
        return  # nothing can have been initialised without torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if after_error and dist.get_backend() == "nccl":
        from torch.distributed import distributed_c10d

        abort = getattr(distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            try:  # a private torch function: whatever it raises must not hide the error
                abort()
                return
            except Exception:
                pass
    # DDP reducers (and their pending work) left in reference cycles go while their
    # process group still exists, not at interpreter teardown, where gloo's threads
    # were seen to abort a finished rank ("terminate called without an active
    # exception").
    gc.collect()
    dist.destroy_process_group()


@contextmanager
def distributed(
    timeout_s: float | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    backend: str | None = None,
) -> Iterator[DistContext]:
    """``with distributed() as ctx:`` -- the process group is destroyed however it ends."""
    try:
        yield setup_distributed(timeout_s, environ, backend=backend)
    finally:
        cleanup_distributed()
