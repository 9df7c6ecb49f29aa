"""What runs inside a job: environment -> DistEnv -> process group.

The distributed contract (``DistEnv``, ``setup_distributed``, ``cleanup_distributed``),
CPU binding, hang diagnosis, the authenticated rendezvous and its secret, the job protocol
shared with the rendered scripts (``protocol``; its steps in ``requeue``, the GPU count in
``gpus``, and ``jobstep``, what a batch script runs), and the communication check. torch is
imported only where a process group starts. May import ``slurm``, ``state`` and ``errors``;
nothing above.

``from hpcdist.distributed import setup_distributed, cleanup_distributed, DistEnv`` is the
public API (the README's): everything of ``hpcdist.distributed.group`` is re-exported here,
loaded on first use, so that ``hpcdist.facts.protocol`` or ``.hangs`` (which the CLI
needs) do not load the process-group code with them.
"""

# ruff: noqa: F405 (the names of __all__ come from group, loaded on first use)
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # The names of __all__, for type checkers; at run time __getattr__ loads them.
    from hpcdist.distributed.group import *  # noqa: F403

# The public API, listed here once: hpcdist.distributed.group defines or re-exports each.
__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "PORT_HIGH",
    "PORT_LOW",
    "DistContext",
    "DistEnv",
    "DistEnvError",
    "DistributedInitError",
    "NodeListError",
    "Source",
    "allocated_gpus",
    "cleanup_distributed",
    "collective_timeout_s",
    "derive_port",
    "distributed",
    "expand_nodelist",
    "expand_tasks_per_node",
    "flight_recorder_files",
    "network_hint",
    "resolve_env",
    "select_device",
    "setup_distributed",
    "single_process",
    "task_device",
]


def __getattr__(name: str) -> Any:
    """``from hpcdist.distributed import X``: X from the group module, loaded on first use."""
    if name in __all__:
        from hpcdist.distributed import group

        return getattr(group, name)
    raise AttributeError(f"module 'hpcdist.distributed' has no attribute {name!r}")
