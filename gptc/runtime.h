/*
 * gptc/runtime.h — the CPU trainer's runtime model: a step's time predicted
 * from its work (FLOPs of the GEMMs and attention, bytes of the
 * memory-bound kernels and of AdamW, bytes of the collectives) over rates
 * measured on this machine at start (a calibration well under a second,
 * cached per machine), so --plan can rank its candidates by speed, --auto 1
 * can train with the fastest that fits, and --snapshot-every auto can set
 * the Young/Daly interval.
 *
 * The model of one optimizer step, per rank (B, T, accum micro-batches,
 * W ranks, N = B*T rows):
 *   t_step = accum * (t_gemm + t_attention + t_elementwise + t_softmax
 *                     + t_zero2) + t_optimizer + t_quant + t_comm
 *   t_gemm      = sum over the five weight shapes (K, OC) of the layers'
 *                 qkv (C, 3C), attproj (C, C), fc (C, 4C), fcproj (4C, C),
 *                 L calls each, and the classifier (C, Vp), once, of
 *                 fixed + per_row * N, forward (matmul_forward) and
 *                 backward (matmul_backward: dinp, dweight, the bias sums),
 *                 each shape measured at two row counts (16 and up to 512,
 *                 as many as keep one pass near 0.6 GFLOP): the time is
 *                 affine in N, the weight packed (and its gradient
 *                 accumulated) once a call, each row the same work after.
 *                 The fixed part is what makes many small micro-batches
 *                 slower than a few large ones (the classifier's Vp x C
 *                 above all). Each shape has its own rates: one shape's
 *                 rate taken for all puts the layers' GEMMs well under
 *                 the replayed step (dev/cpu/profile_plan).
 *   t_attention = B * L * the time of attention_forward + backward per
 *                 sequence, measured at (2, Tc = min(T, 128), C, NH),
 *                 times (T / Tc)^2 beyond 128.
 *   t_elementwise = ELEM_BYTES*C bytes per token per layer (two LayerNorms,
 *                 two residual adds, GELU, forward and backward) over the
 *                 bandwidth those same kernels reach at the model's C.
 *   in place:     the layers' part of t_gemm, t_attention and
 *                 t_elementwise times f, a layer inside the step over its
 *                 kernels alone, measured with the trainer's own forward
 *                 and backward of 1 and of 2 layers of this width
 *                 (calib_layer_factor; about 0.9-1.5, held to 0.8-1.6).
 *   t_softmax   = CE_BYTES per logit (N*Vp of them: the cross-entropy's
 *                 passes forward and backward) over its measured bandwidth.
 *   t_zero2     = ZeRO-2 and 3: each layer's bucket zeroed before backward
 *                 writes it, the owned part added into the shard.
 *   t_quant     = ZeRO++ (gptc/zeropp.h): the elements each rank
 *                 quantises and dequantises per step (qwZ: its piece of
 *                 every gathered range, then the whole range; qgZ: the
 *                 pieces it sends at each hop, then what it receives), the
 *                 ranks' mean, each at gptc/quant.h's measured ns per
 *                 element (quant_slot_encode / quant_slot_decode over 2^18
 *                 floats in blocks of 256, INT8 and INT4; qgZ's adding
 *                 decode taken at the plain decode's rate).
 *   t_optimizer = per float, measured alone over 2^21 floats (past the
 *                 caches): zeroing the gradient buffer (gpt2_zero_grad),
 *                 the shard (ZeRO), the norm and the clip's scaling over
 *                 the n parameters this rank updates, AdamW over them (n =
 *                 P under plain data parallelism, P / W under ZeRO).
 *   t_comm      = the collectives of the dist_* code (section 6 of
 *                 train_gpt.c), each alpha + bytes/beta with alpha, beta
 *                 from a ping of MPI_Allreduce at every start (1 float;
 *                 2^18 floats; alpha the fastest call on an idle machine,
 *                 the median call under the load there is now), and the
 *                 rates of MPI_Allreduce, MPI_Ireduce and MPI_Allgather as
 *                 measured (bytes handed in per second): plain, an
 *                 allreduce of P; ZeRO-1, reduces to the owners and an
 *                 all-gather (without overlap one MPI_Reduce_scatter_block
 *                 of the padded P, at its own rate measured at that size,
 *                 at most 2^21 floats); ZeRO-2, every micro-batch
 *                 reduces each layer's 12 slices to their owners, then an
 *                 all-gather. With --overlap the layers' collectives are
 *                 issued during backward, one per slice (12 L messages:
 *                 12 L alphas). Add the ranks' meetings, each what
 *                 calib_sync measured at this start (the median of 11
 *                 rounds of a layer's MPI_Ireduce amid 2 ms of compute,
 *                 then MPI_Wait, against the compute alone, less the
 *                 transfer; on an idle machine too: Open MPI moves a
 *                 non-blocking reduction only while both ranks are in MPI
 *                 calls, so a hook's wait waits for the partner's next
 *                 hook, and the VM's two cores run at different speeds
 *                 while both compute; at the speed now the larger of that
 *                 and the load's term below): one a step (the loss's
 *                 sum), ZeRO-1 and 2 one more (the all-gather of the weights, after AdamW
 *                 over the shard: blocking, and the ranks' AdamW and clip
 *                 lengths differ by what each was given of its core; the
 *                 reduce-scatter of ZeRO-1 without overlap follows the
 *                 loss's sum with no compute between, so it is not one),
 *                 ZeRO-1 with overlap L more (each layer's hook waits for
 *                 the layer two behind), ZeRO-2 accum * L more (a bucket's
 *                 wait).
 *                 ZeRO-3 (one node): every micro-batch 2 + 24 L gathers (the
 *                 head's two ranges, each layer's 12 slices in forward and
 *                 again in backward, an MPI_Iallgatherv each) of head + 2 L
 *                 layer floats at the all-gather rate, the layers'
 *                 reductions as ZeRO-2's (an MPI_Ireduce per owner piece,
 *                 counted exactly), the head's once a step; 3 L + 1
 *                 meetings a micro-batch (each layer's gathers and bucket,
 *                 the head's gather).
 *                 On a shared machine the faster rank waits for the slower
 *                 one there, spinning on its core; measured 0-300 ms a
 *                 meeting at load averages of 6-13 on 2 cores.
 *   t_comm by level, when there are several nodes (--topology NxK or the
 *                 nodes MPI sees), --hierarchical 1, ZeRO++, or --link-gbs:
 *                 runtime_traffic walks the step's collectives as the
 *                 trainer issues them (plain allreduce flat or by level,
 *                 ZeRO-1/2 reductions to the owners flat or by level and
 *                 the all-gather, ZeRO-3's gathers (fp32, qwZ's slots, hpZ's
 *                 node-local secondary after each step's first forward) and
 *                 reductions (fp32 or qgZ's two hops)) for every rank, and
 *                 counts the bytes each sends at each level exactly as
 *                 gptc/zero3.h's and gptc/zeropp.h's counters do (--plan
 *                 prints them; scripts/tests/test_plan.sh compares them with
 *                 --comm-levels 1's counts, to the byte) and the
 *                 collectives or exchanges it takes part in per level (a
 *                 world collective pays the latency of the slowest level);
 *                 per level: the ranks' mean messages x that level's
 *                 latency + their mean bytes / that level's link rate,
 *                 summed over the levels (on a CPU the levels' transfers
 *                 do not overlap each other: every exchange blocks or is
 *                 waited for in turn), plus the two sums (dist_sum). The
 *                 links (calib_levels): with several nodes, a ping on each
 *                 level's communicator at every start (latency: the
 *                 fastest of 21 one-float allreduces; rate: MPI_Allgather of
 *                 2^18 floats, in bytes each rank sends); with --topology
 *                 on one machine both levels are the same shared memory, so
 *                 both measure the same link. --link-gbs INTRA,INTER
 *                 states the rates instead (latencies stay measured): how
 *                 to plan for a cluster from one machine.
 * What --overlap hides: nothing, in this model. On a CPU the MPI transport
 * (shared memory within a node, the sums of the reductions) runs on the
 * same cores as backward, and Open MPI moves non-blocking collectives only
 * inside MPI calls (dist_progress), so the transfer's time is spent either
 * way; overlap changes when, not how much. (A node whose NIC moves the
 * bytes would hide up to the backward's length: not modelled.)
 * On a shared machine the rates are a whole core's (the fastest of 3-5
 * runs: another job only slows a run down; with one thread each run's CPU
 * time, so a run descheduled for another job's slice still counts only its
 * own work; the core's private caches evicted before each run, as the
 * step's kernels find them), and the step's computation is
 * divided by the share of that speed the process gets now (calib_share:
 * the calibration's fc GEMM in five windows of 40 ms on every rank at
 * once, the median window's rate now over the cached one, the ranks' mean;
 * measured at every start, not cached).
 * Not counted: the embedding's forward and backward, the data loader,
 * logging.
 *
 * The rates come from gptc/calib.h (measured at start, cached).
 * dev/cpu/profile_plan replays one step kernel by kernel beside each
 * phase's prediction, and make bench-plan compares predicted and measured
 * step times over a grid.
 *
 * scripts/tests/runtime_closed_form.py recomputes this model independently from
 * a planted calibration (scripts/tests/test_plan.sh; a test build's
 * test_hook_runtime_error plants a wrong coefficient it must catch).
 *
 * Included by train_gpt.c in section 8 after gptc/calib.h, before
 * gptc/plan.h. Defines: StepTime, CommKnobs, comm_knobs_flat, LevelTraffic,
 * runtime_traffic, runtime_step, runtime_snapshot_ms, young_daly_steps.
 */
