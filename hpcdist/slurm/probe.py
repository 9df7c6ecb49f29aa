"""What the cluster this runs on offers, as its SLURM clients tell it: version, controller,
accounting, plugins, partitions and their limits and policies, nodes and their layout, GPUs,
features, MPI and container support, the site's settings (preemption, requeue, array size,
what accounting enforces, cgroup version) and the user's accounts and QOS.

Pure parsers of each client's output (partitions and nodes in hpcdist.slurm.partitions, the
user's associations in hpcdist.slurm.accounts), and one ``probe()`` that runs the clients once
each. Where the version has JSON output (``scontrol --json``, SLURM >= 23.02) it is read; the
text output is kept for the versions before (and for a JSON answer that does not parse).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from hpcdist.slurm import rest, restjob
from hpcdist.slurm.accounts import (
    ASSOC_FORMAT,
    UserAssociations,
    associations_from_sacctmgr,
    current_user,
)
from hpcdist.slurm.parse import config_values
from hpcdist.slurm.partitions import (
    NODE_FORMAT,
    Node,
    Partition,
    nodes_from_sinfo,
    partitions_from_json,
    partitions_from_text,
    tres_gpus,
)
from hpcdist.slurm.tools import slurm_tool

# Partitions and nodes moved to hpcdist.slurm.partitions; named here for those who import them
# from the probe.
__all__ = [
    "JSON_SCONTROL",
    "NODE_FORMAT",
    "ClusterProbe",
    "Node",
    "Partition",
    "SlurmVersion",
    "UserAssociations",
    "cgroup_from_mounts",
    "config_values",
    "mpi_types",
    "nodes_from_sinfo",
    "parse_version",
    "partitions_from_json",
    "partitions_from_text",
    "probe",
    "time_text",
    "tres_gpus",
    "with_config",
]


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
    partitions_from: str = "text"  # "json" where the version had it; "rest": slurmrestd's
    cluster_name: str | None = None
    controller_host: str | None = None
    max_array_size: int | None = None
    job_requeue: bool | None = None  # JobRequeue: may a job be requeued by default
    preempt_type: str = ""
    preempt_mode: str = ""
    enforce: tuple[str, ...] = ()  # AccountingStorageEnforce's words, lower case
    cgroup_version: str | None = None  # "v1", "v2"; None: neither could be told
    user: UserAssociations | None = None  # None: no accounting to ask

    def nodes_of(self, partition: str) -> list[Node]:
        return [n for n in self.nodes if partition in n.partitions]

    def default_partition(self) -> Partition | None:
        return next((p for p in self.partitions if p.default), None) or (
            self.partitions[0] if self.partitions else None
        )


def _set(value: str | None) -> str | None:
    return None if value in (None, "", "(null)", "N/A") else value


def cgroup_from_mounts(mounts: str) -> str | None:
    """The cgroup version of this host from ``/proc/self/mounts``: ``cgroup2`` at
    /sys/fs/cgroup is v2; a tmpfs there (v1 controllers below it, hybrid or not) is v1."""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "/sys/fs/cgroup":
            return {"cgroup2": "v2", "tmpfs": "v1", "cgroup": "v1"}.get(parts[2])
    return None


def with_config(found: ClusterProbe, config: Mapping[str, str], mounts: str = "") -> ClusterProbe:
    """``found`` with the site settings of ``scontrol show config`` (``config_values``); the
    cgroup version is the config's CgroupPlugin where it names one, else this host's."""
    host = _set(config.get("SlurmctldHost[0]") or config.get("ControlMachine"))
    array = config.get("MaxArraySize", "")
    requeue = config.get("JobRequeue")
    enforce = (config.get("AccountingStorageEnforce") or "none").lower()
    plugin = config.get("CgroupPlugin", "")
    return replace(
        found,
        config=dict(config),
        cluster_name=_set(config.get("ClusterName")),
        # `vm(127.0.0.1)`: the host name, then its address where one is configured.
        controller_host=host.split("(")[0] if host else None,
        max_array_size=int(array) if array.isdigit() else None,
        job_requeue={"1": True, "0": False}.get(requeue or ""),
        preempt_type=config.get("PreemptType", ""),
        preempt_mode=config.get("PreemptMode", ""),
        enforce=tuple(w for w in enforce.split(",") if w and w != "none"),
        cgroup_version={"cgroup/v1": "v1", "cgroup/v2": "v2"}.get(plugin)
        or cgroup_from_mounts(mounts),
    )


def _ok(argv: Sequence[str]) -> tuple[bool, str]:
    if shutil.which(argv[0]) is None:
        return False, ""
    proc = slurm_tool(list(argv))
    return proc.returncode == 0, proc.stdout


def _partitions(version: SlurmVersion | None) -> tuple[list[Partition], str]:
    """The partitions, from scontrol's JSON where the version has it, else from its text."""
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
    return partitions, source


