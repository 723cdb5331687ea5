// test_cublaslt.cpp — the self-test of the CPU layer's cuBLASLt stand-in
// (cublaslt.cpp), against a float64 reference written here.
//
//   make test-cublaslt-cpu   builds it with cublaslt.cpp and device_stub.cpp, and runs it (well under a second)
//
// One line per check, then "N passed, N failed"; exit status 1 on a failure.
// Checks, in order:
//   1. random problems: every epilogue, bf16 and fp32 outputs, transposes,
//      ld > rows, batches with strides, alpha/beta, C in place or apart
//      (beta == 0: C is NaN poison and must not be read); D's padding and
//      everything past it untouched; the declared ranges
//   2. the shapes train_gpt.cu's lt_matmul uses (forward, backward, attention)
//   3. refusals as the real library refuses (each with the doc's reason)
//   4. invalid arguments: CUBLAS_STATUS_INVALID_VALUE (or NOT_INITIALIZED)
//   5. descriptors are read when cublasLtMatmul is called: a queued matmul
//      whose descriptor is then changed or destroyed computes what it was given
//   6. the checker itself: planted wrong references must be rejected
// Tolerance (every output): |got - ref| <= E + 1 ulp of the output type at |ref| + E,
// E = the fp32 error bound (k + 4) 2^-24 (|alpha| sum|a b| + |beta c| + |bias|),
// carried through GELU (|gelu'| <= 1.13) and dGELU (times |gelu'(aux)|), plus
// 1e-6 |x| for the fp32 evaluation of tanh. That is tight enough to tell the
// tanh GELU from the erf GELU in fp32 (checked in 5).
#include <cublasLt.h>   // the API under test (CUDA's own header)
#include <cuda_bf16.h>  // __nv_bfloat16 and its conversions

#include "device.h"  // defines: Range

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace cuda_cpu {  // device_stub.cpp
void* stub_device_alloc(size_t bytes);
void stub_device_free(void* p);
extern std::vector<Range> stub_last_ranges;
extern bool stub_defer;
int stub_run_deferred();
}  // namespace cuda_cpu
using cuda_cpu::stub_device_alloc;
using cuda_cpu::stub_device_free;
using cuda_cpu::Range;

/* ------------------------------------------------------------------------ */
/* Checks and random numbers                                                */
/* ------------------------------------------------------------------------ */
static int n_passed = 0, n_failed = 0;

