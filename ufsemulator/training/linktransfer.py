"""Moving bytes over the peer links in both directions at once, by the calling thread.

The gradient exchanges send and receive on several links together (every peer for the
direct exchange, one partner per round for recursive halving). One thread does it all
with non-blocking sockets and ``poll``: it looks without sleeping for ``Links.spin_s`` first
(a peer on cores of its own answers within microseconds, while waking a sleeping thread
costs tens to hundreds of them), then sleeps in ``poll``.
"""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass

from ufsemulator.training.peerlinks import Links, exchange_timeout_s

_FAILED = select.POLLERR | select.POLLHUP | select.POLLNVAL


@dataclass
class _Link:
    peer: int
    sock: socket.socket
    out: memoryview  # to send (may be empty)
    into: memoryview  # to fill (may be empty)
    sent: int = 0
    got: int = 0

    def mask(self) -> int:
        return (select.POLLOUT if self.sent < len(self.out) else 0) | (
            select.POLLIN if self.got < len(self.into) else 0
        )


def transfer(
    what: str,
    peers: Links,
    sends: dict[int, memoryview],
    recvs: dict[int, memoryview],
) -> None:
    """Send ``sends[peer]`` to and fill ``recvs[peer]`` from each peer at once; returns
    when every byte is through. Raises naming the peer on a closed link or silence for
    the job's collective timeout (``exchange_timeout_s``). ``what`` names the exchange in errors."""
    empty = memoryview(b"")
    links = {}
    for peer in sends.keys() | recvs.keys():
        link = _Link(peer, peers.socks[peer], sends.get(peer, empty), recvs.get(peer, empty))
        if link.mask():
            links[link.sock.fileno()] = link
    poller = select.poll()
    for fd, link in links.items():
        poller.register(fd, link.mask())
    spin_until = time.perf_counter() + peers.spin_s
    timeout_s = exchange_timeout_s()
    deadline = time.monotonic() + timeout_s
    while links:
        spinning = time.perf_counter() < spin_until
        events = poller.poll(0 if spinning else 1000)
        if not events and not spinning and time.monotonic() > deadline:
            late = sorted(link.peer for link in links.values())
            raise RuntimeError(f"{what}: rank(s) {late} silent for {timeout_s:g} s")
        for fd, event in events:
            link = links[fd]
            _move(what, link, event)
            mask = link.mask()
            if not mask:
                poller.unregister(fd)
                del links[fd]
            else:
                poller.modify(fd, mask)


def _move(what: str, link: _Link, event: int) -> None:
    try:
        if event & select.POLLOUT and link.sent < len(link.out):
            link.sent += link.sock.send(link.out[link.sent :])
        if event & select.POLLIN and link.got < len(link.into):
            count = link.sock.recv_into(link.into[link.got :])
            if count == 0:
                raise RuntimeError(f"{what}: rank {link.peer} closed its connection")
            link.got += count
    except (BlockingIOError, InterruptedError):
        return
    except OSError as exc:
        raise RuntimeError(f"{what}: rank {link.peer}'s connection failed ({exc})") from exc
    if event & _FAILED and link.got < len(link.into):
        raise RuntimeError(f"{what}: rank {link.peer}'s connection failed")
