"""torch's ``env://`` variables for a rank that srun started:
``python3 -m hpcdist.distributed.rankenv -- COMMAND...``.

srun gives each task SLURM's variables (``SLURM_PROCID``, ...), and hpcdist's local srun
stand-in gives submitit's; code written for torchrun reads ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` instead (and Lightning ``NODE_RANK``).
A rendered script starts every rank of the srun launcher through this module: it resolves
the rank with ``DistEnv`` (the port from the job's secret, as ``setup_distributed`` derives
it), exports torch's variables and takes the rank's place (``exec``), so signals reach the
command itself. Variables a launcher already set are kept: a command that starts torchrun
or accelerate itself gets none of them from here. Standard library only: it runs before the
command, which may not use torch at all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from hpcdist.distributed.distenv import RANK_ENV_VAR, DistEnv, DistEnvError, torch_variables
from hpcdist.distributed.jobsecret import load_secret
from hpcdist.distributed.netif import network_environ
from hpcdist.errors import UserError


def rank_environ(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with torch's variables for this rank, unless a launcher set them (``RANK``)
    or nothing started this process as one rank of several (a single process)."""
    out = dict(env)
    if "RANK" in env:
        master = env.get("MASTER_ADDR", "").strip()
        return {**out, **network_environ(master, out)} if master else out
    resolved = DistEnv.from_environ(env, load_secret(env))
    if resolved.source == "single":
        return out
    out.update(torch_variables(resolved))
    out[RANK_ENV_VAR] = resolved.source
    # gloo and NCCL on the interface that reaches rank 0 (hpcdist.distributed.netif).
    out.update(network_environ(resolved.master_addr, out))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0].startswith("-"):
        print(
            "hpcdist: rankenv needs a command after --, e.g. -- python3 train.py",
            file=sys.stderr,
        )
        return 2
    try:
        env = rank_environ(os.environ)
    except (DistEnvError, UserError) as exc:
        print(f"hpcdist: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"hpcdist: cannot start {args[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
