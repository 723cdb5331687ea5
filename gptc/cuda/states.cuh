/* gptc/cuda/states.cuh: training states fed from the GPU (snapshots of the device's state).
 * Included by train_gpt.cu before GpuTrainState. Defines GpuSnapshots,
 * gpu_snapshots_init, gpu_snapshots_free, gpu_snapshot_start,
 * gpu_snapshot_hand_over and gpu_states_problem. */
#ifndef GPTC_CUDA_STATES_CUH
#define GPTC_CUDA_STATES_CUH

/* ---- training states ------------------------------------------------------ */
/* train_gpt.c's Saver, fed from the GPU (one GPU or several, any --zero:
 * every rank's host arrays hold the whole flat state, each rank saves its
 * slice of it; the Dist given to the Saver says --zero 0, the flat layout,
 * whatever --zero the GPUs run, so the header's zero field is 0). Under
 * --zero 1|2 a snapshot gathers the shards into the host arrays at once
 * (dp_state_to_host) instead of the side-stream copies below, and a resume
 * or a rollback packs them out again (dp_state_upload). Its arrays are the
 * host model's params_memory, m_memory and v_memory, pinned. At the boundary after a
 * snapshot step the update is done on the compute stream; an event there
 * starts three device-to-host copies (master, m, v) on a stream of their
 * own, which overlap the next step's forward and backward: those read only
 * the bf16 weights. Before the next update (the only thing that changes
 * master, m and v) the host waits for them and hands the arrays to the
 * Saver (saver_snapshot), whose thread copies them into a slot meanwhile;
 * the host arrays are not written again (next copies, samples, a rollback)
 * before saver_before_update says that copy is done. So the Saver sees each
 * snapshot one step later than train() does, with the run as it was at the
 * snapshot's boundary (data position, sampler, loss window: `at`). One set
 * of host arrays: with --snapshot-every 1 the Saver's copy must be done by
 * the next boundary (what it does not hide is its stall, printed at the end). */
typedef struct {
    cudaStream_t stream; /* non-blocking: the copies overlap the compute stream */
    cudaEvent_t updated; /* compute stream: the snapshot step's update is done */
    cudaEvent_t copied;  /* copy stream: master, m and v are in the host arrays */
    int pending;         /* copies started and not yet handed to the Saver */
    int step, save;      /* theirs: the step, and whether it goes to disk too */
    TrainRun at;         /* the run at that boundary (only what state_info_of reads counts) */
    float* params;       /* (P) the host arrays, pinned: host->params_memory, m_memory, v_memory */
    float* m;            /* (P) */
    float* v;            /* (P) */
    size_t P;
    int registered;      /* this pinned the arrays (else gpu_offload_init did) */
} GpuSnapshots;

/* Give the host model its AdamW moments (as gpt2_alloc_training does; zeros,
 * so gpt2_free frees them) and pin the three arrays. */
static void gpu_snapshots_init(GpuSnapshots* gs, GPT2* host, int pinned) {
    memset(gs, 0, sizeof(*gs));
    gs->P = host->num_parameters;
    /* in the host ledger, as the CPU trainer's (gptc/ledger.h: huge pages, touched in parallel at start, written
     * by a hot spare before it waits: big_write_all) */
    if (!host->m_memory) host->m_memory = ledger_floats(MEM_ADAMW, gs->P);
    if (!host->v_memory) host->v_memory = ledger_floats(MEM_ADAMW, gs->P);
    gs->params = host->params_memory;
    gs->m = host->m_memory;
    gs->v = host->v_memory;
    float* arrays[3] = {gs->params, gs->m, gs->v};
    gs->registered = !pinned; /* (--offload 1 pinned them already: gpu_offload_init) */
    for (int k = 0; k < 3 && gs->registered; k++)
        CUDA_CHECK(cudaHostRegister(arrays[k], gs->P * sizeof(float), cudaHostRegisterDefault));
    CUDA_CHECK(cudaStreamCreateWithFlags(&gs->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&gs->updated, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&gs->copied, cudaEventDisableTiming));
}

