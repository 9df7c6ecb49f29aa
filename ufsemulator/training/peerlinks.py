"""TCP links between the job's CPU ranks, made once, that admit only the job's own ranks.

The gradient exchanges (``meshreduce``, ``halvingreduce``) talk over these links instead of
through gloo's threads. Each rank listens on a new port; the addresses, ports and one
random token per listener travel through the process group, which has already checked
that every rank holds the job's secret (``hpcdist.distributed.jobsecret``). A connection is
admitted only if it opens with the listener's token and the number of a rank that is still
expected.

Anyone who can reach the port may still connect. Such a stranger is never waited on: the
listener serves every connection at once (``poll``), closes a connection that has not
proved itself within ``HELLO_TIMEOUT_S`` or sends anything else, and stops listening as
soon as every expected rank is in, whatever strangers are still connected. A stranger so
costs the job no time while the ranks are arriving, and at most ``HELLO_TIMEOUT_S`` of
holding a file descriptor.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hpcdist.distributed import DistContext, collective_timeout_s

CONNECT_TIMEOUT_S = 60.0
HELLO_TIMEOUT_S = 1.0  # a connection that has not proved itself by then is closed
MAX_PENDING = 64  # unproven connections held at once; beyond, the oldest is closed
# A peer that is alive but never sends must not hold the others for ever: the exchanges
# wait the job's --collective-timeout, as the group's own collectives do; this long without.
EXCHANGE_TIMEOUT_S = 600.0


def exchange_timeout_s() -> float:
    """Seconds an exchange waits for a silent peer: the job's ``--collective-timeout``,
    else ``EXCHANGE_TIMEOUT_S``."""
    return collective_timeout_s(os.environ, default=EXCHANGE_TIMEOUT_S)


HELLO = struct.Struct("!I32s")  # the connecting rank, the listener's token
# Look without sleeping this long before sleeping in poll: a peer on cores of its own
# arrives within microseconds, while waking a sleeping thread (on a virtual machine, its
# virtual CPU) costs tens to hundreds of them, in every round the peer came late (2 log2 N
# rounds for halving). A rank on cores of its own waits spinning for up to SPIN_OWN_S; one
# that shares its cores with the host's other ranks only SPIN_SHARED_S, since its spinning
# would take the core a late peer needs.
SPIN_SHARED_S = 200e-6
SPIN_OWN_S = 5e-3


def spin_for(host_cpus: Sequence[frozenset[int]]) -> float:
    """How long a rank spins before it sleeps in ``poll``, from the CPU sets its host's
    ranks may run on (``sched_getaffinity``, one set a rank): ``SPIN_OWN_S`` where there
    are at least as many CPUs among them as ranks (bound to cores of their own, as
    ``srun --cpu-bind=cores`` does, or unbound in a cgroup with a CPU for each), else
    ``SPIN_SHARED_S``. Pure."""
    cpus = frozenset().union(*host_cpus)
    return SPIN_OWN_S if len(host_cpus) <= len(cpus) else SPIN_SHARED_S


@dataclass(frozen=True)
class Links:
    """A rank's admitted links (peer rank -> socket) and how long it spins on them."""

    socks: dict[int, socket.socket]
    spin_s: float


def connect_links(ctx: DistContext, wanted: set[int]) -> Links:
    """One admitted, non-blocking TCP link to each rank of ``wanted`` (a symmetric
    relation: rank a wants b exactly when b wants a); the higher rank calls, the lower
    accepts. Collective: every rank returns, or every rank raises. The ranks also tell
    each other their host and CPUs, for the spin (``spin_for``)."""
    rank, world = ctx.env.rank, ctx.env.world_size
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    token = secrets.token_bytes(32)
    error = ""
    try:
        listener.bind((local_address(ctx.env.master_addr, os.environ), 0))
        listener.listen(max(world, 16))
        address: tuple[str, int, bytes] | None = (*listener.getsockname()[:2], token)
    except OSError as exc:
        address, error = None, f"cannot listen: {exc}"
    # The machine's own name, not SLURM's node name: CPU numbers are the machine's, and a
    # testbed's virtual nodes share one machine's CPUs.
    me = (socket.gethostname(), frozenset(os.sched_getaffinity(0)))
    gathered: list[tuple[tuple[str, int, bytes] | None, tuple[str, frozenset[int]]]] = [
        (None, me)
    ] * world
    dist.all_gather_object(gathered, (address, me))
    addresses = [each for each, _ in gathered]
    spin = spin_for([cpus for _, (node, cpus) in gathered if node == me[0]])
    peers: dict[int, socket.socket] = {}
    try:
        if any(a is None for a in addresses):
            raise RuntimeError(error or "another rank could not listen")
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for peer in sorted(p for p in wanted if p < rank):  # lower ranks accept
            host, port, their_token = addresses[peer]  # type: ignore[misc]
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
            peers[peer] = sock
            sock.sendall(HELLO.pack(rank, their_token))
        peers.update(accept_ranks(listener, token, {p for p in wanted if p > rank}, deadline))
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
    return Links(peers, spin)


