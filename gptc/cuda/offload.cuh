/* gptc/cuda/offload.cuh: the optimizer offload (--offload 1, ZeRO-Offload).
 * Included by train_gpt.cu after the model's update (gpu_offload_wait and
 * friends are declared before the forward, which calls them). Defines
 * OffloadPiece, struct GpuOffload, bf16_round_range_kernel, gpu_offload_init,
 * gpu_offload_free, gpu_offload_sync, gpu_offload_wait,
 * gpu_offload_grads_zeroed and gpu_offload_update. */
#ifndef GPTC_CUDA_OFFLOAD_CUH
#define GPTC_CUDA_OFFLOAD_CUH

/* ---- Optimizer offload (--offload 1, ZeRO-Offload) ----------------------
 * Tested by scripts/tests/test_gpu_plan.sh (the same model bytes as the run without it, the overlap
 * counted, a missing wait planted and caught). The fp32 master weights and
 * AdamW's moments stay on the host: they are the host model's own
 * params_memory, m_memory and v_memory (P floats each, pinned with
 * cudaHostRegister), so samples, checkpoints and training states read them
 * where they are. The device keeps the bf16 weights and the fp32 gradients:
 * 12 bytes per parameter less (the memory plan's master and moments).
 *
 * The update goes in the order the next forward reads the weights, in L + 2
 * pieces: piece 0 is wte and wpe (the encoder's; the classifier reads wte
 * too), piece 1 + l is layer l's slice of each of the 12 stacked tensors
 * (ln1w (L, C), qkvw (L, 3C, C), ... fcprojb (L, C): 12 ranges of the flat
 * buffer), piece L + 1 is lnfw and lnfb. Per piece:
 *   1. its gradients go to pinned host memory, on a copy stream (every
 *      piece's queued at once, an event after each);
 *   2. on the update stream, after that event, a host function
 *      (offload_piece_adamw, cudaLaunchHostFunc) scales them by the clip
 *      coefficient (clip_coef: the kernel's own float arithmetic) and runs
 *      train_gpt.c's OpenMP AdamW over each range (adamw_update_range: the
 *      expression of adamw_element, in the same order);
 *   3. behind it on that stream: the new master into the gradient buffer's
 *      slots (their gradients left in step 1), bf16_round_range_kernel rounds
 *      it with adamw_kernel's seed (step seed x 16 + tensor) and element index
 *      within the tensor (the bf16 weights adamw_kernel would have written
 *      from that master, bit for bit), the slots are zeroed for the next
 *      backward, and the piece's event `updated` is recorded.
 * Why a host function: the host thread queues all of this and returns, and
 * goes on to launch the next step's forward while the CPU runs AdamW (in a
 * thread of the CUDA driver: OpenMP inside it is allowed; CUDA calls are
 * not, and it makes none: it reads and writes host arrays only). The stream
 * orders it: after the copy of its gradients, before the copy back of its
 * master. A worker thread of our own would need that ordering rebuilt
 * (events polled, or the host blocking on them).
 * What overlaps now: the next forward, on the compute stream, waits for
 * piece 0 before the encoder, piece 1 + l before layer l, piece L + 1 before
 * the final layernorm (gpu_offload_wait), so layer l runs as soon as its
 * weights are updated, while the host still updates the layers after it;
 * and the copies of later pieces to the host, the copy back and rounding of
 * earlier ones, with the host's AdamW of a piece. Those waits are on events
 * this update recorded before it returned, so each waits for this update's
 * piece (a wait on an event not yet recorded waits for nothing). The
 * backward waits for the last piece (every gradient slot zeroed: after an
 * update dp_zero_grad's memset is skipped, gpu_offload_grads_zeroed). The
 * host waits for the update (gpu_offload_sync) before it reads or writes
 * the host arrays itself: samples and checkpoints, a resume's or a
 * rollback's upload; a snapshot's stream waits for the last piece (and the
 * Saver's thread must have copied the snapshot out of the host arrays
 * before the next update writes them: the loop waits for it, while the
 * GPU still runs the backward); the next
 * update waits for the last one's host functions (done already: the
 * backward waited for them). Not overlapped: the forward's layer l with the
 * host's AdamW of layer l itself. CUDA graphs are off with --offload 1: a
 * captured forward could not wait for events recorded outside its capture
 * (gpu_train_setup says so). Counted for the log: at the first forward
 * launched after each update, the pieces whose host AdamW had not finished
 * when layer 0 was launched (gpu_offload_free prints "offload: ...").
 * Same training: on the CPU execution layer host and kernel are the same
 * compiler's arithmetic (no FMA contraction without -march), so the model
 * bytes are equal; on a GPU nvcc contracts a*b+c into FMAs (--fmad=true by
 * default) and the fp32 master may differ by an ulp or so per step from the
 * kernel's, which changes a stochastically rounded bf16 weight only where the
 * master sits within that ulp of a rounding threshold (about 2^-16 of
 * them per step): expect agreement to within bf16 noise, not bitwise. */

