/*
 * gptc/quant.h — the quantised collectives of ZeRO++ (Wang et al., arXiv
 * 2306.10209) and of its port to Frontier (Xu et al., arXiv 2501.04266),
 * as building blocks over MPI communicators: block quantisation of fp32 to
 * INT8 and INT4, qwZ (a weight all-gather in INT8 blocks), qgZ (a gradient
 * reduce-scatter in INT4 or INT8 blocks by all-to-all, level by level, with
 * optional error feedback), hpZ (a secondary weight partition inside a
 * node, gathered without leaving it), and the bytes each rank sends at
 * each level. Tested by dev/quant/test_quant.c (make test-quant).
 *
 * Included by dev/quant/test_quant.c; meant for train_gpt.c's data-parallel
 * section (--zero 3 with qwZ/hpZ/qgZ), which includes it after its own
 * MPI_CHECK. The quantisation needs only gptc/util.h; the collectives are
 * compiled with -DUSE_MPI. The GPU's kernels for the same format are in
 * train_gpt.cu (quant_scale_kernel, quant_code_kernel; not run on a GPU).
 * Defines: QUANT_MAX_LEVELS, quant_qmax, quant_num_blocks,
 * quant_payload_bytes, quant_slot_bytes, quant_scale_of, quant_encode,
 * quant_decode, quant_decode_add, quant_error_bound; with USE_MPI:
 * QuantTopo, quant_topo_split, quant_topo_from_comms, quant_topo_free,
 * quant_level_bytes, qwz_allgather, qgz_residual_floats,
 * qgz_reduce_scatter, hpz_secondary_from_full, hpz_allgather.
 *
 * ---- The quantisation (one fp32 scale per block of `block` elements) ----
 * Symmetric: q = round(x / s), |q| <= qmax = 127 (INT8) or 7 (INT4); the
 * codes -128 and -8 are never produced. For a block with m = max|x|:
 *   s = fl(m / qmax); when that is subnormal (or 0: m is a tiny denormal)
 *       it is raised an ulp at a time until qmax*s >= m, and when qmax*s
 *       would overflow to Inf in fp32 (m near FLT_MAX) it is lowered an
 *       ulp. Either way m/s < qmax + 1/2, so no x is ever clamped.
 *   q = x / s in double, rounded to the nearest integer, ties to even
 *       (nearbyint in the default rounding mode).
 *   deq = (float)q * s, one fp32 rounding.
 * What it guarantees, per element, with s the stored scale:
 *   |x - q*s| <= s/2 exactly (q*s the real number): x/s in double is off
 *       the true x/s by at most 128 * 2^-53 = 2^-46, while a quotient of
 *       two floats that is not a half-integer (and is above 1/4) is at
 *       least 2^-28 away from one, so the rounding picks the integer
 *       nearest the true x/s (an exact half is exact in double too: ties
 *       go to even, as a multiplication by 1/s would not promise);
 *   |x - deq| <= s * (1/2 + qmax * 2^-24) (quant_error_bound): the fp32
 *       product adds at most half an ulp of |q*s| <= qmax*s (nothing when
 *       q*s is subnormal).
 *   When s is normal it is m/qmax to within 2^-22 relative, so the bound
 *   is m/(2 qmax) up to 1e-5 relative: m/254 for INT8, m/14 for INT4;
 *   a subnormal s is at most one denormal (2^-149) above m/qmax.
 * Special blocks: all zeros (or -0): s = 0, q = 0, deq = +0 exactly. Any
 * NaN or +-Inf in a block: s = NaN and q = 0, so every element of that
 * block dequantises to NaN — a non-finite gradient or weight is never made
 * finite, and the trainer's NaN guard still sees it. Denormals are kept
 * (no flush to zero): a block of denormals quantises to within s/2 of
 * itself like any other, s itself possibly denormal.
 * INT4 packing: element i of a slot's payload is the nibble (q & 0xF) of
 * byte i/2, the low nibble for even i, two's complement; a slot of odd
 * length leaves the last high nibble 0. INT4 needs an even block, so no
 * byte is shared by two blocks (the blocks are encoded in parallel).
 *
 * ---- Slots: what travels ----
 * A shard of `shard` floats quantises into one slot: its ceil(shard/block)
 * scales (fp32) then its payload (shard bytes for INT8, ceil(shard/2) for
 * INT4) padded to a multiple of 4 bytes, so that the scales of the next
 * slot stay aligned:
 *   slot(shard) = 4*ceil(shard/block) + 4*ceil(payload/4)   bytes.
 * Blocks restart at each shard's first element, so every shard quantises
 * on its own, wherever it is sent.
 *
 * ---- Levels ----
 * A QuantTopo is k levels of communicators, level 0 the innermost (the
 * fastest link: the two dies of a GPU, or the GPUs of a node), level k-1
 * the outermost (the network). Level i has P_i ranks; this rank is r_i in
 * it; W = P_0 * ... * P_{k-1}. The rank's shard index is
 *   index = r_0 + P_0*(r_1 + P_1*(r_2 + ...))    (innermost fastest),
 * which is its world rank when the levels are split from the world by
 * rank / P_0 and so on (quant_topo_split does this; with two levels that is
 * node = rank / L, local = rank % L: the emulated 2x2 of the tests). A
 * flat buffer of W*shard floats holds shard s at s*shard.
 * Write R_i = P_{i+1} * ... * P_{k-1} (R_{k-1} = 1): the shards that cross
 * level i per peer.
 *
 * ---- qwZ: all-gather in INT8 (or INT4) blocks ----
 * Each rank quantises its shard into one slot; the slots are all-gathered
 * outermost level first (a ring within each level: the network carries one
 * slot per peer, the faster levels the bundles), and every slot is
 * dequantised into the full buffer on arrival. Every rank ends with the
 * same full buffer, equal bit for bit to deq(q(shard s)) at every s.
 * Bytes sent per rank at level i:  (P_i - 1) * R_i * slot(shard).
 * (Summed over levels: (W - 1) * slot, what a flat ring sends.)
 *
 * ---- qgZ: reduce-scatter in INT4/INT8 blocks, one all-to-all per level ----
 * Hop i = 0 (innermost) .. k-1. Before hop i a rank holds fp32 partial
 * sums of R_{i-1} shards (R_{-1} = W: its whole gradient at hop 0): those
 * whose digits below level i are its own. It quantises each of them (once:
 * the running sum is quantised once per hop, never at each step of a ring),
 * sends to each level-i peer the R_i shards whose level-i digit is that
 * peer's, receives theirs, and dequantises and sums them in fp32 (in peer
 * order 0..P_i-1, the rank's own slot quantised like the others). After
 * the last hop it holds the sum over all W ranks of its own shard, in
 * fp32. With two levels (intra-node L, inter-node N) this is ZeRO++'s
 * hierarchical all-to-all: within the node on N shards per peer, then
 * across nodes on one shard per peer, with the slices ordered so that the
 * result lands on the shard's owner (the paper's tensor slice reordering).
 * Bytes sent per rank at level i:  (P_i - 1) * R_i * slot(shard) (the same
 * formula as qwZ's; the network carries (N - 1) slots of about shard/2
 * bytes in INT4, where an fp32 ring reduce-scatter over all W ranks sends
 * (W - 1) * 4 * shard bytes).
 * Error, per element of the result, bounded hop by hop (dev/quant/
 * test_quant.c computes this from the inputs alone and checks it): each
 * hop adds, for each of the W / (P_0...P_{i-1}) partial sums it quantises,
 * that block's s*(1/2 + qmax*2^-24), where s <= (M/qmax)(1 + 2^-22) +
 * 2^-149 and M bounds the block's |partial sum| (the inputs' block maxima
 * plus the errors so far); the fp32 sums add at most (P_i - 1)*2^-24 of the
 * sum of the magnitudes they add.
 * Error feedback (residual != NULL): at hop i the rank adds its residual
 * to the values it quantises and keeps what the quantisation lost
 * (v - deq(q(v))) for the next call. Over K calls the results then sum to
 * the true sum minus the last call's residuals (the errors telescope), so
 * the sum of applied gradients stays within one step's quantisation error
 * of the sum of true ones instead of drifting. A block that was not finite
 * leaves a residual of 0 (the step will be skipped; its NaN must not
 * poison the next). Residual floats: shard * (R_{-1} + R_0 + ... +
 * R_{k-2}) = W*shard + ... (qgz_residual_floats), zeroed by the caller.
 *
 * ---- hpZ: a secondary weight partition inside a node ----
 * A node of L ranks (its communicator's rank l = index mod L: the node is
 * the innermost levels) keeps the whole model in L secondary shards: rank
 * l keeps the N = W/L primary shards a*L + l (a = 0..N-1), in that order.
 * hpz_secondary_from_full cuts it from the full weights the forward's
 * all-gather produced (no communication; refresh it after each update's
 * first gather), and hpz_allgather rebuilds the full weights for the
 * backward from the node only.
 * Bytes sent per rank: node level (L - 1) * N * shard * 4, other levels 0.
 *
 * Plugging it in (the shard layout is the trainer's ZeRO one: a bucket of
 * W*shard floats, padded, shard s owned by the rank whose index is s):
 *   QuantTopo t; MPI_Comm lv[2] = {node, across};   // across: same node rank, one per node
 *   quant_topo_from_comms(&t, 2, lv); ALWAYS(t.index == world_rank);
 *   qwz_allgather(&t, my_shard, shard, 8, block, bucket);            // forward
 *   hpz_secondary_from_full(node, bucket, shard, W, secondary);       // once per update
 *   hpz_allgather(node, secondary, shard, W, bucket, &t.sent[0]);     // backward
 *   qgz_reduce_scatter(&t, grads, shard, 4, block, residual, grad_shard);
 * The calls allocate their buffers (about 2x the bucket) each time, and
 * block: no overlap with compute is offered yet.
 *
 * All communication is MPI_Sendrecv between pairs (a ring for all-gathers,
 * a pairwise exchange for all-to-all), so the byte counters count what this
 * rank hands to MPI to send, never its copy to itself; each call's bytes
 * are added to topo->sent[level].
 */
