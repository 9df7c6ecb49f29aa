"""Site options on the real testbed: pass-through and first-class options reach SLURM from
`hpcdist submit`; per-rank log files; a container job through a stand-in runtime; and, on a
second testbed in GPU mode, a typed GPU request and a GPU count read from the partition."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdist.render.script import quote, render
from hpcdist.slurm.probe import tres_gpus
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import SlurmCluster, sbatch, slurm_env
from tests.integration.sidebed import FINAL, SideBed, show_job, side_testbed, wait_state
from tests.integration.test_submit_slurm import COMMCHECK, _job_id, hpcdist

# On one xdist worker: a GPU side testbed, made once for the module.
pytestmark = pytest.mark.xdist_group("test_site_slurm")


def test_submit_passes_sbatch_constraint_and_srun_args_to_slurm(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run = hpcdist(
        "submit",
        "--nodes=2",
        "--backend=gloo",
        "--sbatch",
        "comment=site-test",
        "--constraint",
        "testbed",
        "--srun-arg=--cpu-bind=cores",
        "--mail-type",
        "END",
        "--mail-user",
        "nobody",
        "--wait",
        "--command",
        COMMCHECK,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASS" in run.stdout
    job_id = _job_id(run.stdout)
    shown = show_job(int(job_id))
    assert shown["Comment"] == "site-test"
    assert shown["Features"] == "testbed"
    assert shown["MailType"] == "END" and shown["MailUser"] == "nobody"
    # submitit keeps the script it queued: the rendered one, srun line and all.
    script = (tmp_path / ".hpcdist" / "submitit" / job_id / f"{job_id}_submission.sh").read_text()
    assert re.search(r"^\s*srun .*--cpu-bind=cores", script, re.M), script


@pytest.mark.slurm_versions
def test_a_feature_no_node_has_is_refused_before_submitting(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    run = hpcdist("submit", "--constraint", "nosuch", "--command", "true", cwd=tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("hpcdist: error: SLURM rejects the request")
    assert "feature" in line.lower(), line
    assert not (tmp_path / ".hpcdist" / "jobs").exists()


def test_split_rank_logs_are_found_by_logs_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "rank_logs": "split",
            "command": COMMCHECK,
        }
    )
    job = sbatch(render(spec), cwd=tmp_path, wait=False)
    assert slurm_cluster.job_state(job.job_id) == "COMPLETED"
    for rank in (0, 1):
        own = tmp_path / f"hpcdist-commcheck-{job.job_id}.rank{rank}.out"
        assert f"[Rank {rank}]" in own.read_text()
        logs = hpcdist("logs", str(job.job_id), "--rank", str(rank), cwd=tmp_path)
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == own.read_text()
    # The batch shell's own lines stay in the job's log, the ranks' are in theirs.
    main = (tmp_path / f"hpcdist-commcheck-{job.job_id}.out").read_text()
    assert "hpcdist: job" in main and "[Rank" not in main


# A stand-in for apptainer: checks the arguments hpcdist gives it, records what the rank
# would see inside, and runs the command. No container runtime runs here.
STAND_IN = """#!/bin/bash
set -eu
[ "$1" = exec ] || { echo "stand-in: expected exec, got $1" >&2; exit 64; }
shift
binds=()
while [ "${1#-}" != "$1" ]; do
  case "$1" in
    --bind=*) binds+=("${1#--bind=}") ;;
    --writable-tmpfs|--nv) ;;
    *) echo "stand-in: unknown option $1" >&2; exit 64 ;;
  esac
  shift
