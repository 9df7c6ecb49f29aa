#!/usr/bin/env bash
# hpc/train_gpu.sh-style NCCL jobs (one task per GPU) through a REAL SLURM on one machine with
# 4 GPUs and no SLURM installed (docs/gpu-slurm.md). Run from the repository root:
#
#     bench/gpu_slurm_job.sh [OUT_DIR]          # default: $OUT, else /tmp/gpu-slurm-out
#     bench/gpu_slurm_job.sh --render-only [OUT_DIR]
#
# --render-only (what CI runs on a CPU machine, tests/test_bench.py): no GPU, no SLURM, no
# .debs: every script the GPU run submits is rendered with the same flags and checked with
# `bash -n`; the GPU steps (testbed, sbatch, nvidia-smi) are skipped. Exit 1 if any render
# fails. GPU_SLURM_WORK moves the work folder (default /tmp/gpujob).
#
# Needs, beside the working tree (docs/gpu-slurm.md says how they are made):
#   .debs/  Debian 12's slurmctld, slurmd, slurm-client, slurm-wlm-basic-plugins, munge and the
#           libraries they link (apt-get download), unpacked here with dpkg -x;
#   .whl/   wheels of netCDF4, cftime (ufsemulator's data), submitit and cloudpickle.
#
# What it does, each step logged with its wall time:
#   1. unpacks .debs/*.deb into /tmp/slurmroot, installs .whl/*.whl into /tmp/site;
#   2. scripts/slurm-testbed up with that prefix: 1 node x 4 GPUs (Gres=gpu:4, 64 CPUs),
#      partition gpu, no accounting, cgroup/v1 plugin (never touches the cgroup v2 tree);
#   3. on it: the NCCL communication check (nccl mode rendered by hpcdist with the commcheck
#      as command), `--mode test` as rendered, hpc/train_gpu.sh itself, and a job given no GPU
#      count that finds the GPUs at run time;
#   4. restarts the testbed as 2 nodes x 2 GPUs (node2 owns GPUs 2-3) and runs the NCCL check
#      and the rendered 2-node training there;
#   5. tries the cgroup/v2 plugin (IgnoreSystemd=yes) on a 1-node testbed, for the record.
# If the testbed cannot start at all, the same programs are launched with the SLURM variables
# set as srun sets them (fallback_launch) and the reason is logged.
#
# Writes OUT_DIR/summary.txt (the PASS/FAIL and rank lines, GPUs seen) and OUT_DIR/logs.tar.gz
# (job outputs, daemon logs and configs, GPU process samples, training results).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
RENDER_ONLY=0
if [ "${1:-}" = "--render-only" ]; then
  RENDER_ONLY=1
  shift
fi
RENDER_FAILED=0
OUT_DIR=${1:-${OUT:-/tmp/gpu-slurm-out}}
WORK=${GPU_SLURM_WORK:-/tmp/gpujob}
LOGS=$WORK/logs
ROOT=/tmp/slurmroot
SITE=/tmp/site
SUMMARY=$OUT_DIR/summary.txt
rm -rf "$LOGS" && mkdir -p "$OUT_DIR" "$LOGS"
: >"$SUMMARY"

# NVLink multicast stays off in every process: the driver, the daemons, every job and task
# (sbatch and srun pass this environment on; the gpu-cluster profile also exports them).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export HPCDIST_DATA_DIR=$WORK/data

note() { echo "== $*"; echo "$*" >>"$SUMMARY"; }
# Killed at the caller's time limit: still pack what the logs hold so far.
trap 'note "interrupted"; tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs; exit 124' TERM INT
stamp() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------------ 0. the machine
t0=$(stamp)
if [ "$RENDER_ONLY" -eq 0 ]; then
note "machine: $(hostname), $(nproc) CPUs, kernel $(uname -r), $(date -u +%FT%TZ)"
note "os: $(. /etc/os-release && echo "$PRETTY_NAME"); cgroup fs: $(stat -fc %T /sys/fs/cgroup)"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader \
  | tee "$LOGS/gpus.csv" | sed 's/^/gpu: /' | tee -a "$SUMMARY"
ls -l /dev/nvidia* >"$LOGS/dev-nvidia.txt" 2>&1
note "python: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())')"

