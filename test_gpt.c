/*
 * test_gpt.c — proves the numbers of train_gpt.c.
 *
 *   make test                 # builds and runs this against the committed tiny fixture
 *   ./test_gpt --ref MODEL REF  # also check a reference written by scripts/gpt2_reference.py
 *   ./test_gpt --default-run DIR  # also check what `make train` left in DIR
 *   ./test_gpt --hf DIR           # only the Hugging Face checks, against scripts/hf_reference.py's DIR
 *
 * What is checked, and against what:
 *   - logits, loss, every parameter gradient and 10 AdamW steps against a
 *     PyTorch reference computed in float64 (scripts/gpt2_reference.py);
 *   - every parameter tensor's gradient against central finite differences
 *     of a second, independent float64 forward pass written below;
 *   - the GEMM against a float64 triple loop, for awkward sizes and all
 *     transposes; results bitwise independent of the thread count;
 *   - save/load round trips, bf16 checkpoints, the data loader, schedules,
 *     the random init, the CLI, and every kind of bad input (each must give
 *     its error, not a crash; run `make test-asan` for the sanitizers);
 *   - the checker itself, with one planted wrong value it must reject.
 * Exits non-zero on any failure; the last line is "N passed, N failed".
 */
#define GPTC_NO_MAIN
#include "train_gpt.c"
#include <sys/wait.h>

#include "test_common.h"

/* Everything the PyTorch reference pins down. `quick` skips the steps
 * beyond `max_steps` (for the large model). */
static void test_against_reference(const char* model_path, const char* ref_path, const char* label, int max_steps) {
    char what[256];
    GPT2 model;
    Reference ref;
    if (gpt2_load(&model, model_path) != 0 || reference_read(&ref, ref_path) != 0) {
        snprintf(what, sizeof(what), "%s: load model and reference", label);
        check(0, what, model_path);
        return;
    }
    int B = ref.B, T = ref.T, Vp = model.config.padded_vocab_size;
    size_t BT = (size_t)B * T;
    snprintf(what, sizeof(what), "%s: reference matches the model (P=%lld, Vp=%d)", label, ref.P, ref.Vp);
    check(ref.P == (long long)model.num_parameters && ref.Vp == Vp && ref.V == model.config.vocab_size, what, "");
    if (ref.P != (long long)model.num_parameters) { reference_free(&ref); gpt2_free(&model); return; }
    gpt2_alloc_training(&model, B, T);

    /* logits: forward without targets keeps them raw */
    gpt2_forward(&model, ref.x, NULL, B, T);
    snprintf(what, sizeof(what), "%s: logits (B=%d T=%d Vp=%d)", label, B, T, Vp);
    check_close(what, model.acts.logits, ref.logits, BT * Vp, 1e-5);

    /* loss and gradients */
    float loss = gpt2_forward(&model, ref.x, ref.y, B, T);
    snprintf(what, sizeof(what), "%s: loss %.7f vs %.7f", label, loss, ref.loss);
    check(fabs(loss - ref.loss) <= 1e-5 * fabs(ref.loss), what, "");
    gpt2_zero_grad(&model);
    gpt2_backward(&model, 1.0f);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        snprintf(what, sizeof(what), "%s: gradient %s", label, PARAMETER_NAMES[i]);
        check_close(what, model.grads_memory + off, ref.grads + off, model.param_sizes[i], 1e-4);
        off += model.param_sizes[i];
    }

    /* AdamW steps with clipping, weight decay and the warmup + cosine schedule */
    int steps = ref.steps < max_steps ? ref.steps : max_steps;
    LRSchedule sched;
    sched.kind = SCHEDULE_COSINE;
    sched.max_lr = ref.lr;
    sched.warmup_steps = ref.warmup;
    sched.total_steps = ref.steps;
    sched.final_frac = ref.final_lr_frac;
    sched.decay_frac = 0.0;
    AdamWConfig opt;
    opt.beta1 = ref.beta1; opt.beta2 = ref.beta2; opt.eps = ref.eps;
    opt.weight_decay = ref.weight_decay; opt.decay_all = 0;
    float* losses = xmalloc_floats((size_t)steps);
    float* norms = xmalloc_floats((size_t)steps);
    float* init_params = xmalloc_floats(model.num_parameters);
    memcpy(init_params, model.params_memory, model.num_parameters * sizeof(float));
    for (int s = 0; s < steps; s++) {
        losses[s] = gpt2_forward(&model, ref.x, ref.y, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model, 1.0f);
        norms[s] = (float)gradients_clip(&model, ref.grad_clip);
        adamw_update(&model, &opt, (float)lr_at(&sched, s), s + 1);
    }
    snprintf(what, sizeof(what), "%s: losses of %d AdamW steps", label, steps);
    check_close(what, losses, ref.losses, (size_t)steps, 1e-5);
    snprintf(what, sizeof(what), "%s: gradient norms of %d AdamW steps", label, steps);
    check_close(what, norms, ref.norms, (size_t)steps, 1e-5);
    if (steps == ref.steps) {
        /* Final weights, measured as the error of the total update, per tensor:
         * ||got - want|| / ||want - init|| (L2). Elementwise comparison is the
         * wrong yardstick here: AdamW divides each element's step by that
         * element's own gradient scale (m / sqrt(v)), so an element whose
         * gradient is at the fp32 round-off level (the key bias's gradient is
         * exactly zero in exact arithmetic; among 124M elements many are tiny)
         * can move by a whole step ~lr in either direction. Such elements are
         * rare, so the update as a whole is still pinned tightly; a wrong
         * optimizer (bias correction, decay, clipping) is off by ~100%. The
         * losses above, to 1e-5, are the tight end-to-end check. */
        /* The key bias, qkvb[l, C:2C], is nothing but round-off: it is held only
         * to the bound of what AdamW can move it, sum_t lr_t, and left out of
         * qkvb's norm below. */
        int C = model.config.channels;
        double lr_sum = 0.0, key_worst = 0.0;
        for (int s = 0; s < steps; s++) lr_sum += lr_at(&sched, s);
        size_t qkvb_off = 0;
        for (int i = 0; i < 5; i++) qkvb_off += model.param_sizes[i];
        for (int l = 0; l < model.config.num_layers; l++)
            for (int c = 0; c < C; c++) {
                size_t j = qkvb_off + (size_t)l * 3 * C + C + c;
                double e = fabs((double)model.params_memory[j] - ref.final_params[j]);
                if (e > key_worst) key_worst = e; /* not fmax: gcc 12's aarch64 vectoriser fails on that reduction */
                model.params_memory[j] = ref.final_params[j];
            }
        char key_detail[160];
        snprintf(key_detail, sizeof(key_detail), "max |error| %.2e, bound sum of lr = %.2e", key_worst, lr_sum);
        snprintf(what, sizeof(what), "%s: key bias after %d steps (zero gradient: round-off only)", label, steps);
        check(key_worst <= lr_sum, what, key_detail);
        double worst = -1.0;
        char worst_detail[300] = "";
        off = 0;
        for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
            double err = 0.0, upd = 0.0;
            for (size_t j = off; j < off + model.param_sizes[i]; j++) {
                double d = (double)model.params_memory[j] - ref.final_params[j];
                double u = (double)ref.final_params[j] - init_params[j];
                err += d * d;
                upd += u * u;
            }
            double rel = upd > 0.0 ? sqrt(err / upd) : sqrt(err);
            if (getenv("GPTC_VERBOSE")) printf("     %s %.2e\n", PARAMETER_NAMES[i], rel);
            if (!(rel <= worst)) {
                worst = rel;
                snprintf(worst_detail, sizeof(worst_detail), "worst %s: ||error|| / ||update|| = %.2e (tol 1e-4)",
                         PARAMETER_NAMES[i], rel);
            }
            off += model.param_sizes[i];
        }
        snprintf(what, sizeof(what), "%s: weights after %d AdamW steps", label, steps);
        check(worst <= 1e-4, what, worst_detail);
    }
    free(init_params);
    free(losses);
    free(norms);
    reference_free(&ref);
    gpt2_free(&model);
}

/* ---------------------------------------------------------------------- */
/* A second forward pass, in double, for finite differences               */
/* ---------------------------------------------------------------------- */
/* Written independently of the layers in train_gpt.c: plain loops, one
 * position at a time, no GEMM, no stored activations. */
static double ref_layernorm(double* out, const double* x, const double* w, const double* b, int C) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= C;
    double s = 1.0 / sqrt(v + 1e-5);
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * w[c] + b[c];
    return s;
}

/* y(OC) = W(OC, IN) x(IN) + b */
static void ref_linear(double* y, const double* x, const double* W, const double* b, int IN, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < IN; i++) s += W[(size_t)o * IN + i] * x[i];
        y[o] = s;
    }
}

/* Mean cross-entropy of the model `p` (all params as doubles, file order). */
static double ref_loss(const GPT2Config* cfg, const double* p, const int* x, const int* y, int B, int T) {
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, V = cfg->vocab_size;
    int hs = C / NH, maxT = cfg->max_seq_len, Vp = cfg->padded_vocab_size;
    const double* wte = p;
    const double* wpe = wte + (size_t)Vp * C;
    const double* ln1w = wpe + (size_t)maxT * C;
    const double* ln1b = ln1w + (size_t)L * C;
    const double* qkvw = ln1b + (size_t)L * C;
    const double* qkvb = qkvw + (size_t)L * 3 * C * C;
    const double* apw = qkvb + (size_t)L * 3 * C;
    const double* apb = apw + (size_t)L * C * C;
    const double* ln2w = apb + (size_t)L * C;
    const double* ln2b = ln2w + (size_t)L * C;
    const double* fcw = ln2b + (size_t)L * C;
    const double* fcb = fcw + (size_t)L * 4 * C * C;
    const double* fpw = fcb + (size_t)L * 4 * C;
    const double* fpb = fpw + (size_t)L * C * 4 * C;
    const double* lnfw = fpb + (size_t)L * C;
    const double* lnfb = lnfw + C;
    double* h = (double*)xmalloc(sizeof(double) * (size_t)T * C);      /* residual stream of one sequence */
    double* qkv = (double*)xmalloc(sizeof(double) * (size_t)T * 3 * C);
    double* buf = (double*)xmalloc(sizeof(double) * (size_t)4 * C);
    double* buf2 = (double*)xmalloc(sizeof(double) * (size_t)4 * C);
    double* logit = (double*)xmalloc(sizeof(double) * (size_t)V);
    double* attv = (double*)xmalloc(sizeof(double) * (size_t)T * C);
    double total = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                h[t * C + c] = wte[(size_t)x[b * T + t] * C + c] + wpe[(size_t)t * C + c];
        for (int l = 0; l < L; l++) {
            for (int t = 0; t < T; t++) {
                ref_layernorm(buf, h + t * C, ln1w + l * C, ln1b + l * C, C);
                ref_linear(qkv + (size_t)t * 3 * C, buf, qkvw + (size_t)l * 3 * C * C, qkvb + l * 3 * C, C, 3 * C);
            }
            for (int t = 0; t < T; t++) {
                for (int hh = 0; hh < NH; hh++) {
                    const double* q = qkv + (size_t)t * 3 * C + hh * hs;
                    double w[4096];
                    double mx = -1e300, sum = 0.0;
                    ALWAYS(T <= 4096);
                    for (int t2 = 0; t2 <= t; t2++) {
                        const double* k = qkv + (size_t)t2 * 3 * C + C + hh * hs;
                        double d = 0;
                        for (int i = 0; i < hs; i++) d += q[i] * k[i];
                        w[t2] = d / sqrt((double)hs);
                        mx = fmax(mx, w[t2]);
                    }
                    for (int t2 = 0; t2 <= t; t2++) { w[t2] = exp(w[t2] - mx); sum += w[t2]; }
                    for (int i = 0; i < hs; i++) {
                        double s = 0;
                        for (int t2 = 0; t2 <= t; t2++) s += w[t2] / sum * qkv[(size_t)t2 * 3 * C + 2 * C + hh * hs + i];
                        attv[t * C + hh * hs + i] = s;
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                ref_linear(buf, attv + t * C, apw + (size_t)l * C * C, apb + l * C, C, C);
                for (int c = 0; c < C; c++) h[t * C + c] += buf[c];
                ref_layernorm(buf, h + t * C, ln2w + l * C, ln2b + l * C, C);
                ref_linear(buf2, buf, fcw + (size_t)l * 4 * C * C, fcb + l * 4 * C, C, 4 * C);
                for (int i = 0; i < 4 * C; i++) {
                    double u = buf2[i];
                    buf2[i] = 0.5 * u * (1.0 + tanh(sqrt(2.0 / M_PI) * (u + 0.044715 * u * u * u)));
                }
                ref_linear(buf, buf2, fpw + (size_t)l * C * 4 * C, fpb + l * C, 4 * C, C);
                for (int c = 0; c < C; c++) h[t * C + c] += buf[c];
            }
        }
        for (int t = 0; t < T; t++) {
            ref_layernorm(buf, h + t * C, lnfw, lnfb, C);
            ref_linear(logit, buf, wte, NULL, C, V); /* only the V real rows */
            double mx = -1e300, sum = 0.0;
            for (int v = 0; v < V; v++) mx = fmax(mx, logit[v]);
            for (int v = 0; v < V; v++) sum += exp(logit[v] - mx);
            total += mx + log(sum) - logit[y[b * T + t]];
        }
    }
    free(h); free(qkv); free(buf); free(buf2); free(logit); free(attv);
    return total / (B * T);
}

static void test_finite_differences(const char* model_path) {
    GPT2 model;
    if (gpt2_load(&model, model_path) != 0) { check(0, "finite differences: load", model_path); return; }
    const GPT2Config* cfg = &model.config;
    int B = 2, T = 5, V = cfg->vocab_size;
    int x[10], y[10];
    Rng rng;
    rng_init(&rng, 7);
    for (int i = 0; i < B * T; i++) { x[i] = (int)(rng_u32(&rng) % V); y[i] = (int)(rng_u32(&rng) % V); }
    gpt2_alloc_training(&model, B, T);
    float loss = gpt2_forward(&model, x, y, B, T);
    gpt2_zero_grad(&model);
    gpt2_backward(&model, 1.0f);
    size_t n = model.num_parameters;
    double* p = (double*)xmalloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) p[i] = model.params_memory[i];
    double ref = ref_loss(cfg, p, x, y, B, T);
    char what[256], detail[256];
    snprintf(detail, sizeof(detail), "fp32 %.9f vs float64 %.9f", loss, ref);
    check(fabs(loss - ref) <= 1e-5 * fabs(ref), "finite differences: the float64 forward agrees on the loss", detail);
    /* For each tensor: its largest-gradient element and 3 random ones.
     * Central differences with h = 1e-4 in double: truncation error ~h^2,
     * round-off ~1e-16/h, both far below the 1e-4 tolerance. */
    size_t off = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        size_t sz = model.param_sizes[k];
        const float* g = model.grads_memory + off;
        double gmax = 0.0;
        size_t imax = 0;
        for (size_t i = 0; i < sz; i++) if (fabs(g[i]) > gmax) { gmax = fabs(g[i]); imax = i; }
        if (k == 0) sz = (size_t)V * cfg->channels; /* never probe pad rows with random picks */
        size_t picks[4] = {imax, rng_u32(&rng) % sz, rng_u32(&rng) % sz, rng_u32(&rng) % sz};
        double worst = 0.0;
        size_t worst_i = 0;
        double worst_fd = 0.0;
        for (int j = 0; j < 4; j++) {
            size_t i = off + picks[j];
            double h = 1e-4, save = p[i];
            p[i] = save + h;
            double lp = ref_loss(cfg, p, x, y, B, T);
            p[i] = save - h;
            double lm = ref_loss(cfg, p, x, y, B, T);
            p[i] = save;
            double fd = (lp - lm) / (2 * h);
            double e = fabs(fd - model.grads_memory[i]) / fmax(gmax, 1e-12);
            if (e >= worst) { worst = e; worst_i = picks[j]; worst_fd = fd; }
        }
        snprintf(what, sizeof(what), "finite differences: %s", PARAMETER_NAMES[k]);
        snprintf(detail, sizeof(detail), "worst err %.2e of max|grad| %.3g at [%zu]: analytic %.9g, fd %.9g",
                 worst, gmax, worst_i, g[worst_i], worst_fd);
        check(gmax > 0.0 && worst <= 1e-4, what, detail);
        off += model.param_sizes[k];
    }
    free(p);
    gpt2_free(&model);
}

/* ---------------------------------------------------------------------- */
/* GEMM                                                                   */
/* ---------------------------------------------------------------------- */
static void test_gemm(void) {
    const int sizes[] = {1, 3, 7, 16, 17, 33, 64, 65, 130};
    const int ns = (int)(sizeof(sizes) / sizeof(sizes[0]));
    Rng rng;
    rng_init(&rng, 3);
    double worst = 0.0;
    char detail[256] = "";
    int cases = 0;
    for (int mi = 0; mi < ns; mi++)
        for (int ni = 0; ni < ns; ni += 2)
            for (int ki = 0; ki < ns; ki += 3)
                for (int ta = 0; ta < 2; ta++)
                    for (int tb = 0; tb < 2; tb++) {
                        int M = sizes[mi], N = sizes[(ni + mi) % ns], K = sizes[(ki + 2 * mi) % ns];
                        int acc = (mi + ni + ki) & 1, threaded = (mi + ki) & 1;
                        float* A = xmalloc_floats((size_t)M * K);
                        float* Bm = xmalloc_floats((size_t)K * N);
                        float* Cm = xmalloc_floats((size_t)M * (N + 3));
                        for (int i = 0; i < M * K; i++) A[i] = rng_uniform(&rng) - 0.5f;
                        for (int i = 0; i < K * N; i++) Bm[i] = rng_uniform(&rng) - 0.5f;
                        for (int i = 0; i < M * (N + 3); i++) Cm[i] = rng_uniform(&rng) - 0.5f;
                        long ldc = N + 3; /* a stride wider than the row */
                        long a_rs = ta ? 1 : K, a_cs = ta ? M : 1;
                        long b_rs = tb ? 1 : N, b_cs = tb ? K : 1;
                        double* want = (double*)xmalloc(sizeof(double) * (size_t)M * N);
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < N; j++) {
                                double s = acc ? Cm[i * ldc + j] : 0.0;
                                for (int k = 0; k < K; k++) s += (double)A[i * a_rs + k * a_cs] * Bm[k * b_rs + j * b_cs];
                                want[(size_t)i * N + j] = s;
                            }
                        float pad = Cm[N]; /* element just past row 0: must be untouched */
                        gemm(M, N, K, A, a_rs, a_cs, Bm, b_rs, b_cs, Cm, ldc, acc, threaded);
                        for (int i = 0; i < M; i++)
                            for (int j = 0; j < N; j++) {
                                double e = fabs(Cm[i * ldc + j] - want[(size_t)i * N + j]) / sqrt((double)K + 1);
                                if (e > worst || !isfinite(Cm[i * ldc + j])) {
                                    worst = isfinite(Cm[i * ldc + j]) ? e : INFINITY;
                                    snprintf(detail, sizeof(detail), "worst %.2e at M=%d N=%d K=%d ta=%d tb=%d acc=%d", worst, M, N, K, ta, tb, acc);
                                }
                            }
                        if (Cm[N] != pad) { worst = INFINITY; snprintf(detail, sizeof(detail), "wrote past the row at M=%d N=%d", M, N); }
                        cases++;
                        free(A); free(Bm); free(Cm); free(want);
                    }
    char what[128];
    snprintf(what, sizeof(what), "gemm: %d shapes x transposes x accumulate vs float64", cases);
    check(worst <= 1e-6, what, detail);
}

/* exp_fast against libm's exp in double, over the range the softmaxes and
 * the GELU use: within 3 ulp (3 * 2^-23 relative). */
static void test_exp_fast(void) {
    double worst = 0.0;
    float at = 0.0f;
    for (int i = 0; i <= 2000000; i++) {
        float x = -87.0f + 175.0f * (float)i / 2000000.0f;
        double want = exp((double)x);
        double e = fabs((double)exp_fast(x) - want) / want;
        if (e > worst) { worst = e; at = x; }
    }
    char detail[128];
    snprintf(detail, sizeof(detail), "worst rel err %.2e at x = %.6g (3 ulp = %.2e)", worst, at, 3.0 / 8388608.0);
    check(worst <= 3.0 / 8388608.0 && exp_fast(-1000.0f) < 1e-37f && exp_fast(0.0f) == 1.0f,
          "exp_fast: e^x within 3 ulp on [-87, 88]", detail);
    /* a NaN (a diverged run: --lr 1e20) must come out as NaN, without
     * undefined behaviour on the way (the UBSan build checks that) */
    volatile float nan_in = NAN, huge = 3e38f, inf = INFINITY;
    check(isnan(exp_fast(nan_in)) && isnan(exp_fast(-nan_in)) && isfinite(exp_fast(huge)) && exp_fast(huge) > 1e38f &&
              exp_fast(-inf) < 1e-37f && exp_fast(inf) > 1e38f,
          "exp_fast: NaN in, NaN out; +-huge and +-inf clamped", "");
}

