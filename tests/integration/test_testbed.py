"""The testbed itself: the facts every other integration test relies on."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import JobStateFn, SlurmCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slurm_versions
def test_sinfo_shows_four_idle_nodes_in_debug(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(
        "sinfo", "-h", "-N", "-p", slurm_cluster.partition, "-o", "%N %P %t %c"
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    # Tests may run jobs concurrently, so a node may be busy; it must not be down or drained.
    assert [r[0] for r in rows] == list(slurm_cluster.nodes)
    assert all(r[1] == "debug*" and r[2] in {"idle", "mix", "alloc", "comp"} for r in rows), rows
    assert {r[3] for r in rows} == {"2"}


def test_scontrol_expands_hostlists(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("scontrol", "show", "hostnames", "node[1-3]").stdout
    assert out.split() == ["node1", "node2", "node3"]


@pytest.mark.slurm_versions
def test_srun_spans_four_nodes_that_resolve_by_name(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(
        "srun",
        "-N4",
        "-n4",
        "--ntasks-per-node=1",
        "--time=1",
        "bash",
        "-c",
        'echo "$SLURM_PROCID $SLURMD_NODENAME $(getent hosts node3 | cut -d" " -f1)"',
        timeout=120,
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [
        ["0", "node1", "127.0.0.1"],
        ["1", "node2", "127.0.0.1"],
        ["2", "node3", "127.0.0.1"],
        ["3", "node4", "127.0.0.1"],
    ]


def test_sbatch_wait_job_is_completed_in_sacct(
    slurm_cluster: SlurmCluster, job_state: JobStateFn, tmp_path: Path
) -> None:
    out = tmp_path / "job.out"
    job = slurm_cluster.sbatch(
        '#!/bin/bash\nscontrol show hostnames "$SLURM_JOB_NODELIST"\n',
        "--nodes=2",
        "--time=1",
        f"--output={out}",
    )
    assert job.returncode == 0, job.stderr
    assert job_state(job.job_id) == "COMPLETED"
    hosts = out.read_text().split()
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_cluster.nodes), hosts


def test_failing_job_is_failed_in_sacct(
    slurm_cluster: SlurmCluster, job_state: JobStateFn, tmp_path: Path
) -> None:
    job = slurm_cluster.sbatch(
        "#!/bin/bash\nexit 3\n", "--time=1", f"--output={tmp_path / 'job.out'}"
    )
    assert job.returncode == 3
    assert job_state(job.job_id) == "FAILED"
    exit_code = slurm_cluster.run(
        "sacct", "-X", "-n", "-P", "-j", str(job.job_id), "-o", "ExitCode"
    ).stdout.split()
    assert exit_code == ["3:0"]


def test_cancelled_job_is_cancelled_in_sacct(
    slurm_cluster: SlurmCluster, job_state: JobStateFn, tmp_path: Path
) -> None:
    job = slurm_cluster.sbatch(
        "#!/bin/bash\nsleep 300\n", "--time=10", f"--output={tmp_path / 'job.out'}", wait=False
    )
    slurm_cluster.run("scancel", str(job.job_id))
    assert job_state(job.job_id, timeout=60) == "CANCELLED"


def test_a_base_directory_too_long_for_slurmstepds_sockets_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    # spool/node4/node4_<id>.4294967291 below this base is 123 bytes, over the 107 a Unix
    # socket's path can hold: slurmstepd could not listen, every job would hang at launch.
    base = Path("/tmp") / ("x" * 80)
    env = {**os.environ, "HPCDIST_TESTBED_DIR": str(base), "HPCDIST_TESTBED_PORT_OFFSET": "90"}
    proc = subprocess.run(
        [str(REPO / "scripts" / "slurm-testbed"), "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert f"base directory {base} is too long for slurmstepd's sockets" in proc.stderr
    assert "123 > 107 bytes" in proc.stderr
    assert not base.exists()


def _up(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts" / "slurm-testbed"), "up"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_slurm_version_the_testbed_cannot_make_is_one_line(tmp_path: Path) -> None:
    proc = _up({"HPCDIST_TESTBED_DIR": str(tmp_path / "tb"), "HPCDIST_TESTBED_SLURM": "23.02"})
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        "slurm-testbed: up failed: HPCDIST_TESTBED_SLURM='23.02'; expected one of 22.05, "
        "24.11, 26.05\n"
    )


def test_a_base_directory_keeps_the_slurm_version_of_its_state() -> None:
    # SLURM converts its saved state only forward, and not across many releases: a base
    # directory that ran 22.05 is never handed to 26.05 (nor back). A short path: a parallel
    # worker's tmp_path is too long for slurmstepd's sockets, which `up` checks too.
    base = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
    try:
        (base / "etc").mkdir(parents=True)
        (base / "state").mkdir()
        (base / "state" / "job_state").write_text("")
        (base / "etc" / "testbed.json").write_text('{"slurm": "22.05", "port_offset": 95}')
        proc = _up(
            {
                "HPCDIST_TESTBED_DIR": str(base),
                "HPCDIST_TESTBED_SLURM": "26.05",
                "HPCDIST_TESTBED_PORT_OFFSET": "95",
            }
        )
        assert (proc.returncode, proc.stdout) == (1, "")
        assert (
            f"slurm-testbed: up failed: {base} holds the state of SLURM 22.05, not 26.05"
            in proc.stderr
        ), proc.stderr
        assert not (base / "etc" / "slurm.conf").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MGMT": "1", "NETNS": "0"}, "HPCDIST_TESTBED_MGMT=1 needs HPCDIST_TESTBED_NETNS=1"),
        (
            {"SITE": "strict", "ACCOUNTING": "0"},
            "HPCDIST_TESTBED_SITE=strict needs accounting (associations, QOS); "
            "HPCDIST_TESTBED_ACCOUNTING=0 was given",
        ),
        (
            {"SOCKETS": "2", "CORES_PER_SOCKET": "8", "THREADS_PER_CORE": "2", "CPUS": "16"},
            "HPCDIST_TESTBED_CPUS=16 disagrees with the declared layout 2x8x2 "
            "(SOCKETS x CORES_PER_SOCKET x THREADS_PER_CORE = 32)",
        ),
    ],
    ids=["mgmt-without-netns", "strict-without-accounting", "cpus-against-layout"],
)
def test_a_site_shape_the_testbed_cannot_make_is_one_line_and_starts_nothing(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    base = tmp_path / "tb"
    proc = _up(
        {"HPCDIST_TESTBED_DIR": str(base), **{f"HPCDIST_TESTBED_{k}": v for k, v in env.items()}}
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"slurm-testbed: up failed: {message}\n"
    assert not base.exists()
