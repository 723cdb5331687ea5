/*
 * train_gpt.cu: GPT-2 pretraining on NVIDIA GPUs, the CUDA twin of train_gpt.c.
 *
 * It #includes train_gpt.c for every host-side part (CLI, file formats,
 * tokenizer, data loader, schedules, sampling, training states, rendezvous)
 * and tells what differs on a GPU: the model's device tensors, the forward
 * and backward through kernels and cuBLASLt, AdamW on the device, and data
 * parallelism over NCCL (allreduce, or ZeRO-1/2/3 shards). Precision: bf16
 * weights and activations; fp32 master weights, AdamW moments, weight
 * gradients (18 bytes per parameter), LayerNorm and softmax statistics and
 * the loss; the update rounds master -> bf16 stochastically. Attention is
 * flash-style: only the log-sum-exp per row is kept for backward.
 *
 * Build and run (the Makefile's CUDA section finds NCCL, or builds without it):
 *   make train_gpt_cu
 *   ./train_gpt_cu --model d12 --train-data "data/fineweb_train_*.bin" --batch-size 16 --seq-len 1024
 *   mpirun -np 8 ./train_gpt_cu_mpi --init mpi --zero 1 ...   (make train_gpt_cu_mpi)
 * Same flags as train_gpt (./train_gpt_cu --help), the GPU's own among them
 * (--gelu-fusion, --recompute, --offload, --cuda-graphs, --init, --comm-timeout).
 * Without a GPU, make test-cuda-on-cpu runs this file on the CPU execution
 * layer (dev/cuda/cpu); what has run on a real GPU is in docs/gpu.md.
 *
 * Reading order (read beside train_gpt.c):
 *   G1. Checked calls, the device-memory ledger (gptc/cuda/memory.cuh)
 *   G2. Kernels by family, G3. matmul through cuBLASLt (gptc/cuda/)
 *   G4. The model: device structs, forward, backward, AdamW update, set-up
 *   G5. Throughput and MFU (gptc/cuda/mfu.cuh)
 *   G6. Data parallel: the allreduce and ZeRO's reduce-scatter as backward
 *       runs, the step (dp_step); start-up, levels, ZeRO++ and the shards'
 *       set-up are one include away (comm, levels, zeropp, zero .cuh)
 *   G7. The training loop and main (training states: states.cuh, setup.cuh)
 * Machinery by concern sits in gptc/cuda/: plan.cuh (memory plan), runtime.cuh
 * (the runtime model: --plan's step times, --auto 1, --snapshot-every auto),
 * offload.cuh (--offload 1), recompute.cuh (--recompute), mfu.cuh.
 *
 * Left out: CUDA graphs with several GPUs, --zero, --spike-z or --offload 1
 * (gpu_train_build says why when they are off); bf16 gradient accumulation;
 * overlapping the ZeRO-1/2 weight all-gather with the next forward, and a
 * ZeRO snapshot's gather with the next step.
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

#include "gptc/cuda/nccl.cuh" // NCCL or its stand-ins (-DGPTC_NO_NCCL), NCCL_CHECK, GPU_HAVE_NCCL, GPU_HAVE_SPLIT

/* ------------------------------------------------------------------------ */
/* G1. Checked calls, host waits, device helpers                            */
/* ------------------------------------------------------------------------ */

#include "gptc/cuda/common.cuh" // CUDA_CHECK, CUBLAS_CHECK, KERNEL_CHECK, floatX, ceil_div, warp_sum, block_sum, Pack8



#include "gptc/cuda/memory.cuh" // the device-memory ledger (gpu_alloc, gpu_release, GMEM_*), gpu_wait

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

#include "gptc/cuda/recompute.cuh" // RECOMPUTE_LEVELS, gpu_act_kept, gpu_activation_sizes, gpu_layer_work_sizes

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
 * (the packed bucket); `backward`: for its backward (gathered again). The
 * forward's hook for what the weights wait on: ZeRO-3's gather, and with
 * --offload 1 the host's update of layer l's slices (gpu_offload_wait). */
