#!/usr/bin/env bash
# test_zero3.sh — ZeRO-3, the levels of the machine and hierarchical
# reduction (gptc/zero3.h) give what one process gives, and send the bytes
# the formulas say.
#
#   scripts/tests/test_zero3.sh [./train_gpt_mpi] [./train_gpt]   (make test-zero3 builds both and runs this)
#
# A small GPT (L = 2, C = 32) trained for 8 steps on a global batch of 12
# sequences: 1 process x B=12 against mpirun -np 2, 3, 4 (3 does not divide
# the parameter count: padded shards). About 35-45 s on 2 shared cores.
# Checked:
#   - --zero 3 on one process: every loss and norm bit for bit --zero 0's;
#   - --zero 3 on np 2, 3, 4, and --topology 2x2 (2 nodes of 2 ranks) with
#     --hierarchical 1 for --zero 0, 1, 2, 3 (and 0 for 0 and 3): every step's loss, norm
#     and validation loss equal 1 process's to 1e-5 relative (the ranks sum in
#     another order: fp32 round-off), 2 micro-batches per step too;
#   - the bytes sent per step at each level, summed over the ranks, exactly
#     against the formulas in floats (N nodes of K ranks, W = N K; R the
#     floats reduced, G gathered: plain R = G = P; ZeRO-1/2 G = W shard,
#     R = P (ZeRO-2: A L layer + head, A micro-batches); ZeRO-3
#     R = A L layer + head, G = A (2 L layer + head), about 3 Psi):
#       flat:          intra (K-1)(R+G),         inter (N-1) K (R+G)
#       hierarchical:  plain intra 2 N (K-1) P,  inter 2 (N-1) P
#                      ZeRO intra N (K-1) R + (K-1) G, inter (N-1) R + (N-1) K G
#     and a planted wrong figure rejected by the same comparison; with
#     --comm-levels 1 every step's line says the same;
#   - ZeRO-3's memory per rank (weights, gradients, AdamW, gathered) against
#     its formula, and the memory plan equal to the allocation ledger byte for
#     byte (--plan-check 1) on np 1, 2, 3, and --plan 1's peak the ledger's;
#   - ZeRO-3 states: the saved final weights equal 1 process's; stopped and
#     resumed from disk and from the memory snapshots, bit for bit; resharded
#     onto 3 ranks --zero 3, 1 process --zero 0, 4 ranks --zero 1, and a
#     --zero 2 state onto 3 ranks --zero 3 (to 1e-4 of the update); a
#     rollback to a memory snapshot ends bit for bit where --zero 2's does;
#   - samples under --zero 3 (the weights gathered onto rank 0 meanwhile):
#     the text --zero 2 draws, and the plan still the ledger;
#   - bad --topology, and ranks launched with different ones, refused with a
#     clear error. (--eval-file under --zero 3: scripts/tests/test_eval.sh.)
# The last line is "N passed, N failed"; the exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-.hooks/train_gpt_mpi}
ONE=${2:-./train_gpt}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
dir=$(mktemp -d /tmp/gptc_zero3.XXXXXX)
trap 'rm -rf "$dir"' EXIT
. scripts/tests/check.sh
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 >/dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 >/dev/null || exit 1
COMMON="--model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 256 -i $dir/train.bin -j $dir/val.bin
        -t 16 -x 8 --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 4 --val-batches 2 --sample-every 0 --threads 1"
C=32; L=2; Vp=256; maxT=32
field() { grep -o "\"$2\": [-0-9.e+]*" "$1" | cut -d' ' -f2; }
# worst relative difference of a log field between two runs, or "none"
worst() {
    paste -d' ' <(field "$1" "$3") <(field "$2" "$3") 2>/dev/null |
        awk 'BEGIN { w = 0; n = 0 } { n++; d = ($1 - $2) / ($1 < 0 ? -$1 : $1); d = d < 0 ? -d : d; if (d > w) w = d }
             END { if (n == 0) print "none"; else printf "%.2e", w }'
}

