"""`hpcdist doctor` on a testbed shaped like a strict site (HPCDIST_TESTBED_SITE=strict: no
default partition; batch, short of 5 minutes, maint DOWN, prio for QOS high; associations,
limits and QOS enforced, account proj and QOS high for root; JobRequeue=0; MaxArraySize=100;
the last node's GPUs only through the feature gpu). The doctor must name each blocker in its
own line, and show the site's settings.

The strict testbed is this module's own: started fresh once (its base directory removed
first), stopped after the module. Its port offset is 2850: more than 251 away from every
worker's testbed (offsets 0-2495, tests/conftest.py) and its node ports below 20000.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import REPO_ROOT, TESTBED, slurm_env

pytestmark = pytest.mark.xdist_group("doctor-sites")

BASE = Path("/tmp/hpcdist-doctor-site")
PORT_OFFSET = 2850
# Imports hpcdist as root (the interpreter sits below /root), then becomes the other user.
AS_USER = (
    "import os, sys\n"
    "import hpcdist.cli.main as m, hpcdist.cli.site\n"
    "os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[1]))\n"
    "sys.exit(m.main(sys.argv[3:]))\n"
)
OTHER_USER = "hpcdoc-site" + os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")


@dataclass(frozen=True)
class Site:
    env: dict[str, str]  # SLURM_CONF (and a release's PATH) of the strict testbed

    def doctor(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcdist.cli.main", "doctor", *args],
            cwd=cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _testbed_env() -> dict[str, str]:
    env = {k: v for k, v in slurm_env().items() if k not in ("SLURM_CONF", "HPCDIST_PROFILE")}
    shape = {"NODES": "4", "GPUS": "0", "GPU_TYPE": "", "PARTITION": "", "PREEMPT": "off"}
    env.update({f"HPCDIST_TESTBED_{k}": v for k, v in shape.items()})
    env.update(
        HPCDIST_TESTBED_DIR=str(BASE),
        HPCDIST_TESTBED_PORT_OFFSET=str(PORT_OFFSET),
        HPCDIST_TESTBED_SITE="strict",
        HPCDIST_TESTBED_ACCOUNTING="1",
    )
    return env


@pytest.fixture(scope="module")
def strict_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    env = _testbed_env()
    down = [str(TESTBED), "down"]
    if BASE.exists():
        subprocess.run(down, env=env, capture_output=True, timeout=120, check=False)
        shutil.rmtree(BASE)
    proc = subprocess.run(
        [str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    exports = [ln.removeprefix("export ") for ln in proc.stdout.splitlines()]
    if proc.returncode != 0 or not any(ln.startswith("SLURM_CONF=") for ln in exports):
        pytest.fail(f"the strict testbed did not start:\n{proc.stderr}", pytrace=False)
    site_env = {k: v for k, v in slurm_env().items() if k != "HPCDIST_PROFILE"}
    site_env.update(dict(shlex.split(ln)[0].split("=", 1) for ln in exports if "=" in ln))
    site_env["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    try:
        yield Site(site_env)
    finally:
        subprocess.run(down, env=env, capture_output=True, timeout=120, check=False)


def _profile(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def _table(stdout: str) -> dict[str, str]:
    """Row name -> its value (with its FAIL/WARN mark); advice lines left out."""
    rows = [ln.split("  ", 1) for ln in stdout.splitlines() if "  " in ln]
    return {name: value.strip() for name, value in rows if name}


def _advice(stdout: str, value: str) -> str:
    """The advice under the row whose value (mark included) is ``value``."""
    lines = stdout.splitlines()
    (at,) = [i for i, ln in enumerate(lines) if ln.endswith(f"  {value}")]
    return lines[at + 1].strip().removeprefix("advice: ")


def test_no_default_partition_blocks_a_job_that_names_none(
    strict_site: Site, tmp_path: Path
) -> None:
    run = strict_site.doctor(cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    table = _table(run.stdout)
    assert table["a job with no --partition"] == (
        "FAIL: the cluster has no default partition and none was given"
    )
    what = "FAIL: the cluster has no default partition and none was given"
    assert _advice(run.stdout, what) == "--partition one of batch, short, prio"
    assert run.stdout.splitlines()[-1] == "1 problem(s) block a job"


def test_the_sites_settings_are_shown(strict_site: Site, tmp_path: Path) -> None:
    table = _table(strict_site.doctor(cwd=tmp_path).stdout)
    assert table["requeue"] == (
        "JobRequeue=0: a job is requeued only if it asks (hpcdist's jobs say --requeue)"
    )
    assert table["MaxArraySize"] == "100 (array task ids 0-99)"
    assert table["GPUs"] == (
        "no GPU GRES; feature gpu on 1 node(s) (node4): GPUs only through --constraint gpu"
    )
    assert table["accounting enforces"] == "associations, limits, qos"
    assert table["your accounts"].startswith("proj") and "(default proj)" in table["your accounts"]
    assert table["your QOS"] == "high, normal (default normal)"
    assert table["partition maint"].startswith(
        "4 nodes (max all a job), time unlimited, state DOWN"
    )
    assert "time 1-00:00:00, default time 00:30:00," in table["partition batch"]
    assert "time 00:05:00, QOS none," in table["partition short"]
    assert ", QOS allowed high," in table["partition prio"]


def test_a_partition_whose_time_limit_is_below_the_profiles(
    strict_site: Site, tmp_path: Path
) -> None:
    profile = _profile(tmp_path, "long", "partition: short\nmax_time: '01:00:00'\n")
    run = strict_site.doctor("--profile", str(profile), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    what = "FAIL: max_time 01:00:00 > partition short's 00:05:00"
    assert _advice(run.stdout, what) == "set max_time to 00:05:00 or less"
    fits = _profile(tmp_path, "brief", "partition: short\nmax_time: '00:05:00'\n")
    again = strict_site.doctor("--profile", str(fits), cwd=tmp_path)
    assert again.returncode == 0, again.stdout
    assert again.stdout.splitlines()[-1] == "nothing blocks a job"


def test_a_down_partition(strict_site: Site, tmp_path: Path) -> None:
    profile = _profile(tmp_path, "maint", "partition: maint\n")
    run = strict_site.doctor("--profile", str(profile), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    what = "FAIL: partition maint is DOWN: jobs wait there and none starts"
    assert _table(run.stdout)["a job in maint"] == what
    assert _advice(run.stdout, what) == "--partition one of batch, short, prio"


def test_a_partition_that_requires_a_qos(strict_site: Site, tmp_path: Path) -> None:
    profile = _profile(tmp_path, "prio", "partition: prio\n")
    run = strict_site.doctor("--profile", str(profile), "--json", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    (problem,) = json.loads(run.stdout)["problems"]
    assert problem == {
        "item": "a job in prio",
        "status": "FAIL",
        "what": "partition prio allows QOS high only; your jobs get QOS normal by default",
        "fix": "--qos high",
    }


@pytest.fixture
def other_user() -> Iterator[tuple[int, int]]:
    """A unix user with no association at the site, removed afterwards."""
    subprocess.run(["userdel", OTHER_USER], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
        check=True,
        capture_output=True,
    )
    import pwd

    entry = pwd.getpwnam(OTHER_USER)
    try:
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", OTHER_USER], capture_output=True, check=False)


def test_a_user_without_an_account(
    strict_site: Site, other_user: tuple[int, int], tmp_path: Path
) -> None:
    uid, gid = other_user
    tmp_path.chmod(0o755)
    env = {**strict_site.env, "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", AS_USER, str(uid), str(gid), "doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert _table(run.stdout)["your accounts"] == "none"
    what = f"FAIL: user {OTHER_USER} has no account on cluster hpcdist, and the site requires one"
    assert _advice(run.stdout, what) == "ask the site admins for an account"
