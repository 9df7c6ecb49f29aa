"""The communication check with real processes: two gloo ranks started the way torchrun would.

The SLURM versions of these (sbatch, 4 nodes, two jobs at once) live in
tests/integration/test_commcheck_slurm.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hpcdist.distributed import cleanup_distributed, commcheck

REPO = Path(__file__).resolve().parents[2]
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rank_env(rank: int, world: int, addr: str, port: int) -> dict[str, str]:
    """This test process's environment minus any launcher's, plus what torchrun would set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SUBMITIT_")) and k not in _LAUNCHER_VARS
    }
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
    )
    return env


def run_ranks(
    ranks: list[int], world: int, addr: str, port: int, timeout_s: float
) -> tuple[list[subprocess.CompletedProcess[str]], float]:
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "hpcdist.distributed.commcheck", "--timeout", str(timeout_s)],
            env=rank_env(rank, world, addr, port),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in ranks
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout_s + 90)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results, time.monotonic() - start


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.slow
def test_commcheck_passes_on_two_local_gloo_ranks() -> None:
    (rank0, rank1), _ = run_ranks([0, 1], 2, "127.0.0.1", free_port(), timeout_s=60)
    assert (rank0.returncode, rank1.returncode) == (0, 0), rank0.stderr + rank1.stderr
    (verdict,) = lines_starting(rank0.stdout, "PASS")
    assert verdict.startswith("PASS: world size 2, gloo backend, master 127.0.0.1:")
    for step in ("init", "all_reduce", "broadcast", "barrier"):
        assert f"{step} " in verdict and " ms" in verdict
    assert lines_starting(rank1.stdout, "PASS") == []  # one verdict, from rank 0
    assert lines_starting(rank0.stdout, "[Rank 0]")
    assert lines_starting(rank1.stdout, "[Rank 1]")
    assert "Distributed training initialized: gloo backend, 2 processes" in rank0.stdout
    assert "Distributed training initialized" not in rank1.stdout


