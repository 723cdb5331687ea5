/*
 * gptc/calib.h — the calibration: the rates gptc/runtime.h's model of a
 * step divides its work by, measured on this machine at start (well under
 * a second) and cached per machine: each GEMM shape's fixed and per-row
 * time, attention, the elementwise and cross-entropy bandwidths, the
 * optimizer's, ZeRO++'s codec, the collectives' latency and rates (per
 * level with several nodes), the ranks' meetings, and the share of a core
 * the process gets now.
 *
 * Calibration runs in a child process (fork, before the parent starts any
 * OpenMP thread), so its buffers never count in the parent's peak memory
 * (the memory plan's VmHWM check); the MPI pings run in every rank at once.
 * With several ranks every rank's child measures while every other rank
 * computes (each keeps its core busy until all have measured), and every
 * rank takes the figures of the rank whose layer probe was slowest
 * (calib_slowest): a step waits for its slowest rank.
 * The compute is cached in a text file (the first line names the format,
 * CALIB_FORMAT; a file of another version is replaced):
 * <--output-dir>/calibration.txt when there is one, else
 * $XDG_CACHE_HOME/gptc/calibration.txt (~/.cache/...), one line per key:
 * CPU model, threads, ranks, the binary (its size and mtime), and the shape
 * measured (C, NH, Vp, Tc). GPTC_CALIBRATE=1 measures again.
 *
 * Included by train_gpt.c in section 8 before gptc/runtime.h (after
 * gptc/zero3.h and gptc/zeropp.h: Levels, gptc/quant.h). Defines:
 * ELEM_BYTES, CE_BYTES, the GEMM shapes (SHAPE_*, gemm_shape), Calibration,
 * calibration_get (measure or load, then the network, the levels and the
 * share now), calibration_print, and the steps: calib_compute,
 * calib_layer_factor, calib_network, calib_levels, calib_sync, calib_share,
 * calib_slowest, the cache (calib_key, calib_path, calib_load, calib_save).
 */
#ifndef GPTC_CALIB_H
#define GPTC_CALIB_H

#include <poll.h>
#include <sys/wait.h>
#include "util.h"

#define ELEM_BYTES 152.0 /* per token per layer, / C: LN fwd 2 x 8, residual 2 x 12, GELU 32 + 48, LN bwd 2 x 16 */
#define CE_BYTES 28.0    /* per logit: forward max, exp, sum, scale (20), backward scale (8) */
#define CALIB_FORMAT "gptc calibration v4"
#define CALIB_FORMAT_ANY "gptc calibration v" /* (an older version's file is replaced, not appended to) */
#define CALIB_SYNC_MS 2.0 /* the compute segment between calib_sync's meetings, ms now */

/* The five weight shapes of the model's GEMMs, (K, OC): the layers' qkv
 * (C, 3C), attproj (C, C), fc (C, 4C), fcproj (4C, C), and the classifier
 * (C, Vp). */
enum { SHAPE_QKV, SHAPE_ATTPROJ, SHAPE_FC, SHAPE_FCPROJ, SHAPE_HEAD, NUM_SHAPES };
static void gemm_shape(int C, int Vp, int shape, int* K, int* OC) {
    static const int k4[NUM_SHAPES] = {1, 1, 1, 4, 1}, oc4[NUM_SHAPES] = {3, 1, 4, 1, 0};
    *K = k4[shape] * C;
    *OC = shape == SHAPE_HEAD ? Vp : oc4[shape] * C;
}

typedef struct {
    int C, NH, Vp, Tc;                /* the shape it was measured at */
    double rows[2];                   /* the GEMMs' row counts N measured */
    /* per weight shape, forward [0] and backward [1] (matmul_forward, matmul_backward as the trainer calls them):
     * ms = fixed + per_row * N (packing the weight, accumulating its gradient; then every row's work) */
    double gemm_fixed[2][NUM_SHAPES], gemm_row[2][NUM_SHAPES];
    double attn_ms;                   /* attention_forward + backward of one (T = Tc) sequence, all heads */
    double elem_gbs;                  /* GB/s of the LayerNorm/residual/GELU mix */
    double ce_gbs;                    /* GB/s of the cross-entropy forward + backward */
    double zero_ns, norm_ns, adamw_ns; /* per float: zeroing the gradients, their squared norm, AdamW */
    double adamw_gbs;                 /* AdamW's streaming rate (28 bytes a parameter), for the snapshots */
    double share_gflops;              /* the fc GEMM forward at rows[1], for calib_share */
    double net_alpha_us, net_gbs;     /* MPI_Allreduce: latency (the fastest call); GB/s handed in (W > 1) */
    double reduce_gbs, gather_gbs;    /* MPI_Ireduce to one root, MPI_Allgather: GB/s handed in / gathered */
    double net_alpha_now_us;          /* latency, the median call: the ranks' wait for each other now (load) */
    double rs_gbs, rs_floats;         /* MPI_Reduce_scatter_block of ZeRO-1's padded buffer (at most 2^21 floats): GB/s */
    double sync_ms;                   /* a meeting of the ranks amid compute, beyond the transfer, now (calib_sync) */
    double quant_ns[2][2];            /* gptc/quant.h per element: [0] quant_slot_encode, [1] quant_slot_decode; INT8, INT4 */
    double layer_factor;              /* a layer inside the step over its kernels alone (calib_layer_factor) */
    double level_alpha_us[NUM_LEVELS]; /* per level (intra-node, inter-node): latency of its communicator (fastest) */
    double level_gbs[NUM_LEVELS];     /* and its link rate: GB/s a rank sends (gptc/zero3.h's counting); 0 = none */
    int level_stated;                 /* --link-gbs gave level_gbs (else measured at this start) */
    double ms;                        /* how long the measurement took */
    double share;                     /* the share of the calibrated speed this process gets now (every start) */
    int cached;                       /* read from the cache file */
    int discarded;                    /* the cache held an implausible line for this key: calib_save drops it */
    char key[600];
    char path[4400];
} Calibration;

/* ---- measuring ---------------------------------------------------------- */

#ifdef USE_MPI
/* A collective's time (ms): the fastest of five calls (the machine is
 * shared, and a call that meets another job is slower, never faster), the
 * ranks met (MPI_Barrier, not timed) before each, as the step's
 * collectives start after a sum or a wait that met the ranks. Back to
 * back, a call's time on one rank excludes what its partner did ahead of
 * it in the previous call, so back-to-back calls read faster than the
 * step's collectives run. */
#define CALIB_TIME3_MET(out_ms, body)                                \
    do {                                                             \
        (out_ms) = 1e30;                                             \
        for (int r_ = 0; r_ < 5; r_++) {                             \
            MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));                  \
            double t0_ = time_ms();                                  \
            body;                                                    \
            double t_ = time_ms() - t0_;                             \
            if (t_ < (out_ms)) (out_ms) = t_;                        \
        }                                                            \
    } while (0)
#endif
/* The CPU time this process has had (ms): with one thread, a kernel's run
 * less the slices the scheduler gave other jobs meanwhile. */
static double calib_cpu_ms(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}
/* Before each run of a compute kernel: the core's private caches filled
 * with other data (a pass over 4 MB, 4 x this machine's L2 of 1 MB), as the
 * step leaves them: there every kernel's weights and activations were last
 * touched several kernels ago and come from L3 or memory; run after run on
 * the same buffers, the calibration found them in L1/L2 and measured the
 * layers' GEMMs 10-20% and attention 16-30% faster than the replayed step
 * (dev/cpu/profile_plan, fastest of 9). */
