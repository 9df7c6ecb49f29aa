"""Where a job's log goes when the folder it would go to is not the user's alone.

SLURM opens a job's ``--output`` and ``--error`` as the user before the script's first line,
following a symbolic link at that name: another user who can write the folder puts a link
at the next job ids' log names (to your ``~/.bashrc``) and your job appends its log there.
Nothing in the job can prevent it, so the log's place is decided before anything is
queued: a relative log name whose folder others can write (or rename away) goes to a
folder of the user's own private state instead (``.../logs/<name>``), and the rendered
script says so above its ``--output`` line; an absolute one there is refused in one line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hpcdist.errors import SpecError
from hpcdist.spec.jobspec import JobSpec
from hpcdist.spec.loginpaths import log_folder
from hpcdist.state.folders import state_dir
from hpcdist.state.workfolder import working_folder_problem

LOGS = "logs"
NOTE = (
    "The folder the job's log would go to can be written by others, who could put a link at "
    "its name: the log goes to a folder of yours alone (hpcdist logs finds it)."
)


def private_logs(spec: JobSpec, cwd: Path) -> JobSpec:
    """``spec`` with its log names moved where only the user can write, where need be."""
    base = cwd / spec.workdir if spec.workdir is not None else cwd
    moved = {"output": spec.output, "error": spec.error}
    for flag, value in (("output", spec.output), ("error", spec.error)):
        if value is None:
            continue
        folder = Path(log_folder(Path("/") if value.startswith("/") else base, value) or base)
        problem = working_folder_problem(folder) if folder.is_dir() else ""
        if not problem:
            continue
        if value.startswith("/"):
            raise SpecError(
                f"--{flag} {value!r}: {problem}; SLURM would open the log there following "
                "any link another user put at its name: expected a folder only you can write"
            )
        name = Path(value).name
        moved[flag] = str(state_dir(LOGS, project_dir=Path(base).resolve()) / name)
    output, error = moved["output"], moved["error"]
    if (output, error) == (spec.output, spec.error):
        return spec
    return dataclasses.replace(spec, output=output or spec.output, error=error)


def moved_log(value: str | None) -> bool:
    """Whether a log name is one ``private_logs`` chose (for the script's note)."""
    if value is None or Path(value).parent.name != LOGS:
        return False
    return bool({".hpcdist", "projects"} & set(Path(value).parent.parts))
