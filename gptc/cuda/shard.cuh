/*
 * gptc/cuda/shard.cuh — the data-parallel layout on the GPU: buckets (one
 * per layer, one for the rest), each rank's shard of them (ZeRO), the
 * packing between flat parameters and buckets, AdamW and the bf16 rounding
 * over a shard, and the unpacking copy of a gathered bucket.
 *
 * Included by train_gpt.cu (its data-parallel section calls it) and, through
 * train_gpt.cu, dev/cuda/dp_layout.cu; after train_gpt.c
 * (NUM_PARAMETER_TENSORS, LAYER_TENSORS_BEGIN/END) and gptc/cuda/common.cuh.
 * Defines: DP_MAX_SEGMENTS, DP_ALIGN, NUM_LAYER_TENSORS, BucketShape,
 * ShardMap, shard_map_init, shard_map_bucket, shard_map_offset,
 * shard_map_elements, shard_locate, shard_pack_host, bucket_unpack_host,
 * adamw_shard_kernel, shard_round_kernel, accumulate_kernel, SegmentCopy,
 * segments_copy_kernel, bucket_unpacking, segments_copy_gpu.
 */
#ifndef GPTC_CUDA_SHARD_CUH
#define GPTC_CUDA_SHARD_CUH

#include "gptc/cuda/common.cuh" // floatX, Pack8, ceil_div, KERNEL_CHECK
#include "gptc/cuda/adamw.cuh"  // clip_coef, adamw_element, hash_u32, bf16_round_stochastic

/* ---- the data-parallel layout: buckets, shards, packing ----------------- */
/* Data parallelism (train_gpt.cu's data-parallel section) moves gradients and weights in buckets, each holding
 * the parameters whose gradients backward finishes at one moment: bucket
 * l < L is layer l's 12 tensor slices (ln1w .. fcprojb), bucket L "the rest"
 * (wte, wpe, lnfw, lnfb: final only when backward ends, because wte gets
 * gradients at both ends of it). In a bucket's packed order its slices lie
 * back to back in file order (as in train_gpt.c's layer_grads), followed by
 * zeros up to a multiple of W x DP_ALIGN. A reduce-scatter of a bucket hands
 * rank r the r-th of W equal pieces; under ZeRO rank r's shard is its piece
 * of every bucket, in bucket order (layer 0 .. L-1, then the rest). The pad
 * absorbs the remainder, so any W works. One description of a bucket's shape
 * serves every user: the gradient pointers backward writes through, the
 * AdamW kernel's map from shard element to parameter, the unpacking of the
 * gathered weights, the gathering of the master weights for checkpoints. */
#define DP_MAX_SEGMENTS 12
#define DP_ALIGN 64 /* pieces are multiples of 64 elements: 256-byte aligned in fp32, 128 in bf16 */
#define NUM_LAYER_TENSORS (LAYER_TENSORS_END - LAYER_TENSORS_BEGIN)
static_assert(NUM_LAYER_TENSORS <= DP_MAX_SEGMENTS && NUM_PARAMETER_TENSORS - NUM_LAYER_TENSORS <= DP_MAX_SEGMENTS,
              "a bucket's slices must fit DP_MAX_SEGMENTS");

typedef struct {
    int nseg;                        /* tensor slices in the bucket: 12 for a layer, 4 for the rest */
    int k[DP_MAX_SEGMENTS];          /* the parameter tensor of each slice */
    size_t pre[DP_MAX_SEGMENTS + 1]; /* packed start of each slice; pre[nseg] = the real elements */
    size_t off[DP_MAX_SEGMENTS];     /* that tensor's start in the flat (file-order) buffer */
    size_t stride[DP_MAX_SEGMENTS];  /* layer l's slice is at off + l * stride of the tensor (rest: 0) */
    size_t piece;                    /* padded length / W: each rank's part */
} BucketShape;

typedef struct {
    BucketShape layer, rest; /* every layer bucket has the same shape */
    int num_layers, rank, world;
} ShardMap;

