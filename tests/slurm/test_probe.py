"""The cluster probe's parsers, on what SLURM 22.05, 24.11 and 26.05 printed on the testbed
(tests/fixtures/slurm_versions/<version>/) and on hand-made lines for what the testbed lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdist.slurm.probe import (
    ClusterProbe,
    Partition,
    SlurmVersion,
    config_values,
    mpi_types,
    nodes_from_sinfo,
    parse_version,
    partitions_from_json,
    partitions_from_text,
    time_text,
    tres_gpus,
    with_config,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_versions"
TESTBED_DEBUG = Partition("debug", "node[1-4]", 4, None, None, None, True)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("22.05", SlurmVersion(22, 5, 8)),
        ("24.11", SlurmVersion(24, 11, 5)),
        ("26.05", SlurmVersion(26, 5, 5)),
    ],
)
def test_version_is_read_from_what_sinfo_printed(version: str, expected: SlurmVersion) -> None:
    text = (FIXTURES / version / "sinfo-version.txt").read_text()
    assert parse_version(text) == expected
    assert str(expected) == text.split()[-1]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("slurm 23.02.7\n", SlurmVersion(23, 2, 7)),
        ("slurm 25.05.0-0rc1", SlurmVersion(25, 5, 0)),
        ("slurm 24.11", SlurmVersion(24, 11, 0)),
        ("no version here", None),
    ],
)
def test_version_forms(text: str, expected: SlurmVersion | None) -> None:
    assert parse_version(text) == expected


def test_versions_order_and_json_threshold() -> None:
    assert SlurmVersion(22, 5, 8) < SlurmVersion(24, 11, 5) < SlurmVersion(26, 5, 5)
    assert not SlurmVersion(22, 5, 8).at_least(23, 2)
    assert SlurmVersion(23, 2, 0).at_least(23, 2)
    assert SlurmVersion(24, 11, 5).at_least(23, 2)


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_text_partitions_of_every_version(version: str) -> None:
    text = (FIXTURES / version / "scontrol-partition.txt").read_text()
    assert partitions_from_text(text) == [TESTBED_DEBUG]


def test_json_partitions_of_26_05_say_which_is_the_default() -> None:
    text = (FIXTURES / "26.05" / "scontrol-partition.json").read_text()
    assert partitions_from_json(text) == [TESTBED_DEBUG]


def test_json_partitions_of_24_11_do_not_say_which_is_the_default() -> None:
    # 24.11's scontrol --json has no "flags": the probe takes Default= from the text output.
    text = (FIXTURES / "24.11" / "scontrol-partition.json").read_text()
    (found,) = partitions_from_json(text)
    assert found.default is None
    assert found == Partition("debug", "node[1-4]", 4, None, None, None, None)


def test_json_limits_in_minutes_become_seconds() -> None:
    raw = json.loads((FIXTURES / "26.05" / "scontrol-partition.json").read_text())
    part = raw["partitions"][0]
    part["maximums"]["time"] = {"set": True, "infinite": False, "number": 90}
    part["maximums"]["nodes"] = {"set": True, "infinite": False, "number": 2}
    part["qos"]["assigned"] = "normal"
    (found,) = partitions_from_json(json.dumps(raw))
    assert (found.max_time_s, found.max_nodes, found.qos) == (5400, 2, "normal")


def test_json_that_is_not_a_partition_list_raises() -> None:
    with pytest.raises((ValueError, KeyError)):
        partitions_from_json('{"errors": []}')


def test_text_limits() -> None:
    line = (
        "PartitionName=gpu Default=NO QoS=gpuq MaxNodes=8 MaxTime=2-00:00:00 Nodes=g[01-16] "
        "TotalNodes=16\nPartitionName=short MaxTime=30 Nodes=c1 TotalNodes=1 MaxNodes=1\n"
    )
    assert partitions_from_text(line) == [
        Partition("gpu", "g[01-16]", 16, 172800, 8, "gpuq", False),
        Partition("short", "c1", 1, 1800, 1, None, False),
    ]


def test_nodes_merge_partitions_and_read_typed_gpus() -> None:
    text = (
        "g01|gpu*|64|gpu:h100:4(S:0-1)|ib,nvlink|512000\n"
        "g01|debug|64|gpu:h100:4(S:0-1)|ib,nvlink|512000\n"
        "c01|cpu|40|(null)|(null)|192000\n"
        "m01|mixed|32|gpu:a100:2,gpu:v100:2|a|1000\n"
    )
    g01, c01, m01 = nodes_from_sinfo(text)
    assert (g01.partitions, g01.cpus, g01.gpus, g01.gpu_types) == (
        ("gpu", "debug"),
        64,
        4,
        ("h100",),
    )
    assert g01.features == ("ib", "nvlink")
    assert (c01.gpus, c01.gpu_types, c01.features, c01.memory_mb) == (0, (), (), 192000)
    assert (m01.gpus, m01.gpu_types) == (4, ("a100", "v100"))


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("22.05", ("pmix", "none", "cray_shasta", "pmi2")),
        ("24.11", ("none", "pmix", "cray_shasta", "pmi2")),
        ("26.05", ("none", "cray_shasta", "pmi2")),
    ],
)
def test_mpi_types_of_every_version(version: str, expected: tuple[str, ...]) -> None:
    assert mpi_types((FIXTURES / version / "srun-mpi-list.txt").read_text()) == expected


@pytest.mark.parametrize(
    ("version", "task_plugin"),
    [("22.05", "task/none"), ("24.11", "(null)"), ("26.05", "(null)")],
)
def test_config_values_of_every_version(version: str, task_plugin: str) -> None:
    config = config_values((FIXTURES / version / "scontrol-config.txt").read_text())
    assert config["JobAcctGatherType"] == "jobacct_gather/linux"
    assert config["ProctrackType"] == "proctrack/linuxproc"
    # 24.11 and later print task/none as "(null)".
    assert config["TaskPlugin"] == task_plugin


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "unlimited"),
        (59, "00:00:59"),
        (3600, "01:00:00"),
        (86399, "23:59:59"),
        (86400, "1-00:00:00"),
        (172800 + 61, "2-00:01:01"),
    ],
)
def test_time_text(seconds: int | None, text: str) -> None:
    assert time_text(seconds) == text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gres:gpu:tesla:2", ("tesla", 2)),  # 22.05
        ("gres/gpu:tesla:2", ("tesla", 2)),  # 23.02 and later
        ("gres/gpu:4", (None, 4)),
        ("gres:gpu:4", (None, 4)),
        ("gres/gpu", (None, 1)),
        ("gres/shard:2,gres/gpu:h100:8", ("h100", 8)),
        ("gres/gpumem:4G", (None, 0)),
        ("", (None, 0)),
        ("(null)", (None, 0)),
    ],
)
def test_tres_gpus_reads_both_spellings(value: str, expected: tuple[str | None, int]) -> None:
    assert tres_gpus(value) == expected


# What the 22.05 testbed printed with site policies set by hand (tests/fixtures/slurm_sites/):
# partitions made with `scontrol create`, `sacctmgr add` of QOS `high` and account `proj`,
# and slurm.conf's JobRequeue=0, MaxArraySize=100, AccountingStorageEnforce and preemption.
SITES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_sites"


def _site(name: str) -> str:
    return (SITES / name).read_text()


def test_text_partitions_read_state_default_time_and_allow_lists() -> None:
    found = {p.name: p for p in partitions_from_text(_site("sites-scontrol-partition.txt"))}
    assert list(found) == ["debug", "batch", "short", "maint", "prio", "acct", "old"]
    assert {n: p.state for n, p in found.items()} == {
        "debug": "UP",
        "batch": "UP",
        "short": "UP",
        "maint": "DOWN",
        "prio": "UP",
        "acct": "DRAIN",
        "old": "INACTIVE",
    }
    assert (found["batch"].default_time_s, found["batch"].max_time_s) == (1800, 86400)
    assert (found["short"].default_time_s, found["short"].max_time_s) == (None, 300)
    assert (found["prio"].allow_qos, found["prio"].allow_accounts) == (("high",), ())
    assert (found["acct"].allow_qos, found["acct"].allow_accounts) == ((), ("proj",))
    assert (found["debug"].allow_qos, found["debug"].allow_accounts) == ((), ())
    assert [p.name for p in found.values() if p.default] == ["debug"]


def test_text_partitions_without_a_default() -> None:
    parts = partitions_from_text(_site("nodefault-scontrol-partition.txt"))
    assert [(p.name, p.default, p.allow_qos) for p in parts] == [
        ("debug", False, ()),
        ("prio", False, ("high",)),
    ]


def test_json_partitions_read_state_default_time_and_allow_lists() -> None:
    # The 26.05 testbed's real answer, with the fields set as `scontrol create` would.
    raw = json.loads((FIXTURES / "26.05" / "scontrol-partition.json").read_text())
    part = raw["partitions"][0]
    part["partition"]["state"] = ["DOWN"]
    part["defaults"]["time"] = {"set": True, "infinite": False, "number": 30}
    part["qos"]["allowed"] = "high,normal"
    part["accounts"]["allowed"] = "proj"
    (found,) = partitions_from_json(json.dumps(raw))
    assert (found.state, found.default_time_s) == ("DOWN", 1800)
    assert (found.allow_qos, found.allow_accounts) == (("high", "normal"), ("proj",))


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_json_partitions_of_the_plain_testbed_allow_everything(version: str) -> None:
    text = (FIXTURES / version / "scontrol-partition.json").read_text()
    (found,) = partitions_from_json(text)
    assert (found.state, found.default_time_s, found.allow_qos, found.allow_accounts) == (
        "UP",
        None,
        (),
        (),
    )


def test_nodes_read_layout_state_and_features_from_sinfo() -> None:
    nodes = nodes_from_sinfo(_site("sites-sinfo-nodes.txt"))
    assert [n.name for n in nodes] == ["node1", "node2", "node3", "node4"]
    node1, _, node3, node4 = nodes
    assert node1.partitions == ("debug", "batch", "short", "prio", "maint", "acct")
    assert node3.partitions[-1] == "old"
    assert (node1.sockets, node1.cores_per_socket, node1.threads_per_core) == (2, 1, 1)
    assert (node1.cpus, node1.memory_mb, node1.state) == (2, 2000, "idle")
    assert (node1.features, node4.features) == (("testbed",), ("testbed", "gpu"))


def test_site_settings_of_the_plain_testbed() -> None:
    config = config_values(_site("plain-scontrol-config.txt"))
    found = with_config(ClusterProbe(None, True, True), config, "")
    assert (found.cluster_name, found.controller_host) == ("hpcdist", "vm")
    assert (found.max_array_size, found.job_requeue) == (1001, True)
    assert (found.preempt_type, found.preempt_mode, found.enforce) == ("preempt/none", "OFF", ())
    assert found.cgroup_version is None and found.config == config


def test_site_settings_of_a_site_with_policies() -> None:
    found = with_config(
        ClusterProbe(None, True, True), config_values(_site("sites-scontrol-config.txt"))
    )
    assert (found.max_array_size, found.job_requeue) == (100, False)
    assert (found.preempt_type, found.preempt_mode) == ("preempt/partition_prio", "REQUEUE")
    assert found.enforce == ("associations", "limits", "qos")


# This host's /proc/self/mounts (a hybrid: v1 controllers, a v2 tree at .../unified).
HYBRID = (
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n"
    "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n"
)


@pytest.mark.parametrize(
    ("plugin", "mounts", "expected"),
    [
        (None, HYBRID, "v1"),
        (None, "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n", "v2"),
        (None, "proc /proc proc rw 0 0\n", None),
        ("cgroup/v2", HYBRID, "v2"),  # the config's plugin wins over the login node's mount
        ("cgroup/v1", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", "v1"),
        ("autodetect", "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", "v2"),
    ],
)
def test_cgroup_version(plugin: str | None, mounts: str, expected: str | None) -> None:
    # 22.05 prints no CgroupPlugin line, even with a cgroup.conf; later versions print it
    # under "Cgroup Support Configuration", as `CgroupPlugin = cgroup/v2`.
    config = config_values(_site("plain-scontrol-config.txt"))
    if plugin:
        config["CgroupPlugin"] = plugin
    assert with_config(ClusterProbe(None, True, True), config, mounts).cgroup_version == expected
