"""The emulator training on the testbed through `hpcdist submit`: 1, 2 and 4 nodes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import SlurmCluster, slurm_env

# On one xdist worker: the trainings every test reads, made once for the module.
pytestmark = pytest.mark.xdist_group("test_training_slurm")

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
MESH = "direct exchange over TCP (every rank to every rank)"
RUN_FILES = {
    "checkpoint.pt",
    "heartbeat.json",  # rank 0's progress, for `hpcdist status`
    "checkpoint_timing.json",  # what each checkpoint write took (the warning lead)
    "best_model.pt",
    "loss_curves.svg",
    "training_results.json",
    "model.pt",
    "model.md",  # the model card beside model.pt
}


def _submit(tmp_path: Path, nodes: int) -> subprocess.Popen[str]:
    # The default command: the emulator training with its default config.
    return subprocess.Popen(
        [*HPCDIST, "submit", f"--nodes={nodes}", "--backend=gloo", "--cpus-per-task=1", "--wait"],
        cwd=tmp_path,
        env=slurm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    match = re.search(r"Submitted job (\d+)", out)
    assert match, out
    return match.group(1), out


@pytest.fixture(scope="module")
def trainings(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, tuple[Path, str, str]]:
    """Run the 1- and 2-node trainings side by side (3 nodes), then the 4-node one."""
    folder = tmp_path_factory.mktemp("trainings")
    first = {n: _submit(folder, n) for n in (1, 2)}
    results = {n: _finish(p) for n, p in first.items()}
    results[4] = _finish(_submit(folder, 4))
    return {n: (folder, job_id, out) for n, (job_id, out) in results.items()}


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_training_completes_with_the_specified_log_lines(
    trainings: dict[int, tuple[Path, str, str]], nodes: int
) -> None:
    folder, job_id, out = trainings[nodes]
    status = subprocess.run(
        [*HPCDIST, "status", job_id], cwd=folder, env=slurm_env(), capture_output=True, text=True
    )
    assert status.stdout.splitlines()[0] == f"{job_id} COMPLETED"
    if nodes == 1:  # one process sets up no process group at all
        assert "Single process: no process group" in out
        assert re.search(r"^\[Rank 0\] host node1, device cpu, threads \d+$", out, re.M), out
    else:
        assert f"Distributed training initialized: gloo backend, {nodes} processes" in out
        assert re.search(r"^Master: node1:\d+$", out, re.M), out
    assert re.search(r"^Epoch 1/\d+ - Train: [\d.e-]+, Val: [\d.e-]+$", out, re.M), out
    for rank in range(nodes):
        log = subprocess.run(
            [*HPCDIST, "logs", job_id, "--rank", str(rank)],
            cwd=folder,
            env=slurm_env(),
            capture_output=True,
            text=True,
        ).stdout
        assert re.search(rf"^\[Rank {rank}\] Training samples: \d+$", log, re.M), log
        if rank:
            assert "Epoch 1/" not in log  # the summary lines come from rank 0 alone


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_only_rank_0_wrote_the_run_folder(
    trainings: dict[int, tuple[Path, str, str]], nodes: int
) -> None:
    folder, job_id, _ = trainings[nodes]
    run = folder / "runs" / job_id
    assert {p.name for p in run.iterdir()} == RUN_FILES
    results = json.loads((run / "training_results.json").read_text())
    assert results["world_size"] == nodes
    assert results["backend"] == "gloo"
    # Every testbed node is a host of its own to SLURM: gradients cross "nodes" through
    # the direct exchange, not gloo's all-reduce (one rank has none).
    if nodes > 1:
        assert results["grad_allreduce"] == MESH, results["grad_allreduce"]


def test_one_two_and_four_nodes_reach_comparable_validation_loss(
    trainings: dict[int, tuple[Path, str, str]],
) -> None:
    losses = {}
    for nodes, (folder, job_id, _) in trainings.items():
        results = json.loads((folder / "runs" / job_id / "training_results.json").read_text())
        losses[nodes] = results["best_val_loss"]
    # Same seed and epochs; N ranks take 1/N of the steps, with lr scaled by N (default).
    # Measured on the testbed: 0.00120, 0.00123, 0.00128.
    assert all(loss <= 0.1 for loss in losses.values()), losses
    assert max(losses.values()) <= 2 * min(losses.values()), losses


def test_committed_multinode_script_trains_with_plain_sbatch(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from tests.integration.conftest import sbatch

    repo = Path(__file__).resolve().parents[2]
    # Submitted from the repository root as a user would; the run folder goes to tmp_path.
    job = sbatch(
        repo / "hpc" / "train_distributed_multinode.sh",
        f"--chdir={tmp_path}",
        cwd=repo,
        timeout=600,
    )
    (log,) = tmp_path.glob(f"*-{job.job_id}.out")
    text = log.read_text()
    assert job.returncode == 0, text
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"
    assert "Distributed training initialized: gloo backend, 4 processes" in text
    # The rendered CPU layout (generic profile: nothing assumed, 1 CPU a rank): its one
    # compute thread; and the direct exchange across nodes.
    assert (
        "export OMP_NUM_THREADS=1\nexport MKL_NUM_THREADS=1\nexport HPCDIST_CPUS_PER_TASK=1\n"
        in (repo / "hpc" / "train_distributed_multinode.sh").read_text()
    )
    for rank in range(4):
        line = re.search(rf"\[Rank {rank}\] host node{rank + 1}, .*", text)
        # Every virtual node shares one network stack here: the route to node1 is loopback.
        assert line and line.group(0).endswith(
            "device cpu, threads 1, net lo (127.0.0.1 on the route to rank 0 at node1)"
        ), text
    assert f"Gradient all-reduce: {MESH}" in text
    results = json.loads(
        (tmp_path / "runs" / str(job.job_id) / "training_results.json").read_text()
    )
    assert results["world_size"] == 4 and results["best_val_loss"] <= 0.1
    assert results["grad_allreduce"] == MESH
