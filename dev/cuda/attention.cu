/*
 * dev/cuda/attention.cu — causal self-attention, forward and backward, bf16
 * in and out: materialised (the T x T probabilities stored) and flash-style
 * (production, gptc/cuda/attention.cuh). make test runs it on the CPU twice:
 * with WMMA, and with the flash tile products as plain FMAs
 * (-DATTN_MMA_SCALAR).
 *
 * CPU reference: train_gpt.c's attention_forward / attention_backward (fp32,
 * on the same bf16-rounded q, k, v and dout); the log-sum-exp against
 * float64 from the same scores.
 * Variants (forward and backward each):
 *   1  materialised: permute qkv into q, k, v (B, NH, T, hs); S = Q K^T in
 *      fp32 and A V, dV, dA, dQ, dK through batched cuBLASLt GEMMs; causal
 *      softmax and its backward one row per warp; (B, NH, T, T) fp32 scores
 *      and bf16 probabilities in memory, the full square computed (the
 *      masked half too).
 *   2  flash with WMMA: attention_forward_wmma_gpu / attention_backward_gpu
 *      (tiles in shared memory, online softmax, WMMA, the score, probability
 *      and accumulator tiles in shared memory, only the log-sum-exp per row
 *      kept; see gptc/cuda/attention.cuh).
 *   3  production: attention_forward_gpu / attention_backward_gpu,
 *      FlashAttention-2 class where hs is a multiple of 8 (mma.sync on
 *      ldmatrix'd operands, S, P, dS and the accumulators in registers, tiles
 *      double-buffered by cp.async; variant 2 otherwise).
 * FLOPs counted (the roofline is the tensor cores' dense bf16 peak): the
 * causal half of the products, forward 2 x 2 B NH T^2 hs / 2 (S and A V),
 * backward 5 x that / 2 (dV, dP, dQ, dK, and S recomputed): what a flash
 * kernel must do; variant 1 does twice as much for the same output.
 *
 * It includes the whole of train_gpt.cu, not only gptc/cuda/attention.cuh:
 * variant 1's batched GEMMs go through gptc/cuda/matmul.cuh, whose lt_init
 * allocates through the trainer's device-memory ledger, and the TFLOP/s
 * figure needs train_gpt.cu's gpu_peak_tflops.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/attention                 (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/attention               # validate and time every variant (B=16, T=1024, NH=12, hs=64)
 *   ./dev/cuda/attention 3             # only variant 3 (production)
 *   ./dev/cuda/attention 0 2 70 2 20   # both at B=2 T=70 NH=2 hs=20 (awkward sizes; make test on the CPU)
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu" // gptc/cuda/attention.cuh and matmul.cuh, the ledger, gpu_peak_tflops; train_gpt.c
#include "dev/cuda/common.h"

/* ---- variant 1: materialised probabilities ------------------------------ */

/* qkv (B, T, 3, NH, hs) <-> q, k, v each (B, NH, T, hs), so that every
 * (b, h) is one contiguous matrix for the batched GEMMs. */
__global__ void attention_permute_kernel(floatX* q, floatX* k, floatX* v, const floatX* qkv, int B, int T,
                                         int NH, int hs) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)B * NH * T * hs;
    if (idx >= n) return;
    int d = (int)(idx % hs), t = (int)((idx / hs) % T), h = (int)((idx / ((long long)hs * T)) % NH);
    int b = (int)(idx / ((long long)hs * T * NH));
    int C = NH * hs;
    size_t src = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + d;
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * C];
}

/* The reverse, for the gradients: dq, dk, dv (B, NH, T, hs) -> dqkv (B, T, 3C). */
__global__ void attention_unpermute_qkv_kernel(floatX* dqkv, const floatX* dq, const floatX* dk,
                                               const floatX* dv, int B, int T, int NH, int hs) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)B * NH * T * hs;
    if (idx >= n) return;
    int d = (int)(idx % hs), t = (int)((idx / hs) % T), h = (int)((idx / ((long long)hs * T)) % NH);
    int b = (int)(idx / ((long long)hs * T * NH));
    int C = NH * hs;
    size_t dst = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + d;
    dqkv[dst] = dq[idx];
    dqkv[dst + C] = dk[idx];
    dqkv[dst + 2 * C] = dv[idx];
}

/* (B, NH, T, hs) <-> (B, T, NH, hs) = (B, T, C). dir 0: y -> out; dir 1: out -> y. */
__global__ void attention_heads_kernel(floatX* bthd, floatX* bhtd, int B, int T, int NH, int hs, int dir) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long n = (long long)B * NH * T * hs;
    if (idx >= n) return;
    int d = (int)(idx % hs), t = (int)((idx / hs) % T), h = (int)((idx / ((long long)hs * T)) % NH);
    int b = (int)(idx / ((long long)hs * T * NH));
    size_t o = ((size_t)b * T + t) * NH * hs + (size_t)h * hs + d;
    if (dir == 0) bthd[o] = bhtd[idx];
    else bhtd[idx] = bthd[o];
}