#ifndef GPTC_QUANT_H
#define GPTC_QUANT_H

#include "util.h" /* first: it sets _GNU_SOURCE before any system header */
#include <float.h>
#include <limits.h>

#define QUANT_MAX_LEVELS 4

/* the largest code: 127 for INT8, 7 for INT4 */
static inline int quant_qmax(int bits) {
    ALWAYS(bits == 8 || bits == 4);
    return bits == 8 ? 127 : 7;
}

static inline size_t quant_num_blocks(size_t n, int block) { return (n + (size_t)block - 1) / (size_t)block; }

/* codes of n elements, in bytes */
static inline size_t quant_payload_bytes(size_t n, int bits) { return bits == 8 ? n : (n + 1) / 2; }

/* one slot: the scales, then the payload padded to 4 bytes (header comment) */
static inline size_t quant_slot_bytes(size_t n, int bits, int block) {
    return 4 * quant_num_blocks(n, block) + (quant_payload_bytes(n, bits) + 3) / 4 * 4;
}

/* |x - deq| <= this, for every element of a block of stored scale s */
static inline double quant_error_bound(float s, int bits) {
    return (double)s * (0.5 + quant_qmax(bits) * 0x1p-24);
}

static void quant_check_format(int bits, int block) {
    CHECK(bits == 8 || bits == 4, "quantisation to %d bits: only INT8 and INT4 exist here (pass 8 or 4)", bits);
    CHECK(block > 0 && (bits == 8 || block % 2 == 0),
          "quantisation block of %d elements: it must be positive, and even for INT4 (two codes a byte)", block);
}

