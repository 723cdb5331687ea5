#!/bin/sh
# make_fixtures.sh -- writes the PyTorch reference fixtures that test_gpt.c reads.
#
#   scripts/tests/make_fixtures.sh                 tiny fixture, committed:
#                                              dev/fixtures/tiny_model.bin  (llm.c model, version 3)
#                                              dev/fixtures/tiny_ref.bin    (reference, format in
#                                                                            scripts/gpt2_reference.py)
#   scripts/tests/make_fixtures.sh --124M DIR      also GPT-2 124M shape (random init, not committed:
#                                              ~500 MB model + ~1.0 GB reference) into DIR:
#                                              DIR/gpt2_124M_model.bin, DIR/gpt2_124M_ref.bin
#
# Tiny:  L=2 C=36 NH=3 maxT=11 V=131 (Vp=256, P=41,724), B=3 T=9, 10 steps, float64,
#        init seed 1337, data seed 42; also runs the self-checks (exit 1 on failure).
#        C=36 with NH=3 gives hs=12; V=131 makes Vp-V=125 padded columns; T=9 < maxT=11
#        so only the first T rows of wpe are used.
# 124M:  L=12 C=768 NH=12 maxT=1024 V=50257 (Vp=50304, P=124,475,904), B=2 T=64, 3 steps,
#        float64 (~70 s on 2 cores, 7 GB peak RSS), init seed 1337, data seed 42.
#        With 3 steps and warmup 3 every step is in warmup.
# Hyperparameters are the script's defaults (lr 1e-3, betas 0.9/0.95, eps 1e-8,
# weight decay 0.1, clip 1.0, warmup 3, final lr frac 0.1) and are recorded in
# each reference file's header.
#
# Uses Debian's python (/usr/bin/python3, torch 1.13 + numpy); override with PYTHON=...
set -eu
cd "$(dirname "$0")/../.."
PY=${PYTHON:-/usr/bin/python3}

mkdir -p dev/fixtures
"$PY" scripts/gpt2_reference.py --init 2,36,3,11,131 --seed 1337 \
    --out-model dev/fixtures/tiny_model.bin \
    --B 3 --T 9 --steps 10 --data-seed 42 --selfcheck \
    --out-ref dev/fixtures/tiny_ref.bin

if [ "${1:-}" = "--124M" ]; then
    dir=${2:?usage: scripts/tests/make_fixtures.sh --124M DIR}
    mkdir -p "$dir"
    "$PY" scripts/gpt2_reference.py --init 12,768,12,1024,50257 --seed 1337 \
        --out-model "$dir/gpt2_124M_model.bin" \
        --B 2 --T 64 --steps 3 --data-seed 42 \
        --out-ref "$dir/gpt2_124M_ref.bin"
elif [ $# -gt 0 ]; then
    echo "usage: scripts/tests/make_fixtures.sh [--124M DIR]" >&2
    exit 2
fi
