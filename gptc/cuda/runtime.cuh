/* gptc/cuda/runtime.cuh: the GPU trainer's runtime model, its calibration,
 * and the planner that uses them: --plan's step-time column and choice,
 * --auto 1 and --snapshot-every auto on train_gpt_cu.
 * Included by train_gpt.cu after the model, CUDA graphs, the offload and the
 * data-parallel step (it times the trainer's own code). Defines
 * GpuCalibration, gpu_calibration_get, gpu_calibration_print, GpuStepTime,
 * gpu_runtime_step, gpu_runtime_snapshot_ms, gpu_plan_print (--plan 1) and
 * gpu_plan_runtime (--auto 1, --snapshot-every auto).
 *
 * ---- What is measured (at start, cached per GPU, driver and build) ----
 * The compute is timed with the trainer's own forward and backward
 * (gpu_micro_batch: through CUDA graphs when the run will use them) on
 * copies of the model with 1 and with 2 layers, at three micro-batches
 * (1, B/2 and B sequences of T, B = the largest candidate up to
 * GPU_CALIB_MAX_B), each the fastest of GPU_CALIB_REPS runs after one
 * that is not timed (it loads the kernels and captures the graphs):
 *   t1_f, t2_f        the forward alone of 1 and 2 layers (with the loss);
 *   t1_fb[r], t2_fb   forward + backward, 1 layer at each --recompute
 *                     level r, 2 layers at level 0.
 * A micro-batch of L layers at level r is then
 *   t1_fb[0] + (L - 1) (t2_fb - t1_fb[0]) + L (t1_fb[r] - t1_fb[0])
 * (the head once, a layer L times, each layer's recompute L times),
 * piecewise linear between the micro-batches measured and along the last
 * segment beyond them. GEMM efficiency grows with the rows, so the figure
 * for a micro-batch between two measured ones is a little pessimistic.
 * When the run uses graphs, forward + backward at level 0 also without them
 * (--offload 1 runs without). Besides, on the 2-layer copy: zeroing the
 * gradients and the norm + AdamW per parameter, pinned copies to and from
 * the host and a copy on the device, --offload 1's whole update per
 * parameter (the norm, then gpu_offload_update until done: the gradients
 * out, the host's AdamW, the master back, rounded); and a host memcpy (the
 * Saver's copy into its slot). The collectives are measured on this
 * run's communicator at every start, not cached (the peers and links may
 * differ from run to run): an allreduce of one float (the latency, the
 * median of 11) and an allreduce, a reduce-scatter and an all-gather of
 * GPU_CALIB_COMM_FLOATS (bytes handed in per second beyond the latency).
 * Every rank measures at once, as the ranks will train; rank 0's figures
 * are everyone's (it plans).
 *
 * ---- The model of one optimizer step (per rank, accum micro-batches) ----
 *   micro     above; its backward part, micro - forward, is split into the
 *             head's and L layers' (from the 1- and 2-layer timings);
 *   plain     (--zero 0, several ranks) the gradients are allreduced after
 *             the last micro-batch's backward, bucket by bucket as it
 *             finishes them (--overlap 1: layer l's bucket while layers
 *             l-1..0 compute, the head's last) on the communication
 *             stream: what is left after the backward is exposed;
 *   ZeRO-1    the same with reduce-scatters, then after AdamW over the
 *             shard the all-gather of the bf16 weights and their unpacking
 *             (device copies), not overlapped;
 *   ZeRO-2    reduce-scatters after every micro-batch; a layer's backward
 *             waits for its slot (the reduction of layer l + 2);
 *   ZeRO-3    as ZeRO-2, and each layer's weights gathered before its
 *             forward and again before its backward, one layer ahead on the
 *             communication stream (two buffers: the gather of layer l + 2
 *             waits for layer l's compute); the head's gather is exposed;
 *   optimizer zeroing (P floats, ZeRO-1 the buckets' P, ZeRO-2/3 the shard
 *             S), the norm and AdamW over P, or S under ZeRO; --offload 1
 *             instead: its update as measured, in L + 2 pieces, behind
 *             which the next forward runs (each layer waits for its own
 *             piece): what the forward does not hide, at least one piece's
 *             worth, is exposed (on the CPU execution layer all of it: the
 *             "device" computes on the cores the host's AdamW needs);
 *   host sums with several ranks: the loss and the norm, one latency each.
 * Collective times are latency + bytes / rate (rates as measured, bytes
 * handed in; ZeRO's padding is left out: at most 63 floats a piece).
 * Not modelled: ZeRO++ (--qwz, --qgz, --hpz) and --hierarchical 1 (their
 * flags are kept as given and the plan's candidates are exact, flat ZeRO
 * 0-3), the data loader and the host's work between steps (the GPU step
 * runs ahead of it), the snapshot copies' contention with the step.
 * On the CPU execution layer the figures are the layer's (the mechanism is
 * what make test checks there: scripts/tests/test_cuda_on_cpu.sh); on a GPU
 * the predicted step against the measured one is scripts/gpu_check.sh's to
 * record (docs/gpu.md says what has run). */
#ifndef GPTC_CUDA_RUNTIME_CUH
#define GPTC_CUDA_RUNTIME_CUH

#define GPU_CALIB_FORMAT "gptc gpu calibration v1"
#define GPU_CALIB_FORMAT_ANY "gptc gpu calibration v" /* (an older version's file is replaced) */
#define GPU_CALIB_POINTS 3
#define GPU_CALIB_MAX_B 8
#define GPU_CALIB_REPS 3
#define GPU_CALIB_COMM_FLOATS ((size_t)1 << 22) /* 16 MB of fp32 (less for a smaller model) */

