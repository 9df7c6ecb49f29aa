"""Whether a job may run in a folder: only where no other user can put or replace a file.

Python puts the folder it starts in first on its import path (``python -m``, ``-c``; a
script's own folder for ``python script.py``): a ``torch.py`` or an ``hpcdist/`` that another
user puts there runs as you, before any check of yours. The job's own relative paths (its
config, its data, ``runs/``) are read there too. So a job runs only in a folder that is
yours, that the group and others cannot write, and that nobody else can rename away and
replace: every folder above it is yours or root's, and none that others may write lacks the
sticky bit (``/tmp`` is fine, a project folder of mode 2775 is not).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpcdist.state.private import user_name

ADVICE = (
    "run the job from a folder that only you can write, below folders that only you (or "
    "root) can write: sbatch --chdir or hpcdist --chdir DIR, e.g. a folder in your home"
)


def _who(info: os.stat_result) -> str:
    return f"owner {user_name(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):04o}"


def _folder_problem(info: os.stat_result, my_uid: int) -> str:
    if info.st_uid != my_uid:
        return f"is owned by {user_name(info.st_uid)} (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"can be written by others ({_who(info)})"
    return ""


def _parent_problem(info: os.stat_result, my_uid: int) -> str:
    if info.st_uid not in (my_uid, 0):
        return f"belongs to {user_name(info.st_uid)} (uid {info.st_uid}), who can replace it"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return f"can be written by others ({_who(info)}), who can rename it away and replace it"
    return ""


def working_folder_problem(folder: Path, my_uid: int | None = None) -> str:
    """Why another user could put or replace a file in ``folder`` (the folder, or a folder
    above it, quoted with its owner and mode); "" if nobody can."""
    uid = os.geteuid() if my_uid is None else my_uid
    real = Path(os.path.realpath(folder))
    try:
        problem = _folder_problem(os.stat(real), uid)
        if problem:
            return f"{str(real)!r} {problem}"
        for above in real.parents:
            problem = _parent_problem(os.stat(above), uid)
            if problem:
                return f"{str(above)!r}, above {str(real)!r}, {problem}"
    except OSError as exc:
        return f"{str(real)!r} cannot be checked ({exc.strerror})"
    return ""


def script_folder_problem(folder: Path, my_uid: int | None = None) -> str:
    """Why another user could change or replace a file written into ``folder`` (a rendered
    script): the folder, or one above it, that they can write, quoted with its owner and
    mode; "" if nobody can."""
    problem = working_folder_problem(folder, my_uid)
    for tail in (", who can rename it away and replace it", ", who can replace it"):
        problem = problem.removesuffix(tail)
    return problem


def check_working_folder(folder: Path, what: str = "the job's working folder") -> str:
    """One line refusing ``folder`` as a job's working folder, or "" where it is safe."""
    problem = working_folder_problem(folder)
    if not problem:
        return ""
    return f"{what} {problem}: Python would import a module put there; {ADVICE}"
