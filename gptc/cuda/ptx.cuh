/* gptc/cuda/ptx.cuh: the tensor-core and asynchronous-copy instructions the
 * attention kernels use, each a small device function: inline PTX on a GPU,
 * the CPU execution layer's models of them there (CUDA_CPU_LAYER;
 * dev/cuda/cpu/cuda_cpu.h section 3c).
 * Included by gptc/cuda/attention.cuh. Defines mma_bf16_16816, ldsm_x4,
 * ldsm_x4_t, ldsm_x2, ldsm_x2_t, cp_async16, cp_async_commit, cp_async_wait,
 * pack_bf16.
 *
 * The fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"; lane l, g =
 * l / 4, t = l % 4; a 32-bit register holds two bf16, the lower index in its
 * low half):
 *   A, 16 x 16 row-major:  a[0] = A[g][2t..2t+1]   a[1] = A[g+8][2t..]
 *                          a[2] = A[g][2t+8..]     a[3] = A[g+8][2t+8..]
 *   B, 16 x 8 (k x n):     b[0] = B[2t..2t+1][g]   b[1] = B[2t+8..][g]
 *   C, D, 16 x 8 fp32:     d[0..1] = D[g][2t..2t+1]   d[2..3] = D[g+8][2t..2t+1]
 * ldmatrix.m8n8 (lanes 8i..8i+7 give the 16-byte row addresses of matrix i):
 * lane l receives from matrix i the pair at row l / 4, columns 2t, 2t + 1;
 * with .trans the pair (2t, l / 4), (2t + 1, l / 4). So ldsm_x4 of a 16 x 16
 * bf16 tile (matrices: rows 0-7 | 8-15 of columns 0-7, then of 8-15) gives
 * an A fragment, and of K's rows (keys) a B fragment of K^T; ldsm_x4_t of V's
 * rows gives B fragments of V. */
#ifndef GPTC_CUDA_PTX_CUH
#define GPTC_CUDA_PTX_CUH

#include <stdint.h>

/* Two floats as a register of two bf16 (round to nearest): lo in the low half. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat16 a = __float2bfloat16(lo), b = __float2bfloat16(hi);
    uint16_t ua, ub;
    memcpy(&ua, &a, 2);
    memcpy(&ub, &b, 2);
    return (uint32_t)ua | (uint32_t)ub << 16;
}

#ifdef CUDA_CPU_LAYER

/* d += a b (16 x 16 by 16 x 8, fp32 accumulators), the whole warp */
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    cuda_cpu::mma_16816(d, a, b);
}

/* ldmatrix of n 8x8 b16 matrices (trans: transposed); row: this lane's row address */
__device__ __forceinline__ void ldsm_n(uint32_t* r, const void* row, int n, bool trans) {
    const uintptr_t* rows = cuda_cpu::ldmatrix_rows(row, n, trans);
    const int l = threadIdx.x % 32, g = l / 4, t = l % 4;
    for (int i = 0; i < n; i++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            const uint16_t* at = trans ? (const uint16_t*)rows[8 * i + 2 * t + h] + g
                                       : (const uint16_t*)rows[8 * i + g] + 2 * t + h;
            e[h] = *at;
        }
        r[i] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    cuda_cpu::ldmatrix_leave();
}
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* row) { ldsm_n(r, row, 4, false); }
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void* row) { ldsm_n(r, row, 4, true); }
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], const void* row) { ldsm_n(r, row, 2, false); }
__device__ __forceinline__ void ldsm_x2_t(uint32_t r[2], const void* row) { ldsm_n(r, row, 2, true); }

/* 16 bytes global -> shared, completed at a cp_async_wait */
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const uint4 v = *(const uint4*)gmem; /* (read now: a kernel's inputs do not change before the wait) */
    cuda_cpu::async_issue(smem, &v);
}
__device__ __forceinline__ void cp_async_commit() { cuda_cpu::async_commit(); }
/* every committed group but the newest n is in shared memory (this thread's copies) */
template <int n> __device__ __forceinline__ void cp_async_wait() {
    void* dst;
    uint4 v;
    while (cuda_cpu::async_take(n, &dst, &v)) *(uint4*)dst = v;
}

#else /* a GPU: inline PTX (sm_80 and later) */

__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_u32(row)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(row)));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t r[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(row)));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int n> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
}

#endif /* CUDA_CPU_LAYER */

#endif /* GPTC_CUDA_PTX_CUH */