typedef struct {
    int C, NH, Vp, maxT, V, T, fusion, graphs, threads;
    /* compute (cached) */
    double B[GPU_CALIB_POINTS];     /* micro-batches measured, sequences of T, ascending (repeats: fewer candidates) */
    double t1_f[GPU_CALIB_POINTS], t2_f[GPU_CALIB_POINTS];       /* ms: forward of 1 layer, of 2 layers */
    double t1_fb[RECOMPUTE_LEVELS][GPU_CALIB_POINTS];            /* ms: 1 layer forward + backward at each level */
    double t2_fb[GPU_CALIB_POINTS];                              /* ms: 2 layers forward + backward, level 0 */
    double t1_fb_ng[GPU_CALIB_POINTS], t2_fb_ng[GPU_CALIB_POINTS]; /* the same, level 0, without CUDA graphs
                                                                    (--offload 1 runs without; = t*_fb when
                                                                    the run has none) */
    double zero_ns, update_ns;      /* per float: zeroing the gradients; the norm and AdamW per parameter */
    double d2h_gbs, h2d_gbs, d2d_gbs; /* GB/s copied: pinned device-to-host, host-to-device, on the device */
    double offload_ns;              /* --offload 1's whole update per parameter: the norm, gradients out, host
                                       AdamW, master back, rounded, slots zeroed (gpu_grad_norm, then
                                       gpu_offload_update until it is done) */
    double host_copy_gbs;           /* a host memcpy, bytes copied per second (the Saver's copy into its slot) */
    double ms;                      /* how long the compute calibration took */
    /* the collectives on this run's communicator (measured at every start; 0 without one) */
    double alpha_us, allreduce_gbs, reduce_scatter_gbs, allgather_gbs;
    int comm, cached, discarded;
    int shared_cores;               /* the CPU execution layer: the "device" computes on the host's cores */
    char key[800], path[4400];
} GpuCalibration;

/* The cached numbers, in the file's order. */
#define GPU_CALIB_PER_POINT (5 + RECOMPUTE_LEVELS)
#define GPU_CALIB_NUMBERS (GPU_CALIB_POINTS * (1 + GPU_CALIB_PER_POINT) + 8) /* B, then each point's, then 8 */
static void gpu_calib_numbers(GpuCalibration* c, double* v[GPU_CALIB_NUMBERS]) {
    int n = 0;
    for (int i = 0; i < GPU_CALIB_POINTS; i++) v[n++] = &c->B[i];
    for (int i = 0; i < GPU_CALIB_POINTS; i++) {
        v[n++] = &c->t1_f[i];
        v[n++] = &c->t2_f[i];
        for (int r = 0; r < RECOMPUTE_LEVELS; r++) v[n++] = &c->t1_fb[r][i];
        v[n++] = &c->t2_fb[i];
        v[n++] = &c->t1_fb_ng[i];
        v[n++] = &c->t2_fb_ng[i];
    }
    double* rest[8] = {&c->zero_ns, &c->update_ns, &c->d2h_gbs, &c->h2d_gbs, &c->d2d_gbs, &c->offload_ns,
                       &c->host_copy_gbs, &c->ms};
    for (int i = 0; i < 8; i++) v[n++] = rest[i];
    ALWAYS(n == GPU_CALIB_NUMBERS);
}

static CalibRange calib_range(const char* name, double lo, double hi, int lo_open) {
    CalibRange r = {name, lo, hi, lo_open};
    return r;
}

/* The range each cached number of any GPU (or of the CPU layer) falls in. */
static void gpu_calib_ranges(CalibRange r[GPU_CALIB_NUMBERS]) {
    static char names[GPU_CALIB_POINTS * GPU_CALIB_PER_POINT][72];
    int n = 0, k = 0;
    for (int i = 0; i < GPU_CALIB_POINTS; i++) r[n++] = calib_range("micro-batch measured", 1, GPU_CALIB_MAX_B, 0);
    for (int i = 0; i < GPU_CALIB_POINTS; i++) {
        const char* what[GPU_CALIB_PER_POINT] = {"1-layer forward ms", "2-layer forward ms",
                                                 "1-layer forward+backward ms (recompute 0)",
                                                 "1-layer forward+backward ms (recompute 1)",
                                                 "1-layer forward+backward ms (recompute 2)",
                                                 "1-layer forward+backward ms (recompute 3)",
                                                 "2-layer forward+backward ms",
                                                 "1-layer forward+backward ms without graphs",
                                                 "2-layer forward+backward ms without graphs"};
        for (int j = 0; j < GPU_CALIB_PER_POINT; j++) {
            snprintf(names[k], sizeof(names[k]), "%s at point %d", what[j], i + 1);
            r[n++] = calib_range(names[k++], 0, 1e6, 1);
        }
    }
    r[n++] = calib_range("zeroing ns per float", 0, 1e6, 1);
    r[n++] = calib_range("norm+AdamW ns per parameter", 0, 1e6, 1);
    r[n++] = calib_range("device-to-host GB/s", 0, 1e5, 1);
    r[n++] = calib_range("host-to-device GB/s", 0, 1e5, 1);
    r[n++] = calib_range("device copy GB/s", 0, 1e6, 1);
    r[n++] = calib_range("offloaded update ns per parameter", 0, 1e6, 1);
    r[n++] = calib_range("host copy GB/s", 0, 1e5, 1);
    r[n++] = calib_range("calibration ms", 0, 1e8, 0);
    ALWAYS(n == GPU_CALIB_NUMBERS);
}

/* The micro-batches to measure for candidates of up to `most` sequences:
 * 1, most/2 and most, most capped at GPU_CALIB_MAX_B. */
static void gpu_calib_points(double B[GPU_CALIB_POINTS], long long most) {
    int top = most < GPU_CALIB_MAX_B ? (int)(most < 1 ? 1 : most) : GPU_CALIB_MAX_B;
    B[0] = 1;
    B[1] = top / 2 > 1 ? top / 2 : 1;
    B[2] = top;
}

/* A cache line for this key: its numbers, and the micro-batches the key
 * names; every measured figure plausible (gpu_calib_ranges) and a
 * forward + backward longer than its forward alone. NULL, or why not. */
static const char* gpu_calib_parse(void* ctx, const char* at, char* why, size_t cap) {
    GpuCalibration* c = (GpuCalibration*)ctx;
    double want[GPU_CALIB_POINTS];
    memcpy(want, c->B, sizeof(want));
    double* v[GPU_CALIB_NUMBERS];
    CalibRange r[GPU_CALIB_NUMBERS];
    gpu_calib_numbers(c, v);
    gpu_calib_ranges(r);
    if (numbers_parse(at, v, r, GPU_CALIB_NUMBERS, why, cap)) return why;
    for (int i = 0; i < GPU_CALIB_POINTS; i++) {
        if (c->B[i] != want[i]) {
            snprintf(why, cap, "micro-batch %d measured is %g, the key says %g", i + 1, c->B[i], want[i]);
            return why;
        }
        if (!(c->t1_fb[0][i] > c->t1_f[i]) || !(c->t2_fb[i] > c->t2_f[i]) || !(c->t1_fb_ng[i] > c->t1_f[i]) ||
            !(c->t2_fb_ng[i] > c->t2_f[i])) {
            snprintf(why, cap, "at micro-batch %g a forward + backward (%g, %g ms) is not longer than its forward "
                     "(%g, %g ms)", c->B[i], c->t1_fb[0][i], c->t2_fb[i], c->t1_f[i], c->t2_f[i]);
            return why;
        }
    }
    return NULL;
}