/* The scale of a block whose largest |element| is m (header comment): NaN
 * if an element is NaN or Inf, 0 if all are zero, else fl(m/qmax), raised
 * while subnormal and short of m, lowered while qmax*s overflows. */
static float quant_scale_of(float m, int nonfinite, int qmax) {
    if (nonfinite) return NAN;
    if (m == 0.0f) return 0.0f;
    float s = m / (float)qmax;
    if (s < FLT_MIN) /* subnormal, or 0 (underflow): up to the first s with qmax*s >= m, a few steps */
        while ((double)s * qmax < (double)m) s = nextafterf(s, INFINITY);
    while (isinf((float)qmax * s)) s = nextafterf(s, 0.0f); /* m near FLT_MAX: one step */
    return s;
}

/* the code of element i of a payload */
static inline int quant_get(const uint8_t* payload, size_t i, int bits) {
    if (bits == 8) return (int)(int8_t)payload[i];
    return (((payload[i >> 1] >> ((i & 1) * 4)) & 0xF) ^ 8) - 8; /* the nibble, sign-extended */
}

/* Quantise x (n floats) in blocks: scales (ceil(n/block)) and payload
 * (quant_payload_bytes). With residual (n floats, or NULL): error feedback,
 * v = x + residual is quantised and residual becomes v - deq (0 in a block
 * that is not finite). */
