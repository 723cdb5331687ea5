#!/usr/bin/env bash
# scripts/test_gpu_host.sh — what of gpu_train's shape can be checked
# without a GPU; make check-cuda runs it.
#
#   scripts/test_gpu_host.sh
#
# Checked:
#   - gpu_train (train_gpt.cu) has one way out: every return in it comes
#     after gpu_train_free, which unpins the host arrays (gpu_snapshots_free);
#     the steps function it wraps has no other caller. (An early return that
#     skipped the cleanup left the host arrays cudaHostRegister'ed when
#     gptc_run freed them.)
# The last line is "gpu-host: N passed, N failed"; exit status 1 on a failure.
set -u
cd "$(dirname "$0")/.."
passed=0
failed=0
check() { # check 0|1 what [detail]
    if [ "$1" = 1 ]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2${3:+: $3}"; fi
}

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
check "$([ -n "$train" ] && [ -n "$returns" ] && [ -z "$early" ] && echo 1)" \
    "every return of gpu_train comes after its cleanup (gpu_train_free)" "returns before it:$early"
check "$(body '^static void gpu_train_free\(' | grep -q 'gpu_snapshots_free(' && echo 1)" \
    "gpu_train_free unpins the host arrays (gpu_snapshots_free)"
callers=$(grep -n 'gpu_train_steps(' train_gpt.cu | grep -v '^[0-9]*:static int gpu_train_steps(' |
    grep -v '^[0-9]*: *\*\|/\*' | wc -l)
check "$([ "$callers" -eq 1 ] && echo 1)" "gpu_train_steps is called from gpu_train only" "$callers calls"

echo "gpu-host: $passed passed, $failed failed"
[ $failed -eq 0 ]