/* Key: the GPU (name, compute capability, memory), driver and runtime, the
 * binary (size and mtime), the model's shape but its depth, T, the
 * micro-batches measured, --gelu-fusion, graphs, host threads. */
static void gpu_calib_key(GpuCalibration* cal) {
    cudaDeviceProp prop;
    int dev = 0, driver = 0, runtime = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    CUDA_CHECK(cudaDriverGetVersion(&driver));
    CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    char name[256];
    snprintf(name, sizeof(name), "%s", prop.name);
    for (char* p = name; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '|') *p = '_';
    struct stat st;
    long long size = 0, mtime = 0;
    if (stat("/proc/self/exe", &st) == 0) {
        size = (long long)st.st_size;
        mtime = (long long)st.st_mtime;
    }
    snprintf(cal->key, sizeof(cal->key), "gpu=%s cc=%d.%d mem=%zu driver=%d runtime=%d build=%lld.%lld C=%d NH=%d "
             "V=%d Vp=%d maxT=%d T=%d B=%g,%g,%g fusion=%d graphs=%d threads=%d", name, prop.major, prop.minor,
             (size_t)prop.totalGlobalMem, driver, runtime, size, mtime, cal->C, cal->NH, cal->V, cal->Vp, cal->maxT,
             cal->T, cal->B[0], cal->B[1], cal->B[2], cal->fusion, cal->graphs, cal->threads);
}

/* ---- measuring ---------------------------------------------------------- */

/* The fastest of GPU_CALIB_REPS runs of work(ctx) on stream s (ms, by
 * events), after one not timed. On the CPU execution layer one timed run
 * (nothing loads lazily there, and a run costs seconds). */
static double gpu_time_ms(cudaStream_t s, void (*work)(void*), void* ctx) {
    static int layer = -1;
    if (layer < 0) layer = gpu_memory_exact();
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    if (!layer) work(ctx);
    double best = 0.0;
    for (int k = 0; k < (layer ? 1 : GPU_CALIB_REPS); k++) {
        CUDA_CHECK(cudaEventRecord(a, s));
        work(ctx);
        CUDA_CHECK(cudaEventRecord(b, s));
        gpu_wait(s, b);
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        if (k == 0 || ms < best) best = ms;
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return best > 1e-6 ? best : 1e-6; /* (a figure of 0 would read as a damaged cache) */
}

typedef struct {
    GpuGPT2* g;
    int B, T;
    float dloss;
    void* dst;
    const void* src;
    size_t bytes;
    cudaMemcpyKind kind;
    AdamWConfig opt;
} CalibWork;

static void calib_micro_batch(void* p) {
    CalibWork* w = (CalibWork*)p;
    gpu_micro_batch(w->g, w->B, w->T, w->dloss);
}
static void calib_forward(void* p) {
    CalibWork* w = (CalibWork*)p;
    gpu_forward_run(w->g, w->B, w->T, 1, 0.0f);
}
static void calib_zero(void* p) {
    CalibWork* w = (CalibWork*)p;
    CUDA_CHECK(cudaMemsetAsync(w->g->grads_memory, 0, w->g->num_parameters * sizeof(float), w->g->stream));
}
static void calib_update(void* p) {
    CalibWork* w = (CalibWork*)p;
    gpu_grad_norm_run(w->g);
    gpu_adamw_update(w->g, &w->opt, 1e-4f, 1, 1.0f, 1u);
}
static void calib_copy(void* p) {
    CalibWork* w = (CalibWork*)p;
    CUDA_CHECK(cudaMemcpyAsync(w->dst, w->src, w->bytes, w->kind, w->g->stream));
}

/* A host model of `layers` layers of c (random weights: only the time counts). */
static void calib_host_model(GPT2* h, const GPT2Config* c, int layers) {
    GPT2Config cl = *c;
    cl.num_layers = layers;
    memset(h, 0, sizeof(*h));
    gpt2_init_random(h, &cl, 1234);
}

/* Times the forward (fwd, may be NULL) and forward + backward of `host`'s
 * model at --recompute r, at each micro-batch of cal->B; fb_ng (may be
 * NULL): forward + backward without graphs (a copy of fb when the run has
 * none). */
static void calib_model_times(const GpuCalibration* cal, GPT2* host, int r, double* fwd, double* fb, double* fb_ng) {
    int T = cal->T, Bmax = (int)cal->B[GPU_CALIB_POINTS - 1];
    GpuGPT2 g;
    gpu_model_init_with(&g, host, Bmax, T, cal->fusion, r, 1, 0, host->num_parameters);
    int n = Bmax * T;
    int* tokens = (int*)xmalloc(sizeof(int) * (size_t)n);
    Rng rng;
    rng_init(&rng, 42);
    for (int i = 0; i < n; i++) tokens[i] = (int)(rng_u32(&rng) % (uint32_t)cal->V);
    for (int i = 0; i < GPU_CALIB_POINTS; i++) {
        CalibWork w;
        memset(&w, 0, sizeof(w));
        w.g = &g;
        w.B = (int)cal->B[i];
        w.T = T;
        w.dloss = 1.0f / (float)(w.B * T);
        if (g.graph_micro) { /* (a graph is captured for one shape) */
            CUDA_CHECK(cudaGraphExecDestroy(g.graph_micro));
            g.graph_micro = NULL;
        }
        g.graphs = cal->graphs;
        gpu_tokens_upload(&g, tokens, tokens, w.B * T, 0);
        fb[i] = gpu_time_ms(g.stream, calib_micro_batch, &w);
        g.graphs = 0;
        if (fb_ng) fb_ng[i] = cal->graphs ? gpu_time_ms(g.stream, calib_micro_batch, &w) : fb[i];
        if (fwd) fwd[i] = gpu_time_ms(g.stream, calib_forward, &w);
    }
    free(tokens);
    gpu_model_free(&g);
}

/* The compute part of the calibration (cached): the model's copies, the
 * update, the copies, the host's AdamW and memcpy. */
static void gpu_calib_compute(GpuCalibration* cal, const GPT2Config* c) {
    double t0 = time_ms();
    GPT2 h1, h2;
    calib_host_model(&h1, c, 1);
    calib_host_model(&h2, c, 2);
    for (int r = 0; r < RECOMPUTE_LEVELS; r++)
        calib_model_times(cal, &h1, r, r == 0 ? cal->t1_f : NULL, cal->t1_fb[r], r == 0 ? cal->t1_fb_ng : NULL);
    calib_model_times(cal, &h2, 0, cal->t2_f, cal->t2_fb, cal->t2_fb_ng);
    /* the update and the copies, on the 2-layer copy at one sequence */
    GpuGPT2 g;
    gpu_model_init_with(&g, &h2, 1, cal->T, cal->fusion, 0, 1, 0, h2.num_parameters);
    size_t P = g.num_parameters;
    CalibWork w;
    memset(&w, 0, sizeof(w));
    w.g = &g;
    AdamWConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 0};
    w.opt = opt;
    cal->zero_ns = gpu_time_ms(g.stream, calib_zero, &w) * 1e6 / (double)P;
    cal->update_ns = gpu_time_ms(g.stream, calib_update, &w) * 1e6 / (double)P;
    size_t bytes = P * sizeof(float);
    void* pinned = NULL;
    CUDA_CHECK(cudaMallocHost(&pinned, bytes)); /* (freed below: outside the ledger, as the model copies are gone) */
    w.bytes = bytes;
    w.dst = pinned, w.src = g.grads_memory, w.kind = cudaMemcpyDeviceToHost;
    cal->d2h_gbs = bytes / (gpu_time_ms(g.stream, calib_copy, &w) * 1e6);
    w.dst = g.grads_memory, w.src = pinned, w.kind = cudaMemcpyHostToDevice;
    cal->h2d_gbs = bytes / (gpu_time_ms(g.stream, calib_copy, &w) * 1e6);
    w.dst = g.grads_memory, w.src = g.master_memory, w.kind = cudaMemcpyDeviceToDevice;
    cal->d2d_gbs = bytes / (gpu_time_ms(g.stream, calib_copy, &w) * 1e6);
    CUDA_CHECK(cudaFreeHost(pinned));
    gpu_model_free(&g);
    /* --offload 1's update on the 2-layer copy, queued and waited for (the fastest of the runs after the first) */
    gpu_model_init_with(&g, &h2, 1, cal->T, cal->fusion, 0, 1, 1, h2.num_parameters);
    double off = 0.0;
    for (int k = 0; k <= GPU_CALIB_REPS; k++) {
        double a = time_ms();
        float norm = (float)gpu_grad_norm(&g); /* (dp_step: the norm on the device, then the host's update) */
        gpu_offload_update(&g, &opt, 1e-4f, 1, 1.0f, 1u, norm);
        gpu_offload_sync(&g);
        double e = time_ms() - a;
        if (k == 1 || (k > 1 && e < off)) off = e;
    }
    cal->offload_ns = fmax(off, 1e-6) * 1e6 / (double)P;
    g.off->updates = 0; /* (its overlap line is the training run's to print) */
    gpu_model_free(&g);
    /* the host: the Saver's memcpy (the fastest of the runs after the first, which touches the pages) */
    float* from = (float*)xmalloc(bytes);
    float* to = (float*)xmalloc(bytes);
    for (size_t i = 0; i < P; i++) from[i] = 1e-3f;
    double copy = 0.0;
    for (int k = 0; k <= GPU_CALIB_REPS; k++) {
        double a = time_ms();
        memcpy(to, from, bytes);
        double e = time_ms() - a;
        if (k == 1 || (k > 1 && e < copy)) copy = e;
    }
    cal->host_copy_gbs = bytes / (fmax(copy, 1e-6) * 1e6);
    free(from);
    free(to);
    gpt2_free(&h1);
    gpt2_free(&h2);
    /* the copies' buffers are freed: the run's peak counts from its own allocations on (--plan-check) */
    gpu_ledger.device_peak = gpu_ledger.device;
    cal->ms = time_ms() - t0;
}

