#!/usr/bin/env bash
# test_eval.sh — the multiple-choice eval (--eval-file: HellaSwag and sets of
# its shape) against an independent scorer, without downloads (~40 s).
#
#   scripts/tests/test_eval.sh [./train_gpt] [./train_gpt_mpi] [./prepare_eval]   (make test-eval builds them and runs this)
#
# 1. A small HellaSwag-shaped JSONL made here (scripts/eval_reference.py
#    make-jsonl: 37 examples, odd text among them) -> ./prepare_eval -> the
#    eval file; its ids are those of the reference tokenizer (gpt-3-encoder
#    in node): encode(ctx) and encode(" " + ending), as llm.c's preparer.
# 2. A small GPT-2 with large random weights (so the endings' losses are far
#    apart) scored by train_gpt --steps 0 --eval-file, one process at B=3
#    T=24 (examples straddle forward passes, long rows are truncated), and
#    mpirun -np 2 at B=8 T=64 (19 and 18 examples on the ranks); every
#    ending's summed loss and token count, and both picks (acc, acc_norm),
#    must agree with PyTorch float64 scoring each row alone
#    (eval_reference.py check; near-ties skipped and counted).
# 3. Training is unchanged by the eval: 6 steps with --eval-every 2 log the
#    same losses, as text, as 6 steps without it, and the final models are
#    cmp-identical; the JSONL log has eval lines at steps 0, 2, 4, 6, and
#    the step-0 scores equal --steps 0's. On 2 ranks, --zero 3 (each forward
#    gathers the weights from both ranks) logs the eval lines --zero 2 does.
# 4. scripts/plot_loss.py overlays the two runs of 3 in one PNG, with a legend.
# 5. Bad inputs give clear errors: a truncated file, a wrong magic, a token
#    outside the model's vocabulary, a JSONL example with three endings.
# Test the tester: check rejects a detail file with one sum changed in its
# 4th digit. The last line is "N passed, N failed"; non-zero exit on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./train_gpt}
BIN_MPI=${2:-./train_gpt_mpi}
PREP=${3:-./prepare_eval}
PY=${PYTHON:-/usr/bin/python3}
MPIRUN="mpirun --allow-run-as-root --oversubscribe -np 2"
dir=$(mktemp -d /tmp/gptc_eval.XXXXXX)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
ok() { echo "ok $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
# expect NAME CMD...: the command succeeds (its output in $dir/NAME.log)
expect() {
    local name=$1
    shift
    if timeout -k 5 120 "$@" > "$dir/$name.log" 2>&1; then ok "$name"; else bad "$name"; cat "$dir/$name.log"; fi
}
# refuse NAME PATTERN CMD...: the command fails and says PATTERN
refuse() {
    local name=$1 pattern=$2
    shift 2
    if timeout -k 5 60 "$@" > "$dir/$name.log" 2>&1; then bad "$name (it succeeded)"; cat "$dir/$name.log"
    elif grep -q -- "$pattern" "$dir/$name.log"; then ok "$name: $(grep -m1 -- "$pattern" "$dir/$name.log")"
    else bad "$name (no '$pattern' in its output)"; cat "$dir/$name.log"; fi
}

echo "== 1. JSONL -> eval file, ids as the reference tokenizer's"
expect make_jsonl $PY scripts/eval_reference.py make-jsonl "$dir/set.jsonl"
expect prepare_eval "$PREP" "$dir/set.jsonl" "$dir/set.bin"
expect tokens $PY scripts/eval_reference.py tokens "$dir/set.jsonl" "$dir/set.bin"
tail -n 1 "$dir/tokens.log"

echo "== 2. scores against PyTorch float64, 1 process and 2 ranks"
expect make_model $PY scripts/eval_reference.py make-model "$dir/model.bin"
EVAL="--model $dir/model.bin --eval-file $dir/set.bin --steps 0 --threads 1"
expect score_1 "$BIN" $EVAL -b 3 -t 24 --eval-detail "$dir/d1.jsonl"
grep '^eval: acc' "$dir/score_1.log"
expect score_2ranks $MPIRUN "$BIN_MPI" $EVAL -b 8 -t 64 --eval-detail "$dir/d2.jsonl"
grep '^eval: acc' "$dir/score_2ranks.log"
# (--plant: then d1 with one sum raised by 5e-4 relative must be rejected: test the tester)
expect check $PY scripts/eval_reference.py check "$dir/model.bin" "$dir/set.bin" "$dir/d1.jsonl@24" "$dir/d2.jsonl@64" --plant
grep -E 'check .*examples|planted|caught' "$dir/check.log"

echo "== 3. training with --eval-every 2 is training without it, bit for bit"
$PY scripts/toy_shard.py "$dir/train.bin" 20000 50257 3 > /dev/null
TRAIN="--model $dir/model.bin --train-data $dir/train.bin -b 2 -t 32 --steps 6 --lr 1e-3 --val-every 0 --sample-every 0 --threads 1"
expect train_plain "$BIN" $TRAIN --output-dir "$dir/plain" --log-file "$dir/plain.jsonl"
expect train_eval "$BIN" $TRAIN --output-dir "$dir/eval" --log-file "$dir/eval.jsonl" --eval-file "$dir/set.bin" \
    --eval-every 2 --eval-detail "$dir/d3.jsonl"
steps() { grep '"loss"' "$1" | sed 's/, "ms".*//'; }
if [ -n "$(steps "$dir/plain.jsonl")" ] && [ "$(steps "$dir/plain.jsonl")" = "$(steps "$dir/eval.jsonl")" ] &&
   cmp -s "$dir/plain/model_00000006.bin" "$dir/eval/model_00000006.bin"; then
    ok "same losses (as text) and the same final model with and without the eval"
else
    bad "the eval changed training"; diff <(steps "$dir/plain.jsonl") <(steps "$dir/eval.jsonl") | head
fi
if [ "$(grep -c '"eval_acc_norm"' "$dir/eval.jsonl")" = 4 ] &&
   [ "$(grep '"eval_acc_norm"' "$dir/eval.jsonl" | sed 's/,.*//' | tr -d '{"step: ' | tr '\n' ' ')" = "0 2 4 6 " ]; then
    ok "the log has eval lines at steps 0 2 4 6: $(grep -m1 eval_acc "$dir/eval.jsonl")"
else
    bad "the log's eval lines"; grep eval_acc "$dir/eval.jsonl"
fi
# --zero 3 on 2 ranks (every forward gathers the weights from both: the ranks run as many, 19 and 18
# examples): the eval lines --zero 2's, which does the same arithmetic
for z in 2 3; do
    expect train_eval_z$z $MPIRUN "$BIN_MPI" $TRAIN -b 1 --zero $z --log-file "$dir/z$z.jsonl" --eval-file "$dir/set.bin" \
        --eval-every 3
done
evals() { grep '"eval_acc' "$1" | sed 's/, "ms".*//; s/"eval_ms": [0-9.]*, //'; }
if [ "$(grep -c '"eval_acc' "$dir/z3.jsonl")" = 3 ] && [ "$(evals "$dir/z2.jsonl")" = "$(evals "$dir/z3.jsonl")" ]; then
    ok "2 ranks --zero 3: the eval lines --zero 2's: $(grep -m1 eval_acc "$dir/z3.jsonl" | cut -c1-90)"
else
    bad "2 ranks --zero 3 eval lines"; diff <(evals "$dir/z2.jsonl") <(evals "$dir/z3.jsonl") | head
fi
# step 0 of the run is the loaded model: at the run's B=2 T=32 it scores as --steps 0 at B=2 T=32
expect score_b2 "$BIN" $EVAL -b 2 -t 32 --eval-detail "$dir/d4.jsonl"
if [ -s "$dir/d4.jsonl" ] && [ "$(grep '"step": 0,' "$dir/d3.jsonl")" = "$(cat "$dir/d4.jsonl")" ]; then
    ok "the run's step-0 scores equal --steps 0's"
else
    bad "the run's step-0 scores differ from --steps 0's"
fi

echo "== 4. run reports: scripts/plot_loss.py overlays the two runs (loss, eval accuracy, lr, norm, tokens/s)"
expect plot_two $PY scripts/plot_loss.py "$dir/plain.jsonl" "$dir/eval.jsonl" "$dir/two.png" --label "no eval" --label "--eval-every 2"
if [ "$(head -c 8 "$dir/two.png" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && [ "$(wc -c < "$dir/two.png")" -gt 20000 ] &&
   [ "$(grep -c 'train steps' "$dir/plot_two.log")" = 2 ]; then
    ok "two runs overlaid in a $(wc -c < "$dir/two.png")-byte PNG: $(tail -n 1 "$dir/plot_two.log")"
else
    bad "plot_loss.py did not draw the two runs"; cat "$dir/plot_two.log"
fi
refuse plot_label_count "give one per log" $PY scripts/plot_loss.py "$dir/plain.jsonl" "$dir/eval.jsonl" "$dir/x.png" --label one

echo "== 5. bad inputs"
head -c 2000 "$dir/set.bin" > "$dir/short.bin"
refuse truncated "damaged or truncated\|damaged file" "$BIN" $EVAL --eval-file "$dir/short.bin"
$PY -c "import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[0] ^= 1; open(sys.argv[2], 'wb').write(b)" \
    "$dir/set.bin" "$dir/magic.bin"
refuse wrong_magic "expected 20240522" "$BIN" $EVAL --eval-file "$dir/magic.bin"
"$BIN" --model d1 --channels 16 --num-heads 2 --max-seq-len 32 --vocab-size 300 --steps 0 --output-dir "$dir/small" > /dev/null 2>&1
refuse token_outside_vocab "outside the model's vocabulary" "$BIN" --model "$dir/small/model_00000000.bin" \
    --eval-file "$dir/set.bin" --steps 0 -t 32
echo '{"ctx": "A man", "endings": ["a", "b", "c"], "label": 1}' > "$dir/three.jsonl"
refuse three_endings "exactly 4 strings" "$PREP" "$dir/three.jsonl" "$dir/three.bin"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
