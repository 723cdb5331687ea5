# cpu.mk — the CUDA twin executed on the CPU: the build of the layer in this
# folder and of every .cu program against it, and the tests that run them.
# Included by the Makefile (which defines CXX, MPICC, CUDA_HOME, GPTC_H,
# CUDA_CUH and the CUDA twin's own builds). What the layer proves, and what
# only a GPU proves: dev/cuda/cpu/README.md.
#
#   make test-cuda-cpu                      the layer's kernel-execution core on its own (g++ only)
#   make train_gpt_cu_cpu test_gpt_cu_cpu   the trainer and its test, on the CPU
#   make test-cuda-on-cpu                   what make test runs of them (~6-7 min)

## ---- the CUDA twin executed on the CPU (dev/cuda/cpu/cpu.mk)

# ---- the kernel-execution core --------------------------------------------------
# fibers, barriers, warp operations, launch limits; see dev/cuda/cpu/README.md.
# -std=c++17  std::apply for the kernel arguments
# -O2 -g      quick enough, and readable in gdb when a fiber faults
# -I.         the test includes "dev/cuda/cpu/cuda_cpu.h" from the root
# -I$(CUDA_HOME)/include  CUDA's own vector_types.h (dim3, uint3), compiled as host C++
CUDA_CPU_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -I. -I$(CUDA_HOME)/include
dev/cuda/cpu/test_cuda_cpu: dev/cuda/cpu/test_cuda_cpu.cpp dev/cuda/cpu/cuda_cpu.cpp dev/cuda/cpu/counters.cpp dev/cuda/cpu/cuda_cpu.h
	$(CXX) $(CUDA_CPU_CXXFLAGS) -o $@ dev/cuda/cpu/test_cuda_cpu.cpp dev/cuda/cpu/cuda_cpu.cpp dev/cuda/cpu/counters.cpp

## make test-cuda-cpu   the CPU layer's kernel-execution core: fibers, barriers, warps, launch limits (g++ only)
test-cuda-cpu: dev/cuda/cpu/test_cuda_cpu
	./dev/cuda/cpu/test_cuda_cpu

# ---- the .cu programs on the CPU --------------------------------------------------
# The same .cu sources, compiled by g++ against the CPU execution layer:
# translate.py rewrites k<<<...>>>(...) and extern __shared__ into .cpu/ (same
# line numbers), dev/cuda/cpu/include/cuda_runtime.h stands in for CUDA's, and
# runtime.cpp, cublaslt.cpp, nccl_mpi.cpp implement CUDA's own
# cuda_runtime_api.h, cublasLt.h and nccl.h (NCCL over MPI: one rank per
# emulated GPU).
CPU_BUILD = .cpu
CPU_LAYER = $(CPU_BUILD)/layer/cuda_cpu.o $(CPU_BUILD)/layer/counters.o $(CPU_BUILD)/layer/runtime.o $(CPU_BUILD)/layer/cublaslt.o $(CPU_BUILD)/layer/nccl_mpi.o
CPU_LAYER_H = dev/cuda/cpu/cuda_cpu.h dev/cuda/cpu/device.h dev/cuda/cpu/include/cuda_runtime.h dev/cuda/cpu/include/mma.h
# -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX  mpi.h without MPI's C++ bindings (not in libmpi)
# $(shell mpicc --showme:compile)          the -I/-D flags mpicc adds (Open MPI), and --showme:link its libraries
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

# the kernel lab's further files on the CPU layer, one a line
CPU_LAB = $(CPU_BUILD)/dev/cuda/adamw
CPU_LAB += $(CPU_BUILD)/dev/cuda/encoder
CPU_LAB += $(CPU_BUILD)/dev/cuda/gelu
CPU_LAB += $(CPU_BUILD)/dev/cuda/matmul

# the layer's planted-bug tests share their driver
$(CPU_BUILD)/dev/cuda/cpu/test_layer $(CPU_BUILD)/dev/cuda/cpu/test_wmma $(CPU_BUILD)/dev/cuda/cpu/test_ptx: dev/cuda/cpu/test_cases.h dev/cuda/cpu/ck.h
$(CPU_BUILD)/dev/cuda/cpu/test_ptx: gptc/cuda/ptx.cuh
$(CPU_BUILD)/dev/cuda/cpu/test_graph_nccl: dev/cuda/cpu/ck.h

# the lab's attention once more with -DATTN_MMA_SCALAR: flash attention's tile
# products as plain fp32 FMAs instead of WMMA (train_gpt.cu's attn_mma16), so
# that path, the algorithm apart from the tensor cores, stays tested
$(CPU_BUILD)/dev/cuda/attention_scalar: $(CPU_BUILD)/dev/cuda/attention.cu $(CPU_BUILD)/dev/cuda/common.h $(CPU_BUILD)/train_gpt.cu train_gpt.c $(GPTC_H) $(CPU_CUH) $(CPU_LAYER)
	$(CXX) $(CPU_APP_FLAGS) -DATTN_MMA_SCALAR -Idev/cuda -c -o $@.o $<
	$(CXX) -o $@ $@.o $(CPU_LAYER) $(CPU_APP_LIBS)

