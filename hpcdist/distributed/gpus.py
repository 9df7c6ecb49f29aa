"""How many GPUs a task, or a whole node, has at run time: counted here and nowhere else.

A rank asks for its own (``hpcdist.distributed.group`` picks its device with the count), and
the batch script of an nccl job without a GPU count asks for its node's
(``hpcdist.distributed.jobstep gpus``) to start one task per GPU, whether ``render`` or
``submit`` made the script. Standard library only.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

# How SLURM hands a task its GPUs (gres/gpu). A task given none has none of them, yet sees
# every GPU of the host where the site does not constrain devices (no ConstrainDevices).
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
_SLURM_TASK_VARS = ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_STEP_ID")


@dataclass(frozen=True)
class GpuCount:
    count: int
    seen: str  # what the count was read from, for the user
    granted: bool = False  # SLURM handed them out (gres/gpu): srun must ask for them again


def count_gpus(env: Mapping[str, str], visible: int, whole_node: bool = False) -> GpuCount:
    """The GPUs of this task (or, ``whole_node``, of the node an exclusive job holds) out of
    the ``visible`` ones the driver lists (torch's count honours CUDA_VISIBLE_DEVICES;
    ``nvidia-smi -L`` lists the host's). Pure, for tests.

    A task: under SLURM, one with none of GPU_VARS set was given no GPU, however many the
    host shows it; elsewhere (torchrun, a workstation) every visible GPU is its own.
    A whole node: SLURM's count if it handed the GPUs out, else every GPU the driver lists
    (a site without gres/gpu sets none of GPU_VARS, yet the exclusive job holds them all).
    """
    if visible < 0:
        raise ValueError(f"visible_gpus must be >= 0, got {visible}")
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if whole_node:
        if on_node:
            count = int(on_node) if on_node.isdigit() else 0
            return GpuCount(count, f"SLURM_GPUS_ON_NODE={on_node}", granted=True)
        return GpuCount(visible, f"SLURM_GPUS_ON_NODE unset, nvidia-smi -L lists {visible}")
    if "CUDA_VISIBLE_DEVICES" in env:
        return GpuCount(visible, f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']!r}")
    given = [var for var in GPU_VARS if env.get(var, "").strip()]
    if any(var in env for var in _SLURM_TASK_VARS) and not given:
        return GpuCount(0, f"none of {', '.join(GPU_VARS)} set")
    return GpuCount(visible, f"{visible} visible")


def allocated_gpus(env: Mapping[str, str], visible_gpus: int) -> int:
    """GPUs allocated to this task, of the ``visible_gpus`` that torch counts."""
    return count_gpus(env, visible_gpus).count


def listed_gpus() -> int:
    """GPUs the driver lists (``nvidia-smi -L``); 0 without a driver. MIG instances are
    listed, indented, under their GPU: only the GPU lines count."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))
