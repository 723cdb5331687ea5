/* gptc/cuda/zeropp.cuh: ZeRO++ on --zero 3 (--qwz, --qgz, --hpz) over NCCL.
 * Included by train_gpt.cu after GpuDataParallel. Defines struct GpuZeroPP,
 * dp_zeropp_flags, gpu_zeropp_problem, gpu_zeropp_init, gpu_zeropp_free,
 * gpu_zeropp_gather, gpu_zeropp_reduce and the GPTC_ZEROPP_DUMP records
 * (test builds only, -DGPTC_TEST_HOOKS). */
#ifndef GPTC_CUDA_ZEROPP_CUH
#define GPTC_CUDA_ZEROPP_CUH

/* ZeRO++ on --zero 3 (gpu_zeropp_init; NULL in GpuDataParallel without its flags). */
typedef struct GpuZeroPP {
    int qwz, qgz, feedback, hpz, block; /* the flags: bits (0: bf16 gathers, fp32 reductions), 0/1, block */
    int N, K, node, local;   /* nodes, ranks per node, this rank's node and index in it */
    int* who;                /* (W) host: the world rank of (local j, node p) at j N + p */
    int* who_dev;            /* (W) the same on the device */
    int* slot_of;            /* (W) device: rank q's slot, local_of[q] N + node_of[q] */
    uint8_t *send, *recv;    /* (W sb) each (gpu_zeropp_sizes) */
    float* partial;          /* qgZ (N piece) */
    floatX* secondary;       /* hpZ (N S): bucket b's [local N piece, + N piece) at N offset(b) */
    float* residual;         /* --qgz-feedback ((W + N) S) */
    int sec_step, sec_filled; /* the step it was cut in (GpuLevels.steps), and whether the cut is complete */
    FILE* dump;              /* GPTC_ZEROPP_DUMP: this rank's records (gptc/zeropp.h's format), else NULL */
    int dump_step, dump_sec_step;
} GpuZeroPP;

/* ---- ZeRO++ on --zero 3: qwZ, hpZ, qgZ over NCCL ---------------------------
 * Tested on emulated GPUs (MPI ranks, NCCL over MPI:
 * scripts/tests/test_cuda_zeropp.sh). The CPU trainer's semantics (gptc/zeropp.h,
 * whose header tells the story), on the GPU's bucket layout: the unit is a
 * bucket (a layer's 12 slices packed, or the rest: wte | wpe | lnf), whose
 * W pieces all have the same length `piece`, rank q's at q piece; so a
 * slot has one size sb = quant_slot_bytes(piece) on every rank and each
 * level's exchange is one NCCL collective or group of equal messages. The
 * machine is gpu_levels_init's: N nodes of K ranks, communicators intra
 * (ranked by local index j) and inter (ranked by node p), from ncclCommSplit.
 *   qwZ (--qwz 8|4), a gathered bucket: quant_encode_gpu quantises this
 *     rank's piece of the fp32 master (not the bf16 shard) into its slot at
 *     (j N + p) sb of `send`; ncclAllGather over inter (each slot to the ranks
 *     with its j: (N-1) sb bytes inter-node), then over intra of the N slots
 *     of each j as one bundle ((K-1) N sb intra-node), both in place;
 *     qwz_decode_kernel dequantises all W slots (this rank's own too) into
 *     the bf16 gather buffer, rounded to nearest: every rank computes with
 *     bf16(deq(q(master))).
 *   hpZ (--hpz 1): local index j keeps `secondary`, bucket b's elements [j N
 *     piece, (j+1) N piece) in bf16 (N S in all), copied out of the gather
 *     buffer by each step's first forward (before any backward); from the
 *     step's first backward gather on (backward, and the forwards of later
 *     micro-batches) a bucket is ncclAllGather'ed from the node's
 *     secondaries over intra: (K-1) N piece x 2 bytes intra-node, nothing
 *     across. Validation, outside a step, gathers from the primary shards.
 *     Alone it gathers the very bf16 of plain --zero 3: bit for bit its run.
 *   qgZ (--qgz 4|8), a reduced bucket (this rank's packed gradients): hop 0,
 *     every piece owned by another local index quantised (error feedback:
 *     residual + v, what was lost kept) and sent as N slots per node peer by
 *     ncclSend/ncclRecv in one group over intra ((K-1) N sb intra-node);
 *     qgz_hop0_kernel sums in fp32 the rank's own values and the peers'
 *     dequantised slots for the N pieces of its local index; hop 1, each of
 *     those partial sums but its own node's quantised once and sent to the
 *     node that owns it, one group over inter ((N-1) sb inter-node);
 *     qgz_hop1_kernel adds the other nodes' into its own and the result into
 *     grad_shard. The sum orders are the CPU's (peers j-1, j-2, ... at hop
 *     0; nodes p-1, p-2, ... at hop 1).
 * Everything runs on the communication stream, ordered after the events
 * plain ZeRO-3 has (w_free before a gather, grads_ready before a reduction,
 * slot_free after it), and shares its buffers (send, recv) because that
 * stream runs one thing at a time. GPTC_ZEROPP_DUMP=dir writes
 * gptc/zeropp.h's records, in this layout (scripts/tests/zeropp_ref.py --layout
 * buckets --gather bf16): a = the bucket's offset in the shard and n = W
 * piece for gathers and reductions (rank q's piece at q piece of the
 * record), the masters (without qwZ: the bf16 shard that is gathered, which
 * AdamW rounded stochastically from the master) and grad_shard as [rank S,
 * + S), the secondary in
 * the same shard-major order ([j N S, + N S)), the gathered weights as the
 * bf16 buffer's values. Each record waits for the stream (a debugging aid:
 * unset it to time anything). */

