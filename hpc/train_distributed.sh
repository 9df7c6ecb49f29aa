#!/bin/bash
# ufsemulator-gloo: DDP over gloo, 2 nodes x 1 tasks, 1 CPUs each
# Rendered by hpcdist 0.1.0 from templates/gloo.sh.j2, profile generic (shipped:generic.yaml).
# Regenerate it with hpcdist rather than editing it by hand.
#SBATCH --job-name="ufsemulator-gloo"
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time="00:30:00"
#SBATCH --output="%x-%j.out"
# The warning: SIGUSR2 about 90 s before the time limit (SLURM may send it up to a minute early) to every rank (every process of the job step); hpcdist sends the command no other signal.
#SBATCH --signal="USR2@90"
#SBATCH --requeue
# A requeued job keeps writing to the same log instead of truncating it.
#SBATCH --open-mode="append"

set -euo pipefail
# Python puts the folder it starts in first on its import path, where another user may have
# put a module of the same name (a torch.py, an hpcdist/): PYTHONSAFEPATH=1 keeps it off for
# every Python this job starts (3.11 and later). Older Pythons ignore it: hpcdist's runner is
# started as python3 -c "${hpcdist_main}", which drops that entry (and an empty or relative
# PYTHONPATH entry, the same folder) before importing anything, refuses a working folder
# that others can write, and starts the ranks with neither.
export PYTHONSAFEPATH=1
# Nothing this job writes may be changed by group or others, whatever the umask it was
# submitted with (the log, opened before this line, is narrowed by hpcdist's runner).
umask go-w
hpcdist_main='import os, sys; cwd = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(":") if p[:1] != "/"}; sys.path[:] = [p for p in sys.path if p[:1] == "/" and p not in cwd]; del sys.argv[0]; import runpy; runpy._run_module_as_main(sys.argv[0])'
# A preemption sends TERM to this shell as well as to the ranks: trapped and noted until
# hpcdist's runner takes this shell's place (below), it ends nothing before the ranks have
# checkpointed.
terminated=0
trap 'terminated=1' TERM

# Site setup (the profile's lines, then --setup's): module loads, environment activation.
if [ -n "${HPCDIST_VENV:-}" ]; then source "${HPCDIST_VENV}/bin/activate"; fi

# >>> environment
# CPU layout: 1 compute thread on 1 CPU; OpenMP wait: the runtime's default.
# Where ranks exchange gradients, a quarter of each rank's CPUs is kept free for the
# exchange (docs/benchmarks.md, "CPU layout"); --threads-per-task and --omp-wait-policy
# change it.
export OMP_NUM_THREADS=1
export MKL_NUM_THREADS=1
export HPCDIST_CPUS_PER_TASK=1
# The warning signal's name, for the command: hpcdist's training catches it to checkpoint.
export HPCDIST_SIGNAL=USR2
# SLURM warns 90 s before the time limit. Where the run's checkpoint takes longer
# (it measures each), the training checkpoints earlier on its own, by the job's end time.
export HPCDIST_SIGNAL_LEAD=90
# A node that a failure names (a killed rank, a network error) is left out of this run's
# requeued or resubmitted pieces for this many seconds (--bad-node-hold).
export HPCDIST_BAD_NODE_HOLD=3600
# CPU nodes: accelerate (and the HF Trainer) form one job of every rank only when told to use
# the CPUs; otherwise each node trains a copy of its own. A value the job sets is kept.
export ACCELERATE_USE_CPU="${ACCELERATE_USE_CPU:-true}"
# <<< environment

# hpcdist's state of this job (its secret, its requeue marker, its log record) lives in
# folders of this user's alone: below the submit folder, or in the user's own state folder
# where others can write or own that one; a folder another user owns or can write is
# refused, never used. The ranks prove they hold the secret before they exchange anything.
prepared="$(python3 -c "${hpcdist_main}" hpcdist.distributed.jobstep prepare --log-record '{"output":"%x-%j.out","error":null,"name":"ufsemulator-gloo","rank_logs":"label","lead":90,"memory":null,"gpus_per_node":0}' --marker)"
eval "${prepared}"
echo "hpcdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}, restart ${SLURM_RESTART_COUNT:-0}"
# Rank 0 checkpoints on the warning signal, then asks for a requeue: it exits 85 and leaves
# the file $HPCDIST_REQUEUE_MARKER (srun reports whichever rank it killed last).
# hpcdist's runner takes this shell's place (exec), so that SLURM's signals reach it.
# It requeues the job if rank 0 asked (at most 3 times; after a TERM only if SLURM
# preempted the job, never after scancel or the time limit), or submits this script again
# where scontrol is missing or refuses.
# It says so where the command died of the warning signal, which it did not catch.
# It exits with srun's status otherwise. Until it has set its own handlers, the
# signals it catches are ignored rather than fatal.
trap '' TERM
# srun in SLURM >= 22.05 no longer inherits --cpus-per-task from sbatch: pass it explicitly.
# --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest in a collective.
# Each rank starts through hpcdist.distributed.rankenv: torch's env:// variables (RANK,
# LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK) from SLURM's,
# then the command in its place, so code written for torchrun runs unchanged.
exec python3 -c "${hpcdist_main}" hpcdist.distributed.jobstep run --warning=USR2@90 --requeue --terminated="${terminated}" --max-restarts=3 --script="${BASH_SOURCE[0]}" -- \
  srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --label \
  python3 -m hpcdist.distributed.rankenv -- python3 -m ufsemulator train
