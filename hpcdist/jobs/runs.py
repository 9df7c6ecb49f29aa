"""A run's record, as the login node reads it: its pieces (each start of a job of the run,
written by the job's script, ``hpcdist.distributed.runpiece``), where each resumed from
(written by the training) and its heartbeat (``hpcdist.facts.heartbeat``).

Every file is read once and checked on what was opened: the record's files must be this
user's alone (private state), the heartbeat this user's and writable by nobody else.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.facts.heartbeat import HEARTBEAT_FILE, Heartbeat, parse
from hpcdist.facts.runs import glob_quote, run_id_problem
from hpcdist.spec.runopts import run_records
from hpcdist.state.runroot import run_folder_fd, walked_path
from hpcdist.state.trustedfile import Refused, read_at, read_private

TRAIN_SUFFIX = ".train.json"  # as hpcdist.distributed.runpiece names the training's note


@dataclass(frozen=True)
class Piece:
    """One start of a job of the run."""

    job_id: str
    restart: int  # SLURM's requeues of this job id before this start
    started: float
    run_dir: str
    workdir: str
    nodes: str
    resumed_from: dict[str, Any] | None  # the checkpoint's epoch, step, time; None: fresh
    # Whether the training has said where it starts (its note): a piece whose training has
    # not begun (or a command that is not hpcdist's training) resumed from nothing known.
    noted: bool = True

    @classmethod
    def from_files(cls, piece: dict[str, Any], note: dict[str, Any] | None) -> Piece:
        resumed = (note or {}).get("resumed_from")
        return cls(
            job_id=str(piece.get("job_id", "")),
            restart=int(piece.get("restart") or 0),
            started=float(piece.get("started") or 0.0),
            run_dir=str((note or {}).get("run_dir") or piece.get("run_dir") or ""),
            workdir=str(piece.get("workdir") or ""),
            nodes=str(piece.get("nodes") or ""),
            resumed_from=resumed if isinstance(resumed, dict) else None,
            noted=note is not None,
        )


@dataclass(frozen=True)
class Run:
    run_id: str
    pieces: tuple[Piece, ...]  # in the order they started

    @property
    def job_ids(self) -> list[str]:
        return list(dict.fromkeys(piece.job_id for piece in self.pieces))

    @property
    def last(self) -> Piece:
        return self.pieces[-1]


def _json(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(read_private(path, "run record"))
    except FileNotFoundError:
        return None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def run_ids(root: Path | None = None) -> list[str]:
    """The runs started from this folder, newest first."""
    root = run_records() if root is None else root
    try:
        folders = [p for p in root.iterdir() if p.is_dir() and not run_id_problem(p.name)]
    except OSError:
        return []
    return [p.name for p in sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True)]


def load_run(run_id: str, root: Path | None = None) -> Run | None:
    """The run's record; None if no run of that id was started from this folder."""
    if run_id_problem(run_id):
        return None
    folder = (run_records() if root is None else root) / run_id
    if not folder.is_dir():
        return None
    pieces = []
    for path in folder.glob("*.json"):
        if path.name.endswith(TRAIN_SUFFIX):
            continue
        piece = _json(path)
        if piece is not None:
            note = _json(_note_of(path))
            pieces.append(Piece.from_files(piece, note))
    if not pieces:
        return None
    return Run(run_id, tuple(sorted(pieces, key=lambda p: (p.started, p.restart))))


def run_of_job(job_id: str, root: Path | None = None) -> Run | None:
    """The run a job of this folder is a piece of (its newest, for a reused job id)."""
    root = run_records() if root is None else root
    for run_id in run_ids(root):
        if any((root / run_id).glob(f"{glob_quote(job_id)}-*.json")):
            return load_run(run_id, root)
    return None


def runs_by_job(root: Path | None = None) -> dict[str, str]:
    """job id -> run id, for every job of this folder's runs (the newest run wins)."""
    root = run_records() if root is None else root
    found: dict[str, str] = {}
    for run_id in reversed(run_ids(root)):  # oldest first: newer runs overwrite
        for path in (root / run_id).glob("*.json"):
            if not path.name.endswith(TRAIN_SUFFIX):
                found[path.name.rsplit("-", 1)[0]] = run_id
    return found


def trained_in(job_ids: list[str], root: Path | None = None) -> dict[str, Path]:
    """job id -> the run folder the job's script pointed its training to (``HPCDIST_RUN_DIR``,
    or the first job's folder for ``--continue``), as the job's newest piece of a run
    recorded it, for each of ``job_ids`` that started one from this folder. The script's
    word, not the training's note (a job may run more than one training), unless the note
    says the training's configuration chose the folder (``--set output.run_dir=``), which
    the script never knew."""
    root = run_records() if root is None else root
    found: dict[str, Path] = {}
    wanted = set(job_ids)
    for job_id, run_id in runs_by_job(root).items():
        if job_id not in wanted:
            continue
        pieces = [
            piece
            for path in (root / run_id).glob(f"{glob_quote(job_id)}-*.json")
            if not path.name.endswith(TRAIN_SUFFIX) and (piece := _run_dir_of(path)) is not None
        ]
        if pieces:
            newest = max(
                pieces, key=lambda p: (float(p.get("started") or 0), int(p.get("restart") or 0))
            )
            found[job_id] = Path(newest["run_dir"])
    return found


def _note_of(piece: Path) -> Path:
    """Where the training of the piece recorded at ``piece`` notes where it trains."""
    return piece.with_name(piece.name[: -len(".json")] + TRAIN_SUFFIX)


def _run_dir_of(path: Path) -> dict[str, Any] | None:
    """The piece at ``path`` with the folder its training used: the script's, or its
    training note's where the training's configuration chose it; None where it names none
    or cannot be read."""
    piece = _json(path)
    if piece is None:
        return None
    note = _json(_note_of(path)) or {}
    if note.get("run_dir_from") == "config" and isinstance(note.get("run_dir"), str):
        piece = {**piece, "run_dir": note["run_dir"]}
    run_dir = piece.get("run_dir")
    return piece if isinstance(run_dir, str) and run_dir else None


def read_heartbeat(run: Run) -> tuple[Heartbeat | None, str]:
    """The run's heartbeat and "" or None and why there is none to show."""
    piece = run.last
    run_dir = Path(piece.run_dir)
    path = run_dir / HEARTBEAT_FILE
    job_folder = (Path(piece.workdir),) if piece.workdir else ()  # a root of its own
    try:
        with run_folder_fd(run_dir, extra=job_folder) as fd:
            found = read_at(fd, path, "heartbeat")
    except FileNotFoundError:
        return None, f"no heartbeat yet in {run_dir}"
    except Refused as exc:
        return None, f"heartbeat not read: {exc}"
    except OSError as exc:
        return None, f"heartbeat {path} cannot be read: {os.strerror(exc.errno or 0)}"
    beat = parse(found.data)
    if beat is None:
        return None, f"heartbeat {path} is not JSON"
    here = str(walked_path(run_dir, job_folder))
    if beat.run_dir and beat.run_dir != here:  # another run folder's, moved into this name
        return None, (
            f"heartbeat in {here} not shown: it is run {beat.run_id or 'unknown'}'s, "
            f"written in {beat.run_dir}"
        )
    return beat, ""