#define OFFLOAD_MAX_RANGES (LAYER_TENSORS_END - LAYER_TENSORS_BEGIN) /* a layer's 12 slices */

typedef struct {
    struct GpuOffload* off;
    int ranges;                       /* how many ranges of the flat buffer: 2, 12 or 2 */
    int tensor[OFFLOAD_MAX_RANGES];   /* each one's tensor k (file order) */
    size_t lo[OFFLOAD_MAX_RANGES];    /* where it starts in the flat buffer (P) */
    size_t n[OFFLOAD_MAX_RANGES];     /* its length */
    size_t first[OFFLOAD_MAX_RANGES]; /* its first element's index within tensor k (the rounding's index) */
    cudaEvent_t copied;               /* copy stream: its gradients are on the host */
    cudaEvent_t updated;              /* update stream: its bf16 weights written, its gradient slots zeroed */
} OffloadPiece;

struct GpuOffload {
    GPT2* host;           /* the host model: its params_memory, m_memory, v_memory are the state */
    float* grads;         /* (P) pinned: the gradients' host copy */
    cudaStream_t copy;    /* the gradients' device-to-host copies */
    cudaStream_t update;  /* the host functions, the copies back, the rounding, the zeroing */
    cudaEvent_t ready;    /* compute stream: the gradients are final */
    int pieces;           /* L + 2 */
    OffloadPiece* piece;  /* (pieces) in the forward's order */
    /* the update the host functions run: set before they are queued, unchanged until they have all run */
    AdamWConfig opt;
    float lr, coef;
    int t;
    int done;             /* pieces whose host function has returned (atomic: the driver's thread counts) */
    int zeroed;           /* the last update zeroed the gradients (dp_zero_grad's memset not needed) */
    int launched;         /* an update is queued and no forward launched since */
    long long updates, followed, overlapped, pending_sum; /* the overlap's count (above) */
};

/* bf16_round_stochastic_kernel for elements [first, first + n) of a tensor
 * (out and in start at element first): the index the rounding hashes is
 * the element's within the tensor, as in adamw_kernel. */
__global__ void bf16_round_range_kernel(floatX* out, const float* in, size_t n, size_t first, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_round_stochastic(in[i], hash_u32((uint32_t)(first + i) ^ hash_u32(seed)));
}

