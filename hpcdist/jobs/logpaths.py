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
from hpcdist.slurm.parse import FINAL_STATES
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
    raw_id: str | None = None,
) -> str:
    """A log file name pattern as SLURM expands it (sbatch(1), "filename pattern"):
    ``%j`` the job's own id (``raw_id``: an array task has one of its own, which is not
    ``%A_%a``), ``%A``/``%a`` the array's job and task ids, ``%x`` the job name, ``%t`` the
    task (rank), ``%u`` the user, ``%%`` a percent sign; a width zero-pads (``%4j``). ``%t``
    stays as it is where no rank is asked for; node names (``%N``, ``%n``) and the step
    (``%s``) stay too."""
    array_job, _, array_task = job_id.partition("_")
    own = raw_id or job_id
    values = {
        "j": own,
        "J": own,
        "A": array_job if array_task else own,
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
    # Files named for the job, where neither SLURM nor a record names its logs: which
    # stream each holds is not known (stdout and stderr are then None).
    guesses: tuple[Path, ...] = ()

    @property
    def guessed(self) -> bool:
        return bool(self.guesses)

    def files(self) -> list[tuple[Path, bool]]:
        """(path, is stderr) of each distinct log, stdout first; each guess as stdout."""
        found = [] if self.stdout is None else [(self.stdout, False)]
        if self.stderr is not None and self.stderr != self.stdout:
            found.append((self.stderr, True))
        return found + [(guess, False) for guess in self.guesses]


def job_logs(
    info: JobInfo, rank: int | None = None, state_folders: Sequence[Path] = ()
) -> LogPaths:
    """The logs of ``info`` (rank ``rank``'s own files where the job split them): the
    controller's own paths while it knows the job (they hold what sbatch's command line
    changed too); after, the patterns of the job's log record, expanded here; without a
    record, sacct's path (SLURM >= 23.02), and last a file in WorkDir named for the job."""
    looked: list[str] = []
    workdir = Path(info.workdir) if info.workdir else None
    folders = list(dict.fromkeys([*state_folders, *([workdir] if workdir else [])]))
    controller = info.source == "scontrol" and info.stdout is not None
    # While the controller names the logs, the record only tells whether a rank has its own.
    needed = not controller or rank is not None
    record = _read_record(_record_names(info), folders, looked) if needed else None
    split = record is not None and record.get("rank_logs") == "split" and rank is not None
    if controller or (record is None and info.stdout is not None):
        assert info.stdout is not None
        looked.insert(0, f"SLURM's StdOut {info.stdout}")
        stdout, stderr = info.stdout, info.stderr or info.stdout
        if split:
            stdout, stderr = (rank_log_pattern(p, str(rank)) for p in (stdout, stderr))
        return LogPaths(Path(stdout), Path(stderr), tuple(looked), per_rank=split)
    if record is None:
        return _guessed(info, looked)
    base = workdir or Path.cwd()

    def path(pattern: str | None) -> Path | None:
        if not pattern:
            return None
        if split:
            pattern = rank_log_pattern(pattern, str(rank))
        name = str(record.get("name", ""))
        expanded = Path(expand_pattern(pattern, info.job_id, name, raw_id=info.raw_id))
        return expanded if expanded.is_absolute() else base / expanded

    stdout_path = path(record.get("output"))
    stderr_path = path(record.get("error")) or stdout_path
    return LogPaths(stdout_path, stderr_path, tuple(looked), per_rank=split)


def job_record(info: JobInfo, folders: Sequence[Path]) -> Mapping[str, object] | None:
    """The job's log record (a script hpcdist rendered leaves one) in ``folders`` or its
    WorkDir; None without one."""
    workdir = [Path(info.workdir)] if info.workdir else []
    return _read_record(_record_names(info), list(dict.fromkeys([*folders, *workdir])), [])


def _record_names(info: JobInfo) -> list[str]:
    """The names the job's log record may have: the job's own id (the script writes it
    under SLURM_JOB_ID, which for an array task is not ``A_a``), then the id asked."""
    return list(dict.fromkeys(n for n in (info.raw_id, info.job_id) if n))


# The suffixes of a log a job's name may give (``-o x-%j.txt``), besides SLURM's own .out.
_LOG_SUFFIXES = (".out", ".log", ".err", ".txt")


def _guessed(info: JobInfo, looked: list[str]) -> LogPaths:
    """Neither SLURM nor a record names the logs: every file in WorkDir named for the job,
    said to be guesses (which of them holds which stream is not known); or none."""
    looked.append(f"SLURM's StdOut of job {info.job_id} (unknown)")
    guesses = named_for_job(Path(info.workdir), info.raw_id or info.job_id) if info.workdir else []
    if not guesses and info.guessed_log is not None:
        guesses = [Path(info.guessed_log)]
    if not guesses:
        return LogPaths(None, None, tuple(looked))
    listed = ", ".join(str(guess) for guess in guesses)
    looked.append(f"files named for the job in its WorkDir: {listed} (a guess)")
    return LogPaths(None, None, tuple(looked), guesses=tuple(guesses))


def named_for_job(workdir: Path, job_id: str) -> list[Path]:
    """The logs in ``workdir`` whose name holds ``job_id`` (not as part of a longer
    number), stdout-looking names first; a rank's own file beside one of them is left out."""
    named = re.compile(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])")
    try:
        found = [
            path
            for path in workdir.iterdir()
            if path.suffix in _LOG_SUFFIXES and named.search(path.name) and path.is_file()
        ]
    except OSError:
        return []
    ranks = {rank_log_pattern(str(path), "") for path in found}
    kept = [path for path in found if not _a_ranks_file(path, ranks)]
    return sorted(kept, key=lambda path: (_looks_like_stderr(path.name), path.name))


