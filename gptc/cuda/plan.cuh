/* gptc/cuda/plan.cuh: the device-memory plan, the start-up memory check and --plan.
 * Included by train_gpt.cu after the model's structs and the communicator
 * (comm.cuh, levels.cuh). Defines GpuPlanKnobs, dp_sizes, GpuZeroPPSizes,
 * gpu_zeropp_sizes, dp_weight_elems, MemoryPlan, gpu_memory_plan_for,
 * gpu_memory_plan, memory_plan_print, MemoryHeadroom, memory_check,
 * gpu_memory_headroom, gpu_plan_knobs and gpu_plan_check (--plan-check 1);
 * --plan's candidates and their step times are runtime.cuh's. */
#ifndef GPTC_CUDA_PLAN_CUH
#define GPTC_CUDA_PLAN_CUH

/* ---- The memory plan: the device's bytes by component, computed with the
 * size functions the allocators call, so plan and allocation cannot drift;
 * --plan-check 1 proves them equal against the ledger (memory.cuh;
 * scripts/tests/test_gpu_plan.sh) ---- */

/* What the plan holds and what it leaves out. In: every buffer of ours (G1's
 * components). Zero by construction: snapshots (the host model's arrays,
 * cudaHostRegister'ed, and under ZeRO the gradient buckets as staging, free
 * between steps), --gelu-fusion (its epilogue's aux output is fch, an
 * activation), --cuda-graphs (no buffers of ours; the graphs' own memory is
 * the driver's). Out, beside the plan in the start-up check's headroom:
 * NCCL's channel buffers and cuBLASLt's and the CUDA context's own memory,
 * which we do not allocate (memory_headroom_print says what is measured and
 * what is an allowance); the offloaded master and moments are host memory
 * (`offloaded`, the host model's arrays, pinned). */

/* What the device memory depends on, for one rank (the model aside). */
typedef struct {
    int B, T;
    int recompute;     /* --recompute 0..3 */
    int zero;          /* --zero 0..3 */
    int rank, world;
    int comm;          /* an NCCL communicator: several ranks, or ZeRO even on one (gpu_comm_init) */
    int offload;       /* --offload 1: master weights and moments in pinned host memory (G8) */
    int qwz, qgz, feedback, hpz, block, nodes; /* ZeRO++ on --zero 3 (gpu_zeropp_sizes); nodes: gpu_levels_init's */
} GpuPlanKnobs;

/* ZeRO's per-rank sizes (dp_layout's): S, the shard's elements, and the
 * gradient buckets' floats (ZeRO-1: all L + 1 buckets padded; ZeRO-2 and 3
 * two layer slots and the rest's bucket; 0 without ZeRO). */
static void dp_sizes(const GPT2Config* c, int zero, int rank, int world, ShardMap* map, size_t* shard,
                     size_t* grad_floats) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    shard_map_init(map, sizes, c->num_layers, rank, world);
    *shard = shard_map_elements(map);
    *grad_floats = zero == 1 ? *shard * (size_t)world
                 : zero >= 2 ? (2 * map->layer.piece + map->rest.piece) * (size_t)world : 0;
}

/* ZeRO++'s device buffers on a rank (gpu_zeropp_init allocates
 * them, the memory plan counts them: both call this). Every piece of a
 * bucket has the same length (the layer's or the rest's piece), so a slot
 * is the same size on every rank: sb = quant_slot_bytes(piece) (gptc/quant.h).
 *   slot_of, who  (W ints each) the place of rank q's slot in (local, node)
 *                 order, and its inverse;
 *   send, recv    (W sb bytes each, sb of the larger piece in INT8): qwZ's
 *                 gathered slots (send only), qgZ's outgoing and incoming;
 *   partial       qgZ (N piece floats): hop 0's N partial sums;
 *   secondary     hpZ (N S bf16): this local index's part of every bucket;
 *   residual      --qgz-feedback ((W + N) S floats): hop 0's by (rank, place
 *                 in the shard), hop 1's by (node, place in the shard). */
typedef struct {
    size_t slots, partial, secondary, residual, ints; /* bytes each send/recv buffer; floats; bf16; floats; ints */
    int slot_buffers;                                  /* 0, 1 (qwZ) or 2 (qgZ) */
} GpuZeroPPSizes;

