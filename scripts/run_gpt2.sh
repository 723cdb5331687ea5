#!/usr/bin/env bash
# run_gpt2.sh — train GPT-2 (124M, 350M, 774M or 1558M) from scratch on
# FineWeb with one machine's GPUs (scripts/launch_gpu.sh: mpirun, one rank
# per GPU, ZeRO-1).
#
#   scripts/run_gpt2.sh SIZE [more train_gpt_cu flags...]     SIZE: 124M | 350M | 774M | 1558M
#   NGPU=4 scripts/run_gpt2.sh 350M
#   DRY=1 scripts/run_gpt2.sh 1558M       # print the command only
#
# Hyperparameters: those the GPT-3 paper gives for the nearest size (Brown
# et al. 2020, Table 2.1), on GPT-2's shapes (--model dN: train_gpt.c's
# config_from_depth):
#   SIZE   --model          GPT-3 row      peak lr  tokens per step  B per GPU (80 GB)
#   124M   d12 (12x768)     125M "Small"   6.0e-4   0.5M (524288)    64
#   350M   d24 (24x1024)    350M "Medium"  3.0e-4   0.5M (524288)    32
#   774M   d36 (36x1280)    760M "Large"   2.5e-4   0.5M (524288)    16
#   1558M  d48 (48x1600)    1.3B "XL"      2.0e-4   1M   (1048576)    8
# and for all: T = 1024, linear warmup over 700 steps (GPT-3: 375M tokens),
# cosine decay to 10% of the peak, weight decay 0.1, AdamW beta2 0.95 and
# gradient clipping at 1.0 (train_gpt's defaults), --zero 1. The per-GPU
# micro-batch B is the largest power of two whose memory plan (the one
# train_gpt_cu prints) stays under ~64 GB under ZeRO-1 with 8 GPUs, leaving
# room for the CUDA context, NCCL and cuBLASLt; the rest of the batch is
# gradient accumulation (tokens per step / (B x 1024 x NGPU) micro-batches).
# Steps: TOKENS / tokens per step, TOKENS = 1e10 by default (FineWeb's 10B
# sample once; GPT-2 124M reaches val loss ~3.28 there).
# Data, once (internet needed; ~30 GB of parquet, then tokenized):
#   scripts/fetch_fineweb.sh data/fineweb 14
#   make prepare_data && ./prepare_data data/fineweb/fineweb_10BT_14.jsonl data/fineweb
# Environment: NGPU (8), B (per-GPU micro-batch), TOKENS, STEPS, ZERO (1),
# TRAIN / VAL (shard globs: data/fineweb_train_*.bin, data/fineweb_val_*.bin),
# OUT (out/gpt2_SIZE: checkpoints, log.jsonl), DRY=1.
# For several nodes use the same flags in scripts/slurm_gpu_pmix.sbatch or
# scripts/slurm_gpu_tcp.sbatch (DRY=1 prints them).
# STATUS: not run here: these machines have no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:?usage: scripts/run_gpt2.sh 124M|350M|774M|1558M [train_gpt_cu flags...]}
shift
case "$size" in
    124M)  model=d12; lr=6e-4;   total=524288;  b=64 ;;
    350M)  model=d24; lr=3e-4;   total=524288;  b=32 ;;
    774M)  model=d36; lr=2.5e-4; total=524288;  b=16 ;;
    1558M) model=d48; lr=2e-4;   total=1048576; b=8 ;;
    *) echo "run_gpt2: SIZE must be 124M, 350M, 774M or 1558M, got '$size'" >&2; exit 1 ;;
esac
T=1024
ngpu=${NGPU:-8}
b=${B:-$b}
# the tokens per step must split into micro-batches of B x T on every GPU
while [ $b -gt 1 ] && [ $(( total % (b * T * ngpu) )) -ne 0 ]; do b=$(( b / 2 )); done
if [ $(( total % (b * T * ngpu) )) -ne 0 ]; then
    echo "run_gpt2: $total tokens per step do not split over $ngpu GPUs x $T tokens: use a power of two for NGPU" >&2
    exit 1
fi
accum=$(( total / (b * T * ngpu) ))
tokens=${TOKENS:-10000000000}
steps=${STEPS:-$(awk -v t="$tokens" -v s="$total" 'BEGIN { printf "%d", t / s }')}
out=${OUT:-out/gpt2_$size}
train=${TRAIN:-data/fineweb_train_*.bin}
val=${VAL:-data/fineweb_val_*.bin}
echo "run_gpt2: GPT-2 $size (--model $model): lr $lr, $total tokens per step = $ngpu GPUs x B=$b x T=$T x $accum" \
     "micro-batch(es), $steps steps ($(awk -v s="$steps" -v t="$total" 'BEGIN { printf "%.2f", s * t / 1e9 }')B tokens)"
flags=(--model "$model" --train-data "$train" --val-data "$val" --batch-size "$b" --seq-len "$T"
       --total-batch-size "$total" --steps "$steps" --lr "$lr" --warmup-steps 700 --lr-schedule cosine
       --final-lr-frac 0.1 --weight-decay 0.1 --zero "${ZERO:-1}" --val-every 250 --val-batches 20
       --sample-every 1000 --save-every 2000 --output-dir "$out" --log-file "$out/log.jsonl" "$@")
if [ -n "${DRY:-}" ]; then
    printf 'NGPU=%s scripts/launch_gpu.sh' "$ngpu"
    printf ' %q' "${flags[@]}"
    echo
    exit 0
fi
compgen -G "$train" > /dev/null || { echo "run_gpt2: no training shards match $train: fetch and tokenize FineWeb first:
  scripts/fetch_fineweb.sh data/fineweb 14
  make prepare_data && ./prepare_data data/fineweb/fineweb_10BT_14.jsonl data/fineweb" >&2; exit 1; }
mkdir -p "$out"
NGPU=$ngpu exec scripts/launch_gpu.sh "${flags[@]}"
