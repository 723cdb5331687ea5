/*
 * gptc/cuda/gelu.cuh — GELU (tanh form) forward and backward on the GPU, 8
 * bf16 per thread, with one-element kernels for unaligned pointers.
 *
 * Included by train_gpt.cu and dev/cuda/gelu.cu, after train_gpt.c
 * (GELU_SCALE) and gptc/cuda/common.cuh; gptc/cuda/matmul.cuh runs it when
 * cuBLASLt has no GELU epilogue.
 * Defines: gelu_of, gelu_grad_of, gelu_forward_vec8_kernel,
 * gelu_backward_vec8_kernel, gelu_forward_kernel, gelu_backward_kernel,
 * gelu_forward_gpu, gelu_backward_gpu.
 */
#ifndef GPTC_CUDA_GELU_CUH
#define GPTC_CUDA_GELU_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

/* ---- GELU (tanh form, as train_gpt.c's gelu_forward) -------------------- */
/* train_gpt.c's sigmoid form: 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)),
 * u = sqrt(2/pi) (x + 0.044715 x^3). */
__device__ __forceinline__ float gelu_of(float x) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}
/* d * gelu'(x) */
__device__ __forceinline__ float gelu_grad_of(float x, float d) {
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    return d * (s + x * s * (1.0f - s) * 2.0f * du);
}

/* The production kernels: 8 bf16 per thread, one 16-byte load per input
 * and one 16-byte store (the pointers 16-byte aligned: gelu_forward_gpu
 * checks), the last N % 8 one at a time. Memory-bound: forward moves 4N
 * bytes, backward 6N. (dev/cuda/gelu.cu times them against the one-element
 * kernels below, which are the fallback for unaligned pointers; the same
 * bits.) */
__global__ void gelu_forward_vec8_kernel(floatX* out, const floatX* inp, long long N) {
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N) return;
    if (i0 + 8 <= N) {
        Pack8 x = *(const Pack8*)(inp + i0), y;
        for (int k = 0; k < 8; k++) y.v[k] = __float2bfloat16(gelu_of(__bfloat162float(x.v[k])));
        *(Pack8*)(out + i0) = y;
    } else {
        for (long long i = i0; i < N; i++) out[i] = __float2bfloat16(gelu_of(__bfloat162float(inp[i])));
    }
}

/* dinp = dout * gelu'(inp); may be in place (dinp == dout: each thread
 * reads its 8 elements before it writes them). */
__global__ void gelu_backward_vec8_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long long N) {
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i0 >= N) return;
    if (i0 + 8 <= N) {
        Pack8 x = *(const Pack8*)(inp + i0), d = *(const Pack8*)(dout + i0), r;
        for (int k = 0; k < 8; k++) r.v[k] = __float2bfloat16(gelu_grad_of(__bfloat162float(x.v[k]), __bfloat162float(d.v[k])));
        *(Pack8*)(dinp + i0) = r;
    } else {
        for (long long i = i0; i < N; i++)
            dinp[i] = __float2bfloat16(gelu_grad_of(__bfloat162float(inp[i]), __bfloat162float(dout[i])));
    }
}

/* One element per thread: for pointers not 16-byte aligned. */
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = __float2bfloat16(gelu_of(__bfloat162float(inp[i])));
}
__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, long long N) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) dinp[i] = __float2bfloat16(gelu_grad_of(__bfloat162float(inp[i]), __bfloat162float(dout[i])));
}

static void gelu_forward_gpu(floatX* out, const floatX* inp, long long N, cudaStream_t s) {
    if (is_aligned16(out) && is_aligned16(inp))
        gelu_forward_vec8_kernel<<<ceil_div(ceil_div(N, 8), 256), 256, 0, s>>>(out, inp, N);
    else
        gelu_forward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(out, inp, N);
    KERNEL_CHECK();
}
static void gelu_backward_gpu(floatX* dinp, const floatX* inp, const floatX* dout, long long N, cudaStream_t s) {
    if (is_aligned16(dinp) && is_aligned16(inp) && is_aligned16(dout))
        gelu_backward_vec8_kernel<<<ceil_div(ceil_div(N, 8), 256), 256, 0, s>>>(dinp, inp, dout, N);
    else
        gelu_backward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(dinp, inp, dout, N);
    KERNEL_CHECK();
}

#endif /* GPTC_CUDA_GELU_CUH */
