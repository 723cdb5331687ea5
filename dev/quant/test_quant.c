/*
 * dev/quant/test_quant.c — the tests of gptc/quant.h (ZeRO++'s quantised
 * collectives): block quantisation, qwZ, qgZ with and without error
 * feedback, hpZ, and the bytes each sends per level.
 *
 *   make test-quant                                   (scripts/tests/test_quant.sh: -np 1, 2 and 4)
 *   mpirun --allow-run-as-root --oversubscribe -np 4 dev/quant/test_quant
 *   dev/quant/test_quant --bench      encode/decode GB/s, 1 thread and all (not a test)
 *
 * What is checked, against references written here, not the header's:
 *   - quantisation (rank 0): every element within the stated bounds
 *     (|x - q*s| <= s/2 as a real number; |x - deq| <= s (1/2 + qmax
 *     2^-24)), the scale within 2^-22 of m/qmax, the bound reached (worst
 *     error over s/2 above 0.9 on random data: it is tight), on random
 *     and adversarial blocks (one huge value, zeros and -0, denormals fine
 *     and coarse, magnitudes 2^-20..2^20, values near FLT_MAX), NaN/Inf
 *     blocks made NaN and only those, round half to even, the INT4 nibble
 *     layout and round trip, the error-feedback residual; a planted
 *     error 1% past the bound must be rejected;
 *   - collectives on every level layout the world size allows (-np 2: {2},
 *     {1,2}; -np 4: {4}, {2,2} (two emulated nodes of two, split on
 *     rank / 2), {2,1,2} (three levels)), INT8 and INT4, shards of 1000 and
 *     333 floats (a short last block, an odd INT4 payload), block 64:
 *     qwZ's full buffer bit for bit deq(q(shard)) of every rank's shard
 *     (recomputed here from the same seeds), a planted flipped bit rejected;
 *     hpZ's node-only gather bit for bit the qwZ result; qgZ against the
 *     sum of all ranks' inputs in fp64 within a bound derived hop by hop
 *     from the inputs alone (qgz_bound below), a planted answer 2 bounds
 *     off rejected, a NaN in one rank's block making exactly that block of
 *     the result NaN; error feedback over K = 16 steps of a gradient whose
 *     small entries round to 0: the summed results within one step's
 *     quantisation error (plus K steps of fp32 rounding) of K times the
 *     true sum, and the same run without feedback outside that bound;
 *     the bytes sent at each level equal to the formulas, exactly.
 * The last line is "N passed, N failed" (rank 0); exit status non-zero on a
 * failure.
 */
#include "gptc/quant.h" /* first: gptc/util.h sets _GNU_SOURCE */
#include <stdarg.h>
#include "test_check.h"

static int g_rank = 0, g_world = 1;

