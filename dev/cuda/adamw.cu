/*
 * dev/cuda/adamw.cu — the AdamW update of one tensor in mixed precision: fp32
 * master weights, gradient and moments, and the bf16 copy the forward reads,
 * written with stochastic rounding.
 *
 * CPU reference: train_gpt.c's gradients_clip_to then adamw_update_range over
 * one tensor (fp32, the same inputs).
 * Variants:
 *   1  naive: the update as a first port would write it, two kernels: the
 *      fp32 update (one thread per element, clip coefficient and bias
 *      corrections spelled out), then production's
 *      bf16_round_stochastic_kernel for the bf16 copy (reads the master again)
 *   2  production: adamw_kernel (gptc/cuda/adamw.cuh; one thread per element,
 *      the bf16 copy written in the same pass)
 *   3  vectorised: four elements per thread, float4 loads and stores of the
 *      master, gradient and moments and one 8-byte store of four bf16; bit for
 *      bit the production kernel (same operations, same random bits for
 *      element i); falls back to variant 2 when a pointer is not aligned
 * Checks: master and moments against the CPU within a tight tolerance; every
 * bf16 weight is one of the two bf16 neighbours of the device's own master
 * (exactly), and the rounding is unbiased (the sum of the rounding errors is
 * within 6 standard deviations of 0); variants 1 and 3 equal variant 2 bit for
 * bit (the same random bits for element i).
 * Bytes moved (the minimum, for every variant): master, gradient, m, v read,
 * master, m, v written (fp32), the bf16 copy written: 30 bytes per element.
 *
 * Build and run (from the repository root):
 *   make dev/cuda/adamw              (CUDA_ARCH=sm_80 for an A100; the Makefile finds NCCL)
 *   ./dev/cuda/adamw                 # every variant, n = 50304 x 768 = 38,633,472 (GPT-2 124M's wte, its largest tensor)
 *   ./dev/cuda/adamw 3               # only variant 3
 *   ./dev/cuda/adamw 0 1001          # every variant at n = 1001 (a tail of 1 for variant 3)
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"            // the CPU reference; Rng, xmalloc_floats, CHECK
#include "gptc/cuda/common.cuh"  // CUDA_CHECK, KERNEL_CHECK, floatX, ceil_div, Pack8
#include "gptc/cuda/adamw.cuh" // adamw_kernel, AdamWStep, bf16_round_stochastic_kernel, clip_coef, hash_u32
#include "dev/cuda/common.h"

/* Hyperparameters of the test: GPT-2's (train_gpt.c's defaults), at step 10,
 * with the clip active (max_norm half the gradient's norm). */
#define ADAMW_LR 6e-4f
#define ADAMW_B1 0.9f
#define ADAMW_B2 0.95f
#define ADAMW_EPS 1e-8f
#define ADAMW_WD 0.1f
#define ADAMW_STEP 10
#define ADAMW_STEP_SEED 771u /* the step's seed (AdamWStep.seed) */
#define ADAMW_TENSOR 9u      /* the tensor's number: adamw_kernel rounds with ADAMW_STEP_SEED * 16 + ADAMW_TENSOR, */
#define ADAMW_SEED (ADAMW_STEP_SEED * 16u + ADAMW_TENSOR) /* = 12345, the seed variants 1 and 3 take */

/* variant 1, first kernel: p, m, v updated in fp32, one thread per element */
__global__ void adamw_naive_kernel(float* master, const float* grad, float* m, float* v, size_t n, float lr,
                                   float b1, float b2, float bc1, float bc2, float eps, float wd, const float* norm,
                                   float max_norm) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    /* clip by the global norm: g *= max_norm / (norm + 1e-6) when that is < 1 */
    float coef = 1.0f;
    if (max_norm > 0.0f && isfinite(norm[0]) && max_norm / (norm[0] + 1e-6f) < 1.0f) coef = max_norm / (norm[0] + 1e-6f);
    float g = grad[i] * coef;
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    float p = master[i];
    p -= lr * wd * p;
    master[i] = p - lr * (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps);
}

/* variant 3: four consecutive elements per thread. Element i gets exactly the
 * production kernel's operations (adamw_element, clip_coef) and random bits
 * (hash_u32(i ^ hash_u32(seed))), so the results are the same bits. */
