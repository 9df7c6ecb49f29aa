"""The model learns from your data, and its provenance names the bytes it learnt from.

The victim's data file sits in the shared project folder. The attacker exchanges it for her
own file at the exact moment the job has opened it (``HPCDIST_TEST_PAUSE=data-read``): the
job reads the file it opened, and the provenance of ``training_results.json`` and of
``model.pt`` names the SHA-256 of those bytes, computed while they were read. A shared
``HPCDIST_DATA_DIR`` holds no array cache of the victim's and no synthetic data it trains on;
a cache of the victim's own changed in place is not used.
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_data_file_exchanged_once_opened_is_not_what_is_read_nor_named(
    slurm_cluster: SlurmCluster, attacker: Attacker, project: Path, home: Path
) -> None:
    data = project / "day.nc"
    _make_data(data, seed=0)
    mine = _sha256(data)
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
    _wait_for(hooks / "data-read.ready")  # the data file is open
    swapped = attacker.run("exchange", str(data), str(hers))
    assert swapped.returncode == 0, swapped.stdout
    (hooks / "data-read.go").touch()
    state = job_state(job.job_id, timeout=240)
    log = _log(home, "data", job.job_id)
    assert state == "COMPLETED", log
    results = json.loads((home / "runs" / "r" / "training_results.json").read_text())
    named = json.dumps(results["data"])
    assert mine in named, named  # the bytes read: the victim's, as opened
    assert _sha256(data) not in named  # what the name holds now is hers
    extra = {"provenance.json": ""}
    import torch

    torch.jit.load(str(home / "runs" / "r" / "model.pt"), _extra_files=extra)
    assert mine in str(extra["provenance.json"]) and _sha256(data) not in str(
        extra["provenance.json"]
    )


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
    # Synthetic data are found by name: in a shared folder, refused in one line.
    command = "python3 -m ufsemulator train --run-dir runs/s"
    job = sbatch(_script(home, "synthetic", "threads", command), env, cwd=home, timeout=240)
    log = _log(home, "synthetic", job.job_id)
    assert job.returncode != 0, log
    errors = [line for line in log.splitlines() if "the synthetic data's folder" in line]
    assert len(errors) == 1 and f"'{shared}'" in errors[0], log
