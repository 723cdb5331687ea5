/*
 * gptc/cuda/attention.cuh — causal self-attention on the GPU, flash-style:
 * an online softmax, only the log-sum-exp per row kept for backward, which
 * recomputes the probabilities. Two implementations: variant 3 (production
 * where hs is a multiple of 8), FlashAttention-2 class with mma.sync,
 * ldmatrix and cp.async and everything a warp computes in registers; and
 * variant 2 (any hs up to 128), tiles and accumulators in shared memory,
 * tensor cores through WMMA (or plain fp32 FMAs with -DATTN_MMA_SCALAR).
 *
 * Included by train_gpt.cu and dev/cuda/attention.cu, after train_gpt.c
 * and gptc/cuda/common.cuh.
 * Defines: ATTN_TILE, ATTN_THREADS, ATTN_MAX_HS, attn_smem_forward,
 * attn_smem_dkv, attn_smem_dq, attn_mma_strip, attention_forward_kernel,
 * attention_backward_d_kernel, attention_backward_dkv_kernel,
 * attention_backward_dq_kernel, attn_hsp, attention_forward_wmma_gpu,
 * attention_backward_wmma_gpu (variant 2); attn3_smem, attn3_smem_bwd,
 * attn3_load, attn3_rows, attn3_acc_as_a, attn3_mma_rows,
 * attn3_rows_by_rows, attention_forward_mma_kernel,
 * attention_backward_dkv_mma_kernel, attention_backward_dq_mma_kernel,
 * ATTN3_DISPATCH, attn_mma_ok (variant 3); attention_forward_gpu,
 * attention_backward_gpu (either, by the shape).
 */
#ifndef GPTC_CUDA_ATTENTION_CUH
#define GPTC_CUDA_ATTENTION_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK
#include "gptc/cuda/ptx.cuh"    // mma_bf16_16816, ldsm_x4(_t), cp_async16, cp_async_commit, cp_async_wait, pack_bf16
#include <type_traits> // std::conditional: the WMMA layouts of attn_mma_strip

/* ---- attention: flash-style (variant 2), forward and backward ------------ */
/* Checked against train_gpt.c's attention_forward/attention_backward by
 * test_gpt.cu and dev/cuda/attention.cu, which also holds the materialised
 * variant 1 (the T x T probabilities stored).
 *
 * Causal self-attention per (b, h), hs = C / NH, scale = 1/sqrt(hs):
 *   S = Q K^T * scale,  P = softmax_rows(S) over keys j <= i,  O = P V.
 * Nothing of size T x T is ever stored (Dao et al., FlashAttention, 2022,
 * Alg. 1; FlashAttention-2, 2023, Alg. 1-2): a block holds a tile of 64
 * queries and walks the key tiles 0..its own (tiles above the diagonal are
 * never visited), keeping per query row the running maximum m and the
 * running sum l of exp(S - m) in fp32 (the online softmax, Milakov &
 * Gimelshein 2018): on a new key tile with row maximum m~,
 *   m' = max(m, m~),  alpha = exp(m - m'),  l' = alpha l + sum_j exp(S_j - m'),
 *   O' = alpha O + exp(S - m') V,
 * and at the end O / l. The log-sum-exp lse = m + log(l) (B, NH, T, fp32) is
 * all that is kept for backward, which recomputes P = exp(S - lse) and with
 * D_i = rowsum(dO_i * O_i) (the softmax backward's rowsum(P * dP), since
 * O = P V):
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - D) * scale,  dQ = dS K,  dK = dS^T Q.
 * Deterministic: one block per key tile sums dK and dV over the query tiles
 * in order, one block per query tile sums dQ over the key tiles in order (no
 * atomics); P and dS are recomputed twice, the price of that.
 *
 * q, k, v are read straight from qkv (B, T, 3, NH, hs), the output written
 * straight into (B, T, NH, hs) = (B, T, C), the gradients into dqkv (B, T, 3C):
 * no permutes.
 *
 * Tiles: 64 queries x 64 keys, 4 warps; warp w owns the 16-row strip
 * [16w, 16w + 16) of every 64-row tile it produces. Head sizes up to 128;
 * a tile's hs columns are zero-padded to hsp = hs rounded up to 16 in shared
 * memory, rows past T are zero too and masked out. Tile products go through
 * the tensor cores (WMMA, bf16 16x16x16 with fp32 accumulation), a warp's
 * 16-row output strip per call (attn_mma_strip), accumulators in shared
 * memory between calls: the softmax work then reads and writes tiles in
 * shared memory by position (a WMMA fragment's element layout is
 * unspecified; the CPU execution layer scrambles it on purpose). Built with
 * -DATTN_MMA_SCALAR, attn_mma_strip computes the same strip with ordinary
 * fp32 FMAs instead (no tensor cores): the algorithm checked apart from the
 * tensor cores (make test runs the kernel lab's attention both ways on the
 * CPU).
 *
 * Shared memory per block (bytes, hsp = 128): forward 112,640, dK/dV 190,464,
 * dQ 147,456; hsp = 64 (GPT-2): 71,680, 124,928 and 98,304. Over the 48 KB
 * default, so each kernel is granted what it needs by cudaFuncSetAttribute
 * (H100/H200 allow 227 KB a block; an A100's 163 KB covers every kernel up
 * to hs = 96, not the dK/dV kernel beyond). The accumulators in shared memory
 * cost occupancy (at hs = 64, with an H200's 228 KB per SM: 3, 1 and 2
 * blocks per SM); dK, dV and dQ need no rescaling, so they could stay in
 * WMMA fragments across the loop instead. */
#define ATTN_TILE 64      /* queries per block, keys per step */
#define ATTN_THREADS 128  /* 4 warps, one 16-row strip each */
#define ATTN_MAX_HS 128
#ifndef ATTN_MMA_SCALAR
#include <mma.h> /* nvcuda::wmma: fragments, load/store_matrix_sync, mma_sync */
#endif

/* Leading dimensions in shared memory, in elements: a bf16 tile of hsp
 * columns (+8: rows stay 16-byte aligned, which WMMA's ldm needs, and do not
 * all start in the same bank), an fp32 score tile (64 + 4), a bf16
 * probability tile (64 + 8), an fp32 accumulator (hsp + 4). Every 16-row
 * block then starts 32-byte aligned, as load/store_matrix_sync require. */
__host__ __device__ inline int attn_ld_h(int hsp) { return hsp + 8; }
#define ATTN_LD_S (ATTN_TILE + 4)
#define ATTN_LD_P (ATTN_TILE + 8)
__host__ __device__ inline int attn_ld_o(int hsp) { return hsp + 4; }
__host__ __device__ inline size_t attn_bytes_h(int hsp) { return (size_t)ATTN_TILE * attn_ld_h(hsp) * 2; }
#define ATTN_BYTES_S ((size_t)ATTN_TILE * ATTN_LD_S * 4)
#define ATTN_BYTES_P ((size_t)ATTN_TILE * ATTN_LD_P * 2)
__host__ __device__ inline size_t attn_bytes_o(int hsp) { return (size_t)ATTN_TILE * attn_ld_o(hsp) * 4; }
/* the three kernels' shared memory, laid out in the order listed */
static size_t attn_smem_forward(int hsp) { /* Q, K, V; S; P; O */
    return 3 * attn_bytes_h(hsp) + ATTN_BYTES_S + ATTN_BYTES_P + attn_bytes_o(hsp);
}
static size_t attn_smem_dkv(int hsp) { /* K, V, Q, dO; S, dP; P, dS; dK, dV */
    return 4 * attn_bytes_h(hsp) + 2 * ATTN_BYTES_S + 2 * ATTN_BYTES_P + 2 * attn_bytes_o(hsp);
}
static size_t attn_smem_dq(int hsp) { /* Q, dO, K, V; S, dP; dS; dQ */
    return 4 * attn_bytes_h(hsp) + 2 * ATTN_BYTES_S + ATTN_BYTES_P + attn_bytes_o(hsp);
}

