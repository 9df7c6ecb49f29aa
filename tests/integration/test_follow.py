"""Following any job on the testbed: `hpcdist status` / `logs` / `list` for jobs that hpcdist
did not submit, and `hpcdist run` inside an allocation made by salloc."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import (
    SlurmCluster,
    SubmittedJob,
    run_slurm,
    sbatch,
    slurm_env,
    unlabel,
)

# On one xdist worker: one job that runs into its time limit, made once for the module.
pytestmark = pytest.mark.xdist_group("test_follow")

REPO = Path(__file__).resolve().parents[2]
HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]


def hpcdist(*args: str, cwd: Path, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *args],
        cwd=cwd,
        env=slurm_env({"PYTHONPATH": str(REPO)}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _field(status: str, name: str) -> str:
    """The value of one `  name: value` line of `hpcdist status`."""
    for line in status.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key == name:
            return value.strip()
    raise AssertionError(f"no {name!r} line in:\n{status}")


@pytest.fixture(scope="module")
def timed_out_job(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SubmittedJob]:
    """A job killed by its 1-minute limit: submitted first, checked last (it takes ~90 s)."""
    folder = tmp_path_factory.mktemp("timeout")
    job = sbatch(
        "#!/bin/bash\necho started\nsleep 300\n",
        "--time=1",
        "--job-name=sleeper",
        f"--output={folder}/%x-%j.out",
        wait=False,
        cwd=folder,
    )
    yield job
    run_slurm("scancel", str(job.job_id), check=False)


@pytest.mark.slurm_versions
def test_plain_sbatch_job_status_efficiency_logs_and_list(
    slurm_cluster: SlurmCluster, tmp_path: Path, timed_out_job: SubmittedJob
) -> None:
    # As the README says for plain SLURM: sbatch the committed script, no hpcdist involved.
    job = sbatch(
        REPO / "hpc" / "test_distributed.sh",
        f"--output={tmp_path}/%x-%j.out",
        cwd=REPO,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"  # sacct has its rows now
    status = hpcdist("status", str(job.job_id), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0] == f"{job.job_id} COMPLETED"
    assert _field(status.stdout, "exit code") == "0"
    assert _field(status.stdout, "nodes").endswith("(2)")
    assert _field(status.stdout, "stdout") == f"{tmp_path}/hpcdist-commcheck-{job.job_id}.out"
    efficiency = _field(status.stdout, "efficiency")
    assert "wall time" in efficiency and "of 0:30:00" in efficiency
    # The testbed gathers accounting (jobacct_gather/linux): CPU time is recorded.
    assert re.match(r"CPU \d+(\.\d+)?% \(", efficiency), efficiency
    # A few seconds of a 30-minute limit: the advice says so. A communication check has no
    # warning (--mode test): no lead to keep room for, a minute holds it.
    assert "of its time limit: --time=0:01:00 would do" in _field(status.stdout, "advice")

    data = json.loads(hpcdist("status", "--json", str(job.job_id), cwd=tmp_path).stdout)
    assert (data["state"], data["exit_code"], data["signal"], data["num_nodes"]) == (
        "COMPLETED",
        0,
        0,
        2,
    )
    assert data["limit_s"] == 1800 and data["efficiency"]["time_fraction"] < 0.5

    logs = hpcdist("logs", str(job.job_id), cwd=tmp_path)
    assert logs.returncode == 0, logs.stderr
    assert any(line.startswith("PASS: world size 2") for line in unlabel(logs.stdout).splitlines())
    rank1 = hpcdist("logs", str(job.job_id), "--rank", "1", cwd=tmp_path).stdout.splitlines()
    assert rank1 and all(line.startswith("[Rank 1]") for line in rank1)

    listing = hpcdist("list", cwd=tmp_path)
    assert any(
        line.split()[:2] == [str(job.job_id), "COMPLETED"] for line in listing.stdout.splitlines()
    ), listing.stdout


@pytest.mark.slurm_versions
def test_held_job_is_pending_for_begin_time(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = sbatch(
        "#!/bin/bash\ntrue\n",
        "--begin=now+1hour",
        f"--output={tmp_path}/held-%j.out",
        wait=False,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the scheduler names the reason on its first pass over the job
            status = hpcdist("status", str(job.job_id), cwd=tmp_path)
            if "BeginTime" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status.stdout.splitlines()[0] == f"{job.job_id} PENDING", status.stdout
        assert re.fullmatch(
            r"BeginTime \(starts no earlier than \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\)",
            _field(status.stdout, "reason"),
        ), status.stdout
        assert _field(status.stdout, "nodes") == "none yet"
        data = json.loads(hpcdist("status", "--json", str(job.job_id), cwd=tmp_path).stdout)
        assert (data["state"], data["efficiency"]) == ("PENDING", None)
        assert data["reason"] == _field(status.stdout, "reason")
    finally:
        run_slurm("scancel", str(job.job_id), check=False)


def test_unknown_job_is_one_line_exit_2(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    status = hpcdist("status", "999999999", cwd=tmp_path)
    assert status.returncode == 2
    assert status.stdout == ""
    assert status.stderr.count("\n") == 1
    assert "job '999999999' was not submitted from this folder and SLURM does not know it" in (
        status.stderr
    )


@pytest.mark.slurm_versions
def test_logs_follow_until_the_job_ends(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = sbatch(
        "#!/bin/bash\necho first\nsleep 4\necho last\n",
        f"--output={tmp_path}/f-%j.out",
        wait=False,
        cwd=tmp_path,
    )
    followed = hpcdist("logs", str(job.job_id), "--follow", cwd=tmp_path, timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.splitlines() == ["first", "last"]


@pytest.mark.slurm_versions
def test_run_inside_salloc_runs_the_communication_check(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    proc = subprocess.run(
        ["salloc", "-N", "2", *HPCDIST, "run", "--mode", "test", "--profile", "local"],
        cwd=tmp_path,
        env=slurm_env({"PYTHONPATH": str(REPO)}),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(
        line.startswith("PASS: world size 2, gloo backend")
        for line in unlabel(proc.stdout).splitlines()
    ), proc.stdout + proc.stderr
    assert "Distributed training initialized: gloo backend, 2 processes" in proc.stdout


def test_job_killed_by_its_time_limit_is_timeout(
    slurm_cluster: SlurmCluster, tmp_path: Path, timed_out_job: SubmittedJob
) -> None:
    assert slurm_cluster.job_state(timed_out_job.job_id, timeout=240) == "TIMEOUT"
    status = hpcdist("status", str(timed_out_job.job_id), cwd=tmp_path)
    assert status.stdout.splitlines()[0] == f"{timed_out_job.job_id} TIMEOUT", status.stdout
    assert _field(status.stdout, "reason") == "TimeLimit"
    assert _field(status.stdout, "elapsed").endswith("of 0:01:00")
    assert "advice" not in status.stdout  # it used all of its time
    assert "started" in hpcdist("logs", str(timed_out_job.job_id), cwd=tmp_path).stdout
