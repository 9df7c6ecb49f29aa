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

from hpcdist.facts.protocol import derive_port
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.statehome import private_state_root
from tests.integration.conftest import REPO_ROOT, SlurmCluster, run_slurm, sbatch, slurm_env

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
# One user per parallel worker (tests/conftest.py): two workers' modules would otherwise add
# and remove the same user under each other.
ATTACKER_NAME = "hpcatk-sec" + os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")


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
        # The shared folder's private state lives in the victim's own state folder.
        shutil.rmtree(private_state_root(folder), ignore_errors=True)


@pytest.fixture
def home() -> Iterator[Path]:
    """The victim's own working folder (0700 in the sticky /tmp): nobody else can write it
    or rename it away, so a job may run there."""
    folder = Path(tempfile.mkdtemp(prefix="hpcdist-victim-", dir="/tmp"))
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


def _roots(project: Path) -> str:
    """The shared folder named as a root the victim trusts: its run folders below it are
    walked from it (any folder that others can write is refused unless so named)."""
    return f"--export=ALL,HPCDIST_RUN_ROOTS={project}"


def _release_and_wait(job_id: int, job_state_timeout: float = 120) -> str:
    from tests.integration.conftest import job_state

    run_slurm("scontrol", "release", str(job_id))
    return job_state(job_id, timeout=job_state_timeout)


# ------------------------------------------------------------------ the queued script


