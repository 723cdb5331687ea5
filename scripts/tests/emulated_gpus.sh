# emulated_gpus.sh — what the tests of train_gpt.cu's data parallelism on
# emulated GPUs (one MPI rank each, NCCL over MPI: dev/cuda/cpu/) share.
# Sourced after scripts/tests/check.sh by scripts/tests/test_cuda_zero3.sh and
# scripts/tests/test_cuda_zeropp.sh:
#   emulated_begin NAME TARGET   sets $BIN (train_gpt_cu_cpu), $PY, $LOG (given,
#                                else a fresh /tmp/gptc_NAME.*), $START and
#                                $CHECK_START (the check lines' seconds) and
#                                $MPIRUN; stops, naming `make TARGET`, when
#                                $BIN is not built
#   emulated_run NAME W FLAGS... W emulated GPUs: $BIN $SMALL FLAGS with
#                                --total-batch-size W*B*T*A (the script's
#                                $SMALL, $B, $T, $A), checkpoints in $LOG/NAME/,
#                                the log in NAME.jsonl, rank r's output in
#                                NAME.rank<r>.log, rank 0's again in NAME.log
#                                ending "rc=N"; the variable named in
#                                $EMULATED_EXPORT (if any) goes to every rank;
#                                returns mpirun's status
#   emulated_final NAME          NAME's model file after $STEPS steps
#   emulated_lines NAME FIELD    every logged value of FIELD in NAME.jsonl
emulated_begin() {
    BIN=${BIN:-./train_gpt_cu_cpu}
    PY=${PYTHON:-/usr/bin/python3}
    LOG=${LOG:-$(mktemp -d /tmp/gptc_$1.XXXXXX)}
    mkdir -p "$LOG"
    START=$(date +%s)
    CHECK_START=$START
    [ -x "$BIN" ] || { echo "test_$1: $BIN not built: make $2"; exit 1; }
    echo "test_$1: logs in $LOG"
    MPIRUN="mpirun --allow-run-as-root --oversubscribe"
}

emulated_run() {
    local name=$1 w=$2
    shift 2
    $CLEAN_ENV timeout -k 10 300 $MPIRUN -np "$w" -x GPTC_RUN_ID="emulated-$$-$name" ${EMULATED_EXPORT:+-x $EMULATED_EXPORT} \
        sh -c 'log=$1; shift; exec "$@" > "$log.rank$OMPI_COMM_WORLD_RANK.log" 2>&1' sh "$LOG/$name" \
        "$BIN" --init mpi --comm-timeout 120 $SMALL --total-batch-size $(( w * B * T * A )) -o "$LOG/$name" \
        --log-file "$LOG/$name.jsonl" "$@" < /dev/null > "$LOG/$name.mpirun.log" 2>&1
    local rc=$?
    cp "$LOG/$name.rank0.log" "$LOG/$name.log" 2>/dev/null
    echo "rc=$rc" >> "$LOG/$name.log"
    return $rc
}

emulated_final() { echo "$LOG/$1/model_0000000$STEPS.bin"; }
emulated_lines() { grep -o "\"$2\": [-0-9.e+]*" "$LOG/$1.jsonl"; }
