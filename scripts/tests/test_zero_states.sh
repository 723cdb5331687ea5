#!/bin/bash
# scripts/tests/test_zero_states.sh — training states under --zero 1 and --zero 2
# (and a CPU trainer's --zero 3 state)
# on emulated GPUs (issue 13): ./train_gpt_cu_cpu, one MPI rank per GPU
# (--init mpi: the Saver keeps the ranks' states together through MPI), the
# CPU trainer ./train_gpt beside it. Called by scripts/tests/test_cuda_on_cpu.sh.
#
#   scripts/tests/test_zero_states.sh [LOG_DIR]     (make train_gpt train_gpt_cu_cpu first)
#
# A state is flat whatever wrote it (gptc/state.h: rank r saves the r-th of W
# equal slices of the file-order weights and moments); under ZeRO each GPU
# gathers its bucket-interleaved shards into that order when it snapshots
# (train_gpt.cu dp_state_to_host) and packs its shards out of it when it
# resumes (dp_state_upload). Runs of 3 steps with a state saved at step 2,
# resumed from it (a copy of the folder without the step-3 state):
#   - the same rank count and --zero: the final model cmp-equal to the
#     uninterrupted run's (same arithmetic), --zero 1 and --zero 2 on 2 GPUs;
#   - another rank count (3 GPUs, 1 GPU), another --zero, or the CPU trainer:
#     the final weights within a tolerance of the uninterrupted run's,
#     measured by scripts/compare_models.py as the largest, over the tensors,
#     ||A - B|| / ||B - S|| with S the model at step 2: the error relative to
#     what the last step changed. GPUs against GPUs: GPU_TOL = 1e-4 (each
#     rank count sums the fp32 gradients in another order; measured about
#     1.5e-7 here: the bf16 weights at the resume point are the same); the
#     GPU (bf16 weights and activations) against the CPU trainer (fp32
#     throughout): CPU_TOL = 0.05 (measured about 0.01 here).
# About 90 s on two shared cores. The last line is "zero states: N passed,
# N failed"; exit status non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
LOG=${1:-$(mktemp -d /tmp/gptc_zero_states.XXXXXX)}
mkdir -p "$LOG"
START=$(date +%s)
CHECK_START=$START
. scripts/tests/check.sh
BIN=./train_gpt_cu_cpu
CPU=./train_gpt
PY=/usr/bin/python3
GPU_TOL=${GPU_TOL:-1e-4}
CPU_TOL=${CPU_TOL:-0.05}
for b in $BIN $CPU; do [ -x $b ] || { echo "test_zero_states: $b not built: make train_gpt train_gpt_cu_cpu"; exit 1; }; done
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 400000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
SMALL="--model d2 --channels 64 --num-heads 2 --max-seq-len 64 --vocab-size 256 --train-data $TOY --seq-len 64
       --batch-size 2 --total-batch-size 768 --steps 3 --save-every 2 --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 0
       --sample-every 0"
# (768 tokens a step: 6 sequences, whole micro-batches of B=2 on 1, 2 and 3 ranks)

