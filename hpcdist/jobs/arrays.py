"""Following the tasks of a SLURM job array, or of a sweep queued as several arrays, to
their end; a big array's states summarised (their states: ``slurm.arrays``)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from hpcdist.jobs.records import FINAL_STATES
from hpcdist.jobs.sweeparrays import SweepArray
from hpcdist.slurm.arrays import task_states

# Tasks listed by name in a summary (the rest are counted).
LISTED_TASKS = 10


def sweep_states(
    job_id: str, count: int, arrays: Sequence[SweepArray] | None = None
) -> dict[str, str]:
    """The state of each task of a sweep, in point order: one array (``job_id``), or each
    of the arrays it was queued as."""
    if not arrays:
        return task_states(job_id, count)
    states: dict[str, str] = {}
    for array in arrays:
        states.update(task_states(array.array_id, array.count))
    return states


def wait_for_tasks(
    array_id: str,
    count: int,
    report: Callable[[str, str], None],
    poll_s: float = 2.0,
    arrays: Sequence[SweepArray] | None = None,
) -> dict[str, str]:
    """Poll until every task has ended; ``report(task, state)`` on each change of state."""
    seen: dict[str, str] = {}
    while True:
        states = sweep_states(array_id, count, arrays)
        for task, state in states.items():
            if seen.get(task) != state:
                report(task, state)
        seen = states
        if all(state in FINAL_STATES for state in states.values()):
            return states
        time.sleep(poll_s)


def summary(states: Sequence[tuple[str, str, str]]) -> list[str]:
    """Lines for many tasks, given as (task id, state, why it failed): the count in each
    state, then the tasks that did not complete (the first LISTED_TASKS by name)."""
    counts = Counter(state for _, state, _ in states)
    order = sorted(counts, key=lambda state: (-counts[state], state))
    lines = [f"{len(states)} tasks: " + ", ".join(f"{counts[s]} {s}" for s in order)]
    failed = [(t, s, why) for t, s, why in states if s in FINAL_STATES and s != "COMPLETED"]
    for task, state, why in failed[:LISTED_TASKS]:
        lines.append(f"  {task} {state}" + (f": {why}" if why else ""))
    if len(failed) > LISTED_TASKS:
        lines.append(f"  ... and {len(failed) - LISTED_TASKS} more that did not complete")
    return lines
