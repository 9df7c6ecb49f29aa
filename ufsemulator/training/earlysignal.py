"""Catch the scheduler's warning signal from the first moment of the process.

SLURM may send ``--signal=USR2@N`` within seconds of a job's start (its check runs on a
coarse timer), before torch is even imported. Unhandled, SIGUSR2 would kill the process;
here it is only remembered, and ``train()`` turns it into a stop at the first agreed step.
Import this module before anything heavy.

A job rendered or submitted by hpcdist names its warning signal in ``$HPCDIST_SIGNAL``
(``USR1`` for ``--signal=USR1@90``); it is caught as well as SIGUSR2.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping

from hpcdist.distributed import SIGNAL_VAR

_received: set[int] = set()


def job_signal(env: Mapping[str, str] = os.environ) -> signal.Signals | None:
    """The job's warning signal from ``$HPCDIST_SIGNAL`` (``USR1`` or ``SIGUSR1``), if any."""
    name = env.get(SIGNAL_VAR, "").strip().upper()
    if not name:
        return None
    name = name if name.startswith("SIG") else f"SIG{name}"
    return signal.Signals.__members__.get(name)


def _warnings() -> set[signal.Signals]:
    extra = job_signal()
    return {signal.SIGUSR2} | ({extra} if extra is not None else set())


def _remember(signum: int, frame: object) -> None:
    _received.add(signum)


def install() -> None:
    if threading.current_thread() is threading.main_thread():
        for signum in _warnings() | {signal.SIGTERM}:
            signal.signal(signum, _remember)


def ignore_late_warnings() -> None:
    """Ignore the warning signals from now on. Python puts its own handlers back to the
    default action while the interpreter shuts down, so a warning that lands during exit
    would kill a finished run and turn it into a failed job; an ignored signal stays
    ignored."""
    if threading.current_thread() is threading.main_thread():
        for signum in _warnings():
            signal.signal(signum, signal.SIG_IGN)


def received() -> bool:
    """Whether a warning (or termination) signal arrived before training took over."""
    return bool(_received)