static GpuZeroPPSizes gpu_zeropp_sizes(const ShardMap* map, size_t S, int W, int N, int qwz, int qgz, int feedback,
                                       int hpz, int block) {
    GpuZeroPPSizes z;
    memset(&z, 0, sizeof(z));
    if (!(qwz || qgz || hpz)) return z;
    size_t most = map->layer.piece > map->rest.piece ? map->layer.piece : map->rest.piece;
    z.ints = 2 * (size_t)W;
    z.slot_buffers = qgz ? 2 : qwz ? 1 : 0;
    z.slots = z.slot_buffers ? (size_t)W * quant_slot_bytes(most, 8, block) : 0;
    z.partial = qgz ? (size_t)N * most : 0;
    z.secondary = hpz ? (size_t)N * S : 0;
    z.residual = feedback ? (size_t)(W + N) * S : 0;
    return z;
}

static size_t gpu_zeropp_bytes(const GpuZeroPPSizes* z) {
    return z->ints * sizeof(int) + (size_t)z->slot_buffers * z->slots + z->partial * sizeof(float) +
           z->secondary * sizeof(floatX) + z->residual * sizeof(float);
}

/* The bf16 weights on the device (GpuGPT2's params_memory): all P, or under
 * ZeRO-3 the gathered head (the rest's bucket, padded) and two gathered
 * layers (G6: the bucket layout, W pieces each). */
static size_t dp_weight_elems(const ShardMap* map, int zero, size_t P) {
    return zero == 3 ? (map->rest.piece + 2 * map->layer.piece) * (size_t)map->world : P;
}

/* What the plan says, in bytes, before allocating. */
typedef struct {
    size_t bytes[GMEM_COMPONENTS]; /* by component (G1's names); device ones first, then pinned host */
    size_t attention; /* of the activations: flash attention's log-sum-exp, all it keeps (L, B, NH, T) */
    int recompute;    /* the level planned (--recompute) */
    size_t work;      /* of the scratch: one layer's working set of what that level recomputes */
    size_t activations_at[RECOMPUTE_LEVELS]; /* the activations each level would keep, to compare */
    size_t offloaded; /* --offload 1: the host's fp32 master and moments (12 P; the host model's own arrays, pinned) */
} MemoryPlan;

static MemoryPlan gpu_memory_plan_for(const GPT2Config* c, const GpuPlanKnobs* k) {
    MemoryPlan p;
    memset(&p, 0, sizeof(p));
    int B = k->B, T = k->T, recompute = k->recompute;
    size_t P = parameter_count(c), n[32], bytes[32];
    /* the model state (gpu_model_init_with, dp_init): whole on one GPU or under --zero 0, else ZeRO's shard */
    p.bytes[GMEM_PARAMS] = P * sizeof(floatX);
    if (k->zero > 0 && k->comm) {
        ShardMap map;
        size_t S, grad_floats;
        dp_sizes(c, k->zero, k->rank, k->world, &map, &S, &grad_floats);
        p.bytes[GMEM_PARAMS] = dp_weight_elems(&map, k->zero, P) * sizeof(floatX); /* ZeRO-3: head + 2 layers */
        p.bytes[GMEM_MASTER] = S * sizeof(float);
        p.bytes[GMEM_GRADS] = (grad_floats + S) * sizeof(float); /* the buckets, and the shard's sum */
        p.bytes[GMEM_ADAMW] = 2 * S * sizeof(float);
        p.bytes[GMEM_ZERO] = S * sizeof(floatX) + sizeof(ShardMap);
        if (k->zero == 3) { /* ZeRO++'s buffers */
            GpuZeroPPSizes z = gpu_zeropp_sizes(&map, S, k->world, k->nodes, k->qwz, k->qgz, k->feedback, k->hpz,
                                                k->block);
            p.bytes[GMEM_ZERO] += gpu_zeropp_bytes(&z);
        }
    } else {
        p.bytes[GMEM_GRADS] = P * sizeof(float);
        if (k->offload) {
            p.bytes[GMEM_HOST_OFFLOAD] = P * sizeof(float);
            p.offloaded = 3 * P * sizeof(float);
        } else {
            p.bytes[GMEM_MASTER] = P * sizeof(float);
            p.bytes[GMEM_ADAMW] = 2 * P * sizeof(float);
        }
    }
    /* activations and scratch (gpu_model_init_with's tables) */
    p.recompute = recompute;
    for (int r = 0; r < RECOMPUTE_LEVELS; r++) {
        gpu_activation_sizes(n, bytes, c, B, T, r);
        p.activations_at[r] = carve_bytes(n, bytes, NUM_GPU_ACTIVATIONS);
    }
    gpu_activation_sizes(n, bytes, c, B, T, recompute);
    p.bytes[GMEM_ACTS] = carve_bytes(n, bytes, NUM_GPU_ACTIVATIONS);
    p.attention = n[6] * bytes[6]; /* lse (0 at level 3: recomputed with the layer) */
    gpu_scratch_sizes(n, bytes, c, B, T, recompute);
    p.bytes[GMEM_SCRATCH] = carve_bytes(n, bytes, NUM_GPU_SCRATCH);
    p.work = n[NUM_GPU_SCRATCH - 1];
    p.bytes[GMEM_CUBLASLT] = LT_WORKSPACE_BYTES + LT_BIAS_COPY_ELEMS(c) * sizeof(floatX); /* (lt_init) */
    gpu_step_input_sizes(n, bytes, B, T, c->vocab_size);
    p.bytes[GMEM_STEP_INPUTS] = p.bytes[GMEM_HOST_STEP_INPUTS] = carve_bytes(n, bytes, NUM_STEP_INPUTS);
    p.bytes[GMEM_HOST_LOSSES] = (MAX_MICRO_STEPS + 1) * sizeof(float);
    if (k->comm) p.bytes[GMEM_COMM] = p.bytes[GMEM_HOST_COMM] = gpu_comm_slots(k->world) * sizeof(uint64_t);
    return p;
}

