"""The tasks of a SLURM job array and their states.

squeue names a task ``123_4`` once it has started and folds the ones still pending into
``123_[5-7%2]``; sacct the same. The controller's view comes first (sacct lags it, and can
briefly call a task being requeued FAILED); sacct answers for tasks the controller has
forgotten.
"""

from __future__ import annotations

from hpcdist.slurm import rest, userjobs
from hpcdist.slurm.parse import expand_task_ids
from hpcdist.slurm.tools import slurm_tool


def parse_task_states(lines: str) -> dict[str, str]:
    """``JOBID|STATE`` lines -> {task id: state}; a later line for a task wins."""
    states: dict[str, str] = {}
    for line in lines.splitlines():
        job, _, state = line.strip().partition("|")
        word = state.split()[0].upper() if state.strip() else ""
        for task in expand_task_ids(job.strip()):
            if word:
                states[task] = word
    return states


def task_states(array_id: str, count: int) -> dict[str, str]:
    """The state of each of the array's ``count`` tasks (UNKNOWN where neither tool knows):
    the user's shared view first (``hpcdist.slurm.userjobs``), sacct for tasks it lacks."""
    wanted = [f"{array_id}_{i}" for i in range(count)]
    if rest.chosen():
        return _rest_task_states(array_id, wanted)
    rows = userjobs.user_rows(array_id)
    if rows is not None:
        states = {
            row["JobArrayID"]: row["State"].split()[0].upper() for row in rows if row["State"]
        }
        if all(task in states for task in wanted):
            return {task: states[task] for task in wanted}
        accounted = userjobs.shared_answer(_sacct_argv(array_id))
        found = parse_task_states(accounted.stdout) if accounted.returncode == 0 else {}
        return {task: states.get(task) or found.get(task, "UNKNOWN") for task in wanted}
    accounted = slurm_tool(_sacct_argv(array_id))
    states = parse_task_states(accounted.stdout) if accounted.returncode == 0 else {}
    live = slurm_tool(["squeue", "-t", "all", "-h", "-r", "-j", array_id, "-o", "%i|%T"])
    if live.returncode == 0:
        states.update(parse_task_states(live.stdout))
    return {task: states.get(task, "UNKNOWN") for task in wanted}


def _rest_task_states(array_id: str, wanted: list[str]) -> dict[str, str]:
    """task_states over slurmrestd: the controller's records (pending tasks folded into one
    record, ``ArrayTaskId=1-2``), then the database's rows for the tasks it has forgotten
    (asked only then: one slurmdbd query a look otherwise)."""
    client = rest.client()
    lines = []
    for record in client.job_records(array_id):
        task = record.get("ArrayTaskId", "")
        shown = f"{array_id}_{task}" if task.isdigit() else f"{array_id}_[{task}]"
        lines.append(f"{shown}|{record['JobState']}")
    states = parse_task_states("\n".join(lines))
    if any(task not in states for task in wanted):
        accounted = [f"{row['JobID']}|{row['State']}" for row in client.db_rows(array_id)]
        states = {**parse_task_states("\n".join(accounted)), **states}
    return {task: states.get(task, "UNKNOWN") for task in wanted}


def _sacct_argv(array_id: str) -> list[str]:
    return ["sacct", "-j", array_id, "-X", "-n", "-P", "-o", "JobID,State"]
