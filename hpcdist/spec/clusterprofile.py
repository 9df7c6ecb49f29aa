"""The profile of the cluster hpcdist talks to, for a job that names none.

With no ``--profile`` and no ``$HPCDIST_PROFILE``, a job is rendered for the cluster SLURM's
clients answer for: ``hpcdist.slurm.probe`` describes it (one round of controller calls),
and this module turns that description into a profile: the partition SLURM picks (or the
one ``--partition`` names), its nodes' CPUs, memory and GPUs, its time and node limits,
``MaxArraySize``, and the QOS or account its policy requires where the user has exactly one
that fits. Nothing about the network is pinned: each rank finds its interface when it
starts (``hpcdist.distributed.netif``). A policy that would stop the job (no default
partition, a DOWN partition, a QOS the user lacks) is refused here, in one line with the
fix, before anything is written or queued.

The description is kept for ``CACHE_TTL_S`` in the user's private state folder, one file
per cluster (its name, controller and port, and SLURM version), so that ``render`` and
``submit`` answer at once; a cached description that would refuse the job is asked again
first. Where no SLURM answers (``render`` on a laptop), the profile assumes nothing of the
hardware and the script's header says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpcdist.errors import SpecError
from hpcdist.slurm import rest
from hpcdist.slurm.probe import ClusterProbe, Node, Partition, parse_version, probe, time_text
from hpcdist.slurm.sitepolicy import blockers
from hpcdist.slurm.tools import slurm_tool
from hpcdist.spec.profiles import Profile, profile_from_mapping
from hpcdist.state.private import write_private
from hpcdist.state.statehome import make_state_base
from hpcdist.state.trustedfile import read_private

CACHE_TTL_S = 600.0
_CACHE_FORMAT = 1
# A job without --time: SLURM's DefaultTime where the partition has one, else this, cut to
# the partition's MaxTime.
_DEFAULT_TIME_S = 30 * 60
# The environment hpcdist is installed in, if the job is not started from it.
_SETUP = ('if [ -n "${HPCDIST_VENV:-}" ]; then source "${HPCDIST_VENV}/bin/activate"; fi',)


def assumed_profile(reason: str) -> Profile:
    """The profile where no SLURM describes the cluster: nothing of a site assumed (SLURM's
    default partition, one CPU a task unless --cpus-per-task says otherwise, no limits
    checked), and the header of every script says so."""
    return Profile(
        name="assumed",
        description="no cluster described",
        setup=_SETUP,
        source=(
            f"{reason}: SLURM's default partition, 1 CPU per task unless --cpus-per-task, "
            "no site limits checked; render on the cluster, or name a --profile"
        ),
    )


def _min(values: list[int]) -> int | None:
    return min(values) if values and min(values) > 0 else None


def _time(part: Partition) -> str:
    seconds = part.default_time_s or _DEFAULT_TIME_S
    if part.max_time_s is not None:
        seconds = min(seconds, part.max_time_s)
    return time_text(seconds)


def _site_choice(allowed: tuple[str, ...], default: str | None, mine: tuple[str, ...]) -> str:
    """The QOS (or account) a job in a partition must name: "" where the user's default
    is allowed there, else the one the user may use there."""
    if not allowed or default in allowed:
        return ""
    usable = [name for name in allowed if name in mine]
    return usable[0] if len(usable) == 1 else ""


def profile_mapping(found: ClusterProbe, part: Partition, named: bool) -> dict[str, Any]:
    """The profile keys (as a profile file has them) of a job in ``part``; ``named``: the
    job names the partition itself (else SLURM picks its default). Pure."""
    nodes: list[Node] = found.nodes_of(part.name)
    user = found.user
    mapping: dict[str, Any] = {
        "description": f"partition {part.name} of cluster {found.cluster_name or '?'}",
        "partition": part.name if named else None,
        "partitions": [p.name for p in found.partitions],
        "max_nodes": part.max_nodes or part.total_nodes or None,
        "cores_per_node": _min([n.cpus for n in nodes]),
        "memory_mb": _min([n.memory_mb for n in nodes]),
        "gpus_per_node": min((n.gpus for n in nodes), default=0),
        "gpu_types": sorted({t for n in nodes for t in n.gpu_types}),
        "features": sorted({f for n in nodes for f in n.features}),
        "max_time": None if part.max_time_s is None else time_text(part.max_time_s),
        "max_array_size": found.max_array_size,
        "defaults": {"time": _time(part)},
        "setup": list(_SETUP),
    }
    if user is not None:
        mapping["qos"] = _site_choice(part.allow_qos, user.default_qos, user.qos) or None
        account = _site_choice(part.allow_accounts, user.default_account, user.accounts)
        mapping["account"] = account or None
    return {key: value for key, value in mapping.items() if value not in (None, [])}


def describe_probe(found: ClusterProbe, part: Partition, mapping: Mapping[str, Any]) -> str:
    """How the script's header names where its profile came from (no time: render and
    submit write the same bytes)."""
    cores = mapping.get("cores_per_node", "?")
    memory = mapping.get("memory_mb", "?")
    return (
        f"cluster {found.cluster_name or '?'}, SLURM {found.version or '?'}, partition "
        f"{part.name}: {part.total_nodes} nodes of {cores} CPUs and {memory} MB"
    )


def _first(partition: str | None) -> str | None:
    """The partition whose limits a job is checked against: of a comma list, the first."""
    names = [name for name in (partition or "").split(",") if name]
    return names[0] if names else None


def cluster_entry(found: ClusterProbe, partition: str | None) -> dict[str, Any]:
    """What a job in ``partition`` (None: the default) takes from the described cluster:
    ``{"mapping", "source", "blockers"}``, as the cache keeps it. Pure."""
    first = _first(partition)
    by_name = {p.name: p for p in found.partitions}
    part = by_name.get(first or "") or found.default_partition()
    stopped = [[b.what, b.fix] for b in blockers(_as_job_would_run(found, part), first)]
    entry: dict[str, Any] = {"name": found.cluster_name or "cluster", "blockers": stopped}
    if stopped or part is None:
        return {**entry, "mapping": {}, "source": ""}
    mapping = profile_mapping(found, part, partition is not None)
    return {**entry, "mapping": mapping, "source": describe_probe(found, part, mapping)}


def _as_job_would_run(found: ClusterProbe, part: Partition | None) -> ClusterProbe:
    """The description as a job of this profile sees it: with the QOS and account the
    profile names for ``part`` (``_site_choice``) in place of the user's defaults."""
    user = found.user
    if user is None or part is None:
        return found
    qos = _site_choice(part.allow_qos, user.default_qos, user.qos) or user.default_qos
    account = (
        _site_choice(part.allow_accounts, user.default_account, user.accounts)
        or user.default_account
    )
    return replace(found, user=replace(user, default_qos=qos, default_account=account))


