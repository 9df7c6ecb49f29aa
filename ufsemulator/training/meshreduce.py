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
gradients only (``MAX_BYTES``); larger ones keep the backend's bandwidth-optimal ring.

The connections admit only the job's ranks: each rank listens on a new port, and the
ports and one random token per rank travel through the process group, which has already
checked that every rank holds the job's secret. A connection that does not open with
the listener's token and a rank that is still expected is closed unread.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist

from hpcdist.distributed import DistContext

MAX_BYTES = 1 * 2**20  # beyond this, N - 1 copies a rank cost more than the ring saves
CONNECT_TIMEOUT_S = 60.0
# A peer that is alive but never sends must not hold the others for ever; the process
# group's own collectives have the job's timeout, this is the exchange's.
EXCHANGE_TIMEOUT_S = 600.0
_HELLO = struct.Struct("!I32s")  # the connecting rank, the listener's token
# Look without sleeping this long before sleeping in poll: a peer on cores of its own
# arrives within microseconds, while waking a sleeping thread (on a virtual machine, its
# virtual CPU) costs tens to hundreds of them.
SPIN_S = 200e-6


class MeshAllReduce:
    """Mean over all ranks by one direct exchange (CPU tensors, any hosts)."""

    name = "direct exchange over TCP (every rank to every rank)"

    def __init__(self, peers: dict[int, socket.socket], numel: int, rank: int, world: int) -> None:
        self.peers = peers
        self.rank, self.world = rank, world
        self.slots = torch.zeros(world, numel, dtype=torch.float32)
        self._views = [memoryview(self.slots[r].numpy()).cast("B") for r in range(world)]  # type: ignore[arg-type]
        self._by_fd = {sock.fileno(): (peer, sock) for peer, sock in peers.items()}
        self.waited_s = 0.0  # for benchmarks: time spent in the exchange

    def reduce_(self, grads: torch.Tensor) -> torch.Tensor:
        n = grads.numel()
        torch.div(grads, self.world, out=self.slots[self.rank, :n])  # divide, then sum
        start = time.perf_counter()
        self._exchange(4 * n)
        self.waited_s += time.perf_counter() - start
        return torch.sum(self.slots[:, :n], dim=0, out=grads)  # rank order on every rank

    def _exchange(self, nbytes: int) -> None:
        mine = self._views[self.rank][:nbytes]
        sent = dict.fromkeys(self.peers, 0)
        got = dict.fromkeys(self.peers, 0)
        poller = select.poll()  # this exchange's: a peer leaves it once both ways are done
        for fd in self._by_fd:
            poller.register(fd, select.POLLIN | select.POLLOUT)
        pending = len(self.peers)
        spin_until = time.perf_counter() + SPIN_S
        deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
        while pending:
            spinning = time.perf_counter() < spin_until
            events = poller.poll(0 if spinning else 1000)
            if spinning and not events:
                continue
            if not events and time.monotonic() > deadline:
                late = [p for p in self.peers if got[p] < nbytes]
                raise RuntimeError(
                    f"direct gradient exchange: no data from rank(s) {late} in "
                    f"{EXCHANGE_TIMEOUT_S:.0f} s"
                )
            for fd, event in events:
                peer, sock = self._by_fd[fd]
                if event & select.POLLOUT and sent[peer] < nbytes:
                    sent[peer] += sock.send(mine[sent[peer] :])
                if event & select.POLLIN and got[peer] < nbytes:
                    count = sock.recv_into(self._views[peer][got[peer] : nbytes])
                    if count == 0:
                        raise RuntimeError(
                            f"direct gradient exchange: rank {peer} closed its connection"
                        )
                    got[peer] += count
                failed = event & (select.POLLERR | select.POLLHUP | select.POLLNVAL)
                if failed and got[peer] < nbytes:
                    raise RuntimeError(f"direct gradient exchange: rank {peer}'s connection failed")
                done_out, done_in = sent[peer] >= nbytes, got[peer] >= nbytes
                if done_out and done_in:
                    poller.unregister(fd)
                    pending -= 1
                elif done_out:
                    poller.modify(fd, select.POLLIN)
                elif done_in:
                    poller.modify(fd, select.POLLOUT)


def mesh_allreduce(numel: int, ctx: DistContext) -> MeshAllReduce:
    """Connect every pair of ranks (rank i calls every rank below it). Collective: every
    rank returns, or every rank raises."""
    rank, world = ctx.env.rank, ctx.env.world_size
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    token = secrets.token_bytes(32)
    error = ""
    try:
        listener.bind((_local_address(ctx.env.master_addr, os.environ), 0))
        listener.listen(world)
        address: tuple[str, int, bytes] | None = (*listener.getsockname()[:2], token)
    except OSError as exc:
        address, error = None, f"cannot listen: {exc}"
    addresses: list[tuple[str, int, bytes] | None] = [None] * world
    dist.all_gather_object(addresses, address)
    peers: dict[int, socket.socket] = {}
    try:
        if any(a is None for a in addresses):
            raise RuntimeError(error or "another rank could not listen")
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for peer in range(rank):  # lower ranks accept, higher ranks call
            host, port, their_token = addresses[peer]  # type: ignore[misc]
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            sock.sendall(_HELLO.pack(rank, their_token))
            peers[peer] = sock
        expected = set(range(rank + 1, world))
        while expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"rank(s) {sorted(expected)} never connected")
            listener.settimeout(remaining)
            sock, _ = listener.accept()
            admitted = _admit(sock, token, expected, remaining)
            if admitted is None:
                sock.close()
                continue
            expected.discard(admitted)
            peers[admitted] = sock
        for sock in peers.values():
            sock.settimeout(None)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ok = True
    except (OSError, RuntimeError) as exc:
        ok, error = False, f"{type(exc).__name__}: {exc}"
    finally:
        listener.close()
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if not flag.item():
        for sock in peers.values():
            sock.close()
        raise RuntimeError(error or "another rank could not connect")
    return MeshAllReduce(peers, numel, rank, world)


def _admit(sock: socket.socket, token: bytes, expected: set[int], timeout: float) -> int | None:
    """The rank a new connection proves to be, or None: a stranger, a repeat, or silence."""
    sock.settimeout(min(timeout, 10.0))
    hello = b""
    try:
        while len(hello) < _HELLO.size:
            chunk = sock.recv(_HELLO.size - len(hello))
            if not chunk:
                return None
            hello += chunk
    except OSError:
        return None
    peer, proof = _HELLO.unpack(hello)
    if not secrets.compare_digest(proof, token) or peer not in expected:
        return None
    return int(peer)


def _local_address(master_addr: str, environ: Mapping[str, str]) -> str:
    """The address to listen on: that of gloo's interface where the job names one
    (``GLOO_SOCKET_IFNAME``, e.g. a cluster's InfiniBand ``ib0``), else this host's
    address on the route to the master."""
    names = [n.strip() for n in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        return _interface_address(names[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, 9))  # no packet is sent: only the route is chosen
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux's SIOCGIFADDR)."""
    siocgifaddr = 0x8915
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), siocgifaddr, request)
        except OSError as exc:
            raise OSError(f"GLOO_SOCKET_IFNAME {name!r}: no IPv4 address ({exc})") from exc
    return socket.inet_ntoa(answer[20:24])
