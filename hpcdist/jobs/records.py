"""Job records of this project folder, and the state, logs and cancellation of a job.

Records live in ``.hpcdist/jobs/<id>.json``, one file per job written atomically, so two
commands running at once never corrupt each other's records.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from hpcdist.errors import UserError
from hpcdist.facts.protocol import LOCAL_BATCH_EXIT, local_exit_name, local_log_name
from hpcdist.jobs.localjob import ProcessIdentity, stop_tree
from hpcdist.jobs.logread import read_log_text
from hpcdist.slurm.cluster import scancel
from hpcdist.slurm.freshness import shown
from hpcdist.slurm.parse import FINAL_STATES
from hpcdist.slurm.query import slurm_job_state
from hpcdist.slurm.userjobs import seen
from hpcdist.state.fileutil import write_atomic
from hpcdist.state.folders import jobs_root, state_dir
from hpcdist.state.private import (
    PRIVATE_FILE_MODE,
    PrivacyError,
    check_private_chain,
)
from hpcdist.state.trustedfile import read_private


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    executor: str
    name: str
    mode: str
    nodes: int
    tasks: int
    folder: str
    submitted: float
    command: list[str]
    # A local job's controller start time: with the pid (job_id), its identity (localjob).
    start_ticks: int | None = None
    # A sweep (hpcdist.spec.sweep): on the array's record, each task's --set values by task id;
    # on a task's record or a job with --set, its own one list.
    points: list[list[str]] | None = None
    # The folder the job runs in (its --chdir from the submit folder, else that folder):
    # where `report` finds its runs/. None in records written before it was kept.
    workdir: str | None = None
    # A sweep's record: the arrays it was queued as ([array id, first point, tasks] each;
    # several where the site's MaxArraySize requires), hpcdist.jobs.sweeparrays.
    arrays: list[list[Any]] | None = None

    @property
    def local_process(self) -> ProcessIdentity | None:
        if self.executor != "local" or self.start_ticks is None:
            return None
        return ProcessIdentity(int(self.job_id), self.start_ticks)

    def log_path(self, rank: int, stream: str = "out") -> Path:
        """A local job's rank log (``hpcdist.distributed.localstep``); a SLURM job's logs
        are where its script says (``hpcdist.jobs.logpaths``)."""
        return Path(self.folder) / local_log_name(self.job_id, rank, stream)


def save_record(
    record: JobRecord,
    project_dir: Path | None = None,
    durable: bool = True,
    folder: Path | None = None,
) -> Path:
    """Write a job's record (``durable`` False: without fsync, for a sweep's task records,
    which its own record holds too; ``folder``: the records' folder, checked already)."""
    folder = folder or state_dir("jobs", project_dir=project_dir)
    path = folder / f"{record.job_id}.json"
    text = json.dumps(asdict(record), indent=2) + "\n"
    write_atomic(path, text, mode=PRIVATE_FILE_MODE, durable=durable)
    return path


# A SLURM job id, an array task (123_4) or a local job's process id: never a path.
_JOB_ID = re.compile(r"[1-9][0-9]{0,17}(_[0-9]{1,9})?")
_EXECUTORS = ("slurm", "local")


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise UserError(
            f"job id {job_id!r} is not a job id; expected digits such as 1234 "
            "(or 1234_5 for an array task)"
        )
    return job_id


def load_record(job_id: str, project_dir: Path | None = None) -> JobRecord:
    record = find_record(job_id, project_dir)
    if record is None:
        raise UserError(
            f"job {job_id!r} was not submitted from this folder; expected an id from `hpcdist list`"
        )
    return record


def find_record(job_id: str, project_dir: Path | None = None) -> JobRecord | None:
    """This folder's record of a job, None if it has none; a corrupt one is a UserError."""
    root = jobs_root(project_dir)
    path = root / "jobs" / f"{check_job_id(job_id)}.json"
    # Another user's record could name any process for `cancel` to stop: only ours count.
    check_private_chain(path, root, "job record")
    return read_record(path) if path.is_file() else None


def read_record(path: Path) -> JobRecord:
    """A record file, checked field by field: one bad file is one line, never a traceback."""
    try:
        data = json.loads(read_private(path, "job record"))
    except PrivacyError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(
            f"job record {str(path)!r} cannot be read ({_reason(exc)}); "
            "remove it or submit the job again"
        ) from exc
    problem = _record_problem(data)
    if problem:
        raise UserError(f"job record {str(path)!r} is corrupt: {problem}; remove it")
    return JobRecord(**data)


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or type(exc).__name__


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "job_id": (str,),
    "executor": (str,),
    "name": (str,),
    "mode": (str,),
    "nodes": (int,),
    "tasks": (int,),
    "folder": (str,),
    "submitted": (int, float),
    "command": (list,),
    "start_ticks": (int, type(None)),
    "points": (list, type(None)),
    "workdir": (str, type(None)),
    "arrays": (list, type(None)),
}
_OPTIONAL_FIELDS = {"start_ticks", "points", "workdir", "arrays"}