struct alignas(8) Pack4 {
    floatX v[4];
};
__global__ void adamw_vec4_kernel(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                                  float lr, float b1, float b2, float bc1, float bc2, float eps, float wd,
                                  const float* norm, float max_norm, uint32_t seed) {
    size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i0 >= n) return;
    float coef = clip_coef(norm[0], max_norm);
    uint32_t hseed = hash_u32(seed);
    if (i0 + 4 <= n) {
        /* 16-byte loads: the launcher checked the alignment */
        float4 p4 = *(const float4*)(master + i0), g4 = *(const float4*)(grad + i0);
        float4 m4 = *(const float4*)(m + i0), v4 = *(const float4*)(v + i0);
        float p[4] = {p4.x, p4.y, p4.z, p4.w}, g[4] = {g4.x, g4.y, g4.z, g4.w};
        float mm[4] = {m4.x, m4.y, m4.z, m4.w}, vv[4] = {v4.x, v4.y, v4.z, v4.w};
        Pack4 out;
        for (int k = 0; k < 4; k++) {
            p[k] = adamw_element(p[k], g[k] * coef, &mm[k], &vv[k], lr, b1, b2, bc1, bc2, eps, wd);
            out.v[k] = bf16_round_stochastic(p[k], hash_u32((uint32_t)(i0 + k) ^ hseed));
        }
        *(float4*)(master + i0) = make_float4(p[0], p[1], p[2], p[3]);
        *(float4*)(m + i0) = make_float4(mm[0], mm[1], mm[2], mm[3]);
        *(float4*)(v + i0) = make_float4(vv[0], vv[1], vv[2], vv[3]);
        *(Pack4*)(param + i0) = out;
    } else {
        /* the last n % 4 elements, one at a time */
        for (size_t i = i0; i < n; i++) {
            float p = adamw_element(master[i], grad[i] * coef, &m[i], &v[i], lr, b1, b2, bc1, bc2, eps, wd);
            master[i] = p;
            param[i] = bf16_round_stochastic(p, hash_u32((uint32_t)i ^ hseed));
        }
    }
}

static int aligned_to(const void* p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

typedef struct {
    int variant;
    size_t n;
    floatX* param;                  /* (n) bf16 copy */
    float *master, *grad, *m, *v;   /* (n) fp32 */
    float* norm;                    /* (1) the global gradient norm, on the device */
    AdamWStep* step;                /* (1) the production kernel's per-step values, on the device */
    float max_norm, bc1, bc2;
} AdamCtx;

static void run_variant(void* p) {
    AdamCtx* c = (AdamCtx*)p;
    size_t n = c->n;
    if (c->variant == 1) {
        adamw_naive_kernel<<<ceil_div((long long)n, 256), 256>>>(c->master, c->grad, c->m, c->v, n, ADAMW_LR, ADAMW_B1,
                                                                 ADAMW_B2, c->bc1, c->bc2, ADAMW_EPS, ADAMW_WD,
                                                                 c->norm, c->max_norm);
        KERNEL_CHECK();
        bf16_round_stochastic_kernel<<<ceil_div((long long)n, 256), 256>>>(c->param, c->master, n, ADAMW_SEED);
        KERNEL_CHECK();
    } else if (c->variant == 3 && aligned_to(c->master, 16) && aligned_to(c->grad, 16) && aligned_to(c->m, 16) &&
               aligned_to(c->v, 16) && aligned_to(c->param, 8)) {
        adamw_vec4_kernel<<<ceil_div((long long)ceil_div((long long)n, 4), 256), 256>>>(
            c->param, c->master, c->grad, c->m, c->v, n, ADAMW_LR, ADAMW_B1, ADAMW_B2, c->bc1, c->bc2, ADAMW_EPS,
            ADAMW_WD, c->norm, c->max_norm, ADAMW_SEED);
        KERNEL_CHECK();
    } else { /* 2, and 3 on unaligned pointers */
        adamw_kernel<<<ceil_div((long long)n, 256), 256>>>(c->param, c->master, c->grad, c->m, c->v, n, c->step,
                                                           ADAMW_B1, ADAMW_B2, ADAMW_EPS, ADAMW_WD, c->norm,
                                                           c->max_norm, ADAMW_TENSOR);
        KERNEL_CHECK();
    }
}

static void upload_f32(float* d, const float* h, size_t n) {
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
}

/* The bf16 weights against the device's own master: each is the master
 * rounded down or up to a bf16 (by its bits: truncation, or truncation plus
 * one unit in the last place when bits were cut), and the rounding errors
 * sum to about 0: rounding up with probability f = (cut bits) / 2^16 gives an
 * error of mean 0 and variance f (1 - f) gap^2, gap = the bf16 spacing there. */
static int validate_stochastic(const float* param, const float* master, size_t n, int quiet) {
    size_t bad = 0, bad_at = 0, up = 0;
    double err_sum = 0.0, var_sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        uint32_t mb, pb;
        memcpy(&mb, &master[i], 4);
        memcpy(&pb, &param[i], 4);
        uint32_t down = mb & 0xffff0000u, cut = mb & 0xffffu;
        int is_down = pb == down, is_up = cut != 0 && pb == down + 0x10000u;
        if (!is_down && !is_up) {
            if (!bad) bad_at = i;
            bad++;
            continue;
        }
        up += is_up;
        float lo, hi;
        uint32_t hib = down + 0x10000u;
        memcpy(&lo, &down, 4);
        memcpy(&hi, &hib, 4);
        double gap = fabs((double)hi - (double)lo), f = cut / 65536.0;
        err_sum += (double)param[i] - (double)master[i];
        var_sum += f * (1.0 - f) * gap * gap;
    }
    double z = var_sum > 0.0 ? err_sum / sqrt(var_sum) : 0.0;
    int ok = bad == 0 && fabs(z) < 6.0;
    if (quiet) return ok;
    printf("  %-28s %s  %zu of %zu not a bf16 neighbour of the master; %zu rounded up; "
           "sum of rounding errors %.3g = %.2f sigma (limit 6)\n",
           "param (bf16, stochastic)", ok ? "ok  " : "FAIL", bad, n, up, err_sum, z);
    if (bad) printf("  first at [%zu]: param %.9g master %.9g\n", bad_at, param[bad_at], master[bad_at]);
    return ok;
}

