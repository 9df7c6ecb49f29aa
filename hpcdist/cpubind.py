"""Each CPU rank on cores of its own, where nobody else has placed it.

``torchrun --nproc-per-node 4`` starts four ranks that may each run anywhere on the host:
4 x 16 threads on 64 cores then migrate and share cores, and every step waits for the
slowest rank (on a 64-core host the 4-rank job was slower than the 1-rank one). srun
binds tasks when asked (``--cpu-bind=cores``); where it was not asked, or under torchrun,
the ranks of one host see the same CPU set, and each rank takes its own slice of it:
local rank r gets the set's CPUs ``r*T .. r*T+T-1`` (T: its threads), as srun's block
binding would. Nothing changes where the set is already one rank's (srun bound it, or
cgroups gave each task its own), where SLURM reports a binding choice of its own
(``SLURM_CPU_BIND_TYPE``, e.g. the user's ``--cpu-bind=none``), where the set is too small
for every local rank's threads, or for a single local rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def rank_cpus(
    allowed: Sequence[int], local_rank: int, local_world: int, threads: int | None
) -> tuple[int, ...] | None:
    """The CPUs local rank ``local_rank`` of ``local_world`` should keep, or None: leave
    the set as it is."""
    if threads is None or threads < 1 or local_world < 2:
        return None
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} is outside 0..{local_world - 1}")
    cpus = sorted(set(allowed))
    if len(cpus) < local_world * threads:
        return None  # already narrowed, or too few to give each rank its own
    return tuple(cpus[local_rank * threads : (local_rank + 1) * threads])


def bind_cpu_rank(
    local_rank: int, local_world: int, threads: int | None, environ: Mapping[str, str]
) -> tuple[int, ...] | None:
    """Narrow this process to its slice (``rank_cpus``); returns the CPUs it now keeps,
    or None where it left the set alone."""
    if "SLURM_CPU_BIND_TYPE" in environ or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = rank_cpus(sorted(os.sched_getaffinity(0)), local_rank, local_world, threads)
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    return cpus


def describe(cpus: Sequence[int]) -> str:
    """``0-15`` or ``0,2,4`` style, for the rank's start-up line."""
    runs: list[str] = []
    start = prev = None
    for cpu in sorted(cpus):
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        runs.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(runs)
