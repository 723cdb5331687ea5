#!/bin/bash
# scripts/tests/test_cuda_levels.sh — the levels of the machine on the GPU trainer
# (issue 15): train_gpt.cu's nodes, communicators per level (ncclCommSplit),
# bytes sent per level and --hierarchical 1, executed on the CPU
# (./train_gpt_cu_cpu, one MPI rank per emulated GPU, NCCL over MPI:
# dev/cuda/cpu/NCCL.md). Not run on a GPU.
#
#   scripts/tests/test_cuda_levels.sh     # make test-cuda-levels builds and runs it (335 s at load 13 on 2 cores, 24 checks; not in make test)
#   QUICK=1 scripts/tests/test_cuda_levels.sh   # ~25 s, in scripts/tests/test_cuda_on_cpu.sh (make test): --zero 2 by
#                                   # level only, 2 steps of 1 micro-batch, against the CPU trainer and the
#                                   # formulas; the planted figure and the refusals
#
# A small GPT (L = 2, C = 64, T = 64) on a global batch of 8 sequences, 3
# steps; 4 emulated GPUs as --topology 2x2 (2 nodes of 2), B = 2 each:
#   - --zero 0, 1 and 2 (ZeRO-2 with 2 micro-batches: reduced on each), flat
#     (--hierarchical 0) and by level (--hierarchical 1): every step's loss
#     within LOSS_TOL = 1e-4 relative of the flat run's (the sums in another
#     order, node sums first, so not bitwise; measured <= 8e-7) and within
#     CPU_TOL = 1e-3 of the CPU trainer's (./train_gpt, one process, the same
#     global batch in micro-batches of 2; bf16 against fp32, measured <= 6.3e-5
#     over 3 steps). Tighter than gpu_check_dp.sh's 2e-3 and test_gpt.cu's
#     1e-2 (real GPUs; 10 steps): a planted wrong root across nodes moves the
#     losses by ~4e-3 and must fail (below, full run only);
#   - the bytes sent per step at each level, summed over the ranks, exactly
#     against the formulas (bytes; fp32 gradients, bf16 weights; N nodes of
#     K, W = N K; P the parameters, P' = W S the padded buckets, S the
#     shard: S = L ceil(layer / 64 W) 64 + ceil(rest / 64 W) 64; A
#     micro-batches; ZeRO-1 reduces once, ZeRO-2 A times, R = reductions):
#       plain flat          intra 2 (K-1) 4P             inter 2 (N-1) K 4P
#       plain hierarchical  intra 2 N (K-1) 4P           inter 2 (N-1) 4P
#       ZeRO flat           intra (K-1)(4P' R + 2P')     inter (N-1) K (4P' R + 2P')
#       ZeRO hierarchical   intra N (K-1) 4P' R + (K-1) 2P'   inter (N-1) 4P' R + (N-1) K 2P'
#     every step's line (--comm-levels 1) and the end's, and a planted
#     wrong figure rejected by the same comparison;
#   - the memory plan still equals the device ledger (--plan-check 1) with
#     the communicators per level up;
#   - without --topology the nodes are the hosts: one node of 2 here, flat
#     (--hierarchical's default), nothing sent across nodes;
#   - refused, with a message: --topology 3x2 on 4 ranks, ranks launched
#     with different --topology (an error on every rank, not a hang).
# (The GPU's --zero 3: scripts/tests/test_cuda_zero3.sh; ZeRO++ on it, which this
# script checked was refused before it was built: scripts/tests/test_cuda_zeropp.sh.)
# The last line is "cuda levels: N passed, N failed"; exit status non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${BIN:-./train_gpt_cu_cpu}
CPU=${CPU:-./train_gpt}
PY=${PYTHON:-/usr/bin/python3}
LOSS_TOL=${LOSS_TOL:-1e-4}
CPU_TOL=${CPU_TOL:-1e-3}
LOG=${LOG:-$(mktemp -d /tmp/gptc_cuda_levels.XXXXXX)}
mkdir -p "$LOG"
START=$(date +%s)
CHECK_START=$START
. scripts/tests/check.sh
for b in "$BIN" "$CPU"; do
    [ -x "$b" ] || { echo "test_cuda_levels: $b not built: make test-cuda-levels"; exit 1; }
