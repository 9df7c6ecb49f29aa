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
state_dir="${submit_dir}/.hpcdist"
# In a folder that others can write or own (or below one, without the sticky bit) they could
# swap .hpcdist for their own: the state then lives in this user's own state folder, keyed by
# the folder, where hpcdist submit and the training keep it too (unless HPCDIST_HOME is set).
folder="$(cd "${submit_dir}" && pwd -P)"
shared=""
[ -n "${HPCDIST_HOME:-}" ] || [ -O "${folder}" ] || shared="it is not yours"
probe="${folder}"
while [ -z "${HPCDIST_HOME:-}" ] && [ -z "${shared}" ]; do
  mode="$(stat -c %a "${probe}")"
  if [ $(( 8#${mode} & 8#022 )) -ne 0 ] && [ $(( 8#${mode} & 8#1000 )) -eq 0 ]; then
    shared="${probe} can be written by others (owner $(stat -c %U "${probe}"), mode ${mode})"
  fi
  [ "${probe}" = / ] && break
  probe="$(dirname "${probe}")"
done
if [ -n "${shared}" ]; then
  key="$(printf %s "${folder}" | sha256sum | cut -c1-12)"
  name="$(basename "${folder}" | tr -c 'A-Za-z0-9._\n-' _ | cut -c1-40)"
  state_dir="${XDG_STATE_HOME:-${HOME}/.local/state}/hpcdist/projects/${name:-root}-${key}"
  echo "hpcdist: note: ${shared}: this job's secret and markers are kept in ${state_dir}" >&2
fi
for dir in "${state_dir}" "${state_dir}/secrets" "${state_dir}/logs"; do
  (umask 077 && mkdir -p "${dir}") 2>/dev/null || true
  mode="$(stat -c %a "${dir}" 2>/dev/null || echo missing)"
  if [ -L "${dir}" ] || [ ! -O "${dir}" ] || [ $(( 8#${mode/missing/2} & 8#022 )) -ne 0 ]; then
    echo "hpcdist: refusing ${dir}: owned by $(stat -c %U "${dir}" 2>/dev/null || echo nobody), mode ${mode}; it must be yours alone: remove it (or chmod go-w it if it is yours)" >&2
    exit 1
  fi
  chmod 700 "${dir}"
done
# The job's secret, new for every run: the ranks prove they hold it before they exchange
# anything, and the rendezvous port is derived from it (not from the public job id).
export HPCDIST_SECRET_FILE="${state_dir}/secrets/${SLURM_JOB_ID}"
rm -f "${HPCDIST_SECRET_FILE}"
(umask 077 && set -o noclobber && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "${HPCDIST_SECRET_FILE}")
# Where this job's logs go, for `hpcdist logs` and `status` once SLURM has forgotten the job.
(umask 077 && printf '%s\n' '{"output":"%x-%j.out","error":null,"name":"hpcdist-commcheck","rank_logs":"label"}' > "${state_dir}/logs/${SLURM_JOB_ID}")
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
