#!/usr/bin/env bash
# test_cuda_spare.sh — the GPU trainer's hot spare (train_gpt.cu's
# gpu_standby, --standby FIFO, issue 17), executed on the CPU
# (./train_gpt_cu_cpu: dev/cuda/cpu; not run on a GPU). The spare does the
# whole set-up (device memory, cuBLASLt, kernels, the snapshot slots mapped)
# and waits on its FIFO without a lock; promoted, it takes the run's locks
# and resumes from the newest memory snapshot.
#
#   scripts/tests/test_cuda_spare.sh [./train_gpt_cu_cpu]     (make test-cuda-spare)
#
# A tiny GPT (d2, C=64, T=32, B=2: ~0.5 s a step on the CPU layer) trains
# 16 steps with a memory snapshot after every step and a save every 8,
# against an uninterrupted run of the same command (the reference). Cases,
# each under `timeout -k`, every wait bounded:
#   1. promoted: under scripts/supervise.py --spare 1 the active trainer (the
#      holder of the run's lock) is SIGKILLed 1-3 steps (drawn) after the
#      heartbeat step at which the spare printed "standby: ready" (a step
#      fixed in advance could come before the spare is ready); the
#      supervisor promotes it ("recovery: attempt 2 (hot spare)"), the spare
#      says it takes the run over and resumes from memory; the final model
#      is cmp-identical to the reference and every step's loss, lr and norm
#      (the --log-file JSONL, the last line of each step) are the same text;
#   2. dismissed: a run stopped at step 4 (--stop-at: its memory snapshots
#      stay), then a spare started on it by hand, its FIFO closed once it is
#      ready (what the supervisor does at the end of a run): it says so and
#      exits 0, and no byte of the run's folder, its memory snapshots or its
#      log changed; the run then resumed to the end is cmp-identical to the
#      reference;
#   3. refused: --standby without --output-dir (nothing to take over), and
#      with ranks that meet through --init file: (no MPI to carry rank 0's
#      word to the others): a clear error, exit non-zero, nothing written;
#   4. a standby JOB (when mpirun is here): case 1 with 2 emulated GPUs under
#      mpirun (NCCL over MPI), a second mpirun job standing by (rank 0 on the
#      FIFO, rank 1 in a broadcast from it), a rank drawn SIGKILLed: the whole
#      job promoted, each rank from its own memory snapshot, against a 2-rank
#      reference.
# About 1 minute on two shared cores. The last line is "N passed, N failed"; the
# exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./train_gpt_cu_cpu}
PY=${PYTHON:-/usr/bin/python3}
STEPS=16
[ -x "$BIN" ] || { echo "test_cuda_spare: $BIN not built: make train_gpt_cu_cpu"; exit 1; }
dir=$(mktemp -d /tmp/gptc_cuda_spare.XXXXXX)
shm=$(mktemp -d /dev/shm/gptc_cuda_spare.XXXXXX) # the memory snapshots: a folder of our own, removed at the end
sup=""
spare=""
trap '[ -n "$sup" ] && kill -TERM $sup 2>/dev/null; [ -n "$spare" ] && kill -TERM $spare 2>/dev/null; wait 2>/dev/null
      rm -rf "$shm"; [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT
. scripts/tests/check.sh # check ok|FAIL what [detail], $passed, $failed, $CLEAN_ENV
CHECK_START=$(date +%s)
$PY scripts/toy_shard.py "$dir/train.bin" 20000 256 0 > /dev/null || { echo "cannot write $dir/train.bin"; exit 1; }
CMD="$BIN --model d2 --channels 64 --num-heads 2 --max-seq-len 32 --vocab-size 256 -i $dir/train.bin
     -t 32 -b 2 -x $STEPS --lr 3e-3 --warmup-steps 2 --val-every 0 --sample-every 0 --shuffle 1
     --snapshot-every 1 --save-every 8 --shm-dir $shm"
FINAL=$(printf "model_%08d.bin" $STEPS)

# Helpers (steps_table, same_steps, hb_step, wait_hb, wait_count:
# scripts/tests/check.sh): every step logged, each step's last logged loss, lr and
# norm equal; the active trainer, by its lock (a spare takes none until
# promoted); rank R's, by its snapshot lock.
same_steps_all() { ! steps_table "$1" | grep -q missing && same_steps "$1" "$2"; }
lock_holder() { sed -n 's/^pid \([0-9]*\) .*/\1/p' "$1/.lock" 2>/dev/null; }
rank_pid() { sed -n 's/^pid \([0-9]*\) .*/\1/p' "$shm"/gptc-*-at$1.lock 2>/dev/null | head -1; } # rank R's snapshot lock
fingerprint() { # every file of the folders given, with its size and checksum (a missing folder: nothing)
    local d
    for d in "$@"; do [ -e "$d" ] && find "$d" -type f -print0 | sort -z | xargs -0 -r md5sum; done
}

# reference NAME CMD...: an uninterrupted run of the command (stops the script when it fails)
reference() {
    local name=$1
    shift
    $CLEAN_ENV timeout -k 10 120 "$@" -o "$dir/$name" --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 &&
        [ -s "$dir/$name/$FINAL" ] || { echo "the reference run $name failed:"; tail -3 "$dir/$name.out"; exit 1; }
    rm -rf "${shm:?}"/*
}
# promoted WHAT RANKS CMD...: under supervise.py --spare 1, the active trainer
# (RANKS 1: the holder of the run's lock; 2: a rank drawn, the holder of its
# snapshot lock) SIGKILLed 1-3 steps (drawn) after the heartbeat step at which
# the spare (job) printed "standby: ready": promoted, bit for bit the
# reference (ref, or ref2 for 2 ranks)
promoted() {
    local what=$1 ranks=$2 ref=ref run=killed$2 offset=$((1 + RANDOM % 3)) victim=0 kill_step="?" ok="no spare ready" t
    shift 2
    [ "$ranks" -gt 1 ] && ref=ref$ranks && victim=$((RANDOM % ranks))
    $CLEAN_ENV timeout -k 10 150 $PY scripts/supervise.py --spare 1 --heartbeat "$dir/$run.hb" \
        --recovery-log "$dir/$run.rec.jsonl" -- "$@" -o "$dir/$run" --log-file "$dir/$run.jsonl" > "$dir/$run.out" 2>&1 &
    sup=$!
    if wait_count "$dir/$run.out" '^\[spare\] standby: ready' 1; then
        kill_step=$(( $(hb_step "$dir/$run.hb" || echo 0) + offset ))
        ok="the run was at step $((kill_step - offset)) of $STEPS when the spare was ready"
        if [ "$kill_step" -lt $((STEPS - 3)) ] && wait_hb "$dir/$run.hb" "$kill_step"; then
            [ "$ranks" -eq 1 ] && t=$(lock_holder "$dir/$run") || t=$(rank_pid "$victim")
            ok="no lock holder"
            [ -n "$t" ] && kill -KILL "$t" && ok="not promoted" &&
                wait_count "$dir/$run.out" "recovery: attempt 2 (hot spare)" 1 && ok=ok
        fi
    fi
    wait $sup
    local rc=$?
    sup=""
    local resumed
    resumed=$(sed -n 's/^supervisor: recovery: attempt 2 (hot spare).*resumed from step \([0-9]*\).*/\1/p' "$dir/$run.out")
    [ "$ranks" -gt 1 ] && what="$what: rank $victim"
    check "$([ "$ok" = ok ] && grep -q '^standby: promoted: taking the run over' "$dir/$run.out" && echo ok || echo "$ok")" \
        "promoted, $what SIGKILLed at step >= $kill_step (the spare ready + $offset): the spare takes the run over" \
        "$(grep '^supervisor: recovery:' "$dir/$run.out" | sed 's/^supervisor: recovery: //')"
    # (the GPU hands a snapshot to the Saver one step later than the CPU trainer: gpu_snapshot_hand_over)
    check "$([ $rc -eq 0 ] && grep -q 'attempt 2 finished (exit status 0) after 1 restart(s)' "$dir/$run.out" &&
            [ "$(grep -c '^resume: continuing after step [0-9]*;.* from its own snapshot in memory' "$dir/$run.out")" -eq 1 ] &&
            ! grep '^resume: continuing' "$dir/$run.out" | grep -q 'from the neighbour\|from disk' &&
            [ -n "$resumed" ] && [ "$resumed" -ge $((kill_step - 2)) ] && echo ok || echo "exit $rc")" \
        "promoted, $what: resumed from memory at step $resumed (>= $kill_step - 2), the run finished" \
        "$(grep -E '^resume:|supervisor.*(finished|giving up)|error' "$dir/$run.out" | tail -3 | tr '\n' ' ')"
    check "$(cmp -s "$dir/$ref/$FINAL" "$dir/$run/$FINAL" && same_steps_all "$dir/$ref.jsonl" "$dir/$run.jsonl" && echo ok)" \
        "promoted, $what: the final model cmp-identical to the reference, every step's loss, lr and norm its" \
        "$(steps_table "$dir/$run.jsonl" | grep -vc missing) steps logged"
    rm -rf "${shm:?}"/*
}

# 1. one process: the trainer SIGKILLed once the spare is ready
reference ref $CMD
check ok "reference: $STEPS steps uninterrupted"
promoted "one process: the trainer" 1 $CMD

# 2. a spare dismissed (its FIFO closed once it is ready): exit 0, nothing written
run=dismissed
$CLEAN_ENV timeout -k 10 60 $CMD -o "$dir/$run" --log-file "$dir/$run.jsonl" --stop-at 4 > "$dir/$run.stop.out" 2>&1
rc=$?
before=$(fingerprint "$dir/$run" "$shm" "$dir/$run.jsonl")
fifo="$dir/go"
mkfifo "$fifo" || exit 1
exec 3<> "$fifo" # held open by us: the spare's open does not block, and it reads the FIFO's end only when we close it
$CLEAN_ENV timeout -k 10 60 $CMD -o "$dir/$run" --log-file "$dir/$run.jsonl" --resume 1 --standby "$fifo" --verbose 1 \
    > "$dir/$run.out" 2>&1 3>&- & # (3>&-: were the spare a writer of its own FIFO, it would never read its end)
spare=$!
ready=no
wait_count "$dir/$run.out" '^standby: ready; waiting' 1 && ready=yes
exec 3>&-
wait $spare
src=$?
spare=""
after=$(fingerprint "$dir/$run" "$shm" "$dir/$run.jsonl")
check "$([ $rc -eq 0 ] && [ $ready = yes ] && [ $src -eq 0 ] && grep -q '^standby: dismissed' "$dir/$run.out" &&
        ! grep -q -e '^standby: promoted' -e '^resume:' -e '^step ' "$dir/$run.out" && echo ok ||
        echo "stop-at exit $rc, ready $ready, spare exit $src")" \
    "dismissed: the spare's FIFO closed once it is ready: it says so, exits 0" "$(grep '^standby:' "$dir/$run.out" | tail -1)"
check "$([ -n "$before" ] && [ "$before" = "$after" ] && echo ok || diff <(echo "$before") <(echo "$after") | tr '\n' ' ')" \
    "dismissed: no byte of the run's folder, memory snapshots and log changed" "$(echo "$before" | wc -l) files"
$CLEAN_ENV timeout -k 10 60 $CMD -o "$dir/$run" --log-file "$dir/$run.jsonl" --resume 1 > "$dir/$run.rest.out" 2>&1
rc=$?
check "$([ $rc -eq 0 ] && cmp -s "$dir/ref/$FINAL" "$dir/$run/$FINAL" && same_steps_all "$dir/ref.jsonl" "$dir/$run.jsonl" &&
        echo ok || echo "exit $rc")" "dismissed: the run resumed to the end, cmp-identical to the reference (losses too)" \
    "$(grep '^resume:' "$dir/$run.rest.out")"
rm -rf "${shm:?}"/*

# 3. refused before anything is set up or written
refused() { # refused NAME PATTERN [ENV...] -- FLAGS...: exit non-zero, the message, no output folder
    local name=$1 pattern=$2 envs=()
    shift 2
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    $CLEAN_ENV "${envs[@]}" timeout -k 10 60 $CMD "$@" --standby "$dir/no-fifo" > "$dir/$name.out" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pattern" "$dir/$name.out" && [ ! -e "$dir/$name" ] &&
        [ -z "$(ls -A "$shm")" ] && echo ok || echo "exit $rc: $(tail -1 "$dir/$name.out")"
}
check "$(refused no-dir '^error: --standby waits to take over a run: it needs --resume 1 and the run.s --output-dir' \
         -- --resume 1)" "refused: --standby without --output-dir (no states to take over)" "$(tail -1 "$dir/no-dir.out")"
check "$(refused rendezvous '^error: --standby with ranks that meet through --init file:/tcp: cannot stand by together' \
         RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 -- --resume 1 -o "$dir/rendezvous" --init "file:$dir/rendezvous.id")" \
    "refused: --standby with ranks that meet through --init file: (no MPI for rank 0's word)" "$(tail -1 "$dir/rendezvous.out")"

# 4. a standby JOB: 2 emulated GPUs under mpirun (NCCL over MPI), a second
# mpirun job stands by (rank 0 on the FIFO, rank 1 in a broadcast from it:
# standby_wait_ranks); a rank of the active job SIGKILLed, mpirun ends the
# other (odls_base_sigkill_timeout 0: at once), the whole standby job takes over
if command -v mpirun > /dev/null; then
    MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_vader_backing_directory $shm --mca mpi_yield_when_idle 1
            --mca odls_base_sigkill_timeout 0"
    reference ref2 $MPIRUN -np 2 $CMD --init mpi --comm-timeout 60
    promoted "a standby job of 2 emulated GPUs (mpirun)" 2 $MPIRUN -np 2 $CMD --init mpi --comm-timeout 60
else
    echo "note: no mpirun: the standby job of 2 emulated GPUs is not checked"
fi

[ -z "$(pgrep -f -- "-o $dir/" 2>/dev/null)" ] && check ok "no trainer or spare left behind" ||
    check FAIL "no trainer or spare left behind" "$(pgrep -af -- "-o $dir/")"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
