"""Every spelling of ``--signal`` that SLURM takes reaches every rank, on the real testbed.

Each job's ranks wait for SIGUSR2 and end when it comes. The warning is sent as SLURM sends
it at the time limit: to the batch shell alone where the flags hold ``B`` (any case, beside
``R``), else to the job step's tasks. A spelling that the runner did not read as the batch
shell's would leave the ranks waiting and the job killed by the warning.
"""

from __future__ import annotations

from pathlib import Path

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from tests.integration.conftest import (
    SlurmCluster,
    job_log,
    job_state,
    run_slurm,
    sbatch,
    wait_until,
)

SPELLINGS = ["B:USR2@60", "RB:USR2@60", "b:USR2@60", "B:SIGusr2@60", "B:12", "R:usr2@60", "12@60"]

# Each rank notes that it waits for the warning, then that it got it (its rank in the name).
_RANK = (
    "import os, pathlib, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
    "folder, rank = pathlib.Path(sys.argv[1]), os.environ['SLURM_PROCID']\n"
    "(folder / f'ready-{rank}').touch()\n"
    "signal.sigwait({signal.SIGUSR2})\n"
    "(folder / f'warned-{rank}').touch()\n"
)


def _job(tmp_path: Path, number: int, given: str) -> tuple[str, Path, Path]:
    """The job's name, its script and the folder its ranks note in."""
    name, folder = f"spelling{number}", tmp_path / f"spelling{number}"
    folder.mkdir()
    spec = spec_from_options(
        {
            "profile": "local",
            "mode": "gloo",
            "nodes": 2,
            "cpus_per_task": 1,
            "job_name": name,
            "time": "10:00",
            "signal": given,
            "requeue": False,
            "command": f"python3 {tmp_path / 'rank.py'} {folder}",
        }
    )
    script = tmp_path / f"{name}.sh"
    script.write_text(render(spec))
    return name, script, folder


def test_every_spelling_of_the_warning_reaches_every_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "rank.py").write_text(_RANK)
    measured = []
    for number, given in enumerate(SPELLINGS):
        name, script, folder = _job(tmp_path, number, given)
        job = sbatch(script, cwd=tmp_path, wait=False)

        def log(name: str = name, job_id: int = job.job_id) -> str:
            return job_log(tmp_path, name, job_id)

        def ready(folder: Path = folder) -> bool:
            return all((folder / f"ready-{rank}").exists() for rank in (0, 1))

        wait_until(ready, job.job_id, "both ranks waiting for the warning", 120, log)
        batch_shell = "B" in given.partition(":")[0].upper() and ":" in given
        run_slurm(
            "scancel", *(["--batch"] if batch_shell else []), "--signal=USR2", str(job.job_id)
        )
        state = job_state(job.job_id, timeout=120)
        assert state == "COMPLETED", f"--signal {given}: {state}\n{log()}"
        assert (folder / "warned-0").exists() and (folder / "warned-1").exists(), log()
        measured.append(f"{given} ({'batch shell' if batch_shell else 'step'}): 2 of 2 ranks")
    print("measured: warned", "; ".join(measured))
