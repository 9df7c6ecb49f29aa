"""The user's associations and the blockers of a site's policies, on what the 22.05 testbed
printed (tests/fixtures/slurm_sites/: partitions made with `scontrol create`, QOS `high` and
account `proj` added with sacctmgr, AccountingStorageEnforce set in slurm.conf)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcdist.slurm.accounts import UserAssociations, associations_from_sacctmgr
from hpcdist.slurm.probe import ClusterProbe, partitions_from_text
from hpcdist.slurm.sitepolicy import Blocker, blockers
from tests.slurm.sites import site_probe, site_text, site_user

PLAIN = site_probe("plain")
# Associations enforced; root's default account proj may use QOS normal (default) and high.
SITE = site_probe("sites")


def test_associations_of_the_plain_testbed() -> None:
    assert site_user("plain") == UserAssociations(("root",), "root", ("normal",), "normal", "root")


def test_associations_of_a_user_with_two_accounts_and_two_qos() -> None:
    assert site_user("sites") == UserAssociations(
        ("proj", "root"), "proj", ("high", "normal"), "normal", "root"
    )


def test_a_user_without_association_has_no_account() -> None:
    assert site_user("noassoc", "nobody") == UserAssociations((), None, (), None, "nobody")


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ("c|a||high|high\n", "high"),  # DefaultQOS set
        ("c|a||long|\n", "long"),  # one QOS: that one
        ("c|a||high,long|\n", "normal"),  # several, no default: slurmctld's `normal`
        ("c|a|gpu|long|long\nc|a||high|\n", "high"),  # the account's, not a partition's
    ],
)
def test_default_qos_is_the_one_slurm_gives(rows: str, expected: str) -> None:
    assert associations_from_sacctmgr(rows, "a\n", "u", "c").default_qos == expected


def test_rows_of_another_cluster_are_left_out() -> None:
    rows = "other|x||high|\nc|a||normal|\n"
    found = associations_from_sacctmgr(rows, "a\n", "u", "c")
    assert (found.accounts, found.qos) == (("a",), ("normal",))


@pytest.mark.parametrize("partition", [None, "debug"])
def test_nothing_blocks_a_job_on_the_plain_testbed(partition: str | None) -> None:
    assert blockers(PLAIN, partition) == []


@pytest.mark.parametrize("partition", [None, "debug", "batch", "short"])
def test_nothing_blocks_an_up_partition_that_allows_everyone(partition: str | None) -> None:
    assert blockers(SITE, partition) == []


def test_no_default_partition_and_none_given() -> None:
    found = replace(
        SITE, partitions=tuple(partitions_from_text(site_text("nodefault-scontrol-partition.txt")))
    )
    assert blockers(found, None) == [
        Blocker(
            "the cluster has no default partition and none was given",
            "--partition one of debug, prio",
        )
    ]
    assert blockers(found, "debug") == []


def test_a_partition_that_does_not_exist() -> None:
    assert blockers(SITE, "gpu") == [
        Blocker(
            "partition 'gpu' does not exist",
            "--partition one of debug, batch, short, maint, prio, acct, old",
        )
    ]


@pytest.mark.parametrize(
    ("partition", "what"),
    [
        ("maint", "partition maint is DOWN: jobs wait there and none starts"),
        ("acct", "partition acct is DRAIN: it takes no jobs"),
        ("old", "partition old is INACTIVE: it takes no jobs"),
    ],
)
def test_a_partition_that_runs_no_job(partition: str, what: str) -> None:
    assert blockers(SITE, partition) == [
        Blocker(what, "--partition one of debug, batch, short, prio")
    ]


def test_a_down_partition_with_no_other_says_to_ask() -> None:
    (maint,) = [p for p in SITE.partitions if p.name == "maint"]
    (blocker,) = blockers(replace(SITE, partitions=(maint,)), "maint")
    assert blocker.fix == "ask the site admins when maint is back up"


def test_a_partition_that_allows_a_qos_the_user_may_use() -> None:
    assert blockers(SITE, "prio") == [
        Blocker(
            "partition prio allows QOS high only; your jobs get QOS normal by default",
            "--qos high",
        )
    ]
    high = replace(SITE, user=replace(SITE.user, default_qos="high"))
    assert blockers(high, "prio") == []


def test_a_partition_that_allows_a_qos_the_user_may_not_use() -> None:
    assert blockers(PLAIN, "prio") == [
        Blocker("partition 'prio' does not exist", "--partition debug")
    ]
    found = replace(PLAIN, partitions=SITE.partitions)
    assert blockers(found, "prio") == [
        Blocker(
            "partition prio allows QOS high only; your jobs get QOS normal by default",
            "ask the site admins for QOS high",
        )
    ]


def test_without_accounting_no_qos_or_account_is_checked() -> None:
    assert blockers(replace(SITE, user=None), "prio") == []


def test_associations_enforced_and_the_user_has_none() -> None:
    nobody = replace(SITE, user=site_user("noassoc", "nobody"))
    expected = Blocker(
        "user nobody has no account on cluster hpcdist, and the site requires one",
        "ask the site admins for an account",
    )
    assert blockers(nobody, None) == [expected]
    assert blockers(replace(nobody, enforce=("qos",)), "batch") == [expected]
    # Not enforced: such a user's jobs run (under no account).
    assert blockers(replace(nobody, enforce=()), None) == []


def test_a_partition_that_allows_another_account_of_thesite_user() -> None:
    (acct,) = [replace(p, state="UP") for p in SITE.partitions if p.name == "acct"]
    found = replace(SITE, partitions=(acct,), user=replace(SITE.user, default_account="root"))
    assert blockers(found, "acct") == [
        Blocker(
            "partition acct allows accounts proj only; your default account is root",
            "--account proj",
        )
    ]
    assert blockers(replace(found, user=SITE.user), "acct") == []


def test_a_partition_that_allows_no_account_of_thesite_user() -> None:
    (acct,) = [replace(p, state="UP") for p in SITE.partitions if p.name == "acct"]
    found = replace(PLAIN, partitions=(acct,))
    assert blockers(found, "acct") == [
        Blocker(
            "partition acct allows accounts proj only; yours are root",
            "ask the site admins for an account in proj",
        )
    ]


def test_a_silent_controller_is_the_one_blocker() -> None:
    found = ClusterProbe(version=None, controller=False, accounting=False)
    assert blockers(found, None) == [
        Blocker("the SLURM controller does not answer", "check SLURM_CONF and slurmctld")
    ]
