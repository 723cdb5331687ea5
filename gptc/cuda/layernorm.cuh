/*
 * gptc/cuda/layernorm.cuh — LayerNorm forward and backward on the GPU, and
 * the deterministic column sums that give the bias gradients (and the
 * parameter gradients of the unfused LayerNorm backward).
 *
 * Included by train_gpt.cu and dev/cuda/layernorm.cu, after train_gpt.c
 * (LAYERNORM_EPS, CHECK) and gptc/cuda/common.cuh; gptc/cuda/matmul.cuh
 * calls its bias_backward_gpu.
 * Defines: LN_MAX_PACKS, row_pack_load, row_pack_store, layernorm_packs,
 * layernorm_forward_kernel, layernorm_forward_scalar_kernel,
 * layernorm_forward_scalar_gpu, layernorm_forward_gpu,
 * layernorm_backward_kernel, layernorm_backward_part_floats,
 * column_sums_finish_kernel/_gpu, layernorm_backward_dx_kernel,
 * column_sums_partial_kernel, column_sums_partial_vec_kernel,
 * column_sums_splits, bias_backward_scalar_gpu, bias_backward_gpu,
 * layernorm_backward_unfused_gpu, layernorm_backward_scratch_floats,
 * layernorm_backward_gpu.
 */
#ifndef GPTC_CUDA_LAYERNORM_CUH
#define GPTC_CUDA_LAYERNORM_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK

/* ---- layernorm ---------------------------------------------------------- */
/* The production kernels keep one row per warp in registers: each lane owns
 * the 8-channel groups ("packs") p = lane, lane + 32, ..., K of them, so a
 * row of C <= 256 K channels is read from memory once, as 16-byte loads
 * when C % 8 == 0 and every pointer is 16-byte aligned (vec), as 8 scalar
 * loads per pack otherwise (the tiny fixtures: C = 36). K = ceil(C / 256) is
 * a template parameter (1..LN_MAX_PACKS) so that the row's packs index
 * registers; wider rows take the scalar kernels further down.
 * Checked by dev/cuda/layernorm.cu and test_gpt.cu. */
#define LN_MAX_PACKS 8 /* C <= 2048 on the register path (GPT-2 XL: C = 1600, K = 7) */

/* Pack p of a row of C channels (channels 8p .. 8p+7): one 16-byte load, or
 * (not vec) 8 scalar loads with the channels past C read as 0. */
__device__ __forceinline__ Pack8 row_pack_load(const floatX* row, int p, int C, int vec) {
    if (vec) return ((const Pack8*)row)[p];
    Pack8 r;
    for (int j = 0; j < 8; j++) r.v[j] = 8 * p + j < C ? row[8 * p + j] : __float2bfloat16(0.0f);
    return r;
}
__device__ __forceinline__ void row_pack_store(floatX* row, int p, int C, int vec, const Pack8& v) {
    if (vec) {
        ((Pack8*)row)[p] = v;
        return;
    }
    for (int j = 0; j < 8; j++)
        if (8 * p + j < C) row[8 * p + j] = v.v[j];
}

static int layernorm_packs(int C) { return ceil_div(ceil_div(C, 8), 32); } /* K */

/* out = (x - mean) * rstd * w + b, one warp per row, the row in registers:
 * mean, then the variance as the mean of (x - mean)^2 (two passes over the
 * registers, not E[x^2] - mean^2, which cancels), both warp sums. */
template <int K>
__global__ void layernorm_forward_kernel(floatX* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const floatX* __restrict__ inp,
                                         const floatX* __restrict__ weight, const floatX* __restrict__ bias,
                                         int N, int C, int vec) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    int P = (C + 7) / 8;
    const floatX* x = inp + (size_t)row * C;
    float xr[K][8]; /* this lane's packs of the row, fp32 */
    float sum = 0.0f;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p < P) pack8_to_float(xr[i], row_pack_load(x, p, C, vec)); /* every load issued before any use */
    }
    for (int i = 0; i < K; i++)
        if (lane + 32 * i < P)
            for (int j = 0; j < 8; j++) sum += xr[i][j]; /* channels past C were read as 0 */
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p < P)
            for (int j = 0; j < 8; j++) {
                float d = 8 * p + j < C ? xr[i][j] - m : 0.0f;
                var += d * d;
            }
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    floatX* o = out + (size_t)row * C;
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p >= P) continue;
        float w[8], b[8], y[8];
        pack8_to_float(w, row_pack_load(weight, p, C, vec));
        pack8_to_float(b, row_pack_load(bias, p, C, vec));
        for (int j = 0; j < 8; j++) y[j] = (xr[i][j] - m) * s * w[j] + b[j];
        row_pack_store(o, p, C, vec, float_to_pack8(y));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

