#!/bin/sh
# dev/cuda/run_all.sh — build and validate every kernel-lab file, at the
# default (GPT-2 124M) sizes and at awkward tiny ones. Needs a GPU; without
# one each file says so and exits 77 (counted as skipped, not failed).
#   dev/cuda/run_all.sh            # from the repository root
#   ARCH=sm_80 dev/cuda/run_all.sh # an A100
set -u
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
ARCH=${ARCH:-sm_90}
pass=0; fail=0; skip=0
run() { # name, args...
    name=$1; shift
    echo "== dev/cuda/$name $*"
    "./dev/cuda/$name" "$@"
    rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); elif [ $rc -eq 77 ]; then skip=$((skip + 1)); else fail=$((fail + 1)); fi
}
# built by the Makefile (its flags, and NCCL found where this machine keeps it: the files include train_gpt.cu)
for f in layernorm classifier attention; do
    echo "== build dev/cuda/$f ($ARCH)"
    make -B --no-print-directory "dev/cuda/$f" NVCC="$NVCC" CUDA_ARCH="$ARCH" || { fail=$((fail + 1)); continue; }
done
run layernorm
run layernorm 0 4 9 36
run classifier
run classifier 0 27 131 256
run attention
run attention 0 2 70 2 20
# tensor cores (WMMA): the CPU layer's own test, its correct-program cases on the GPU
echo "== build dev/cuda/cpu/test_wmma ($ARCH)"
if "$NVCC" -arch="$ARCH" -O3 -std=c++17 -o dev/cuda/cpu/test_wmma dev/cuda/cpu/test_wmma.cu; then
    run cpu/test_wmma
else
    fail=$((fail + 1))
fi
echo "dev/cuda: $pass passed, $fail failed, $skip skipped (no GPU)"
[ $fail -eq 0 ]
