/* gptc/cuda/levels.cuh: the levels of the machine (nodes) on NCCL.
 * Included by train_gpt.cu after comm.cuh. Defines gpu_levels_init,
 * gpu_levels_free, gpu_comm_count, gpu_levels_count, gpu_levels_step_begin,
 * gpu_levels_step_end, gpu_levels_print, gpu_levels_allreduce and
 * gpu_levels_reduce_to_owners (--hierarchical 1). */
#ifndef GPTC_CUDA_LEVELS_CUH
#define GPTC_CUDA_LEVELS_CUH

/* ---- levels: nodes, bytes per level, hierarchical reduction ------------- */
/* Tested on 4 emulated GPUs as --topology 2x2 (scripts/tests/test_cuda_levels.sh).
 * The CPU trainer's semantics and flags (gptc/zero3.h), on NCCL:
 * Nodes: --topology NxK (rank r on node r / K: how several nodes are
 * emulated on one machine), else the ranks whose host names match (an
 * all-gather of a hash of gethostname over the world communicator, so it
 * works for every --init; nodes numbered by their lowest rank, the index
 * inside a node by rank). The same all-gather carries a hash of the flags:
 * ranks launched with different ones stop with an error, not a hang.
 * Communicators per level: ncclCommSplit of the world's (NCCL >= 2.18,
 * which real NCCL has had since 2023; the CPU layer implements it as
 * MPI_Comm_split): intra = colour node, key index; inter = colour index,
 * key node. Built only under --hierarchical 1 (their buffers cost device
 * memory); a flat run has the world's alone.
 * Bytes sent, per rank and level, counted as a direct algorithm sends them
 * (as the CPU trainer counts: an all-gather sends this rank's piece to every
 * other rank, a reduction every other rank its piece, a reduce to a root
 * the root its data, a broadcast the root's data to every other rank);
 * fp32 gradients 4 bytes, bf16 weights 2. Summed over the ranks, for n
 * elements of b bytes on N nodes of K:
 *   flat all-reduce          intra 2 (K-1) n b        inter 2 (N-1) K n b
 *   flat reduce-scatter      intra (K-1) n b          inter (N-1) K n b   (ZeRO; all-gathers alike)
 *   hierarchical all-reduce  intra 2 N (K-1) n b      inter 2 (N-1) n b   (plain)
 *   hierarchical to owners   intra N (K-1) n b        inter (N-1) n b     (ZeRO)
 * with n = P per step for plain (its segments), and for ZeRO the padded
 * buckets, P' = W S: ZeRO-1 reduces P' fp32 once, ZeRO-2 once per
 * micro-batch, both all-gather P' bf16 weights (flat, as on the CPU).
 * --hierarchical 1, plain: each slice of n of a bucket, in pieces of
 * s = ceil(n / K): piece i reduced inside the node onto index i
 * (ncclReduce), piece j all-reduced across the nodes among the ranks of
 * index j (1/K of the data), every piece broadcast inside the node from its
 * index (ncclBroadcast); each stage one NCCL group for the whole bucket.
 * ZeRO: each rank q's piece of the bucket reduced inside every node onto the
 * rank with q's index, then across the nodes onto q (ncclReduce, in place;
 * for any placement of the ranks on the nodes). Unlike the CPU trainer's
 * these stay on the communication stream, overlapped with backward as the
 * flat ones are. They sum in another order than the flat path (node sums,
 * then across nodes): equal to it to fp32 round-off, not bitwise. */

static void gpu_levels_add(GpuLevels* lv, int level, double bytes) {
    if (lv->counting) lv->sent[level] += bytes;
}

/* A flat collective over the world of n elements of `elem` bytes in pieces
 * of `piece` (rank q's: [q piece, (q + 1) piece) of n): a reduction
 * (`scatter`) sends every other rank its piece, an all-gather (`gather`)
 * this rank's piece to every other rank. */
