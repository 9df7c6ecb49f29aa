"""What another user can reach through what hpcdist writes for you to run and what it shows
you of the queue: a rendered script, and the job records of the shared view.

The victim and the attacker share a group and a project folder of mode 2775 (the
attacker's group, as a project group is for its members). The victim's umask is 002, as
many sites set it. A rendered script in such a folder is the attacker's to change before
the victim runs sbatch; the attacker's own job, with newlines and escape sequences in its
name and comment, is in the victim's view of the queue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdist.slurm.parse import ambiguity
from hpcdist.state.statehome import private_state_root
from tests.integration import test_attacks as attacks
from tests.integration.conftest import SlurmCluster, job_state, run_slurm, sbatch, slurm_env
from tests.integration.test_attacks import HPCDIST, Attacker, _script, hpcdist, one_line

attacker, home = attacks.attacker, attacks.home


@pytest.fixture
def group_project(attacker: Attacker) -> Iterator[Path]:
    """A 2775 project folder of the group the victim shares with the attacker."""
    folder = Path(tempfile.mkdtemp(prefix="hpcdist-group-", dir="/tmp"))
    os.chown(folder, -1, attacker.gid)
    folder.chmod(0o2775)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_victim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """hpcdist run by the victim with umask 002."""
    return subprocess.run(
        [*HPCDIST, *args],
        cwd=cwd,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o002),
    )


RENDER = ("render", "--mode", "threads", "--command", "true", "--job-name", "victim")


# ------------------------------------------------------------------ a rendered script


def test_a_script_is_not_written_where_another_user_can_change_it(
    slurm_cluster: SlurmCluster, attacker: Attacker, group_project: Path
) -> None:
    script = group_project / "job.sh"
    line = one_line(_as_victim(*RENDER, "--script", "job.sh", cwd=group_project))
    assert line.startswith(f"hpcdist: error: --script 'job.sh': '{group_project}' can be written")
    assert "mode 2775" in line and "--trust-folder" in line and "only you can write" in line
    assert not script.exists() and list(group_project.iterdir()) == []  # nothing written
    # Trusted: written, but never group-writable under umask 002: the attacker cannot
    # change it in place (she could rename it away: the folder is the group's, as trusted).
    trusted = _as_victim(*RENDER, "--script", "job.sh", "--trust-folder", cwd=group_project)
    assert trusted.returncode == 0, trusted.stderr
    assert script.stat().st_mode & 0o777 == 0o755
    assert script.stat().st_gid == attacker.gid  # the folder's group: hers too
    edited = attacker.run("write", str(script), "#!/bin/bash\ntouch /tmp/pwned-by-script\n")
    assert edited.returncode == 13, edited.stdout
    assert "pwned" not in script.read_text()


def test_a_script_in_the_victims_own_folder_runs_as_rendered(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    home.chmod(0o755)  # others may look in, not write
    os.chown(home, -1, attacker.gid)
    proc = _as_victim(*RENDER, "--script", "job.sh", cwd=home)
    assert proc.returncode == 0, proc.stderr
    script = home / "job.sh"
    assert script.stat().st_mode & 0o777 == 0o755
    assert attacker.run("write", str(script), "#!/bin/bash\nid\n").returncode == 13
    assert attacker.run("symlink", "/etc/passwd", str(home / "job2.sh")).returncode == 13
    job = sbatch(script, cwd=home)
    assert job.returncode == 0, job
    assert job_state(job.job_id) == "COMPLETED"


def test_the_profiles_trust_folder_key_is_the_flags_word(
    slurm_cluster: SlurmCluster, attacker: Attacker, group_project: Path, home: Path
) -> None:
    strict, trusting = home / "strict.yaml", home / "trusting.yaml"  # the victim's own
    strict.write_text("trust_folder: false\n")
    trusting.write_text("trust_folder: true\n")
    script = group_project / "job.sh"
    line = one_line(
        _as_victim(*RENDER, "--profile", str(strict), "--script", "job.sh", cwd=group_project)
    )
    assert line == (
        f"hpcdist: error: --script 'job.sh': '{group_project}' can be written by others "
        "(owner root, mode 2775), who could change the script before you run sbatch; write it "
        "to a folder only you can write (e.g. in your home), or pass --trust-folder (or set "
        "trust_folder: true in your profile) if you trust everyone who can write there"
    )
    assert not script.exists()
    trusted = _as_victim(
        *RENDER, "--profile", str(trusting), "--script", "job.sh", cwd=group_project
    )
    assert trusted.returncode == 0, trusted.stderr
    assert script.stat().st_mode & 0o777 == 0o755  # the key trusts the folder, not her
    edited = attacker.run("write", str(script), "#!/bin/bash\ntouch /tmp/pwned-by-script\n")
    assert edited.returncode == 13, edited.stdout


def test_the_local_executor_in_a_shared_folder_names_the_folder_not_a_log_flag(
    slurm_cluster: SlurmCluster, attacker: Attacker, group_project: Path
) -> None:
    submit = ("submit", "--executor", "local", "--mode", "threads", "--command", "true")
    try:
        line = one_line(_as_victim(*submit, cwd=group_project))
    finally:  # the log's place hpcdist chose, in the victim's own state folder
        shutil.rmtree(private_state_root(group_project), ignore_errors=True)
    assert line == (
        f"hpcdist: error: the job's working folder '{group_project}' can be written by "
        "others (owner root, mode 2775): Python would import a module put there; run the job "
        "from a folder that only you can write, below folders that only you (or root) can "
        "write: sbatch --chdir or hpcdist --chdir DIR, e.g. a folder in your home"
    )
    assert list(group_project.iterdir()) == []  # nothing started, nothing written there


# ------------------------------------------------------------------ the shared job view


def _forged(victim_job: int) -> str:
    """A job name whose newlines start records of the victim's: her pending job finished,
    and a failed task 7 of it, with a log path of the attacker's choosing."""
    owner = f"UserId=root({os.getuid()}) GroupId=root(0)"
    tail = "Restarts=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=00:05:00 NodeList=node3 NumNodes=1"
    return "\n".join(
        [
            "x",
            f"JobId={victim_job} JobName=victim {owner} JobState=COMPLETED Reason=None {tail} "
            "StdOut=/etc/shadow",
            f"JobId={victim_job + 100000} ArrayJobId={victim_job} ArrayTaskId=7 JobName=victim "
            f"{owner} JobState=FAILED Reason=NonZeroExitCode {tail} StdOut=/etc/shadow",
            "JobId=4000000000 JobName=y",
        ]
    )


