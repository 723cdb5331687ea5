/*
 * dev/cuda/encoder.cu — the embedding: forward out = wte[token] + wpe[t]
 * (bf16), backward dwte[token] += dout, dwpe[t] += dout (fp32 gradients).
 *
 * STATUS: not yet run on a GPU; validated on the CPU in every make test
 * (dev/cuda/cpu).
 *
 * CPU reference: train_gpt.c's encoder_forward / encoder_backward (fp32, on
 * the same bf16-rounded inputs).
 * Variants, forward:
 *   1  naive: one thread per output element
 *   2  production: encoder_forward_gpu from train_gpt.cu (8 channels per
 *      thread, 16-byte loads and stores, when C % 8 == 0)
 * Variants, backward:
 *   1  naive: one thread per (position, channel), atomicAdd into dwte and
 *      dwpe (not deterministic: the order of the additions varies per run)
 *   2  production: train_gpt.cu's deterministic pair: the host groups the
 *      positions by token (encoder_buckets_build, not timed: it runs on the
 *      host while the GPU works), encoder_backward_wte_kernel sums each
 *      token's bucket in one block, encoder_backward_wpe_kernel sums over b
 *   3  chunked buckets: a bucket longer than ENC_CHUNK positions is cut into
 *      chunks of ENC_CHUNK (on the host, with the buckets), one block per
 *      chunk; a bucket of one chunk adds into dwte at once, the partial sums
 *      of a longer one are added by a second kernel in chunk order (so still
 *      deterministic); the wpe kernel is production's. A frequent token's
 *      bucket then spreads over many blocks instead of one.
 * Variants 2 and 3 are checked to be deterministic (two runs, the same bits).
 * Each runs on two batches: tokens uniform over the vocabulary, and one where
 * half of the positions hold the same token (the production backward's
 * block for that token then sums B*T/2 rows alone: the long bucket).
 * Bytes moved (the minimum): forward, wte and wpe rows read, out written
 * (3 x B*T*C x 2); backward, dout read once (B*T*C x 2), the dwte rows of the
 * distinct tokens and dwpe read and written (fp32).
 *
 * Build and run (from the repository root):
 *   make dev/cuda/encoder            (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/encoder               # every variant, B=16 T=1024 C=768 V=50257
 *   ./dev/cuda/encoder 2             # only the production variants
 *   ./dev/cuda/encoder 0 3 7 20 11   # every variant at B=3 T=7 C=20 V=11 (C % 8 != 0: one channel per thread)
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu"
#include "dev/cuda/common.h"

/* forward variant 1: one thread per (bt, c) */
__global__ void encoder_forward_naive_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, int BT,
                                             int T, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C);
    out[idx] = __float2bfloat16(__bfloat162float(wte[(size_t)inp[bt] * C + c]) +
                                __bfloat162float(wpe[(size_t)(bt % T) * C + c]));
}

/* backward variant 1: one thread per (bt, c), two atomic adds */
__global__ void encoder_backward_naive_kernel(float* dwte, float* dwpe, const floatX* dout, const int* inp, int BT,
                                              int T, int C) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)BT * C) return;
    int bt = (int)(idx / C), c = (int)(idx % C);
    float d = __bfloat162float(dout[idx]);
    atomicAdd(&dwte[(size_t)inp[bt] * C + c], d);
    atomicAdd(&dwpe[(size_t)(bt % T) * C + c], d);
}

/* backward variant 3: the bucket of a frequent token (B*T/2 positions in the
 * second batch below) is one block's serial loop in production; here it is
 * cut into chunks of at most ENC_CHUNK positions, one block each. */
#define ENC_CHUNK 64

/* One block per chunk: acc(c) = sum over the chunk's positions, in order, of
 * dout[pos][c]. A bucket of one chunk adds acc into dwte[token]; a longer
 * one writes it to partial[chunk] (C floats) for the finishing kernel. */
