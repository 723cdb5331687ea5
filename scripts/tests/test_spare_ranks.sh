#!/usr/bin/env bash
# test_spare_ranks.sh — a hot spare for an MPI job (issue 17): under
# scripts/supervise.py --spare 1 around `mpirun -np 2`, a second mpirun job
# stands by (its ranks have done MPI_Init, built the model, faulted their
# memory, opened the data, mapped the snapshot slots, and wait: rank 0 on
# its FIFO, rank 1 in a broadcast from rank 0). When any rank of the active
# job dies, mpirun ends the others; the standby job is promoted, each rank
# loads its newest snapshot from memory (the shm slots outlive the dead
# job), and the run goes on bit for bit; a new standby job starts behind it.
#
#   scripts/tests/test_spare_ranks.sh [--quick] [./train_gpt_mpi]
#       --quick   only the first case (make test: ~7 s); without it, all
#                 (make test-failover-long: ~16 s)
#
# Cases, each against an uninterrupted 2-rank run (cmp of the final model,
# and every step's loss), each under `timeout -k`, every wait bounded:
#   1. SIGKILL of a rank of the active job (rank 0 or 1, drawn) 1-8 steps
#      (drawn) after the standby job is ready, twice: promoted twice;
#      prints kill -> first resumed step (from the kill, so mpirun's
#      noticing the death and ending the other rank are in it);
#   2. a rank of the standby job SIGKILLed while it waits: its mpirun ends
#      the job, the supervisor starts another, the run is untouched;
#   3. two failures faster than a standby job's set-up (GPTC_STANDBY_SETUP_MS:
#      0.8 s more): the second is a cold relaunch;
#   4. a standby job promoted where there is no snapshot and no state on
#      disk: it says so and starts from step 0.
# The last line is "N passed, N failed"; the exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
QUICK=0
[ "${1:-}" = --quick ] && { QUICK=1; shift; }
BIN_MPI=${1:-.hooks/train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
STEPS=160
command -v mpirun > /dev/null && [ -x "$BIN_MPI" ] || { echo "skipped: no mpirun or $BIN_MPI (make .hooks/train_gpt_mpi)"; echo "0 passed, 0 failed"; exit 0; }
dir=$(mktemp -d /tmp/gptc_spare_ranks.XXXXXX)
shm=$(mktemp -d /dev/shm/gptc_spare_ranks.XXXXXX)
sup=""
trap '[ -n "$sup" ] && kill -TERM $sup 2>/dev/null; wait 2>/dev/null; rm -rf "$shm"; [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT
. scripts/tests/check.sh
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 >/dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 >/dev/null || exit 1
cp "$BIN_MPI" "$dir/train_gpt_mpi" || exit 1
# odls_base_sigkill_timeout 0: a rank's death ends the others at once;
# mpi_yield_when_idle: waiting ranks yield the core (4 ranks on 2 cores)
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_vader_backing_directory $shm --mca mpi_yield_when_idle 1
        --mca odls_base_sigkill_timeout 0"
CMD="$MPIRUN -np 2 $dir/train_gpt_mpi --model d2 --channels 128 --num-heads 2 --max-seq-len 64 --vocab-size 256
     -i $dir/train.bin -j $dir/val.bin -t 64 -b 3 --zero 1 --lr 3e-3 --warmup-steps 2 --val-every 4 --val-batches 2
     --sample-every 0 --threads 1 --shuffle 1 -x $STEPS --save-every 8 --keep-last 2 --shm-dir $shm"
FINAL=$(printf "model_%08d.bin" $STEPS)
# the pid of rank R of the active job: the holder of its snapshot lock (a standby takes none)
rank_pid() { sed -n 's/^pid \([0-9]*\) .*/\1/p' "$shm"/gptc-*-at$1.lock 2>/dev/null | head -1; }
now_ms() { date +%s%3N; }

timeout -k 10 120 $CMD --snapshot-every 1 -o "$dir/ref" --log-file "$dir/ref.jsonl" > "$dir/ref.out" 2>&1 ||
    { echo "the reference run failed:"; tail -3 "$dir/ref.out"; exit 1; }
rm -f "$shm"/gptc-*

spare_run() { # spare_run NAME [FLAGS]: supervised, in the background ($sup)
    run=$1
    timeout -k 10 150 $PY scripts/supervise.py --spare 1 --heartbeat "$dir/$run.hb" --recovery-log "$dir/$run.rec.jsonl" -- \
        $CMD ${2:---snapshot-every 1} -o "$dir/$run" --log-file "$dir/$run.jsonl" > "$dir/$run.out" 2>&1 &
    sup=$!
}
# the active job's rank $3 SIGKILLed $1 steps after standby job number $2 is
# ready (its heartbeat step then + $1: a tiny model's step takes ~12 ms and a
# standby job's set-up ~20 steps, so a step fixed in advance could come
# before the spare is ready, or the run end before it); the kill's unix ms
# in $killed, the heartbeat step it aimed at in $kill_step
kill_rank_when_spare_ready() {
    wait_count "$dir/$run.out" '^\[spare\] standby: ready' "$2" || return 1
    kill_step=$(( $(hb_step "$dir/$run.hb" || echo 0) + $1 ))
    [ "$kill_step" -lt $((STEPS - 2)) ] || { echo "note: the run was at step $kill_step of $STEPS when standby job $2 was ready"; return 1; }
    wait_hb "$dir/$run.hb" "$kill_step" || return 1
    local p
    p=$(rank_pid "$3")
    [ -n "$p" ] && kill -KILL "$p" && killed=$(now_ms)
}
first_step_at() { # the unix ms of the N-th "timing: first step done" of the run (N = $1)
    grep '^timing: first step done at' "$dir/$run.out" | sed -n "$1s/^timing: first step done at \([0-9]*\).*/\1/p"
}
hot() { grep -c "recovery: attempt [0-9]* (hot spare)" "$dir/$run.out"; }
finish() { # finish LABEL EXTRA_CONDITION_RESULT DETAIL
    wait $sup
    local rc=$?
    sup=""
    [ "$2" = ok ] && [ $rc -eq 0 ] && cmp -s "$dir/ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/ref.jsonl" "$dir/$run.jsonl" &&
        check ok "$1: final model cmp-identical" "$3" ||
        check FAIL "$1" "exit $rc, $2: $3 $(grep -E 'supervisor|error' "$dir/$run.out" | tail -3 | tr '\n' ' ')"
    rm -f "$shm"/gptc-*
}

# 1. two kills at random steps of random ranks, a standby job ready each time
spare_run killed
o1=$((1 + RANDOM % 8)); r1=$((RANDOM % 2)); o2=$((1 + RANDOM % 8)); r2=$((RANDOM % 2))
ok=no ms="" s1="?" s2="?"
if kill_rank_when_spare_ready $o1 1 $r1; then
    k1=$killed s1=$kill_step
    if wait_count "$dir/$run.out" "recovery: attempt 2 (hot spare)" 1 && kill_rank_when_spare_ready $o2 2 $r2; then
        k2=$killed s2=$kill_step
        wait_count "$dir/$run.out" "recovery: attempt 3 (hot spare)" 1 &&
            ms="kill -> first resumed step $(( $(first_step_at 2) - k1 )) ms and $(( $(first_step_at 3) - k2 )) ms" && ok=ok
    fi
fi
finish "standby job (2 ranks): rank $r1 SIGKILLed at step >= $s1, rank $r2 at step >= $s2, promoted twice" \
    "$([ $ok = ok ] && [ "$(hot)" -eq 2 ] && echo ok || echo "not promoted twice ($ok)")" "$ms"
[ $QUICK -eq 1 ] && { echo "$passed passed, $failed failed"; [ $failed -eq 0 ]; exit; }

# 2. a rank of the standby job SIGKILLed while it waits: replaced, no restart
spare_run spare-killed
ok=no
if wait_count "$dir/$run.out" '^\[spare\] standby: ready' 1; then
    victim=""
    for p in $(pgrep -f -- "--standby .*/go1$" 2>/dev/null); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = train_gpt_mpi ] && tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
    done
    [ -n "$victim" ] && kill -KILL "$victim" && wait_count "$dir/$run.out" "died while waiting" 1 &&
        wait_count "$dir/$run.out" '^\[spare\] standby: ready' 2 && ok=ok