# ------------------------------------------------------------------ 1. SLURM and wheels
t=$(stamp)
rm -rf "$ROOT" && mkdir -p "$ROOT"
for deb in .debs/*.deb; do dpkg -x "$deb" "$ROOT" || note "dpkg -x $deb failed"; done
note "unpacked $(ls .debs/*.deb | wc -l) .debs into $ROOT in $(since "$t") s ($(du -sh "$ROOT" | cut -f1))"
t=$(stamp)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" .whl/*.whl || note "pip install of .whl failed"
export PYTHONPATH=$SITE:$REPO
note "wheels into $SITE in $(since "$t") s: $(python3 -c 'import netCDF4, cftime, submitit, cloudpickle; print("netCDF4", netCDF4.__version__, "submitit", submitit.__version__)' 2>&1)"
# Libraries SLURM and munge need that this system lacks (the testbed links exactly those).
missing_libs() {  # LD_LIBRARY_PATH to try
  local f
  for f in "$ROOT"/usr/sbin/* "$ROOT"/usr/bin/s* "$ROOT"/usr/bin/*munge \
    "$ROOT"/usr/lib/x86_64-linux-gnu/slurm-wlm/*.so; do
    LD_LIBRARY_PATH=$1 ldd "$f" 2>/dev/null | awk '/not found/ { print $1 }'
  done | sort | uniq -c | awk '{ printf "%s(%s) ", $2, $1 }'
}
note "libraries this system lacks (count of SLURM/munge files that need each): $(missing_libs "$ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm")"
else
  note "render only: no GPU, no SLURM; every job script is rendered and checked with bash -n"
fi

# ------------------------------------------------------------------ helpers
# rankinfo.sh: one line per task saying where it runs and which GPUs SLURM gave it, then exec.
cat >"$WORK/rankinfo.sh" <<'EOF'
#!/bin/bash
echo "[rankinfo] rank ${SLURM_PROCID:-?} local ${SLURM_LOCALID:-?} node ${SLURMD_NODENAME:-?}" \
  "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset} SLURM_STEP_GPUS=${SLURM_STEP_GPUS:-unset}" \
  "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-unset}" \
  "NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS:-unset}"
exec "$@"
EOF
chmod +x "$WORK/rankinfo.sh"
# train_workaround.py: used only when the plain training job fails. ufsemulator/training/train.py
# (as of 2026-11-26) all-reduces its normalisation sums as CPU tensors, torch_all_reduce("cpu"),
# which an NCCL process group cannot do ("No backend type associated with device type cpu");
# this runs the unchanged `python -m ufsemulator` with that one reduction on the rank's GPU.
cat >"$WORK/train_workaround.py" <<'EOF'
import runpy
import sys

import torch
import torch.distributed as dist

import ufsemulator.training.train as training
from ufsemulator.model import normalization


def on_rank_device(device="cpu"):
    if dist.is_initialized() and dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    return normalization.torch_all_reduce(device)


training.torch_all_reduce = on_rank_device
print("train_workaround: normalisation all_reduce on the rank's GPU under NCCL", flush=True)
sys.argv = ["python -m ufsemulator", *sys.argv[1:]]
runpy.run_module("ufsemulator", run_name="__main__", alter_sys=True)
EOF

TESTBED_OK=0
testbed_up() {  # name nodes gpus_per_node cpus_per_node cgroup
  if [ "$RENDER_ONLY" -eq 1 ]; then
    note "testbed $1 ($2 nodes x $3 GPUs): skipped (render only)"
    return 0
  fi
  export HPCDIST_TESTBED_DIR=/tmp/tb-$1 HPCDIST_TESTBED_PREFIX=$ROOT HPCDIST_TESTBED_ACCOUNTING=0
  export HPCDIST_TESTBED_NODES=$2 HPCDIST_TESTBED_GPUS=$3 HPCDIST_TESTBED_CPUS=$4
  export HPCDIST_TESTBED_MEMORY=64000 HPCDIST_TESTBED_PARTITION=gpu HPCDIST_TESTBED_CGROUP=$5
  local t rc
  t=$(stamp)
  scripts/slurm-testbed up >"$WORK/env-$1.sh" 2>"$LOGS/testbed-up-$1.log"
  rc=$?
  cat "$LOGS/testbed-up-$1.log"
  if [ "$rc" -ne 0 ]; then
    note "testbed $1 ($2 nodes x $3 GPUs, cgroup $5): up FAILED (rc $rc) after $(since "$t") s"
    return 1
  fi
  # shellcheck disable=SC1090
  source "$WORK/env-$1.sh"
  note "testbed $1 up in $(since "$t") s: $(sinfo -h -N -o '%N %t cpus=%c gres=%G' | tr '\n' ';')"
  note "    still missing with the testbed's LD_LIBRARY_PATH: $(missing_libs "$LD_LIBRARY_PATH")"
  TESTBED_OK=1
}

testbed_down() {  # name
  [ "$RENDER_ONLY" -eq 1 ] && return 0
  HPCDIST_TESTBED_DIR=/tmp/tb-$1 scripts/slurm-testbed down 2>&1 | tail -2
  mkdir -p "$LOGS/tb-$1"
  cp -r "/tmp/tb-$1/etc" "/tmp/tb-$1/log" "$LOGS/tb-$1/" 2>/dev/null
}

# wait_job ID LIMIT_S: poll scontrol (no accounting here, so no sacct) until the job is over;
# prints "STATE EXIT RUN_TIME". Finer than sbatch --wait, which polls every 10 s.
wait_job() {
  local id=$1 limit=$2 start=$SECONDS line state
  while :; do
    line=$(scontrol show job -o "$id" 2>/dev/null)
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        echo "$state $(sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p' <<<"$line")" \
          "$(sed -n 's/.* RunTime=\([0-9:-]*\) .*/\1/p' <<<"$line")"
        return
        ;;
    esac
    if [ $((SECONDS - start)) -gt "$limit" ]; then
      scancel "$id"
      echo "DRIVER_TIMEOUT 124 -"
      return
    fi
    sleep 0.5
  done
}

