/*
 * gptc/cuda/matmul.cuh — every matmul through cuBLASLt: a cache of problems
 * (the heuristic's algorithm and the descriptors, set up once per shape),
 * fused bias and GELU epilogues with an unfused path for when cuBLASLt has
 * none, and train_gpt.c's matmul_forward / matmul_backward on top.
 *
 * Included by train_gpt.cu and dev/cuda/matmul.cu, after train_gpt.c,
 * gptc/cuda/common.cuh and gpu_alloc / gpu_release with GMEM_CUBLASLT (the
 * device-memory ledger, where lt_init allocates its workspace).
 * Defines: LtKey, LtRoute, LtSlot, LtContext, LT_EPILOGUE_ALIGN,
 * LT_CACHE_SIZE, bias_add_kernel, bias_add_gpu, lt_init, lt_free,
 * ptr_alignment, lt_bias_placed, lt_key_make, lt_route, lt_epilogue_name,
 * lt_key_describe, lt_matmul, matmul_forward_gpu, matmul_backward_gpu.
 */
#ifndef GPTC_CUDA_MATMUL_CUH
#define GPTC_CUDA_MATMUL_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK
#include "gptc/cuda/gelu.cuh"      // gelu_forward_gpu, gelu_backward_gpu (the unfused epilogues)
#include "gptc/cuda/layernorm.cuh" // bias_backward_gpu (the bias gradient's column sums)

/* All tensors are row-major; cuBLASLt is column-major, so a row-major (R, K)
 * matrix is read as a column-major (K, R) one with ld = K. bf16 inputs, fp32
 * accumulation (CUBLAS_COMPUTE_32F), output bf16 or fp32. The algorithm for
 * each distinct problem is asked of the heuristic once and cached, with the
 * descriptors that describe the problem (the cache, below LtRoute). */

/* Every cuBLASLt problem is described by a key: the shapes, and how aligned
 * each pointer is (the heuristic is told A's, B's, C's and D's, and an
 * algorithm picked for aligned pointers may not run on less aligned ones).
 * The bias of the BIAS and GELU_AUX_BIAS epilogues is a slice of the flat
 * parameters, only as aligned as its offset: with C = 36 (the tiny fixture)
 * layer 0's qkvb starts 8 bytes past a 16-byte boundary. The heuristic has
 * no preference for the bias's alignment, and a kernel that assumes 16
 * bytes faults ("misaligned address", sticky: the process is done), a known
 * cuBLASLt behaviour PyTorch works around by not fusing such a bias
 * (pytorch/pytorch#194497). Here an under-aligned bias is copied first into
 * a 256-byte-aligned buffer (OC values, a few KB); the key holds the bias's
 * alignment all the same. When the heuristic has no algorithm for an
 * epilogue (or answers CUBLAS_STATUS_NOT_SUPPORTED), the problem runs
 * unfused: a plain GEMM, then our bias and GELU kernels (bias_add_gpu,
 * gelu.cuh). A plain GEMM without an algorithm stops the run, naming the
 * shape. The decisions are host functions (lt_bias_placed, lt_key_make,
 * lt_route), which test_gpt.cu checks without a GPU. */
#define LT_EPILOGUE_ALIGN 16 /* bytes: what an epilogue's bias and aux pointers must be aligned to */

/* ---- bias (the BIAS epilogue's work, when cuBLASLt has none) ------------ */

/* out(N, OC) += bias(OC), added in fp32 and rounded to bf16 (test_gpt.cu's
 * unfused pass checks it). */
__global__ void bias_add_kernel(floatX* out, const floatX* bias, long long n, int OC) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % OC]));
}

static void bias_add_gpu(floatX* out, const floatX* bias, int N, int OC, cudaStream_t s) {
    long long n = (long long)N * OC;
    bias_add_kernel<<<ceil_div(n, 256), 256, 0, s>>>(out, bias, n, OC);
    KERNEL_CHECK();
}

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd;
    int dtype;             /* cudaDataType_t of C and D */
    int epilogue;          /* cublasLtEpilogue_t */
    int batch;
    long long stride_a, stride_b, stride_d;
    int align_a, align_b, align_c, align_d, align_bias, align_aux, has_c, ldaux; /* alignments in bytes; 0: none */
} LtKey;

/* What lt_matmul does with a problem, decided once per key. */
typedef enum {
    LT_FUSED,   /* run as asked, epilogue included */
    LT_UNFUSED, /* no algorithm with the epilogue: the caller runs a plain GEMM and our kernels */
    LT_NONE     /* no algorithm even without an epilogue: stop, naming the shape */
} LtRoute;

/* The cache. Each distinct problem (key) is set up once: the heuristic's
 * algorithm and route, and the cuBLASLt objects that describe it: the
 * operation descriptor (compute and scale types, transposes, epilogue, aux
 * ld) and the four matrix layouts (type, rows, columns, ld, batch count and
 * stride of A, B, C, D). All of these follow from the key alone (lt_slot_make
 * reads nothing else), so a call whose key is cached only sets what varies
 * between calls with one key: the bias and the GELU aux pointers. Why: a
 * step of GPT-2 124M makes ~300 GEMMs; creating a descriptor and four
 * layouts per GEMM, setting their attributes and destroying them again
 * would be ~1,500 host API calls a step. Changing the bias pointer of
 * a descriptor whose previous GEMM has not run yet is safe: cublasLtMatmul
 * takes what it needs from the descriptors when it is called, on the host
 * (NVIDIA's CUDALibrarySamples cuBLASLt/LtSgemm destroys its descriptors
 * right after the asynchronous call, "all GPU work was already enqueued";
 * the CPU layer's cublaslt.cpp copies them at the call, and test_cublaslt
 * checks it). For the same
 * reason an evicted slot's objects may be destroyed while its GEMMs are
 * still queued. */
#define LT_CACHE_SIZE 128
typedef struct {
    LtKey key;
    cublasLtMatmulAlgo_t algo;
    LtRoute route;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layouts[4]; /* A, B, C, D */
} LtSlot;

typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    size_t workspace_bytes;
    floatX* bias_copy;     /* (bias_copy_elems) 256-byte aligned: under-aligned biases are copied here */
    size_t bias_copy_elems;
    int cached;            /* slots in use; full: the last one is reused */
    LtSlot slots[LT_CACHE_SIZE];
    long long calls;       /* lt_matmul calls */
    long long created;     /* descriptors (each with its 4 layouts) created: one per new key; test_gpt.cu checks
                              that a repeated step creates none */
    int no_epilogues;      /* tests: run every epilogue unfused (test_gpt.cu checks that path against the CPU) */
} LtContext;

/* The handle, the workspace, and room for a bias of up to bias_elems values. */
static void lt_init(LtContext* lt, size_t workspace_bytes, size_t bias_elems) {
    memset(lt, 0, sizeof(*lt));
    CUBLAS_CHECK(cublasLtCreate(&lt->handle));
    lt->workspace_bytes = workspace_bytes;
    lt->workspace = gpu_alloc(workspace_bytes, GMEM_CUBLASLT);
    lt->bias_copy_elems = bias_elems;
    lt->bias_copy = (floatX*)gpu_alloc(bias_elems * sizeof(floatX), GMEM_CUBLASLT); /* cudaMalloc: 256-byte aligned */
}

static void lt_slot_free(LtSlot* s) {
    for (int i = 0; i < 4; i++) CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(s->layouts[i]));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(s->desc));
    memset(s, 0, sizeof(*s));
}

static void lt_free(LtContext* lt) {
    for (int i = 0; i < lt->cached; i++) lt_slot_free(&lt->slots[i]);
    CUBLAS_CHECK(cublasLtDestroy(lt->handle));
    gpu_release(lt->workspace);
    gpu_release(lt->bias_copy);
    memset(lt, 0, sizeof(*lt));
}

/* Largest power of two (<= 256) dividing the address: the alignment promise
 * the heuristic is told (its default assumes 256 bytes). */
static int ptr_alignment(const void* p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a % (uintptr_t)al) != 0) al /= 2;
    return al;
}

/* The bias pointer cuBLASLt gets: the bias itself when it is aligned to
 * LT_EPILOGUE_ALIGN, else `copy` (lt_matmul copies the bias there first). */
static const floatX* lt_bias_placed(const floatX* bias, const floatX* copy) {
    return bias && ptr_alignment(bias) < LT_EPILOGUE_ALIGN ? copy : bias;
}

/* The key of a problem (lt_matmul's arguments; `bias` as placed). */
static LtKey lt_key_make(const void* D, cudaDataType_t dtype, const void* Cm, const floatX* A, int transa,
                         const floatX* Bm, int transb, int m, int n, int k, int lda, int ldb, int ldd, float beta,
                         const floatX* bias, cublasLtEpilogue_t epilogue, const void* aux, int batch,
                         long long stride_a, long long stride_b, long long stride_d) {
    LtKey key;
    memset(&key, 0, sizeof(key)); /* (memcmp'd: no stray padding) */
    key.transa = transa; key.transb = transb; key.m = m; key.n = n; key.k = k;
    key.lda = lda; key.ldb = ldb; key.ldd = ldd; key.dtype = (int)dtype; key.epilogue = (int)epilogue;
    key.batch = batch; key.stride_a = stride_a; key.stride_b = stride_b; key.stride_d = stride_d;
    key.align_a = ptr_alignment(A); key.align_b = ptr_alignment(Bm);
    key.align_c = ptr_alignment(Cm ? Cm : D); key.align_d = ptr_alignment(D);
    key.align_bias = bias ? ptr_alignment(bias) : 0;
    key.align_aux = aux ? ptr_alignment(aux) : 0;
    key.has_c = beta != 0.0f;
    key.ldaux = aux ? m : 0;
    return key;
}

/* The route for a key, given the heuristic's answer (its status, and how
 * many algorithms it found). The GELU aux matrix cannot be moved like the
 * bias (it is an output as large as D): under LT_EPILOGUE_ALIGN its
 * epilogue is not fused, whatever the heuristic says. */
static LtRoute lt_route(const LtKey* key, cublasStatus_t status, int found) {
    int fused = key->epilogue != (int)CUBLASLT_EPILOGUE_DEFAULT;
    if (fused && key->align_aux > 0 && key->align_aux < LT_EPILOGUE_ALIGN) return LT_UNFUSED;
    if (fused && key->align_bias > 0 && key->align_bias < LT_EPILOGUE_ALIGN) return LT_UNFUSED; /* (not placed) */
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) return LT_FUSED;
    return fused ? LT_UNFUSED : LT_NONE;
}

static const char* lt_epilogue_name(int epilogue) {
    switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
    }
}

/* The shape and alignments of a key, for messages. */
static void lt_key_describe(const LtKey* key, char* out, size_t cap) {
    snprintf(out, cap, "m=%d n=%d k=%d transa=%d transb=%d epilogue %s batch=%d (alignments: A %d B %d C %d D %d "
             "bias %d aux %d bytes)", key->m, key->n, key->k, key->transa, key->transb, lt_epilogue_name(key->epilogue),
             key->batch, key->align_a, key->align_b, key->align_c, key->align_d, key->align_bias, key->align_aux);
}

static void lt_layout_batch(cublasLtMatrixLayout_t l, int batch, long long stride) {
    if (batch <= 1) return;
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)));
}

/* A new slot's descriptor and layouts, from the key alone (what lt_matmul
 * sets per call, the bias and aux pointers, is not in them yet). A and B are
 * bf16; C has D's type and layout; the aux matrix has ld m. */
static void lt_slot_make(LtContext* lt, LtSlot* s, const LtKey* key) {
    s->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&s->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epilogue = (cublasLtEpilogue_t)key->epilogue;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (key->align_aux) {
        int64_t ldaux = key->ldaux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux,
                                                    sizeof(ldaux)));
    }
    cudaDataType_t dtype = (cudaDataType_t)key->dtype;
    int m = key->m, n = key->n, k = key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[0], CUDA_R_16BF, key->transa ? k : m, key->transa ? m : k,
                                            key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[1], CUDA_R_16BF, key->transb ? n : k, key->transb ? k : n,
                                            key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[2], dtype, m, n, key->ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s->layouts[3], dtype, m, n, key->ldd));
    long long strides[4] = {key->stride_a, key->stride_b, key->stride_d, key->stride_d};
    for (int i = 0; i < 4; i++) lt_layout_batch(s->layouts[i], key->batch, strides[i]);
    lt->created++;
}

/* D(m, n) = alpha op(A) op(B) + beta C (+ bias(m)) [then the epilogue],
 * column-major, batched with the given strides when batch > 1. A and B are
 * bf16; C and D are `dtype` (CUDA_R_16BF or CUDA_R_32F), C has D's layout
 * (C == NULL: C = D). `aux` is the GELU input for the GELU_AUX / DGELU
 * epilogues (ld = m). Returns 1 when done; 0 when the epilogue has no
 * algorithm here (nothing was queued: the caller computes the same without
 * it, as matmul_forward_gpu and matmul_backward_gpu do). Without an
 * epilogue it always returns 1 (or stops the run). One stream per context:
 * each bias copy is read by its GEMM before the next copy overwrites it. */
static int lt_matmul(LtContext* lt, cudaStream_t stream, void* D, cudaDataType_t dtype, const void* Cm,
                     const floatX* A, int transa, const floatX* Bm, int transb, int m, int n, int k,
                     int lda, int ldb, int ldd, float alpha, float beta, const floatX* bias,
                     cublasLtEpilogue_t epilogue, void* aux, int batch, long long stride_a,
                     long long stride_b, long long stride_d) {
    if (!Cm) Cm = D;
    const floatX* placed = lt_bias_placed(bias, lt->bias_copy);
    LtKey key = lt_key_make(D, dtype, Cm, A, transa, Bm, transb, m, n, k, lda, ldb, ldd, beta, placed, epilogue, aux,
                            batch, stride_a, stride_b, stride_d);
    lt->calls++;

    int slot = -1;
    for (int i = 0; i < lt->cached; i++)
        if (!memcmp(&lt->slots[i].key, &key, sizeof(key))) { slot = i; break; }
    int is_new = slot < 0;
    if (is_new) {
        if (lt->cached < LT_CACHE_SIZE) slot = lt->cached++;
        else { slot = LT_CACHE_SIZE - 1; lt_slot_free(&lt->slots[slot]); } /* full: the last slot is reused */
        lt_slot_make(lt, &lt->slots[slot], &key);
    }
    LtSlot* s = &lt->slots[slot];
    cublasLtMatrixLayout_t* l = s->layouts;
    /* what varies between calls with one key (the key holds whether each is there, and its alignment) */
    if (placed)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &placed,
                                                    sizeof(placed)));
    if (aux)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                    sizeof(aux)));
    if (is_new) {
        cublasLtMatmulPreference_t pref;
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = lt->workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
        uint32_t al[4] = {(uint32_t)key.align_a, (uint32_t)key.align_b, (uint32_t)key.align_c, (uint32_t)key.align_d};
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], 4));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[3], 4));
        cublasLtMatmulHeuristicResult_t result;
        memset(&result, 0, sizeof(result));
        int found = 0;
        /* not through CUBLAS_CHECK: CUBLAS_STATUS_NOT_SUPPORTED means "no algorithm", which lt_route handles */
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt->handle, s->desc, l[0], l[1], l[2], l[3], pref, 1,
                                                           &result, &found);
        CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
        LtRoute route = lt_route(&key, st, found);
        char shape[256];
        lt_key_describe(&key, shape, sizeof(shape));
        CHECK(route != LT_NONE, "cuBLASLt has no algorithm for %s (heuristic: %s): report this shape", shape,
              cublasLtGetStatusString(st));
        if (lt->no_epilogues && epilogue != CUBLASLT_EPILOGUE_DEFAULT) route = LT_UNFUSED;
        else if (route == LT_UNFUSED)
            printf("cuBLASLt: no algorithm for %s (heuristic: %s, %d found): a plain GEMM and our own bias/GELU "
                   "kernels instead\n", shape, cublasLtGetStatusString(st), found);
        s->algo = result.algo;
        s->route = route;
    }
    int run = s->route == LT_FUSED;
    if (run && placed != bias) { /* the under-aligned bias (m values) into the aligned buffer, just before its GEMM */
        ALWAYS((size_t)m <= lt->bias_copy_elems);
        CUDA_CHECK(cudaMemcpyAsync(lt->bias_copy, bias, (size_t)m * sizeof(floatX), cudaMemcpyDeviceToDevice, stream));
    }
    if (run)
        CUBLAS_CHECK(cublasLtMatmul(lt->handle, s->desc, &alpha, A, l[0], Bm, l[1], &beta, Cm, l[2], D, l[3], &s->algo,
                                    lt->workspace, lt->workspace_bytes, stream));
    return run;
}

/* train_gpt.c's matmul_forward: out(N, OC) = inp(N, C) . weight(OC, C)^T + bias,
 * plus `residual` (N, OC) when given (beta = 1: the residual connection
 * costs no extra pass). gelu_aux: GELU epilogue; out = gelu(pre), pre -> gelu_aux.
 * Unfused (lt_matmul found no algorithm for the epilogue): pre = the plain
 * GEMM (+ residual), + bias and GELU by our kernels; bf16 is rounded after
 * the GEMM and again after the bias, where the epilogue rounds once. */
static void matmul_forward_gpu(LtContext* lt, cudaStream_t s, floatX* out, const floatX* inp, const floatX* weight,
                               const floatX* bias, const floatX* residual, floatX* gelu_aux, int N, int C, int OC) {
    cublasLtEpilogue_t epi = gelu_aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                                      : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    float beta = residual ? 1.0f : 0.0f;
    if (lt_matmul(lt, s, out, CUDA_R_16BF, residual, weight, 1, inp, 0, OC, N, C, C, C, OC, 1.0f, beta, bias, epi,
                  gelu_aux, 1, 0, 0, 0))
        return;
    floatX* pre = gelu_aux ? gelu_aux : out;
    lt_matmul(lt, s, pre, CUDA_R_16BF, residual, weight, 1, inp, 0, OC, N, C, C, C, OC, 1.0f, beta, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    if (bias) bias_add_gpu(pre, bias, N, OC, s);
    if (gelu_aux) gelu_forward_gpu(out, gelu_aux, (long long)N * OC, s);
}

/* train_gpt.c's matmul_backward:
 *   dinp(N, C) = dout(N, OC) . weight(OC, C)       (bf16; times gelu'(gelu_aux) if given)
 *   dweight(OC, C) += dout^T . inp                 (fp32, beta = 1)
 *   dbias(OC) += column sums of dout               (fp32, deterministic)
 * Unfused DGELU: the plain GEMM, then gelu_backward_gpu in place. */
static void matmul_backward_gpu(LtContext* lt, cudaStream_t s, floatX* dinp, float* dweight, float* dbias,
                                float* bias_part, const floatX* dout, const floatX* inp, const floatX* weight,
                                floatX* gelu_aux, int N, int C, int OC) {
    if (!lt_matmul(lt, s, dinp, CUDA_R_16BF, NULL, weight, 0, dout, 0, C, N, OC, C, OC, C, 1.0f, 0.0f, NULL,
                   gelu_aux ? CUBLASLT_EPILOGUE_DGELU : CUBLASLT_EPILOGUE_DEFAULT, gelu_aux, 1, 0, 0, 0)) {
        lt_matmul(lt, s, dinp, CUDA_R_16BF, NULL, weight, 0, dout, 0, C, N, OC, C, OC, C, 1.0f, 0.0f, NULL,
                  CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
        gelu_backward_gpu(dinp, gelu_aux, dinp, (long long)N * C, s);
    }
    lt_matmul(lt, s, dweight, CUDA_R_32F, NULL, inp, 0, dout, 1, C, OC, N, C, OC, C, 1.0f, 1.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    if (dbias) bias_backward_gpu(dbias, bias_part, dout, N, OC, s);
}

#endif /* GPTC_CUDA_MATMUL_CUH */