/* Causal softmax of one row of S per warp: S (B*NH, T, T) fp32, already
 * scaled by 1/sqrt(hs) in its GEMM; att = softmax over t2 <= t, exactly 0
 * above the diagonal, in bf16. */
__global__ void softmax_causal_forward_kernel(floatX* att, const float* S, int rows, int T) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    const float* s = S + (size_t)row * T;
    floatX* a = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += 32) sum += expf(s[j] - m);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) a[j] = __float2bfloat16(j <= t ? expf(s[j] - m) * inv : 0.0f);
}

/* dS = A * (dA - rowsum(A * dA)) * scale, one row per warp; dA is fp32 from
 * its GEMM, dS is written in bf16 (0 above the diagonal). */
__global__ void softmax_causal_backward_kernel(floatX* dS, const float* dA, const floatX* att, int rows, int T,
                                               float scale) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = row % T;
    const float* da = dA + (size_t)row * T;
    const floatX* a = att + (size_t)row * T;
    floatX* ds = dS + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += __bfloat162float(a[j]) * da[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
        ds[j] = __float2bfloat16(j <= t ? __bfloat162float(a[j]) * (da[j] - dot) * scale : 0.0f);
}


/* Variant 1's buffers: q, k, v and dq, dk, dv permuted (B, NH, T, hs each),
 * y (B, NH, T, hs), S / dA in fp32 and dS in bf16 (B, NH, T, T), cuBLASLt. */
typedef struct {
    LtContext lt;
    floatX *q, *y, *dq, *datt;
    float* scores;
} Materialised;

/* Forward, variant 1:
 *   q, k, v = permute(qkv);  S = q k^T / sqrt(hs) (fp32);  att = causal softmax(S);
 *   y = att v;  atty = unpermute(y) */
static void attention_forward_materialised(Materialised* sc, floatX* atty, floatX* att, const floatX* qkv, int B,
                                          int T, int NH, int hs, cudaStream_t s) {
    int C = NH * hs;
    long long n = (long long)B * T * C;
    floatX *q = sc->q, *k = sc->q + n, *v = sc->q + 2 * n;
    attention_permute_kernel<<<ceil_div(n, 256), 256, 0, s>>>(q, k, v, qkv, B, T, NH, hs);
    KERNEL_CHECK();
    int batch = B * NH;
    long long sq = (long long)T * hs, sa = (long long)T * T;
    /* S^T (col-major T x T, i.e. S row-major) = K Q^T */
    lt_matmul(&sc->lt, s, sc->scores, CUDA_R_32F, NULL, k, 1, q, 0, T, T, hs, hs, hs, T,
              1.0f / sqrtf((float)hs), 0.0f, NULL, CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sq, sa);
    softmax_causal_forward_kernel<<<ceil_div((long long)batch * T, 8), 256, 0, s>>>(att, sc->scores, batch * T, T);
    KERNEL_CHECK();
    /* y (col-major hs x T) = V att^T */
    lt_matmul(&sc->lt, s, sc->y, CUDA_R_16BF, NULL, v, 0, att, 0, hs, T, T, hs, T, hs, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sa, sq);
    attention_heads_kernel<<<ceil_div(n, 256), 256, 0, s>>>(atty, sc->y, B, T, NH, hs, 0);
    KERNEL_CHECK();
}

/* Backward of the above (train_gpt.c's attention_backward); dqkv is written.
 *   dA = dY V^T; dV = A^T dY; dS = softmax backward (times the scale); dQ = dS K; dK = dS^T Q */
