#!/usr/bin/env bash
# hpcdist's GPU jobs through a REAL SLURM (22.05, 24.11 or 26.05) on one machine with 4 GPUs
# and no SLURM installed (docs/gpu-slurm.md). Run from the repository root:
#
#     bench/gpu_slurm_job.sh [OUT_DIR]                 # the GPU run; default: $OUT, else /tmp/gpu-slurm-out
#     bench/gpu_slurm_job.sh --cpu [OUT_DIR]           # the same testbeds and jobs without GPUs (CI)
#     bench/gpu_slurm_job.sh --render-only [OUT_DIR]   # render and bash -n every job script, no SLURM
#
# --cpu (what CI runs, tests/test_bench_scripts.py): the testbeds start from the same unpacked
# .debs, declare no GPUs, and run every job that needs none: `--mode test`, a job that counts
# its GPUs at run time (it must stop at once, saying that it found none), the preemption of a
# training that must resume to the uninterrupted run's weights, and the 2-node training (gloo
# on the CPU instead of NCCL). The GPU-only jobs are listed as skipped.
# GPU_SLURM_VERSION picks the SLURM release (22.05, the default, from .debs/; 24.11 or 26.05 from
# the folder scripts/slurm-release prepared: .slurm/<version>/root beside the working tree, else
# its cache, made on first use where a package registry answers).
# GPU_SLURM_WORK moves the work folder (default /tmp/gpujob); GPU_SLURM_BUDGET_S (480) stops
# submitting once that many seconds have passed.
#
# Needs, beside the working tree (docs/gpu-slurm.md says how they are made):
#   .debs/  Debian 12's slurmctld, slurmd, slurm-client, slurm-wlm-basic-plugins, munge and the
#           libraries they link (apt-get download), unpacked with dpkg -x; with --cpu and no
#           .debs/, they are downloaded into the work folder with apt-get download;
#   .whl/   wheels of netCDF4, cftime, submitit, cloudpickle, click and pyyaml (GPU run only;
#           a CPU run uses the installed packages).
#
# What it does, each step logged with its wall time and a verdict:
#   1. unpacks the .debs into $WORK/slurmroot (and .whl/ into /tmp/site on a GPU host);
#   2. a testbed of 1 node x 4 GPUs (partition gpu, no accounting, cgroup/v1 plugin,
#      preemption by partition `high` in REQUEUE mode): the NCCL communication check,
#      `--mode test` as rendered, hpc/train_gpu.sh itself with plain sbatch, a job given no
#      GPU count that counts the node's GPUs at run time, and a training preempted by a job
#      of partition `high` that resumes and ends with the uninterrupted run's weights;
#   3. a testbed of 2 nodes x 2 GPUs (node2 owns GPUs 2-3): the NCCL check and the rendered
#      2-node training;
#   4. (GPU run) cgroup/v2 (IgnoreSystemd=yes) on a 1-node testbed, for the record.
# Writes OUT_DIR/summary.txt (a PASS/FAIL/SKIP line per job, rank lines, the GPUs each job's
# processes ran on) and OUT_DIR/logs.tar.gz (job outputs, daemon logs and configs, training
# results). Exit status: 0 when no job failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD
MODE=gpu
case "${1:-}" in
  --render-only) MODE=render; shift ;;
  --cpu) MODE=cpu; shift ;;
esac
OUT_DIR=${1:-${OUT:-/tmp/gpu-slurm-out}}
WORK=${GPU_SLURM_WORK:-/tmp/gpujob}
LOGS=$WORK/logs
ROOT=$WORK/slurmroot
VERSION=${GPU_SLURM_VERSION:-22.05}
case "$VERSION" in
  22.05 | 24.11 | 26.05) ;;
  *) echo "GPU_SLURM_VERSION=$VERSION; expected 22.05, 24.11 or 26.05" >&2; exit 2 ;;
esac
SITE=/tmp/site
SUMMARY=$OUT_DIR/summary.txt
PASSED=0 FAILED=0 SKIPPED=0 JOB="" OUTPUT=""
JOB_LIMIT_S=240  # a job still running after this long is cancelled and fails
[ "$MODE" = cpu ] && JOB_LIMIT_S=150
# The GPU jobs are rendered (and, on a GPU host, run) unless this is the run without GPUs.
GPU_JOBS=1
[ "$MODE" = cpu ] && GPU_JOBS=0
rm -rf "$LOGS" "$WORK/runs" && mkdir -p "$OUT_DIR" "$LOGS"
OUT_DIR=$(cd "$OUT_DIR" && pwd) WORK=$(cd "$WORK" && pwd)
# The testbeds' folders: a short path, since slurmstepd's socket path must fit in 108 bytes.
TESTBEDS=/tmp/gsj-${GPU_SLURM_PORT_OFFSET:-0}
[ "$VERSION" = 22.05 ] || TESTBEDS=$TESTBEDS-${VERSION/./}
: >"$SUMMARY"