/* Forward and backward give bitwise the same results on 1 and on all threads. */
static void test_thread_invariance(const char* model_path) {
#ifdef _OPENMP
    int nt = omp_get_max_threads();
    GPT2 model;
    if (gpt2_load(&model, model_path) != 0) { check(0, "thread invariance: load", model_path); return; }
    int B = 2, T = 9, V = model.config.vocab_size;
    int x[18], y[18];
    for (int i = 0; i < B * T; i++) { x[i] = (i * 37 + 11) % V; y[i] = (i * 53 + 5) % V; }
    gpt2_alloc_training(&model, B, T);
    float* g1 = xmalloc_floats(model.num_parameters);
    float l[2];
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : (nt > 1 ? nt : 2));
        l[run] = gpt2_forward(&model, x, y, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model, 1.0f);
        if (run == 0) memcpy(g1, model.grads_memory, model.num_parameters * sizeof(float));
    }
    omp_set_num_threads(nt);
    int same = l[0] == l[1] && memcmp(g1, model.grads_memory, model.num_parameters * sizeof(float)) == 0;
    check(same, "forward+backward bitwise identical on 1 thread and on several", "");
    free(g1);
    gpt2_free(&model);
#else
    (void)model_path;
    printf("skip thread invariance: this build has no OpenMP (one thread only), nothing to compare\n");
#endif
}

/* ---------------------------------------------------------------------- */
/* Files: round trips and bad input                                       */
/* ---------------------------------------------------------------------- */
static char tmpdir[256];

static const char* tmp_path(const char* name) {
    static char buf[8][512];
    static int next = 0;
    char* p = buf[next++ % 8];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static int write_bytes(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static void test_model_files(const char* model_path) {
    GPT2 a, b;
    if (gpt2_load(&a, model_path) != 0) { check(0, "model files: load", model_path); return; }
    const char* out = tmp_path("roundtrip.bin");
    check(gpt2_save(&a, out) == 0, "save a checkpoint", out);
    size_t n1, n2;
    unsigned char* f1 = read_all(model_path, &n1);
    unsigned char* f2 = read_all(out, &n2);
    check(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0, "load -> save reproduces the file byte for byte", "");
    check(gpt2_load(&b, out) == 0 && memcmp(&a.config, &b.config, sizeof(GPT2Config)) == 0 &&
              memcmp(a.params_memory, b.params_memory, a.num_parameters * 4) == 0,
          "save -> load gives bit-identical parameters", "");
    gpt2_free(&b);

    /* bf16 (version 5): round-to-nearest-even of each weight, then load */
    size_t n = a.num_parameters;
    uint16_t* half = (uint16_t*)xmalloc(2 * n);
    float* expect = xmalloc_floats(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &a.params_memory[i], 4);
        bits += 0x7FFF + ((bits >> 16) & 1);
        half[i] = (uint16_t)(bits >> 16);
        expect[i] = bf16_to_float(half[i]);
    }
    int32_t h[256];
    memcpy(h, f1, sizeof(h));
    h[1] = MODEL_VERSION_BF16;
    const char* bf = tmp_path("bf16.bin");
    FILE* f = fopen(bf, "wb");
    CHECK(f != NULL, "cannot write %s", bf);
    CHECK(fwrite(h, 4, 256, f) == 256 && fwrite(half, 2, n, f) == n && fclose(f) == 0, "write %s", bf);
    int ok = gpt2_load(&b, bf) == 0 && memcmp(b.params_memory, expect, n * 4) == 0;
    check(ok, "bf16 (version 5) checkpoint loads as the exact bf16 values", "");
    if (ok) gpt2_free(&b);
    free(half);
    free(expect);

    /* bad inputs: each must be refused with -1, not crash */
    struct { const char* name; int word; int32_t value; long long truncate; } bad[] = {
        {"wrong magic", 0, 12345, 0},
        {"unknown version", 1, 4, 0},
        {"heads not dividing channels", 5, 5, 0},
        {"zero layers", 4, 0, 0},
        {"negative vocabulary", 3, -1, 0},
        {"padded vocabulary smaller than vocabulary", 7, 100, 0},
        {"huge layer count", 4, 1 << 30, 0},
        {"truncated weights", -1, 0, 1000},
        {"header only", -1, 0, (long long)n1 - 1024},
        {"half a header", -1, 0, (long long)n1 - 512},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        unsigned char* copy = (unsigned char*)xmalloc(n1);
        memcpy(copy, f1, n1);
        if (bad[i].word >= 0) memcpy(copy + 4 * bad[i].word, &bad[i].value, 4);
        const char* p = tmp_path("bad_model.bin");
        CHECK(write_bytes(p, copy, n1 - (size_t)bad[i].truncate) == 0, "write %s", p);
        char what[128];
        snprintf(what, sizeof(what), "bad model file refused: %s", bad[i].name);
        GPT2 m;
        int rc = gpt2_load(&m, p);
        if (rc == 0) gpt2_free(&m);
        check(rc == -1, what, "");
        free(copy);
    }
    /* a NaN weight */
    {
        unsigned char* copy = (unsigned char*)xmalloc(n1);
        memcpy(copy, f1, n1);
        float nan_value = NAN;
        memcpy(copy + 1024 + 4 * 10, &nan_value, 4);
        const char* p = tmp_path("nan_model.bin");
        CHECK(write_bytes(p, copy, n1) == 0, "write %s", p);
        GPT2 m;
        int rc = gpt2_load(&m, p);
        if (rc == 0) gpt2_free(&m);
        check(rc == -1, "bad model file refused: NaN weight", "");
        free(copy);
    }
    GPT2 m;
    check(gpt2_load(&m, tmp_path("does_not_exist.bin")) == -1, "bad model file refused: missing file", "");
    /* a good checkpoint is not overwritten by a failed save */
    const char* dir_as_file = tmp_path("is_a_dir");
    mkdir(dir_as_file, 0755);
    char target[600];
    snprintf(target, sizeof(target), "%s/sub/none.bin", dir_as_file);
    check(gpt2_save(&a, target) == -1, "save into a missing directory fails cleanly", "");
    free(f1);
    free(f2);
    gpt2_free(&a);
}

static void test_dataloader(void) {
    int V = 50, T = 4;
    write_shard(tmp_path("d_train_000.bin"), 101, V, 0, SHARD_MAGIC, 1, 101);
    write_shard(tmp_path("d_train_001.bin"), 61, V, 3, SHARD_MAGIC, 1, 61);
    char pattern[600];
    snprintf(pattern, sizeof(pattern), "%s/d_train_*.bin", tmpdir);
    DataLoader one, r0, r1;
    /* world 1, B = 4 against world 2 with B = 2 each: same tokens */
    int ok = dataloader_init(&one, pattern, 4, T, 0, 1, V, 0, 0) == 0 &&
             dataloader_init(&r0, pattern, 2, T, 0, 2, V, 0, 0) == 0 &&
             dataloader_init(&r1, pattern, 2, T, 1, 2, V, 0, 0) == 0;
    check(ok, "data loader opens two shards", "");
    if (!ok) return;
    int same = 1, targets_shifted = 1;
    for (int step = 0; step < 12; step++) {
        dataloader_next(&one);
        dataloader_next(&r0);
        dataloader_next(&r1);
        for (int i = 0; i < 2 * T; i++) {
            same &= one.inputs[i] == r0.inputs[i] && one.targets[i] == r0.targets[i];
            same &= one.inputs[2 * T + i] == r1.inputs[i] && one.targets[2 * T + i] == r1.targets[i];
        }
        /* without shuffling a batch is contiguous text: target t = input t+1 */
        for (int i = 0; i + 1 < 4 * T; i++) targets_shifted &= one.targets[i] == one.inputs[i + 1];
    }
    check(same, "2 ranks x B/2 read exactly what 1 rank x B reads, over shard and epoch boundaries", "");
    check(targets_shifted, "targets are the inputs shifted by one token", "");
    /* 100 samples of T=4 in shard 0 -> 25 samples, 6 batches of 4; shard 1: 60/4 = 15 -> 3 */
    check(dataloader_batches_per_epoch(&one) == 6 + 3, "batches per epoch counted per shard", "");
    /* the first batch of shard 0 is tokens 0..16 of the formula */
    int first_ok = 1;
    dataloader_reset(&one);
    dataloader_next(&one);
    for (int i = 0; i < 4 * T; i++) first_ok &= one.inputs[i] == (i * 7) % V && one.targets[i] == ((i + 1) * 7) % V;
    check(first_ok, "first batch holds the shard's first tokens", "");
    dataloader_free(&one);
    dataloader_free(&r0);
    dataloader_free(&r1);

    /* shuffling: deterministic for a seed, a permutation of the same samples */
    DataLoader s1, s2, plain;
    dataloader_init(&s1, pattern, 1, T, 0, 1, V, 1, 42);
    dataloader_init(&s2, pattern, 1, T, 0, 1, V, 1, 42);
    dataloader_init(&plain, pattern, 1, T, 0, 1, V, 0, 0);
    int det = 1, differs = 0;
    long long sum_s = 0, sum_p = 0;
    for (int i = 0; i < 40; i++) { /* one epoch: 25 + 15 samples */
        dataloader_next(&s1);
        dataloader_next(&s2);
        dataloader_next(&plain);
        for (int t = 0; t < T; t++) {
            det &= s1.inputs[t] == s2.inputs[t];
            differs |= s1.inputs[t] != plain.inputs[t];
            sum_s += s1.inputs[t] * 131 + s1.targets[t];
            sum_p += plain.inputs[t] * 131 + plain.targets[t];
        }
    }
    check(det && differs && sum_s == sum_p, "shuffle: seeded, reproducible, a permutation of the epoch's samples", "");
    dataloader_free(&s1);
    dataloader_free(&s2);
    dataloader_free(&plain);

    /* Every epoch its own order, and a seek (resume) to any position reads
     * what the uninterrupted loader reads from there: one shard, where the
     * next epoch's first shard is always the one loaded, and two. */
    for (int pi = 0; pi < 2; pi++) {
        char pat[600];
        snprintf(pat, sizeof(pat), pi == 0 ? "%s/d_train_000.bin" : "%s/d_train_*.bin", tmpdir);
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            DataLoader run, re;
            dataloader_init(&run, pat, 2, T, 0, 1, V, shuffle, 7);
            long long per_epoch = dataloader_batches_per_epoch(&run);
            int nsteps = (int)(3 * per_epoch);
            int* seen = (int*)xmalloc(sizeof(int) * (size_t)nsteps * 2 * T);
            int* ep = (int*)xmalloc(sizeof(int) * (size_t)(nsteps + 1) * 3);
            long long* cur = (long long*)xmalloc(sizeof(long long) * (size_t)(nsteps + 1));
            for (int s = 0; s < nsteps; s++) {
                ep[3 * s] = run.epoch; ep[3 * s + 1] = run.shard_pos; cur[s] = run.cursor;
                dataloader_next(&run);
                memcpy(seen + (size_t)s * 2 * T, run.inputs, sizeof(int) * 2 * T);
            }
            /* epoch 0 against epoch 1, batch by batch */
            int epochs_differ = memcmp(seen, seen + (size_t)per_epoch * 2 * T,
                                       sizeof(int) * (size_t)per_epoch * 2 * T) != 0;
            int resumed_same = 1;
            for (int s = 0; s < nsteps && resumed_same; s++) {
                dataloader_init(&re, pat, 2, T, 0, 1, V, shuffle, 7);
                resumed_same &= dataloader_seek(&re, ep[3 * s], ep[3 * s + 1], cur[s]) == 0;
                for (int k = s; k < nsteps && resumed_same; k++) {
                    dataloader_next(&re);
                    resumed_same &= memcmp(re.inputs, seen + (size_t)k * 2 * T, sizeof(int) * 2 * T) == 0;
                }
                dataloader_free(&re);
            }
            char what[200];
            snprintf(what, sizeof(what), "%d shard(s), shuffle %d: a seek to each of %d steps (3 epochs) reads "
                     "what the uninterrupted loader reads", 1 + pi, shuffle, nsteps);
            check(resumed_same, what, "");
            snprintf(what, sizeof(what), "%d shard(s), shuffle %d: epochs 0 and 1 %s", 1 + pi, shuffle,
                     shuffle ? "come in different orders" : "come in the same order");
            check(epochs_differ == shuffle, what, "");
            free(seen); free(ep); free(cur);
            dataloader_free(&run);
        }
    }

    /* bad shards */
    struct { const char* name; int n; int32_t magic; int version; int claimed; int V; } bad[] = {
        {"wrong magic", 100, 20240326, 1, 100, 50},
        {"wrong version", 100, SHARD_MAGIC, 2, 100, 50},
        {"header claims more tokens than the file holds", 100, SHARD_MAGIC, 1, 101, 50},
        {"header claims fewer tokens", 100, SHARD_MAGIC, 1, 99, 50},
        {"negative token count", 100, SHARD_MAGIC, 1, -5, 50},
        {"token out of the model's vocabulary", 100, SHARD_MAGIC, 1, 100, 60},
        {"too few tokens for one batch", 8, SHARD_MAGIC, 1, 8, 50},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char* p = tmp_path("bad_shard.bin");
        write_shard(p, bad[i].n, bad[i].V, 0, bad[i].magic, bad[i].version, bad[i].claimed);
        DataLoader d;
        int rc = dataloader_init(&d, p, 2, T, 0, 1, 50, 0, 0);
        if (rc == 0) dataloader_free(&d);
        char what[128];
        snprintf(what, sizeof(what), "bad shard refused: %s", bad[i].name);
        check(rc == -1, what, "");
    }
    const char* empty = tmp_path("empty_shard.bin");
    write_bytes(empty, "", 0);
    DataLoader d;
    check(dataloader_init(&d, empty, 2, T, 0, 1, 50, 0, 0) == -1, "bad shard refused: empty file", "");
    check(dataloader_init(&d, tmp_path("nothing_*.bin"), 2, T, 0, 1, 50, 0, 0) == -1,
          "bad shard refused: pattern matching no file", "");
}

static void test_tokenizer_file(void) {
    /* 258 tokens: the 256 single bytes, "bc" and "<eot>" (the end-of-text id) */
    int32_t h[256];
    memset(h, 0, sizeof(h));
    h[0] = TOKENIZER_MAGIC; h[1] = TOKENIZER_VERSION; h[2] = 258; h[3] = 257;
    size_t n = 1024;
    unsigned char* file = (unsigned char*)xmalloc(1024 + 2 * 256 + 3 + 6 + 1);
    memcpy(file, h, 1024);
    for (int b = 0; b < 256; b++) { file[n++] = 1; file[n++] = (unsigned char)b; }
    const unsigned char tail[] = {2, 'b', 'c', 5, '<', 'e', 'o', 't', '>'};
    memcpy(file + n, tail, sizeof(tail));
    n += sizeof(tail);
    const char* p = tmp_path("tok.bin");
    write_bytes(p, file, n);
    Tokenizer t;
    size_t len1 = 0, len2 = 0;
    int ok = tokenizer_init(&t, p, NULL) == 0 && t.vocab_size == 258 && t.eot_token == 257;
    ok = ok && !strcmp(tokenizer_decode(&t, 256, &len1), "bc") && len1 == 2 && tokenizer_decode(&t, 257, &len2) &&
         len2 == 5 && tokenizer_decode(&t, 258, &len2) == NULL;
    check(ok, "tokenizer file decodes", "");
    if (ok) tokenizer_free(&t);
    write_bytes(p, file, n - 2);
    check(tokenizer_init(&t, p, NULL) < 0, "bad tokenizer refused: truncated", "");
    file[n] = 0;
    write_bytes(p, file, n + 1);
    check(tokenizer_init(&t, p, NULL) < 0, "bad tokenizer refused: trailing bytes", "");
    h[2] = 1 << 30;
    memcpy(file, h, 1024);
    write_bytes(p, file, n);
    check(tokenizer_init(&t, p, NULL) < 0, "bad tokenizer refused: impossible token count", "");
    h[2] = 258; h[0] = 1;
    memcpy(file, h, 1024);
    write_bytes(p, file, n);
    check(tokenizer_init(&t, p, NULL) < 0, "bad tokenizer refused: wrong magic", "");
    check(tokenizer_init(&t, tmp_path("no_such_tokenizer.bin"), NULL) < 0, "bad tokenizer refused: missing file", "");
    free(file);
}

/* A vocabulary of 65,536 tokens, the most uint16 shards hold: the pair
 * (65535, 65535) has the key 0xFFFFFFFF, which once marked empty slots of
 * the merge table, so the pair was "found" in any empty slot. Tokens: the
 * 256 bytes, fillers, 65534 = "abab", 65535 = "ab"; merges a+b -> 65535
 * and, in the second file, 65535+65535 -> 65534. */
static void test_tokenizer_full_vocab(void) {
    const uint32_t n = 65536, eot = 65533;
    size_t cap = 1024 + 3 * (size_t)n + 16, len = 1024;
    unsigned char* file = (unsigned char*)xmalloc(cap);
    int32_t h[256];
    memset(h, 0, sizeof(h));
    h[0] = TOKENIZER_MAGIC; h[1] = TOKENIZER_VERSION; h[2] = (int32_t)n; h[3] = (int32_t)eot;
    memcpy(file, h, 1024);
    for (uint32_t id = 0; id < n; id++) {
        if (id < 256) { file[len++] = 1; file[len++] = (unsigned char)id; }
        else if (id == 65534) { memcpy(file + len, "\x04" "abab", 5); len += 5; }
        else if (id == 65535) { memcpy(file + len, "\x02" "ab", 3); len += 3; }
        else { file[len++] = 2; file[len++] = (unsigned char)(id >> 8); file[len++] = (unsigned char)id; }
    }
    const char* dec = tmp_path("tok65536.bin");
    write_bytes(dec, file, len);
    free(file);
    for (int with_pair = 0; with_pair <= 1; with_pair++) {
        uint32_t m = 1 + (uint32_t)with_pair;
        uint32_t merges[1024 / 4 + 6];
        memset(merges, 0, sizeof(merges));
        merges[0] = TOKENIZER_MERGES_MAGIC; merges[1] = TOKENIZER_MERGES_VERSION; merges[2] = n; merges[3] = m;
        merges[4] = eot; merges[5] = 0;
        uint32_t* rec = merges + 256;
        rec[0] = 'a'; rec[1] = 'b'; rec[2] = 65535;
        if (with_pair) { rec[3] = 65535; rec[4] = 65535; rec[5] = 65534; }
        const char* mp = tmp_path("merges65536.bin");
        write_bytes(mp, merges, 1024 + 12 * (size_t)m);
        Tokenizer t;
        int ids[8] = {0}, got = -1;
        int loaded = tokenizer_init(&t, dec, mp) == 0;
        if (loaded) {
            got = (int)tokenizer_encode(&t, NULL, (const unsigned char*)"abab", 4, ids, 8);
            tokenizer_free(&t);
        }
        int ok = loaded && (with_pair ? got == 1 && ids[0] == 65534 : got == 2 && ids[0] == 65535 && ids[1] == 65535);
        char detail[96];
        snprintf(detail, sizeof(detail), "%d ids: %d %d", got, ids[0], ids[1]);
        check(ok, with_pair ? "65,536 tokens: the merge (65535, 65535) is found and applied"
                            : "65,536 tokens: the pair (65535, 65535) that is no merge is not found in an empty slot",
              detail);
    }
}

