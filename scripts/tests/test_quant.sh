#!/usr/bin/env bash
# test_quant.sh — gptc/quant.h's quantised collectives (ZeRO++'s qwZ, qgZ,
# hpZ) under mpirun -np 1, 2 and 4: -np 2 as one level of 2 and as 2 nodes
# of 1; -np 4 as one level of 4, as 2 emulated nodes of 2 (split on rank / 2)
# and as three levels 2x1x2 (dev/quant/test_quant.c's header lists the checks).
#
#   scripts/tests/test_quant.sh [./dev/quant/test_quant]     (make test-quant builds it and runs this)
#
# One thread per rank (4 ranks share 2 cores here). The last line is
# "N passed, N failed" over the three runs; exit status non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-./dev/quant/test_quant}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
for np in 1 2 4; do
    out=$(OMP_NUM_THREADS=1 timeout -k 10 120 $MPIRUN -np $np "$BIN" 2>&1)
    rc=$?
    echo "$out" | grep -E '^(ok|FAIL) '
    last=$(echo "$out" | tail -n 1)
    p=$(echo "$last" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1/p')
    f=$(echo "$last" | sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\2/p')
    if [ -z "$p" ] || [ "$rc" != 0 ]; then
        echo "$out" | tail -n 20
        check FAIL "test_quant -np $np ran to its end" "exit $rc"
    else
        passed=$((passed + p)); failed=$((failed + f))
        echo "$out" | grep '^test_quant:'
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
