"""What runs inside a job: environment -> DistEnv -> process group.

The distributed contract (``DistEnv``, ``setup_distributed``, ``cleanup_distributed``),
CPU binding, hang diagnosis, the authenticated rendezvous and its secret, the job protocol
shared with the rendered scripts (``protocol``; its steps in ``requeue``, the GPU count in
``gpus``, ``jobstep``, what a batch script runs, and ``rankenv``, what srun starts before each
rank: torch's env:// variables), and the communication check. torch is
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
    from hpcdist.distributed.heartbeat import (
        HeartbeatWriter,
        continue_run,
        foreign_heartbeat,
        heartbeat_for,
        record_piece,
    )
    from hpcdist.distributed.rollcall import RollCall, name_the_missing
    from hpcdist.distributed.warnlead import (
        CheckpointTiming,
        last_checkpoint_time,
        record_checkpoint_time,
        watch_job_end,
    )
    from hpcdist.facts.protocol import MARKER_VAR, REQUEUE_EXIT_CODE, RUN_DIR_VAR, SIGNAL_VAR
    from hpcdist.facts.runs import RESULTS_FILE, RUN_ID_VAR, RUNS_DIR, run_name

# The public API, listed here once: hpcdist.distributed.group defines or re-exports each,
# but for the job protocol's names and the run naming (``_FACTS``).
__all__ = [
    "COLLECTIVE_TIMEOUT_ENV",
    "MARKER_VAR",
    "PORT_HIGH",
    "PORT_LOW",
    "REQUEUE_EXIT_CODE",
    "RESULTS_FILE",
    "RUNS_DIR",
    "RUN_DIR_VAR",
    "RUN_ID_VAR",
    "SIGNAL_VAR",
    "CheckpointTiming",
    "DistContext",
    "DistEnv",
    "DistEnvError",
    "DistributedInitError",
    "HeartbeatWriter",
    "NodeListError",
    "RollCall",
    "Source",
    "allocated_gpus",
    "cleanup_distributed",
    "collective_timeout_s",
    "continue_run",
    "derive_port",
    "distributed",
    "expand_nodelist",
    "expand_tasks_per_node",
    "flight_recorder_files",
    "foreign_heartbeat",
    "heartbeat_for",
    "last_checkpoint_time",
    "name_the_missing",
    "network_hint",
    "record_checkpoint_time",
    "record_piece",
    "resolve_env",
    "run_name",
    "select_device",
    "setup_distributed",
    "single_process",
    "task_device",
    "watch_job_end",
]
# Where the names of __all__ that are not the process group's come from (the job protocol's
# names, the run naming, rank 0's heartbeat and run record).
_FACTS = {
    "MARKER_VAR": "hpcdist.facts.protocol",
    "REQUEUE_EXIT_CODE": "hpcdist.facts.protocol",
    "RUN_DIR_VAR": "hpcdist.facts.protocol",
    "SIGNAL_VAR": "hpcdist.facts.protocol",
    "RESULTS_FILE": "hpcdist.facts.runs",
    "RUNS_DIR": "hpcdist.facts.runs",
    "run_name": "hpcdist.facts.runs",
    "RUN_ID_VAR": "hpcdist.facts.runs",
    "HeartbeatWriter": "hpcdist.distributed.heartbeat",
    "heartbeat_for": "hpcdist.distributed.heartbeat",
    "continue_run": "hpcdist.distributed.heartbeat",
    "foreign_heartbeat": "hpcdist.distributed.heartbeat",
    "record_piece": "hpcdist.distributed.heartbeat",
    # The checkpoint's measured time and the early checkpoint before SLURM's kill.
    "CheckpointTiming": "hpcdist.distributed.warnlead",
    "last_checkpoint_time": "hpcdist.distributed.warnlead",
    "record_checkpoint_time": "hpcdist.distributed.warnlead",
    "watch_job_end": "hpcdist.distributed.warnlead",
    # Who never answered after a collective failed, with their nodes.
    "RollCall": "hpcdist.distributed.rollcall",
    "name_the_missing": "hpcdist.distributed.rollcall",
}


def __getattr__(name: str) -> Any:
    """``from hpcdist.distributed import X``: X from the group module, loaded on first use."""
    if name in _FACTS:
        import importlib

        return getattr(importlib.import_module(_FACTS[name]), name)
    if name in __all__:
        from hpcdist.distributed import group

        return getattr(group, name)
    raise AttributeError(f"module 'hpcdist.distributed' has no attribute {name!r}")
