#!/usr/bin/env bash
# bench_failover.sh — `make bench-failover`: what protecting a run costs, and
# what a crash costs, on this machine.
#
#   scripts/bench/bench_failover.sh [--gpt2] [--steps N] [--kills K] [--save-every S]
#       --gpt2      GPT-2 124M (d12, as the README's figures; much longer
#                   here: a state and model file are 2 GB, ~9 s to write).
#                   Default: a small GPT (d4, C=256, 16M parameters, 260 MB
#                   per save) that runs in a few minutes. MODEL="--model ..."
#                   in the environment picks any other.
#       --steps N   steps per run in part 1 (default 12)
#       --kills K   kills per recovery source in part 2 (default 3)
#       --save-every S  part 2's disk saves (default 5; 20 with --gpt2:
#                   a 2 GB save takes ~5 s on this disk, about 4 steps, so
#                   every 5 keeps the disk writing all the time and every
#                   step, the first resumed one too, 3x slower)
#       --sources "memory replica disk spare"  part 2's sources (default: all)
#       --recovery-only  part 2 alone
#
# 0. The machine: cores, load, and its first-touch bandwidth: 512 MiB of
#    fresh memory written once (every page faulted in by the kernel: what a
#    trainer's start-up pays for its arrays) against a second pass over the
#    same pages. Start-up time on such a VM is page faults, not work.
# 1. Snapshot cost. The same training (B=4, T=64, all cores) with:
#      no snapshots                                   the baseline
#      memory snapshots every step, two-phase         --snapshot-every 1
#      memory snapshots every step, synchronous       --snapshot-every 1 --save-async 0
#      + disk every 10 steps, two-phase               --snapshot-every 1 --save-every 10
#      disk every 10 steps, synchronous               --save-every 10 --save-async 0
#    and the baseline again at the end (on a shared machine the other jobs'
#    load moves every row: the two baselines show by how much).
#    Printed: the mean step time (steps 3..N, wall clock from the end of
#    step 2 to the end of step N, so it includes everything a snapshot
#    costs), its overhead against the baseline, and the stall per snapshot
#    the trainer measured (the time the step waited for the copy; the whole
#    copy, and the write, when synchronous).
# 2. Recovery. A run with memory snapshots every step and disk every S is
#    killed (SIGKILL) K times per source, each time only once a complete
#    state is on disk (its state_<step>.complete marker: a kill before that
#    would leave no disk state to recover from) and the attempt before has
#    done a few steps, and restarted with --resume 1:
#      memory:  its own /dev/shm snapshot is there;
#      replica: 2 ranks (train_gpt_mpi, when built); rank 1 is killed and its
#               own snapshots removed (a replaced host): it takes the copy
#               rank 0 keeps of its state;
#      disk:    the snapshots are removed and the newest state's files
#               dropped from the page cache (posix_fadvise), so they are
#               read from the disk;
#      spare:   a hot spare (train_gpt --standby FIFO, what supervise.py
#               --spare 1 runs) has done its set-up and waits; after the
#               kill it is told to go (its "launch" column is kill -> go
#               written, "model" the wake: the locks taken); then a new
#               spare is started behind it for the next kill.
#    Then the hot spare against the cold restarts, with the goals of issue
#    17: >= 10x faster than a cold restart from disk, and crash -> first
#    resumed step <= state load + one step + 0.5 s.
#    Printed per source: the median over the kills of crash -> first
#    completed step, split into launch (to main), model (built, data opened,
#    snapshot memory mapped), state load and the first step; and the steps
#    lost (the last completed step before the kill minus the step resumed
#    from); beside the first step, "steady": the killed trainer's last 3
#    steps' median (the same flags: what a step costs in this run anyway).
# 3. Bytes written per save: one rank's state file against the full state
#    (12 bytes per parameter), and the model file.
set -eu
cd "$(dirname "$0")/../.."
STEPS=12
KILLS=3
SOURCES=""
RECOVERY_ONLY=0
SAVE_EVERY=""
MODEL=${MODEL:-"--model d4 --channels 256 --num-heads 4"}
while [ $# -gt 0 ]; do
    case $1 in
    --gpt2) MODEL="--model d12"; SAVE_EVERY=${SAVE_EVERY:-20} ;;
    --save-every) SAVE_EVERY=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --kills) KILLS=$2; shift ;;
    --sources) SOURCES=$2; shift ;;
    --recovery-only) RECOVERY_ONLY=1 ;;
    [0-9]*) STEPS=$1 ;; # (the old form: steps per run)
    *) echo "usage: $0 [--gpt2] [--steps N] [--kills K] [--save-every S] [--sources 'memory replica disk spare'] [--recovery-only]" >&2; exit 2 ;;
    esac
    shift
done
SAVE_EVERY=${SAVE_EVERY:-5}
BIN=./train_gpt
BIN_MPI=./train_gpt_mpi
PY=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d /tmp/gptc_benchfo.XXXXXX)
shm=$(mktemp -d /dev/shm/gptc_benchfo.XXXXXX)
live="" # the trainer (or mpirun) running now, killed on the way out
spare="" # a hot spare waiting (part 2), killed on the way out too
trap '[ -n "$live" ] && kill -KILL $live 2>/dev/null; [ -n "$spare" ] && { kill -KILL $spare 2>/dev/null || true; }; wait 2>/dev/null; rm -rf "$dir" "$shm"' EXIT
now_ms() { date +%s%3N; }
$PY scripts/toy_shard.py "$dir/train.bin" 400000 50257 0 >/dev/null
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%F)"
$PY - <<'EOF'
import ctypes, mmap, time
n = 512 << 20
m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
t0 = time.perf_counter(); ctypes.memset(addr, 1, n); t1 = time.perf_counter(); ctypes.memset(addr, 2, n); t2 = time.perf_counter()
try: thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1].split("]")[0]
except (OSError, IndexError): thp = "unknown"
print(f"first touch of 512 MiB of fresh memory: {(t1 - t0) * 1e3:.0f} ms = {n / (t1 - t0) / 1e9:.2f} GB/s; a second pass: "
      f"{(t2 - t1) * 1e3:.0f} ms = {n / (t2 - t1) / 1e9:.1f} GB/s (transparent huge pages: {thp})")
del addr
m.close()
EOF
COMMON="$MODEL -i $dir/train.bin -b 4 -t 64 --val-every 0 --sample-every 0 --shm-dir $shm"

