/*
 * gptc/zero3.h — the CPU trainer's data parallelism beyond ZeRO-2: ZeRO-3
 * (the weights sharded too, gathered layer by layer), the levels of the
 * machine (nodes of ranks: --topology), the bytes each rank sends at each
 * level, and hierarchical reduction (--hierarchical).
 *
 * Included by train_gpt.c in section 6, right after Dist (which holds a
 * Levels* lv); MPI when USE_MPI is defined, else one rank and copies.
 * Defines: Levels, LEVEL_NAMES, levels_layout (train_gpt.cu's too),
 * levels_init, levels_free, levels_count, levels_allreduce,
 * levels_reduce_to, levels_allgather_params, dist_step_begin,
 * levels_step_end, levels_print, zero3_setup, zero3_layer_weights,
 * zero3_gather_model, dist_params_full/keep (states), dist_fill_random,
 * zero3_sample_begin/end (the sampler), ZeroHooks (where gptc/zeropp.h's
 * qwZ/qgZ/hpZ plug in).
 *
 * ZeRO-3 (Rajbhandari et al. 2020, sec. 5.3). Rank r keeps the r-th of W
 * equal slices of the flat parameter buffer (the same shard ZeRO-1/2 update:
 * ceil(P/W) floats, zero-padded), its AdamW moments and its summed gradient;
 * the gradients are ZeRO-2's (two one-layer buckets, the head's whole). The
 * weights are gathered where they are used, into three buffers:
 *   head      (wte | wpe | lnfw | lnfb): gathered at the start of every
 *             forward (blocking) and held through its backward (the LM head
 *             is wte: it is needed at the end of forward and at the start
 *             of backward, so gathering it twice would gain nothing);
 *   layer[2]  one layer's 12 slices each: layer l is gathered before its
 *             forward and again before its backward (2 gathers per layer per
 *             micro-batch), into buffer l % 2; while layer l computes, the
 *             gather of the next one (l + 1 forward, l - 1 backward) is in
 *             flight (MPI_Iallgatherv, one per tensor slice, into the other
 *             buffer). What is overlapped: that next layer's gather, with
 *             layer l's compute; layer 0's forward gather with the head's.
 *             Open MPI moves non-blocking collectives on only inside MPI
 *             calls, so on shared memory most of the transfer happens when
 *             the buffer is waited for; the posting is what is hidden.
 * Memory per rank: 16 bytes x shard (weights, gradient sum, m, v) plus the
 * gathered head and two layers, the head's gradients and ZeRO-2's two
 * gradient buckets (printed at start, in the memory plan, gptc/plan.h).
 * Traffic per step, floats, A micro-batches: gathered A (2 L layer + head),
 * reduced A L layer + head; Psi = P: about 3 Psi for A = 1 (the head once
 * less: held from forward to backward). Outside the step: a model file
 * and a sample gather the whole weights onto rank 0 (P floats there);
 * loading a state uses a temporary of P floats; --eval-file has every rank
 * run as many forwards.
 *
 * Levels. Ranks are grouped into nodes: --topology NxK says N nodes of K
 * ranks (rank r on node r / K; the way to emulate several nodes on one
 * machine), else the nodes are MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)'s.
 * Two communicators: intra (the ranks of this node) and inter (the ranks
 * with this rank's index inside their node, one per node). Each rank counts
 * the bytes it sends at each level, per collective, as a direct algorithm
 * sends them: an all-gather sends its own piece to every other rank, a
 * reduction sends every other rank's piece to it. A ring or tree moves the
 * same total (W - 1) x n; what Open MPI's algorithm puts on each link
 * differs and MPI does not say. Summed over the ranks, for n floats over a
 * world of N nodes x K: a flat reduce-scatter or all-gather sends
 * (K - 1) n intra-node and (N - 1) K n inter-node.
 *
 * Hierarchical reduction (--hierarchical 1; auto = on when there is more
 * than one node, on a uniform topology). Plain allreduce: reduce-scatter
 * inside the node (piece j to local rank j), allreduce across nodes of
 * piece j among the ranks with index j (1/K of the data), all-gather inside
 * the node: N (K - 1) n + N (K - 1) n intra and 2 (N - 1) n inter (flat:
 * 2 (K - 1) n and 2 (N - 1) K n: K times more across nodes). ZeRO's
 * reduction of a piece to its owner (node p, index j): summed inside each
 * node onto its rank j, then across nodes onto p: N (K - 1) n intra and
 * (N - 1) n inter. It is blocking (not overlapped with backward) and sums
 * in another order than the flat path: equal to it to fp32 round-off, not
 * bitwise (scripts/tests/test_zero3.sh checks 1e-5 relative on the losses).
 */
