/*
 * dev/cuda/matmul.cu — the forward matmuls of a transformer layer through
 * cuBLASLt, with the bias and GELU in its epilogues or in our own kernels:
 * out(N, OC) = inp(N, C) . weight(OC, C)^T + bias, then GELU for the MLP's
 * first matmul (its input kept as the aux output for the backward).
 *
 * STATUS: not yet run on a GPU; validated on the CPU in every make test
 * (dev/cuda/cpu, whose cuBLASLt stand-in is dev/cuda/cpu/cublaslt.cpp).
 *
 * CPU reference: train_gpt.c's matmul_forward (fp32, on the same
 * bf16-rounded inputs), then gelu_forward for the MLP's first matmul.
 * Problems (GPT-2 124M's layer shapes, N = B*T rows):
 *   qkv     C -> 3C   BIAS epilogue
 *   fc      C -> 4C   GELU_AUX_BIAS epilogue (out = gelu(pre), pre -> aux)
 *   fcproj 4C -> C    BIAS epilogue
 * Variants:
 *   1  naive: one thread per output element, fp32 dot product over C, bias
 *      and GELU in the same kernel
 *   2  production, fused: matmul_forward_gpu from train_gpt.cu, the bias and
 *      GELU in cuBLASLt's epilogue
 *   3  production, unfused: matmul_forward_gpu with every epilogue refused
 *      (LtContext.no_epilogues, as test_gpt.cu checks that path): a plain
 *      cuBLASLt GEMM, then bias_add_gpu and gelu_forward_gpu (bf16 rounded
 *      after each)
 * Timing: TFLOP/s (2 N C OC per matmul) beside the dense bf16 peak of the
 * device's datasheet (train_gpt.cu's gpu_peak_tflops).
 *
 * Build and run (from the repository root):
 *   make dev/cuda/matmul             (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/matmul                # every variant, N = 16 x 1024, C = 768
 *   ./dev/cuda/matmul 2              # only variant 2
 *   ./dev/cuda/matmul 0 13 20        # every variant at N = 13, C = 20 (rows of 40 bytes: 8-byte alignment)
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu"
#include "dev/cuda/common.h"

/* variant 1: out[n][oc] = sum_c inp[n][c] w[oc][c] + bias[oc]; with aux: aux = that (bf16), out = gelu(it) */
__global__ void matmul_forward_naive_kernel(floatX* out, floatX* aux, const floatX* inp, const floatX* weight,
                                            const floatX* bias, int N, int C, int OC) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * OC) return;
    int n = (int)(idx / OC), oc = (int)(idx % OC);
    const floatX* x = inp + (size_t)n * C;
    const floatX* w = weight + (size_t)oc * C;
    float acc = bias ? __bfloat162float(bias[oc]) : 0.0f;
    for (int c = 0; c < C; c++) acc += __bfloat162float(x[c]) * __bfloat162float(w[c]);
    if (aux) {
        aux[idx] = __float2bfloat16(acc);
        float u = GELU_SCALE * (acc + 0.044715f * acc * acc * acc);
        acc = acc / (1.0f + expf(-2.0f * u)); /* train_gpt.c's gelu_forward */
    }
    out[idx] = __float2bfloat16(acc);
}

typedef struct {
    const char* name;
    int C_mult, OC_mult, gelu; /* in and out channels as multiples of C; GELU epilogue */
} MatmulProblem;

static const MatmulProblem PROBLEMS[] = {
    {"qkv    (C -> 3C, BIAS)", 1, 3, 0},
    {"fc     (C -> 4C, GELU_AUX_BIAS)", 1, 4, 1},
    {"fcproj (4C -> C, BIAS)", 4, 1, 0},
};
#define NUM_PROBLEMS ((int)(sizeof(PROBLEMS) / sizeof(PROBLEMS[0])))

typedef struct {
    int variant, N, C, OC;
    LtContext *fused, *unfused;
    floatX *out, *aux, *inp, *weight, *bias; /* (N, OC), (N, OC) or NULL, (N, C), (OC, C), (OC) */
} MmCtx;

static void run_variant(void* p) {
    MmCtx* c = (MmCtx*)p;
    if (c->variant == 1) {
        matmul_forward_naive_kernel<<<ceil_div((long long)c->N * c->OC, 256), 256>>>(c->out, c->aux, c->inp, c->weight,
                                                                                    c->bias, c->N, c->C, c->OC);
        KERNEL_CHECK();
    } else {
        matmul_forward_gpu(c->variant == 2 ? c->fused : c->unfused, 0, c->out, c->inp, c->weight, c->bias, NULL, c->aux,
                           c->N, c->C, c->OC);
    }
}

static void print_tflops(const char* what, double ms, double flops, double peak_tflops) {
    double tf = flops / (ms * 1e-3) / 1e12;
    if (peak_tflops > 0)
        printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (%.0f%% of %.0f TFLOP/s, dense bf16 datasheet)\n", what, ms, tf,
               100 * tf / peak_tflops, peak_tflops);
    else printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (peak unknown for this device)\n", what, ms, tf);
}