done
echo "test_cuda_levels: logs in $LOG"
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 200000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
C=64; L=2; Vp=256; maxT=64; W=4; N=2; K=2
QUICK=${QUICK:-0}
STEPS=$([ "$QUICK" = 1 ] && echo 2 || echo 3)
ZEROS=$([ "$QUICK" = 1 ] && echo 2 || echo "0 1 2")
HIERS=$([ "$QUICK" = 1 ] && echo 1 || echo "0 1")
SMALL="--model d2 --channels $C --num-heads 2 --max-seq-len $maxT --vocab-size $Vp --train-data $TOY --seq-len 64
       --steps $STEPS --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 0 --sample-every 0"

# gpus NAME W FLAGS...: W emulated GPUs (MPI ranks), rank 0's output in NAME.log
gpus() {
    local name=$1 w=$2
    shift 2
    $CLEAN_ENV timeout -k 10 400 $MPIRUN -np "$w" -x GPTC_RUN_ID="cuda-levels-$$-$name" \
        sh -c 'log=$1; shift; exec "$@" > "$log.rank$OMPI_COMM_WORLD_RANK.log" 2>&1' sh "$LOG/$name" \
        "$BIN" --init mpi $SMALL --batch-size 2 "$@" --log-file "$LOG/$name.jsonl" < /dev/null > "$LOG/$name.mpirun.log" 2>&1
    local rc=$?
    cp "$LOG/$name.rank0.log" "$LOG/$name.log" 2>/dev/null
    echo "rc=$rc" >> "$LOG/$name.log"
    return $rc
}
field() { grep -o "\"$2\": [-0-9.e+]*" "$1" | cut -d' ' -f2; }
# worst relative difference of the losses of two runs, or "none" (missing, or not as many)
worst() {
    local a b
    a=$(field "$1" loss | wc -l) b=$(field "$2" loss | wc -l)
    [ "$a" -eq "$STEPS" ] && [ "$b" -eq "$STEPS" ] || { echo none; return; }
    paste -d' ' <(field "$1" loss) <(field "$2" loss) |
        awk '{ d = ($1 - $2) / ($2 < 0 ? -$2 : $2); d = d < 0 ? -d : d; if (d > w) w = d } END { printf "%.2e", w }'
}
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d != "none" && d + 0 <= t + 0) }'; }

# ---- the formulas (bytes per step, summed over the ranks) --------------------
P=$(( Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C ))
layer=$(( 12 * C * C + 13 * C )) rest=$(( Vp * C + maxT * C + 2 * C )) unit=$(( 64 * W ))
S=$(( L * ((layer + unit - 1) / unit * 64) + (rest + unit - 1) / unit * 64 ))
Pp=$(( W * S ))
# expect ZERO HIER A: "intra inter"
expect() {
    local z=$1 h=$2 a=$3 r
    r=$([ "$z" -eq 2 ] && echo "$a" || echo 1)
    if [ "$z" -eq 0 ] && [ "$h" -eq 0 ]; then echo "$(( 2 * (K - 1) * 4 * P )) $(( 2 * (N - 1) * K * 4 * P ))"
    elif [ "$z" -eq 0 ]; then echo "$(( 2 * N * (K - 1) * 4 * P )) $(( 2 * (N - 1) * 4 * P ))"
    elif [ "$h" -eq 0 ]; then echo "$(( (K - 1) * (4 * Pp * r + 2 * Pp) )) $(( (N - 1) * K * (4 * Pp * r + 2 * Pp) ))"
    else echo "$(( N * (K - 1) * 4 * Pp * r + (K - 1) * 2 * Pp )) $(( (N - 1) * 4 * Pp * r + (N - 1) * K * 2 * Pp ))"; fi
}
# measured LOG: the end's "intra inter", and whether every step's line says the same
measured() { sed -n 's/^bytes sent per step by level .*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1 \2/p' "$1" | tail -n 1; }
steps_agree() { # LOG "intra inter": every step's line, STEPS of them, carries these
    local n
    n=$(grep -c "^step [0-9]*: bytes sent: intra-node ${2% *}, inter-node ${2#* } (summed" "$1")
    [ "$n" -eq "$STEPS" ]
}
echo "P = $P parameters, S = $S per rank, P' = $Pp; $N nodes x $K ranks"

