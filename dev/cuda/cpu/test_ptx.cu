// test_ptx.cu — the PTX instructions of gptc/cuda/ptx.cuh through the CPU
// execution layer: mma.sync.m16n8k16 (bf16 in, fp32 accumulate), ldmatrix
// (x2, x4, .trans) and cp.async with commit_group / wait_group. Each against
// PTX's documented fragment layouts, computed here independently of the
// layer, and products against float64; and the bugs the layer must catch: a
// missing or too-short cp.async wait, a wrong fragment layout, a misaligned
// ldmatrix row, a lane that skips the mma. Plain CUDA: nvcc compiles the
// same file (make check-cuda), and on a GPU the correct-program cases run.
//
//   make .cpu/dev/cuda/cpu/test_ptx && ./.cpu/dev/cuda/cpu/test_ptx     every case, each in a child process
//   ./.cpu/dev/cuda/cpu/test_ptx CASE                                    one case, in this process
//
// Last line "N passed, N failed"; exit status non-zero on failure.
// STATUS: the correct-program cases have not yet run on a GPU.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "gptc/cuda/ptx.cuh"

#define CK_EXIT 2  // CK's exit status when a CUDA call fails
#include "dev/cuda/cpu/test_cases.h"  // Case, cases_main, CK

#include <cmath>
#include <cstdio>
#include <vector>

typedef __nv_bfloat16 bf16;

// ---- kernels --------------------------------------------------------------------------------

// The two bf16 of a fragment register, from a row-major matrix (ld columns).
__device__ uint32_t pair_rows(const bf16* M, int ld, int r, int c) {  // (r, c) and (r, c + 1)
    uint16_t lo, hi;
    memcpy(&lo, &M[r * ld + c], 2);
    memcpy(&hi, &M[r * ld + c + 1], 2);
    return (uint32_t)lo | (uint32_t)hi << 16;
}

// D (16 x 8, row-major) = A (16 x 16, row-major) B, with B given as its
// transpose Bt (8 x 16: n rows of k); fragments built lane by lane from the
// documented layout. plant 1: a[1] and a[2] swapped (a wrong layout);
// plant 2: lane 5 skips the mma.
__global__ void frag_mma_kernel(float* D, const bf16* A, const bf16* Bt, int plant) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    uint32_t a[4] = {pair_rows(A, 16, g, 2 * t), pair_rows(A, 16, g + 8, 2 * t), pair_rows(A, 16, g, 2 * t + 8),
                     pair_rows(A, 16, g + 8, 2 * t + 8)};
    if (plant == 1) {
        uint32_t x = a[1];
        a[1] = a[2];
        a[2] = x;
    }
    uint32_t b[2] = {pair_rows(Bt, 16, g, 2 * t), pair_rows(Bt, 16, g, 2 * t + 8)}; /* B[k][n] = Bt[n][k] */
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (!(plant == 2 && l == 5)) mma_bf16_16816(d, a, b);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

#define LDS 24  // a 16-column tile's row in shared memory: 48 bytes, 16-byte aligned rows

// Every lane's 4 registers of ldsm_x4 (trans: ldsm_x4_t) of a 16 x 16 tile,
// matrices in the A-fragment order (rows 0-7 | 8-15 of columns 0-7, then of
// 8-15); with several warps, warp w reads tile w, all at once. plant 1: lane
// 3's row address 2 bytes off.
__global__ void ldsm_kernel(uint32_t* out, const bf16* tile, int trans, int plant) {
    __shared__ __align__(16) uint16_t raw[4 * 16 * LDS]; /* (bf16's constructor would give a static a guard) */
    const int l = threadIdx.x % 32, w = threadIdx.x / 32;
    for (int i = threadIdx.x; i < 256 * (int)(blockDim.x / 32); i += blockDim.x)
        ((bf16*)raw)[(i / 256) * 16 * LDS + (i % 256 / 16) * LDS + i % 16] = tile[i];
    __syncthreads();
    bf16* sm = (bf16*)raw + w * 16 * LDS;
    const int row = l % 8 + 8 * (l / 8 % 2), col = 8 * (l / 16);
    const char* p = (const char*)&sm[row * LDS + col] + (plant == 1 && l == 3 ? 2 : 0);
    uint32_t r[4];
    if (trans) ldsm_x4_t(r, p);
    else ldsm_x4(r, p);
    for (int i = 0; i < 4; i++) out[threadIdx.x * 4 + i] = r[i];
}