static ParameterTensorsX gpu_layer_params(GpuGPT2* g, int l, int backward) {
    if (!backward) gpu_offload_wait(g, g->stream, 1 + l);
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

/* The weights outside the layers (wte, wpe, lnfw, lnfb), once ready for
 * what comes next: `piece` 0 a forward's start (ZeRO-3 gathers the head and
 * starts layer 0's; --offload 1 waits for wte and wpe's update), L + 1 its
 * final layernorm (--offload 1: lnfw and lnfb updated), -1 a backward's
 * start (ZeRO-3 starts layer L-1's gather, the head is kept; --offload 1:
 * the whole update done, every gradient slot zeroed). */
static ParameterTensorsX gpu_head_params(GpuGPT2* g, int piece) {
    if (g->weights_begin && piece <= 0) g->weights_begin(g->grads_ctx, piece < 0);
    gpu_offload_wait(g, g->stream, piece);
    return g->params;
}

/* GELU in the fc GEMM's epilogue? Not at levels 1 and 2, whose backward
 * recomputes fch_gelu from the kept fch with our kernel (recompute.cuh:
 * the forward must have run that same kernel). */
static int gpu_gelu_in_epilogue(const GpuGPT2* g) {
    return g->gelu_fusion && (g->recompute == 0 || g->recompute == 3);
}

/* Layer l's attention half, from its input `residual` into `a`
 * (gpu_layer_acts) with its weights `lp` (gpu_layer_params): ln1, qkv,
 * attention, and residual2 = residual + atty . attprojw^T + attprojb. */
static void gpu_layer_attention_forward(GpuGPT2* g, const GpuActivations* a, const ParameterTensorsX* lp,
                                        const floatX* residual, int B, int T) {
    int C = g->config.channels, NH = g->config.num_heads, N = B * T;
    cudaStream_t s = g->stream;
    const ParameterTensorsX& p = *lp;
    layernorm_forward_gpu(a->ln1, a->ln1_mean, a->ln1_rstd, residual, p.ln1w, p.ln1b, N, C, s);
    matmul_forward_gpu(&g->lt, s, a->qkv, a->ln1, p.qkvw, p.qkvb, NULL, NULL, N, C, 3 * C);
    attention_forward_gpu(a->atty, a->lse, a->qkv, B, T, NH, C / NH, s);
    /* one GEMM with beta = 1 adds the residual */
    matmul_forward_gpu(&g->lt, s, a->residual2, a->atty, p.attprojw, p.attprojb, residual, NULL, N, C, C);
}

/* Layer l's MLP up to its last GEMM: ln2, fch = ln2 . fcw^T + fcb and
 * fch_gelu = GELU(fch), the GELU in the GEMM's epilogue or our kernel. */
static void gpu_layer_mlp_forward(GpuGPT2* g, const GpuActivations* a, const ParameterTensorsX* lp, int B, int T) {
    int C = g->config.channels, N = B * T;
    cudaStream_t s = g->stream;
    const ParameterTensorsX& p = *lp;
    layernorm_forward_gpu(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, p.ln2w, p.ln2b, N, C, s);
    int epilogue = gpu_gelu_in_epilogue(g);
    matmul_forward_gpu(&g->lt, s, epilogue ? a->fch_gelu : a->fch, a->ln2, p.fcw, p.fcb, NULL,
                       epilogue ? a->fch : NULL, N, C, 4 * C);
    if (!epilogue) gelu_forward_gpu(a->fch_gelu, a->fch, (long long)N * 4 * C, s);
}

/* Layer l's forward: residual3 = residual2 + fch_gelu . fcprojw^T + fcprojb. */
static void gpu_layer_forward(GpuGPT2* g, const GpuActivations* a, const ParameterTensorsX* lp,
                              const floatX* residual, int B, int T) {
    int C = g->config.channels, N = B * T;
    gpu_layer_attention_forward(g, a, lp, residual, B, T);
    gpu_layer_mlp_forward(g, a, lp, B, T);
    matmul_forward_gpu(&g->lt, g->stream, a->residual3, a->fch_gelu, lp->fcprojw, lp->fcprojb, a->residual2, NULL,
                       N, 4 * C, C);
}

/* The forward of the (B, T) tokens gpu_tokens_upload put on the device
 * (gpu_forward below): device work only, so a step can be captured. */
static void gpu_forward_run(GpuGPT2* g, int B, int T, int targets, float dloss) {
    const GPT2Config* cfg = &g->config;
    int C = cfg->channels, L = cfg->num_layers, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    cudaStream_t s = g->stream;
    GpuActivations a = g->acts;
    ParameterTensorsX p = gpu_head_params(g, 0);
    encoder_forward_gpu(a.encoded, g->dev.inputs, p.wte, p.wpe, B, T, C, s);
    for (int l = 0; l < L; l++) {
        GpuActivations al = gpu_layer_acts(g, l, B, T); /* layer l's slices, or the working set */
        ParameterTensorsX lp = gpu_layer_params(g, l, 0);
        gpu_layer_forward(g, &al, &lp, gpu_layer_input(g, l, B, T), B, T);
    }
    const floatX* last = gpu_layer_input(g, L, B, T);
    p = gpu_head_params(g, L + 1);
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

/* What --recompute did not keep of layer l, again, into the working set
 * (recompute.cuh's table), each step the very kernel on the very inputs the
 * forward ran, so the bits are the forward's: level 1 fch_gelu = GELU(fch);
 * level 2 also ln1 and ln2 (LayerNorm again, writing the kept mean and rstd
 * with the same bits); level 3 the layer's forward but its last GEMM, whose
 * output residual3 is kept. At levels 1 and 2 the forward's GELU was our
 * kernel (gpu_gelu_in_epilogue). Nothing at level 0. */
static void gpu_layer_recompute(GpuGPT2* g, const GpuActivations* a, const ParameterTensorsX* lp,
                                const floatX* residual, int B, int T) {
    int C = g->config.channels, N = B * T;
    cudaStream_t s = g->stream;
    if (g->recompute == 0) return;
    if (g->recompute == 3) {
        gpu_layer_attention_forward(g, a, lp, residual, B, T);
        gpu_layer_mlp_forward(g, a, lp, B, T);
        return;
    }
    ALWAYS(!gpu_gelu_in_epilogue(g));
    if (g->recompute == 2) {
        layernorm_forward_gpu(a->ln1, a->ln1_mean, a->ln1_rstd, residual, lp->ln1w, lp->ln1b, N, C, s);
        layernorm_forward_gpu(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, lp->ln2w, lp->ln2b, N, C, s);
    }
    gelu_forward_gpu(a->fch_gelu, a->fch, (long long)N * 4 * C, s);
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
    gpu_head_params(g, -1); /* ZeRO-3: layer L-1 on its way; --offload 1: the last update done */
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
        gpu_layer_recompute(g, &al, &lp, residual, B, T); /* what --recompute did not keep */
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
    /* (the grids from g->B * g->T, the allocated size: the same for every batch) */
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

#include "gptc/cuda/offload.cuh" // --offload 1: gpu_offload_init, _free, _wait, _sync, _update

#include "gptc/cuda/graphs.cuh" // gpu_graph_run, gpu_micro_batch, gpu_update_gated (CUDA graphs)

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
 *             used (zero.cuh, dp_gather_bucket).
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
 * with its communicator up aborts it (comm.cuh's exit handler; MPI_Abort
 * under MPI), and ranks waiting on the host poll NCCL for errors instead of
 * blocking (gpu_wait), so one rank's death ends the job instead of hanging
 * it. */

#include "gptc/cuda/comm.cuh" // GpuComm, GpuLevels, gpu_comm_init, gpu_comm_free, gpu_comm_sum, gpu_comm_check_agreement
#include "gptc/cuda/levels.cuh" // gpu_levels_init, _free, _count, _allreduce, _reduce_to_owners, _print
#include "gptc/cuda/plan.cuh" // MemoryPlan, gpu_memory_plan_for, memory_check, gpu_plan_check

/* ---- gradients and weights across the ranks ----------------------------- */

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
    struct GpuZeroPP* zpp;    /* ZeRO++ (--qwz, --qgz, --hpz), or NULL */
    int zpp_flags[5];         /* qwz, qgz, feedback, hpz, block: dp_zeropp_flags, before dp_init */
    double exposed_ms, gather_ms; /* sums over steps: reduction left after backward, all-gather */
    int steps_timed;
} GpuDataParallel;

/* Bucket b's padded length (W pieces). */
static size_t dp_bucket_floats(const GpuDataParallel* dp, int b) {
    return shard_map_bucket(&dp->map, b)->piece * (size_t)dp->world;
}

#include "gptc/cuda/zeropp.cuh" // ZeRO++ on --zero 3: gpu_zeropp_init, _free, _gather, _reduce, _problem

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

#include "gptc/cuda/zero.cuh" // dp_layout, dp_init, dp_free, dp_print, the ZeRO-3 gathers, dp_state_to_host, dp_state_upload

/* ------------------------------------------------------------------------ */
/* G7. Training loop and main                                               */
/* ------------------------------------------------------------------------ */

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

#include "gptc/cuda/eval.cuh" // --eval-file on the GPU: eval_sums_kernel, gpu_eval_choices, gpu_eval_log, gpu_eval_only
#include "gptc/cuda/sample.cuh" // generation with a KV cache: GpuSampler, gpu_sampler_init, _free, gpu_prompt

#include "gptc/cuda/states.cuh" // GpuSnapshots, gpu_snapshots_init, _free, gpu_snapshot_start, _hand_over, gpu_states_problem
#include "gptc/cuda/mfu.cuh" // gpu_peak_tflops, flops_per_token, mfu_format, gpu_device_print
#include "gptc/cuda/runtime.cuh" // the runtime model, its calibration: gpu_plan_print (--plan), gpu_plan_runtime (--auto)

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
 * the communicator next). */
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

#include "gptc/cuda/setup.cuh" // gpu_options_problem, gpu_train_states_decide, gpu_train_build, gpu_standby, gpu_train_resume, gpu_memory_after_first_step

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

/* A sample at a boundary, on rank 0: on the GPU from the bf16 weights the
 * next step uses (gptc/cuda/sample.cuh), nothing copied back. Under ZeRO-3
 * no rank holds them whole: there the CPU sampler runs on the host's copy
 * of the master, gathered (collective). */
static void gpu_sample_print(GpuTrainState* st, GPT2* host, const Dist* dist, int rank, const Tokenizer* tok,
                             const Options* o) {
    GpuGPT2* g = &st->g;
    if (!g->layer_weights) {
        if (rank != 0) return;
        gpu_offload_sync(g); /* --offload 1: the last update's weights are on the device */
        GpuSampler sp;
        gpu_sampler_init(&sp, &g->config, g->param_sizes, &g->params, &g->lt, g->stream);
        sample_print(&sp.d, tok, o, &st->r.sample_rng);
        gpu_sampler_free(&sp);
        return;
    }
    if (st->gs.pending) { /* the snapshot's copies are this very master: take them */
        gpu_snapshot_hand_over(&st->gs, &st->saver, dist, host, o);
    } else {
        saver_before_update(&st->saver); /* the Saver's thread is done with the host weights */
        dp_params_to_host(&st->dp, host);
    }
    if (rank == 0) cpu_sample_print(host, tok, o, &st->r.sample_rng);
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
 * gpu_train_free (its only caller is gpu_train). Each micro-batch uploads
 * its tokens and then runs as one piece (gpu_micro_batch); one GPU's update
 * is gated on the device; both are replayed from CUDA graphs after the
 * first step where graphs apply. */
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
        /* at the boundary before step `step`: validation, the eval set and a sample */
        dp_params_ready(&dp);
        if (train_run_val_due(&r, o, step) && (step > start || start == 0))
            train_run_log_val(&r, step, gpu_evaluate_ranks(&g, &r.val, comm, o->val_batches));
        if (train_run_eval_due(&r, o, step) && (step > start || start == 0) &&
            gpu_eval_log(&g, &r.eval, o, comm, r.log, step) != 0)
            return -1;
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

/* gpu_train as train_gpt.c's TrainFn; ctx is the GpuComm (gpu_prompt is its PromptFn). */
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
    if (o.plan) { /* the device memory plan and its candidates with their step times, then exit */
        rc = gpu_plan_print(&o, &comm);
        gpu_comm_free(&comm, 0);
        return rc == 0 ? 0 : EXIT_FAILURE;
    }
    if ((o.auto_plan || o.snapshot_auto) && gpu_plan_runtime(&o, &comm) != 0) { /* may set B, ZeRO, recompute, offload */
        gpu_comm_free(&comm, 0);
        return EXIT_FAILURE;
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
    if (o.steps == 0 && o.eval_file[0] && !o.prompt[0]) { /* --eval-file alone: score --model on the GPU(s), stop */
        rc = gpu_eval_only(&o, &comm);
        gpu_comm_free(&comm, rc != 0);
        return rc == 0 ? 0 : EXIT_FAILURE;
    }
    /* train_gpt.c: model, tokenizer, --prompt, --data (rank 0 tokenizes; under MPI the others wait) */
    rc = gptc_run(&o, gpu_train_fn, gpu_prompt, &comm, comm.mpi ? &comm.dist : NULL);
    gpu_comm_free(&comm, rc != 0);
    return rc == 0 ? 0 : EXIT_FAILURE;
}
#endif /* GPTCU_MAIN */
