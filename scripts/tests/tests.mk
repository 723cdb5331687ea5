# tests.mk — the test binaries and the test and check targets, included by the
# Makefile (which defines the compilers, flags, GPTC_H, TOKENIZER_FILES,
# TEST_DIR and `make test` itself). Each target runs one script of
# scripts/tests/ (or a test binary); `make test` runs most of them through
# scripts/tests/test_all.sh, and the ones it leaves out say so. The CUDA twin's
# tests on the CPU execution layer are in dev/cuda/cpu/cpu.mk.

## ---- tests and checks (scripts/tests/tests.mk)

# ---- the test binaries --------------------------------------------------------

# the tests include train_gpt.c under GPTC_NO_MAIN (its main() is left out, so
# some helpers only main() uses are unused: -Wno-unused-function)
## make test_gpt        the C tests: PyTorch fixtures, finite differences, round trips, bad inputs
test_gpt: test_gpt.c train_gpt.c $(GPTC_H) test_common.h test_check.h
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -DGPTC_TEST_HOOKS -o $@ test_gpt.c $(LDLIBS)

# the same with the sanitizers; -O1 -g keeps reports readable
test_gpt_asan: test_gpt.c train_gpt.c $(GPTC_H) test_common.h test_check.h
	$(CC) -O1 -g -fno-omit-frame-pointer -march=native -fno-math-errno -std=c11 -Wall -Wextra -Wno-unused-function -fsanitize=address,undefined \
		-fno-sanitize-recover=undefined $(OPENMP) -DGPTC_TEST_HOOKS -o $@ test_gpt.c $(LDLIBS)

# The trainers again with the planted faults compiled in (gptc/test_hooks.h), under the
# same names in $(HOOKS_BUILD)/, for the tests that set GPTC_INJECT_*, GPTC_CALIB_PLANT_SLOW,
# GPTC_STANDBY_SETUP_MS or GPTC_ZEROPP_DUMP (train_gpt and train_gpt_mpi have none of them)
$(HOOKS_BUILD)/train_gpt: train_gpt.c $(GPTC_H)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(OPENMP) -DGPTC_TEST_HOOKS -o $@ train_gpt.c $(LDLIBS)
$(HOOKS_BUILD)/train_gpt_mpi: train_gpt.c $(GPTC_H)
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	@mkdir -p $(@D)
	$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -DGPTC_TEST_HOOKS -o $@ train_gpt.c $(LDLIBS)

# tokenizer parity with the reference JavaScript tokenizer (see dev/tokenizer/README.md)
test_tokenizer: dev/tokenizer/test_tokenizer.c $(GPTC_H) test_check.h
	$(CC) $(CFLAGS) -Wno-unused-function $(OPENMP) -I. -o $@ dev/tokenizer/test_tokenizer.c $(LDLIBS)

# ZeRO++'s quantised collectives (gptc/quant.h) against fp64 sums, exact
# re-quantisation and byte formulas, on 1, 2 and 4 ranks with emulated
# nodes (scripts/tests/test_quant.sh)
dev/quant/test_quant: dev/quant/test_quant.c gptc/quant.h gptc/util.h test_check.h
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(MPICC) $(CFLAGS) -Wno-unused-function $(OPENMP) -DUSE_MPI -I. -o $@ dev/quant/test_quant.c $(LDLIBS)

# (glibc malloc told to keep what torch frees, not to unmap it, and to ask for
# transparent huge pages (glibc >= 2.35; ignored where THP is off): each
# float64 step of GPT-2 124M allocates GBs of temporaries, and on these VMs a
# fresh 4 KB page costs its first touch again; kept pages and huge pages make
# the reference several times faster, with the same bytes.
# scripts/bench/bench_torch.sh's KEEP_HEAP=1)
$(FIXTURE_124M)/gpt2_124M_ref.bin: scripts/gpt2_reference.py
	@$(PYTHON) -c 'import torch' 2>/dev/null || { echo "error: $(PYTHON) has no torch: apt-get install python3-torch python3-numpy (or run make test-fast)"; exit 1; }
	mkdir -p $(FIXTURE_124M)
	MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \
		$(PYTHON) scripts/gpt2_reference.py --init 12,768,12,1024,50257 --seed 1337 --B 2 --T 64 --steps 3 \
		--data-seed 42 --out-model $(FIXTURE_124M)/gpt2_124M_model.bin.tmp --out-ref $@.tmp
	mv $(FIXTURE_124M)/gpt2_124M_model.bin.tmp $(FIXTURE_124M)/gpt2_124M_model.bin
	mv $@.tmp $@

