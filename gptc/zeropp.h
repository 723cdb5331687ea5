/*
 * gptc/zeropp.h — ZeRO++ (Wang et al., arXiv 2306.10209) on the CPU
 * trainer's --zero 3: qwZ (--qwz 8|4: the weights gathered as INT8/INT4
 * blocks), hpZ (--hpz 1: a secondary copy of the weights sharded over the
 * ranks of a node, so that all gathers but each step's first forward stay
 * inside the node) and qgZ (--qgz 4|8: the gradients reduced as INT4/INT8
 * blocks by all-to-all inside the node, then across nodes, summed in fp32
 * at each hop; --qgz-feedback 1: with error feedback). The master weights,
 * the gradient sums and AdamW stay fp32: only what travels is quantised.
 *
 * Included by train_gpt.c in section 6 right after gptc/zero3.h, whose
 * ZeroHooks it fills (zero3.h calls them for every range it gathers or
 * reduces); the block codec is gptc/quant.h's (its error bound, tested in
 * dev/quant/test_quant.c). MPI when USE_MPI is defined; on one process the
 * same arithmetic without messages. The GPU twin (train_gpt.cu, "ZeRO++ on
 * --zero 3", over NCCL on its bucket layout; checked on the CPU execution
 * layer only) follows these semantics and writes the same dump. Defines:
 * ZeroPP, ZeroPPSizes, zeropp_sizes, zeropp_init.
 * Tested by scripts/tests/test_zeropp.sh (make test-zeropp), whose wire check
 * runs a test build with GPTC_ZEROPP_DUMP=dir (below: what each hook sent
 * and received, off when unset; compiled in only with -DGPTC_TEST_HOOKS)
 * and re-derives it in scripts/tests/zeropp_ref.py.
 *
 * The ranges. ZeRO-3 gathers and reduces one flat range [a, a + n) at a
 * time: the head's two ([0, wte + wpe) and [P - 2C, P): lnfw, lnfb) and
 * each layer's 12 tensor slices. Rank q owns the piece c_q = |[a, a + n) ∩
 * [q shard, (q + 1) shard)| of a range; each piece is quantised on its own
 * into one slot of gptc/quant.h (its blocks start at the piece's first
 * element): slot(c) = 4 ceil(c / block) + 4 ceil(payload(c) / 4) bytes,
 * payload c bytes in INT8, ceil(c / 2) in INT4.
 * The machine: N nodes of K ranks (gptc/zero3.h's Levels, nodes of equal
 * size); a rank is (node p, local j); the intra communicator is ordered by
 * j, the inter one (the ranks with the same j, one per node) by p.
 *
 * qwZ, a gathered range: every rank quantises its piece; the slots travel
 * across nodes first (to the ranks with the same j: (N - 1) slot(c_me)
 * bytes inter-node), then inside the node as bundles of the N slots of
 * local index j ((K - 1) sum_p slot(c_(p,j)) intra-node); every rank
 * dequantises every slot, its own too, so all ranks compute with the same
 * weights: deq(q(w)), within quant_error_bound of w per element (|w -
 * deq| <= about max|block| / 254 in INT8).
 * hpZ: node rank j keeps the flat range [j N shard, (j + 1) N shard) of the
 * weights (N shard floats: P / K, padded). Inside a training step the first
 * forward gathers as above (qwZ or fp32, over the world) and copies its
 * part of each range into the secondary; from the first backward gather on
 * (backward, and the forwards of further micro-batches) every range is
 * all-gathered from the node's secondaries over the intra communicator:
 * (K - 1) c2_j x 4 bytes intra-node, nothing across nodes. Each step
 * refreshes it (the weights change at each update); validation and
 * sampling, outside a step, gather from the primary shards. Without qwZ the
 * secondary holds the very floats of the primary shards, so --hpz 1 alone
 * trains bit for bit as plain --zero 3.
 * qgZ, a reduced range (this rank's values src): hop 0, inside the node:
 * every piece owned by another local index is quantised (the rank's own
 * index's are not: they do not travel) and sent as bundles per local peer
 * ((K - 1) ranks' pieces of all nodes: sum over j != j_me, p of slot);
 * the rank sums in fp32 its own values and the dequantised bundles it
 * receives, for the N pieces of its local index; hop 1, across nodes: each
 * of those N partial sums but its own node's is quantised once (the running
 * sum is never re-quantised at a further hop) and sent to the node that
 * owns it (sum_{p != p_me} slot), and the rank adds the dequantised partial
 * sums it receives to its own: the sum over all W ranks of its piece, in
 * fp32, added into grad_shard. Error per element: at most the sum over the
 * hops of the quantisation bound of the blocks that carried it
 * (gptc/quant.h's header; checked in dev/quant/test_quant.c).
 * Error feedback (--qgz-feedback 1): what each quantisation lost (v -
 * deq(q(v)), v = the value plus the residual) is kept and added the next
 * time the same elements are quantised, so that the sum of the applied
 * gradients stays within one step's error of the true sum. The residuals
 * (P + N shard floats: hop 0 by flat index, hop 1 by node and place in the
 * shard) are not saved in the training state: a resume restarts them at 0,
 * so a resumed run with feedback differs from an uninterrupted one by about
 * one step's quantisation error (without feedback a resume is bit for bit).
 *
 * Bytes each rank sends per step, A micro-batches (summed over the ranks,
 * S_b = sum over the ranges of sum_q slot(c_q) in b bits; Ψ_f, Ψ_b the
 * forward's and backward's gathered floats: head + L layer, L layer):
 *   gathers   step's first forward: qwZ intra (K-1) N S_8, inter (N-1) S_8;
 *             fp32 flat intra 4 (K-1) Ψ_f, inter 4 (N-1) K Ψ_f;
 *             the rest: hpZ intra 4 N (K-1) Ψ, inter 0; else as the first;
 *   reduction qgZ intra N (K-1) S_b, inter (N-1) S_b (each micro-batch's
 *             layers, the head's once).
 * scripts/tests/test_zeropp.sh checks these against the trainer's counters.
 * Memory per rank (MEM_ZERO, in the ledger and the plan: zeropp_sizes):
 * hpZ's secondary N shard floats; feedback's residuals P + N shard floats;
 * qgZ's two slot buffers (the largest range's sum_q slot(c_q) in INT8
 * bytes each) and its partial sums (the largest range's floats); qwZ's
 * gather regions (zeropp_regions: each layer slice's slots twice, for the
 * two layer buffers, and the head's two ranges unless qgZ's buffers hold
 * them).
 * Overlap: a gather is started (this rank's piece quantised, the first
 * hop's MPI_Iallgatherv posted: across nodes, or inside the one node;
 * hpZ's and fp32's single MPI_Iallgatherv) and finished when gptc/zero3.h
 * waits for its layer (qwZ: the second hop, the bundles inside the node,
 * blocking, then every slot dequantised); meanwhile the layer before
 * computes, as with zero3.h's own fp32 gathers. The exchange moves the
 * same bytes as the pairwise rings it replaced (bit for bit the same
 * weights: test_zeropp's wire check). On one machine Open MPI moves them
 * inside MPI calls, so the overlap hides the posting, not the transfer
 * (gptc/runtime.h); a network that moves them by itself hides more. The
 * reductions (qgZ) block.
 */