typedef struct {
    GpuComm* cm;
    void* buf;
    size_t n;
    int what; /* 0 allreduce, 1 reduce-scatter, 2 all-gather (bf16) */
} CommWork;

static void calib_collective(void* p) {
    CommWork* w = (CommWork*)p;
    GpuComm* cm = w->cm;
    size_t piece = w->n / (size_t)cm->world;
    if (w->what == 0)
        NCCL_CHECK(ncclAllReduce(w->buf, w->buf, w->n, ncclFloat, ncclSum, cm->nccl, cm->stream));
    else if (w->what == 1)
        NCCL_CHECK(ncclReduceScatter(w->buf, (float*)w->buf + (size_t)cm->rank * piece, piece, ncclFloat, ncclSum,
                                     cm->nccl, cm->stream));
    else
        NCCL_CHECK(ncclAllGather((floatX*)w->buf + (size_t)cm->rank * piece, w->buf, piece, ncclBfloat16, cm->nccl,
                                 cm->stream));
}

/* The collectives on cm (every rank at once). */
static void gpu_calib_network(GpuCalibration* cal, GpuComm* cm, size_t P) {
    if (!cm->nccl) return;
    size_t W = (size_t)cm->world, n = P < GPU_CALIB_COMM_FLOATS ? P : GPU_CALIB_COMM_FLOATS;
    n = (n + W - 1) / W * W;
    void* buf = NULL;
    CUDA_CHECK(cudaMalloc(&buf, n * sizeof(float))); /* (freed below) */
    CUDA_CHECK(cudaMemsetAsync(buf, 0, n * sizeof(float), cm->stream)); /* (the collectives' stream: no race) */
    CommWork w = {cm, buf, 1, 0};
    double one[11];
    for (int k = 0; k < 11; k++) { /* the latency: the median of 11 one-float allreduces */
        one[k] = gpu_time_ms(cm->stream, calib_collective, &w);
        for (int j = k; j > 0 && one[j] < one[j - 1]; j--) {
            double t = one[j];
            one[j] = one[j - 1];
            one[j - 1] = t;
        }
    }
    cal->alpha_us = one[5] * 1e3;
    double* rates[3] = {&cal->allreduce_gbs, &cal->reduce_scatter_gbs, &cal->allgather_gbs};
    for (int what = 0; what < 3; what++) {
        CommWork big = {cm, buf, n, what};
        double ms = gpu_time_ms(cm->stream, calib_collective, &big) - one[5];
        double bytes = (double)n * (what == 2 ? sizeof(floatX) : sizeof(float));
        *rates[what] = bytes / (fmax(ms, 1e-6) * 1e6);
    }
    CUDA_CHECK(cudaFree(buf));
    gpu_ledger.device_peak = gpu_ledger.device;
    cal->comm = 1;
}

