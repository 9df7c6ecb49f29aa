"""Paths that must exist on the login node before a job is queued.

sbatch queues a job whose ``--chdir`` or log folder is missing, and the job then fails at
launch (JobLaunchFailure, or no log at all): nothing on the compute node makes them. So
``--chdir`` must name an existing folder (relative to the folder hpcdist runs in, as
sbatch reads it) and the folders of ``--output`` / ``--error`` must exist (relative to the
``--chdir`` folder if given, else the current one). A folder part with a ``%`` pattern
(``logs/%u/...``) is only known when the job starts: the check stops before it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath

from hpcdist.errors import SpecError
from hpcdist.spec.jobspec import JobSpec

IsDir = Callable[[PurePath], bool]
Refusal = Callable[[PurePath], str]


def check_login_paths(
    spec: JobSpec, cwd: PurePath, is_dir: IsDir, refusal: Refusal = lambda folder: ""
) -> None:
    """Raise SpecError for a ``--chdir`` or log folder that ``is_dir`` does not find, and
    for a ``--chdir`` folder that ``refusal`` refuses (the job would refuse it when it
    starts: one that others can write)."""
    base = cwd
    if spec.workdir is not None:
        base = cwd / spec.workdir
        if not is_dir(base):
            raise SpecError(
                f"--chdir {spec.workdir!r}: folder {str(base)!r} does not exist; expected an "
                "existing folder (sbatch would queue the job and it would fail at launch)"
            )
        refused = refusal(base)
        if refused:
            raise SpecError(f"--chdir {spec.workdir!r}: {refused}")
    for flag, value in (("--output", spec.output), ("--error", spec.error)):
        _check_log_name(spec, flag, value, base, is_dir)
        folder = log_folder(base, value)
        if folder is not None and not is_dir(folder):
            where = "" if spec.workdir is None else f" (relative to --chdir {spec.workdir!r})"
            raise SpecError(
                f"{flag} {value!r}: folder {str(folder)!r}{where} does not exist; expected "
                "an existing folder (SLURM does not create it and the job would fail at "
                "launch)"
            )


def _check_log_name(
    spec: JobSpec, flag: str, value: str | None, base: PurePath, is_dir: IsDir
) -> None:
    """A log name SLURM cannot open as a file: an existing folder (``-o .``, ``-o /tmp``),
    or a job name with ``/`` put in it by ``%x`` (a folder that does not exist)."""
    if value is None:
        return
    if "%x" in value and "/" in spec.job_name:
        raise SpecError(
            f"--job-name {spec.job_name!r} has a '/', and {flag} {value!r} puts the job's name "
            "in the log's path (%x): SLURM would look for a folder of that name and the job "
            "would fail at launch; expected a job name without '/'"
        )
    if "%" not in value and (value.endswith("/") or is_dir(base / value)):
        raise SpecError(
            f"{flag} {value!r} is a folder; SLURM opens the log as a file there and the job "
            f"would fail at launch: expected a file name, e.g. {flag} "
            f"{str(PurePath(value) / '%x-%j.out')!r}"
        )


def log_folder(base: PurePath, log: str | None) -> PurePath | None:
    """The folder of ``log`` that must exist: its folder parts before the first one with a
    ``%`` pattern, from ``base``; None when there is nothing to check."""
    if log is None:
        return None
    parts = PurePath(log).parts[:-1]
    known = []
    for part in parts:
        if "%" in part:
            break
        known.append(part)
    if not known:
        # A log in the base folder itself: that folder is --chdir's (checked) or the cwd.
        return None
    return base.joinpath(*known)
