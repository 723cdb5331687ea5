#!/bin/sh
# bench_torch.sh -- the PyTorch CPU baseline for gpt.c, against OpenBLAS's OpenMP build.
#
#   scripts/bench/bench_torch.sh            prints three parseable lines:
#     ceiling sgemm 2048^3 gflops=... blas=openblas-openmp threads=N
#     torch B=4 T=64 ms/step=... gflops=... peak_rss_gb=... blas=openblas-openmp threads=N
#     torch B=8 T=256 ms/step=... (each run in a fresh python process)
#
# Why the environment variable: Debian installs both OpenBLAS builds and points
# the libblas.so.3 / libopenblas.so.0 alternatives at openblas-pthread. torch's
# libtorch_cpu.so links libblas.so.3 and libopenblas.so.0 by soname with no
# RPATH, so putting the OpenMP build's directory first on LD_LIBRARY_PATH makes
# the loader pick it, without touching the system alternatives. bench_torch.py
# reads /proc/self/maps and prints which build was actually mapped; this script
# refuses to report numbers from any other.
#
# KEEP_HEAP=1 scripts/bench/bench_torch.sh also tells glibc malloc to keep freed memory
# (MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_) instead of unmapping it after
# every step: on these VMs re-faulting ~GBs of fresh pages each step costs torch
# seconds of system time (measured: minor faults 13.7M -> 0.9M, sys 22 s -> 2 s
# for 6 steps at B=4 T=64). A C trainer that allocates once never pays it.
#
# Uses Debian's python (/usr/bin/python3, torch 1.13); override with PYTHON=...
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}
OMPBLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
[ -e "$OMPBLAS/libopenblas.so.0" ] || {
    echo "error: $OMPBLAS/libopenblas.so.0 missing: apt-get install libopenblas0-openmp" >&2; exit 1; }
export LD_LIBRARY_PATH="$OMPBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ "${KEEP_HEAP:-0}" = 1 ]; then
    export MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736
fi

run() {
    line=$("$PY" scripts/bench/bench_torch.py "$@" | tail -n 1)
    echo "$line"
    case "$line" in
        *blas=openblas-openmp\ *) ;;
        *) echo "error: torch did not load $OMPBLAS (see blas= above)" >&2; exit 1 ;;
    esac
}
if [ $# -gt 0 ]; then  # one run with the given bench_torch.py flags
    run "$@"
    exit 0
fi
run --ceiling
run --B 4 --T 64 --warmup-steps 2 --steps 5
run --B 8 --T 256 --warmup-steps 1 --steps 3
