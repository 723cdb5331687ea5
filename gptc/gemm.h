/*
 * gptc/gemm.h — the CPU GEMM engine: every matrix product of the model.
 *
 * Included by train_gpt.c (its matmul_forward and matmul_backward call gemm)
 * and by dev/cpu/bench_gemm.c, which validates and times it against OpenBLAS.
 * Defines: gemm (C = [C +] A.B with any strides, OpenMP over output tiles,
 * bitwise the same for any thread count) and its parts: gemm_buffers,
 * gemm_pack_A, gemm_pack_B, gemm_kernel, gemm_block, gemm_serial; the tile
 * sizes GEMM_MR, GEMM_NR, GEMM_KC, GEMM_MC, GEMM_NC (overridable with -D),
 * the vector width GEMM_VEC and the instruction set named GEMM_ISA.
 * It is a general sgemm, not GPT-2: train_gpt.c keeps what each layer
 * multiplies, this header how a product is made fast.
 */
#ifndef GPTC_GEMM_H
#define GPTC_GEMM_H

#include "util.h"

/* ----------------------------------------------------------------------------
 * matmul: one fp32 GEMM engine for every product in the model
 *
 *   C(M,N) = (accumulate ? C : 0) + A(M,K) . B(K,N)
 *
 * Every operand is addressed by a row stride and a column stride, so the
 * transposes of the forward and backward passes are only swapped strides:
 *   A(i,k) = A[i*a_rs + k*a_cs]   B(k,j) = B[k*b_rs + j*b_cs]   C(i,j) = C[i*ldc + j]
 *
 * The layout follows Goto & van de Geijn, "Anatomy of High-Performance Matrix
 * Multiplication" (ACM TOMS 2008), and the BLIS papers (Van Zee & van de Geijn
 * 2015, Low et al. 2016); the code is our own. Five loops around a micro-kernel:
 *   jc over N in NC-column panels
 *    pc over K in KC-deep slices:   pack B(pc:+KC, jc:+NC) -> Bp   (L3)
 *     ic over M in MC-row blocks:   pack A(ic:+MC, pc:+KC) -> Ap   (L2)
 *      ir over MR-row micro-panels of Ap                           (L1)
 *       jr over NR-column micro-panels of Bp                       (streamed)
 *        micro-kernel: an MR x NR tile of C held in registers, KC rank-1 updates
 * Packing copies any strided layout into contiguous, 64-byte aligned panels,
 * zero-padded to whole micro-panels, so the micro-kernel is one code path for
 * every shape and transpose, and reads memory strictly sequentially.
 *
 * Determinism: threads split the *output* (rows or columns of C), never K.
 * Each C(i,j) is the same chain of fmaf()s in the same order whichever thread
 * computes it, so results are bitwise identical for any thread count.
 *
 * Where the time goes: in gemm_kernel's k loop, MR*NR/VEC vector FMAs per
 * step (on AVX-512: 16 vfmadd231ps zmm, MR=8 broadcasts of A times NR/16=2
 * vectors of B), 85-95% of the time.
 * Packing is O(MK + KN) against O(MNK) FLOPs: the rest.
 * ---------------------------------------------------------------------------- */

/* Micro-tile: MR rows x NR columns of C held in registers, one tile per
 * instruction set, chosen from the target's macros (-march decides). NR runs
 * along the contiguous dimension of C, so it is a multiple of the vector width
 * GEMM_VEC; the k loop keeps MR*NR/VEC accumulators, NR/VEC B vectors and an
 * A broadcast live, sized to the register file:
 *   AVX-512 (32 zmm, 16 floats):  8 x 32  16 accumulators + 2 B + 1 A
 *   AVX2+FMA (16 ymm, 8 floats):  4 x 24  12 accumulators + 3 B + 1 A
 *   NEON (32 q, 4 floats):        8 x 12  24 accumulators + 3 B + 2 A (a q holds 4 broadcasts' worth)
 *   anything else (16 xmm/SSE2):  4 x 8    8 accumulators + 2 B + 1 A
 * 8 x 32 divides every GPT-2 size (C, 3C, 4C, Vp, T, hs = 64), so no tile is
 * padding; measured on Zen 4 as fast as 8 x 48 on the big products and 1.35x
 * faster where N = hs = 64. On AVX2 an 8 x 32 tile needs 32 ymm accumulators
 * and spills. 4 x 24 fills the 16 ymm exactly; measured on Zen 4 with
 * -march=x86-64-v3 (gcc 12, dev/cpu/bench_gemm): 70 GFLOP/s in-cache on one
 * core against 24.5 for 6 x 16, whose six broadcasts gcc loads ahead of the
 * FMAs, so three accumulators spill. It pads N = hs = 64 to 72 in attention.
 * -DGEMM_MR=.. -DGEMM_NR=.. overrides the choice (so dev/cpu/bench_gemm
 * validates every tile on one machine).
 * Every tile computes each C(i,j) as the same chain of fmaf()s over k, so with
 * the same KC all tiles give bitwise the same C. */