static void quant_encode(const float* x, float* residual, size_t n, int bits, int block, float* scales,
                         uint8_t* payload) {
    quant_check_format(bits, block);
    int qmax = quant_qmax(bits);
    size_t nb = quant_num_blocks(n, block);
#pragma omp parallel for schedule(static) if (nb > 16)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        float m = 0.0f;
        int nonfinite = 0;
        for (size_t i = lo; i < hi; i++) {
            float a = fabsf(residual ? x[i] + residual[i] : x[i]);
            nonfinite |= !(a <= FLT_MAX); /* NaN compares false, Inf is above */
            m = a > m ? a : m;
        }
        float s = quant_scale_of(m, nonfinite, qmax);
        scales[b] = s;
        if (!(s > 0.0f)) { /* 0 or NaN: every code 0; the residual 0 (v was all zeros, or not finite) */
            if (bits == 8) memset(payload + lo, 0, hi - lo);
            else memset(payload + lo / 2, 0, (hi - lo + 1) / 2);
            if (residual) memset(residual + lo, 0, (hi - lo) * sizeof(float));
            continue;
        }
        ALWAYS((double)m / s < qmax + 0.5); /* so no code is ever clamped */
        double sd = (double)s; /* x / sd in double: within 2^-46 of x / s, the same nearest integer */
        if (bits == 8) {
            for (size_t i = lo; i < hi; i++) {
                float v = residual ? x[i] + residual[i] : x[i];
                int q = (int)nearbyint((double)v / sd);
                payload[i] = (uint8_t)(int8_t)q;
                if (residual) residual[i] = v - (float)q * s;
            }
        } else {
            for (size_t i = lo; i < hi; i += 2) { /* two codes a byte, the low nibble first (blocks are even) */
                int odd = i + 1 < hi;
                float v0 = residual ? x[i] + residual[i] : x[i];
                float v1 = odd ? (residual ? x[i + 1] + residual[i + 1] : x[i + 1]) : 0.0f;
                int q0 = (int)nearbyint((double)v0 / sd), q1 = (int)nearbyint((double)v1 / sd);
                payload[i >> 1] = (uint8_t)((q0 & 0xF) | ((q1 & 0xF) << 4));
                if (residual) {
                    residual[i] = v0 - (float)q0 * s;
                    if (odd) residual[i + 1] = v1 - (float)q1 * s;
                }
            }
        }
    }
}

