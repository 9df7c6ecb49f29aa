"""A job with no profile: the cluster's own description (22.05 outputs: tests/slurm/sites.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import SpecError
from hpcdist.slurm.probe import ClusterProbe
from hpcdist.spec import clusterprofile
from hpcdist.spec.clusterprofile import (
    CACHE_TTL_S,
    cluster_entry,
    cluster_profile,
    entry_profile,
)
from tests.slurm.sites import site_probe, site_user

SETUP = 'if [ -n "${HPCDIST_VENV:-}" ]; then source "${HPCDIST_VENV}/bin/activate"; fi'


def profile_of(found: ClusterProbe, partition: str | None) -> object:
    return entry_profile(cluster_entry(found, partition))


def test_the_plain_testbed_is_described_as_it_is_and_slurm_picks_the_partition() -> None:
    profile = profile_of(site_probe("plain"), None)
    assert profile.partition is None  # the cluster's default: SLURM picks it
    assert profile.partitions == ("debug",)
    assert (profile.cores_per_node, profile.memory_mb, profile.max_nodes) == (2, 2000, 4)
    assert (profile.max_time, profile.max_array_size, profile.gpus_per_node) == (None, 1001, 0)
    assert (profile.qos, profile.account) == (None, None)
    assert dict(profile.defaults) == {"time": "00:30:00"}
    assert (dict(profile.env), dict(profile.gloo_env), dict(profile.nccl_env)) == ({}, {}, {})
    assert profile.setup == (SETUP,)
    assert profile.source == (
        "cluster hpcdist, SLURM 22.05.8, partition debug: 4 nodes of 2 CPUs and 2000 MB"
    )


def test_a_named_partition_is_written_and_its_limits_taken() -> None:
    found = site_probe("sites")
    short = profile_of(found, "short")
    assert (short.partition, short.max_time) == ("short", "00:05:00")
    assert dict(short.defaults) == {"time": "00:05:00"}  # 30 min cut to MaxTime
    batch = profile_of(found, "batch")
    assert (batch.max_time, dict(batch.defaults)) == ("1-00:00:00", {"time": "00:30:00"})
    assert profile_of(found, "short,batch").max_time == "00:05:00"  # the first of a list
    assert found.max_array_size == 100 and short.max_array_size == 100


def test_the_node_layout_decides_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    found = site_probe("plain")
    big = tuple(dataclasses.replace(n, cpus=64, memory_mb=256000) for n in found.nodes)
    mixed = (*big[:3], dataclasses.replace(big[3], cpus=32))
    assert profile_of(dataclasses.replace(found, nodes=big), None).cores_per_node == 64
    # A partition of mixed nodes: the smallest, so that the job fits any of them.
    assert profile_of(dataclasses.replace(found, nodes=mixed), None).cores_per_node == 32


def test_the_qos_a_partition_requires_is_taken_when_the_user_has_it() -> None:
    found = site_probe("sites")
    assert profile_of(found, "prio").qos == "high"
    lacking = dataclasses.replace(found.user, qos=("normal",))
    with pytest.raises(SpecError) as refused:
        profile_of(dataclasses.replace(found, user=lacking), "prio")
    assert str(refused.value) == (
        "partition prio allows QOS high only; your jobs get QOS normal by default; ask the "
        "site admins for QOS high (the cluster's own description: no profile named)"
    )


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        (
            "maint",
            "partition maint is DOWN: jobs wait there and none starts; use --partition one "
            "of debug, batch, short, prio",
        ),
        ("acct", "partition acct is DRAIN: it takes no jobs; use --partition one of debug"),
        ("nope", "partition 'nope' does not exist; use --partition one of debug, batch"),
    ],
)
def test_a_partition_that_cannot_run_the_job_is_refused_with_the_fix(
    partition: str, message: str
) -> None:
    with pytest.raises(SpecError, match="^" + message.replace("(", r"\(")):
        profile_of(site_probe("sites"), partition)


def test_no_default_partition_asks_for_one_and_a_named_one_runs() -> None:
    found = site_probe("sites", partitions="nodefault-scontrol-partition.txt")
    with pytest.raises(SpecError, match=r"^the cluster has no default partition and none was"):
        profile_of(found, None)
    assert profile_of(found, "debug").partition == "debug"


def test_a_user_without_an_association_is_refused_where_the_site_enforces_them() -> None:
    found = dataclasses.replace(site_probe("sites"), user=site_user("noassoc", "nobody"))
    with pytest.raises(SpecError) as refused:
        profile_of(found, None)
    assert str(refused.value) == (
        "user nobody has no account on cluster hpcdist, and the site requires one; ask the site "
        "admins for an account (the cluster's own description: no profile named)"
    )
    plain = dataclasses.replace(site_probe("plain"), user=site_user("noassoc", "nobody"))
    assert profile_of(plain, None).partition is None  # nothing enforced: no refusal


class Slurm:
    """SLURM as ``cluster_profile`` sees it: its commands, a slurm.conf and ``probe()``,
    which answers ``found`` and counts its calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, found: ClusterProbe) -> None:
        self.probes = 0
        self.found = found
        monkeypatch.setattr(clusterprofile, "probe", self.probe)

    def probe(self) -> ClusterProbe:
        self.probes += 1
        return self.found


