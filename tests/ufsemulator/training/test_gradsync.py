"""``GradSync`` + ``FusedAdam`` train as DDP + ``torch.optim.Adam(fused=True)`` do, bit for
bit, on two gloo ranks, without importing ``torch._dynamo``; the stop votes its exchange
carries on a CPU agree on every rank and leave the gradients as they were."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
from ufsemulator.training.adam import FusedAdam, fused_kernel_runs
from ufsemulator.training.gradsync import GradSync, reduce_gradients

pytestmark = pytest.mark.skipif(
    not fused_kernel_runs(torch.device("cpu")), reason="no fused Adam kernel for CPUs here"
)
WORLD, STEPS, ACCUM = 2, 6, 2
VOTES = {(1, 3), (0, 4), (1, 4)}  # (rank, step): asked to stop there


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _batches(rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own rows
    return [torch.randn(16, ModelConfig().n_in, generator=generator) for _ in range(STEPS * ACCUM)]


def _model(rank: int) -> EmulatorMLP:
    torch.manual_seed(rank)  # different on every rank: rank 0's must win
    return EmulatorMLP(ModelConfig(hidden=(16, 8)))


def _train(model: torch.nn.Module, optimizer: object, rank: int, ddp: bool) -> list[bool | None]:
    batches = _batches(rank)
    agreed = []
    for step in range(STEPS):
        for micro in range(ACCUM):
            x = batches[step * ACCUM + micro]
            last = micro == ACCUM - 1
            if ddp and not last:
                with model.no_sync():  # type: ignore[operator]
                    (model(x).pow(2).mean() / ACCUM).backward()
            else:
                (model(x).pow(2).mean() / ACCUM).backward()
        agreed.append(reduce_gradients(model, vote=(rank, step) in VOTES))
        optimizer.step()  # type: ignore[attr-defined]
        optimizer.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
    return agreed


def _rank_main(rank: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        ours = GradSync(_model(rank))
        adam_ours = FusedAdam(list(ours.parameters()), lr=3e-3, weight_decay=1e-4)
        agreed = _train(ours, adam_ours, rank, False)
        ours(_batches(rank)[0]).sum().backward()  # no step after it: the weights stay
        buffer = ours.flat.untyped_storage().data_ptr()
        grads = [p.grad for p in ours.module.parameters()]
        inside = all(g is not None and g.untyped_storage().data_ptr() == buffer for g in grads)
        dynamo = "torch._dynamo" in sys.modules
        theirs = DistributedDataParallel(_model(rank), gradient_as_bucket_view=True)
        adam = torch.optim.Adam(theirs.parameters(), lr=3e-3, weight_decay=1e-4, fused=True)
        agreed_ddp = _train(theirs, adam, rank, True)
        torch.save(
            {
                "ours": ours.module.state_dict(),
                "theirs": theirs.module.state_dict(),
                "dynamo_before_ddp": dynamo,
                "grads_in_buffer": inside,
                "agreed": agreed,
                "agreed_ddp": agreed_ddp,
            },
            f"{out}/rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gradsync_trains_as_ddp_does_on_every_rank(tmp_path: Path) -> None:
    mp.start_processes(
        _rank_main, args=(_free_port(), str(tmp_path)), nprocs=WORLD, start_method="spawn"
    )
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for result in results:
        # one rank's vote stops both; two votes count once; DDP carries none
        assert result["agreed"] == [False, False, False, True, True, False]
        assert result["agreed_ddp"] == [None] * STEPS
        assert result["dynamo_before_ddp"] is False
        assert result["grads_in_buffer"] is True
        assert result["ours"].keys() == result["theirs"].keys()
        for key, value in result["theirs"].items():
            assert torch.equal(result["ours"][key], value), key
    # ... and every rank holds the same weights (rank 0's start, the same mean gradients).
    for key, value in results[0]["ours"].items():
        assert torch.equal(results[1]["ours"][key], value), key
    assert not torch.equal(
        results[0]["ours"]["layers.0.weight"], _model(0).state_dict()["layers.0.weight"]
    )
