"""What the cluster this runs on offers, as its SLURM clients tell it: version, controller,
accounting, plugins, partitions and their limits, GPUs, features, MPI and container support.

Pure parsers of each client's output, and one ``probe()`` that runs the clients. Where the
version has JSON output (``scontrol --json``, SLURM >= 23.02) it is read; the text output is
kept for the versions before (and for a JSON answer that does not parse).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hpcdist.slurm.tools import slurm_tool


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)


_VERSION = re.compile(r"\b(\d{2})\.(\d{1,2})(?:\.(\d+))?")

# First SLURM with `scontrol --json` (and `sacct -o StdOut,StdErr`).
JSON_SCONTROL = (23, 2)


def parse_version(text: str) -> SlurmVersion | None:
    """``slurm 22.05.8`` / ``slurm-wlm 26.05.5`` (what ``sinfo --version`` prints)."""
    found = _VERSION.search(text)
    if found is None:
        return None
    return SlurmVersion(int(found.group(1)), int(found.group(2)), int(found.group(3) or 0))


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str  # SLURM's node list
    total_nodes: int
    max_time_s: int | None  # None: no limit
    max_nodes: int | None  # None: no limit
    qos: str | None
    default: bool | None = False  # None: the output does not say (24.11's JSON has no flags)


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    gpus: int
    gpu_types: tuple[str, ...]
    features: tuple[str, ...]
    memory_mb: int


def _limit_minutes(value: object) -> int | None:
    """A JSON limit ``{"set": true, "infinite": false, "number": N}`` (or a bare number)."""
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def partitions_from_json(text: str) -> list[Partition]:
    """``scontrol --json show partition`` (SLURM >= 23.02); ValueError if it is not that."""
    data = json.loads(text)
    out = []
    for raw in data["partitions"]:
        maximums = raw.get("maximums", {})
        minutes = _limit_minutes(maximums.get("time"))
        qos = (raw.get("qos") or {}).get("assigned") or None
        nodes = raw.get("nodes", {})
        out.append(
            Partition(
                name=raw["name"],
                nodes=nodes.get("configured", ""),
                total_nodes=int(nodes.get("total", 0)),
                max_time_s=None if minutes is None else minutes * 60,
                max_nodes=_limit_minutes(maximums.get("nodes")),
                qos=qos,
                default=("DEFAULT" in raw["flags"]) if "flags" in raw else None,
            )
        )
    return out


def _duration_s(text: str) -> int | None:
    """``UNLIMITED``/``INFINITE`` -> None; ``[D-]HH:MM:SS``, ``MM`` -> seconds."""
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if len(parts) == 1:
        seconds = parts[0] * 60  # a bare number is minutes
    else:
        while len(parts) < 3:
            parts.insert(0, 0)
        seconds = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return seconds + (int(days) * 86400 if days else 0)


def partitions_from_text(text: str) -> list[Partition]:
    """``scontrol show partition -o``: one line of KEY=VALUE words per partition."""
    out = []
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "PartitionName" not in fields:
            continue
        max_nodes = fields.get("MaxNodes", "UNLIMITED")
        qos = fields.get("QoS", "N/A")
        out.append(
            Partition(
                name=fields["PartitionName"],
                nodes=fields.get("Nodes", ""),
                total_nodes=int(fields.get("TotalNodes", "0")),
                max_time_s=_duration_s(fields.get("MaxTime", "UNLIMITED")),
                max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
                qos=None if qos in ("N/A", "(null)") else qos,
                default=fields.get("Default") == "YES",
            )
        )
    return out


NODE_FORMAT = "%N|%P|%c|%G|%f|%m"


def _gres_gpus(gres: str) -> tuple[int, tuple[str, ...]]:
    """``gpu:h100:4(S:0-1),gpu:a100:2`` -> (6, ('a100', 'h100')); ``(null)`` -> (0, ())."""
    count, types = 0, set()
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        number = parts[-1]
        count += int(number) if number.isdigit() else 0
        if len(parts) == 3:
            types.add(parts[1])
    return count, tuple(sorted(types))


def tres_gpus(value: str) -> tuple[str | None, int]:
    """(type, count) of the GPUs in ``scontrol show job``'s TresPerNode/TresPerTask:
    ``gres:gpu:tesla:2`` (SLURM 22.05) and ``gres/gpu:tesla:2`` (23.02 and later, which
    write the TRES name with a slash); (None, 0) when no GPU is asked for."""
    for item in value.split(","):
        name, _, rest = item.replace("gres/", "gres:", 1).partition("gres:")
        if name or not rest.startswith("gpu"):
            continue
        parts = rest.split(":")
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 and parts[-1].isdigit() else "1"
        gpu_type = parts[1] if len(parts) == 3 else None
        return gpu_type, int(count)
    return None, 0


def nodes_from_sinfo(text: str) -> list[Node]:
    """``sinfo -h -N -o '%N|%P|%c|%G|%f|%m'``: a line per node and partition; merged by node."""
    merged: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 6:
            continue
        name, partition, cpus, gres, features, memory = parts
        gpus, types = _gres_gpus(gres)
        node = merged.get(name)
        part = partition.rstrip("*")
        merged[name] = Node(
            name=name,
            partitions=(*node.partitions, part) if node else (part,),
            cpus=int(cpus) if cpus.isdigit() else 0,
            gpus=gpus,
            gpu_types=types,
            features=tuple(f for f in features.split(",") if f and f != "(null)"),
            memory_mb=int(memory) if memory.isdigit() else 0,
        )
    return list(merged.values())


def config_values(text: str) -> dict[str, str]:
    """``scontrol show config``: ``Name = value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def mpi_types(text: str) -> tuple[str, ...]:
    """``srun --mpi=list``: the plugin names, one per indented line (format of every version:
    ``MPI plugin types are...`` then tab-indented names)."""
    names = [line.strip() for line in text.splitlines() if line.startswith(("\t", " "))]
    return tuple(n for n in names if re.fullmatch(r"[A-Za-z0-9_]+", n))