# 1 process, B=12 (and 2 micro-batches of 6); --zero 3 on one process is --zero 0's arithmetic
for acc in "" "-acc"; do
    B=$([ -n "$acc" ] && echo 6 || echo 12)
    timeout -k 10 120 "$ONE" $COMMON -b $B -d 192 --log-file "$dir/one$acc.jsonl" > "$dir/one$acc.out" 2>&1 ||
        check FAIL "1 process, B=$B" "$(tail -3 "$dir/one$acc.out")"
done
P=$(sed -n 's/.*model: .*, \([0-9]*\) parameters.*/\1/p' "$dir/one.out")
HEAD=$(( (Vp + maxT) * C + 2 * C )); LAYER=$(( (P - HEAD) / L ))
timeout -k 10 120 "$ONE" $COMMON -b 12 -d 192 --zero 3 --log-file "$dir/one-z3.jsonl" > "$dir/one-z3.out" 2>&1 &&
    cmp -s <(field "$dir/one.jsonl" loss; field "$dir/one.jsonl" norm) <(field "$dir/one-z3.jsonl" loss; field "$dir/one-z3.jsonl" norm) &&
    check ok "1 process --zero 3: every loss and norm bit for bit --zero 0's" ||
    check FAIL "1 process --zero 3 equals --zero 0" "$(tail -3 "$dir/one-z3.out")"

# name np zero hierarchical topology acc
run() {
    local name=$1 np=$2 zero=$3 hier=$4 topo=$5 acc=$6
    local B=$((12 / np)) D=""
    [ -n "$acc" ] && { B=$((B / 2)); D="-acc"; }
    timeout -k 10 120 $MPIRUN -np "$np" "$BIN" $COMMON -b $B -d 192 --zero "$zero" --hierarchical "$hier" \
        ${topo:+--topology $topo} $([ "$name" = t2x2-z3-h1 ] && echo --comm-levels 1) --log-file "$dir/$name.jsonl" \
        > "$dir/$name.out" 2>&1
    if [ $? -ne 0 ]; then check FAIL "$name: run" "$(tail -5 "$dir/$name.out")"; return 1; fi
    for key in loss norm val_loss; do
        local w=$(worst "$dir/one$D.jsonl" "$dir/$name.jsonl" $key)
        [ "$w" != none ] && awk -v w="$w" 'BEGIN { exit !(w <= 1e-5) }' &&
            check ok "$name: every step's $key equals 1 process's" "worst rel diff $w (tol 1e-5)" ||
            check FAIL "$name: every step's $key equals 1 process's" "worst rel diff $w (tol 1e-5)"
    done
}
# the bytes per level per step, summed over the ranks, against the formulas
# (in floats; printed in bytes): name np N K zero hierarchical micro-batches
traffic() {
    local name=$1 np=$2 N=$3 K=$4 zero=$5 hier=$6 A=$7
    local shard=$(( (P + np - 1) / np )) R G intra inter
    case $zero in
        0) R=$P; G=$P ;;
        1) R=$P; G=$((np * shard)) ;;
        2) R=$((A * L * LAYER + HEAD)); G=$((np * shard)) ;;
        3) R=$((A * L * LAYER + HEAD)); G=$((A * (2 * L * LAYER + HEAD))) ;;
    esac
    if [ "$hier" = 0 ]; then intra=$(( (K - 1) * (R + G) )); inter=$(( (N - 1) * K * (R + G) ))
    elif [ "$zero" = 0 ]; then intra=$((2 * N * (K - 1) * P)); inter=$((2 * (N - 1) * P))
    else intra=$((N * (K - 1) * R + (K - 1) * G)); inter=$(( (N - 1) * R + (N - 1) * K * G )); fi
    local line=$(grep "bytes sent per step by level" "$dir/$name.out")
    local got_intra=$(echo "$line" | sed -n 's/.*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1/p')
    local got_inter=$(echo "$line" | sed -n 's/.*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\2/p')
    [ "$got_intra" = $((4 * intra)) ] && [ "$got_inter" = $((4 * inter)) ] &&
        check ok "$name: bytes per level per step = the formula" "intra $got_intra, inter $got_inter (R $R, G $G floats)" ||
        check FAIL "$name: bytes per level per step = the formula" "got intra '$got_intra' inter '$got_inter', want $((4 * intra)) $((4 * inter))"
    [ "$name" = t2x2-z3-h1 ] && { # --comm-levels 1: every step's line says the same
        local steps=$(grep -c "^step [0-9]*: bytes sent: intra-node $got_intra, inter-node $got_inter " "$dir/$name.out")
        [ "$steps" = 8 ] && check ok "$name --comm-levels 1: each of the 8 steps printed the same bytes per level" ||
            check FAIL "$name --comm-levels 1: per-step lines" "$steps of 8 match: $(grep -m2 'bytes sent:' "$dir/$name.out")"; }
    [ "$name" = t2x2-z3-h1 ] && { # the tester: one float more is a mismatch
        [ "$got_intra" = $((4 * intra + 4)) ] && check FAIL "planted wrong figure accepted" ||
            check ok "a planted wrong figure (one float more) is rejected by the same comparison"; }
}