#define CALIB_JUNK_FLOATS ((size_t)1 << 20) /* 4 MB */
static float* calib_junk = NULL;              /* (calib_compute's, while it runs) */
static void calib_evict(void) {
    if (!calib_junk) return;
    for (size_t i = 0; i < CALIB_JUNK_FLOATS; i++) calib_junk[i] = (float)i;
}
/* The same for the compute kernels, within a time budget: at least three
 * runs, at most five, stopping once 40 ms went to this measurement (the
 * classifier's GEMMs of a GPT-2 vocabulary are tens of ms each). With one
 * thread a run counts its CPU time when that is less than its wall time: on
 * the 2 shared cores a run of a few ms is often descheduled for another
 * job's slice (4-10 ms), so even the fastest of 3-5 wall times could be 1.5-2
 * x the kernel's (the classifier's 320-row GEMM at C=64: 7.5 ms instead of
 * 4.1, seen at load 2.4; its two-point fit then fell back to all per row).
 * Several threads: wall time (their CPU time also counts their waits). */
#define CALIB_TIME(out_ms, body)                                     \
    do {                                                             \
        (out_ms) = 1e30;                                             \
        double spent_ = 0.0;                                         \
        for (int r_ = 0; r_ < 5 && (r_ < 3 || spent_ < 40.0); r_++) { \
            double t_;                                               \
            CALIB_ONCE(t_, spent_, body);                            \
            if (t_ < (out_ms)) (out_ms) = t_;                        \
        }                                                            \
    } while (0)
/* One such run: its ms (CPU time when less, one thread) into t, its wall
 * time added to spent. */
#define CALIB_ONCE(t, spent, body)                                   \
    do {                                                             \
        int cpu_ = num_threads() == 1;                               \
        calib_evict();                                               \
        double t0_ = time_ms(), c0_ = cpu_ ? calib_cpu_ms() : 0.0;   \
        body;                                                        \
        (t) = time_ms() - t0_;                                       \
        (spent) += (t);                                              \
        if (cpu_) (t) = fmin((t), calib_cpu_ms() - c0_);             \
    } while (0)

static float* calib_floats(size_t n, float value) {
    float* p = xmalloc_floats(n);
    for (size_t i = 0; i < n; i++) p[i] = value * (float)((i * 2654435761u) % 1000) / 1000.0f;
    return p;
}

/* The GEMM rows measured: 16, and as many as keep one pass over the five
 * shapes (forward and backward) near 0.6 GFLOP, 48 to 512, a multiple of 8. */
static void calib_gemm_rows(int C, int Vp, double rows[2]) {
    double per_row = 0.0; /* FLOPs of one row through the five shapes, forward (2) and backward (4) */
    for (int s = 0; s < NUM_SHAPES; s++) {
        int K, OC;
        gemm_shape(C, Vp, s, &K, &OC);
        per_row += 6.0 * K * OC;
    }
    double top = 0.6e9 / per_row;
    rows[0] = 16;
    rows[1] = top >= 512 ? 512 : top < 48 ? 48 : 8 * floor(top / 8);
}

/* A layer's kernels as measured alone (ms at the probe's N = B Tc rows):
 * its four GEMMs forward and backward, attention, the elementwise mix. */
static double calib_layer_kernels_ms(const Calibration* cal, double N, int B) {
    double kernels = B * cal->attn_ms + ELEM_BYTES * cal->C * N / (cal->elem_gbs * 1e6);
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < SHAPE_HEAD; q++) kernels += cal->gemm_fixed[pass][q] + cal->gemm_row[pass][q] * N;
    return kernels;
}

/* A layer inside the step against its kernels measured alone: the
 * trainer's own gpt2_forward + gpt2_backward of 1 and of 2 layers of
 * this width (B = rows[1] / Tc sequences of Tc tokens, a
 * vocabulary of 128: the classifier is measured alone above), the fastest
 * of 3-7 steps each, the two in turn (a slow spell of the VM then
 * slows both, not one); a layer is the difference, over what the
 * kernels' rates predict for it (its four GEMMs forward and backward,
 * attention, the elementwise mix). runtime_step scales those terms by it.
 * Why: inside the step a layer's GEMMs and attention run slower than
 * alone, even with each kernel's caches evicted before it is timed
 * (dev/cpu/profile_plan shows it phase by phase). The factor carries the
 * calibration's own noise too: f times the kernels' prediction is the
 * probe's layer exactly at its N, and elsewhere scales as the kernels do.
 * Held to 0.8-1.6 (a factor outside is noise, not the machine). Cost: 3
 * layer steps x 3-7, and one 2-layer model's weights, gradients and
 * activations faulted in (~0.2-0.3 s at C=768 here). */
static double calib_layer_factor(const Calibration* cal) {
    int B = (int)cal->rows[1] / cal->Tc > 1 ? (int)cal->rows[1] / cal->Tc : 1, T = cal->Tc;
    double N = (double)B * T, ms[2] = {1e30, 1e30}, spent = 0.0;
    int* tokens = (int*)xmalloc(sizeof(int) * (size_t)N);
    for (int i = 0; i < (int)N; i++) tokens[i] = (int)((i * 2654435761u) % 128u);
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.max_seq_len = T;
    c.vocab_size = c.padded_vocab_size = 128;
    c.num_layers = 2;
    c.num_heads = cal->NH;
    c.channels = cal->C;
    GPT2 m; /* one model of 2 layers, run as 1 (num_layers = 1: its first layer, whose slices start at offset 0 of
             * every buffer) and as 2: one model's memory to fault in, not two */
    gpt2_init_random(&m, &c, 1337);
    m.grads_memory = ledger_floats(MEM_GRADIENTS, m.num_parameters); /* (so gpt2_alloc_training makes no AdamW state:
                                                                     * none is used here) */
    m.num_grads = m.num_parameters;
    parameters_point(&m.grads, m.grads_memory, &m.config);
    gpt2_alloc_training(&m, B, T);
    gpt2_forward(&m, tokens, tokens, B, T); /* pages touched */
    gpt2_backward(&m, 1.0f);
    for (int r = 0; r < 7 && (r < 3 || spent < 100.0); r++)
        for (int k = 0; k < 2; k++) {
            double t;
            m.config.num_layers = 1 + k;
            CALIB_ONCE(t, spent, { gpt2_forward(&m, tokens, tokens, B, T); gpt2_backward(&m, 1.0f); });
            ms[k] = fmin(ms[k], t);
        }
    m.config.num_layers = 2;
    gpt2_free(&m);
    free(tokens);
    double layer = ms[1] - ms[0], f = layer / calib_layer_kernels_ms(cal, N, B);
    return f > 1.6 ? 1.6 : f > 0.8 ? f : 0.8; /* (NaN: 0.8) */
}

/* The compute rates, measured with the trainer's own kernels at the shape;
 * `in_place`: also calib_layer_factor (its models' memory counts in the
 * allocation ledger: only in calib_compute_forked's child), else 1. */