static void gpu_offload_init(GpuGPT2* g, GPT2* host) {
    size_t P = g->num_parameters, L = (size_t)g->config.num_layers;
    g->offload = 1;
    g->off_host = host;
    if (!host->m_memory) host->m_memory = ledger_floats(MEM_ADAMW, P); /* (gpt2_free frees them) */
    if (!host->v_memory) host->v_memory = ledger_floats(MEM_ADAMW, P);
    float* arrays[3] = {host->params_memory, host->m_memory, host->v_memory};
    for (int k = 0; k < 3; k++) CUDA_CHECK(cudaHostRegister(arrays[k], P * sizeof(float), cudaHostRegisterDefault));
    GpuOffload* o = (GpuOffload*)xmalloc(sizeof(GpuOffload));
    memset(o, 0, sizeof(*o));
    o->host = host;
    o->grads = (float*)gpu_alloc_host(P * sizeof(float), GMEM_HOST_OFFLOAD);
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->copy, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&o->update, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&o->ready, cudaEventDisableTiming));
    o->pieces = (int)L + 2;
    o->piece = (OffloadPiece*)xmalloc(sizeof(OffloadPiece) * (size_t)o->pieces);
    memset(o->piece, 0, sizeof(OffloadPiece) * (size_t)o->pieces);
    size_t start[NUM_PARAMETER_TENSORS], at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        start[k] = at;
        at += g->param_sizes[k];
    }
    for (int p = 0; p < o->pieces; p++) {
        OffloadPiece* pc = &o->piece[p];
        pc->off = o;
        int layer = p >= 1 && p <= (int)L;
        int k0 = p == 0 ? 0 : layer ? LAYER_TENSORS_BEGIN : LAYER_TENSORS_END;
        int k1 = p == 0 ? LAYER_TENSORS_BEGIN : layer ? LAYER_TENSORS_END : NUM_PARAMETER_TENSORS;
        ALWAYS(k1 - k0 <= OFFLOAD_MAX_RANGES);
        for (int k = k0; k < k1; k++) {
            size_t per = layer ? g->param_sizes[k] / L : g->param_sizes[k]; /* layer l's slice, or the whole tensor */
            size_t first = layer ? (size_t)(p - 1) * per : 0;
            pc->tensor[pc->ranges] = k;
            pc->first[pc->ranges] = first;
            pc->lo[pc->ranges] = start[k] + first;
            pc->n[pc->ranges] = per;
            pc->ranges++;
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&pc->copied, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&pc->updated, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventRecord(pc->updated, o->update)); /* (a forward before the first update waits for nothing) */
    }
    g->off = o;
    gpu_weights_upload(g, host->params_memory, NULL, NULL, 0, -1); /* the bf16 weights, rounded to nearest */
}

static void gpu_offload_free(GpuGPT2* g) {
    if (!g->offload) return;
    GpuOffload* o = g->off;
    gpu_wait(o->update, NULL);
    gpu_wait(o->copy, NULL);
    if (o->updates > 0)
        printf("offload: %lld updates; after %lld of the %lld followed by a forward, that forward's layer 0 was launched "
               "while the host's AdamW still had pieces to run (%.1f of %d on average)\n", o->updates, o->overlapped,
               o->followed, o->followed ? (double)o->pending_sum / (double)o->followed : 0.0, o->pieces);
    float* arrays[3] = {o->host->params_memory, o->host->m_memory, o->host->v_memory};
    for (int k = 0; k < 3; k++) CUDA_CHECK(cudaHostUnregister(arrays[k]));
    gpu_release_host(o->grads);
    CUDA_CHECK(cudaEventDestroy(o->ready));
    for (int p = 0; p < o->pieces; p++) {
        CUDA_CHECK(cudaEventDestroy(o->piece[p].copied));
        CUDA_CHECK(cudaEventDestroy(o->piece[p].updated));
    }
    CUDA_CHECK(cudaStreamDestroy(o->copy));
    CUDA_CHECK(cudaStreamDestroy(o->update));
    free(o->piece);
    free(o);
    g->off = NULL;
    g->offload = 0;
}

static void gpu_offload_sync(const GpuGPT2* g) {
    if (g->offload) gpu_wait(g->off->update, NULL); /* (its last work waited for the copy stream's) */
}

static void gpu_offload_wait(const GpuGPT2* g, cudaStream_t s, int piece) {
    if (!g->offload) return;
    GpuOffload* o = g->off;
    if (piece < 0) piece = o->pieces - 1;
    ALWAYS(piece < o->pieces && !g->graphs); /* (graphs are off with --offload 1: gpu_train_setup) */
    if (piece == 0 && s == g->stream && o->launched) { /* the first forward after an update: still running? */
        int pending = o->pieces - __atomic_load_n(&o->done, __ATOMIC_ACQUIRE);
        o->followed++;
        o->overlapped += pending > 0;
        o->pending_sum += pending;
        o->launched = 0;
    }
    CUDA_CHECK(cudaStreamWaitEvent(s, o->piece[piece].updated, 0));
}

