"""A sweep as the arrays a site requires, queued, followed and reported as one sweep.

A site's ``MaxArraySize`` (1001 by default) and ``MaxJobCount`` bound one array; a sweep
with more points is queued as several arrays of the one script ``render`` prints, each
told its first point (``HPCDIST_SWEEP_OFFSET``, with ``sbatch --array=0-N
--export=...``). Point ``i`` of array ``k`` is task ``i - first_k`` of that array; its run
folder is ``runs/<that array's id>_<task>``. With ``--max-parallel K`` each array waits for
the one before it to end (``afterany``), so no more than K tasks run at once.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist.errors import UserError
from hpcdist.facts.protocol import SWEEP_OFFSET_VAR
from hpcdist.slurm import rest
from hpcdist.slurm.cluster import scancel
from hpcdist.slurm.limits import ArrayLimits, array_limits, parse_limits, split_points
from hpcdist.spec.dependency import dependency_value
from hpcdist.spec.jobspec import JobSpec
from hpcdist.spec.sweep import points


@dataclass(frozen=True)
class SweepArray:
    """One array of a sweep: its job id, its first point and its number of tasks."""

    array_id: str
    first: int
    count: int

    def task_ids(self) -> list[str]:
        return [f"{self.array_id}_{index}" for index in range(self.count)]

    def to_list(self) -> list[Any]:
        return [self.array_id, self.first, self.count]


def from_lists(arrays: Sequence[Sequence[Any]]) -> list[SweepArray]:
    return [SweepArray(str(a), int(f), int(c)) for a, f, c in arrays]


def sweep_tasks(job_id: str, count: int, arrays: Sequence[SweepArray] | None) -> list[str]:
    """The task id of each point, in point order: ``<array>_<task>`` of the array that
    holds it (a sweep recorded before it could be split: one array, ``job_id``)."""
    if not arrays:
        return [f"{job_id}_{index}" for index in range(count)]
    return [task for array in arrays for task in array.task_ids()]


def site_limits() -> ArrayLimits:
    """The cluster's limits; SLURM's defaults where no scontrol is here to ask, or it
    cannot say (sbatch then refuses an array the site does not take, in its own words).
    slurmrestd serves no configuration: SLURM's defaults, and the daemon refuses a larger
    array in its own words."""
    if shutil.which("scontrol") is None or rest.chosen():
        return parse_limits("")
    try:
        return array_limits()
    except UserError:
        return parse_limits("")


def export_value(sbatch_options: Sequence[tuple[str, str | None]], first: int) -> str:
    """``--export`` for an array that starts at point ``first``, keeping what the job asked
    of its environment (``--sbatch export=NONE`` passes only this variable and SLURM's)."""
    given = next((value for key, value in sbatch_options if key == "export"), None)
    offset = f"{SWEEP_OFFSET_VAR}={first}"
    if given is None or given.strip().upper() in ("", "ALL"):
        return f"ALL,{offset}"
    if given.strip().upper() == "NONE":
        return offset
    return f"{given},{offset}"


def array_args(spec: JobSpec, first: int, count: int, previous: str | None) -> tuple[str, ...]:
    """sbatch's options for one array of a split sweep (the script's own --array and
    --dependency lines are overridden by them)."""
    limit = f"%{spec.max_parallel}" if spec.max_parallel else ""
    args = [f"--array=0-{count - 1}{limit}", f"--export={export_value(spec.sbatch_options, first)}"]
    if spec.max_parallel and previous is not None:
        after = dependency_value(spec.after)
        args.append(f"--dependency={after + ',' if after else ''}afterany:{previous}")
    return tuple(args)


def sweep_parts(spec: JobSpec) -> list[tuple[int, int]]:
    """(first point, tasks) of each array the site requires for ``spec``'s sweep."""
    return split_points(len(points(spec)), site_limits())


def first_array_args(spec: JobSpec, parts: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    """What ``sbatch --test-only`` is given to check the first array as it will be queued
    (nothing for a sweep of one array: the script's own lines)."""
    return array_args(spec, 0, parts[0][1], None) if len(parts) > 1 else ()


def queue_sweep(
    spec: JobSpec, folder: Path, script: Path, tasks: int, parts: Sequence[tuple[int, int]]
) -> tuple[list[Any], list[SweepArray]]:
    """Queue the sweep's script as the arrays ``parts`` says; a handle per task."""
    from hpcdist.jobs.scriptexec import queue_slurm

    count = len(points(spec))
    if len(parts) == 1:  # the script's own --array line: plain sbatch FILE
        jobs = queue_slurm(folder / "%j", script, tasks, count)
        return jobs, [SweepArray(str(jobs[0].job_id).partition("_")[0], 0, count)]
    handles: list[Any] = []
    arrays: list[SweepArray] = []
    try:
        for first, size in parts:
            previous = arrays[-1].array_id if arrays else None
            args = array_args(spec, first, size, previous)
            jobs = queue_slurm(folder / "%j", script, tasks, size, args)
            handles += jobs
            arrays.append(SweepArray(str(jobs[0].job_id).partition("_")[0], first, size))
    except BaseException:
        for array in arrays:  # half a sweep is not the sweep that was asked for
            with contextlib.suppress(UserError):
                scancel(array.array_id)
        raise
    return handles, arrays