#ifndef GPTC_ZERO3_H
#define GPTC_ZERO3_H

enum { LEVEL_INTRA, LEVEL_INTER, NUM_LEVELS };
static const char* const LEVEL_NAMES[NUM_LEVELS] = {"intra-node", "inter-node"};
#define LAYER_TENSORS (LAYER_TENSORS_END - LAYER_TENSORS_BEGIN)

/* Where ZeRO++ (gptc/zeropp.h: qwZ's quantised weight gather, hpZ's
 * node-local weight copy, qgZ's quantised gradient reduction, on top of
 * gptc/quant.h) plugs in. NULL: the fp32 collectives below. The hooks
 * count their own bytes; the reduction blocks, a gather is started and
 * then waited for (in flight meanwhile, as the fp32 ones). */
typedef struct {
    /* start gathering n floats of the flat range [at, at + n) of the sharded weights into dst (ZeRO-3), as gather
     * `slot` (layer buffer b's slice i: b LAYER_TENSORS + i; the head's two ranges: 2 LAYER_TENSORS, + 1) */
    void (*gather)(void* ctx, float* dst, size_t at, size_t n, int slot);
    void (*gather_wait)(void* ctx, int slot); /* ...and finish it: the weights are in dst after this */
    /* sum the flat range [at, at + n) of the gradients (this rank's values at src) over the ranks;
     * this rank's shard of the sum is added into its grad_shard (ZeRO-2/3's reductions) */
    void (*reduce)(void* ctx, float* src, size_t at, size_t n);
    void (*setup)(void* ctx);   /* at the end of zero3_setup: the hooks' buffers */
    void (*release)(void* ctx); /* in levels_free */
    void* ctx;
} ZeroHooks;

typedef struct Levels {
    int nodes, per_node;     /* per_node: ranks in every node, 0 when the nodes differ in size */
    int node, local;         /* this rank's node and its index inside it */
    int* node_of;            /* (W) each rank's node */
    int* local_of;           /* (W) each rank's index inside its node */
    int hierarchical;        /* reductions in stages (see the header) */
    int report;              /* --comm-levels 1: a line per step */
    int counting;            /* inside a training step (dist_step_begin .. levels_step_end) */
    double sent[NUM_LEVELS]; /* bytes this rank sent at each level in this step */
    double sent_run[NUM_LEVELS];
    double sent_bwd_gather[NUM_LEVELS]; /* of sent_run: backward's weight gathers (hpZ keeps them inside the node) */
    int steps;
    int backward;            /* the gathers now are backward's (zero3_layer_weights) */
    ZeroHooks hooks;
    /* ZeRO-3's gathered weights */
    float* head;             /* (head_floats) wte | wpe | lnfw | lnfb */
    float* layer[2];         /* (layer_floats) each: one layer's 12 slices back to back, file order */
    int layer_in[2];         /* the layer each holds or is receiving; -1 none */
    int pending[2];          /* its gather is in flight */
#ifdef USE_MPI
    MPI_Comm intra, inter;
    MPI_Request req[2][LAYER_TENSORS];
    int* counts;             /* (2, 12, 2W): each gather's counts and displacements, kept until it completes */
#endif
} Levels;

