"""The committed scripts in hpc/, rendered from the templates with the shipped profile
(``generic``: nothing of a site assumed) and the flags a site's values would give.

Regenerate them all with ``python3 -m hpcdist.render.hpcscripts``; ``--check`` exits 1 if any
committed script differs from a fresh render (the tests run that check too).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.fileutil import umask_mode, write_atomic

# script name -> the flags that `hpcdist render` would be given for it.
HPC_SCRIPTS: Mapping[str, Mapping[str, Any]] = {
    "train.sh": {"profile": "generic", "mode": "threads", "nodes": 1, "cpus_per_task": 40},
    "test_distributed.sh": {"profile": "generic", "mode": "test", "nodes": 2},
    "train_distributed.sh": {"profile": "generic", "mode": "gloo", "nodes": 2},
    "train_distributed_multinode.sh": {"profile": "generic", "mode": "gloo", "nodes": 4},
    "train_gpu.sh": {
        "profile": "generic",
        "mode": "nccl",
        "nodes": 1,
        "gpus_per_node": 4,
        # As examples/profiles/gpu-cluster.yaml sets them: the flight recorder, and NVLink
        # SHARP multicast off, as on shared machines.
        "env": (
            "TORCH_NCCL_TRACE_BUFFER_SIZE=2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
            "NCCL_NVLS_ENABLE=0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
            "NVSHMEM_DISABLE_NVLS=1",
        ),
    },
}


def render_hpc_script(name: str) -> str:
    return render(spec_from_options(dict(HPC_SCRIPTS[name])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m hpcdist.render.hpcscripts", description=__doc__
    )
    parser.add_argument("--dir", type=Path, default=Path("hpc"), help="where the scripts live")
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name in HPC_SCRIPTS:
        path = args.dir / name
        text = render_hpc_script(name)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            write_atomic(path, text, mode=umask_mode(executable=True))
            print(f"wrote {path}")
    if stale:
        print(
            f"out of date in {args.dir}: {', '.join(stale)}; "
            "run python3 -m hpcdist.render.hpcscripts"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