#ifndef GPTC_ZEROPP_H
#define GPTC_ZEROPP_H

#include "quant.h" /* defines: quant_slot_bytes, quant_slot_encode, quant_slot_decode, quant_error_bound */

/* The gathers in flight (gptc/zero3.h's slots: layer buffer b's slice i at
 * b LAYER_TENSORS + i, the head's two ranges after them): each is started
 * by zeropp_gather and finished by zeropp_gather_wait, so that the next
 * layer's gather is in flight while this layer computes, as zero3.h's own
 * fp32 gathers are. Its collective's counts and displacements (2W ints), and
 * under qwZ its slots (a region of `gather` of its own), stay put until then. */
#define ZEROPP_SLOTS (2 * LAYER_TENSORS + 2)
typedef struct {
    float* dst;
    size_t a, n;
    int source;    /* 0 fp32 primary, 1 qwZ primary, 2 hpZ secondary (the dump's) */
    int cut;       /* the step's first forward: this rank's part goes into the secondary when it arrives */
    int dump;      /* inside a step with GPTC_ZEROPP_DUMP: the record, when it arrives */
    int active;
    int* cd;       /* (2W) */
    uint8_t* slots; /* qwZ: this range's slots, (local, node) order, in a region of `room` bytes */
    size_t room;
#ifdef USE_MPI
    MPI_Request req;
#endif
} ZeroPPGather;

typedef struct {
    Dist* d;
    int qwz, qgz, feedback, hpz, block; /* the flags: bits (0 = fp32), 0/1, elements per block */
    int N, K;                /* nodes, ranks per node */
    int* who;                /* (K N) the world rank of (local j, node p) at j N + p */
    size_t* cnt;             /* (W) the current range's piece of each world rank */
    size_t* off;             /* (K N + 1) its slots' offsets, in (local, node) order */
    size_t* poff;            /* (N + 1) qgZ: the partial sums' offsets */
    int* cd;                 /* (ZEROPP_SLOTS, 2 W) each gather's counts and displacements (pend[slot].cd) */
    ZeroPPGather pend[ZEROPP_SLOTS]; /* the gathers in flight, by zero3.h's slot */
    uint8_t* gather;         /* qwZ (gather_bytes): every slot's region of slots, at region[slot] */
    size_t region[ZEROPP_SLOTS + 1], gather_bytes;
    float* secondary;        /* hpZ (N shard): the flat range [sec_lo, sec_lo + N shard) */
    size_t sec_lo;
    int sec_step, sec_filled; /* the step it was cut in (Levels.steps), and whether the cut is complete */
    float* residual;         /* --qgz-feedback (P + N shard): hop 0 by flat index, hop 1 by (node, place in shard) */
    uint8_t *send, *recv;    /* (slot_bytes) each: qgZ's */
    float* partial;          /* qgZ (n_max): the N partial sums of this rank's local index */
    size_t slot_bytes, n_max, residual_floats;
    FILE* dump;              /* GPTC_ZEROPP_DUMP (below): this rank's records, else NULL */
    int dump_step, dump_sec_step; /* the step whose master shard / secondary was last dumped */
} ZeroPP;