__global__ void encoder_backward_wte_chunk_kernel(float* dwte, float* partial, const floatX* dout,
                                                  const int* chunk_bucket, const int* chunk_start,
                                                  const int* bucket_token, const int* bucket_start,
                                                  const int* bucket_pos, int C) {
    int ch = blockIdx.x, b = chunk_bucket[ch];
    int p0 = chunk_start[ch], end = bucket_start[b + 1], p1 = p0 + ENC_CHUNK < end ? p0 + ENC_CHUNK : end;
    int single = end - bucket_start[b] <= ENC_CHUNK;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = p0; i < p1; i++) acc += __bfloat162float(dout[(size_t)bucket_pos[i] * C + c]);
        if (single) dwte[(size_t)bucket_token[b] * C + c] += acc;
        else partial[(size_t)ch * C + c] = acc;
    }
}

/* One block per bucket of several chunks: dwte[token] += the partials of its
 * chunks, in chunk order (the same sum on every run). */
__global__ void encoder_backward_wte_finish_kernel(float* dwte, const float* partial, const int* long_bucket,
                                                   const int* long_first_chunk, const int* long_num_chunks,
                                                   const int* bucket_token, int C) {
    int lb = blockIdx.x, tok = bucket_token[long_bucket[lb]];
    int c0 = long_first_chunk[lb], n = long_num_chunks[lb];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += partial[(size_t)(c0 + j) * C + c];
        dwte[(size_t)tok * C + c] += acc;
    }
}

/* Host: the chunks of the buckets (encoder_buckets_build's): each chunk's
 * bucket and first position, and the buckets longer than one chunk with
 * their first chunk and chunk count. Returns the number of chunks (at most
 * B*T: every chunk holds a position). */
static int encoder_chunks_build(const int* bucket_start, int nb, int* chunk_bucket, int* chunk_start,
                                int* long_bucket, int* long_first_chunk, int* long_num_chunks, int* num_long) {
    int nch = 0, nl = 0;
    for (int b = 0; b < nb; b++) {
        int len = bucket_start[b + 1] - bucket_start[b], k = (len + ENC_CHUNK - 1) / ENC_CHUNK;
        if (k > 1) {
            long_bucket[nl] = b;
            long_first_chunk[nl] = nch;
            long_num_chunks[nl] = k;
            nl++;
        }
        for (int j = 0; j < k; j++) {
            chunk_bucket[nch] = b;
            chunk_start[nch] = bucket_start[b] + j * ENC_CHUNK;
            nch++;
        }
    }
    *num_long = nl;
    return nch;
}

typedef struct {
    int variant, B, T, C, V, num_buckets;
    int* num_buckets_dev;                                     /* (1) the same, where the production kernel reads it */
    int num_chunks, num_long;
    int *chunk_bucket, *chunk_start;                          /* (B*T) at most: variant 3's chunks */
    int *long_bucket, *long_first_chunk, *long_num_chunks;    /* (B*T) at most: its buckets of several chunks */
    float* partial;                                           /* (B*T, C) at most */
    int* inp;                                     /* (B*T) tokens */
    int *bucket_token, *bucket_start, *bucket_pos; /* (B*T), (B*T + 1), (B*T): encoder_buckets_build's */
    floatX *wte, *wpe, *out, *dout;               /* (V, C), (T, C), (B*T, C), (B*T, C) */
    float *dwte, *dwpe;                           /* (V, C), (T, C) */
} EncCtx;

static void run_forward(void* p) {
    EncCtx* c = (EncCtx*)p;
    int BT = c->B * c->T;
    if (c->variant == 1) {
        encoder_forward_naive_kernel<<<ceil_div((long long)BT * c->C, 256), 256>>>(c->out, c->inp, c->wte, c->wpe, BT,
                                                                                   c->T, c->C);
        KERNEL_CHECK();
    } else {
        encoder_forward_gpu(c->out, c->inp, c->wte, c->wpe, c->B, c->T, c->C, 0);
    }
}

