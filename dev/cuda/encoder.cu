/*
 * dev/cuda/encoder.cu — the embedding: forward out = wte[token] + wpe[t]
 * (bf16), backward dwte[token] += dout, dwpe[t] += dout (fp32 gradients).
 *
 * CPU reference: train_gpt.c's encoder_forward / encoder_backward (fp32, on
 * the same bf16-rounded inputs).
 * Variants, forward:
 *   1  naive: one thread per output element
 *   2  production: encoder_forward_gpu (gptc/cuda/encoder.cuh; 8 channels
 *      per thread, 16-byte loads and stores, when C % 8 == 0)
 * Variants, backward:
 *   1  naive: one thread per (position, channel), atomicAdd into dwte and
 *      dwpe (not deterministic: the order of the additions varies per run)
 *   2  one block per token: the host groups the positions by token
 *      (encoder_buckets_build, not timed: it runs on the host while the GPU
 *      works), one block sums each
 *      token's bucket (encoder_backward_wte_bucket_kernel, below), the
 *      grid fixed at min(B*T, V) blocks as under CUDA graphs;
 *      encoder_backward_wpe_kernel sums over b
 *   3  production: chunked buckets (gptc/cuda/encoder.cuh): a bucket longer
 *      than ENC_CHUNK positions is cut into chunks of ENC_CHUNK (on the host,
 *      encoder_chunks_build, not timed), one block per chunk
 *      (encoder_backward_wte_gpu: fixed grids, blocks striding over the
 *      chunks); a bucket of one chunk adds into dwte at once, the partial
 *      sums of a longer one are added by a second kernel in chunk order (so
 *      still deterministic); the wpe kernel is production's. A frequent
 *      token's bucket then spreads over many blocks instead of one.
 * Variants 2 and 3 are checked to be deterministic (two runs, the same bits).
 * Each runs on two batches: tokens uniform over the vocabulary, and one where
 * half of the positions hold the same token (the production backward's
 * block for that token then sums B*T/2 rows alone: the long bucket).
 * Bytes moved (the minimum): forward, wte and wpe rows read, out written
 * (3 x B*T*C x 2); backward, dout read once (B*T*C x 2), the dwte rows of the
 * distinct tokens and dwpe read and written (fp32).
 *
 * It includes the whole of train_gpt.cu, not only gptc/cuda/encoder.cuh:
 * variant 3 sizes its chunk arrays with the trainer's own
 * gpu_step_input_sizes (StepInputs), so that the lab runs the bounds
 * production allocates.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/encoder            (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/encoder               # every variant, B=16 T=1024 C=768 V=50257
 *   ./dev/cuda/encoder 3             # only variant 3 (the production backward; the forwards are 1 and 2)
 *   ./dev/cuda/encoder 0 3 7 20 11   # every variant at B=3 T=7 C=20 V=11 (C % 8 != 0: one channel per thread)
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu" // gptc/cuda/encoder.cuh, gpu_step_input_sizes; train_gpt.c
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

/* backward variant 2: one block per distinct token sums its bucket, in
 * position order; the grid is fixed (min(B*T, V) blocks, as many as there
 * can be distinct tokens) and the blocks past `*num_buckets` return. A
 * token of half the positions is one block's serial loop over B*T/2 rows.
 *   dwte[tok] += sum over positions p with inp[p] == tok of dout[p] */
__global__ void encoder_backward_wte_bucket_kernel(float* dwte, const floatX* dout, const int* num_buckets,
                                                   const int* bucket_token, const int* bucket_start,
                                                   const int* bucket_pos, int C) {
    int b = blockIdx.x;
    if (b >= num_buckets[0]) return;
    int tok = bucket_token[b], p0 = bucket_start[b], p1 = bucket_start[b + 1];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int i = p0; i < p1; i++) acc += __bfloat162float(dout[(size_t)bucket_pos[i] * C + c]);
        dwte[(size_t)tok * C + c] += acc;
    }
}