# submit LABEL SCRIPT [sbatch options...]: sbatch, wait for the end, GPU processes sampled
# meanwhile; returns the job's exit code.
submit() {
  local label=$1 script=$2 t sampler job out state rc runtime buses procs
  shift 2
  if [ "$RENDER_ONLY" -eq 1 ]; then
    if bash -n "$script"; then
      note "job $label: $script passes bash -n (not submitted: render only)"
    else
      note "job $label: $script FAILS bash -n"
      RENDER_FAILED=$((RENDER_FAILED + 1))
    fi
    return 1 # not run: a fallback script (the workarounds) is rendered as well
  fi
  if [ "$(since "$t0" | cut -d. -f1)" -gt "${GPU_SLURM_BUDGET_S:-480}" ]; then
    note "job $label skipped: past the driver's time budget of ${GPU_SLURM_BUDGET_S:-480} s"
    return 1
  fi
  nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader -lms 300 \
    >"$LOGS/gpu-apps-$label.csv" 2>/dev/null &
  sampler=$!
  t=$(stamp)
  job=$(sbatch --parsable --output="$LOGS/$label-%j.out" "$@" "$script" 2>"$LOGS/sbatch-$label.err")
  job=${job%%;*}
  if [ -z "$job" ]; then
    kill "$sampler" 2>/dev/null
    note "job $label: sbatch refused it: $(cat "$LOGS/sbatch-$label.err")"
    return 1
  fi
  read -r state rc runtime < <(wait_job "$job" 240)
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  out=$(ls "$LOGS/$label-$job.out" 2>/dev/null)
  echo "---- $label: job $job, $state, exit $rc, $(since "$t") s; output $out"
  cat "$LOGS/sbatch-$label.err" ${out:+"$out"}
  note "job $label (id $job): $state, exit $rc, run time $runtime, $(since "$t") s from sbatch to the end"
  if [ -n "$out" ]; then
    grep -E '^(PASS|FAIL)|Distributed training initialized|^Master:|\[rankinfo\]|device cuda|Training [a-z]+:|Init COMPLETE|Duplicate GPU|Error|error|train_workaround' "$out" \
      | sed 's/^/    /' | head -40 >>"$SUMMARY"
  fi
  # The GPUs the job's processes ran on, by PCI bus id (nvidia-smi sees every process).
  buses=$(cut -d, -f2 "$LOGS/gpu-apps-$label.csv" 2>/dev/null | sed 's/ //g' | grep -v '^$' | sort -u | tr '\n' ' ')
  procs=$(cut -d, -f1 "$LOGS/gpu-apps-$label.csv" 2>/dev/null | sort -u | grep -c .)
  note "    GPUs used (bus ids seen by nvidia-smi): ${buses:-none}; $procs processes"
  return "${rc:-1}"
}

