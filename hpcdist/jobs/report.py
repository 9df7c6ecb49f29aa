"""``hpcdist report JOB``: the points of a sweep (or one job) side by side, best first.

Each row is one training: its overrides, its state, and what its ``training_results.json``
says (best validation loss, R^2, epochs, wall time). The run folders are the training's
defaults below the folder the job ran in (its ``--chdir``, as its record or SLURM's WorkDir
says; else the project folder): ``runs/<array job id>_<task id>`` for an array task,
``runs/<job id>`` for a single job; a job that trained in a folder of its own
(``HPCDIST_RUN_DIR``, ``--continue``) is read where its piece of its run's record says.
A task that failed says why: the last error line of its rank 0 log; a row without results
says which folder was looked in.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpcdist.facts.runs import RESULTS_FILE, RUNS_DIR
from hpcdist.jobs.arrays import sweep_states
from hpcdist.jobs.logpaths import job_logs
from hpcdist.jobs.logread import ForeignLog, one_line, read_log_bytes
from hpcdist.jobs.records import JobRecord, find_record, job_state, load_record
from hpcdist.jobs.runs import trained_in
from hpcdist.jobs.sweeparrays import SweepArray, from_lists, sweep_tasks
from hpcdist.slurm.query import JobInfo, query_jobs
from hpcdist.spec.runopts import run_records
from hpcdist.state.digests import DigestBook
from hpcdist.state.folders import project_base
from hpcdist.state.outputs import OutputRefused, book_for, read_output

# The lines a failing training leaves in its log, most telling first: ufsemulator's one-line
# user errors, then the last line of a Python traceback.
_ERROR_LINES = (re.compile(r"^error: (?P<why>.+)$"), re.compile(r"^(?P<why>\w*Error: .+)$"))
_REASON_CHARS = 300
_LABEL = re.compile(r"^[0-9]+: ")
# States in which no results are expected yet.
_UNFINISHED = ("RUNNING", "PENDING", "REQUEUED")


@dataclass(frozen=True)
class Row:
    job_id: str
    overrides: list[str]  # the --set values of this point (all of them)
    state: str
    best_val_loss: float | None
    val_r2: float | None  # at the best epoch
    epochs: int | None
    wall_time_s: float | None  # the training's own, from train() on
    run_dir: str
    reason: str | None = None  # why a task did not complete, or where no results were found
    best: bool = False
    val_curve: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["val_curve"] = list(self.val_curve)
        return data


def task_ids(record: JobRecord) -> list[tuple[str, list[str]]]:
    """(job id, overrides) of each training of a record: a sweep's tasks (in the arrays it
    was queued as), or the job."""
    points = record.points or [[]]
    if "_" not in record.job_id and record.points is not None and len(points) > 1:
        tasks = sweep_tasks(record.job_id, len(points), record_arrays(record))
        return list(zip(tasks, points, strict=True))
    return [(record.job_id, points[0])]


def record_arrays(record: JobRecord) -> list[SweepArray] | None:
    return from_lists(record.arrays) if record.arrays else None


def collect(job_id: str, project_dir: Path | None = None) -> list[Row]:
    """The rows of a job or an array, sorted by best validation loss, the best marked: one
    of this folder's submissions, else any job SLURM knows (a rendered script run with
    sbatch), its points read from each run's training_results.json."""
    record = find_record(job_id, project_dir)
    if record is None:
        return mark_best(_rows_from_slurm(job_id))
    runs = job_folder(record, project_dir) / RUNS_DIR
    book = book_for(runs.parent)  # the digests the training there recorded
    ids = task_ids(record)
    # A run folder of its own (HPCDIST_RUN_DIR, --continue) is where its run's record says.
    trained = trained_in([task for task, _ in ids], run_records(project_dir))
    states = _states(record, [task for task, _ in ids])
    folders = [project_base(project_dir), runs.parent]
    infos: dict[str, JobInfo] | None = None

    def logs_of(task: str) -> Callable[[], list[Path]]:
        def logs() -> list[Path]:
            nonlocal infos
            if infos is None and record.executor == "slurm":  # asked only for a failed task
                ids = [a.array_id for a in record_arrays(record) or []] or [job_id]
                infos = {info.job_id: info for one in ids for info in query_jobs(one)}
            return _task_logs(record, task, infos or {}, folders, project_dir)

        return logs

    rows = [
        _row(
            task,
            overrides,
            states.get(task, "UNKNOWN"),
            trained.get(task, runs / task),
            logs_of(task),
            book,
        )
        for task, overrides in ids
    ]
    return mark_best(rows)