static bool check(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static bool check(bool ok, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    (ok ? n_passed : n_failed)++;
    return ok;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static int rng_int(int lo, int hi) { return lo + (int)(rng_u32() % (uint32_t)(hi - lo + 1)); }
static float rng_float(float lo, float hi) { return lo + (hi - lo) * (float)(rng_u32() & 0xFFFFFF) / 16777216.0f; }

/* ------------------------------------------------------------------------ */
/* Element access and the tolerance                                         */
/* ------------------------------------------------------------------------ */
static size_t es_of(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

static double get(const void* base, cudaDataType t, int64_t i) {
    if (t == CUDA_R_16BF) return (double)__bfloat162float(((const __nv_bfloat16*)base)[i]);
    return (double)((const float*)base)[i];
}
static void put(void* base, cudaDataType t, int64_t i, float v) {
    if (t == CUDA_R_16BF) ((__nv_bfloat16*)base)[i] = __float2bfloat16(v);
    else ((float*)base)[i] = v;
}

// One unit in the last place of type t at magnitude v (bf16: 8 significant bits, fp32: 24).
static double ulp(cudaDataType t, double v) {
    v = fabs(v);
    if (v < 1e-30) v = 1e-30;
    int e = (int)floor(log2(v));
    return ldexp(1.0, e - (t == CUDA_R_16BF ? 7 : 23));
}

// The checker every output goes through (and what section 5 plants errors into).
static bool close_enough(double got, double ref, double err, cudaDataType t) {
    if (!std::isfinite(got)) return false;
    return fabs(got - ref) <= err + ulp(t, fabs(ref) + err);
}

static double gelu_ref(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad_ref(double x) {
    double s = sqrt(2.0 / M_PI), t = tanh(s * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

/* ------------------------------------------------------------------------ */
/* A problem: its shape, its device buffers, its descriptors                */
/* ------------------------------------------------------------------------ */
struct Case {
    int m, n, k, batch = 1;
    bool ta = false, tb = false;
    int64_t lda, ldb, ldc, ldd, sa = 0, sb = 0, sc = 0, sd = 0;
    cudaDataType dt = CUDA_R_16BF;  // C and D
    cudaDataType abt = CUDA_R_16BF;
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    float alpha = 1.0f, beta = 0.0f;
    bool in_place = false;  // C == D
    int64_t aux_ld = 0, aux_stride = 0;
};

static bool epi_has_bias_in(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static bool epi_has_gelu(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU || e == CUBLASLT_EPILOGUE_GELU_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX ||
           e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static bool epi_aux_out(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static bool epi_dgelu(cublasLtEpilogue_t e) { return e == CUBLASLT_EPILOGUE_DGELU || e == CUBLASLT_EPILOGUE_DGELU_BGRAD; }
static bool epi_bias_out(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_DGELU_BGRAD || e == CUBLASLT_EPILOGUE_BGRADA || e == CUBLASLT_EPILOGUE_BGRADB;
}
static const char* epi_name(cublasLtEpilogue_t e) {
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADA: return "BGRADA";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "other";
    }
}

// Elements from a matrix's first to one past its last, over the batch.
static int64_t extent(int64_t rows, int64_t cols, int64_t ld, int batch, int64_t stride) {
    return (int64_t)(batch - 1) * stride + (cols - 1) * ld + rows;
}

struct Run {
    Case c;
    int64_t ar, ac, br, bc;  // stored shapes of A and B
    void *A, *B, *C, *D, *bias = nullptr, *aux = nullptr, *ws;
    size_t ws_bytes = 1 << 16;
    std::vector<unsigned char> c_copy, aux_copy;  // inputs as given (C; aux for DGELU)
    std::vector<void*> owned;                     // what run_alloc allocated (tweaks may move the pointers)
    cublasLtHandle_t handle;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatmulPreference_t pref;
};

static size_t d_elems(const Case& c) { return (size_t)extent(c.m, c.n, c.ldd, c.batch, c.sd); }

// Device buffers (exactly as large as the matrices: overruns are caught) with random inputs.
static void run_alloc(Run* r) {
    Case& c = r->c;
    r->ar = c.ta ? c.k : c.m;
    r->ac = c.ta ? c.m : c.k;
    r->br = c.tb ? c.n : c.k;
    r->bc = c.tb ? c.k : c.n;
    size_t abe = es_of(c.abt), de = es_of(c.dt);
    int64_t na = extent(r->ar, r->ac, c.lda, c.batch, c.sa), nb = extent(r->br, r->bc, c.ldb, c.batch, c.sb);
    r->A = stub_device_alloc(na * abe);
    r->B = stub_device_alloc(nb * abe);
    for (int64_t i = 0; i < na; i++) put(r->A, c.abt, i, rng_float(-1, 1));
    for (int64_t i = 0; i < nb; i++) put(r->B, c.abt, i, rng_float(-1, 1));
    r->D = stub_device_alloc(d_elems(c) * de);  // poison (NaN) until written
    if (c.in_place) {
        r->C = r->D;
        for (size_t i = 0; i < d_elems(c); i++) put(r->D, c.dt, i, rng_float(-1, 1));
    } else {
        size_t nc = (size_t)extent(c.m, c.n, c.ldc, c.batch, c.sc);
        r->C = stub_device_alloc(nc * de);  // beta == 0: stays NaN poison, which must not reach D
        if (c.beta != 0.0f)
            for (size_t i = 0; i < nc; i++) put(r->C, c.dt, i, rng_float(-1, 1));
    }
    size_t ncc = c.in_place ? d_elems(c) : (size_t)extent(c.m, c.n, c.ldc, c.batch, c.sc);
    r->c_copy.assign((unsigned char*)r->C, (unsigned char*)r->C + ncc * de);
    if (epi_has_bias_in(c.epi) || epi_bias_out(c.epi)) {
        int len = c.epi == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m;
        r->bias = stub_device_alloc(len * de);
        if (epi_has_bias_in(c.epi))
            for (int i = 0; i < len; i++) put(r->bias, c.dt, i, rng_float(-1, 1));
    }
    if (epi_aux_out(c.epi) || epi_dgelu(c.epi)) {
        size_t naux = (size_t)extent(c.m, c.n, c.aux_ld, c.batch, c.aux_stride);
        r->aux = stub_device_alloc(naux * de);
        if (epi_dgelu(c.epi))
            for (size_t i = 0; i < naux; i++) put(r->aux, c.dt, i, rng_float(-3, 3));
        r->aux_copy.assign((unsigned char*)r->aux, (unsigned char*)r->aux + naux * de);
    }
    r->ws = stub_device_alloc(r->ws_bytes);
    void* ps[] = {r->A, r->B, c.in_place ? nullptr : r->C, r->D, r->bias, r->aux, r->ws};
    for (void* p : ps)
        if (p) r->owned.push_back(p);
}

static void run_free(Run* r) {
    for (void* p : r->owned) stub_device_free(p);
}

// The largest power of two (<= 256) dividing p, as train_gpt.cu's ptr_alignment.
static uint32_t align_of(const void* p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a /= 2;
    return a;
}

// Descriptors for the run, as train_gpt.cu's lt_matmul builds them.
static void run_describe(Run* r) {
    Case& c = r->c;
    cublasLtCreate(&r->handle);
    cublasLtMatmulDescCreate(&r->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
    cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
    cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof(c.epi));
    if (r->bias) cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &r->bias, sizeof(void*));
    if (r->aux) {
        cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &r->aux, sizeof(void*));
        cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c.aux_ld, 8);
        if (c.batch > 1)
            cublasLtMatmulDescSetAttribute(r->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, &c.aux_stride, 8);
    }
    cublasLtMatrixLayoutCreate(&r->la, c.abt, r->ar, r->ac, c.lda);
    cublasLtMatrixLayoutCreate(&r->lb, c.abt, r->br, r->bc, c.ldb);
    cublasLtMatrixLayoutCreate(&r->lc, c.dt, c.m, c.n, c.in_place ? c.ldd : c.ldc);
    cublasLtMatrixLayoutCreate(&r->ld, c.dt, c.m, c.n, c.ldd);
    if (c.batch > 1) {
        cublasLtMatrixLayout_t ls[] = {r->la, r->lb, r->lc, r->ld};
        int64_t ss[] = {c.sa, c.sb, c.in_place ? c.sd : c.sc, c.sd};
        for (int i = 0; i < 4; i++) {
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c.batch, 4);
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &ss[i], 8);
        }
    }
    cublasLtMatmulPreferenceCreate(&r->pref);
    uint64_t ws = r->ws_bytes;
    cublasLtMatmulPreferenceSetAttribute(r->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, 8);
    uint32_t al[4] = {align_of(r->A), align_of(r->B), align_of(r->C), align_of(r->D)};
    cublasLtMatmulPreferenceSetAttribute(r->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4);
    cublasLtMatmulPreferenceSetAttribute(r->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4);
    cublasLtMatmulPreferenceSetAttribute(r->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4);
    cublasLtMatmulPreferenceSetAttribute(r->pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4);
}

static void run_undescribe(Run* r) {
    cublasLtMatmulPreferenceDestroy(r->pref);
    cublasLtMatrixLayoutDestroy(r->la);
    cublasLtMatrixLayoutDestroy(r->lb);
    cublasLtMatrixLayoutDestroy(r->lc);
    cublasLtMatrixLayoutDestroy(r->ld);
    cublasLtMatmulDescDestroy(r->desc);
    cublasLtDestroy(r->handle);
}

// Heuristic then matmul; the statuses, the number of algorithms found.
struct Outcome {
    cublasStatus_t heuristic, matmul;
    int found;
};
static Outcome run_call(Run* r) {
    Outcome o{};
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    o.heuristic = cublasLtMatmulAlgoGetHeuristic(r->handle, r->desc, r->la, r->lb, r->lc, r->ld, r->pref, 1, &res,
                                                 &o.found);
    o.matmul = CUBLAS_STATUS_NOT_SUPPORTED;
    if (o.heuristic == CUBLAS_STATUS_SUCCESS && o.found > 0)
        o.matmul = cublasLtMatmul(r->handle, r->desc, &r->c.alpha, r->A, r->la, r->B, r->lb, &r->c.beta, r->C, r->lc,
                                  r->D, r->ld, &res.algo, r->ws, r->ws_bytes, nullptr);
    return o;
}

/* ------------------------------------------------------------------------ */
/* The float64 reference and the comparison                                 */
/* ------------------------------------------------------------------------ */
// Each output value's reference and error bound.
struct Expect {
    std::vector<double> d, d_err, aux, aux_err, bias, bias_err;
};

static void reference(const Run& r, Expect* x) {
    const Case& c = r.c;
    const double u = ldexp(1.0, -24);
    size_t nd = (size_t)c.batch * c.m * c.n;
    x->d.assign(nd, 0);
    x->d_err.assign(nd, 0);
    x->aux.assign(nd, 0);
    x->aux_err.assign(nd, 0);
    int blen = c.epi == CUBLASLT_EPILOGUE_BGRADB ? c.n : c.m;
    x->bias.assign(blen, 0);
    x->bias_err.assign(blen, 0);
    const void* C = r.c_copy.data();
    int64_t ldc = c.in_place ? c.ldd : c.ldc, sc = c.in_place ? c.sd : c.sc;
    auto opa = [&](int bt, int i, int l) {
        return get(r.A, c.abt, bt * c.sa + (c.ta ? l + (int64_t)i * c.lda : i + (int64_t)l * c.lda));
    };
    auto opb = [&](int bt, int l, int j) {
        return get(r.B, c.abt, bt * c.sb + (c.tb ? j + (int64_t)l * c.ldb : l + (int64_t)j * c.ldb));
    };
    for (int bt = 0; bt < c.batch; bt++)
        for (int j = 0; j < c.n; j++)
            for (int i = 0; i < c.m; i++) {
                double acc = 0, mag = 0;
                for (int l = 0; l < c.k; l++) {
                    double p = opa(bt, i, l) * opb(bt, l, j);
                    acc += p;
                    mag += fabs(p);
                }
                double v = c.alpha * acc;
                double s = fabs(c.alpha) * mag;
                if (c.beta != 0.0f) {
                    double cv = c.beta * get(C, c.dt, bt * sc + i + (int64_t)j * ldc);
                    v += cv;
                    s += fabs(cv);
                }
                if (epi_has_bias_in(c.epi)) {
                    double b = get(r.bias, c.dt, i);
                    v += b;
                    s += fabs(b);
                }
                double e = (c.k + 4) * u * s + 1e-30;
                size_t at = ((size_t)bt * c.n + j) * c.m + i;
                x->aux[at] = v;
                x->aux_err[at] = e;
                double y = v, ey = e;
                if (epi_has_gelu(c.epi)) {
                    y = gelu_ref(v);
                    ey = 1.13 * e + 1e-6 * fabs(v);
                }
                if (epi_dgelu(c.epi)) {
                    double g = gelu_grad_ref(get(r.aux_copy.data(), c.dt, bt * c.aux_stride + i + (int64_t)j * c.aux_ld));
                    y = v * g;
                    ey = e * fabs(g) + 1e-6 * fabs(v);
                }
                x->d[at] = y;
                x->d_err[at] = ey;
                if (c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
                    x->bias[i] += y;
                    x->bias_err[i] += ey + (c.n + 2) * u * fabs(y) + ulp(c.dt, fabs(y));  // (D rounded or not)
                }
            }
    if (c.epi == CUBLASLT_EPILOGUE_BGRADA || c.epi == CUBLASLT_EPILOGUE_BGRADB)
        for (int t = 0; t < blen; t++) {
            double s = 0, mag = 0;
            for (int l = 0; l < c.k; l++) {
                double v = c.epi == CUBLASLT_EPILOGUE_BGRADA ? opa(0, t, l) : opb(0, l, t);
                s += v;
                mag += fabs(v);
            }
            x->bias[t] = s;
            x->bias_err[t] = (c.k + 2) * u * mag;
        }
}

// Every output against its reference; D's padding rows and anything between batch members untouched (NaN poison).
static bool compare(const Run& r, const Expect& x, std::string* why) {
    const Case& c = r.c;
    char buf[256];
    std::vector<bool> owned(d_elems(c), false);
    for (int bt = 0; bt < c.batch; bt++)
        for (int j = 0; j < c.n; j++)
            for (int i = 0; i < c.m; i++) {
                size_t at = ((size_t)bt * c.n + j) * c.m + i;
                int64_t di = bt * c.sd + i + (int64_t)j * c.ldd;
                owned[(size_t)di] = true;
                double got = get(r.D, c.dt, di);
                if (!close_enough(got, x.d[at], x.d_err[at], c.dt)) {
                    snprintf(buf, sizeof(buf), "D[%d](%d,%d) = %.9g, expected %.9g +- %.3g", bt, i, j, got, x.d[at],
                             x.d_err[at]);
                    *why = buf;
                    return false;
                }
                if (epi_aux_out(c.epi)) {
                    double ga = get(r.aux, c.dt, bt * c.aux_stride + i + (int64_t)j * c.aux_ld);
                    if (!close_enough(ga, x.aux[at], x.aux_err[at], c.dt)) {
                        snprintf(buf, sizeof(buf), "aux[%d](%d,%d) = %.9g, expected %.9g", bt, i, j, ga, x.aux[at]);
                        *why = buf;
                        return false;
                    }
                }
            }
    if (!c.in_place)
        for (size_t i = 0; i < owned.size(); i++)
            if (!owned[i] && !std::isnan(get(r.D, c.dt, (int64_t)i))) {
                snprintf(buf, sizeof(buf), "D element %zu outside the matrix was written", i);
                *why = buf;
                return false;
            }
    if (epi_bias_out(c.epi))
        for (size_t t = 0; t < x.bias.size(); t++) {
            double got = get(r.bias, c.dt, (int64_t)t);
            if (!close_enough(got, x.bias[t], x.bias_err[t], c.dt)) {
                snprintf(buf, sizeof(buf), "bias gradient[%zu] = %.9g, expected %.9g +- %.3g", t, got, x.bias[t],
                         x.bias_err[t]);
                *why = buf;
                return false;
            }
        }
    return true;
}

// The ranges the matmul declared: D written per batch member as (n runs of m
// elements, ldd apart); C not read when beta == 0; aux written by GELU_AUX*,
// read by DGELU*; the bias gradient written.
static bool ranges_ok(const Run& r, std::string* why) {
    const Case& c = r.c;
    size_t de = es_of(c.dt);
    auto inside = [](const Range& g, const void* base, size_t bytes) {
        return (const char*)g.p >= (const char*)base && (const char*)g.p < (const char*)base + bytes;
    };
    int d_writes = 0, c_reads = 0, aux_reads = 0, aux_writes = 0, bias_writes = 0;
    size_t c_bytes = r.c_copy.size(), aux_bytes = r.aux_copy.size();
    for (const Range& g : cuda_cpu::stub_last_ranges) {
        if (inside(g, r.D, d_elems(c) * de) && g.write) {
            d_writes++;
            if (g.bytes != c.m * de || g.rows != (size_t)c.n || g.stride != c.ldd * de) {
                *why = "a D range has the wrong shape";
                return false;
            }
        }
        if (!c.in_place && inside(g, r.C, c_bytes) && !g.write) c_reads++;
        if (r.aux && inside(g, r.aux, aux_bytes)) (g.write ? aux_writes : aux_reads)++;
        if (r.bias && g.p == r.bias && g.write) bias_writes++;
    }
    if (d_writes != c.batch) return *why = "D is not declared written once per batch member", false;
    if (!c.in_place && (c.beta == 0.0f) != (c_reads == 0)) return *why = "C is declared read iff beta != 0: no", false;
    if (epi_aux_out(c.epi) && (aux_writes != c.batch || aux_reads)) return *why = "aux not declared written", false;
    if (epi_dgelu(c.epi) && (aux_reads != c.batch || aux_writes)) return *why = "aux not declared read", false;
    if (epi_bias_out(c.epi) != (bias_writes == 1)) return *why = "bias gradient not declared written", false;
    return true;
}

static std::string case_describe(const Case& c) {
    char buf[256];
    snprintf(buf, sizeof(buf), "%s %s m=%d n=%d k=%d %c%c batch=%d ld=%lld/%lld/%lld/%lld alpha=%.3g beta=%.3g%s",
             epi_name(c.epi), c.dt == CUDA_R_16BF ? "bf16" : "fp32", c.m, c.n, c.k, c.ta ? 'T' : 'N',
             c.tb ? 'T' : 'N', c.batch, (long long)c.lda, (long long)c.ldb, (long long)c.ldc, (long long)c.ldd,
             c.alpha, c.beta, c.in_place ? " in-place" : "");
    return buf;
}

// Runs a case end to end and checks it (one line).
static void case_check(const Case& c0, const char* label) {
    Run r{};
    r.c = c0;
    run_alloc(&r);
    run_describe(&r);
    Outcome o = run_call(&r);
    std::string why;
    bool ok = o.heuristic == CUBLAS_STATUS_SUCCESS && o.found == 1 && o.matmul == CUBLAS_STATUS_SUCCESS;
    if (!ok) why = std::string("heuristic ") + cublasLtGetStatusName(o.heuristic) + ", matmul " +
                   cublasLtGetStatusName(o.matmul);
    if (ok) {
        Expect x;
        reference(r, &x);
        ok = compare(r, x, &why) && ranges_ok(r, &why);
    }
    check(ok, "%s: %s%s%s", label, case_describe(c0).c_str(), ok ? "" : ": ", why.c_str());
    run_undescribe(&r);
    run_free(&r);
}

/* ------------------------------------------------------------------------ */
/* 1. Random problems                                                       */
/* ------------------------------------------------------------------------ */
static const cublasLtEpilogue_t ALL_EPILOGUES[] = {
    CUBLASLT_EPILOGUE_DEFAULT,  CUBLASLT_EPILOGUE_BIAS,          CUBLASLT_EPILOGUE_GELU,
    CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,     CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
    CUBLASLT_EPILOGUE_DGELU,    CUBLASLT_EPILOGUE_DGELU_BGRAD,   CUBLASLT_EPILOGUE_BGRADA,
    CUBLASLT_EPILOGUE_BGRADB};

static Case case_random(cublasLtEpilogue_t epi, cudaDataType dt) {
    Case c;
    c.epi = epi;
    c.dt = dt;
    c.m = rng_int(1, 37);
    c.n = rng_int(1, 29);
    c.k = rng_int(1, 45);
    c.ta = rng_u32() & 1;
    c.tb = rng_u32() & 1;
    bool bgrad = epi_bias_out(epi);
    c.batch = bgrad ? 1 : rng_int(1, 3);
    c.lda = (c.ta ? c.k : c.m) + rng_int(0, 3);
    c.ldb = (c.tb ? c.n : c.k) + rng_int(0, 3);
    c.ldd = c.m + rng_int(0, 3);
    c.ldc = c.m + rng_int(0, 2);
    c.alpha = rng_int(0, 1) ? 1.0f : rng_float(-2, 2);
    c.beta = rng_int(0, 2) == 0 ? 0.0f : rng_int(0, 1) ? 1.0f : rng_float(-1, 1);
    c.in_place = c.beta != 0.0f && (rng_u32() & 1);
    c.sa = (c.ta ? c.m : c.k) * c.lda + rng_int(0, 5);
    c.sb = (c.tb ? c.k : c.n) * c.ldb + rng_int(0, 5);
    c.sc = c.n * c.ldc + rng_int(0, 5);
    c.sd = c.n * c.ldd + rng_int(0, 5);
    c.aux_ld = (c.m + 7) / 8 * 8 + 8 * rng_int(0, 1);  // divisible by 8 (the documented rule)
    c.aux_stride = c.aux_ld * c.n + 8 * rng_int(0, 2);
    return c;
}

static void test_random() {
    int i = 0;
    for (cublasLtEpilogue_t epi : ALL_EPILOGUES)
        for (cudaDataType dt : {CUDA_R_16BF, CUDA_R_32F})
            for (int rep = 0; rep < 3; rep++) {
                char label[64];
                snprintf(label, sizeof(label), "random %d", ++i);
                case_check(case_random(epi, dt), label);
            }
}

/* ------------------------------------------------------------------------ */
/* 2. The shapes train_gpt.cu uses (lt_matmul's calls, tiny GPT: C = 36, NH = 3, T = 8, B = 2) */
/* ------------------------------------------------------------------------ */
static Case case_project(int m, int n, int k, bool ta, bool tb, int lda, int ldb, int ldd, cudaDataType dt,
                         float alpha, float beta, cublasLtEpilogue_t epi) {
    Case c;
    c.m = m;
    c.n = n;
    c.k = k;
    c.ta = ta;
    c.tb = tb;
    c.lda = lda;
    c.ldb = ldb;
    c.ldc = c.ldd = ldd;
    c.dt = dt;
    c.alpha = alpha;
    c.beta = beta;
    c.epi = epi;
    c.in_place = beta != 0.0f;  // lt_matmul passes C = D (the residual or dweight)
    c.aux_ld = m;
    return c;
}

static void test_project_shapes() {
    const int C = 36, N = 16, NH = 3, T = 8, hs = C / NH;
    // matmul_forward_gpu: out(N, OC) = inp . weight^T + bias [+ residual], GELU_AUX_BIAS for fc
    case_check(case_project(3 * C, N, C, true, false, C, C, 3 * C, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_BIAS),
               "train_gpt qkv forward");
    case_check(case_project(C, N, C, true, false, C, C, C, CUDA_R_16BF, 1, 1, CUBLASLT_EPILOGUE_BIAS),
               "train_gpt attproj forward + residual");
    case_check(case_project(4 * C, N, C, true, false, C, C, 4 * C, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_GELU_AUX_BIAS),
               "train_gpt fc forward");
    case_check(case_project(4 * C, N, C, true, false, C, C, 4 * C, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_GELU_AUX),
               "train_gpt fc forward, no bias");
    case_check(case_project(4 * C, N, C, true, false, C, C, 4 * C, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_DEFAULT),
               "train_gpt lm head forward");
    // matmul_backward_gpu: dinp = weight . dout (DGELU for fcproj's input), dweight += inp . dout^T (fp32)
    case_check(case_project(4 * C, N, C, false, false, 4 * C, C, 4 * C, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_DGELU),
               "train_gpt fcproj dinp (DGELU)");
    case_check(case_project(C, 4 * C, N, false, true, C, 4 * C, C, CUDA_R_32F, 1, 1, CUBLASLT_EPILOGUE_DEFAULT),
               "train_gpt fcproj dweight (fp32, beta 1)");
    // attention: batched over B*NH, S (fp32, scaled) and y (bf16)
    Case s = case_project(T, T, hs, true, false, hs, hs, T, CUDA_R_32F, 1.0f / sqrtf((float)hs), 0,
                          CUBLASLT_EPILOGUE_DEFAULT);
    s.batch = 2 * NH;
    s.sa = s.sb = (int64_t)T * hs;
    s.sc = s.sd = (int64_t)T * T;
    case_check(s, "train_gpt attention scores (batched)");
    Case y = case_project(hs, T, T, false, false, hs, T, hs, CUDA_R_16BF, 1, 0, CUBLASLT_EPILOGUE_DEFAULT);
    y.batch = 2 * NH;
    y.sa = (int64_t)T * hs;
    y.sb = (int64_t)T * T;
    y.sc = y.sd = (int64_t)T * hs;
    case_check(y, "train_gpt attention y = V att^T (batched)");
    Case dk = y;
    dk.tb = true;
    case_check(dk, "train_gpt attention dK (batched, B transposed)");
}

/* ------------------------------------------------------------------------ */
/* 3. and 4. Refusals and invalid arguments                                 */
/* ------------------------------------------------------------------------ */
using Tweak = std::function<void(Run&)>;

// Builds the case; `before` may change descriptors or pointers before the
// heuristic, `between` after it (before cublasLtMatmul, which runs only when
// the heuristic found an algorithm).
static Outcome outcome_of(const Case& c, const Tweak& before, const Tweak& between = nullptr) {
    Run r{};
    r.c = c;
    run_alloc(&r);
    run_describe(&r);
    if (before) before(r);
    Outcome o{};
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    o.heuristic = cublasLtMatmulAlgoGetHeuristic(r.handle, r.desc, r.la, r.lb, r.lc, r.ld, r.pref, 1, &res, &o.found);
    o.matmul = CUBLAS_STATUS_NOT_SUPPORTED;
    if (o.heuristic == CUBLAS_STATUS_SUCCESS && o.found > 0) {
        if (between) between(r);
        o.matmul = cublasLtMatmul(r.handle, r.desc, &r.c.alpha, r.A, r.la, r.B, r.lb, &r.c.beta, r.C, r.lc, r.D, r.ld,
                                  &res.algo, r.ws, r.ws_bytes, nullptr);
    }
    run_undescribe(&r);
    run_free(&r);
    return o;
}

// The heuristic refuses: the status, and no algorithm.
static void expect_heuristic(cublasStatus_t want, const char* what, const Case& c, const Tweak& before) {
    Outcome o = outcome_of(c, before);
    check(o.heuristic == want && o.found == 0, "refused by the heuristic with %s (got %s, %d found): %s",
          cublasLtGetStatusName(want), cublasLtGetStatusName(o.heuristic), o.found, what);
}

// The heuristic finds an algorithm, cublasLtMatmul answers `want`.
static void expect_matmul(cublasStatus_t want, const char* what, const Case& c, const Tweak& before,
                          const Tweak& between) {
    Outcome o = outcome_of(c, before, between);
    check(o.heuristic == CUBLAS_STATUS_SUCCESS && o.matmul == want, "cublasLtMatmul answers %s (heuristic %s, got %s): %s",
          cublasLtGetStatusName(want), cublasLtGetStatusName(o.heuristic), cublasLtGetStatusName(o.matmul), what);
}

static Case case_plain(cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT, cudaDataType dt = CUDA_R_16BF) {
    Case c = case_project(40, 24, 32, true, false, 32, 32, 40, dt, 1, 0, epi);
    return c;
}

static void set_i32(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, int32_t v) {
    cublasLtMatmulDescSetAttribute(d, a, &v, 4);
}
static void set_layout_i32(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a, int32_t v) {
    cublasLtMatrixLayoutSetAttribute(l, a, &v, 4);
}

static void test_refusals() {
    // Each with the documentation's reason (cuBLAS docs, cublasLtMatmul() "Datatypes Supported" and the attribute tables).
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_COMPUTE_16F with bf16 matrices (the 16F rows take fp16 only)",
                     case_plain(), [](Run& r) {
                         set_i32(r.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, CUBLAS_COMPUTE_16F);
                         set_i32(r.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, CUDA_R_16F);
                     });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "A bf16 with B fp32 (Atype/Btype is one type in every row)",
                     case_plain(), [](Run& r) { set_layout_i32(r.lb, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_32F); });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "bf16 inputs with fp16 C and D (no such row)", case_plain(),
                     [](Run& r) {
                         set_layout_i32(r.lc, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_16F);
                         set_layout_i32(r.ld, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_16F);
                     });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "C bf16 with D fp32 (C and D must have the same data type)",
                     case_plain(), [](Run& r) { set_layout_i32(r.ld, CUBLASLT_MATRIX_LAYOUT_TYPE, CUDA_R_32F); });
    Case aux36 = case_plain(CUBLASLT_EPILOGUE_GELU_AUX);
    aux36.m = 36;
    aux36.ldd = aux36.ldc = 36;
    aux36.aux_ld = 36;
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX with aux ld 36 (EPILOGUE_AUX_LD must be divisible by 8)",
                     aux36, nullptr);
    Case aux_short = case_plain(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    aux_short.aux_ld = 32;  // m = 40
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "GELU_AUX_BIAS with aux ld 32 < m = 40 (no less than D's rows)",
                     aux_short, nullptr);
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "BIAS without a bias pointer (BIAS_POINTER is the input vector)",
                     case_plain(CUBLASLT_EPILOGUE_BIAS), [](Run& r) {
                         void* none = nullptr;
                         cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &none, sizeof(none));
                     });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "DGELU without an aux pointer (the GELU input is an extra input)",
                     case_plain(CUBLASLT_EPILOGUE_DGELU), [](Run& r) {
                         void* none = nullptr;
                         cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &none, 8);
                     });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "BIAS_DATA_TYPE fp32 with a bf16 D (the row's Bias Type is bf16)",
                     case_plain(CUBLASLT_EPILOGUE_BIAS),
                     [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_32F); });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE,
                     "EPILOGUE_AUX_DATA_TYPE fp32 with a bf16 D (non-default aux types are for fp8 outputs)",
                     case_plain(CUBLASLT_EPILOGUE_GELU_AUX),
                     [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, CUDA_R_32F); });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "TRANSC = CUBLAS_OP_T (only CUBLAS_OP_N is supported)", case_plain(),
                     [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_T); });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "GELU_BIAS with a row-major D (footnote 6)",
                     case_plain(CUBLASLT_EPILOGUE_GELU_BIAS),
                     [](Run& r) { set_layout_i32(r.ld, CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_ROW); });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "MIN_ALIGNMENT_A of 1 byte for bf16 A (no kernel reads half elements)",
                     case_plain(), [](Run& r) {
                         uint32_t one = 1;
                         cublasLtMatmulPreferenceSetAttribute(r.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &one, 4);
                     });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED,
                     "a bias 8 bytes past a 16-byte boundary (stricter reading: epilogue kernels assume 16, "
                     "pytorch#194497)",
                     case_plain(CUBLASLT_EPILOGUE_BIAS), [](Run& r) {
                         void* b8 = (char*)r.bias + 8;
                         cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b8, 8);
                     });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "a GELU aux 8 bytes past a 16-byte boundary (stricter reading)",
                     case_plain(CUBLASLT_EPILOGUE_GELU_AUX), [](Run& r) {
                         void* a8 = (char*)r.aux + 8;
                         cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &a8, 8);
                     });
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "RELU_BIAS (exists in cuBLASLt; not modelled, so refused)",
                     case_plain(CUBLASLT_EPILOGUE_BIAS),
                     [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_BIAS); });
    Case bg = case_plain(CUBLASLT_EPILOGUE_DGELU_BGRAD);
    bg.batch = 2;
    bg.sa = 32 * 40;
    bg.sb = 32 * 24;
    bg.sc = bg.sd = 40 * 24;
    bg.aux_stride = 40 * 24;
    expect_heuristic(CUBLAS_STATUS_NOT_SUPPORTED, "DGELU_BGRAD batched (stricter reading: BIAS_BATCH_STRIDE not modelled)",
                     bg, nullptr);
    // After the heuristic: the algorithm's assumptions are checked by cublasLtMatmul.
    expect_matmul(CUBLAS_STATUS_NOT_SUPPORTED, "A 2 bytes past the 256-byte alignment the heuristic was promised",
                  case_plain(), nullptr, [](Run& r) {
                      void* a2 = (char*)stub_device_alloc(32 * 40 * 2 + 16) + 2;  // (leaked: a few KB)
                      memcpy(a2, r.A, 32 * 40 * 2);
                      r.A = a2;
                  });
    expect_matmul(CUBLAS_STATUS_INVALID_VALUE, "an algorithm chosen for DEFAULT used with GELU_AUX",
                  case_plain(CUBLASLT_EPILOGUE_GELU_AUX),
                  [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT); },
                  [](Run& r) { set_i32(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_GELU_AUX); });
    // A bias under-aligned after an aligned heuristic: the kernel faults on a GPU; here the layer's fatal exit.
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        Outcome o = outcome_of(case_plain(CUBLASLT_EPILOGUE_BIAS), nullptr, [](Run& r) {
            void* b = (char*)stub_device_alloc(64 * 2) + 8;
            cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, 8);
        });
        (void)o;
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == cuda_cpu::FATAL_EXIT,
          "a bias 8 bytes off 16 given to cublasLtMatmul after an aligned heuristic stops the run (exit %d, "
          "\"misaligned address\")", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static void test_invalid_arguments() {
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int64_t eight = 1;
    check(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &eight, 8) == CUBLAS_STATUS_INVALID_VALUE,
          "invalid: TRANSA given 8 bytes (it is int32_t)");
    check(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, nullptr, 4) == CUBLAS_STATUS_INVALID_VALUE,
          "invalid: EPILOGUE from a NULL buffer");
    int32_t ld32 = 8;
    check(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld32, 4) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "invalid: EPILOGUE_AUX_LD given 4 bytes (it is int64_t)");
    cublasLtMatmulDescDestroy(d);
    check(cublasLtMatrixLayoutCreate(nullptr, CUDA_R_16BF, 4, 4, 4) == CUBLAS_STATUS_INVALID_VALUE,
          "invalid: cublasLtMatrixLayoutCreate into NULL");
    cublasLtMatmulPreference_t p;
    cublasLtMatmulPreferenceCreate(&p);
    uint32_t ws32 = 0;
    check(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws32, 4) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "invalid: MAX_WORKSPACE_BYTES given 4 bytes (it is uint64_t)");
    cublasLtMatmulPreferenceDestroy(p);

    Case lda_short = case_plain();
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "A's ld 31 < its 32 rows", lda_short, [](Run& r) {
        int64_t v = 31;
        cublasLtMatrixLayoutSetAttribute(r.la, CUBLASLT_MATRIX_LAYOUT_LD, &v, 8);
    });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "op(A) has k = 32, op(B) has k = 31", case_plain(), [](Run& r) {
        uint64_t v = 31;
        cublasLtMatrixLayoutSetAttribute(r.lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &v, 8);
    });
    expect_heuristic(CUBLAS_STATUS_INVALID_VALUE, "A has batch count 2, B, C and D 1", case_plain(),
                     [](Run& r) { set_layout_i32(r.la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 2); });
    Outcome o = outcome_of(case_plain(), [](Run& r) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 7;
        cublasStatus_t st =
            cublasLtMatmulAlgoGetHeuristic(r.handle, r.desc, r.la, r.lb, r.lc, r.ld, r.pref, 0, &res, &found);
        check(st == CUBLAS_STATUS_INVALID_VALUE && found == 0, "invalid: requestedAlgoCount 0 (%s, %d found)",
              cublasLtGetStatusName(st), found);
    });
    (void)o;
    auto matmul_with = [](const char* what, cublasStatus_t want, const Tweak& between) {
        expect_matmul(want, what, case_plain(), nullptr, between);
    };
    outcome_of(case_plain(), nullptr, [](Run& r) {  // (the checks are inside; the outcome is the plain call's)
        cublasLtMatmulHeuristicResult_t res;
        int found;
        cublasLtMatmulAlgoGetHeuristic(r.handle, r.desc, r.la, r.lb, r.lc, r.ld, r.pref, 1, &res, &found);
        cublasStatus_t st = cublasLtMatmul(r.handle, r.desc, nullptr, r.A, r.la, r.B, r.lb, &r.c.beta, r.C, r.lc, r.D,
                                           r.ld, &res.algo, r.ws, r.ws_bytes, nullptr);
        check(st == CUBLAS_STATUS_INVALID_VALUE, "invalid: cublasLtMatmul with alpha NULL (%s)", cublasLtGetStatusName(st));
        st = cublasLtMatmul(nullptr, r.desc, &r.c.alpha, r.A, r.la, r.B, r.lb, &r.c.beta, r.C, r.lc, r.D, r.ld,
                            &res.algo, r.ws, r.ws_bytes, nullptr);
        check(st == CUBLAS_STATUS_NOT_INITIALIZED, "invalid: cublasLtMatmul with a NULL handle (%s)",
              cublasLtGetStatusName(st));
        cublasLtMatmulAlgo_t junk;
        memset(&junk, 0x5A, sizeof(junk));
        st = cublasLtMatmul(r.handle, r.desc, &r.c.alpha, r.A, r.la, r.B, r.lb, &r.c.beta, r.C, r.lc, r.D, r.ld, &junk,
                            r.ws, r.ws_bytes, nullptr);
        check(st == CUBLAS_STATUS_INVALID_VALUE, "invalid: cublasLtMatmul with an algorithm not from the heuristic (%s)",
              cublasLtGetStatusName(st));
    });
    matmul_with("invalid: A NULL", CUBLAS_STATUS_INVALID_VALUE, [](Run& r) { r.A = nullptr; });
    static std::vector<unsigned char> host(1 << 16);
    matmul_with("invalid: A in host memory, not device memory", CUBLAS_STATUS_INVALID_VALUE,
                [](Run& r) { r.A = (void*)(((uintptr_t)host.data() + 255) / 256 * 256); });
    matmul_with("invalid: D 8 elements on, so it runs past its allocation", CUBLAS_STATUS_INVALID_VALUE,
                [](Run& r) { r.D = (char*)r.D + 16; r.C = r.D; r.c.in_place = true; });
    matmul_with("invalid: the workspace not 256-byte aligned", CUBLAS_STATUS_INVALID_VALUE,
                [](Run& r) { r.ws = (char*)r.ws + 16; r.ws_bytes -= 256; });
    Case beta1 = case_plain();
    beta1.beta = 1.0f;
    beta1.in_place = false;
    beta1.ldd = 42;  // C's ld 40, D's 42
    expect_matmul(CUBLAS_STATUS_INVALID_VALUE, "invalid: C == D but Cdesc's ld 40 != Ddesc's 42", beta1, nullptr,
                  [](Run& r) { r.C = r.D; });
    expect_matmul(CUBLAS_STATUS_INVALID_VALUE, "invalid: beta 1 with C in host memory", beta1, nullptr,
                  [](Run& r) { r.C = (void*)(((uintptr_t)host.data() + 255) / 256 * 256); });
}