#ifdef ATTN_MMA_SCALAR
/* attn_mma_strip's one 16 x 16 block without tensor cores */
template <int A_COL, int B_COL>
__device__ void attn_mma16_scalar(float* c, int ldc, const floatX* a, int lda, const floatX* b, int ldb, int K,
                                  int accumulate) {
    int lane = threadIdx.x % 32, m = lane / 2, n0 = (lane % 2) * 8;
    float acc[8];
    for (int j = 0; j < 8; j++) acc[j] = accumulate ? c[m * ldc + n0 + j] : 0.0f;
    for (int k0 = 0; k0 < K; k0 += 8) {
        float av[8];
        if (!A_COL) {
            Pack8 p = *(const Pack8*)(a + m * lda + k0);
            for (int i = 0; i < 8; i++) av[i] = __bfloat162float(p.v[i]);
        } else {
            for (int i = 0; i < 8; i++) av[i] = __bfloat162float(a[(k0 + i) * lda + m]);
        }
        if (!B_COL) {
            for (int i = 0; i < 8; i++) {
                Pack8 p = *(const Pack8*)(b + (k0 + i) * ldb + n0);
                for (int j = 0; j < 8; j++) acc[j] += av[i] * __bfloat162float(p.v[j]);
            }
        } else {
            for (int j = 0; j < 8; j++) {
                Pack8 p = *(const Pack8*)(b + (n0 + j) * ldb + k0);
                for (int i = 0; i < 8; i++) acc[j] += av[i] * __bfloat162float(p.v[i]);
            }
        }
    }
    for (int j = 0; j < 8; j++) c[m * ldc + n0 + j] = acc[j];
    __syncwarp();
}
#endif

/* One warp: the fp32 strip c (16 x 16 nb, ldc) = [c +] a (16 x K) b (K x 16 nb),
 * K a multiple of 16, nb <= 8, bf16 operands in shared memory. A_COL: a is
 * stored column-major (a(m, k) at a[k * lda + m]), else row-major
 * (a[m * lda + k]); b's 16-column block j starts at b + j * bstep, within it
 * B_COL: b(k, n) at [n * ldb + k], else [k * ldb + n]. Every lane of the warp
 * calls it with the same arguments; when it returns the warp's stores to c
 * are done. Each k step loads a's fragment once for all nb blocks; the
 * accumulators live in registers for the call, in shared memory between. */
#define ATTN_MAX_NB 8 /* hsp / 16 for hsp = 128 */
template <int A_COL, int B_COL>
__device__ void attn_mma_strip(float* c, int ldc, const floatX* a, int lda, const floatX* b, int ldb, int bstep,
                               int nb, int K, int accumulate) {
#ifndef ATTN_MMA_SCALAR
    using namespace nvcuda;
    typedef typename std::conditional<A_COL != 0, wmma::col_major, wmma::row_major>::type LayoutA;
    typedef typename std::conditional<B_COL != 0, wmma::col_major, wmma::row_major>::type LayoutB;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc[ATTN_MAX_NB];
    for (int j = 0; j < ATTN_MAX_NB; j++) { /* (unrolled by nvcc: the fragments stay in registers) */
        if (j >= nb) break;
        if (accumulate) wmma::load_matrix_sync(fc[j], c + j * 16, ldc, wmma::mem_row_major);
        else wmma::fill_fragment(fc[j], 0.0f);
    }
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(fa, A_COL ? a + (size_t)k * lda : a + k, lda);
        for (int j = 0; j < ATTN_MAX_NB; j++) {
            if (j >= nb) break;
            const floatX* bj = b + (size_t)j * bstep;
            wmma::load_matrix_sync(fb, B_COL ? bj + k : bj + (size_t)k * ldb, ldb);
            wmma::mma_sync(fc[j], fa, fb, fc[j]);
        }
    }
    for (int j = 0; j < ATTN_MAX_NB; j++) {
        if (j >= nb) break;
        wmma::store_matrix_sync(c + j * 16, fc[j], ldc, wmma::mem_row_major);
    }
#else
    /* block by block: lane 2m + h computes row m, columns 8h .. 8h + 7, each
     * sum in k order; operands read 8 at a time (16 bytes) along their
     * contiguous dimension (on the CPU execution every access is checked:
     * fewer, wider ones are what makes this path quick enough for make test) */
    for (int jb = 0; jb < nb; jb++)
        attn_mma16_scalar<A_COL, B_COL>(c + jb * 16, ldc, a, lda, b + (size_t)jb * bstep, ldb, K, accumulate);
#endif
}

/* A 64-row tile of one head into shared memory: rows t0 .. t0 + 63 of src,
 * where row t starts at src + t * stride (src points at the head's column
 * 0), hs columns, zero-padded to hsp columns and past T. 16-byte loads when
 * hs % 8 == 0 (rows and heads then start 16-byte aligned). */
__device__ void attn_load_tile(floatX* dst, const floatX* src, size_t stride, int t0, int T, int hs, int hsp) {
    int ld = attn_ld_h(hsp), chunks = hsp / 8;
    for (int idx = threadIdx.x; idx < ATTN_TILE * chunks; idx += blockDim.x) {
        int r = idx / chunks, d0 = (idx % chunks) * 8, t = t0 + r;
        Pack8 p;
        if (t < T && hs % 8 == 0 && d0 < hs) {
            p = *(const Pack8*)(src + (size_t)t * stride + d0);
        } else {
            for (int i = 0; i < 8; i++)
                p.v[i] = t < T && d0 + i < hs ? src[(size_t)t * stride + d0 + i] : __float2bfloat16(0.0f);
        }
        *(Pack8*)(dst + r * ld + d0) = p;
    }
}

/* Rows of an fp32 accumulator tile (64 x hsp, shared memory) out to bf16,
 * times `mul`: thread pair (2r, 2r + 1) writes row r's two halves, for
 * t0 + r < T and the first hs columns. Called by each warp for its own strip
 * (thread pairs of warp w hold rows 16w .. 16w + 15). */
__device__ void attn_store_rows(floatX* dst, size_t stride, const float* acc, int t0, int T, int hs, int hsp,
                                float mul) {
    int r = threadIdx.x / 2, half = threadIdx.x % 2, t = t0 + r, ldo = attn_ld_o(hsp);
    if (t >= T) return;
    int per = hsp / 2; /* a multiple of 8 */
    for (int d0 = half * per; d0 < (half + 1) * per && d0 < hs; d0 += 8) {
        if (hs % 8 == 0) {
            Pack8 p;
            for (int i = 0; i < 8; i++) p.v[i] = __float2bfloat16(acc[r * ldo + d0 + i] * mul);
            *(Pack8*)(dst + (size_t)t * stride + d0) = p;
        } else {
            for (int i = 0; i < 8 && d0 + i < hs; i++)
                dst[(size_t)t * stride + d0 + i] = __float2bfloat16(acc[r * ldo + d0 + i] * mul);
        }
    }
}

/* Work a warp may skip, all of it masked: a strip (16 query rows from q0 +
 * 16 w) is live when its first row is < T, and of a key tile from k0 it needs
 * the first attn_key_cols columns (a multiple of 16): keys < T and, on the
 * diagonal, keys <= the strip's last query. For k0 <= q0 and a live strip
 * that is at least 16. */
__device__ int attn_strip_live(int q0, int w, int T) { return q0 + 16 * w < T; }
__device__ int attn_key_cols(int q0, int k0, int w, int T) {
    int n = min(min(ATTN_TILE, T - k0), q0 + 16 * w + 16 - k0);
    return (n + 15) / 16 * 16;
}