/* One GPU, --zero 0 (test_gpt.cu's plans). */
[[maybe_unused]] static MemoryPlan gpu_memory_plan(const GPT2Config* c, int B, int T, int recompute) {
    GpuPlanKnobs k = {B, T, recompute, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    return gpu_memory_plan_for(c, &k);
}

/* Device bytes in the plan (pinned host memory apart). */
static size_t memory_plan_total(const MemoryPlan* p) {
    size_t t = 0;
    for (int i = 0; i < GMEM_DEVICE; i++) t += p->bytes[i];
    return t;
}
static size_t memory_plan_pinned(const MemoryPlan* p) {
    size_t t = 0;
    for (int i = GMEM_DEVICE; i < GMEM_COMPONENTS; i++) t += p->bytes[i];
    return t;
}

/* The names of the per-layer activations level r keeps (kept 1) or
 * recomputes (kept 0), comma separated into out. */
static void recompute_names(char* out, size_t cap, int r, int kept) {
    size_t at = 0;
    out[0] = '\0';
    for (int i = GPU_ACTS_LAYER_BEGIN; i < GPU_ACTS_LAYER_END && at < cap; i++)
        if (gpu_act_kept(i, r) == kept)
            at += (size_t)snprintf(out + at, cap - at, "%s%s", at ? ", " : "", GPU_ACTIVATION_NAMES[i]);
    if (!out[0]) snprintf(out, cap, "nothing");
}

static void memory_plan_print(const MemoryPlan* p) {
    double mb = 1.0 / (1024.0 * 1024.0);
    char parts[1024];
    size_t at = 0;
    for (int i = 0; i < GMEM_DEVICE; i++)
        if (p->bytes[i] && at < sizeof(parts))
            at += (size_t)snprintf(parts + at, sizeof(parts) - at, "%s%s %.1f", at ? ", " : "", GMEM_NAMES[i],
                                   p->bytes[i] * mb);
    printf("memory plan (device MB): %s: total %.1f MB (attention keeps %.1f MB of row statistics, nothing T x T); "
           "pinned host %.1f MB%s\n", parts, memory_plan_total(p) * mb, p->attention * mb, memory_plan_pinned(p) * mb,
           p->offloaded ? " (+ the host's master weights and moments, pinned: --offload 1)" : "");
    char kept[256], redone[256];
    recompute_names(kept, sizeof(kept), p->recompute, 1);
    recompute_names(redone, sizeof(redone), p->recompute, 0);
    printf("recompute %d: activations at levels 0/1/2/3: %.0f / %.0f / %.0f / %.0f MB; level %d keeps per layer %s; "
           "recomputes in backward %s (into one layer's working set of %.0f MB, in the scratch): saves %.0f MB "
           "against level 0 (not yet run on a GPU)\n", p->recompute, p->activations_at[0] * mb,
           p->activations_at[1] * mb, p->activations_at[2] * mb, p->activations_at[3] * mb, p->recompute, kept,
           redone, p->work * mb, ((double)p->activations_at[0] - (double)p->bytes[GMEM_ACTS] - (double)p->work) * mb);
}

/* The start-up memory check. cudaMemGetInfo's free bytes are not all the
 * plan's: a run also takes memory it does not allocate itself, some of it
 * only once it is running. So the plan must fit with a headroom to spare:
 *   measured at start: the free bytes before and after building the NCCL
 *     communicator (gpu_comm_init), and around a cuBLASLt handle and a
 *     stream made and destroyed again (gpu_memory_headroom);
 *   an allowance for what loads later:
 *     GPU_LAZY_ALLOWANCE_MB for kernels: CUDA loads each module on first use
 *     (lazy loading, the default on Linux since CUDA 12.2), so the first step
 *     takes device memory for the code of every kernel it runs, cuBLASLt's
 *     included. The figure: PyTorch measured its CUDA context at 667 MB with
 *     every kernel loaded eagerly and 287 MB lazily (pytorch/pytorch#86509),
 *     so ~380 MB of a CUDA library stack's kernels may come later;
 *     GPU_NCCL_ALLOWANCE_MB more with a communicator: NCCL may connect its
 *     channels at the first collectives rather than at init, each channel
 *     with buffers of NCCL_BUFFSIZE (4 MiB by default) per peer and
 *     direction; 32 channels x 2 directions x 4 MiB = 256 MB; as much
 *     again for each communicator per level (--hierarchical 1: two more).
 * Both are estimates from those sources, not measured here: unverified on
 * hardware (the run prints what cudaMemGetInfo says it took, to compare). */
#define GPU_LAZY_ALLOWANCE_MB 384
#define GPU_NCCL_ALLOWANCE_MB 256

typedef struct {
    size_t comm;      /* measured: the NCCL communicator (0 without one) */
    size_t handles;   /* measured: a cuBLASLt handle and a stream */
    size_t allowance; /* for what loads lazily (above) */
} MemoryHeadroom;

/* comms: the NCCL communicators this rank holds (gpu_comm_count; 0 or 1 but for --hierarchical 1) */
static size_t memory_allowance(int comms) {
    return ((size_t)GPU_LAZY_ALLOWANCE_MB + (size_t)comms * (size_t)GPU_NCCL_ALLOWANCE_MB) << 20;
}

static size_t memory_headroom_total(const MemoryHeadroom* h) { return h->comm + h->handles + h->allowance; }

static void memory_headroom_print(const MemoryHeadroom* h) {
    double mb = 1.0 / (1024.0 * 1024.0);
    printf("memory headroom: %.0f MB = measured at start %.0f MB (NCCL communicator %.0f MB, cuBLASLt handle and "
           "stream %.0f MB) + allowance %.0f MB for what loads lazily (kernels on first use%s; estimates, unverified "
           "on hardware)\n", memory_headroom_total(h) * mb, (h->comm + h->handles) * mb, h->comm * mb, h->handles * mb,
           h->allowance * mb, h->allowance > memory_allowance(0) ? ", NCCL's channel buffers" : "");
}

/* The verdict: does a plan of `plan` bytes fit in `free_bytes` (free before
 * the communicator and the handles) with `headroom` to spare? 1 or 0, and
 * `msg` says the figures either way. */
static int memory_check(size_t plan, size_t free_bytes, size_t headroom, char* msg, size_t cap) {
    double mb = 1.0 / (1024.0 * 1024.0);
    int fits = plan <= free_bytes && headroom <= free_bytes - plan;
    if (fits)
        snprintf(msg, cap, "memory check: plan %.0f MB + headroom %.0f MB of %.0f MB free: fits, %.0f MB to spare",
                 plan * mb, headroom * mb, free_bytes * mb, (free_bytes - plan - headroom) * mb);
    else
        snprintf(msg, cap, "the plan needs %.0f MB and a headroom of %.0f MB (NCCL, cuBLASLt, kernels loaded on first "
                 "use) = %.0f MB, the GPU has %.0f MB free", plan * mb, headroom * mb,
                 ((double)plan + (double)headroom) * mb, free_bytes * mb);
    return fits;
}

/* Measure the headroom's start-up part into *h (with its allowance) and
 * return the free bytes it is checked against: those before the
 * communicator (memory_check). Figures from a GPU: dev/cuda/RESULTS.md. */
static size_t gpu_memory_headroom(const GpuComm* cm, MemoryHeadroom* h) {
    size_t free_a = 0, free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_a, &total));
    cublasLtHandle_t probe;
    cudaStream_t stream;
    CUBLAS_CHECK(cublasLtCreate(&probe));
    CUDA_CHECK(cudaStreamCreate(&stream));
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    CUBLAS_CHECK(cublasLtDestroy(probe));
    CUDA_CHECK(cudaStreamDestroy(stream));
    memset(h, 0, sizeof(*h));
    size_t start = cm->free_at_start > free_a ? cm->free_at_start : free_a; /* (another process may have freed some) */
    h->comm = start - free_a;
    h->handles = free_a > free_b ? free_a - free_b : 0;
    h->allowance = memory_allowance(gpu_comm_count(cm));
    return start;
}

