"""Fixtures for tests against the real SLURM testbed started by scripts/slurm-testbed.

Every test in this folder is marked `slurm`. The cluster is started once per session and left
running afterwards (starting it takes a few seconds; other sessions may be using it). A testbed
that cannot start fails the tests: a skipped integration test would hide a broken cluster.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest

from hpcdist.jobs.records import FINAL_STATES

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTBED = REPO_ROOT / "scripts" / "slurm-testbed"
HERE = Path(__file__).resolve().parent

# Variables a job exports to everything started inside it; leaked into a new sbatch they make
# it inherit the outer job's settings.
_LEAKY_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_")

CompletedText = subprocess.CompletedProcess[str]


class JobStateFn(Protocol):
    def __call__(self, job_id: int, timeout: float = ...) -> str: ...


@dataclass(frozen=True)
class SlurmCluster:
    """The running testbed, with the helpers below bound as methods."""

    base_dir: Path
    slurm_conf: Path
    nodes: tuple[str, ...]
    partition: str

    def run(self, *argv: str, timeout: float = 60.0, check: bool = True) -> CompletedText:
        return run_slurm(*argv, timeout=timeout, check=check)

    def sbatch(
        self,
        script: str | Path,
        *args: str,
        wait: bool = True,
        timeout: float = 300.0,
        cwd: Path | None = None,
    ) -> SubmittedJob:
        return sbatch(script, *args, wait=wait, timeout=timeout, cwd=cwd)

    def job_state(self, job_id: int, timeout: float = 120.0) -> str:
        return job_state(job_id, timeout=timeout)


@dataclass(frozen=True)
class SubmittedJob:
    job_id: int
    returncode: int  # sbatch's exit code; with --wait, the job's exit code
    stdout: str
    stderr: str


def slurm_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """os.environ without inherited job variables, keeping SLURM_CONF."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LEAKY_PREFIXES)}
    if "SLURM_CONF" in os.environ:
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    env.update(extra or {})
    return env


def run_slurm(
    *argv: str, timeout: float = 60.0, check: bool = True, cwd: Path | None = None
) -> CompletedText:
    """Run a SLURM client command; on failure the error names the command and its stderr."""
    proc = subprocess.run(
        list(argv),
        env=slurm_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)!r} exited {proc.returncode}\nstdout: {proc.stdout}\n"
            f"stderr: {proc.stderr}"
        )
    return proc


_LABEL = re.compile(r"^ *\d+: ", re.M)


def unlabel(text: str) -> str:
    """A job log without srun's --label prefixes ('0: '), as the ranks printed it."""
    return _LABEL.sub("", text)


def squeue(job_id: int) -> tuple[str, str]:
    """(state, reason) of a job the controller knows, else ("", "")."""
    proc = run_slurm("squeue", "-h", "-j", str(job_id), "-o", "%T|%r", check=False)
    state, _, reason = proc.stdout.strip().partition("|")
    return state, reason


def release_requeue_hold(job_id: int) -> str:
    """Start a requeued job now rather than after SLURM's hold (BeginTime, about 120 s after
    a requeue); returns the job's state. Not at once: slurmd refuses a run whose credential
    dates from the same second as the revocation of the run before ("Job credential
    revoked", and the job ends FAILED), the race that the hold exists to avoid."""
    state, reason = squeue(job_id)
    if state == "PENDING" and "BeginTime" in reason:
        time.sleep(2)
        run_slurm("scontrol", "update", f"JobId={job_id}", "StartTime=now", check=False)
    return state


