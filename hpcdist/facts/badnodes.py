"""Nodes a run leaves behind: which failure named them, since when, and until when.

The job records a node when a failure names it (``hpcdist.distributed.badnodes``); the
run's next piece is kept off it until the record's ``until`` (``--bad-node-hold`` seconds
after the failure); ``hpcdist status`` shows the records. One file of the private state per
run (``hpcdist.state.badnodes``), named by the run's folder. Data and pure functions only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# Seconds a named node stays excluded (``--bad-node-hold``), exported by the job's script;
# unset (``--no-exclude-bad-nodes``): nodes are neither recorded nor excluded.
BAD_NODE_HOLD_VAR = "HPCDIST_BAD_NODE_HOLD"
BAD_NODES_DIR = "badnodes"


@dataclass(frozen=True)
class BadNode:
    node: str
    reason: str  # what named it, e.g. "task 1 Killed"
    since: float  # seconds since the epoch
    until: float

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "reason": self.reason, "since": self.since, "until": self.until}

    @classmethod
    def from_dict(cls, data: Any) -> BadNode | None:
        if not isinstance(data, dict) or not isinstance(data.get("node"), str):
            return None
        try:
            since, until = float(data["since"]), float(data["until"])
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(since) and math.isfinite(until)):
            return None
        return cls(data["node"], str(data.get("reason", "")), since, until)


def still_bad(records: Iterable[BadNode], now: float) -> list[BadNode]:
    """The records whose hold has not run out, one per node (the latest), in node order."""
    latest: dict[str, BadNode] = {}
    for record in records:
        if record.until > now and record.until >= latest.get(record.node, record).until:
            latest[record.node] = record
    return [latest[node] for node in sorted(latest)]


def records_to_json(records: Iterable[BadNode]) -> str:
    return json.dumps({"nodes": [r.to_dict() for r in records]}, indent=1) + "\n"


def records_from_json(text: str) -> list[BadNode]:
    """The records of a file; [] for anything that is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    entries = data.get("nodes") if isinstance(data, dict) else None
    found = [BadNode.from_dict(entry) for entry in entries or []]
    return [record for record in found if record is not None]
