/* gptc/cuda/zero.cuh: the data-parallel set-up and ZeRO's shards on and off the device.
 * Included by train_gpt.cu after its data-parallel step (dp_step). Defines
 * dp_layout, the ZeRO-3 gathers (dp_gather_bucket, dp_weights_begin,
 * dp_layer_weights), dp_init, dp_free, dp_print, dp_shards_to_host,
 * dp_params_to_host, dp_state_to_host and dp_state_upload. */
#ifndef GPTC_CUDA_ZERO_CUH
#define GPTC_CUDA_ZERO_CUH

/* Shapes and sizes only (nothing allocated): enough for the memory plan. */
static void dp_layout(GpuDataParallel* dp, GpuComm* comm, const GPT2Config* c, int zero, int overlap) {
    memset(dp, 0, sizeof(*dp));
    dp->comm = comm;
    dp->zero = zero;
    dp->rank = comm->rank;
    dp->world = comm->world;
    dp->L = c->num_layers;
    dp->active = comm->nccl != NULL;
    dp->overlap = overlap || zero >= 2;
    dp_sizes(c, zero, comm->rank, comm->world, &dp->map, &dp->shard, &dp->grad_floats); /* (the plan's too) */
}

/* ZeRO-3 (scripts/tests/test_cuda_zero3.sh). The bf16 weights are sharded as the master
 * is: rank r keeps param_shard, its piece of every bucket (S), which AdamW
 * (adamw_shard_kernel) writes in place; nothing is gathered after the
 * update. They are gathered where they are used, by ncclAllGather of one
 * bucket on the communication stream into a buffer that the layer's
 * kernels and cuBLASLt calls read (gpu_layer_params), the CPU trainer's
 * scheme (gptc/zero3.h): the head (wte | wpe | lnf) at the start of every
 * forward, held through its backward (the LM head is wte: needed at the end
 * of forward and the start of backward); layer l before its forward and
 * again before its backward, into buffer l % 2, the next layer's gather (l
 * + 1 in forward, l - 1 in backward) issued when layer l's kernels are
 * queued, so that it runs while layer l computes. Order: a gather waits
 * (w_free) for everything the compute stream queued before it (the
 * buffer's last reader, layer l - 1 or l + 1, and the update that wrote the
 * shard); the compute stream waits (w_ready) for the gather before the
 * layer. The gradients are ZeRO-2's (two one-layer slots reduce-scattered
 * as backward finishes each layer, the head's bucket at the end), so the
 * weights read, the sums and the update are ZeRO-2's: the losses equal
 * ZeRO-2's bit for bit. Bytes each rank sends per step, A micro-batches
 * (flat; bf16 weights, fp32 gradients; P' = L Pl + Pr the padded buckets,
 * Pl = W x layer piece, Pr = W x rest piece):
 *   (W-1)/W x (4 B x P' x A reduce-scatter + 2 B x A (Pr + 2 L Pl) all-gather)
 * against ZeRO-2's (W-1)/W x (4 P' A + 2 P'): per micro-batch one gather of
 * the weights for forward and one more of the layers for backward (about
 * 3 Psi for A = 1 counted in bf16 elements, the gradients' reduce-scatter
 * as 2 Psi for its fp32). */

/* Bucket b's bf16 pieces gathered into dst on the communication stream once
 * the compute stream has done what it queued so far; w_ready[e] then. */
static void dp_gather_bucket(GpuDataParallel* dp, int b, floatX* dst, int e) {
    cudaStream_t cs = dp->comm->stream;
    const BucketShape* s = shard_map_bucket(&dp->map, b);
    CUDA_CHECK(cudaEventRecord(dp->w_free, dp->g->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cs, dp->w_free, 0));
    if (dp->zpp && (dp->zpp->qwz || dp->zpp->hpz)) { /* ZeRO++: qwZ's slots, hpZ's secondary (above) */
        gpu_zeropp_gather(dp, b, dst);
        CUDA_CHECK(cudaEventRecord(dp->w_ready[e], cs));
        return;
    }
    gpu_levels_count(dp->comm, s->piece * (size_t)dp->world, s->piece, sizeof(floatX), 0, 1); /* (flat) */
    NCCL_CHECK(ncclAllGather(dp->param_shard + shard_map_offset(&dp->map, b), dst, s->piece, ncclBfloat16,
                             dp->comm->nccl, cs));
    CUDA_CHECK(cudaEventRecord(dp->w_ready[e], cs));
}

/* GpuGPT2's weights_begin: a forward gathers the head (waited for at once:
 * the encoder reads it) and starts layer 0's; a backward starts layer L-1's. */
