"""The table of ``hpcdist doctor``: what the cluster offers (the probe of hpcdist.slurm.probe),
its site's settings and the user's accounts, what in its policies stops a job
(hpcdist.slurm.sitepolicy), and what in a profile disagrees with it; each problem a row
marked FAIL (a job would be refused or never start) or warn, with one line of advice.

Pure but for ``compute_node_row`` (one tiny job) and ``print_rows``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import click

from hpcdist.errors import SpecError
from hpcdist.slurm.accounts import UserAssociations
from hpcdist.slurm.probe import ClusterProbe, Node, Partition, time_text
from hpcdist.slurm.probefacts import probe_facts
from hpcdist.slurm.sitepolicy import blockers
from hpcdist.slurm.timelimit import time_limit_seconds
from hpcdist.spec.profiles import Profile

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
    if found.partitions_from == "rest":  # slurmrestd serves no configuration
        return [
            Row("accounting", "slurmrestd serves slurmdbd's paths")
            if found.accounting
            else Row(
                "accounting",
                "slurmrestd serves no slurmdbd paths",
                "warn",
                "status after a job ends and efficiency need slurmdbd behind the daemon",
            ),
            Row("JobAcctGather", "not reported (slurmrestd serves no configuration)"),
        ]
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


def _layout(nodes: list[Node]) -> str:
    """``(2 sockets x 8 cores x 2 threads)`` where every node of the list has one layout."""
    layouts = {(n.sockets, n.cores_per_socket, n.threads_per_core) for n in nodes}
    if len(layouts) != 1 or 0 in next(iter(layouts)):
        return ""
    sockets, cores, threads = layouts.pop()
    return f" ({sockets} sockets x {cores} cores x {threads} threads)"


def _policy_text(part: Partition) -> str:
    """The partition's state and policies, where they are not SLURM's defaults."""
    words = [f"state {part.state}"] if part.state != "UP" else []
    if part.default_time_s is not None:
        words.append(f"default time {time_text(part.default_time_s)}")
    if part.allow_qos:
        words.append(f"QOS allowed {','.join(part.allow_qos)}")
    if part.allow_accounts:
        words.append(f"accounts allowed {','.join(part.allow_accounts)}")
    return "".join(f", {w}" for w in words)


def _partition_row(part: Partition, found: ClusterProbe) -> Row:
    nodes = found.nodes_of(part.name)
    gpus = sorted({n.gpus for n in nodes})
    types = sorted({t for n in nodes for t in n.gpu_types})
    features = sorted({f for n in nodes for f in n.features})
    cpus = sorted({n.cpus for n in nodes})
    value = (
        f"{part.total_nodes} nodes (max {part.max_nodes or 'all'} a job), "
        f"time {time_text(part.max_time_s)}{_policy_text(part)}, QOS {part.qos or 'none'}, "
        f"CPUs/node {'/'.join(map(str, cpus)) or '?'}{_layout(nodes)}, "
        f"GPUs/node {'/'.join(map(str, gpus)) or '0'}"
        + (f" ({','.join(types)})" if types else "")
        + f", features {','.join(features) or 'none'}"
        + (" [default]" if part.default else "")
    )
    return Row(f"partition {part.name}", value)


def _gpu_row(found: ClusterProbe) -> Row:
    """GPUs as GRES (what --gpus-per-node asks for), else nodes that only a feature marks."""
    with_gres = [n for n in found.nodes if n.gpus]
    if with_gres:
        count = sum(n.gpus for n in with_gres)
        return Row("GPUs", f"{count} on {len(with_gres)} node(s), as GRES (--gpus-per-node)")
    tagged = sorted({f for n in found.nodes for f in n.features if "gpu" in f.lower()})
    if not tagged:
        return Row("GPUs", "none (no GPU GRES, no node feature names a GPU)")
    hosts = [n.name for n in found.nodes if set(n.features) & set(tagged)]
    return Row(
        "GPUs",
        f"no GPU GRES; feature {','.join(tagged)} on {len(hosts)} node(s) ({hosts[0]}"
        + (", ..." if len(hosts) > 1 else "")
        + f"): GPUs only through --constraint {tagged[0]}",
    )


def _requeue_text(requeue: bool | None) -> str:
    if requeue is None:
        return "JobRequeue not reported"
    if requeue:
        return "JobRequeue=1: a job may be requeued unless it says --no-requeue"
    return "JobRequeue=0: a job is requeued only if it asks (hpcdist's jobs say --requeue)"


def _user_rows(user: UserAssociations | None) -> list[Row]:
    if user is None:
        return [Row("your accounts", "not known (no slurmdbd to ask)")]
    accounts = ", ".join(user.accounts)
    qos = ", ".join(user.qos)
    return [
        Row(
            "your accounts",
            f"{accounts} (default {user.default_account})" if accounts else "none",
        ),
        Row("your QOS", f"{qos} (default {user.default_qos})" if qos else "none"),
    ]


def site_rows(found: ClusterProbe) -> list[Row]:
    """The site's settings a job meets: preemption, arrays, requeue, cgroups, what accounting
    enforces, and the user's accounts and QOS."""
    preempt = found.preempt_type or "not reported"
    size = found.max_array_size
    return [
        Row(
            "preemption",
            "none (preempt/none)"
            if preempt == "preempt/none"
            else f"{preempt}, mode {found.preempt_mode or '?'}",
        ),
        Row("MaxArraySize", f"{size} (array task ids 0-{size - 1})" if size else "not reported"),
        Row("requeue", _requeue_text(found.job_requeue)),
        Row("cgroup version", found.cgroup_version or "not known"),
        Row("accounting enforces", ", ".join(found.enforce) or "nothing"),
        *_user_rows(found.user),
    ]


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
    host = f"controller host {found.controller_host or 'not reported'}"
    rows.append(Row("cluster", f"{found.cluster_name or 'not named'}, {host}"))
    rows.extend(_service_rows(found))
    rows.extend(site_rows(found))
    rows.extend(_partition_row(part, found) for part in found.partitions)
    rows.append(_gpu_row(found))
    rows.append(
        Row("containers", ", ".join(found.containers))
        if found.containers
        else Row("containers", "none found (apptainer, singularity, pyxis)")
    )
    rows.append(Row("MPI types", ", ".join(found.mpi) or "none listed"))
    source = {"rest": "slurmrestd's answer"}.get(found.partitions_from)
    rows.append(Row("partitions read from", source or f"scontrol {found.partitions_from} output"))
    return rows


