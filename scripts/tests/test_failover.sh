#!/usr/bin/env bash
# test_failover.sh — a run that is killed again and again under
# scripts/supervise.py ends bit for bit where an uninterrupted run ends.
#
#   scripts/tests/test_failover.sh [./train_gpt] [./train_gpt_mpi] [./train_gpt_cu_cpu]
#   (make test-failover builds the first two and runs this)
#
# A small GPT (d2, C=128, T=64: 10-25 ms a step and about 30 ms to write a
# state here, so kills land in every phase) trains 48 steps with a state
# saved after every step (--save-every 1 --keep-last 2, shuffled data), as
# one process and as 2 MPI ranks (--zero 1, and --zero 0 with mpirun --mca
# odls_base_sigkill_timeout 0: by default mpirun waits 1 s before it kills
# the surviving ranks of a failed job, which "kill -> detected" shows); and
# with memory snapshots (--snapshot-every 1 --save-every 8), as one process
# and as 2 ranks under ZeRO-1, against the same references. Checked:
#   - killed runs: a background killer sends SIGKILL to a trainer process
#     (1 rank: train_gpt; 2 ranks: one rank of train_gpt_mpi at random,
#     found among the supervisor's descendants) up to 4 times per run, 2
#     seeds per configuration, at one of three kinds of moment: a random
#     delay after the attempt's process appears (start-up: MPI_Init, loading
#     the state), a random delay after its first heartbeat (mid-step,
#     mid-snapshot), or while it holds a *.tmp file open (mid-write of a
#     state or model file; "late" when it opened none within ~300 ms, as
#     between two saves with --save-every 8). The final model is
#     cmp-identical to the uninterrupted run's, every step's last logged
#     loss, lr and norm are the same text, the supervisor restarted once per
#     kill, and each restart has its recovery record with the time split;
#     no partial save (*.tmp) is left (a restart removes the dead writer's,
#     with a line; also with planted ones of every rank and the model's).
#     The killer never kills within 6 steps of the end (a kill that lands
#     after the job's last step would not be a failure to recover from) and
#     kills each attempt at most once (told apart by GPTC_ATTEMPT in
#     /proc/PID/environ), so every kill it counts must show up as one restart;
#   - a replaced host: a rank is killed and its own memory snapshots removed
#     before the restart: it recovers from the replica its neighbour keeps,
#     and the final model is still cmp-identical (for rank 1, rank 0, and
#     both at once: each then holds the replica the other needs, and the two
#     transfers must not wait on each other, which a blocking send did);
#   - one trainer per run directory: a second trainer on a running (SIGSTOPped)
#     trainer's --output-dir, launched without --resume (it would write a
#     new run.id first), is refused with the holder's pid and host, and
#     changes no byte of the first's folder and memory snapshots; the first
#     then finishes cmp-identical (1 process, 2 ranks, and the CUDA twin on
#     the CPU when ./train_gpt_cu_cpu is built). After a SIGKILL of the
#     holder, a new trainer gets the lock at once and resumes;
#   - a hang: SIGSTOP to one rank; the heartbeat goes stale (--stale-s 4),
#     the supervisor kills the attempt's whole session and restarts it; the
#     final model is still cmp-identical;
#   - retries exhausted: a bad flag (exits at once), and a command that never
#     writes a heartbeat (--startup-s 1): the supervisor gives up with its
#     message and exit status 1, and leaves no process behind;
#   - SIGTERM to the supervisor: passed on to the job, no restart, exit 143;
#   - a hot spare (supervise.py --spare 1, one process, memory snapshots):
#     the trainer SIGKILLed twice, each time once a spare is ready (the
#     trainer is SIGSTOPped until then, so the kill's moment does not depend
#     on this machine's speed): each spare is promoted, the final model
#     cmp-identical, the recovery times (failure detected -> first resumed
#     step) printed; a spare SIGKILLed while it waits is replaced and the
#     run goes on with no restart; two failures closer together than a
#     spare's set-up (GPTC_STANDBY_SETUP_MS: 2 s more) fall back to a cold
#     restart, still cmp-identical; a spare promoted where there is no state
#     at all (no snapshot yet, nothing on disk) says so and starts from step
#     0, cmp-identical. Each under `timeout`, every wait bounded;
#   - the checker: a log with one planted wrong loss must be rejected.
# Each run is under `timeout -k`. The last line is "N passed, N failed"; the
# exit status is non-zero on failure.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-.hooks/train_gpt}
BIN_MPI=${2:-.hooks/train_gpt_mpi}
PY=${PYTHON:-/usr/bin/python3}
SUP="$PY scripts/supervise.py"
STEPS=48
dir=$(mktemp -d /tmp/gptc_failover.XXXXXX)
# memory snapshots (--shm-dir) and Open MPI's shared-memory segments go to a
# tmpfs folder of our own, removed at the end: a SIGKILLed process leaves its
# files behind, and /dev/shm is not ours to fill. Ranks that wait in a
# collective yield the core (mpi_yield_when_idle) instead of spinning: 2
# ranks on 2 cores beside other jobs ran 1.5x slower spinning here.
shm_free_mb=$(df -Pm /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ "${shm_free_mb:-0}" -ge 512 ]; then shm=$(mktemp -d /dev/shm/gptc_failover.XXXXXX)
else shm=$(mktemp -d /tmp/gptc_failover_shm.XXXXXX); echo "note: /dev/shm has ${shm_free_mb:-no} MB free: snapshots go to $shm (a disk folder) instead"; fi
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl_vader_backing_directory $shm --mca mpi_yield_when_idle 1"
trap 'rm -rf "$shm"; [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
$PY scripts/toy_shard.py "$dir/train.bin" 60000 256 0 >/dev/null && $PY scripts/toy_shard.py "$dir/val.bin" 6000 256 1 >/dev/null || exit 1
# every run uses the same build, even if the tree's binaries are rebuilt meanwhile
mkdir "$dir/bin" && cp "$BIN" "$BIN_MPI" "$dir/bin/" || exit 1
BIN="$dir/bin/$(basename "$BIN")"
BIN_MPI="$dir/bin/$(basename "$BIN_MPI")"
COMMON="--model d2 --channels 128 --num-heads 2 --max-seq-len 64 --vocab-size 256 -i $dir/train.bin -j $dir/val.bin
        -t 64 --lr 3e-3 --warmup-steps 2 --val-every 4 --val-batches 2 --sample-every 0 --threads 1 --shuffle 1
        -x $STEPS --save-every 1 --keep-last 2"
