"""Catch the scheduler's warning signal from the first moment of the process.

SLURM may send ``--signal=USR2@N`` within seconds of a job's start (its check runs on a
coarse timer), before torch is even imported. Unhandled, SIGUSR2 would kill the process;
here it is only remembered, and ``train()`` turns it into a stop at the first agreed step.
Import this module before anything heavy.
"""

from __future__ import annotations

import signal
import threading

_received: set[int] = set()
_EARLY = (signal.SIGUSR2, signal.SIGTERM)


def _remember(signum: int, frame: object) -> None:
    _received.add(signum)


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in _EARLY:
            signal.signal(signum, _remember)


def ignore_late_warnings() -> None:
    """Ignore SIGUSR2 from now on. Python puts its own handlers back to the default action
    while the interpreter shuts down, so a warning that lands during exit would kill a
    finished run and turn it into a failed job; an ignored signal stays ignored."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def received() -> bool:
    """Whether a warning (or termination) signal arrived before training took over."""
    return bool(_received)
