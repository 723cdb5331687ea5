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
 * Machinery by concern sits in gptc/cuda/: plan.cuh (memory plan, --plan),
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

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(err_));                                        \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t st_ = (call);                                                  \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                           \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                    cublasLtGetStatusString(st_));                                    \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)


/* After every launch: catches bad launch configurations at once. (Faults
 * inside a kernel surface at the next synchronising call.) */
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

#include "gptc/cuda/memory.cuh" // the device-memory ledger (gpu_alloc, gpu_release, GMEM_*), gpu_wait

typedef __nv_bfloat16 floatX; /* the storage type of parameters and activations */

static int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over a block of up to 1024 threads, the same tree every time (so the
 * result is bitwise reproducible). Every thread gets the total. `shared`
 * holds 32 floats. */
__device__ float block_sum(float x, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    x = warp_sum(x);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0) shared[warp] = x;
    __syncthreads(); /* every warp's partial is written */
    float y = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(y);
}

/* 8 bf16 = 16 bytes: one vector load or store. */
struct alignas(16) Pack8 {
    floatX v[8];
};

/* ------------------------------------------------------------------------ */
/* G2. Kernels                                                              */
/* ------------------------------------------------------------------------ */
/* Each kernel mirrors the train_gpt.c layer function of the same stem (its
 * CPU reference in test_gpt.cu and dev/cuda/). Launchers are `name_gpu`. */

/* ---- encoder ----------------------------------------------------------- */

/* out(B,T,C) = wte[inp] + wpe[t]; 8 channels per thread (C % 8 == 0) or 1. */
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                       int BT, int T, int C, int vec) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per_row = vec ? C / 8 : C;
    if (idx >= (long long)BT * per_row) return;
    int bt = (int)(idx / per_row), t = bt % T;
    int c = (int)(idx % per_row) * (vec ? 8 : 1);
    const floatX* te = wte + (size_t)inp[bt] * C + c;
    const floatX* pe = wpe + (size_t)t * C + c;
    floatX* o = out + (size_t)bt * C + c;
    if (vec) {
        Pack8 a = *(const Pack8*)te, b = *(const Pack8*)pe, r;
        for (int i = 0; i < 8; i++) r.v[i] = __float2bfloat16(__bfloat162float(a.v[i]) + __bfloat162float(b.v[i]));
        *(Pack8*)o = r;
    } else {
        *o = __float2bfloat16(__bfloat162float(*te) + __bfloat162float(*pe));
    }
}

static void encoder_forward_gpu(floatX* out, const int* inp, const floatX* wte, const floatX* wpe,
                                int B, int T, int C, cudaStream_t s) {
    int vec = C % 8 == 0;
    long long n = (long long)B * T * (vec ? C / 8 : C);
    encoder_forward_kernel<<<ceil_div(n, 256), 256, 0, s>>>(out, inp, wte, wpe, B * T, T, C, vec);
    KERNEL_CHECK();
}

/* Deterministic backward of the token embedding, spread evenly over blocks.
 *   dwte[tok] += sum over positions p with inp[p] == tok of dout[p]
 * The host groups the B*T positions by token (a counting sort, ascending
 * positions within a token: encoder_buckets_build) and cuts each token's
 * bucket into chunks of at most ENC_CHUNK positions (encoder_chunks_build).
 * One block sums a chunk, in position order. A token of one chunk (most of
 * them) adds its sum into dwte at once; a token of several chunks (GPT-2's
 * end of text, "the", ",": thousands of the 65,536 positions of a B = 64,
 * T = 1024 micro-batch) writes one partial row per chunk, and a second
 * kernel adds each such token's partials into dwte in chunk order. A token
 * of n positions is then ceil(n / ENC_CHUNK) chunks' work spread over the
 * blocks, plus one finishing sum of that many rows, where one block per
 * token (the previous production kernel, now dev/cuda/encoder.cu's
 * variant 2) looped over all n rows alone; and the sums keep one fixed
 * order: no atomics, the same bits on every run.
 * Launches are the same for every batch (a captured step, CUDA graphs,
 * replays them): fixed grids (encoder_grids), the counts read from device
 * memory (StepInputs), each block striding over the chunks (or tokens)
 * past its own; the partial rows are sized for the worst case
 * (encoder_max_partials). Worst cases, with K = ENC_CHUNK and N = B*T:
 *   chunks   every chunk but a token's last holds K positions, so
 *            chunks <= floor(N / K) + distinct tokens <= floor(N / K) + min(N, V),
 *            and <= N (each holds a position): 51,281 at N = 65,536, V = 50,257;
 *   tokens of several chunks  each holds >= K + 1 positions: <= floor(N / (K + 1));
 *   their chunks  a token of n >= K + 1 positions has ceil(n / K) <= 2n / (K + 1)
 *            chunks (equality at n = K + 1), so <= floor(2N / (K + 1)) partial
 *            rows: 2,016 at N = 65,536 (6.2 MB of fp32 at C = 768).
 * STATUS: not yet run on a GPU (validated on the CPU: dev/cuda/encoder.cu,
 * test_gpt.cu). */
#define ENC_CHUNK 64         /* positions per chunk */
#define ENC_BLOCKS_MAX 1024  /* blocks per launch at most (about 8 per SM of an H200's 132), each striding */

/* The device side of the chunks (StepInputs carries them, pinned on the host
 * and copied per micro-batch). Chunk k sums the positions
 * bucket_pos[chunk_start[k] .. chunk_start[k + 1]) of token chunk_token[k]
 * into dwte (chunk_slot[k] < 0) or into partial row chunk_slot[k]; the j-th
 * token of several chunks, long_token[j], owns partial rows
 * long_slot[j] .. long_slot[j + 1]. */
typedef struct {
    int* bucket_pos;  /* (B*T) positions grouped by token, ascending within one */
    int* chunk_start; /* (max chunks + 1) */
    int* chunk_token; /* (max chunks) */
    int* chunk_slot;  /* (max chunks) partial row, or -1: straight into dwte */
    int* long_token;  /* (max long) tokens of several chunks, ascending */
    int* long_slot;   /* (max long + 1) */
    int* num_chunks;  /* (1) */
    int* num_long;    /* (1) */
} EncoderChunks;
#define NUM_ENCODER_CHUNKS 8
static_assert(sizeof(EncoderChunks) == NUM_ENCODER_CHUNKS * sizeof(void*), "EncoderChunks must match its table");

static int encoder_max_chunks(int BT, int V) {
    long long n = (long long)BT / ENC_CHUNK + (BT < V ? BT : V);
    return (int)(n < BT ? n : BT);
}
static int encoder_max_long(int BT) { return BT / (ENC_CHUNK + 1); }
static int encoder_max_partials(int BT) { return (int)(2LL * BT / (ENC_CHUNK + 1)); }

/* Block c sums chunks c, c + gridDim.x, ...; within a chunk, thread x owns
 * channels x, x + blockDim.x, ... (each warp reads consecutive bf16 of a row)
 *   acc[c] = sum over the chunk's positions p, in order, of dout[p][c] */
__global__ void encoder_backward_wte_chunk_kernel(float* dwte, float* partial, const floatX* dout, EncoderChunks e,
                                                  int C) {
    int n = e.num_chunks[0];
    for (int k = blockIdx.x; k < n; k += gridDim.x) {
        int p0 = e.chunk_start[k], p1 = e.chunk_start[k + 1], slot = e.chunk_slot[k];
        float* dst = slot < 0 ? dwte + (size_t)e.chunk_token[k] * C : partial + (size_t)slot * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0.0f;
            for (int i = p0; i < p1; i++) acc += __bfloat162float(dout[(size_t)e.bucket_pos[i] * C + c]);
            if (slot < 0) dst[c] += acc;
            else dst[c] = acc;
        }
    }
}

/* Block j sums tokens of several chunks j, j + gridDim.x, ...:
 *   dwte[tok][c] += sum over its partial rows s, in chunk order, of partial[s][c] */
__global__ void encoder_backward_wte_finish_kernel(float* dwte, const float* partial, EncoderChunks e, int C) {
    int n = e.num_long[0];
    for (int j = blockIdx.x; j < n; j += gridDim.x) {
        int s0 = e.long_slot[j], s1 = e.long_slot[j + 1];
        float* dst = dwte + (size_t)e.long_token[j] * C;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0.0f;
            for (int s = s0; s < s1; s++) acc += partial[(size_t)s * C + c];
            dst[c] += acc;
        }
    }
}

/* The fixed grids: as many blocks as there can be chunks (tokens of several
 * chunks), at most ENC_BLOCKS_MAX; 0 finishing blocks when no token can
 * have several chunks (N <= K). */
static void encoder_grids(int BT, int V, int* chunk_blocks, int* finish_blocks) {
    int mc = encoder_max_chunks(BT, V), ml = encoder_max_long(BT);
    *chunk_blocks = mc < ENC_BLOCKS_MAX ? mc : ENC_BLOCKS_MAX;
    *finish_blocks = ml < ENC_BLOCKS_MAX ? ml : ENC_BLOCKS_MAX;
}

/* dwte (V, C) += the token embedding's gradient from dout (B*T, C), with the
 * chunks `e` that encoder_chunks_build made for this batch and sent to the
 * device; `partial`: (encoder_max_partials(B*T), C) fp32 scratch. */
static void encoder_backward_wte_gpu(float* dwte, float* partial, const floatX* dout, EncoderChunks e, int BT, int V,
                                     int C, cudaStream_t s) {
    int chunk_blocks, finish_blocks;
    encoder_grids(BT, V, &chunk_blocks, &finish_blocks);
    encoder_backward_wte_chunk_kernel<<<chunk_blocks, 256, 0, s>>>(dwte, partial, dout, e, C);
    KERNEL_CHECK();
    if (finish_blocks > 0) { /* (depends only on B*T: the same launches for every batch) */
        encoder_backward_wte_finish_kernel<<<finish_blocks, 256, 0, s>>>(dwte, partial, e, C);
        KERNEL_CHECK();
    }
}

/* dwpe[t] += sum over b of dout[b, t]: one thread per (t, c), b in order. */
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * C) return;
    int t = (int)(idx / C), c = (int)(idx % C);
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += __bfloat162float(dout[((size_t)b * T + t) * C + c]);
    dwpe[idx] += acc;
}

/* Host side of the bucketing: tokens (B*T) -> distinct tokens in ascending
 * order, their start offsets, and positions grouped by token. `count` is V
 * ints of scratch. Returns the number of distinct tokens. */
static int encoder_buckets_build(const int* inp, int BT, int V, int* count, int* bucket_token,
                                 int* bucket_start, int* bucket_pos) {
    memset(count, 0, sizeof(int) * (size_t)V);
    for (int i = 0; i < BT; i++) count[inp[i]]++;
    int nb = 0, offset = 0;
    for (int v = 0; v < V; v++) {
        if (!count[v]) continue;
        bucket_token[nb] = v;
        bucket_start[nb] = offset;
        nb++;
        int c = count[v];
        count[v] = offset; /* now the next free slot of token v */
        offset += c;
    }
    bucket_start[nb] = offset;
    for (int i = 0; i < BT; i++) bucket_pos[count[inp[i]]++] = i;
    return nb;
}

/* ... and the chunks of those `nb` buckets into e's host arrays (all but
 * bucket_pos, which encoder_buckets_build filled): chunks in bucket order,
 * so chunk k's positions follow chunk k-1's; partial rows numbered in the
 * same order. Sets *e.num_chunks and *e.num_long; the bounds above size the
 * arrays, and a count past one stops here (ALWAYS: it cannot happen). */
static void encoder_chunks_build(EncoderChunks e, const int* bucket_token, const int* bucket_start, int nb, int BT,
                                 int V) {
    int nch = 0, nl = 0, slots = 0;
    int max_chunks = encoder_max_chunks(BT, V), max_long = encoder_max_long(BT), max_slots = encoder_max_partials(BT);
    for (int b = 0; b < nb; b++) {
        int p0 = bucket_start[b], p1 = bucket_start[b + 1], k = (p1 - p0 + ENC_CHUNK - 1) / ENC_CHUNK;
        if (k > 1) {
            ALWAYS(nl < max_long && slots + k <= max_slots);
            e.long_token[nl] = bucket_token[b];
            e.long_slot[nl] = slots;
            nl++;
        }
        for (int p = p0; p < p1; p += ENC_CHUNK) {
            ALWAYS(nch < max_chunks);
            e.chunk_start[nch] = p;
            e.chunk_token[nch] = bucket_token[b];
            e.chunk_slot[nch] = k > 1 ? slots++ : -1;
            nch++;
        }
    }
    e.chunk_start[nch] = bucket_start[nb];
    e.long_slot[nl] = slots;
    e.num_chunks[0] = nch;
    e.num_long[0] = nl;
}

/* ---- layernorm ---------------------------------------------------------- */
/* The production kernels keep one row per warp in registers: each lane owns
 * the 8-channel groups ("packs") p = lane, lane + 32, ..., K of them, so a
 * row of C <= 256 K channels is read from memory once, as 16-byte loads
 * when C % 8 == 0 and every pointer is 16-byte aligned (vec), as 8 scalar
 * loads per pack otherwise (the tiny fixtures: C = 36). K = ceil(C / 256) is
 * a template parameter (1..LN_MAX_PACKS) so that the row's packs index
 * registers; wider rows take the scalar kernels further down.
 * STATUS: not yet run on a GPU (validated on the CPU: dev/cuda/layernorm.cu,
 * test_gpt.cu). */
#define LN_MAX_PACKS 8 /* C <= 2048 on the register path (GPT-2 XL: C = 1600, K = 7) */

/* bf16 pack <-> 8 floats */
__device__ __forceinline__ void pack8_to_float(float f[8], const Pack8& p) {
    for (int j = 0; j < 8; j++) f[j] = __bfloat162float(p.v[j]);
}
__device__ __forceinline__ Pack8 float_to_pack8(const float f[8]) {
    Pack8 p;
    for (int j = 0; j < 8; j++) p.v[j] = __float2bfloat16(f[j]);
    return p;
}
/* Pack p of a row of C channels (channels 8p .. 8p+7): one 16-byte load, or
 * (not vec) 8 scalar loads with the channels past C read as 0. */
__device__ __forceinline__ Pack8 row_pack_load(const floatX* row, int p, int C, int vec) {
    if (vec) return ((const Pack8*)row)[p];
    Pack8 r;
    for (int j = 0; j < 8; j++) r.v[j] = 8 * p + j < C ? row[8 * p + j] : __float2bfloat16(0.0f);
    return r;
}
__device__ __forceinline__ void row_pack_store(floatX* row, int p, int C, int vec, const Pack8& v) {
    if (vec) {
        ((Pack8*)row)[p] = v;
        return;
    }
    for (int j = 0; j < 8; j++)
        if (8 * p + j < C) row[8 * p + j] = v.v[j];
}

