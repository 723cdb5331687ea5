/*
 * gptc/cuda/quant.cuh — ZeRO++'s block quantisation on the GPU (gptc/quant.h's
 * format, bit for bit): encoding a piece into a slot, decoding the gathered
 * weights (qwZ), and the two hops of the quantised gradient reduce-scatter
 * (qgZ).
 *
 * Included by train_gpt.cu (its --zero 3 with --qwz / --qgz calls it),
 * after train_gpt.c and gptc/cuda/common.cuh.
 * Defines: quant_slot_element, quant_scale_kernel, quant_code_kernel,
 * quant_encode_gpu, qwz_decode_kernel, qgz_hop0_kernel, qgz_hop1_kernel.
 */
#ifndef GPTC_CUDA_QUANT_CUH
#define GPTC_CUDA_QUANT_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

/* ---- ZeRO++'s block codec on the device (qwZ, qgZ; checked bit for bit
 * against scripts/tests/zeropp_ref.py by scripts/tests/test_cuda_zeropp.sh) ----
 * The format is gptc/quant.h's, bit for bit (its header comment): a piece
 * of n floats quantises into one slot, ceil(n / block) fp32 scales then the
 * codes (n bytes INT8, ceil(n / 2) INT4: the low nibble first), padded to 4
 * bytes; scale s = fl(m / qmax) of the block's m = max|x| (raised an ulp
 * while subnormal and qmax s < m, lowered while qmax s overflows; 0 for an
 * all-zero block, NaN when any element is not finite), code q = x / s in
 * double rounded half to even, deq = fl(q s). Every fp32 product and sum is
 * written __fmul_rn / __fadd_rn so that nvcc cannot fuse them into an FMA
 * (the CPU reference rounds each on its own). */

/* element k of a slot of n floats, dequantised (one fp32 rounding) */
__device__ inline float quant_slot_element(const uint8_t* slot, size_t n, size_t k, int bits, int block) {
    const float* scales = (const float*)slot;
    const uint8_t* payload = slot + 4 * ((n + (size_t)block - 1) / (size_t)block);
    int code = bits == 8 ? (int)(int8_t)payload[k] : (((payload[k >> 1] >> ((k & 1) * 4)) & 0xF) ^ 8) - 8;
    return __fmul_rn((float)code, scales[k / (size_t)block]);
}

/* x (n) quantised into slot, in two kernels (quant_encode_gpu); residual
 * (n, or NULL): error feedback, v = x + residual is what is quantised and
 * residual becomes v - deq (0 in a block whose scale is 0 or NaN).
 * 1. quant_scale_kernel, one warp per block of the format (grid: ceil(nb /
 *    8) blocks of 256 threads): the lanes stride over its elements for m =
 *    max |v| (exact in any order), a shuffle reduction, lane 0 writes s. */
__global__ void quant_scale_kernel(uint8_t* slot, const float* x, const float* residual, size_t n, int bits, int block) {
    size_t nb = (n + (size_t)block - 1) / (size_t)block;
    size_t b = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (b >= nb) return; /* (a whole warp: its lanes share b) */
    size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
    float m = 0.0f;
    int nonfinite = 0;
    for (size_t i = lo + (size_t)lane; i < hi; i += 32) {
        float a = fabsf(residual ? __fadd_rn(x[i], residual[i]) : x[i]);
        nonfinite |= !(a <= FLT_MAX); /* NaN compares false, Inf is above */
        m = a > m ? a : m;
    }
    for (int o = 16; o > 0; o >>= 1) { /* m and nonfinite over the warp, in every lane */
        float other = __shfl_xor_sync(0xFFFFFFFFu, m, o);
        m = other > m ? other : m;
        nonfinite |= __shfl_xor_sync(0xFFFFFFFFu, nonfinite, o);
    }
    if (lane) return;
    int qmax = bits == 8 ? 127 : 7;
    float s = 0.0f; /* gptc/quant.h's quant_scale_of */
    if (nonfinite) s = NAN;
    else if (m > 0.0f) {
        s = __fdiv_rn(m, (float)qmax);
        if (s < FLT_MIN) /* subnormal: up to the first s with qmax s >= m */
            while ((double)s * qmax < (double)m) s = nextafterf(s, INFINITY);
        while (isinf(__fmul_rn((float)qmax, s))) s = nextafterf(s, 0.0f); /* m near FLT_MAX */
    }
    ((float*)slot)[b] = s;
}

