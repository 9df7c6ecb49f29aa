"""The ranks of a job get the same environment whichever way it was queued: the script
``hpcdist render`` prints, queued with plain ``sbatch``, and ``hpcdist submit`` of the same
flags. Each rank writes its environment as JSON; everything but what names the job itself
(its id, ports, times, the paths and secrets made for it) must be equal, variable by
variable, and the user's --env values must reach the ranks as given."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import SlurmCluster, job_state, sbatch, slurm_env

# The variables SLURM gives a step differ between versions (26.05 adds SLURM_JOB_SLUID).
pytestmark = pytest.mark.slurm_versions

HPCDIST = [sys.executable, "-m", "hpcdist.cli.main"]
# Each rank writes its environment to env-<job id>-<rank>.json in the job's folder.
DUMP = (
    f'{sys.executable} -c "import json, os; '
    "open(f\\\"env-{os.environ['SLURM_JOB_ID']}-{os.environ['RANK']}.json\\\", 'w')"
    '.write(json.dumps(dict(os.environ)))"'
)
FLAGS = ("--nodes=1", "--tasks-per-node=2", "--backend=gloo", "--rank-logs=none")
USER_ENV = ("--env", "MY_SETTING=a b", "--env", "LITERAL=$HOME")
# Variables whose values name one job: its id, times, ports, the files made for it.
_PER_JOB = re.compile(
    r"SLURM_(JOB_ID|JOBID|TASK_PID|JOB_START_TIME|JOB_END_TIME|STEP_RESV_PORTS|SRUN_COMM_PORT"
    r"|STEP_LAUNCHER_PORT|STEP_ID|STEPID|[A-Z_]*SLUID)|MASTER_PORT|HPCDIST_(SECRET_FILE|REQUEUE_MARKER)"
    r"|_|OLDPWD"
)


def _environments(folder: Path, job_id: str) -> list[dict[str, str]]:
    return [json.loads((folder / f"env-{job_id}-{rank}.json").read_text()) for rank in (0, 1)]


def _comparable(env: dict[str, str], job_id: str) -> dict[str, str]:
    # The run's id is new for each run: the job's id and a random part, which the run's
    # record path repeats; both are compared as <run>.
    run_id = env["HPCDIST_RUN_ID"]
    assert re.fullmatch(rf"{job_id}-[0-9a-f]{{6}}", run_id), run_id
    return {
        key: value.replace(run_id, "<run>").replace(job_id, "<job>")
        for key, value in env.items()
        if not _PER_JOB.fullmatch(key)
    }


def test_render_with_sbatch_and_submit_give_the_ranks_one_environment(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    env = slurm_env()
    args = [*FLAGS, *USER_ENV, "--command", DUMP]
    script = subprocess.run(
        [*HPCDIST, "render", *args], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert script.returncode == 0, script.stderr
    rendered = sbatch(script.stdout, wait=True, cwd=tmp_path, timeout=300)
    assert job_state(rendered.job_id) == "COMPLETED"
    run = subprocess.run(
        [*HPCDIST, "submit", "--wait", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    submitted = re.search(r"Submitted job (\d+) \(slurm", run.stdout)
    assert submitted, run.stdout
    by_sbatch = _environments(tmp_path, str(rendered.job_id))
    by_submit = _environments(tmp_path, submitted.group(1))
    for rank, (left, right) in enumerate(zip(by_sbatch, by_submit, strict=True)):
        assert (left["MY_SETTING"], left["LITERAL"]) == ("a b", "$HOME")
        assert (left["OMP_NUM_THREADS"], left["HPCDIST_SIGNAL"]) == ("1", "USR2")
        assert (left["RANK"], left["WORLD_SIZE"]) == (str(rank), "2")
        a = _comparable(left, str(rendered.job_id))
        b = _comparable(right, submitted.group(1))
        differ = {
            k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
        }
        assert not differ, f"rank {rank}: sbatch vs submit: {differ}"
