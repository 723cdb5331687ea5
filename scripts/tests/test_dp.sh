#!/usr/bin/env bash
# test_dp.sh — data-parallel training under MPI gives what one process gives.
#
#   scripts/tests/test_dp.sh [./train_gpt_mpi]      (make test-dp builds it and runs this)
#
# A small GPT trained for 8 steps on the same global batch of 6 sequences:
# 1 process x B=6, against mpirun -np 2 x B=3 and -np 3 x B=2 (3 does not
# divide the parameter count: the shards are padded), each with plain data
# parallel (--zero 0), ZeRO-1 and ZeRO-2 (--zero 1, 2), with each layer's
# gradients reduced during backward and (--overlap 0) after it, and with 2
# micro-batches per step. Checked:
#   - the per-step losses and gradient norms, to 1e-5 relative (the ranks sum
#     in another order than one process does: fp32 round-off, nothing more);
#   - the final weights, ||error|| / ||update|| <= 1e-4 per tensor (as in
#     test_gpt.c); --zero 1 and 2 on one process: bit for bit --zero 0's;
#   - per rank, the AdamW state (2P floats, 2 x shard under ZeRO) and the
#     gradient memory each mode keeps, against their formulas;
#   - the floats each rank hands to reductions and gathers per step: P each
#     (2 Psi), P padded to W shards under ZeRO, and ZeRO-2's layers once per
#     micro-batch: a slice reduced twice or never shows here;
#   - stop and resume, bit for bit, under ZeRO-1; ZeRO-2 resumes its state;
#     resharding onto 3 ranks and onto 1 (weights to 1e-4 of the update);
#   - ranks launched with different seeds, data or model all stop with a
#     clear error instead of hanging (each run under a timeout).
# The last line is "N passed, N failed"; the exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
dir=$(mktemp -d /tmp/gptc_dp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 >/dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 >/dev/null || exit 1
COMMON="--model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 256 -i $dir/train.bin -j $dir/val.bin
        -t 16 -x 8 --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 4 --val-batches 2 --sample-every 0 --threads 1"

# the initial weights (lr 0 leaves them as initialised) and the 1-process run
timeout -k 10 120 "$BIN" $COMMON -b 6 -x 0 -o "$dir/init" > "$dir/init.out" 2>&1
# the same with 2 micro-batches per step (gradient accumulation): 192 tokens
for acc in "" "-acc"; do
    D=$([ -n "$acc" ] && echo "-d 192" || echo "")
    timeout -k 10 120 "$BIN" $COMMON -b 6 $D -o "$dir/one$acc" --log-file "$dir/one$acc.jsonl" > "$dir/one$acc.out" 2>&1
    [ $? -eq 0 ] && check ok "1 process, B=6 $D" || { check FAIL "1 process, B=6 $D" "$(tail -3 "$dir/one$acc.out")"; }
done
P=$(sed -n 's/.*model: .*, \([0-9]*\) parameters.*/\1/p' "$dir/one.out")
# the parameters outside the layers: wte (Vp x C), wpe (maxT x C), lnfw, lnfb
C=32; L=2; Vp=256; maxT=32
HEAD=$(( (Vp + maxT) * C + 2 * C )); LAYER=$(( (P - HEAD) / L ))

field() { grep -o "\"$2\": [-0-9.e+]*" "$1" | cut -d' ' -f2; }
# first: --zero on one process is the same arithmetic as plain, bit for bit
for zero in 1 2; do
    timeout -k 10 120 "$BIN" $COMMON -b 6 -d 192 --zero $zero -o "$dir/one-z$zero" > "$dir/one-z$zero.out" 2>&1 &&
        cmp -s "$dir/one-acc/model_00000008.bin" "$dir/one-z$zero/model_00000008.bin" &&
        check ok "1 process --zero $zero, 2 micro-batches: final weights bit for bit --zero 0's" ||
        check FAIL "1 process --zero $zero equals --zero 0" "$(tail -3 "$dir/one-z$zero.out")"
done
for np in 2 3; do
    B=$((6 / np))
    # plain and ZeRO-1 with each layer reduced during backward, and after it; ZeRO-2 (always during);
    # ZeRO-2 and plain with 2 micro-batches per step
    for mode in 0 1 2 0-after 1-after 2-acc 0-acc; do
        zero=${mode%%-*}
        overlap=$([ "${mode#*-}" = after ] && echo 0 || echo 1)
        acc=$([ "${mode#*-}" = acc ] && echo "-acc" || echo "")
        D=$([ -n "$acc" ] && echo "-d 192" || echo "")
        micro=$([ -n "$acc" ] && echo 2 || echo 1)
        name="np$np-zero$mode"
        timeout -k 10 120 $MPIRUN -np $np "$BIN" $COMMON -b $B $D --zero $zero --overlap $overlap -o "$dir/$name" \
            --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
        if [ $? -ne 0 ]; then check FAIL "$name: run" "$(tail -5 "$dir/$name.out")"; continue; fi
        for key in loss norm val_loss; do
            worst=$(paste -d' ' <(field "$dir/one$acc.jsonl" $key) <(field "$dir/$name.jsonl" $key) 2>/dev/null |
                awk 'BEGIN { w = 0; n = 0 } { n++; d = ($1 - $2) / ($1 < 0 ? -$1 : $1); d = d < 0 ? -d : d; if (d > w) w = d }
                     END { if (n == 0) print "none"; else printf "%.2e", w }')
            [ "$worst" != none ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }' &&
                check ok "$name: every step's $key equals 1 process's" "worst rel diff $worst (tol 1e-5)" ||
                check FAIL "$name: every step's $key equals 1 process's" "worst rel diff $worst (tol 1e-5)"
        done
        cmp=$($PY scripts/compare_models.py "$dir/$name/model_00000008.bin" "$dir/one$acc/model_00000008.bin" \
              "$dir/init/model_00000000.bin" 1e-4)
        [ $? -eq 0 ] && check ok "$name: final weights equal 1 process's" "||error||/||update|| $cmp (tol 1e-4)" ||
            check FAIL "$name: final weights equal 1 process's" "$cmp"
        # memory and traffic, against the formulas (shard = ceil(P / np), padded = np x shard)
        shard=$(( (P + np - 1) / np )); padded=$((shard * np))
        case $zero in
            0) want_state=$((2 * P)); want_grads=$P; want_red=$P; want_gat=$P ;;
            1) want_state=$((2 * shard)); want_grads=$((padded + shard)) # the whole padded buffer, and the shard's sum
               want_red=$([ $overlap = 1 ] && echo $P || echo $padded); want_gat=$padded ;;
            2) want_state=$((2 * shard)); want_grads=$((HEAD + 2 * LAYER + shard)) # head, two layer buckets, the shard
               want_red=$((micro * L * LAYER + HEAD)); want_gat=$padded ;; # the layers reduced every micro-batch
        esac
        line=$(grep "data parallel:" "$dir/$name.out")
        state=$(echo "$line" | sed -n 's/.*AdamW state \([0-9]*\) floats.*/\1/p')
        grads=$(echo "$line" | sed -n 's/.*gradients \([0-9]*\) floats.*/\1/p')
        comm=$(grep "communication per step:" "$dir/$name.out")
        red=$(echo "$comm" | sed -n 's/.*step: \([0-9]*\) floats reduced.*/\1/p')
        gat=$(echo "$comm" | sed -n 's/.* + \([0-9]*\) gathered.*/\1/p')
        [ "$state" = "$want_state" ] && check ok "$name: AdamW state per rank" "$state floats (P = $P)" ||
            check FAIL "$name: AdamW state per rank" "got $state, want $want_state"
        [ "$grads" = "$want_grads" ] && check ok "$name: gradient memory per rank" "$grads floats" ||
            check FAIL "$name: gradient memory per rank" "got $grads, want $want_grads"
        [ "$red" = "$want_red" ] && [ "$gat" = "$want_gat" ] &&
            check ok "$name: floats reduced and gathered per step (2P, padded; ZeRO-2 layers per micro-batch)" "$red + $gat" ||
            check FAIL "$name: floats reduced and gathered per step" "got $red + $gat, want $want_red + $want_gat"
    done
done

# stop and resume under ZeRO-1 on 2 ranks: each rank saves its shard of the
# moments; the resumed run ends bit-for-bit where the uninterrupted one does
RS="$COMMON -b 3 --zero 1 --shuffle 1 --save-every 4"
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -o "$dir/rsA" > "$dir/rsA.out" 2>&1 &&
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -o "$dir/rsB" --stop-at 6 > "$dir/rsB1.out" 2>&1 &&
cp -r "$dir/rsB" "$dir/rsC" && cp -r "$dir/rsB" "$dir/rsD" && cp -r "$dir/rsB" "$dir/rsE" &&
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -o "$dir/rsB" --resume 1 > "$dir/rsB2.out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ -f "$dir/rsB/state_00000006_rank1.bin" ] && grep -q "continuing after step 6" "$dir/rsB2.out" &&
    cmp -s "$dir/rsA/model_00000008.bin" "$dir/rsB/model_00000008.bin" &&
    check ok "ZeRO-1 on 2 ranks: stopped at step 6, resumed, final weights bit-for-bit the uninterrupted run's" ||
    check FAIL "ZeRO-1 on 2 ranks: stop and resume" "exit $rc: $(tail -3 "$dir/rsB2.out")"
timeout -k 10 120 $MPIRUN -np 2 "$BIN" ${RS/--zero 1/--zero 2} -o "$dir/rsC" --resume 1 --stop-at 7 > "$dir/rsB4.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "continuing after step 6" "$dir/rsB4.out" && grep -q "step     7/8" "$dir/rsB4.out" &&
    check ok "a ZeRO-1 state resumes under ZeRO-2 (the same shards)" ||
    check FAIL "a ZeRO-1 state resumes under ZeRO-2" "exit $rc: $(tail -3 "$dir/rsB4.out")"