/* 2. quant_code_kernel, one thread per 4-byte word of the payload (its 4
 *    INT8 or 8 INT4 codes, which may straddle two blocks; codes past n are
 *    0, so the padding is zeros): q = rint(v / s) in double, packed, the
 *    word written whole (adjacent bytes are never written by two threads). */
__global__ void quant_code_kernel(uint8_t* slot, const float* x, float* residual, size_t n, int bits, int block) {
    size_t nb = (n + (size_t)block - 1) / (size_t)block, per = bits == 8 ? 4 : 8;
    size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= (n + per - 1) / per) return;
    const float* scales = (const float*)slot;
    uint32_t word = 0;
    for (size_t e = 0; e < per; e++) {
        size_t i = w * per + e;
        if (i >= n) break;
        float s = scales[i / (size_t)block];
        float v = residual ? __fadd_rn(x[i], residual[i]) : x[i];
        int live = s > 0.0f; /* 0 or NaN: the code 0, the residual 0 */
        int q = live ? (int)rint((double)v / (double)s) : 0;
        word |= bits == 8 ? (uint32_t)(uint8_t)(int8_t)q << (8 * e) : (uint32_t)(q & 0xF) << (4 * e);
        if (residual) residual[i] = live ? __fsub_rn(v, __fmul_rn((float)q, s)) : 0.0f;
    }
    ((uint32_t*)(slot + 4 * nb))[w] = word; /* little-endian: element 4w + e in byte e (INT4: the low nibble first) */
}

/* both, on stream s */
static void quant_encode_gpu(uint8_t* slot, const float* x, float* residual, size_t n, int bits, int block,
                             cudaStream_t s) {
    size_t nb = quant_num_blocks(n, block), words = (quant_payload_bytes(n, bits) + 3) / 4;
    quant_scale_kernel<<<ceil_div((long long)nb, 8), 256, 0, s>>>(slot, x, residual, n, bits, block);
    KERNEL_CHECK();
    quant_code_kernel<<<ceil_div((long long)words, 256), 256, 0, s>>>(slot, x, residual, n, bits, block);
    KERNEL_CHECK();
}

/* qwZ's arrival: dst (W piece) = the W slots dequantised, rank q's piece at q
 * piece from its slot slot_of[q] of `slots` (sb bytes each), rounded to
 * nearest bf16. One thread an element. */
__global__ void qwz_decode_kernel(floatX* dst, const uint8_t* slots, const int* slot_of, size_t sb, size_t piece,
                                  int W, int bits, int block) {
    size_t d = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= (size_t)W * piece) return;
    size_t q = d / piece, k = d % piece;
    dst[d] = __float2bfloat16_rn(quant_slot_element(slots + (size_t)slot_of[q] * sb, piece, k, bits, block));
}

/* qgZ, hop 0's sums: partial (N piece) = for each node p the rank's own
 * values of the piece of rank who[j N + p] (this rank's local index j),
 * plus, in fp32 and in the order t = 1 .. K-1, the dequantised slot of the
 * node peer j - t (mod K): recv holds peer i's N slots at i N. */
__global__ void qgz_hop0_kernel(float* partial, const float* bucket, const int* who, const uint8_t* recv, size_t sb,
                                size_t piece, int N, int K, int j, int bits, int block) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * piece) return;
    size_t p = e / piece, k = e % piece;
    float acc = bucket[(size_t)who[(size_t)j * N + p] * piece + k];
    for (int t = 1; t < K; t++) {
        int from = (j - t + K) % K;
        acc = __fadd_rn(acc, quant_slot_element(recv + ((size_t)from * N + p) * sb, piece, k, bits, block));
    }
    partial[e] = acc;
}

/* qgZ, hop 1 and the owner's shard: grad (piece) += mine + the other nodes'
 * dequantised partial sums of this rank's piece, in the order t = 1 .. N-1
 * from node p - t (mod N) (recv holds node i's slot at i). */
__global__ void qgz_hop1_kernel(float* grad, const float* mine, const uint8_t* recv, size_t sb, size_t piece, int N,
                                int p, int bits, int block) {
    size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= piece) return;
    float acc = mine[k];
    for (int t = 1; t < N; t++)
        acc = __fadd_rn(acc, quant_slot_element(recv + (size_t)((p - t + N) % N) * sb, piece, k, bits, block));
    grad[k] = __fadd_rn(grad[k], acc);
}

#endif /* GPTC_CUDA_QUANT_CUH */