# ---- the CPU trainers ---------------------------------------------------------

## make check-cxx       compile train_gpt.c as C++17 (train_gpt.cu includes it)
check-cxx:
	$(CXX) -x c++ -std=c++17 -Wall -Wextra -fsyntax-only $(OPENMP) train_gpt.c
	$(CXX) -x c++ -std=c++17 -Wall -Wextra -Wno-unused-function -fsyntax-only $(OPENMP) test_gpt.c

## make test-portable   gcc and clang with and without OpenMP, aarch64 under qemu: no warning, the same test counts, every GEMM tile tested (~5 min)
test-portable:
	scripts/tests/test_portable.sh

## make test-asan       test_gpt under AddressSanitizer + UBSan
test-asan: train_gpt $(HOOKS_BUILD)/train_gpt test_gpt_asan $(TOKENIZER_FILES)
	ASAN_OPTIONS=detect_leaks=1 ./test_gpt_asan

# Hugging Face checkpoints: scripts/hf_reference.py writes a small GPT-2 as
# config.json + model.safetensors (F32, F64, F16, BF16) with PyTorch's
# float64 logits; test_gpt --hf imports each, compares, exports; the script
# reads the export back (scripts/hf_reference.py's header says what each checks)
## make test-hf         Hugging Face GPT-2 checkpoints in and out against PyTorch (no download; seconds)
test-hf: train_gpt test_gpt
	@$(PYTHON) -c 'import torch' 2>/dev/null || { echo "error: $(PYTHON) has no torch: apt-get install python3-torch python3-numpy"; exit 1; }
	rm -rf $(TEST_DIR)/hf
	$(PYTHON) scripts/hf_reference.py make $(TEST_DIR)/hf
	./test_gpt --hf $(TEST_DIR)/hf
	$(PYTHON) scripts/hf_reference.py check $(TEST_DIR)/hf

# the multiple-choice eval (HellaSwag's shape): prepare_eval's ids against the
# reference tokenizer, train_gpt's scores against PyTorch float64 on 1 and 2
# ranks, training unchanged by it, bad files (scripts/tests/test_eval.sh)
## make test-eval       the multiple-choice eval (--eval-file) against PyTorch float64, 1 and 2 ranks (~37 s)
test-eval: train_gpt train_gpt_mpi prepare_eval $(TOKENIZER_FILES)
	scripts/tests/test_eval.sh ./train_gpt ./train_gpt_mpi ./prepare_eval

## make test-quant      ZeRO++'s quantised collectives (gptc/quant.h) under mpirun -np 1, 2, 4
test-quant: dev/quant/test_quant
	scripts/tests/test_quant.sh ./dev/quant/test_quant

# 1 process against mpirun -np 2 and -np 3, plain and ZeRO-1 (scripts/tests/test_dp.sh)
## make test-dp         data parallel under MPI: mpirun -np 2 / -np 3 against 1 process
test-dp: train_gpt_mpi $(TOKENIZER_FILES)
	scripts/tests/test_dp.sh ./train_gpt_mpi

# ZeRO-3, the levels (--topology) and hierarchical reduction against 1 process (scripts/tests/test_zero3.sh)
## make test-zero3      ZeRO-3, --topology levels, hierarchical reduction: np 1-4 against 1 process (~35 s)
test-zero3: $(HOOKS_BUILD)/train_gpt_mpi train_gpt
	scripts/tests/test_zero3.sh $(HOOKS_BUILD)/train_gpt_mpi ./train_gpt