/* ------------------------------------------------------------------------ */
/* 5. Descriptors are read at the call                                      */
/* ------------------------------------------------------------------------ */
// On a GPU cublasLtMatmul takes what it needs from the descriptors when it is
// called, on the host: NVIDIA's samples (CUDALibrarySamples cuBLASLt/LtSgemm)
// destroy them right after the asynchronous call, and train_gpt.cu's cache
// (G3) sets the next GEMM's bias and aux pointers on a descriptor whose
// previous GEMM may not have run yet. Here the stub holds the body (a stream
// not yet reached) while the host changes the descriptor (`after` 0: the bias
// and aux pointers to other buffers and the epilogue to DEFAULT) or destroys
// the descriptor and layouts and makes others with other values, likely in
// the same memory (`after` 1); then the body runs and must compute the
// original problem, into the original aux.
static void call_time_check(int after) {
    Run r{};
    r.c = case_plain(CUBLASLT_EPILOGUE_GELU_AUX_BIAS);  // m = 40: bias 40 values, aux ld 40
    run_alloc(&r);
    run_describe(&r);
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof(res));
    int found = 0;
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(r.handle, r.desc, r.la, r.lb, r.lc, r.ld, r.pref, 1, &res, &found);
    cuda_cpu::stub_defer = true;
    cublasStatus_t ms = CUBLAS_STATUS_NOT_SUPPORTED;
    if (hs == CUBLAS_STATUS_SUCCESS && found == 1)
        ms = cublasLtMatmul(r.handle, r.desc, &r.c.alpha, r.A, r.la, r.B, r.lb, &r.c.beta, r.C, r.lc, r.D, r.ld,
                            &res.algo, r.ws, r.ws_bytes, nullptr);
    bool held = std::isnan(get(r.D, r.c.dt, 0));  // (the test of the test: nothing has run yet)
    size_t es = es_of(r.c.dt), naux = r.aux_copy.size() / es;
    void* bias2 = stub_device_alloc(r.c.m * es);
    void* aux2 = stub_device_alloc(naux * es);  // NaN poison: must stay so
    for (int i = 0; i < r.c.m; i++) put(bias2, r.c.dt, i, 100.0f);
    const char* what;
    if (after == 0) {
        what = "its bias and aux pointers and epilogue changed";
        cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias2, sizeof(void*));
        cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux2, sizeof(void*));
        set_i32(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
    } else {
        what = "its descriptor and layouts destroyed, others made";
        cublasLtMatmulDescDestroy(r.desc);
        cublasLtMatrixLayout_t* ls[] = {&r.la, &r.lb, &r.lc, &r.ld};
        for (cublasLtMatrixLayout_t* l : ls) cublasLtMatrixLayoutDestroy(*l);
        cublasLtMatmulDescCreate(&r.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);  // epilogue DEFAULT, no pointers
        cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias2, sizeof(void*));
        for (cublasLtMatrixLayout_t* l : ls) cublasLtMatrixLayoutCreate(l, CUDA_R_32F, 8, 8, 8);
    }
    int ran = cuda_cpu::stub_run_deferred();
    cuda_cpu::stub_defer = false;
    std::string why;
    bool ok = held && ran == 1 && ms == CUBLAS_STATUS_SUCCESS;
    if (!ok) why = std::string("held ") + (held ? "yes" : "no") + ", bodies run " + std::to_string(ran) +
                   ", matmul " + cublasLtGetStatusName(ms);
    if (ok) {
        Expect x;
        reference(r, &x);  // with the bias and aux the call was given
        ok = compare(r, x, &why);
    }
    for (size_t i = 0; ok && i < naux; i++)
        if (!std::isnan(get(aux2, r.c.dt, (int64_t)i))) ok = false, why = "the later aux pointer was written";
    check(ok, "a queued GELU_AUX_BIAS matmul, then %s before the stream runs: the values at the call are used%s%s",
          what, ok ? "" : ": ", why.c_str());
    stub_device_free(bias2);
    stub_device_free(aux2);
    run_undescribe(&r);
    run_free(&r);
}