#ifndef GPTC_RUNTIME_H
#define GPTC_RUNTIME_H

#include "calib.h" /* Calibration, calibration_get: the measured rates */

/* ---- the model ---------------------------------------------------------- */

typedef struct {
    double gemm, attention, elementwise, softmax; /* per micro-batch, ms */
    double weights;                               /* of gemm: the fixed part (packing the weights, their gradients) */
    double zero_buffers;                          /* per micro-batch, ms: ZeRO-2/3's bucket zeroing and sums into the shard */
    double quant;                                 /* per step, ms: ZeRO++'s quantising and dequantising */
    double optimizer, comm;                       /* per step, ms */
    double idle;                                  /* ms, with a whole core per thread */
    double step;                                  /* ms, at the speed measured now (share) */
    double sent[NUM_LEVELS];                      /* bytes sent per step by level, summed over the ranks */
    int by_level;                                 /* 1: t_comm from the levels' links (header) */
} StepTime;

/* How the ranks share the work: what runtime_step needs beyond B, T, accum. */
typedef struct {
    int world, zero, overlap;  /* ranks, --zero, --overlap */
    int nodes, per_node;       /* the levels: N nodes of K ranks (rank r on node r / K); 1 x W: one node */
    int hierarchical;          /* --hierarchical as resolved (gptc/zero3.h) */
    int qwz, qgz, hpz, block;  /* ZeRO++ on --zero 3 (gptc/zeropp.h); block: --quant-block */
} CommKnobs;

