#!/bin/bash
# scripts/gpu_check.sh — the one command for a machine with a GPU (about 7
# minutes on one H100/H200, under GPU_CHECK_BUDGET seconds in all), most
# telling first: build everything through the Makefile (NCCL found where the
# machine keeps it, under a timeout); time GPT-2 124M training at T=1024 with
# the largest micro-batch that fits (and with our GELU kernel, and without
# CUDA graphs); set the planner's predicted step (its calibration on this
# GPU) beside it and beside a 350M run; time PyTorch (torch.compile + SDPA
# flash attention, same model and batch) when torch with CUDA is importable;
# time the attention alone (our lab's variants) beside torch's SDPA backends;
# profile one step with ncu; validate the kernel lab; run test_gpt.cu (the
# CUDA twin against the CPU trainer and PyTorch's fixture, training states,
# a GPU state resumed on the CPU); run the data-parallel (NCCL, ZeRO) code
# through scripts/gpu_check_dp.sh (with one GPU its one-GPU mode: --zero 1
# and 2 as one rank of a one-rank communicator, bit for bit against --zero
# 0; with two or more also 2 GPUs against 1 and the scaling); and last
# compute-sanitizer's memcheck over test_gpt_cu. A step that would not fit
# in what is left of the budget is skipped and says so. Prints a short table
# last. Logs go to ./gpu_check_logs/; when OUT is set (the device tool) each
# summary line is appended to $OUT/summary.txt as it is measured, and at any
# exit (a trap) the logs are packed into $OUT/gpu_check_logs.tgz beside the
# whole table.
#   scripts/gpu_check.sh                         # everything
#   GPU_CHECK_BUDGET=300 scripts/gpu_check.sh    # seconds for the whole check (default 420)
#   BENCH_STEPS=10 scripts/gpu_check.sh          # shorter benchmark
#   scripts/gpu_check.sh --plan 1        # the steps a machine with 1 GPU runs (add no-nccl: a build without
#                                        # NCCL); runs nothing (scripts/tests/test_gpu_host.sh checks the plans)
#   scripts/gpu_check_dp.sh              # the NCCL checks alone
# The steps are functions (step_*), run in the order gpu_check_steps lists
# them; the summary printer is one too, so the tests can call them.
# STATUS: ran on one H200 on 2026-11-30 in 86 s, every step passing
# (dev/cuda/RESULTS.md); not yet run on a machine with two or more GPUs.

