"""torch's env:// variables for every rank srun starts (hpcdist.distributed.rankenv), computed
by DistEnv, and DistEnv reading them back as the launcher's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.distributed import DistEnv
from hpcdist.distributed.distenv import RANK_ENV_VAR
from hpcdist.distributed.rankenv import rank_environ
from hpcdist.facts.protocol import SECRET_VAR
from tests.distributed.test_distenv import srun

TORCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _torch(env: dict[str, str]) -> dict[str, str]:
    return {var: env[var] for var in TORCH_VARS}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        # 2 x 2 under srun: rank 3 is node 1's second task; the master is the first node.
        (
            srun(3, 4, "node[1-2]", "2(x2)", local=1, node=1),
            ("3", "1", "4", "2", "1", "1", "node1"),
        ),
        # 3 tasks over 2 nodes (--ntasks 3): the second node holds one.
        (srun(2, 3, "n[1,3]", "2,1", local=0, node=1), ("2", "0", "3", "1", "1", "1", "n1")),
        # submitit's local executor (hpcdist's local srun stand-in).
        (
            {
                "SUBMITIT_LOCAL_GLOBALID": "1",
                "SUBMITIT_LOCAL_LOCALID": "1",
                "SUBMITIT_LOCAL_NTASKS": "2",
                "SUBMITIT_LOCAL_JOB_ID": "77",
            },
            ("1", "1", "2", "2", "0", "0", "127.0.0.1"),
        ),
    ],
    ids=["2x2-srun", "uneven-3-over-2", "local"],
)
def test_every_rank_gets_torchs_variables_from_distenv(
    env: dict[str, str], expected: tuple[str, ...]
) -> None:
    out = rank_environ(env)
    assert tuple(out[var] for var in TORCH_VARS[:-1]) == expected
    assert out["MASTER_PORT"] == str(DistEnv.from_environ(env).master_port)
    assert out[RANK_ENV_VAR] in ("slurm", "submitit-local")


def test_distenv_reads_the_exported_variables_as_the_launchers_own() -> None:
    env = srun(3, 4, "node[1-2]", "2(x2)", local=1, node=1)
    exported = DistEnv.from_environ(rank_environ(env))
    # No conflict for setup_distributed, and the source stays srun's.
    assert exported == DistEnv.from_environ(env)
    assert exported.source == "slurm"


def test_torchrun_started_inside_a_rank_takes_precedence() -> None:
    # A command that runs torchrun (or accelerate launch) itself: its workers' variables win.
    env = rank_environ(srun(0, 2, "node[1-2]", "1(x2)", local=0, node=0))
    env.update(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4", GROUP_RANK="1")
    resolved = DistEnv.from_environ(env)
    assert (resolved.source, resolved.rank, resolved.world_size) == ("torchrun", 5, 8)


def test_a_launchers_variables_are_never_overwritten() -> None:
    env = {**srun(1, 2, "node[1-2]", "1(x2)", local=0, node=1), "RANK": "1", "WORLD_SIZE": "2"}
    assert rank_environ(env) == env


def test_a_single_process_gets_nothing() -> None:
    assert rank_environ({"PATH": "/bin"}) == {"PATH": "/bin"}


def test_the_port_is_the_one_setup_distributed_derives_from_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32 + "\n")
    secret.chmod(0o600)
    env = srun(1, 2, "node[1-2]", "1(x2)", local=0, node=1, **{SECRET_VAR: str(secret)})
    out = rank_environ(env)
    with_secret = DistEnv.from_environ(env, "ab" * 32)
    assert out["MASTER_PORT"] == str(with_secret.master_port)
    assert with_secret.master_port != DistEnv.from_environ(env).master_port
    assert DistEnv.from_environ(out, "ab" * 32) == with_secret


def test_a_stale_export_is_refused_in_one_line() -> None:
    env = {**srun(0, 2, "node[1-2]", "1(x2)", local=0, node=0), "WORLD_SIZE": "8"}
    proc = _run_rankenv(env, "true")
    assert proc.returncode == 2
    assert proc.stderr.startswith("hpcdist: WORLD_SIZE='8' is set without RANK")
    assert len(proc.stderr.splitlines()) == 1


def test_the_command_takes_its_place_with_the_variables() -> None:
    env = srun(1, 2, "node[1-2]", "1(x2)", local=0, node=1)
    code = "import os; print(os.getpid(), os.environ['RANK'], os.environ['LOCAL_RANK'])"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdist.distributed.rankenv", "--", sys.executable, "-c", code],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=60)
    assert out.split() == [str(proc.pid), "1", "0"]  # exec: the same process


def test_a_missing_command_is_a_usage_error() -> None:
    assert _run_rankenv({}, "--").returncode == 2


def _run_rankenv(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    clean = {k: v for k, v in clean.items() if k not in TORCH_VARS}
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.distributed.rankenv", "--", *command],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