static void calib_compute(Calibration* cal, int in_place) {
    double t0 = time_ms(), ms;
    int C = cal->C, NH = cal->NH, Vp = cal->Vp, T = cal->Tc;
    calib_junk = xmalloc_floats(CALIB_JUNK_FLOATS);
    /* every GEMM shape, forward and backward, at two row counts: the time is
     * affine in the rows (the weight is packed once a call, each row adds the
     * same work), so two points give its fixed part and its part per row */
    calib_gemm_rows(C, Vp, cal->rows);
    int Nmax = (int)cal->rows[1], OCmax = Vp > 4 * C ? Vp : 4 * C;
    size_t wmax = (size_t)C * OCmax;
    float* inp = calib_floats((size_t)Nmax * 4 * C, 1.0f);
    float* w = calib_floats(wmax, 0.02f);
    float* bias = calib_floats((size_t)OCmax, 0.1f);
    float* out = calib_floats((size_t)Nmax * OCmax, 0.01f);
    float* dinp = calib_floats((size_t)Nmax * 4 * C, 0.0f);
    float* dw = calib_floats(wmax, 0.0f);
    float* db = calib_floats((size_t)OCmax, 0.0f);
    matmul_forward(out, inp, w, bias, 16, C, 4 * C); /* warm-up: threads started */
    for (int s = 0; s < NUM_SHAPES; s++) {
        int K, OC;
        gemm_shape(C, Vp, s, &K, &OC);
        float* b = s == SHAPE_HEAD ? NULL : bias; /* the classifier has none */
        float* dbias = s == SHAPE_HEAD ? NULL : db;
        double t[2][2];
        for (int i = 0; i < 2; i++) {
            int N = (int)cal->rows[i];
            CALIB_TIME(t[0][i], matmul_forward(out, inp, w, b, N, K, OC));
            CALIB_TIME(t[1][i], matmul_backward(dinp, dw, dbias, out, inp, w, N, K, OC, 0));
        }
        for (int pass = 0; pass < 2; pass++) {
            double per_row = (t[pass][1] - t[pass][0]) / (cal->rows[1] - cal->rows[0]);
            double fixed = t[pass][0] - per_row * cal->rows[0];
            if (per_row <= 0.0 || fixed < 0.0) { /* noise: all of it per row */
                fixed = 0.0;
                per_row = t[pass][1] / cal->rows[1];
            }
            cal->gemm_fixed[pass][s] = fixed;
            cal->gemm_row[pass][s] = per_row;
        }
        if (s == SHAPE_FC) { /* calib_share's reference: the same GEMM back to back, its data in the caches, as
                              * calib_share runs it */
            float* junk = calib_junk;
            calib_junk = NULL;
            CALIB_TIME(ms, matmul_forward(out, inp, w, b, Nmax, K, OC));
            calib_junk = junk;
            cal->share_gflops = 2.0 * Nmax * K * OC / (ms * 1e6);
        }
    }
    free(inp); free(w); free(bias); free(out); free(dinp); free(dw); free(db);
    /* attention over two sequences of Tc tokens (the second one's data
     * comes from further away, as the batch's do), per sequence */
    int Ba = 2;
    float* qkv = calib_floats((size_t)Ba * T * 3 * C, 0.5f);
    float* att = calib_floats((size_t)Ba * NH * T * T, 0.0f);
    float* datt = calib_floats((size_t)Ba * NH * T * T, 0.0f);
    float* y = calib_floats((size_t)Ba * T * C, 0.0f);
    float* dqkv = calib_floats((size_t)Ba * T * 3 * C, 0.0f);
    CALIB_TIME(ms, { attention_forward(y, att, qkv, Ba, T, C, NH); attention_backward(dqkv, datt, y, qkv, att, Ba, T, C, NH); });
    cal->attn_ms = ms / Ba;
    free(qkv); free(att); free(datt); free(y); free(dqkv);
    /* the memory-bound mix of one layer at N rows */
    size_t N = 256, NC = N * (size_t)C;
    float* x = calib_floats(NC, 1.0f);
    float* ln = calib_floats(NC, 0.0f);
    float* r = calib_floats(NC, 0.0f);
    float* d = calib_floats(NC, 0.1f);
    float* h = calib_floats(4 * NC, 1.0f);
    float* hg = calib_floats(4 * NC, 0.0f);
    float* lw = calib_floats((size_t)C, 1.0f);
    float* lb = calib_floats((size_t)C, 0.0f);
    float* dlw = calib_floats((size_t)C, 0.0f);
    float* dlb = calib_floats((size_t)C, 0.0f);
    float* mean = calib_floats(N, 0.0f);
    float* rstd = calib_floats(N, 0.0f);
    CALIB_TIME(ms, {
        for (int k = 0; k < 2; k++) {
            layernorm_forward(ln, mean, rstd, x, lw, lb, (int)N, C);
            residual_forward(r, x, ln, NC);
        }
        gelu_forward(hg, h, 4 * NC);
        gelu_backward(hg, h, hg, 4 * NC);
        for (int k = 0; k < 2; k++) layernorm_backward(d, dlw, dlb, ln, x, lw, mean, rstd, (int)N, C);
    });
    cal->elem_gbs = ELEM_BYTES * C * N / (ms * 1e6);
    free(x); free(ln); free(r); free(d); free(h); free(hg); free(lw); free(lb); free(dlw); free(dlb); free(mean); free(rstd);
    /* the cross-entropy over 16 rows of Vp logits */
    int rowsce = 16;
    float* logits = calib_floats((size_t)rowsce * Vp, 1.0f);
    float* losses = calib_floats((size_t)rowsce, 0.0f);
    int* targets = (int*)xmalloc(sizeof(int) * (size_t)rowsce);
    for (int i = 0; i < rowsce; i++) targets[i] = (i * 37) % Vp;
    CALIB_TIME(ms, {
        crossentropy_softmax_forward(logits, losses, targets, rowsce, Vp, Vp);
        crossentropy_softmax_backward(logits, targets, rowsce, Vp, 1.0f / rowsce);
    });
    cal->ce_gbs = CE_BYTES * rowsce * Vp / (ms * 1e6);
    free(logits); free(losses); free(targets);
    /* the optimizer's three passes over 2^21 parameters (32 MB of p, g, m,
     * v: past the caches), each alone: zeroing the gradients (memset, as
     * gpt2_zero_grad), their squared norm (sum_squares), AdamW */
    size_t P = (size_t)1 << 21;
    GPT2 model;
    memset(&model, 0, sizeof(model));
    model.param_sizes[0] = P;
    model.num_parameters = P;
    model.params_memory = calib_floats(P, 0.02f);
    float* g = calib_floats(P, 0.01f);
    float* m = calib_floats(P, 0.0f);
    float* v = calib_floats(P, 0.0f);
    AdamWConfig opt;
    memset(&opt, 0, sizeof(opt));
    opt.beta1 = 0.9f;
    opt.beta2 = 0.95f;
    opt.eps = 1e-8f;
    adamw_update_range(&model, &opt, 1e-4f, 1, 0, P, g, m, v); /* pages touched */
    CALIB_TIME(ms, adamw_update_range(&model, &opt, 1e-4f, 2, 0, P, g, m, v));
    cal->adamw_gbs = 28.0 * P / (ms * 1e6);
    cal->adamw_ns = ms * 1e6 / P;
    double sum = 0.0;
    CALIB_TIME(ms, sum += sum_squares(g, P));
    cal->norm_ns = ms * 1e6 / P;
    (void)sum;
    CALIB_TIME(ms, memset(g, 0, P * sizeof(float)));
    cal->zero_ns = ms * 1e6 / P;
    free(model.params_memory); free(g); free(m); free(v);
    /* ZeRO++'s codec (gptc/quant.h) over 2^18 floats in blocks of 256 (the default --quant-block): quantising
     * into a slot and dequantising it, INT8 and INT4, ns per element */
    size_t nq = (size_t)1 << 18;
    float* xq = calib_floats(nq, 0.05f);
    uint8_t* slot = (uint8_t*)xmalloc(quant_slot_bytes(nq, 8, 256));
    for (int b = 0; b < 2; b++) {
        int bits = b ? 4 : 8;
        CALIB_TIME(ms, quant_slot_encode(xq, NULL, nq, bits, 256, slot));
        cal->quant_ns[0][b] = ms * 1e6 / (double)nq;
        CALIB_TIME(ms, quant_slot_decode(slot, nq, bits, 256, xq, 0));
        cal->quant_ns[1][b] = ms * 1e6 / (double)nq;
    }
    free(xq); free(slot);
    cal->layer_factor = in_place ? calib_layer_factor(cal) : 1.0;
    free(calib_junk);
    calib_junk = NULL;
    cal->ms = time_ms() - t0;
}