static void gpu_levels_count(GpuComm* cm, size_t n, size_t piece, size_t elem, int scatter, int gather) {
    GpuLevels* lv = &cm->lv;
    if (!lv->counting || cm->world == 1) return;
    size_t mine = levels_piece(0, n, piece, cm->rank);
    for (int q = 0; q < cm->world; q++) {
        if (q == cm->rank) continue;
        size_t c = (scatter ? levels_piece(0, n, piece, q) : 0) + (gather ? mine : 0);
        lv->sent[lv->node_of[q] == lv->node ? LEVEL_INTRA : LEVEL_INTER] += (double)(c * elem);
    }
}

/* The nodes from --topology ("" = by host) and --hierarchical (0, 1, -1 =
 * 1 when there is more than one node), and under it the communicators per
 * level. 0, or -1 after a message (every rank sees the same flags and
 * hosts, so all fail alike). Collective. */
static int gpu_levels_init(GpuComm* cm, const char* topology, int hierarchical, int report, int split) {
    GpuLevels* lv = &cm->lv;
    int W = cm->world;
    memset(lv, 0, sizeof(*lv));
    lv->report = report;
    lv->node_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    lv->local_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    uint64_t* all = cm->h_slots + DP_SCALARS; /* (2 W of the 3 W slots: the fingerprints' place, free here) */
    if (W > 1) { /* every rank's host name and flags, hashed: the flags first, or ranks launched with different
                  * ones would meet different collectives below (run_fingerprint compares them too, later) */
        char host[256] = {0};
        CHECK(gethostname(host, sizeof(host) - 1) == 0, "gethostname failed: %s", strerror(errno));
        uint64_t flags = fnv1a(0xCBF29CE484222325ull, topology, strlen(topology));
        cm->h_slots[0] = fnv1a(0xCBF29CE484222325ull, host, strlen(host));
        cm->h_slots[1] = fnv1a(flags, &hierarchical, sizeof(hierarchical));
        CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, 2 * sizeof(uint64_t), cudaMemcpyHostToDevice, cm->stream));
        NCCL_CHECK(ncclAllGather(cm->d_slots, cm->d_slots + DP_SCALARS, 2, ncclUint64, cm->nccl, cm->stream));
        CUDA_CHECK(cudaMemcpyAsync(all, cm->d_slots + DP_SCALARS, 2 * sizeof(uint64_t) * (size_t)W,
                                   cudaMemcpyDeviceToHost, cm->stream));
        gpu_wait(cm->stream, NULL);
        for (int q = 1; q < W; q++)
            if (all[2 * q + 1] != all[1]) {
                fprintf(stderr, "error: rank %d was launched with other --topology/--hierarchical flags than rank 0 "
                        "(this rank: --topology '%s' --hierarchical %d): give every rank the same\n", q, topology,
                        hierarchical);
                return -1;
            }
    }
    lv->by_host = W > 1 && !topology[0]; /* by host: the hashes of the ranks' host names, gathered above */
    lv->hierarchical = levels_layout(topology, hierarchical, W, cm->rank, W > 1 ? all : NULL, 2, "4 GPUs",
                                     lv->node_of, lv->local_of, &lv->nodes, &lv->per_node); /* gptc/zero3.h */
    if (lv->hierarchical < 0) return -1;
    lv->node = lv->node_of[cm->rank];
    lv->local = lv->local_of[cm->rank];
    if (!(lv->hierarchical || split) || W == 1) return 0; /* (split: ZeRO++ talks by level, gpu_zeropp_gather) */
    if (!lv->hierarchical && lv->per_node == 0) return 0; /* (unequal nodes: ZeRO++ refuses them, gpu_zeropp_problem) */
#if GPU_HAVE_SPLIT
    NCCL_CHECK(ncclCommSplit(cm->nccl, lv->node, lv->local, &lv->intra, NULL));
    NCCL_CHECK(ncclCommSplit(cm->nccl, lv->local, lv->node, &lv->inter, NULL));
    return 0;