static int layernorm_packs(int C) { return ceil_div(ceil_div(C, 8), 32); } /* K */
static int is_aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

/* out = (x - mean) * rstd * w + b, one warp per row, the row in registers:
 * mean, then the variance as the mean of (x - mean)^2 (two passes over the
 * registers, not E[x^2] - mean^2, which cancels), both warp sums. */
template <int K>
__global__ void layernorm_forward_kernel(floatX* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const floatX* __restrict__ inp,
                                         const floatX* __restrict__ weight, const floatX* __restrict__ bias,
                                         int N, int C, int vec) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    int P = (C + 7) / 8;
    const floatX* x = inp + (size_t)row * C;
    float xr[K][8]; /* this lane's packs of the row, fp32 */
    float sum = 0.0f;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p < P) pack8_to_float(xr[i], row_pack_load(x, p, C, vec)); /* every load issued before any use */
    }
    for (int i = 0; i < K; i++)
        if (lane + 32 * i < P)
            for (int j = 0; j < 8; j++) sum += xr[i][j]; /* channels past C were read as 0 */
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p < P)
            for (int j = 0; j < 8; j++) {
                float d = 8 * p + j < C ? xr[i][j] - m : 0.0f;
                var += d * d;
            }
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    floatX* o = out + (size_t)row * C;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p >= P) continue;
        float w[8], b[8], y[8];
        pack8_to_float(w, row_pack_load(weight, p, C, vec));
        pack8_to_float(b, row_pack_load(bias, p, C, vec));
        for (int j = 0; j < 8; j++) y[j] = (xr[i][j] - m) * s * w[j] + b[j];
        row_pack_store(o, p, C, vec, float_to_pack8(y));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

/* The scalar forward, for rows wider than 256 LN_MAX_PACKS channels (and
 * the kernel lab's "old production" variant: until 2026-11-30 it was the
 * only one; 25 us for 16384 x 768 on an H200). One warp per row, three
 * passes over the row (the second and third hit L1/L2). */
__global__ void layernorm_forward_scalar_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                                const floatX* weight, const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    floatX* o = out + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += __bfloat162float(x[c]);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = __bfloat162float(x[c]) - m;
        var += d * d;
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        o[c] = __float2bfloat16(n * __bfloat162float(weight[c]) + __bfloat162float(bias[c]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

#define LN_ROWS_PER_BLOCK 8 /* warps (one row each) per block: the forwards and the unfused dx kernel */

static void layernorm_forward_scalar_gpu(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C, cudaStream_t s) {
    layernorm_forward_scalar_kernel<<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    KERNEL_CHECK();
}

/* Calls F(K) with K = 1..LN_MAX_PACKS a compile-time constant. */
#define LN_DISPATCH_K(K_RUNTIME, F) \
    switch (K_RUNTIME) {            \
    case 1: F(1); break;            \
    case 2: F(2); break;            \
    case 3: F(3); break;            \
    case 4: F(4); break;            \
    case 5: F(5); break;            \
    case 6: F(6); break;            \
    case 7: F(7); break;            \
    case 8: F(8); break;            \
    default: CHECK(0, "layernorm: no kernel for this width"); \
    }

static void layernorm_forward_gpu(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, cudaStream_t s) {
    int K = layernorm_packs(C);
    if (K > LN_MAX_PACKS) {
        layernorm_forward_scalar_gpu(out, mean, rstd, inp, weight, bias, N, C, s);
        return;
    }
    int vec = C % 8 == 0 && is_aligned16(out) && is_aligned16(inp) && is_aligned16(weight) && is_aligned16(bias);
#define LN_FWD(KK)                                                                                      \
    layernorm_forward_kernel<KK><<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>( \
        out, mean, rstd, inp, weight, bias, N, C, vec)
    LN_DISPATCH_K(K, LN_FWD);
#undef LN_FWD
    KERNEL_CHECK();
}

/* LayerNorm backward in one pass (Ba, Kiros & Hinton 2016; the CPU twin's
 * layernorm_backward). With n = (x - mean) * rstd and dn = dy * w:
 *   dx += rstd * (dn - mean(dn) - n * mean(dn * n))     (dinp, accumulated)
 *   dweight += sum over rows of dy * n,  dbias += sum over rows of dy
 * Block b owns rows [32 b, 32 b + 32): its 4 warps take every 4th row, each
 * lane holding its packs of x, dy and dinp in registers (all loads of a row
 * issued before any store). Each warp keeps running dweight/dbias sums of
 * its rows in its own slice of shared memory, every lane touching only its
 * own channels (no atomics; laid out [j][p] so a warp's accesses hit 32
 * banks). At the end the block adds its warps' sums in warp order and writes
 * its partial row (blocks, C) of each; column_sums_finish_kernel adds the
 * partials in block order. The result is the
 * same on every run and every GPU: the row-to-block map depends on N only.
 *
 * Why the old dx kernel (layernorm_backward_dx_kernel below) took 400 us
 * when the forward with the same access pattern takes 25 (H200, 16384 x 768;
 * reasoned from the code, not profiled at this depth): its second loop
 * reads dx[c] (first touch: DRAM), x[c], dy[c], w[c] and then stores dx[c];
 * nothing says dinp does not alias the inputs, so the compiler cannot move
 * the next iteration's loads above this store, and each lane has exactly one
 * 2-byte load in flight per DRAM round trip: 24 serialised round trips per
 * row, ~64 bytes in flight per warp. By Little's law an H200 needs roughly
 * 30 KB in flight per SM to stream at 4.8 TB/s; at 64 warps x 64 B it gets
 * ~4 KB, so a few hundred GB/s, which is what the lab measured (218 GB/s).
 * The forward's loop that stores has the same shape, but its loads there hit
 * L1 (the row was read twice already), so the serialisation costs L1, not
 * DRAM, latency. Here every row is one burst of 16-byte loads (3 tensors x
 * K packs per lane, ~4.6 KB per warp at C = 768) and then one burst of
 * stores, and the dweight/dbias sums reuse the registers instead of reading
 * x and dy a second time (column_sums_partial_kernel<true> did).
 * Registers: the sums live in shared memory, not registers, because 16 fp32
 * per pack would cost 48 registers per lane at C = 768 (ptxas: 174 per
 * thread with them, one block per SM). */
#define LN_BWD_WARPS 4
#define LN_BWD_ROWS_PER_BLOCK 32 /* 4 warps x 8 rows */

static int layernorm_backward_blocks(int N) { return ceil_div(N, LN_BWD_ROWS_PER_BLOCK); }
/* floats of scratch the backward needs: dweight and dbias partials */
static size_t layernorm_backward_part_floats(int N, int C) { return 2 * (size_t)layernorm_backward_blocks(N) * C; }
/* dynamic shared memory: per warp, dweight and dbias sums of 8 P floats (P = packs) */
static size_t layernorm_backward_smem(int C) { return (size_t)LN_BWD_WARPS * 2 * 8 * ((C + 7) / 8) * sizeof(float); }

template <int K>
__global__ void __launch_bounds__(32 * LN_BWD_WARPS)
    layernorm_backward_kernel(floatX* __restrict__ dinp, float* __restrict__ part_dw, float* __restrict__ part_db,
                              const floatX* __restrict__ dout, const floatX* __restrict__ inp,
                              const floatX* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C, int vec) {
    extern __shared__ float ln_bwd_smem[]; /* (warps, 2, 8, P): channel 8p + j at [j * P + p] */
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int P = (C + 7) / 8;
    float* sdw = ln_bwd_smem + (size_t)warp * 16 * P;
    float* sdb = sdw + 8 * P;
    Pack8 w[K];
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p >= P) continue;
        w[i] = row_pack_load(weight, p, C, vec); /* once per warp */
        for (int j = 0; j < 8; j++) sdw[j * P + p] = sdb[j * P + p] = 0.0f;
    }
    int r0 = blockIdx.x * LN_BWD_ROWS_PER_BLOCK, r1 = min(N, r0 + LN_BWD_ROWS_PER_BLOCK);
    for (int row = r0 + warp; row < r1; row += nwarps) {
        const floatX* x = inp + (size_t)row * C;
        const floatX* dy = dout + (size_t)row * C;
        floatX* dx = dinp + (size_t)row * C;
        Pack8 xp[K], dyp[K], dxp[K];
        for (int i = 0; i < K; i++) { /* the row's only reads */
            int p = lane + 32 * i;
            if (p < P) {
                xp[i] = row_pack_load(x, p, C, vec);
                dyp[i] = row_pack_load(dy, p, C, vec);
                dxp[i] = row_pack_load(dx, p, C, vec);
            }
        }
        float m = mean[row], s = rstd[row];
        /* a = sum dn, b = sum dn * n; channels past C have dy = w = 0: dn = 0 */
        float a = 0.0f, b = 0.0f;
        for (int i = 0; i < K; i++) {
            int p = lane + 32 * i;
            if (p >= P) continue;
            float xf[8], dyf[8], wf[8];
            pack8_to_float(xf, xp[i]);
            pack8_to_float(dyf, dyp[i]);
            pack8_to_float(wf, w[i]);
            for (int j = 0; j < 8; j++) {
                float n = (xf[j] - m) * s, dn = dyf[j] * wf[j];
                a += dn;
                b += dn * n;
                sdw[j * P + p] += dyf[j] * n;
                sdb[j * P + p] += dyf[j];
            }
        }
        float dn_mean = warp_sum(a) / C, dn_n_mean = warp_sum(b) / C;
        for (int i = 0; i < K; i++) {
            int p = lane + 32 * i;
            if (p >= P) continue;
            float xf[8], dyf[8], wf[8], dxf[8];
            pack8_to_float(xf, xp[i]);
            pack8_to_float(dyf, dyp[i]);
            pack8_to_float(wf, w[i]);
            pack8_to_float(dxf, dxp[i]);
            for (int j = 0; j < 8; j++) {
                float n = (xf[j] - m) * s, dn = dyf[j] * wf[j];
                dxf[j] += s * (dn - dn_mean - n * dn_n_mean);
            }
            row_pack_store(dx, p, C, vec, float_to_pack8(dxf));
        }
    }
    __syncthreads(); /* every warp's sums are final */
    /* the block's sums, warps added in order; thread t takes slots t, t + blockDim.x, ... */
    for (int k = threadIdx.x; k < 8 * P; k += blockDim.x) {
        int j = k / P, p = k % P, c = 8 * p + j;
        if (c >= C) continue;
        float tw = 0.0f, tb = 0.0f;
        for (int wi = 0; wi < nwarps; wi++) {
            tw += ln_bwd_smem[(size_t)wi * 16 * P + k];
            tb += ln_bwd_smem[(size_t)wi * 16 * P + 8 * P + k];
        }
        part_dw[(size_t)blockIdx.x * C + c] = tw;
        part_db[(size_t)blockIdx.x * C + c] = tb;
    }
}

/* dst0(OC) += sum over rows of part0(rows, OC) and (when gridDim.y == 2)
 * dst1 += the same of part1, rows in a fixed order: a (32, 32) block takes
 * 32 columns, thread (x, y) sums rows y, y + 32, ..., then row y = 0 adds
 * the 32 sums in order. Each thread's loads are independent (no store in
 * the loop), so they overlap, where a thread per column summing all rows
 * one after another waits a round trip per row. Not yet run on a GPU. */
__global__ void column_sums_finish_kernel(float* dst0, float* dst1, const float* part0, const float* part1,
                                          int rows, int OC) {
    __shared__ float acc[32][33]; /* (y, x), padded against bank conflicts */
    float* dst = blockIdx.y ? dst1 : dst0;
    const float* part = blockIdx.y ? part1 : part0;
    int c = blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f;
    if (c < OC)
        for (int r = threadIdx.y; r < rows; r += 32) a += part[(size_t)r * OC + c];
    acc[threadIdx.y][threadIdx.x] = a;
    __syncthreads(); /* all 32 x 32 sums are in */
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) t += acc[y][threadIdx.x];
        dst[c] += t;
    }
}

static void column_sums_finish_gpu(float* dst0, float* dst1, const float* part0, const float* part1, int rows,
                                   int OC, cudaStream_t s) {
    dim3 grid(ceil_div(OC, 32), dst1 ? 2 : 1), block(32, 32);
    column_sums_finish_kernel<<<grid, block, 0, s>>>(dst0, dst1, part0, part1, rows, OC);
    KERNEL_CHECK();
}

/* ---- the unfused LayerNorm backward: rows wider than 256 LN_MAX_PACKS ---- */
/* (and the kernel lab's "old production" variant: until 2026-11-30 the only
 * one; 400 us per call for 16384 x 768 on an H200, see above.)
 * dx += rstd * (dn - mean(dn) - n * mean(dn * n)), dn = dy * w, one warp
 * per row; dinp (the residual stream's gradient) is accumulated. The
 * parameter gradients are column sums, done by column_sums_* below. */
__global__ void layernorm_backward_dx_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                             const floatX* weight, const float* mean, const float* rstd,
                                             int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* dy = dout + (size_t)row * C;
    const floatX* x = inp + (size_t)row * C;
    floatX* dx = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        float dn = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
        a += dn;
        b += dn * n;
    }
    float dn_mean = warp_sum(a) / C, dn_n_mean = warp_sum(b) / C;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        float dn = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
        dx[c] = __float2bfloat16(__bfloat162float(dx[c]) + s * (dn - dn_mean - n * dn_n_mean));
    }
}

/* ---- column sums: bias gradients and the unfused LN parameter gradients - */
/* Deterministic two-pass reduction over the N rows of a (N, OC) matrix:
 * pass 1, a grid of (column groups of 64) x (row splits) writes partial sums
 * (splits, OC) in fp32, each thread summing its rows in order and the block
 * combining its 8 row-lanes in order; pass 2 (column_sums_finish_kernel)
 * adds the splits in a fixed order into the fp32 gradient. With LN, the
 * sums are of dy * xhat (into part0, for the weight) and dy (part1, the
 * bias); without, of dy only (part0). */
#define COLSUM_COLS 64
#define COLSUM_ROWS_PER_SPLIT 256