#ifdef USE_MPI
/* A compute segment of fixed work that stays in the L1 cache (so its
 * length is the CPU time this rank gets, not memory bandwidth): `reps`
 * passes of multiply-adds over 1024 floats. */
static float calib_spin(float* x, long reps) {
    float acc = 0.0f;
    for (long r = 0; r < reps; r++)
        for (int i = 0; i < 1024; i++) {
            x[i] = x[i] * 0.999f + 0.001f;
            acc += x[i];
        }
    return acc;
}

/* What one ZeRO layer costs the ranks now, as the trainer's hooks do it:
 * a layer's gradients (12 C^2 + 13 C floats, at most 2^20) handed to
 * MPI_Ireduce, a compute segment of about 2 ms while
 * the reduction is in flight (Open MPI moves it along only inside MPI
 * calls), then MPI_Wait; against the same segments alone. On a machine
 * shared with other jobs the two ranks are slowed at different moments, the
 * faster one waits at every such meeting (spinning in MPI, holding its
 * core), and the reduction's rounds each need both ranks on a core. The
 * mean over the ranks of (time with - time alone) per layer, less the
 * transfer at the measured reduce rate: the cost of a meeting, ms, now. */
static double calib_sync(const Dist* d, int C, double reduce_gbs) {
    float x[1024];
    volatile float sink = 0.0f; /* (the segments' result is kept: their work is not optimised away) */
    for (int i = 0; i < 1024; i++) x[i] = (float)i / 1024.0f;
    double layer = 12.0 * C * C + 13.0 * C, cap = (double)(1 << 20);
    int n = (int)(layer < cap ? layer : cap);
    float* buf = calib_floats((size_t)n, 1.0f);
    double t0 = time_ms();
    long reps = 16;
    sink += calib_spin(x, reps);
    double per = fmax(time_ms() - t0, 1e-3) / reps;
    reps = (long)dist_sum(d, d->rank == 0 ? fmax(1.0, CALIB_SYNC_MS / per) : 0.0); /* rank 0's count: the same work everywhere */
    double diff[11];
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int k = 0; k < 11; k++) {
        t0 = time_ms();
        sink += calib_spin(x, reps);
        double alone = time_ms() - t0;
        int root = k % d->world;
        MPI_Request req;
        t0 = time_ms();
        MPI_CHECK(MPI_Ireduce(d->rank == root ? MPI_IN_PLACE : buf, d->rank == root ? buf : NULL, n, MPI_FLOAT,
                              MPI_SUM, root, MPI_COMM_WORLD, &req));
        sink += calib_spin(x, reps);
        MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
        diff[k] = time_ms() - t0 - alone;
        for (int j = k; j > 0 && diff[j] < diff[j - 1]; j--) {
            double t = diff[j];
            diff[j] = diff[j - 1];
            diff[j - 1] = t;
        }
    }
    free(buf);
    double mine = fmax(0.0, diff[5] - 4.0 * n / (reduce_gbs * 1e6)); /* the median round, less the transfer itself */
    return dist_sum(d, mine) / d->world;
}
#endif

/* The MPI ping, every rank at once, at every start (not cached: it
 * depends on the load): alpha from 21 allreduces of one float,
 * rates from 5 each of MPI_Allreduce, MPI_Ireduce + MPI_Wait and MPI_Allgather of
 * 2^18 floats (1 MB); the fastest of each, the ranks met before every call
 * (CALIB_TIME3_MET). */
static void calib_network(Calibration* cal, const Dist* d, size_t P) {
    cal->net_alpha_us = 0.0;
    cal->net_gbs = 0.0;
#ifdef USE_MPI
    if (d->world <= 1) return;
    double W = d->world, alpha_ms = 1e30, ms = 1e30, calls[21];
    float one = 1.0f;
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int i = 0; i < 21; i++) { /* the fastest call: the ranks met at once; the median: as they meet now */
        double t0 = time_ms();
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        calls[i] = time_ms() - t0;
        alpha_ms = fmin(alpha_ms, calls[i]);
    }
    for (int i = 1; i < 21; i++) /* (insertion sort, for the median) */
        for (int j = i; j > 0 && calls[j] < calls[j - 1]; j--) {
            double t = calls[j];
            calls[j] = calls[j - 1];
            calls[j - 1] = t;
        }
    cal->net_alpha_now_us = dist_sum(d, d->rank == 0 ? calls[10] * 1e3 : 0.0);
    /* (A known weakness: this 1 MB allreduce's rate varies from start to start by several times. Open MPI
     * takes its temporary buffers from malloc each call, fresh pages above glibc's mmap threshold, and that
     * threshold moves with the process's earlier frees; a fast reading puts 2-rank steps low.) */
    size_t n = (size_t)1 << 18;
    float* buf = calib_floats(n, 1.0f);
    float* all = calib_floats(n, 0.0f);
    int part = (int)(n / (size_t)d->world);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); /* warm-up */
    CALIB_TIME3_MET(ms, MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)));
    cal->net_gbs = 4.0 * n / (fmax(ms - alpha_ms, 1e-3) * 1e6);
    MPI_Request req; /* the non-blocking reduce ZeRO's reductions to the owners use (dist_reduce_to_owners) */
    CALIB_TIME3_MET(ms, {
        MPI_CHECK(MPI_Ireduce(d->rank == 0 ? MPI_IN_PLACE : buf, d->rank == 0 ? buf : NULL, (int)n, MPI_FLOAT, MPI_SUM,
                              0, MPI_COMM_WORLD, &req));
        MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
    });
    cal->reduce_gbs = 4.0 * n / (fmax(ms - alpha_ms, 1e-3) * 1e6);
    CALIB_TIME3_MET(ms, MPI_CHECK(MPI_Allgather(buf, part, MPI_FLOAT, all, part, MPI_FLOAT, MPI_COMM_WORLD)));
    cal->gather_gbs = 4.0 * part * W / (fmax(ms - alpha_ms, 1e-3) * 1e6);
    free(buf);
    free(all);
    /* ZeRO-1 without overlap: one MPI_Reduce_scatter_block of the padded gradients, at their size (at most 2^21
     * floats; beyond, its rate): Open MPI takes a temporary buffer of the whole size for it every call, fresh pages
     * from the kernel (a fault each 4 KB), which the 1 MB ping above does not show at the size it has in the step:
     * 2.7 MB took 8-9 ms there against 3 ms with malloc's mmap threshold raised (2 ranks, this machine) */
    size_t per = (P + (size_t)d->world - 1) / (size_t)d->world, cap = ((size_t)1 << 21) / (size_t)d->world;
    per = per < cap ? per : cap;
    float* g = calib_floats(per * (size_t)d->world, 1.0f);
    float* mine = calib_floats(per, 0.0f);
    MPI_CHECK(MPI_Reduce_scatter_block(g, mine, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); /* warm-up */
    CALIB_TIME3_MET(ms, MPI_CHECK(MPI_Reduce_scatter_block(g, mine, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)));
    cal->rs_floats = (double)per * d->world;
    cal->rs_gbs = 4.0 * cal->rs_floats / (fmax(ms - alpha_ms, 1e-3) * 1e6);
    free(g);
    free(mine);
    cal->net_alpha_us = alpha_ms * 1e3;
    cal->sync_ms = calib_sync(d, cal->C, cal->reduce_gbs);
    /* every rank uses rank 0's figures (it plans) */
    cal->net_alpha_us = dist_sum(d, d->rank == 0 ? cal->net_alpha_us : 0.0);
    cal->net_gbs = dist_sum(d, d->rank == 0 ? cal->net_gbs : 0.0);
    cal->reduce_gbs = dist_sum(d, d->rank == 0 ? cal->reduce_gbs : 0.0);
    cal->gather_gbs = dist_sum(d, d->rank == 0 ? cal->gather_gbs : 0.0);
    cal->rs_gbs = dist_sum(d, d->rank == 0 ? cal->rs_gbs : 0.0);
#else
    (void)d;
    (void)P;
#endif
}

