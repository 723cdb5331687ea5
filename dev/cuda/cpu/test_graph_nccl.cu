// test_graph_nccl.cu — an ncclAllReduce captured in a CUDA graph, replayed on
// every rank: the collective must not run at capture, must run (and meet the
// other ranks) at each launch, and must interleave with ordinary, uncaptured
// collectives in program order. Written as ordinary CUDA + NCCL + MPI; built
// through the CPU layer (translate.py, runtime.cpp, nccl_mpi.cpp):
//
//   make .cpu/dev/cuda/cpu/test_graph_nccl
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./.cpu/dev/cuda/cpu/test_graph_nccl
//   ./.cpu/dev/cuda/cpu/test_graph_nccl        (one rank, MPI started alone)
//
// Each rank prints "ok ..." or "FAIL ..." per check, then "rank R: N passed,
// N failed"; the exit status is non-zero on any failure.
// STATUS: run on the CPU layer only; not yet run on GPUs.
#include <cuda_runtime.h>
#include <mpi.h>   // defines: MPI_Init, MPI_Bcast (the NCCL id), MPI_Barrier
#include <nccl.h>  // defines: ncclAllReduce, ncclCommInitRank

#include <cstdio>
#include <cstdlib>

#define CK_EXIT 1
#include "dev/cuda/cpu/ck.h"  // CK(call)
#define NCK(call)                                                                                                \
    do {                                                                                                         \
        ncclResult_t r_ = (call);                                                                                \
        if (r_ != ncclSuccess) {                                                                                 \
            fprintf(stderr, "NCCL error %d (%s) at %s:%d: %s\n", (int)r_, ncclGetErrorString(r_), __FILE__,    \
                    __LINE__, #call);                                                                            \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)
#define MCK(call)                                                                                                \
    do {                                                                                                         \
        if ((call) != MPI_SUCCESS) {                                                                             \
            fprintf(stderr, "MPI call failed at %s:%d: %s\n", __FILE__, __LINE__, #call);                       \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

__global__ void add_kernel(float* x, float v, int n) {  // x += v
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += v;
}

static int rank = 0, nranks = 1, passed = 0, failed = 0;

static void check(bool ok, const char* what, int launch) {
    printf("%s rank %d: %s (launch %d)\n", ok ? "ok  " : "FAIL", rank, what, launch);
    ok ? passed++ : failed++;
}

int main(int argc, char** argv) {
    MCK(MPI_Init(&argc, &argv));
    MCK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MCK(MPI_Comm_size(MPI_COMM_WORLD, &nranks));
    ncclUniqueId id;
    if (rank == 0) NCK(ncclGetUniqueId(&id));
    MCK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
    ncclComm_t comm;
    NCK(ncclCommInitRank(&comm, nranks, id, rank));

    const int n = 100;
    const size_t bytes = n * sizeof(float);
    float *h_in, *h_out, *x, *y, *z;  // (n) each
    CK(cudaMallocHost(&h_in, bytes));
    CK(cudaMallocHost(&h_out, bytes));
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&y, bytes));
    CK(cudaMalloc(&z, bytes));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < n; i++) h_out[i] = -1.0f;

    // The graph: x = h_in + rank; y = sum over ranks of x; h_out = y.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CK(cudaMemcpyAsync(x, h_in, bytes, cudaMemcpyHostToDevice, s));
    add_kernel<<<(n + 63) / 64, 64, 0, s>>>(x, (float)rank, n);
    NCK(ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, s));
    CK(cudaMemcpyAsync(h_out, y, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaStreamSynchronize(s));  // out of capture: would run anything the capture had queued
    MCK(MPI_Barrier(MPI_COMM_WORLD));
    check(h_out[0] == -1.0f, "nothing ran at capture", -1);

    for (int launch = 0; launch < 3; launch++) {
        // h_in = i + 10 launch + rank, so h_out = nranks (i + 10 launch) + 2 (0 + 1 + ... + nranks-1)
        for (int i = 0; i < n; i++) h_in[i] = (float)(i + 10 * launch + rank);
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        bool ok = true;
        for (int i = 0; i < n; i++)
            ok = ok && h_out[i] == (float)(nranks * (i + 10 * launch) + nranks * (nranks - 1));
        check(ok, "the replayed all-reduce sums every rank's new pinned input", launch);
        // An ordinary collective between launches: it meets the other ranks' in program order.
        CK(cudaMemsetAsync(z, 0, bytes, s));
        add_kernel<<<(n + 63) / 64, 64, 0, s>>>(z, (float)(rank + launch), n);
        NCK(ncclAllReduce(z, z, n, ncclFloat, ncclSum, comm, s));
        CK(cudaMemcpyAsync(h_out, z, bytes, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        check(h_out[n - 1] == (float)(nranks * launch + nranks * (nranks - 1) / 2),
              "an uncaptured all-reduce between launches", launch);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    NCK(ncclCommDestroy(comm));
    printf("rank %d: %d passed, %d failed\n", rank, passed, failed);
    MCK(MPI_Finalize());
    return failed ? 1 : 0;
}