def entry_profile(entry: Mapping[str, Any]) -> Profile:
    """The profile of a cache entry; SpecError with its first blocker and the fix."""
    if entry["blockers"]:
        what, fix = entry["blockers"][0]
        how = f"use {fix}" if fix.startswith("--") else fix
        raise SpecError(f"{what}; {how} (the cluster's own description: no profile named)")
    profile = profile_from_mapping(entry["name"], entry["mapping"], "the cluster")
    return replace(profile, source=entry["source"])


def cluster_key(environ: Mapping[str, str] | None = None) -> str | None:
    """Which cluster SLURM's clients talk to, without asking the controller: slurm.conf's
    ClusterName, controller and port, and the clients' version. None where no slurm.conf
    is readable (a configless site): then nothing is cached."""
    env = os.environ if environ is None else environ
    conf = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = conf.read_text(errors="replace")
    except OSError:
        return None
    keys = ("ClusterName", "SlurmctldHost", "ControlMachine", "SlurmctldPort")
    found = {}
    for key in keys:
        match = re.search(rf"^\s*{key}\s*=\s*(\S+)", text, re.MULTILINE | re.IGNORECASE)
        found[key] = match[1] if match else ""
    version = slurm_tool(["sinfo", "--version"])
    found["version"] = str(parse_version(version.stdout)) if version.returncode == 0 else ""
    return json.dumps(found, sort_keys=True)


def rest_key() -> str:
    """The cluster behind slurmrestd: its address and the version spoken (asked once)."""
    client = rest.client()
    return json.dumps(
        {"ClusterName": "", "slurmrestd": client.where.text, "version": client.version}
    )


def cache_path(key: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", json.loads(key).get("ClusterName") or "cluster")
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return make_state_base() / "clusters" / f"{name[:40]}-{digest}.json"


def _read_cache(key: str, now: float) -> dict[str, Any]:
    """The cached entries of cluster ``key`` by partition ("" the default); {} where there
    are none, they are older than CACHE_TTL_S, or the file is not the user's alone."""
    path = cache_path(key)
    if not path.exists():
        return {}
    try:
        data = json.loads(read_private(path, "hpcdist's cluster description"))
    except (OSError, ValueError):
        return {}  # unreadable, or not private: asked again, and rewritten
    entries = data.get("entries") if isinstance(data, dict) else None
    if (
        data.get("format") != _CACHE_FORMAT
        or data.get("key") != key
        or not isinstance(entries, dict)
    ):
        return {}
    return {
        slot: entry
        for slot, entry in entries.items()
        if 0 <= now - float(entry.get("made", 0)) < CACHE_TTL_S
    }


def _write_cache(key: str, entries: Mapping[str, Any]) -> None:
    data = {"format": _CACHE_FORMAT, "key": key, "entries": dict(entries)}
    # A cache that cannot be written only costs the next command a probe.
    with contextlib.suppress(OSError):
        write_private(cache_path(key), json.dumps(data, indent=1), "hpcdist's state folder")


def cluster_profile(partition: str | None) -> Profile:
    """The profile of a job in ``partition`` (None: the default) of the cluster SLURM's
    clients talk to (or slurmrestd, ``--transport rest``); the assumed profile where none
    answers. SpecError names a blocker."""
    over_rest = rest.chosen()
    if not over_rest and (shutil.which("sinfo") is None or shutil.which("sbatch") is None):
        return assumed_profile("no SLURM commands on this machine")
    key = rest_key() if over_rest else cluster_key()
    now, slot = time.time(), partition or ""
    entries = _read_cache(key, now) if key is not None else {}
    entry = entries.get(slot)
    if entry is None or entry["blockers"]:  # a refusal is never taken from the cache
        found = probe()
        if not found.controller:
            return assumed_profile("the SLURM controller did not answer (scontrol ping)")
        entry = {**cluster_entry(found, partition), "made": now}
        if key is not None:
            _write_cache(key, {**entries, slot: entry})
    return entry_profile(entry)