typedef struct {
    size_t secondary, residual, partial; /* floats */
    size_t slots;                        /* bytes, each buffer */
    int slot_buffers;                    /* 0, or 2 (qgZ's send and receive) */
    size_t gather;                       /* bytes: qwZ's regions, one per gather slot (zeropp_regions) */
} ZeroPPSizes;

/* The slots of the flat range [a, a + n), all ranks' pieces, in bytes (INT8: INT4's are smaller). */
static size_t zeropp_range_slots(const Dist* d, size_t a, size_t n, int block) {
    size_t total = 0;
    for (int q = 0; q < d->world; q++) total += quant_slot_bytes(levels_piece(a, n, d->shard, q), 8, block);
    return total;
}

/* qwZ's regions, one per gather slot (zeropp_gather): layer buffer b's
 * slice i at b LAYER_TENSORS + i, as large as that slice's slots in the
 * layer that needs most; then, `head` set, the head's two ranges (else
 * they use qgZ's send and receive buffers: a head gather is waited for
 * where it starts, and a reduction never runs meanwhile). off
 * (ZEROPP_SLOTS + 1): their offsets; returns the total bytes. d:
 * dist_geometry's. */
static size_t zeropp_regions(const Dist* d, const GPT2Config* c, int block, int head, size_t* off) {
    size_t sizes[NUM_PARAMETER_TENSORS], P = parameter_count(c), L = (size_t)c->num_layers, C = (size_t)c->channels;
    size_t most[LAYER_TENSORS];
    parameter_sizes(sizes, c);
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t n = sizes[k] / L, m = 0;
        for (size_t l = 0; l < L; l++) {
            size_t t = zeropp_range_slots(d, d->offsets[k] + l * n, n, block);
            m = t > m ? t : m;
        }
        most[k - LAYER_TENSORS_BEGIN] = m;
    }
    off[0] = 0;
    for (int s = 0; s < ZEROPP_SLOTS; s++) {
        size_t r = s < 2 * LAYER_TENSORS ? most[s % LAYER_TENSORS]
                   : !head                  ? 0
                   : s == 2 * LAYER_TENSORS ? zeropp_range_slots(d, 0, sizes[0] + sizes[1], block)
                                            : zeropp_range_slots(d, P - 2 * C, 2 * C, block);
        off[s + 1] = off[s] + (r + 63) / 64 * 64; /* (each region 64-byte aligned) */
    }
    return off[ZEROPP_SLOTS];
}

/* What ZeRO++'s buffers take on a rank (the trainer's allocation and the
 * memory plan, gptc/plan.h, both call this). d: dist_geometry's. */
static ZeroPPSizes zeropp_sizes(const Dist* d, const GPT2Config* c, int N, int qwz, int qgz, int feedback, int hpz,
                                int block) {
    ZeroPPSizes z;
    memset(&z, 0, sizeof(z));
    if (d->zero != 3 || !(qwz || qgz || hpz)) return z;
    size_t sizes[NUM_PARAMETER_TENSORS], P = parameter_count(c), L = (size_t)c->num_layers, C = (size_t)c->channels;
    parameter_sizes(sizes, c);
    z.secondary = hpz ? (size_t)N * d->shard : 0;
    z.residual = feedback ? P + (size_t)N * d->shard : 0;
    size_t region[ZEROPP_SLOTS + 1];
    z.gather = qwz ? zeropp_regions(d, c, block, !qgz, region) : 0;
    z.slot_buffers = qgz ? 2 : 0;
    if (!z.slot_buffers) return z;
    /* the ranges: the head's two, each layer's slices; the largest slot total and range */
    size_t ranges[2 + 2 * NUM_PARAMETER_TENSORS][2], nr = 0;
    ranges[nr][0] = 0, ranges[nr][1] = sizes[0] + sizes[1], nr++;
    ranges[nr][0] = P - 2 * C, ranges[nr][1] = 2 * C, nr++;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++)
        for (size_t l = 0; l < L; l++) {
            size_t a = d->offsets[k] + l * (sizes[k] / L), n = sizes[k] / L, total = zeropp_range_slots(d, a, n, block);
            z.slots = total > z.slots ? total : z.slots;
            z.partial = n > z.partial ? n : z.partial;
        }
    for (size_t r = 0; r < nr; r++) {
        size_t total = zeropp_range_slots(d, ranges[r][0], ranges[r][1], block);
        z.slots = total > z.slots ? total : z.slots;
        z.partial = ranges[r][1] > z.partial ? ranges[r][1] : z.partial;
    }
    return z;
}

