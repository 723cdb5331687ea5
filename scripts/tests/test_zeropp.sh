#!/usr/bin/env bash
# test_zeropp.sh — ZeRO++ on --zero 3 (gptc/zeropp.h: --qwz, --qgz,
# --qgz-feedback, --hpz) trains, sends the bytes its formulas say, keeps its
# memory in the plan, and resumes bit for bit.
#
#   scripts/tests/test_zeropp.sh [./train_gpt_mpi]     (make test-zeropp builds it and runs this)
#
# The small GPT of scripts/tests/test_zero3.sh (L = 2, C = 32, P = 34,688), 8 steps
# of a global batch of 12 on mpirun -np 2 (one node of 2) and -np 4
# --topology 2x2 (2 nodes of 2), blocks of 64 (so that most pieces hold
# several blocks). About 38 s on 2 shared cores at load ~8.6 (26 s without
# the wire check below, measured back to back). Checked:
#   - each quantised mode trains and every step's loss stays within the
#     first-order bound of what its quantisation can change (below) of plain
#     --zero 3's, and is NOT bit for bit plain's (the quantisation is on);
#   - --hpz 1 alone: every loss, norm and validation loss bit for bit plain
#     --zero 3's (the secondary holds the primary's very floats), also with 2
#     micro-batches (whose second forward gathers from the secondary);
#   - the bytes per level per step, summed over the ranks, exactly the
#     formulas (scripts/zeropp_bytes.py computes them from the model shape:
#     qwZ INT8 payload + one fp32 scale per block per piece; qgZ's two hops;
#     hpZ's node-only gathers), and backward's weight gathers: with hpZ, 0
#     bytes across nodes; a planted wrong figure rejected;
#   - the cross-node bytes of qwZ + hpZ + qgZ against plain ZeRO-3, printed
#     as a ratio;
#   - the memory plan equal to the ledger byte for byte with every buffer
#     on (hpZ's secondary, feedback's residuals, the slots), every rank;
#   - stopped at step 6 and resumed from disk with qwZ + hpZ + qgZ: the final
#     weights bit for bit the uninterrupted run's (states are fp32);
#   - the wire, against an independent implementation: 8 configurations on
#     2x2 (qwz 8, qwz 4, hpz, qwz 8 + hpz with 3 micro-batches, qgz 4, qgz 8,
#     qgz 8 + feedback, qwz 4 + hpz + qgz 4 + feedback), and 3 on other
#     machines (np 4 as 1x4: qwz 4 + hpz + qgz 4; np 4 as 4x1: qwz 8 + hpz;
#     np 3 as 3x1: qwz 8 + qgz 8: the overlapped gather's one-hop paths),
#     2 steps each with
#     GPTC_ZEROPP_DUMP (gptc/zeropp.h: every rank's fp32 master shard, each
#     gather's dequantised weights, hpZ's secondary, the local gradients and
#     grad_shard after each qgZ reduction); scripts/tests/zeropp_ref.py re-derives
#     every array from the masters and local gradients of all ranks (numpy,
#     from the documented format: blocks, scales, rounding, the two hops, the
#     residuals) and it must match bit for bit (fixed rounding, no FMA under
#     -std=c11; on 2x2 each fp32 sum has two terms, so no order question);
#     about 12 s of the total; the tester: one float of a dump moved by one
#     ulp must be reported;
#   - with ZEROPP_MUTANTS=1 (make test-zeropp-mutants, ~3 min more): 7
#     planted bugs (a patched copy of the sources, built in the temp dir:
#     the next block's scale on decode, a block's max missing its last
#     element, INT4 nibbles swapped on decode, the sum re-quantised at hop 1,
#     no error feedback at hop 0, hpZ's secondary not refreshed, a slice
#     placed one float early), each of which the wire check must FAIL on;
#     the 8-step loss-bound check's verdict on each is printed (it passes 6
#     of the 7: the reason the wire check exists);
#   - ZeRO++ flags without --zero 3, --qgz-feedback without --qgz, and
#     --qwz 3 refused with a clear error.
# The tolerance. A step's loss moves, to first order, by at most ||g|| ||dw||
# when the weights it sees move by dw. qwZ's gathered weights are within
# max|block| / (2 qmax) of the true ones per element, so ||dw|| <= eps_w
# ||w||_2 with eps_w = 1/254 (INT8), 1/14 (INT4); qgZ's summed gradient is
# off by at most hops / (2 qmax) of the largest partial sum of its block,
# and AdamW turns a gradient error into an update error of at most about
# lr per element, so the weights drift by at most sqrt(P) lr per step
# that saw it. Over steps 1..t the bound is
#   tol_t = ||g_t|| (eps_w ||w||_2 + [qgz] sqrt(P) sum_{s<t} lr_s),
# ||g_t|| the unquantised run's norm at step t, ||w||_2 the initial
# weights' norm (measured) plus sqrt(P) sum lr_s. A worst-case first-order
# bound: loose (the runs use under 2% of it, qgZ's under 0.1%; the worst
# ratio is printed), so it catches only gross bugs: the wire check below is
# the exact one.
# The last line is "N passed, N failed"; the exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-.hooks/train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
dir=$(mktemp -d /tmp/gptc_zeropp.XXXXXX)
trap 'rm -rf "$dir"' EXIT
. scripts/tests/check.sh
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 >/dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 >/dev/null || exit 1
L=2; C=32; Vp=256; maxT=32; BLOCK=64
COMMON="--model d$L --channels $C --num-heads 2 --max-seq-len $maxT --vocab-size 256 -i $dir/train.bin -j $dir/val.bin
        -t 16 -x 8 --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 4 --val-batches 2 --sample-every 0 --threads 1
        -d 192 --zero 3 --quant-block $BLOCK"
