/*
 * train_gpt.cu — GPT-2 pretraining on NVIDIA GPUs: the CUDA twin of train_gpt.c.
 *
 * STATUS: ran on one H200 on 2026-11-30 (dev/cuda/RESULTS.md): test_gpt.cu's
 * 197 checks passed, compute-sanitizer's memcheck found nothing, --zero 1/2
 * matched --zero 0 bit for bit on one GPU; GPT-2 124M at 281,919 tok/s
 * (MFU 22.9%, 0.52x PyTorch with torch.compile). Not yet run on two or more
 * GPUs. Every make test also executes it on the CPU through dev/cuda/cpu
 * (kernels, cuBLASLt and NCCL calls, streams; 1-3 emulated GPUs; see
 * dev/cuda/cpu/README.md). scripts/gpu_check.sh and scripts/gpu_check_dp.sh
 * are the checks to run when a GPU is lent.
 *
 * It #includes train_gpt.c for every host-side part (CLI, file formats,
 * tokenizer, data loader, schedules, sampling, checkpoints, the rendezvous)
 * and adds only what differs on a GPU: device memory, kernels, cuBLASLt,
 * mixed precision and NCCL collectives.
 *
 * Precision: bf16 parameters (a copy made from the master), bf16 activations
 * and activation gradients; fp32 master weights, AdamW moments and parameter
 * gradients (the weight-gradient GEMMs accumulate straight into fp32 with
 * beta = 1, so micro-batches are summed in fp32: 18 bytes per parameter);
 * LayerNorm statistics, softmax statistics and the loss in fp32. The update
 * rounds master -> bf16 stochastically.
 *
 * Data parallel (G6): one process per GPU, NCCL collectives on their own
 * stream, each layer's gradients reduced while backward computes the layers
 * below it; --zero 0 (allreduce), 1 (ZeRO-1: optimizer state sharded) or
 * 2 (ZeRO-2: gradients sharded too) or 3 (ZeRO-3: the weights too, below
 * dp_reduce_bucket). The ranks meet through MPI (a build
 * with -DUSE_MPI, under mpirun or srun --mpi=pmix) or, without MPI, through
 * a file or a TCP port (train_gpt.c's rendezvous). Launchers: scripts/
 * launch_gpu.sh, slurm_gpu_pmix.sbatch, slurm_gpu_tcp.sbatch, run_gpt2.sh.
 * Levels (issue 15; not run on a GPU; checked on the CPU execution layer,
 * make test-cuda-levels): nodes from --topology NxK or by host, bytes sent
 * per level, --hierarchical 1 with a communicator per level (ncclCommSplit),
 * as the CPU trainer's gptc/zero3.h. --zero 3 (the bf16 weights sharded
 * too, each layer all-gathered before its forward and its backward; not run
 * on a GPU; checked on the CPU execution layer, make test-cuda-zero3: bit
 * for bit --zero 2's losses); ZeRO++ on it (--qwz, --qgz, --hpz: the CPU
 * trainer's gptc/zeropp.h over NCCL, below dp_bucket_floats; not run on a
 * GPU; checked on the CPU execution layer, make test-cuda-zeropp: the wire
 * bit for bit a numpy re-implementation's).
 *
 * Build (see the Makefile's CUDA section for every flag; it finds NCCL in the
 * CUDA toolkit, the system, NCCL_HOME or PyTorch's pip wheel, or builds the
 * one-GPU trainer without it, -DGPTC_NO_NCCL, and says so):
 *   make train_gpt_cu     # e.g. nvcc -O3 -arch=sm_90 -std=c++17 -Xcompiler -fopenmp -I. -o train_gpt_cu train_gpt.cu -lcublasLt -lnccl
 *   ./train_gpt_cu --model d12 --train-data "data/fineweb_train_*.bin" --batch-size 16 --seq-len 1024
 *   mpirun -np 8 ./train_gpt_cu_mpi --init mpi --zero 1 ...     (make train_gpt_cu_mpi)
 * Same flags as train_gpt (./train_gpt_cu --help), plus the GPU-only ones
 * (--gelu-fusion, --recompute, --init, --init-timeout, --comm-timeout), all in the one
 * flag table of gptc/cli.h.
 *
 * Attention is flash-style (G2): tiles of Q against K and V in shared
 * memory, an online softmax, tensor cores through WMMA, and only the
 * log-sum-exp per row (B, NH, T) kept for backward, which recomputes the
 * probabilities; the materialised variant it replaced is dev/cuda/attention.cu's
 * variant 1.
 *
 * Left out for now (honest list): CUDA graphs with several GPUs, --zero,
 * --spike-z or --offload 1 (--cuda-graphs captures one GPU's plain step:
 * gpu_train_build says why when it is off); a bf16 gradient-accumulation
 * option; overlapping the ZeRO-1/2 weight all-gather with the next forward;
 * overlapping a ZeRO snapshot's gather with the next step. (Activation
 * recomputation, once on this list, is --recompute.)
 *
 * Training states (G7): train_gpt.c's format and Saver, unchanged, so a state
 * written here resumes in train_gpt and the other way round: the fp32 master
 * weights and moments are copied to pinned host arrays on a side stream while
 * the next step computes, then handed to the Saver. Under --zero 1|2 (any
 * rank count) the shards are first all-gathered, bucket by bucket, into those
 * flat arrays (dp_state_to_host; synchronous), and a resume packs each rank's
 * shards out of the flat state (dp_state_upload), so a state moves between
 * rank counts, --zero modes and the CPU trainer. STATUS: run on 1-3 emulated
 * GPUs (scripts/test_zero_states.sh, test_gpt.cu), not yet on a GPU. A hot
 * spare (--standby FIFO under scripts/supervise.py --spare 1, issue 17;
 * gpu_standby) does the whole set-up, device and communicator included, and
 * waits; promoted, it resumes from the newest memory snapshot (not run on a
 * GPU; checked on the CPU execution layer, make test-cuda-spare).
 *
 * Memory (issue 14; not run on a GPU; checked on the CPU execution layer):
 * every cudaMalloc / cudaMallocHost goes through one ledger by component
 * (G1), gpu_memory_plan_for (G4) predicts the same from the allocators' size
 * functions, --plan-check 1 compares them byte for byte and --plan lists the
 * candidates against a budget (G7); --offload 1 keeps the fp32 master and
 * AdamW's moments on the host, updated by train_gpt.c's AdamW (G4).
 *
 * Banners:
 *   G1. Checked calls, host waits, device helpers, the device-memory ledger
 *   G2. Kernels: encoder, layernorm, flash attention, GELU, classifier,
 *       column sums (bias and LayerNorm parameter gradients), norm, AdamW,
 *       the data-parallel layout (shard map, packing)
 *   G3. Matmul through cuBLASLt
 *   G4. The model on the GPU: memory and its plan, forward, backward,
 *       update, the optimizer offload
 *   G5. Throughput and MFU
 *   G6. Data parallel: start-up (MPI or rendezvous), NCCL, buckets and shards
 *   G7. Training loop and main: training states (snapshots, resume), the loop
 */
/* GPTC_NO_MAIN, the one "no main" switch: defined by whoever includes this
 * file for its kernels (test_gpt.cu, dev/cuda/), it leaves out both mains;
 * here it always leaves out train_gpt.c's, which is not ours. */
#ifdef GPTC_NO_MAIN
#define GPTCU_MAIN 0
#else
#define GPTCU_MAIN 1
#define GPTC_NO_MAIN
#endif
#include "train_gpt.c"

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <sched.h>

#ifndef GPTC_NO_NCCL
#include <nccl.h>
#define GPU_HAVE_NCCL 1
#else
/* Built without NCCL (the Makefile found none and said so: -DGPTC_NO_NCCL).
 * These stand in for the NCCL names G1 and G6 use, so that the one-GPU
 * trainer compiles and links. Nothing should reach them: gpu_options_problem
 * and gpu_comm_init refuse --init, several ranks and --zero 1|2 first; if one
 * is reached all the same, it fails through NCCL_CHECK with the reason. */
#define GPU_HAVE_NCCL 0
#define GPU_NO_NCCL_HINT                                                                                       \
    "this build has no NCCL (make said \"NCCL not found\"): install it (apt-get install libnccl-dev, or pip " \
    "install nvidia-nccl-cu13, or set NCCL_HOME=/path/to/nccl) and rebuild (make train_gpt_cu)"
typedef struct ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5 } ncclResult_t;
typedef enum { ncclUint8, ncclUint64, ncclFloat, ncclFloat64, ncclBfloat16 } ncclDataType_t;
typedef enum { ncclSum } ncclRedOp_t;
static const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not in this build"; }
static const char* ncclGetLastError(ncclComm_t) { return GPU_NO_NCCL_HINT; }
static ncclResult_t ncclGetVersion(int* v) { *v = 0; return ncclInvalidUsage; }
static ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInvalidUsage; }
static ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclInvalidUsage; }
static ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { return ncclInvalidUsage; }
static ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }
static ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInvalidUsage; }
static ncclResult_t ncclGroupStart(void) { return ncclInvalidUsage; }
static ncclResult_t ncclGroupEnd(void) { return ncclInvalidUsage; }
static ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                      cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return ncclInvalidUsage; }
#endif
/* ncclCommSplit (NCCL 2.18, 2023) builds the communicators per level (G6);
 * an older NCCL trains flat and refuses --hierarchical 1, saying why. */
#if GPU_HAVE_NCCL && defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define GPU_HAVE_SPLIT 1
#endif
#endif
#ifndef GPU_HAVE_SPLIT
#define GPU_HAVE_SPLIT 0
#endif

/* ------------------------------------------------------------------------ */
/* G1. Checked calls, host waits, device helpers                            */
/* ------------------------------------------------------------------------ */

#include "gptc/cuda/common.cuh" // CUDA_CHECK, CUBLAS_CHECK, KERNEL_CHECK, floatX, ceil_div, warp_sum, block_sum, Pack8

/* ncclGetLastError names the cause (a peer that vanished, a network error)
 * beyond the result code. The exit handler (G6) aborts the communicator, so
 * the other ranks do not wait forever in a collective this one left. */
#define NCCL_CHECK(call)                                                              \
    do {                                                                              \
        ncclResult_t nr_ = (call);                                                    \
        if (nr_ != ncclSuccess) {                                                     \
            fprintf(stderr, "error: %s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
                    ncclGetErrorString(nr_), ncclGetLastError(NULL));                 \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)


/* ---- The device-memory ledger (issue 14; not run on a GPU; checked on the
 * CPU execution layer) ----
 * Every cudaMalloc and cudaMallocHost of the trainer goes through gpu_alloc
 * and gpu_alloc_host, which record the bytes by component; gpu_memory_plan
 * (G4) predicts the same components from the same size functions the
 * allocators call, and --plan-check 1 compares the two byte for byte
 * (gpu_plan_check, G7). Pinned host memory is counted apart from the
 * device's (it is host RAM). What is left out: NCCL's and cuBLASLt's own
 * allocations (not ours to see; the memory check's headroom, G4). */
typedef enum {
    GMEM_PARAMS,      /* bf16 weights, whole (forward and backward read them): P */
    GMEM_MASTER,      /* fp32 master weights: P, the ZeRO shard S, none with --offload 1 */
    GMEM_GRADS,       /* fp32 gradients: P; under ZeRO the buckets and the shard's summed gradient */
    GMEM_ADAMW,       /* AdamW's m and v: P each, S each under ZeRO, none with --offload 1 */
    GMEM_ZERO,        /* ZeRO: the shard's updated bf16 weights (S) and the shard map */
    GMEM_ACTS,        /* the activations kept for backward (gpu_activation_sizes, per --recompute) */
    GMEM_SCRATCH,     /* one layer's gradients, the classifier's and reductions' partials, the recompute working set */
    GMEM_CUBLASLT,    /* cuBLASLt's workspace and the bias copy */
    GMEM_STEP_INPUTS, /* tokens, the encoder's chunk buffers, the update's values (gpu_step_input_sizes) */
    GMEM_COMM,        /* the communicator's scalar slots (sums, fingerprints) */
    GMEM_TRANSIENT,   /* freed before the call returns (gpu_bf16_to_host): 0 between calls */
    GMEM_DEVICE,      /* (the number of device components) */
    /* pinned host memory (cudaMallocHost) */
    GMEM_HOST_STEP_INPUTS = GMEM_DEVICE, /* StepInputs' host copy */
    GMEM_HOST_LOSSES,  /* the micro-batches' losses and the norm */
    GMEM_HOST_COMM,    /* the communicator's slots' host copy */
    GMEM_HOST_OFFLOAD, /* --offload 1: the gradients' host copy (P fp32) */
    GMEM_COMPONENTS
} GpuMemComponent;

static const char* const GMEM_NAMES[GMEM_COMPONENTS] = {
    "bf16 weights", "fp32 master", "fp32 gradients", "AdamW moments", "ZeRO shard", "activations", "scratch",
    "cuBLASLt", "step inputs", "communicator", "transient",
    "pinned: step inputs", "pinned: losses", "pinned: communicator", "pinned: offload gradients"};

#define GPU_LEDGER_ENTRIES 64 /* live allocations at most (a run holds about 20) */
typedef struct {
    struct { const void* p; size_t bytes; int component; } live[GPU_LEDGER_ENTRIES];
    int num_live;
    size_t now[GMEM_COMPONENTS]; /* bytes held now, by component */
    size_t device, device_peak;  /* device bytes held now, and the most ever held at once */
} GpuLedger;

static GpuLedger gpu_ledger;

static void gpu_ledger_add(const void* p, size_t bytes, int component) {
    GpuLedger* l = &gpu_ledger;
    CHECK(l->num_live < GPU_LEDGER_ENTRIES, "gpu_ledger: more than %d live allocations: raise GPU_LEDGER_ENTRIES",
          GPU_LEDGER_ENTRIES);
    l->live[l->num_live].p = p;
    l->live[l->num_live].bytes = bytes;
    l->live[l->num_live].component = component;
    l->num_live++;
    l->now[component] += bytes;
    if (component < GMEM_DEVICE) {
        l->device += bytes;
        if (l->device > l->device_peak) l->device_peak = l->device;
    }
}

static void gpu_ledger_drop(const void* p) {
    GpuLedger* l = &gpu_ledger;
    for (int i = 0; i < l->num_live; i++) {
        if (l->live[i].p != p) continue;
        l->now[l->live[i].component] -= l->live[i].bytes;
        if (l->live[i].component < GMEM_DEVICE) l->device -= l->live[i].bytes;
        l->live[i] = l->live[--l->num_live];
        return;
    }
    CHECK(0, "gpu_ledger: %p was not allocated through gpu_alloc / gpu_alloc_host", p);
}

/* cudaMalloc of `bytes` for `component`, recorded (NULL for 0 bytes). */
static void* gpu_alloc(size_t bytes, int component) {
    ALWAYS(component >= 0 && component < GMEM_DEVICE);
    if (bytes == 0) return NULL;
    void* p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    gpu_ledger_add(p, bytes, component);
    return p;
}
static void gpu_release(void* p) {
    if (!p) return;
    gpu_ledger_drop(p);
    CUDA_CHECK(cudaFree(p));
}
/* cudaMallocHost (pinned host memory), recorded. */
static void* gpu_alloc_host(size_t bytes, int component) {
    ALWAYS(component >= GMEM_DEVICE && component < GMEM_COMPONENTS);
    void* p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    gpu_ledger_add(p, bytes, component);
    return p;
}
static void gpu_release_host(void* p) {
    if (!p) return;
    gpu_ledger_drop(p);
    CUDA_CHECK(cudaFreeHost(p));
}

/* The communicator the host watches while it waits (G6 sets it; NULL with
 * one process), and how long a wait may last. File scope because the exit
 * handler (G6) needs the communicator too. */
static ncclComm_t gpu_watched_comm = NULL;
static double gpu_comm_timeout_s = 1800.0;

/* Wait on the host until the work queued on `stream` (or, when `event` is
 * given, up to that event) is done. Alone, a plain synchronize. With other
 * ranks, poll instead: if a peer died, the NCCL kernels queued before would
 * spin forever and a synchronize would never return; ncclCommGetAsyncError
 * reports the broken connection, and a wait longer than --comm-timeout is
 * taken for a hung peer. Either ends the process (the exit handler aborts
 * the communicator, so the failure spreads instead of hanging). */
static void gpu_wait(cudaStream_t stream, cudaEvent_t event) {
    if (!gpu_watched_comm) {
        if (event) CUDA_CHECK(cudaEventSynchronize(event));
        else CUDA_CHECK(cudaStreamSynchronize(stream));
        return;
    }
    double t0 = time_ms();
    for (;;) {
        cudaError_t st = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (st == cudaSuccess) return;
        if (st != cudaErrorNotReady) CUDA_CHECK(st);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(gpu_watched_comm, &async));
        if (async != ncclSuccess) {
            fprintf(stderr, "error: NCCL reports %s (%s): another rank failed or the network broke; stopping\n",
                    ncclGetErrorString(async), ncclGetLastError(NULL));
            exit(EXIT_FAILURE);
        }
        if (time_ms() - t0 > gpu_comm_timeout_s * 1000.0) {
            fprintf(stderr, "error: the GPU made no progress for %.0f s while waiting on a collective: another rank "
                    "hangs or died without a word; stopping (--comm-timeout sets the limit)\n", gpu_comm_timeout_s);
            exit(EXIT_FAILURE);
        }
        sched_yield();
    }
}

/* The kernels, by family (gptc/cuda/): each mirrors the train_gpt.c layer
 * function of the same stem; launchers are `name_gpu`. */
#include "gptc/cuda/encoder.cuh"    // encoder_forward_gpu, encoder_backward_wte_gpu, EncoderChunks
#include "gptc/cuda/layernorm.cuh"  // layernorm_forward_gpu, layernorm_backward_gpu, bias_backward_gpu
#include "gptc/cuda/attention.cuh"  // attention_forward_gpu, attention_backward_gpu
#include "gptc/cuda/gelu.cuh"       // gelu_forward_gpu, gelu_backward_gpu
#include "gptc/cuda/classifier.cuh" // classifier_gpu, mean_kernel
#include "gptc/cuda/adamw.cuh"      // AdamWStep, adamw_kernel, update_gate_kernel, the norm, bf16 conversions
#include "gptc/cuda/shard.cuh"      // ShardMap, shard packing, adamw_shard_kernel, segments_copy_gpu
#include "gptc/cuda/quant.cuh"      // quant_encode_gpu, qwz_decode_kernel, qgz_hop0/1_kernel
#include "gptc/cuda/matmul.cuh"     // LtContext, lt_init, lt_free, matmul_forward_gpu, matmul_backward_gpu

/* ------------------------------------------------------------------------ */
/* G4. The model on the GPU                                                 */
/* ------------------------------------------------------------------------ */

/* The 16 parameter tensors in bf16, carved like train_gpt.c's ParameterTensors. */
typedef struct {
    floatX *wte, *wpe, *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    floatX *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb, *lnfw, *lnfb;
} ParameterTensorsX;
static_assert(sizeof(ParameterTensorsX) == NUM_PARAMETER_TENSORS * sizeof(floatX*),
              "ParameterTensorsX must hold the 16 tensors of the table");

static void parameters_point_x(ParameterTensorsX* p, floatX* mem, const GPT2Config* c) {
    parameters_point_bytes((void**)p, (char*)mem, sizeof(floatX), c);
}

/* Activations kept from forward for backward. Same names and layouts as
 * train_gpt.c's ActivationTensors; `pre`-GELU is fch. The size table gives
 * elements and element bytes; one cudaMalloc, carved in order. The shapes
 * are those of --recompute 0; a higher level keeps fewer per-layer tensors
 * (NULL here) and recomputes them into one layer's working set
 * (gpu_activation_sizes, gpu_layer_acts). */
#define NUM_GPU_ACTIVATIONS 19
typedef struct {
    floatX* encoded;   /* (B, T, C) */
    floatX* ln1;       /* (L, B, T, C) */
    float* ln1_mean;   /* (L, B, T) */
    float* ln1_rstd;   /* (L, B, T) */
    floatX* qkv;       /* (L, B, T, 3C) */
    floatX* atty;      /* (L, B, T, C) */
    float* lse;        /* (L, B, NH, T) log-sum-exp of each attention row (flash attention keeps only this) */
    floatX* residual2; /* (L, B, T, C) */
    floatX* ln2;       /* (L, B, T, C) */
    float* ln2_mean;   /* (L, B, T) */
    float* ln2_rstd;   /* (L, B, T) */
    floatX* fch;       /* (L, B, T, 4C) before GELU */
    floatX* fch_gelu;  /* (L, B, T, 4C) */
    floatX* residual3; /* (L, B, T, C) */
    floatX* lnf;       /* (B, T, C) */
    float* lnf_mean;   /* (B, T) */
    float* lnf_rstd;   /* (B, T) */
    floatX* logits;    /* (B, T, Vp) logits, then dlogits in place */
    float* losses;     /* (B, T) */
} GpuActivations;
static_assert(sizeof(GpuActivations) == NUM_GPU_ACTIVATIONS * sizeof(void*), "GpuActivations must match its table");

/* Scratch, one layer at a time (forward and backward). */
#define NUM_GPU_SCRATCH 10
typedef struct {
    floatX* dresidual; /* (B, T, C) */
    floatX* dbt_c;     /* (B, T, C) */
    floatX* dqkv;      /* (B, T, 3C) */
    floatX* dfch;      /* (B, T, 4C) */
    float* attn_d;     /* (B, NH, T) attention backward's D = rowsum(dO * O) */
    float* part;       /* column-sum partials: bias (splits, 4C), LayerNorm (2, blocks, C) */
    float* loss_mean;  /* (max micro-batches) mean loss of each micro-batch */
    float* norm;       /* NORM_BLOCKS + 1: partials, then the norm */
    float* enc_partial; /* (encoder_max_partials(B*T), C) the encoder backward's partial sums of frequent tokens */
    void* work;        /* one layer's working set of the recomputed activations (gpu_layer_work_sizes), carved
                          as GpuGPT2's `work`; empty at --recompute 0 */
} GpuScratch;
static_assert(sizeof(GpuScratch) == NUM_GPU_SCRATCH * sizeof(void*), "GpuScratch must match its table");

#define MAX_MICRO_STEPS 4096 /* loss_mean slots; grad_accum is checked against it */

/* Recomputation (--recompute N; not yet run on a GPU). Backward reads each
 * layer's activations; a level keeps fewer of them from the forward and
 * recomputes the rest, layer by layer in backward, into one layer's working
 * set (the scratch's `work`, carved as GpuGPT2's `work`):
 *   level  keeps per layer                       recomputes in backward
 *   0      all 13 per-layer tensors              nothing
 *   1      all but fch_gelu                      fch_gelu = GELU(fch)
 *   2      all but fch_gelu, ln1, ln2            + ln1, ln2 (LayerNorm again)
 *   3      residual3 only (the next layer's      the layer's forward but its last
 *          input, so each layer's input)         GEMM (fcproj, whose output is kept)
 * Level 1 keeps fch (GELU's input) and drops fch_gelu: backward needs both
 * (fch for GELU's derivative, fch_gelu for fcprojw's gradient), and
 * fch_gelu = GELU(fch) is one elementwise pass, while fch from fch_gelu is
 * not to be had (GELU is not one-to-one below its minimum) but by the fc
 * GEMM again (8 B T C^2 flops). Level 2 drops the LayerNorm outputs, whose
 * inputs (the layer's input, residual2) are kept; level 3 everything but the
 * residual stream, as the issue's goal: about B T C bf16 per layer.
 * Bitwise the same at every level: a recompute runs the kernel the forward
 * ran on the same inputs (gpu_layer_forward is both), LayerNorm included:
 * it runs layernorm_forward_gpu again, writing the kept mean and rstd with
 * the same bits, rather than a second kernel that would apply them. The
 * exception would be the GELU of the cuBLASLt epilogue (--gelu-fusion 1),
 * which is cuBLASLt's arithmetic and not our elementwise kernel's: so at
 * levels 1 and 2 the forward's GELU is our kernel, whatever --gelu-fusion
 * says (gpu_gelu_in_epilogue; the backward's DGELU epilogue stays, its
 * input fch is kept), and level 3 reruns the fc GEMM, epilogue and all.
 * Levels 0 and 3 are therefore bitwise the same under either --gelu-fusion;
 * 1 and 2 equal them with --gelu-fusion 0, and each other always. (On a
 * GPU that also takes cuBLASLt choosing the same algorithm for a GEMM on
 * the working set as on a layer's slice: lt_matmul's key has the pointers'
 * alignment, 256 for the working set and for every slice when B T C is a
 * multiple of 128, as for GPT-2 at any B and T = 1024.) */
#define RECOMPUTE_LEVELS 4
#define GPU_ACTS_LAYER_BEGIN 1 /* ln1 */
#define GPU_ACTS_LAYER_END 14  /* one past residual3 */
static const char* const GPU_ACTIVATION_NAMES[NUM_GPU_ACTIVATIONS] = {
    "encoded", "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "lse", "residual2", "ln2", "ln2_mean",
    "ln2_rstd", "fch", "fch_gelu", "residual3", "lnf", "lnf_mean", "lnf_rstd", "logits", "losses"};
/* The level from which activation i is recomputed instead of kept (4: kept at every level). */
static const int GPU_ACT_RECOMPUTED_FROM[NUM_GPU_ACTIVATIONS] = {
    4, 2, 3, 3, 3, 3, 3, 3, 2, 3, 3, 3, 1, 4, 4, 4, 4, 4, 4};

static int gpu_act_kept(int i, int recompute) { return recompute < GPU_ACT_RECOMPUTED_FROM[i]; }

/* The activations kept at level `recompute` (elements, element bytes): a
 * per-layer tensor recomputed at that level has 0 elements here and one
 * layer's in gpu_layer_work_sizes. */
static void gpu_activation_sizes(size_t n[NUM_GPU_ACTIVATIONS], size_t bytes[NUM_GPU_ACTIVATIONS],
                                 const GPT2Config* c, int B, int T, int recompute) {
    size_t C = c->channels, L = c->num_layers, NH = c->num_heads, Vp = c->padded_vocab_size, BT = (size_t)B * T;
    size_t e[NUM_GPU_ACTIVATIONS] = {BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C,
                                     L * B * NH * T, L * BT * C, L * BT * C, L * BT, L * BT,
                                     L * BT * 4 * C, L * BT * 4 * C, L * BT * C, BT * C, BT, BT, BT * Vp, BT};
    int is_float[NUM_GPU_ACTIVATIONS] = {0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1};
    for (int i = 0; i < NUM_GPU_ACTIVATIONS; i++) {
        n[i] = gpu_act_kept(i, recompute) ? e[i] : 0;
        bytes[i] = is_float[i] ? 4 : 2;
    }
}

/* One layer's working set of what level `recompute` does not keep: the
 * per-layer tensors gpu_activation_sizes leaves out, one layer of each. */
static void gpu_layer_work_sizes(size_t n[NUM_GPU_ACTIVATIONS], size_t bytes[NUM_GPU_ACTIVATIONS],
                                 const GPT2Config* c, int B, int T, int recompute) {
    gpu_activation_sizes(n, bytes, c, B, T, 0);
    for (int i = 0; i < NUM_GPU_ACTIVATIONS; i++)
        n[i] = gpu_act_kept(i, recompute) ? 0 : n[i] / (size_t)c->num_layers;
}

static size_t carve_bytes(const size_t* n, const size_t* bytes, int count);

static void gpu_scratch_sizes(size_t n[NUM_GPU_SCRATCH], size_t bytes[NUM_GPU_SCRATCH], const GPT2Config* c,
                              int B, int T, int recompute) {
    size_t C = c->channels, NH = c->num_heads, BT = (size_t)B * T;
    /* column-sum partials: bias gradients (OC up to 4C) and LayerNorm's */
    size_t colsum_part = (size_t)column_sums_splits((int)BT) * 4 * C;
    if (layernorm_backward_scratch_floats((int)BT, (int)C) > colsum_part)
        colsum_part = layernorm_backward_scratch_floats((int)BT, (int)C);
    size_t wn[NUM_GPU_ACTIVATIONS], wb[NUM_GPU_ACTIVATIONS];
    gpu_layer_work_sizes(wn, wb, c, B, T, recompute);
    size_t e[NUM_GPU_SCRATCH] = {BT * C, BT * C, BT * 3 * C, BT * 4 * C, (size_t)B * NH * T,
                                 colsum_part, MAX_MICRO_STEPS, NORM_BLOCKS + 1,
                                 (size_t)encoder_max_partials((int)BT) * C, carve_bytes(wn, wb, NUM_GPU_ACTIVATIONS)};
    int elem_bytes[NUM_GPU_SCRATCH] = {2, 2, 2, 2, 4, 4, 4, 4, 4, 1};
    for (int i = 0; i < NUM_GPU_SCRATCH; i++) {
        n[i] = e[i];
        bytes[i] = elem_bytes[i];
    }
}

/* Bytes of a table carved with 256-byte alignment per tensor. */
static size_t carve_bytes(const size_t* n, const size_t* bytes, int count) {
    size_t total = 0;
    for (int i = 0; i < count; i++) total += (n[i] * bytes[i] + 255) & ~(size_t)255;
    return total;
}
static void carve(void** ptrs, char* mem, const size_t* n, const size_t* bytes, int count) {
    for (int i = 0; i < count; i++) {
        ptrs[i] = n[i] ? mem : NULL; /* (an empty tensor: NULL, never an alias of the next) */
        mem += (n[i] * bytes[i] + 255) & ~(size_t)255;
    }
}

/* Host memory the device reads each micro-batch (pinned, so the copies are
 * asynchronous): tokens and the encoder's chunks with their counts; and
 * each step, the update's values. `copied` is recorded after the token
 * copies; the host waits on it before refilling. */