/* ---- GPTC_ZEROPP_DUMP=dir: what went over the wire, for an independent check ----
 * In a test build (-DGPTC_TEST_HOOKS) with it set, every rank writes
 * dir/rank<r>.bin (unset, or a user's build: nothing is opened and each
 * hook pays one NULL test). Records, inside training steps only
 * (not validation or sampling), in the order the hooks run (the same on
 * every rank): a header of 8 little-endian int64 {ZEROPP_DUMP_MAGIC, tag,
 * step (0-based), backward, source, a, n, 0}, then n fp32. Tags:
 *   0 config   (once, at setup; n = 0): source = W, a = N, backward = K,
 *              step = shard; the flags follow as 8 int64 {qwz, qgz,
 *              feedback, hpz, block, node, local, P};
 *   1 master   this rank's fp32 master shard [rank shard, +shard), at the
 *              step's first gather (before it: the weights this step sees);
 *   2 gather   the n weights of [a, a + n) as the hook left them in dst
 *              (dequantised); source 0 fp32 primary, 1 qwZ primary, 2 hpZ;
 *   3 secondary hpZ's secondary [a = sec_lo, + N shard) at the step's
 *              first gather from it;
 *   4 reduce   qgZ: this rank's local gradients of [a, a + n), before;
 *   5 grad     the whole grad_shard right after that reduction added in.
 * scripts/tests/zeropp_ref.py re-derives every gather, secondary and grad record
 * from the masters and the local gradients of all ranks, in numpy, from the
 * documented format alone; scripts/tests/test_zeropp.sh runs it (and, with
 * ZEROPP_MUTANTS=1, make test-zeropp-mutants, shows it failing on planted bugs). */
#define ZEROPP_DUMP_MAGIC 0x5a505044554d5031LL /* "ZPPDUMP1" (the CUDA twin's dump too) */
#ifdef GPTC_TEST_HOOKS /* (test builds only: gptc/test_hooks.h) */
static void zeropp_dump(ZeroPP* z, int tag, int source, size_t a, size_t n, const float* x) {
    Levels* lv = z->d->lv;
    int64_t h[8] = {ZEROPP_DUMP_MAGIC, tag, lv->steps, lv->backward, source, (int64_t)a, (int64_t)n, 0};
    CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(x, sizeof(float), n, z->dump) == n,
          "GPTC_ZEROPP_DUMP: writing rank %d's record failed (disk full?): unset it or free space", z->d->rank);
}
static void zeropp_dump_open(ZeroPP* z) {
    const char* dir = getenv("GPTC_ZEROPP_DUMP");
    if (!dir || !*dir) return;
    Dist* d = z->d;
    char path[4096];
    CHECK(snprintf(path, sizeof(path), "%s/rank%d.bin", dir, d->rank) < (int)sizeof(path),
          "GPTC_ZEROPP_DUMP=%s: the path is too long", dir);
    z->dump = fopen(path, "wb");
    CHECK(z->dump != NULL, "GPTC_ZEROPP_DUMP: cannot create %s: make the folder (or unset it)", path);
    z->dump_step = z->dump_sec_step = -1;
    int64_t h[8] = {ZEROPP_DUMP_MAGIC, 0, (int64_t)d->shard, z->K, d->world, z->N, 0, 0};
    int64_t f[8] = {z->qwz, z->qgz, z->feedback, z->hpz, z->block, d->lv->node, d->lv->local,
                    (int64_t)d->model->num_parameters};
    CHECK(fwrite(h, sizeof(h), 1, z->dump) == 1 && fwrite(f, sizeof(f), 1, z->dump) == 1,
          "GPTC_ZEROPP_DUMP: writing %s failed (disk full?)", path);
}
static void zeropp_dump_close(ZeroPP* z) {
    CHECK(!z->dump || fclose(z->dump) == 0, "GPTC_ZEROPP_DUMP: closing rank %d's file failed (disk full?)", z->d->rank);
}
#else /* a user's build: z->dump stays NULL, so the hooks never record */
static inline void zeropp_dump(ZeroPP* z, int tag, int source, size_t a, size_t n, const float* x) {
    (void)z, (void)tag, (void)source, (void)a, (void)n, (void)x;
}
static inline void zeropp_dump_open(ZeroPP* z) { (void)z; }
static inline void zeropp_dump_close(ZeroPP* z) { (void)z; }
#endif

MAYBE_UNUSED static void zeropp_add_sent(Levels* lv, int level, size_t bytes) {
    if (lv->counting) lv->sent[level] += (double)bytes;
}

/* The pieces of [a, a + n) (cnt) and their slots' offsets in (local, node) order. */
static void zeropp_layout(ZeroPP* z, size_t a, size_t n, int bits) {
    Dist* d = z->d;
    for (int q = 0; q < d->world; q++) z->cnt[q] = levels_piece(a, n, d->shard, q);
    z->off[0] = 0;
    for (int i = 0; i < z->K * z->N; i++)
        z->off[i + 1] = z->off[i] + (bits ? quant_slot_bytes(z->cnt[z->who[i]], bits, z->block) : 0);
}

