"""The base install is the command line of a login node: the wheel, with its declared
dependencies and without torch, renders, dry-runs a submission and follows a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # No SLURM_CONF: the base install must answer without a cluster too.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "HPCDIST"))}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_base_install_without_torch_renders_submits_and_follows(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(wheels),
            str(REPO),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("hpcdist-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, hpcdist = str(env_dir / "bin" / "python"), str(env_dir / "bin" / "hpcdist")
    # The wheel with the dependencies it declares, nothing else.
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(wheel)], check=True)
    installed = _run([python, "-m", "pip", "list", "--format=freeze"], tmp_path).stdout.lower()
    for heavy in ("torch", "numpy", "netcdf4", "matplotlib"):
        assert f"\n{heavy}==" not in f"\n{installed}", installed

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _run([hpcdist, "render", "--mode", "gloo", "--nodes", "4"], elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=4" in proc.stdout
    script = elsewhere / "job.sh"
    script.write_text(proc.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    gpu = _run([hpcdist, "render", "--profile", "gpu-cluster", "--mode", "nccl"], elsewhere)
    assert gpu.returncode == 0, gpu.stderr
    assert "#SBATCH --gpus-per-node=4" in gpu.stdout

    dry = _run([hpcdist, "submit", "--nodes", "3", "--executor", "local", "--dry-run"], elsewhere)
    assert dry.returncode == 0, dry.stderr
    assert "srun --nodes=3 --ntasks-per-node=1" in json.loads(dry.stdout)["script"]
    assert not (elsewhere / ".hpcdist").exists()

    # A job that needs no torch, run by the local executor, then followed.
    done = _run(
        [
            hpcdist,
            "submit",
            "--nodes",
            "1",
            "--executor",
            "local",
            "--command",
            "echo from-the-job",
            "--wait",
        ],
        elsewhere,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "from-the-job" in done.stdout
    status = _run([hpcdist, "status"], elsewhere)
    assert status.returncode == 0, status.stderr
    assert status.stdout.split()[1] == "COMPLETED"
