"""Many hosts on one: each rank in a network namespace of its own, joined through a bridge.

Rank r's namespace holds one end of a veth pair, named ``<prefix>n<r>``, with its own
address (10.37.0.0/16); the other end is a port of one bridge in the calling namespace.
Ranks so reach each other only over that link, as separate hosts do over a switch:
interface selection (``GLOO_SOCKET_IFNAME``), the address each exchange listens on, and
the rendezvous at rank 0's address are all exercised. Optionally every rank's link gets a
one-way ``delay`` and a ``rate`` limit (Linux's netem qdisc, where the kernel has
``sch_netem``).

Needs root and pyroute2 (a pure-Python netlink library: ``pip install pyroute2``; no
``ip`` command, which GPU hosts lack). A rank process enters its namespace with
``setns(2)`` before it execs (``enter``), so /sys and /proc stay those of the host.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """The namespaces could not be made here; the message says why."""


@dataclass(frozen=True)
class RankNet:
    """One rank's host: its namespace (a file under /run/netns), interface and address."""

    namespace: str
    ifname: str  # the rank's end of its veth pair
    host_end: str  # the bridge's end
    address: str

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.namespace}"


@dataclass(frozen=True)
class Shaping:
    """netem on every rank's link: one-way ``delay_us``, ``rate_gbit`` (None: no limit)."""

    delay_us: float = 0.0
    rate_gbit: float | None = None


def rank_nets(world: int, prefix: str) -> list[RankNet]:
    """The names and addresses of ``world`` ranks' hosts. Pure."""
    if not 1 <= world <= 250 * 250:
        raise ValueError(f"world must be in [1, 62500], got {world}")
    if len(prefix) + 1 + len(str(world)) > 15:
        raise ValueError(f"prefix {prefix!r} too long for a 15-character interface name")
    return [
        RankNet(
            f"{prefix}-r{r}", f"{prefix}n{r}", f"{prefix}h{r}", f"10.37.{r // 250}.{r % 250 + 1}"
        )
        for r in range(world)
    ]


@contextmanager
def namespaces(
    world: int, shaping: Shaping | None = None, prefix: str | None = None
) -> Iterator[list[RankNet]]:
    """``world`` hosts, each a namespace linked to one bridge; removed however it ends."""
    try:
        import pyroute2  # noqa: F401
    except ImportError as exc:
        raise NetnsError(f"the namespace mode needs pyroute2 ({exc})") from exc
    prefix = prefix or f"hd{os.getpid() % 100000}"
    nets = rank_nets(world, prefix)
    bridge = f"{prefix}br"
    try:
        _build(bridge, nets, shaping)
        yield nets
    finally:
        _remove(bridge, nets)


def _build(bridge: str, nets: list[RankNet], shaping: Shaping | None) -> None:
    from pyroute2 import IPRoute, NetNS, netns

    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=bridge, kind="bridge")
            bridge_index = ipr.link_lookup(ifname=bridge)[0]
            ipr.link("set", index=bridge_index, state="up")
            for net in nets:
                netns.create(net.namespace)
                ipr.link("add", ifname=net.host_end, kind="veth", peer=net.ifname)
                ipr.link(
                    "set", index=ipr.link_lookup(ifname=net.ifname)[0], net_ns_fd=net.namespace
                )
                host_index = ipr.link_lookup(ifname=net.host_end)[0]
                ipr.link("set", index=host_index, master=bridge_index, state="up")
        for net in nets:
            with NetNS(net.namespace) as ns:
                index = ns.link_lookup(ifname=net.ifname)[0]
                ns.addr("add", index=index, address=net.address, prefixlen=16)
                ns.link("set", index=index, state="up")
                ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
                if shaping is not None:
                    _shape(ns, index, shaping)
    except NetnsError:
        raise
    except Exception as exc:
        raise NetnsError(
            f"cannot build {len(nets)} namespaces: {type(exc).__name__}: {exc}"
        ) from exc


def _shape(ns: Any, index: int, shaping: Shaping) -> None:
    options: dict[str, Any] = {"delay": int(shaping.delay_us)}
    if shaping.rate_gbit is not None:
        options["rate"] = f"{round(1000 * shaping.rate_gbit)}mbit"  # pyroute2 reads integers
    try:
        ns.tc("add", "netem", index=index, handle="1:", **options)
    except Exception as exc:
        raise NetnsError(f"netem ({options}) refused: {type(exc).__name__}: {exc}") from exc


def _remove(bridge: str, nets: list[RankNet]) -> None:
    from pyroute2 import IPRoute, netns

    with IPRoute() as ipr:
        for name in [bridge, *(n.host_end for n in nets)]:
            found = ipr.link_lookup(ifname=name)
            if found:
                with suppress(Exception):  # gone with its peer's namespace meanwhile
                    ipr.link("del", index=found[0])
    for net in nets:
        if os.path.exists(net.path):
            with suppress(Exception):
                netns.remove(net.namespace)


def enter(net: RankNet) -> Callable[[], None]:
    """A ``preexec_fn`` that moves the child into ``net``'s namespace before it execs."""

    def move() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(net.path, os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {net.path}")
        finally:
            os.close(fd)

    return move
