/*
 * bench_train.c — times GPT-2 training steps of train_gpt.c (forward,
 * backward, clipping, AdamW) on random tokens, with a breakdown by phase.
 *
 *   make dev/cpu/bench_train && dev/cpu/bench_train 4 64 3 [L]
 *   args: B T steps [num_layers, default 12 = GPT-2 124M]
 *   BENCH_DUMP=DIR: also writes the initial weights and the batch there (for the
 *   PyTorch baseline's loss check: scripts/bench/bench_torch.py --from DIR)
 * Prints parseable lines (scripts/bench/bench.sh reads them): one per matmul kind
 * (each weight's forward and backward calls of a step, replayed alone), then
 *   gptc B=4 T=64 ms/step=... gflops=... peak_rss_gb=... threads=2 ... matmul_gflops=...
 * FLOPs per step = B*T*(6P + 6*L*C*T), the same formula as bench_torch.py.
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"
#include <sys/resource.h>

/* Replay every matmul of one training step (the same calls, shapes and
 * buffers as gpt2_forward/gpt2_backward) and time them alone, one kind at a
 * time (e.g. all L qkv forwards), best of 3: each kind's GFLOP/s inside the
 * trainer, and with their sum the GEMM's share of the step. */
enum { W_QKV, W_ATTPROJ, W_FC, W_FCPROJ, W_LM_HEAD, NUM_WEIGHTS };
static const char* weight_names[NUM_WEIGHTS] = {"qkvw", "attprojw", "fcw", "fcprojw", "wte"};

typedef struct {
    int weight;        /* W_QKV .. W_LM_HEAD (the LM head's weight is wte) */
    int backward;      /* 0: matmul_forward (1 GEMM), 1: matmul_backward (2 GEMMs: dinp and dW) */
    int OC, IC;        /* the weight is (OC, IC) */
    int calls;         /* L per step, 1 for the LM head */
    double ms, gflops; /* all calls of one step, best of 3 */
} MatmulTiming;

/* The call gpt2_forward (backward = 0) or gpt2_backward (1) makes for weight w of layer l. */
static void matmul_call(GPT2* m, int BT, int w, int l, int backward) {
    int C = m->config.channels, Vp = m->config.padded_vocab_size;
    ParameterTensors p = m->params, g = m->grads;
    ActivationTensors a = m->acts;
    BackwardScratch s = m->scratch;
    size_t cc = (size_t)l * C * C;
    switch (w) {
    case W_QKV:
        if (!backward) matmul_forward(a.qkv, a.ln1, p.qkvw + 3 * cc, p.qkvb + l * 3 * C, BT, C, 3 * C);
        else matmul_backward(s.dbt_c, g.qkvw + 3 * cc, g.qkvb + l * 3 * C, s.dqkv, a.ln1, p.qkvw + 3 * cc,
                             BT, C, 3 * C, 0);
        break;
    case W_ATTPROJ:
        if (!backward) matmul_forward(a.residual2, a.atty, p.attprojw + cc, p.attprojb + l * C, BT, C, C);
        else matmul_backward(s.dbt_c, g.attprojw + cc, g.attprojb + l * C, s.dresidual, a.atty,
                             p.attprojw + cc, BT, C, C, 0);
        break;
    case W_FC:
        if (!backward) matmul_forward(a.fch, a.ln2, p.fcw + 4 * cc, p.fcb + l * 4 * C, BT, C, 4 * C);
        else matmul_backward(s.dbt_c, g.fcw + 4 * cc, g.fcb + l * 4 * C, s.dfch, a.ln2, p.fcw + 4 * cc,
                             BT, C, 4 * C, 0);
        break;
    case W_FCPROJ:
        if (!backward) matmul_forward(a.residual3, a.fch_gelu, p.fcprojw + 4 * cc, p.fcprojb + l * C, BT, 4 * C, C);
        else matmul_backward(s.dfch, g.fcprojw + 4 * cc, g.fcprojb + l * C, s.dresidual, a.fch_gelu,
                             p.fcprojw + 4 * cc, BT, 4 * C, C, 0);
        break;
    case W_LM_HEAD:
        if (!backward) matmul_forward(a.logits, a.lnf, p.wte, NULL, BT, C, Vp);
        else matmul_backward(s.dbt_c, g.wte, NULL, a.logits, a.lnf, p.wte, BT, C, Vp, 0);
        break;
    }
}

/* Times every kind (2 per weight); returns one step's matmul FLOPs:
 * forward 2*BT*OC*IC per call, backward 4*BT*OC*IC (dinp and dW). */
