from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from hpcdist.distributed import DistContext, DistEnv
from ufsemulator.training import gradreduce
from ufsemulator.training.gradreduce import SharedMemoryAllReduce, local_allreduce

REPO = Path(__file__).resolve().parents[3]


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


def test_a_rank_whose_process_is_gone_is_named_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the check the wait would end at the collective timeout, with another message
    # (no wall clock is measured: a busy machine may take any time to get there).
    monkeypatch.setenv("HPCDIST_COLLECTIVE_TIMEOUT", "300")
    segment = shared_segment(2, 4)
    waiting = SharedMemoryAllReduce(segment, 4, 0, 2)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    segment[:128].view(torch.int64)[9] = gone.pid  # rank 1's line: counter, then its pid
    with pytest.raises(RuntimeError, match=rf"rank 1 \(process {gone.pid}\) has exited"):
        waiting.reduce_(torch.ones(4))


def test_a_rank_waiting_for_a_late_peer_sleeps_instead_of_burning_its_core() -> None:
    # The peer comes after a second (a slow step, or a hung rank's first second): the waiting
    # rank's own CPU time is counted, not the wall clock. Spinning on sched_yield cost the
    # whole second (or the machine's share of it) before; napping costs milliseconds.
    segment = shared_segment(2, 4)
    waiting = SharedMemoryAllReduce(segment, 4, 0, 2)
    late = SharedMemoryAllReduce(segment, 4, 1, 2)
    spent: list[float] = []

    def wait_for_the_peer() -> None:
        start = time.thread_time()
        waiting.reduce_(torch.ones(4))
        spent.append(time.thread_time() - start)

    thread = threading.Thread(target=wait_for_the_peer)
    wall = time.monotonic()
    thread.start()
    time.sleep(1.0)
    late.reduce_(torch.full((4,), 3.0))
    thread.join(timeout=60)
    waited = time.monotonic() - wall
    assert spent and waited >= 1.0
    assert spent[0] < 0.2 * waited, f"{spent[0]:.3f} s of CPU in a {waited:.2f} s wait"
    assert waiting.waited_s >= 0.9  # the wait itself is what it was


@pytest.mark.parametrize("contended", [False, True])
def test_a_wait_sleeps_at_once_where_a_yield_ran_another_thread(
    monkeypatch: pytest.MonkeyPatch, contended: bool
) -> None:
    # A yield that returns at once: the core is the rank's own, keep looking (the peer comes
    # at the 200th look here). One that returned after another thread ran (2 ms, a sleep
    # stands in for it): the host has more runnable threads than cores, so the wait sleeps
    # between looks from then on (the peer comes during the first nap).
    segment = shared_segment(2, 4)
    waiting = SharedMemoryAllReduce(segment, 4, 0, 2)
    yields: list[float] = []
    naps: list[float] = []
    real_sleep = time.sleep

    def a_yield() -> None:
        yields.append(time.monotonic())
        if contended:
            real_sleep(0.002)
        elif len(yields) == 200:
            waiting.counters[1] = 1

    def a_nap(seconds: float) -> None:
        naps.append(seconds)
        waiting.counters[1] = 1
        real_sleep(seconds)

    monkeypatch.setattr(gradreduce.os, "sched_yield", a_yield)
    monkeypatch.setattr(gradreduce.time, "sleep", a_nap)
    waiting.reduce_(torch.ones(4))
    if contended:
        assert (len(yields), naps) == (1, [gradreduce._NAP_S])
    else:
        assert (len(yields), naps) == (200, [])


def context(world: int, local_world: int, device: str = "cpu") -> DistContext:
    env = DistEnv(
        rank=0,
        local_rank=0,
        world_size=world,
        local_world_size=local_world,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        num_threads=None,
        source="torchrun",
        hostname="localhost",
    )
    backend = "nccl" if device.startswith("cuda") else "gloo"
    return DistContext(env=env, backend=backend, device=torch.device(device), is_main=True)


