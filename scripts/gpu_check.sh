#!/bin/bash
# scripts/gpu_check.sh — the one command for a machine with a GPU (under 8
# minutes on one H100/H200): build everything with nvcc, validate the kernel
# lab, run test_gpt.cu (first under compute-sanitizer when it is there), then
# time GPT-2 124M training at T=1024 with the largest micro-batch that fits,
# beside PyTorch (torch.compile + SDPA flash attention, same model and batch)
# when torch with CUDA is importable; with two or more GPUs, the data-parallel
# (NCCL) path too: scripts/gpu_check_dp.sh (2 GPUs against 1 for --zero
# 0/1/2, and the scaling; about 3 more minutes, none with one GPU). Prints a
# short table last.
# Logs go to $OUT/gpu_check/ when OUT is set, else to ./gpu_check_logs/.
#   scripts/gpu_check.sh                 # everything
#   BENCH_STEPS=10 scripts/gpu_check.sh  # shorter benchmark
#   scripts/gpu_check_dp.sh              # the NCCL checks alone (with one GPU: ZeRO as one rank, ~1 min)
# STATUS: not yet run on a GPU.
set -u
cd "$(dirname "$0")/.."
LOG=${OUT:+$OUT/gpu_check}
LOG=${LOG:-gpu_check_logs}
mkdir -p "$LOG"
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
PY=${PYTHON:-python3}
BENCH_STEPS=${BENCH_STEPS:-15}
START=$(date +%s)
summary=""
note() { summary="$summary$1\n"; echo "== $1"; }
elapsed() { echo $(( $(date +%s) - START ))s; }

nvidia-smi -L 2>&1 | tee "$LOG/gpu.txt"
CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
ARCH=sm_${CAP:-90}
echo "arch: $ARCH"

# 1. build through the Makefile's CUDA section (it finds NCCL where this
# machine keeps it: the CUDA toolkit, the system, NCCL_HOME, or PyTorch's pip
# wheel; or builds without it, one GPU only, and says so)
NCCL_INFO=$(make -s --no-print-directory nccl-info NVCC="$NVCC")
NCCL_LIB=$(echo "$NCCL_INFO" | grep '^NCCL_LIB=' | cut -d= -f2-)
echo "$NCCL_INFO" | grep '^NCCL_SAID=' | cut -d= -f2-
make -B --no-print-directory train_gpt_cu test_gpt_cu NVCC="$NVCC" CUDA_ARCH="$ARCH" > "$LOG/build.log" 2>&1
rc=$?
grep -E 'nvcc|NCCL' "$LOG/build.log"
[ $rc -eq 0 ] && note "build: ok ($ARCH, NCCL ${NCCL_LIB:-not found: one GPU only}, $(elapsed))" ||
    { cat "$LOG/build.log"; note "build: FAILED"; printf "$summary"; exit 1; }

# 2. kernel lab
ARCH=$ARCH NVCC=$NVCC timeout 240 dev/cuda/run_all.sh > "$LOG/dev_cuda.log" 2>&1
note "dev/cuda: $(tail -n 1 "$LOG/dev_cuda.log") ($(elapsed))"
grep -E 'FAIL|GB/s' "$LOG/dev_cuda.log" | head -20

# 3. tests: compute-sanitizer first (memcheck), then plain
if command -v compute-sanitizer >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 180 "$CS" --tool memcheck --error-exitcode 9 ./test_gpt_cu > "$LOG/test_sanitizer.log" 2>&1
    rc=$?
    note "compute-sanitizer memcheck test_gpt_cu: rc=$rc, $(grep -c 'Invalid\|ERROR SUMMARY: [1-9]' "$LOG/test_sanitizer.log") error lines ($(elapsed))"
    grep -m 5 -E 'Invalid|ERROR SUMMARY' "$LOG/test_sanitizer.log"
else
    note "compute-sanitizer: not installed, skipped"