// S (16 x 16) = Q K^T (Q, K: 16 x 32 row-major, hs 32), then O (16 x 32) =
// bf16(S) V (V: 16 x 32), the flash-attention pattern: Q as A fragments by
// ldsm_x4, K^T as B fragments by ldsm_x2 of K's rows, the S accumulators
// repacked as an A fragment, V as B fragments by ldsm_x2_t.
__global__ void attention_pattern_kernel(float* S, float* O, const bf16* Q, const bf16* K, const bf16* V) {
    __shared__ __align__(16) uint16_t raw[3 * 16 * 40];  // 32 columns + 8: 80-byte rows
    bf16 *sq = (bf16*)raw, *sk = sq + 16 * 40, *sv = sk + 16 * 40;
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    for (int i = l; i < 16 * 32; i += 32) {
        sq[(i / 32) * 40 + i % 32] = Q[i];
        sk[(i / 32) * 40 + i % 32] = K[i];
        sv[(i / 32) * 40 + i % 32] = V[i];
    }
    __syncthreads();
    float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};  // two 8-key blocks
    for (int kk = 0; kk < 32; kk += 16) {
        uint32_t a[4];
        ldsm_x4(a, &sq[(l % 8 + 8 * (l / 8 % 2)) * 40 + kk + 8 * (l / 16)]);
        for (int nb = 0; nb < 2; nb++) {
            uint32_t b[2];
            ldsm_x2(b, &sk[(nb * 8 + l % 8) * 40 + kk + 8 * (l / 8 % 2)]);  // lanes 16-31: ignored, any valid row
            mma_bf16_16816(s[nb], a, b);
        }
    }
    for (int nb = 0; nb < 2; nb++) {
        S[g * 16 + nb * 8 + 2 * t] = s[nb][0];
        S[g * 16 + nb * 8 + 2 * t + 1] = s[nb][1];
        S[(g + 8) * 16 + nb * 8 + 2 * t] = s[nb][2];
        S[(g + 8) * 16 + nb * 8 + 2 * t + 1] = s[nb][3];
    }
    uint32_t p[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                     pack_bf16(s[1][2], s[1][3])};  // the accumulators of keys 0-7 and 8-15 as A (16 x 16)
    for (int db = 0; db < 4; db++) {  // four 8-column blocks of V
        uint32_t b[2];
        ldsm_x2_t(b, &sv[(l % 16) * 40 + db * 8]);  // lanes 0-7 keys 0-7, 8-15 keys 8-15
        float o[4] = {0, 0, 0, 0};
        mma_bf16_16816(o, p, b);
        O[g * 32 + db * 8 + 2 * t] = o[0];
        O[g * 32 + db * 8 + 2 * t + 1] = o[1];
        O[(g + 8) * 32 + db * 8 + 2 * t] = o[2];
        O[(g + 8) * 32 + db * 8 + 2 * t + 1] = o[3];
    }
}

// A 16 x 16 bf16 tile global -> shared by cp.async (each lane 16 bytes), then
// back to global by plain loads. plant 1: no wait; plant 2: two commit groups
// (the tile's halves) and wait_group 1, then the whole tile read.
__global__ void cp_async_kernel(bf16* out, const bf16* in, int plant) {
    __shared__ __align__(16) uint16_t raw[256];
    bf16* sm = (bf16*)raw;
    const int l = threadIdx.x;
    if (plant == 2) { /* lanes 0-15 copy the first half as group 0, lanes 16-31 the second as group 1 */
        if (l < 16) cp_async16(&sm[l * 8], &in[l * 8]);
        cp_async_commit();
        if (l >= 16) cp_async16(&sm[l * 8], &in[l * 8]);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async16(&sm[l * 8], &in[l * 8]);
        cp_async_commit();
        if (plant != 1) cp_async_wait<0>();
    }
    __syncthreads();
    for (int i = l; i < 256; i += 32) out[i] = sm[i];
}

// ---- host side --------------------------------------------------------------------------------

// Values with 8 significant bits in (-1, 1), exact in bf16.
static float input_value(int i, int salt) {
    unsigned h = (unsigned)i * 2654435761u + (unsigned)salt * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return std::ldexp(((int)(h % 256) - 128) / 128.0f, -(int)(h >> 8 & 3));
}
static bf16* device_bf16(std::vector<float>& host, int n, int salt) {
    host.resize(n);
    std::vector<bf16> t(n);
    for (int i = 0; i < n; i++) {
        host[i] = input_value(i, salt);
        t[i] = __float2bfloat16(host[i]);
    }
    bf16* d;
    CK(cudaMalloc(&d, n * sizeof(bf16)));
    CK(cudaMemcpy(d, t.data(), n * sizeof(bf16), cudaMemcpyHostToDevice));
    return d;
}
template <typename T> static std::vector<T> fetch(const T* d, int n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
static uint16_t bits16(float x) {  // x is a bf16 value
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16);
}

