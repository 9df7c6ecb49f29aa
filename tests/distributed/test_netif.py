"""The interface a rank's gloo and NCCL sockets use: the route to rank 0, unless named."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpcdist.distributed import netif
from hpcdist.distributed.netif import (
    IFNAME_VARS,
    REASON_VAR,
    interface_holding,
    network_environ,
    rank_network,
    use_rank_network,
)
from hpcdist.distributed.rankenv import rank_environ

INTERFACES = {
    "lo": ("127.0.0.1", "255.0.0.0"),
    "eno1": ("192.168.1.5", "255.255.255.0"),  # a management network
    "ib0": ("10.40.2.7", "255.255.0.0"),  # the network between the nodes
}


def test_the_interface_holding_an_address_is_found_by_address_then_by_network() -> None:
    assert interface_holding("10.40.2.7", INTERFACES) == "ib0"
    assert interface_holding("192.168.1.5", INTERFACES) == "eno1"
    # Debian maps the host's name to 127.0.1.1: loopback's network holds it.
    assert interface_holding("127.0.1.1", INTERFACES) == "lo"
    # Both sides of ib0's /16 boundary.
    assert interface_holding("10.40.255.254", INTERFACES) == "ib0"
    assert interface_holding("10.41.0.1", INTERFACES) is None


def test_the_route_to_rank_0_names_the_interface_and_both_variables() -> None:
    network = rank_network("127.0.0.1", {})
    assert network.interface == "lo"
    assert dict(network.chosen) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert network.describe() == "net lo (127.0.0.1 on the route to rank 0 at 127.0.0.1)"


def test_a_route_through_another_interface_is_that_interface(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(netif, "interface_addresses", lambda: INTERFACES)
    monkeypatch.setattr(netif, "route_source", lambda addr: "10.40.2.7")
    network = rank_network("node1", {})
    assert network.interface == "ib0"
    assert network.describe() == "net ib0 (10.40.2.7 on the route to rank 0 at node1)"


def test_the_jobs_own_interface_wins_each_variable_on_its_own() -> None:
    both = {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib1"}
    network = rank_network("127.0.0.1", both)
    assert (network.interface, dict(network.chosen)) == ("ib0", {})
    assert network.describe() == "net ib0 (GLOO_SOCKET_IFNAME set by the job)"
    gloo_only = rank_network("127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"})
    assert dict(gloo_only.chosen) == {"NCCL_SOCKET_IFNAME": "lo"}
    nccl_only = rank_network("127.0.0.1", {"NCCL_SOCKET_IFNAME": "ib1"})
    assert (nccl_only.interface, dict(nccl_only.chosen)) == ("lo", {"GLOO_SOCKET_IFNAME": "lo"})
    # An empty value names nothing: the route decides.
    assert rank_network("127.0.0.1", {"GLOO_SOCKET_IFNAME": " "}).interface == "lo"


def test_no_route_leaves_the_choice_to_gloo_and_nccl_and_says_so() -> None:
    network = rank_network("no-such-node.invalid", {})
    assert (network.interface, dict(network.chosen)) == (None, {})
    assert "no route to rank 0 at 'no-such-node.invalid'" in network.describe()


def test_a_command_started_by_rankenv_gets_the_route_and_its_reason() -> None:
    chosen = network_environ("127.0.0.1", {})
    assert chosen == {
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
        REASON_VAR: "127.0.0.1 on the route to rank 0 at 127.0.0.1",
    }
    # A rank that then calls setup_distributed says why, not "set by the job".
    assert rank_network("127.0.0.1", chosen).describe() == (
        "net lo (127.0.0.1 on the route to rank 0 at 127.0.0.1)"
    )
    assert network_environ("127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"}) == {
        "NCCL_SOCKET_IFNAME": "lo"
    }


def test_rankenv_adds_the_interface_to_slurm_ranks_and_to_launched_ones() -> None:
    slurm = {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "localhost,other",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_ID": "0",
        "MASTER_PORT": "29512",
    }
    out = rank_environ(slurm)
    assert (out["MASTER_ADDR"], out["GLOO_SOCKET_IFNAME"]) == ("localhost", "lo")
    launched = rank_environ({"RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    assert launched["NCCL_SOCKET_IFNAME"] == "lo"
    assert "GLOO_SOCKET_IFNAME" not in rank_environ({"RANK": "0"})  # no master: nothing


def test_the_variables_are_set_for_gloo_unless_set_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in IFNAME_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib9")  # set after the job's environment was read
    use_rank_network("127.0.0.1", {})
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "ib9")


@pytest.mark.slow
def test_a_two_rank_gloo_group_says_its_interface_in_the_rank_line(tmp_path: object) -> None:
    code = (
        "import os, sys\n"
        "from hpcdist.distributed import setup_distributed, cleanup_distributed\n"
        "ctx = setup_distributed(timeout_s=60)\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); print('sum', int(t.item()))\n"
        "cleanup_distributed()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GLOO_", "NCCL_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29731", WORLD_SIZE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    for rank, text in enumerate(outputs):
        assert procs[rank].returncode == 0, text
        assert "net lo (127.0.0.1 on the route to rank 0 at 127.0.0.1)" in text, text
        assert "sum 2" in text