static void attention_backward_materialised(Materialised* sc, floatX* dqkv, const floatX* datty, const floatX* qkv,
                                           const floatX* att, int B, int T, int NH, int hs, cudaStream_t s) {
    int C = NH * hs;
    long long n = (long long)B * T * C;
    floatX *q = sc->q, *k = sc->q + n, *v = sc->q + 2 * n;
    floatX *dq = sc->dq, *dk = sc->dq + n, *dv = sc->dq + 2 * n, *dy = sc->y;
    attention_permute_kernel<<<ceil_div(n, 256), 256, 0, s>>>(q, k, v, qkv, B, T, NH, hs);
    KERNEL_CHECK();
    attention_heads_kernel<<<ceil_div(n, 256), 256, 0, s>>>((floatX*)datty, dy, B, T, NH, hs, 1);
    KERNEL_CHECK();
    int batch = B * NH;
    long long sq = (long long)T * hs, sa = (long long)T * T;
    /* dA (row-major T x T) = dY V^T: same form as S */
    lt_matmul(&sc->lt, s, sc->scores, CUDA_R_32F, NULL, v, 1, dy, 0, T, T, hs, hs, hs, T, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sq, sa);
    /* dV (col-major hs x T) = dY^T-ish: dVc = dYc A */
    lt_matmul(&sc->lt, s, dv, CUDA_R_16BF, NULL, dy, 0, att, 1, hs, T, T, hs, T, hs, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sa, sq);
    softmax_causal_backward_kernel<<<ceil_div((long long)batch * T, 8), 256, 0, s>>>(
        sc->datt, sc->scores, att, batch * T, T, 1.0f / sqrtf((float)hs));
    KERNEL_CHECK();
    /* dQc = Kc dS^T-col (dS row-major read as col-major (T, T) = dS^T) */
    lt_matmul(&sc->lt, s, dq, CUDA_R_16BF, NULL, k, 0, sc->datt, 0, hs, T, T, hs, T, hs, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sa, sq);
    /* dKc = Qc dS-col^T */
    lt_matmul(&sc->lt, s, dk, CUDA_R_16BF, NULL, q, 0, sc->datt, 1, hs, T, T, hs, T, hs, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, batch, sq, sa, sq);
    attention_unpermute_qkv_kernel<<<ceil_div(n, 256), 256, 0, s>>>(dqkv, dq, dk, dv, B, T, NH, hs);
    KERNEL_CHECK();
}


/* ---- driver ------------------------------------------------------------- */

typedef struct {
    int variant, B, T, NH, hs;
    floatX *qkv, *out, *dout, *dqkv, *att;
    float *lse, *D;
    Materialised mat;
} AttnCtx;

static void run_forward(void* p) {
    AttnCtx* c = (AttnCtx*)p;
    if (c->variant == 1) attention_forward_materialised(&c->mat, c->out, c->att, c->qkv, c->B, c->T, c->NH, c->hs, 0);
    else if (c->variant == 2) attention_forward_wmma_gpu(c->out, c->lse, c->qkv, c->B, c->T, c->NH, c->hs, 0);
    else attention_forward_gpu(c->out, c->lse, c->qkv, c->B, c->T, c->NH, c->hs, 0);
}

static void run_backward(void* p) {
    AttnCtx* c = (AttnCtx*)p;
    if (c->variant == 1)
        attention_backward_materialised(&c->mat, c->dqkv, c->dout, c->qkv, c->att, c->B, c->T, c->NH, c->hs, 0);
    else if (c->variant == 2)
        attention_backward_wmma_gpu(c->dqkv, c->D, c->dout, c->qkv, c->out, c->lse, c->B, c->T, c->NH, c->hs, 0);
    else attention_backward_gpu(c->dqkv, c->D, c->dout, c->qkv, c->out, c->lse, c->B, c->T, c->NH, c->hs, 0);
}

static void print_flops(const char* what, double ms, double flops, double peak_tflops) {
    double tf = flops / (ms * 1e-3) / 1e12;
    if (peak_tflops > 0) printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (%.0f%% of %.0f TFLOP/s)\n", what, ms, tf, 100 * tf / peak_tflops, peak_tflops);
    else printf("  %-28s %8.3f ms  %7.1f TFLOP/s  (roofline unknown)\n", what, ms, tf);
    print_counted();
}

/* dq, dk or dv (part 0, 1, 2) of a (B, T, 3C) gradient, as (B, T, C). */
static float* qkv_part(const float* x, size_t BT, int C, int part) {
    float* r = xmalloc_floats(BT * C);
    for (size_t bt = 0; bt < BT; bt++) memcpy(r + bt * C, x + bt * 3 * C + (size_t)part * C, C * sizeof(float));
    return r;
}