/* Rank 0's numbers for every rank (a sum with zeros elsewhere, 16 at a time). */
static void gpu_calib_share(GpuComm* cm, double* const* v, int n) {
    for (int at = 0; at < n; at += DP_SCALARS) {
        double x[DP_SCALARS];
        int k = n - at < DP_SCALARS ? n - at : DP_SCALARS;
        for (int i = 0; i < k; i++) x[i] = cm->rank == 0 ? *v[at + i] : 0.0;
        gpu_comm_sum(cm, x, k);
        for (int i = 0; i < k; i++) *v[at + i] = x[i];
    }
}

/* The calibration for model c at T, micro-batches up to `most` sequences:
 * the compute from the cache or measured (every rank at once), the network
 * measured now. Rank 0's figures for all. */
static void gpu_calibration_get(GpuCalibration* cal, const GPT2Config* c, int T, long long most, const Options* o,
                                GpuComm* cm) {
    memset(cal, 0, sizeof(*cal));
    cal->C = c->channels, cal->NH = c->num_heads, cal->Vp = c->padded_vocab_size, cal->V = c->vocab_size;
    cal->maxT = c->max_seq_len, cal->T = T;
    cal->fusion = o->gelu_fusion && (4 * c->channels) % 8 == 0;
    cal->graphs = o->cuda_graphs && cm->world == 1 && !(o->spike_z > 0); /* (as gpu_train_build decides) */
    cal->threads = num_threads();
    gpu_calib_points(cal->B, most);
    cal->shared_cores = gpu_memory_exact();
    gpu_calib_key(cal);
    calib_file_path(cal->path, sizeof(cal->path), o->output_dir, "gpu_calibration.txt");
    const char* again = getenv("GPTC_CALIBRATE");
    int hit = 0;
    if (cm->rank == 0 && !(again && atoi(again) == 1)) {
        GpuCalibration read = *cal;
        hit = keyed_load(cal->path, GPU_CALIB_FORMAT, cal->key, gpu_calib_parse, &read, &cal->discarded);
        if (hit) {
            read.discarded = cal->discarded;
            *cal = read;
        }
    }
    double h = hit;
    gpu_comm_sum(cm, &h, 1); /* rank 0's answer, for all */
    cal->cached = h > 0.5;
    if (!cal->cached) {
        gpu_calib_compute(cal, c);
        double* v[GPU_CALIB_NUMBERS];
        gpu_calib_numbers(cal, v);
        for (int i = 0; i < GPU_CALIB_NUMBERS; i++) { /* the digits the cache keeps: this run plans as the next will */
            char digits[32];
            snprintf(digits, sizeof(digits), "%.6g", *v[i]);
            *v[i] = strtod(digits, NULL);
        }
        if (cm->rank == 0)
            keyed_save(cal->path, GPU_CALIB_FORMAT, GPU_CALIB_FORMAT_ANY,
                       "key|micro-batches measured (3); at each: forward of 1 and 2 layers, forward+backward of 1 "
                       "layer at recompute 0-3 and of 2 layers, ms; zeroing and norm+AdamW ns per float; device-to-"
                       "host, host-to-device, device copy GB/s; host AdamW ns per parameter; host copy GB/s; ms",
                       cal->key, cal->discarded, v, GPU_CALIB_NUMBERS);
    }
    double* v[GPU_CALIB_NUMBERS];
    gpu_calib_numbers(cal, v);
    gpu_calib_share(cm, v, GPU_CALIB_NUMBERS);
    gpu_calib_network(cal, cm, parameter_count(c));
    double* net[4] = {&cal->alpha_us, &cal->allreduce_gbs, &cal->reduce_scatter_gbs, &cal->allgather_gbs};
    gpu_calib_share(cm, net, 4);
}

/* Value of the measured series y at micro-batch x: piecewise linear over
 * the distinct points of B, along the last segment beyond them, in
 * proportion when only one point was measured. */
static double calib_at(const double* B, const double* y, double x) {
    int last = 0;
    for (int i = 1; i < GPU_CALIB_POINTS; i++)
        if (B[i] > B[last]) last = i;
    if (last == 0) return y[0] * x / B[0];
    int lo = 0, hi = last;
    for (int i = 0; i < GPU_CALIB_POINTS; i++)
        for (int j = i + 1; j < GPU_CALIB_POINTS; j++)
            if (B[j] > B[i] && x >= B[i] && x <= B[j]) lo = i, hi = j;
    if (x > B[last]) { /* the last segment, from the point before it */
        hi = last;
        lo = 0;
        for (int i = 0; i < GPU_CALIB_POINTS; i++)
            if (B[i] < B[last] && B[i] > B[lo]) lo = i;
    }
    return y[lo] + (y[hi] - y[lo]) * (x - B[lo]) / (B[hi] - B[lo]);
}

static void gpu_calibration_print(const GpuCalibration* cal) {
    int last = GPU_CALIB_POINTS - 1;
    double B = cal->B[last];
    printf("gpu calibration (%s, %.0f ms, %s): at B=%g x T=%d, a micro-batch of 1 / 2 layers: forward %.3f / %.3f "
           "ms, forward+backward %.3f / %.3f ms (recompute 1/2/3, 1 layer: %.3f / %.3f / %.3f ms); at B=%g: %.3f / "
           "%.3f ms; zeroing %.3g, norm+AdamW %.3g ns per float; copies to host %.3g, from host %.3g, on device %.3g "
           "GB/s; --offload 1's update %.3g ns per parameter; host copy %.3g GB/s%s\n", cal->cached ? "cached" : "measured now",
           cal->ms, cal->path, B, cal->T, cal->t1_f[last], cal->t2_f[last], cal->t1_fb[0][last], cal->t2_fb[last],
           cal->t1_fb[1][last], cal->t1_fb[2][last], cal->t1_fb[3][last], cal->B[0], cal->t1_fb[0][0], cal->t2_fb[0],
           cal->zero_ns, cal->update_ns, cal->d2h_gbs, cal->h2d_gbs, cal->d2d_gbs, cal->offload_ns,
           cal->host_copy_gbs, "");
    if (cal->graphs)
        printf("gpu calibration: micro-batches through CUDA graphs (as this run will); without them (--offload 1) at "
               "B=%g: %.3f / %.3f ms\n", B, cal->t1_fb_ng[last], cal->t2_fb_ng[last]);
    if (cal->comm) /* (every digit: the test recomputes the collectives' terms) */
        printf("gpu network (measured at this start, NCCL): latency %.6g us, allreduce %.6g GB/s, reduce-scatter %.6g "
               "GB/s, all-gather %.6g GB/s (bytes handed in)\n", cal->alpha_us, cal->allreduce_gbs,
               cal->reduce_scatter_gbs, cal->allgather_gbs);
}

