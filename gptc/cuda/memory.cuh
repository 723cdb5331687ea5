/* gptc/cuda/memory.cuh: the device-memory ledger and the host's waits on the GPU.
 * Included by train_gpt.cu after CUDA_CHECK and before the kernels (cuBLASLt's
 * set-up allocates through it). Defines GpuMemComponent (GMEM_*), GMEM_NAMES,
 * GpuLedger gpu_ledger, gpu_alloc, gpu_release, gpu_alloc_host,
 * gpu_release_host, gpu_watched_comm, gpu_comm_timeout_s and gpu_wait. */
#ifndef GPTC_CUDA_MEMORY_CUH
#define GPTC_CUDA_MEMORY_CUH

/* ---- The device-memory ledger ----
 * Every cudaMalloc and cudaMallocHost of the trainer goes through gpu_alloc
 * and gpu_alloc_host, which record the bytes by component; gpu_memory_plan
 * (G4) predicts the same components from the same size functions the
 * allocators call, and --plan-check 1 compares the two byte for byte
 * (gpu_plan_check, G7). Pinned host memory is counted apart from the
 * device's (it is host RAM). What is left out: NCCL's and cuBLASLt's own
 * allocations (not ours to see; the memory check's headroom, G4). */
typedef enum {
    GMEM_PARAMS,      /* bf16 weights, whole (forward and backward read them): P */
    GMEM_MASTER,      /* fp32 master weights: P, the ZeRO shard S, none with --offload 1 */
    GMEM_GRADS,       /* fp32 gradients: P; under ZeRO the buckets and the shard's summed gradient */
    GMEM_ADAMW,       /* AdamW's m and v: P each, S each under ZeRO, none with --offload 1 */
    GMEM_ZERO,        /* ZeRO: the shard's updated bf16 weights (S) and the shard map */
    GMEM_ACTS,        /* the activations kept for backward (gpu_activation_sizes, per --recompute) */
    GMEM_SCRATCH,     /* one layer's gradients, the classifier's and reductions' partials, the recompute working set */
    GMEM_CUBLASLT,    /* cuBLASLt's workspace and the bias copy */
    GMEM_STEP_INPUTS, /* tokens, the encoder's chunk buffers, the update's values (gpu_step_input_sizes) */
    GMEM_COMM,        /* the communicator's scalar slots (sums, fingerprints) */
    GMEM_TRANSIENT,   /* freed before the call returns (gpu_bf16_to_host): 0 between calls */
    GMEM_DEVICE,      /* (the number of device components) */
    /* pinned host memory (cudaMallocHost) */
    GMEM_HOST_STEP_INPUTS = GMEM_DEVICE, /* StepInputs' host copy */
    GMEM_HOST_LOSSES,  /* the micro-batches' losses and the norm */
    GMEM_HOST_COMM,    /* the communicator's slots' host copy */
    GMEM_HOST_OFFLOAD, /* --offload 1: the gradients' host copy (P fp32) */
    GMEM_COMPONENTS
} GpuMemComponent;

static const char* const GMEM_NAMES[GMEM_COMPONENTS] = {
    "bf16 weights", "fp32 master", "fp32 gradients", "AdamW moments", "ZeRO shard", "activations", "scratch",
    "cuBLASLt", "step inputs", "communicator", "transient",
    "pinned: step inputs", "pinned: losses", "pinned: communicator", "pinned: offload gradients"};

#define GPU_LEDGER_ENTRIES 64 /* live allocations at most (a run holds about 20) */
typedef struct {
    struct { const void* p; size_t bytes; int component; } live[GPU_LEDGER_ENTRIES];
    int num_live;
    size_t now[GMEM_COMPONENTS]; /* bytes held now, by component */
    size_t device, device_peak;  /* device bytes held now, and the most ever held at once */
} GpuLedger;

static GpuLedger gpu_ledger;

