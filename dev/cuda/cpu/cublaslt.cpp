// cublaslt.cpp — the CPU execution layer's stand-in for cuBLASLt: the subset
// train_gpt.cu uses, against CUDA's own cublasLt.h, compiled as host C++
// (g++ -std=c++17 -I$CUDA_HOME/include; libcublasLt is not linked).
//
// D = epilogue(alpha op(A) op(B) + beta C [+ bias]), column-major, fp32
// accumulation, batched with strides; the matmul is enqueued on its stream
// (device.h) and computed when the layer runs it, touching exactly the bytes
// it declares. Problems the real library refuses are refused the same way
// (CUBLAS_STATUS_NOT_SUPPORTED, or no algorithm from the heuristic); bad
// arguments give CUBLAS_STATUS_INVALID_VALUE; the reason goes to stderr.
// What is and is not modelled: CUBLASLT.md beside this file.
//
// Reading order:
//   1. State: what the opaque descriptors hold (inside their own data[] arrays)
//   2. The support table: every rule, with the documentation it comes from
//   3. Handle, descriptors, layouts, preferences (create/destroy/set)
//   4. The heuristic: an "algorithm" is the alignments it assumes
//   5. The arithmetic: fp32 accumulation, GELU (tanh form), bf16 rounding (the enqueued body)
//   6. cublasLtMatmul: argument checks, the ranges, the enqueue
#include <cublasLt.h>   // CUDA's own: the API, enums and opaque struct sizes
#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16 (round to nearest even), __bfloat162float

#include "device.h"  // defines: Range, device_range_problem, enqueue, fatal

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

using cuda_cpu::Range;

/* ------------------------------------------------------------------------ */
/* 1. State                                                                 */
/* ------------------------------------------------------------------------ */
// Each descriptor is the real header's opaque struct (cublasLtMatmulDescOpaque_t
// and friends, allocated with new), and our state lives in its data[] array
// (placement new; static_asserts check it fits). No side table: a descriptor
// is self-contained, and destroying it frees it. A magic number in the first
// word tells a descriptor of ours from garbage.
namespace {

constexpr uint64_t DESC_MAGIC = 0x6c74646573632121ull, LAYOUT_MAGIC = 0x6c746c61796f7574ull,
                   PREF_MAGIC = 0x6c74707265662121ull, ALGO_MAGIC = 0x6c74616c676f2121ull,
                   HANDLE_MAGIC = 0x6c7468616e646c65ull;

struct DescState {
    uint64_t magic;
    int32_t compute, scale, pointer_mode;
    int32_t transa, transb, transc;  // cublasOperation_t
    uint32_t epilogue;               // cublasLtEpilogue_t
    int32_t bias_type, aux_type;     // cudaDataType_t, -1: unset (the default)
    const void* bias;                // bias (input) or bias gradient (output)
    const void* aux;                 // GELU input: written by GELU_AUX*, read by DGELU*
    int64_t aux_ld, aux_batch_stride;
};
struct LayoutState {
    uint64_t magic;
    uint32_t type;  // cudaDataType_t
    int32_t order;  // cublasLtOrder_t
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;  // elements between batch members
};
struct PrefState {
    uint64_t magic;
    uint64_t max_workspace;
    uint32_t align[4];  // minimum alignment promised for A, B, C, D (bytes)
    uint32_t search_mode, reduction_mask;
};
// An algorithm: what the heuristic assumed, checked again by cublasLtMatmul.
struct AlgoState {
    uint64_t magic;
    uint32_t align[4];    // alignment the kernel needs for A, B, C, D (bytes)
    uint64_t problem;     // fingerprint of the types, operations and epilogue it was chosen for
};
struct HandleState {
    uint64_t magic;
};
static_assert(sizeof(DescState) <= sizeof(cublasLtMatmulDescOpaque_t), "matmul desc state too large");
static_assert(sizeof(LayoutState) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout state too large");
static_assert(sizeof(PrefState) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "preference state too large");
static_assert(sizeof(AlgoState) <= sizeof(cublasLtMatmulAlgo_t), "algo state too large");

template <class S, class O> S* state_of(O* o, uint64_t magic) {
    if (!o) return nullptr;
    S* s = reinterpret_cast<S*>(o->data);
    return s->magic == magic ? s : nullptr;
}

// The reason for a refusal, to stderr (a real GPU run would show the status
// code only; the reason is what the layer adds). CUBLASLT_CPU_QUIET=1 silences it.
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
    static const bool quiet = getenv("CUBLASLT_CPU_QUIET") && atoi(getenv("CUBLASLT_CPU_QUIET"));
    if (quiet) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cublasLt (cpu): ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

size_t type_size(int t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_32F ? 4 : t == CUDA_R_64F ? 8 : 1; }

const char* type_name(int t) {
    switch (t) {
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_8I: return "CUDA_R_8I";
    case CUDA_R_32I: return "CUDA_R_32I";
    default: return "another type";
    }
}

/* ------------------------------------------------------------------------ */
/* 2. The support table                                                     */
/* ------------------------------------------------------------------------ */
// Source: NVIDIA cuBLAS documentation (CUDA 13.x), section "cublasLtMatmul()"
// (https://docs.nvidia.com/cuda/cublas/index.html#cublasltmatmul), its
// "Datatypes Supported" table and footnote 6; "cublasLtMatmulDescAttributes_t"
// (EPILOGUE_AUX_LD, EPILOGUE_AUX_BATCH_STRIDE, BIAS_DATA_TYPE,
// EPILOGUE_AUX_DATA_TYPE, TRANSC); "cublasLtEpilogue_t" (GELU is the tanh
// approximation); and the comments of cublasLt.h 13.1 itself. The rows below
// are the table's rows for fp32 compute that the layer models; the table's
// other rows (fp16, int8, fp64, complex, fp8, fp4) are supported by the real
// library but not modelled here: they are refused and say "not modelled".

// The "Datatypes Supported" rows modelled: computeType, scaleType, Atype = Btype, Ctype = Dtype, Bias Type.
struct TypeRow {
    cublasComputeType_t compute;
    cudaDataType_t scale, ab, cd, bias;
};
const TypeRow TYPE_ROWS[] = {
    {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF},
    {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F},
    {CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F},
    {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF},
    {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F},
    {CUBLAS_COMPUTE_32F_PEDANTIC, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F},
};

// What each epilogue reads and writes besides A, B, C and D.
enum : unsigned {
    E_BIAS_IN = 1,     // bias[m] added before the activation
    E_GELU = 2,        // D = gelu(x)
    E_AUX_OUT = 4,     // aux = x (the GELU input), ld aux_ld
    E_DGELU = 8,       // D = x * gelu'(aux)
    E_AUX_IN = 16,     // reads aux
    E_BGRAD_D = 32,    // bias[m] = row sums of the (dGELU'd) result
    E_BGRAD_A = 64,    // bias[m] = row sums of op(A) (over k)
    E_BGRAD_B = 128,   // bias[n] = column sums of op(B) (over k)
};
struct EpilogueRow {
    cublasLtEpilogue_t epilogue;
    const char* name;
    unsigned does;
};
const EpilogueRow EPILOGUES[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT", 0},
    {CUBLASLT_EPILOGUE_BIAS, "BIAS", E_BIAS_IN},
    {CUBLASLT_EPILOGUE_GELU, "GELU", E_GELU},
    {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS", E_BIAS_IN | E_GELU},
    {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX", E_GELU | E_AUX_OUT},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS", E_BIAS_IN | E_GELU | E_AUX_OUT},
    {CUBLASLT_EPILOGUE_DGELU, "DGELU", E_DGELU | E_AUX_IN},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, "DGELU_BGRAD", E_DGELU | E_AUX_IN | E_BGRAD_D},
    {CUBLASLT_EPILOGUE_BGRADA, "BGRADA", E_BGRAD_A},
    {CUBLASLT_EPILOGUE_BGRADB, "BGRADB", E_BGRAD_B},
};
// The ReLU family exists in the real library; not modelled (refused, saying so).
bool epilogue_is_relu(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_RELU || e == CUBLASLT_EPILOGUE_RELU_AUX || e == CUBLASLT_EPILOGUE_RELU_BIAS ||
           e == CUBLASLT_EPILOGUE_RELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DRELU || e == CUBLASLT_EPILOGUE_DRELU_BGRAD;
}

const EpilogueRow* epilogue_row(uint32_t e) {
    for (const EpilogueRow& r : EPILOGUES)
        if ((uint32_t)r.epilogue == e) return &r;
    return nullptr;
}

// One matrix of the problem as the layouts describe it.
struct Mat {
    int type;
    int64_t rows, cols, ld, stride;
    int batch;
    int order;
};

// The problem, from the descriptors alone (no data pointers): what the
// heuristic sees, and what the enqueued body captures by value.
struct Problem {
    int64_t m, n, k;
    int batch;
    bool ta, tb;
    Mat a, b, c, d;
    const TypeRow* row;
    const EpilogueRow* epi;
    const DescState* desc;
};

// The rules. Each names what it checks, the status it gives, and where it
// comes from; the first one broken decides. "stricter reading" marks a rule
// where the documentation is silent or unclear and the layer refuses rather
// than accept what a GPU might not.
struct Rule {
    const char* what;
    cublasStatus_t status;
    const char* source;
    bool (*broken)(const Problem&);
};

bool transposes_ok(int t) { return t == CUBLAS_OP_N || t == CUBLAS_OP_T; }
bool aux_needed(const Problem& p) { return p.epi && (p.epi->does & (E_AUX_OUT | E_AUX_IN)); }
bool bias_needed(const Problem& p) { return p.epi && (p.epi->does & (E_BIAS_IN | E_BGRAD_D | E_BGRAD_A | E_BGRAD_B)); }
bool bgrad(const Problem& p) { return p.epi && (p.epi->does & (E_BGRAD_D | E_BGRAD_A | E_BGRAD_B)); }

const Rule RULES[] = {
    {"C and D have the same data type", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmul(): note on out-of-place matmul", [](const Problem& p) { return p.c.type != p.d.type; }},
    {"computeType/scaleType/Atype/Btype/Ctype is a row of the table (rows for fp16, int8, fp64, complex, fp8 and fp4 "
     "exist but are not modelled)",
     CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul(): Datatypes Supported", [](const Problem& p) { return !p.row; }},
    {"every matrix is column-major (CUBLASLT_ORDER_COL; ROW exists but is not modelled, and footnote 6 forbids "
     "bias+activation epilogues with a ROW D)",
     CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtOrder_t; cublasLtMatmul() footnote 6", [](const Problem& p) {
         return p.a.order != CUBLASLT_ORDER_COL || p.b.order != CUBLASLT_ORDER_COL ||
                p.c.order != CUBLASLT_ORDER_COL || p.d.order != CUBLASLT_ORDER_COL;
     }},
    {"alpha and beta are host scalars (CUBLASLT_POINTER_MODE_HOST; the device modes are not modelled)",
     CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtPointerMode_t",
     [](const Problem& p) { return p.desc->pointer_mode != CUBLASLT_POINTER_MODE_HOST; }},
    {"TRANSA and TRANSB are CUBLAS_OP_N or CUBLAS_OP_T (OP_C on real data is not modelled)",
     CUBLAS_STATUS_NOT_SUPPORTED, "cublasOperation_t",
     [](const Problem& p) { return !transposes_ok(p.desc->transa) || !transposes_ok(p.desc->transb); }},
    {"TRANSC is CUBLAS_OP_N", CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescAttributes_t: TRANSC",
     [](const Problem& p) { return p.desc->transc != CUBLAS_OP_N; }},
    {"the shapes agree: op(A) is m x k, op(B) is k x n, C and D are m x n", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmul()", [](const Problem& p) {
         int64_t ar = p.ta ? p.a.cols : p.a.rows, ac = p.ta ? p.a.rows : p.a.cols;
         int64_t br = p.tb ? p.b.cols : p.b.rows, bc = p.tb ? p.b.rows : p.b.cols;
         return ar != p.m || ac != p.k || br != p.k || bc != p.n || p.c.rows != p.m || p.c.cols != p.n;
     }},
    {"ld >= rows for A, B and D; C's ld >= rows or 0 (broadcast)", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatrixLayoutAttribute_t: LD; cublasLtMatmul() note on C", [](const Problem& p) {
         return p.a.ld < p.a.rows || p.b.ld < p.b.rows || p.d.ld < p.d.rows || (p.c.ld != 0 && p.c.ld < p.c.rows);
     }},
    {"A, B, C and D have the same batch count (>= 1) and non-negative batch strides (stricter reading for A and B)",
     CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul() note on C and D; BATCH_COUNT", [](const Problem& p) {
         const Mat* ms[] = {&p.a, &p.b, &p.c, &p.d};
         for (const Mat* x : ms)
             if (x->batch != p.batch || x->batch < 1 || x->stride < 0) return true;
         return false;
     }},
    {"the epilogue is a cublasLtEpilogue_t value", CUBLAS_STATUS_INVALID_VALUE, "cublasLtEpilogue_t",
     [](const Problem& p) { return !p.epi && !epilogue_is_relu(p.desc->epilogue); }},
    {"the epilogue is modelled (the ReLU family is not)", CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT.md",
     [](const Problem& p) { return !p.epi; }},
    {"an epilogue with a bias or bias gradient has BIAS_POINTER set", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmulDescAttributes_t: BIAS_POINTER", [](const Problem& p) { return bias_needed(p) && !p.desc->bias; }},
    {"BIAS_DATA_TYPE, when set, is the table's Bias Type (Dtype here)", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmulDescAttributes_t: BIAS_DATA_TYPE; Datatypes Supported", [](const Problem& p) {
         return p.desc->bias_type != -1 && p.desc->bias_type != (int)p.row->bias;
     }},
    {"EPILOGUE_AUX_DATA_TYPE, when set, is Dtype (other values are for fp8 outputs only)",
     CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescAttributes_t: EPILOGUE_AUX_DATA_TYPE",
     [](const Problem& p) { return p.desc->aux_type != -1 && p.desc->aux_type != p.d.type; }},
    {"a GELU aux epilogue has EPILOGUE_AUX_POINTER set", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmulDescAttributes_t: EPILOGUE_AUX_POINTER", [](const Problem& p) { return aux_needed(p) && !p.desc->aux; }},
    {"EPILOGUE_AUX_LD is divisible by 8 and no less than the rows of D", CUBLAS_STATUS_INVALID_VALUE,
     "cublasLtMatmulDescAttributes_t: EPILOGUE_AUX_LD", [](const Problem& p) {
         return aux_needed(p) && (p.desc->aux_ld % 8 != 0 || p.desc->aux_ld < p.m);
     }},
    {"EPILOGUE_AUX_BATCH_STRIDE is divisible by 8 and, when aux is written by a batch, keeps the batch's aux "
     "matrices apart (stricter reading)",
     CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescAttributes_t: EPILOGUE_AUX_BATCH_STRIDE", [](const Problem& p) {
         if (!aux_needed(p)) return false;
         int64_t s = p.desc->aux_batch_stride;
         bool writes = p.epi->does & E_AUX_OUT;
         return s % 8 != 0 || s < 0 || (writes && p.batch > 1 && s < p.desc->aux_ld * p.n);
     }},
    {"bias-gradient epilogues run unbatched (BIAS_BATCH_STRIDE is not modelled; stricter reading)",
     CUBLAS_STATUS_NOT_SUPPORTED, "CUBLASLT.md", [](const Problem& p) { return bgrad(p) && p.batch > 1; }},
};

// Checks the descriptors into *p; CUBLAS_STATUS_SUCCESS or the first broken rule's status (said on stderr).
cublasStatus_t problem_make(const char* fn, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                            cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                            Problem* p) {
    const DescState* ds = state_of<DescState>(desc, DESC_MAGIC);
    const LayoutState* ls[4] = {state_of<LayoutState>(la, LAYOUT_MAGIC), state_of<LayoutState>(lb, LAYOUT_MAGIC),
                                state_of<LayoutState>(lc ? lc : ld, LAYOUT_MAGIC),  // Cdesc omitted: Ddesc
                                state_of<LayoutState>(ld, LAYOUT_MAGIC)};
    if (!ds || !ls[0] || !ls[1] || !ls[2] || !ls[3]) {
        say("%s: a descriptor is NULL or not one that cublasLt*Create made: CUBLAS_STATUS_INVALID_VALUE", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Mat* ms[4] = {&p->a, &p->b, &p->c, &p->d};
    for (int i = 0; i < 4; i++)
        *ms[i] = Mat{(int)ls[i]->type, (int64_t)ls[i]->rows, (int64_t)ls[i]->cols, ls[i]->ld, ls[i]->stride,
                     ls[i]->batch, ls[i]->order};
    p->desc = ds;
    p->ta = ds->transa != CUBLAS_OP_N;
    p->tb = ds->transb != CUBLAS_OP_N;
    p->m = p->d.rows;
    p->n = p->d.cols;
    p->k = p->ta ? p->a.rows : p->a.cols;
    p->batch = p->d.batch;
    p->row = nullptr;
    for (const TypeRow& r : TYPE_ROWS)
        if (r.compute == ds->compute && r.scale == ds->scale && r.ab == p->a.type && r.ab == p->b.type &&
            r.cd == p->c.type && r.cd == p->d.type)
            p->row = &r;
    p->epi = epilogue_row(ds->epilogue);
    for (const Rule& r : RULES) {
        if (r.broken(*p)) {
            say("%s: refused, %s: %s (A %s, B %s, C %s, D %s; m=%lld n=%lld k=%lld batch=%d epilogue %u) [%s]", fn,
                cublasLtGetStatusName(r.status), r.what, type_name(p->a.type), type_name(p->b.type),
                type_name(p->c.type), type_name(p->d.type), (long long)p->m, (long long)p->n, (long long)p->k,
                p->batch, ds->epilogue, r.source);
            return r.status;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

// The fingerprint an algorithm carries: the types, operations and epilogue it was chosen for.
uint64_t problem_fingerprint(const Problem& p) {
    uint64_t h = 1469598103934665603ull;
    int64_t parts[] = {p.a.type, p.b.type, p.c.type, p.d.type, p.desc->compute, p.ta, p.tb, p.desc->epilogue};
    for (int64_t v : parts) h = (h ^ (uint64_t)v) * 1099511628211ull;
    return h;
}

}  // namespace

/* ------------------------------------------------------------------------ */
/* 3. Handle, descriptors, layouts, preferences                             */
/* ------------------------------------------------------------------------ */
// Attribute setters copy exactly the attribute's size (the header's type for
// it); a NULL buffer or another size is CUBLAS_STATUS_INVALID_VALUE, as the
// header's documentation of *SetAttribute says.
namespace {

cublasStatus_t attr_copy(const char* fn, int attr, void* field, size_t field_size, const void* buf, size_t size) {
    if (!buf || size != field_size) {
        say("%s: attribute %d needs a %zu-byte value, got %zu bytes at %p: CUBLAS_STATUS_INVALID_VALUE", fn, attr,
            field_size, size, buf);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t attr_not_modelled(const char* fn, int attr) {
    say("%s: attribute %d is not modelled by the CPU layer: CUBLAS_STATUS_NOT_SUPPORTED", fn, attr);
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

template <class O, class S> cublasStatus_t opaque_create(O** out, const char* fn, S init) {
    if (!out) {
        say("%s: NULL output pointer: CUBLAS_STATUS_INVALID_VALUE", fn);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    O* o = new (std::nothrow) O;
    if (!o) return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof(*o));
    new (o->data) S(init);
    *out = o;
    return CUBLAS_STATUS_SUCCESS;
}

template <class O> cublasStatus_t opaque_destroy(O* o, uint64_t magic, const char* fn) {
    if (!o) return CUBLAS_STATUS_SUCCESS;  // destroying NULL is a no-op, as for free()
    uint64_t* first = reinterpret_cast<uint64_t*>(o->data);
    if (*first != magic) {
        say("%s: %p is not a live descriptor: CUBLAS_STATUS_INVALID_VALUE", fn, (void*)o);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *first = 0;
    delete o;
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    HandleState* h = new (std::nothrow) HandleState{HANDLE_MAGIC};
    if (!h) return CUBLAS_STATUS_ALLOC_FAILED;
    *handle = reinterpret_cast<cublasLtHandle_t>(h);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    HandleState* h = reinterpret_cast<HandleState*>(handle);
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
    default: return "unknown error";
    }
}

// --- matmul descriptor ---
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
    DescState s{};
    s.magic = DESC_MAGIC;
    s.compute = compute;
    s.scale = scale;
    s.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    s.transa = s.transb = s.transc = CUBLAS_OP_N;
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    s.bias_type = s.aux_type = -1;
    return opaque_create<cublasLtMatmulDescOpaque_t>(desc, "cublasLtMatmulDescCreate", s);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    return opaque_destroy(desc, DESC_MAGIC, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
    const char* fn = "cublasLtMatmulDescSetAttribute";
    DescState* s = state_of<DescState>(desc, DESC_MAGIC);
    if (!s) return say("%s: not a matmul descriptor: CUBLAS_STATUS_INVALID_VALUE", fn), CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return attr_copy(fn, attr, &s->compute, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return attr_copy(fn, attr, &s->scale, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: return attr_copy(fn, attr, &s->pointer_mode, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSA: return attr_copy(fn, attr, &s->transa, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return attr_copy(fn, attr, &s->transb, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSC: return attr_copy(fn, attr, &s->transc, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return attr_copy(fn, attr, &s->epilogue, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return attr_copy(fn, attr, &s->bias, sizeof(void*), buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return attr_copy(fn, attr, &s->aux, sizeof(void*), buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return attr_copy(fn, attr, &s->aux_ld, 8, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE: return attr_copy(fn, attr, &s->aux_batch_stride, 8, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return attr_copy(fn, attr, &s->bias_type, 4, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return attr_copy(fn, attr, &s->aux_type, 4, buf, size);
    default: return attr_not_modelled(fn, attr);
    }
}

// --- matrix layout ---
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    LayoutState s{};
    s.magic = LAYOUT_MAGIC;
    s.type = type;
    s.order = CUBLASLT_ORDER_COL;
    s.rows = rows;
    s.cols = cols;
    s.ld = ld;
    s.batch = 1;
    s.stride = 0;
    return opaque_create<cublasLtMatrixLayoutOpaque_t>(layout, "cublasLtMatrixLayoutCreate", s);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    return opaque_destroy(layout, LAYOUT_MAGIC, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
    const char* fn = "cublasLtMatrixLayoutSetAttribute";
    LayoutState* s = state_of<LayoutState>(layout, LAYOUT_MAGIC);
    if (!s) return say("%s: not a layout: CUBLAS_STATUS_INVALID_VALUE", fn), CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return attr_copy(fn, attr, &s->type, 4, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return attr_copy(fn, attr, &s->order, 4, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return attr_copy(fn, attr, &s->rows, 8, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return attr_copy(fn, attr, &s->cols, 8, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_LD: return attr_copy(fn, attr, &s->ld, 8, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return attr_copy(fn, attr, &s->batch, 4, buf, size);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return attr_copy(fn, attr, &s->stride, 8, buf, size);
    default: return attr_not_modelled(fn, attr);
    }
}

// --- heuristic preference ---
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    PrefState s{};
    s.magic = PREF_MAGIC;
    s.max_workspace = 0;  // the header's default: no workspace allowed
    for (uint32_t& a : s.align) a = 256;  // the header's default alignment promise
    s.search_mode = CUBLASLT_SEARCH_BEST_FIT;
    s.reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    return opaque_create<cublasLtMatmulPreferenceOpaque_t>(pref, "cublasLtMatmulPreferenceCreate", s);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    return opaque_destroy(pref, PREF_MAGIC, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
    const char* fn = "cublasLtMatmulPreferenceSetAttribute";
    PrefState* s = state_of<PrefState>(pref, PREF_MAGIC);
    if (!s) return say("%s: not a preference: CUBLAS_STATUS_INVALID_VALUE", fn), CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return attr_copy(fn, attr, &s->search_mode, 4, buf, size);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return attr_copy(fn, attr, &s->max_workspace, 8, buf, size);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return attr_copy(fn, attr, &s->reduction_mask, 4, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return attr_copy(fn, attr, &s->align[0], 4, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return attr_copy(fn, attr, &s->align[1], 4, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return attr_copy(fn, attr, &s->align[2], 4, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return attr_copy(fn, attr, &s->align[3], 4, buf, size);
    default: return attr_not_modelled(fn, attr);
    }
}

}  // extern "C"

/* ------------------------------------------------------------------------ */
/* 4. The heuristic                                                         */
/* ------------------------------------------------------------------------ */
// The real heuristic picks a kernel whose alignment needs fit what it was
// promised (MIN_ALIGNMENT_*: the data pointers it cannot see) and what it can
// see (the leading dimensions and batch strides, the bias and aux pointers).
// Modelled: the kernel for matrix X needs min(promise_X, 16 bytes, the
// alignment of ld_X and stride_X in bytes); a promise below X's element size
// leaves no kernel (every kernel reads whole elements). An epilogue's bias or
// aux pointer under 16 bytes leaves no kernel: the documentation says only
// that the heuristic derives the alignment it expects from these pointers, and
// a kernel assuming 16 bytes has been seen to fault on less (pytorch#194497),
// so the stricter reading. The algorithm needs no workspace.
namespace {

uint32_t pow2_alignment(uint64_t v, uint32_t cap) {
    uint32_t a = cap;
    while (a > 1 && v % a) a /= 2;
    return a;
}
uint32_t pointer_alignment(const void* p) { return pow2_alignment((uintptr_t)p, 256); }

const uint32_t KERNEL_MAX_ALIGN = 16;  // bytes: the widest vector access a kernel is modelled to assume
const uint32_t EPILOGUE_ALIGN = 16;    // bytes: what bias and aux pointers must be aligned to

// The algorithm for *p under promises align[4], or CUBLAS_STATUS_NOT_SUPPORTED (said on stderr).
cublasStatus_t algo_choose(const char* fn, const Problem& p, const uint32_t promise[4], AlgoState* algo) {
    const Mat* ms[4] = {&p.a, &p.b, &p.c, &p.d};
    const char* names = "ABCD";
    for (int i = 0; i < 4; i++) {
        uint64_t es = type_size(ms[i]->type);
        if (promise[i] < es) {
            say("%s: no algorithm: matrix %c promised only %u-byte alignment, under its %llu-byte elements", fn,
                names[i], promise[i], (unsigned long long)es);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        uint32_t need = std::min(promise[i], KERNEL_MAX_ALIGN);
        need = std::min(need, pow2_alignment((uint64_t)ms[i]->ld * es, 256));
        if (ms[i]->batch > 1) need = std::min(need, pow2_alignment((uint64_t)ms[i]->stride * es, 256));
        algo->align[i] = std::max<uint32_t>(need, (uint32_t)es);
    }
    if (bias_needed(p) && pointer_alignment(p.desc->bias) < EPILOGUE_ALIGN) {
        say("%s: no algorithm: the bias pointer %p is only %u-byte aligned (an epilogue needs %u)", fn, p.desc->bias,
            pointer_alignment(p.desc->bias), EPILOGUE_ALIGN);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (aux_needed(p) && pointer_alignment(p.desc->aux) < EPILOGUE_ALIGN) {
        say("%s: no algorithm: the aux pointer %p is only %u-byte aligned (an epilogue needs %u)", fn, p.desc->aux,
            pointer_alignment(p.desc->aux), EPILOGUE_ALIGN);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    algo->magic = ALGO_MAGIC;
    algo->problem = problem_fingerprint(p);
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                         cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                                         cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int* returned) {
    const char* fn = "cublasLtMatmulAlgoGetHeuristic";
    HandleState* h = reinterpret_cast<HandleState*>(handle);
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (returned) *returned = 0;
    const PrefState* ps = state_of<PrefState>(pref, PREF_MAGIC);
    if (requested <= 0 || !results || !returned || !ps) {
        say("%s: requestedAlgoCount %d, results %p, returnAlgoCount %p, preference %p: CUBLAS_STATUS_INVALID_VALUE",
            fn, requested, (void*)results, (void*)returned, (void*)pref);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Problem p;
    cublasStatus_t st = problem_make(fn, desc, la, lb, lc, ld, &p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    AlgoState algo{};
    st = algo_choose(fn, p, ps->align, &algo);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    memset(&results[0], 0, sizeof(results[0]));
    new (results[0].algo.data) AlgoState(algo);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* 5. The arithmetic (the body cublasLtMatmul enqueues)                     */
/* ------------------------------------------------------------------------ */
namespace {

float load(const char* base, int type, int64_t i) {
    if (type == CUDA_R_16BF) {
        __nv_bfloat16 v;
        memcpy(&v, base + i * 2, 2);
        return __bfloat162float(v);
    }
    float v;
    memcpy(&v, base + i * 4, 4);
    return v;
}

void store(char* base, int type, int64_t i, float v) {
    if (type == CUDA_R_16BF) {
        __nv_bfloat16 b = __float2bfloat16(v);  // round to nearest even
        memcpy(base + i * 2, &b, 2);
    } else {
        memcpy(base + i * 4, &v, 4);
    }
}

// GELU, tanh approximation (cublasLtEpilogue_t note): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
const float GELU_S = 0.7978845608028654f, GELU_C = 0.044715f;
float gelu(float x) { return 0.5f * x * (1.0f + tanhf(GELU_S * (x + GELU_C * x * x * x))); }
// Its derivative: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2), t = tanh(...).
float gelu_grad(float x) {
    float t = tanhf(GELU_S * (x + GELU_C * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * GELU_S * (1.0f + 3.0f * GELU_C * x * x);
}

// Everything the body needs, by value (the application destroys the
// descriptors right after cublasLtMatmul returns).
struct Job {
    Problem p;  // (p.desc is not used by the body)
    DescState desc;
    const char *A, *B, *C;
    char* D;
    float alpha, beta;
};

// Batch member `bt` of X into out, `outer` runs of `inner` values:
// out[r * inner + l] = X(l, r) when `swap`, else X(r, l). Where the time goes:
// this copy is O(size), the product in job_run_batch O(m n k).
void op_gather(const Mat& x, const char* base, bool swap, int bt, int64_t outer, int64_t inner, std::vector<float>* out) {
    out->resize((size_t)(outer * inner));
    const char* xb = base + (int64_t)bt * x.stride * (int64_t)type_size(x.type);
    for (int64_t r = 0; r < outer; r++)
        for (int64_t l = 0; l < inner; l++) {
            int64_t idx = swap ? l + r * x.ld : r + l * x.ld;  // column-major: (row, col) at row + col * ld
            (*out)[(size_t)(r * inner + l)] = load(xb, x.type, idx);
        }
}

// One batch member: D = epilogue(alpha op(A) op(B) + beta C + bias), aux, bias gradients.
void job_run_batch(const Job& j, int bt, std::vector<float>& a, std::vector<float>& b) {
    const Problem& p = j.p;
    const DescState& ds = j.desc;
    unsigned does = p.epi->does;
    int64_t m = p.m, n = p.n, k = p.k;
    // a: op(A) rows (m x k, row i contiguous); b: op(B)^T rows (n x k, column j of op(B) contiguous)
    op_gather(p.a, j.A, p.ta, bt, m, k, &a);   // a[i k + l] = op(A)(i, l) = A(i, l) or, transposed, A(l, i)
    op_gather(p.b, j.B, !p.tb, bt, n, k, &b);  // b[jj k + l] = op(B)(l, jj) = B(l, jj) or, transposed, B(jj, l)
    int es_d = (int)type_size(p.d.type);
    const char* cb = j.C + (int64_t)bt * p.c.stride * es_d;
    char* db = j.D + (int64_t)bt * p.d.stride * es_d;
    char* aux = ds.aux ? (char*)ds.aux + (int64_t)bt * ds.aux_batch_stride * es_d : nullptr;
    std::vector<float> bgrad_rows((size_t)m, 0.0f);
    for (int64_t jj = 0; jj < n; jj++) {
        for (int64_t i = 0; i < m; i++) {
            float acc = 0.0f;  // fp32 accumulation, in order of l
            const float *ar = &a[(size_t)(i * k)], *br = &b[(size_t)(jj * k)];
            for (int64_t l = 0; l < k; l++) acc += ar[l] * br[l];
            float x = j.alpha * acc;
            if (j.beta != 0.0f) x += j.beta * load(cb, p.c.type, i + jj * p.c.ld);  // beta == 0: C is not read
            if (does & E_BIAS_IN) x += load((const char*)ds.bias, p.d.type, i);
            if (does & E_AUX_OUT) store(aux, p.d.type, i + jj * ds.aux_ld, x);
            if (does & E_GELU) x = gelu(x);
            if (does & E_DGELU) x *= gelu_grad(load(aux, p.d.type, i + jj * ds.aux_ld));
            if (does & E_BGRAD_D) bgrad_rows[(size_t)i] += x;
            store(db, p.d.type, i + jj * p.d.ld, x);
        }
    }
    char* bias_out = (char*)ds.bias;
    if (does & E_BGRAD_D)
        for (int64_t i = 0; i < m; i++) store(bias_out, p.d.type, i, bgrad_rows[(size_t)i]);
    if (does & E_BGRAD_A)  // bias[i] = sum over k of op(A)(i, l)
        for (int64_t i = 0; i < m; i++) {
            float s = 0.0f;
            for (int64_t l = 0; l < k; l++) s += a[(size_t)(i * k + l)];
            store(bias_out, p.d.type, i, s);
        }
    if (does & E_BGRAD_B)  // bias[jj] = sum over k of op(B)(l, jj)
        for (int64_t jj = 0; jj < n; jj++) {
            float s = 0.0f;
            for (int64_t l = 0; l < k; l++) s += b[(size_t)(jj * k + l)];
            store(bias_out, p.d.type, jj, s);
        }
}

void job_run(const Job& j) {
    std::vector<float> a, b;
    for (int bt = 0; bt < j.p.batch; bt++) job_run_batch(j, bt, a, b);
}

}  // namespace

/* ------------------------------------------------------------------------ */
/* 6. cublasLtMatmul                                                        */
/* ------------------------------------------------------------------------ */
namespace {

// Bytes from a matrix's first element to one past its last, over the batch.
size_t mat_extent(const Mat& x) {
    if (x.rows == 0 || x.cols == 0) return 0;
    int64_t last = (int64_t)(x.batch - 1) * x.stride + (x.cols - 1) * x.ld + x.rows;
    return (size_t)last * type_size(x.type);
}

// The ranges of one matrix: per batch member, `cols` runs of rows * es bytes, ld * es apart.
void mat_ranges(const Mat& x, const void* p, bool write, std::vector<Range>* out) {
    size_t es = type_size(x.type);
    if (x.rows == 0 || x.cols == 0) return;
    for (int bt = 0; bt < x.batch; bt++)
        out->push_back(Range{(const char*)p + (size_t)bt * (size_t)x.stride * es, (size_t)x.rows * es, write,
                             (size_t)x.cols, (size_t)x.ld * es});
}

// The aux matrix as a Mat (m x n, the aux ld and batch stride, D's type).
Mat aux_mat(const Problem& p) {
    return Mat{p.d.type, p.m, p.n, p.desc->aux_ld, p.desc->aux_batch_stride, p.batch, CUBLASLT_ORDER_COL};
}

// A device range is valid, else CUBLAS_STATUS_INVALID_VALUE with the problem on stderr.
bool range_ok(const char* what, const void* p, size_t bytes) {
    if (!p) {
        say("cublasLtMatmul: %s is NULL: CUBLAS_STATUS_INVALID_VALUE", what);
        return false;
    }
    if (bytes == 0) return true;
    std::string why = cuda_cpu::device_range_problem(p, bytes);
    if (why.empty()) return true;
    say("cublasLtMatmul: %s (%zu bytes at %p): %s; a GPU would fault here: CUBLAS_STATUS_INVALID_VALUE", what, bytes,
        p, why.c_str());
    return false;
}

// The data pointers: present, inside device memory, in-place C == D only with
// D's layout, as aligned as the algorithm needs. Also builds the ranges.
cublasStatus_t pointers_check(const Problem& p, const AlgoState& algo, const void* A, const void* B, const void* C,
                              void* D, float beta, std::vector<Range>* ranges) {
    Mat aux = aux_mat(p);
    unsigned does = p.epi->does;
    size_t bias_len = (does & E_BGRAD_B) ? (size_t)p.n : (size_t)p.m;
    if (!range_ok("A", A, mat_extent(p.a)) || !range_ok("B", B, mat_extent(p.b)) || !range_ok("D", D, mat_extent(p.d)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!C || (beta != 0.0f && !range_ok("C", C, mat_extent(p.c))))  // (stricter reading: C non-NULL even when unread)
        return say("cublasLtMatmul: C is NULL: CUBLAS_STATUS_INVALID_VALUE"), CUBLAS_STATUS_INVALID_VALUE;
    if (bias_needed(p) && !range_ok("the bias", p.desc->bias, bias_len * type_size(p.d.type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (aux_needed(p) && !range_ok("the GELU aux matrix", p.desc->aux, mat_extent(aux)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (C == D && (p.c.ld != p.d.ld || p.c.stride != p.d.stride)) {
        say("cublasLtMatmul: C == D (in place) needs Cdesc == Ddesc; ld %lld vs %lld, stride %lld vs %lld: "
            "CUBLAS_STATUS_INVALID_VALUE", (long long)p.c.ld, (long long)p.d.ld, (long long)p.c.stride,
            (long long)p.d.stride);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const void* ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++)
        if (pointer_alignment(ptrs[i]) < algo.align[i]) {
            say("cublasLtMatmul: matrix %c at %p is %u-byte aligned, the algorithm needs %u (tell the heuristic with "
                "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES): CUBLAS_STATUS_NOT_SUPPORTED", "ABCD"[i], ptrs[i],
                pointer_alignment(ptrs[i]), algo.align[i], "ABCD"[i]);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    // A kernel that assumes 16-byte bias/aux faults on less: the GPU stops the process (a sticky error).
    if (bias_needed(p) && pointer_alignment(p.desc->bias) < EPILOGUE_ALIGN)
        cuda_cpu::fatal("cublasLtMatmul: misaligned address: the epilogue's bias %p is %u-byte aligned, the kernel "
                        "needs %u (the heuristic was asked with another bias)", p.desc->bias,
                        pointer_alignment(p.desc->bias), EPILOGUE_ALIGN);
    if (aux_needed(p) && pointer_alignment(p.desc->aux) < EPILOGUE_ALIGN)
        cuda_cpu::fatal("cublasLtMatmul: misaligned address: the epilogue's aux %p is %u-byte aligned, the kernel "
                        "needs %u (the heuristic was asked with another aux)", p.desc->aux,
                        pointer_alignment(p.desc->aux), EPILOGUE_ALIGN);
    mat_ranges(p.a, A, false, ranges);
    mat_ranges(p.b, B, false, ranges);
    if (beta != 0.0f) mat_ranges(p.c, C, false, ranges);
    if (does & E_BIAS_IN) ranges->push_back(Range{p.desc->bias, bias_len * type_size(p.d.type), false});
    if (does & (E_BGRAD_D | E_BGRAD_A | E_BGRAD_B))
        ranges->push_back(Range{p.desc->bias, bias_len * type_size(p.d.type), true});
    if (does & E_AUX_IN) mat_ranges(aux, p.desc->aux, false, ranges);
    if (does & E_AUX_OUT) mat_ranges(aux, p.desc->aux, true, ranges);
    mat_ranges(p.d, D, true, ranges);
    return CUBLAS_STATUS_SUCCESS;
}

// The algorithm to run: the caller's (checked), or, for NULL, the implicit
// heuristic with default preferences (the documentation of the algo parameter).
cublasStatus_t algo_resolve(const Problem& p, const cublasLtMatmulAlgo_t* given, AlgoState* algo) {
    if (!given) {
        const uint32_t defaults[4] = {256, 256, 256, 256};
        return algo_choose("cublasLtMatmul (implicit heuristic)", p, defaults, algo);
    }
    const AlgoState* s = reinterpret_cast<const AlgoState*>(given->data);
    if (s->magic != ALGO_MAGIC) {
        say("cublasLtMatmul: the algorithm did not come from cublasLtMatmulAlgoGetHeuristic: "
            "CUBLAS_STATUS_INVALID_VALUE");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (s->problem != problem_fingerprint(p)) {
        say("cublasLtMatmul: the algorithm was chosen for other types, operations or epilogue: "
            "CUBLAS_STATUS_INVALID_VALUE");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *algo = *s;
    return CUBLAS_STATUS_SUCCESS;
}

// The workspace: the documentation asks for 256-byte alignment; none is needed here.
cublasStatus_t workspace_check(const void* ws, size_t bytes) {
    if (bytes == 0) return CUBLAS_STATUS_SUCCESS;
    if (!ws || (uintptr_t)ws % 256 != 0) {
        say("cublasLtMatmul: workspace %p of %zu bytes must be non-NULL and 256-byte aligned: "
            "CUBLAS_STATUS_INVALID_VALUE", ws, bytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return range_ok("the workspace", ws, bytes) ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                         const void* A, cublasLtMatrixLayout_t la, const void* B,
                                         cublasLtMatrixLayout_t lb, const void* beta, const void* C,
                                         cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ld,
                                         const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
    HandleState* h = reinterpret_cast<HandleState*>(handle);
    if (!h || h->magic != HANDLE_MAGIC) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!alpha || !beta) {
        say("cublasLtMatmul: alpha %p, beta %p: CUBLAS_STATUS_INVALID_VALUE", alpha, beta);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    Job job;
    cublasStatus_t st = problem_make("cublasLtMatmul", desc, la, lb, lc, ld, &job.p);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    AlgoState chosen{};
    if ((st = algo_resolve(job.p, algo, &chosen)) != CUBLAS_STATUS_SUCCESS) return st;
    if ((st = workspace_check(workspace, workspace_bytes)) != CUBLAS_STATUS_SUCCESS) return st;
    job.alpha = *(const float*)alpha;  // scale type CUDA_R_32F, host pointer mode: read now, as the library does
    job.beta = *(const float*)beta;
    std::vector<Range> ranges;
    if ((st = pointers_check(job.p, chosen, A, B, C, D, job.beta, &ranges)) != CUBLAS_STATUS_SUCCESS) return st;
    job.desc = *job.p.desc;  // by value: the descriptor may be destroyed before the body runs
    job.p.desc = nullptr;
    job.A = (const char*)A;
    job.B = (const char*)B;
    job.C = (const char*)C;
    job.D = (char*)D;
    cudaError_t e = cuda_cpu::enqueue(stream, "cublasLtMatmul", std::move(ranges), [job]() { job_run(job); });
    if (e != cudaSuccess) {
        say("cublasLtMatmul: the stream was not accepted (cudaError %d): CUBLAS_STATUS_INVALID_VALUE", (int)e);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