typedef struct {
    int* inputs;       /* (B*T) */
    int* targets;      /* (B*T) */
    EncoderChunks enc; /* NUM_ENCODER_CHUNKS tensors: encoder_backward_wte_gpu's chunks (sizes: gpu_step_input_sizes) */
    int* micro;        /* (1) the micro-batch: the slot of scratch.loss_mean its mean loss goes to */
    AdamWStep* update; /* (1) this step's learning rate, bias corrections, seed, and go-ahead */
} StepInputs;
#define NUM_STEP_INPUTS (4 + NUM_ENCODER_CHUNKS)
static_assert(sizeof(StepInputs) == NUM_STEP_INPUTS * sizeof(void*), "StepInputs must match its table");

/* StepInputs' table (elements, element bytes), in its order; carved alike
 * in pinned host memory and on the device. */
static void gpu_step_input_sizes(size_t n[NUM_STEP_INPUTS], size_t bytes[NUM_STEP_INPUTS], int B, int T, int V) {
    int BT = B * T;
    size_t mc = (size_t)encoder_max_chunks(BT, V), ml = (size_t)encoder_max_long(BT);
    /* inputs, targets; bucket_pos, chunk_start, chunk_token, chunk_slot, long_token, long_slot, num_chunks,
     * num_long; micro, update */
    size_t e[NUM_STEP_INPUTS] = {(size_t)BT, (size_t)BT, (size_t)BT, mc + 1, mc, mc, ml, ml + 1, 1, 1, 1, 1};
    for (int i = 0; i < NUM_STEP_INPUTS; i++) {
        n[i] = e[i];
        bytes[i] = i == NUM_STEP_INPUTS - 1 ? sizeof(AdamWStep) : sizeof(int);
    }
}

/* What a captured micro-batch (forward + backward) was captured with: a
 * replay does exactly the same. */
typedef struct {
    int B, T;
    float dloss;
} MicroBatchShape;

/* ... and a captured update (the values that change per step are on the device: AdamWStep). */
typedef struct {
    const AdamWConfig* opt;
    float max_norm;
    int micro_batches;
} UpdateShape;

typedef struct {
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    int B, T;
    int gelu_fusion;         /* 1: GELU in the cuBLASLt epilogues; 0: own kernels */
    int recompute;           /* --recompute: 0..3, what backward recomputes (above gpu_activation_sizes) */
    cudaStream_t stream;
    LtContext lt;
    /* model state: 18 bytes per parameter (under ZeRO only the bf16 weights
     * are whole here; G6 holds the gradients and the shard of the rest) */
    ParameterTensorsX params; floatX* params_memory; /* bf16 copy used by forward/backward */
    ParameterTensors grads; float* grads_memory;     /* fp32, accumulated over micro-batches */
    float* master_memory;                            /* fp32 master weights */
    float* m_memory;
    float* v_memory;
    /* data parallelism (G6); all NULL with one GPU */
    float** grad_buckets;                            /* (L) where backward writes layer l's gradients, packed
                                                        (gpu_layer_grads); NULL: in the flat buffer */
    void (*grads_begin)(void* ctx, int bucket);      /* before backward writes a bucket's gradients: layer l, */
    void (*grads_end)(void* ctx, int bucket);        /* or L for wte, wpe, lnfw, lnfb; and once they are final */
    void* grads_ctx;
    /* ZeRO-3 (G6): the weights gathered where they are used (ctx: grads_ctx); NULL: whole in params_memory */
    void (*weights_begin)(void* ctx, int backward);                 /* a forward (the head, layer 0) or a backward
                                                                       (layer L-1) begins */
    const floatX* (*layer_weights)(void* ctx, int l, int backward); /* layer l's 12 slices, packed (G2), gathered:
                                                                       the compute stream waits for them */
    /* activations and scratch */
    GpuActivations acts; void* acts_memory; size_t acts_bytes;
    GpuScratch scratch; void* scratch_memory; size_t scratch_bytes;
    GpuActivations work;   /* one layer of what `recompute` does not keep, carved from scratch.work; the rest NULL */
    /* tokens: pinned host copies and device copies */
    StepInputs host, dev;
    int* bucket_count;     /* (V) host scratch for the counting sort */
    int* bucket_token;     /* (B*T) host: its distinct tokens, ascending */
    int* bucket_start;     /* (B*T + 1) host: where each token's positions start in bucket_pos */
    int num_buckets;
    cudaEvent_t copied;
    cudaEvent_t update_sent; /* recorded after each update: its values (host.update) have been copied */
    /* CUDA graphs (--cuda-graphs 1; one GPU, no spike rule): a training
     * micro-batch's forward + backward, and the update, each captured the
     * first time it runs with `graphs` set (gpu_train sets it after the
     * first step), replayed after; the shapes they were captured with */
    int graphs;
    cudaGraphExec_t graph_micro, graph_update;
    MicroBatchShape graph_micro_shape;
    UpdateShape graph_update_shape;
    /* --offload 1 (G4, the optimizer offload): the fp32 master and the moments are the host model's own
     * arrays, pinned, updated by train_gpt.c's AdamW; NULL / 0 without it */
    int offload;
    GPT2* off_host;          /* params_memory (the master), m_memory, v_memory (P each), cudaHostRegister'ed */
    struct GpuOffload* off;  /* its streams, pieces and events (the optimizer offload's section) */
    /* the last forward */
    int last_B, last_T, has_targets, micro;
    float* h_loss_mean;    /* pinned (MAX_MICRO_STEPS + 1): the micro-batches' losses, then the norm */
} GpuGPT2;

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* Hopper's kernels want up to 32 MB */
#define LT_BIAS_COPY_ELEMS(c) ((size_t)4 * (c)->channels) /* the longest bias, fcb (4C) */

/* ---- The memory plan (issue 14: the device's bytes by component, computed
 * with the size functions the allocators call, so plan and allocation cannot
 * drift; --plan-check 1 proves them equal against the ledger, G1; not run on
 * a GPU; checked on the CPU execution layer, scripts/test_gpu_plan.sh) ---- */

#define DP_SCALARS 16 /* the communicator's 8-byte slots for sums; 3 W more for the fingerprints */
static size_t gpu_comm_slots(int world) { return DP_SCALARS + 3 * (size_t)world; }

/* What the plan holds and what it leaves out. In: every buffer of ours (G1's
 * components). Zero by construction: snapshots (the host model's arrays,
 * cudaHostRegister'ed, and under ZeRO the gradient buckets as staging, free
 * between steps), --gelu-fusion (its epilogue's aux output is fch, an
 * activation), --cuda-graphs (no buffers of ours; the graphs' own memory is
 * the driver's). Out, beside the plan in the start-up check's headroom:
 * NCCL's channel buffers and cuBLASLt's and the CUDA context's own memory,
 * which we do not allocate (memory_headroom_print says what is measured and
 * what is an allowance); the offloaded master and moments are host memory
 * (`offloaded`, the host model's arrays, pinned). */

/* What the device memory depends on, for one rank (the model aside). */
typedef struct {
    int B, T;
    int recompute;     /* --recompute 0..3 */
    int zero;          /* --zero 0..3 */
    int rank, world;
    int comm;          /* an NCCL communicator: several ranks, or ZeRO even on one (gpu_comm_init) */
    int offload;       /* --offload 1: master weights and moments in pinned host memory (G8) */
    int qwz, qgz, feedback, hpz, block, nodes; /* ZeRO++ on --zero 3 (gpu_zeropp_sizes); nodes: gpu_levels_init's */
} GpuPlanKnobs;

/* ZeRO's per-rank sizes (dp_layout's): S, the shard's elements, and the
 * gradient buckets' floats (ZeRO-1: all L + 1 buckets padded; ZeRO-2 and 3
 * two layer slots and the rest's bucket; 0 without ZeRO). */
static void dp_sizes(const GPT2Config* c, int zero, int rank, int world, ShardMap* map, size_t* shard,
                     size_t* grad_floats) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    shard_map_init(map, sizes, c->num_layers, rank, world);
    *shard = shard_map_elements(map);
    *grad_floats = zero == 1 ? *shard * (size_t)world
                 : zero >= 2 ? (2 * map->layer.piece + map->rest.piece) * (size_t)world : 0;
}

/* ZeRO++'s device buffers on a rank (issue 15; gpu_zeropp_init allocates
 * them, the memory plan counts them: both call this). Every piece of a
 * bucket has the same length (the layer's or the rest's piece), so a slot
 * is the same size on every rank: sb = quant_slot_bytes(piece) (gptc/quant.h).
 *   slot_of, who  (W ints each) the place of rank q's slot in (local, node)
 *                 order, and its inverse;
 *   send, recv    (W sb bytes each, sb of the larger piece in INT8): qwZ's
 *                 gathered slots (send only), qgZ's outgoing and incoming;
 *   partial       qgZ (N piece floats): hop 0's N partial sums;
 *   secondary     hpZ (N S bf16): this local index's part of every bucket;
 *   residual      --qgz-feedback ((W + N) S floats): hop 0's by (rank, place
 *                 in the shard), hop 1's by (node, place in the shard). */
typedef struct {
    size_t slots, partial, secondary, residual, ints; /* bytes each send/recv buffer; floats; bf16; floats; ints */
    int slot_buffers;                                  /* 0, 1 (qwZ) or 2 (qgZ) */
} GpuZeroPPSizes;

static GpuZeroPPSizes gpu_zeropp_sizes(const ShardMap* map, size_t S, int W, int N, int qwz, int qgz, int feedback,
                                       int hpz, int block) {
    GpuZeroPPSizes z;
    memset(&z, 0, sizeof(z));
    if (!(qwz || qgz || hpz)) return z;
    size_t most = map->layer.piece > map->rest.piece ? map->layer.piece : map->rest.piece;
    z.ints = 2 * (size_t)W;
    z.slot_buffers = qgz ? 2 : qwz ? 1 : 0;
    z.slots = z.slot_buffers ? (size_t)W * quant_slot_bytes(most, 8, block) : 0;
    z.partial = qgz ? (size_t)N * most : 0;
    z.secondary = hpz ? (size_t)N * S : 0;
    z.residual = feedback ? (size_t)(W + N) * S : 0;
    return z;
}

static size_t gpu_zeropp_bytes(const GpuZeroPPSizes* z) {
    return z->ints * sizeof(int) + (size_t)z->slot_buffers * z->slots + z->partial * sizeof(float) +
           z->secondary * sizeof(floatX) + z->residual * sizeof(float);
}

/* The bf16 weights on the device (GpuGPT2's params_memory): all P, or under
 * ZeRO-3 the gathered head (the rest's bucket, padded) and two gathered
 * layers (G6: the bucket layout, W pieces each). */
static size_t dp_weight_elems(const ShardMap* map, int zero, size_t P) {
    return zero == 3 ? (map->rest.piece + 2 * map->layer.piece) * (size_t)map->world : P;
}

/* What the plan says, in bytes, before allocating. */
typedef struct {
    size_t bytes[GMEM_COMPONENTS]; /* by component (G1's names); device ones first, then pinned host */
    size_t attention; /* of the activations: flash attention's log-sum-exp, all it keeps (L, B, NH, T) */
    int recompute;    /* the level planned (--recompute) */
    size_t work;      /* of the scratch: one layer's working set of what that level recomputes */
    size_t activations_at[RECOMPUTE_LEVELS]; /* the activations each level would keep, to compare */
    size_t offloaded; /* --offload 1: the host's fp32 master and moments (12 P; the host model's own arrays, pinned) */
} MemoryPlan;

static MemoryPlan gpu_memory_plan_for(const GPT2Config* c, const GpuPlanKnobs* k) {
    MemoryPlan p;
    memset(&p, 0, sizeof(p));
    int B = k->B, T = k->T, recompute = k->recompute;
    size_t P = parameter_count(c), n[32], bytes[32];
    /* the model state (gpu_model_init_with, dp_init): whole on one GPU or under --zero 0, else ZeRO's shard */
    p.bytes[GMEM_PARAMS] = P * sizeof(floatX);
    if (k->zero > 0 && k->comm) {
        ShardMap map;
        size_t S, grad_floats;
        dp_sizes(c, k->zero, k->rank, k->world, &map, &S, &grad_floats);
        p.bytes[GMEM_PARAMS] = dp_weight_elems(&map, k->zero, P) * sizeof(floatX); /* ZeRO-3: head + 2 layers */
        p.bytes[GMEM_MASTER] = S * sizeof(float);
        p.bytes[GMEM_GRADS] = (grad_floats + S) * sizeof(float); /* the buckets, and the shard's sum */
        p.bytes[GMEM_ADAMW] = 2 * S * sizeof(float);
        p.bytes[GMEM_ZERO] = S * sizeof(floatX) + sizeof(ShardMap);
        if (k->zero == 3) { /* ZeRO++'s buffers */
            GpuZeroPPSizes z = gpu_zeropp_sizes(&map, S, k->world, k->nodes, k->qwz, k->qgz, k->feedback, k->hpz,
                                                k->block);
            p.bytes[GMEM_ZERO] += gpu_zeropp_bytes(&z);
        }
    } else {
        p.bytes[GMEM_GRADS] = P * sizeof(float);
        if (k->offload) {
            p.bytes[GMEM_HOST_OFFLOAD] = P * sizeof(float);
            p.offloaded = 3 * P * sizeof(float);
        } else {
            p.bytes[GMEM_MASTER] = P * sizeof(float);
            p.bytes[GMEM_ADAMW] = 2 * P * sizeof(float);
        }
    }
    /* activations and scratch (gpu_model_init_with's tables) */
    p.recompute = recompute;
    for (int r = 0; r < RECOMPUTE_LEVELS; r++) {
        gpu_activation_sizes(n, bytes, c, B, T, r);
        p.activations_at[r] = carve_bytes(n, bytes, NUM_GPU_ACTIVATIONS);
    }
    gpu_activation_sizes(n, bytes, c, B, T, recompute);
    p.bytes[GMEM_ACTS] = carve_bytes(n, bytes, NUM_GPU_ACTIVATIONS);
    p.attention = n[6] * bytes[6]; /* lse (0 at level 3: recomputed with the layer) */
    gpu_scratch_sizes(n, bytes, c, B, T, recompute);
    p.bytes[GMEM_SCRATCH] = carve_bytes(n, bytes, NUM_GPU_SCRATCH);
    p.work = n[NUM_GPU_SCRATCH - 1];
    p.bytes[GMEM_CUBLASLT] = LT_WORKSPACE_BYTES + LT_BIAS_COPY_ELEMS(c) * sizeof(floatX); /* (lt_init) */
    gpu_step_input_sizes(n, bytes, B, T, c->vocab_size);
    p.bytes[GMEM_STEP_INPUTS] = p.bytes[GMEM_HOST_STEP_INPUTS] = carve_bytes(n, bytes, NUM_STEP_INPUTS);
    p.bytes[GMEM_HOST_LOSSES] = (MAX_MICRO_STEPS + 1) * sizeof(float);
    if (k->comm) p.bytes[GMEM_COMM] = p.bytes[GMEM_HOST_COMM] = gpu_comm_slots(k->world) * sizeof(uint64_t);
    return p;
}

/* One GPU, --zero 0 (test_gpt.cu's plans). */
[[maybe_unused]] static MemoryPlan gpu_memory_plan(const GPT2Config* c, int B, int T, int recompute) {
    GpuPlanKnobs k = {B, T, recompute, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    return gpu_memory_plan_for(c, &k);
}

/* Device bytes in the plan (pinned host memory apart). */
static size_t memory_plan_total(const MemoryPlan* p) {
    size_t t = 0;
    for (int i = 0; i < GMEM_DEVICE; i++) t += p->bytes[i];
    return t;
}
static size_t memory_plan_pinned(const MemoryPlan* p) {
    size_t t = 0;
    for (int i = GMEM_DEVICE; i < GMEM_COMPONENTS; i++) t += p->bytes[i];
    return t;
}

/* The names of the per-layer activations level r keeps (kept 1) or
 * recomputes (kept 0), comma separated into out. */
static void recompute_names(char* out, size_t cap, int r, int kept) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = GPU_ACTS_LAYER_BEGIN; i < GPU_ACTS_LAYER_END && at < cap; i++)
        if (gpu_act_kept(i, r) == kept)
            at += (size_t)snprintf(out + at, cap - at, "%s%s", at ? ", " : "", GPU_ACTIVATION_NAMES[i]);
    if (!out[0]) snprintf(out, cap, "nothing");
}

static void memory_plan_print(const MemoryPlan* p) {
    double mb = 1.0 / (1024.0 * 1024.0);
    char parts[1024];
    size_t at = 0;
    for (int i = 0; i < GMEM_DEVICE; i++)
        if (p->bytes[i] && at < sizeof(parts))
            at += (size_t)snprintf(parts + at, sizeof(parts) - at, "%s%s %.1f", at ? ", " : "", GMEM_NAMES[i],
                                   p->bytes[i] * mb);
    printf("memory plan (device MB): %s: total %.1f MB (attention keeps %.1f MB of row statistics, nothing T x T); "
           "pinned host %.1f MB%s\n", parts, memory_plan_total(p) * mb, p->attention * mb, memory_plan_pinned(p) * mb,
           p->offloaded ? " (+ the host's master weights and moments, pinned: --offload 1)" : "");
    char kept[256], redone[256];
    recompute_names(kept, sizeof(kept), p->recompute, 1);
    recompute_names(redone, sizeof(redone), p->recompute, 0);
    printf("recompute %d: activations at levels 0/1/2/3: %.0f / %.0f / %.0f / %.0f MB; level %d keeps per layer %s; "
           "recomputes in backward %s (into one layer's working set of %.0f MB, in the scratch): saves %.0f MB "
           "against level 0 (not yet run on a GPU)\n", p->recompute, p->activations_at[0] * mb,
           p->activations_at[1] * mb, p->activations_at[2] * mb, p->activations_at[3] * mb, p->recompute, kept,
           redone, p->work * mb, ((double)p->activations_at[0] - (double)p->bytes[GMEM_ACTS] - (double)p->work) * mb);
}

/* The start-up memory check. cudaMemGetInfo's free bytes are not all the
 * plan's: a run also takes memory it does not allocate itself, some of it
 * only once it is running. So the plan must fit with a headroom to spare:
 *   measured at start: the free bytes before and after building the NCCL
 *     communicator (gpu_comm_init), and around a cuBLASLt handle and a
 *     stream made and destroyed again (gpu_memory_headroom);
 *   an allowance for what loads later:
 *     GPU_LAZY_ALLOWANCE_MB for kernels: CUDA loads each module on first use
 *     (lazy loading, the default on Linux since CUDA 12.2), so the first step
 *     takes device memory for the code of every kernel it runs, cuBLASLt's
 *     included. The figure: PyTorch measured its CUDA context at 667 MB with
 *     every kernel loaded eagerly and 287 MB lazily (pytorch/pytorch#86509),
 *     so ~380 MB of a CUDA library stack's kernels may come later;
 *     GPU_NCCL_ALLOWANCE_MB more with a communicator: NCCL may connect its
 *     channels at the first collectives rather than at init, each channel
 *     with buffers of NCCL_BUFFSIZE (4 MiB by default) per peer and
 *     direction; 32 channels x 2 directions x 4 MiB = 256 MB; as much
 *     again for each communicator per level (--hierarchical 1: two more).
 * Both are estimates from those sources, not measured here: unverified on
 * hardware (the run prints what cudaMemGetInfo says it took, to compare). */
#define GPU_LAZY_ALLOWANCE_MB 384
#define GPU_NCCL_ALLOWANCE_MB 256

typedef struct {
    size_t comm;      /* measured: the NCCL communicator (0 without one) */
    size_t handles;   /* measured: a cuBLASLt handle and a stream */
    size_t allowance; /* for what loads lazily (above) */
} MemoryHeadroom;

/* comms: the NCCL communicators this rank holds (gpu_comm_count; 0 or 1 but for --hierarchical 1) */
static size_t memory_allowance(int comms) {
    return ((size_t)GPU_LAZY_ALLOWANCE_MB + (size_t)comms * (size_t)GPU_NCCL_ALLOWANCE_MB) << 20;
}

static size_t memory_headroom_total(const MemoryHeadroom* h) { return h->comm + h->handles + h->allowance; }

static void memory_headroom_print(const MemoryHeadroom* h) {
    double mb = 1.0 / (1024.0 * 1024.0);
    printf("memory headroom: %.0f MB = measured at start %.0f MB (NCCL communicator %.0f MB, cuBLASLt handle and "
           "stream %.0f MB) + allowance %.0f MB for what loads lazily (kernels on first use%s; estimates, unverified "
           "on hardware)\n", memory_headroom_total(h) * mb, (h->comm + h->handles) * mb, h->comm * mb, h->handles * mb,
           h->allowance * mb, h->allowance > memory_allowance(0) ? ", NCCL's channel buffers" : "");
}

/* The verdict: does a plan of `plan` bytes fit in `free_bytes` (free before
 * the communicator and the handles) with `headroom` to spare? 1 or 0, and
 * `msg` says the figures either way. */
static int memory_check(size_t plan, size_t free_bytes, size_t headroom, char* msg, size_t cap) {
    double mb = 1.0 / (1024.0 * 1024.0);
    int fits = plan <= free_bytes && headroom <= free_bytes - plan;
    if (fits)
        snprintf(msg, cap, "memory check: plan %.0f MB + headroom %.0f MB of %.0f MB free: fits, %.0f MB to spare",
                 plan * mb, headroom * mb, free_bytes * mb, (free_bytes - plan - headroom) * mb);
    else
        snprintf(msg, cap, "the plan needs %.0f MB and a headroom of %.0f MB (NCCL, cuBLASLt, kernels loaded on first "
                 "use) = %.0f MB, the GPU has %.0f MB free", plan * mb, headroom * mb,
                 ((double)plan + (double)headroom) * mb, free_bytes * mb);
    return fits;
}


/* The seed of step `step`'s (0-based) stochastic rounding: gpu_train's
 * update passes it, and gpu_weights_upload re-derives that update's bf16
 * weights with it. */
static uint32_t gpu_update_seed(int seed, int step) { return (uint32_t)seed * 1000003u + (uint32_t)step; }

/* --offload 1 (the optimizer offload's section, below): the host waits until the last update has written the
 * host arrays and the device's weights; stream s waits for update piece `piece` (0 the encoder's weights, 1 + l
 * layer l's, L + 1 the final layernorm's, -1 the last); after an update the gradients are zeroed already
 * (returns 1, once). Each does nothing without --offload. */
static void gpu_offload_sync(const GpuGPT2* g);
static void gpu_offload_wait(const GpuGPT2* g, cudaStream_t s, int piece);
static int gpu_offload_grads_zeroed(GpuGPT2* g);

/* The host's fp32 weights (P) into the device's master weights, and when
 * given the AdamW moments into m and v (one GPU or --zero 0: the whole
 * state here), then the bf16 copy from the master: rounded to nearest for
 * fresh weights (`update` < 0), or stochastically as update `update`
 * (0-based step of the run with --seed `run_seed`) rounded what it wrote,
 * so that after a resume or a rollback the bf16 weights are the very ones
 * the uninterrupted run had. Waits until the copies are done. */
static void gpu_weights_upload(GpuGPT2* g, const float* params, const float* m, const float* v, int run_seed,
                               int update) {
    size_t P = g->num_parameters;
    uint32_t seed = update < 0 ? 0u : gpu_update_seed(run_seed, update);
    /* --offload 1: the master stays on the host (its arrays take params, m, v), staged on the device in the
     * gradient buffer (free between steps, zeroed again below) for the rounding */
    float* master = g->offload ? g->grads_memory : g->master_memory;
    ALWAYS(master != NULL);
    if (g->offload) {
        GPT2* h = g->off_host;
        gpu_wait(g->stream, NULL); /* (no copy-back in flight from the host arrays) */
        gpu_offload_sync(g);       /* (nor an update's host AdamW or its copies) */
        if (params != h->params_memory) memcpy(h->params_memory, params, P * sizeof(float));
        if (m && m != h->m_memory) memcpy(h->m_memory, m, P * sizeof(float));
        if (v && v != h->v_memory) memcpy(h->v_memory, v, P * sizeof(float));
    } else {
        if (m) CUDA_CHECK(cudaMemcpyAsync(g->m_memory, m, P * sizeof(float), cudaMemcpyHostToDevice, g->stream));
        if (v) CUDA_CHECK(cudaMemcpyAsync(g->v_memory, v, P * sizeof(float), cudaMemcpyHostToDevice, g->stream));
    }
    CUDA_CHECK(cudaMemcpyAsync(master, params, P * sizeof(float), cudaMemcpyHostToDevice, g->stream));
    if (update < 0) {
        float_to_bf16_kernel<<<ceil_div((long long)P, 256), 256, 0, g->stream>>>(g->params_memory, master, P);
        KERNEL_CHECK();
    } else {
        size_t offset = 0; /* tensor by tensor, with adamw_kernel's seeds (gpu_adamw_update) */
        for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
            size_t n = g->param_sizes[k];
            bf16_round_stochastic_kernel<<<ceil_div((long long)n, 256), 256, 0, g->stream>>>(
                g->params_memory + offset, master + offset, n, seed * 16u + (uint32_t)k);
            KERNEL_CHECK();
            offset += n;
        }
    }
    if (g->offload) CUDA_CHECK(cudaMemsetAsync(g->grads_memory, 0, P * sizeof(float), g->stream));
    gpu_wait(g->stream, NULL); /* the host arrays may change once this returns */
}

/* Copy the host model's fp32 parameters to the GPU (master, and bf16 by
 * rounding to nearest) and allocate everything training B x T needs. With
 * full_state 0 (ZeRO, G6) the bf16 weights are allocated but not filled, and
 * the rest is left to the data-parallel setup (dp_init): the gradients, and
 * this rank's shard of the master weights and moments. */
static void gpu_offload_init(GpuGPT2* g, GPT2* host);

static void gpu_model_init_with(GpuGPT2* g, const GPT2* host, int B, int T, int gelu_fusion, int recompute,
                                int full_state, int offload, size_t weight_elems) {
    memset(g, 0, sizeof(*g));
    g->config = host->config;
    memcpy(g->param_sizes, host->param_sizes, sizeof(g->param_sizes));
    g->num_parameters = host->num_parameters;
    g->B = B;
    g->T = T;
    const GPT2Config* c = &g->config;
    CHECK(T <= c->max_seq_len, "T=%d exceeds the model's max_seq_len %d", T, c->max_seq_len);
    CHECK(c->channels / c->num_heads <= ATTN_MAX_HS,
          "head size %d (channels %d / heads %d) is over the %d the attention kernels handle: use more heads",
          c->channels / c->num_heads, c->channels, c->num_heads, ATTN_MAX_HS);
    /* the GELU epilogue needs its aux buffer's ld (4C) divisible by 8 */
    g->gelu_fusion = gelu_fusion && (4 * c->channels) % 8 == 0;
    ALWAYS(recompute >= 0 && recompute < RECOMPUTE_LEVELS);
    g->recompute = recompute;
    CUDA_CHECK(cudaStreamCreate(&g->stream));
    lt_init(&g->lt, LT_WORKSPACE_BYTES, LT_BIAS_COPY_ELEMS(c));
    size_t P = g->num_parameters;
    /* the bf16 weights: whole (P), or under ZeRO-3 the gathered head and two layers (dp_init points into them) */
    ALWAYS(weight_elems == P || !full_state);
    g->params_memory = (floatX*)gpu_alloc(weight_elems * sizeof(floatX), GMEM_PARAMS);
    if (weight_elems == P) parameters_point_x(&g->params, g->params_memory, c);
    ALWAYS(!offload || full_state);
    if (full_state) {
        g->grads_memory = (float*)gpu_alloc(P * sizeof(float), GMEM_GRADS);
        CUDA_CHECK(cudaMemset(g->grads_memory, 0, P * sizeof(float)));
        parameters_point(&g->grads, g->grads_memory, c);
        if (!offload) { /* (--offload 1: on the host, gpu_offload_init below) */
            g->master_memory = (float*)gpu_alloc(P * sizeof(float), GMEM_MASTER);
            g->m_memory = (float*)gpu_alloc(P * sizeof(float), GMEM_ADAMW);
            g->v_memory = (float*)gpu_alloc(P * sizeof(float), GMEM_ADAMW);
            CUDA_CHECK(cudaMemset(g->m_memory, 0, P * sizeof(float)));
            CUDA_CHECK(cudaMemset(g->v_memory, 0, P * sizeof(float)));
            gpu_weights_upload(g, host->params_memory, NULL, NULL, 0, -1);
        }
    }

    size_t n[32], bytes[32];
    /* the plan's tables (gpu_memory_plan), allocated as they say */
    gpu_activation_sizes(n, bytes, c, B, T, recompute);
    g->acts_bytes = carve_bytes(n, bytes, NUM_GPU_ACTIVATIONS);
    g->acts_memory = gpu_alloc(g->acts_bytes, GMEM_ACTS);
    carve((void**)&g->acts, (char*)g->acts_memory, n, bytes, NUM_GPU_ACTIVATIONS);
    gpu_scratch_sizes(n, bytes, c, B, T, recompute);
    g->scratch_bytes = carve_bytes(n, bytes, NUM_GPU_SCRATCH);
    g->scratch_memory = gpu_alloc(g->scratch_bytes, GMEM_SCRATCH);
    carve((void**)&g->scratch, (char*)g->scratch_memory, n, bytes, NUM_GPU_SCRATCH);
    gpu_layer_work_sizes(n, bytes, c, B, T, recompute);
    carve((void**)&g->work, (char*)g->scratch.work, n, bytes, NUM_GPU_ACTIVATIONS);

    size_t BT = (size_t)B * T;
    size_t tn[NUM_STEP_INPUTS], tb[NUM_STEP_INPUTS];
    gpu_step_input_sizes(tn, tb, B, T, c->vocab_size);
    size_t tbytes = carve_bytes(tn, tb, NUM_STEP_INPUTS);
    void* hmem = gpu_alloc_host(tbytes, GMEM_HOST_STEP_INPUTS);
    void* dmem = gpu_alloc(tbytes, GMEM_STEP_INPUTS);
    carve((void**)&g->host, (char*)hmem, tn, tb, NUM_STEP_INPUTS);
    carve((void**)&g->dev, (char*)dmem, tn, tb, NUM_STEP_INPUTS);
    g->h_loss_mean = (float*)gpu_alloc_host((MAX_MICRO_STEPS + 1) * sizeof(float), GMEM_HOST_LOSSES);
    g->bucket_count = (int*)xmalloc(sizeof(int) * (size_t)c->vocab_size);
    g->bucket_token = (int*)xmalloc(sizeof(int) * BT);
    g->bucket_start = (int*)xmalloc(sizeof(int) * (BT + 1));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->copied, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(g->copied, g->stream));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->update_sent, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(g->update_sent, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    if (offload) gpu_offload_init(g, (GPT2*)host); /* (the host model's arrays become the optimizer's state) */
}

