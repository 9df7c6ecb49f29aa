"""A training's heartbeat: one small JSON file in its run folder that rank 0 replaces
(atomically, at most every ``HEARTBEAT_EVERY_S`` seconds) while it trains, and that the login
node reads (``hpcdist status``) to say how far the run is, how fast it goes, when it will end,
and whether it still moves.

    runs/<run>/heartbeat.json
    {"version": 1, "run_id": "r...", "job_id": "1234", "restart": 0,
     "epoch": 3, "epochs": 10, "step": 1200, "steps": 4000,
     "samples_per_s": 51234.5, "recent_steps_per_s": 51.2, "loss": 0.0123,
     "checkpoint_epoch": 2, "checkpoint_step": 800, "checkpoint_time": 1764265000.1,
     "checkpoint_s": 0.42, "piece_started": 1764264900.0, "piece_step": 0,
     "phase": "training", "time": 1764265012.3}

``epoch`` is the epoch being trained (1-based), ``step`` the optimizer steps done since the
run began (all pieces), ``steps`` the planned total (``epochs`` x steps per epoch; early
stopping may end sooner). ``samples_per_s`` is the rate since the last heartbeat,
``recent_steps_per_s`` the piece's recent rate: its steps a second since their pace last
changed (``PACE_BEATS``). ``checkpoint_*``: the last checkpoint written (the epoch and step it
holds, when it was finished, how many seconds writing it took, handing over and writing to
disk together). ``piece_started`` and ``piece_step``: when this job (piece of the run) took its
first step, and the step it started from, so a reader has the piece's whole rate, validation
and checkpoints included. Times are seconds since the
epoch (``time.time()``). Every field may be missing: a reader gets None (a newer writer may add
fields, an older one may lack some); ``parse`` never raises.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

HEARTBEAT_FILE = "heartbeat.json"
HEARTBEAT_VERSION = 1
# Rank 0 writes at most this often; the login node calls a heartbeat older than
# STALE_AFTER_S in a running job a possible hang.
HEARTBEAT_EVERY_S = 5.0
STALE_AFTER_S = 300.0
# The recent rate starts again where this many intervals between heartbeats in a row ran
# more than PACE_CHANGE faster (or all slower) than it (hpcdist.jobs.progress says why).
PACE_BEATS = 3
PACE_CHANGE = 0.2
# What the training is doing: the login node says "checkpointing" rather than "hang" for a
# long checkpoint, "stopped" for a piece that checkpointed to be resumed by the next one,
# and "done" once the training has ended.
PHASES = ("starting", "training", "checkpointing", "stopped", "done")


@dataclass(frozen=True)
class Heartbeat:
    """One heartbeat; None where the writer did not know (or did not write) a value."""

    run_id: str | None = None
    run_dir: str | None = None  # the run folder it was written for, as walked to
    job_id: str | None = None
    restart: int | None = None
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    steps: int | None = None
    samples_per_s: float | None = None
    recent_steps_per_s: float | None = None
    loss: float | None = None
    checkpoint_epoch: int | None = None
    checkpoint_step: int | None = None
    checkpoint_time: float | None = None
    checkpoint_s: float | None = None
    piece_started: float | None = None
    piece_step: int | None = None
    phase: str | None = None
    time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": HEARTBEAT_VERSION, **asdict(self)}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), separators=(",", ":")) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Heartbeat:
        """Tolerant: unknown keys ignored, a missing or mistyped value becomes None."""
        values = {f.name: _coerce(data.get(f.name), str(f.type)) for f in fields(cls)}
        if values["phase"] not in PHASES:
            values["phase"] = None
        return cls(**values)

    def age_s(self, now: float) -> float | None:
        """Seconds since it was written; None without a time."""
        return None if self.time is None else max(0.0, now - self.time)


def parse(data: bytes | str) -> Heartbeat | None:
    """The heartbeat in these bytes; None for anything that is not a JSON object."""
    try:
        loaded = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return Heartbeat.from_dict(loaded) if isinstance(loaded, dict) else None


def _coerce(value: Any, type_name: str) -> Any:
    if value is None or isinstance(value, bool):
        return None
    if type_name.startswith("str"):
        return value if isinstance(value, str) else None
    if type_name.startswith("int"):
        return value if isinstance(value, int) and value >= 0 else None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None