# NCCL over MPI for the CPU layer (dev/cuda/cpu/nccl_mpi.cpp; NCCL.md): each
# emulated GPU is one MPI rank. The self-test runs alone, under mpirun -np 2
# and -np 3, and its planted bugs (a count mismatch, a killed rank); a few seconds.
# $(MPI_CXXFLAGS)         mpi.h, without MPI's C++ bindings (above)
# -I$(CUDA_HOME)/include  NCCL's own nccl.h and cuda_bf16.h, compiled as host C++ (libnccl is not linked)
# device_stub.cpp  a test double for the runtime (device.h): host memory as device memory, and
#                  the last operation's declared ranges, which the test checks
NCCL_CPU_SRC = dev/cuda/cpu/test_nccl_mpi.cpp dev/cuda/cpu/nccl_mpi.cpp dev/cuda/cpu/device_stub.cpp
dev/cuda/cpu/test_nccl_mpi: $(NCCL_CPU_SRC) dev/cuda/cpu/device.h
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "error: $(MPICC) not found: apt-get install libopenmpi-dev openmpi-bin"; exit 1; }
	$(CXX) $(CUDA_CPU_CXXFLAGS) $(MPI_CXXFLAGS) -o $@ $(NCCL_CPU_SRC) $(MPI_CXXLIBS)

## make test-nccl-cpu   NCCL over MPI for the CPU layer: 1, 2 and 3 emulated GPUs, planted mismatch and killed rank
test-nccl-cpu: dev/cuda/cpu/test_nccl_mpi
	dev/cuda/cpu/test_nccl_mpi.sh ./dev/cuda/cpu/test_nccl_mpi

# The CPU layer's cuBLASLt stand-in (dev/cuda/cpu/cublaslt.cpp, see CUBLASLT.md) against a float64
# reference, linked with device_stub.cpp (a test double for the runtime: host memory as device memory, the last ranges recorded);
# same flags as above (-I$(CUDA_HOME)/include: CUDA's own cublasLt.h and cuda_bf16.h; libcublasLt is not linked).
dev/cuda/cpu/test_cublaslt: dev/cuda/cpu/test_cublaslt.cpp dev/cuda/cpu/cublaslt.cpp dev/cuda/cpu/device_stub.cpp dev/cuda/cpu/device.h
	$(CXX) $(CUDA_CPU_CXXFLAGS) -o $@ dev/cuda/cpu/test_cublaslt.cpp dev/cuda/cpu/cublaslt.cpp dev/cuda/cpu/device_stub.cpp

## make test-cublaslt-cpu  the CPU layer's cuBLASLt stand-in against a float64 reference (g++ only)
test-cublaslt-cpu: dev/cuda/cpu/test_cublaslt
	./dev/cuda/cpu/test_cublaslt

# (the scripts that build patched copies of train_gpt.cu ask for the flags these print)
print-cpu-app-flags:
	@echo $(CPU_APP_FLAGS)
print-cpu-app-libs:
	@echo $(CPU_APP_LIBS)
print-cpu-layer:
	@echo $(CPU_LAYER)

# ---- the tests on emulated GPUs ---------------------------------------------------

## make test-cuda-on-cpu  the CUDA twin on the CPU: its tests, dev/cuda, a training run, 3 emulated GPUs (~6-7 min)
test-cuda-on-cpu: train_gpt_cu_cpu test_gpt_cu_cpu train_gpt $(HOOKS_BUILD)/train_gpt $(TOKENIZER_FILES) $(CPU_BUILD)/dev/cuda/cpu/test_layer $(CPU_BUILD)/dev/cuda/cpu/test_wmma $(CPU_BUILD)/dev/cuda/cpu/test_ptx dev/cuda/cpu/test_cublaslt \
		$(CPU_BUILD)/dev/cuda/cpu/test_graph_nccl \
		dev/cuda/cpu/test_nccl_mpi $(CPU_BUILD)/dev/cuda/layernorm $(CPU_BUILD)/dev/cuda/classifier $(CPU_BUILD)/dev/cuda/attention \
		$(CPU_BUILD)/dev/cuda/attention_scalar $(CPU_BUILD)/dev/cuda/dp_layout $(CPU_LAB)
	scripts/tests/test_cuda_on_cpu.sh

