"""GPUs per node of a partition, as the controller declares them (``sinfo -o %G``).

``hpcdist submit`` needs its task count when it submits, so an nccl job with no GPU count
from the flags or the profile asks the controller instead of counting at run time as a
rendered script does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcdist.errors import SpecError
from hpcdist.slurm.tools import slurm_tool
from hpcdist.spec.options import options_profile, spec_from_options

if TYPE_CHECKING:
    from hpcdist.spec.jobspec import JobSpec

# One GRES of sinfo's %G: gpu:4, gpu:a100:4, gpu:a100:4(S:0-1); other kinds (nvme:1) too.
_GRES = re.compile(r"(?P<name>[^:(]+)(?::(?P<type>[^:(]+))?:(?P<count>[0-9]+)(?:\(.*\))?")


@dataclass(frozen=True)
class PartitionGpus:
    partition: str
    gpus_per_node: int
    cpus_per_node: int
    seen: str  # what the controller said, for the user

    def describe(self) -> str:
        return (
            f"partition {self.partition} has {self.gpus_per_node} GPUs per node "
            f"(sinfo %G: {self.seen})"
        )


def gres_gpus(gres: str, gpu_type: str | None = None) -> int:
    """GPUs in one node's GRES string (of ``gpu_type`` only, if given); 0 for ``(null)``."""
    total = 0
    for item in _split(gres):
        match = _GRES.fullmatch(item.strip())
        if match is None or match["name"] != "gpu":
            continue
        if gpu_type is None or match["type"] == gpu_type:
            total += int(match["count"])
    return total


def _split(gres: str) -> list[str]:
    """Commas outside parentheses separate GRES (a socket list ``(S:0,1)`` has its own)."""
    items, depth, current = [], 0, ""
    for char in gres:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    return [*items, current]


def parse_sinfo(text: str, partition: str | None, gpu_type: str | None) -> PartitionGpus:
    """The partition's GPUs per node from ``sinfo -h -o %P|%G|%c`` lines (the default
    partition, marked ``*``, when ``partition`` is None). Nodes that differ: the fewest, so
    the job fits on any node of the partition."""
    rows = [line.split("|") for line in text.splitlines() if line.count("|") == 2]
    if partition is None:
        defaults = [row[0] for row in rows if row[0].endswith("*")]
        if not defaults:
            raise SpecError(
                "--mode nccl with no GPU count: no partition given and the cluster has no "
                "default one; pass --partition or --gpus-per-node N"
            )
        partition = defaults[0]
    name = partition.rstrip("*")
    mine = [row for row in rows if row[0].rstrip("*") == name]
    if not mine:
        raise SpecError(
            f"--mode nccl with no GPU count: sinfo knows no partition {name!r}; "
            "pass --partition or --gpus-per-node N"
        )
    counts = [gres_gpus(row[1], gpu_type) for row in mine]
    seen = ", ".join(sorted({row[1] for row in mine}))
    gpus = min(counts)
    if gpus < 1:
        kind = f" of type {gpu_type!r}" if gpu_type else ""
        raise SpecError(
            f"--mode nccl with no GPU count: partition {name} has no GPUs{kind} "
            f"(sinfo %G: {seen}); pass --partition of a GPU partition or --gpus-per-node N"
        )
    cpus = min(int(row[2].rstrip("+")) if row[2].rstrip("+").isdigit() else 1 for row in mine)
    return PartitionGpus(name, gpus, cpus, seen)


def partition_gpus(partition: str | None, gpu_type: str | None = None) -> PartitionGpus:
    """Ask the controller (``sinfo``) for the partition's GPUs per node."""

    argv = ["sinfo", "-h", "-o", "%P|%G|%c", *(["-p", partition] if partition else [])]
    proc = slurm_tool(argv)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise SpecError(f"cannot count the partition's GPUs: sinfo: {reason}")
    return parse_sinfo(proc.stdout, partition, gpu_type)


def fill_gpu_count(options: dict[str, Any], spec: JobSpec) -> tuple[JobSpec, str]:
    """An nccl spec with no GPU count, made again with the partition's count (and, unless
    given, its CPUs shared by those GPUs); with the line that tells the user."""
    found = partition_gpus(spec.partition, spec.gpu_type)
    flags = {**options, "gpus_per_node": found.gpus_per_node}
    if options.get("cpus_per_task") is None:
        # The node's CPUs shared by its GPUs, within the profile's core count if it has one.
        cores = options_profile(options).cores_per_node or found.cpus_per_node
        cpus = min(found.cpus_per_node, cores) // found.gpus_per_node
        flags["cpus_per_task"] = max(1, cpus)
    filled = spec_from_options(flags)
    return filled, (
        f"hpcdist: no GPU count given; {found.describe()}: submitting "
        f"{found.gpus_per_node} tasks per node, {filled.cpus_per_task} "
        f"CPU{'' if filled.cpus_per_task == 1 else 's'} each"
    )