fi
finish "standby job (2 ranks): its rank 1 SIGKILLed while waiting: replaced, no restart" \
    "$([ $ok = ok ] && grep -q 'after 0 restart(s)' "$dir/$run.out" && echo ok || echo "$ok")" ""

# 3. two failures faster than a standby job's set-up: the second relaunches cold
export GPTC_STANDBY_SETUP_MS=800
spare_run twice
unset GPTC_STANDBY_SETUP_MS
ok=no
if kill_rank_when_spare_ready 4 1 1 && wait_count "$dir/$run.out" "recovery: attempt 2 (hot spare)" 1 &&
   wait_count "$dir/$run.out" "spare.*spare2 starting" 1; then
    sleep 0.3
    ! grep -q 'go2 (no lock' "$dir/$run.out" && p=$(rank_pid 0) && [ -n "$p" ] && kill -KILL "$p" && ok=ok
fi
finish "standby job (2 ranks): a second failure before the next standby job is ready: cold relaunch" \
    "$([ $ok = ok ] && grep -q 'is not ready (still setting up): killing it, cold restart' "$dir/$run.out" && [ "$(hot)" -eq 1 ] && echo ok || echo "$ok")" ""

# 4. no snapshot and no state on disk: the promoted job starts from step 0
spare_run no-state "--snapshot-every 1000 --save-every 1000"
ok=no
kill_rank_when_spare_ready 4 1 0 && ok=ok
finish "standby job (2 ranks): promoted with no snapshot and no state: says so, starts from step 0" \
    "$([ $ok = ok ] && grep -q '^resume: no training state in .* or in memory: starting from step 0' "$dir/$run.out" && [ "$(hot)" -eq 1 ] && echo ok || echo "$ok")" ""

[ -z "$(pgrep -f -- "-o $dir/" 2>/dev/null)" ] && check ok "no rank of any job left behind" ||
    check FAIL "no rank of any job left behind" "$(pgrep -af -- "-o $dir/")"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
