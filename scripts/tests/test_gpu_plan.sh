#!/bin/bash
# scripts/tests/test_gpu_plan.sh — the GPU trainer's memory plan against its
# allocation, and the optimizer offload, on the CPU execution layer (issue 14;
# dev/cuda/cpu: train_gpt.cu executed on the CPU, its cudaMalloc real memory).
#
#   make test-gpu-plan          (builds train_gpt_cu_cpu, then runs this)
#   scripts/tests/test_gpu_plan.sh [LOG_DIR]
#
# What must hold:
#   1. a grid of 26 configurations (depths 1-4, B, T, --recompute 0-3,
#      --gelu-fusion, --cuda-graphs, gradient accumulation, snapshots, ZeRO
#      0-3 on 1 rank and on 2 ranks under mpirun, --offload): every run's
#      --plan-check 1 says "equal" after setup and after training, i.e. the
#      device-allocation ledger equals gpu_memory_plan_for component by
#      component, byte for byte, its peak equals the plan's total, and the
#      CPU layer's own count of cudaMalloc'd bytes (cudaMemGetInfo) equals
#      both (an allocation that bypassed the ledger would show there);
#   2. the ledger's model state and activations equal closed forms written
#      here independently (python, from DESIGN.md's parameter count and the
#      activation shapes): bf16 weights 2P, master 4P, gradients 4P, moments
#      8P on one GPU; ZeRO's shard S from the padded buckets (ZeRO-3's bf16
#      weights: the gathered head and two layers); --offload 1
#      moves master and moments off the device (and 4P of pinned gradients
#      appear on the host); the activations of each --recompute level;
#   3. --offload 1 trains the same model bytes as --offload 0 (clipping
#      active: --grad-clip 0.5, a norm above it), on one GPU and on 2 ranks
#      plain data parallel, and at --recompute 3 over 6 steps with
#      validation between them; resumes from its own training state to the
#      same bytes; and overlaps: the forward after each update (a training
#      step's or a validation's) had its layer 0 launched while the host's
#      AdamW still had pieces to run (the "offload: ..." line);
#   4. --plan prints the candidates and a choice; with the emulated GPU's
#      memory set to the budget (CUDA_CPU_MEMORY_MB) the default flags fail
#      the memory check, and the choice trains with plan == allocation;
#      a budget only --offload 1 fits makes it the choice; a budget nothing
#      fits gives the error naming the smallest;
#   5. the check fails on bugs planted in copies of train_gpt.cu and its headers: a plan
#      that forgets a buffer, and a cudaMalloc past the ledger; --offload 1's
#      forward without its wait for each layer's update (the layer reports the
#      race), and an update that blocks the host until it is done (the
#      overlap count says 0).
# About 5 minutes on two shared cores. Last line "gpu plan: N passed, N
# failed"; exit status non-zero on failure.
cd "$(dirname "$0")/../.." || exit 1
LOG=${1:-$(mktemp -d /tmp/gptc_gpu_plan.XXXXXX)}
mkdir -p "$LOG"
BIN=./train_gpt_cu_cpu
PY=/usr/bin/python3
export XDG_CACHE_HOME=$LOG/cache # (--plan's calibration, measured once and shared by the runs below)
[ -x $BIN ] || { echo "test_gpu_plan: $BIN not built: make train_gpt_cu_cpu"; exit 1; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
. scripts/tests/check.sh # check ok|FAIL what [detail], $passed, $failed, $CLEAN_ENV
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 200000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
BASE="--channels 64 --num-heads 2 --max-seq-len 64 --vocab-size 256 --train-data $TOY --lr 3e-3 --warmup-steps 2
      --val-every 0 --sample-every 0"

# the closed forms (item 2): LOG_FILE L B T W ZERO RECOMPUTE OFFLOAD -> "ok detail" or "FAIL detail"
closed_form() {
    $PY - "$@" <<'EOF'
import re, sys
log, L, B, T, W, zero, r, off = sys.argv[1], *map(int, sys.argv[2:])
C, NH, Vp, maxT = 64, 2, 256, 64
P = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
text = open(log).read()
m = re.search(r"rank 0, after setup: ledger by component: (.*)", text)
if not m: print("FAIL no ledger line"); sys.exit()
led = {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split("; "))}
r256 = lambda x: (x + 255) // 256 * 256
BT = B * T
# (name, elements, bytes, the recompute level from which it is not kept; 9: always kept)
acts = [("encoded", BT*C, 2, 9), ("ln1", L*BT*C, 2, 2), ("ln1_mean", L*BT, 4, 3), ("ln1_rstd", L*BT, 4, 3),
        ("qkv", L*BT*3*C, 2, 3), ("atty", L*BT*C, 2, 3), ("lse", L*B*NH*T, 4, 3), ("residual2", L*BT*C, 2, 3),
        ("ln2", L*BT*C, 2, 2), ("ln2_mean", L*BT, 4, 3), ("ln2_rstd", L*BT, 4, 3), ("fch", L*BT*4*C, 2, 3),
        ("fch_gelu", L*BT*4*C, 2, 1), ("residual3", L*BT*C, 2, 9), ("lnf", BT*C, 2, 9), ("lnf_mean", BT, 4, 9),
        ("lnf_rstd", BT, 4, 9), ("logits", BT*Vp, 2, 9), ("losses", BT, 4, 9)]
want = {"bf16 weights": 2 * P, "activations": sum(r256(n * b) for _, n, b, lv in acts if r < lv)}
if zero and True:
    unit = W * 64
    lp = -(-(12 * C * C + 13 * C) // unit) * 64
    rp = -(-(Vp * C + maxT * C + 2 * C) // unit) * 64
    S = L * lp + rp
    buckets = S * W if zero == 1 else (2 * lp + rp) * W
    want.update({"fp32 master": 4 * S, "AdamW moments": 8 * S, "fp32 gradients": 4 * (buckets + S)})
    if zero == 3: want["bf16 weights"] = 2 * (rp + 2 * lp) * W  # the head and two layers, gathered
else:
    want.update({"fp32 gradients": 4 * P, "fp32 master": 0 if off else 4 * P, "AdamW moments": 0 if off else 8 * P,
                 "pinned: offload gradients": 4 * P if off else 0})
bad = [f"{k}: ledger {led.get(k)} closed form {v}" for k, v in want.items() if led.get(k) != v]
print(("FAIL " + "; ".join(bad)) if bad else
      f"ok P={P}: " + ", ".join(f"{k} {v}" for k, v in want.items()))
EOF
}

# run NAME W ARGS...: W ranks (1: one process), --plan-check 1, output in $LOG/NAME.log
run() {
    local name=$1 w=$2
    shift 2
    if [ "$w" -eq 1 ]; then
        $CLEAN_ENV timeout 300 $BIN $BASE --plan-check 1 "$@" > "$LOG/$name.log" 2>&1 < /dev/null
    else
        $CLEAN_ENV timeout 300 $MPIRUN -np "$w" -x GPTC_RUN_ID="gpu-plan-$$-$name" $BIN --init mpi --comm-timeout 120 \
            $BASE --plan-check 1 "$@" > "$LOG/$name.log" 2>&1 < /dev/null # (mpirun reads stdin: the grid)
    fi
}

# ---- 1 and 2. the grid ---------------------------------------------------------------
# name W L B T zero recompute offload extra...
GRID="
g01 1 2 4 64 0 0 0
g02 1 2 4 64 0 1 0
g03 1 2 4 64 0 2 0
g04 1 2 4 64 0 3 0
g05 1 2 4 64 0 1 0 --gelu-fusion 0
g06 1 2 4 64 0 2 0 --gelu-fusion 0 --cuda-graphs 0
g07 1 1 2 32 0 0 0
g08 1 1 2 32 0 3 0
g09 1 4 1 64 0 1 0
g10 1 4 3 48 0 3 0
g11 1 2 8 16 0 2 0
g12 1 2 2 64 0 0 0 --total-batch-size 512
g13 1 2 2 64 0 2 0 --snapshot-every 1 --output-dir LOGDIR/g13
g14 1 3 2 64 1 0 0
g15 1 3 2 64 2 3 0
g16 1 2 4 64 0 0 1
g17 1 3 2 32 0 3 1 --output-dir LOGDIR/g17
g18 2 2 2 64 0 0 0
g19 2 2 2 64 1 1 0
g20 2 2 2 64 2 3 0
g21 2 3 1 32 2 2 0
g22 2 1 4 64 1 0 0
g23 2 2 2 64 0 2 1
g24 1 2 2 64 3 1 0
g25 2 2 2 64 3 0 0
g26 2 3 1 32 3 3 0
"
while read -r name w L B T zero r off extra; do
    [ -n "$name" ] || continue
    extra=${extra//LOGDIR/$LOG}
    run "$name" "$w" --model "d$L" -b "$B" -t "$T" --steps 1 --zero "$zero" --recompute "$r" --offload "$off" $extra
    rc=$?
    eq=$(grep -c "^plan-check: rank 0, after \(setup\|training\): plan .*: equal$" "$LOG/$name.log")
    cf=$(closed_form "$LOG/$name.log" "$L" "$B" "$T" "$w" "$zero" "$r" "$off")
    ok=$([ $rc -eq 0 ] && [ "$eq" = 2 ] && [ "${cf%% *}" = ok ] && echo ok || echo FAIL)
    check $ok "plan == ledger == cudaMemGetInfo: $name, $w rank(s), d$L B=$B T=$T --zero $zero --recompute $r --offload $off${extra:+ ${extra%% --output-dir*}}" \
        "rc=$rc, $eq of 2 checks equal; closed form: ${cf#* }"
    [ $ok = ok ] || grep -m 5 "plan-check\|error" "$LOG/$name.log"
done <<< "$GRID"

# ---- 3. --offload 1 trains the same bytes ----------------------------------------------
TRAIN="--model d2 -b 4 -t 64 --steps 4 --grad-clip 0.5 --save-every 2"
clipped() { grep -o 'norm [0-9.]*' "$LOG/$1.log" | awk '$2 > 0.5' | wc -l; } # NAME: steps whose norm was clipped
for w in 1 2; do
    for off in 0 1; do run "offload${off}_w$w" $w $TRAIN --offload $off --output-dir "$LOG/offload${off}_w$w"; done
    a=$LOG/offload0_w$w/model_00000004.bin
    b=$LOG/offload1_w$w/model_00000004.bin
    ok=$([ -s "$a" ] && cmp -s "$a" "$b" && [ "$(clipped "offload1_w$w")" -gt 0 ] && echo ok || echo FAIL)
    check $ok "--offload 1 on $w rank(s) (plain data parallel on 2): the same model bytes after 4 steps as --offload 0 (clipping active)" \
        "$(grep -o 'norm [0-9.]*' "$LOG/offload1_w$w.log" | head -2 | tr '\n' ' ')"
done
# --recompute 3 (each layer's forward again in backward), 6 steps, a validation forward after every second update
RC3="--model d2 -b 4 -t 64 --steps 6 --grad-clip 0.5 --recompute 3 --val-data $TOY --val-every 2 --val-batches 1"
for off in 0 1; do run "offload${off}_r3" 1 $RC3 --offload $off --output-dir "$LOG/offload${off}_r3"; done
a=$LOG/offload0_r3/model_00000006.bin
b=$LOG/offload1_r3/model_00000006.bin
ok=$([ -s "$a" ] && cmp -s "$a" "$b" && [ "$(clipped offload1_r3)" -gt 0 ] && grep -q "val loss" "$LOG/offload1_r3.log" && echo ok || echo FAIL)
check $ok "--offload 1 at --recompute 3, 6 steps with validation between: the same model bytes as --offload 0 (clipping active)" \
    "$(clipped offload1_r3) of 6 norms over 0.5; $(grep -c 'val loss' "$LOG/offload1_r3.log") validations"
# the overlap: "offload: U updates; after O of the F followed by a forward, ..." with O = F >= U - 1 > 0
for name in offload1_w1 offload1_w2 offload1_r3; do
    read -r u o f <<< "$(sed -n 's/^offload: \([0-9]*\) updates; after \([0-9]*\) of the \([0-9]*\) followed by a forward.*/\1 \2 \3/p' "$LOG/$name.log" | head -n 1)"
    ok=$([ -n "$u" ] && [ "$u" -gt 1 ] && [ "$o" = "$f" ] && [ "$f" -ge $((u - 1)) ] && echo ok || echo FAIL)
    check $ok "$name: the forward after each update was launched before the host's AdamW finished (overlapped)" \
        "$(grep -m 1 -o '^offload: .*' "$LOG/$name.log" | cut -c1-150)"
done
# resumed: offload1_w1's folder without its final state and model, resumed with --offload 1
rm -rf "$LOG/offload_resumed"
cp -r "$LOG/offload1_w1" "$LOG/offload_resumed"
rm -f "$LOG/offload_resumed/state_00000004.complete" "$LOG/offload_resumed/model_00000004.bin"
run offload_resumed 1 $TRAIN --offload 1 --output-dir "$LOG/offload_resumed" --resume 1
ok=$([ -s "$LOG/offload_resumed/model_00000004.bin" ] && cmp -s "$LOG/offload_resumed/model_00000004.bin" "$LOG/offload0_w1/model_00000004.bin" \
     && grep -q -i "resum" "$LOG/offload_resumed.log" && echo ok || echo FAIL)
check $ok "--offload 1 resumed from its step-2 state: the same model bytes as the uninterrupted --offload 0 run"
[ $ok = ok ] || tail -n 5 "$LOG/offload_resumed.log"

# ---- 4. --plan, its budget, and its choice run -----------------------------------------------
PLAN="--model d2 -t 64 -b 16 --total-batch-size 1024"
$CLEAN_ENV $BIN $BASE $PLAN --plan 1 > "$LOG/plan_auto.log" 2>&1
ROW='^ *[0-9]+ +[0-9]+ +[0-3] +[0-3] +[01] \|.*\| +[0-9.]+ +(yes|no) \| +[0-9.]+ ' # (a candidate row, its step ms)
rows=$(grep -cE "$ROW" "$LOG/plan_auto.log")
ok=$([ "$rows" = 40 ] && grep -q "^budget: .*auto: cudaMemGetInfo" "$LOG/plan_auto.log" && grep -q "^plan: choice" "$LOG/plan_auto.log" && echo ok || echo FAIL)
check $ok "--plan: 40 candidates (B = 5 divisors of 16 sequences x 4 recompute levels x offload 0/1) with a predicted step, the budget from cudaMemGetInfo, a choice" "$rows rows"
# a budget between the default's need and recompute 3's: the default fails the memory check, the choice trains
read -r need0 need3 <<< "$($PY - "$LOG/plan_auto.log" <<'EOF'
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r" *\d+ +\d+ +[0-3] +[0-3] +[01] \|.*\| +[\d.]+ +(yes|no) \| +[\d.]+ ", l)]
need = {(int(r[0]), int(r[2]), int(r[3]), int(r[4])): float(r[r.index("|", 6) + 1]) for r in rows}
print(need[(16, 0, 0, 0)], need[(16, 0, 3, 0)])
EOF
)"
budget_mb=$($PY -c "import math; print(384 + math.ceil(($need0 + $need3) / 2))")
$CLEAN_ENV $BIN $BASE $PLAN --plan 1 --memory-budget "${budget_mb}M" > "$LOG/plan_budget.log" 2>&1
choice=$(grep -o "^plan: choice.*: -b [0-9]* --zero [0-9] --recompute [0-9] --offload [0-9]" "$LOG/plan_budget.log" | grep -o "\-b.*")
CUDA_CPU_MEMORY_MB=$budget_mb $CLEAN_ENV timeout 300 $BIN $BASE $PLAN --steps 1 > "$LOG/plan_default.log" 2>&1
rc_default=$?
run plan_choice 1 --model d2 -t 64 --total-batch-size 1024 --steps 1 $choice
rc_choice=$?
ok=$([ -n "$choice" ] && [ $rc_default -ne 0 ] && grep -q "the plan needs" "$LOG/plan_default.log" && [ $rc_choice -eq 0 ] \
     && [ "$(grep -c 'plan-check: rank 0.*: equal$' "$LOG/plan_choice.log")" = 2 ] && echo ok || echo FAIL)
