#!/bin/bash
# scripts/tests/test_portable.sh — the CPU programs built the ways learners build them: gcc and clang, each with
# and without OpenMP, each in its own copy of the tracked tree. Each build of train_gpt, prepare_data,
# prepare_eval and test_gpt must be free of warnings, and each test_gpt must pass the same checks as the others
# (--only inputs: every input file's reader; --only hf: Hugging Face files), on one thread where OpenMP is off.
#   scripts/tests/test_portable.sh          (make test-portable: the four builds, about 2 minutes on 2 cores)
#   scripts/tests/test_portable.sh --quick  (make test: clang with OpenMP and gcc without, the two furthest from
#                                            the default gcc build that make test builds anyway; about 1 minute)
set -u
quick=$([ "${1:-}" = --quick ] && echo 1 || echo 0)
cd "$(dirname "$0")/../.."
passed=0 failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
tmp=$(mktemp -d /tmp/gptc_portable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
counts=""
for cc in gcc clang; do
    if ! command -v $cc > /dev/null; then bad "$cc: not installed (scripts/install_deps.sh installs it)"; continue; fi
    for omp in on off; do
        [ $quick = 1 ] && [ "$cc-$omp" != clang-on ] && [ "$cc-$omp" != gcc-off ] && continue
        name="$cc, OpenMP $omp"
        dir="$tmp/$cc-$omp"
        mkdir -p "$dir"
        git ls-files -z | grep -zv '^shared/' | xargs -0 cp --parents -t "$dir" 2>/dev/null
        flag=$([ $omp = off ] && echo "OPENMP=")
        if ! (cd "$dir" && nice make -j2 CC=$cc $flag train_gpt prepare_data prepare_eval test_gpt > build.log 2>&1); then
            tail -n 20 "$dir/build.log"; bad "$name: the build fails"; continue
        fi
        warnings=$(grep -c -i "warning" "$dir/build.log")
        [ "$warnings" -eq 0 ] && ok "$name: train_gpt, prepare_data, prepare_eval, test_gpt build without a warning" ||
            { grep -i warning "$dir/build.log" | head -5; bad "$name: $warnings warning line(s) in the build"; }
        threads=$( (cd "$dir" && ./test_gpt --only inputs > inputs.log 2>&1; echo $? > inputs.rc; head -1 inputs.log) )
        [ $omp = off ] && { grep -q "^threads: 1;" <<< "$threads" && ok "$name: one thread" || bad "$name: $threads"; }
        for group in inputs hf; do
            [ $group = hf ] && (cd "$dir" && ./test_gpt --only hf > hf.log 2>&1; echo $? > hf.rc)
            last=$(tail -1 "$dir/$group.log")
            if [ "$(cat "$dir/$group.rc")" = 0 ] && [[ "$last" =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
                ok "$name: test_gpt --only $group: $last"
            else grep '^FAIL' "$dir/$group.log" | head -5; bad "$name: test_gpt --only $group: $last"; fi
            counts+="$group:${last%% *} "
        done
    done
done
# every build ran the same checks
distinct=$(tr ' ' '\n' <<< "$counts" | grep . | sort -u | cut -d: -f1 | uniq -d | wc -l)
[ "$distinct" -eq 0 ] && ok "every build ran the same number of checks ($counts)" || bad "the builds ran different checks: $counts"
echo "aarch64 and macOS are not built here (docs/training.md says how)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
