# check.sh — the one check of the shell tests, sourced by scripts/tests/test_*.sh
# (after they cd to the repository root). It prints the lines test_common.h's
# check() prints in the C tests:
#   check ok|FAIL WHAT [DETAIL]   counts one check in $passed or $failed and
#                                 prints "ok   WHAT  DETAIL" or "FAIL WHAT  DETAIL"
# Anything but "ok" counts as a failure, so check "$(test ... && echo ok)" WHAT
# fails when the test does. With CHECK_START set (a `date +%s`), each line ends
# with the seconds since then. Each script prints its own last line,
# "N passed, N failed", and exits non-zero on a failure.
#   steps_table LOG [N]           "step loss lr norm" for steps 1..N of a
#                                 --log-file, each from the last line logged
#                                 for it (a resumed run appends the steps it
#                                 does again); "N missing" for a step never
#                                 logged (N: the caller's $STEPS unless given)
#   same_steps LOG REF            every step's last logged values equal REF's,
#                                 as text
#   hb_step HEARTBEAT             the step in a --heartbeat file ("" when none yet)
#   wait_hb HEARTBEAT STEP        until it reports STEP or more (60 s at most)
#   wait_count FILE PATTERN N     until N lines of FILE match PATTERN (60 s at most)
#   startup_split LINE PHASE      prints "OTHER of TOTAL ms" from a "start-up:"
#                                 line; true when it names PHASE and leaves at
#                                 most 10% of the start-up (or 20 ms) as "other"
#   $CLEAN_ENV COMMAND...         runs COMMAND without an outer launcher's
#                                 rank variables (Slurm's, Open MPI's, PMI's,
#                                 torchrun's): under an outer job they would
#                                 make every trainer a test starts think it is
#                                 one of that job's ranks
passed=0
failed=0
check() {
    local mark="FAIL"
    if [ "$1" = ok ]; then passed=$((passed + 1)); mark="ok  "; else failed=$((failed + 1)); fi
    echo "$mark $2${3:+  $3}${CHECK_START:+  [$(( $(date +%s) - CHECK_START ))s]}"
}
CLEAN_ENV="env -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_LOCALID -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE
    -u OMPI_COMM_WORLD_LOCAL_RANK -u PMI_RANK -u PMI_SIZE -u RANK -u WORLD_SIZE -u LOCAL_RANK"
steps_table() {
    sed -n 's/^{"step": \([0-9]*\), "loss": \([^,]*\), "lr": \([^,]*\), "norm": \([^,]*\),.*/\1 \2 \3 \4/p' "$1" |
        awk -v n="${2:-$STEPS}" '{ last[$1] = $0 } END { for (s = 1; s <= n; s++) print (s in last ? last[s] : s " missing") }'
}
same_steps() { diff <(steps_table "$1") <(steps_table "$2") > /dev/null; }
hb_step() { local word="" step="" rest=""; { read -r word step rest < "$1"; } 2>/dev/null; [[ "$step" =~ ^[0-9]+$ ]] && echo "$step"; }
wait_hb() { local i; for ((i = 0; i < 1200; i++)); do [ "$(hb_step "$1")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.05; done; return 1; }
startup_split() {
    local total other
    total=$(sed -n 's/^start-up: \([0-9]*\) ms .*/\1/p' <<< "$1")
    other=$(sed -n 's/.*, other \(-*[0-9]*\) ms.*/\1/p' <<< "$1")
    echo "${other:-?} of ${total:-?} ms"
    grep -q ", $2 [0-9]* ms," <<< "$1" && [ -n "$total" ] && [ -n "$other" ] &&
        [ "$other" -le $(( total / 10 > 20 ? total / 10 : 20 )) ]
}
wait_count() { local i; for ((i = 0; i < 1200; i++)); do [ "$(grep -c -- "$2" "$1" 2>/dev/null)" -ge "$3" ] && return 0; sleep 0.05; done; return 1; }
# cuda_mutant_build OUT FILE MUTATED [FLAGS...]: the CUDA trainer built on the CPU execution layer as OUT
# with FILE (train_gpt.cu, or a header it includes: gptc/cuda/NAME.cuh) replaced by the file MUTATED; 0 when
# it built (OUT.build says why not). Sources go to OUT.d/, translated: train_gpt.cu there finds the headers
# beside it (OUT.d/gptc/cuda/, .cpu/'s copies but the mutated one) before any -I path. Needs make train_gpt_cu_cpu.
cuda_mutant_build() {
    local out=$1 file=$2 mutated=$3 py=${PY:-/usr/bin/python3} src=train_gpt.cu
    shift 3
    [ "$file" = train_gpt.cu ] && src=$mutated
    { rm -rf "$out.d" && mkdir -p "$out.d/gptc/cuda" && cp .cpu/gptc/cuda/*.cuh "$out.d/gptc/cuda/" &&
        $py dev/cuda/cpu/translate.py "$src" "$out.d/train_gpt.cu" &&
        { [ "$file" = train_gpt.cu ] || $py dev/cuda/cpu/translate.py "$mutated" "$out.d/$file"; } &&
        g++ $(make -s --no-print-directory print-cpu-app-flags) "$@" -c -o "$out.o" "$out.d/train_gpt.cu" &&
        g++ -o "$out" "$out.o" $(make -s --no-print-directory print-cpu-layer) $(make -s --no-print-directory print-cpu-app-libs)
    } > "$out.build" 2>&1
}
