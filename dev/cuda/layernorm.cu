/*
 * dev/cuda/layernorm.cu — LayerNorm forward and backward, and the bias
 * gradients' column sums, bf16 in and out, fp32 statistics.
 *
 * CPU reference: train_gpt.c's layernorm_forward / layernorm_backward (fp32,
 * on the same bf16-rounded inputs). Production kernels: gptc/cuda/layernorm.cuh.
 * Variants:
 *   forward
 *   1  naive: one thread per row, three passes over the row
 *   2  scalar: layernorm_forward_scalar_gpu, one warp per row, 2-byte loads,
 *      three passes (production's path for C > 2048)
 *   3  production: layernorm_forward_gpu, one warp per row, the row in
 *      registers, 16-byte loads and stores (C % 8 == 0; scalar loads otherwise)
 *   backward (dinp += dx, dweight += sum dy xhat, dbias += sum dy)
 *   4  unfused: layernorm_backward_unfused_gpu, the dx kernel then column
 *      sums (4 launches, x and dy read twice; production's path for C > 2048)
 *   5  production: layernorm_backward_gpu, one fused pass (dx and per-block
 *      dweight/dbias partials, 16-byte loads, row in registers) + one finish
 *   bias gradient (dbias += column sums of dy, here with OC = C: the column
 *   sums the bias gradients of every matmul take)
 *   6  scalar: bias_backward_scalar_gpu, 2-byte loads (production's path for
 *      OC % 8 != 0)
 *   7  production: bias_backward_gpu, 16-byte loads
 * Timings on a GPU: dev/cuda/RESULTS.md.
 * Bytes counted for the GB/s figure (the same for every variant, the least any
 * kernel must move): forward x read, out written; backward x, dy, dinp read,
 * dinp written; bias gradient dy read.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/layernorm                 (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/layernorm           # validate and time every variant (B=16, T=1024, C=768)
 *   ./dev/cuda/layernorm 1         # only variant 1
 *   ./dev/cuda/layernorm 0 4 9 36  # all variants at B=4 T=9 C=36 (awkward sizes: the scalar-load path)
 *   ./dev/cuda/layernorm 0 5 29 520   # 145 rows (5 backward blocks), C % 8 == 0, 65 packs (K = 3, ragged)
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"            // the CPU reference; Rng, xmalloc_floats, CHECK
#include "gptc/cuda/common.cuh"  // CUDA_CHECK, KERNEL_CHECK, floatX, ceil_div, Pack8
#include "gptc/cuda/layernorm.cuh" // layernorm_forward_gpu, layernorm_backward_gpu, bias_backward_gpu and their scalar fallbacks
#include "dev/cuda/common.h"

/* variant 1: one thread per row */
__global__ void layernorm_forward_naive_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                               const floatX* weight, const floatX* bias, int N, int C) {
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    float m = 0.0f, v = 0.0f;
    for (int c = 0; c < C; c++) m += __bfloat162float(x[c]);
    m /= C;
    for (int c = 0; c < C; c++) {
        float d = __bfloat162float(x[c]) - m;
        v += d * d;
    }
    float s = rsqrtf(v / C + LAYERNORM_EPS);
    for (int c = 0; c < C; c++)
        out[(size_t)row * C + c] = __float2bfloat16((__bfloat162float(x[c]) - m) * s * __bfloat162float(weight[c]) +
                                                    __bfloat162float(bias[c]));
    mean[row] = m;
    rstd[row] = s;
}

typedef struct {
    int variant, N, C;
    floatX *out, *inp, *w, *b, *dout, *dinp;
    float *mean, *rstd, *dw, *db, *part;
} LnCtx;

static const char* const VARIANT_NAMES[8] = {
    "", "forward 1 (naive, thread per row)", "forward 2 (scalar fallback)",
    "forward 3 (production, 16-byte, row in registers)", "backward 4 (unfused fallback, 4 launches)",
    "backward 5 (production, fused + finish)", "bias grad 6 (scalar fallback)",
    "bias grad 7 (production, 16-byte)"};