# ZeRO++ (gptc/zeropp.h) on --zero 3 against plain --zero 3: np 2 and --topology 2x2 (scripts/tests/test_zeropp.sh)
## make test-zeropp     ZeRO++ (--qwz, --qgz, --hpz): losses, bytes, resume, the wire against numpy bit for bit (~35 s)
test-zeropp: $(HOOKS_BUILD)/train_gpt_mpi
	scripts/tests/test_zeropp.sh $(HOOKS_BUILD)/train_gpt_mpi

# the same plus 7 planted bugs, each built from a patched copy of the sources: the wire check must fail on each (~3 min)
## make test-zeropp-mutants  test-zeropp plus 7 planted bugs the wire check must catch (~3.5 min)
test-zeropp-mutants: $(HOOKS_BUILD)/train_gpt_mpi
	ZEROPP_MUTANTS=1 MUTANT_CC="$(MPICC) $(CFLAGS) $(OPENMP) -DUSE_MPI -DGPTC_TEST_HOOKS" MUTANT_LIBS="$(LDLIBS)" scripts/tests/test_zeropp.sh $(HOOKS_BUILD)/train_gpt_mpi

# the memory plan (gptc/plan.h) == the allocation ledger, byte for byte, over a
# grid of 33 configurations; peak RSS within 3% (scripts/tests/test_plan.sh)
## make test-plan       the memory plan (--plan) against the allocation ledger and peak RSS; --auto, calibration (~70 s)
test-plan: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/tests/test_plan.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi

# SIGKILL and SIGSTOP at random moments under the supervisor, 1 process and 2 ranks (scripts/tests/test_failover.sh)
## make test-failover   runs killed and hung under scripts/supervise.py end bit for bit as uninterrupted ones
test-failover: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/tests/test_failover.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi

# the hot spare of a 2-rank job (a standby mpirun job), all four cases (~40 s; make test runs the first)
## make test-failover-long  that, and the 2-rank hot spare: killed ranks, a killed spare, two failures, no state
test-failover-long: $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/tests/test_failover.sh $(HOOKS_BUILD)/train_gpt $(HOOKS_BUILD)/train_gpt_mpi
	scripts/tests/test_spare_ranks.sh $(HOOKS_BUILD)/train_gpt_mpi

# stop and resume at every step: 1 and 3 shards, --shuffle 0/1, 1 process and 2 ranks (scripts/tests/test_resume.sh)
## make test-resume     a run stopped and resumed at any step sees the batches an uninterrupted one sees
test-resume: train_gpt train_gpt_mpi
	scripts/tests/test_resume.sh ./train_gpt ./train_gpt_mpi

# scripts/slurm_cpu.sbatch and slurm_supervised.sbatch under a real one-node
# Slurm that the script starts and stops (a rank SIGKILLed, a step
# scancelled, a job requeued: all bit-identical). Not in make test: it needs
# root and Debian's slurm-wlm and munge (which CI does not install), and
# takes 70-105 s; it prints SKIPPED and passes without them.
## make test-slurm      the Slurm scripts under a one-node Slurm the test starts itself (root; not in make test)
test-slurm: train_gpt_mpi
	scripts/tests/test_slurm.sh ./train_gpt_mpi

.PHONY: check-cxx test-portable test-asan test-hf test-eval test-quant test-dp test-zero3 test-zeropp test-zeropp-mutants test-plan \
	test-failover test-failover-long test-resume test-slurm

# ---- the CUDA twin, compiled without a GPU ------------------------------------

# $(call quietly,COMMAND): its output into a temporary file; all of it on failure, else its last line
quietly = log=$$(mktemp) && { $(1) > $$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; } && tail -n 1 $$log && rm -f $$log

# host-only: every rank's shard map against the flat parameters (dev/cuda/dp_layout.cu)
## make dp-layout       the data-parallel bucket/shard layout, checked on the host (no GPU needed)
dp-layout: dev/cuda/dp_layout
	@$(call quietly,./dev/cuda/dp_layout)