summary=()
# A line for the summary table, said now too, and (under the device tool)
# appended to $OUT/summary.txt at once: a check cut short still leaves what
# it measured.
note() {
    summary+=("$1")
    echo "== $1"
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then printf '%s\n' "$1" >> "$OUT/summary.txt"; fi
}
# The GPU's clocks, power and temperature now, as a summary line (a throttled GPU explains a slow step).
gpu_clocks() {
    local q
    q=$(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null | head -n 1)
    note "GPU now ($1): sm, memory clocks, power, temperature: ${q:-nvidia-smi said nothing}"
}
# The table: every line printed as data (an MFU of 41.3% stays "41.3%").
summary_print() { [ ${#summary[@]} -eq 0 ] || printf '%s\n' "${summary[@]}"; }
elapsed() { echo $(( $(date +%s) - START ))s; }
# Seconds a step may take: the least of what it wants and what is left of
# the budget (less 10 s for the summary); 0 when less than its minimum is left.
step_limit() { # step_limit WANT MIN
    local left=$(( BUDGET - ($(date +%s) - START) - 10 ))
    [ "$left" -lt "$2" ] && { echo 0; return; }
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# Which data-parallel check a machine gets: dp_mode NGPU HAVE_NCCL(1|0).
# gpu_check_dp.sh has a mode for one GPU too: only a build without NCCL, or
# no GPU at all, skips it.
dp_mode() {
    if [ "$2" != 1 ]; then echo no_nccl
    elif [ "$1" -ge 2 ]; then echo multi
    elif [ "$1" -eq 1 ]; then echo one
    else echo no_gpu
    fi
}

# The steps, in order, for a machine with NGPU GPUs: gpu_check_steps NGPU HAVE_NCCL.
gpu_check_steps() { echo build bench planner torch attention profile kernel_lab tests "dp_$(dp_mode "$1" "$2")" sanitizer; }

# What each step does, for --plan.
step_describe() {
    case $1 in
    build) echo "build: make train_gpt_cu test_gpt_cu train_gpt (NCCL where the Makefile finds it)" ;;
    kernel_lab) echo "kernel lab: dev/cuda/run_all.sh" ;;
    sanitizer) echo "compute-sanitizer memcheck ./test_gpt_cu (when installed)" ;;
    tests) echo "tests: ./test_gpt_cu --binary ./train_gpt_cu --cpu-binary ./train_gpt" ;;
    bench) echo "benchmark: GPT-2 124M, T=1024, the largest B that fits; GELU in cuBLASLt's epilogue and in our kernel;" \
        "CUDA graphs and plain launches" ;;
    planner) echo "planner: train_gpt_cu --plan's predicted step (its GPU calibration) against the benchmark's" \
        "measured one (124M), and a 350M candidate trained 8 steps against its prediction" ;;
    attention) echo "attention alone: dev/cuda/attention (B=16 T=1024 NH=12 hs=64, our variants) beside" \
        "torch's scaled_dot_product_attention with each backend at the same shape (scripts/bench/bench_sdpa.py)" ;;
    profile) echo "profile: ncu's time of every kernel in one step (B=16), grouped (scripts/ncu_breakdown.py)" ;;
    torch) echo "PyTorch, same model and batch (when torch with CUDA imports)" ;;
    dp_one) echo "data parallel, one GPU: scripts/gpu_check_dp.sh (--zero 1 and 2 as one rank of a one-rank NCCL" \
        "communicator, bit for bit against --zero 0)" ;;
    dp_multi) echo "data parallel, 2+ GPUs: scripts/gpu_check_dp.sh (the one-GPU mode, then 2 GPUs against 1 for" \
        "--zero 0/1/2, and the scaling)" ;;
    dp_no_nccl) echo "data parallel: SKIPPED, this build has no NCCL (make nccl-info says where it looked)" ;;
    dp_no_gpu) echo "data parallel: SKIPPED, no GPU" ;;
    *) echo "$1: unknown step" ;;
    esac
}

# ---- the steps ----------------------------------------------------------------

# A step left out for want of time: skipped NAME.
skipped() { note "$1: SKIPPED, not enough of the ${BUDGET}s budget left ($(elapsed))"; }

# 1. build through the Makefile's CUDA section (it finds NCCL where this
# machine keeps it: the CUDA toolkit, the system, NCCL_HOME, or PyTorch's pip
# wheel; or builds without it, one GPU only, and says so); the CPU trainer
# too (the tests resume a GPU training state with it)
step_build() {
    local t
    t=$(step_limit 240 60)
    timeout "$t" make -B -j4 --no-print-directory train_gpt_cu test_gpt_cu train_gpt NVCC="$NVCC" CUDA_ARCH="$ARCH" \
        > "$LOG/build.log" 2>&1
    local rc=$?
    [ $rc -eq 124 ] && echo "build: out of time (${t}s)" >> "$LOG/build.log"
    grep -E 'nvcc|NCCL' "$LOG/build.log"
    if [ $rc -ne 0 ]; then
        cat "$LOG/build.log"
        note "build: FAILED$([ $rc -eq 124 ] && echo " (out of time: ${t}s)")"
        exit 1 # (the EXIT trap writes the summary)
    fi
    note "build: ok ($ARCH, NCCL ${NCCL_LIB:-not found: one GPU only}, $(elapsed))"
}

# 2. the tests (--cpu-binary: the CPU trainer must continue a training state the GPU wrote)
step_tests() {
    local t rc
    t=$(step_limit 240 30)
    [ "$t" -gt 0 ] || { skipped "test_gpt_cu"; return; }
    timeout "$t" ./test_gpt_cu --binary ./train_gpt_cu --cpu-binary ./train_gpt > "$LOG/test_gpt_cu.log" 2>&1
    rc=$?
    grep -E '^FAIL' "$LOG/test_gpt_cu.log" | head -30
    note "test_gpt_cu: $(tail -n 1 "$LOG/test_gpt_cu.log") (rc=$rc$([ $rc -eq 124 ] && echo ", timed out after ${t}s"), $(elapsed))"
}

