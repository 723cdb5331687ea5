/*
 * dev/cuda/matmul.cu — the matmuls of a transformer layer through
 * cuBLASLt, with the bias and GELU in its epilogues or in our own kernels:
 * out(N, OC) = inp(N, C) . weight(OC, C)^T + bias, then GELU for the MLP's
 * first matmul (its input kept as the aux output for the backward).
 * On the CPU (make test), cuBLASLt is dev/cuda/cpu/cublaslt.cpp's stand-in.
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
 *   2  production, fused: matmul_forward_gpu (gptc/cuda/matmul.cuh), the bias and
 *      GELU in cuBLASLt's epilogue
 *   3  production, unfused: matmul_forward_gpu with every epilogue refused
 *      (LtContext.no_epilogues, as test_gpt.cu checks that path): a plain
 *      cuBLASLt GEMM, then bias_add_gpu and gelu_forward_gpu (bf16 rounded
 *      after each)
 * Backward (train_gpt.c's matmul_backward, then gelu_backward for the DGELU
 * case): dinp = dout . weight (bf16; times gelu'(aux) for fcproj, whose input
 * was gelu(aux)), dweight += dout^T . inp (fp32), dbias += column sums of dout
 * (fp32), on two problems:
 *   qkv     dout (N, 3C), inp (N, C)
 *   fcproj  dout (N, C), inp (N, 4C) = gelu(aux): the DGELU epilogue
 * Variants:
 *   1  naive: one thread per element of dinp, of dweight (a sum over N),
 *      of dbias
 *   2  production, fused: matmul_backward_gpu (DGELU in
 *      cuBLASLt's epilogue; the bias gradient by the column-sum kernels)
 *   3  production, unfused: the same with every epilogue refused (a plain
 *      GEMM, then gelu_backward_gpu in place)
 * Timing: median of 20 runs (5 for the slow naive variant), TFLOP/s (2 N C
 * OC per matmul; the backward is two) beside the dense bf16 peak of the
 * device's datasheet (train_gpt.cu's gpu_peak_tflops).
 *
 * It includes the whole of train_gpt.cu, not only gptc/cuda/matmul.cuh:
 * lt_init allocates through the trainer's device-memory ledger, and the
 * TFLOP/s figure needs train_gpt.cu's gpu_peak_tflops.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/matmul             (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/matmul                # every variant, N = 16 x 1024, C = 768
 *   ./dev/cuda/matmul 2              # only variant 2
 *   ./dev/cuda/matmul 0 13 20        # every variant at N = 13, C = 20 (rows of 40 bytes: 8-byte alignment)
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu" // gptc/cuda/matmul.cuh, the ledger, gpu_peak_tflops, LT_WORKSPACE_BYTES; train_gpt.c
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

/* backward variant 1: dinp[n][c] = sum_oc dout[n][oc] w[oc][c], times gelu'(aux[n][c]) when aux is given */
__global__ void matmul_backward_dinp_naive_kernel(floatX* dinp, const floatX* dout, const floatX* weight,
                                                  const floatX* aux, int N, int C, int OC) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * C) return;
    int n = (int)(idx / C), c = (int)(idx % C);
    float acc = 0.0f;
    for (int oc = 0; oc < OC; oc++) acc += __bfloat162float(dout[(size_t)n * OC + oc]) * __bfloat162float(weight[(size_t)oc * C + c]);
    if (aux) { /* train_gpt.c's gelu_backward */
        float x = __bfloat162float(aux[idx]);
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        acc *= s + x * s * (1.0f - s) * 2.0f * du;
    }
    dinp[idx] = __float2bfloat16(acc);
}

/* dweight[oc][c] += sum_n dout[n][oc] inp[n][c] */
__global__ void matmul_backward_dweight_naive_kernel(float* dweight, const floatX* dout, const floatX* inp, int N, int C,
                                                     int OC) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)OC * C) return;
    int oc = (int)(idx / C), c = (int)(idx % C);
    float acc = 0.0f;
    for (int n = 0; n < N; n++) acc += __bfloat162float(dout[(size_t)n * OC + oc]) * __bfloat162float(inp[(size_t)n * C + c]);
    dweight[idx] += acc;
}

