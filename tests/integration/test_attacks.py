"""A second, unprivileged user attacks the victim's jobs on the testbed; every attack fails
with one clear line.

The victim is root (the testbed runs each job as its submitter); the attacker is a local
user created for this module and removed after it, acting through
``tests/integration/attacker.py``. The victim works in a shared project folder that the
attacker can write (mode 0777, as a group-writable project folder is for its group): what
the attacker may do there, it does. The victim's own checks compare owners with the
current user, so root gets no pass from them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpcdist.distributed.protocol import derive_port
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import REPO_ROOT, SlurmCluster, run_slurm, sbatch, slurm_env

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
ATTACKER_NAME = "hpcatk-sec"


@dataclass(frozen=True)
class Attacker:
    name: str
    uid: int
    gid: int

    def argv(self, action: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "tests.integration.attacker", action, *args]

    def env(self) -> dict[str, str]:
        env = slurm_env({"ATTACKER_UID": str(self.uid), "ATTACKER_GID": str(self.gid)})
        env["PYTHONPATH"] = str(REPO_ROOT)
        env["GLOO_SOCKET_IFNAME"] = "lo"
        return env

    def run(self, action: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(action, *args),
            cwd=REPO_ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, action: str, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(action, *args),
            cwd=REPO_ROOT,
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(scope="module")
def attacker() -> Iterator[Attacker]:
    """A fresh unprivileged local user, removed afterwards."""
    subprocess.run(["userdel", ATTACKER_NAME], capture_output=True, check=False)
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER_NAME],
        check=True,
        capture_output=True,
    )
    import pwd

    entry = pwd.getpwnam(ATTACKER_NAME)
    try:
        yield Attacker(ATTACKER_NAME, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", ATTACKER_NAME], capture_output=True, check=False)


@pytest.fixture
def project() -> Iterator[Path]:
    """The shared project folder: the victim works here, the attacker can write here."""
    folder = Path(tempfile.mkdtemp(prefix="hpcdist-shared-", dir="/tmp"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def hpcdist(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HPCDIST, *args],
        cwd=cwd,
        env=slurm_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    return lines[0]


def _script(project: Path, name: str, mode: str, command: str, nodes: int = 1) -> Path:
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": mode,
            "nodes": nodes,
            "cpus_per_task": 1,
            "job_name": name,
            "time": "5:00",
            "command": command,
        }
    )
    script = project / f"{name}.sh"
    script.write_text(render(spec))
    return script


def _log(project: Path, name: str, job_id: int) -> str:
    path = project / f"{name}-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def _held(project: Path, script: Path) -> int:
    return sbatch(script, "--hold", wait=False, cwd=project).job_id


def _release_and_wait(job_id: int, job_state_timeout: float = 120) -> str:
    from tests.integration.conftest import job_state

    run_slurm("scontrol", "release", str(job_id))
    return job_state(job_id, timeout=job_state_timeout)


# ------------------------------------------------------------------ pickle replacement


def test_pickle_replacement_submitit_folder_of_another_user_is_refused(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    # The attacker prepares a world-writable submitit folder for the victim's next job.
    assert attacker.run("mkdir", str(project / ".hpcdist" / "submitit")).returncode == 0
    proc = hpcdist("submit", "--mode", "threads", "--command", "true", cwd=project)
    line = one_line(proc)
    assert f"{project / '.hpcdist'}" in line and f"uid {attacker.uid} ({attacker.name})" in line
    assert "HPCDIST_HOME" in line  # how to fix it
    assert list((project / ".hpcdist" / "submitit").iterdir()) == []  # no pickle written


def test_pickle_replacement_in_the_victims_own_folder_is_denied(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    proc = hpcdist("submit", "--mode", "threads", "--command", "true", cwd=project)
    assert proc.returncode == 0, proc.stderr
    # The shared folder itself could have .hpcdist renamed away: submit says so.
    assert f"hpcdist: warning: {project} is writable by others" in proc.stderr
    job_id = re.findall(r"Submitted job (\d+)", proc.stdout)[0]
    folder = project / ".hpcdist" / "submitit" / job_id
    pickles = list(folder.glob("*.pkl"))
    assert pickles
    assert {oct(p.stat().st_mode & 0o777) for p in pickles} == {"0o600"}
    for level in (project / ".hpcdist", project / ".hpcdist" / "submitit", folder):
        assert level.stat().st_mode & 0o777 == 0o700, level
    secrets = list((project / ".hpcdist" / "secrets").iterdir())
    assert secrets and all(s.stat().st_mode & 0o777 == 0o600 for s in secrets)
    # The attacker can neither replace the pickle nor read the job's --env values.
    replaced = attacker.run("write", str(pickles[0]), "cos\nsystem\n(S'id'\ntR.")
    assert replaced.returncode == 13, replaced.stdout
    read = attacker.run("read", str(pickles[0]))
    assert read.returncode == 13, read.stdout
    run_slurm("scancel", job_id, check=False)


# ------------------------------------------------------------------ planted checkpoint


CONFIG = "data: {mask: ocean}\ntraining: {epochs: 1, lr: 1.0e-3, early_stopping_patience: 0}\n"


def test_planted_checkpoint_in_a_run_folder_of_another_user_fails_the_job(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    (project / "cfg.yaml").write_text(CONFIG)
    script = _script(project, "victim", "threads", "python3 -m ufsemulator train --config cfg.yaml")
    job_id = _held(project, script)
    # Job ids are public: the attacker plants runs/<job id>/checkpoint.pt before it starts.
    run_dir = project / "runs" / str(job_id)
    assert attacker.run("mkdir", str(run_dir)).returncode == 0
    assert attacker.run("write", str(run_dir / "checkpoint.pt"), "planted").returncode == 0
    assert _release_and_wait(job_id) == "FAILED"
    log = _log(project, "victim", job_id)
    assert f"run folder '{run_dir}' is owned by uid {attacker.uid}" in log, log
    assert "refusing to write or resume there" in log
    assert "Training completed" not in log


def test_checkpoint_changed_in_place_is_not_resumed(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    """The victim's own run folder, with a checkpoint its loose umask left writable: the
    attacker rewrites its bytes; the digest in the private state tells, and the run starts
    fresh instead of resuming the attacker's model."""
    from hpcdist.state.digests import DigestBook

    (project / "cfg.yaml").write_text(CONFIG)
    run_dir = project / "runs" / "mine"
    run_dir.mkdir(parents=True)
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(b"the victim's checkpoint")
    book = DigestBook(project / ".hpcdist" / "digests", project / ".hpcdist")
    from hpcdist.state.digests import sha256_file

    book.settle(checkpoint, sha256_file(checkpoint))  # as the victim's writer records it
    checkpoint.chmod(0o666)
    planted = project / "planted.bin"
    planted.write_bytes(b"the attacker's model")
    assert attacker.run("overwrite", str(checkpoint), str(planted)).returncode == 0
    command = "python3 -m ufsemulator train --config cfg.yaml --run-dir runs/mine"
    job = sbatch(_script(project, "victim2", "threads", command), cwd=project, timeout=240)
    log = _log(project, "victim2", job.job_id)
    assert job.returncode == 0, log
    assert "Not resuming runs/mine/checkpoint.pt: its SHA-256" in log, log
    assert "differs from the recorded" in log and "starting fresh" in log
    assert "Training completed" in log


