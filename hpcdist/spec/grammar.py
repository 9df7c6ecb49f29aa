"""SLURM's grammar of the values hpcdist passes to sbatch, taken from sbatch itself (the
testbed's ``sbatch --test-only`` is the reference: tests/integration/test_grammar_slurm.py).

Each check takes the value as the user gave it and the place it came from (``--mem``, or a
profile's key), and raises SpecError in SLURM's terms for a value sbatch refuses. A value
SLURM takes but hpcdist cannot run (a warning signal the job cannot catch, a time limit
without an end) is refused with the reason, never as "not a SLURM value".
"""

from __future__ import annotations

import re

from hpcdist.errors import SpecError
from hpcdist.facts.warning import MAX_LEAD_S, WARNING_SIGNALS, WarningSignal, parse_warning

# --mem: a number, then K, M (the default), G or T, in either case, and an optional B.
_MEMORY = re.compile(r"\+?([0-9]+)(?:[KkMmGgTt][Bb]?)?")
_LLONG_MAX = 2**63 - 1


def check_memory(where: str, value: str) -> None:
    """sbatch's ``--mem`` / ``--mem-per-gpu``: 4000, 4000M, 16g, 16GB, 1t, 0 (all)."""
    match = _MEMORY.fullmatch(value)
    if match is None or int(match.group(1)) > _LLONG_MAX:
        raise SpecError(
            f"{where} {value!r} is not a SLURM memory size; expected a number with an "
            "optional unit K, M, G or T (either case), e.g. 4000M, 16g or 0 (all of it)"
        )


# --signal: [{B,R}...:]SIGNAL[@SECONDS], read by hpcdist.facts.warning for every side.
Signal = WarningSignal


def parse_signal(where: str, value: str) -> Signal:
    """``USR2@90``, ``SIGUSR2@90``, ``12@90``, ``R:USR2@90``, ``B:usr2`` -> Signal."""
    parsed = parse_warning(value)
    if parsed is None:
        raise SpecError(
            f"{where} {value!r} is not a SLURM signal; expected [B:|R:]SIGNAL[@SECONDS] with "
            f"a signal name or number and 0-{MAX_LEAD_S} seconds, e.g. USR2@90"
        )
    if not parsed.catchable:
        raise SpecError(
            f"{where} {value!r}: SLURM would send {parsed.name}, which the job cannot catch to "
            f"checkpoint; hpcdist needs one of {', '.join(WARNING_SIGNALS)}, e.g. USR2@90"
        )
    return parsed


MAIL_TYPES = (
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
)


def check_mail_type(where: str, value: str) -> None:
    """A comma list of mail types in any case (``end``, ``End,Fail``); SLURM skips empty items."""
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    for kind in kinds:
        if kind.upper() not in MAIL_TYPES:
            raise SpecError(
                f"{where} {value!r}: {kind!r} is not a SLURM mail type; expected a comma "
                f"list of {', '.join(MAIL_TYPES)} (any case)"
            )
    if not kinds:
        raise SpecError(f"{where} {value!r} names no mail type; expected e.g. END,FAIL")


# --nodes: N, MIN-MAX, or (SLURM >= 23.02) MIN-MAX:STEP and comma lists of counts.
# Numbers of at most 4000 digits: Python reads no longer ones, and no count is near that.
_NODE_COUNTS = re.compile(r"([0-9]{1,4000})(?:-([0-9]{0,4000})(?::([0-9]{1,4000}))?)?")
# Counts a choice is told in one by one; a longer one is told by its least and most.
_COUNTS_LISTED = 10000


