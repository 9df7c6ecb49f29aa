"""How old SLURM's word on a job is, in the words a command prints beside the state.

Every state a command shows comes from the user's shared view (``hpcdist.slurm.userjobs``),
which asks the controller once per interval. A state the view took more than ``FRESH_S``
seconds ago says when it was seen (``RUNNING (as of 12:02:58, 40 s ago)``); while the
controller does not answer, the state is the last one it gave, and says so
(``RUNNING (controller not answering since 12:03:10; last seen RUNNING at 12:02:58)``). A
failed question never becomes a state: a job the controller has not described since it was
submitted is ``UNANSWERED``, not PENDING or UNKNOWN. A final state is true however long ago
it was read, and is shown bare.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpcdist.slurm.parse import FINAL_STATES

FRESH_S = 10.0  # a state older than this is shown with its age
# No state: the controller has not answered since the job was submitted (nor has SLURM's
# database recorded its end).
UNANSWERED = "UNANSWERED"


@dataclass(frozen=True)
class Seen:
    """When the controller last answered, and since when it has not (None: it answers)."""

    at: float | None  # seconds since the epoch; None: not once since the view began
    silent_since: float | None = None

    @property
    def silent(self) -> bool:
        return self.silent_since is not None


def clock(at: float) -> str:
    """``12:02:58``: a moment of today, in this machine's local time, as SLURM prints it."""
    return time.strftime("%H:%M:%S", time.localtime(at))


def note(state: str, seen: Seen | None, now: float) -> str:
    """What to say beside ``state`` (as ``seen``, at ``now``): '' where it is current."""
    if seen is None or (state in FINAL_STATES and state != UNANSWERED):
        return ""
    if seen.silent_since is not None:
        said = f"controller not answering since {clock(seen.silent_since)}"
        if state == UNANSWERED or seen.at is None:
            return f"{said}; job not seen since it was submitted"
        return f"{said}; last seen {state} at {clock(seen.at)}"
    if seen.at is None or now - seen.at <= FRESH_S:
        return ""
    return f"as of {clock(seen.at)}, {now - seen.at:.0f} s ago"


def shown(state: str, seen: Seen | None, now: float | None = None) -> str:
    """``state`` with its note, if it needs one: ``RUNNING (as of 12:02:58, 40 s ago)``."""
    said = note(state, seen, time.time() if now is None else now)
    return f"{state} ({said})" if said else state