# ------------------------------------------------------------ the rendezvous


VICTIM = """\
import os, time
from hpcdist.distributed import cleanup_distributed, resolve_env, setup_distributed
env = resolve_env(os.environ)
if env.rank == 0:
    print(f"VICTIM PORT {env.master_port}", flush=True)
else:
    time.sleep(20)  # a slow rank: the stranger comes first
ctx = setup_distributed(40)
import torch, torch.distributed as dist
weights = torch.full((3,), 7.0)
dist.all_reduce(weights)
print("EXCHANGED", weights.tolist(), flush=True)
cleanup_distributed()
"""


def test_stranger_joining_the_rendezvous_with_the_right_port_fails_the_job(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    (project / "victim.py").write_text(VICTIM)
    script = _script(project, "rdzv", "gloo", f"{sys.executable} victim.py", nodes=2)
    job = sbatch(script, wait=False, cwd=project)
    deadline = time.monotonic() + 60
    port = None
    while port is None and time.monotonic() < deadline:
        found = re.findall(r"VICTIM PORT (\d+)", _log(project, "rdzv", job.job_id))
        port = int(found[0]) if found else None
        time.sleep(0.2)
    assert port is not None, _log(project, "rdzv", job.job_id)
    # The port is the secret's, not the one the public job id gives.
    assert port not in {derive_port(job.job_id, step) for step in range(3)}
    stranger = attacker.start("join", str(port))
    try:
        from tests.integration.conftest import job_state

        state = job_state(job.job_id, timeout=90)
    finally:
        stranger.kill()
        said = stranger.communicate(timeout=30)[0]
    log = _log(project, "rdzv", job.job_id)
    assert state == "FAILED", log
    assert "rank(s) 1 did not prove that they hold this job's secret" in log, log + said
    assert "EXCHANGED" not in log
    assert "attacker received" not in said


def test_squatting_the_ports_of_the_job_id_does_not_stop_the_job(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    command = f"{sys.executable} -m hpcdist.distributed.commcheck --timeout 40"
    script = _script(project, "squat", "gloo", command, nodes=2)
    job_id = _held(project, script)
    # Every port that the public job id would have given its first steps.
    ports = sorted({str(derive_port(job_id, step)) for step in range(3)})
    squatter = attacker.start("listen", *ports)
    try:
        assert squatter.stdout is not None
        assert "listening on" in squatter.stdout.readline()
        state = _release_and_wait(job_id)
    finally:
        squatter.send_signal(signal.SIGKILL)
        squatter.wait(timeout=30)
    log = _log(project, "squat", job_id)
    assert state == "COMPLETED", log
    assert "PASS" in log


# ------------------------------------------------------- marker, record, profile


def test_symlinked_requeue_marker_in_a_planted_state_folder_is_refused(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    victim_file = project / "victim-owned.txt"
    victim_file.write_text("precious\n")
    victim_file.chmod(0o644)
    script = _script(project, "marker", "threads", "true")
    job_id = _held(project, script)
    requeue = project / ".hpcdist" / "requeue"
    assert attacker.run("mkdir", str(requeue)).returncode == 0
    link = requeue / str(job_id)
    assert attacker.run("symlink", str(victim_file), str(link)).returncode == 0
    assert _release_and_wait(job_id) == "FAILED"
    log = _log(project, "marker", job_id)
    assert f"hpcdist: refusing {project / '.hpcdist'}: owned by {attacker.name}" in log, log
    assert victim_file.read_text() == "precious\n"


def test_forged_job_record_cannot_make_cancel_kill_a_process(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    from hpcdist.jobs.localjob import identify

    victim = subprocess.Popen(["sleep", "120"])
    try:
        identity = identify(victim.pid)
        assert identity is not None
        jobs = project / ".hpcdist" / "jobs"
        assert attacker.run("mkdir", str(jobs)).returncode == 0
        forged = (
            f'{{"job_id": "{victim.pid}", "executor": "local", "name": "x", "mode": "gloo", '
            f'"nodes": 1, "tasks": 1, "folder": "{project}", "submitted": 0, "command": [], '
            f'"start_ticks": {identity.start_ticks}}}'
        )
        assert attacker.run("write", str(jobs / f"{victim.pid}.json"), forged).returncode == 0
        line = one_line(hpcdist("cancel", str(victim.pid), cwd=project))
        assert f"{project / '.hpcdist'}" in line and f"uid {attacker.uid}" in line
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_foreign_profile_is_refused_unless_trusted(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    profile = project / "site.yaml"
    setup = "setup: ['touch /tmp/pwned-by-profile']\n"
    assert attacker.run("write", str(profile), setup).returncode == 0
    line = one_line(hpcdist("render", "--profile", "./site.yaml", cwd=project))
    assert f"profile '{profile}' is owned by uid {attacker.uid}" in line
    assert "--trust-profile" in line
    line = one_line(hpcdist("render", cwd=project, env={"HPCDIST_PROFILE": str(profile)}))
    assert f"uid {attacker.uid}" in line
    # A bare name is never the current folder's file.
    line = one_line(hpcdist("render", "--profile", "site.yaml", cwd=project))
    assert "is not a shipped profile" in line and "write ./site.yaml" in line
    trusted = hpcdist("render", "--profile", "./site.yaml", "--trust-profile", cwd=project)
    assert trusted.returncode == 0, trusted.stderr
    assert f"profile site ({profile})" in trusted.stdout  # the header names the file
    assert "touch /tmp/pwned-by-profile" in trusted.stdout
    assert not os.path.exists("/tmp/pwned-by-profile")