@dataclass(frozen=True)
class ClusterProbe:
    version: SlurmVersion | None
    controller: bool
    accounting: bool
    config: Mapping[str, str] = field(default_factory=dict)
    partitions: tuple[Partition, ...] = ()
    nodes: tuple[Node, ...] = ()
    containers: tuple[str, ...] = ()
    mpi: tuple[str, ...] = ()
    partitions_from: str = "text"  # "json" where the version had it

    def nodes_of(self, partition: str) -> list[Node]:
        return [n for n in self.nodes if partition in n.partitions]

    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions if p.default), None) or (
            self.partitions[0] if self.partitions else None
        )


def _ok(argv: Sequence[str]) -> tuple[bool, str]:
    if shutil.which(argv[0]) is None:
        return False, ""
    proc = slurm_tool(list(argv))
    return proc.returncode == 0, proc.stdout


def probe() -> ClusterProbe:
    """Ask this cluster's SLURM clients (a few seconds at most; nothing is submitted)."""
    has_version, text = _ok(["sinfo", "--version"])
    version = parse_version(text) if has_version else None
    controller, _ = _ok(["scontrol", "ping"])
    if not controller:
        return ClusterProbe(version=version, controller=False, accounting=False)
    accounting, _ = _ok(["sacct", "-n", "-X", "-S", "now-1hours", "-o", "JobID"])
    _, config = _ok(["scontrol", "show", "config"])
    partitions: list[Partition] = []
    source = "text"
    if version is not None and version.at_least(*JSON_SCONTROL):
        ok, text = _ok(["scontrol", "--json", "show", "partition"])
        try:
            partitions, source = (partitions_from_json(text), "json") if ok else ([], "text")
        except (ValueError, KeyError, TypeError):
            partitions = []
    if not partitions or any(p.default is None for p in partitions):
        text_partitions = partitions_from_text(_ok(["scontrol", "show", "partition", "-o"])[1])
        if partitions:
            # SLURM 24.11's JSON leaves out the partition flags: the default comes from text.
            defaults = {p.name: p.default for p in text_partitions}
            partitions = [replace(p, default=defaults.get(p.name, False)) for p in partitions]
        else:
            source, partitions = "text", text_partitions
    nodes = nodes_from_sinfo(_ok(["sinfo", "-h", "-N", "-o", NODE_FORMAT])[1])
    containers = [name for name in ("apptainer", "singularity") if shutil.which(name)]
    _, srun_help = _ok(["srun", "--help"])
    if "--container-image" in srun_help:
        containers.append("pyxis")
    _, mpi = _ok(["srun", "--mpi=list"])
    return ClusterProbe(
        version=version,
        controller=True,
        accounting=accounting,
        config=config_values(config),
        partitions=tuple(partitions),
        nodes=tuple(nodes),
        containers=tuple(containers),
        mpi=mpi_types(mpi),
        partitions_from=source,
    )


def time_text(seconds: int | None) -> str:
    """A limit as SLURM writes it: ``1-00:00:00``, ``04:00:00``; ``unlimited`` for None."""
    if seconds is None:
        return "unlimited"
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock
