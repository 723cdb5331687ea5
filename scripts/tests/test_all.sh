#!/bin/bash
# scripts/tests/test_all.sh — the stages of `make test`, in order. make builds what
# they need first (the Makefile's `test` target) and then runs this; CI runs
# `make test`. Each stage's full output goes to $LOGS/<stage>.log (the
# checkout's .test/logs/, which git ignores); on a failure it is printed and
# the run stops. The last line is test_gpt's "N passed, N failed".
#
#   make test                          (the way to run it)
#   TEST_DIR=.test NVCC=nvcc FIXTURE_124M=.test/fixture_124M scripts/tests/test_all.sh   (what make passes)
set -u
cd "$(dirname "$0")/../.."
TEST_DIR=${TEST_DIR:-.test}
FIXTURE_124M=${FIXTURE_124M:-$TEST_DIR/fixture_124M}
DEFAULT_RUN=${DEFAULT_RUN:-$TEST_DIR/default_run}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
LOGS=$TEST_DIR/logs
mkdir -p "$LOGS"
# (what a stage builds, CHECK_JOBS compiles at once: the cores)
MAKE_Q="make --no-print-directory -j${CHECK_JOBS:-$(nproc)}"

# stage NAME COMMAND...: run it into $LOGS/NAME.log; on failure print the log and stop
stage() {
    local name=$1 t0=$SECONDS
    shift
    "$@" > "$LOGS/$name.log" 2>&1 || { cat "$LOGS/$name.log"; echo "make test: stage '$name' failed (log: $LOGS/$name.log)"; exit 1; }
    echo "$name: $((SECONDS - t0)) s" >> "$LOGS/times.txt"
}
rm -f "$LOGS/times.txt"

echo "== the CUDA twin compiles (no GPU needed)"
if command -v "$NVCC" > /dev/null 2>&1; then
    stage check_cuda $MAKE_Q check-cuda
    echo "check-cuda: ok"
else
    echo "check-cuda: SKIPPED, nvcc not found (install the CUDA toolkit to compile train_gpt.cu)"
fi

echo "== the CUDA twin executed on the CPU (dev/cuda/cpu): the layer's tests, test_gpt.cu, dev/cuda, a training run, 3 emulated GPUs"
if command -v "$NVCC" > /dev/null 2>&1; then
    stage test_cuda_cpu $MAKE_Q test-cuda-cpu
    tail -n 1 "$LOGS/test_cuda_cpu.log"
    stage test_cuda_on_cpu $MAKE_Q test-cuda-on-cpu
    grep -E '^(ok|FAIL) ' "$LOGS/test_cuda_on_cpu.log"
    tail -n 1 "$LOGS/test_cuda_on_cpu.log"
    stage gpu_metrics $MAKE_Q gpu-metrics && tail -n 1 "$LOGS/gpu_metrics.log"
else
    echo "test-cuda-cpu, test-cuda-on-cpu: SKIPPED, the CUDA toolkit's headers not found (CI has CUDA 13 in /usr/local/cuda)"
fi

echo "== data parallel: mpirun -np 2 and -np 3 against 1 process, plain, ZeRO-1 and ZeRO-2, resharding"
stage test_dp scripts/tests/test_dp.sh ./train_gpt_mpi
tail -n 1 "$LOGS/test_dp.log"

echo "== ZeRO-3, --topology 2x2, hierarchical reduction: np 1-4 against 1 process, bytes per level = the formulas, states"
stage test_zero3 scripts/tests/test_zero3.sh .hooks/train_gpt_mpi ./train_gpt
tail -n 1 "$LOGS/test_zero3.log"

echo "== ZeRO++ on --zero 3 (gptc/zeropp.h): qwZ, qgZ, hpZ on np 2 and 2x2 against plain --zero 3, bytes = the formulas, plan, resume"
stage test_zeropp scripts/tests/test_zeropp.sh .hooks/train_gpt_mpi
tail -n 1 "$LOGS/test_zeropp.log"

echo "== ZeRO++'s quantised collectives (gptc/quant.h): INT8/INT4 blocks, qwZ, qgZ, hpZ on mpirun -np 1, 2, 4 (emulated 2x2 and 2x1x2)"
stage test_quant scripts/tests/test_quant.sh ./dev/quant/test_quant
tail -n 1 "$LOGS/test_quant.log"

echo "== the memory plan: --plan == the allocation ledger over 33 configurations (1-3 ranks, ZeRO 0/1/2), peak RSS within 3%"
stage test_plan scripts/tests/test_plan.sh .hooks/train_gpt .hooks/train_gpt_mpi
tail -n 1 "$LOGS/test_plan.log"

echo "== failover: runs killed (SIGKILL), hung (SIGSTOP) and host-replaced under scripts/supervise.py end bit for bit"
stage test_failover scripts/tests/test_failover.sh .hooks/train_gpt .hooks/train_gpt_mpi
tail -n 1 "$LOGS/test_failover.log"

echo "== hot spare for 2 ranks: a standby mpirun job promoted after SIGKILLs of ranks, bit for bit (the rest: make test-failover-long)"
stage test_spare_ranks scripts/tests/test_spare_ranks.sh --quick .hooks/train_gpt_mpi
tail -n 1 "$LOGS/test_spare_ranks.log"

echo "== resume: runs stopped and resumed at every step, 1 and 3 shards, shuffled or not, 1 process and 2 ranks, end bit for bit"
stage test_resume scripts/tests/test_resume.sh ./train_gpt ./train_gpt_mpi
tail -n 1 "$LOGS/test_resume.log"

echo "== the default run, reduced to 40 steps (test_gpt checks its log and plot below)"
rm -rf "$DEFAULT_RUN"
stage default_run $MAKE_Q train TRAIN_STEPS=40 TRAIN_OUT="$DEFAULT_RUN"
tail -n 4 "$LOGS/default_run.log"

echo "== tokenizer parity with the reference JavaScript tokenizer (committed fixture + regenerated live with node)"
stage test_tokenizer ./test_tokenizer --live
tail -n 1 "$LOGS/test_tokenizer.log"

echo "== Hugging Face GPT-2 checkpoints in and out, against PyTorch float64 (scripts/hf_reference.py, no download)"
stage test_hf $MAKE_Q test-hf TEST_DIR="$TEST_DIR"
grep -E '(passed|failed)' "$LOGS/test_hf.log" | tail -n 2

echo "== multiple choice (HellaSwag's shape): --eval-file against PyTorch float64, 1 and 2 ranks (scripts/tests/test_eval.sh)"
stage test_eval scripts/tests/test_eval.sh ./train_gpt ./train_gpt_mpi ./prepare_eval
tail -n 1 "$LOGS/test_eval.log"

echo "== coverage-guided fuzzing: every parser's libFuzzer harness on its seeds, the regressions replayed (fuzz/fuzz.mk)"
stage test_fuzz $MAKE_Q test-fuzz
tail -n 1 "$LOGS/test_fuzz.log"

echo "== the CPU programs built with clang + OpenMP and with gcc without OpenMP: no warning, the same checks pass"
stage test_portable scripts/tests/test_portable.sh --quick
tail -n 1 "$LOGS/test_portable.log"

echo "== test_gpt under AddressSanitizer + UBSan (tiny fixture)"
ASAN_OPTIONS=detect_leaks=1 stage test_gpt_asan ./test_gpt_asan
grep -v '^ok ' "$LOGS/test_gpt_asan.log" | grep -v '^error: ' || true

echo "== test_gpt (tiny fixture + GPT-2 124M shape)"
./test_gpt --ref "$FIXTURE_124M/gpt2_124M_model.bin" "$FIXTURE_124M/gpt2_124M_ref.bin" --default-run "$DEFAULT_RUN"
