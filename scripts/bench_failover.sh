#!/usr/bin/env bash
# bench_failover.sh — `make bench-failover`: what protecting a run costs, and
# what a crash costs, for GPT-2 124M (d12) on this machine.
#
#   scripts/bench_failover.sh [steps per run, default 22]
#
# 1. Snapshot cost. The same training (B=4, T=64, all cores) with:
#      no snapshots                                   the baseline
#      memory snapshots every step, two-phase         --snapshot-every 1
#      memory snapshots every step, synchronous       --snapshot-every 1 --save-async 0
#      + disk every 10 steps, two-phase               --snapshot-every 1 --save-every 10
#      disk every 10 steps, synchronous               --save-every 10 --save-async 0
#    (a GPT-2 124M state and model file are 2 GB: this VM's disk takes ~5 s
#    to write and sync them, so saving more often than every ~5 steps of
#    1.1 s would outrun the disk whatever the trainer does)
#    Printed: the mean step time (steps 3..N, wall clock from the end of
#    step 2 to the end of step N, so it includes everything a snapshot
#    costs), its
#    overhead against the baseline, and the stall per snapshot the trainer
#    measured (the time the step waited for the copy; the whole copy, and
#    the write, when synchronous).
# 2. Recovery. A run with memory snapshots every step and disk every 5 is
#    killed (SIGKILL) after step 8 and restarted with --resume 1:
#      from memory: the /dev/shm snapshot is there;
#      from disk:   the snapshots are removed (a replaced host) and the state
#                   files dropped from the page cache (posix_fadvise), so they
#                   are read from the disk.
#    Printed: crash -> first completed step, split into launch (to main),
#    model (built, data opened, snapshot memory mapped), state load and the
#    first step; and
#    the steps lost (the last completed step before the kill minus the step
#    resumed from).
# 3. Bytes written per save: one rank's state file against the full state
#    (12 bytes per parameter), and the model file.
set -eu
cd "$(dirname "$0")/.."
STEPS=${1:-22}
BIN=./train_gpt
PY=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d /tmp/gptc_benchfo.XXXXXX)
shm=/dev/shm/gptc_benchfo.$$
mkdir -p "$shm"
trap 'rm -rf "$dir" "$shm"' EXIT
$PY scripts/toy_shard.py "$dir/train.bin" 400000 50257 0 >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
COMMON="--model d12 -i $dir/train.bin -b 4 -t 64 --val-every 0 --sample-every 0 --shm-dir $shm"