check $ok "a budget of $budget_mb MB (the emulated GPU's memory too): -b 16 --recompute 0 fails the memory check; the plan's choice ($choice) trains, plan == ledger" \
    "default needs $need0 MB + 384 allowance, recompute 3 $need3 MB"
CUDA_CPU_MEMORY_MB=$budget_mb $CLEAN_ENV timeout 300 $BIN $BASE --plan-check 1 --model d2 -t 64 --total-batch-size 1024 --steps 1 $choice \
    > "$LOG/plan_choice_budget.log" 2>&1
check $([ $? -eq 0 ] && echo ok || echo FAIL) "the choice also trains on an emulated GPU of just $budget_mb MB"
# a budget only --offload 1 fits (between the least needs with and without it, + the allowance): the choice offloads
budget_b=$($PY - "$LOG/plan_auto.log" <<'EOF'
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r" *\d+ +\d+ +[0-3] +[0-3] +[01] \|.*\| +[\d.]+ +(yes|no) \| +[\d.]+ ", l)]
least = {o: min(float(r[r.index("|", 6) + 1]) for r in rows if int(r[4]) == o) for o in (0, 1)}
print(int((384 + (least[0] + least[1]) / 2) * 1048576))
EOF
)
$CLEAN_ENV $BIN $BASE $PLAN --plan 1 --memory-budget "$budget_b" > "$LOG/plan_offload.log" 2>&1
ok=$([ $? -eq 0 ] && grep -q "^plan: choice.*--offload 1," "$LOG/plan_offload.log" && echo ok || echo FAIL)
check $ok "a budget only an offloaded configuration fits ($budget_b bytes): --plan chooses --offload 1" \
    "$(grep -o 'choice.*' "$LOG/plan_offload.log" | cut -c1-140)"
