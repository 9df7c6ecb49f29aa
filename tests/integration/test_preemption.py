"""Real preemption on a testbed with a high-priority partition over the same nodes
(PreemptType=preempt/partition_prio, a grace time): a training preempted by a job of
partition `high` checkpoints in its grace time and finishes with the weights of an
uninterrupted run, whether the site requeues it (PreemptMode=REQUEUE) or cancels it and
refuses the requeue (PreemptMode=CANCEL: the script submits itself again with sbatch into
the same run folder). A job submitted with --no-requeue is never resubmitted.

PreemptMode is the cluster's own setting: each mode has its own small testbed (2 nodes,
no accounting) beside the session's, started for this module and stopped after it.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import torch

from hpcdist.slurm.probe import parse_version
from tests.integration.conftest import (
    SlurmCluster,
    finish_waiting,
    job_log,
    run_slurm,
    sbatch,
    submit_waiting,
)
from tests.integration.sidebed import FINAL, SideBed, show_job, side_testbed, wait_state
from tests.integration.test_faults import (
    CONFIG,
    ENDLESS,
    _finish_after,
    _log,
    _training_job,
    _wait_for,
    _weights,
)
from ufsemulator.checkpoints.checkpoint import load_checkpoint

# On one xdist worker: two side testbeds (requeue, cancel), made once for the module.
pytestmark = pytest.mark.xdist_group("test_preemption")

GRACE_S = "15"
# A job of the high partition that needs every CPU of both nodes: it preempts the training,
# and holds the nodes until the test has given the preempted training its end (_release):
# the trainings never end by themselves, so none can finish before its preemption.
HIGH_JOB = "#!/bin/bash\nwhile [ ! -e release ]; do sleep 0.2; done\n"


Weights = dict[str, torch.Tensor]


def _release(tmp_path: Path, config: Path | None, run_dir: Path | None) -> None:
    """The preempted training has checkpointed: the run that resumes it trains a few epochs
    more and ends (its config says so), then the preemptor lets the nodes go."""
    if config is not None and run_dir is not None:
        _finish_after(config, run_dir)
    (tmp_path / "release").touch()


@pytest.fixture(scope="module")
def requeue_bed() -> Iterator[SideBed]:
    with side_testbed("preempt-requeue", 50, preempt="requeue", grace_time=GRACE_S) as bed:
        yield bed


@pytest.fixture(scope="module")
def cancel_bed() -> Iterator[SideBed]:
    with side_testbed("preempt-cancel", 60, preempt="cancel", grace_time=GRACE_S) as bed:
        yield bed


def _preempt_after_epoch_3(tmp_path: Path, name: str, job_id: int) -> int:
    def log() -> str:
        return _log(tmp_path, name, job_id)

    _wait_for(lambda: "Epoch 3/" in log(), 180, f"{name} to train", job_id, log)
    high = sbatch(HIGH_JOB, "-p", "high", "-N", "2", "--exclusive", cwd=tmp_path, wait=False)
    return high.job_id


def _assert_same_weights(run_dir: Path, slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The preempted training's weights are those of the same training run uninterrupted
    (on the session's testbed) for as many epochs as it ended at."""
    epochs = int(load_checkpoint(run_dir / "checkpoint.pt")["epoch"])
    results = json.loads((run_dir / "training_results.json").read_text())
    assert results["epochs_run"] == epochs and results["world_size"] == 2
    folder = tmp_path / "reference"
    folder.mkdir()
    job = sbatch(_training_job(folder, "reference", epochs), cwd=folder, wait=False)
    state = slurm_cluster.job_state(job.job_id, timeout=600)
    assert state == "COMPLETED", _log(folder, "reference", job.job_id)
    expected = _weights(folder / "runs" / str(job.job_id))
    final = _weights(run_dir)
    assert sorted(final) == sorted(expected)
    for key in expected:
        assert torch.equal(final[key], expected[key]), f"{key} differs after the preemption"