field() { grep -o "\"$2\": [-0-9.e+]*" "$1" | cut -d' ' -f2; }

# name np topology(N K) A flags...
run() {
    local name=$1 np=$2 N=$3 K=$4 A=$5
    shift 5
    local topo="" B=$((12 / np / A))
    [ "$N" -gt 1 ] && topo="--topology ${N}x$K"
    timeout -k 10 120 $MPIRUN -np "$np" "$BIN" $COMMON -b $B $topo "$@" --log-file "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
        { check FAIL "$name: run" "$(grep -m3 -E 'error' "$dir/$name.out") $(tail -2 "$dir/$name.out")"; return 1; }
}
# name np N K A qwz qgz hpz: the bytes per level per step (and backward's gathers) against the formulas
traffic() {
    local name=$1 np=$2 N=$3 K=$4 A=$5 qwz=$6 qgz=$7 hpz=$8
    local want=($($PY scripts/zeropp_bytes.py $L $C $Vp $maxT $np $N $K $qwz $qgz $hpz $BLOCK $A))
    local got=($(sed -n 's/^bytes sent per step by level .*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1 \2/p' "$dir/$name.out")
               $(sed -n "s/^of which backward's weight gathers: intra-node \([0-9]*\), inter-node \([0-9]*\) per step.*/\1 \2/p" "$dir/$name.out"))
    [ "${got[*]}" = "${want[*]}" ] &&
        check ok "$name: bytes per level per step = the formula" "intra ${got[0]}, inter ${got[1]}; backward's gathers intra ${got[2]}, inter ${got[3]}" ||
        check FAIL "$name: bytes per level per step = the formula" "got '${got[*]}', want '${want[*]}' (intra inter, backward's intra inter)"
    [ "$name" = t2x2-all ] && { # the tester: one byte more is a mismatch
        [ "${got[0]}" = $((want[0] + 1)) ] && check FAIL "planted wrong figure accepted" ||
            check ok "a planted wrong figure (one byte more) is rejected by the same comparison"; }
    return 0
}
# name base eps_w qgz: every step's loss within tol_t of the base's, and not bit for bit
bound() { # name base eps_w qgz: "ok|FAIL worst equal|differs"
    $PY - "$dir/$2.jsonl" "$dir/$1.jsonl" "$dir/w0.bin" "$3" "$4" <<'PY'
import json, sys, numpy as np
base, run, w0, eps, qgz = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
rows = lambda p: [r for r in map(json.loads, open(p)) if "loss" in r and "val_loss" not in r]
b, q = rows(base), rows(run)
w = np.fromfile(w0, dtype="<f4", offset=1024).astype(np.float64)
P, wn = w.size, float(np.linalg.norm(w))
worst, lrs, equal = 0.0, 0.0, True
for rb, rq in zip(b, q):
    norm_w = wn + np.sqrt(P) * lrs
    tol = rb["norm"] * (eps * norm_w + (np.sqrt(P) * lrs if qgz else 0.0))
    d = abs(rb["loss"] - rq["loss"])
    equal &= rb["loss"] == rq["loss"]
    worst = max(worst, d / tol if tol > 0 else (0.0 if d == 0 else float("inf")))  # (step 1 under qgZ: tol 0)
    lrs += rb["lr"]
print(f"{'ok' if len(b) == len(q) == 8 and worst <= 1 and not equal else 'FAIL'} {worst:.2g} {'equal' if equal else 'differs'}")
PY
}
close() {
    local name=$1 r=$(bound "$1" "$2" "$3" "$4")
    set -- $r
    [ "$1" = ok ] && check ok "$name: every loss within the quantisation bound of plain --zero 3's, not bit for bit" "worst |dloss|/tol $2 (<= 1), $3" ||
        check FAIL "$name: losses within the quantisation bound, not bit for bit" "$r"
}
same() { # name base: loss, norm, val_loss bit for bit
    cmp -s <(for k in loss norm val_loss; do field "$dir/$2.jsonl" $k; done) <(for k in loss norm val_loss; do field "$dir/$1.jsonl" $k; done) &&
        check ok "$1: every loss, norm and validation loss bit for bit $2's" || check FAIL "$1 equals $2 bit for bit" "$(tail -2 "$dir/$1.out")"
}

