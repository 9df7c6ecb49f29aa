"""``--after``: a job that starts only once others have ended or started, as sbatch's
``--dependency``. Two spellings, freely repeated:

- hpcdist's short one, ``JOB[:ok|any|notok]`` (``123``, ``123:any``, ``123_4:notok``);
- SLURM's whole grammar, as sbatch takes it: ``TYPE:JOB[+MINUTES][:JOB...]`` with TYPE
  after, afterany, afterok, afternotok, aftercorr or afterburstbuffer, or ``singleton``,
  terms joined by ``,`` (all must hold) or ``?`` (any one is enough), never both.

Repeated ``--after`` flags all must hold (``,``). ``render`` writes the directive as given: it
changes nothing and asks no controller, so a script can be rendered on a machine without
SLURM. ``submit`` asks the controller first (``check_known``) and refuses an id it does not
know with one line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hpcdist.errors import SpecError, UserError
from hpcdist.slurm.query import controller_knows

AFTER_FLAG = "--after"
# The word after the job id -> sbatch's dependency type.
CONDITIONS = {"ok": "afterok", "any": "afterany", "notok": "afternotok"}
TYPES = ("after", "afterany", "afterok", "afternotok", "aftercorr", "afterburstbuffer")
SINGLETON = "singleton"
# A SLURM job id, or one task of an array (123_4).
_JOB = re.compile(r"[1-9][0-9]{0,17}(_[0-9]{1,9})?")
# One job of a SLURM term, with an optional delay in minutes (+10; SLURM refuses +0).
_TERM_JOB = re.compile(rf"({_JOB.pattern})(\+[1-9][0-9]{{0,8}})?")
_EXPECTED = (
    "expected JOB[:ok|any|notok], or sbatch's TYPE:JOB[+MINUTES][:JOB...] (TYPE one of "
    f"{', '.join(TYPES)}) or singleton, joined by , (all) or ? (any)"
)

# SLURM's controller takes both, yet does not say how they combine.
_ONE_SEPARATOR = "sbatch(1) allows one separator per job, , or ? (how both combine is undefined)"

After = tuple[str, ...]  # sbatch dependency terms, all of which must hold


def parse_after(items: Sequence[str]) -> After:
    """The --after values as sbatch terms: short items grouped by type (``afterok:1:2``),
    then SLURM's own spelling as given; a term with ``?`` must be the only one."""
    short: dict[str, list[str]] = {}
    full: list[str] = []
    for item in items:
        text = item.strip()
        if _is_slurm_spelling(text):
            _check_slurm_spelling(item, text)
            if text not in full:
                full.append(text)
            continue
        job, _, condition = text.partition(":")
        condition = condition or "ok"
        if not _JOB.fullmatch(job) or condition not in CONDITIONS:
            raise SpecError(f"{AFTER_FLAG} {item!r}; {_EXPECTED}")
        jobs = short.setdefault(CONDITIONS[condition], [])
        if job not in jobs:
            jobs.append(job)
    terms = (*(f"{kind}:{':'.join(jobs)}" for kind, jobs in short.items()), *full)
    either = [term for term in terms if "?" in term]
    if either and len(terms) > 1:
        raise SpecError(
            f"{AFTER_FLAG} {either[0]!r} (any one of) with other --after conditions (all of): "
            f"{_ONE_SEPARATOR}; expected the whole condition in one --after"
        )
    return terms


def _is_slurm_spelling(text: str) -> bool:
    word = re.split(r"[:,?]", text, maxsplit=1)[0].lower()
    return word in TYPES or word == SINGLETON or word.startswith("after")


def _check_slurm_spelling(item: str, text: str) -> None:
    if "," in text and "?" in text:
        raise SpecError(
            f"{AFTER_FLAG} {item!r} joins terms by both , and ?; {_ONE_SEPARATOR}: "
            "expected , (all must hold) or ? (any one is enough)"
        )
    for term in re.split(r"[,?]", text):
        kind, colon, jobs = term.partition(":")
        kind = kind.lower()
        if kind == SINGLETON and not colon:
            continue
        if kind not in TYPES or not all(_TERM_JOB.fullmatch(job) for job in jobs.split(":")):
            raise SpecError(
                f"{AFTER_FLAG} {item!r}: {term!r} is not a SLURM dependency; {_EXPECTED}"
            )


def dependency_value(after: After) -> str | None:
    """sbatch's ``--dependency`` value, None without --after: ``afterok:1:2,afterany:3``."""
    return ",".join(after) or None


def dependency_jobs(after: After) -> list[str]:
    """The job ids a dependency names, without delays, each once."""
    jobs: list[str] = []
    for term in re.split(r"[,?]", ",".join(after)):
        for word in term.split(":")[1:]:
            job = word.partition("+")[0]
            if job and job not in jobs:
                jobs.append(job)
    return jobs


def check_known(after: After) -> None:
    """Refuse a job id the SLURM controller does not know (one line)."""
    for job in dependency_jobs(after):
        if not controller_knows(job):
            # A job that ended a while ago is gone from the controller but still in sacct:
            # sbatch would still refuse to wait for it.
            raise UserError(
                f"{AFTER_FLAG} {job}: the SLURM controller does not know job {job}; expected "
                "a queued, running or recently ended job (squeue -j)"
            )
