"""The configuration text scripts/slurm-testbed writes for each shape of site: network
namespaces, a management network, a declared node layout, a strict site; and the default
testbed's text unchanged by them. Pure functions of the settings: no cluster is started."""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(
        "slurm_testbed", str(REPO / "scripts/slurm-testbed")
    )
    spec = importlib.util.spec_from_loader("slurm_testbed", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("slurm_testbed", module)  # its dataclasses look themselves up there
    loader.exec_module(module)
    return module


tb = _load()


def settings(**env: str) -> Any:
    return tb.Settings.from_environ({f"HPCDIST_TESTBED_{k}": v for k, v in env.items()})


def conf(**env: str) -> str:
    testbed = tb.Testbed(tb.Paths.under(Path("/tmp/tb")), settings(**env))
    return tb.slurm_conf_text(testbed, 1000)


def lines(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(start)]


def node_rows(text: str) -> list[str]:
    """NodeName entries, each joined with its continuation line."""
    joined = text.replace("\\\n", " ").splitlines()
    return [" ".join(entry.split()) for entry in joined if entry.startswith("NodeName=")]


def refusal(**env: str) -> str:
    with pytest.raises(tb.TestbedError) as caught:
        settings(**env)
    return str(caught.value)


# ---------------------------------------------------------------- the default, as before


def test_the_default_testbed_keeps_its_one_node_line_one_partition_and_loopback() -> None:
    text = conf()
    assert lines(text, "SlurmctldHost=") == ["SlurmctldHost=localhost(127.0.0.1)"]
    assert lines(text, "AccountingStorageHost=") == ["AccountingStorageHost=127.0.0.1"]
    assert node_rows(text) == [
        "NodeName=node[1-4] NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=2 RealMemory=2000 "
        "Features=testbed State=UNKNOWN"
    ]
    assert lines(text, "PartitionName=") == [
        "PartitionName=debug Nodes=node[1-4] Default=YES MaxTime=INFINITE State=UP"
    ]
    assert lines(text, "JobRequeue=") == ["JobRequeue=1"]
    assert lines(text, "MaxArraySize=") == ["MaxArraySize=1001"]
    assert "AccountingStorageEnforce" not in text and "EnforcePartLimits" not in text


def test_the_default_hosts_file_names_every_node_at_loopback() -> None:
    assert tb.hosts_text(settings()).splitlines()[-1] == (
        "127.0.0.1 node1 node2 node3 node4 # hpcdist-testbed"
    )


# ---------------------------------------------------------------- network namespaces


def test_namespaced_nodes_have_their_own_addresses_and_the_controller_the_bridges() -> None:
    text = conf(NETNS="1", PORT_OFFSET="2500")
    assert lines(text, "SlurmctldHost=") == ["SlurmctldHost=localhost(10.137.196.1)"]
    # sacct runs inside jobs, in the nodes' namespaces: slurmdbd is reached at the bridge too.
    assert lines(text, "AccountingStorageHost=") == ["AccountingStorageHost=10.137.196.1"]
    assert node_rows(text) == [
        f"NodeName=node{k} NodeAddr=10.137.196.{10 + k} Port={19500 + k} CPUs=2 "
        "RealMemory=2000 Features=testbed State=UNKNOWN"
        for k in range(1, 5)
    ]


def test_namespaced_hosts_file_names_each_node_at_its_own_address() -> None:
    hosts = tb.hosts_text(settings(NETNS="1", PORT_OFFSET="2700", NODES="2"))
    assert hosts.splitlines()[-2:] == [
        "10.138.140.11 node1 # hpcdist-testbed",
        "10.138.140.12 node2 # hpcdist-testbed",
    ]


@pytest.mark.parametrize(
    ("offset", "subnet"),
    [("0", "10.128.0"), ("255", "10.128.255"), ("256", "10.129.0"), ("10000", "10.167.16")],
)
def test_the_subnet_follows_the_port_offset(offset: str, subnet: str) -> None:
    cfg = settings(NETNS="1", MGMT="1", PORT_OFFSET=offset)
    assert cfg.ctld_address == f"{subnet}.1"
    assert cfg.node_nets[0].address == f"{subnet}.11"
    first, second, third = subnet.split(".")
    assert cfg.node_nets[0].mgmt_address == f"{first}.{int(second) + 64}.{third}.11"


def test_no_two_offsets_share_a_subnet_and_no_management_address_is_a_data_address() -> None:
    data, mgmt = set(), set()
    for offset in range(10_001):
        cfg = settings(NETNS="1", MGMT="1", PORT_OFFSET=str(offset))
        data.add(cfg.subnet(128))
        mgmt.add(cfg.subnet(192))
    assert len(data) == len(mgmt) == 10_001
    assert not data & mgmt


def test_interface_names_fit_linux_limit_at_the_largest_offset_and_node_count() -> None:
    cfg = settings(NETNS="1", MGMT="1", PORT_OFFSET="10000", NODES="64")
    names = [cfg.bridge, *(e for n in cfg.node_nets for e in (n.host_end, n.mgmt_end))]
    assert max(map(len, names)) <= 15, names
    assert len(set(names)) == len(names)
    assert cfg.node_nets[-1].namespace == "hd10000-node64"


def test_without_management_no_management_link_is_made() -> None:
    net = settings(NETNS="1").node_nets[0]
    assert (net.mgmt_end, net.mgmt_address) == ("", "")


def test_a_management_network_needs_namespaces() -> None:
    assert refusal(MGMT="1") == "HPCDIST_TESTBED_MGMT=1 needs HPCDIST_TESTBED_NETNS=1"
    assert settings(MGMT="1", NETNS="1").mgmt


@pytest.mark.parametrize("name", ["NETNS", "MGMT"])
def test_a_switch_other_than_0_or_1_is_refused(name: str) -> None:
    assert refusal(**{name: "yes"}) == f"HPCDIST_TESTBED_{name}='yes'; expected 0 or 1"


# ---------------------------------------------------------------- node layout


def test_a_declared_layout_gives_sockets_cores_threads_and_their_product() -> None:
    rows = node_rows(conf(SOCKETS="2", CORES_PER_SOCKET="8", THREADS_PER_CORE="2"))
    assert rows == [
        "NodeName=node[1-4] NodeAddr=127.0.0.1 Port=[17001-17004] CPUs=32 Sockets=2 "
        "CoresPerSocket=8 ThreadsPerCore=2 RealMemory=2000 Features=testbed State=UNKNOWN"
    ]


def test_a_layout_part_not_given_is_one() -> None:
    cfg = settings(SOCKETS="4")
    assert (cfg.sockets, cfg.cores_per_socket, cfg.threads_per_core, cfg.cpus) == (4, 1, 1, 4)


def test_cpus_that_agree_with_the_layout_are_taken_and_others_refused() -> None:
    layout = {"SOCKETS": "2", "CORES_PER_SOCKET": "8", "THREADS_PER_CORE": "2"}
    assert settings(CPUS="32", **layout).cpus == 32
    assert refusal(CPUS="31", **layout) == (
        "HPCDIST_TESTBED_CPUS=31 disagrees with the declared layout 2x8x2 "
        "(SOCKETS x CORES_PER_SOCKET x THREADS_PER_CORE = 32)"
    )


def test_cpus_alone_declare_no_layout() -> None:
    assert node_rows(conf(CPUS="16"))[0].split()[3:5] == ["CPUs=16", "RealMemory=2000"]


def test_a_layout_of_zero_is_refused() -> None:
    assert refusal(SOCKETS="0") == "HPCDIST_TESTBED_SOCKETS=0 must be >= 1"


# ---------------------------------------------------------------- a strict site


def test_a_strict_site_has_no_default_partition_and_four_with_their_limits() -> None:
    assert lines(conf(SITE="strict"), "PartitionName=") == [
        "PartitionName=batch Nodes=node[1-4] MaxTime=1-00:00:00 DefaultTime=00:30:00 State=UP",
        "PartitionName=short Nodes=node[1-4] MaxTime=00:05:00 State=UP",
        "PartitionName=maint Nodes=node[1-4] MaxTime=INFINITE State=DOWN",
        "PartitionName=prio Nodes=node[1-4] MaxTime=INFINITE AllowQos=high State=UP",
    ]


def test_a_strict_site_enforces_associations_and_limits_without_requeue() -> None:
    text = conf(SITE="strict")
    assert lines(text, "AccountingStorageEnforce=") == [
        "AccountingStorageEnforce=associations,limits,qos"
    ]
    assert lines(text, "EnforcePartLimits=") == ["EnforcePartLimits=ALL"]
    assert lines(text, "JobRequeue=") == ["JobRequeue=0"]
    assert lines(text, "MaxArraySize=") == ["MaxArraySize=100"]


def test_a_strict_sites_last_node_alone_has_the_gpu_feature() -> None:
    assert node_rows(conf(SITE="strict")) == [
        "NodeName=node[1-3] NodeAddr=127.0.0.1 Port=[17001-17003] CPUs=2 RealMemory=2000 "
        "Features=testbed State=UNKNOWN",
        "NodeName=node4 NodeAddr=127.0.0.1 Port=17004 CPUs=2 RealMemory=2000 "
        "Features=testbed,gpu State=UNKNOWN",
    ]
    assert "Gres" not in conf(SITE="strict")


def test_a_strict_site_checks_batch_for_idle_nodes_and_keeps_an_array_size_given() -> None:
    cfg = settings(SITE="strict", MAX_ARRAY_SIZE="50")
    assert (cfg.partition, cfg.max_array_size) == ("batch", 50)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SITE": "strict", "ACCOUNTING": "0"},
            "HPCDIST_TESTBED_SITE=strict needs accounting (associations, QOS); "
            "HPCDIST_TESTBED_ACCOUNTING=0 was given",
        ),
        (
            {"SITE": "strict", "PARTITION": "compute"},
            "HPCDIST_TESTBED_PARTITION='compute' does not apply to HPCDIST_TESTBED_SITE=strict "
            "(partitions batch, short, maint, prio)",
        ),
        (
            {"SITE": "strict", "PREEMPT": "requeue"},
            "HPCDIST_TESTBED_PREEMPT='requeue' does not apply to HPCDIST_TESTBED_SITE=strict",
        ),
        ({"SITE": "lax"}, "HPCDIST_TESTBED_SITE='lax'; expected one of plain, strict"),
    ],
)
def test_settings_a_strict_site_cannot_take_are_refused(env: dict[str, str], message: str) -> None:
    assert refusal(**env) == message