template <bool LN>
__global__ void column_sums_partial_kernel(float* part0, float* part1, const floatX* dout, const floatX* inp,
                                           const float* mean, const float* rstd, int N, int OC) {
    __shared__ float s0[8][COLSUM_COLS], s1[8][COLSUM_COLS];
    int tx = threadIdx.x, ty = threadIdx.y; /* (32, 8) */
    int r0 = blockIdx.y * COLSUM_ROWS_PER_SPLIT, r1 = min(N, r0 + COLSUM_ROWS_PER_SPLIT);
    for (int half = 0; half < 2; half++) {
        int cl = tx + 32 * half, c = blockIdx.x * COLSUM_COLS + cl;
        float a = 0.0f, b = 0.0f;
        if (c < OC) {
            for (int r = r0 + ty; r < r1; r += 8) {
                float dy = __bfloat162float(dout[(size_t)r * OC + c]);
                if (LN) {
                    float n = (__bfloat162float(inp[(size_t)r * OC + c]) - mean[r]) * rstd[r];
                    a += dy * n;
                    b += dy;
                } else {
                    a += dy;
                }
            }
        }
        s0[ty][cl] = a;
        s1[ty][cl] = b;
    }
    __syncthreads(); /* all 8 row-lanes' sums are in shared memory */
    if (ty == 0) {
        for (int half = 0; half < 2; half++) {
            int cl = tx + 32 * half, c = blockIdx.x * COLSUM_COLS + cl;
            if (c >= OC) continue;
            float a = 0.0f, b = 0.0f;
            for (int i = 0; i < 8; i++) {
                a += s0[i][cl];
                b += s1[i][cl];
            }
            part0[(size_t)blockIdx.y * OC + c] = a;
            if (LN) part1[(size_t)blockIdx.y * OC + c] = b;
        }
    }
}

/* The bias gradients' pass 1 with 16-byte loads (OC % 8 == 0, dout 16-byte
 * aligned): a (32, 8) block takes 256 columns, thread (x, y) a pack of 8
 * columns and every 8th row of the split from y, so one warp reads 512
 * contiguous bytes per row; the 8 row-lanes are added in order as above.
 * Not yet run on a GPU. */
#define COLSUM_VEC_COLS 256

__global__ void column_sums_partial_vec_kernel(float* __restrict__ part, const floatX* __restrict__ dout, int N,
                                               int OC) {
    __shared__ float sums[8][COLSUM_VEC_COLS]; /* [y][j * 32 + x]: column 8 x + j of the block, conflict-free */
    int tx = threadIdx.x, ty = threadIdx.y;    /* (32, 8) */
    int c0 = blockIdx.x * COLSUM_VEC_COLS + 8 * tx;
    int r0 = blockIdx.y * COLSUM_ROWS_PER_SPLIT, r1 = min(N, r0 + COLSUM_ROWS_PER_SPLIT);
    float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (c0 < OC)
        for (int r = r0 + ty; r < r1; r += 8) {
            float f[8];
            pack8_to_float(f, *(const Pack8*)(dout + (size_t)r * OC + c0));
            for (int j = 0; j < 8; j++) a[j] += f[j];
        }
    for (int j = 0; j < 8; j++) sums[ty][j * 32 + tx] = a[j];
    __syncthreads(); /* all 8 row-lanes' sums are in shared memory */
    int t = ty * 32 + tx, c = blockIdx.x * COLSUM_VEC_COLS + t; /* thread t finishes column t of the block */
    if (c >= OC) return;
    int k = (t % 8) * 32 + t / 8;
    float acc = 0.0f;
    for (int i = 0; i < 8; i++) acc += sums[i][k];
    part[(size_t)blockIdx.y * OC + c] = acc;
}

static int column_sums_splits(int N) { return ceil_div(N, COLSUM_ROWS_PER_SPLIT); }

/* The scalar bias gradients alone (before 2026-11-30 the only one; now the fallback). */
static void bias_backward_scalar_gpu(float* dbias, float* part, const floatX* dout, int N, int OC, cudaStream_t s) {
    int splits = column_sums_splits(N);
    dim3 grid(ceil_div(OC, COLSUM_COLS), splits), block(32, 8);
    column_sums_partial_kernel<false><<<grid, block, 0, s>>>(part, NULL, dout, NULL, NULL, NULL, N, OC);
    KERNEL_CHECK();
    column_sums_finish_gpu(dbias, NULL, part, NULL, splits, OC, s);
}

/* dbias(OC) += column sums of dout(N, OC). `part` holds splits * OC floats. */
static void bias_backward_gpu(float* dbias, float* part, const floatX* dout, int N, int OC, cudaStream_t s) {
    if (OC % 8 != 0 || !is_aligned16(dout)) {
        bias_backward_scalar_gpu(dbias, part, dout, N, OC, s);
        return;
    }
    int splits = column_sums_splits(N);
    dim3 grid(ceil_div(OC, COLSUM_VEC_COLS), splits), block(32, 8);
    column_sums_partial_vec_kernel<<<grid, block, 0, s>>>(part, dout, N, OC);
    KERNEL_CHECK();
    column_sums_finish_gpu(dbias, NULL, part, NULL, splits, OC, s);
}

/* The unfused LayerNorm backward (dx kernel, then the column sums): four
 * launches, x and dy read twice. `part` holds 2 * splits * C floats. */
static void layernorm_backward_unfused_gpu(floatX* dinp, float* dweight, float* dbias, float* part,
                                           const floatX* dout, const floatX* inp, const floatX* weight,
                                           const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
    layernorm_backward_dx_kernel<<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    KERNEL_CHECK();
    int splits = column_sums_splits(N);
    float* part1 = part + (size_t)splits * C;
    dim3 grid(ceil_div(C, COLSUM_COLS), splits), block(32, 8);
    column_sums_partial_kernel<true><<<grid, block, 0, s>>>(part, part1, dout, inp, mean, rstd, N, C);
    KERNEL_CHECK();
    column_sums_finish_gpu(dweight, dbias, part, part1, splits, C, s);
}

/* floats of `part` that layernorm_backward_gpu needs */
static size_t layernorm_backward_scratch_floats(int N, int C) {
    size_t fused = layernorm_backward_part_floats(N, C), unfused = 2 * (size_t)column_sums_splits(N) * C;
    return fused > unfused ? fused : unfused;
}

/* The whole LayerNorm backward: dinp += dx; dweight += sum dy * xhat;
 * dbias += sum dy. `part` holds layernorm_backward_scratch_floats(N, C). */
static void layernorm_backward_gpu(floatX* dinp, float* dweight, float* dbias, float* part, const floatX* dout,
                                   const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                                   int N, int C, cudaStream_t s) {
    int K = layernorm_packs(C);
    if (K > LN_MAX_PACKS) {
        layernorm_backward_unfused_gpu(dinp, dweight, dbias, part, dout, inp, weight, mean, rstd, N, C, s);
        return;
    }
    int vec = C % 8 == 0 && is_aligned16(dinp) && is_aligned16(dout) && is_aligned16(inp) && is_aligned16(weight);
    int blocks = layernorm_backward_blocks(N);
    float* part_dw = part;
    float* part_db = part + (size_t)blocks * C;
    size_t smem = layernorm_backward_smem(C); /* 24 KB at C = 768, 51 KB at C = 1600 */
#define LN_BWD(KK)                                                                                              \
    do {                                                                                                        \
        if (smem > 48 * 1024)                                                                                   \
            CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<KK>,                                      \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));           \
        layernorm_backward_kernel<KK><<<blocks, 32 * LN_BWD_WARPS, smem, s>>>(dinp, part_dw, part_db, dout, inp, \
                                                                              weight, mean, rstd, N, C, vec);   \
    } while (0)
    LN_DISPATCH_K(K, LN_BWD);
#undef LN_BWD
    KERNEL_CHECK();
    column_sums_finish_gpu(dweight, dbias, part_dw, part_db, blocks, C, s);
}

/* ---- attention: flash-style (variant 2), forward and backward ------------ */
/* STATUS: not yet run on a GPU. Validated on the CPU (dev/cuda/cpu) against
 * train_gpt.c's attention_forward/attention_backward (test_gpt.cu,
 * dev/cuda/attention.cu); speed unmeasured. The materialised variant 1 it
 * replaced lives on in dev/cuda/attention.cu.
 *
 * Causal self-attention per (b, h), hs = C / NH, scale = 1/sqrt(hs):
 *   S = Q K^T * scale,  P = softmax_rows(S) over keys j <= i,  O = P V.
 * Nothing of size T x T is ever stored (Dao et al., FlashAttention, 2022,
 * Alg. 1; FlashAttention-2, 2023, Alg. 1-2): a block holds a tile of 64
 * queries and walks the key tiles 0..its own (tiles above the diagonal are
 * never visited), keeping per query row the running maximum m and the
 * running sum l of exp(S - m) in fp32 (the online softmax, Milakov &
 * Gimelshein 2018): on a new key tile with row maximum m~,
 *   m' = max(m, m~),  alpha = exp(m - m'),  l' = alpha l + sum_j exp(S_j - m'),
 *   O' = alpha O + exp(S - m') V,
 * and at the end O / l. The log-sum-exp lse = m + log(l) (B, NH, T, fp32) is
 * all that is kept for backward, which recomputes P = exp(S - lse) and with
 * D_i = rowsum(dO_i * O_i) (the softmax backward's rowsum(P * dP), since
 * O = P V):
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) * scale,  dQ = dS K,  dK = dS^T Q.
 * Deterministic: one block per key tile sums dK and dV over the query tiles
 * in order, one block per query tile sums dQ over the key tiles in order (no
 * atomics); P and dS are recomputed twice, the price of that.
 *
 * q, k, v are read straight from qkv (B, T, 3, NH, hs), the output written
 * straight into (B, T, NH, hs) = (B, T, C), the gradients into dqkv (B, T, 3C):
 * no permutes.
 *
 * Tiles: 64 queries x 64 keys, 4 warps; warp w owns the 16-row strip
 * [16w, 16w + 16) of every 64-row tile it produces. Head sizes up to 128;
 * a tile's hs columns are zero-padded to hsp = hs rounded up to 16 in shared
 * memory, rows past T are zero too and masked out. Tile products go through
 * the tensor cores (WMMA, bf16 16x16x16 with fp32 accumulation), a warp's
 * 16-row output strip per call (attn_mma_strip), accumulators in shared
 * memory between calls: the softmax work then reads and writes tiles in
 * shared memory by position (a WMMA fragment's element layout is
 * unspecified; the CPU execution layer scrambles it on purpose). Built with
 * -DATTN_MMA_SCALAR, attn_mma_strip computes the same strip with ordinary
 * fp32 FMAs instead (no tensor cores): the algorithm checked apart from the
 * tensor cores (make test runs the kernel lab's attention both ways on the
 * CPU).
 *
 * Shared memory per block (bytes, hsp = 128): forward 112,640, dK/dV 190,464,
 * dQ 147,456; hsp = 64 (GPT-2): 71,680, 124,928 and 98,304. Over the 48 KB
 * default, so each kernel is granted what it needs by cudaFuncSetAttribute
 * (H100/H200 allow 227 KB a block; an A100's 163 KB covers every kernel up
 * to hs = 96, not the dK/dV kernel beyond). The accumulators in shared memory
 * cost occupancy (at hs = 64 on an H200: 3, 1 and 2 blocks per SM); keeping
 * dK, dV and dQ in WMMA fragments across the loop (they need no rescaling)
 * is the next step once a GPU has timed this. */
#define ATTN_TILE 64      /* queries per block, keys per step */
#define ATTN_THREADS 128  /* 4 warps, one 16-row strip each */
#define ATTN_MAX_HS 128
#ifndef ATTN_MMA_SCALAR
#include <mma.h> /* nvcuda::wmma: fragments, load/store_matrix_sync, mma_sync */
#endif

/* Leading dimensions in shared memory, in elements: a bf16 tile of hsp
 * columns (+8: rows stay 16-byte aligned, which WMMA's ldm needs, and do not
 * all start in the same bank), an fp32 score tile (64 + 4), a bf16
 * probability tile (64 + 8), an fp32 accumulator (hsp + 4). Every 16-row
 * block then starts 32-byte aligned, as load/store_matrix_sync require. */
__host__ __device__ inline int attn_ld_h(int hsp) { return hsp + 8; }
#define ATTN_LD_S (ATTN_TILE + 4)
#define ATTN_LD_P (ATTN_TILE + 8)
__host__ __device__ inline int attn_ld_o(int hsp) { return hsp + 4; }
__host__ __device__ inline size_t attn_bytes_h(int hsp) { return (size_t)ATTN_TILE * attn_ld_h(hsp) * 2; }
#define ATTN_BYTES_S ((size_t)ATTN_TILE * ATTN_LD_S * 4)
#define ATTN_BYTES_P ((size_t)ATTN_TILE * ATTN_LD_P * 2)
__host__ __device__ inline size_t attn_bytes_o(int hsp) { return (size_t)ATTN_TILE * attn_ld_o(hsp) * 4; }
/* the three kernels' shared memory, laid out in the order listed */
static size_t attn_smem_forward(int hsp) { /* Q, K, V; S; P; O */
    return 3 * attn_bytes_h(hsp) + ATTN_BYTES_S + ATTN_BYTES_P + attn_bytes_o(hsp);
}
static size_t attn_smem_dkv(int hsp) { /* K, V, Q, dO; S, dP; P, dS; dK, dV */
    return 4 * attn_bytes_h(hsp) + 2 * ATTN_BYTES_S + 2 * ATTN_BYTES_P + 2 * attn_bytes_o(hsp);
}
static size_t attn_smem_dq(int hsp) { /* Q, dO, K, V; S, dP; dS; dQ */
    return 4 * attn_bytes_h(hsp) + 2 * ATTN_BYTES_S + ATTN_BYTES_P + attn_bytes_o(hsp);
}

#ifdef ATTN_MMA_SCALAR
/* attn_mma_strip's one 16 x 16 block without tensor cores */
template <int A_COL, int B_COL>
__device__ void attn_mma16_scalar(float* c, int ldc, const floatX* a, int lda, const floatX* b, int ldb, int K,
                                  int accumulate) {
    int lane = threadIdx.x % 32, m = lane / 2, n0 = (lane % 2) * 8;
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = accumulate ? c[m * ldc + n0 + j] : 0.0f;
    for (int k0 = 0; k0 < K; k0 += 8) {
        float av[8];
        if (!A_COL) {
            Pack8 p = *(const Pack8*)(a + m * lda + k0);
            for (int i = 0; i < 8; i++) av[i] = __bfloat162float(p.v[i]);
        } else {
            for (int i = 0; i < 8; i++) av[i] = __bfloat162float(a[(k0 + i) * lda + m]);
        }
        if (!B_COL) {
            for (int i = 0; i < 8; i++) {
                Pack8 p = *(const Pack8*)(b + (k0 + i) * ldb + n0);
                for (int j = 0; j < 8; j++) acc[j] += av[i] * __bfloat162float(p.v[j]);
            }
        } else {
            for (int j = 0; j < 8; j++) {
                Pack8 p = *(const Pack8*)(b + (n0 + j) * ldb + k0);
                for (int i = 0; i < 8; i++) acc[j] += av[i] * __bfloat162float(p.v[i]);
            }
        }
    }
    for (int j = 0; j < 8; j++) c[m * ldc + n0 + j] = acc[j];
    __syncwarp();
}
#endif

/* One warp: the fp32 strip c (16 x 16 nb, ldc) = [c +] a (16 x K) b (K x 16 nb),
 * K a multiple of 16, nb <= 8, bf16 operands in shared memory. A_COL: a is
 * stored column-major (a(m, k) at a[k * lda + m]), else row-major
 * (a[m * lda + k]); b's 16-column block j starts at b + j * bstep, within it
 * B_COL: b(k, n) at [n * ldb + k], else [k * ldb + n]. Every lane of the warp
 * calls it with the same arguments; when it returns the warp's stores to c
 * are done. Each k step loads a's fragment once for all nb blocks; the
 * accumulators live in registers for the call, in shared memory between. */
#define ATTN_MAX_NB 8 /* hsp / 16 for hsp = 128 */
template <int A_COL, int B_COL>
__device__ void attn_mma_strip(float* c, int ldc, const floatX* a, int lda, const floatX* b, int ldb, int bstep,
                               int nb, int K, int accumulate) {
#ifndef ATTN_MMA_SCALAR
    using namespace nvcuda;
    typedef typename std::conditional<A_COL != 0, wmma::col_major, wmma::row_major>::type LayoutA;
    typedef typename std::conditional<B_COL != 0, wmma::col_major, wmma::row_major>::type LayoutB;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc[ATTN_MAX_NB];
    for (int j = 0; j < ATTN_MAX_NB; j++) { /* (unrolled by nvcc: the fragments stay in registers) */
        if (j >= nb) break;
        if (accumulate) wmma::load_matrix_sync(fc[j], c + j * 16, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(fc[j], 0.0f);
    }
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(fa, A_COL ? a + (size_t)k * lda : a + k, lda);
        for (int j = 0; j < ATTN_MAX_NB; j++) {
            if (j >= nb) break;
            const floatX* bj = b + (size_t)j * bstep;
            wmma::load_matrix_sync(fb, B_COL ? bj + k : bj + (size_t)k * ldb, ldb);
            wmma::mma_sync(fc[j], fa, fb, fc[j]);
        }
    }
    for (int j = 0; j < ATTN_MAX_NB; j++) {
        if (j >= nb) break;
        wmma::store_matrix_sync(c + j * 16, fc[j], ldc, wmma::mem_row_major);
    }
#else
    /* block by block: lane 2m + h computes row m, columns 8h .. 8h + 7, each
     * sum in k order; operands read 8 at a time (16 bytes) along their
     * contiguous dimension (on the CPU execution every access is checked:
     * fewer, wider ones are what makes this path quick enough for make test) */
    for (int jb = 0; jb < nb; jb++)
        attn_mma16_scalar<A_COL, B_COL>(c + jb * 16, ldc, a, lda, b + (size_t)jb * bstep, ldb, K, accumulate);
#endif
}

/* A 64-row tile of one head into shared memory: rows t0 .. t0 + 63 of src,
 * where row t starts at src + t * stride (src points at the head's column
 * 0), hs columns, zero-padded to hsp columns and past T. 16-byte loads when
 * hs % 8 == 0 (rows and heads then start 16-byte aligned). */
__device__ void attn_load_tile(floatX* dst, const floatX* src, size_t stride, int t0, int T, int hs, int hsp) {
    int ld = attn_ld_h(hsp), chunks = hsp / 8;
    for (int idx = threadIdx.x; idx < ATTN_TILE * chunks; idx += blockDim.x) {
        int r = idx / chunks, d0 = (idx % chunks) * 8, t = t0 + r;
        Pack8 p;
        if (t < T && hs % 8 == 0 && d0 < hs) {
            p = *(const Pack8*)(src + (size_t)t * stride + d0);
        } else {
            for (int i = 0; i < 8; i++)
                p.v[i] = t < T && d0 + i < hs ? src[(size_t)t * stride + d0 + i] : __float2bfloat16(0.0f);
        }
        *(Pack8*)(dst + r * ld + d0) = p;
    }
}

/* Rows of an fp32 accumulator tile (64 x hsp, shared memory) out to bf16,
 * times `mul`: thread pair (2r, 2r + 1) writes row r's two halves, for
 * t0 + r < T and the first hs columns. Called by each warp for its own strip
 * (thread pairs of warp w hold rows 16w .. 16w + 15). */
__device__ void attn_store_rows(floatX* dst, size_t stride, const float* acc, int t0, int T, int hs, int hsp,
                                float mul) {
    int r = threadIdx.x / 2, half = threadIdx.x % 2, t = t0 + r, ldo = attn_ld_o(hsp);
    if (t >= T) return;
    int per = hsp / 2; /* a multiple of 8 */
    for (int d0 = half * per; d0 < (half + 1) * per && d0 < hs; d0 += 8) {
        if (hs % 8 == 0) {
            Pack8 p;
            for (int i = 0; i < 8; i++) p.v[i] = __float2bfloat16(acc[r * ldo + d0 + i] * mul);
            *(Pack8*)(dst + (size_t)t * stride + d0) = p;
        } else {
            for (int i = 0; i < 8 && d0 + i < hs; i++)
                dst[(size_t)t * stride + d0 + i] = __float2bfloat16(acc[r * ldo + d0 + i] * mul);
        }
    }
}

/* Work a warp may skip, all of it masked: a strip (16 query rows from q0 +
 * 16 w) is live when its first row is < T, and of a key tile from k0 it needs
 * the first attn_key_cols columns (a multiple of 16): keys < T and, on the
 * diagonal, keys <= the strip's last query. For k0 <= q0 and a live strip
 * that is at least 16. */
__device__ int attn_strip_live(int q0, int w, int T) { return q0 + 16 * w < T; }
__device__ int attn_key_cols(int q0, int k0, int w, int T) {
    int n = min(min(ATTN_TILE, T - k0), q0 + 16 * w + 16 - k0);
    return (n + 15) / 16 * 16;
}

/* Forward. Grid (query tiles, B * NH), the last (longest) query tiles first.
 * out (B, T, C), lse (B, NH, T), qkv (B, T, 3C). */
__global__ void __launch_bounds__(ATTN_THREADS) attention_forward_kernel(floatX* out, float* lse, const floatX* qkv,
                                                                         int T, int NH, int hs, int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    floatX* Qs = (floatX*)attn_smem;                         /* (64, hsp) */
    floatX* Ks = (floatX*)(attn_smem + attn_bytes_h(hsp));   /* (64, hsp) */
    floatX* Vs = (floatX*)(attn_smem + 2 * attn_bytes_h(hsp));
    float* Ss = (float*)(attn_smem + 3 * attn_bytes_h(hsp)); /* (64, 64) scores */
    floatX* Ps = (floatX*)((unsigned char*)Ss + ATTN_BYTES_S); /* (64, 64) probabilities, bf16 */
    float* Os = (float*)((unsigned char*)Ps + ATTN_BYTES_P);   /* (64, hsp) output accumulator */
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs; /* row t at q + t * 3C */
    attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
    /* thread pair (2r, 2r + 1), in warp r / 16: query row r of the tile, key
     * columns [32 half, 32 half + 32) of S and accumulator columns
     * [hsp/2 half, hsp/2 (half + 1)) */
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    int live = attn_strip_live(q0, warp, T); /* the same for the whole warp */
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) Os[r * ldo + d] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* both threads of the pair hold the same */
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATTN_TILE;
        __syncthreads(); /* every warp is done with the previous K and V tiles */
        attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
        attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
        __syncthreads(); /* K, V (and, the first time, Q) are in shared memory */
        if (!live) continue;
        int ncol = attn_key_cols(q0, k0, warp, T);
        /* S strip = Q strip K^T: its first ncol columns, 16 at a time */
        attn_mma_strip<0, 1>(Ss + warp * 16 * ATTN_LD_S, ATTN_LD_S, Qs + warp * 16 * ldh, ldh, Ks, ldh, 16 * ldh,
                             ncol / 16, hsp, 0);
        __syncwarp(); /* the warp's S strip is stored: its thread pairs read their rows */
        /* online softmax of row r; key j = k0 + c is visible when j <= i and
         * j < T: always j = k0 (k0 <= q0 <= i and k0 < T), so m' is finite */
        const float* srow = Ss + r * ATTN_LD_S;
        int c0 = half * 32, c1 = min(c0 + 32, ncol);
        float mt = -INFINITY;
        for (int c = c0; c < c1; c++)
            if (k0 + c <= i && k0 + c < T) mt = fmaxf(mt, srow[c] * scale);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        float mnew = fmaxf(m, mt), alpha = expf(m - mnew); /* exp(-inf) = 0 on the first tile */
        float sum = 0.0f;
        for (int c = c0; c < c1; c++) {
            float p = k0 + c <= i && k0 + c < T ? expf(srow[c] * scale - mnew) : 0.0f;
            Ps[r * ATTN_LD_P + c] = __float2bfloat16(p); /* (V is multiplied by P in bf16) */
            sum += p;                                    /* (l, and so lse, sum it in fp32) */
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = mnew;
        for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) Os[r * ldo + d] *= alpha;
        __syncwarp(); /* P strip written, O strip rescaled */
        /* O strip += P strip V, over the ncol keys */
        attn_mma_strip<0, 0>(Os + warp * 16 * ldo, ldo, Ps + warp * 16 * ATTN_LD_P, ATTN_LD_P, Vs, ldh, 16, hsp / 16,
                             ncol, 1);
    }
    __syncwarp(); /* the warp's last O strip is stored */
    /* (rows >= T, which a strip that is not live holds only, are not written) */
    attn_store_rows(out + (size_t)b * T * C + (size_t)h * hs, C, Os, q0, T, hs, hsp, 1.0f / l);
    if (half == 0 && i < T) lse[(size_t)bh * T + i] = m + logf(l);
}

/* D (B, NH, T) = rowsum(dO * O) in fp32, one warp per (b, t, h). dout and
 * out (B, T, C). */
__global__ void attention_backward_d_kernel(float* D, const floatX* dout, const floatX* out, int B, int T, int NH,
                                            int hs) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (b, t, h) */
    if (row >= (long long)B * T * NH) return;
    int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / ((long long)NH * T));
    const floatX* dy = dout + row * hs; /* (b, t, h) is row (b T + t) NH + h of hs values */
    const floatX* y = out + row * hs;
    float s = 0.0f;
    for (int d = threadIdx.x % 32; d < hs; d += 32) s += __bfloat162float(dy[d]) * __bfloat162float(y[d]);
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) D[((size_t)b * NH + h) * T + t] = s;
}

/* S and dP strips of the calling warp (query rows 16 w ..), their first ncol
 * key columns: S = Q K^T, dP = dO V^T (unscaled). */
__device__ void attn_s_dp_strips(float* Ss, float* dPs, const floatX* Qs, const floatX* dOs, const floatX* Ks,
                                 const floatX* Vs, int ldh, int hsp, int ncol) {
    int w = threadIdx.x / 32;
    attn_mma_strip<0, 1>(Ss + w * 16 * ATTN_LD_S, ATTN_LD_S, Qs + w * 16 * ldh, ldh, Ks, ldh, 16 * ldh, ncol / 16,
                         hsp, 0);
    attn_mma_strip<0, 1>(dPs + w * 16 * ATTN_LD_S, ATTN_LD_S, dOs + w * 16 * ldh, ldh, Vs, ldh, 16 * ldh, ncol / 16,
                         hsp, 0);
}

/* P and dS of the calling thread pair's row r = tid / 2 (query i = q0 + r),
 * its 32 key columns (j = k0 + c), all 64 columns written (0 past ncol):
 *   P = exp(S scale - lse_i) where visible (j <= i, j < T, i < T), else 0;
 *   dS = P (dP - D_i) scale;  both rounded to bf16 (Ps may be NULL). */
__device__ void attn_p_ds_row(floatX* Ps, floatX* dSs, const float* Ss, const float* dPs, int q0, int k0, int T,
                              int ncol, float scale, float lse_i, float D_i) {
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    for (int c = half * 32; c < half * 32 + 32; c++) {
        int j = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (c < ncol && j <= i && j < T && i < T) {
            p = expf(Ss[r * ATTN_LD_S + c] * scale - lse_i);
            ds = p * (dPs[r * ATTN_LD_S + c] - D_i) * scale;
        }
        if (Ps) Ps[r * ATTN_LD_P + c] = __float2bfloat16(p);
        dSs[r * ATTN_LD_P + c] = __float2bfloat16(ds);
    }
}

/* dK and dV: one block per (key tile, b, h), the query tiles from the
 * diagonal down, in order. Grid (key tiles, B * NH): key tile 0 has the
 * most query tiles and starts first. dqkv (B, T, 3C): writes its dK and dV
 * slices. */