static void run_backward(void* p) {
    EncCtx* c = (EncCtx*)p;
    int BT = c->B * c->T;
    if (c->variant == 1) {
        encoder_backward_naive_kernel<<<ceil_div((long long)BT * c->C, 256), 256>>>(c->dwte, c->dwpe, c->dout, c->inp,
                                                                                    BT, c->T, c->C);
        KERNEL_CHECK();
    } else if (c->variant == 3) {
        encoder_backward_wte_chunk_kernel<<<c->num_chunks, 256>>>(c->dwte, c->partial, c->dout, c->chunk_bucket,
                                                                  c->chunk_start, c->bucket_token, c->bucket_start,
                                                                  c->bucket_pos, c->C);
        KERNEL_CHECK();
        if (c->num_long > 0) {
            encoder_backward_wte_finish_kernel<<<c->num_long, 256>>>(c->dwte, c->partial, c->long_bucket,
                                                                     c->long_first_chunk, c->long_num_chunks,
                                                                     c->bucket_token, c->C);
            KERNEL_CHECK();
        }
        encoder_backward_wpe_kernel<<<ceil_div((long long)c->T * c->C, 256), 256>>>(c->dwpe, c->dout, c->B, c->T, c->C);
        KERNEL_CHECK();
    } else { /* as gpu_backward launches them */
        int BT = c->B * c->T, max_buckets = BT < c->V ? BT : c->V; /* the fixed grid; blocks past the count return */
        encoder_backward_wte_kernel<<<max_buckets, 256>>>(c->dwte, c->dout, c->num_buckets_dev, c->bucket_token,
                                                          c->bucket_start, c->bucket_pos, c->C);
        KERNEL_CHECK();
        encoder_backward_wpe_kernel<<<ceil_div((long long)c->T * c->C, 256), 256>>>(c->dwpe, c->dout, c->B, c->T, c->C);
        KERNEL_CHECK();
    }
}