static CommKnobs comm_knobs_flat(int world, int zero, int overlap) {
    CommKnobs k;
    memset(&k, 0, sizeof(k));
    k.world = world, k.zero = zero, k.overlap = overlap;
    k.nodes = 1, k.per_node = world, k.block = 256;
    return k;
}

/* A step's traffic, summed over the ranks, as the trainer's collectives
 * send it and gptc/zero3.h / gptc/zeropp.h count it (runtime_traffic). */
typedef struct {
    double sent[NUM_LEVELS];     /* bytes sent per level (the --comm-levels 1 counters) */
    double bwd[NUM_LEVELS];      /* of which backward's weight gathers (ZeRO-3) */
    double messages[NUM_LEVELS]; /* collectives or pairwise exchanges each rank takes part in, per level */
    double quant[2][2];          /* elements quantised [0] and dequantised [1]; INT8 [.][0], INT4 [.][1] */
    int backward;                /* (the walk is in backward's gathers) */
} LevelTraffic;

/* The level a world collective's latency is paid at: its slowest link. */
static int traffic_world_level(const CommKnobs* k) { return k->nodes > 1 ? LEVEL_INTER : LEVEL_INTRA; }
static int traffic_level(const CommKnobs* k, int r, int q) {
    return r / k->per_node == q / k->per_node ? LEVEL_INTRA : LEVEL_INTER;
}
static void traffic_add(LevelTraffic* t, int e, double bytes) {
    t->sent[e] += bytes;
    if (t->backward) t->bwd[e] += bytes;
}

/* levels_count's direct algorithm: rank r sends each other rank its piece
 * of [a, a + n) (scatter) and/or its own piece (gather). */
static void traffic_flat(const CommKnobs* k, int r, LevelTraffic* t, size_t a, size_t n, size_t piece, int scatter,
                         int gather) {
    size_t mine = levels_piece(a, n, piece, r);
    for (int q = 0; q < k->world; q++)
        if (q != r) traffic_add(t, traffic_level(k, r, q), 4.0 * (double)((scatter ? levels_piece(a, n, piece, q) : 0) +
                                                                         (gather ? mine : 0)));
}

/* ZeRO-3's gather of [a, a + n) by rank r (zero3_gather_start, zeropp_gather): from hpZ's secondary (`secondary`:
 * inside a step, after its first forward), qwZ's slots, or fp32 from every rank (one MPI_Iallgatherv). */
static void traffic_gather(const CommKnobs* k, const Dist* d, int r, LevelTraffic* t, size_t a, size_t n,
                           int secondary) {
    int N = k->nodes, K = k->per_node, j0 = r % K, b = k->qwz == 4;
    if (k->hpz && secondary) {
        if (K < 2) return; /* (one rank a node: its secondary is every weight) */
        traffic_add(t, LEVEL_INTRA, 4.0 * (K - 1) * (double)levels_piece(a, n, (size_t)N * d->shard, j0));
        t->messages[LEVEL_INTRA] += 1;
    } else if (k->qwz) { /* its slot to the N - 1 ranks of its index, then its index's N slots inside the node */
        double bundle = 0.0;
        for (int p = 0; p < N; p++) bundle += (double)quant_slot_bytes(levels_piece(a, n, d->shard, p * K + j0), k->qwz, k->block);
        traffic_add(t, LEVEL_INTER, (N - 1) * (double)quant_slot_bytes(levels_piece(a, n, d->shard, r), k->qwz, k->block));
        traffic_add(t, LEVEL_INTRA, (K - 1) * bundle);
        t->messages[LEVEL_INTER] += N - 1;
        t->messages[LEVEL_INTRA] += K - 1;
        t->quant[0][b] += (double)levels_piece(a, n, d->shard, r);
        t->quant[1][b] += (double)n; /* every slot dequantised, its own too */
    } else {
        traffic_flat(k, r, t, a, n, d->shard, 0, 1);
        t->messages[traffic_world_level(k)] += 1;
    }
}

/* A reduction of [a, a + n) to the shards' owners (dist_reduce_to_owners): qgZ by hops (zeropp_reduce), flat (an
 * MPI_Ireduce per owner), or hierarchical (levels_reduce_to: inside the node, then across, per owner). */
static void traffic_reduce(const CommKnobs* k, const Dist* d, int r, LevelTraffic* t, size_t a, size_t n) {
    int N = k->nodes, K = k->per_node, j0 = r % K, p0 = r / K;
    if (k->zero == 3 && k->qgz) {
        int bits = k->qgz, b = bits == 4;
        double own_index = 0.0; /* floats of the N pieces of this rank's local index */
        for (int p = 0; p < N; p++) own_index += (double)levels_piece(a, n, d->shard, p * K + j0);
        if (K > 1) { /* hop 0: every other index's pieces, quantised, as one bundle to that local rank */
            for (int j = 0; j < K; j++)
                for (int p = 0; p < N && j != j0; p++) {
                    size_t c = levels_piece(a, n, d->shard, p * K + j);
                    traffic_add(t, LEVEL_INTRA, (double)quant_slot_bytes(c, bits, k->block));
                    t->quant[0][b] += (double)c;
                }
            t->messages[LEVEL_INTRA] += K - 1;
            t->quant[1][b] += (K - 1) * own_index;
        }
        if (N > 1) { /* hop 1: each other node's partial sum, quantised once, to its owner */
            for (int p = 0; p < N; p++) {
                size_t c = levels_piece(a, n, d->shard, p * K + j0);
                if (p == p0) continue;
                traffic_add(t, LEVEL_INTER, (double)quant_slot_bytes(c, bits, k->block));
                t->quant[0][b] += (double)c;
            }
            t->messages[LEVEL_INTER] += N - 1;
            t->quant[1][b] += (N - 1) * (double)levels_piece(a, n, d->shard, r);
        }
        return;
    }
    if (!k->hierarchical) traffic_flat(k, r, t, a, n, d->shard, 1, 0);
    for (size_t x = a, end = a + n; x < end;) { /* the owners' pieces */
        int owner = (int)(x / d->shard);
        size_t y = (size_t)(owner + 1) * d->shard < end ? (size_t)(owner + 1) * d->shard : end;
        if (!k->hierarchical) {
            t->messages[traffic_world_level(k)] += 1;
        } else {
            if (K > 1) t->messages[LEVEL_INTRA] += 1;
            if (j0 != owner % K) traffic_add(t, LEVEL_INTRA, 4.0 * (double)(y - x));
            if (j0 == owner % K && N > 1) {
                t->messages[LEVEL_INTER] += 1;
                if (p0 != owner / K) traffic_add(t, LEVEL_INTER, 4.0 * (double)(y - x));
            }
        }
        x = y;
    }
}