/* The dump is a test hook: compiled into test builds only (-DGPTC_TEST_HOOKS);
 * elsewhere z->dump stays NULL and these do nothing. */
#ifdef GPTC_TEST_HOOKS
/* one record: header then n fp32 (gptc/zeropp.h's zeropp_dump) */
static void gpu_zeropp_record(GpuDataParallel* dp, int tag, int source, size_t a, size_t n, const float* host) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    int64_t h[8] = {ZEROPP_DUMP_MAGIC, tag, lv->steps, dp->backward, source, (int64_t)a, (int64_t)n, 0};
    CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(host, sizeof(float), n, z->dump) == n,
          "GPTC_ZEROPP_DUMP: writing rank %d's record failed (disk full?): unset it or free space", dp->rank);
}

/* n elements of device memory (bf16 when `half`, else fp32), read on the
 * communication stream once what it has queued is done, as fp32 on the host
 * (malloc'd: the caller frees it). */
static float* gpu_zeropp_fetch(GpuDataParallel* dp, const void* dev, size_t n, int half) {
    cudaStream_t cs = dp->comm->stream;
    float* host = xmalloc_floats(n ? n : 1);
    if (half) {
        uint16_t* raw = (uint16_t*)xmalloc(n * sizeof(uint16_t) + 1);
        CUDA_CHECK(cudaMemcpyAsync(raw, dev, n * sizeof(uint16_t), cudaMemcpyDeviceToHost, cs));
        gpu_wait(cs, NULL);
        for (size_t i = 0; i < n; i++) { /* bf16 is the top half of an fp32: exact */
            uint32_t u = (uint32_t)raw[i] << 16;
            memcpy(host + i, &u, sizeof(u));
        }
        free(raw);
    } else {
        CUDA_CHECK(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, cs));
        gpu_wait(cs, NULL);
    }
    return host;
}

static void gpu_zeropp_dump(GpuDataParallel* dp, int tag, int source, size_t a, size_t n, const void* dev, int half) {
    float* host = gpu_zeropp_fetch(dp, dev, n, half);
    gpu_zeropp_record(dp, tag, source, a, n, host);
    free(host);
}