# CI (no GPU): every .cu file must compile, warning-free, for Hopper; the
# trainer and its test (every production kernel) for Ampere too, and
# train_gpt.cu once more with MPI (when mpicc is there; said aloud when not).
# (The lab files include train_gpt.cu: compiling each for Ampere as well
# would repeat the trainer's Ampere build nine times, 2-3 minutes of CI.)
# -Werror all-warnings: nvcc's own diagnostics become errors too.
# Then what runs without a GPU: test_gpt.cu's host-only tests (its Hopper
# build, kept in $(TEST_DIR)/check_cuda), the bucket/shard layout (dp-layout), the
# NCCL search and the no-NCCL build (scripts/tests/test_nccl_find.sh), and the GPU
# scripts' plans and gpu_train's exits (scripts/tests/test_gpu_host.sh).
CHECK_CUDA_FLAGS = -O3 -std=c++17 -Xcompiler -fopenmp,-Wall,-Wextra,-Wno-unused-function -Werror all-warnings -I. $(NCCL_CUFLAGS)
# the kernel lab's further files, one a line
CHECK_CUDA_LAB = dev/cuda/adamw.cu
CHECK_CUDA_LAB += dev/cuda/encoder.cu
CHECK_CUDA_LAB += dev/cuda/gelu.cu
CHECK_CUDA_LAB += dev/cuda/matmul.cu
# Each compile is a target of its own, so that make runs them side by side
# (CHECK_JOBS at once: the cores); only the Hopper builds of test_gpt and
# dev/cuda/dp_layout are kept (in $(TEST_DIR)/check_cuda, to run their host
# checks), the others go to /dev/null.
CHECK_CUDA_OUT = $(TEST_DIR)/check_cuda
CHECK_CUDA_SM90 = train_gpt.cu test_gpt.cu dev/cuda/layernorm.cu dev/cuda/classifier.cu dev/cuda/attention.cu \
	dev/cuda/dp_layout.cu dev/cuda/cpu/test_wmma.cu dev/cuda/cpu/test_ptx.cu $(CHECK_CUDA_LAB)
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
# (resources), in less than half the CPU time. make dev-cuda builds them
# optimised, to run them on a GPU.
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

## make check-cuda      compile every .cu file for Hopper and Ampere, run the host-only checks (no GPU needed)
check-cuda:
	@command -v $(NVCC) >/dev/null 2>&1 || { echo "nvcc not found: install the CUDA toolkit (CI has CUDA 13 in /usr/local/cuda)"; exit 1; }
	@[ -n "$(HAVE_MPICC)" ] || echo "check-cuda: train_gpt_cu_mpi SKIPPED: $(MPICC) not found (apt-get install libopenmpi-dev openmpi-bin)"
	@$(MAKE) --no-print-directory $(call sub_jobs,$(CHECK_JOBS)) check-cuda-builds
	@echo "test_gpt_cu --host-only (the sm_90 build above)" && \
	$(call quietly,$(CHECK_CUDA_OUT)/sm_90/test_gpt --host-only)
	@echo "dev/cuda/dp_layout (the sm_90 build above)" && $(call quietly,$(CHECK_CUDA_OUT)/sm_90/dev/cuda/dp_layout)
	@echo "scripts/tests/test_nccl_find.sh"; $(call quietly,scripts/tests/test_nccl_find.sh)
	@echo "scripts/tests/test_gpu_host.sh"; $(call quietly,scripts/tests/test_gpu_host.sh)
	@echo "no production kernel spills (ptxas -v, sm_90 and sm_80; dev/cuda/gpu_metrics.py --check-spills)"
	@$(MAKE) --no-print-directory $(TEST_DIR)/gpu_metrics/ptxas_sm_90.txt $(TEST_DIR)/gpu_metrics/ptxas_sm_80.txt
	@/usr/bin/python3 dev/cuda/gpu_metrics.py --check-spills $(TEST_DIR)/gpu_metrics/ptxas_sm_90.txt $(TEST_DIR)/gpu_metrics/ptxas_sm_80.txt

.PHONY: dp-layout check-cuda check-cuda-builds FORCE
