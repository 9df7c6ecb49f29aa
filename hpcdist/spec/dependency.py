"""``--after JOB[:ok|any|notok]``: a job that starts only once others have ended, as sbatch's
``--dependency=afterok:JOB[:JOB...][,afterany:...]`` (every condition must hold).

``render`` writes the directive as given: it changes nothing and asks no controller, so a
script can be rendered on a machine without SLURM (sbatch refuses an unknown job id when the
script is submitted). ``submit`` asks the controller first (``check_known``) and refuses an
id it does not know with one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hpcdist.errors import SpecError, UserError
from hpcdist.slurm.query import controller_knows

AFTER_FLAG = "--after"
# The word after the job id -> sbatch's dependency type.
CONDITIONS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
# A SLURM job id, or one task of an array (123_4).
_JOB = re.compile(r"[1-9][0-9]{0,17}(_[0-9]{1,9})?")

After = tuple[tuple[str, str], ...]  # (job id, condition)


def parse_after(items: Sequence[str]) -> After:
    """``123``, ``123:any``, ``123_4:notok`` -> ((job id, condition), ...)."""
    out: list[tuple[str, str]] = []
    for item in items:
        job, _, condition = item.strip().partition(":")
        condition = condition or "ok"
        if not _JOB.fullmatch(job) or condition not in CONDITIONS:
            raise SpecError(
                f"{AFTER_FLAG} {item!r}; expected JOB[:ok|any|notok] with a job id such as "
                "1234 or 1234_5"
            )
        if (job, condition) not in out:
            out.append((job, condition))
    return tuple(out)


def dependency_value(after: After) -> str | None:
    """sbatch's ``--dependency`` value, None without --after: ``afterok:1:2,afterany:3``."""
    groups: dict[str, list[str]] = {}
    for job, condition in after:
        groups.setdefault(CONDITIONS[condition], []).append(job)
    return ",".join(f"{kind}:{':'.join(jobs)}" for kind, jobs in groups.items()) or None


def check_known(after: After) -> None:
    """Refuse a job id the SLURM controller does not know (one line)."""
    for job, _ in after:
        if not controller_knows(job):
            # A job that ended a while ago is gone from the controller but still in sacct:
            # sbatch would still refuse to wait for it.
            raise UserError(
                f"{AFTER_FLAG} {job}: the SLURM controller does not know job {job}; expected "
                "a queued, running or recently ended job (squeue -j)"
            )