/* Rank q's piece of the flat range [a, a + n) when pieces of `piece` floats
 * start at 0 (rank q holds [q piece, (q + 1) piece)). */
static size_t levels_piece(size_t a, size_t n, size_t piece, int q) {
    size_t lo = (size_t)q * piece, hi = lo + piece, b = a + n;
    lo = lo > a ? lo : a;
    hi = hi < b ? hi : b;
    return hi > lo ? hi - lo : 0;
}

/* Count a flat collective over the world on [a, a + n) in pieces of
 * `piece`: a reduction (`scatter`) sends every other rank its piece, an
 * all-gather (`gather`) this rank's piece to every other rank. */
static void levels_count(Dist* d, size_t a, size_t n, size_t piece, int scatter, int gather) {
    Levels* lv = d->lv;
    if (!lv || !lv->counting) return;
    size_t mine = levels_piece(a, n, piece, d->rank);
    for (int q = 0; q < d->world; q++) {
        if (q == d->rank) continue;
        size_t c = (scatter ? levels_piece(a, n, piece, q) : 0) + (gather ? mine : 0);
        lv->sent[lv->node_of[q] == lv->node ? LEVEL_INTRA : LEVEL_INTER] += 4.0 * (double)c;
    }
}

#ifdef USE_MPI
static void levels_add(Dist* d, int level, size_t floats) {
    if (d->lv && d->lv->counting) d->lv->sent[level] += 4.0 * (double)floats;
}
#endif

/* The nodes of W ranks and whether to reduce by level; train_gpt.c's
 * levels_init and train_gpt.cu's gpu_levels_init (the same flags on every
 * rank, so all fail alike). --topology "NxK": rank q on node q / K, index
 * q % K; "": key[q * stride] is rank q's node (ranks with equal keys share
 * one; nodes numbered by their lowest rank, a rank's index = the ranks below
 * it on its node), key NULL: one node. Fills node_of, local_of (W each),
 * *nodes, *per_node (ranks in every node, 0 when they differ in size).
 * --hierarchical: 0, 1, -1 = 1 when several equal nodes. Returns the
 * decision, or -1 after a message on rank 0 (`launched`: "4 GPUs", ...). */
static int levels_layout(const char* topology, int hierarchical, int W, int rank, const uint64_t* key,
                         size_t stride, const char* launched, int* node_of, int* local_of, int* nodes,
                         int* per_node) {
    int n = 0, k = 0, given = topology && topology[0];
    char tail = 0;
    if (given && (sscanf(topology, "%dx%d%c", &n, &k, &tail) != 2 || n < 1 || k < 1 || n * k != W)) {
        if (rank == 0)
            fprintf(stderr, "error: --topology %s: want NxK with N nodes x K ranks = the %d rank(s) launched "
                    "(e.g. 2x2 for %s)\n", topology, W, launched);
        return -1;
    }
    *nodes = 0;
    for (int q = 0; q < W; q++) {
        int first = -1, local = 0; /* the lowest rank with q's key, and how many below q have it */
        for (int p = 0; p < q && key && !k; p++)
            if (key[p * stride] == key[q * stride]) first = first < 0 ? p : first, local++;
        if (k) node_of[q] = q / k, local_of[q] = q % k;
        else if (!key) node_of[q] = 0, local_of[q] = q;
        else node_of[q] = first < 0 ? (*nodes)++ : node_of[first], local_of[q] = local;
    }
    for (int q = 0; q < W; q++) *nodes = node_of[q] + 1 > *nodes ? node_of[q] + 1 : *nodes;
    *per_node = W / *nodes;
    for (int p = 0; p < *nodes; p++) { /* uniform: every node has per_node ranks */
        int count = 0;
        for (int q = 0; q < W; q++) count += node_of[q] == p;
        if (count != *per_node) *per_node = 0;
    }
    int hier = hierarchical < 0 ? *nodes > 1 && *per_node > 0 : hierarchical;
    if (hier && *per_node == 0) {
        if (rank == 0) fprintf(stderr, "error: --hierarchical 1 needs nodes of equal size: give --topology NxK\n");
        return -1;
    }
    return hier;
}

