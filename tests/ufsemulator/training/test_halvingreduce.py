"""The recursive halving/doubling gradient exchange, and strangers at its listener."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from ufsemulator.training import crossnode, peerlinks
from ufsemulator.training.halvingreduce import Plan, plan, tree_sum

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import socket, sys, threading, time
import torch, torch.distributed as dist
from hpcdist.distributed import DistContext, DistEnv
from ufsemulator.training import gradreduce, peerlinks
from ufsemulator.training.halvingreduce import tree_sum
rank, world, port, mode, strangers = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                      sys.argv[4], sys.argv[5] == "strangers")
done = threading.Event()
held = []

def stranger(address, slow):
    sock = real_connect(address)
    held.append(sock)
    give_up = time.monotonic() + 60
    while not done.is_set() and time.monotonic() < give_up:
        if slow:
            try:
                sock.send(b"x")  # one byte of a hello that never completes
            except OSError:
                pass  # the listener closed it: what it should do
        time.sleep(0.3)
    print(f"stranger outlasted by the step={done.is_set()}", flush=True)

real_connect = socket.create_connection
def connect_after_strangers(address, *args, **kwargs):
    if strangers:  # rank 1 dials rank 0: two strangers get there first
        for slow in (False, True):
            threading.Thread(target=stranger, args=(address, slow)).start()
        time.sleep(0.5)
    return real_connect(address, *args, **kwargs)
socket.create_connection = connect_after_strangers

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
env = DistEnv(rank=rank, local_rank=0, world_size=world, local_world_size=1, node_rank=rank,
              master_addr="127.0.0.1", master_port=int(port), num_threads=None,
              source="torchrun", hostname="localhost")
ctx = DistContext(env=env, backend="gloo", device=torch.device("cpu"), is_main=rank == 0)
reducer, reason = gradreduce.gradient_allreduce(mode, 9345, ctx, 100)
print(f"kind={type(reducer).__name__} reason={reason}", flush=True)
for step, n in enumerate((9345, 1000, 7)):  # the whole buffer, and shorter prefixes
    grads = torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))
    parts = [torch.randn(n, generator=torch.Generator().manual_seed(100 * step + r)) / world
             for r in range(world)]
    out = reducer.reduce_(grads)
    print(f"step={step} bitwise={torch.equal(out, tree_sum(parts))} "
          f"digest={out.double().sum().item()!r}", flush=True)
done.set()
dist.destroy_process_group()
"""


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _run(world: int, mode: str, strangers: bool = False) -> list[str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [str(world), port, mode, "strangers" if strangers and world > 1 else "-"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(r), *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, outputs
    return outputs


@pytest.mark.parametrize("world", [2, 3, 5, 8])
@pytest.mark.slow
def test_every_rank_gets_the_tree_sum_bit_for_bit(world: int) -> None:
    outputs = _run(world, "halving")
    for out in outputs:
        assert "kind=HalvingAllReduce reason=" in out, out
        assert [f"step={s} bitwise=True" in out for s in range(3)] == [True] * 3, out
    digests = [[line for line in out.splitlines() if "digest" in line] for out in outputs]
    assert all(d == digests[0] for d in digests), digests


@pytest.mark.slow
def test_strangers_at_the_listener_do_not_hold_the_exchange() -> None:
    # A silent connection and one that sends a byte now and then reach rank 0's listener
    # before rank 1 does; they stay until the step is done (or 60 s). Had the listener
    # waited for either, the step would come only after they gave up.
    outputs = _run(2, "halving", strangers=True)
    assert all("step=2 bitwise=True" in out for out in outputs), outputs
    assert outputs[1].count("stranger outlasted by the step=True") == 2, outputs[1]
    assert "Traceback" not in outputs[0], outputs[0]


@pytest.mark.parametrize("world", range(2, 14))
def test_partners_are_mutual_and_the_owned_segments_cover_the_gradients(world: int) -> None:
    numel = 1001
    plans = [plan(r, world, numel) for r in range(world)]
    for p in plans:
        assert all(p.rank in plans[peer].links() for peer in p.links()), p
    owned = sorted(p.rounds[-1].keep for p in plans if p.rounds)
    power = 1 << (world.bit_length() - 1)
    assert len(owned) == power
    assert owned[0][0] == 0 and owned[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(owned))


@pytest.mark.parametrize(
    ("world", "rounds", "most_sent"),
    [
        (2, 1, 1.0),  # half out, half back
        (4, 2, 1.5),
        (8, 3, 1.75),
        (64, 6, 1.97),
        (5, 2, 2.5),  # rank 1 works for rank 0 too: 1.5 + the result back
        (12, 3, 2.75),
    ],
)
def test_bytes_sent_stay_near_twice_the_gradients_and_rounds_grow_as_log_n(
    world: int, rounds: int, most_sent: float
) -> None:
    numel = 6400
    plans = [plan(r, world, numel) for r in range(world)]
    assert max(len(p.rounds) for p in plans) == rounds

    def sent(p: Plan) -> int:
        scatter = sum(r.give[1] - r.give[0] for r in p.rounds)
        gather = sum(r.keep[1] - r.keep[0] for r in p.rounds)
        folded = p.folds_into is not None or p.folded_from is not None
        return scatter + gather + (numel if folded else 0)

    assert max(sent(p) for p in plans) / numel == pytest.approx(most_sent, abs=0.02)


def test_the_reference_sums_adjacent_pairs_first() -> None:
    big, small = torch.tensor([1e8]), torch.tensor([1.0])
    # ((1e8 + 1) + (-1e8 + 1)) = 1e8 - 1e8 + ... : float32 loses each 1 against 1e8
    parts = [big, small, -big, small]
    assert tree_sum(parts).item() == ((big + small) + (-big + small)).item()
    assert tree_sum([big, small, -big]).item() == ((big + small) + -big).item()


@pytest.mark.parametrize(
    ("mode", "world", "nbytes", "chosen"),
    [
        ("auto", 2, 37_380, "direct"),
        ("auto", crossnode.DIRECT_MAX_RANKS, 37_380, "direct"),
        ("auto", crossnode.DIRECT_MAX_RANKS + 1, 37_380, "halving"),
        ("auto", 64, 37_380, "halving"),
        ("auto", 2, crossnode.AUTO_DIRECT_MAX_BYTES + 1, "halving"),  # too large for N - 1
        ("auto", 8, 4 * 262_144, "halving"),
        ("auto", 64, crossnode.MAX_BYTES + 1, "backend"),
        ("direct", 64, 37_380, "direct"),
        ("halving", 2, 37_380, "halving"),
        ("halving", 1, 37_380, "backend"),
    ],
)
def test_auto_picks_the_exchange_from_ranks_and_size(
    mode: str, world: int, nbytes: int, chosen: str
) -> None:
    assert crossnode.choose(mode, world, nbytes)[0] == chosen


def test_an_unknown_exchange_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="got 'ring'"):
        crossnode.choose("ring", 4, 100)


def test_the_listener_admits_the_ranks_while_strangers_hang_on() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    address = listener.getsockname()
    silent = socket.create_connection(address)
    slow = socket.create_connection(address)
    slow.sendall(b"\x00\x00")  # the start of a hello, never the rest
    wrong = socket.create_connection(address)
    wrong.sendall(peerlinks.HELLO.pack(2, b"x" * 32))
    ranks = []
    for rank in (2, 1):
        sock = socket.create_connection(address)
        sock.sendall(peerlinks.HELLO.pack(rank, b"t" * 32))
        ranks.append(sock)
    got: dict[int, socket.socket] = {}
    thread = threading.Thread(
        target=lambda: got.update(
            peerlinks.accept_ranks(listener, b"t" * 32, {1, 2}, time.monotonic() + 60)
        )
    )
    thread.start()
    thread.join(timeout=30)
    # Returned with both ranks while the strangers are still connected and unproven.
    assert not thread.is_alive() and sorted(got) == [1, 2]
    assert wrong.recv(1) == b""  # the wrong token was closed
    for sock in (silent, slow, wrong, listener, *ranks, *got.values()):
        sock.close()


def test_a_connection_that_proves_nothing_is_closed_after_the_hello_timeout() -> None:
    # A clock that runs 0.4 s a look: the silent stranger is due for closing after a few
    # looks; rank 1 connects only once the stranger has seen its connection closed, so the
    # listener returns only if it closed it (else it reaches its deadline and raises).
    ticks = itertools.count()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    address = listener.getsockname()
    stranger = socket.create_connection(address)
    rank: list[socket.socket] = []

    def rank_after_stranger() -> None:
        stranger.settimeout(30)
        assert stranger.recv(1) == b""  # closed by the listener
        sock = socket.create_connection(address)
        sock.sendall(peerlinks.HELLO.pack(1, b"t" * 32))
        rank.append(sock)

    thread = threading.Thread(target=rank_after_stranger)
    thread.start()
    got = peerlinks.accept_ranks(
        listener, b"t" * 32, {1}, deadline=10_000.0, clock=lambda: 0.4 * next(ticks)
    )
    thread.join(timeout=30)
    assert sorted(got) == [1]
    for sock in (stranger, listener, *rank, *got.values()):
        sock.close()
