"""The user's word holds on the real testbed: --no-requeue is never requeued, --chdir and
--output put the job and its log where they were told (rendered script and submit alike),
and `--executor auto` with a configured but silent controller refuses in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import (
    SlurmCluster,
    job_log,
    run_slurm,
    sbatch,
    slurm_env,
    submit_waiting,
)
from tests.integration.test_faults import CONFIG, _log, _training_job, _wait_for

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]


def _restarts(job_id: int) -> int:
    out = run_slurm("scontrol", "show", "job", str(job_id), check=False).stdout
    for word in out.split():
        if word.startswith("Restarts="):
            return int(word.partition("=")[2])
    return -1  # the controller forgot the job


def _final(job_id: int) -> str:
    from tests.integration.conftest import job_state

    return job_state(job_id, timeout=180)


def test_rendered_no_requeue_job_warned_is_not_requeued(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = _training_job(tmp_path, "norequeue", 40, requeue=False)
    text = script.read_text()
    assert "#SBATCH --no-requeue\n" in text and "scontrol requeue" not in text
    job = sbatch(script, cwd=tmp_path, wait=False)
    _wait_for(
        lambda: "Epoch 3/" in _log(tmp_path, "norequeue", job.job_id),
        180,
        "the job to train 3 epochs",
        job.job_id,
        lambda: _log(tmp_path, "norequeue", job.job_id),
    )
    run_slurm("scancel", "--signal=USR2", str(job.job_id))
    state = _final(job.job_id)
    log = _log(tmp_path, "norequeue", job.job_id)
    # The training checkpointed and asked for a requeue (exit 85); the script honoured the
    # user's --no-requeue and ended instead.
    assert state == "FAILED", log
    assert _restarts(job.job_id) in (0, -1)
    assert "requeueing" not in log, log
    assert (tmp_path / "runs" / str(job.job_id) / "checkpoint.pt").is_file()
    print(f"measured: rendered --no-requeue job {job.job_id} warned: {state}, no requeue")


def test_submitted_no_requeue_job_warned_is_not_requeued(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    config = tmp_path / "norequeue.yaml"
    config.write_text(CONFIG.format(epochs=40))
    waiter, job_id = submit_waiting(
        [
            "--nodes=2",
            "--backend=gloo",
            "--cpus-per-task=1",
            "--time=20",
            "--no-requeue",
            "--wait",
            "--command",
            f"python3 -m ufsemulator train --config {config}",
        ],
        tmp_path,
    )
    _wait_for(
        lambda: "Epoch 3/" in job_log(tmp_path, "ufsemulator-gloo", job_id),
        180,
        "the submitted job to train 3 epochs",
        job_id,
        lambda: job_log(tmp_path, "ufsemulator-gloo", job_id),
    )
    run_slurm("scancel", "--signal=USR2", str(job_id))
    out, err = waiter.communicate(timeout=240)
    assert waiter.returncode == 1, out + err
    state = _final(job_id)
    assert state == "FAILED", out
    assert _restarts(job_id) in (0, -1)
    # The training checkpointed and asked for a requeue; the script (the one render prints,
    # with no requeue code at all) ended instead.
    log = job_log(tmp_path, "ufsemulator-gloo", job_id)
    assert "requeueing" not in log, log
    assert (tmp_path / "runs" / str(job_id) / "checkpoint.pt").is_file()
    print(f"measured: submitted --no-requeue job {job_id} warned: {state}, no requeue")


def test_chdir_and_output_are_honoured_by_render_and_submit(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    workdir, logs = tmp_path / "work dir", tmp_path / "logs"
    workdir.mkdir()
    logs.mkdir()
    command = f"{sys.executable} -c \"import os; print('cwd', os.getcwd())\""
    flags = ["--nodes=1", "--backend=gloo", f"--chdir={workdir}", f"--command={command}"]
    rendered = subprocess.run(
        [*HPCDIST, "render", *flags, f"--output={logs}/rendered-%j.log"],
        cwd=tmp_path,
        env=slurm_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    job = sbatch(rendered, cwd=tmp_path)
    assert job.returncode == 0, job.stderr
    log = logs / f"rendered-{job.job_id}.log"
    assert f"cwd {workdir}\n" in log.read_text(), log.read_text()

    waiter, job_id = submit_waiting(
        [*flags, f"--output={logs}/submitted-%j.log", "--wait"], tmp_path
    )
    out, err = waiter.communicate(timeout=180)
    assert waiter.returncode == 0, out + err
    assert f"cwd {workdir}\n" in out  # rank 0's log, followed by --wait
    batch_log = logs / f"submitted-{job_id}.log"
    assert batch_log.is_file()  # the batch shell's log where it was told
    shown = run_slurm("scontrol", "show", "job", str(job_id), check=False).stdout
    assert f"WorkDir={workdir}" in shown or shown == ""


def test_auto_executor_refuses_a_configured_cluster_that_does_not_answer(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    conf = tmp_path / "slurm.conf"
    # A cluster whose controller listens nowhere: sinfo gets "connection refused".
    lines = Path(slurm_env()["SLURM_CONF"]).read_text().splitlines()
    conf.write_text(
        "\n".join(
            "SlurmctldPort=16999" if line.startswith("SlurmctldPort=") else line for line in lines
        )
        + "\n"
    )
    env = {**slurm_env(), "SLURM_CONF": str(conf)}
    run = subprocess.run(
        [*HPCDIST, "submit", "--nodes=2", "--backend=gloo", "--dry-run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.startswith(
        f"hpcdist: error: SLURM is configured here (SLURM_CONF={conf}) but its controller "
        "does not answer (sinfo: "
    )
    assert run.stderr.endswith("); pass --executor local to run on this machine instead\n")
    assert run.stderr.count("\n") == 1
    assert not (tmp_path / ".hpcdist").exists()