# the initial weights (their norm is in the tolerance)
timeout -k 10 60 "$BIN" $COMMON -b 12 -x 0 -o "$dir/init" > "$dir/init.out" 2>&1 && cp "$dir/init/model_00000000.bin" "$dir/w0.bin" ||
    check FAIL "the initial weights" "$(tail -2 "$dir/init.out")"

# one node of 2 ranks
run np2 2 1 2 1 && traffic np2 2 1 2 1 0 0 0
run np2-acc 2 1 2 2
run np2-hpz-acc 2 1 2 2 --hpz 1 && same np2-hpz-acc np2-acc && traffic np2-hpz-acc 2 1 2 2 0 0 1
run np2-qwz8 2 1 2 1 --qwz 8 && close np2-qwz8 np2 $(echo "1/254" | bc -l) 0 && traffic np2-qwz8 2 1 2 1 8 0 0
run np2-qgz4 2 1 2 1 --qgz 4 && close np2-qgz4 np2 0 1 && traffic np2-qgz4 2 1 2 1 0 4 0
# two nodes of 2 ranks
run t2x2 4 2 2 1 && traffic t2x2 4 2 2 1 0 0 0
run t2x2-hpz 4 2 2 1 --hpz 1 && same t2x2-hpz t2x2 && traffic t2x2-hpz 4 2 2 1 0 0 1
run t2x2-qwz8 4 2 2 1 --qwz 8 && close t2x2-qwz8 t2x2 $(echo "1/254" | bc -l) 0 && traffic t2x2-qwz8 4 2 2 1 8 0 0
run t2x2-qwz4 4 2 2 1 --qwz 4 && close t2x2-qwz4 t2x2 $(echo "1/14" | bc -l) 0 && traffic t2x2-qwz4 4 2 2 1 4 0 0
run t2x2-qgz4 4 2 2 1 --qgz 4 && close t2x2-qgz4 t2x2 0 1 && traffic t2x2-qgz4 4 2 2 1 0 4 0
run t2x2-qgz8-fb 4 2 2 1 --qgz 8 --qgz-feedback 1 --plan-check 1 && close t2x2-qgz8-fb t2x2 0 1 && traffic t2x2-qgz8-fb 4 2 2 1 0 8 0
run t2x2-all 4 2 2 1 --qwz 8 --hpz 1 --qgz 4 && close t2x2-all t2x2 $(echo "1/254" | bc -l) 1 && traffic t2x2-all 4 2 2 1 8 4 1
plain=$(sed -n 's/^bytes sent per step by level .*inter-node \([0-9]*\) summed.*/\1/p' "$dir/t2x2.out")
zpp=$(sed -n 's/^bytes sent per step by level .*inter-node \([0-9]*\) summed.*/\1/p' "$dir/t2x2-all.out")
[ -n "$plain" ] && [ -n "$zpp" ] && [ "$zpp" -lt "$plain" ] &&
    check ok "cross-node bytes per step, 2x2: plain --zero 3 $plain, qwZ+hpZ+qgZ(INT4) $zpp" "$(echo "scale=2; $plain / $zpp" | bc)x lower" ||
    check FAIL "cross-node bytes per step, 2x2" "plain '$plain', ZeRO++ '$zpp'"

