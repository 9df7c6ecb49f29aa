"""Your model and results cannot be rewritten: a job's outputs (and its log) are writable by
nobody else whatever the umask it was submitted with, and ``report`` and ``export
--checkpoint`` refuse a file that is not as the training wrote it.

The victim submits with a umask of 002 (as many sites set it), from a folder of its own that
others can read (0755); one run folder is in that folder (runs/<job id>), one in the shared
project folder. The attacker then rewrites what she can, or exchanges the shared ``runs/``
for her own folder holding a copy of the victim's model.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration import test_attacks as attacks
from tests.integration.conftest import SlurmCluster, slurm_env
from tests.integration.test_attacks import CONFIG, Attacker, _script, hpcdist, one_line

# On one xdist worker: one training, attacked by every test, made once for the module.
pytestmark = pytest.mark.xdist_group("test_attacks_outputs")

attacker = attacks.attacker


@dataclass(frozen=True)
class Trained:
    home: Path  # the victim's working folder
    project: Path  # the shared folder
    job_id: int
    log: Path

    @property
    def own_run(self) -> Path:
        return self.home / "runs" / str(self.job_id)

    @property
    def shared_run(self) -> Path:
        return self.project / "runs" / "shared"


@pytest.fixture(scope="module")
def trained(slurm_cluster: SlurmCluster) -> Iterator[Trained]:
    home = Path(tempfile.mkdtemp(prefix="hpcdist-victim-", dir="/tmp"))
    home.chmod(0o755)  # others may look in, not write
    project = Path(tempfile.mkdtemp(prefix="hpcdist-shared-", dir="/tmp"))
    project.chmod(0o777)
    try:
        yield _train(home, project)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


def _train(home: Path, project: Path) -> Trained:
    (project / "runs").mkdir(mode=0o755)
    (home / "cfg.yaml").write_text(CONFIG)
    train = "python3 -m ufsemulator train --config cfg.yaml"
    command = f"bash -c '{train} && {train} --run-dir {project}/runs/shared'"
    script = _script(home, "outputs", "threads", command)
    roots = f"--export=ALL,HPCDIST_RUN_ROOTS={project}"  # the shared folder, named
    proc = subprocess.run(
        ["sbatch", "--parsable", "--wait", roots, str(script)],
        cwd=home,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: os.umask(0o002),  # the victim's loose umask
    )
    job_id = int(proc.stdout.strip().split(";")[0])
    log = home / f"outputs-{job_id}.out"
    assert proc.returncode == 0, log.read_text(errors="replace") if log.exists() else proc.stderr
    return Trained(home, project, job_id, log)


OUTPUTS = (
    "model.pt",
    "model.md",
    "training_results.json",
    "loss_curves.svg",
    "checkpoint.pt",
    "best_model.pt",
    "heartbeat.json",  # `hpcdist status` trusts it only if nobody else could write it
)


def test_outputs_and_log_of_a_loose_umask_cannot_be_rewritten_by_others(
    trained: Trained, attacker: Attacker
) -> None:
    for run in (trained.own_run, trained.shared_run):
        for name in OUTPUTS:
            mode = (run / name).stat().st_mode & 0o777
            assert mode & 0o022 == 0, f"{run / name} mode {mode:04o}"
    assert trained.log.stat().st_mode & 0o022 == 0, oct(trained.log.stat().st_mode)
    planted = trained.project / "planted.pt"
    assert attacker.run("write", str(planted), "her model").returncode == 0
    rewrite = attacker.run("overwrite", str(trained.shared_run / "model.pt"), str(planted))
    assert rewrite.returncode == 13, rewrite.stdout


def test_report_refuses_results_rewritten_in_place(trained: Trained, attacker: Attacker) -> None:
    results = trained.own_run / "training_results.json"
    original = results.read_bytes()
    results.chmod(0o666)  # as a umask of 000 (or a careless chmod) would leave it
    forged = trained.project / "forged.json"
    text = re.sub(rb'"best_val_loss": [^,]+', b'"best_val_loss": 1e-06', original)
    assert attacker.run("write", str(forged), text.decode()).returncode == 0
    assert attacker.run("overwrite", str(results), str(forged)).returncode == 0
    results.chmod(0o644)  # the mode fixed; the bytes are still hers
    proc = hpcdist("report", str(trained.job_id), cwd=trained.home)
    shown = proc.stdout + proc.stderr
    assert "1e-06" not in shown and "1.0e-06" not in shown, shown
    said = [line for line in shown.splitlines() if "refusing training results" in line]
    assert len(said) == 1 and "its SHA-256" in said[0], shown


def test_export_refuses_a_checkpoint_after_runs_was_exchanged(
    trained: Trained, attacker: Attacker
) -> None:
    checkpoint = trained.shared_run / "best_model.pt"
    out = trained.home / "exported.pt"
    argv = ["-m", "ufsemulator", "export", "--checkpoint", str(checkpoint), "--out", str(out)]
    env = slurm_env({"HPCDIST_RUN_ROOTS": str(trained.project)})
    ok = subprocess.run(
        ["python3", *argv], cwd=trained.home, env=env, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr  # the victim's own, as written: exported
    out.unlink()
    # Hers: runs/shared/best_model.pt (a copy she made: her weights, for the test's purpose),
    # exchanged for the victim's runs/ in the shared folder.
    evil = trained.project / "evil"
    assert attacker.run("mkdir", str(evil / "shared")).returncode == 0
    copied = attacker.run("copy", str(checkpoint), str(evil / "shared" / "best_model.pt"))
    assert copied.returncode == 0, copied.stdout
    assert attacker.run("exchange", str(trained.project / "runs"), str(evil)).returncode == 0
    proc = subprocess.run(
        ["python3", *argv], cwd=trained.home, env=env, capture_output=True, text=True
    )
    line = one_line(proc)
    assert line.startswith(f"error: refusing checkpoint '{checkpoint}': run folder ")
    assert f"is owned by uid {attacker.uid}" in line
    assert not out.exists()
