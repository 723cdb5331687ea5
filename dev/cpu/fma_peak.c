/*
 * fma_peak.c — this machine's fp32 FMA peak, measured: the yardstick that
 * `make bench` reports every GFLOP/s figure against (a matmul can approach it,
 * never pass it).
 *
 *   make dev/cpu/fma_peak && dev/cpu/fma_peak [CPU seconds per thread per trial (0.2)] [trials (5)]
 *   OMP_NUM_THREADS=1 dev/cpu/fma_peak      one core
 * Prints the trials, a summary, and last one parseable line (scripts/bench/bench.sh reads it):
 *   fma_peak gflops=... per_core=... wall_gflops=... threads=2 isa=avx512 chains=12 trial_s=0.20 trials=5
 *
 * How: every OpenMP thread runs CHAINS independent chains acc = acc*m + a,
 * each one vector FMA per step. A chain's next FMA waits for its last one
 * (latency ~4 cycles) while the core can start ~2 FMAs a cycle, so it needs
 * latency x throughput = ~8 chains in flight to keep its FMA units busy;
 * 12 leaves room for a 5-6 cycle latency and still fits AVX2's 16 registers
 * (12 accumulators, m, a). FLOPs = 2 per lane per FMA; the figure is the
 * best of several trials.
 *
 * The peak is taken over each thread's CPU time, not the wall clock: these
 * machines are shared, and while another job runs on a core the wall-clock
 * rate falls (measured: to 27% with load 4.8 on 2 cores) while the CPU-time
 * rate stays within ~5% of a quiet machine's (time the hypervisor takes from
 * the VM does count as CPU time: hence the best of several trials). The
 * wall-clock rate is printed beside it: their ratio is the share of the cores
 * the probe got, i.e. how much the wall-clock figures of the run were held back.
 *
 * The vector width is the widest the compiler targets (-march=native):
 * AVX-512F zmm (16 floats), AVX2+FMA ymm (8) through intrinsics; otherwise
 * GNU C vectors, each lane through the same rule as train_gpt.c's GEMM_FMA
 * (fmaf where the target has FMA, a*b+c where it has not), which gcc turns
 * into the same vector instruction; -DFMA_PEAK_PORTABLE forces that path (on
 * AVX2 it gives the same loop and figure). Check the inner loop is vector FMAs:
 *   objdump -d --no-show-raw-insn dev/cpu/fma_peak | awk '/<fma_chains/,/ret/' | grep -c 'vfmadd...ps'
 * expect 12 (on AVX-512: zmm, on AVX2: ymm).
 *
 * Left out on purpose: other operations' peaks (loads, adds), and what the
 * memory system can feed; this is the compute roof only.
 */
#define _POSIX_C_SOURCE 199309L  /* clock_gettime under -std=c11 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if !defined(FMA_PEAK_PORTABLE) && (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)))
#include <immintrin.h>
#endif

#define CHAINS 12

#if !defined(FMA_PEAK_PORTABLE) && defined(__AVX512F__)
#define ISA "avx512"
#define LANES 16
typedef __m512 vec;
#define vec_set1(x) _mm512_set1_ps(x)
#define vec_fma(a, b, c) _mm512_fmadd_ps(a, b, c)  /* a*b + c, one rounding */
static float vec_sum(vec v) { return _mm512_reduce_add_ps(v); }
#elif !defined(FMA_PEAK_PORTABLE) && defined(__AVX2__) && defined(__FMA__)
#define ISA "avx2"
#define LANES 8
typedef __m256 vec;
#define vec_set1(x) _mm256_set1_ps(x)
#define vec_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
static float vec_sum(vec v) {
    float f[LANES];
    _mm256_storeu_ps(f, v);
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += f[i];
    return s;
}
#else
/* Portable: GNU C vector types (registers, like the intrinsics above), each
 * lane through the same rule as train_gpt.c's GEMM_FMA: fmaf where the target
 * has FMA, which gcc turns back into one vector FMA; a*b+c where it has not.
 * LANES is one register's worth, so the 12 chains fit the register file. */
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define ISA "portable-fmaf"
#define LANE_FMA(a, b, c) fmaf(a, b, c)
#else
#define ISA "portable-mul-add"
#define LANE_FMA(a, b, c) ((a) * (b) + (c))
#endif
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
static vec vec_set1(float x) {
    vec v;
    for (int i = 0; i < LANES; i++) v[i] = x;
    return v;
}
static vec vec_fma(vec a, vec b, vec c) {
    vec r;
    for (int i = 0; i < LANES; i++) r[i] = LANE_FMA(a[i], b[i], c[i]);
    return r;
}
static float vec_sum(vec v) {
    float s = 0.0f;
    for (int i = 0; i < LANES; i++) s += v[i];
    return s;
}
#endif