# every buffer in the plan: hpZ's secondary, feedback's residuals, the slots (all ranks)
run t2x2-plan 4 2 2 1 --qwz 8 --hpz 1 --qgz 4 --qgz-feedback 1 --plan-check 1 && {
    n=$(grep -c "ledger == plan" "$dir/t2x2-plan.out")
    shard=$(( (34688 + 3) / 4 ))
    [ "$n" -eq 4 ] && grep -q "secondary ($((2 * shard)) floats a rank)" "$dir/t2x2-plan.out" &&
        check ok "2x2 qwZ+hpZ+qgZ+feedback --plan-check 1: ledger == plan on every rank; the secondary N shard = $((2 * shard)) floats" \
            "$(grep -m1 'rank 0: ledger == plan' "$dir/t2x2-plan.out" | sed 's/.*after setup/after setup/; s/; peak RSS.*//')" ||
        check FAIL "2x2 ZeRO++ --plan-check 1" "$n of 4: $(grep -E 'plan check|ZeRO\+\+' "$dir/t2x2-plan.out" | head -3)"; }

# resume: states stay fp32, so stopped at 6 and resumed gives the uninterrupted run's weights bit for bit
ALL="--qwz 8 --hpz 1 --qgz 4 --save-every 4 --topology 2x2"
timeout -k 10 120 $MPIRUN -np 4 "$BIN" $COMMON -b 3 $ALL -o "$dir/rsA" > "$dir/rsA.out" 2>&1
timeout -k 10 120 $MPIRUN -np 4 "$BIN" $COMMON -b 3 $ALL -o "$dir/rsB" --stop-at 6 > "$dir/rsB1.out" 2>&1
timeout -k 10 120 $MPIRUN -np 4 "$BIN" $COMMON -b 3 $ALL -o "$dir/rsB" --resume 1 > "$dir/rsB2.out" 2>&1
[ $? -eq 0 ] && grep -q "continuing after step 6" "$dir/rsB2.out" && [ -f "$dir/rsA/model_00000008.bin" ] &&
    cmp -s "$dir/rsA/model_00000008.bin" "$dir/rsB/model_00000008.bin" &&
    check ok "2x2 qwZ+hpZ+qgZ: stopped at 6, resumed from disk, final weights bit for bit the uninterrupted run's" ||
    check FAIL "2x2 qwZ+hpZ+qgZ resumed" "$(grep -E 'resume|error|continuing' "$dir/rsB2.out" | head -3)"