#if defined(__AVX512F__)
#define GEMM_VEC 16
#define GEMM_TILE_MR 8
#define GEMM_TILE_NR 32
#define GEMM_ISA "AVX-512"
#elif defined(__AVX2__) && defined(__FMA__)
#define GEMM_VEC 8
#define GEMM_TILE_MR 4
#define GEMM_TILE_NR 24
#define GEMM_ISA "AVX2+FMA"
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define GEMM_VEC 4
#define GEMM_TILE_MR 8
#define GEMM_TILE_NR 12
#define GEMM_ISA "NEON"
#else
#define GEMM_VEC 4
#define GEMM_TILE_MR 4
#define GEMM_TILE_NR 8
#define GEMM_ISA "generic"
#endif
#ifndef GEMM_MR
#define GEMM_MR GEMM_TILE_MR
#endif
#ifndef GEMM_NR
#define GEMM_NR GEMM_TILE_NR
#endif
/* Cache blocks (Zen 4: 32 KiB L1 and 1 MiB L2 per core, 32 MiB shared L3):
 * an A micro-panel (KC*MR*4 = 12 KiB at MR = 8) stays in L1 while the kernel
 * streams the B panel (KC*NC*4 = 4.5 MiB) from L3 in address order, which the
 * prefetchers keep up with. A large NC means A is repacked only N/NC times;
 * measured faster than an L2-sized B panel (NC = 480) by 3-10% on the GPT-2
 * shapes. The same blocks serve every tile. */
#ifndef GEMM_KC
#define GEMM_KC 384
#endif
#ifndef GEMM_MC
#define GEMM_MC 192                  /* multiple of MR (8 and 4) */
#endif
#ifndef GEMM_NC
#define GEMM_NC 3072                 /* multiple of NR (32, 24, 12 and 8) */
#endif
#if GEMM_NR % GEMM_VEC || GEMM_MC % GEMM_MR || GEMM_NC % GEMM_NR
#error "gemm: NR must be a multiple of the vector width GEMM_VEC, MC of MR, NC of NR"
#endif
/* Below this many multiply-adds a thread team costs more than it saves. */
#define GEMM_MIN_PARALLEL_MACS (1L << 18)

/* fmaf(a, b, c) = a*b + c with one rounding. gcc vectorizes it to vfmadd231ps
 * where the target has FMA (-march=native); without FMA hardware it would be a
 * libm call per element, so there we fall back to a multiply and an add. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define GEMM_FMA(a, b, c) fmaf(a, b, c)
#else
#define GEMM_FMA(a, b, c) ((a) * (b) + (c))
#endif

#ifdef __cplusplus
#define GEMM_THREAD_LOCAL thread_local
#else
#define GEMM_THREAD_LOCAL _Thread_local
#endif

static int gemm_min(int a, int b) { return a < b ? a : b; }

/* Per-thread packing buffers (KC*(MC+NC)*4 = 4.8 MB), allocated on a thread's
 * first call and reused by all its later calls for the life of the process
 * (OpenMP keeps its threads alive). Thread-local, so concurrent calls with
 * threaded=0 never share a buffer. */
static float* gemm_buffers(void) {
    static GEMM_THREAD_LOCAL float* buf = NULL;
    if (buf == NULL) {
        size_t bytes = sizeof(float) * (size_t)GEMM_KC * (GEMM_MC + GEMM_NC);
        buf = (float*)aligned_alloc(64, bytes);  /* bytes is a multiple of 64 */
        if (buf == NULL) {
            fprintf(stderr, "gemm: cannot allocate %zu bytes of packing buffer "
                            "(out of memory?)\n", bytes);
            exit(EXIT_FAILURE);
        }
    }
    return buf;
}

/* Packing reads each operand along its contiguous dimension. Where that is
 * across the packed layout (a transpose), it goes in chunks of 16 k: one
 * cache line of each source row, and a few lines of the panel, stay in L1.
 * (Measured: 1.3x faster packing than whole rows; transposes are most of the
 * packing time, and packing is 5-15% of the total on the shapes of GPT-2.) */
#define GEMM_KCHUNK 16

/* Ap (mc/MR micro-panels, each kc x MR) <- A(0:mc, 0:kc); rows past mc are 0.
 * Inside a micro-panel, Ap[k*MR + r] = A(r, k): the MR values the kernel
 * broadcasts at step k are adjacent. */
