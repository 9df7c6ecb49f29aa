"""The communication check on the testbed: hpc/test_distributed.sh and the test mode."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import SlurmCluster, sbatch, unlabel

REPO = Path(__file__).resolve().parents[2]


def _render_test_job(tmp_path: Path, **flags: object) -> Path:
    script = tmp_path / "job.sh"
    script.write_text(render(spec_from_options({"profile": "local", "mode": "test", **flags})))
    return script


def _output(tmp_path: Path, job_id: int) -> str:
    (out,) = tmp_path.glob(f"*-{job_id}.out")
    return unlabel(out.read_text())


@pytest.mark.slurm_versions
def test_committed_test_distributed_script_passes_on_two_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # As a user would: plain sbatch of the committed script from the repository root.
    job = sbatch(
        REPO / "hpc" / "test_distributed.sh",
        f"--output={tmp_path}/%x-%j.out",
        cwd=REPO,
        timeout=300,
    )
    text = _output(tmp_path, job.job_id)
    assert job.returncode == 0, text
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"
    assert "PASS" in text
    assert "Distributed training initialized: gloo backend, 2 processes" in text


@pytest.mark.parametrize(
    ("flags", "world"),
    [({"nodes": 4}, 4), ({"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1}, 4)],
    ids=["4-nodes", "2-nodes-x-2-tasks"],
)
def test_test_mode_passes(
    slurm_cluster: SlurmCluster, tmp_path: Path, flags: dict[str, object], world: int
) -> None:
    job = sbatch(_render_test_job(tmp_path, **flags), cwd=tmp_path, timeout=300)
    text = _output(tmp_path, job.job_id)
    assert job.returncode == 0, text
    pass_lines = [line for line in text.splitlines() if line.startswith("PASS")]
    assert len(pass_lines) == 1, text
    assert f"world size {world}" in pass_lines[0] or f"world_size={world}" in pass_lines[0]
    for rank in range(world):
        assert f"[Rank {rank}]" in text


def test_two_test_jobs_on_the_same_nodes_both_pass(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # 1 CPU per task leaves room for both jobs on the same two nodes at the same time.
    script = _render_test_job(tmp_path, nodes=2, cpus_per_task=1)
    first = sbatch(script, "--nodelist=node1,node2", cwd=tmp_path, wait=False)
    second = sbatch(script, "--nodelist=node1,node2", cwd=tmp_path, wait=False)
    states = [slurm_cluster.job_state(j.job_id, timeout=300) for j in (first, second)]
    texts = [_output(tmp_path, j.job_id) for j in (first, second)]
    assert states == ["COMPLETED", "COMPLETED"], texts
    for text in texts:
        assert any(line.startswith("PASS") for line in text.splitlines()), text


def test_unreachable_master_fails_with_diagnosis_within_timeout(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = _render_test_job(
        tmp_path,
        nodes=2,
        time="10:00",
        env=("MASTER_ADDR=10.255.255.1",),
        command="python3 -m hpcdist.distributed.commcheck --timeout 15",
    )
    started = time.monotonic()
    job = sbatch(script, cwd=tmp_path, timeout=300)
    elapsed = time.monotonic() - started
    text = _output(tmp_path, job.job_id)
    assert job.returncode != 0
    assert slurm_cluster.job_state(job.job_id) == "FAILED"
    assert elapsed < 120, f"took {elapsed:.0f} s: waited for something other than the timeout"
    assert "FAIL" in text
    assert "10.255.255.1" in text
    assert "GLOO_SOCKET_IFNAME" in text