/* (test_gpt.cu's entries: one GPU, the whole state; --recompute 0, or a level) */
[[maybe_unused]] static void gpu_model_init_level(GpuGPT2* g, const GPT2* host, int B, int T, int gelu_fusion,
                                                  int recompute) {
    gpu_model_init_with(g, host, B, T, gelu_fusion, recompute, 1, 0, host->num_parameters);
}
[[maybe_unused]] static void gpu_model_init(GpuGPT2* g, const GPT2* host, int B, int T, int gelu_fusion) {
    gpu_model_init_level(g, host, B, T, gelu_fusion, 0);
}

static void gpu_offload_free(GpuGPT2* g);

static void gpu_model_free(GpuGPT2* g) {
    gpu_wait(g->stream, NULL);
    gpu_offload_free(g);
    gpu_release(g->params_memory);
    gpu_release(g->grads_memory);
    gpu_release(g->master_memory);
    gpu_release(g->m_memory);
    gpu_release(g->v_memory);
    gpu_release(g->acts_memory);
    gpu_release(g->scratch_memory);
    gpu_release_host(g->host.inputs);
    gpu_release(g->dev.inputs);
    gpu_release_host(g->h_loss_mean);
    CUDA_CHECK(cudaEventDestroy(g->copied));
    CUDA_CHECK(cudaEventDestroy(g->update_sent));
    if (g->graph_micro) CUDA_CHECK(cudaGraphExecDestroy(g->graph_micro));
    if (g->graph_update) CUDA_CHECK(cudaGraphExecDestroy(g->graph_update));
    free(g->bucket_count);
    free(g->bucket_token);
    free(g->bucket_start);
    lt_free(&g->lt);
    CUDA_CHECK(cudaStreamDestroy(g->stream));
    memset(g, 0, sizeof(*g));
}

/* Stage micro-batch `micro`'s tokens (and the encoder's chunks) and copy
 * them to the device, asynchronously: the arrays up to their counts, and
 * the counts, which the encoder backward's fixed grids read. */
static void gpu_tokens_upload(GpuGPT2* g, const int* inputs, const int* targets, int BT, int micro) {
    int V = g->config.vocab_size;
    for (int i = 0; i < BT; i++) {
        CHECK(inputs[i] >= 0 && inputs[i] < V, "input token %d at %d out of range [0, %d)", inputs[i], i, V);
        if (targets)
            CHECK(targets[i] >= 0 && targets[i] < V, "target token %d at %d out of range [0, %d)", targets[i], i, V);
    }
    gpu_wait(NULL, g->copied); /* the previous copies have read the pinned buffers */
    memcpy(g->host.inputs, inputs, sizeof(int) * (size_t)BT);
    if (targets) memcpy(g->host.targets, targets, sizeof(int) * (size_t)BT);
    EncoderChunks h = g->host.enc, d = g->dev.enc;
    g->num_buckets = encoder_buckets_build(inputs, BT, V, g->bucket_count, g->bucket_token, g->bucket_start,
                                           h.bucket_pos);
    encoder_chunks_build(h, g->bucket_token, g->bucket_start, g->num_buckets, g->B * g->T, V);
    g->host.micro[0] = micro;
    cudaStream_t s = g->stream;
    size_t nch = (size_t)h.num_chunks[0], nl = (size_t)h.num_long[0];
    CUDA_CHECK(cudaMemcpyAsync(g->dev.inputs, g->host.inputs, sizeof(int) * (size_t)BT, cudaMemcpyHostToDevice, s));
    if (targets)
        CUDA_CHECK(cudaMemcpyAsync(g->dev.targets, g->host.targets, sizeof(int) * (size_t)BT, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.bucket_pos, h.bucket_pos, sizeof(int) * (size_t)BT, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.chunk_start, h.chunk_start, sizeof(int) * (nch + 1), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.chunk_token, h.chunk_token, sizeof(int) * nch, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.chunk_slot, h.chunk_slot, sizeof(int) * nch, cudaMemcpyHostToDevice, s));
    if (nl > 0)
        CUDA_CHECK(cudaMemcpyAsync(d.long_token, h.long_token, sizeof(int) * nl, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.long_slot, h.long_slot, sizeof(int) * (nl + 1), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.num_chunks, h.num_chunks, sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(d.num_long, h.num_long, sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemcpyAsync(g->dev.micro, g->host.micro, sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaEventRecord(g->copied, s));
}

/* Layer l's activations for a batch of (B, T) (train_gpt.c's layer_acts):
 * a GpuActivations whose per-layer tensors, ln1 .. residual3, point at
 * layer l's slice of those kept ((L, ...): l * n / L elements in, with the
 * sizes of this B, T) or at the one-layer working set for those --recompute
 * does not keep; the rest are unchanged. Forward and backward both index
 * the layer through it. */
static GpuActivations gpu_layer_acts(const GpuGPT2* g, int l, int B, int T) {
    GpuActivations a = g->acts;
    char** ap = (char**)&a;
    char* const* wp = (char* const*)&g->work;
    size_t n[NUM_GPU_ACTIVATIONS], bytes[NUM_GPU_ACTIVATIONS], L = (size_t)g->config.num_layers;
    gpu_activation_sizes(n, bytes, &g->config, B, T, g->recompute);
    for (int k = GPU_ACTS_LAYER_BEGIN; k < GPU_ACTS_LAYER_END; k++)
        ap[k] = n[k] ? ap[k] + (size_t)l * (n[k] / L) * bytes[k] : wp[k];
    return a;
}

/* Layer l's input: the encoder's output, or layer l-1's residual3 (kept at every level). */
static const floatX* gpu_layer_input(const GpuGPT2* g, int l, int B, int T) {
    return l == 0 ? g->acts.encoded : gpu_layer_acts(g, l - 1, B, T).residual3;
}

/* Layer l's weights (as gpu_layer_grads): the per-layer tensors point at
 * layer l's slices of the whole bf16 weights or, under ZeRO-3 (G6), into
 * the buffer its gather fills, the 12 slices back to back in file order
 * (the packed bucket); `backward`: for its backward (gathered again). */
static ParameterTensorsX gpu_layer_params(GpuGPT2* g, int l, int backward) {
    ParameterTensorsX r = g->params;
    floatX** rp = (floatX**)&r;
    const floatX* packed = g->layer_weights ? g->layer_weights(g->grads_ctx, l, backward) : NULL;
    size_t L = (size_t)g->config.num_layers, at = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = g->param_sizes[k] / L;
        rp[k] = packed ? (floatX*)packed + at : rp[k] + (size_t)l * per_layer;
        at += per_layer;
    }
    return r;
}

/* GELU in the fc GEMM's epilogue? Not at levels 1 and 2, whose backward
 * recomputes fch_gelu from the kept fch with our kernel (see above
 * gpu_activation_sizes: the forward must have run that same kernel). */
static int gpu_gelu_in_epilogue(const GpuGPT2* g) {
    return g->gelu_fusion && (g->recompute == 0 || g->recompute == 3);
}

/* Layer l's forward from its input `residual` into `a` (gpu_layer_acts),
 * with its weights `lp` (gpu_layer_params).
 * `redo` 0: the forward, every step. `redo` = the --recompute level (1..3),
 * in backward: only the steps whose outputs that level did not keep, each
 * the very kernel, on the very inputs, the forward ran (level 2 writes the
 * kept mean and rstd again, with the same bits); never the last GEMM, whose
 * residual3 is kept. Not yet run on a GPU (levels 1..3). */
static void gpu_layer_forward(GpuGPT2* g, const GpuActivations* a, const ParameterTensorsX* lp,
                              const floatX* residual, int B, int T, int redo) {
    const GPT2Config* cfg = &g->config;
    int C = cfg->channels, NH = cfg->num_heads, N = B * T;
    cudaStream_t s = g->stream;
    const ParameterTensorsX& p = *lp; /* layer l's slices (gpu_layer_params) */
    int all = redo == 0 || redo == 3; /* the GEMMs and attention */
    if (redo != 1)
        layernorm_forward_gpu(a->ln1, a->ln1_mean, a->ln1_rstd, residual, p.ln1w, p.ln1b, N, C, s);
    if (all) {
        matmul_forward_gpu(&g->lt, s, a->qkv, a->ln1, p.qkvw, p.qkvb, NULL, NULL, N, C, 3 * C);
        attention_forward_gpu(a->atty, a->lse, a->qkv, B, T, NH, C / NH, s);
        /* residual2 = residual + atty . attprojw^T + attprojb: one GEMM with beta = 1 */
        matmul_forward_gpu(&g->lt, s, a->residual2, a->atty, p.attprojw, p.attprojb, residual, NULL, N, C, C);
    }
    if (redo != 1)
        layernorm_forward_gpu(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, p.ln2w, p.ln2b, N, C, s);
    int epilogue = gpu_gelu_in_epilogue(g);
    if (all)
        matmul_forward_gpu(&g->lt, s, epilogue ? a->fch_gelu : a->fch, a->ln2, p.fcw, p.fcb, NULL,
                           epilogue ? a->fch : NULL, N, C, 4 * C);
    if (!epilogue) gelu_forward_gpu(a->fch_gelu, a->fch, (long long)N * 4 * C, s);
    if (redo == 0)
        matmul_forward_gpu(&g->lt, s, a->residual3, a->fch_gelu, p.fcprojw, p.fcprojb, a->residual2, NULL, N, 4 * C,
                           C);
}

/* The forward of the (B, T) tokens gpu_tokens_upload put on the device
 * (gpu_forward below): device work only, so a step can be captured. */
static void gpu_forward_run(GpuGPT2* g, int B, int T, int targets, float dloss) {
    const GPT2Config* cfg = &g->config;
    int C = cfg->channels, L = cfg->num_layers, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    cudaStream_t s = g->stream;
    ParameterTensorsX p = g->params;
    GpuActivations a = g->acts;
    if (g->weights_begin) g->weights_begin(g->grads_ctx, 0); /* ZeRO-3: the head gathered, layer 0 on its way */
    gpu_offload_wait(g, s, 0); /* --offload 1: wte and wpe updated (the host may still update the layers) */
    encoder_forward_gpu(a.encoded, g->dev.inputs, p.wte, p.wpe, B, T, C, s);
    for (int l = 0; l < L; l++) {
        gpu_offload_wait(g, s, 1 + l); /* --offload 1: layer l's slices updated */
        GpuActivations al = gpu_layer_acts(g, l, B, T); /* layer l's slices, or the working set */
        ParameterTensorsX lp = gpu_layer_params(g, l, 0);
        gpu_layer_forward(g, &al, &lp, gpu_layer_input(g, l, B, T), B, T, 0);
    }
    const floatX* last = gpu_layer_input(g, L, B, T);
    gpu_offload_wait(g, s, L + 1); /* --offload 1: lnfw and lnfb updated */
    layernorm_forward_gpu(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, (int)BT, C, s);
    matmul_forward_gpu(&g->lt, s, a.logits, a.lnf, p.wte, NULL, NULL, NULL, (int)BT, C, Vp);
    g->last_B = B;
    g->last_T = T;
    g->has_targets = targets && dloss != 0.0f;
    if (!targets) return;
    classifier_gpu(a.logits, a.losses, g->dev.targets, (int)BT, V, Vp, dloss, s);
    mean_kernel<<<1, 1024, 0, s>>>(g->scratch.loss_mean, g->dev.micro, a.losses, (int)BT);
    KERNEL_CHECK();
}

/* Forward over (B, T) tokens (host arrays). Without targets the raw logits
 * stay in acts.logits. With targets the loss of each position goes to
 * acts.losses and the micro-batch's mean to the slot `micro`; with
 * dloss != 0 the logits are replaced by dlogits (the classifier is fused),
 * ready for gpu_backward. Nothing waits for the GPU. */
static void gpu_forward(GpuGPT2* g, const int* inputs, const int* targets, int B, int T, float dloss, int micro) {
    ALWAYS(B <= g->B && T <= g->T && micro >= 0 && micro < MAX_MICRO_STEPS);
    gpu_tokens_upload(g, inputs, targets, B * T, micro);
    gpu_forward_run(g, B, T, targets != NULL, dloss);
}

/* Mean losses of micro-batches 0..n-1, waiting for the GPU. */
static double gpu_losses_fetch(GpuGPT2* g, int n) {
    CUDA_CHECK(cudaMemcpyAsync(g->h_loss_mean, g->scratch.loss_mean, sizeof(float) * (size_t)n,
                               cudaMemcpyDeviceToHost, g->stream));
    gpu_wait(g->stream, NULL);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += g->h_loss_mean[i];
    return sum / n;
}

static void gpu_zero_grad(GpuGPT2* g) {
    if (gpu_offload_grads_zeroed(g)) return; /* --offload 1: the update zeroed them, piece by piece (gpu_backward waits) */
    CUDA_CHECK(cudaMemsetAsync(g->grads_memory, 0, g->num_parameters * sizeof(float), g->stream));
}

/* Layer l's parameter gradients (train_gpt.c's layer_grads): the per-layer
 * tensors point at layer l's slices of the flat buffer or, under ZeRO (G6),
 * into its bucket, the 12 slices back to back in file order. */
static ParameterTensors gpu_layer_grads(const GpuGPT2* g, int l) {
    ParameterTensors r = g->grads;
    float** rp = (float**)&r;
    size_t L = (size_t)g->config.num_layers, at = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = g->param_sizes[k] / L;
        rp[k] = g->grad_buckets ? g->grad_buckets[l] + at : rp[k] + (size_t)l * per_layer;
        at += per_layer;
    }
    return r;
}

/* Backward of the last forward, which must have had targets and dloss != 0
 * (its dlogits already hold the loss scale). Adds into the fp32 gradients.
 * The data-parallel hooks (G6) bracket each bucket: the rest (wte, wpe, lnf)
 * opens first and closes last, the layers in between from L-1 down to 0. */
static void gpu_backward(GpuGPT2* g) {
    const GPT2Config* cfg = &g->config;
    ALWAYS(g->has_targets);
    int B = g->last_B, T = g->last_T;
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    int N = (int)BT;
    cudaStream_t s = g->stream;
    LtContext* lt = &g->lt;
    ParameterTensorsX p = g->params;
    ParameterTensors gr = g->grads;
    GpuActivations a = g->acts;
    GpuScratch sc = g->scratch;
    gpu_offload_wait(g, s, -1); /* --offload 1: the last update done (every gradient slot zeroed) */

    if (g->weights_begin) g->weights_begin(g->grads_ctx, 1); /* ZeRO-3: layer L-1 on its way (the head is kept) */
    if (g->grads_begin) g->grads_begin(g->grads_ctx, L);
    /* dlnf = dlogits . wte; dwte += dlogits^T . lnf */
    matmul_backward_gpu(lt, s, sc.dbt_c, gr.wte, NULL, sc.part, a.logits, a.lnf, p.wte, NULL, N, C, Vp);
    CUDA_CHECK(cudaMemsetAsync(sc.dresidual, 0, BT * C * sizeof(floatX), s));
    const floatX* last = gpu_layer_input(g, L, B, T);
    layernorm_backward_gpu(sc.dresidual, gr.lnfw, gr.lnfb, sc.part, sc.dbt_c, last, p.lnfw, a.lnf_mean, a.lnf_rstd,
                           N, C, s);
    for (int l = L - 1; l >= 0; l--) {
        const floatX* residual = gpu_layer_input(g, l, B, T);
        GpuActivations al = gpu_layer_acts(g, l, B, T); /* layer l's slices, or the working set */
        ParameterTensorsX lp = gpu_layer_params(g, l, 1); /* layer l's weights (ZeRO-3: gathered again) */
        /* what --recompute did not keep, again (not yet run on a GPU) */
        if (g->recompute) gpu_layer_forward(g, &al, &lp, residual, B, T, g->recompute);
        if (g->grads_begin) g->grads_begin(g->grads_ctx, l);
        ParameterTensors lg = gpu_layer_grads(g, l); /* layer l's slices */
        /* MLP */
        matmul_backward_gpu(lt, s, sc.dfch, lg.fcprojw, lg.fcprojb, sc.part, sc.dresidual, al.fch_gelu,
                            lp.fcprojw, g->gelu_fusion ? al.fch : NULL, N, 4 * C, C);
        if (!g->gelu_fusion) gelu_backward_gpu(sc.dfch, al.fch, sc.dfch, (long long)BT * 4 * C, s);
        matmul_backward_gpu(lt, s, sc.dbt_c, lg.fcw, lg.fcb, sc.part, sc.dfch, al.ln2, lp.fcw, NULL, N, C, 4 * C);
        layernorm_backward_gpu(sc.dresidual, lg.ln2w, lg.ln2b, sc.part, sc.dbt_c, al.residual2, lp.ln2w,
                               al.ln2_mean, al.ln2_rstd, N, C, s);
        /* attention */
        matmul_backward_gpu(lt, s, sc.dbt_c, lg.attprojw, lg.attprojb, sc.part, sc.dresidual, al.atty,
                            lp.attprojw, NULL, N, C, C);
        attention_backward_gpu(sc.dqkv, sc.attn_d, sc.dbt_c, al.qkv, al.atty, al.lse, B, T, NH, C / NH, s);
        matmul_backward_gpu(lt, s, sc.dbt_c, lg.qkvw, lg.qkvb, sc.part, sc.dqkv, al.ln1, lp.qkvw, NULL, N, C, 3 * C);
        layernorm_backward_gpu(sc.dresidual, lg.ln1w, lg.ln1b, sc.part, sc.dbt_c, residual, lp.ln1w,
                               al.ln1_mean, al.ln1_rstd, N, C, s);
        if (g->grads_end) g->grads_end(g->grads_ctx, l);
    }
    /* (the grids from g->B * g->T, the allocated size: the same for every batch; not yet run on a GPU) */
    encoder_backward_wte_gpu(gr.wte, sc.enc_partial, sc.dresidual, g->dev.enc, g->B * g->T, cfg->vocab_size, C, s);
    encoder_backward_wpe_kernel<<<ceil_div((long long)T * C, 256), 256, 0, s>>>(gr.wpe, sc.dresidual, B, T, C);
    KERNEL_CHECK();
    if (g->grads_end) g->grads_end(g->grads_ctx, L);
}

/* The global gradient norm (fp32, deterministic) into
 * scratch.norm[NORM_BLOCKS], on the stream; nothing waits. */
static void gpu_grad_norm_run(GpuGPT2* g) {
    float* partial = g->scratch.norm;
    norm_squares_partial_kernel<<<NORM_BLOCKS, 256, 0, g->stream>>>(partial, g->grads_memory, g->num_parameters);
    KERNEL_CHECK();
    norm_finish_kernel<<<1, 1024, 0, g->stream>>>(partial + NORM_BLOCKS, partial, NORM_BLOCKS, 1);
    KERNEL_CHECK();
}

/* The norm gpu_grad_norm_run left on the device, waiting for the GPU. */
static double gpu_grad_norm_fetch(GpuGPT2* g) {
    float* h_norm = g->h_loss_mean + MAX_MICRO_STEPS;
    CUDA_CHECK(cudaMemcpyAsync(h_norm, g->scratch.norm + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost,
                               g->stream));
    gpu_wait(g->stream, NULL);
    return *h_norm;
}

/* Global gradient norm, left on the device and returned (waits). */
static double gpu_grad_norm(GpuGPT2* g) {
    gpu_grad_norm_run(g);
    return gpu_grad_norm_fetch(g);
}

/* Update t's values (AdamWStep) into the pinned host copy, for the next
 * gpu_update_run to send. Waits until the last update's copy has read it. */
static void gpu_update_values_set(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, uint32_t seed) {
    gpu_wait(NULL, g->update_sent);
    AdamWStep* h = g->host.update;
    h->lr = lr;
    h->bc1 = 1.0f - (float)pow(opt->beta1, t);
    h->bc2 = 1.0f - (float)pow(opt->beta2, t);
    h->seed = seed;
    h->go = 1;
}

/* The update as device work on the stream (capturable): its values to the
 * device, with `gate_micro_batches` > 0 the device's own go-ahead
 * (update_gate_kernel over that many micro-batches' losses), then AdamW over
 * every tensor (train_gpt.c's adamw_update), clipping with the norm
 * gpu_grad_norm_run left on the device. */
static void gpu_update_run(GpuGPT2* g, const AdamWConfig* opt, float max_norm, int gate_micro_batches) {
    CUDA_CHECK(cudaMemcpyAsync(g->dev.update, g->host.update, sizeof(AdamWStep), cudaMemcpyHostToDevice, g->stream));
    if (gate_micro_batches > 0) {
        update_gate_kernel<<<1, 32, 0, g->stream>>>(g->dev.update, g->scratch.loss_mean, gate_micro_batches,
                                                    g->scratch.norm + NORM_BLOCKS);
        KERNEL_CHECK();
    }
    size_t offset = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        size_t n = g->param_sizes[k];
        float wd = (opt->decay_all || PARAMETER_IS_MATRIX[k]) ? opt->weight_decay : 0.0f;
        adamw_kernel<<<ceil_div((long long)n, 256), 256, 0, g->stream>>>(
            g->params_memory + offset, g->master_memory + offset, g->grads_memory + offset, g->m_memory + offset,
            g->v_memory + offset, n, g->dev.update, opt->beta1, opt->beta2, opt->eps, wd,
            g->scratch.norm + NORM_BLOCKS, max_norm, (uint32_t)k);
        KERNEL_CHECK();
        offset += n;
    }
}

/* AdamW over every tensor, clipping with the norm gpu_grad_norm left on the
 * device (the host has decided the update goes ahead). `seed` varies per step. */
static void gpu_adamw_update(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed) {
    gpu_update_values_set(g, opt, lr, t, seed);
    gpu_update_run(g, opt, max_norm, 0);
    CUDA_CHECK(cudaEventRecord(g->update_sent, g->stream));
}

/* ---- Optimizer offload (--offload 1, ZeRO-Offload; issue 14) ------------
 * Checked on the CPU execution layer only, not run on a GPU (scripts/
 * test_gpu_plan.sh: the same model bytes as the run without it, the overlap
 * counted, a missing wait planted and caught). The fp32 master weights and
 * AdamW's moments stay on the host: they are the host model's own
 * params_memory, m_memory and v_memory (P floats each, pinned with
 * cudaHostRegister), so samples, checkpoints and training states read them
 * where they are. The device keeps the bf16 weights and the fp32 gradients:
 * 12 bytes per parameter less (the memory plan's master and moments).
 *
 * The update goes in the order the next forward reads the weights, in L + 2
 * pieces: piece 0 is wte and wpe (the encoder's; the classifier reads wte
 * too), piece 1 + l is layer l's slice of each of the 12 stacked tensors
 * (ln1w (L, C), qkvw (L, 3C, C), ... fcprojb (L, C): 12 ranges of the flat
 * buffer), piece L + 1 is lnfw and lnfb. Per piece:
 *   1. its gradients go to pinned host memory, on a copy stream (every
 *      piece's queued at once, an event after each);
 *   2. on the update stream, after that event, a host function
 *      (offload_piece_adamw, cudaLaunchHostFunc) scales them by the clip
 *      coefficient (clip_coef: the kernel's own float arithmetic) and runs
 *      train_gpt.c's OpenMP AdamW over each range (adamw_update_range: the
 *      expression of adamw_element, in the same order);
 *   3. behind it on that stream: the new master into the gradient buffer's
 *      slots (their gradients left in step 1), bf16_round_range_kernel rounds
 *      it with adamw_kernel's seed (step seed x 16 + tensor) and element index
 *      within the tensor (the bf16 weights adamw_kernel would have written
 *      from that master, bit for bit), the slots are zeroed for the next
 *      backward, and the piece's event `updated` is recorded.
 * Why a host function: the host thread queues all of this and returns, and
 * goes on to launch the next step's forward while the CPU runs AdamW (in a
 * thread of the CUDA driver: OpenMP inside it is allowed; CUDA calls are
 * not, and it makes none: it reads and writes host arrays only). The stream
 * orders it: after the copy of its gradients, before the copy back of its
 * master. A worker thread of our own would need that ordering rebuilt
 * (events polled, or the host blocking on them).
 * What overlaps now: the next forward, on the compute stream, waits for
 * piece 0 before the encoder, piece 1 + l before layer l, piece L + 1 before
 * the final layernorm (gpu_offload_wait), so layer l runs as soon as its
 * weights are updated, while the host still updates the layers after it;
 * and the copies of later pieces to the host, the copy back and rounding of
 * earlier ones, with the host's AdamW of a piece. Those waits are on events
 * this update recorded before it returned, so each waits for this update's
 * piece (a wait on an event not yet recorded waits for nothing). The
 * backward waits for the last piece (every gradient slot zeroed: after an
 * update dp_zero_grad's memset is skipped, gpu_offload_grads_zeroed). The
 * host waits for the update (gpu_offload_sync) before it reads or writes
 * the host arrays itself: samples and checkpoints, a resume's or a
 * rollback's upload; a snapshot's stream waits for the last piece (and the
 * Saver's thread must have copied the snapshot out of the host arrays
 * before the next update writes them: the loop waits for it, while the
 * GPU still runs the backward); the next
 * update waits for the last one's host functions (done already: the
 * backward waited for them). Not overlapped: the forward's layer l with the
 * host's AdamW of layer l itself. CUDA graphs are off with --offload 1: a
 * captured forward could not wait for events recorded outside its capture
 * (gpu_train_setup says so). Counted for the log: at the first forward
 * launched after each update, the pieces whose host AdamW had not finished
 * when layer 0 was launched (gpu_offload_free prints "offload: ...").
 * Same training: on the CPU execution layer host and kernel are the same
 * compiler's arithmetic (no FMA contraction without -march), so the model
 * bytes are equal; on a GPU nvcc contracts a*b+c into FMAs (--fmad=true by
 * default) and the fp32 master may differ by an ulp or so per step from the
 * kernel's, which changes a stochastically rounded bf16 weight only where the
 * master sits within that ulp of a rounding threshold (about 2^-16 of
 * them per step): expect agreement to within bf16 noise, not bitwise. */

#define OFFLOAD_MAX_RANGES (LAYER_TENSORS_END - LAYER_TENSORS_BEGIN) /* a layer's 12 slices */

typedef struct {
    struct GpuOffload* off;
    int ranges;                       /* how many ranges of the flat buffer: 2, 12 or 2 */
    int tensor[OFFLOAD_MAX_RANGES];   /* each one's tensor k (file order) */
    size_t lo[OFFLOAD_MAX_RANGES];    /* where it starts in the flat buffer (P) */
    size_t n[OFFLOAD_MAX_RANGES];     /* its length */
    size_t first[OFFLOAD_MAX_RANGES]; /* its first element's index within tensor k (the rounding's index) */
    cudaEvent_t copied;               /* copy stream: its gradients are on the host */
    cudaEvent_t updated;              /* update stream: its bf16 weights written, its gradient slots zeroed */
} OffloadPiece;

struct GpuOffload {
    GPT2* host;           /* the host model: its params_memory, m_memory, v_memory are the state */
    float* grads;         /* (P) pinned: the gradients' host copy */
    cudaStream_t copy;    /* the gradients' device-to-host copies */
    cudaStream_t update;  /* the host functions, the copies back, the rounding, the zeroing */
    cudaEvent_t ready;    /* compute stream: the gradients are final */
    int pieces;           /* L + 2 */
    OffloadPiece* piece;  /* (pieces) in the forward's order */
    /* the update the host functions run: set before they are queued, unchanged until they have all run */
    AdamWConfig opt;
    float lr, coef;
    int t;
    int done;             /* pieces whose host function has returned (atomic: the driver's thread counts) */
    int zeroed;           /* the last update zeroed the gradients (dp_zero_grad's memset not needed) */
    int launched;         /* an update is queued and no forward launched since */
    long long updates, followed, overlapped, pending_sum; /* the overlap's count (above) */
};

/* bf16_round_stochastic_kernel for elements [first, first + n) of a tensor
 * (out and in start at element first): the index the rounding hashes is
 * the element's within the tensor, as in adamw_kernel. */
__global__ void bf16_round_range_kernel(floatX* out, const float* in, size_t n, size_t first, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_round_stochastic(in[i], hash_u32((uint32_t)(first + i) ^ hash_u32(seed)));
}