# NVLink multicast stays off in every process: the driver, the daemons, every job and task
# (sbatch and srun pass this environment on; examples/profiles/gpu-cluster.yaml also exports them).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export HPCDIST_DATA_DIR=$WORK/data

note() { echo "== $*"; echo "$*" >>"$SUMMARY"; }
verdict() {  # PASS|FAIL|SKIP what...
  local word=$1
  shift
  case "$word" in
    PASS) PASSED=$((PASSED + 1)) ;;
    FAIL) FAILED=$((FAILED + 1)) ;;
    SKIP) SKIPPED=$((SKIPPED + 1)) ;;
  esac
  note "$word $*"
}
gpu_only() {  # name: true (and a SKIP line) where this run has no GPUs
  [ "$GPU_JOBS" -eq 1 ] && return 1
  verdict SKIP "$1: needs GPUs ($MODE run)"
  return 0
}
# Killed at the caller's time limit: still pack what the logs hold so far.
trap 'note "interrupted"; tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs; exit 124' TERM INT
stamp() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(stamp)" 'BEGIN { printf "%.1f", b - a }'; }

# ------------------------------------------------------------------ 0. the machine
t0=$(stamp)
note "machine: $(hostname), $(nproc) CPUs, kernel $(uname -r), $(date -u +%FT%TZ), $MODE run"
if [ "$MODE" = gpu ]; then
  note "os: $(. /etc/os-release && echo "$PRETTY_NAME"); cgroup fs: $(stat -fc %T /sys/fs/cgroup)"
  nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader \
    | tee "$LOGS/gpus.csv" | sed 's/^/gpu: /' | tee -a "$SUMMARY"
fi

# ------------------------------------------------------------------ 1. SLURM and wheels
if [ "$MODE" != render ] && [ "$VERSION" != 22.05 ]; then
  t=$(stamp)
  # A prepared folder travels with the working tree as .slurm/<version>/root (see above).
  [ -f "$REPO/.slurm/$VERSION/root/.hpcdist-slurm.json" ] && export HPCDIST_TESTBED_CACHE=$REPO/.slurm
  if ROOT=$(scripts/slurm-release prepare "$VERSION" 2>"$LOGS/slurm-release.log"); then
    note "SLURM $VERSION from $ROOT ($(scripts/slurm-release check "$ROOT")) in $(since "$t") s"
  else
    note "scripts/slurm-release prepare $VERSION failed: $(tail -2 "$LOGS/slurm-release.log" | tr '\n' ' ')"
  fi
