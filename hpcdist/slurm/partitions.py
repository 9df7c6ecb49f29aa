"""Partitions and nodes as SLURM's clients print them: ``scontrol show partition`` (text, and
JSON from 23.02 on) and ``sinfo -N`` lines; the GPUs of a GRES or TRES string.

Pure parsers; ``hpcdist.slurm.probe`` runs the clients.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str  # SLURM's node list
    total_nodes: int
    max_time_s: int | None  # None: no limit
    max_nodes: int | None  # None: no limit
    qos: str | None
    default: bool | None = False  # None: the output does not say (24.11's JSON has no flags)
    state: str = "UP"  # UP, DOWN (jobs queue, none starts), DRAIN, INACTIVE (none accepted)
    default_time_s: int | None = None  # None: a job without --time gets MaxTime
    allow_qos: tuple[str, ...] = ()  # (): every QOS
    allow_accounts: tuple[str, ...] = ()  # (): every account


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    cpus: int
    gpus: int
    gpu_types: tuple[str, ...]
    features: tuple[str, ...]
    memory_mb: int
    sockets: int = 0  # 0: not reported
    cores_per_socket: int = 0
    threads_per_core: int = 0
    state: str = ""  # sinfo's short state: idle, mix, alloc, down*, drain, ...


def _limit_minutes(value: object) -> int | None:
    """A JSON limit ``{"set": true, "infinite": false, "number": N}`` (or a bare number)."""
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _names(text: str | None) -> tuple[str, ...]:
    """An allow list as SLURM prints it: ``a,b`` -> ('a', 'b'); ``ALL``, ``""``, ``(null)`` ->
    () (every one allowed)."""
    if not text or text in ("ALL", "(null)", "N/A"):
        return ()
    return tuple(n for n in text.split(",") if n)


def _json_state(raw: Mapping[str, object]) -> str:
    """``"partition": {"state": ["UP"]}`` (23.02 and later print the state as a list)."""
    inner = raw.get("partition")
    state = inner.get("state") if isinstance(inner, Mapping) else None
    if isinstance(state, list):
        state = state[0] if state else None
    return str(state).upper() if state else "UP"


def partitions_from_json(text: str) -> list[Partition]:
    """``scontrol --json show partition`` (SLURM >= 23.02); ValueError if it is not that."""
    data = json.loads(text)
    out = []
    for raw in data["partitions"]:
        maximums = raw.get("maximums", {})
        minutes = _limit_minutes(maximums.get("time"))
        default_minutes = _limit_minutes((raw.get("defaults") or {}).get("time"))
        qos = raw.get("qos") or {}
        nodes = raw.get("nodes", {})
        out.append(
            Partition(
                name=raw["name"],
                nodes=nodes.get("configured", ""),
                total_nodes=int(nodes.get("total", 0)),
                max_time_s=None if minutes is None else minutes * 60,
                max_nodes=_limit_minutes(maximums.get("nodes")),
                qos=qos.get("assigned") or None,
                default=("DEFAULT" in raw["flags"]) if "flags" in raw else None,
                state=_json_state(raw),
                default_time_s=None if default_minutes is None else default_minutes * 60,
                allow_qos=_names(qos.get("allowed")),
                allow_accounts=_names((raw.get("accounts") or {}).get("allowed")),
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
                state=fields.get("State", "UP"),
                default_time_s=_duration_s(fields.get("DefaultTime", "NONE")),
                allow_qos=_names(fields.get("AllowQos")),
                allow_accounts=_names(fields.get("AllowAccounts")),
            )
        )
    return out


# Node, partition, CPUs, GRES, features, memory, sockets, cores a socket, threads a core, state.
NODE_FORMAT = "%N|%P|%c|%G|%f|%m|%X|%Y|%Z|%t"


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


def _count(text: str) -> int:
    return int(text) if text.isdigit() else 0


def nodes_from_sinfo(text: str) -> list[Node]:
    """``sinfo -h -N -o NODE_FORMAT``: a line per node and partition; merged by node. The
    first six fields alone (the format before the layout and state) read as well."""
    merged: dict[str, Node] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) not in (6, 10):
            continue
        name, partition, cpus, gres, features, memory = parts[:6]
        sockets, cores, threads, state = parts[6:] or ("", "", "", "")
        gpus, types = _gres_gpus(gres)
        node = merged.get(name)
        part = partition.rstrip("*")
        merged[name] = Node(
            name=name,
            partitions=(*node.partitions, part) if node else (part,),
            cpus=_count(cpus),
            gpus=gpus,
            gpu_types=types,
            features=tuple(f for f in features.split(",") if f and f != "(null)"),
            memory_mb=_count(memory),
            sockets=_count(sockets),
            cores_per_socket=_count(cores),
            threads_per_core=_count(threads),
            state=state,
        )
    return list(merged.values())