/* out (n floats) = the dequantised blocks; with add, out += them instead */
static void quant_decode_impl(const float* scales, const uint8_t* payload, size_t n, int bits, int block,
                              float* out, int add) {
    quant_check_format(bits, block);
    size_t nb = quant_num_blocks(n, block);
#pragma omp parallel for schedule(static) if (nb > 16)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * (size_t)block, hi = lo + (size_t)block < n ? lo + (size_t)block : n;
        float s = scales[b]; /* 0 * NaN = NaN: a non-finite block stays so */
        if (bits == 8) {
            for (size_t i = lo; i < hi; i++) {
                float d = (float)(int8_t)payload[i] * s;
                out[i] = add ? out[i] + d : d;
            }
        } else {
            for (size_t i = lo; i < hi; i += 2) {
                int byte = payload[i >> 1];
                float d0 = (float)(((byte & 0xF) ^ 8) - 8) * s; /* sign-extend the nibble */
                out[i] = add ? out[i] + d0 : d0;
                if (i + 1 < hi) {
                    float d1 = (float)(((byte >> 4) ^ 8) - 8) * s;
                    out[i + 1] = add ? out[i + 1] + d1 : d1;
                }
            }
        }
    }
}
MAYBE_UNUSED static void quant_decode(const float* scales, const uint8_t* payload, size_t n, int bits, int block, float* out) {
    quant_decode_impl(scales, payload, n, bits, block, out, 0);
}
MAYBE_UNUSED static void quant_decode_add(const float* scales, const uint8_t* payload, size_t n, int bits, int block,
                             float* out) {
    quant_decode_impl(scales, payload, n, bits, block, out, 1);
}

/* a slot (quant_slot_bytes) <-> n floats */
static void quant_slot_encode(const float* x, float* residual, size_t n, int bits, int block, uint8_t* slot) {
    size_t at = 4 * quant_num_blocks(n, block), used = quant_payload_bytes(n, bits);
    memset(slot + at + used / 4 * 4, 0, quant_slot_bytes(n, bits, block) - at - used / 4 * 4); /* the padding */
    quant_encode(x, residual, n, bits, block, (float*)(void*)slot, slot + at);
}
static void quant_slot_decode(const uint8_t* slot, size_t n, int bits, int block, float* out, int add) {
    quant_decode_impl((const float*)(const void*)slot, slot + 4 * quant_num_blocks(n, block), n, bits, block,
                      out, add);
}

#ifdef USE_MPI
#include <mpi.h>

typedef struct {
    int levels;                       /* k, 1..QUANT_MAX_LEVELS */
    MPI_Comm comm[QUANT_MAX_LEVELS];  /* level 0 innermost (fastest link) .. k-1 outermost */
    int size[QUANT_MAX_LEVELS];       /* P_i */
    int rank[QUANT_MAX_LEVELS];       /* r_i */
    int world;                        /* W = prod P_i */
    int index;                        /* this rank's shard: r_0 + P_0 (r_1 + P_1 (...)) */
    int owns_comms;                   /* made by quant_topo_split: freed by quant_topo_free */
    uint64_t sent[QUANT_MAX_LEVELS];  /* bytes this rank handed to MPI to send at each level, all calls */
} QuantTopo;

static void quant_topo_fill(QuantTopo* t) {
    t->world = 1;
    t->index = 0;
    for (int i = t->levels - 1; i >= 0; i--) {
        MPI_CHECK(MPI_Comm_size(t->comm[i], &t->size[i]));
        MPI_CHECK(MPI_Comm_rank(t->comm[i], &t->rank[i]));
        t->index = t->index * t->size[i] + t->rank[i];
        t->world *= t->size[i];
    }
    memset(t->sent, 0, sizeof(t->sent));
}

/* Adopt the caller's communicators (not freed here), innermost first. The
 * caller orders them so that index (above) is the shard this rank owns. */
