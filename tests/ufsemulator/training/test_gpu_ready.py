"""While a GPU rank reads its files, a thread readies the GPU (context, NCCL's peer
connections); what it raises is raised by the main thread after the read, and CPU ranks
start no thread."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from ufsemulator.training import train


@dataclass
class _Ctx:
    device: torch.device
    backend: str = "nccl"


def test_a_cpu_rank_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(train, "_ready_device", lambda *a: pytest.fail("thread on a CPU"))
    before = threading.active_count()
    with train._device_ready_meanwhile(_Ctx(torch.device("cpu")), exchange=True):  # type: ignore[arg-type]
        assert threading.active_count() == before


@pytest.mark.parametrize(
    ("exchange", "grouped", "backend", "connects"),
    [
        (True, True, "nccl", True),
        (True, False, "nccl", False),
        (False, True, "nccl", False),
        (True, True, "gloo", False),  # gloo has no all-to-all of GPU tensors
    ],
)
def test_a_gpu_rank_connects_its_peers_only_where_it_exchanges_rows_over_nccl(
    monkeypatch: pytest.MonkeyPatch, exchange: bool, grouped: bool, backend: str, connects: bool
) -> None:
    calls: list[tuple[torch.device, bool]] = []
    monkeypatch.setattr(train, "grouped", lambda: grouped)
    monkeypatch.setattr(
        train, "_ready_device", lambda device, peers, failed: calls.append((device, peers))
    )
    device = torch.device("cuda", 1)
    with train._device_ready_meanwhile(_Ctx(device, backend), exchange=exchange):  # type: ignore[arg-type]
        pass
    assert calls == [(device, connects)]


def test_what_the_thread_raises_is_raised_after_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(device: torch.device, peers: bool, failed: list[BaseException]) -> None:
        failed.append(RuntimeError("NCCL error: unhandled system error"))

    monkeypatch.setattr(train, "_ready_device", broken)
    read: list[str] = []
    ready = train._device_ready_meanwhile(_Ctx(torch.device("cuda", 0)), exchange=True)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="unhandled system error"), ready:
        read.append("read")
    assert read == ["read"]  # the read itself ran to its end first