# 3. kernel lab
step_kernel_lab() {
    local t
    t=$(step_limit 150 30)
    [ "$t" -gt 0 ] || { skipped "dev/cuda"; return; }
    ARCH=$ARCH NVCC=$NVCC timeout "$t" dev/cuda/run_all.sh > "$LOG/dev_cuda.log" 2>&1
    note "$(tail -n 1 "$LOG/dev_cuda.log") ($(elapsed))"
    grep -E 'FAIL|GB/s|TFLOP/s' "$LOG/dev_cuda.log" | head -60
}

# The benchmark again at B=$BENCH_B with one flag changed, its median tok/s
# against the default run's ($GPU_TPS), when the budget allows:
# bench_rerun SUFFIX WHAT DEFAULT FLAG VALUE
bench_rerun() {
    local suffix=$1 what=$2 default=$3 t tps shard=$LOG/bench_train.bin
    shift 3
    t=$(step_limit 60 30)
    [ "$t" -gt 0 ] || { skipped "benchmark with $*"; return; }
    timeout "$t" ./train_gpt_cu --model d12 --train-data "$shard" --batch-size "$BENCH_B" --seq-len 1024 \
        --steps "$BENCH_STEPS" --val-every 0 --sample-every 0 --lr 3e-4 "$@" > "$LOG/bench_B${BENCH_B}_$suffix.log" 2>&1
    tps=$(grep '^step' "$LOG/bench_B${BENCH_B}_$suffix.log" | tail -n +4 | grep -o '[0-9]* tok/s' |
          awk '{print $1}' | sort -n | awk '{a[NR] = $1} END { if (NR) print a[int((NR + 1) / 2)] }')
    note "  with $* ($what): ${tps:-FAILED} tok/s$([ -n "$tps" ] &&
        awk -v a="$tps" -v b="$GPU_TPS" -v d="$default" 'BEGIN { printf " = %.3fx %s", a / b, d }')"
}

# 4. benchmark: GPT-2 124M (random init), T=1024, no gradient accumulation
step_bench() {
    local shard=$LOG/bench_train.bin line t B  # (in this run's log folder: two runs never share it)
    [ -f "$shard" ] || $PY scripts/toy_shard.py "$shard" 3000000 50257 0 > /dev/null
    BENCH_B=""
    for B in 64 32 16 8 4; do
        t=$(step_limit 90 40)
        [ "$t" -gt 0 ] || break
        timeout "$t" ./train_gpt_cu --model d12 --train-data "$shard" --batch-size $B --seq-len 1024 \
            --steps "$BENCH_STEPS" --val-every 0 --sample-every 0 --lr 3e-4 > "$LOG/bench_B$B.log" 2>&1
        if grep -q '^step' "$LOG/bench_B$B.log"; then BENCH_B=$B; break; fi
        tail -n 3 "$LOG/bench_B$B.log"
    done
    if [ -n "$BENCH_B" ]; then
        # median over the steps after the first three (cuBLASLt heuristics, allocation warm-up)
        line=$(grep '^step' "$LOG/bench_B$BENCH_B.log" | tail -n +4 | awk -F'|' '{print $5, $6, $7}' | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}')
        GPU_TPS=$(echo "$line" | grep -o '[0-9]* tok/s' | awk '{print $1}')
        GPU_MFU=$(echo "$line" | grep -o 'MFU [^ ]*' | awk '{print $2}')
        note "train_gpt_cu: GPT-2 124M B=$BENCH_B T=1024: $GPU_TPS tok/s, MFU $GPU_MFU (median; $(elapsed))"
        grep -E 'memory|device|GELU|cuBLASLt' "$LOG/bench_B$BENCH_B.log"
        tail -n 2 "$LOG/bench_B$BENCH_B.log"
        gpu_clocks "after the benchmark"
        # defaults decided by measurement: the same run with our GELU kernel (against the
        # cuBLASLt epilogue), and with plain launches (against CUDA graphs; not yet run on a GPU)
        bench_rerun gelu0 "our GELU kernel" "the epilogue" --gelu-fusion 0
        bench_rerun graphs0 "plain launches" "CUDA graphs" --cuda-graphs 0
    elif [ "$(step_limit 90 40)" -eq 0 ]; then
        skipped "train_gpt_cu benchmark"
    else
        note "train_gpt_cu benchmark: FAILED (see $LOG/bench_B*.log)"
    fi
}

