#!/usr/bin/env bash
# scripts/tests/test_gpu_host.sh — what of the GPU check scripts and of gpu_train's
# shape can be checked without a GPU; make check-cuda runs it.
#
#   scripts/tests/test_gpu_host.sh
#
# Checked:
#   - gpu_check.sh's plan (--plan N, the step list gpu_check_main runs): with
#     one GPU and NCCL in the build it runs scripts/gpu_check_dp.sh, the
#     NCCL/ZeRO code as one rank (--zero 1/2 against --zero 0); with two, its
#     multi-GPU checks too; without NCCL, or without a GPU, it skips them and
#     says why;
#   - gpu_check.sh's summary printer prints each line as data: a line with
#     % (every MFU figure), a printf directive or a backslash comes out as it
#     went in; neither GPU script hands a variable to printf as its format;
#   - gpu_train (train_gpt.cu) has one way out: every return in it comes
#     after gpu_train_free, which unpins the host arrays (gpu_snapshots_free);
#     the steps function it wraps has no other caller. (An early return that
#     skipped the cleanup left the host arrays cudaHostRegister'ed when
#     gptc_run freed them.)
# The last line is "gpu-host: N passed, N failed"; exit status 1 on a failure.
set -u
cd "$(dirname "$0")/../.."
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters

# ---- gpu_check.sh's plan ----------------------------------------------------
plan1=$(scripts/gpu_check.sh --plan 1 2>&1)
echo "$plan1"
check "$(echo "$plan1" | grep -q '^[0-9]*\. data parallel, one GPU: scripts/gpu_check_dp.sh' && echo ok)" \
    "gpu_check.sh with one GPU runs gpu_check_dp.sh (the NCCL/ZeRO code as one rank)"
check "$(echo "$plan1" | grep -c 'gpu_check_dp.sh' | grep -qx 1 && echo ok)" "... once"
plan2=$(scripts/gpu_check.sh --plan 2 2>&1)
check "$(echo "$plan2" | grep -q '^[0-9]*\. data parallel, 2+ GPUs: scripts/gpu_check_dp.sh' && echo ok)" \
    "gpu_check.sh with two GPUs runs gpu_check_dp.sh's multi-GPU checks" "$(echo "$plan2" | tail -n 1)"
plan1n=$(scripts/gpu_check.sh --plan 1 no-nccl 2>&1)
check "$(echo "$plan1n" | grep -q 'data parallel: SKIPPED, this build has no NCCL' &&
    ! echo "$plan1n" | grep -q 'gpu_check_dp.sh' && echo ok)" \
    "gpu_check.sh with a build without NCCL skips the data-parallel checks, saying why" "$(echo "$plan1n" | tail -n 1)"
plan0=$(scripts/gpu_check.sh --plan 0 2>&1)
check "$(echo "$plan0" | grep -q 'data parallel: SKIPPED, no GPU' && echo ok)" "... and so without a GPU" \
    "$(echo "$plan0" | tail -n 1)"
check "$(echo "$plan1" | grep -c '^[0-9]*\. ' | grep -qx 10 && ! echo "$plan1" | grep -q 'unknown step' && echo ok)" \
    "every planned step has a description (10 steps)"

# ---- gpu_check.sh's summary: data as data ------------------------------------
lines=('train_gpt_cu: GPT-2 124M B=16 T=1024: 412000 tok/s, MFU 41.3% (median; 301s)'
       '  2 GPUs --zero 1: 800000 tok/s = 1.94x one GPU (97% efficiency); 3.1 ms exposed'
       'a %s and a %d and 100%% and a back\slash \n stay')
want=$(printf '%s\n' "${lines[@]}")
got=$(
    # shellcheck source=gpu_check.sh
    source scripts/gpu_check.sh
    for l in "${lines[@]}"; do note "$l" > /dev/null; done
    summary_print
)
check "$([ "$got" = "$want" ] && echo ok)" "gpu_check.sh's summary prints lines with %, %s, %% and a backslash as they are" \
    "$(printf 'got:\n%s\nwant:\n%s' "$got" "$want")"
formats=$(grep -nE "printf +(\"\\$|'%b'|\\$)" scripts/gpu_check.sh scripts/gpu_check_dp.sh)
check "$([ -z "$formats" ] && echo ok)" "no variable is printf's format in gpu_check.sh or gpu_check_dp.sh" "$formats"

# ---- gpu_train has one way out ------------------------------------------------
# body LINE: the lines of a top-level function of train_gpt.cu, from its opening line (a regex) to its closing brace
body() { awk -v start="$1" '$0 ~ start { on = 1 } on { print NR ": " $0 } on && /^}/ { exit }' train_gpt.cu; }
train=$(body '^static int gpu_train\(')
returns=$(echo "$train" | grep -E '(^|[^A-Za-z_])return([^A-Za-z_]|$)')
first_free=$(echo "$train" | grep -m 1 'gpu_train_free(' | cut -d: -f1)
early=""
while IFS= read -r r; do
    [ -n "$r" ] || continue
    n=${r%%:*}
    if [ -z "$first_free" ] || [ "$n" -lt "$first_free" ]; then early="$early train_gpt.cu:$r;"; fi
done <<< "$returns"
check "$([ -n "$train" ] && [ -n "$returns" ] && [ -z "$early" ] && echo ok)" \
    "every return of gpu_train comes after its cleanup (gpu_train_free)" "returns before it:$early"
check "$(body '^static void gpu_train_free\(' | grep -q 'gpu_snapshots_free(' && echo ok)" \
    "gpu_train_free unpins the host arrays (gpu_snapshots_free)"
callers=$(grep -n 'gpu_train_steps(' train_gpt.cu | grep -v '^[0-9]*:static int gpu_train_steps(' |
    grep -v '^[0-9]*: *\*\|/\*' | wc -l)
check "$([ "$callers" -eq 1 ] && echo ok)" "gpu_train_steps is called from gpu_train only" "$callers calls"

echo "gpu-host: $passed passed, $failed failed"
[ $failed -eq 0 ]
