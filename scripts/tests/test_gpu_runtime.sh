#!/bin/bash
# scripts/tests/test_gpu_runtime.sh — train_gpt_cu's runtime model on the CPU
# execution layer (gptc/cuda/runtime.cuh): the calibration, its cache, and
# the planner's uses of it (--plan's step column, --auto 1, --snapshot-every
# auto). On the layer the figures are the layer's own; what is tested is
# that the mechanism measures, caches, refuses a damaged cache, chooses the
# fastest candidate that fits, and predicts the step it then runs.
#
#   scripts/tests/test_gpu_runtime.sh [LOG_DIR]     (~45 s; test_cuda_on_cpu.sh runs it)
#
# What must hold:
#   1. --plan 1 calibrates ("measured now"), prints every candidate (the 4
#      divisors of 8 sequences x 4 recompute levels x offload 0/1) with a
#      predicted step, and chooses the fastest of those that fit;
#   2. the same --plan again reads the cache ("cached") and prints the same
#      table, digit for digit;
#   3. a run of one candidate (B=2, 4 micro-batches) with --snapshot-every
#      auto: the interval is set and said, snapshots are taken, and the
#      predicted step is within 35% of the measured one (the mean of steps
#      2-4); a planted fault in the model (GPTC_GPU_RUNTIME_PLANT=1: the
#      micro-batches counted once) is outside it;
#   4. a cache line with an implausible figure (nan), and one whose figures
#      disagree (a forward longer than its forward + backward), are each
#      discarded, named, and measured again; the next start reads the new line;
#   5. --auto 1 trains with --plan's choice;
#   6. 2 emulated GPUs (MPI ranks): the collectives measured, ZeRO 0-3
#      weighed, --auto 1 and --snapshot-every auto agreed by both ranks and
#      trained, the predicted step within 35% of the measured one.
# Last line "gpu runtime: N passed, N failed"; exit status non-zero on failure.
cd "$(dirname "$0")/../.." || exit 1
LOG=${1:-$(mktemp -d /tmp/gptc_gpu_runtime.XXXXXX)}
mkdir -p "$LOG"
BIN=./train_gpt_cu_cpu
PY=/usr/bin/python3
[ -x $BIN ] || { echo "test_gpu_runtime: $BIN not built: make train_gpt_cu_cpu"; exit 1; }
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
. scripts/tests/check.sh # check ok|FAIL what [detail], $passed, $failed, $CLEAN_ENV
TOY=$LOG/toy.bin
$PY scripts/toy_shard.py "$TOY" 200000 256 0 > /dev/null || { echo "cannot write $TOY"; exit 1; }
export XDG_CACHE_HOME=$LOG/cache # (the calibration cache, when a run has no --output-dir)
rm -rf "$XDG_CACHE_HOME"
CACHE=$XDG_CACHE_HOME/gptc/gpu_calibration.txt
BASE="--channels 64 --num-heads 2 --max-seq-len 64 --vocab-size 256 --train-data $TOY --lr 3e-3 --warmup-steps 2
      --val-every 0 --sample-every 0 --model d2 -t 32 --total-batch-size 256"
# (a small grid: 8 sequences per step on one GPU, micro-batches 1, 4 and 8 measured)

# table LOG: the candidate rows "B accum zero rcmp offload total fits step" (one per line)
table() { sed -n 's/^ *\([0-9]*\) *\([0-9]*\) *\([0-3]\) *\([0-3]\) *\([01]\) |.*| *\([0-9.]*\) *\(yes\|no\) | *\([0-9.]*\) .*/\1 \2 \3 \4 \5 \6 \7 \8/p' "$1"; }
# measured LOG: the mean ms of steps 2.. of a run
measured() { sed -n 's/^step *\([0-9]*\)\/[0-9]* |.*| \([0-9.]*\) ms |.*/\1 \2/p' "$1" | awk '$1 > 1 { s += $2; n++ } END { if (n) printf "%.1f", s / n }'; }
# near PRED MEAS: within 35%
near() { $PY -c "import sys; p, m = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(p / m - 1) <= 0.35 else 1)" "$1" "$2" 2>/dev/null; }

