// test_wmma.cu — tensor-core WMMA (nvcuda::wmma, <mma.h>) through the CPU
// execution layer: products against a float64 reference, and the bugs a
// first GPU run would hit, which the layer must catch. Plain CUDA: the same
// file compiles with nvcc (make check-cuda) and, on a GPU, runs the
// correct-program cases (the planted bugs are undefined behaviour there).
//
//   make .cpu/dev/cuda/cpu/test_wmma && ./.cpu/dev/cuda/cpu/test_wmma     every case, each in a child process
//   ./.cpu/dev/cuda/cpu/test_wmma CASE                                     one case, in this process (to see its report)
//   TEST_VERBOSE=1 ./.cpu/dev/cuda/cpu/test_wmma                          every case with its stderr
//   nvcc -arch=sm_90 -std=c++17 -I. -o test_wmma dev/cuda/cpu/test_wmma.cu && ./test_wmma   on a GPU
//
// A planted bug must end its case with the status the table says (2: the
// launch failed, 719; 86: the layer's report; 1: wrong numbers) and a report
// naming it. Last line "N passed, N failed"; exit status non-zero on failure.
// STATUS: the correct-program cases have not yet run on a GPU.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#define CK_EXIT 2  // CK's exit status when a CUDA call fails
#include "dev/cuda/cpu/test_cases.h"  // Case, cases_main, CK: each case in a child process

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>  // std::is_same: the layouts in gemm_kernel
#include <vector>

using namespace nvcuda;


// ---- kernels --------------------------------------------------------------------------------

// C (M, N) = scale * (A (M, K) B (K, N)) + C0, one 16x16 tile of C per warp,
// k in steps of 16. A and B row- or column-major by LA, LB (their leading
// dimension: K or M for A, N or K for B); C0 column-major (ldc0 = M), loaded
// into the accumulator when given; C row-major (N). T: __nv_bfloat16 or __half.
template <typename T, typename LA, typename LB>
__global__ void gemm_kernel(float* C, const T* A, const T* B, const float* C0, int M, int N, int K, float scale) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int tiles_n = N / 16;
    if (warp >= (M / 16) * tiles_n) return;  // whole warps leave together
    const int tm = warp / tiles_n * 16, tn = warp % tiles_n * 16;
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    const int lda = a_row ? K : M, ldb = b_row ? N : K;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (C0) wmma::load_matrix_sync(acc, C0 + (size_t)tn * M + tm, M, wmma::mem_col_major);
    else wmma::fill_fragment(acc, 0.0f);
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> prod;
    wmma::fill_fragment(prod, 0.0f);
    for (int k = 0; k < K; k += 16) {
        wmma::load_matrix_sync(a, A + (a_row ? (size_t)tm * lda + k : (size_t)k * lda + tm), lda);
        wmma::load_matrix_sync(b, B + (b_row ? (size_t)k * ldb + tn : (size_t)tn * ldb + k), ldb);
        wmma::mma_sync(prod, a, b, prod);
    }
    // element-wise on the fragment: the only thing a kernel may do with x[] (the mapping is unspecified)
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] += scale * prod.x[i];
    wmma::store_matrix_sync(C + (size_t)tm * N + tn, acc, N, wmma::mem_row_major);
}

// D (16, 16) = A B with half inputs and a half accumulator, stored column-major.
__global__ void half_acc_kernel(__half* D, const __half* A, const __half* B) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, __half> acc;
    wmma::fill_fragment(acc, __float2half(0.0f));
    wmma::load_matrix_sync(a, A, 16);
    wmma::load_matrix_sync(b, B, 16);
    wmma::mma_sync(acc, a, b, acc);
    wmma::store_matrix_sync(D, acc, 16, wmma::mem_col_major);
}