# One worker runs both, in this order: the second leaves a job whose record cannot be told
# apart in the queue for MinJobAge (120 s here), which would have the first's view ask job by
# job whatever the code did.
@pytest.mark.xdist_group("forged_records")
def test_a_record_of_a_job_the_controller_does_not_have_is_not_the_victims(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    # A job of the victim's that the controller forgot (MinJobAge after its end; the
    # testbed keeps them 120 s) is a number scontrol no longer prints: nothing repeats or
    # contradicts a record of it that her job's name holds. A number the controller never
    # had stands in for it here, one above the victim's held job.
    victim_job = sbatch(_script(home, "victim", "threads", "true"), "--hold", wait=False, cwd=home)
    gone = victim_job.job_id + 500
    owner = f"UserId=root({os.getuid()}) GroupId=root(0)"
    tail = "Restarts=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=00:05:00 NodeList=node3 NumNodes=1"
    # Every line a whole record, her own first line too: nothing in the output is ambiguous.
    hers = f"UserId={attacker.name}({attacker.uid}) GroupId={attacker.name}({attacker.gid})"
    name = "\n".join(
        [
            f"x {hers} JobState=PENDING Reason=None {tail}",
            f"JobId={gone} JobName=victim {owner} JobState=COMPLETED Reason=None {tail} "
            f"WorkDir={home} StdOut=/etc/shadow StdErr=/etc/shadow",
            "JobId=4000000000 JobName=y",
        ]
    )
    queued = attacker.run("sbatch", name)
    assert queued.returncode == 0, queued.stdout
    forger = queued.stdout.splitlines()[0].strip()
    try:
        shown = run_slurm("scontrol", "-o", "show", "job").stdout
        assert shown.count(f"\nJobId={gone} JobName=victim UserId=root(") == 1  # planted
        lines = shown.splitlines()
        first = next(i for i, one in enumerate(lines) if one.startswith(f"JobId={forger} "))
        record = lines[first : first + 3]  # her job's record, as scontrol prints it
        assert record[2].startswith("JobId=4000000000 JobName=y UserId="), shown
        assert ambiguity("\n".join(record)) == "", record  # each line a record, owned once
        status = hpcdist("status", str(gone), cwd=home)
        assert "COMPLETED" not in status.stdout and "node3" not in status.stdout, status
        assert "shadow" not in status.stdout + status.stderr, status
        listed = hpcdist("list", cwd=home)
        assert listed.returncode == 0, listed.stderr
        assert str(gone) not in listed.stdout and str(victim_job.job_id) in listed.stdout
        logs = hpcdist("logs", str(gone), cwd=home)
        assert "root:" not in logs.stdout, logs.stdout  # /etc/shadow's first line
        print(f"measured: status of {gone}: {status.returncode} {one_line_of(status)}")
    finally:
        run_slurm("scancel", forger, str(victim_job.job_id), check=False)


def one_line_of(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr).strip().splitlines()[0] if proc.stdout + proc.stderr else ""


@pytest.mark.xdist_group("forged_records")
def test_another_users_job_cannot_forge_the_victims_job_states(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    victim_job = sbatch(_script(home, "victim", "threads", "true"), "--hold", wait=False, cwd=home)
    queued = attacker.run("sbatch", _forged(victim_job.job_id))
    assert queued.returncode == 0, queued.stdout
    forger = queued.stdout.splitlines()[0].strip()
    try:
        shown = run_slurm("scontrol", "-o", "show", "job").stdout
        assert f"\nJobId={victim_job.job_id} JobName=victim UserId=root(" in shown  # planted
        proc = hpcdist("status", str(victim_job.job_id), cwd=home)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"{victim_job.job_id} PENDING"), proc.stdout
        assert "COMPLETED" not in proc.stdout and "FAILED" not in proc.stdout
        assert "node3" not in proc.stdout and "shadow" not in proc.stdout
        assert "_7" not in proc.stdout
        # Her job's own record cannot be told apart from what it poses as: refused, one line.
        line = one_line(hpcdist("status", forger, cwd=home))
        assert "cannot be told apart" in line and "\n" not in line
    finally:
        run_slurm("scancel", forger, str(victim_job.job_id), check=False)


def test_status_prints_another_users_escape_sequences_escaped(
    slurm_cluster: SlurmCluster, attacker: Attacker, home: Path
) -> None:
    queued = attacker.run("sbatch", "\x1b]0;pwned\x07\x1b[2Jname")
    assert queued.returncode == 0, queued.stdout
    job = queued.stdout.splitlines()[0].strip()
    try:
        proc = hpcdist("status", job, cwd=home)
        assert proc.returncode == 0, proc.stderr
        assert "name:       \\x1b]0;pwned\\x07\\x1b[2Jname" in proc.stdout
        assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    finally:
        run_slurm("scancel", job, check=False)
