#!/bin/bash
# dev/cuda/cpu/mutants.sh — does the CPU execution layer catch the bugs a
# first GPU run would hit in *our* code? Each mutant plants one such bug in a
# copy of the twin's sources (train_gpt.cu and gptc/cuda/*.cuh, never the
# checkout's: the sed runs over every copy, and the one that holds the line
# changes), builds it through the layer, runs a 2-step training, and must be
# caught: a cuda_cpu report, a CUDA error, or losses that differ from the
# unmutated run's.
#
#   make test-cuda-mutants       (about 20 s per mutant on 2 cores; not in make test)
#
# The last line is "mutants: N caught, N missed"; exit status non-zero if any is missed.
set -u
cd "$(dirname "$0")/../../.."
WORK=$(mktemp -d /tmp/gptc_mutants.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FLAGS=$(make -s --no-print-directory print-cpu-app-flags)
LIBS=$(make -s --no-print-directory print-cpu-app-libs)
LAYER=$(make -s --no-print-directory print-cpu-layer)
TOY=$WORK/toy.bin
/usr/bin/python3 scripts/toy_shard.py "$TOY" 100000 256 0 > /dev/null || exit 1
# awkward sizes (C=48: 72000 parameters; B*T=240), so that no size is a multiple of a block
RUN="--model d2 --channels 48 --num-heads 2 --max-seq-len 64 --vocab-size 256 --train-data $TOY --seq-len 60
     --batch-size 4 --total-batch-size 480 --steps 2 --val-every 0 --sample-every 0"

# The twin's sources: train_gpt.cu and the headers it includes from gptc/cuda.
SOURCES="train_gpt.cu $(ls gptc/cuda/*.cuh 2>/dev/null | tr '\n' ' ')"
# translate NAME FILE...: each FILE of $WORK/NAME.src (a copy of the sources) into $WORK/NAME.t, same paths
translate() {
    local name=$1 f
    shift
    for f in "$@"; do
        mkdir -p "$(dirname "$WORK/$name.t/$f")" &&
            /usr/bin/python3 dev/cuda/cpu/translate.py "$WORK/$name.src/$f" "$WORK/$name.t/$f" || return 1
    done
}
# build NAME: $WORK/NAME.t (the translated sources) -> $WORK/NAME; -I$WORK/NAME.t first, so that
# gptc/cuda's headers are the copy's (train_gpt.c and the rest come from the checkout)
build() {
    g++ -I"$WORK/$1.t" $FLAGS -c -o "$WORK/$1.o" "$WORK/$1.t/train_gpt.cu" && g++ -o "$WORK/$1" "$WORK/$1.o" $LAYER $LIBS
}
# losses NAME FLAGS...: the step lines' losses (the run's output in $WORK/NAME.log)
losses() {
    local name=$1
    shift
    timeout 300 "$WORK/$name" $RUN "$@" > "$WORK/$name.log" 2>&1
    echo "rc=$?" >> "$WORK/$name.log"
    grep -o 'loss [0-9.]*' "$WORK/$name.log" | tr '\n' ' '
}

mkdir -p "$WORK/base.src/gptc/cuda"
for f in $SOURCES; do cp "$f" "$WORK/base.src/$f"; done
if ! { translate base $SOURCES && build base; } > "$WORK/base.build" 2>&1; then
    echo "mutants: the unmutated sources do not build:"
    tail -n 20 "$WORK/base.build"
    exit 1
fi
declare -A want
for z in 0 2; do
    want[$z]=$(losses base --zero $z)
    grep -q '^rc=0$' "$WORK/base.log" || { echo "mutants: the unmutated run fails (--zero $z):"; tail -n 20 "$WORK/base.log"; exit 1; }
done

caught=0
missed=0
# mutant NAME ZERO 'sed expression' 'what it plants'
mutant() {
    local name=$1 zero=$2 expr=$3 what=$4 f changed=""
    cp -r "$WORK/base.src" "$WORK/$name.src" && cp -r "$WORK/base.t" "$WORK/$name.t" || exit 1
    for f in $SOURCES; do
        sed "$expr" "$f" > "$WORK/$name.src/$f"
        cmp -s "$f" "$WORK/$name.src/$f" || changed="$changed $f"
    done
    if [ -z "$changed" ]; then
        echo "MISSED $name: the sed expression changed nothing (the sources moved on: update mutants.sh)"
        missed=$((missed + 1))
        return
    fi
    if ! { translate "$name" $changed && build "$name"; } > "$WORK/$name.build" 2>&1; then
        echo "MISSED $name: does not build"
        tail -n 5 "$WORK/$name.build"
        missed=$((missed + 1))
        return
    fi
    local got how=""
    got=$(losses "$name" --zero "$zero")
    if grep -q '^cuda_cpu: ' "$WORK/$name.log"; then how="reported: $(grep -m 1 '^cuda_cpu: ' "$WORK/$name.log" | cut -c11-150)"
    elif ! grep -q '^rc=0$' "$WORK/$name.log"; then how="failed: $(grep -m 1 -i 'error' "$WORK/$name.log" | cut -c1-140)"
    elif [ "$got" != "${want[$zero]}" ]; then how="losses differ: $got"
    fi
    if [ -n "$how" ]; then
        echo "caught $name ($what): $how"
        caught=$((caught + 1))
    else
        echo "MISSED $name ($what): ran clean with the right losses"
        missed=$((missed + 1))
    fi
}

mutant no_barrier_block_sum 0 's|^    __syncthreads(); /\* every warp.s partial is written \*/|    /* mutant */|' \
    "block_sum reads the warps' partials without waiting until they are written"
mutant no_barrier_column_sums 0 's|^    __syncthreads(); /\* all 8 row-lanes. sums are in shared memory \*/|    /* mutant */|' \
    "the bias-gradient column sums add up shared partials before all are written"
mutant no_barrier_classifier 0 's|^    __syncthreads(); /\* every warp.s (m, s) is in shared memory; every thread has read x\[target\] \*/|    /* mutant */|' \
    "the classifier (the 16-byte production kernel) reads the warps' (m, s) before they are written"
mutant off_by_one_float_to_bf16 0 's|^    if (i < n) out\[i\] = __float2bfloat16_rn(in\[i\]);|    if (i <= n) out[i] = __float2bfloat16_rn(in[i]);|' \
    "float_to_bf16_kernel writes one element past the end"
mutant grid_too_small 0 's|^    encoder_forward_kernel<<<ceil_div(n, 256), 256, 0, s>>>|    encoder_forward_kernel<<<n / 256, 256, 0, s>>>|' \
    "the encoder's grid rounds down: the last positions are never written"
mutant flash_no_cp_async_wait 0 's|^        cp_async_wait<0>();|        /* mutant */|' \
    "flash attention's kernels read their tiles without waiting for the cp.async copies"
mutant flash_ldmatrix_layout 0 's|^                ldsm_x4(kb, K + (n \* 8 + lane % 8 + 8 \* (lane / 16)) \* LD + kc \* 16 + 8 \* (lane / 8 % 2));|                ldsm_x4(kb, K + (n * 8 + lane % 8 + 8 * (lane / 8 % 2)) * LD + kc * 16 + 8 * (lane / 16));|' \
    "flash attention's forward loads K's B fragments with the two matrices' roles swapped (a wrong ldmatrix layout)"
mutant flash_mask_off_by_one 0 's|(key <= (e < 2 ? row0 : row1) \&\& key < T)|(key <= (e < 2 ? row0 : row1) + 1 \&\& key < T)|' \
    "flash attention's forward lets each query see the next key"
mutant flash_dkv_mask_off_by_one 0 's|float p = qi >= key \&\& qi < T ? exp2f|float p = qi + 1 >= key \&\& qi < T ? exp2f|' \
    "flash attention's dK/dV kernel lets each key see the query before it"
mutant loss_slot_ignored 0 's|^    if (threadIdx.x == 0) out\[slot\[0\]\] = acc / N;|    if (threadIdx.x == 0) out[0] = acc / N;|' \
    "every micro-batch's mean loss lands in slot 0 (the slot read from device memory, as graphs need, ignored)"
mutant chunk_count_off_by_one 0 's|^    int n = e.num_chunks\[0\];|    int n = e.num_chunks[0] + 1; /* mutant */|' \
    "the encoder backward's fixed grid works one chunk past the step's count (read from device memory, as graphs need)"
mutant no_wait_grads_ready 2 's|^    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->grads_ready, 0));|    /* mutant */|' \
    "ZeRO-2: the communication stream does not wait for the bucket's gradients"
mutant no_wait_slot_free 2 's|^    CUDA_CHECK(cudaStreamWaitEvent(s, dp->slot_free\[b == dp->L ? 2 : b % 2\], 0));|    /* mutant */|' \
    "ZeRO-2: backward refills a gradient slot without waiting until its last bucket was reduced"

echo "mutants: $caught caught, $missed missed"
[ $missed -eq 0 ]
