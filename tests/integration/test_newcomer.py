"""A newcomer's first jobs on a cluster hpcdist has never seen: no profile, a clean home, on
the testbed shaped like a real site (nodes in network namespaces of their own, a management
interface on every node, 2x8x2 = 32 CPUs a node, a strict site's policies; see
test_netns_testbed.py). Every job either completes or is refused before anything is queued,
in one line that names the blocker and the fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_netns_testbed import SUBNET, NetBed, bed

pytestmark = pytest.mark.xdist_group("netns")
__all__ = ["bed"]  # the namespaced testbed's fixture, used below

HPCDIST = [shutil.which("hpcdist") or "hpcdist"]
Completed = subprocess.CompletedProcess[str]


def newcomer(bed: NetBed, home: Path) -> dict[str, str]:
    """The environment of a user who has never run hpcdist: a clean home, no profile."""
    env = {
        k: v for k, v in bed.env.items() if not k.startswith(("HPCDIST_", "XDG_", "GLOO_", "NCCL_"))
    }
    home.mkdir(exist_ok=True)
    env["HOME"] = str(home)
    return env


def hpcdist(env: dict[str, str], cwd: Path, *argv: str, timeout: float = 600) -> Completed:
    return subprocess.run(
        [*HPCDIST, *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def queued(bed: NetBed) -> str:
    return bed.run("squeue", "-h", "-o", "%i %P %j").stdout.strip()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


def test_the_first_submit_names_the_missing_default_partition_and_queues_nothing(
    bed: NetBed, tmp_path: Path, work: Path
) -> None:
    env = newcomer(bed, tmp_path / "home")
    for argv in (
        ("submit", "--nodes=4", "--backend=gloo", "--wait"),
        ("render", "--nodes", "4", "--backend", "gloo", "--script", "job.sh"),
    ):
        proc = hpcdist(env, work, *argv)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines() == [
            "hpcdist: error: the cluster has no default partition and none was given; use "
            "--partition one of batch, short, prio (the cluster's own description: no profile "
            "named)"
        ]
        assert queued(bed) == ""
        assert list(work.iterdir()) == []


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        (
            "maint",
            "partition maint is DOWN: jobs wait there and none starts; use --partition one of "
            "batch, short, prio",
        ),
        ("nope", "partition 'nope' does not exist; use --partition one of batch, short, maint"),
    ],
)
def test_a_partition_that_runs_nothing_is_refused_before_queueing(
    bed: NetBed, tmp_path: Path, work: Path, partition: str, message: str
) -> None:
    env = newcomer(bed, tmp_path / "home")
    proc = hpcdist(env, work, "submit", "--nodes=4", "--backend=gloo", f"--partition={partition}")
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(f"hpcdist: error: {message}"), proc.stderr
    assert queued(bed) == ""


def _rank_lines(log: str) -> list[str]:
    return sorted(line for line in log.splitlines() if "[Rank " in line and " net " in line)


def test_the_first_gloo_job_completes_on_the_sites_real_cores_and_network(
    bed: NetBed, tmp_path: Path, work: Path
) -> None:
    env = newcomer(bed, tmp_path / "home")
    proc = hpcdist(
        env, work, "submit", "--nodes=4", "--backend=gloo", "--partition=batch", "--wait"
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    job_id = re.search(r"Job (\d+) ended COMPLETED", proc.stdout + proc.stderr)
    assert job_id, proc.stdout + proc.stderr
    log = (work / f"ufsemulator-gloo-{job_id[1]}.out").read_text()
    ranks = _rank_lines(log)
    assert len(ranks) == 4, log
    for node, line in enumerate(ranks, start=1):
        # Each rank on the nodes' network (hsn0), never loopback nor the management eth0.
        assert line.endswith(f"net hsn0 ({SUBNET}.{node + 10} on the route to rank 0 at node1)"), (
            line
        )
    assert "threads 24" in ranks[0]  # 32 CPUs a node, a quarter kept for the exchange
    assert "Training completed" in log


def test_sbatch_of_the_rendered_script_completes_and_binds_no_interface(
    bed: NetBed, tmp_path: Path, work: Path
) -> None:
    env = newcomer(bed, tmp_path / "home")
    # 10 epochs: the submitted job above trains the default 150; this one shows the script.
    proc = hpcdist(
        env,
        work,
        "render",
        "--nodes",
        "4",
        "--backend",
        "gloo",
        "--partition",
        "batch",
        "--set",
        "training.epochs=10",
    )
    assert proc.returncode == 0, proc.stderr
    script = work / "job.sh"
    script.write_text(proc.stdout)
    assert "#SBATCH --cpus-per-task=32\n" in proc.stdout
    assert '#SBATCH --partition="batch"\n' in proc.stdout
    assert "SOCKET_IFNAME" not in proc.stdout
    assert "partition batch: 4 nodes of 32 CPUs" in proc.stdout.splitlines()[2]
    sbatch = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, cwd=work, capture_output=True, text=True
    )
    assert sbatch.returncode == 0, sbatch.stderr
    job_id = int(sbatch.stdout.split(";")[0])
    assert bed.finish(job_id, timeout=600) == "COMPLETED"
    ranks = _rank_lines((work / f"ufsemulator-gloo-{job_id}.out").read_text())
    assert len(ranks) == 4 and all(" net hsn0 (" in line for line in ranks), ranks


@pytest.mark.parametrize(
    ("partition", "directive"),
    [
        ("short", '#SBATCH --time="00:05:00"'),  # MaxTime 5 min: the default time cut to it
        ("prio", '#SBATCH --qos="high"'),  # AllowQos=high: the user's QOS that it allows
    ],
)
def test_a_partition_with_a_policy_gets_what_it_requires_and_completes(
    bed: NetBed, tmp_path: Path, work: Path, partition: str, directive: str
) -> None:
    env = newcomer(bed, tmp_path / "home")
    flags = ("--nodes=2", "--backend=gloo", f"--partition={partition}")
    rendered = hpcdist(env, work, "render", *flags, "--set", "training.epochs=3")
    assert directive in rendered.stdout.splitlines(), rendered.stdout[:2000]
    proc = hpcdist(env, work, "submit", *flags, "--set", "training.epochs=3", "--wait")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "ended COMPLETED" in proc.stdout + proc.stderr


def test_the_cluster_description_is_kept_in_the_users_private_state(
    bed: NetBed, tmp_path: Path, work: Path
) -> None:
    env = newcomer(bed, tmp_path / "home")
    proc = hpcdist(env, work, "render", "--partition", "batch")
    assert proc.returncode == 0, proc.stderr
    kept = list((tmp_path / "home" / ".local" / "state" / "hpcdist" / "clusters").iterdir())
    assert len(kept) == 1 and kept[0].name.startswith("hpcdist-")
    assert oct(os.stat(kept[0]).st_mode & 0o777) == "0o600"
