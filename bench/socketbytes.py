"""Bytes this process has sent over TCP, read from the kernel's counters of its sockets.

The benchmarks report what each exchange really sent, not what its algorithm should send:
every TCP socket the process holds (gloo's, the store's, the exchanges' own) is asked for
its ``tcp_info`` (``getsockopt(TCP_INFO)``), whose ``tcpi_bytes_sent`` less
``tcpi_bytes_retrans`` (Linux 4.19+; before, ``tcpi_bytes_acked``) counts the payload bytes the
kernel has sent on it once: a segment sent again (a loaded machine's receiver that fell
behind) is the machine's cost, not the algorithm's, and would make the count vary. A socket
closed in between takes its count with it: read the counters around a stretch in which
the exchanges keep their connections (a training's timed epochs).
"""

from __future__ import annotations

import os
import socket
import struct

_BYTES_ACKED = 120  # offsets in Linux's struct tcp_info
_BYTES_SENT = 200
_BYTES_RETRANS = 208
_INFO_SIZE = 256


def tcp_bytes_sent() -> int:
    """Bytes sent so far on every TCP socket this process holds."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            total += _socket_bytes_sent(int(name))
        except OSError:
            continue  # closed meanwhile, or not TCP
    return total


def _socket_bytes_sent(fd: int) -> int:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return 0
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _INFO_SIZE)
    finally:
        sock.close()
    return parse_bytes_sent(info)


def parse_bytes_sent(info: bytes) -> int:
    """``tcpi_bytes_sent - tcpi_bytes_retrans`` of a ``tcp_info`` as the kernel returned it
    (shorter from kernels before 4.19: ``tcpi_bytes_acked``). Pure."""
    if len(info) >= _BYTES_RETRANS + 8:
        sent, retrans = struct.unpack_from("=QQ", info, _BYTES_SENT)
        return int(sent - retrans)
    if len(info) < _BYTES_ACKED + 8:
        raise OSError(f"tcp_info of {len(info)} bytes holds no byte counter")
    return int(struct.unpack_from("=Q", info, _BYTES_ACKED)[0])