/* The links of the levels (gptc/zero3.h's Levels), every rank at once, at
 * every start: with several nodes, on each level's communicator (intra,
 * then inter) the latency (the fastest of 21 allreduces of one float) and
 * the rate (the fastest of 5 MPI_Allgather of 2^18 floats in all) in the
 * bytes each rank sends as gptc/zero3.h counts them ((k - 1) x its part, k
 * ranks in the communicator). With --topology on one machine every level
 * is the same shared memory: it measures the same link twice, and says so.
 * On one node the inter level is none and the intra one is the world's
 * all-gather (calib_network's, in sent bytes). `stated` (--link-gbs, NULL
 * when not given): GB/s intra, inter, over the measured rates. */
static void calib_levels(Calibration* cal, const Dist* d, const double* stated) {
    memset(cal->level_alpha_us, 0, sizeof(cal->level_alpha_us));
    memset(cal->level_gbs, 0, sizeof(cal->level_gbs));
    cal->level_stated = stated != NULL;
#ifdef USE_MPI
    const Levels* lv = d->lv;
    if (d->world > 1 && lv && lv->nodes > 1 && lv->per_node > 0) {
        MPI_Comm comms[NUM_LEVELS] = {lv->intra, lv->inter};
        for (int e = 0; e < NUM_LEVELS; e++) {
            int k = 1;
            MPI_CHECK(MPI_Comm_size(comms[e], &k));
            if (k < 2) continue; /* (a level of one rank a group carries nothing) */
            double alpha = 1e30, ms = 1e30;
            float one = 1.0f;
            MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
            for (int i = 0; i < 21; i++) {
                double t0 = time_ms();
                MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_FLOAT, MPI_SUM, comms[e]));
                alpha = fmin(alpha, time_ms() - t0);
            }
            int part = (1 << 18) / k;
            float* buf = calib_floats((size_t)part, 1.0f);
            float* all = calib_floats((size_t)part * (size_t)k, 0.0f);
            MPI_CHECK(MPI_Allgather(buf, part, MPI_FLOAT, all, part, MPI_FLOAT, comms[e])); /* warm-up */
            CALIB_TIME3_MET(ms, MPI_CHECK(MPI_Allgather(buf, part, MPI_FLOAT, all, part, MPI_FLOAT, comms[e])));
            free(buf);
            free(all);
            cal->level_alpha_us[e] = alpha * 1e3;
            cal->level_gbs[e] = 4.0 * part * (k - 1) / (fmax(ms - alpha, 1e-3) * 1e6);
        }
        for (int e = 0; e < NUM_LEVELS; e++) { /* rank 0's figures, for all */
            cal->level_alpha_us[e] = dist_sum(d, d->rank == 0 ? cal->level_alpha_us[e] : 0.0);
            cal->level_gbs[e] = dist_sum(d, d->rank == 0 ? cal->level_gbs[e] : 0.0);
        }
    } else if (d->world > 1) {
        cal->level_alpha_us[LEVEL_INTRA] = cal->net_alpha_us;
        cal->level_gbs[LEVEL_INTRA] = cal->gather_gbs * (d->world - 1) / d->world;
    }
#endif
    if (stated)
        for (int e = 0; e < NUM_LEVELS; e++) {
            cal->level_gbs[e] = stated[e];
            if (cal->level_alpha_us[e] <= 0) cal->level_alpha_us[e] = cal->net_alpha_us; /* (a level not measured) */
        }
    (void)d;
}

/* calib_compute in a child process: its buffers and threads stay out of
 * this process's peak memory. 0, or -1 (then measured here instead).
 * `fill` (several ranks on the machine): once measured, the child keeps
 * its core busy with the fc GEMM until calib_fill_stop, so that every
 * rank's kernels were measured while every other rank computed, as in a
 * step. Why: on the 2-core VMs here a rank's GEMMs ran 0.6-0.95 x as fast
 * while the other core computed too (a 2-rank calibration read the fc GEMM
 * at 56-84 GFLOP/s in three starts, one rank alone 84-94; its children
 * started together but finished apart, so the last kernels of one were
 * measured with the other core idle). *filler: the child's pid while it
 * fills, else 0; *stop: the pipe that stops it. */
static int calib_compute_forked(Calibration* cal, int fill, pid_t* filler, int* stop) {
    int fd[2], go[2];
    *filler = 0;
    *stop = -1;
    if (pipe(fd) != 0) return -1;
    if (pipe(go) != 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]); close(fd[1]); close(go[0]); close(go[1]);
        return -1;
    }
    if (pid == 0) {
        close(fd[0]);
        close(go[1]);
        calib_compute(cal, 1);
        ssize_t w = write(fd[1], cal, sizeof(*cal));
        close(fd[1]);
        if (fill) { /* the fc GEMM at rows[1] until the parent closes its end (every rank measured) */
            int C = cal->C, N = (int)cal->rows[1];
            float* inp = calib_floats((size_t)N * C, 1.0f);
            float* wt = calib_floats((size_t)4 * C * C, 0.02f);
            float* out = calib_floats((size_t)N * 4 * C, 0.0f);
            struct pollfd p = {go[0], POLLIN, 0};
            double t0 = time_ms(); /* (the pipe also ends when the parent dies; at most a minute regardless) */
            while (time_ms() - t0 < 60e3 && poll(&p, 1, 0) == 0) matmul_forward(out, inp, wt, NULL, N, C, 4 * C);
        }
        _exit(w == (ssize_t)sizeof(*cal) ? 0 : 1);
    }
    close(fd[1]);
    close(go[0]);
    Calibration got;
    size_t have = 0;
    while (have < sizeof(got)) {
        ssize_t r = read(fd[0], (char*)&got + have, sizeof(got) - have);
        if (r <= 0) break;
        have += (size_t)r;
    }
    close(fd[0]);
    *filler = pid;
    *stop = go[1];
    if (have != sizeof(got)) return -1; /* (calib_fill_stop reaps it) */
    *cal = got;
    return 0;
}