/* hpZ's secondary, in shard-major order (rank j N + i's pieces at i S + offset(b)) */
static void gpu_zeropp_dump_secondary(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    size_t S = dp->shard, N = (size_t)z->N;
    float* sec = gpu_zeropp_fetch(dp, z->secondary, N * S, 1);
    float* out = xmalloc_floats(N * S);
    for (int b = 0; b <= dp->L; b++) {
        size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b);
        for (size_t i = 0; i < N; i++) memcpy(out + i * S + off, sec + N * off + i * p, p * sizeof(float));
    }
    gpu_zeropp_record(dp, 3, 2, (size_t)z->local * N * S, N * S, out);
    free(sec);
    free(out);
}

/* GPTC_ZEROPP_DUMP=dir: this rank's file, opened with gptc/zeropp.h's config record */
static void gpu_zeropp_dump_open(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    int W = dp->world;
    const char* dir = getenv("GPTC_ZEROPP_DUMP");
    if (dir && *dir) { /* gptc/zeropp.h's config record */
        char path[4096];
        CHECK(snprintf(path, sizeof(path), "%s/rank%d.bin", dir, dp->rank) < (int)sizeof(path),
              "GPTC_ZEROPP_DUMP=%s: the path is too long", dir);
        z->dump = fopen(path, "wb");
        CHECK(z->dump != NULL, "GPTC_ZEROPP_DUMP: cannot create %s: make the folder (or unset it)", path);
        int64_t h[8] = {ZEROPP_DUMP_MAGIC, 0, (int64_t)dp->shard, z->K, W, z->N, 0, 0};
        int64_t g[8] = {z->qwz, z->qgz, z->feedback, z->hpz, z->block, z->node, z->local,
                        (int64_t)dp->g->num_parameters};
        CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(g, sizeof(g), 1, z->dump) == 1,
              "GPTC_ZEROPP_DUMP: writing %s failed (disk full?)", path);
    }
}

static void gpu_zeropp_dump_close(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    CHECK(!z->dump || fclose(z->dump) == 0, "GPTC_ZEROPP_DUMP: closing rank %d's file failed (disk full?)", dp->rank);
}
#else
static void gpu_zeropp_dump(GpuDataParallel*, int, int, size_t, size_t, const void*, int) {}
static void gpu_zeropp_dump_secondary(GpuDataParallel*) {}
static void gpu_zeropp_dump_open(GpuDataParallel*) {}
static void gpu_zeropp_dump_close(GpuDataParallel*) {}
#endif

/* The flags, before dp_init allocates (gpu_train_build). */
static void dp_zeropp_flags(GpuDataParallel* dp, const Options* o) {
    int f[5] = {o->qwz, o->qgz, o->qgz_feedback, o->hpz, o->quant_block};
    memcpy(dp->zpp_flags, f, sizeof(f));
}

/* What ZeRO++ needs of the machine, before anything is allocated: nodes of
 * equal size, and a communicator per level. NULL or the problem. */
static const char* gpu_zeropp_problem(const GpuComm* cm, const Options* o) {
    if (!(o->qwz || o->qgz || o->hpz) || cm->world == 1) return NULL;
    if (cm->lv.per_node == 0)
        return "--qwz/--qgz/--hpz need nodes of equal size: give --topology NxK (or launch the same number of "
               "ranks on every host)";
    if (!cm->lv.intra || !cm->lv.inter)
        return "--qwz/--qgz/--hpz talk by level over communicators split from the world's (ncclCommSplit, NCCL 2.18 "
               "or newer), which this build cannot make: drop them, or rebuild against a newer NCCL";
    return NULL;
}

/* Allocate ZeRO++'s buffers (gpu_zeropp_sizes, all in the ledger as
 * GMEM_ZERO), its maps and the dump; dp_init calls it under --zero 3. */
