"""The wheel carries the templates and profiles: install it in a fresh venv and render."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_renders_from_outside_the_source_tree(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(wheels),
         str(REPO)],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("hpcdist-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    # Rendering needs only these; torch and submitit stay out of this venv on purpose.
    subprocess.run([*pip, "jinja2", "click", "pyyaml"], check=True)
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [str(env_dir / "bin" / "hpcdist"), "render", "--mode", "gloo", "--nodes", "4"],
        cwd=elsewhere, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=4" in proc.stdout
    script = elsewhere / "job.sh"
    script.write_text(proc.stdout)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    gpu = subprocess.run(
        [str(env_dir / "bin" / "hpcdist"), "render", "--profile", "gpu-cluster", "--mode", "nccl"],
        cwd=elsewhere, capture_output=True, text=True,
    )
    assert gpu.returncode == 0, gpu.stderr
    assert "#SBATCH --gpus-per-node=4" in gpu.stdout
