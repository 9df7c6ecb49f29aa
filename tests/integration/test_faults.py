"""Faults on the real testbed: time limits, requeue, scancel, a dead rank, two jobs at once.

The trainings here are the real `python3 -m ufsemulator train` in scripts rendered by
hpcdist, submitted with plain sbatch; their run folders are runs/<job id> under tmp_path.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import (
    FINAL_STATES,
    SlurmCluster,
    finish_waiting,
    job_log,
    release_requeue_hold,
    run_slurm,
    sbatch,
    squeue,
    submit_waiting,
    wait_until,
)
from ufsemulator.checkpoints.checkpoint import load_checkpoint

# Small model, ocean mask (~30k training points per rank at 2 ranks): ~0.35 s per epoch
# on one core per rank; checkpoints every 10 epochs, stop checks every 5 steps.
CONFIG = """\
data: {{mask: ocean}}
training: {{epochs: {epochs}, lr: 1.0e-3, early_stopping_patience: 0, checkpoint_every: 10}}
preemption: {{check_every_steps: 5}}
"""


def _training_job(tmp_path: Path, name: str, epochs: int, **flags: object) -> Path:
    config = tmp_path / f"{name}.yaml"
    config.write_text(CONFIG.format(epochs=epochs))
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "job_name": name,
            "time": "20:00",
            "command": f"python3 -m ufsemulator train --config {config}",
            **flags,
        }
    )
    script = tmp_path / f"{name}.sh"
    script.write_text(render(spec))
    return script


def _log(tmp_path: Path, name: str, job_id: int) -> str:
    path = tmp_path / f"{name}-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _sacct_state(job_id: int) -> str:
    proc = run_slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State", check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[-1].split()[0] if lines else "?"


def _follow(job_id: int, timeout: float, release: bool = True) -> str:
    """Wait for a final state, releasing the requeue hold (BeginTime ~120 s) as we go.

    A requeued job leaves squeue for a moment between its runs, and sacct shows the
    latest run: only a final sacct state with the job gone from squeue for a few seconds
    ends the wait.
    """
    deadline = time.monotonic() + timeout
    gone = 0
    while time.monotonic() < deadline:
        state = release_requeue_hold(job_id) if release else squeue(job_id)[0]
        if state:
            gone = 0
        else:
            gone += 1
            if gone >= 5 and _sacct_state(job_id) in FINAL_STATES:
                return _sacct_state(job_id)
        time.sleep(1)
    return _sacct_state(job_id)


def _wait_for(
    ready: Callable[[], object],
    timeout: float,
    what: str,
    job_id: int | None = None,
    log: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``ready``; with the job it waits on, fail at once (its end and ``log()``'s tail)
    when that job has ended without it (conftest.wait_until)."""
    if job_id is not None:
        wait_until(lambda: bool(ready()), job_id, what, timeout, log=log)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# The trainings that must meet their time limit never end by themselves: they train until
# the warning has come (as often as the test needs), and only then does the test give them
# an end (_finish_after), so no test sizes a training from this machine's speed.
ENDLESS = 1_000_000


def _finish_after(config: Path, run_dir: Path, more: int = 3) -> int:
    """Rewrite the training's config so that the run that starts next, resuming from the
    checkpoint just written, trains ``more`` epochs and ends; the epochs it ends at."""
    epochs = int(load_checkpoint(run_dir / "checkpoint.pt")["epoch"]) + more
    staged = config.with_suffix(".next")
    staged.write_text(CONFIG.format(epochs=epochs))
    staged.replace(config)  # whole, never half-written for a job that starts now
    return epochs


def _requeued_times(log: str) -> int:
    return log.count("checkpoint written, requeueing")


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    checkpoint = load_checkpoint(run_dir / "checkpoint.pt")
    return dict(checkpoint["model"])


WARNING_LEAD_S = 40


