"""expand_nodelist, expand_tasks_per_node and derive_port: SLURM's strings, SLURM's answers.

The expected expansions were taken from `scontrol show hostnames` (SLURM 22.05);
tests/integration/test_nodelist_scontrol.py compares against it on generated lists.
"""

from __future__ import annotations

import pytest

from hpcdist.distributed import (
    PORT_HIGH,
    PORT_LOW,
    DistEnvError,
    NodeListError,
    derive_port,
    expand_nodelist,
    expand_tasks_per_node,
)
from hpcdist.slurm.nodelist import MAX_HOSTS


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu-[01-03,07],cpu[1-2]", ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "cpu1", "cpu2"]),
        ("b[3-4],a[1-2]", ["b3", "b4", "a1", "a2"]),
        ("n[10,2,7-8]", ["n10", "n2", "n7", "n8"]),
        ("n[1-3],n[2-4]", ["n1", "n2", "n3", "n2", "n3", "n4"]),
        ("node7,node3,node5", ["node7", "node3", "node5"]),
    ],
    ids=[
        "single",
        "range",
        "design-example",
        "lists-keep-order",
        "items-keep-order",
        "duplicates-kept",
        "plain-names",
    ],
)
def test_nodelist_keeps_slurm_order(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[001-3]", ["n001", "n002", "n003"]),
        ("n[9-010]", ["n9", "n10"]),  # the width of the range's start counts
        ("n[1-2,01-02]", ["n1", "n2", "n01", "n02"]),
        ("n[0]", ["n0"]),
        ("n[00]", ["n00"]),
        ("n[007,8]", ["n007", "n8"]),
        ("n01,n[2-3]", ["n01", "n2", "n3"]),
    ],
)
def test_nodelist_keeps_zero_padding(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("a[1-2][3-4]", ["a13", "a14", "a23", "a24"]),
        ("x[1,3-4]y[7,9]", ["x1y7", "x1y9", "x3y7", "x3y9", "x4y7", "x4y9"]),
        # Three groups: SLURM varies the last fastest, then the first, then the second.
        (
            "a[1-2]b[3-4]c[5-6]",
            ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5", "a1b4c6", "a2b4c5", "a2b4c6"],
        ),
        ("a-[1-2],b[3-4]-c[5-6]", ["a-1", "a-2", "b3-c5", "b3-c6", "b4-c5", "b4-c6"]),
    ],
    ids=["two-groups", "adjacent-groups", "lists-in-groups", "three-groups", "mixed"],
)
def test_nodelist_expands_several_groups_in_slurm_product_order(
    nodelist: str, expected: list[str]
) -> None:
    assert expand_nodelist(nodelist) == expected