/* The scalar forward, for rows wider than 256 LN_MAX_PACKS channels, and
 * the kernel lab's variant 2. One warp per row, three passes over the row
 * (the second and third hit L1/L2). */
__global__ void layernorm_forward_scalar_kernel(floatX* out, float* mean, float* rstd, const floatX* inp,
                                                const floatX* weight, const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* x = inp + (size_t)row * C;
    floatX* o = out + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += __bfloat162float(x[c]);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = __bfloat162float(x[c]) - m;
        var += d * d;
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        o[c] = __float2bfloat16(n * __bfloat162float(weight[c]) + __bfloat162float(bias[c]));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

#define LN_ROWS_PER_BLOCK 8 /* warps (one row each) per block: the forwards and the unfused dx kernel */

static void layernorm_forward_scalar_gpu(floatX* out, float* mean, float* rstd, const floatX* inp,
                                         const floatX* weight, const floatX* bias, int N, int C, cudaStream_t s) {
    layernorm_forward_scalar_kernel<<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>(
        out, mean, rstd, inp, weight, bias, N, C);
    KERNEL_CHECK();
}

/* Calls F(K) with K = 1..LN_MAX_PACKS a compile-time constant. */
#define LN_DISPATCH_K(K_RUNTIME, F) \
    switch (K_RUNTIME) {            \
    case 1: F(1); break;            \
    case 2: F(2); break;            \
    case 3: F(3); break;            \
    case 4: F(4); break;            \
    case 5: F(5); break;            \
    case 6: F(6); break;            \
    case 7: F(7); break;            \
    case 8: F(8); break;            \
    default: CHECK(0, "layernorm: no kernel for this width"); \
    }

static void layernorm_forward_gpu(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, cudaStream_t s) {
    int K = layernorm_packs(C);
    if (K > LN_MAX_PACKS) {
        layernorm_forward_scalar_gpu(out, mean, rstd, inp, weight, bias, N, C, s);
        return;
    }
    int vec = C % 8 == 0 && is_aligned16(out) && is_aligned16(inp) && is_aligned16(weight) && is_aligned16(bias);
#define LN_FWD(KK)                                                                                      \
    layernorm_forward_kernel<KK><<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>( \
        out, mean, rstd, inp, weight, bias, N, C, vec)
    LN_DISPATCH_K(K, LN_FWD);
#undef LN_FWD
    KERNEL_CHECK();
}

/* LayerNorm backward in one pass (Ba, Kiros & Hinton 2016; the CPU twin's
 * layernorm_backward). With n = (x - mean) * rstd and dn = dy * w:
 *   dx += rstd * (dn - mean(dn) - n * mean(dn * n))     (dinp, accumulated)
 *   dweight += sum over rows of dy * n,  dbias += sum over rows of dy
 * Block b owns rows [32 b, 32 b + 32): its 4 warps take every 4th row, each
 * lane holding its packs of x, dy and dinp in registers (all loads of a row
 * issued before any store). Each warp keeps running dweight/dbias sums of
 * its rows in its own slice of shared memory, every lane touching only its
 * own channels (no atomics; laid out [j][p] so a warp's accesses hit 32
 * banks). At the end the block adds its warps' sums in warp order and writes
 * its partial row (blocks, C) of each; column_sums_finish_kernel adds the
 * partials in block order. The result is the
 * same on every run and every GPU: the row-to-block map depends on N only.
 *
 * Why the unfused dx kernel (layernorm_backward_dx_kernel below) is 16 times
 * slower than the forward with the same access pattern (on an H200 at
 * 16384 x 768: dev/cuda/RESULTS.md, "Where a step's time goes"; the
 * reasoning is from the code, not a deeper profile): its second loop
 * reads dx[c] (first touch: DRAM), x[c], dy[c], w[c] and then stores dx[c];
 * nothing says dinp does not alias the inputs, so the compiler cannot move
 * the next iteration's loads above this store, and each lane has exactly one
 * 2-byte load in flight per DRAM round trip: 24 serialised round trips per
 * row, ~64 bytes in flight per warp. By Little's law an H200 needs roughly
 * 30 KB in flight per SM to stream at 4.8 TB/s; at 64 warps x 64 B it gets
 * ~4 KB, so a few hundred GB/s (the kernel lab's figure: dev/cuda/RESULTS.md).
 * The forward's loop that stores has the same shape, but its loads there hit
 * L1 (the row was read twice already), so the serialisation costs L1, not
 * DRAM, latency. Here every row is one burst of 16-byte loads (3 tensors x
 * K packs per lane, ~4.6 KB per warp at C = 768) and then one burst of
 * stores, and the dweight/dbias sums reuse the registers instead of reading
 * x and dy a second time (as the unfused path's column_sums_partial_kernel<true>
 * does).
 * Registers: the sums live in shared memory, not registers, because 16 fp32
 * per pack would cost 48 registers per lane at C = 768 (ptxas: 174 per
 * thread with them, one block per SM). */
#define LN_BWD_WARPS 4
#define LN_BWD_ROWS_PER_BLOCK 32 /* 4 warps x 8 rows */

static int layernorm_backward_blocks(int N) { return ceil_div(N, LN_BWD_ROWS_PER_BLOCK); }
/* floats of scratch the backward needs: dweight and dbias partials */
static size_t layernorm_backward_part_floats(int N, int C) { return 2 * (size_t)layernorm_backward_blocks(N) * C; }
/* dynamic shared memory: per warp, dweight and dbias sums of 8 P floats (P = packs) */
static size_t layernorm_backward_smem(int C) { return (size_t)LN_BWD_WARPS * 2 * 8 * ((C + 7) / 8) * sizeof(float); }

template <int K>
__global__ void __launch_bounds__(32 * LN_BWD_WARPS)
    layernorm_backward_kernel(floatX* __restrict__ dinp, float* __restrict__ part_dw, float* __restrict__ part_db,
                              const floatX* __restrict__ dout, const floatX* __restrict__ inp,
                              const floatX* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int N, int C, int vec) {
    extern __shared__ float ln_bwd_smem[]; /* (warps, 2, 8, P): channel 8p + j at [j * P + p] */
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int P = (C + 7) / 8;
    float* sdw = ln_bwd_smem + (size_t)warp * 16 * P;
    float* sdb = sdw + 8 * P;
    Pack8 w[K];
    for (int i = 0; i < K; i++) {
        int p = lane + 32 * i;
        if (p >= P) continue;
        w[i] = row_pack_load(weight, p, C, vec); /* once per warp */
        for (int j = 0; j < 8; j++) sdw[j * P + p] = sdb[j * P + p] = 0.0f;
    }
    int r0 = blockIdx.x * LN_BWD_ROWS_PER_BLOCK, r1 = min(N, r0 + LN_BWD_ROWS_PER_BLOCK);
    for (int row = r0 + warp; row < r1; row += nwarps) {
        const floatX* x = inp + (size_t)row * C;
        const floatX* dy = dout + (size_t)row * C;
        floatX* dx = dinp + (size_t)row * C;
        Pack8 xp[K], dyp[K], dxp[K];
        for (int i = 0; i < K; i++) { /* the row's only reads */
            int p = lane + 32 * i;
            if (p < P) {
                xp[i] = row_pack_load(x, p, C, vec);
                dyp[i] = row_pack_load(dy, p, C, vec);
                dxp[i] = row_pack_load(dx, p, C, vec);
            }
        }
        float m = mean[row], s = rstd[row];
        /* a = sum dn, b = sum dn * n; channels past C have dy = w = 0: dn = 0 */
        float a = 0.0f, b = 0.0f;
        for (int i = 0; i < K; i++) {
            int p = lane + 32 * i;
            if (p >= P) continue;
            float xf[8], dyf[8], wf[8];
            pack8_to_float(xf, xp[i]);
            pack8_to_float(dyf, dyp[i]);
            pack8_to_float(wf, w[i]);
            for (int j = 0; j < 8; j++) {
                float n = (xf[j] - m) * s, dn = dyf[j] * wf[j];
                a += dn;
                b += dn * n;
                sdw[j * P + p] += dyf[j] * n;
                sdb[j * P + p] += dyf[j];
            }
        }
        float dn_mean = warp_sum(a) / C, dn_n_mean = warp_sum(b) / C;
        for (int i = 0; i < K; i++) {
            int p = lane + 32 * i;
            if (p >= P) continue;
            float xf[8], dyf[8], wf[8], dxf[8];
            pack8_to_float(xf, xp[i]);
            pack8_to_float(dyf, dyp[i]);
            pack8_to_float(wf, w[i]);
            pack8_to_float(dxf, dxp[i]);
            for (int j = 0; j < 8; j++) {
                float n = (xf[j] - m) * s, dn = dyf[j] * wf[j];
                dxf[j] += s * (dn - dn_mean - n * dn_n_mean);
            }
            row_pack_store(dx, p, C, vec, float_to_pack8(dxf));
        }
    }
    __syncthreads(); /* every warp's sums are final */
    /* the block's sums, warps added in order; thread t takes slots t, t + blockDim.x, ... */
    for (int k = threadIdx.x; k < 8 * P; k += blockDim.x) {
        int j = k / P, p = k % P, c = 8 * p + j;
        if (c >= C) continue;
        float tw = 0.0f, tb = 0.0f;
        for (int wi = 0; wi < nwarps; wi++) {
            tw += ln_bwd_smem[(size_t)wi * 16 * P + k];
            tb += ln_bwd_smem[(size_t)wi * 16 * P + 8 * P + k];
        }
        part_dw[(size_t)blockIdx.x * C + c] = tw;
        part_db[(size_t)blockIdx.x * C + c] = tb;
    }
}

/* dst0(OC) += sum over rows of part0(rows, OC) and (when gridDim.y == 2)
 * dst1 += the same of part1, rows in a fixed order: a (32, 32) block takes
 * 32 columns, thread (x, y) sums rows y, y + 32, ..., then row y = 0 adds
 * the 32 sums in order. Each thread's loads are independent (no store in
 * the loop), so they overlap, where a thread per column summing all rows
 * one after another waits a round trip per row. */
__global__ void column_sums_finish_kernel(float* dst0, float* dst1, const float* part0, const float* part1,
                                          int rows, int OC) {
    __shared__ float acc[32][33]; /* (y, x), padded against bank conflicts */
    float* dst = blockIdx.y ? dst1 : dst0;
    const float* part = blockIdx.y ? part1 : part0;
    int c = blockIdx.x * 32 + threadIdx.x;
    float a = 0.0f;
    if (c < OC)
        for (int r = threadIdx.y; r < rows; r += 32) a += part[(size_t)r * OC + c];
    acc[threadIdx.y][threadIdx.x] = a;
    __syncthreads(); /* all 32 x 32 sums are in */
    if (threadIdx.y == 0 && c < OC) {
        float t = 0.0f;
        for (int y = 0; y < 32; y++) t += acc[y][threadIdx.x];
        dst[c] += t;
    }
}

static void column_sums_finish_gpu(float* dst0, float* dst1, const float* part0, const float* part1, int rows,
                                   int OC, cudaStream_t s) {
    dim3 grid(ceil_div(OC, 32), dst1 ? 2 : 1), block(32, 32);
    column_sums_finish_kernel<<<grid, block, 0, s>>>(dst0, dst1, part0, part1, rows, OC);
    KERNEL_CHECK();
}

/* ---- the unfused LayerNorm backward: rows wider than 256 LN_MAX_PACKS ---- */
/* (and the kernel lab's variant 2; why it is slow: see above.)
 * dx += rstd * (dn - mean(dn) - n * mean(dn * n)), dn = dy * w, one warp
 * per row; dinp (the residual stream's gradient) is accumulated. The
 * parameter gradients are column sums, done by column_sums_* below. */
__global__ void layernorm_backward_dx_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                             const floatX* weight, const float* mean, const float* rstd,
                                             int N, int C) {
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const floatX* dy = dout + (size_t)row * C;
    const floatX* x = inp + (size_t)row * C;
    floatX* dx = dinp + (size_t)row * C;
    float m = mean[row], s = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        float dn = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
        a += dn;
        b += dn * n;
    }
    float dn_mean = warp_sum(a) / C, dn_n_mean = warp_sum(b) / C;
    for (int c = lane; c < C; c += 32) {
        float n = (__bfloat162float(x[c]) - m) * s;
        float dn = __bfloat162float(dy[c]) * __bfloat162float(weight[c]);
        dx[c] = __float2bfloat16(__bfloat162float(dx[c]) + s * (dn - dn_mean - n * dn_n_mean));
    }
}