static void gpu_zeropp_init(GpuDataParallel* dp) {
    int* f = dp->zpp_flags;
    if (!(f[0] || f[1] || f[3])) return;
    const GpuLevels* lv = &dp->comm->lv;
    int W = dp->world;
    GpuZeroPP* z = (GpuZeroPP*)xmalloc(sizeof(GpuZeroPP));
    memset(z, 0, sizeof(*z));
    z->qwz = f[0], z->qgz = f[1], z->feedback = f[2], z->hpz = f[3], z->block = f[4];
    z->N = W > 1 ? lv->nodes : 1, z->K = W > 1 ? lv->per_node : 1;
    z->node = W > 1 ? lv->node : 0, z->local = W > 1 ? lv->local : 0;
    ALWAYS(z->N * z->K == W);
    z->sec_step = z->dump_step = z->dump_sec_step = -1;
    GpuZeroPPSizes s = gpu_zeropp_sizes(&dp->map, dp->shard, W, z->N, z->qwz, z->qgz, z->feedback, z->hpz, z->block);
    z->who = (int*)xmalloc(sizeof(int) * (size_t)W);
    int* slot_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    for (int q = 0; q < W; q++) {
        slot_of[q] = W > 1 ? lv->local_of[q] * z->N + lv->node_of[q] : 0;
        z->who[slot_of[q]] = q;
    }
    z->who_dev = (int*)gpu_alloc(sizeof(int) * (size_t)W, GMEM_ZERO);
    z->slot_of = (int*)gpu_alloc(sizeof(int) * (size_t)W, GMEM_ZERO);
    CUDA_CHECK(cudaMemcpy(z->who_dev, z->who, sizeof(int) * (size_t)W, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(z->slot_of, slot_of, sizeof(int) * (size_t)W, cudaMemcpyHostToDevice));
    free(slot_of);
    if (s.slot_buffers >= 1) z->send = (uint8_t*)gpu_alloc(s.slots, GMEM_ZERO);
    if (s.slot_buffers >= 2) z->recv = (uint8_t*)gpu_alloc(s.slots, GMEM_ZERO);
    z->partial = (float*)gpu_alloc(s.partial * sizeof(float), GMEM_ZERO);
    z->secondary = (floatX*)gpu_alloc(s.secondary * sizeof(floatX), GMEM_ZERO);
    z->residual = (float*)gpu_alloc(s.residual * sizeof(float), GMEM_ZERO);
    if (z->residual) CUDA_CHECK(cudaMemset(z->residual, 0, s.residual * sizeof(float))); /* nothing lost yet */
    dp->zpp = z;
    gpu_zeropp_dump_open(dp); /* GPTC_ZEROPP_DUMP (test builds) */
    if (dp->rank == 0) {
        printf("ZeRO++ (not run on a GPU; checked on the CPU execution layer): weights gathered %s",
               z->qwz ? (z->qwz == 8 ? "as INT8 blocks from the fp32 master" : "as INT4 blocks from the fp32 master")
                      : "in bf16");
        if (z->hpz) printf(", after each step's first forward from hpZ's node-local bf16 secondary (%zu a rank)",
                           s.secondary);
        printf("; gradients reduced %s", z->qgz ? (z->qgz == 8 ? "as INT8 by level" : "as INT4 by level") : "in fp32");
        if (z->feedback) printf(" with error feedback (%zu floats a rank, reset on resume)", s.residual);
        if (z->qwz || z->qgz) printf("; blocks of %d, one fp32 scale each", z->block);
        printf("; %d node(s) x %d; %.2f MB of buffers\n", z->N, z->K, gpu_zeropp_bytes(&s) / 1048576.0);
    }
}

static void gpu_zeropp_free(GpuDataParallel* dp) {
    GpuZeroPP* z = dp->zpp;
    if (!z) return;
    gpu_zeropp_dump_close(dp);
    void* mem[] = {z->who_dev, z->slot_of, z->send, z->recv, z->partial, z->secondary, z->residual};
    for (size_t i = 0; i < sizeof(mem) / sizeof(mem[0]); i++) gpu_release(mem[i]);
    free(z->who);
    free(z);
    dp->zpp = NULL;
}

/* Bucket b (pieces of p) into dst (W p bf16) on the communication stream,
 * which has waited for the compute stream (dp_gather_bucket): from hpZ's
 * secondary inside a step once its first forward is gathered, else from
 * the primary shards, as qwZ slots or bf16 (cutting the secondary when
 * this is a step's first forward). */
static void gpu_zeropp_gather(GpuDataParallel* dp, int b, floatX* dst) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    cudaStream_t cs = dp->comm->stream;
    size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b), W = (size_t)dp->world;
    size_t N = (size_t)z->N, K = (size_t)z->K, j = (size_t)z->local, node = (size_t)z->node;
    int dump = z->dump && lv->counting, cut = 0;
    if (dump && z->dump_step != lv->steps) /* the step's first gather: what it gathers from (qwZ: the fp32 master, */
        z->dump_step = lv->steps,           /* else the bf16 shard that AdamW rounded from it) */
            gpu_zeropp_dump(dp, 1, 0, (size_t)dp->rank * dp->shard, dp->shard,
                            z->qwz ? (const void*)dp->master : (const void*)dp->param_shard, !z->qwz);
    if (z->hpz && lv->counting) {
        if (z->sec_step != lv->steps) z->sec_step = lv->steps, z->sec_filled = 0; /* a new step: new weights */
        if (dp->backward) z->sec_filled = 1; /* the first forward gathered every bucket */
        if (z->sec_filled) {
            if (dump && z->dump_sec_step != lv->steps) z->dump_sec_step = lv->steps, gpu_zeropp_dump_secondary(dp);
            if (K > 1) {
                gpu_levels_add(lv, LEVEL_INTRA, (double)((K - 1) * N * p * sizeof(floatX)));
                NCCL_CHECK(ncclAllGather(z->secondary + N * off, dst, N * p, ncclBfloat16, lv->intra, cs));
            } else {
                CUDA_CHECK(cudaMemcpyAsync(dst, z->secondary + N * off, W * p * sizeof(floatX),
                                           cudaMemcpyDeviceToDevice, cs));
            }
            if (dump) gpu_zeropp_dump(dp, 2, 2, off, W * p, dst, 1);
            return;
        }
        cut = 1;
    }
    if (z->qwz) {
        size_t sb = quant_slot_bytes(p, z->qwz, z->block);
        uint8_t* mine = z->send + (j * N + node) * sb;
        quant_encode_gpu(mine, dp->master + off, NULL, p, z->qwz, z->block, cs);
        if (N > 1) { /* across nodes first: this rank's slot to the ranks with its local index (in place) */
            gpu_levels_add(lv, LEVEL_INTER, (double)((N - 1) * sb));
            NCCL_CHECK(ncclAllGather(mine, z->send + j * N * sb, sb, ncclUint8, lv->inter, cs));
        }
        if (K > 1) { /* then inside the node: the N slots of each local index as one bundle (in place) */
            gpu_levels_add(lv, LEVEL_INTRA, (double)((K - 1) * N * sb));
            NCCL_CHECK(ncclAllGather(z->send + j * N * sb, z->send, N * sb, ncclUint8, lv->intra, cs));
        }
        qwz_decode_kernel<<<ceil_div((long long)(W * p), 256), 256, 0, cs>>>(dst, z->send, z->slot_of, sb, p, (int)W,
                                                                             z->qwz, z->block);
        KERNEL_CHECK();
    } else {
        gpu_levels_count(dp->comm, p * W, p, sizeof(floatX), 0, 1); /* (flat) */
        NCCL_CHECK(ncclAllGather(dp->param_shard + off, dst, p, ncclBfloat16, dp->comm->nccl, cs));
    }
    if (dump) gpu_zeropp_dump(dp, 2, z->qwz ? 1 : 0, off, W * p, dst, 1);
    if (cut) /* this local index's part of the bucket into the secondary */
        CUDA_CHECK(cudaMemcpyAsync(z->secondary + N * off, dst + j * N * p, N * p * sizeof(floatX),
                                   cudaMemcpyDeviceToDevice, cs));
}

