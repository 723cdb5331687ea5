#!/usr/bin/env bash
# scripts/tests/test_nccl_find.sh — the Makefile's NCCL search
# on fake layouts in a temporary folder, and the build without NCCL. Needs
# nvcc, no GPU; make check-cuda runs it.
#
#   scripts/tests/test_nccl_find.sh
#
# Layouts (each case points every place the search looks, NCCL_HOME,
# CUDA_HOME, NCCL_SYSTEM_PREFIXES and python's sys.path, at fake ones only):
#   pip      site-packages/nvidia/nccl/include/nccl.h and lib/libnccl.so.2, no
#            libnccl.so: PyTorch's nvidia-nccl-cu13 wheel; symlinks to this
#            machine's real header and library (make nccl-info finds them)
#   toolkit  include/nccl.h, lib64/libnccl.so and libnccl.so.2 (a CUDA
#            toolkit, apt's libnccl-dev, an NCCL_HOME)
#   headless lib/libnccl.so.2 without include/nccl.h
#   empty    nothing
# Checked:
#   - pip, found through python's sys.path: libnccl.so.2 by its full path
#     and an rpath; train_gpt.cu linked so (make's own recipe) loads that
#     very file at run time without LD_LIBRARY_PATH (--help needs no GPU);
#   - toolkit: -L DIR -lnccl; the order NCCL_HOME, CUDA_HOME, system, pip;
#   - a library without its header does not count;
#   - nothing found: -DGPTC_NO_NCCL and make says "NCCL not found" for a
#     CUDA goal; train_gpt.cu builds so (-Werror all-warnings) and the binary
#     refuses --init, --zero 1 and a launcher's two ranks, saying why, before
#     it looks for a GPU.
# The last line is "nccl-find: N passed, N failed"; exit status 1 on a failure.
set -u
cd "$(dirname "$0")/../.."
MAKE=${MAKE:-make}
PY=${NCCL_TEST_PYTHON:-python3}
. scripts/tests/check.sh # check ok|FAIL what [detail], and the $passed and $failed counters
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# What the search finds, with everything pointed at the given places:
# info PYTHONPATH NCCL_HOME CUDA_HOME SYSTEM_PREFIXES [make goal and flags...]
# ("python3 -S": sys.path is the standard library and PYTHONPATH, not this machine's site-packages.)
info() {
    local pp=$1 home=$2 cuda=$3 sys=$4
    shift 4
    PYTHONPATH=$pp $MAKE -s --no-print-directory NCCL_HOME="$home" CUDA_HOME="$cuda" NCCL_SYSTEM_PREFIXES="$sys" \
        NCCL_PYTHON="$PY -S" "${@:-nccl-info}"
}
field() { grep "^$1=" | head -n 1 | cut -d= -f2-; } # field NAME < nccl-info output

# this machine's NCCL, as the default search finds it
real=$($MAKE -s --no-print-directory nccl-info)
real_lib=$(echo "$real" | field NCCL_LIB)
real_prefix=$(echo "$real" | field NCCL_PREFIX)
if [ -n "$real_lib" ]; then
    real_so2=$(readlink -f "$(dirname "$real_lib")/libnccl.so.2")
    real_h=$real_prefix/include/nccl.h
    echo "this machine's NCCL: $real_so2, $real_h"
else
    echo "this machine has no NCCL: the layouts get empty files, the link and run checks are SKIPPED"
    real_so2=$tmp/fake_libnccl.so.2
    real_h=$tmp/fake_nccl.h
    : > "$real_so2"
    : > "$real_h"
fi

E=$tmp/empty
SITE=$tmp/pip/site-packages
PIP=$SITE/nvidia/nccl
TK=$tmp/toolkit
HL=$tmp/headless
mkdir -p "$E" "$PIP/include" "$PIP/lib" "$TK/include" "$TK/lib64" "$HL/lib"
ln -s "$real_h" "$PIP/include/nccl.h"
ln -s "$real_so2" "$PIP/lib/libnccl.so.2"
ln -s "$real_h" "$TK/include/nccl.h"
ln -s "$real_so2" "$TK/lib64/libnccl.so.2"
ln -s libnccl.so.2 "$TK/lib64/libnccl.so"
ln -s "$real_so2" "$HL/lib/libnccl.so.2"

# ---- pip: through sys.path, full path to libnccl.so.2, rpath ----------------
out=$(info "$SITE" "" "$E" "$E")
lib=$(echo "$out" | field NCCL_LIB)
ldlibs=$(echo "$out" | field NCCL_LDLIBS)
check "$([ "$lib" = "$PIP/lib/libnccl.so.2" ] && echo ok)" "pip layout found through python's sys.path" "NCCL_LIB=$lib"
check "$([ "$ldlibs" = "-Xlinker $PIP/lib/libnccl.so.2 -Xlinker -rpath=$PIP/lib" ] && echo ok)" \
    "pip layout: libnccl.so.2 by its full path, with an rpath (no -lnccl: there is no libnccl.so)" "NCCL_LDLIBS=$ldlibs"
check "$([ "$(echo "$out" | field NCCL_CUFLAGS)" = "-I$PIP/include" ] && echo ok)" "pip layout: -I its include/" \
    "$(echo "$out" | field NCCL_CUFLAGS)"

