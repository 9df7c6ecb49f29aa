#!/bin/bash
# ufsemulator-nccl: DDP over NCCL, 1 nodes x 4 GPUs, one task per GPU
# Rendered by hpcdist 0.1.0 from templates/nccl.sh.j2, profile gpu-cluster (shipped:gpu-cluster.yaml).
# Regenerate it with hpcdist rather than editing it by hand.
#SBATCH --job-name="ufsemulator-nccl"
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time="04:00:00"
#SBATCH --mem="0"
#SBATCH --partition="gpu"
#SBATCH --output="%x-%j.out"
#SBATCH --gpus-per-node=4
#SBATCH --signal="USR2@90"
#SBATCH --requeue
# A requeued job keeps writing to the same log instead of truncating it.
#SBATCH --open-mode="append"

set -euo pipefail
# A preemption sends TERM to this shell as well as to the ranks: trapped, the shell outlives
# srun, whose ranks checkpoint on it, and can requeue the job (or submit it again) below.
terminated=0
trap 'terminated=1 interrupted=1' TERM

# Site setup (the profile's lines, then --setup's): module loads, environment activation.
if command -v module >/dev/null 2>&1; then module load cuda; fi
if [ -n "${HPCDIST_VENV:-}" ]; then source "${HPCDIST_VENV}/bin/activate"; fi

# >>> environment
# One thread per allocated CPU: the numbers follow the allocation, never the node's core count.
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
export MKL_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
# The training catches this warning signal (as well as USR2) to checkpoint in time.
export HPCDIST_SIGNAL=USR2
export NCCL_DEBUG=WARN
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export TORCH_NCCL_TRACE_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
# <<< environment

# hpcdist's state of this job (its secret, its requeue marker) lives in folders of this user's
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
for dir in "${state_dir}" "${state_dir}/secrets" "${state_dir}/requeue" "${state_dir}/logs"; do
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
(umask 077 && printf '%s\n' '{"output":"%x-%j.out","error":null,"name":"ufsemulator-nccl","rank_logs":"label"}' > "${state_dir}/logs/${SLURM_JOB_ID}")
echo "hpcdist: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST}, restart ${SLURM_RESTART_COUNT:-0}"
# Rank 0 leaves this file once it has checkpointed on the warning signal. A file, not an
# exit code: srun reports whichever rank it killed last, not the one that asked.
export HPCDIST_REQUEUE_MARKER="${state_dir}/requeue/${SLURM_JOB_ID}"
rm -f "${HPCDIST_REQUEUE_MARKER}"
status=0
# srun in SLURM >= 22.05 no longer inherits --cpus-per-task from sbatch: pass it explicitly.
# --kill-on-bad-exit ends every rank when one dies, instead of leaving the rest in a collective.
srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=16 --kill-on-bad-exit=1 --label \
  python3 -m ufsemulator train || status=$?
if [ -f "${HPCDIST_REQUEUE_MARKER}" ] || [ "$status" -eq 85 ]; then
  rm -f "${HPCDIST_REQUEUE_MARKER}"
  # Requeues count in SLURM_RESTART_COUNT, resubmissions (no scontrol) in HPCDIST_RESTARTS.
  restarts=$(( ${SLURM_RESTART_COUNT:-0} + ${HPCDIST_RESTARTS:-0} ))
  # TERM without a preemption is scancel, the time limit or SLURM's own requeue: never
  # requeue a job the user cancelled. A job picked for preemption has a PreemptTime.
  preempted=0
  if [ "${terminated}" -eq 1 ] && scontrol show job "${SLURM_JOB_ID}" 2>/dev/null | grep -q 'PreemptTime=[0-9]'; then
    preempted=1
  fi
  if [ "${terminated}" -eq 1 ] && [ "${preempted}" -eq 0 ]; then
    echo "hpcdist: not requeueing: job ${SLURM_JOB_ID} was ended (TERM) without a preemption" >&2
  elif [ "$restarts" -ge 3 ]; then
    echo "hpcdist: not requeueing: restart ${restarts} reached --max-restarts 3" >&2
  elif command -v scontrol >/dev/null 2>&1 && {
    echo "hpcdist: checkpoint written, requeueing job ${SLURM_JOB_ID}" >&2
    scontrol requeue "${SLURM_JOB_ID}"
  }; then
    exit 0
  else
    # No scontrol here, or the site refuses the requeue (a preemption that cancels): submit
    # this script again as a new job that resumes from this job's run folder, without this
    # job's SLURM_* variables.
    echo "hpcdist: no requeue (scontrol missing or refused), resubmitting ${BASH_SOURCE[0]} with sbatch" >&2
    unset_vars=()
    for var in $(compgen -e); do
      case "$var" in
        SLURM_CONF) ;;
        SLURM_*|SBATCH_*|SRUN_*|SALLOC_*) unset_vars+=(-u "$var") ;;
      esac
    done
    env "${unset_vars[@]}" HPCDIST_RUN_DIR="${HPCDIST_RUN_DIR:-runs/${SLURM_JOB_ID}}" \
      HPCDIST_RESTARTS="$(( restarts + 1 ))" \
      sbatch "${BASH_SOURCE[0]}" && exit 0
  fi
fi
exit "$status"