/* ---- column sums: bias gradients and the unfused LN parameter gradients - */
/* Deterministic two-pass reduction over the N rows of a (N, OC) matrix:
 * pass 1, a grid of (column groups of 64) x (row splits) writes partial sums
 * (splits, OC) in fp32, each thread summing its rows in order and the block
 * combining its 8 row-lanes in order; pass 2 (column_sums_finish_kernel)
 * adds the splits in a fixed order into the fp32 gradient. With LN, the
 * sums are of dy * xhat (into part0, for the weight) and dy (part1, the
 * bias); without, of dy only (part0). */
#define COLSUM_COLS 64
#define COLSUM_ROWS_PER_SPLIT 256

template <bool LN>
__global__ void column_sums_partial_kernel(float* part0, float* part1, const floatX* dout, const floatX* inp,
                                           const float* mean, const float* rstd, int N, int OC) {
    __shared__ float s0[8][COLSUM_COLS], s1[8][COLSUM_COLS];
    int tx = threadIdx.x, ty = threadIdx.y; /* (32, 8) */
    int r0 = blockIdx.y * COLSUM_ROWS_PER_SPLIT, r1 = min(N, r0 + COLSUM_ROWS_PER_SPLIT);
    for (int half = 0; half < 2; half++) {
        int cl = tx + 32 * half, c = blockIdx.x * COLSUM_COLS + cl;
        float a = 0.0f, b = 0.0f;
        if (c < OC) {
            for (int r = r0 + ty; r < r1; r += 8) {
                float dy = __bfloat162float(dout[(size_t)r * OC + c]);
                if (LN) {
                    float n = (__bfloat162float(inp[(size_t)r * OC + c]) - mean[r]) * rstd[r];
                    a += dy * n;
                    b += dy;
                } else {
                    a += dy;
                }
            }
        }
        s0[ty][cl] = a;
        s1[ty][cl] = b;
    }
    __syncthreads(); /* all 8 row-lanes' sums are in shared memory */
    if (ty == 0) {
        for (int half = 0; half < 2; half++) {
            int cl = tx + 32 * half, c = blockIdx.x * COLSUM_COLS + cl;
            if (c >= OC) continue;
            float a = 0.0f, b = 0.0f;
            for (int i = 0; i < 8; i++) {
                a += s0[i][cl];
                b += s1[i][cl];
            }
            part0[(size_t)blockIdx.y * OC + c] = a;
            if (LN) part1[(size_t)blockIdx.y * OC + c] = b;
        }
    }
}

