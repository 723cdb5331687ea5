/*
 * dev/cuda/gelu.cu — GELU (tanh form) forward and backward, bf16 in and out,
 * fp32 arithmetic: the MLP's activation when it is not fused into the
 * cuBLASLt epilogues (--gelu-fusion 0).
 *
 * CPU reference: train_gpt.c's gelu_forward / gelu_backward (fp32, on the
 * same bf16-rounded inputs).
 * Variants (forward and backward alike):
 *   1  naive: the textbook form 0.5 x (1 + tanh u) with tanhf (Hendrycks &
 *      Gimpel 2016, eq. for the tanh approximation), one thread per element
 *   2  one element per thread: production's gelu_forward_kernel /
 *      gelu_backward_kernel (the sigmoid form x / (1 + exp(-2u))), the
 *      production fallback for unaligned pointers
 *   3  production: gelu_forward_gpu / gelu_backward_gpu (gptc/cuda/gelu.cuh),
 *      8 bf16 per thread, one 16-byte load per input and one 16-byte store
 *      (Pack8), the last N % 8 one at a time; the same formula, so bit for
 *      bit variant 2 (checked)
 * The backward runs in place (dinp == dout), as train_gpt.cu calls it.
 * Bytes moved: forward 2 x N x 2, backward 3 x N x 2.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/gelu               (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/gelu                  # every variant, N = B*T*4C = 16 x 1024 x 3072
 *   ./dev/cuda/gelu 3                # only variant 3
 *   ./dev/cuda/gelu 0 1001           # every variant at N = 1001 (a tail of 1 for variant 3)
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"            // the CPU reference; Rng, xmalloc_floats, CHECK
#include "gptc/cuda/common.cuh"  // CUDA_CHECK, KERNEL_CHECK, floatX, ceil_div, Pack8
#include "gptc/cuda/gelu.cuh" // gelu_forward_gpu, gelu_backward_gpu, gelu_forward_kernel, gelu_backward_kernel
#include "dev/cuda/common.h"

/* variant 1: gelu(x) = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3) */
__global__ void gelu_forward_naive_kernel(floatX* out, const floatX* inp, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = __bfloat162float(inp[i]);
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    out[i] = __float2bfloat16(0.5f * x * (1.0f + tanhf(u)));
}

/* gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx */
__global__ void gelu_backward_naive_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = __bfloat162float(inp[i]);
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] = __float2bfloat16(__bfloat162float(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du));
}

typedef struct {
    int variant;
    long long N;
    floatX *inp, *out, *grad; /* (N) each; grad: dout in, dinp out (in place) */
} GeluCtx;

static void run_forward(void* p) {
    GeluCtx* c = (GeluCtx*)p;
    if (c->variant == 1) {
        gelu_forward_naive_kernel<<<ceil_div(c->N, 256), 256>>>(c->out, c->inp, c->N);
        KERNEL_CHECK();
    } else if (c->variant == 2) {
        gelu_forward_kernel<<<ceil_div(c->N, 256), 256>>>(c->out, c->inp, c->N);
        KERNEL_CHECK();
    } else { /* 3: production (8 per thread when aligned) */
        gelu_forward_gpu(c->out, c->inp, c->N, 0);
    }
}

static void run_backward(void* p) {
    GeluCtx* c = (GeluCtx*)p;
    if (c->variant == 1) {
        gelu_backward_naive_kernel<<<ceil_div(c->N, 256), 256>>>(c->grad, c->inp, c->grad, c->N);
        KERNEL_CHECK();
    } else if (c->variant == 2) {
        gelu_backward_kernel<<<ceil_div(c->N, 256), 256>>>(c->grad, c->inp, c->grad, c->N);
        KERNEL_CHECK();
    } else { /* 3: production */
        gelu_backward_gpu(c->grad, c->inp, c->grad, c->N, 0);
    }
}

