"""The job's secret, the rank proofs and the store-peer check (pure parts)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdist.distributed.jobsecret import (
    PROOF_BYTES,
    bad_proofs,
    create_secret_file,
    established_peers,
    foreign_peers,
    load_secret,
    parse_secret,
    proof,
)
from hpcdist.errors import UserError
from hpcdist.facts.protocol import SECRET_VAR
from hpcdist.state.private import PrivacyError

SECRET = "ab" * 32
OTHER = "cd" * 32
CHALLENGE = bytes(range(32))


def test_proof_is_hmac_bound_to_secret_job_rank_and_challenge() -> None:
    base = proof(SECRET, "123", 1, CHALLENGE)
    assert len(base) == PROOF_BYTES
    assert proof(SECRET, "123", 1, CHALLENGE) == base
    for changed in (
        proof(OTHER, "123", 1, CHALLENGE),
        proof(SECRET, "124", 1, CHALLENGE),
        proof(SECRET, "123", 0, CHALLENGE),
        proof(SECRET, "123", 1, CHALLENGE[::-1]),
    ):
        assert changed != base


def test_bad_proofs_names_the_ranks_without_the_secret() -> None:
    proofs = [proof(SECRET, "7", r, CHALLENGE) for r in range(4)]
    assert bad_proofs(SECRET, "7", CHALLENGE, proofs) == []
    proofs[2] = proof(OTHER, "7", 2, CHALLENGE)  # a stranger in rank 2's place
    proofs[3] = proofs[1]  # a replay of another rank's proof
    assert bad_proofs(SECRET, "7", CHALLENGE, proofs) == [2, 3]


@given(st.binary(min_size=PROOF_BYTES, max_size=PROOF_BYTES))
def test_a_made_up_proof_fails(guess: bytes) -> None:
    assert bad_proofs(SECRET, "7", CHALLENGE, [guess]) == [0]


def test_secret_file_is_new_0600_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    secret = create_secret_file(path)
    assert len(secret) == 64 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_secret({SECRET_VAR: str(path)}) == secret
    assert load_secret({}) is None
    with pytest.raises(PrivacyError):
        create_secret_file(path)  # never over an existing file


def test_a_secret_others_can_write_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    create_secret_file(path)
    os.chmod(path, 0o622)
    with pytest.raises(PrivacyError, match=r"job secret .* writable by group and others"):
        load_secret({SECRET_VAR: str(path)})


@pytest.mark.parametrize("text", ["", "abc", "g" * 64, "AB" * 32, "ab" * 33])
def test_malformed_secret_is_one_line(text: str) -> None:
    with pytest.raises(UserError, match="expected 64 hex digits"):
        parse_secret(text, "/x")


def test_missing_secret_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot be read"):
        load_secret({SECRET_VAR: str(tmp_path / "none")})


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7A69 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1
   1: 0100007F:7A69 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2
   2: 0A00000A:7A69 0B00000A:C000 01 00000000:00000000 00:00000000 00000000     0        0 3
   3: 0A00000A:7A6A 0C00000A:C000 01 00000000:00000000 00:00000000 00000000     0        0 4
   4: 0A00000A:7A69 0D00000A:C001 06 00000000:00000000 00:00000000 00000000     0        0 5
"""
PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 0000000000000000FFFF00000A00000A:7A69 0000000000000000FFFF00000E00000A:C002 01
   1: 00000000000000000000000001000000:7A69 00000000000000000000000001000000:C003 01
"""


def test_established_peers_of_the_store_port() -> None:
    # 0x7A69 = 31337; listening (0A), other ports and TIME_WAIT (06) rows are not peers.
    assert established_peers(PROC_NET_TCP, 31337) == ["127.0.0.1", "10.0.0.11"]
    assert established_peers(PROC_NET_TCP6, 31337) == ["10.0.0.14", "::1"]


@pytest.mark.parametrize(
    ("peers", "allowed", "strangers"),
    [
        (["127.0.0.1", "10.0.0.11"], ["10.0.0.11"], []),
        (["127.0.0.1", "::1"], [], []),
        (["10.0.0.11", "10.0.0.99"], ["10.0.0.11"], ["10.0.0.99"]),
        (["10.0.0.99", "10.0.0.99"], [], ["10.0.0.99"]),
    ],
)
def test_foreign_peers(peers: list[str], allowed: list[str], strangers: list[str]) -> None:
    assert foreign_peers(peers, allowed) == strangers


RANK_SCRIPT = """
import sys
from hpcdist.distributed import DistributedInitError, setup_distributed, cleanup_distributed
try:
    setup_distributed(20)
except DistributedInitError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
print("JOINED", flush=True)
cleanup_distributed()
"""


@pytest.mark.parametrize("same_secret", [True, False], ids=["same-secret", "stranger"])
@pytest.mark.slow
def test_two_ranks_join_only_with_the_same_secret(tmp_path: Path, same_secret: bool) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    files = [tmp_path / "s0", tmp_path / "s1"]
    create_secret_file(files[0])
    if same_secret:
        files[1] = files[0]
    else:
        create_secret_file(files[1])
    procs = []
    for rank in range(2):
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            SECRET_VAR: str(files[rank]),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=90)[0] for p in procs]
    if same_secret:
        assert [p.returncode for p in procs] == [0, 0], outs
        assert all("JOINED" in out for out in outs)
    else:
        # Each registers under keys only its own secret names: neither ever meets the other.
        assert [p.returncode for p in procs] == [3, 3], outs
        assert all("REFUSED" in out and "JOINED" not in out for out in outs), outs


def test_store_keys_are_named_by_the_secret() -> None:
    from hpcdist.distributed.jobsecret import store_prefix

    first, second = "0" * 64, "1" * 64
    assert store_prefix(None) == "default_pg"  # torch's own, as env:// does
    assert store_prefix(first) == store_prefix(first) != store_prefix(second)
    assert first not in store_prefix(first) and store_prefix(first).startswith("pg-")


def test_connections_from_outside_the_job_are_said_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcdist.distributed import jobsecret

    monkeypatch.setattr(jobsecret, "strangers", lambda port, hosts: ["10.0.0.9"])
    note = jobsecret.stranger_note(29400, ["node1", "node2"])
    assert note == (
        "Note: the rendezvous port 29400 has connections from 10.0.0.9, which is none of the "
        "job's nodes (node1, node2): ignored, they cannot reach this job's keys"
    )
    monkeypatch.setattr(jobsecret, "strangers", lambda port, hosts: [])
    assert jobsecret.stranger_note(29400, ["node1"]) == ""