enum bug {
    BUG_NONE,
    BUG_LANE_SKIPS_MMA,     // lane 7 does not call mma_sync
    BUG_MISALIGNED,         // A + 8: 16 bytes off a 32-byte boundary
    BUG_LDM,                // ldm 20: not a multiple of 8 bf16
    BUG_LANE_POINTER,       // odd lanes pass another pointer
    BUG_OOB,                // ldm 32 over a 16 x 16 allocation: reads past its end
    BUG_ROW_MAPPING,        // scales row r by s[r], assuming the sm_80 accumulator mapping
    BUG_ACC_AS_A,           // reuses an accumulator's elements as a matrix_a fragment
    BUG_LANE_SKIPS_FILL,    // lane 31 does not call fill_fragment
    BUG_TWO_BLOCKS,         // every block stores to the same C: a race between blocks
};

// One 16x16x16 product by one warp, C = A B (all row-major, ldm 16), with a planted bug.
__global__ void bug_kernel(float* C, const __nv_bfloat16* A, const __nv_bfloat16* B, const float* row_scale, int which) {
    const int lane = threadIdx.x % 32;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if (which != BUG_LANE_SKIPS_FILL || lane != 31) wmma::fill_fragment(acc, 0.0f);
    const __nv_bfloat16* pa = A;
    unsigned lda = 16;
    if (which == BUG_MISALIGNED) pa = A + 8;
    if (which == BUG_LDM) lda = 20;
    if (which == BUG_LANE_POINTER && lane % 2) pa = A + 16;
    if (which == BUG_OOB) lda = 32;
    wmma::load_matrix_sync(a, pa, lda);
    wmma::load_matrix_sync(b, B, 16);
    if (which != BUG_LANE_SKIPS_MMA || lane != 7) wmma::mma_sync(acc, a, b, acc);
    if (which == BUG_ROW_MAPPING) {
        // What the PTX ISA's mma.m16n8k16 register layout gives on sm_80/sm_90
        // (two n8 halves): element i of lane l is row l/4, +8 for i = 2, 3, 6, 7.
        // wmma does not promise it; the layer uses another mapping.
        for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= row_scale[lane / 4 + 8 * ((i / 2) % 2)];
    }
    if (which == BUG_ACC_AS_A) {
        // P = A B computed, then P B as if acc's elements were matrix_a's: C = (A B) B, wrongly assumed.
        for (int i = 0; i < a.num_elements; i++) a.x[i] = __float2bfloat16(acc.x[i]);
        wmma::fill_fragment(acc, 0.0f);
        wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(C, acc, 16, wmma::mem_row_major);
}

// Warp 0 stores a tile into shared memory, warp 1 reads it back to C; `sync`:
// 0 none (a race), 1 __syncthreads. Warp 1 first writes the tile itself (so
// either order of the two warps is a race, not a read of unwritten bytes).
__global__ void shared_race_kernel(float* C, const __nv_bfloat16* A, const __nv_bfloat16* B, int sync) {
    __shared__ __align__(32) float tile[16 * 16];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp == 1)
        for (int i = lane; i < 256; i += 32) tile[i] = 0.0f;
    __syncthreads();
    if (warp == 0) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        wmma::load_matrix_sync(a, A, 16);
        wmma::load_matrix_sync(b, B, 16);
        wmma::mma_sync(acc, a, b, acc);
        wmma::store_matrix_sync(tile, acc, 16, wmma::mem_row_major);
    }
    if (sync) __syncthreads();
    if (warp == 1)
        for (int i = lane; i < 256; i += 32) C[i] = tile[i];
}

// One warp stores its tile into shared memory, then each lane reads a row of
// it (lanes 0..15): other lanes' elements, so a __syncwarp must come between
// (`sync` 0 leaves it out: a race inside the warp). The lanes first zero the
// tile, so either order is a race, not a read of unwritten bytes.
__global__ void warp_reread_kernel(float* C, const __nv_bfloat16* A, const __nv_bfloat16* B, int sync) {
    __shared__ __align__(32) float tile[16 * 16];
    const int lane = threadIdx.x % 32;
    for (int i = lane; i < 256; i += 32) tile[i] = 0.0f;
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(a, A, 16);
    wmma::load_matrix_sync(b, B, 16);
    wmma::mma_sync(acc, a, b, acc);
    wmma::store_matrix_sync(tile, acc, 16, wmma::mem_row_major);
    if (sync) __syncwarp();
    if (lane < 16)
        for (int j = 0; j < 16; j++) C[lane * 16 + j] = tile[lane * 16 + j];
}