# the wire, against an independent implementation: 2 steps on 2x2 with GPTC_ZEROPP_DUMP (gptc/zeropp.h: every
# rank's master shard, the weights each gather left, hpZ's secondary, the local gradients and grad_shard after
# each qgZ reduction), each array re-derived by scripts/tests/zeropp_ref.py (numpy, from the documented format), bit for bit
# wire name B bin flags...: 0 = reproduced; 1 = a mismatch (zeropp_ref.py's verdict in $dir/wire-$name.ref); 2 = the run failed
wire() { # (WIRE_NP, WIRE_TOPO: other machines than 2x2)
    local name=$1 B=$2 bin=$3 np=${WIRE_NP:-4} topo=${WIRE_TOPO:-2x2}
    shift 3
    local dd="$dir/wire-$name"
    rm -rf "$dd" && mkdir -p "$dd" || return 2
    GPTC_ZEROPP_DUMP=$dd timeout -k 10 120 $MPIRUN -np $np "$bin" $COMMON -b "$B" --topology $topo -x 2 --val-every 0 "$@" \
        > "$dd.out" 2>&1 || return 2
    local ref=$(echo " $* " | sed 's/ --qgz-feedback / --feedback /; s/ -d [0-9]* / /')
    $PY scripts/tests/zeropp_ref.py "$dd" --np $np --topology $topo --params 34688 --steps 2 --block $BLOCK $ref > "$dd.ref" 2>&1
    [ $? -eq 0 ] && { [ -n "${KEEP_DUMP:-}" ] || rm -rf "$dd"; } && return 0
    return 1
}
for cfg in "qwz8 3 --qwz 8" "qwz4 3 --qwz 4" "hpz 3 --hpz 1" "qwz8-hpz-acc3 1 --qwz 8 --hpz 1" "qgz4 3 --qgz 4" \
           "qgz8 3 --qgz 8" "qgz8-fb 3 --qgz 8 --qgz-feedback 1" "all-fb 3 --qwz 4 --hpz 1 --qgz 4 --qgz-feedback 1"; do
    set -- $cfg
    name=$1 B=$2
    shift 2
    KEEP_DUMP=$([ "$name" = qwz8 ] || [ "$name" = qgz8-fb ] && echo 1) wire "$name" "$B" "$BIN" "$@"
    case $? in
    0) check ok "wire 2x2 $*: every gather, secondary and qgZ grad_shard = scripts/tests/zeropp_ref.py's, bit for bit" \
           "$(grep -E '^ok .* of [0-9]+ records' "$dir/wire-$name.ref" | sed 's/^ok *//; s/ =.*: /: /' | tr '\n' ';')" ;;
    1) check FAIL "wire 2x2 $*: the dump = scripts/tests/zeropp_ref.py's" "$(grep -m2 FAIL "$dir/wire-$name.ref")" ;;
    *) check FAIL "wire 2x2 $*: the run" "$(tail -2 "$dir/wire-$name.out")" ;;
    esac
done
# the other machines' paths of the overlapped weight gather: one node (qwZ's only hop inside it), one rank a node
# (only the hop across nodes), three ranks
for cfg in "4 1x4 1x4-all 3 --qwz 4 --hpz 1 --qgz 4" "4 4x1 4x1-qwz8-hpz 1 --qwz 8 --hpz 1" "3 3x1 3x1-qwz8-qgz8 3 --qwz 8 --qgz 8 -d 144"; do
    set -- $cfg
    np=$1 topo=$2 name=$3 B=$4
    shift 4
    WIRE_NP=$np WIRE_TOPO=$topo wire "$name" "$B" "$BIN" "$@"
    case $? in
    0) check ok "wire np $np $topo $*: every gather, secondary and qgZ grad_shard = scripts/tests/zeropp_ref.py's, bit for bit" \
           "$(grep -cE '^ok ' "$dir/wire-$name.ref") checks" ;;
    1) check FAIL "wire np $np $topo $*: the dump = scripts/tests/zeropp_ref.py's" "$(grep -m2 FAIL "$dir/wire-$name.ref")" ;;
    *) check FAIL "wire np $np $topo $*: the run" "$(tail -2 "$dir/wire-$name.out")" ;;
    esac
done