/* Plain data parallelism's allreduce of n floats (levels_allreduce): flat, or inside the node, across, inside. */
static void traffic_allreduce(const CommKnobs* k, int r, LevelTraffic* t, size_t n) {
    int N = k->nodes, K = k->per_node, j0 = r % K;
    size_t W = (size_t)k->world;
    if (!k->hierarchical) {
        traffic_flat(k, r, t, 0, n, (n + W - 1) / W, 1, 1);
        t->messages[traffic_world_level(k)] += 1;
        return;
    }
    size_t s = (n + (size_t)K - 1) / (size_t)K, cj = levels_piece(0, n, s, j0);
    for (int i = 0; i < K; i++) {
        size_t c = levels_piece(0, n, s, i);
        if (!c) continue;
        t->messages[LEVEL_INTRA] += 1;
        if (i != j0) traffic_add(t, LEVEL_INTRA, 4.0 * (double)c);
    }
    if (N > 1 && cj) {
        size_t p = (cj + (size_t)N - 1) / (size_t)N, mine = levels_piece(0, cj, p, r / K);
        traffic_add(t, LEVEL_INTER, 4.0 * (double)(cj - mine + mine * (size_t)(N - 1)));
        t->messages[LEVEL_INTER] += 1;
    }
    traffic_add(t, LEVEL_INTRA, 4.0 * (double)(cj * (size_t)(K - 1)));
    t->messages[LEVEL_INTRA] += 1;
}

/* One optimizer step's collectives, in the trainer's order (section 6 of
 * train_gpt.c, gptc/zero3.h, gptc/zeropp.h), for every rank: the traffic
 * summed over the ranks. */
static LevelTraffic runtime_traffic(const CommKnobs* k, const GPT2Config* c, int accum) {
    LevelTraffic t;
    memset(&t, 0, sizeof(t));
    if (k->world < 2) return t;
    Dist d;
    memset(&d, 0, sizeof(d));
    d.world = k->world;
    d.zero = k->zero;
    dist_geometry(&d, c);
    size_t sizes[NUM_PARAMETER_TENSORS], P = parameter_count(c), C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t W = (size_t)k->world, embed;
    parameter_sizes(sizes, c);
    embed = sizes[0] + sizes[1];
    for (int r = 0; r < k->world; r++) {
        int layer_hooks = k->overlap && (k->zero || !k->hierarchical); /* dist_backward_begin */
        if (k->zero == 0) {
            if (layer_hooks) {
                for (size_t l = 0; l < L; l++)
                    for (int q = LAYER_TENSORS_BEGIN; q < LAYER_TENSORS_END; q++) {
                        size_t n = sizes[q] / L;
                        traffic_flat(k, r, &t, 0, n, (n + W - 1) / W, 1, 1);
                        t.messages[traffic_world_level(k)] += 1;
                    }
                traffic_allreduce(k, r, &t, embed);
                traffic_allreduce(k, r, &t, 2 * C);
            } else {
                traffic_allreduce(k, r, &t, P);
            }
            continue;
        }
        int micro = k->zero >= 2 ? accum : layer_hooks ? 1 : 0; /* micro-batches whose layers are reduced in backward */
        for (int m = 0; m < micro; m++) {
            if (k->zero == 3) { /* the forward's gathers: the head's two ranges, every layer; then backward's */
                traffic_gather(k, &d, r, &t, 0, embed, m > 0);
                traffic_gather(k, &d, r, &t, P - 2 * C, 2 * C, m > 0);
                for (int pass = 0; pass < 2; pass++)
                    for (size_t l = 0; l < L; l++)
                        for (int q = LAYER_TENSORS_BEGIN; q < LAYER_TENSORS_END; q++) {
                            t.backward = pass;
                            traffic_gather(k, &d, r, &t, d.offsets[q] + l * (sizes[q] / L), sizes[q] / L, m > 0 || pass);
                        }
                t.backward = 0;
            }
            for (size_t l = 0; l < L; l++)
                for (int q = LAYER_TENSORS_BEGIN; q < LAYER_TENSORS_END; q++)
                    traffic_reduce(k, &d, r, &t, d.offsets[q] + l * (sizes[q] / L), sizes[q] / L);
        }
        if (micro > 0) { /* the head's gradients, once a step (dist_step) */
            traffic_reduce(k, &d, r, &t, 0, embed);
            traffic_reduce(k, &d, r, &t, P - 2 * C, 2 * C);
        } else if (k->hierarchical) { /* ZeRO-1 after backward, by level */
            traffic_reduce(k, &d, r, &t, 0, d.shard * W);
        } else { /* ZeRO-1 after backward: one reduce-scatter */
            traffic_flat(k, r, &t, 0, d.shard * W, d.shard, 1, 0);
            t.messages[traffic_world_level(k)] += 1;
        }
        if (k->zero <= 2) { /* the updated weights to everyone (levels_allgather_params) */
            traffic_flat(k, r, &t, 0, d.shard * W, d.shard, 0, 1);
            t.messages[traffic_world_level(k)] += 1;
        }
    }
    return t;
}

