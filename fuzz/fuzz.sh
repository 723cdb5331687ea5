#!/bin/bash
# fuzz/fuzz.sh — runs the libFuzzer harnesses fuzz/fuzz.mk builds.
#
#   fuzz/fuzz.sh fuzz SECONDS HARNESS...     (make fuzz) each harness SECONDS on its kept corpus
#                                            (fuzz/.build/corpus/<h>, grown from the seeds); a table of
#                                            executions per second and coverage; what it finds in
#                                            fuzz/.build/found/<h>/ (then exit 1)
#   fuzz/fuzz.sh test SECONDS HARNESS...     (make test-fuzz) per harness: every seed accepted (so the
#                                            oracles run on it), the regressions of fuzz/regressions/<h>/
#                                            replayed, SECONDS of fuzzing from the seeds finding nothing;
#                                            then the planted bugs caught
#   fuzz/fuzz.sh pending 0 HARNESS...        (make fuzz-pending) every input of fuzz/pending/<h>/ under the
#                                            strict build: each must still fail (a pass means its bug is
#                                            fixed: move it to fuzz/regressions/)
#
# FUZZ_BUILD: where the harnesses are (fuzz/.build). Every libFuzzer run:
# -timeout=10 (an input slower than 10 s is a hang), -rss_limit_mb=2048 and
# -malloc_limit_mb=2048 (a parser that asks for more, from a small file, is a
# finding), -close_fd_mask=2 (the parsers' error messages are not printed:
# they are the common case and slow the run down; the harnesses' oracle
# reports and the sanitizers' still are). Last line: N passed, N failed.
set -u
cd "$(dirname "$0")/.."
mode=$1 secs=$2
shift 2
BUILD=${FUZZ_BUILD:-fuzz/.build}
SEEDS=fuzz/.build/seeds
OPTS="-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -close_fd_mask=2 -print_final_stats=1"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
pass=0 fail=0
ok() { echo "ok $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }
TMP=$(mktemp -d /tmp/gptc-fuzz-run.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# inputs in a folder (not its README)
inputs() { [ -d "$1" ] && find "$1" -maxdepth 1 -type f ! -name 'README*' | sort; }

# stats LOG: "exec/s E, cov C, ft F, corpus N" from a libFuzzer log
stats() {
    local e c f n
    e=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$1" | tail -n 1)
    c=$(grep -o 'cov: [0-9]*' "$1" | tail -n 1 | cut -d' ' -f2)
    f=$(grep -o 'ft: [0-9]*' "$1" | tail -n 1 | cut -d' ' -f2)
    n=$(grep -o 'corp: [0-9]*' "$1" | tail -n 1 | cut -d' ' -f2)
    echo "exec/s ${e:-?}, cov ${c:-?}, ft ${f:-?}, corpus ${n:-?}"
}

case $mode in
fuzz)
    printf '%-12s %10s %8s %8s %8s\n' harness exec/s cov ft corpus > "$TMP/table"
    for h in "$@"; do
        corpus=fuzz/.build/corpus/$h found=fuzz/.build/found/$h
        mkdir -p "$corpus" "$found"
        log=fuzz/.build/logs/$h.log
        mkdir -p "$(dirname "$log")"
        echo "== fuzz_$h for $secs s"
        "$BUILD/fuzz_$h" $OPTS -max_total_time="$secs" -artifact_prefix="$found/" "$corpus" "$SEEDS/$h" > "$log" 2>&1
        rc=$?
        s=$(stats "$log")
        set -- $s
        printf '%-12s %10s %8s %8s %8s\n' "$h" "${2%,}" "${4%,}" "${6%,}" "${8}" >> "$TMP/table"
        if [ $rc -eq 0 ]; then ok "fuzz_$h: nothing found in $secs s ($s)"
        else
            grep -E 'ERROR|fuzz oracle failed|SUMMARY|Test unit written|deadly signal|exited' "$log" | head -n 8
            bad "fuzz_$h: found something (log $log, input in $found/; minimise: $BUILD/fuzz_$h -minimize_crash=1 -runs=10000 INPUT)"
        fi
    done
    cat "$TMP/table"
    ;;
test)
    for h in "$@"; do
        bin=$BUILD/fuzz_$h
        mapfile -t seeds < <(inputs "$SEEDS/$h")
        if [ ${#seeds[@]} -eq 0 ]; then bad "fuzz_$h: no seeds in $SEEDS/$h"; continue; fi
        if FUZZ_EXPECT_ACCEPT=1 "$bin" "${seeds[@]}" > "$TMP/$h.seeds.log" 2>&1; then
            ok "fuzz_$h: its ${#seeds[@]} seeds accepted and their oracles hold"
        else
            tail -n 20 "$TMP/$h.seeds.log"; bad "fuzz_$h: a seed is refused or breaks an oracle"
        fi
        mapfile -t regs < <(inputs "fuzz/regressions/$h")
        if [ ${#regs[@]} -gt 0 ]; then
            if "$bin" "${regs[@]}" > "$TMP/$h.reg.log" 2>&1; then ok "fuzz_$h: ${#regs[@]} regression inputs replayed"
            else tail -n 20 "$TMP/$h.reg.log"; bad "fuzz_$h: a regression input fails again"; fi
        fi
        mkdir -p "$TMP/corpus_$h" "$TMP/found_$h"
        if "$bin" $OPTS -max_total_time="$secs" -artifact_prefix="$TMP/found_$h/" "$TMP/corpus_$h" "$SEEDS/$h" \
                > "$TMP/$h.log" 2>&1; then
            ok "fuzz_$h: $secs s from the seeds, nothing found ($(stats "$TMP/$h.log"))"
        else
            grep -E 'ERROR|fuzz oracle failed|SUMMARY|deadly signal|exited' "$TMP/$h.log" | head -n 8
            mkdir -p fuzz/.build/found/$h && cp "$TMP/found_$h/"* fuzz/.build/found/$h/ 2>/dev/null
            bad "fuzz_$h: fuzzing found an input that fails (copied to fuzz/.build/found/$h/)"
        fi
    done
    # the tester tested: a planted oracle bug on the seeds
    if fuzz/.build/planted_oracle "$SEEDS/model/"* > "$TMP/planted_oracle.log" 2>&1; then
        bad "planted: a reader one ulp off passed the model harness's round trip"
    elif grep -q 'fuzz oracle failed' "$TMP/planted_oracle.log"; then
        ok "planted: a reader one ulp off is caught by the model harness's round trip"
    else tail -n 5 "$TMP/planted_oracle.log"; bad "planted: the model harness failed, but not by its oracle"; fi
    ;;
pending)
    for h in "$@"; do
        mapfile -t pend < <(inputs "fuzz/pending/$h")
        for p in "${pend[@]}"; do
            if "$BUILD/fuzz_$h" "$p" > "$TMP/pending.log" 2>&1; then
                bad "pending $p: passes now: its bug is fixed; move it to fuzz/regressions/$h/ (and its line out of the README)"
            else ok "pending $p: still fails ($(grep -m1 -oE 'fuzz oracle failed: [^ ]*|ERROR: [A-Za-z]+: [a-z-]+|runtime error: .*' "$TMP/pending.log" | head -n 1))"; fi
        done
    done
    ;;
*) echo "usage: fuzz/fuzz.sh fuzz|test|pending SECONDS HARNESS..." >&2; exit 2 ;;
esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
