#!/usr/bin/env bash
# launch_gpu.sh — data-parallel training on one machine's GPUs: one MPI rank
# per GPU (train_gpt_cu_mpi --init mpi), each with its share of the cores for
# the host-side OpenMP threads (data loading, token buckets).
#
#   scripts/launch_gpu.sh [train_gpt_cu flags...]
#   NGPU=8 scripts/launch_gpu.sh --model d12 --train-data "data/fineweb_train_*.bin" \
#       --batch-size 64 --seq-len 1024 --total-batch-size 524288 --zero 1
#   scripts/run_gpt2.sh 124M       # the GPT-2 reproductions call this
#
# NGPU: ranks (default 8, or the GPUs nvidia-smi lists when fewer). Rank r
# takes GPU r (its local rank modulo the visible GPUs). --batch-size is per
# GPU; --total-batch-size is over all of them. Builds train_gpt_cu_mpi when
# it is missing (make train_gpt_cu_mpi: nvcc + Open MPI's mpicc). Root needs
# --allow-run-as-root, added when you are root. Extra mpirun options in
# MPIRUN_ARGS (e.g. "-x NCCL_DEBUG=INFO").
# STATUS: not run here (these machines have no GPU and were never lent
# more than one); the command it runs is printed first.
set -euo pipefail
cd "$(dirname "$0")/.."
visible=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
ngpu=${NGPU:-8}
if [ "${visible:-0}" -ge 1 ] && [ "$ngpu" -gt "$visible" ]; then
    echo "launch_gpu: NGPU=$ngpu but $visible GPU(s) visible: using $visible"
    ngpu=$visible
fi
[ -x ./train_gpt_cu_mpi ] || make train_gpt_cu_mpi
cores=$(nproc)
threads=$(( cores / ngpu > 0 ? cores / ngpu : 1 ))
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
case " $* " in *" --threads "*) ;; *) set -- --threads "$threads" "$@" ;; esac
# --bind-to none: the OpenMP threads of a rank may use any core of its share
read -r -a user_args <<< "${MPIRUN_ARGS:-}"
echo "mpirun -np $ngpu ${MPIRUN_ARGS:+$MPIRUN_ARGS }./train_gpt_cu_mpi --init mpi $*"
exec mpirun "${extra[@]}" --bind-to none -np "$ngpu" -x OMP_PROC_BIND=false "${user_args[@]}" \
    ./train_gpt_cu_mpi --init mpi "$@"