/* The levels from --topology ("" = the shared-memory nodes; "NxK") and
 * --hierarchical (0, 1, -1 = auto). 0, or -1 after a message (every rank
 * sees the same flags, so every rank fails alike). Collective. */
static int levels_init(Dist* d, const char* topology, int hierarchical, int report) {
    Levels* lv = (Levels*)xmalloc(sizeof(Levels));
    memset(lv, 0, sizeof(*lv));
    d->lv = lv;
    lv->report = report;
    lv->layer_in[0] = lv->layer_in[1] = -1;
    int W = d->world;
    lv->node_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    lv->local_of = (int*)xmalloc(sizeof(int) * (size_t)W);
    uint64_t* key = NULL; /* (W) each rank's node: the lowest rank sharing its memory */
#ifdef USE_MPI
    if (W > 1 && !(topology && topology[0])) {
        MPI_Comm shared;
        int lowest = d->rank;
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &shared));
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, shared));
        MPI_CHECK(MPI_Comm_free(&shared));
        uint64_t mine = (uint64_t)lowest;
        key = (uint64_t*)xmalloc(sizeof(uint64_t) * (size_t)W);
        MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UINT64_T, key, 1, MPI_UINT64_T, MPI_COMM_WORLD));
    }
#endif
    lv->hierarchical = levels_layout(topology, hierarchical, W, d->rank, key, 1, "mpirun -np 4", lv->node_of,
                                     lv->local_of, &lv->nodes, &lv->per_node);
    free(key);
    if (lv->hierarchical < 0) return -1;
    lv->node = lv->node_of[d->rank];
    lv->local = lv->local_of[d->rank];
#ifdef USE_MPI
    if (W > 1) {
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, lv->node, lv->local, &lv->intra));
        MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, lv->local, lv->node, &lv->inter));
    }
    lv->counts = (int*)xmalloc(sizeof(int) * 2 * LAYER_TENSORS * 2 * (size_t)W);
#endif
    return 0;
}

/* `failed`: the job is about to abort; the communicators are left to it
 * (freeing them is collective, and other ranks may never get here). */
static void levels_free(Dist* d, int failed) {
    Levels* lv = d->lv;
    if (!lv) return;
    if (lv->hooks.release) lv->hooks.release(lv->hooks.ctx);
    ledger_free(lv->head);
    ledger_free(lv->layer[0]);
    ledger_free(lv->layer[1]);
#ifdef USE_MPI
    if (d->world > 1 && !failed) {
        MPI_CHECK(MPI_Comm_free(&lv->intra));
        MPI_CHECK(MPI_Comm_free(&lv->inter));
    }
    free(lv->counts);
#endif
    (void)failed;
    free(lv->node_of);
    free(lv->local_of);
    free(lv);
    d->lv = NULL;
}

/* Sum n floats at x over all ranks, in place (plain data parallel): one
 * MPI_Allreduce, or hierarchically (see the header). Blocking. */