static void shard_map_init(ShardMap* m, const size_t sizes[NUM_PARAMETER_TENSORS], int num_layers, int rank,
                           int world) {
    memset(m, 0, sizeof(*m));
    m->num_layers = num_layers;
    m->rank = rank;
    m->world = world;
    size_t offset = 0, unit = (size_t)world * DP_ALIGN;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        int in_layer = k >= LAYER_TENSORS_BEGIN && k < LAYER_TENSORS_END;
        BucketShape* s = in_layer ? &m->layer : &m->rest;
        size_t n = in_layer ? sizes[k] / (size_t)num_layers : sizes[k];
        s->k[s->nseg] = k;
        s->off[s->nseg] = offset;
        s->stride[s->nseg] = in_layer ? n : 0;
        s->pre[s->nseg + 1] = s->pre[s->nseg] + n;
        s->nseg++;
        offset += sizes[k];
    }
    m->layer.piece = (m->layer.pre[m->layer.nseg] + unit - 1) / unit * DP_ALIGN;
    m->rest.piece = (m->rest.pre[m->rest.nseg] + unit - 1) / unit * DP_ALIGN;
}

/* Bucket b's shape (b = L: the rest), and where its piece sits in a shard. */
__host__ __device__ static const BucketShape* shard_map_bucket(const ShardMap* m, int b) {
    return b < m->num_layers ? &m->layer : &m->rest;
}
static size_t shard_map_offset(const ShardMap* m, int b) { return (size_t)b * m->layer.piece; }
/* Elements in a shard (the same on every rank), and in all padded buckets. */
static size_t shard_map_elements(const ShardMap* m) { return shard_map_offset(m, m->num_layers) + m->rest.piece; }

/* Element j of this rank's shard: the flat offset of the parameter it holds,
 * or -1 for padding; *k is its tensor and *i its index in that tensor. */
__host__ __device__ static long long shard_locate(const ShardMap* m, size_t j, int* k, size_t* i) {
    size_t layers = (size_t)m->num_layers * m->layer.piece;
    size_t l = j < layers ? j / m->layer.piece : 0;
    const BucketShape* s = j < layers ? &m->layer : &m->rest;
    size_t q = (size_t)m->rank * s->piece + (j < layers ? j - l * s->piece : j - layers); /* place in the packed bucket */
    if (q >= s->pre[s->nseg]) return -1;
    int g = 0;
    while (q >= s->pre[g + 1]) g++;
    *k = s->k[g];
    *i = l * s->stride[g] + (q - s->pre[g]);
    return (long long)(s->off[g] + *i);
}

/* Host side, for start-up and checkpoints. Rank r's piece of bucket b out
 * of the flat parameters: shard (piece) = the slices' parts that fall in
 * [r piece, (r+1) piece) of the packed bucket, zeros for the pad. */
static void shard_pack_host(float* shard, const float* flat, const ShardMap* m, int b, int r) {
    const BucketShape* s = shard_map_bucket(m, b);
    size_t l = b < m->num_layers ? (size_t)b : 0, lo = (size_t)r * s->piece, hi = lo + s->piece;
    memset(shard, 0, s->piece * sizeof(float));
    for (int g = 0; g < s->nseg; g++) {
        size_t a = s->pre[g] > lo ? s->pre[g] : lo, e = s->pre[g + 1] < hi ? s->pre[g + 1] : hi;
        if (a < e) memcpy(shard + (a - lo), flat + s->off[g] + l * s->stride[g] + (a - s->pre[g]), (e - a) * sizeof(float));
    }
}

/* A whole packed bucket (every rank's piece, gathered) back into the flat parameters. */
static void bucket_unpack_host(float* flat, const float* packed, const ShardMap* m, int b) {
    const BucketShape* s = shard_map_bucket(m, b);
    size_t l = b < m->num_layers ? (size_t)b : 0;
    for (int g = 0; g < s->nseg; g++)
        memcpy(flat + s->off[g] + l * s->stride[g], packed + s->pre[g], (s->pre[g + 1] - s->pre[g]) * sizeof(float));
}

/* AdamW over this rank's shard (ZeRO): as adamw_kernel, with each element's
 * tensor (weight decay: bit k of decay_mask) and index in it (the rounding's
 * random bits, the same as adamw_kernel's for that parameter) found through
 * the map; the global norm comes from the host. The pad stays 0. */