MAYBE_UNUSED static void quant_topo_from_comms(QuantTopo* t, int levels, const MPI_Comm* comms) {
    CHECK(levels >= 1 && levels <= QUANT_MAX_LEVELS, "%d levels: 1 to %d are supported", levels, QUANT_MAX_LEVELS);
    memset(t, 0, sizeof(*t));
    t->levels = levels;
    for (int i = 0; i < levels; i++) t->comm[i] = comms[i];
    quant_topo_fill(t);
}

/* Split `world` into levels of the given sizes, innermost first (e.g. {2, 2}:
 * two nodes of two; {2, 4, N}: Frontier's dies, GPUs, nodes): level i groups
 * the ranks that agree on every digit but the i-th of rank = r_0 + P_0 (r_1 +
 * ...), so index == the rank in `world`. */
MAYBE_UNUSED static void quant_topo_split(QuantTopo* t, MPI_Comm world, int levels, const int* sizes) {
    int rank, W, prod = 1;
    MPI_CHECK(MPI_Comm_rank(world, &rank));
    MPI_CHECK(MPI_Comm_size(world, &W));
    CHECK(levels >= 1 && levels <= QUANT_MAX_LEVELS, "%d levels: 1 to %d are supported", levels, QUANT_MAX_LEVELS);
    for (int i = 0; i < levels; i++) prod *= sizes[i];
    CHECK(prod == W, "levels of %d ranks in all for a communicator of %d: the sizes must multiply to the ranks", prod, W);
    memset(t, 0, sizeof(*t));
    t->levels = levels;
    int stride = 1;
    for (int i = 0; i < levels; i++) {
        int digit = rank / stride % sizes[i];
        int color = rank - digit * stride; /* the rank with this digit zeroed: the same for the whole group */
        MPI_CHECK(MPI_Comm_split(world, color, rank, &t->comm[i]));
        stride *= sizes[i];
    }
    t->owns_comms = 1;
    quant_topo_fill(t);
    ALWAYS(t->index == rank);
}

MAYBE_UNUSED static void quant_topo_free(QuantTopo* t) {
    if (t->owns_comms)
        for (int i = 0; i < t->levels; i++) MPI_CHECK(MPI_Comm_free(&t->comm[i]));
    memset(t, 0, sizeof(*t));
}

/* R_i: shards that cross level i per peer (R_{-1} = W) */
static size_t quant_level_span(const QuantTopo* t, int i) {
    size_t r = 1;
    for (int j = i + 1; j < t->levels; j++) r *= (size_t)t->size[j];
    return r;
}

/* bytes a rank sends at level i in qwz_allgather and qgz_reduce_scatter */
MAYBE_UNUSED static uint64_t quant_level_bytes(const QuantTopo* t, int i, size_t shard, int bits, int block) {
    return (uint64_t)(t->size[i] - 1) * quant_level_span(t, i) * quant_slot_bytes(shard, bits, block);
}

static int quant_int_count(size_t bytes) {
    CHECK(bytes <= (size_t)INT_MAX, "one message of %zu bytes: MPI counts are int; split the buffer into buckets", bytes);
    return (int)bytes;
}

/* Ring all-gather over comm: block q (bb bytes) at buf + q*bb comes from
 * rank q; this rank's block is in place. Adds the bytes sent to *sent. */
static void quant_ring_allgather(MPI_Comm comm, uint8_t* buf, size_t bb, uint64_t* sent) {
    int P, r;
    MPI_CHECK(MPI_Comm_size(comm, &P));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    int count = quant_int_count(bb), right = (r + 1) % P, left = (r + P - 1) % P;
    for (int t = 0; t + 1 < P; t++) {
        int out = (r - t + P) % P, in = (r - t - 1 + 2 * P) % P; /* pass on what came from the left last step */
        MPI_CHECK(MPI_Sendrecv(buf + (size_t)out * bb, count, MPI_BYTE, right, 0, buf + (size_t)in * bb, count,
                               MPI_BYTE, left, 0, comm, MPI_STATUS_IGNORE));
        *sent += bb;
    }
}

