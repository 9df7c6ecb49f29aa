"""`hpcdist doctor` and `hpcdist profile init` without a cluster: the profile checks on a
made-up probe, the profile text, and user mistakes (one line, exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcdist.cli.site import Row, profile_rows, profile_text
from hpcdist.slurm.probe import ClusterProbe, Node, Partition, SlurmVersion
from hpcdist.spec.profiles import Profile, profile_from_mapping

GPU = Partition("gpu", "g[01-04]", 4, 2 * 86400, 2, "gpuq", True)
CPU = Partition("cpu", "c[01-08]", 8, None, None, None, False)
PROBE = ClusterProbe(
    version=SlurmVersion(24, 11, 5),
    controller=True,
    accounting=True,
    partitions=(GPU, CPU),
    nodes=(
        *(Node(f"g0{i}", ("gpu",), 64, 4, ("h100",), ("ib",), 512000) for i in range(1, 5)),
        *(Node(f"c0{i}", ("cpu",), 40, 0, (), (), 192000) for i in range(1, 9)),
    ),
)


def _profile(**keys: object) -> Profile:
    return profile_from_mapping("p", keys, source="/home/u/p.yaml")


def test_a_profile_that_fits_the_partition_agrees() -> None:
    profile = _profile(
        partition="gpu",
        max_time="2-00:00:00",
        cores_per_node=64,
        gpus_per_node=4,
        gpu_types=["h100"],
        features=["ib"],
        max_nodes=4,
    )
    assert profile_rows(profile, PROBE) == [
        Row("profile 'p' (built in)", "agrees with the cluster (partition gpu)")
    ]


def test_each_disagreement_is_named_with_its_advice() -> None:
    profile = _profile(
        partition="gpu",
        max_time="2-00:00:01",
        cores_per_node=65,
        gpus_per_node=8,
        gpu_types=["a100"],
        features=["nvlink"],
        max_nodes=5,
    )
    rows = profile_rows(profile, PROBE)
    assert [(r.value, r.status, r.advice) for r in rows] == [
        (
            "max_time 2-00:00:01 > partition gpu's 2-00:00:00",
            "FAIL",
            "set max_time to 2-00:00:00 or less",
        ),
        ("max_nodes 5 > the 4 nodes of gpu", "warn", "set max_nodes to 4"),
        ("cores_per_node 65 > 64 CPUs of gpu's nodes", "FAIL", "set cores_per_node to 64"),
        ("gpus_per_node 8 > 4 GPUs of gpu's nodes", "FAIL", "set gpus_per_node to 4"),
        ("GPU type 'a100' not in gpu", "FAIL", "use one of h100"),
        ("feature 'nvlink' on no node of gpu", "warn", "nodes offer ib"),
    ]


def test_a_partition_the_cluster_lacks_is_the_one_problem_shown() -> None:
    (row,) = profile_rows(_profile(partition="debug"), PROBE)
    assert (row.value, row.status) == ("partition 'debug' does not exist", "FAIL")
    assert row.advice == "set partition to one of gpu, cpu (hpcdist profile init writes one)"


def test_without_a_partition_the_default_one_is_checked() -> None:
    (row,) = profile_rows(_profile(gpus_per_node=4), PROBE)
    assert row.value == "agrees with the cluster (partition gpu)"


def test_profile_text_loads_as_a_profile_with_the_partitions_values() -> None:
    text = profile_text("site", PROBE, GPU)
    raw = yaml.safe_load(text)
    profile = profile_from_mapping("site", raw)
    assert (profile.partition, profile.partitions) == ("gpu", ("gpu", "cpu"))
    assert (profile.cores_per_node, profile.gpus_per_node, profile.max_nodes) == (64, 4, 2)
    assert (profile.gpu_types, profile.features) == (("h100",), ("ib",))
    assert (profile.max_time, profile.qos) == ("2-00:00:00", "gpuq")
    assert profile.defaults == {"time": "01:00:00"}
    assert text.startswith("# Written by `hpcdist profile init site` from SLURM 24.11.5 on ")
    # And the check it came from finds nothing to say against it.
    assert profile_rows(profile, PROBE)[0].value == "agrees with the cluster (partition gpu)"


def test_an_unlimited_partition_writes_no_max_time() -> None:
    raw = yaml.safe_load(profile_text("c", PROBE, CPU))
    assert "max_time" not in raw and raw["max_nodes"] == 8 and raw["gpus_per_node"] == 0


def _cli(*args: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/nonexistent", "XDG_CONFIG_HOME": str(config), "HOME": str(config)},
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a/b", "profile name 'a/b'; expected letters, digits, '_', '.', '-'"),
        ("-x", "profile name '-x'; expected letters, digits, '_', '.', '-'"),
        ("local", "profile name 'local' is a shipped profile's; choose another name"),
    ],
)
def test_profile_init_refuses_a_bad_name_in_one_line(
    tmp_path: Path, name: str, message: str
) -> None:
    run = _cli("profile", "init", "--", name, config=tmp_path)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == f"hpcdist: error: {message}\n"


def test_profile_init_never_overwrites(tmp_path: Path) -> None:
    folder = tmp_path / "hpcdist" / "profiles"
    folder.mkdir(parents=True)
    (folder / "mine.yaml").write_text("partition: x\n")
    run = _cli("profile", "init", "mine", config=tmp_path)
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        f"hpcdist: error: profile 'mine' exists ({folder / 'mine.yaml'}); remove it or "
        "choose another name\n"
    )
    assert (folder / "mine.yaml").read_text() == "partition: x\n"


def test_doctor_with_an_unknown_profile_is_one_line(tmp_path: Path) -> None:
    run = _cli("doctor", "--profile", "nosuch", config=tmp_path)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith("hpcdist: error: --profile 'nosuch' is not a shipped profile")
    assert run.stderr.count("\n") == 1


def test_doctor_without_slurm_says_so_and_fails(tmp_path: Path) -> None:
    run = _cli("doctor", config=tmp_path)
    assert run.returncode == 1, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "SLURM version  WARN: unknown"
    assert "controller     FAIL: not reachable (scontrol ping)" in lines
    assert lines[-1] == "1 problem(s) block a job"