__global__ void __launch_bounds__(ATTN_THREADS) attention_backward_dkv_kernel(floatX* dqkv, const floatX* dout,
                                                                              const floatX* qkv, const float* lse,
                                                                              const float* D, int T, int NH, int hs,
                                                                              int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    size_t bh_ = attn_bytes_h(hsp);
    floatX* Ks = (floatX*)attn_smem;
    floatX* Vs = (floatX*)(attn_smem + bh_);
    floatX* Qs = (floatX*)(attn_smem + 2 * bh_);
    floatX* dOs = (floatX*)(attn_smem + 3 * bh_);
    float* Ss = (float*)(attn_smem + 4 * bh_);                  /* (64 queries, 64 keys) */
    float* dPs = (float*)((unsigned char*)Ss + ATTN_BYTES_S);   /* (64, 64) dP = dO V^T */
    floatX* Ps = (floatX*)((unsigned char*)dPs + ATTN_BYTES_S); /* (64, 64) bf16 */
    floatX* dSs = (floatX*)((unsigned char*)Ps + ATTN_BYTES_P); /* (64, 64) bf16 */
    float* dKs = (float*)((unsigned char*)dSs + ATTN_BYTES_P);  /* (64 keys, hsp) */
    float* dVs = (float*)((unsigned char*)dKs + attn_bytes_o(hsp));
    int kt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, k0 = kt * ATTN_TILE, warp = threadIdx.x / 32, nqt = (T + ATTN_TILE - 1) / ATTN_TILE;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const floatX* dy = dout + (size_t)b * T * C + (size_t)h * hs;
    attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
    attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
    int r = threadIdx.x / 2, half = threadIdx.x % 2;
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) dKs[r * ldo + d] = dVs[r * ldo + d] = 0.0f;
    int keys_live = k0 + 16 * warp < T; /* this warp's key strip (dK and dV rows) */
    for (int qt = kt; qt < nqt; qt++) {
        int q0 = qt * ATTN_TILE, i = q0 + r;
        __syncthreads(); /* every warp is done with the previous Q, dO, P and dS */
        attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
        attn_load_tile(dOs, dy, C, q0, T, hs, hsp);
        __syncthreads(); /* Q and dO (and, the first time, K and V) are in shared memory */
        /* P and dS of this warp's query strip (rows 16 warp ..) */
        if (attn_strip_live(q0, warp, T)) {
            int ncol = attn_key_cols(q0, k0, warp, T);
            attn_s_dp_strips(Ss, dPs, Qs, dOs, Ks, Vs, ldh, hsp, ncol);
            __syncwarp(); /* the warp's S and dP strips are stored */
            float lse_i = i < T ? lse[(size_t)bh * T + i] : 0.0f, D_i = i < T ? D[(size_t)bh * T + i] : 0.0f;
            attn_p_ds_row(Ps, dSs, Ss, dPs, q0, k0, T, ncol, scale, lse_i, D_i);
        }
        __syncthreads(); /* all of P and dS: the products below read them by columns (keys) */
        /* dV strip (keys 16 warp ..) += P^T dO, dK strip += dS^T Q, over the
         * query rows [qs, qe) that can see these keys: rows of live strips,
         * and on the diagonal none before the strip's first key */
        int qs = qt == kt ? 16 * warp : 0, qe = min(ATTN_TILE, (T - q0 + 15) / 16 * 16);
        if (keys_live && qe > qs) {
            attn_mma_strip<1, 0>(dVs + warp * 16 * ldo, ldo, Ps + qs * ATTN_LD_P + warp * 16, ATTN_LD_P,
                                 dOs + qs * ldh, ldh, 16, hsp / 16, qe - qs, 1);
            attn_mma_strip<1, 0>(dKs + warp * 16 * ldo, ldo, dSs + qs * ATTN_LD_P + warp * 16, ATTN_LD_P,
                                 Qs + qs * ldh, ldh, 16, hsp / 16, qe - qs, 1);
        }
    }
    __syncwarp(); /* the warp's dK and dV strips are final */
    floatX* dq = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    attn_store_rows(dq + C, 3 * C, dKs, k0, T, hs, hsp, 1.0f);
    attn_store_rows(dq + 2 * C, 3 * C, dVs, k0, T, hs, hsp, 1.0f);
}

/* dQ: one block per (query tile, b, h), the key tiles up to the diagonal, in
 * order. Grid (query tiles, B * NH), the last (longest) first. Writes the dQ
 * slice of dqkv. */
__global__ void __launch_bounds__(ATTN_THREADS) attention_backward_dq_kernel(floatX* dqkv, const floatX* dout,
                                                                             const floatX* qkv, const float* lse,
                                                                             const float* D, int T, int NH, int hs,
                                                                             int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    size_t bh_ = attn_bytes_h(hsp);
    floatX* Qs = (floatX*)attn_smem;
    floatX* dOs = (floatX*)(attn_smem + bh_);
    floatX* Ks = (floatX*)(attn_smem + 2 * bh_);
    floatX* Vs = (floatX*)(attn_smem + 3 * bh_);
    float* Ss = (float*)(attn_smem + 4 * bh_);
    float* dPs = (float*)((unsigned char*)Ss + ATTN_BYTES_S);
    floatX* dSs = (floatX*)((unsigned char*)dPs + ATTN_BYTES_S);
    float* dQs = (float*)((unsigned char*)dSs + ATTN_BYTES_P); /* (64 queries, hsp) */
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
    attn_load_tile(dOs, dout + (size_t)b * T * C + (size_t)h * hs, C, q0, T, hs, hsp);
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    int live = attn_strip_live(q0, warp, T);
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) dQs[r * ldo + d] = 0.0f;
    float lse_i = i < T ? lse[(size_t)bh * T + i] : 0.0f, D_i = i < T ? D[(size_t)bh * T + i] : 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATTN_TILE;
        __syncthreads(); /* every warp is done with the previous K and V */
        attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
        attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
        __syncthreads(); /* K and V (and, the first time, Q and dO) are in shared memory */
        if (!live) continue;
        int ncol = attn_key_cols(q0, k0, warp, T);
        attn_s_dp_strips(Ss, dPs, Qs, dOs, Ks, Vs, ldh, hsp, ncol);
        __syncwarp(); /* the warp's S and dP strips are stored */
        attn_p_ds_row(NULL, dSs, Ss, dPs, q0, k0, T, ncol, scale, lse_i, D_i);
        __syncwarp(); /* the warp's dS strip is written: only this warp reads it */
        /* dQ strip += dS strip K, over the ncol keys */
        attn_mma_strip<0, 0>(dQs + warp * 16 * ldo, ldo, dSs + warp * 16 * ATTN_LD_P, ATTN_LD_P, Ks, ldh, 16,
                             hsp / 16, ncol, 1);
    }
    __syncwarp(); /* the warp's dQ strip is final */
    attn_store_rows(dqkv + (size_t)b * T * 3 * C + (size_t)h * hs, 3 * C, dQs, q0, T, hs, hsp, 1.0f);
}

/* Dynamic shared memory over the 48 KB default must be granted per kernel
 * (cudaFuncSetAttribute); `granted` remembers the most granted so far. */
static void attn_smem_grant(const void* kernel, size_t bytes, size_t* granted) {
    if (bytes <= 48 * 1024 || bytes <= *granted) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *granted = bytes;
}

static int attn_hsp(int hs) {
    ALWAYS(hs >= 1 && hs <= ATTN_MAX_HS);
    return (hs + 15) / 16 * 16;
}

/* out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C). */
static void attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int hs,
                                  cudaStream_t s) {
    static size_t granted;
    int hsp = attn_hsp(hs);
    attn_smem_grant((const void*)attention_forward_kernel, attn_smem_forward(hsp), &granted);
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_forward_kernel<<<grid, ATTN_THREADS, attn_smem_forward(hsp), s>>>(out, lse, qkv, T, NH, hs, hsp);
    KERNEL_CHECK();
}

/* dqkv (B, T, 3C, written) from dout (B, T, C), the forward's qkv, out and
 * lse; D is (B, NH, T) fp32 scratch. */
static void attention_backward_gpu(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* lse, int B, int T, int NH, int hs, cudaStream_t s) {
    static size_t granted_dkv, granted_dq;
    int hsp = attn_hsp(hs);
    attn_smem_grant((const void*)attention_backward_dkv_kernel, attn_smem_dkv(hsp), &granted_dkv);
    attn_smem_grant((const void*)attention_backward_dq_kernel, attn_smem_dq(hsp), &granted_dq);
    long long rows = (long long)B * T * NH;
    attention_backward_d_kernel<<<ceil_div(rows, 8), 256, 0, s>>>(D, dout, out, B, T, NH, hs);
    KERNEL_CHECK();
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_backward_dkv_kernel<<<grid, ATTN_THREADS, attn_smem_dkv(hsp), s>>>(dqkv, dout, qkv, lse, D, T, NH, hs,
                                                                                  hsp);
    KERNEL_CHECK();
    attention_backward_dq_kernel<<<grid, ATTN_THREADS, attn_smem_dq(hsp), s>>>(dqkv, dout, qkv, lse, D, T, NH, hs,
                                                                                hsp);
    KERNEL_CHECK();
}

/* ---- GELU (tanh form, as train_gpt.c's gelu_forward) -------------------- */
/* train_gpt.c's sigmoid form: 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). */
__device__ __forceinline__ float gelu_of(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}
/* d * gelu'(x) */
__device__ __forceinline__ float gelu_grad_of(float x, float d) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return d * (s + x * s * (1.0f - s) * 2.0f * du);
}

/* The production kernels: 8 bf16 per thread, one 16-byte load per input
 * and one 16-byte store (the pointers 16-byte aligned: gelu_forward_gpu
 * checks), the last N % 8 one at a time. Memory-bound: forward moves 4N
 * bytes, backward 6N. (dev/cuda/gelu.cu times them against the one-element
 * kernels below, which are the fallback for unaligned pointers; the same
 * bits.) STATUS: validated on the CPU execution layer; not yet run on a GPU. */
__global__ void gelu_forward_vec8_kernel(floatX* out, const floatX* inp, long long N) {
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N) return;
    if (i0 + 8 <= N) {
        Pack8 x = *(const Pack8*)(inp + i0), y;
        for (int k = 0; k < 8; k++) y.v[k] = __float2bfloat16(gelu_of(__bfloat162float(x.v[k])));
        *(Pack8*)(out + i0) = y;
    } else {
        for (long long i = i0; i < N; i++) out[i] = __float2bfloat16(gelu_of(__bfloat162float(inp[i])));
    }
}

/* dinp = dout * gelu'(inp); may be in place (dinp == dout: each thread
 * reads its 8 elements before it writes them). */
__global__ void gelu_backward_vec8_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long long N) {
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N) return;
    if (i0 + 8 <= N) {
        Pack8 x = *(const Pack8*)(inp + i0), d = *(const Pack8*)(dout + i0), r;
        for (int k = 0; k < 8; k++) r.v[k] = __float2bfloat16(gelu_grad_of(__bfloat162float(x.v[k]), __bfloat162float(d.v[k])));
        *(Pack8*)(dinp + i0) = r;
    } else {
        for (long long i = i0; i < N; i++)
            dinp[i] = __float2bfloat16(gelu_grad_of(__bfloat162float(inp[i]), __bfloat162float(dout[i])));
    }
}

/* One element per thread: for pointers not 16-byte aligned. */
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = __float2bfloat16(gelu_of(__bfloat162float(inp[i])));
}
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) dinp[i] = __float2bfloat16(gelu_grad_of(__bfloat162float(inp[i]), __bfloat162float(dout[i])));
}

static void gelu_forward_gpu(floatX* out, const floatX* inp, long long N, cudaStream_t s) {
    if (is_aligned16(out) && is_aligned16(inp))
        gelu_forward_vec8_kernel<<<ceil_div(ceil_div(N, 8), 256), 256, 0, s>>>(out, inp, N);
    else
        gelu_forward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(out, inp, N);
    KERNEL_CHECK();
}
static void gelu_backward_gpu(floatX* dinp, const floatX* inp, const floatX* dout, long long N, cudaStream_t s) {
    if (is_aligned16(dinp) && is_aligned16(inp) && is_aligned16(dout))
        gelu_backward_vec8_kernel<<<ceil_div(ceil_div(N, 8), 256), 256, 0, s>>>(dinp, inp, dout, N);
    else
        gelu_backward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(dinp, inp, dout, N);
    KERNEL_CHECK();
}

/* ---- bias (the BIAS epilogue's work, when cuBLASLt has none: G3) -------- */

/* out(N, OC) += bias(OC), added in fp32 and rounded to bf16 (run on an H200
 * by test_gpt.cu's unfused pass). */
__global__ void bias_add_kernel(floatX* out, const floatX* bias, long long n, int OC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % OC]));
}

static void bias_add_gpu(floatX* out, const floatX* bias, int N, int OC, cudaStream_t s) {
    long long n = (long long)N * OC;
    bias_add_kernel<<<ceil_div(n, 256), 256, 0, s>>>(out, bias, n, OC);
    KERNEL_CHECK();
}

/* ---- classifier: softmax + cross-entropy + dlogits in one kernel -------- */
/* One block per row of logits (N, Vp), bf16. Pass 1 keeps, per thread, a
 * running max m and sum s of e^(x - m) (the online softmax of Milakov &
 * Gimelshein 2018), merged across the block in a fixed order; the loss is
 * logsumexp - logit[target]. Pass 2 (when dloss != 0) overwrites the row in
 * place with dlogits = (softmax - onehot(target)) * dloss, pad columns 0.
 * The probabilities are never stored. */
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) { s = 0.0f; return; } /* both empty */
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

/* The production classifier: the same two passes with 16-byte loads and
 * stores (Vp % 8 == 0 and the logits 16-byte aligned; GPT-2's Vp = 50304 =
 * 8 x 6288), the target's logit read before anything is written. Pass 1 takes
 * the max of a pack first and rescales the running sum once per pack (8
 * exponentials and one rescale instead of up to 8 rescales). Pass 2 loads
 * CLS_UNROLL packs before it stores any, so each thread has that many
 * 16-byte loads in flight: it writes the row it reads, and without that the
 * compiler must wait for each load before the next (the same store-ordering
 * stall as the old LayerNorm backward: see layernorm_backward_kernel).
 * STATUS: not yet run on a GPU (validated on the CPU: dev/cuda/classifier.cu,
 * test_gpt.cu). */
#define CLS_THREADS 512
#define CLS_UNROLL 4

__global__ void __launch_bounds__(CLS_THREADS)
    classifier_kernel(floatX* logits, float* losses, const int* targets, int V, int Vp, float dloss) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x, P = Vp / 8;
    floatX* xrow = logits + (size_t)row * Vp;
    Pack8* x = (Pack8*)xrow;
    int target = targets[row];
    float xt = __bfloat162float(xrow[target]); /* read before the barrier below, so before any store */
    float m = -INFINITY, s = 0.0f;
    int nan_seen = 0; /* fmaxf drops NaN: remember one, so that the loss says NaN (the failover guard looks) */
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        float f[8];
        pack8_to_float(f, x[p]);
        float pm = -INFINITY;
        for (int j = 0; j < 8; j++) {
            if (8 * p + j >= V) f[j] = -INFINITY; /* pad columns take no part */
            nan_seen |= f[j] != f[j];
            pm = fmaxf(pm, f[j]);
        }
        if (pm == -INFINITY) continue; /* a pack of padding only */
        float mm = fmaxf(m, pm);
        float t = 0.0f;
        for (int j = 0; j < 8; j++) t += expf(f[j] - mm);
        s = s * expf(m - mm) + t; /* m = -inf at first: s = 0 * 0 */
        m = mm;
    }
    if (nan_seen) s = NAN; /* online_merge carries a NaN sum through */
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads(); /* every warp's (m, s) is in shared memory; every thread has read x[target] */
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) online_merge(m, s, sm[w], ss[w]); /* same order in every thread */
    float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] = lse - xt;
    if (dloss == 0.0f) return;
    /* dlogits = (softmax - onehot(target)) * dloss, in place; pad columns 0 */
    for (int p0 = threadIdx.x; p0 < P; p0 += CLS_UNROLL * blockDim.x) {
        Pack8 in[CLS_UNROLL];
        for (int u = 0; u < CLS_UNROLL; u++) {
            int p = p0 + u * blockDim.x;
            if (p < P) in[u] = x[p];
        }
        for (int u = 0; u < CLS_UNROLL; u++) {
            int p = p0 + u * blockDim.x;
            if (p >= P) continue;
            float f[8];
            pack8_to_float(f, in[u]);
            for (int j = 0; j < 8; j++) {
                int v = 8 * p + j;
                float pr = v < V ? expf(f[j] - lse) : 0.0f;
                f[j] = (pr - (v == target ? 1.0f : 0.0f)) * dloss;
            }
            x[p] = float_to_pack8(f);
        }
    }
}

