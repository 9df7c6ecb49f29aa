"""Where a job's logs are, for as long as its files exist: from SLURM while it knows the job,
from the job's own log record after.

SLURM's controller names a job's StdOut and StdErr until it forgets the job (MinJobAge,
minutes after its end); sacct before 23.02 never does. A rendered script therefore leaves
a small record in the job's private state (``logs/<job id>``: its ``--output`` and
``--error`` patterns, its job name and ``--rank-logs``), and ``hpcdist logs`` / ``status``
expand those patterns the way SLURM does (``%j``, ``%x``, ``%A``, ``%a``, ``%t``, ``%u``,
``%%``, a zero-padding width such as ``%4j``). Nothing found is said with every place
looked in, never shown as an empty log.
"""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcdist.facts.launch import rank_log_pattern
from hpcdist.facts.protocol import LOG_DIR
from hpcdist.slurm.query import JobInfo
from hpcdist.state.folders import jobs_root
from hpcdist.state.private import PrivacyError
from hpcdist.state.trustedfile import read_private

LOG_RECORDS = Path(LOG_DIR).name  # below the private state, beside secrets/ and requeue/
_PATTERN = re.compile(r"%(\d*)([%AajJNnstux])")


def expand_pattern(
    pattern: str,
    job_id: str,
    name: str,
    rank: int | None = None,
    user: str | None = None,
) -> str:
    """A log file name pattern as SLURM expands it (sbatch(1), "filename pattern"):
    ``%j`` the job id (of an array task: ``%A_%a`` as hpcdist names it), ``%A``/``%a`` the
    array's job and task ids, ``%x`` the job name, ``%t`` the task (rank), ``%u`` the user,
    ``%%`` a percent sign; a width zero-pads (``%4j``). ``%t`` stays as it is where no rank
    is asked for; node names (``%N``, ``%n``) and the step (``%s``) stay too."""
    array_job, _, array_task = job_id.partition("_")
    values = {
        "j": job_id,
        "J": job_id,
        "A": array_job,
        "a": array_task or "4294967294",  # what SLURM writes for a job outside an array
        "x": name,
        "u": user or getpass.getuser(),
    }
    if rank is not None:
        values["t"] = str(rank)

    def one(match: re.Match[str]) -> str:
        width, letter = match.groups()
        if letter == "%":
            return "%"
        value = values.get(letter)
        if value is None:
            return match.group(0)
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)


@dataclass(frozen=True)
class LogPaths:
    """A job's log files, and every place that was looked in to find them."""

    stdout: Path | None
    stderr: Path | None
    looked: tuple[str, ...]
    per_rank: bool = False  # the rank's own files (``--rank-logs split``), not the job's

    def files(self) -> list[tuple[Path, bool]]:
        """(path, is stderr) of each distinct log, stdout first."""
        found = [] if self.stdout is None else [(self.stdout, False)]
        if self.stderr is not None and self.stderr != self.stdout:
            found.append((self.stderr, True))
        return found


def job_logs(
    info: JobInfo, rank: int | None = None, state_folders: Sequence[Path] = ()
) -> LogPaths:
    """The logs of ``info`` (rank ``rank``'s own files where the job split them): SLURM's
    own paths while it knows them (they hold what sbatch's command line changed too),
    else the patterns of the job's log record, expanded here."""
    looked: list[str] = []
    workdir = Path(info.workdir) if info.workdir else None
    folders = list(dict.fromkeys([*state_folders, *([workdir] if workdir else [])]))
    # While SLURM names the logs, the record only tells whether a rank has files of its own.
    needed = info.stdout is None or rank is not None
    record = _read_record(info.job_id, folders, looked) if needed else None
    split = record is not None and record.get("rank_logs") == "split" and rank is not None
    if info.stdout is not None:
        looked.insert(0, f"SLURM's StdOut {info.stdout}")
        stdout, stderr = info.stdout, info.stderr or info.stdout
        if split:
            stdout, stderr = (rank_log_pattern(p, str(rank)) for p in (stdout, stderr))
        return LogPaths(Path(stdout), Path(stderr), tuple(looked), per_rank=split)
    if record is None:
        looked.append(f"SLURM's StdOut of job {info.job_id} (unknown)")
        return LogPaths(None, None, tuple(looked))
    base = workdir or Path.cwd()

    def path(pattern: str | None) -> Path | None:
        if not pattern:
            return None
        if split:
            pattern = rank_log_pattern(pattern, str(rank))
        expanded = Path(expand_pattern(pattern, info.job_id, str(record.get("name", ""))))
        return expanded if expanded.is_absolute() else base / expanded

    stdout_path = path(record.get("output"))
    stderr_path = path(record.get("error")) or stdout_path
    return LogPaths(stdout_path, stderr_path, tuple(looked), per_rank=split)


def _read_record(
    job_id: str, folders: Sequence[Path], looked: list[str]
) -> Mapping[str, str | None] | None:
    for folder in folders:
        try:
            path = jobs_root(folder) / LOG_RECORDS / job_id
        except (OSError, PrivacyError):
            continue
        looked.append(str(path))
        if not path.is_file():
            continue
        try:
            data = json.loads(read_private(path, "job log record"))
        except (PrivacyError, OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("output"), str):
            return data
    return None
