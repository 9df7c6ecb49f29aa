"""The gradient all-reduce across nodes whose cost does not grow with the ranks.

Recursive halving, then recursive doubling (Rabenseifner's all-reduce), by the calling
thread over the authenticated links of ``peerlinks``. With N = P + R ranks, P the largest
power of two <= N:

1. fold: the first 2R ranks pair up (0 with 1, 2 with 3, ...); the even rank sends its
   whole gradients to the odd one and sits out until step 4. The P ranks left (the odd
   ones of the pairs and every rank from 2R on, in rank order) are renumbered 0..P-1.
2. reduce-scatter by recursive halving, distance 1, 2, 4, ... P/2: in round j each rank
   keeps one half of its current segment and sends the other half to the rank 2^j away,
   adding what it receives for its own half. After log2 P rounds each rank holds the
   complete sum of one P-th of the gradients.
3. all-gather by recursive doubling: the same partners in reverse; each sends what it
   holds and receives its partner's, until every rank has everything.
4. unfold: the odd rank of each pair sends the result to its even rank.

Each rank sends 2 (P - 1) / P of the gradients (the folded pairs about 1x or 3x more), in
2 log2 P rounds of one partner each: the bytes a rank sends do not grow with N and the
rounds grow as log N (``meshreduce``, every rank to every rank, sends N - 1 copies).

The order of the sums, the same on every rank and every step: the gradients are divided
by N first (as DDP does), then summed as a balanced binary tree over the ranks in rank
order, adjacent pairs first: ((g0 + g1) + (g2 + g3)) + ((g4 + g5) + (g6 + g7)) for 8
ranks; with N not a power of two the folded pairs are leaves, e.g. for 6 ranks
((g0 + g1) + (g2 + g3)) + (g4 + g5), and for 5 ranks ((g0 + g1) + g2) + (g3 + g4).
Each element is summed by exactly one rank and copied to the others, so every rank
gets the same bits; the tree's shape depends only on N, so the same inputs give the same
bits in every run (``tree_sum`` is the reference).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from hpcdist.distributed import DistContext
from ufsemulator.training.linktransfer import transfer
from ufsemulator.training.peerlinks import Links, connect_links

WHAT = "recursive-halving gradient exchange"


@dataclass(frozen=True)
class Round:
    """One round of the reduce-scatter: exchange with ``peer`` (a rank), keep
    ``keep`` (element range) and send ``give``. The all-gather runs them in reverse,
    sending ``keep`` and receiving ``give``."""

    peer: int
    keep: tuple[int, int]
    give: tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """What rank ``rank`` of ``world`` does, for gradients of ``numel`` elements."""

    rank: int
    world: int
    numel: int
    folds_into: int | None  # an even rank of a pair: the odd rank that works for both
    folded_from: int | None  # an odd rank of a pair: the even rank it works for
    rounds: tuple[Round, ...]  # empty for a rank that sits out

    def links(self) -> set[int]:
        peers = {r.peer for r in self.rounds}
        return peers | {p for p in (self.folds_into, self.folded_from) if p is not None}


def plan(rank: int, world: int, numel: int) -> Plan:
    """The schedule of module docstring's steps 1-4 for one rank. Pure."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    power = 1 << (world.bit_length() - 1)
    extra = world - power
    if rank < 2 * extra and rank % 2 == 0:
        return Plan(rank, world, numel, rank + 1, None, ())
    folded_from = rank - 1 if rank < 2 * extra else None
    virtual = (rank - 1) // 2 if rank < 2 * extra else rank - extra
    lo, hi = 0, numel
    rounds = []
    distance = 1
    while distance < power:
        partner = virtual ^ distance
        mid = lo + (hi - lo) // 2
        low, high = (lo, mid), (mid, hi)
        keep, give = (low, high) if virtual & distance == 0 else (high, low)
        real = 2 * partner + 1 if partner < extra else partner + extra
        rounds.append(Round(real, keep, give))
        lo, hi = keep
        distance *= 2
    return Plan(rank, world, numel, None, folded_from, tuple(rounds))


def tree_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The reference for the exchange's sum: ``parts`` (one per rank, already divided)
    summed in the module docstring's order."""
    power = 1 << (len(parts).bit_length() - 1)
    extra = len(parts) - power
    level = [parts[2 * i] + parts[2 * i + 1] for i in range(extra)] + list(parts[2 * extra :])
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0].clone()


class HalvingAllReduce:
    """Mean over all ranks by recursive halving and doubling (CPU tensors, any hosts)."""

    name = "recursive halving and doubling over TCP"

    def __init__(self, peers: Links, numel: int, rank: int, world: int) -> None:
        self.peers = peers
        self.rank, self.world = rank, world
        # The arithmetic is numpy's on the same memory: a 37 KB add costs torch's eager
        # dispatch about 8 us and numpy's 3, and a step of 32 ranks does 7 of them.
        self.buf = np.zeros(numel, dtype=np.float32)
        self.scratch = np.zeros(numel, dtype=np.float32)
        self._buf = memoryview(self.buf).cast("B")  # type: ignore[arg-type]
        self._scratch = memoryview(self.scratch).cast("B")  # type: ignore[arg-type]
        self.waited_s = 0.0  # for benchmarks: time spent in the exchange

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor:
        n = grads.numel()
        step = _plan(self.rank, self.world, n)
        flat = grads.detach().numpy()
        np.divide(flat, np.float32(self.world), out=self.buf[:n])  # as DDP: divide, then sum
        start = time.perf_counter()
        if step.folds_into is not None:
            self._swap(step.folds_into, send=(0, n), recv=None)
            self._swap(step.folds_into, send=None, recv=(0, n))
        else:
            if step.folded_from is not None:
                self._swap(step.folded_from, send=None, recv=(0, n), add=True)
            for r in step.rounds:
                self._swap(r.peer, send=r.give, recv=r.keep, add=True)
            for r in reversed(step.rounds):
                self._swap(r.peer, send=r.keep, recv=r.give)
            if step.folded_from is not None:
                self._swap(step.folded_from, send=(0, n), recv=None)
        self.waited_s += time.perf_counter() - start
        np.copyto(flat, self.buf[:n])
        return grads

    def _swap(
        self,
        peer: int,
        send: tuple[int, int] | None,
        recv: tuple[int, int] | None,
        add: bool = False,
    ) -> None:
        """Send ``buf[send]`` to ``peer`` while receiving its ``recv`` range: into
        ``buf`` itself, or with ``add`` into scratch and then added to ``buf``."""
        into = self._scratch if add else self._buf
        sends = {peer: self._buf[4 * send[0] : 4 * send[1]]} if send else {}
        recvs = {peer: into[4 * recv[0] : 4 * recv[1]]} if recv else {}
        transfer(WHAT, self.peers, sends, recvs)
        if add and recv is not None:
            lo, hi = recv
            np.add(self.buf[lo:hi], self.scratch[lo:hi], out=self.buf[lo:hi])


@lru_cache(maxsize=64)
def _plan(rank: int, world: int, numel: int) -> Plan:
    return plan(rank, world, numel)


def halving_allreduce(numel: int, ctx: DistContext) -> HalvingAllReduce:
    """Link each rank to its partners. Collective: every rank returns, or every rank
    raises."""
    rank, world = ctx.env.rank, ctx.env.world_size
    peers = connect_links(ctx, plan(rank, world, numel).links())
    return HalvingAllReduce(peers, numel, rank, world)
