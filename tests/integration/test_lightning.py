"""A Lightning training, unchanged, on the testbed: through a rendered script and through
``hpcdist submit``, under the srun and the torchrun launcher.

The script is what a Lightning user writes for SLURM (Lightning finds SLURM by itself:
``SLURMEnvironment``'s defaults, auto-requeue on SIGUSR1), with the one setting hpcdist's
README gives for its world: ``devices`` from ``LOCAL_WORLD_SIZE`` and ``num_nodes`` from
``SLURM_NNODES`` (Lightning counts one CPU device per process otherwise). Warned with
SIGUSR1, Lightning checkpoints and requeues the job itself (``scontrol requeue``); hpcdist's
runner sees that and does not requeue it a second time; the rerun resumes at the epoch the
warning stopped. Each job is warned by hand (``scancel --signal=USR1``, what SLURM's
``--signal`` does at its time) once the training runs, so nothing depends on the machine's
speed: the training is long enough (a pause after each epoch) to be running when it comes.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdist.render.script import render
from hpcdist.slurm.nodelist import expand_nodelist
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import (
    SlurmCluster,
    job_log,
    job_state,
    release_requeue_hold,
    run_slurm,
    sbatch,
    squeue,
    submit_waiting,
    unlabel,
)

pytest.importorskip("lightning")

# What a user brings: a LightningModule and a Trainer; nothing of hpcdist.
LIGHTNING = """\
import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_epoch_start(self):
        print(
            f"LIGHTNING epoch={self.current_epoch} rank={self.global_rank} "
            f"world={self.trainer.world_size} node={os.environ['SLURMD_NODENAME']} "
            f"nodelist={os.environ['SLURM_JOB_NODELIST']} "
            f"restart={os.environ.get('SLURM_RESTART_COUNT', '0')}",
            flush=True,
        )

    def on_train_epoch_end(self):
        time.sleep(float(sys.argv[3]))


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
trainer = L.Trainer(
    max_epochs=int(sys.argv[1]),
    accelerator="cpu",
    devices=int(os.environ["LOCAL_WORLD_SIZE"]),
    num_nodes=int(os.environ["SLURM_NNODES"]),
    default_root_dir=sys.argv[2],
    enable_progress_bar=False,
    enable_model_summary=False,
    logger=False,
)
trainer.fit(Model(), DataLoader(data, batch_size=8))
print(f"LIGHTNING done rank={trainer.global_rank} epochs={trainer.current_epoch}", flush=True)
# torch 2.13: a gloo group still held at exit (Lightning keeps its DDP model) aborts the
# interpreter's teardown now and then ("terminate called without an active exception", one
# torchrun rank in about twelve runs here): every rank done, then leave without that teardown
# (README, recipes).
trainer.strategy.barrier()
os._exit(0)
"""
_EPOCH = re.compile(
    r"LIGHTNING epoch=(\d+) rank=(\d+) world=(\d+) node=(\S+) nodelist=(\S+) restart=(\d+)"
)


def _start(
    tmp_path: Path, path: str, shape: tuple[int, int, str], epochs: int, pause: float
) -> int:
    """Queue the Lightning script by ``path`` (rendered: sbatch; submit) on ``shape`` (nodes,
    tasks per node, launcher), warned with USR1; its job id."""
    (tmp_path / "fit.py").write_text(LIGHTNING)
    # This interpreter (the one Lightning is installed for) runs the ranks.
    command = f"{sys.executable} {tmp_path / 'fit.py'} {epochs} {tmp_path / 'root'} {pause}"
    nodes, per_node, launcher = shape
    if path == "submit":
        flags = [f"--nodes={nodes}", f"--tasks-per-node={per_node}", "--cpus-per-task=1"]
        flags += ["--backend=gloo", f"--launcher={launcher}", "--time=10", "--signal=USR1@60"]
        waiter, job_id = submit_waiting([*flags, "--command", command], tmp_path)
        assert waiter.wait(timeout=120) == 0
        return job_id
    options = {"mode": "gloo", "nodes": nodes, "tasks_per_node": per_node, "cpus_per_task": 1}
    options.update(launcher=launcher, time="10", signal="USR1@60", command=command)
    return sbatch(render(spec_from_options(options)), cwd=tmp_path, wait=False).job_id


def _epochs(log: str) -> list[tuple[int, ...]]:
    """(epoch, rank, world, node index, restart) of every epoch start each rank printed."""
    return [
        (int(e), int(r), int(w), expand_nodelist(nodes).index(node), int(restart))
        for e, r, w, node, nodes, restart in _EPOCH.findall(unlabel(log))
    ]


def _wait_for_end(job_id: int, timeout: float) -> str:
    """The job's final state once it left the queue (its requeue hold released on the way):
    sacct's, which slurmdbd records some seconds after squeue forgets the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = release_requeue_hold(job_id)
        if not state:
            return job_state(job_id, timeout=60)
        time.sleep(1)
    raise AssertionError(f"job {job_id} still in the queue after {timeout:.0f} s")