static void gpu_offload_init(GpuGPT2* g, GPT2* host) {
    size_t P = g->num_parameters, L = (size_t)g->config.num_layers;
    g->offload = 1;
    g->off_host = host;
    if (!host->m_memory) host->m_memory = ledger_floats(MEM_ADAMW, P); /* (gpt2_free frees them) */
    if (!host->v_memory) host->v_memory = ledger_floats(MEM_ADAMW, P);
    float* arrays[3] = {host->params_memory, host->m_memory, host->v_memory};
    for (int k = 0; k < 3; k++) CUDA_CHECK(cudaHostRegister(arrays[k], P * sizeof(float), cudaHostRegisterDefault));
    GpuOffload* o = (GpuOffload*)xmalloc(sizeof(GpuOffload));
    memset(o, 0, sizeof(*o));
    o->host = host;
    o->grads = (float*)gpu_alloc_host(P * sizeof(float), GMEM_HOST_OFFLOAD);
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->update, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&o->ready, cudaEventDisableTiming));
    o->pieces = (int)L + 2;
    o->piece = (OffloadPiece*)xmalloc(sizeof(OffloadPiece) * (size_t)o->pieces);
    memset(o->piece, 0, sizeof(OffloadPiece) * (size_t)o->pieces);
    size_t start[NUM_PARAMETER_TENSORS], at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        start[k] = at;
        at += g->param_sizes[k];
    }
    for (int p = 0; p < o->pieces; p++) {
        OffloadPiece* pc = &o->piece[p];
        pc->off = o;
        int layer = p >= 1 && p <= (int)L;
        int k0 = p == 0 ? 0 : layer ? LAYER_TENSORS_BEGIN : LAYER_TENSORS_END;
        int k1 = p == 0 ? LAYER_TENSORS_BEGIN : layer ? LAYER_TENSORS_END : NUM_PARAMETER_TENSORS;
        ALWAYS(k1 - k0 <= OFFLOAD_MAX_RANGES);
        for (int k = k0; k < k1; k++) {
            size_t per = layer ? g->param_sizes[k] / L : g->param_sizes[k]; /* layer l's slice, or the whole tensor */
            size_t first = layer ? (size_t)(p - 1) * per : 0;
            pc->tensor[pc->ranges] = k;
            pc->first[pc->ranges] = first;
            pc->lo[pc->ranges] = start[k] + first;
            pc->n[pc->ranges] = per;
            pc->ranges++;
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&pc->copied, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&pc->updated, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(pc->updated, o->update)); /* (a forward before the first update waits for nothing) */
    }
    g->off = o;
    gpu_weights_upload(g, host->params_memory, NULL, NULL, 0, -1); /* the bf16 weights, rounded to nearest */
}

static void gpu_offload_free(GpuGPT2* g) {
    if (!g->offload) return;
    GpuOffload* o = g->off;
    gpu_wait(o->update, NULL);
    gpu_wait(o->copy, NULL);
    if (o->updates > 0)
        printf("offload: %lld updates; after %lld of the %lld followed by a forward, that forward's layer 0 was launched "
               "while the host's AdamW still had pieces to run (%.1f of %d on average)\n", o->updates, o->overlapped,
               o->followed, o->followed ? (double)o->pending_sum / (double)o->followed : 0.0, o->pieces);
    float* arrays[3] = {o->host->params_memory, o->host->m_memory, o->host->v_memory};
    for (int k = 0; k < 3; k++) CUDA_CHECK(cudaHostUnregister(arrays[k]));
    gpu_release_host(o->grads);
    CUDA_CHECK(cudaEventDestroy(o->ready));
    for (int p = 0; p < o->pieces; p++) {
        CUDA_CHECK(cudaEventDestroy(o->piece[p].copied));
        CUDA_CHECK(cudaEventDestroy(o->piece[p].updated));
    }
    CUDA_CHECK(cudaStreamDestroy(o->copy));
    CUDA_CHECK(cudaStreamDestroy(o->update));
    free(o->piece);
    free(o);
    g->off = NULL;
    g->offload = 0;
}

static void gpu_offload_sync(const GpuGPT2* g) {
    if (g->offload) gpu_wait(g->off->update, NULL); /* (its last work waited for the copy stream's) */
}

static void gpu_offload_wait(const GpuGPT2* g, cudaStream_t s, int piece) {
    if (!g->offload) return;
    GpuOffload* o = g->off;
    if (piece < 0) piece = o->pieces - 1;
    ALWAYS(piece < o->pieces && !g->graphs); /* (graphs are off with --offload 1: gpu_train_setup) */
    if (piece == 0 && s == g->stream && o->launched) { /* the first forward after an update: still running? */
        int pending = o->pieces - __atomic_load_n(&o->done, __ATOMIC_ACQUIRE);
        o->followed++;
        o->overlapped += pending > 0;
        o->pending_sum += pending;
        o->launched = 0;
    }
    CUDA_CHECK(cudaStreamWaitEvent(s, o->piece[piece].updated, 0));
}

static int gpu_offload_grads_zeroed(GpuGPT2* g) {
    if (!g->offload || !g->off->zeroed) return 0;
    g->off->zeroed = 0;
    return 1;
}

/* Step 2 above, for one piece: run by the update stream (cudaLaunchHostFunc)
 * once the piece's gradients are on the host. Host arrays only, no CUDA. */
static void CUDART_CB offload_piece_adamw(void* arg) {
    const OffloadPiece* pc = (const OffloadPiece*)arg;
    GpuOffload* o = pc->off;
    GPT2* h = o->host;
    float coef = o->coef;
    for (int r = 0; r < pc->ranges; r++) {
        size_t lo = pc->lo[r], n = pc->n[r];
        float* gk = o->grads + lo;
        if (coef != 1.0f) {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++) gk[i] = gk[i] * coef; /* (adamw_kernel: grad[i] * clip_coef) */
        }
        adamw_update_range(h, &o->opt, o->lr, o->t, lo, lo + n, gk, h->m_memory + lo, h->v_memory + lo);
    }
    __atomic_add_fetch(&o->done, 1, __ATOMIC_RELEASE);
}

/* Update t on the host (above): `norm` is the gradients' global norm
 * (gpu_grad_norm: the device's fp32 value), `seed` the step's stochastic
 * rounding seed. Returns with everything queued: the host does not wait. */
static void gpu_offload_update(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed,
                               float norm) {
    GpuOffload* o = g->off;
    GPT2* h = o->host;
    /* the last update's host functions have run (this step's backward waited for them), so their arguments may
     * change now: a wait for what is done already */
    gpu_wait(o->update, NULL);
    o->opt = *opt;
    o->lr = lr;
    o->t = t;
    o->coef = clip_coef(norm, max_norm);
    __atomic_store_n(&o->done, 0, __ATOMIC_RELEASE);
    CUDA_CHECK(cudaEventRecord(o->ready, g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(o->copy, o->ready, 0));
    for (int p = 0; p < o->pieces; p++) { /* 1. every piece's gradients to the host, queued */
        OffloadPiece* pc = &o->piece[p];
        for (int r = 0; r < pc->ranges; r++)
            CUDA_CHECK(cudaMemcpyAsync(o->grads + pc->lo[r], g->grads_memory + pc->lo[r], pc->n[r] * sizeof(float),
                                       cudaMemcpyDeviceToHost, o->copy));
        CUDA_CHECK(cudaEventRecord(pc->copied, o->copy));
    }
    for (int p = 0; p < o->pieces; p++) {
        OffloadPiece* pc = &o->piece[p];
        CUDA_CHECK(cudaStreamWaitEvent(o->update, pc->copied, 0));
        CUDA_CHECK(cudaLaunchHostFunc(o->update, offload_piece_adamw, pc)); /* 2. AdamW on the host */
        for (int r = 0; r < pc->ranges; r++) { /* 3. the master back into the slot, rounded, the slot zeroed */
            size_t lo = pc->lo[r], n = pc->n[r];
            CUDA_CHECK(cudaMemcpyAsync(g->grads_memory + lo, h->params_memory + lo, n * sizeof(float),
                                       cudaMemcpyHostToDevice, o->update));
            bf16_round_range_kernel<<<ceil_div((long long)n, 256), 256, 0, o->update>>>(
                g->params_memory + lo, g->grads_memory + lo, n, pc->first[r], seed * 16u + (uint32_t)pc->tensor[r]);
            KERNEL_CHECK();
            CUDA_CHECK(cudaMemsetAsync(g->grads_memory + lo, 0, n * sizeof(float), o->update));
        }
        CUDA_CHECK(cudaEventRecord(pc->updated, o->update));
    }
    o->zeroed = 1;
    o->launched = 1;
    o->updates++;
}

/* ---- CUDA graphs ----------------------------------------------------------
 * A step of GPT-2 124M launches about 400 kernels and GEMMs; launched one
 * by one, each costs the host a few microseconds and the GPU a gap. A CUDA
 * graph records the launches once (stream capture) and replays them as one.
 * What a replay cannot change are the launches' arguments: so everything
 * that varies from step to step is read by the kernels from device memory
 * that the host fills before each launch (StepInputs: the tokens, the
 * encoder's chunks and their counts, the micro-batch's loss slot, the
 * update's AdamWStep), and the encoder's grids are fixed. Nothing in a
 * captured piece may wait for the GPU (CUDA refuses it during capture).
 * STATUS: run through the CPU execution layer, which models capture and
 * replay (dev/cuda/cpu/README.md); not yet run on a GPU. */

/* Runs `work(g, arg)` on the stream: with g->graphs set, captured into
 * *exec the first time and replayed after (the caller makes sure `arg` is
 * the same each time); else as ordinary launches. */
static void gpu_graph_run(GpuGPT2* g, cudaGraphExec_t* exec, void (*work)(GpuGPT2*, const void*), const void* arg) {
    if (!g->graphs) {
        work(g, arg);
        return;
    }
    if (!*exec) {
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
        work(g, arg);
        CUDA_CHECK(cudaStreamEndCapture(g->stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
    CUDA_CHECK(cudaGraphLaunch(*exec, g->stream));
}

static void gpu_micro_batch_work(GpuGPT2* g, const void* arg) {
    const MicroBatchShape* mb = (const MicroBatchShape*)arg;
    gpu_forward_run(g, mb->B, mb->T, 1, mb->dloss);
    gpu_backward(g);
}

/* A training micro-batch whose tokens gpu_tokens_upload has sent: forward
 * with the loss scale dloss, then backward (captured and replayed under
 * graphs). */
static void gpu_micro_batch(GpuGPT2* g, int B, int T, float dloss) {
    MicroBatchShape mb;
    memset(&mb, 0, sizeof(mb)); /* (memcmp'd) */
    mb.B = B;
    mb.T = T;
    mb.dloss = dloss;
    if (g->graph_micro) ALWAYS(!memcmp(&mb, &g->graph_micro_shape, sizeof(mb)));
    g->graph_micro_shape = mb;
    gpu_graph_run(g, &g->graph_micro, gpu_micro_batch_work, &mb);
    g->last_B = B; /* (what the forward's host code sets; a replay runs no host code) */
    g->last_T = T;
    g->has_targets = 1;
}

static void gpu_update_work(GpuGPT2* g, const void* arg) {
    const UpdateShape* u = (const UpdateShape*)arg;
    gpu_grad_norm_run(g);
    gpu_update_run(g, u->opt, u->max_norm, u->micro_batches);
}

/* One GPU: the norm and the update, gated on the device (update_gate_kernel),
 * so the host launches it right after the backward without waiting; then
 * waits for the step and returns the norm before clipping, with the mean
 * loss in *loss. */
static double gpu_update_gated(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed,
                               int micro_batches, double* loss) {
    UpdateShape u;
    memset(&u, 0, sizeof(u));
    u.opt = opt;
    u.max_norm = max_norm;
    u.micro_batches = micro_batches;
    if (g->graph_update) ALWAYS(!memcmp(&u, &g->graph_update_shape, sizeof(u)));
    g->graph_update_shape = u;
    gpu_update_values_set(g, opt, lr, t, seed);
    gpu_graph_run(g, &g->graph_update, gpu_update_work, &u);
    CUDA_CHECK(cudaEventRecord(g->update_sent, g->stream));
    double norm = gpu_grad_norm_fetch(g);
    *loss = gpu_losses_fetch(g, micro_batches);
    return norm;
}

/* The fp32 master weights into the host model (for samples and checkpoints). */
static void gpu_params_to_host(GpuGPT2* g, GPT2* host) {
    gpu_wait(g->stream, NULL);
    if (g->offload) { /* the master is on the host already, once the update is done */
        gpu_offload_sync(g);
        if (host->params_memory != g->off_host->params_memory)
            memcpy(host->params_memory, g->off_host->params_memory, g->num_parameters * sizeof(float));
        return;
    }
    CUDA_CHECK(cudaMemcpy(host->params_memory, g->master_memory, g->num_parameters * sizeof(float),
                          cudaMemcpyDeviceToHost));
}

/* n bf16 device values -> host floats (waits for the GPU). */
[[maybe_unused]] static void gpu_bf16_to_host(GpuGPT2* g, float* host, const floatX* dev, size_t n) {
    float* tmp = (float*)gpu_alloc(n * sizeof(float), GMEM_TRANSIENT);
    bf16_to_float_kernel<<<ceil_div((long long)n, 256), 256, 0, g->stream>>>(tmp, dev, n);
    KERNEL_CHECK();
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    CUDA_CHECK(cudaMemcpy(host, tmp, n * sizeof(float), cudaMemcpyDeviceToHost));
    gpu_release(tmp);
}

/* ------------------------------------------------------------------------ */
/* G5. Throughput and MFU                                                   */
/* ------------------------------------------------------------------------ */

/* Peak dense bf16 TFLOP/s by device name (datasheets); 0 = unknown, and
 * then MFU is printed as n/a, never guessed. */
static double gpu_peak_tflops(const char* name) {
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 756.0;
    if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800")) return 989.0;
    if (strstr(name, "A100") || strstr(name, "A800")) return 312.0;
    return 0.0;
}

/* Training FLOPs per token: 6 P + 6 L C T (DESIGN.md; forward + backward). */
static double flops_per_token(const GPT2Config* c, size_t P, int T) {
    return 6.0 * (double)P + 6.0 * c->num_layers * (double)c->channels * T;
}

/* " | MFU 41.2%" or " | MFU n/a" */
static void mfu_format(char* out, size_t cap, double tokens_per_s, double fpt, double peak_tflops) {
    if (peak_tflops <= 0.0 || !(tokens_per_s > 0.0)) snprintf(out, cap, " | MFU n/a");
    else snprintf(out, cap, " | MFU %.1f%%", 100.0 * tokens_per_s * fpt / (peak_tflops * 1e12));
}

/* ------------------------------------------------------------------------ */
/* G6. Data parallel                                                        */
/* ------------------------------------------------------------------------ */
/* One process per GPU. Each rank trains on its own slice of the global batch
 * (train_gpt.c's data loader with rank/world), its loss scaled by 1/W, so
 * that the summed gradient is the global batch's mean. The ranks combine
 * with NCCL (ZeRO: Rajbhandari et al. 2020, sec. 5):
 *   --zero 0  every rank keeps everything (18 bytes per parameter); each
 *             bucket's gradients (G2: a layer's 12 slices, or the rest) are
 *             summed by in-place ncclAllReduce, one group per bucket, and
 *             every rank runs the same AdamW on all of them;
 *   --zero 1  ZeRO-1, the optimizer state sharded: backward writes every
 *             bucket packed (G2's layout); ncclReduceScatter hands rank r the
 *             sum of its piece of each bucket; rank r runs AdamW on its shard
 *             of the fp32 master weights and moments; ncclAllGather of the
 *             updated bf16 pieces, unpacked, rebuilds the weights everywhere;
 *   --zero 2  ZeRO-2, the gradients sharded too: backward writes layer l
 *             into one of two one-layer slots (l % 2), reduce-scattered in
 *             place as soon as the layer is done, on every micro-batch, and
 *             the piece added into the shard's gradient; layer l - 1 fills
 *             the other slot meanwhile, and layer l - 2 waits until slot
 *             l % 2 has been reduced. The rest (wte, wpe, lnf) is the one
 *             whole bucket kept: its gradients are final only at the end;
 *   --zero 3  ZeRO-3, the bf16 weights sharded too: ZeRO-2's gradients and
 *             update, the weights gathered layer by layer where they are
 *             used (above dp_gather_bucket; not run on a GPU).
 * Streams and events: every collective runs on the communication stream
 * (highest priority). When backward, on the compute stream, has finished a
 * bucket, an event recorded there lets the communication stream start that
 * bucket's reduction, while backward goes on with the layers below
 * (--overlap 0: all at the end; ZeRO-2 always overlaps). The compute stream
 * waits for the reductions ("reduced") before the norm and the update, and
 * for the all-gather ("comm_idle") before the next step reads the weights.
 * Plain and ZeRO-1 reduce once per step, on the last micro-batch, when the
 * gradients are complete; ZeRO-2 on every micro-batch (no whole gradient to
 * accumulate in). The clipping norm: each rank's sum of squares over its
 * shard, summed over the ranks (plain: the whole summed gradient, the same
 * on every rank). The loss: the ranks' means, summed, divided by W.
 * Bytes sent per rank and step, as a ring sends them (NCCL may pick a tree;
 * P' = P padded, the sum of the buckets; fp32 gradients, bf16 weights):
 *   plain   2 (W-1)/W x 4 P
 *   ZeRO-1  (W-1)/W x (4 P' + 2 P')
 *   ZeRO-2  (W-1)/W x (4 P' x micro-batches + 2 P')
 * Memory per rank, bytes (S = P'/W, the shard):
 *   plain   2 P weights + 4 P gradients + 12 P master, m, v
 *   ZeRO-1  2 P + 4 P' (packed gradients) + 4 S (shard's gradient) + 12 S + 2 S (bf16 piece to send)
 *   ZeRO-2  2 P + 4 (2 layer slots + the rest, padded) + 4 S + 12 S + 2 S
 *   ZeRO-3  2 (Pr + 2 Pl) gathered weights + 4 (2 layer slots + the rest) + 4 S + 12 S + 2 S (the shard)
 * One GPU with --zero 1|2 runs the same sharded code as one rank (W = 1):
 * the path to test when only one GPU is at hand.
 *
 * Start-up: rank and world come from MPI (--init mpi, a build with
 * -DUSE_MPI) or from the launcher's environment (train_gpt.c's
 * launch_rank_world); rank 0's ncclUniqueId reaches the others by
 * MPI_Bcast or by train_gpt.c's rendezvous (file:PATH, tcp:HOST:PORT). Each
 * process takes GPU local_rank % (visible GPUs). Failure: a rank that exits
 * with its communicator up aborts it (the exit handler below; MPI_Abort
 * under MPI), and ranks waiting on the host poll NCCL for errors instead of
 * blocking (gpu_wait), so one rank's death ends the job instead of hanging
 * it. */

/* The levels of the machine (issue 15; not run on a GPU; checked on the CPU
 * execution layer, scripts/test_cuda_levels.sh): train_gpt.c's (gptc/zero3.h)
 * on NCCL. Nodes: --topology NxK (rank r on node r / K), else the ranks on
 * one host (by host name). Bytes each rank sends per level; --hierarchical's
 * communicators (see "levels" below). */
typedef struct {
    int nodes, per_node;     /* per_node: ranks in every node, 0 when the nodes differ in size */
    int node, local;         /* this rank's node and its index inside it */
    int* node_of;            /* (W) each rank's node */
    int* local_of;           /* (W) each rank's index inside its node */
    int hierarchical;        /* reductions by level (several ranks only) */
    int by_host;             /* the nodes are the hosts (no --topology) */
    int report;              /* --comm-levels 1: a line per step */
    int counting;            /* inside a training step (dp_zero_grad .. gpu_levels_step_end) */
    double sent[NUM_LEVELS]; /* bytes this rank sent at each level in this step */
    double sent_run[NUM_LEVELS];
    int steps;
    ncclComm_t intra;        /* hierarchical: this node's ranks, ranked by index (ncclCommSplit) */
    ncclComm_t inter;        /* hierarchical: the ranks with this index, one per node, ranked by node */
} GpuLevels;

typedef struct {
    int rank, world, local_rank, device;
    char how[300];       /* how the ranks met, for the log */
    int mpi;             /* MPI was started here (finalised, or aborted on failure, at the end) */
    ncclComm_t nccl;     /* NULL: one GPU, plain */
    cudaStream_t stream; /* the communication stream */
    uint64_t* d_slots;   /* device (DP_SCALARS + 3 W) */
    uint64_t* h_slots;   /* pinned host twin */
    Dist dist;           /* the same rank/world for train_gpt.c's helpers: timing lines, the --data barrier (MPI) */
    size_t free_at_start; /* device bytes free once the context exists, before the communicator */
    GpuLevels lv;        /* nodes, bytes per level, the communicators per level (gpu_levels_init) */
} GpuComm;

#ifdef USE_MPI
static int gpu_mpi_live = 0; /* MPI_Init done and MPI_Finalize not yet */
#endif

/* Runs at every exit(); does something only when the exit is not the clean
 * one (gpu_comm_free clears both flags): a CUDA_CHECK, NCCL_CHECK or CHECK
 * failed with the communicator up. Abort it, so the other ranks' collectives
 * fail instead of waiting for this rank forever; under MPI take the job down. */
static void gpu_comm_exit_handler(void) {
    if (gpu_watched_comm) {
        ncclComm_t c = gpu_watched_comm;
        gpu_watched_comm = NULL;
        fprintf(stderr, "error: exiting with the communicator up: aborting it, so the other ranks stop too\n");
        ncclResult_t r = ncclCommAbort(c);
        if (r != ncclSuccess) fprintf(stderr, "error: ncclCommAbort failed: %s\n", ncclGetErrorString(r));
    }
#ifdef USE_MPI
    if (gpu_mpi_live) {
        gpu_mpi_live = 0;
        MPI_Abort(MPI_COMM_WORLD, 1); /* no MPI_CHECK: it does not return, and must not recurse into exit */
    }
#endif
}

/* Whether a launcher's rank and size variables are set (the pairs
 * launch_rank_world reads): then its -1 means they are wrong, not absent. */
static int launcher_env_present(void) {
    static const char* const pairs[4][2] = {{"SLURM_PROCID", "SLURM_NTASKS"},
                                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                            {"PMI_RANK", "PMI_SIZE"},
                                            {"RANK", "WORLD_SIZE"}};
    for (int i = 0; i < 4; i++)
        if (getenv(pairs[i][0]) && getenv(pairs[i][1])) return 1;
    return 0;
}

/* Learn rank and world, take a GPU, and (with several ranks, or sharding on
 * one) build the NCCL communicator. `init`: auto, mpi, file:PATH or
 * tcp:HOST:PORT (--init). 0, or -1 after a message (then gpu_comm_free). */
static int gpu_comm_init(GpuComm* cm, const char* init, double init_timeout, int sharded, int* argc, char*** argv) {
    memset(cm, 0, sizeof(*cm));
    cm->world = 1;
    cm->dist.world = 1;
    cm->dist.t_start = unix_ms();
    static int handler_set = 0;
    if (!handler_set) {
        CHECK(atexit(gpu_comm_exit_handler) == 0, "cannot register the exit handler");
        handler_set = 1;
    }
    int env_rank = 0, env_world = 1, env_local = 0;
    int launched = launch_rank_world(&env_rank, &env_world, &env_local) == 0;
    if (!launched && launcher_env_present()) return -1; /* launch_rank_world said what is wrong */
    if (!launched) {
        env_rank = 0;
        env_world = 1;
        env_local = 0;
    }
    if (!strcmp(init, "auto")) {
#ifdef USE_MPI
        init = env_world > 1 ? "mpi" : "none";
#else
        if (env_world > 1) {
            fprintf(stderr, "error: the launcher started %d ranks (this is rank %d), but this build has no MPI for them "
                    "to meet through: pass --init file:PATH (a path every rank sees) or --init tcp:HOST:PORT (rank "
                    "0's host), or build train_gpt_cu_mpi and pass --init mpi\n", env_world, env_rank);
            return -1;
        }
        init = "none";
#endif
    }
    Rendezvous rv;
    memset(&rv, 0, sizeof(rv));
    if (!strcmp(init, "none")) {
        snprintf(cm->how, sizeof(cm->how), "one process");
    } else if (!strcmp(init, "mpi")) {
#ifdef USE_MPI
        dist_init(&cm->dist, argc, argv); /* MPI_Init_thread, rank and size */
        cm->mpi = gpu_mpi_live = 1;
        cm->rank = cm->dist.rank;
        cm->world = cm->dist.world;
        /* srun without PMI starts each process as an MPI world of its own (under mpirun inside an
         * allocation the Slurm variables describe mpirun's daemons, so only this case is checked) */
        if (cm->world == 1 && env_world > 1) {
            fprintf(stderr, "error: MPI sees 1 rank but the launcher's environment says %d: under Slurm launch with "
                    "srun --mpi=pmix (scripts/slurm_gpu_pmix.sbatch), or without PMIx use --init tcp:HOST:PORT "
                    "(scripts/slurm_gpu_tcp.sbatch); for one GPU inside an allocation, run srun -n 1\n", env_world);
            return -1;
        }
        MPI_Comm node; /* the ranks on this machine: the local rank picks the GPU */
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, cm->rank, MPI_INFO_NULL, &node));
        MPI_CHECK(MPI_Comm_rank(node, &cm->local_rank));
        MPI_CHECK(MPI_Comm_free(&node));
        snprintf(cm->how, sizeof(cm->how), "MPI");
#else
        (void)argc;
        (void)argv;
        fprintf(stderr, "error: --init mpi needs a build with MPI: make train_gpt_cu_mpi (Open MPI's mpicc); this "
                "build meets through --init file:PATH or --init tcp:HOST:PORT\n");
        return -1;
#endif
    } else {
        const char* problem = rendezvous_parse(&rv, init, init_timeout);
        if (problem) {
            fprintf(stderr, "error: --init %s: %s\n", init, problem);
            return -1;
        }
        if (!launched) {
            fprintf(stderr, "error: --init %s: this process does not know its rank: start one process per GPU with "
                    "srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or mpirun, or set RANK, WORLD_SIZE and "
                    "LOCAL_RANK\n", init);
            return -1;
        }
        cm->rank = env_rank;
        cm->world = env_world;
        cm->local_rank = env_local;
        snprintf(cm->how, sizeof(cm->how), "%s", init);
    }
    cm->dist.rank = cm->rank;
    cm->dist.world = cm->world;
    StartupMark mark = startup_begin(); /* the CUDA context: the start-up line's "device set-up" */
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    cm->device = cm->local_rank % ndev;
    CUDA_CHECK(cudaSetDevice(cm->device));
    size_t total_mem = 0;
    CUDA_CHECK(cudaFree(0)); /* the context, now: the memory check starts from what is free after it */
    CUDA_CHECK(cudaMemGetInfo(&cm->free_at_start, &total_mem));
    startup_end(SU_DEVICE, mark);
    if (cm->world == 1 && !sharded) {
        cm->dist.t_comm = unix_ms();
        return 0;
    }
#if !GPU_HAVE_NCCL /* (gpu_options_problem refused this already) */
    fprintf(stderr, "error: %d rank(s)%s need an NCCL communicator, and %s\n", cm->world,
            sharded ? " under --zero 1|2" : "", GPU_NO_NCCL_HINT);
    return -1;
#endif
    mark = startup_begin(); /* NCCL, the id's exchange included: the start-up line's "communicator" (with MPI_Init:
                             * dist_init) */
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (cm->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
#ifdef USE_MPI
    if (cm->mpi) MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
#endif
    if (!cm->mpi && cm->world > 1 && rendezvous_share(&rv, cm->rank, cm->world, &id, sizeof(id)) != 0) return -1;
    NCCL_CHECK(ncclCommInitRank(&cm->nccl, cm->world, id, cm->rank));
    gpu_watched_comm = cm->nccl;
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&cm->stream, cudaStreamNonBlocking, greatest));
    size_t slots = gpu_comm_slots(cm->world);
    cm->d_slots = (uint64_t*)gpu_alloc(slots * sizeof(uint64_t), GMEM_COMM);
    cm->h_slots = (uint64_t*)gpu_alloc_host(slots * sizeof(uint64_t), GMEM_HOST_COMM);
    cm->dist.t_comm = unix_ms();
    startup_end(SU_COMM, mark);
    return 0;
}

/* End the communicator and MPI. After a failure with several ranks, abort:
 * the others may wait in a collective this rank will never join. */
static void gpu_levels_free(GpuComm* cm, int failed);
static void gpu_comm_free(GpuComm* cm, int failed) {
    gpu_levels_free(cm, failed);
    if (cm->nccl) {
        gpu_watched_comm = NULL;
        if (failed) {
            NCCL_CHECK(ncclCommAbort(cm->nccl));
        } else {
            CUDA_CHECK(cudaStreamSynchronize(cm->stream));
            NCCL_CHECK(ncclCommDestroy(cm->nccl));
            CUDA_CHECK(cudaStreamDestroy(cm->stream));
            gpu_release(cm->d_slots);
            gpu_release_host(cm->h_slots);
        }
        cm->nccl = NULL;
    }
#ifdef USE_MPI
    if (cm->mpi) {
        gpu_mpi_live = 0;
        dist_finish(&cm->dist, failed); /* MPI_Abort after a failure with several ranks, else MPI_Finalize */
        cm->mpi = 0;
    }
#endif
}

/* Sum n doubles over the ranks, in place (the host waits). */
static void gpu_comm_sum(GpuComm* cm, double* x, int n) {
    if (!cm->nccl || cm->world == 1) return;
    ALWAYS(n <= DP_SCALARS);
    memcpy(cm->h_slots, x, (size_t)n * sizeof(double));
    CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, (size_t)n * 8, cudaMemcpyHostToDevice, cm->stream));
    NCCL_CHECK(ncclAllReduce(cm->d_slots, cm->d_slots, (size_t)n, ncclFloat64, ncclSum, cm->nccl, cm->stream));
    CUDA_CHECK(cudaMemcpyAsync(cm->h_slots, cm->d_slots, (size_t)n * 8, cudaMemcpyDeviceToHost, cm->stream));
    gpu_wait(cm->stream, NULL);
    memcpy(x, cm->h_slots, (size_t)n * sizeof(double));
}

/* Before the first step, as train_gpt.c's dist_check_agreement (its
 * run_fingerprint and fingerprints_differ, through NCCL): every rank must hold the same configuration, initial
 * weights and data files, or the run would train nonsense or hang in a
 * collective of the wrong size. All ranks compare all fingerprints, so they
 * all stop together on a mismatch. */
