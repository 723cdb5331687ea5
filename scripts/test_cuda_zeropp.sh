#!/bin/bash
# scripts/test_cuda_zeropp.sh — ZeRO++ on the GPU trainer's --zero 3 (issue
# 15: train_gpt.cu, "ZeRO++ on --zero 3": qwZ --qwz 8|4, hpZ --hpz 1, qgZ
# --qgz 4|8 with --qgz-feedback), executed on the CPU (./train_gpt_cu_cpu,
# one MPI rank per emulated GPU, NCCL over MPI: dev/cuda/cpu/NCCL.md). Not
# run on a GPU.
#
#   scripts/test_cuda_zeropp.sh      # make test-cuda-zeropp builds and runs it (not in make test)
#
# The small GPT of scripts/test_cuda_zero3.sh (L = 3, C = 64, T = 64, P =
# 170,560), 2 steps of 2 micro-batches, blocks of 64 (most pieces hold many
# blocks; the layer's piece, 25,024 on 2 GPUs, is not a multiple of 64, so
# every slot ends in a short block), on 2 emulated GPUs (one node of 2) and
# on 4 as --topology 2x2 (two nodes of 2): plain --zero 3, qwZ, qgZ, hpZ and
# all three (2x2: INT4 weights, INT8 gradients with error feedback). Each
# ZeRO++ run, checked:
#   - the wire, bit for bit: with GPTC_ZEROPP_DUMP each rank writes its
#     master (or bf16) shard, every gather's bf16 weights, hpZ's secondary,
#     the local gradients and grad_shard after each qgZ reduction (both
#     steps); scripts/zeropp_ref.py --layout buckets --gather bf16 re-derives
#     every one from the masters and the local gradients of all ranks in
#     numpy, from the documented format alone (gptc/quant.h's blocks,
#     scales and rounding; gptc/zeropp.h's hops, orders and residuals), and
#     they must match bit for bit (fixed rounding: __fmul_rn / __fadd_rn,
#     no FMA; the sums in the documented order);
#   - the bytes per level per step summed over the ranks, every step and the
#     run's mean, equal to scripts/zeropp_bytes.py --gpu (from the model
#     shape alone: slots of INT8/INT4 payload + one fp32 scale per block,
#     qgZ's two hops, hpZ's node-only gathers, bf16 elsewhere);
#   - the device memory plan == the allocation ledger (--plan-check 1, after
#     set-up and after training) with ZeRO++'s buffers in it;
#   - the losses against plain --zero 3's: hpZ alone bit for bit (losses,
#     norms, final model: the secondary holds the gathered bf16 itself);
#     the quantised modes within a first-order bound and not bit for bit.
#     The bound (scripts/test_zeropp.sh's, plus bf16): a step's loss moves
#     by at most about ||g|| ||dw|| when the weights it sees move by dw.
#     Plain --zero 3 computes with the bf16 shard AdamW rounded
#     stochastically from the master (within 2^-7 |w| an element); qwZ
#     with bf16(deq(q(master))), within eps_w max|block| + 2^-8 |w| of the
#     master (eps_w = 1/254 INT8, 1/14 INT4: half a code). So ||dw|| <=
#     (eps_w + 2^-7 + 2^-8) ||w||_2. qgZ's gradient error moves each
#     AdamW update by at most about lr an element: sqrt(P) sum_{s<t} lr_s
#     after t steps. tol_t = ||g_t|| ((eps_w + 3 2^-8) ||w||_2 + [qgz]
#     sqrt(P) sum_{s<t} lr_s), ||g_t|| plain's norm, ||w||_2 bounded by the
#     final model's norm + sqrt(P) sum_s lr_s. Loose (the worst ratio is
#     printed): it catches gross bugs only; the wire check is the exact one;
#   - the order between streams: a dump record waits for the communication
#     stream (which would hide a missing event wait), so qwZ + hpZ + qgZ
#     runs once more without dumps on 2 GPUs: the layer's race check
#     reports nothing and the losses are the dumped run's;
#   - a resume: that run's state at step 1 resumed: the final model bit for
#     bit the uninterrupted run's (the state is fp32 and ZeRO++ keeps
#     nothing across steps without error feedback);
#   - planted bugs, each in a copy of train_gpt.cu built through the layer:
#     a dequantisation reading the next element's block scale FAILS the wire
#     check (the run itself finishes; with MORE_MUTANTS=1 also hpZ's
#     secondary cut in the first step only, ~70 s more); qwZ's quantisation
#     queued on the compute stream, so that no event orders it before the
#     all-gather of its slots (a missing wait), is reported by the layer's
#     race check between streams. (A slot_free recorded before qgZ's
#     kernels is not such a bug under ZeRO-3: the next gather's w_ready,
#     which the compute stream waits for before the slot is reused, is
#     queued after them);
#   - refused with a clear error: --qwz without --zero 3.
# About 5 minutes on two shared cores. The last line is "cuda zeropp: N
# passed, N failed"; exit status non-zero on failure.
set -u
cd "$(dirname "$0")/.."
. scripts/check.sh         # check ok|FAIL what [detail], $passed, $failed, $CLEAN_ENV
. scripts/emulated_gpus.sh # emulated_begin, emulated_run, emulated_final, emulated_lines
emulated_begin cuda_zeropp test-cuda-zeropp # $BIN $PY $LOG $START $MPIRUN
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 400000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
C=64; L=3; Vp=256; maxT=64; T=64; B=2; A=2; STEPS=2; BLOCK=64
P=$(( Vp * C + maxT * C + 2 * C + L * (12 * C * C + 13 * C) ))
SMALL="--model d$L --channels $C --num-heads 2 --max-seq-len $maxT --vocab-size $Vp --train-data $TOY --seq-len $T
       --batch-size $B --steps $STEPS --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 0 --sample-every 0
       --quant-block $BLOCK --plan-check 1 --comm-levels 1"

