"""``hpcdist doctor`` and ``hpcdist profile init``: what this cluster offers, and a profile
written from it.

``doctor`` prints one table (the probe of hpcdist.slurm.probe, then what in the current
profile disagrees with the cluster), each problem with one line of advice, and exits 0 when
nothing blocks a job, 1 otherwise. ``profile init NAME`` writes the user's profile NAME from
the same probe, refusing to overwrite one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import click

from hpcdist.errors import ProfileError, SpecError, UserError
from hpcdist.slurm.probe import ClusterProbe, Node, Partition, probe, time_text
from hpcdist.slurm.timelimit import time_limit_seconds
from hpcdist.spec.profiles import (
    DEFAULT_PROFILE,
    Profile,
    config_dir,
    load_profile,
    shipped_profiles,
)

# (what disagrees, "FAIL" or "warn", one line of advice)
Problem = tuple[str, str, str]


@dataclass(frozen=True)
class Row:
    item: str
    value: str
    status: str = "ok"  # ok, warn (a job may still run), FAIL (a job would not)
    advice: str = ""


def _plugins(config: Mapping[str, str]) -> str:
    keys = ("ProctrackType", "TaskPlugin", "CgroupPlugin")
    shown = [f"{k}={config[k]}" for k in keys if config.get(k) not in (None, "", "(null)")]
    return ", ".join(shown) or "none reported"


def _service_rows(found: ClusterProbe) -> list[Row]:
    """Accounting and the plugins that decide what efficiency can show."""
    gather = found.config.get("JobAcctGatherType", "")
    return [
        Row("accounting", "sacct works")
        if found.accounting
        else Row(
            "accounting",
            "sacct fails",
            "warn",
            "no sacct: status after a job ends and efficiency need slurmdbd",
        ),
        Row("JobAcctGather", gather)
        if gather and gather != "jobacct_gather/none"
        else Row(
            "JobAcctGather",
            gather or "none",
            "warn",
            "no CPU time or memory per step: efficiency shows wall time only",
        ),
        Row("cgroup/proctrack", _plugins(found.config)),
    ]


def _partition_row(part: Partition, found: ClusterProbe) -> Row:
    nodes = found.nodes_of(part.name)
    gpus = sorted({n.gpus for n in nodes})
    types = sorted({t for n in nodes for t in n.gpu_types})
    features = sorted({f for n in nodes for f in n.features})
    cpus = sorted({n.cpus for n in nodes})
    value = (
        f"{part.total_nodes} nodes (max {part.max_nodes or 'all'} a job), "
        f"time {time_text(part.max_time_s)}, QOS {part.qos or 'none'}, "
        f"CPUs/node {'/'.join(map(str, cpus)) or '?'}, "
        f"GPUs/node {'/'.join(map(str, gpus)) or '0'}"
        + (f" ({','.join(types)})" if types else "")
        + f", features {','.join(features) or 'none'}"
        + (" [default]" if part.default else "")
    )
    return Row(f"partition {part.name}", value)


def cluster_rows(found: ClusterProbe) -> list[Row]:
    rows = [
        Row("SLURM version", str(found.version))
        if found.version
        else Row("SLURM version", "unknown", "warn", "sinfo --version printed no version")
    ]
    if not found.controller:
        advice = "check SLURM_CONF and that slurmctld runs; no job can be submitted"
        return [*rows, Row("controller", "not reachable (scontrol ping)", "FAIL", advice)]
    rows.append(Row("controller", "reachable"))
    rows.extend(_service_rows(found))
    rows.extend(_partition_row(part, found) for part in found.partitions)
    rows.append(
        Row("containers", ", ".join(found.containers))
        if found.containers
        else Row("containers", "none found (apptainer, singularity, pyxis)")
    )
    rows.append(Row("MPI types", ", ".join(found.mpi) or "none listed"))
    rows.append(Row("partitions read from", f"scontrol {found.partitions_from} output"))
    return rows


def _seconds(limit: str | None) -> int | None:
    try:
        return time_limit_seconds(limit) if limit else None
    except SpecError:
        return None  # validation names a malformed max_time where a job uses it


def _limit_problems(profile: Profile, part: Partition, nodes: list[Node]) -> list[Problem]:
    """(what, status, advice) for each limit of the profile above the partition's."""
    problems: list[Problem] = []
    limit = _seconds(profile.max_time)
    if limit is not None and part.max_time_s is not None and limit > part.max_time_s:
        allowed = time_text(part.max_time_s)
        problems.append(
            (
                f"max_time {profile.max_time} > partition {part.name}'s {allowed}",
                "FAIL",
                f"set max_time to {allowed} or less",
            )
        )
    if profile.max_nodes and profile.max_nodes > part.total_nodes:
        problems.append(
            (
                f"max_nodes {profile.max_nodes} > the {part.total_nodes} nodes of {part.name}",
                "warn",
                f"set max_nodes to {part.total_nodes}",
            )
        )
    cpus = min((n.cpus for n in nodes), default=0)
    if profile.cores_per_node and cpus and profile.cores_per_node > cpus:
        problems.append(
            (
                f"cores_per_node {profile.cores_per_node} > {cpus} CPUs of {part.name}'s nodes",
                "FAIL",
                f"set cores_per_node to {cpus}",
            )
        )
    gpus = min((n.gpus for n in nodes), default=0)
    if profile.gpus_per_node > gpus:
        problems.append(
            (
                f"gpus_per_node {profile.gpus_per_node} > {gpus} GPUs of {part.name}'s nodes",
                "FAIL",
                f"set gpus_per_node to {gpus}",
            )
        )
    return problems