# ---- the CPU trainer: one process, the same global batches in micro-batches of 2 ----
for total in $([ "$QUICK" = 1 ] && echo 512 || echo 512 1024); do
    timeout -k 10 200 "$CPU" $SMALL --batch-size 2 --total-batch-size $total --threads 2 \
        --log-file "$LOG/cpu_$total.jsonl" > "$LOG/cpu_$total.log" 2>&1
    check "$([ "$(field "$LOG/cpu_$total.jsonl" loss | wc -l)" -eq $STEPS ] && echo ok)" \
        "CPU trainer, 1 process, global batch $((total / 64)) in micro-batches of 2: trains" \
        "$(field "$LOG/cpu_$total.jsonl" loss | tr '\n' ' ')"
done

# ---- 4 emulated GPUs as 2 nodes of 2: flat and by level, each --zero ---------
for z in $ZEROS; do
    total=$([ $z -eq 2 ] && [ "$QUICK" != 1 ] && echo 1024 || echo 512) # (ZeRO-2: 2 micro-batches, reduced after each)
    a=$(( total / (64 * 2 * W) ))
    for h in $HIERS; do
        extra=$([ $z -eq 2 ] && [ $h -eq 1 ] && echo "--plan-check 1")
        gpus z${z}_h$h $W --zero $z --topology 2x2 --hierarchical $h --comm-levels 1 --total-batch-size $total $extra
        rc=$?
        want=$(expect $z $h $a) got=$(measured "$LOG/z${z}_h$h.log")
        ok=$([ $rc -eq 0 ] && [ -n "$got" ] && [ "$got" = "$want" ] && steps_agree "$LOG/z${z}_h$h.log" "$want" && echo ok)
        check "$ok" "4 GPUs as 2x2, --zero $z, --hierarchical $h, $a micro-batch(es): bytes per step intra-node, inter-node = the formula, every step" \
            "measured $got, formula $want; rc=$rc"
        [ $rc -eq 0 ] || tail -n 15 "$LOG/z${z}_h$h.log"
        d=$(worst "$LOG/z${z}_h$h.jsonl" "$LOG/cpu_$total.jsonl")
        check "$(within "$d" "$CPU_TOL" && echo ok)" "  ... its losses against the CPU trainer's (fp32): within $CPU_TOL" "max rel diff $d"
        [ -n "$extra" ] && check "$([ "$(grep -c '^plan-check: rank 0, .*: equal$' "$LOG/z${z}_h$h.log")" = 2 ] && echo ok)" \
            "  ... with the communicators per level up: device memory plan == ledger (--plan-check 1)" \
            "$(grep -m 1 '^plan-check' "$LOG/z${z}_h$h.log")"
    done
    grep -q "gradients reduced by level" "$LOG/z${z}_h1.log" ||
        check FAIL "--zero $z --hierarchical 1 says it reduces by level" "$(grep -m 1 '^levels' "$LOG/z${z}_h1.log")"
    [ "$QUICK" = 1 ] && continue
    d=$(worst "$LOG/z${z}_h1.jsonl" "$LOG/z${z}_h0.jsonl")
    same=$(cmp -s <(field "$LOG/z${z}_h1.jsonl" loss) <(field "$LOG/z${z}_h0.jsonl" loss) && echo "equal as logged (%.6f)" || echo "not equal as logged")
    check "$(within "$d" "$LOSS_TOL" && echo ok)" "--zero $z: hierarchical losses against flat: within $LOSS_TOL" "max rel diff $d; $same"
done
# the comparison must reject a wrong figure: the formula with one byte more across nodes
want=$(expect 2 1 $([ "$QUICK" = 1 ] && echo 1 || echo 2))
planted="${want% *} $(( ${want#* } + 1 ))"
check "$([ "$(measured "$LOG/z2_h1.log")" != "$planted" ] && ! steps_agree "$LOG/z2_h1.log" "$planted" && echo ok)" \
    "planted: a formula one byte off across nodes is rejected" "$planted"