static void levels_allreduce(Dist* d, float* x, size_t n) {
    size_t W = (size_t)d->world;
    d->reduced += (double)n;
    d->gathered += (double)n;
    if (d->world == 1) return;
    Levels* lv = d->lv;
    if (!lv->hierarchical) {
        levels_count(d, 0, n, (n + W - 1) / W, 1, 1);
#ifdef USE_MPI
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
#endif
        return;
    }
#ifdef USE_MPI
    int K = lv->per_node, N = lv->nodes, j = lv->local;
    size_t s = (n + (size_t)K - 1) / (size_t)K, cj = levels_piece(0, n, s, j);
    int* cd = lv->counts; /* (2K) counts, displacements: nothing else is in flight in a plain step */
    for (int i = 0; i < K; i++) { /* 1: piece i summed inside the node onto local rank i */
        size_t c = levels_piece(0, n, s, i);
        cd[i] = (int)c;
        cd[K + i] = c ? (int)((size_t)i * s) : 0;
        if (!c) continue;
        if (i != j) levels_add(d, LEVEL_INTRA, c);
        MPI_CHECK(MPI_Reduce(i == j ? MPI_IN_PLACE : x + (size_t)i * s, x + (size_t)i * s, (int)c, MPI_FLOAT, MPI_SUM,
                             i, lv->intra));
    }
    if (N > 1 && cj) { /* 2: piece j summed across the nodes, among the ranks with index j */
        size_t p = (cj + (size_t)N - 1) / (size_t)N, mine = levels_piece(0, cj, p, lv->node);
        levels_add(d, LEVEL_INTER, cj - mine + mine * (size_t)(N - 1));
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x + (size_t)j * s, (int)cj, MPI_FLOAT, MPI_SUM, lv->inter));
    }
    levels_add(d, LEVEL_INTRA, cj * (size_t)(K - 1)); /* 3: the pieces all-gathered inside the node */
    MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x, cd, cd + K, MPI_FLOAT, lv->intra));
#else
    (void)x;
#endif
}

/* Sum c floats at part over all ranks onto world rank `owner`
 * hierarchically: inside each node onto its rank with the owner's index,
 * then across nodes onto the owner. Blocking; the owner's sum is in part. */
#ifdef USE_MPI
static void levels_reduce_to(Dist* d, float* part, size_t c, int owner) {
    Levels* lv = d->lv;
    int j = lv->local_of[owner], p = lv->node_of[owner];
    if (lv->local != j) levels_add(d, LEVEL_INTRA, c);
    MPI_CHECK(MPI_Reduce(lv->local == j ? MPI_IN_PLACE : part, part, (int)c, MPI_FLOAT, MPI_SUM, j, lv->intra));
    if (lv->local == j && lv->nodes > 1) {
        if (lv->node != p) levels_add(d, LEVEL_INTER, c);
        MPI_CHECK(MPI_Reduce(lv->node == p ? MPI_IN_PLACE : part, part, (int)c, MPI_FLOAT, MPI_SUM, p, lv->inter));
    }
}
#endif

/* ZeRO-1/2: after the update, every rank's shard of the weights to every
 * rank (one all-gather of the padded buffer). ZeRO-3 keeps its shard. */
static void levels_allgather_params(Dist* d, GPT2* model) {
    if (d->zero == 3) return;
    d->gathered = (double)(d->shard * d->world);
    levels_count(d, 0, d->shard * d->world, d->shard, 0, 1);
#ifdef USE_MPI
    if (d->world > 1)
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, model->params_memory, (int)d->shard, MPI_FLOAT,
                                MPI_COMM_WORLD));
#else
    (void)model;
#endif
}

/* Before a step's first forward: zero the gradients and the step's counts. */
static void dist_step_begin(Dist* d, GPT2* model) {
    gpt2_zero_grad(model);
    d->reduced = d->gathered = 0.0;
    if (d->zero) memset(d->grad_shard, 0, d->shard * sizeof(float));
    if (d->lv) {
        d->lv->sent[0] = d->lv->sent[1] = 0.0;
        d->lv->counting = 1;
    }
}

/* After the step's update: its bytes per level into the run's, and with
 * --comm-levels 1 a line (summed over the ranks: collective). */
static void levels_step_end(Dist* d, int step) {
    Levels* lv = d->lv;
    if (!lv) return;
    lv->counting = 0;
    lv->steps++;
    for (int e = 0; e < NUM_LEVELS; e++) lv->sent_run[e] += lv->sent[e];
    lv->backward = 0;
    if (lv->report) {
        double all[NUM_LEVELS] = {dist_sum(d, lv->sent[0]), dist_sum(d, lv->sent[1])};
        printf("step %d: bytes sent: %s %.0f, %s %.0f (summed over the ranks); rank 0: %.0f, %.0f\n", step,
               LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], lv->sent[0], lv->sent[1]);
    }
}

