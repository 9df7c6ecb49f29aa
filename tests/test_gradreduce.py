from __future__ import annotations

import threading

import pytest
import torch

from hpcdist.distributed import DistContext, DistEnv
from ufsemulator import gradreduce
from ufsemulator.gradreduce import SharedMemoryAllReduce, local_allreduce


def shared_segment(world: int, numel: int) -> torch.Tensor:
    # One tensor stands in for the mapped /dev/shm file: every "rank" sees the same bytes.
    return torch.zeros(64 * world + 2 * world * numel * 4, dtype=torch.uint8)


def run_ranks_in_threads(world: int, grads: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Each rank's ``grads[rank][step]`` through the shared-memory all-reduce, one thread
    per rank; returns what each rank got back at each step."""
    numel = grads[0][0].numel()
    segment = shared_segment(world, numel)
    ranks = [SharedMemoryAllReduce(segment, numel, r, world) for r in range(world)]
    results: list[list[torch.Tensor]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            for step in grads[r]:
                results[r].append(ranks[r].reduce_(step.clone()))
        except BaseException as exc:  # surfaced by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


def test_shared_memory_gives_every_rank_the_same_mean_in_rank_order() -> None:
    world, steps, numel = 3, 5, 1001
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(numel, generator=gen) for _ in range(steps)] for _ in range(world)]
    results = run_ranks_in_threads(world, grads)
    for step in range(steps):
        # DDP's own arithmetic: each rank's gradient divided by the world, summed in order.
        expected = torch.sum(torch.stack([grads[r][step] / world for r in range(world)]), dim=0)
        for r in range(world):
            assert torch.equal(results[r][step], expected), (step, r)


def test_shared_memory_alternates_its_two_slot_sets() -> None:
    # Step k writes set k % 2, so a fast rank's next step never overwrites what a slow
    # one is still reading; after two steps both sets hold that step's gradients.
    numel = 8
    segment = shared_segment(2, numel)
    a = SharedMemoryAllReduce(segment, numel, 0, 2)
    b = SharedMemoryAllReduce(segment, numel, 1, 2)
    for step, (x, y) in enumerate([(1.0, 3.0), (5.0, 7.0)], start=1):
        thread = threading.Thread(target=b.reduce_, args=(torch.full((numel,), y),))
        thread.start()
        got = a.reduce_(torch.full((numel,), x))
        thread.join(timeout=30)
        assert torch.equal(got, torch.full((numel,), (x + y) / 2))
        assert a.slots[step % 2, 0, 0].item() == x / 2
        assert a.counters.tolist() == [step, step]


def test_a_rank_that_never_arrives_ends_the_wait_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gradreduce, "ARRIVAL_TIMEOUT_S", 0.2)
    lonely = SharedMemoryAllReduce(shared_segment(3, 4), 4, 0, 3)
    with pytest.raises(RuntimeError, match=r"rank\(s\) \[1, 2\] did not reach step 1"):
        lonely.reduce_(torch.ones(4))


def context(world: int, local_world: int, device: str = "cpu") -> DistContext:
    env = DistEnv(rank=0, local_rank=0, world_size=world, local_world_size=local_world,
                  node_rank=0, master_addr="127.0.0.1", master_port=29500, num_threads=None,
                  source="torchrun", hostname="localhost")  # fmt: skip
    backend = "nccl" if device.startswith("cuda") else "gloo"
    return DistContext(env=env, backend=backend, device=torch.device(device), is_main=True)


@pytest.mark.parametrize(
    ("world", "local_world", "device", "reason"),
    [
        (1, 1, "cpu", "one rank"),
        (4, 2, "cpu", "ranks on several hosts"),
        (8, 4, "cuda:0", "ranks on several hosts"),
    ],
)
def test_the_backend_keeps_the_gradients_where_ranks_cannot_share_memory(
    world: int, local_world: int, device: str, reason: str
) -> None:
    # Decided before any collective: every rank sees the same world and host layout.
    assert local_allreduce(9345, context(world, local_world, device)) == (None, reason)


def test_large_gradients_keep_the_backend() -> None:
    hook, reason = local_allreduce(50_000_000, context(4, 4))
    assert hook is None and reason.startswith("191 MiB of gradients, more than the 16 MiB")
