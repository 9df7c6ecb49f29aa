"""How submit chooses SLURM's transport: --transport, then $HPCDIST_TRANSPORT, then the
profile's ``transport:`` and ``slurmrestd:`` keys (docs/site.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def profile(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text("partition: debug\ncores_per_node: 2\nmax_nodes: 4\n" + body)
    path.chmod(0o600)
    return path


def submit(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HPCDIST_TRANSPORT",))}
    clean.pop("HPCDIST_SLURMRESTD", None)
    clean.update({"SLURM_JWT": "t0ken", "HPCDIST_HOME": str(tmp_path / "state"), **env})
    return subprocess.run(
        [*HPCDIST, "submit", "--nodes", "1", *argv],
        env=clean,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_profiles_transport_and_address_are_taken_when_nothing_else_says(
    tmp_path: Path,
) -> None:
    port = closed_port()
    site = profile(tmp_path, f"transport: rest\nslurmrestd: http://127.0.0.1:{port}\n")
    done = submit(tmp_path, "--profile", str(site))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith(
        f"hpcdist: error: slurmrestd at http://127.0.0.1:{port} could not be reached: "
    )
    assert done.stderr.count("\n") == 1
    assert "t0ken" not in done.stderr


def test_the_environment_wins_over_the_profile_and_the_flag_over_both(tmp_path: Path) -> None:
    port, other = closed_port(), closed_port()
    site = profile(tmp_path, f"transport: cli\nslurmrestd: http://127.0.0.1:{port}\n")
    env_first = submit(
        tmp_path,
        "--profile",
        str(site),
        HPCDIST_TRANSPORT="rest",
        HPCDIST_SLURMRESTD=f"http://127.0.0.1:{other}",
    )
    assert f"slurmrestd at http://127.0.0.1:{other} could not be reached" in env_first.stderr
    flag_first = submit(
        tmp_path, "--transport", "rest", "--profile", str(site), HPCDIST_TRANSPORT="cli"
    )
    assert f"slurmrestd at http://127.0.0.1:{port} could not be reached" in flag_first.stderr


@pytest.mark.parametrize("value", ["REST", "http", "''", "[rest]"])
def test_a_transport_key_that_is_neither_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    site = profile(tmp_path, f"transport: {value}\n")
    done = submit(tmp_path, "--profile", str(site), "--dry-run")
    shown = {"''": "''", "[rest]": "['rest']"}.get(value, repr(value))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"hpcdist: error: profile {str(site)!r}: transport must be cli or rest, got {shown}\n"
    )