def test_nodelist_four_groups_follow_scontrol() -> None:
    # `scontrol show hostnames 'a[1-2]b[3-4]c[5-6]d[7-8]'`, SLURM 22.05.8
    expected = [f"a{a}b{b}c{c}d{d}" for c in (5, 6) for b in (3, 4) for a in (1, 2) for d in (7, 8)]
    assert expected[:3] == ["a1b3c5d7", "a1b3c5d8", "a2b3c5d7"]
    assert expand_nodelist("a[1-2]b[3-4]c[5-6]d[7-8]") == expected


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("gpu-a100-[1-2]", ["gpu-a100-1", "gpu-a100-2"]),
        ("node1[0-2]", ["node10", "node11", "node12"]),
        ("r01-n[08-09],r02-n01", ["r01-n08", "r01-n09", "r02-n01"]),
        ("login.cluster-1", ["login.cluster-1"]),
        ("[1-3]", ["1", "2", "3"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),  # newer SLURM writes suffixes; 22.05 rejects them
    ],
)
def test_nodelist_accepts_names_with_dashes_and_digits(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("n[1-2],,m", ["n1", "n2", "m"]),
        (",a", ["a"]),
        ("n[1-2] m", ["n1", "n2", "m"]),
    ],
)
def test_nodelist_separators_like_scontrol(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


@pytest.mark.parametrize(
    ("nodelist", "message"),
    [
        ("gpu-[01-03", "unbalanced '['"),
        ("gpu-01-03]", "unbalanced ']'"),
        ("a]1", "unbalanced ']'"),
        ("n[1-2]]", "unbalanced ']'"),
        ("a[[1-2]]", "brackets"),
        ("node[5-3]", "runs backwards"),
        ("node[]", "bad range"),
        ("node[-1]", "bad range"),
        ("node[1-2-3]", "bad range"),
        ("node[1-]", "bad range"),
        ("node[x]", "bad range"),
        ("node[1,,2]", "bad range"),
        ("node[ 1-2]", "whitespace"),
        (
            "node[\u0661-\u0663]",
            "bad range",
        ),  # Arabic-Indic digits: str.isdigit() alone would pass them
        ("", "empty"),
        ("  ,, ", "empty"),
        ("n[0-65536]", "more than 65536"),
        ("a[0-65535]b[0-65535]", "more than"),
    ],
)
def test_nodelist_malformed_raises_error_quoting_the_list(nodelist: str, message: str) -> None:
    with pytest.raises(NodeListError) as info:
        expand_nodelist(nodelist)
    assert message in str(info.value)
    assert repr(nodelist) in str(info.value)


@pytest.mark.parametrize(
    ("nodelist", "message"),
    [
        ("", "SLURM_NODELIST '' is empty; expected e.g. 'node[01-04]'"),
        ("a]1[2]", "unbalanced ']' in SLURM_NODELIST 'a]1[2]'"),
        ("a]1[2[3]", "unbalanced ']' in SLURM_NODELIST 'a]1[2[3]'"),  # balanced, ']' first
        ("gpu-[01-03", "unbalanced '[' in SLURM_NODELIST 'gpu-[01-03'"),
        ("n[1-2]]", "unbalanced ']' in SLURM_NODELIST 'n[1-2]]'"),
        # A ']' in the literal between groups, found before the bad range that follows it.
        ("a[1]]b[x]c[2", "nested or unbalanced brackets in SLURM_NODELIST 'a[1]]b[x]c[2'"),
        ("a[1]b[2", "unbalanced '[' in SLURM_NODELIST 'a[1]b[2'"),
        ("a[1-2]b[2[3]]", "nested or unbalanced brackets in SLURM_NODELIST 'a[1-2]b[2[3]]'"),
        (
            "n[x]",
            "bad range '[x]' in SLURM_NODELIST 'n[x]'; "
            "expected numbers N or LO-HI separated by commas",
        ),
        (
            "a[1]b[y]",
            "bad range '[y]' in SLURM_NODELIST 'a[1]b[y]'; "
            "expected numbers N or LO-HI separated by commas",
        ),
        ("n[1-2-3]", "bad range '1-2-3' in SLURM_NODELIST 'n[1-2-3]'; expected LO-HI"),
        ("n[6-5]", "range '6-5' in SLURM_NODELIST 'n[6-5]' runs backwards; expected LO <= HI"),
        ("n[0-65536]", "range '0-65536' in SLURM_NODELIST 'n[0-65536]' has more than 65536 hosts"),
        ("n[ 1]", "whitespace inside brackets in SLURM_NODELIST 'n[ 1]'"),
    ],
)
def test_nodelist_error_message_names_variable_value_and_expectation(
    nodelist: str, message: str
) -> None:
    with pytest.raises(NodeListError) as info:
        expand_nodelist(nodelist, "SLURM_NODELIST")
    assert str(info.value) == message


def test_nodelist_error_default_name_is_node_list() -> None:
    with pytest.raises(NodeListError) as info:
        expand_nodelist(",")
    assert str(info.value) == "node list ',' is empty; expected e.g. 'node[01-04]'"


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("n[5-5]", ["n5"]),  # a one-value range is not backwards
        ("n[05-05]", ["n05"]),
        ("n[70000-70003]", ["n70000", "n70001", "n70002", "n70003"]),  # size is hi - lo
        ("n[0-8]", [f"n{i}" for i in range(9)]),
        ("n[00-09]", [f"n{i:02d}" for i in range(10)]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),  # unpadded start: numbers grow in width
        ("n[010-012]", ["n010", "n011", "n012"]),
        ("n[0-2]", ["n0", "n1", "n2"]),
    ],
)
def test_nodelist_range_boundaries(nodelist: str, expected: list[str]) -> None:
    assert expand_nodelist(nodelist) == expected


def test_nodelist_range_size_limit_is_exact() -> None:
    assert len(expand_nodelist("n[70000-135535]")) == 65536  # hi - lo == 65535: accepted
    with pytest.raises(NodeListError, match=r"'70000-135536' .* has more than 65536 hosts"):
        expand_nodelist("n[70000-135536]")


def test_nodelist_product_size_limit_is_exact() -> None:
    hosts = expand_nodelist("a[0-1023]b[0-1023]")  # 2**20 hosts: the most a list may name
    assert (len(hosts), hosts[0], hosts[-1]) == (MAX_HOSTS, "a0b0", "a1023b1023")
    with pytest.raises(NodeListError) as info:
        expand_nodelist("a[0-1023]b[0-1024]")
    assert str(info.value) == "node list 'a[0-1023]b[0-1024]' expands to more than 1048576 hosts"


