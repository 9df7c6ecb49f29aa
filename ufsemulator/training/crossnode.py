"""Which gradient exchange CPU ranks on several hosts use, and the rule ``auto`` follows.

Three ways across hosts, all by the training thread itself or by gloo:

- ``direct`` (``meshreduce``): one round, every rank to every rank; N - 1 copies of the
  gradients out of each rank a step. Fewest rounds; its bytes grow with N.
- ``halving`` (``halvingreduce``): 2 log2 N rounds of one partner; about 2 copies out
  of each rank at any N.
- the backend's (gloo's ring, its own threads): for gradients too large for either.

``auto``'s rule (``choose``), measured on a 64-core host (docs/benchmarks.md, "Gradient
exchange across nodes"): the direct exchange for at most ``DIRECT_MAX_RANKS`` ranks and
at most ``AUTO_DIRECT_MAX_BYTES`` of gradients (8 ranks x 4 cores, the emulator's 37 KB:
direct 2.49 ms a training step, halving 2.91), recursive halving for more ranks or larger
gradients (16 x 2: halving 3.79 ms, direct 4.05; 32 x 1: 5.14 against 6.24; 8 ranks and
1 MiB alone: halving 1.18 ms an all-reduce, direct 3.46), both up to ``MAX_BYTES``;
beyond, the backend. The limit to the backend is not measured: halving was timed up to
1 MiB only.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcdist.distributed import DistContext
from ufsemulator.training.halvingreduce import HalvingAllReduce, halving_allreduce
from ufsemulator.training.meshreduce import MAX_BYTES as DIRECT_MAX_BYTES
from ufsemulator.training.meshreduce import MeshAllReduce, mesh_allreduce

DIRECT_MAX_RANKS = 8
AUTO_DIRECT_MAX_BYTES = 64 * 2**10
MAX_BYTES = 64 * 2**20  # beyond, gloo's threads move large buffers as fast and overlap

MAKERS: dict[str, Callable[[int, DistContext], HalvingAllReduce | MeshAllReduce]] = {
    "direct": mesh_allreduce,
    "halving": halving_allreduce,
}


def choose(mode: str, world: int, nbytes: int) -> tuple[str, str]:
    """The exchange (``direct``, ``halving`` or ``backend``) for ``mode`` (``auto``,
    ``direct``, ``halving``), ``world`` ranks and ``nbytes`` of gradients, and why not
    where it is the backend. Pure."""
    if mode not in ("auto", *MAKERS):
        raise ValueError(f"mode must be 'auto', 'direct' or 'halving', got {mode!r}")
    if world < 2:
        return "backend", "one rank"
    if mode == "auto":
        few = world <= DIRECT_MAX_RANKS and nbytes <= AUTO_DIRECT_MAX_BYTES
        mode = "direct" if few else "halving"
    limit = DIRECT_MAX_BYTES if mode == "direct" else MAX_BYTES
    if nbytes > limit:
        return "backend", (
            f"{nbytes / 2**20:.1f} MiB of gradients, more than the {limit // 2**20} MiB "
            f"where the {mode} exchange pays"
        )
    return mode, ""
