"""Rendering: scripts parse, quote every user value, and carry the spec's directives."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import jinja2
import pytest
from click.testing import CliRunner

import hpcdist.render.script as render_module
from hpcdist.cli.main import cli
from hpcdist.distributed.badnodes import named_nodes
from hpcdist.errors import SpecError
from hpcdist.facts.launch import ignoring, per_node, torchrun_agent, torchrun_command
from hpcdist.render.directives import launch_argv, sbatch_directives
from hpcdist.render.hpcscripts import HPC_SCRIPTS, render_hpc_script
from hpcdist.render.script import quote, render, template_dir
from hpcdist.spec.jobspec import AUTO
from hpcdist.spec.options import spec_from_options
from hpcdist.state.private import user_name
from tests.jobenv import install_job_python

REPO = Path(__file__).resolve().parents[2]

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
        {"mode": "nccl", "nodes": 2},  # no GPU count anywhere: counted at run time
        {"mode": "nccl", "nodes": 2, "cpus_per_task": 2, "launcher": "torchrun"},
        {"mode": "test", "profile": "gpu-cluster", "nodes": 2, "gpus_per_node": 4},
    ],
)
def test_every_mode_renders_a_script_bash_can_parse(flags: dict[str, Any], tmp_path: Path) -> None:
    script = render(spec_from_options({"profile": None, **flags}))
    assert script.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in script
    assert "--kill-on-bad-exit=1" in script
    assert _bash_n(script, tmp_path).returncode == 0


def test_srun_gets_cpus_per_task_explicitly() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "gloo", "nodes": 2, "tasks_per_node": 2, "cpus_per_task": 1}
    )
    script = render(spec)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n" in script
    assert "srun --nodes=2 --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1" in script
    assert (
        "export OMP_NUM_THREADS=1\nexport MKL_NUM_THREADS=1\nexport HPCDIST_CPUS_PER_TASK=1\n"
        in script
    )


def test_nccl_asks_for_gpus_and_torchrun_starts_one_per_node() -> None:
    spec = spec_from_options(
        {"profile": "gpu-cluster", "mode": "nccl", "nodes": 2, "launcher": "torchrun"}
    )
    script = render(spec)
    assert "#SBATCH --gpus-per-node=4" in script
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=64" in script
    assert "--nproc-per-node=4" in script
    assert " -m ufsemulator train" in script
    assert "export OMP_NUM_THREADS=16" in script


def _run_script(
    script: str,
    tmp_path: Path,
    extra_env: dict[str, str] | None = None,
    nvidia_smi: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run a rendered script under bash with a stand-in srun that records its argv.

    ``nvidia_smi``, if given, is what a stand-in ``nvidia-smi -L`` prints.
    """
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
    install_job_python(bindir)
    if nvidia_smi is not None:
        fake_smi = bindir / "nvidia-smi"
        fake_smi.write_text(f"#!/bin/bash\nprintf '%s' {quote(nvidia_smi)}\n")
        fake_smi.chmod(0o755)
    job = tmp_path / "job.sh"
    job.write_text(script)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_CPUS_PER_TASK": "2",
        **(extra_env or {}),
    }
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    argv = argv_file.read_text().splitlines() if argv_file.exists() else []
    return proc, argv


def _sbatch_directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


def _gpu_list(count: int) -> str:
    """What ``nvidia-smi -L`` prints for ``count`` GPUs."""
    return "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08x})\n" for i in range(count))


def _srun_option(argv: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"--{name}=")]
    assert len(values) == 1, argv
    return values[0]


def test_nccl_without_a_gpu_count_asks_for_whole_nodes() -> None:
    script = render(spec_from_options({"profile": None, "mode": "nccl", "nodes": 2}))
    directives = _sbatch_directives(script)
    assert "#SBATCH --exclusive" in directives
    for option in ("--ntasks-per-node", "--cpus-per-task", "--gpus-per-node"):
        assert not any(d.startswith(f"#SBATCH {option}") for d in directives), directives
    # SLURM's count, else the driver's list: hpcdist.distributed.gpus, run by the script
    # (test_auto_script_launches_one_task_per_counted_gpu runs both).
    assert (
        'counted_gpus="$(python3 -c "${hpcdist_main}" hpcdist.distributed.jobstep gpus)"\n'
        in script
    )
    assert (
        'srun --nodes=2 --ntasks-per-node="$gpus" --cpus-per-task="$cpus" '
        '${gpu_request:+"$gpu_request"} --kill-on-bad-exit=1 --label \\\n'
    ) in script
    assert 'export OMP_NUM_THREADS="$cpus"\nexport MKL_NUM_THREADS="$cpus"\n' in script