/* a check every rank takes part in: passes when it passes on every rank */
static void check_all(int ok, const char* what, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void check_all(int ok, const char* what, const char* fmt, ...) {
    int all = ok;
    MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (g_rank == 0) check(all, what, detail);
}
static double max_all(double v) {
    double m = v;
    MPI_CHECK(MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return m;
}

/* ---- inputs ---- */
enum { DATA_NORMAL, DATA_ADVERSARIAL, DATA_EF };

/* n floats from seed: normal, or adversarial blocks in turn (kinds below),
 * or DATA_EF: +100 first in each block, then entries that quantise to 0
 * (0.405..0.45 of the block's scale) */
static void fill(float* x, size_t n, uint64_t seed, int block, int kind, int bits) {
    Rng rng;
    rng_init(&rng, seed);
    for (size_t lo = 0; lo < n; lo += (size_t)block) {
        size_t hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        int k = kind == DATA_ADVERSARIAL ? (int)(lo / (size_t)block % 6) : 0;
        for (size_t i = lo; i < hi; i++) {
            float v = (float)rng_normal(&rng);
            if (kind == DATA_EF) v = i == lo ? 100.0f : (0.405f + 0.045f * rng_uniform(&rng)) * 100.0f / quant_qmax(bits);
            else if (k == 1) v *= 1e-3f;                                   /* small, beside one huge value */
            else if (k == 2) v = (rng_u32(&rng) & 1) ? -0.0f : 0.0f;       /* zeros and -0 */
            else if (k == 3) v = (float)(rng_u32(&rng) >> 9) * FLT_TRUE_MIN * (v < 0 ? -1.0f : 1.0f); /* denormals */
            else if (k == 4) v = (float)(rng_u32(&rng) % 191) * FLT_TRUE_MIN * (v < 0 ? -1.0f : 1.0f); /* coarse denormals */
            else if (k == 5) v = ldexpf(v, (int)(rng_u32(&rng) % 41) - 20); /* magnitudes 2^-20..2^20 */
            x[i] = v;
        }
        if (k == 1) x[lo + rng_u32(&rng) % (hi - lo)] = (rng_u32(&rng) & 1) ? 1e6f : -1e6f;
    }
}

/* ---- the bound checker (rank 0's quantisation tests) ---- */
/* every finite block of x against its scales and dequantised values;
 * *worst = the largest |x - deq| / (s/2). Returns 1 when all hold. */
static int check_bounds(const float* x, size_t n, int bits, int block, const float* scales, const uint8_t* payload,
                        const float* deq, double* worst, char* why, size_t why_len) {
    int qmax = quant_qmax(bits);
    *worst = 0.0;
    for (size_t lo = 0, b = 0; lo < n; lo += (size_t)block, b++) {
        size_t hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        double m = 0.0;
        for (size_t i = lo; i < hi; i++) m = fmax(m, fabs((double)x[i]));
        double s = scales[b];
        if (m == 0.0) {
            for (size_t i = lo; i < hi; i++)
                if (deq[i] != 0.0f || signbit(deq[i]) || s != 0.0) {
                    snprintf(why, why_len, "zero block %zu: deq %g scale %g", b, deq[i], s);
                    return 0;
                }
            continue;
        }
        if (!(s > 0.0) || m / s >= qmax + 0.5 || (s >= FLT_MIN && fabs(s - m / qmax) > 0x1p-22 * m / qmax) ||
            (s < FLT_MIN && s > m / qmax + FLT_TRUE_MIN)) {
            snprintf(why, why_len, "block %zu: scale %.9g for max %.9g", b, s, m);
            return 0;
        }
        for (size_t i = lo; i < hi; i++) {
            int q = quant_get(payload, i, bits);
            double exact = fabs((double)x[i] - (double)q * s);              /* q*s exact in double */
            double err = fabs((double)x[i] - (double)deq[i]);
            if (exact > s / 2 || err > s * (0.5 + qmax * 0x1p-24) || deq[i] != (float)q * (float)s) {
                snprintf(why, why_len, "element %zu: x %.9g deq %.9g (q %d, s %.9g): |x - q s| = %.3g s, |x - deq| = %.6g s",
                         i, x[i], deq[i], q, s, exact / s, err / s);
                return 0;
            }
            *worst = fmax(*worst, err / (s / 2));
        }
    }
    return 1;
}

static void test_quantise_local(void) {
    size_t n = 10007;
    float* x = (float*)xmalloc(n * sizeof(float));
    float* deq = (float*)xmalloc(n * sizeof(float));
    float* scales = (float*)xmalloc(n * sizeof(float));
    uint8_t* payload = (uint8_t*)xmalloc(n);
    char why[400], what[120];
    const char* kinds[] = {"normal", "adversarial"};
    double worst;
    int bitss[2] = {8, 4}, blocks[3] = {32, 64, 1024};
    for (int bi = 0; bi < 2; bi++)
        for (int k = 0; k < 2; k++)
            for (int bl = 0; bl < 3; bl++) {
                int bits = bitss[bi], block = blocks[bl];
                fill(x, n, 7 + (uint64_t)(bits * 10 + k * 100 + block), block, k, bits);
                quant_encode(x, NULL, n, bits, block, scales, payload);
                quant_decode(scales, payload, n, bits, block, deq);
                why[0] = 0;
                int ok = check_bounds(x, n, bits, block, scales, payload, deq, &worst, why, sizeof(why));
                snprintf(what, sizeof(what), "quantise INT%d block %d, %s: within the bound", bits, block, kinds[k]);
                if (ok && k == DATA_NORMAL) {
                    ok = worst > 0.9; /* the bound is tight: some element comes near s/2 */
                    if (!ok) snprintf(why, sizeof(why), "worst error only %.3f of s/2: the bound is loose?", worst);
                }
                checkf(ok, what, "%s%sworst |x - deq| = %.4f s/2", why, why[0] ? "; " : "", worst);
                if (bl == 0 && k == DATA_NORMAL) { /* test the tester: 1% past the bound at one element */
                    size_t i = 4321;
                    float s = scales[i / (size_t)block];
                    deq[i] = (float)((double)x[i] + 1.01 * s * (0.5 + quant_qmax(bits) * 0x1p-24));
                    int caught = !check_bounds(x, n, bits, block, scales, payload, deq, &worst, why, sizeof(why));
                    snprintf(what, sizeof(what), "quantise INT%d: a planted error 1%% past the bound is rejected", bits);
                    check(caught, what, why);
                }
            }
    /* round half to even, exact scales: m = 127 (7) gives s = 1 */
    {
        float t8[8] = {127, 2.5f, 3.5f, -2.5f, 0.5f, -0.5f, 1.5f, -126.5f};
        int want8[8] = {127, 2, 4, -2, 0, 0, 2, -126};
        float t4[8] = {7, 2.5f, 3.5f, -2.5f, 0.5f, 1.5f, -1.5f, -6.5f};
        int want4[8] = {7, 2, 4, -2, 0, 2, -2, -6};
        int ok = 1;
        quant_encode(t8, NULL, 8, 8, 8, scales, payload);
        for (int i = 0; i < 8; i++) ok &= quant_get(payload, (size_t)i, 8) == want8[i] && scales[0] == 1.0f;
        quant_encode(t4, NULL, 8, 4, 8, scales, payload);
        for (int i = 0; i < 8; i++) ok &= quant_get(payload, (size_t)i, 4) == want4[i] && scales[0] == 1.0f;
        check(ok, "quantise: round to nearest, half to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0)", "");
    }
    /* near FLT_MAX: the scale is lowered so that 127 s does not overflow */
    {
        float t[4] = {FLT_MAX, -FLT_MAX, 1.0f, 3e38f};
        int ok = 1;
        for (int bits = 8; bits >= 4; bits -= 4) {
            quant_encode(t, NULL, 4, bits, 4, scales, payload);
            quant_decode(scales, payload, 4, bits, 4, deq);
            for (int i = 0; i < 4; i++) ok &= isfinite(deq[i]);
            ok &= check_bounds(t, 4, bits, 4, scales, payload, deq, &worst, why, sizeof(why));
        }
        checkf(ok, "quantise: a block at +-FLT_MAX stays finite and within the bound", "%s", ok ? "" : why);
    }
    /* denormals: the finest (q = +-1 at s = the smallest denormal) and a coarse one (190 / 127 rounds the scale down) */
    {
        float t[4] = {190 * FLT_TRUE_MIN, -50 * FLT_TRUE_MIN, 3 * FLT_TRUE_MIN, FLT_TRUE_MIN};
        float u[2] = {FLT_TRUE_MIN, -FLT_TRUE_MIN};
        int ok = 1;
        for (int bits = 8; bits >= 4; bits -= 4) {
            quant_encode(t, NULL, 4, bits, 4, scales, payload);
            quant_decode(scales, payload, 4, bits, 4, deq);
            ok &= check_bounds(t, 4, bits, 4, scales, payload, deq, &worst, why, sizeof(why));
            ok &= (double)scales[0] * quant_qmax(bits) >= 190 * (double)FLT_TRUE_MIN;
            quant_encode(u, NULL, 2, bits, 2, scales, payload);
            quant_decode(scales, payload, 2, bits, 2, deq);
            ok &= deq[0] == u[0] && deq[1] == u[1] && scales[0] == FLT_TRUE_MIN;
        }
        checkf(ok, "quantise: denormal blocks (coarse scale raised, smallest denormal exact)", "%s", ok ? "" : why);
    }
    /* NaN and Inf: their blocks dequantise to NaN, the others are untouched */
    {
        float t[128];
        fill(t, 128, 5, 32, DATA_NORMAL, 8);
        t[40] = NAN;
        t[64 + 3] = INFINITY;
        t[96 + 31] = -INFINITY;
        int ok = 1;
        for (int bits = 8; bits >= 4; bits -= 4) {
            quant_encode(t, NULL, 128, bits, 32, scales, payload);
            quant_decode(scales, payload, 128, bits, 32, deq);
            for (int i = 0; i < 128; i++) ok &= (i < 32) == !isnan(deq[i]);
            ok &= check_bounds(t, 32, bits, 32, scales, payload, deq, &worst, why, sizeof(why));
            ok &= isnan(scales[1]) && isnan(scales[2]) && isnan(scales[3]);
        }
        check(ok, "quantise: a block holding NaN, +Inf or -Inf dequantises to NaN, only that block", "");
    }
    /* INT4 layout: two codes a byte, low nibble first, two's complement; every code at both parities; odd length */
    {
        float t[31];
        for (int i = 0; i < 31; i++) t[i] = (float)((i * 5) % 15 - 7); /* -7..7, each at even and odd places */
        t[0] = 1.0f;
        t[1] = -1.0f;
        t[2] = -7.0f;
        t[3] = 7.0f;
        int ok = 1;
        quant_encode(t, NULL, 31, 4, 4, scales, payload); /* blocks of 4: every block holds a +-7 or not: scale from its own max */
        ok &= payload[0] == 0xF1 && payload[1] == 0x79 && (payload[15] & 0xF0) == 0;
        quant_decode(scales, payload, 31, 4, 4, deq);
        float s7[30];
        for (int i = 0; i < 30; i++) s7[i] = (float)(i % 15 - 7);
        s7[0] = -7.0f;
        quant_encode(s7, NULL, 30, 4, 30, scales, payload); /* one block, m = 7: s = 1, every code exact */
        quant_decode(scales, payload, 30, 4, 30, deq);
        for (int i = 0; i < 30; i++) ok &= deq[i] == s7[i] && quant_get(payload, (size_t)i, 4) == (int)s7[i];
        uint8_t slot[64];
        memset(slot, 0xAB, sizeof(slot));
        quant_slot_encode(t, NULL, 31, 4, 4, slot); /* 8 scales + 16 payload bytes: 48, no padding; then 5 of INT8 */
        ok &= quant_slot_bytes(31, 4, 4) == 48 && quant_slot_bytes(5, 8, 4) == 16;
        quant_slot_encode(t, NULL, 5, 8, 4, slot);
        ok &= slot[8 + 5] == 0 && slot[8 + 6] == 0 && slot[8 + 7] == 0; /* the padding is zeroed */
        check(ok, "INT4 packing: 0xF1 for (1, -1), 0x79 for (-7, 7), every code round trips at both parities, odd length, slot padding zeroed", "");
    }
    /* error feedback: residual = (x + r) - deq, within the bound */
    {
        size_t m = 4096;
        float* r = (float*)xmalloc(m * sizeof(float));
        fill(x, m, 11, 64, DATA_NORMAL, 4);
        fill(r, m, 12, 64, DATA_NORMAL, 4);
        for (size_t i = 0; i < m; i++) r[i] *= 0.1f;
        float* v = (float*)xmalloc(m * sizeof(float));
        for (size_t i = 0; i < m; i++) v[i] = x[i] + r[i];
        quant_encode(x, r, m, 4, 64, scales, payload);
        quant_decode(scales, payload, m, 4, 64, deq);
        int ok = check_bounds(v, m, 4, 64, scales, payload, deq, &worst, why, sizeof(why));
        for (size_t i = 0; i < m; i++) ok &= r[i] == v[i] - deq[i];
        checkf(ok, "error feedback: x + r quantised, the new residual is exactly (x + r) - deq, within the bound", "%s", ok ? "" : why);
        free(r);
        free(v);
    }
    free(x);
    free(deq);
    free(scales);
    free(payload);
}

/* ---- collectives ---- */
/* R_i (shards per peer at level i) computed here, not by the header */
static size_t span(const int* sizes, int levels, int i) {
    size_t r = 1;
    for (int j = i + 1; j < levels; j++) r *= (size_t)sizes[j];
    return r;
}
static size_t slot_formula(size_t shard, int bits, int block) {
    size_t payload = bits == 8 ? shard : (shard + 1) / 2;
    return 4 * ((shard + (size_t)block - 1) / (size_t)block) + 4 * ((payload + 3) / 4);
}
static int digit(int x, const int* sizes, int i) {
    for (int j = 0; j < i; j++) x /= sizes[j];
    return x % sizes[i];
}
static int with_digit(int x, const int* sizes, int i, int d) {
    int stride = 1;
    for (int j = 0; j < i; j++) stride *= sizes[j];
    return x - digit(x, sizes, i) * stride + d * stride;
}

/* The bound on |qgZ's result - the exact sum| for each block of shard
 * `me`, derived from the inputs alone, hop by hop (gptc/quant.h's header):
 * M bounds a block's |partial sum| held by rank r for shard s, E the
 * quantisation errors in it so far, S the fp32 rounding. At hop i each
 * held block is quantised (scale <= M/qmax (1 + 2^-22) + 2^-149, error <= scale
 * (1/2 + qmax 2^-24)), then the P_i holders that differ in digit i are
 * summed in fp32 (rounding <= (P_i - 1) u sum|deq|). ef: the values
 * quantised carry a residual of at most one quantisation error, so M is
 * taken (1 + 1/qmax) larger, and the adds of the residual round too.
 * eq, es: (blocks of shard me). */
static void qgz_bound(const int* sizes, int levels, float* const* grads, size_t shard, int bits, int block, int ef,
                      int me, double* eq, double* es) {
    int W = 1, qmax = quant_qmax(bits);
    for (int i = 0; i < levels; i++) W *= sizes[i];
    size_t nb = (shard + (size_t)block - 1) / (size_t)block, cells = (size_t)W * (size_t)W * nb;
    double* M = (double*)xmalloc(cells * sizeof(double)); /* [r][s][b] */
    double* E = (double*)calloc(cells, sizeof(double));
    double* S = (double*)calloc(cells, sizeof(double));
    double *M2 = (double*)calloc(cells, sizeof(double)), *E2 = (double*)calloc(cells, sizeof(double)), *S2 = (double*)calloc(cells, sizeof(double));
    CHECK(E && S && M2 && E2 && S2, "out of memory");
    const double u = 0x1p-24;
    for (int r = 0; r < W; r++)
        for (int s = 0; s < W; s++)
            for (size_t b = 0; b < nb; b++) {
                double m = 0;
                for (size_t e = b * (size_t)block; e < (b + 1) * (size_t)block && e < shard; e++)
                    m = fmax(m, fabs((double)grads[r][(size_t)s * shard + e]));
                M[((size_t)r * W + s) * nb + b] = m;
            }
    for (int i = 0; i < levels; i++) {
        /* held at hop i: (r, s) with digits < i of s equal to r's */
        for (int r = 0; r < W; r++)
            for (int s = 0; s < W; s++)
                for (size_t b = 0; b < nb; b++) {
                    size_t c = ((size_t)r * W + s) * nb + b;
                    double m = M[c] * (ef ? 1.0 + 1.0 / qmax : 1.0);
                    double qe = (m / qmax * (1 + 0x1p-22) + FLT_TRUE_MIN) * (0.5 + qmax * u); /* a subnormal scale is raised up to one denormal */
                    E[c] += qe;
                    if (ef) S[c] += 2 * u * (m + qe); /* v = g + r and r = v - deq, each rounded */
                    M[c] = m + qe;                   /* bounds |deq| */
                }
        double g = (sizes[i] - 1) * u * 1.01, g1 = sizes[i] * u * 1.01;
        for (int r = 0; r < W; r++)
            for (int s = 0; s < W; s++) {
                if (digit(s, sizes, i) != digit(r, sizes, i)) continue; /* r receives s at hop i only if it owns digit i */
                for (size_t b = 0; b < nb; b++) {
                    double m = 0, e = 0, sr = 0;
                    for (int q = 0; q < sizes[i]; q++) {
                        size_t c = ((size_t)with_digit(r, sizes, i, q) * W + s) * nb + b;
                        m += M[c];
                        e += E[c];
                        sr += S[c];
                    }
                    size_t c = ((size_t)r * W + s) * nb + b;
                    M2[c] = m * (1 + g1);
                    E2[c] = e;
                    S2[c] = sr + g * m;
                }
            }
        memcpy(M, M2, cells * sizeof(double));
        memcpy(E, E2, cells * sizeof(double));
        memcpy(S, S2, cells * sizeof(double));
    }
    for (size_t b = 0; b < nb; b++) {
        size_t c = ((size_t)me * W + me) * nb + b;
        eq[b] = E[c];
        es[b] = S[c] + 1e-15 * M[c]; /* the fp64 reference's own rounding */
    }
    free(M);
    free(E);
    free(S);
    free(M2);
    free(E2);
    free(S2);
}

/* every element of out within bound (per block) of ref; *worst = max |out - ref| / bound */
static int within(const float* out, const double* ref, const double* bound, size_t shard, int block, double* worst) {
    int ok = 1;
    *worst = 0;
    for (size_t e = 0; e < shard; e++) {
        double err = fabs((double)out[e] - ref[e]), b = bound[e / (size_t)block];
        ok &= err <= b; /* a NaN err fails */
        if (b > 0) *worst = fmax(*worst, err / b);
    }
    return ok;
}

static void test_collectives(const int* sizes, int levels) {
    QuantTopo t;
    quant_topo_split(&t, MPI_COMM_WORLD, levels, sizes);
    int W = t.world, me = t.index, block = 64;
    char name[64];
    int len = 0;
    for (int i = 0; i < levels; i++) len += snprintf(name + len, sizeof(name) - (size_t)len, "%s%d", i ? "x" : "{", sizes[i]);
    snprintf(name + len, sizeof(name) - (size_t)len, "}");
    size_t shards[2] = {1000, 333};
    for (int si = 0; si < 2; si++)
        for (int bits = 8; bits >= 4; bits -= 4) {
            size_t shard = shards[si], n = (size_t)W * shard, slot = slot_formula(shard, bits, block);
            char what[200];
            /* qwZ */
            float* mine = (float*)xmalloc(shard * sizeof(float));
            float* full = (float*)xmalloc(n * sizeof(float));
            float* expect = (float*)xmalloc(n * sizeof(float));
            float* sc = (float*)xmalloc(shard * sizeof(float));
            uint8_t* pl = (uint8_t*)xmalloc(shard);
            fill(mine, shard, 1000 + (uint64_t)me, block, DATA_ADVERSARIAL, bits);
            if (me == W - 1) mine[70] = NAN; /* its block (the second) is NaN everywhere */
            uint64_t before[QUANT_MAX_LEVELS];
            memcpy(before, t.sent, sizeof(before));
            qwz_allgather(&t, mine, shard, bits, block, full);
            for (int s = 0; s < W; s++) {
                fill(mine, shard, 1000 + (uint64_t)s, block, DATA_ADVERSARIAL, bits);
                if (s == W - 1) mine[70] = NAN;
                quant_encode(mine, NULL, shard, bits, block, sc, pl);
                quant_decode(sc, pl, shard, bits, block, expect + (size_t)s * shard);
            }
            int same = memcmp(full, expect, n * sizeof(float)) == 0;
            int bytes_ok = 1;
            for (int i = 0; i < levels; i++)
                bytes_ok &= t.sent[i] - before[i] == (uint64_t)(sizes[i] - 1) * span(sizes, levels, i) * slot;
            snprintf(what, sizeof(what), "qwZ %s INT%d shard %zu: every rank's full buffer is deq(q(shard)) bit for bit", name, bits, shard);
            check_all(same, what, "W = %d", W);
            expect[(size_t)(W - 1) * shard + 5] = nextafterf(expect[(size_t)(W - 1) * shard + 5], INFINITY); /* planted: one ulp */
            check_all(memcmp(full, expect, n * sizeof(float)) != 0, "qwZ: a planted one-ulp difference is rejected", "%s", "");
            snprintf(what, sizeof(what), "qwZ %s INT%d shard %zu: bytes sent per level = (P_i - 1) R_i slot, slot %zu", name, bits, shard, slot);
            check_all(bytes_ok, what, "level 0: %llu", (unsigned long long)(t.sent[0] - before[0]));
            /* hpZ: node = level 0 */
            int L = sizes[0], N = W / L;
            float* sec = (float*)xmalloc((size_t)N * shard * sizeof(float));
            float* full2 = (float*)xmalloc(n * sizeof(float));
            uint64_t node_sent = 0;
            hpz_secondary_from_full(t.comm[0], full, shard, W, sec);
            hpz_allgather(t.comm[0], sec, shard, W, full2, &node_sent);
            snprintf(what, sizeof(what), "hpZ %s shard %zu: the node-only gather of the secondary shards is the qwZ result bit for bit", name, shard);
            check_all(memcmp(full, full2, n * sizeof(float)) == 0 && node_sent == (uint64_t)(L - 1) * N * shard * 4, what,
                      "node bytes %llu = (L - 1) N shard 4", (unsigned long long)node_sent);
            /* qgZ against fp64, within the derived bound */
            float** grads = (float**)xmalloc((size_t)W * sizeof(float*));
            for (int r = 0; r < W; r++) {
                grads[r] = (float*)xmalloc(n * sizeof(float));
                fill(grads[r], n, 5000 + (uint64_t)r * 7 + (uint64_t)bits, block, DATA_ADVERSARIAL, bits);
            }
            double* ref = (double*)xmalloc(shard * sizeof(double));
            for (size_t e = 0; e < shard; e++) {
                ref[e] = 0;
                for (int r = 0; r < W; r++) ref[e] += grads[r][(size_t)me * shard + e];
            }
            size_t nb = (shard + (size_t)block - 1) / (size_t)block;
            double *eq = (double*)xmalloc(nb * sizeof(double)), *es = (double*)xmalloc(nb * sizeof(double));
            double* bound = (double*)xmalloc(nb * sizeof(double));
            qgz_bound(sizes, levels, grads, shard, bits, block, 0, me, eq, es);
            for (size_t b = 0; b < nb; b++) bound[b] = eq[b] + es[b];
            float* out = (float*)xmalloc(shard * sizeof(float));
            memcpy(before, t.sent, sizeof(before));
            qgz_reduce_scatter(&t, grads[me], shard, bits, block, NULL, out);
            double worst;
            int ok = within(out, ref, bound, shard, block, &worst);
            snprintf(what, sizeof(what), "qgZ %s INT%d shard %zu: |result - fp64 sum| within the bound derived over %d hops", name, bits, shard, levels);
            check_all(ok, what, "worst error / bound %.3f", max_all(worst));
            bytes_ok = 1;
            for (int i = 0; i < levels; i++)
                bytes_ok &= t.sent[i] - before[i] == (uint64_t)(sizes[i] - 1) * span(sizes, levels, i) * slot;
            snprintf(what, sizeof(what), "qgZ %s INT%d shard %zu: bytes sent per level = (P_i - 1) R_i slot", name, bits, shard);
            check_all(bytes_ok, what, "outermost level: %llu", (unsigned long long)(t.sent[levels - 1] - before[levels - 1]));
            out[shard / 2] = (float)(ref[shard / 2] + 2 * bound[shard / 2 / (size_t)block] + 1e-30);
            check_all(!within(out, ref, bound, shard, block, &worst), "qgZ: a planted answer 2 bounds off is rejected", "%s", "");
            /* a NaN in rank W-1's gradient, in shard 0's block 1: that block of shard 0 is NaN, nothing else */
            if (me == W - 1) grads[me][70] = NAN;
            qgz_reduce_scatter(&t, grads[me], shard, bits, block, NULL, out);
            int nan_ok = 1;
            for (size_t e = 0; e < shard; e++) nan_ok &= isnan(out[e]) == (me == 0 && e / (size_t)block == 1);
            check_all(nan_ok, "qgZ: a NaN in one rank's block makes that block of the result NaN, only it", "%s", "");
            /* error feedback over K steps */
            int K = 16;
            size_t rf = qgz_residual_floats(&t, shard);
            float* res = (float*)calloc(rf, sizeof(float));
            CHECK(res, "out of memory");
            for (int r = 0; r < W; r++) fill(grads[r], n, 9000 + (uint64_t)r, block, DATA_EF, bits);
            for (size_t e = 0; e < shard; e++) {
                ref[e] = 0;
                for (int r = 0; r < W; r++) ref[e] += grads[r][(size_t)me * shard + e];
            }
            double* acc = (double*)calloc(shard, sizeof(double));
            double* acc0 = (double*)calloc(shard, sizeof(double));
            CHECK(acc && acc0, "out of memory");
            for (int k = 0; k < K; k++) {
                qgz_reduce_scatter(&t, grads[me], shard, bits, block, res, out);
                for (size_t e = 0; e < shard; e++) acc[e] += out[e];
                qgz_reduce_scatter(&t, grads[me], shard, bits, block, NULL, out);
                for (size_t e = 0; e < shard; e++) acc0[e] += out[e];
            }
            qgz_bound(sizes, levels, grads, shard, bits, block, 1, me, eq, es);
            for (size_t b = 0; b < nb; b++) bound[b] = eq[b] + K * es[b];
            double worst_ef = 0, worst_no = 0;
            int ef_ok = 1, no_out = 0;
            for (size_t e = 0; e < shard; e++) {
                double b = bound[e / (size_t)block];
                double d1 = fabs(acc[e] - K * ref[e]), d0 = fabs(acc0[e] - K * ref[e]);
                ef_ok &= d1 <= b;
                no_out |= d0 > b;
                worst_ef = fmax(worst_ef, d1 / b);
                worst_no = fmax(worst_no, d0 / b);
            }
            snprintf(what, sizeof(what), "qgZ %s INT%d shard %zu: error feedback, %d steps: sum of results within one step's error of the true sum", name, bits, shard, K);
            check_all(ef_ok, what, "worst %.3f of the bound; without feedback %.1f of it", max_all(worst_ef), max_all(worst_no));
            int any_out = no_out;
            MPI_CHECK(MPI_Allreduce(&no_out, &any_out, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD));
            check_all(any_out, "qgZ: the same steps without error feedback drift outside that bound (the check can fail)", "%s", "");
            free(acc);
            free(acc0);
            free(res);
            free(out);
            free(bound);
            free(eq);
            free(es);
            free(ref);
            for (int r = 0; r < W; r++) free(grads[r]);
            free(grads);
            free(sec);
            free(full2);
            free(mine);
            free(full);
            free(expect);
            free(sc);
            free(pl);
        }
    quant_topo_free(&t);
}

/* --bench: quant_encode + quant_decode rates on 2^24 floats, 1 thread and
 * all threads (is the OpenMP worth it?), with the load average */
static void bench(void) {
    size_t n = (size_t)1 << 24;
    float* x = (float*)xmalloc(n * sizeof(float));
    float* y = (float*)xmalloc(n * sizeof(float));
    float* sc = (float*)xmalloc(n / 64 * sizeof(float) + 64);
    uint8_t* pl = (uint8_t*)xmalloc(n);
    fill(x, n, 3, 2048, DATA_NORMAL, 8);
    double load[3] = {0, 0, 0};
    CHECK(getloadavg(load, 3) == 3, "getloadavg failed");
    printf("load average %.2f; %zu floats, blocks of 2048; GB/s of fp32 in (encode) and out (decode), best of 5\n", load[0], n);
#ifdef _OPENMP
    int all = omp_get_max_threads();
#else
    int all = 1;
#endif
    for (int bits = 8; bits >= 4; bits -= 4)
        for (int th = 1; th <= all; th = th == all ? all + 1 : all) {
#ifdef _OPENMP
            omp_set_num_threads(th);
#endif
            double best_e = 1e30, best_d = 1e30;
            for (int r = 0; r < 5; r++) {
                double t0 = MPI_Wtime();
                quant_encode(x, NULL, n, bits, 2048, sc, pl);
                double t1 = MPI_Wtime();
                quant_decode(sc, pl, n, bits, 2048, y);
                double t2 = MPI_Wtime();
                best_e = fmin(best_e, t1 - t0);
                best_d = fmin(best_d, t2 - t1);
            }
            printf("INT%d, %d thread%s: encode %.2f GB/s, decode %.2f GB/s\n", bits, th, th > 1 ? "s" : "",
                   n * 4.0 / best_e / 1e9, n * 4.0 / best_d / 1e9);
        }
    free(x);
    free(y);
    free(sc);
    free(pl);
}

int main(int argc, char** argv) {
    MPI_CHECK(MPI_Init(&argc, &argv));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_world));
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        if (g_rank == 0) bench();
        MPI_CHECK(MPI_Finalize());
        return 0;
    }
    double t0 = MPI_Wtime();
    if (g_rank == 0) test_quantise_local();
    int layouts[][4] = {{1, 0, 0, 0}, {2, 0, 0, 0}, {1, 2, 0, 0}, {4, 0, 0, 0}, {2, 2, 0, 0}, {2, 1, 2, 0}};
    int nlevels[] = {1, 1, 2, 1, 2, 3};
    for (int l = 0; l < 6; l++) {
        int prod = 1;
        for (int i = 0; i < nlevels[l]; i++) prod *= layouts[l][i];
        if (prod == g_world) test_collectives(layouts[l], nlevels[l]);
    }
    int failed = tests_failed;
    MPI_CHECK(MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (g_rank == 0) {
        printf("test_quant: %d ranks, %.1f s\n", g_world, MPI_Wtime() - t0);
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
    }
    MPI_CHECK(MPI_Finalize());
    return failed ? 1 : 0;
}
