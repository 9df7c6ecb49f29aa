"""The other user's code never runs as you: a module planted in a job's working folder.

Python puts the folder it starts in first on its import path; the attacker puts a
``hpcdist`` package, a ``torch.py`` or a ``runpy.py`` in the shared folder where the victim
works, or renames the victim's own folder inside it away and puts hers in its place while the
job is queued. The job refuses the folder in one line before any rank starts, and the planted
code never runs (it would leave a file behind, written as the victim). ``--chdir`` into such
a folder is refused before anything is queued.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration import test_attacks as attacks
from tests.integration.conftest import SlurmCluster, run_slurm
from tests.integration.test_attacks import (
    Attacker,
    _held,
    _log,
    _release_and_wait,
    _script,
    hpcdist,
    one_line,
)

# The attack module's fixtures: the unprivileged user, the shared project folder.
attacker, project = attacks.attacker, attacks.project

RAN = "/tmp/hpcdist-planted-ran"
PLANT = f"open({RAN!r}, 'a').write(__name__ + '\\n')\n"


@pytest.mark.parametrize("planted", ["hpcdist/__init__.py", "torch.py", "runpy.py"])
def test_module_planted_in_the_shared_working_folder_never_runs(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, planted: str
) -> None:
    Path(RAN).unlink(missing_ok=True)
    command = "python3 -m ufsemulator train"
    job_id = _held(project, _script(project, "victim", "threads", command))
    if "/" in planted:
        assert attacker.run("mkdir", str(project / Path(planted).parent)).returncode == 0
    assert attacker.run("write", str(project / planted), PLANT).returncode == 0
    state = _release_and_wait(job_id)
    log = _log(project, "victim", job_id)
    assert not os.path.exists(RAN), Path(RAN).read_text()
    assert state == "FAILED", log
    refusals = [line for line in log.splitlines() if "the job's working folder" in line]
    assert len(refusals) == 1, log
    assert f"'{project}' can be written by others (owner root, mode 0777)" in refusals[0]
    assert "Training" not in log


def test_private_folder_renamed_away_while_queued_is_refused(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path
) -> None:
    Path(RAN).unlink(missing_ok=True)
    mine = project / "alice"
    mine.mkdir(mode=0o755)
    job_id = _held(mine, _script(mine, "victim", "threads", "python3 -m ufsemulator train"))
    # Hers: the same name, a planted hpcdist package in it, exchanged for the victim's.
    evil = project / "evil"
    assert attacker.run("mkdir", str(evil / "hpcdist")).returncode == 0
    assert attacker.run("write", str(evil / "hpcdist" / "__init__.py"), PLANT).returncode == 0
    assert attacker.run("exchange", str(mine), str(evil)).returncode == 0
    state = _release_and_wait(job_id)
    log = _log(mine, "victim", job_id)  # the attacker's folder now: SLURM wrote the log there
    assert not os.path.exists(RAN), Path(RAN).read_text()
    assert state == "FAILED", log
    said = f"the job's working folder '{mine}' is owned by "
    assert said in log and f"(uid {attacker.uid})" in log, log


def test_chdir_into_a_shared_folder_is_refused_before_anything_is_queued(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, tmp_path: Path
) -> None:
    mine = project / "alice"
    mine.mkdir(mode=0o755)
    before = run_slurm("squeue", "-h", "-o", "%i").stdout.split()
    for verb in ("render", "submit"):
        argv = [verb, "--mode", "threads", "--command", "true", "--chdir", str(mine)]
        line = one_line(hpcdist(*argv, cwd=tmp_path))
        assert f"--chdir '{mine}': the folder '{project}', above '{mine}'," in line, line
        assert "can be written by others" in line and "rename it away" in line
    assert run_slurm("squeue", "-h", "-o", "%i").stdout.split() == before