# resharding: the 2-rank ZeRO-1 state of step 6 continued on 3 ranks (B=2) and on 1 process (B=6, plain)
for target in "3 -b 2 --zero 1 -o $dir/rsD" "1 -b 6 --zero 0 -o $dir/rsE"; do
    set -- $target
    np=$1
    shift
    timeout -k 10 120 $MPIRUN -np $np "$BIN" $RS "$@" --resume 1 > "$dir/rs$np.out" 2>&1
    rc=$?
    out=${@: -1}
    cmp=$($PY scripts/compare_models.py "$out/model_00000008.bin" "$dir/rsA/model_00000008.bin" "$dir/init/model_00000000.bin" 1e-4)
    cmprc=$?
    [ $rc -eq 0 ] && grep -q "resharding the state of 2 rank" "$dir/rs$np.out" && grep -q "continuing after step 6" "$dir/rs$np.out" &&
        [ $cmprc -eq 0 ] && check ok "a 2-rank ZeRO-1 state resharded onto $np rank(s) ($*): final weights equal the uninterrupted run's" "$cmp" ||
        check FAIL "a 2-rank ZeRO-1 state resharded onto $np rank(s)" "exit $rc: $cmp $(tail -3 "$dir/rs$np.out")"
done

# retention on 2 ranks: with a state every step and --keep-last 2, each rank keeps only its two newest files
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $COMMON -b 3 -x 6 --save-every 1 --keep-last 2 -o "$dir/keep" > "$dir/keep.out" 2>&1
left=$(cd "$dir/keep" && ls state_* 2>/dev/null | tr '\n' ' ')
[ "$left" = "state_00000005.complete state_00000005_rank0.bin state_00000005_rank1.bin state_00000006.complete state_00000006_rank0.bin state_00000006_rank1.bin " ] &&
    check ok "retention on 2 ranks: every rank keeps only the two newest states" ||
    check FAIL "retention on 2 ranks: every rank keeps only the two newest states" "left: $left"

# --data with several ranks: rank 0 tokenizes once, the others wait and reuse the cache
if [ -f data/tokenizer/gpt2_merges.bin ]; then
    cp README.md "$dir/text.txt"
    out=$(timeout -k 10 120 $MPIRUN -np 2 "$BIN" --data "$dir/text.txt" --model d2 --channels 32 --num-heads 2 \
          --max-seq-len 32 -b 2 -t 32 -x 3 --threads 1 --zero 1 --sample-every 0 --val-every 3 --val-batches 2 2>&1)
    rc=$?
    [ $rc -eq 0 ] && [ -f "$dir/text.txt.gptc/stamp.txt" ] && [ "$(echo "$out" | grep -c 'tokenized')" = 1 ] &&
        check ok "--data on 2 ranks: tokenized once, trained" ||
        check FAIL "--data on 2 ranks: tokenized once, trained" "exit $rc: $(echo "$out" | tail -3)"
else
    check FAIL "--data on 2 ranks" "no tokenizer files: run make tokenizer"
fi

# ranks that disagree stop with a message, within the timeout (no hang)
for what in "--seed 7" "-i $dir/val.bin" "--channels 64"; do
    out=$(timeout -k 10 60 $MPIRUN -np 2 "$BIN" $COMMON -b 3 : -np 1 "$BIN" $COMMON -b 3 $what 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "differs from rank 0"; then
        check ok "ranks launched with different $what stop with a clear error" "$(echo "$out" | grep -m1 'differs')"
    else
        check FAIL "ranks launched with different $what stop with a clear error" "exit $rc: $(echo "$out" | tail -3)"
    fi
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
