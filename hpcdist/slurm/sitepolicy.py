"""What in a site's policies stops a job in a partition before it starts: no default partition,
a partition that does not exist or does not run jobs, a QOS or account the partition does not
allow, no association where the site enforces them.

Pure: ``blockers(probe, partition)`` reads a ``ClusterProbe`` and names each blocker with one
line a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcdist.slurm.accounts import UserAssociations
from hpcdist.slurm.probe import ClusterProbe, Partition

# AccountingStorageEnforce words that make slurmctld refuse a user without an association
# (limits, qos, safe and wckeys each imply associations).
ASSOCIATION_WORDS = frozenset({"associations", "limits", "qos", "safe", "wckeys", "all"})


@dataclass(frozen=True)
class Blocker:
    what: str  # what stops the job, one plain line
    fix: str  # what the user can do about it, one plain line


def _up_others(found: ClusterProbe, name: str | None) -> list[str]:
    return [p.name for p in found.partitions if p.state == "UP" and p.name != name]


def _choose(names: list[str]) -> str:
    return (
        f"--partition {names[0]}" if len(names) == 1 else f"--partition one of {', '.join(names)}"
    )


def _partition_blockers(
    found: ClusterProbe, name: str | None
) -> tuple[Partition | None, list[Blocker]]:
    """The partition a job goes to, or why there is none that runs it."""
    up = _up_others(found, None)
    if name is None:
        if any(p.default is None for p in found.partitions):
            return None, []  # the output did not say which is the default: nothing to tell
        part = next((p for p in found.partitions if p.default), None)
        if part is None:
            fix = _choose(up) if up else "ask the site admins which partition to use"
            return None, [Blocker("the cluster has no default partition and none was given", fix)]
    else:
        part = next((p for p in found.partitions if p.name == name), None)
        if part is None:
            known = [p.name for p in found.partitions]
            fix = _choose(known) if known else "ask the site admins which partition to use"
            return None, [Blocker(f"partition {name!r} does not exist", fix)]
    if part.state != "UP":
        others = _up_others(found, part.name)
        runs = "jobs wait there and none starts" if part.state == "DOWN" else "it takes no jobs"
        fix = _choose(others) if others else f"ask the site admins when {part.name} is back up"
        return part, [Blocker(f"partition {part.name} is {part.state}: {runs}", fix)]
    return part, []


def _qos_blockers(part: Partition, user: UserAssociations) -> list[Blocker]:
    if not part.allow_qos or user.default_qos in part.allow_qos:
        return []
    usable = [q for q in part.allow_qos if q in user.qos]
    allowed = ", ".join(part.allow_qos)
    what = (
        f"partition {part.name} allows QOS {allowed} only; "
        f"your jobs get QOS {user.default_qos or 'none'} by default"
    )
    fix = f"--qos {usable[0]}" if usable else f"ask the site admins for QOS {allowed}"
    return [Blocker(what, fix)]


def _account_blockers(part: Partition, user: UserAssociations) -> list[Blocker]:
    if not part.allow_accounts or user.default_account in part.allow_accounts:
        return []
    usable = [a for a in part.allow_accounts if a in user.accounts]
    allowed = ", ".join(part.allow_accounts)
    if usable:
        what = (
            f"partition {part.name} allows accounts {allowed} only; "
            f"your default account is {user.default_account}"
        )
        return [Blocker(what, f"--account {usable[0]}")]
    mine = ", ".join(user.accounts) or "none"
    what = f"partition {part.name} allows accounts {allowed} only; yours are {mine}"
    return [Blocker(what, f"ask the site admins for an account in {allowed}")]


def blockers(found: ClusterProbe, partition: str | None) -> list[Blocker]:
    """What stops a job in ``partition`` (None: the cluster's default) from starting, as far
    as the probe tells: each blocker once, with its fix."""
    if not found.controller:
        return [Blocker("the SLURM controller does not answer", "check SLURM_CONF and slurmctld")]
    part, out = _partition_blockers(found, partition)
    user = found.user
    if user is not None and not user.accounts and ASSOCIATION_WORDS & set(found.enforce):
        where = f" on cluster {found.cluster_name}" if found.cluster_name else ""
        out.append(
            Blocker(
                f"user {user.user or '?'} has no account{where}, and the site requires one",
                "ask the site admins for an account",
            )
        )
    elif user is not None and part is not None:
        out += _qos_blockers(part, user) + _account_blockers(part, user)
    return out