step_ms() { # the mean wall-clock step time of steps 3..N in a JSONL log (so a save every 5th step counts)
    grep -o '"unix_ms": [0-9]*' "$1" | cut -d' ' -f2 | awk 'NR == 2 { a = $1 } { b = $1; n = NR } END { printf "%.0f", (b - a) / (n - 2) }'
}
if [ $RECOVERY_ONLY -eq 0 ]; then
echo
echo "1. snapshot cost (B=4, T=64, $STEPS steps)"
printf "%-46s %8s %9s   %s\n" "configuration" "ms/step" "overhead" "stall per snapshot (trainer's figure)"
base=
for cfg in "none|" "memory every step, two-phase|--snapshot-every 1" \
           "memory every step, synchronous|--snapshot-every 1 --save-async 0" \
           "memory every step + disk every 10, two-phase|--snapshot-every 1 --save-every 10" \
           "disk every 10, synchronous|--save-every 10 --save-async 0" "none, again (the drift: other load)|"; do
    label=${cfg%%|*}
    flags=${cfg#*|}
    name=$(echo "$label" | tr -c 'a-z0-9' '_')
    out=""
    [ -n "$flags" ] && out="-o $dir/$name"
    $BIN $COMMON -x "$STEPS" $flags $out --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
    ms=$(step_ms "$dir/$name.jsonl")
    if [ -z "$base" ]; then
        base=$ms
        P=$(sed -n 's/.*model: .*, \([0-9]*\) parameters.*/\1/p' "$dir/$name.out")
        echo "(model: $MODEL, $P parameters; a state is 12 x P = $(awk -v p="$P" 'BEGIN { printf "%.0f", 12 * p / 1e6 }') MB)"
    fi
    stall=$(sed -n 's/^snapshots: [0-9]* taken, stall \([0-9.]*\) ms per snapshot on average (worst \([0-9.]*\) ms).*/\1 ms (worst \2 ms)/p' "$dir/$name.out")
    awk -v l="$label" -v ms="$ms" -v b="$base" -v st="${stall:--}" \
        'BEGIN { printf "%-46s %8d %8.1f%%   %s\n", l, ms, 100 * (ms - b) / b, st }'
    awk -v ms="$ms" -v st="${stall%% *}" -v l="$label" \
        'BEGIN { if (st != "" && st != "-") printf "%-46s %8s %9s   = %.2f%% of a step\n", "", "", "", 100 * st / ms }'
    rm -rf "$dir/$name" "$shm"/gptc-*
done
echo "(load now $(cut -d' ' -f1-3 /proc/loadavg): on a shared machine the rows move with the other jobs; compare them"
echo " with the two baselines)"
fi

echo
echo "2. recovery after SIGKILL (memory snapshots every step, disk every $SAVE_EVERY; median of $KILLS kills per source)"
fadvise_dontneed() { # drop files from the page cache (they are fsync'd, so clean)
    $PY - "$@" <<'EOF'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
EOF
}
newest_complete() { # the step of the newest state_<step>.complete in $1, or 0
    local f s=0
    for f in "$1"/state_*.complete; do [ -e "$f" ] && f=${f##*/state_} && f=${f%.complete} && [ $((10#$f)) -gt $s ] && s=$((10#$f)); done
    echo $s
}
last_step() { grep -o '"step": [0-9]*, "loss"' "$1" 2>/dev/null | tail -1 | grep -o '[0-9]*' || echo 0; }
# wait_for FILE PATTERN SECONDS PID: until FILE has a line matching PATTERN;
# 1 when PID exits first or the time runs out
wait_for() {
    local i
    for ((i = 0; i < $3 * 20; i++)); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || { grep -q "$2" "$1" 2>/dev/null; return; }
        sleep 0.05
    done
    return 1
}
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
rank_pid() { # the train_gpt_mpi process of rank $2 below mpirun $1
    local p
    for p in $(descendants "$1"); do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo $p && return
    done
}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca odls_base_sigkill_timeout 0 --mca btl_vader_backing_directory $shm"
sources="memory disk spare"
if [ -x "$BIN_MPI" ] && command -v mpirun > /dev/null; then sources="memory replica disk spare"
else echo "(no $BIN_MPI or mpirun: the replica source is left out; make train_gpt_mpi)"; fi
[ -n "$SOURCES" ] && sources=$SOURCES
: > "$dir/recovery.txt"
for from in $sources; do
    run="$dir/rec_$from"
    FLAGS="$COMMON --verbose 1 -x 100000 --snapshot-every 1 --save-every $SAVE_EVERY --keep-last 2 -o $run --log-file $run.jsonl"
    launch() { # the trainer (2 ranks for the replica), in the background: $live
        if [ $from = replica ]; then $MPIRUN -np 2 $BIN_MPI $FLAGS -b 2 --threads 1 --zero 1 "$@" > "$run.$k.out" 2>&1 &
        else $BIN $FLAGS "$@" > "$run.$k.out" 2>&1 & fi
        live=$!
    }
    k=0
    launch
    wait_for "$run.0.out" '^timing: first step done' 600 $live || { echo "$from: the first run did not start:"; tail -5 "$run.0.out"; exit 1; }
    resumed=0
    for ((k = 1; k <= KILLS; k++)); do
        if [ $from = spare ]; then # the spare for this kill: set up and waiting before it
            rm -f "$dir/go"; mkfifo "$dir/go"; exec 8<> "$dir/go"
            $BIN $FLAGS --resume 1 --standby "$dir/go" > "$run.$k.out" 2>&1 &
            spare=$!
            wait_for "$run.$k.out" '^standby: ready' 600 $spare || { echo "spare $k did not get ready:"; tail -5 "$run.$k.out"; exit 1; }
        fi
        # a complete state on disk newer than the one resumed from, and a few steps past the resume
        for ((i = 0; i < 12000; i++)); do
            [ "$(newest_complete "$run")" -gt "$resumed" ] && [ "$(last_step "$run.jsonl")" -ge $((resumed + 3)) ] && break
            kill -0 $live 2>/dev/null || { echo "$from: the trainer ended:"; tail -5 "$run.$((k - 1)).out"; exit 1; }
            sleep 0.05
        done
        if [ $from = replica ]; then kill -KILL "$(rank_pid $live 1)"; else kill -KILL $live; fi
        crash=$(now_ms)
        last=$(last_step "$run.jsonl") # (before a promoted spare appends to the log)
        steady=$(grep -o '"ms": [0-9.]*' "$run.jsonl" | tail -3 | cut -d' ' -f2 | sort -n | sed -n 2p) # the median of the last 3 steps
        if [ $from = spare ]; then # as supervise.py: promote once the trainer is seen exiting (PF_EXITING), not
            for ((i = 0; i < 2000; i++)); do # after the kernel has freed its memory (the spare inherits its locks)
                f=$(sed 's/.*) //' /proc/$live/stat 2>/dev/null | cut -d' ' -f7)
                [ -z "$f" ] || [ $((f & 4)) -ne 0 ] && break
                sleep 0.001
            done
            echo go >&8
            start=$(now_ms) # (its process started long before: "launch" is kill -> go)
            exec 8>&-
        fi
        wait $live 2>/dev/null || true
        [ $from = spare ] && echo "$(( $(now_ms) - crash ))" >> "$dir/reaped.txt" # kill -> the old trainer reaped
        live=""
        if [ $from = replica ]; then rm -f "$shm"/gptc-*-state1-at1-*.bin; fi
        if [ $from = disk ]; then
            rm -f "$shm"/gptc-*
            s=$(newest_complete "$run")
            fadvise_dontneed "$run"/state_$(printf %08d "$s")_rank*.bin "$run"/model_$(printf %08d "$s").bin
        fi
        if [ $from = spare ]; then
            live=$spare
            spare=""
        else
            launch --resume 1
        fi
        wait_for "$run.$k.out" '^timing: first step done' 600 $live || { echo "$from: restart $k failed:"; tail -5 "$run.$k.out"; exit 1; }
        at() { sed -n "s/^timing: $1 at \([0-9]*\).*/\1/p" "$run.$k.out" | head -1; }
        [ $from = spare ] ||
            start=$(sed -n 's/^timing: communicator ready at [0-9]* (+[0-9]* ms since process start \([0-9]*\)).*/\1/p' "$run.$k.out" | head -1)
        resumed=$(sed -n 's/^resume: continuing after step \([0-9]*\).*/\1/p' "$run.$k.out" | head -1)
        how=$(grep -m1 '^resume: continuing' "$run.$k.out" | sed 's/.*; //')
        echo "$from $crash $start $(at 'model ready') $(at 'state loaded') $(at 'first step done') $last ${resumed:-0} ${steady%.*} $how" >> "$dir/recovery.txt"
    done
    [ -n "$live" ] && kill -KILL $live 2>/dev/null
    wait $live 2>/dev/null || true
    live=""
    rm -f "$shm"/gptc-*
done
$PY - "$dir/recovery.txt" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split(maxsplit=9)
    crash, start, model, loaded, first, last, resumed, steady = map(int, f[1:9])
    rows.setdefault(f[0], []).append((first - crash, start - crash, model - start, loaded - model, first - loaded,
                                      last - resumed, steady, f[9].strip() if len(f) > 9 else ""))
print(f"{'from':<8} {'kills':>5} {'total ms':>9} {'launch':>7} {'model':>7} {'load':>7} {'1st step':>9} {'steady':>7} {'lost':>5}   (medians; all totals)")
for src, rs in rows.items():
    med = [statistics.median(r[i] for r in rs) for i in range(7)]
    print(f"{src:<8} {len(rs):>5} {med[0]:>9.0f} {med[1]:>7.0f} {med[2]:>7.0f} {med[3]:>7.0f} {med[4]:>9.0f} {med[6]:>7.0f} {med[5]:>5.0f}"
          f"   ({', '.join(str(r[0]) for r in rs)})")
    print(f"{'':<8} resumed: {rs[-1][7]}")
if "spare" in rows:
    med = lambda src, i: statistics.median(r[i] for r in rows[src])
    hot, load, first = med("spare", 0), med("spare", 3), med("spare", 4)
    for src in ("disk", "memory"):
        if src in rows:
            print(f"hot spare vs cold restart from {src}: {med(src, 0):.0f} / {hot:.0f} ms = {med(src, 0) / hot:.1f}x faster"
                  + (" (goal >= 10x)" if src == "disk" else ""))
            # (and the recovery less the redone step, which every source pays alike)
            pre_src, pre_hot = med(src, 0) - med(src, 4), hot - first
            print(f"  before the first resumed step (crash -> state loaded): {pre_src:.0f} / {pre_hot:.0f} ms = "
                  f"{pre_src / max(pre_hot, 1.0):.1f}x faster")
    if "disk" in rows:
        print(f"(the totals include one redone step, {first:.0f} ms for the spare: no recovery with it can be more than "
              f"{med('disk', 0):.0f} / {first:.0f} = {med('disk', 0) / first:.1f}x faster than the cold restart from disk here)")
    print(f"hot spare: crash -> first resumed step {hot:.0f} ms against state load + one step + 0.5 s = {load:.0f} + "
          f"{first:.0f} + 500 = {load + first + 500:.0f} ms: {'met' if hot <= load + first + 500 else 'NOT met'}")
EOF
[ -s "$dir/reaped.txt" ] && echo "(spare: the killed trainer was reaped $(sort -n "$dir/reaped.txt" | tr '\n' ' ')ms after the kill: the kernel freeing its memory, which the promotion no longer waits for)"
echo "(spare: launch = from the kill to 'go' written, model = the wake (the locks taken); its set-up was done before)"
echo "(launch: from the kill to main(); with 2 ranks, mpirun's start too. model: building the model (zeros: the random"
echo " init waits for the verdict), the data, and mapping the snapshot memory, which from disk means allocating it anew,"
echo " as on a new host; load: finding and reading the state; 1st step: the first step, with its page faults;"
echo " steady: the killed trainer's last 3 steps' median, the same flags)"

[ $RECOVERY_ONLY -eq 1 ] || [ ! -d "$dir/rec_disk" ] && exit 0
echo
echo "3. bytes written per save"
st=$(ls "$dir"/rec_disk/state_*_rank0.bin | tail -1)
awk -v s="$(stat -c %s "$st")" -v p="$P" -v m="$(stat -c %s "$(ls "$dir"/rec_disk/model_*.bin | tail -1)")" \
    'BEGIN { printf "one rank of 1: state %.0f MB (full state 12 x P = %.0f MB), model file %.0f MB: %.0f MB per save\n",
             s / 1e6, 12 * p / 1e6, m / 1e6, (s + m) / 1e6 }'
if [ -d "$dir/rec_replica" ]; then
    st=$(ls "$dir"/rec_replica/state_*_rank1.bin | tail -1)
    awk -v s="$(stat -c %s "$st")" 'BEGIN { printf "2 ranks (ZeRO-1): each writes its slice, %.0f MB (rank 1), and sends as much to its neighbour per snapshot\n", s / 1e6 }'
fi
