// test_layer.cu — tests the tester: the CPU execution layer must catch each
// bug a first GPU run would hit. Written as ordinary CUDA (launch syntax and all,
// with the layer's cpu_set_seed); make test-cuda-layer builds it through the layer and runs it.
//
//   ./.cpu/dev/cuda/cpu/test_layer          every case, each in a child process
//   ./.cpu/dev/cuda/cpu/test_layer CASE     one case, in this process (to see its report)
//
// Each case is a small program. A planted bug must end its process with the
// layer's exit status 86 and a report naming the problem, or return the error
// a GPU returns; the same program without the bug must pass. Last line:
// "N passed, N failed"; exit status non-zero on any failure.
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <nccl.h>  // ncclAllReduce in a graph (nccl_mpi.cpp, one rank)
#include <mma.h>   // a WMMA tile for the counters
#include <ctime>   // clock_gettime: the counters' overhead

#define CK_EXIT 1  // CK's exit status when a CUDA call fails
#include "dev/cuda/cpu/test_cases.h"  // Case, cases_main, CK: each case in a child process

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>


// ---- kernels -----------------------------------------------------------------------------

__global__ void fill_kernel(float* out, float v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v + i;
}

// sum of 256 values by a tree in shared memory; `sync` 0 plants the missing barrier
__global__ void block_sum_kernel(float* out, const float* in, int sync) {
    __shared__ float s[256];
    s[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    for (int stride = 128; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        if (sync) __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = s[0];
}

__global__ void off_by_one_kernel(float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;  // the bug: <= n (n is one past the last element)
}

__global__ void copy_kernel(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

// a warp sum; `mask` 0xffff plants a shuffle whose mask leaves out lanes that call it
__global__ void warp_sum_kernel(float* out, const float* in, unsigned mask) {
    float v = in[threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(mask, v, o);
    if (threadIdx.x == 0) out[0] = v;
}

__global__ void dynamic_shared_kernel(float* out) {
    extern __shared__ float buf[];
    buf[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

// ---- cases -----------------------------------------------------------------------------------

static float* dev_floats(int n) {
    float* d;
    CK(cudaMalloc(&d, n * sizeof(float)));
    return d;
}

static int case_ok_basic() {  // the control: a correct program runs and computes
    const int n = 1000;
    float* d = dev_floats(n);
    fill_kernel<<<(n + 255) / 256, 256>>>(d, 2.0f, n);
    CK(cudaGetLastError());
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (h[i] != 2.0f + i) { fprintf(stderr, "h[%d] = %g\n", i, h[i]); return 1; }
    CK(cudaFree(d));
    return 0;
}

// The block sum under seed s, bitwise.
static unsigned block_sum_bits(int sync, unsigned long long seed) {
    cpu_set_seed(seed);
    std::vector<float> h(256);
    for (int i = 0; i < 256; i++) h[i] = 1.0f / (i + 3);
    float *in = dev_floats(256), *out = dev_floats(1);
    CK(cudaMemcpy(in, h.data(), 256 * sizeof(float), cudaMemcpyHostToDevice));
    block_sum_kernel<<<1, 256>>>(out, in, sync);
    float r;
    cudaError_t e = cudaMemcpy(&r, out, sizeof r, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy after block_sum_kernel: %s (%d)\n", cudaGetErrorString(e), (int)e);
        exit(2);
    }
    unsigned bits;
    memcpy(&bits, &r, 4);
    return bits;
}

// exit 0 when the kernel gives the same bits under 8 seeds, 1 when not
static int seeds_agree(int sync) {
    unsigned first = block_sum_bits(sync, 1);
    for (unsigned long long s = 2; s <= 8; s++)
        if (block_sum_bits(sync, s) != first) {
            fprintf(stderr, "block_sum_kernel differs between seeds 1 and %llu: a race inside the block\n", s);
            return 1;
        }
    return 0;
}
static int case_syncthreads_ok() { return seeds_agree(1); }
static int case_syncthreads_missing() { return seeds_agree(0); }  // run with CUDA_CPU_RACE_CHECK=0: the seeds alone
static int case_syncthreads_missing_detected() { return seeds_agree(0); }  // the race check names it first

// every block adds its sum into out[0] without atomics: a race between blocks
__global__ void blocks_sum_kernel(float* out, const float* in, int atomic) {
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) {
        if (atomic) atomicAdd(out, v);
        else out[0] += v;
    }
}
static int blocks_case(int atomic) {
    float *in = dev_floats(8 * 32), *out = dev_floats(1);
    fill_kernel<<<1, 256>>>(in, 0.0f, 256);
    CK(cudaMemset(out, 0, sizeof(float)));
    blocks_sum_kernel<<<8, 32>>>(out, in, atomic);
    float r;
    CK(cudaMemcpy(&r, out, 4, cudaMemcpyDeviceToHost));
    return r == 255.0f * 256.0f / 2.0f ? 0 : 1;
}
static int case_blocks_atomic_ok() { return blocks_case(1); }
static int case_blocks_race() { return blocks_case(0); }

// thread 0 fills shared memory, the others read it: without the barrier a race, and reads of unwritten bytes
__global__ void broadcast_kernel(float* out, const float* in, int sync) {
    __shared__ float v[4];
    if (threadIdx.x < 4) v[threadIdx.x] = in[threadIdx.x];
    if (sync) __syncthreads();
    out[threadIdx.x] = v[threadIdx.x % 4];
}
static int broadcast_case(int sync) {
    float *in = dev_floats(64), *out = dev_floats(64);
    fill_kernel<<<1, 64>>>(in, 1.0f, 64);
    broadcast_kernel<<<1, 64>>>(out, in, sync);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceSynchronize: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 2;
    }
    return 0;
}
static int case_shared_broadcast_ok() { return broadcast_case(1); }
static int case_shared_missing_barrier() { return broadcast_case(0); }

static int case_oob_write() {
    const int n = 1000;
    float* d = dev_floats(n);
    off_by_one_kernel<<<(n + 255) / 256, 256>>>(d, n);
    CK(cudaDeviceSynchronize());
    return 0;
}

static int case_uninitialised_read() {
    const int n = 64;
    float *a = dev_floats(n), *b = dev_floats(n);
    copy_kernel<<<1, 64>>>(b, a, n);  // a was never written
    CK(cudaDeviceSynchronize());
    return 0;
}

static int case_use_after_free() {
    float* d = dev_floats(64);
    fill_kernel<<<1, 64>>>(d, 0.0f, 64);
    CK(cudaFree(d));
    fill_kernel<<<1, 64>>>(d, 0.0f, 64);
    CK(cudaDeviceSynchronize());
    return 0;
}

static int case_host_deref() {
    float* d = dev_floats(16);
    fill_kernel<<<1, 16>>>(d, 1.0f, 16);
    CK(cudaDeviceSynchronize());
    volatile float x = d[3];  // the bug: host code reads device memory
    (void)x;
    return 0;
}

static int case_host_memcpy_from_device() {  // uninstrumented libc, caught by the page protection
    float* d = dev_floats(16);
    fill_kernel<<<1, 16>>>(d, 1.0f, 16);
    CK(cudaDeviceSynchronize());
    float h[16];
    volatile size_t bytes = sizeof h;  // not a constant: the compiler calls libc's memcpy
    memcpy(h, d, bytes);
    printf("%g\n", h[0]);
    return 0;
}

// producer on stream a, consumer on stream b; `wait` 0 plants the missing event wait
static int streams_case(int wait) {
    const int n = 256;
    float *x = dev_floats(n), *y = dev_floats(n);
    cudaStream_t a, b;
    cudaEvent_t done;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    fill_kernel<<<1, n, 0, a>>>(x, 5.0f, n);
    CK(cudaEventRecord(done, a));
    if (wait) CK(cudaStreamWaitEvent(b, done, 0));
    copy_kernel<<<1, n, 0, b>>>(y, x, n);
    std::vector<float> h(n);
    CK(cudaMemcpyAsync(h.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, b));
    CK(cudaStreamSynchronize(b));
    for (int i = 0; i < n; i++)
        if (h[i] != 5.0f + i) { fprintf(stderr, "y[%d] = %g, not %g\n", i, h[i], 5.0f + i); return 1; }
    return 0;
}
static int case_streams_ok() { return streams_case(1); }

// stream a reads x while stream b overwrites it, unordered: whichever runs
// second meets the other's record (the read-then-write race)
static int case_streams_write_while_read() {
    const int n = 256;
    float *x = dev_floats(n), *y = dev_floats(n);
    fill_kernel<<<1, n>>>(x, 1.0f, n);
    CK(cudaDeviceSynchronize());
    cudaStream_t a, b;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    copy_kernel<<<1, n, 0, a>>>(y, x, n);
    fill_kernel<<<1, n, 0, b>>>(x, 7.0f, n);
    CK(cudaDeviceSynchronize());
    return 0;
}
static int case_streams_missing_wait() { return streams_case(0); }

// ---- host functions (cudaLaunchHostFunc) ----
// On stream a: x filled, copied to pinned `in`; a host function sums `in`
// into pinned `out` (and counts its calls); `out` copied back to y. The
// function must run after the copy before it and before the copy after it.
// `plant` 1: the function calls CUDA (cudaMemsetAsync), which CUDA forbids;
// 2: it reads device memory.
struct HostFnArgs {
    const float* in;  // pinned, n floats
    float* out;       // pinned, 1 float
    int n;
    int calls;
    int plant;
    float* dev;       // device memory (for plant 2)
    cudaStream_t s;
};
static void CUDART_CB host_sum(void* p) {
    HostFnArgs* a = (HostFnArgs*)p;
    a->calls++;
    float sum = 0.0f;
    for (int i = 0; i < a->n; i++) sum += a->in[i];
    a->out[0] = sum;
    if (a->plant == 1) cudaMemsetAsync(a->dev, 0, sizeof(float), a->s);  // the misuse: a CUDA call in a host function
    if (a->plant == 2) a->out[0] += a->dev[0];                            // the misuse: device memory read on the host
}
static int host_fn_case(int plant) {
    const int n = 256;
    float *x = dev_floats(n), *y = dev_floats(1), *in = nullptr, *out = nullptr;
    CK(cudaMallocHost(&in, n * sizeof(float)));
    CK(cudaMallocHost(&out, sizeof(float)));
    cudaStream_t a;
    CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    HostFnArgs args = {in, out, n, 0, plant, x, a};
    out[0] = -1.0f;
    fill_kernel<<<1, n, 0, a>>>(x, 1.0f, n);  // x[i] = 1 + i: sum = n + n(n-1)/2
    CK(cudaMemcpyAsync(in, x, n * sizeof(float), cudaMemcpyDeviceToHost, a));
    CK(cudaLaunchHostFunc(a, host_sum, &args));
    CK(cudaMemcpyAsync(y, out, sizeof(float), cudaMemcpyHostToDevice, a));
    float h = 0.0f;
    CK(cudaMemcpyAsync(in, y, sizeof(float), cudaMemcpyDeviceToHost, a));  // (the sum, back through the device)
    CK(cudaStreamSynchronize(a));
    h = in[0];
    const float want = (float)n + (float)n * (n - 1) / 2.0f;
    if (args.calls != 1 || h != want) {
        fprintf(stderr, "host function called %d times, the sum through the device %g, not %g\n", args.calls, h, want);
        return 1;
    }
    return 0;
}
static int case_host_fn_ok() { return host_fn_case(0); }
static int case_host_fn_calls_cuda() { return host_fn_case(1); }
static int case_host_fn_reads_device() { return host_fn_case(2); }

static int warp_case(unsigned mask) {
    float *in = dev_floats(32), *out = dev_floats(1);
    fill_kernel<<<1, 32>>>(in, 1.0f, 32);
    warp_sum_kernel<<<1, 32>>>(out, in, mask);
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "cudaDeviceSynchronize: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 2;
    }
    float r;
    CK(cudaMemcpy(&r, out, 4, cudaMemcpyDeviceToHost));
    return r == 32.0f + 31.0f * 32.0f / 2.0f ? 0 : 1;
}
static int case_shuffle_ok() { return warp_case(0xffffffffu); }
static int case_shuffle_wrong_mask() { return warp_case(0x0000ffffu); }

static int shared_case(size_t bytes, bool opt_in) {
    float* out = dev_floats(256);
    if (opt_in) CK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    dynamic_shared_kernel<<<1, 256, bytes>>>(out);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "launch: %s (%d)\n", cudaGetErrorString(e), (int)e);
        return 2;
    }
    std::vector<float> h(256);
    CK(cudaMemcpy(h.data(), out, 256 * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; i++)
        if (h[i] != 255.0f - i) return 1;
    return 0;
}
static int case_shared_ok() { return shared_case(256 * sizeof(float), false); }
static int case_shared_optin_ok() { return shared_case(100 * 1024, true); }
static int case_shared_over_limit() { return shared_case(64 * 1024, false); }  // over 48 KB without the attribute

// cuBLASLt: the epilogue the project uses works; GELU_AUX with an aux ld that
// is not a multiple of 8 does not (cuBLASLt requires it), nor fp16 A with bf16 B.
static cublasStatus_t lt_case(cublasLtEpilogue_t epi, int64_t aux_ld, cudaDataType_t type_a) {
    const int m = 16, n = 8, k = 16;
    __nv_bfloat16 *A, *B, *D, *aux;
    CK(cudaMalloc(&A, m * k * 2));
    CK(cudaMalloc(&B, k * n * 2));
    CK(cudaMalloc(&D, m * n * 2));
    CK(cudaMalloc(&aux, 64 * n * 2));
    CK(cudaMemset(A, 0, m * k * 2));
    CK(cudaMemset(B, 0, k * n * 2));
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (epi == CUBLASLT_EPILOGUE_GELU_AUX) {
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, type_a, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found == 0) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
        float alpha = 1.0f, beta = 0.0f;
        st = cublasLtMatmul(h, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, nullptr, 0, 0);
        CK(cudaDeviceSynchronize());
    }
    return st;
}
static int case_cublaslt_ok() { return lt_case(CUBLASLT_EPILOGUE_GELU_AUX, 16, CUDA_R_16BF) == CUBLAS_STATUS_SUCCESS ? 0 : 1; }
static int case_cublaslt_bad_aux_ld() {
    // cuBLASLt's documentation requires it and names no status: NOT_SUPPORTED or INVALID_VALUE are both a refusal
    return lt_case(CUBLASLT_EPILOGUE_GELU_AUX, 20, CUDA_R_16BF) != CUBLAS_STATUS_SUCCESS ? 3 : 0;
}
static int case_cublaslt_bad_types() {
    return lt_case(CUBLASLT_EPILOGUE_DEFAULT, 0, CUDA_R_16F) != CUBLAS_STATUS_SUCCESS ? 3 : 0;
}

// ---- CUDA graphs: stream capture and replay ------------------------------------------------

__global__ void axpy_kernel(float* y, const float* x, float a, int n) {  // y += a x
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

// The call's error must be `want`; otherwise say what it was (exit 2 from the case).
static bool is_error(cudaError_t got, cudaError_t want, const char* what) {
    if (got == want) return true;
    fprintf(stderr, "%s: got %s (%d), want %s (%d)\n", what, cudaGetErrorName(got), (int)got, cudaGetErrorName(want),
            (int)want);
    return false;
}

// The work a graph captures, on one stream: a pinned input copied in, a
// memset, a kernel, a device-to-device copy, a second kernel, the result
// copied out to pinned memory. out = 3 in + 2 in = 5 in.
struct GraphBufs { float *h_in, *h_out, *d_in, *d_a, *d_b; int n; };
static GraphBufs graph_bufs(int n) {
    GraphBufs g;
    g.n = n;
    CK(cudaMallocHost(&g.h_in, n * sizeof(float)));
    CK(cudaMallocHost(&g.h_out, n * sizeof(float)));
    g.d_in = dev_floats(n);
    g.d_a = dev_floats(n);
    g.d_b = dev_floats(n);
    return g;
}
static void graph_work(const GraphBufs& g, cudaStream_t s) {
    const size_t bytes = g.n * sizeof(float);
    CK(cudaMemcpyAsync(g.d_in, g.h_in, bytes, cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(g.d_a, 0, bytes, s));
    axpy_kernel<<<(g.n + 63) / 64, 64, 0, s>>>(g.d_a, g.d_in, 3.0f, g.n);
    CK(cudaMemcpyAsync(g.d_b, g.d_a, bytes, cudaMemcpyDeviceToDevice, s));
    axpy_kernel<<<(g.n + 63) / 64, 64, 0, s>>>(g.d_b, g.d_in, 2.0f, g.n);
    CK(cudaMemcpyAsync(g.h_out, g.d_b, bytes, cudaMemcpyDeviceToHost, s));
}
static void graph_inputs(const GraphBufs& g, int launch) {
    for (int i = 0; i < g.n; i++) g.h_in[i] = 0.25f * i - 7.0f * launch + 1.0f / (launch + 2);
}

// Captured once, launched 3 times with new pinned inputs: the same bits as
// the work run uncaptured; nothing runs at capture (outputs untouched).
static int case_graph_replay_ok() {
    const int n = 300;
    GraphBufs g = graph_bufs(n);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<std::vector<float>> want(3, std::vector<float>(n));
    for (int launch = 0; launch < 3; launch++) {  // the reference: uncaptured
        graph_inputs(g, launch);
        graph_work(g, s);
        CK(cudaStreamSynchronize(s));
        memcpy(want[launch].data(), g.h_out, n * sizeof(float));
    }
    CK(cudaMemset(g.d_b, 0, n * sizeof(float)));
    for (int i = 0; i < n; i++) g.h_out[i] = -1.0f;
    graph_inputs(g, 0);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus st;
    CK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusActive) { fprintf(stderr, "not capturing\n"); return 1; }
    graph_work(g, s);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaDeviceSynchronize());
    std::vector<float> b(n);
    CK(cudaMemcpy(b.data(), g.d_b, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        if (g.h_out[i] != -1.0f || b[i] != 0.0f) {
            fprintf(stderr, "element %d changed at capture: h_out %g, d_b %g\n", i, g.h_out[i], b[i]);
            return 1;
        }
    for (int launch = 0; launch < 3; launch++) {
        graph_inputs(g, launch);  // a pinned input, read by each replay
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        if (memcmp(g.h_out, want[launch].data(), n * sizeof(float)) != 0) {
            fprintf(stderr, "launch %d: h_out[1] = %g, uncaptured %g\n", launch, g.h_out[1], want[launch][1]);
            return 1;
        }
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    return 0;
}

// Two streams, forked and joined by events inside the capture: x in; y = 2x
// on the forked stream; z = x on the origin; w = y + z = 3x. `plant` 1 leaves
// out the join (cudaErrorStreamCaptureUnjoined), 2 makes the fork write z,
// which the origin also writes, unordered (a race between the graph's two
// branches, reported at replay).
static int graph_fork_case(int plant) {
    const int n = 128;
    const size_t bytes = n * sizeof(float);
    float *h_in, *h_out;
    CK(cudaMallocHost(&h_in, bytes));
    CK(cudaMallocHost(&h_out, bytes));
    float *x = dev_floats(n), *y = dev_floats(n), *z = dev_floats(n), *w = dev_floats(n);
    cudaStream_t s1, s2;
    cudaEvent_t forked, done;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(x, h_in, bytes, cudaMemcpyHostToDevice, s1));
    CK(cudaEventRecord(forked, s1));
    CK(cudaStreamWaitEvent(s2, forked, 0));  // s2 joins the capture
    float* fork_out = plant == 2 ? z : y;
    CK(cudaMemsetAsync(fork_out, 0, bytes, s2));
    axpy_kernel<<<2, 64, 0, s2>>>(fork_out, x, 2.0f, n);
    CK(cudaEventRecord(done, s2));
    CK(cudaMemsetAsync(z, 0, bytes, s1));
    axpy_kernel<<<2, 64, 0, s1>>>(z, x, 1.0f, n);
    if (plant != 1) CK(cudaStreamWaitEvent(s1, done, 0));  // the join
    CK(cudaMemsetAsync(w, 0, bytes, s1));
    axpy_kernel<<<2, 64, 0, s1>>>(w, z, 1.0f, n);
    if (plant != 1) axpy_kernel<<<2, 64, 0, s1>>>(w, y, 1.0f, n);
    CK(cudaMemcpyAsync(h_out, w, bytes, cudaMemcpyDeviceToHost, s1));
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(s1, &graph);
    if (plant == 1) {
        if (!is_error(e, cudaErrorStreamCaptureUnjoined, "cudaStreamEndCapture without the join")) return 2;
        cudaStreamCaptureStatus st;
        CK(cudaStreamIsCapturing(s2, &st));  // the forked stream has left the capture too
        return graph == nullptr && st == cudaStreamCaptureStatusNone ? 3 : 2;
    }
    CK(e);
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 3; launch++) {
        for (int i = 0; i < n; i++) h_in[i] = (float)(i - 5 * launch);
        CK(cudaGraphLaunch(exec, s1));
        CK(cudaStreamSynchronize(s1));
        for (int i = 0; i < n; i++)
            if (h_out[i] != 3.0f * h_in[i]) {
                fprintf(stderr, "launch %d: w[%d] = %g, want %g\n", launch, i, h_out[i], 3.0f * h_in[i]);
                return 1;
            }
    }
    return 0;
}
static int case_graph_fork_join_ok() { return graph_fork_case(0); }
static int case_graph_unjoined() { return graph_fork_case(1); }
static int case_graph_branch_race() { return graph_fork_case(2); }

// Launches of one executable graph are ordered even on two streams (CUDA:
// "each launch is ordered behind ... any previous launches of graphExec");
// `plant` 1 instantiates it twice, and two executables on two streams are not.
static int graph_two_streams_case(int plant) {
    const int n = 256;
    float* d = dev_floats(n);
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    fill_kernel<<<1, n, 0, s1>>>(d, 1.0f, n);
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s1, &graph));
    cudaGraphExec_t a, b;
    CK(cudaGraphInstantiate(&a, graph, 0));
    if (plant) CK(cudaGraphInstantiate(&b, graph, 0));
    CK(cudaGraphLaunch(a, s1));
    CK(cudaGraphLaunch(plant ? b : a, s2));
    CK(cudaDeviceSynchronize());
    return 0;
}
static int case_graph_launches_ordered() { return graph_two_streams_case(0); }
static int case_graph_two_execs_race() { return graph_two_streams_case(1); }

// A prohibited call during capture returns its error and invalidates the
// capture: cudaStreamEndCapture then fails with no graph. `which`: 0
// cudaStreamSynchronize of the capturing stream, 1 cudaMalloc (global mode),
// 2 cudaMemcpy (the legacy stream, while a blocking stream captures), 3
// cudaMemcpyAsync from pageable memory, 4 cudaEventQuery of a captured
// event, 5 a launch over the limits, 6 cudaDeviceSynchronize, 7
// cudaStreamSynchronize of another stream (global mode).
static int graph_prohibited_case(int which) {
    const int n = 64;
    float* d = dev_floats(n);
    float* pinned;
    CK(cudaMallocHost(&pinned, n * sizeof(float)));
    std::vector<float> pageable(n, 1.0f);
    cudaStream_t s;
    CK(which == 2 ? cudaStreamCreate(&s) : cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CK(cudaEventCreate(&ev));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fill_kernel<<<1, n, 0, s>>>(d, 1.0f, n);
    cudaError_t got = cudaSuccess, want = cudaSuccess;
    float* more = nullptr;
    switch (which) {
        case 0: got = cudaStreamSynchronize(s); want = cudaErrorStreamCaptureUnsupported; break;
        case 1: got = cudaMalloc(&more, 64); want = cudaErrorStreamCaptureUnsupported; break;
        case 2: got = cudaMemcpy(pinned, d, n * sizeof(float), cudaMemcpyDeviceToHost); want = cudaErrorStreamCaptureImplicit; break;
        case 3: got = cudaMemcpyAsync(d, pageable.data(), n * sizeof(float), cudaMemcpyHostToDevice, s); want = cudaErrorStreamCaptureUnsupported; break;
        case 4:
            CK(cudaEventRecord(ev, s));
            got = cudaEventQuery(ev);
            want = cudaErrorCapturedEvent;
            break;
        case 5:
            fill_kernel<<<1, 2048, 0, s>>>(d, 1.0f, n);
            got = cudaGetLastError();
            want = cudaErrorInvalidConfiguration;
            break;
        case 6: got = cudaDeviceSynchronize(); want = cudaErrorStreamCaptureUnsupported; break;
        case 7: {
            cudaStream_t other;
            CK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
            got = cudaStreamSynchronize(other);
            want = cudaErrorStreamCaptureUnsupported;
            break;
        }
    }
    if (!is_error(got, want, "the prohibited call")) return 2;
    fill_kernel<<<1, n, 0, s>>>(d, 2.0f, n);  // later work on an invalidated capture is refused too
    if (!is_error(cudaGetLastError(), cudaErrorStreamCaptureInvalidated, "a launch after it")) return 2;
    cudaGraph_t graph = reinterpret_cast<cudaGraph_t>(&graph);
    if (!is_error(cudaStreamEndCapture(s, &graph), cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture")) return 2;
    if (graph != nullptr) { fprintf(stderr, "an invalidated capture returned a graph\n"); return 2; }
    CK(cudaStreamSynchronize(s));  // out of capture: an ordinary stream again, nothing queued
    return 3;
}
static int case_graph_sync_in_capture() { return graph_prohibited_case(0); }
static int case_graph_malloc_in_capture() { return graph_prohibited_case(1); }
static int case_graph_legacy_memcpy_in_capture() { return graph_prohibited_case(2); }
static int case_graph_pageable_copy_in_capture() { return graph_prohibited_case(3); }
static int case_graph_captured_event_query() { return graph_prohibited_case(4); }
static int case_graph_bad_launch_in_capture() { return graph_prohibited_case(5); }
static int case_graph_device_sync_in_capture() { return graph_prohibited_case(6); }
static int case_graph_other_sync_in_capture() { return graph_prohibited_case(7); }

// In relaxed mode cudaMalloc is allowed during capture (and is not captured).
static int case_graph_malloc_relaxed_ok() {
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float* d = dev_floats(64);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    float* more;
    CK(cudaMalloc(&more, 64 * sizeof(float)));
    fill_kernel<<<1, 64, 0, s>>>(more, 1.0f, 64);
    CK(cudaMemcpyAsync(d, more, 64 * sizeof(float), cudaMemcpyDeviceToDevice, s));
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));  // (cudaMemcpy's legacy stream does not wait for a non-blocking stream)
    std::vector<float> h(64);
    CK(cudaMemcpy(h.data(), d, sizeof(float) * 64, cudaMemcpyDeviceToHost));
    return h[63] == 64.0f ? 0 : 1;
}

// A replayed graph is checked as ordinary launches are: `plant` 0 a kernel
// writing one past the end, 1 a kernel reading memory nothing has written.
static int graph_replay_bug_case(int plant) {
    const int n = 1000;
    float *a = dev_floats(n), *b = dev_floats(n);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    if (plant == 0) off_by_one_kernel<<<(n + 255) / 256, 256, 0, s>>>(a, n);
    else copy_kernel<<<(n + 255) / 256, 256, 0, s>>>(b, a, n);
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s, &graph));  // nothing ran: no report yet
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    fprintf(stderr, "captured and instantiated without a report\n");
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    return 0;
}
static int case_graph_replay_oob() { return graph_replay_bug_case(0); }
static int case_graph_replay_uninitialised() { return graph_replay_bug_case(1); }

// NCCL in a graph (one rank; two ranks: test_graph_nccl): the all-reduce does
// not run at capture, and runs at each replay.
static int case_graph_nccl_ok() {
    const int n = 64;
    const size_t bytes = n * sizeof(float);
    ncclUniqueId id;
    ncclComm_t comm;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) return 2;
    float *h_in, *h_out;
    CK(cudaMallocHost(&h_in, bytes));
    CK(cudaMallocHost(&h_out, bytes));
    float *x = dev_floats(n), *y = dev_floats(n);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < n; i++) h_out[i] = -1.0f;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(x, h_in, bytes, cudaMemcpyHostToDevice, s));
    if (ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, s) != ncclSuccess) return 2;
    CK(cudaMemcpyAsync(h_out, y, bytes, cudaMemcpyDeviceToHost, s));
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaStreamSynchronize(s));  // out of capture: would run anything the capture had queued
    if (h_out[0] != -1.0f) { fprintf(stderr, "the graph ran at capture\n"); return 1; }
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int launch = 0; launch < 2; launch++) {
        for (int i = 0; i < n; i++) h_in[i] = (float)(i * (launch + 1));
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i++)
            if (h_out[i] != h_in[i]) { fprintf(stderr, "launch %d: y[%d] = %g\n", launch, i, h_out[i]); return 1; }
    }
    ncclCommDestroy(comm);
    return 0;
}

// ---- the cases (the driver: test_cases.h) ---------------------------------------------------

// ---- the counters (CUDA_CPU_COUNT; counters.cpp): planted kernels, hand-computed counts ----
// One warp each. The layer records every lane's access and rebuilds the
// warp's requests at the barrier; each case compares all its counts with the
// exact figures worked out in its comment.

// shared reads of floats `stride` apart: stride 1 -> 1 wavefront, 2 -> 2 (two words per bank),
// 32 -> 32 (all in bank 0), 0 -> 1 (one word: a broadcast)
__global__ void count_shared_kernel(float* out, int stride) {
    __shared__ float s[1024];
    for (int i = threadIdx.x; i < 1024; i += 32) s[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x * stride) % 1024];
}
// shared reads 8 and 16 bytes wide, consecutive: two phases of 16 lanes, four of 8 -> 2 and 4 wavefronts
__global__ void count_shared_wide_kernel(unsigned long long* out8, float4* out16, const float4* in16) {
    __shared__ unsigned long long s8[32];
    __shared__ float4 s16[32];
    s8[threadIdx.x] = threadIdx.x;
    s16[threadIdx.x] = in16[threadIdx.x];  // one 16-byte store (make_float4 would be four 4-byte ones)
    __syncthreads();
    out8[threadIdx.x] = s8[threadIdx.x];
    out16[threadIdx.x] = s16[threadIdx.x];
}
// global loads of 4, 8, 16 bytes at `offset` elements from a 256-byte aligned start, `stride` elements apart
__global__ void count_global4_kernel(float* out, const float* in, int offset, int stride) {
    out[threadIdx.x] = in[offset + threadIdx.x * stride];
}
__global__ void count_global8_kernel(unsigned long long* out, const unsigned long long* in, int offset) {
    out[threadIdx.x] = in[offset + threadIdx.x];
}
__global__ void count_global16_kernel(float4* out, const float4* in, int offset) {
    out[threadIdx.x] = in[offset + threadIdx.x];
}
// divergent lanes: lane l loads l % 4 times; the k-th loads of the lanes that make one are one request
__global__ void count_divergent_kernel(float* out, const float* in) {
    float acc = 0.0f;
    for (unsigned k = 0; k < threadIdx.x % 4; k++) acc += in[k * 32 + threadIdx.x];
    out[threadIdx.x] = acc;
}
// one WMMA tile: a, b bf16 16x16 (ldm 16) from global, c = 0, d = a b + c stored as float (ldm 16)
__global__ void count_wmma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::fill_fragment(fc, 0.0f);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}
// round trips: `n` loads of 128 new bytes per warp; with `store_each` each is stored before the next
// load (n round trips), without they batch by 4 (ceil(n / 4)); then, after a barrier, the first
// 128 bytes again: one cache round trip
__global__ void count_round_trips_kernel(float* out, const float* in, int n, int store_each) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        float x = in[i * 32 + threadIdx.x];
        if (store_each) out[i * 32 + threadIdx.x] = x;
        acc += x;
    }
    __syncthreads();
    acc += in[threadIdx.x];
    out[threadIdx.x] = acc;
}
// special functions: each lane two expf and one tanhf -> 96 SFU operations
__global__ void count_sfu_kernel(float* out, const float* in) {
    float x = in[threadIdx.x];
    out[threadIdx.x] = expf(x) + tanhf(x) + expf(2.0f * x);
}
// 32 lanes atomicAdd into one float: 1 atomic request
__global__ void count_atomic_kernel(float* out) { atomicAdd(out, 1.0f); }

static int count_failures = 0;
static void count_expect(const char* what, const char* field, unsigned long long got, unsigned long long want) {
    if (got == want) return;
    fprintf(stderr, "count mismatch: %s: %s = %llu, expected %llu\n", what, field, got, want);
    count_failures++;
}
// Launches one warp of `run`, returns the counts of `kernel` for that launch alone.
template <typename F> static cuda_cpu::kernel_counts count_one(const char* kernel, F run) {
    cuda_cpu::count_on = true;
    cuda_cpu::count_reset();
    run();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    return cuda_cpu::count_get(kernel);
}
static void* count_buffer(size_t bytes) {
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 0, bytes));
    return p;
}

// `wrong_expectation`: the stride-2 shared read expected without its 2-way conflict (1 wavefront), which the check must reject
static int counts_case(bool wrong_expectation) {
    float* fout = (float*)count_buffer(64 * 1024);
    float* fin = (float*)count_buffer(64 * 1024);
    using K = cuda_cpu::kernel_counts;
    // shared, 4 bytes: stores while filling are 32 requests (1024 floats, 32 per request) of 1 wavefront each
    const int strides[4] = {1, 2, 32, 0};
    const unsigned long long wavefronts[4] = {1, wrong_expectation ? 1ull : 2ull, 32, 1};
    for (int i = 0; i < 4; i++) {
        K k = count_one("count_shared_kernel", [&] { count_shared_kernel<<<1, 32>>>(fout, strides[i]); });
        char what[64];
        snprintf(what, sizeof what, "shared read, stride %d", strides[i]);
        count_expect(what, "shared_load_requests", k.shared_load_requests, 1);
        count_expect(what, "shared_load_wavefronts", k.shared_load_wavefronts, wavefronts[i]);
        count_expect(what, "shared_store_requests", k.shared_store_requests, 32);
        count_expect(what, "shared_store_wavefronts", k.shared_store_wavefronts, 32);
        count_expect(what, "shared_ideal_wavefronts", k.shared_ideal_wavefronts, 33);  // 32 stores + the read: 1 each
        count_expect(what, "barriers", k.barriers, 1);
        count_expect(what, "global_store_requests", k.global_store_requests, 1);
        count_expect(what, "global_store_sectors", k.global_store_sectors, 4);  // 128 bytes
    }
    {
        K k = count_one("count_shared_wide_kernel", [&] {
            count_shared_wide_kernel<<<1, 32>>>((unsigned long long*)fout, (float4*)(fout + 1024), (const float4*)fin);
        });
        // loads and stores: 8-byte 2 wavefronts + 16-byte 4 wavefronts each way
        count_expect("shared 8+16-byte", "shared_load_requests", k.shared_load_requests, 2);
        count_expect("shared 8+16-byte", "shared_load_wavefronts", k.shared_load_wavefronts, 6);
        count_expect("shared 8+16-byte", "shared_store_requests", k.shared_store_requests, 2);
        count_expect("shared 8+16-byte", "shared_store_wavefronts", k.shared_store_wavefronts, 6);
        count_expect("shared 8+16-byte", "shared_ideal_wavefronts", k.shared_ideal_wavefronts, 12);  // conflict-free
        // global stores: 256 bytes (8 sectors) and 512 bytes (16)
        count_expect("shared 8+16-byte", "global_store_sectors", k.global_store_sectors, 24);
    }
    // global: 4-byte aligned 4 sectors, one float off 5, stride 2 8, stride 32 32
    const int g_off[4] = {0, 1, 0, 0}, g_stride[4] = {1, 1, 2, 32};
    const unsigned long long g_sectors[4] = {4, 5, 8, 32};
    for (int i = 0; i < 4; i++) {
        K k = count_one("count_global4_kernel", [&] { count_global4_kernel<<<1, 32>>>(fout, fin, g_off[i], g_stride[i]); });
        char what[64];
        snprintf(what, sizeof what, "global 4-byte, offset %d stride %d", g_off[i], g_stride[i]);
        count_expect(what, "global_load_requests", k.global_load_requests, 1);
        count_expect(what, "global_load_sectors", k.global_load_sectors, g_sectors[i]);
        count_expect(what, "distinct_sectors", k.distinct_sectors, g_sectors[i] + 4);  // the load's and the store's (other buffers)
        count_expect(what, "global_store_sectors", k.global_store_sectors, 4);
    }
    for (int off = 0; off < 2; off++) {  // 8-byte: 256 bytes = 8 sectors, one element off 9
        K k = count_one("count_global8_kernel", [&] {
            count_global8_kernel<<<1, 32>>>((unsigned long long*)fout, (const unsigned long long*)fin, off);
        });
        count_expect(off ? "global 8-byte, misaligned" : "global 8-byte", "global_load_sectors", k.global_load_sectors, 8 + off);
        count_expect(off ? "global 8-byte, misaligned" : "global 8-byte", "global_load_requests", k.global_load_requests, 1);
    }
    for (int off = 0; off < 2; off++) {  // 16-byte: 512 bytes = 16 sectors, one element off 17
        K k = count_one("count_global16_kernel", [&] { count_global16_kernel<<<1, 32>>>((float4*)fout, (const float4*)fin, off); });
        count_expect(off ? "global 16-byte, misaligned" : "global 16-byte", "global_load_sectors", k.global_load_sectors, 16 + off);
        count_expect(off ? "global 16-byte, misaligned" : "global 16-byte", "global_load_requests", k.global_load_requests, 1);
        count_expect(off ? "global 16-byte, misaligned" : "global 16-byte", "global_store_sectors", k.global_store_sectors, 16);
    }
    {  // divergent: k = 0 (24 lanes), 1 (16), 2 (8): 3 requests, each touching all 4 sectors of its 128 bytes
        K k = count_one("count_divergent_kernel", [&] { count_divergent_kernel<<<1, 32>>>(fout, fin); });
        count_expect("divergent lanes", "global_load_requests", k.global_load_requests, 3);
        count_expect("divergent lanes", "global_load_sectors", k.global_load_sectors, 12);
        count_expect("divergent lanes", "distinct_sectors", k.distinct_sectors, 12 + 4);  // 12 loaded once each (3 x 128 bytes), 4 stored
    }
    {  // WMMA: a and b 512 bytes each (1 request, 16 sectors); d 1024 bytes (2 requests, 32 sectors); 1 mma = 2*16^3 flops
        K k = count_one("count_wmma_kernel", [&] {
            count_wmma_kernel<<<1, 32>>>(fout, (const __nv_bfloat16*)fin, (const __nv_bfloat16*)(fin + 1024));
        });
        count_expect("wmma tile", "mma_instructions", k.mma_instructions, 1);
        count_expect("wmma tile", "tensor_flops", k.tensor_flops, 8192);
        count_expect("wmma tile", "global_load_requests", k.global_load_requests, 2);
        count_expect("wmma tile", "global_load_sectors", k.global_load_sectors, 32);
        count_expect("wmma tile", "global_store_requests", k.global_store_requests, 2);
        count_expect("wmma tile", "global_store_sectors", k.global_store_sectors, 32);
    }
    for (int store_each = 0; store_each < 2; store_each++) {  // n = 10: 10 round trips, or 4 + 4 + 2 -> 3
        K k = count_one("count_round_trips_kernel", [&] { count_round_trips_kernel<<<1, 32>>>(fout, fin, 10, store_each); });
        const char* what = store_each ? "round trips, a store after each load" : "round trips, loads only";
        count_expect(what, "global_load_requests", k.global_load_requests, 11);
        count_expect(what, "dram_round_trips", k.dram_round_trips, store_each ? 10 : 3);
        count_expect(what, "cache_round_trips", k.cache_round_trips, 1);
    }
    {  // special functions: 32 lanes x (2 expf + 1 tanhf); nothing else counts as one
        K k = count_one("count_sfu_kernel", [&] { count_sfu_kernel<<<1, 32>>>(fout, fin); });
        count_expect("expf and tanhf", "sfu_ops", k.sfu_ops, 96);
        K g = count_one("count_global4_kernel", [&] { count_global4_kernel<<<1, 32>>>(fout, fin, 0, 1); });
        count_expect("global 4-byte", "sfu_ops", g.sfu_ops, 0);
    }
    {  // the simple kernels: one load request, one DRAM round trip
        K k = count_one("count_global4_kernel", [&] { count_global4_kernel<<<1, 32>>>(fout, fin, 0, 1); });
        count_expect("global 4-byte", "dram_round_trips", k.dram_round_trips, 1);
        count_expect("global 4-byte", "cache_round_trips", k.cache_round_trips, 0);
    }
    {
        K k = count_one("count_atomic_kernel", [&] { count_atomic_kernel<<<1, 32>>>(fout); });
        count_expect("atomicAdd", "atomic_requests", k.atomic_requests, 1);
        count_expect("atomicAdd", "global_load_requests", k.global_load_requests, 0);
        count_expect("atomicAdd", "launches", k.launches, 1);
    }
    return count_failures ? 1 : 0;
}
static int case_counts_exact() { return counts_case(false); }
static int case_counts_planted_wrong() { return counts_case(true); }

// Counting off: a reduction kernel's time per launch with and without, printed (for README's figure).
static int case_counts_overhead() {
    float* fin = (float*)count_buffer(1 << 22);
    float* fout = (float*)count_buffer(1 << 22);
    double ms[2];
    for (int on = 0; on < 2; on++) {
        cuda_cpu::count_on = on;
        cudaEvent_t a, b;
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int r = 0; r < 5; r++) count_global4_kernel<<<1, 32>>>(fout, fin, 0, 1), fill_kernel<<<1024, 256>>>(fout, 1.0f, 1 << 18);
        CK(cudaDeviceSynchronize());
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ms[on] = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
    }
    fprintf(stderr, "counters: fill_kernel x5 (262144 threads) %.1f ms off, %.1f ms on\n", ms[0], ms[1]);
    return 0;
}

static const Case cases[] = {
    {"ok_basic", case_ok_basic, 0, "", "a correct program runs and computes"},
    {"syncthreads_ok", case_syncthreads_ok, 0, "", "a block reduction with its barriers: the same bits under 8 seeds"},
    {"syncthreads_missing", case_syncthreads_missing, 1, "differs between seeds", "a missing __syncthreads changes the result between seeds (race check off)",
     "CUDA_CPU_RACE_CHECK=0"},
    {"syncthreads_missing_detected", case_syncthreads_missing_detected, 2, "race inside the block", "a missing __syncthreads is named by the race check (launch fails, 719)"},
    {"shared_broadcast_ok", case_shared_broadcast_ok, 0, "", "thread 0..3 fill shared memory, a barrier, all read: no report"},
    {"shared_missing_barrier", case_shared_missing_barrier, 2, "which no thread of this block has written", "the same without the barrier: a read before the write, reported"},
    {"blocks_atomic_ok", case_blocks_atomic_ok, 0, "", "8 blocks atomicAdd into one float: no report, right sum"},
    {"blocks_race", case_blocks_race, 86, "race between blocks", "8 blocks += into one float without atomics: a race between blocks, reported"},
    {"oob_write", case_oob_write, 86, "past the end of cudaMalloc #1", "an out-of-bounds write (i <= n) is reported with the kernel"},
    {"uninitialised_read", case_uninitialised_read, 86, "nothing has written since cudaMalloc", "a read of never-written device memory is reported"},
    {"use_after_free", case_use_after_free, 86, "FREED", "a kernel writing freed memory is reported"},
    {"host_deref", case_host_deref, 86, "host code reads 4 bytes", "host code reading device memory (instrumented) is reported"},
    {"host_memcpy_from_device", case_host_memcpy_from_device, 86, "host code touched", "host memcpy from device memory (libc, not instrumented) is reported"},
    {"streams_ok", case_streams_ok, 0, "", "two streams ordered by an event: no report, right result"},
    {"streams_missing_wait", case_streams_missing_wait, 86, "race between streams", "a missing cudaStreamWaitEvent between two streams is reported, naming both"},
    {"streams_write_while_read", case_streams_write_while_read, 86, "race between streams", "a kernel overwriting what another stream reads, unordered, is reported"},
    {"host_fn_ok", case_host_fn_ok, 0, "", "cudaLaunchHostFunc runs once, after the copy before it and before the copy after it on its stream"},
    {"host_fn_calls_cuda", case_host_fn_calls_cuda, 86, "called from inside a host function", "a host function calling CUDA (cudaMemsetAsync) is reported"},
    {"host_fn_reads_device", case_host_fn_reads_device, 86, "a host function (cudaLaunchHostFunc", "a host function reading device memory is reported"},
    {"shuffle_ok", case_shuffle_ok, 0, "", "a warp sum with the full mask"},
    {"shuffle_wrong_mask", case_shuffle_wrong_mask, 2, "leaves out", "a shuffle with a mask that leaves out calling lanes fails the launch (719)"},
    {"shared_ok", case_shared_ok, 0, "", "1 KB of dynamic shared memory"},
    {"shared_optin_ok", case_shared_optin_ok, 0, "", "100 KB of dynamic shared memory after cudaFuncSetAttribute"},
    {"shared_over_limit", case_shared_over_limit, 2, "over its limit", "64 KB of dynamic shared memory without the attribute: cudaErrorInvalidValue"},
    {"cublaslt_ok", case_cublaslt_ok, 0, "", "cuBLASLt bf16 GEMM with the GELU_AUX epilogue"},
    {"cublaslt_bad_aux_ld", case_cublaslt_bad_aux_ld, 3, "", "cuBLASLt refuses GELU_AUX with an aux ld not a multiple of 8"},
    {"cublaslt_bad_types", case_cublaslt_bad_types, 3, "", "cuBLASLt refuses fp16 A with bf16 B and D"},
    {"graph_replay_ok", case_graph_replay_ok, 0, "", "a captured graph (pinned H2D, memset, 2 kernels, D2D, D2H) runs nothing at capture; 3 launches with new pinned inputs give the uncaptured bits"},
    {"graph_fork_join_ok", case_graph_fork_join_ok, 0, "", "a capture forked to a second stream and joined by events, replayed 3 times: right results"},
    {"graph_unjoined", case_graph_unjoined, 3, "was not joined back", "a fork never joined: cudaStreamEndCapture returns cudaErrorStreamCaptureUnjoined"},
    {"graph_branch_race", case_graph_branch_race, 86, "race between streams", "two branches of a graph writing the same bytes, unordered: reported at replay"},
    {"graph_launches_ordered", case_graph_launches_ordered, 0, "", "two launches of one executable graph on two streams are ordered: no report"},
    {"graph_two_execs_race", case_graph_two_execs_race, 86, "race between streams", "two executables of one graph on two streams, unordered, writing the same bytes: reported"},
    {"graph_sync_in_capture", case_graph_sync_in_capture, 3, "is invalidated", "cudaStreamSynchronize of a capturing stream: cudaErrorStreamCaptureUnsupported, then Invalidated"},
    {"graph_device_sync_in_capture", case_graph_device_sync_in_capture, 3, "is invalidated", "cudaDeviceSynchronize during capture: cudaErrorStreamCaptureUnsupported, then Invalidated"},
    {"graph_other_sync_in_capture", case_graph_other_sync_in_capture, 3, "is invalidated", "cudaStreamSynchronize of another stream during a global-mode capture: cudaErrorStreamCaptureUnsupported, then Invalidated"},
    {"graph_malloc_in_capture", case_graph_malloc_in_capture, 3, "is invalidated", "cudaMalloc during a global-mode capture: cudaErrorStreamCaptureUnsupported, then Invalidated"},
    {"graph_malloc_relaxed_ok", case_graph_malloc_relaxed_ok, 0, "", "cudaMalloc during a relaxed-mode capture is allowed"},
    {"graph_legacy_memcpy_in_capture", case_graph_legacy_memcpy_in_capture, 3, "legacy default stream", "cudaMemcpy while a blocking stream captures: cudaErrorStreamCaptureImplicit, then Invalidated"},
    {"graph_pageable_copy_in_capture", case_graph_pageable_copy_in_capture, 3, "pageable host memory", "cudaMemcpyAsync from pageable memory during capture: cudaErrorStreamCaptureUnsupported, then Invalidated"},
    {"graph_captured_event_query", case_graph_captured_event_query, 3, "last recorded in a stream capture", "cudaEventQuery of an event recorded in a capture: cudaErrorCapturedEvent, then Invalidated"},
    {"graph_bad_launch_in_capture", case_graph_bad_launch_in_capture, 3, "a failed launch", "a launch over the limits in a capture: its own error, then Invalidated"},
    {"graph_replay_oob", case_graph_replay_oob, 86, "past the end of cudaMalloc #1", "a replayed graph's out-of-bounds write is reported as an ordinary launch's"},
    {"graph_replay_uninitialised", case_graph_replay_uninitialised, 86, "nothing has written since cudaMalloc", "a replayed graph's read of never-written memory is reported"},
    {"counts_exact", case_counts_exact, 0, "", "counters: planted kernels (shared strides 1/2/32/broadcast, 8/16-byte shared, 4/8/16-byte global aligned and not, strided, divergent lanes, a WMMA tile, an atomic, DRAM and cache round trips with and without a store between loads, SFU calls) give the hand-computed counts"},
    {"counts_planted_wrong", case_counts_planted_wrong, 1, "count mismatch: shared read, stride 2: shared_load_wavefronts = 2, expected 1", "counters: a planted wrong expectation (no 2-way conflict at stride 2) is rejected"},
    {"counts_overhead", case_counts_overhead, 0, "", "counters: a fill kernel's time with counting off and on (printed with TEST_VERBOSE=1)"},
    {"graph_nccl_ok", case_graph_nccl_ok, 0, "", "ncclAllReduce captured (1 rank): not run at capture, run at each of 2 replays"},
};

int main(int argc, char** argv) { return cases_main(argc, argv, cases, sizeof cases / sizeof cases[0], false); }
