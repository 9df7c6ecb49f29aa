"""How many array tasks a site takes at once: ``MaxArraySize`` and ``MaxJobCount`` of
``scontrol show config``, and a sweep's points split into the arrays they require."""

from __future__ import annotations

from dataclasses import dataclass

from hpcdist.errors import UserError
from hpcdist.slurm.parse import config_values
from hpcdist.slurm.tools import slurm_tool

# SLURM's defaults (slurm.conf(5)): task ids 0..1000, 10,000 jobs in the controller.
DEFAULT_MAX_ARRAY_SIZE = 1001
DEFAULT_MAX_JOB_COUNT = 10000


@dataclass(frozen=True)
class ArrayLimits:
    max_array_size: int  # task ids run from 0 to max_array_size - 1
    max_job_count: int

    @property
    def tasks_per_array(self) -> int:
        """The most tasks one array of a sweep holds: ids below MaxArraySize, and fewer
        tasks than the controller keeps jobs (slurmctld counts a pending array's tasks)."""
        return min(self.max_array_size, self.max_job_count - 1)


def parse_limits(text: str) -> ArrayLimits:
    """The limits in ``scontrol show config`` output; SLURM's defaults where absent."""
    values = config_values(text)

    def setting(name: str, default: int) -> int:
        value = values.get(name, "")
        return int(value) if value.isdigit() else default

    return ArrayLimits(
        setting("MaxArraySize", DEFAULT_MAX_ARRAY_SIZE),
        setting("MaxJobCount", DEFAULT_MAX_JOB_COUNT),
    )


def array_limits() -> ArrayLimits:
    """This cluster's limits (one ``scontrol show config``)."""
    proc = slurm_tool(["scontrol", "show", "config"])
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        raise UserError(f"scontrol show config failed ({reason}); expected a SLURM controller")
    return parse_limits(proc.stdout)


def split_points(count: int, limits: ArrayLimits) -> list[tuple[int, int]]:
    """(first point, tasks) of each array a sweep of ``count`` points needs: every point
    once, in order, each array as large as the site allows."""
    size = limits.tasks_per_array
    if count >= limits.max_job_count:
        raise UserError(
            f"the sweep has {count} points; this cluster holds fewer than MaxJobCount="
            f"{limits.max_job_count} jobs at once (scontrol show config), every task of a "
            f"pending array counted: expected at most {limits.max_job_count - 1} points, "
            "less the jobs already queued (split the sweep, or ask the site)"
        )
    if size < 1:
        raise UserError(
            f"this cluster takes no job arrays (MaxArraySize={limits.max_array_size}, "
            f"MaxJobCount={limits.max_job_count}); expected a site that allows them for --sweep"
        )
    return [(first, min(size, count - first)) for first in range(0, count, size)]