/* The scalar classifier, for Vp % 8 != 0 or unaligned logits (and the
 * kernel lab's "old production" variant: until 2026-11-30 the only one;
 * 3.7 ms for 16384 x 50304 on an H200). */
__global__ void classifier_scalar_kernel(floatX* logits, float* losses, const int* targets, int V, int Vp,
                                         float dloss) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x;
    floatX* x = logits + (size_t)row * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = __bfloat162float(x[v]);
        if (xv > m) {
            s = s * expf(m - xv) + 1.0f;
            m = xv;
        } else {
            s += expf(xv - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads(); /* every warp's (m, s) is in shared memory */
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) online_merge(m, s, sm[w], ss[w]); /* same order in every thread */
    float lse = m + logf(s);
    int target = targets[row];
    __syncthreads(); /* everyone has read x[target] below before pass 2 overwrites it */
    float xt = __bfloat162float(x[target]);
    __syncthreads();
    if (threadIdx.x == 0) losses[row] = lse - xt;
    if (dloss == 0.0f) return;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float p = v < V ? expf(__bfloat162float(x[v]) - lse) : 0.0f;
        x[v] = __float2bfloat16((p - (v == target ? 1.0f : 0.0f)) * dloss);
    }
}

/* The scalar classifier alone: the fallback, and the kernel lab's variant 2. */
static void classifier_scalar_gpu(floatX* logits, float* losses, const int* targets, int N, int V, int Vp,
                                  float dloss, cudaStream_t s) {
    classifier_scalar_kernel<<<N, 512, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    KERNEL_CHECK();
}

static void classifier_gpu(floatX* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                           cudaStream_t s) {
    if (Vp % 8 != 0 || !is_aligned16(logits)) {
        classifier_scalar_gpu(logits, losses, targets, N, V, Vp, dloss, s);
        return;
    }
    classifier_kernel<<<N, CLS_THREADS, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    KERNEL_CHECK();
}

/* out[slot[0]] = mean of losses(N), in a fixed order (one block). The slot
 * (the micro-batch) is read from device memory, uploaded with the tokens. */
__global__ void mean_kernel(float* out, const int* slot, const float* x, int N) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += x[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[slot[0]] = acc / N;
}

/* ---- global gradient norm: fixed two-pass reduction --------------------- */
/* The grid is a constant (not the SM count), so the summation order, and
 * with it the result, is the same on every GPU and every run. */
#define NORM_BLOCKS 1024
__global__ void norm_squares_partial_kernel(float* partial, const float* g, size_t n) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += g[i] * g[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
/* out[0] = the sum of the partials, or its square root (the norm) */
__global__ void norm_finish_kernel(float* out, const float* partial, int n, int take_sqrt) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[0] = take_sqrt ? sqrtf(acc) : acc;
}

/* ---- AdamW with stochastic rounding ------------------------------------ */
/* An integer hash (Wellons' "lowbias32") gives each element of each step its
 * own random bits: reproducible, and no RNG state to store. */
__device__ __forceinline__ uint32_t hash_u32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* fp32 -> bf16 rounding up or down with probability proportional to the
 * distance (so the rounding is unbiased in expectation): add 16 random bits
 * below the kept 16 and truncate. Inf and NaN pass through unchanged. */
__device__ __forceinline__ floatX bf16_round_stochastic(float x, uint32_t random) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);
    bits = (bits + (random & 0xffffu)) & 0xffff0000u;
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)(bits >> 16);
    return floatX(raw);
}

/* Clip coefficient from the global norm: torch.nn.utils.clip_grad_norm_'s
 * rule, as train_gpt.c's gradients_clip_to (max_norm <= 0: no clipping). */
__host__ __device__ __forceinline__ float clip_coef(float norm, float max_norm) { /* (the host's too: --offload 1) */
    float coef = 1.0f;
    if (max_norm > 0.0f && isfinite(norm)) {
        float c = max_norm / (norm + 1e-6f);
        if (c < 1.0f) coef = c;
    }
    return coef;
}

/* train_gpt.c's AdamW for one parameter (Loshchilov & Hutter 2019, Alg. 2):
 * updates the moments *m, *v and returns the new master value. */
__device__ __forceinline__ float adamw_element(float p, float g, float* m, float* v, float lr, float b1, float b2,
                                               float bc1, float bc2, float eps, float wd) {
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    *m = mi;
    *v = vi;
    p = p - lr * wd * p;
    return p - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

/* What changes from one update to the next, read by the kernels from device
 * memory (not passed as arguments), so that one captured update (CUDA
 * graphs) serves every step: the host writes it before each update. */
typedef struct {
    float lr;      /* the schedule's learning rate at this step */
    float bc1;     /* 1 - beta1^t, 1 - beta2^t: Adam's bias corrections at update t (1-based) */
    float bc2;
    uint32_t seed; /* the step's stochastic-rounding seed (tensor k uses seed * 16 + k) */
    int go;        /* 0: skip the update (a non-finite loss or norm: update_gate_kernel) */
} AdamWStep;

/* train_gpt.c's adamw_update for one tensor (number `tensor`), on the fp32
 * master, with the clip coefficient taken from the device-side norm, then
 * the bf16 copy written with stochastic rounding (element i of the tensor,
 * the seed step->seed * 16 + tensor). Nothing when !step->go. */
__global__ void adamw_kernel(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                             const AdamWStep* step, float b1, float b2, float eps, float wd, const float* norm,
                             float max_norm, uint32_t tensor) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !step->go) return;
    float g = grad[i] * clip_coef(norm[0], max_norm);
    float p = adamw_element(master[i], g, &m[i], &v[i], step->lr, b1, b2, step->bc1, step->bc2, eps, wd);
    master[i] = p;
    param[i] = bf16_round_stochastic(p, hash_u32((uint32_t)i ^ hash_u32(step->seed * 16u + tensor)));
}

/* One GPU: the update goes ahead only if every micro-batch's mean loss and
 * the gradient norm are finite (train_gpt.c's rule), decided here on the
 * device so that the host need not wait for the loss before launching the
 * update. (With the loss summed over ranks, or a spike rule, the host
 * decides: dp_step.) */
__global__ void update_gate_kernel(AdamWStep* step, const float* loss_mean, int micro_batches, const float* norm) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int go = isfinite(norm[0]);
    for (int i = 0; i < micro_batches; i++) go = go && isfinite(loss_mean[i]);
    step->go = go;
}

/* fp32 -> bf16, round to nearest (the first copy of the master weights). */
__global__ void float_to_bf16_kernel(floatX* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

/* fp32 -> bf16 with the stochastic rounding adamw_kernel applies to tensor
 * element i under `seed` (that kernel's seed argument): from the master an
 * update wrote, the bf16 weights it wrote, bit for bit (a resumed run). */
__global__ void bf16_round_stochastic_kernel(floatX* out, const float* in, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_round_stochastic(in[i], hash_u32((uint32_t)i ^ hash_u32(seed)));
}

/* bf16 -> fp32 (copies for the host: logits, activations in the tests). */
__global__ void bf16_to_float_kernel(float* out, const floatX* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}

/* ---- the data-parallel layout: buckets, shards, packing ----------------- */
/* Data parallelism (G6) moves gradients and weights in buckets, each holding
 * the parameters whose gradients backward finishes at one moment: bucket
 * l < L is layer l's 12 tensor slices (ln1w .. fcprojb), bucket L "the rest"
 * (wte, wpe, lnfw, lnfb: final only when backward ends, because wte gets
 * gradients at both ends of it). In a bucket's packed order its slices lie
 * back to back in file order (as in train_gpt.c's layer_grads), followed by
 * zeros up to a multiple of W x DP_ALIGN. A reduce-scatter of a bucket hands
 * rank r the r-th of W equal pieces; under ZeRO rank r's shard is its piece
 * of every bucket, in bucket order (layer 0 .. L-1, then the rest). The pad
 * absorbs the remainder, so any W works. One description of a bucket's shape
 * serves every user: the gradient pointers backward writes through, the
 * AdamW kernel's map from shard element to parameter, the unpacking of the
 * gathered weights, the gathering of the master weights for checkpoints. */
#define DP_MAX_SEGMENTS 12
#define DP_ALIGN 64 /* pieces are multiples of 64 elements: 256-byte aligned in fp32, 128 in bf16 */
#define NUM_LAYER_TENSORS (LAYER_TENSORS_END - LAYER_TENSORS_BEGIN)
static_assert(NUM_LAYER_TENSORS <= DP_MAX_SEGMENTS && NUM_PARAMETER_TENSORS - NUM_LAYER_TENSORS <= DP_MAX_SEGMENTS,
              "a bucket's slices must fit DP_MAX_SEGMENTS");

typedef struct {
    int nseg;                        /* tensor slices in the bucket: 12 for a layer, 4 for the rest */
    int k[DP_MAX_SEGMENTS];          /* the parameter tensor of each slice */
    size_t pre[DP_MAX_SEGMENTS + 1]; /* packed start of each slice; pre[nseg] = the real elements */
    size_t off[DP_MAX_SEGMENTS];     /* that tensor's start in the flat (file-order) buffer */
    size_t stride[DP_MAX_SEGMENTS];  /* layer l's slice is at off + l * stride of the tensor (rest: 0) */
    size_t piece;                    /* padded length / W: each rank's part */
} BucketShape;

typedef struct {
    BucketShape layer, rest; /* every layer bucket has the same shape */
    int num_layers, rank, world;
} ShardMap;

static void shard_map_init(ShardMap* m, const size_t sizes[NUM_PARAMETER_TENSORS], int num_layers, int rank,
                           int world) {
    memset(m, 0, sizeof(*m));
    m->num_layers = num_layers;
    m->rank = rank;
    m->world = world;
    size_t offset = 0, unit = (size_t)world * DP_ALIGN;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        int in_layer = k >= LAYER_TENSORS_BEGIN && k < LAYER_TENSORS_END;
        BucketShape* s = in_layer ? &m->layer : &m->rest;
        size_t n = in_layer ? sizes[k] / (size_t)num_layers : sizes[k];
        s->k[s->nseg] = k;
        s->off[s->nseg] = offset;
        s->stride[s->nseg] = in_layer ? n : 0;
        s->pre[s->nseg + 1] = s->pre[s->nseg] + n;
        s->nseg++;
        offset += sizes[k];
    }
    m->layer.piece = (m->layer.pre[m->layer.nseg] + unit - 1) / unit * DP_ALIGN;
    m->rest.piece = (m->rest.pre[m->rest.nseg] + unit - 1) / unit * DP_ALIGN;
}

/* Bucket b's shape (b = L: the rest), and where its piece sits in a shard. */
__host__ __device__ static const BucketShape* shard_map_bucket(const ShardMap* m, int b) {
    return b < m->num_layers ? &m->layer : &m->rest;
}
static size_t shard_map_offset(const ShardMap* m, int b) { return (size_t)b * m->layer.piece; }
/* Elements in a shard (the same on every rank), and in all padded buckets. */
static size_t shard_map_elements(const ShardMap* m) { return shard_map_offset(m, m->num_layers) + m->rest.piece; }

/* Element j of this rank's shard: the flat offset of the parameter it holds,
 * or -1 for padding; *k is its tensor and *i its index in that tensor. */
__host__ __device__ static long long shard_locate(const ShardMap* m, size_t j, int* k, size_t* i) {
    size_t layers = (size_t)m->num_layers * m->layer.piece;
    size_t l = j < layers ? j / m->layer.piece : 0;
    const BucketShape* s = j < layers ? &m->layer : &m->rest;
    size_t q = (size_t)m->rank * s->piece + (j < layers ? j - l * s->piece : j - layers); /* place in the packed bucket */
    if (q >= s->pre[s->nseg]) return -1;
    int g = 0;
    while (q >= s->pre[g + 1]) g++;
    *k = s->k[g];
    *i = l * s->stride[g] + (q - s->pre[g]);
    return (long long)(s->off[g] + *i);
}

/* Host side, for start-up and checkpoints. Rank r's piece of bucket b out
 * of the flat parameters: shard (piece) = the slices' parts that fall in
 * [r piece, (r+1) piece) of the packed bucket, zeros for the pad. */
static void shard_pack_host(float* shard, const float* flat, const ShardMap* m, int b, int r) {
    const BucketShape* s = shard_map_bucket(m, b);
    size_t l = b < m->num_layers ? (size_t)b : 0, lo = (size_t)r * s->piece, hi = lo + s->piece;
    memset(shard, 0, s->piece * sizeof(float));
    for (int g = 0; g < s->nseg; g++) {
        size_t a = s->pre[g] > lo ? s->pre[g] : lo, e = s->pre[g + 1] < hi ? s->pre[g + 1] : hi;
        if (a < e) memcpy(shard + (a - lo), flat + s->off[g] + l * s->stride[g] + (a - s->pre[g]), (e - a) * sizeof(float));
    }
}

/* A whole packed bucket (every rank's piece, gathered) back into the flat parameters. */
static void bucket_unpack_host(float* flat, const float* packed, const ShardMap* m, int b) {
    const BucketShape* s = shard_map_bucket(m, b);
    size_t l = b < m->num_layers ? (size_t)b : 0;
    for (int g = 0; g < s->nseg; g++)
        memcpy(flat + s->off[g] + l * s->stride[g], packed + s->pre[g], (s->pre[g + 1] - s->pre[g]) * sizeof(float));
}

/* AdamW over this rank's shard (ZeRO): as adamw_kernel, with each element's
 * tensor (weight decay: bit k of decay_mask) and index in it (the rounding's
 * random bits, the same as adamw_kernel's for that parameter) found through
 * the map; the global norm comes from the host. The pad stays 0. */
__global__ void adamw_shard_kernel(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                                   const ShardMap* map, float lr, float b1, float b2, float bc1, float bc2, float eps,
                                   float weight_decay, unsigned decay_mask, float norm, float max_norm, uint32_t seed) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int k;
    size_t i;
    if (shard_locate(map, j, &k, &i) < 0) {
        param[j] = __float2bfloat16_rn(0.0f);
        return;
    }
    float wd = (decay_mask >> k) & 1u ? weight_decay : 0.0f;
    float g = grad[j] * clip_coef(norm, max_norm);
    float p = adamw_element(master[j], g, &m[j], &v[j], lr, b1, b2, bc1, bc2, eps, wd);
    master[j] = p;
    param[j] = bf16_round_stochastic(p, hash_u32((uint32_t)i ^ hash_u32(seed * 16u + (uint32_t)k)));
}

