/*
 * profile_plan.c — where the runtime model (gptc/runtime.h) is right and
 * wrong: one training step of train_gpt.c replayed kernel by kernel (the
 * same calls, shapes and buffers as gpt2_forward, gpt2_backward, the clip
 * and AdamW), each phase timed, beside the model's prediction of that
 * phase from a calibration measured now.
 *
 *   make dev/cpu/profile_plan && dev/cpu/profile_plan L C NH V B T [reps]
 *
 * Phases: the layers' GEMMs forward and backward, the classifier's GEMM
 * forward and backward, attention, the memory-bound kernels (LayerNorm,
 * residual, GELU, encoder), the cross-entropy, the optimizer (zero_grad,
 * norm, AdamW). Each phase's time is the median over reps steps; one
 * thread per process unless OMP_NUM_THREADS says otherwise.
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"

enum { PH_GEMM_F, PH_GEMM_B, PH_HEAD_F, PH_HEAD_B, PH_ATT, PH_ELEM, PH_CE, PH_OPT, PH_N };
static const char* const ph_names[PH_N] = {"layer GEMMs fwd", "layer GEMMs bwd", "classifier fwd", "classifier bwd",
                                            "attention", "elementwise", "cross-entropy", "optimizer"};
static double ph[PH_N];
#define PH(k, stmt)                  \
    do {                             \
        double t0_ = time_ms();      \
        stmt;                        \
        ph[k] += time_ms() - t0_;    \
    } while (0)

static void replay_step(GPT2* m, const int* inputs, const int* targets, int B, int T, AdamWConfig* opt, int t) {
    const GPT2Config* cfg = &m->config;
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    ParameterTensors p = m->params, g = m->grads;
    ActivationTensors a = m->acts;
    BackwardScratch s = m->scratch;
    size_t BT = (size_t)B * T;
    PH(PH_OPT, gpt2_zero_grad(m));
    PH(PH_ELEM, encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C));
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        ActivationTensors al = layer_acts(m, l, B, T);
        PH(PH_ELEM, layernorm_forward(al.ln1, al.ln1_mean, al.ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C));
        PH(PH_GEMM_F, matmul_forward(al.qkv, al.ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C));
        PH(PH_ATT, attention_forward(al.atty, al.att, al.qkv, B, T, C, NH));
        PH(PH_GEMM_F, matmul_forward(al.residual2, al.atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, BT, C, C));
        PH(PH_ELEM, residual_forward(al.residual2, al.residual2, residual, BT * C));
        PH(PH_ELEM, layernorm_forward(al.ln2, al.ln2_mean, al.ln2_rstd, al.residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C));
        PH(PH_GEMM_F, matmul_forward(al.fch, al.ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C));
        PH(PH_ELEM, gelu_forward(al.fch_gelu, al.fch, BT * 4 * C));
        PH(PH_GEMM_F, matmul_forward(al.residual3, al.fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, BT, 4 * C, C));
        PH(PH_ELEM, residual_forward(al.residual3, al.residual3, al.residual2, BT * C));
    }
    const float* last = a.residual3 + (L - 1) * BT * C;
    PH(PH_ELEM, layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C));
    PH(PH_HEAD_F, matmul_forward(a.logits, a.lnf, p.wte, NULL, BT, C, Vp));
    PH(PH_CE, crossentropy_softmax_forward(a.logits, a.losses, targets, BT, V, Vp));
    PH(PH_CE, crossentropy_softmax_backward(a.logits, targets, BT, Vp, 1.0f / BT));
    PH(PH_HEAD_B, matmul_backward(s.dbt_c, g.wte, NULL, a.logits, a.lnf, p.wte, BT, C, Vp, 0));
    PH(PH_ELEM, memset(s.dresidual, 0, BT * C * sizeof(float)));
    PH(PH_ELEM, layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.dbt_c, last, p.lnfw, a.lnf_mean, a.lnf_rstd, BT, C));
    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        ActivationTensors al = layer_acts(m, l, B, T);
        ParameterTensors lg = layer_grads(m, l);
        PH(PH_GEMM_B, matmul_backward(s.dfch, lg.fcprojw, lg.fcprojb, s.dresidual, al.fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, BT, 4 * C, C, 0));
        PH(PH_ELEM, gelu_backward(s.dfch, al.fch, s.dfch, BT * 4 * C));
        PH(PH_GEMM_B, matmul_backward(s.dbt_c, lg.fcw, lg.fcb, s.dfch, al.ln2, p.fcw + (size_t)l * 4 * C * C, BT, C, 4 * C, 0));
        PH(PH_ELEM, layernorm_backward(s.dresidual, lg.ln2w, lg.ln2b, s.dbt_c, al.residual2, p.ln2w + l * C, al.ln2_mean, al.ln2_rstd, BT, C));
        PH(PH_GEMM_B, matmul_backward(s.dbt_c, lg.attprojw, lg.attprojb, s.dresidual, al.atty, p.attprojw + (size_t)l * C * C, BT, C, C, 0));
        PH(PH_ATT, attention_backward(s.dqkv, s.datt, s.dbt_c, al.qkv, al.att, B, T, C, NH));
        PH(PH_GEMM_B, matmul_backward(s.dbt_c, lg.qkvw, lg.qkvb, s.dqkv, al.ln1, p.qkvw + (size_t)l * 3 * C * C, BT, C, 3 * C, 0));
        PH(PH_ELEM, layernorm_backward(s.dresidual, lg.ln1w, lg.ln1b, s.dbt_c, residual, p.ln1w + l * C, al.ln1_mean, al.ln1_rstd, BT, C));
    }
    PH(PH_ELEM, encoder_backward(g.wte, g.wpe, s.dresidual, inputs, B, T, C));
    PH(PH_OPT, { double norm = gradients_clip(m, 1.0); (void)norm; adamw_update(m, opt, 1e-4f, t); });
}

static int cmp_double(const void* x, const void* y) {
    double a = *(const double*)x, b = *(const double*)y;
    return (a > b) - (a < b);
}

int main(int argc, char** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s L C NH V B T [reps]\n", argv[0]);
        return EXIT_FAILURE;
    }
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.num_layers = atoi(argv[1]);
    c.channels = atoi(argv[2]);
    c.num_heads = atoi(argv[3]);
    c.vocab_size = atoi(argv[4]);
    c.padded_vocab_size = round_up(c.vocab_size, 128);
    int B = atoi(argv[5]), T = atoi(argv[6]), reps = argc > 7 ? atoi(argv[7]) : 7;
    c.max_seq_len = T;
    CHECK(!config_problem(&c) && B > 0 && T > 0 && reps > 0, "bad arguments");
    Calibration cal;
    memset(&cal, 0, sizeof(cal));
    cal.C = c.channels;
    cal.NH = c.num_heads;
    cal.Vp = c.padded_vocab_size;
    cal.Tc = T < 128 ? T : 128;
    calib_compute(&cal, 1);
    cal.share = 1.0;
    GPT2 model;
    gpt2_init_random(&model, &c, 1337);
    gpt2_alloc_training(&model, B, T);
    int* x = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    int* y = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)((i * 2654435761u) % (uint32_t)c.vocab_size);
        y[i] = (int)((i * 40503u + 7) % (uint32_t)c.vocab_size);
    }
    AdamWConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 0};
    double* samples = (double*)xmalloc(sizeof(double) * (size_t)PH_N * reps);
    double* totals = (double*)xmalloc(sizeof(double) * (size_t)reps);
    replay_step(&model, x, y, B, T, &opt, 1); /* warm-up: pages touched */
    for (int r = 0; r < reps; r++) {
        memset(ph, 0, sizeof(ph));
        double t0 = time_ms();
        replay_step(&model, x, y, B, T, &opt, r + 2);
        totals[r] = time_ms() - t0;
        for (int k = 0; k < PH_N; k++) samples[k * reps + r] = ph[k];
    }
    CommKnobs one = comm_knobs_flat(1, 0, 0);
    StepTime st = runtime_step(&cal, &c, B, T, 1, &one);
    /* the model's phases (one micro-batch + the optimizer), split as the replay is */
    double N = (double)B * T, lf = 0, lb = 0;
    for (int k = 0; k < SHAPE_HEAD; k++) {
        lf += c.num_layers * cal.layer_factor * gemm_ms(&cal, 0, k, N);
        lb += c.num_layers * cal.layer_factor * gemm_ms(&cal, 1, k, N);
    }
    double model_ms[PH_N] = {lf, lb, gemm_ms(&cal, 0, SHAPE_HEAD, N), gemm_ms(&cal, 1, SHAPE_HEAD, N), st.attention,
                             st.elementwise, st.softmax, st.optimizer};
    printf("profile L=%d C=%d NH=%d Vp=%d B=%d T=%d (%d reps, %d thread(s)); calibration %.0f ms; model weights term %.2f ms "
           "(the fixed part of the GEMMs); the layers' kernels x %.3f (a layer inside the step over its kernels alone)\n",
           c.num_layers, c.channels, c.num_heads, c.padded_vocab_size, B, T, reps, num_threads(), cal.ms, st.weights,
           cal.layer_factor);
    printf("%-18s %10s %10s %8s %10s %8s\n", "phase", "median", "model", "error", "fastest", "error");
    double sum_meas = 0, sum_model = 0;
    for (int k = 0; k < PH_N; k++) {
        qsort(samples + k * reps, (size_t)reps, sizeof(double), cmp_double);
        double med = samples[k * reps + reps / 2], lo = samples[k * reps];
        sum_meas += med;
        sum_model += model_ms[k];
        printf("%-18s %10.2f %10.2f %+7.1f%% %10.2f %+7.1f%%\n", ph_names[k], med, model_ms[k],
               100 * (model_ms[k] - med) / med, lo, 100 * (model_ms[k] - lo) / lo);
    }
    qsort(totals, (size_t)reps, sizeof(double), cmp_double);
    printf("%-18s %10.2f %10.2f %+7.1f%%  (model incl. weights term %.2f: step %.2f)\n", "sum of phases", sum_meas,
           sum_model, 100 * (sum_model - sum_meas) / sum_meas, st.weights, st.idle);
    printf("%-18s %10.2f\n", "replayed step", totals[reps / 2]);
    free(samples);
    free(totals);
    free(x);
    free(y);
    gpt2_free(&model);
    return 0;
}