/* The owners a flat range [a, a + n) spans: the MPI_Ireduce calls of its reduction (flat). */
static double runtime_owners(const Dist* d, size_t a, size_t n) {
    return n ? (double)((a + n - 1) / d->shard - a / d->shard + 1) : 0.0;
}

/* ms of matmul_forward (pass 0) or matmul_backward (1) of weight shape s at N rows. */
static double gemm_ms(const Calibration* cal, int pass, int s, double N) {
    return cal->gemm_fixed[pass][s] + cal->gemm_row[pass][s] * N;
}

/* messages * alpha + bytes / rate, ms, for a collective whose measured
 * rate (GB/s of the bytes handed in) is gbs; `now`: the latency measured
 * now (the median call), else the fastest (an idle machine) */
static double comm_ms(const Calibration* cal, double messages, double bytes, double gbs, int now) {
    if (gbs <= 0) return 0.0;
    return messages * (now ? cal->net_alpha_now_us : cal->net_alpha_us) * 1e-3 + bytes / (gbs * 1e6);
}

static StepTime runtime_step(const Calibration* cal, const GPT2Config* c, int B, int T, int accum, const CommKnobs* k) {
    StepTime s;
    memset(&s, 0, sizeof(s));
    int world = k->world, zero = k->zero, overlap = k->overlap;
    double N = (double)B * T, C = c->channels, L = c->num_layers, Vp = c->padded_vocab_size;
    double P = (double)parameter_count(c);
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    Dist d; /* the buffers this rank holds (rank 0: the first shard) */
    memset(&d, 0, sizeof(d));
    d.world = world;
    d.zero = zero;
    dist_geometry(&d, c);
    double f = cal->layer_factor; /* a layer's kernels inside the step: their time alone x f */
    for (int q = 0; q < NUM_SHAPES; q++) {
        double calls = q == SHAPE_HEAD ? 1 : L * f;
        s.gemm += calls * (gemm_ms(cal, 0, q, N) + gemm_ms(cal, 1, q, N));
        s.weights += calls * (cal->gemm_fixed[0][q] + cal->gemm_fixed[1][q]);
    }
    double Tr = (double)T / cal->Tc; /* (T > 128: the T^2 work of longer sequences) */
    s.attention = B * L * f * cal->attn_ms * Tr * Tr;
    s.elementwise = ELEM_BYTES * C * N * L * f / (cal->elem_gbs * 1e6);
    s.softmax = CE_BYTES * N * Vp / (cal->ce_gbs * 1e6);
    double n = (double)(d.hi - d.lo); /* the parameters this rank updates */
    if (zero >= 2) /* each layer's bucket zeroed before backward writes it; the owned half added into the shard */
        s.zero_buffers = (L * d.layer_floats * cal->zero_ns + 2.0 * n * cal->zero_ns) * 1e-6;
    /* the optimizer: gpt2_zero_grad over the gradient buffer, the shard's zeroing (ZeRO), the norm, the clip's
     * scaling (a read and a write), AdamW */
    s.optimizer = ((double)d.grad_alloc * cal->zero_ns + (zero ? d.shard * cal->zero_ns : 0.0) +
                   n * (2.0 * cal->norm_ns + cal->zero_ns + cal->adamw_ns) +
                   (zero == 1 ? 2.0 * n * cal->zero_ns : 0.0)) * 1e-6;
    LevelTraffic tr = runtime_traffic(k, c, accum);
    int mutant = test_hook_runtime_error(); /* (test builds: a planted wrong coefficient; gptc/test_hooks.h) */
    for (int e = 0; e < NUM_LEVELS; e++) s.sent[e] = tr.sent[e];
    for (int b = 0; b < 2; b++) /* ZeRO++'s codec, the ranks' mean */
        s.quant += (tr.quant[0][b] * cal->quant_ns[0][b] + tr.quant[1][b] * cal->quant_ns[1][b]) / world * 1e-6;
    s.by_level = world > 1 && (k->nodes > 1 || k->hierarchical || cal->level_stated || k->qwz || k->qgz || k->hpz) && cal->level_gbs[LEVEL_INTRA] + cal->level_gbs[LEVEL_INTER] > 0;
    double comm[2] = {0.0, 0.0}, comm_met = 0.0; /* [0] idle, [1] now; the meetings' cost on an idle machine */
    for (int now = 0; now < 2 && world > 1; now++) {
        double layer = (double)d.layer_floats, head = (double)d.head_floats, slices = 12 * L;
        double ar = cal->net_gbs, red = cal->reduce_gbs, ag = cal->gather_gbs;
        if (s.by_level) { /* each level: the ranks' mean messages x its latency + mean bytes sent / its link */
            for (int e = 0; e < NUM_LEVELS; e++) {
                double bytes = tr.sent[e] * (mutant == 1 && e == LEVEL_INTER ? 1.25 : 1.0);
                double alpha = cal->level_alpha_us[e] + (now ? cal->net_alpha_now_us - cal->net_alpha_us : 0.0);
                if (cal->level_gbs[e] > 0)
                    comm[now] += (tr.messages[e] * alpha * 1e-3 + bytes / (cal->level_gbs[e] * 1e6)) / world;
            }
            int w = traffic_world_level(k); /* the loss's and the norm's sums (dist_sum) */
            comm[now] += 2.0 * (cal->level_alpha_us[w] + (now ? cal->net_alpha_now_us - cal->net_alpha_us : 0.0)) * 1e-3;
        } else if (zero == 0) {
            comm[now] = comm_ms(cal, overlap ? slices + 2 : 1, 4 * P, ar, now);
        } else if (zero == 1 && !overlap) { /* one reduce-scatter after backward (its own rate, measured at its
                                             * size), then the all-gather */
            comm[now] = comm_ms(cal, 1, 4 * P, cal->rs_gbs > 0 ? cal->rs_gbs : red, now) + comm_ms(cal, 1, 4 * P, ag, now);
        } else if (zero == 3) { /* every micro-batch: 2 + 24 L gathers (the head's two ranges, each layer's 12
                                 * slices in forward and again in backward) of the floats every rank receives,
                                 * the layers' reductions (an MPI_Ireduce per owner piece); the head's once */
            double passes = mutant == 2 ? 1.0 : 2.0; /* (the mutant: backward's gathers left out) */
            double gathers = 2.0 + 12.0 * passes * L, floats = head + passes * L * layer;
            double layer_msgs = 0.0, head_msgs = runtime_owners(&d, 0, d.offsets[2]) +
                                                 runtime_owners(&d, (size_t)(P - 2 * C), (size_t)(2 * C));
            for (int q = LAYER_TENSORS_BEGIN; q < LAYER_TENSORS_END; q++)
                for (int l = 0; l < (int)L; l++) {
                    size_t per = sizes[q] / (size_t)L;
                    layer_msgs += runtime_owners(&d, d.offsets[q] + (size_t)l * per, per);
                }
            comm[now] = accum * (comm_ms(cal, gathers, 4 * floats, ag, now) +
                                 comm_ms(cal, layer_msgs, 4 * layer * L, red, now)) +
                        comm_ms(cal, head_msgs, 4 * head, red, now);
        } else { /* each layer's 12 slices (13 messages: one is split between two owners), then the head's; the
                  * all-gather. ZeRO-1 with overlap reduces the layers once a step, ZeRO-2 every micro-batch */
            comm[now] = (zero == 2 ? accum : 1) * comm_ms(cal, 13 * L, 4 * layer * L, red, now) +
                        comm_ms(cal, 2, 4 * head, red, now) + comm_ms(cal, 1, 4 * P, ag, now);
        }
        if (!s.by_level) comm[now] += comm_ms(cal, 2, 0.0, ar, now); /* the loss's and the norm's sums (dist_sum) */
        /* the meetings with compute between them, each costing what calib_sync measured now (ranks slowed at
         * different moments wait for each other) after CALIB_SYNC_MS of compute, a shorter segment its part of
         * that (the chance that a rank was set back in it): every step's end (the loss's sum); ZeRO-1 and 2 the
         * all-gather after the clip and AdamW of the shard (a segment of s.optimizer); ZeRO-1 with overlap, a
         * wait in every layer's hook; ZeRO-2, a wait for every layer's bucket in every micro-batch; ZeRO-3 that
         * and a wait for every layer's gather, forward and backward, and the head's. On an idle machine too
         * (header): make bench-plan's two-rank rows are mostly low without these terms. */
        double share = now ? (cal->share > 0.05 ? cal->share : 0.05) : 1.0;
        double shard_opt = s.optimizer / share; /* AdamW's segment (now), ms */
        double meetings = 1.0 + (zero == 1 || zero == 2 ? fmin(1.0, shard_opt / CALIB_SYNC_MS) : 0.0) +
                          (zero == 1 && overlap ? L : 0.0) +
                          (zero == 2 ? accum * L : 0.0) +
                          (zero == 3 ? accum * (3.0 * L + 1.0) : 0.0);
        /* at most the time the other rank was not running: a rank waits at a meeting only for its partner's
         * slices lost to other jobs, and each lost slice is waited for once, however many meetings follow it
         * (the step's computation over the share now, less the computation) */
        double compute_idle = accum * (s.gemm + s.attention + s.elementwise + s.softmax + s.zero_buffers) + s.optimizer;
        double met = meetings * cal->sync_ms;
        comm[now] += now ? fmax(comm_met, fmin(met, compute_idle * (1.0 / share - 1.0))) : met;
        if (!now) comm_met = met;
    }
    s.comm = comm[1];
    double compute = accum * (s.gemm + s.attention + s.elementwise + s.softmax + s.zero_buffers) + s.optimizer + s.quant;
    s.idle = compute + comm[0];
    s.step = compute / (cal->share > 0.05 ? cal->share : 0.05) + comm[1]; /* the rates are a whole core's; we get this share now */
    return s;
}
/* ---- snapshots ---------------------------------------------------------- */