/* ---------------------------------------------------------------------- */
/* Init, schedules, CLI                                                   */
/* ---------------------------------------------------------------------- */
static void test_init(void) {
    GPT2Config c = config_from_depth(4);
    c.vocab_size = 1000; c.padded_vocab_size = 1024; c.max_seq_len = 128;
    GPT2 a, b;
    gpt2_init_random(&a, &c, 5);
    gpt2_init_random(&b, &c, 5);
    check(memcmp(a.params_memory, b.params_memory, a.num_parameters * 4) == 0, "random init reproducible for a seed", "");
    gpt2_free(&b);
    gpt2_init_random(&b, &c, 6);
    check(memcmp(a.params_memory, b.params_memory, a.num_parameters * 4) != 0, "a different seed gives different weights", "");
    gpt2_free(&b);
    double want_std[NUM_PARAMETER_TENSORS];
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) want_std[i] = PARAMETER_IS_MATRIX[i] ? 0.02 : 0.0;
    want_std[6] = want_std[12] = 0.02 / sqrt(2.0 * c.num_layers);
    float** ptrs = (float**)&a.params;
    int ok = 1;
    char detail[256] = "";
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = i == 0 ? (size_t)c.vocab_size * c.channels : a.param_sizes[i];
        double s = 0, s2 = 0;
        for (size_t j = 0; j < n; j++) { s += ptrs[i][j]; s2 += (double)ptrs[i][j] * ptrs[i][j]; }
        double mean = s / n, sd = sqrt(s2 / n - mean * mean);
        const char* nm = PARAMETER_NAMES[i];
        double want_mean = (!strcmp(nm, "ln1w") || !strcmp(nm, "ln2w") || !strcmp(nm, "lnfw")) ? 1.0 : 0.0;
        /* the std of n normals is within ~4/sqrt(2n) relative of the truth */
        int good = fabs(mean - want_mean) < 4 * want_std[i] / sqrt((double)n) + 1e-12 &&
                   fabs(sd - want_std[i]) <= want_std[i] * 4 / sqrt(2.0 * n) + 1e-12;
        if (!good) { ok = 0; snprintf(detail, sizeof(detail), "%s: mean %.5g std %.5g (want %.5g)", nm, mean, sd, want_std[i]); }
    }
    int pad_zero = 1;
    for (size_t j = (size_t)c.vocab_size * c.channels; j < a.param_sizes[0]; j++) pad_zero &= a.params.wte[j] == 0.0f;
    check(ok, "init: N(0, 0.02), projections 0.02/sqrt(2L), biases 0, LayerNorm weights 1", detail);
    check(pad_zero, "init: padded vocabulary rows are zero", "");
    /* the parallel init (rng_fill_normal, rng_jump) against draws one by one */
    int jump_ok = 1;
    uint64_t jumps[] = {0, 1, 2, 63, 64, 1000, 123457, 2 * 124475904ull + 3};
    for (size_t k = 0; k < sizeof(jumps) / sizeof(jumps[0]); k++) {
        Rng one, far;
        rng_init(&one, 11 + k);
        far = one;
        for (uint64_t d = 0; d < jumps[k]; d++) rng_u32(&one);
        rng_jump(&far, jumps[k]);
        jump_ok &= one.state == far.state;
    }
    check(jump_ok, "rng_jump(k) = k draws one by one (k up to 2.5e8)", "");
    int fill_ok = 1;
    for (size_t n = 1; n < 2000; n = n * 3 + 1) {
        float* seq = xmalloc_floats(n);
        float* par = xmalloc_floats(n);
        Rng r1, r2;
        rng_init(&r1, n);
        rng_init(&r2, n);
        rng_u32(&r1); rng_u32(&r2); /* an odd offset */
        for (size_t j = 0; j < n; j++) seq[j] = (float)(0.02 * rng_normal(&r1));
        rng_fill_normal(&r2, par, n, 0.02);
        fill_ok &= memcmp(seq, par, n * sizeof(float)) == 0 && r1.state == r2.state;
        free(seq);
        free(par);
    }
    check(fill_ok, "rng_fill_normal: bitwise the serial rng_normal loop, and the state after it", "");
    { /* the fast init (gptc/util.h's rng_fill_normal_lanes): 1M normals bitwise, its recompute path taken, and
       * its own log/cos within 2^-44 of glibc's (the 2^-40 it relies on, with room); a planted 2^-38 error
       * in the fast value, trusted, is caught by the same bitwise comparison */
        size_t n = 1000003;
        float* seq = xmalloc_floats(n);
        float* fast = xmalloc_floats(n);
        Rng r1, r2;
        rng_init(&r1, 424242);
        r2 = r1;
        double worst = 0.0;
        size_t planted_caught = 0;
        for (size_t j = 0; j < n; j++) {
            uint32_t a = rng_u32(&r1), b = rng_u32(&r1);
            double ref = 0.02 * rng_normal_of(a, b), mine = rng_normal_fast(a, b, 0.02);
            seq[j] = (float)ref;
            double rel = fabs(mine - ref) / fabs(ref);
            if (rel > worst) worst = rel;
            planted_caught += (float)(mine * (1.0 + 0x1p-38)) != seq[j];
        }
        size_t redone = rng_fill_normal_lanes(r2, fast, n, 0.02);
        char d[160];
        snprintf(d, sizeof(d), "worst relative difference %.3g (2^%.1f), %zu of %zu recomputed, planted error: %zu "
                 "normals differ", worst, log2(worst > 0 ? worst : 1e-300), redone, n, planted_caught);
        check(memcmp(seq, fast, n * sizeof(float)) == 0 && redone > 0 && worst < 0x1p-44 && worst > 0.0 &&
              planted_caught > 0, "fast init: 1M normals bitwise rng_normal's; its log/cos within 2^-44 of glibc's", d);
        free(seq);
        free(fast);
    }
    c = config_from_depth(12);
    check(parameter_count(&c) == 124475904ull, "d12 has 124,475,904 parameters (Vp = 50304)", "");
    gpt2_free(&a);
}

/* A promoted standby's locks (gptc/run_lock.h's RunLock.heir): a lock whose
 * holder on this host is exiting is inherited at once and taken for real
 * when it comes free; a live holder's is refused, heir or not. The exiting
 * holder: a child that took the lock, forked a grandchild (which keeps the
 * lock's open file, so the lock stays held) and exited, unreaped (a zombie). */
static void test_run_lock_heir(void) {
    char out[600], shm[600];
    snprintf(out, sizeof(out), "%s/heir_out", tmpdir);
    snprintf(shm, sizeof(shm), "%s/heir_shm", tmpdir);
    CHECK(mkdir(out, 0755) == 0 && mkdir(shm, 0755) == 0, "cannot make %s", out);
    int ready[2], hold[2];
    CHECK(pipe(ready) == 0 && pipe(hold) == 0, "pipe: %s", strerror(errno));
    pid_t child = fork();
    CHECK(child >= 0, "fork: %s", strerror(errno));
    if (child == 0) { /* the holder: lock, fork the keeper, exit */
        close(hold[1]); /* (only the test holds the write end: its close lets the keeper go) */
        close(ready[0]);
        RunLock mine;
        memset(&mine, 0, sizeof(mine));
        if (run_lock(&mine, out, shm, 0) != 0) _exit(3);
        pid_t keeper = fork();
        if (keeper == 0) { /* keeps the locks' open files until the pipe closes */
            char c;
            close(ready[1]);
            if (read(hold[0], &c, 1) < 0) _exit(1); /* (EOF when the test closes its end) */
            _exit(0);
        }
        if (write(ready[1], "k", 1) != 1) _exit(4);
        _exit(keeper > 0 ? 0 : 5);
    }
    close(hold[0]);
    close(ready[1]);
    char c;
    int ok = read(ready[0], &c, 1) == 1;
    close(ready[0]);
    for (int i = 0; i < 2000 && ok && !process_exiting(child); i++) usleep(1000); /* the child exits: a zombie */
    RunLock plain, heir;
    memset(&plain, 0, sizeof(plain));
    memset(&heir, 0, sizeof(heir));
    printf("(a refusal expected next)\n");
    int refused = run_lock(&plain, out, shm, 0) != 0;
    heir.heir = 1;
    int inherited = run_lock(&heir, out, shm, 0) == 0 && heir.waiting[0] && heir.waiting[1] && heir.dir.fd < 0;
    close(hold[1]); /* the keeper exits, the kernel drops the locks */
    run_lock_settle(&heir);
    int held = heir.dir.fd >= 0 && heir.shm.fd >= 0;
    int status;
    waitpid(child, &status, 0);
    check(ok && process_exiting(child) == 0 && refused && inherited && held,
          "run lock: a promoted standby inherits the locks of an exiting holder (taken when free); a plain start is refused",
          "");
    RunLock again;
    memset(&again, 0, sizeof(again));
    again.heir = 1;
    printf("(a refusal expected next)\n");
    check(run_lock(&again, out, shm, 0) != 0 && !again.waiting[0] && !again.waiting[1],
          "run lock: a live holder's locks are refused to a promoted standby too", "");
    run_unlock(&heir, 1);
}

static void test_schedules(void) {
    LRSchedule s;
    s.max_lr = 1.0; s.warmup_steps = 10; s.total_steps = 110; s.final_frac = 0.1; s.decay_frac = 0.2;
    int ok = 1;
    s.kind = SCHEDULE_COSINE;
    ok &= fabs(lr_at(&s, 0) - 0.1) < 1e-12 && fabs(lr_at(&s, 9) - 1.0) < 1e-12;
    ok &= fabs(lr_at(&s, 10) - 1.0) < 1e-12 && fabs(lr_at(&s, 60) - 0.55) < 1e-12 && fabs(lr_at(&s, 110) - 0.1) < 1e-12;
    check(ok, "cosine schedule: warmup (s+1)/W, midpoint halfway, ends at final fraction", "");
    s.kind = SCHEDULE_LINEAR;
    check(fabs(lr_at(&s, 35) - (1.0 - 0.25 * 0.9)) < 1e-12, "linear schedule", "");
    s.kind = SCHEDULE_CONSTANT;
    check(lr_at(&s, 100) == 1.0, "constant schedule", "");
    s.kind = SCHEDULE_WSD; /* decay over the last 22 steps: 88..110 */
    check(lr_at(&s, 87) == 1.0 && fabs(lr_at(&s, 99) - (1.0 - 0.9 * 11.0 / 22.0)) < 1e-12,
          "warmup-stable-decay schedule", "");
}

static int parse_args(Options* o, const char* line) {
    char buf[512];
    char* argv[32];
    int argc = 0;
    snprintf(buf, sizeof(buf), "%s", line);
    argv[argc++] = (char*)"train_gpt";
    for (char* tok = strtok(buf, " "); tok && argc < 32; tok = strtok(NULL, " ")) argv[argc++] = tok;
    int rc = options_parse(o, argc, argv);
    if (rc != 0) return rc;
    return options_problem(o) ? -2 : 0;
}