/* At the end: the topology and the bytes per level per step (collective). */
static void levels_print(Dist* d) {
    Levels* lv = d->lv;
    if (!lv || d->world <= 1 || lv->steps == 0) return;
    double per[NUM_LEVELS], all[NUM_LEVELS];
    for (int e = 0; e < NUM_LEVELS; e++) {
        per[e] = lv->sent_run[e] / lv->steps;
        all[e] = dist_sum(d, per[e]);
    }
    printf("bytes sent per step by level (%d node(s) x %d rank(s), %s reduction): %s %.0f, %s %.0f summed over the "
           "ranks; rank 0: %.0f, %.0f\n", lv->nodes, lv->per_node, lv->hierarchical ? "hierarchical" : "flat",
           LEVEL_NAMES[0], all[0], LEVEL_NAMES[1], all[1], per[0], per[1]);
    if (d->zero == 3) {
        for (int e = 0; e < NUM_LEVELS; e++) all[e] = dist_sum(d, lv->sent_bwd_gather[e] / lv->steps);
        printf("of which backward's weight gathers: %s %.0f, %s %.0f per step summed over the ranks\n", LEVEL_NAMES[0],
               all[0], LEVEL_NAMES[1], all[1]);
    }
}

/* ------------------------------------------------------------------ ZeRO-3 */

/* Start gathering the flat range [a, a + n) of the sharded weights into
 * dst: rank q sends its part (MPI_Iallgatherv; `cd` holds the 2W counts and
 * displacements until it completes). One rank: a copy. */
static void zero3_gather_start(Dist* d, float* dst, size_t a, size_t n, int* cd, void* request, int slot) {
    const float* shard = d->model->params_memory; /* [lo, lo + shard) */
    Levels* lv = d->lv;
    double before[NUM_LEVELS] = {lv->sent[0], lv->sent[1]};
    if (lv->counting) d->gathered += (double)n; /* (a step's: not validation's) */
    if (lv->hooks.gather) lv->hooks.gather(lv->hooks.ctx, dst, a, n, slot); /* counts its own bytes */
    else levels_count(d, a, n, d->shard, 0, 1);
    if (lv->backward)
        for (int e = 0; e < NUM_LEVELS; e++) lv->sent_bwd_gather[e] += lv->sent[e] - before[e];
    if (lv->hooks.gather) return;
#ifdef USE_MPI
    if (d->world > 1) {
        int W = d->world;
        for (int q = 0; q < W; q++) {
            size_t c = levels_piece(a, n, d->shard, q), lo = (size_t)q * d->shard;
            cd[q] = (int)c;
            cd[W + q] = c ? (int)((lo > a ? lo : a) - a) : 0;
        }
        size_t from = d->lo > a ? d->lo : a;
        MPI_CHECK(MPI_Iallgatherv(cd[d->rank] ? shard + (from - d->lo) : shard, cd[d->rank], MPI_FLOAT, dst, cd, cd + W,
                                  MPI_FLOAT, MPI_COMM_WORLD, (MPI_Request*)request));
        return;
    }
#endif
    (void)cd, (void)request;
    memcpy(dst, shard + a, n * sizeof(float)); /* one rank: its shard is everything */
}