# ---- toolkit: -lnccl; the order of the places ------------------------------
out=$(info "$E" "" "$TK" "$E")
check "$([ "$(echo "$out" | field NCCL_LDLIBS)" = "-L$TK/lib64 -lnccl -Xlinker -rpath=$TK/lib64" ] && echo ok)" \
    "a CUDA_HOME with libnccl.so: -L DIR -lnccl and an rpath" "$(echo "$out" | field NCCL_LDLIBS)"
check "$([ "$(info "$SITE" "" "$TK" "$E" | field NCCL_PREFIX)" = "$TK" ] && echo ok)" "CUDA_HOME before pip"
check "$([ "$(info "$SITE" "" "$E" "$TK" | field NCCL_PREFIX)" = "$TK" ] && echo ok)" "system prefixes before pip"
check "$([ "$(info "$E" "$PIP" "$TK" "$E" | field NCCL_PREFIX)" = "$PIP" ] && echo ok)" "NCCL_HOME before CUDA_HOME"
check "$([ "$(info "$SITE" "" "$HL" "$E" | field NCCL_PREFIX)" = "$PIP" ] && echo ok)" \
    "a prefix with libnccl.so.2 but no nccl.h is passed over"

# ---- nothing: -DGPTC_NO_NCCL, said aloud ------------------------------------
out=$(info "$E" "" "$E" "$E")
check "$([ -z "$(echo "$out" | field NCCL_LIB)" ] && [ "$(echo "$out" | field NCCL_CUFLAGS)" = "-DGPTC_NO_NCCL" ] &&
    [ -z "$(echo "$out" | field NCCL_LDLIBS)" ] && echo ok)" "nothing found: -DGPTC_NO_NCCL, no NCCL library" "$out"
said=$(info "$E" "" "$E" "$E" -n -B train_gpt_cu 2>&1)
check "$(echo "$said" | grep -q '^NCCL not found' && echo ok)" "make train_gpt_cu says \"NCCL not found\" aloud" \
    "$(echo "$said" | head -n 1)"

# make's own train_gpt_cu recipe for a layout, written to another file:
# build_as LAYOUT_ARGS(4) OUTPUT [extra nvcc flags]
build_as() {
    local cmd
    cmd=$(info "$1" "$2" "$3" "$4" -n -B train_gpt_cu 2>/dev/null | grep -E '(^|/)nvcc ' | head -n 1)
    [ -n "$cmd" ] || { echo "no nvcc command in make -n train_gpt_cu"; return 1; }
    cmd=${cmd/ -o train_gpt_cu / -o $5 }
    echo "$cmd ${*:6}"
    eval "nice $cmd ${*:6}"
}
if build_as "$E" "" "$E" "$E" "$tmp/train_gpt_cu_nonccl" -Werror all-warnings > "$tmp/build_nonccl.log" 2>&1; then
    check ok "train_gpt.cu builds without NCCL, warning-free (-DGPTC_NO_NCCL, -Werror all-warnings)"
    b=$tmp/train_gpt_cu_nonccl
    check "$(! ldd "$b" | grep -q nccl && echo ok)" "the no-NCCL binary does not link libnccl"
    for args in "--init tcp:127.0.0.1:29555" "--zero 1"; do
        msg=$(env -u RANK -u WORLD_SIZE "$b" $args 2>&1)
        rc=$?
        check "$([ $rc -ne 0 ] && echo "$msg" | grep -q 'this build has no NCCL' && echo ok)" \
            "the no-NCCL binary refuses $args, saying why (rc=$rc)" "$msg"
    done
    msg=$(RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 "$b" 2>&1)
    rc=$?
    check "$([ $rc -ne 0 ] && echo "$msg" | grep -q 'several ranks, which need NCCL' && echo ok)" \
        "the no-NCCL binary refuses a launcher's rank 1 of 2 (rc=$rc)" "$msg"
else
    cat "$tmp/build_nonccl.log"
    check FAIL "train_gpt.cu builds without NCCL, warning-free"
fi

# ---- pip: a real link and load ----------------------------------------------
if [ -n "$real_lib" ]; then
    if build_as "$SITE" "" "$E" "$E" "$tmp/train_gpt_cu_pip" > "$tmp/build_pip.log" 2>&1; then
        check ok "train_gpt.cu links against the pip layout (make's recipe)"
        loaded=$(env -u LD_LIBRARY_PATH ldd "$tmp/train_gpt_cu_pip" | grep 'libnccl' | awk '{print $3}')
        check "$([ "$loaded" = "$PIP/lib/libnccl.so.2" ] && echo ok)" \
            "at run time the loader takes the pip layout's libnccl.so.2 (rpath, no LD_LIBRARY_PATH)" "ldd: $loaded"
        env -u LD_LIBRARY_PATH "$tmp/train_gpt_cu_pip" --help > "$tmp/help.txt" 2>&1
        rc=$?
        check "$([ $rc -eq 0 ] && grep -q -- '--zero' "$tmp/help.txt" && echo ok)" \
            "the pip-linked binary starts (--help, rc=$rc)" "$(tail -n 2 "$tmp/help.txt")"
    else
        cat "$tmp/build_pip.log"
        check FAIL "train_gpt.cu links against the pip layout"
    fi
else
    echo "SKIPPED: the link and load against the pip layout (no NCCL on this machine)"
fi

echo "nccl-find: $passed passed, $failed failed"
[ $failed -eq 0 ]