render() {  # OUT_FILE hpcdist-render-flags...
  local out=$1
  shift
  if ! python3 -m hpcdist.cli.main render --profile gpu-cluster --partition gpu "$@" \
    --script "$out" --force 2>/dev/null; then
    note "render $* FAILED"
    RENDER_FAILED=$((RENDER_FAILED + 1))
  fi
}

# fallback_launch NODES GPUS_PER_NODE CMD...: what srun would start, without SLURM.
fallback_launch() {
  local nodes=$1 g=$2 n node lr rank pids=() nodelist="localhost" i
  shift 2
  n=$((nodes * g))
  [ "$nodes" -gt 1 ] && nodelist="localhost,127.0.0.1"
  for ((node = 0; node < nodes; node++)); do
    for ((lr = 0; lr < g; lr++)); do
      rank=$((node * g + lr))
      i=$(seq -s, $((node * g)) $((node * g + g - 1)))
      env SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_LOCALID=$lr \
        SLURM_NODEID=$node SLURM_NTASKS=$n SLURM_STEP_NUM_TASKS=$n SLURM_NPROCS=$n \
        SLURM_JOB_NUM_NODES=$nodes SLURM_JOB_NODELIST=$nodelist SLURM_STEP_NODELIST=$nodelist \
        SLURM_TASKS_PER_NODE="$g(x$nodes)" SLURM_STEP_TASKS_PER_NODE="$g(x$nodes)" \
        SLURM_CPUS_PER_TASK=4 SLURMD_NODENAME="$(echo "$nodelist" | cut -d, -f$((node + 1)))" \
        CUDA_VISIBLE_DEVICES=$i "$@" &
      pids+=($!)
    done
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return "$rc"
}

# ------------------------------------------------------------------ 2-3. 1 node x 4 GPUs
CHECK="$WORK/rankinfo.sh python3 -m hpcdist.distributed.commcheck --timeout 60"
NCCL_INFO=(--env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT)
if testbed_up 1x4 1 4 64 v1; then
  render "$WORK/nccl_check_1x4.sh" --mode nccl --nodes 1 --gpus-per-node 4 --cpus-per-task 4 \
    --time 3 --job-name nccl-check-1x4 "${NCCL_INFO[@]}" --command "$CHECK"
  submit nccl-check-1x4 "$WORK/nccl_check_1x4.sh"
  render "$WORK/test_1x4.sh" --mode test --nodes 1 --tasks-per-node 4 --cpus-per-task 4 \
    --time 3 --job-name test-mode-1x4 --command "$CHECK"
  submit test-mode-1x4 "$WORK/test_1x4.sh"
  # The committed script itself, unchanged; only the time limit and output path are overridden.
  if ! submit train-gpu-1x4 hpc/train_gpu.sh --time=4; then
    # Same resources and template, with the training's known NCCL problem worked around.
    render "$WORK/train_gpu_1x4_workaround.sh" --mode nccl --nodes 1 --gpus-per-node 4 \
      --cpus-per-task 16 --time 4 --job-name train-gpu-1x4-workaround \
      --command "$WORK/rankinfo.sh python3 $WORK/train_workaround.py train"
    submit train-gpu-1x4-workaround "$WORK/train_gpu_1x4_workaround.sh"
  fi
  # No GPU count anywhere (a profile without gpus_per_node, no flag): hpcdist renders a
  # whole-node job that counts the node's GPUs at run time, one task per GPU.
  cat >"$WORK/auto-gpu.yaml" <<'YAML'
partition: gpu
partitions: [gpu]
cores_per_node: 64
nccl_env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
YAML
  if ! python3 -m hpcdist.cli.main render --profile "$WORK/auto-gpu.yaml" --mode nccl \
    --nodes 1 --time 3 --job-name autodetect-gpus --command "$CHECK" \
    --script "$WORK/autodetect.sh" --force 2>/dev/null; then
    note "render of the auto-detect job FAILED"
    RENDER_FAILED=$((RENDER_FAILED + 1))
  fi
  submit autodetect-1x4 "$WORK/autodetect.sh"
  # What a submit host can learn without a GPU count: SLURM knows each partition's GRES.
  [ "$RENDER_ONLY" -eq 1 ] || note "sinfo -p gpu -o %G (GRES per node, from SLURM): $(sinfo -h -p gpu -o '%G' | sort -u | tr '\n' ' ')"
  testbed_down 1x4
