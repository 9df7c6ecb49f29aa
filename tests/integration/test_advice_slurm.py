"""status's advice is taken as written, on the real testbed: a job rendered again with the
values it advises (a --time above the job's own warning lead, memory in the option the job
asked with) passes ``sbatch --test-only`` as well as hpcdist's checks."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from tests.integration.conftest import SlurmCluster, slurm_env
from tests.jobs.test_efficiency import advised_flags

# The testbed has no GPUs: the GPU job's advice is fed back to hpcdist only (tests/jobs).
CPU_JOBS = [
    pytest.param(["--signal", "USR2@600", "--time", "2:00:00", "--mem", "400M"], 1, id="lead"),
    pytest.param(["--signal", "RB:USR1@3000", "--time", "3:00:00", "--mem", "400M"], 1, id="RB:"),
    pytest.param(
        ["--sbatch", "mem-per-cpu=200M", "--cpus-per-task", "2", "--time", "2:00:00"],
        2,
        id="mem-per-cpu",
    ),
]


@pytest.mark.parametrize(("flags", "cpus"), CPU_JOBS)
def test_sbatch_takes_the_job_rendered_with_the_advice(
    slurm_cluster: SlurmCluster, tmp_path: Path, flags: list[str], cpus: int
) -> None:
    tip, again = advised_flags(flags, cpus, profile="local", used_mb=100.0)
    script = tmp_path / "advised.sh"
    rendered = CliRunner().invoke(
        cli, ["render", "--profile", "local", *again, "--script", str(script)]
    )
    assert rendered.exit_code == 0, f"{tip}\n{rendered.output}"
    proc = subprocess.run(
        ["sbatch", "--test-only", str(script)],
        cwd=tmp_path,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"{tip}\n{again}\n{proc.stderr}"
    print(f"measured: advice {tip!r} taken by sbatch --test-only")
