#!/usr/bin/env bash
# fetch_tinyshakespeare.sh — downloads tiny Shakespeare (40,000 lines of the
# plays, 1.1 MB, from Karpathy's char-rnn repository) for a machine with
# internet access.
#
#   scripts/fetch_tinyshakespeare.sh [outdir]     (default: data/tinyshakespeare)
#
# Leaves [outdir]/input.txt exactly as published. In that file the speeches
# ("First Citizen:\nBefore we proceed...") are separated by ONE blank line and
# the file has no two blank lines in a row, so under our text rule (documents
# are separated by two or more blank lines, paragraphs by one) the whole file
# is a single document whose paragraphs are the speeches: prepare_data puts
# one end-of-text token before it, none between speeches. The script counts
# and prints the documents the rule finds, so a changed file shows up.
# Idempotent: does nothing when input.txt is there. Needs curl.
set -euo pipefail

dir="${1:-data/tinyshakespeare}"
url="https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
expected_bytes=1115394
out="$dir/input.txt"

if [[ -s "$out" ]]; then
    echo "fetch_tinyshakespeare: $out is already there; nothing to do"
else
    command -v curl >/dev/null 2>&1 || { echo "fetch_tinyshakespeare: error: curl not found (apt-get install curl)" >&2; exit 1; }
    mkdir -p "$dir"
    echo "fetch_tinyshakespeare: downloading $url"
    if ! curl -fsSL --connect-timeout 20 --retry 3 -o "$out.part" "$url"; then
        rm -f "$out.part"
        echo "fetch_tinyshakespeare: error: download failed (no internet access?): $url" >&2
        exit 1
    fi
    mv "$out.part" "$out"
fi

bytes=$(wc -c <"$out")
[[ "$bytes" -eq "$expected_bytes" ]] || echo "fetch_tinyshakespeare: warning: $out has $bytes bytes, the published file has $expected_bytes"
# documents = 1 + number of runs of two or more blank lines
docs=$(awk 'NF == 0 { blank++; next } { if (blank >= 2) runs++; blank = 0 } END { print runs + 1 }' "$out")
echo "fetch_tinyshakespeare: $out: $bytes bytes, $(wc -l <"$out") lines, $docs document(s) under the two-blank-line rule"
echo "next: ./prepare_data $out data/tinyshakespeare"
