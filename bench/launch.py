"""Start N local ranks the way torchrun would: one process each, env:// variables set.

Every rank runs ``python -m bench.worker JOB`` with MASTER_ADDR/PORT, RANK, WORLD_SIZE,
LOCAL_RANK and LOCAL_WORLD_SIZE in its environment, so hpcdist's own
``setup_distributed`` forms the group (one GPU per rank: cuda:LOCAL_RANK). NVLink
multicast stays off in every process (the GPU hosts are shared; a program that uses
multicast can take their GPUs out of service).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.netns import RankNet

REPO = Path(__file__).resolve().parents[1]
NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# A launcher's or scheduler's variables from the calling shell would make DistEnv pick
# another rank or world; the benchmark is the launcher here.
_DROP_PREFIXES = ("SLURM_", "SBATCH_", "SUBMITIT_", "TORCHELASTIC_")
_DROP = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
}


# One process group of a launch: its world size and each rank's CPU set (None: unbound).
Group = tuple[int, "list[set[int] | None]"]


class LaunchError(RuntimeError):
    """A rank failed or the ranks did not finish in time; the message holds their output,
    ``partial`` what rank 0 had written by then (None: nothing)."""

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial = partial


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def without_launcher(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less every launcher's and scheduler's variables: a process started with it
    is a fresh single process as far as DistEnv can tell."""
    return {k: v for k, v in env.items() if k not in _DROP and not k.startswith(_DROP_PREFIXES)}


def rank_env(
    base: Mapping[str, str],
    rank: int,
    world: int,
    port: int,
    threads: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    env = without_launcher(base)
    env.update(extra or {})
    path = env.get("PYTHONPATH")
    env.update(NO_MULTICAST)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        OMP_NUM_THREADS=str(threads),
        PYTHONPATH=f"{REPO}{os.pathsep}{path}" if path else str(REPO),
        PYTHONUNBUFFERED="1",
    )
    return env


def core_sets(world: int, threads: int) -> list[set[int]]:
    """Rank r's CPUs when binding: ``threads`` CPUs of its own, one per physical core as
    long as there are free cores (as ``srun --cpu-bind=cores`` gives each task its own
    cores), from the CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    if world * threads > len(cpus):
        raise LaunchError(f"cannot bind {world} ranks x {threads} CPUs to {len(cpus)} CPUs")
    first_threads: list[int] = []
    siblings: list[int] = []
    seen: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (
                (topo / "physical_package_id").read_text().strip(),
                (topo / "core_id").read_text().strip(),
            )
        except OSError:
            core = ("?", str(cpu))
        (siblings if core in seen else first_threads).append(cpu)
        seen.add(core)
    order = first_threads + siblings
    return [set(order[r * threads : (r + 1) * threads]) for r in range(world)]


def run_ranks(
    job: Mapping[str, Any],
    world: int,
    threads: int,
    timeout_s: float,
    log: Path | None = None,
    bind: bool = False,
    cpus_per_rank: int | None = None,
    env: Mapping[str, str] | None = None,
    nets: list[RankNet] | None = None,
) -> dict[str, Any]:
    """Run ``job`` on ``world`` ranks; return what rank 0 wrote (its result dict).
    ``bind``: each rank on ``cpus_per_rank`` (default ``threads``) cores of its own
    (``core_sets``); ``env``: more variables for every rank (a thread layout); ``nets``:
    each rank a host of its own (``bench.netns``), rank 0's address the master's."""
    cores: list[set[int] | None] = [None] * world
    if bind:
        cores = list(core_sets(world, cpus_per_rank or threads))
    results = _launch(job, [(world, cores)], threads, timeout_s, log, env, nets)
    return results[0]


def run_copies(
    job: Mapping[str, Any],
    copies: int,
    threads: int,
    timeout_s: float,
    log: Path | None = None,
    cpus_per_rank: int | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``copies`` independent single-rank runs of ``job`` started together, each bound to
    cores of its own as the ranks of ``run_ranks(..., bind=True)`` would be: what the
    ranks could reach if they exchanged nothing (shared memory bandwidth, caches and
    clocks still shared). Returns each copy's result."""
    cores = core_sets(copies, cpus_per_rank or threads)
    groups: list[Group] = [(1, [cpu_set]) for cpu_set in cores]
    return _launch(job, groups, threads, timeout_s, log, env)


def _launch(
    job: Mapping[str, Any],
    groups: list[Group],
    threads: int,
    timeout_s: float,
    log: Path | None,
    env: Mapping[str, str] | None,
    nets: list[RankNet] | None = None,
) -> list[dict[str, Any]]:
    """Start every group (a process group of ``world`` ranks, each with its CPU set or
    None) at once; each rank waits at a start line until every process of every group
    is up, so the copies run side by side. Returns each group's rank-0 result."""
    with tempfile.TemporaryDirectory(prefix="hpcdist-bench-") as tmp:
        folder = Path(tmp)
        total = sum(world for world, _ in groups)
        start_line = folder / "start"
        start_line.mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        outputs: list[Path] = []
        result_files: list[Path] = []
        for index, (world, cores) in enumerate(groups):
            job_file = folder / f"job{index}.json"
            result_file = folder / f"result{index}.json"
            result_files.append(result_file)
            job_file.write_text(
                json.dumps(
                    {
                        **job,
                        "result": str(result_file),
                        "start_line": {"folder": str(start_line), "count": total},
                    }
                )
            )
            port = free_port()
            for rank in range(world):
                output = folder / f"group{index}-rank{rank}.log"
                outputs.append(output)
                variables = rank_env(os.environ, rank, world, port, threads, env)
                if nets is not None:
                    variables.update(host_env(nets, rank))
                with output.open("wb") as out:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "bench.worker", str(job_file)],
                            env=variables,
                            cwd=REPO,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            preexec_fn=_prepare(cores[rank], nets[rank] if nets else None),
                        )
                    )
        deadline = time.monotonic() + timeout_s
        failed = ""
        for number, proc in enumerate(procs):
            try:
                code = proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                failed = f"ranks still running after {timeout_s:.0f} s"
                break
            if code != 0:
                failed = f"process {number} ({outputs[number].stem}) exited with {code}"
                break
        for proc in procs:  # a failed rank leaves the others waiting in a collective
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = "".join(f"--- {p.stem}\n{p.read_text(errors='replace')}" for p in outputs)
        if log is not None:
            with log.open("a") as handle:
                handle.write(f"=== {job.get('kind')} {job.get('label', '')}: {total} processes\n")
                handle.write(text)
        results = [json.loads(f.read_text()) if f.is_file() else None for f in result_files]
        if failed or any(r is None for r in results):
            tail = "\n".join(text.splitlines()[-40:])
            partial = results[0] if results else None
            raise LaunchError(
                f"{failed or 'a rank 0 wrote no result'}; last output:\n{tail}", partial
            )
        return [r for r in results if r is not None]


def host_env(nets: list[RankNet], rank: int) -> dict[str, str]:
    """The variables of rank ``rank`` as the only rank of its host ``nets[rank]``."""
    return {
        "MASTER_ADDR": nets[0].address,
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(rank),
        "GLOO_SOCKET_IFNAME": nets[rank].ifname,
    }


def _prepare(cpus: set[int] | None, net: RankNet | None) -> Callable[[], None] | None:
    """In the child, before it execs: its CPUs (its threads inherit the mask) and its
    network namespace."""
    if cpus is None and net is None:
        return None
    from bench.netns import enter

    move = enter(net) if net is not None else None

    def prepare() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        if move is not None:
            move()

    return prepare