static double time_matmuls(GPT2* m, int B, int T, MatmulTiming mt[2 * NUM_WEIGHTS]) {
    int C = m->config.channels, L = m->config.num_layers, Vp = m->config.padded_vocab_size, BT = B * T;
    const int oc[NUM_WEIGHTS] = {3 * C, C, 4 * C, C, Vp}, ic[NUM_WEIGHTS] = {C, C, C, 4 * C, C};
    double step_flops = 0.0;
    for (int k = 0; k < 2 * NUM_WEIGHTS; k++) {
        MatmulTiming* t = &mt[k];
        t->weight = k / 2;
        t->backward = k % 2;
        t->OC = oc[t->weight];
        t->IC = ic[t->weight];
        t->calls = t->weight == W_LM_HEAD ? 1 : L;
        t->ms = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = time_ms();
            for (int l = 0; l < t->calls; l++) matmul_call(m, BT, t->weight, l, t->backward);
            double ms = time_ms() - t0;
            if (ms < t->ms) t->ms = ms;
        }
        double flops = (t->backward ? 4.0 : 2.0) * BT * (double)t->OC * t->IC * t->calls;
        t->gflops = flops / (t->ms * 1e-3) / 1e9;
        step_flops += flops;
    }
    return step_flops;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s B T steps [num_layers]\n", argv[0]);
        return EXIT_FAILURE;
    }
    int B = atoi(argv[1]), T = atoi(argv[2]), steps = atoi(argv[3]);
    int L = argc > 4 ? atoi(argv[4]) : 12;
    CHECK(B > 0 && T > 0 && T <= 1024 && steps > 0 && L > 0, "bad arguments");
    GPT2Config c = config_from_depth(12);
    c.num_layers = L;
    GPT2 model;
    gpt2_init_random(&model, &c, 1337);
    gpt2_alloc_training(&model, B, T);
    int* x = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    int* y = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    Rng rng;
    rng_init(&rng, 42);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(rng_u32(&rng) % (uint32_t)c.vocab_size);
        y[i] = (int)(rng_u32(&rng) % (uint32_t)c.vocab_size);
    }
    /* BENCH_DUMP=DIR: the initial weights (DIR/model.bin, llm.c format) and the
     * batch (DIR/batch.bin: B*T int32 x, then y), so that scripts/bench/
     * bench_torch.py --from DIR computes its loss on the same weights and batch */
    const char* dump = getenv("BENCH_DUMP");
    if (dump && *dump) {
        char path[1024];
        snprintf(path, sizeof path, "%s/model.bin", dump);
        CHECK(gpt2_save(&model, path) == 0, "cannot write the BENCH_DUMP model");
        snprintf(path, sizeof path, "%s/batch.bin", dump);
        FILE* f = fopen(path, "wb");
        CHECK(f && fwrite(x, sizeof(int), (size_t)B * T, f) == (size_t)B * T &&
                  fwrite(y, sizeof(int), (size_t)B * T, f) == (size_t)B * T && fclose(f) == 0,
              "cannot write the BENCH_DUMP batch");
    }
    AdamWConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 0};
    double best = 1e30, fwd = 0, bwd = 0, upd = 0;
    double* times = (double*)xmalloc(sizeof(double) * (size_t)steps);
    for (int s = 0; s <= steps; s++) { /* step 0 is a warmup, not timed */
        double t0 = time_ms();
        float loss = gpt2_forward(&model, x, y, B, T);
        double t1 = time_ms();
        gpt2_zero_grad(&model);
        gpt2_backward(&model, 1.0f);
        double t2 = time_ms();
        double norm = gradients_clip(&model, 1.0);
        adamw_update(&model, &opt, 1e-4f, s + 1);
        double t3 = time_ms();
        printf("step %d: loss %.6f norm %.3f | forward %.0f ms, backward %.0f ms, clip+adamw %.0f ms, total %.0f ms\n",
               s, loss, norm, t1 - t0, t2 - t1, t3 - t2, t3 - t0);
        if (s > 0) times[s - 1] = t3 - t0;
        if (s > 0 && t3 - t0 < best) { best = t3 - t0; fwd = t1 - t0; bwd = t2 - t1; upd = t3 - t2; }
    }
    /* median, as bench_torch.py reports: robust to a disturbed step */
    for (int i = 1; i < steps; i++)
        for (int j = i; j > 0 && times[j - 1] > times[j]; j--) { double t = times[j]; times[j] = times[j - 1]; times[j - 1] = t; }
    double median = steps % 2 ? times[steps / 2] : 0.5 * (times[steps / 2 - 1] + times[steps / 2]);
    MatmulTiming mt[2 * NUM_WEIGHTS];
    double matmul_flops = time_matmuls(&model, B, T, mt), matmul_ms = 0.0;
    for (int k = 0; k < 2 * NUM_WEIGHTS; k++) matmul_ms += mt[k].ms;
    double P = (double)model.num_parameters;
    double flops = (double)B * T * (6.0 * P + 6.0 * L * c.channels * T);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("best step: forward %.0f ms, backward %.0f ms, clip+adamw %.0f ms\n", fwd, bwd, upd);
    for (int k = 0; k < 2 * NUM_WEIGHTS; k++)
        printf("gptc_matmul B=%d T=%d weight=%s pass=%s OC=%d IC=%d calls=%d ms=%.2f gflops=%.1f\n", B, T,
               weight_names[mt[k].weight], mt[k].backward ? "bwd" : "fwd", mt[k].OC, mt[k].IC, mt[k].calls,
               mt[k].ms, mt[k].gflops);
    printf("matmuls of one step replayed alone: %.0f ms, %.1f GFLOP/s\n", matmul_ms,
           matmul_flops / (matmul_ms * 1e-3) / 1e9);
    printf("gptc B=%d T=%d ms/step=%.1f gflops=%.1f peak_rss_gb=%.2f threads=%d best_ms=%.1f matmul_gflops=%.1f\n",
           B, T, median, flops / (median * 1e-3) / 1e9, ru.ru_maxrss / 1048576.0, num_threads(), best,
           matmul_flops / (matmul_ms * 1e-3) / 1e9);
    free(times);
    free(x);
    free(y);
    gpt2_free(&model);
    return 0;
}