/* Forward. Grid (query tiles, B * NH), the last (longest) query tiles first.
 * out (B, T, C), lse (B, NH, T), qkv (B, T, 3C). */
__global__ void __launch_bounds__(ATTN_THREADS) attention_forward_kernel(floatX* out, float* lse, const floatX* qkv,
                                                                         int T, int NH, int hs, int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    floatX* Qs = (floatX*)attn_smem;                         /* (64, hsp) */
    floatX* Ks = (floatX*)(attn_smem + attn_bytes_h(hsp));   /* (64, hsp) */
    floatX* Vs = (floatX*)(attn_smem + 2 * attn_bytes_h(hsp));
    float* Ss = (float*)(attn_smem + 3 * attn_bytes_h(hsp)); /* (64, 64) scores */
    floatX* Ps = (floatX*)((unsigned char*)Ss + ATTN_BYTES_S); /* (64, 64) probabilities, bf16 */
    float* Os = (float*)((unsigned char*)Ps + ATTN_BYTES_P);   /* (64, hsp) output accumulator */
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs; /* row t at q + t * 3C */
    attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
    /* thread pair (2r, 2r + 1), in warp r / 16: query row r of the tile, key
     * columns [32 half, 32 half + 32) of S and accumulator columns
     * [hsp/2 half, hsp/2 (half + 1)) */
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    int live = attn_strip_live(q0, warp, T); /* the same for the whole warp */
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) Os[r * ldo + d] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* both threads of the pair hold the same */
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATTN_TILE;
        __syncthreads(); /* every warp is done with the previous K and V tiles */
        attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
        attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
        __syncthreads(); /* K, V (and, the first time, Q) are in shared memory */
        if (!live) continue;
        int ncol = attn_key_cols(q0, k0, warp, T);
        /* S strip = Q strip K^T: its first ncol columns, 16 at a time */
        attn_mma_strip<0, 1>(Ss + warp * 16 * ATTN_LD_S, ATTN_LD_S, Qs + warp * 16 * ldh, ldh, Ks, ldh, 16 * ldh,
                             ncol / 16, hsp, 0);
        __syncwarp(); /* the warp's S strip is stored: its thread pairs read their rows */
        /* online softmax of row r; key j = k0 + c is visible when j <= i and
         * j < T: always j = k0 (k0 <= q0 <= i and k0 < T), so m' is finite */
        const float* srow = Ss + r * ATTN_LD_S;
        int c0 = half * 32, c1 = min(c0 + 32, ncol);
        float mt = -INFINITY;
        for (int c = c0; c < c1; c++)
            if (k0 + c <= i && k0 + c < T) mt = fmaxf(mt, srow[c] * scale);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        float mnew = fmaxf(m, mt), alpha = expf(m - mnew); /* exp(-inf) = 0 on the first tile */
        float sum = 0.0f;
        for (int c = c0; c < c1; c++) {
            float p = k0 + c <= i && k0 + c < T ? expf(srow[c] * scale - mnew) : 0.0f;
            Ps[r * ATTN_LD_P + c] = __float2bfloat16(p); /* (V is multiplied by P in bf16) */
            sum += p;                                    /* (l, and so lse, sum it in fp32) */
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = mnew;
        for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) Os[r * ldo + d] *= alpha;
        __syncwarp(); /* P strip written, O strip rescaled */
        /* O strip += P strip V, over the ncol keys */
        attn_mma_strip<0, 0>(Os + warp * 16 * ldo, ldo, Ps + warp * 16 * ATTN_LD_P, ATTN_LD_P, Vs, ldh, 16, hsp / 16,
                             ncol, 1);
    }
    __syncwarp(); /* the warp's last O strip is stored */
    /* (rows >= T, which a strip that is not live holds only, are not written) */
    attn_store_rows(out + (size_t)b * T * C + (size_t)h * hs, C, Os, q0, T, hs, hsp, 1.0f / l);
    if (half == 0 && i < T) lse[(size_t)bh * T + i] = m + logf(l);
}

/* D (B, NH, T) = rowsum(dO * O) in fp32, one warp per (b, t, h). dout and
 * out (B, T, C). */
__global__ void attention_backward_d_kernel(float* D, const floatX* dout, const floatX* out, int B, int T, int NH,
                                            int hs) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; /* (b, t, h) */
    if (row >= (long long)B * T * NH) return;
    int h = (int)(row % NH), t = (int)((row / NH) % T), b = (int)(row / ((long long)NH * T));
    const floatX* dy = dout + row * hs; /* (b, t, h) is row (b T + t) NH + h of hs values */
    const floatX* y = out + row * hs;
    float s = 0.0f;
    for (int d = threadIdx.x % 32; d < hs; d += 32) s += __bfloat162float(dy[d]) * __bfloat162float(y[d]);
    s = warp_sum(s);
    if (threadIdx.x % 32 == 0) D[((size_t)b * NH + h) * T + t] = s;
}

/* S and dP strips of the calling warp (query rows 16 w ..), their first ncol
 * key columns: S = Q K^T, dP = dO V^T (unscaled). */
__device__ void attn_s_dp_strips(float* Ss, float* dPs, const floatX* Qs, const floatX* dOs, const floatX* Ks,
                                 const floatX* Vs, int ldh, int hsp, int ncol) {
    int w = threadIdx.x / 32;
    attn_mma_strip<0, 1>(Ss + w * 16 * ATTN_LD_S, ATTN_LD_S, Qs + w * 16 * ldh, ldh, Ks, ldh, 16 * ldh, ncol / 16,
                         hsp, 0);
    attn_mma_strip<0, 1>(dPs + w * 16 * ATTN_LD_S, ATTN_LD_S, dOs + w * 16 * ldh, ldh, Vs, ldh, 16 * ldh, ncol / 16,
                         hsp, 0);
}

/* P and dS of the calling thread pair's row r = tid / 2 (query i = q0 + r),
 * its 32 key columns (j = k0 + c), all 64 columns written (0 past ncol):
 *   P = exp(S scale - lse_i) where visible (j <= i, j < T, i < T), else 0;
 *   dS = P (dP - D_i) scale;  both rounded to bf16 (Ps may be NULL). */
__device__ void attn_p_ds_row(floatX* Ps, floatX* dSs, const float* Ss, const float* dPs, int q0, int k0, int T,
                              int ncol, float scale, float lse_i, float D_i) {
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    for (int c = half * 32; c < half * 32 + 32; c++) {
        int j = k0 + c;
        float p = 0.0f, ds = 0.0f;
        if (c < ncol && j <= i && j < T && i < T) {
            p = expf(Ss[r * ATTN_LD_S + c] * scale - lse_i);
            ds = p * (dPs[r * ATTN_LD_S + c] - D_i) * scale;
        }
        if (Ps) Ps[r * ATTN_LD_P + c] = __float2bfloat16(p);
        dSs[r * ATTN_LD_P + c] = __float2bfloat16(ds);
    }
}

/* dK and dV: one block per (key tile, b, h), the query tiles from the
 * diagonal down, in order. Grid (key tiles, B * NH): key tile 0 has the
 * most query tiles and starts first. dqkv (B, T, 3C): writes its dK and dV
 * slices. */