// got against float64 ref with sums of |terms| abs: K exact products summed in fp32.
static int near_ref(const char* what, const float* got, const std::vector<double>& ref, const std::vector<double>& abs,
                    int n, int K) {
    for (int i = 0; i < n; i++) {
        const double tol = 2.0 * (K + 1) * std::ldexp(1.0, -24) * abs[i] + 1e-30;
        if (!(std::fabs(got[i] - ref[i]) <= tol)) {
            fprintf(stderr, "%s: wrong element %d: %.9g, float64 %.9g (tolerance %.3g)\n", what, i, got[i], ref[i], tol);
            return 1;
        }
    }
    printf("%s: %d elements within %d-term fp32 rounding of float64\n", what, n, K);
    return 0;
}

static int frag_mma_case(int plant) {
    std::vector<float> A, Bt;
    bf16* dA = device_bf16(A, 256, 1);
    bf16* dB = device_bf16(Bt, 128, 2);
    float* dD;
    CK(cudaMalloc(&dD, 128 * sizeof(float)));
    frag_mma_kernel<<<1, 32>>>(dD, dA, dB, plant);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> D = fetch(dD, 128);
    std::vector<double> ref(128), abs(128);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++)
            for (int k = 0; k < 16; k++) {
                ref[i * 8 + j] += (double)A[i * 16 + k] * Bt[j * 16 + k];
                abs[i * 8 + j] += std::fabs((double)A[i * 16 + k] * Bt[j * 16 + k]);
            }
    return near_ref("mma.m16n8k16, fragments from PTX's layout", D.data(), ref, abs, 128, 16);
}
static int case_mma_ok() { return frag_mma_case(0); }
static int case_mma_wrong_layout() { return frag_mma_case(1); }
static int case_mma_lane_skips() { return frag_mma_case(2); }

static int ldsm_case(int trans, int plant, int warps = 1) {
    std::vector<float> T;
    bf16* dT = device_bf16(T, 256 * warps, 3);
    uint32_t* dout;
    CK(cudaMalloc(&dout, 128 * warps * sizeof(uint32_t)));
    ldsm_kernel<<<1, 32 * warps>>>(dout, dT, trans, plant);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint32_t> all = fetch(dout, 128 * warps);
    for (int w = 0; w < warps; w++)
    for (int l = 0; l < 32; l++)
        for (int i = 0; i < 4; i++) {
            const uint32_t* out = all.data() + w * 128;
            const float* Tw = T.data() + w * 256;
            const int r0 = 8 * (i % 2), c0 = 8 * (i / 2), g = l / 4, t = l % 4;  // matrix i's corner
            uint16_t want[2];
            for (int h = 0; h < 2; h++) {
                const int r = trans ? 2 * t + h : g, c = trans ? g : 2 * t + h;
                want[h] = bits16(Tw[(r0 + r) * 16 + c0 + c]);
            }
            const uint32_t want32 = (uint32_t)want[0] | (uint32_t)want[1] << 16;
            if (out[l * 4 + i] != want32) {
                fprintf(stderr, "ldmatrix%s: warp %d lane %d register %d is 0x%08x, PTX's layout says 0x%08x\n",
                        trans ? ".trans" : "", w, l, i, out[l * 4 + i], want32);
                return 1;
            }
        }
    printf("ldmatrix.x4%s, %d warp(s) at once: every lane's 4 registers as PTX documents them\n", trans ? ".trans" : "", warps);
    return 0;
}
static int case_ldsm_x4() { return ldsm_case(0, 0); }
static int case_ldsm_x4_trans() { return ldsm_case(1, 0); }
static int case_ldsm_misaligned() { return ldsm_case(0, 1); }
static int case_ldsm_four_warps() { return ldsm_case(1, 0, 4); }