int main(int argc, char** argv) {
    require_device("attention");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    int B = argc > 5 ? atoi(argv[2]) : 16, T = argc > 5 ? atoi(argv[3]) : 1024;
    int NH = argc > 5 ? atoi(argv[4]) : 12, hs = argc > 5 ? atoi(argv[5]) : 64;
    if (B < 1 || T < 1 || NH < 1 || hs < 1 || hs > ATTN_MAX_HS) {
        fprintf(stderr, "attention: need B, T, NH >= 1 and 1 <= hs <= %d\n", ATTN_MAX_HS);
        return 2;
    }
    int C = NH * hs;
    size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C, nlse = (size_t)B * NH * T, natt = nlse * T;
    printf("B = %d, T = %d, NH = %d, hs = %d\n", B, T, NH, hs);
    /* q, k in [-2, 2] (scores spread about 1.3: the softmax neither flat nor one-hot), v and dout in [-1, 1] */
    float* qkv = random_floats(nqkv, -1.0f, 1.0f, 1);
    for (size_t i = 0; i < nqkv; i++)
        if (i % (3 * C) < (size_t)2 * C) qkv[i] *= 2.0f;
    float* dout = random_floats(nout, -1.0f, 1.0f, 2);
    AttnCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.B = B; ctx.T = T; ctx.NH = NH; ctx.hs = hs;
    ctx.qkv = to_device_bf16(qkv, nqkv);
    ctx.dout = to_device_bf16(dout, nout);
    CUDA_CHECK(cudaMalloc((void**)&ctx.out, nout * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.dqkv, nqkv * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.lse, nlse * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.D, nlse * sizeof(float)));
    if (!only || only == 1) {
        lt_init(&ctx.mat.lt, LT_WORKSPACE_BYTES, 1);
        CUDA_CHECK(cudaMalloc((void**)&ctx.att, natt * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.mat.q, 3 * nout * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.mat.y, nout * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.mat.dq, 3 * nout * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.mat.datt, natt * sizeof(floatX)));
        CUDA_CHECK(cudaMalloc((void**)&ctx.mat.scores, natt * sizeof(float)));
    }

    /* CPU reference (fp32, probabilities materialised), and the lse in float64 */
    float* out = xmalloc_floats(nout);
    float* att = xmalloc_floats(natt);
    float* datt = xmalloc_floats(natt);
    float* dqkv = xmalloc_floats(nqkv);
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    free(att);
    free(datt);
    float* lse = xmalloc_floats(nlse);
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        double* s = (double*)xmalloc((size_t)T * sizeof(double));
        for (int t = 0; t < T; t++) {
            const float* q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
            double mx = -INFINITY, sum = 0.0;
            for (int u = 0; u <= t; u++) {
                const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + (size_t)h * hs;
                double dot = 0.0;
                for (int d = 0; d < hs; d++) dot += (double)q[d] * k[d];
                s[u] = dot / sqrt((double)hs);
                mx = fmax(mx, s[u]);
            }
            for (int u = 0; u <= t; u++) sum += exp(s[u] - mx);
            lse[((size_t)b * NH + h) * T + t] = (float)(mx + log(sum));
        }
        free(s);
    }

    L2Flush flush;
    l2flush_init(&flush);
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    double peak = gpu_peak_tflops(prop.name);
    double fwd_flops = 2.0 * B * NH * (double)T * T * hs; /* 2 products x 2 T^2 hs, causal half */
    int ok = 1;
    static const char* const what[4] = {"", "materialised, cuBLASLt", "flash, WMMA, accumulators in shared memory",
                                        "production: FlashAttention-2 class (mma.sync, registers, cp.async) "
                                        "where hs is a multiple of 8, else variant 2"};
    char label[2][40];
    for (int v = 1; v <= 3; v++) {
        if (only && v != only) continue;
        ctx.variant = v;
        printf("variant %d (%s)\n", v, what[v]);
        /* tolerances relative to each element: bf16 outputs (8 significant
         * bits) from bf16 P and dS, summed over up to T terms */
        run_forward(&ctx);
        float* got = from_device_bf16(ctx.out, nout);
        ok &= validate("out (bf16)", got, out, nout, 5e-3, 1e-2);
        free(got);
        if (v >= 2) {
            float* gl = from_device_f32(ctx.lse, nlse);
            ok &= validate("lse (fp32)", gl, lse, nlse, 1e-5, 1e-5);
            free(gl);
        }
        run_backward(&ctx);
        float* gd = from_device_bf16(ctx.dqkv, nqkv);
        const char* names[3] = {"dq (bf16)", "dk (bf16)", "dv (bf16)"};
        for (int p = 0; p < 3; p++) {
            float* g = qkv_part(gd, BT, C, p);
            float* w = qkv_part(dqkv, BT, C, p);
            ok &= validate(names[p], g, w, nout, 1e-2, 2e-2);
            free(g);
            free(w);
        }
        free(gd);
        double ms = time_kernel(&flush, 20, run_forward, &ctx);
        snprintf(label[0], sizeof(label[0]), "forward variant %d", v);
        snprintf(label[1], sizeof(label[1]), "backward variant %d", v);
        print_flops(label[0], ms, fwd_flops, peak);
        ms = time_kernel(&flush, 20, run_backward, &ctx);
        print_flops(label[1], ms, 2.5 * fwd_flops, peak);
    }
    l2flush_free(&flush);
    printf("%s\n", ok ? "attention: all variants valid" : "attention: FAILED");
    return ok ? 0 : 1;
}
