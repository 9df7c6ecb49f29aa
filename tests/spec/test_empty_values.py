"""An empty value is refused in one line naming where it came from, before anything is
written or queued, in render and submit alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FLAGS = [
    "--output",
    "--error",
    "--job-name",
    "--account",
    "--qos",
    "--partition",
    "--reservation",
    "--chdir",
    "--container",
    "--signal",
    "--constraint",
    "--mail-user",
    "--setup",
    "--profile",
]


def _hpcdist(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize(
    "command", [["render"], ["submit", "--executor", "local", "--mode", "threads"]]
)
def test_an_empty_flag_is_one_line_naming_it_and_nothing_is_written(
    tmp_path: Path, flag: str, command: list[str]
) -> None:
    proc = _hpcdist([*command, f"{flag}="], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hpcdist: error: {flag} is empty"), lines
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_value_with_text_is_accepted_on_the_other_side(tmp_path: Path) -> None:
    proc = _hpcdist(["render", "--account=proj", "--job-name=x", "--output=o-%j.log"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '#SBATCH --account="proj"' in proc.stdout


@pytest.mark.parametrize(
    ("yaml_line", "key"),
    [
        ('account: ""', "key account"),
        ("qos: ' '", "key qos"),
        ("defaults:\n  time: ''", "key defaults.time"),
        ("setup: ['module load x', '']", "key setup"),
    ],
)
def test_an_empty_profile_value_names_the_file_and_key(
    tmp_path: Path, yaml_line: str, key: str
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(f"partition: debug\npartitions: [debug]\n{yaml_line}\n")
    site.chmod(0o600)
    proc = _hpcdist(["render", "--profile", str(site)], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"hpcdist: error: profile 'site' ({site}) {key} is empty"), line


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--constraint=a100"], "--constraint needs SLURM"),
        (["--mem=4G"], "--mem needs SLURM"),
        (["--exclusive"], "--exclusive needs SLURM"),
        (["--sbatch=comment=x"], "--sbatch needs SLURM"),
        (["--mem=4G", "--constraint=x"], "--constraint, --mem need SLURM"),
    ],
)
def test_the_local_executor_refuses_what_only_slurm_can_honour(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    proc = _hpcdist(["submit", "--executor", "local", "--mode", "threads", *flags], tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"hpcdist: error: {named}; the local executor"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
