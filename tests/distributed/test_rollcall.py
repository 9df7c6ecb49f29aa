"""The roll call: which ranks never reached a point, named with their nodes, and read back.

The store is torch's own TCPStore (one process holds it, as rank 0 does in a job)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from hpcdist.distributed import rollcall
from hpcdist.distributed.badnodes import named_nodes
from hpcdist.distributed.rollcall import (
    BLAME_MAX,
    NEVER_ANSWERED,
    RollCall,
    blame_lines,
    name_the_missing,
    timed_out,
)


def test_blame_lines_name_each_missing_rank_then_count_the_rest() -> None:
    assert blame_lines("commcheck", [], "never reached barrier") == []
    assert blame_lines("commcheck", [(3, "node2")], "never reached all_reduce") == [
        "hpcdist: commcheck: rank 3 on node2 never reached all_reduce"
    ]
    exactly = [(rank, f"node{rank}") for rank in range(BLAME_MAX)]
    assert len(blame_lines("training", exactly, "never answered")) == BLAME_MAX
    many = [(rank, f"node{rank}") for rank in range(BLAME_MAX + 2)]
    lines = blame_lines("training", many, "never answered")
    assert len(lines) == BLAME_MAX + 1
    assert lines[BLAME_MAX - 1] == "hpcdist: training: rank 7 on node7 never answered"
    assert lines[BLAME_MAX] == "hpcdist: training: and 2 more ranks"


@pytest.mark.parametrize("who", ["commcheck", "training"])
def test_blame_lines_are_read_back_as_the_nodes_to_keep_off(who: str) -> None:
    what = "never answered after a collective failed"
    lines = blame_lines(who, [(1, "node2"), (5, "gpu-a17")], what)
    log = "\n".join(["1: some output", *(f"0: {line}" for line in lines), "srun: done"])
    assert named_nodes(log, ["node1", "node2", "gpu-a17"]) == [
        ("node2", f"rank 1 {what}"),
        ("gpu-a17", f"rank 5 {what}"),
    ]
    # A node that is not the job's is never recorded; another program's line names nothing.
    assert named_nodes(log, ["node1", "node2"]) == [("node2", f"rank 1 {what}")]
    assert named_nodes(f"hpcdist: report: rank 1 on node2 {what}", ["node2"]) == []


@pytest.mark.parametrize(
    "message",
    [
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv",
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)",
        "peer exchange: rank(s) [3] silent for 600 s",
        "shared-memory all-reduce: rank(s) [2] did not reach step 9 within 600 s",
    ],
)
def test_a_collective_that_timed_out_is_told_from_other_errors(message: str) -> None:
    assert timed_out(RuntimeError(message))


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("input 'aice' not in the data set"),
        RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        KeyError("sst"),
        # A peer that died: srun or torchrun names it; the ranks left end at once.
        RuntimeError("shared-memory all-reduce: rank 1 (process 4242) has exited; step 3"),
        RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [10.0.0.2]"),
        ConnectionResetError("Connection reset by peer"),
        RuntimeError("direct gradient exchange: rank 0's connection failed (Broken pipe)"),
    ],
)
def test_a_peer_s_death_or_a_rank_s_own_error_is_not_a_timeout(exc: Exception) -> None:
    assert not timed_out(exc)


@pytest.fixture
def store():  # type: ignore[no-untyped-def]
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))


def test_missing_names_each_rank_that_never_answered_with_its_node(store) -> None:  # type: ignore[no-untyped-def]
    calls = [RollCall(store, rank, 4) for rank in range(4)]
    for rank in (0, 1, 3):
        store.set(f"hpcdist/rollcall/host/{rank}", f"node{rank + 1}")
    for call in calls[:2]:
        call.answer("failed")
    # rank 2 never said where it runs: "?"; rank 3 did, but never answered.
    assert calls[0].missing("failed") == [(2, "?"), (3, "node4")]
    calls[2].answer("failed")
    calls[3].answer("failed")
    assert calls[0].missing("failed") == []
    assert calls[0].missing("other point") == [(0, "node1"), (1, "node2"), (2, "?"), (3, "node4")]


def test_awaited_returns_once_everyone_answered_and_not_before(store) -> None:  # type: ignore[no-untyped-def]
    calls = [RollCall(store, rank, 2) for rank in range(2)]
    calls[0].answer("failed")
    started = time.monotonic()
    assert calls[0].awaited("failed", 0.6) == [(1, "?")]
    assert time.monotonic() - started >= 0.6
    calls[1].answer("failed")
    started = time.monotonic()
    assert calls[0].awaited("failed", 300.0) == []
    # Not the 300 s it would wait for a rank that never answers (however busy the machine).
    assert time.monotonic() - started < 300.0


def test_a_store_slow_to_answer_once_is_asked_again_not_taken_for_everyone(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On a loaded host one ask can outlast ASK_S: that is no answer, not "nobody missing".
    monkeypatch.setattr(rollcall, "ASK_S", 0.2)

    class SlowOnce:
        slow = True

        def check(self, keys: list[str]) -> bool:
            if SlowOnce.slow:
                SlowOnce.slow = False
                time.sleep(0.5)
            return bool(store.check(keys))

        def get(self, key: str) -> bytes:
            return bytes(store.get(key))

    RollCall(store, 0, 2).answer("failed")
    assert RollCall(SlowOnce(), 0, 2).awaited("failed", 1.0) == [(1, "?")]
    assert not SlowOnce.slow  # the slow ask happened


def test_only_the_first_rank_to_ask_prints(store) -> None:  # type: ignore[no-untyped-def]
    calls = [RollCall(store, rank, 3) for rank in range(3)]
    assert [call.first_to("blame") for call in calls] == [True, False, False]
    assert calls[2].first_to("another verdict")


def test_a_store_that_no_longer_answers_names_nobody() -> None:
    class Gone:
        def check(self, keys: list[str]) -> bool:
            raise RuntimeError("Connection reset by peer")

        def add(self, key: str, value: int) -> int:
            raise RuntimeError("Connection reset by peer")

    call = RollCall(Gone(), 0, 2)
    assert call.asked("failed") == [] and call.awaited("failed", 0.3) == []
    assert not call.first_to("blame")


class _Silent:
    """The store of a rank 0 that hangs (SIGSTOP, a stuck node): no answer, no error."""

    def __init__(self) -> None:
        self.never = threading.Event()

    def set(self, key: str, value: str) -> None:
        pass  # sent without a reply: returns at once, as torch's TCPStore client does

    def check(self, keys: list[str]) -> bool:
        return self.never.wait(30)

    add = get = check


def test_a_silent_store_is_rank_0_hanging_named_by_rank_1_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rollcall, "ASK_S", 0.2)
    monkeypatch.setattr(rollcall, "SILENT_S", 0.5)
    store, exc = _Silent(), RuntimeError("Timed out waiting 600000ms for recv operation")
    try:
        said = [
            name_the_missing(RollCall(store, rank, 4, holder="node1"), exc, "training")
            for rank in (1, 2, 3)
        ]
        assert said == [[f"hpcdist: training: rank 0 on node1 {NEVER_ANSWERED}"], [], []]
        # The communication check asks who never reached a step: the same answer.
        assert [RollCall(store, rank, 4, "node1").asked("barrier") for rank in (1, 2)] == [
            [(0, "node1")],
            [],
        ]
        # Rank 0's node not known (torchrun's agent holds the store): nobody is named; nor
        # for an error that is no timeout (a peer that died, this rank's own).
        assert name_the_missing(RollCall(store, 1, 4), exc, "training") == []
        dead = RuntimeError("Connection closed by peer")
        assert name_the_missing(RollCall(store, 1, 4, holder="node1"), dead, "training") == []
    finally:
        store.never.set()


def test_a_store_that_refuses_is_no_hang_and_names_nobody() -> None:
    class Refusing:
        def set(self, key: str, value: str) -> None:
            raise RuntimeError("Connection refused")

    exc = RuntimeError("Timed out waiting 600000ms for recv operation")
    assert name_the_missing(RollCall(Refusing(), 1, 4, holder="node1"), exc, "training") == []


def test_rank_0_s_node_is_read_once_noted_and_none_when_it_never_is(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollcall, "ASK_S", 1.0)
    later = threading.Timer(0.3, lambda: store.set("hpcdist/rollcall/host/0", "node1"))
    later.start()
    assert rollcall._noted_host(store, 0) == "node1"  # noted a moment after this rank asked
    started = time.monotonic()
    assert rollcall._noted_host(store, 5) is None  # never noted: given up after ASK_S
    assert time.monotonic() - started >= 1.0  # it asked for ASK_S before giving up