/* Start gathering layer l's 12 slices into buffer l % 2. */
static void zero3_layer_start(Dist* d, int l) {
    Levels* lv = d->lv;
    int b = l % 2, L = d->model->config.num_layers;
    size_t at = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = d->model->param_sizes[k] / (size_t)L;
        int i = k - LAYER_TENSORS_BEGIN, slot = b * LAYER_TENSORS + i; /* (the hooks' gather slot) */
        void* request = NULL;
        int* cd = NULL;
#ifdef USE_MPI
        request = &lv->req[b][i];
        cd = lv->counts + (size_t)slot * 2 * (size_t)d->world;
#endif
        zero3_gather_start(d, lv->layer[b] + at, d->offsets[k] + (size_t)l * per_layer, per_layer, cd, request, slot);
        at += per_layer;
    }
    lv->layer_in[b] = l;
    lv->pending[b] = d->world > 1 || lv->hooks.gather;
}

static void zero3_layer_wait(Dist* d, int b) {
    Levels* lv = d->lv;
    if (lv->pending[b] && lv->hooks.gather)
        for (int i = 0; i < LAYER_TENSORS; i++) lv->hooks.gather_wait(lv->hooks.ctx, b * LAYER_TENSORS + i);
#ifdef USE_MPI
    else if (lv->pending[b]) MPI_CHECK(MPI_Waitall(LAYER_TENSORS, lv->req[b], MPI_STATUSES_IGNORE));
#endif
    lv->pending[b] = 0;
}

/* The forward/backward hook (GPT2.layer_weights): layer -1, the head,
 * gathered before forward; layer l's weights, gathered (or waited for), the
 * next layer's gather started. Returns the buffer holding layer l. */
static float* zero3_layer_weights(void* ctx, int l, int backward) {
    Dist* d = (Dist*)ctx;
    Levels* lv = d->lv;
    int L = d->model->config.num_layers;
    double t0 = time_ms();
    lv->backward = backward;
    if (l < 0 || (backward && l == L - 1)) { /* a pass begins: every layer is gathered anew */
        for (int b = 0; b < 2; b++) zero3_layer_wait(d, b), lv->layer_in[b] = -1;
        zero3_layer_start(d, backward ? L - 1 : 0);
    }
    if (l < 0) { /* the head, while layer 0's gather is in flight */
        size_t P = d->model->num_parameters, C = (size_t)d->model->config.channels;
        size_t embed = d->model->param_sizes[0] + d->model->param_sizes[1];
        int* cd = NULL;
        void* reqs[2] = {NULL, NULL};
#ifdef USE_MPI
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        int* head_cd = (int*)xmalloc(sizeof(int) * 4 * (size_t)d->world);
        cd = head_cd;
        reqs[0] = &req[0], reqs[1] = &req[1];
#endif
        zero3_gather_start(d, lv->head, 0, embed, cd, reqs[0], 2 * LAYER_TENSORS);
        zero3_gather_start(d, lv->head + embed, P - 2 * C, 2 * C, cd ? cd + 2 * d->world : NULL, reqs[1],
                           2 * LAYER_TENSORS + 1);
        if (lv->hooks.gather)
            for (int s = 0; s < 2; s++) lv->hooks.gather_wait(lv->hooks.ctx, 2 * LAYER_TENSORS + s);
#ifdef USE_MPI
        if (!lv->hooks.gather) MPI_CHECK(MPI_Waitall(2, req, MPI_STATUSES_IGNORE));
        free(head_cd);
#endif
        d->comm_ms += time_ms() - t0;
        return NULL;
    }
    int b = l % 2, next = backward ? l - 1 : l + 1;
    if (lv->layer_in[b] != l) zero3_layer_wait(d, b), zero3_layer_start(d, l);
    zero3_layer_wait(d, b);
    if (next >= 0 && next < L) zero3_layer_start(d, next); /* into the other buffer, whose layer is done */
    d->comm_ms += time_ms() - t0;
    return lv->layer[b];
}

/* The random init put off until train_setup (gptc/cli.h): under ZeRO-3
 * only this rank's shard, drawn from the same sequence. */
static void dist_fill_random(const Dist* d, GPT2* model, uint64_t seed) {
    if (d->zero == 3) gpt2_fill_random_range(model, seed, model->params_memory, d->lo, d->hi);
    else gpt2_fill_random(model, seed);
}

