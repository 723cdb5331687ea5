#!/usr/bin/env bash
# test_nccl_mpi.sh — runs the NCCL-over-MPI self-test (test_nccl_mpi) alone,
# under mpirun with 2 and 3 ranks, and its planted bugs; counts every check.
#
#   dev/cuda/cpu/test_nccl_mpi.sh [BINARY]     (make test-nccl-cpu builds and runs it)
#
# Runs: 1 process without mpirun (MPI must stay untouched); -np 2 with the
# test starting MPI itself (--app-mpi, ids by MPI_Bcast); -np 3 with
# nccl_mpi.cpp starting MPI (ids through files). Planted: a collective whose
# count differs across ranks must end the job with status 86 and a message
# naming both ranks' counts; a rank killed by SIGKILL must end the job within
# 30 s (timeout 60), not hang; an ncclSend/ncclRecv count mismatch must end
# with status 86; ncclCommAbort while the others wait must end the job; a
# wrong expected value must make the test fail.
# Ends with "N passed, N failed"; exits non-zero on any failure.
set -u
BIN=${1:-dev/cuda/cpu/test_nccl_mpi}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0

say() {  # say ok|FAIL TEXT: one line per driver check
    if [ "$1" = ok ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    echo "$1 [driver] $2"
}

# The test's own lines: every rank writes ok/FAIL per check to $WORK/logs/rank.R
# (its own file: mpirun may split long lines that several ranks print at once).
count_lines() {  # count_lines LOG WHAT EXIT_STATUS
    local ok bad
    cat "$WORK"/logs/rank.* >> "$1" 2>/dev/null
    ok=$(grep -c '^ok ' "$1")
    bad=$(grep -c '^FAIL ' "$1")
    grep '^FAIL ' "$1"
    passed=$((passed + ok))
    failed=$((failed + bad))
    if [ "$3" -ne 0 ] || [ "$ok" -eq 0 ]; then
        say FAIL "$2: exit status $3, $ok checks passed; its output:"
        tail -n 20 "$1"
    else
        say ok "$2: $ok checks passed, $bad failed"
    fi
}

fresh_dir() { rm -rf "$WORK/ids" "$WORK/logs" && mkdir "$WORK/ids" "$WORK/logs"; }

# ---- the checks, on 1, 2 and 3 emulated GPUs --------------------------------
fresh_dir
timeout 60 "$BIN" --log-dir "$WORK/logs" > "$WORK/np1.log" 2>&1
count_lines "$WORK/np1.log" "1 process, no mpirun" $?
fresh_dir
timeout 60 $MPIRUN -np 2 "$BIN" --app-mpi --log-dir "$WORK/logs" > "$WORK/np2.log" 2>&1
count_lines "$WORK/np2.log" "mpirun -np 2 (the test starts MPI)" $?
fresh_dir
timeout 60 $MPIRUN -np 3 "$BIN" --id-dir "$WORK/ids" --log-dir "$WORK/logs" > "$WORK/np3.log" 2>&1
count_lines "$WORK/np3.log" "mpirun -np 3 (nccl_mpi.cpp starts MPI)" $?

# ---- planted: a collective whose count differs across ranks ------------------
fresh_dir
timeout 60 $MPIRUN -np 2 "$BIN" --id-dir "$WORK/ids" mismatch > "$WORK/mismatch.log" 2>&1
st=$?
if [ $st -eq 86 ] && grep -q 'rank 0 ncclAllReduce count 1024 float' "$WORK/mismatch.log" &&
    grep -q 'rank 1 ncclAllReduce count 1000 float' "$WORK/mismatch.log" &&
    grep -q 'collectives must match across ranks' "$WORK/mismatch.log"; then
    say ok "planted count mismatch: status 86, both ranks' counts named: $(grep -m1 '^cuda_cpu:' "$WORK/mismatch.log")"
else
    say FAIL "planted count mismatch: status $st (want 86 and both counts named); output:"
    cat "$WORK/mismatch.log"
fi

# ---- planted: a rank killed mid-run ------------------------------------------
fresh_dir
t0=$(date +%s)
timeout 60 $MPIRUN -np 3 "$BIN" --id-dir "$WORK/ids" kill > "$WORK/kill.log" 2>&1
st=$?
took=$(($(date +%s) - t0))
if [ $st -ne 0 ] && [ $st -ne 124 ] && [ $took -le 30 ] && grep -qi 'signal 9\|killed' "$WORK/kill.log"; then
    say ok "planted SIGKILL of rank 2: the job ended in ${took} s with status $st and says: $(grep -i -m1 'signal 9\|killed' "$WORK/kill.log")"
else
    say FAIL "planted SIGKILL of rank 2: status $st after ${took} s (124: hung until timeout); output:"
    cat "$WORK/kill.log"
fi

# ---- planted: ncclSend and ncclRecv disagree on the count -------------------
fresh_dir
timeout 60 $MPIRUN -np 2 "$BIN" --id-dir "$WORK/ids" p2p-mismatch > "$WORK/p2p.log" 2>&1
st=$?
if [ $st -eq 86 ] && grep -q 'ncclRecv from rank 0 on rank 1: it sent more' "$WORK/p2p.log"; then
    say ok "planted send/recv count mismatch: status 86: $(grep -m1 '^cuda_cpu:' "$WORK/p2p.log")"
else
    say FAIL "planted send/recv count mismatch: status $st (want 86 and the receive named); output:"
    cat "$WORK/p2p.log"
fi

# ---- ncclCommAbort while the other ranks wait in a collective ----------------
fresh_dir
t0=$(date +%s)
timeout 60 $MPIRUN -np 3 "$BIN" --id-dir "$WORK/ids" abort > "$WORK/abort.log" 2>&1
st=$?
took=$(($(date +%s) - t0))
if [ $st -ne 0 ] && [ $st -ne 124 ] && [ $took -le 30 ] && grep -q 'ncclCommAbort on rank 0 of 3' "$WORK/abort.log"; then
    say ok "ncclCommAbort on rank 0 while ranks 1, 2 wait: the job ended in ${took} s with status $st"
else
    say FAIL "ncclCommAbort on rank 0: status $st after ${took} s (124: hung until timeout); output:"
    cat "$WORK/abort.log"
fi

# ---- planted: a wrong expected value (the checks can fail) -------------------
timeout 60 "$BIN" plant-wrong > "$WORK/wrong.log" 2>&1
st=$?
if [ $st -ne 0 ] && grep -q '^FAIL .*ncclAllReduce int32 sum' "$WORK/wrong.log"; then
    say ok "planted wrong expectation: the test says FAIL and exits $st"
else
    say FAIL "planted wrong expectation: status $st, no FAIL line"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