# ---- 1 and 2. --plan, calibrated, then cached ----------------------------------------------
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --plan 1 > "$LOG/plan1.log" 2>&1
rc=$?
table "$LOG/plan1.log" > "$LOG/plan1.rows"
v=$($PY - "$LOG/plan1.rows" "$LOG/plan1.log" <<'PYEOF'
import re, sys
rows = [l.split() for l in open(sys.argv[1])]
text = open(sys.argv[2]).read()
m = re.search(r"plan: choice \(the fastest that fits\): -b (\d+) --zero (\d) --recompute (\d) --offload (\d), .*predicted ([0-9.]+) ms", text)
if len(rows) != 32 or not m: print(f"FAIL {len(rows)} rows, choice line {'found' if m else 'missing'}"); sys.exit()
if any(not float(r[7]) > 0 for r in rows): print("FAIL a step time that is not positive"); sys.exit()
fits = [r for r in rows if r[6] == "yes"]
best = min(fits, key=lambda r: float(r[7]))
want = (best[0], best[2], best[3], best[4])
got = m.group(1, 2, 3, 4)
print(("ok" if want == got and abs(float(best[7]) - float(m.group(5))) < 1e-3 else "FAIL") +
      f" {len(rows)} rows, {len(fits)} fit; fastest B={want[0]} zero {want[1]} recompute {want[2]} offload {want[3]}"
      f" {best[7]} ms; chosen B={got[0]} zero {got[1]} recompute {got[2]} offload {got[3]}")
PYEOF
)
ok=$([ $rc -eq 0 ] && grep -q "^gpu calibration (measured now" "$LOG/plan1.log" && [ -s "$CACHE" ] && [ "${v%% *}" = ok ] && echo ok || echo FAIL)
check $ok "--plan 1: calibrated at start, every candidate with a predicted step, the fastest that fits chosen" "${v#* }"
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --plan 1 > "$LOG/plan2.log" 2>&1
table "$LOG/plan2.log" > "$LOG/plan2.rows"
ok=$(grep -q "^gpu calibration (cached" "$LOG/plan2.log" && [ -s "$LOG/plan2.rows" ] && cmp -s "$LOG/plan1.rows" "$LOG/plan2.rows" && echo ok || echo FAIL)
check $ok "--plan 1 again: the calibration read from the cache, the same table digit for digit" "$(grep -o '^gpu calibration ([a-z ]*' "$LOG/plan2.log")"

# ---- 3. one candidate run: its predicted step against the measured one --------------------------
mkdir -p "$LOG/snap1" && cp "$CACHE" "$LOG/snap1/" # (with --output-dir the cache is there)
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --snapshot-every auto --mtbf 3600 --output-dir "$LOG/snap1" --steps 4 \
    > "$LOG/run1.log" 2>&1
rc=$?
pred=$(sed -n 's/^snapshots: --snapshot-every auto = [0-9]* steps .* at \([0-9.]*\) ms per step (predicted).*/\1/p' "$LOG/run1.log")
every=$(sed -n 's/^snapshots: --snapshot-every auto = \([0-9]*\) steps.*/\1/p' "$LOG/run1.log")
meas=$(measured "$LOG/run1.log")
ok=$([ $rc -eq 0 ] && [ -n "$pred" ] && [ -n "$meas" ] && grep -q "^snapshots: every $every step(s)" "$LOG/run1.log" \
     && grep -q "^gpu calibration (cached" "$LOG/run1.log" && near "$pred" "$meas" && echo ok || echo FAIL)
check $ok "-b 2 (4 micro-batches) with --snapshot-every auto: every $every steps; predicted step within 35% of the measured" \
    "predicted $pred ms, measured $meas ms (steps 2-4)"
plant=$(GPTC_GPU_RUNTIME_PLANT=1 $CLEAN_ENV timeout 300 $BIN $BASE -b 2 --plan 1 2>&1 | table /dev/stdin | awk '$1 == 2 && $3 == 0 && $4 == 0 && $5 == 0 { print $8 }')
ok=$([ -n "$plant" ] && [ -n "$meas" ] && ! near "$plant" "$meas" && echo ok || echo FAIL)
check $ok "... a planted fault in the model (GPTC_GPU_RUNTIME_PLANT=1: the micro-batches counted once) is outside it" \
    "planted prediction $plant ms, measured $meas ms"

# ---- 4. a damaged cache line: named, discarded, measured again -----------------------------------
cp "$CACHE" "$LOG/cache_good.txt"
sed -i '2s/|[0-9.e+-]* /|nan /' "$CACHE"
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --plan 1 > "$LOG/plan_damaged.log" 2>&1
rc=$?
ok=$([ $rc -eq 0 ] && grep -q "^note: $CACHE line 2: micro-batch measured is nan, expected 1..8: this cached calibration is discarded and measured again" "$LOG/plan_damaged.log" \
     && grep -q "^gpu calibration (measured now" "$LOG/plan_damaged.log" && [ "$(grep -c '^gpu=' "$CACHE")" = 1 ] && ! grep -q nan "$CACHE" && echo ok || echo FAIL)
check $ok "a cache line with an implausible figure (nan): named with its file and line, measured again, the line replaced" \
    "$(grep -m1 '^note:' "$LOG/plan_damaged.log" | cut -c1-160)"

