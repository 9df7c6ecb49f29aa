"""A job's log is never written through another user's link, and ``hpcdist logs`` never
reads through one, nor sends a log's terminal escape sequences to your terminal.

SLURM opens a job's log as the victim, following a symbolic link at its name, before the
script's first line: in the shared folder the attacker puts links at the next job ids' log
names (to the victim's ``~/.bashrc``, here ``bashrc``). After a job, she replaces its log
in the shared folder by a link to a secret of the victim's, or by her own file full of
escape sequences.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hpcdist.state.statehome import private_state_root
from tests.integration import test_attacks as attacks
from tests.integration.conftest import SlurmCluster, job_state, run_slurm, sbatch
from tests.integration.test_attacks import Attacker, _held, _script, hpcdist, one_line

attacker, project, home = attacks.attacker, attacks.project, attacks.home


def test_links_at_the_next_log_names_are_never_followed(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    bashrc = home / "bashrc"
    bashrc.write_text("precious\n")
    rendered = hpcdist(
        "render", "--mode", "threads", "--command", "true", "--job-name", "victim", cwd=project
    )
    assert rendered.returncode == 0, rendered.stderr
    script = project / "victim.sh"
    script.write_text(rendered.stdout)
    probe = _held(home, _script(home, "probe", "threads", "true"))
    run_slurm("scancel", str(probe))
    links = [project / f"victim-{probe + k}.out" for k in range(1, 6)]
    for link in links:
        assert attacker.run("symlink", str(bashrc), str(link)).returncode == 0
    job = sbatch(script, wait=False, cwd=project)
    assert probe < job.job_id <= probe + 5
    job_state(job.job_id, timeout=120)
    assert bashrc.read_text() == "precious\n"
    assert all(link.is_symlink() for link in links)
    # The log went where the script said, in the victim's own state folder.
    log = private_state_root(project) / "logs" / f"victim-{job.job_id}.out"
    assert f'#SBATCH --output="{log.parent}/%x-%j.out"' in rendered.stdout
    assert "the job's working folder" in log.read_text(), log.read_text()


OLD_SCRIPT = "#!/bin/bash\n#SBATCH --output={log}\nprintf 'step 1\\033[2J\\033]0;title\\007\\n'\n"


def _old_job(project: Path, home: Path) -> tuple[int, Path]:
    """A job of a script written before logs moved (its log in the shared folder)."""
    script = home / "old.sh"
    script.write_text(OLD_SCRIPT.format(log=f"{project}/old-%j.out"))
    job = sbatch(script, cwd=home, timeout=120)
    assert job.returncode == 0
    return job.job_id, project / f"old-{job.job_id}.out"


def _logs(job_id: int, home: Path) -> subprocess.CompletedProcess[str]:
    return hpcdist("logs", str(job_id), cwd=home)


def test_logs_prints_control_characters_escaped(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    job_id, _ = _old_job(project, home)
    proc = _logs(job_id, home)
    assert proc.returncode == 0, proc.stderr
    assert "step 1\\x1b[2J\\x1b]0;title\\x07" in proc.stdout
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout


def test_logs_never_reads_through_a_link_or_a_replaced_log(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    secret = home / "secret"
    secret.write_text("HPCDIST_SECRET=0123456789abcdef\n")
    secret.chmod(0o600)
    job_id, log = _old_job(project, home)
    # A link to the victim's secret in the log's place (swapped in atomically).
    assert attacker.run("symlink", str(secret), str(project / "link")).returncode == 0
    assert attacker.run("exchange", str(log), str(project / "link")).returncode == 0
    line = one_line(_logs(job_id, home))
    assert f"log '{log}' is a symbolic link: not a file the job wrote" in line
    assert "0123456789abcdef" not in line
    # Her own file, full of escape sequences, in the log's place.
    hers = project / "hers"
    assert attacker.run("write", str(hers), "\x1b]0;pwned\x07\x1b[2J").returncode == 0
    assert attacker.run("exchange", str(log), str(hers)).returncode == 0
    line = one_line(_logs(job_id, home))
    assert f"log '{log}' is owned by " in line and f"(uid {attacker.uid})" in line
    assert "\x1b" not in line