def _offer_problems(profile: Profile, part: Partition, nodes: list[Node]) -> list[Problem]:
    """GPU types and features the profile names that no node of the partition offers."""
    types = sorted({t for n in nodes for t in n.gpu_types})
    features = sorted({f for n in nodes for f in n.features})
    missing_types = [t for t in profile.gpu_types if t not in types]
    missing_features = [f for f in profile.features if f not in features]
    return [
        *(
            (
                f"GPU type {t!r} not in {part.name}",
                "FAIL",
                f"use one of {', '.join(types) or 'no type (untyped GPUs)'}",
            )
            for t in missing_types
        ),
        *(
            (
                f"feature {f!r} on no node of {part.name}",
                "warn",
                f"nodes offer {', '.join(features) or 'no features'}",
            )
            for f in missing_features
        ),
    ]


def profile_rows(profile: Profile, found: ClusterProbe) -> list[Row]:
    """What in ``profile`` disagrees with the cluster: each a FAIL (a job would be refused
    or never start) or a warn, with its advice."""
    if not found.controller:
        return []
    where = f"profile {profile.name!r} ({profile.source or 'built in'})"
    by_name = {p.name: p for p in found.partitions}
    name = profile.partition
    part = by_name.get(name) if name else found.default_partition()
    if part is None:
        known = ", ".join(by_name) or "none"
        what = f"partition {name!r} does not exist" if name else "the cluster has no partition"
        return [
            Row(
                where,
                what,
                "FAIL",
                f"set partition to one of {known} (hpcdist profile init writes one)",
            )
        ]
    nodes = found.nodes_of(part.name)
    problems = [*_limit_problems(profile, part, nodes), *_offer_problems(profile, part, nodes)]
    rows = [Row(where, what, status, advice) for what, status, advice in problems]
    return rows or [Row(where, f"agrees with the cluster (partition {part.name})")]


