"""The direct gradient exchange across nodes: every rank sends to every rank over TCP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ufsemulator.training import meshreduce, peerlinks

REPO = Path(__file__).resolve().parents[3]

MESH_SCRIPT = """
import sys
import torch, torch.distributed as dist
from hpcdist.distributed import DistContext, DistEnv
from ufsemulator.training import gradreduce
rank, world, port, local_world, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                        int(sys.argv[4]), sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world)
env = DistEnv(rank=rank, local_rank=rank % local_world, world_size=world,
              local_world_size=local_world, node_rank=rank // local_world,
              master_addr="127.0.0.1", master_port=int(port), num_threads=None,
              source="torchrun", hostname="localhost")
ctx = DistContext(env=env, backend="gloo", device=torch.device("cpu"), is_main=rank == 0)
reducer, reason = gradreduce.gradient_allreduce(mode, 9345, ctx, 100)
print(f"kind={type(reducer).__name__} reason={reason}", flush=True)
if reducer is not None:
    for step in range(3):  # both sizes of the buffer: the whole, and a shorter prefix
        n = 9345 if step != 1 else 1000
        torch.manual_seed(100 * step + rank)
        grads = torch.randn(n)
        everyone = []
        for r in range(world):
            torch.manual_seed(100 * step + r)
            everyone.append(torch.randn(n) / world)
        expected = everyone[0].clone()
        for other in everyone[1:]:
            expected += other  # divide, then sum in rank order
        out = reducer.reduce_(grads)
        same = torch.equal(out, expected)
        digest = float(out.double().sum())
        print(f"step={step} bitwise={same} digest={digest!r}", flush=True)
dist.destroy_process_group()
"""


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _run(world: int, local_world: int, mode: str) -> list[str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", MESH_SCRIPT, str(r), str(world), port, str(local_world), mode],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * world, outputs
    return outputs


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_ranks_on_several_hosts_exchange_directly_and_agree_bit_for_bit(world: int) -> None:
    # local_world 1: every rank "on a host of its own", as on the 4-node testbed; auto
    # then takes the direct exchange for the emulator's 37 KB of gradients.
    outputs = _run(world, 1, "auto")
    for out in outputs:
        assert "kind=MeshAllReduce reason=" in out, out
        for step in range(3):
            assert f"step={step} bitwise=True" in out, out
    digests = [[line for line in out.splitlines() if "digest" in line] for out in outputs]
    assert all(d == digests[0] for d in digests), digests


@pytest.mark.slow
def test_ranks_of_one_host_keep_shared_memory_under_auto() -> None:
    outputs = _run(2, 2, "auto")
    assert all("kind=SharedMemoryAllReduce" in out for out in outputs), outputs


@pytest.mark.slow
def test_direct_forces_the_exchange_on_one_host_too() -> None:
    outputs = _run(2, 2, "direct")
    assert all("kind=MeshAllReduce" in out and "bitwise=True" in out for out in outputs)


def _hello(rank: int, token: bytes) -> bytes:
    return peerlinks.HELLO.pack(rank, token)


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        (_hello(2, b"t" * 32), 2),  # the listener's token, a rank still expected
        (_hello(2, b"x" * 32), None),  # a stranger's guess
        (_hello(5, b"t" * 32), None),  # the token, but a rank that is not expected
        (_hello(2, b"t" * 32)[:-1], None),  # cut short, then silence
        (b"", None),  # connects and closes
    ],
)
def test_only_a_connection_with_the_token_and_an_expected_rank_is_admitted(
    sent: bytes, expected: int | None
) -> None:
    assert peerlinks.proven_rank(sent, b"t" * 32, {1, 2, 3}) == expected


def test_gradients_larger_than_a_direct_exchange_pays_keep_the_backend() -> None:
    from hpcdist.distributed import DistContext, DistEnv
    from ufsemulator.training import gradreduce

    env = DistEnv(
        rank=0,
        local_rank=0,
        world_size=4,
        local_world_size=1,
        node_rank=0,
        master_addr="127.0.0.1",
        master_port=29500,
        num_threads=None,
        source="torchrun",
        hostname="localhost",
    )
    import torch

    ctx = DistContext(env=env, backend="gloo", device=torch.device("cpu"), is_main=True)
    limit = meshreduce.MAX_BYTES // 4
    reducer, reason = gradreduce.gradient_allreduce("direct", limit + 1, ctx)
    assert reducer is None
    assert reason.startswith("1.0 MiB of gradients, more than the 1 MiB where the direct")


def test_the_exchange_listens_on_gloos_interface_when_the_job_names_one() -> None:
    assert peerlinks.local_address("10.0.0.1", {"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    assert peerlinks.local_address("127.0.0.1", {}) == "127.0.0.1"
    with pytest.raises(OSError, match="GLOO_SOCKET_IFNAME 'nosuch0': no IPv4 address"):
        peerlinks.local_address("127.0.0.1", {"GLOO_SOCKET_IFNAME": "nosuch0"})


def _cores(*sets: range) -> list[frozenset[int]]:
    return [frozenset(each) for each in sets]


@pytest.mark.parametrize(
    ("host_cpus", "spin"),
    [
        # Bound to cores of their own (srun --cpu-bind=cores): 4 ranks of 1 and of 2 cores.
        (_cores(range(0, 1), range(1, 2), range(2, 3), range(3, 4)), peerlinks.SPIN_OWN_S),
        (_cores(range(0, 2), range(2, 4)), peerlinks.SPIN_OWN_S),
        # Unbound in a cgroup of 8 CPUs: 8 ranks have one each, 9 share them.
        ([frozenset(range(8))] * 8, peerlinks.SPIN_OWN_S),
        ([frozenset(range(8))] * 9, peerlinks.SPIN_SHARED_S),
        # Two ranks bound to the same core, alone on the host.
        (_cores(range(5, 6), range(5, 6)), peerlinks.SPIN_SHARED_S),
        ([frozenset({0})], peerlinks.SPIN_OWN_S),  # one rank a host
    ],
)
def test_a_rank_spins_long_only_where_its_host_has_a_cpu_for_each_rank(
    host_cpus: list[frozenset[int]], spin: float
) -> None:
    assert peerlinks.spin_for(host_cpus) == spin