/* ---- the model ---------------------------------------------------------- */

typedef struct {
    double micro;     /* one micro-batch, forward + backward with its recompute (ms) */
    double forward;   /* its forward alone */
    double comm;      /* collectives not hidden behind compute, per step (ZeRO-2/3: every micro-batch's) */
    double optimizer; /* zeroing, the norm and AdamW; --offload 1: what the next forward does not hide */
    double step;      /* the whole step */
} GpuStepTime;

/* Collective times, ms: latency + bytes / rate. */
static double gpu_coll_ms(const GpuCalibration* cal, double bytes, double gbs) {
    return cal->alpha_us / 1e3 + bytes / (gbs * 1e6);
}

/* A backward whose buckets are reduced on the communication stream: the
 * head's part (bk_head) first, then L layers of bk_layer each; layer l's
 * bucket reduced as it finishes (cr each, the head's ch last) when
 * `overlap`, else all after; `slots`: a layer waits until the bucket two
 * above it has been reduced (ZeRO-2/3's two slots); `gather` > 0: each
 * layer's weights gathered first (ZeRO-3, one layer ahead, two buffers:
 * the gather of layer l - 1 starts with layer l's compute), the first while
 * the head computes. Returns the time from the backward's start until its
 * reductions are done. */
static double gpu_backward_wall(double bk_head, double bk_layer, int L, double cr, double ch, int overlap, int slots,
                                double gather) {
    double t = bk_head, comm = 0.0;
    double reduced[2] = {0.0, 0.0}, gathered = gather; /* when the slots were reduced; layer L-1's weights */
    for (int l = L - 1; l >= 0; l--) {
        double start = t;
        if (slots) start = fmax(start, reduced[l % 2]);
        if (gather > 0) start = fmax(start, gathered);
        if (gather > 0 && l > 0) { /* the next layer's weights, beside this layer's compute */
            comm = fmax(comm, start) + gather;
            gathered = comm;
        }
        t = start + bk_layer;
        if (overlap) {
            comm = fmax(comm, t) + cr;
            reduced[l % 2] = comm;
        }
    }
    if (!overlap) comm = t + L * cr;
    return fmax(comm, t) + ch;
}

/* ZeRO-3's forward: the head's weights gathered (exposed), then each
 * layer's before it runs, one ahead (the gather of layer l + 2 waits for
 * layer l's compute: two buffers); f_layer each, f_head after. */
static double gpu_forward_wall(double f_head, double f_layer, int L, double gather, double gather_head) {
    double comm = gather_head, t = gather_head, done[2] = {0.0, 0.0};
    double ready = 0.0;
    for (int l = 0; l < L; l++) {
        if (l == 0) {
            comm += gather;
            ready = comm;
        }
        double start = fmax(t, ready);
        if (l + 1 < L) { /* layer l + 1's gather, into the buffer layer l - 1 used */
            comm = fmax(comm, done[(l + 1) % 2]) + gather;
            ready = comm;
        }
        t = start + f_layer;
        done[l % 2] = t;
    }
    return t + f_head;
}

/* One optimizer step of the candidate k (B, T, --zero, --recompute,
 * --offload, the ranks) with accum micro-batches, by the model above. */
static GpuStepTime gpu_runtime_step(const GpuCalibration* cal, const GPT2Config* c, const GpuPlanKnobs* k, int accum,
                                    int overlap) {
    GpuStepTime s;
    memset(&s, 0, sizeof(s));
    double B = k->B;
    int L = c->num_layers, r = k->recompute;
    int graphs = cal->graphs && !k->offload; /* (--offload 1 runs without CUDA graphs) */
    double f1 = calib_at(cal->B, cal->t1_f, B), f2 = calib_at(cal->B, cal->t2_f, B);
    double fb1 = calib_at(cal->B, graphs ? cal->t1_fb[0] : cal->t1_fb_ng, B);
    double fb2 = calib_at(cal->B, graphs ? cal->t2_fb : cal->t2_fb_ng, B);
    double redo = fmax(0.0, calib_at(cal->B, cal->t1_fb[r], B) - calib_at(cal->B, cal->t1_fb[0], B)); /* level r's */
    double f_layer = fmax(0.0, f2 - f1), fb_layer = fmax(0.0, fb2 - fb1);
    double f_head = fmax(0.0, f1 - f_layer), fb_head = fmax(0.0, fb1 - fb_layer);
    double bk_layer = fmax(0.0, fb_layer - f_layer) + redo, bk_head = fmax(0.0, fb_head - f_head);
    s.forward = f_head + L * f_layer;
    s.micro = s.forward + bk_head + L * bk_layer;
    double P = (double)parameter_count(c), W = k->world;
    double Pl = 12.0 * c->channels * c->channels + 13.0 * c->channels, Ph = P - L * Pl; /* a layer's, the head's */
    double n = k->zero > 0 && k->comm ? ceil(P / W) : P; /* the parameters this rank updates */
    double micro_total = (test_hook_gpu_runtime() == 1 ? 1 : accum) * s.micro; /* (planted: counted once) */
    if (k->comm && cal->comm) {
        double ar = cal->allreduce_gbs, rs = cal->reduce_scatter_gbs, ag = cal->allgather_gbs;
        if (k->zero == 0) { /* the last micro-batch's backward reduces */
            double wall = gpu_backward_wall(bk_head, bk_layer, L, gpu_coll_ms(cal, 4 * Pl, ar),
                                            gpu_coll_ms(cal, 4 * Ph, ar), overlap, 0, 0.0);
            s.comm = wall - (bk_head + L * bk_layer);
        } else if (k->zero == 1) {
            double wall = gpu_backward_wall(bk_head, bk_layer, L, gpu_coll_ms(cal, 4 * Pl, rs),
                                            gpu_coll_ms(cal, 4 * Ph, rs), overlap, 0, 0.0);
            s.comm = wall - (bk_head + L * bk_layer);
        } else { /* ZeRO-2 and 3: every micro-batch reduces, into two slots */
            double gl = k->zero == 3 ? gpu_coll_ms(cal, 2 * Pl, ag) : 0.0;
            double wall = gpu_backward_wall(bk_head, bk_layer, L, gpu_coll_ms(cal, 4 * Pl, rs),
                                            gpu_coll_ms(cal, 4 * Ph, rs), 1, 1, gl);
            double per = wall - (bk_head + L * bk_layer);
            if (k->zero == 3) per += gpu_forward_wall(f_head, f_layer, L, gl, gpu_coll_ms(cal, 2 * Ph, ag)) - s.forward;
            s.comm = accum * per;
        }
        if (k->zero == 1 || k->zero == 2) /* the bf16 weights gathered after AdamW, bucket by bucket, and unpacked */
            s.comm += (L + 1) * cal->alpha_us / 1e3 + 2 * P / (ag * 1e6) + 2 * 2 * P / (cal->d2d_gbs * 1e6);
        if (W > 1) s.comm += 2 * cal->alpha_us / 1e3; /* the loss's and the norm's sums */
    }
    double zeroed = k->zero == 0 || !k->comm ? P : k->zero == 1 ? n * W : n;
    if (k->offload) { /* the update as measured, behind which the next forward runs layer by layer */
        double t = cal->offload_ns * P / 1e6;
        s.optimizer = cal->shared_cores ? t : fmax(t - s.forward, t / (L + 2)); /* (the layer: the host's AdamW and
                                                                                the forward share the cores) */
    } else {
        s.optimizer = (cal->zero_ns * zeroed + cal->update_ns * n) / 1e6;
    }
    s.step = micro_total + s.comm + s.optimizer;
    return s;
}

