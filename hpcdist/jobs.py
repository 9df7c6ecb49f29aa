"""Job records of this project folder, and the state, logs and cancellation of a job.

Records live in ``.hpcdist/jobs/<id>.json``, one file per job written atomically, so two
commands running at once never corrupt each other's records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcdist.errors import UserError
from hpcdist.fileutil import write_atomic

# States after which a job never runs again (sacct may add "by <uid>" to CANCELLED).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
                          "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})


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

    def log_path(self, rank: int, stream: str = "out") -> Path:
        return Path(self.folder) / f"{self.job_id}_{rank}_log.{stream}"


def jobs_root(project_dir: Path | None = None) -> Path:
    base = project_dir if project_dir is not None else Path(os.environ.get("HPCDIST_HOME", "."))
    return (base / ".hpcdist").resolve()


def save_record(record: JobRecord, project_dir: Path | None = None) -> Path:
    path = jobs_root(project_dir) / "jobs" / f"{record.job_id}.json"
    write_atomic(path, json.dumps(asdict(record), indent=2) + "\n")
    return path


def load_record(job_id: str, project_dir: Path | None = None) -> JobRecord:
    path = jobs_root(project_dir) / "jobs" / f"{job_id}.json"
    if not path.is_file():
        raise UserError(f"job {job_id!r} was not submitted from this folder; "
                        "expected an id from `hpcdist list`")
    return JobRecord(**json.loads(path.read_text(encoding="utf-8")))


def list_records(project_dir: Path | None = None) -> list[JobRecord]:
    folder = jobs_root(project_dir) / "jobs"
    records = []
    for path in folder.glob("*.json"):
        try:
            records.append(JobRecord(**json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue  # a record being replaced right now; the next call sees it
    return sorted(records, key=lambda r: r.submitted, reverse=True)


def job_state(record: JobRecord) -> str:
    if record.executor == "slurm":
        return _slurm_state(record.job_id)
    return _local_state(record)


def _slurm_state(job_id: str) -> str:
    """The controller's view first: sacct lags it and, while a job is being requeued, can
    briefly report the ending attempt as FAILED. sacct answers once the controller has
    forgotten the job (MinJobAge after it ended)."""
    queue = subprocess.run(["squeue", "-t", "all", "-h", "-j", job_id, "-o", "%T"],
                           capture_output=True, text=True, timeout=30)
    live = queue.stdout.strip().upper()
    if queue.returncode == 0 and live:
        return live
    proc = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"],
                          capture_output=True, text=True, timeout=30)
    states = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    # "CANCELLED by 0" -> CANCELLED; a requeued job lists its latest attempt last.
    return states[-1].upper() if states else "UNKNOWN"


def _local_state(record: JobRecord) -> str:
    folder = Path(record.folder)
    if (folder / "cancelled").exists():
        return "CANCELLED"
    if not process_exited(int(record.job_id)):
        return "RUNNING"
    codes = []
    for rank in range(record.tasks):
        exit_file = folder / f"exit_{rank}.json"
        if exit_file.is_file():
            codes.append(int(json.loads(exit_file.read_text())["returncode"]))
    if len(codes) == record.tasks and all(code == 0 for code in codes):
        return "COMPLETED"
    return "FAILED"


def process_exited(pid: int) -> bool:
    """Whether a process is gone or a zombie nobody has reaped yet (finished, not alive).

    Read from /proc rather than Popen.poll: the caller may not own the process, or may be a
    signal handler that interrupted Popen.wait, which holds the lock poll needs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def cancel(record: JobRecord) -> None:
    if record.executor == "slurm":
        proc = subprocess.run(["scancel", record.job_id], capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"scancel {record.job_id} failed: {proc.stderr.strip()}")
        return
    write_atomic(Path(record.folder) / "cancelled", f"{time.time()}\n")
    # submitit's local controller forwards SIGTERM to every task it started.
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(record.job_id), signal.SIGTERM)


def read_log(record: JobRecord, rank: int) -> str:
    parts = []
    for stream in ("out", "err"):
        path = record.log_path(rank, stream)
        if path.is_file():
            parts.append(path.read_text(errors="replace"))
    return "".join(parts)


def wait_for_final_state(record: JobRecord, timeout_s: float | None = None,
                         poll_s: float = 2.0) -> str:
    start = time.monotonic()
    while True:
        state = job_state(record)
        if state in FINAL_STATES:
            return state
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            return state
        time.sleep(poll_s)
