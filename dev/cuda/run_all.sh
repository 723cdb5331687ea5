#!/bin/sh
# dev/cuda/run_all.sh — build and validate every kernel-lab file, at the
# default (GPT-2 124M) sizes and at awkward tiny ones. Needs a GPU; without
# one each file says so and exits 77 (counted as skipped, not failed).
#   dev/cuda/run_all.sh            # from the repository root
#   ARCH=sm_80 dev/cuda/run_all.sh # an A100
#   dev/cuda/run_all.sh adamw gelu # only these files (a short GPU slot); wmma: the CPU layer's WMMA test
set -u
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
ARCH=${ARCH:-sm_90}
pass=0; fail=0; skip=0
run() { # name, args...
    name=$1; shift
    case " $LAB " in *" $name "*) ;; *) return ;; esac # not asked for
    echo "== dev/cuda/$name $*"
    "./dev/cuda/$name" "$@"
    rc=$?
    if [ $rc -eq 0 ]; then pass=$((pass + 1)); elif [ $rc -eq 77 ]; then skip=$((skip + 1)); else fail=$((fail + 1)); fi
}
# built by the Makefile (its flags, and NCCL found where this machine keeps it: the files include train_gpt.cu)
LAB="layernorm classifier attention"
LAB="$LAB adamw" # the kernel lab's further files (issue 13), one a line
LAB="$LAB encoder"
LAB="$LAB gelu"
LAB="$LAB matmul"
LAB="$LAB wmma" # the CPU layer's own WMMA test (dev/cuda/cpu/test_wmma.cu), built by nvcc below
LAB="$LAB ptx"  # and its test of mma.sync, ldmatrix and cp.async (dev/cuda/cpu/test_ptx.cu)
[ $# -gt 0 ] && LAB="$*" # the files named on the command line only
# in one parallel make: about 10 s of nvcc a file, one after another they would eat gpu_check.sh's time for the lab
targets=$(for f in $LAB; do [ "$f" = wmma ] || [ "$f" = ptx ] || printf 'dev/cuda/%s ' "$f"; done)
echo "== build $targets($ARCH)"
make -B -j "$(nproc 2>/dev/null || echo 4)" --no-print-directory $targets NVCC="$NVCC" CUDA_ARCH="$ARCH" || fail=$((fail + 1))
run layernorm
run layernorm 0 4 9 36
run layernorm 0 5 29 520
run classifier
run classifier 0 27 131 256
run classifier 0 5 13 21
run attention
run attention 0 2 70 2 20
# issue 13's files, one block each
run adamw
run adamw 0 1001
run encoder
run encoder 0 3 7 20 11
run gelu
run gelu 0 1001
run matmul
run matmul 0 13 20
# tensor cores (WMMA; mma.sync, ldmatrix, cp.async): the CPU layer's own tests, their correct-program cases on the GPU
for t in wmma ptx; do
    case " $LAB " in *" $t "*)
        echo "== build dev/cuda/cpu/test_$t ($ARCH)"
        if "$NVCC" -arch="$ARCH" -O3 -std=c++17 -I. -o "dev/cuda/cpu/test_$t" "dev/cuda/cpu/test_$t.cu"; then
            LAB="$LAB cpu/test_$t"
            run "cpu/test_$t"
        else
            fail=$((fail + 1))
        fi ;;
    esac
done
echo "dev/cuda: $pass passed, $fail failed, $skip skipped (no GPU)"
[ $fail -eq 0 ]