/* One memory snapshot's cost (ms), for --snapshot-every auto: the state
 * (fp32 master, m, v: 12 bytes a parameter) to the host (under ZeRO the
 * shards gathered first), the rank's slice copied into its slot by the
 * Saver (read + write), and with several ranks that slice sent to the next
 * rank as a replica (taken at the all-gather's rate: an estimate of the
 * link MPI uses). The copies to the host run beside the step on the copy
 * engines; counted whole here (an upper bound). */
static double gpu_runtime_snapshot_ms(const GpuCalibration* cal, const GPT2Config* c, int world, int zero) {
    double P = (double)parameter_count(c), state = 12.0 * P, slice = state / world;
    double ms = state / (cal->d2h_gbs * 1e6) + 2.0 * slice / (cal->host_copy_gbs * 1e6);
    if (cal->comm && zero > 0) ms += gpu_coll_ms(cal, state, cal->allgather_gbs);
    if (cal->comm && world > 1) ms += gpu_coll_ms(cal, slice, cal->allgather_gbs);
    return ms;
}

/* ---- --plan, --auto 1, --snapshot-every auto --------------------------------------------- */

typedef struct {
    GpuPlanKnobs k;
    long long accum;
    size_t need;
    GpuStepTime t;
} GpuPlanChoice;

/* --plan on the GPU (print 1: the plan of the flags given, then every
 * candidate for the global batch: micro-batch B from the divisors of the
 * sequences per rank; --recompute 0..3; ZeRO 0-3 with several ranks;
 * --offload 0/1 without ZeRO) with their predicted device bytes by
 * component against --memory-budget (auto: what cudaMemGetInfo says is
 * free now, after the context), less the memory check's allowance for what
 * the libraries load lazily, and their predicted step time. The choice is
 * the fastest that fits (of equal times the first: no offload before
 * offload, lower ZeRO and recompute, larger B). 0, or -1 when nothing fits. */
static int gpu_plan_choose(const Options* o, const GpuComm* comm, const GPT2Config* c, const GpuCalibration* cal,
                           int print, GpuPlanChoice* out) {
    memset(out, 0, sizeof(*out));
    size_t free_now = 0, total_mem = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_now, &total_mem));
    const char* how = "auto: cudaMemGetInfo's free bytes";
    size_t budget = !strcmp(o->memory_budget, "auto") ? free_now : plan_budget(o->memory_budget, comm->world, &how);
    if (!budget) return -1;
    size_t allowance = memory_allowance(gpu_comm_count(comm));
    double mb = 1.0 / (1024.0 * 1024.0);
    int T = o->seq_len, W = comm->world;
    long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * T * W;
    long long seqs = total / ((long long)T * W); /* sequences per rank per step */
    if (seqs < 1 || seqs * T * W != total) {
        fprintf(stderr, "error: --plan: the global batch %lld tokens is not a multiple of T x ranks = %d\n", total, T * W);
        return -1;
    }
    if (print) {
        GpuPlanKnobs mine = gpu_plan_knobs(o, o->batch_size, T, comm);
        MemoryPlan p = gpu_memory_plan_for(c, &mine);
        printf("plan: model L=%d C=%d NH=%d Vp=%d, %zu parameters; B=%d T=%d, %d rank(s), ZeRO %d, recompute %d, "
               "offload %d (device memory of rank %d)\n", c->num_layers, c->channels, c->num_heads,
               c->padded_vocab_size, parameter_count(c), o->batch_size, T, W, o->zero, o->recompute, o->offload,
               comm->rank);
        memory_plan_print(&p);
        printf("budget: %.1f MB (%s), less %.0f MB allowance for what loads lazily: %.1f MB usable\n", budget * mb,
               how, allowance * mb, budget > allowance ? (budget - allowance) * mb : 0.0);
        printf("%6s %6s %4s %4s %7s | %9s %9s %9s %9s %9s %9s %9s | %10s %5s | %10s %10s %9s %9s\n", "B", "accum",
               "zero", "rcmp", "offload", "weights", "master", "grads", "moments", "acts", "scratch", "other",
               "total MB", "fits", "step ms", "tok/s", "comm ms", "opt ms");
        printf("(MB of device memory by component; step ms predicted by the runtime model from the calibration "
               "above: micro-batches, then the collectives not hidden and the optimizer)\n");
    }
    int found = 0;
    size_t least = 0;
    GpuPlanChoice smallest;
    memset(&smallest, 0, sizeof(smallest));
    for (int offload = 0; offload <= 1; offload++)
        for (int zero = 0; zero <= (W > 1 ? 3 : 0); zero++)
            for (int r = 0; r < RECOMPUTE_LEVELS; r++)
                for (long long B = seqs; B >= 1; B--) {
                    if (seqs % B || (offload && zero)) continue;
                    GpuPlanKnobs k = {(int)B, T, r, zero, comm->rank, W, W > 1 || zero > 0, offload, 0, 0, 0, 0, 0, 1};
                    MemoryPlan q = gpu_memory_plan_for(c, &k);
                    size_t need = memory_plan_total(&q), other = need;
                    size_t show[7] = {q.bytes[GMEM_PARAMS] + q.bytes[GMEM_ZERO], q.bytes[GMEM_MASTER], q.bytes[GMEM_GRADS],
                                      q.bytes[GMEM_ADAMW], q.bytes[GMEM_ACTS], q.bytes[GMEM_SCRATCH], 0};
                    for (int i = 0; i < 6; i++) other -= show[i];
                    show[6] = other;
                    int fits = need + allowance <= budget;
                    GpuStepTime t = gpu_runtime_step(cal, c, &k, (int)(seqs / B), o->overlap);
                    if (print) {
                        printf("%6lld %6lld %4d %4d %7d |", B, seqs / B, zero, r, offload);
                        for (int i = 0; i < 7; i++) printf(" %9.1f", show[i] * mb);
                        printf(" | %10.1f %5s | %10.3f %10.0f %9.3f %9.3f\n", need * mb, fits ? "yes" : "no", t.step,
                               total / (t.step / 1e3), t.comm, t.optimizer);
                    }
                    GpuPlanChoice cand = {k, seqs / B, need, t};
                    if (fits && (!found || t.step < out->t.step)) {
                        found = 1;
                        *out = cand;
                    }
                    if (!least || need < least) {
                        least = need;
                        smallest = cand;
                    }
                }
    if (!found) {
        fprintf(stderr, "error: --plan: nothing fits in %.1f MB (%s) with %.0f MB allowance: the smallest is B=%d "
                "--zero %d --recompute %d --offload %d, which needs %.1f MB of device memory\n", budget * mb, how,
                allowance * mb, smallest.k.B, smallest.k.zero, smallest.k.recompute, smallest.k.offload,
                least * mb);
        return -1;
    }
    if (print)
        printf("plan: choice (the fastest that fits): -b %d --zero %d --recompute %d --offload %d, %.1f MB of device "
               "memory, predicted %.3f ms per step (%lld micro-batches of %.3f ms, collectives %.3f ms not hidden, "
               "optimizer %.3f ms), %.0f tokens/s\n", out->k.B, out->k.zero, out->k.recompute, out->k.offload,
               out->need * mb, out->t.step, out->accum, out->t.micro, out->t.comm, out->t.optimizer,
               total / (out->t.step / 1e3));
    return 0;
}

