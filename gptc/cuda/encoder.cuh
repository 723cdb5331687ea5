/*
 * gptc/cuda/encoder.cuh — the embedding on the GPU: out = wte[token] +
 * wpe[position], and its deterministic backward (the token embedding's
 * gradient summed by chunks of positions grouped by token, no atomics).
 *
 * Included by train_gpt.cu and dev/cuda/encoder.cu, after train_gpt.c
 * (ALWAYS) and gptc/cuda/common.cuh.
 * Defines: encoder_forward_kernel, encoder_forward_gpu, ENC_CHUNK,
 * ENC_BLOCKS_MAX, EncoderChunks, NUM_ENCODER_CHUNKS, encoder_max_chunks,
 * encoder_max_long, encoder_max_partials, encoder_backward_wte_chunk_kernel,
 * encoder_backward_wte_finish_kernel, encoder_grids, encoder_backward_wte_gpu,
 * encoder_backward_wpe_kernel, encoder_buckets_build, encoder_chunks_build.
 */
#ifndef GPTC_CUDA_ENCODER_CUH
#define GPTC_CUDA_ENCODER_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

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
 * token (dev/cuda/encoder.cu's variant 2) loops over all n rows alone; and
 * the sums keep one fixed order: no atomics, the same bits on every run.
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
 * Checked by dev/cuda/encoder.cu and test_gpt.cu. */
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

#endif /* GPTC_CUDA_ENCODER_CUH */