int main(int argc, char** argv) {
    require_device("matmul");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int N = argc > 3 ? atoi(argv[2]) : 16 * 1024, C = argc > 3 ? atoi(argv[3]) : 768;
    CHECK(N > 0 && C > 0, "N=%d C=%d: give positive sizes", N, C);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double peak = gpu_peak_tflops(prop.name);
    printf("N = %d rows, C = %d\n", N, C);
    LtContext fused, unfused;
    lt_init(&fused, LT_WORKSPACE_BYTES, (size_t)4 * C);
    lt_init(&unfused, LT_WORKSPACE_BYTES, (size_t)4 * C);
    unfused.no_epilogues = 1;
    L2Flush flush;
    l2flush_init(&flush);
    int ok = 1;
    for (int pi = 0; pi < NUM_PROBLEMS; pi++) {
        const MatmulProblem* pb = &PROBLEMS[pi];
        int IC = pb->C_mult * C, OC = pb->OC_mult * C;
        printf("%s: (%d, %d) . (%d, %d)^T\n", pb->name, N, IC, OC, IC);
        /* inputs about a LayerNorm's output; weights U(-a, a) with a = 1/sqrt(IC) (outputs of order 1/sqrt(3)) */
        float a = 1.0f / sqrtf((float)IC);
        float* inp = random_floats((size_t)N * IC, -1.0f, 1.0f, 10 + pi);
        float* w = random_floats((size_t)OC * IC, -a, a, 20 + pi);
        float* b = random_floats(OC, -0.5f, 0.5f, 30 + pi);
        MmCtx ctx;
        memset(&ctx, 0, sizeof(ctx));
        ctx.N = N; ctx.C = IC; ctx.OC = OC;
        ctx.fused = &fused;
        ctx.unfused = &unfused;
        ctx.inp = to_device_bf16(inp, (size_t)N * IC);
        ctx.weight = to_device_bf16(w, (size_t)OC * IC);
        ctx.bias = to_device_bf16(b, OC);
        CUDA_CHECK(cudaMalloc((void**)&ctx.out, (size_t)N * OC * sizeof(floatX)));
        if (pb->gelu) CUDA_CHECK(cudaMalloc((void**)&ctx.aux, (size_t)N * OC * sizeof(floatX)));

        /* CPU reference */
        float* pre = xmalloc_floats((size_t)N * OC);
        matmul_forward(pre, inp, w, b, N, IC, OC);
        float* out = pre;
        if (pb->gelu) {
            out = xmalloc_floats((size_t)N * OC);
            gelu_forward(out, pre, (size_t)N * OC);
        }
        for (int var = 1; var <= 3; var++) {
            if (only && var != only) continue;
            ctx.variant = var;
            printf("variant %d (%s)\n", var,
                   var == 1 ? "naive, thread per output" : var == 2 ? "cuBLASLt, epilogue fused" : "cuBLASLt, then our bias/GELU kernels");
            CUDA_CHECK(cudaMemset(ctx.out, 0xff, (size_t)N * OC * sizeof(floatX))); /* NaN: never written fails */
            if (ctx.aux) CUDA_CHECK(cudaMemset(ctx.aux, 0xff, (size_t)N * OC * sizeof(floatX)));
            run_variant(&ctx);
            /* fp32 sums of IC products in another order than the CPU's, and one
             * bf16 rounding (2^-9 relative) fused, up to three unfused: after
             * the GEMM (of the product before the bias: as large as 2 here),
             * after the bias, after the GELU (its slope up to 1.13) */
            double atol = var == 3 ? 1e-2 : 5e-3;
            float* got = from_device_bf16(ctx.out, (size_t)N * OC);
            ok &= validate(pb->gelu ? "out = gelu(pre) (bf16)" : "out (bf16)", got, out, (size_t)N * OC, atol, 1e-2);
            free(got);
            if (ctx.aux) {
                float* gaux = from_device_bf16(ctx.aux, (size_t)N * OC);
                ok &= validate("aux = pre (bf16)", gaux, pre, (size_t)N * OC, atol, 1e-2);
                free(gaux);
            }
            char name[64];
            snprintf(name, sizeof(name), "variant %d", var);
            print_tflops(name, time_kernel(&flush, 20, run_variant, &ctx), 2.0 * N * IC * OC, peak);
        }
        free(inp); free(w); free(b); free(pre);
        if (pb->gelu) free(out);
        CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.weight)); CUDA_CHECK(cudaFree(ctx.bias));
        CUDA_CHECK(cudaFree(ctx.out));
        if (ctx.aux) CUDA_CHECK(cudaFree(ctx.aux));
    }
    l2flush_free(&flush);
    lt_free(&fused);
    lt_free(&unfused);
    printf("%s\n", ok ? "matmul: all variants valid" : "matmul: FAILED");
    return ok ? 0 : 1;
}