# a line whose figures are each in range but inconsistent: point 1's forward longer than its forward + backward
$PY - "$CACHE" <<'PYEOF'
import sys
path = sys.argv[1]
lines = open(path).read().split("\n")
key, nums = lines[1].split("|")
v = nums.split()
v[3] = "99999"  # (after the 3 micro-batches: point 1's 1-layer forward ms)
lines[1] = key + "|" + " ".join(v)
open(path, "w").write("\n".join(lines))
PYEOF
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --plan 1 > "$LOG/plan_damaged2.log" 2>&1
rc=$?
ok=$([ $rc -eq 0 ] && grep -q "^note: $CACHE line 2: at micro-batch 1 a forward + backward (.*) is not longer than its forward (99999, .*): this cached calibration is discarded and measured again" "$LOG/plan_damaged2.log" \
     && grep -q "^gpu calibration (measured now" "$LOG/plan_damaged2.log" && ! grep -q 99999 "$CACHE" && echo ok || echo FAIL)
check $ok "a cache line whose forward is longer than its forward + backward: named, measured again, replaced" \
    "$(grep -m1 '^note:' "$LOG/plan_damaged2.log" | cut -c1-160)"

# ---- 5. --auto 1 trains with --plan's choice ------------------------------------------------
choice=$(grep -o "^plan: choice (the fastest that fits): -b [0-9]* --zero [0-9] --recompute [0-9] --offload [0-9]" "$LOG/plan_damaged2.log" | sed 's/.*: -b /--batch-size /')
$CLEAN_ENV timeout 300 $BIN $BASE -b 2 --auto 1 --steps 3 > "$LOG/auto1.log" 2>&1
rc=$?
got=$(grep -o "^auto: --batch-size [0-9]* --total-batch-size 256 --zero [0-9] --recompute [0-9] --offload [0-9]" "$LOG/auto1.log" | sed 's/^auto: //; s/ --total-batch-size 256//')
ok=$([ $rc -eq 0 ] && [ -n "$choice" ] && [ "$got" = "$choice" ] && grep -q "^gpu calibration (cached" "$LOG/auto1.log" \
     && grep -q "^step *3/3" "$LOG/auto1.log" && echo ok || echo FAIL)
check $ok "--auto 1: trains with --plan's choice (read from the cache just rebuilt)" "plan: $choice; auto: $got"

# ---- 6. two emulated GPUs --------------------------------------------------------------------
$CLEAN_ENV timeout 300 $MPIRUN -np 2 -x GPTC_RUN_ID="gpu-runtime-$$" -x XDG_CACHE_HOME $BIN --init mpi --comm-timeout 120 \
    $BASE -b 2 --plan 1 > "$LOG/plan_np2.log" 2>&1 < /dev/null
rc=$?
zeros=$(table "$LOG/plan_np2.log" | awk '{ print $3 }' | sort -u | tr -d '\n')
ok=$([ $rc -eq 0 ] && [ "$zeros" = 0123 ] && grep -q "^gpu network (measured at this start, NCCL): latency [0-9.e+-]* us, allreduce" "$LOG/plan_np2.log" \
     && grep -q "^plan: choice" "$LOG/plan_np2.log" && echo ok || echo FAIL)
check $ok "2 emulated GPUs, --plan 1: the collectives measured, ZeRO 0-3 weighed, a choice" \
    "$(grep -o '^gpu network.*' "$LOG/plan_np2.log" | cut -c1-150)"
$CLEAN_ENV timeout 300 $MPIRUN -np 2 -x GPTC_RUN_ID="gpu-runtime-$$-b" -x XDG_CACHE_HOME $BIN --init mpi --comm-timeout 120 \
    $BASE -b 2 --auto 1 --snapshot-every auto --mtbf 10 --output-dir "$LOG/np2" --steps 4 > "$LOG/auto_np2.log" 2>&1 < /dev/null
rc=$?
pred=$(sed -n 's/^snapshots: --snapshot-every auto = [0-9]* steps .* at \([0-9.]*\) ms per step (predicted).*/\1/p' "$LOG/auto_np2.log")
meas=$(measured "$LOG/auto_np2.log")
autoline=$(grep -o "^auto: --batch-size [0-9]* --total-batch-size 256 --zero [0-9] --recompute [0-9] --offload [0-9]" "$LOG/auto_np2.log")
ok=$([ $rc -eq 0 ] && [ -n "$autoline" ] && grep -q "^snapshots: [1-9][0-9]* taken" "$LOG/auto_np2.log" && [ -n "$pred" ] \
     && [ -n "$meas" ] && near "$pred" "$meas" && echo ok || echo FAIL)
check $ok "2 emulated GPUs, --auto 1 --snapshot-every auto: trained with the choice, snapshots taken, predicted step within 35%" \
    "${autoline#auto: }; predicted $pred ms, measured $meas ms"

echo "gpu runtime: $passed passed, $failed failed"
[ $failed -eq 0 ]