def test_the_plain_site_keeps_partition_and_preemption() -> None:
    cfg = settings(SITE="plain", PARTITION="compute", PREEMPT="requeue")
    assert (cfg.partition, cfg.preempt) == ("compute", "requeue")


# ---------------------------------------------------------------- all together, recorded


def test_namespaces_strict_site_and_layout_together() -> None:
    env = {
        "NETNS": "1",
        "MGMT": "1",
        "SITE": "strict",
        "SOCKETS": "2",
        "CORES_PER_SOCKET": "8",
        "THREADS_PER_CORE": "2",
        "PORT_OFFSET": "2700",
    }
    rows = node_rows(conf(**env))
    assert [r.split()[:3] for r in rows] == [
        [f"NodeName=node{k}", f"NodeAddr=10.138.140.{10 + k}", f"Port={19700 + k}"]
        for k in range(1, 5)
    ]
    assert [r.split()[-2] for r in rows] == ["Features=testbed"] * 3 + ["Features=testbed,gpu"]
    assert all("CPUs=32 Sockets=2 CoresPerSocket=8 ThreadsPerCore=2" in r for r in rows)


def test_recorded_settings_read_back_equal() -> None:
    cfg = settings(NETNS="1", MGMT="1", SITE="strict", SOCKETS="2", CORES_PER_SOCKET="8")
    back = tb.Settings(**dataclasses.asdict(cfg))
    back.validate()
    assert back == cfg
    assert (back.netns, back.mgmt, back.site, back.cpus) == (True, True, "strict", 16)


def test_settings_recorded_before_these_existed_read_as_the_default_shape() -> None:
    old = {"nodes": 4, "cpus": 2, "partition": "debug", "port_offset": 95}
    cfg = tb.Settings(**old)
    assert (cfg.netns, cfg.mgmt, cfg.site, cfg.sockets) == (False, False, "plain", 0)