def _a_ranks_file(path: Path, ranks: set[str]) -> bool:
    """``o-140.rank1.log`` beside ``o-140.log``: a rank's own file, not the job's log."""
    found = re.fullmatch(r"(.*\.rank)[0-9]+(\..*)?", str(path))
    return found is not None and f"{found[1]}{found[2] or ''}" in ranks


def _looks_like_stderr(name: str) -> bool:
    """``e-123.log``, ``x-123.err``: last among the guesses."""
    return bool(re.search(r"(^e[-_.]|err)", name))


def _read_record(
    names: Sequence[str], folders: Sequence[Path], looked: list[str]
) -> Mapping[str, str | None] | None:
    for folder, name in ((f, n) for f in folders for n in names):
        try:
            path = jobs_root(folder) / LOG_RECORDS / name
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


# States in which a job has not started (yet, or again): its log may still come.
_NOT_STARTED = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"})
# A job in these states has ended (or SLURM forgot it): a missing log will not come.
_ENDED = FINAL_STATES | {"UNKNOWN"}


def missing_log(whose: str, state: str, paths: Sequence[Path]) -> str:
    """One line for a log that is not there, true to the job's state: not started yet, not
    written yet, or never written (an ended job's log will not appear)."""
    where = ", ".join(str(path) for path in paths)
    if state in _NOT_STARTED:
        return f"{whose} has not started ({state}): no log yet; it will be {where}"
    if state in _ENDED:
        return f"{whose} ({state}) left no log at {where} (never written, or removed since)"
    return f"{whose} ({state}) has no log yet at {where}"


def array_tasks(job_id: str, found: Sequence[JobInfo]) -> list[JobInfo]:
    """The tasks (or waiting task ranges, ``A_[2-3]``) of ``job_id`` where it names a job
    array rather than one job: [] for one job or one task."""
    if "_" in job_id:
        return []
    return [info for info in found if info.job_id.startswith(job_id + "_")]


def array_logs_line(job_id: str, tasks: Sequence[JobInfo], shown: int = 6) -> str:
    """One line for ``logs`` of an array's id: each task has a log of its own, named by
    its task id; the tasks SLURM knows, with their states, and how to pick one."""
    listed = ", ".join(f"{task.job_id} {task.state}" for task in tasks[:shown])
    more = f" and {len(tasks) - shown} more" if len(tasks) > shown else ""
    ran = [task.job_id for task in tasks if "[" not in task.job_id]
    if not ran:
        return (
            f"job {job_id} is a job array whose tasks have not started ({listed}); each "
            f"task will have a log of its own: hpcdist logs {job_id}_<task>, e.g. {job_id}_0"
        )
    return (
        f"job {job_id} is a job array; each task has a log of its own: hpcdist logs "
        f"{job_id}_<task>, e.g. hpcdist logs {ran[0]} (tasks: {listed}{more})"
    )


def no_log_line(
    info: JobInfo, state: str, rank: int | None, paths: Sequence[Path], folders: Sequence[Path]
) -> str:
    """``missing_log`` for a job, or for a rank of its: where the job's ranks wrote files
    of their own and this one wrote none, which ranks did (a rank the job never had)."""
    job = info.job_id
    if rank is None:
        return missing_log(f"job {job}", state, paths)
    whose = f"rank {rank} of job {job}"
    if state not in _ENDED or not job_logs(info, rank, folders).per_rank:
        return missing_log(whose, state, paths)
    wrote = [
        k
        for k in range(min(rank, 4096))
        if any(path.is_file() for path, _ in job_logs(info, k, folders).files())
    ]
    if not wrote:
        return missing_log(whose, state, paths)
    listed = str(wrote[0]) if len(wrote) == 1 else f"{wrote[0]}-{wrote[-1]}"
    return (
        f"{whose} ({state}) left no log at {', '.join(map(str, paths))}; rank {listed} of "
        f"the job wrote one: is {rank} a rank of job {job}?"
    )