static void test_call_time() {
    call_time_check(0);
    call_time_check(1);
}

/* ------------------------------------------------------------------------ */
/* 6. The checker rejects planted wrong references                          */
/* ------------------------------------------------------------------------ */
static void test_the_tester() {
    // A correct run, then references with a planted error: each must be rejected.
    for (int plant = 0; plant < 3; plant++) {
        Case c = plant == 1 ? case_plain(CUBLASLT_EPILOGUE_GELU, CUDA_R_32F) : case_plain(CUBLASLT_EPILOGUE_BIAS);
        Run r{};
        r.c = c;
        run_alloc(&r);
        run_describe(&r);
        Outcome o = run_call(&r);
        Expect x;
        reference(r, &x);
        std::string why;
        bool right = o.matmul == CUBLAS_STATUS_SUCCESS && compare(r, x, &why);
        const char* what = "";
        if (plant == 0) {  // one value 3 bf16 ulps off
            what = "D(5, 3) moved by 3 bf16 ulps";
            size_t at = 3 * (size_t)c.m + 5;
            x.d[at] += 3 * ulp(CUDA_R_16BF, x.d[at]);
        } else if (plant == 1) {  // the erf GELU instead of the tanh approximation (fp32 output)
            what = "the erf GELU instead of the tanh approximation (fp32 D)";
            for (size_t i = 0; i < x.d.size(); i++) x.d[i] = gelu_erf_ref(x.aux[i]);
        } else {  // the bias left out
            what = "the bias left out";
            for (int j = 0; j < c.n; j++)
                for (int i = 0; i < c.m; i++) x.d[(size_t)j * c.m + i] -= get(r.bias, c.dt, i);
        }
        std::string why2;
        bool rejected = !compare(r, x, &why2);
        check(right && rejected, "test the tester: the true reference passes%s, a planted one (%s) is rejected%s%s",
              right ? "" : (" [no: " + why + "]").c_str(), what, rejected ? ": " : " [no]", why2.c_str());
        run_undescribe(&r);
        run_free(&r);
    }
}

int main() {
    setenv("CUBLASLT_CPU_QUIET", "1", 0);  // refusals are expected here; CUBLASLT_CPU_QUIET=0 shows their reasons
    test_random();
    test_project_shapes();
    test_refusals();
    test_invalid_arguments();
    test_call_time();
    test_the_tester();
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