def test_nodelist_total_size_limit_is_exact() -> None:
    exact = ",".join(f"r{i}n[0-65535]" for i in range(16))  # 16 x 65536 == 2**20
    assert len(expand_nodelist(exact)) == MAX_HOSTS
    with pytest.raises(NodeListError) as info:
        expand_nodelist(exact + ",x[0-1]", "SLURM_NODELIST")
    assert str(info.value) == (
        f"SLURM_NODELIST {exact + ',x[0-1]'!r} expands to more than 1048576 hosts"
    )


def test_nodelist_error_names_the_variable() -> None:
    with pytest.raises(NodeListError, match=r"unbalanced '\[' in SLURM_JOB_NODELIST 'gpu-\[01-03'"):
        expand_nodelist("gpu-[01-03", "SLURM_JOB_NODELIST")


def test_nodelist_error_is_a_value_error() -> None:
    assert issubclass(NodeListError, ValueError)


def test_nodelist_largest_single_range_slurm_accepts() -> None:
    hosts = expand_nodelist("n[0-65535]")
    assert (len(hosts), hosts[0], hosts[-1]) == (65536, "n0", "n65535")


_TEN_THOUSAND = {
    "one-range": "node[00001-10000]",
    "plain-names": ",".join(f"n{i}" for i in range(10000)),
    "many-tokens": ",".join(f"r{i}-n[{i * 10:05d}-{i * 10 + 9:05d}]" for i in range(1000)),
    "fragmented": "gpu-[" + ",".join(f"{i:05d}-{i + 1:05d}" for i in range(0, 10000, 2)) + "]",
    "product": "rack[001-100]-node[001-100]",
}


@pytest.mark.parametrize("nodelist", list(_TEN_THOUSAND.values()), ids=list(_TEN_THOUSAND))
def test_nodelist_expands_ten_thousand_nodes(nodelist: str) -> None:
    # Their speed is measured by bench/bench_cli.py, not here: a loaded machine is no budget.
    hosts = expand_nodelist(nodelist)
    assert len(hosts) == len(set(hosts)) == 10000


# ------------------------------------------------------------------- tasks per node


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1(x4)", [1, 1, 1, 1]),
        ("3,2(x2),8", [3, 2, 2, 8]),
        ("8(x2)", [8, 8]),
        ("16", [16]),
    ],
)
def test_tasks_per_node_expands_compressed_layout(layout: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(layout) == expected


@pytest.mark.parametrize("layout", ["", "x", "2(3)", "2(x)", "2(x0)", "-1", "2,,1", "0", "2x3"])
def test_tasks_per_node_malformed_raises_error_quoting_it(layout: str) -> None:
    with pytest.raises(DistEnvError) as info:
        expand_tasks_per_node(layout, "SLURM_TASKS_PER_NODE")
    assert repr(layout) in str(info.value)
    assert "SLURM_TASKS_PER_NODE" in str(info.value)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("2x3", "bad tasks-per-node '2x3'; expected e.g. '4' or '2(x3),1'"),
        ("2(x0)", "bad repeat count in tasks-per-node '2(x0)'"),
        ("0(x2)", "tasks-per-node '0(x2)' places no task at all"),
        ("1(x1048577)", "bad repeat count in tasks-per-node '1(x1048577)'"),
        ("1,1(x1048576)", "bad repeat count in tasks-per-node '1,1(x1048576)'"),
    ],
)
def test_tasks_per_node_error_message_in_full(layout: str, message: str) -> None:
    with pytest.raises(DistEnvError) as info:
        expand_tasks_per_node(layout)
    assert str(info.value) == message


def test_tasks_per_node_repeat_limit_is_exact() -> None:
    assert len(expand_tasks_per_node("1(x1048576)")) == MAX_HOSTS
    assert len(expand_tasks_per_node("1,1(x1048575)")) == MAX_HOSTS
    assert expand_tasks_per_node("0,1") == [0, 1]  # a node may hold no task of a step


# ----------------------------------------------------------------------------- ports


@pytest.mark.parametrize(
    ("job_id", "step_id"), [(0, 0), (1, 0), (1234, 0), (4_294_967_294, 4_294_967_294)]
)
def test_derived_port_stays_below_the_ephemeral_range(job_id: int, step_id: int) -> None:
    assert PORT_LOW <= derive_port(job_id, step_id) <= PORT_HIGH < 32768


def test_derived_port_differs_between_nearby_jobs() -> None:
    ports = {derive_port(job_id, 0) for job_id in range(10_000, 12_000)}
    assert len(ports) == 2000


def test_derived_port_differs_between_steps_of_a_job() -> None:
    ports = {derive_port(5678, step) for step in range(50)}
    assert len(ports) == 50


def test_derived_port_is_stable() -> None:
    # Every rank computes it on its own: it must be a pure function of the ids.
    assert derive_port(1234, 0) == derive_port(1234, 0) == 29722


def test_derived_port_rejects_negative_ids() -> None:
    with pytest.raises(ValueError, match="-1"):
        derive_port(-1, 0)