static void gpu_ledger_add(const void* p, size_t bytes, int component) {
    GpuLedger* l = &gpu_ledger;
    CHECK(l->num_live < GPU_LEDGER_ENTRIES, "gpu_ledger: more than %d live allocations: raise GPU_LEDGER_ENTRIES",
          GPU_LEDGER_ENTRIES);
    l->live[l->num_live].p = p;
    l->live[l->num_live].bytes = bytes;
    l->live[l->num_live].component = component;
    l->num_live++;
    l->now[component] += bytes;
    if (component < GMEM_DEVICE) {
        l->device += bytes;
        if (l->device > l->device_peak) l->device_peak = l->device;
    }
}

static void gpu_ledger_drop(const void* p) {
    GpuLedger* l = &gpu_ledger;
    for (int i = 0; i < l->num_live; i++) {
        if (l->live[i].p != p) continue;
        l->now[l->live[i].component] -= l->live[i].bytes;
        if (l->live[i].component < GMEM_DEVICE) l->device -= l->live[i].bytes;
        l->live[i] = l->live[--l->num_live];
        return;
    }
    CHECK(0, "gpu_ledger: %p was not allocated through gpu_alloc / gpu_alloc_host", p);
}

/* cudaMalloc of `bytes` for `component`, recorded (NULL for 0 bytes). */
static void* gpu_alloc(size_t bytes, int component) {
    ALWAYS(component >= 0 && component < GMEM_DEVICE);
    if (bytes == 0) return NULL;
    void* p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    gpu_ledger_add(p, bytes, component);
    return p;
}
static void gpu_release(void* p) {
    if (!p) return;
    gpu_ledger_drop(p);
    CUDA_CHECK(cudaFree(p));
}
/* cudaMallocHost (pinned host memory), recorded. */
static void* gpu_alloc_host(size_t bytes, int component) {
    ALWAYS(component >= GMEM_DEVICE && component < GMEM_COMPONENTS);
    void* p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    gpu_ledger_add(p, bytes, component);
    return p;
}
static void gpu_release_host(void* p) {
    if (!p) return;
    gpu_ledger_drop(p);
    CUDA_CHECK(cudaFreeHost(p));
}

/* The communicator the host watches while it waits (G6 sets it; NULL with
 * one process), and how long a wait may last. File scope because the exit
 * handler (G6) needs the communicator too. */
static ncclComm_t gpu_watched_comm = NULL;
static double gpu_comm_timeout_s = 1800.0;

/* Wait on the host until the work queued on `stream` (or, when `event` is
 * given, up to that event) is done. Alone, a plain synchronize. With other
 * ranks, poll instead: if a peer died, the NCCL kernels queued before would
 * spin forever and a synchronize would never return; ncclCommGetAsyncError
 * reports the broken connection, and a wait longer than --comm-timeout is
 * taken for a hung peer. Either ends the process (the exit handler aborts
 * the communicator, so the failure spreads instead of hanging). */
static void gpu_wait(cudaStream_t stream, cudaEvent_t event) {
    if (!gpu_watched_comm) {
        if (event) CUDA_CHECK(cudaEventSynchronize(event));
        else CUDA_CHECK(cudaStreamSynchronize(stream));
        return;
    }
    double t0 = time_ms();
    for (;;) {
        cudaError_t st = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (st == cudaSuccess) return;
        if (st != cudaErrorNotReady) CUDA_CHECK(st);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(gpu_watched_comm, &async));
        if (async != ncclSuccess) {
            fprintf(stderr, "error: NCCL reports %s (%s): another rank failed or the network broke; stopping\n",
                    ncclGetErrorString(async), ncclGetLastError(NULL));
            exit(EXIT_FAILURE);
        }
        if (time_ms() - t0 > gpu_comm_timeout_s * 1000.0) {
            fprintf(stderr, "error: the GPU made no progress for %.0f s while waiting on a collective: another rank "
                    "hangs or died without a word; stopping (--comm-timeout sets the limit)\n", gpu_comm_timeout_s);
            exit(EXIT_FAILURE);
        }
        sched_yield();
    }
}

#endif /* GPTC_CUDA_MEMORY_CUH */
