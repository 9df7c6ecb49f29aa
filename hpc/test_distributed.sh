#!/bin/bash
# hpcdist-commcheck: communication check (all_reduce, broadcast, barrier) on 2 nodes x 1 tasks (gloo on CPU)
# Rendered by hpcdist 0.1.0 from templates/test.sh.j2, profile local (shipped:local.yaml).
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
# CPU layout: 1 compute thread on 2 CPUs, 1 for the exchange; OpenMP wait: the runtime's default.
# Where ranks exchange gradients, a quarter of each rank's CPUs is kept free for the
# exchange (docs/benchmarks.md, "CPU layout"); --threads-per-task and --omp-wait-policy
# change it.
export OMP_NUM_THREADS=1
export MKL_NUM_THREADS=1
export HPCDIST_CPUS_PER_TASK=2
export GLOO_SOCKET_IFNAME=lo
# <<< environment

# hpcdist's state of this job (its secret) lives in folders of this user's
# alone: one that another user owns or can write is refused, never used.
submit_dir="${SLURM_SUBMIT_DIR:-$PWD}"
for dir in .hpcdist .hpcdist/secrets; do
  (umask 077 && mkdir -p "${submit_dir}/${dir}") 2>/dev/null || true
  dir="${submit_dir}/${dir}"
  mode="$(stat -c %a "${dir}" 2>/dev/null || echo missing)"
  if [ -L "${dir}" ] || [ ! -O "${dir}" ] || [ $(( 8#${mode/missing/2} & 8#022 )) -ne 0 ]; then
    echo "hpcdist: refusing ${dir}: owned by $(stat -c %U "${dir}" 2>/dev/null || echo nobody), mode ${mode}; it must be yours alone: remove it (or chmod go-w it if it is yours)" >&2
    exit 1
  fi
  chmod 700 "${dir}"
done
# The job's secret, new for every run: the ranks prove they hold it before they exchange
# anything, and the rendezvous port is derived from it (not from the public job id).
export HPCDIST_SECRET_FILE="${submit_dir}/.hpcdist/secrets/${SLURM_JOB_ID}"
rm -f "${HPCDIST_SECRET_FILE}"
(umask 077 && set -o noclobber && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "${HPCDIST_SECRET_FILE}")
echo "hpcdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}, restart ${SLURM_RESTART_COUNT:-0}"
status=0
# srun in SLURM >= 22.05 no longer inherits --cpus-per-task from sbatch: pass it explicitly.
# --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest in a collective.
srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=1 --label \
  python3 -m hpcdist.distributed.commcheck --timeout 60 || status=$?
if [ "$status" -ne 0 ]; then
  echo "hpcdist: communication check failed with exit code ${status}" >&2
fi
exit "$status"