/* The shard's bf16 weights from its master, rounded as adamw_shard_kernel
 * rounds them under `seed` (stochastic 1: a resumed or rolled-back run gets
 * the very bf16 weights that update wrote), or to nearest (stochastic 0:
 * fresh weights, as gpu_model_init); the pad 0. The all-gather spreads them. */
__global__ void shard_round_kernel(floatX* param, const float* master, size_t n, const ShardMap* map, int stochastic,
                                   uint32_t seed) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int k;
    size_t i;
    if (shard_locate(map, j, &k, &i) < 0) param[j] = __float2bfloat16_rn(0.0f);
    else if (stochastic)
        param[j] = bf16_round_stochastic(master[j], hash_u32((uint32_t)i ^ hash_u32(seed * 16u + (uint32_t)k)));
    else param[j] = __float2bfloat16_rn(master[j]);
}

/* dst(n) += src(n): ZeRO-2 adds each micro-batch's reduced piece into the shard. */
__global__ void accumulate_kernel(float* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

/* ---- ZeRO++'s block codec on the device (issue 15: qwZ, qgZ; not run on
 * a GPU, checked on the CPU execution layer only, scripts/test_cuda_zeropp.sh)
 * The format is gptc/quant.h's, bit for bit (its header comment): a piece
 * of n floats quantises into one slot, ceil(n / block) fp32 scales then the
 * codes (n bytes INT8, ceil(n / 2) INT4: the low nibble first), padded to 4
 * bytes; scale s = fl(m / qmax) of the block's m = max|x| (raised an ulp
 * while subnormal and qmax s < m, lowered while qmax s overflows; 0 for an
 * all-zero block, NaN when any element is not finite), code q = x / s in
 * double rounded half to even, deq = fl(q s). Every fp32 product and sum is
 * written __fmul_rn / __fadd_rn so that nvcc cannot fuse them into an FMA
 * (the CPU reference rounds each on its own). */

/* element k of a slot of n floats, dequantised (one fp32 rounding) */
__device__ inline float quant_slot_element(const uint8_t* slot, size_t n, size_t k, int bits, int block) {
    const float* scales = (const float*)slot;
    const uint8_t* payload = slot + 4 * ((n + (size_t)block - 1) / (size_t)block);
    int code = bits == 8 ? (int)(int8_t)payload[k] : (((payload[k >> 1] >> ((k & 1) * 4)) & 0xF) ^ 8) - 8;
    return __fmul_rn((float)code, scales[k / (size_t)block]);
}

/* x (n) quantised into slot, in two kernels (quant_encode_gpu); residual
 * (n, or NULL): error feedback, v = x + residual is what is quantised and
 * residual becomes v - deq (0 in a block whose scale is 0 or NaN).
 * 1. quant_scale_kernel, one warp per block of the format (grid: ceil(nb /
 *    8) blocks of 256 threads): the lanes stride over its elements for m =
 *    max |v| (exact in any order), a shuffle reduction, lane 0 writes s. */
__global__ void quant_scale_kernel(uint8_t* slot, const float* x, const float* residual, size_t n, int bits, int block) {
    size_t nb = (n + (size_t)block - 1) / (size_t)block;
    size_t b = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (b >= nb) return; /* (a whole warp: its lanes share b) */
    size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
    float m = 0.0f;
    int nonfinite = 0;
    for (size_t i = lo + (size_t)lane; i < hi; i += 32) {
        float a = fabsf(residual ? __fadd_rn(x[i], residual[i]) : x[i]);
        nonfinite |= !(a <= FLT_MAX); /* NaN compares false, Inf is above */
        m = a > m ? a : m;
    }
    for (int o = 16; o > 0; o >>= 1) { /* m and nonfinite over the warp, in every lane */
        float other = __shfl_xor_sync(0xFFFFFFFFu, m, o);
        m = other > m ? other : m;
        nonfinite |= __shfl_xor_sync(0xFFFFFFFFu, nonfinite, o);
    }
    if (lane) return;
    int qmax = bits == 8 ? 127 : 7;
    float s = 0.0f; /* gptc/quant.h's quant_scale_of */
    if (nonfinite) s = NAN;
    else if (m > 0.0f) {
        s = __fdiv_rn(m, (float)qmax);
        if (s < FLT_MIN) /* subnormal: up to the first s with qmax s >= m */
            while ((double)s * qmax < (double)m) s = nextafterf(s, INFINITY);
        while (isinf(__fmul_rn((float)qmax, s))) s = nextafterf(s, 0.0f); /* m near FLT_MAX */
    }
    ((float*)slot)[b] = s;
}

/* 2. quant_code_kernel, one thread per 4-byte word of the payload (its 4
 *    INT8 or 8 INT4 codes, which may straddle two blocks; codes past n are
 *    0, so the padding is zeros): q = rint(v / s) in double, packed, the
 *    word written whole (adjacent bytes are never written by two threads). */
__global__ void quant_code_kernel(uint8_t* slot, const float* x, float* residual, size_t n, int bits, int block) {
    size_t nb = (n + (size_t)block - 1) / (size_t)block, per = bits == 8 ? 4 : 8;
    size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= (n + per - 1) / per) return;
    const float* scales = (const float*)slot;
    uint32_t word = 0;
    for (size_t e = 0; e < per; e++) {
        size_t i = w * per + e;
        if (i >= n) break;
        float s = scales[i / (size_t)block];
        float v = residual ? __fadd_rn(x[i], residual[i]) : x[i];
        int live = s > 0.0f; /* 0 or NaN: the code 0, the residual 0 */
        int q = live ? (int)rint((double)v / (double)s) : 0;
        word |= bits == 8 ? (uint32_t)(uint8_t)(int8_t)q << (8 * e) : (uint32_t)(q & 0xF) << (4 * e);
        if (residual) residual[i] = live ? __fsub_rn(v, __fmul_rn((float)q, s)) : 0.0f;
    }
    ((uint32_t*)(slot + 4 * nb))[w] = word; /* little-endian: element 4w + e in byte e (INT4: the low nibble first) */
}

/* both, on stream s */
static void quant_encode_gpu(uint8_t* slot, const float* x, float* residual, size_t n, int bits, int block,
                             cudaStream_t s) {
    size_t nb = quant_num_blocks(n, block), words = (quant_payload_bytes(n, bits) + 3) / 4;
    quant_scale_kernel<<<ceil_div((long long)nb, 8), 256, 0, s>>>(slot, x, residual, n, bits, block);
    KERNEL_CHECK();
    quant_code_kernel<<<ceil_div((long long)words, 256), 256, 0, s>>>(slot, x, residual, n, bits, block);
    KERNEL_CHECK();
}

/* qwZ's arrival: dst (W piece) = the W slots dequantised, rank q's piece at q
 * piece from its slot slot_of[q] of `slots` (sb bytes each), rounded to
 * nearest bf16. One thread an element. */
__global__ void qwz_decode_kernel(floatX* dst, const uint8_t* slots, const int* slot_of, size_t sb, size_t piece,
                                  int W, int bits, int block) {
    size_t d = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= (size_t)W * piece) return;
    size_t q = d / piece, k = d % piece;
    dst[d] = __float2bfloat16_rn(quant_slot_element(slots + (size_t)slot_of[q] * sb, piece, k, bits, block));
}

/* qgZ, hop 0's sums: partial (N piece) = for each node p the rank's own
 * values of the piece of rank who[j N + p] (this rank's local index j),
 * plus, in fp32 and in the order t = 1 .. K-1, the dequantised slot of the
 * node peer j - t (mod K): recv holds peer i's N slots at i N. */
__global__ void qgz_hop0_kernel(float* partial, const float* bucket, const int* who, const uint8_t* recv, size_t sb,
                                size_t piece, int N, int K, int j, int bits, int block) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * piece) return;
    size_t p = e / piece, k = e % piece;
    float acc = bucket[(size_t)who[(size_t)j * N + p] * piece + k];
    for (int t = 1; t < K; t++) {
        int from = (j - t + K) % K;
        acc = __fadd_rn(acc, quant_slot_element(recv + ((size_t)from * N + p) * sb, piece, k, bits, block));
    }
    partial[e] = acc;
}

/* qgZ, hop 1 and the owner's shard: grad (piece) += mine + the other nodes'
 * dequantised partial sums of this rank's piece, in the order t = 1 .. N-1
 * from node p - t (mod N) (recv holds node i's slot at i). */
__global__ void qgz_hop1_kernel(float* grad, const float* mine, const uint8_t* recv, size_t sb, size_t piece, int N,
                                int p, int bits, int block) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= piece) return;
    float acc = mine[k];
    for (int t = 1; t < N; t++)
        acc = __fadd_rn(acc, quant_slot_element(recv + (size_t)((p - t + N) % N) * sb, piece, k, bits, block));
    grad[k] = __fadd_rn(grad[k], acc);
}

/* Unpacking a bucket: dst[dst_s + i] = src[src_s + i] for i < n_s, one
 * slice s per blockIdx.y; 8 bf16 at a time when every offset and length is
 * a multiple of 8. */
typedef struct {
    int nseg, vec;
    size_t src[DP_MAX_SEGMENTS], dst[DP_MAX_SEGMENTS], n[DP_MAX_SEGMENTS];
} SegmentCopy;

__global__ void segments_copy_kernel(floatX* dst, const floatX* src, SegmentCopy sc) {
    int s = blockIdx.y;
    size_t n = sc.vec ? sc.n[s] / 8 : sc.n[s];
    const floatX* from = src + sc.src[s];
    floatX* to = dst + sc.dst[s];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (sc.vec) ((Pack8*)to)[i] = ((const Pack8*)from)[i];
        else to[i] = from[i];
    }
}

/* Layer l's bucket (or the rest, l = 0 with the rest's shape): packed -> flat. */
static SegmentCopy bucket_unpacking(const BucketShape* s, size_t l) {
    SegmentCopy c;
    memset(&c, 0, sizeof(c));
    c.nseg = s->nseg;
    c.vec = 1;
    for (int g = 0; g < s->nseg; g++) {
        c.src[g] = s->pre[g];
        c.dst[g] = s->off[g] + l * s->stride[g];
        c.n[g] = s->pre[g + 1] - s->pre[g];
        if (c.src[g] % 8 || c.dst[g] % 8 || c.n[g] % 8) c.vec = 0;
    }
    return c;
}

static void segments_copy_gpu(floatX* dst, const floatX* src, const SegmentCopy* sc, cudaStream_t s) {
    size_t most = 0;
    for (int g = 0; g < sc->nseg; g++) most = sc->n[g] > most ? sc->n[g] : most;
    long long blocks = ceil_div((long long)(sc->vec ? most / 8 : most), 256);
    dim3 grid((unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks), (unsigned)sc->nseg);
    segments_copy_kernel<<<grid, 256, 0, s>>>(dst, src, *sc);
    KERNEL_CHECK();
}

/* ------------------------------------------------------------------------ */
/* G3. Matmul through cuBLASLt                                              */
/* ------------------------------------------------------------------------ */
/* All tensors are row-major; cuBLASLt is column-major, so a row-major (R, K)
 * matrix is read as a column-major (K, R) one with ld = K. bf16 inputs, fp32
 * accumulation (CUBLAS_COMPUTE_32F), output bf16 or fp32. The algorithm for
 * each distinct problem is asked of the heuristic once and cached, with the
 * descriptors that describe the problem (the cache, below LtRoute). */

/* Every cuBLASLt problem is described by a key: the shapes, and how aligned
 * each pointer is (the heuristic is told A's, B's, C's and D's, and an
 * algorithm picked for aligned pointers may not run on less aligned ones).
 * The bias of the BIAS and GELU_AUX_BIAS epilogues is a slice of the flat
 * parameters, only as aligned as its offset: with C = 36 (the tiny fixture)
 * layer 0's qkvb starts 8 bytes past a 16-byte boundary. The heuristic has
 * no preference for the bias's alignment, and a kernel that assumes 16
 * bytes faults ("misaligned address", sticky: the process is done), a known
 * cuBLASLt behaviour PyTorch works around by not fusing such a bias
 * (pytorch/pytorch#194497). Here an under-aligned bias is copied first into
 * a 256-byte-aligned buffer (OC values, a few KB); the key holds the bias's
 * alignment all the same. When the heuristic has no algorithm for an
 * epilogue (or answers CUBLAS_STATUS_NOT_SUPPORTED), the problem runs
 * unfused: a plain GEMM, then our bias and GELU kernels (G2). A plain GEMM
 * without an algorithm stops the run, naming the shape. The decisions are
 * host functions (lt_bias_placed, lt_key_make, lt_route), which test_gpt.cu
 * checks without a GPU. On the first H200 run (dev/cuda/RESULTS.md) every
 * problem of GPT-2 124M and of the tiny fixture found a fused algorithm. */
#define LT_EPILOGUE_ALIGN 16 /* bytes: what an epilogue's bias and aux pointers must be aligned to */

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd;
    int dtype;             /* cudaDataType_t of C and D */
    int epilogue;          /* cublasLtEpilogue_t */
    int batch;
    long long stride_a, stride_b, stride_d;
    int align_a, align_b, align_c, align_d, align_bias, align_aux, has_c, ldaux; /* alignments in bytes; 0: none */
} LtKey;

/* What lt_matmul does with a problem, decided once per key. */
typedef enum {
    LT_FUSED,   /* run as asked, epilogue included */
    LT_UNFUSED, /* no algorithm with the epilogue: the caller runs a plain GEMM and our kernels */
    LT_NONE     /* no algorithm even without an epilogue: stop, naming the shape */
} LtRoute;

/* The cache. Each distinct problem (key) is set up once: the heuristic's
 * algorithm and route, and the cuBLASLt objects that describe it: the
 * operation descriptor (compute and scale types, transposes, epilogue, aux
 * ld) and the four matrix layouts (type, rows, columns, ld, batch count and
 * stride of A, B, C, D). All of these follow from the key alone (lt_slot_make
 * reads nothing else), so a call whose key is cached only sets what varies
 * between calls with one key: the bias and the GELU aux pointers. Why: a
 * step of GPT-2 124M makes ~300 GEMMs; creating a descriptor and four
 * layouts per GEMM, setting their attributes and destroying them again was
 * ~1,500 host API calls a step, and CUDA graphs will soon capture the step,
 * where the host work per call is what is left. Changing the bias pointer of
 * a descriptor whose previous GEMM has not run yet is safe: cublasLtMatmul
 * takes what it needs from the descriptors when it is called, on the host
 * (NVIDIA's CUDALibrarySamples cuBLASLt/LtSgemm destroys its descriptors
 * right after the asynchronous call, "all GPU work was already enqueued";
 * this file did the same until the cache; the CPU layer's cublaslt.cpp
 * copies them at the call, and test_cublaslt checks it). For the same
 * reason an evicted slot's objects may be destroyed while its GEMMs are
 * still queued. STATUS: the cache has run on the CPU execution layer only
 * (test_gpt_cu_cpu, dev/cuda/cpu), not yet on a GPU. */
