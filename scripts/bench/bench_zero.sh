#!/usr/bin/env bash
# bench_zero.sh — bytes per level per step and memory per rank of every
# data-parallel mode (plain, ZeRO-1/2/3, flat and hierarchical), measured,
# beside their formulas (gptc/zero3.h's header; checked exactly, also by
# scripts/tests/test_zero3.sh). make bench-zero builds and runs it.
#
#   scripts/bench/bench_zero.sh [./train_gpt_mpi]     BENCH_ZERO_FLAGS="--model d4 --channels 128 ..." to change the model
#
# Runs np 2 on one node (the default topology here: one machine), np 2 as
# --topology 2x1 (2 nodes of 1) and np 4 as --topology 2x2, each stage with
# --hierarchical 0 and 1 (where the nodes have more than one rank), 4 steps
# of a small GPT (L = 4, C = 128: P about 1.0M). Per run: the bytes each
# level carried per step summed over the ranks (bytes sent as a direct
# algorithm sends them: gptc/zero3.h), the formula's, and the model states
# each rank holds (weights, gradients, AdamW, ZeRO-3's gathered buffers) in
# bytes beside 16 P (plain) and 16 P / W (ZeRO-3 without the gathered
# buffers, whose formula is 4 (head + 2 layer) each for weights and
# gradients in flight). Step times are printed for orientation only (ranks
# oversubscribed on 2 shared cores; not a speed claim). Then ZeRO++ on
# --zero 3 (gptc/zeropp.h), np 4 --topology 2x2: plain, qwZ, hpZ, qgZ INT4,
# qgZ INT8 with feedback, and all three: bytes per level (and backward's
# gathers across nodes) against scripts/zeropp_bytes.py, the cross-node
# ratio to plain --zero 3, and rank 0's model states from the ledger.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
dir=$(mktemp -d /tmp/gptc_bench_zero.XXXXXX)
trap 'rm -rf "$dir"' EXIT
$PY scripts/toy_shard.py "$dir/train.bin" 200000 256 0 >/dev/null || exit 1
L=4; C=128; Vp=256; maxT=64
MODEL=${BENCH_ZERO_FLAGS:-"--model d$L --channels $C --num-heads 4 --max-seq-len $maxT --vocab-size 256"}
FLAGS="$MODEL -i $dir/train.bin -t 64 -x 4 --val-every 0 --sample-every 0 --threads 1"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
printf "%-3s %-5s %-4s %-5s %14s %14s %14s %14s %-5s %14s %12s %9s\n" np topo zero hier "intra B/step" "(formula)" \
    "inter B/step" "(formula)" match "states B/rank" "16P/W" "ms/step"