# The predicted step of the --plan row B, zero 0, recompute 0, offload 0 in a --plan log: plan_ms LOG B
plan_ms() { awk -v b="$2" '$1 == b && $3 == 0 && $4 == 0 && $5 == 0 && $6 == "|" { print $(NF - 3); exit }' "$1"; }
# The median step ms of a training log's steps after the first three: step_ms LOG
step_ms() { grep '^step' "$1" | tail -n +4 | sed 's/.*| \([0-9.]*\) ms |.*/\1/' | sort -n | awk '{a[NR]=$0} END {if (NR) print a[int((NR+1)/2)]}'; }
# 4b. the planner's GPU runtime model (gptc/cuda/runtime.cuh): its predicted
# step against the measured one, GPT-2 124M at the benchmark's B and 350M at B=8
step_planner() {
    local t pred meas shard=$LOG/bench_train.bin
    [ -n "$BENCH_B" ] || { note "planner: no benchmark to compare with, skipped"; return; }
    t=$(step_limit 60 30)
    [ "$t" -gt 0 ] || { skipped "planner (124M)"; return; }
    timeout "$t" ./train_gpt_cu --model d12 --seq-len 1024 --batch-size "$BENCH_B" --output-dir "$LOG/plan124" \
        --plan 1 > "$LOG/plan_124M.log" 2>&1
    pred=$(plan_ms "$LOG/plan_124M.log" "$BENCH_B") meas=$(step_ms "$LOG/bench_B$BENCH_B.log")
    note "planner, 124M B=$BENCH_B: predicted ${pred:-?} ms per step, measured ${meas:-?} ms (the benchmark's median); $(grep -o '^plan: choice[^,]*' "$LOG/plan_124M.log") ($(elapsed))"
    t=$(step_limit 120 60)
    [ "$t" -gt 0 ] || { skipped "planner (350M)"; return; }
    timeout "$t" ./train_gpt_cu --model d24 --seq-len 1024 --batch-size 8 --output-dir "$LOG/plan350" --plan 1 \
        > "$LOG/plan_350M.log" 2>&1
    timeout "$t" ./train_gpt_cu --model d24 --train-data "$shard" --seq-len 1024 --batch-size 8 --steps 8 \
        --val-every 0 --sample-every 0 --lr 3e-4 > "$LOG/train_350M.log" 2>&1
    pred=$(plan_ms "$LOG/plan_350M.log" 8) meas=$(step_ms "$LOG/train_350M.log")
    note "planner, 350M B=8: predicted ${pred:-?} ms per step, measured ${meas:-?} ms (median of steps 4-8) ($(elapsed))"
}

# 4c. the attention alone: our lab's variants (2: WMMA, 3: production) and
# torch's SDPA backends at the same shape
step_attention() {
    local t l
    t=$(step_limit 90 30)
    [ "$t" -gt 0 ] || { skipped "attention alone"; return; }
    timeout "$t" make -B --no-print-directory dev/cuda/attention NVCC="$NVCC" CUDA_ARCH="$ARCH" > "$LOG/attention_build.log" 2>&1 &&
        timeout "$t" ./dev/cuda/attention 0 16 1024 12 64 > "$LOG/attention.log" 2>&1
    while IFS= read -r l; do note "attention (ours): $l"; done < <(grep -E 'variant [0-9] +[0-9.]+ ms|FAIL|valid' "$LOG/attention.log" 2>/dev/null | sed 's/^ *//')
    t=$(step_limit 60 20)
    [ "$t" -gt 0 ] || { skipped "torch SDPA"; return; }
    timeout "$t" $PY scripts/bench/bench_sdpa.py --B 16 --T 1024 --NH 12 --hs 64 > "$LOG/sdpa.log" 2>&1
    while IFS= read -r l; do note "attention (torch): $l"; done < <(grep -E '^sdpa' "$LOG/sdpa.log")
}

