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
 *                 above all). (v1 measured one shape, fc, at three N and
 *                 used its rate for all: the layers' GEMMs came out 27-31%
 *                 under the replayed step, dev/cpu/profile_plan.)
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
 *                 (calib_layer_factor; v4; on a Zen 4 VM 1.18-1.25 at C=128, one
 *                 thread, once 1.40; 0.9-1.1 at C=768, twice 1.43-1.51
 *                 with 2 threads).
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
 *                 prints them; scripts/test_plan.sh compares them with
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
 * Calibration runs in a child process (fork, before the parent starts any
 * OpenMP thread), so its buffers never count in the parent's peak memory
 * (the memory plan's VmHWM check); the MPI pings run in every rank at once.
 * With several ranks every rank's child measures while every other rank
 * computes (each keeps its core busy until all have measured), and every
 * rank takes the figures of the rank whose layer probe was slowest
 * (calib_slowest): a step waits for its slowest rank.
 * The compute is cached in a text file (the first line names the format,
 * "gptc calibration v4": v3's numbers and the layer factor f; a file of
 * an older version is replaced): <--output-dir>/calibration.txt when there is one, else
 * $XDG_CACHE_HOME/gptc/calibration.txt (~/.cache/...), one line per key:
 * CPU model, threads, ranks, the binary (its size and mtime), and the shape
 * measured (C, NH, Vp, Tc). GPTC_CALIBRATE=1 measures again.
 *
 * Measured: see README, "How fast": on the 2 shared cores at load
 * averages of 6-14 neither time target is met (the machine gives a run
 * between 0.15 and 1 of a core from one minute to the next); phase by
 * phase against one step replayed (dev/cpu/profile_plan, the fastest of 9,
 * load 3) the GEMMs, the classifier, the elementwise kernels and the
 * cross-entropy were within 7.5% for L=4 C=128.
 *
 * scripts/runtime_closed_form.py recomputes this model independently from
 * a planted calibration (scripts/test_plan.sh; GPTC_INJECT_RUNTIME_ERROR
 * plants a wrong coefficient it must catch).
 *
 * Included by train_gpt.c in section 8, before gptc/plan.h (after
 * gptc/zero3.h and gptc/zeropp.h: Levels, levels_piece, gptc/quant.h).
 * Defines: Calibration, StepTime, CommKnobs, comm_knobs_flat, LevelTraffic,
 * runtime_traffic, calibration_get, calibration_print, runtime_step,
 * runtime_snapshot_ms, young_daly_steps.
 */
#ifndef GPTC_RUNTIME_H
#define GPTC_RUNTIME_H

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
 * it in the previous call: ZeRO-1's reduce-scatter of 2.7 MB read
 * 1.3-1.75 GB/s back to back and 1.0 GB/s met, as in the step (2.5-3.1
 * ms; d8 C64, 2 ranks, 2026-12-02). */
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
 * Why: on a Zen 4 VM (2 MB of L2) the layers' GEMMs ran 8-17% and
 * attention 12-18% slower inside the step than alone, each with its caches
 * evicted (dev/cpu/profile_plan, 2026-12-01), and the model was 1-18% under
 * the measured step. The factor carries the calibration's own noise too
 * (the kernels' sum for a layer of C=768 read 21.4-25.0 ms in three starts,
 * the probe's layer 24.2-24.9 ms): f times the kernels' prediction is the
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
    /* (Known weakness, 2026-12-01: on 2 ranks here this 1 MB allreduce read 1.1, 1.6, 1.6 and 6.7 GB/s in four
     * starts. Open MPI takes its temporary buffers from malloc each call, fresh pages above glibc's mmap
     * threshold, and that threshold moves with the process's earlier frees: a probe gave 1.2-1.4 GB/s by default
     * and 7.9-8.2 GB/s with the threshold at 64 MB. The step's per-slice reductions amid backward ran at ~1.25
     * GB/s (d2 C128, 2 ranks: 26-27 ms a step against 20 ms on one), so a fast reading puts 2-rank steps low.
     * Raising the threshold in the trainer made ZeRO-1's reduce-scatter ~9% faster and the overlapped ZeRO-0
     * step no faster: not kept.) */
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

static void calib_path(Calibration* cal, const char* output_dir) {
    const char* xdg = getenv("XDG_CACHE_HOME");
    const char* home = getenv("HOME");
    if (output_dir && output_dir[0]) snprintf(cal->path, sizeof(cal->path), "%s/calibration.txt", output_dir);
    else if (xdg && xdg[0]) snprintf(cal->path, sizeof(cal->path), "%s/gptc/calibration.txt", xdg);
    else snprintf(cal->path, sizeof(cal->path), "%s/.cache/gptc/calibration.txt", home && home[0] ? home : "/tmp");
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

/* The line of `cal->key` in the cache: 1 when found (and read), else 0. */
static int calib_load(Calibration* cal) {
    FILE* f = fopen(cal->path, "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    if (fgets(line, sizeof(line), f) && !strncmp(line, CALIB_FORMAT, strlen(CALIB_FORMAT))) {
        size_t k = strlen(cal->key);
        while (!found && fgets(line, sizeof(line), f)) {
            if (strncmp(line, cal->key, k) || line[k] != '|') continue;
            Calibration c = *cal;
            double* v[CALIB_NUMBERS];
            calib_numbers(&c, v);
            char* at = line + k + 1;
            int got = 0;
            for (; got < CALIB_NUMBERS; got++) {
                char* end = NULL;
                *v[got] = strtod(at, &end);
                if (end == at) break;
                at = end;
            }
            found = got == CALIB_NUMBERS;
            if (found) *cal = c;
        }
    }
    fclose(f);
    return found;
}

/* Append this calibration (a file that is not ours is left alone). */
static void calib_save(const Calibration* cal) {
    char dir[4400];
    snprintf(dir, sizeof(dir), "%s", cal->path);
    char* slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        if (mkdir_p(dir) != 0) return;
    }
    FILE* f = fopen(cal->path, "r");
    int fresh = !f;
    if (f) {
        char line[64] = "";
        int read = fgets(line, sizeof(line), f) != NULL;
        fclose(f);
        if (!read || strncmp(line, CALIB_FORMAT_ANY, strlen(CALIB_FORMAT_ANY))) {
            fprintf(stderr, "warning: %s is not a gptc calibration file: not written\n", cal->path);
            return;
        }
        fresh = strncmp(line, CALIB_FORMAT, strlen(CALIB_FORMAT)) != 0; /* an older version's: its lines dropped */
    }
    if (!(f = fopen(cal->path, fresh ? "w" : "a"))) {
        fprintf(stderr, "warning: cannot write the calibration cache %s: %s\n", cal->path, strerror(errno));
        return;
    }
    if (fresh) fprintf(f, "%s: key|rows(2), per GEMM shape (qkv attproj fc fcproj classifier) forward then backward: "
                       "fixed ms, ms per row; attention ms per sequence, elementwise GB/s, cross-entropy GB/s, "
                       "zero/norm/AdamW ns per float, AdamW GB/s, fc GFLOP/s, quantise INT8/INT4 and dequantise INT8/INT4 ns per "
                       "element, a layer in the step over its kernels, ms\n", CALIB_FORMAT);
    double* v[CALIB_NUMBERS];
    calib_numbers((Calibration*)cal, v);
    fprintf(f, "%s|", cal->key);
    for (int i = 0; i < CALIB_NUMBERS; i++) fprintf(f, "%s%.6g", i ? " " : "", *v[i]);
    fprintf(f, "\n");
    fclose(f);
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
    if (cal->net_gbs > 0) /* (every digit: scripts/test_plan.sh recomputes the model from these) */
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
 * collectives. (On the 2-core VMs here one rank's core ran a step ~10%
 * slower than the other's while both computed, 2026-12-01/02; which one
 * changed from VM to VM.) */
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
        if (test_hook_calib_slow(d->rank)) { /* (test builds, scripts/test_plan.sh: this rank made the slowest) */
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
         * (header); measured 2026-12-02, make bench-plan's 11 two-rank rows: median |error| 9.5% without,
         * 3.9% and 3.8% with (two runs), the rows no longer mostly low. */
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