static void dp_weights_begin(void* ctx, int backward) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    int L = dp->L;
    dp->backward = backward; /* (ZeRO++'s hpZ: backward's gathers come from the node) */
    if (backward) {
        dp_gather_bucket(dp, L - 1, dp->layer_buf[(L - 1) % 2], (L - 1) % 2);
        return;
    }
    dp_gather_bucket(dp, L, dp->head, 2);
    dp_gather_bucket(dp, 0, dp->layer_buf[0], 0);
    CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->w_ready[2], 0));
}

/* GpuGPT2's layer_weights: the next layer's gather started, then layer l's waited for. */
static const floatX* dp_layer_weights(void* ctx, int l, int backward) {
    GpuDataParallel* dp = (GpuDataParallel*)ctx;
    int next = backward ? l - 1 : l + 1;
    dp->backward = backward;
    if (next >= 0 && next < dp->L) dp_gather_bucket(dp, next, dp->layer_buf[next % 2], next % 2);
    CUDA_CHECK(cudaStreamWaitEvent(dp->g->stream, dp->w_ready[l % 2], 0));
    return dp->layer_buf[l % 2];
}

/* Allocate what the mode needs, fill the master shard and the bf16 weights
 * from the host model, and hook into g's backward (ZeRO-3: its forward too). */
