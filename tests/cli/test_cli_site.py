"""`hpcdist doctor` and `hpcdist profile init` without a cluster: the profile checks on a
made-up probe, the doctor's table, blockers, JSON and exit status on probes parsed from what
the testbed printed, the profile text, and user mistakes (one line, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from hpcdist.cli import site
from hpcdist.cli.doctor import verdict
from hpcdist.cli.site import Row, doctor_rows, profile_rows, profile_text
from hpcdist.slurm.probe import ClusterProbe, Node, Partition, SlurmVersion
from hpcdist.spec.profiles import Profile, profile_from_mapping
from tests.slurm.sites import site_probe, site_user

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
        ("generic", "profile name 'generic' is a shipped profile's; choose another name"),
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


# The doctor on what the 22.05 testbed printed (tests/slurm/sites.py): the plain testbed, and
# one with site policies set by hand.
PLAIN = site_probe("plain")
SITE = site_probe("sites")
NO_DEFAULT = site_probe("sites", "nodefault-scontrol-partition.txt")


def _table(rows: list[Row]) -> dict[str, Row]:
    return {r.item: r for r in rows}


def test_doctor_on_the_plain_testbed_reports_nothing() -> None:
    rows = doctor_rows(PLAIN, None, job=False)
    assert [r for r in rows if r.status != "ok"] == []
    assert verdict(rows) == ("nothing blocks a job", 0)
    table = _table(rows)
    assert table["profile"].value == "none checked (--profile NAME checks one)"
    assert table["your accounts"].value == "root (default root)"
    assert table["GPUs"].value == "none (no GPU GRES, no node feature names a GPU)"


def test_doctor_shows_the_sites_settings() -> None:
    table = _table(doctor_rows(SITE, None, job=False))
    assert table["preemption"].value == "preempt/partition_prio, mode REQUEUE"
    assert table["MaxArraySize"].value == "100 (array task ids 0-99)"
    assert table["requeue"].value == (
        "JobRequeue=0: a job is requeued only if it asks (hpcdist's jobs say --requeue)"
    )
    assert table["accounting enforces"].value == "associations, limits, qos"
    assert table["your accounts"].value == "proj, root (default proj)"
    assert table["your QOS"].value == "high, normal (default normal)"
    assert table["cluster"].value == "hpcdist, controller host vm"
    assert table["GPUs"].value == (
        "no GPU GRES; feature gpu on 1 node(s) (node4): GPUs only through --constraint gpu"
    )
    assert table["partition maint"].value.startswith(
        "4 nodes (max all a job), time unlimited, state DOWN, QOS none, "
        "CPUs/node 2 (2 sockets x 1 cores x 1 threads)"
    )
    assert "time 1-00:00:00, default time 00:30:00," in table["partition batch"].value
    assert ", QOS allowed high," in table["partition prio"].value
    assert ", state DRAIN, accounts allowed proj," in table["partition acct"].value


def test_a_site_without_default_partition_blocks_a_job_without_one() -> None:
    rows = doctor_rows(NO_DEFAULT, None, job=False)
    (failed,) = [r for r in rows if r.status != "ok"]
    assert failed == Row(
        "a job with no --partition",
        "the cluster has no default partition and none was given",
        "FAIL",
        "--partition one of debug, prio",
    )
    assert verdict(rows) == ("1 problem(s) block a job", 1)
    # With the partition named by the profile, the same cluster blocks nothing.
    fits = doctor_rows(NO_DEFAULT, _profile(partition="debug"), job=False)
    assert verdict(fits) == ("nothing blocks a job", 0)


@pytest.mark.parametrize(
    ("partition", "what", "fix"),
    [
        ("maint", "partition maint is DOWN: jobs wait there and none starts", "--partition"),
        (
            "prio",
            "partition prio allows QOS high only; your jobs get QOS normal by default",
            "--qos high",
        ),
        ("acct", "partition acct is DRAIN: it takes no jobs", "--partition"),
    ],
)
def test_each_blocker_of_the_profiles_partition_is_a_fail_row(
    partition: str, what: str, fix: str
) -> None:
    rows = doctor_rows(SITE, _profile(partition=partition), job=False)
    (failed,) = [r for r in rows if r.status == "FAIL"]
    assert (failed.item, failed.value) == (f"a job in {partition}", what)
    assert failed.advice.startswith(fix)
    assert verdict(rows)[1] == 1


def test_a_user_without_association_at_a_site_that_enforces_them() -> None:
    nobody = replace(SITE, user=site_user("noassoc", "nobody"))
    (failed,) = [r for r in doctor_rows(nobody, None, job=False) if r.status != "ok"]
    assert (
        failed.value == "user nobody has no account on cluster hpcdist, and the site requires one"
    )
    assert failed.advice == "ask the site admins for an account"
    assert _table(doctor_rows(nobody, None, job=False))["your accounts"].value == "none"


def test_a_profile_partition_the_cluster_lacks_is_said_once() -> None:
    rows = doctor_rows(SITE, _profile(partition="gpu"), job=False)
    failed = [r for r in rows if r.status == "FAIL"]
    assert [r.value for r in failed] == ["partition 'gpu' does not exist"]
    assert failed[0].advice.startswith("set partition to one of debug, batch")


def test_a_profile_limit_above_the_partitions_blocks() -> None:
    rows = doctor_rows(SITE, _profile(partition="short", max_time="00:10:00"), job=False)
    (failed,) = [r for r in rows if r.status == "FAIL"]
    assert failed.value == "max_time 00:10:00 > partition short's 00:05:00"
    fits = doctor_rows(SITE, _profile(partition="short", max_time="00:05:00"), job=False)
    assert verdict(fits) == ("nothing blocks a job", 0)


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("ok", "ok"), ("nothing blocks a job", 0)),
        (("ok", "warn"), ("nothing blocks a job; 1 warning(s)", 3)),
        (("warn", "FAIL", "warn"), ("1 problem(s) block a job", 1)),
        (("FAIL", "FAIL"), ("2 problem(s) block a job", 1)),
    ],
)
def test_verdict_and_exit_status(statuses: tuple[str, ...], expected: tuple[str, int]) -> None:
    assert verdict([Row(f"r{i}", "v", s) for i, s in enumerate(statuses)]) == expected


def _doctor(found: ClusterProbe, *args: str, monkeypatch: pytest.MonkeyPatch) -> Result:
    monkeypatch.setattr(site, "probe", lambda: found)
    monkeypatch.delenv("HPCDIST_PROFILE", raising=False)
    return CliRunner().invoke(site.doctor, list(args))


@pytest.mark.parametrize(
    ("found", "status", "last"),
    [
        (PLAIN, 0, "nothing blocks a job"),
        (replace(PLAIN, accounting=False), 3, "nothing blocks a job; 1 warning(s)"),
        (NO_DEFAULT, 1, "1 problem(s) block a job"),
        (replace(NO_DEFAULT, accounting=False), 1, "1 problem(s) block a job"),
    ],
)
def test_doctor_exits_by_what_it_found(
    found: ClusterProbe, status: int, last: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _doctor(found, monkeypatch=monkeypatch)
    assert run.exit_code == status, run.output
    assert run.output.splitlines()[-1] == last
    as_json = _doctor(found, "--json", monkeypatch=monkeypatch)
    assert as_json.exit_code == status
    data = json.loads(as_json.output)
    assert (data["summary"], data["exit_status"]) == (last, status)


def test_doctor_json_holds_the_facts_and_the_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _doctor(NO_DEFAULT, "--json", monkeypatch=monkeypatch)
    data = json.loads(run.output)
    assert set(data) == {
        "cluster",
        "profile",
        "partition",
        "rows",
        "problems",
        "summary",
        "exit_status",
    }
    assert (data["profile"], data["partition"]) == (None, None)
    assert data["problems"] == [
        {
            "item": "a job with no --partition",
            "status": "FAIL",
            "what": "the cluster has no default partition and none was given",
            "fix": "--partition one of debug, prio",
        }
    ]
    cluster = data["cluster"]
    assert "config" not in cluster
    assert (cluster["max_array_size"], cluster["job_requeue"]) == (100, False)
    assert (cluster["preempt_type"], cluster["preempt_mode"]) == (
        "preempt/partition_prio",
        "REQUEUE",
    )
    assert cluster["enforce"] == ["associations", "limits", "qos"]
    assert cluster["default_partition"] is None
    assert cluster["user"] == {
        "accounts": ["proj", "root"],
        "default_account": "proj",
        "qos": ["high", "normal"],
        "default_qos": "normal",
        "user": "root",
    }
    prio = next(p for p in cluster["partitions"] if p["name"] == "prio")
    assert (prio["state"], prio["allow_qos"], prio["default"]) == ("UP", ["high"], False)
    node4 = cluster["nodes"][-1]
    assert (node4["name"], node4["features"], node4["sockets"]) == ("node4", ["testbed", "gpu"], 2)