/* Pairwise all-to-all over comm: block q of send (bb bytes) goes to rank q,
 * block q of recv comes from rank q; this rank's own block is copied. */
static void quant_alltoall(MPI_Comm comm, const uint8_t* send, uint8_t* recv, size_t bb, uint64_t* sent) {
    int P, r;
    MPI_CHECK(MPI_Comm_size(comm, &P));
    MPI_CHECK(MPI_Comm_rank(comm, &r));
    int count = quant_int_count(bb);
    memcpy(recv + (size_t)r * bb, send + (size_t)r * bb, bb);
    for (int t = 1; t < P; t++) {
        int to = (r + t) % P, from = (r - t + P) % P;
        MPI_CHECK(MPI_Sendrecv(send + (size_t)to * bb, count, MPI_BYTE, to, 1, recv + (size_t)from * bb, count,
                               MPI_BYTE, from, 1, comm, MPI_STATUS_IGNORE));
        *sent += bb;
    }
}

/* the shard index of position pos in the level order used on the wire
 * (outermost digit fastest: pos = sum r_i R_i) */
static size_t quant_pos_to_shard(const QuantTopo* t, size_t pos) {
    size_t s = 0, stride = 1;
    for (int i = 0; i < t->levels; i++) {
        size_t R = quant_level_span(t, i);
        s += (pos / R % (size_t)t->size[i]) * stride;
        stride *= (size_t)t->size[i];
    }
    return s;
}

/* qwZ: every rank's shard (shard floats each) quantised, all-gathered over
 * the levels (outermost first) and dequantised into full (W * shard floats,
 * shard s at s*shard). Header comment: bytes, exactness. */
MAYBE_UNUSED static void qwz_allgather(QuantTopo* t, const float* mine, size_t shard, int bits, int block, float* full) {
    size_t sb = quant_slot_bytes(shard, bits, block), W = (size_t)t->world;
    uint8_t* slots = (uint8_t*)xmalloc(W * sb); /* (W slots) in level order */
    size_t at = 0; /* where this rank's slots begin: the digits fixed so far */
    for (int i = 0; i < t->levels; i++) at += (size_t)t->rank[i] * quant_level_span(t, i);
    quant_slot_encode(mine, NULL, shard, bits, block, slots + at * sb);
    for (int i = t->levels - 1; i >= 0; i--) {
        /* held: the R_i slots with this rank's digits below and at i, all above: contiguous */
        size_t R = quant_level_span(t, i), base = at - (size_t)t->rank[i] * R;
        quant_ring_allgather(t->comm[i], slots + base * sb, R * sb, &t->sent[i]);
        at = base; /* the digits below i stay this rank's */
    }
#pragma omp parallel for schedule(static) if (W > 1)
    for (size_t pos = 0; pos < W; pos++)
        quant_slot_decode(slots + pos * sb, shard, bits, block, full + quant_pos_to_shard(t, pos) * shard, 0);
    free(slots);
}

/* floats of qgZ's error-feedback residual: shard * (R_{-1} + R_0 + ... + R_{k-2}) */
MAYBE_UNUSED static size_t qgz_residual_floats(const QuantTopo* t, size_t shard) {
    size_t n = (size_t)t->world;
    for (int i = 0; i + 1 < t->levels; i++) n += quant_level_span(t, i);
    return n * shard;
}

/* qgZ: grad (W * shard floats, this rank's full gradient) reduced over all
 * ranks, this rank's shard (index t->index) of the sum into out (shard
 * floats). residual: qgz_residual_floats of error feedback, or NULL.
 * Header comment: hops, bytes, error bound. */
