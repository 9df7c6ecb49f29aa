"""hpcdist submit / status / logs / cancel against the real SLURM testbed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import SlurmCluster, slurm_env

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
COMMCHECK = f"{sys.executable} -m hpcdist.distributed.commcheck --timeout 60"


def hpcdist(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *args], cwd=cwd, env=slurm_env(), capture_output=True, text=True, timeout=timeout
    )


def _job_id(output: str) -> str:
    match = re.search(r"Submitted job (\d+) \(slurm", output)
    assert match, output
    return match.group(1)


@pytest.mark.slurm_versions
def test_submit_four_nodes_gloo_wait_completes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    run = hpcdist(
        "submit", "--nodes=4", "--backend=gloo", "--wait", "--command", COMMCHECK, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout
    job_id = _job_id(run.stdout)
    status = hpcdist("status", job_id, cwd=tmp_path)
    assert status.stdout.splitlines()[0] == f"{job_id} COMPLETED"
    listing = hpcdist("list", cwd=tmp_path)
    assert re.search(rf"{job_id}\s+COMPLETED\s+\S+\s+slurm", listing.stdout)


def test_failing_job_is_failed_and_logs_show_the_traceback(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    command = f"{sys.executable} -c \"raise RuntimeError('emulator diverged at step 7')\""
    run = hpcdist(
        "submit", "--nodes=2", "--backend=gloo", "--wait", "--command", command, cwd=tmp_path
    )
    assert run.returncode == 1
    job_id = _job_id(run.stdout)
    assert hpcdist("status", job_id, cwd=tmp_path).stdout.splitlines()[0] == f"{job_id} FAILED"
    # Both ranks raise; whichever does first ends the other (--kill-on-bad-exit), so the
    # traceback is in one rank's log or in both. srun may end the step before the first
    # rank's last lines reach it (seen on a loaded host: the log held "0: Traceback (most
    # recent call last):" and no more), so the traceback's first line is what is sure.
    logs = [hpcdist("logs", job_id, "--rank", str(rank), cwd=tmp_path) for rank in (0, 1)]
    assert any("Traceback (most recent call last)" in log.stdout for log in logs), logs
    whole = [log for log in logs if "RuntimeError" in log.stdout]
    assert all("RuntimeError: emulator diverged at step 7" in log.stdout for log in whole)


@pytest.mark.slurm_versions
def test_cancelled_job_shows_cancelled_and_wait_fails(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    command = f'{sys.executable} -c "import time; time.sleep(600)"'
    waiter = subprocess.Popen(
        [*HPCDIST, "submit", "--nodes=1", "--backend=gloo", "--wait", "--command", command],
        cwd=tmp_path,
        env=slurm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    first = waiter.stdout.readline()
    job_id = _job_id(first)
    time.sleep(3)
    cancel = hpcdist("cancel", job_id, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    rest, _ = waiter.communicate(timeout=180)
    assert waiter.returncode != 0
    assert f"Job {job_id} ended CANCELLED" in rest
    assert hpcdist("status", job_id, cwd=tmp_path).stdout.splitlines()[0] == f"{job_id} CANCELLED"


@pytest.mark.slurm_versions
def test_preflight_rejection_is_one_line(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    # A profile that believes in more nodes than the cluster has: only SLURM can say no.
    profile = tmp_path / "optimist.yaml"
    profile.write_text("partition: debug\nmax_nodes: 16\ncores_per_node: 2\n")
    run = hpcdist(
        "submit",
        "--profile",
        str(profile),
        "--nodes=8",
        "--backend=gloo",
        "--command",
        "true",
        cwd=tmp_path,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "SLURM rejects the request (8 nodes x 1 tasks x 2 CPUs" in lines[0]
    assert not (tmp_path / ".hpcdist" / "jobs").exists()


def test_dry_run_submits_nothing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    run = hpcdist("submit", "--nodes=2", "--backend=gloo", "--dry-run", cwd=tmp_path)
    assert run.returncode == 0
    shown = json.loads(run.stdout)
    assert shown["executor"] == "slurm"
    assert "--nodes=2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=1" in shown["script"]
    rendered = hpcdist("render", "--nodes=2", "--backend=gloo", cwd=tmp_path)
    assert shown["script"] == rendered.stdout  # what would be queued is what render prints
    assert not (tmp_path / ".hpcdist" / "jobs").exists()


def test_submit_from_inside_a_job_does_not_leak_its_variables(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    inner = f"{sys.executable} -c \"import os; print('INNER', os.environ['SLURM_JOB_NUM_NODES'], os.environ['SLURM_JOB_NAME'])\""  # noqa: E501
    outer = tmp_path / "outer.sh"
    outer.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n"
        "#SBATCH --job-name=outer-job\n#SBATCH --output=outer.out\n"
        f"{' '.join(HPCDIST)} submit --nodes=2 --backend=gloo --job-name inner-job --wait "
        f"--command {shlex.quote(inner)}\n"
    )
    job = slurm_cluster.sbatch(outer, cwd=tmp_path, timeout=300)
    text = (tmp_path / "outer.out").read_text()
    assert job.returncode == 0, text
    assert "INNER 2 inner-job" in text
