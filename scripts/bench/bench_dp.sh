#!/usr/bin/env bash
# bench_dp.sh — `make bench-dp`: data-parallel scaling on this machine.
# GPT-2 124M (d12), T=64, one OpenMP thread per rank, 4 timed steps after one
# untimed, median step time from the JSONL log:
#   1 rank  x B=4                     the baseline
#   2 ranks x B=4 (weak scaling)      same work per rank: efficiency = t1 / t2
#   2 ranks x B=2 (strong scaling)    same global batch:  efficiency = t1 / (2 t2)
# for plain data parallel and ZeRO-1 (gradients reduced after backward, or
# layer by layer during it) and ZeRO-2, with the memory per rank (parameters
# + gradients + AdamW state, MB), the time spent inside collectives and the
# part of it left after backward.
set -eu
cd "$(dirname "$0")/../.."
BIN=./train_gpt_mpi
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none"
dir=$(mktemp -d /tmp/gptc_benchdp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
$PY scripts/toy_shard.py "$dir/train.bin" 200000 50257 0 >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
run() { # run NAME NP B ZERO OVERLAP -> median step ms (steps 2..5)
    local name=$1 np=$2 b=$3 zero=$4 overlap=$5
    $MPIRUN -np "$np" $BIN --model d12 -i "$dir/train.bin" -b "$b" -t 64 -x 5 --threads 1 --zero "$zero" --overlap "$overlap" \
        --val-every 0 --sample-every 0 --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
    grep -o '"ms": [0-9.]*' "$dir/$name.jsonl" | tail -n 4 | cut -d' ' -f2 | sort -n | awk '{ a[NR] = $1 } END { printf "%.0f", (a[2] + a[3]) / 2 }'
}
comm() { sed -n 's/.*step: \([0-9]*\) floats reduced.*; \([0-9.]*\) ms inside collectives, \([0-9.]*\) ms of it after backward (\([-0-9]*\)% hidden).*/\2 \3 (\4% hidden)/p' "$dir/$1.out"; }
mem() { sed -n 's/memory per rank: parameters \([0-9]*\) MB, gradients \([0-9]*\) MB, AdamW \([0-9]*\) MB.*/\1+\2+\3/p' "$dir/$1.out"; }
t1=$(run one 1 4 0 0)
printf "%-46s %8s %10s  %-14s %s\n" "configuration" "ms/step" "efficiency" "MB p+g+AdamW" "ms in collectives, of which after backward"
printf "%-46s %8s %10s  %-14s %s\n" "1 rank x B=4" "$t1" "-" "$(mem one)" "-"
for mode in "0 0 allreduce after backward" "0 1 allreduce during backward" "1 0 ZeRO-1 after backward" \
            "1 1 ZeRO-1 during backward" "2 1 ZeRO-2"; do
    set -- $mode
    zero=$1 overlap=$2
    shift 2
    label="$*"
    tw=$(run weak$zero$overlap 2 4 $zero $overlap)
    ts=$(run strong$zero$overlap 2 2 $zero $overlap)
    awk -v t1="$t1" -v t="$tw" -v c="$(comm weak$zero$overlap)" -v m="$(mem weak$zero$overlap)" -v l="$label" 'BEGIN { printf "%-46s %8.0f %9.0f%%  %-14s %s\n", "2 ranks x B=4 (weak), " l, t, 100 * t1 / t, m, c }'
    awk -v t1="$t1" -v t="$ts" -v c="$(comm strong$zero$overlap)" -v m="$(mem strong$zero$overlap)" -v l="$label" 'BEGIN { printf "%-46s %8.0f %9.0f%%  %-14s %s\n", "2 ranks x B=2 (strong), " l, t, 100 * t1 / (2 * t), m, c }'
done
echo "hidden: the share of the time inside collectives that was spent during backward (1 - after / inside)"
