/* bench_gemm.c — validates and times the matmul engine of train_gpt.c
 * (gptc/gemm.h, included from there: the kernel is written once).
 *
 * Build (OpenBLAS is linked here only, as the yardstick; train_gpt.c needs none):
 *   gcc -std=c11 -O3 -march=native -fopenmp -Wall -Wextra -Wno-unused-function -I. dev/cpu/bench_gemm.c -o /tmp/bench_gemm
 *       /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 -lm
 * (cblas.h from libopenblas-dev; the .so.0 path picks the OpenMP build of OpenBLAS,
 * which has no unversioned libopenblas.so symlink.)
 * Run:
 *   /tmp/bench_gemm test     # correctness: awkward sizes x strides x flags, determinism
 *   /tmp/bench_gemm test-quick  # the same on fewer sizes (under an emulator: make test-portable)
 *   /tmp/bench_gemm bench    # GFLOP/s on the GPT-2 124M shapes vs OpenBLAS sgemm
 *   /tmp/bench_gemm          # both
 * Build without OpenBLAS (tests + our timings only): add -DNO_OPENBLAS, drop the .so.
 * Build without OpenMP: drop -fopenmp (serial gemm; the thread checks are skipped).
 *
 * The tests exit non-zero on any failure and end with "N passed, N failed". */
#include "gptc/gemm.h" /* defines: gemm and its parts; with gptc/util.h: xmalloc_floats, time_ms, num_threads */

#include <stdint.h>
#include <time.h>
#ifndef NO_OPENBLAS
#include <cblas.h>
/* OpenBLAS's own thread count; declared here because the cblas.h found first
 * may be netlib's (libblas-dev), which does not declare it */
void openblas_set_num_threads(int num_threads);
#endif

static int gemm_max(int a, int b) { return a > b ? a : b; }

static int n_pass = 0, n_fail = 0;