/* Stops calib_compute_forked's child (its filling, if any) and reaps it. */
static void calib_fill_stop(pid_t filler, int stop) {
    if (stop >= 0) close(stop);
    int status = 0;
    if (filler > 0) waitpid(filler, &status, 0);
}

/* ---- the cache ---------------------------------------------------------- */

/* Key: CPU model, threads, ranks, the binary's size and mtime, the shape. */
static void calib_key(Calibration* cal, int threads, int world) {
    char cpu[256] = "unknown";
    FILE* f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f))
            if (!strncmp(line, "model name", 10)) {
                char* colon = strchr(line, ':');
                if (colon) snprintf(cpu, sizeof(cpu), "%s", colon + 2);
                cpu[strcspn(cpu, "\n")] = '\0';
                break;
            }
        fclose(f);
    }
    for (char* p = cpu; *p; p++)
        if (*p == ' ' || *p == '\t') *p = '_';
    struct stat st;
    long long size = 0, mtime = 0;
    if (stat("/proc/self/exe", &st) == 0) {
        size = (long long)st.st_size;
        mtime = (long long)st.st_mtime;
    }
    snprintf(cal->key, sizeof(cal->key), "cpu=%s threads=%d ranks=%d build=%lld.%lld C=%d NH=%d Vp=%d Tc=%d", cpu,
             threads, world, size, mtime, cal->C, cal->NH, cal->Vp, cal->Tc);
}

/* Where a calibration cache named `name` lives: in --output-dir when there
 * is one, else $XDG_CACHE_HOME/gptc/ (~/.cache/gptc/). */
static void calib_file_path(char* out, size_t cap, const char* output_dir, const char* name) {
    const char* xdg = getenv("XDG_CACHE_HOME");
    const char* home = getenv("HOME");
    if (output_dir && output_dir[0]) snprintf(out, cap, "%s/%s", output_dir, name);
    else if (xdg && xdg[0]) snprintf(out, cap, "%s/gptc/%s", xdg, name);
    else snprintf(out, cap, "%s/.cache/gptc/%s", home && home[0] ? home : "/tmp", name);
}

static void calib_path(Calibration* cal, const char* output_dir) {
    calib_file_path(cal->path, sizeof(cal->path), output_dir, "calibration.txt");
}

/* The cached numbers, in the file's order (the header line names them). */
#define CALIB_NUMBERS (2 + 4 * NUM_SHAPES + 14)
static void calib_numbers(Calibration* cal, double* v[CALIB_NUMBERS]) {
    int n = 0;
    v[n++] = &cal->rows[0];
    v[n++] = &cal->rows[1];
    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < NUM_SHAPES; s++) {
            v[n++] = &cal->gemm_fixed[pass][s];
            v[n++] = &cal->gemm_row[pass][s];
        }
    v[n++] = &cal->attn_ms;
    v[n++] = &cal->elem_gbs;
    v[n++] = &cal->ce_gbs;
    v[n++] = &cal->zero_ns;
    v[n++] = &cal->norm_ns;
    v[n++] = &cal->adamw_ns;
    v[n++] = &cal->adamw_gbs;
    v[n++] = &cal->share_gflops;
    for (int e = 0; e < 2; e++)
        for (int b = 0; b < 2; b++) v[n++] = &cal->quant_ns[e][b];
    v[n++] = &cal->layer_factor;
    v[n++] = &cal->ms;
    ALWAYS(n == CALIB_NUMBERS);
}

/* What each cached number is, in calib_numbers' order, and the range a
 * measurement on any machine falls in: a cache is believed only inside
 * these (NaN, Inf, zero, negative or huge figures are a damaged or edited
 * file, and would give the planner nonsense or a huge allocation). */
typedef struct { const char* name; double lo, hi; int lo_open; } CalibRange;
#define CALIB_RANGE(nm, l, h, open_below)                                                   \
    do {                                                                                  \
        r[n].name = (nm); r[n].lo = (l); r[n].hi = (h); r[n].lo_open = (open_below); n++; \
    } while (0)
static void calib_ranges(CalibRange r[CALIB_NUMBERS]) {
    static const char* const shape[NUM_SHAPES] = {"qkv", "attproj", "fc", "fcproj", "classifier"};
    static char names[4 * NUM_SHAPES][48];
    int n = 0;
    CALIB_RANGE("rows[0]", 16, 16, 0); /* (checked against calib_gemm_rows exactly, below) */
    CALIB_RANGE("rows[1]", 48, 512, 0);
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < NUM_SHAPES; q++) {
            char* a = names[2 * (pass * NUM_SHAPES + q)];
            char* b = names[2 * (pass * NUM_SHAPES + q) + 1];
            snprintf(a, 48, "%s %s GEMM fixed ms", shape[q], pass ? "backward" : "forward");
            snprintf(b, 48, "%s %s GEMM ms per row", shape[q], pass ? "backward" : "forward");
            CALIB_RANGE(a, 0, 1e4, 0);
            CALIB_RANGE(b, 0, 1e3, 1);
        }
    CALIB_RANGE("attention ms per sequence", 0, 1e5, 1);
    CALIB_RANGE("elementwise GB/s", 0, 1e5, 1);
    CALIB_RANGE("cross-entropy GB/s", 0, 1e5, 1);
    CALIB_RANGE("zeroing ns per float", 0, 1e6, 1);
    CALIB_RANGE("norm ns per float", 0, 1e6, 1);
    CALIB_RANGE("AdamW ns per float", 0, 1e6, 1);
    CALIB_RANGE("AdamW GB/s", 0, 1e5, 1);
    CALIB_RANGE("fc GFLOP/s", 0, 1e7, 1);
    CALIB_RANGE("quantise INT8 ns per element", 0, 1e6, 1);
    CALIB_RANGE("quantise INT4 ns per element", 0, 1e6, 1);
    CALIB_RANGE("dequantise INT8 ns per element", 0, 1e6, 1);
    CALIB_RANGE("dequantise INT4 ns per element", 0, 1e6, 1);
    CALIB_RANGE("layer factor", 0.8, 1.6, 0); /* calib_layer_factor's clamp (1 when not measured) */
    CALIB_RANGE("calibration ms", 0, 1e7, 0);
    ALWAYS(n == CALIB_NUMBERS);
}
#undef CALIB_RANGE

/* Read n numbers of a cache line (`at`: just after "key|") through v and
 * check each against its range r[i]; nothing more may follow on the line.
 * NULL, or why not (into why, naming the number, what was expected and what
 * was found). The GPU's calibration (gptc/cuda/runtime.cuh) reads its own
 * numbers with it too. */
static const char* numbers_parse(const char* at, double* const* v, const CalibRange* r, int n, char* why, size_t cap) {
    for (int i = 0; i < n; i++) {
        char* end = NULL;
        double x = strtod(at, &end);
        if (end == at) {
            snprintf(why, cap, "number %d of %d (%s) is missing or not a number", i + 1, n, r[i].name);
            return why;
        }
        at = end;
        int low = r[i].lo_open ? !(x > r[i].lo) : !(x >= r[i].lo);
        if (!isfinite(x) || low || !(x <= r[i].hi)) {
            if (r[i].lo_open) snprintf(why, cap, "%s is %g, expected more than %g and at most %g", r[i].name, x, r[i].lo, r[i].hi);
            else snprintf(why, cap, "%s is %g, expected %g..%g", r[i].name, x, r[i].lo, r[i].hi);
            return why;
        }
        *v[i] = x;
    }
    while (*at == ' ' || *at == '\t' || *at == '\r') at++;
    if (*at != '\n' && *at != '\0') {
        snprintf(why, cap, "more than %d numbers", n);
        return why;
    }
    return NULL;
}