static int gpu_comm_check_agreement(GpuComm* cm, const GPT2* model, const Options* o, int zero,
                                    const DataLoader* train) {
    if (!cm->nccl || cm->world == 1) return 0;
    uint64_t h[3];
    run_fingerprint(model, o, zero, o->overlap, train, h);
    uint64_t* all = cm->h_slots + DP_SCALARS;
    memcpy(cm->h_slots, h, sizeof(h));
    CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, sizeof(h), cudaMemcpyHostToDevice, cm->stream));
    NCCL_CHECK(ncclAllGather(cm->d_slots, cm->d_slots + DP_SCALARS, 3, ncclUint64, cm->nccl, cm->stream));
    CUDA_CHECK(cudaMemcpyAsync(all, cm->d_slots + DP_SCALARS, 3 * sizeof(uint64_t) * (size_t)cm->world,
                               cudaMemcpyDeviceToHost, cm->stream));
    gpu_wait(cm->stream, NULL);
    int bad = fingerprints_differ(all, cm->rank, cm->world);
    return bad ? -1 : 0;
}

/* ---- levels: nodes, bytes per level, hierarchical reduction ------------- */
/* Issue 15; not run on a GPU; checked on the CPU execution layer (4
 * emulated GPUs as --topology 2x2: scripts/test_cuda_levels.sh). The CPU
 * trainer's semantics and flags (gptc/zero3.h), on NCCL:
 * Nodes: --topology NxK (rank r on node r / K: how several nodes are
 * emulated on one machine), else the ranks whose host names match (an
 * all-gather of a hash of gethostname over the world communicator, so it
 * works for every --init; nodes numbered by their lowest rank, the index
 * inside a node by rank). The same all-gather carries a hash of the flags:
 * ranks launched with different ones stop with an error, not a hang.
 * Communicators per level: ncclCommSplit of the world's (NCCL >= 2.18,
 * which real NCCL has had since 2023; the CPU layer implements it as
 * MPI_Comm_split): intra = colour node, key index; inter = colour index,
 * key node. Built only under --hierarchical 1 (their buffers cost device
 * memory); a flat run has the world's alone.
 * Bytes sent, per rank and level, counted as a direct algorithm sends them
 * (as the CPU trainer counts: an all-gather sends this rank's piece to every
 * other rank, a reduction every other rank its piece, a reduce to a root
 * the root its data, a broadcast the root's data to every other rank);
 * fp32 gradients 4 bytes, bf16 weights 2. Summed over the ranks, for n
 * elements of b bytes on N nodes of K:
 *   flat all-reduce          intra 2 (K-1) n b        inter 2 (N-1) K n b
 *   flat reduce-scatter      intra (K-1) n b          inter (N-1) K n b   (ZeRO; all-gathers alike)
 *   hierarchical all-reduce  intra 2 N (K-1) n b      inter 2 (N-1) n b   (plain)
 *   hierarchical to owners   intra N (K-1) n b        inter (N-1) n b     (ZeRO)
 * with n = P per step for plain (its segments), and for ZeRO the padded
 * buckets, P' = W S: ZeRO-1 reduces P' fp32 once, ZeRO-2 once per
 * micro-batch, both all-gather P' bf16 weights (flat, as on the CPU).
 * --hierarchical 1, plain: each slice of n of a bucket, in pieces of
 * s = ceil(n / K): piece i reduced inside the node onto index i
 * (ncclReduce), piece j all-reduced across the nodes among the ranks of
 * index j (1/K of the data), every piece broadcast inside the node from its
 * index (ncclBroadcast); each stage one NCCL group for the whole bucket.
 * ZeRO: each rank q's piece of the bucket reduced inside every node onto the
 * rank with q's index, then across the nodes onto q (ncclReduce, in place;
 * for any placement of the ranks on the nodes). Unlike the CPU trainer's
 * these stay on the communication stream, overlapped with backward as the
 * flat ones are. They sum in another order than the flat path (node sums,
 * then across nodes): equal to it to fp32 round-off, not bitwise. */

static void gpu_levels_add(GpuLevels* lv, int level, double bytes) {
    if (lv->counting) lv->sent[level] += bytes;
}

/* A flat collective over the world of n elements of `elem` bytes in pieces
 * of `piece` (rank q's: [q piece, (q + 1) piece) of n): a reduction
 * (`scatter`) sends every other rank its piece, an all-gather (`gather`)
 * this rank's piece to every other rank. */
static void gpu_levels_count(GpuComm* cm, size_t n, size_t piece, size_t elem, int scatter, int gather) {
    GpuLevels* lv = &cm->lv;
    if (!lv->counting || cm->world == 1) return;
    size_t mine = levels_piece(0, n, piece, cm->rank);
    for (int q = 0; q < cm->world; q++) {
        if (q == cm->rank) continue;
        size_t c = (scatter ? levels_piece(0, n, piece, q) : 0) + (gather ? mine : 0);
        lv->sent[lv->node_of[q] == lv->node ? LEVEL_INTRA : LEVEL_INTER] += (double)(c * elem);
    }
}

/* The nodes from --topology ("" = by host) and --hierarchical (0, 1, -1 =
 * 1 when there is more than one node), and under it the communicators per
 * level. 0, or -1 after a message (every rank sees the same flags and
 * hosts, so all fail alike). Collective. */
static int gpu_levels_init(GpuComm* cm, const char* topology, int hierarchical, int report, int split) {
    GpuLevels* lv = &cm->lv;
    int W = cm->world;
    memset(lv, 0, sizeof(*lv));
    lv->report = report;
    lv->node_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    lv->local_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    uint64_t* all = cm->h_slots + DP_SCALARS; /* (2 W of the 3 W slots: the fingerprints' place, free here) */
    if (W > 1) { /* every rank's host name and flags, hashed: the flags first, or ranks launched with different
                  * ones would meet different collectives below (run_fingerprint compares them too, later) */
        char host[256] = {0};
        CHECK(gethostname(host, sizeof(host) - 1) == 0, "gethostname failed: %s", strerror(errno));
        uint64_t flags = fnv1a(0xCBF29CE484222325ull, topology, strlen(topology));
        cm->h_slots[0] = fnv1a(0xCBF29CE484222325ull, host, strlen(host));
        cm->h_slots[1] = fnv1a(flags, &hierarchical, sizeof(hierarchical));
        CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, 2 * sizeof(uint64_t), cudaMemcpyHostToDevice, cm->stream));
        NCCL_CHECK(ncclAllGather(cm->d_slots, cm->d_slots + DP_SCALARS, 2, ncclUint64, cm->nccl, cm->stream));
        CUDA_CHECK(cudaMemcpyAsync(all, cm->d_slots + DP_SCALARS, 2 * sizeof(uint64_t) * (size_t)W,
                                   cudaMemcpyDeviceToHost, cm->stream));
        gpu_wait(cm->stream, NULL);
        for (int q = 1; q < W; q++)
            if (all[2 * q + 1] != all[1]) {
                fprintf(stderr, "error: rank %d was launched with other --topology/--hierarchical flags than rank 0 "
                        "(this rank: --topology '%s' --hierarchical %d): give every rank the same\n", q, topology,
                        hierarchical);
                return -1;
            }
    }
    lv->by_host = W > 1 && !topology[0]; /* by host: the hashes of the ranks' host names, gathered above */
    lv->hierarchical = levels_layout(topology, hierarchical, W, cm->rank, W > 1 ? all : NULL, 2, "4 GPUs",
                                     lv->node_of, lv->local_of, &lv->nodes, &lv->per_node); /* gptc/zero3.h */
    if (lv->hierarchical < 0) return -1;
    lv->node = lv->node_of[cm->rank];
    lv->local = lv->local_of[cm->rank];
    if (!(lv->hierarchical || split) || W == 1) return 0; /* (split: ZeRO++ talks by level, gpu_zeropp_gather) */
    if (!lv->hierarchical && lv->per_node == 0) return 0; /* (unequal nodes: ZeRO++ refuses them, gpu_zeropp_problem) */
#if GPU_HAVE_SPLIT
    NCCL_CHECK(ncclCommSplit(cm->nccl, lv->node, lv->local, &lv->intra, NULL));
    NCCL_CHECK(ncclCommSplit(cm->nccl, lv->local, lv->node, &lv->inter, NULL));
    return 0;
#else
    if (!lv->hierarchical) return 0; /* (ZeRO++ says what it misses: gpu_zeropp_problem) */
    int v = 0;
    if (GPU_HAVE_NCCL) NCCL_CHECK(ncclGetVersion(&v));
    if (cm->rank == 0)
        fprintf(stderr, "error: --hierarchical 1 builds a communicator per level with ncclCommSplit (NCCL 2.18 or "
                "newer); this build has NCCL %d.%d.%d: give --hierarchical 0 (flat), or rebuild against a newer NCCL "
                "(make nccl-info says which it found)\n", v / 10000, (v / 100) % 100, v % 100);
    return -1;
#endif
}

static void gpu_levels_free(GpuComm* cm, int failed) {
    GpuLevels* lv = &cm->lv;
    ncclComm_t* sub[2] = {&lv->intra, &lv->inter};
    for (int i = 0; i < 2; i++) {
        if (!*sub[i]) continue;
        if (failed) NCCL_CHECK(ncclCommAbort(*sub[i]));
        else NCCL_CHECK(ncclCommDestroy(*sub[i]));
        *sub[i] = NULL;
    }
    free(lv->node_of);
    free(lv->local_of);
    lv->node_of = lv->local_of = NULL;
}

/* The NCCL communicators this rank holds: the world's, and one per level
 * under --hierarchical 1 (the memory headroom's allowance counts them). */
static int gpu_comm_count(const GpuComm* cm) {
    return (cm->nccl != NULL) + (cm->lv.intra != NULL) + (cm->lv.inter != NULL);
}

/* A step begins: its counts from zero. */
static void gpu_levels_step_begin(GpuComm* cm) {
    cm->lv.sent[LEVEL_INTRA] = cm->lv.sent[LEVEL_INTER] = 0.0;
    cm->lv.counting = 1;
}

/* After the step's update: its bytes into the run's, and with --comm-levels
 * 1 a line (summed over the ranks: collective), as train_gpt.c's
 * levels_step_end. */
static void gpu_levels_step_end(GpuComm* cm, int step) {
    GpuLevels* lv = &cm->lv;
    lv->counting = 0;
    lv->steps++;
    for (int e = 0; e < NUM_LEVELS; e++) lv->sent_run[e] += lv->sent[e];
    if (lv->report) {
        double all[NUM_LEVELS] = {lv->sent[0], lv->sent[1]};
        gpu_comm_sum(cm, all, NUM_LEVELS);
        printf("step %d: bytes sent: %s %.0f, %s %.0f (summed over the ranks); rank 0: %.0f, %.0f\n", step,
               LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], lv->sent[0], lv->sent[1]);
    }
}

/* At the end: the topology and the bytes per level per step (collective),
 * the CPU trainer's line (levels_print). */
static void gpu_levels_print(GpuComm* cm) {
    GpuLevels* lv = &cm->lv;
    if (cm->world <= 1 || lv->steps == 0) return;
    double per[NUM_LEVELS], all[NUM_LEVELS];
    for (int e = 0; e < NUM_LEVELS; e++) per[e] = all[e] = lv->sent_run[e] / lv->steps;
    gpu_comm_sum(cm, all, NUM_LEVELS);
    printf("bytes sent per step by level (%d node(s) x %d rank(s), %s reduction): %s %.0f, %s %.0f summed over the "
           "ranks; rank 0: %.0f, %.0f\n", lv->nodes, lv->per_node, lv->hierarchical ? "hierarchical" : "flat",
           LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], per[0], per[1]);
}

/* Plain, --hierarchical 1: sum the bucket's slices (n[i] floats at x[i],
 * i < nseg) over the ranks in place, by level (see above). */
static void gpu_levels_allreduce(GpuComm* cm, float* const* x, const size_t* n, int nseg, cudaStream_t cs) {
    GpuLevels* lv = &cm->lv;
    int K = lv->per_node, N = lv->nodes, j = lv->local;
    NCCL_CHECK(ncclGroupStart()); /* 1: piece i of each slice summed inside the node onto index i */
    for (int g = 0; g < nseg; g++) {
        size_t s = (n[g] + (size_t)K - 1) / (size_t)K;
        for (int i = 0; i < K; i++) {
            size_t c = levels_piece(0, n[g], s, i);
            if (!c) continue;
            if (i != j) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)c);
            float* p = x[g] + (size_t)i * s;
            NCCL_CHECK(ncclReduce(p, p, c, ncclFloat, ncclSum, i, lv->intra, cs));
        }
    }
    NCCL_CHECK(ncclGroupEnd());
    if (N > 1) {
        NCCL_CHECK(ncclGroupStart()); /* 2: piece j across the nodes, among the ranks of index j */
        for (int g = 0; g < nseg; g++) {
            size_t s = (n[g] + (size_t)K - 1) / (size_t)K, cj = levels_piece(0, n[g], s, j);
            if (!cj) continue;
            size_t p = (cj + (size_t)N - 1) / (size_t)N, mine = levels_piece(0, cj, p, lv->node);
            gpu_levels_add(lv, LEVEL_INTER, 4.0 * (double)(cj - mine + mine * (size_t)(N - 1)));
            NCCL_CHECK(ncclAllReduce(x[g] + (size_t)j * s, x[g] + (size_t)j * s, cj, ncclFloat, ncclSum, lv->inter, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    NCCL_CHECK(ncclGroupStart()); /* 3: every piece to the node from its index */
    for (int g = 0; g < nseg; g++) {
        size_t s = (n[g] + (size_t)K - 1) / (size_t)K;
        for (int i = 0; i < K; i++) {
            size_t c = levels_piece(0, n[g], s, i);
            if (!c) continue;
            if (i == j) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)(c * (size_t)(K - 1)));
            float* p = x[g] + (size_t)i * s;
            NCCL_CHECK(ncclBroadcast(p, p, c, ncclFloat, i, lv->intra, cs));
        }
    }
    NCCL_CHECK(ncclGroupEnd());
}

/* ZeRO, --hierarchical 1: sum a packed bucket (W pieces of `piece` floats,
 * rank q's at q piece) over the ranks, rank q's sum landing in place at its
 * piece: inside every node onto the rank with q's index, then across the
 * nodes onto q. */
static void gpu_levels_reduce_to_owners(GpuComm* cm, float* bucket, size_t piece, cudaStream_t cs) {
    GpuLevels* lv = &cm->lv;
    int W = cm->world;
    NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < W; q++) {
        float* p = bucket + (size_t)q * piece;
        if (lv->local != lv->local_of[q]) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)piece);
        NCCL_CHECK(ncclReduce(p, p, piece, ncclFloat, ncclSum, lv->local_of[q], lv->intra, cs));
    }
    NCCL_CHECK(ncclGroupEnd());
    if (lv->nodes == 1) return;
    NCCL_CHECK(ncclGroupStart()); /* among the ranks of this index: the pieces of the ranks with it */
    for (int q = 0; q < W; q++) {
        if (lv->local_of[q] != lv->local) continue;
        float* p = bucket + (size_t)q * piece;
        if (lv->node != lv->node_of[q]) gpu_levels_add(lv, LEVEL_INTER, 4.0 * (double)piece);
        NCCL_CHECK(ncclReduce(p, p, piece, ncclFloat, ncclSum, lv->node_of[q], lv->inter, cs));
    }
    NCCL_CHECK(ncclGroupEnd());
}

/* ---- gradients and weights across the ranks ----------------------------- */

/* ZeRO++ on --zero 3 (gpu_zeropp_init; NULL in GpuDataParallel without its flags). */
typedef struct {
    int qwz, qgz, feedback, hpz, block; /* the flags: bits (0: bf16 gathers, fp32 reductions), 0/1, block */
    int N, K, node, local;   /* nodes, ranks per node, this rank's node and index in it */
    int* who;                /* (W) host: the world rank of (local j, node p) at j N + p */
    int* who_dev;            /* (W) the same on the device */
    int* slot_of;            /* (W) device: rank q's slot, local_of[q] N + node_of[q] */
    uint8_t *send, *recv;    /* (W sb) each (gpu_zeropp_sizes) */
    float* partial;          /* qgZ (N piece) */
    floatX* secondary;       /* hpZ (N S): bucket b's [local N piece, + N piece) at N offset(b) */
    float* residual;         /* --qgz-feedback ((W + N) S) */
    int sec_step, sec_filled; /* the step it was cut in (GpuLevels.steps), and whether the cut is complete */
    FILE* dump;              /* GPTC_ZEROPP_DUMP: this rank's records (gptc/zeropp.h's format), else NULL */
    int dump_step, dump_sec_step;
} GpuZeroPP;

typedef struct {
    GpuComm* comm;
    GpuGPT2* g;
    int zero, rank, world, L;
    int active;            /* collectives run: several ranks, or ZeRO on one */
    int overlap;           /* reduce each bucket as backward finishes it (ZeRO-2: always) */
    ShardMap map;          /* this rank's layout (G2) */
    ShardMap* map_dev;     /* the same on the device, for adamw_shard_kernel */
    size_t shard;          /* S: elements of every rank's shard */
    /* ZeRO (NULL in plain mode) */
    float* grad_shard;     /* (S) the summed gradient of this rank's shard */
    float* master;         /* (S) fp32 master weights of the shard */
    float* m;              /* (S) AdamW moments */
    float* v;              /* (S) */
    floatX* param_shard;   /* (S) the shard's updated bf16 weights, which the all-gather sends */
    float* grad_memory;    /* the gradient buckets: ZeRO-1 all L + 1, ZeRO-2 two layer slots and the rest */
    size_t grad_floats;
    float** bucket;        /* (L + 1) each bucket's packed gradients (ZeRO-2: the layers share two slots) */
    /* events */
    cudaEvent_t grads_ready;  /* compute: a bucket's gradients are final */
    cudaEvent_t reduced;      /* communication: the step's reductions are done */
    cudaEvent_t updated;      /* compute: AdamW has written the bf16 shard */
    cudaEvent_t comm_idle;    /* communication: everything queued so far is done (the weights are whole) */
    cudaEvent_t slot_free[3]; /* ZeRO-2/3: layer slots 0 and 1 and the rest's bucket have been reduced */
    /* ZeRO-3: the gathered weights, in g->params_memory (dp_weight_elems; NULL otherwise) */
    floatX* head;             /* (W rest.piece) wte | wpe | lnfw | lnfb packed: gathered at every forward, kept
                                 through its backward */
    floatX* layer_buf[2];     /* (W layer.piece) each: layer l's 12 slices packed, in buffer l % 2 */
    cudaEvent_t w_free;       /* compute: what it has queued so far is done (a buffer's last reader among it) */
    cudaEvent_t w_ready[3];   /* communication: layer buffer 0, 1, the head gathered */
    cudaEvent_t t_backward, t_reduced, t_gather0, t_gather1; /* timing */
    int armed;                /* this backward's end hooks reduce */
    int gathered;             /* this step ran the all-gather */
    int backward;             /* ZeRO-3: the gathers being issued are backward's (dp_weights_begin's flag) */
    GpuZeroPP* zpp;           /* ZeRO++ (--qwz, --qgz, --hpz), or NULL */
    int zpp_flags[5];         /* qwz, qgz, feedback, hpz, block: dp_zeropp_flags, before dp_init */
    double exposed_ms, gather_ms; /* sums over steps: reduction left after backward, all-gather */
    int steps_timed;
} GpuDataParallel;

/* Shapes and sizes only (nothing allocated): enough for the memory plan. */
static void dp_layout(GpuDataParallel* dp, GpuComm* comm, const GPT2Config* c, int zero, int overlap) {
    memset(dp, 0, sizeof(*dp));
    dp->comm = comm;
    dp->zero = zero;
    dp->rank = comm->rank;
    dp->world = comm->world;
    dp->L = c->num_layers;
    dp->active = comm->nccl != NULL;
    dp->overlap = overlap || zero >= 2;
    dp_sizes(c, zero, comm->rank, comm->world, &dp->map, &dp->shard, &dp->grad_floats); /* (the plan's too) */
}

/* Bucket b's padded length (W pieces). */
static size_t dp_bucket_floats(const GpuDataParallel* dp, int b) {
    return shard_map_bucket(&dp->map, b)->piece * (size_t)dp->world;
}

/* ---- ZeRO++ on --zero 3: qwZ, hpZ, qgZ over NCCL ---------------------------
 * Issue 15; not run on a GPU: every kernel and collective below ran on the
 * CPU execution layer only (emulated GPUs = MPI ranks, NCCL over MPI;
 * scripts/test_cuda_zeropp.sh). The CPU trainer's semantics (gptc/zeropp.h,
 * whose header tells the story), on the GPU's bucket layout: the unit is a
 * bucket (a layer's 12 slices packed, or the rest: wte | wpe | lnf), whose
 * W pieces all have the same length `piece`, rank q's at q piece; so a
 * slot has one size sb = quant_slot_bytes(piece) on every rank and each
 * level's exchange is one NCCL collective or group of equal messages. The
 * machine is gpu_levels_init's: N nodes of K ranks, communicators intra
 * (ranked by local index j) and inter (ranked by node p), from ncclCommSplit.
 *   qwZ (--qwz 8|4), a gathered bucket: quant_encode_gpu quantises this
 *     rank's piece of the fp32 master (not the bf16 shard) into its slot at
 *     (j N + p) sb of `send`; ncclAllGather over inter (each slot to the ranks
 *     with its j: (N-1) sb bytes inter-node), then over intra of the N slots
 *     of each j as one bundle ((K-1) N sb intra-node), both in place;
 *     qwz_decode_kernel dequantises all W slots (this rank's own too) into
 *     the bf16 gather buffer, rounded to nearest: every rank computes with
 *     bf16(deq(q(master))).
 *   hpZ (--hpz 1): local index j keeps `secondary`, bucket b's elements [j N
 *     piece, (j+1) N piece) in bf16 (N S in all), copied out of the gather
 *     buffer by each step's first forward (before any backward); from the
 *     step's first backward gather on (backward, and the forwards of later
 *     micro-batches) a bucket is ncclAllGather'ed from the node's
 *     secondaries over intra: (K-1) N piece x 2 bytes intra-node, nothing
 *     across. Validation, outside a step, gathers from the primary shards.
 *     Alone it gathers the very bf16 of plain --zero 3: bit for bit its run.
 *   qgZ (--qgz 4|8), a reduced bucket (this rank's packed gradients): hop 0,
 *     every piece owned by another local index quantised (error feedback:
 *     residual + v, what was lost kept) and sent as N slots per node peer by
 *     ncclSend/ncclRecv in one group over intra ((K-1) N sb intra-node);
 *     qgz_hop0_kernel sums in fp32 the rank's own values and the peers'
 *     dequantised slots for the N pieces of its local index; hop 1, each of
 *     those partial sums but its own node's quantised once and sent to the
 *     node that owns it, one group over inter ((N-1) sb inter-node);
 *     qgz_hop1_kernel adds the other nodes' into its own and the result into
 *     grad_shard. The sum orders are the CPU's (peers j-1, j-2, ... at hop
 *     0; nodes p-1, p-2, ... at hop 1).
 * Everything runs on the communication stream, ordered after the events
 * plain ZeRO-3 has (w_free before a gather, grads_ready before a reduction,
 * slot_free after it), and shares its buffers (send, recv) because that
 * stream runs one thing at a time. GPTC_ZEROPP_DUMP=dir writes
 * gptc/zeropp.h's records, in this layout (scripts/zeropp_ref.py --layout
 * buckets --gather bf16): a = the bucket's offset in the shard and n = W
 * piece for gathers and reductions (rank q's piece at q piece of the
 * record), the masters (without qwZ: the bf16 shard that is gathered, which
 * AdamW rounded stochastically from the master) and grad_shard as [rank S,
 * + S), the secondary in
 * the same shard-major order ([j N S, + N S)), the gathered weights as the
 * bf16 buffer's values. Each record waits for the stream (a debugging aid:
 * unset it to time anything). */

/* one record: header then n fp32 (gptc/zeropp.h's zeropp_dump) */
static void gpu_zeropp_record(GpuDataParallel* dp, int tag, int source, size_t a, size_t n, const float* host) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    int64_t h[8] = {ZEROPP_DUMP_MAGIC, tag, lv->steps, dp->backward, source, (int64_t)a, (int64_t)n, 0};
    CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(host, sizeof(float), n, z->dump) == n,
          "GPTC_ZEROPP_DUMP: writing rank %d's record failed (disk full?): unset it or free space", dp->rank);
}

/* n elements of device memory (bf16 when `half`, else fp32), read on the
 * communication stream once what it has queued is done, as fp32 on the host
 * (malloc'd: the caller frees it). */
static float* gpu_zeropp_fetch(GpuDataParallel* dp, const void* dev, size_t n, int half) {
    cudaStream_t cs = dp->comm->stream;
    float* host = xmalloc_floats(n ? n : 1);
    if (half) {
        uint16_t* raw = (uint16_t*)xmalloc(n * sizeof(uint16_t) + 1);
        CUDA_CHECK(cudaMemcpyAsync(raw, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, cs));
        gpu_wait(cs, NULL);
        for (size_t i = 0; i < n; i++) { /* bf16 is the top half of an fp32: exact */
            uint32_t u = (uint32_t)raw[i] << 16;
            memcpy(host + i, &u, sizeof(u));
        }
        free(raw);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, cs));
        gpu_wait(cs, NULL);
    }
    return host;
}

static void gpu_zeropp_dump(GpuDataParallel* dp, int tag, int source, size_t a, size_t n, const void* dev, int half) {
    float* host = gpu_zeropp_fetch(dp, dev, n, half);
    gpu_zeropp_record(dp, tag, source, a, n, host);
    free(host);
}

/* hpZ's secondary, in shard-major order (rank j N + i's pieces at i S + offset(b)) */
static void gpu_zeropp_dump_secondary(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    size_t S = dp->shard, N = (size_t)z->N;
    float* sec = gpu_zeropp_fetch(dp, z->secondary, N * S, 1);
    float* out = xmalloc_floats(N * S);
    for (int b = 0; b <= dp->L; b++) {
        size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b);
        for (size_t i = 0; i < N; i++) memcpy(out + i * S + off, sec + N * off + i * p, p * sizeof(float));
    }
    gpu_zeropp_record(dp, 3, 2, (size_t)z->local * N * S, N * S, out);
    free(sec);
    free(out);
}

/* The flags, before dp_init allocates (gpu_train_build). */
static void dp_zeropp_flags(GpuDataParallel* dp, const Options* o) {
    int f[5] = {o->qwz, o->qgz, o->qgz_feedback, o->hpz, o->quant_block};
    memcpy(dp->zpp_flags, f, sizeof(f));
}

/* What ZeRO++ needs of the machine, before anything is allocated: nodes of
 * equal size, and a communicator per level. NULL or the problem. */
static const char* gpu_zeropp_problem(const GpuComm* cm, const Options* o) {
    if (!(o->qwz || o->qgz || o->hpz) || cm->world == 1) return NULL;
    if (cm->lv.per_node == 0)
        return "--qwz/--qgz/--hpz need nodes of equal size: give --topology NxK (or launch the same number of "
               "ranks on every host)";
    if (!cm->lv.intra || !cm->lv.inter)
        return "--qwz/--qgz/--hpz talk by level over communicators split from the world's (ncclCommSplit, NCCL 2.18 "
               "or newer), which this build cannot make: drop them, or rebuild against a newer NCCL";
    return NULL;
}

/* Allocate ZeRO++'s buffers (gpu_zeropp_sizes, all in the ledger as
 * GMEM_ZERO), its maps and the dump; dp_init calls it under --zero 3. */
static void gpu_zeropp_init(GpuDataParallel* dp) {
    int* f = dp->zpp_flags;
    if (!(f[0] || f[1] || f[3])) return;
    const GpuLevels* lv = &dp->comm->lv;
    int W = dp->world;
    GpuZeroPP* z = (GpuZeroPP*)xmalloc(sizeof(GpuZeroPP));
    memset(z, 0, sizeof(*z));
    z->qwz = f[0], z->qgz = f[1], z->feedback = f[2], z->hpz = f[3], z->block = f[4];
    z->N = W > 1 ? lv->nodes : 1, z->K = W > 1 ? lv->per_node : 1;
    z->node = W > 1 ? lv->node : 0, z->local = W > 1 ? lv->local : 0;
    ALWAYS(z->N * z->K == W);
    z->sec_step = z->dump_step = z->dump_sec_step = -1;
    GpuZeroPPSizes s = gpu_zeropp_sizes(&dp->map, dp->shard, W, z->N, z->qwz, z->qgz, z->feedback, z->hpz, z->block);
    z->who = (int*)xmalloc(sizeof(int) * (size_t)W);
    int* slot_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    for (int q = 0; q < W; q++) {
        slot_of[q] = W > 1 ? lv->local_of[q] * z->N + lv->node_of[q] : 0;
        z->who[slot_of[q]] = q;
    }
    z->who_dev = (int*)gpu_alloc(sizeof(int) * (size_t)W, GMEM_ZERO);
    z->slot_of = (int*)gpu_alloc(sizeof(int) * (size_t)W, GMEM_ZERO);
    CUDA_CHECK(cudaMemcpy(z->who_dev, z->who, sizeof(int) * (size_t)W, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(z->slot_of, slot_of, sizeof(int) * (size_t)W, cudaMemcpyHostToDevice));
    free(slot_of);
    if (s.slot_buffers >= 1) z->send = (uint8_t*)gpu_alloc(s.slots, GMEM_ZERO);
    if (s.slot_buffers >= 2) z->recv = (uint8_t*)gpu_alloc(s.slots, GMEM_ZERO);
    z->partial = (float*)gpu_alloc(s.partial * sizeof(float), GMEM_ZERO);
    z->secondary = (floatX*)gpu_alloc(s.secondary * sizeof(floatX), GMEM_ZERO);
    z->residual = (float*)gpu_alloc(s.residual * sizeof(float), GMEM_ZERO);
    if (z->residual) CUDA_CHECK(cudaMemset(z->residual, 0, s.residual * sizeof(float))); /* nothing lost yet */
    dp->zpp = z;
    const char* dir = getenv("GPTC_ZEROPP_DUMP");
    if (dir && *dir) { /* gptc/zeropp.h's config record */
        char path[4096];
        CHECK(snprintf(path, sizeof(path), "%s/rank%d.bin", dir, dp->rank) < (int)sizeof(path),
              "GPTC_ZEROPP_DUMP=%s: the path is too long", dir);
        z->dump = fopen(path, "wb");
        CHECK(z->dump != NULL, "GPTC_ZEROPP_DUMP: cannot create %s: make the folder (or unset it)", path);
        int64_t h[8] = {ZEROPP_DUMP_MAGIC, 0, (int64_t)dp->shard, z->K, W, z->N, 0, 0};
        int64_t g[8] = {z->qwz, z->qgz, z->feedback, z->hpz, z->block, z->node, z->local,
                        (int64_t)dp->g->num_parameters};
        CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(g, sizeof(g), 1, z->dump) == 1,
              "GPTC_ZEROPP_DUMP: writing %s failed (disk full?)", path);
    }
    if (dp->rank == 0) {
        printf("ZeRO++ (not run on a GPU; checked on the CPU execution layer): weights gathered %s",
               z->qwz ? (z->qwz == 8 ? "as INT8 blocks from the fp32 master" : "as INT4 blocks from the fp32 master")
                      : "in bf16");
        if (z->hpz) printf(", after each step's first forward from hpZ's node-local bf16 secondary (%zu a rank)",
                           s.secondary);
        printf("; gradients reduced %s", z->qgz ? (z->qgz == 8 ? "as INT8 by level" : "as INT4 by level") : "in fp32");
        if (z->feedback) printf(" with error feedback (%zu floats a rank, reset on resume)", s.residual);
        if (z->qwz || z->qgz) printf("; blocks of %d, one fp32 scale each", z->block);
        printf("; %d node(s) x %d; %.2f MB of buffers\n", z->N, z->K, gpu_zeropp_bytes(&s) / 1048576.0);
    }
}