int main(int argc, char** argv) {
    require_device("adamw");
    int only = argc > 1 ? atoi(argv[1]) : 0;
    /* train_gpt.cu launches adamw_kernel once per tensor: the largest, wte (Vp x C), by default */
    size_t n = argc > 2 ? (size_t)atoll(argv[2]) : (size_t)50304 * 768;
    CHECK(n > 0 && n < ((size_t)1 << 32), "n = %zu: give 1 .. 2^32 - 1 elements (the random bits take i as 32 bits)", n);
    printf("n = %zu elements, step %d, lr %g, betas %g %g, eps %g, weight decay %g\n", n, ADAMW_STEP, ADAMW_LR, ADAMW_B1,
           ADAMW_B2, ADAMW_EPS, ADAMW_WD);

    /* inputs: weights ~ N-ish(0, 0.02) as GPT-2's init, gradients ~ 1e-2,
     * moments as after some steps (v > 0) */
    float* p0 = random_floats(n, -0.05f, 0.05f, 1);
    float* g0 = random_floats(n, -0.02f, 0.02f, 2);
    float* m0 = random_floats(n, -0.01f, 0.01f, 3);
    float* v0 = random_floats(n, 0.0f, 1e-4f, 4);
    double sq = 0.0;
    for (size_t i = 0; i < n; i++) sq += (double)g0[i] * g0[i];
    double norm = sqrt(sq), max_norm = 0.5 * norm; /* the clip scales the gradient by about 1/2 */

    AdamCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    ctx.n = n;
    ctx.bc1 = 1.0f - (float)pow(ADAMW_B1, ADAMW_STEP); /* as train_gpt.c and gpu_adamw_update compute them */
    ctx.bc2 = 1.0f - (float)pow(ADAMW_B2, ADAMW_STEP);
    ctx.max_norm = (float)max_norm;
    CUDA_CHECK(cudaMalloc((void**)&ctx.param, n * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.master, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.grad, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.m, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&ctx.v, n * sizeof(float)));
    float norm_f = (float)norm;
    ctx.norm = to_device_f32(&norm_f, 1);
    AdamWStep step = {ADAMW_LR, ctx.bc1, ctx.bc2, ADAMW_STEP_SEED, 1};
    CUDA_CHECK(cudaMalloc((void**)&ctx.step, sizeof(AdamWStep)));
    CUDA_CHECK(cudaMemcpy(ctx.step, &step, sizeof(AdamWStep), cudaMemcpyHostToDevice));

    /* CPU reference: one tensor as a model whose first tensor is all of it */
    float* p = xmalloc_floats(n);
    float* g = xmalloc_floats(n);
    float* m = xmalloc_floats(n);
    float* v = xmalloc_floats(n);
    memcpy(p, p0, n * sizeof(float));
    memcpy(g, g0, n * sizeof(float));
    memcpy(m, m0, n * sizeof(float));
    memcpy(v, v0, n * sizeof(float));
    GPT2 model;
    memset(&model, 0, sizeof(model));
    model.param_sizes[0] = n;
    model.num_parameters = n;
    model.params_memory = p;
    AdamWConfig opt = {ADAMW_B1, ADAMW_B2, ADAMW_EPS, ADAMW_WD, 1};
    gradients_clip_to(g, n, norm, max_norm);
    adamw_update_range(&model, &opt, ADAMW_LR, ADAMW_STEP, 0, n, g, m, v);

    L2Flush flush;
    l2flush_init(&flush);
    double peak = peak_bandwidth_gbs();
    int ok = 1;
    float *ref_param = NULL, *ref_master = NULL, *ref_m = NULL, *ref_v = NULL; /* variant 2's, for the bit checks */
    /* variant 2 first: 1 and 3 are compared with its bits */
    const int order[3] = {2, 1, 3};
    for (int k = 0; k < 3; k++) {
        int var = order[k];
        if (only && var != only && !(var == 2 && only != 2)) continue;
        ctx.variant = var;
        upload_f32(ctx.master, p0, n);
        upload_f32(ctx.grad, g0, n);
        upload_f32(ctx.m, m0, n);
        upload_f32(ctx.v, v0, n);
        CUDA_CHECK(cudaMemset(ctx.param, 0xff, n * sizeof(floatX))); /* NaN: an element never written fails */
        run_variant(&ctx);
        float* gp = from_device_bf16(ctx.param, n);
        float* gw = from_device_f32(ctx.master, n);
        float* gm = from_device_f32(ctx.m, n);
        float* gv = from_device_f32(ctx.v, n);
        int show = !only || only == var;
        if (show) {
            printf("variant %d (%s)\n", var,
                   var == 1 ? "naive: update, then a rounding kernel"
                            : var == 2 ? "production adamw_kernel" : "vectorised, 4 elements per thread");
            /* fp32 against fp32: the only differences are the order of operations
             * (FMA contraction, the clip coefficient in float on the device) */
            ok &= validate("master (fp32)", gw, p, n, 1e-7, 1e-5);
            ok &= validate("m (fp32)", gm, m, n, 1e-9, 1e-5);
            ok &= validate("v (fp32)", gv, v, n, 1e-12, 1e-5);
            ok &= validate_stochastic(gp, gw, n, 0);
            if (var == 2) { /* the checker itself: a weight one bf16 step past its neighbours must be rejected */
                float saved = gp[n / 2], planted;
                uint32_t b;
                memcpy(&b, &gw[n / 2], 4);
                b = (b & 0xffff0000u) + ((b & 0xffffu) ? 0x20000u : 0x10000u); /* two bf16 steps up (one when exact) */
                memcpy(&planted, &b, 4);
                gp[n / 2] = planted;
                int caught = !validate_stochastic(gp, gw, n, 1);
                printf("  %-28s %s  a bf16 weight planted beyond its neighbours is %s\n", "the checker",
                       caught ? "ok  " : "FAIL", caught ? "rejected" : "accepted");
                ok &= caught;
                gp[n / 2] = saved;
            }
            if (var != 2 && ref_param) {
                if (var == 3) { /* the same operations in the same order */
                    ok &= same_bits("master", gw, ref_master, n);
                    ok &= same_bits("m", gm, ref_m, n);
                    ok &= same_bits("v", gv, ref_v, n);
                }
                /* the same random bits for element i: where the masters are the
                 * same bits, so are the bf16 weights (variant 1's master may
                 * differ in the last place: its own arithmetic) */
                size_t differ = 0, same_master = 0;
                for (size_t i = 0; i < n; i++)
                    if (memcmp(&gw[i], &ref_master[i], 4) == 0) {
                        same_master++;
                        differ += memcmp(&gp[i], &ref_param[i], 4) != 0;
                    }
                printf("  %-28s %s  %zu of the %zu elements whose master is variant 2's differ in bf16\n",
                       "param (bf16) vs variant 2", differ ? "FAIL" : "ok  ", differ, same_master);
                ok &= differ == 0 && (var != 3 || same_master == n);
            }
        }
        if (var == 2) {
            ref_param = gp; ref_master = gw; ref_m = gm; ref_v = gv;
        } else {
            free(gp); free(gw); free(gm); free(gv);
        }
        if (show) {
            double ms = time_kernel(&flush, 20, run_variant, &ctx);
            char name[64];
            snprintf(name, sizeof(name), "variant %d", var);
            print_timing(name, ms, 30.0 * n, peak);
        }
    }
    l2flush_free(&flush);
    free(ref_param); free(ref_master); free(ref_m); free(ref_v);
    free(p0); free(g0); free(m0); free(v0); free(p); free(g); free(m); free(v);
    CUDA_CHECK(cudaFree(ctx.param)); CUDA_CHECK(cudaFree(ctx.master)); CUDA_CHECK(cudaFree(ctx.grad));
    CUDA_CHECK(cudaFree(ctx.m)); CUDA_CHECK(cudaFree(ctx.v)); CUDA_CHECK(cudaFree(ctx.norm)); CUDA_CHECK(cudaFree(ctx.step));
    printf("%s\n", ok ? "adamw: all variants valid" : "adamw: FAILED");
    return ok ? 0 : 1;
}
