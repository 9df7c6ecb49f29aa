"""Who is missing: the ranks of a process group that never reached a point, with their nodes.

Each rank notes its node in the group's own store once it has joined (``RollCall.of_group``)
and its arrival at a named point (``answer``). A rank that sees a collective fail asks which
ranks never arrived (``missing``, or ``awaited`` while the others are still on their way,
each asked in a thread of its own: a store gone with its host, or held by a stopped one,
holds the verdict up by ``SILENT_S`` at most) and prints one line for each (``blame_lines``), in
the form ``hpcdist.distributed.badnodes`` reads: the node of a rank that hung or died is
kept out of the run's next piece. The communication check (``commcheck``) notes every step;
the training (``ufsemulator.training.train``) answers once, after a collective failed.

The store lives in rank 0's process (``hpcdist.distributed.group``): where rank 0 itself
hangs, the store is silent too (no error, no answer). Rank 1 then names rank 0, on the node
every rank read when it joined: a store that refuses (its host died) names nobody; srun or
torchrun's agent names a rank that died.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from typing import Any

_KEY = "hpcdist/rollcall"
ASK_S = 5.0  # the store is asked this long at most for one verdict
# ... and this long before its silence is taken for rank 0 hanging (a loaded host's store
# can be slow; a store that hangs is silent for ever).
SILENT_S = 15.0
BLAME_MAX = 8  # ranks named one per line; the rest counted
_POLL_S = 0.2

# An error of a collective that waited for a peer in vain: torch's timeouts (gloo's "Timed
# out waiting", the store's, NCCL's watchdog) and the gradient exchanges' own ("rank(s) [3]
# silent for 600 s", "did not reach step"). A peer that died closes its connections instead
# ("Connection closed by peer", "has exited"): srun or torchrun's agent names that rank and
# its node, and the ranks left must not linger (srun ends them within its KillWait).
_TIMED_OUT = re.compile(r"timed? ?out|timeout|silent for|did not reach", re.I)
# ``blame_lines``, as read back: who wrote it, the rank, its node, what it never did.
BLAME_LINE = re.compile(
    r"^(?:\d+: )?hpcdist: (?:commcheck|training): rank (\d+) on (\S+) (never [^\n]+?)\s*$",
    re.M,
)


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` says a collective waited for a peer in vain (a rank that hangs),
    rather than a peer's death or an error of this rank's own."""
    return bool(_TIMED_OUT.search(f"{type(exc).__name__}: {exc}"))


class RollCall:
    """Which ranks reached which point, kept in the process group's own store."""

    def __init__(self, store: Any, rank: int, world_size: int, holder: str | None = None) -> None:
        self._store = store
        self.rank = rank
        self.world_size = world_size
        # The node of rank 0 where its process holds the store (None: not known, or the
        # store is torchrun's agent's).
        self.holder = holder

    @classmethod
    def of_group(cls, rank: int, world_size: int, hostname: str) -> RollCall | None:
        """The roll call of the default group, this rank's node noted (None where the
        group has no store to share: nobody can be named then)."""
        try:
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()
            store.set(f"{_KEY}/host/{rank}", hostname)
        except Exception:
            return None
        holder = None
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # rank 0 holds it
            holder = hostname if rank == 0 else _noted_host(store, 0)
        return cls(store, rank, world_size, holder)

    def answer(self, point: str) -> None:
        self._store.set(f"{_KEY}/{point}/{self.rank}", "1")

    def heard(self, point: str) -> bool:
        """Whether the store holds this rank's answer at ``point``: a round trip (a set
        is sent without one, and returns at once from a store that hangs)."""
        return bool(self._store.check([f"{_KEY}/{point}/{self.rank}"]))

    def missing(self, point: str) -> list[tuple[int, str]]:
        """(rank, node) of every rank that never reached ``point``; node "?" if not known."""
        store, found = self._store, []
        for rank in range(self.world_size):
            if store.check([f"{_KEY}/{point}/{rank}"]):
                continue
            host_key = f"{_KEY}/host/{rank}"
            host = store.get(host_key).decode() if store.check([host_key]) else "?"
            found.append((rank, host))
        return found

    def asked(self, point: str) -> list[tuple[int, str]]:
        """``missing`` ([] where the store refused); where the store is silent for
        ``SILENT_S``, rank 0 (``holder_hangs``)."""
        found = _within(SILENT_S, lambda: self.missing(point), silent=_SILENT)
        return self.holder_hangs() if found is _SILENT else found or []

    def holder_hangs(self) -> list[tuple[int, str]]:
        """What rank 1 says of a store that is silent: rank 0, which holds it, hangs (its
        node as every rank read it on joining). [] on every other rank (one says it) and
        where rank 0's node is not known."""
        return [(0, self.holder)] if self.rank == 1 and self.holder is not None else []

    def awaited(self, point: str, wait_s: float) -> list[tuple[int, str]]:
        """The ranks still missing at ``point`` after waiting ``wait_s`` for them to arrive
        (sooner when all have); [] where the store stops answering."""
        deadline, found = time.monotonic() + wait_s, None
        while True:
            # None: no answer this time (slow on a loaded host, or an error), not "nobody".
            asked = _within(ASK_S, lambda: self.missing(point))
            found = found if asked is None else asked
            if found == [] or time.monotonic() >= deadline:
                return found or []
            time.sleep(_POLL_S)

    def first_to(self, what: str) -> bool:
        """True for the one rank that asks first (its lines are printed once, not by every
        rank that saw the failure); False for the others, or when the store is gone."""
        count = _within(ASK_S, lambda: self._store.add(f"{_KEY}/first/{what}", 1))
        return count == 1


