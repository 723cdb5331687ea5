/*
 * gptc/cuda/classifier.cuh — the loss on the GPU: softmax, cross-entropy
 * and the logits' gradient in one kernel (the probabilities never stored),
 * and the mean of a micro-batch's losses.
 *
 * Included by train_gpt.cu and dev/cuda/classifier.cu, after train_gpt.c
 * and gptc/cuda/common.cuh.
 * Defines: online_merge, CLS_THREADS, CLS_UNROLL, classifier_kernel,
 * classifier_scalar_kernel, classifier_scalar_gpu, classifier_gpu,
 * mean_kernel.
 */
#ifndef GPTC_CUDA_CLASSIFIER_CUH
#define GPTC_CUDA_CLASSIFIER_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

/* ---- classifier: softmax + cross-entropy + dlogits in one kernel -------- */
/* One block per row of logits (N, Vp), bf16. Pass 1 keeps, per thread, a
 * running max m and sum s of e^(x - m) (the online softmax of Milakov &
 * Gimelshein 2018), merged across the block in a fixed order; the loss is
 * logsumexp - logit[target]. Pass 2 (when dloss != 0) overwrites the row in
 * place with dlogits = (softmax - onehot(target)) * dloss, pad columns 0.
 * The probabilities are never stored. */
__device__ __forceinline__ void online_merge(float& m, float& s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) { s = 0.0f; return; } /* both empty */
    s = s * expf(m - mm) + s2 * expf(m2 - mm);
    m = mm;
}

/* The production classifier: the same two passes with 16-byte loads and
 * stores (Vp % 8 == 0 and the logits 16-byte aligned; GPT-2's Vp = 50304 =
 * 8 x 6288), the target's logit read before anything is written. Pass 1 takes
 * the max of a pack first and rescales the running sum once per pack (8
 * exponentials and one rescale instead of up to 8 rescales). Pass 2 loads
 * CLS_UNROLL packs before it stores any, so each thread has that many
 * 16-byte loads in flight: it writes the row it reads, and without that the
 * compiler must wait for each load before the next (the same store-ordering
 * stall as the unfused LayerNorm backward's: see layernorm_backward_kernel).
 * Checked by dev/cuda/classifier.cu and test_gpt.cu. */
#define CLS_THREADS 512
#define CLS_UNROLL 4

__global__ void __launch_bounds__(CLS_THREADS)
    classifier_kernel(floatX* logits, float* losses, const int* targets, int V, int Vp, float dloss) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x, P = Vp / 8;
    floatX* xrow = logits + (size_t)row * Vp;
    Pack8* x = (Pack8*)xrow;
    int target = targets[row];
    float xt = __bfloat162float(xrow[target]); /* read before the barrier below, so before any store */
    float m = -INFINITY, s = 0.0f;
    int nan_seen = 0; /* fmaxf drops NaN: remember one, so that the loss says NaN (the failover guard looks) */
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        float f[8];
        pack8_to_float(f, x[p]);
        float pm = -INFINITY;
        for (int j = 0; j < 8; j++) {
            if (8 * p + j >= V) f[j] = -INFINITY; /* pad columns take no part */
            nan_seen |= f[j] != f[j];
            pm = fmaxf(pm, f[j]);
        }
        if (pm == -INFINITY) continue; /* a pack of padding only */
        float mm = fmaxf(m, pm);
        float t = 0.0f;
        for (int j = 0; j < 8; j++) t += expf(f[j] - mm);
        s = s * expf(m - mm) + t; /* m = -inf at first: s = 0 * 0 */
        m = mm;
    }
    if (nan_seen) s = NAN; /* online_merge carries a NaN sum through */
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads(); /* every warp's (m, s) is in shared memory; every thread has read x[target] */
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) online_merge(m, s, sm[w], ss[w]); /* same order in every thread */
    float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] = lse - xt;
    if (dloss == 0.0f) return;
    /* dlogits = (softmax - onehot(target)) * dloss, in place; pad columns 0 */
    for (int p0 = threadIdx.x; p0 < P; p0 += CLS_UNROLL * blockDim.x) {
        Pack8 in[CLS_UNROLL];
        for (int u = 0; u < CLS_UNROLL; u++) {
            int p = p0 + u * blockDim.x;
            if (p < P) in[u] = x[p];
        }
        for (int u = 0; u < CLS_UNROLL; u++) {
            int p = p0 + u * blockDim.x;
            if (p >= P) continue;
            float f[8];
            pack8_to_float(f, in[u]);
            for (int j = 0; j < 8; j++) {
                int v = 8 * p + j;
                float pr = v < V ? expf(f[j] - lse) : 0.0f;
                f[j] = (pr - (v == target ? 1.0f : 0.0f)) * dloss;
            }
            x[p] = float_to_pack8(f);
        }
    }
}

/* The scalar classifier, for Vp % 8 != 0 or unaligned logits, and the
 * kernel lab's variant 2 (its time on a GPU: dev/cuda/RESULTS.md, "Where a
 * step's time goes"). */
__global__ void classifier_scalar_kernel(floatX* logits, float* losses, const int* targets, int V, int Vp,
                                         float dloss) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x;
    floatX* x = logits + (size_t)row * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float xv = __bfloat162float(x[v]);
        if (xv > m) {
            s = s * expf(m - xv) + 1.0f;
            m = xv;
        } else {
            s += expf(xv - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) { sm[warp] = m; ss[warp] = s; }
    __syncthreads(); /* every warp's (m, s) is in shared memory */
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < nwarps; w++) online_merge(m, s, sm[w], ss[w]); /* same order in every thread */
    float lse = m + logf(s);
    int target = targets[row];
    __syncthreads(); /* everyone has read x[target] below before pass 2 overwrites it */
    float xt = __bfloat162float(x[target]);
    __syncthreads();
    if (threadIdx.x == 0) losses[row] = lse - xt;
    if (dloss == 0.0f) return;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float p = v < V ? expf(__bfloat162float(x[v]) - lse) : 0.0f;
        x[v] = __float2bfloat16((p - (v == target ? 1.0f : 0.0f)) * dloss);
    }
}

/* The scalar classifier alone: the fallback, and the kernel lab's variant 2. */
static void classifier_scalar_gpu(floatX* logits, float* losses, const int* targets, int N, int V, int Vp,
                                  float dloss, cudaStream_t s) {
    classifier_scalar_kernel<<<N, 512, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    KERNEL_CHECK();
}

static void classifier_gpu(floatX* logits, float* losses, const int* targets, int N, int V, int Vp, float dloss,
                           cudaStream_t s) {
    if (Vp % 8 != 0 || !is_aligned16(logits)) {
        classifier_scalar_gpu(logits, losses, targets, N, V, Vp, dloss, s);
        return;
    }
    classifier_kernel<<<N, CLS_THREADS, 0, s>>>(logits, losses, targets, V, Vp, dloss);
    KERNEL_CHECK();
}

/* out[slot[0]] = mean of losses(N), in a fixed order (one block). The slot
 * (the micro-batch) is read from device memory, uploaded with the tokens. */
__global__ void mean_kernel(float* out, const int* slot, const float* x, int N) {
    __shared__ float shared[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) acc += x[i];
    acc = block_sum(acc, shared);
    if (threadIdx.x == 0) out[slot[0]] = acc / N;
}

#endif /* GPTC_CUDA_CLASSIFIER_CUH */
