/*
 * dev/cuda/classifier.cu — the fused classifier: softmax + cross-entropy +
 * dlogits over rows of Vp bf16 logits, without storing the probabilities.
 *
 * CPU reference: train_gpt.c's crossentropy_softmax_forward then
 * crossentropy_softmax_backward (fp32, on the same bf16-rounded logits).
 * Production kernels: gptc/cuda/classifier.cuh.
 * Variants:
 *   1  naive: one thread per row (max, sum, then the gradient: three passes)
 *   2  scalar: classifier_scalar_gpu (one block per row, online max/sum, two
 *      passes, 2-byte loads; production's path for Vp % 8 != 0)
 *   3  production: classifier_gpu (the same two passes with 16-byte loads
 *      and stores, 4 loads in flight per thread in the writing pass); with
 *      Vp % 8 != 0 it is variant 2
 * Timings on a GPU: dev/cuda/RESULTS.md.
 * Bytes moved: the logits are read twice and written once (3 x N x Vp x 2);
 * the timed runs include the device-to-device copy that restores the input
 * (2 x N x Vp x 2 more, counted too).
 *
 * Build and run (from the repository root):
 *   make dev/cuda/classifier                 (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/classifier            # every variant at N = 8 x 1024 rows, V = 50257, Vp = 50304
 *   ./dev/cuda/classifier 2          # only variant 2
 *   ./dev/cuda/classifier 0 27 131 256   # all variants, N = 27, V = 131, Vp = 256 (the tiny fixture's shape)
 *   ./dev/cuda/classifier 0 5 13 21      # Vp % 8 != 0: the scalar fallback
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"            // the CPU reference; Rng, xmalloc_floats, CHECK
#include "gptc/cuda/common.cuh"  // CUDA_CHECK, KERNEL_CHECK, floatX, ceil_div, Pack8
#include "gptc/cuda/classifier.cuh" // classifier_gpu, classifier_scalar_gpu, online_merge
#include "dev/cuda/common.h"

/* variant 1: one thread per row */
__global__ void classifier_naive_kernel(floatX* logits, float* losses, const int* targets, int N, int V, int Vp,
                                        float dloss) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    floatX* x = logits + (size_t)row * Vp;
    float m = -INFINITY;
    for (int v = 0; v < V; v++) m = fmaxf(m, __bfloat162float(x[v]));
    float s = 0.0f;
    for (int v = 0; v < V; v++) s += expf(__bfloat162float(x[v]) - m);
    int t = targets[row];
    losses[row] = m + logf(s) - __bfloat162float(x[t]);
    for (int v = 0; v < Vp; v++) {
        float p = v < V ? expf(__bfloat162float(x[v]) - m) / s : 0.0f;
        x[v] = __float2bfloat16((p - (v == t ? 1.0f : 0.0f)) * dloss);
    }
}

typedef struct {
    int variant, N, V, Vp;
    floatX *logits, *pristine;
    float* losses;
    int* targets;
    float dloss;
} ClsCtx;

static void run_variant(void* p) {
    ClsCtx* c = (ClsCtx*)p;
    /* the kernel overwrites its input: start each run from the same logits */
    CUDA_CHECK(cudaMemcpyAsync(c->logits, c->pristine, (size_t)c->N * c->Vp * sizeof(floatX), cudaMemcpyDeviceToDevice, 0));
    if (c->variant == 1) {
        classifier_naive_kernel<<<ceil_div(c->N, 64), 64>>>(c->logits, c->losses, c->targets, c->N, c->V, c->Vp, c->dloss);
        KERNEL_CHECK();
    } else if (c->variant == 2) {
        classifier_scalar_gpu(c->logits, c->losses, c->targets, c->N, c->V, c->Vp, c->dloss, 0);
    } else {
        classifier_gpu(c->logits, c->losses, c->targets, c->N, c->V, c->Vp, c->dloss, 0);
    }
}

int main(int argc, char** argv) {
    require_device("classifier");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int N = argc > 4 ? atoi(argv[2]) : 8 * 1024, V = argc > 4 ? atoi(argv[3]) : 50257, Vp = argc > 4 ? atoi(argv[4]) : 50304;
    CHECK(N > 0 && V > 0 && Vp >= V, "need N > 0, 0 < V <= Vp");
    printf("N = %d rows, V = %d, Vp = %d\n", N, V, Vp);
    size_t n = (size_t)N * Vp;
    float* logits = random_floats(n, -8.0f, 8.0f, 1);
    for (int i = 0; i < N; i++)
        for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = 0.0f; /* pad columns, as wte's zero rows make them */
    int* targets = (int*)xmalloc(sizeof(int) * (size_t)N);
    Rng rng;
    rng_init(&rng, 7);
    for (int i = 0; i < N; i++) targets[i] = (int)(rng_u32(&rng) % (uint32_t)V);
    ClsCtx ctx;
    ctx.N = N; ctx.V = V; ctx.Vp = Vp; ctx.dloss = 1.0f / N;
    ctx.pristine = to_device_bf16(logits, n); /* rounds `logits` to bf16 for the reference too */
    CUDA_CHECK(cudaMalloc((void**)&ctx.logits, n * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.losses, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.targets, N * sizeof(int)));
    CUDA_CHECK(cudaMemcpy(ctx.targets, targets, N * sizeof(int), cudaMemcpyHostToDevice));

    /* CPU reference: probabilities and losses in place, then dlogits */
    float* ref = xmalloc_floats(n);
    memcpy(ref, logits, n * sizeof(float));
    float* ref_losses = xmalloc_floats(N);
    crossentropy_softmax_forward(ref, ref_losses, targets, N, V, Vp);
    crossentropy_softmax_backward(ref, targets, N, Vp, ctx.dloss);

    L2Flush flush;
    l2flush_init(&flush);
    double peak = peak_bandwidth_gbs();
    int ok = 1;
    static const char* const names[4] = {"", "variant 1 (naive, thread per row)",
                                         "variant 2 (scalar fallback)",
                                         "variant 3 (production, 16-byte)"};
    for (int v = 1; v <= 3; v++) {
        if (only && v != only) continue;
        ctx.variant = v;
        printf("%s\n", names[v]);
        run_variant(&ctx);
        float* gl = from_device_f32(ctx.losses, N);
        float* gd = from_device_bf16(ctx.logits, n);
        ok &= validate("losses (fp32)", gl, ref_losses, N, 1e-4, 1e-4);
        /* dlogits are bf16: atol relative to the scale dloss */
        ok &= validate("dlogits (bf16)", gd, ref, n, 1e-3 * ctx.dloss, 1e-2);
        free(gl);
        free(gd);
        double ms = time_kernel(&flush, v == 1 ? 3 : 20, run_variant, &ctx);
        /* the device-to-device copy that restores the input is timed too, and counted in the bytes */
        char label[80];
        snprintf(label, sizeof(label), "%s + input copy", names[v]);
        print_timing(label, ms, 3.0 * n * 2 + 2.0 * n * 2, peak);
    }
    l2flush_free(&flush);
    printf("%s\n", ok ? "classifier: all variants valid" : "classifier: FAILED");
    return ok ? 0 : 1;
}