static void gpu_snapshots_free(GpuSnapshots* gs) {
    if (!gs->stream) return;
    gpu_wait(gs->stream, NULL); /* (polls: with other ranks its copies may wait behind collectives) */
    CUDA_CHECK(cudaEventDestroy(gs->updated));
    CUDA_CHECK(cudaEventDestroy(gs->copied));
    CUDA_CHECK(cudaStreamDestroy(gs->stream));
    float* arrays[3] = {gs->params, gs->m, gs->v};
    for (int k = 0; k < 3 && gs->registered; k++) CUDA_CHECK(cudaHostUnregister(arrays[k]));
    memset(gs, 0, sizeof(*gs));
}

/* At the boundary after step `step` (its update queued on the compute
 * stream): start copying master, m and v to the host. Under ZeRO the shards
 * are gathered into the flat arrays here and now (dp_state_to_host: a
 * collective, every rank at the same boundary), and the "copies" are done
 * when this returns. */
static void gpu_snapshot_start(GpuSnapshots* gs, Saver* sv, GpuDataParallel* dp, const TrainRun* r, int step,
                               int save) {
    const GpuGPT2* g = dp->g;
    ALWAYS(!gs->pending);
    saver_before_update(sv); /* the Saver's thread has copied the last snapshot out of the host arrays */
    if (dp->zero > 0) {
        dp_state_to_host(dp, gs->params, gs->m, gs->v);
    } else if (g->offload) { /* the host arrays are the state (the update runs on the host): nothing to copy, */
        ALWAYS(gs->params == g->off_host->params_memory && gs->m == g->off_host->m_memory);
        gpu_offload_wait(g, gs->stream, -1); /* once the update's last piece is done */
    } else {
        CUDA_CHECK(cudaEventRecord(gs->updated, g->stream));
        CUDA_CHECK(cudaStreamWaitEvent(gs->stream, gs->updated, 0));
        size_t bytes = gs->P * sizeof(float);
        CUDA_CHECK(cudaMemcpyAsync(gs->params, g->master_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
        CUDA_CHECK(cudaMemcpyAsync(gs->m, g->m_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
        CUDA_CHECK(cudaMemcpyAsync(gs->v, g->v_memory, bytes, cudaMemcpyDeviceToHost, gs->stream));
    }
    CUDA_CHECK(cudaEventRecord(gs->copied, gs->stream));
    gs->at = *r; /* a shallow copy: state_info_of reads its numbers, nothing reads through its pointers */
    gs->step = step;
    gs->save = save;
    gs->pending = 1;
}

/* Before the next update (or whatever else needs the host arrays): wait for
 * the copies and hand the snapshot to the Saver, which copies it into a
 * slot in the background. (The wait is not counted as the Saver's stall:
 * the copies run on the copy engines beside the forward and backward the
 * host is waiting for anyway; what they do not hide shows in the step's ms.) */
static void gpu_snapshot_hand_over(GpuSnapshots* gs, Saver* sv, const Dist* d, const GPT2* host, const Options* o) {
    if (!gs->pending) return;
    gpu_wait(gs->stream, gs->copied);
    saver_snapshot(sv, &gs->at, d, host, o, gs->step, gs->save);
    gs->pending = 0;
}

/* Why this run cannot keep training states (NULL: it can). */
static const char* gpu_states_problem(const GpuComm* comm, const Options* o) {
    (void)o; /* (any --zero: under ZeRO the shards are gathered into the flat state, dp_state_to_host) */
#ifdef USE_MPI
    if (comm->world > 1 && !comm->mpi)
        return "several ranks keep their states together through MPI (train_gpt.c's Saver): launch with --init mpi";
#else
    if (comm->world > 1)
        return "several ranks keep their states together through MPI (train_gpt.c's Saver): build train_gpt_cu_mpi "
               "(make train_gpt_cu_mpi) and launch with --init mpi";
#endif
    return NULL;
}

#endif /* GPTC_CUDA_STATES_CUH */