# gpus NAME W FLAGS...: W emulated GPUs (MPI ranks), the dumps in NAME.dump/ (NODUMP=1: none); rank 0's output in NAME.log
gpus() {
    local dump=""
    rm -rf "$LOG/$1.dump"
    [ -z "${NODUMP:-}" ] && dump=$LOG/$1.dump && mkdir -p "$dump"
    GPTC_ZEROPP_DUMP="$dump" EMULATED_EXPORT=GPTC_ZEROPP_DUMP emulated_run "$@"
}
final() { emulated_final "$1"; }
lines() { emulated_lines "$1" "$2"; }
# ref NAME W NxK FLAGS...: zeropp_ref.py's verdict on NAME's dumps (its output in NAME.ref)
ref() {
    local name=$1 w=$2 topo=$3
    shift 3
    $PY scripts/zeropp_ref.py "$LOG/$name.dump" --np "$w" --topology "$topo" --params $P --steps $STEPS --block $BLOCK \
        --layout buckets --gather bf16 "$@" > "$LOG/$name.ref" 2>&1
}
# bound NAME BASE EPS_W QGZ: "ok|FAIL worst equal|differs" (the tolerance above)
bound() {
    $PY - "$LOG/$2.jsonl" "$LOG/$1.jsonl" "$(final "$2")" "$3" "$4" <<'PY'
import json, sys, numpy as np
base, run, wf, eps, qgz = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
rows = lambda p: [r for r in map(json.loads, open(p)) if "loss" in r and "val_loss" not in r]
b, q = rows(base), rows(run)
w = np.fromfile(wf, dtype="<f4", offset=1024).astype(np.float64)
P = w.size
lr_all = sum(r["lr"] for r in b)
norm_w = float(np.linalg.norm(w)) + np.sqrt(P) * lr_all  # >= every step's ||w||_2
if eps > 0:  # qwZ: and the two bf16 roundings, plain's stochastic (2^-7), qwZ's to nearest (2^-8)
    eps += 3 * 2.0 ** -8
worst, lrs, equal = 0.0, 0.0, True
for rb, rq in zip(b, q):
    tol = rb["norm"] * (eps * norm_w + (np.sqrt(P) * lrs if qgz else 0.0))
    d = abs(rb["loss"] - rq["loss"])
    equal &= rb["loss"] == rq["loss"]
    worst = max(worst, d / tol if tol > 0 else (0.0 if d == 0 else float("inf")))
    lrs += rb["lr"]
print(f"{'ok' if len(b) == len(q) > 0 and worst <= 1 and not equal else 'FAIL'} {worst:.2g} {'equal' if equal else 'differs'}")
PY
}
measured() { sed -n 's/^bytes sent per step by level .*: intra-node \([0-9]*\), inter-node \([0-9]*\) summed.*/\1 \2/p' "$LOG/$1.log" | tail -n 1; }
steps_agree() { [ "$(grep -c "^step [0-9]*: bytes sent: intra-node ${2% *}, inter-node ${2#* } (summed" "$LOG/$1.log")" -eq "$STEPS" ]; }
echo "P = $P parameters (L = $L, C = $C), $A micro-batches a step, $STEPS steps, blocks of $BLOCK"

# ---- the runs ------------------------------------------------------------------------
# mode NAME BASE W N K HIER QWZ QGZ FB HPZ: one ZeRO++ run and its checks (wire, bytes, plan, losses)
mode() {
    local name=$1 base=$2 w=$3 n=$4 k=$5 h=$6 qwz=$7 qgz=$8 fb=$9 hpz=${10} flags="" topo="" rc want got eps r
    [ "$qwz" != 0 ] && flags="$flags --qwz $qwz"
    [ "$qgz" != 0 ] && flags="$flags --qgz $qgz"
    [ "$fb" != 0 ] && flags="$flags --qgz-feedback 1"
    [ "$hpz" != 0 ] && flags="$flags --hpz 1"
    [ "$n" -gt 1 ] && topo="--topology ${n}x$k"
    gpus "$name" "$w" --zero 3 $topo $flags
    rc=$?
    [ $rc -eq 0 ] || { check FAIL "$name: the run" "rc=$rc; $(grep -m 2 -E 'error|cuda_cpu' "$LOG/$name.log")"; return; }
    ref "$name" "$w" "${n}x$k" --qwz "$qwz" --qgz "$qgz" --feedback "$fb" --hpz "$hpz"
    check "$([ $? -eq 0 ] && echo ok)" "$name ($w GPUs${topo:+, $topo}:$flags): the wire = zeropp_ref.py's, bit for bit" \
        "$(grep -E ' [0-9]+ of [0-9]+ records' "$LOG/$name.ref" | sed 's/ =.*: / /; s/ (forward and backward)//; s/^ok *//' | tr '\n' ';')"
    want=$($PY scripts/zeropp_bytes.py --gpu "$h" $L $C $Vp $maxT "$w" "$n" "$k" "$qwz" "$qgz" "$hpz" $BLOCK $A | cut -d' ' -f1,2)
    got=$(measured "$name")
    check "$([ "$got" = "$want" ] && steps_agree "$name" "$want" && echo ok)" \
        "$name: bytes per step intra-node, inter-node = zeropp_bytes.py --gpu, every step" "measured $got, formula $want"
    check "$([ "$(grep -c '^plan-check: rank 0, .*: equal$' "$LOG/$name.log")" = 2 ] && echo ok)" \
        "$name: device memory plan == ledger (after set-up and after training)" \
        "$(grep -m 1 '^ZeRO++' "$LOG/$name.log" | sed 's/.*; \([0-9.]* MB of buffers\)/ZeRO++ \1/')"
    if [ "$qwz" = 0 ] && [ "$qgz" = 0 ]; then
        check "$([ "$(lines "$name" loss | wc -l)" -eq $STEPS ] && cmp -s <(lines "$name" loss) <(lines "$base" loss) &&
            cmp -s <(lines "$name" norm) <(lines "$base" norm) && cmp -s "$(final "$name")" "$(final "$base")" && echo ok)" \
            "$name: hpZ alone = plain --zero 3 bit for bit (losses, norms, final model)" \
            "losses $(lines "$name" loss | cut -d' ' -f2 | tr '\n' ' ')"
        return
    fi
    eps=$([ "$qwz" = 8 ] && echo "1/254" || { [ "$qwz" = 4 ] && echo "1/14" || echo 0; })
    r=$(bound "$name" "$base" "$(echo "$eps" | bc -l)" "$([ "$qgz" != 0 ] && echo 1 || echo 0)")
    set -- $r
    check "$([ "$1" = ok ] && echo ok)" "$name: every loss within the quantisation bound of plain --zero 3's, not bit for bit" \
        "worst |dloss|/tol $2 (<= 1), $3"
}
gpus w2_plain 2 --zero 3
check "$([ $? -eq 0 ] && echo ok)" "w2 plain --zero 3 (the baseline)" "losses $(lines w2_plain loss | cut -d' ' -f2 | tr '\n' ' ')"
mode w2_qwz8 w2_plain 2 1 2 0 8 0 0 0
mode w2_qgz4 w2_plain 2 1 2 0 0 4 0 0
mode w2_hpz w2_plain 2 1 2 0 0 0 0 1
mode w2_all w2_plain 2 1 2 0 8 4 0 1
gpus t_plain 4 --zero 3 --topology 2x2
check "$([ $? -eq 0 ] && echo ok)" "2x2 plain --zero 3 (the baseline)" "losses $(lines t_plain loss | cut -d' ' -f2 | tr '\n' ' ')"
mode t_qwz8 t_plain 4 2 2 1 8 0 0 0
mode t_qgz4 t_plain 4 2 2 1 0 4 0 0
mode t_hpz t_plain 4 2 2 1 0 0 0 1
mode t_all_fb t_plain 4 2 2 1 4 8 1 1
plain=$(measured t_plain) zpp=$(measured t_all_fb)
check "$([ -n "${zpp#* }" ] && [ "${zpp#* }" -lt "${plain#* }" ] && echo ok)" \
    "cross-node bytes per step, 2x2: plain --zero 3 ${plain#* }, qwZ(INT4)+hpZ+qgZ(INT8) ${zpp#* }" \
    "$(echo "scale=2; ${plain#* } / ${zpp#* }" | bc)x lower"

# ---- a resume, and the streams' order without the dumps' waits --------------------------
# (each dump record waits for the communication stream, which would hide a missing event wait from the
# layer's race check: these two runs dump nothing, so the check sees ZeRO++'s own ordering)
ALL="--zero 3 --qwz 8 --hpz 1 --qgz 4 --save-every 1"
NODUMP=1 gpus rs_a 2 $ALL
rc=$?
check "$([ $rc -eq 0 ] && [ "$(lines rs_a loss)" = "$(lines w2_all loss)" ] && echo ok)" \
    "2 GPUs qwZ+hpZ+qgZ without dumps: no race between streams reported, the losses of the run with dumps" "rc=$rc"
rm -rf "$LOG/rs_b" && cp -r "$LOG/rs_a" "$LOG/rs_b" && rm -f "$LOG/rs_b/state_0000000$STEPS.complete" "$(final rs_b)"
NODUMP=1 gpus rs_b 2 $ALL --resume 1
check "$([ $? -eq 0 ] && grep -q 'continuing after step 1' "$LOG/rs_b.log" && [ -f "$(final rs_a)" ] &&
    cmp -s "$(final rs_b)" "$(final rs_a)" && echo ok)" \
    "2 GPUs qwZ+hpZ+qgZ: a state at step 1 resumed: final model bit for bit the uninterrupted run's" \
    "$(grep -m 1 -E 'resume: |error' "$LOG/rs_b.log" | cut -c1-80)"

# ---- planted bugs, each in a copy of train_gpt.cu (or of a gptc/cuda header) built through the layer ----
# mutant NAME OLD NEW: builds $LOG/NAME from train_gpt.cu and gptc/cuda/*.cuh with OLD (once, exactly, in
# one of them) replaced by NEW (0), or 1; a planted header goes, translated, into $LOG/NAME.inc, first on
# the include path
mutant() {
    local mut=$LOG/$1
    rm -rf "$mut.src" "$mut.inc"
    $PY - "$2" "$3" "$mut.cu" "$mut.src" <<'PY' > "$mut.build" 2>&1 || return 1
import glob, os, sys
old, new, out, src = sys.argv[1:5]
files = ["train_gpt.cu"] + sorted(glob.glob("gptc/cuda/*.cuh"))
texts = {f: open(f).read() for f in files}
n = sum(t.count(old) for t in texts.values())
if n != 1:
    sys.exit(f"'{old}' found {n} times in train_gpt.cu and gptc/cuda/*.cuh, not once: update the planted bug")
f = next(f for f in files if old in texts[f])
os.makedirs(src)
if f == "train_gpt.cu":
    open(out, "w").write(texts[f].replace(old, new))
else:
    open(out, "w").write(texts["train_gpt.cu"])
    os.makedirs(os.path.join(src, os.path.dirname(f)))
    open(os.path.join(src, f), "w").write(texts[f].replace(old, new))
PY
    local h
    for h in $(cd "$mut.src" && find . -name '*.cuh'); do
        mkdir -p "$(dirname "$mut.inc/$h")" && $PY dev/cuda/cpu/translate.py "$mut.src/$h" "$mut.inc/$h" || return 1
    done
    $PY dev/cuda/cpu/translate.py "$mut.cu" "$mut.t.cu" &&
        g++ -I"$mut.inc" $(make -s --no-print-directory print-cpu-app-flags) -DUSE_MPI -c -o "$mut.o" "$mut.t.cu" >> "$mut.build" 2>&1 &&
        g++ -o "$mut" "$mut.o" $(make -s --no-print-directory print-cpu-layer) $(make -s --no-print-directory print-cpu-app-libs) \
        >> "$mut.build" 2>&1
}
# wire_mutant NAME WHAT OLD NEW W NxK FLAGS...: the run finishes and the wire check FAILS
wire_mutant() {
    local name=$1 what=$2 old=$3 new=$4 w=$5 topo=$6 rc
    shift 6
    if ! mutant "$name" "$old" "$new"; then check FAIL "planted $name built" "$(tail -n 2 "$LOG/$name.build")"; return; fi
    BIN_SAVED=$BIN BIN=$LOG/$name
    gpus "m_$name" "$w" --zero 3 --topology "$topo" "$@"
    rc=$?
    BIN=$BIN_SAVED
    local flags=$(echo " $* " | sed 's/ --qgz-feedback 1 / --feedback 1 /')
    ref "m_$name" "$w" "$topo" $flags
    local verdict=$?
    check "$([ $rc -eq 0 ] && [ $verdict -ne 0 ] && grep -q '^FAIL' "$LOG/m_$name.ref" && echo ok)" \
        "planted: $what: the wire check FAILS" \
        "rc=$rc; $(grep -m 1 '^FAIL' "$LOG/m_$name.ref" | sed 's/^FAIL *//; s/ = [^:]*: / /' | cut -c1-160)"
}
wire_mutant next_scale "a dequantisation reads the next element's block scale (--qwz 8)" \
    'return __fmul_rn((float)code, scales[k / (size_t)block]);' \
    'return __fmul_rn((float)code, scales[(k + 1) / (size_t)block]);' 2 1x2 --qwz 8
[ -n "${MORE_MUTANTS:-}" ] && wire_mutant stale_secondary "hpZ's secondary cut in the first step only (--qwz 8 --hpz 1, 2x2)" \
    'if (z->sec_step != lv->steps) z->sec_step = lv->steps, z->sec_filled = 0;' \
    'if (z->sec_step < 0) z->sec_step = lv->steps, z->sec_filled = 0;' 4 2x2 --qwz 8 --hpz 1
# the ordering: qwZ's quantisation queued on the compute stream, where no event orders it before the
# all-gather of its slots on the communication stream (nor after that stream's last read of them)
if mutant unordered_quant 'quant_encode_gpu(mine, dp->master + off, NULL, p, z->qwz, z->block, cs);' \
    'quant_encode_gpu(mine, dp->master + off, NULL, p, z->qwz, z->block, dp->g->stream); /* planted */'; then
    BIN_SAVED=$BIN BIN=$LOG/unordered_quant
    NODUMP=1 gpus race_quant 2 --zero 3 --qwz 8 --steps 1
    rc=$?
    BIN=$BIN_SAVED
    check "$([ $rc -ne 0 ] && grep -q -E "race between streams|not ordered before it" "$LOG/race_quant.log" && echo ok)" \
        "planted: qwZ's slots quantised on the compute stream, unordered with their all-gather: the layer reports it" \
        "rc=$rc; $(grep -m 1 -o -E "race between streams: '[^']*' ([^)]*) [a-z]*|read of [0-9]* bytes at [^,]*, which nothing has written" "$LOG/race_quant.log")"
else
    check FAIL "planted unordered_quant built" "$(tail -n 2 "$LOG/unordered_quant.build")"
fi

# ---- refused ----------------------------------------------------------------------------
$CLEAN_ENV "$BIN" $SMALL --zero 2 --qwz 8 > "$LOG/refused.log" 2>&1
rc=$?
check "$([ $rc -ne 0 ] && grep -q 'add --zero 3' "$LOG/refused.log" && echo ok)" "--zero 2 --qwz 8: refused" \
    "$(grep -m 1 error "$LOG/refused.log" | cut -c1-100)"

echo "cuda zeropp: $passed passed, $failed failed ($(( $(date +%s) - START ))s, logs in $LOG)"
[ $failed -eq 0 ]