__global__ void __launch_bounds__(ATTN_THREADS) attention_backward_dkv_kernel(floatX* dqkv, const floatX* dout,
                                                                              const floatX* qkv, const float* lse,
                                                                              const float* D, int T, int NH, int hs,
                                                                              int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    size_t bh_ = attn_bytes_h(hsp);
    floatX* Ks = (floatX*)attn_smem;
    floatX* Vs = (floatX*)(attn_smem + bh_);
    floatX* Qs = (floatX*)(attn_smem + 2 * bh_);
    floatX* dOs = (floatX*)(attn_smem + 3 * bh_);
    float* Ss = (float*)(attn_smem + 4 * bh_);                  /* (64 queries, 64 keys) */
    float* dPs = (float*)((unsigned char*)Ss + ATTN_BYTES_S);   /* (64, 64) dP = dO V^T */
    floatX* Ps = (floatX*)((unsigned char*)dPs + ATTN_BYTES_S); /* (64, 64) bf16 */
    floatX* dSs = (floatX*)((unsigned char*)Ps + ATTN_BYTES_P); /* (64, 64) bf16 */
    float* dKs = (float*)((unsigned char*)dSs + ATTN_BYTES_P);  /* (64 keys, hsp) */
    float* dVs = (float*)((unsigned char*)dKs + attn_bytes_o(hsp));
    int kt = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, k0 = kt * ATTN_TILE, warp = threadIdx.x / 32, nqt = (T + ATTN_TILE - 1) / ATTN_TILE;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const floatX* dy = dout + (size_t)b * T * C + (size_t)h * hs;
    attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
    attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
    int r = threadIdx.x / 2, half = threadIdx.x % 2;
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) dKs[r * ldo + d] = dVs[r * ldo + d] = 0.0f;
    int keys_live = k0 + 16 * warp < T; /* this warp's key strip (dK and dV rows) */
    for (int qt = kt; qt < nqt; qt++) {
        int q0 = qt * ATTN_TILE, i = q0 + r;
        __syncthreads(); /* every warp is done with the previous Q, dO, P and dS */
        attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
        attn_load_tile(dOs, dy, C, q0, T, hs, hsp);
        __syncthreads(); /* Q and dO (and, the first time, K and V) are in shared memory */
        /* P and dS of this warp's query strip (rows 16 warp ..) */
        if (attn_strip_live(q0, warp, T)) {
            int ncol = attn_key_cols(q0, k0, warp, T);
            attn_s_dp_strips(Ss, dPs, Qs, dOs, Ks, Vs, ldh, hsp, ncol);
            __syncwarp(); /* the warp's S and dP strips are stored */
            float lse_i = i < T ? lse[(size_t)bh * T + i] : 0.0f, D_i = i < T ? D[(size_t)bh * T + i] : 0.0f;
            attn_p_ds_row(Ps, dSs, Ss, dPs, q0, k0, T, ncol, scale, lse_i, D_i);
        }
        __syncthreads(); /* all of P and dS: the products below read them by columns (keys) */
        /* dV strip (keys 16 warp ..) += P^T dO, dK strip += dS^T Q, over the
         * query rows [qs, qe) that can see these keys: rows of live strips,
         * and on the diagonal none before the strip's first key */
        int qs = qt == kt ? 16 * warp : 0, qe = min(ATTN_TILE, (T - q0 + 15) / 16 * 16);
        if (keys_live && qe > qs) {
            attn_mma_strip<1, 0>(dVs + warp * 16 * ldo, ldo, Ps + qs * ATTN_LD_P + warp * 16, ATTN_LD_P,
                                 dOs + qs * ldh, ldh, 16, hsp / 16, qe - qs, 1);
            attn_mma_strip<1, 0>(dKs + warp * 16 * ldo, ldo, dSs + qs * ATTN_LD_P + warp * 16, ATTN_LD_P,
                                 Qs + qs * ldh, ldh, 16, hsp / 16, qe - qs, 1);
        }
    }
    __syncwarp(); /* the warp's dK and dV strips are final */
    floatX* dq = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    attn_store_rows(dq + C, 3 * C, dKs, k0, T, hs, hsp, 1.0f);
    attn_store_rows(dq + 2 * C, 3 * C, dVs, k0, T, hs, hsp, 1.0f);
}

/* dQ: one block per (query tile, b, h), the key tiles up to the diagonal, in
 * order. Grid (query tiles, B * NH), the last (longest) first. Writes the dQ
 * slice of dqkv. */
__global__ void __launch_bounds__(ATTN_THREADS) attention_backward_dq_kernel(floatX* dqkv, const floatX* dout,
                                                                             const floatX* qkv, const float* lse,
                                                                             const float* D, int T, int NH, int hs,
                                                                             int hsp) {
    extern __shared__ __align__(128) unsigned char attn_smem[];
    int ldh = attn_ld_h(hsp), ldo = attn_ld_o(hsp);
    size_t bh_ = attn_bytes_h(hsp);
    floatX* Qs = (floatX*)attn_smem;
    floatX* dOs = (floatX*)(attn_smem + bh_);
    floatX* Ks = (floatX*)(attn_smem + 2 * bh_);
    floatX* Vs = (floatX*)(attn_smem + 3 * bh_);
    float* Ss = (float*)(attn_smem + 4 * bh_);
    float* dPs = (float*)((unsigned char*)Ss + ATTN_BYTES_S);
    floatX* dSs = (floatX*)((unsigned char*)dPs + ATTN_BYTES_S);
    float* dQs = (float*)((unsigned char*)dSs + ATTN_BYTES_P); /* (64 queries, hsp) */
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32;
    float scale = 1.0f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    attn_load_tile(Qs, q, 3 * C, q0, T, hs, hsp);
    attn_load_tile(dOs, dout + (size_t)b * T * C + (size_t)h * hs, C, q0, T, hs, hsp);
    int r = threadIdx.x / 2, half = threadIdx.x % 2, i = q0 + r;
    int live = attn_strip_live(q0, warp, T);
    for (int d = half * hsp / 2; d < (half + 1) * hsp / 2; d++) dQs[r * ldo + d] = 0.0f;
    float lse_i = i < T ? lse[(size_t)bh * T + i] : 0.0f, D_i = i < T ? D[(size_t)bh * T + i] : 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATTN_TILE;
        __syncthreads(); /* every warp is done with the previous K and V */
        attn_load_tile(Ks, q + C, 3 * C, k0, T, hs, hsp);
        attn_load_tile(Vs, q + 2 * C, 3 * C, k0, T, hs, hsp);
        __syncthreads(); /* K and V (and, the first time, Q and dO) are in shared memory */
        if (!live) continue;
        int ncol = attn_key_cols(q0, k0, warp, T);
        attn_s_dp_strips(Ss, dPs, Qs, dOs, Ks, Vs, ldh, hsp, ncol);
        __syncwarp(); /* the warp's S and dP strips are stored */
        attn_p_ds_row(NULL, dSs, Ss, dPs, q0, k0, T, ncol, scale, lse_i, D_i);
        __syncwarp(); /* the warp's dS strip is written: only this warp reads it */
        /* dQ strip += dS strip K, over the ncol keys */
        attn_mma_strip<0, 0>(dQs + warp * 16 * ldo, ldo, dSs + warp * 16 * ATTN_LD_P, ATTN_LD_P, Ks, ldh, 16,
                             hsp / 16, ncol, 1);
    }
    __syncwarp(); /* the warp's dQ strip is final */
    attn_store_rows(dqkv + (size_t)b * T * 3 * C + (size_t)h * hs, 3 * C, dQs, q0, T, hs, hsp, 1.0f);
}

