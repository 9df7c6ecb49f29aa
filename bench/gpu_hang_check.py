"""A hung collective on NCCL, on purpose: rank 1 skips an all-reduce that rank 0 waits in.

With ``HPCDIST_COLLECTIVE_TIMEOUT`` and the gpu-cluster profile's flight-recorder settings
set, rank 0 must fail after about that many seconds (not hang to the job's time limit) and
leave its flight-recorder dump in the run folder. Run under torchrun with 2 GPUs:

    HPCDIST_COLLECTIVE_TIMEOUT=10 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 \\
    TORCH_NCCL_DUMP_ON_TIMEOUT=1 HPCDIST_RUN_DIR=/tmp/hang \\
    torchrun --standalone --nproc-per-node 2 -m bench.gpu_hang_check

On a machine without GPUs the same runs over gloo (CI's short check, tests/test_bench_scripts.py).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from hpcdist.distributed import setup_distributed


def main() -> None:
    ctx = setup_distributed()
    on_gpu = ctx.device.type == "cuda"

    def synchronize() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    x = torch.ones(4, device=ctx.device)
    dist.all_reduce(x)
    synchronize()
    print(f"[Rank {ctx.env.rank}] first all-reduce: {x[0].item()}", flush=True)
    started = time.monotonic()
    if ctx.env.rank == 0:
        dist.all_reduce(x)  # rank 1 never joins this one
        synchronize()
        print("[Rank 0] the hung all-reduce returned?", flush=True)
    else:
        time.sleep(float(os.environ.get("HANG_SLEEP_S", "60")))
    print(f"[Rank {ctx.env.rank}] after {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