// ---- host side: inputs, reference, checks -------------------------------------------------

// Deterministic values in (-1, 1): 8 significant bits (bf16 and half hold
// them exactly) times 2^0 .. 2^-7, so fp32 sums of their products round.
static float input_value(int i, int salt) {
    unsigned h = (unsigned)i * 2654435761u + (unsigned)salt * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return std::ldexp(((int)(h % 256) - 128) / 128.0f, -(int)(h >> 8 & 7));
}

template <typename T> static T to_T(float x);
template <> __nv_bfloat16 to_T<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __half to_T<__half>(float x) { return __float2half(x); }

// Device copy of n values of T (exact: input_value has 8 significant bits).
template <typename T> static T* device_inputs(std::vector<float>& host, int n, int salt) {
    host.resize(n);
    std::vector<T> t(n);
    for (int i = 0; i < n; i++) {
        host[i] = input_value(i, salt);
        t[i] = to_T<T>(host[i]);
    }
    T* d;
    CK(cudaMalloc(&d, n * sizeof(T)));
    CK(cudaMemcpy(d, t.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static float* device_floats(int n) {
    float* d;
    CK(cudaMalloc(&d, n * sizeof(float)));
    return d;
}

// Every element of C against the float64 reference ref (M, N) row-major.
// Tolerance: exact products summed in fp32 over K terms are off by at most
// about K * 2^-24 of the sum of |terms| (recursive summation, gamma_K); twice
// that allows the tensor core's own order. A missing or wrong term is off by
// a whole product, 2^-14 or more of it here: far outside.
static int check(const char* what, const float* C, const std::vector<double>& ref, const std::vector<double>& abs_sum,
                 int M, int N, int K) {
    double worst = 0.0;
    for (int i = 0; i < M * N; i++) {
        const double tol = 2.0 * (K + 1) * std::ldexp(1.0, -24) * abs_sum[i] + 1e-30;
        const double err = std::fabs((double)C[i] - ref[i]);
        if (!(err <= tol)) {
            fprintf(stderr, "%s: wrong C[%d][%d] = %.9g, float64 reference %.9g (error %.3g, tolerance %.3g)\n", what,
                    i / N, i % N, C[i], ref[i], err, tol);
            return 1;
        }
        if (abs_sum[i] > 0) worst = std::fmax(worst, err / abs_sum[i]);
    }
    printf("%s: %d x %d x %d, worst error %.3g of sum |terms| (bound %.3g)\n", what, M, N, K, worst,
           2.0 * (K + 1) * std::ldexp(1.0, -24));
    return 0;
}

// C = scale * A B + C0 for the given layouts against float64.
template <typename T, typename LA, typename LB>
static int gemm_case(const char* what, int M, int N, int K, bool with_c0, float scale) {
    const bool a_row = std::is_same<LA, wmma::row_major>::value, b_row = std::is_same<LB, wmma::row_major>::value;
    std::vector<float> ha, hb, hc0(M * N);
    T* A = device_inputs<T>(ha, M * K, 1);  // A[m][k] at m * K + k (row) or k * M + m (column)
    T* B = device_inputs<T>(hb, K * N, 2);  // B[k][n] at k * N + n (row) or n * K + k (column)
    for (int i = 0; i < M * N; i++) hc0[i] = input_value(i, 3) * 4.0f;  // column-major (M, N)
    float* C0 = nullptr;
    if (with_c0) {
        C0 = device_floats(M * N);
        CK(cudaMemcpy(C0, hc0.data(), M * N * sizeof(float), cudaMemcpyHostToDevice));
    }
    float* C = device_floats(M * N);
    const int warps = (M / 16) * (N / 16);
    gemm_kernel<T, LA, LB><<<(warps + 3) / 4, 128>>>(C, A, B, C0, M, N, K, scale);
    CK(cudaGetLastError());
    std::vector<float> hc(M * N);
    CK(cudaMemcpy(hc.data(), C, M * N * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> ref(M * N), abs_sum(M * N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0.0, a_s = 0.0;
            for (int k = 0; k < K; k++) {
                const double p = (double)ha[a_row ? m * K + k : k * M + m] * hb[b_row ? k * N + n : n * K + k];
                s += p;
                a_s += std::fabs(p);
            }
            const double c0 = with_c0 ? hc0[n * M + m] : 0.0;
            ref[m * N + n] = scale * s + c0;
            abs_sum[m * N + n] = std::fabs(scale) * a_s + std::fabs(c0);
        }
    return check(what, hc.data(), ref, abs_sum, M, N, K);
}

using bf16 = __nv_bfloat16;
using row = wmma::row_major;
using col = wmma::col_major;
static int case_bf16_16x16x16() { return gemm_case<bf16, row, row>("bf16 16x16x16, A B row-major", 16, 16, 16, false, 1.0f); }
static int case_bf16_tiled_rr() { return gemm_case<bf16, row, row>("bf16 64x48x32, A row B row, + C0", 64, 48, 32, true, 1.0f); }
static int case_bf16_tiled_rc() { return gemm_case<bf16, row, col>("bf16 64x48x32, A row B col", 64, 48, 32, false, 1.0f); }
static int case_bf16_tiled_cr() { return gemm_case<bf16, col, row>("bf16 64x48x32, A col B row, + C0", 64, 48, 32, true, 1.0f); }
static int case_bf16_tiled_cc() { return gemm_case<bf16, col, col>("bf16 64x48x32, A col B col", 64, 48, 32, false, 1.0f); }
static int case_bf16_scaled() { return gemm_case<bf16, row, col>("bf16 64x48x32, element-wise x -0.375 + C0", 64, 48, 32, true, -0.375f); }
static int case_half_tiled() { return gemm_case<__half, col, row>("half 64x48x32, A col B row, + C0", 64, 48, 32, true, 1.0f); }

static int case_half_accumulator() {  // 16 terms of 8-bit values: the half result is exact within half's rounding
    std::vector<float> ha, hb;
    __half* A = device_inputs<__half>(ha, 256, 1);
    __half* B = device_inputs<__half>(hb, 256, 2);
    __half* D;
    CK(cudaMalloc(&D, 256 * sizeof(__half)));
    half_acc_kernel<<<1, 32>>>(D, A, B);
    CK(cudaGetLastError());
    std::vector<__half> hd(256);
    CK(cudaMemcpy(hd.data(), D, 256 * sizeof(__half), cudaMemcpyDeviceToHost));
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double s = 0.0;
            for (int k = 0; k < 16; k++) s += (double)ha[m * 16 + k] * hb[n * 16 + k];  // B column-major
            const double got = __half2float(hd[n * 16 + m]);                              // D column-major
            if (std::fabs(got - s) > std::ldexp(std::fabs(s), -10) + 1e-7) {
                fprintf(stderr, "half accumulator: wrong D[%d][%d] = %.6g, float64 reference %.6g\n", m, n, got, s);
                return 1;
            }
        }
    return 0;
}

// bug_kernel with `which`; 0 when C = A B (or its row-scaled / squared form), 1 when wrong, 2 when the launch failed.
static int bug_case(int which) {
    std::vector<float> ha, hb;
    bf16* A = device_inputs<bf16>(ha, 256, 1);
    bf16* B = device_inputs<bf16>(hb, 256, 2);
    std::vector<float> hs(16);
    for (int i = 0; i < 16; i++) hs[i] = (float)(i + 1);
    float* S = device_floats(16);
    CK(cudaMemcpy(S, hs.data(), sizeof(float) * 16, cudaMemcpyHostToDevice));
    float* C = device_floats(256);
    bug_kernel<<<which == BUG_TWO_BLOCKS ? 2 : 1, 32>>>(C, A, B, S, which);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceSynchronize: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 2;
    }
    std::vector<float> hc(256);
    CK(cudaMemcpy(hc.data(), C, sizeof hc[0] * 256, cudaMemcpyDeviceToHost));
    std::vector<double> p(256, 0.0), ref(256, 0.0), abs_sum(256, 0.0);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++)
            for (int k = 0; k < 16; k++) p[m * 16 + n] += (double)ha[m * 16 + k] * hb[k * 16 + n];
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            if (which == BUG_ACC_AS_A) {  // (A B) rounded to bf16, times B
                for (int k = 0; k < 16; k++) {
                    const double q = __bfloat162float(__float2bfloat16((float)p[m * 16 + k])) * (double)hb[k * 16 + n];
                    ref[m * 16 + n] += q;
                    abs_sum[m * 16 + n] += std::fabs(q);
                }
            } else {
                const double s = which == BUG_ROW_MAPPING ? hs[m] : 1.0;
                ref[m * 16 + n] = s * p[m * 16 + n];
                for (int k = 0; k < 16; k++) abs_sum[m * 16 + n] += s * std::fabs((double)ha[m * 16 + k] * hb[k * 16 + n]);
            }
        }
    return check("bug_kernel", hc.data(), ref, abs_sum, 16, 16, 16);
}
static int case_bug_free() { return bug_case(BUG_NONE); }
static int case_lane_skips_mma() { return bug_case(BUG_LANE_SKIPS_MMA); }
static int case_misaligned() { return bug_case(BUG_MISALIGNED); }
static int case_bad_ldm() { return bug_case(BUG_LDM); }
static int case_lane_pointer() { return bug_case(BUG_LANE_POINTER); }
static int case_out_of_bounds() { return bug_case(BUG_OOB); }
static int case_row_mapping() { return bug_case(BUG_ROW_MAPPING); }
static int case_acc_as_a() { return bug_case(BUG_ACC_AS_A); }
static int case_lane_skips_fill() { return bug_case(BUG_LANE_SKIPS_FILL); }
static int case_two_blocks() { return bug_case(BUG_TWO_BLOCKS); }

// A tile through shared memory (`across_warps`: shared_race_kernel, else
// warp_reread_kernel); 0 when C = A B, 2 when the launch failed.
static int tile_case(bool across_warps, int sync) {
    std::vector<float> ha, hb;
    bf16* A = device_inputs<bf16>(ha, 256, 1);
    bf16* B = device_inputs<bf16>(hb, 256, 2);
    float* C = device_floats(256);
    if (across_warps) shared_race_kernel<<<1, 64>>>(C, A, B, sync);
    else warp_reread_kernel<<<1, 32>>>(C, A, B, sync);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceSynchronize: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 2;
    }
    std::vector<float> hc(256);
    CK(cudaMemcpy(hc.data(), C, sizeof hc[0] * 256, cudaMemcpyDeviceToHost));
    std::vector<double> ref(256, 0.0), abs_sum(256, 0.0);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++)
            for (int k = 0; k < 16; k++) {
                const double q = (double)ha[m * 16 + k] * hb[k * 16 + n];
                ref[m * 16 + n] += q;
                abs_sum[m * 16 + n] += std::fabs(q);
            }
    return check("through shared memory", hc.data(), ref, abs_sum, 16, 16, 16);
}
static int case_shared_barrier_ok() { return tile_case(true, 1); }
static int case_shared_race() { return tile_case(true, 0); }
static int case_warp_syncwarp_ok() { return tile_case(false, 1); }
static int case_warp_reread_race() { return tile_case(false, 0); }