# ---- without --topology: the nodes are the hosts (one here) ------------------
[ "$QUICK" = 1 ] || {
gpus byhost 2 --zero 1 --steps 1 --total-batch-size 256
rc=$?
got=$(measured "$LOG/byhost.log")
ok=$([ $rc -eq 0 ] && grep -q "^levels: 1 node(s) x 2 rank(s) (by host name); gradients reduced flat" "$LOG/byhost.log" &&
     [ "${got#* }" = 0 ] && [ "${got% *}" -gt 0 ] && echo ok)
check "$ok" "2 GPUs on one host, no --topology: 1 node of 2 by host name, flat by default, 0 bytes across nodes" \
    "$(grep -m 1 '^levels' "$LOG/byhost.log"); bytes $got; rc=$rc"
}

# ---- refused ------------------------------------------------------------------
gpus bad_topology 4 --topology 3x2
rc=$?
check "$([ $rc -ne 0 ] && grep -q 'topology 3x2: want NxK' "$LOG/bad_topology.rank0.log" && echo ok)" \
    "--topology 3x2 on 4 ranks: refused" "$(grep -m 1 error "$LOG/bad_topology.rank0.log")"
# rank 1 launched with --topology 2x1, rank 0 without: both stop with an error, no hang
$CLEAN_ENV timeout -k 10 120 $MPIRUN -np 2 -x GPTC_RUN_ID="cuda-levels-$$-mixed" sh -c \
    'log=$1; shift; t=; [ "$OMPI_COMM_WORLD_RANK" = 1 ] && t="--topology 2x1"
     exec "$@" $t > "$log.rank$OMPI_COMM_WORLD_RANK.log" 2>&1' sh "$LOG/mixed" \
    "$BIN" --init mpi $SMALL --batch-size 2 --zero 1 < /dev/null > "$LOG/mixed.mpirun.log" 2>&1
rc=$?
check "$([ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'other --topology/--hierarchical flags than rank 0' "$LOG"/mixed.rank*.log && echo ok)" \
    "ranks launched with different --topology: an error, not a hang" "rc=$rc; $(grep -h -m 1 error "$LOG"/mixed.rank*.log | head -n 1 | cut -c1-90)"

# ---- planted (full run): every piece summed across nodes onto node 0, not its owner's -----
# (a copy of gptc/cuda/levels.cuh built through the layer, ~1 min; the loss check above must reject it)
if [ "$QUICK" != 1 ]; then
    mut=$LOG/mutant_root
    sed 's|ncclReduce(p, p, piece, ncclFloat, ncclSum, lv->node_of\[q\], lv->inter, cs)|ncclReduce(p, p, piece, ncclFloat, ncclSum, 0, lv->inter, cs)|' \
        gptc/cuda/levels.cuh > "$mut.cuh"
    built=no
    ! cmp -s gptc/cuda/levels.cuh "$mut.cuh" && cuda_mutant_build "$mut" gptc/cuda/levels.cuh "$mut.cuh" -DUSE_MPI && built=yes
    if [ $built = yes ]; then
        BIN_SAVED=$BIN BIN=$mut
        gpus mutant 4 --zero 2 --topology 2x2 --hierarchical 1 --total-batch-size 1024
        BIN=$BIN_SAVED
        d=$(worst "$LOG/mutant.jsonl" "$LOG/cpu_1024.jsonl")
        check "$(within "$d" "$CPU_TOL" || echo ok)" "planted: the cross-node sums onto the wrong rank are caught by the loss check" \
            "max rel diff $d > $CPU_TOL"
    else
        check FAIL "planted: the mutant (wrong root across nodes) builds" "$(tail -n 3 "$mut.build" 2>/dev/null)"
    fi
fi

echo "cuda levels: $passed passed, $failed failed ($(( $(date +%s) - START ))s, logs in $LOG)"
[ $failed -eq 0 ]