# 5. profile: every kernel of one step timed by Nsight Compute (one metric,
# one pass; the GPU's clocks left alone), grouped by scripts/ncu_breakdown.py
step_profile() {
    local ncu t shard=$LOG/bench_train.bin
    ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    [ -n "$ncu" ] && [ -x "$ncu" ] || { note "profile: ncu not installed, skipped"; return; }
    t=$(step_limit 90 30)
    [ "$t" -gt 0 ] || { skipped "profile"; return; }
    timeout "$t" "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 3000 \
        ./train_gpt_cu --model d12 --train-data "$shard" --batch-size 16 --seq-len 1024 --steps 2 \
        --val-every 0 --sample-every 0 > "$LOG/ncu.csv" 2> "$LOG/ncu.err"
    if $PY scripts/ncu_breakdown.py "$LOG/ncu.csv" --top 25 > "$LOG/profile.txt" 2>&1; then
        note "profile (ncu, B=16 T=1024): $(head -n 1 "$LOG/profile.txt") ($(elapsed)); the top 10:"
        local l
        while IFS= read -r l; do summary+=("  $l"); done < <(sed -n 2,11p "$LOG/profile.txt")
    else
        note "profile: FAILED ($(head -n 1 "$LOG/profile.txt"); see ncu.err)"
    fi
}

# 6. data parallel over NCCL (ZeRO): gpu_check_dp.sh picks its checks by the GPUs it sees
step_dp() { # step_dp WANT_SECONDS
    local t l
    t=$(step_limit "$1" 60)
    [ "$t" -gt 0 ] || { skipped "data parallel"; return; }
    BIN=./train_gpt_cu GPU_CHECK_DP_LOG="$LOG/dp" timeout "$t" scripts/gpu_check_dp.sh > "$LOG/dp.log" 2>&1
    note "data parallel ($NGPU GPU(s)): $(tail -n 1 "$LOG/dp.log") ($(elapsed))"
    while IFS= read -r l; do summary+=("  $l"); done < <(sed -n '/==== gpu_check_dp summary/,$p' "$LOG/dp.log" | sed '1d;$d')
}
step_dp_one() { step_dp 180; }
step_dp_multi() { step_dp 480; }
step_dp_no_nccl() { note "data parallel: SKIPPED, this build has no NCCL (make nccl-info; the build said where it looked)"; }
step_dp_no_gpu() { note "data parallel: SKIPPED, no GPU visible"; }

# 7. PyTorch, same model and batch
step_torch() {
    local t tline t_tps ratio
    if [ -z "$BENCH_B" ] || ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        note "PyTorch with CUDA: not importable (or no benchmark to compare with), skipped"
        return
    fi
    t=$(step_limit 180 60)
    [ "$t" -gt 0 ] || { skipped "PyTorch benchmark"; return; }
    timeout "$t" $PY scripts/bench/bench_torch_gpu.py --B "$BENCH_B" --T 1024 --steps 15 > "$LOG/bench_torch.log" 2>&1
    tline=$(grep '^torch' "$LOG/bench_torch.log")
    if [ -n "$tline" ]; then
        t_tps=$(echo "$tline" | grep -o 'tok/s=[0-9]*' | cut -d= -f2)
        ratio=$(awk -v a="${GPU_TPS:-0}" -v b="$t_tps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
        note "PyTorch (torch.compile, SDPA): $tline"
        note "train_gpt_cu / PyTorch tokens/s: $ratio"
    else
        tail -n 5 "$LOG/bench_torch.log"
        note "PyTorch benchmark: FAILED or out of time (limit ${t}s; see bench_torch.log)"
    fi
}

# 8. compute-sanitizer (memcheck) over the tests without --binary (the
# forward, backward and AdamW kernels on the tiny fixture)
step_sanitizer() {
    local cs rc t
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    [ -x "$cs" ] || { note "compute-sanitizer: not installed, skipped"; return; }
    t=$(step_limit 150 30)
    [ "$t" -gt 0 ] || { skipped "compute-sanitizer"; return; }
    timeout "$t" "$cs" --tool memcheck --error-exitcode 9 ./test_gpt_cu > "$LOG/test_sanitizer.log" 2>&1
    rc=$?
    note "compute-sanitizer memcheck test_gpt_cu: rc=$rc$([ $rc -eq 124 ] && echo " (out of time: ${t}s)"), $(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$LOG/test_sanitizer.log") error lines ($(elapsed))"
    grep -m 5 -E 'Invalid|ERROR SUMMARY' "$LOG/test_sanitizer.log"
}