$CLEAN_ENV $BIN $BASE $PLAN --plan 1 --memory-budget 300M > "$LOG/plan_none.log" 2>&1
rc=$?
ok=$([ $rc -ne 0 ] && grep -q "nothing fits in 300.0 MB.*the smallest is B=1 .*--offload 1, which needs" "$LOG/plan_none.log" && echo ok || echo FAIL)
check $ok "--plan with a budget nothing fits: an error naming the smallest configuration and its need" \
    "$(grep -o 'nothing fits.*' "$LOG/plan_none.log" | cut -c1-150)"

# ---- 5. the check can fail: bugs planted in copies of train_gpt.cu and its headers ------------------------
# mutant NAME FILE SED_EXPR WANT_REGEX WHAT [RUN_FLAGS]: FILE (train_gpt.cu or a gptc/cuda header) with
# SED_EXPR applied; the run must fail, saying WANT_REGEX
mutant() {
    local name=$1 file=$2
    shift 2
    set -- "$name" "$@"
    sed "$2" "$file" > "$LOG/$1.src"
    if cmp -s "$file" "$LOG/$1.src"; then check FAIL "mutant $1: the sed changed nothing (update this script)"; return; fi
    if ! cuda_mutant_build "$LOG/$1" "$file" "$LOG/$1.src"; then
        check FAIL "mutant $1 builds" "$(tail -n 3 "$LOG/$1.build")"
        return
    fi
    $CLEAN_ENV timeout 300 "$LOG/$1" $BASE ${5:---plan-check 1 --model d2 -b 2 -t 32 --steps 1} > "$LOG/$1.log" 2>&1 < /dev/null
    local rc=$?
    check $([ $rc -ne 0 ] && grep -q "$3" "$LOG/$1.log" && echo ok || echo FAIL) "mutant $1 caught: $4" \
        "rc=$rc: $(grep -m 1 -o "plan-check: rank 0, after setup: [^:]*: .*\|race between streams: .\{90\}" "$LOG/$1.log" | cut -c1-120)"
}
mutant plan_forgets_bias gptc/cuda/plan.cuh 's/p.bytes\[GMEM_CUBLASLT\] = LT_WORKSPACE_BYTES + LT_BIAS_COPY_ELEMS(c) \* sizeof(floatX);/p.bytes[GMEM_CUBLASLT] = LT_WORKSPACE_BYTES;/' \
    "cuBLASLt: the plan says" "the plan leaves out cuBLASLt's bias copy (8C bytes)"