# the tester: one float of a dump moved by one ulp (the last float of rank 3's file: a backward gather under
# qwZ, grad_shard after the last reduction under qgZ) must be reported
for cfg in "qwz8 --qwz 8" "qgz8-fb --qgz 8 --feedback 1"; do
    set -- $cfg
    name=$1
    shift
    f="$dir/wire-$name/rank3.bin"
    [ -f "$f" ] && $PY -c 'import sys, numpy as np
x = np.memmap(sys.argv[1], dtype="<f4", mode="r+")
x[-1] = np.nextafter(x[-1], np.float32(np.inf)); x.flush()' "$f" &&
        ! $PY scripts/tests/zeropp_ref.py "$dir/wire-$name" --np 4 --topology 2x2 --params 34688 --steps 2 --block $BLOCK "$@" \
            > "$dir/plant-$name.ref" 2>&1 && grep -q "1 of [0-9]* floats differ" "$dir/plant-$name.ref" &&
        check ok "wire $*: a dump's float moved by one ulp is reported" "$(grep -m1 FAIL "$dir/plant-$name.ref" | sed 's/^FAIL *//; s/ = [^:]*: / /' | cut -c1-160)" ||
        check FAIL "wire $*: a planted one-ulp change reported" "$(tail -2 "$dir/plant-$name.ref" 2>/dev/null)"
done