/* ---- the forward at FlashAttention-2 class (variant 3, production) --------
 * The same algorithm as attention_forward_kernel, with everything a warp
 * computes in registers (Dao, FlashAttention-2, 2023, Alg. 1): mma.sync
 * m16n8k16 on ldmatrix'd operands (gptc/cuda/ptx.cuh), no score,
 * probability or accumulator tile in shared memory.
 *   block: 4 warps, 64 queries (warp w: rows 16w..16w+15), key tiles of 64;
 *   shared: Q (64 x HSP) once, then K and V (64 x HSP each) twice over,
 *     rows HSP + 8 elements apart (16 bytes of padding: the 8 rows an
 *     ldmatrix phase reads fall in 8 different 16-byte bank groups), loaded
 *     by cp.async 16 bytes a thread, tile j + 1 while tile j computes;
 *   registers per lane: S for 16 x 64 (32 fp32,
 *     rows g and g + 8 of the warp's 16, keys 2t, 2t + 1 of each 8), the
 *     running max and sum of rows g and g + 8, O for 16 x HSP (HSP/2 fp32);
 *   per key tile: S = Q K^T (Q's A fragments by ldmatrix from shared
 *     memory each tile: held in registers they would cost HSP/4 a lane, and
 *     4 blocks an SM would no longer fit; K's rows by ldmatrix are the B fragments of
 *     K^T), scaled into log2 units, masked (causal, and keys >= T), the row
 *     max over the lane's 16 values and the quad (shuffles), O and the
 *     partial sum rescaled by exp2(m - m'), P = exp2(S - m') packed to bf16
 *     as A fragments straight from the accumulators (the C layout of two
 *     8-key blocks is the A layout of 16 keys), O += P V (V's rows by
 *     ldmatrix.trans are the B fragments);
 *   at the end the sum over the quad, O / l stored as bf16 pairs, lse =
 *     (m + log2 l) ln 2 (natural units, as the backward reads it).
 * Needs hs a multiple of 8 (16-byte rows in qkv for cp.async) and C too;
 * attention_forward_gpu keeps variant 2 for other head sizes. Shared memory
 * (64 + 4 x 64) (HSP + 8) 2 bytes: 46,080 at HSP = 64, 87,040 at 128; the
 * registers held to 128 a thread at HSP <= 64 (__launch_bounds__), so that
 * 4 blocks (16 warps, 25% occupancy) fit an SM of an H200, 2 at 128. */
#define ATTN3_LD(HSP) ((HSP) + 8)
static size_t attn3_smem(int hsp) { return (size_t)5 * ATTN_TILE * ATTN3_LD(hsp) * sizeof(floatX); }

/* rows [r0, r0 + 64) of one head's q, k or v (row stride ld elements in
 * qkv) into a tile (HSP + 8 apart): 16 bytes a cp.async; columns hs..HSP
 * and rows >= T zeroed by plain stores */
template <int HSP>
__device__ void attn3_load(floatX* tile, const floatX* src, int ld, int r0, int T, int hs) {
    constexpr int chunks = HSP / 8; /* 16-byte pieces a row */
    for (int c = threadIdx.x; c < ATTN_TILE * chunks; c += ATTN_THREADS) {
        int r = c / chunks, d = (c % chunks) * 8;
        floatX* dst = tile + r * ATTN3_LD(HSP) + d;
        if (r0 + r < T && d < hs) cp_async16(dst, src + (size_t)(r0 + r) * ld + d);
        else *(uint4*)dst = make_uint4(0, 0, 0, 0);
    }
}

/* Two 16 x 8 accumulator blocks (columns 0-7 and 8-15 of a 16-wide step)
 * as that step's A fragment, rounded to bf16: the C layout's (g, 2t..) and
 * (g + 8, 2t..) of each block are the A layout's a[0], a[1], then a[2],
 * a[3] (gptc/cuda/ptx.cuh). P and dS go from one product into the next so. */
__device__ __forceinline__ void attn3_acc_as_a(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = pack_bf16(lo[0], lo[1]);
    a[1] = pack_bf16(lo[2], lo[3]);
    a[2] = pack_bf16(hi[0], hi[1]);
    a[3] = pack_bf16(hi[2], hi[3]);
}

/* acc (16 x HSP: HSP/8 blocks of 8 columns) += a (16 x 16) times rows
 * [r0, r0 + 16) of tile (the product's k) by its HSP columns: the B
 * fragments by ldmatrix.trans of the tile's rows, two blocks a call. */
template <int HSP>
__device__ __forceinline__ void attn3_mma_rows(float acc[][4], const uint32_t a[4], const floatX* tile, int r0) {
    int lane = threadIdx.x % 32;
    const floatX* row = tile + (r0 + lane % 8 + 8 * (lane / 8 % 2)) * ATTN3_LD(HSP);
    for (int d = 0; d < HSP / 8; d += 2) {
        uint32_t b[4]; /* matrices: rows r0.. | r0+8.. x columns 8d.., then x columns 8d+8.. */
        ldsm_x4_t(b, row + (d + lane / 16) * 8);
        mma_bf16_16816(acc[d], a, b);
        mma_bf16_16816(acc[d + 1], a, b + 2);
    }
}

/* x1 (16 x 32: 4 blocks of 8) += rows [a0, a0 + 16) of A1 times rows
 * [b0, b0 + 32) of B1, transposed (x1 = A1 B1^T over the HSP columns), and
 * x2 the same of A2 and B2, in one pass over the columns: A1, A2 by
 * ldmatrix, B1, B2's rows by ldmatrix as the B fragments of their
 * transposes. (S^T = K Q^T with dP^T = V dO^T; S = Q K^T with dP = dO V^T.) */
template <int HSP>
__device__ __forceinline__ void attn3_rows_by_rows(float x1[4][4], float x2[4][4], const floatX* A1, const floatX* A2,
                                                   int a0, const floatX* B1, const floatX* B2, int b0) {
    constexpr int LD = ATTN3_LD(HSP);
    int lane = threadIdx.x % 32, lr = lane % 8 + 8 * (lane / 8 % 2), lc = 8 * (lane / 16);
    for (int kc = 0; kc < HSP / 16; kc++) {
        uint32_t a1[4], a2[4];
        ldsm_x4(a1, A1 + (a0 + lr) * LD + kc * 16 + lc);
        ldsm_x4(a2, A2 + (a0 + lr) * LD + kc * 16 + lc);
        for (int n = 0; n < 4; n += 2) {
            uint32_t b1[4], b2[4]; /* rows b0 + 8n.. (x columns 16kc.., 16kc+8..), then + 8 */
            int row = b0 + n * 8 + lane % 8 + 8 * (lane / 16), col = kc * 16 + 8 * (lane / 8 % 2);
            ldsm_x4(b1, B1 + row * LD + col);
            ldsm_x4(b2, B2 + row * LD + col);
            mma_bf16_16816(x1[n], a1, b1);
            mma_bf16_16816(x1[n + 1], a1, b1 + 2);
            mma_bf16_16816(x2[n], a2, b2);
            mma_bf16_16816(x2[n + 1], a2, b2 + 2);
        }
    }
}

