"""A checkpoint replaced between rank 0's read and another rank's: every rank of the job
ends with the same one line and exit code 2, none with a traceback of a peer gone; and a
rank whose peer ended first for any other reason says so in one line.

Two real ranks over gloo on this machine, as a job step starts them; the race is made exact
with ``HPCDIST_TEST_PAUSE``: rank 0 stops right after it opened and checked the checkpoint,
the test replaces the file, and rank 1 reads the replacement.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ufsemulator.__main__ as ufsemulator_main
from hpcdist.state.trustedfile import PAUSE_VAR
from tests.ufsemulator.training.test_training import LAUNCH_VARS, REPO, SMOKE, free_port

_TORCH_LOG = re.compile(r"^\[[WI]\d{4} ")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*LAUNCH_VARS, "HPCDIST_HOME")}
    env.update(PYTHONPATH=str(REPO), HPCDIST_DATA_DIR=str(tmp_path / "data"), OMP_NUM_THREADS="1")
    return env


def _train(run_dir: Path, epochs: int) -> list[str]:
    train = [sys.executable, "-m", "ufsemulator", "train", "--config", str(SMOKE)]
    return [*train, "--run-dir", str(run_dir), "--epochs", str(epochs)]


def _start_ranks(tmp_path: Path, run_dir: Path, hooks: Path) -> list[subprocess.Popen[str]]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = _env(tmp_path)
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE="2",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
        )
        if rank == 0:
            env[PAUSE_VAR] = f"resume-read:{hooks}"
        procs.append(
            subprocess.Popen(
                _train(run_dir, 2),
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def _wait_for(path: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 180
    while not path.exists():
        if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
            outputs = [proc.communicate(timeout=60) for proc in procs]
            raise AssertionError(f"{path} never appeared: {outputs}")
        time.sleep(0.1)


@pytest.mark.slow
def test_a_checkpoint_replaced_between_two_ranks_reads_ends_every_rank_in_one_line(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.run(
        _train(run_dir, 1), cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True
    )
    assert first.returncode == 0, first.stdout + first.stderr
    checkpoint = run_dir / "checkpoint.pt"
    accepted = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    procs = _start_ranks(tmp_path, run_dir, hooks)
    try:
        _wait_for(hooks / "resume-read.ready", procs)  # rank 0 holds the checked file open
        planted = run_dir / "planted.pt"
        planted.write_bytes(checkpoint.read_bytes() + b"\0")
        planted.chmod(0o644)
        os.replace(planted, checkpoint)
        (hooks / "resume-read.go").touch()
        outputs = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    replaced = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    said = (
        f"error: checkpoint '{checkpoint}' read by rank 1 has SHA-256 {replaced[:12]}..., not "
        f"the {accepted[:12]}... rank 0 accepted: it was replaced meanwhile; refusing to resume"
    )
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 2, (rank, out, err)
        # All it says, but for torch's own C++ log lines (its store's note of a client gone).
        assert [ln for ln in err.splitlines() if not _TORCH_LOG.match(ln)] == [said], (rank, err)
        assert "Traceback" not in out + err, (rank, err)
    # Neither rank trained on, so neither wrote: the replacement is as it was put there.
    assert "Epoch" not in outputs[0][0]
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == replaced


GLOO_GONE = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [10.0.0.2]:48050. This is typically caused by a remote worker crashing. Check "
    "the logs of the remote worker before reporting an error."
)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (GLOO_GONE, "Connection closed by peer [10.0.0.2]:48050"),
        ("[enforce fail at pair.cc:421] Connection reset by peer", "Connection reset by peer"),
    ],
)
def test_a_rank_whose_peer_ended_first_says_so_in_one_line(
    raised: str, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def train(args: object) -> int:
        raise RuntimeError(raised)

    monkeypatch.setattr(ufsemulator_main, "_train", train)
    assert ufsemulator_main.main(["train"]) == 1
    assert capsys.readouterr().err == (
        f"error: another rank of this job ended first ({said}); its own line says why\n"
    )


def test_a_runtime_error_of_the_ranks_own_is_not_taken_for_a_peer_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def train(args: object) -> int:
        raise RuntimeError("emulator diverged at step 7")

    monkeypatch.setattr(ufsemulator_main, "_train", train)
    with pytest.raises(RuntimeError, match=r"^emulator diverged at step 7$"):
        ufsemulator_main.main(["train"])