#define LT_CACHE_SIZE 128
typedef struct {
    LtKey key;
    cublasLtMatmulAlgo_t algo;
    LtRoute route;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layouts[4]; /* A, B, C, D */
} LtSlot;

typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    size_t workspace_bytes;
    floatX* bias_copy;     /* (bias_copy_elems) 256-byte aligned: under-aligned biases are copied here */
    size_t bias_copy_elems;
    int cached;            /* slots in use; full: the last one is reused */
    LtSlot slots[LT_CACHE_SIZE];
    long long calls;       /* lt_matmul calls */
    long long created;     /* descriptors (each with its 4 layouts) created: one per new key; test_gpt.cu checks
                              that a repeated step creates none */
    int no_epilogues;      /* tests: run every epilogue unfused (test_gpt.cu checks that path against the CPU) */
} LtContext;

/* The handle, the workspace, and room for a bias of up to bias_elems values. */
static void lt_init(LtContext* lt, size_t workspace_bytes, size_t bias_elems) {
    memset(lt, 0, sizeof(*lt));
    CUBLAS_CHECK(cublasLtCreate(&lt->handle));
    lt->workspace_bytes = workspace_bytes;
    lt->workspace = gpu_alloc(workspace_bytes, GMEM_CUBLASLT);
    lt->bias_copy_elems = bias_elems;
    lt->bias_copy = (floatX*)gpu_alloc(bias_elems * sizeof(floatX), GMEM_CUBLASLT); /* cudaMalloc: 256-byte aligned */
}

static void lt_slot_free(LtSlot* s) {
    for (int i = 0; i < 4; i++) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(s->layouts[i]));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(s->desc));
    memset(s, 0, sizeof(*s));
}

static void lt_free(LtContext* lt) {
    for (int i = 0; i < lt->cached; i++) lt_slot_free(&lt->slots[i]);
    CUBLAS_CHECK(cublasLtDestroy(lt->handle));
    gpu_release(lt->workspace);
    gpu_release(lt->bias_copy);
    memset(lt, 0, sizeof(*lt));
}

/* Largest power of two (<= 256) dividing the address: the alignment promise
 * the heuristic is told (its default assumes 256 bytes). */
static int ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0) al /= 2;
    return al;
}

/* The bias pointer cuBLASLt gets: the bias itself when it is aligned to
 * LT_EPILOGUE_ALIGN, else `copy` (lt_matmul copies the bias there first). */
static const floatX* lt_bias_placed(const floatX* bias, const floatX* copy) {
    return bias && ptr_alignment(bias) < LT_EPILOGUE_ALIGN ? copy : bias;
}

/* The key of a problem (lt_matmul's arguments; `bias` as placed). */
static LtKey lt_key_make(const void* D, cudaDataType_t dtype, const void* Cm, const floatX* A, int transa,
                         const floatX* Bm, int transb, int m, int n, int k, int lda, int ldb, int ldd, float beta,
                         const floatX* bias, cublasLtEpilogue_t epilogue, const void* aux, int batch,
                         long long stride_a, long long stride_b, long long stride_d) {
    LtKey key;
    memset(&key, 0, sizeof(key)); /* (memcmp'd: no stray padding) */
    key.transa = transa; key.transb = transb; key.m = m; key.n = n; key.k = k;
    key.lda = lda; key.ldb = ldb; key.ldd = ldd; key.dtype = (int)dtype; key.epilogue = (int)epilogue;
    key.batch = batch; key.stride_a = stride_a; key.stride_b = stride_b; key.stride_d = stride_d;
    key.align_a = ptr_alignment(A); key.align_b = ptr_alignment(Bm);
    key.align_c = ptr_alignment(Cm ? Cm : D); key.align_d = ptr_alignment(D);
    key.align_bias = bias ? ptr_alignment(bias) : 0;
    key.align_aux = aux ? ptr_alignment(aux) : 0;
    key.has_c = beta != 0.0f;
    key.ldaux = aux ? m : 0;
    return key;
}

/* The route for a key, given the heuristic's answer (its status, and how
 * many algorithms it found). The GELU aux matrix cannot be moved like the
 * bias (it is an output as large as D): under LT_EPILOGUE_ALIGN its
 * epilogue is not fused, whatever the heuristic says. */
static LtRoute lt_route(const LtKey* key, cublasStatus_t status, int found) {
    int fused = key->epilogue != (int)CUBLASLT_EPILOGUE_DEFAULT;
    if (fused && key->align_aux > 0 && key->align_aux < LT_EPILOGUE_ALIGN) return LT_UNFUSED;
    if (fused && key->align_bias > 0 && key->align_bias < LT_EPILOGUE_ALIGN) return LT_UNFUSED; /* (not placed) */
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) return LT_FUSED;
    return fused ? LT_UNFUSED : LT_NONE;
}

static const char* lt_epilogue_name(int epilogue) {
    switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
    }
}

/* The shape and alignments of a key, for messages. */
static void lt_key_describe(const LtKey* key, char* out, size_t cap) {
    snprintf(out, cap, "m=%d n=%d k=%d transa=%d transb=%d epilogue %s batch=%d (alignments: A %d B %d C %d D %d "
             "bias %d aux %d bytes)", key->m, key->n, key->k, key->transa, key->transb, lt_epilogue_name(key->epilogue),
             key->batch, key->align_a, key->align_b, key->align_c, key->align_d, key->align_bias, key->align_aux);
}

static void lt_layout_batch(cublasLtMatrixLayout_t l, int batch, long long stride) {
    if (batch <= 1) return;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)));
}

/* A new slot's descriptor and layouts, from the key alone (what lt_matmul
 * sets per call, the bias and aux pointers, is not in them yet). A and B are
 * bf16; C has D's type and layout; the aux matrix has ld m. */
static void lt_slot_make(LtContext* lt, LtSlot* s, const LtKey* key) {
    s->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = (cublasLtEpilogue_t)key->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (key->align_aux) {
        int64_t ldaux = key->ldaux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux,
                                                    sizeof(ldaux)));
    }
    cudaDataType_t dtype = (cudaDataType_t)key->dtype;
    int m = key->m, n = key->n, k = key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[0], CUDA_R_16BF, key->transa ? k : m, key->transa ? m : k,
                                            key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[1], CUDA_R_16BF, key->transb ? n : k, key->transb ? k : n,
                                            key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[2], dtype, m, n, key->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[3], dtype, m, n, key->ldd));
    long long strides[4] = {key->stride_a, key->stride_b, key->stride_d, key->stride_d};
    for (int i = 0; i < 4; i++) lt_layout_batch(s->layouts[i], key->batch, strides[i]);
    lt->created++;
}

/* D(m, n) = alpha op(A) op(B) + beta C (+ bias(m)) [then the epilogue],
 * column-major, batched with the given strides when batch > 1. A and B are
 * bf16; C and D are `dtype` (CUDA_R_16BF or CUDA_R_32F), C has D's layout
 * (C == NULL: C = D). `aux` is the GELU input for the GELU_AUX / DGELU
 * epilogues (ld = m). Returns 1 when done; 0 when the epilogue has no
 * algorithm here (nothing was queued: the caller computes the same without
 * it, as matmul_forward_gpu and matmul_backward_gpu do). Without an
 * epilogue it always returns 1 (or stops the run). One stream per context:
 * each bias copy is read by its GEMM before the next copy overwrites it. */
static int lt_matmul(LtContext* lt, cudaStream_t stream, void* D, cudaDataType_t dtype, const void* Cm,
                     const floatX* A, int transa, const floatX* Bm, int transb, int m, int n, int k,
                     int lda, int ldb, int ldd, float alpha, float beta, const floatX* bias,
                     cublasLtEpilogue_t epilogue, void* aux, int batch, long long stride_a,
                     long long stride_b, long long stride_d) {
    if (!Cm) Cm = D;
    const floatX* placed = lt_bias_placed(bias, lt->bias_copy);
    LtKey key = lt_key_make(D, dtype, Cm, A, transa, Bm, transb, m, n, k, lda, ldb, ldd, beta, placed, epilogue, aux,
                            batch, stride_a, stride_b, stride_d);
    lt->calls++;

    int slot = -1;
    for (int i = 0; i < lt->cached; i++)
        if (!memcmp(&lt->slots[i].key, &key, sizeof(key))) { slot = i; break; }
    int is_new = slot < 0;
    if (is_new) {
        if (lt->cached < LT_CACHE_SIZE) slot = lt->cached++;
        else { slot = LT_CACHE_SIZE - 1; lt_slot_free(&lt->slots[slot]); } /* full: the last slot is reused */
        lt_slot_make(lt, &lt->slots[slot], &key);
    }
    LtSlot* s = &lt->slots[slot];
    cublasLtMatrixLayout_t* l = s->layouts;
    /* what varies between calls with one key (the key holds whether each is there, and its alignment) */
    if (placed)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placed,
                                                    sizeof(placed)));
    if (aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof(aux)));
    if (is_new) {
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = lt->workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        uint32_t al[4] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_c, (uint32_t)key.align_d};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
        cublasLtMatmulHeuristicResult_t result;
        memset(&result, 0, sizeof(result));
        int found = 0;
        /* not through CUBLAS_CHECK: CUBLAS_STATUS_NOT_SUPPORTED means "no algorithm", which lt_route handles */
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt->handle, s->desc, l[0], l[1], l[2], l[3], pref, 1,
                                                           &result, &found);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        LtRoute route = lt_route(&key, st, found);
        char shape[256];
        lt_key_describe(&key, shape, sizeof(shape));
        CHECK(route != LT_NONE, "cuBLASLt has no algorithm for %s (heuristic: %s): report this shape", shape,
              cublasLtGetStatusString(st));
        if (lt->no_epilogues && epilogue != CUBLASLT_EPILOGUE_DEFAULT) route = LT_UNFUSED;
        else if (route == LT_UNFUSED)
            printf("cuBLASLt: no algorithm for %s (heuristic: %s, %d found): a plain GEMM and our own bias/GELU "
                   "kernels instead\n", shape, cublasLtGetStatusString(st), found);
        s->algo = result.algo;
        s->route = route;
    }
    int run = s->route == LT_FUSED;
    if (run && placed != bias) { /* the under-aligned bias (m values) into the aligned buffer, just before its GEMM */
        ALWAYS((size_t)m <= lt->bias_copy_elems);
        CUDA_CHECK(cudaMemcpyAsync(lt->bias_copy, bias, (size_t)m * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    }
    if (run)
        CUBLAS_CHECK(cublasLtMatmul(lt->handle, s->desc, &alpha, A, l[0], Bm, l[1], &beta, Cm, l[2], D, l[3], &s->algo,
                                    lt->workspace, lt->workspace_bytes, stream));
    return run;
}

/* train_gpt.c's matmul_forward: out(N, OC) = inp(N, C) . weight(OC, C)^T + bias,
 * plus `residual` (N, OC) when given (beta = 1: the residual connection
 * costs no extra pass). gelu_aux: GELU epilogue; out = gelu(pre), pre -> gelu_aux.
 * Unfused (lt_matmul found no algorithm for the epilogue): pre = the plain
 * GEMM (+ residual), + bias and GELU by our kernels; bf16 is rounded after
 * the GEMM and again after the bias, where the epilogue rounds once. */
static void matmul_forward_gpu(LtContext* lt, cudaStream_t s, floatX* out, const floatX* inp, const floatX* weight,
                               const floatX* bias, const floatX* residual, floatX* gelu_aux, int N, int C, int OC) {
    cublasLtEpilogue_t epi = gelu_aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                      : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    float beta = residual ? 1.0f : 0.0f;
    if (lt_matmul(lt, s, out, CUDA_R_16BF, residual, weight, 1, inp, 0, OC, N, C, C, C, OC, 1.0f, beta, bias, epi,
                  gelu_aux, 1, 0, 0, 0))
        return;
    floatX* pre = gelu_aux ? gelu_aux : out;
    lt_matmul(lt, s, pre, CUDA_R_16BF, residual, weight, 1, inp, 0, OC, N, C, C, C, OC, 1.0f, beta, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    if (bias) bias_add_gpu(pre, bias, N, OC, s);
    if (gelu_aux) gelu_forward_gpu(out, gelu_aux, (long long)N * OC, s);
}

/* train_gpt.c's matmul_backward:
 *   dinp(N, C) = dout(N, OC) . weight(OC, C)       (bf16; times gelu'(gelu_aux) if given)
 *   dweight(OC, C) += dout^T . inp                 (fp32, beta = 1)
 *   dbias(OC) += column sums of dout               (fp32, deterministic)
 * Unfused DGELU: the plain GEMM, then gelu_backward_gpu in place. */
static void matmul_backward_gpu(LtContext* lt, cudaStream_t s, floatX* dinp, float* dweight, float* dbias,
                                float* bias_part, const floatX* dout, const floatX* inp, const floatX* weight,
                                floatX* gelu_aux, int N, int C, int OC) {
    if (!lt_matmul(lt, s, dinp, CUDA_R_16BF, NULL, weight, 0, dout, 0, C, N, OC, C, OC, C, 1.0f, 0.0f, NULL,
                   gelu_aux ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, gelu_aux, 1, 0, 0, 0)) {
        lt_matmul(lt, s, dinp, CUDA_R_16BF, NULL, weight, 0, dout, 0, C, N, OC, C, OC, C, 1.0f, 0.0f, NULL,
                  CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
        gelu_backward_gpu(dinp, gelu_aux, dinp, (long long)N * C, s);
    }
    lt_matmul(lt, s, dweight, CUDA_R_32F, NULL, inp, 0, dout, 1, C, OC, N, C, OC, C, 1.0f, 1.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    if (dbias) bias_backward_gpu(dbias, bias_part, dout, N, OC, s);
}

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
#include "gptc/cuda/plan.cuh" // MemoryPlan, gpu_memory_plan_for, memory_check, gpu_plan_check, gpu_plan_print

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

#include "gptc/cuda/states.cuh" // GpuSnapshots, gpu_snapshots_init, _free, gpu_snapshot_start, _hand_over, gpu_states_problem
#include "gptc/cuda/mfu.cuh" // gpu_peak_tflops, flops_per_token, mfu_format, gpu_device_print

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