/* where rank q's piece of [a, a + n) begins, in the range */
static size_t zeropp_at(const ZeroPP* z, int q, size_t a) {
    size_t lo = (size_t)q * z->d->shard;
    return (lo > a ? lo : a) - a;
}

#ifdef USE_MPI
/* a pairwise exchange over comm: this rank (index me of P) sends send_at(to)
 * and receives into recv_at(from); sizes in bytes (the two sides agree). */
static void zeropp_sendrecv(MPI_Comm comm, const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                            int from) {
    MPI_CHECK(MPI_Sendrecv(send, quant_int_count(send_bytes), MPI_BYTE, to, 7, recv, quant_int_count(recv_bytes),
                           MPI_BYTE, from, 7, comm, MPI_STATUS_IGNORE));
}
#endif

/* qwZ, started: this rank's piece quantised into its slot; the first hop's
 * collective posted (across nodes: the slots of this local index, one per
 * node, MPI_Iallgatherv over inter; one node: the bundles over intra). Every
 * byte is counted now, the second hop's too (zero3.h attributes a gather's
 * bytes to forward or backward as it starts). */
static void zeropp_qwz_start(ZeroPP* z, ZeroPPGather* g) {
    Dist* d = z->d;
    Levels* lv = d->lv;
    int bits = z->qwz, N = z->N, K = z->K, j0 = lv->local, p0 = lv->node;
    size_t a = g->a, n = g->n;
    zeropp_layout(z, a, n, bits);
    ALWAYS(z->off[K * N] <= g->room);
    size_t mine = z->cnt[d->rank], at = z->off[j0 * N + p0];
    if (mine) quant_slot_encode(d->model->params_memory + (a + zeropp_at(z, d->rank, a) - d->lo), NULL, mine, bits,
                                z->block, g->slots + at);
#ifdef USE_MPI
    size_t my_slot = z->off[j0 * N + p0 + 1] - at, bundle = z->off[j0 * N + N] - z->off[j0 * N];
    zeropp_add_sent(lv, LEVEL_INTER, (size_t)(N - 1) * my_slot); /* this rank's slot to the N - 1 ranks of its index */
    zeropp_add_sent(lv, LEVEL_INTRA, (size_t)(K - 1) * bundle);  /* the N slots of its index to the K - 1 others */
    if (N > 1) {
        for (int p = 0; p < N; p++) {
            g->cd[p] = quant_int_count(z->off[j0 * N + p + 1] - z->off[j0 * N + p]);
            g->cd[N + p] = quant_int_count(z->off[j0 * N + p] - z->off[j0 * N]);
        }
        MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g->slots + z->off[j0 * N], g->cd, g->cd + N, MPI_BYTE,
                                  lv->inter, &g->req));
    } else if (K > 1) {
        for (int j = 0; j < K; j++) {
            g->cd[j] = quant_int_count(z->off[j * N + N] - z->off[j * N]);
            g->cd[K + j] = quant_int_count(z->off[j * N]);
        }
        MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g->slots, g->cd, g->cd + K, MPI_BYTE, lv->intra,
                                  &g->req));
    }
#endif
}

/* qwZ, finished: the first hop waited for; across nodes and inside them,
 * the second (the bundles over intra); then every slot dequantised, this
 * rank's own too (the same weights everywhere). */
static void zeropp_qwz_finish(ZeroPP* z, ZeroPPGather* g) {
    int bits = z->qwz, N = z->N, K = z->K;
    size_t a = g->a;
    float* dst = g->dst;
    zeropp_layout(z, a, g->n, bits); /* (the range's again: a reduction may have used the arrays since) */
#ifdef USE_MPI
    Levels* lv = z->d->lv;
    if (N > 1 || K > 1) MPI_CHECK(MPI_Wait(&g->req, MPI_STATUS_IGNORE));
    if (N > 1 && K > 1) {
        for (int j = 0; j < K; j++) {
            g->cd[j] = quant_int_count(z->off[j * N + N] - z->off[j * N]);
            g->cd[K + j] = quant_int_count(z->off[j * N]);
        }
        MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g->slots, g->cd, g->cd + K, MPI_BYTE, lv->intra));
    }
#endif
    for (int i = 0; i < K * N; i++) { /* every slot dequantised, this rank's own too (the same weights everywhere) */
        int q = z->who[i];
        if (z->cnt[q]) quant_slot_decode(g->slots + z->off[i], z->cnt[q], bits, z->block, dst + zeropp_at(z, q, a), 0);
    }
}