#else
    if (!lv->hierarchical) return 0; /* (ZeRO++ says what it misses: gpu_zeropp_problem) */
    int v = 0;
    if (GPU_HAVE_NCCL) NCCL_CHECK(ncclGetVersion(&v));
    if (cm->rank == 0)
        fprintf(stderr, "error: --hierarchical 1 builds a communicator per level with ncclCommSplit (NCCL 2.18 or "
                "newer); this build has NCCL %d.%d.%d: give --hierarchical 0 (flat), or rebuild against a newer NCCL "
                "(make nccl-info says which it found)\n", v / 10000, (v / 100) % 100, v % 100);
    return -1;
#endif
}

static void gpu_levels_free(GpuComm* cm, int failed) {
    GpuLevels* lv = &cm->lv;
    ncclComm_t* sub[2] = {&lv->intra, &lv->inter};
    for (int i = 0; i < 2; i++) {
        if (!*sub[i]) continue;
        if (failed) NCCL_CHECK(ncclCommAbort(*sub[i]));
        else NCCL_CHECK(ncclCommDestroy(*sub[i]));
        *sub[i] = NULL;
    }
    free(lv->node_of);
    free(lv->local_of);
    lv->node_of = lv->local_of = NULL;
}

/* The NCCL communicators this rank holds: the world's, and one per level
 * under --hierarchical 1 (the memory headroom's allowance counts them). */
static int gpu_comm_count(const GpuComm* cm) {
    return (cm->nccl != NULL) + (cm->lv.intra != NULL) + (cm->lv.inter != NULL);
}

/* A step begins: its counts from zero. */
static void gpu_levels_step_begin(GpuComm* cm) {
    cm->lv.sent[LEVEL_INTRA] = cm->lv.sent[LEVEL_INTER] = 0.0;
    cm->lv.counting = 1;
}

/* After the step's update: its bytes into the run's, and with --comm-levels
 * 1 a line (summed over the ranks: collective), as train_gpt.c's
 * levels_step_end. */
static void gpu_levels_step_end(GpuComm* cm, int step) {
    GpuLevels* lv = &cm->lv;
    lv->counting = 0;
    lv->steps++;
    for (int e = 0; e < NUM_LEVELS; e++) lv->sent_run[e] += lv->sent[e];
    if (lv->report) {
        double all[NUM_LEVELS] = {lv->sent[0], lv->sent[1]};
        gpu_comm_sum(cm, all, NUM_LEVELS);
        printf("step %d: bytes sent: %s %.0f, %s %.0f (summed over the ranks); rank 0: %.0f, %.0f\n", step,
               LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], lv->sent[0], lv->sent[1]);
    }
}

/* At the end: the topology and the bytes per level per step (collective),
 * the CPU trainer's line (levels_print). */
static void gpu_levels_print(GpuComm* cm) {
    GpuLevels* lv = &cm->lv;
    if (cm->world <= 1 || lv->steps == 0) return;
    double per[NUM_LEVELS], all[NUM_LEVELS];
    for (int e = 0; e < NUM_LEVELS; e++) per[e] = all[e] = lv->sent_run[e] / lv->steps;
    gpu_comm_sum(cm, all, NUM_LEVELS);
    printf("bytes sent per step by level (%d node(s) x %d rank(s), %s reduction): %s %.0f, %s %.0f summed over the "
           "ranks; rank 0: %.0f, %.0f\n", lv->nodes, lv->per_node, lv->hierarchical ? "hierarchical" : "flat",
           LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], per[0], per[1]);
}

/* Plain, --hierarchical 1: sum the bucket's slices (n[i] floats at x[i],
 * i < nseg) over the ranks in place, by level (see above). */
