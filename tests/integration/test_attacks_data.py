"""The model learns from the data you named, and its provenance names the bytes it read.

The victim's data file sits in the shared project folder. The attacker exchanges it for her
own file at the exact moment the job has opened it (``HPCDIST_TEST_PAUSE=data-read``): the
file's identity changed while it was read, and the job refuses it in one line rather than
train on, or name, either file. A shared ``HPCDIST_DATA_DIR`` holds no array cache of the
victim's and no synthetic data it trains on; the provenance of a run names the SHA-256 of
the bytes it read.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tests.integration import test_attacks as attacks
from tests.integration.conftest import REPO_ROOT, SlurmCluster, job_state, sbatch
from tests.integration.test_attacks import Attacker, _log, _script, _wait_for

attacker, project, home = attacks.attacker, attacks.project, attacks.home

SMALL = "data: {{mask: ocean, path: {path}}}\ntraining: {{epochs: 1, early_stopping_patience: 0}}\n"


def _make_data(path: Path, seed: int) -> None:
    argv = ["-m", "ufsemulator", "make-data", "--out", str(path), "--ni", "64", "--nj", "48"]
    subprocess.run([sys.executable, *argv, "--seed", str(seed)], check=True, cwd=REPO_ROOT)


def test_data_file_exchanged_once_opened_is_refused_not_trained_on(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    data = project / "day.nc"
    _make_data(data, seed=0)
    _make_data(project / "hers-src.nc", seed=7)  # her data (made here for the test's sake)
    (project / "hers-src.nc").chmod(0o644)
    hers = project / "hers.nc"
    assert attacker.run("copy", str(project / "hers-src.nc"), str(hers)).returncode == 0
    (home / "cfg.yaml").write_text(SMALL.format(path=data))
    hooks = project / "hooks"
    hooks.mkdir()
    hooks.chmod(0o777)
    command = "python3 -m ufsemulator train --config cfg.yaml --run-dir runs/r"
    pause = f"--export=ALL,HPCDIST_TEST_PAUSE=data-read:{hooks},HPCDIST_DATA_DIR={home}/cache"
    job = sbatch(_script(home, "data", "threads", command), pause, wait=False, cwd=home)
    _wait_for(hooks / "data-read.ready")  # the data file is open, not yet read
    swapped = attacker.run("exchange", str(data), str(hers))
    assert swapped.returncode == 0, swapped.stdout
    (hooks / "data-read.go").touch()
    state = job_state(job.job_id, timeout=240)
    log = _log(home, "data", job.job_id)
    # The file's identity changed while it was read (a rename or a write: the same ctime
    # change): refused in one line, nothing trained, no record naming anything.
    assert state == "FAILED", log
    said = [line for line in log.splitlines() if "changed while it was read" in line]
    assert len(said) == 1 and f"data file '{data}'" in said[0], log
    assert "Training completed" not in log
    assert not (home / "runs" / "r" / "training_results.json").exists()
    assert not list((home / "cache").glob("*.npz"))  # nothing cached from it either


def test_shared_data_dir_holds_no_cache_and_no_synthetic_data_of_the_victim(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    shared = project / "cache"
    assert attacker.run("mkdir", str(shared)).returncode == 0
    data = home / "day.nc"
    _make_data(data, seed=0)
    (home / "cfg.yaml").write_text(SMALL.format(path=data))
    env = f"--export=ALL,HPCDIST_DATA_DIR={shared}"
    command = "python3 -m ufsemulator train --config cfg.yaml --run-dir runs/r"
    job = sbatch(_script(home, "cached", "threads", command), env, cwd=home, timeout=240)
    log = _log(home, "cached", job.job_id)
    assert job.returncode == 0, log
    assert f"not writing the array cache in '{shared}'" in log, log
    assert list(shared.iterdir()) == []
    record = json.loads((home / "runs" / "r" / "training_results.json").read_text())["data"]
    assert record["files_sha256"] == [hashlib.sha256(data.read_bytes()).hexdigest()], record
    # Synthetic data are found by name: in a shared folder, refused in one line.
    command = "python3 -m ufsemulator train --run-dir runs/s"
    job = sbatch(_script(home, "synthetic", "threads", command), env, cwd=home, timeout=240)
    log = _log(home, "synthetic", job.job_id)
    assert job.returncode != 0, log
    errors = [line for line in log.splitlines() if "the synthetic data's folder" in line]
    assert len(errors) == 1 and f"'{shared}'" in errors[0], log