@pytest.mark.slow
def test_commcheck_passes_under_torchrun() -> None:
    # torchrun's agent already serves the store on MASTER_PORT: every worker must be a client.
    env = {k: v for k, v in rank_env(0, 1, "127.0.0.1", 1).items() if k not in _LAUNCHER_VARS}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"),
            *("-m", "hpcdist.distributed.commcheck", "--timeout", "60"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (verdict,) = lines_starting(proc.stdout, "PASS")
    assert verdict.startswith("PASS: world size 2, gloo backend")
    assert "failed to bind" not in proc.stderr


@pytest.mark.slow
def test_commcheck_unreachable_master_fails_with_diagnosis_within_timeout() -> None:
    # 10.255.255.1 is a non-routed address: nothing there will ever answer.
    timeout_s, port = 8.0, free_port()
    results, elapsed = run_ranks([0, 1], 2, "10.255.255.1", port, timeout_s=timeout_s)
    # Ended by the timeout, not a hang: starting Python and torch twice on a loaded machine
    # may take long, so the bound is wide.
    assert elapsed < timeout_s + 60, f"failed only after {elapsed:.0f} s (timeout {timeout_s} s)"
    for result in results:
        assert result.returncode != 0
        (failure,) = lines_starting(result.stdout, "FAIL")
        assert f"10.255.255.1:{port}" in failure
        assert "GLOO_SOCKET_IFNAME" in failure and "NCCL_SOCKET_IFNAME" in failure
        assert lines_starting(result.stdout, "PASS") == []


def test_commcheck_rank_without_its_master_fails_within_timeout() -> None:
    # Only rank 1 starts; nothing listens on the master's port.
    port = free_port()
    (rank1,), elapsed = run_ranks([1], 2, "127.0.0.1", port, timeout_s=4)
    assert rank1.returncode != 0
    assert elapsed < 4 + 60  # the 4 s timeout, not a hang, on a loaded machine too
    (failure,) = lines_starting(rank1.stdout, "FAIL")
    assert failure.startswith("FAIL: init_process_group: rank 1/2")
    assert f"127.0.0.1:{port}" in failure


def test_commcheck_stale_environment_fails_before_touching_the_network(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in _LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    monkeypatch.delenv("SLURM_NPROCS", raising=False)
    assert commcheck.main([]) == 1
    (failure,) = lines_starting(capsys.readouterr().out, "FAIL")
    assert failure.startswith("FAIL: environment:") and "SLURM_NTASKS" in failure


@pytest.mark.parametrize("value", ["0", "-3"])
def test_commcheck_rejects_a_non_positive_timeout(value: str) -> None:
    with pytest.raises(SystemExit) as info:
        commcheck.main(["--timeout", value])
    assert info.value.code == 2


# ------------------------------------------------------------------ in process, 1 rank

_EXPORTED = (*_LAUNCHER_VARS, "TORCH_CPP_LOG_LEVEL")


@pytest.fixture
def single_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables, and whatever commcheck exports is undone afterwards."""
    import torch

    for name in list(os.environ):
        if name.startswith(("SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(name)
    for name in _EXPORTED:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))
    yield
    cleanup_distributed()


def test_commcheck_single_process_passes(
    single_process: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert commcheck.main(["--timeout", "30"]) == 0
    (verdict,) = lines_starting(capsys.readouterr().out, "PASS")
    assert verdict.startswith("PASS: world size 1, gloo backend, master 127.0.0.1:")


@pytest.mark.parametrize(
    ("collective", "wrong", "words"),
    [
        ("all_reduce", lambda t, *a, **k: t.mul_(3), "all_reduce returned 3, expected 1"),
        ("broadcast", lambda t, *a, **k: t.fill_(7), "broadcast from rank 0 delivered 7"),
    ],
)
def test_commcheck_reports_a_wrong_result(
    single_process: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    collective: str,
    wrong: Callable[..., object],
    words: str,
) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(dist, collective, wrong)
    assert commcheck.main(["--timeout", "30"]) == 1
    out = capsys.readouterr().out
    (failure,) = lines_starting(out, "FAIL")
    assert words in failure and "master 127.0.0.1:" in failure
    assert lines_starting(out, "PASS") == []


def test_commcheck_watchdog_ends_a_hung_step_with_a_verdict() -> None:
    code = (
        "import time\n"
        "from hpcdist.distributed.commcheck import _Watchdog\n"
        "dog = _Watchdog(lambda: 'rank 1/2, master node1:23456')\n"
        "with dog.step('all_reduce', 0.5):\n"
        "    time.sleep(30)\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    # Ended by the watchdog, not by the step's 30 s sleep (however busy the machine).
    assert time.monotonic() - start < 30
    assert proc.returncode == 1
    assert proc.stdout.startswith(
        "FAIL: all_reduce did not finish within 0.5 s (rank 1/2, master node1:23456)"
    )
    assert "GLOO_SOCKET_IFNAME" in proc.stdout


# Rank 2 stalls before it reaches the all_reduce (as a rank on a sick node would): its
# arrival is never noted, and it sleeps there until its own watchdog ends it.
_STALLS = """\
import sys, time
from hpcdist.distributed import commcheck, rollcall
noted = rollcall.RollCall.answer
def arrive(self, step):
    if step == "all_reduce":
        time.sleep(600)
    noted(self, step)
rollcall.RollCall.answer = arrive
raise SystemExit(commcheck.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_commcheck_names_the_rank_and_node_that_never_reached_the_step() -> None:
    port, world, timeout = free_port(), 3, 4
    procs = []
    for rank in range(world):
        env = {**rank_env(rank, world, "127.0.0.1", port), "SLURMD_NODENAME": f"node{rank + 1}"}
        code = ["-c", _STALLS] if rank == 2 else ["-m", "hpcdist.distributed.commcheck"]
        procs.append(
            subprocess.Popen(
                [sys.executable, *code, "--timeout", str(timeout)],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        outs.append((proc.returncode, out, err))
    codes = [code for code, _, _ in outs]
    assert codes == [1, 1, 1], outs
    # Rank 0 (it serves the group's store) names rank 2 and its node, after its FAIL line.
    out0 = outs[0][1]
    (failure,) = lines_starting(out0, "FAIL")
    assert "rank 0/3 on node1" in failure, out0
    assert lines_starting(out0, "hpcdist: commcheck:") == [
        "hpcdist: commcheck: rank 2 on node3 never reached all_reduce"
    ], out0
    # The stalled rank's own watchdog ends it (rank 0's store is gone by then: no names).
    assert lines_starting(outs[2][1], "FAIL: all_reduce did not finish within"), outs[2][1]
    # The bad-node record reads it: node3 is the node the run's next piece is kept off.
    from hpcdist.distributed.badnodes import named_nodes

    assert named_nodes(out0, ["node1", "node2", "node3"]) == [
        ("node3", "rank 2 never reached all_reduce")
    ]
