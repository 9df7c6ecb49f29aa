#!/bin/bash
# hpcdist-commcheck: communication check (all_reduce, broadcast, barrier) on 2 nodes x 1 tasks (gloo on CPU)
# Rendered by hpcdist 0.1.0 from templates/test.sh.j2, profile generic (shipped:generic.yaml).
# Regenerate it with hpcdist rather than editing it by hand.
#SBATCH --job-name="hpcdist-commcheck"
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time="00:30:00"
#SBATCH --output="%x-%j.out"
#SBATCH --no-requeue

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
# <<< environment

# hpcdist's state of this job (its secret, its log record) lives in
# folders of this user's alone: below the submit folder, or in the user's own state folder
# where others can write or own that one; a folder another user owns or can write is
# refused, never used. The ranks prove they hold the secret before they exchange anything.
prepared="$(python3 -c "${hpcdist_main}" hpcdist.distributed.jobstep prepare --log-record '{"output":"%x-%j.out","error":null,"name":"hpcdist-commcheck","rank_logs":"label","lead":null,"memory":null,"gpus_per_node":0}')"
eval "${prepared}"
echo "hpcdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}, restart ${SLURM_RESTART_COUNT:-0}"
# srun in SLURM >= 22.05 no longer inherits --cpus-per-task from sbatch: pass it explicitly.
# --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest in a collective.
# Each rank starts through hpcdist.distributed.rankenv: torch's env:// variables (RANK,
# LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK) from SLURM's,
# then the command in its place, so code written for torchrun runs unchanged.
status=0
srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --label \
  python3 -m hpcdist.distributed.rankenv -- python3 -m hpcdist.distributed.commcheck --timeout 60 || status=$?
if [ "$status" -ne 0 ]; then
  echo "hpcdist: communication check failed with exit code ${status}" >&2
fi
exit "$status"