static void dp_init(GpuDataParallel* dp, GpuGPT2* g, const GPT2* host) {
    dp->g = g;
    if (!dp->active) return; /* one GPU, plain: gpu_model_init did everything */
    cudaEvent_t* sync[] = {&dp->grads_ready, &dp->reduced, &dp->updated, &dp->comm_idle, &dp->slot_free[0],
                           &dp->slot_free[1], &dp->slot_free[2], &dp->w_free, &dp->w_ready[0], &dp->w_ready[1],
                           &dp->w_ready[2]};
    for (size_t i = 0; i < sizeof(sync) / sizeof(sync[0]); i++)
        CUDA_CHECK(cudaEventCreateWithFlags(sync[i], cudaEventDisableTiming));
    cudaEvent_t* timing[] = {&dp->t_backward, &dp->t_reduced, &dp->t_gather0, &dp->t_gather1};
    for (size_t i = 0; i < sizeof(timing) / sizeof(timing[0]); i++) CUDA_CHECK(cudaEventCreate(timing[i]));
    g->grads_begin = dp_grads_begin;
    g->grads_end = dp_grads_end;
    g->grads_ctx = dp;
    if (dp->zero == 0) return; /* the flat gradients of gpu_model_init, reduced in place */

    size_t S = dp->shard, W = (size_t)dp->world;
    int L = dp->L;
    dp->map_dev = (ShardMap*)gpu_alloc(sizeof(ShardMap), GMEM_ZERO);
    CUDA_CHECK(cudaMemcpy(dp->map_dev, &dp->map, sizeof(ShardMap), cudaMemcpyHostToDevice));
    float** f32[] = {&dp->grad_shard, &dp->master, &dp->m, &dp->v};
    int component[] = {GMEM_GRADS, GMEM_MASTER, GMEM_ADAMW, GMEM_ADAMW};
    for (int i = 0; i < 4; i++) {
        *f32[i] = (float*)gpu_alloc(S * sizeof(float), component[i]);
        CUDA_CHECK(cudaMemset(*f32[i], 0, S * sizeof(float)));
    }
    dp->param_shard = (floatX*)gpu_alloc(S * sizeof(floatX), GMEM_ZERO);
    dp->grad_memory = (float*)gpu_alloc(dp->grad_floats * sizeof(float), GMEM_GRADS);
    dp->bucket = (float**)xmalloc(sizeof(float*) * (size_t)(L + 1));
    for (int b = 0; b <= L; b++) {
        size_t at = dp->zero == 1 ? W * shard_map_offset(&dp->map, b)            /* every bucket its own */
                    : b < L ? (size_t)(b % 2) * W * dp->map.layer.piece           /* two layer slots */
                            : 2 * W * dp->map.layer.piece;                        /* then the rest */
        dp->bucket[b] = dp->grad_memory + at;
    }
    /* backward writes the layers into their buckets, and the rest's tensors into its own */
    g->grad_buckets = dp->bucket;
    memset(&g->grads, 0, sizeof(g->grads));
    const BucketShape* rest = &dp->map.rest;
    for (int k = 0; k < rest->nseg; k++) ((float**)&g->grads)[rest->k[k]] = dp->bucket[L] + rest->pre[k];

    /* the master shard, packed on the host, bucket by bucket */
    float* h = xmalloc_floats(S);
    for (int b = 0; b <= L; b++) shard_pack_host(h + shard_map_offset(&dp->map, b), host->params_memory, &dp->map, b, dp->rank);
    CUDA_CHECK(cudaMemcpy(dp->master, h, S * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    if (dp->zero == 3) { /* the shard's bf16 weights, rounded to nearest (as below); the buffers they are gathered into */
        shard_round_kernel<<<ceil_div((long long)S, 256), 256, 0, g->stream>>>(dp->param_shard, dp->master, S,
                                                                               dp->map_dev, 0, 0u);
        KERNEL_CHECK();
        dp->head = g->params_memory;
        dp->layer_buf[0] = dp->head + W * rest->piece;
        dp->layer_buf[1] = dp->layer_buf[0] + W * dp->map.layer.piece;
        memset(&g->params, 0, sizeof(g->params)); /* the layers' come from gpu_layer_params */
        for (int k = 0; k < rest->nseg; k++) ((floatX**)&g->params)[rest->k[k]] = dp->head + rest->pre[k];
        g->weights_begin = dp_weights_begin;
        g->layer_weights = dp_layer_weights;
        gpu_zeropp_init(dp); /* (nothing without --qwz, --qgz, --hpz) */
        CUDA_CHECK(cudaDeviceSynchronize());
        return;
    }
    /* the whole bf16 weights, rounded to nearest as gpu_model_init does, through the gradient buffer in chunks */
    size_t P = g->num_parameters;
    for (size_t at = 0; at < P; at += dp->grad_floats) {
        size_t n = P - at < dp->grad_floats ? P - at : dp->grad_floats;
        CUDA_CHECK(cudaMemcpy(dp->grad_memory, host->params_memory + at, n * sizeof(float), cudaMemcpyHostToDevice));
        float_to_bf16_kernel<<<ceil_div((long long)n, 256), 256, 0, g->stream>>>(g->params_memory + at, dp->grad_memory, n);
        KERNEL_CHECK();
        gpu_wait(g->stream, NULL); /* before the next chunk overwrites the staging */
    }
    CUDA_CHECK(cudaMemset(dp->grad_memory, 0, dp->grad_floats * sizeof(float)));
    CUDA_CHECK(cudaDeviceSynchronize());
}

static void dp_free(GpuDataParallel* dp) {
    if (!dp->active) return;
    gpu_wait(dp->comm->stream, NULL);
    cudaEvent_t ev[] = {dp->grads_ready, dp->reduced, dp->updated, dp->comm_idle, dp->slot_free[0], dp->slot_free[1],
                        dp->slot_free[2], dp->w_free, dp->w_ready[0], dp->w_ready[1], dp->w_ready[2], dp->t_backward,
                        dp->t_reduced, dp->t_gather0, dp->t_gather1};
    for (size_t i = 0; i < sizeof(ev) / sizeof(ev[0]); i++) CUDA_CHECK(cudaEventDestroy(ev[i]));
    gpu_zeropp_free(dp);
    void* mem[] = {dp->map_dev, dp->grad_shard, dp->master, dp->m, dp->v, dp->param_shard, dp->grad_memory};
    for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++) gpu_release(mem[i]);
    free(dp->bucket);
    if (dp->g) {
        dp->g->grads_begin = dp->g->grads_end = NULL;
        dp->g->grad_buckets = NULL;
        dp->g->weights_begin = NULL;
        dp->g->layer_weights = NULL;
    }
    memset(dp, 0, sizeof(*dp));
}

/* What the run prints at the start: mode, memory per rank, traffic per step. */
static void dp_print(const GpuDataParallel* dp, size_t P, int micro_batches) {
    double mb = 1.0 / (1024.0 * 1024.0), W = dp->world, S = (double)dp->shard, Pp = S * W;
    if (!dp->active) {
        printf("data parallel: off (one GPU, --zero 0%s)\n", GPU_HAVE_NCCL ? "" : "; this build has no NCCL");
        return;
    }
    int nc = 0;
    NCCL_CHECK(ncclGetVersion(&nc));
    static const char* const names[4] = {"plain (allreduce)", "ZeRO-1 (optimizer state sharded)",
                                         "ZeRO-2 (optimizer state and gradients sharded)",
                                         "ZeRO-3 (weights, gradients and optimizer state sharded; the weights gathered "
                                         "layer by layer; not run on a GPU, checked on the CPU execution layer)"};
    printf("data parallel: %s over %d rank(s) met through %s, NCCL %d.%d.%d; this rank %d, GPU %d; reductions %s\n",
           names[dp->zero], dp->world, dp->comm->how, nc / 10000, (nc / 100) % 100, nc % 100, dp->rank,
           dp->comm->device, dp->overlap ? "overlap backward, bucket by bucket" : "after backward (--overlap 0)");
    printf("buckets: %d layers of %zu parameters, then wte+wpe+lnf with %zu; pieces of %zu and %zu per rank "
           "(padded to %d x %d)\n", dp->L, dp->map.layer.pre[dp->map.layer.nseg], dp->map.rest.pre[dp->map.rest.nseg],
           dp->map.layer.piece, dp->map.rest.piece, dp->world, DP_ALIGN);
    const GpuLevels* lv = &dp->comm->lv;
    if (dp->world > 1)
        printf("levels: %d node(s) x %d rank(s) (%s); gradients reduced %s (not run on a GPU; checked on the CPU "
               "execution layer)\n", lv->nodes, lv->per_node, lv->by_host ? "by host name" : "--topology",
               lv->hierarchical ? "by level: inside the node, across nodes on 1/K, inside the node again "
                                  "(communicators per level by ncclCommSplit)" : "flat (one communicator)");
    double bytes;
    if (dp->zero == 0) {
        printf("per-rank state: bf16 weights %.0f MB, fp32 gradients %.0f MB, fp32 master + AdamW %.0f MB\n",
               2 * P * mb, 4 * P * mb, 12 * P * mb);
        bytes = 2.0 * (W - 1) / W * 4.0 * (double)P;
        printf("sent per rank and step: allreduce 2 (W-1)/W x 4 B x P = %.1f MB (fp32 gradients, ring)\n", bytes * mb);
        return;
    }
    if (dp->zero == 3) { /* (the formula above dp_gather_bucket) */
        double Pl = (double)dp->map.layer.piece * W, Pr = (double)dp->map.rest.piece * W, A = micro_batches;
        printf("per-rank state: bf16 weights: the shard's %.1f MB + gathered %.1f MB (the head and 2 layers), fp32 "
               "gradients %.1f MB (2 layer slots + the rest) + %.1f MB the shard's, fp32 master + AdamW %.1f MB "
               "(shard of %zu)\n", 2 * S * mb, 2 * (Pr + 2 * Pl) * mb, 4.0 * dp->grad_floats * mb, 4 * S * mb,
               12 * S * mb, dp->shard);
        bytes = (W - 1) / W * (4.0 * Pp * A + 2.0 * A * (Pr + 2.0 * dp->L * Pl));
        printf("sent per rank and step: (W-1)/W x (4 B x P' x %.0f reduce-scatter(s) + 2 B x %.0f x (Pr + 2 L Pl) "
               "all-gathers) = %.1f MB (P' = %.0f, Pl = %.0f, Pr = %.0f padded; fp32 gradients, bf16 weights, ring)\n",
               A, A, bytes * mb, Pp, Pl, Pr);
        return;
    }
    printf("per-rank state: bf16 weights %.0f MB (+ %.0f MB the shard's, to send), fp32 gradients %.0f MB (%s) "
           "+ %.0f MB the shard's, fp32 master + AdamW %.0f MB (shard of %zu)\n", 2 * P * mb, 2 * S * mb,
           4.0 * dp->grad_floats * mb, dp->zero == 1 ? "every bucket, packed" : "2 layer slots + the rest",
           4 * S * mb, 12 * S * mb, dp->shard);
    double reductions = dp->zero == 2 ? micro_batches : 1;
    bytes = (W - 1) / W * (4.0 * Pp * reductions + 2.0 * Pp);
    printf("sent per rank and step: (W-1)/W x (4 B x P' x %.0f reduce-scatter(s) + 2 B x P' all-gather) = %.1f MB "
           "(P' = %.0f padded parameters; fp32 gradients, bf16 weights, ring)\n", reductions, bytes * mb, Pp);
}

/* A sharded fp32 array (master, m or v: S floats, bucket-interleaved) into
 * its flat file-order twin on the host (P floats), on every rank: each
 * bucket's pieces are all-gathered into its gradient memory (free between
 * steps), copied out and unpacked. A collective: every rank calls it. */
static void dp_shards_to_host(GpuDataParallel* dp, const float* shard, float* flat) {
    cudaStream_t cs = dp->comm->stream;
    gpu_wait(dp->g->stream, NULL);
    gpu_wait(cs, NULL);
    size_t most = dp_bucket_floats(dp, dp->L) > dp_bucket_floats(dp, 0) ? dp_bucket_floats(dp, dp->L)
                                                                          : dp_bucket_floats(dp, 0);
    float* packed = xmalloc_floats(most);
    for (int b = 0; b <= dp->L; b++) {
        const BucketShape* s = shard_map_bucket(&dp->map, b);
        NCCL_CHECK(ncclAllGather(shard + shard_map_offset(&dp->map, b), dp->bucket[b], s->piece, ncclFloat,
                                 dp->comm->nccl, cs));
        gpu_wait(cs, NULL);
        CUDA_CHECK(cudaMemcpy(packed, dp->bucket[b], s->pre[s->nseg] * sizeof(float), cudaMemcpyDeviceToHost));
        bucket_unpack_host(flat, packed, &dp->map, b);
    }
    free(packed);
    CUDA_CHECK(cudaEventRecord(dp->comm_idle, cs)); /* (the buckets are zeroed again before backward writes them) */
}

/* The fp32 master weights into the host model (samples, checkpoints). Under
 * ZeRO a collective: every rank must call it. */
static void dp_params_to_host(GpuDataParallel* dp, GPT2* host) {
    if (dp->zero == 0) gpu_params_to_host(dp->g, host);
    else dp_shards_to_host(dp, dp->master, host->params_memory);
}

/* Training states under ZeRO (G7; scripts/tests/test_zero_states.sh): the whole
 * state into the host's flat arrays (P floats each), the layout train_gpt.c's Saver writes from: the
 * master, m and v gathered on every rank (dp_shards_to_host three times). A
 * collective. Cost per snapshot and rank: NCCL receives (W-1)/W x 12 P'
 * bytes (P' = P padded), the host copies 12 P bytes out of the staging and
 * unpacks them, though the rank saves only its 12 P / W; memory: the
 * gradient buckets as device staging (free between steps: nothing more on the
 * device), one pageable host buffer of the largest bucket, and the host's
 * flat arrays (12 P, pinned, as --zero 0 has them). Synchronous: unlike
 * --zero 0's copies on a side stream, these do not overlap the next step. */
static void dp_state_to_host(GpuDataParallel* dp, float* params, float* m, float* v) {
    dp_shards_to_host(dp, dp->master, params);
    dp_shards_to_host(dp, dp->m, m);
    dp_shards_to_host(dp, dp->v, v);
}

/* The other way: a flat state on the host (params, and m, v when given)
 * onto the device, as gpu_weights_upload does for --zero 0 (which this calls
 * then). Under ZeRO each rank packs its shard of each array, bucket by
 * bucket (shard_pack_host: the pad 0), uploads it, rounds the shard's bf16
 * weights as update `update` rounded them (or to nearest when < 0;
 * shard_round_kernel) and all-gathers them as a step does
 * (dp_gather_weights). The state may come from any number of ranks and any
 * --zero, GPU or CPU: it is flat. Waits until done. A collective. */
static void dp_state_upload(GpuDataParallel* dp, const float* params, const float* m, const float* v, int run_seed,
                            int update) {
    GpuGPT2* g = dp->g;
    if (dp->zero == 0) {
        gpu_weights_upload(g, params, m, v, run_seed, update);
        return;
    }
    size_t S = dp->shard;
    float* h = xmalloc_floats(S);
    const float* from[3] = {params, m, v};
    float* to[3] = {dp->master, dp->m, dp->v};
    for (int a = 0; a < 3; a++) {
        if (!from[a]) continue; /* (no moments: they stay as they are, zeros at the start) */
        for (int b = 0; b <= dp->L; b++)
            shard_pack_host(h + shard_map_offset(&dp->map, b), from[a], &dp->map, b, dp->rank);
        CUDA_CHECK(cudaMemcpy(to[a], h, S * sizeof(float), cudaMemcpyHostToDevice));
    }
    free(h);
    uint32_t seed = update < 0 ? 0u : gpu_update_seed(run_seed, update);
    gpu_wait(dp->comm->stream, NULL); /* nothing in flight reads the staging or the shard */
    shard_round_kernel<<<ceil_div((long long)S, 256), 256, 0, g->stream>>>(dp->param_shard, dp->master, S, dp->map_dev,
                                                                           update >= 0, seed);
    KERNEL_CHECK();
    if (dp->zero < 3) dp_gather_weights(dp); /* (ZeRO-3: the next forward gathers) */
    CUDA_CHECK(cudaEventRecord(dp->comm_idle, dp->comm->stream));
    gpu_wait(dp->comm->stream, NULL);
    gpu_wait(g->stream, NULL);
}

#endif /* GPTC_CUDA_ZERO_CUH */
