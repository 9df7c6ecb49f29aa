"""What a rendered script asks of ``python3 -m hpcdist.distributed.jobstep``: its private
state, its node's GPUs, and the runner that takes the script's place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.distributed.gpus import count_gpus
from hpcdist.distributed.jobstep import main, node_gpus, prepare
from hpcdist.errors import UserError


def _gpu_lines(env: dict[str, str], listed: int) -> dict[str, str]:
    return dict(line.split("=", 1) for line in node_gpus(env, listed))


@pytest.mark.parametrize(
    ("env", "listed", "expected"),
    [
        # SLURM's count wins over the driver's list, and srun asks for the GPUs again.
        (
            {"SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_ON_NODE": "64"},
            2,
            {
                "gpus": "8",
                "cpus": "8",
                "counted": "SLURM_GPUS_ON_NODE=8",
                "gpu_request": "--gpus-per-node=8",
            },
        ),
        # No gres/gpu: the driver's list, no request, and the tasks are told their GPUs.
        (
            {"SLURM_JOB_ID": "77", "SLURM_CPUS_ON_NODE": "6"},
            4,
            {
                "gpus": "4",
                "cpus": "1",
                "counted": "'SLURM_GPUS_ON_NODE unset, nvidia-smi -L lists 4'",
                "gpu_request": "''",
                "export CUDA_VISIBLE_DEVICES": "0,1,2,3",
            },
        ),
        # A CUDA_VISIBLE_DEVICES the job was given is kept.
        (
            {"CUDA_VISIBLE_DEVICES": "5,6", "SLURM_CPUS_ON_NODE": "5"},
            2,
            {
                "gpus": "2",
                "cpus": "2",
                "counted": "'SLURM_GPUS_ON_NODE unset, nvidia-smi -L lists 2'",
                "gpu_request": "''",
            },
        ),
    ],
)
def test_node_gpus_are_counted_for_the_script(
    env: dict[str, str], listed: int, expected: dict[str, str]
) -> None:
    assert _gpu_lines(env, listed) == expected


def test_node_gpus_keep_the_cpus_per_task_given() -> None:
    lines = node_gpus({"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "64"}, 4, cpus=3)
    assert "cpus=3" in lines


@pytest.mark.parametrize(
    ("env", "listed", "seen"),
    [
        ({}, 0, "SLURM_GPUS_ON_NODE unset, nvidia-smi -L lists 0"),
        ({"SLURM_GPUS_ON_NODE": "0"}, 4, "SLURM_GPUS_ON_NODE=0"),
        ({"SLURM_GPUS_ON_NODE": "N/A"}, 4, "SLURM_GPUS_ON_NODE=N/A"),
    ],
)
def test_a_node_without_gpus_is_one_line_naming_it(
    env: dict[str, str], listed: int, seen: str
) -> None:
    with pytest.raises(UserError) as info:
        node_gpus({"SLURMD_NODENAME": "cpu-13", **env}, listed)
    assert str(info.value).startswith(f"no GPU on node cpu-13 ({seen}); ")
    assert "--gpus-per-node N" in str(info.value)


@pytest.mark.parametrize(
    ("env", "visible", "task", "node"),
    [
        # A task SLURM gave no GPU has none, whatever the host shows; the batch shell of an
        # exclusive job on a site without gres/gpu holds them all.
        ({"SLURM_JOB_ID": "42"}, 4, 0, 4),
        ({"SLURM_JOB_ID": "42", "SLURM_GPUS_ON_NODE": "4"}, 8, 8, 4),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 2, 2, 2),
        ({}, 2, 2, 2),
    ],
)
def test_one_counter_for_a_task_and_a_whole_node(
    env: dict[str, str], visible: int, task: int, node: int
) -> None:
    assert count_gpus(env, visible).count == task
    assert count_gpus(env, visible, whole_node=True).count == node


# ------------------------------------------------------------ prepare


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    return folder


def test_prepare_keeps_the_state_below_the_submit_folder(home: Path) -> None:
    project = home / "project"
    project.mkdir(mode=0o755)
    env = {"SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(project)}
    lines = prepare(env, '{"output":"%x-%j.out"}', marker=False, torchrun_port=False)
    state = project / ".hpcdist"
    assert lines[0] == f"export HPCDIST_SECRET_FILE={state / 'secrets' / '77'}"
    assert [line.split("=")[0] for line in lines[1:]] == [
        "export HPCDIST_RUN_ID",
        "export HPCDIST_RUN_DIR",
        "export HPCDIST_RUN_RECORD",
    ]
    assert (state / "logs" / "77").read_text() == '{"output":"%x-%j.out"}\n'
    for folder in (state, state / "secrets", state / "logs"):
        assert folder.stat().st_mode & 0o777 == 0o700
    assert (state / "secrets" / "77").stat().st_mode & 0o777 == 0o600
    # A rerun of the job (a requeue keeps its id) gets a new secret.
    first = (state / "secrets" / "77").read_text()
    prepare(env, "{}", marker=False, torchrun_port=False)
    assert (state / "secrets" / "77").read_text() != first


def test_prepare_removes_the_marker_of_an_earlier_run(home: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_SUBMIT_DIR": str(home)}
    marker = home / ".hpcdist" / "requeue" / "77"
    marker.parent.mkdir(parents=True, mode=0o700)
    marker.write_text("runs/77\n")
    lines = prepare(env, "{}", marker=True, torchrun_port=False)
    assert f"export HPCDIST_REQUEUE_MARKER={marker}" in lines
    assert not marker.exists()


def test_a_shared_submit_folder_keeps_the_state_in_the_users_own(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = home / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    env = {"SLURM_JOB_ID": "9", "SLURM_SUBMIT_DIR": str(shared)}
    line = prepare(env, "{}", marker=False, torchrun_port=False)[0]
    secret = Path(line.split("=", 1)[1])
    assert home / ".local" / "state" / "hpcdist" / "projects" in secret.parents
    assert not (shared / ".hpcdist").exists()
    note = capsys.readouterr().err
    assert f"hpcdist: note: '{shared}' can be written by others" in note
    assert "this job's secret and markers are kept in" in note


def test_hpcdist_home_chooses_the_state_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = home / "chosen"
    chosen.mkdir(mode=0o700)
    env = {"SLURM_JOB_ID": "5", "SLURM_SUBMIT_DIR": str(home), "HPCDIST_HOME": str(chosen)}
    monkeypatch.setenv("HPCDIST_HOME", str(chosen))
    line = prepare(env, "{}", marker=False, torchrun_port=False)[0]
    assert line.endswith(str(chosen / ".hpcdist" / "secrets" / "5"))


def test_a_state_folder_others_can_write_is_refused_in_one_line(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = home / ".hpcdist"
    state.mkdir()
    state.chmod(0o777)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_SUBMIT_DIR", str(home))
    assert main(["prepare", "--log-record", "{}"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcdist: "), lines
    assert "writable by group and others" in lines[0]
    assert not (state / "secrets").exists()


def test_prepare_outside_a_job_says_so() -> None:
    with pytest.raises(UserError, match="SLURM_JOB_ID is not set"):
        prepare({}, "{}", marker=False, torchrun_port=False)


# ------------------------------------------------------------ run, as its own process


def _runner(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.distributed.jobstep", "run", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("code", [0, 3, 85])
def test_run_without_requeue_exits_with_the_commands_status(code: int) -> None:
    proc = _runner("--", sys.executable, "-c", f"raise SystemExit({code})", env={})
    assert proc.returncode == code, proc.stderr


def test_run_reports_a_death_by_signal_as_bash_does() -> None:
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert _runner("--", sys.executable, "-c", kill, env={}).returncode == 128 + 9


def test_run_at_max_restarts_keeps_the_status_and_says_why(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "2", "PATH": str(tmp_path)}
    command = ["--", sys.executable, "-c", "raise SystemExit(85)"]
    proc = _runner("--requeue", "--max-restarts=2", *command, env=env)
    assert proc.returncode == 85
    assert "hpcdist: not requeueing: restart 2 reached --max-restarts 2" in proc.stderr


def test_run_needs_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--"]) == 1
    assert "run needs a command after --" in capsys.readouterr().err


def test_the_job_step_loads_nothing_heavy() -> None:
    code = (
        "import sys, hpcdist.distributed.jobstep\n"
        "heavy = {'torch', 'jinja2', 'click', 'yaml', 'submitit', 'numpy'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