__global__ void adamw_shard_kernel(floatX* param, float* master, const float* grad, float* m, float* v, size_t n,
                                   const ShardMap* map, float lr, float b1, float b2, float bc1, float bc2, float eps,
                                   float weight_decay, unsigned decay_mask, float norm, float max_norm, uint32_t seed) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int k;
    size_t i;
    if (shard_locate(map, j, &k, &i) < 0) {
        param[j] = __float2bfloat16_rn(0.0f);
        return;
    }
    float wd = (decay_mask >> k) & 1u ? weight_decay : 0.0f;
    float g = grad[j] * clip_coef(norm, max_norm);
    float p = adamw_element(master[j], g, &m[j], &v[j], lr, b1, b2, bc1, bc2, eps, wd);
    master[j] = p;
    param[j] = bf16_round_stochastic(p, hash_u32((uint32_t)i ^ hash_u32(seed * 16u + (uint32_t)k)));
}

/* The shard's bf16 weights from its master, rounded as adamw_shard_kernel
 * rounds them under `seed` (stochastic 1: a resumed or rolled-back run gets
 * the very bf16 weights that update wrote), or to nearest (stochastic 0:
 * fresh weights, as gpu_model_init); the pad 0. The all-gather spreads them. */
__global__ void shard_round_kernel(floatX* param, const float* master, size_t n, const ShardMap* map, int stochastic,
                                   uint32_t seed) {
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    int k;
    size_t i;
    if (shard_locate(map, j, &k, &i) < 0) param[j] = __float2bfloat16_rn(0.0f);
    else if (stochastic)
        param[j] = bf16_round_stochastic(master[j], hash_u32((uint32_t)i ^ hash_u32(seed * 16u + (uint32_t)k)));
    else param[j] = __float2bfloat16_rn(master[j]);
}

/* dst(n) += src(n): ZeRO-2 adds each micro-batch's reduced piece into the shard. */
__global__ void accumulate_kernel(float* dst, const float* src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i];
}

/* Unpacking a bucket: dst[dst_s + i] = src[src_s + i] for i < n_s, one
 * slice s per blockIdx.y; 8 bf16 at a time when every offset and length is
 * a multiple of 8. */
typedef struct {
    int nseg, vec;
    size_t src[DP_MAX_SEGMENTS], dst[DP_MAX_SEGMENTS], n[DP_MAX_SEGMENTS];
} SegmentCopy;

__global__ void segments_copy_kernel(floatX* dst, const floatX* src, SegmentCopy sc) {
    int s = blockIdx.y;
    size_t n = sc.vec ? sc.n[s] / 8 : sc.n[s];
    const floatX* from = src + sc.src[s];
    floatX* to = dst + sc.dst[s];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (sc.vec) ((Pack8*)to)[i] = ((const Pack8*)from)[i];
        else to[i] = from[i];
    }
}

/* Layer l's bucket (or the rest, l = 0 with the rest's shape): packed -> flat. */
static SegmentCopy bucket_unpacking(const BucketShape* s, size_t l) {
    SegmentCopy c;
    memset(&c, 0, sizeof(c));
    c.nseg = s->nseg;
    c.vec = 1;
    for (int g = 0; g < s->nseg; g++) {
        c.src[g] = s->pre[g];
        c.dst[g] = s->off[g] + l * s->stride[g];
        c.n[g] = s->pre[g + 1] - s->pre[g];
        if (c.src[g] % 8 || c.dst[g] % 8 || c.n[g] % 8) c.vec = 0;
    }
    return c;
}

static void segments_copy_gpu(floatX* dst, const floatX* src, const SegmentCopy* sc, cudaStream_t s) {
    size_t most = 0;
    for (int g = 0; g < sc->nseg; g++) most = sc->n[g] > most ? sc->n[g] : most;
    long long blocks = ceil_div((long long)(sc->vec ? most / 8 : most), 256);
    dim3 grid((unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks), (unsigned)sc->nseg);
    segments_copy_kernel<<<grid, 256, 0, s>>>(dst, src, *sc);
    KERNEL_CHECK();
}

#endif /* GPTC_CUDA_SHARD_CUH */