static double clock_s(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* steps x CHAINS vector FMAs. Every chain converges to a / (1 - m) = 1 from
 * its own start, so values stay normal (no denormal slow path) and finite.
 * Returns the sum of the chains, which the caller keeps (the work is live). */
__attribute__((noinline)) static float fma_chains(long steps, float m, float a, float start) {
    vec acc[CHAINS];
    for (int c = 0; c < CHAINS; c++) acc[c] = vec_set1(start + 0.01f * c);
    vec vm = vec_set1(m), va = vec_set1(a);
    for (long s = 0; s < steps; s++) {
        /* where the time goes. Unrolled, so that every step issues all chains
         * at once (left as a loop, gcc may turn it inside out: one chain at
         * a time over all steps, which is latency-bound) */
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = vec_fma(acc[c], vm, va);
    }
    float sum = 0.0f;
    for (int c = 0; c < CHAINS; c++) sum += vec_sum(acc[c]);
    return sum;
}

/* m and a are read through volatile, so the compiler cannot know them. */
static volatile float fma_m = 0.999f, fma_a = 0.001f;
static volatile float sink;

/* One trial: every thread runs steps x CHAINS vector FMAs. Two rates:
 *   wall: all FLOPs over the wall time between the barriers (as slow as the
 *         slowest thread, and as any other job that takes a core makes it);
 *   cpu:  the sum over threads of its FLOPs over its own CPU time, which
 *         excludes the time another process ran on the core: what the FMA
 *         units deliver while they are ours, however busy the machine. */
typedef struct { double wall_gflops, cpu_gflops; int threads; } Trial;

static Trial trial(long steps) {
    double flops = 2.0 * LANES * CHAINS * (double)steps;  /* per thread */
    double t0 = 0, t1 = 0, cpu_gflops = 0;
    float total = 0.0f;
    int threads = 1;
#pragma omp parallel reduction(+ : total, cpu_gflops)
    {
#pragma omp barrier
#pragma omp master
        t0 = clock_s(CLOCK_MONOTONIC);
        double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        total += fma_chains(steps, fma_m, fma_a, 0.5f);
        cpu_gflops += flops / (clock_s(CLOCK_THREAD_CPUTIME_ID) - c0) / 1e9;
#pragma omp barrier
#pragma omp master
        {
            t1 = clock_s(CLOCK_MONOTONIC);
#ifdef _OPENMP
            threads = omp_get_num_threads();
#endif
        }
    }
    sink = total;
    Trial r = {flops * threads / (t1 - t0) / 1e9, cpu_gflops, threads};
    return r;
}

int main(int argc, char** argv) {
    double trial_s = argc > 1 ? atof(argv[1]) : 0.2;
    int trials = argc > 2 ? atoi(argv[2]) : 5;
    if (argc > 3 || !(trial_s > 0.0 && trial_s <= 60.0) || trials < 1) {
        fprintf(stderr, "usage: %s [CPU seconds per thread per trial, 0 < s <= 60 (0.2)] [trials >= 1 (5)]\n", argv[0]);
        return EXIT_FAILURE;
    }
    /* Calibrate: double the steps until a thread spends 20 ms of CPU time on
     * a trial (this also wakes the threads and lets the clock ramp up), then
     * scale to trial_s. CPU time, not wall: on a busy machine the wall clock
     * would make the trials far too short. */
    long steps = 1L << 12;
    Trial t = trial(steps);
    double cpu_s = 2.0 * LANES * CHAINS * (double)steps * t.threads / (t.cpu_gflops * 1e9);
    while (cpu_s < 0.02) {
        steps *= 2;
        t = trial(steps);
        cpu_s = 2.0 * LANES * CHAINS * (double)steps * t.threads / (t.cpu_gflops * 1e9);
    }
    steps = (long)(steps * trial_s / cpu_s) + 1;
    int threads = t.threads;
    double best_cpu = 0.0, best_wall = 0.0;
    printf("fma peak: %d threads, %s, %d lanes x %d chains per thread, %ld steps per trial\n", threads, ISA,
           LANES, CHAINS, steps);
    printf("fma peak: trials, GFLOP/s over CPU time (over wall time):");
    for (int i = 0; i < trials; i++) {
        t = trial(steps);
        printf(" %.1f (%.1f)", t.cpu_gflops, t.wall_gflops);
        if (t.cpu_gflops > best_cpu) best_cpu = t.cpu_gflops;
        if (t.wall_gflops > best_wall) best_wall = t.wall_gflops;
    }
    printf("\n");
    if (!isfinite(sink)) {  /* the chains converge to 1 each: a NaN means the arithmetic went wrong */
        fprintf(stderr, "error: fma_peak's chains ended at %g, not finite\n", (double)sink);
        return EXIT_FAILURE;
    }
    /* The peak is the CPU-time rate: on a shared machine the wall-time one
     * says how much of the cores this probe got, not what they can do. */
    printf("fma peak: best %.1f GFLOP/s total, %.1f per core (%d threads); over wall time %.1f (%.0f%%)\n",
           best_cpu, best_cpu / threads, threads, best_wall, 100.0 * best_wall / best_cpu);
    printf("fma_peak gflops=%.1f per_core=%.1f wall_gflops=%.1f threads=%d isa=%s chains=%d trial_s=%.2f trials=%d\n",
           best_cpu, best_cpu / threads, best_wall, threads, ISA, CHAINS, trial_s, trials);
    return 0;
}
