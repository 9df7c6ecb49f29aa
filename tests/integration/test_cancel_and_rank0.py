"""Two promises of the job protocol to any user's code, on the testbed.

- A job the user cancels (``scancel``) is never requeued, not even in the moment after the
  warning, while its ranks write the checkpoint that asks for a requeue: the runner asks the
  controller before it requeues, and a cancelled job is no longer running there.
- Under the torchrun launcher global rank 0 is on the job's first node, in every job.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from hpcdist.render.script import render
from hpcdist.slurm.nodelist import expand_nodelist
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import (
    SlurmCluster,
    job_log,
    job_state,
    run_slurm,
    sbatch,
    squeue,
    submit_waiting,
    unlabel,
)

# A user's training that honours hpcdist's protocol: on the warning it writes its checkpoint
# (three seconds, during which a TERM does not stop it), then asks for a requeue.
CHECKPOINTS_SLOWLY = """\
import os, pathlib, signal, sys, time

warned = []
signal.signal(signal.SIGUSR2, lambda *_: warned.append(1))
print("STARTED", flush=True)
while not warned:
    time.sleep(0.1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("WARNED, checkpointing", flush=True)
time.sleep(3)
pathlib.Path(os.environ["HPCDIST_REQUEUE_MARKER"]).touch()
print("CHECKPOINTED, requeue me", flush=True)
sys.exit(85)
"""


def _wait_for(tmp_path: Path, job_id: int, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in job_log(tmp_path, "ckpt", job_id):
        assert time.monotonic() < deadline, job_log(tmp_path, "ckpt", job_id)
        time.sleep(0.1)


@pytest.mark.parametrize("path", ["rendered", "submit"])
def test_scancel_after_the_warning_never_requeues(
    slurm_cluster: SlurmCluster, tmp_path: Path, path: str
) -> None:
    (tmp_path / "ckpt.py").write_text(CHECKPOINTS_SLOWLY)
    command = f"python3 {tmp_path / 'ckpt.py'}"
    if path == "submit":
        flags = ["--nodes=1", "--backend=gloo", "--cpus-per-task=1", "--time=10"]
        waiter, job_id = submit_waiting([*flags, "--command", command], tmp_path)
        assert waiter.wait(timeout=120) == 0
    else:
        options = {"mode": "gloo", "nodes": 1, "cpus_per_task": 1, "time": "10"}
        spec = spec_from_options({**options, "command": command})
        assert spec.requeue and spec.warning_signal == "USR2"
        job_id = sbatch(render(spec), cwd=tmp_path, wait=False).job_id
    _wait_for(tmp_path, job_id, "STARTED")
    run_slurm("scancel", "--signal=USR2", str(job_id))  # the warning, as SLURM sends it
    _wait_for(tmp_path, job_id, "WARNED, checkpointing")
    run_slurm("scancel", str(job_id))  # the user's cancel, while the checkpoint is written
    deadline = time.monotonic() + 120
    while squeue(job_id)[0]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    time.sleep(5)  # a requeued job would be back in the queue by now (pending its hold)
    log = job_log(tmp_path, "ckpt", job_id)
    assert squeue(job_id) == ("", ""), log
    assert "CHECKPOINTED, requeue me" in log, log  # the rank did ask for a requeue
    assert re.search(rf"hpcdist: not requeueing: job {job_id} (is COMPLETING|was ended)", log)
    assert "restart 1" not in log and "requeueing" not in log.replace("not requeueing", "")
    state = job_state(job_id)
    assert state.startswith("CANCELLED"), state
    print(f"measured: {path}: cancelled while checkpointing after the warning: {state.strip()}")


RANK_NODE = (
    "import os; print('RANKNODE', os.environ['RANK'], os.environ['SLURMD_NODENAME'], "
    "os.environ['SLURM_JOB_NODELIST'], flush=True)"
)
JOBS = 20


def test_global_rank_0_is_on_the_first_node_in_every_torchrun_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # 20 jobs of one trivial step on 2 nodes (the testbed runs two at a time), queued at
    # once: the static rendezvous gives each node the rank of its task, so rank 0 is on the
    # first node every time (c10d's ordering put it on the second in some of 8 jobs).
    options = {"mode": "gloo", "nodes": 2, "cpus_per_task": 1, "launcher": "torchrun"}
    spec = spec_from_options({**options, "time": "10", "command": f"python3 -c {RANK_NODE!r}"})
    script = tmp_path / "ranks.sh"
    script.write_text(render(spec))
    jobs = [sbatch(script, cwd=tmp_path, wait=False).job_id for _ in range(JOBS)]
    deadline = time.monotonic() + 900
    while any(squeue(job)[0] for job in jobs):
        assert time.monotonic() < deadline
        time.sleep(1)
    first = 0
    for job in jobs:
        log = unlabel(job_log(tmp_path, spec.job_name, job))
        lines = re.findall(r"RANKNODE (\d) (\S+) (\S+)", log)
        found = {int(rank): (node, nodes) for rank, node, nodes in lines}
        assert sorted(found) == [0, 1], log
        hosts = expand_nodelist(found[0][1])
        assert [found[0][0], found[1][0]] == hosts, log
        first += 1
    assert first == JOBS
    print(f"measured: global rank 0 on the first node in {first} of {JOBS} torchrun jobs")