/* dbias[oc] += sum_n dout[n][oc] */
__global__ void matmul_backward_dbias_naive_kernel(float* dbias, const floatX* dout, int N, int OC) {
    int oc = blockIdx.x * blockDim.x + threadIdx.x;
    if (oc >= OC) return;
    float acc = 0.0f;
    for (int n = 0; n < N; n++) acc += __bfloat162float(dout[(size_t)n * OC + oc]);
    dbias[oc] += acc;
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

typedef struct {
    int variant, N, C, OC;
    LtContext *fused, *unfused;
    floatX *dinp, *dout, *inp, *weight, *aux; /* (N, C), (N, OC), (N, C), (OC, C), (N, C) or NULL */
    float *dweight, *dbias, *part;            /* (OC, C), (OC), the column sums' partials */
} MmBackCtx;

static void run_backward(void* p) {
    MmBackCtx* c = (MmBackCtx*)p;
    if (c->variant == 1) {
        matmul_backward_dinp_naive_kernel<<<ceil_div((long long)c->N * c->C, 256), 256>>>(c->dinp, c->dout, c->weight,
                                                                                         c->aux, c->N, c->C, c->OC);
        KERNEL_CHECK();
        matmul_backward_dweight_naive_kernel<<<ceil_div((long long)c->OC * c->C, 256), 256>>>(c->dweight, c->dout, c->inp,
                                                                                             c->N, c->C, c->OC);
        KERNEL_CHECK();
        matmul_backward_dbias_naive_kernel<<<ceil_div(c->OC, 256), 256>>>(c->dbias, c->dout, c->N, c->OC);
        KERNEL_CHECK();
    } else {
        matmul_backward_gpu(c->variant == 2 ? c->fused : c->unfused, 0, c->dinp, c->dweight, c->dbias, c->part, c->dout,
                            c->inp, c->weight, c->aux, c->N, c->C, c->OC);
    }
}

static void print_tflops(const char* what, double ms, double flops, double peak_tflops) {
    double tf = flops / (ms * 1e-3) / 1e12;
    if (peak_tflops > 0)
        printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (%.0f%% of %.0f TFLOP/s, dense bf16 datasheet)\n", what, ms, tf,
               100 * tf / peak_tflops, peak_tflops);
    else printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (peak unknown for this device)\n", what, ms, tf);
    print_counted();
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
            print_tflops(name, time_kernel(&flush, var == 1 ? 5 : 20, run_variant, &ctx), 2.0 * N * IC * OC, peak);
        }
        free(inp); free(w); free(b); free(pre);
        if (pb->gelu) free(out);
        CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.weight)); CUDA_CHECK(cudaFree(ctx.bias));
        CUDA_CHECK(cudaFree(ctx.out));
        if (ctx.aux) CUDA_CHECK(cudaFree(ctx.aux));
    }

    /* ---- backward ---- */
    const MatmulProblem BACK[] = {{"qkv backward    (dout N x 3C)", 1, 3, 0}, {"fcproj backward (dout N x C, DGELU)", 4, 1, 1}};
    for (int pi = 0; pi < 2; pi++) {
        const MatmulProblem* pb = &BACK[pi];
        int IC = pb->C_mult * C, OC = pb->OC_mult * C;
        printf("%s: dinp (%d, %d), dweight (%d, %d), dbias (%d)\n", pb->name, N, IC, OC, IC, OC);
        float a = 1.0f / sqrtf((float)IC);
        float* dout = random_floats((size_t)N * OC, -1.0f, 1.0f, 40 + pi);
        float* inp = random_floats((size_t)N * IC, -1.0f, 1.0f, 50 + pi);
        float* w = random_floats((size_t)OC * IC, -a, a, 60 + pi);
        float* dw0 = random_floats((size_t)OC * IC, -1.0f, 1.0f, 70 + pi); /* the gradients it adds into */
        float* db0 = random_floats(OC, -1.0f, 1.0f, 80 + pi);
        MmBackCtx ctx;
        memset(&ctx, 0, sizeof(ctx));
        ctx.N = N; ctx.C = IC; ctx.OC = OC;
        ctx.fused = &fused;
        ctx.unfused = &unfused;
        float* aux = NULL;
        if (pb->gelu) { /* the forward's pre-activation; the matmul's input is its GELU (as bf16, as the forward stores it) */
            aux = random_floats((size_t)N * IC, -3.0f, 3.0f, 90 + pi);
            ctx.aux = to_device_bf16(aux, (size_t)N * IC);
            gelu_forward(inp, aux, (size_t)N * IC);
        }
        ctx.dout = to_device_bf16(dout, (size_t)N * OC);
        ctx.inp = to_device_bf16(inp, (size_t)N * IC);
        ctx.weight = to_device_bf16(w, (size_t)OC * IC);
        CUDA_CHECK(cudaMalloc((void**)&ctx.dinp, (size_t)N * IC * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.dweight, (size_t)OC * IC * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.dbias, (size_t)OC * sizeof(float)));
        /* the column sums' partials: column_sums_splits(N) x OC floats (twice that: room for the LayerNorm's pair) */
        CUDA_CHECK(cudaMalloc((void**)&ctx.part, 2 * (size_t)column_sums_splits(N) * OC * sizeof(float)));

        /* CPU reference */
        float* dinp = xmalloc_floats((size_t)N * IC);
        float* dw = xmalloc_floats((size_t)OC * IC);
        float* db = xmalloc_floats(OC);
        memcpy(dw, dw0, (size_t)OC * IC * sizeof(float));
        memcpy(db, db0, (size_t)OC * sizeof(float));
        matmul_backward(dinp, dw, db, dout, inp, w, N, IC, OC, 0);
        if (aux) gelu_backward(dinp, aux, dinp, (size_t)N * IC);

        for (int var = 1; var <= 3; var++) {
            if (only && var != only) continue;
            ctx.variant = var;
            printf("variant %d (%s)\n", var,
                   var == 1 ? "naive, thread per element" : var == 2 ? "cuBLASLt, epilogue fused" : "cuBLASLt, then our GELU backward");
            CUDA_CHECK(cudaMemset(ctx.dinp, 0xff, (size_t)N * IC * sizeof(floatX))); /* NaN: never written fails */
            CUDA_CHECK(cudaMemcpy(ctx.dweight, dw0, (size_t)OC * IC * sizeof(float), cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(ctx.dbias, db0, (size_t)OC * sizeof(float), cudaMemcpyHostToDevice));
            run_backward(&ctx);
            /* dinp: as the forward's out (one or two bf16 roundings); dweight and
             * dbias: fp32 sums of N terms of size <= 1 in another order than
             * the CPU's (a rounding per term at most, about sqrt(N) of them in
             * a random walk) */
            double atol = var == 3 ? 1e-2 : 5e-3;
            float* g = from_device_bf16(ctx.dinp, (size_t)N * IC);
            ok &= validate(aux ? "dinp (bf16, DGELU)" : "dinp (bf16)", g, dinp, (size_t)N * IC, atol, 1e-2);
            free(g);
            float* gw = from_device_f32(ctx.dweight, (size_t)OC * IC);
            ok &= validate("dweight (fp32, accumulated)", gw, dw, (size_t)OC * IC, 1e-5 * sqrt((double)N) + 1e-5, 1e-4);
            free(gw);
            float* gb = from_device_f32(ctx.dbias, OC);
            ok &= validate("dbias (fp32, accumulated)", gb, db, OC, 1e-5 * sqrt((double)N) + 1e-5, 1e-4);
            free(gb);
            char name[64];
            snprintf(name, sizeof(name), "backward variant %d", var);
            print_tflops(name, time_kernel(&flush, var == 1 ? 5 : 20, run_backward, &ctx), 4.0 * N * IC * OC, peak);
        }
        free(dout); free(inp); free(w); free(dw0); free(db0); free(dinp); free(dw); free(db);
        if (aux) { free(aux); CUDA_CHECK(cudaFree(ctx.aux)); }
        CUDA_CHECK(cudaFree(ctx.dout)); CUDA_CHECK(cudaFree(ctx.inp)); CUDA_CHECK(cudaFree(ctx.weight));
        CUDA_CHECK(cudaFree(ctx.dinp)); CUDA_CHECK(cudaFree(ctx.dweight)); CUDA_CHECK(cudaFree(ctx.dbias));
        CUDA_CHECK(cudaFree(ctx.part));
    }
    l2flush_free(&flush);
    lt_free(&fused);
    lt_free(&unfused);
    printf("%s\n", ok ? "matmul: all variants valid" : "matmul: FAILED");
    return ok ? 0 : 1;
}