int main(int argc, char** argv) {
    require_device("gelu");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    long long N = argc > 2 ? atoll(argv[2]) : 16LL * 1024 * 4 * 768;
    CHECK(N > 0, "N = %lld: give a positive number of elements", N);
    printf("N = %lld elements\n", N);
    /* x over GELU's interesting range (its tails and the minimum near -0.75) */
    float* x = random_floats((size_t)N, -6.0f, 6.0f, 1);
    float* dy = random_floats((size_t)N, -1.0f, 1.0f, 2);
    GeluCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.N = N;
    ctx.inp = to_device_bf16(x, (size_t)N);
    floatX* dout = to_device_bf16(dy, (size_t)N); /* the pristine dout: the backward overwrites ctx.grad */
    CUDA_CHECK(cudaMalloc((void**)&ctx.out, (size_t)N * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.grad, (size_t)N * sizeof(floatX)));

    float* y = xmalloc_floats((size_t)N);
    float* dx = xmalloc_floats((size_t)N);
    gelu_forward(y, x, (size_t)N);
    gelu_backward(dx, x, dy, (size_t)N);

    L2Flush flush;
    l2flush_init(&flush);
    double peak = peak_bandwidth_gbs();
    int ok = 1;
    float *ref_y = NULL, *ref_dx = NULL; /* variant 2's, for variant 3's bit check */
    const int order[3] = {2, 1, 3};
    for (int k = 0; k < 3; k++) {
        int var = order[k];
        if (only && var != only && !(var == 2 && only == 3)) continue;
        int show = !only || only == var;
        ctx.variant = var;
        CUDA_CHECK(cudaMemset(ctx.out, 0xff, (size_t)N * sizeof(floatX))); /* NaN: an element never written fails */
        run_forward(&ctx);
        CUDA_CHECK(cudaMemcpy(ctx.grad, dout, (size_t)N * sizeof(floatX), cudaMemcpyDeviceToDevice));
        run_backward(&ctx);
        float* gy = from_device_bf16(ctx.out, (size_t)N);
        float* gdx = from_device_bf16(ctx.grad, (size_t)N);
        if (show) {
            printf("variant %d (%s)\n", var,
                   var == 1   ? "naive, tanhf"
                   : var == 2 ? "thread per element (the unaligned fallback)"
                              : "production, 8 per thread (16-byte)");
            /* one bf16 rounding (2^-8 relative at most) of an fp32 value whose
             * own error (expf or tanhf against train_gpt.c's exp_fast) is far
             * smaller; atol for the cancellation near gelu'(x) = 0 */
            ok &= validate("out (bf16)", gy, y, (size_t)N, 1e-6, 4e-3);
            ok &= validate("dinp (bf16, in place)", gdx, dx, (size_t)N, 1e-5, 4e-3);
            if (var == 3) {
                ok &= same_bits("out", gy, ref_y, (size_t)N);
                ok &= same_bits("dinp", gdx, ref_dx, (size_t)N);
            }
        }
        if (var == 2) {
            ref_y = gy;
            ref_dx = gdx;
        } else {
            free(gy);
            free(gdx);
        }
        if (show) {
            char name[64];
            snprintf(name, sizeof(name), "forward variant %d", var);
            print_timing(name, time_kernel(&flush, 20, run_forward, &ctx), 2.0 * N * sizeof(floatX), peak);
            snprintf(name, sizeof(name), "backward variant %d", var);
            print_timing(name, time_kernel(&flush, 20, run_backward, &ctx), 3.0 * N * sizeof(floatX), peak);
        }
    }
    l2flush_free(&flush);
    printf("%s\n", ok ? "gelu: all variants valid" : "gelu: FAILED");
    free(ref_y); free(ref_dx); free(x); free(dy); free(y); free(dx);
    CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.out)); CUDA_CHECK(cudaFree(ctx.grad)); CUDA_CHECK(cudaFree(dout));
    return ok ? 0 : 1;
}