typedef struct {
    int variant, B, T, C, V, num_buckets;
    int* num_buckets_dev;                         /* (1) the same, where variant 2's kernel reads it */
    EncoderChunks chunks;                         /* variant 3's, on the device (bucket_pos: the one below) */
    float* partial;                               /* (encoder_max_partials(B*T), C) variant 3's partial sums */
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
    } else if (c->variant == 3) { /* as gpu_backward launches them */
        encoder_backward_wte_gpu(c->dwte, c->partial, c->dout, c->chunks, BT, c->V, c->C, 0);
        encoder_backward_wpe_kernel<<<ceil_div((long long)c->T * c->C, 256), 256>>>(c->dwpe, c->dout, c->B, c->T, c->C);
        KERNEL_CHECK();
    } else {
        int max_buckets = BT < c->V ? BT : c->V; /* the fixed grid; blocks past the count return */
        encoder_backward_wte_bucket_kernel<<<max_buckets, 256>>>(c->dwte, c->dout, c->num_buckets_dev,
                                                                 c->bucket_token, c->bucket_start, c->bucket_pos, c->C);
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
    /* variant 3's chunks: StepInputs' sizes (gpu_step_input_sizes), here and on the device */
    size_t en[NUM_STEP_INPUTS], eb[NUM_STEP_INPUTS];
    gpu_step_input_sizes(en, eb, B, T, V);
    size_t* cn = en + 2; /* the EncoderChunks entries */
    EncoderChunks hc;
    int** hp = (int**)&hc;
    int** dp = (int**)&ctx.chunks;
    hp[0] = NULL; /* bucket_pos: the lab's own, below */
    for (int i = 1; i < NUM_ENCODER_CHUNKS; i++) {
        hp[i] = (int*)xmalloc(cn[i] * sizeof(int) + 1); /* (long_token has 0 entries when B*T <= ENC_CHUNK) */
        dp[i] = NULL;
        if (cn[i]) CUDA_CHECK(cudaMalloc((void**)&dp[i], cn[i] * sizeof(int)));
    }
    ctx.chunks.bucket_pos = ctx.bucket_pos;
    size_t partial_rows = (size_t)encoder_max_partials(BT);
    if (partial_rows) CUDA_CHECK(cudaMalloc((void**)&ctx.partial, partial_rows * C * sizeof(float)));
    printf("variant 3's bounds: %zu chunks, %zu tokens of several, %zu partial rows (%.1f MB) at most\n", cn[2],
           cn[4], partial_rows, partial_rows * C * 4.0 / 1048576.0);
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
        encoder_chunks_build(hc, bucket_token, bucket_start, nb, BT, V);
        for (int i = 1; i < NUM_ENCODER_CHUNKS; i++) /* (all of each array: the lab does not time the copies) */
            if (cn[i]) CUDA_CHECK(cudaMemcpy(dp[i], hp[i], cn[i] * sizeof(int), cudaMemcpyHostToDevice));
        printf("batch %d: %s; %d distinct tokens, the longest bucket %d positions (%d chunks of <= %d; %d buckets of "
               "several)\n", batch + 1, batch == 0 ? "tokens uniform over the vocabulary" : "half of the positions one token",
               nb, longest, hc.num_chunks[0], ENC_CHUNK, hc.num_long[0]);

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
                   var == 1 ? "naive, atomicAdd" : var == 2 ? "one block per token" : "production, chunked token buckets");
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
    for (int i = 1; i < NUM_ENCODER_CHUNKS; i++) {
        free(hp[i]);
        if (dp[i]) CUDA_CHECK(cudaFree(dp[i]));
    }
    if (ctx.partial) CUDA_CHECK(cudaFree(ctx.partial));
    CUDA_CHECK(cudaFree(ctx.wte)); CUDA_CHECK(cudaFree(ctx.wpe)); CUDA_CHECK(cudaFree(ctx.dout));
    CUDA_CHECK(cudaFree(ctx.out)); CUDA_CHECK(cudaFree(ctx.dwte)); CUDA_CHECK(cudaFree(ctx.dwpe));
    CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.num_buckets_dev)); CUDA_CHECK(cudaFree(ctx.bucket_token)); CUDA_CHECK(cudaFree(ctx.bucket_start));
    CUDA_CHECK(cudaFree(ctx.bucket_pos));
    return ok ? 0 : 1;
}