static void check(int ok, const char* what) {
    if (ok) n_pass++;
    else { n_fail++; printf("FAIL: %s\n", what); }
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float randf(void) {  /* uniform in [-1, 1), xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (float)((rng_state * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 23) - 1.0f;
}
static void fill(float* x, long n) { for (long i = 0; i < n; i++) x[i] = randf(); }

static void set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
#ifndef NO_OPENBLAS
    openblas_set_num_threads(n);  /* OpenBLAS keeps its own count, even its OpenMP build */
#endif
    (void)n;
}

/* ----------------------------------------------------------------------------
 * correctness */

/* Largest error of C against a double-precision triple loop, as a multiple of
 * the tolerance: |C - ref| <= 1e-6 * sqrt(K+1) * (|C0| + sum_k |A(i,k) B(k,j)|).
 * Rounding error of a K-term fp32 sum grows ~ sqrt(K) * eps * sum|terms|
 * (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3). */
static double error_vs_reference(int M, int N, int K, const float* A, long a_rs, long a_cs,
                                 const float* B, long b_rs, long b_cs, const float* C0,
                                 const float* C, long ldc, int accumulate) {
    double worst = 0.0, tol = 1e-6 * sqrt(K + 1.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double c0 = accumulate ? C0[i * ldc + j] : 0.0, sum = c0, mag = fabs(c0);
            for (int k = 0; k < K; k++) {
                double t = (double)A[i * a_rs + k * a_cs] * B[k * b_rs + j * b_cs];
                sum += t; mag += fabs(t);
            }
            double e = fabs(C[i * ldc + j] - sum) / (tol * (mag + 1e-30));
            if (!(e <= worst)) worst = e;  /* NaN propagates as a failure */
        }
    return worst;
}

/* One case: A row-major or column-major (a_t), B likewise (b_t), C with a padded
 * leading dimension, accumulate 0/1, threaded 0/1. Padding of C must survive. */
static int test_case(int M, int N, int K, int a_t, int b_t, int accumulate, int threaded, int plant) {
    long pad = 3;
    long a_rs = a_t ? 1 : K + pad, a_cs = a_t ? M + pad : 1;
    long b_rs = b_t ? 1 : N + pad, b_cs = b_t ? K + pad : 1;
    long ldc = N + pad;
    long na = a_t ? (long)K * (M + pad) : (long)M * (K + pad);
    long nb = b_t ? (long)N * (K + pad) : (long)K * (N + pad);
    long nc = (long)M * ldc;
    float *A = (float*)xmalloc(4 * na), *B = (float*)xmalloc(4 * nb);
    float *C = (float*)xmalloc(4 * nc), *C0 = (float*)xmalloc(4 * nc);
    fill(A, na); fill(B, nb); fill(C0, nc);
    memcpy(C, C0, 4 * nc);
    gemm(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate, threaded);
    if (plant) C[(long)(M - 1) * ldc + N - 1] += 1e-3f;  /* test the tester */
    double err = error_vs_reference(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C0, C, ldc, accumulate);
    int pad_ok = 1;
    for (int i = 0; i < M; i++)
        for (long j = N; j < ldc; j++) pad_ok &= C[i * ldc + j] == C0[i * ldc + j];
    free(A); free(B); free(C); free(C0);
    return err <= 1.0 && pad_ok;
}

/* Bitwise: 1 thread vs all threads, threaded=0 vs 1, and threaded=0 calls made
 * concurrently from an omp parallel region (the attention use). */
static void test_determinism(int M, int N, int K, int a_t, int b_t) {
    long a_rs = a_t ? 1 : K, a_cs = a_t ? M : 1, b_rs = b_t ? 1 : N, b_cs = b_t ? K : 1;
    float *A = (float*)xmalloc(4L * M * K), *B = (float*)xmalloc(4L * K * N);
    float *C1 = (float*)xmalloc(4L * M * N), *C2 = (float*)xmalloc(4L * M * N), *C3 = (float*)xmalloc(4L * M * N);
    fill(A, (long)M * K); fill(B, (long)K * N); fill(C1, (long)M * N);
    memcpy(C2, C1, 4L * M * N); memcpy(C3, C1, 4L * M * N);
    int nt = num_threads();
    set_threads(1); gemm(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C1, N, 1, 1);
    set_threads(nt); gemm(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C2, N, 1, 1);
    /* 4 row bands computed concurrently, each on its own thread */
    int band = (M + 3) / 4;
#ifdef _OPENMP
    #pragma omp parallel for
#endif
    for (int b = 0; b < 4; b++) {
        int i0 = b * band, rows = gemm_min(band, M - i0);
        if (rows > 0) gemm(rows, N, K, A + i0 * a_rs, a_rs, a_cs, B, b_rs, b_cs, C3 + (long)i0 * N, N, 1, 0);
    }
    char what[160];
    snprintf(what, sizeof what, "bitwise 1 vs %d threads, M=%d N=%d K=%d a_t=%d b_t=%d", nt, M, N, K, a_t, b_t);
    check(memcmp(C1, C2, 4L * M * N) == 0, what);
    snprintf(what, sizeof what, "bitwise threaded=0 in omp region, M=%d N=%d K=%d a_t=%d b_t=%d", M, N, K, a_t, b_t);
    check(memcmp(C1, C3, 4L * M * N) == 0, what);
    free(A); free(B); free(C1); free(C2); free(C3);
}

/* quick: fewer sizes and smaller determinism cases (an emulated machine: the
 * aarch64 build under qemu-user), every tile edge still crossed */
static void run_tests(int quick) {
    static const int all_sizes[] = {1, 3, 7, 17, 63, 65, 129, 257}, quick_sizes[] = {1, 3, 17, 65};
    const int* sizes = quick ? quick_sizes : all_sizes;
    int ns = quick ? 4 : (int)(sizeof all_sizes / sizeof all_sizes[0]);
    int nt = num_threads();
    printf("tests: %d sizes^3 x 4 stride layouts x accumulate 0/1 x threaded 0/1, %d threads\n", ns, nt);
    for (int mi = 0; mi < ns; mi++)
        for (int ni = 0; ni < ns; ni++)
            for (int ki = 0; ki < ns; ki++)
                for (int layout = 0; layout < 4; layout++) {
                    int M = sizes[mi], N = sizes[ni], K = sizes[ki];
                    /* all flag combinations on the small cases, one rotating combination on big ones */
                    int small = (long)M * N * K <= 65L * 65 * 65;
                    for (int flags = 0; flags < 4; flags++) {
                        if (!small && flags != (mi + ni + ki) % 4) continue;
                        char what[128];
                        snprintf(what, sizeof what, "M=%d N=%d K=%d a_t=%d b_t=%d acc=%d thr=%d",
                                 M, N, K, layout & 1, layout >> 1, flags & 1, flags >> 1);
                        check(test_case(M, N, K, layout & 1, layout >> 1, flags & 1, flags >> 1, 0), what);
                    }
                }
    /* K = 0: C = 0 or C unchanged; and blocking boundaries (KC, MC, NC +- 1) */
    check(test_case(5, 9, 0, 0, 0, 0, 1, 0), "K=0 accumulate=0");
    check(test_case(5, 9, 0, 1, 1, 1, 0, 0), "K=0 accumulate=1");
    check(test_case(GEMM_MC + 1, GEMM_NC + 1, GEMM_KC + 1, 0, 1, 1, 1, 0), "MC+1 x NC+1 x KC+1");
    if (!quick) check(test_case(2 * GEMM_MC - 1, 2 * GEMM_NC - 1, 2 * GEMM_KC - 1, 1, 0, 0, 1, 0), "2MC-1 x 2NC-1 x 2KC-1");
    /* the three transformer products at a small size, and attention (hs = 64) */
    /* test the tester: a planted error of 1e-3 must be caught */
    check(!test_case(17, 65, 63, 0, 1, 1, 1, 1), "planted wrong answer is rejected");
    if (quick) {
        test_determinism(129, 517, 300, 0, 1); /* splits N */
        test_determinism(517, 65, 259, 1, 0);  /* splits M */
        return;
    }
    check(test_case(96, 2304, 768, 0, 1, 0, 1, 0), "forward inp . W^T");
    check(test_case(96, 768, 2304, 0, 0, 1, 1, 0), "backward dout . W");
    check(test_case(2304, 768, 96, 1, 0, 1, 1, 0), "backward dout^T . inp");
    check(test_case(200, 200, 64, 0, 1, 0, 0, 0), "attention Q K^T");
    test_determinism(257, 1031, 700, 0, 1);   /* splits N */
    test_determinism(1031, 129, 517, 1, 0);   /* splits M */
    test_determinism(64, 50304 / 8, 768, 0, 1);
}

/* ----------------------------------------------------------------------------
 * benchmark */

static float* flush_buf;
volatile float flush_sink; /* a store the compiler must keep, so the flushing loop is kept */
static void flush_caches(void) {  /* evict L1/L2/L3 (32 MiB) between runs */
    long n = 64L << 20 >> 2;
    for (long i = 0; i < n; i += 16) flush_buf[i] += 1.0f;
    flush_sink = flush_buf[n / 2];
}

typedef struct {
    const char* name;
    int M, N, K;
    long a_rs, a_cs, b_rs, b_cs;
    int b_trans;  /* for cblas: B given as (N,K) row-major */
    int a_trans;  /* for cblas: A given as (K,M) row-major */
} Shape;

static void run_gemm(const Shape* s, const float* A, const float* B, float* C, int which) {
    if (which == 0) {
        gemm(s->M, s->N, s->K, A, s->a_rs, s->a_cs, B, s->b_rs, s->b_cs, C, s->N, 0, 1);
    } else {
#ifndef NO_OPENBLAS
        cblas_sgemm(CblasRowMajor, s->a_trans ? CblasTrans : CblasNoTrans,
                    s->b_trans ? CblasTrans : CblasNoTrans, s->M, s->N, s->K, 1.0f,
                    A, s->a_trans ? s->M : s->K, B, s->b_trans ? s->K : s->N, 0.0f, C, s->N);
#endif
    }
}

/* GFLOP/s of ours (gf[0]) and OpenBLAS (gf[1]), best of `reps` runs each.
 * Each library runs its reps back to back: alternating single runs slowed
 * OpenBLAS's small products by up to 40% (its threads and ours share libgomp). */
static void time_gemm(const Shape* s, const float* A, const float* B, float* C, int reps, double gf[2]) {
    for (int which = 0; which < 2; which++) {
        double best = 1e30;
#ifdef NO_OPENBLAS
        if (which == 1) { gf[1] = 0.0; continue; }
#endif
        run_gemm(s, A, B, C, which);  /* warm-up: thread team, packing buffers */
        for (int r = 0; r < reps; r++) {
            flush_caches();
            double t = now();
            run_gemm(s, A, B, C, which);
            t = now() - t;
            if (t < best) best = t;
        }
        gf[which] = 2.0 * s->M * s->N * s->K / best * 1e-9;
    }
}

/* spot-check 64 elements of a big product against double dot products */
static int spot_check(const Shape* s, const float* A, const float* B, const float* C) {
    double worst = 0.0, tol = 1e-6 * sqrt(s->K + 1.0);
    for (int t = 0; t < 64; t++) {
        int i = (int)((randf() + 1.0f) * 0.5f * s->M) % s->M, j = (int)((randf() + 1.0f) * 0.5f * s->N) % s->N;
        double sum = 0.0, mag = 0.0;
        for (int k = 0; k < s->K; k++) {
            double p = (double)A[i * s->a_rs + k * s->a_cs] * B[k * s->b_rs + j * s->b_cs];
            sum += p; mag += fabs(p);
        }
        double e = fabs(C[(long)i * s->N + j] - sum) / (tol * mag);
        if (!(e <= worst)) worst = e;
    }
    return worst <= 1.0;
}

/* The roofline: the micro-kernel alone on packed panels that sit in cache
 * (one thread). On Zen 4 this is the FMA peak, 1 zmm FMA per cycle = 32 FLOP
 * per cycle, times the boost clock. */
static double kernel_peak(void) {
    int kc = GEMM_KC, mc = GEMM_MC, nc = 8 * GEMM_NR;
    float* Ap = gemm_buffers();
    float* Bp = Ap + (long)GEMM_MC * GEMM_KC;
    float* C = (float*)xmalloc(4L * mc * nc);
    fill(Ap, (long)kc * mc); fill(Bp, (long)kc * nc); memset(C, 0, 4L * mc * nc);
    double best = 1e30;
    for (int r = 0; r < 200; r++) {
        double t = now();
        for (int ir = 0; ir < mc; ir += GEMM_MR)
            for (int jr = 0; jr < nc; jr += GEMM_NR)
                gemm_kernel(kc, Ap + (long)ir * kc, Bp + (long)jr * kc, C + (long)ir * nc + jr, nc,
                            GEMM_MR, GEMM_NR, 1);
        t = now() - t;
        if (t < best) best = t;
    }
    free(C);
    return 2.0 * kc * mc * nc / best * 1e-9;
}

static void run_bench(void) {
    int nt = num_threads();
    printf("\nroofline: micro-kernel alone, in cache, 1 thread: %.1f GFLOP/s\n", kernel_peak());
    flush_buf = (float*)xmalloc(64L << 20);
    memset(flush_buf, 0, 64L << 20);
    static const int bts[] = {256, 2048};
    static const int ocs[] = {768, 2304, 3072, 50304};
    const int C_ = 768;
    Shape shapes[32];
    int n = 0;
    shapes[n++] = (Shape){"square 2048^3", 2048, 2048, 2048, 2048, 1, 2048, 1, 0, 0};
    for (int b = 0; b < 2; b++)
        for (int o = 0; o < 4; o++) {
            int BT = bts[b], OC = ocs[o];
            /* forward    out(BT,OC)   = inp(BT,C) . W(OC,C)^T */
            shapes[n++] = (Shape){"fwd  inp.W^T ", BT, OC, C_, C_, 1, 1, C_, 1, 0};
            /* backward   dinp(BT,C)  += dout(BT,OC) . W(OC,C) */
            shapes[n++] = (Shape){"bwd  dout.W  ", BT, C_, OC, OC, 1, C_, 1, 0, 0};
            /* backward   dW(OC,C)    += dout(BT,OC)^T . inp(BT,C) */
            shapes[n++] = (Shape){"bwd  dout^T.x", OC, C_, BT, 1, OC, C_, 1, 0, 1};
        }
    printf("\n%-14s %5s %5s %5s | %9s %9s | %9s %9s | %6s\n", "shape", "M", "N", "K",
           "ours 1t", "ours", "oblas 1t", "oblas", "ratio");
    printf("(GFLOP/s; 'ours'/'oblas' with %d threads; ratio = ours / oblas at %d threads; best of 3..25 runs, caches flushed before each)\n", nt, nt);
    double sum_ratio = 0.0, min_ratio = 1e30;
    for (int i = 0; i < n; i++) {
        const Shape* s = &shapes[i];
        long na = (long)s->M * s->K, nb = (long)s->K * s->N, nc = (long)s->M * s->N;
        float *A = (float*)xmalloc(4 * na), *B = (float*)xmalloc(4 * nb), *C = (float*)xmalloc(4 * nc);
        fill(A, na); fill(B, nb); memset(C, 0, 4 * nc);
        /* more runs of the small shapes: the best of many filters out preemption */
        int reps = gemm_min(25, gemm_max(3, (int)(2e10 / (2.0 * nc * s->K))));
        double g1[2], gn[2];
        set_threads(1);
        time_gemm(s, A, B, C, reps, g1);
        set_threads(nt);
        run_gemm(s, A, B, C, 0);
        check(spot_check(s, A, B, C), s->name);
        time_gemm(s, A, B, C, reps, gn);
        double ours1 = g1[0], ob1 = g1[1], oursn = gn[0], obn = gn[1];
        double ratio = obn > 0.0 ? oursn / obn : 0.0;
        if (i > 0) { sum_ratio += ratio; if (ratio < min_ratio) min_ratio = ratio; }
        printf("%-14s %5d %5d %5d | %9.1f %9.1f | %9.1f %9.1f | %5.0f%%\n", s->name, s->M, s->N, s->K,
               ours1, oursn, ob1, obn, 100.0 * ratio);
        fflush(stdout);
        free(A); free(B); free(C);
    }
    printf("transformer shapes: mean ratio %.0f%%, min %.0f%%\n", 100.0 * sum_ratio / (n - 1), 100.0 * min_ratio);
    free(flush_buf);
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "all";
    if (strcmp(mode, "test") && strcmp(mode, "test-quick") && strcmp(mode, "bench") && strcmp(mode, "all")) {
        fprintf(stderr, "usage: %s [test|test-quick|bench|all]   (default all)\n", argv[0]);
        return 2;
    }
    printf("gemm: %s tile, MR=%d NR=%d (vector %d floats) KC=%d MC=%d NC=%d, %d threads\n",
           GEMM_ISA, GEMM_MR, GEMM_NR, GEMM_VEC, GEMM_KC, GEMM_MC, GEMM_NC, num_threads());
    int testing = !strncmp(mode, "test", 4);
    if (strcmp(mode, "bench")) run_tests(!strcmp(mode, "test-quick"));
    if (!testing) run_bench();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