fi

# ------------------------------------------------------------------ 4. 2 nodes x 2 GPUs
if testbed_up 2x2 2 2 32 v1; then
  render "$WORK/nccl_check_2x2.sh" --mode nccl --nodes 2 --gpus-per-node 2 --cpus-per-task 4 \
    --time 3 --job-name nccl-check-2x2 "${NCCL_INFO[@]}" --command "$CHECK"
  submit nccl-check-2x2 "$WORK/nccl_check_2x2.sh"
  render "$WORK/train_gpu_2x2.sh" --mode nccl --nodes 2 --gpus-per-node 2 --cpus-per-task 16 \
    --time 4 --job-name train-gpu-2x2 \
    --command "$WORK/rankinfo.sh python3 -m ufsemulator train"
  if ! submit train-gpu-2x2 "$WORK/train_gpu_2x2.sh"; then
    render "$WORK/train_gpu_2x2_workaround.sh" --mode nccl --nodes 2 --gpus-per-node 2 \
      --cpus-per-task 16 --time 4 --job-name train-gpu-2x2-workaround \
      --command "$WORK/rankinfo.sh python3 $WORK/train_workaround.py train"
    submit train-gpu-2x2-workaround "$WORK/train_gpu_2x2_workaround.sh"
  fi
  testbed_down 2x2
fi

if [ "$RENDER_ONLY" -eq 1 ]; then
  note "render only: $RENDER_FAILED failed renders or scripts"
  exit $((RENDER_FAILED > 0))
fi

# ------------------------------------------------------------------ 5. cgroup/v2, for the record
if testbed_up v2 1 1 8 v2; then
  t=$(stamp)
  timeout 60 srun -N1 -n1 --gpus=1 -t1 bash -c 'echo "srun under cgroup/v2: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES cgroup $(cat /proc/self/cgroup)"' \
    >"$LOGS/cgroup-v2-srun.txt" 2>&1
  note "cgroup/v2 srun: exit $? in $(since "$t") s: $(head -3 "$LOGS/cgroup-v2-srun.txt" | tr '\n' ' ')"
  testbed_down v2
else
  tail -5 "$LOGS/testbed-up-v2.log" | sed 's/^/    /' >>"$SUMMARY"
  testbed_down v2
fi

# ------------------------------------------------------------------ fallback without SLURM
if [ "$TESTBED_OK" -eq 0 ]; then
  note "no testbed came up; launching with the SLURM variables srun would set"
  for layout in "1 4" "2 2"; do
    # shellcheck disable=SC2086
    fallback_launch $layout python3 -m hpcdist.distributed.commcheck --timeout 60 \
      >"$LOGS/fallback-check-${layout/ /x}.out" 2>&1
    note "fallback commcheck ${layout/ /x}: exit $? $(grep -h '^PASS\|^FAIL' "$LOGS/fallback-check-${layout/ /x}.out" | head -4 | tr '\n' ' ')"
  done
fi

# ------------------------------------------------------------------ collect
for results in runs/*/training_results.json; do
  [ -f "$results" ] || continue
  python3 - "$results" >>"$SUMMARY" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"results {sys.argv[1]}: status {r['status']}, world {r['world_size']}, backend "
      f"{r['backend']}, device {r['device']}, epochs {r['epochs_run']}, best val loss "
      f"{r['best_val_loss']:.5g}, R^2 {r['best_val_r2']}, {r['samples_per_second']:.0f} "
      f"samples/s, wall {r['wall_time_s']:.1f} s, gradient all-reduce "
      f"{r.get('grad_allreduce', '?')}, CUDA graph {r.get('cuda_graph', '?')}")
EOF
  mkdir -p "$LOGS/$(dirname "$results")" && cp "$results" "$LOGS/$results"
done
cp -r "$WORK"/*.sh "$LOGS/" 2>/dev/null
note "total $(since "$t0") s"
tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs
echo "== summary"
cat "$SUMMARY"
