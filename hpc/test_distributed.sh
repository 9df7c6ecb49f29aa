#!/bin/bash
# hpcdist-commcheck: communication check (all_reduce, broadcast, barrier) on 2 nodes x 1 tasks (gloo on CPU)
# Rendered by hpcdist 0.1.0 from templates/test.sh.j2, profile local.
# Regenerate it with hpcdist rather than editing it by hand.
#SBATCH --job-name="hpcdist-commcheck"
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time="00:30:00"
#SBATCH --partition="debug"
#SBATCH --output="%x-%j.out"
#SBATCH --no-requeue

set -euo pipefail


# >>> environment
# One thread per allocated CPU: the numbers follow the allocation, never the node's core count.
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export MKL_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export GLOO_SOCKET_IFNAME=lo
# <<< environment

echo "hpcdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}, restart ${SLURM_RESTART_COUNT:-0}"
status=0
# srun in SLURM >= 22.05 no longer inherits --cpus-per-task from sbatch: pass it explicitly.
# --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest in a collective.
srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=1 --label \
  python3 -m hpcdist.commcheck --timeout 60 || status=$?
if [ "$status" -ne 0 ]; then
  echo "hpcdist: communication check failed with exit code ${status}" >&2
fi
exit "$status"
