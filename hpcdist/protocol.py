"""The requeue and rendezvous protocol shared by a job's script, hpcdist's submitit task and
the training inside the job.

Every name, exit code, path and formula that two of them must agree on is defined here once:
the templates receive these values when they are rendered (``render.protocol_context``), the
submit path and the training import them.

The requeue protocol, step by step:

1. SLURM sends the warning signal (``--signal``) before the time limit; its name travels in
   ``$HPCDIST_SIGNAL`` so the training catches it (as well as USR2).
2. Every rank stops at the same step; rank 0 writes the checkpoint and then says "requeue
   me", by exit code ``REQUEUE_EXIT_CODE`` and by creating the file named in
   ``$HPCDIST_REQUEUE_MARKER`` (srun and torchrun report some other rank's status, so the exit
   code alone does not reach the batch shell).
3. The batch shell (or hpcdist's submitit task) sees the marker or the code and requeues
   the job, at most ``--max-restarts`` times; the rerun resumes from the checkpoint.
"""

from __future__ import annotations

# "I checkpointed on the warning signal: requeue me." Distinct from 1 (error) and 2 (usage),
# and from the 128+N a signal death produces, so a script can tell preemption apart.
REQUEUE_EXIT_CODE = 85

# Environment variables the job's script or submitit task sets for the training.
SIGNAL_VAR = "HPCDIST_SIGNAL"  # the warning signal's name, e.g. USR1
MARKER_VAR = "HPCDIST_REQUEUE_MARKER"  # the file rank 0 creates to ask for a requeue
RUN_DIR_VAR = "HPCDIST_RUN_DIR"  # the run folder of a job resubmitted as a new job id
RESTARTS_VAR = "HPCDIST_RESTARTS"  # resubmissions so far (no scontrol: a new job id)

# Where a rendered script's marker lives, below the submit directory, one file per job id.
MARKER_DIR = ".hpcdist/requeue"


def submitit_marker_name(restart_count: str) -> str:
    """The marker of hpcdist's submitit task: one name per restart, in the job's folder."""
    return f"requeue-marker.{restart_count}"


# Variables a job inherits from the job it was submitted from, which would make the new job
# believe it runs in the old one's allocation. SLURM_CONF names the cluster: it is kept.
INHERITED_PREFIXES: tuple[str, ...] = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
INHERITED_KEPT: tuple[str, ...] = ("SLURM_CONF",)


def is_inherited(name: str) -> bool:
    """Whether a submission from inside a job must hide this variable from the new job."""
    return name.startswith(INHERITED_PREFIXES) and name not in INHERITED_KEPT


# The rendezvous port: below the Linux ephemeral range (32768+), so an outgoing connection
# never holds it, and different for jobs and steps that share a node.
PORT_LOW, PORT_HIGH = 20000, 32767
# Coprime with the span: two jobs whose ids differ by less than the span never collide at
# the same step id.
PORT_STRIDE = 101


def derive_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of a job step, in [PORT_LOW, PORT_HIGH]."""
    if job_id < 0 or step_id < 0:
        raise ValueError(f"job id and step id must be >= 0, got {job_id} and {step_id}")
    span = PORT_HIGH - PORT_LOW + 1
    return PORT_LOW + (job_id * PORT_STRIDE + step_id) % span


def port_shell_expression(job_id: str, step_id: str) -> str:
    """``derive_port`` as a bash arithmetic expression over two shell variables."""
    span = PORT_HIGH - PORT_LOW + 1
    return f"$(( {PORT_LOW} + ({job_id} * {PORT_STRIDE} + {step_id}) % {span} ))"