# The GPU trainer's memory plan == its device allocation over a grid of 23 configurations (1 and 2 emulated
# GPUs, ZeRO 0/1/2, --recompute 0-3, --offload), --offload 1 == --offload 0 bytes, --plan's choice under a
# budget (scripts/tests/test_gpu_plan.sh; ~4 min, not in make test)
## make test-gpu-runtime  the GPU's runtime model, --plan/--auto/--snapshot-every auto on the CPU layer (~35 s)
test-gpu-runtime: train_gpt_cu_cpu
	scripts/tests/test_gpu_runtime.sh

## make test-gpu-plan   the GPU memory plan == its device allocation, --offload, on the CPU layer (~5 min)
test-gpu-plan: train_gpt_cu_cpu
	scripts/tests/test_gpu_plan.sh

# train_gpt.cu's levels: 4 emulated GPUs as --topology 2x2, --zero 0/1/2 flat and --hierarchical 1
# against each other and the CPU trainer, bytes per level against the formulas, nodes by host, refusals
# (scripts/tests/test_cuda_levels.sh; ~6 min, not in make test; its QUICK=1 part, ~25 s, is in test_cuda_on_cpu.sh)
## make test-cuda-levels  train_gpt.cu's --topology, bytes per level, --hierarchical 1 on 4 emulated GPUs (~6 min)
test-cuda-levels: train_gpt_cu_cpu train_gpt
	scripts/tests/test_cuda_levels.sh

# train_gpt.cu's --zero 3: on 2, 3 (--recompute 3) and 4 (2x2, --hierarchical 1) emulated GPUs against
# --zero 2 bit for bit, memory plan == ledger, bytes per step = the formula, states resumed, a planted wrong gather
# and two planted missing event waits caught (scripts/tests/test_cuda_zero3.sh; ~4.5 min, not in make test)
## make test-cuda-zero3   train_gpt.cu's --zero 3 on 2-4 emulated GPUs: = --zero 2 bit for bit, plan, bytes, states (~4.5 min)
test-cuda-zero3: train_gpt_cu_cpu
	scripts/tests/test_cuda_zero3.sh

# train_gpt.cu's ZeRO++ on --zero 3 (qwZ, hpZ, qgZ over NCCL) on 2 and 4 (2x2) emulated GPUs: every gather and
# reduction against scripts/tests/zeropp_ref.py bit for bit, bytes per level = zeropp_bytes.py --gpu, plan == ledger,
# losses against plain --zero 3, a resume, three planted bugs caught (scripts/tests/test_cuda_zeropp.sh; ~4 min, not in make test)
## make test-cuda-zeropp  train_gpt.cu's ZeRO++ on 2 and 2x2 emulated GPUs: the wire = zeropp_ref.py bit for bit (~4 min)
test-cuda-zeropp: train_gpt_cu_cpu
	scripts/tests/test_cuda_zeropp.sh

# train_gpt.cu's hot spare (--standby FIFO) under scripts/supervise.py --spare 1: the trainer (one
# process, and a rank of 2 emulated GPUs under mpirun) SIGKILLed once the spare is ready, the spare promoted and
# cmp-identical to an uninterrupted run (every step's loss too); a spare dismissed (exit 0, no byte changed); the
# refusals (scripts/tests/test_cuda_spare.sh; ~1 min, not in make test)
## make test-cuda-spare   train_gpt.cu's hot spare (--standby) on 1 and 2 emulated GPUs: promoted after a SIGKILL (~1 min)
test-cuda-spare: train_gpt_cu_cpu
	scripts/tests/test_cuda_spare.sh

# Bugs planted in a copy of train_gpt.cu must be caught (dev/cuda/cpu/mutants.sh; ~3 min, not in make test)
## make test-cuda-mutants bugs planted in a copy of train_gpt.cu must be caught by the CPU layer (about 2 min)
test-cuda-mutants: $(CPU_LAYER)
	dev/cuda/cpu/mutants.sh

# GPU efficiency without a GPU (dev/cuda/gpu_metrics.py, docs/gpu.md): one training
# step of train_gpt_cu_cpu at GPT-2 124M's layer shapes (C=768 NH=12, one layer,
# B=1 T=256, V=1024) with the layer's counters on, ptxas -v of train_gpt.cu for
# sm_90 and sm_80 (registers, spills, static shared memory), then the table,
# $(TEST_DIR)/gpu_metrics.tsv and the step ESTIMATE for B=64 T=1024 on an H200.
# -cubin             device code only: the resources, not a program (about 20 s an architecture)
# -DGPTC_NO_NCCL     host code is not compiled for a cubin; NCCL's header is not needed
GPU_METRICS_RUN = --model d1 --channels 768 --num-heads 12 --vocab-size 1024 --max-seq-len 256 \
	--seq-len 256 --batch-size 1 --steps 1 --val-every 0 --sample-every 0
