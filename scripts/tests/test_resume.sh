#!/usr/bin/env bash
# test_resume.sh — a run stopped and resumed at any step sees exactly the
# batches an uninterrupted run sees, and ends with the same model, bit for bit.
#
#   scripts/tests/test_resume.sh [./train_gpt] [./train_gpt_mpi]   (make test-resume builds both and runs this)
#
# A tiny GPT (d1, C=16, T=8: a run starts and trains in a few milliseconds)
# trains for 3+ epochs of a tiny dataset, so that every kind of place a run
# can stop at comes up: mid-shard, the end of a shard, the end of an epoch,
# and later epochs, where --shuffle 1 draws a new shard and sample order.
# Datasets: one shard of 18 samples (4 micro-batches of 4 samples, 2 samples
# left over), and three shards of 9, 14 and 4 samples (2 + 3 + 1 micro-batches,
# leftovers 1, 2, 0). Each is trained with --shuffle 0 and 1, as one process
# (B=4) and as mpirun -np 2 (B=2 per rank: the same 4 samples per
# micro-batch), and with 2 micro-batches per step (--total-batch-size 64:
# gradient accumulation, steps that cross shards) in two more, one of them
# under ZeRO-1. Per configuration:
#   - the uninterrupted run, and the same with a state saved after every
#     step (--save-every 1 --keep-last 0): both end cmp-identical (saving
#     changes nothing);
#   - from each of those states k = 1 .. N-1 in a folder of its own, a run
#     resumed to the end: it must say it continues after step k, and its
#     steps k+1 .. N must log the same loss, lr and norm (as text) and its
#     final model be cmp-identical. Every step is a resume point, each
#     tested on its own, so a failure names the steps it happens after;
#   - a chain: --stop-at 1, then --resume 1 --stop-at 2, ... --resume 1 to
#     the end, in one folder (states written by stopped, resumed runs):
#     every link continues where the last stopped, every step's loss, lr and
#     norm and the final model as uninterrupted.
# Test the tester: the shuffled and unshuffled runs of a dataset end with
# different models (the final model shows the order of the batches), and
# the step comparison rejects a log with one loss changed in its last digit.
# Each run is under `timeout -k`. The last line is "N passed, N failed"; the
# exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./train_gpt}
BIN_MPI=${2:-./train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
dir=$(mktemp -d /tmp/gptc_resume.XXXXXX)
trap '[ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT
# ranks waiting in a collective yield the core instead of spinning (2 ranks
# on 2 cores beside other jobs)
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1"
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
# every run uses the same build, even if the tree's binaries are rebuilt meanwhile
mkdir "$dir/bin" && cp "$BIN" "$BIN_MPI" "$dir/bin/" || exit 1
BIN="$dir/bin/$(basename "$BIN")"
BIN_MPI="$dir/bin/$(basename "$BIN_MPI")"

# shards of 8n+1 tokens hold n samples of T+1 = 9 tokens (overlapping by one)
mkdir "$dir/s1" "$dir/s3"
$PY scripts/toy_shard.py "$dir/s1/train_0.bin" $((8 * 18 + 1)) 256 0 > /dev/null &&
    $PY scripts/toy_shard.py "$dir/s3/train_0.bin" $((8 * 9 + 1)) 256 1 > /dev/null &&
    $PY scripts/toy_shard.py "$dir/s3/train_1.bin" $((8 * 14 + 1)) 256 2 > /dev/null &&
    $PY scripts/toy_shard.py "$dir/s3/train_2.bin" $((8 * 4 + 1)) 256 3 > /dev/null || exit 1
declare -A STEPS=( [s1]=13 [s3]=20 ) # 3 epochs and a bit at 1 micro-batch per step
COMMON="--model d1 --channels 16 --num-heads 2 --max-seq-len 16 --vocab-size 256 -t 8 --lr 1e-2 --warmup-steps 2
        --val-every 0 --sample-every 0 --threads 1"

# "step loss lr norm" for steps $2.. of log $1, as the trainer wrote them
steps_from() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\), "lr": \([^,]*\), "norm": \([^,]*\),.*/\1 \2 \3 \4/p' "$1" | awk -v from="${2:-1}" '$1 >= from'; }
# the first step where two logs differ (from step $3 on), or nothing
first_diff() {
    paste -d'|' <(steps_from "$1" "$3") <(steps_from "$2" "$3") |
        awk -F'|' '$1 != $2 { printf "uninterrupted \"%s\", resumed \"%s\" (step loss lr norm)", $1, $2; exit }'
}
model() { printf "%s/model_%08d.bin" "$1" "$2"; }

