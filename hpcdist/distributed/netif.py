"""Which network interface a rank's gloo and NCCL sockets use: the one its route to rank 0
goes through, unless the job names one.

gloo (``GLOO_SOCKET_IFNAME``) and NCCL's bootstrap (``NCCL_SOCKET_IFNAME``) otherwise pick
an interface themselves: gloo the address of the host's name, which on many sites is a
management network, or loopback where ``/etc/hosts`` maps the name to 127.0.1.1; NCCL the
first interface that is not loopback or docker, which may reach no other node. The
interface that certainly reaches rank 0 is the one the kernel routes rank 0's address
through: asked with a UDP socket's ``connect`` (no packet is sent), its local address names
the interface. On rank 0's own node that is the interface holding rank 0's address; on a
testbed whose nodes share one network stack, loopback.

A variable the job already has (the user's ``--env``, a profile's ``gloo_env``/``nccl_env``,
the site's environment) always wins. Standard library only: it runs in every rank, and in
``rankenv`` before commands that may not use torch at all.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass

IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
# Why rankenv chose the interface variables a command starts with: a rank that calls
# setup_distributed then says so, not that the job named them.
REASON_VAR = "HPCDIST_NETWORK_REASON"
_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B


@dataclass(frozen=True)
class RankNetwork:
    """The interface a rank's sockets use and why: ``chosen`` are the variables this
    module set (empty where the job named its own, or where no route was found)."""

    interface: str | None
    reason: str
    chosen: Mapping[str, str]

    def describe(self) -> str:
        """The rank line's words: ``net eth0 (10.0.0.2 on the route to rank 0 at node1)``."""
        return f"net {self.interface} ({self.reason})" if self.interface else f"net: {self.reason}"


def _ifreq(sock: socket.socket, request: int, name: str) -> str | None:
    packed = struct.pack("256s", name.encode()[:15])
    try:
        answer = fcntl.ioctl(sock.fileno(), request, packed)
    except OSError:
        return None  # no IPv4 address on this interface
    return socket.inet_ntoa(answer[20:24])


def interface_addresses() -> dict[str, tuple[str, str]]:
    """Every interface with an IPv4 address: name -> (address, netmask)."""
    found: dict[str, tuple[str, str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            address = _ifreq(sock, _SIOCGIFADDR, name)
            netmask = _ifreq(sock, _SIOCGIFNETMASK, name)
            if address is not None and netmask is not None:
                found[name] = (address, netmask)
    return found


def interface_holding(address: str, interfaces: Mapping[str, tuple[str, str]]) -> str | None:
    """The interface whose address is ``address``, else whose network holds it. Pure."""
    for name, (own, _) in interfaces.items():
        if own == address:
            return name
    target = ipaddress.IPv4Address(address)
    for name, (own, netmask) in interfaces.items():
        if target in ipaddress.IPv4Network(f"{own}/{netmask}", strict=False):
            return name
    return None


def route_source(master_addr: str) -> str | None:
    """This host's address on the route to ``master_addr`` (IPv4); None: no route, or a
    name that does not resolve here."""
    try:
        infos = socket.getaddrinfo(master_addr, None, socket.AF_INET, socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((infos[0][4][0], 9))  # no packet is sent: only the route is chosen
            return str(probe.getsockname()[0])
    except (OSError, IndexError):
        return None


def rank_network(master_addr: str, environ: Mapping[str, str]) -> RankNetwork:
    """The interface for this rank's sockets; the variables to set are in ``chosen``."""
    named = {var: environ[var] for var in IFNAME_VARS if environ.get(var, "").strip()}
    source = route_source(master_addr) if len(named) < len(IFNAME_VARS) else None
    name = interface_holding(source, interface_addresses()) if source else None
    chosen = {var: name for var in IFNAME_VARS if var not in named} if name else {}
    gloo = IFNAME_VARS[0]
    if gloo in named:
        reason = environ.get(REASON_VAR, "").strip() or f"{gloo} set by the job"
        return RankNetwork(named[gloo], reason, chosen)
    if name is None:
        why = f"no route to rank 0 at {master_addr!r} found; gloo and NCCL choose"
        return RankNetwork(None, why, {})
    return RankNetwork(name, f"{source} on the route to rank 0 at {master_addr}", chosen)


def network_environ(master_addr: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The interface variables the job did not set, and why they were chosen (for a
    command started with them: ``rankenv``)."""
    network = rank_network(master_addr, environ)
    if not network.chosen or IFNAME_VARS[0] not in network.chosen:
        return dict(network.chosen)
    return {**network.chosen, REASON_VAR: network.reason}


def use_rank_network(master_addr: str, environ: Mapping[str, str]) -> RankNetwork:
    """``rank_network``, with the chosen variables set in this process's environment, where
    gloo and NCCL read them when a process group is made (a variable set meanwhile wins)."""
    network = rank_network(master_addr, environ)
    for var, value in network.chosen.items():
        os.environ.setdefault(var, value)
    return network
