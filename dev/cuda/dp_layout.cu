/*
 * dev/cuda/dp_layout.cu — the data-parallel layout of train_gpt.cu
 * (gptc/cuda/shard.cuh's buckets and shards, and the data-parallel section's
 * use of them), checked on the host: it needs no
 * GPU, so it runs anywhere nvcc does (make dp-layout; make check-cuda runs it).
 *
 *   make dev/cuda/dp_layout && ./dev/cuda/dp_layout
 *
 * For several model shapes and world sizes W, every rank's ShardMap is built
 * as train_gpt_cu builds it, and:
 *   - shard_locate maps the W shards onto the flat parameters one to one
 *     (each parameter held by exactly one (rank, element); the rest is pad),
 *     naming the right tensor and the right index in it;
 *   - gradients written through gpu_layer_grads (the pointers backward uses,
 *     into packed buckets) and through the rest's pointers, then a simulated
 *     reduce-scatter (rank q gets the sum of every rank's q-th piece), land
 *     in the shard where shard_locate says, and the flat pointers of the
 *     plain mode are the slices the allreduce sums (off + l * stride);
 *   - shard_pack_host (start-up) puts each parameter where shard_locate says;
 *   - a simulated all-gather of the shards, unpacked with bucket_unpacking
 *     (the device unpack's table) and with bucket_unpack_host (checkpoints),
 *     gives back the flat parameters exactly.
 * The checker is tested too: a shard map with a piece one DP_ALIGN too short
 * must be rejected. Exit status 0 or 1; the last line is "N passed, N failed".
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu"

static int passed = 0, failed = 0;

static void check(int ok, const char* what) {
    if (ok) passed++;
    else failed++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

/* Each tensor's start in the flat (file-order) parameter buffer. */
static void tensor_offsets(size_t off[NUM_PARAMETER_TENSORS], const size_t* sizes) {
    size_t at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        off[k] = at;
        at += sizes[k];
    }
}

/* Every rank's map of a (sizes, L, W) model; the caller frees. */
static ShardMap* maps_for(const size_t* sizes, int L, int W) {
    ShardMap* m = (ShardMap*)xmalloc(sizeof(ShardMap) * (size_t)W);
    for (int r = 0; r < W; r++) shard_map_init(&m[r], sizes, L, r, W);
    return m;
}

/* shard_locate over all ranks: a bijection onto [0, P) plus pad, with the
 * right tensor and index. Returns 1 if so. */
static int locate_is_bijection(const ShardMap* maps, int W, const size_t* sizes, size_t P, char* why, size_t cap) {
    size_t off[NUM_PARAMETER_TENSORS];
    tensor_offsets(off, sizes);
    unsigned char* seen = (unsigned char*)calloc(P, 1);
    size_t S = shard_map_elements(&maps[0]), pads = 0;
    int ok = 1;
    for (int r = 0; r < W && ok; r++) {
        if (shard_map_elements(&maps[r]) != S) {
            snprintf(why, cap, "rank %d's shard has %zu elements, rank 0's %zu", r, shard_map_elements(&maps[r]), S);
            ok = 0;
        }
        for (size_t j = 0; j < S && ok; j++) {
            int k = -1;
            size_t i = 0;
            long long p = shard_locate(&maps[r], j, &k, &i);
            if (p < 0) {
                pads++;
                continue;
            }
            if ((size_t)p >= P || seen[p] || k < 0 || k >= NUM_PARAMETER_TENSORS || i >= sizes[k] ||
                (size_t)p != off[k] + i) {
                snprintf(why, cap, "rank %d element %zu -> parameter %lld (tensor %d, index %zu): %s", r, j, p, k, i,
                         (size_t)p < P && seen[p] ? "held twice" : "wrong place");
                ok = 0;
            }
            if (ok) seen[p] = 1;
        }
    }
    for (size_t p = 0; p < P && ok; p++)
        if (!seen[p]) {
            snprintf(why, cap, "parameter %zu is held by no rank", p);
            ok = 0;
        }
    if (ok && pads != S * (size_t)W - P) {
        snprintf(why, cap, "%zu pad elements, expected %zu", pads, S * (size_t)W - P);
        ok = 0;
    }
    free(seen);
    return ok;
}