/* fp32, started: the range from every rank's shard (MPI_Iallgatherv over the world; counted as gptc/zero3.h counts). */
static void zeropp_fp32_start(ZeroPP* z, ZeroPPGather* g) {
    Dist* d = z->d;
    size_t a = g->a, n = g->n;
    levels_count(d, a, n, d->shard, 0, 1);
    const float* mine = d->model->params_memory + (a + zeropp_at(z, d->rank, a) - d->lo);
#ifdef USE_MPI
    if (d->world > 1) {
        int W = d->world;
        for (int q = 0; q < W; q++) {
            g->cd[q] = (int)levels_piece(a, n, d->shard, q);
            g->cd[W + q] = g->cd[q] ? (int)zeropp_at(z, q, a) : 0;
        }
        MPI_CHECK(MPI_Iallgatherv(g->cd[d->rank] ? mine : d->model->params_memory, g->cd[d->rank], MPI_FLOAT, g->dst,
                                  g->cd, g->cd + W, MPI_FLOAT, MPI_COMM_WORLD, &g->req));
        return;
    }
#endif
    memcpy(g->dst, mine, n * sizeof(float));
}

/* hpZ, started: the range from the node's secondaries (MPI_Iallgatherv over intra). */
static void zeropp_hpz_start(ZeroPP* z, ZeroPPGather* g) {
    Dist* d = z->d;
    size_t a = g->a, n = g->n, S2 = (size_t)z->N * d->shard, from = a > z->sec_lo ? a : z->sec_lo;
    const float* mine = z->secondary + (from - z->sec_lo); /* (when this rank's part is empty, not read) */
#ifdef USE_MPI
    Levels* lv = d->lv;
    int K = z->K;
    if (K > 1) {
        for (int j = 0; j < K; j++) {
            size_t lo = (size_t)j * S2;
            g->cd[j] = (int)levels_piece(a, n, S2, j);
            g->cd[K + j] = g->cd[j] ? (int)((lo > a ? lo : a) - a) : 0;
        }
        zeropp_add_sent(lv, LEVEL_INTRA, (size_t)(K - 1) * (size_t)g->cd[lv->local] * sizeof(float));
        MPI_CHECK(MPI_Iallgatherv(g->cd[lv->local] ? mine : z->secondary, g->cd[lv->local], MPI_FLOAT, g->dst, g->cd,
                                  g->cd + K, MPI_FLOAT, lv->intra, &g->req));
        return;
    }
#endif
    ALWAYS(from == a && n <= S2); /* one rank a node: its secondary is every weight */
    memcpy(g->dst, mine, n * sizeof(float));
}

/* The gather hook (gptc/zero3.h), started into slot `slot`: hpZ's
 * secondary inside a step once the first forward has cut it, else the
 * primary shards (qwZ or fp32), to be cut into the secondary when this is a
 * step's first forward. zeropp_gather_wait finishes it. */
static void zeropp_gather(void* ctx, float* dst, size_t a, size_t n, int slot) {
    ZeroPP* z = (ZeroPP*)ctx;
    Levels* lv = z->d->lv;
    ALWAYS(slot >= 0 && slot < ZEROPP_SLOTS && !z->pend[slot].active);
    ZeroPPGather* g = &z->pend[slot];
    g->dst = dst, g->a = a, g->n = n, g->cut = 0, g->active = 1;
    g->dump = z->dump && lv->counting;
    if (g->dump && z->dump_step != lv->steps) /* the step's first gather: the master it gathers from */
        z->dump_step = lv->steps, zeropp_dump(z, 1, 0, z->d->lo, z->d->shard, z->d->model->params_memory);
    if (z->hpz && lv->counting) {
        if (z->sec_step != lv->steps) z->sec_step = lv->steps, z->sec_filled = 0; /* a new step: new weights */
        if (lv->backward) z->sec_filled = 1; /* the first forward gathered (and cut) every range */
        if (z->sec_filled) {
            if (g->dump && z->dump_sec_step != lv->steps)
                z->dump_sec_step = lv->steps, zeropp_dump(z, 3, 2, z->sec_lo, (size_t)z->N * z->d->shard, z->secondary);
            g->source = 2;
            zeropp_hpz_start(z, g);
            return;
        }
        g->cut = 1;
    }
    g->source = z->qwz ? 1 : 0;
    if (z->qwz) zeropp_qwz_start(z, g);
    else zeropp_fp32_start(z, g);
}

/* ...and finished: the weights in dst (dequantised), the dump's record,
 * this rank's part cut into the secondary. */
static void zeropp_gather_wait(void* ctx, int slot) {
    ZeroPP* z = (ZeroPP*)ctx;
    ZeroPPGather* g = &z->pend[slot];
    if (!g->active) return;
    g->active = 0;
    if (g->source == 1) {
        zeropp_qwz_finish(z, g);
    } else {
#ifdef USE_MPI
        if ((g->source == 0 && z->d->world > 1) || (g->source == 2 && z->K > 1))
            MPI_CHECK(MPI_Wait(&g->req, MPI_STATUS_IGNORE));
#endif
    }
    size_t a = g->a, n = g->n;
    if (g->dump) zeropp_dump(z, 2, g->source, a, n, g->dst);
    if (g->cut) { /* this rank's part of the secondary: [sec_lo, sec_lo + N shard) ∩ [a, a + n) */
        size_t lo = a > z->sec_lo ? a : z->sec_lo, end = z->sec_lo + (size_t)z->N * z->d->shard;
        size_t hi = a + n < end ? a + n : end;
        if (hi > lo) memcpy(z->secondary + (lo - z->sec_lo), g->dst + (lo - a), (hi - lo) * sizeof(float));
    }
}

