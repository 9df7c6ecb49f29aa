"""The job's secret and the proof that every rank holds it: an authenticated rendezvous.

PyTorch's TCPStore accepts any client that reaches its port, and a process group trusts
whoever registered in the store as rank r. Another user on a shared node who knows the port
could join as a missing rank, receive the weights and send gradients. hpcdist gives each job
a secret (``protocol.SECRET_VAR`` names its 0600 file; submit or the batch script creates
it before any rank starts), derives the port from it (not from the public job id), and
before anything else crosses the group each rank proves that it holds the secret:

1. every rank all-gathers a fresh random nonce (so no proof can be replayed);
2. every rank all-gathers HMAC-SHA256(secret, job id | rank | all nonces);
3. every rank checks every proof; one wrong proof stops the job with one line.

Before all that, the ranks meet in the store under keys derived from the secret
(``store_prefix``): a stranger who reaches the port (it can be scanned for) registers under
keys no rank reads, is never part of the group, and waits alone until its own timeout; the
job goes on as if it had not come. Where the store runs, rank 0 says in one line which
connections came from outside the job's nodes (``stranger_note``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hpcdist.errors import UserError
from hpcdist.facts.protocol import SECRET_HEX_DIGITS, SECRET_VAR
from hpcdist.state.private import create_exclusive
from hpcdist.state.trustedfile import read_private

NONCE_BYTES = 16
PROOF_BYTES = 32  # SHA-256
_SECRET = re.compile(rf"[0-9a-f]{{{SECRET_HEX_DIGITS}}}")


class RendezvousAuthError(RuntimeError):
    """A process in the group could not prove that it holds the job's secret."""


def new_secret() -> str:
    return secrets.token_hex(SECRET_HEX_DIGITS // 2)


def create_secret_file(path: Path) -> str:
    """A new secret in a new 0600 file (never over an existing file or through a link)."""
    secret = new_secret()
    create_exclusive(path, secret + "\n")
    return secret


def parse_secret(text: str, source: str) -> str:
    secret = text.strip()
    if not _SECRET.fullmatch(secret):
        raise UserError(
            f"job secret {source!r} holds no secret ({len(secret)} characters); expected "
            f"{SECRET_HEX_DIGITS} hex digits as hpcdist writes them"
        )
    return secret


def load_secret(env: Mapping[str, str]) -> str | None:
    """The job's secret from the file named in ``$HPCDIST_SECRET_FILE``; None if unset. The
    file must be this user's alone (one line saying why not, otherwise)."""
    path = env.get(SECRET_VAR, "").strip()
    if not path:
        return None
    try:
        text = read_private(Path(path), "job secret")
    except OSError as exc:
        raise UserError(f"{SECRET_VAR}={path!r} cannot be read ({exc.strerror})") from exc
    return parse_secret(text, path)


def proof(secret: str, job_id: str, rank: int, challenge: bytes) -> bytes:
    """What rank ``rank`` sends to show it holds ``secret``: bound to the job, the rank and
    this rendezvous's nonces."""
    message = f"hpcdist-rendezvous|{job_id}|{rank}|".encode() + challenge
    return hmac.new(bytes.fromhex(secret), message, hashlib.sha256).digest()


def bad_proofs(secret: str, job_id: str, challenge: bytes, proofs: Iterable[bytes]) -> list[int]:
    """The ranks whose proof is wrong (constant-time comparisons)."""
    return [
        rank
        for rank, given in enumerate(proofs)
        if not hmac.compare_digest(given, proof(secret, job_id, rank, challenge))
    ]


def authenticate(secret: str, job_id: str, rank: int, world_size: int, device: Any) -> None:
    """Steps 1-3 of the module's docstring over the freshly made default group; raises
    RendezvousAuthError naming the ranks that failed. Fixed-size tensors only: nothing
    a stranger sends is unpickled."""
    import torch
    import torch.distributed as dist

    def gather(data: bytes) -> list[bytes]:
        mine = torch.tensor(list(data), dtype=torch.uint8, device=device)
        parts = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(parts, mine)
        return [bytes(part.cpu().tolist()) for part in parts]

    challenge = b"".join(gather(os.urandom(NONCE_BYTES)))
    proofs = gather(proof(secret, job_id, rank, challenge))
    bad = bad_proofs(secret, job_id, challenge, proofs)
    if bad:
        who = ", ".join(str(r) for r in bad)
        raise RendezvousAuthError(
            f"rank(s) {who} did not prove that they hold this job's secret: a process "
            "outside the job joined its rendezvous; stopped before any weights or gradients "
            "were exchanged"
        )


# ---------------------------------------------------------------- who is connected


def established_peers(proc_net_tcp: str, port: int) -> list[str]:
    """Remote addresses of the ESTABLISHED connections to local ``port``, from the text of
    /proc/net/tcp or /proc/net/tcp6. Pure."""
    peers = []
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != "01":
            continue
        local, remote = fields[1], fields[2]
        if int(local.rsplit(":", 1)[1], 16) != port:
            continue
        peers.append(_proc_address(remote.rsplit(":", 1)[0]))
    return peers


def _proc_address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def foreign_peers(peers: Iterable[str], allowed: Iterable[str]) -> list[str]:
    """Peers that are neither loopback nor one of ``allowed`` (the job's nodes' addresses)."""
    ok = set(allowed)
    return sorted({p for p in peers if p not in ok and not ipaddress.ip_address(p).is_loopback})


def node_addresses(hosts: Iterable[str]) -> set[str]:
    """Every address the job's node names resolve to (those that do not resolve add none)."""
    found: set[str] = set()
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError:
            continue
        found.update(str(info[4][0]) for info in infos)
    return found


def store_prefix(secret: str | None) -> str:
    """The prefix of every key the ranks write to the rendezvous store: derived from the
    job's secret (torch's own, ``default_pg``, without one)."""
    if secret is None:
        return "default_pg"
    mac = hmac.new(secret.encode(), b"hpcdist rendezvous keys", hashlib.sha256)
    return f"pg-{mac.hexdigest()[:32]}"


def stranger_note(port: int, hosts: Iterable[str]) -> str:
    """On the store's host: one line naming connections to ``port`` from none of ``hosts``
    ("" if there are none). They cannot see the job's keys: said, not fatal."""
    hosts = list(hosts)
    found = strangers(port, hosts)
    if not found:
        return ""
    return (
        f"Note: the rendezvous port {port} has connections from {', '.join(found)}, which "
        f"is none of the job's nodes ({', '.join(hosts)}): ignored, they cannot reach this "
        "job's keys"
    )


def strangers(port: int, hosts: Iterable[str]) -> list[str]:
    """On the store's host: the addresses connected to ``port`` that are none of ``hosts``."""
    peers: list[str] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            peers += established_peers(Path(table).read_text(), port)
        except OSError:
            continue  # not Linux, or no IPv6: nothing to check there
    return foreign_peers(peers, node_addresses(hosts))