static void test_shape(int L, int C, int maxT, int V, int W) {
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.num_layers = L;
    c.channels = C;
    c.num_heads = 1;
    c.max_seq_len = maxT;
    c.vocab_size = V;
    c.padded_vocab_size = round_up(V, 128);
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, &c);
    size_t P = parameter_count(&c);
    char what[1024], why[512] = "";
    ShardMap* maps = maps_for(sizes, L, W);
    size_t S = shard_map_elements(&maps[0]);

    int ok = locate_is_bijection(maps, W, sizes, P, why, sizeof(why));
    snprintf(what, sizeof(what), "L=%d C=%d W=%d: shard_locate is one to one onto the %zu parameters (%zu pad)%s%s", L,
             C, W, P, S * W - P, ok ? "" : ": ", ok ? "" : why);
    check(ok, what);

    /* gradients as backward writes them: rank r's value of parameter p is p + 1000 r */
    size_t bucket_floats = (size_t)W * (L * maps[0].layer.piece + maps[0].rest.piece);
    float** packed = (float**)xmalloc(sizeof(float*) * (size_t)W);
    float* flat = xmalloc_floats(P);
    int pointers_ok = 1;
    for (int r = 0; r < W; r++) {
        packed[r] = xmalloc_floats(bucket_floats);
        memset(packed[r], 0, bucket_floats * sizeof(float));
        float** bucket = (float**)xmalloc(sizeof(float*) * (size_t)(L + 1));
        for (int b = 0; b <= L; b++) bucket[b] = packed[r] + (size_t)W * shard_map_offset(&maps[r], b); /* ZeRO-1 */
        GpuGPT2 g;
        memset(&g, 0, sizeof(g));
        g.config = c;
        memcpy(g.param_sizes, sizes, sizeof(sizes));
        g.num_parameters = P;
        /* the plain mode first: flat pointers must be the slices dp_reduce_bucket sums */
        parameters_point(&g.grads, flat, &c);
        for (int l = 0; l < L && pointers_ok; l++) {
            ParameterTensors lg = gpu_layer_grads(&g, l);
            const BucketShape* s = &maps[r].layer;
            for (int k = 0; k < s->nseg; k++)
                if (((float**)&lg)[s->k[k]] != flat + s->off[k] + (size_t)l * s->stride[k]) pointers_ok = 0;
        }
        /* ZeRO: what dp_init sets up */
        g.grad_buckets = bucket;
        memset(&g.grads, 0, sizeof(g.grads));
        const BucketShape* rest = &maps[r].rest;
        for (int k = 0; k < rest->nseg; k++) ((float**)&g.grads)[rest->k[k]] = bucket[L] + rest->pre[k];
        size_t off[NUM_PARAMETER_TENSORS];
        tensor_offsets(off, sizes);
        for (int l = 0; l < L; l++) {
            ParameterTensors lg = gpu_layer_grads(&g, l);
            for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
                size_t per = sizes[k] / L;
                float* dst = ((float**)&lg)[k];
                for (size_t i = 0; i < per; i++) dst[i] = (float)(off[k] + l * per + i) + 1000.0f * r;
            }
        }
        for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
            if (k >= LAYER_TENSORS_BEGIN && k < LAYER_TENSORS_END) continue;
            float* dst = ((float**)&g.grads)[k];
            for (size_t i = 0; i < sizes[k]; i++) dst[i] = (float)(off[k] + i) + 1000.0f * r;
        }
        free(bucket);
    }
    snprintf(what, sizeof(what), "L=%d C=%d W=%d: gpu_layer_grads' flat pointers are the slices plain mode reduces", L,
             C, W);
    check(pointers_ok, what);
    /* reduce-scatter, simulated: rank q's piece of bucket b = sum over r of r's q-th piece */
    int rs_ok = 1;
    for (int q = 0; q < W && rs_ok; q++) {
        for (size_t j = 0; j < S && rs_ok; j++) {
            size_t b = j < (size_t)L * maps[q].layer.piece ? j / maps[q].layer.piece : (size_t)L;
            const BucketShape* s = shard_map_bucket(&maps[q], (int)b);
            size_t t = j - shard_map_offset(&maps[q], (int)b);
            double sum = 0.0;
            for (int r = 0; r < W; r++) sum += packed[r][(size_t)W * shard_map_offset(&maps[q], (int)b) + q * s->piece + t];
            int k;
            size_t i;
            long long p = shard_locate(&maps[q], j, &k, &i);
            double want = p < 0 ? 0.0 : W * (double)p + 1000.0 * W * (W - 1) / 2;
            if (fabs(sum - want) > 1e-6 * (fabs(want) + 1.0)) {
                snprintf(why, sizeof(why), "rank %d element %zu: %g, expected %g", q, j, sum, want);
                rs_ok = 0;
            }
        }
    }
    snprintf(what, sizeof(what), "L=%d C=%d W=%d: a reduce-scatter of the packed buckets gives each shard its "
             "parameters' sums%s%s", L, C, W, rs_ok ? "" : ": ", rs_ok ? "" : why);
    check(rs_ok, what);

    /* start-up packing, then all-gather + unpack back to the flat parameters */
    float* params = xmalloc_floats(P);
    for (size_t p = 0; p < P; p++) params[p] = 0.25f * (float)p - 3.0f;
    float** shards = (float**)xmalloc(sizeof(float*) * (size_t)W);
    int pack_ok = 1;
    for (int r = 0; r < W; r++) {
        shards[r] = xmalloc_floats(S);
        for (int b = 0; b <= L; b++) shard_pack_host(shards[r] + shard_map_offset(&maps[r], b), params, &maps[r], b, r);
        for (size_t j = 0; j < S && pack_ok; j++) {
            int k;
            size_t i;
            long long p = shard_locate(&maps[r], j, &k, &i);
            if (shards[r][j] != (p < 0 ? 0.0f : params[p])) pack_ok = 0;
        }
    }
    snprintf(what, sizeof(what), "L=%d C=%d W=%d: shard_pack_host puts each parameter where shard_locate says", L, C, W);
    check(pack_ok, what);
    float* back_dev = xmalloc_floats(P); /* through bucket_unpacking's table (what segments_copy_kernel does) */
    float* back_host = xmalloc_floats(P); /* through bucket_unpack_host */
    for (size_t p = 0; p < P; p++) back_dev[p] = back_host[p] = NAN;
    int pad_ok = 1;
    for (int b = 0; b <= L; b++) {
        const BucketShape* s = shard_map_bucket(&maps[0], b);
        float* gathered = xmalloc_floats(s->piece * W);
        for (int r = 0; r < W; r++) memcpy(gathered + r * s->piece, shards[r] + shard_map_offset(&maps[r], b), s->piece * sizeof(float));
        for (size_t t = s->pre[s->nseg]; t < s->piece * W; t++) pad_ok &= gathered[t] == 0.0f;
        SegmentCopy sc = bucket_unpacking(s, b < L ? (size_t)b : 0);
        for (int k = 0; k < sc.nseg; k++)
            for (size_t i = 0; i < sc.n[k]; i++) back_dev[sc.dst[k] + i] = gathered[sc.src[k] + i];
        bucket_unpack_host(back_host, gathered, &maps[0], b);
        free(gathered);
    }
    snprintf(what, sizeof(what), "L=%d C=%d W=%d: all-gather + unpack rebuilds the weights (device table and host)%s",
             L, C, W, pad_ok ? "" : "; the pad is not zero");
    check(pad_ok && !memcmp(back_dev, params, P * sizeof(float)) && !memcmp(back_host, params, P * sizeof(float)), what);

    for (int r = 0; r < W; r++) {
        free(packed[r]);
        free(shards[r]);
    }
    free(packed);
    free(shards);
    free(flat);
    free(params);
    free(back_dev);
    free(back_host);
    free(maps);
}

/* The checker must reject a layout whose pieces do not cover the bucket. */
static void test_the_tester(void) {
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.num_layers = 2;
    c.channels = 64;
    c.num_heads = 1;
    c.max_seq_len = 16;
    c.vocab_size = 300;
    c.padded_vocab_size = round_up(300, 128);
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, &c);
    int W = 4;
    ShardMap* maps = maps_for(sizes, c.num_layers, W);
    for (int r = 0; r < W; r++) maps[r].layer.piece -= DP_ALIGN; /* planted: too short for the layer buckets */
    char why[512] = "";
    check(!locate_is_bijection(maps, W, sizes, parameter_count(&c), why, sizeof(why)),
          "the checker rejects pieces too short to cover the buckets");
    free(maps);
}

int main(void) {
    test_the_tester();
    static const int shapes[][4] = {{1, 8, 4, 10}, {2, 64, 16, 300}, {3, 24, 8, 37}, {4, 96, 64, 1000}};
    static const int worlds[] = {1, 2, 3, 5, 8};
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
        for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++)
            test_shape(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], worlds[w]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
