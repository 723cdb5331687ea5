#!/usr/bin/env bash
# test_slurm.sh — scripts/slurm_cpu.sbatch and scripts/slurm_supervised.sbatch
# under a real Slurm: a one-node cluster that this script starts itself, as
# one would on a workstation, and stops at the end.
#
#   scripts/tests/test_slurm.sh [./train_gpt_mpi]      (make test-slurm builds it and runs this)
#
# Needs root (slurmd starts the job steps) and Debian's packages:
#   apt-get install slurm-wlm munge      (or slurmctld slurmd slurm-client munge)
# Without them, or when the daemons do not come up, it prints
# "SKIPPED: <why>" and exits 0.
#
# The cluster lives in a temporary folder and touches no system-wide
# configuration (/etc/slurm, /etc/munge and the system's munged are left
# alone; a check below compares /etc/slurm before and after):
#   - munged with a key of its own (mungekey) on a socket in that folder;
#     slurm.conf points Slurm at it (AuthInfo=socket=...);
#   - slurm.conf written there: this host's name, CPUs and memory as
#     `slurmd -C` reports them, two free TCP ports, state, spool, logs and
#     pid files all in the folder, no cgroups (proctrack/linuxproc,
#     task/affinity), no accounting; every client and daemon gets it through
#     SLURM_CONF (daemons: -f), so /etc/slurm is never read;
#   - slurmctld -D and slurmd -D in the background; at the end every job is
#     cancelled, then every process that carries this SLURM_CONF in its
#     environment (daemons, slurmstepd, trainers) is ended by its pid, then
#     munged; a check says that nothing is left.
#
# Checked (a d2 model, C=128, T=64, 36 steps, 2 ranks x 1 thread, a state
# saved after every step, shuffled data; the reference is the same flags
# started directly with mpirun -np 2, outside Slurm):
#   1. sbatch of slurm_cpu.sbatch (srun --mpi=pmix, 2 tasks): the job
#      completes and its final model is cmp-identical to the reference;
#   2. slurm_supervised.sbatch with one rank SIGKILLed mid-run (after step 10),
#      then the new step cancelled with `scancel --signal=KILL JOB.STEP`
#      (after step 22): the supervisor restarts twice (two recovery records),
#      every step's last logged loss/lr/norm equals the reference's, and the
#      final model is cmp-identical;
#   3. slurm_supervised.sbatch requeued with `scontrol requeue` (after step
#      12): the job runs again (Restarts=1, "restart 1" in its output), the
#      trainer resumes from its newest state (not step 0), and the final model
#      is cmp-identical;
#   4. slurm_supervised.sbatch with GPTC_SPARE=1 (a standby job step, srun
#      --overlap) and memory snapshots, 200 steps: a rank of the active step
#      SIGKILLed 1-8 steps after the standby step is ready: promoted (hot
#      spare), both ranks resume from their own snapshots in memory, the job
#      completes, the final model and every step are those of a 200-step
#      mpirun run;
#   and the checker rejects a model with one weight changed.
# The last line is "N passed, N failed"; the exit status is non-zero on a failure.
set -u
cd "$(dirname "$0")/../.." || exit 1
BIN_MPI=${1:-./train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
STEPS=36
CHECK_START=$(date +%s) # check.sh ends each line with the seconds since then

skip() { echo "SKIPPED: $*"; exit 0; }
for tool in slurmctld slurmd sbatch srun squeue scontrol scancel munged; do
    command -v $tool > /dev/null || skip "no $tool: apt-get install slurm-wlm munge (the daemons, the clients and munge)"
done
[ "$(id -u)" -eq 0 ] || skip "not root: slurmd starts job steps as their user and needs root for that"
command -v mpirun > /dev/null || skip "no mpirun for the reference run: apt-get install openmpi-bin"
[ -x "$BIN_MPI" ] || { echo "error: $BIN_MPI not found: make train_gpt_mpi"; exit 1; }

. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
dir=$(mktemp -d /tmp/gptc_slurm.XXXXXX)
chmod 755 "$dir" # munged refuses a socket whose folders are not searchable by all
conf=$dir/slurm.conf
export SLURM_CONF=$conf # every Slurm client below (and the jobs) reads this file, not /etc/slurm
etc_before=$(ls -la --time-style=full-iso /etc/slurm 2>&1; cat /etc/slurm/*.conf 2>/dev/null | md5sum)

# every process we started that is still running: the daemons, slurmstepd
# and the job's processes all carry SLURM_CONF=$conf in their environment.
# Bash builtins only (read, no grep): a helper process started here would
# carry it too, and find itself.
ours() {
    local p e
    for p in /proc/[0-9]*; do
        while IFS= read -r -d '' e; do
            [ "$e" = "SLURM_CONF=$conf" ] && { echo "${p#/proc/}"; break; }
        done 2>/dev/null < "$p/environ"
    done
}
munged_pid=""
cleanup() {
    local p left
    if [ -n "$(ours)" ]; then
        scancel --quiet --full --signal=KILL --user=root 2>/dev/null # every job of this cluster (it is ours)
        for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
        for p in $(ours); do kill -TERM "$p" 2>/dev/null; done
        for _ in $(seq 50); do [ -z "$(ours)" ] && break; sleep 0.1; done
        for p in $(ours); do kill -KILL "$p" 2>/dev/null; done
        sleep 0.2
    fi
    [ -n "$munged_pid" ] && kill -TERM "$munged_pid" 2>/dev/null
    for _ in $(seq 50); do [ -n "$munged_pid" ] && kill -0 "$munged_pid" 2>/dev/null || break; sleep 0.1; done
    left=$(ours)
    [ -n "$munged_pid" ] && kill -0 "$munged_pid" 2>/dev/null && left="$left munged:$munged_pid"
    echo "$left"
}
finish() {
    local left
    left=$(cleanup)
    [ -n "${shm:-}" ] && rm -rf "$shm" # (case 4's snapshots, when it stopped early)
    [ -z "${left// /}" ] && check ok "Slurm stopped: no daemon, step or trainer of this cluster left running" ||
        check FAIL "Slurm stopped: no daemon, step or trainer of this cluster left running" "left: $left"
    [ "$(ls -la --time-style=full-iso /etc/slurm 2>&1; cat /etc/slurm/*.conf 2>/dev/null | md5sum)" = "$etc_before" ] &&
        check ok "/etc/slurm untouched" || check FAIL "/etc/slurm untouched"
    [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"
    echo "$passed passed, $failed failed"
    exit $(( failed > 0 ))
}
# a skip after the daemons were started: stop them, remove the folder, say why
skip_started() { echo "SKIPPED: $*"; exit 0; } # the EXIT trap stops what was started

# a TCP port nothing listens on (another engineer's Slurm may be on 6817/6818)
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 30000))
        ss -Hltn "sport = :$port" 2>/dev/null | grep -q . || { echo $port; return; }
    done
}

# ---- the cluster: munge, slurm.conf, slurmctld, slurmd ----
t0=$(date +%s%3N)
trap 'cleanup > /dev/null; [ -n "${KEEP:-}" ] || rm -rf "$dir"' EXIT # until the cluster is up (then: finish)
trap 'check FAIL "interrupted by a signal"; exit 130' INT TERM # an interrupted test stops its cluster, and fails
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/bin"
if command -v mungekey > /dev/null; then mungekey --create --keyfile="$dir/munge/munge.key" 2>/dev/null
else dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; fi
chmod 600 "$dir/munge/munge.key"
munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" --pid-file="$dir/munge/munged.pid" \
       --seed-file="$dir/munge/seed" --log-file="$dir/munge/munged.log" ||
    skip_started "munged did not start: $(tail -n 1 "$dir/munge/munged.log" 2>/dev/null)"
munged_pid=$(cat "$dir/munge/munged.pid")
node=$(slurmd -C 2>/dev/null | head -n 1) # NodeName=HOST CPUs=.. Boards=.. SocketsPerBoard=.. CoresPerSocket=.. ThreadsPerCore=.. RealMemory=..
[[ "$node" == NodeName=* ]] || skip_started "slurmd -C did not describe this node: $node"
host=${node#NodeName=}; host=${host%% *}
cat > "$conf" <<EOF
# a one-node cluster for scripts/tests/test_slurm.sh, everything in $dir
ClusterName=gptctest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=15
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
: > "$dir/plugstack.conf"
slurmctld -D -f "$conf" > "$dir/log/slurmctld.out" 2>&1 &
slurmd -D -f "$conf" > "$dir/log/slurmd.out" 2>&1 &
disown -a # their end is ours to check (cleanup), not bash's to report
state=""
for _ in $(seq 150); do
    state=$(sinfo -h -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.2
done
[ "$state" = idle ] || skip_started "the one-node Slurm did not come up within 30 s (node state \"$state\"):" \
    "$(tail -n 2 "$dir/log/slurmctld.out" "$dir/log/slurmd.out" 2>/dev/null | tr '\n' ' ')"
trap finish EXIT
srun --mpi=list 2>&1 | grep -qw pmix || skip_started "this Slurm has no PMIx plugin (srun --mpi=list): install slurm-wlm-basic-plugins"
check ok "one-node Slurm up: $node, ports in $conf" "($(( $(date +%s%3N) - t0 )) ms)"

# ---- data, binary, the reference ----
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 > /dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 > /dev/null || exit 1
cp "$BIN_MPI" "$dir/bin/" && BIN_MPI=$dir/bin/$(basename "$BIN_MPI") || exit 1 # one build for every run
# the flags every run gets; they override every training flag of the scripts' defaults
FLAGS="--model d2 --channels 128 --num-heads 2 --max-seq-len 64 --vocab-size 256 -t 64 -b 3 --total-batch-size -1
       --zero 1 --lr 3e-3 --warmup-steps 2 --final-lr-frac 0.0 --weight-decay 0.1 --val-every 4 --val-batches 2
       --sample-every 0 --shuffle 1 -x $STEPS --save-every 1 --keep-last 2"
FINAL=$(printf "model_%08d.bin" $STEPS)
export GPTC_TRAINER=$BIN_MPI GPTC_TRAIN_DATA=$dir/train.bin GPTC_VAL_DATA=$dir/val.bin
# ranks that wait in a collective yield their core instead of spinning (2
# ranks on 2 cores shared with other work); srun passes this on to Open MPI
export OMPI_MCA_mpi_yield_when_idle=1
# shellcheck disable=SC2086 # FLAGS is a list of words
env -u SLURM_CONF timeout -k 10 120 mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
    "$BIN_MPI" --threads 1 $FLAGS --train-data "$dir/train.bin" --val-data "$dir/val.bin" -o "$dir/ref" \
    --log-file "$dir/ref/log.jsonl" > "$dir/ref.out" 2>&1
[ -f "$dir/ref/$FINAL" ] && check ok "reference: mpirun -np 2, $STEPS steps" ||
    check FAIL "reference: mpirun -np 2, $STEPS steps" "$(tail -n 3 "$dir/ref.out")"

# "step loss lr norm" for every step, from the last line logged for it (a
# resumed run logs again the steps it does again)
# (steps_table, hb_step, wait_hb: scripts/tests/check.sh)
same_model() { # same_model OUT [REF STEPS]: the final model cmp-identical, every step's loss, lr and norm equal
    local ref=${2:-$dir/ref} n=${3:-$STEPS}
    cmp -s "$ref/$(printf "model_%08d.bin" "$n")" "$1/$(printf "model_%08d.bin" "$n")" &&
        diff <(steps_table "$ref/log.jsonl" "$n") <(steps_table "$1/log.jsonl" "$n") > /dev/null
}
# job state (PENDING RUNNING COMPLETED FAILED ...) and restart count, from slurmctld
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
wait_job() { # wait_job ID SECONDS: until it has ended; prints its final state
    local s=""
    for _ in $(seq $(( $2 * 5 ))); do
        s=$(job_field "$1" JobState)
        case $s in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) break ;; esac
        sleep 0.2
    done
    echo "$s"
}
# the trainer's ranks in the job's running step: pids of train_gpt_mpi processes of this cluster
ranks() { local p c; for p in $(ours); do read -r c 2>/dev/null < "/proc/$p/comm" && [ "$c" = "$(basename "$BIN_MPI")" ] && echo "$p"; done; }
SBATCH="sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --time=10:00"

# ---- 1. slurm_cpu.sbatch ----
t=$(date +%s%3N)
# shellcheck disable=SC2086
job=$(GPTC_OUT=$dir/cpu $SBATCH --output="$dir/cpu.out" scripts/slurm_cpu.sbatch $FLAGS)
s=$(wait_job "$job" 120)
[ "$s" = COMPLETED ] && same_model "$dir/cpu" &&
    check ok "slurm_cpu.sbatch: job $job COMPLETED, final model cmp-identical to the mpirun run" "($(( $(date +%s%3N) - t )) ms)" ||
    check FAIL "slurm_cpu.sbatch: job $job COMPLETED, final model cmp-identical to the mpirun run" "state $s: $(tail -n 3 "$dir/cpu.out")"

# the checker: it takes the job's model and must reject it with one weight changed
mkdir "$dir/planted" && cp "$dir/cpu/log.jsonl" "$dir/cpu/$FINAL" "$dir/planted/" &&
    printf '\xff\xff\xff\x7f' | dd of="$dir/planted/$FINAL" bs=1 seek=2000 conv=notrunc status=none # wte's weight 244 becomes a NaN
same_model "$dir/cpu" && ! same_model "$dir/planted" && check ok "the checker rejects a model with one weight changed" ||
    check FAIL "the checker rejects a model with one weight changed"

# ---- 2. slurm_supervised.sbatch: a rank SIGKILLed, then a step scancelled ----
t=$(date +%s%3N)
out=$dir/sup
# shellcheck disable=SC2086
job=$(GPTC_OUT=$out GPTC_STALE_S=30 GPTC_STARTUP_S=60 $SBATCH --output="$dir/sup.out" scripts/slurm_supervised.sbatch $FLAGS)
how=""
if wait_hb "$out/heartbeat" 10; then
    mapfile -t victims < <(ranks)
    if [ ${#victims[@]} -eq 2 ]; then
        victim=${victims[RANDOM % 2]}
        kill -KILL "$victim" && how="SIGKILL rank pid $victim at step $(hb_step "$out/heartbeat")"
    fi
fi
# the next step: wait for the supervisor's second attempt to pass step 22
if [ -n "$how" ] && wait_hb "$out/heartbeat" 22; then
    step=$(squeue -h -s -j "$job" -o %i | sed -n "s/^$job\.\([0-9][0-9]*\)$/\1/p" | sort -n | tail -n 1)
    [ -n "$step" ] && scancel --signal=KILL "$job.$step" && how="$how; scancel --signal=KILL $job.$step at step $(hb_step "$out/heartbeat")"
fi
s=$(wait_job "$job" 120)
restarts=$(grep -c '"event": "recovery"' "$out/recovery.jsonl" 2>/dev/null)
[ "$s" = COMPLETED ] && [ "$restarts" = 2 ] && same_model "$out" &&
    check ok "slurm_supervised.sbatch: $how; job $job COMPLETED after 2 restarts, final model cmp-identical" "($(( $(date +%s%3N) - t )) ms)" ||
    check FAIL "slurm_supervised.sbatch: a rank SIGKILLed, a step scancelled; job COMPLETED after 2 restarts, model cmp-identical" \
        "job $job $s, ${restarts:-no} restarts, done: ${how:-nothing}; $(grep -h 'supervisor:' "$dir/sup.out" | tail -n 3)"

# ---- 3. slurm_supervised.sbatch requeued ----
t=$(date +%s%3N)
out=$dir/req
# shellcheck disable=SC2086
job=$(GPTC_OUT=$out $SBATCH --output="$dir/req.out" scripts/slurm_supervised.sbatch $FLAGS)
how=""
wait_hb "$out/heartbeat" 12 && scontrol requeue "$job" && how="requeued at step $(hb_step "$out/heartbeat")"
s=$(wait_job "$job" 180)
resumed=$(sed -n 's/^resume: continuing after step \([0-9]*\).*/\1/p' "$dir/req.out" | tail -n 1)
[ "$s" = COMPLETED ] && [ "$(job_field "$job" Restarts)" = 1 ] && grep -q "(restart 1)" "$dir/req.out" &&
    [ "${resumed:-0}" -gt 0 ] && same_model "$out" &&
    check ok "slurm_supervised.sbatch: $how, job $job ran again (Restarts=1), resumed after step $resumed, final model cmp-identical" "($(( $(date +%s%3N) - t )) ms)" ||
    check FAIL "slurm_supervised.sbatch: requeued job resumes and ends cmp-identical" \
        "job $job $s, Restarts=$(job_field "$job" Restarts), resumed after step ${resumed:-none}, done: ${how:-nothing}; $(tail -n 3 "$dir/req.out")"

# ---- 4. slurm_supervised.sbatch with a standby step (GPTC_SPARE=1: srun --overlap), a rank of the active step SIGKILLed ----
# 200 steps (a standby step's set-up takes longer than the 36 steps above), memory snapshots in a tmpfs; its own reference
LONG=200
shm=$(mktemp -d /dev/shm/gptc_slurm.XXXXXX)
# shellcheck disable=SC2086
env -u SLURM_CONF timeout -k 10 120 mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1 -np 2 \
    "$BIN_MPI" --threads 1 $FLAGS -x $LONG --save-every 20 --train-data "$dir/train.bin" --val-data "$dir/val.bin" \
    -o "$dir/ref_long" --log-file "$dir/ref_long/log.jsonl" > "$dir/ref_long.out" 2>&1
t=$(date +%s%3N)
out=$dir/spare
# shellcheck disable=SC2086
job=$(GPTC_OUT=$out GPTC_SPARE=1 GPTC_STALE_S=30 GPTC_STARTUP_S=60 $SBATCH --output="$dir/spare.out" \
      scripts/slurm_supervised.sbatch $FLAGS -x $LONG --save-every 20 --snapshot-every 1 --shm-dir "$shm")
how=""
for _ in $(seq 600); do grep -q '^\[spare\] standby: ready' "$dir/spare.out" 2>/dev/null && break; sleep 0.1; done
if grep -q '^\[spare\] standby: ready' "$dir/spare.out" && wait_hb "$out/heartbeat" $(( $(hb_step "$out/heartbeat" || echo 0) + 1 + RANDOM % 8 )); then
    victims=() # the active step's ranks: not the standby's (their command line has --standby)
    for p in $(ranks); do tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- '--standby ' || victims+=("$p"); done
    if [ ${#victims[@]} -eq 2 ] && [ "$(hb_step "$out/heartbeat" || echo 0)" -lt $((LONG - 10)) ]; then
        victim=${victims[RANDOM % 2]}
        kill -KILL "$victim" && killed=$(date +%s%3N) && how="SIGKILL of active rank pid $victim at step $(hb_step "$out/heartbeat") with the standby step ready"
    fi
fi
s=$(wait_job "$job" 120)
hot=$(grep -c 'recovery: attempt 2 (hot spare)' "$dir/spare.out")
resumed_at=$(sed -n 's/^timing: first step done at \([0-9]*\).*/\1/p' "$dir/spare.out" | sed -n 2p) # the promoted step's
[ -n "$how" ] && [ -n "$resumed_at" ] && how="$how; kill -> first resumed step $((resumed_at - killed)) ms"
[ -n "$how" ] && [ "$s" = COMPLETED ] && [ "$hot" = 1 ] && grep -q '^resume: continuing after step [0-9]*; rank 0 from its own snapshot in memory, rank 1 from its own snapshot in memory' "$dir/spare.out" &&
    same_model "$out" "$dir/ref_long" $LONG &&
    check ok "slurm_supervised.sbatch, GPTC_SPARE=1: $how; promoted (hot spare), resumed from memory, job $job COMPLETED, final model cmp-identical" "($(( $(date +%s%3N) - t )) ms; $(grep -o 'recovery: attempt 2 (hot spare).*' "$dir/spare.out" | cut -c1-120))" ||
    check FAIL "slurm_supervised.sbatch, GPTC_SPARE=1: a rank SIGKILLed, the standby step promoted, cmp-identical" \
        "job $job $s, hot spare promotions ${hot:-0}, done: ${how:-nothing}; $(grep -hE 'supervisor|spare|resume:|error' "$dir/spare.out" | tail -n 6)"
rm -rf "$shm"
exit 0 # finish (the EXIT trap) stops the cluster and prints the counts