def _noted_host(store: Any, rank: int) -> str | None:
    """The node ``rank`` noted as it joined, waited for ``ASK_S`` at most (None if it did
    not). Polled with ``check`` in this thread: a ``get`` left waiting in another would
    hold the store's client from the group's own use of it."""
    key, deadline = f"{_KEY}/host/{rank}", time.monotonic() + ASK_S
    try:
        while not store.check([key]):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return bytes(store.get(key)).decode()
    except Exception:
        return None


_SILENT = object()  # a question still unanswered when its time was up


def _within(seconds: float, ask: Any, silent: Any = None) -> Any:
    """``ask()``'s answer within ``seconds``; None where it raised, ``silent`` where it had
    not answered by then."""
    found: list[Any] = []

    def run() -> None:
        with contextlib.suppress(Exception):
            found.append(ask())

    asking = threading.Thread(target=run, name="hpcdist-rollcall", daemon=True)
    asking.start()
    asking.join(seconds)
    if found:
        return found[0]
    return silent if asking.is_alive() else None


def blame_lines(who: str, missing: list[tuple[int, str]], what: str) -> list[str]:
    """One line per missing rank (``hpcdist: commcheck: rank 3 on node2 never reached
    all_reduce``; ``what`` starts with "never"), at most ``BLAME_MAX`` and a count of the
    rest. Pure."""
    lines = [f"hpcdist: {who}: rank {rank} on {host} {what}" for rank, host in missing[:BLAME_MAX]]
    if len(missing) > BLAME_MAX:
        lines.append(f"hpcdist: {who}: and {len(missing) - BLAME_MAX} more ranks")
    return lines


# How long a rank that saw a collective fail waits for the others to answer: they saw it
# fail too, within a step of each other, unless they hang or died.
ANSWER_WAIT_S = 15.0
_FAILED_POINT = "failed"
NEVER_ANSWERED = "never answered after a collective failed"


def name_the_missing(
    call: RollCall, exc: BaseException, who: str, wait_s: float = ANSWER_WAIT_S
) -> list[str]:
    """This rank answers that it saw ``exc``. Where ``exc`` says a collective timed out,
    it waits ``wait_s`` at most for the others to answer too, and the first rank to finish
    waiting prints one line (stderr) for each that did not: its lines are returned. Where
    the store itself is silent, rank 1 names rank 0, which holds it."""

    def note() -> bool:
        call.answer(_FAILED_POINT)
        return call.heard(_FAILED_POINT)

    answered = _within(SILENT_S, note, silent=_SILENT)
    if not timed_out(exc):
        return []  # this rank's own error, or a peer that died
    if answered is _SILENT:  # rank 0, which holds the store, hangs: rank 1 says so
        missing = call.holder_hangs()
    elif not answered:
        return []  # a store gone with its host: srun or the agent names the rank
    else:
        missing = call.awaited(_FAILED_POINT, wait_s)
        if not missing or not call.first_to("blame"):
            return []
    lines = blame_lines(who, missing, NEVER_ANSWERED)
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    return lines