def node_count(where: str, value: object) -> int:
    """A node count of ``--nodes`` or a profile: ``4``, or a range or list whose counts all
    agree (``4-4``). hpcdist lays the ranks out before the job starts, so a choice of
    counts is refused."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if re.fullmatch(r"-?[0-9]{1,4000}", text):
        return int(text)  # a count below 1 is refused with the job's other counts
    counts = [_node_counts(where, text, item) for item in text.split(",")]
    low, high = min(c[0] for c in counts), max(c[-1] for c in counts)
    if low != high:
        several = (
            f"{len(set().union(*counts))} node counts"
            if sum(len(c) for c in counts) <= _COUNTS_LISTED
            else f"the node counts {low} to {high}"
        )
        raise SpecError(
            f"{where} {text!r} lets SLURM choose among {several}; hpcdist lays the "
            "ranks out (world size, rank 0's node) before the job starts and needs one "
            f"count: expected e.g. {where} {low}"
        )
    return low


def _node_counts(where: str, text: str, item: str) -> range:
    """The counts of one item of a node count (``2``, ``2-4``, ``2-8:2``), as a range: its
    length and ends are worked out, never listed."""
    match = _NODE_COUNTS.fullmatch(item)
    if match is None:
        raise SpecError(
            f"{where} {text!r} is not a SLURM node count; expected a number such as 4 "
            "(or a range MIN-MAX)"
        )
    low, high, step = match.groups()
    if high is not None and (high == "" or int(high) < int(low)):
        raise SpecError(
            f"{where} {text!r}: the most nodes {high or 'none'} is fewer than the least "
            f"{low} (SLURM refuses it); expected MIN-MAX with MIN <= MAX"
        )
    return range(int(low), int(high or low) + 1, int(step or 1) or 1)


# --exclusive[=user|mcs] (no value: whole nodes).
EXCLUSIVE_KINDS = ("user", "mcs")


def check_exclusive(where: str, value: bool | str) -> None:
    if isinstance(value, str) and value.lower() not in EXCLUSIVE_KINDS:
        raise SpecError(
            f"{where} {value!r} is not a SLURM --exclusive kind; expected --exclusive alone "
            f"(whole nodes) or --exclusive={'|'.join(EXCLUSIVE_KINDS)}"
        )


# Node names of a host list: letters, digits, dots, dashes and underscores, with brackets
# of ranges; commas separate. Anything else ($, quotes, spaces) SLURM refuses.
_NODE_LIST = re.compile(r"[A-Za-z0-9._\-\[\],]+")


def check_node_list_chars(where: str, value: str) -> None:
    if not _NODE_LIST.fullmatch(value):
        raise SpecError(
            f"{where} {value!r} is not a SLURM node list; expected node names and ranges "
            "such as node[01-04],gpu7 (letters, digits, . _ - [ ] ,)"
        )


# --constraint: features joined by & | or , with optional *COUNT, brackets and parentheses.
_CONSTRAINT_TOKEN = re.compile(r"[A-Za-z0-9_.:\-]+(?:\*[0-9]+)?|[&|,()\[\]]")


def check_constraint(where: str, value: str) -> None:
    """An operator must follow a feature (or a closing bracket): ``a100&ib``, ``[a|b]*2``;
    ``&&``, ``&ib``, ``!ib`` and quotes are refused, as SLURM refuses them."""
    tokens = _CONSTRAINT_TOKEN.findall(value)
    if "".join(tokens) != value or not _operators_follow_features(tokens):
        raise SpecError(
            f"{where} {value!r} is not a SLURM constraint; expected node features joined by "
            "& | or , e.g. 'a100&ib' or '[rack1|rack2]'"
        )


def _operators_follow_features(tokens: list[str]) -> bool:
    previous = ""
    for token in tokens:
        if token in "&|," and (previous in ("", "&", "|", ",", "(", "[")):
            return False
        previous = token
    return any(token not in "&|,()[]" for token in tokens)


# --array: ITEM[,ITEM...][%LIMIT], an ITEM N, N-M or N-M:STEP; ids up to MaxArraySize - 1.
# Numbers of at most _DIGITS digits: Python reads no longer ones, and no id SLURM takes is
# near that long.
_DIGITS = 4000
_NUMBER = rf"[0-9]{{1,{_DIGITS}}}"
_ARRAY_ITEM = re.compile(rf"({_NUMBER})(?:-({_NUMBER})(?::({_NUMBER}))?)?")
_ARRAY_LIMIT = re.compile(_NUMBER)
DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's default MaxArraySize: ids 0-1000


def array_last_id(where: str, value: str) -> int:
    """The highest task id of an ``--array`` value such as ``0-15:2%4`` (14) or ``1,3,5-7``
    (7), worked out from each range's ends and step: the ids are never listed, so that
    ``0-2147483648`` is checked as fast as ``0-3``."""
    items, percent, limit = value.partition("%")
    last = max(_array_item_last(where, value, item) for item in items.split(","))
    if percent and not _ARRAY_LIMIT.fullmatch(limit):
        raise SpecError(f"{where} {value!r}: the limit after % must be a number, e.g. 0-15%4")
    return last


def _array_item_last(where: str, value: str, item: str) -> int:
    """The last id of one item: N, or N-M[:STEP] (the last step at or below M)."""
    match = _ARRAY_ITEM.fullmatch(item)
    first, last, step = (int(n) if n else None for n in (match.groups() if match else [None] * 3))
    if first is None or (last is not None and last < first) or step == 0:
        raise SpecError(
            f"{where} {value!r} is not a SLURM job array; expected task ids such as "
            "0-15, 1,3,5-7 or 0-15:2, optionally %K for at most K at once"
        )
    if last is None:
        return first
    return first + (last - first) // (step or 1) * (step or 1)


# --partition: one partition or a comma list (the first that can start the job); SLURM
# skips empty items.
def partitions(value: str) -> list[str]:
    return [name for name in value.split(",") if name]


# SLURM refuses a name or path longer than this many bytes ("Pathname of a file, directory
# or other parameter too long"): bytes, so 513 two-byte characters are too long.
MAX_NAME_BYTES, MAX_PATH_BYTES = 1024, 4096


def check_length(where: str, value: str, limit: int) -> None:
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > limit:
        raise SpecError(
            f"{where} is {size} bytes long ({len(value)} characters); SLURM takes at most "
            f"{limit} bytes"
        )