template <int HSP>
__global__ void __launch_bounds__(ATTN_THREADS, HSP <= 64 ? 4 : 2) attention_forward_mma_kernel(floatX* out, float* lse, const floatX* qkv,
                                                                             int T, int NH, int hs) {
    constexpr int LD = ATTN3_LD(HSP), KC = HSP / 16, DB = HSP / 8;
    extern __shared__ __align__(128) unsigned char attn_smem[];
    floatX* Qs = (floatX*)attn_smem;           /* (64, LD) */
    floatX* Ks = Qs + ATTN_TILE * LD;          /* 2 x (64, LD) */
    floatX* Vs = Ks + 2 * ATTN_TILE * LD;      /* 2 x (64, LD) */
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float scale = 1.4426950408889634f / sqrtf((float)hs); /* log2(e) / sqrt(hs): exponents in base 2 */
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs; /* row r at q + r 3C; k, v at + C, + 2C */
    attn3_load<HSP>(Qs, q, 3 * C, q0, T, hs);
    attn3_load<HSP>(Ks, q + C, 3 * C, 0, T, hs);
    attn3_load<HSP>(Vs, q + 2 * C, 3 * C, 0, T, hs);
    cp_async_commit();
    /* this lane's ldmatrix row: matrix lane / 8 of a 16 x 16 block (rows 0-7 | 8-15 of columns 0-7, then 8-15) */
    int lr = lane % 8 + 8 * (lane / 8 % 2), lc = 8 * (lane / 16);
    float o[DB][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int i = 0; i < DB; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    int row0 = q0 + warp * 16 + g, row1 = row0 + 8; /* the lane's two query rows */
    for (int kt = 0; kt <= qt; kt++) {
        int buf = kt % 2, k0 = kt * ATTN_TILE;
        cp_async_wait<0>();
        __syncthreads(); /* tile kt is in shared memory (every thread's copies), and tile kt - 1's buffer is free */
        if (kt < qt) { /* the next tile, beside this one's compute */
            attn3_load<HSP>(Ks + (1 - buf) * ATTN_TILE * LD, q + C, 3 * C, k0 + ATTN_TILE, T, hs);
            attn3_load<HSP>(Vs + (1 - buf) * ATTN_TILE * LD, q + 2 * C, 3 * C, k0 + ATTN_TILE, T, hs);
        }
        cp_async_commit();
        const floatX* K = Ks + buf * ATTN_TILE * LD;
        const floatX* V = Vs + buf * ATTN_TILE * LD;
        /* S (16 x 64) = Q K^T: 8 blocks of 8 keys, two a ldmatrix.x4 */
        float s[8][4];
        for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
        for (int kc = 0; kc < KC; kc++) {
            uint32_t qf[4]; /* Q's A fragment, from shared memory each tile (in registers it would cost 4 KC a lane) */
            ldsm_x4(qf, Qs + (warp * 16 + lr) * LD + kc * 16 + lc);
            for (int n = 0; n < 8; n += 2) {
                uint32_t kb[4]; /* matrices: keys 8n.. x dims 16kc.. | 16kc+8.., keys 8n+8.. x the same */
                ldsm_x4(kb, K + (n * 8 + lane % 8 + 8 * (lane / 16)) * LD + kc * 16 + 8 * (lane / 8 % 2));
                mma_bf16_16816(s[n], qf, kb);
                mma_bf16_16816(s[n + 1], qf, kb + 2);
            }
        }
        /* scale, mask, the rows' max */
        float mt[2] = {-INFINITY, -INFINITY};
        int edge = kt == qt || k0 + ATTN_TILE > T; /* the diagonal tile, or the last keys: masked */
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++) {
                int key = k0 + n * 8 + 2 * t + (e & 1);
                s[n][e] = !edge || (key <= (e < 2 ? row0 : row1) && key < T) ? s[n][e] * scale : -INFINITY;
                mt[e / 2] = fmaxf(mt[e / 2], s[n][e]);
            }
        float alpha[2];
        for (int r = 0; r < 2; r++) { /* the quad holds a row's 64 keys */
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
            float mnew = fmaxf(m[r], mt[r]); /* finite: key k0 <= row for every row of the tile's queries */
            alpha[r] = exp2f(m[r] - mnew);   /* (0 on the first tile: m = -inf) */
            m[r] = mnew;
            l[r] *= alpha[r];
        }
        for (int i = 0; i < DB; i++) {
            o[i][0] *= alpha[0], o[i][1] *= alpha[0];
            o[i][2] *= alpha[1], o[i][3] *= alpha[1];
        }
        /* P = exp2(S - m), its partial row sums, and O += P V, 16 keys at a time */
        for (int kc = 0; kc < 4; kc++) {
            float p[2][4];
            for (int j = 0; j < 2; j++)
                for (int e = 0; e < 4; e++) {
                    p[j][e] = exp2f(s[2 * kc + j][e] - m[e / 2]);
                    l[e / 2] += p[j][e];
                }
            uint32_t pa[4];
            attn3_acc_as_a(pa, p[0], p[1]);
            attn3_mma_rows<HSP>(o, pa, V, kc * 16); /* keys 16kc.. of V */
        }
    }
    for (int r = 0; r < 2; r++) { /* the quad's partial sums */
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    floatX* y = out + (size_t)b * T * C + (size_t)h * hs;
    for (int r = 0; r < 2; r++) {
        int row = r ? row1 : row0;
        if (row >= T) continue;
        float inv = 1.0f / l[r];
        for (int d = 0; d < DB; d++) {
            int col = d * 8 + 2 * t;
            if (col >= hs) continue; /* (hs a multiple of 8: the pair is whole) */
            __nv_bfloat162 v = __floats2bfloat162_rn(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
            *(__nv_bfloat162*)(y + (size_t)row * C + col) = v;
        }
        if (t == 0) lse[(size_t)bh * T + row] = (m[r] + log2f(l[r])) * 0.6931471805599453f;
    }
}

/* ---- the backward at FlashAttention-2 class (variant 3, production) -------
 * FlashAttention-2's Alg. 2 split in two deterministic kernels as variant 2
 * is (no atomics), everything a warp computes in registers:
 *   dK/dV: a block per key tile (64 keys, warp w keys 16w..16w+15, K and V
 *     loaded once), walking the query tiles kt..last, Q, dO, lse and D
 *     double-buffered by cp.async (plain loads for the rows' lse and D), in
 *     halves of 32 queries: S^T = K Q^T (A: K's rows by ldmatrix, B: Q's rows
 *     as B fragments of Q^T), P^T = exp2(S^T log2(e)/sqrt(hs) - lse
 *     log2(e)) masked (query >= key, query < T), dP^T = V dO^T the same way,
 *     dS^T = P^T (dP^T - D), dV += P^T dO and dK += dS^T Q (the accumulators
 *     repacked as A fragments, dO and Q by ldmatrix.trans as B); at the end
 *     dK / sqrt(hs), both stored as bf16 pairs into dqkv;
 *   dQ: a block per query tile (warp w queries 16w..), walking the key tiles
 *     0..its own, K and V double-buffered, in halves of 32 keys: S = Q K^T,
 *     P = exp2(S - lse) masked, dP = dO V^T, dS = P (dP - D), dQ += dS K
 *     (K by ldmatrix.trans); at the end dQ / sqrt(hs) into dqkv.
 * Registers: the dK and dV (or dQ) accumulators, HSP/2 fp32 each, and S, dP
 * for 16 x 32 (16 fp32 each). Shared memory: 6 tiles of 64 x (HSP + 8) bf16
 * and 4 x 64 fp32 (dK/dV), 56,320 bytes at HSP = 64. At HSP = 64 the dQ
 * kernel fits 128 registers (4 blocks an SM, 25% occupancy); the dK/dV
 * kernel holds two accumulators and is left at 3 blocks (168 registers,
 * 18.75%): capped at 128, ptxas spills 16 bytes. Same preconditions as the
 * forward (hs a multiple of 8). */
static size_t attn3_smem_bwd(int hsp) {
    return (size_t)6 * ATTN_TILE * ATTN3_LD(hsp) * sizeof(floatX) + 4 * ATTN_TILE * sizeof(float);
}

/* lse and D of rows [r0, r0 + 64) into shared memory, in log2 units for lse:
 * rows >= T get lse = +inf (P = 0) and D = 0 */
__device__ void attn3_rows(float* slse, float* sD, const float* lse, const float* D, int r0, int T) {
    for (int r = threadIdx.x; r < ATTN_TILE; r += ATTN_THREADS) {
        int i = r0 + r;
        slse[r] = i < T ? lse[i] * 1.4426950408889634f : INFINITY;
        sD[r] = i < T ? D[i] : 0.0f;
    }
}

template <int HSP>
__global__ void __launch_bounds__(ATTN_THREADS, HSP <= 64 ? 3 : 2) attention_backward_dkv_mma_kernel(
    floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int T, int NH, int hs) {
    constexpr int LD = ATTN3_LD(HSP), DB = HSP / 8;
    extern __shared__ __align__(128) unsigned char attn_smem[];
    floatX* Ks = (floatX*)attn_smem;
    floatX* Vs = Ks + ATTN_TILE * LD;
    floatX* Qs = Vs + ATTN_TILE * LD;      /* 2 x (64, LD) */
    floatX* dOs = Qs + 2 * ATTN_TILE * LD; /* 2 x (64, LD) */
    float* Ls = (float*)(dOs + 2 * ATTN_TILE * LD); /* 2 x 64: lse, log2 units */
    float* Ds = Ls + 2 * ATTN_TILE;                 /* 2 x 64 */
    int kt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, k0 = kt * ATTN_TILE, nqt = (T + ATTN_TILE - 1) / ATTN_TILE;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float sl2 = 1.4426950408889634f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const floatX* dy = dout + (size_t)b * T * C + (size_t)h * hs;
    const float* lrow = lse + (size_t)bh * T;
    const float* drow = D + (size_t)bh * T;
    attn3_load<HSP>(Ks, q + C, 3 * C, k0, T, hs);
    attn3_load<HSP>(Vs, q + 2 * C, 3 * C, k0, T, hs);
    attn3_load<HSP>(Qs, q, 3 * C, k0, T, hs);
    attn3_load<HSP>(dOs, dy, C, k0, T, hs);
    attn3_rows(Ls, Ds, lrow, drow, k0, T);
    cp_async_commit();
    int key0 = k0 + warp * 16 + g, key1 = key0 + 8;               /* the lane's two keys */
    float dk[DB][4], dv[DB][4];
    for (int i = 0; i < DB; i++)
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.0f;
    for (int qt = kt, it = 0; qt < nqt; qt++, it++) {
        int buf = it % 2, q0 = qt * ATTN_TILE;
        cp_async_wait<0>();
        __syncthreads(); /* query tile qt is in buffer buf; the other buffer is free */
        if (qt + 1 < nqt) {
            int o = (1 - buf) * ATTN_TILE * LD;
            attn3_load<HSP>(Qs + o, q, 3 * C, q0 + ATTN_TILE, T, hs);
            attn3_load<HSP>(dOs + o, dy, C, q0 + ATTN_TILE, T, hs);
            attn3_rows(Ls + (1 - buf) * ATTN_TILE, Ds + (1 - buf) * ATTN_TILE, lrow, drow, q0 + ATTN_TILE, T);
        }
        cp_async_commit();
        const floatX* Qb = Qs + buf * ATTN_TILE * LD;
        const floatX* dOb = dOs + buf * ATTN_TILE * LD;
        const float* Lb = Ls + buf * ATTN_TILE;
        const float* Db = Ds + buf * ATTN_TILE;
        for (int half = 0; half < 2; half++) { /* queries q0 + 32 half .. + 31 */
            int qh = half * 32;
            float st[4][4], dpt[4][4]; /* S^T and dP^T: 16 keys x 4 blocks of 8 queries */
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.0f;
            attn3_rows_by_rows<HSP>(st, dpt, Ks, Vs, warp * 16, Qb, dOb, qh); /* K Q^T, V dO^T */
            /* P^T and dS^T in place; then dV += P^T dO, dK += dS^T Q over these 32 queries */
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) {
                    int c = qh + n * 8 + 2 * t + (e & 1), qi = q0 + c, key = e < 2 ? key0 : key1;
                    float p = qi >= key && qi < T ? exp2f(st[n][e] * sl2 - Lb[c]) : 0.0f;
                    st[n][e] = p;
                    dpt[n][e] = p * (dpt[n][e] - Db[c]);
                }
            for (int kc = 0; kc < 2; kc++) { /* 16 queries at a time */
                uint32_t pa[4], sa[4];
                attn3_acc_as_a(pa, st[2 * kc], st[2 * kc + 1]);
                attn3_acc_as_a(sa, dpt[2 * kc], dpt[2 * kc + 1]);
                attn3_mma_rows<HSP>(dv, pa, dOb, qh + kc * 16);
                attn3_mma_rows<HSP>(dk, sa, Qb, qh + kc * 16);
            }
        }
    }
    float scale = 1.0f / sqrtf((float)hs);
    floatX* dk_out = dqkv + (size_t)b * T * 3 * C + C + (size_t)h * hs; /* row r at + r 3C; dv at + C more */
    for (int r = 0; r < 2; r++) {
        int key = r ? key1 : key0;
        if (key >= T) continue;
        for (int d = 0; d < DB; d++) {
            int col = d * 8 + 2 * t;
            if (col >= hs) continue;
            floatX* at = dk_out + (size_t)key * 3 * C + col;
            *(__nv_bfloat162*)at = __floats2bfloat162_rn(dk[d][2 * r] * scale, dk[d][2 * r + 1] * scale);
            *(__nv_bfloat162*)(at + C) = __floats2bfloat162_rn(dv[d][2 * r], dv[d][2 * r + 1]);
        }
    }
}

template <int HSP>
__global__ void __launch_bounds__(ATTN_THREADS, HSP <= 64 ? 4 : 2) attention_backward_dq_mma_kernel(
    floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse, const float* D, int T, int NH, int hs) {
    constexpr int LD = ATTN3_LD(HSP), DB = HSP / 8;
    extern __shared__ __align__(128) unsigned char attn_smem[];
    floatX* Qs = (floatX*)attn_smem;
    floatX* dOs = Qs + ATTN_TILE * LD;
    floatX* Ks = dOs + ATTN_TILE * LD;     /* 2 x (64, LD) */
    floatX* Vs = Ks + 2 * ATTN_TILE * LD;  /* 2 x (64, LD) */
    float* Ls = (float*)(Vs + 2 * ATTN_TILE * LD);
    float* Ds = Ls + ATTN_TILE;
    int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int C = NH * hs, q0 = qt * ATTN_TILE, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float sl2 = 1.4426950408889634f / sqrtf((float)hs);
    const floatX* q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    const floatX* dy = dout + (size_t)b * T * C + (size_t)h * hs;
    attn3_load<HSP>(Qs, q, 3 * C, q0, T, hs);
    attn3_load<HSP>(dOs, dy, C, q0, T, hs);
    attn3_load<HSP>(Ks, q + C, 3 * C, 0, T, hs);
    attn3_load<HSP>(Vs, q + 2 * C, 3 * C, 0, T, hs);
    attn3_rows(Ls, Ds, lse + (size_t)bh * T, D + (size_t)bh * T, q0, T);
    cp_async_commit();
    int r0 = warp * 16 + g, r1 = r0 + 8; /* the lane's two query rows, in the tile */
    float dq[DB][4];
    for (int i = 0; i < DB; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int buf = kt % 2, k0 = kt * ATTN_TILE;
        cp_async_wait<0>();
        __syncthreads();
        if (kt < qt) {
            int o = (1 - buf) * ATTN_TILE * LD;
            attn3_load<HSP>(Ks + o, q + C, 3 * C, k0 + ATTN_TILE, T, hs);
            attn3_load<HSP>(Vs + o, q + 2 * C, 3 * C, k0 + ATTN_TILE, T, hs);
        }
        cp_async_commit();
        const floatX* Kb = Ks + buf * ATTN_TILE * LD;
        const floatX* Vb = Vs + buf * ATTN_TILE * LD;
        float l0 = Ls[r0], l1 = Ls[r1], d0 = Ds[r0], d1 = Ds[r1];
        for (int half = 0; half < 2; half++) { /* keys k0 + 32 half .. + 31 */
            int kh = half * 32;
            float s[4][4], dp[4][4];
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
            attn3_rows_by_rows<HSP>(s, dp, Qs, dOs, warp * 16, Kb, Vb, kh); /* Q K^T, dO V^T */
            for (int n = 0; n < 4; n++)
                for (int e = 0; e < 4; e++) {
                    int key = k0 + kh + n * 8 + 2 * t + (e & 1), row = q0 + (e < 2 ? r0 : r1);
                    float p = key <= row && row < T ? exp2f(s[n][e] * sl2 - (e < 2 ? l0 : l1)) : 0.0f;
                    s[n][e] = p * (dp[n][e] - (e < 2 ? d0 : d1)); /* dS */
                }
            for (int kc = 0; kc < 2; kc++) { /* 16 keys at a time */
                uint32_t sa[4];
                attn3_acc_as_a(sa, s[2 * kc], s[2 * kc + 1]);
                attn3_mma_rows<HSP>(dq, sa, Kb, kh + kc * 16);
            }
        }
    }
    float scale = 1.0f / sqrtf((float)hs);
    floatX* dq_out = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    for (int r = 0; r < 2; r++) {
        int row = q0 + (r ? r1 : r0);
        if (row >= T) continue;
        for (int d = 0; d < DB; d++) {
            int col = d * 8 + 2 * t;
            if (col >= hs) continue;
            *(__nv_bfloat162*)(dq_out + (size_t)row * 3 * C + col) =
                __floats2bfloat162_rn(dq[d][2 * r] * scale, dq[d][2 * r + 1] * scale);
        }
    }
}

/* Dynamic shared memory over the 48 KB default must be granted per kernel
 * (cudaFuncSetAttribute); `granted` remembers the most granted so far. */
static void attn_smem_grant(const void* kernel, size_t bytes, size_t* granted) {
    if (bytes <= 48 * 1024 || bytes <= *granted) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    *granted = bytes;
}

static int attn_hsp(int hs) {
    ALWAYS(hs >= 1 && hs <= ATTN_MAX_HS);
    return (hs + 15) / 16 * 16;
}

/* Variant 2's forward (the WMMA kernel): any head size up to 128. */
static void attention_forward_wmma_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int hs,
                                       cudaStream_t s) {
    static size_t granted;
    int hsp = attn_hsp(hs);
    attn_smem_grant((const void*)attention_forward_kernel, attn_smem_forward(hsp), &granted);
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_forward_kernel<<<grid, ATTN_THREADS, attn_smem_forward(hsp), s>>>(out, lse, qkv, T, NH, hs, hsp);
    KERNEL_CHECK();
}