done
image="$1"; shift
[ -f "$image" ] || { echo "stand-in: no image $image" >&2; exit 65; }
{
  echo "image=$image binds=${binds[*]}"
  env | grep -E '^(SLURM_PROCID|SLURM_NTASKS|SLURM_JOB_ID|GLOO_SOCKET_IFNAME|HPCDIST_[A-Z_]+)='
} > "$(dirname "$image")/inside-${SLURM_PROCID}.txt"
exec "$@"
"""


def test_container_job_runs_through_a_stand_in_runtime_with_the_contract_inside(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text(STAND_IN)
    (bindir / "apptainer").chmod(0o755)
    image = tmp_path / "emu.sif"
    image.write_text("not a real image\n")
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "container": str(image),
            "container_mounts": (f"{tmp_path}:{tmp_path}",),
            "container_options": ("--writable-tmpfs",),
            "command": COMMCHECK,
        }
    )
    script = tmp_path / "container.sh"
    script.write_text(render(spec))
    # sbatch passes its PATH on to the job: the ranks find the stand-in first.
    env = slurm_env({"PATH": f"{bindir}:{slurm_env()['PATH']}"})
    proc = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    job_id = int(proc.stdout.strip().split(";")[0])
    state = slurm_cluster.job_state(job_id)
    log = (tmp_path / f"hpcdist-commcheck-{job_id}.out").read_text()
    assert state == "COMPLETED", log
    assert "PASS: world size 2" in log
    for rank in (0, 1):
        inside = (tmp_path / f"inside-{rank}.txt").read_text()
        assert f"image={image} binds={tmp_path}:{tmp_path}" in inside
        for line in (
            f"SLURM_PROCID={rank}",
            "SLURM_NTASKS=2",
            f"SLURM_JOB_ID={job_id}",
            "GLOO_SOCKET_IFNAME=lo",
            "HPCDIST_SIGNAL=USR2",
            f"HPCDIST_REQUEUE_MARKER={tmp_path}/.hpcdist/requeue/{job_id}",
        ):
            assert line in inside.splitlines(), inside


@pytest.fixture(scope="module")
def gpu_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBed]:
    """2 nodes x 2 GPUs of type tesla, the GPUs being plain files standing in for devices."""
    devices = tmp_path_factory.mktemp("gpudev")
    for index in range(4):
        (devices / f"nvidia{index}").write_text("")
    with side_testbed(
        "gpu", 72, gpus="2", gpu_type="tesla", gpu_device=str(devices / "nvidia")
    ) as bed:
        yield bed


ENV_PRINT = f"{sys.executable} -c " + quote(
    "import os; print('rank', os.environ['SLURM_PROCID'], 'gpus', "
    "os.environ.get('SLURM_GPUS_ON_NODE'))"
)


@pytest.mark.slurm_versions
def test_submit_without_a_gpu_count_runs_one_rank_per_gpu_counted_in_the_job(
    gpu_testbed: SideBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gpu_testbed.active(monkeypatch):
        run = hpcdist(
            "submit", "--mode=nccl", "--nodes=2", "--wait", "--command", ENV_PRINT, cwd=tmp_path
        )
        assert run.returncode == 0, run.stdout + run.stderr
        job_id = _job_id(run.stdout)
        assert "2 nodes x one task per GPU" in run.stdout
        shown = show_job(int(job_id))
        assert shown["JobState"] == "COMPLETED"
        log = (tmp_path / f"hpcdist-nccl-{job_id}.out").read_text()
        # The script counted each node's 2 GPUs and started a rank on each.
        assert "hpcdist: 2 GPUs on node" in log, log
        ranks = sorted(re.findall(r"rank (\d) gpus 2", log))
        assert ranks == ["0", "1", "2", "3"], log


def test_rendered_gpu_type_job_is_scheduled_on_the_typed_gpus(
    gpu_testbed: SideBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "nccl",
            "nodes": 1,
            "gpus_per_node": 2,
            "cpus_per_task": 1,
            "gpu_type": "tesla",
            "command": ENV_PRINT,
        }
    )
    text = render(spec)
    assert '#SBATCH --gres="gpu:tesla:2"' in text
    with gpu_testbed.active(monkeypatch):
        job = sbatch(text, cwd=tmp_path, wait=False)
        shown = wait_state(job.job_id, FINAL, timeout=120)
        log = (tmp_path / f"hpcdist-nccl-{job.job_id}.out").read_text()
        assert shown["JobState"] == "COMPLETED", log
        # 22.05 writes gres:gpu:tesla:2, 23.02 and later gres/gpu:tesla:2.
        assert shown["TresPerNode"] in ("gres:gpu:tesla:2", "gres/gpu:tesla:2")
        assert tres_gpus(shown["TresPerNode"]) == ("tesla", 2)
        assert "0: rank 0 gpus 2" in log and "1: rank 1 gpus 2" in log
