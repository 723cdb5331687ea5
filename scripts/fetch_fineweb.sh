#!/usr/bin/env bash
# fetch_fineweb.sh — downloads the first N parquet files of FineWeb's 10B-token
# sample (HuggingFaceFW/fineweb, sample/10BT: 14 files of ~2.15 GB, ~0.7B
# GPT-2 tokens each; licence ODC-By 1.0) from Hugging Face, for a machine with
# internet access, and converts them to one JSONL file, one {"text": ...}
# object per web page (one page = one document).
#
#   scripts/fetch_fineweb.sh [outdir] [num_files]   (defaults: data/fineweb 1)
#
# Leaves in [outdir]: the parquet files (000_00000.parquet ...) and
# fineweb_10BT_<num_files>.jsonl. Idempotent: a parquet file already
# downloaded is kept, and nothing is converted when the .jsonl is there.
# Set HF_TOKEN to send a Hugging Face token (optional; the dataset is public).
# Needs curl and Python 3 with pyarrow (PYTHON=/path/to/python to choose the
# interpreter; default /usr/bin/python3):
#   apt-get install python3-pyarrow        where the distribution has it (Debian 13)
#   python3 -m venv .venv && .venv/bin/pip install pyarrow && export PYTHON=.venv/bin/python
set -euo pipefail

dir="${1:-data/fineweb}"
n="${2:-1}"
python="${PYTHON:-/usr/bin/python3}"
base="https://huggingface.co/datasets/HuggingFaceFW/fineweb/resolve/main/sample/10BT"
out="$dir/fineweb_10BT_$n.jsonl"

die() { echo "fetch_fineweb: error: $*" >&2; exit 1; }
[[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 14 ]] || die "num_files must be 1..14 (sample/10BT has 14 files), got '$n'"

if [[ -s "$out" ]]; then
    echo "fetch_fineweb: $out is already there; nothing to do"
    echo "next: ./prepare_data $out data/fineweb"
    exit 0
fi
command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install curl)"
"$python" -c 'import pyarrow.parquet' 2>/dev/null || die "$python cannot import pyarrow. Install it:
    apt-get install python3-pyarrow     (Debian 13; not packaged in Debian 12)
  or
    python3 -m venv .venv && .venv/bin/pip install pyarrow && export PYTHON=.venv/bin/python
  then re-run this script (downloaded files are kept)."
mkdir -p "$dir"

auth=()
[[ -n "${HF_TOKEN:-}" ]] && auth=(-H "Authorization: Bearer $HF_TOKEN")
files=()
for ((i = 0; i < n; i++)); do
    name=$(printf '%03d_00000.parquet' "$i")
    files+=("$dir/$name")
    [[ -s "$dir/$name" ]] && { echo "fetch_fineweb: $dir/$name already downloaded"; continue; }
    echo "fetch_fineweb: downloading $base/$name (~2.15 GB)"
    # -C - resumes a .part left by an interrupted download
    curl -fL --connect-timeout 20 --retry 5 -C - "${auth[@]}" -o "$dir/$name.part" "$base/$name" \
        || die "download of $base/$name failed (no internet access, or Hugging Face unreachable?); re-run to resume"
    mv "$dir/$name.part" "$dir/$name"
done

echo "fetch_fineweb: converting ${#files[@]} parquet file(s) to $out"
"$python" - "$out" "${files[@]}" <<'EOF' || die "conversion to $out failed (message above)"
import json, os, sys
import pyarrow.parquet as pq

out, inputs = sys.argv[1], sys.argv[2:]
docs = chars = 0
with open(out + ".tmp", "w", encoding="utf-8") as f:
    for path in inputs:
        pf = pq.ParquetFile(path)
        if "text" not in pf.schema_arrow.names:
            sys.exit(f"{path} has no 'text' column (columns: {pf.schema_arrow.names})")
        for batch in pf.iter_batches(batch_size=8192, columns=["text"]):
            for text in batch.column(0).to_pylist():
                if text:
                    f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
                    docs += 1
                    chars += len(text)
        print(f"fetch_fineweb: {path}: {docs} documents so far", flush=True)
os.replace(out + ".tmp", out)
print(f"fetch_fineweb: {out}: {docs} documents, {chars / 1e9:.2f} G characters")
EOF
echo "next: ./prepare_data $out data/fineweb"