static void gemm_pack_A(int mc, int kc, const float* A, long a_rs, long a_cs, float* Ap) {
    for (int i0 = 0; i0 < mc; i0 += GEMM_MR, Ap += (long)kc * GEMM_MR) {
        int mr = gemm_min(GEMM_MR, mc - i0);
        const float* a = A + i0 * a_rs;
        if (a_cs == 1) {  /* rows of A contiguous (inp, dout): a transpose */
            for (int k0 = 0; k0 < kc; k0 += GEMM_KCHUNK)
                for (int r = 0; r < mr; r++)
                    for (int k = k0; k < gemm_min(kc, k0 + GEMM_KCHUNK); k++)
                        Ap[k * GEMM_MR + r] = a[r * a_rs + k];
        } else {          /* columns of A contiguous (dout^T): MR-float copies */
            for (int k = 0; k < kc; k++)
                for (int r = 0; r < mr; r++) Ap[k * GEMM_MR + r] = a[r * a_rs + k * a_cs];
        }
        for (int k = 0; k < kc; k++)
            for (int r = mr; r < GEMM_MR; r++) Ap[k * GEMM_MR + r] = 0.0f;
    }
}

/* Bp (nc/NR micro-panels, each kc x NR) <- B(0:kc, 0:nc); columns past nc are 0.
 * Inside a micro-panel, Bp[k*NR + c] = B(k, c): the kernel's vector loads. */
static void gemm_pack_B(int kc, int nc, const float* B, long b_rs, long b_cs, float* Bp) {
    for (int j0 = 0; j0 < nc; j0 += GEMM_NR, Bp += (long)kc * GEMM_NR) {
        int nr = gemm_min(GEMM_NR, nc - j0);
        const float* b = B + j0 * b_cs;
        if (b_cs == 1) {  /* rows of B contiguous (W, inp): NR-float copies */
            for (int k = 0; k < kc; k++)
                for (int c = 0; c < nr; c++) Bp[k * GEMM_NR + c] = b[k * b_rs + c];
        } else {          /* columns of B contiguous (W^T in the forward): a transpose */
            for (int k0 = 0; k0 < kc; k0 += GEMM_KCHUNK)
                for (int c = 0; c < nr; c++)
                    for (int k = k0; k < gemm_min(kc, k0 + GEMM_KCHUNK); k++)
                        Bp[k * GEMM_NR + c] = b[k * b_rs + c * b_cs];
        }
        for (int k = 0; k < kc; k++)
            for (int c = nr; c < GEMM_NR; c++) Bp[k * GEMM_NR + c] = 0.0f;
    }
}

/* C(0:mr, 0:nr) = (add ? C : 0) + Ap . Bp over kc steps, mr <= MR, nr <= NR.
 * acc[][] has fixed size, so gcc and clang keep it in registers (the tile
 * table above) and turn each fmaf() row into vector FMAs (vfmadd231ps, fmla).
 * fmaf, not a*b+c: in ISO mode, -std=c11, gcc does not contract a*b+c into
 * an FMA; one rounding is also more accurate. On AVX2 the r loop is unrolled
 * whole (clang reads the GCC pragma too): left as a loop, gcc 12 swaps it with
 * the k loop for 6 x 16 and computes in scalars, 4x slower. On AVX-512 the
 * same pragma makes the 8 x 32 kernel 25x slower in cache (69.4 -> 2.8
 * GFLOP/s, gcc 12, Zen 4), so it is left out there. */