static void test_cli(void) {
    Options o;
    check(parse_args(&o, "") == 0 && o.batch_size == 4 && o.seq_len == 64 && o.lr == 3e-4f, "defaults parse", "");
    check(parse_args(&o, "-b 8 -t 32 --lr=1e-3 --lr-schedule wsd -g 16") == 0 && o.batch_size == 8 && o.seq_len == 32 &&
              o.lr == 1e-3f && o.sample_length == 16, "long flags, llm.c aliases and --flag=value", "");
    check(parse_args(&o, "--help") == 1, "--help", "");
    struct { const char* args; int rc; const char* name; } bad[] = {
        {"--bogus 1", -1, "unknown flag"},
        {"-b", -1, "missing value"},
        {"-b four", -1, "not a number"},
        {"-b 4x", -1, "trailing junk"},
        {"--lr nan", -1, "non-finite number"},
        {"-b 3 -t 5 -d 100", -2, "total batch not a multiple of B*T"},
        {"--steps 0", -2, "zero steps"},
        {"--lr-schedule cosh", -2, "unknown schedule"},
        {"--sample-length 0", -2, "empty sample"},
        {"--model gpt2.bin --num-layers 4", -2, "shape override with a checkpoint"},
        {"--top-p 0", -2, "top-p of zero"},
        {"--beta2 1.0", -2, "beta2 of one"},
        {"--gelu-fusion 2", -2, "GPU flag out of range"},
        {"--init nfs:/x", -2, "unknown rendezvous"},
        {"--init-timeout 0", -2, "zero timeout"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[128];
        snprintf(what, sizeof(what), "CLI refuses: %s (%s)", bad[i].name, bad[i].args);
        check(parse_args(&o, bad[i].args) == bad[i].rc, what, "");
    }
}

/* ---------------------------------------------------------------------- */
/* Generation with the KV cache, and text to shards                       */
/* ---------------------------------------------------------------------- */
/* The cached one-position-at-a-time forward gives the logits of the full
 * forward pass at every position. */
/* ---------------------------------------------------------------------- */
/* Hugging Face checkpoints (gptc/safetensors.h)                          */
/* ---------------------------------------------------------------------- */

/* fn(arg) with its stderr captured into msg (lines joined by '|'): fn's result. */
static int said_while(int (*fn)(const void*), const void* arg, char* msg, size_t cap) {
    const char* log = tmp_path("said_stderr.txt");
    fflush(stderr);
    int saved = dup(2);
    FILE* f = fopen(log, "w");
    CHECK(saved >= 0 && f != NULL && dup2(fileno(f), 2) >= 0, "cannot redirect stderr to %s", log);
    int rc = fn(arg);
    fflush(stderr);
    CHECK(dup2(saved, 2) >= 0 && close(saved) == 0 && fclose(f) == 0, "cannot restore stderr");
    size_t n = 0;
    unsigned char* text = read_all(log, &n);
    n = text && n < cap ? n : (text ? cap - 1 : 0);
    if (text) memcpy(msg, text, n);
    while (n > 0 && msg[n - 1] == '\n') n--;
    msg[n] = '\0';
    for (size_t i = 0; i < n; i++) if (msg[i] == '\n') msg[i] = '|';
    free(text);
    return rc;
}

static int hf_load_quiet(const void* path) {
    GPT2 m;
    int rc = gpt2_load(&m, (const char*)path);
    if (rc == 0) gpt2_free(&m);
    return rc;
}

/* gpt2_load(path) with its stderr caught: its return code, and what it said
 * in msg, one line per check (the tests check the words). */
static int hf_load_said(const char* path, char* msg, size_t cap) { return said_while(hf_load_quiet, path, msg, cap); }

/* A folder holding config.json (`config`, or a valid one for L=2 C=64 NH=4
 * maxT=32 V=100 if NULL) and model.safetensors: the 8-byte length of
 * `header`, the header, then `data_bytes` bytes of `data` (zeros if NULL). */
static const char* HF_TEST_CONFIG = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, "
                                    "\"n_positions\": 32, \"vocab_size\": 100, \"activation_function\": \"gelu_new\"}";
static const char* hf_bad_folder(const char* config, const char* header, size_t header_len,
                                 const void* data, size_t data_bytes) {
    static char dir[600];
    snprintf(dir, sizeof(dir), "%s/hf_bad", tmpdir);
    CHECK(mkdir_p(dir) == 0, "cannot make %s", dir);
    char p[700];
    snprintf(p, sizeof(p), "%s/config.json", dir);
    if (!config) config = HF_TEST_CONFIG;
    CHECK(write_bytes(p, config, strlen(config)) == 0, "write %s", p);
    unsigned char* file = (unsigned char*)xmalloc(8 + header_len + data_bytes);
    for (int k = 0; k < 8; k++) file[k] = (unsigned char)((unsigned long long)header_len >> (8 * k));
    memcpy(file + 8, header, header_len);
    if (data) memcpy(file + 8 + header_len, data, data_bytes);
    else memset(file + 8 + header_len, 0, data_bytes);
    snprintf(p, sizeof(p), "%s/model.safetensors", dir);
    CHECK(write_bytes(p, file, 8 + header_len + data_bytes) == 0, "write %s", p);
    free(file);
    return dir;
}

/* ours -> HF -> ours byte for byte, both paths of --model, and every kind of
 * bad checkpoint refused with its message (no PyTorch needed; make
 * test-asan runs it under the sanitizers). */
static void test_hf_files(void) {
    GPT2Config c;
    c.num_layers = 2; c.channels = 64; c.num_heads = 4; c.max_seq_len = 32;
    c.vocab_size = 100; c.padded_vocab_size = 128;
    GPT2 a, b;
    gpt2_init_random(&a, &c, 7);
    const char* ours = tmp_path("hf_ours.bin");
    const char* again = tmp_path("hf_again.bin");
    const char* dir = tmp_path("hf_export");
    CHECK(gpt2_save(&a, ours) == 0, "write %s", ours);
    check(hf_checkpoint_write(dir, &c, a.params_memory) == 0, "Hugging Face export: config.json + model.safetensors", dir);
    int loaded = gpt2_load(&b, dir) == 0;
    check(loaded && memcmp(&b.config, &c, sizeof(c)) == 0, "Hugging Face import: the folder, config V=100 -> Vp=128", "");
    if (loaded) {
        check(gpt2_save(&b, again) == 0 && files_equal(ours, again), "ours -> Hugging Face -> ours: the same bytes", again);
        gpt2_free(&b);
    }
    char st[700], msg[4096];
    snprintf(st, sizeof(st), "%s/model.safetensors", dir);
    loaded = gpt2_load(&b, st) == 0;
    check(loaded && memcmp(b.params_memory, a.params_memory, a.num_parameters * 4) == 0,
          "Hugging Face import: the .safetensors file, config.json beside it", "");
    if (loaded) gpt2_free(&b);

    /* the trainer: --convert both ways, through the command line */
    char cmd[2400], out[8192];
    snprintf(cmd, sizeof(cmd), "./train_gpt --model %s --convert %s/hf_cli && ./train_gpt --model %s/hf_cli --convert %s/hf_cli.bin",
             ours, tmpdir, tmpdir, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s/hf_cli.bin", tmpdir);
    check(rc == 0 && files_equal(ours, cmd), "train_gpt --convert DIR, then --model DIR --convert X.bin: the same bytes", rc ? out : "");

    /* bad checkpoints, made from the good one: each refused with its words */
    size_t n = 0;
    unsigned char* good = read_all(st, &n);
    uint64_t hlen = 0;
    for (int k = 7; k >= 0; k--) hlen = hlen << 8 | good[k];
    char* header = (char*)xmalloc(hlen + 1);
    memcpy(header, good + 8, hlen);
    header[hlen] = '\0';
    const unsigned char* data = good + 8 + hlen;
    size_t data_bytes = n - 8 - hlen;
    struct { const char* what; const char* from; const char* to; const char* config; const char* said[2]; } edits[] = {
        {"a GPT-2 tensor missing (renamed)", "h.1.mlp.c_fc.weight", "h.1.mlp.c_fx.weight", NULL,
         {"no tensor transformer.h.1.mlp.c_fc.weight", "the file has 28 tensors"}},
        {"an unsupported dtype", "\"F32\",\"shape\":[64]", "\"I32\",\"shape\":[64]", NULL,
         {"has dtype I32", "reads F32, F16, BF16 and F64"}},
        {"shapes not those of config.json", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 32, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}",
         {"transformer.wte.weight has shape [100, 64], config.json (n_embd=32", "implies [100, 32]"}},
        {"more layers in config.json than in the file", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 3, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}",
         {"no tensor transformer.h.2.ln_1.weight", "n_layer=3"}},
        {"config.json of another model", NULL, NULL, "{\"model_type\": \"llama\", \"hidden_size\": 64}",
         {"model_type is \"llama\", not \"gpt2\"", "GPT-2 checkpoints only"}},
        {"config.json without n_embd", NULL, NULL,
         "{\"n_layer\": 2, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}", {"no \"n_embd\"", "GPT2Config"}},
        {"config.json that is not JSON", NULL, NULL, "{\"n_layer\": 2,, }", {"config.json: not valid JSON at byte", ""}},
        {"config.json truncated", NULL, NULL, "{\"n_layer\": 2, \"n_embd\": 64", {"not valid JSON", "truncated"}},
        {"config.json with another GELU", NULL, NULL,
         "{\"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"activation_function\": \"relu\"}",
         {"activation_function is \"relu\"", "gelu_new"}},
        {"config.json with an impossible shape", NULL, NULL,
         "{\"n_layer\": 2, \"n_embd\": 64, \"n_head\": 5, \"n_positions\": 32, \"vocab_size\": 100}",
         {"impossible model", "multiple of num_heads"}},
        {"config.json with a negative layer_norm_epsilon", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"layer_norm_epsilon\": -1e-5}",
         {"layer_norm_epsilon is -1e-05", "1e-5"}},
        {"config.json with layer_norm_epsilon -1 (not \"absent\")", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"layer_norm_epsilon\": -1}",
         {"layer_norm_epsilon is -1", "1e-5"}},
        {"config.json with scale_attn_weights false", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"scale_attn_weights\": false}",
         {"scale_attn_weights is false, expected true", "sqrt"}},
        {"config.json with scale_attn_by_inverse_layer_idx true", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"scale_attn_by_inverse_layer_idx\": true}",
         {"scale_attn_by_inverse_layer_idx is true, expected false", ""}},
        {"config.json with add_cross_attention true", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"add_cross_attention\": true}",
         {"add_cross_attention is true", ""}},
        {"config.json with scale_attn_weights not a boolean", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"scale_attn_weights\": 1}",
         {"scale_attn_weights: expected true or false", "config.json"}},
        {"config.json with model_type \"\" (a value, not absent)", NULL, NULL,
         "{\"model_type\": \"\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}",
         {"model_type is \"\", not \"gpt2\"", ""}},
        {"config.json with activation_function \"\" (a value, not absent)", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100, \"activation_function\": \"\"}",
         {"activation_function is \"\"", "gelu_new"}},
        {"config.json of a 157 GB model beside a small file (refused before anything is allocated)", NULL, NULL,
         "{\"model_type\": \"gpt2\", \"n_layer\": 48, \"n_embd\": 8192, \"n_head\": 64, \"n_positions\": 32768, \"vocab_size\": 50257}",
         {"transformer.wte.weight has shape [100, 64], config.json (n_embd=8192", "implies [50257, 8192]"}},
        {"config.json with a negative n_layer", NULL, NULL,
         "{\"n_layer\": -2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}",
         {"n_layer: expected a whole number", "config.json"}},
        {"config.json with a size with a leading zero", NULL, NULL,
         "{\"n_layer\": 02, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100}",
         {"n_layer: expected a whole number", ""}},
    };
    for (size_t i = 0; i < sizeof(edits) / sizeof(edits[0]); i++) {
        char* h = (char*)xmalloc(hlen + 1);
        memcpy(h, header, hlen + 1);
        if (edits[i].from) {
            char* at = strstr(h, edits[i].from);
            ALWAYS(at != NULL && strlen(edits[i].from) == strlen(edits[i].to));
            memcpy(at, edits[i].to, strlen(edits[i].to));
        }
        const char* bad = hf_bad_folder(edits[i].config, h, hlen, data, data_bytes);
        rc = hf_load_said(bad, msg, sizeof(msg));
        char what[200];
        snprintf(what, sizeof(what), "bad Hugging Face checkpoint refused, said why: %s", edits[i].what);
        check(rc == -1 && strstr(msg, edits[i].said[0]) && strstr(msg, edits[i].said[1]), what, msg);
        free(h);
    }
    {
        /* GPT-2's own values of the fields that change the maths are accepted */
        const char* cfg = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, \"n_positions\": 32, "
                          "\"vocab_size\": 100, \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-05, "
                          "\"scale_attn_weights\": true, \"scale_attn_by_inverse_layer_idx\": false, "
                          "\"add_cross_attention\": false, \"tie_word_embeddings\": true, \"n_inner\": null}";
        const char* fine = hf_bad_folder(cfg, header, hlen, data, data_bytes);
        check(hf_load_said(fine, msg, sizeof(msg)) == 0, "Hugging Face import: config.json with GPT-2's own values of every field read", msg);
    }
    /* shapes by rank: a one-row matrix (n_positions 1, vocab_size 1) is a matrix, [1, C] both ways */
    for (int which = 0; which < 2; which++) {
        GPT2Config c1 = c;
        if (which == 0) c1.max_seq_len = 1;
        else { c1.vocab_size = 1; c1.padded_vocab_size = 128; }
        GPT2 one, back;
        gpt2_init_random(&one, &c1, 11);
        const char* d1 = tmp_path(which ? "hf_v1" : "hf_t1");
        check(hf_checkpoint_write(d1, &c1, one.params_memory) == 0, "Hugging Face export of a model with a one-row matrix", d1);
        char p1[700];
        snprintf(p1, sizeof(p1), "%s/model.safetensors", d1);
        size_t n1 = 0;
        unsigned char* f1 = read_all(p1, &n1);
        const char* want = which ? "\"transformer.wte.weight\":{\"dtype\":\"F32\",\"shape\":[1,64]"
                                 : "\"transformer.wpe.weight\":{\"dtype\":\"F32\",\"shape\":[1,64]";
        int has = f1 && n1 > 8 && memmem(f1, n1, want, strlen(want)) != NULL;
        free(f1);
        check(has, which ? "Hugging Face export: wte of vocab_size 1 has shape [1, 64], not [64]"
                         : "Hugging Face export: wpe of n_positions 1 has shape [1, 64], not [64]", want);
        int rc1 = hf_load_said(d1, msg, sizeof(msg));
        int same = 0;
        if (rc1 == 0) {
            CHECK(gpt2_load(&back, d1) == 0, "reload %s", d1);
            same = memcmp(back.params_memory, one.params_memory, one.num_parameters * 4) == 0;
            gpt2_free(&back);
        }
        check(rc1 == 0 && same, which ? "Hugging Face import: vocab_size 1, wte [1, 64], the same weights"
                                       : "Hugging Face import: n_positions 1, wpe [1, 64], the same weights", msg);
        gpt2_free(&one);
    }
    /* the file cut short, its length field wrong, its header malformed */
    struct { const char* what; size_t keep; uint64_t len; const char* said[2]; } cuts[] = {
        {"a file of 5 bytes", 5, 0, {"shorter than the 8-byte header length", "truncated"}},
        {"the header cut in half", 8 + hlen / 2, 0, {"header length", "runs past the end of the file"}},
        {"the data cut short", n - 100, 0, {"fall outside the data buffer", "truncated"}},
        {"a header length past the file end", n, 1ULL << 40, {"header length 1099511627776 runs past the end", "truncated"}},
        {"a header length of 2^64 - 1", n, 0xFFFFFFFFFFFFFFFFULL, {"header length 18446744073709551615 runs past the end", ""}},
        {"a header length of 1", n, 1, {"header length 1 is outside 2..100000000 bytes", "not a safetensors file"}},
    };
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        const char* bad = hf_bad_folder(NULL, header, hlen, data, data_bytes);
        unsigned char* copy = (unsigned char*)xmalloc(n);
        memcpy(copy, good, n);
        for (int k = 0; cuts[i].len && k < 8; k++) copy[k] = (unsigned char)(cuts[i].len >> (8 * k));
        char p[700];
        snprintf(p, sizeof(p), "%s/model.safetensors", bad);
        CHECK(write_bytes(p, copy, cuts[i].keep) == 0, "write %s", p);
        free(copy);
        rc = hf_load_said(bad, msg, sizeof(msg));
        char what[200];
        snprintf(what, sizeof(what), "bad Hugging Face checkpoint refused, said why: %s", cuts[i].what);
        check(rc == -1 && strstr(msg, cuts[i].said[0]) && strstr(msg, cuts[i].said[1]) && strstr(msg, "model.safetensors"),
              what, msg);
    }
    /* headers written by hand: offsets, JSON, nesting */
    char deep[400];
    int k = snprintf(deep, sizeof(deep), "{\"a\":{\"x\":");
    for (int d = 0; d < 100; d++) deep[k++] = '[';
    deep[k] = '\0';
    struct { const char* what; const char* header; size_t data; const char* said[2]; } hand[] = {
        {"data_offsets overlapping",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12, {"tensor b begins at byte 4 of the data buffer, expected 8, where a [0, 8] ends", "overlap"}},
        {"data_offsets past the data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
         {"tensor a: data_offsets [0, 16] fall outside the data buffer of 8 bytes", ""}},
        {"data_offsets reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
         {"tensor a: data_offsets [8, 0] fall outside", ""}},
        {"data_offsets not the shape's size", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
         {"hold 8 bytes, its shape and dtype F32 need 12", ""}},
        {"a huge shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[9007199254740992,9007199254740992],\"data_offsets\":[0,8]}}", 8,
         {"its shape and dtype F32 need", ""}},
        {"a number too big", "{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8,
         {"malformed at byte", "whole number below 2^53"}},
        {"a tensor named twice",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, {"a tensor name appears twice", ""}},
        {"an entry without offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 8, {"lacks dtype, shape or data_offsets", ""}},
        {"a header that is not JSON", "{\"a\":{\"dtype\":\"F32\",", 8, {"malformed at byte", "ends early"}},
        {"a header nested 100 deep", deep, 8, {"malformed", "nested too deep"}},
        {"another model's names (no wte.weight)",
         "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"no tensor wte.weight", "the file has 1 tensors: model.embed_tokens.weight"}},
        {"white space before the header's '{'",
         " {\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"expected '{' as the header's first byte", ""}},
        {"bytes after the last tensor",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
         {"4 bytes follow the last tensor", "corrupt"}},
        {"a hole between tensors",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
         {"tensor b begins at byte 8 of the data buffer, expected 4", "leave a hole"}},
        {"a hole before the first tensor",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
         {"a, begins at byte 4 of the data buffer, expected 0", ""}},
        {"__metadata__ not an object",
         "{\"__metadata__\":\"pt\",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"__metadata__ is not an object", ""}},
        {"__metadata__ with a number",
         "{\"__metadata__\":{\"format\":1},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"a value of __metadata__ is not a string", ""}},
        {"__metadata__ with an object",
         "{\"__metadata__\":{\"format\":{}},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"a value of __metadata__ is not a string", ""}},
        {"a name with invalid UTF-8",
         "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"is not valid UTF-8 at byte 3 (0xff)", ""}},
        {"an overlong UTF-8 form",
         "{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"is not valid UTF-8 at byte 3 (0xc0)", ""}},
        {"a UTF-8 surrogate",
         "{\"a\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"is not valid UTF-8 at byte 3 (0xed)", ""}},
        {"a dtype given twice",
         "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"names dtype, shape or data_offsets twice", ""}},
        {"valid UTF-8 (not refused as such)",
         "{\"caf\xc3\xa9\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
         {"no tensor wte.weight", "caf\xc3\xa9"}},
    };
    for (size_t i = 0; i < sizeof(hand) / sizeof(hand[0]); i++) {
        const char* bad = hf_bad_folder(NULL, hand[i].header, strlen(hand[i].header), NULL, hand[i].data);
        rc = hf_load_said(bad, msg, sizeof(msg));
        char what[200];
        snprintf(what, sizeof(what), "bad Hugging Face checkpoint refused, said why: %s", hand[i].what);
        check(rc == -1 && strstr(msg, hand[i].said[0]) && strstr(msg, hand[i].said[1]), what, msg);
    }
    /* a NaN weight; an untied head; a folder without the file */
    {
        unsigned char* copy = (unsigned char*)xmalloc(n);
        memcpy(copy, good, n);
        float nan_value = NAN;
        memcpy(copy + 8 + hlen + 40, &nan_value, 4);
        const char* bad = hf_bad_folder(NULL, header, hlen, copy + 8 + hlen, data_bytes);
        rc = hf_load_said(bad, msg, sizeof(msg));
        check(rc == -1 && strstr(msg, "transformer.wte.weight element 10 is nan") && strstr(msg, "non-finite"),
              "bad Hugging Face checkpoint refused, said why: a NaN weight", msg);
        free(copy);
    }
    {
        /* lm_head.weight appended as a copy of wte with one value changed */
        size_t wte_bytes = (size_t)c.vocab_size * c.channels * 4;
        size_t h2cap = hlen + 200;
        char* h2 = (char*)xmalloc(h2cap);
        int len = snprintf(h2, h2cap, "%.*s,\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[100,64],\"data_offsets\":[%zu,%zu]}}",
                           (int)(strchr(header, '}') ? strrchr(header, '}') - header : 0), header, data_bytes, data_bytes + wte_bytes);
        unsigned char* d2 = (unsigned char*)xmalloc(data_bytes + wte_bytes);
        memcpy(d2, data, data_bytes);
        memcpy(d2 + data_bytes, data, wte_bytes); /* wte comes first in our export */
        const char* tied = hf_bad_folder(NULL, h2, (size_t)len, d2, data_bytes + wte_bytes);
        check(hf_load_said(tied, msg, sizeof(msg)) == 0, "Hugging Face import: lm_head.weight equal to wte is accepted (tied)", msg);
        d2[data_bytes + 4] ^= 1;
        const char* untied = hf_bad_folder(NULL, h2, (size_t)len, d2, data_bytes + wte_bytes);
        rc = hf_load_said(untied, msg, sizeof(msg));
        check(rc == -1 && strstr(msg, "lm_head.weight is not a copy of wte.weight"),
              "bad Hugging Face checkpoint refused, said why: an untied LM head", msg);
        free(h2);
        free(d2);
    }
    {
        const char* bad = hf_bad_folder(NULL, header, hlen, data, data_bytes);
        char p[700];
        snprintf(p, sizeof(p), "%s/config.json", bad);
        CHECK(truncate(p, 2 << 20) == 0, "truncate %s", p); /* 2 MB: the JSON, then zeros */
        rc = hf_load_said(bad, msg, sizeof(msg));
        check(rc == -1 && strstr(msg, "config.json: is 2097152 bytes"),
              "bad Hugging Face checkpoint refused, said why: a config.json of 2 MB", msg);
    }
    {
        char p[700];
        snprintf(p, sizeof(p), "%s/hf_empty", tmpdir);
        CHECK(mkdir_p(p) == 0, "mkdir %s", p);
        rc = hf_load_said(p, msg, sizeof(msg));
        check(rc == -1 && strstr(msg, "model.safetensors: no such file") && strstr(msg, "config.json"),
              "bad Hugging Face checkpoint refused, said why: a folder without model.safetensors", msg);
        snprintf(cmd, sizeof(cmd), "./train_gpt --model %s --convert %s/x.bin", p, tmpdir);
        rc = run_capture(cmd, out, sizeof(out));
        int said = rc != 0 && strstr(out, "no such file");
        check(said, "train_gpt --model with a bad checkpoint exits non-zero, saying why", said ? "" : out);
    }
    /* random damage: bytes of the header changed, the file cut anywhere;
     * each load returns 0 or -1 and the sanitizers see nothing */
    {
        Rng rng;
        rng_init(&rng, 16);
        int survived = 0, tries = 300;
        static const char junk[] = " {}[],:\"0123456789eE-.F\\"; /* what JSON is made of */
        unsigned char* copy = (unsigned char*)xmalloc(n);
        for (int t = 0; t < tries; t++) {
            memcpy(copy, good, n);
            size_t keep = n;
            if (t % 3 == 2) keep = rng_u32(&rng) % (8 + hlen + 64);
            else for (int e = 0; e < 1 + t % 4; e++) copy[8 + rng_u32(&rng) % hlen] = (unsigned char)junk[rng_u32(&rng) % (sizeof(junk) - 1)];
            const char* bad = hf_bad_folder(NULL, "", 0, NULL, 0);
            char p[700];
            snprintf(p, sizeof(p), "%s/model.safetensors", bad);
            CHECK(write_bytes(p, copy, keep) == 0, "write %s", p);
            rc = hf_load_said(bad, msg, sizeof(msg));
            survived += rc == 0 || (rc == -1 && strstr(msg, "error: ") != NULL);
        }
        free(copy);
        checkf(survived == tries, "Hugging Face import survives damaged files (each refused with an error, or read)",
               "%d of %d", survived, tries);
    }
    free(header);
    free(good);
    gpt2_free(&a);
}

/* ---------------------------------------------------------------------- */
/* Other inputs refused when wrong: eval sets, --standby, ...              */
/* ---------------------------------------------------------------------- */

/* evalset_read(path) with stderr caught: its return code, what it said in msg. */
static int eval_load_quiet(const void* path) {
    EvalSet s;
    int rc = evalset_read(&s, (const char*)path);
    if (rc == 0) evalset_free(&s);
    return rc;
}

static int eval_load_said(const char* path, char* msg, size_t cap) { return said_while(eval_load_quiet, path, msg, cap); }

/* An eval file of 3 examples in llm.c's format, each with a context of 2
 * tokens and 4 endings of 1..4 tokens; *words_out words after the header. */
static uint16_t* eval_words(size_t* words_out) {
    uint16_t* w = (uint16_t*)xmalloc(2 * 3 * 64);
    size_t p = 0;
    for (int i = 0; i < 3; i++) {
        size_t start = p;
        w[p++] = 65535;
        w[p++] = 0; /* the size, filled below */
        w[p++] = (uint16_t)i;
        w[p++] = (uint16_t)(i % 4);
        w[p++] = 4;
        w[p++] = 2; w[p++] = 10; w[p++] = 11;
        for (int k = 0; k < 4; k++) {
            w[p++] = (uint16_t)(1 + k);
            for (int j = 0; j <= k; j++) w[p++] = (uint16_t)(20 + k);
        }
        w[start + 1] = (uint16_t)(2 * (p - start));
    }
    *words_out = p;
    return w;
}

static const char* eval_file_write(const char* name, const uint16_t* w, size_t words, int longest) {
    const char* path = tmp_path(name);
    int32_t h[256] = {0};
    h[0] = EVAL_MAGIC;
    h[1] = EVAL_VERSION;
    h[2] = 3;
    h[3] = longest;
    FILE* f = fopen(path, "wb");
    CHECK(f && fwrite(h, 4, 256, f) == 256 && fwrite(w, 2, words, f) == words && fclose(f) == 0, "write %s", path);
    return path;
}

static void test_input_files(void) {
    char msg[4096];
    /* eval sets: the message names the example that is wrong, what was expected and what was found */
    {
        size_t words;
        uint16_t* good = eval_words(&words);
        int longest = 0;
        for (size_t p = 0; p < words;) { longest = good[p + 1] > longest ? good[p + 1] : longest; p += good[p + 1] / 2; }
        const char* ok_path = eval_file_write("eval_good.bin", good, words, longest);
        check(eval_load_said(ok_path, msg, sizeof(msg)) == 0, "eval set: a well-formed file of 3 examples is read", msg);
        size_t ex1 = good[1] / 2, ex2 = ex1 + good[ex1 + 1] / 2; /* where examples 1 and 2 begin */
        struct { const char* what; size_t at; uint16_t value; const char* said[2]; } cases[] = {
            {"an empty ending in example 0", 5 + 3, 0, {"example 0: an ending is empty", "ending 0: expected 1..", }},
            {"an empty context in example 1", ex1 + 5, 0, {"example 1: the context is empty", "found 0"}},
            {"a label of 7 in example 0", 3, 7, {"example 0: the label is out of range", "expected 0..3, found 7"}},
            {"3 endings in example 2", ex2 + 4, 3, {"example 2: the number of endings is wrong", "expected 4, found 3"}},
            {"example 1's index 5", ex1 + 2, 5, {"example 1: the example index is out of order", "expected 1, found 5"}},
            {"no delimiter before example 2", ex2, 7, {"example 2: the start-of-example delimiter is missing", "found 7"}},
            {"an ending too long in example 0", 5 + 3 + 2 + 3 + 4, 30, {"example 0: an ending is empty or runs past", "ending 3: expected 1..4 tokens, found 30"}},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            uint16_t* w = (uint16_t*)xmalloc(2 * words);
            memcpy(w, good, 2 * words);
            w[cases[i].at] = cases[i].value;
            const char* bad = eval_file_write("eval_bad.bin", w, words, longest);
            free(w);
            int rc = eval_load_said(bad, msg, sizeof(msg));
            char what[200];
            snprintf(what, sizeof(what), "bad eval set refused, naming the example: %s", cases[i].what);
            check(rc == -1 && strstr(msg, cases[i].said[0]) && strstr(msg, cases[i].said[1]) && strstr(msg, "eval_bad.bin"), what, msg);
        }
        uint16_t* w = (uint16_t*)xmalloc(2 * (words + 3));
        memcpy(w, good, 2 * words);
        w[words] = w[words + 1] = w[words + 2] = 1;
        const char* bad = eval_file_write("eval_bad.bin", w, words + 3, longest + 6);
        free(w);
        int rc = eval_load_said(bad, msg, sizeof(msg));
        check(rc == -1 && strstr(msg, "example 2: bytes follow the last example (6 bytes after example 2)"),
              "bad eval set refused, naming the example: bytes after the last one", msg);
        free(good);
    }
    /* the calibration cache: a line with an implausible figure is discarded with a note, then replaced */
    {
        Calibration good;
        memset(&good, 0, sizeof(good));
        good.C = 32; good.NH = 2; good.Vp = 256; good.Tc = 16;
        snprintf(good.key, sizeof(good.key), "cpu=test threads=1 ranks=1 C=32 NH=2 Vp=256 Tc=16");
        snprintf(good.path, sizeof(good.path), "%s/calib/calibration.txt", tmpdir);
        calib_gemm_rows(good.C, good.Vp, good.rows);
        for (int pass = 0; pass < 2; pass++)
            for (int q = 0; q < NUM_SHAPES; q++) { good.gemm_fixed[pass][q] = 0.008; good.gemm_row[pass][q] = 1.5e-4; }
        good.attn_ms = 0.3; good.elem_gbs = 12; good.ce_gbs = 9; good.zero_ns = 0.05; good.norm_ns = 0.1;
        good.adamw_ns = 0.9; good.adamw_gbs = 30; good.share_gflops = 80;
        for (int e = 0; e < 2; e++) for (int b = 0; b < 2; b++) good.quant_ns[e][b] = 1.2;
        good.layer_factor = 1.1; good.ms = 420;
        calib_save(&good);
        Calibration c = good;
        c.attn_ms = 0;
        check(calib_load(&c) == 1 && c.attn_ms == 0.3 && !c.discarded, "calibration cache: a plausible line is read", good.path);
        size_t n = 0;
        char* text = (char*)read_all(good.path, &n);
        CHECK(text != NULL, "read %s", good.path);
        char* bar = strchr(text, '\n') ? strchr(strchr(text, '\n'), '|') : NULL;
        ALWAYS(bar != NULL);
        size_t head = (size_t)(bar + 1 - text);
        /* the numbers, as written, to edit one at a time */
        char nums[CALIB_NUMBERS][40];
        const char* at = bar + 1;
        for (int i = 0; i < CALIB_NUMBERS; i++) {
            char* end = NULL;
            strtod(at, &end);
            snprintf(nums[i], sizeof(nums[i]), "%.*s", (int)(end - at), at);
            at = end;
        }
        struct { const char* what; int index; const char* value; const char* said; } cases[] = {
            {"NaN attention", 2 + 4 * NUM_SHAPES, "nan", "attention ms per sequence is nan, expected more than 0 and at most 100000"},
            {"Inf elementwise bandwidth", 3 + 4 * NUM_SHAPES, "inf", "elementwise GB/s is inf"},
            {"a zero GEMM time per row", 3, "0", "qkv forward GEMM ms per row is 0, expected more than 0"},
            {"a negative fixed time", 2, "-4.8", "qkv forward GEMM fixed ms is -4.8, expected 0..10000"},
            {"a huge bandwidth", 4 + 4 * NUM_SHAPES, "1e300", "cross-entropy GB/s is 1e+300"},
            {"a huge row count", 1, "18446744004990074880", "rows[1] is 1.84467e+19, expected 48..512"},
            {"a row count of another shape", 1, "104", "the row counts are 16 and 104, expected 16 and"},
            {"a layer factor outside its clamp", CALIB_NUMBERS - 2, "7", "layer factor is 7, expected 0.8..1.6"},
            {"a line cut short", -1, "", "is missing or not a number"},
            {"one number too many", -2, "", "more than"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            char line[4096];
            size_t k = 0;
            int count = cases[i].index == -1 ? CALIB_NUMBERS - 3 : CALIB_NUMBERS;
            for (int j = 0; j < count; j++)
                k += (size_t)snprintf(line + k, sizeof(line) - k, "%s%s", j ? " " : "",
                                      j == cases[i].index ? cases[i].value : nums[j]);
            if (cases[i].index == -2) k += (size_t)snprintf(line + k, sizeof(line) - k, " 1");
            char* file = (char*)xmalloc(head + k + 2);
            memcpy(file, text, head);
            memcpy(file + head, line, k);
            file[head + k] = '\n';
            CHECK(write_bytes(good.path, file, head + k + 1) == 0, "write %s", good.path);
            free(file);
            const char* log = tmp_path("calib_stderr.txt");
            fflush(stderr);
            int saved = dup(2);
            FILE* f = fopen(log, "w");
            CHECK(saved >= 0 && f != NULL && dup2(fileno(f), 2) >= 0, "cannot redirect stderr to %s", log);
            c = good;
            int rc = calib_load(&c);
            fflush(stderr);
            CHECK(dup2(saved, 2) >= 0 && close(saved) == 0 && fclose(f) == 0, "cannot restore stderr");
            size_t mn = 0;
            char* said = (char*)read_all(log, &mn);
            char what[200];
            snprintf(what, sizeof(what), "calibration cache: %s discarded with a note naming the file, line and figure", cases[i].what);
            int ok = rc == 0 && c.discarded && said && strstr(said, good.path) && strstr(said, "line 2: ") &&
                     strstr(said, cases[i].said) && strstr(said, "measured again");
            check(ok, what, said ? said : "");
            free(said);
        }
        /* the bad line is replaced: calib_save after a discard drops it, and the next start reads the new one */
        c = good;
        CHECK(calib_load(&c) == 0 && c.discarded, "reload the bad cache %s", good.path);
        c = good;
        c.discarded = 1;
        c.attn_ms = 0.25;
        calib_save(&c);
        Calibration d = good;
        int again = calib_load(&d);
        size_t n2 = 0;
        char* after = (char*)read_all(good.path, &n2);
        int lines = 0;
        for (size_t i = 0; after && i < n2; i++) lines += after[i] == '\n';
        check(again == 1 && d.attn_ms == 0.25 && !d.discarded && lines == 2,
              "calibration cache: a discarded line is replaced by the fresh calibration (header + 1 line)", after ? after : "");
        free(after);
        free(text);
    }
    /* --plan 1 and --auto 1 take every --model the trainer takes: an llm.c fp32 file, a bf16 one, a
     * Hugging Face folder and its .safetensors file */
    {
        GPT2Config c;
        c.num_layers = 1; c.channels = 32; c.num_heads = 2; c.max_seq_len = 16; c.vocab_size = 50; c.padded_vocab_size = 128;
        GPT2 m;
        gpt2_init_random(&m, &c, 5);
        const char* fp32 = tmp_path("plan_fp32.bin");
        const char* bf16 = tmp_path("plan_bf16.bin");
        const char* hf = tmp_path("plan_hf");
        CHECK(gpt2_save(&m, fp32) == 0 && hf_checkpoint_write(hf, &c, m.params_memory) == 0, "write %s, %s", fp32, hf);
        size_t n = 0;
        unsigned char* f32 = read_all(fp32, &n);
        CHECK(f32 && n == 1024 + 4 * m.num_parameters, "read %s", fp32);
        size_t nb = 1024 + 2 * m.num_parameters;
        unsigned char* b = (unsigned char*)xmalloc(nb);
        memcpy(b, f32, 1024);
        int32_t version = MODEL_VERSION_BF16;
        memcpy(b + 4, &version, 4);
        for (size_t i = 0; i < m.num_parameters; i++) memcpy(b + 1024 + 2 * i, f32 + 1024 + 4 * i + 2, 2); /* the top half */
        CHECK(write_bytes(bf16, b, nb) == 0, "write %s", bf16);
        free(b);
        free(f32);
        gpt2_free(&m);
        const char* shard = tmp_path("plan_train_000.bin");
        write_shard(shard, 400, 50, 1, SHARD_MAGIC, 1, 400);
        char st[700];
        snprintf(st, sizeof(st), "%s/model.safetensors", hf);
        const char* sources[4] = {fp32, bf16, hf, st};
        const char* names[4] = {"an llm.c fp32 file", "an llm.c bf16 file", "a Hugging Face folder", "a .safetensors file"};
        for (int i = 0; i < 4; i++)
            for (int mode = 0; mode < 2; mode++) {
                char cmd[2000], out[1 << 14];
                snprintf(cmd, sizeof(cmd), "./train_gpt --model %s -t 16 -i %s -o %s/plan_out --val-every 0 --sample-every 0 %s",
                         sources[i], shard, tmpdir, mode ? "--auto 1 --steps 0" : "--plan 1");
                int rc = run_capture(cmd, out, sizeof(out));
                char what[200];
                snprintf(what, sizeof(what), "%s takes %s as --model", mode ? "--auto 1" : "--plan 1", names[i]);
                check(rc == 0 && strstr(out, mode ? "auto: --batch-size" : "choice: --batch-size"), what, rc == 0 ? "" : out);
            }
    }
    /* --standby naming a directory: an error and a non-zero exit, not a silent "dismissed" */
    {
        const char* shard = tmp_path("sb_train_000.bin");
        write_shard(shard, 400, 50, 1, SHARD_MAGIC, 1, 400);
        const char* folder = tmp_path("sb_folder");
        mkdir(folder, 0755);
        char cmd[3000], out[8192];
        snprintf(cmd, sizeof(cmd), "./train_gpt --model d1 --channels 16 --num-heads 2 --max-seq-len 16 --vocab-size 50 "
                 "-b 2 -t 8 --val-every 0 --sample-every 0 -i %s --steps 2 --resume 1 --output-dir %s/sb_out --standby %s",
                 shard, tmpdir, folder);
        int rc = run_capture(cmd, out, sizeof(out));
        check(rc != 0 && strstr(out, "sb_folder: --standby: expected a FIFO") && strstr(out, "found a directory") &&
              !strstr(out, "dismissed"), "--standby naming a directory: refused with an error, non-zero exit", out);
    }
}

/* test_gpt --hf DIR: the checkpoints scripts/hf_reference.py wrote into DIR,
 * imported and run against PyTorch's float64 logits; F16, BF16 and F64
 * files against their F32 twins; then our export into DIR/export for the
 * script to read back. */
static void test_hf_reference(const char* dir) {
    char p[700];
    snprintf(p, sizeof(p), "%s/ref.bin", dir);
    size_t n = 0;
    unsigned char* ref = read_all(p, &n);
    int32_t h[256];
    if (!ref || n < 1024) { check(0, "Hugging Face reference: read", p); free(ref); return; }
    memcpy(h, ref, sizeof(h));
    int B = h[2], T = h[3], V = h[4];
    if (h[0] != 20261130 || h[1] != 1 || B < 1 || T < 1 || V < 1 || n != 1024 + 4ull * B * T + 4ull * B * T * V) {
        check(0, "Hugging Face reference: its header", p);
        free(ref);
        return;
    }
    int* x = (int*)xmalloc(4ull * B * T);
    float* want = xmalloc_floats((size_t)B * T * V);
    memcpy(x, ref + 1024, 4ull * B * T);
    memcpy(want, ref + 1024 + 4ull * B * T, 4ull * B * T * V);
    free(ref);
    GPT2 m;
    snprintf(p, sizeof(p), "%s/f32", dir);
    if (gpt2_load(&m, p) != 0) { check(0, "Hugging Face import: load", p); free(x); free(want); return; }
    const GPT2Config* c = &m.config;
    checkf(c->vocab_size == V && c->padded_vocab_size == 128 && c->num_layers == 2 && c->channels == 64,
           "Hugging Face import: the shape from config.json", "L=%d C=%d NH=%d maxT=%d V=%d Vp=%d", c->num_layers,
           c->channels, c->num_heads, c->max_seq_len, c->vocab_size, c->padded_vocab_size);
    int pad_zero = 1;
    for (size_t i = (size_t)V * c->channels; i < (size_t)c->padded_vocab_size * c->channels; i++) pad_zero &= m.params.wte[i] == 0.0f;
    check(pad_zero, "Hugging Face import: wte padded to Vp with zero rows", "");
    gpt2_alloc_training(&m, B, T);
    gpt2_forward(&m, x, NULL, B, T);
    float* got = xmalloc_floats((size_t)B * T * V);
    for (size_t bt = 0; bt < (size_t)B * T; bt++)
        memcpy(got + bt * V, m.acts.logits + bt * c->padded_vocab_size, 4ull * V);
    check_close("Hugging Face import: logits against PyTorch float64 (Conv1D transposed, names mapped)", got, want,
                (size_t)B * T * V, 1e-5);
    /* the same values in other dtypes and names import to the same bits */
    struct { const char* a; const char* b; const char* what; } twins[] = {
        {"f64", "f32", "F64 file (transformer.* names) imports as its F32 values"},
        {"f16", "f16_f32", "F16 file (with a tied lm_head.weight) imports as the exact half values"},
        {"bf16", "bf16_f32", "BF16 file imports as the exact bfloat16 values"},
    };
    for (int i = 0; i < 3; i++) {
        GPT2 a, b;
        char pa[700], pb[700];
        snprintf(pa, sizeof(pa), "%s/%s", dir, twins[i].a);
        snprintf(pb, sizeof(pb), "%s/%s", dir, twins[i].b);
        int la = gpt2_load(&a, pa) == 0, lb = gpt2_load(&b, pb) == 0;
        check(la && lb && a.num_parameters == b.num_parameters &&
                  memcmp(a.params_memory, b.params_memory, 4 * a.num_parameters) == 0, twins[i].what, "");
        if (la) gpt2_free(&a);
        if (lb) gpt2_free(&b);
    }
    snprintf(p, sizeof(p), "%s/export", dir);
    check(hf_checkpoint_write(p, c, m.params_memory) == 0, "Hugging Face export for the script to read back", p);
    free(got);
    free(x);
    free(want);
    gpt2_free(&m);
}

static void test_kv_cache(const char* model_path) {
    GPT2 model;
    if (gpt2_load(&model, model_path) != 0) { check(0, "kv cache: load", model_path); return; }
    int T = model.config.max_seq_len, V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
    int* x = (int*)xmalloc(sizeof(int) * (size_t)T);
    for (int t = 0; t < T; t++) x[t] = (t * 31 + 7) % V;
    gpt2_alloc_training(&model, 1, T);
    gpt2_forward(&model, x, NULL, 1, T);
    KVCache kv;
    kvcache_init(&kv, &model.config);
    double worst = 0.0;
    char detail[300] = "";
    for (int t = 0; t < T; t++) {
        const float* cached = gpt2_forward_cached(&model, &kv, x[t]);
        const float* full = model.acts.logits + (size_t)t * Vp;
        size_t at;
        double e = tensor_worst(cached, full, (size_t)Vp, &at, NULL);
        if (e >= worst) {
            worst = e;
            snprintf(detail, sizeof(detail), "position %d: worst rel err %.2e at [%zu]: %.9g vs %.9g", t, e, at,
                     cached[at], full[at]);
        }
    }
    check(worst <= 1e-5, "kv cache: one-position forward = full forward's logits at every position", detail);
    kvcache_free(&kv);
    /* generation stops at end-of-text and at maxT, deterministic for a seed */
    SamplingConfig s = {1.0f, 0, 1.0f};
    int out1[64], out2[64];
    Rng r1, r2;
    rng_init(&r1, 9);
    rng_init(&r2, 9);
    int n1 = gpt2_generate(&model, x, 3, 64, &s, &r1, -1, out1, NULL, NULL);
    int n2 = gpt2_generate(&model, x, 3, 64, &s, &r2, -1, out2, NULL, NULL);
    check(n1 == T - 3 + 1 && n1 == n2 && memcmp(out1, out2, sizeof(int) * (size_t)n1) == 0,
          "generation: reproducible for a seed, stops at the model's context", "");
    s.temperature = 0.0f; /* greedy: the first token is the argmax of the full forward's logits */
    int g = 0;
    gpt2_generate(&model, x, 3, 1, &s, &r1, -1, out1, NULL, NULL);
    const float* l2 = model.acts.logits + 2 * (size_t)Vp;
    for (int v = 1; v < V; v++) if (l2[v] > l2[g]) g = v;
    check(out1[0] == g, "generation: temperature 0 is greedy", "");
    int eot_first = out1[0];
    s.temperature = 0.0f;
    int n3 = gpt2_generate(&model, x, 3, 50, &s, &r1, eot_first, out1, NULL, NULL);
    check(n3 == 1, "generation: stops right after the end-of-text token", "");
    free(x);
    gpt2_free(&model);
}

/* The memory plan (gptc/plan.h) against the allocation ledger, in process:
 * a model set up for training as train_setup does it (dist_setup_model,
 * then gpt2_alloc_training) under --zero 0/1/2 on one process, with awkward
 * sizes (C = 24, 3 heads, V = 131 padded to 256); the KV cache; and the
 * ledger back to where it was after everything is freed. (Several ranks,
 * the loaders, the saver and the peak: scripts/tests/test_plan.sh.) */
static void test_memory_plan(void) {
    GPT2Config c = {20, 131, 256, 3, 3, 24};
    for (int zero = 0; zero <= 2; zero++) {
        size_t before = ledger.total, was[MEM_COMPONENTS];
        memcpy(was, ledger.now, sizeof(was));
        GPT2 model;
        gpt2_init_random(&model, &c, 5);
        Dist d;
        memset(&d, 0, sizeof(d));
        d.world = 1;
        d.zero = zero;
        dist_setup_model(&d, &model);
        gpt2_alloc_training(&model, 3, 7);
        PlanKnobs k;
        memset(&k, 0, sizeof(k));
        k.config = c;
        k.B = 3;
        k.T = 7;
        k.world = 1;
        k.zero = zero;
        CpuMemoryPlan p;
        cpu_memory_plan(&p, &k);
        char detail[400] = "";
        int ok = 1;
        for (int m = 0; m < MEM_COMPONENTS; m++)
            if (ledger.now[m] - was[m] != p.setup[m]) {
                ok = 0;
                snprintf(detail, sizeof(detail), "%s: ledger %zu bytes, plan %zu", MEM_NAMES[m], ledger.now[m] - was[m],
                         p.setup[m]);
            }
        char what[120];
        snprintf(what, sizeof(what), "memory plan: the ledger's bytes by component, --zero %d on one process", zero);
        check(ok, what, detail);
        gpt2_free(&model);
        dist_finish(&d, 0);
        check(ledger.total == before, "memory plan: the ledger is back where it was once all is freed", "");
    }
    size_t before = ledger.now[MEM_SAMPLER], sizes[NUM_KVCACHE_TENSORS];
    KVCache kv;
    kvcache_init(&kv, &c);
    kvcache_sizes(sizes, &c);
    check(ledger.now[MEM_SAMPLER] - before == tensors_floats(sizes, NUM_KVCACHE_TENSORS) * sizeof(float),
          "memory plan: the KV cache's bytes", "");
    kvcache_free(&kv);
}

/* top-k and top-p keep only the most likely tokens */
static void test_sampler(void) {
    float logits[5] = {0.0f, 3.0f, 1.0f, 2.9f, -1.0f};
    ScoredToken work[5];
    int hist[5] = {0};
    Rng rng;
    rng_init(&rng, 1);
    for (int i = 0; i < 4000; i++) hist[sample_token(logits, 5, 1.0f, 2, 1.0f, rng_uniform(&rng), work)]++;
    check(hist[0] == 0 && hist[2] == 0 && hist[4] == 0 && hist[1] > 1700 && hist[3] > 1500,
          "sampler: top-k 2 draws only the two most likely tokens, in proportion", "");
    memset(hist, 0, sizeof(hist));
    /* probabilities ~ 0.02 0.45 0.06 0.41 0.01: top-p 0.5 keeps tokens 1 and 3 */
    for (int i = 0; i < 4000; i++) hist[sample_token(logits, 5, 1.0f, 0, 0.5f, rng_uniform(&rng), work)]++;
    check(hist[0] == 0 && hist[2] == 0 && hist[4] == 0 && hist[1] > 0 && hist[3] > 0, "sampler: top-p 0.5", "");
    check(sample_token(logits, 5, 0.0f, 0, 1.0f, 0.99f, work) == 1, "sampler: temperature 0 is the argmax", "");
}

static void test_text_documents(void) {
    DocumentList l;
    memset(&l, 0, sizeof(l));
    const char* text = "\n\nfirst doc\nline two\n\npara two\n\n\nsecond doc\n \t\n\r\nthird\n\n\n\n";
    documents_split_text(&l, text, strlen(text));
    int ok = l.n == 3 && !strcmp(l.docs[0].text, "first doc\nline two\n\npara two") &&
             !strcmp(l.docs[1].text, "second doc") && !strcmp(l.docs[2].text, "third");
    check(ok, "text: documents split at 2+ blank lines; one blank line is a paragraph", "");
    documents_free(&l);
    /* JSONL: escapes, nested values before the field, \u with surrogate pairs */
    const char* jsonl = "{\"id\": 1, \"meta\": {\"a\": [1, {\"text\": \"no\"}], \"b\": null}, \"text\": \"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\" \\n\\ttab\"}\n"
                        "\n{\"text\": \"\"}\n";
    const char* p = tmp_path("t.jsonl");
    write_bytes(p, jsonl, strlen(jsonl));
    ok = documents_read(&l, p) == 0 && l.n == 2 &&
         !strcmp(l.docs[0].text, "caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\" \n\ttab") && l.docs[1].len == 0;
    check(ok, "text: JSONL \"text\" fields decoded (escapes, surrogate pairs, nested values skipped)", ok ? "" : (l.n ? l.docs[0].text : ""));
    if (l.n) documents_free(&l);
    struct { const char* name; const char* content; const char* file; } bad[] = {
        {"JSONL line without a text field", "{\"text\": \"a\"}\n{\"title\": \"b\"}\n", "bad1.jsonl"},
        {"JSONL line that is not an object", "{\"text\": \"a\"}\n[1, 2]\n", "bad2.jsonl"},
        {"JSONL with a broken string", "{\"text\": \"a\n", "bad3.jsonl"},
        {"empty text file", "", "empty.txt"},
        {"text file of blank lines", "\n \n\t\n", "blank.txt"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char* bp = tmp_path(bad[i].file);
        write_bytes(bp, bad[i].content, strlen(bad[i].content));
        char what[160];
        snprintf(what, sizeof(what), "text: refused: %s", bad[i].name);
        int rc = documents_read(&l, bp);
        if (rc == 0) documents_free(&l);
        check(rc == -1, what, "");
    }
    /* each JSONL line is read strictly: what a lax reader would take silently is refused */
    char deep[200];
    int k = 0;
    k += snprintf(deep + k, sizeof(deep) - (size_t)k, "{\"text\": \"x\", \"n\": ");
    for (int d = 0; d < 70; d++) deep[k++] = '[';
    for (int d = 0; d < 70; d++) deep[k++] = ']';
    snprintf(deep + k, sizeof(deep) - (size_t)k, "}");
    struct { const char* line; const char* why; } strict[] = {
        {"{\"text\": \"a\"} junk", "more follows the object"},
        {"{\"text\": \"a\"}{\"text\": \"b\"}", "more follows the object"},
        {"{\"text\": \"a\"", "not closed"},
        {"{\"text\": \"He said \"hi\" and left, with 137 bytes of text after the quote that were lost\"}", "unescaped"},
        {"{\"text\": \"a\", \"n\": nul}", "not JSON"},
        {"{\"text\": \"a\", \"n\": 1x}", "',' or '}' is missing"},
        {"{\"text\": \"a\", \"n\": 01}", "',' or '}' is missing"},
        {"{\"text\": \"a\", \"text\": \"b\"}", "appears twice"},
        {deep, "nested too deep"},
    };
    for (size_t i = 0; i < sizeof(strict) / sizeof(strict[0]); i++) {
        char* value = NULL;
        JsonError e = {NULL, NULL};
        const char* line = strict[i].line;
        long n = json_object_field(line, line + strlen(line), "text", &value, &e);
        char what[200];
        snprintf(what, sizeof(what), "JSONL strict: refused with \"%s\": %.60s", strict[i].why, line);
        check(n == -1 && value == NULL && e.why && strstr(e.why, strict[i].why), what, e.why ? e.why : "accepted");
        free(value);
    }
    const char* good[] = {"{\"n\": -1.5e+3, \"t\": true, \"f\": false, \"z\": null, \"o\": {}, \"a\": [], \"text\": \"ok\"} \r",
                          "  {\"text\":\"ok\"}"};
    for (size_t i = 0; i < 2; i++) {
        char* value = NULL;
        JsonError e = {NULL, NULL};
        long n = json_object_field(good[i], good[i] + strlen(good[i]), "text", &value, &e);
        check(n == 2 && value && !strcmp(value, "ok"), "JSONL strict: valid JSON still read", e.why ? e.why : good[i]);
        free(value);
    }
    check(documents_read(&l, tmp_path("missing.txt")) == -1, "text: refused: missing file", "");
    const char* empty_dir = tmp_path("no_txt_dir");
    mkdir(empty_dir, 0755);
    check(documents_read(&l, empty_dir) == -1, "text: refused: directory without .txt files", "");
}

/* Text -> shards -> tokens -> text: the documents come back exactly, each
 * after one end-of-text token, split into val and train as documented. */
static void test_prepare_shards(const Tokenizer* tok) {
    const char* dir = tmp_path("corpus");
    mkdir(dir, 0755);
    /* 40 documents of varied text in two files */
    char* docs[40];
    for (int i = 0; i < 40; i++) {
        docs[i] = (char*)xmalloc(512);
        snprintf(docs[i], 512, "Document %d: caf\xc3\xa9 na\xc3\xafve \xce\xb1\xce\xb2\xce\xb3 %s\nSecond line,   spaced.\n\nAnother paragraph %d.",
                 i, i % 3 ? "don't stop" : "\xf0\x9f\x98\x80 emoji", i * i);
    }
    for (int f = 0; f < 2; f++) {
        char path[700];
        snprintf(path, sizeof(path), "%s/part%d.txt", dir, f);
        FILE* fp = fopen(path, "wb");
        CHECK(fp != NULL, "write %s", path);
        for (int i = f * 20; i < f * 20 + 20; i++) fprintf(fp, "%s\n\n\n", docs[i]);
        CHECK(fclose(fp) == 0, "close %s", path);
    }
    char prefix[700];
    snprintf(prefix, sizeof(prefix), "%s/out/c", tmpdir);
    mkdir_p(tmp_path("corpus/out"));
    snprintf(prefix, sizeof(prefix), "%s/corpus/out/c", tmpdir);
    ShardStats st;
    int rc = prepare_shards(dir, prefix, tok, 0.1, 300, &st);
    char detail[200];
    snprintf(detail, sizeof(detail), "%zu docs, val %zu tokens in %d shard, train %zu in %d shards", st.documents,
             st.val_tokens, st.val_shards, st.train_tokens, st.train_shards);
    check(rc == 0 && st.documents == 40 && st.val_shards == 1 && st.train_shards == (int)((st.train_tokens + 299) / 300),
          "prepare: a directory of .txt files into val + train shards of the given size", detail);
    /* read everything back through the data loader's header check */
    size_t total = st.val_tokens + st.train_tokens;
    uint16_t* all = (uint16_t*)xmalloc(total * 2);
    size_t k = 0;
    char path[800];
    for (int s = -1; s < st.train_shards; s++) {
        if (s < 0) snprintf(path, sizeof(path), "%s_val_000000.bin", prefix);
        else snprintf(path, sizeof(path), "%s_train_%06d.bin", prefix, s);
        long long n = 0;
        if (shard_header(path, &n) != 0) { k = 0; break; }
        size_t len;
        char* bytes = file_read_all(path, &len);
        memcpy(all + k, bytes + 1024, (size_t)n * 2);
        k += (size_t)n;
        free(bytes);
    }
    int back = k == total;
    int doc = 0;
    size_t val_docs = 0;
    for (size_t i = 0; back && i < total;) {
        back &= all[i] == tok->eot_token;
        size_t j = i + 1;
        while (j < total && all[j] != tok->eot_token) j++;
        int ids[4096];
        for (size_t m = i + 1; m < j; m++) ids[m - i - 1] = all[m];
        unsigned char text[4096];
        int64_t len = tokenizer_decode_many(tok, ids, j - i - 1, text, sizeof(text));
        back &= doc < 40 && len == (int64_t)strlen(docs[doc]) && memcmp(text, docs[doc], (size_t)len) == 0;
        if (i < st.val_tokens) val_docs++;
        doc++;
        i = j;
    }
    check(back && doc == 40, "prepare: shards decode back to the documents, each after one end-of-text token", "");
    /* val = first documents up to the first boundary at or after 10% of tokens */
    int split_ok = st.val_tokens >= (size_t)ceil(0.1 * total) && st.val_tokens < total &&
                   all[st.val_tokens] == tok->eot_token;
    snprintf(detail, sizeof(detail), "val %zu of %zu tokens (%zu documents)", st.val_tokens, total, val_docs);
    check(split_ok, "prepare: the val split ends at the first document boundary past 10%", detail);
    free(all);
    for (int i = 0; i < 40; i++) free(docs[i]);
    /* one long document: the split falls inside it */
    const char* one = tmp_path("one.txt");
    char big[20000];
    size_t bl = 0;
    while (bl + 40 < sizeof(big)) bl += (size_t)snprintf(big + bl, sizeof(big) - bl, "word %zu and more words. ", bl);
    write_bytes(one, big, bl);
    snprintf(prefix, sizeof(prefix), "%s/one", tmpdir);
    rc = prepare_shards(one, prefix, tok, 0.05, 1000000, &st);
    size_t want = (size_t)ceil(0.05 * (double)(st.val_tokens + st.train_tokens));
    check(rc == 0 && st.documents == 1 && st.val_tokens == want, "prepare: one long document is split at exactly 5%", "");
    Tokenizer decode_only;
    memset(&decode_only, 0, sizeof(decode_only));
    check(prepare_shards(one, prefix, &decode_only, 0.05, 1000, &st) == -1, "prepare: refused without the merges file", "");
}

/* ---------------------------------------------------------------------- */
/* The trainer binary end to end                                          */
/* ---------------------------------------------------------------------- */
static void test_trainer_binary(void) {
    if (access("./train_gpt", X_OK) != 0) {
        check(0, "train_gpt binary present (make test builds it)", "");
        return;
    }
    /* data with a rule to learn: token i = (7 i + seed) mod 50 */
    const char* shard = tmp_path("cli_train_000.bin");
    write_shard(shard, 4000, 50, 1, SHARD_MAGIC, 1, 4000);
    const char* out_dir = tmp_path("cli_out/nested");
    const char* log_path = tmp_path("cli_log.jsonl");
    char cmd[1600], out[1 << 15]; /* (the usage text, printed with a refusal, is over 8 KB) */
    snprintf(cmd, sizeof(cmd),
             "./train_gpt --model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 50 -i %s -j %s "
             "-b 4 -t 16 -x 30 --lr 3e-3 --warmup-steps 3 -o %s --log-file %s --val-every 10 --val-batches 2 "
             "--sample-every 15 -g 8 --tokenizer %s/none.bin --threads 2",
             shard, shard, out_dir, log_path, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0, "train_gpt trains a small model end to end (exit 0)", rc == 0 ? "" : out);
    /* first and last validation loss */
    const char* first = strstr(out, "val loss ");
    const char* last = first;
    for (const char* q = first; q; q = strstr(q + 1, "val loss ")) last = q;
    double v0 = first ? atof(first + 9) : 0, v1 = last ? atof(last + 9) : 0;
    char detail[128];
    snprintf(detail, sizeof(detail), "val loss %.4f -> %.4f (ln 50 = %.2f)", v0, v1, log(50.0));
    check(first && last != first && v1 < 0.5 * v0, "train_gpt: validation loss falls by half on learnable data", detail);
    check(strstr(out, "step    30/30 | loss ") != NULL && strstr(out, "tok/s") && strstr(out, "sample: "),
          "train_gpt: progress lines and samples printed", "");
    char ckpt[700];
    snprintf(ckpt, sizeof(ckpt), "%s/model_00000030.bin", out_dir);
    GPT2 m;
    int loaded = gpt2_load(&m, ckpt) == 0;
    check(loaded && m.config.num_layers == 2 && m.config.channels == 32 && m.config.vocab_size == 50,
          "train_gpt: final checkpoint saved (in a created nested directory) and loads", ckpt);
    if (loaded) gpt2_free(&m);
    size_t n = 0;
    unsigned char* log_bytes = read_all(log_path, &n);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += log_bytes[i] == '\n';
    check(log_bytes && lines == 30 + 4, "train_gpt: JSONL log has 30 step lines and 4 validation lines", "");
    free(log_bytes);

    /* refusals from the binary: non-zero exit and a message naming the problem */
    struct { const char* args; const char* expect; } bad[] = {
        {"-i /nonexistent/x_*.bin --model d2 --channels 32 --num-heads 2", "no data files match"},
        {"--model d2 --channels 32 --num-heads 2 --max-seq-len 8 -t 16", "exceeds the model's max_seq_len"},
        {"--model /nonexistent/model.bin", "cannot open model file"},
        {"--frobnicate 3", "unknown flag"},
        {"-b 3 -t 5 -d 100", "multiple of --batch-size"},
        {"--model d2 --channels 30 --num-heads 4", "multiple of num_heads"},
        {"--gelu-fusion 1", "is a flag of train_gpt_cu"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "./train_gpt -i %s %s", shard, bad[i].args);
        rc = run_capture(cmd, out, sizeof(out));
        char what[200];
        snprintf(what, sizeof(what), "train_gpt refuses %s", bad[i].args);
        check(rc != 0 && rc != -1 && strstr(out, bad[i].expect) != NULL, what, strstr(out, bad[i].expect) ? "" : out);
    }
}

/* Stop and resume: the training state (moments, step, data position,
 * sampler RNG) makes a resumed run bit-for-bit the uninterrupted one; a
 * corrupt or truncated newest state is caught by its checksum and the one
 * before is used; an incompatible run is refused. */
static void test_resume(void) {
    const char* shard = tmp_path("rs_train_000.bin");
    write_shard(shard, 6000, 50, 3, SHARD_MAGIC, 1, 6000);
    char common[1400], cmd[2000], out[8192], a[800], b[800];
    snprintf(common, sizeof(common),
             "./train_gpt --model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 50 -i %s -j %s -b 4 -t 16 "
             "-x 12 --lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 5 --val-batches 2 --sample-every 0 "
             "--shuffle 1 --save-every 4 --threads 2", shard, shard);
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsA", common, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsB --stop-at 6", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    int stopped = strstr(out, "stopping after step 6") != NULL;
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsB --resume 1", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/rsA/model_00000012.bin", tmpdir);
    snprintf(b, sizeof(b), "%s/rsB/model_00000012.bin", tmpdir);
    check(rc == 0 && stopped && strstr(out, "continuing after step 6") && files_equal(a, b),
          "resume: stopped at step 6 and resumed, the final weights are bit-for-bit the uninterrupted run's", rc ? out : "");
    /* retention (--keep-last 2 by default): of the states at 4, 8, 12 the two newest remain */
    char st4[800], st8[800], st12[800], mk4[800];
    snprintf(st4, sizeof(st4), "%s/rsA/state_00000004_rank0.bin", tmpdir);
    snprintf(mk4, sizeof(mk4), "%s/rsA/state_00000004.complete", tmpdir);
    snprintf(st8, sizeof(st8), "%s/rsA/state_00000008_rank0.bin", tmpdir);
    snprintf(st12, sizeof(st12), "%s/rsA/state_00000012.complete", tmpdir);
    check(access(st4, F_OK) != 0 && access(mk4, F_OK) != 0 && access(st8, F_OK) == 0 && access(st12, F_OK) == 0,
          "retention: the two newest training states are kept, older ones removed (marker and file)", "");
    /* corrupt the newest state (step 8 of a run stopped there): the checksum catches it, step 4 is used */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsC --stop-at 8", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    char state[800];
    snprintf(state, sizeof(state), "%s/rsC/state_00000008_rank0.bin", tmpdir);
    size_t n = 0;
    unsigned char* bytes = read_all(state, &n);
    if (bytes && n > 5000) {
        bytes[3000] ^= 0x40; /* a bit in the weights */
        write_bytes(state, bytes, n);
    }
    free(bytes);
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsC --resume 1", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsC/model_00000012.bin", tmpdir);
    check(rc == 0 && strstr(out, "checksum mismatch") && strstr(out, "continuing after step 4") && files_equal(a, b),
          "resume: a corrupted newest state is refused by its checksum, the previous one is used, still bit-for-bit", rc ? out : "");
    /* truncate the newest state of another stopped run */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsD --stop-at 8", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(state, sizeof(state), "%s/rsD/state_00000008_rank0.bin", tmpdir);
    bytes = read_all(state, &n);
    if (bytes) write_bytes(state, bytes, n / 2);
    free(bytes);
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsD --resume 1", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsD/model_00000012.bin", tmpdir);
    check(rc == 0 && strstr(out, "continuing after step 4") && files_equal(a, b),
          "resume: a truncated newest state is refused, the previous one is used, still bit-for-bit", rc ? out : "");
    /* every state of the run corrupt: a clear error, not a silent fresh start */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsF --stop-at 8", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    for (int st = 4; st <= 8; st += 4) {
        snprintf(state, sizeof(state), "%s/rsF/state_%08d_rank0.bin", tmpdir, st);
        bytes = read_all(state, &n);
        if (bytes && n > 5000) {
            bytes[3000] ^= 0x40;
            write_bytes(state, bytes, n);
        }
        free(bytes);
    }
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsF --resume 1", common, tmpdir);
    int rc2 = run_capture(cmd, out, sizeof(out));
    check(rc == 0 && rc2 != 0 && strstr(out, "no usable training state") && !strstr(out, "step     1/"),
          "resume: when every state of the run is corrupt, an error, and no fresh start over it", out);
    /* an incompatible run is refused, naming what differs */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsB --resume 1 -b 2 -x 20", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc != 0 && strstr(out, "tokens per step) differs"),
          "resume: a run with another --batch-size (so another number of tokens per step) is refused", strstr(out, "differs") ? "" : out);
    /* a run started afresh (no --resume) in a folder holding an earlier run's states: on a later resume the
     * earlier run's newer state (step 8) is passed over for this run's own (step 4) */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsE --stop-at 8 --seed 7", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsE --stop-at 4", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsE --resume 1", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsE/model_00000012.bin", tmpdir);
    check(rc == 0 && strstr(out, "belongs to an earlier run") && strstr(out, "continuing after step 4") && files_equal(a, b),
          "resume: an earlier run's state in the same folder is passed over (run.id), this run's continues bit for bit",
          rc ? out : "");
    /* a compatible change: half the micro-batch, two of them per step (the same tokens per step), more steps */
    snprintf(cmd, sizeof(cmd), "%s -o %s/rsC --resume 1 -b 2 -d 64 -x 14", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsC/model_00000014.bin", tmpdir);
    check(rc == 0 && strstr(out, "resharding") && strstr(out, "continuing after step 12") &&
              strstr(out, "--steps is 14, the state's run had 12") && access(b, F_OK) == 0,
          "resume: B=2 x 2 micro-batches continues a B=4 state (same tokens per step), and --steps may grow", rc ? out : "");
}

/* check() with the program's output as the detail, shown only on failure */
static void check_out(int ok, const char* what, const char* out) { check(ok, what, ok ? "" : out); }

/* Write a state file of `s` (its slice [lo, hi) of the weights and moments
 * taken from full P-float arrays) with valid checksums: the tests below
 * build states no run wrote, to see that a consistent-looking but wrong
 * file is refused, not trusted. */
static void state_write_for_test(const char* path, const StateInfo* s, const float* w, const float* m, const float* v) {
    size_t n = s->hi - s->lo;
    uint32_t crc[3] = {crc32c(0, w + s->lo, n * 4), crc32c(0, m + s->lo, n * 4), crc32c(0, v + s->lo, n * 4)};
    int32_t h[HEADER_INTS];
    state_header_make(h, s, crc);
    FILE* f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    CHECK(fwrite(h, 1, STATE_HEADER_BYTES, f) == STATE_HEADER_BYTES && fwrite(w + s->lo, 4, n, f) == n &&
          fwrite(m + s->lo, 4, n, f) == n && fwrite(v + s->lo, 4, n, f) == n && fclose(f) == 0, "write %s", path);
}

static int state_header_quiet(const void* path) {
    StateInfo s;
    int32_t h[HEADER_INTS];
    return state_read_header((const char*)path, &s, h, 0);
}

/* A training state's header must agree with itself field by field: each
 * header below has a valid checksum and every field in range, but one
 * field contradicts the rest (the slice against the rank, world and P; the
 * tokens per step against B x T x ranks; the step against --steps; the
 * loss window's count, next slot and entries; an unused word set). */
static void test_state_headers(void) {
    char msg[4096];
    StateInfo s;
    memset(&s, 0, sizeof(s));
    s.config.num_layers = 1; s.config.channels = 32; s.config.num_heads = 2; s.config.max_seq_len = 16;
    s.config.vocab_size = 50; s.config.padded_vocab_size = 128;
    s.P = parameter_count(&s.config);
    s.step = 5; s.steps = 10; s.rank = 1; s.world = 2; s.zero = 1; s.B = 2; s.T = 8; s.total = 64; s.seed = 42;
    s.shuffle = 1; s.epoch = 0; s.shard_pos = 0; s.cursor = 160; s.sample_rng = 0x9E3779B97F4A7C15ull; s.nonce = 0x1234;
    size_t shard = (s.P + 1) / 2;
    s.lo = shard; s.hi = s.P;
    s.watch.count = 3; s.watch.next = 3; s.watch.recent[0] = 3.1f; s.watch.recent[1] = 3.0f; s.watch.recent[2] = 2.9f;
    size_t n = s.hi - s.lo;
    float* arrays = xmalloc_floats(3 * n);
    for (size_t i = 0; i < 3 * n; i++) arrays[i] = 0.001f * (float)(i % 1000);
    uint32_t crc[3] = {crc32c(0, arrays, n * 4), crc32c(0, arrays + n, n * 4), crc32c(0, arrays + 2 * n, n * 4)};
    int32_t good[HEADER_INTS];
    state_header_make(good, &s, crc);
    char path[1200];
    snprintf(path, sizeof(path), "%s", tmp_path("state_00000005_rank1.bin")); /* (tmp_path's buffer is reused) */
    float nan = NAN, past = 1.5f;
    int32_t nan_bits, past_bits;
    memcpy(&nan_bits, &nan, 4);
    memcpy(&past_bits, &past, 4);
    struct { const char* what; int at[2]; int32_t value[2]; const char* said; } cases[] = {
        {"none: the header as written", {-1, -1}, {0, 0}, NULL},
        {"an unused word (19) set", {19, -1}, {1, 0}, "header field word 19 (unused) holds 1, expected 0"},
        {"an unused word past the loss window (200) set", {200, -1}, {7, 0}, "word 200 (unused) holds 7, expected 0"},
        {"tokens per step 48 with B=2, T=8 on 2 ranks", {8, -1}, {48, 0},
         "tokens per step ([8]) holds 48, expected a multiple of B x T x ranks = 2 x 8 x 2 = 32"},
        {"the slice moved by one float (its size kept)", {24, 26}, {(int32_t)shard - 1, (int32_t)s.P - 1},
         "slice start ([24..25]) holds"},
        {"rank 0 holding rank 1's slice", {3, -1}, {0, 0}, "slice start ([24..25]) holds"},
        {"step 11 of a run of --steps 10", {2, -1}, {11, 0}, "step ([2]) holds 11, expected at most the run's --steps, 10"},
        {"the loss window's next slot 5 with 3 losses held", {36, -1}, {5, 0},
         "loss window's next slot ([36]) holds 5, expected 3"},
        {"a NaN loss in the window", {41, -1}, {nan_bits, 0}, "loss window's entry 1 ([41])"},
        {"a loss past the window's count", {50, -1}, {past_bits, 0}, "entry 10 ([50])"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int32_t h[HEADER_INTS];
        memcpy(h, good, sizeof(h));
        for (int k = 0; k < 2; k++)
            if (cases[i].at[k] >= 0) h[cases[i].at[k]] = cases[i].value[k];
        h[255] = (int32_t)crc32c(0, h, 255 * sizeof(int32_t));
        FILE* f = fopen(path, "wb");
        CHECK(f != NULL && fwrite(h, 1, STATE_HEADER_BYTES, f) == STATE_HEADER_BYTES &&
              fwrite(arrays, 4, 3 * n, f) == 3 * n && fclose(f) == 0, "write %s", path);
        int rc = said_while(state_header_quiet, path, msg, sizeof(msg));
        char what[200];
        snprintf(what, sizeof(what), "training state header: %s %s", cases[i].what,
                 cases[i].said ? "refused, naming the field, what it holds and what is expected" : "read");
        check(cases[i].said ? rc == -1 && strstr(msg, cases[i].said) && strstr(msg, path) : rc == 0, what, msg);
    }
    free(arrays);
}

/* Read back a one-rank state written by a run: header and full arrays. */
static int state_read_for_test(const char* path, StateInfo* s, float** w, float** m, float** v) {
    int32_t h[HEADER_INTS];
    if (state_read_header(path, s, h, 0) != 0 || s->lo != 0 || s->hi != s->P) return -1;
    *w = xmalloc_floats(s->P); *m = xmalloc_floats(s->P); *v = xmalloc_floats(s->P);
    return state_read_arrays(path, s, h, *w, *m, *v, 0, s->P);
}

/* What a user walks into with saved runs: states split over ranks that
 * do not belong together, damaged counters, run.id, --steps, other data,
 * folder names with glob characters, --shm-dir, --steps 0, quiet output. */
static void test_user_paths(void) {
    const char* shard = tmp_path("up_train_000.bin");
    write_shard(shard, 6000, 50, 3, SHARD_MAGIC, 1, 6000);
    const char* small = tmp_path("up_small_000.bin");
    write_shard(small, 200, 50, 3, SHARD_MAGIC, 1, 200);
    char common[1400], cmd[3000], out[8192], a[900], b[1000], dir[900];
    snprintf(common, sizeof(common),
             "./train_gpt --model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 50 -b 4 -t 16 "
             "-x 12 --lr 3e-3 --warmup-steps 2 --val-every 0 --sample-every 0 --shuffle 1 --save-every 4 --threads 2");
    /* the uninterrupted run */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upA", common, shard, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/upA/model_00000012.bin", tmpdir);
    check(rc == 0 && !strstr(out, "timing:") && !strstr(out, "data parallel:"),
          "one process: no start-up timing or data-parallel lines (noise for a single run)", rc ? out : "");
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upV -x 1 --verbose 1", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0 && strstr(out, "timing: model ready") && strstr(out, "data parallel: 1 rank"),
          "--verbose 1: the timing and data-parallel lines are printed", rc ? out : "");

    /* --steps 0: the initial model, equal to the random init of the same seed */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/up0 -x 0 --seed 5", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/up0/model_00000000.bin", tmpdir);
    GPT2 m0, ref;
    int loaded = rc == 0 && gpt2_load(&m0, b) == 0;
    int same = 0;
    if (loaded) {
        gpt2_init_random(&ref, &m0.config, 5);
        same = memcmp(ref.params_memory, m0.params_memory, m0.num_parameters * 4) == 0;
        gpt2_free(&ref);
        gpt2_free(&m0);
    }
    check(loaded && same && strstr(out, "wrote the initial model"),
          "--steps 0 writes the untrained model (bit for bit the random init of its seed)", rc ? out : b);

    /* --shm-dir that does not exist is created */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upS -x 3 --snapshot-every 1 --shm-dir %s/no/such/shm", common, shard,
             tmpdir, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0, "--shm-dir that does not exist is created (memory snapshots run)", rc ? out : "");

    /* glob characters in --output-dir: stop, resume (finds its states), prune */
    snprintf(dir, sizeof(dir), "%s/up lr[3e-4]*", tmpdir);
    snprintf(cmd, sizeof(cmd), "%s -i %s -o '%s' --stop-at 8", common, shard, dir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s -i %s -o '%s' --resume 1", common, shard, dir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/model_00000012.bin", dir);
    char st4[1000];
    snprintf(st4, sizeof(st4), "%s/state_00000004_rank0.bin", dir);
    check(rc == 0 && strstr(out, "continuing after step 8") && files_equal(a, b) && access(st4, F_OK) != 0,
          "--output-dir with glob characters: resume finds its states (bit for bit) and old ones are pruned", rc ? out : "");
    /* -i of a file whose name holds glob characters */
    snprintf(b, sizeof(b), "%s/up[1].bin", tmpdir);
    write_shard(b, 6000, 50, 3, SHARD_MAGIC, 1, 6000);
    snprintf(cmd, sizeof(cmd), "%s -i '%s' -x 2", common, b);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0, "--train-data naming a file with glob characters in its name reads that file", rc ? out : "");

    /* a run stopped at 8 (states at 4 and 8) to resume in the cases below */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upB --stop-at 8", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    char state8[900], runid[900];
    snprintf(state8, sizeof(state8), "%s/upB/state_00000008_rank0.bin", tmpdir);
    snprintf(runid, sizeof(runid), "%s/upB/run.id", tmpdir);
    size_t n8 = 0, nid = 0;
    unsigned char* bytes8 = read_all(state8, &n8);
    unsigned char* id = read_all(runid, &nid);
    check(rc == 0 && bytes8 && id, "a run stopped at step 8 for the resume cases", rc ? out : "");
    if (!bytes8 || !id) { free(bytes8); free(id); return; }

    /* a smaller --steps than the state's step: refused, nothing written */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upB --resume 1 -x 6", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/upB/model_00000006.bin", tmpdir);
    check_out(rc != 0 && rc != -1 && strstr(out, "past --steps 6") && access(b, F_OK) != 0,
          "resume with --steps below the state's step is refused, and writes no state or model", out);
    /* other data, too short for the saved position: named as such */
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upB --resume 1", common, small, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check_out(rc != 0 && rc != -1 && strstr(out, "saved at data position") && strstr(out, small) &&
              !strstr(out, "step     9/"),
          "resume on data lacking the saved position: an error naming the position and the data", out);
    /* run.id: one changed digit is caught; a valid id of another run makes every state another run's */
    unsigned char* damaged = (unsigned char*)xmalloc(nid);
    memcpy(damaged, id, nid);
    damaged[3] = damaged[3] == '0' ? '1' : '0';
    write_bytes(runid, damaged, nid);
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upB --resume 1", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check_out(rc != 0 && rc != -1 && strstr(out, "run.id") && strstr(out, "damaged") && !strstr(out, "step     1/"),
          "resume with a damaged run.id: refused, not a fresh start over the states", out);
    char other[64];
    run_id_format(other, sizeof(other), 0x123456789abcdefULL);
    write_bytes(runid, other, strlen(other));
    rc = run_capture(cmd, out, sizeof(out));
    check_out(rc != 0 && rc != -1 && strstr(out, "belongs to another run") && !strstr(out, "step     1/") &&
              access(state8, F_OK) == 0,
          "resume where every state is another run's: refused, the states kept", out);
    write_bytes(runid, id, nid);
    free(damaged);

    /* the state split as two ranks' files (what 2 ranks write), resumed by one process: resharding */
    StateInfo s;
    float *w = NULL, *m = NULL, *v = NULL;
    int read = state_read_for_test(state8, &s, &w, &m, &v) == 0;
    check(read, "the step-8 state reads back", state8);
    if (!read) { free(w); free(m); free(v); free(bytes8); free(id); return; }
    char marker[900], rank1[900];
    snprintf(rank1, sizeof(rank1), "%s/upB/state_00000008_rank1.bin", tmpdir);
    snprintf(marker, sizeof(marker), "%s/upB/state_00000008.complete", tmpdir);
    StateInfo r0 = s, r1 = s;
    r0.world = r1.world = 2; r1.rank = 1;
    r0.hi = r1.lo = s.P / 2;
    r0.B = r1.B = s.B / 2;
    state_write_for_test(state8, &r0, w, m, v);
    state_write_for_test(rank1, &r1, w, m, v);
    snprintf(cmd, sizeof(cmd), "%s -i %s -o %s/upB --resume 1", common, shard, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/upB/model_00000012.bin", tmpdir);
    check(rc == 0 && strstr(out, "continuing after step 8") && files_equal(a, b),
          "a state written as two ranks' files resumes on one process, bit for bit", rc ? out : "");
    /* rank 1's file, checksums valid, but not of this state: each must be refused (the resumed run above
     * left states at 12 and 8: remove 12 so step 8 is the newest again) */
    snprintf(b, sizeof(b), "rm -f %s/upB/state_00000012*", tmpdir);
    if (system(b) != 0) check(0, "remove step 12's state", b);
    struct { const char* what; int field; } bad[] = {
        {"another model shape that claims more parameters (a heap overflow if unchecked)", 0},
        {"another run's nonce", 1},
        {"a step inside that differs from its name", 2},
        {"another --seq-len", 3},
        {"a slice that does not start where rank 0's ends", 4},
        {"another data position", 5},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        StateInfo t = r1;
        float *w2 = w, *m2 = m, *v2 = v;
        float* big = NULL;
        switch (bad[i].field) {
        case 0:
            t.config.num_layers += 2;
            t.P = parameter_count(&t.config);
            t.hi = t.P;
            big = xmalloc_floats(3 * t.P);
            memset(big, 0, 3 * t.P * 4);
            w2 = big; m2 = big + t.P; v2 = big + 2 * t.P;
            break;
        case 1: t.nonce ^= 1; break;
        case 2: t.step = 9; break;
        case 3: t.T = 8; break;
        case 4: t.lo -= 1; break;
        case 5: t.cursor += 4; break;
        }
        state_write_for_test(rank1, &t, w2, m2, v2);
        free(big);
        rc = run_capture(cmd, out, sizeof(out));
        char what[300];
        snprintf(what, sizeof(what), "rank 1's state file with %s: a clear error naming it, no crash", bad[i].what);
        check_out(rc != 0 && rc != -1 && strstr(out, rank1) && !strstr(out, "continuing after step 8"), what, out);
    }
    /* counters out of range in an otherwise valid header */
    state_write_for_test(rank1, &r1, w, m, v);
    struct { const char* what; int field; } counters[] = {{"epoch", 0}, {"bad-step count", 1}, {"data position", 2}};
    for (size_t i = 0; i < sizeof(counters) / sizeof(counters[0]); i++) {
        StateInfo t = r0;
        if (counters[i].field == 0) t.epoch = INT32_MAX;
        if (counters[i].field == 1) t.watch.bad_run = INT32_MAX;
        if (counters[i].field == 2) t.cursor = -5;
        state_write_for_test(state8, &t, w, m, v);
        rc = run_capture(cmd, out, sizeof(out));
        char what[200];
        snprintf(what, sizeof(what), "a state whose %s is out of range is refused, naming it", counters[i].what);
        check_out(rc != 0 && rc != -1 && strstr(out, "out of range") && strstr(out, counters[i].what), what, out);
    }
    (void)marker;
    free(w); free(m); free(v); free(bytes8); free(id);
}