/* --plan 1: the calibration, the plan and its candidates; 0, or -1 when nothing fits. */
static int gpu_plan_print(const Options* o, GpuComm* comm) {
    GPT2Config c;
    if (plan_config(o, &c) != 0) return -1;
    long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * o->seq_len * comm->world;
    GpuCalibration cal;
    gpu_calibration_get(&cal, &c, o->seq_len, total / ((long long)o->seq_len * comm->world), o, comm);
    if (comm->rank == 0) gpu_calibration_print(&cal);
    GpuPlanChoice ch;
    return gpu_plan_choose(o, comm, &c, &cal, 1, &ch);
}

/* Before the model is built: --auto 1 (B, the total, --zero, --recompute
 * and --offload set to the plan's choice, as if given) and --snapshot-every
 * auto (the Young/Daly interval from the predicted step and snapshot).
 * Every rank calibrates; rank 0 chooses, and its choice is everyone's. 0,
 * or -1 after a message. */
static int gpu_plan_runtime(Options* o, GpuComm* comm) {
    GPT2Config c;
    double ok = plan_config(o, &c) == 0;
    gpu_comm_sum(comm, &ok, 1);
    if (ok < comm->world - 0.5) return -1; /* (each rank that failed said why) */
    int W = comm->world;
    long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * o->seq_len * W;
    GpuCalibration cal;
    gpu_calibration_get(&cal, &c, o->seq_len, total / ((long long)o->seq_len * W), o, comm);
    if (comm->rank == 0) gpu_calibration_print(&cal);
    if (o->auto_plan) {
        GpuPlanChoice ch;
        double knobs[5] = {0, 0, 0, 0, 0};
        int rc = comm->rank == 0 ? gpu_plan_choose(o, comm, &c, &cal, 0, &ch) : 0;
        if (comm->rank == 0 && rc == 0) {
            double v[5] = {(double)ch.k.B, (double)ch.k.zero, (double)ch.k.recompute, (double)ch.k.offload, 1.0};
            memcpy(knobs, v, sizeof(v));
        }
        gpu_comm_sum(comm, knobs, 5);
        if (knobs[4] < 0.5) return -1; /* (rank 0 said why) */
        o->batch_size = (int)knobs[0];
        o->total_batch_size = (int)total;
        o->zero = (int)knobs[1];
        o->recompute = (int)knobs[2];
        o->offload = (int)knobs[3];
        GpuPlanKnobs k = gpu_plan_knobs(o, o->batch_size, o->seq_len, comm);
        MemoryPlan p = gpu_memory_plan_for(&c, &k);
        int accum = (int)(total / ((long long)o->batch_size * o->seq_len * W));
        GpuStepTime t = gpu_runtime_step(&cal, &c, &k, accum, o->overlap);
        printf("auto: --batch-size %d --total-batch-size %lld --zero %d --recompute %d --offload %d (%d micro-batches): "
               "predicted %.3f ms per step, %.0f tokens/s, %.1f MB of device memory, the fastest of the candidates "
               "that fit --memory-budget %s (--plan 1 lists them)\n", o->batch_size, total, o->zero, o->recompute,
               o->offload, accum, t.step, total / (t.step / 1e3), memory_plan_total(&p) / (1024.0 * 1024.0),
               o->memory_budget);
    }
    if (o->snapshot_auto) {
        GpuPlanKnobs k = gpu_plan_knobs(o, o->batch_size, o->seq_len, comm);
        int accum = (int)(total / ((long long)o->batch_size * o->seq_len * W));
        GpuStepTime t = gpu_runtime_step(&cal, &c, &k, accum < 1 ? 1 : accum, o->overlap);
        double snap = gpu_runtime_snapshot_ms(&cal, &c, W, o->zero), interval = 0.0;
        double every = young_daly_steps(snap, o->mtbf, t.step, &interval);
        if (comm->rank != 0) every = 0;
        gpu_comm_sum(comm, &every, 1); /* rank 0's figure, for all */
        o->snapshot_every = (int)every;
        snapshot_auto_say(o->snapshot_every, t.step, snap, o->mtbf, "the state to the host and into its slot");
    }
    return 0;
}

#endif /* GPTC_CUDA_RUNTIME_CUH */
