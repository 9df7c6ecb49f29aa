"""A checkpoint that fits before SLURM's kill, whatever warning lead the job was given.

The training measures each checkpoint it writes (``record_checkpoint_time``: the run
folder's ``checkpoint_timing.json``). Where the lead between SLURM's warning and its kill
(``--signal=USR2@N``, in ``$HPCDIST_SIGNAL_LEAD``) is shorter than that time plus a margin
(``hpcdist.facts.leads``), the warning would come too late: rank 0's ``EarlyCheckpoint``
asks for the stop itself, once the job's end (``SLURM_JOB_END_TIME``, else ``scontrol``'s
``EndTime``) is nearer than two checkpoints and the margin (the stop may find a write of
the same length just begun, which it waits for), and says so in the log. The stop then
runs as if the warning had come: rank 0 checkpoints and asks for the requeue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path

from hpcdist.facts.leads import (
    CHECKPOINT_TIMING_FILE,
    SIGNAL_LEAD_VAR,
    CheckpointTiming,
    margin_s,
    needed_lead_s,
)
from hpcdist.slurm import control
from hpcdist.state import book_for, read_output, write_output

__all__ = [
    "CheckpointTiming",
    "EarlyCheckpoint",
    "job_end_time",
    "last_checkpoint_time",
    "record_checkpoint_time",
    "watch_job_end",
]

POLL_S = 1.0
# The last checkpoint's seconds, or None before any was measured.
Measure = Callable[[], float | None]


def job_end_time(env: Mapping[str, str]) -> float | None:
    """When SLURM ends this job, in seconds since the epoch: ``SLURM_JOB_END_TIME`` (set by
    newer SLURM versions), else ``scontrol show job``'s ``EndTime``; None outside a job."""
    text = env.get("SLURM_JOB_END_TIME", "").strip()
    if text.isdigit():
        return float(text)
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job or not control.has_scontrol():
        return None
    return control.job_end_time(job)


def given_lead_s(env: Mapping[str, str]) -> float | None:
    """The lead of the job's warning signal (``$HPCDIST_SIGNAL_LEAD``), None if unknown."""
    text = env.get(SIGNAL_LEAD_VAR, "").strip()
    return float(text) if text.isdigit() else None


def stop_at(end: float, checkpoint_s: float) -> float:
    """When to stop at the latest so that a write just begun, then the checkpoint of the
    stop, and the margin all fit before ``end``. Pure."""
    return end - checkpoint_s - needed_lead_s(checkpoint_s)


class EarlyCheckpoint:
    """Rank 0's watch over the job's end: ``stop()`` once, when it is due (``check``)."""

    def __init__(
        self,
        end: float,
        lead_s: float,
        measure: Measure,
        stop: Callable[[], None],
        say: Callable[[str], None] = print,
    ) -> None:
        self.end, self.lead_s = end, lead_s
        self.measure, self.stop_request, self.say = measure, stop, say
        self.fired = False
        self._told = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self, now: float) -> bool:
        """Whether the stop was asked for (now or before)."""
        if self.fired:
            return True
        seconds = self.measure()
        if seconds is None or self.lead_s >= needed_lead_s(seconds):
            return False  # SLURM's warning comes in time for it
        when = stop_at(self.end, seconds)
        if not self._told:
            self._told = True
            self.say(
                f"hpcdist: warning lead {self.lead_s:.0f} s is shorter than the last "
                f"checkpoint ({seconds:.1f} s) plus a margin ({margin_s(seconds):.1f} s): "
                f"this job checkpoints on its own by {_clock(when)} (SLURM ends it at "
                f"{_clock(self.end)})"
            )
        if now < when:
            return False
        self.fired = True
        self.say(
            f"hpcdist: checkpointing early, {self.end - now:.0f} s before SLURM ends the job "
            f"(the warning {self.lead_s:.0f} s before would leave too little for a "
            f"{seconds:.1f} s checkpoint)"
        )
        self.stop_request()
        return True

    def start(self) -> EarlyCheckpoint:
        self._thread = threading.Thread(target=self._watch, name="early-checkpoint", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        while not self._done.wait(POLL_S):
            if self.check(time.time()):
                return


def watch_job_end(
    env: Mapping[str, str], measure: Measure, stop: Callable[[], None]
) -> EarlyCheckpoint | None:
    """A started ``EarlyCheckpoint`` for a job whose warning lead and end are known; None
    for others (no ``--signal`` from hpcdist's script, no time limit, not under SLURM)."""
    lead = given_lead_s(env)
    if lead is None:
        return None
    end = job_end_time(env)
    if end is None:
        return None
    return EarlyCheckpoint(end, lead, measure, stop).start()


def record_checkpoint_time(run_dir: Path, timing: CheckpointTiming) -> None:
    """The run folder's ``checkpoint_timing.json``: the last checkpoint's time, for the next
    piece of the run and for ``render``/``submit`` (rank 0; digest recorded like the run's
    other files)."""
    write_output(run_dir / CHECKPOINT_TIMING_FILE, timing.to_json().encode(), book_for())


def last_checkpoint_time(run_dir: Path) -> CheckpointTiming | None:
    """What the run folder's last checkpoint took, if this user's training recorded it."""
    try:
        found = read_output(run_dir / CHECKPOINT_TIMING_FILE, book_for(), "checkpoint timing")
    except (OSError, ValueError):
        return None
    return CheckpointTiming.from_json(found.text())


def _clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).strftime("%H:%M:%S")