def _record_problem(data: Any) -> str:
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    names = {f.name for f in fields(JobRecord)}
    missing = sorted(names - set(data) - _OPTIONAL_FIELDS)
    if missing:
        return f"missing {missing[0]!r}"
    unknown = sorted(set(data) - names)
    if unknown:
        return f"unknown key {unknown[0]!r}"
    for key, types in _FIELD_TYPES.items():
        value = data.get(key)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{key} is {value!r}"
    if not _JOB_ID.fullmatch(data["job_id"]) or data["executor"] not in _EXECUTORS:
        return f"job {data['job_id']!r} of executor {data['executor']!r}"
    points = data.get("points")
    if points is not None and not all(
        isinstance(p, list) and all(isinstance(t, str) for t in p) for p in points
    ):
        return f"points is {points!r}"
    if not _arrays_ok(data.get("arrays")):
        return f"arrays is {data['arrays']!r}"
    if data["tasks"] < 1 or data["nodes"] < 1:
        return f"{data['nodes']} nodes, {data['tasks']} tasks"
    return ""


def _arrays_ok(arrays: Any) -> bool:
    """None, or [[array job id, first point, tasks], ...]."""
    return arrays is None or all(
        isinstance(a, list)
        and len(a) == 3
        and isinstance(a[0], str)
        and a[0].isdigit()
        and all(isinstance(n, int) and not isinstance(n, bool) for n in a[1:])
        and a[1] >= 0
        and a[2] >= 1
        for a in arrays
    )


def scan_records(project_dir: Path | None = None) -> tuple[list[JobRecord], list[str]]:
    """Every readable record, newest first, and one line for each file that is not."""
    root = jobs_root(project_dir)
    folder = root / "jobs"
    check_private_chain(folder, root, "hpcdist's private folder")
    records, problems = [], []
    for path in folder.glob("*.json"):
        try:
            records.append(read_record(path))
        except UserError as exc:
            problems.append(str(exc))
    return sorted(records, key=lambda r: r.submitted, reverse=True), problems


def list_records(project_dir: Path | None = None) -> list[JobRecord]:
    return scan_records(project_dir)[0]


def job_state(record: JobRecord, within: float | None = None) -> str:
    """The job's state now (``within``: a waiter's question, slurm.query.slurm_job_state)."""
    if record.executor == "slurm":
        return slurm_job_state(record.job_id, within)
    return _local_state(record)


def shown_state(record: JobRecord, state: str) -> str:
    """``state`` as a command prints it: with its age where SLURM's view of it is old, with
    the controller's silence where it does not answer (hpcdist.slurm.freshness)."""
    return shown(state, seen() if record.executor == "slurm" else None)


def _local_state(record: JobRecord) -> str:
    folder = Path(record.folder)
    if (folder / "cancelled").exists():
        return "CANCELLED"
    process = record.local_process
    # Only the controller that was started for this job counts, never a reused pid.
    if process is not None and process.is_running():
        return "RUNNING"
    if _exit_code(folder / LOCAL_BATCH_EXIT) not in (None, 0):
        return "FAILED"  # the batch script failed, before or after its ranks
    # A rank without an exit record did not finish.
    codes = [_exit_code(folder / local_exit_name(rank)) for rank in range(record.tasks)]
    return "COMPLETED" if all(code == 0 for code in codes) else "FAILED"


def _exit_code(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["returncode"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def local_elapsed(record: JobRecord) -> float | None:
    """Seconds a local job has run (so far), from its submission to its last rank's exit;
    None when that is not known."""
    process = record.local_process
    if process is not None and process.is_running():
        return time.time() - record.submitted
    finished = []
    for rank in range(record.tasks):
        try:
            data = json.loads((Path(record.folder) / local_exit_name(rank)).read_text())
            finished.append(float(data["finished"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return max(finished) - record.submitted if finished else None


def cancel(record: JobRecord) -> str:
    """Stop a job that has not ended; returns the state it had. A job that has ended is
    left as it is (its record and state are never rewritten)."""
    state = job_state(record)
    if state in FINAL_STATES:
        return state
    if record.executor == "slurm":
        for array in record.arrays or [[record.job_id]]:  # every array of a split sweep
            scancel(str(array[0]))
        return state
    process = record.local_process
    if process is None or not process.is_running():
        return job_state(record)
    write_atomic(Path(record.folder) / "cancelled", f"{time.time()}\n")
    # The controller, the batch shell, each rank and its command.
    stop_tree(process)
    return state


def read_log(record: JobRecord, rank: int) -> str:
    parts = []
    for stream in ("out", "err"):
        parts.append(read_log_text(record.log_path(rank, stream)))
    return "".join(parts)


def wait_for_final_state(
    record: JobRecord, timeout_s: float | None = None, poll_s: float = 2.0
) -> str:
    start = time.monotonic()
    while True:
        state = job_state(record)
        if state in FINAL_STATES:
            return state
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return state
        time.sleep(poll_s)
