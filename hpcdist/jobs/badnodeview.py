"""The nodes a run is kept off, as ``hpcdist status`` shows them (the job records them:
``hpcdist.distributed.badnodes``; the record: ``hpcdist.facts.badnodes``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime

from hpcdist.errors import UserError
from hpcdist.facts.badnodes import BadNode
from hpcdist.state.badnodes import read_bad_nodes


def held_nodes(run: str, now: float | None = None) -> list[BadNode]:
    """The run's nodes still held back (its folder is ``runs/<run>``); [] if none or if the
    record is not the user's alone."""
    try:
        return read_bad_nodes(run, time.time() if now is None else now)
    except (UserError, OSError):
        return []


def describe_held(held: Sequence[BadNode]) -> str:
    """``node2 (task 1 Killed, until 2026-11-27 19:45)``, one per node."""
    return ", ".join(
        f"{r.node} ({r.reason}, until {datetime.fromtimestamp(r.until):%Y-%m-%d %H:%M})"
        for r in held
    )