# ZeRO-3 on 2, 3, 4 ranks (one node), and with 2 micro-batches on 2
for np in 2 3; do run "np$np-z3" $np 3 0 "" "" && traffic "np$np-z3" $np 1 $np 3 0 1; done # (np 4: the 2x2 runs below)
run np2-z3-acc 2 3 0 "" -acc && traffic np2-z3-acc 2 1 2 3 0 2
# 2 nodes of 2 ranks, flat and hierarchical, every stage
# (ZeRO-1/2 flat on 2x2: make bench-zero checks their bytes; scripts/tests/test_dp.sh their arithmetic)
for mode in 0-0 0-1 1-1 2-1 3-0 3-1; do
    zero=${mode%-*} hier=${mode#*-}
    run "t2x2-z$zero-h$hier" 4 $zero $hier 2x2 "" && traffic "t2x2-z$zero-h$hier" 4 2 2 $zero $hier 1
done
run t2x1-z2-h1-acc 2 2 1 2x1 -acc && traffic t2x1-z2-h1-acc 2 2 1 2 1 2
# 2 nodes of 1 rank: all of it inter-node, and hierarchical is the flat path
run t2x1-z3-h1 2 3 1 2x1 "" && traffic t2x1-z3-h1 2 2 1 3 1 1

# ZeRO-3's memory per rank: weights shard, gradients head + 2 layers + shard, AdamW 2 shard, gathered head + 2 layers
for np in 2 3; do
    shard=$(( (P + np - 1) / np ))
    line=$(grep "data parallel:" "$dir/np$np-z3.out")
    want="AdamW state $((2 * shard)) floats, gradients $((HEAD + 2 * LAYER + shard)) floats, weights $shard floats ($((HEAD + 2 * LAYER)) gathered)"
    echo "$line" | grep -q "$want" && check ok "np $np --zero 3: memory per rank = the formula" "$want" ||
        check FAIL "np $np --zero 3: memory per rank" "got '$line', want '$want'"
done
# the memory plan, byte for byte the ledger, on every rank
for np in 1 2 3; do
    timeout -k 10 120 $MPIRUN -np $np "$BIN" $COMMON -b 4 -d $((64 * np)) --zero 3 --plan-check 1 > "$dir/plan$np.out" 2>&1
    rc=$?
    n=$(grep -c "ledger == plan" "$dir/plan$np.out")
    [ $rc -eq 0 ] && [ "$n" -eq "$np" ] && check ok "np $np --zero 3 --plan-check 1: ledger == plan on every rank" \
        "$(grep -m1 'rank 0: ledger == plan' "$dir/plan$np.out" | sed 's/.*after setup/after setup/; s/; peak RSS.*//')" ||
        check FAIL "np $np --zero 3 --plan-check 1" "status $rc, $n of $np: $(grep -E 'plan check|error' "$dir/plan$np.out" | head -3)"
done

# states: save, stop and resume (bit for bit), from disk and from the memory
# snapshots, and resharded onto other rank counts and stages (to 1e-4 of
# the last steps' update, as scripts/tests/test_dp.sh)
RS="$COMMON -d 192 --shuffle 1 --save-every 4"
timeout -k 10 120 "$ONE" $RS -b 12 -x 0 -o "$dir/init" > "$dir/init.out" 2>&1
timeout -k 10 120 "$ONE" $RS -b 12 -o "$dir/rs1" > "$dir/rs1.out" 2>&1
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -b 6 --zero 3 -o "$dir/rsA" > "$dir/rsA.out" 2>&1
cmp=$($PY scripts/compare_models.py "$dir/rsA/model_00000008.bin" "$dir/rs1/model_00000008.bin" "$dir/init/model_00000000.bin" 1e-4)
[ $? -eq 0 ] && check ok "np 2 --zero 3: the saved final weights equal 1 process's" "||error||/||update|| $cmp (tol 1e-4)" ||
    check FAIL "np 2 --zero 3: the saved final weights equal 1 process's" "$cmp $(tail -2 "$dir/rsA.out")"
for src in disk memory; do
    SN=$([ $src = memory ] && echo "--snapshot-every 2 --shm-dir $dir/shm" || echo "")
    rm -rf "$dir/rsB" "$dir/shm"
    timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -b 6 --zero 3 $SN -o "$dir/rsB" --stop-at 6 > "$dir/rsB1.out" 2>&1
    [ $src = disk ] && for r in C D E; do rm -rf "$dir/rs$r"; cp -r "$dir/rsB" "$dir/rs$r"; done
    timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -b 6 --zero 3 $SN -o "$dir/rsB" --resume 1 > "$dir/rsB2.out" 2>&1
    rc=$?
    want=$([ $src = memory ] && echo "rank 0 from its own snapshot in memory" || echo "rank 0 from disk")
    [ $rc -eq 0 ] && grep -q "continuing after step 6; $want" "$dir/rsB2.out" &&
        cmp -s "$dir/rsA/model_00000008.bin" "$dir/rsB/model_00000008.bin" &&
        check ok "np 2 --zero 3: stopped at 6, resumed from $src, final weights bit for bit the uninterrupted run's" ||
        check FAIL "np 2 --zero 3: resumed from $src" "$(grep -E 'resume|error' "$dir/rsB2.out" | head -3)"
done
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -b 6 --zero 2 -o "$dir/rsF" --stop-at 6 > "$dir/rsF.out" 2>&1
# name np zero B from
reshard() {
    timeout -k 10 120 $MPIRUN -np $2 "$BIN" $RS -b $4 --zero $3 -o "$dir/$1" --resume 1 > "$dir/$1.out" 2>&1
    local cmp=$($PY scripts/compare_models.py "$dir/$1/model_00000008.bin" "$dir/rsA/model_00000008.bin" \
                "$dir/init/model_00000000.bin" 1e-4 2>&1)
    [ $? -eq 0 ] && grep -q "resume: resharding" "$dir/$1.out" &&
        check ok "$5 resumed on $2 rank(s) --zero $3 (resharded)" "||error||/||update|| $cmp (tol 1e-4)" ||
        check FAIL "$5 resumed on $2 rank(s) --zero $3" "$cmp $(grep -E 'resume|error' "$dir/$1.out" | head -2)"
}
reshard rsC 3 3 4 "a 2-rank --zero 3 state"
reshard rsD 1 0 12 "a 2-rank --zero 3 state"
reshard rsE 4 1 3 "a 2-rank --zero 3 state"
rm -rf "$dir/rsG"; cp -r "$dir/rsF" "$dir/rsG"
reshard rsG 3 3 4 "a 2-rank --zero 2 state"
# a rollback (a NaN gradient planted at step 5: back to the memory snapshot of
# step 4): --zero 3 ends bit for bit where --zero 2 does (the same sums)
for z in 2 3; do
    rm -rf "$dir/shm"
    timeout -k 10 120 $MPIRUN -np 2 -x GPTC_INJECT_NAN=5 "$BIN" $RS -b 6 --zero $z --snapshot-every 2 --shm-dir "$dir/shm" \
        --rollback-after 1 -o "$dir/rb$z" > "$dir/rb$z.out" 2>&1
done
grep -q "rollback: 1 bad steps" "$dir/rb3.out" && cmp -s "$dir/rb2/model_00000008.bin" "$dir/rb3/model_00000008.bin" &&
    check ok "np 2 --zero 3: a NaN at step 5 rolled back to step 4's snapshot; final weights bit for bit --zero 2's" ||
    check FAIL "np 2 --zero 3 rollback" "$(grep -E 'rollback|error' "$dir/rb3.out" | head -3)"
# the plan with the saver's slots and memory snapshots under ZeRO-3
rm -rf "$dir/shm"
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $RS -b 6 -x 3 --zero 3 --snapshot-every 1 --shm-dir "$dir/shm" -o "$dir/pl" \
    --plan-check 1 > "$dir/pl.out" 2>&1
[ $? -eq 0 ] && [ "$(grep -c 'ledger == plan' "$dir/pl.out")" -eq 2 ] &&
    check ok "np 2 --zero 3 with snapshots and saves: ledger == plan on both ranks" ||
    check FAIL "np 2 --zero 3 with snapshots: plan check" "$(grep -E 'plan check|error' "$dir/pl.out" | head -3)"

# sampling: the weights gathered onto rank 0 while it samples (in the plan); the text --zero 2's
for z in 2 3; do
    timeout -k 10 120 $MPIRUN -np 2 "$BIN" ${COMMON/--sample-every 0/} -b 6 -d 192 --zero $z --sample-every 4 \
        --sample-length 8 --plan-check 1 > "$dir/s$z.out" 2> "$dir/s$z.err" || check FAIL "np 2 --zero $z with sampling: run" "$(tail -2 "$dir/s$z.out")"
done
n=$(grep -c "^sample: " "$dir/s3.out")
[ "$n" -ge 2 ] && cmp -s <(grep "^sample: " "$dir/s2.out") <(grep "^sample: " "$dir/s3.out") &&
    [ "$(cat "$dir/s3.out" "$dir/s3.err" | grep -c 'ledger == plan')" -eq 2 ] &&
    check ok "np 2 --zero 3 samples: the text --zero 2 draws ($n samples); ledger == plan with the gathered weights" ||
    check FAIL "np 2 --zero 3 samples" "$(cat "$dir/s3.out" "$dir/s3.err" | grep -E '^sample|plan check|error' | head -4)"

# --plan from the flags alone: the peak the run's ledger had
ledger=$(sed -n 's/.*rank 0: ledger == plan: .* peak \([0-9]*\);.*/\1/p' "$dir/plan2.out")
timeout -k 10 120 $MPIRUN -np 2 "$BIN" $COMMON -b 4 -d 128 --zero 3 --plan 1 --memory-budget 64G > "$dir/plan.out" 2>&1
planned=$(sed -n 's/^  peak (the ledger.s) *\([0-9]*\).*/\1/p' "$dir/plan.out")
[ -n "$ledger" ] && [ "$ledger" = "$planned" ] && check ok "--plan 1 --zero 3 on 2 ranks: peak $planned bytes, the run's ledger's" ||
    check FAIL "--plan 1 --zero 3 on 2 ranks" "--plan says '$planned', the run's ledger '$ledger'"

# refusals
timeout -k 10 60 $MPIRUN -np 2 "$BIN" $COMMON -b 6 --topology 3x1 > "$dir/bad.out" 2>&1
[ $? -ne 0 ] && grep -q "error: --topology 3x1" "$dir/bad.out" && check ok "--topology 3x1 on 2 ranks refused" "$(grep -m1 error "$dir/bad.out")" ||
    check FAIL "--topology 3x1 on 2 ranks refused" "$(tail -2 "$dir/bad.out")"

timeout -k 10 60 $MPIRUN -np 2 "$BIN" $COMMON -b 3 --topology 2x2 --hierarchical 0 : -np 2 "$BIN" $COMMON -b 3 \
    --topology 1x4 --hierarchical 0 > "$dir/bad.out" 2>&1
[ $? -ne 0 ] && grep -q "differs from rank 0" "$dir/bad.out" && check ok "ranks launched with different --topology stop with a clear error" ||
    check FAIL "ranks with different --topology" "$(tail -2 "$dir/bad.out")"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