/* The cost of one memory snapshot (ms): this rank's slice of weights, m and
 * v (state_bytes) copied into its slot (read + write, at AdamW's streaming
 * bandwidth), and with several ranks sent to the next rank as a replica. */
static double runtime_snapshot_ms(const Calibration* cal, const GPT2Config* c, int world, int zero) {
    double P = (double)parameter_count(c), n = ceil(P / world);
    double bytes = (double)state_bytes((size_t)(zero || world > 1 ? n : P));
    double ms = 2.0 * bytes / (cal->adamw_gbs * 1e6);
    if (world > 1) ms += comm_ms(cal, 1, bytes, cal->reduce_gbs, 1); /* (one message, like a reduce's) */
    return ms;
}

/* Young/Daly: the checkpoint interval that minimises the expected time
 * lost, about sqrt(2 C MTBF) for a checkpoint cost C much smaller than the
 * mean time between failures (Young 1974, "A first order approximation to
 * the optimum checkpoint interval", CACM 17(9); Daly 2006, FGCS 22(3)).
 * In steps of step_ms, at least 1. */
static int young_daly_steps(double snapshot_ms, double mtbf_s, double step_ms, double* interval_s) {
    *interval_s = sqrt(2.0 * snapshot_ms / 1e3 * mtbf_s);
    double steps = *interval_s / (step_ms / 1e3);
    return steps < 1 ? 1 : steps > 1e9 ? 1000000000 : (int)(steps + 0.5);
}

#endif /* GPTC_RUNTIME_H */