def test_time_limit_interrupts_twice_and_ends_with_the_uninterrupted_weights(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # SLURM checks time limits on a coarse timer and may send the warning up to a minute
    # before the lead it was given: USR2@40 of --time=2 comes anywhere from 20 to 80 s into
    # each piece (with USR2@30 of --time=1 it came 1 s in, before the ranks had started).
    # The training runs until it has been warned twice, whatever this machine's speed.
    script = _training_job(
        tmp_path, "limited", ENDLESS, time="2", signal=f"USR2@{WARNING_LEAD_S}", max_restarts=20
    )
    job = sbatch(script, cwd=tmp_path, wait=False)
    run_dir = tmp_path / "runs" / str(job.job_id)

    def warned_twice() -> bool:
        if _requeued_times(_log(tmp_path, "limited", job.job_id)) >= 2:
            return True  # held by SLURM's requeue delay until released below
        release_requeue_hold(job.job_id)
        return False

    _wait_for(
        warned_twice,
        900,
        "the second warning and requeue",
        job.job_id,
        lambda: _log(tmp_path, "limited", job.job_id),
    )
    _finish_after(tmp_path / "limited.yaml", run_dir)
    state = _follow(job.job_id, timeout=900)
    log = _log(tmp_path, "limited", job.job_id)
    assert state == "COMPLETED", log
    restarts = {int(n) for n in re.findall(r"restart (\d+)", log)}
    assert max(restarts) >= 2, f"interrupted only {max(restarts)} times:\n{log}"
    assert _requeued_times(log) >= 2
    final = _weights(run_dir)
    # The same training, uninterrupted, for as many epochs as the limited one ended at.
    epochs = int(load_checkpoint(run_dir / "checkpoint.pt")["epoch"])
    reference = sbatch(_training_job(tmp_path, "reference", epochs), cwd=tmp_path, timeout=900)
    assert reference.returncode == 0, _log(tmp_path, "reference", reference.job_id)
    expected = _weights(tmp_path / "runs" / str(reference.job_id))
    print(
        f"measured: time-limited training of {epochs} epochs completed after "
        f"{max(restarts)} restarts, weights equal to the uninterrupted run"
    )
    assert final.keys() == expected.keys()
    for key in expected:
        assert torch.equal(final[key], expected[key]), f"{key} differs after the restarts"


@pytest.mark.slurm_versions
def test_scontrol_requeue_resumes_and_scancel_leaves_the_checkpoint_intact(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job = sbatch(_training_job(tmp_path, "requeued", epochs=2000), cwd=tmp_path, wait=False)
    checkpoint = tmp_path / "runs" / str(job.job_id) / "checkpoint.pt"
    _wait_for(
        checkpoint.exists,
        180,
        "the first checkpoint",
        job.job_id,
        lambda: _log(tmp_path, "requeued", job.job_id),
    )
    time.sleep(3)
    run_slurm("scontrol", "requeue", str(job.job_id))

    def resumed() -> bool:
        release_requeue_hold(job.job_id)
        return "Resuming from" in _log(tmp_path, "requeued", job.job_id)

    _wait_for(
        resumed,
        240,
        "the requeued job to resume from its checkpoint",
        job.job_id,
        lambda: _log(tmp_path, "requeued", job.job_id),
    )
    log = _log(tmp_path, "requeued", job.job_id)
    # SLURM requeued it: said so, never "not requeueing ... without a preemption".
    assert f"job {job.job_id} is requeued by SLURM itself" in log, log
    assert "not requeueing" not in log, log
    resumed_epoch = int(re.findall(r"Resuming from \S+ \(epoch (\d+), restart 1\)", log)[-1])
    assert resumed_epoch >= 1
    _wait_for(
        lambda: f"Epoch {resumed_epoch + 2}/" in _log(tmp_path, "requeued", job.job_id),
        120,
        "an epoch after the resume",
        job.job_id,
        lambda: _log(tmp_path, "requeued", job.job_id),
    )

    run_slurm("scancel", str(job.job_id))
    assert _follow(job.job_id, timeout=120, release=False) == "CANCELLED"
    after = load_checkpoint(checkpoint)  # loadable: never left half-written
    assert after["epoch"] >= resumed_epoch
    print(
        f"measured: requeued job resumed at epoch {resumed_epoch}; cancelled with a "
        f"loadable checkpoint of epoch {after['epoch']}"
    )


def _rank_pid(run_marker: str, rank: int, variable: str = "SLURM_PROCID") -> int | None:
    """The process of rank ``rank`` of the training ``run_marker`` names: the one whose
    ``variable`` holds the rank (srun's tasks: ``SLURM_PROCID``; torchrun's workers: ``RANK``,
    which their agent, a task too, does not have)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            "ufsemulator train" in cmdline
            and run_marker in cmdline
            and (f"{variable}={rank}".encode() in environ)
        ):
            return int(entry.name)
    return None


def test_killed_rank_fails_the_job_quickly_naming_the_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # SIGKILL, as the kernel's out-of-memory killer ends a rank: the job's own memory, which
    # another node would not cure; no node is held out and nothing is requeued (a bus error
    # is: tests/integration/test_badnodes.py). The failure is the job's end.
    script = _training_job(tmp_path, "victim", epochs=ENDLESS)
    job = sbatch(script, cwd=tmp_path, wait=False)
    checkpoint = tmp_path / "runs" / str(job.job_id) / "checkpoint.pt"
    _wait_for(
        checkpoint.exists,
        180,
        "the first checkpoint",
        job.job_id,
        lambda: _log(tmp_path, "victim", job.job_id),
    )
    pid = _rank_pid(str(tmp_path / "victim.yaml"), rank=1)
    assert pid is not None, "rank 1's process not found"
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    state = _follow(job.job_id, timeout=120, release=False)
    elapsed = time.monotonic() - killed
    log = _log(tmp_path, "victim", job.job_id)
    assert state == "FAILED", log
    # --kill-on-bad-exit, not the 120 s collective timeout the peer would otherwise wait for.
    assert elapsed < 110, f"the job took {elapsed:.0f} s to fail"
    print(f"measured: killed rank 1, job FAILED {elapsed:.1f} s later")
    assert re.search(r"task 1: Killed", log), log
    # Said plainly, not as the TERM srun sent the others or a peer's traceback.
    assert "hpcdist: rank 1 was killed by signal 9 (SIGKILL): likely out of memory" in log, log
    assert "hpcdist: node" not in log and "requeueing" not in log, log
    assert f"--set output.run_dir=runs/{job.job_id}" in log, log  # it had checkpointed
    status = run_slurm("scontrol", "show", "job", str(job.job_id), check=False).stdout
    assert "ExitCode=137:0" in status, status


def test_two_trainings_on_the_same_nodes_both_finish_apart(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    jobs = {}
    for name in ("left", "right"):
        script = _training_job(tmp_path, name, epochs=20)
        jobs[name] = sbatch(script, "--nodelist=node1,node2", cwd=tmp_path, wait=False)
    for name, job in jobs.items():
        assert _follow(job.job_id, timeout=300, release=False) == "COMPLETED", _log(
            tmp_path, name, job.job_id
        )
    ports = set()
    for name, job in jobs.items():
        log = _log(tmp_path, name, job.job_id)
        other = jobs["right" if name == "left" else "left"].job_id
        assert f"runs/{job.job_id}" in log and f"runs/{other}" not in log
        ports.update(re.findall(r"Master: node\d+:(\d+)", log))
        assert (tmp_path / "runs" / str(job.job_id) / "training_results.json").is_file()
    assert len(ports) == 2, f"both jobs used the same master port: {ports}"


def test_submitted_job_checkpoints_requeues_and_completes_through_its_time_limit(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Trains until the warning has come and the job is requeued, then resumes and ends."""
    config = tmp_path / "submitit.yaml"
    config.write_text(CONFIG.format(epochs=ENDLESS))
    waiter, job_id = submit_waiting(
        [
            "--nodes=2",
            "--backend=gloo",
            "--cpus-per-task=1",
            "--time=1",
            "--signal=USR2@30",
            "--max-restarts=20",
            "--job-name=submitit-preempt",
            "--wait",
            "--command",
            f"python3 -m ufsemulator train --config {config}",
        ],
        tmp_path,
    )
    _wait_for(
        lambda: _requeued_times(job_log(tmp_path, "submitit-preempt", job_id)) >= 1,
        600,
        "the warning and the requeue",
        job_id,
        lambda: _log(tmp_path, "submitit-preempt", job_id),
    )
    epochs = _finish_after(config, tmp_path / "runs" / str(job_id))  # requeue hold: not begun
    out = finish_waiting(waiter, job_id, timeout=600)
    assert f"Job {job_id} ended COMPLETED" in out
    log = job_log(tmp_path, "submitit-preempt", job_id)
    resumes = re.findall(r"Resuming from \S+ \(epoch \d+, restart (\d+)\)", log)
    assert resumes, log
    assert f"Epoch {epochs}/{epochs}" in log, log
    print(f"measured: submitted job requeued {len(resumes)} times, then COMPLETED")