fi
if [ "$MODE" != render ] && [ "$VERSION" = 22.05 ]; then
  t=$(stamp)
  DEBS=$REPO/.debs
  if ! ls "$DEBS"/*.deb >/dev/null 2>&1 && [ "$MODE" = cpu ]; then
    DEBS=$WORK/debs
    mkdir -p "$DEBS"
    (cd "$DEBS" && apt-get download slurmctld slurmd slurm-client slurm-wlm-basic-plugins \
      munge libmunge2 >"$LOGS/apt-download.log" 2>&1) || note "apt-get download failed: $(tail -2 "$LOGS/apt-download.log")"
  fi
  rm -rf "$ROOT" && mkdir -p "$ROOT"
  for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$ROOT" || note "dpkg -x $deb failed"; done
  note "unpacked $(ls "$DEBS"/*.deb 2>/dev/null | wc -l) .debs into $ROOT in $(since "$t") s"
fi
if [ "$MODE" != render ]; then
  if [ "$MODE" = gpu ]; then
    t=$(stamp)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl || note "pip install of .whl failed"
    export PYTHONPATH=$SITE:$REPO
    note "wheels into $SITE in $(since "$t") s; $(python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1)"
  else
    export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
  fi
fi

# ------------------------------------------------------------------ helpers
# rankinfo.sh: one line per task saying where it runs and which GPUs SLURM gave it, then exec.
cat >"$WORK/rankinfo.sh" <<'EOF'
#!/bin/bash
echo "[rankinfo] rank ${SLURM_PROCID:-?} local ${SLURM_LOCALID:-?} node ${SLURMD_NODENAME:-?}" \
  "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-unset}"
exec "$@"
EOF
chmod +x "$WORK/rankinfo.sh"

testbed_up() {  # name nodes gpus_per_node cpus_per_node cgroup [preempt]
  if [ "$MODE" = render ]; then
    note "testbed $1: not started (render only)"
    return 0
  fi
  export HPCDIST_TESTBED_DIR=$TESTBEDS/$1 HPCDIST_TESTBED_PREFIX=$ROOT HPCDIST_TESTBED_ACCOUNTING=0
  export HPCDIST_TESTBED_SLURM=$VERSION
  export HPCDIST_TESTBED_NODES=$2 HPCDIST_TESTBED_GPUS=$3 HPCDIST_TESTBED_CPUS=$4
  export HPCDIST_TESTBED_MEMORY=64000 HPCDIST_TESTBED_PARTITION=gpu HPCDIST_TESTBED_CGROUP=$5
  export HPCDIST_TESTBED_PREEMPT=${6:-off} HPCDIST_TESTBED_GRACE_TIME=30
  export HPCDIST_TESTBED_PORT_OFFSET=${GPU_SLURM_PORT_OFFSET:-0}
  local t rc
  t=$(stamp)
  scripts/slurm-testbed up >"$WORK/env-$1.sh" 2>"$LOGS/testbed-up-$1.log"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    verdict FAIL "testbed $1 ($2 nodes x $3 GPUs, cgroup $5): up failed (rc $rc) after $(since "$t") s: $(tail -3 "$LOGS/testbed-up-$1.log" | tr '\n' ' ')"
    return 1
  fi
  # shellcheck disable=SC1090
  source "$WORK/env-$1.sh"
  note "testbed $1 up in $(since "$t") s: $(sinfo -h -N -o '%N %t cpus=%c gres=%G' | tr '\n' ';')"
}

testbed_down() {  # name
  [ "$MODE" = render ] && return 0
  HPCDIST_TESTBED_DIR=$TESTBEDS/$1 scripts/slurm-testbed down 2>&1 | tail -1
  mkdir -p "$LOGS/tb-$1"
  cp -r "$TESTBEDS/$1/etc" "$TESTBEDS/$1/log" "$LOGS/tb-$1/" 2>/dev/null
  rm -f "$LOGS/tb-$1/log/core"
}

# wait_job ID LIMIT_S: poll scontrol (no accounting here, so no sacct) until the job is over,
# starting a requeued job at once (SLURM holds it for ~120 s); prints
# "STATE EXIT RUN_TIME RESTARTS".
wait_job() {
  local id=$1 limit=$2 start=$SECONDS line state
  while :; do
    line=$(scontrol show job -o "$id" 2>/dev/null)
    state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$line")
    case "$state" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
        echo "$state $(sed -n 's/.* ExitCode=\([0-9]*\):.*/\1/p' <<<"$line")" \
          "$(sed -n 's/.* RunTime=\([0-9:-]*\) .*/\1/p' <<<"$line")" \
          "$(sed -n 's/.* Restarts=\([0-9]*\) .*/\1/p' <<<"$line")"
        return
        ;;
      PENDING)
        if grep -q 'Reason=BeginTime' <<<"$line"; then
          sleep 2  # not in the second of the requeue: slurmd refuses that credential
          scontrol update "JobId=$id" StartTime=now 2>/dev/null
        fi
        ;;
    esac
    if [ $((SECONDS - start)) -gt "$limit" ]; then
      scancel "$id"
      echo "DRIVER_TIMEOUT 124 - -"
      return
    fi
    sleep 0.5
  done
}

over_budget() {
  [ "$(since "$t0" | cut -d. -f1)" -gt "${GPU_SLURM_BUDGET_S:-480}" ]
}

# submit LABEL SCRIPT [sbatch options...]: sbatch from the work folder, no waiting; sets JOB
# (empty if sbatch refused it) and SUBMITTED (the time).
submit() {
  local label=$1 script=$2
  shift 2
  SUBMITTED=$(stamp)
  JOB=$(cd "$WORK" && sbatch --parsable --output="$LOGS/$label-%j.out" "$@" "$script" 2>"$LOGS/sbatch-$label.err")
  JOB=${JOB%%;*}
  [ -n "$JOB" ] || note "$label: sbatch refused it: $(cat "$LOGS/sbatch-$label.err")"
}

