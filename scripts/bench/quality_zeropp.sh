#!/usr/bin/env bash
# quality_zeropp.sh — does ZeRO++'s quantisation cost quality? The default
# run's model (make train: 4 layers, C = 192, the English corpus) trained
# twice on mpirun -np 4 --topology 2x2 --zero 3, once plain and once with
# qwZ (INT8) + hpZ + qgZ (INT4), the same data, seed and schedule; prints
# both final validation losses and their relative difference (ZeRO++'s
# claim: within 1%), and overlays the curves with scripts/plot_loss.py.
#
#   scripts/bench/quality_zeropp.sh [STEPS] [OUT]     (make quality-zeropp QUALITY_STEPS=300)
#
# Each step is ~6.5 GFLOP x 6 of work for the 4 ranks: ~9 s a step on 2
# shared cores at a load of ~11 (12 min per 100 steps per run; run under nice).
set -u
cd "$(dirname "$0")/../.."
STEPS=${1:-300}
OUT=${2:-out/quality_zeropp}
BIN=${BIN:-./train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
VAL_EVERY=${VAL_EVERY:-$((STEPS / 4 > 0 ? STEPS / 4 : 1))}
mkdir -p "$OUT"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $STEPS steps, validation every $VAL_EVERY"
FLAGS="--data data/corpus/english.txt --model d4 --channels 192 --num-heads 4 --max-seq-len 128 --batch-size 2 --seq-len 128
       -d 1024 --shuffle 1 --steps $STEPS --lr 2e-3 --warmup-steps 50 --final-lr-frac 0.1 --weight-decay 0.1
       --val-every $VAL_EVERY --val-batches 8 --sample-every 0 --threads 1 --zero 3 --topology 2x2"
for mode in plain zeropp; do
    extra=$([ $mode = zeropp ] && echo "--qwz 8 --hpz 1 --qgz 4" || echo "")
    nice -n 19 $MPIRUN -np 4 "$BIN" $FLAGS $extra --log-file "$OUT/$mode.jsonl" > "$OUT/$mode.out" 2>&1 ||
        { echo "error: the $mode run failed: $(tail -3 "$OUT/$mode.out")"; exit 1; }
    grep -E "bytes sent per step|backward's" "$OUT/$mode.out"
done
$PY - "$OUT/plain.jsonl" "$OUT/zeropp.jsonl" <<'PY'
import json, sys
val = lambda p: [r["val_loss"] for r in map(json.loads, open(p)) if "val_loss" in r]
a, b = val(sys.argv[1]), val(sys.argv[2])
d = (b[-1] - a[-1]) / a[-1]
print(f"final validation loss: plain --zero 3 {a[-1]:.4f}, qwZ+hpZ+qgZ {b[-1]:.4f}: {100 * d:+.2f}% "
      f"({'within' if abs(d) <= 0.01 else 'NOT within'} 1%)")
PY
$PY scripts/plot_loss.py "$OUT/plain.jsonl" "$OUT/zeropp.jsonl" "$OUT/loss.png" \
    --label "--zero 3 (fp32)" --label "qwZ INT8 + hpZ + qgZ INT4" --title "--zero 3 on 2x2 ranks: fp32 vs qwZ INT8 + hpZ + qgZ INT4 (4 layers, C=192, English)" || true
echo "curves: $OUT/loss.png; load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