# ---- main -----------------------------------------------------------------------

# The summary, printed and, under the device tool, packed with the logs into
# $OUT: once, at any exit (the EXIT trap), a step's failure or a timeout included.
gpu_check_finish() {
    [ -z "${FINISHED:-}" ] || return 0
    FINISHED=1
    gpu_clocks "at the end"
    echo
    echo "==== gpu_check summary ($(elapsed), logs in $LOG)"
    summary_print
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
        { echo "gpu_check $(date -u '+%Y-%m-%d %H:%M UTC'), $(head -n 1 "$LOG/gpu.txt" 2>/dev/null), commit $GIT_REV"
          summary_print; } > "$OUT/summary.txt"
        tar czf "$OUT/gpu_check_logs.tgz" --exclude='*.bin' -C "$(dirname "$LOG")" "$(basename "$LOG")"
    fi
}

gpu_check_main() {
    set -u
    cd "$(dirname "$0")/.." || exit 1
    if [ "${1:-}" = --plan ]; then
        local n=${2:-1} have=1 i=1 s
        [ "${3:-nccl}" = no-nccl ] && have=0
        echo "gpu_check plan for $n GPU(s), $([ $have = 1 ] && echo "NCCL in the build" || echo "no NCCL"):"
        for s in $(gpu_check_steps "$n" "$have"); do
            echo "$i. $(step_describe "$s")"
            i=$((i + 1))
        done
        return 0
    fi
    LOG=gpu_check_logs
    rm -rf "$LOG"
    mkdir -p "$LOG"
    NVCC=${NVCC:-nvcc}
    command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
    PY=${PYTHON:-python3}
    BENCH_STEPS=${BENCH_STEPS:-15}
    BUDGET=${GPU_CHECK_BUDGET:-420}
    START=$(date +%s)
    BENCH_B=""
    GPU_TPS=""
    GIT_REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo "+changes")
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
        echo "gpu_check $(date -u '+%Y-%m-%d %H:%M UTC'), commit $GIT_REV (lines as measured; the whole table at the end)" \
            > "$OUT/summary.txt"
    fi
    trap gpu_check_finish EXIT

    { nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total,clocks.max.sm --format=csv,noheader
      "$NVCC" --version | tail -n 2; } 2>&1 | tee "$LOG/gpu.txt"
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    local cap
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
    ARCH=sm_${cap:-90}
    echo "arch: $ARCH, budget ${BUDGET}s, commit $GIT_REV"
    local info have=0 s
    info=$(make -s --no-print-directory nccl-info NVCC="$NVCC")
    NCCL_LIB=$(echo "$info" | grep '^NCCL_LIB=' | cut -d= -f2-)
    echo "$info" | grep '^NCCL_SAID=' | cut -d= -f2-
    [ -n "$NCCL_LIB" ] && have=1
    for s in $(gpu_check_steps "$NGPU" "$have"); do "step_$s"; done
    gpu_check_finish
    trap - EXIT
}

# run, unless sourced (the tests source this file for its functions)
if [ "${BASH_SOURCE[0]}" = "$0" ]; then gpu_check_main "$@"; fi
