"""How the ranks of a job step ended, read from srun's own lines in the job's log, and
what the batch script's runner says about it.

A rank the kernel's out-of-memory killer ends dies by SIGKILL; srun then writes
``srun: error: node2: task 1: Killed`` (``Out Of Memory`` where the cgroup counts the kill)
and ends the other ranks with TERM, so its own status names the TERM, and the ranks that
lost a peer print tracebacks. The runner reads what srun appended to the log while it
ran (``badnodes.LogMark``), names the killed rank and its signal in one line, exits 137
(128 + SIGKILL) so that SLURM's exit code says it too, and tells how to resume from the
job's checkpoint.

Standard library only: the batch script runs it before anything else of the job.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from hpcdist.distributed.badnodes import LogMark
from hpcdist.facts.protocol import RUN_DIR_VAR
from hpcdist.facts.runs import RUNS_DIR, run_name

# srun's words for a task that died by SIGKILL: "task 1: Killed", "tasks 0-3,5: Killed".
_KILLED = re.compile(
    r"^srun: error: \S+: tasks? ([0-9,\-]+): (Killed|Out Of Memory)\s*$", re.MULTILINE
)
KILLED_STATUS = 128 + 9  # what bash reports for a process killed by SIGKILL


def killed_ranks(text: str) -> dict[int, str]:
    """rank -> srun's word ("Killed", "Out Of Memory") for each rank srun saw die of
    SIGKILL in ``text``; pure."""
    found: dict[int, str] = {}
    for match in _KILLED.finditer(text):
        for part in match.group(1).split(","):
            first, _, last = part.partition("-")
            if not first.isdigit() or (last and not last.isdigit()):
                continue
            for rank in range(int(first), int(last or first) + 1):
                found.setdefault(rank, match.group(2))
    return found


def killed_lines(killed: Mapping[int, str], job: str) -> list[str]:
    """One line for the killed ranks: which, by what, and where the memory is shown."""
    if not killed:
        return []
    ranks = ", ".join(str(rank) for rank in sorted(killed))
    many = len(killed) > 1
    oom = any(word == "Out Of Memory" for word in killed.values())
    cause = "the out-of-memory killer" if oom else "likely out of memory (the OOM killer's signal)"
    return [
        f"rank{'s' if many else ''} {ranks} {'were' if many else 'was'} killed by signal 9 "
        f"(SIGKILL): {cause}; its memory against the request: hpcdist status {job}"
    ]


def resume_lines(env: Mapping[str, str], workdir: Path) -> list[str]:
    """How to go on from the checkpoint a job that ended without a requeue left: a new
    job started in the same run folder resumes from it."""
    run_dir = env.get(RUN_DIR_VAR) or f"{RUNS_DIR}/{run_name(env) or ''}"
    if not (workdir / run_dir / "checkpoint.pt").is_file():
        return []
    return [
        f"the checkpoint in {run_dir} is kept: resume it by submitting the job again with "
        f"--set output.run_dir={run_dir} (hpcdist submit or render)"
    ]


def report(mark: LogMark, status: int, env: Mapping[str, str]) -> int:
    """After srun ended with ``status``: the killed ranks (from what srun wrote to the log
    since ``mark``) and the resume route said on stderr; the status to exit with (137
    where a rank died of SIGKILL)."""
    if status == 0:
        return status
    killed = killed_ranks(mark.written_since())
    job = run_name(env) or env.get("SLURM_JOB_ID", "")
    lines = killed_lines(killed, job) + resume_lines(env, Path.cwd())
    for line in lines:
        print(f"hpcdist: {line}", file=sys.stderr, flush=True)
    return KILLED_STATUS if killed else status
