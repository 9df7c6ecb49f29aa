"""A second, differently configured testbed beside the session's (GPU mode, preemption):
its own base directory and ports, no accounting (it starts in about a second), stopped again
when the test module is done. Its SLURM_CONF is set only while a test uses it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.conftest import TESTBED, run_slurm, slurm_env

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY")


@dataclass(frozen=True)
class SideBed:
    slurm_conf: Path
    exports: dict[str, str] = field(default_factory=dict)  # every line `up` printed

    @contextmanager
    def active(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        """SLURM's tools, and everything started from this process, talk to this testbed."""
        with monkeypatch.context() as patch:
            patch.setenv("SLURM_CONF", str(self.slurm_conf))
            yield


@contextmanager
def side_testbed(name: str, offset: int, **settings: str) -> Iterator[SideBed]:
    """Start testbed ``<session base>-<name>`` at the session's port offset + ``offset``."""
    base = os.environ.get("HPCDIST_TESTBED_DIR") or "/tmp/hpcdist-testbed"
    port_offset = int(os.environ.get("HPCDIST_TESTBED_PORT_OFFSET") or 0) + offset
    # The session's PREFIX and CGROUP stay; the cluster's shape is this testbed's own.
    shape = {"nodes": "2", "gpus": "0", "gpu_type": "", "partition": "", "preempt": "off"}
    env = {k: v for k, v in slurm_env().items() if k != "SLURM_CONF"}
    env.update(
        {
            "HPCDIST_TESTBED_DIR": f"{base}-{name}",
            "HPCDIST_TESTBED_PORT_OFFSET": str(port_offset),
            "HPCDIST_TESTBED_ACCOUNTING": "0",
            **{f"HPCDIST_TESTBED_{k.upper()}": v for k, v in {**shape, **settings}.items()},
        }
    )
    proc = subprocess.run(
        [str(TESTBED), "up"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    exports = [ln for ln in proc.stdout.splitlines() if ln.startswith("export SLURM_CONF=")]
    if proc.returncode != 0 or not exports:
        pytest.fail(f"testbed {name} did not start:\n{proc.stderr}", pytrace=False)
    try:
        printed = dict(
            ln.removeprefix("export ").split("=", 1)
            for ln in proc.stdout.splitlines()
            if ln.startswith("export ") and "=" in ln
        )
        yield SideBed(Path(exports[-1].split("=", 1)[1].strip()), printed)
    finally:
        subprocess.run(
            [str(TESTBED), "down"], env=env, capture_output=True, timeout=120, check=False
        )


def show_job(job_id: int) -> dict[str, str]:
    """``scontrol show job`` as a mapping (jobs stay there 2 minutes after they end)."""
    proc = run_slurm("scontrol", "show", "job", "-o", str(job_id), check=False)
    fields: dict[str, str] = {}
    for word in proc.stdout.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def wait_state(job_id: int, states: tuple[str, ...], timeout: float) -> dict[str, str]:
    """Poll scontrol until the job is in one of ``states``, releasing a requeue hold; fails at
    once when the job has ended in another state (PREEMPTED aside: requeued, it runs again)."""
    deadline = time.monotonic() + timeout
    fields: dict[str, str] = {}
    while time.monotonic() < deadline:
        fields = show_job(job_id)
        state = fields.get("JobState", "")
        if state in states:
            return fields
        if state in FINAL and state != "PREEMPTED":
            raise AssertionError(f"job {job_id} ended {state}, not in {states}: {fields}")
        if state == "PENDING" and "BeginTime" in fields.get("Reason", ""):
            time.sleep(2)  # not in the second of the requeue (see release_requeue_hold)
            run_slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not in {states} after {timeout:.0f} s: {fields}")