/* qgZ: bucket b's packed gradients (W p, on the communication stream, which
 * has waited for them) summed over the ranks, this rank's piece added into
 * shard_part (its place in grad_shard). */
static void gpu_zeropp_reduce(GpuDataParallel* dp, int b, float* shard_part) {
    GpuZeroPP* z = dp->zpp;
    GpuLevels* lv = &dp->comm->lv;
    cudaStream_t cs = dp->comm->stream;
    size_t p = shard_map_bucket(&dp->map, b)->piece, off = shard_map_offset(&dp->map, b), W = (size_t)dp->world;
    size_t S = dp->shard, sb = quant_slot_bytes(p, z->qgz, z->block);
    int N = z->N, K = z->K, j = z->local, node = z->node, bits = z->qgz;
    const float* bucket = dp->bucket[b];
    int dump = z->dump && lv->counting;
    if (dump) gpu_zeropp_dump(dp, 4, 0, off, W * p, bucket, 0);
    float* res0 = z->residual;                      /* hop 0's: (W, S), by the piece's rank and place */
    float* res1 = res0 ? res0 + W * S : NULL;        /* hop 1's: (N, S), by destination node and place */
    if (K > 1) { /* hop 0: the pieces of the other local indices, quantised, N slots to each node peer */
        for (int i = 0; i < K * N; i++) {
            if (i / N == j) continue;
            size_t q = (size_t)z->who[i];
            quant_encode_gpu(z->send + (size_t)i * sb, bucket + q * p, res0 ? res0 + q * S + off : NULL, p, bits,
                             z->block, cs);
        }
        NCCL_CHECK(ncclGroupStart());
        for (int t = 1; t < K; t++) {
            int to = (j + t) % K, from = (j - t + K) % K;
            gpu_levels_add(lv, LEVEL_INTRA, (double)((size_t)N * sb));
            NCCL_CHECK(ncclSend(z->send + (size_t)to * N * sb, (size_t)N * sb, ncclUint8, to, lv->intra, cs));
            NCCL_CHECK(ncclRecv(z->recv + (size_t)from * N * sb, (size_t)N * sb, ncclUint8, from, lv->intra, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    qgz_hop0_kernel<<<ceil_div((long long)N * (long long)p, 256), 256, 0, cs>>>(z->partial, bucket, z->who_dev, z->recv,
                                                                              sb, p, N, K, j, bits, z->block);
    KERNEL_CHECK();
    if (N > 1) { /* hop 1: each other node's partial sum, quantised once, to the rank of this index there */
        for (int q = 0; q < N; q++) {
            if (q == node) continue;
            quant_encode_gpu(z->send + (size_t)q * sb, z->partial + (size_t)q * p,
                             res1 ? res1 + (size_t)q * S + off : NULL, p, bits, z->block, cs);
        }
        NCCL_CHECK(ncclGroupStart());
        for (int t = 1; t < N; t++) {
            int to = (node + t) % N, from = (node - t + N) % N;
            gpu_levels_add(lv, LEVEL_INTER, (double)sb);
            NCCL_CHECK(ncclSend(z->send + (size_t)to * sb, sb, ncclUint8, to, lv->inter, cs));
            NCCL_CHECK(ncclRecv(z->recv + (size_t)from * sb, sb, ncclUint8, from, lv->inter, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    qgz_hop1_kernel<<<ceil_div((long long)p, 256), 256, 0, cs>>>(shard_part, z->partial + (size_t)node * p, z->recv, sb,
                                                                 p, N, node, bits, z->block);
    KERNEL_CHECK();
    if (dump) gpu_zeropp_dump(dp, 5, 0, (size_t)dp->rank * S, S, dp->grad_shard, 0);
}

#endif /* GPTC_CUDA_ZEROPP_CUH */