/* Messages a user meets with a wrong path or a model too big: each names
 * the file and the problem (a folder given as a file once read as a
 * "4096-byte" shard or a 9.2e18-byte tokenizer; a model too big for memory
 * ended in an out-of-memory line naming no file). */
static void test_messages(void) {
    const char* shard = tmp_path("msg_train_000.bin");
    write_shard(shard, 4000, 50, 1, SHARD_MAGIC, 1, 4000);
    const char* folder = tmp_path("msg_folder");
    mkdir(folder, 0755);
    char cmd[3000], out[8192];
    const char* tiny = "--model d1 --channels 16 --num-heads 2 --max-seq-len 16 --vocab-size 50 -b 2 -t 8 -x 1 "
                       "--val-every 0 --sample-every 0";
    struct { const char* what; const char* args; const char* expect; } cases[] = {
        {"a folder as --train-data", "-i %s", "is a directory, not a data shard"},
        /* a folder is read as a Hugging Face checkpoint (gptc/safetensors.h) */
        {"a folder as --model", "--model %s", "model.safetensors: no such file: a Hugging Face GPT-2 checkpoint folder"},
        {"a folder as --tokenizer (samples on)", "--tokenizer %s --sample-every 1", "is a directory, not a tokenizer"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char args[1200];
        snprintf(args, sizeof(args), cases[i].args, folder);
        int with_model = strstr(cases[i].args, "--model") != NULL;
        snprintf(cmd, sizeof(cmd), "./train_gpt %s %s %s %s", with_model ? "-b 2 -t 8 -x 1" : tiny,
                 strstr(cases[i].args, "-i ") ? "" : "-i", strstr(cases[i].args, "-i ") ? "" : shard, args);
        int rc = run_capture(cmd, out, sizeof(out));
        char what[200];
        snprintf(what, sizeof(what), "%s: refused, naming the folder", cases[i].what);
        int ok = strstr(out, folder) && strstr(out, cases[i].expect);
        /* a decode-only tokenizer that cannot be read leaves samples as ids: a warning, not an error */
        check_out((rc != 0 || strstr(cases[i].args, "--tokenizer")) && rc != -1 && ok, what, out);
    }
    /* a model whose header is consistent with its (sparse) size but whose 52 billion parameters need 206 GB */
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.max_seq_len = 1024; c.vocab_size = 50257; c.num_layers = 1; c.num_heads = 1; c.channels = 65536;
    c.padded_vocab_size = 50304;
    size_t P = parameter_count(&c);
    const char* huge = tmp_path("huge_model.bin");
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = 20240326; h[1] = 3; h[2] = c.max_seq_len; h[3] = c.vocab_size; h[4] = c.num_layers; h[5] = c.num_heads;
    h[6] = c.channels; h[7] = c.padded_vocab_size;
    FILE* f = fopen(huge, "wb");
    int made = f && fwrite(h, 4, HEADER_INTS, f) == HEADER_INTS && ftruncate(fileno(f), (off_t)(1024 + 4 * P)) == 0;
    if (f) fclose(f);
    snprintf(cmd, sizeof(cmd), "./train_gpt --model %s -i %s -b 2 -t 8 -x 1 --val-every 0 --sample-every 0", huge, shard);
    int rc = made ? run_capture(cmd, out, sizeof(out)) : -1;
    check_out(made && rc != 0 && rc != -1 && strstr(out, huge) && strstr(out, "more than this machine can allocate"),
              "a model too big for memory: refused, naming the file and the gigabytes it needs", out);
    remove(huge);
    /* --data with too little text: all of it goes to validation; said so (once: "no data files match this
     * pattern (quote it ...)", about a folder the trainer wrote itself); and a --data path with glob characters */
    if (access("data/tokenizer/gpt2_merges.bin", R_OK) == 0) {
        const char* one = tmp_path("one_char.txt");
        write_bytes(one, "a", 1);
        snprintf(cmd, sizeof(cmd), "./train_gpt --model d1 --channels 16 --num-heads 2 --max-seq-len 16 -b 2 -t 8 -x 1 "
                 "--val-every 0 --sample-every 0 --data %s", one);
        rc = run_capture(cmd, out, sizeof(out));
        check_out(rc != 0 && rc != -1 && strstr(out, "too little text") && !strstr(out, "quote it"),
                  "--data with one character: 'too little text to train on', naming the file", out);
        char text[4000], path[700];
        int n = 0;
        for (int d = 0; d < 60; d++) n += snprintf(text + n, sizeof(text) - (size_t)n, "Document %d says hello.\n\n\n", d);
        snprintf(path, sizeof(path), "%s/in[1]*.txt", tmpdir);
        write_bytes(path, text, (size_t)n);
        snprintf(cmd, sizeof(cmd), "./train_gpt --model d1 --channels 16 --num-heads 2 --max-seq-len 16 -b 2 -t 8 -x 2 "
                 "--val-every 1 --val-batches 1 --sample-every 0 --data '%s'", path);
        rc = run_capture(cmd, out, sizeof(out));
        check_out(rc == 0 && strstr(out, "step     2/2"), "--data whose name holds glob characters trains on its shards", out);
    } else {
        check(0, "GPT-2 tokenizer files present for the --data message tests (make tokenizer)", "");
    }
}

/* The training loop's ways out on an error free what they made (under
 * test_gpt_asan, LeakSanitizer would report what they did not): a shard
 * found bad mid-run with memory snapshots in flight, and a refused resume. */
static void test_train_error_paths(void) {
    write_shard(tmp_path("ep_train_000.bin"), 200, 50, 0, SHARD_MAGIC, 1, 200);
    write_shard(tmp_path("ep_train_001.bin"), 200, 60, 0, SHARD_MAGIC, 1, 200); /* tokens up to 59: V is 50 */
    char pattern[700], out_dir[700], shm[700];
    snprintf(pattern, sizeof(pattern), "%s/ep_train_*.bin", tmpdir);
    snprintf(out_dir, sizeof(out_dir), "%s/ep_out", tmpdir);
    snprintf(shm, sizeof(shm), "%s/ep_shm", tmpdir);
    for (int variant = 0; variant < 2; variant++) {
        const char* argv[] = {"train_gpt", "--model", "d1", "--channels", "16", "--num-heads", "2", "--max-seq-len", "16",
                              "--vocab-size", "50", "-i", pattern, "-b", "2", "-t", "8", "-x", variant ? "3" : "40",
                              "--val-every", "0", "--sample-every", "0", "-o", out_dir, "--snapshot-every", "1",
                              "--save-every", "2", "--shm-dir", shm, "--threads", "2", "--resume", variant ? "1" : "0"};
        Options o;
        Dist dist;
        int argc = (int)(sizeof(argv) / sizeof(argv[0]));
        char** av = (char**)argv;
        dist_init(&dist, &argc, &av);
        int parsed = options_parse(&o, argc, av) == 0 && options_problem(&o) == NULL;
        int rc = parsed ? gptc_run(&o, train_cpu, prompt_cpu, &dist, &dist) : 0;
        dist_finish(&dist, 0);
        check(parsed && rc == -1,
              variant ? "train(): a refused resume (a state past --steps) returns -1 and frees what it made"
                      : "train(): a shard found bad mid-run (snapshots in flight) returns -1 and frees what it made", "");
    }
}

/* Bad steps: a NaN in the gradients skips the update; three in a row roll
 * back to the last memory snapshot; a loss spike (z-score) is skipped. The
 * NaNs and spikes come from the trainer's test hooks (GPTC_INJECT_*), in the
 * test build .hooks/train_gpt (make builds it with -DGPTC_TEST_HOOKS). */
static void test_bad_steps(void) {
    const char* shard = tmp_path("bad_train_000.bin");
    write_shard(shard, 20000, 50, 3, SHARD_MAGIC, 1, 20000);
    char common[1400], cmd[2000], a[800], b[800];
    static char out[1 << 17];
    snprintf(common, sizeof(common),
             ".hooks/train_gpt --model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 50 -i %s -b 4 -t 16 "
             "-x 40 --lr 3e-3 --val-every 0 --sample-every 0 --threads 2 --snapshot-every 4 --shm-dir %s",
             shard, tmpdir);
    snprintf(cmd, sizeof(cmd), "%s -o %s/badA --spike-z 6", common, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0 && !strstr(out, "spike"), "bad steps: a clean run has no loss spike at z = 6 (no false alarm)", rc ? out : "");
    snprintf(cmd, sizeof(cmd), "GPTC_INJECT_NAN=10 %s -o %s/badB", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    const char* line = strstr(out, "step    10/40");
    int skipped = line && strstr(line, "non-finite: update skipped") && strstr(line, "\n") > strstr(line, "skipped");
    check(rc == 0 && skipped && !strstr(out, "rollback"), "bad steps: a NaN in the gradients at step 10 skips that update only", rc ? out : "");
    snprintf(cmd, sizeof(cmd), "GPTC_INJECT_NAN=14,15,16 %s -o %s/badC", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/badC/model_00000040.bin", tmpdir);
    check(rc == 0 && strstr(out, "rollback: 3 bad steps in a row; weights and moments back to the snapshot of step 12, "
                                 "skipping the batches of steps 13..16") && access(a, F_OK) == 0,
          "bad steps: three NaN steps in a row roll back to the snapshot of step 12 and skip their batches", rc ? out : "");
    /* the rolled-back run trained on other batches from step 13 on: its weights differ from the clean run's */
    snprintf(b, sizeof(b), "%s/badA/model_00000040.bin", tmpdir);
    check(!files_equal(a, b), "bad steps: the rolled-back run differs from the clean one (it skipped data)", "");
    snprintf(cmd, sizeof(cmd), "GPTC_INJECT_SPIKE=30 %s -o %s/badD --spike-z 6", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0 && strstr(out, "step 30: loss") && strstr(out, "is a spike") && strstr(out, "update skipped"),
          "bad steps: a loss spike at step 30 is detected (z > 6) and its update skipped", rc ? out : "");
    snprintf(cmd, sizeof(cmd), "GPTC_INJECT_NAN=14,15,16 %s -o %s/badE --rollback-after 0", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    check(rc == 0 && !strstr(out, "rollback:"), "bad steps: --rollback-after 0 only skips", rc ? out : "");
}

/* A full disk while saving (a file-size limit makes every large write fail
 * with EFBIG, as ENOSPC would): the run says so, the complete state before
 * stays intact, and resuming from it later ends bit for bit where an
 * uninterrupted run does. */
static void test_disk_full(void) {
    const char* shard = tmp_path("full_train_000.bin");
    write_shard(shard, 6000, 50, 3, SHARD_MAGIC, 1, 6000);
    char common[1400], cmd[2000], a[800], b[800];
    static char out[1 << 16];
    snprintf(common, sizeof(common),
             "./train_gpt --model d2 --channels 32 --num-heads 2 --max-seq-len 32 --vocab-size 50 -i %s -b 4 -t 16 "
             "-x 12 --lr 3e-3 --val-every 0 --sample-every 0 --save-every 4 --threads 2", shard);
    snprintf(cmd, sizeof(cmd), "%s -o %s/fullA", common, tmpdir);
    int rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s -o %s/fullB --stop-at 4", common, tmpdir);
    rc |= run_capture(cmd, out, sizeof(out));
    /* 16 blocks of 512 bytes: the small files fit, no state or model does */
    snprintf(cmd, sizeof(cmd), "trap '' XFSZ; ulimit -f 16; %s -o %s/fullB --resume 1", common, tmpdir);
    int full = run_capture(cmd, out, sizeof(out));
    char st4[800], mk8[800];
    snprintf(st4, sizeof(st4), "%s/fullB/state_00000004.complete", tmpdir);
    snprintf(mk8, sizeof(mk8), "%s/fullB/state_00000008.complete", tmpdir);
    check(rc == 0 && full != 0 && strstr(out, "write failed") && strstr(out, "incomplete on disk") &&
          strstr(out, "the final model and training state could not be written") && access(st4, F_OK) == 0 &&
          access(mk8, F_OK) != 0,
          "disk full: the failed writes are reported, the run ends with an error, the state of step 4 stays the newest",
          rc ? out : "");
    snprintf(cmd, sizeof(cmd), "%s -o %s/fullB --resume 1", common, tmpdir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/fullA/model_00000012.bin", tmpdir);
    snprintf(b, sizeof(b), "%s/fullB/model_00000012.bin", tmpdir);
    check(rc == 0 && strstr(out, "continuing after step 4") && files_equal(a, b),
          "disk full: with room again, resuming from step 4 ends bit for bit where the uninterrupted run does", rc ? out : "");
}

/* One child per rank runs rendezvous_share; it exits 0 when it holds rank
 * 0's bytes, 1 when the rendezvous failed, 2 when it holds other bytes.
 * `skip` names a rank that never starts (-1: none); `odd_id` a rank that
 * runs under another GPTC_RUN_ID; rank 0 starts `late_ms` after the rest.
 * Each child's stderr goes to <tmpdir>/rdv<r>.err. */
static void rendezvous_ranks(const char* spec, int world, int skip, int odd_id, int late_ms, double timeout_s,
                             int* status) {
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        status[r] = -1;
        pids[r] = -1;
        if (r == skip) continue;
        pids[r] = fork();
        CHECK(pids[r] >= 0, "fork failed: %s", strerror(errno));
        if (pids[r] > 0) continue;
        char err[600];
        snprintf(err, sizeof(err), "%s/rdv%d.err", tmpdir, r);
        if (!freopen(err, "w", stderr)) _exit(3);
        setenv("GPTC_RUN_ID", r == odd_id ? "another-launch" : "test-launch", 1);
        Rendezvous rv;
        if (rendezvous_parse(&rv, spec, timeout_s) != NULL) _exit(3);
        unsigned char want[128], blob[128];
        for (int i = 0; i < 128; i++) want[i] = (unsigned char)(i * 7 + 1);
        if (r == 0) {
            memcpy(blob, want, sizeof(blob));
            rendezvous_sleep_ms(late_ms);
        } else {
            memset(blob, 0, sizeof(blob));
        }
        int rc = rendezvous_share(&rv, r, world, blob, sizeof(blob));
        fflush(stderr); /* a file now, buffered, and _exit does not flush */
        _exit(rc != 0 ? 1 : memcmp(blob, want, sizeof(blob)) ? 2 : 0);
    }
    for (int r = 0; r < world; r++) {
        int st = 0;
        if (pids[r] > 0 && waitpid(pids[r], &st, 0) == pids[r]) status[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 99;
    }
}

/* Does <tmpdir>/rdv<rank>.err contain `text`? */
static int rendezvous_said(int rank, const char* text) {
    char path[600];
    snprintf(path, sizeof(path), "%s/rdv%d.err", tmpdir, rank);
    size_t n = 0;
    char* s = file_read_all(path, &n);
    int found = s && strstr(s, text) != NULL;
    free(s);
    return found;
}

/* A TCP port no socket holds now, as the kernel hands out for port 0 (a
 * fixed or pid-derived port can be taken by another job's listener: CI
 * once failed so, every rank exiting 1). */
static int free_tcp_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "socket failed: %s", strerror(errno));
    struct sockaddr_in a;
    socklen_t n = sizeof(a);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    CHECK(bind(fd, (struct sockaddr*)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr*)&a, &n) == 0,
          "cannot get a free port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

/* "exit codes ..." and, when one failed, the first line rank 0 and rank 1
 * wrote, so that a failure says why. */
static void rendezvous_detail(char* detail, size_t cap, const int* st, int world) {
    int n = snprintf(detail, cap, "exit codes");
    for (int r = 0; r < world; r++) n += snprintf(detail + n, cap - (size_t)n, " %d", st[r]);
    for (int r = 0; r < 2 && n < (int)cap - 1; r++) {
        char path[600];
        size_t len = 0;
        snprintf(path, sizeof(path), "%s/rdv%d.err", tmpdir, r);
        char* s = st[r] != 0 ? file_read_all(path, &len) : NULL;
        if (s && len) n += snprintf(detail + n, cap - (size_t)n, "; rank %d: %.*s", r, (int)strcspn(s, "\n"), s);
        free(s);
    }
}

/* The rendezvous that starts NCCL without MPI (train_gpt.cu): processes
 * forked here stand in for ranks on other hosts. */
static void test_rendezvous(void) {
    char file_spec[600], tcp_spec[64], detail[600];
    snprintf(file_spec, sizeof(file_spec), "file:%s/rendezvous", tmpdir);
    int st[4];
    for (int k = 0; k < 2; k++) {
        snprintf(tcp_spec, sizeof(tcp_spec), "tcp:localhost:%d", free_tcp_port());
        const char* spec = k ? tcp_spec : file_spec;
        rendezvous_ranks(spec, 3, -1, -1, 200, 20.0, st);
        rendezvous_detail(detail, sizeof(detail), st, 3);
        check(st[0] == 0 && st[1] == 0 && st[2] == 0, k ? "rendezvous tcp: 3 ranks get rank 0's bytes (rank 0 late)"
                                                        : "rendezvous file: 3 ranks get rank 0's bytes (rank 0 late)", detail);
    }
    /* a record left by an earlier launch, with other bytes: never taken */
    char path[600];
    snprintf(path, sizeof(path), "%s/rendezvous", tmpdir);
    RendezvousRecord stale;
    memset(&stale, 0, sizeof(stale));
    memcpy(stale.magic, RENDEZVOUS_MAGIC, 8);
    snprintf(stale.run_id, sizeof(stale.run_id), "an-earlier-launch");
    stale.world = 3;
    stale.bytes = 128;
    WriteChunk chunk = {&stale, sizeof(stale)};
    ALWAYS(write_file_atomic(path, &chunk, 1) == 0);
    rendezvous_ranks(file_spec, 3, -1, -1, 500, 20.0, st);
    snprintf(detail, sizeof(detail), "exit codes %d %d %d", st[0], st[1], st[2]);
    check(st[0] == 0 && st[1] == 0 && st[2] == 0 && access(path, F_OK) != 0,
          "rendezvous file: a stale record of another run is ignored, and every file is removed after", detail);
    /* a rank that never comes: rank 0 gives up in time and names it */
    snprintf(tcp_spec, sizeof(tcp_spec), "tcp:127.0.0.1:%d", free_tcp_port());
    const char* specs[2] = {file_spec, tcp_spec};
    const char* says[2] = {"rank 2 of 3 never answered", "rank 2 of 3 never connected"};
    for (int k = 0; k < 2; k++) {
        double t0 = time_ms();
        rendezvous_ranks(specs[k], 3, 2, -1, 0, 1.0, st);
        double ms = time_ms() - t0;
        snprintf(detail, sizeof(detail), "exit codes %d %d, %.0f ms", st[0], st[1], ms);
        check(st[0] == 1 && st[1] == 0 && rendezvous_said(0, says[k]) && ms < 5000,
              k ? "rendezvous tcp: a missing rank is named after the timeout" : "rendezvous file: a missing rank is named after the timeout",
              detail);
    }
    /* a rank of another launch (other GPTC_RUN_ID) is turned away */
    snprintf(tcp_spec, sizeof(tcp_spec), "tcp:localhost:%d", free_tcp_port());
    rendezvous_ranks(tcp_spec, 2, -1, 1, 0, 1.5, st);
    snprintf(detail, sizeof(detail), "exit codes %d %d", st[0], st[1]);
    check(st[0] == 1 && st[1] == 1 && rendezvous_said(1, "another run"), "rendezvous tcp: a rank of another run is turned away",
          detail);
    rendezvous_ranks(file_spec, 2, -1, 1, 0, 1.0, st);
    snprintf(detail, sizeof(detail), "exit codes %d %d", st[0], st[1]);
    check(st[0] == 1 && st[1] == 1 && rendezvous_said(1, "only one of another run"),
          "rendezvous file: a rank of another run waits for its own and says why it gave up", detail);
    /* bad specifications */
    Rendezvous rv;
    setenv("GPTC_RUN_ID", "x", 1);
    check(rendezvous_parse(&rv, "tcp:node1", 5) != NULL && rendezvous_parse(&rv, "tcp:node1:99999", 5) != NULL &&
          rendezvous_parse(&rv, "nccl://x", 5) != NULL && rendezvous_parse(&rv, "file:", 5) != NULL &&
          rendezvous_parse(&rv, "tcp:node1:29500", 0) != NULL && rendezvous_parse(&rv, "tcp:node1:29500", 5) == NULL &&
          rv.port == 29500 && !strcmp(rv.host, "node1"),
          "rendezvous: bad specifications are refused, a good one parsed", "");
    unsetenv("GPTC_RUN_ID");
    const char* slurm = getenv("SLURM_JOB_ID");
    if (!slurm) check(rendezvous_parse(&rv, "tcp:node1:29500", 5) != NULL, "rendezvous: refused without a run id", "");
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    int rank = -1, world = -1, local = -1;
    int found = launch_rank_world(&rank, &world, &local);
    int from_plain = !getenv("SLURM_PROCID") && !getenv("OMPI_COMM_WORLD_RANK") && !getenv("PMI_RANK");
    if (from_plain) check(found == 0 && rank == 1 && world == 4 && local == 1, "launch_rank_world reads RANK/WORLD_SIZE/LOCAL_RANK", "");
    setenv("RANK", "4", 1);
    if (from_plain) check(launch_rank_world(&rank, &world, &local) != 0, "launch_rank_world refuses RANK >= WORLD_SIZE", "");
    unsetenv("RANK");
    unsetenv("WORLD_SIZE");
    unsetenv("LOCAL_RANK");
}

/* The default run (make train, reduced): its JSONL log, its falling
 * validation loss, its plot and its checkpoint. */
static void test_default_run(const char* dir) {
    char path[700];
    snprintf(path, sizeof(path), "%s/log.jsonl", dir);
    size_t n = 0;
    unsigned char* log_bytes = read_all(path, &n);
    int steps = 0, vals = 0;
    double first_val = 0, last_val = 0, first_loss = 0, last_loss = 0;
    for (size_t i = 0; log_bytes && i < n;) {
        const char* line = (const char*)log_bytes + i;
        const char* nl = (const char*)memchr(line, '\n', n - i);
        size_t len = nl ? (size_t)(nl - line) : n - i;
        char buf[512];
        snprintf(buf, sizeof(buf), "%.*s", (int)(len < 511 ? len : 511), line);
        const char* v = strstr(buf, "\"val_loss\": ");
        const char* l = strstr(buf, "\"loss\": ");
        if (v) { last_val = atof(v + 12); if (vals++ == 0) first_val = last_val; }
        else if (l) { last_loss = atof(l + 8); if (steps++ == 0) first_loss = last_loss; }
        i += len + 1;
    }
    free(log_bytes);
    char detail[200];
    snprintf(detail, sizeof(detail), "%d steps, train loss %.3f -> %.3f, val loss %.3f -> %.3f", steps, first_loss,
             last_loss, first_val, last_val);
    check(steps >= 10 && vals >= 2 && last_val < first_val - 1.0 && last_loss < first_loss,
          "default run: JSONL log of every step; train and val loss fall", detail);
    snprintf(path, sizeof(path), "%s/loss.png", dir);
    unsigned char* png = read_all(path, &n);
    check(png && n > 10000 && memcmp(png, "\x89PNG\r\n\x1a\n", 8) == 0, "default run: loss curves rendered to a PNG", path);
    free(png);
    snprintf(path, sizeof(path), "%s/model_%08d.bin", dir, steps);
    GPT2 m;
    int ok = gpt2_load(&m, path) == 0;
    check(ok, "default run: final model saved and loads", path);
    if (ok) gpt2_free(&m);
}

/* The tester is tested: a comparison that let a planted error through
 * would make every pass above meaningless. */
static void test_the_tester(void) {
    float want[100], got[100];
    for (int i = 0; i < 100; i++) want[i] = got[i] = sinf((float)i);
    char detail[256];
    got[37] += 1e-4f; /* a 1e-4 error in one element of a 1e-5 check */
    int rejected = !tensor_close(got, want, 100, 1e-5, detail, sizeof(detail));
    got[37] = want[37];
    got[50] = NAN;
    rejected &= !tensor_close(got, want, 100, 1e-5, detail, sizeof(detail));
    got[50] = want[50];
    int accepted = tensor_close(got, want, 100, 1e-5, detail, sizeof(detail));
    check(rejected && accepted, "the checker rejects a planted wrong value and a NaN, accepts the truth", "");
}

int main(int argc, char** argv) {
    const char* model = "dev/fixtures/tiny_model.bin";
    const char* ref = "dev/fixtures/tiny_ref.bin";
    const char* extra_model = NULL;
    const char* extra_ref = NULL;
    int extra_steps = 1 << 30;
    const char* default_run = NULL;
    const char* hf_dir = NULL;
    const char* only = NULL;
    const char* tok_dir_decode = "data/tokenizer/gpt2_tokenizer.bin";
    const char* tok_dir_merges = "data/tokenizer/gpt2_merges.bin";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 2 < argc) {
            extra_model = argv[++i];
            extra_ref = argv[++i];
        } else if (!strcmp(argv[i], "--default-run") && i + 1 < argc) {
            default_run = argv[++i];
        } else if (!strcmp(argv[i], "--hf") && i + 1 < argc) {
            hf_dir = argv[++i];
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--ref-steps") && i + 1 < argc) {
            extra_steps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--ref MODEL REF [--ref-steps N]] [--default-run DIR] | --hf DIR | --only hf|inputs\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep our lines and the errors under test in order */
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_gpt.XXXXXX");
    CHECK(mkdtemp(tmpdir) != NULL, "cannot make a temporary directory: %s", strerror(errno));
    printf("threads: %d; scratch files in %s\n", num_threads(), tmpdir);

    if (only) { /* one group of checks: hf (Hugging Face files), inputs (every other file the trainer reads) */
        int known = !strcmp(only, "hf") || !strcmp(only, "inputs");
        if (!strcmp(only, "hf")) test_hf_files();
        if (!strcmp(only, "inputs")) { test_input_files(); test_state_headers(); }
        if (!known) fprintf(stderr, "error: --only %s: expected hf or inputs\n", only);
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed || !known ? EXIT_FAILURE : EXIT_SUCCESS;
    }
    if (hf_dir) { /* only the Hugging Face checks, against scripts/hf_reference.py's DIR */
        test_hf_files();
        test_hf_reference(hf_dir);
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
        printf("%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed ? EXIT_FAILURE : EXIT_SUCCESS;
    }
    test_the_tester();
    test_gemm();
    test_exp_fast();
    test_against_reference(model, ref, "tiny", 1 << 30);
    test_finite_differences(model);
    test_thread_invariance(model);
    test_model_files(model);
    test_hf_files();
    test_input_files();
    test_state_headers();
    test_dataloader();
    test_tokenizer_file();
    test_tokenizer_full_vocab();
    test_init();
    test_run_lock_heir();
    test_schedules();
    test_cli();
    test_trainer_binary();
    test_resume();
    test_user_paths();
    test_messages();
    test_train_error_paths();
    test_rendezvous();
    test_bad_steps();
    test_disk_full();
    test_kv_cache(model);
    test_memory_plan();
    test_sampler();
    test_text_documents();
    Tokenizer tok;
    if (tokenizer_init(&tok, tok_dir_decode, tok_dir_merges) == 0) {
        test_prepare_shards(&tok);
        tokenizer_free(&tok);
    } else {
        check(0, "GPT-2 tokenizer files present (make tokenizer fetches them)", tok_dir_decode);
    }
    if (extra_model) test_against_reference(extra_model, extra_ref, extra_model, extra_steps);
    if (default_run) test_default_run(default_run);

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmpdir);
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