static void gpu_zeropp_free(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    if (!z) return;
    CHECK(!z->dump || fclose(z->dump) == 0, "GPTC_ZEROPP_DUMP: closing rank %d's file failed (disk full?)", dp->rank);
    void* mem[] = {z->who_dev, z->slot_of, z->send, z->recv, z->partial, z->secondary, z->residual};
    for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++) gpu_release(mem[i]);
    free(z->who);
    free(z);
    dp->zpp = NULL;
}

/* Bucket b (pieces of p) into dst (W p bf16) on the communication stream,
 * which has waited for the compute stream (dp_gather_bucket): from hpZ's
 * secondary inside a step once its first forward is gathered, else from
 * the primary shards, as qwZ slots or bf16 (cutting the secondary when
 * this is a step's first forward). */
static void gpu_zeropp_gather(GpuDataParallel* dp, int b, floatX* dst) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    cudaStream_t cs = dp->comm->stream;
    size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b), W = (size_t)dp->world;
    size_t N = (size_t)z->N, K = (size_t)z->K, j = (size_t)z->local, node = (size_t)z->node;
    int dump = z->dump && lv->counting, cut = 0;
    if (dump && z->dump_step != lv->steps) /* the step's first gather: what it gathers from (qwZ: the fp32 master, */
        z->dump_step = lv->steps,           /* else the bf16 shard that AdamW rounded from it) */
            gpu_zeropp_dump(dp, 1, 0, (size_t)dp->rank * dp->shard, dp->shard,
                            z->qwz ? (const void*)dp->master : (const void*)dp->param_shard, !z->qwz);
    if (z->hpz && lv->counting) {
        if (z->sec_step != lv->steps) z->sec_step = lv->steps, z->sec_filled = 0; /* a new step: new weights */
        if (dp->backward) z->sec_filled = 1; /* the first forward gathered every bucket */
        if (z->sec_filled) {
            if (dump && z->dump_sec_step != lv->steps) z->dump_sec_step = lv->steps, gpu_zeropp_dump_secondary(dp);
            if (K > 1) {
                gpu_levels_add(lv, LEVEL_INTRA, (double)((K - 1) * N * p * sizeof(floatX)));
                NCCL_CHECK(ncclAllGather(z->secondary + N * off, dst, N * p, ncclBfloat16, lv->intra, cs));
            } else {
                CUDA_CHECK(cudaMemcpyAsync(dst, z->secondary + N * off, W * p * sizeof(floatX),
                                           cudaMemcpyDeviceToDevice, cs));
            }
            if (dump) gpu_zeropp_dump(dp, 2, 2, off, W * p, dst, 1);
            return;
        }
        cut = 1;
    }
    if (z->qwz) {
        size_t sb = quant_slot_bytes(p, z->qwz, z->block);
        uint8_t* mine = z->send + (j * N + node) * sb;
        quant_encode_gpu(mine, dp->master + off, NULL, p, z->qwz, z->block, cs);
        if (N > 1) { /* across nodes first: this rank's slot to the ranks with its local index (in place) */
            gpu_levels_add(lv, LEVEL_INTER, (double)((N - 1) * sb));
            NCCL_CHECK(ncclAllGather(mine, z->send + j * N * sb, sb, ncclUint8, lv->inter, cs));
        }
        if (K > 1) { /* then inside the node: the N slots of each local index as one bundle (in place) */
            gpu_levels_add(lv, LEVEL_INTRA, (double)((K - 1) * N * sb));
            NCCL_CHECK(ncclAllGather(z->send + j * N * sb, z->send, N * sb, ncclUint8, lv->intra, cs));
        }
        qwz_decode_kernel<<<ceil_div((long long)(W * p), 256), 256, 0, cs>>>(dst, z->send, z->slot_of, sb, p, (int)W,
                                                                             z->qwz, z->block);
        KERNEL_CHECK();
    } else {
        gpu_levels_count(dp->comm, p * W, p, sizeof(floatX), 0, 1); /* (flat) */
        NCCL_CHECK(ncclAllGather(dp->param_shard + off, dst, p, ncclBfloat16, dp->comm->nccl, cs));
    }
    if (dump) gpu_zeropp_dump(dp, 2, z->qwz ? 1 : 0, off, W * p, dst, 1);
    if (cut) /* this local index's part of the bucket into the secondary */
        CUDA_CHECK(cudaMemcpyAsync(z->secondary + N * off, dst + j * N * p, N * p * sizeof(floatX),
                                   cudaMemcpyDeviceToDevice, cs));
}

/* qgZ: bucket b's packed gradients (W p, on the communication stream, which
 * has waited for them) summed over the ranks, this rank's piece added into
 * shard_part (its place in grad_shard). */
static void gpu_zeropp_reduce(GpuDataParallel* dp, int b, float* shard_part) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    cudaStream_t cs = dp->comm->stream;
    size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b), W = (size_t)dp->world;
    size_t S = dp->shard, sb = quant_slot_bytes(p, z->qgz, z->block);
    int N = z->N, K = z->K, j = z->local, node = z->node, bits = z->qgz;
    const float* bucket = dp->bucket[b];
    int dump = z->dump && lv->counting;
    if (dump) gpu_zeropp_dump(dp, 4, 0, off, W * p, bucket, 0);
    float* res0 = z->residual;                      /* hop 0's: (W, S), by the piece's rank and place */
    float* res1 = res0 ? res0 + W * S : NULL;        /* hop 1's: (N, S), by destination node and place */
    if (K > 1) { /* hop 0: the pieces of the other local indices, quantised, N slots to each node peer */
        for (int i = 0; i < K * N; i++) {
            if (i / N == j) continue;
            size_t q = (size_t)z->who[i];
            quant_encode_gpu(z->send + (size_t)i * sb, bucket + q * p, res0 ? res0 + q * S + off : NULL, p, bits,
                             z->block, cs);
        }
        NCCL_CHECK(ncclGroupStart());
        for (int t = 1; t < K; t++) {
            int to = (j + t) % K, from = (j - t + K) % K;
            gpu_levels_add(lv, LEVEL_INTRA, (double)((size_t)N * sb));
            NCCL_CHECK(ncclSend(z->send + (size_t)to * N * sb, (size_t)N * sb, ncclUint8, to, lv->intra, cs));
            NCCL_CHECK(ncclRecv(z->recv + (size_t)from * N * sb, (size_t)N * sb, ncclUint8, from, lv->intra, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    qgz_hop0_kernel<<<ceil_div((long long)N * (long long)p, 256), 256, 0, cs>>>(z->partial, bucket, z->who_dev, z->recv,
                                                                              sb, p, N, K, j, bits, z->block);
    KERNEL_CHECK();
    if (N > 1) { /* hop 1: each other node's partial sum, quantised once, to the rank of this index there */
        for (int q = 0; q < N; q++) {
            if (q == node) continue;
            quant_encode_gpu(z->send + (size_t)q * sb, z->partial + (size_t)q * p,
                             res1 ? res1 + (size_t)q * S + off : NULL, p, bits, z->block, cs);
        }
        NCCL_CHECK(ncclGroupStart());
        for (int t = 1; t < N; t++) {
            int to = (node + t) % N, from = (node - t + N) % N;
            gpu_levels_add(lv, LEVEL_INTER, (double)sb);
            NCCL_CHECK(ncclSend(z->send + (size_t)to * sb, sb, ncclUint8, to, lv->inter, cs));
            NCCL_CHECK(ncclRecv(z->recv + (size_t)from * sb, sb, ncclUint8, from, lv->inter, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    qgz_hop1_kernel<<<ceil_div((long long)p, 256), 256, 0, cs>>>(shard_part, z->partial + (size_t)node * p, z->recv, sb,
                                                                 p, N, node, bits, z->block);
    KERNEL_CHECK();
    if (dump) gpu_zeropp_dump(dp, 5, 0, (size_t)dp->rank * S, S, dp->grad_shard, 0);
}

/* The backward hooks (GpuGPT2's grads_begin / grads_end). */
static void dp_reduce_bucket(GpuDataParallel* dp, int b);

static void dp_grads_begin(void* ctx, int b) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    if (dp->zero < 2) return;
    /* ZeRO-2/3: the slot must be reduced (layer b + 2, or the previous micro-batch) before backward refills it */
    cudaStream_t s = dp->g->stream;
    CUDA_CHECK(cudaStreamWaitEvent(s, dp->slot_free[b == dp->L ? 2 : b % 2], 0));
    CUDA_CHECK(cudaMemsetAsync(dp->bucket[b], 0, dp_bucket_floats(dp, b) * sizeof(float), s));
}

static void dp_grads_end(void* ctx, int b) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    if (!dp->armed) return;
    if (dp->overlap) {
        dp_reduce_bucket(dp, b);
    } else if (b == dp->L) { /* --overlap 0: everything after backward, in the same order */
        for (int l = dp->L - 1; l >= 0; l--) dp_reduce_bucket(dp, l);
        dp_reduce_bucket(dp, dp->L);
    }
    if (b == dp->L) {
        CUDA_CHECK(cudaEventRecord(dp->reduced, dp->comm->stream));
        CUDA_CHECK(cudaEventRecord(dp->t_reduced, dp->comm->stream));
    }
}

/* Bucket b's gradients are final on the compute stream: sum them over the
 * ranks on the communication stream (plain: allreduce in place; ZeRO-1:
 * reduce-scatter into the shard; ZeRO-2: reduce-scatter in place, then the
 * piece added into the shard and the slot released). */
static void dp_reduce_bucket(GpuDataParallel* dp, int b) {
    GpuGPT2* g = dp->g;
    cudaStream_t cs = dp->comm->stream;
    ncclComm_t nc = dp->comm->nccl;
    CUDA_CHECK(cudaEventRecord(dp->grads_ready, g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->grads_ready, 0));
    const BucketShape* s = shard_map_bucket(&dp->map, b);
    size_t l = b < dp->L ? (size_t)b : 0, W = (size_t)dp->world;
    int by_level = dp->comm->lv.hierarchical && dp->world > 1; /* (gpu_levels_allreduce, _reduce_to_owners) */
    if (dp->zero == 0) {
        float* x[DP_MAX_SEGMENTS];
        size_t n[DP_MAX_SEGMENTS];
        for (int k = 0; k < s->nseg; k++) {
            x[k] = g->grads_memory + s->off[k] + l * s->stride[k];
            n[k] = s->pre[k + 1] - s->pre[k];
            if (!by_level) gpu_levels_count(dp->comm, n[k], (n[k] + W - 1) / W, sizeof(float), 1, 1);
        }
        if (by_level) {
            gpu_levels_allreduce(dp->comm, x, n, s->nseg, cs);
            return;
        }
        NCCL_CHECK(ncclGroupStart()); /* one launch for the bucket's slices */
        for (int k = 0; k < s->nseg; k++) NCCL_CHECK(ncclAllReduce(x[k], x[k], n[k], ncclFloat, ncclSum, nc, cs));
        NCCL_CHECK(ncclGroupEnd());
        return;
    }
    float* shard_part = dp->grad_shard + shard_map_offset(&dp->map, b);
    if (dp->zpp && dp->zpp->qgz) { /* ZeRO++'s qgZ (gpu_zeropp_reduce), in place of the fp32 reduce-scatter */
        gpu_zeropp_reduce(dp, b, shard_part);
        CUDA_CHECK(cudaEventRecord(dp->slot_free[b == dp->L ? 2 : b % 2], cs));
        return;
    }
    float* mine = dp->bucket[b] + (size_t)dp->rank * s->piece; /* in place: rank r's piece of the bucket */
    if (by_level) gpu_levels_reduce_to_owners(dp->comm, dp->bucket[b], s->piece, cs); /* the sum lands at mine */
    else gpu_levels_count(dp->comm, W * s->piece, s->piece, sizeof(float), 1, 0);
    if (dp->zero == 1) {
        if (by_level)
            CUDA_CHECK(cudaMemcpyAsync(shard_part, mine, s->piece * sizeof(float), cudaMemcpyDeviceToDevice, cs));
        else NCCL_CHECK(ncclReduceScatter(dp->bucket[b], shard_part, s->piece, ncclFloat, ncclSum, nc, cs));
        return;
    }
    if (!by_level) NCCL_CHECK(ncclReduceScatter(dp->bucket[b], mine, s->piece, ncclFloat, ncclSum, nc, cs));
    accumulate_kernel<<<ceil_div((long long)s->piece, 256), 256, 0, cs>>>(shard_part, mine, s->piece);
    KERNEL_CHECK();
    CUDA_CHECK(cudaEventRecord(dp->slot_free[b == dp->L ? 2 : b % 2], cs));
}

/* ZeRO-3 (issue 15; not run on a GPU; checked on the CPU execution layer,
 * scripts/test_cuda_zero3.sh). The bf16 weights are sharded as the master
 * is: rank r keeps param_shard, its piece of every bucket (S), which AdamW
 * (adamw_shard_kernel) writes in place; nothing is gathered after the
 * update. They are gathered where they are used, by ncclAllGather of one
 * bucket on the communication stream into a buffer that the layer's
 * kernels and cuBLASLt calls read (gpu_layer_params), the CPU trainer's
 * scheme (gptc/zero3.h): the head (wte | wpe | lnf) at the start of every
 * forward, held through its backward (the LM head is wte: needed at the end
 * of forward and the start of backward); layer l before its forward and
 * again before its backward, into buffer l % 2, the next layer's gather (l
 * + 1 in forward, l - 1 in backward) issued when layer l's kernels are
 * queued, so that it runs while layer l computes. Order: a gather waits
 * (w_free) for everything the compute stream queued before it (the
 * buffer's last reader, layer l - 1 or l + 1, and the update that wrote the
 * shard); the compute stream waits (w_ready) for the gather before the
 * layer. The gradients are ZeRO-2's (two one-layer slots reduce-scattered
 * as backward finishes each layer, the head's bucket at the end), so the
 * weights read, the sums and the update are ZeRO-2's: the losses equal
 * ZeRO-2's bit for bit. Bytes each rank sends per step, A micro-batches
 * (flat; bf16 weights, fp32 gradients; P' = L Pl + Pr the padded buckets,
 * Pl = W x layer piece, Pr = W x rest piece):
 *   (W-1)/W x (4 B x P' x A reduce-scatter + 2 B x A (Pr + 2 L Pl) all-gather)
 * against ZeRO-2's (W-1)/W x (4 P' A + 2 P'): per micro-batch one gather of
 * the weights for forward and one more of the layers for backward (about
 * 3 Psi for A = 1 counted in bf16 elements, the gradients' reduce-scatter
 * as 2 Psi for its fp32). */

/* Bucket b's bf16 pieces gathered into dst on the communication stream once
 * the compute stream has done what it queued so far; w_ready[e] then. */
static void dp_gather_bucket(GpuDataParallel* dp, int b, floatX* dst, int e) {
    cudaStream_t cs = dp->comm->stream;
    const BucketShape* s = shard_map_bucket(&dp->map, b);
    CUDA_CHECK(cudaEventRecord(dp->w_free, dp->g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->w_free, 0));
    if (dp->zpp && (dp->zpp->qwz || dp->zpp->hpz)) { /* ZeRO++: qwZ's slots, hpZ's secondary (above) */
        gpu_zeropp_gather(dp, b, dst);
        CUDA_CHECK(cudaEventRecord(dp->w_ready[e], cs));
        return;
    }
    gpu_levels_count(dp->comm, s->piece * (size_t)dp->world, s->piece, sizeof(floatX), 0, 1); /* (flat) */
    NCCL_CHECK(ncclAllGather(dp->param_shard + shard_map_offset(&dp->map, b), dst, s->piece, ncclBfloat16,
                             dp->comm->nccl, cs));
    CUDA_CHECK(cudaEventRecord(dp->w_ready[e], cs));
}

/* GpuGPT2's weights_begin: a forward gathers the head (waited for at once:
 * the encoder reads it) and starts layer 0's; a backward starts layer L-1's. */
static void dp_weights_begin(void* ctx, int backward) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    int L = dp->L;
    dp->backward = backward; /* (ZeRO++'s hpZ: backward's gathers come from the node) */
    if (backward) {
        dp_gather_bucket(dp, L - 1, dp->layer_buf[(L - 1) % 2], (L - 1) % 2);
        return;
    }
    dp_gather_bucket(dp, L, dp->head, 2);
    dp_gather_bucket(dp, 0, dp->layer_buf[0], 0);
    CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->w_ready[2], 0));
}

/* GpuGPT2's layer_weights: the next layer's gather started, then layer l's waited for. */
static const floatX* dp_layer_weights(void* ctx, int l, int backward) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    int next = backward ? l - 1 : l + 1;
    dp->backward = backward;
    if (next >= 0 && next < dp->L) dp_gather_bucket(dp, next, dp->layer_buf[next % 2], next % 2);
    CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->w_ready[l % 2], 0));
    return dp->layer_buf[l % 2];
}

/* Allocate what the mode needs, fill the master shard and the bf16 weights
 * from the host model, and hook into g's backward (ZeRO-3: its forward too). */
static void dp_init(GpuDataParallel* dp, GpuGPT2* g, const GPT2* host) {
    dp->g = g;
    if (!dp->active) return; /* one GPU, plain: gpu_model_init did everything */
    cudaEvent_t* sync[] = {&dp->grads_ready, &dp->reduced, &dp->updated, &dp->comm_idle, &dp->slot_free[0],
                           &dp->slot_free[1], &dp->slot_free[2], &dp->w_free, &dp->w_ready[0], &dp->w_ready[1],
                           &dp->w_ready[2]};
    for (size_t i = 0; i < sizeof(sync) / sizeof(sync[0]); i++)
        CUDA_CHECK(cudaEventCreateWithFlags(sync[i], cudaEventDisableTiming));
    cudaEvent_t* timing[] = {&dp->t_backward, &dp->t_reduced, &dp->t_gather0, &dp->t_gather1};
    for (size_t i = 0; i < sizeof(timing) / sizeof(timing[0]); i++) CUDA_CHECK(cudaEventCreate(timing[i]));
    g->grads_begin = dp_grads_begin;
    g->grads_end = dp_grads_end;
    g->grads_ctx = dp;
    if (dp->zero == 0) return; /* the flat gradients of gpu_model_init, reduced in place */

    size_t S = dp->shard, W = (size_t)dp->world;
    int L = dp->L;
    dp->map_dev = (ShardMap*)gpu_alloc(sizeof(ShardMap), GMEM_ZERO);
    CUDA_CHECK(cudaMemcpy(dp->map_dev, &dp->map, sizeof(ShardMap), cudaMemcpyHostToDevice));
    float** f32[] = {&dp->grad_shard, &dp->master, &dp->m, &dp->v};
    int component[] = {GMEM_GRADS, GMEM_MASTER, GMEM_ADAMW, GMEM_ADAMW};
    for (int i = 0; i < 4; i++) {
        *f32[i] = (float*)gpu_alloc(S * sizeof(float), component[i]);
        CUDA_CHECK(cudaMemset(*f32[i], 0, S * sizeof(float)));
    }
    dp->param_shard = (floatX*)gpu_alloc(S * sizeof(floatX), GMEM_ZERO);
    dp->grad_memory = (float*)gpu_alloc(dp->grad_floats * sizeof(float), GMEM_GRADS);
    dp->bucket = (float**)xmalloc(sizeof(float*) * (size_t)(L + 1));
    for (int b = 0; b <= L; b++) {
        size_t at = dp->zero == 1 ? W * shard_map_offset(&dp->map, b)            /* every bucket its own */
                    : b < L ? (size_t)(b % 2) * W * dp->map.layer.piece           /* two layer slots */
                            : 2 * W * dp->map.layer.piece;                        /* then the rest */
        dp->bucket[b] = dp->grad_memory + at;
    }
    /* backward writes the layers into their buckets, and the rest's tensors into its own */
    g->grad_buckets = dp->bucket;
    memset(&g->grads, 0, sizeof(g->grads));
    const BucketShape* rest = &dp->map.rest;
    for (int k = 0; k < rest->nseg; k++) ((float**)&g->grads)[rest->k[k]] = dp->bucket[L] + rest->pre[k];

    /* the master shard, packed on the host, bucket by bucket */
    float* h = xmalloc_floats(S);
    for (int b = 0; b <= L; b++) shard_pack_host(h + shard_map_offset(&dp->map, b), host->params_memory, &dp->map, b, dp->rank);
    CUDA_CHECK(cudaMemcpy(dp->master, h, S * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    if (dp->zero == 3) { /* the shard's bf16 weights, rounded to nearest (as below); the buffers they are gathered into */
        shard_round_kernel<<<ceil_div((long long)S, 256), 256, 0, g->stream>>>(dp->param_shard, dp->master, S,
                                                                               dp->map_dev, 0, 0u);
        KERNEL_CHECK();
        dp->head = g->params_memory;
        dp->layer_buf[0] = dp->head + W * rest->piece;
        dp->layer_buf[1] = dp->layer_buf[0] + W * dp->map.layer.piece;
        memset(&g->params, 0, sizeof(g->params)); /* the layers' come from gpu_layer_params */
        for (int k = 0; k < rest->nseg; k++) ((floatX**)&g->params)[rest->k[k]] = dp->head + rest->pre[k];
        g->weights_begin = dp_weights_begin;
        g->layer_weights = dp_layer_weights;
        gpu_zeropp_init(dp); /* (nothing without --qwz, --qgz, --hpz) */
        CUDA_CHECK(cudaDeviceSynchronize());
        return;
    }
    /* the whole bf16 weights, rounded to nearest as gpu_model_init does, through the gradient buffer in chunks */
    size_t P = g->num_parameters;
    for (size_t at = 0; at < P; at += dp->grad_floats) {
        size_t n = P - at < dp->grad_floats ? P - at : dp->grad_floats;
        CUDA_CHECK(cudaMemcpy(dp->grad_memory, host->params_memory + at, n * sizeof(float), cudaMemcpyHostToDevice));
        float_to_bf16_kernel<<<ceil_div((long long)n, 256), 256, 0, g->stream>>>(g->params_memory + at, dp->grad_memory, n);
        KERNEL_CHECK();
        gpu_wait(g->stream, NULL); /* before the next chunk overwrites the staging */
    }
    CUDA_CHECK(cudaMemset(dp->grad_memory, 0, dp->grad_floats * sizeof(float)));
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void dp_free(GpuDataParallel* dp) {
    if (!dp->active) return;
    gpu_wait(dp->comm->stream, NULL);
    cudaEvent_t ev[] = {dp->grads_ready, dp->reduced, dp->updated, dp->comm_idle, dp->slot_free[0], dp->slot_free[1],
                        dp->slot_free[2], dp->w_free, dp->w_ready[0], dp->w_ready[1], dp->w_ready[2], dp->t_backward,
                        dp->t_reduced, dp->t_gather0, dp->t_gather1};
    for (size_t i = 0; i < sizeof(ev) / sizeof(ev[0]); i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
    gpu_zeropp_free(dp);
    void* mem[] = {dp->map_dev, dp->grad_shard, dp->master, dp->m, dp->v, dp->param_shard, dp->grad_memory};
    for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++) gpu_release(mem[i]);
    free(dp->bucket);
    if (dp->g) {
        dp->g->grads_begin = dp->g->grads_end = NULL;
        dp->g->grad_buckets = NULL;
        dp->g->weights_begin = NULL;
        dp->g->layer_weights = NULL;
    }
    memset(dp, 0, sizeof(*dp));
}

/* What the run prints at the start: mode, memory per rank, traffic per step. */
static void dp_print(const GpuDataParallel* dp, size_t P, int micro_batches) {
    double mb = 1.0 / (1024.0 * 1024.0), W = dp->world, S = (double)dp->shard, Pp = S * W;
    if (!dp->active) {
        printf("data parallel: off (one GPU, --zero 0%s)\n", GPU_HAVE_NCCL ? "" : "; this build has no NCCL");
        return;
    }
    int nc = 0;
    NCCL_CHECK(ncclGetVersion(&nc));
    static const char* const names[4] = {"plain (allreduce)", "ZeRO-1 (optimizer state sharded)",
                                         "ZeRO-2 (optimizer state and gradients sharded)",
                                         "ZeRO-3 (weights, gradients and optimizer state sharded; the weights gathered "
                                         "layer by layer; not run on a GPU, checked on the CPU execution layer)"};
    printf("data parallel: %s over %d rank(s) met through %s, NCCL %d.%d.%d; this rank %d, GPU %d; reductions %s\n",
           names[dp->zero], dp->world, dp->comm->how, nc / 10000, (nc / 100) % 100, nc % 100, dp->rank,
           dp->comm->device, dp->overlap ? "overlap backward, bucket by bucket" : "after backward (--overlap 0)");
    printf("buckets: %d layers of %zu parameters, then wte+wpe+lnf with %zu; pieces of %zu and %zu per rank "
           "(padded to %d x %d)\n", dp->L, dp->map.layer.pre[dp->map.layer.nseg], dp->map.rest.pre[dp->map.rest.nseg],
           dp->map.layer.piece, dp->map.rest.piece, dp->world, DP_ALIGN);
    const GpuLevels* lv = &dp->comm->lv;
    if (dp->world > 1)
        printf("levels: %d node(s) x %d rank(s) (%s); gradients reduced %s (not run on a GPU; checked on the CPU "
               "execution layer)\n", lv->nodes, lv->per_node, lv->by_host ? "by host name" : "--topology",
               lv->hierarchical ? "by level: inside the node, across nodes on 1/K, inside the node again "
                                  "(communicators per level by ncclCommSplit)" : "flat (one communicator)");
    double bytes;
    if (dp->zero == 0) {
        printf("per-rank state: bf16 weights %.0f MB, fp32 gradients %.0f MB, fp32 master + AdamW %.0f MB\n",
               2 * P * mb, 4 * P * mb, 12 * P * mb);
        bytes = 2.0 * (W - 1) / W * 4.0 * (double)P;
        printf("sent per rank and step: allreduce 2 (W-1)/W x 4 B x P = %.1f MB (fp32 gradients, ring)\n", bytes * mb);
        return;
    }
    if (dp->zero == 3) { /* (the formula above dp_gather_bucket) */
        double Pl = (double)dp->map.layer.piece * W, Pr = (double)dp->map.rest.piece * W, A = micro_batches;
        printf("per-rank state: bf16 weights: the shard's %.1f MB + gathered %.1f MB (the head and 2 layers), fp32 "
               "gradients %.1f MB (2 layer slots + the rest) + %.1f MB the shard's, fp32 master + AdamW %.1f MB "
               "(shard of %zu)\n", 2 * S * mb, 2 * (Pr + 2 * Pl) * mb, 4.0 * dp->grad_floats * mb, 4 * S * mb,
               12 * S * mb, dp->shard);
        bytes = (W - 1) / W * (4.0 * Pp * A + 2.0 * A * (Pr + 2.0 * dp->L * Pl));
        printf("sent per rank and step: (W-1)/W x (4 B x P' x %.0f reduce-scatter(s) + 2 B x %.0f x (Pr + 2 L Pl) "
               "all-gathers) = %.1f MB (P' = %.0f, Pl = %.0f, Pr = %.0f padded; fp32 gradients, bf16 weights, ring)\n",
               A, A, bytes * mb, Pp, Pl, Pr);
        return;
    }
    printf("per-rank state: bf16 weights %.0f MB (+ %.0f MB the shard's, to send), fp32 gradients %.0f MB (%s) "
           "+ %.0f MB the shard's, fp32 master + AdamW %.0f MB (shard of %zu)\n", 2 * P * mb, 2 * S * mb,
           4.0 * dp->grad_floats * mb, dp->zero == 1 ? "every bucket, packed" : "2 layer slots + the rest",
           4 * S * mb, 12 * S * mb, dp->shard);
    double reductions = dp->zero == 2 ? micro_batches : 1;
    bytes = (W - 1) / W * (4.0 * Pp * reductions + 2.0 * Pp);
    printf("sent per rank and step: (W-1)/W x (4 B x P' x %.0f reduce-scatter(s) + 2 B x P' all-gather) = %.1f MB "
           "(P' = %.0f padded parameters; fp32 gradients, bf16 weights, ring)\n", reductions, bytes * mb, Pp);
}

/* The next kernels on the compute stream wait for the communication stream
 * (the weights are whole again, and the buckets free). */
static void dp_params_ready(GpuDataParallel* dp) {
    if (dp->active) CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->comm_idle, 0));
}

static void dp_zero_grad(GpuDataParallel* dp) {
    GpuGPT2* g = dp->g;
    dp_params_ready(dp);
    gpu_levels_step_begin(dp->comm); /* the step's bytes per level from zero */
    if (dp->zero == 0) gpu_zero_grad(g);
    else if (dp->zero == 1) CUDA_CHECK(cudaMemsetAsync(dp->grad_memory, 0, dp->grad_floats * sizeof(float), g->stream));
    else CUDA_CHECK(cudaMemsetAsync(dp->grad_shard, 0, dp->shard * sizeof(float), g->stream)); /* slots: as opened */
    dp->gathered = 0;
}

/* Before each micro-batch's backward: plain and ZeRO-1 reduce only after the
 * last one (the gradients accumulate until then); ZeRO-2 after every one. */
static void dp_arm(GpuDataParallel* dp, int last_micro_batch) {
    dp->armed = dp->active && (dp->zero >= 2 || last_micro_batch);
}

static void dp_backward_done(GpuDataParallel* dp) {
    if (dp->active) CUDA_CHECK(cudaEventRecord(dp->t_backward, dp->g->stream));
}

/* The updated bf16 pieces to every rank, each bucket then unpacked into
 * the flat weights (the buckets' gradient memory is the staging). */
static void dp_gather_weights(GpuDataParallel* dp) {
    GpuGPT2* g = dp->g;
    cudaStream_t cs = dp->comm->stream;
    CUDA_CHECK(cudaEventRecord(dp->updated, g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->updated, 0));
    CUDA_CHECK(cudaEventRecord(dp->t_gather0, cs));
    for (int b = 0; b <= dp->L; b++) {
        const BucketShape* s = shard_map_bucket(&dp->map, b);
        floatX* staging = (floatX*)dp->bucket[b]; /* W pieces of bf16 fit in half the fp32 bucket */
        gpu_levels_count(dp->comm, s->piece * (size_t)dp->world, s->piece, sizeof(floatX), 0, 1); /* (flat, as on the CPU) */
        NCCL_CHECK(ncclAllGather(dp->param_shard + shard_map_offset(&dp->map, b), staging, s->piece, ncclBfloat16,
                                 dp->comm->nccl, cs));
        SegmentCopy sc = bucket_unpacking(s, b < dp->L ? (size_t)b : 0);
        segments_copy_gpu(g->params_memory, staging, &sc, cs);
    }
    CUDA_CHECK(cudaEventRecord(dp->t_gather1, cs));
    dp->gathered = 1;
}

/* train_gpt.c's loss-spike rule (gptc/state.h), asked by dp_step once the
 * step's loss is known: a spike, more than z_max standard deviations above
 * the window's mean, has its update skipped, on every rank alike (the loss
 * is the ranks' mean). */
typedef struct {
    const LossWatch* watch;
    double z_max;     /* --spike-z; 0: never a spike */
    double loss_bias; /* added to the loss the rule sees (GPTC_INJECT_SPIKE's +100) */
    int spike;        /* out: the step is a spike */
    double z;         /* out: its z-score */
} SpikeGate;

/* Is the step a spike? (gate NULL: never.) */
static int spike_gate_test(SpikeGate* gate, double loss) {
    if (!gate) return 0;
    gate->spike = losswatch_spike(gate->watch, loss + gate->loss_bias, gate->z_max, &gate->z);
    return gate->spike;
}

/* After the step's backward: finish the reductions, the clipping norm, the
 * mean loss over micro-batches and ranks, AdamW (skipped on every rank alike
 * when the loss or the norm is not finite, or the loss is a spike by
 * `gate`, which may be NULL), and under ZeRO the all-gather. Returns the
 * norm before clipping. */
static double dp_step(GpuDataParallel* dp, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed,
                      int micro_batches, SpikeGate* gate, double* loss, int* finite) {
    GpuGPT2* g = dp->g;
    double W = dp->world, norm;
    if (dp->active) CUDA_CHECK(cudaStreamWaitEvent(g->stream, dp->reduced, 0));
    if (!dp->active && dp->zero == 0 && !(gate && gate->z_max > 0.0) && !g->offload) {
        /* one GPU and no spike rule: the device decides, the host waits once, at the end */
        norm = gpu_update_gated(g, opt, lr, t, max_norm, seed, micro_batches, loss);
        *finite = isfinite(*loss) && isfinite(norm); /* = what update_gate_kernel decided */
        spike_gate_test(gate, *loss);                  /* (never a spike: sets its outputs) */
        return norm;
    }
    if (dp->zero == 0) {
        norm = gpu_grad_norm(g); /* the summed gradient: the same on every rank */
        *loss = gpu_losses_fetch(g, micro_batches);
        gpu_comm_sum(dp->comm, loss, 1);
        *loss /= W;
        *finite = isfinite(*loss) && isfinite(norm);
        int spike = spike_gate_test(gate, *loss);
        if (*finite && !spike && g->offload) gpu_offload_update(g, opt, lr, t, max_norm, seed, (float)norm);
        else if (*finite && !spike) gpu_adamw_update(g, opt, lr, t, max_norm, seed);
        if (dp->active) CUDA_CHECK(cudaEventRecord(dp->comm_idle, dp->comm->stream));
        return norm;
    }
    /* ZeRO: the shard's sum of squares (fp32, fixed order), summed over the ranks in double */
    float* partial = g->scratch.norm;
    norm_squares_partial_kernel<<<NORM_BLOCKS, 256, 0, g->stream>>>(partial, dp->grad_shard, dp->shard);
    KERNEL_CHECK();
    norm_finish_kernel<<<1, 1024, 0, g->stream>>>(partial + NORM_BLOCKS, partial, NORM_BLOCKS, 0);
    KERNEL_CHECK();
    float* h_sum = g->h_loss_mean + MAX_MICRO_STEPS;
    CUDA_CHECK(cudaMemcpyAsync(h_sum, partial + NORM_BLOCKS, sizeof(float), cudaMemcpyDeviceToHost, g->stream));
    gpu_wait(g->stream, NULL);
    double sums[2] = {*h_sum, gpu_losses_fetch(g, micro_batches)};
    gpu_comm_sum(dp->comm, sums, 2);
    norm = sqrt(sums[0]);
    *loss = sums[1] / W;
    *finite = isfinite(*loss) && isfinite(norm);
    int spike = spike_gate_test(gate, *loss);
    if (*finite && !spike) {
        float bc1 = 1.0f - (float)pow(opt->beta1, t), bc2 = 1.0f - (float)pow(opt->beta2, t);
        unsigned decay_mask = 0;
        for (int k = 0; k < NUM_PARAMETER_TENSORS; k++)
            if (opt->decay_all || PARAMETER_IS_MATRIX[k]) decay_mask |= 1u << k;
        adamw_shard_kernel<<<ceil_div((long long)dp->shard, 256), 256, 0, g->stream>>>(
            dp->param_shard, dp->master, dp->grad_shard, dp->m, dp->v, dp->shard, dp->map_dev, lr, opt->beta1,
            opt->beta2, bc1, bc2, opt->eps, opt->weight_decay, decay_mask, (float)norm, max_norm, seed);
        KERNEL_CHECK();
        if (dp->zero < 3) dp_gather_weights(dp); /* (ZeRO-3: the next forward gathers the new shard) */
    }
    CUDA_CHECK(cudaEventRecord(dp->comm_idle, dp->comm->stream));
    return norm;
}

/* Wait for the step (and its collectives), then add up where the time of
 * the communication went. */
static void dp_step_wait(GpuDataParallel* dp) {
    gpu_wait(dp->g->stream, NULL);
    if (!dp->active) return;
    gpu_wait(dp->comm->stream, NULL);
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, dp->t_backward, dp->t_reduced));
    dp->exposed_ms += ms;
    if (dp->gathered) {
        CUDA_CHECK(cudaEventElapsedTime(&ms, dp->t_gather0, dp->t_gather1));
        dp->gather_ms += ms;
    }
    dp->steps_timed++;
}