mutant stray_cudamalloc train_gpt.cu 's/^    void\* dmem = gpu_alloc(tbytes, GMEM_STEP_INPUTS);/&\n    { void* stray; CUDA_CHECK(cudaMalloc(\&stray, 4096)); }/' \
    "an allocation bypassed gpu_alloc" "4 KB cudaMalloc'd past the ledger (cudaMemGetInfo sees it)"
OFF="--model d2 -b 2 -t 32 --steps 3 --grad-clip 0.5 --offload 1 --output-dir $LOG/offload_mutants"
mutant offload_no_layer_wait train_gpt.cu 's|if (!backward) gpu_offload_wait(g, g->stream, 1 + l);|;|' "race between streams: 'bf16_round_range_kernel'" \
    "--offload 1's forward without its wait for layer l's update: the rounding of a layer's new weights races with the forward's read of them" "$OFF"
# an update that waits for itself before returning: it trains (the same bytes), but the count says no overlap
sed 's|^    o->updates++;|&\n    gpu_offload_sync(g);|' gptc/cuda/offload.cuh > "$LOG/offload_blocking.cuh"
if ! cmp -s gptc/cuda/offload.cuh "$LOG/offload_blocking.cuh" &&
     cuda_mutant_build "$LOG/offload_blocking" gptc/cuda/offload.cuh "$LOG/offload_blocking.cuh"; then
    rm -rf "$LOG/offload_mutants"
    $CLEAN_ENV timeout 300 "$LOG/offload_blocking" $BASE $OFF > "$LOG/offload_blocking.log" 2>&1 < /dev/null
    rc=$?
    ok=$([ $rc -eq 0 ] && grep -q "^offload: 3 updates; after 0 of the 2 followed by a forward" "$LOG/offload_blocking.log" && echo ok || echo FAIL)
    check $ok "mutant offload_blocking caught: an update that blocks the host until its last piece is done counts no overlap" \
        "rc=$rc: $(grep -m 1 -o '^offload: .*' "$LOG/offload_blocking.log" | cut -c1-90)"
else
    check FAIL "mutant offload_blocking builds" "$(tail -n 3 "$LOG/offload_blocking.build")"
fi

echo "gpu plan: $passed passed, $failed failed"
[ $failed -eq 0 ]
