"""--continue RUN and --tracker-env VAR: the script names the run before hpcdist's runner
records the job, and sets each tracker variable to the run id it decided."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    return tmp_path


def _render(*flags: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["render", *flags])
    return result.exit_code, result.stdout, result.stderr


def test_tracker_variables_are_set_after_the_run_id_is_decided(folder: Path) -> None:
    code, script, _ = _render("--tracker-env", "WANDB_RUN_ID", "--tracker-env", "NEPTUNE_X")
    assert code == 0
    decided = script.index('eval "${prepared}"')
    for var in ("WANDB_RUN_ID", "NEPTUNE_X"):
        assert script.index(f'export {var}="${{HPCDIST_RUN_ID}}"') > decided
    assert "export HPCDIST_RUN_ID=" not in script  # no --continue: the job decides
    assert "export HPCDIST_TRACKER_ENV=WANDB_RUN_ID,NEPTUNE_X" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_continue_names_a_run_of_this_folder(folder: Path) -> None:
    (folder / ".hpcdist" / "runs" / "41-abc").mkdir(parents=True, mode=0o700)
    code, script, _ = _render("--continue", "41-abc", "--after", "41:any")
    assert code == 0, script
    assert script.index("export HPCDIST_RUN_ID=41-abc") < script.index("jobstep prepare")
    assert '#SBATCH --dependency="afterany:41"' in script


def test_continue_a_jobs_run_is_found_when_the_job_starts(folder: Path) -> None:
    code, script, _ = _render("--continue", "41", "--after", "41")
    assert code == 0, script
    assert script.index("export HPCDIST_CONTINUE_JOB=41") < script.index("jobstep prepare")
    assert "export HPCDIST_RUN_ID=" not in script


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--continue", "41-abd"), "--continue '41-abd': no run of that id"),
        (("--continue", "a;b"), "--continue 'a;b' is not a run id"),
        (("--continue", "41-abc", "--sweep", "training.lr=1,2"), "with --sweep"),
        (("--continue", "41", "--sweep", "training.lr=1,2"), "with --sweep"),
        (("--continue", "41_x"), "--continue '41_x': no run of that id"),
        (("--continue", "41_"), "--continue '41_': no run of that id"),
        (("--tracker-env", "WANDB RUN"), "--tracker-env 'WANDB RUN' is not an environment"),
        (("--tracker-env", "1X"), "--tracker-env '1X' is not an environment"),
        (("--tracker-env", "SLURM_JOB_NAME"), "hpcdist's or SLURM's own"),
        (("--tracker-env", "HPCDIST_RUN_ID"), "hpcdist's or SLURM's own"),
    ],
)
def test_bad_run_options_are_one_line_and_exit_2(
    folder: Path, flags: tuple[str, ...], said: str
) -> None:
    (folder / ".hpcdist" / "runs" / "41-abc").mkdir(parents=True, mode=0o700)
    code, script, err = _render(*flags)
    assert code == 2 and script == ""
    assert said in err and len(err.strip().splitlines()) == 1