static void gpu_levels_allreduce(GpuComm* cm, float* const* x, const size_t* n, int nseg, cudaStream_t cs) {
    GpuLevels* lv = &cm->lv;
    int K = lv->per_node, N = lv->nodes, j = lv->local;
    NCCL_CHECK(ncclGroupStart()); /* 1: piece i of each slice summed inside the node onto index i */
    for (int g = 0; g < nseg; g++) {
        size_t s = (n[g] + (size_t)K - 1) / (size_t)K;
        for (int i = 0; i < K; i++) {
            size_t c = levels_piece(0, n[g], s, i);
            if (!c) continue;
            if (i != j) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)c);
            float* p = x[g] + (size_t)i * s;
            NCCL_CHECK(ncclReduce(p, p, c, ncclFloat, ncclSum, i, lv->intra, cs));
        }
    }
    NCCL_CHECK(ncclGroupEnd());
    if (N > 1) {
        NCCL_CHECK(ncclGroupStart()); /* 2: piece j across the nodes, among the ranks of index j */
        for (int g = 0; g < nseg; g++) {
            size_t s = (n[g] + (size_t)K - 1) / (size_t)K, cj = levels_piece(0, n[g], s, j);
            if (!cj) continue;
            size_t p = (cj + (size_t)N - 1) / (size_t)N, mine = levels_piece(0, cj, p, lv->node);
            gpu_levels_add(lv, LEVEL_INTER, 4.0 * (double)(cj - mine + mine * (size_t)(N - 1)));
            NCCL_CHECK(ncclAllReduce(x[g] + (size_t)j * s, x[g] + (size_t)j * s, cj, ncclFloat, ncclSum, lv->inter, cs));
        }
        NCCL_CHECK(ncclGroupEnd());
    }
    NCCL_CHECK(ncclGroupStart()); /* 3: every piece to the node from its index */
    for (int g = 0; g < nseg; g++) {
        size_t s = (n[g] + (size_t)K - 1) / (size_t)K;
        for (int i = 0; i < K; i++) {
            size_t c = levels_piece(0, n[g], s, i);
            if (!c) continue;
            if (i == j) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)(c * (size_t)(K - 1)));
            float* p = x[g] + (size_t)i * s;
            NCCL_CHECK(ncclBroadcast(p, p, c, ncclFloat, i, lv->intra, cs));
        }
    }
    NCCL_CHECK(ncclGroupEnd());
}

/* ZeRO, --hierarchical 1: sum a packed bucket (W pieces of `piece` floats,
 * rank q's at q piece) over the ranks, rank q's sum landing in place at its
 * piece: inside every node onto the rank with q's index, then across the
 * nodes onto q. */
static void gpu_levels_reduce_to_owners(GpuComm* cm, float* bucket, size_t piece, cudaStream_t cs) {
    GpuLevels* lv = &cm->lv;
    int W = cm->world;
    NCCL_CHECK(ncclGroupStart());
    for (int q = 0; q < W; q++) {
        float* p = bucket + (size_t)q * piece;
        if (lv->local != lv->local_of[q]) gpu_levels_add(lv, LEVEL_INTRA, 4.0 * (double)piece);
        NCCL_CHECK(ncclReduce(p, p, piece, ncclFloat, ncclSum, lv->local_of[q], lv->intra, cs));
    }
    NCCL_CHECK(ncclGroupEnd());
    if (lv->nodes == 1) return;
    NCCL_CHECK(ncclGroupStart()); /* among the ranks of this index: the pieces of the ranks with it */
    for (int q = 0; q < W; q++) {
        if (lv->local_of[q] != lv->local) continue;
        float* p = bucket + (size_t)q * piece;
        if (lv->node != lv->node_of[q]) gpu_levels_add(lv, LEVEL_INTER, 4.0 * (double)piece);
        NCCL_CHECK(ncclReduce(p, p, piece, ncclFloat, ncclSum, lv->node_of[q], lv->inter, cs));
    }
    NCCL_CHECK(ncclGroupEnd());
}

#endif /* GPTC_CUDA_LEVELS_CUH */