# gpus NAME W FLAGS...: W emulated GPUs (W = 1: one process, no mpirun), output in $LOG/NAME/
gpus() {
    local name=$1 w=$2
    shift 2
    if [ "$w" -eq 1 ]; then
        $CLEAN_ENV timeout 120 $BIN $SMALL -o "$LOG/$name" "$@" > "$LOG/$name.log" 2>&1
    else
        $CLEAN_ENV timeout 180 mpirun --allow-run-as-root --oversubscribe -np "$w" -x GPTC_RUN_ID="zero-states-$$-$name" \
            $BIN --init mpi --comm-timeout 120 $SMALL -o "$LOG/$name" "$@" > "$LOG/$name.log" 2>&1
    fi
}
cpu() {
    local name=$1
    shift
    $CLEAN_ENV timeout 120 $CPU $SMALL --threads 1 -o "$LOG/$name" "$@" > "$LOG/$name.log" 2>&1
}
# resumed NAME FROM: a copy of FROM's folder to resume in, its final state and model removed (the newest
# complete state is then step 2's: a state without its .complete marker does not count)
resumed() { rm -rf "$LOG/$1"; cp -r "$LOG/$2" "$LOG/$1"; rm -f "$LOG/$1/state_00000003.complete" "$(final $1)"; }
final() { echo "$LOG/$1/model_00000003.bin"; }
# same NAME REF WHAT: cmp-equal final models, and the run said it continued
same() {
    local ok=FAIL
    grep -q "continuing after step 2" "$LOG/$1.log" && cmp -s "$(final $1)" "$(final $2)" && ok=ok
    check $ok "$3" "$(grep -m 1 'resume: ' "$LOG/$1.log" | cut -c1-80)"
    [ $ok = ok ] || tail -n 15 "$LOG/$1.log"
}
# near NAME REF AT TOL WHAT: within TOL of REF's final model, relative to REF's last 2 steps (from AT's model at 2)
near() {
    local d rc=1
    if grep -q "continuing after step 2" "$LOG/$1.log"; then
        d=$($PY scripts/compare_models.py "$(final $1)" "$(final $2)" "$LOG/$3/model_00000002.bin" "$4" 2>&1)
        rc=$?
    else
        d="did not continue after step 2"
    fi
    check "$([ $rc -eq 0 ] && echo ok || echo FAIL)" "$5" "$(echo "$d" | tail -n 1 | cut -c1-90); tol $4"
    [ $rc -eq 0 ] || tail -n 15 "$LOG/$1.log"
}

# ---- 2 GPUs, --zero 1 and --zero 2: uninterrupted (a state at step 2 on the way), resumed from it on 2 ----
for z in 1 2; do
    gpus u$z 2 --zero $z
    check "$([ -f "$LOG/u$z/state_00000002.complete" ] && [ -f "$(final u$z)" ] && echo ok || echo FAIL)" \
        "2 GPUs --zero $z: a training state at step 2 (--save-every 2), and the final model"
    resumed r$z u$z
    gpus r$z 2 --zero $z --resume 1
    same r$z u$z "2 GPUs --zero $z: resumed after step 2 on 2 GPUs, final weights bit for bit the uninterrupted run's"
done
# ---- another rank count, another --zero (another order of the sums: a tolerance) ----
resumed r2on3 u2
gpus r2on3 3 --zero 1 --resume 1
near r2on3 u2 u2 $GPU_TOL "a 2-GPU --zero 2 state resumed on 3 GPUs --zero 1 (resharded)"
resumed r1on1 u1
gpus r1on1 1 --zero 2 --resume 1
near r1on1 u1 u1 $GPU_TOL "a 2-GPU --zero 1 state resumed on 1 GPU --zero 2"
# ---- the CPU trainer: the same format both ways (fp32 against bf16) ----
resumed r2cpu u2
cpu r2cpu --resume 1
near r2cpu u2 u2 $CPU_TOL "a 2-GPU --zero 2 state resumed by the CPU trainer (fp32 against bf16)"
cpu cpu_u
resumed cpu_r2 cpu_u
gpus cpu_r2 2 --zero 2 --resume 1
near cpu_r2 cpu_u cpu_u $CPU_TOL "a CPU-trainer state resumed on 2 GPUs --zero 2 (bf16 against fp32)"
cpu cpu_u3 --zero 3
resumed cpu_r3 cpu_u3
gpus cpu_r3 2 --zero 2 --resume 1
near cpu_r3 cpu_u3 cpu_u3 $CPU_TOL "a CPU-trainer --zero 3 state (gptc/zero3.h) resumed on 2 GPUs --zero 2"

echo "zero states: $passed passed, $failed failed ($(( $(date +%s) - START ))s, logs in $LOG)"
[ $failed -eq 0 ]