int main(int argc, char** argv) {
    require_device("encoder");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int B = argc > 5 ? atoi(argv[2]) : 16, T = argc > 5 ? atoi(argv[3]) : 1024, C = argc > 5 ? atoi(argv[4]) : 768;
    int V = argc > 5 ? atoi(argv[5]) : 50257;
    CHECK(B > 0 && T > 0 && C > 0 && V > 1, "B=%d T=%d C=%d V=%d: give positive sizes and V >= 2", B, T, C, V);
    int BT = B * T;
    printf("B = %d, T = %d, C = %d, V = %d (forward %s)\n", B, T, C, V,
           C % 8 == 0 ? "8 channels per thread" : "one channel per thread: C % 8 != 0");
    float* wte = random_floats((size_t)V * C, -1.0f, 1.0f, 1);
    float* wpe = random_floats((size_t)T * C, -1.0f, 1.0f, 2);
    float* dout = random_floats((size_t)BT * C, -1.0f, 1.0f, 3);
    float* dwte0 = random_floats((size_t)V * C, -1.0f, 1.0f, 4); /* the gradients it adds into */
    float* dwpe0 = random_floats((size_t)T * C, -1.0f, 1.0f, 5);
    EncCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.B = B; ctx.T = T; ctx.C = C; ctx.V = V;
    ctx.wte = to_device_bf16(wte, (size_t)V * C);
    ctx.wpe = to_device_bf16(wpe, (size_t)T * C);
    ctx.dout = to_device_bf16(dout, (size_t)BT * C);
    CUDA_CHECK(cudaMalloc((void**)&ctx.out, (size_t)BT * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.dwte, (size_t)V * C * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.dwpe, (size_t)T * C * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.inp, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.bucket_token, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.num_buckets_dev, sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.bucket_start, (size_t)(BT + 1) * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.bucket_pos, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.chunk_bucket, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.chunk_start, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.long_bucket, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.long_first_chunk, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.long_num_chunks, (size_t)BT * sizeof(int)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.partial, (size_t)BT * C * sizeof(float)));
    int* chunk_bucket = (int*)xmalloc((size_t)BT * sizeof(int));
    int* chunk_start = (int*)xmalloc((size_t)BT * sizeof(int));
    int* long_bucket = (int*)xmalloc((size_t)BT * sizeof(int));
    int* long_first_chunk = (int*)xmalloc((size_t)BT * sizeof(int));
    int* long_num_chunks = (int*)xmalloc((size_t)BT * sizeof(int));
    int* inp = (int*)xmalloc((size_t)BT * sizeof(int));
    int* count = (int*)xmalloc((size_t)V * sizeof(int));
    int* bucket_token = (int*)xmalloc((size_t)BT * sizeof(int));
    int* bucket_start = (int*)xmalloc((size_t)(BT + 1) * sizeof(int));
    int* bucket_pos = (int*)xmalloc((size_t)BT * sizeof(int));
    float* out = xmalloc_floats((size_t)BT * C);
    float* dwte = xmalloc_floats((size_t)V * C);
    float* dwpe = xmalloc_floats((size_t)T * C);

    L2Flush flush;
    l2flush_init(&flush);
    double peak = peak_bandwidth_gbs();
    int ok = 1;
    for (int batch = 0; batch < 2; batch++) {
        /* the tokens: uniform, or half of them one token (V - 1: GPT-2's end of text) */
        Rng rng;
        rng_init(&rng, 10 + batch);
        for (int i = 0; i < BT; i++) {
            inp[i] = (int)(rng_uniform(&rng) * V);
            if (inp[i] >= V) inp[i] = V - 1;
            if (batch == 1 && rng_uniform(&rng) < 0.5f) inp[i] = V - 1;
        }
        CUDA_CHECK(cudaMemcpy(ctx.inp, inp, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice));
        int nb = encoder_buckets_build(inp, BT, V, count, bucket_token, bucket_start, bucket_pos);
        int longest = 0;
        for (int b = 0; b < nb; b++)
            if (bucket_start[b + 1] - bucket_start[b] > longest) longest = bucket_start[b + 1] - bucket_start[b];
        ctx.num_buckets = nb;
        CUDA_CHECK(cudaMemcpy(ctx.num_buckets_dev, &nb, sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(ctx.bucket_token, bucket_token, (size_t)nb * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(ctx.bucket_start, bucket_start, (size_t)(nb + 1) * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(ctx.bucket_pos, bucket_pos, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice));
        ctx.num_chunks = encoder_chunks_build(bucket_start, nb, chunk_bucket, chunk_start, long_bucket,
                                              long_first_chunk, long_num_chunks, &ctx.num_long);
        CUDA_CHECK(cudaMemcpy(ctx.chunk_bucket, chunk_bucket, (size_t)ctx.num_chunks * sizeof(int), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(ctx.chunk_start, chunk_start, (size_t)ctx.num_chunks * sizeof(int), cudaMemcpyHostToDevice));
        if (ctx.num_long > 0) {
            CUDA_CHECK(cudaMemcpy(ctx.long_bucket, long_bucket, (size_t)ctx.num_long * sizeof(int), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(ctx.long_first_chunk, long_first_chunk, (size_t)ctx.num_long * sizeof(int),
                                  cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(ctx.long_num_chunks, long_num_chunks, (size_t)ctx.num_long * sizeof(int),
                                  cudaMemcpyHostToDevice));
        }
        printf("batch %d: %s; %d distinct tokens, the longest bucket %d positions (%d chunks of <= %d; %d buckets of "
               "several)\n", batch + 1, batch == 0 ? "tokens uniform over the vocabulary" : "half of the positions one token",
               nb, longest, ctx.num_chunks, ENC_CHUNK, ctx.num_long);

        /* CPU references */
        encoder_forward(out, inp, wte, wpe, B, T, C);
        memcpy(dwte, dwte0, (size_t)V * C * sizeof(float));
        memcpy(dwpe, dwpe0, (size_t)T * C * sizeof(float));
        encoder_backward(dwte, dwpe, dout, inp, B, T, C);

        /* bytes: the forward reads two rows and writes one; the backward reads
         * dout once and reads and writes the rows it adds into */
        double fwd_bytes = 3.0 * BT * C * sizeof(floatX);
        double bwd_bytes = (double)BT * C * sizeof(floatX) + 2.0 * ((double)nb + T) * C * sizeof(float);
        for (int var = 1; var <= 3; var++) {
            if (only && var != only) continue;
            ctx.variant = var;
            char name[64];
            if (batch == 0 && var <= 2) { /* the forward does not depend on the batch's token counts */
                printf("forward variant %d (%s)\n", var, var == 1 ? "naive, thread per element" : "production");
                CUDA_CHECK(cudaMemset(ctx.out, 0xff, (size_t)BT * C * sizeof(floatX)));
                run_forward(&ctx);
                float* got = from_device_bf16(ctx.out, (size_t)BT * C);
                /* one bf16 rounding of an exact fp32 sum: half a unit in the last place, at most 2^-8 relative */
                ok &= validate("out (bf16)", got, out, (size_t)BT * C, 1e-6, 4e-3);
                free(got);
                snprintf(name, sizeof(name), "forward variant %d", var);
                print_timing(name, time_kernel(&flush, 20, run_forward, &ctx), fwd_bytes, peak);
            }
            printf("backward variant %d, batch %d (%s)\n", var, batch + 1,
                   var == 1 ? "naive, atomicAdd" : var == 2 ? "production, token buckets" : "chunked token buckets");
            CUDA_CHECK(cudaMemcpy(ctx.dwte, dwte0, (size_t)V * C * sizeof(float), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(ctx.dwpe, dwpe0, (size_t)T * C * sizeof(float), cudaMemcpyHostToDevice));
            run_backward(&ctx);
            float* gte = from_device_f32(ctx.dwte, (size_t)V * C);
            float* gpe = from_device_f32(ctx.dwpe, (size_t)T * C);
            /* fp32 sums of up to `longest` (dwte) or B (dwpe) terms of size <= 1
             * in another order than the CPU's: a rounding per term at most */
            ok &= validate("dwte (fp32, accumulated)", gte, dwte, (size_t)V * C, 1e-6 * (longest + 1), 1e-5);
            ok &= validate("dwpe (fp32, accumulated)", gpe, dwpe, (size_t)T * C, 1e-6 * (B + 1), 1e-5);
            if (var >= 2) { /* deterministic: a second run from the same gradients gives the same bits */
                CUDA_CHECK(cudaMemcpy(ctx.dwte, dwte0, (size_t)V * C * sizeof(float), cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(ctx.dwpe, dwpe0, (size_t)T * C * sizeof(float), cudaMemcpyHostToDevice));
                run_backward(&ctx);
                float* gte2 = from_device_f32(ctx.dwte, (size_t)V * C);
                float* gpe2 = from_device_f32(ctx.dwpe, (size_t)T * C);
                int same = !memcmp(gte, gte2, (size_t)V * C * sizeof(float)) &&
                           !memcmp(gpe, gpe2, (size_t)T * C * sizeof(float));
                printf("  %-28s %s  a second run gives %s bits\n", "deterministic", same ? "ok  " : "FAIL",
                       same ? "the same" : "other");
                ok &= same;
                free(gte2);
                free(gpe2);
            }
            free(gte);
            free(gpe);
            snprintf(name, sizeof(name), "backward variant %d", var);
            print_timing(name, time_kernel(&flush, 20, run_backward, &ctx), bwd_bytes, peak);
        }
    }
    l2flush_free(&flush);
    printf("%s\n", ok ? "encoder: all variants valid" : "encoder: FAILED");
    free(wte); free(wpe); free(dout); free(dwte0); free(dwpe0); free(inp); free(count);
    free(bucket_token); free(bucket_start); free(bucket_pos); free(out); free(dwte); free(dwpe);
    free(chunk_bucket); free(chunk_start); free(long_bucket); free(long_first_chunk); free(long_num_chunks);
    CUDA_CHECK(cudaFree(ctx.chunk_bucket)); CUDA_CHECK(cudaFree(ctx.chunk_start)); CUDA_CHECK(cudaFree(ctx.long_bucket));
    CUDA_CHECK(cudaFree(ctx.long_first_chunk)); CUDA_CHECK(cudaFree(ctx.long_num_chunks)); CUDA_CHECK(cudaFree(ctx.partial));
    CUDA_CHECK(cudaFree(ctx.wte)); CUDA_CHECK(cudaFree(ctx.wpe)); CUDA_CHECK(cudaFree(ctx.dout));
    CUDA_CHECK(cudaFree(ctx.out)); CUDA_CHECK(cudaFree(ctx.dwte)); CUDA_CHECK(cudaFree(ctx.dwpe));
    CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.num_buckets_dev)); CUDA_CHECK(cudaFree(ctx.bucket_token)); CUDA_CHECK(cudaFree(ctx.bucket_start));
    CUDA_CHECK(cudaFree(ctx.bucket_pos));
    return ok ? 0 : 1;
}