/* The CPU calibration's line into *c: its numbers, then its GEMM row counts
 * against the rule for its shape. NULL, or why not. */
static const char* calib_line_parse(Calibration* c, const char* at, char* why, size_t cap) {
    double* v[CALIB_NUMBERS];
    CalibRange r[CALIB_NUMBERS];
    calib_numbers(c, v);
    calib_ranges(r);
    if (numbers_parse(at, v, r, CALIB_NUMBERS, why, cap)) return why;
    double rows[2];
    calib_gemm_rows(c->C, c->Vp, rows);
    if (c->rows[0] != rows[0] || c->rows[1] != rows[1]) {
        snprintf(why, cap, "the row counts are %g and %g, expected %g and %g (calibration's rule for C=%d Vp=%d)",
                 c->rows[0], c->rows[1], rows[0], rows[1], c->C, c->Vp);
        return why;
    }
    return NULL;
}

/* A cache of keyed lines, "key|numbers": the first line names the format
 * (`format`; a file of another version of it, `format_any`, is replaced).
 * keyed_load finds `key`'s line in `path` and hands the rest of it to
 * parse(ctx, at, why, cap), which reads the numbers or says why not: 1 when
 * found and read, else 0. A line of the key that is cut off or holds an
 * implausible figure is not believed: a one-line note names the file, the
 * line and the figure, *discarded is set (the caller measures again) and
 * keyed_save drops that line. */