fi
# (--cpu-binary: the CPU trainer must continue a training state the GPU wrote)
[ -x ./train_gpt ] || make train_gpt > /dev/null 2>&1
timeout 300 ./test_gpt_cu --binary ./train_gpt_cu --cpu-binary ./train_gpt > "$LOG/test_gpt_cu.log" 2>&1
rc=$?
grep -E '^FAIL' "$LOG/test_gpt_cu.log" | head -30
note "test_gpt_cu: $(tail -n 1 "$LOG/test_gpt_cu.log") (rc=$rc, $(elapsed))"

# 4. benchmark: GPT-2 124M (random init), T=1024, no gradient accumulation
SHARD=/tmp/gptc_bench_train.bin
[ -f $SHARD ] || $PY scripts/toy_shard.py $SHARD 3000000 50257 0 > /dev/null
BENCH_B=""
for B in 64 32 16 8 4; do
    ./train_gpt_cu --model d12 --train-data $SHARD --batch-size $B --seq-len 1024 --steps $BENCH_STEPS \
        --val-every 0 --sample-every 0 --lr 3e-4 > "$LOG/bench_B$B.log" 2>&1
    if grep -q '^step' "$LOG/bench_B$B.log"; then BENCH_B=$B; break; fi
    tail -n 3 "$LOG/bench_B$B.log"
done
if [ -n "$BENCH_B" ]; then
    # median over the steps after the first three (cuBLASLt heuristics, allocation warm-up)
    line=$(grep '^step' "$LOG/bench_B$BENCH_B.log" | tail -n +4 | awk -F'|' '{print $5, $6, $7}' | sort -n | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}')
    GPU_TPS=$(echo "$line" | grep -o '[0-9]* tok/s' | awk '{print $1}')
    GPU_MFU=$(echo "$line" | grep -o 'MFU [^ ]*' | awk '{print $2}')
    note "train_gpt_cu: GPT-2 124M B=$BENCH_B T=1024: $GPU_TPS tok/s, MFU $GPU_MFU (median; $(elapsed))"
    grep -E 'memory|device|GELU' "$LOG/bench_B$BENCH_B.log"
    tail -n 2 "$LOG/bench_B$BENCH_B.log"
else
    note "train_gpt_cu benchmark: FAILED (see $LOG/bench_B*.log)"
fi

# 5. PyTorch, same model and batch
if [ -n "$BENCH_B" ] && $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    timeout 300 $PY scripts/bench_torch_gpu.py --B $BENCH_B --T 1024 --steps 15 > "$LOG/bench_torch.log" 2>&1
    tline=$(grep '^torch' "$LOG/bench_torch.log")
    if [ -n "$tline" ]; then
        T_TPS=$(echo "$tline" | grep -o 'tok/s=[0-9]*' | cut -d= -f2)
        ratio=$(awk -v a="${GPU_TPS:-0}" -v b="$T_TPS" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
        note "PyTorch (torch.compile, SDPA): $tline"
        note "train_gpt_cu / PyTorch tokens/s: $ratio"
    else
        tail -n 5 "$LOG/bench_torch.log"
        note "PyTorch benchmark: FAILED (see $LOG/bench_torch.log)"
    fi
else
    note "PyTorch with CUDA: not importable, skipped"
fi

# 6. data parallel over NCCL: only with two or more GPUs (the one-GPU budget is untouched)
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$NGPU" -ge 2 ]; then
    BIN=./train_gpt_cu timeout 420 scripts/gpu_check_dp.sh > "$LOG/dp.log" 2>&1
    note "data parallel ($NGPU GPUs): $(tail -n 1 "$LOG/dp.log") ($(elapsed))"
    while IFS= read -r l; do summary="$summary  ${l//%/%%}\n"; done < <(sed -n '/==== gpu_check_dp summary/,$p' "$LOG/dp.log" | sed '1d;$d')
else
    note "data parallel: one GPU visible, NCCL checks skipped (scripts/gpu_check_dp.sh runs them as one rank)"
fi

echo
echo "==== gpu_check summary ($(elapsed), logs in $LOG)"
printf "$summary"