def blocker_rows(found: ClusterProbe, partition: str | None) -> list[Row]:
    """What in the site's policies stops a job in ``partition`` (None: the default one)."""
    item = f"a job in {partition}" if partition else "a job with no --partition"
    return [Row(item, b.what, "FAIL", b.fix) for b in blockers(found, partition)]


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


def verdict(rows: list[Row]) -> tuple[str, int]:
    """The summary line and exit status: 1 if a row FAILs, 3 if one warns, else 0."""
    blocked = sum(r.status == "FAIL" for r in rows)
    warned = sum(r.status == "warn" for r in rows)
    if blocked:
        return f"{blocked} problem(s) block a job", 1
    if warned:
        return f"nothing blocks a job; {warned} warning(s)", 3
    return "nothing blocks a job", 0


def doctor_json(
    found: ClusterProbe, rows: list[Row], profile: str | None, partition: str | None
) -> dict[str, Any]:
    """What ``doctor --json`` prints: the probe's facts, the table, its problems, the verdict."""
    summary, status = verdict(rows)
    return {
        "cluster": probe_facts(found),
        "profile": profile,
        "partition": partition,
        "rows": [asdict(r) for r in rows],
        "problems": [
            {"item": r.item, "status": r.status, "what": r.value, "fix": r.advice}
            for r in rows
            if r.status != "ok"
        ],
        "summary": summary,
        "exit_status": status,
    }