$(TEST_DIR)/gpu_metrics/ptxas_%.txt: train_gpt.cu train_gpt.c $(GPTC_H) $(CUDA_CUH)
	@mkdir -p $(@D)
	$(NVCC) -arch=$* -O3 -std=c++17 -I. -DGPTC_NO_NCCL -cubin -Xptxas -v -o $(@D)/train_gpt_$*.cubin train_gpt.cu > $@ 2>&1 || { cat $@; exit 1; }
# the lab's files with H200 readings: their device code's resources (the
# readings' variants and sizes: dev/cuda/gpu_metrics.py LAB_READINGS)
$(TEST_DIR)/gpu_metrics/ptxas_lab_%.txt: dev/cuda/%.cu dev/cuda/common.h train_gpt.cu $(CUDA_CUH)
	@mkdir -p $(@D)
	$(NVCC) -arch=sm_90 -O3 -std=c++17 -I. -Idev/cuda -DGPTC_NO_NCCL -cubin -Xptxas -v -o $(@D)/lab_$*.cubin $< > $@ 2>&1 || { cat $@; exit 1; }
## make gpu-metrics    counts, registers, occupancy and an ESTIMATED H200 step time for every production kernel (about 2 min)
# one training step of GPT-2 124M's layer shapes, counted (about 50 s)
$(TEST_DIR)/gpu_metrics/counts.tsv: train_gpt_cu_cpu scripts/toy_shard.py
	@mkdir -p $(@D)
	/usr/bin/python3 scripts/toy_shard.py $(@D)/toy1024.bin 20000 1024 0 > /dev/null
	CUDA_CPU_COUNT=1 CUDA_CPU_COUNT_FILE=$@.part ./train_gpt_cu_cpu $(GPU_METRICS_RUN) \
		--train-data $(@D)/toy1024.bin > $(@D)/run.log 2>&1 || { cat $(@D)/run.log; exit 1; }
	mv $@.part $@
# the production classifier at GPT-2's vocabulary, 8 rows (the step's run has V = 1024)
$(TEST_DIR)/gpu_metrics/classifier_v50257.tsv: $(CPU_BUILD)/dev/cuda/classifier
	@mkdir -p $(@D)
	CUDA_CPU_COUNT=1 CUDA_CPU_COUNT_FILE=$@.part DEV_CUDA_REPS=1 $< 3 8 50257 50304 > $@.log 2>&1 || { cat $@.log; exit 1; }
	mv $@.part $@
GPU_METRICS_NEEDS = $(TEST_DIR)/gpu_metrics/classifier_v50257.tsv $(TEST_DIR)/gpu_metrics/counts.tsv $(TEST_DIR)/gpu_metrics/ptxas_sm_90.txt \
	$(TEST_DIR)/gpu_metrics/ptxas_sm_80.txt $(CPU_BUILD)/dev/cuda/layernorm $(CPU_BUILD)/dev/cuda/classifier \
	$(TEST_DIR)/gpu_metrics/ptxas_lab_layernorm.txt $(TEST_DIR)/gpu_metrics/ptxas_lab_classifier.txt
## make gpu-metrics    counts, registers, occupancy and an ESTIMATED H200 step time for every production kernel (about 2 min)
gpu-metrics:
	@$(MAKE) --no-print-directory $(call sub_jobs,2) $(GPU_METRICS_NEEDS)  # the counted step beside the four ptxas runs (about 25 s each)
	/usr/bin/python3 dev/cuda/gpu_metrics.py --counts $(TEST_DIR)/gpu_metrics/counts.tsv --run 1,256,1,1024,256 \
		--ptxas90 $(TEST_DIR)/gpu_metrics/ptxas_sm_90.txt --ptxas80 $(TEST_DIR)/gpu_metrics/ptxas_sm_80.txt \
		--classifier $(TEST_DIR)/gpu_metrics/classifier_v50257.tsv:8 --out $(TEST_DIR)/gpu_metrics.tsv
	/usr/bin/python3 dev/cuda/gpu_metrics.py --lab-check $(CPU_BUILD)/dev/cuda $(TEST_DIR)/gpu_metrics \
		$(TEST_DIR)/gpu_metrics/ptxas_lab_layernorm.txt $(TEST_DIR)/gpu_metrics/ptxas_lab_classifier.txt
	@tail -n 1 $(TEST_DIR)/gpu_metrics.tsv

.PHONY: gpu-metrics test-cuda-cpu test-nccl-cpu test-cublaslt-cpu print-cpu-app-flags print-cpu-app-libs print-cpu-layer \
	test-cuda-on-cpu test-gpu-runtime test-gpu-plan test-cuda-levels test-cuda-zero3 test-cuda-zeropp test-cuda-spare test-cuda-mutants