step_ms() { # the mean wall-clock step time of steps 3..N in a JSONL log (so a save every 5th step counts)
    grep -o '"unix_ms": [0-9]*' "$1" | cut -d' ' -f2 | awk 'NR == 2 { a = $1 } { b = $1; n = NR } END { printf "%.0f", (b - a) / (n - 2) }'
}
echo
echo "1. snapshot cost (GPT-2 124M, B=4, T=64, $STEPS steps)"
printf "%-46s %8s %9s   %s\n" "configuration" "ms/step" "overhead" "stall per snapshot (trainer's figure)"
base=
for cfg in "none|" "memory every step, two-phase|--snapshot-every 1" \
           "memory every step, synchronous|--snapshot-every 1 --save-async 0" \
           "memory every step + disk every 10, two-phase|--snapshot-every 1 --save-every 10" \
           "disk every 10, synchronous|--save-every 10 --save-async 0"; do
    label=${cfg%%|*}
    flags=${cfg#*|}
    name=$(echo "$label" | tr -c 'a-z0-9' '_')
    out=""
    [ -n "$flags" ] && out="-o $dir/$name"
    $BIN $COMMON -x "$STEPS" $flags $out --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
    ms=$(step_ms "$dir/$name.jsonl")
    [ -z "$base" ] && base=$ms
    stall=$(sed -n 's/^snapshots: [0-9]* taken, stall \([0-9.]*\) ms per snapshot on average (worst \([0-9.]*\) ms).*/\1 ms (worst \2 ms)/p' "$dir/$name.out")
    awk -v l="$label" -v ms="$ms" -v b="$base" -v st="${stall:--}" \
        'BEGIN { printf "%-46s %8d %8.1f%%   %s\n", l, ms, 100 * (ms - b) / b, st }'
    awk -v ms="$ms" -v st="${stall%% *}" -v l="$label" \
        'BEGIN { if (st != "" && st != "-") printf "%-46s %8s %9s   = %.2f%% of a step\n", "", "", "", 100 * st / ms }'
done

echo
echo "2. recovery after SIGKILL (memory snapshots every step, disk every 5)"
printf "%-12s %9s %8s %9s %8s %9s %9s %6s\n" "from" "total ms" "launch" "model" "load" "1st step" "resumed" "lost"
fadvise_dontneed() { # drop files from the page cache (they are fsync'd, so clean)
    $PY - "$@" <<'EOF'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
}
for from in memory disk; do
    run="$dir/rec_$from"
    FLAGS="$COMMON --verbose 1 -x 40 --snapshot-every 1 --save-every 5 -o $run --log-file $run.jsonl"
    $BIN $FLAGS > "$run.1.out" 2>&1 &
    pid=$!
    while ! grep -q '"step": 8,' "$run.jsonl" 2>/dev/null; do sleep 0.05; done
    last=$(grep -o '"step": [0-9]*, "loss"' "$run.jsonl" | tail -1 | grep -o '[0-9]*')
    kill -9 $pid
    crash=$($PY -c 'import time; print(int(time.time() * 1000))')
    wait $pid 2>/dev/null || true
    last=$(grep -o '"step": [0-9]*, "loss"' "$run.jsonl" | tail -1 | grep -o '[0-9]*')
    if [ $from = disk ]; then
        rm -f "$shm"/gptc-*
        fadvise_dontneed "$run"/state_*_rank0.bin
    fi
    spawn=$($PY -c 'import time; print(int(time.time() * 1000))')
    $BIN $FLAGS -x 10 --resume 1 > "$run.2.out" 2>&1 || { echo "restart failed:"; tail -5 "$run.2.out"; exit 1; }
    at() { sed -n "s/^timing: $1 at \([0-9]*\).*/\1/p" "$run.2.out"; }
    start=$(sed -n 's/^timing: communicator ready at [0-9]* (+[0-9]* ms since process start \([0-9]*\)).*/\1/p' "$run.2.out")
    resumed=$(sed -n 's/^resume: continuing after step \([0-9]*\).*/\1/p' "$run.2.out")
    awk -v f="$from" -v c="$crash" -v st="$start" -v mr="$(at 'model ready')" \
        -v ld="$(at 'state loaded')" -v fs="$(at 'first step done')" -v last="$last" -v res="${resumed:-0}" \
        'BEGIN { printf "%-12s %9d %8d %9d %8d %9d %9d %6d\n", f, fs - c, st - c, mr - st, ld - mr, fs - ld, res, last - res }'
    grep -h "resume:" "$run.2.out" | sed 's/^/    /'
done
echo "(launch: from the kill to main(); model: building the model (zeros: the random init waits for the verdict), the"
echo " data, and mapping the snapshot memory, which from disk means allocating it anew, as on a new host; load: finding"
echo " and reading the state; 1st step: the first step, with its page faults)"

echo
echo "3. bytes written per save"
st=$(ls "$dir"/rec_disk/state_*_rank0.bin | head -1)
P=$(sed -n 's/.*model: .*, \([0-9]*\) parameters.*/\1/p' "$dir/rec_disk.1.out")
awk -v s="$(stat -c %s "$st")" -v p="$P" -v m="$(stat -c %s "$(ls "$dir"/rec_disk/model_*.bin | head -1)")" \
    'BEGIN { printf "one rank of 1: state %.0f MB (full state 12 x P = %.0f MB), model file %.0f MB\n", s / 1e6, 12 * p / 1e6, m / 1e6 }'
echo "with W ranks each writes 1/W of it (its slice; see scripts/test_failover.sh for the 2-rank sizes)"