/* A sharded fp32 array (master, m or v: S floats, bucket-interleaved) into
 * its flat file-order twin on the host (P floats), on every rank: each
 * bucket's pieces are all-gathered into its gradient memory (free between
 * steps), copied out and unpacked. A collective: every rank calls it. */
static void dp_shards_to_host(GpuDataParallel* dp, const float* shard, float* flat) {
    cudaStream_t cs = dp->comm->stream;
    gpu_wait(dp->g->stream, NULL);
    gpu_wait(cs, NULL);
    size_t most = dp_bucket_floats(dp, dp->L) > dp_bucket_floats(dp, 0) ? dp_bucket_floats(dp, dp->L)
                                                                          : dp_bucket_floats(dp, 0);
    float* packed = xmalloc_floats(most);
    for (int b = 0; b <= dp->L; b++) {
        const BucketShape* s = shard_map_bucket(&dp->map, b);
        NCCL_CHECK(ncclAllGather(shard + shard_map_offset(&dp->map, b), dp->bucket[b], s->piece, ncclFloat,
                                 dp->comm->nccl, cs));
        gpu_wait(cs, NULL);
        CUDA_CHECK(cudaMemcpy(packed, dp->bucket[b], s->pre[s->nseg] * sizeof(float), cudaMemcpyDeviceToHost));
        bucket_unpack_host(flat, packed, &dp->map, b);
    }
    free(packed);
    CUDA_CHECK(cudaEventRecord(dp->comm_idle, cs)); /* (the buckets are zeroed again before backward writes them) */
}

/* The fp32 master weights into the host model (samples, checkpoints). Under
 * ZeRO a collective: every rank must call it. */
static void dp_params_to_host(GpuDataParallel* dp, GPT2* host) {
    if (dp->zero == 0) gpu_params_to_host(dp->g, host);
    else dp_shards_to_host(dp, dp->master, host->params_memory);
}

/* STATUS: dp_state_to_host, dp_state_upload and shard_round_kernel have run
 * on 1-3 emulated GPUs (scripts/test_zero_states.sh), not yet on a GPU.
 * Training states under ZeRO (G7): the whole state into the host's flat
 * arrays (P floats each), the layout train_gpt.c's Saver writes from: the
 * master, m and v gathered on every rank (dp_shards_to_host three times). A
 * collective. Cost per snapshot and rank: NCCL receives (W-1)/W x 12 P'
 * bytes (P' = P padded), the host copies 12 P bytes out of the staging and
 * unpacks them, though the rank saves only its 12 P / W; memory: the
 * gradient buckets as device staging (free between steps: nothing more on the
 * device), one pageable host buffer of the largest bucket, and the host's
 * flat arrays (12 P, pinned, as --zero 0 has them). Synchronous: unlike
 * --zero 0's copies on a side stream, these do not overlap the next step. */
static void dp_state_to_host(GpuDataParallel* dp, float* params, float* m, float* v) {
    dp_shards_to_host(dp, dp->master, params);
    dp_shards_to_host(dp, dp->m, m);
    dp_shards_to_host(dp, dp->v, v);
}

/* The other way: a flat state on the host (params, and m, v when given)
 * onto the device, as gpu_weights_upload does for --zero 0 (which this calls
 * then). Under ZeRO each rank packs its shard of each array, bucket by
 * bucket (shard_pack_host: the pad 0), uploads it, rounds the shard's bf16
 * weights as update `update` rounded them (or to nearest when < 0;
 * shard_round_kernel) and all-gathers them as a step does
 * (dp_gather_weights). The state may come from any number of ranks and any
 * --zero, GPU or CPU: it is flat. Waits until done. A collective. */
static void dp_state_upload(GpuDataParallel* dp, const float* params, const float* m, const float* v, int run_seed,
                            int update) {
    GpuGPT2* g = dp->g;
    if (dp->zero == 0) {
        gpu_weights_upload(g, params, m, v, run_seed, update);
        return;
    }
    size_t S = dp->shard;
    float* h = xmalloc_floats(S);
    const float* from[3] = {params, m, v};
    float* to[3] = {dp->master, dp->m, dp->v};
    for (int a = 0; a < 3; a++) {
        if (!from[a]) continue; /* (no moments: they stay as they are, zeros at the start) */
        for (int b = 0; b <= dp->L; b++)
            shard_pack_host(h + shard_map_offset(&dp->map, b), from[a], &dp->map, b, dp->rank);
        CUDA_CHECK(cudaMemcpy(to[a], h, S * sizeof(float), cudaMemcpyHostToDevice));
    }
    free(h);
    uint32_t seed = update < 0 ? 0u : gpu_update_seed(run_seed, update);
    gpu_wait(dp->comm->stream, NULL); /* nothing in flight reads the staging or the shard */
    shard_round_kernel<<<ceil_div((long long)S, 256), 256, 0, g->stream>>>(dp->param_shard, dp->master, S, dp->map_dev,
                                                                           update >= 0, seed);
    KERNEL_CHECK();
    if (dp->zero < 3) dp_gather_weights(dp); /* (ZeRO-3: the next forward gathers) */
    CUDA_CHECK(cudaEventRecord(dp->comm_idle, dp->comm->stream));
    gpu_wait(dp->comm->stream, NULL);
    gpu_wait(g->stream, NULL);
}

/* ------------------------------------------------------------------------ */
/* G7. Training loop and main                                               */
/* ------------------------------------------------------------------------ */

/* What the flags ask that this build cannot do (checked before any GPU is
 * touched). The GPU's own flags are in train_gpt.c's one table (gptc/cli.h). */
static const char* gpu_options_problem(const Options* o) {
    if (o->offload && o->zero > 0) /* (G8: the host updates the whole flat state) */
        return "--offload 1 keeps the whole optimizer state on the host: use it with --zero 0 (one GPU or plain data "
               "parallel), or drop it and shard the state across GPUs with --zero 1|2";
    if (o->eval_file[0]) /* (the eval's scoring is train_gpt.c's eval_choices, on the CPU model) */
        return "--eval-file is scored by train_gpt (the CPU trainer) only, for now: drop it here, and score a saved "
               "checkpoint with ./train_gpt --model out/model_NNNNNNNN.bin --eval-file F --steps 0 (add -b, -t)";
    if (o->auto_plan || o->snapshot_auto) /* (gptc/runtime.h models the CPU trainer's step) */
        return "--auto and --snapshot-every auto use the CPU trainer's runtime model (train_gpt); train_gpt_cu has none "
               "yet: give --batch-size, --zero and --snapshot-every N";
    /* a hot spare (gpu_train_resume) stands by as one process or as a whole job under mpirun: rank 0 reads the
     * FIFO and its word reaches the other ranks through MPI (standby_wait_ranks), which ranks that met through a
     * file or a TCP port do not share (gpu_train_states_decide catches the rest: no states, no standby) */
    if (o->standby[0] && (!strncmp(o->init, "file:", 5) || !strncmp(o->init, "tcp:", 4)))
        return "--standby with ranks that meet through --init file:/tcp: cannot stand by together (rank 0's 'go' "
               "reaches the other ranks through MPI): run the spare as one process, or build train_gpt_cu_mpi and "
               "start the whole standby job under mpirun (--init mpi)";
    /* (a build with NCCL and MPI asks nothing more of it: every flag, --zero and states included, is for it) */
#if !GPU_HAVE_NCCL
    /* without NCCL: one process on one GPU, plain (--zero 1|2 run through a communicator even alone) */
    int env_rank = 0, env_world = 1, env_local = 0;
    if (strcmp(o->init, "auto"))
        return "--init: the ranks meet to build an NCCL communicator, and " GPU_NO_NCCL_HINT;
    if (launcher_env_present() && (launch_rank_world(&env_rank, &env_world, &env_local) != 0 || env_world > 1))
        return "the launcher's environment describes several ranks, which need NCCL, and " GPU_NO_NCCL_HINT;
    if (o->zero > 0)
        return "--zero 1|2 run the sharded optimizer through an NCCL communicator (even on one GPU), and "
               GPU_NO_NCCL_HINT "; or train with --zero 0";
#endif
#ifndef USE_MPI
    if (!strcmp(o->init, "mpi"))
        return "--init mpi needs a build with MPI: make train_gpt_cu_mpi (Open MPI's mpicc); this build meets through "
               "--init file:PATH or --init tcp:HOST:PORT";
#endif
    return NULL;
}

/* Mean loss over up to `batches` validation micro-batches, on the GPU. */
static float gpu_evaluate(GpuGPT2* g, DataLoader* val, int batches) {
    if (dataloader_reset(val) != 0) exit(EXIT_FAILURE);
    long long available = dataloader_batches_per_epoch(val);
    if (batches > available) batches = (int)available;
    if (batches > MAX_MICRO_STEPS) batches = MAX_MICRO_STEPS;
    for (int i = 0; i < batches; i++) {
        if (dataloader_next(val) != 0) exit(EXIT_FAILURE);
        gpu_forward(g, val->inputs, val->targets, val->B, val->T, 0.0f, i);
    }
    return (float)gpu_losses_fetch(g, batches);
}

/* ---- training states ------------------------------------------------------ */
/* train_gpt.c's Saver, fed from the GPU (one GPU or several, any --zero:
 * every rank's host arrays hold the whole flat state, each rank saves its
 * slice of it; the Dist given to the Saver says --zero 0, the flat layout,
 * whatever --zero the GPUs run, so the header's zero field is 0). Under
 * --zero 1|2 a snapshot gathers the shards into the host arrays at once
 * (dp_state_to_host) instead of the side-stream copies below, and a resume
 * or a rollback packs them out again (dp_state_upload). Its arrays are the
 * host model's params_memory, m_memory and v_memory, pinned. At the boundary after a
 * snapshot step the update is done on the compute stream; an event there
 * starts three device-to-host copies (master, m, v) on a stream of their
 * own, which overlap the next step's forward and backward: those read only
 * the bf16 weights. Before the next update (the only thing that changes
 * master, m and v) the host waits for them and hands the arrays to the
 * Saver (saver_snapshot), whose thread copies them into a slot meanwhile;
 * the host arrays are not written again (next copies, samples, a rollback)
 * before saver_before_update says that copy is done. So the Saver sees each
 * snapshot one step later than train() does, with the run as it was at the
 * snapshot's boundary (data position, sampler, loss window: `at`). One set
 * of host arrays: with --snapshot-every 1 the Saver's copy must be done by
 * the next boundary (what it does not hide is its stall, printed at the end). */
typedef struct {
    cudaStream_t stream; /* non-blocking: the copies overlap the compute stream */
    cudaEvent_t updated; /* compute stream: the snapshot step's update is done */
    cudaEvent_t copied;  /* copy stream: master, m and v are in the host arrays */
    int pending;         /* copies started and not yet handed to the Saver */
    int step, save;      /* theirs: the step, and whether it goes to disk too */
    TrainRun at;         /* the run at that boundary (only what state_info_of reads counts) */
    float* params;       /* (P) the host arrays, pinned: host->params_memory, m_memory, v_memory */
    float* m;            /* (P) */
    float* v;            /* (P) */
    size_t P;
    int registered;      /* this pinned the arrays (else gpu_offload_init did) */
} GpuSnapshots;

/* Give the host model its AdamW moments (as gpt2_alloc_training does; zeros,
 * so gpt2_free frees them) and pin the three arrays. */
static void gpu_snapshots_init(GpuSnapshots* gs, GPT2* host, int pinned) {
    memset(gs, 0, sizeof(*gs));
    gs->P = host->num_parameters;
    /* in the host ledger, as the CPU trainer's (gptc/ledger.h: huge pages, touched in parallel at start, written
     * by a hot spare before it waits: big_write_all) */
    if (!host->m_memory) host->m_memory = ledger_floats(MEM_ADAMW, gs->P);
    if (!host->v_memory) host->v_memory = ledger_floats(MEM_ADAMW, gs->P);
    gs->params = host->params_memory;
    gs->m = host->m_memory;
    gs->v = host->v_memory;
    float* arrays[3] = {gs->params, gs->m, gs->v};
    gs->registered = !pinned; /* (--offload 1 pinned them already: gpu_offload_init) */
    for (int k = 0; k < 3 && gs->registered; k++)
        CUDA_CHECK(cudaHostRegister(arrays[k], gs->P * sizeof(float), cudaHostRegisterDefault));
    CUDA_CHECK(cudaStreamCreateWithFlags(&gs->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&gs->updated, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&gs->copied, cudaEventDisableTiming));
}

static void gpu_snapshots_free(GpuSnapshots* gs) {
    if (!gs->stream) return;
    gpu_wait(gs->stream, NULL); /* (polls: with other ranks its copies may wait behind collectives) */
    CUDA_CHECK(cudaEventDestroy(gs->updated));
    CUDA_CHECK(cudaEventDestroy(gs->copied));
    CUDA_CHECK(cudaStreamDestroy(gs->stream));
    float* arrays[3] = {gs->params, gs->m, gs->v};
    for (int k = 0; k < 3 && gs->registered; k++) CUDA_CHECK(cudaHostUnregister(arrays[k]));
    memset(gs, 0, sizeof(*gs));
}

/* At the boundary after step `step` (its update queued on the compute
 * stream): start copying master, m and v to the host. Under ZeRO the shards
 * are gathered into the flat arrays here and now (dp_state_to_host: a
 * collective, every rank at the same boundary), and the "copies" are done
 * when this returns. */
static void gpu_snapshot_start(GpuSnapshots* gs, Saver* sv, GpuDataParallel* dp, const TrainRun* r, int step,
                               int save) {
    const GpuGPT2* g = dp->g;
    ALWAYS(!gs->pending);
    saver_before_update(sv); /* the Saver's thread has copied the last snapshot out of the host arrays */
    if (dp->zero > 0) {
        dp_state_to_host(dp, gs->params, gs->m, gs->v);
    } else if (g->offload) { /* the host arrays are the state (the update runs on the host): nothing to copy, */
        ALWAYS(gs->params == g->off_host->params_memory && gs->m == g->off_host->m_memory);
        gpu_offload_wait(g, gs->stream, -1); /* once the update's last piece is done */
    } else {
        CUDA_CHECK(cudaEventRecord(gs->updated, g->stream));
        CUDA_CHECK(cudaStreamWaitEvent(gs->stream, gs->updated, 0));
        size_t bytes = gs->P * sizeof(float);
        CUDA_CHECK(cudaMemcpyAsync(gs->params, g->master_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
        CUDA_CHECK(cudaMemcpyAsync(gs->m, g->m_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
        CUDA_CHECK(cudaMemcpyAsync(gs->v, g->v_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
    }
    CUDA_CHECK(cudaEventRecord(gs->copied, gs->stream));
    gs->at = *r; /* a shallow copy: state_info_of reads its numbers, nothing reads through its pointers */
    gs->step = step;
    gs->save = save;
    gs->pending = 1;
}

/* Before the next update (or whatever else needs the host arrays): wait for
 * the copies and hand the snapshot to the Saver, which copies it into a
 * slot in the background. (The wait is not counted as the Saver's stall:
 * the copies run on the copy engines beside the forward and backward the
 * host is waiting for anyway; what they do not hide shows in the step's ms.) */
static void gpu_snapshot_hand_over(GpuSnapshots* gs, Saver* sv, const Dist* d, const GPT2* host, const Options* o) {
    if (!gs->pending) return;
    gpu_wait(gs->stream, gs->copied);
    saver_snapshot(sv, &gs->at, d, host, o, gs->step, gs->save);
    gs->pending = 0;
}

/* Why this run cannot keep training states (NULL: it can). */
static const char* gpu_states_problem(const GpuComm* comm, const Options* o) {
    (void)o; /* (any --zero: under ZeRO the shards are gathered into the flat state, dp_state_to_host) */
#ifdef USE_MPI
    if (comm->world > 1 && !comm->mpi)
        return "several ranks keep their states together through MPI (train_gpt.c's Saver): launch with --init mpi";
#else
    if (comm->world > 1)
        return "several ranks keep their states together through MPI (train_gpt.c's Saver): build train_gpt_cu_mpi "
               "(make train_gpt_cu_mpi) and launch with --init mpi";
#endif
    return NULL;
}

#ifdef USE_MPI
/* One process of an MPI build, not started as MPI ranks: the Saver and
 * state_resume call MPI even alone, so start it as a world of one
 * (gpu_comm_free finalises it). */
static void gpu_comm_mpi_alone(GpuComm* cm) {
    if (cm->mpi) return;
    double t_start = cm->dist.t_start, t_comm = cm->dist.t_comm;
    int up = 0;
    MPI_CHECK(MPI_Initialized(&up));
    if (up) { /* started already by another part of the process (the CPU execution's NCCL over MPI, --zero 1|2) */
        memset(&cm->dist, 0, sizeof(cm->dist));
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &cm->dist.rank));
        MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &cm->dist.world));
    } else {
        dist_init(&cm->dist, NULL, NULL);
    }
    cm->dist.t_start = t_start; /* the process's start and its communicator's, as gpu_comm_init measured them */
    cm->dist.t_comm = t_comm;
    cm->mpi = gpu_mpi_live = 1;
    CHECK(cm->dist.world == 1 && cm->dist.rank == 0, "MPI started for one process sees %d ranks", cm->dist.world);
}
#endif

/* Measure the headroom's start-up part into *h (with its allowance) and
 * return the free bytes it is checked against: those before the
 * communicator (memory_check). On an H200 the start-up part measured 2 MB,
 * and a B=64 step took 15 MB beyond the plan (dev/cuda/RESULTS.md). */
static size_t gpu_memory_headroom(const GpuComm* cm, MemoryHeadroom* h) {
    size_t free_a = 0, free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_a, &total));
    cublasLtHandle_t probe;
    cudaStream_t stream;
    CUBLAS_CHECK(cublasLtCreate(&probe));
    CUDA_CHECK(cudaStreamCreate(&stream));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    CUBLAS_CHECK(cublasLtDestroy(probe));
    CUDA_CHECK(cudaStreamDestroy(stream));
    memset(h, 0, sizeof(*h));
    size_t start = cm->free_at_start > free_a ? cm->free_at_start : free_a; /* (another process may have freed some) */
    h->comm = start - free_a;
    h->handles = free_a > free_b ? free_a - free_b : 0;
    h->allowance = memory_allowance(gpu_comm_count(cm));
    return start;
}

/* What a training run holds: gpu_train_setup sets it up piece by piece,
 * and gpu_train_free releases whatever of it was set up, on every way out
 * (an error anywhere, --stop-at, the end): gpu_train calls one, then the other. */
typedef struct {
    TrainRun r;
    GpuDataParallel dp;
    GpuGPT2 g;
    Saver saver;
    GpuSnapshots gs;   /* gs.stream != NULL once the host arrays are pinned */
    int have_run, have_model, have_dp, have_saver;
    int drop_memory;   /* saver_free's remove_memory: the run is over and its last write worked */
    int states;        /* the run keeps training states (gptc/state.h): snapshots, --resume, --stop-at */
    double peak, fpt;  /* the device's peak bf16 TFLOP/s (0: unknown) and the FLOPs per token, for MFU */
    MemoryPlan plan;   /* the memory the plan expects, */
    MemoryHeadroom room; /* the headroom kept beside it, */
    size_t free0;      /* and the free bytes they were checked against */
    int graphs;        /* CUDA graphs from the second step on (--cuda-graphs 1 where they apply) */
} GpuTrainState;

/* Release what `st` holds. The pinned host arrays are unpinned on every
 * path (gptc_run frees them next). After a failure the Saver's threads may
 * still be filling a slot or writing a file, so only its copy out of the
 * host arrays is waited for (a local wait) and its mappings go with the
 * process, as in train_gpt.c's train(); with several ranks the device
 * memory too (this rank's queued collectives may never finish; main aborts
 * the communicator next). The failure path has not yet run on a GPU. */
static void gpu_train_free(GpuTrainState* st, int failed, int world) {
    if (st->have_saver) {
        saver_before_update(&st->saver); /* its copier is done reading the host arrays */
        if (!failed) saver_free(&st->saver, st->drop_memory);
    }
    gpu_snapshots_free(&st->gs);
    if (st->have_run) train_run_free(&st->r);
    if (failed && world > 1) return;
    if (st->have_dp) dp_free(&st->dp);
    if (st->have_model) gpu_model_free(&st->g);
    memset(st, 0, sizeof(*st));
}

/* Whether this run keeps training states (st->states), or why not; an
 * error when the flags ask for them anyway. 0 or -1. */
static int gpu_train_states_decide(GpuTrainState* st, const GpuComm* comm, const Options* o) {
    const char* no_states = o->output_dir[0] ? gpu_states_problem(comm, o) : "no --output-dir";
    st->states = no_states == NULL;
    if (!st->states && o->standby[0]) { /* (a spare takes the run over from its newest state: none, nothing to do) */
        fprintf(stderr, "error: --standby: a hot spare takes the run over from its training states, which this run "
                "cannot keep (%s): run the spare as one process, or as a standby job under mpirun (train_gpt_cu_mpi "
                "--init mpi)\n", no_states);
        return -1;
    }
    if (!st->states && (o->resume || o->stop_at || o->snapshot_every)) {
        fprintf(stderr, "error: --resume, --stop-at and --snapshot-every need training states, which this run cannot "
                "keep: %s\n", no_states);
        return -1;
    }
    if (!st->states && o->output_dir[0]) printf("training states: off (%s); --save-every writes model files only\n", no_states);
    return 0;
}

/* The device, and its peak bf16 TFLOP/s (0: unknown). */
static double gpu_device_print(void) {
    int dev;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    double peak = gpu_peak_tflops(prop.name);
    char peak_s[64];
    if (peak > 0) snprintf(peak_s, sizeof(peak_s), "%.0f TFLOP/s (datasheet)", peak);
    else snprintf(peak_s, sizeof(peak_s), "unknown (MFU n/a)");
    printf("device: %s, %.1f GB, compute capability %d.%d, peak dense bf16 %s\n", prop.name,
           prop.totalGlobalMem / 1e9, prop.major, prop.minor, peak_s);
    return peak;
}