static int gpu_offload_grads_zeroed(GpuGPT2* g) {
    if (!g->offload || !g->off->zeroed) return 0;
    g->off->zeroed = 0;
    return 1;
}

/* Step 2 above, for one piece: run by the update stream (cudaLaunchHostFunc)
 * once the piece's gradients are on the host. Host arrays only, no CUDA. */
static void CUDART_CB offload_piece_adamw(void* arg) {
    const OffloadPiece* pc = (const OffloadPiece*)arg;
    GpuOffload* o = pc->off;
    GPT2* h = o->host;
    float coef = o->coef;
    for (int r = 0; r < pc->ranges; r++) {
        size_t lo = pc->lo[r], n = pc->n[r];
        float* gk = o->grads + lo;
        if (coef != 1.0f) {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++) gk[i] = gk[i] * coef; /* (adamw_kernel: grad[i] * clip_coef) */
        }
        adamw_update_range(h, &o->opt, o->lr, o->t, lo, lo + n, gk, h->m_memory + lo, h->v_memory + lo);
    }
    __atomic_add_fetch(&o->done, 1, __ATOMIC_RELEASE);
}

/* Update t on the host (above): `norm` is the gradients' global norm
 * (gpu_grad_norm: the device's fp32 value), `seed` the step's stochastic
 * rounding seed. Returns with everything queued: the host does not wait. */
static void gpu_offload_update(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed,
                               float norm) {
    GpuOffload* o = g->off;
    GPT2* h = o->host;
    /* the last update's host functions have run (this step's backward waited for them), so their arguments may
     * change now: a wait for what is done already */
    gpu_wait(o->update, NULL);
    o->opt = *opt;
    o->lr = lr;
    o->t = t;
    o->coef = clip_coef(norm, max_norm);
    __atomic_store_n(&o->done, 0, __ATOMIC_RELEASE);
    CUDA_CHECK(cudaEventRecord(o->ready, g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(o->copy, o->ready, 0));
    for (int p = 0; p < o->pieces; p++) { /* 1. every piece's gradients to the host, queued */
        OffloadPiece* pc = &o->piece[p];
        for (int r = 0; r < pc->ranges; r++)
            CUDA_CHECK(cudaMemcpyAsync(o->grads + pc->lo[r], g->grads_memory + pc->lo[r], pc->n[r] * sizeof(float),
                                       cudaMemcpyDeviceToHost, o->copy));
        CUDA_CHECK(cudaEventRecord(pc->copied, o->copy));
    }
    for (int p = 0; p < o->pieces; p++) {
        OffloadPiece* pc = &o->piece[p];
        CUDA_CHECK(cudaStreamWaitEvent(o->update, pc->copied, 0));
        CUDA_CHECK(cudaLaunchHostFunc(o->update, offload_piece_adamw, pc)); /* 2. AdamW on the host */
        for (int r = 0; r < pc->ranges; r++) { /* 3. the master back into the slot, rounded, the slot zeroed */
            size_t lo = pc->lo[r], n = pc->n[r];
            CUDA_CHECK(cudaMemcpyAsync(g->grads_memory + lo, h->params_memory + lo, n * sizeof(float),
                                       cudaMemcpyHostToDevice, o->update));
            bf16_round_range_kernel<<<ceil_div((long long)n, 256), 256, 0, o->update>>>(
                g->params_memory + lo, g->grads_memory + lo, n, pc->first[r], seed * 16u + (uint32_t)pc->tensor[r]);
            KERNEL_CHECK();
            CUDA_CHECK(cudaMemsetAsync(g->grads_memory + lo, 0, n * sizeof(float), o->update));
        }
        CUDA_CHECK(cudaEventRecord(pc->updated, o->update));
    }
    o->zeroed = 1;
    o->launched = 1;
    o->updates++;
}

#endif /* GPTC_CUDA_OFFLOAD_CUH */
