"""Waiting for every task of a SLURM job array to end (their states: ``slurm.query``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from hpcdist.jobs.records import FINAL_STATES
from hpcdist.slurm.arrays import task_states


def wait_for_tasks(
    array_id: str,
    count: int,
    report: Callable[[str, str], None],
    poll_s: float = 2.0,
) -> dict[str, str]:
    """Poll until every task has ended; ``report(task, state)`` on each change of state."""
    seen: dict[str, str] = {}
    while True:
        states = task_states(array_id, count)
        for task, state in states.items():
            if seen.get(task) != state:
                report(task, state)
        seen = states
        if all(state in FINAL_STATES for state in states.values()):
            return states
        time.sleep(poll_s)