@pytest.mark.parametrize(
    ("slurm_env", "listed", "tasks", "cpus", "gpu_request"),
    [
        # No SLURM count: the GPUs nvidia-smi lists (MIG instances are not extra GPUs). SLURM
        # does not hand them out, so srun must not ask for GRES (it would refuse).
        ({"SLURM_CPUS_ON_NODE": "12"}, _gpu_list(3), "3", "4", None),
        (
            {"SLURM_CPUS_ON_NODE": "12"},
            _gpu_list(1) + "  MIG 3g.40gb Device 0: (UUID: MIG-0)\n",
            "1",
            "12",
            None,
        ),
        # SLURM's count wins over the driver's list, and srun asks for them again (steps do
        # not inherit GRES from --exclusive). Nothing may assume <= 4 GPUs per node.
        ({"SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_ON_NODE": "96"}, _gpu_list(2), "8", "12", "8"),
        ({"SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_ON_NODE": "4"}, _gpu_list(8), "8", "1", "8"),
        ({"SLURM_GPUS_ON_NODE": "3", "SLURM_CPUS_ON_NODE": "48"}, None, "3", "16", "3"),
    ],
)
def test_auto_script_launches_one_task_per_counted_gpu(
    slurm_env: dict[str, str],
    listed: str | None,
    tasks: str,
    cpus: str,
    gpu_request: str | None,
    tmp_path: Path,
) -> None:
    script = render(spec_from_options({"profile": None, "mode": "nccl", "nodes": 2}))
    proc, argv = _run_script(
        script, tmp_path, {"SLURMD_NODENAME": "gpu-07", **slurm_env}, nvidia_smi=listed
    )
    assert proc.returncode == 0, proc.stderr
    assert _srun_option(argv, "nodes") == "2"
    assert _srun_option(argv, "ntasks-per-node") == tasks
    assert _srun_option(argv, "cpus-per-task") == cpus
    seen = dict(
        line.split("=", 1)
        for line in (tmp_path / "srun-env").read_text().splitlines()
        if "=" in line
    )
    if gpu_request is None:
        assert not any(arg.startswith("--gpus-per-node") for arg in argv), argv
        # ... and the script tells the tasks the node's GPUs are theirs, as SLURM would.
        assert seen["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(int(tasks)))
    else:
        assert _srun_option(argv, "gpus-per-node") == gpu_request
        assert "CUDA_VISIBLE_DEVICES" not in seen  # srun sets it per task
    assert "" not in argv  # an unset request leaves no empty argument behind
    assert "--kill-on-bad-exit=1" in argv
    assert argv[-4:] == ["python3", "-m", "ufsemulator", "train"]
    assert (seen["OMP_NUM_THREADS"], seen["MKL_NUM_THREADS"]) == (cpus, cpus)
    assert f"hpcdist: {tasks} GPUs on gpu-07" in proc.stdout


@pytest.mark.parametrize(
    ("slurm_env", "listed", "cause"),
    [
        ({}, "", "SLURM_GPUS_ON_NODE unset, nvidia-smi -L lists 0"),
        # nvidia-smi says so on stdout (exit 6): a line that is not a GPU.
        ({}, "No devices were found\n", "nvidia-smi -L lists 0"),
        ({"SLURM_GPUS_ON_NODE": "0"}, _gpu_list(4), "SLURM_GPUS_ON_NODE=0"),
    ],
)
def test_auto_script_without_gpus_fails_in_one_line_naming_the_node(
    slurm_env: dict[str, str], listed: str, cause: str, tmp_path: Path
) -> None:
    script = render(spec_from_options({"profile": None, "mode": "nccl"}))
    proc, argv = _run_script(
        script, tmp_path, {"SLURMD_NODENAME": "cpu-13", **slurm_env}, nvidia_smi=listed
    )
    assert proc.returncode != 0
    assert argv == []  # srun never started
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hpcdist: no GPU on node cpu-13 (")
    assert cause in lines[0]
    assert "--gpus-per-node N" in lines[0]


def test_auto_script_with_torchrun_starts_one_torchrun_per_node(tmp_path: Path) -> None:
    spec = spec_from_options({"profile": None, "mode": "nccl", "launcher": "torchrun"})
    proc, argv = _run_script(
        render(spec),
        tmp_path,
        {
            "SLURM_GPUS_ON_NODE": "8",
            "SLURM_CPUS_ON_NODE": "64",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_NODEID": "0",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert _srun_option(argv, "ntasks-per-node") == "1"
    assert _srun_option(argv, "cpus-per-task") == "64"
    assert _srun_option(argv, "gpus-per-node") == "8"
    assert _srun_option(argv, "nproc-per-node") == "8"
    seen = (tmp_path / "srun-env").read_text().splitlines()
    assert "OMP_NUM_THREADS=8" in seen


def test_auto_script_keeps_a_given_cpus_per_task(tmp_path: Path) -> None:
    spec = spec_from_options({"profile": None, "mode": "nccl", "cpus_per_task": 2})
    proc, argv = _run_script(
        render(spec), tmp_path, {"SLURM_GPUS_ON_NODE": "4", "SLURM_CPUS_ON_NODE": "64"}
    )
    assert proc.returncode == 0, proc.stderr
    assert (_srun_option(argv, "ntasks-per-node"), _srun_option(argv, "cpus-per-task")) == (
        "4",
        "2",
    )


def test_test_mode_with_gpus_asks_for_one_task_per_gpu(tmp_path: Path) -> None:
    spec = spec_from_options(
        {"profile": "gpu-cluster", "mode": "test", "nodes": 2, "gpus_per_node": 2}
    )
    script = render(spec)
    directives = _sbatch_directives(script)
    assert "#SBATCH --ntasks-per-node=2" in directives
    assert "#SBATCH --gpus-per-node=2" in directives
    assert "#SBATCH --cpus-per-task=32" in directives
    assert "one GPU each (nccl)" in script.splitlines()[1]
    for line in (
        "export NCCL_NVLS_ENABLE=0",
        "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "export NVSHMEM_DISABLE_NVLS=1",
    ):
        assert line in script
    proc, argv = _run_script(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _srun_option(argv, "ntasks-per-node") == "2"
    assert argv[-5:] == ["python3", "-m", "hpcdist.distributed.commcheck", "--timeout", "60"]


def test_test_mode_without_gpus_stays_a_cpu_check() -> None:
    script = render(spec_from_options({"profile": "gpu-cluster", "mode": "test", "nodes": 2}))
    assert not any(d.startswith("#SBATCH --gpus-per-node") for d in _sbatch_directives(script))
    assert "(gloo on CPU)" in script.splitlines()[1]
    assert "NCCL_NVLS_ENABLE" not in script


@pytest.mark.parametrize(
    "flags",
    [
        {"profile": "gpu-cluster", "mode": "nccl", "nodes": 2},
        {"profile": "gpu-cluster", "mode": "nccl", "launcher": "torchrun"},
        {"profile": None, "mode": "nccl"},
        {"profile": "cpu-cluster", "mode": "nccl", "nodes": 3},
        {"profile": "gpu-cluster", "mode": "test", "gpus_per_node": 1},
    ],
)
def test_every_nccl_script_keeps_multicast_off(flags: dict[str, Any]) -> None:
    script = render(spec_from_options(flags))
    for line in (
        "export NCCL_NVLS_ENABLE=0",
        "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "export NVSHMEM_DISABLE_NVLS=1",
    ):
        assert f"\n{line}\n" in script
    assert "export NCCL_ASYNC_ERROR_HANDLING" not in script


@pytest.mark.parametrize("payload", PAYLOADS)
def test_user_values_never_execute(
    payload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "MARKER"
    value = payload.replace("MARKER", str(marker))
    # --chdir and the logs' folder must exist (hpcdist.spec.loginpaths): made here under the
    # payload's own name (relative: it starts with no "/"), so it still reaches every directive.
    monkeypatch.chdir(tmp_path)
    (tmp_path / value / Path(value).parent).mkdir(parents=True)
    spec = spec_from_options(
        {
            "profile": None,
            "mode": "gloo",
            "job_name": value,
            "output": value + "-%j.out",
            "error": value + ".err",
            "workdir": value,
            "env": (f"PAYLOAD={value}",),
            "command": f"python3 -c 'pass' {quote(value)}",
        }
    )
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
        f"hpc/{name} drifted from the templates: run python3 -m hpcdist.render.hpcscripts"
    )
    assert os.access(REPO / "hpc" / name, os.X_OK)
    assert _bash_n(committed, tmp_path).returncode == 0


def test_hpc_scripts_check_command_reports_drift(tmp_path: Path) -> None:
    from hpcdist.render.hpcscripts import main

    assert main(["--dir", str(tmp_path)]) == 0
    assert main(["--dir", str(tmp_path), "--check"]) == 0
    (tmp_path / "train.sh").write_text("#!/bin/bash\n")
    assert main(["--dir", str(tmp_path), "--check"]) == 1


def test_render_to_file_is_atomic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "job.sh"
    runner = CliRunner()
    first = runner.invoke(cli, ["render", "--nodes", "2", "--script", str(out)])
    assert first.exit_code == 0, first.output
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text
    again = runner.invoke(cli, ["render", "--nodes", "3", "--script", str(out)])
    assert again.exit_code == 2
    assert "exists; pass --force" in again.stderr
    assert out.read_text() == text
    forced = runner.invoke(cli, ["render", "--nodes", "3", "--script", str(out), "--force"])
    assert forced.exit_code == 0
    assert "#SBATCH --nodes=3" in out.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sh"]


def test_render_to_a_folder_others_can_write_is_refused_unless_trusted(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    out = shared / "job.sh"
    runner = CliRunner()
    for mode in (0o777, 0o770, 0o2775, 0o757):  # group or others may write: refused
        shared.chmod(mode)
        refused = runner.invoke(cli, ["render", "--script", str(out)])
        assert refused.exit_code == 2, refused.output
        (line,) = refused.stderr.strip().splitlines()
        assert f"--script '{out}': '{shared}' can be written by others" in line
        assert f"mode {mode:04o}" in line and "--trust-folder" in line
        assert not out.exists()
    old = os.umask(0)
    try:
        trusted = runner.invoke(cli, ["render", "--script", str(out), "--trust-folder"])
        assert trusted.exit_code == 0, trusted.output
        assert out.stat().st_mode & 0o777 == 0o755  # never writable by group or others
        shared.chmod(0o755)  # only the user may write: no flag needed
        again = runner.invoke(cli, ["render", "--script", str(out), "--force"])
        assert again.exit_code == 0, again.output
        assert out.stat().st_mode & 0o777 == 0o755
    finally:
        os.umask(old)
    os.umask(0o077)
    try:
        private = runner.invoke(cli, ["render", "--script", str(out), "--force"])
        assert private.exit_code == 0 and out.stat().st_mode & 0o777 == 0o700
    finally:
        os.umask(old)


@pytest.mark.parametrize(("key", "written"), [("true", True), ("false", False)])
def test_the_profiles_trust_folder_key_is_the_flags_word(
    tmp_path: Path, key: str, written: bool
) -> None:
    profile = tmp_path / "site.yaml"
    profile.write_text(f"trust_folder: {key}\n")
    profile.chmod(0o644)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    out = shared / "job.sh"
    result = CliRunner().invoke(cli, ["render", "--profile", str(profile), "--script", str(out)])
    if written:
        assert result.exit_code == 0, result.output
        assert result.stderr == f"wrote {out}\n"
        assert out.stat().st_mode & 0o022 == 0  # trusted folder, still no write bit for others
        return
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"hpcdist: error: --script '{out}': '{shared}' can be written by others (owner "
        f"{user_name(os.geteuid())}, mode 0777), who could change the script before you run "
        "sbatch; write it to a folder only you can write (e.g. in your home), or pass "
        "--trust-folder (or set trust_folder: true in your profile) if you trust everyone "
        "who can write there\n"
    )
    assert not out.exists()


def test_render_prints_to_stdout() -> None:
    result = CliRunner().invoke(cli, ["render", "--backend=gloo", "--nodes=4"])
    assert result.exit_code == 0
    assert "#SBATCH --nodes=4" in result.stdout
    assert result.stderr == ""


def test_rendering_imports_neither_torch_nor_submitit() -> None:
    code = (
        "import sys; from hpcdist.cli.main import main; rc = main(['render', '--nodes', '2']);"
        "bad = [m for m in ('torch', 'submitit') if m in sys.modules];"
        "sys.exit(f'imported {bad}' if bad else rc)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout


def test_auto_script_keeps_a_cuda_visible_devices_it_was_given(tmp_path: Path) -> None:
    script = render(spec_from_options({"profile": None, "mode": "nccl"}))
    proc, argv = _run_script(
        script, tmp_path, {"CUDA_VISIBLE_DEVICES": "5,6"}, nvidia_smi=_gpu_list(2)
    )
    assert proc.returncode == 0, proc.stderr
    assert _srun_option(argv, "ntasks-per-node") == "2"
    assert "CUDA_VISIBLE_DEVICES=5,6" in (tmp_path / "srun-env").read_text().splitlines()


def _requeue_harness(tmp_path: Path, with_scontrol: bool) -> tuple[Path, dict[str, str]]:
    """Stand-ins for srun (rank 0 leaves the requeue marker, srun reports a killed rank),
    scontrol and sbatch, each recording its arguments; PATH holds nothing else of SLURM's."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tools = {
        "srun": 'mkdir -p "$(dirname "$HPCDIST_REQUEUE_MARKER")"; '
        'echo runs/77 > "$HPCDIST_REQUEUE_MARKER"; exit 143',
        "sbatch": f'printf "%s\\n" "$@" > {quote(str(tmp_path / "sbatch-argv"))}; '
        f"env > {quote(str(tmp_path / 'sbatch-env'))}",
    }
    if with_scontrol:
        tools["scontrol"] = f'printf "%s\\n" "$@" >> {quote(str(tmp_path / "scontrol-argv"))}'
    for name, body in tools.items():
        (bindir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bindir / name).chmod(0o755)
    install_job_python(bindir)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_NODELIST": "node[1-2]",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SBATCH_PARTITION": "debug",
    }
    return bindir, env


@pytest.mark.parametrize("with_scontrol", [True, False], ids=["scontrol", "no-scontrol"])
def test_requeue_marker_requeues_even_when_srun_reports_a_killed_rank(
    tmp_path: Path, with_scontrol: bool
) -> None:
    script = render(spec_from_options({"profile": None, "mode": "gloo", "nodes": 2}))
    _, env = _requeue_harness(tmp_path, with_scontrol)
    if not with_scontrol:
        # The real scontrol may sit beside bash in /usr/bin: give the script a PATH with the
        # stand-ins and the few tools it needs, and nothing else.
        shell_tools = tmp_path / "shell-tools"
        shell_tools.mkdir()
        for tool in (
            "bash",
            "env",
            "rm",
            "mkdir",
            "dirname",
            "cat",
            "printf",
            "stat",
            "chmod",
            "od",
            "tr",
        ):
            found = shutil.which(tool)
            assert found is not None
            (shell_tools / tool).symlink_to(found)
        env["PATH"] = f"{tmp_path / 'bin'}:{shell_tools}"
    job = tmp_path / "job.sh"
    job.write_text(script)
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / ".hpcdist" / "requeue" / "77").exists()
    if with_scontrol:
        # Asked first whether the job still runs (a scancel would end it), then requeued.
        called = (tmp_path / "scontrol-argv").read_text().split()
        assert called == ["show", "job", "77", "requeue", "77"]
        assert not (tmp_path / "sbatch-argv").exists()
        return
    assert "no requeue (scontrol missing or refused), resubmitting" in proc.stderr
    sbatch_env = dict(
        line.split("=", 1)
        for line in (tmp_path / "sbatch-env").read_text().splitlines()
        if "=" in line
    )
    assert sbatch_env["HPCDIST_RUN_DIR"] == "runs/77"  # the new job resumes this folder
    assert sbatch_env["HPCDIST_RESTARTS"] == "1"
    assert sbatch_env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    leaked = sorted(k for k in sbatch_env if k.startswith(("SLURM_JOB", "SBATCH_", "SLURM_NODE")))
    assert leaked == []


def test_requeue_stops_at_max_restarts(tmp_path: Path) -> None:
    script = render(spec_from_options({"profile": None, "mode": "gloo", "max_restarts": 2}))
    _, env = _requeue_harness(tmp_path, with_scontrol=True)
    env["SLURM_RESTART_COUNT"] = "2"
    job = tmp_path / "job.sh"
    job.write_text(script)
    proc = subprocess.run(
        ["bash", str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 143
    assert "not requeueing: restart 2 reached --max-restarts 2" in proc.stderr
    # Two looks at the job, never a requeue: the decision, then whether SLURM requeued it
    # all the same (scontrol requeue by hand) before saying how to resume.
    assert (tmp_path / "scontrol-argv").read_text().split() == ["show", "job", "77"] * 2


def test_torchrun_ignores_the_warning_its_ranks_catch() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "gloo", "nodes": 2, "launcher": "torchrun", "signal": "USR1@60"}
    )
    script = render(spec)
    assert "export HPCDIST_SIGNAL=USR1" in script
    started = 'bash -c \'trap "" USR1 && exec "$@"\' python3 python3 -c "${torchrun_agent}"'
    assert f"{started} --nnodes=" in script
    assert "warning = signal.SIGUSR1\n" in script and "USR2" not in script


# A rank of the agent's: says how it would take the warning, warns the agent (which must
# outlive it), then dies of the warning itself.
_RANK = (
    "import os, signal, time; "
    "print('rank', os.environ['RANK'], 'node', os.environ['GROUP_RANK'], "
    "signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, flush=True); "
    "os.kill(os.getppid(), signal.SIGUSR1); time.sleep(1); "
    "os.kill(os.getpid(), signal.SIGUSR1); time.sleep(30)"
)


def test_torchrun_agent_outlives_the_warning_its_ranks_get_as_sent() -> None:
    # The words the script starts on each node, run here: the agent survives USR1, its rank
    # has USR1's default action (an ignored signal would be inherited; Lightning takes an
    # ignored one for a handler of the user's and installs none), dies of it, and the agent
    # exits as srun does for a rank killed by USR1: 128 + 10.
    port = 20000 + os.getpid() % 10000
    argv = ignoring(["USR1"], ["python3", "-c", torchrun_agent("USR1")])
    flags = ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=static"]
    flags.append(f"--rdzv-endpoint=127.0.0.1:{port}")
    proc = subprocess.run(
        [*argv, *flags, "--no-python", sys.executable, "-c", _RANK],
        env={**os.environ, "SLURM_NODEID": "0", "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "rank 0 node 0 True" in proc.stdout, proc.stderr
    assert proc.returncode == 128 + signal.SIGUSR1, proc.stderr
    assert "Signal 10 (SIGUSR1)" in proc.stderr  # torchrun's own report of the rank's end


@pytest.mark.parametrize(
    ("signame", "named"), [("BUS", True), ("KILL", False), ("ABRT", False), ("TERM", False)]
)
def test_torchrun_agent_names_the_node_of_a_rank_killed_by_a_node_signal(
    signame: str, named: bool
) -> None:
    # A rank killed by a bus error (a memory fault of its node) is named with its node for
    # the bad-node record; one the out-of-memory killer ended (SIGKILL: the job's own
    # memory), that aborted (its own program, torch's teardown) or was asked to end (TERM) is
    # not.
    with socket.socket() as probe:  # a free port for the agent's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ignoring(["USR1"], ["python3", "-c", torchrun_agent("USR1")])
    flags = ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=static"]
    flags.append(f"--rdzv-endpoint=127.0.0.1:{port}")
    die = f"import os, signal; os.kill(os.getpid(), signal.SIG{signame})"
    proc = subprocess.run(
        [*argv, *flags, "--no-python", sys.executable, "-c", die],
        env={**os.environ, "SLURM_NODEID": "0", "SLURMD_NODENAME": "node7", "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr
    line = f"hpcdist: torchrun: rank 0 on node7 died of SIG{signame}"
    assert (line in proc.stderr) == named, proc.stderr
    found = named_nodes(proc.stderr, ["node7"])
    assert found == ([("node7", f"rank 0 SIG{signame}")] if named else []), proc.stderr


def test_batch_shell_signal_is_passed_on_to_srun(tmp_path: Path) -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "nodes": 2, "signal": "B:USR2@90"})
    script = render(spec)
    assert '#SBATCH --signal="B:USR2@90"' in script
    # Which signal the command gets, said above the directive.
    said = "# The warning: SIGUSR2 about 90 s before the time limit (SLURM may send it up to a"
    assert f"{said} minute early) to the batch shell, and hpcdist's runner passes it on" in script
    assert "trap 'warned=1' USR2\n" in script  # from the first line, kept until srun runs
    assert 'jobstep run --warning=B:USR2@90 --relay --warned="${warned}" ' in script
    assert _bash_n(script, tmp_path).returncode == 0
    plain = render(spec_from_options({"profile": None, "mode": "gloo", "nodes": 2}))
    # SLURM signals the tasks itself: nothing to pass on; the runner knows the warning.
    assert "jobstep run --warning=USR2@90 --requeue " in plain and "--relay" not in plain
    assert (
        "about 90 s before the time limit (SLURM may send it up to a minute early) to every rank"
        in plain
    )
    silent = render(dataclasses.replace(spec, signal=None))
    assert "--warning" not in silent and "# The warning" not in silent


@pytest.mark.parametrize("early", [False, True], ids=["while-srun-runs", "before-srun-starts"])
def test_batch_shell_passes_the_warning_to_srun_and_keeps_its_exit_status(
    tmp_path: Path, early: bool
) -> None:
    """Under --signal=B:USR1 the shell traps the warning from its first line, passes it on
    to srun (at once, or once srun has started) and still exits with srun's own status."""
    flags: dict[str, Any] = {
        "profile": None,
        "mode": "gloo",
        "nodes": 2,
        "signal": "B:USR1@60",
        "requeue": False,
    }
    started, warned = tmp_path / "started", tmp_path / "warned"
    ready = tmp_path / "ready"  # the shell has set its trap and is in the setup lines
    flags["setup"] = (f"touch {quote(str(ready))}; sleep 2",) if early else ()
    script = render(spec_from_options(flags))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(
        "#!/bin/bash\n"
        f"trap 'touch {quote(str(warned))}' USR1\n"
        f"touch {quote(str(started))}\n"
        "for _ in 1 2 3 4 5 6; do sleep 0.5; done\n"
        "exit 7\n"
    )
    (bindir / "srun").chmod(0o755)
    job = tmp_path / "job.sh"
    job.write_text(script)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_CPUS_PER_TASK": "1",
        # The runner under test, whatever hpcdist the environment has installed.
        "PYTHONPATH": str(Path(render_module.__file__).resolve().parents[2]),
    }
    proc = subprocess.Popen(
        ["bash", str(job)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = ready if early else started
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=10)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=30)
    assert warned.exists(), out + err  # srun got the warning
    assert proc.returncode == 7, out + err  # srun's status, not the trap's 138


# ------------------------------------------------ the launch line, word by word, from the spec

TORCHRUN_RDZV = [
    'bash -c \'trap "" USR2 && exec "$@"\' python3 python3 -c "${torchrun_agent}"',
    'sys.argv[1:1] = ["--node-rank=" + os.environ["SLURM_NODEID"]]',
    '--nnodes="${SLURM_JOB_NUM_NODES}"',
    '--rdzv-backend=static --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"',
]


def test_torchrun_launch_carries_every_rendezvous_flag() -> None:
    spec = spec_from_options(
        {
            "profile": "gpu-cluster",
            "mode": "nccl",
            "nodes": 3,
            "gpus_per_node": 2,
            "launcher": "torchrun",
        }
    )
    assert launch_argv(spec) == [
        # Each node's shell ignores the warning until torchrun's agent (the script's
        # $torchrun_agent) has started and set its own handler; the agent adds the node's
        # rank from its own task's SLURM_NODEID (not once, by the batch shell).
        "bash",
        "-c",
        """'trap "" USR2 && exec "$@"'""",
        "python3",
        "python3",
        "-c",
        '"${torchrun_agent}"',
        '--nnodes="${SLURM_JOB_NUM_NODES}"',
        "--nproc-per-node=2",
        "--rdzv-backend=static",
        '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"',
        "-m",
        "ufsemulator",
        "train",
    ]
    script = render(spec)
    for words_in_order in TORCHRUN_RDZV:
        assert words_in_order in script


@pytest.mark.parametrize("node", ["0", "1", "3"])
def test_each_node_gives_torchrun_its_own_rank_when_its_task_starts(node: str) -> None:
    # The batch shell expands the script's words once, on the first node: the node's rank
    # must be expanded by the shell srun starts on each node, from that task's SLURM_NODEID.
    shell, flag, script, *argv = per_node(["echo"], ["USR2"])
    proc = subprocess.run(
        [shell, flag, script, *argv, "--nnodes=4", "train.py"],
        env={"PATH": os.environ["PATH"], "SLURM_NODEID": node},
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == f"--node-rank={node} --nnodes=4 train.py\n"


@pytest.mark.parametrize(
    ("command", "tail"),
    [
        # torchrun is the interpreter: it takes a module (-m) or a script directly...
        (["python3", "-m", "pkg.train", "--lr", "1"], ["-m", "pkg.train", "--lr", "1"]),
        (["python", "train.py", "-v"], ["train.py", "-v"]),
        (["python3", "train.py"], ["train.py"]),
        # ...but no other interpreter option, and nothing that is not python or python3.
        (["python3", "-c", "print(1)"], ["--no-python", "python3", "-c", "print(1)"]),
        (["python3", "-u", "x.py"], ["--no-python", "python3", "-u", "x.py"]),
        (["python3"], ["--no-python", "python3"]),
        (["python3.11", "-m", "pkg"], ["--no-python", "python3.11", "-m", "pkg"]),
        (["./run.sh", "python3"], ["--no-python", "./run.sh", "python3"]),
        (["-m", "python3"], ["--no-python", "-m", "python3"]),
    ],
)
def test_torchrun_takes_python_programs_directly_and_others_with_no_python(
    command: list[str], tail: list[str]
) -> None:
    assert torchrun_command(["torchrun", "--nnodes=1"], command) == [
        "torchrun",
        "--nnodes=1",
        *tail,
    ]


def test_one_gpu_per_node_is_requested() -> None:
    spec = spec_from_options({"profile": "gpu-cluster", "mode": "nccl", "gpus_per_node": 1})
    assert "#SBATCH --gpus-per-node=1\n" in render(spec)


def test_whole_nodes_request_says_why_in_the_script() -> None:
    script = render(spec_from_options({"profile": None, "mode": "nccl"}))
    assert (
        "# No GPU count was given: whole nodes; the script counts their GPUs when it starts.\n"
        "#SBATCH --exclusive\n"
    ) in script


def test_a_count_known_only_at_run_time_has_no_directive() -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo"})
    with pytest.raises(ValueError) as info:
        sbatch_directives(replace(spec, tasks_per_node=AUTO))
    assert str(info.value) == "a count of 'auto' has no directive; the script counts it"


def test_a_name_the_template_misspells_fails_instead_of_rendering_empty() -> None:
    with pytest.raises(jinja2.UndefinedError):
        render_module._environment().from_string("srun {{ srun_optoins }}").render()


def test_templates_inside_the_package_win_over_the_checkouts(tmp_path: Path) -> None:
    package = tmp_path / "hpcdist"
    for folder in (package / "templates", tmp_path / "templates"):
        folder.mkdir(parents=True)
        (folder / "base.sh.j2").write_text("")
    assert template_dir(package) == package / "templates"
    (package / "templates" / "base.sh.j2").unlink()
    assert template_dir(package) == tmp_path / "templates"


def test_missing_templates_name_the_folder_searched(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        template_dir(tmp_path / "hpcdist")
    assert str(info.value) == f"hpcdist templates not found beside {tmp_path / 'hpcdist'}"


def test_unknown_quoting_context_is_refused_by_name() -> None:
    with pytest.raises(ValueError) as info:
        quote("x", "yaml")
    assert str(info.value) == "unknown quoting context 'yaml'; expected 'shell' or 'sbatch'"


def test_site_options_are_introduced_once_above_the_first() -> None:
    flags = {"profile": None, "sbatch_options": ("comment=x", "hint=nomultithread")}
    assert (
        "# Site options: the profile's sbatch: keys, then --sbatch.\n"
        '#SBATCH --comment="x"\n'
        '#SBATCH --hint="nomultithread"\n'
    ) in render(spec_from_options(flags))


@pytest.mark.parametrize(
    ("max_parallel", "lines"),
    [
        (
            2,
            "# One array task per point of the sweep, each a whole job of this shape, at most "
            '2 at once.\n#SBATCH --array="0-1%2"\n',
        ),
        (
            None,
            "# One array task per point of the sweep, each a whole job of this shape.\n"
            '#SBATCH --array="0-1"\n',
        ),
    ],
)
def test_array_directive_says_what_it_does(max_parallel: int | None, lines: str) -> None:
    flags = {"profile": None, "sweep": ("training.lr=1e-3,2e-3",), "max_parallel": max_parallel}
    assert lines in render(spec_from_options(flags))


@pytest.mark.parametrize("command", [["render"], ["submit", "--executor", "slurm"]])
def test_a_gpu_type_without_a_count_is_refused_by_render_and_submit(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")  # a login node
    result = CliRunner().invoke(cli, [*command, "--mode", "nccl", "--gpu-type", "a100"])
    assert result.exit_code == 2
    assert result.stderr == (
        "hpcdist: error: --gpu-type 'a100' needs a GPU count: pass --gpus-per-node N (a "
        "script that counts the GPUs when it starts asks for whole nodes, not a type)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_users_srun_words_are_quoted_and_the_scripts_counts_are_not() -> None:
    flags = {"profile": None, "mode": "nccl", "srun_args": ("--comment=a b$(x)",)}
    script = render(spec_from_options(flags))
    assert (
        'srun --nodes=1 --ntasks-per-node="$gpus" --cpus-per-task="$cpus" '
        "${gpu_request:+\"$gpu_request\"} --kill-on-bad-exit=1 '--comment=a b$(x)' --label \\\n"
    ) in script


def test_ntasks_spreads_uneven_ranks_over_the_nodes() -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "nodes": 2, "ntasks": 3})
    assert (spec.world_size, spec.tasks_per_node, spec.shape) == (3, 2, "3 tasks over 2 nodes")
    script = render(spec)
    assert "#SBATCH --ntasks=3\n" in script
    assert "ntasks-per-node" not in script
    assert "srun --nodes=2 --ntasks=3 --cpus-per-task=1 " in script


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"ntasks": 1}, "--ntasks 1 is fewer than --nodes 2; SLURM starts at least one task"),
        ({"ntasks": 3, "tasks_per_node": 2}, "--ntasks 3 and --tasks-per-node 2: give one"),
        ({"ntasks": 3, "launcher": "torchrun"}, "--ntasks 3 needs --launcher srun"),
        ({"ntasks": 3, "mode": "nccl", "gpus_per_node": 2}, "--ntasks 3 needs ranks on CPUs"),
    ],
)
def test_ntasks_is_refused_where_it_cannot_hold(flags: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_options({"profile": None, "mode": "gloo", "nodes": 2, **flags})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("options", "exported"),
    [
        ({"mode": "gloo", "nodes": 2}, True),
        ({"mode": "gloo", "nodes": 2, "launcher": "torchrun"}, True),
        ({"mode": "threads"}, False),
        ({"mode": "nccl", "nodes": 1, "gpus_per_node": 2}, False),
    ],
)
def test_cpu_jobs_tell_accelerate_to_use_the_cpus_unless_the_job_says_otherwise(
    options: dict[str, Any], exported: bool, tmp_path: Path
) -> None:
    script = render(spec_from_options({"profile": None, **options}))
    line = 'export ACCELERATE_USE_CPU="${ACCELERATE_USE_CPU:-true}"\n'
    assert (line in script) is exported
    if not exported:
        return
    # The job's own value (--env, or the environment it is submitted from) is kept.
    with_env = render(
        spec_from_options({"profile": None, **options, "env": ("ACCELERATE_USE_CPU=false",)})
    )
    assert with_env.index(line) < with_env.index("export ACCELERATE_USE_CPU=false\n")
    shown = subprocess.run(
        ["bash", "-c", line + 'echo "$ACCELERATE_USE_CPU"'],
        env={"PATH": os.environ["PATH"], "ACCELERATE_USE_CPU": "0"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown == "0\n"
