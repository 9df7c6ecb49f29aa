"""A testbed shaped like a real site (scripts/slurm-testbed with HPCDIST_TESTBED_NETNS=1,
MGMT=1, SITE=strict and a 2x8x2 layout): every node in network namespaces of its own, so a job
bound to the loopback interface fails across nodes as it does on a real cluster, a management
interface that reaches no other node, and a site's policies. One testbed of its own (port
offset 2700, beside every worker's), started once for the module and removed after it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import TESTBED, slurm_env
from tests.integration.sidebed import FINAL

# On one xdist worker: the module's testbed is made once.
pytestmark = pytest.mark.xdist_group("netns")

# Above every worker's testbeds (0-2495, tests/conftest.py), below the jobs' rendezvous ports.
OFFSET = 2700
SUBNET = "10.138.140"  # 10.<128 + 2700 // 256>.<2700 % 256>
MGMT_SUBNET = "10.202.140"  # 10.<192 + 2700 // 256>.<2700 % 256>
NODES = ("node1", "node2", "node3", "node4")
SHAPE = {
    "NETNS": "1",
    "MGMT": "1",
    "SITE": "strict",
    "SOCKETS": "2",
    "CORES_PER_SOCKET": "8",
    "THREADS_PER_CORE": "2",
    "NODES": "4",
}
# The session's SLURM build and cgroup mode stay; the cluster's shape is this module's own.
KEPT = ("PREFIX", "SLURM", "CGROUP", "CACHE")

Completed = subprocess.CompletedProcess[str]


@dataclass(frozen=True)
class NetBed:
    env: dict[str, str]

    def run(self, *argv: str, check: bool = True, timeout: float = 120.0) -> Completed:
        proc = subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stderr}{proc.stdout}")
        return proc

    def submit(self, script: Path, *args: str) -> int:
        out = self.run("sbatch", "--parsable", "-p", "batch", "--time=2", *args, str(script))
        return int(out.stdout.strip().split(";")[0])

    def finish(self, job_id: int, timeout: float = 180.0) -> str:
        """The job's final state, as soon as it has one."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = self.run("scontrol", "show", "job", "-o", str(job_id), check=False).stdout
            found = re.search(r"\bJobState=(\S+)", out)
            state = found[1] if found else ""
            if state in FINAL:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not finished after {timeout:.0f} s: {state}")


def _testbed_env() -> dict[str, str]:
    base = os.environ.get("HPCDIST_TESTBED_DIR") or "/tmp/hpcdist-testbed"
    env = {
        k: v
        for k, v in slurm_env().items()
        if k != "SLURM_CONF"
        and (not k.startswith("HPCDIST_TESTBED_") or k.removeprefix("HPCDIST_TESTBED_") in KEPT)
    }
    env["HPCDIST_TESTBED_DIR"] = f"{base}-netns"
    env["HPCDIST_TESTBED_PORT_OFFSET"] = str(OFFSET)
    env.update({f"HPCDIST_TESTBED_{k}": v for k, v in SHAPE.items()})
    return env


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"hd{OFFSET}-")]


