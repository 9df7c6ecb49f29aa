"""The exchange and rendezvous benchmarks: their short CPU modes, and their pure parts."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.exchanges import alpha_beta_us
from bench.netns import rank_nets
from bench.socketbytes import parse_bytes_sent, tcp_bytes_sent

REPO = Path(__file__).resolve().parents[1]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_exchanges_short_mode_counts_the_bytes_each_exchange_sent(tmp_path: Path) -> None:
    out = tmp_path / "exchanges.json"
    argv = ["bench.exchanges", "--ranks", "2,3", "--chunks", "1", "--per-chunk", "5", "--json"]
    proc = _run(
        [*argv, str(out)],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    per_world = json.loads(out.read_text())["per_world"]
    sent = per_world["3"]["bytes_per_call"]
    size = 4 * 9345
    # Counted on the sockets: 3 ranks, direct sends 2 copies; halving's rank 1 works for
    # rank 0 too (half out, half back, the result to rank 0): 2 copies; shm none.
    assert sent["direct/9345"] == pytest.approx(2 * size, rel=0.05)
    assert sent["halving/9345"] == pytest.approx(2 * size, rel=0.05)
    assert sent["shm/9345"] < 0.05 * size
    assert "| 3     | 37 | halving" in proc.stdout


@pytest.mark.slow
def test_rendezvous_short_mode_times_both_groups_and_the_store(tmp_path: Path) -> None:
    out = tmp_path / "rendezvous.json"
    argv = [
        "bench.rendezvous",
        "--ranks",
        "3",
        "--store-ranks",
        "4",
        "--repeats",
        "1",
        "--timeout",
        "60",
        "--json",
    ]
    proc = _run(
        [*argv, str(out)],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"hpcdist", "torch", "hpcdist-store", "torch-store"}
    assert all(r[0]["ok"] == r[0]["ranks"] and r[0]["last_s"] > 0 for r in runs.values())
    assert "hpcdist-store" in proc.stdout and "ours / reference" in proc.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or importlib.util.find_spec("pyroute2") is None,
    reason="network namespaces need root and pyroute2",
)
@pytest.mark.slow
def test_exchanges_run_with_every_rank_a_host_of_its_own(tmp_path: Path) -> None:
    proc = _run(["bench.exchanges", "--ranks", "3", "--chunks", "1", "--netns"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "a network namespace per rank" in proc.stdout and "shm" not in proc.stdout


@pytest.mark.parametrize(
    ("exchange", "world", "expected_us"),
    [
        # 25 us one way, 10 Gbit/s (0.0008 us a byte), 40,000 bytes
        ("direct", 8, 25 + 7 * 40_000 * 0.0008),
        ("halving", 8, 6 * 25 + 2 * 35_000 * 0.0008),
        ("halving", 6, (4 + 2) * 25 + (2 * 30_000 + 80_000) * 0.0008),
        ("gloo", 8, 14 * 25 + 70_000 * 0.0008),
    ],
)
def test_the_alpha_beta_model_counts_rounds_and_the_busiest_link(
    exchange: str, world: int, expected_us: float
) -> None:
    assert alpha_beta_us(exchange, world, 40_000, 25.0, 10.0) == pytest.approx(expected_us)


def test_the_model_refuses_an_exchange_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="'shm'"):
        alpha_beta_us("shm", 4, 1000, 25.0, 10.0)


@pytest.mark.parametrize(
    ("size", "offset", "value", "retrans", "counted"),
    [
        (232, 200, 123_456, 0, 123_456),  # Linux 4.19+: bytes_sent less bytes_retrans
        (232, 200, 123_456, 1_000, 122_456),
        (216, 200, 5_000, 7, 4_993),  # bytes_retrans is the last field it needs
        (160, 120, 777, 0, 777),  # older kernels: bytes_acked
        (215, 120, 777, 0, 777),  # one byte short of bytes_retrans: bytes_acked
    ],
)
def test_the_byte_counter_is_read_where_the_kernel_puts_it(
    size: int, offset: int, value: int, retrans: int, counted: int
) -> None:
    info = bytearray(size)
    struct.pack_into("=Q", info, offset, value)
    if retrans:
        struct.pack_into("=Q", info, offset + 8, retrans)
    assert parse_bytes_sent(bytes(info)) == counted


def test_a_tcp_info_without_a_counter_is_refused() -> None:
    with pytest.raises(OSError, match="tcp_info of 127 bytes holds no byte counter"):
        parse_bytes_sent(bytes(127))


def test_the_counter_sees_what_a_socket_sent() -> None:
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as a, server.accept()[0] as b:
        before = tcp_bytes_sent()
        a.sendall(b"x" * 10_000)
        b.recv(10_000, socket.MSG_WAITALL)
        assert tcp_bytes_sent() - before == 10_000


def test_rank_hosts_get_distinct_addresses_and_short_interface_names() -> None:
    nets = rank_nets(300, "hd1234")
    assert len({n.address for n in nets}) == 300
    assert nets[0].address == "10.37.0.1" and nets[299].address == "10.37.1.50"
    assert all(len(n.ifname) <= 15 and len(n.host_end) <= 15 for n in nets)
    with pytest.raises(ValueError, match="prefix 'a-very-long-prefix' too long"):
        rank_nets(2, "a-very-long-prefix")