def _task_logs(
    record: JobRecord,
    task: str,
    infos: Mapping[str, JobInfo],
    folders: Sequence[Path],
    project_dir: Path | None,
) -> list[Path]:
    """Where a task's log is: the script's own log, as SLURM (or the job's log record)
    names it; a local job's rank 0 files."""
    if record.executor == "slurm":
        info = infos.get(task)
        found = job_logs(info, None, folders) if info is not None else None
        return [path for path, _ in found.files()] if found is not None else []
    local = find_record(task, project_dir) or record
    return [local.log_path(0, stream) for stream in ("out", "err")]


def job_folder(record: JobRecord, project_dir: Path | None = None) -> Path:
    """The folder a job ran in: its record's (``--chdir`` from the submit folder), else
    SLURM's WorkDir for it (a record written before the folder was kept), else the
    project folder."""
    if record.workdir is not None:
        return Path(record.workdir)
    if record.executor == "slurm":
        found = [info.workdir for info in query_jobs(record.job_id) if info.workdir]
        if found:
            return Path(found[0])
    return project_base(project_dir)


def _states(record: JobRecord, tasks: list[str]) -> dict[str, str]:
    if len(tasks) > 1 and record.executor == "slurm":
        return sweep_states(record.job_id, len(tasks), record_arrays(record))
    return {tasks[0]: job_state(record)}


def _row(
    task: str,
    overrides: list[str],
    state: str,
    run_dir: Path,
    logs: Callable[[], list[Path]],
    book: DigestBook,
) -> Row:
    path = run_dir / RESULTS_FILE
    refused = ""
    try:
        results = read_results(path, book)
    except OutputRefused as exc:  # its numbers are not shown: they may be anyone's
        results, refused = {}, str(exc)
    history = results.get("history") if isinstance(results.get("history"), dict) else {}
    curve = tuple(float(v) for v in (history or {}).get("val_loss", []) if _is_number(v))
    reason = None
    if state not in ("COMPLETED", *_UNFINISHED, "UNKNOWN"):
        reason = failure_reason(logs())
        if reason is None:
            reason = f"ended {state}" + ("" if results else f"; {_no_results(path)}")
    elif not results and state not in _UNFINISHED:
        # A row of dashes says where it looked: a job run elsewhere (--chdir) or a command
        # that writes no results is told apart from a training that lost them.
        reason = _no_results(path)
    reason = refused or reason
    return Row(
        job_id=task,
        overrides=list(overrides),
        state=state,
        best_val_loss=_number(results.get("best_val_loss")),
        val_r2=_number(results.get("best_val_r2")),
        epochs=results.get("epochs_run") if isinstance(results.get("epochs_run"), int) else None,
        wall_time_s=_number(results.get("wall_time_s")),
        run_dir=str(run_dir),
        reason=reason,
        val_curve=curve,
    )


def _rows_from_slurm(job_id: str) -> list[Row]:
    infos = [info for info in query_jobs(job_id) if "[" not in info.job_id]
    if not infos:
        load_record(job_id)  # the one-line error of an id nobody knows
    rows = []
    trained = trained_in([info.job_id for info in infos], run_records())
    for info in sorted(infos, key=lambda i: _task_number(i.job_id)):
        default = Path(info.workdir or ".") / RUNS_DIR / info.job_id
        run_dir = trained.get(info.job_id, default)
        book = book_for(default.parent.parent)  # the job's folder: its training's digests
        try:
            recorded = read_results(run_dir / RESULTS_FILE, book).get("overrides")
        except OutputRefused:
            recorded = None  # _row says why
        overrides = (
            [f"{key}={json.dumps(value)}" for key, value in recorded.items()]
            if isinstance(recorded, dict)
            else []
        )
        logs = [Path(p) for p in (info.stdout, info.stderr) if p]
        rows.append(_row(info.job_id, overrides, info.state, run_dir, _given(logs), book))
    return rows


def _no_results(path: Path) -> str:
    if path.exists():
        return f"{str(path)!r} cannot be read as the training's results"
    return f"no {path.name} in {str(path.parent)!r}"


