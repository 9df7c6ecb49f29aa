"""What another user can reach through the folders above a run folder kept outside the
working folder: every folder from a root the victim trusts down to the run folder is walked
without following links and checked, and a run's files are known by the folder they were
written for.

The victim and the attacker share a group and a project folder of mode 2775 (the
attacker's group); the victim's jobs run in a folder of its own and keep their run folders
in the project folder (``--run-dir``). The attacker renames and links names there, or
offers a folder of her own as the run folder's parent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import test_attacks as attacks
from tests.integration.conftest import SlurmCluster, sbatch, slurm_env
from tests.integration.test_attacks import CONFIG, Attacker, _log, _script, one_line

pytestmark = pytest.mark.xdist_group("test_attacks_runs")

attacker, home = attacks.attacker, attacks.home
ROOTS = "HPCDIST_RUN_ROOTS"


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


def _train(home: Path, name: str, *run_dirs: Path, roots: str = "") -> str:
    """The log of one job of the victim training into each run folder in turn."""
    (home / "cfg.yaml").write_text(CONFIG)
    train = "python3 -m ufsemulator train --config cfg.yaml --run-dir"
    command = "bash -c '" + "; ".join(f"{train} {run}" for run in run_dirs) + "'"
    extra = [f"--export=ALL,{ROOTS}={roots}"] if roots else []
    job = sbatch(_script(home, name, "threads", command), *extra, cwd=home, timeout=400)
    return _log(home, name, job.job_id)


def _export(home: Path, checkpoint: Path, out: Path, roots: str) -> subprocess.CompletedProcess:
    argv = ["-m", "ufsemulator", "export", "--checkpoint", str(checkpoint), "--out", str(out)]
    return subprocess.run(
        ["python3", *argv],
        cwd=home,
        env=slurm_env({ROOTS: roots}),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _made(*folders: Path) -> None:
    """The victim's own 0755 folders, made before the run (so that each run's folder is one
    level deep)."""
    for folder in folders:
        folder.mkdir(parents=True)
        for made in (folder, folder.parent):
            made.chmod(0o755)


def _digests(run: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.iterdir())}


def test_a_run_folder_below_a_folder_others_can_write_is_refused_unless_named(
    slurm_cluster: SlurmCluster, attacker: Attacker, group_project: Path, home: Path
) -> None:
    hers = group_project / "hers"
    assert attacker.run("mkdir", str(hers)).returncode == 0  # her own 0777 folder
    plain, in_hers = group_project / "expA" / "runs" / "final", hers / "run"
    _made(plain.parent)
    log = _train(home, "unnamed", plain)
    said = f"run folder '{group_project}' can be written by others, owner root (uid 0), mode 2775"
    assert said in log and ROOTS in log and "refusing to write or resume there" in log, log
    assert "Training completed" not in log and not (plain / "checkpoint.pt").exists()
    # Named as a root the victim trusts: its own mode is the victim's word; her folder in
    # it is still hers.
    log = _train(home, "named", in_hers, roots=str(group_project))
    assert f"run folder '{hers}' is owned by uid {attacker.uid}" in log, log
    assert "Training completed" not in log and not (in_hers / "checkpoint.pt").exists()


def test_another_run_folder_linked_or_renamed_into_a_runs_name_is_refused(
    slurm_cluster: SlurmCluster, attacker: Attacker, group_project: Path, home: Path
) -> None:
    roots = str(group_project)
    exp_a, exp_b = group_project / "expA", group_project / "expB"
    run_a, run_b = exp_a / "runs" / "final", exp_b / "runs" / "final"
    _made(run_a.parent, run_b.parent)
    log = _train(home, "both", run_a, run_b, roots=roots)
    assert log.count("Training completed") == 2, log
    theirs = _digests(run_b)
    out = home / "exported.pt"
    # She moves expA away and links expB in its place (the folder is the group's).
    assert attacker.run("rename", str(exp_a), f"{exp_a}.orig").returncode == 0
    assert attacker.run("symlink", str(exp_b), str(exp_a)).returncode == 0
    line = one_line(_export(home, run_a / "best_model.pt", out, roots))
    assert line.startswith(f"error: refusing checkpoint '{run_a}/best_model.pt': run folder ")
    assert f"'{exp_a}' is a symbolic link" in line, line
    assert not out.exists()
    log = _train(home, "linked", run_a, roots=roots)
    assert f"run folder '{exp_a}' is a symbolic link" in log, log
    assert "Resuming from" not in log and "Training completed" not in log
    assert _digests(run_b) == theirs  # expB's files untouched
    # Then expB itself renamed into expA's name: a real folder of the victim's.
    assert attacker.run("remove", str(exp_a)).returncode == 0
    assert attacker.run("rename", str(exp_b), str(exp_a)).returncode == 0
    line = one_line(_export(home, run_a / "best_model.pt", out, roots))
    assert "differs from the recorded" in line and not out.exists(), line
    log = _train(home, "renamed", run_a, roots=roots)
    said = f"run folder '{run_a}' holds the files of run "
    assert said in log and f"written in '{run_b}'" in log, log
    assert "Resuming from" not in log and "Training completed" not in log
    assert _digests(run_a) == theirs  # expB's files, under their new name, untouched