def compute_node_row() -> Row:
    """One tiny job: can a task run scontrol (requeue without it uses a fallback)?"""
    argv = ["srun", "-N1", "-n1", "-t", "1", "scontrol", "show", "hostnames", "node0"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Row("scontrol in a job", f"not run: {exc}", "warn", "run the tiny job by hand")
    if proc.returncode == 0 and proc.stdout.strip() == "node0":
        return Row("scontrol in a job", "works")
    return Row(
        "scontrol in a job",
        f"fails ({(proc.stderr or proc.stdout).strip()[:80]})",
        "warn",
        "requeue falls back to requeueing from the login node's view",
    )


def print_rows(rows: list[Row]) -> None:
    width = max(len(r.item) for r in rows)
    for row in rows:
        mark = "" if row.status == "ok" else f"{row.status.upper()}: "
        click.echo(f"{row.item:<{width}}  {mark}{row.value}")
        if row.advice:
            click.echo(f"{'':<{width}}    advice: {row.advice}")


@click.command()
@click.option(
    "--profile",
    "profile_name",
    default=None,
    help=f"Profile to check (default: $HPCDIST_PROFILE, else {DEFAULT_PROFILE}).",
)
@click.option(
    "--job", is_flag=True, help="Also run one tiny job: does scontrol work on a compute node?"
)
def doctor(profile_name: str | None, job: bool) -> int:
    """Probe this cluster's SLURM and check the profile against it."""
    name = profile_name or os.environ.get("HPCDIST_PROFILE") or DEFAULT_PROFILE
    if profile_name is not None and not profile_name.strip():
        raise ProfileError(f"--profile is empty ({profile_name!r}); leave it out or name one")
    profile = load_profile(name)
    found = probe()
    rows = cluster_rows(found)
    if found.controller:
        rows.append(compute_node_row() if job else Row("scontrol in a job", "not tested (--job)"))
    rows.extend(profile_rows(profile, found))
    print_rows(rows)
    blocked = [r for r in rows if r.status == "FAIL"]
    click.echo(f"{len(blocked)} problem(s) block a job" if blocked else "nothing blocks a job")
    sys.exit(1 if blocked else 0)


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def profile_text(name: str, found: ClusterProbe, part: Partition) -> str:
    nodes = found.nodes_of(part.name)
    cpus = min((n.cpus for n in nodes), default=1)
    gpus = min((n.gpus for n in nodes), default=0)
    types = sorted({t for n in nodes for t in n.gpu_types})
    features = sorted({f for n in nodes for f in n.features})
    lines = [
        f"# Written by `hpcdist profile init {name}` from SLURM {found.version or 'unknown'} on "
        f"{datetime.now(timezone.utc):%Y-%m-%d}; edit freely.",
        f'description: "{part.name} partition: {part.total_nodes} nodes x {cpus} CPUs'
        + (f", {gpus} GPUs" if gpus else "")
        + '"',
        f"partition: {part.name}",
        f"partitions: [{', '.join(p.name for p in found.partitions)}]",
        f"max_nodes: {part.max_nodes or part.total_nodes}",
        f"cores_per_node: {cpus}",
        f"gpus_per_node: {gpus}",
        f"gpu_types: [{', '.join(types)}]",
        f"features: [{', '.join(features)}]",
    ]
    if part.max_time_s is not None:
        lines.append(f'max_time: "{time_text(part.max_time_s)}"')
    if part.qos:
        lines.append(f"qos: {part.qos}")
    lines += [
        "defaults:",
        f'  time: "{time_text(min(part.max_time_s or 3600, 3600))}"',
        "env: {}",
        "gloo_env: {}",
        "nccl_env: {}",
        "setup: []",
        "",
    ]
    return "\n".join(lines)


@click.group()
def profile() -> None:
    """Cluster profiles of this user."""


@profile.command("init")
@click.argument("name")
@click.option("--partition", default=None, help="Partition to use (default: the cluster's).")
def profile_init(name: str, partition: str | None) -> int:
    """Write profile NAME from a probe of this cluster (never overwrites one)."""
    if not _NAME.fullmatch(name):
        raise UserError(f"profile name {name!r}; expected letters, digits, '_', '.', '-'")
    stem = name.removesuffix(".yaml")
    if stem in shipped_profiles():
        raise UserError(f"profile name {name!r} is a shipped profile's; choose another name")
    folder = config_dir()
    target = folder / f"{stem}.yaml"
    if target.exists() or (folder / f"{stem}.yml").exists():
        raise UserError(f"profile {name!r} exists ({target}); remove it or choose another name")
    found = probe()
    if not found.controller:
        raise UserError("the SLURM controller does not answer (scontrol ping); check SLURM_CONF")
    by_name = {p.name: p for p in found.partitions}
    part = by_name.get(partition) if partition else found.default_partition()
    if part is None:
        known = ", ".join(by_name) or "none"
        raise UserError(
            f"--partition {partition!r} is not a partition here; expected one of {known}"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = profile_text(stem, found, part)
    try:
        # O_EXCL: a profile made meanwhile is not overwritten either.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UserError(
            f"profile {name!r} exists ({target}); remove it or choose another name"
        ) from None
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    click.echo(f"wrote {target}", err=True)
    click.echo(f"use it: hpcdist render --profile {stem} ...", err=True)
    return 0
