"""SLURM node lists (``gpu-[01-03,07],cpu[1-2]``) expanded exactly as SLURM does.

A pure module with no dependencies: the CLI, DistEnv and the tests all use it.
"""

from __future__ import annotations

import functools
import operator
import re
from itertools import product

# SLURM refuses a single range of more than 64Ki hosts; a whole list of more than 1Mi
# hosts is not an allocation but a typo, and expanding it would only eat memory.
_MAX_RANGE = 1 << 16
MAX_HOSTS = 1 << 20
_SEPARATORS = re.compile(r"[,\s]+")


class NodeListError(ValueError):
    """A SLURM node list that SLURM itself would not expand."""


def expand_nodelist(nodelist: str, what: str = "node list") -> list[str]:
    """Expand a SLURM host list (``gpu-[01-03,07],cpu[1-2]``) in SLURM's own order.

    ``what`` names the list in error messages (e.g. the variable it came from).
    """
    hosts: list[str] = []
    for token in _split_top_level(nodelist, what):
        if "[" not in token:
            hosts.append(token)
            continue
        hosts.extend(_expand_token(token, nodelist, what))
        if len(hosts) > MAX_HOSTS:
            raise NodeListError(f"{what} {nodelist!r} expands to more than {MAX_HOSTS} hosts")
    if not hosts:
        raise NodeListError(f"{what} {nodelist!r} is empty; expected e.g. 'node[01-04]'")
    return hosts


def _split_top_level(nodelist: str, what: str) -> list[str]:
    """Split at commas (and, like SLURM, whitespace) outside brackets."""
    if any(space in nodelist for space in " \t\n\r"):
        depth = 0
        for char in nodelist:  # rare path: SLURM itself never writes whitespace
            depth += (char == "[") - (char == "]")
            if depth > 0 and char.isspace():
                raise NodeListError(f"whitespace inside brackets in {what} {nodelist!r}")
        pieces = _SEPARATORS.split(nodelist)
    else:
        pieces = nodelist.split(",")  # str.split: a 10,000-host list must take milliseconds
    tokens: list[str] = []
    open_token: list[str] = []
    depth = 0
    for piece in pieces:
        if not open_token and "[" not in piece and "]" not in piece:
            if piece:
                tokens.append(piece)
            continue
        open_token.append(piece)
        depth += piece.count("[") - piece.count("]")
        if depth < 0:
            raise NodeListError(f"unbalanced ']' in {what} {nodelist!r}")
        if depth == 0:
            tokens.append(",".join(open_token))
            open_token = []
    if open_token:
        raise NodeListError(f"unbalanced '[' in {what} {nodelist!r}")
    return tokens


def _expand_token(token: str, nodelist: str, what: str) -> list[str]:
    prefix, _, rest = token.partition("[")
    if "]" in prefix:
        raise NodeListError(f"unbalanced ']' in {what} {nodelist!r}")
    if "[" not in rest:  # one bracket group: by far the most common form
        # _split_top_level balanced the brackets and no ']' precedes the '[', so the one
        # ']' closes this group.
        inner, _, tail = rest.partition("]")
        return [prefix + v + tail for v in _expand_ranges(inner, nodelist, what)]
    literals = [prefix]
    groups: list[list[str]] = []
    for piece in rest.split("["):
        inner, closed, literal = piece.partition("]")
        if not closed or "]" in literal:
            raise NodeListError(f"nested or unbalanced brackets in {what} {nodelist!r}")
        groups.append(_expand_ranges(inner, nodelist, what))
        literals.append(literal)
    count = 1
    for group in groups:
        count *= len(group)
    if count > MAX_HOSTS:
        raise NodeListError(f"{what} {nodelist!r} expands to more than {MAX_HOSTS} hosts")
    # SLURM's order (hostlist.c, checked against `scontrol show hostnames`): the last
    # bracket varies fastest, the others nest from the second-to-last (outermost) back
    # to the first. For two groups this is the plain product a1b1, a1b2, a2b1, a2b2.
    *outer, last = groups
    tail = literals[-1]
    hosts: list[str] = []
    for combo in product(*reversed(outer)):
        values = combo[::-1]
        head = literals[0] + "".join(map(operator.add, values, literals[1:-1]))
        hosts.extend([head + v + tail for v in last])
    return hosts


def _expand_ranges(inner: str, nodelist: str, what: str) -> list[str]:
    items = inner.split(",")
    digits = inner.replace(",", "").replace("-", "")
    if not (all(items) and digits.isdigit() and digits.isascii()):
        raise NodeListError(
            f"bad range {'[' + inner + ']'!r} in {what} {nodelist!r}; "
            "expected numbers N or LO-HI separated by commas"
        )
    if "-" not in inner:
        return items  # single numbers, each keeping its own padding
    values: list[str] = []
    for item in items:
        lo_s, dash, hi_s = item.partition("-")
        if not dash:
            values.append(lo_s)
            continue
        if not lo_s or not hi_s or "-" in hi_s:
            raise NodeListError(f"bad range {item!r} in {what} {nodelist!r}; expected LO-HI")
        lo, hi = int(lo_s), int(hi_s)
        if lo > hi:
            raise NodeListError(
                f"range {item!r} in {what} {nodelist!r} runs backwards; expected LO <= HI"
            )
        if hi - lo >= _MAX_RANGE:
            raise NodeListError(
                f"range {item!r} in {what} {nodelist!r} has more than {_MAX_RANGE} hosts"
            )
        # SLURM pads every number of a range to the width of its start ("08-10": 08 09 10);
        # a start without a leading zero is as wide as any number after it: no padding.
        width = len(lo_s)
        values.extend([str(n).zfill(width) for n in range(lo, hi + 1)])
    return values


@functools.lru_cache(maxsize=64)
def hosts_cached(nodelist: str, what: str) -> tuple[str, ...]:
    # Simulating an allocation resolves the same list once per rank.
    return tuple(expand_nodelist(nodelist, what))