/* Variant 3 at HSP (a multiple of 16). */
template <int HSP>
static void attention_forward_mma_launch(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int hs,
                                         cudaStream_t s) {
    static size_t granted;
    attn_smem_grant((const void*)attention_forward_mma_kernel<HSP>, attn3_smem(HSP), &granted);
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_forward_mma_kernel<HSP><<<grid, ATTN_THREADS, attn3_smem(HSP), s>>>(out, lse, qkv, T, NH, hs);
    KERNEL_CHECK();
}

/* Calls F(HSP) with HSP the compile-time constant of attn_hsp(hs): 16..128. */
#define ATTN3_DISPATCH(HSP_RUNTIME, F)                                       \
    switch (HSP_RUNTIME) {                                                   \
        case 16: F(16); break;                                               \
        case 32: F(32); break;                                               \
        case 48: F(48); break;                                               \
        case 64: F(64); break;                                               \
        case 80: F(80); break;                                               \
        case 96: F(96); break;                                               \
        case 112: F(112); break;                                             \
        default: F(128); break;                                              \
    }

/* Whether variant 3 takes this shape: 16-byte rows of each head in qkv. */
static int attn_mma_ok(int NH, int hs) { return hs % 8 == 0 && (NH * hs) % 8 == 0 && hs <= ATTN_MAX_HS; }