typedef const char* (*KeyedParse)(void* ctx, const char* at, char* why, size_t cap);
static int keyed_load(const char* path, const char* format, const char* key, KeyedParse parse, void* ctx,
                      int* discarded) {
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    long lineno = 1;
    if (fgets(line, sizeof(line), f) && !strncmp(line, format, strlen(format))) {
        size_t k = strlen(key);
        while (!found && fgets(line, sizeof(line), f)) {
            lineno++;
            size_t len = strlen(line);
            int whole = len > 0 && line[len - 1] == '\n';
            if (!whole && !feof(f)) { /* longer than any line we write: skip the rest of it */
                int ch;
                while ((ch = fgetc(f)) != EOF && ch != '\n') {}
            }
            if (strncmp(line, key, k) || line[k] != '|') continue;
            char why[300];
            const char* bad = !whole && !feof(f) ? "the line is longer than any calibration line"
                              : parse(ctx, line + k + 1, why, sizeof(why));
            if (bad) {
                fprintf(stderr, "note: %s line %ld: %s: this cached calibration is discarded and measured again\n",
                        path, lineno, bad);
                *discarded = 1;
                break;
            }
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Append `key`'s line of n numbers (a file that is not such a cache is left
 * alone; after a discard, the key's old lines are dropped first). */
static void keyed_save(const char* path, const char* format, const char* format_any, const char* header,
                       const char* key, int discarded, double* const* v, int n) {
    char dir[4400];
    snprintf(dir, sizeof(dir), "%s", path);
    char* slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        if (mkdir_p(dir) != 0) return;
    }
    FILE* f = fopen(path, "r");
    int fresh = !f;
    if (f) {
        char line[64] = "";
        int read = fgets(line, sizeof(line), f) != NULL;
        fclose(f);
        if (!read || strncmp(line, format_any, strlen(format_any))) {
            fprintf(stderr, "warning: %s is not a gptc calibration file: not written\n", path);
            return;
        }
        fresh = strncmp(line, format, strlen(format)) != 0; /* an older version's: its lines dropped */
    }
    if (!fresh && discarded) { /* the file without this key's lines, then this calibration appended */
        char tmp[4410];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE* in = fopen(path, "r");
        FILE* out = in ? fopen(tmp, "w") : NULL;
        size_t k = strlen(key);
        char line[4096];
        int ok = in && out, at_start = 1, drop = 0;
        while (ok && fgets(line, sizeof(line), in)) {
            if (at_start) drop = !strncmp(line, key, k) && line[k] == '|'; /* (a long line's rest: as its start) */
            size_t len = strlen(line);
            if (!drop && fputs(line, out) == EOF) ok = 0;
            at_start = len > 0 && line[len - 1] == '\n';
        }
        if (in) fclose(in);
        if (out && fclose(out) != 0) ok = 0;
        if (!ok || rename(tmp, path) != 0) {
            remove(tmp);
            fprintf(stderr, "warning: cannot rewrite the calibration cache %s: %s\n", path, strerror(errno));
            return;
        }
    }
    if (!(f = fopen(path, fresh ? "w" : "a"))) {
        fprintf(stderr, "warning: cannot write the calibration cache %s: %s\n", path, strerror(errno));
        return;
    }
    if (fresh) fprintf(f, "%s: %s\n", format, header);
    fprintf(f, "%s|", key);
    for (int i = 0; i < n; i++) fprintf(f, "%s%.6g", i ? " " : "", *v[i]);
    fprintf(f, "\n");
    fclose(f);
}

static const char* calib_parse_into(void* ctx, const char* at, char* why, size_t cap) {
    return calib_line_parse((Calibration*)ctx, at, why, cap);
}

/* The line of `cal->key` in the CPU's cache (keyed_load): 1 when found and
 * read into *cal, else 0 (cal->discarded: a bad line of the key was met). */
static int calib_load(Calibration* cal) {
    Calibration c = *cal;
    int found = keyed_load(cal->path, CALIB_FORMAT, cal->key, calib_parse_into, &c, &cal->discarded);
    if (found) {
        c.discarded = cal->discarded;
        *cal = c;
    }
    return found;
}

/* Append this calibration to the CPU's cache (keyed_save). */
static void calib_save(const Calibration* cal) {
    double* v[CALIB_NUMBERS];
    calib_numbers((Calibration*)cal, v);
    keyed_save(cal->path, CALIB_FORMAT, CALIB_FORMAT_ANY,
               "key|rows(2), per GEMM shape (qkv attproj fc fcproj classifier) forward then backward: "
               "fixed ms, ms per row; attention ms per sequence, elementwise GB/s, cross-entropy GB/s, "
               "zero/norm/AdamW ns per float, AdamW GB/s, fc GFLOP/s, quantise INT8/INT4 and dequantise INT8/INT4 ns per "
               "element, a layer in the step over its kernels, ms", cal->key, cal->discarded, v, CALIB_NUMBERS);
}

static void calibration_print(const Calibration* cal) {
    static const char* const names[NUM_SHAPES] = {"qkv", "attproj", "fc", "fcproj", "classifier"};
    printf("calibration (%s, %.0f ms, %s): GEMM GFLOP/s fwd/bwd at N=%.0f (fixed ms fwd/bwd) for", cal->cached ?
           "cached" : "measured now", cal->ms, cal->path, cal->rows[1]);
    for (int s = 0; s < NUM_SHAPES; s++) {
        int K, OC;
        gemm_shape(cal->C, cal->Vp, s, &K, &OC);
        double N = cal->rows[1], f = cal->gemm_fixed[0][s] + cal->gemm_row[0][s] * N;
        double bw = cal->gemm_fixed[1][s] + cal->gemm_row[1][s] * N;
        printf("%s %s %dx%d %.1f/%.1f (%.2f/%.2f)", s ? "," : "", names[s], K, OC, 2.0 * N * K * OC / (f * 1e6),
               4.0 * N * K * OC / (bw * 1e6), cal->gemm_fixed[0][s], cal->gemm_fixed[1][s]);
    }
    printf("; attention %.2f ms per sequence (T=%d); LayerNorm/GELU/residual %.1f GB/s; cross-entropy %.1f GB/s; "
           "zero/norm/AdamW %.2f/%.2f/%.2f ns per float; quantise INT8/INT4 %.2f/%.2f, dequantise %.2f/%.2f ns per "
           "element; a layer inside the step %.3f x its kernels alone", cal->attn_ms, cal->Tc, cal->elem_gbs, cal->ce_gbs,
           cal->zero_ns, cal->norm_ns, cal->adamw_ns, cal->quant_ns[0][0], cal->quant_ns[0][1], cal->quant_ns[1][0],
           cal->quant_ns[1][1], cal->layer_factor);
    double load[3] = {0, 0, 0};
    FILE* f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = 0;
        fclose(f);
    }
    printf("; speed now %.2f of it (load average %.2f; the computation's time is divided by it)\n", cal->share, load[0]);
    if (cal->net_gbs > 0) /* (every digit: scripts/tests/test_plan.sh recomputes the model from these) */
        printf("network (measured at this start): MPI latency %.6g us (fastest; median now %.6g us), allreduce %.6g "
               "GB/s, reduce %.6g GB/s, allgather %.6g GB/s, a meeting of the ranks amid compute now %.6g ms; "
               "reduce-scatter %.6g GB/s (%.0f floats)\n",
               cal->net_alpha_us, cal->net_alpha_now_us, cal->net_gbs, cal->reduce_gbs, cal->gather_gbs, cal->sync_ms,
               cal->rs_gbs, cal->rs_floats);
    if (cal->level_gbs[LEVEL_INTRA] > 0 || cal->level_gbs[LEVEL_INTER] > 0) {
        printf("links (%s):", cal->level_stated ? "rates stated by --link-gbs, latencies measured" : "measured at this start");
        for (int e = 0; e < NUM_LEVELS; e++)
            if (cal->level_gbs[e] > 0) printf(" %s %.6g us %.6g GB/s sent a rank%s", LEVEL_NAMES[e], cal->level_alpha_us[e],
                                              cal->level_gbs[e], e + 1 < NUM_LEVELS && cal->level_gbs[e + 1] > 0 ? ";" : "");
        printf("\n");
    }
}

/* How much of the calibrated speed this process gets now, on a machine
 * shared with other jobs: the calibration's fc GEMM at rows[1] run in five
 * windows of 40 ms with this run's threads, the median window's rate over
 * the calibrated (fastest) one. It
 * sees both the share of the cores the other jobs leave and what they
 * leave of the caches and memory bandwidth. 1 on an idle machine. Not
 * cached: the load changes from minute to minute. */
static double calib_share(const Calibration* cal) {
    int C = cal->C, OC = 4 * C, N = (int)cal->rows[1];
    float* inp = calib_floats((size_t)N * C, 1.0f);
    float* w = calib_floats((size_t)OC * C, 0.02f);
    float* bias = calib_floats((size_t)OC, 0.1f);
    float* out = calib_floats((size_t)N * OC, 0.0f);
    double rates[5]; /* five windows of 40 ms: the median (one window that met a descheduling is not the rule) */
    for (int k = 0; k < 5; k++) {
        double flops = 0.0, t0 = time_ms();
        while (time_ms() - t0 < 40.0) {
            matmul_forward(out, inp, w, bias, N, C, OC);
            flops += 2.0 * N * C * OC;
        }
        rates[k] = flops / ((time_ms() - t0) * 1e6);
        for (int j = k; j > 0 && rates[j] < rates[j - 1]; j--) {
            double t = rates[j];
            rates[j] = rates[j - 1];
            rates[j - 1] = t;
        }
    }
    double rate = rates[2];
    free(inp);
    free(w);
    free(bias);
    free(out);
    return fmin(1.0, rate / cal->share_gflops);
}

/* Several ranks: every rank takes the compute figures of the rank whose
 * layer probe (calib_layer_factor: f x its kernels, the trainer's own
 * layer) was slowest, as each step waits for the slowest rank at its
 * collectives. (On a VM one rank's core can run a step slower than the
 * other's while both compute; which one is slower differs from VM to VM.) */
static void calib_slowest(Calibration* cal, const Dist* d) {
#ifdef USE_MPI
    if (d->world <= 1) return;
    int B = (int)cal->rows[1] / cal->Tc > 1 ? (int)cal->rows[1] / cal->Tc : 1;
    struct {
        double ms;
        int rank;
    } mine = {cal->layer_factor * calib_layer_kernels_ms(cal, (double)B * cal->Tc, B), d->rank}, top;
    MPI_CHECK(MPI_Allreduce(&mine, &top, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));
    Calibration keep = *cal;
    MPI_CHECK(MPI_Bcast(cal, (int)sizeof(*cal), MPI_BYTE, top.rank, MPI_COMM_WORLD));
    memcpy(cal->key, keep.key, sizeof(cal->key)); /* (the same on every rank; kept as this rank made them) */
    memcpy(cal->path, keep.path, sizeof(cal->path));
    cal->cached = keep.cached;
#else
    (void)cal;
    (void)d;
#endif
}

/* The calibration for model c at sequence length T on this machine: from
 * the cache, or measured (every rank takes part: the ping, and the compute
 * measured on every rank at once, as the ranks will run). Rank 0's figures
 * are the ones that count (it plans). */
static void calibration_get(Calibration* cal, const GPT2Config* c, int T, const char* output_dir, const Dist* d,
                            const char* link_gbs) {
    memset(cal, 0, sizeof(*cal));
    cal->C = c->channels;
    cal->NH = c->num_heads;
    cal->Vp = c->padded_vocab_size;
    cal->Tc = T < 128 ? T : 128;
    calib_key(cal, num_threads(), d->world);
    calib_path(cal, output_dir);
    const char* again = getenv("GPTC_CALIBRATE");
    int hit = d->rank == 0 && !(again && atoi(again) == 1) && calib_load(cal);
    hit = dist_sum(d, hit) > 0.5; /* rank 0's answer, for all */
    if (hit) {
        cal->cached = 1;
    } else {
        pid_t filler;
        int stop;
        if (calib_compute_forked(cal, d->world > 1, &filler, &stop) != 0)
            calib_compute(cal, 0); /* (forked before this process's first OpenMP team) */
        dist_sum(d, 0.0);           /* every rank has measured: the fillers stop */
        calib_fill_stop(filler, stop);
        if (test_hook_calib_slow(d->rank)) { /* (test builds, scripts/tests/test_plan.sh: this rank made the slowest) */
            for (int pass = 0; pass < 2; pass++)
                for (int q = 0; q < NUM_SHAPES; q++) cal->gemm_row[pass][q] *= 3.0;
            cal->attn_ms = 12.345;
        }
        calib_slowest(cal, d);
        if (d->rank == 0) calib_save(cal);
    }
    calib_network(cal, d, parameter_count(c));
    double stated[NUM_LEVELS];
    calib_levels(cal, d, link_gbs && link_gbs[0] && link_rates_parse(link_gbs, stated) ? stated : NULL);
    cal->share = dist_sum(d, calib_share(cal)) / d->world; /* all at once; their mean */
}

#endif /* GPTC_CALIB_H */
