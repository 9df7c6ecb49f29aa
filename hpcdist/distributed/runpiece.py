"""Which run a job belongs to, decided by its script (``jobstep prepare``) at every start.

A run is one training across its pieces: the first job, each ``scontrol requeue`` of it
(same job id, ``SLURM_RESTART_COUNT`` one more), each job resubmitted in its place (the
script carries ``HPCDIST_RUN_ID`` on) and each job started with ``--continue RUN`` (the
rendered script sets it). Every piece leaves one file in the run's private record,
``.hpcdist/runs/<run id>/<job>-<restart>.json``, and tells the training where its own note
goes (``HPCDIST_RUN_RECORD``: where it resumed from, ``hpcdist.distributed.heartbeat``).

Standard library only: the batch script runs it before anything else of the job.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpcdist.errors import UserError
from hpcdist.facts.protocol import RESTARTS_VAR, RUN_DIR_VAR
from hpcdist.facts.runs import (
    CONTINUE_JOB_VAR,
    RUN_ID_VAR,
    RUN_RECORD_VAR,
    RUNS_DIR,
    glob_quote,
    new_run_id,
    piece_name,
    run_id_problem,
    run_name,
)
from hpcdist.state.private import private_dir, write_private
from hpcdist.state.trustedfile import read_private

TRAIN_SUFFIX = ".train.json"


def slurm_restarts(env: Mapping[str, str]) -> int:
    text = env.get("SLURM_RESTART_COUNT", "").strip()
    return int(text) if text.isdigit() else 0


def run_of_job(root: Path, job: str) -> str | None:
    """The run a job's earlier start recorded (its newest), if any."""
    found = sorted(
        (path.stat().st_mtime, path.parent.name)
        for path in root.glob(f"*/{glob_quote(job)}-*.json")
        if not path.name.endswith(TRAIN_SUFFIX)
    )
    return found[-1][1] if found else None


def decide_run_id(env: Mapping[str, str], root: Path, token: str | None = None) -> str:
    """The given run id (``--continue``, a resubmission), else the run of this job's earlier
    start (a requeue keeps the job id), else a new run."""
    given = env.get(RUN_ID_VAR, "").strip()
    if given:
        problem = run_id_problem(given)
        if problem:
            raise UserError(f"{RUN_ID_VAR}: {problem}")
        return given
    job = run_name(env) or "local"
    if slurm_restarts(env) > 0:
        found = run_of_job(root, job)
        if found is not None:
            return found
    earlier = env.get(CONTINUE_JOB_VAR, "").strip()
    if earlier:  # --continue JOB: the run that job was a piece of
        found = run_of_job(root, earlier)
        if found is not None:
            return found
        print(
            f"hpcdist: --continue {earlier}: job {earlier} started no run from this folder; "
            "this job starts a new one",
            file=sys.stderr,
        )
    return new_run_id(job, token or secrets.token_hex(3))


def last_run_dir(folder: Path) -> str | None:
    """Where the run's last piece trained (its training's note, else where its script
    pointed it), if any piece said so."""
    files = sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime)
    notes = [path for path in files if path.name.endswith(TRAIN_SUFFIX)]
    pieces = [path for path in files if not path.name.endswith(TRAIN_SUFFIX)]
    for path in [*reversed(notes), *reversed(pieces)]:
        try:
            found = json.loads(read_private(path, "run record"))
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and isinstance(found.get("run_dir"), str):
            return str(found["run_dir"])
    return None


def start_piece(env: Mapping[str, str], root: Path, now: float | None = None) -> list[str]:
    """Record this piece of its run; the shell lines that tell the job which run it is."""
    run_id = decide_run_id(env, root)
    folder = private_dir(root / run_id, "hpcdist's run record", root)
    job = run_name(env) or "local"
    run_dir = env.get(RUN_DIR_VAR, "").strip()
    continued = env.get(RUN_ID_VAR, "").strip() or env.get(CONTINUE_JOB_VAR, "").strip()
    if not run_dir and continued:
        run_dir = last_run_dir(folder) or ""  # --continue: where the run trained
    run_dir = run_dir or f"{RUNS_DIR}/{job}"
    restart = slurm_restarts(env)
    piece = {
        "run_id": run_id,
        "job_id": job,
        "slurm_job_id": env.get("SLURM_JOB_ID", ""),
        "restart": restart,
        "resubmits": int(env.get(RESTARTS_VAR, "").strip() or 0),
        "started": time.time() if now is None else now,
        "workdir": os.getcwd(),
        "run_dir": os.path.join(os.getcwd(), run_dir),
        "nodes": env.get("SLURM_JOB_NODELIST", ""),
    }
    name = piece_name(job, restart)
    write_private(folder / f"{name}.json", json.dumps(piece) + "\n")
    return [
        f"export {RUN_ID_VAR}={shlex.quote(run_id)}",
        f"export {RUN_DIR_VAR}={shlex.quote(run_dir)}",
        f"export {RUN_RECORD_VAR}={shlex.quote(str(folder / (name + TRAIN_SUFFIX)))}",
    ]