/* The bias gradients' pass 1 with 16-byte loads (OC % 8 == 0, dout 16-byte
 * aligned): a (32, 8) block takes 256 columns, thread (x, y) a pack of 8
 * columns and every 8th row of the split from y, so one warp reads 512
 * contiguous bytes per row; the 8 row-lanes are added in order as above.
 */
#define COLSUM_VEC_COLS 256

__global__ void column_sums_partial_vec_kernel(float* __restrict__ part, const floatX* __restrict__ dout, int N,
                                               int OC) {
    __shared__ float sums[8][COLSUM_VEC_COLS]; /* [y][j * 32 + x]: column 8 x + j of the block, conflict-free */
    int tx = threadIdx.x, ty = threadIdx.y;    /* (32, 8) */
    int c0 = blockIdx.x * COLSUM_VEC_COLS + 8 * tx;
    int r0 = blockIdx.y * COLSUM_ROWS_PER_SPLIT, r1 = min(N, r0 + COLSUM_ROWS_PER_SPLIT);
    float a[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (c0 < OC)
        for (int r = r0 + ty; r < r1; r += 8) {
            float f[8];
            pack8_to_float(f, *(const Pack8*)(dout + (size_t)r * OC + c0));
            for (int j = 0; j < 8; j++) a[j] += f[j];
        }
    for (int j = 0; j < 8; j++) sums[ty][j * 32 + tx] = a[j];
    __syncthreads(); /* all 8 row-lanes' sums are in shared memory */
    int t = ty * 32 + tx, c = blockIdx.x * COLSUM_VEC_COLS + t; /* thread t finishes column t of the block */
    if (c >= OC) return;
    int k = (t % 8) * 32 + t / 8;
    float acc = 0.0f;
    for (int i = 0; i < 8; i++) acc += sums[i][k];
    part[(size_t)blockIdx.y * OC + c] = acc;
}

static int column_sums_splits(int N) { return ceil_div(N, COLSUM_ROWS_PER_SPLIT); }

/* The scalar bias gradients alone: the fallback for OC % 8 != 0 or unaligned dout. */
static void bias_backward_scalar_gpu(float* dbias, float* part, const floatX* dout, int N, int OC, cudaStream_t s) {
    int splits = column_sums_splits(N);
    dim3 grid(ceil_div(OC, COLSUM_COLS), splits), block(32, 8);
    column_sums_partial_kernel<false><<<grid, block, 0, s>>>(part, NULL, dout, NULL, NULL, NULL, N, OC);
    KERNEL_CHECK();
    column_sums_finish_gpu(dbias, NULL, part, NULL, splits, OC, s);
}

/* dbias(OC) += column sums of dout(N, OC). `part` holds splits * OC floats. */
static void bias_backward_gpu(float* dbias, float* part, const floatX* dout, int N, int OC, cudaStream_t s) {
    if (OC % 8 != 0 || !is_aligned16(dout)) {
        bias_backward_scalar_gpu(dbias, part, dout, N, OC, s);
        return;
    }
    int splits = column_sums_splits(N);
    dim3 grid(ceil_div(OC, COLSUM_VEC_COLS), splits), block(32, 8);
    column_sums_partial_vec_kernel<<<grid, block, 0, s>>>(part, dout, N, OC);
    KERNEL_CHECK();
    column_sums_finish_gpu(dbias, NULL, part, NULL, splits, OC, s);
}

/* The unfused LayerNorm backward (dx kernel, then the column sums): four
 * launches, x and dy read twice. `part` holds 2 * splits * C floats. */
static void layernorm_backward_unfused_gpu(floatX* dinp, float* dweight, float* dbias, float* part,
                                           const floatX* dout, const floatX* inp, const floatX* weight,
                                           const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
    layernorm_backward_dx_kernel<<<ceil_div(N, LN_ROWS_PER_BLOCK), 32 * LN_ROWS_PER_BLOCK, 0, s>>>(
        dinp, dout, inp, weight, mean, rstd, N, C);
    KERNEL_CHECK();
    int splits = column_sums_splits(N);
    float* part1 = part + (size_t)splits * C;
    dim3 grid(ceil_div(C, COLSUM_COLS), splits), block(32, 8);
    column_sums_partial_kernel<true><<<grid, block, 0, s>>>(part, part1, dout, inp, mean, rstd, N, C);
    KERNEL_CHECK();
    column_sums_finish_gpu(dweight, dbias, part, part1, splits, C, s);
}

/* floats of `part` that layernorm_backward_gpu needs */
static size_t layernorm_backward_scratch_floats(int N, int C) {
    size_t fused = layernorm_backward_part_floats(N, C), unfused = 2 * (size_t)column_sums_splits(N) * C;
    return fused > unfused ? fused : unfused;
}

/* The whole LayerNorm backward: dinp += dx; dweight += sum dy * xhat;
 * dbias += sum dy. `part` holds layernorm_backward_scratch_floats(N, C). */
static void layernorm_backward_gpu(floatX* dinp, float* dweight, float* dbias, float* part, const floatX* dout,
                                   const floatX* inp, const floatX* weight, const float* mean, const float* rstd,
                                   int N, int C, cudaStream_t s) {
    int K = layernorm_packs(C);
    if (K > LN_MAX_PACKS) {
        layernorm_backward_unfused_gpu(dinp, dweight, dbias, part, dout, inp, weight, mean, rstd, N, C, s);
        return;
    }
    int vec = C % 8 == 0 && is_aligned16(dinp) && is_aligned16(dout) && is_aligned16(inp) && is_aligned16(weight);
    int blocks = layernorm_backward_blocks(N);
    float* part_dw = part;
    float* part_db = part + (size_t)blocks * C;
    size_t smem = layernorm_backward_smem(C); /* 24 KB at C = 768, 51 KB at C = 1600 */
#define LN_BWD(KK)                                                                                              \
    do {                                                                                                        \
        if (smem > 48 * 1024)                                                                                   \
            CUDA_CHECK(cudaFuncSetAttribute(layernorm_backward_kernel<KK>,                                      \
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));           \
        layernorm_backward_kernel<KK><<<blocks, 32 * LN_BWD_WARPS, smem, s>>>(dinp, part_dw, part_db, dout, inp, \
                                                                              weight, mean, rstd, N, C, vec);   \
    } while (0)
    LN_DISPATCH_K(K, LN_BWD);
#undef LN_BWD
    KERNEL_CHECK();
    column_sums_finish_gpu(dweight, dbias, part_dw, part_db, blocks, C, s);
}

#endif /* GPTC_CUDA_LAYERNORM_CUH */
