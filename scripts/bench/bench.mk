# bench.mk — the benchmarks and projections, included by the Makefile (which
# defines the compilers, flags, GPTC_H, TOKENIZER_FILES and CORPUS). Each
# target runs one script of scripts/bench/ (or scripts/project_zero.py); none
# is in make test. What they printed lives in scripts/RESULTS.md.

## ---- benchmarks (scripts/bench/bench.mk)

# the training-step benchmark includes train_gpt.c, like the tests
dev/cpu/bench_train: dev/cpu/bench_train.c train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/cpu/bench_train.c $(LDLIBS)

# the runtime model phase by phase: one step replayed kernel by kernel, each
# phase's time beside gptc/runtime.h's prediction (dev/cpu/profile_plan L C NH V B T)
dev/cpu/profile_plan: dev/cpu/profile_plan.c train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/cpu/profile_plan.c $(LDLIBS)

# this machine's fp32 FMA peak, the yardstick make bench reports against
dev/cpu/fma_peak: dev/cpu/fma_peak.c
	$(CC) $(CFLAGS) $(OPENMP) -o $@ dev/cpu/fma_peak.c -lm

# the same two built for AVX2 (-march=x86-64-v3, in place of $(MARCH)): an AVX2 machine's tile and peak
AVX2_CFLAGS = $(filter-out $(MARCH),$(CFLAGS)) -march=x86-64-v3
dev/cpu/bench_train_avx2: dev/cpu/bench_train.c train_gpt.c $(GPTC_H)
	$(CC) $(AVX2_CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/cpu/bench_train.c $(LDLIBS)
dev/cpu/fma_peak_avx2: dev/cpu/fma_peak.c
	$(CC) $(AVX2_CFLAGS) $(OPENMP) -o $@ dev/cpu/fma_peak.c -lm

## make bench           GPT-2 124M training steps here and in PyTorch per x86 instruction set (native, AVX2), as % of each one's FMA peak (~8 min)
bench: dev/cpu/bench_train dev/cpu/fma_peak dev/cpu/bench_train_avx2 dev/cpu/fma_peak_avx2 $(TOKENIZER_FILES)
	@[ -e /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 ] || { echo "make bench: the OpenMP OpenBLAS," \
		"its PyTorch baseline's BLAS, is missing: sudo apt-get install libopenblas0-openmp (scripts/install_deps.sh installs it)"; exit 1; }
	scripts/bench/bench.sh

# data-parallel scaling: 2 ranks x 1 thread against 1 rank x 1 thread
## make bench-dp        data-parallel scaling under MPI (2 ranks x 1 thread vs 1 x 1)
bench-dp: train_gpt_mpi
	scripts/bench/bench_dp.sh

# bytes per level per step and model-state bytes per rank of every stage, against the formulas
## make bench-zero      bytes per level and memory per rank, every ZeRO stage and ZeRO++ mode, np 2 and 4 (~1.5 min)
bench-zero: train_gpt_mpi
	scripts/bench/bench_zero.sh ./train_gpt_mpi

# the runtime model (gptc/runtime.h): predicted vs measured step time over a
# grid, and --plan's choice vs every candidate measured under a memory budget
# (scripts/bench/bench_plan.sh; a few minutes)
## make bench-plan      the runtime model: predicted vs measured step times, the planner's choice vs every candidate
bench-plan: train_gpt train_gpt_mpi
	scripts/bench/bench_plan.sh ./train_gpt ./train_gpt_mpi

# What snapshots cost per step and what a crash costs: a small GPT in a few
# minutes; make bench-failover BENCH_FLAGS=--gpt2 for GPT-2 124M (longer: 2 GB a save).
# The neighbour-replica row needs train_gpt_mpi (make train_gpt_mpi).
## make bench-failover  snapshot stall per step, recovery from memory, replica, disk, a hot spare (BENCH_FLAGS=--gpt2)
bench-failover: train_gpt
	scripts/bench/bench_failover.sh $(BENCH_FLAGS)

# ZeRO++'s quality: plain --zero 3 vs qwZ INT8 + hpZ + qgZ INT4, the default run's model and corpus, on
# mpirun -np 4 --topology 2x2 (scripts/bench/quality_zeropp.sh; ~9 s a step per run on 2 shared cores)
## make quality-zeropp  plain --zero 3 vs qwZ+hpZ+qgZ on the English corpus, curves overlaid (QUALITY_STEPS=300: hours)
QUALITY_STEPS ?= 300
quality-zeropp: train_gpt_mpi $(TOKENIZER_FILES) $(CORPUS)
	scripts/bench/quality_zeropp.sh $(QUALITY_STEPS) out/quality_zeropp

# the step time of a 20B GPT under ZeRO-3, ZeRO++ and three-level
# hierarchical partitioning on a Frontier-like machine, from a stated model
# (scripts/project_zero.py: plain python3, projections, not measurements)
## make project-zero    ZeRO-3 / ZeRO++ / 3-level partitioning of a 20B GPT on 8-384 GCDs, projected on paper
project-zero:
	$(PYTHON) scripts/project_zero.py

.PHONY: bench bench-dp bench-zero bench-plan bench-failover quality-zeropp project-zero
