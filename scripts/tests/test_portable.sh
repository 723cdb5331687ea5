#!/bin/bash
# scripts/tests/test_portable.sh — the CPU programs built the ways learners build them: gcc and clang, each with
# and without OpenMP, and for aarch64 (Debian's cross gcc, run under qemu-user), each in its own copy of the
# tracked tree. Each build of train_gpt, prepare_data, prepare_eval and test_gpt must be free of warnings, and
# each test_gpt must pass the same checks as the others (--only inputs: every input file's reader; --only hf:
# Hugging Face files), on one thread where OpenMP is off. Each GEMM tile (AVX-512, AVX2+FMA, generic, NEON)
# passes dev/cpu/bench_gemm's correctness and thread-count determinism tests.
#   scripts/tests/test_portable.sh          (make test-portable: every build, the full GEMM tests, about 4 minutes)
#   scripts/tests/test_portable.sh --quick  (make test: clang with OpenMP, gcc without, aarch64, and the GEMM
#                                            tests on fewer sizes; about 2 minutes)
set -u
quick=$([ "${1:-}" = --quick ] && echo 1 || echo 0)
cd "$(dirname "$0")/../.."
passed=0 failed=0
ok() { echo "ok   $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
tmp=$(mktemp -d /tmp/gptc_portable.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
counts=""
# group_result NAME DIR GROUP: test_gpt --only GROUP's exit status ($DIR/GROUP.rc) and last line ($DIR/GROUP.log)
# passed with no failure; its count goes into $counts
group_result() {
    local last
    last=$(tail -1 "$2/$3.log")
    if [ "$(cat "$2/$3.rc")" = 0 ] && [[ "$last" =~ ^[0-9]+\ passed,\ 0\ failed$ ]]; then
        ok "$1: test_gpt --only $3: $last"
    else grep '^FAIL' "$2/$3.log" | head -5; bad "$1: test_gpt --only $3: $last"; fi
    counts+="$3:${last%% *} "
}
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
            group_result "$name" "$dir" $group
        done
    done
done
# aarch64: the cross compiler's build, its test_gpt and train_gpt run by qemu-user (train_gpt, which test_gpt
# starts as ./train_gpt, becomes a two-line script that hands it to qemu)
if ! command -v aarch64-linux-gnu-gcc > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
    bad "aarch64: gcc-aarch64-linux-gnu or qemu-user not installed (scripts/install_deps.sh installs them)"
else
    name="aarch64 (gcc cross, qemu-user)"
    dir="$tmp/aarch64"
    mkdir -p "$dir"
    git ls-files -z | grep -zv '^shared/' | xargs -0 cp --parents -t "$dir" 2>/dev/null
    export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
    if ! (cd "$dir" && nice make -j2 CC=aarch64-linux-gnu-gcc MARCH=-march=armv8-a train_gpt prepare_data prepare_eval \
            test_gpt > build.log 2>&1); then
        tail -n 20 "$dir/build.log"; bad "$name: the build fails"
    else
        warnings=$(grep -c -i "warning" "$dir/build.log")
        [ "$warnings" -eq 0 ] && ok "$name: train_gpt, prepare_data, prepare_eval, test_gpt build without a warning" ||
            { grep -i warning "$dir/build.log" | head -5; bad "$name: $warnings warning line(s) in the build"; }
        machine=$(od -An -tx1 -j18 -N2 "$dir/train_gpt" | tr -d ' ') # ELF e_machine: b7 00 is EM_AARCH64
        [ "$machine" = b700 ] && ok "$name: train_gpt is an aarch64 ELF" || bad "$name: train_gpt's ELF machine is $machine, not b700"
        mv "$dir/train_gpt" "$dir/train_gpt.aarch64"
        printf '#!/bin/sh\nexec qemu-aarch64 "$(dirname "$0")/train_gpt.aarch64" "$@"\n' > "$dir/train_gpt"
        chmod +x "$dir/train_gpt"
        for group in inputs hf; do
            (cd "$dir" && qemu-aarch64 ./test_gpt --only $group > $group.log 2>&1; echo $? > $group.rc)
            group_result "$name" "$dir" $group
        done
        # the whole of test_gpt (make test-portable only: about 2 minutes under qemu): the count the native one gives
        if [ $quick = 0 ] && make -s tokenizer test_gpt .hooks/train_gpt train_gpt > /dev/null 2>&1 &&
           (cd "$dir" && nice make -j2 CC=aarch64-linux-gnu-gcc MARCH=-march=armv8-a .hooks/train_gpt > hooks.log 2>&1); then
            mkdir -p "$dir/data" && cp -r data/tokenizer "$dir/data/"
            mv "$dir/.hooks/train_gpt" "$dir/.hooks/train_gpt.aarch64"
            printf '#!/bin/sh\nexec qemu-aarch64 "$(dirname "$0")/train_gpt.aarch64" "$@"\n' > "$dir/.hooks/train_gpt"
            chmod +x "$dir/.hooks/train_gpt"
            native=$(./test_gpt 2>&1 | tail -1)
            emulated=$(cd "$dir" && qemu-aarch64 ./test_gpt 2>&1 | tail -1)
            [ "$native" = "$emulated" ] && [[ "$native" =~ ^[0-9]+\ passed,\ 0\ failed$ ]] &&
                ok "$name: the whole of test_gpt: $emulated, as native" || bad "$name: test_gpt: $emulated; native: $native"
        elif [ $quick = 0 ]; then bad "$name: the tokenizer, the native test_gpt or the aarch64 .hooks/train_gpt do not build"; fi
    fi
fi
# every build ran the same checks
distinct=$(tr ' ' '\n' <<< "$counts" | grep . | sort -u | cut -d: -f1 | uniq -d | wc -l)
[ "$distinct" -eq 0 ] && ok "every build ran the same number of checks ($counts)" || bad "the builds ran different checks: $counts"
# each GEMM tile, chosen by the target: dev/cpu/bench_gemm's tests (correctness against a double reference over
# sizes x strides x flags, a planted error caught, bitwise the same on 1 and 2 threads)
mode=$([ $quick = 1 ] && echo test-quick || echo test)
for target in native x86-64-v3 x86-64 aarch64; do
    bin="$tmp/bench_gemm_$target"
    if [ $target = aarch64 ]; then
        command -v aarch64-linux-gnu-gcc > /dev/null || continue
        build="aarch64-linux-gnu-gcc -march=armv8-a"; run="qemu-aarch64 $bin"
    else build="gcc -march=$target"; run="$bin"; fi
    if ! $build -std=c11 -O3 -fopenmp -Wall -Wextra -Werror -Wno-unused-function -I. -DNO_OPENBLAS dev/cpu/bench_gemm.c \
            -o "$bin" -lm > "$bin.log" 2>&1; then
        cat "$bin.log"; bad "bench_gemm for $target: the build fails"; continue
    fi
    $run $mode > "$bin.out" 2>&1
    rc=$?
    tile=$(head -1 "$bin.out" | sed 's/^gemm: //; s/ KC=.*//')
    last=$(tail -1 "$bin.out")
    [ $rc = 0 ] && [[ "$last" =~ ^[0-9]+\ passed,\ 0\ failed$ ]] && ok "GEMM tile for $target ($tile): bench_gemm $mode: $last" ||
        { grep '^FAIL' "$bin.out" | head -5; bad "GEMM tile for $target ($tile): bench_gemm $mode: $last"; }
done
echo "macOS is not built here (docs/training.md says how)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
