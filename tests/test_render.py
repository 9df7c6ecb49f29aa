"""Rendering: scripts parse, quote every user value, and carry the spec's directives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli import cli
from hpcdist.hpcscripts import HPC_SCRIPTS, render_hpc_script
from hpcdist.options import spec_from_options
from hpcdist.render import quote, render

REPO = Path(__file__).resolve().parents[1]

# Strings that would run a command if any of them reached bash unquoted. "MARKER" is
# replaced by a file path per test; the file must never come into being.
PAYLOADS = [
    'x"; touch MARKER #',
    "x'; touch MARKER #",
    "$(touch MARKER)",
    "`touch MARKER`",
    "a;touch MARKER",
    "a && touch MARKER",
    "a | touch MARKER",
    "a # touch MARKER",
    "back\\slash\\$(touch MARKER)",
    "with space ${HOME} $(touch MARKER)",
    "naïve ✓ 日本語 > MARKER",
]


def _bash_n(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.sh"
    path.write_text(script)
    return subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize(
    "flags",
    [
        {"mode": "threads", "profile": "cpu-cluster", "cpus_per_task": 40},
        {"mode": "gloo", "nodes": 4},
        {"mode": "gloo", "nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1},
        {"mode": "test", "nodes": 2},
        {"mode": "nccl", "profile": "gpu-cluster", "nodes": 2},
        {"mode": "nccl", "profile": "gpu-cluster", "nodes": 2, "launcher": "torchrun"},
        {"mode": "gloo", "nodes": 2, "launcher": "torchrun", "memory": "1000M", "account": "a"},
    ],
)
def test_every_mode_renders_a_script_bash_can_parse(flags: dict[str, Any], tmp_path: Path) -> None:
    script = render(spec_from_options({"profile": None, **flags}))
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script
    assert "--kill-on-bad-exit=1" in script
    assert _bash_n(script, tmp_path).returncode == 0


def test_srun_gets_cpus_per_task_explicitly() -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "nodes": 2, "tasks_per_node": 2,
                              "cpus_per_task": 1})
    script = render(spec)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in script
    assert "srun --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1" in script
    assert 'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"' in script


def test_nccl_asks_for_gpus_and_torchrun_starts_one_per_node() -> None:
    spec = spec_from_options({"profile": "gpu-cluster", "mode": "nccl", "nodes": 2,
                              "launcher": "torchrun"})
    script = render(spec)
    assert "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=64" in script
    assert "--nproc-per-node=4" in script
    assert " -m ufsemulator train" in script
    assert "export OMP_NUM_THREADS=16" in script


def _run_script(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run a rendered script under bash with a stand-in srun that records its argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    argv_file = tmp_path / "srun-argv"
    fake_srun = bindir / "srun"
    fake_srun.write_text(
        "#!/bin/bash\n"
        f"printf '%s\\n' \"$@\" > {quote(str(argv_file))}\n"
        f"env > {quote(str(tmp_path / 'srun-env'))}\n"
    )
    fake_srun.chmod(0o755)
    job = tmp_path / "job.sh"
    job.write_text(script)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_CPUS_PER_TASK": "2",
    }
    proc = subprocess.run(["bash", str(job)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30)
    argv = argv_file.read_text().splitlines() if argv_file.exists() else []
    return proc, argv


@pytest.mark.parametrize("payload", PAYLOADS)
def test_user_values_never_execute(payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    value = payload.replace("MARKER", str(marker))
    spec = spec_from_options({
        "profile": None,
        "mode": "gloo",
        "job_name": value,
        "output": value + "-%j.out",
        "error": value + ".err",
        "workdir": value,
        "env": (f"PAYLOAD={value}",),
        "command": f"python3 -c 'pass' {quote(value)}",
    })
    script = render(spec)
    assert _bash_n(script, tmp_path).returncode == 0
    proc, argv = _run_script(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), f"payload {payload!r} executed"
    # srun got the command word for word, the payload as one argument.
    assert argv[-4:] == ["python3", "-c", "pass", value]
    env_seen = (tmp_path / "srun-env").read_text()
    assert f"PAYLOAD={value}\n" in env_seen


def test_sbatch_quoting_keeps_the_value_for_sbatchs_parser() -> None:
    # sbatch groups with double quotes and reads backslash as an escape everywhere.
    assert quote('x"; rm -rf ~ #', "sbatch") == '"x\\"; rm -rf ~ #"'
    assert quote("a\\b", "sbatch") == '"a\\\\b"'
    assert quote("it's", "shell") == "'it'\"'\"'s'"


@pytest.mark.parametrize("name", sorted(HPC_SCRIPTS))
def test_committed_hpc_script_matches_a_fresh_render(name: str, tmp_path: Path) -> None:
    committed = (REPO / "hpc" / name).read_text()
    assert committed == render_hpc_script(name), (
        f"hpc/{name} drifted from the templates: run python3 -m hpcdist.hpcscripts"
    )
    assert os.access(REPO / "hpc" / name, os.X_OK)
    assert _bash_n(committed, tmp_path).returncode == 0


def test_hpc_scripts_check_command_reports_drift(tmp_path: Path) -> None:
    from hpcdist.hpcscripts import main

    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--dir", str(tmp_path), "--check"]) == 0
    (tmp_path / "train.sh").write_text("#!/bin/bash\n")
    assert main(["--dir", str(tmp_path), "--check"]) == 1


def test_render_to_file_is_atomic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    runner = CliRunner()
    first = runner.invoke(cli, ["render", "--nodes", "2", "-o", str(out)])
    assert first.exit_code == 0, first.output
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text
    again = runner.invoke(cli, ["render", "--nodes", "3", "-o", str(out)])
    assert again.exit_code == 2
    assert "exists; pass --force" in again.stderr
    assert out.read_text() == text
    forced = runner.invoke(cli, ["render", "--nodes", "3", "-o", str(out), "--force"])
    assert forced.exit_code == 0
    assert "#SBATCH --nodes=3" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]


def test_render_prints_to_stdout() -> None:
    result = CliRunner().invoke(cli, ["render", "--backend=gloo", "--nodes=4"])
    assert result.exit_code == 0
    assert "#SBATCH --nodes=4" in result.stdout
    assert result.stderr == ""


def test_rendering_imports_neither_torch_nor_submitit() -> None:
    code = (
        "import sys; from hpcdist.cli import main; rc = main(['render', '--nodes', '2']);"
        "bad = [m for m in ('torch', 'submitit') if m in sys.modules];"
        "sys.exit(f'imported {bad}' if bad else rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout
