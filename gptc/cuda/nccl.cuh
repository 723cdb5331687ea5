/* gptc/cuda/nccl.cuh: NCCL for the CUDA twin, or stand-ins for it.
 * Included by train_gpt.cu right after the CUDA headers (and so by test_gpt.cu
 * and dev/cuda/ through it). Defines GPU_HAVE_NCCL, GPU_HAVE_SPLIT (whether
 * ncclCommSplit exists), NCCL_CHECK and, in a build without NCCL
 * (-DGPTC_NO_NCCL), the NCCL names the trainer uses, each failing with a hint. */
#ifndef GPTC_CUDA_NCCL_CUH
#define GPTC_CUDA_NCCL_CUH

#ifndef GPTC_NO_NCCL
#include <nccl.h>
#define GPU_HAVE_NCCL 1
#else
/* Built without NCCL (the Makefile found none and said so: -DGPTC_NO_NCCL).
 * These stand in for the NCCL names G1 and G6 use, so that the one-GPU
 * trainer compiles and links. Nothing should reach them: gpu_options_problem
 * and gpu_comm_init refuse --init, several ranks and --zero 1|2 first; if one
 * is reached all the same, it fails through NCCL_CHECK with the reason. */
#define GPU_HAVE_NCCL 0
#define GPU_NO_NCCL_HINT                                                                                       \
    "this build has no NCCL (make said \"NCCL not found\"): install it (apt-get install libnccl-dev, or pip " \
    "install nvidia-nccl-cu13, or set NCCL_HOME=/path/to/nccl) and rebuild (make train_gpt_cu)"
typedef struct ncclComm* ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum { ncclSuccess = 0, ncclInvalidUsage = 5 } ncclResult_t;
typedef enum { ncclUint8, ncclUint64, ncclFloat, ncclFloat64, ncclBfloat16 } ncclDataType_t;
typedef enum { ncclSum } ncclRedOp_t;
static const char* ncclGetErrorString(ncclResult_t) { return "NCCL is not in this build"; }
static const char* ncclGetLastError(ncclComm_t) { return GPU_NO_NCCL_HINT; }
static ncclResult_t ncclGetVersion(int* v) { *v = 0; return ncclInvalidUsage; }
static ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInvalidUsage; }
static ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) { return ncclInvalidUsage; }
static ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*) { return ncclInvalidUsage; }
static ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }
static ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInvalidUsage; }
static ncclResult_t ncclGroupStart(void) { return ncclInvalidUsage; }
static ncclResult_t ncclGroupEnd(void) { return ncclInvalidUsage; }
static ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                      cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
    return ncclInvalidUsage;
}
static ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) { return ncclInvalidUsage; }
#endif
/* ncclCommSplit (NCCL 2.18 and later) builds the communicators per level (G6);
 * an older NCCL trains flat and refuses --hierarchical 1, saying why. */
#if GPU_HAVE_NCCL && defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
#define GPU_HAVE_SPLIT 1
#endif
#endif
#ifndef GPU_HAVE_SPLIT
#define GPU_HAVE_SPLIT 0
#endif

/* ncclGetLastError names the cause (a peer that vanished, a network error)
 * beyond the result code. The exit handler (G6) aborts the communicator, so
 * the other ranks do not wait forever in a collective this one left. */
#define NCCL_CHECK(call)                                                              \
    do {                                                                              \
        ncclResult_t nr_ = (call);                                                    \
        if (nr_ != ncclSuccess) {                                                     \
            fprintf(stderr, "error: %s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call, \
                    ncclGetErrorString(nr_), ncclGetLastError(NULL));                 \
            exit(EXIT_FAILURE);                                                       \
        }                                                                             \
    } while (0)

#endif /* GPTC_CUDA_NCCL_CUH */
