"""The requeue and rendezvous protocol shared by a job's script, its runner and the
training inside the job.

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
3. The script's runner (``hpcdist.distributed.jobstep run``) sees the marker or the code
   and requeues the job, at most ``--max-restarts`` times; the rerun resumes from the checkpoint.
"""

from __future__ import annotations

# "I checkpointed on the warning signal: requeue me." Distinct from 1 (error) and 2 (usage),
# and from the 128+N a signal death produces, so a script can tell preemption apart.
REQUEUE_EXIT_CODE = 85

# Environment variables the job's script sets for the training.
SIGNAL_VAR = "HPCDIST_SIGNAL"  # the warning signal's name, e.g. USR1
MARKER_VAR = "HPCDIST_REQUEUE_MARKER"  # the file rank 0 creates to ask for a requeue
RUN_DIR_VAR = "HPCDIST_RUN_DIR"  # the run folder of a job resubmitted as a new job id
RESTARTS_VAR = "HPCDIST_RESTARTS"  # resubmissions so far (no scontrol: a new job id)
# A job of this machine (``submit --executor local``): its folder of logs and exit codes,
# and the batch script's exit code there (each rank's: ``exit_<rank>.json``).
LOCAL_FOLDER_VAR = "HPCDIST_LOCAL_FOLDER"
LOCAL_BATCH_EXIT = "exit_batch.json"


def local_exit_name(rank: int) -> str:
    """A local job's rank's exit record, in the job's folder (beside ``LOCAL_BATCH_EXIT``)."""
    return f"exit_{rank}.json"


def local_log_name(job_id: str, rank: int, stream: str = "out") -> str:
    """A local job's rank's log in its folder, as submitit names its tasks' logs (rank 0's
    holds the batch shell's lines too)."""
    return f"{job_id}_{rank}_log.{stream}"


# The job's --collective-timeout, carried into every rank by the script.
COLLECTIVE_TIMEOUT_ENV = "HPCDIST_COLLECTIVE_TIMEOUT"

# How the runner's line about a command the warning killed begins (``status`` finds it in
# the job's log).
WARNING_KILLED = "the command was killed by the warning signal"

# Where a rendered script's marker lives, below the submit directory, one file per job id.
MARKER_DIR = ".hpcdist/requeue"


# A sweep larger than the site's MaxArraySize is queued as several arrays of one script:
# each array's tasks find their point at this offset plus SLURM_ARRAY_TASK_ID.
SWEEP_OFFSET_VAR = "HPCDIST_SWEEP_OFFSET"

# Variables a job inherits from the job it was submitted from, which would make the new job
# believe it runs in the old one's allocation (or at another sweep's points). SLURM_CONF
# names the cluster: it is kept.
INHERITED_PREFIXES: tuple[str, ...] = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", SWEEP_OFFSET_VAR)
INHERITED_KEPT: tuple[str, ...] = ("SLURM_CONF",)


def is_inherited(name: str) -> bool:
    """Whether a submission from inside a job must hide this variable from the new job."""
    return name.startswith(INHERITED_PREFIXES) and name not in INHERITED_KEPT


# The rendezvous port: below the Linux ephemeral range (32768+), so an outgoing connection
# never holds it, and different for jobs and steps that share a node.
PORT_LOW, PORT_HIGH = 20000, 32767
# Coprime with the span: two seeds that differ by less than the span never collide at the
# same step id.
PORT_STRIDE = 101

# The job's secret: 32 random bytes as 64 hex digits, in a 0600 file of the private state
# (``SECRET_DIR``, one per job) whose path the ranks find in ``SECRET_VAR``. The port is
# derived from its first ``SECRET_PORT_DIGITS`` digits, so another user cannot compute it
# from the public job id; every rank proves that it holds the whole secret before
# anything is exchanged (hpcdist.distributed.jobsecret).
SECRET_VAR = "HPCDIST_SECRET_FILE"
SECRET_DIR = ".hpcdist/secrets"
# Where a rendered job leaves its log patterns (one line of JSON, ``logs/<job id>``): how
# `hpcdist logs` and `status` find its files once SLURM has forgotten the job.
LOG_DIR = ".hpcdist/logs"
SECRET_HEX_DIGITS = 64
SECRET_PORT_DIGITS = 8


def port_seed(secret: str) -> int:
    """The number the port of a job with this secret is derived from."""
    return int(secret[:SECRET_PORT_DIGITS], 16)


def derive_port(seed: int, step_id: int) -> int:
    """The rendezvous port of a job step, in [PORT_LOW, PORT_HIGH]. ``seed`` is
    ``port_seed(secret)``; a job without a secret (a hand-made srun) uses its job id."""
    if seed < 0 or step_id < 0:
        raise ValueError(f"port seed and step id must be >= 0, got {seed} and {step_id}")
    span = PORT_HIGH - PORT_LOW + 1
    return PORT_LOW + (seed * PORT_STRIDE + step_id) % span