# run_job LABEL EXPECT SCRIPT [sbatch options...]: submit, wait for the end (GPU processes
# sampled meanwhile), a verdict from EXPECT (a final state, then an egrep pattern the output
# must hold); sets JOB and OUTPUT.
run_job() {
  local label=$1 expect=$2 script=$3 sampler state rc runtime restarts buses want pattern
  shift 3
  OUTPUT=""
  if [ "$MODE" = render ]; then
    if bash -n "$script"; then
      note "job $label: $script passes bash -n (not submitted: render only)"
    else
      verdict FAIL "$label: $script fails bash -n"
    fi
    return
  fi
  if over_budget; then
    verdict SKIP "$label: past the driver's time budget of ${GPU_SLURM_BUDGET_S:-480} s"
    return
  fi
  if [ "$MODE" = gpu ]; then
    nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv,noheader -lms 300 \
      >"$LOGS/gpu-apps-$label.csv" 2>/dev/null &
    sampler=$!
  fi
  submit "$label" "$script" "$@"
  if [ -z "$JOB" ]; then
    [ "$MODE" = gpu ] && kill "$sampler" 2>/dev/null
    verdict FAIL "$label: not submitted"
    return
  fi
  read -r state rc runtime restarts < <(wait_job "$JOB" "$JOB_LIMIT_S")
  if [ "$MODE" = gpu ]; then
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
  fi
  OUTPUT=$LOGS/$label-$JOB.out
  echo "---- $label: job $JOB, $state, exit $rc"
  cat "$LOGS/sbatch-$label.err" "$OUTPUT" 2>/dev/null | tail -40
  want=${expect%% *} pattern=${expect#* }
  if [ "$state" = "$want" ] && grep -Eq -- "$pattern" "$OUTPUT" 2>/dev/null; then
    verdict PASS "$label (job $JOB): $state, exit $rc, run time $runtime, $(since "$SUBMITTED") s from sbatch to the end"
  else
    verdict FAIL "$label (job $JOB): $state, exit $rc (expected $want and a line matching '$pattern')"
  fi
  grep -E '^(PASS|FAIL)|\[rankinfo\]|device cuda|Gradient all-reduce|hpcdist: [0-9]+ GPUs|no GPU on node|Error|error' "$OUTPUT" 2>/dev/null \
    | sed 's/^/    /' | head -12 >>"$SUMMARY"
  if [ "$MODE" = gpu ]; then
    # The GPUs the job's processes ran on, by PCI bus id (nvidia-smi sees every process).
    buses=$(cut -d, -f2 "$LOGS/gpu-apps-$label.csv" 2>/dev/null | sed 's/ //g' | grep -v '^$' | sort -u | tr '\n' ' ')
    note "    GPUs used (bus ids seen by nvidia-smi): ${buses:-none}"
  fi
}

render() {  # OUT_FILE hpcdist-render-flags...
  local out=$1
  shift
  if ! python3 -m hpcdist.cli.main render --profile "$REPO/examples/profiles/gpu-cluster.yaml" --partition gpu "$@" \
    --script "$out" --force 2>"$LOGS/render.err"; then
    verdict FAIL "render $*: $(cat "$LOGS/render.err")"
  fi
}

# The result of a finished training: "epochs E, best val loss L, world W, backend B".
results() {  # run folder
  python3 - "$1" <<'EOF' 2>&1
import json, sys
r = json.load(open(f"{sys.argv[1]}/training_results.json"))
print(f"epochs {r['epochs_run']}, best val loss {r['best_val_loss']:.5g}, world {r['world_size']}, "
      f"backend {r['backend']}, device {r['device']}, gradient all-reduce {r.get('grad_allreduce', '?')}")
EOF
}

# Largest difference between two runs' final weights (0 means bit for bit the same).
weights_differ() {  # run folder A, run folder B
  python3 - "$1" "$2" <<'EOF' 2>&1
import sys
from pathlib import Path
from ufsemulator.checkpoints.checkpoint import load_checkpoint
a, b = (dict(load_checkpoint(Path(p) / "checkpoint.pt")["model"]) for p in sys.argv[1:])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
print(max(float((a[k].double() - b[k].double()).abs().max()) for k in a))
EOF
}

CHECK="$WORK/rankinfo.sh python3 -m hpcdist.distributed.commcheck --timeout 60"
NCCL_INFO=(--env NCCL_DEBUG=INFO --env NCCL_DEBUG_SUBSYS=INIT)
if [ "$GPU_JOBS" -eq 1 ]; then
  # Per rank, the default data: a few ms an epoch on a GPU; long enough to be preempted.
  PREEMPT_EPOCHS=${GPU_SLURM_PREEMPT_EPOCHS:-10000} CHECKPOINT_EVERY=500
  PREEMPT_LAYOUT=(--mode nccl --nodes 1 --gpus-per-node 4 --cpus-per-task 8)
else
  PREEMPT_EPOCHS=${GPU_SLURM_PREEMPT_EPOCHS:-600} CHECKPOINT_EVERY=50
  PREEMPT_LAYOUT=(--mode gloo --nodes 1 --tasks-per-node 2 --cpus-per-task 1)
fi
cat >"$WORK/preempt.yaml" <<YAML
training: {epochs: $PREEMPT_EPOCHS, early_stopping_patience: 0, checkpoint_every: $CHECKPOINT_EVERY}
preemption: {check_every_steps: 5}
YAML

# ------------------------------------------------------------------ 2. 1 node x 4 GPUs
GPUS=4
[ "$MODE" = gpu ] || GPUS=0
if testbed_up 1x4 1 "$GPUS" 64 v1 requeue; then
  if ! gpu_only nccl-check-1x4; then
    render "$WORK/nccl_check_1x4.sh" --mode nccl --nodes 1 --gpus-per-node 4 --cpus-per-task 4 \
      --time 3 --job-name nccl-check-1x4 "${NCCL_INFO[@]}" --command "$CHECK"
    run_job nccl-check-1x4 "COMPLETED PASS: world size 4, nccl" "$WORK/nccl_check_1x4.sh"
  fi
  render "$WORK/test_1x4.sh" --mode test --nodes 1 --tasks-per-node 4 --cpus-per-task 4 \
    --time 3 --job-name test-mode-1x4 --command "$CHECK"
  run_job test-mode-1x4 "COMPLETED PASS: world size 4, gloo" "$WORK/test_1x4.sh"
  # The committed script itself, unchanged; only the time limit is overridden.
  gpu_only train-gpu-1x4 \
    || run_job train-gpu-1x4 "COMPLETED Training completed: " "$REPO/hpc/train_gpu.sh" --time=4
  # No GPU count anywhere (a profile without gpus_per_node, no flag): hpcdist renders a
  # whole-node job that counts the node's GPUs at run time, one task per GPU; on a node
  # without GPUs it stops at once and says so.
  cat >"$WORK/auto-gpu.yaml" <<'YAML'
partition: gpu
partitions: [gpu]
cores_per_node: 64
nccl_env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
YAML
  if python3 -m hpcdist.cli.main render --profile "$WORK/auto-gpu.yaml" --mode nccl \
    --nodes 1 --time 3 --job-name autodetect-gpus --command "$CHECK" \
    --script "$WORK/autodetect.sh" --force 2>"$LOGS/render.err"; then
    if [ "$GPU_JOBS" -eq 1 ]; then
      run_job autodetect-1x4 "COMPLETED hpcdist: 4 GPUs on node1 \(SLURM_GPUS_ON_NODE=4\)" "$WORK/autodetect.sh"
    else
      run_job autodetect-no-gpu "FAILED hpcdist: no GPU on node node1" "$WORK/autodetect.sh"
    fi
  else
    verdict FAIL "render of the auto-detect job: $(cat "$LOGS/render.err")"
  fi
  [ "$MODE" = render ] || note "sinfo -p gpu -o %G (GRES per node, from SLURM): $(sinfo -h -p gpu -o '%G' | sort -u | tr '\n' ' ')"

  # A preemption (PreemptMode=REQUEUE): the same training uninterrupted, then preempted by a
  # job of partition `high` once it is training; it must checkpoint, be requeued, resume and
  # end with the uninterrupted run's weights.
  render "$WORK/preempt.sh" "${PREEMPT_LAYOUT[@]}" --time 6 --job-name preempt \
    --command "python3 -m ufsemulator train --config $WORK/preempt.yaml"
  run_job preempt-reference "COMPLETED Epoch $PREEMPT_EPOCHS/" "$WORK/preempt.sh"
  reference=$JOB
  if [ "$MODE" != render ] && ! over_budget; then
    submit preempted "$WORK/preempt.sh"
    preempted=$JOB
    for _ in $(seq 240); do
      grep -Eq "Epoch ([3-9]|[0-9]{2,})/" "$LOGS/preempted-$preempted.out" 2>/dev/null && break
      sleep 0.5
    done
    printf '#!/bin/bash\nsleep 1\n' >"$WORK/high.sh"
    submit high "$WORK/high.sh" -p high -N 1 --exclusive
    high=$JOB
    read -r state rc runtime restarts < <(wait_job "$preempted" 300)
    read -r hstate _ < <(wait_job "$high" 60)
    log="$LOGS/preempted-$preempted.out"
    resumed=$(grep -o 'Resuming from [^ ]* (epoch [0-9]*, restart 1)' "$log" | head -1)
    diff=$(weights_differ "$WORK/runs/$reference" "$WORK/runs/$preempted")
    note "    reference: $(results "$WORK/runs/$reference")"
    note "    preempted: $(results "$WORK/runs/$preempted"); $resumed; largest weight difference $diff"
    if [ "$state" = COMPLETED ] && [ "$hstate" = COMPLETED ] && [ "${restarts:-0}" -ge 1 ] \
      && [ -n "$resumed" ] && [ "$diff" = "0.0" ]; then
      verdict PASS "preempted training (job $preempted, by job $high): requeued $restarts time(s), resumed, same weights as job $reference bit for bit, $(since "$SUBMITTED") s"
    else
      verdict FAIL "preempted training (job $preempted): $state, restarts ${restarts:-?}, high job $hstate, resumed '${resumed}', weight difference $diff"
    fi
  fi
  testbed_down 1x4
fi

# ------------------------------------------------------------------ 3. 2 nodes x 2 GPUs
GPUS=2
[ "$MODE" = gpu ] || GPUS=0
if testbed_up 2x2 2 "$GPUS" 32 v1; then
  if ! gpu_only nccl-check-2x2; then
    render "$WORK/nccl_check_2x2.sh" --mode nccl --nodes 2 --gpus-per-node 2 --cpus-per-task 4 \
      --time 3 --job-name nccl-check-2x2 "${NCCL_INFO[@]}" --command "$CHECK"
    run_job nccl-check-2x2 "COMPLETED PASS: world size 4, nccl" "$WORK/nccl_check_2x2.sh"
  fi
  if [ "$GPU_JOBS" -eq 1 ]; then
    render "$WORK/train_2x2.sh" --mode nccl --nodes 2 --gpus-per-node 2 --cpus-per-task 16 \
      --time 4 --job-name train-gpu-2x2 --command "$WORK/rankinfo.sh python3 -m ufsemulator train"
  else
    render "$WORK/train_2x2.sh" --mode gloo --nodes 2 --tasks-per-node 1 --cpus-per-task 1 \
      --time 4 --job-name train-cpu-2x1 \
      --command "$WORK/rankinfo.sh python3 -m ufsemulator train --set training.epochs=5"
  fi
  run_job train-2-nodes "COMPLETED Training completed: " "$WORK/train_2x2.sh"
  [ -n "$OUTPUT" ] && note "    $(results "$WORK/runs/$JOB")"
  testbed_down 2x2
fi

# ------------------------------------------------------------------ 4. cgroup/v2, for the record
if [ "$MODE" = gpu ] && ! over_budget; then
  if testbed_up v2 1 1 8 v2; then
    t=$(stamp)
    timeout 60 srun -N1 -n1 --gpus=1 -t1 bash -c 'echo "srun under cgroup/v2: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES cgroup $(cat /proc/self/cgroup)"' \
      >"$LOGS/cgroup-v2-srun.txt" 2>&1
    note "cgroup/v2 srun (for the record): exit $? in $(since "$t") s: $(head -3 "$LOGS/cgroup-v2-srun.txt" | tr '\n' ' ')"
  fi
  testbed_down v2
fi

# ------------------------------------------------------------------ collect
cp -r "$WORK"/*.sh "$WORK"/*.yaml "$LOGS/" 2>/dev/null
if [ "$MODE" = render ]; then
  note "render only: $FAILED failed renders or scripts"
else
  note "jobs: $PASSED passed, $FAILED failed, $SKIPPED skipped; total $(since "$t0") s"
fi
tar -czf "$OUT_DIR/logs.tar.gz" -C "$WORK" logs
echo "== summary"
cat "$SUMMARY"
exit $((FAILED > 0))