static int case_attention_pattern() {
    std::vector<float> Q, K, V;
    bf16* dQ = device_bf16(Q, 512, 4);
    bf16* dK = device_bf16(K, 512, 5);
    bf16* dV = device_bf16(V, 512, 6);
    float *dS, *dO;
    CK(cudaMalloc(&dS, 256 * sizeof(float)));
    CK(cudaMalloc(&dO, 512 * sizeof(float)));
    attention_pattern_kernel<<<1, 32>>>(dS, dO, dQ, dK, dV);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> S = fetch(dS, 256), O = fetch(dO, 512);
    std::vector<double> sref(256), sabs(256), oref(512), oabs(512);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            for (int d = 0; d < 32; d++) {
                sref[i * 16 + j] += (double)Q[i * 32 + d] * K[j * 32 + d];
                sabs[i * 16 + j] += std::fabs((double)Q[i * 32 + d] * K[j * 32 + d]);
            }
    if (near_ref("S = Q K^T (ldmatrix x4, x2)", S.data(), sref, sabs, 256, 32)) return 1;
    for (int i = 0; i < 16; i++)  // O from the kernel's own S, rounded to bf16 as its A fragment is
        for (int d = 0; d < 32; d++)
            for (int j = 0; j < 16; j++) {
                const double p = (double)__bfloat162float(__float2bfloat16(S[i * 16 + j]));
                oref[i * 32 + d] += p * V[j * 32 + d];
                oabs[i * 32 + d] += std::fabs(p * V[j * 32 + d]);
            }
    return near_ref("O = P V (accumulators as A, ldmatrix x2.trans)", O.data(), oref, oabs, 512, 16);
}

static int cp_async_case(int plant) {
    std::vector<float> T;
    bf16* dT = device_bf16(T, 256, 7);
    bf16* dout;
    CK(cudaMalloc(&dout, 256 * sizeof(bf16)));
    cp_async_kernel<<<1, 32>>>(dout, dT, plant);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<bf16> out = fetch(dout, 256);
    for (int i = 0; i < 256; i++)
        if (__bfloat162float(out[i]) != T[i]) {
            fprintf(stderr, "cp.async: element %d is %g, the source %g\n", i, __bfloat162float(out[i]), T[i]);
            return 1;
        }
    printf("cp.async: 512 bytes global -> shared -> global, the same\n");
    return 0;
}
static int case_cp_async_ok() { return cp_async_case(0); }
static int case_cp_async_no_wait() { return cp_async_case(1); }
static int case_cp_async_short_wait() { return cp_async_case(2); }

// ---- the table ----------------------------------------------------------------------------

static const Case cases[] = {
    {"mma_ok", case_mma_ok, 0, "", "mma.sync.m16n8k16 on fragments built from PTX's documented layout, against float64"},
    {"mma_wrong_layout", case_mma_wrong_layout, 1, "wrong element", "A's registers 1 and 2 swapped: wrong numbers"},
    {"mma_lane_skips", case_mma_lane_skips, 2, "mma.sync.m16n8k16 (a call of the whole warp) waits for lane 5",
     "lane 5 skips the mma: the launch fails, naming it"},
    {"ldsm_x4", case_ldsm_x4, 0, "", "ldmatrix.x4: every lane's registers as PTX documents"},
    {"ldsm_x4_trans", case_ldsm_x4_trans, 0, "", "ldmatrix.x4.trans: the transposed pairs"},
    {"ldsm_four_warps", case_ldsm_four_warps, 0, "", "ldmatrix.x4.trans in 4 warps at once: each warp its own tile's"},
    {"ldsm_misaligned", case_ldsm_misaligned, 2, "not 16-byte aligned", "a row address 2 bytes off: the launch fails"},
    {"attention_pattern", case_attention_pattern, 0, "",
     "S = Q K^T and O = bf16(S) V through ldmatrix (x4, x2, x2.trans) and mma, as flash attention uses them"},
    {"cp_async_ok", case_cp_async_ok, 0, "", "cp.async, commit, wait_group 0, barrier: the tile arrives"},
    {"cp_async_no_wait", case_cp_async_no_wait, 2, "which no thread of this block has written",
     "no cp.async.wait_group before the barrier: the read finds shared memory never written"},
    {"cp_async_short_wait", case_cp_async_short_wait, 2, "which no thread of this block has written",
     "two groups and wait_group 1: the newer group's half is not there yet"},
};

int main(int argc, char** argv) {
#if defined(__CUDACC__)
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("test_ptx: no GPU visible; skipped (the CPU layer's build runs everywhere: make .cpu/dev/cuda/cpu/test_ptx)\n");
        return 77;
    }
    const bool on_gpu = true;
#else
    const bool on_gpu = false;
#endif
    return cases_main(argc, argv, cases, sizeof cases / sizeof cases[0], on_gpu);
}