MEM="--snapshot-every 1 --save-every 8 --shm-dir $shm"
declare -A CMD=( [one]="$BIN $COMMON -b 6"
                 [np2-zero1]="$MPIRUN -np 2 $BIN_MPI $COMMON -b 3 --zero 1"
                 [np2-zero0]="$MPIRUN --mca odls_base_sigkill_timeout 0 -np 2 $BIN_MPI $COMMON -b 3 --zero 0"
                 [one-mem]="$BIN $COMMON -b 6 $MEM"
                 [np2-zero1-mem]="$MPIRUN -np 2 $BIN_MPI $COMMON -b 3 --zero 1 $MEM" )
declare -A PROC=( [one]=train_gpt [np2-zero1]=train_gpt_mpi [np2-zero0]=train_gpt_mpi [one-mem]=train_gpt
                  [np2-zero1-mem]=train_gpt_mpi )
declare -A REF=( [one]=one [np2-zero1]=np2-zero1 [np2-zero0]=np2-zero0 [one-mem]=one [np2-zero1-mem]=np2-zero1 )
FINAL=$(printf "model_%08d.bin" $STEPS)

# (steps_table, same_steps: scripts/tests/check.sh)

# processes below pid $1, depth first
descendants() { local c; for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
proc_state() { local s; read -r s 2>/dev/null < "/proc/$1/stat" || return 1; s=${s##*) }; echo "${s%% *}"; }
proc_gone() { case "$(proc_state "$1")" in ""|Z|X) return 0 ;; esac; return 1; } # exited (a zombie counts)
proc_attempt() { { tr '\0' '\n' < "/proc/$1/environ"; } 2>/dev/null | sed -n 's/^GPTC_ATTEMPT=//p'; }

# (hb_step, wait_hb, wait_count: scripts/tests/check.sh)

# killer ROOT NAME KILLS SEED HEARTBEAT LOG: SIGKILL one live NAME process
# below ROOT, of an attempt not killed before, up to KILLS times; one line per
# kill in LOG: "unix_ms attempt pid how step". When to kill is counted in
# steps past the furthest step seen so far (`last`), so that it does not
# depend on how fast this machine is today.
killer() {
    local root=$1 name=$2 kills=$3 heartbeat=$5 log=$6 killed=" " k=0 last=0 p att how hb i
    RANDOM=$4
    while [ $k -lt "$kills" ] && kill -0 "$root" 2>/dev/null; do
        local pids=()
        for p in $(descendants "$root"); do
            [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$name" ] || continue
            att=$(proc_attempt "$p")
            [ -n "$att" ] && [[ "$killed" != *" $att "* ]] && pids+=("$p")
        done
        if [ ${#pids[@]} -eq 0 ]; then sleep 0.01; continue; fi
        p=${pids[RANDOM % ${#pids[@]}]}
        att=$(proc_attempt "$p")
        case $((RANDOM % 3)) in
        0)  how=start # 0-300 ms after it appeared: in start-up (MPI_Init, loading the state) or the first steps
            for ((i = RANDOM % 60; i > 0; i--)); do hb=$(hb_step "$heartbeat"); [ "${hb:-0}" -ge $((last + 3)) ] && break; sleep 0.005; done ;;
        1)  how=step # 1-6 steps past the furthest step so far (this attempt's heartbeat), then 0-9 ms into the next
            local want=$((last + 1 + RANDOM % 6))
            for ((i = 0; i < 1000; i++)); do hb=$(hb_step "$heartbeat"); [ "${hb:-0}" -ge $want ] && break; sleep 0.005; done
            sleep "0.00$((RANDOM % 10))" ;;
        2)  how=late # while it writes a state or model file, if it opens one within 8 steps
            for ((i = 0; i < 1000; i++)); do
                [[ $(ls -l "/proc/$p/fd" 2>/dev/null) == *.tmp* ]] && { how=write; break; }
                hb=$(hb_step "$heartbeat"); [ "${hb:-0}" -ge $((last + 8)) ] && break
            done ;;
        esac
        hb=$(hb_step "$heartbeat")
        [ -n "$hb" ] && [ "$hb" -gt "$last" ] && last=$hb
        [ "$last" -ge $((STEPS - 6)) ] && break # near the end: stop
        proc_gone "$p" && continue
        if kill -KILL "$p" 2>/dev/null; then
            k=$((k + 1))
            killed="$killed$att "
            echo "$(date +%s%3N) $att $p $how $last" >> "$log"
        fi
    done
}

# the recovery records: N restarts, each with failure detected and relaunch;
# every one that reached its first step with all phases; prints a summary
recovery_check() { # recovery_check FILE.jsonl WANT [KILL_LOG]
    $PY - "$@" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
want = int(sys.argv[2])
kills = [float(l.split()[0]) for l in open(sys.argv[3])] if len(sys.argv) > 3 else []
rec = [r for r in recs if r["event"] == "recovery"]
fin = [r for r in recs if r["event"] == "finished"]
problems = []
if len(rec) != want: problems.append(f"{len(rec)} recovery records, want {want}")
if not fin or fin[-1]["restarts"] != want: problems.append(f"finished record: {fin}")
full = ["relaunch", "launch", "comm_init", "model_setup", "state_load", "first_step", "total"]
for r in rec:
    if "relaunch" not in r["ms"] or not r.get("failure"): problems.append(f"attempt {r['attempt']}: no failure/relaunch")
    # steps lost: unknown (None) only when no heartbeat came before the failure
    if r["outcome"] == "first step done" and (any(k not in r["ms"] for k in full) or r["resumed_from"] is None
            or (r["steps_lost"] is None) != (r["last_step"] is None) or (r["steps_lost"] or 0) < 0):
        problems.append(f"attempt {r['attempt']}: incomplete split {r['ms']}, lost {r['steps_lost']}")
done = [r for r in rec if r["outcome"] == "first step done"]
if rec and not done: problems.append("no recovery reached its first step")
if problems:
    print("; ".join(problems)); sys.exit(1)
def mean(k): return sum(r["ms"][k] for r in done) / len(done)
lat = [r["at"]["detected"] - k for r, k in zip(rec, sorted(kills))]
print(f"{len(done)} complete: mean " + " + ".join(f"{k} {mean(k):.0f}" for k in full[:-1])
      + f" = {mean('total'):.0f} ms, {sum(r['steps_lost'] or 0 for r in done) / len(done):.1f} steps lost"
      + (f"; kill -> detected {sum(lat) / len(lat):.0f} ms" if lat else "")
      + "; states from " + ", ".join(f"{w} {sum(w in r['resumed_how'] for r in done)}" for w in ("memory", "replica", "disk", "fresh")))
EOF
}

# the uninterrupted references; the step checker must reject a planted wrong loss
timeout -k 10 120 $BIN $COMMON -b 6 -o "$dir/one.ref" --log-file "$dir/one.ref.jsonl" > "$dir/one.ref.out" 2>&1
[ $? -eq 0 ] && check ok "one: uninterrupted reference" || check FAIL "one: uninterrupted reference" "$(tail -3 "$dir/one.ref.out")"
awk '/^{"step": 20, "loss"/ { match($0, /"loss": [0-9.]+/); v = substr($0, RSTART + 8, RLENGTH - 8)
                              sub(/"loss": [0-9.]+/, sprintf("\"loss\": %.6f", v + 1e-6)) } 1' "$dir/one.ref.jsonl" > "$dir/planted.jsonl"
! cmp -s "$dir/one.ref.jsonl" "$dir/planted.jsonl" && ! same_steps "$dir/one.ref.jsonl" "$dir/planted.jsonl" &&
    same_steps "$dir/one.ref.jsonl" "$dir/one.ref.jsonl" &&
    check ok "the step checker rejects a log with one loss changed in its last digit" ||
    check FAIL "the step checker rejects a log with one loss changed in its last digit"
for name in np2-zero1 np2-zero0; do
    timeout -k 10 120 ${CMD[$name]} -o "$dir/$name.ref" --log-file "$dir/$name.ref.jsonl" > "$dir/$name.ref.out" 2>&1
    [ $? -eq 0 ] && check ok "$name: uninterrupted reference" || check FAIL "$name: uninterrupted reference" "$(tail -3 "$dir/$name.ref.out")"
done

# killed runs, 2 seeds per configuration
seed=0
for name in one np2-zero1 np2-zero0 one-mem np2-zero1-mem; do
    ref=${REF[$name]}
    for _ in 1 2; do
        seed=$((seed + 1))
        run="$name-s$seed"
        timeout -k 10 120 $SUP --retries 10 --stale-s 20 --heartbeat "$dir/$run.hb" --recovery-log "$dir/$run.rec.jsonl" \
            -- ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" > "$dir/$run.out" 2>&1 &
        sup=$!
        : > "$dir/$run.kills"
        killer $sup ${PROC[$name]} 4 $seed "$dir/$run.hb" "$dir/$run.kills"
        wait $sup
        rc=$?
        kills=$(wc -l < "$dir/$run.kills")
        how=$(awk '{ n[$4]++ } END { for (h in n) printf "%s%d %s", (s++ ? ", " : ""), n[h], h }' "$dir/$run.kills")
        if [ $rc -ne 0 ]; then check FAIL "$run: supervised run" "exit $rc: $(tail -3 "$dir/$run.out")"; continue; fi
        [ "$kills" -ge 2 ] && cmp -s "$dir/$ref.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/$ref.ref.jsonl" "$dir/$run.jsonl" &&
            check ok "$run: killed $kills times ($how), final model cmp-identical, every step's loss/lr/norm the same" ||
            check FAIL "$run: killed $kills times ($how): final model and every step's loss identical" \
                "$(cmp "$dir/$ref.ref/$FINAL" "$dir/$run/$FINAL" 2>&1 | head -1) $(diff <(steps_table "$dir/$ref.ref.jsonl") <(steps_table "$dir/$run.jsonl") | head -3)"
        summary=$(recovery_check "$dir/$run.rec.jsonl" "$kills" "$dir/$run.kills")
        [ $? -eq 0 ] && [ "$(grep -c '^supervisor: recovery: ' "$dir/$run.out")" = "$kills" ] &&
            check ok "$run: $kills restarts for $kills kills, each with its recovery split" "$summary" ||
            check FAIL "$run: one restart and one recovery record per kill" "$summary"
        if [ "$name" = np2-zero1 ]; then # mpirun without --mca odls_base_sigkill_timeout 0: the supervisor passes it
            lat=$(sed -n 's/.*kill -> detected \([0-9]*\) ms.*/\1/p' <<< "$summary")
            [ -n "$lat" ] && [ "$lat" -lt 500 ] &&
                check ok "$run: mpirun ended the job at once after each kill (the supervisor passed odls_base_sigkill_timeout 0): kill -> detected $lat ms on average" ||
                check FAIL "$run: kill -> detected under 500 ms (mpirun waits 1 s without odls_base_sigkill_timeout 0)" "${lat:-?} ms: $summary"
        fi
    done
done
grep -h '^supervisor: recovery: ' "$dir"/one-s1.out "$dir"/np2-zero1-s3.out 2>/dev/null | head -2 | sed 's/^/     /'
# a kill mid-write leaves a <file>.tmp; the next trainer removes it (it is
# never a state, and retention would keep it for good)
left=$(cd "$dir" && ls -d *-s[0-9]*/*.tmp 2>/dev/null | tr '\n' ' ')
writes=$(cat "$dir"/*-s[0-9]*.kills 2>/dev/null | awk '$4 == "write"' | wc -l)
removed=$(cat "$dir"/*-s[0-9]*.out 2>/dev/null | grep -c '^resume: removed .*\.tmp (.* GB): a save cut short')
[ -z "$left" ] && { [ "$writes" -eq 0 ] || [ "$removed" -ge 1 ]; } &&
    check ok "killed runs: no partial save (*.tmp) left behind ($writes kills mid-write, $removed partial saves removed on restart)" ||
    check FAIL "killed runs: no partial save (*.tmp) left behind" "left: ${left:-none}; $writes kills mid-write, $removed removed"
# memory snapshots on a disk folder work, with a warning (each snapshot is
# written back to the disk); on the tmpfs, no warning
mkdir -p "$dir/diskshm"
warned=$(timeout -k 10 60 $BIN $COMMON -b 6 -x 2 --snapshot-every 1 --shm-dir "$dir/diskshm" -o "$dir/diskshm.run" 2>&1 | grep -c '^warning: --shm-dir .* is not in memory')
quiet=$(timeout -k 10 60 $BIN $COMMON -b 6 -x 2 --snapshot-every 1 --shm-dir "$shm" -o "$dir/tmpfs.run" 2>&1 | grep -c '^warning: --shm-dir')
[ "$warned" = 1 ] && { [ "$quiet" = 0 ] || [ "$(stat -f -c %T "$shm")" != tmpfs ]; } &&
    check ok "--shm-dir on a disk folder: one warning that snapshots are written back to disk; on a tmpfs none" ||
    check FAIL "--shm-dir on a disk folder warns, on a tmpfs not" "disk: $warned warning(s), tmpfs: $quiet"
# planted: a dead trainer's partial saves of every rank, of a step's
# "complete" marker and of the model are removed when the next trainer takes the run; a file of another name stays
run=partial
mkdir -p "$dir/$run"
for f in state_00000099_rank0.bin.tmp state_00000099_rank1.bin.tmp state_00000099.complete.tmp model_00000099.bin.tmp notes.tmp; do
    head -c 4096 /dev/zero > "$dir/$run/$f"
done
timeout -k 10 60 $BIN $COMMON -b 6 -x 2 -o "$dir/$run" > "$dir/$run.out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(cd "$dir/$run" && ls *.tmp)" = notes.tmp ] && [ "$(grep -c '^resume: removed .*: a save cut short' "$dir/$run.out")" = 4 ] &&
    check ok "partial saves planted (rank 0's, rank 1's, a complete marker, the model's): removed by the next trainer, with a line each; notes.tmp kept" ||
    check FAIL "partial saves removed by the next trainer, other files kept" "exit $rc; left: $(cd "$dir/$run" && ls *.tmp | tr '\n' ' '); $(grep '^resume: removed' "$dir/$run.out" | head -3)"

# a replaced host: rank 1 is killed and its own memory snapshots are gone
# before the restart (as on a new machine); it recovers from the replica
# its neighbour keeps, and the run still ends bit for bit
name=np2-zero1-mem
for victim in 1 0 both; do # both: each rank lost its own snapshots, each holds the other's replica
    run=$name-host$victim
    killed=$([ $victim = both ] && echo 0 || echo $victim)
    ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" --heartbeat "$dir/$run.hb" > "$dir/$run.1.out" 2>&1 &
    job=$!
    for _ in $(seq 600); do hb=$(hb_step "$dir/$run.hb"); [ "${hb:-0}" -ge 12 ] && break; sleep 0.02; done
    ranks=($(for p in $(descendants $job); do [ "$(cat /proc/$p/comm 2>/dev/null)" = train_gpt_mpi ] && echo $p; done))
    # rank r's process: the one whose environment says OMPI_COMM_WORLD_RANK=r
    for p in "${ranks[@]}"; do
        tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$killed" && kill -KILL $p
    done
    timeout -k 5 30 tail --pid=$job -f /dev/null
    wait $job 2>/dev/null
    if [ $victim = both ]; then rm -f "$shm"/gptc-*-state0-at0-*.bin "$shm"/gptc-*-state1-at1-*.bin
    else rm -f "$shm"/gptc-*-state$victim-at$victim-*.bin; fi
    timeout -k 10 120 ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" --resume 1 > "$dir/$run.2.out" 2>&1
    rc=$?
    from=$(grep -m1 "^resume: continuing" "$dir/$run.2.out")
    want=$([ $victim = both ] && echo "rank 0 from the neighbour's replica, rank 1 from the neighbour's replica" ||
           echo "rank $victim from the neighbour's replica")
    [ $rc -eq 0 ] && [[ "$from" == *"$want"* ]] &&
        cmp -s "$dir/np2-zero1.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/np2-zero1.ref.jsonl" "$dir/$run.jsonl" &&
        check ok "$name: $([ $victim = both ] && echo "rank 0 killed and both ranks' own snapshots removed" || echo "rank $victim killed and its own snapshots removed") at step ${hb:-?}: restored from the neighbour's replica, final model cmp-identical" "$from" ||
        check FAIL "$name: rank $victim restored from its neighbour's replica" "exit $rc: $from $(tail -2 "$dir/$run.2.out")"
done

# one trainer per run directory: the first runs (stopped with SIGSTOP, so
# it holds its lock while nothing changes); a second on its --output-dir,
# without --resume, must be refused before it writes anything
files_sum() { find "$@" -type f ! -name '*.hb' -print0 2>/dev/null | sort -z | xargs -0 md5sum 2>/dev/null | md5sum; }
job_pids() { for p in $(descendants "$1") "$1"; do [ "$(cat /proc/$p/comm 2>/dev/null)" = "$2" ] && echo $p; done; }
for name in one-mem np2-zero1-mem; do
    ref=${REF[$name]}
    run=$name-lock
    ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" --heartbeat "$dir/$run.hb" > "$dir/$run.1.out" 2>&1 &
    job=$!
    for _ in $(seq 600); do hb=$(hb_step "$dir/$run.hb"); [ "${hb:-0}" -ge 6 ] && break; sleep 0.02; done
    procs=$(job_pids $job ${PROC[$name]})
    kill -STOP $procs
    sleep 0.2 # (a write in flight lands)
    before=$(files_sum "$dir/$run" "$shm"/gptc-*) # (Open MPI's own segments in $shm come and go)
    out=$(timeout -k 5 60 ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.2.jsonl" 2>&1)
    rc=$?
    after=$(files_sum "$dir/$run" "$shm"/gptc-*)
    named=$(echo "$out" | sed -n 's/^error: --output-dir .* is in use by pid \([0-9]*\) on host .*/\1/p' | head -1)
    kill -CONT $procs
    wait $job
    rc1=$?
    want="error: --output-dir $dir/$run is in use by pid "
    [ $rc -ne 0 ] && [[ "$out" == *"$want"*" on host $(hostname) (started "*"): wait for it, or use another --output-dir"* ]] &&
        [[ " $(echo $procs) " == *" $named "* ]] && [ "$before" = "$after" ] && [ ! -e "$dir/$run.2.jsonl" ] &&
        [ $rc1 -eq 0 ] && cmp -s "$dir/$ref.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/$ref.ref.jsonl" "$dir/$run.jsonl" &&
        check ok "$name: a second trainer on a running trainer's --output-dir (at step $hb) is refused, nothing of the first's changed; the first ends cmp-identical" \
            "$(echo "$out" | grep -m1 '^error: --output-dir' | sed "s|$dir/||")" ||
        check FAIL "$name: a second trainer on the same --output-dir is refused and the first ends cmp-identical" \
            "second: exit $rc, files $([ "$before" = "$after" ] && echo same || echo CHANGED): $(echo "$out" | grep -m2 'error' | tr '\n' ' '); first: exit $rc1 $(tail -2 "$dir/$run.1.out")"
done
# the holder SIGKILLed: the kernel drops its lock; a new trainer takes it at once
name=one-mem
run=$name-killed-holder
${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" --heartbeat "$dir/$run.hb" > "$dir/$run.1.out" 2>&1 &
job=$!
for _ in $(seq 600); do hb=$(hb_step "$dir/$run.hb"); [ "${hb:-0}" -ge 10 ] && break; sleep 0.02; done
kill -KILL $job
wait $job 2>/dev/null
t0=$(date +%s%3N)
timeout -k 5 60 ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" --resume 1 > "$dir/$run.2.out" 2>&1
rc=$?
ms=$(sed -n 's/^timing: model ready at \([0-9]*\).*/\1/p' "$dir/$run.2.out")
from=$(grep -m1 "^resume: continuing" "$dir/$run.2.out")
[ $rc -eq 0 ] && ! grep -q "in use by" "$dir/$run.2.out" && [ -n "$from" ] &&
    cmp -s "$dir/one.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/one.ref.jsonl" "$dir/$run.jsonl" &&
    check ok "$name: the lock's holder SIGKILLed at step $hb: a new trainer gets the lock at once, resumes, final model cmp-identical" "$from" ||
    check FAIL "$name: after a SIGKILL of the holder a new trainer gets the lock" "exit $rc: $(grep -m2 'error' "$dir/$run.2.out")"
# the CUDA twin, executed on the CPU (when built: make train_gpt_cu_cpu): the
# same lock, taken in the same train_run_init
# (the third argument; else ./train_gpt_cu_cpu if it is newer than the sources that take the lock)
CU=${3:-./train_gpt_cu_cpu}
if [ -x "$CU" ] && { [ -n "${3:-}" ] || [ "$CU" -nt train_gpt.c -a "$CU" -nt gptc/state.h -a "$CU" -nt gptc/util.h ]; }; then
    run=cu-lock
    $BIN $COMMON -b 6 -x 2000 --snapshot-every 1 --shm-dir "$shm" -o "$dir/$run" --heartbeat "$dir/$run.hb" > "$dir/$run.1.out" 2>&1 &
    job=$!
    for _ in $(seq 600); do hb=$(hb_step "$dir/$run.hb"); [ "${hb:-0}" -ge 3 ] && break; sleep 0.02; done
    kill -STOP $job
    before=$(files_sum "$dir/$run" "$shm"/gptc-*)
    out=$(timeout -k 5 120 "$CU" $COMMON -b 6 -o "$dir/$run" 2>&1)
    rc=$?
    after=$(files_sum "$dir/$run" "$shm"/gptc-*)
    kill -CONT $job
    kill -KILL $job
    wait $job 2>/dev/null
    [ $rc -ne 0 ] && [[ "$out" == *"error: --output-dir $dir/$run is in use by pid $job on host $(hostname) (started "* ]] &&
        [ "$before" = "$after" ] &&
        check ok "the CUDA twin (on the CPU) on train_gpt's running --output-dir: refused the same way, nothing changed" ||
        check FAIL "the CUDA twin (on the CPU) on a running --output-dir is refused" "exit $rc: $(echo "$out" | tail -2)"
else
    echo "note: $CU not built, or older than the sources (make train_gpt_cu_cpu): the CUDA twin's refusal is not checked"
fi

# a hang: one rank stopped; the heartbeat goes stale
name=np2-zero1
run=$name-hang
timeout -k 10 120 $SUP --stale-s 4 --startup-s 60 --heartbeat "$dir/$run.hb" --recovery-log "$dir/$run.rec.jsonl" \
    -- ${CMD[$name]} -o "$dir/$run" --log-file "$dir/$run.jsonl" > "$dir/$run.out" 2>&1 &
sup=$!
stopped=""
for _ in $(seq 300); do # wait for step 8, then stop a rank chosen at random
    hb=$(hb_step "$dir/$run.hb")
    if [[ "$hb" =~ ^[0-9]+$ ]] && [ "$hb" -ge 8 ]; then
        ranks=($(for p in $(descendants $sup); do [ "$(cat /proc/$p/comm 2>/dev/null)" = train_gpt_mpi ] && echo $p; done))
        stopped=${ranks[RANDOM % ${#ranks[@]}]}
        kill -STOP "$stopped"
        break
    fi
    sleep 0.05
done
wait $sup
rc=$?
[ $rc -eq 0 ] && [ -n "$stopped" ] && grep -q "hangs: heartbeat unchanged for 4 s" "$dir/$run.out" &&
    cmp -s "$dir/$name.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/$name.ref.jsonl" "$dir/$run.jsonl" &&
    recovery_check "$dir/$run.rec.jsonl" 1 > /dev/null && proc_gone "$stopped" &&
    check ok "$name: a rank stopped (SIGSTOP) at step $hb: stale heartbeat seen, session killed, restarted, final model cmp-identical" \
        "$(grep -m1 '^supervisor: recovery' "$dir/$run.out" | sed 's/.*): //')" ||
    check FAIL "$name: a stopped rank is detected and the run recovers" "exit $rc, stopped '$stopped': $(tail -3 "$dir/$run.out")"

# retries exhausted: a command that always fails at once, and one that never starts
out=$(timeout -k 10 60 $SUP --retries 2 -- $BIN --no-such-flag 2>&1)
rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "^supervisor: giving up: attempt 3 failed (exit status 1)" &&
    [ "$(echo "$out" | grep -c '^supervisor: attempt [0-9]* failed')" = 2 ] &&
    check ok "a command that always fails: 2 retries, then exit 1" "$(echo "$out" | grep -m1 'giving up' | cut -c1-90)..." ||
    check FAIL "a command that always fails: 2 retries, then exit 1" "exit $rc: $(echo "$out" | tail -2)"
marker="gptc_failover_$$"
start=$(date +%s)
out=$(timeout -k 10 60 $SUP --retries 1 --startup-s 1 -- sh -c "sleep 50; : $marker" sh 2>&1)
rc=$?
[ $rc -eq 1 ] && echo "$out" | grep -q "hangs: no heartbeat 1 s after the launch" && echo "$out" | grep -q "giving up" &&
    ! pgrep -f "$marker" > /dev/null &&
    check ok "a command that never writes a heartbeat: killed after --startup-s 1, retried once, exit 1, nothing left" "$(( $(date +%s) - start )) s" ||
    check FAIL "a command that never writes a heartbeat gives up" "exit $rc: $(echo "$out" | tail -2); left: $(pgrep -f "$marker")"
pkill -KILL -f "$marker" 2>/dev/null

# SIGTERM to the supervisor: passed on, no restart
run=one-term
timeout -k 10 60 $SUP --heartbeat "$dir/$run.hb" -- ${CMD[one]} -x 2000 -o "$dir/$run" > "$dir/$run.out" 2>&1 &
sup=$!
trainer=""
for _ in $(seq 200); do
    hb=$(hb_step "$dir/$run.hb")
    if [[ "$hb" =~ ^[0-9]+$ ]] && [ "$hb" -ge 3 ]; then
        trainer=$(for p in $(descendants $sup); do [ "$(cat /proc/$p/comm 2>/dev/null)" = train_gpt ] && echo $p; done)
        supervisor=$(pgrep -P $sup)  # timeout's child
        kill -TERM "$supervisor"
        break
    fi
    sleep 0.05
done
wait $sup
rc=$?
[ $rc -eq 143 ] && [ -n "$trainer" ] && proc_gone "$trainer" && grep -q "stopped by SIGTERM" "$dir/$run.out" &&
    ! grep -q "attempt 2" "$dir/$run.out" &&
    check ok "SIGTERM to the supervisor: passed to the trainer, no restart, exit 143" ||
    check FAIL "SIGTERM to the supervisor: passed to the trainer, no restart, exit 143" "exit $rc: $(tail -2 "$dir/$run.out")"

# A hot spare (supervise.py --spare 1). Helper: a process by a word of its
# command line, among the supervisor's descendants.
job_with() { # job_with ROOT WORD [NOT]: a train_gpt process below ROOT whose command line has WORD (and not NOT)
    local p c
    for p in $(descendants "$1"); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = train_gpt ] || continue
        c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null)
        [[ "$c" == *"$2"* ]] && { [ -z "${3:-}" ] || [[ "$c" != *"$3"* ]]; } && echo $p && return
    done
}
lock_holder() { sed -n 's/^pid \([0-9]*\) .*/\1/p' "$dir/$run/.lock" 2>/dev/null; } # the active trainer (a promoted spare too)
spare_run() { # spare_run NAME [FLAGS]: the supervised one-mem run, in the background ($sup)
    run=spare-$1
    timeout -k 10 120 $SUP --spare 1 --heartbeat "$dir/$run.hb" --recovery-log "$dir/$run.rec.jsonl" -- \
        ${CMD[one-mem]} ${2:-} -o "$dir/$run" --log-file "$dir/$run.jsonl" > "$dir/$run.out" 2>&1 &
    sup=$!
}
# the active trainer (not a spare) stopped at heartbeat step $1 until spare number $2 is ready, then SIGKILLed
kill_when_spare_ready() {
    wait_hb "$dir/$run.hb" "$1" || return 1
    local t
    t=$(lock_holder)
    [ -n "$t" ] || return 1
    kill -STOP "$t"
    wait_count "$dir/$run.out" '^\[spare\] standby: ready' "$2" || { kill -CONT "$t"; return 1; }
    kill -KILL "$t"
}
spare_ms() { # the hot-spare recoveries' totals, and their split
    $PY - "$dir/$run.rec.jsonl" <<'PYEOF'
import json, sys
for r in (json.loads(l) for l in open(sys.argv[1])):
    if r["event"] == "recovery":
        print(f"attempt {r['attempt']} {'hot spare' if r.get('hot_spare') else 'cold'}: {r['ms'].get('total', '?')} ms "
              f"(" + ", ".join(f"{k} {v}" for k, v in r["ms"].items() if k != "total") + f"; {r['resumed_how']})")
PYEOF
}

# two failures, a ready spare each time: promoted twice, bit for bit
spare_run killed
kill_when_spare_ready 3 1 && wait_count "$dir/$run.out" "recovery: attempt 2 (hot spare)" 1 && kill_when_spare_ready 20 2
wait $sup
rc=$?
rec=$(spare_ms)
[ $rc -eq 0 ] && cmp -s "$dir/one.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/one.ref.jsonl" "$dir/$run.jsonl" &&
    [ "$(echo "$rec" | grep -c 'hot spare')" -eq 2 ] && grep -q "after 2 restart(s)" "$dir/$run.out" &&
    check ok "hot spare: trainer SIGKILLed twice with a spare ready: promoted both times, final model cmp-identical" \
        "$(echo "$rec" | tr '\n' ';' | sed 's/;$//')" ||
    check FAIL "hot spare: two kills with a spare ready, promoted, cmp-identical" "exit $rc: $rec $(tail -2 "$dir/$run.out")"

# a spare killed while it waits: replaced, the run untouched
spare_run spare-killed
ok=0
if wait_hb "$dir/$run.hb" 3; then
    t=$(lock_holder)
    kill -STOP "$t"
    if wait_count "$dir/$run.out" '^\[spare\] standby: ready' 1; then
        kill -KILL "$(job_with $sup "--standby")"
        wait_count "$dir/$run.out" "died while waiting" 1 && wait_count "$dir/$run.out" '^\[spare\] standby: ready' 2 && ok=1
    fi
    kill -CONT "$t"
fi
wait $sup
rc=$?
[ $ok -eq 1 ] && [ $rc -eq 0 ] && cmp -s "$dir/one.ref/$FINAL" "$dir/$run/$FINAL" && grep -q "after 0 restart(s)" "$dir/$run.out" &&
    check ok "hot spare: a spare SIGKILLed while waiting is replaced (a second one ready), no restart, final model cmp-identical" ||
    check FAIL "hot spare: a spare killed while waiting is replaced" "exit $rc, ok $ok: $(grep supervisor "$dir/$run.out" | tail -3)"

# two failures faster than a spare's set-up (each spare takes 2 s more to
# set up here: GPTC_STANDBY_SETUP_MS): the second spare is not ready yet
# when its trainer is killed: a cold restart
export GPTC_STANDBY_SETUP_MS=2000
spare_run twice
unset GPTC_STANDBY_SETUP_MS
ok=0
if kill_when_spare_ready 3 1 && wait_count "$dir/$run.out" "spare.*spare2 starting" 1; then
    t=$(lock_holder)
    ! grep -q '^\[spare\] standby: ready.*go2' "$dir/$run.out" && [ -n "$t" ] && kill -KILL "$t" && ok=1
fi
wait $sup
rc=$?
rec=$(spare_ms)
[ $ok -eq 1 ] && [ $rc -eq 0 ] && cmp -s "$dir/one.ref/$FINAL" "$dir/$run/$FINAL" && same_steps "$dir/one.ref.jsonl" "$dir/$run.jsonl" &&
    grep -q "is not ready (still setting up): killing it, cold restart" "$dir/$run.out" &&
    [ "$(echo "$rec" | grep -c 'hot spare')" -eq 1 ] && [ "$(echo "$rec" | grep -c ' cold')" -eq 1 ] &&
    check ok "hot spare: a second failure before the next spare is ready: cold restart, final model cmp-identical" \
        "$(echo "$rec" | tr '\n' ';' | sed 's/;$//')" ||
    check FAIL "hot spare: two failures faster than a spare: cold restart, cmp-identical" "exit $rc, ok $ok: $rec"

# a spare promoted where there is no state at all (no snapshot yet, nothing on disk): step 0, a fresh start
spare_run no-state "--snapshot-every 1000 --save-every 1000"
kill_when_spare_ready 3 1
wait $sup
rc=$?
[ $rc -eq 0 ] && cmp -s "$dir/one.ref/$FINAL" "$dir/$run/$FINAL" &&
    grep -q "^resume: no training state in .* or in memory: starting from step 0" "$dir/$run.out" &&
    [ "$(spare_ms | grep -c 'hot spare')" -eq 1 ] &&
    check ok "hot spare: promoted with no snapshot and no state on disk: says so, starts from step 0, final model cmp-identical" ||
    check FAIL "hot spare with no state: starts over, cmp-identical" "exit $rc: $(grep -E 'resume|supervisor' "$dir/$run.out" | tail -3)"
[ -z "$(pgrep -f -- "-o $dir/spare-" 2>/dev/null)" ] &&
    check ok "hot spare: no trainer or spare left behind" ||
    check FAIL "hot spare: no trainer or spare left behind" "$(pgrep -af -- "-o $dir/spare-")"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