/* The reduction hook (gptc/zero3.h), qgZ: the range [a, a + n) summed over
 * the ranks, this rank's piece added into grad_shard (header comment). */
static void zeropp_reduce(void* ctx, float* src, size_t a, size_t n) {
    ZeroPP* z = (ZeroPP*)ctx;
    Dist* d = z->d;
    Levels* lv = d->lv;
    int bits = z->qgz, N = z->N, j0 = lv->local, p0 = lv->node;
    if (z->dump && lv->counting) zeropp_dump(z, 4, 0, a, n, src);
    zeropp_layout(z, a, n, bits);
    ALWAYS(z->off[z->K * N] <= z->slot_bytes);
    z->poff[0] = 0;
    for (int p = 0; p < N; p++) { /* the partial sums start as this rank's own values of its local index's pieces */
        int q = z->who[j0 * N + p];
        z->poff[p + 1] = z->poff[p] + z->cnt[q];
        memcpy(z->partial + z->poff[p], src + zeropp_at(z, q, a), z->cnt[q] * sizeof(float));
    }
#ifdef USE_MPI
    int K = z->K;
    float* res0 = z->residual; /* hop 0's residuals, by flat index */
    float* res1 = z->residual ? z->residual + d->model->num_parameters : NULL; /* hop 1's: (N, shard) */
    if (K > 1) { /* hop 0: every piece of another local index, quantised, to that local rank */
        for (int i = 0; i < K * N; i++) {
            int q = z->who[i];
            if (i / N == j0 || !z->cnt[q]) continue;
            size_t at = zeropp_at(z, q, a);
            quant_slot_encode(src + at, res0 ? res0 + a + at : NULL, z->cnt[q], bits, z->block, z->send + z->off[i]);
        }
        size_t bundle = z->off[j0 * N + N] - z->off[j0 * N]; /* what each peer sends this rank */
        for (int t = 1; t < K; t++) {
            int to = (j0 + t) % K, from = (j0 - t + K) % K;
            size_t out = z->off[to * N + N] - z->off[to * N];
            zeropp_sendrecv(lv->intra, z->send + z->off[to * N], out, to, z->recv, bundle, from);
            zeropp_add_sent(lv, LEVEL_INTRA, out);
            for (int p = 0; p < N; p++) { /* dequantised and added in fp32 */
                size_t c = z->poff[p + 1] - z->poff[p];
                if (c) quant_slot_decode(z->recv + (z->off[j0 * N + p] - z->off[j0 * N]), c, bits, z->block,
                                         z->partial + z->poff[p], 1);
            }
        }
    }
    if (N > 1) { /* hop 1: each partial sum of another node, quantised once, to its owner */
        for (int p = 0; p < N; p++) {
            int q = z->who[j0 * N + p];
            if (p == p0 || !z->cnt[q]) continue;
            float* r = res1 ? res1 + (size_t)p * d->shard + (a + zeropp_at(z, q, a) - (size_t)q * d->shard) : NULL;
            quant_slot_encode(z->partial + z->poff[p], r, z->cnt[q], bits, z->block, z->send + z->off[j0 * N + p]);
        }
        size_t mine = z->off[j0 * N + p0 + 1] - z->off[j0 * N + p0];
        for (int t = 1; t < N; t++) {
            int to = (p0 + t) % N, from = (p0 - t + N) % N;
            size_t out = z->off[j0 * N + to + 1] - z->off[j0 * N + to];
            zeropp_sendrecv(lv->inter, z->send + z->off[j0 * N + to], out, to, z->recv, mine, from);
            zeropp_add_sent(lv, LEVEL_INTER, out);
            if (z->cnt[d->rank]) quant_slot_decode(z->recv, z->cnt[d->rank], bits, z->block, z->partial + z->poff[p0], 1);
        }
    }
#endif
    size_t c = z->cnt[d->rank], at = a + zeropp_at(z, d->rank, a) - d->lo; /* the sum of this rank's piece */
    float* RESTRICT g = d->grad_shard + at;
    const float* s = z->partial + z->poff[p0];
    for (size_t i = 0; i < c; i++) g[i] += s[i];
    if (z->dump && lv->counting) zeropp_dump(z, 5, 0, d->lo, d->shard, d->grad_shard);
}

/* fp32 reduction when only qwZ/hpZ are on: gptc/zero3.h's own (no hook). */