def test_one_rank_has_nothing_to_share() -> None:
    assert local_allreduce(9345, context(1, 1)) == (None, "one rank")


@pytest.mark.parametrize(
    ("numel", "local_world", "device", "reason"),
    [
        (9345, 2, "cpu", "ranks on several hosts"),
        (9345, 2, "cuda:0", "ranks on several hosts"),
        (
            50_000_000,
            4,
            "cpu",
            "191 MiB of gradients, more than the 16 MiB where sharing memory pays",
        ),
        (9345, 4, "cpu", None),
    ],
)
def test_what_keeps_a_rank_on_the_backends_all_reduce(
    numel: int, local_world: int, device: str, reason: str | None
) -> None:
    assert gradreduce._blocker(context(4, local_world, device), numel) == reason


SETUP_SCRIPT = """
import os, sys
from pathlib import Path
import torch, torch.distributed as dist
from hpcdist.distributed import DistContext, DistEnv
from ufsemulator.training import gradreduce
rank, port, broken = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
if broken == "rank1-no-shm" and rank == 1:
    gradreduce.SHM_DIR = Path("/nonexistent-shm")
if broken == "rank0-cannot-create" and rank == 0:
    def refuse(size):
        raise OSError(28, "No space left on device")
    gradreduce._create_segment = refuse
env = DistEnv(rank=rank, local_rank=rank, world_size=2, local_world_size=2, node_rank=0,
              master_addr="127.0.0.1", master_port=int(port), num_threads=None,
              source="torchrun", hostname="localhost")
ctx = DistContext(env=env, backend="gloo", device=torch.device("cpu"), is_main=rank == 0)
reducer, reason = gradreduce.local_allreduce(100, ctx)
print(f"rank {rank}={type(reducer).__name__}={reason}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("broken", ["none", "rank1-no-shm", "rank0-cannot-create"])
@pytest.mark.slow
def test_set_up_gives_every_rank_the_same_answer(broken: str) -> None:
    # A rank that cannot take part must not leave the others waiting in a collective:
    # every rank falls back to the backend together, promptly.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SETUP_SCRIPT, str(r), port, broken],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    answers = [out.strip().splitlines()[-1].split("=", 2)[1:] for out in outputs]
    if broken == "none":
        assert answers == [["SharedMemoryAllReduce", ""]] * 2
    else:
        assert [kind for kind, _ in answers] == ["NoneType"] * 2, outputs
    if broken == "rank1-no-shm":
        assert answers[1][1] == "no /nonexistent-shm"
        assert answers[0][1] == "not possible on another rank"
    if broken == "rank0-cannot-create":
        assert "No space left on device" in answers[0][1]


@pytest.mark.parametrize(
    ("device", "planned", "asks"),
    [
        ("cuda:0", gradreduce.SYMMETRIC_MIN_STEPS - 1, False),  # auto, a short run: NCCL
        ("cuda:0", gradreduce.SYMMETRIC_MIN_STEPS, True),  # auto, long enough
        ("cuda:0", None, True),  # local: always asks
        ("cpu", 1, True),  # shared memory costs no set-up: auto asks on the CPU at any length
    ],
)
def test_auto_asks_for_symmetric_memory_only_for_long_gpu_runs(
    monkeypatch: pytest.MonkeyPatch, device: str, planned: int | None, asks: bool
) -> None:
    # Past the length check come the collective checks; stopped there, without a group.
    monkeypatch.setattr(gradreduce, "_blocker", lambda ctx, numel: "checked")
    monkeypatch.setattr(gradreduce, "_agree", lambda ok, ctx: ok)
    reducer, reason = local_allreduce(9345, context(4, 4, device), planned)
    assert reducer is None
    if asks:
        assert reason == "checked"
    else:
        assert reason == "auto: 299,999 steps planned, symmetric memory pays from 300,000"
