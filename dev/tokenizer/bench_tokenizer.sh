#!/usr/bin/env bash
# bench_tokenizer.sh — MB/s of our C encoder (1 and 2 threads) vs the
# reference JS tokenizer (npm gpt-3-encoder under node) on the same ~1 MB of
# mixed documents (dev/fixtures/tokenizer/expected.bin), and the ratio.
#   dev/tokenizer/bench_tokenizer.sh [tokenizer dir (data/tokenizer)]
# Needs: scripts/fetch_tokenizer.sh and node scripts/tokenizer_files.js done.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:-data/tokenizer}"
bin="$(mktemp /tmp/bench_tokenizer.XXXXXX)"
trap 'rm -f "$bin"' EXIT
# -O3 -march=native: the speed the trainer is built with; -fopenmp: encode_many
gcc -std=c11 -O3 -march=native -fno-math-errno -fopenmp -Wall -Wextra -Wno-unused-function -I. dev/tokenizer/bench_tokenizer.c -o "$bin"
c_out="$("$bin" --dir "$dir")"
echo "$c_out" | grep -v '^c_mbps'
js_out="$(TOKENIZER_DIR="$dir" node scripts/tokenizer_reference.js bench)"
echo "$js_out"
c1="$(echo "$c_out" | sed -n 's/.*c_mbps_1thread=\([0-9.]*\).*/\1/p')"
c2="$(echo "$c_out" | sed -n 's/.*c_mbps_2threads=\([0-9.]*\).*/\1/p')"
jsw="$(echo "$js_out" | sed -n 's/.*warm cache.* \([0-9.]*\) MB\/s/\1/p')"
awk -v c1="$c1" -v c2="$c2" -v js="$jsw" 'BEGIN {
    printf "speed-up over the reference (its warm cache): 1 thread %.1fx, 2 threads %.1fx (goal >= 10x)\n", c1 / js, c2 / js }'