def submit_waiting(argv: list[str], cwd: Path) -> tuple[subprocess.Popen[str], int]:
    """Start `hpcdist submit ... --wait` in the background; (its process, the job id)."""
    waiter = subprocess.Popen(
        [sys.executable, "-m", "hpcdist.cli.main", "submit", *argv],
        cwd=cwd,
        env=slurm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert waiter.stdout is not None
    line = waiter.stdout.readline()
    found = re.findall(r"Submitted job (\d+)", line)
    assert found, line + (waiter.stderr.read() if waiter.stderr else "")
    return waiter, int(found[0])


def job_log(folder: Path, name: str, job_id: int | str) -> str:
    """A job's log as its script names it (``--output``'s default ``%x-%j.out``): every
    rank's labelled lines and the batch shell's, every run appended; "" before it exists."""
    path = folder / f"{name}-{job_id}.out"
    return path.read_text(errors="replace") if path.is_file() else ""


def finish_waiting(waiter: subprocess.Popen[str], job_id: int, timeout: float) -> str:
    """Let `submit --wait` run to its end, releasing requeue holds; assert it exited 0 and
    return what it printed."""
    deadline = time.monotonic() + timeout
    while waiter.poll() is None and time.monotonic() < deadline:
        release_requeue_hold(job_id)
        time.sleep(1)
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, out + err
    return out


def sbatch(
    script: str | Path,
    *args: str,
    wait: bool = True,
    timeout: float = 300.0,
    cwd: Path | None = None,
) -> SubmittedJob:
    """Submit a batch script (a path, or its text) with `sbatch --parsable [--wait]`.

    With wait=True sbatch returns when the job ends and its exit code is the job's, so a
    failing job does not raise here: check `returncode` or `job_state(job_id)`. sbatch --wait
    polls after 2 s and then every 10 s, so a job that runs 3 s returns after about 12 s.
    """
    argv = ["sbatch", "--parsable", *(["--wait"] if wait else []), *args]
    if isinstance(script, Path):
        proc = subprocess.run(
            [*argv, str(script)],
            env=slurm_env(),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    else:
        proc = subprocess.run(
            argv,
            input=script,
            env=slurm_env(),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    first = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else ""
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        raise AssertionError(
            f"sbatch {' '.join(args)} did not print a job id (exit {proc.returncode})\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return SubmittedJob(int(job_id), proc.returncode, proc.stdout, proc.stderr)


def job_state(job_id: int, timeout: float = 120.0, poll_s: float = 0.5) -> str:
    """The job's final state according to sacct ('COMPLETED', 'FAILED', 'CANCELLED', ...).

    Polls because slurmctld reports to slurmdbd asynchronously (rows can lag ~5 s behind
    the job). Raises AssertionError if the job has no final state within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last = "no sacct record"
    while True:
        proc = run_slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State", check=False)
        states = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
        if states:
            # A requeued job has one row per run; the last row is the current one.
            last = states[-1]
            base = last.split()[0]
            if base in FINAL_STATES:
                return base
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job_id} not in a final state after {timeout:.0f} s (last: {last})"
            )
        time.sleep(poll_s)


# The final states that end a wait (a preempted job may be on its way back to PENDING), and
# how long a job must have been seen ended before a wait gives up on it.
ENDED = FINAL_STATES - {"PREEMPTED"}
ENDED_GRACE_S = 3.0


def ended_state(job_id: int) -> str:
    """The job's final state once it has ended for good, else "": the controller's record
    (``scontrol show job``), or sacct's once the controller has forgotten the job. A job
    between two runs of a requeue is PENDING (or REQUEUED), never final, in both; PREEMPTED
    is left out, as a job preempted to be requeued shows it on its way back to PENDING."""
    proc = run_slurm("scontrol", "show", "job", "-o", str(job_id), check=False)
    found = re.search(r"\bJobState=(\S+)", proc.stdout)
    if found is not None:
        return found[1] if found[1] in ENDED else ""
    rows = run_slurm("sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "State", check=False)
    states = [line.split()[0] for line in rows.stdout.splitlines() if line.strip()]
    return states[-1] if states and states[-1] in ENDED else ""


def wait_until(
    ready: Callable[[], bool],
    job_id: int,
    what: str,
    timeout: float,
    log: Callable[[], str] = lambda: "",
    poll_s: float = 0.5,
) -> None:
    """Poll ``ready`` while job ``job_id`` runs. Returns once it holds; fails at once, with
    the job's final state and the tail of ``log()``, when the job has ended without it (seen
    ended twice, ENDED_GRACE_S apart, and ``ready`` asked once more: a log's last lines can
    land after the state); fails after ``timeout`` seconds, the bound for a job that hangs.
    ``job_id`` 0: no job yet (waiting for its id), so none to have ended."""
    deadline = time.monotonic() + timeout
    ended_at: float | None = None
    while not ready():
        # sacct -j 0 answers with rows of other jobs: "job 0 ended COMPLETED" once failed a
        # wait for a submission's id that took over 3 s on a loaded machine.
        state = ended_state(job_id) if job_id > 0 else ""
        now = time.monotonic()
        ended_at = (ended_at or now) if state else None
        if ended_at is not None and now - ended_at >= ENDED_GRACE_S and not ready():
            raise AssertionError(f"job {job_id} ended {state} before {what}\n{log_tail(log())}")
        if now > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {what} (job {job_id} "
                f"{state or 'not ended'})\n{log_tail(log())}"
            )
        time.sleep(poll_s)


def log_tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _exported(lines: str, names: tuple[str, ...]) -> dict[str, str]:
    """The values of ``names`` after the shell runs the ``export`` lines of `up`."""
    if not any(
        line.startswith(tuple(f"export {n}=" for n in names)) for line in lines.splitlines()
    ):
        return {}
    shown = subprocess.run(
        ["bash", "-c", 'eval "$1" && env -0', "bash", lines],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    env = dict(item.split("=", 1) for item in shown.split("\0") if "=" in item)
    return {n: env[n] for n in names if n in env and env[n] != os.environ.get(n)}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The running testbed; SLURM_CONF points at it for the whole session."""
    try:
        proc = subprocess.run(
            [str(TESTBED), "up"], capture_output=True, text=True, timeout=900, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot run {TESTBED} up: {exc}", pytrace=False)
    exports = [ln for ln in proc.stdout.splitlines() if ln.startswith("export SLURM_CONF=")]
    if proc.returncode != 0 or not exports:
        pytest.fail(
            f"SLURM testbed did not start ({TESTBED} up exited {proc.returncode}):\n"
            f"{proc.stderr}{proc.stdout}",
            pytrace=False,
        )
    slurm_conf = Path(exports[-1].split("=", 1)[1].strip())
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(slurm_conf)
    # A SLURM release of the testbed's own (HPCDIST_TESTBED_SLURM=24.11, a prefix) also puts its
    # tools first on PATH: the system's SLURM must not talk to that controller.
    os.environ.update(_exported(proc.stdout, ("PATH", "LD_LIBRARY_PATH")))
    try:
        yield SlurmCluster(
            base_dir=slurm_conf.parent.parent,
            slurm_conf=slurm_conf,
            nodes=("node1", "node2", "node3", "node4"),
            partition="debug",
        )
    finally:
        # The cluster stays up for the next session; only our environment is restored.
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


@pytest.fixture(autouse=True)
def testbed_up(slurm_cluster: SlurmCluster) -> None:
    """Before every test: `up` again, which returns at once (about 0.2 s) when every daemon
    runs and every node is usable, and otherwise starts what is missing. A SLURM daemon
    that dies during one test (slurmd once crashed here while launching two jobs at once)
    then fails that test only, not every test after it; the restart is reported."""
    proc = subprocess.run(
        [str(TESTBED), "up"], capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"SLURM testbed is down and did not restart ({TESTBED} up exited "
            f"{proc.returncode}):\n{proc.stderr}",
            pytrace=False,
        )
    if "cluster already up" not in proc.stderr:
        warnings.warn(
            f"the SLURM testbed was not healthy before this test and was "
            f"restarted:\n{proc.stderr.strip()}",
            stacklevel=1,
        )


@pytest.fixture(name="job_state")
def job_state_fixture(slurm_cluster: SlurmCluster) -> JobStateFn:
    """`job_state(job_id, timeout=120.0) -> str`, with the cluster guaranteed up."""
    return job_state


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees every collected item of the session, not only this folder's.
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.slurm)
