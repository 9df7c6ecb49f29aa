"""The gradient all-reduce across nodes for a small model: every rank sends to every rank.

The emulator's gradients are 37 KB. gloo's all-reduce moves them in 2 (N-1) rounds, each
handed between the calling thread, gloo's worker threads and its socket thread; on ranks
whose cores are all computing, every hand-over waits for a core, and the all-reduce cost
2-5 ms a step where the step itself is 1-2 ms (docs/benchmarks.md). Here the calling
thread does the whole exchange itself, in one round: it sends its gradients to every
other rank and reads theirs, on TCP connections made once at start-up, sleeping in
``poll`` (not spinning) while it waits. Every rank then sums the N copies in rank order,
so every rank gets the same bits (as the shared-memory all-reduce of ``gradreduce``).

One round costs N - 1 copies of the gradients out of each rank, so it is for small
gradients only (``MAX_BYTES``), and ``auto`` takes it only for few ranks
(``crossnode``); ``halvingreduce`` sends about 2 copies at any N. The connections admit
only the job's ranks, and strangers cost the job no wait (``peerlinks``).
"""

from __future__ import annotations

import time

import torch

from hpcdist.distributed import DistContext
from ufsemulator.training.linktransfer import transfer
from ufsemulator.training.peerlinks import Links, connect_links

MAX_BYTES = 1 * 2**20  # beyond this, N - 1 copies a rank cost more than the ring saves


class MeshAllReduce:
    """Mean over all ranks by one direct exchange (CPU tensors, any hosts)."""

    name = "direct exchange over TCP (every rank to every rank)"

    def __init__(self, peers: Links, numel: int, rank: int, world: int) -> None:
        self.peers = peers
        self.rank, self.world = rank, world
        self.slots = torch.zeros(world, numel, dtype=torch.float32)
        self._views = [memoryview(self.slots[r].numpy()).cast("B") for r in range(world)]  # type: ignore[arg-type]
        self.waited_s = 0.0  # for benchmarks: time spent in the exchange

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor:
        n = grads.numel()
        torch.div(grads, self.world, out=self.slots[self.rank, :n])  # divide, then sum
        start = time.perf_counter()
        mine = self._views[self.rank][: 4 * n]
        transfer(
            "direct gradient exchange",
            self.peers,
            dict.fromkeys(self.peers.socks, mine),
            {peer: self._views[peer][: 4 * n] for peer in self.peers.socks},
        )
        self.waited_s += time.perf_counter() - start
        return torch.sum(self.slots[:, :n], dim=0, out=grads)  # rank order on every rank


def mesh_allreduce(numel: int, ctx: DistContext) -> MeshAllReduce:
    """Connect every pair of ranks. Collective: every rank returns, or every rank raises."""
    rank, world = ctx.env.rank, ctx.env.world_size
    peers = connect_links(ctx, set(range(world)) - {rank})
    return MeshAllReduce(peers, numel, rank, world)