/* The weights for the saver (gptc/saver.h) to write as a model file: every
 * rank's shard onto rank 0's dst (P floats). Collective. */
static void zero3_gather_model(const Dist* d, const GPT2* model, float* dst) {
    size_t n = d->hi - d->lo;
#ifdef USE_MPI
    if (d->world > 1) {
        int W = d->world, *cd = (int*)xmalloc(sizeof(int) * 2 * (size_t)W);
        for (int q = 0; q < W; q++) {
            cd[q] = (int)levels_piece(0, model->num_parameters, d->shard, q);
            cd[W + q] = cd[q] ? (int)((size_t)q * d->shard) : 0;
        }
        MPI_CHECK(MPI_Gatherv(model->params_memory, (int)n, MPI_FLOAT, dst, cd, cd + W, MPI_FLOAT, 0, MPI_COMM_WORLD));
        free(cd);
        return;
    }
#endif
    memcpy(dst, model->params_memory, n * sizeof(float));
}

/* Where a state's weights are loaded (gptc/resume.h): the weights, or under
 * ZeRO-3 a temporary of P floats (outside the memory plan, like the read
 * buffer), whose slice [lo, hi) dist_params_keep then takes. */
static float* dist_params_full(const Dist* d, GPT2* model) {
    if (d->zero != 3) return model->params_memory;
    float* full = xmalloc_floats(model->num_parameters);
    memset(full, 0, model->num_parameters * sizeof(float));
    return full;
}
static void dist_params_keep(const Dist* d, GPT2* model, float* full) {
    if (full == model->params_memory) return;
    memcpy(model->params_memory, full + d->lo, (d->hi - d->lo) * sizeof(float));
    free(full);
}

/* The model's weight pointers: the head's at the gathered head, the
 * layers' NULL (they live in lv->layer, one at a time). */
static void zero3_point(Dist* d, GPT2* model) {
    Levels* lv = d->lv;
    size_t C = (size_t)model->config.channels;
    memset(&model->params, 0, sizeof(model->params));
    model->params.wte = lv->head;
    model->params.wpe = model->params.wte + model->param_sizes[0];
    model->params.lnfw = model->params.wpe + model->param_sizes[1];
    model->params.lnfb = model->params.lnfw + C;
}

/* Under ZeRO-3 (dist_setup_model, after the shard is made): the gathered
 * buffers, the model's weight pointers, and the hook. */
static void zero3_setup(Dist* d, GPT2* model) {
    Levels* lv = d->lv;
    lv->head = ledger_floats(MEM_ZERO, d->head_floats);
    lv->layer[0] = ledger_floats(MEM_ZERO, d->layer_floats);
    lv->layer[1] = ledger_floats(MEM_ZERO, d->layer_floats);
    zero3_point(d, model);
    model->layer_weights = zero3_layer_weights;
    model->on_layer_grads_ctx = d;
    if (lv->hooks.setup) lv->hooks.setup(lv->hooks.ctx);
}

/* The sampler (rank 0, section 7) reads every weight: under ZeRO-3 they are
 * gathered onto rank 0 while it samples (P floats more, MEM_SAMPLER; in the
 * memory plan). Collective; returns what zero3_sample_end frees (NULL
 * unless ZeRO-3 on rank 0). */
static float* zero3_sample_begin(Dist* d, GPT2* model) {
    if (d->zero != 3) return NULL;
    float* whole = d->rank == 0 ? ledger_floats(MEM_SAMPLER, model->num_parameters) : NULL;
    zero3_gather_model(d, model, whole);
    if (whole) parameters_point(&model->params, whole, &model->config);
    return whole;
}
static void zero3_sample_end(Dist* d, GPT2* model, float* whole) {
    if (!whole) return;
    zero3_point(d, model);
    ledger_free(whole);
}

#endif /* GPTC_ZERO3_H */