static void gemm_kernel(int kc, const float* Ap, const float* Bp,
                        float* C, long ldc, int mr, int nr, int add) {
    float acc[GEMM_MR][GEMM_NR] = {{0.0f}};
    for (int k = 0; k < kc; k++, Ap += GEMM_MR, Bp += GEMM_NR) {
#if GEMM_VEC == 8
        #pragma GCC unroll 16
#endif
        for (int r = 0; r < GEMM_MR; r++) {
            float a = Ap[r];
            for (int c = 0; c < GEMM_NR; c++)
                acc[r][c] = GEMM_FMA(a, Bp[c], acc[r][c]);
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {  /* full tile: fixed bounds, vector stores */
        for (int r = 0; r < GEMM_MR; r++)
            for (int c = 0; c < GEMM_NR; c++)
                C[r * ldc + c] = (add ? C[r * ldc + c] : 0.0f) + acc[r][c];
    } else {                               /* edge tile: same sums, fewer stores */
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++)
                C[r * ldc + c] = (add ? C[r * ldc + c] : 0.0f) + acc[r][c];
    }
}

/* Block size for splitting n into ceil(n/max) nearly equal blocks, rounded up
 * to a multiple of unit (K = 1000 with KC = 384 gives 3 x 334, not 384+384+232).
 * Only the K blocking changes the arithmetic (each K slice is summed, then
 * added onto C), and it depends on K alone, never on how threads split C. */
static int gemm_block(int n, int max, int unit) {
    int nblocks = (n + max - 1) / max;
    int b = (n + nblocks - 1) / nblocks;
    return (b + unit - 1) / unit * unit;
}

/* The five loops on the calling thread, for the whole of (M, N). */
static void gemm_serial(int M, int N, int K, const float* A, long a_rs, long a_cs,
                        const float* B, long b_rs, long b_cs, float* C, long ldc, int accumulate) {
    float* Ap = gemm_buffers();                  /* (MC, KC) in MR micro-panels */
    float* Bp = Ap + (long)GEMM_MC * GEMM_KC;    /* (KC, NC) in NR micro-panels */
    int NCb = gemm_block(N, GEMM_NC, GEMM_NR), KCb = gemm_block(K, GEMM_KC, 1);
    int MCb = gemm_block(M, GEMM_MC, GEMM_MR);
    for (int jc = 0; jc < N; jc += NCb) {
        int nc = gemm_min(NCb, N - jc);
        for (int pc = 0; pc < K; pc += KCb) {
            int kc = gemm_min(KCb, K - pc);
            int add = accumulate || pc > 0;      /* later K slices add onto C */
            gemm_pack_B(kc, nc, B + pc * b_rs + jc * b_cs, b_rs, b_cs, Bp);
            for (int ic = 0; ic < M; ic += MCb) {
                int mc = gemm_min(MCb, M - ic);
                gemm_pack_A(mc, kc, A + ic * a_rs + pc * a_cs, a_rs, a_cs, Ap);
                for (int ir = 0; ir < mc; ir += GEMM_MR)
                    for (int jr = 0; jr < nc; jr += GEMM_NR)
                        gemm_kernel(kc, Ap + (long)ir * kc, Bp + (long)jr * kc,
                                    C + (ic + ir) * ldc + jc + jr, ldc,
                                    gemm_min(GEMM_MR, mc - ir), gemm_min(GEMM_NR, nc - jr), add);
            }
        }
    }
}

/* C(M,N) = (accumulate ? C : 0) + A(M,K) . B(K,N), all fp32 (strides above).
 * threaded: 1 = use OpenMP threads inside (call from serial code); 0 = run on
 * the calling thread only (safe inside an omp parallel region, e.g. one call
 * per (batch, head) in attention). */
static void gemm(int M, int N, int K, const float* A, long a_rs, long a_cs,
                 const float* B, long b_rs, long b_cs, float* C, long ldc,
                 int accumulate, int threaded) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  /* empty sum: C = C or C = 0 */
        if (!accumulate)
            for (int i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * N);
        return;
    }
#ifdef _OPENMP
    if (threaded && (long)M * N * K >= GEMM_MIN_PARALLEL_MACS && omp_get_max_threads() > 1) {
        #pragma omp parallel
        {
            /* Split C into a tm x tn grid of nearly equal blocks, one per
             * thread, in whole micro-tiles. Pick the grid that packs least:
             * each thread packs its rows of A and its columns of B, so
             * minimise M/tm + N/tn (small M: split N; small N: split M). */
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int tm = 1;
            for (int d = 1; d <= nt; d++)
                if (nt % d == 0 && (double)M / d + (double)N * d / nt
                                 < (double)M / tm + (double)N * tm / nt) tm = d;
            int tn = nt / tm, ti = t / tn, tj = t % tn;
            int pm = (M + GEMM_MR - 1) / GEMM_MR, pn = (N + GEMM_NR - 1) / GEMM_NR;
            int i0 = gemm_min(M, (int)((long)pm * ti / tm) * GEMM_MR);
            int i1 = gemm_min(M, (int)((long)pm * (ti + 1) / tm) * GEMM_MR);
            int j0 = gemm_min(N, (int)((long)pn * tj / tn) * GEMM_NR);
            int j1 = gemm_min(N, (int)((long)pn * (tj + 1) / tn) * GEMM_NR);
            if (i0 < i1 && j0 < j1)
                gemm_serial(i1 - i0, j1 - j0, K, A + i0 * a_rs, a_rs, a_cs,
                            B + j0 * b_cs, b_rs, b_cs, C + i0 * ldc + j0, ldc, accumulate);
        }
        return;
    }
#endif
    (void)threaded;
    gemm_serial(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
}

#endif /* GPTC_GEMM_H */
