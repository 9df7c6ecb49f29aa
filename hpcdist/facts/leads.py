"""How long a checkpoint takes, and the warning lead it needs: one record, both sides.

The training measures every checkpoint it writes and keeps the last measurement in its run
folder (``CHECKPOINT_TIMING_FILE``); inside the job, ``hpcdist.distributed.warnlead``
checkpoints early where SLURM's warning would come too late for it, and on the login node
``render``/``submit`` warn when a lead asked for is shorter than the run folder measured.
The job learns the lead it was given from ``SIGNAL_LEAD_VAR`` (the script exports it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from hpcdist.facts.warning import SLURM_DEFAULT_LEAD_S, parse_warning

__all__ = [
    "CHECKPOINT_TIMING_FILE",
    "SIGNAL_LEAD_VAR",
    "SLURM_DEFAULT_LEAD_S",
    "CheckpointTiming",
    "margin_s",
    "needed_lead_s",
    "signal_lead_s",
]

CHECKPOINT_TIMING_FILE = "checkpoint_timing.json"
SIGNAL_LEAD_VAR = "HPCDIST_SIGNAL_LEAD"  # seconds between SLURM's warning and its kill
# What a checkpoint may take beyond the last one measured: a disk busier than then, the
# steps until the ranks agree to stop, the exit. At least 5 s, a quarter for long ones.
MARGIN_MIN_S = 5.0
MARGIN_FRACTION = 0.25


def margin_s(checkpoint_s: float) -> float:
    return max(MARGIN_MIN_S, MARGIN_FRACTION * checkpoint_s)


def needed_lead_s(checkpoint_s: float) -> float:
    """The warning lead a checkpoint of ``checkpoint_s`` seconds needs: it plus the margin."""
    return checkpoint_s + margin_s(checkpoint_s)


def signal_lead_s(signal: str | None) -> int | None:
    """The lead of a ``--signal`` value (``B:USR2@90`` -> 90, ``USR2`` -> SLURM's 60);
    None without a signal or with one SLURM does not take."""
    parsed = parse_warning(signal) if signal else None
    return None if parsed is None else parsed.lead_s


@dataclass(frozen=True)
class CheckpointTiming:
    """The last checkpoint a run wrote: how long it took (serialising, writing, fsync: the
    time from handing the state over to its file being on disk) and when it was done."""

    seconds: float
    written_at: float  # seconds since the epoch
    epoch: int = 0  # epochs done when its state was taken

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "written_at": self.written_at, "epoch": self.epoch}

    @classmethod
    def from_dict(cls, data: Any) -> CheckpointTiming | None:
        """The record, or None for anything that is not one (an older or foreign file)."""
        if not isinstance(data, dict):
            return None
        try:
            seconds, written = float(data["seconds"]), float(data["written_at"])
            epoch = int(data.get("epoch", 0))
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(seconds) and seconds >= 0 and math.isfinite(written)):
            return None
        return cls(seconds=seconds, written_at=written, epoch=epoch)

    def to_json(self) -> str:
        return json.dumps(self.to_dict()) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CheckpointTiming | None:
        try:
            return cls.from_dict(json.loads(text))
        except ValueError:
            return None