/* ---- The plan against the allocation, and --plan (scripts/tests/test_gpu_plan.sh) ---- */

static GpuPlanKnobs gpu_plan_knobs(const Options* o, int B, int T, const GpuComm* comm) {
    GpuPlanKnobs k = {B, T, o->recompute, o->zero, comm->rank, comm->world, comm->nccl != NULL, o->offload,
                      o->qwz, o->qgz, o->qgz_feedback, o->hpz, o->quant_block, comm->lv.nodes};
    return k;
}

/* Whether cudaMemGetInfo counts exactly our cudaMallocs: on the CPU
 * execution layer it does (free = its memory - the bytes cudaMalloc'd); on
 * a GPU the context, NCCL, cuBLASLt and the allocator's rounding take more. */
static int gpu_memory_exact(void) {
    cudaDeviceProp prop;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    return !strncmp(prop.name, "CPU execution layer", 19);
}

/* --plan-check 1: the ledger (every cudaMalloc and cudaMallocHost, G1)
 * against the plan, component by component, byte for byte; the ledger's
 * peak against the plan's total (nothing beyond the plan was ever held);
 * and, on the CPU execution layer, cudaMemGetInfo's taken bytes (the
 * layer's own count of every cudaMalloc, ours or not) against both. `when`
 * names the moment. 0, or -1 after saying what differs. */
