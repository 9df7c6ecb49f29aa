"""Each CPU rank on cores of its own, where nobody else has placed it.

``torchrun --nproc-per-node 4`` starts four ranks that may each run anywhere on the host:
4 x 16 threads on 64 cores then migrate and share cores, and every step waits for the
slowest rank (on a 64-core host the 4-rank job was slower than the 1-rank one). srun
binds tasks when asked (``--cpu-bind=cores``); where it was not asked, or under torchrun,
the ranks of one host see the same CPU set, and each rank takes its own block of it.

The set is handed out by physical core: where it has at least one core per thread of
every local rank, each rank gets one hardware thread of each of ``T`` cores (a hyperthread
sibling would share its core's arithmetic units with a thread of its own rank); where it
has fewer, each rank gets an equal number of whole cores, siblings included, so no two
ranks share a core (and only where even that leaves a rank short of ``T`` CPUs, plain
blocks of CPUs in core order). Nothing changes where SLURM reports a binding (``SLURM_CPU_BIND``,
set by srun for ``--cpu-bind``, the user's ``none`` included), where the set is too small
for every local rank's threads (srun or cgroups already gave each task its own), or for a
single local rank.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from hpcdist.facts.cpulayout import CPUS_VAR

CoreOf = Callable[[int], tuple[int, int]]


def rank_cpus(
    allowed: Sequence[int],
    local_rank: int,
    local_world: int,
    threads: int | None,
    core_of: CoreOf = lambda cpu: (0, cpu),
    share: int | None = None,
) -> tuple[int, ...] | None:
    """The CPUs local rank ``local_rank`` of ``local_world`` should keep, or None: leave
    the set as it is. ``core_of(cpu)``: the (package, core) the CPU belongs to. ``share``:
    the rank's CPU count where it is more than its compute threads (the CPU layout keeps some
    for the gradient exchange); None: ``threads``."""
    if threads is None or threads < 1 or local_world < 2:
        return None
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world - 1}")
    threads = max(threads, share or 0)
    need = local_world * threads
    cpus = sorted(set(allowed))
    if len(cpus) < need:
        return None  # already narrowed, or too few to give each rank its own
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu in cpus:
        cores.setdefault(core_of(cpu), []).append(cpu)
    by_core = [cores[key] for key in sorted(cores)]
    if len(by_core) >= need:  # one thread of each of T cores
        return tuple(siblings[0] for siblings in by_core[local_rank * threads :][:threads])
    per_rank = len(by_core) // local_world  # whole cores, as many for every rank
    shares = [
        [cpu for siblings in by_core[r * per_rank :][:per_rank] for cpu in siblings]
        for r in range(local_world)
    ]
    # Every rank the same way: one rank on whole cores beside another on plain CPU blocks
    # would overlap it.
    if min(len(share) for share in shares) >= threads:
        return tuple(shares[local_rank])
    order = [cpu for siblings in by_core for cpu in siblings]  # cores too uneven: CPUs
    return tuple(order[local_rank * threads : (local_rank + 1) * threads])


def bind_cpu_rank(
    local_rank: int,
    local_world: int,
    threads: int | None,
    environ: Mapping[str, str],
    share: int | None = None,
) -> tuple[int, ...] | None:
    """Narrow this process to its block (``rank_cpus``, ``share`` CPUs where given);
    returns the CPUs it now keeps, or None where it left the set alone."""
    if "SLURM_CPU_BIND" in environ or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    cpus = rank_cpus(allowed, local_rank, local_world, threads, _core_of_cpu, share)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    return cpus


def cpus_per_rank(environ: Mapping[str, str]) -> int | None:
    """The rank's CPU share that the job's CPU layout states (``HPCDIST_CPUS_PER_TASK``),
    or None; a value that is not a positive integer counts as unset."""
    text = environ.get(CPUS_VAR, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _core_of_cpu(cpu: int, root: Path = Path("/sys/devices/system/cpu")) -> tuple[int, int]:
    """(package, core) from sysfs; a CPU without topology files counts as a core alone."""
    topology = root / f"cpu{cpu}" / "topology"
    try:
        package = int((topology / "physical_package_id").read_text())
        core = int((topology / "core_id").read_text())
    except (OSError, ValueError):
        return (-1, cpu)
    return (package, core)


def describe(cpus: Sequence[int]) -> str:
    """``0-15`` or ``0,2,4`` style, for the rank's start-up line."""
    runs = []
    # Consecutive CPUs share cpu - position: each such group is one run.
    for _, group in itertools.groupby(enumerate(sorted(cpus)), lambda pair: pair[1] - pair[0]):
        run = [cpu for _, cpu in group]
        runs.append(f"{run[0]}" if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(runs)
