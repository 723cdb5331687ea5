#!/usr/bin/env bash
# fetch_hellaswag.sh — downloads HellaSwag's validation set (Zellers et al.
# 2019; 10,042 examples, MIT licence) from its authors' repository, for a
# machine with internet access, and turns it into llm.c's eval file with
# ./prepare_eval (GPT-2's tokenizer, as llm.c's dev/data/hellaswag.py does).
#
#   scripts/fetch_hellaswag.sh [outdir]      (default: data/hellaswag)
#
# Leaves in [outdir]: hellaswag_val.jsonl and hellaswag_val.bin. Idempotent:
# a file already there is kept. Needs curl, ./prepare_eval (make
# prepare_eval) and the tokenizer files (make tokenizer). Then:
#   ./train_gpt ... --eval-file data/hellaswag/hellaswag_val.bin --eval-every 250
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-data/hellaswag}"
url="https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
die() { echo "fetch_hellaswag: error: $*" >&2; exit 1; }
mkdir -p "$dir"
if [[ ! -s "$dir/hellaswag_val.jsonl" ]]; then
    command -v curl > /dev/null || die "curl not found: apt-get install curl"
    curl -fL --retry 3 -o "$dir/hellaswag_val.jsonl.part" "$url" || die "download of $url failed"
    mv "$dir/hellaswag_val.jsonl.part" "$dir/hellaswag_val.jsonl"
fi
lines=$(grep -c . "$dir/hellaswag_val.jsonl")
[[ "$lines" = 10042 ]] || echo "fetch_hellaswag: warning: $lines examples, HellaSwag's val has 10042"
if [[ ! -s "$dir/hellaswag_val.bin" ]]; then
    [[ -x ./prepare_eval ]] || make --no-print-directory prepare_eval
    ./prepare_eval "$dir/hellaswag_val.jsonl" "$dir/hellaswag_val.bin"
fi
echo "fetch_hellaswag: $dir/hellaswag_val.bin ready: train_gpt --eval-file $dir/hellaswag_val.bin"