static void run_forward(void* p) {
    LnCtx* c = (LnCtx*)p;
    if (c->variant == 1) {
        layernorm_forward_naive_kernel<<<ceil_div(c->N, 128), 128>>>(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
        KERNEL_CHECK();
    } else if (c->variant == 2) {
        layernorm_forward_scalar_gpu(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 0);
    } else {
        layernorm_forward_gpu(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, 0);
    }
}

static void run_bias(void* p) {
    LnCtx* c = (LnCtx*)p;
    if (c->variant == 6) bias_backward_scalar_gpu(c->db, c->part, c->dout, c->N, c->C, 0);
    else bias_backward_gpu(c->db, c->part, c->dout, c->N, c->C, 0);
}

static void run_backward(void* p) {
    LnCtx* c = (LnCtx*)p;
    if (c->variant == 4)
        layernorm_backward_unfused_gpu(c->dinp, c->dw, c->db, c->part, c->dout, c->inp, c->w, c->mean, c->rstd, c->N, c->C, 0);
    else
        layernorm_backward_gpu(c->dinp, c->dw, c->db, c->part, c->dout, c->inp, c->w, c->mean, c->rstd, c->N, c->C, 0);
}

int main(int argc, char** argv) {
    require_device("layernorm");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int B = argc > 4 ? atoi(argv[2]) : 16, T = argc > 4 ? atoi(argv[3]) : 1024, C = argc > 4 ? atoi(argv[4]) : 768;
    CHECK(B > 0 && T > 0 && C > 0 && only >= 0 && only <= 7, "usage: layernorm [variant 0..7 [B T C]]");
    int N = B * T;
    printf("N = B*T = %d rows, C = %d\n", N, C);
    float* x = random_floats((size_t)N * C, -3.0f, 3.0f, 1);
    float* w = random_floats(C, 0.5f, 1.5f, 2);
    float* b = random_floats(C, -0.5f, 0.5f, 3);
    float* dy = random_floats((size_t)N * C, -1.0f, 1.0f, 4);
    float* dx0 = random_floats((size_t)N * C, -1.0f, 1.0f, 5); /* the residual gradient it adds into */
    LnCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.N = N;
    ctx.C = C;
    ctx.inp = to_device_bf16(x, (size_t)N * C);
    ctx.w = to_device_bf16(w, C);
    ctx.b = to_device_bf16(b, C);
    ctx.dout = to_device_bf16(dy, (size_t)N * C);
    ctx.dinp = to_device_bf16(dx0, (size_t)N * C); /* dx0 is now bf16-rounded: the reference starts from it */
    CUDA_CHECK(cudaMalloc((void**)&ctx.out, (size_t)N * C * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.mean, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.rstd, N * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.dw, C * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.db, C * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.part, layernorm_backward_scratch_floats(N, C) * sizeof(float)));
    floatX* dinp0 = to_device_bf16(dx0, (size_t)N * C); /* to restore dinp before each backward's check */

    /* CPU reference */
    float* out = xmalloc_floats((size_t)N * C);
    float* mean = xmalloc_floats(N);
    float* rstd = xmalloc_floats(N);
    layernorm_forward(out, mean, rstd, x, w, b, N, C);

    L2Flush flush;
    l2flush_init(&flush);
    double peak = peak_bandwidth_gbs();
    int ok = 1;
    for (int v = 1; v <= 3; v++) {
        if (only && v != only) continue;
        ctx.variant = v;
        run_forward(&ctx);
        float* got = from_device_bf16(ctx.out, (size_t)N * C);
        float* gm = from_device_f32(ctx.mean, N);
        float* gr = from_device_f32(ctx.rstd, N);
        printf("variant %s\n", VARIANT_NAMES[v]);
        ok &= validate("out (bf16)", got, out, (size_t)N * C, 1e-2, 1e-2);
        ok &= validate("mean (fp32)", gm, mean, N, 1e-5, 1e-4);
        ok &= validate("rstd (fp32)", gr, rstd, N, 1e-5, 1e-4);
        free(got); free(gm); free(gr);
        double ms = time_kernel(&flush, 20, run_forward, &ctx);
        print_timing(VARIANT_NAMES[v], ms, (double)N * C * 4 + C * 4.0 + N * 8.0, peak);
    }
    /* backward: CPU reference on the same inputs, with the GPU forward's mean/rstd */
    float* dx = NULL;
    float *dw = NULL, *db = NULL, *gm = NULL, *gr = NULL;
    for (int v = 4; v <= 5; v++) {
        if (only && v != only) continue;
        if (!dx) {
            ctx.variant = 3;
            run_forward(&ctx);
            gm = from_device_f32(ctx.mean, N);
            gr = from_device_f32(ctx.rstd, N);
            dx = xmalloc_floats((size_t)N * C);
            memcpy(dx, dx0, (size_t)N * C * sizeof(float));
            dw = xmalloc_floats(C);
            db = xmalloc_floats(C);
            memset(dw, 0, C * sizeof(float));
            memset(db, 0, C * sizeof(float));
            layernorm_backward(dx, dw, db, dy, x, w, gm, gr, N, C);
        }
        printf("variant %s\n", VARIANT_NAMES[v]);
        ctx.variant = v;
        CUDA_CHECK(cudaMemcpy(ctx.dinp, dinp0, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaMemset(ctx.dw, 0, C * sizeof(float)));
        CUDA_CHECK(cudaMemset(ctx.db, 0, C * sizeof(float)));
        run_backward(&ctx);
        float* gdx = from_device_bf16(ctx.dinp, (size_t)N * C);
        float* gdw = from_device_f32(ctx.dw, C);
        float* gdb = from_device_f32(ctx.db, C);
        ok &= validate("dinp (bf16, accumulated)", gdx, dx, (size_t)N * C, 2e-2, 2e-2);
        ok &= validate("dweight (fp32)", gdw, dw, C, 1e-2 * sqrt((double)N), 1e-3);
        ok &= validate("dbias (fp32)", gdb, db, C, 1e-2 * sqrt((double)N), 1e-3);
        /* the same inputs again: bitwise the same parameter gradients (no order-dependent sums) */
        CUDA_CHECK(cudaMemset(ctx.dw, 0, C * sizeof(float)));
        CUDA_CHECK(cudaMemset(ctx.db, 0, C * sizeof(float)));
        run_backward(&ctx);
        float* gdw2 = from_device_f32(ctx.dw, C);
        float* gdb2 = from_device_f32(ctx.db, C);
        int same = !memcmp(gdw, gdw2, C * sizeof(float)) && !memcmp(gdb, gdb2, C * sizeof(float));
        printf("  %-28s %s\n", "dweight, dbias run twice", same ? "ok    bitwise identical" : "FAIL  differ");
        ok &= same;
        double ms = time_kernel(&flush, 20, run_backward, &ctx);
        print_timing(VARIANT_NAMES[v], ms, (double)N * C * 2 * 4 + N * 8.0, peak);
        free(gdx); free(gdw); free(gdb); free(gdw2); free(gdb2);
    }
    for (int v = 6; v <= 7; v++) {
        if (only && v != only) continue;
        if (!db) { /* the bias gradient's reference: column sums of dy */
            db = xmalloc_floats(C);
            memset(db, 0, C * sizeof(float));
            for (int i = 0; i < N; i++)
                for (int c = 0; c < C; c++) db[c] += dy[(size_t)i * C + c];
        }
        printf("variant %s\n", VARIANT_NAMES[v]);
        ctx.variant = v;
        CUDA_CHECK(cudaMemset(ctx.db, 0, C * sizeof(float)));
        run_bias(&ctx);
        float* gdb = from_device_f32(ctx.db, C);
        ok &= validate("dbias (fp32)", gdb, db, C, 1e-2 * sqrt((double)N), 1e-3);
        double ms = time_kernel(&flush, 20, run_bias, &ctx);
        print_timing(VARIANT_NAMES[v], ms, (double)N * C * 2, peak);
        free(gdb);
    }
    free(gm); free(gr); free(dx); free(dw); free(db);
    l2flush_free(&flush);
    printf("%s\n", ok ? "layernorm: all variants valid" : "layernorm: FAILED");
    return ok ? 0 : 1;
}