MAYBE_UNUSED static void qgz_reduce_scatter(QuantTopo* t, const float* grad, size_t shard, int bits, int block, float* residual,
                               float* out) {
    size_t sb = quant_slot_bytes(shard, bits, block), W = (size_t)t->world;
    float* cur = (float*)xmalloc(W * shard * sizeof(float));  /* partial sums held, in level order */
    float* next = (float*)xmalloc(W * shard * sizeof(float));
    uint8_t* send = (uint8_t*)xmalloc(W * sb);
    uint8_t* recv = (uint8_t*)xmalloc(W * sb);
    /* hop 0 holds everything: the gradient in level order (the slice reordering) */
#pragma omp parallel for schedule(static) if (W > 1)
    for (size_t pos = 0; pos < W; pos++)
        memcpy(cur + pos * shard, grad + quant_pos_to_shard(t, pos) * shard, shard * sizeof(float));
    size_t held = W;
    for (int i = 0; i < t->levels; i++) {
        size_t R = quant_level_span(t, i); /* per peer; held == P_i * R */
        ALWAYS(held == (size_t)t->size[i] * R);
        for (size_t p = 0; p < held; p++)
            quant_slot_encode(cur + p * shard, residual ? residual + p * shard : NULL, shard, bits, block,
                              send + p * sb);
        if (residual) residual += held * shard;
        quant_alltoall(t->comm[i], send, recv, R * sb, &t->sent[i]);
        /* next[j] = sum over peers q of their slot j for this rank, in fp32, peer order */
        for (int q = 0; q < t->size[i]; q++)
            for (size_t j = 0; j < R; j++)
                quant_slot_decode(recv + ((size_t)q * R + j) * sb, shard, bits, block, next + j * shard, q > 0);
        float* swap = cur;
        cur = next;
        next = swap;
        held = R;
    }
    ALWAYS(held == 1);
    memcpy(out, cur, shard * sizeof(float));
    free(cur);
    free(next);
    free(send);
    free(recv);
}

/* hpZ: the secondary shard of this node rank (node: L ranks, rank l =
 * index mod L): the N = W/L shards a*L + l of full (W * shard floats), in
 * order of a, into secondary (N * shard floats). No communication. */
MAYBE_UNUSED static void hpz_secondary_from_full(MPI_Comm node, const float* full, size_t shard, int world, float* secondary) {
    int L, l;
    MPI_CHECK(MPI_Comm_size(node, &L));
    MPI_CHECK(MPI_Comm_rank(node, &l));
    CHECK(world % L == 0, "a node of %d ranks in a world of %d: nodes must all have the same size", L, world);
    for (int a = 0; a < world / L; a++)
        memcpy(secondary + (size_t)a * shard, full + ((size_t)a * L + l) * shard, shard * sizeof(float));
}

/* hpZ: the full weights (W * shard floats) from the node's secondary shards,
 * over the node communicator only; bytes sent added to *sent. */
MAYBE_UNUSED static void hpz_allgather(MPI_Comm node, const float* secondary, size_t shard, int world, float* full,
                          uint64_t* sent) {
    int L, l;
    MPI_CHECK(MPI_Comm_size(node, &L));
    MPI_CHECK(MPI_Comm_rank(node, &l));
    CHECK(world % L == 0, "a node of %d ranks in a world of %d: nodes must all have the same size", L, world);
    size_t N = (size_t)(world / L), bb = N * shard * sizeof(float);
    float* buf = (float*)xmalloc((size_t)world * shard * sizeof(float)); /* (L, N, shard): node rank p's secondary at p */
    memcpy(buf + (size_t)l * N * shard, secondary, bb);
    quant_ring_allgather(node, (uint8_t*)buf, bb, sent);
    for (int p = 0; p < L; p++)
        for (size_t a = 0; a < N; a++)
            memcpy(full + (a * (size_t)L + (size_t)p) * shard, buf + ((size_t)p * N + a) * shard, shard * sizeof(float));
    free(buf);
}
#endif /* USE_MPI */
#endif /* GPTC_QUANT_H */