# run_config NAME DATA NP SHUFFLE [FLAGS]: everything above for one configuration
run_config() {
    local name=$1 data=$2 np=$3 shuffle=$4 flags=${5:-} steps=${STEPS[$2]} k rc bad="" first="" out
    local cmd # an array: the shard pattern reaches the trainer unexpanded (it globs it itself)
    if [ "$np" = 1 ]; then cmd=($BIN $COMMON -b 4); else cmd=($MPIRUN -np "$np" "$BIN_MPI" $COMMON -b 2); fi
    cmd+=(-i "$dir/$data/train_*.bin" --shuffle "$shuffle" -x "$steps" $flags)
    local base="$dir/$name" final
    final=$(model "$base.ref" "$steps")

    # the uninterrupted run, plain and saving every step
    timeout -k 10 60 "${cmd[@]}" -o "$base.plain" --log-file "$base.plain.jsonl" > "$base.plain.out" 2>&1 &&
        timeout -k 10 60 "${cmd[@]}" -o "$base.ref" --log-file "$base.ref.jsonl" --save-every 1 --keep-last 0 > "$base.ref.out" 2>&1
    if [ $? -ne 0 ] || [ ! -f "$final" ]; then
        check FAIL "$name: uninterrupted run" "$(tail -q -n 3 "$base.plain.out" "$base.ref.out")"
        return
    fi
    local micro per_step epoch
    micro=$(sed -n 's/^data: .*, \([0-9]*\) micro-batches per epoch.*/\1/p' "$base.ref.out" | head -1)
    per_step=$(sed -n 's/.* per step (\([0-9]*\) micro-batches).*/\1/p' "$base.ref.out" | head -1)
    epoch=$((micro / per_step))
    local what="$name ($micro micro-batches of 4 samples per epoch, $per_step per step: $steps steps, $(awk -v s=$steps -v e=$epoch 'BEGIN { printf "%.1f", s / e }') epochs)"
    cmp -s "$(model "$base.plain" "$steps")" "$final" && [ -z "$(first_diff "$base.plain.jsonl" "$base.ref.jsonl" 1)" ] &&
        check ok "$what: uninterrupted, with and without a state saved every step: cmp-identical" ||
        check FAIL "$what: saving a state every step changes the run" "$(first_diff "$base.plain.jsonl" "$base.ref.jsonl" 1)"

    # resumed from each step's state, to the end
    for ((k = 1; k < steps; k++)); do
        local run="$base.from$k"
        mkdir "$run" && cp "$base.ref/run.id" "$base.ref"/state_$(printf %08d $k)[._]* "$run/" || return
        timeout -k 10 60 "${cmd[@]}" -o "$run" --log-file "$run.jsonl" --resume 1 > "$run.out" 2>&1
        rc=$?
        if [ $rc -eq 0 ] && grep -q "^resume: continuing after step $k;" "$run.out" &&
            cmp -s "$final" "$(model "$run" "$steps")" && [ -z "$(first_diff "$base.ref.jsonl" "$run.jsonl" $((k + 1)))" ] &&
            [ "$(steps_from "$run.jsonl" | wc -l)" = $((steps - k)) ]; then continue; fi
        bad="$bad $k"
        if [ -z "$first" ]; then
            if [ $rc -ne 0 ]; then first="after step $k: exit $rc: $(tail -2 "$run.out" | tr '\n' ' ')"
            elif ! grep -q "^resume: continuing after step $k;" "$run.out"; then first="after step $k: no 'resume: continuing after step $k'"
            else first="after step $k: $(first_diff "$base.ref.jsonl" "$run.jsonl" $((k + 1)))"; fi
        fi
    done
    # where each failing resume point lies: k=eE+M is M steps into epoch E (from 0)
    local where=""
    for k in $bad; do where="$where $k=e$((k / epoch))+$((k % epoch))"; done
    [ -z "$bad" ] && check ok "$what: resumed from the state of each step 1..$((steps - 1)) to the end: every step and the final model as uninterrupted" ||
        check FAIL "$what: resumed from each step to the end: differs when resumed after steps k=eE+M (M steps into epoch E):$where" "first: $first"

    # the chain: stop after every step, resume, stop after the next
    local chain="$base.chain" links_ok=1
    for ((k = 1; k <= steps; k++)); do
        local stop="--stop-at $k" resume="--resume 1"
        [ $k -eq "$steps" ] && stop=""
        [ $k -eq 1 ] && resume=""
        timeout -k 10 60 "${cmd[@]}" -o "$chain" --log-file "$chain.jsonl" $resume $stop > "$chain.$k.out" 2>&1
        rc=$?
        if [ $rc -ne 0 ] || { [ $k -gt 1 ] && ! grep -q "^resume: continuing after step $((k - 1));" "$chain.$k.out"; }; then
            links_ok=0
            check FAIL "$what: chain link $k (resume after step $((k - 1)))" "exit $rc: $(tail -2 "$chain.$k.out" | tr '\n' ' ')"
            break
        fi
    done
    if [ $links_ok = 1 ]; then
        out=$(first_diff "$base.ref.jsonl" "$chain.jsonl" 1)
        [ -z "$out" ] && [ "$(steps_from "$chain.jsonl" | wc -l)" = "$steps" ] && cmp -s "$final" "$(model "$chain" "$steps")" &&
            check ok "$what: chain of $steps runs (--stop-at k, --resume 1): every step and the final model as uninterrupted" ||
            check FAIL "$what: chain of $steps runs (--stop-at k, --resume 1)" "first difference: ${out:-none in the log, final model differs}"
    fi
}