static int gpu_plan_check(const MemoryPlan* p, const GpuComm* comm, const char* when) {
    const GpuLedger* l = &gpu_ledger;
    int bad = 0;
    for (int i = 0; i < GMEM_COMPONENTS; i++)
        if (l->now[i] != p->bytes[i]) {
            fprintf(stderr, "plan-check: rank %d, %s: %s: the plan says %zu bytes, the ledger holds %zu\n", comm->rank,
                    when, GMEM_NAMES[i], p->bytes[i], l->now[i]);
            bad = 1;
        }
    size_t total = memory_plan_total(p);
    if (l->device_peak != total) {
        fprintf(stderr, "plan-check: rank %d, %s: the ledger's device peak %zu bytes, the plan's total %zu\n",
                comm->rank, when, l->device_peak, total);
        bad = 1;
    }
    size_t free_now = 0, total_mem = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_now, &total_mem));
    long long taken = (long long)comm->free_at_start - (long long)free_now;
    int exact = gpu_memory_exact();
    /* (d_slots is allocated after free_at_start is read; so is everything else of ours) */
    if (exact && taken != (long long)l->device) {
        fprintf(stderr, "plan-check: rank %d, %s: cudaMemGetInfo says %lld bytes taken since the context, the ledger "
                "%zu: an allocation bypassed gpu_alloc\n", comm->rank, when, taken, l->device);
        bad = 1;
    }
    char parts[1024];
    size_t at = 0;
    for (int i = 0; i < GMEM_COMPONENTS && at < sizeof(parts); i++)
        at += (size_t)snprintf(parts + at, sizeof(parts) - at, "%s%s=%zu", i ? "; " : "", GMEM_NAMES[i], l->now[i]);
    printf("plan-check: rank %d, %s: ledger by component: %s\n", comm->rank, when, parts);
    printf("plan-check: rank %d, %s: plan %zu device bytes + %zu pinned, ledger %zu + %zu (peak %zu), "
           "cudaMemGetInfo taken %lld (%s): %s\n", comm->rank, when, total, memory_plan_pinned(p), l->device,
           l->now[GMEM_HOST_STEP_INPUTS] + l->now[GMEM_HOST_LOSSES] + l->now[GMEM_HOST_COMM] + l->now[GMEM_HOST_OFFLOAD],
           l->device_peak, taken, exact ? "the CPU execution layer: exact" : "a GPU: context and libraries beside",
           bad ? "MISMATCH" : "equal");
    return bad ? -1 : 0;
}

#endif /* GPTC_CUDA_PLAN_CUH */
