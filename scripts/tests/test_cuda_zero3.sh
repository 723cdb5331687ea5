#!/bin/bash
# scripts/tests/test_cuda_zero3.sh — the GPU trainer's --zero 3 (issue 15:
# train_gpt.cu, the bf16 weights sharded, each layer all-gathered before its
# forward and again before its backward into one of two buffers, the head
# gathered once per forward), executed on the CPU (./train_gpt_cu_cpu, one
# MPI rank per emulated GPU, NCCL over MPI: dev/cuda/cpu/NCCL.md). Not run
# on a GPU.
#
#   scripts/tests/test_cuda_zero3.sh      # make test-cuda-zero3 builds and runs it (not in make test)
#
# A small GPT (L = 3, odd: the backward's first gather is into buffer 0 and
# the last forward's in buffer 0 too; C = 64, T = 64), 3 steps of 2
# micro-batches, --zero 2 against --zero 3 on the same run:
#   - 1 GPU (one rank of the sharded code); 2 GPUs; 3 GPUs with --recompute 3 (backward's recomputed GEMMs read
#     the weights gathered again); 4 GPUs as --topology 2x2 --hierarchical 1
#     (gradients reduced by level, weights gathered flat): the losses and
#     norms as logged and the final model file (the fp32 master) equal bit
#     for bit. They must be: ZeRO-3 reads the same bf16 weights (gathered
#     from the shards that ZeRO-2 all-gathers after each update), sums the
#     same gradients in the same slots and order and runs the same AdamW on
#     the same shard; only where the weights come from differs;
#   - validation (--val-every 1: forward-only passes that gather too) equal
#     to --zero 2's, 2 GPUs;
#   - the device memory plan == the allocation ledger (--plan-check 1, after
#     set-up and after training), and the bf16 weights held = the formula
#     2 B x (Pr + 2 Pl): the gathered head and two layers (against 2 B x P
#     under ZeRO-2); the shard (2 B x S) is the "ZeRO shard" component, as
#     under ZeRO-2;
#   - the bytes sent per step, summed over the ranks, exactly the formula
#     (gptc/cuda/zero.cuh above dp_gather_bucket; N nodes of K, W = N K ranks, A
#     micro-batches, Pl = W x the layer piece, Pr = W x the rest's piece,
#     P' = L Pl + Pr, G = 2 A (Pr + 2 L Pl) the gathers' bf16 bytes):
#       flat          intra (K-1)(4 P' A + G)                 inter (N-1) K (4 P' A + G)
#       hierarchical  intra N (K-1) 4 P' A + (K-1) G          inter (N-1) 4 P' A + (N-1) K G
#     every step's line and the end's; against ZeRO-2's the gathers are
#     G = 2 P' (one per step);
#   - training states: a --zero 3 state saved at step 2, resumed on 2 GPUs
#     --zero 3 and a --zero 2 state resumed under --zero 3: the final model
#     bit for bit the uninterrupted run's;
#   - planted (copies of gptc/cuda/zero.cuh built through the layer): backward
#     gathering layer L-2 where L-1 belongs must break the equality; the
#     compute stream not waiting for a gather (w_ready), and a gather not
#     waiting for the buffer's last reader (w_free), must each be reported
#     by the layer's race check between streams (the unplanted runs above
#     report none: they exit 0);
#   (ZeRO++ on top, --qwz, --qgz, --hpz: scripts/tests/test_cuda_zeropp.sh.)
# About 5 minutes on two shared cores. The last line is "cuda zero3: N
# passed, N failed"; exit status non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
. scripts/tests/check.sh         # check ok|FAIL what [detail], $passed, $failed, $CLEAN_ENV
. scripts/tests/emulated_gpus.sh # emulated_begin, emulated_run, emulated_final, emulated_lines
emulated_begin cuda_zero3 test-cuda-zero3 # $BIN $PY $LOG $START $MPIRUN
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 400000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
C=64; L=3; Vp=256; maxT=64; T=64; B=2; A=2; STEPS=3
SMALL="--model d$L --channels $C --num-heads 2 --max-seq-len $maxT --vocab-size $Vp --train-data $TOY --seq-len $T
       --batch-size $B --steps $STEPS --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 0 --sample-every 0"

# gpus NAME W FLAGS...: W emulated GPUs (MPI ranks), A micro-batches; rank 0's output in NAME.log, checkpoints in NAME/
gpus() { emulated_run "$@"; }
final() { emulated_final "$1"; }
lines() { emulated_lines "$1" "$2"; } # every logged value of a field
# equal A B: the losses, norms (and val losses) as logged and the final models, both runs complete
equal() {
    [ "$(lines "$1" loss | wc -l)" -eq "$STEPS" ] && cmp -s <(lines "$1" loss) <(lines "$2" loss) &&
        cmp -s <(lines "$1" norm) <(lines "$2" norm) && cmp -s <(lines "$1" val_loss) <(lines "$2" val_loss) &&
        [ -f "$(final "$1")" ] && cmp -s "$(final "$1")" "$(final "$2")"
}