@pytest.fixture(scope="module")
def bed() -> Iterator[NetBed]:
    env = _testbed_env()
    up = subprocess.run(
        [str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    exports = [ln for ln in up.stdout.splitlines() if ln.startswith("export SLURM_CONF=")]
    if up.returncode != 0 or not exports:
        subprocess.run([str(TESTBED), "down"], env=env, capture_output=True, timeout=120)
        pytest.fail(f"the namespaced testbed did not start:\n{up.stderr}", pytrace=False)
    job_env = {k: v for k, v in env.items() if not k.startswith("HPCDIST_TESTBED_")}
    job_env["SLURM_CONF"] = exports[-1].split("=", 1)[1].strip()
    try:
        yield NetBed(job_env)
    finally:
        subprocess.run([str(TESTBED), "down"], env=env, capture_output=True, timeout=120)
    left = _namespaces()
    assert not left, f"`down` left namespaces {left}"


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\nset -euo pipefail\n{body}")
    return path


# ---------------------------------------------------------------- nodes of their own


def test_four_nodes_have_four_addresses_their_names_resolve_to(bed: NetBed) -> None:
    out = bed.run(
        "srun",
        "-p",
        "batch",
        "-N4",
        "--ntasks-per-node=1",
        "--time=1",
        "bash",
        "-c",
        'echo "$SLURMD_NODENAME $(hostname) $(getent hosts "$(hostname)" | cut -d" " -f1)'
        " $(ip -4 -o addr show dev hsn0 | awk '{print $4}')\"",
    ).stdout
    rows = sorted(line.split() for line in out.splitlines())
    assert rows == [
        [node, node, f"{SUBNET}.{10 + k}", f"{SUBNET}.{10 + k}/24"]
        for k, node in enumerate(NODES, start=1)
    ]


def test_a_four_node_batch_job_expands_its_nodes_runs_a_step_and_reads_sacct(
    bed: NetBed, tmp_path: Path
) -> None:
    out, step = tmp_path / "job.out", tmp_path / "step.sh"
    step.write_text("echo step $(ip -4 -o addr show dev hsn0 | awk '{print $4}')\n")
    script = _script(
        tmp_path,
        'scontrol show hostnames "$SLURM_JOB_NODELIST" | tr "\\n" " "; echo\n'
        f"srun --ntasks-per-node=1 bash {step}\n"
        'sacct -X -n -P -j "$SLURM_JOB_ID" -o JobID,State\n',
    )
    job = bed.submit(script, "-N4", f"--output={out}")
    assert bed.finish(job) == "COMPLETED", out.read_text()
    lines = out.read_text().splitlines()
    assert lines[0].split() == list(NODES)
    steps = sorted(line.split()[1] for line in lines if line.startswith("step "))
    assert steps == [f"{SUBNET}.{10 + k}/24" for k in range(1, 5)]
    # sacct inside a job, in a node's namespace, reaches slurmdbd at the bridge's address
    # (the job's state there may still lag behind: PENDING or RUNNING).
    assert [line.split("|")[0] for line in lines if "|" in line] == [str(job)], lines


# ---------------------------------------------------------------- a job bound to loopback

GLOO = """\
import os, sys
from datetime import timedelta
import torch
import torch.distributed as dist

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
try:
    dist.init_process_group(
        "gloo", init_method=f"tcp://{sys.argv[1]}:29500", rank=rank, world_size=world,
        timeout=timedelta(seconds=20),
    )
    x = torch.ones(1) * (rank + 1)
    dist.all_reduce(x)
    print(f"rank {rank} sum {x.item():.0f}", flush=True)
    dist.destroy_process_group()
except Exception as exc:
    print(f"rank {rank} FAILED {type(exc).__name__}", flush=True)
    sys.exit(3)
"""


def _gloo_job(bed: NetBed, tmp_path: Path, ifname: str | None) -> tuple[str, str]:
    (tmp_path / "gloo.py").write_text(GLOO)
    pin = f"export GLOO_SOCKET_IFNAME={ifname}\n" if ifname else "unset GLOO_SOCKET_IFNAME\n"
    # -K: the step ends when a rank fails, rather than when the other's connect times out.
    script = _script(
        tmp_path,
        pin + 'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)\n'
        f'srun -K {sys.executable} {tmp_path / "gloo.py"} "$first"\n',
    )
    out = tmp_path / "gloo.out"
    job = bed.submit(script, "-N2", "--ntasks-per-node=1", f"--output={out}")
    return bed.finish(job), out.read_text()


def test_gloo_bound_to_loopback_fails_across_two_nodes(bed: NetBed, tmp_path: Path) -> None:
    state, log = _gloo_job(bed, tmp_path, "lo")
    assert state == "FAILED", log
    assert "FAILED RuntimeError" in log, log
    assert " sum " not in log, log


@pytest.mark.parametrize("ifname", [None, "hsn0"], ids=["unpinned", "hsn0"])
def test_gloo_unpinned_or_on_the_nodes_interface_sums_across_two_nodes(
    bed: NetBed, tmp_path: Path, ifname: str | None
) -> None:
    state, log = _gloo_job(bed, tmp_path, ifname)
    assert state == "COMPLETED", log
    assert sorted(re.findall(r"rank (\d) sum (\d)", log)) == [("0", "3"), ("1", "3")], log


# ---------------------------------------------------------------- the management network

PROBE = """\
import os, socket, sys, time

data, mgmt, peer_data, peer_mgmt, done = sys.argv[1:6]
if os.environ["SLURM_PROCID"] == "1":
    server = socket.create_server(("0.0.0.0", 29600))
    server.settimeout(1)
    while not os.path.exists(done):
        try:
            server.accept()[0].close()
        except TimeoutError:
            pass
    sys.exit(0)


def reach(target, source=None):
    try:
        socket.create_connection((target, 29600), timeout=4, source_address=source).close()
        return "reached"
    except OSError as exc:
        return f"unreachable ({exc})"


deadline = time.monotonic() + 60
while reach(peer_data) != "reached" and time.monotonic() < deadline:
    time.sleep(0.5)
print("data", reach(peer_data), flush=True)
print("mgmt", reach(peer_mgmt), flush=True)
print("mgmt-to-data", reach(peer_data, (mgmt, 0)), flush=True)
open(done, "w").close()
"""


def test_the_management_interface_reaches_no_other_node(bed: NetBed, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    addresses = f"{SUBNET}.11 {MGMT_SUBNET}.11 {SUBNET}.12 {MGMT_SUBNET}.12"
    script = _script(
        tmp_path,
        "ip -4 -o addr show dev eth0 | awk '{print \"eth0\", $4}'\n"
        f"srun -K -w node1,node2 {sys.executable} {tmp_path / 'probe.py'} {addresses} "
        f"{tmp_path / 'done'}\n",
    )
    out = tmp_path / "probe.out"
    job = bed.submit(script, "-w", "node1,node2", "--ntasks-per-node=1", f"--output={out}")
    assert bed.finish(job) == "COMPLETED", out.read_text()
    results = dict(line.split(" ", 1) for line in out.read_text().splitlines())
    assert results["eth0"] == f"{MGMT_SUBNET}.11/24"
    assert results["data"] == "reached"
    assert results["mgmt"].startswith("unreachable"), results
    assert results["mgmt-to-data"].startswith("unreachable"), results


# ---------------------------------------------------------------- layout and site policies


def test_nodes_show_the_declared_layout_and_a_job_takes_all_32_cpus(bed: NetBed) -> None:
    node = bed.run("scontrol", "show", "node", "node1").stdout
    for field in ("CPUTot=32", "Sockets=2", "CoresPerSocket=8", "ThreadsPerCore=2"):
        assert field in node.split(), node
    out = bed.run(
        "srun", "-p", "batch", "-N1", "--cpus-per-task=32", "--time=1",
        "bash", "-c", 'echo "$SLURM_CPUS_PER_TASK"',
    ).stdout  # fmt: skip
    assert out.split() == ["32"]
    refused = bed.run("srun", "-p", "batch", "-N1", "--cpus-per-task=33", "true", check=False)
    assert refused.returncode != 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "No partition specified or system default partition"),
        (("-p", "short", "--time=10"), "Requested time limit is invalid"),
        (("-p", "prio"), "Invalid qos specification"),
        (("-p", "batch", "--array=0-100"), "Invalid job array specification"),
        (("-p", "batch", "--qos=nosuch"), "Invalid qos specification"),
    ],
    ids=["no-partition", "short-over-5-min", "prio-without-high", "array-101", "unknown-qos"],
)
def test_a_strict_site_refuses_at_submission(
    bed: NetBed, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    proc = bed.run("sbatch", *args, "-o", str(tmp_path / "x.out"), "--wrap", "true", check=False)
    assert proc.returncode == 1, proc.stdout
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [("-p", "short", "--time=5"), ("-p", "prio", "--qos=high"), ("-p", "batch", "--array=0-99")],
    ids=["short-5-min", "prio-with-high", "array-100"],
)
def test_a_strict_site_takes_what_is_within_its_limits(
    bed: NetBed, tmp_path: Path, args: tuple[str, ...]
) -> None:
    proc = bed.run("sbatch", "--test-only", *args, "-o", str(tmp_path / "x.out"), "--wrap", "true")
    assert "to start at" in proc.stderr, proc.stderr


def test_a_strict_site_holds_maint_jobs_keeps_no_requeue_and_gpus_on_the_last_node(
    bed: NetBed, tmp_path: Path
) -> None:
    held = bed.run("sbatch", "--parsable", "-p", "maint", "-o", "/dev/null", "--wrap", "true")
    held_id = held.stdout.strip()
    reason: list[str] = []
    deadline = time.monotonic() + 60
    while reason != ["PENDING", "PartitionDown"] and time.monotonic() < deadline:
        time.sleep(0.5)  # the scheduler gives the reason on its first look at the job
        reason = bed.run("squeue", "-h", "-j", held_id, "-o", "%T %r").stdout.split()
    bed.run("scancel", held_id)
    assert reason == ["PENDING", "PartitionDown"]
    config = bed.run("scontrol", "show", "config").stdout
    assert re.search(r"^JobRequeue\s+=\s+0$", config, re.M), config
    out = tmp_path / "gpu.out"
    job = bed.submit(_script(tmp_path, 'echo "$SLURMD_NODENAME"\n'), "--constraint=gpu", f"-o{out}")
    assert bed.finish(job) == "COMPLETED"
    assert out.read_text().split() == ["node4"]
