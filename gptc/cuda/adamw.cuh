/*
 * gptc/cuda/adamw.cuh — the update on the GPU: the global gradient norm
 * (a fixed two-pass reduction), AdamW on the fp32 master with stochastic
 * rounding to the bf16 weights, the gate that skips a non-finite step, and
 * the fp32 <-> bf16 conversions.
 *
 * Included by train_gpt.cu and dev/cuda/adamw.cu, after train_gpt.c and
 * gptc/cuda/common.cuh; gptc/cuda/shard.cuh builds its ZeRO kernels on
 * clip_coef, adamw_element and the rounding.
 * Defines: NORM_BLOCKS, norm_squares_partial_kernel, norm_finish_kernel,
 * hash_u32, bf16_round_stochastic, clip_coef, adamw_element, AdamWStep,
 * adamw_kernel, update_gate_kernel, float_to_bf16_kernel,
 * bf16_round_stochastic_kernel, bf16_to_float_kernel.
 */
#ifndef GPTC_CUDA_ADAMW_CUH
#define GPTC_CUDA_ADAMW_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

/* ---- global gradient norm: fixed two-pass reduction --------------------- */
/* The grid is a constant (not the SM count), so the summation order, and
 * with it the result, is the same on every GPU and every run. */
#define NORM_BLOCKS 1024
__global__ void norm_squares_partial_kernel(float* partial, const float* g, size_t n) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += g[i] * g[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
/* out[0] = the sum of the partials, or its square root (the norm) */
__global__ void norm_finish_kernel(float* out, const float* partial, int n, int take_sqrt) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[0] = take_sqrt ? sqrtf(acc) : acc;
}

/* ---- AdamW with stochastic rounding ------------------------------------ */
/* An integer hash (Wellons' "lowbias32") gives each element of each step its
 * own random bits: reproducible, and no RNG state to store. */
__device__ __forceinline__ uint32_t hash_u32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* fp32 -> bf16 rounding up or down with probability proportional to the
 * distance (so the rounding is unbiased in expectation): add 16 random bits
 * below the kept 16 and truncate. Inf and NaN pass through unchanged. */
__device__ __forceinline__ floatX bf16_round_stochastic(float x, uint32_t random) {
    uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7f800000u) == 0x7f800000u) return __float2bfloat16_rn(x);
    bits = (bits + (random & 0xffffu)) & 0xffff0000u;
    __nv_bfloat16_raw raw;
    raw.x = (unsigned short)(bits >> 16);
    return floatX(raw);
}

/* Clip coefficient from the global norm: torch.nn.utils.clip_grad_norm_'s
 * rule, as train_gpt.c's gradients_clip_to (max_norm <= 0: no clipping). */
__host__ __device__ __forceinline__ float clip_coef(float norm, float max_norm) { /* (the host's too: --offload 1) */
    float coef = 1.0f;
    if (max_norm > 0.0f && isfinite(norm)) {
        float c = max_norm / (norm + 1e-6f);
        if (c < 1.0f) coef = c;
    }
    return coef;
}

/* train_gpt.c's AdamW for one parameter (Loshchilov & Hutter 2019, Alg. 2):
 * updates the moments *m, *v and returns the new master value. */
__device__ __forceinline__ float adamw_element(float p, float g, float* m, float* v, float lr, float b1, float b2,
                                               float bc1, float bc2, float eps, float wd) {
    float mi = b1 * *m + (1.0f - b1) * g;
    float vi = b2 * *v + (1.0f - b2) * g * g;
    *m = mi;
    *v = vi;
    p = p - lr * wd * p;
    return p - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
}

/* What changes from one update to the next, read by the kernels from device
 * memory (not passed as arguments), so that one captured update (CUDA
 * graphs) serves every step: the host writes it before each update. */
typedef struct {
    float lr;      /* the schedule's learning rate at this step */
    float bc1;     /* 1 - beta1^t, 1 - beta2^t: Adam's bias corrections at update t (1-based) */
    float bc2;
    uint32_t seed; /* the step's stochastic-rounding seed (tensor k uses seed * 16 + k) */
    int go;        /* 0: skip the update (a non-finite loss or norm: update_gate_kernel) */
} AdamWStep;

/* train_gpt.c's adamw_update for one tensor (number `tensor`), on the fp32
 * master, with the clip coefficient taken from the device-side norm, then
 * the bf16 copy written with stochastic rounding (element i of the tensor,
 * the seed step->seed * 16 + tensor). Nothing when !step->go. */
__global__ void adamw_kernel(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                             const AdamWStep* step, float b1, float b2, float eps, float wd, const float* norm,
                             float max_norm, uint32_t tensor) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !step->go) return;
    float g = grad[i] * clip_coef(norm[0], max_norm);
    float p = adamw_element(master[i], g, &m[i], &v[i], step->lr, b1, b2, step->bc1, step->bc2, eps, wd);
    master[i] = p;
    param[i] = bf16_round_stochastic(p, hash_u32((uint32_t)i ^ hash_u32(step->seed * 16u + tensor)));
}

/* One GPU: the update goes ahead only if every micro-batch's mean loss and
 * the gradient norm are finite (train_gpt.c's rule), decided here on the
 * device so that the host need not wait for the loss before launching the
 * update. (With the loss summed over ranks, or a spike rule, the host
 * decides: dp_step.) */
__global__ void update_gate_kernel(AdamWStep* step, const float* loss_mean, int micro_batches, const float* norm) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int go = isfinite(norm[0]);
    for (int i = 0; i < micro_batches; i++) go = go && isfinite(loss_mean[i]);
    step->go = go;
}

/* fp32 -> bf16, round to nearest (the first copy of the master weights). */
__global__ void float_to_bf16_kernel(floatX* out, const float* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

/* fp32 -> bf16 with the stochastic rounding adamw_kernel applies to tensor
 * element i under `seed` (that kernel's seed argument): from the master an
 * update wrote, the bf16 weights it wrote, bit for bit (a resumed run). */
__global__ void bf16_round_stochastic_kernel(floatX* out, const float* in, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_round_stochastic(in[i], hash_u32((uint32_t)i ^ hash_u32(seed)));
}

/* bf16 -> fp32 (copies for the host: logits, activations in the tests). */
__global__ void bf16_to_float_kernel(float* out, const floatX* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(in[i]);
}

#endif /* GPTC_CUDA_ADAMW_CUH */