@dataclass
class _Unproven:
    sock: socket.socket
    since: float
    hello: bytes = b""


def accept_ranks(
    listener: socket.socket,
    token: bytes,
    expected: set[int],
    deadline: float,
    clock: Callable[[], float] = time.monotonic,
) -> dict[int, socket.socket]:
    """The connections of every rank in ``expected``, each proven by its hello; returns as
    soon as the last one is in. Every other connection is closed: a wrong or short hello,
    a rank not expected (or already in), or no hello within ``HELLO_TIMEOUT_S``."""
    listener.setblocking(False)
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    expected, admitted = set(expected), {}
    unproven: dict[int, _Unproven] = {}
    try:
        while expected:
            now = clock()
            if now > deadline:
                raise RuntimeError(f"rank(s) {sorted(expected)} never connected")
            for fd in [fd for fd, u in unproven.items() if now - u.since > HELLO_TIMEOUT_S]:
                _drop(unproven, poller, fd)
            wake = min([deadline, *(u.since + HELLO_TIMEOUT_S for u in unproven.values())])
            for fd, _ in poller.poll(max(1, int(1000 * (wake - now)) + 1)):
                if fd == listener.fileno():
                    _take_new(listener, unproven, poller, clock())
                    continue
                peer = _read_hello(unproven[fd], token, expected)
                if peer is None and len(unproven[fd].hello) < HELLO.size and _alive(unproven[fd]):
                    continue  # part of a hello so far: wait for the rest (or its time)
                sock = unproven[fd].sock
                poller.unregister(fd)
                del unproven[fd]
                if peer is None:
                    sock.close()
                else:
                    expected.discard(peer)
                    admitted[peer] = sock
    finally:
        for fd in list(unproven):
            _drop(unproven, poller, fd)
    return admitted


def _take_new(
    listener: socket.socket, unproven: dict[int, _Unproven], poller: select.poll, now: float
) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        if len(unproven) >= MAX_PENDING:
            _drop(unproven, poller, min(unproven, key=lambda fd: unproven[fd].since))
        unproven[sock.fileno()] = _Unproven(sock, now)
        poller.register(sock, select.POLLIN)


def _read_hello(pending: _Unproven, token: bytes, expected: set[int]) -> int | None:
    """Reads what has arrived of a hello; the rank it proves once complete, else None."""
    try:
        chunk = pending.sock.recv(HELLO.size - len(pending.hello))
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        chunk = b""
    if not chunk:
        pending.since = -float("inf")  # closed by the other end: drop it
        return None
    pending.hello += chunk
    if len(pending.hello) < HELLO.size:
        return None
    return proven_rank(pending.hello, token, expected)


def _alive(pending: _Unproven) -> bool:
    return pending.since != -float("inf")


def _drop(unproven: dict[int, _Unproven], poller: select.poll, fd: int) -> None:
    pending = unproven.pop(fd)
    poller.unregister(fd)
    pending.sock.close()


def proven_rank(hello: bytes, token: bytes, expected: set[int]) -> int | None:
    """The rank a complete hello proves, or None: a wrong token or a rank not expected."""
    if len(hello) != HELLO.size:
        return None
    peer, proof = HELLO.unpack(hello)
    if not secrets.compare_digest(proof, token) or peer not in expected:
        return None
    return int(peer)


def local_address(master_addr: str, environ: Mapping[str, str]) -> str:
    """The address to listen on: that of gloo's interface where the job names one
    (``GLOO_SOCKET_IFNAME``, e.g. a cluster's InfiniBand ``ib0``), else this host's
    address on the route to the master."""
    names = [n.strip() for n in environ.get("GLOO_SOCKET_IFNAME", "").split(",") if n.strip()]
    if names:
        return interface_address(names[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master_addr, 9))  # no packet is sent: only the route is chosen
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux's SIOCGIFADDR)."""
    siocgifaddr = 0x8915
    request = struct.pack("256s", name.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), siocgifaddr, request)
        except OSError as exc:
            raise OSError(f"GLOO_SOCKET_IFNAME {name!r}: no IPv4 address ({exc})") from exc
    return socket.inet_ntoa(answer[20:24])