# planted bugs (ZEROPP_MUTANTS=1: make test-zeropp-mutants, ~3 min): a copy of the sources with one bug, built
# into a temporary binary; the wire check above must FAIL on it (and the run itself must finish, so that it is the
# check that catches it). For each, the loss-bound check of 8 steps is run too and its verdict printed (not asserted).
mutant() { # name config-B eps_w qgz flags... (the patch: the Python table below)
    local name=$1 B=$2 eps=$3 qgz=$4
    shift 4
    local m="$dir/mutant-$name"
    mkdir -p "$m" && cp train_gpt.c "$m/" && cp -r gptc "$m/" || { check FAIL "mutant $name: copy"; return; }
    $PY - "$name" "$m" > "$m.patch" 2>&1 <<'PY' || { check FAIL "mutant $name: the patch no longer applies" "$(tail -1 "$m.patch")"; return; }
import sys
name, root = sys.argv[1], sys.argv[2]
Q, Z = "gptc/quant.h", "gptc/zeropp.h"
table = {  # the bug kinds of issue 15
    "scale-of-next-block": (Q, [("float s = scales[b]; /*", "float s = scales[b + 1 < nb ? b + 1 : b]; /*")]),
    "block-max-misses-last": (Q, [("for (size_t i = lo; i < hi; i++) {\n            float a = fabsf(",
                                   "for (size_t i = lo; i + 1 < hi; i++) {\n            float a = fabsf(")]),
    "int4-nibbles-swapped-on-decode": (Q, [("float d0 = (float)(((byte & 0xF) ^ 8) - 8) * s;", "float d0 = (float)(((byte >> 4) ^ 8) - 8) * s;"),
                                           ("float d1 = (float)(((byte >> 4) ^ 8) - 8) * s;", "float d1 = (float)(((byte & 0xF) ^ 8) - 8) * s;")]),
    "sum-requantised-at-hop-1": (Z, [("quant_slot_decode(z->recv, z->cnt[d->rank], bits, z->block, z->partial + z->poff[p0], 1);",
                                      "quant_slot_decode(z->recv, z->cnt[d->rank], bits, z->block, z->partial + z->poff[p0], 1);"
                                      " if (z->cnt[d->rank]) { quant_slot_encode(z->partial + z->poff[p0], NULL, z->cnt[d->rank], bits,"
                                      " z->block, z->recv); quant_slot_decode(z->recv, z->cnt[d->rank], bits, z->block, z->partial + z->poff[p0], 0); }")]),
    "no-feedback-at-hop-0": (Z, [("float* res0 = z->residual;", "float* res0 = NULL;")]),
    "secondary-not-refreshed": (Z, [("if (z->sec_step != lv->steps) z->sec_step", "if (z->sec_step < 0) z->sec_step")]),
    "slice-one-float-early": (Z, [("z->block, dst + zeropp_at(z, q, a), 0);",
                                   "z->block, dst + (zeropp_at(z, q, a) ? zeropp_at(z, q, a) - 1 : 0), 0);")]),
}
path, subs = table[name]
text = open(f"{root}/{path}").read()
for old, new in subs:
    n = text.count(old)
    if n != 1:
        sys.exit(f"{path}: '{old[:60]}' found {n} times, not once: update the mutant table")
    text = text.replace(old, new)
open(f"{root}/{path}", "w").write(text)
print(f"{path}: {len(subs)} line(s) changed")
PY
    $MUTANT_CC -o "$m/train_gpt_mpi" "$m/train_gpt.c" $MUTANT_LIBS > "$m.build" 2>&1 ||
        { check FAIL "mutant $name: build" "$(grep -m2 error "$m.build")"; return; }
    wire "m-$name" "$B" "$m/train_gpt_mpi" "$@"
    local rc=$? caught=$(grep -m1 '^FAIL' "$dir/wire-m-$name.ref" 2>/dev/null | sed 's/^FAIL *//; s/ = [^:]*: / /' | cut -c1-220)
    local bnd="its 8-step run failed"
    timeout -k 10 120 $MPIRUN -np 4 "$m/train_gpt_mpi" $COMMON -b 3 --topology 2x2 "$@" --log-file "$dir/b-$name.jsonl" \
        > "$dir/b-$name.out" 2>&1 && bnd=$(bound "b-$name" t2x2 "$eps" "$qgz")
    set -- $bnd
    case $rc in
    1) check ok "mutant $name ($(head -1 "$m.patch" | cut -d: -f1)): the wire check FAILS" \
           "$caught; the 8-step loss-bound check alone: $( [ "$1" = ok ] && echo "passes it (worst |dloss|/tol $2)" || echo "$bnd")" ;;
    0) check FAIL "mutant $name: the wire check did not catch it" "loss bound: $bnd" ;;
    *) check FAIL "mutant $name: the run failed (a crash, not the check)" "$(tail -2 "$dir/wire-m-$name.out")" ;;
    esac
    rm -rf "$m"
}
if [ "${ZEROPP_MUTANTS:-0}" = 1 ]; then
    MUTANT_CC=${MUTANT_CC:-mpicc -O3 -march=native -fno-math-errno -std=c11 -fopenmp -DUSE_MPI -DGPTC_TEST_HOOKS}
    MUTANT_LIBS=${MUTANT_LIBS:--lm -pthread}
    i254=$(echo "1/254" | bc -l) i14=$(echo "1/14" | bc -l)
    mutant scale-of-next-block 3 $i254 0 --qwz 8
    mutant block-max-misses-last 3 $i254 0 --qwz 8
    mutant int4-nibbles-swapped-on-decode 3 $i14 0 --qwz 4
    mutant sum-requantised-at-hop-1 3 0 1 --qgz 8
    mutant no-feedback-at-hop-0 3 0 1 --qgz 8 --qgz-feedback 1
    mutant secondary-not-refreshed 3 $i254 0 --qwz 8 --hpz 1
    mutant slice-one-float-early 3 $i254 0 --qwz 8
fi

# refusals
refuse() { # want flags...
    local want=$1
    shift
    timeout -k 10 60 "$BIN" "$@" > "$dir/bad.out" 2>&1
    [ $? -ne 0 ] && grep -q -- "$want" "$dir/bad.out" && check ok "refused: $*" "$(grep -m1 error "$dir/bad.out")" ||
        check FAIL "refused: $*" "$(tail -2 "$dir/bad.out")"
}
refuse "add --zero 3" --model d2 --zero 2 --qwz 8
refuse "needs --qgz" --model d2 --zero 3 --qgz-feedback 1
refuse "must be 0, 4 or 8" --model d2 --zero 3 --qwz 3
refuse "even with INT4" --model d2 --zero 3 --qgz 4 --quant-block 63

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