# ---- the formulas --------------------------------------------------------------
layer=$(( 12 * C * C + 13 * C )) rest=$(( Vp * C + maxT * C + 2 * C ))
P=$(( rest + L * layer ))
# sizes W: "Pl Pr P' S" (pieces of 64 W elements)
sizes() {
    local w=$1 unit=$(( 64 * $1 )) pl pr
    pl=$(( (layer + unit - 1) / unit * unit )) pr=$(( (rest + unit - 1) / unit * unit ))
    echo "$pl $pr $(( L * pl + pr )) $(( (L * pl + pr) / w ))"
}
# expect ZERO N K HIER: "intra inter", summed over the ranks
expect() {
    local z=$1 n=$2 k=$3 h=$4 s pl pr pp g
    s=$(sizes $(( n * k ))) pl=${s%% *} s=${s#* } pr=${s%% *} s=${s#* } pp=${s%% *}
    g=$([ "$z" -eq 3 ] && echo $(( 2 * A * (pr + 2 * L * pl) )) || echo $(( 2 * pp )))
    if [ "$h" -eq 0 ]; then echo "$(( (k - 1) * (4 * pp * A + g) )) $(( (n - 1) * k * (4 * pp * A + g) ))"
    else echo "$(( n * (k - 1) * 4 * pp * A + (k - 1) * g )) $(( (n - 1) * 4 * pp * A + (n - 1) * k * g ))"; fi
}
measured() { sed -n 's/^bytes sent per step by level .*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1 \2/p' "$LOG/$1.log" | tail -n 1; }
steps_agree() { [ "$(grep -c "^step [0-9]*: bytes sent: intra-node ${2% *}, inter-node ${2#* } (summed" "$LOG/$1.log")" -eq "$STEPS" ]; }
ledger() { sed -n "s/^plan-check: rank 0, after setup: ledger by component: .*bf16 weights=\([0-9]*\);.*/\1/p" "$LOG/$1.log"; }
echo "P = $P parameters (L = $L, C = $C), $A micro-batches a step, $STEPS steps"

# ---- --zero 2 against --zero 3 --------------------------------------------------
# case NAME W N K HIER FLAGS...
run_case() {
    local name=$1 w=$2 n=$3 k=$4 h=$5 z rc want got s pl pr
    shift 5
    for z in 2 3; do
        gpus ${name}_z$z $w --zero $z --plan-check 1 --comm-levels 1 "$@"
        rc=$?
        [ $rc -eq 0 ] || { echo "  (${name}_z$z: rc=$rc)"; tail -n 12 "$LOG/${name}_z$z.log"; }
        want=$(expect $z $n $k $h) got=$(measured ${name}_z$z)
        check "$([ $rc -eq 0 ] && [ "$got" = "$want" ] && steps_agree ${name}_z$z "$want" && echo ok)" \
            "$name --zero $z: bytes per step intra-node, inter-node = the formula, every step" "measured $got, formula $want"
    done
    check "$(equal ${name}_z3 ${name}_z2 && echo ok)" "$name: --zero 3 = --zero 2 bit for bit (losses, norms, val losses, final model)" \
        "z3 losses $(lines ${name}_z3 loss | cut -d' ' -f2 | tr '\n' ' ')"
    check "$([ "$(grep -c '^plan-check: rank 0, .*: equal$' "$LOG/${name}_z3.log")" = 2 ] && echo ok)" \
        "$name --zero 3: device memory plan == ledger (--plan-check 1, after set-up and after training)" \
        "$(grep -m 1 '^plan-check: rank 0, after setup: plan' "$LOG/${name}_z3.log" | cut -c1-100)"
    s=$(sizes $w) pl=${s%% *} s=${s#* } pr=${s%% *}
    check "$([ "$(ledger ${name}_z3)" = $(( 2 * (pr + 2 * pl) )) ] && [ "$(ledger ${name}_z2)" = $(( 2 * P )) ] && echo ok)" \
        "$name: bf16 weights held: --zero 3 2 B x (Pr + 2 Pl), --zero 2 2 B x P" \
        "$(ledger ${name}_z3) = 2 x ($pr + 2 x $pl); $(ledger ${name}_z2) = 2 x $P"
}
run_case w2 2 1 2 0 --val-data "$TOY" --val-every 1 --val-batches 2
run_case w3_recompute3 3 1 3 0 --recompute 3
run_case w4_2x2_hier 4 2 2 1 --topology 2x2 --hierarchical 1
# one GPU: one rank of the sharded code (nothing sent; the gathers copy the shard)
gpus w1_z2 1 --zero 2
gpus w1_z3 1 --zero 3 --plan-check 1
check "$(equal w1_z3 w1_z2 && [ "$(grep -c '^plan-check: rank 0, .*: equal$' "$LOG/w1_z3.log")" = 2 ] && echo ok)" \
    "1 GPU: --zero 3 = --zero 2 bit for bit, plan == ledger" "z3 losses $(lines w1_z3 loss | cut -d' ' -f2 | tr '\n' ' ')"
grep -q "^data parallel: ZeRO-3" "$LOG/w2_z3.log" && grep -q "val_loss" "$LOG/w2_z3.jsonl" ||
    check FAIL "w2 --zero 3 says ZeRO-3 and validates" "$(grep -m 1 '^data parallel' "$LOG/w2_z3.log" | cut -c1-80)"

# ---- training states ----------------------------------------------------------------
resumed() { rm -rf "$LOG/$1"; cp -r "$LOG/$2" "$LOG/$1"; rm -f "$LOG/$1/state_00000003.complete" "$(final $1)"; }
gpus st_z3 2 --zero 3 --save-every 2
gpus st_z2 2 --zero 2 --save-every 2
for from in z3 z2; do
    resumed st_r$from st_$from
    gpus st_r$from 2 --zero 3 --save-every 2 --resume 1
    check "$(grep -q 'continuing after step 2' "$LOG/st_r$from.log" && cmp -s "$(final st_r$from)" "$(final st_z3)" && echo ok)" \
        "a --${from/z/zero } state at step 2 resumed on 2 GPUs --zero 3: final model bit for bit the uninterrupted --zero 3 run's" \
        "$(grep -m 1 'resume: ' "$LOG/st_r$from.log" | cut -c1-70)"
done
check "$(cmp -s "$(final st_z3)" "$(final st_z2)" && echo ok)" "  ... which is --zero 2's (with states saved on the way)"

# ---- planted bugs, each in a copy of gptc/cuda/zero.cuh built through the layer ------------
# mutant NAME SED_EXPR: builds $LOG/NAME (0), or 1
mutant() {
    local mut=$LOG/$1
    sed "$2" gptc/cuda/zero.cuh > "$mut.cuh"
    ! cmp -s gptc/cuda/zero.cuh "$mut.cuh" && cuda_mutant_build "$mut" gptc/cuda/zero.cuh "$mut.cuh" -DUSE_MPI
}
# backward's first gather of the wrong layer (L-2 into L-1's buffer): the equality with --zero 2 must fail
if mutant mutant_layer 's|dp_gather_bucket(dp, L - 1, dp->layer_buf\[(L - 1) % 2\], (L - 1) % 2);|dp_gather_bucket(dp, L - 2, dp->layer_buf[(L - 1) % 2], (L - 1) % 2);|'; then
    BIN_SAVED=$BIN BIN=$LOG/mutant_layer
    gpus mutant_z3 2 --zero 3 --val-data "$TOY" --val-every 1 --val-batches 2
    BIN=$BIN_SAVED
    check "$([ "$(lines mutant_z3 loss | wc -l)" -eq $STEPS ] && ! equal mutant_z3 w2_z2 && echo ok)" \
        "planted: backward gathers layer L-2 into layer L-1's buffer: the equality with --zero 2 fails" \
        "mutant losses $(lines mutant_z3 loss | cut -d' ' -f2 | tr '\n' ' ')"
else
    check FAIL "planted mutant_layer built" "$(tail -n 3 "$LOG/mutant_layer.build" 2>/dev/null)"
fi
# the ordering by events: the layer's race check (vector clocks over streams, dev/cuda/cpu/README.md) must
# report the layer's kernels reading a buffer that its all-gather, unordered, writes
for m in ready free; do
    if [ $m = ready ]; then
        what="the compute stream does not wait for the layer's gather (w_ready)"
        expr='s|    CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->w_ready\[l % 2\], 0));|    /* planted: no wait */|'
    else
        what="a gather does not wait for the buffer's last reader (w_free)"
        expr='s|    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->w_free, 0));|    /* planted: no wait */|'
    fi
    if mutant mutant_$m "$expr"; then
        BIN_SAVED=$BIN BIN=$LOG/mutant_$m
        gpus race_$m 2 --zero 3 --steps 1
        rc=$?
        BIN=$BIN_SAVED
        check "$([ $rc -ne 0 ] && grep -q "race between streams: .* 'ncclAllGather'" "$LOG/race_$m.log" && echo ok)" \
            "planted: $what: the layer reports a race between streams" \
            "rc=$rc; $(grep -m 1 -o "race between streams: '[^']*' ([^)]*) [a-z]*" "$LOG/race_$m.log")"
    else
        check FAIL "planted mutant_$m built" "$(tail -n 3 "$LOG/mutant_$m.build" 2>/dev/null)"
    fi
done

echo "cuda zero3: $passed passed, $failed failed ($(( $(date +%s) - START ))s, logs in $LOG)"
[ $failed -eq 0 ]
