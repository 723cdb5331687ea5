/*
 * dev/cuda/common.h — what every kernel-lab file shares: random inputs,
 * validation with an absolute + relative tolerance, timing with CUDA events
 * after an L2 flush, and the device's memory-bandwidth roofline.
 *
 * Include it after train_gpt.c and gptc/cuda/common.cuh (it uses Rng,
 * xmalloc_floats, CUDA_CHECK, floatX), or after train_gpt.cu, which has both.
 */
#ifndef GPTC_DEV_CUDA_COMMON_H
#define GPTC_DEV_CUDA_COMMON_H

/* Uniform random floats in [lo, hi), from train_gpt.c's seeded Rng. */
static float* random_floats(size_t n, float lo, float hi, uint64_t seed) {
    Rng rng;
    rng_init(&rng, seed);
    float* x = xmalloc_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * rng_uniform(&rng);
    return x;
}

/* Round a host array to bf16 in place (so the CPU reference sees exactly the
 * values the GPU reads) and return a device copy in bf16. */
static floatX* to_device_bf16(float* host, size_t n) {
    floatX* tmp = (floatX*)xmalloc(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) {
        tmp[i] = __float2bfloat16(host[i]);
        host[i] = __bfloat162float(tmp[i]);
    }
    floatX* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

/* 1 when a and b hold the same bits (n floats), else 0; says which and
 * where on one line, against the production kernel (variant 2). */
static int same_bits(const char* what, const float* a, const float* b, size_t n) {
    size_t diff = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0) {
            if (!diff) first = i;
            diff++;
        }
    if (diff) printf("  %-28s FAIL  %zu of %zu differ from variant 2, first [%zu]: %.9g vs %.9g\n", what, diff, n, first,
                     a[first], b[first]);
    else printf("  %-28s ok    bit for bit variant 2's\n", what);
    return diff == 0;
}

static float* to_device_f32(const float* host, size_t n) {
    float* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static float* from_device_bf16(const floatX* d, size_t n) {
    floatX* tmp = (floatX*)xmalloc(n * sizeof(floatX));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    float* h = xmalloc_floats(n);
    for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(tmp[i]);
    free(tmp);
    return h;
}

static float* from_device_f32(const float* d, size_t n) {
    float* h = xmalloc_floats(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

/* |got - want| <= atol + rtol |want| for every element. Prints the worst
 * element and returns 1 when all pass. */
static int validate(const char* what, const float* got, const float* want, size_t n, double atol, double rtol) {
    size_t bad = 0, worst_at = 0;
    double worst = -1.0;
    for (size_t i = 0; i < n; i++) {
        double lim = atol + rtol * fabs((double)want[i]);
        double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= lim)) bad++;
        double r = isfinite(got[i]) ? err / lim : INFINITY;
        if (!(r <= worst)) { worst = r; worst_at = i; }
    }
    printf("  %-28s %s  worst at [%zu]: got %.6g want %.6g (error / tolerance %.2f; atol %.0e rtol %.0e)\n", what,
           bad ? "FAIL" : "ok  ", worst_at, got[worst_at], want[worst_at], worst, atol, rtol);
    if (bad) printf("  %zu of %zu elements out of tolerance\n", bad, n);
    return bad == 0;
}

/* Peak DRAM bandwidth in GB/s from the device attributes (0 if unknown). */
static double peak_bandwidth_gbs(void) {
    int dev, clock_khz = 0, bus_bits = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev) != cudaSuccess) clock_khz = 0;
    if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) != cudaSuccess) bus_bits = 0;
    (void)cudaGetLastError();
    return 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9; /* double data rate */
}

/* A buffer larger than L2, written before each timed run so that no run
 * finds its inputs in cache from the previous one. */
typedef struct {
    void* buf;
    size_t bytes;
} L2Flush;

static void l2flush_init(L2Flush* f) {
    int dev, l2 = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    f->bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
    CUDA_CHECK(cudaMalloc(&f->buf, f->bytes));
}
static void l2flush_free(L2Flush* f) { CUDA_CHECK(cudaFree(f->buf)); }

#ifdef CUDA_CPU_LAYER
static std::string counted_call; /* the CPU layer's counts of time_kernel's last call, for print_timing */
#endif

/* Median time in ms of `reps` runs of fn(ctx), each after an L2 flush. On
 * the CPU execution layer with CUDA_CPU_COUNT=1, one more call is counted
 * (dev/cuda/cpu/counters.cpp) and print_timing prints its counts. */
static double time_kernel(L2Flush* f, int reps, void (*fn)(void*), void* ctx) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    double ms[64];
    if (reps > 64) reps = 64;
    const char* cap = getenv("DEV_CUDA_REPS"); /* fewer repetitions: a check, not a measurement (make test on the CPU) */
    if (cap && atoi(cap) > 0 && atoi(cap) < reps) reps = atoi(cap);
    fn(ctx); /* warm-up: first-launch costs, cuBLASLt heuristics */
    for (int r = 0; r < reps; r++) {
        CUDA_CHECK(cudaMemsetAsync(f->buf, r & 0xff, f->bytes, 0));
        CUDA_CHECK(cudaEventRecord(a, 0));
        fn(ctx);
        CUDA_CHECK(cudaEventRecord(b, 0));
        CUDA_CHECK(cudaEventSynchronize(b));
        float t;
        CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
        ms[r] = t;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: reps is small */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) { double t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
#ifdef CUDA_CPU_LAYER
    if (cuda_cpu::count_on) {
        cuda_cpu::count_mark();
        fn(ctx);
        CUDA_CHECK(cudaDeviceSynchronize());
        counted_call = cuda_cpu::count_summary_since_mark();
    }
#endif
    return ms[reps / 2];
}

/* Beneath a variant's time: the counts of its last timed call, when the CPU
 * layer counted one (CUDA_CPU_COUNT=1); nothing on a GPU. */
static void print_counted(void) {
#ifdef CUDA_CPU_LAYER
    if (counted_call.empty()) return;
    printf("    counted (CPU layer, one call; dev/cuda/cpu/README.md, Counters):\n      ");
    for (char ch : counted_call) printf(ch == '\n' ? "\n      " : "%c", ch);
    printf("\n");
    counted_call.clear();
#endif
}

static void print_timing(const char* variant, double ms, double bytes, double peak_gbs) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    if (peak_gbs > 0) printf("  %-28s %8.3f ms  %7.1f GB/s  (%.0f%% of %.0f GB/s)\n", variant, ms, gbs, 100 * gbs / peak_gbs, peak_gbs);
    else printf("  %-28s %8.3f ms  %7.1f GB/s  (roofline unknown)\n", variant, ms, gbs);
    print_counted();
}

/* No device: say so and exit 77 (skipped), so a driver can tell it from a failure. */
static void require_device(const char* prog) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("%s: no CUDA device, nothing run\n", prog);
        exit(77);
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    printf("%s on %s\n", prog, p.name);
}

#endif /* GPTC_DEV_CUDA_COMMON_H */