static void zeropp_setup(void* ctx) {
    ZeroPP* z = (ZeroPP*)ctx;
    Dist* d = z->d;
    ZeroPPSizes s = zeropp_sizes(d, &d->model->config, z->N, z->qwz, z->qgz, z->feedback, z->hpz, z->block);
    z->slot_bytes = s.slots;
    z->n_max = s.partial;
    z->residual_floats = s.residual;
    z->sec_lo = (size_t)d->lv->local * (size_t)z->N * d->shard;
    z->sec_step = -1;
    if (s.secondary) z->secondary = ledger_floats(MEM_ZERO, s.secondary);
    if (s.residual) z->residual = ledger_floats(MEM_ZERO, s.residual); /* zero: nothing lost yet */
    if (s.slot_buffers >= 1) z->send = (uint8_t*)ledger_malloc(MEM_ZERO, s.slots);
    if (s.slot_buffers >= 2) z->recv = (uint8_t*)ledger_malloc(MEM_ZERO, s.slots);
    if (s.gather) { /* qwZ: a region of slots for each gather in flight */
        z->gather_bytes = zeropp_regions(d, &d->model->config, z->block, !z->qgz, z->region);
        ALWAYS(z->gather_bytes == s.gather);
        z->gather = (uint8_t*)ledger_malloc(MEM_ZERO, s.gather);
    }
    for (int slot = 0; slot < ZEROPP_SLOTS; slot++) {
        z->pend[slot].cd = z->cd + (size_t)slot * 2 * (size_t)d->world;
        ZeroPPGather* g = &z->pend[slot];
        int head = slot >= 2 * LAYER_TENSORS;
        g->slots = !z->gather ? NULL : head && z->qgz ? (slot == 2 * LAYER_TENSORS ? z->send : z->recv)
                                                      : z->gather + z->region[slot];
        g->room = !z->gather ? 0 : head && z->qgz ? z->slot_bytes : z->region[slot + 1] - z->region[slot];
    }
    if (s.partial) z->partial = ledger_floats(MEM_ZERO, s.partial);
    zeropp_dump_open(z);
    if (d->rank == 0) {
        printf("ZeRO++: weights gathered %s", z->qwz ? (z->qwz == 8 ? "as INT8" : "as INT4") : "in fp32");
        if (z->hpz) printf(", after each step's first forward from hpZ's node-local secondary (%zu floats a rank)",
                           s.secondary);
        printf("; gradients reduced %s", z->qgz ? (z->qgz == 8 ? "as INT8 by level" : "as INT4 by level") : "in fp32");
        if (z->feedback) printf(" with error feedback (%zu floats a rank, reset on resume)", s.residual);
        if (z->qwz || z->qgz) printf("; blocks of %d, one fp32 scale each", z->block);
        printf("; %d node(s) x %d\n", z->N, z->K);
    }
}

static void zeropp_release(void* ctx) {
    ZeroPP* z = (ZeroPP*)ctx;
    zeropp_dump_close(z);
    ledger_free(z->secondary);
    ledger_free(z->residual);
    ledger_free(z->send);
    ledger_free(z->recv);
    ledger_free(z->gather);
    ledger_free(z->partial);
    free(z->who);
    free(z->cnt);
    free(z->off);
    free(z->poff);
    free(z->cd);
    free(z);
}

/* After levels_init: ZeRO++'s hooks when any of its flags is on. 0, or -1
 * after a message (every rank alike). */
static int zeropp_init(Dist* d, int qwz, int qgz, int feedback, int hpz, int block) {
    if (!(qwz || qgz || hpz)) return 0;
    Levels* lv = d->lv;
    if (lv->per_node == 0) {
        if (d->rank == 0) fprintf(stderr, "error: --qwz/--qgz/--hpz need nodes of equal size: give --topology NxK\n");
        return -1;
    }
    ZeroPP* z = (ZeroPP*)xmalloc(sizeof(ZeroPP));
    memset(z, 0, sizeof(*z));
    z->d = d;
    z->qwz = qwz, z->qgz = qgz, z->feedback = feedback, z->hpz = hpz, z->block = block;
    z->N = lv->nodes, z->K = lv->per_node;
    int W = d->world;
    z->who = (int*)xmalloc(sizeof(int) * (size_t)W);
    for (int q = 0; q < W; q++) z->who[lv->local_of[q] * z->N + lv->node_of[q]] = q;
    z->cnt = (size_t*)xmalloc(sizeof(size_t) * (size_t)W);
    z->off = (size_t*)xmalloc(sizeof(size_t) * ((size_t)W + 1));
    z->poff = (size_t*)xmalloc(sizeof(size_t) * ((size_t)z->N + 1));
    z->cd = (int*)xmalloc(sizeof(int) * 2 * (size_t)W * ZEROPP_SLOTS); /* (each gather slot's 2W) */
    lv->hooks.gather = qwz || hpz ? zeropp_gather : NULL; /* (qgZ alone: zero3.h's own fp32 gathers) */
    lv->hooks.gather_wait = qwz || hpz ? zeropp_gather_wait : NULL;
    lv->hooks.reduce = qgz ? zeropp_reduce : NULL;
    lv->hooks.setup = zeropp_setup;
    lv->hooks.release = zeropp_release;
    lv->hooks.ctx = z;
    return 0;
}

#endif /* GPTC_ZEROPP_H */
