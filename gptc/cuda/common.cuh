/*
 * gptc/cuda/common.cuh — what every CUDA kernel family shares: the checked
 * calls (CUDA_CHECK, CUBLAS_CHECK, KERNEL_CHECK), the storage type of
 * parameters and activations (floatX, bf16), ceil_div, warp and block sums,
 * and Pack8, 8 bf16 moved as one 16-byte load or store.
 *
 * Included by train_gpt.cu (before its device-memory ledger, which calls
 * CUDA_CHECK), by each gptc/cuda/<family>.cuh and by dev/cuda/<family>.cu, after
 * train_gpt.c (stdio, stdlib, stdint, string).
 * Defines: CUDA_CHECK, CUBLAS_CHECK, KERNEL_CHECK, floatX, ceil_div,
 * warp_sum, warp_max, block_sum, Pack8, pack8_to_float, float_to_pack8,
 * is_aligned16.
 */
#ifndef GPTC_CUDA_COMMON_CUH
#define GPTC_CUDA_COMMON_CUH

#include <cuda_runtime.h> // cudaError_t, cudaGetErrorString, cudaGetLastError
#include <cuda_bf16.h>    // __nv_bfloat16, __float2bfloat16, __bfloat162float
#include <cublasLt.h>     // cublasStatus_t, cublasLtGetStatusString (CUBLAS_CHECK)

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(err_));                                        \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t st_ = (call);                                                  \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                           \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
                    cublasLtGetStatusString(st_));                                    \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)

/* After every launch: catches bad launch configurations at once. (Faults
 * inside a kernel surface at the next synchronising call.) */
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

typedef __nv_bfloat16 floatX; /* the storage type of parameters and activations */

static int ceil_div(long long a, long long b) { return (int)((a + b - 1) / b); }

__device__ __forceinline__ float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over a block of up to 1024 threads, the same tree every time (so the
 * result is bitwise reproducible). Every thread gets the total. `shared`
 * holds 32 floats. */
__device__ float block_sum(float x, float* shared) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    x = warp_sum(x);
    __syncthreads(); /* shared may still be read by a previous call */
    if (lane == 0) shared[warp] = x;
    __syncthreads(); /* every warp's partial is written */
    float y = lane < nwarps ? shared[lane] : 0.0f;
    return warp_sum(y);
}

/* 8 bf16 = 16 bytes: one vector load or store. */
struct alignas(16) Pack8 {
    floatX v[8];
};
/* bf16 pack <-> 8 floats */
__device__ __forceinline__ void pack8_to_float(float f[8], const Pack8& p) {
    for (int j = 0; j < 8; j++) f[j] = __bfloat162float(p.v[j]);
}
__device__ __forceinline__ Pack8 float_to_pack8(const float f[8]) {
    Pack8 p;
    for (int j = 0; j < 8; j++) p.v[j] = __float2bfloat16(f[j]);
    return p;
}
static int is_aligned16(const void* p) { return ((uintptr_t)p & 15) == 0; }

#endif /* GPTC_CUDA_COMMON_CUH */