@pytest.mark.slurm_versions
def test_requeue_mode_preempted_training_resumes_with_the_uninterrupted_weights(
    requeue_bed: SideBed,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    with requeue_bed.active(monkeypatch):
        job = sbatch(_training_job(tmp_path, "preempted", ENDLESS), cwd=tmp_path, wait=False)
        high = _preempt_after_epoch_3(tmp_path, "preempted", job.job_id)
        _wait_for(
            lambda: "checkpoint written, requeueing" in _log(tmp_path, "preempted", job.job_id),
            300,
            "the preempted training's checkpoint",
            job.job_id,
            lambda: _log(tmp_path, "preempted", job.job_id),
        )
        _release(tmp_path, tmp_path / "preempted.yaml", tmp_path / "runs" / str(job.job_id))
        assert wait_state(high, FINAL, timeout=120)["JobState"] == "COMPLETED"
        shown = wait_state(job.job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 300)
    log = _log(tmp_path, "preempted", job.job_id)
    assert shown["JobState"] == "COMPLETED", log
    assert shown["Restarts"] == str(_restarts_after_one_preemption()), shown
    assert "checkpoint written, requeueing" in log, log
    resumed = re.findall(r"Resuming from \S+ \(epoch (\d+), restart 1\)", log)
    assert resumed, log
    _assert_same_weights(tmp_path / "runs" / str(job.job_id), slurm_cluster, tmp_path)
    print(
        f"measured: REQUEUE preemption after epoch 3, resumed from epoch {resumed[0]}, "
        f"weights equal to the uninterrupted run ({time.monotonic() - started:.0f} s)"
    )


def _restarts_after_one_preemption() -> int:
    """SLURM 24.11 requeues a job preempted in REQUEUE mode once more when its next run ends
    (a plain sbatch script that just exits shows Restarts=2 too); 22.05 and 26.05 once. The
    extra run resumes the finished run's checkpoint and ends with the same weights."""
    version = parse_version(run_slurm("sinfo", "--version").stdout)
    return 2 if version is not None and (version.major, version.minor) == (24, 11) else 1


def _seconds_between(earlier: str, later: str) -> float:
    """Seconds between two of scontrol's times (2026-11-27T01:40:03)."""
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


def test_a_preempted_submit_job_gives_its_nodes_back_at_once_and_resumes(
    requeue_bed: SideBed,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "submitted.yaml"
    config.write_text(CONFIG.format(epochs=ENDLESS))
    with requeue_bed.active(monkeypatch):
        waiter, job_id = submit_waiting(
            [
                "--nodes=2",
                "--backend=gloo",
                "--cpus-per-task=1",
                "--time=20",
                "--job-name=submitted",
                "--wait",
                "--command",
                f"python3 -m ufsemulator train --config {config}",
            ],
            tmp_path,
        )

        def log() -> str:  # the job's log: every rank and the batch shell, every run
            return job_log(tmp_path, "submitted", job_id)

        _wait_for(lambda: "Epoch 3/" in log(), 180, "the submitted training", job_id, log)
        high = sbatch(HIGH_JOB, "-p", "high", "-N", "2", "--exclusive", cwd=tmp_path, wait=False)
        _wait_for(
            lambda: "hpcdist: checkpoint written, requeueing job" in log(),
            300,
            "the preempted training's checkpoint",
            job_id,
            log,
        )
        _release(tmp_path, config, tmp_path / "runs" / str(job_id))
        preemptor = wait_state(high.job_id, FINAL, timeout=120)
        out = finish_waiting(waiter, job_id, timeout=400)
    assert preemptor["JobState"] == "COMPLETED", preemptor
    # The preemptor is submitted before the training is told to stop, so its wait from
    # submission to start bounds how long the nodes were held after the checkpoint.
    waited = _seconds_between(preemptor["SubmitTime"], preemptor["StartTime"])
    assert waited <= 10, (preemptor, log())
    assert "hpcdist: checkpoint written, requeueing job" in log(), log()
    assert f"Job {job_id} ended COMPLETED" in out, out
    assert re.search(r"Resuming from \S+ \(epoch \d+, restart 1\)", log()), log()
    _assert_same_weights(tmp_path / "runs" / str(job_id), slurm_cluster, tmp_path)
    print(f"measured: the preemptor started {waited:.0f} s after its submission")


def refuse_requeues(bindir: Path) -> None:
    """A site where users may not requeue, for jobs with ``bindir`` first on their PATH:
    scontrol requeue fails as SLURM's does when a job may not be requeued; every other
    scontrol command is the real one."""
    real = run_slurm("bash", "-c", "command -v scontrol").stdout.strip()
    (bindir / "scontrol").write_text(
        "#!/bin/bash\n"
        'if [ "$1" = requeue ]; then\n'
        '  echo "Requested operation is presently disabled for job $2" >&2; exit 1\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (bindir / "scontrol").chmod(0o755)


def _refusing_scontrol(tmp_path: Path) -> Path:
    """A folder holding the refusing scontrol (``refuse_requeues``), to put first on PATH."""
    bindir = tmp_path / "site-bin"
    bindir.mkdir()
    refuse_requeues(bindir)
    return bindir


def test_cancel_mode_preempted_training_submits_itself_again_and_resumes(
    cancel_bed: SideBed,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    bindir = _refusing_scontrol(tmp_path)
    with cancel_bed.active(monkeypatch):
        # sbatch hands its PATH to the job: the batch shell finds the refusing scontrol.
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
        job = sbatch(_training_job(tmp_path, "cancelled", ENDLESS), cwd=tmp_path, wait=False)
        high = _preempt_after_epoch_3(tmp_path, "cancelled", job.job_id)
        _wait_for(
            lambda: "resubmitting" in _log(tmp_path, "cancelled", job.job_id),
            300,
            "the preempted training's checkpoint and resubmission",
            job.job_id,
            lambda: _log(tmp_path, "cancelled", job.job_id),
        )
        _release(tmp_path, tmp_path / "cancelled.yaml", tmp_path / "runs" / str(job.job_id))
        first = wait_state(job.job_id, FINAL, timeout=120)
        assert wait_state(high, FINAL, timeout=120)["JobState"] == "COMPLETED"
        again = [
            int(i) for i in run_slurm("squeue", "-h", "-n", "cancelled", "-o", "%i").stdout.split()
        ]
        assert len(again) == 1 and again[0] != job.job_id, again
        second = wait_state(again[0], FINAL, timeout=300)
    log = _log(tmp_path, "cancelled", job.job_id)
    # Picked for preemption; its batch shell submitted it again and ended (0) in its grace time.
    assert first["PreemptTime"] != "None" and first["JobState"] == "COMPLETED", (first, log)
    assert "no requeue (scontrol missing or refused), resubmitting" in log, log
    resumed_log = _log(tmp_path, "cancelled", again[0])
    assert second["JobState"] == "COMPLETED", resumed_log
    run_dir = tmp_path / "runs" / str(job.job_id)
    assert f"Resuming from {run_dir}/checkpoint.pt" in resumed_log, resumed_log
    _assert_same_weights(run_dir, slurm_cluster, tmp_path)
    print(
        f"measured: CANCEL preemption, requeue refused: job {again[0]} resumed job "
        f"{job.job_id}'s run folder, weights equal ({time.monotonic() - started:.0f} s)"
    )


def test_no_requeue_job_is_never_resubmitted_after_a_preemption(
    cancel_bed: SideBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cancel_bed.active(monkeypatch):
        script = _training_job(tmp_path, "stays", ENDLESS, requeue=False)
        assert "#SBATCH --no-requeue" in script.read_text()
        job = sbatch(script, cwd=tmp_path, wait=False)
        high = _preempt_after_epoch_3(tmp_path, "stays", job.job_id)
        shown = wait_state(job.job_id, FINAL, timeout=120)
        _release(tmp_path, None, None)
        assert wait_state(high, FINAL, timeout=120)["JobState"] == "COMPLETED"
        time.sleep(2)
        queued = run_slurm("squeue", "-h", "-n", "stays", "-o", "%i").stdout.split()
        again = show_job(job.job_id)
    log = _log(tmp_path, "stays", job.job_id)
    # Picked for preemption; its ranks checkpointed and stopped (85), and the job ended there.
    assert shown["PreemptTime"] != "None" and shown["JobState"] == "FAILED", (shown, log)
    assert shown["ExitCode"] == "85:0", shown
    assert queued == [] and again["Restarts"] == "0", (queued, again)
    assert "resubmitting" not in log and "requeueing" not in log, log