def test_a_submit_from_the_shared_folder_is_refused_and_uses_nothing_planted_there(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    # The attacker prepares a world-writable submitit folder for the victim's next job.
    assert attacker.run("mkdir", str(project / ".hpcdist" / "submitit")).returncode == 0
    proc = hpcdist("submit", "--mode", "threads", "--command", "true", cwd=project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"hpcdist: error: the job's working folder '{project}' can be written")
    assert "Submitted job" not in proc.stdout
    assert list((project / ".hpcdist" / "submitit").iterdir()) == []  # nothing written there


def test_the_queued_script_in_the_victims_own_folder_is_private(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    proc = hpcdist(
        "submit", "--mode", "threads", "--env", "TOKEN=s3cret", "--command", "true", cwd=home
    )
    assert proc.returncode == 0, proc.stderr
    job_id = re.findall(r"Submitted job (\d+)", proc.stdout)[0]
    root = home / ".hpcdist"
    folder = root / "submitit" / job_id
    queued = folder / f"{job_id}_submission.sh"
    assert "export TOKEN=s3cret" in queued.read_text()
    assert oct(queued.stat().st_mode & 0o777) == "0o600"
    for level in (root, root / "submitit", folder):
        assert level.stat().st_mode & 0o777 == 0o700, level
    # The attacker can neither change the copy of the script nor read the job's --env values.
    replaced = attacker.run("write", str(queued), "#!/bin/bash\nid\n")
    assert replaced.returncode == 13, replaced.stdout
    read = attacker.run("read", str(queued))
    assert read.returncode == 13, read.stdout
    # SLURM runs its own copy of the script: the one render prints.
    held = run_slurm("scontrol", "write", "batch_script", job_id, "-", check=False).stdout
    assert held in ("", queued.read_text())  # empty once the job has ended
    run_slurm("scancel", job_id, check=False)


# ------------------------------------------------------------------ planted checkpoint


CONFIG = "data: {mask: ocean}\ntraining: {epochs: 1, lr: 1.0e-3, early_stopping_patience: 0}\n"


def test_planted_checkpoint_in_a_run_folder_of_another_user_fails_the_job(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    (home / "cfg.yaml").write_text(CONFIG)
    run_dir = project / "runs" / "victim"  # the victim's run folder, in the shared folder
    command = f"python3 -m ufsemulator train --config cfg.yaml --run-dir {run_dir}"
    script = _script(home, "victim", "threads", command)
    job_id = sbatch(script, "--hold", _roots(project), wait=False, cwd=home).job_id
    # The attacker plants runs/victim/checkpoint.pt before the job starts.
    assert attacker.run("mkdir", str(run_dir)).returncode == 0
    assert attacker.run("write", str(run_dir / "checkpoint.pt"), "planted").returncode == 0
    assert _release_and_wait(job_id) == "FAILED"
    log = _log(home, "victim", job_id)
    # runs/ is the attacker's (made with runs/victim): refused before anything is read.
    assert f"run folder '{run_dir.parent}' is owned by uid {attacker.uid}" in log, log
    assert "refusing to write or resume there" in log
    assert "Training completed" not in log


def test_checkpoint_changed_in_place_is_not_resumed(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    """The victim's own run folder, with a checkpoint its loose umask left writable: the
    attacker rewrites its bytes; the digest in the private state tells, and the run starts
    fresh instead of resuming the attacker's model."""
    from hpcdist.state.digests import DigestBook

    (home / "cfg.yaml").write_text(CONFIG)
    run_dir = project / "runs" / "mine"
    run_dir.mkdir(parents=True)
    checkpoint = run_dir / "checkpoint.pt"
    checkpoint.write_bytes(b"the victim's checkpoint")
    root = home / ".hpcdist"  # the working folder's private state
    book = DigestBook(root / "digests", root)
    from hpcdist.state.digests import sha256_file

    book.settle(checkpoint, sha256_file(checkpoint))  # as the victim's writer records it
    checkpoint.chmod(0o666)
    planted = project / "planted.bin"
    planted.write_bytes(b"the attacker's model")
    assert attacker.run("overwrite", str(checkpoint), str(planted)).returncode == 0
    checkpoint.chmod(0o644)  # the mode fixed; the bytes are still the attacker's
    command = f"python3 -m ufsemulator train --config cfg.yaml --run-dir {run_dir}"
    script = _script(home, "victim2", "threads", command)
    job = sbatch(script, _roots(project), cwd=home, timeout=240)
    log = _log(home, "victim2", job.job_id)
    assert job.returncode == 0, log
    assert f"Not resuming {checkpoint}: its SHA-256" in log, log
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
    time.sleep(20)  # a slow rank: the strangers come first
start = time.monotonic()
ctx = setup_distributed(40)
import torch, torch.distributed as dist
weights = torch.full((3,), 7.0)
dist.all_reduce(weights)
took = time.monotonic() - start
print("EXCHANGED", weights.tolist(), f"rank {env.rank} joined in {took:.1f} s", flush=True)
cleanup_distributed()
"""


def test_strangers_joining_the_rendezvous_with_the_right_port_cost_the_job_nothing(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    project = home  # the job's working folder is the victim's own
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
    public = {derive_port(job.job_id, step): step for step in range(3)}
    if port in public:  # once in CI (27284, the job id's step 2): say all that is known
        asked = ("sacct", "-j", str(job.job_id), "-n", "-P", "-o", "JobID,State,Start")
        steps = run_slurm(*asked, check=False)
        raise AssertionError(
            f"port {port} is the job id's for step {public[port]}\n"
            f"{_log(project, 'rdzv', job.job_id)}\n{steps.stdout}"
        )
    # Three strangers join as rank 1 before the real rank 1 comes (it sleeps 20 s).
    strangers = [attacker.start("join", str(port)) for _ in range(3)]
    try:
        from tests.integration.conftest import job_state

        state = job_state(job.job_id, timeout=90)
    finally:
        said = ""
        for stranger in strangers:
            stranger.kill()
            said += stranger.communicate(timeout=30)[0]
    log = _log(project, "rdzv", job.job_id)
    assert state == "COMPLETED", log + said
    # The real ranks met and exchanged (7 + 7); the late rank did not wait out its 40 s setup
    # timeout behind a stranger holding its place (how fast it joined is the machine's load).
    joined = re.findall(r"EXCHANGED \[14.0, 14.0, 14.0\] rank 1 joined in ([0-9.]+) s", log)
    assert len(joined) == 1 and float(joined[0]) < 40, log
    assert "attacker joined" not in said and "attacker received" not in said, said


def test_squatting_the_ports_of_the_job_id_does_not_stop_the_job(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    project = home  # the job's working folder is the victim's own
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


def test_symlinked_requeue_marker_in_a_planted_state_folder_is_never_used(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    victim_file = project / "victim-owned.txt"
    victim_file.write_text("precious\n")
    victim_file.chmod(0o644)
    script = _script(project, "marker", "threads", "true")
    # Submitted from the shared folder (its state is what is attacked), run in the victim's.
    job_id = sbatch(script, "--hold", f"--chdir={home}", wait=False, cwd=project).job_id
    requeue = project / ".hpcdist" / "requeue"
    assert attacker.run("mkdir", str(requeue)).returncode == 0
    link = requeue / str(job_id)
    assert attacker.run("symlink", str(victim_file), str(link)).returncode == 0
    assert _release_and_wait(job_id) == "COMPLETED"
    log = _log(home, "marker", job_id)
    # The script keeps its state in the victim's own state folder, as submit does.
    assert f"hpcdist: note: '{project}' can be written by others (owner root, mode 0777)" in log
    assert str(private_state_root(project)) in log
    assert victim_file.read_text() == "precious\n"
    assert link.is_symlink()  # never followed, never removed


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
        # The shared folder's records are the victim's own state folder's: the forged one
        # is not even read.
        assert (
            f"job '{victim.pid}' was not submitted from this folder and SLURM does not know it"
            in line
        )
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()


def test_a_job_that_spells_the_victims_id_is_not_in_the_victims_view(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    from hpcdist.slurm.userjobs import parse_rows

    # scontrol prints a job's name and command unquoted: this one's command line spells the
    # victim's UserId and a final state after the real ones, its name before them.
    lie = [f"UserId=root({os.getuid()})", "JobState=COMPLETED"]
    queued = attacker.run("sbatch", " ".join(["x", *lie]), *lie)
    assert queued.returncode == 0, queued.stdout
    job = queued.stdout.splitlines()[0].strip()
    try:
        shown = run_slurm("scontrol", "-o", "show", "job", job).stdout
        assert f"UserId={attacker.name}({attacker.uid})" in shown
        assert f".sh {' '.join(lie)}" in shown  # the command line, as planted
        everyone = run_slurm("scontrol", "-o", "show", "job").stdout
        assert job not in {row["JobID"] for row in parse_rows(everyone)}
        assert job not in {row["JobID"] for row in parse_rows(everyone, uid=attacker.uid)}
    finally:
        run_slurm("scancel", job, check=False)


def test_foreign_profile_is_refused_unless_trusted(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    profile = project / "site.yaml"
    setup = "setup: ['touch /tmp/pwned-by-profile']\n"
    assert attacker.run("write", str(profile), setup).returncode == 0
    line = one_line(hpcdist("render", "--profile", "./site.yaml", cwd=project))
    # The folder comes first: one that others can write is no place for a trusted file.
    assert f"the folder of profile '{profile}', '{project}', is writable by group and" in line
    assert "owner root (uid 0), mode 0777" in line and "--trust-profile" in line
    line = one_line(hpcdist("render", cwd=project, env={"HPCDIST_PROFILE": str(profile)}))
    assert f"'{project}', is writable by group and others" in line
    # A bare name is never the current folder's file.
    line = one_line(hpcdist("render", "--profile", "site.yaml", cwd=project))
    assert "is not a shipped profile" in line and "write ./site.yaml" in line
    trusted = hpcdist("render", "--profile", "./site.yaml", "--trust-profile", cwd=project)
    assert trusted.returncode == 0, trusted.stderr
    assert f"profile site ({profile})" in trusted.stdout  # the header names the file
    assert "touch /tmp/pwned-by-profile" in trusted.stdout
    assert not os.path.exists("/tmp/pwned-by-profile")


# ------------------------------------------ races between a check and a read (made exact)
#
# Each race is made deterministic with HPCDIST_TEST_PAUSE=LABEL:FOLDER: the victim stops
# right after it opened and checked the file (where a check-then-reopen design would open
# it again), the attacker swaps the names, the test lets the victim go on.


def _wait_for(path: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


RESUME_CONFIG = "data: {mask: ocean}\ntraining: {epochs: %d, early_stopping_patience: 0}\n"


def test_checkpoint_swapped_between_check_and_load_is_not_loaded_and_not_written_to(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    (home / "two.yaml").write_text(RESUME_CONFIG % 2)
    (home / "four.yaml").write_text(RESUME_CONFIG % 4)
    run_dir = project / "runs" / "r"
    run_dir.parent.mkdir(mode=0o755)
    first = f"python3 -m ufsemulator train --config two.yaml --run-dir {run_dir}"
    job = sbatch(_script(home, "first", "threads", first), _roots(project), cwd=home, timeout=240)
    assert job.returncode == 0, _log(home, "first", job.job_id)
    mine = (project / "runs" / "r" / "checkpoint.pt").read_bytes()
    # The attacker's folder beside runs/, with her checkpoint at the same place.
    evil = project / "evil"
    assert attacker.run("mkdir", str(evil / "r")).returncode == 0
    assert attacker.run("write", str(evil / "r" / "checkpoint.pt"), "planted").returncode == 0
    hooks = project / "hooks"
    hooks.mkdir()
    hooks.chmod(0o777)
    command = f"python3 -m ufsemulator train --config four.yaml --run-dir {run_dir}"
    pause = f"{_roots(project)},HPCDIST_TEST_PAUSE=resume-read:{hooks}"
    job = sbatch(_script(home, "again", "threads", command), pause, wait=False, cwd=home)
    _wait_for(hooks / "resume-read.ready")  # the checkpoint is open and checked
    swapped = attacker.run("exchange", str(project / "runs"), str(evil))
    assert swapped.returncode == 0, swapped.stdout
    (hooks / "resume-read.go").touch()
    from tests.integration.conftest import job_state

    state = job_state(job.job_id, timeout=180)
    log = _log(home, "again", job.job_id)
    # It resumed the victim's own bytes (those checked), not the attacker's file...
    assert f"Resuming from {run_dir}/checkpoint.pt (epoch 2, restart 0)" in log, log
    # ...and its next checkpoint went nowhere near the attacker's folder: one line, failed.
    assert state == "FAILED", log
    # By uid: the name is looked up when the line is written (other sessions on this
    # machine may remove and add the attack user meanwhile).
    said = f"'{run_dir.parent}' is owned by uid {attacker.uid} ("
    errors = [line for line in log.splitlines() if said in line and "error:" in line]
    assert len(errors) == 1 and "error: checkpoint folder" in errors[0], log
    assert (project / "runs" / "r" / "checkpoint.pt").read_bytes() == b"planted"
    assert not (project / "runs" / "r" / "heartbeat.json").exists()  # nor its heartbeat
    assert (evil / "r" / "checkpoint.pt").read_bytes() == mine  # the victim's, untouched


SITE = "setup: ['echo {who}-SETUP ran as $(id -un)']\n"


def test_profile_swapped_between_check_and_read_is_not_what_runs(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    # In the shared folder itself: refused before anything is read, naming the folder.
    (project / "site.yaml").write_text(SITE.format(who="ALICE"))
    line = one_line(hpcdist("render", "--profile", "./site.yaml", cwd=project))
    assert f"'{project}', is writable by group and others" in line
    assert "owner root (uid 0)" in line
    # In a folder of the victim's alone, checked; the names are swapped after the check
    # (the folder opened to the attacker only then, so that the swap can happen at all).
    folder = project / "alice"
    folder.mkdir(mode=0o755)
    (folder / "site.yaml").write_text(SITE.format(who="ALICE"))
    hers = attacker.run("write", str(project / "evil.yaml"), SITE.format(who="MALLORY"))
    assert hers.returncode == 0, hers.stdout
    hooks = project / "hooks"
    hooks.mkdir()
    render_argv = [*HPCDIST, "render", "--profile", "./alice/site.yaml"]
    env = slurm_env({"HPCDIST_TEST_PAUSE": f"profile:{hooks}"})
    victim = subprocess.Popen(
        render_argv, cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(hooks / "profile.ready", timeout=60)
        folder.chmod(0o777)
        os.rename(project / "evil.yaml", folder / "evil.yaml")  # hers, beside the victim's
        swapped = attacker.run("exchange", str(folder / "site.yaml"), str(folder / "evil.yaml"))
        assert swapped.returncode == 0, swapped.stdout
        (hooks / "profile.go").touch()
        out, err = victim.communicate(timeout=60)
    finally:
        victim.kill()
    assert victim.returncode == 0, err
    assert "echo ALICE-SETUP" in out and "MALLORY" not in out
    # Once swapped, the next read is refused in one line naming the file and its owner.
    folder.chmod(0o755)
    line = one_line(hpcdist("render", "--profile", "./alice/site.yaml", cwd=project))
    assert f"profile '{folder / 'site.yaml'}' is owned by uid {attacker.uid}" in line
