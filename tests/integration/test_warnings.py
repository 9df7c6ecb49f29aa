"""The warning signal on its other paths: torchrun launchers, a batch-shell signal (B:),
another signal than USR2, and torchrun under `hpcdist submit`, on the real testbed.

Each job is warned by hand (`scancel --signal`, as SLURM's --signal would do at the time
limit), then must checkpoint, requeue itself, resume and complete with every rank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.conftest import (
    SlurmCluster,
    finish_waiting,
    job_log,
    run_slurm,
    sbatch,
    submit_waiting,
)
from tests.integration.test_faults import (
    CONFIG,
    ENDLESS,
    _finish_after,
    _follow,
    _log,
    _training_job,
    _wait_for,
)


def _end_after_the_warning(
    tmp_path: Path, log: Callable[[], str], job_id: int, config: Path
) -> int:
    """The training runs until warned (it never ends by itself): once it has checkpointed
    and asked for its requeue (SLURM holds the requeued job), the run that resumes it is
    given its end, a few epochs on; the epochs it ends at."""
    _wait_for(
        lambda: "checkpoint written, requeueing" in log(),
        300,
        "the checkpoint after the warning",
        job_id,
        log,
    )
    return _finish_after(config, tmp_path / "runs" / str(job_id))


def _warn_when_training(tmp_path: Path, name: str, job_id: int, *scancel_args: str) -> None:
    """Send the warning once the job has trained a few epochs."""
    _wait_for(
        lambda: "Epoch 3/" in _log(tmp_path, name, job_id),
        180,
        f"job {job_id} to train 3 epochs",
        job_id,
        lambda: _log(tmp_path, name, job_id),
    )
    run_slurm("scancel", *scancel_args, str(job_id))


def _assert_resumed_and_completed(tmp_path: Path, name: str, job_id: int) -> str:
    epochs = _end_after_the_warning(
        tmp_path, lambda: _log(tmp_path, name, job_id), job_id, tmp_path / f"{name}.yaml"
    )
    state = _follow(job_id, timeout=300)
    log = _log(tmp_path, name, job_id)
    assert state == "COMPLETED", log
    assert "checkpoint written, requeueing" in log, log
    resumed = re.findall(r"Resuming from \S+ \(epoch (\d+), restart 1\)", log)
    assert resumed, log
    assert log.count("Distributed training initialized: gloo backend, 2 processes") == 2, log
    results = json.loads((tmp_path / "runs" / str(job_id) / "training_results.json").read_text())
    assert results["world_size"] == 2
    assert results["epochs_run"] == epochs
    print(
        f"measured: {name}: warned after epoch 3, resumed from epoch {resumed[0]}, "
        f"COMPLETED after {epochs} epochs with 2 ranks"
    )
    return log


def test_torchrun_script_survives_the_step_warning_and_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # SLURM's --signal (no B:) reaches every process of the step, torchrun included.
    script = _training_job(tmp_path, "torchrun", ENDLESS, launcher="torchrun")
    # torchrun's own code, behind a handler of the warning (its ranks get it as sent).
    assert 'python3 python3 -c "${torchrun_agent}" --nnodes' in script.read_text()
    job = sbatch(script, cwd=tmp_path, wait=False)
    _warn_when_training(tmp_path, "torchrun", job.job_id, "--signal=USR2")
    _assert_resumed_and_completed(tmp_path, "torchrun", job.job_id)


def test_batch_shell_warning_of_another_signal_reaches_the_ranks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # --signal=B:USR1@60: SLURM warns the batch shell alone, with USR1 instead of USR2.
    script = _training_job(tmp_path, "batchsig", ENDLESS, signal="B:USR1@60")
    job = sbatch(script, cwd=tmp_path, wait=False)
    _warn_when_training(tmp_path, "batchsig", job.job_id, "--batch", "--signal=USR1")
    _assert_resumed_and_completed(tmp_path, "batchsig", job.job_id)


def test_submit_with_torchrun_runs_every_rank_and_resumes_after_the_warning(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = tmp_path / "torchrun.yaml"
    config.write_text(CONFIG.format(epochs=ENDLESS))
    waiter, job_id = submit_waiting(
        [
            "--nodes=2",
            "--backend=gloo",
            "--launcher=torchrun",
            "--cpus-per-task=1",
            "--time=20",
            "--job-name=submit-torchrun",
            "--wait",
            "--command",
            f"python3 -m ufsemulator train --config {config}",
        ],
        tmp_path,
    )

    def logs() -> str:  # the job's log: both nodes' torchruns and their ranks
        return job_log(tmp_path, "submit-torchrun", job_id)

    def trained() -> bool:
        return "Epoch 3/" in logs()

    _wait_for(trained, 180, "the submitted job to train 3 epochs", job_id, logs)
    run_slurm("scancel", "--signal=USR2", str(job_id))
    epochs = _end_after_the_warning(tmp_path, logs, job_id, config)
    finish_waiting(waiter, job_id, timeout=300)
    text = logs()
    # One torchrun per node, each starting its rank: both ranks in one process group.
    assert text.count("Distributed training initialized: gloo backend, 2 processes") == 2, text
    assert re.search(r"Resuming from \S+ \(epoch \d+, restart 1\)", text), text
    assert f"Epoch {epochs}/{epochs}" in text, text
    epoch = re.findall(r"Resuming from \S+ \(epoch (\d+)", text)[0]
    print(f"measured: submit --launcher torchrun: resumed from epoch {epoch}, --wait exited 0")


@pytest.mark.slurm_versions
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_submit_warned_with_usr1_checkpoints_requeues_and_resumes(
    slurm_cluster: SlurmCluster, tmp_path: Path, launcher: str
) -> None:
    # A job submitted with --signal USR1@60 is warned with USR1 (the script's #SBATCH line
    # says so) and its ranks answer it.
    config = tmp_path / "usr1.yaml"
    config.write_text(CONFIG.format(epochs=ENDLESS))
    waiter, job_id = submit_waiting(
        [
            "--nodes=2",
            "--backend=gloo",
            f"--launcher={launcher}",
            "--cpus-per-task=1",
            "--time=20",
            "--signal=USR1@60",
            "--job-name=submit-usr1",
            "--wait",
            "--command",
            f"python3 -m ufsemulator train --config {config}",
        ],
        tmp_path,
    )
    folder = tmp_path / ".hpcdist" / "submitit" / str(job_id)
    assert '#SBATCH --signal="USR1@60"' in (folder / f"{job_id}_submission.sh").read_text()

    def logs() -> str:
        return job_log(tmp_path, "submit-usr1", job_id)

    _wait_for(
        lambda: "Epoch 3/" in logs(), 180, "the submitted job to train 3 epochs", job_id, logs
    )
    run_slurm("scancel", "--signal=USR1", str(job_id))
    epochs = _end_after_the_warning(tmp_path, logs, job_id, config)
    finish_waiting(waiter, job_id, timeout=300)
    text = logs()
    assert "hpcdist: checkpoint written, requeueing job" in text, text
    assert re.search(r"Resuming from \S+ \(epoch \d+, restart 1\)", text), text
    assert f"Epoch {epochs}/{epochs}" in text, text