# the step comparison rejects a planted wrong loss (its last digit + 1)
timeout -k 10 60 $BIN $COMMON -b 4 -i "$dir/s1/train_0.bin" -x 5 --log-file "$dir/plant.jsonl" > "$dir/plant.out" 2>&1
awk '/^{"step": 3, "loss"/ { match($0, /"loss": [0-9.]+/); v = substr($0, RSTART + 8, RLENGTH - 8)
                             sub(/"loss": [0-9.]+/, sprintf("\"loss\": %.6f", v + 1e-6)) } 1' "$dir/plant.jsonl" > "$dir/planted.jsonl"
[ "$(steps_from "$dir/plant.jsonl" | wc -l)" = 5 ] && ! cmp -s "$dir/plant.jsonl" "$dir/planted.jsonl" &&
    [ -n "$(first_diff "$dir/plant.jsonl" "$dir/planted.jsonl" 1)" ] && [ -z "$(first_diff "$dir/plant.jsonl" "$dir/plant.jsonl" 1)" ] &&
    check ok "the step comparison rejects a log with one loss changed in its last digit" ||
    check FAIL "the step comparison rejects a log with one loss changed in its last digit" "$(tail -2 "$dir/plant.out")"

for data in s1 s3; do
    for np in 1 2; do
        for shuffle in 0 1; do
            run_config "$data-np$np-shuffle$shuffle" $data $np $shuffle
        done
        # the final model shows the order of the batches: shuffled and not must differ
        a=$(model "$dir/$data-np$np-shuffle0.ref" "${STEPS[$data]}"); b=$(model "$dir/$data-np$np-shuffle1.ref" "${STEPS[$data]}")
        [ -f "$a" ] && [ -f "$b" ] && ! cmp -s "$a" "$b" &&
            check ok "$data-np$np: --shuffle 0 and 1 end with different models (the check sees the batch order)" ||
            check FAIL "$data-np$np: --shuffle 0 and 1 end with different models (the check sees the batch order)"
    done
done
# the start-up lines (issue 17's fast start): wall clock and CPU time, each with every phase; a fresh start
# draws the random init, a resumed one draws none (its weights come from the state). Tested on s1-np1-shuffle0's
# uninterrupted run and its resume after step 1; the same check on the fresh run's line, expecting none, must fail
startup_check() { # $1: the run's output, $2: "fresh" or "resumed": 0 when its start-up lines say so
    local n
    n=$(sed -n 's/^start-up: .*; random init: \([0-9]*\) normals drawn$/\1/p' "$1")
    [ "$(grep -c '^start-up: ' "$1")" = 1 ] && [ "$(grep -c '^start-up CPU time' "$1")" = 1 ] || return 1
    for phase in "allocate + first touch" "model init/load" "snapshot slots" "state load" "first step"; do
        [ "$(grep '^start-up' "$1" | grep -c "$phase [0-9]* ms")" = 2 ] || return 1
    done
    if [ "$2" = fresh ]; then [ -n "$n" ] && [ "$n" -gt 0 ]; else [ "$n" = 0 ]; fi
}
s1=$dir/s1-np1-shuffle0
startup_check "$s1.ref.out" fresh && startup_check "$s1.from1.out" resumed && ! startup_check "$s1.ref.out" resumed &&
    check ok "start-up lines: every phase in wall and CPU time; the random init drawn on a fresh start, none on a resume" ||
    check FAIL "start-up lines: every phase in wall and CPU time; the random init drawn on a fresh start, none on a resume" \
        "$(grep -h '^start-up' "$s1.ref.out" "$s1.from1.out" | cut -c1-400)"
# under mpirun the start-up line names the communicator (MPI_Init: it was "other" before), and what is left
# as "other" is at most 10% of the start-up (or 20 ms)
line=$(grep '^start-up: ' "$dir/s1-np2-shuffle0.ref.out")
split=$(startup_split "$line" communicator) &&
    check ok "start-up line, 2 ranks: the communicator named; 'other' $split" ||
    check FAIL "start-up line, 2 ranks: the communicator named, little left as 'other'" "$(cut -c1-400 <<< "$line")"
# 2 micro-batches per step (gradient accumulation; steps that cross shards and epochs)
run_config s1-np1-shuffle1-accum2 s1 1 1 "--total-batch-size 64"
run_config s3-np2-shuffle1-accum2-zero1 s3 2 1 "--total-batch-size 64 --zero 1"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
