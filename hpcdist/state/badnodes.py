"""The nodes a run leaves behind, kept in the private state (``.hpcdist/badnodes/<run>``):
a file that another user could write would let them steer the user's jobs onto, or off,
nodes of their choosing, so it is written 0600 in a private folder and read only when it is
the user's alone. The record's format: ``hpcdist.facts.badnodes``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hpcdist.facts.badnodes import (
    BAD_NODES_DIR,
    BadNode,
    records_from_json,
    records_to_json,
    still_bad,
)
from hpcdist.state.folders import jobs_root, state_dir
from hpcdist.state.private import write_private
from hpcdist.state.trustedfile import read_private

_WHAT = "bad-node record"


def _name(run: str) -> str:
    return (run.replace("/", "_") or "run") + ".json"


def record_path(run: str, project_dir: Path | None = None) -> Path:
    """The record of the run whose folder is named ``run`` (``runs/<run>``); its folder
    created private or checked."""
    return state_dir(BAD_NODES_DIR, project_dir=project_dir) / _name(run)


def read_bad_nodes(run: str, now: float, project_dir: Path | None = None) -> list[BadNode]:
    """The run's nodes still held back at ``now``; [] where none were recorded. Creates
    nothing (``hpcdist status`` reads it)."""
    path = jobs_root(project_dir) / BAD_NODES_DIR / _name(run)
    try:
        text = read_private(path, _WHAT)
    except FileNotFoundError:
        return []
    return still_bad(records_from_json(text), now)


def add_bad_nodes(
    run: str, found: Iterable[BadNode], now: float, project_dir: Path | None = None
) -> list[BadNode]:
    """Record ``found`` for the run (beside its records still held); all held now."""
    held = still_bad([*read_bad_nodes(run, now, project_dir), *found], now)
    write_private(record_path(run, project_dir), records_to_json(held), _WHAT)
    return held
