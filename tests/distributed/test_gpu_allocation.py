"""GPUs per task: what SLURM allocated (not what the host has), and 8 GPUs per node end to end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpcdist.cli.env import simulate_allocation
from hpcdist.distributed import (
    DistributedInitError,
    allocated_gpus,
    cleanup_distributed,
    setup_distributed,
    task_device,
)
from hpcdist.distributed.group import process_group_options
from hpcdist.render.script import quote, render
from hpcdist.spec.options import spec_from_options
from tests.jobenv import install_job_python

# A task of `srun` inside job 42: what every SLURM task has, GPUs or not.
SLURM_TASK = {
    "SLURM_JOB_ID": "42",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "2",
    "SLURM_LOCALID": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "node1",
    "SLURM_STEP_TASKS_PER_NODE": "4",
}
TORCHRUN_TASK = {"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}

# (environment, GPUs torch sees, GPUs allocated to the task)
ALLOCATIONS: list[tuple[dict[str, str], int, int]] = [
    # srun without GPUs on a host whose devices SLURM does not constrain: all 4 visible, none its.
    (SLURM_TASK, 4, 0),
    ({**SLURM_TASK, "SLURM_GPUS_ON_NODE": ""}, 4, 0),  # empty is unset
    ({"SLURM_JOB_ID": "42"}, 8, 0),  # the batch script of a job without GPUs
    # srun --gpus-per-node: SLURM sets CUDA_VISIBLE_DEVICES and torch counts what it lists.
    ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_STEP_GPUS": "0,1,2,3"}, 4, 4),
    ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "3", "SLURM_STEP_GPUS": "3"}, 1, 1),
    ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(8)))}, 8, 8),
    ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": ""}, 0, 0),
    # GPUs allocated without CUDA_VISIBLE_DEVICES (a site's own binding): torch's count.
    ({**SLURM_TASK, "SLURM_STEP_GPUS": "0,1"}, 2, 2),
    ({**SLURM_TASK, "SLURM_JOB_GPUS": "0,1,2,3"}, 4, 4),
    ({**SLURM_TASK, "SLURM_GPUS_ON_NODE": "4"}, 4, 4),
    # Outside SLURM every visible GPU is the task's: a workstation, torchrun, a plain process.
    ({}, 2, 2),
    (TORCHRUN_TASK, 8, 8),
    ({**TORCHRUN_TASK, "CUDA_VISIBLE_DEVICES": "6,7"}, 2, 2),
    ({"SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_NTASKS": "1"}, 1, 1),
    ({}, 0, 0),
]


@pytest.mark.parametrize(("env", "visible", "allocated"), ALLOCATIONS)
def test_allocated_gpus_counts_what_slurm_gave_the_task(
    env: dict[str, str], visible: int, allocated: int
) -> None:
    assert allocated_gpus(env, visible) == allocated


def test_allocated_gpus_rejects_a_negative_count() -> None:
    with pytest.raises(ValueError, match="visible_gpus must be >= 0, got -1"):
        allocated_gpus({}, -1)


@pytest.mark.parametrize(
    ("env", "local_rank", "visible", "backend", "expected"),
    [
        (SLURM_TASK, 2, 4, None, ("gloo", "cpu")),  # --mode test without GPUs: the CPU check
        ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 2, 4, None, ("nccl", "cuda:2")),
        ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "2"}, 2, 1, None, ("nccl", "cuda:0")),
        ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, 7, 8, None, ("nccl", "cuda:7")),
        (TORCHRUN_TASK, 5, 8, None, ("nccl", "cuda:5")),
        ({**SLURM_TASK, "CUDA_VISIBLE_DEVICES": "0,1"}, 1, 2, "gloo", ("gloo", "cpu")),
    ],
)
def test_task_device_uses_the_allocated_gpus(
    env: dict[str, str],
    local_rank: int,
    visible: int,
    backend: str | None,
    expected: tuple[str, str],
) -> None:
    assert task_device(env, local_rank, visible, backend) == expected


def test_nccl_on_a_task_slurm_gave_no_gpu_says_how_to_ask() -> None:
    with pytest.raises(ValueError) as info:
        task_device(SLURM_TASK, 0, 4, "nccl")
    message = str(info.value)
    assert "SLURM allocated this task none (4 visible" in message
    assert "CUDA_VISIBLE_DEVICES" in message and "--gpus-per-node" in message


# ------------------------------------------------------------ init_process_group(device_id)


def _init_new(backend: str, *, store: Any = None, device_id: Any = None) -> None:
    """torch >= 2.3: init_process_group takes device_id."""


def _init_old(backend: str, *, store: Any = None, timeout: Any = None) -> None:
    """torch 2.1/2.2: no device_id."""


class _NoSignature:
    __signature__ = "not a signature"  # inspect.signature raises TypeError

    def __call__(self) -> None:
        pass


def test_device_id_goes_to_nccl_where_torch_takes_it() -> None:
    import torch

    device = torch.device("cuda", 3)
    assert process_group_options(_init_new, "nccl", device) == {"device_id": device}
    assert process_group_options(_init_old, "nccl", device) == {}
    assert process_group_options(_init_new, "gloo", torch.device("cpu")) == {}
    assert process_group_options(_NoSignature(), "nccl", device) == {}


def test_setup_passes_the_ranks_gpu_as_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import torch.distributed as dist

    for name in list(os.environ):
        if (
            name.startswith(("SLURM_", "SUBMITIT_"))
            or name in TORCHRUN_TASK
            or name in ("MASTER_ADDR", "MASTER_PORT")
        ):
            monkeypatch.delenv(name)
    seen: dict[str, Any] = {}

    def fake_init(
        backend: str,
        *,
        store: Any = None,
        rank: int = -1,
        world_size: int = -1,
        timeout: Any = None,
        device_id: Any = None,
    ) -> None:
        seen.update(backend=backend, device_id=device_id)
        raise RuntimeError("stop here: no GPU on this machine")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(DistributedInitError):
            setup_distributed(timeout_s=10, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    finally:
        cleanup_distributed()
        torch.set_num_threads(threads)
        for name in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
        ):
            os.environ.pop(name, None)
    assert seen == {"backend": "nccl", "device_id": torch.device("cuda", 0)}


# ------------------------------------------------------------ 8 GPUs per node, 2 nodes


def _eight_gpu_profile(tmp_path: Path) -> str:
    profile = tmp_path / "dgx.yaml"
    profile.write_text(
        "description: 8 GPUs and 128 cores per node\npartition: gpu\n"
        "cores_per_node: 128\ngpus_per_node: 8\nmax_nodes: 16\n"
    )
    return str(profile)


def test_eight_gpus_on_two_nodes_render_and_simulate(tmp_path: Path) -> None:
    spec = spec_from_options({"profile": _eight_gpu_profile(tmp_path), "mode": "nccl", "nodes": 2})
    assert (spec.gpus_per_node, spec.tasks_per_node, spec.cpus_per_task) == (8, 8, 16)
    script = render(spec)
    directives = [line for line in script.splitlines() if line.startswith("#SBATCH ")]
    for expected in ("--nodes=2", "--ntasks-per-node=8", "--cpus-per-task=16", "--gpus-per-node=8"):
        assert f"#SBATCH {expected}" in directives
    for line in (
        "export NCCL_NVLS_ENABLE=0",
        "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        "export NVSHMEM_DISABLE_NVLS=1",
    ):
        assert line in script

    # Run it with a stand-in srun, then give every task what srun would: the contract must
    # put 16 ranks on cuda:0..7 of each node, with gpu-01 as master.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    argv_file = tmp_path / "srun-argv"
    (bindir / "srun").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {quote(str(argv_file))}\n")
    (bindir / "srun").chmod(0o755)
    install_job_python(bindir)
    (tmp_path / "job.sh").write_text(script)
    env = {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NODELIST": "gpu-[01-02]",
        "SLURM_CPUS_PER_TASK": "16",
    }
    proc = subprocess.run(
        ["bash", str(tmp_path / "job.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    argv = argv_file.read_text().splitlines()
    options = dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    assert (options["nodes"], options["ntasks-per-node"], options["cpus-per-task"]) == (
        "2",
        "8",
        "16",
    )

    rows = simulate_allocation(
        "gpu-[01-02]",
        options["ntasks-per-node"],
        1234,
        0,
        int(options["cpus-per-task"]),
        spec.gpus_per_node,
    )
    assert [row["rank"] for row in rows] == list(range(16))
    assert [row["local_rank"] for row in rows] == list(range(8)) * 2
    assert [row["hostname"] for row in rows] == ["gpu-01"] * 8 + ["gpu-02"] * 8
    assert [row["device"] for row in rows] == [f"cuda:{i}" for i in range(8)] * 2
    assert {(row["master_addr"], row["world_size"], row["local_world_size"]) for row in rows} == {
        ("gpu-01", 16, 8)
    }
    # Each of those tasks has all 8 of its node's GPUs visible (srun --gpus-per-node=8).
    visible = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "SLURM_JOB_ID": "1234"}
    assert [task_device(visible, row["local_rank"], 8)[1] for row in rows] == [
        row["device"] for row in rows
    ]


def test_nine_gpus_exceed_an_eight_gpu_profile(tmp_path: Path) -> None:
    from hpcdist.errors import SpecError

    with pytest.raises(SpecError, match="--gpus-per-node 9 exceeds profile 'dgx' limit of 8"):
        spec_from_options(
            {"profile": _eight_gpu_profile(tmp_path), "mode": "nccl", "gpus_per_node": 9}
        )


@pytest.mark.parametrize(
    ("backend", "environ"),
    [("gloo", {}), ("gloo", {"CUDA_VISIBLE_DEVICES": "0,1"}), (None, {"CUDA_VISIBLE_DEVICES": ""})],
)
def test_the_cuda_driver_is_not_started_where_its_answer_changes_nothing(
    backend: str | None, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from hpcdist.distributed import group

    def started() -> bool:
        raise AssertionError("the CUDA driver was asked")

    monkeypatch.setattr(torch.cuda, "is_available", started)
    assert group._torch_gpus(backend, environ) == 0


@pytest.mark.parametrize(
    ("backend", "environ"), [(None, {}), ("nccl", {}), (None, {"CUDA_VISIBLE_DEVICES": "0"})]
)
def test_the_cuda_driver_is_asked_where_a_gpu_could_be_used(
    backend: str | None, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from hpcdist.distributed import group

    asked: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append(True) or True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert group._torch_gpus(backend, environ) == 3 and asked == [True]