@dataclasses.dataclass
class _Version:
    returncode: int = 0
    stdout: str = "slurm 22.05.8"


@pytest.fixture
def slurm_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Slurm:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hpcdist\nSlurmctldHost=head(10.0.0.1)\nSlurmctldPort=6817\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(clusterprofile.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(clusterprofile, "slurm_tool", lambda argv: _Version())
    return Slurm(monkeypatch, site_probe("plain"))


def test_the_description_is_kept_privately_for_a_while(
    slurm_here: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_000_000.0]
    monkeypatch.setattr(clusterprofile.time, "time", lambda: clock[0])
    assert cluster_profile(None).cores_per_node == 2
    assert cluster_profile(None).cores_per_node == 2
    assert slurm_here.probes == 1  # the second came from the cache
    (kept,) = (tmp_path / "state" / "hpcdist" / "clusters").iterdir()
    assert kept.name.startswith("hpcdist-")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    clock[0] += CACHE_TTL_S - 1
    cluster_profile(None)
    assert slurm_here.probes == 1
    clock[0] += 1  # CACHE_TTL_S after it was made: asked again
    cluster_profile(None)
    assert slurm_here.probes == 2
    cluster_profile("debug")  # another partition: its own entry
    assert slurm_here.probes == 3


def test_a_cache_others_can_write_is_not_read(
    slurm_here: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster_profile(None)
    (kept,) = (tmp_path / "state" / "hpcdist" / "clusters").iterdir()
    data = json.loads(kept.read_text())
    data["entries"][""]["mapping"]["cores_per_node"] = 999
    kept.write_text(json.dumps(data))
    os.chmod(kept, 0o666)
    assert cluster_profile(None).cores_per_node == 2  # not the planted 999
    assert slurm_here.probes == 2


def test_another_controller_is_another_cluster(
    slurm_here: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster_profile(None)
    conf = Path(os.environ["SLURM_CONF"])
    conf.write_text("ClusterName=hpcdist\nSlurmctldHost=head(10.0.0.1)\nSlurmctldPort=7817\n")
    cluster_profile(None)
    assert slurm_here.probes == 2
    assert len(list((tmp_path / "state" / "hpcdist" / "clusters").iterdir())) == 2


def test_a_refusal_is_never_taken_from_the_cache(
    slurm_here: Slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SpecError, match="partition maint is DOWN"):
        slurm_here.found = site_probe("sites")
        cluster_profile("maint")
    # The admins brought it back: the next command asks again and runs.
    found = site_probe("sites")
    up = tuple(dataclasses.replace(p, state="UP") for p in found.partitions)
    slurm_here.found = dataclasses.replace(found, partitions=up)
    assert cluster_profile("maint").partition == "maint"


def test_without_slurm_the_script_says_what_it_assumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HPCDIST_PROFILE", raising=False)
    monkeypatch.setattr(clusterprofile.shutil, "which", lambda name: None)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["render", "--nodes", "4", "--backend", "gloo"])
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[2]
    assert header.endswith(
        "profile assumed (no SLURM commands on this machine: SLURM's default partition, 1 CPU "
        "per task unless --cpus-per-task, no site limits checked; render on the cluster, or "
        "name a --profile)."
    )
    assert "#SBATCH --partition" not in result.stdout
    assert "#SBATCH --cpus-per-task=1\n" in result.stdout
    assert "SOCKET_IFNAME" not in result.stdout


def test_a_blocker_refuses_render_in_one_line_and_writes_nothing(
    slurm_here: Slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HPCDIST_PROFILE", raising=False)
    monkeypatch.chdir(tmp_path)
    slurm_here.found = site_probe("sites")
    script = tmp_path / "job.sh"
    result = CliRunner().invoke(
        cli, ["render", "--partition", "maint", "--nodes", "4", "--script", str(script)]
    )
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "hpcdist: error: partition maint is DOWN: jobs wait there and none starts; use "
        "--partition one of debug, batch, short, prio (the cluster's own description: no "
        "profile named)"
    ]
    assert not script.exists()
    ok = CliRunner().invoke(cli, ["render", "--partition", "short", "--nodes", "4"])
    assert ok.exit_code == 0, ok.output
    assert '#SBATCH --partition="short"' in ok.stdout
    assert '#SBATCH --time="00:05:00"' in ok.stdout
    too_long = CliRunner().invoke(cli, ["render", "--partition", "short", "--time", "6"])
    assert too_long.exit_code == 2
    assert "--time '6' exceeds profile 'hpcdist' limit of 00:05:00" in too_long.stderr
    array = CliRunner().invoke(cli, ["render", "--partition", "short", "--array", "0-100"])
    assert "has task id 100; profile 'hpcdist' takes ids up to 99" in array.stderr
    ok_array = CliRunner().invoke(cli, ["render", "--partition", "short", "--array", "0-99"])
    assert ok_array.exit_code == 0, ok_array.output
