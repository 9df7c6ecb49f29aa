"""Which gradient exchange CPU ranks on several hosts use, and the rule ``auto`` follows.

Three ways across hosts, all by the training thread itself or by gloo:

- ``direct`` (``meshreduce``): one round, every rank to every rank; N - 1 copies of the
  gradients out of each rank a step. Fewest rounds; its bytes grow with N.
- ``halving`` (``halvingreduce``): 2 log2 N rounds of one partner; about 2 copies out
  of each rank at any N.
- the backend's (gloo's ring, its own threads): for gradients too large for either.

``auto``'s rule (``choose``), from the exchanges' own benchmark (docs/benchmarks.md,
"Gradient exchange across nodes"): the direct exchange up to ``DIRECT_MAX_RANKS`` ranks
(its one round beats the halving's rounds while N - 1 copies are few), recursive
halving above, both up to ``MAX_BYTES`` of gradients; beyond, the backend.
"""

from __future__ import annotations

from ufsemulator.training.halvingreduce import halving_allreduce
from ufsemulator.training.meshreduce import MAX_BYTES as DIRECT_MAX_BYTES
from ufsemulator.training.meshreduce import mesh_allreduce

DIRECT_MAX_RANKS = 8
MAX_BYTES = 64 * 2**20  # beyond, gloo's threads move large buffers as fast and overlap

MAKERS = {"direct": mesh_allreduce, "halving": halving_allreduce}


def choose(mode: str, world: int, nbytes: int) -> tuple[str, str]:
    """The exchange (``direct``, ``halving`` or ``backend``) for ``mode`` (``auto``,
    ``direct``, ``halving``), ``world`` ranks and ``nbytes`` of gradients, and why not
    where it is the backend. Pure."""
    if mode not in ("auto", *MAKERS):
        raise ValueError(f"mode must be 'auto', 'direct' or 'halving', got {mode!r}")
    if world < 2:
        return "backend", "one rank"
    if mode == "auto":
        mode = "direct" if world <= DIRECT_MAX_RANKS and nbytes <= DIRECT_MAX_BYTES else "halving"
    limit = DIRECT_MAX_BYTES if mode == "direct" else MAX_BYTES
    if nbytes > limit:
        return "backend", (
            f"{nbytes / 2**20:.1f} MiB of gradients, more than the {limit // 2**20} MiB "
            f"where the {mode} exchange pays"
        )
    return mode, ""