def read_results(path: Path, book: DigestBook) -> dict[str, Any]:
    """A run's training_results.json, {} where there is none (yet) or it cannot be read;
    OutputRefused (one line) where it is another user's or not as the training wrote it."""
    try:
        data = json.loads(read_output(path, book, "training results").data)
    except OutputRefused:
        raise
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _given(logs: list[Path]) -> Callable[[], list[Path]]:
    return lambda: logs


def failure_reason(logs: Sequence[Path]) -> str | None:
    """The last error line of a task's logs (ufsemulator's ``error: ...`` first). A log is
    read as ``hpcdist logs`` reads it: a link or another user's file at its name (a job
    found through SLURM may be theirs) is not read at all."""
    text = ""
    for path in dict.fromkeys(logs):
        try:
            text += read_log_bytes(path).decode(errors="replace")
        except (ForeignLog, OSError):
            continue
    # srun --label puts the rank before each of its lines (``0: error: ...``).
    lines = [_LABEL.sub("", line.strip(), count=1) for line in text.splitlines()]
    for pattern in _ERROR_LINES:
        found = [m["why"] for line in lines if (m := pattern.match(line))]
        if found:
            return found[-1][:_REASON_CHARS]
    return None


def mark_best(rows: Sequence[Row]) -> list[Row]:
    """Sorted by best validation loss (rows without one last, in task order); the lowest
    marked best."""
    ordered = sorted(
        rows, key=lambda r: (r.best_val_loss is None, r.best_val_loss or 0.0, _task_key(r))
    )
    if ordered and ordered[0].best_val_loss is not None:
        first = ordered[0]
        ordered[0] = Row(**{**asdict(first), "best": True, "val_curve": first.val_curve})
    return ordered


def _task_key(row: Row) -> int:
    return _task_number(row.job_id)


def _task_number(job_id: str) -> int:
    tail = job_id.rpartition("_")[2]
    return int(tail) if "_" in job_id and tail.isdigit() else 0


def varying(rows: Sequence[Row]) -> list[list[str]]:
    """Each row's overrides without those every row shares: what tells the points apart."""
    shared = set.intersection(*(set(r.overrides) for r in rows)) if len(rows) > 1 else set()
    return [[o for o in r.overrides if o not in shared] for r in rows]


def table(rows: Sequence[Row]) -> str:
    """The rows as a plain-text table, then one line per task that failed. Every value is
    printed with its control characters escaped (``one_line``): a reason is a log's line, a
    folder SLURM's WorkDir, and a job found through SLURM may be another user's."""
    labels = [one_line(" ".join(v)) or "-" for v in varying(rows)]
    head = ("", "job", "overrides", "state", "best val loss", "R^2", "epochs", "wall s")
    body = [
        (
            "*" if r.best else "",
            one_line(r.job_id),
            label,
            one_line(r.state),
            _fmt(r.best_val_loss, ".4g"),
            _fmt(r.val_r2, ".4f"),
            "-" if r.epochs is None else str(r.epochs),
            _fmt(r.wall_time_s, ".1f"),
        )
        for r, label in zip(rows, labels, strict=True)
    ]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (head, *body)
    ]
    lines += [one_line(f"{r.job_id} {r.state}: {r.reason}") for r in rows if r.reason]
    best = next((r for r in rows if r.best), None)
    if best is not None:
        lines.append(one_line(f"best: {best.job_id} ({best.run_dir})"))
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], path: Path) -> None:
    """Every row's validation loss per epoch on one log-scale chart, labelled by overrides."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    labels = [" ".join(v) or r.job_id for r, v in zip(rows, varying(rows), strict=True)]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        for row, label in zip(rows, labels, strict=True):
            if row.val_curve:
                mark = " (best)" if row.best else ""
                ax.plot(range(1, len(row.val_curve) + 1), row.val_curve, label=label + mark)
        if all(v > 0 for r in rows for v in r.val_curve) and any(r.val_curve for r in rows):
            ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation loss (normalised units)")
        ax.grid(True, alpha=0.3)
        if any(r.val_curve for r in rows):
            ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def _number(value: object) -> float | None:
    return float(value) if _is_number(value) else None  # type: ignore[arg-type]


def _is_number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