bad=0
# np topology(N K) zero hier
one() {
    local np=$1 N=$2 K=$3 zero=$4 hier=$5 topo=""
    [ "$N" -gt 1 ] && topo="--topology ${N}x$K"
    timeout -k 10 300 $MPIRUN -np "$np" "$BIN" $FLAGS -b $((8 / np)) -d $((8 * 64)) --zero "$zero" --hierarchical "$hier" \
        $topo > "$dir/run.out" 2>&1 || { echo "run failed: np $np $topo --zero $zero: $(tail -2 "$dir/run.out")"; bad=1; return; }
    local P=$(sed -n 's/.*model: .*, \([0-9]*\) parameters.*/\1/p' "$dir/run.out")
    local HEAD=$(( (Vp + maxT) * C + 2 * C )) LAYER shard=$(( (P + np - 1) / np )) R G fi fe
    LAYER=$(( (P - HEAD) / L ))
    case $zero in
        0) R=$P; G=$P ;;
        1) R=$P; G=$((np * shard)) ;;
        2) R=$((L * LAYER + HEAD)); G=$((np * shard)) ;;
        3) R=$((L * LAYER + HEAD)); G=$((2 * L * LAYER + HEAD)) ;;
    esac
    if [ "$hier" = 0 ] || [ "$N" = 1 ]; then fi=$(( (K - 1) * (R + G) )); fe=$(( (N - 1) * K * (R + G) ))
    elif [ "$zero" = 0 ]; then fi=$((2 * N * (K - 1) * P)); fe=$((2 * (N - 1) * P))
    else fi=$((N * (K - 1) * R + (K - 1) * G)); fe=$(( (N - 1) * R + (N - 1) * K * G )); fi
    local line=$(grep "bytes sent per step by level" "$dir/run.out")
    local gi=$(echo "$line" | sed -n 's/.*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1/p')
    local ge=$(echo "$line" | sed -n 's/.*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\2/p')
    local match=yes
    [ "$gi" = $((4 * fi)) ] && [ "$ge" = $((4 * fe)) ] || { match=NO; bad=1; }
    local dp=$(grep "data parallel:" "$dir/run.out") states
    if [ -n "$dp" ]; then
        states=$(echo "$dp" | sed -n 's/.*AdamW state \([0-9]*\) floats, gradients \([0-9]*\) floats, weights \([0-9]*\) floats (\([0-9]*\) gathered).*/\1 \2 \3 \4/p' |
                 awk '{ print 4 * ($1 + $2 + $3 + $4) }')
    else
        states=$((16 * P))
    fi
    local ms=$(grep -o '| [0-9.]* ms |' "$dir/run.out" | tail -3 | awk '{ s += $2 } END { printf "%.1f", s / NR }')
    printf "%-3s %-5s %-4s %-5s %14s %14s %14s %14s %-5s %14s %12s %9s\n" "$np" "${N}x$K" "$zero" \
        "$([ "$hier" = 1 ] && [ "$N" -gt 1 ] && echo yes || echo no)" "$gi" $((4 * fi)) "$ge" $((4 * fe)) $match "$states" \
        $((16 * P / np)) "$ms"
}
for zero in 0 1 2 3; do one 2 1 2 $zero 0; done
for zero in 0 1 2 3; do one 2 2 1 $zero 0; done
for zero in 0 1 2 3; do for hier in 0 1; do one 4 2 2 $zero $hier; done; done
# ZeRO++ on --zero 3, np 4 --topology 2x2: label qwz qgz hpz feedback
zpp_base=""
zpp() {
    local label=$1 qwz=$2 qgz=$3 hpz=$4 fb=$5
    timeout -k 10 300 $MPIRUN -np 4 "$BIN" $FLAGS -b 2 -d $((8 * 64)) --zero 3 --topology 2x2 --qwz $qwz --qgz $qgz \
        --hpz $hpz --qgz-feedback $fb --quant-block 256 --verbose 1 > "$dir/run.out" 2>&1 ||
        { echo "run failed: $label: $(tail -2 "$dir/run.out")"; bad=1; return; }
    local want=($($PY scripts/zeropp_bytes.py $L $C $Vp $maxT 4 2 2 $qwz $qgz $hpz 256 1))
    local got=($(sed -n 's/^bytes sent per step by level .*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1 \2/p' "$dir/run.out")
               $(sed -n "s/^of which backward's weight gathers: intra-node \([0-9]*\), inter-node \([0-9]*\) per step.*/\1 \2/p" "$dir/run.out"))
    local match=yes
    [ "${got[*]}" = "${want[*]}" ] || { match=NO; bad=1; }
    local states=$(sed -n '/allocation ledger after setup, rank 0/,/total/p' "$dir/run.out" |
                   awk '/parameters|gradients|AdamW moments|ZeRO buffers/ { s += $(NF - 2) } END { print s }')
    local zbuf=$(sed -n '/allocation ledger after setup, rank 0/,/total/p' "$dir/run.out" | awk '/ZeRO buffers/ { print $(NF - 2) }')
    [ -z "$zpp_base" ] && zpp_base=$zbuf
    [ -z "$zpp_plain" ] && zpp_plain=${got[1]}
    local ms=$(grep -o '| [0-9.]* ms |' "$dir/run.out" | tail -3 | awk '{ s += $2 } END { printf "%.1f", s / NR }')
    printf "%-26s %12s %12s %12s %12s %-5s %10s %9s %14s %12s %9s\n" "$label" "${got[0]}" "${want[0]}" "${got[1]}" "${want[1]}" \
        $match "${got[3]}" "$(echo "scale=2; $zpp_plain / ${got[1]}" | bc)x" "$states" $((zbuf - zpp_base)) "$ms"
}
echo
echo "ZeRO++ on --zero 3, np 4 --topology 2x2, blocks of 256 (formulas: scripts/zeropp_bytes.py, gptc/zeropp.h's header):"
printf "%-26s %12s %12s %12s %12s %-5s %10s %9s %14s %12s %9s\n" mode "intra B/step" "(formula)" "inter B/step" "(formula)" match \
    "bwd inter" "inter÷" "states B/rank" "ZeRO++ B" "ms/step"
zpp_plain=""
zpp "plain --zero 3" 0 0 0 0
zpp "qwZ INT8" 8 0 0 0
zpp "hpZ" 0 0 1 0
zpp "qgZ INT4" 0 4 0 0
zpp "qgZ INT8 + feedback" 0 8 0 1
zpp "qwZ INT8 + hpZ + qgZ INT4" 8 4 1 0
echo "  (inter÷: plain --zero 3's inter-node bytes over the mode's; states: rank 0's weights, gradients, AdamW and"
echo "   ZeRO buffers from the allocation ledger; ZeRO++ B: of them hpZ's secondary, feedback's residuals, the slots)"
echo "formulas (floats per step summed over the ranks; N nodes of K, W = N K, A = 1 micro-batch; x4 for bytes):"
echo "  R (reduced) = P plain and ZeRO-1, L layer + head ZeRO-2/3; G (gathered) = P plain, W shard ZeRO-1/2,"
echo "  2 L layer + head ZeRO-3 (the head held from forward to backward: about 3 Psi with R);"
echo "  flat: intra (K-1)(R+G), inter (N-1)K(R+G); hierarchical: plain intra 2N(K-1)P, inter 2(N-1)P;"
echo "  ZeRO intra N(K-1)R + (K-1)G, inter (N-1)R + (N-1)K G (the weights' all-gather stays flat: hpZ's place)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ $bad -eq 0 ] && echo "every figure matches its formula" || { echo "MISMATCH (see above)"; exit 1; }
