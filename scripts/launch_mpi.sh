#!/usr/bin/env bash
# launch_mpi.sh — data-parallel training on one machine: one rank per socket
# (or per group of cores), each with its share of the cores as OpenMP threads.
#
#   scripts/launch_mpi.sh NP [train_gpt flags...]
#   scripts/launch_mpi.sh 2 --data data/corpus/english.txt --model d4 --channels 192 --num-heads 4 \
#       --max-seq-len 128 --batch-size 4 --seq-len 128 --zero 1
#
# Builds train_gpt_mpi if needed. --batch-size is per rank; --threads is set
# to (cores / NP) unless given. Runs as root need --allow-run-as-root, added
# when you are root; --oversubscribe lets NP exceed the core count (tests).
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:?usage: scripts/launch_mpi.sh NP [train_gpt flags...]}
shift
[ -x ./train_gpt_mpi ] || make train_gpt_mpi
cores=$(nproc)
threads=$(( cores / np > 0 ? cores / np : 1 ))
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
case " $* " in *" --threads "*) ;; *) set -- --threads "$threads" "$@" ;; esac
echo "mpirun -np $np (${threads} OpenMP threads per rank) ./train_gpt_mpi $*"
exec mpirun "${extra[@]}" --oversubscribe --bind-to none -np "$np" -x OMP_PROC_BIND=false ./train_gpt_mpi "$@"
