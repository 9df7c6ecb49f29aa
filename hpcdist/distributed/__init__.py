"""What runs inside a job: environment -> DistEnv -> process group.

The distributed contract (``DistEnv``, ``setup_distributed``, ``cleanup_distributed``),
CPU binding, hang diagnosis, the authenticated rendezvous and its secret, the job protocol
shared with the rendered scripts, and the communication check. torch is imported only where
a process group starts. May import ``slurm``, ``state`` and ``errors``; nothing above.

``from hpcdist.distributed import setup_distributed, cleanup_distributed, DistEnv`` is the
public API (the README's): everything of ``hpcdist.distributed.group`` is re-exported here.
"""

from hpcdist.distributed.group import (
    COLLECTIVE_TIMEOUT_ENV,
    PORT_HIGH,
    PORT_LOW,
    DistContext,
    DistEnv,
    DistEnvError,
    DistributedInitError,
    NodeListError,
    Source,
    allocated_gpus,
    cleanup_distributed,
    collective_timeout_s,
    derive_port,
    distributed,
    expand_nodelist,
    expand_tasks_per_node,
    flight_recorder_files,
    network_hint,
    resolve_env,
    select_device,
    setup_distributed,
    single_process,
    task_device,
)

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