@pytest.mark.parametrize("path", ["rendered", "submit"])
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_a_lightning_script_trains_with_the_jobs_world_size(
    slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str, path: str
) -> None:
    nodes, per_node = 2, 2
    job_id = _start(tmp_path, path, (nodes, per_node, launcher), epochs=2, pause=0)
    assert "COMPLETED" in _wait_for_end(job_id, 300), job_log(tmp_path, "fit", job_id)
    log = job_log(tmp_path, "fit", job_id)
    seen = _epochs(log)
    world = nodes * per_node
    # Every rank in one world of 4, both epochs; rank r on the node SLURM placed it on.
    assert sorted({(epoch, rank) for epoch, rank, *_ in seen}) == [
        (epoch, rank) for epoch in range(2) for rank in range(world)
    ], log
    assert {(w, node == rank // per_node) for _, rank, w, node, _ in seen} == {(world, True)}
    assert log.count("LIGHTNING done") == world, log
    print(f"measured: Lightning, {path}, {launcher}: world {world}, rank 0 on the first node")


@pytest.mark.parametrize("path", ["rendered", "submit"])
def test_a_warned_lightning_job_requeues_itself_once_and_resumes_at_its_epoch(
    slurm_cluster: SlurmCluster, tmp_path: Path, path: str
) -> None:
    # --signal USR1@60: Lightning's own requeue signal. 40 epochs of at least 0.3 s each:
    # still training when the warning comes (after epoch 3 started).
    job_id = _start(tmp_path, path, (2, 1, "srun"), epochs=40, pause=0.3)
    deadline = time.monotonic() + 240
    while not any(e[0] >= 3 for e in _epochs(job_log(tmp_path, "fit", job_id))):
        assert time.monotonic() < deadline, job_log(tmp_path, "fit", job_id)
        time.sleep(0.2)
    run_slurm("scancel", "--signal=USR1", str(job_id))
    state = _wait_for_end(job_id, 400)
    log = job_log(tmp_path, "fit", job_id)
    assert "COMPLETED" in state, log
    assert "Handling auto-requeue signal: 10" in log, log  # Lightning's handler, not a death
    # Lightning requeued it; hpcdist saw that and did not requeue it again.
    assert f"hpcdist: job {job_id} was requeued by scontrol requeue (restart 1)" in log, log
    assert "checkpoint written, requeueing" not in log, log
    shown = run_slurm("scontrol", "show", "job", str(job_id)).stdout
    assert "Restarts=1 " in shown, shown
    checkpoint = torch.load(tmp_path / "root" / "hpc_ckpt_1.ckpt", weights_only=False)
    fit = checkpoint["loops"]["fit_loop"]
    done = fit["epoch_progress"]["current"]["processed"]
    # Where in the warned epoch Lightning resumes (that epoch, or the next one) is Lightning's
    # own choice, from how far the epoch had got (seen: the checkpoint at 3 epochs processed
    # resumed at 3 and at 4, and at 4 at 4): hpcdist's part is a checkpoint of the warned epoch
    # or the next, and a rerun that resumes there, not from the start.
    seen = _epochs(log)
    warned = max(e for e, *_, restart in seen if restart == 0)
    resumed = min(e for e, *_, restart in seen if restart == 1)
    assert resumed >= 3 and {done, resumed} <= {warned, warned + 1} and resumed >= done, (
        warned,
        resumed,
        fit["epoch_progress"],
        fit["epoch_loop.batch_progress"],
    )
    assert {e for e, *_, restart in seen if restart == 1} == set(range(resumed, 40)), log
    print(f"measured: Lightning, {path}: warned in epoch {warned}, resumed at epoch {resumed}")
    assert squeue(job_id) == ("", "")


def test_a_lightning_job_under_torchrun_killed_by_the_warning_is_told_so(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # Under torchrun Lightning takes torchrun's environment, which has no auto-requeue: the
    # warning (USR1) kills the ranks, and hpcdist says so, with what makes it checkpoint.
    job_id = _start(tmp_path, "rendered", (2, 1, "torchrun"), epochs=40, pause=0.3)
    deadline = time.monotonic() + 240
    while not any(e[0] >= 1 for e in _epochs(job_log(tmp_path, "fit", job_id))):
        assert time.monotonic() < deadline, job_log(tmp_path, "fit", job_id)
        time.sleep(0.2)
    run_slurm("scancel", "--signal=USR1", str(job_id))
    state = _wait_for_end(job_id, 120)
    log = job_log(tmp_path, "fit", job_id)
    assert "FAILED" in state, log
    said = "hpcdist: the command was killed by the warning signal SIGUSR1 (--signal USR1@60)"
    assert said in log, log
    status = run_slurm(sys.executable, "-m", "hpcdist.cli.main", "status", str(job_id))
    assert "warning:    the command was killed by the warning signal SIGUSR1" in status.stdout
    assert "exit code:  138" in status.stdout, status.stdout
