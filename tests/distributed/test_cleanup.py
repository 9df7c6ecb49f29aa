"""``cleanup_distributed``: a gloo group is destroyed after an error too (the process can
form another); only NCCL's communicators are aborted instead (checked on GPUs)."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from hpcdist.distributed import cleanup_distributed


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("after_error", [False, True])
def test_a_gloo_group_is_destroyed_with_or_without_an_error(after_error: bool) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1)
    cleanup_distributed(after_error=after_error)
    assert not dist.is_initialized()
    cleanup_distributed(after_error=after_error)  # twice: nothing to do
    dist.init_process_group(  # and a new group can be formed
        "gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1
    )
    cleanup_distributed()
    assert not dist.is_initialized()