def _user(config: Mapping[str, str]) -> UserAssociations | None:
    """The user's associations, where the cluster keeps accounts in slurmdbd."""
    if "slurmdbd" not in config.get("AccountingStorageType", ""):
        return None
    user = current_user()
    ok, assoc = _ok(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", f"format={ASSOC_FORMAT}"]
    )
    if not ok:
        return None
    _, default = _ok(["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"])
    return associations_from_sacctmgr(assoc, default, user, _set(config.get("ClusterName")))


def _mounts() -> str:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def rest_probe() -> ClusterProbe:
    """The cluster as slurmrestd describes it (``--transport rest``): its release, its
    partitions and nodes; the configuration, accounts and launchers are the commands'
    alone (none of them has a path in the REST API), so their defaults stand."""
    client = rest.client()
    nodes_answer = client.ok("GET", client.path("nodes"))
    answer = client.ok("GET", client.path("partitions"))
    raw = answer.get("partitions") or []
    if restjob.is_legacy(client.version):
        raw = restjob.legacy_partitions(answer)
    partitions = partitions_from_json(json.dumps({"partitions": raw}))
    version = parse_version(f"slurm {restjob.release(answer)}")
    return ClusterProbe(
        version=version,
        controller=True,
        accounting=client.database,
        partitions=tuple(partitions),
        nodes=tuple(nodes_from_sinfo(restjob.node_rows(nodes_answer))),
        partitions_from="rest",
        cluster_name=restjob.cluster(answer),
    )


def probe() -> ClusterProbe:
    """Ask this cluster's SLURM clients (a few seconds at most; nothing is submitted)."""
    if rest.chosen():
        return rest_probe()
    has_version, text = _ok(["sinfo", "--version"])
    version = parse_version(text) if has_version else None
    controller, _ = _ok(["scontrol", "ping"])
    if not controller:
        return ClusterProbe(version=version, controller=False, accounting=False)
    accounting, _ = _ok(["sacct", "-n", "-X", "-S", "now-1hours", "-o", "JobID"])
    config = config_values(_ok(["scontrol", "show", "config"])[1])
    partitions, source = _partitions(version)
    nodes = nodes_from_sinfo(_ok(["sinfo", "-h", "-N", "-o", NODE_FORMAT])[1])
    containers = [name for name in ("apptainer", "singularity") if shutil.which(name)]
    _, srun_help = _ok(["srun", "--help"])
    if "--container-image" in srun_help:
        containers.append("pyxis")
    _, mpi = _ok(["srun", "--mpi=list"])
    found = ClusterProbe(
        version=version,
        controller=True,
        accounting=accounting,
        partitions=tuple(partitions),
        nodes=tuple(nodes),
        containers=tuple(containers),
        mpi=mpi_types(mpi),
        partitions_from=source,
        user=_user(config),
    )
    return with_config(found, config, _mounts())


def time_text(seconds: int | None) -> str:
    """A limit as SLURM writes it: ``1-00:00:00``, ``04:00:00``; ``unlimited`` for None."""
    if seconds is None:
        return "unlimited"
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock
