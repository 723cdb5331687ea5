#!/bin/sh
# bench.sh — `make bench`: GPT-2 124M training steps (forward, backward,
# clipping, AdamW) in train_gpt.c against PyTorch on this machine, in one
# command, with the machine's fp32 matmul ceiling measured alongside.
#
#   scripts/bench.sh            (after make dev/cpu/bench_train)
#
# The baseline is made fair as the issue asks: Debian's torch with OpenBLAS's
# OpenMP build (scripts/bench_torch.sh checks it is the one loaded), all
# cores, and glibc told to keep freed memory (KEEP_HEAP=1: otherwise torch
# pays seconds of page faults per step on these VMs). Both sides report the
# median step. The ceiling is OpenBLAS sgemm on 2048^3 (through torch).
# Takes ~3-6 minutes. Numbers on a shared VM move: check /proc/loadavg first.
set -eu
cd "$(dirname "$0")/.."
[ -x dev/cpu/bench_train ] || { echo "error: build dev/cpu/bench_train first (make bench does)" >&2; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"

field() { echo "$1" | tr " " "\n" | awk -F= -v k="$2" '$1 == k { print $2 }'; }

ceiling=$(scripts/bench_torch.sh --ceiling)
echo "$ceiling"
c_gflops=$(field "$ceiling" gflops)

rows=""
for cfg in "4 64 5" "8 256 3"; do
    set -- $cfg
    ours=$(dev/cpu/bench_train "$1" "$2" "$3" | tail -n 1)
    echo "$ours"
    theirs=$(KEEP_HEAP=1 scripts/bench_torch.sh --B "$1" --T "$2" --warmup-steps 1 --steps "$3")
    echo "$theirs"
    rows="$rows$1 $2 $(field "$ours" ms/step) $(field "$ours" gflops) $(field "$ours" matmul_gflops) $(field "$ours" peak_rss_gb) $(field "$theirs" ms/step) $(field "$theirs" gflops) $(field "$theirs" peak_rss_gb)
"
done

echo
echo "GPT-2 124M training step, $(nproc) threads; fp32 matmul ceiling (OpenBLAS sgemm 2048^3): $c_gflops GFLOP/s"
printf "%-10s | %12s %8s %14s %9s | %12s %8s %9s | %s\n" "B, T" "gpt.c ms" "GFLOP/s" "matmul (ceil%)" "peak GB" "torch ms" "GFLOP/s" "peak GB" "speed-up"
printf "%s" "$rows" | while read -r B T oms ogf omm orss tms tgf trss; do
    awk -v B="$B" -v T="$T" -v oms="$oms" -v ogf="$ogf" -v omm="$omm" -v orss="$orss" -v tms="$tms" \
        -v tgf="$tgf" -v trss="$trss" -v ceil="$c_gflops" 'BEGIN {
        printf "B=%d T=%-4d | %12.0f %8.1f %7.1f (%3.0f%%) %9.2f | %12.0f %8.1f %9.2f | %.2fx\n",
               B, T, oms, ogf, omm, 100 * omm / ceil, orss, tms, tgf, trss, tms / oms }'
done

# Tokenizer: our encoder against the reference JavaScript tokenizer on the
# same ~1 MB of mixed text (needs the tokenizer files: make tokenizer).
echo
dev/tokenizer/bench_tokenizer.sh data/tokenizer
