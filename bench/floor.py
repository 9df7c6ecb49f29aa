"""The launcher's floor: what any distributed PyTorch job pays before its first line of work.

    torchrun --standalone --nproc-per-node N -m bench.floor

Imports torch, initialises CUDA (one GPU per rank, ``LOCAL_RANK``) or stays on the CPU
(``CUDA_VISIBLE_DEVICES=""``), forms the NCCL (gloo) process group, all-reduces once and
leaves. ``bench.e2e`` launches it exactly as it launches the training job, in the same run.
"""

from __future__ import annotations

import os


def main() -> int:
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    assert value.item() == dist.get_world_size()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