/* ---- The plan against the allocation, and --plan (issue 14; not run on a
 * GPU; checked on the CPU execution layer, scripts/test_gpu_plan.sh) ---- */

static GpuPlanKnobs gpu_plan_knobs(const Options* o, int B, int T, const GpuComm* comm) {
    GpuPlanKnobs k = {B, T, o->recompute, o->zero, comm->rank, comm->world, comm->nccl != NULL, o->offload,
                      o->qwz, o->qgz, o->qgz_feedback, o->hpz, o->quant_block, comm->lv.nodes};
    return k;
}

/* Whether cudaMemGetInfo counts exactly our cudaMallocs: on the CPU
 * execution layer it does (free = its memory - the bytes cudaMalloc'd); on
 * a GPU the context, NCCL, cuBLASLt and the allocator's rounding take more. */
static int gpu_memory_exact(void) {
    cudaDeviceProp prop;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return !strncmp(prop.name, "CPU execution layer", 19);
}

/* --plan-check 1: the ledger (every cudaMalloc and cudaMallocHost, G1)
 * against the plan, component by component, byte for byte; the ledger's
 * peak against the plan's total (nothing beyond the plan was ever held);
 * and, on the CPU execution layer, cudaMemGetInfo's taken bytes (the
 * layer's own count of every cudaMalloc, ours or not) against both. `when`
 * names the moment. 0, or -1 after saying what differs. */
static int gpu_plan_check(const MemoryPlan* p, const GpuComm* comm, const char* when) {
    const GpuLedger* l = &gpu_ledger;
    int bad = 0;
    for (int i = 0; i < GMEM_COMPONENTS; i++)
        if (l->now[i] != p->bytes[i]) {
            fprintf(stderr, "plan-check: rank %d, %s: %s: the plan says %zu bytes, the ledger holds %zu\n", comm->rank,
                    when, GMEM_NAMES[i], p->bytes[i], l->now[i]);
            bad = 1;
        }
    size_t total = memory_plan_total(p);
    if (l->device_peak != total) {
        fprintf(stderr, "plan-check: rank %d, %s: the ledger's device peak %zu bytes, the plan's total %zu\n",
                comm->rank, when, l->device_peak, total);
        bad = 1;
    }
    size_t free_now = 0, total_mem = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_now, &total_mem));
    long long taken = (long long)comm->free_at_start - (long long)free_now;
    int exact = gpu_memory_exact();
    /* (d_slots is allocated after free_at_start is read; so is everything else of ours) */
    if (exact && taken != (long long)l->device) {
        fprintf(stderr, "plan-check: rank %d, %s: cudaMemGetInfo says %lld bytes taken since the context, the ledger "
                "%zu: an allocation bypassed gpu_alloc\n", comm->rank, when, taken, l->device);
        bad = 1;
    }
    char parts[1024];
    size_t at = 0;
    for (int i = 0; i < GMEM_COMPONENTS && at < sizeof(parts); i++)
        at += (size_t)snprintf(parts + at, sizeof(parts) - at, "%s%s=%zu", i ? "; " : "", GMEM_NAMES[i], l->now[i]);
    printf("plan-check: rank %d, %s: ledger by component: %s\n", comm->rank, when, parts);
    printf("plan-check: rank %d, %s: plan %zu device bytes + %zu pinned, ledger %zu + %zu (peak %zu), "
           "cudaMemGetInfo taken %lld (%s): %s\n", comm->rank, when, total, memory_plan_pinned(p), l->device,
           l->now[GMEM_HOST_STEP_INPUTS] + l->now[GMEM_HOST_LOSSES] + l->now[GMEM_HOST_COMM] + l->now[GMEM_HOST_OFFLOAD],
           l->device_peak, taken, exact ? "the CPU execution layer: exact" : "a GPU: context and libraries beside",
           bad ? "MISMATCH" : "equal");
    return bad ? -1 : 0;
}

/* --plan on the GPU: the plan of the flags given, then a table of
 * candidates for the global batch (micro-batch B from the divisors of the
 * sequences per rank; --recompute 0..3; ZeRO 0/1/2 with several ranks;
 * --offload 0/1 without ZeRO) with their predicted device bytes by
 * component against --memory-budget (auto: what cudaMemGetInfo says is free
 * now, after the context), less the memory check's allowance for what the
 * libraries load lazily (G4). No step-time column: the GPU's runtime model
 * is not calibrated (no GPU here), so the choice is the least memory-saving
 * that fits: no offload before offload, lower recompute and ZeRO first,
 * then the largest B (fewest micro-batches). 0, or -1 when nothing fits. */
static int gpu_plan_print(const Options* o, const GpuComm* comm) {
    GPT2Config c;
    if (plan_config(o, &c) != 0) return -1;
    size_t free_now = 0, total_mem = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_now, &total_mem));
    const char* how = "auto: cudaMemGetInfo's free bytes";
    size_t budget = !strcmp(o->memory_budget, "auto") ? free_now : plan_budget(o->memory_budget, comm->world, &how);
    if (!budget) return -1;
    size_t allowance = memory_allowance(gpu_comm_count(comm));
    double mb = 1.0 / (1024.0 * 1024.0);
    int T = o->seq_len, W = comm->world;
    long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * T * W;
    long long seqs = total / ((long long)T * W); /* sequences per rank per step */
    if (seqs < 1 || seqs * T * W != total) {
        fprintf(stderr, "error: --plan: the global batch %lld tokens is not a multiple of T x ranks = %d\n", total, T * W);
        return -1;
    }
    GpuPlanKnobs mine = gpu_plan_knobs(o, o->batch_size, T, comm);
    MemoryPlan p = gpu_memory_plan_for(&c, &mine);
    printf("plan: model L=%d C=%d NH=%d Vp=%d, %zu parameters; B=%d T=%d, %d rank(s), ZeRO %d, recompute %d, "
           "offload %d (device memory of rank %d)\n", c.num_layers, c.channels, c.num_heads, c.padded_vocab_size,
           parameter_count(&c), o->batch_size, T, W, o->zero, o->recompute, o->offload, comm->rank);
    memory_plan_print(&p);
    printf("budget: %.1f MB (%s), less %.0f MB allowance for what loads lazily: %.1f MB usable\n", budget * mb, how,
           allowance * mb, budget > allowance ? (budget - allowance) * mb : 0.0);
    printf("%6s %6s %4s %4s %7s | %9s %9s %9s %9s %9s %9s %9s | %10s %5s | %s\n", "B", "accum", "zero", "rcmp",
           "offload", "weights", "master", "grads", "moments", "acts", "scratch", "other", "total MB", "fits",
           "step ms");
    printf("(MB of device memory by component; step ms n/a: the GPU's runtime model is not calibrated, no GPU here)\n");
    int found = 0;
    GpuPlanKnobs best = mine;
    size_t best_need = 0, least = 0;
    GpuPlanKnobs smallest = mine;
    for (int offload = 0; offload <= 1; offload++)
        for (int zero = 0; zero <= (W > 1 ? 3 : 0); zero++)
            for (int r = 0; r < RECOMPUTE_LEVELS; r++)
                for (long long B = seqs; B >= 1; B--) {
                    if (seqs % B || (offload && zero)) continue;
                    GpuPlanKnobs k = {(int)B, T, r, zero, comm->rank, W, W > 1 || zero > 0, offload, 0, 0, 0, 0, 0, 1};
                    MemoryPlan q = gpu_memory_plan_for(&c, &k);
                    size_t need = memory_plan_total(&q), other = need;
                    size_t show[7] = {q.bytes[GMEM_PARAMS] + q.bytes[GMEM_ZERO], q.bytes[GMEM_MASTER], q.bytes[GMEM_GRADS],
                                      q.bytes[GMEM_ADAMW], q.bytes[GMEM_ACTS], q.bytes[GMEM_SCRATCH], 0};
                    for (int i = 0; i < 6; i++) other -= show[i];
                    show[6] = other;
                    int fits = need + allowance <= budget;
                    printf("%6lld %6lld %4d %4d %7d |", B, seqs / B, zero, r, offload);
                    for (int i = 0; i < 7; i++) printf(" %9.1f", show[i] * mb);
                    printf(" | %10.1f %5s | n/a\n", need * mb,
                           fits ? "yes" : "no");
                    if (fits && !found) {
                        found = 1;
                        best = k;
                        best_need = need;
                    }
                    if (!least || need < least) {
                        least = need;
                        smallest = k;
                    }
                }
    if (!found) {
        fprintf(stderr, "error: --plan: nothing fits in %.1f MB (%s) with %.0f MB allowance: the smallest is B=%d "
                "--zero %d --recompute %d --offload %d, which needs %.1f MB of device memory\n", budget * mb, how,
                allowance * mb, smallest.B, smallest.zero, smallest.recompute, smallest.offload, least * mb);
        return -1;
    }
    printf("plan: choice (the least memory-saving that fits; no runtime model on the GPU yet): -b %d --zero %d "
           "--recompute %d --offload %d, %.1f MB of device memory\n", best.B, best.zero, best.recompute, best.offload,
           best_need * mb);
    return 0;
}

/* The memory plan checked against the free memory, then the model and
 * the data-parallel buffers on the device. 0 or -1. */
static int gpu_train_build(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm) {
    const GPT2Config* c = &host->config;
    int B = st->r.B, T = st->r.T;
    dp_layout(&st->dp, comm, c, o->zero, o->overlap);
    dp_zeropp_flags(&st->dp, o);
    const char* zpp = gpu_zeropp_problem(comm, o);
    if (zpp) {
        if (comm->rank == 0) fprintf(stderr, "error: %s\n", zpp);
        return -1;
    }
    GpuPlanKnobs k = gpu_plan_knobs(o, B, T, comm);
    st->plan = gpu_memory_plan_for(c, &k);
    memory_plan_print(&st->plan);
    st->free0 = gpu_memory_headroom(comm, &st->room);
    memory_headroom_print(&st->room);
    char verdict[512];
    if (!memory_check(memory_plan_total(&st->plan), st->free0, memory_headroom_total(&st->room), verdict,
                      sizeof(verdict))) {
        fprintf(stderr, "error: rank %d: %s: lower --batch-size, raise --recompute%s, or --offload 1 (--plan 1 lists "
                "what fits)\n", comm->rank, verdict, comm->world > 1 && o->zero < 3 ? ", raise --zero" : "");
        return -1;
    }
    printf("%s\n", verdict);
    size_t weights = st->dp.active ? dp_weight_elems(&st->dp.map, o->zero, host->num_parameters) : host->num_parameters;
    gpu_model_init_with(&st->g, host, B, T, o->gelu_fusion, o->recompute, o->zero == 0 || !st->dp.active, o->offload,
                        weights);
    st->have_model = 1;
    dp_init(&st->dp, &st->g, host);
    st->have_dp = 1;
    if (o->plan_check && gpu_plan_check(&st->plan, comm, "after setup") != 0) return -1;
    size_t free1, total_mem;
    CUDA_CHECK(cudaMemGetInfo(&free1, &total_mem));
    printf("memory: cudaMemGetInfo says %.0f MB taken since the context (the plan: %.0f MB; the difference is "
           "NCCL, cuBLASLt and allocator rounding), %.0f MB free\n",
           ((double)st->free0 - (double)free1) / 1048576.0, memory_plan_total(&st->plan) / 1048576.0, free1 / 1048576.0);
    printf("GELU: %s\n", st->g.gelu_fusion ? "cuBLASLt epilogues" : "own kernels");
    /* graphs capture one GPU's step; with several ranks the step meets the others' (NCCL in the hooks, the
     * loss summed on the host) and a spike rule needs the loss on the host before the update */
    const char* no_graphs = !o->cuda_graphs ? "--cuda-graphs 0"
                            : st->dp.active ? "several GPUs (not yet captured)"
                            : o->zero != 0  ? "--zero 1, 2 or 3 (not yet captured)"
                            : o->spike_z > 0.0f ? "--spike-z (the host decides each update)"
                            : o->offload ? "--offload 1: the forward waits for the host's update layer by layer, on "
                                           "events a capture cannot wait for" : NULL;
    st->graphs = no_graphs == NULL;
    if (no_graphs) printf("CUDA graphs: off (%s)\n", no_graphs);
    else printf("CUDA graphs: the step captured after the first and replayed (not yet run on a GPU; --cuda-graphs 0 "
                "turns them off)\n");
    dp_print(&st->dp, host->num_parameters, st->r.grad_accum);
    return 0;
}

/* What the headroom's allowance is for, measured after the first step. */
static void gpu_memory_after_first_step(const GpuTrainState* st) {
    size_t free1, total_mem;
    CUDA_CHECK(cudaMemGetInfo(&free1, &total_mem));
    printf("memory after the first step: %.0f MB taken beyond the plan (the headroom kept %.0f MB)\n",
           ((double)st->free0 - (double)free1 - (double)memory_plan_total(&st->plan)) / 1048576.0,
           memory_headroom_total(&st->room) / 1048576.0);
}

/* A hot spare (--standby FIFO, issue 17; not run on a GPU; checked on the
 * CPU execution layer only, scripts/test_cuda_spare.sh), as train_gpt.c's
 * train_setup: everything is set up by now (the device memory, cuBLASLt's
 * handles, the kernels, the NCCL communicator, the data, the snapshot slots
 * mapped: read, never written) and no lock is held; it waits for 'go' on
 * the FIFO (several ranks under mpirun: the whole job, standby_wait_ranks),
 * then takes the run's locks, and gpu_train_resume loads the newest state.
 * (On a GPU the spare holds a second copy of the run's device memory: the
 * memory check in gpu_train_build counts what the active trainer holds, so
 * a GPU without room for both refuses the spare before it waits.) 1:
 * promoted, 0: dismissed (said), -1 after a message. Collective. */
static int gpu_standby(GpuTrainState* st, const Options* o, Dist* dist) {
    ALWAYS(st->states); /* (gpu_train_states_decide refused a standby without) */
    return standby_take_over(&st->r, o, dist); /* (gptc/saver.h, as train_gpt.c's train_setup) */
}

/* The Saver, a hot spare's wait (--standby: gpu_standby), the state to
 * resume from (with training states), the random init put off until now,
 * and the weights on the device. The step to start from, -1 after a
 * message, or STANDBY_DISMISSED (train_gpt.c). */
static int gpu_train_resume(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm) {
    Dist* dist = &comm->dist; /* rank and world for train_gpt.c's helpers; with states, the slices too */
    timing_print(dist, "communicator ready", dist->t_comm);
    st->saver.newest = st->saver.pinned = -1; /* (without states only saver_before_update sees it: a no-op then) */
    if (st->states) {
#ifdef USE_MPI
        gpu_comm_mpi_alone(comm);
#endif
        dist->zero = 0;
        dist_setup_model(dist, host); /* each rank's slice of the state: [save_lo, save_hi) */
        StartupMark mark = startup_begin();
        gpu_snapshots_init(&st->gs, host, st->g.offload);
        if (saver_init(&st->saver, dist, host, o) != 0) return -1;
        startup_end(SU_SLOTS, mark);
        st->have_saver = 1;
    }
    if (o->standby[0]) {
        int go = gpu_standby(st, o, dist);
        if (go <= 0) return go == 0 ? STANDBY_DISMISSED : -1;
    }
    timing_print(dist, "model ready", unix_ms()); /* built, its memory and the snapshot slots mapped */
    StartupMark mark = startup_begin();
    int start = st->states ? train_run_resume(&st->r, &st->saver, dist, host, o) : 0; /* as train() */
    if (start < 0) return -1;
    if (start > 0) /* the state's weights and moments; bf16 as the update of step start - 1 rounded them */
        dp_state_upload(&st->dp, host->params_memory, host->m_memory, host->v_memory, o->seed, start - 1);
    startup_end(SU_LOAD, mark);
    mark = startup_begin();
    ALWAYS(!host->init_deferred || st->states); /* (deferred only under --resume) */
    if (start == 0 && host->init_deferred) { /* no state: the init after all, and its weights to the device */
        gpt2_fill_random(host, host->init_seed);
        dp_state_upload(&st->dp, host->params_memory, NULL, NULL, o->seed, -1);
    }
    host->init_deferred = 0;
    startup_end(SU_MODEL, mark);
    timing_print(dist, "state loaded", unix_ms());
    startup_loaded(); /* (the start-up line's first step is counted from here, as train_gpt.c's) */
    heartbeat_write(o, comm->rank, start);
    return start;
}

/* Set up a run in `st`, piece by piece (gpu_train_free releases what was
 * set up): the TrainRun, training states or not, the device, its memory,
 * the model, the Saver, a hot spare's wait and the state to resume from.
 * The step to start from, -1 after a message, or STANDBY_DISMISSED. */
static int gpu_train_setup(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm,
                           const char* train_pattern, const char* val_pattern) {
    if (train_run_init(&st->r, &host->config, o, train_pattern, val_pattern, comm->rank, comm->world) != 0) return -1;
    st->have_run = 1;
    if (st->r.grad_accum > MAX_MICRO_STEPS) {
        fprintf(stderr, "error: %d micro-batches per step; this build allows %d: raise --batch-size\n",
                st->r.grad_accum, MAX_MICRO_STEPS);
        return -1;
    }
    if (gpu_train_states_decide(st, comm, o) != 0) return -1;
    test_hooks_print(0);
    if (gpu_comm_check_agreement(comm, host, o, o->zero, &st->r.train) != 0) return -1;
    StartupMark mark = startup_begin();
    st->peak = gpu_device_print();
    if (gpu_train_build(st, host, o, comm) != 0) return -1;
    startup_end(SU_DEVICE, mark); /* the device memory, cuBLASLt, the weights uploaded, the communication buffers */
    st->fpt = flops_per_token(&host->config, host->num_parameters, st->r.T);
    return gpu_train_resume(st, host, o, comm);
}

/* Mean validation loss over the ranks. */
static float gpu_evaluate_ranks(GpuGPT2* g, DataLoader* val, GpuComm* comm, int batches) {
    double loss = gpu_evaluate(g, val, batches);
    gpu_comm_sum(comm, &loss, 1);
    return (float)(loss / comm->world);
}

/* A sample at a boundary: the sampler runs on the CPU, with the KV cache,
 * on the host's copy of the weights. */
static void gpu_sample_print(GpuTrainState* st, GPT2* host, const Dist* dist, int rank, const Tokenizer* tok,
                             const Options* o) {
    if (st->gs.pending) { /* the snapshot's copies are this very master: take them */
        gpu_snapshot_hand_over(&st->gs, &st->saver, dist, host, o);
    } else {
        saver_before_update(&st->saver); /* the Saver's thread is done with the host weights */
        dp_params_to_host(&st->dp, host);
    }
    if (rank == 0) sample_print(host, tok, o, &st->r.sample_rng);
}

/* A model file at `done` steps, for a run without training states. */
static void gpu_checkpoint_save(GpuTrainState* st, GPT2* host, const Options* o, int rank, int done) {
    dp_params_to_host(&st->dp, host);
    if (rank == 0) checkpoint_save(host, o, done);
}

/* After the last step: what the collectives and the snapshots cost, and
 * the final state and model (a model file only, without states). 0 or -1. */
static int gpu_train_finish(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm) {
    GpuDataParallel& dp = st->dp;
    Dist* dist = &comm->dist;
    if (dp.active && dp.steps_timed > 0)
        printf("communication per step: %.2f ms of reduction left after backward, %.2f ms all-gather (means over %d "
               "steps)\n", dp.exposed_ms / dp.steps_timed, dp.gather_ms / dp.steps_timed, dp.steps_timed);
    gpu_levels_print(comm); /* (collective) */
    if (!st->states) {
        gpu_checkpoint_save(st, host, o, comm->rank, st->r.steps);
        return 0;
    }
    gpu_snapshot_hand_over(&st->gs, &st->saver, dist, host, o); /* (none is pending here: each is handed over by the next update) */
    train_run_report(&st->r, &st->saver);
    gpu_snapshot_start(&st->gs, &st->saver, &st->dp, &st->r, st->r.steps, 1); /* the final state and model */
    gpu_snapshot_hand_over(&st->gs, &st->saver, dist, host, o);
    int rc = train_run_final_save(&st->saver, dist, o);
    st->drop_memory = rc == 0; /* the run is over: its memory snapshots go (kept if the last write failed) */
    return rc;
}

/* The training loop: train_gpt.c's train() with the GPU doing the steps;
 * the data, schedule, log lines, training states (snapshots in memory and
 * on disk, --resume, --stop-at, rollback after bad steps) come from the same
 * TrainRun and Saver (plus MFU), and so does the loop's tail (gptc/saver.h).
 * With several ranks each trains on its slice of every step's batch (G6).
 * Returns 0 or -1 from anywhere: what it set up is in `st`, for
 * gpu_train_free (its only caller is gpu_train).
 * STATUS (2026-11-30): split into gpu_train_setup / the loop /
 * gpu_train_finish, with the tail shared with train(), after the H200 run;
 * run since through the CPU execution layer (make test-cuda-on-cpu: 11 of
 * 11, an 8-step run with snapshots and saves gives the same lines and model
 * bytes), not yet on a GPU; since, each micro-batch uploads its tokens and
 * then runs as one piece (gpu_micro_batch) and one GPU's update is gated on
 * the device, both replayed from CUDA graphs after the first step: the
 * same model bytes as before on the CPU execution, not yet on a GPU. */
static int gpu_train_steps(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm,
                           const Tokenizer* tok, const char* train_pattern, const char* val_pattern) {
    int start = gpu_train_setup(st, host, o, comm, train_pattern, val_pattern);
    if (start == STANDBY_DISMISSED) return 0; /* a spare not needed: nothing was written, the memory stays */
    if (start < 0) return -1;
    Dist* dist = &comm->dist;
    int rank = comm->rank, world = comm->world;
    /* (references: the body reads as the plain loop it is; everything lives in st) */
    TrainRun& r = st->r;
    GpuDataParallel& dp = st->dp;
    GpuGPT2& g = st->g;
    Saver& saver = st->saver;
    GpuSnapshots& gs = st->gs;
    for (int step = start; step <= r.steps; step++) {
        /* at the boundary before step `step`: validation and a sample */
        dp_params_ready(&dp);
        if (train_run_val_due(&r, o, step) && (step > start || start == 0))
            train_run_log_val(&r, step, gpu_evaluate_ranks(&g, &r.val, comm, o->val_batches));
        if (train_run_sample_due(&r, o, step)) gpu_sample_print(st, host, dist, rank, tok, o);
        if (step == r.steps) break;
        /* the step: gradients of grad_accum micro-batches, reduced over the ranks as backward goes; then AdamW */
        double t0 = time_ms();
        g.graphs = st->graphs && step > start; /* the first step warms up: cuBLASLt's heuristics, kernels loaded */
        dp_zero_grad(&dp);
        for (int micro = 0; micro < r.grad_accum; micro++) {
            if (dataloader_next(&r.train) != 0) return -1;
            gpu_tokens_upload(&g, r.train.inputs, r.train.targets, r.B * r.T, micro);
            dp_arm(&dp, micro == r.grad_accum - 1);
            gpu_micro_batch(&g, r.B, r.T, 1.0f / ((float)r.grad_accum * r.B * r.T * world));
        }
        dp_backward_done(&dp);
        float lr = (float)lr_at(&r.sched, step);
        StepOutcome s = {0.0, 0, 0, 0.0};
        saver_before_update(&saver); /* the snapshot handed over before the last update is copied out */
        gpu_snapshot_hand_over(&gs, &saver, dist, host, o); /* the last boundary's copies, before master, m, v change */
        if (g.offload) saver_before_update(&saver); /* --offload 1: the update writes the very arrays the Saver copies */
        SpikeGate gate = {&r.watch, o->spike_z, test_hook_spike(&r, step + 1), 0, 0.0};
        double norm = dp_step(&dp, &r.opt, lr, step + 1, o->grad_clip, gpu_update_seed(o->seed, step), r.grad_accum,
                              &gate, &s.loss, &s.finite);
        dp_step_wait(&dp); /* the step's time includes the update and the all-gather */
        gpu_levels_step_end(comm, step + 1); /* bytes per level (G6) */
        double ms = time_ms() - t0;
        char mfu[64];
        mfu_format(mfu, sizeof(mfu), r.total / (ms / 1000.0) / world, st->fpt, st->peak); /* per GPU */
        r.mfu = st->peak > 0.0 ? 100.0 * r.total / (ms / 1000.0) / world * st->fpt / (st->peak * 1e12) : 0.0; /* the log's */
        train_run_log_step(&r, step, s.loss, lr, norm, ms, s.finite, mfu);
        /* after the step: a rollback, a snapshot or save, --stop-at (gptc/saver.h) */
        s.spike = gate.spike;
        s.z = gate.z;
        ALWAYS(!gs.pending); /* handed over before this step's update: a rollback may write the host arrays */
        int back = train_run_after_step(&r, &saver, dist, host, o, step, start, &s, st->states);
        if (step == start) gpu_memory_after_first_step(st);
        if (back >= 0) { /* the host arrays hold the snapshot: to the GPU (a snapshot's last update was applied) */
            dp_state_upload(&dp, host->params_memory, host->m_memory, host->v_memory, o->seed, back - 1);
            step = back - 1; /* the loop's step++ continues after the snapshot's step */
            continue;
        }
        Boundary b = train_run_boundary(&r, o, step + 1);
        if (!st->states) { /* (no --stop-at without states) */
            if (b.save) gpu_checkpoint_save(st, host, o, rank, b.done);
            continue;
        }
        if (b.snapshot) gpu_snapshot_start(&gs, &saver, &dp, &r, b.done, b.save);
        saver_poll(&saver, dist, o, 0);
        if (b.stop) {
            gpu_snapshot_hand_over(&gs, &saver, dist, host, o);
            train_run_stop(&saver, dist, o, b.done);
            st->drop_memory = 0; /* the memory stays for the next job on this host */
            return 0;
        }
    }
    return gpu_train_finish(st, host, o, comm);
}

/* gpu_train_steps, then gpu_train_free: every way out of a run releases it. */
static int gpu_train(GPT2* host, const Options* o, GpuComm* comm, const Tokenizer* tok,
                     const char* train_pattern, const char* val_pattern) {
    GpuTrainState st;
    memset(&st, 0, sizeof(st));
    int rc = gpu_train_steps(&st, host, o, comm, tok, train_pattern, val_pattern);
    if (rc == 0 && o->plan_check && st.have_model) rc = gpu_plan_check(&st.plan, comm, "after training");
    gpu_train_free(&st, rc != 0, comm->world);
    return rc;
}

/* gpu_train as train_gpt.c's TrainFn; ctx is the GpuComm.
 * (--prompt stays on the CPU: the sampler with its KV cache.) */
static int gpu_train_fn(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                        const char* val_pattern, void* ctx) {
    return gpu_train(model, o, (GpuComm*)ctx, tok, train_pattern, val_pattern);
}

#if GPTCU_MAIN /* not when test_gpt.cu or dev/cuda/ include this file for its kernels (GPTC_NO_MAIN) */
int main(int argc, char** argv) {
    Options o;
    int rc = options_parse(&o, argc, argv); /* one table for both trainers, the GPU's flags in it (gptc/cli.h) */
    if (rc != 0) {
        usage(rc == 1 ? stdout : stderr, argv[0]);
        return rc == 1 ? 0 : EXIT_FAILURE;
    }
    const char* problem = options_problem(&o);
    if (!problem) problem = gpu_options_problem(&o);
    if (problem) {
        fprintf(stderr, "error: %s\n", problem);
        return EXIT_FAILURE;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "error: no CUDA device found; train on the CPU with ./train_gpt (same flags)\n");
        return EXIT_FAILURE;
    }
    gpu_comm_timeout_s = o.comm_timeout;
    GpuComm comm;
    if (gpu_comm_init(&comm, o.init, o.init_timeout, o.zero > 0, &argc, &argv) != 0) {
        gpu_comm_free(&comm, 1);
        return EXIT_FAILURE;
    }
    StartupMark mark = startup_begin();
    if (gpu_levels_init(&comm, o.topology, o.hierarchical, o.comm_levels, o.zero == 3 && (o.qwz || o.qgz || o.hpz)) != 0) { /* nodes, communicators per level */
        gpu_comm_free(&comm, 0); /* (every rank fails alike, with nothing in flight) */
        return EXIT_FAILURE;
    }
    startup_end(SU_COMM, mark);
    /* ranks other than 0 train silently: their errors still go to stderr */
    if (comm.rank != 0 && !freopen("/dev/null", "w", stdout)) fprintf(stderr, "warning: rank %d prints\n", comm.rank);
    if (o.plan) { /* the device memory plan and its candidates, then exit */
        rc = gpu_plan_print(&o, &comm);
        gpu_comm_free(&comm, 0);
        return rc == 0 ? 0 : EXIT_FAILURE;
    }
    if (o.data[0] && comm.world > 1 && !comm.mpi) {
        fprintf(stderr, "error: --data with several ranks needs --init mpi (the others wait at a barrier while rank 0 "
                "tokenizes); without MPI tokenize first with one process (./train_gpt_cu --data %s --steps 1), then "
                "give the ranks --train-data \"%s.gptc/shard_train_*.bin\" --val-data \"%s.gptc/shard_val_*.bin\"\n",
                o.data, o.data, o.data);
        gpu_comm_free(&comm, 1);
        return EXIT_FAILURE;
    }
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
    printf("threads: %d (OpenMP, host side: data, sampling)%s\n", num_threads(), comm.world > 1 ? " per rank" : "");
#endif
    /* train_gpt.c: model, tokenizer, --prompt, --data (rank 0 tokenizes; under MPI the others wait) */
    rc = gptc_run(&o, gpu_train_fn, &comm, comm.mpi ? &comm.dist : NULL);
    gpu_comm_free(&comm, rc != 0);
    return rc == 0 ? 0 : EXIT_FAILURE;
}
#endif /* GPTCU_MAIN */