/* out (B, T, C) and lse (B, NH, T) from qkv (B, T, 3C): variant 3 where it
 * applies (hs a multiple of 8), else variant 2. */
static void attention_forward_gpu(floatX* out, float* lse, const floatX* qkv, int B, int T, int NH, int hs,
                                  cudaStream_t s) {
    if (!attn_mma_ok(NH, hs)) {
        attention_forward_wmma_gpu(out, lse, qkv, B, T, NH, hs, s);
        return;
    }
#define ATTN3_FORWARD(H) attention_forward_mma_launch<H>(out, lse, qkv, B, T, NH, hs, s)
    ATTN3_DISPATCH(attn_hsp(hs), ATTN3_FORWARD)
#undef ATTN3_FORWARD
}

/* Variant 3's backward at HSP (D computed already). */
template <int HSP>
static void attention_backward_mma_launch(floatX* dqkv, const float* D, const floatX* dout, const floatX* qkv,
                                          const float* lse, int B, int T, int NH, int hs, cudaStream_t s) {
    static size_t granted_dkv, granted_dq;
    attn_smem_grant((const void*)attention_backward_dkv_mma_kernel<HSP>, attn3_smem_bwd(HSP), &granted_dkv);
    attn_smem_grant((const void*)attention_backward_dq_mma_kernel<HSP>, attn3_smem_bwd(HSP), &granted_dq);
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_backward_dkv_mma_kernel<HSP><<<grid, ATTN_THREADS, attn3_smem_bwd(HSP), s>>>(dqkv, dout, qkv, lse, D, T,
                                                                                            NH, hs);
    KERNEL_CHECK();
    attention_backward_dq_mma_kernel<HSP><<<grid, ATTN_THREADS, attn3_smem_bwd(HSP), s>>>(dqkv, dout, qkv, lse, D, T,
                                                                                           NH, hs);
    KERNEL_CHECK();
}

/* Variant 2's backward (the WMMA kernels): any head size up to 128. */
static void attention_backward_wmma_gpu(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* lse, int B, int T, int NH, int hs, cudaStream_t s) {
    static size_t granted_dkv, granted_dq;
    int hsp = attn_hsp(hs);
    attn_smem_grant((const void*)attention_backward_dkv_kernel, attn_smem_dkv(hsp), &granted_dkv);
    attn_smem_grant((const void*)attention_backward_dq_kernel, attn_smem_dq(hsp), &granted_dq);
    long long rows = (long long)B * T * NH;
    attention_backward_d_kernel<<<ceil_div(rows, 8), 256, 0, s>>>(D, dout, out, B, T, NH, hs);
    KERNEL_CHECK();
    dim3 grid(ceil_div(T, ATTN_TILE), B * NH);
    attention_backward_dkv_kernel<<<grid, ATTN_THREADS, attn_smem_dkv(hsp), s>>>(dqkv, dout, qkv, lse, D, T, NH, hs,
                                                                                  hsp);
    KERNEL_CHECK();
    attention_backward_dq_kernel<<<grid, ATTN_THREADS, attn_smem_dq(hsp), s>>>(dqkv, dout, qkv, lse, D, T, NH, hs,
                                                                                hsp);
    KERNEL_CHECK();
}

/* dqkv (B, T, 3C, written) from dout (B, T, C), the forward's qkv, out and
 * lse; D is (B, NH, T) fp32 scratch. Variant 3 where it applies, else 2. */
static void attention_backward_gpu(floatX* dqkv, float* D, const floatX* dout, const floatX* qkv, const floatX* out,
                                   const float* lse, int B, int T, int NH, int hs, cudaStream_t s) {
    if (!attn_mma_ok(NH, hs)) {
        attention_backward_wmma_gpu(dqkv, D, dout, qkv, out, lse, B, T, NH, hs, s);
        return;
    }
    long long rows = (long long)B * T * NH;
    attention_backward_d_kernel<<<ceil_div(rows, 8), 256, 0, s>>>(D, dout, out, B, T, NH, hs);
    KERNEL_CHECK();
#define ATTN3_BACKWARD(H) attention_backward_mma_launch<H>(dqkv, D, dout, qkv, lse, B, T, NH, hs, s)
    ATTN3_DISPATCH(attn_hsp(hs), ATTN3_BACKWARD)
#undef ATTN3_BACKWARD
}

#endif /* GPTC_CUDA_ATTENTION_CUH */
