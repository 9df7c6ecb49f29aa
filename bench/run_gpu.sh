#!/usr/bin/env bash
# The GPU benchmarks in one command, on one machine with 4 GPUs (no netCDF4, no
# submitit needed). From the repository root:
#
#     PYTHONPATH=$PWD bash bench/run_gpu.sh            # results in $OUT (else /tmp/bench-gpu)
#
# Stages, each with its own time limit inside a total budget (BENCH_BUDGET_S, 420 s; about
# 6 minutes expected on 4 H100s):
#   0. check: ours (CUDA graphs by default) and ours eager on all GPUs, briefly; if that
#      fails, the later stages run ours with cuda_graph=false (and say so)
#   collectives: one all-reduce of the gradients alone, NCCL (eager, in a CUDA graph)
#      beside symmetric memory, gloo beside shared memory
#   1. nccl, 1/2/4 ranks (one GPU each): DataLoader reference, resident reference, ours,
#      ours without CUDA graphs (eager) and ours with NCCL's all-reduce for the gradients
#   2. gloo on the CPU, 1/2/4 ranks x 4 threads: the same three, plus ours with gloo's
#      all-reduce for the gradients (ours: shared memory)
#   3. time to a target validation loss, 1 vs 4 GPUs (1440x1080 synthetic grid), ours,
#      ours eager and ours with NCCL's all-reduce
#   fallback: on all GPUs, ours with its CUDA-graph capture made to fail after backward
#      (the loop must go on eagerly), beside ours and eager
#   4. ours with torch.compile beside ours, 1 and 4 GPUs (skipped when the budget is short)
# Writes to $OUT: env.txt, run_gpu.log (this output), ranks.log (every rank's output),
# check.json, collectives_{gpu,cpu}.json, nccl.json, gloo.json, ttt.json, fallback.json,
# compile.json. BENCH_STAGES picks stages (default "check collectives nccl gloo ttt
# fallback compile"). BENCH_ARGS is appended to every stage's
# arguments (a trial run on a CPU machine: BENCH_ARGS="--steps 10 --repeats 1").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR=${OUT:-/tmp/bench-gpu}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# NVLink multicast off in every process (the launcher sets them for each rank as well).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUDGET=${BENCH_BUDGET_S:-420}
STAGES=" ${BENCH_STAGES:-check collectives nccl gloo ttt fallback compile} "
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
START=$SECONDS
WORK=$(mktemp -d /tmp/bench-work.XXXXXX)

left() { echo $((BUDGET - (SECONDS - START))); }

wanted() { [[ $STAGES == *" $1 "* ]]; }

stage() {  # stage NAME MAX_SECONDS ARGS...: run bench_training with a time limit
    local name=$1 max=$2
    shift 2
    local limit
    limit=$(left)
    ((limit > max)) && limit=$max
    if ((limit < 30)); then
        echo "== $name: skipped, $(left) s of the budget left"
        return
    fi
    echo "== $name (limit ${limit} s, $(left) s of the budget left)"
    timeout --signal=TERM --kill-after=10 "$limit" python3 -m bench.bench_training \
        --work-dir "$WORK" --log "$OUT_DIR/ranks.log" --timeout $((limit - 5)) "$@" "${EXTRA[@]}"
    local code=$?
    echo "== $name: exit $code, $((SECONDS - START)) s so far"
    return $code
}

main() {
    {
        date -u
        nvidia-smi -L
        nvidia-smi topo -m
        python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
    "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
        lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))'
        env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort
    } >"$OUT_DIR/env.txt" 2>&1
    cat "$OUT_DIR/env.txt"

    GPUS=$(python3 -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
    case $GPUS in
        0) RANKS=1 && echo "no GPU visible: GPU stages skipped" ;;
        1) RANKS=1 ;;
        2 | 3) RANKS=1,2 ;;
        *) RANKS=1,2,4 ;;
    esac
    BIG=${RANKS##*,}
    TTT_RANKS=1
    ((BIG > 1)) && TTT_RANKS=1,$BIG

    EAGER=(--variant eager:cuda_graph=false)
    if ((GPUS > 0)) && wanted check; then
        if ! stage "check: CUDA graphs on $BIG GPU(s)" 60 --device cuda --ranks "$BIG" \
            --loops ours "${EAGER[@]}" --steps 60 --epochs 1 --repeats 1 \
            --json "$OUT_DIR/check.json"; then
            echo "== check failed: the later stages run ours with cuda_graph=false"
            EXTRA+=(--ours cuda_graph=false)
        fi
    fi
    if wanted collectives; then  # the gradients' all-reduce alone (bench/collectives.py)
        echo "== collectives"
        if ((GPUS > 0)); then
            timeout 90 python3 -m bench.collectives --device cuda --ranks "$RANKS" \
                --json "$OUT_DIR/collectives_gpu.json"
        fi
        timeout 60 python3 -m bench.collectives --device cpu --ranks 1,2,4 \
            --json "$OUT_DIR/collectives_cpu.json"
    fi
    if ((GPUS > 0)) && wanted nccl; then
        stage "nccl throughput" 170 --device cuda --ranks "$RANKS" --steps 300 --epochs 2 \
            --repeats 3 --ours grad_allreduce=local "${EAGER[@]}" \
            --variant nccl:grad_allreduce=backend \
            --json "$OUT_DIR/nccl.json"
    fi
    if wanted gloo; then
        stage "gloo throughput" 170 --device cpu --ranks 1,2,4 --threads-per-rank 4 --steps 200 \
            --epochs 2 --repeats 3 --variant gloo:grad_allreduce=backend \
            --json "$OUT_DIR/gloo.json"
    fi
    if ((GPUS > 0)) && wanted ttt; then
        stage "time to target" 120 --device cuda --no-throughput --time-to-target \
            --ttt-ranks "$TTT_RANKS" --ours grad_allreduce=local "${EAGER[@]}" \
            --variant nccl:grad_allreduce=backend \
            --json "$OUT_DIR/ttt.json"
    fi
    if ((GPUS > 0)) && wanted fallback; then
        # A capture made to fail (after backward) on purpose: the loop must go on eagerly.
        stage "fallback: failed capture on $BIG GPU(s)" 60 --device cuda --ranks "$BIG" \
            --loops ours "${EAGER[@]}" --variant capturefail:fail_capture=true --steps 60 \
            --epochs 1 --repeats 1 --json "$OUT_DIR/fallback.json"
    fi
    if ((GPUS > 0)) && wanted compile; then
        stage "torch.compile" 200 --device cuda --ranks "$TTT_RANKS" --loops resident,ours \
            --variant compiled:compile=true --steps 300 --epochs 2 --repeats 2 \
            --json "$OUT_DIR/compile.json"
    fi
    echo "== done in $((SECONDS - START)) s; files in $OUT_DIR"
}

main 2>&1 | tee -a "$OUT_DIR/run_gpu.log"
rm -rf "$WORK"