// ---- the table (the driver: test_cases.h) ----------------------------------------------------

static const Case cases[] = {
    {"bf16_16x16x16", case_bf16_16x16x16, 0, "", "C = A B, one 16x16x16 tile, bf16, against float64"},
    {"bf16_tiled_rr", case_bf16_tiled_rr, 0, "", "64x48x32 in 12 warps, A and B row-major, + C0 loaded column-major"},
    {"bf16_tiled_rc", case_bf16_tiled_rc, 0, "", "64x48x32, A row-major, B column-major"},
    {"bf16_tiled_cr", case_bf16_tiled_cr, 0, "", "64x48x32, A column-major, B row-major, + C0"},
    {"bf16_tiled_cc", case_bf16_tiled_cc, 0, "", "64x48x32, A and B column-major"},
    {"bf16_scaled", case_bf16_scaled, 0, "", "element-wise scaling of an accumulator (x -0.375) and a sum of two"},
    {"half_tiled", case_half_tiled, 0, "", "64x48x32 with __half inputs (16 elements a lane), float accumulator"},
    {"half_accumulator", case_half_accumulator, 0, "", "__half inputs and accumulator, stored column-major"},
    {"bug_free", case_bug_free, 0, "", "the planted-bug kernel without a bug computes A B"},
    {"lane_skips_mma", case_lane_skips_mma, 2, "wmma::mma_sync (a call of the whole warp) waits for lane 7", "lane 7 skips mma_sync: the launch fails, naming it"},
    {"lane_skips_fill", case_lane_skips_fill, 2, "wmma::fill_fragment (a call of the whole warp) waits for lane 31", "lane 31 skips fill_fragment: the launch fails, naming it"},
    {"misaligned", case_misaligned, 2, "not 256-bit (32-byte) aligned", "load_matrix_sync from a pointer 16 bytes off a 32-byte boundary"},
    {"bad_ldm", case_bad_ldm, 2, "ldm 20, which is not a multiple of 8", "load_matrix_sync with ldm 20 for bf16"},
    {"lane_pointer", case_lane_pointer, 2, "must be the same for every lane", "lanes pass different pointers to load_matrix_sync"},
    {"out_of_bounds", case_out_of_bounds, 86, "past the end of cudaMalloc", "load_matrix_sync reading past its allocation (ldm 32 over 16x16)"},
    {"two_blocks", case_two_blocks, 86, "race between blocks", "two blocks store_matrix_sync the same tile of global memory"},
    {"row_mapping", case_row_mapping, 1, "wrong C", "code assuming the GPU's accumulator mapping (row of x[i]) computes wrong values"},
    {"acc_as_a", case_acc_as_a, 1, "wrong C", "an accumulator's x[] reused as a matrix_a fragment computes wrong values"},
    {"shared_barrier_ok", case_shared_barrier_ok, 0, "", "warp 0 stores a tile to shared memory, __syncthreads, warp 1 reads it"},
    {"shared_race", case_shared_race, 2, "race inside the block", "the same without __syncthreads: a race through store_matrix_sync"},
    {"warp_syncwarp_ok", case_warp_syncwarp_ok, 0, "", "store_matrix_sync, __syncwarp, lanes read each other's elements"},
    {"warp_reread_race", case_warp_reread_race, 2, "race inside the block", "the same without __syncwarp: a race inside the warp"},
};

int main(int argc, char** argv) {
#if defined(__CUDACC__)
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_wmma: no GPU visible; skipped (the CPU layer's build runs everywhere: make .cpu/dev/cuda/cpu/test_wmma)\n");
        return 77;
    }
    const bool on_gpu = true;  // nvcc: a real GPU
#else
    const bool on_gpu = false;  // the CPU layer
#endif
    return cases_main(argc, argv, cases, sizeof cases / sizeof cases[0], on_gpu);
}
