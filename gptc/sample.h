/*
 * gptc/sample.h — token selection and the generation loop, written once for
 * both trainers: temperature, top-k and top-p over one row of logits on the
 * host (sample_token), and the loop that feeds a prompt and draws tokens
 * from any model that runs one position at a time (a Decoder).
 *
 * Included by train_gpt.c in section 7 (after gptc/util.h's Rng and the
 * ledger): its Decoder is the CPU model with its KV cache
 * (gpt2_forward_cached); train_gpt.cu's is the GPU's (gptc/cuda/sample.cuh),
 * which copies its fp32 logits row to the host and calls the same
 * sample_token with the same random numbers, so that on a fixed seed both
 * draw the same tokens wherever their logits order the tokens alike.
 *
 * Defines: ScoredToken, sample_token, sample_token_margin, SamplingConfig,
 * Decoder, generate_tokens.
 */
#ifndef GPTC_SAMPLE_H
#define GPTC_SAMPLE_H

typedef struct {
    float value;
    int index;
} ScoredToken;

static int scored_desc(const void* a, const void* b) {
    float x = ((const ScoredToken*)a)->value, y = ((const ScoredToken*)b)->value;
    return (x < y) - (x > y);
}

/* sample_token, and with `margin` (or NULL) how far the pick is from
 * changing: the largest d such that moving every logit by less than d
 * cannot change the token drawn with this coin (the tests count a step
 * whose margin is under the bf16 logits' error as a near-tie). Greedy: half
 * the gap between the best two logits. Sampled: the coin's distance to the
 * edges of its token's share of the kept mass, and the top-k and top-p
 * cut-offs' distances, each as a logit shift: a shift d scales every weight
 * exp(logit / T) by at most exp(2d / T), so a share moves by about 4d / T
 * and a ratio of two weights by 2d / T. */
static int sample_token_margin(const float* logits, int V, float temperature, int top_k, float top_p, float coin,
                               ScoredToken* work, float* margin) {
    int best = 0;
    if (margin) *margin = 0.0f; /* (stays 0 where rounding takes the last kept token) */
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (temperature <= 0.0f) {
        if (margin) {
            float second = -FLT_MAX;
            for (int v = 0; v < V; v++) second = v != best && logits[v] > second ? logits[v] : second;
            *margin = 0.5f * (logits[best] - second);
        }
        return best;
    }
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
        work[v].value = expf((logits[v] - logits[best]) / temperature);
        work[v].index = v;
        sum += work[v].value;
    }
    int n = V;
    double cut = DBL_MAX; /* the cut-offs' margins, as logit shifts */
    if ((top_k > 0 && top_k < V) || top_p < 1.0f) {
        qsort(work, (size_t)V, sizeof(ScoredToken), scored_desc);
        if (top_k > 0 && top_k < n) {
            n = top_k;
            if (work[n].value > 0.0f) cut = 0.5 * temperature * log((double)work[n - 1].value / work[n].value);
        }
        double kept = 0.0;
        for (int i = 0; i < n; i++) kept += work[i].value;
        if (top_p < 1.0f) {
            double mass = 0.0;
            for (int i = 0; i < n; i++) {
                double before = mass;
                mass += work[i].value;
                if (mass >= top_p * kept) {
                    double d = fmin(mass / kept - top_p, top_p - before / kept);
                    cut = fmin(cut, 0.25 * temperature * d);
                    n = i + 1;
                    break;
                }
            }
        }
        sum = 0.0;
        for (int i = 0; i < n; i++) sum += work[i].value;
    }
    double target = coin * sum, acc = 0.0;
    int pick = n - 1; /* rounding: the last kept token */
    for (int i = 0; i < n; i++) {
        double before = acc;
        acc += work[i].value;
        if (target < acc) {
            pick = i;
            if (margin) *margin = (float)fmin(cut, 0.25 * temperature * fmin(coin - before / sum, acc / sum - coin));
            break;
        }
    }
    return work[pick].index;
}

/* Draw a token from raw logits (the first V of them): softmax(logits / T),
 * keep the top_k most likely (0 = all) and the smallest set whose mass
 * reaches top_p (1 = all), renormalise, sample with `coin` in [0, 1).
 * temperature 0 means greedy. `work` holds V ScoredTokens. All on the host
 * over V floats: a sort of V = 50,257 per token is small next to a forward. */
MAYBE_UNUSED static int sample_token(const float* logits, int V, float temperature, int top_k, float top_p, float coin,
                        ScoredToken* work) {
    return sample_token_margin(logits, V, temperature, top_k, top_p, coin, work, NULL);
}

typedef struct {
    float temperature;
    int top_k;
    float top_p;
} SamplingConfig;

/* A model that runs one position at a time: `step` runs `token` at the next
 * position (0 after `reset`) and returns the logits for the token after it,
 * V floats in host memory, valid until the next call. */
typedef struct {
    void* self;
    int max_len; /* positions it holds (the model's maxT) */
    int V;       /* the vocabulary (the logits' first V are sampled; the padding is not) */
    void (*reset)(void* self);
    const float* (*step)(void* self, int token);
} Decoder;

/* Feed prompt[0..n) (n >= 1) from position 0, then sample up to max_new
 * tokens into out, stopping after an end-of-text token (`eot`, or -1 for
 * none) or at max_len. on_token, if given, is called with each new token as
 * it is drawn. Returns the number of tokens generated.
 * With -DGPTC_TEST_HOOKS, GPTC_SAMPLE_TRACE=FILE appends one line per drawn
 * token to FILE: the token and its margin (sample_token_margin). */
static int generate_tokens(const Decoder* d, const int* prompt, int n, int max_new, const SamplingConfig* s,
                           Rng* rng, int eot, int* out, void (*on_token)(int, void*), void* ctx) {
    ScoredToken* work = (ScoredToken*)ledger_malloc(MEM_SAMPLER, sizeof(ScoredToken) * (size_t)d->V);
    FILE* trace = NULL;
#ifdef GPTC_TEST_HOOKS
    const char* trace_path = getenv("GPTC_SAMPLE_TRACE");
    if (trace_path && trace_path[0] && !(trace = fopen(trace_path, "a")))
        fprintf(stderr, "warning: GPTC_SAMPLE_TRACE=%s: cannot open: %s\n", trace_path, strerror(errno));
#endif
    d->reset(d->self);
    const float* logits = NULL;
    int len = 0;
    for (int i = 0; i < n && len < d->max_len; i++, len++) logits = d->step(d->self, prompt[i]);
    int made = 0;
    while (logits && made < max_new) {
        float margin = 0.0f;
        int next = sample_token_margin(logits, d->V, s->temperature, s->top_k, s->top_p, rng_uniform(rng), work,
                                       trace ? &margin : NULL);
        if (trace) fprintf(trace, "%d %.6g\n", next, margin);
        out[made++] = next;
        if (on_token) on_token(next, ctx);
        if (next == eot || len >= d->max_len) break;
        logits = d->step(d->self, next);
        len++;
    }
    if (trace) CHECK(fclose(trace) == 0, "GPTC_SAMPLE_TRACE: cannot write: %s", strerror(errno));
    ledger_free(work);
    return made;
}

#endif /* GPTC_SAMPLE_H */
