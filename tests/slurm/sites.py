"""Probes built from what the 22.05 testbed printed (tests/fixtures/slurm_sites/): the plain
testbed, and one with site policies set by hand (partitions made with `scontrol create`: debug
the default, batch with a DefaultTime, short of 5 minutes, maint DOWN, prio for QOS high, acct
DRAIN for account proj, old INACTIVE; QOS high and account proj added with sacctmgr, root's
default account proj; slurm.conf's JobRequeue=0, MaxArraySize=100,
AccountingStorageEnforce=associations,limits,qos, preempt/partition_prio in REQUEUE mode;
node4 with the feature gpu)."""

from __future__ import annotations

from pathlib import Path

from hpcdist.slurm.accounts import UserAssociations, associations_from_sacctmgr
from hpcdist.slurm.probe import (
    ClusterProbe,
    config_values,
    nodes_from_sinfo,
    parse_version,
    partitions_from_text,
    with_config,
)

SITES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_sites"
VERSION = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_versions" / "22.05"


def site_text(name: str) -> str:
    return (SITES / name).read_text()


def site_user(kind: str, user: str = "root") -> UserAssociations:
    """``plain``, ``sites`` (root with two accounts and QOS) or ``noassoc`` (no association)."""
    assoc = site_text(f"{kind}-sacctmgr-assoc.txt")
    default = site_text(f"{kind}-sacctmgr-user.txt") if kind != "noassoc" else ""
    return associations_from_sacctmgr(assoc, default, user, "hpcdist")


def site_probe(kind: str, partitions: str | None = None) -> ClusterProbe:
    """The probe of the ``plain`` or ``sites`` testbed (partitions: another capture's)."""
    found = ClusterProbe(
        version=parse_version((VERSION / "sinfo-version.txt").read_text()),
        controller=True,
        accounting=True,
        partitions=tuple(
            partitions_from_text(site_text(partitions or f"{kind}-scontrol-partition.txt"))
        ),
        nodes=tuple(nodes_from_sinfo(site_text(f"{kind}-sinfo-nodes.txt"))),
        user=site_user(kind),
    )
    return with_config(found, config_values(site_text(f"{kind}-scontrol-config.txt")))
