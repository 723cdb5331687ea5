/*
 * gptc/eval.h — scoring a multiple-choice eval set (--eval-file: HellaSwag,
 * or any set of its shape, read by gptc/eval_data.h) with the CPU model:
 * each ending's cross-entropy, the picks for acc and acc_norm, the split
 * over ranks, the log line and --eval-detail's JSON lines, and the eval
 * alone (--steps 0 --eval-file F).
 *
 * Included by train_gpt.c in section 8 (after evaluate(), which it sits
 * beside in the story: the model, gpt2_forward, Dist and dist_sum_doubles
 * and Options come before it). Defines: EvalRun, EvalResult,
 * eval_run_init, eval_run_free, eval_picks, eval_choices, eval_report, eval_log, eval_only.
 */
#ifndef GPTC_EVAL_H
#define GPTC_EVAL_H

/* Multiple choice (--eval-file: HellaSwag, or any set of its shape; the file
 * is gptc/eval_data.h's). Ending k of an example is scored by the
 * cross-entropy of its tokens given the context and its earlier tokens:
 *   sum_k  = sum over the ending's scored tokens j of -log p(token_j | the tokens before it)
 *   mean_k = sum_k / m_k            (m_k = how many of its tokens are scored)
 * The model's pick is argmin_k sum_k for "acc" and argmin_k mean_k for
 * "acc_norm" (the names of llm.c's dev/data/hellaswag.py: acc_norm is the
 * length-normalised one, and the one llm.c's C trainers report as their
 * HellaSwag accuracy). A tie goes to the lowest k.
 * Rows: example e's ending k is row 4e + k, context then ending, one row of
 * the run's (B, T) batch, B rows a forward pass (an example may straddle two
 * passes). A row longer than T keeps its last T tokens (the start of the
 * context goes); an ending token is scored when the token before it is in
 * the row, so m_k = min(n_k, row length - 1): all of them when the row
 * fits (prepare_eval prints the longest row; llm.c refuses rows of T tokens
 * or more instead, so on rows that fit the two score alike).
 * Positions past the row's end are padding (token 0, target 0): causal
 * attention never lets a scored position see them.
 * Ranks: rank r scores examples [r * ceil(N/W), (r+1) * ceil(N/W)) (llm.c's
 * split); each example's (sum_k, m_k) go into an (N, 8) array of doubles,
 * zero for other ranks' examples, summed over the ranks: every rank then
 * holds every score and counts the same correct answers. The forward pass
 * is the training one (gpt2_forward): nothing else changes, no random
 * number is drawn, and the next step's forward overwrites the activations,
 * so a run with --eval-file trains bit for bit as one without. */
typedef struct {
    EvalSet set;
    int B, T;
    int* inputs;      /* (B, T) */
    int* targets;     /* (B, T) */
    int* from;        /* (B) where each row's scored targets start */
    int* to;          /* (B) and end (exclusive) */
    double* scores;   /* (N, 8): sum_k for k = 0..3, then m_k */
} EvalRun;

typedef struct {
    int examples, correct, correct_norm;
} EvalResult;

/* Read --eval-file for batches of (B, T) of a model of vocabulary V.
 * 0, or -1 after a message. */
static int eval_run_init(EvalRun* e, const char* path, int B, int T, int V) {
    memset(e, 0, sizeof(*e));
    if (evalset_read(&e->set, path) != 0) return -1;
    for (size_t i = 0; i < e->set.num_tokens; i++) {
        if (e->set.tokens[i] >= V) {
            FILE_ERROR(path, "token %d is outside the model's vocabulary (V = %d): the eval file was made with "
                       "another tokenizer (HellaSwag's needs GPT-2's, V = 50257)", e->set.tokens[i], V);
            evalset_free(&e->set);
            return -1;
        }
    }
    e->B = B;
    e->T = T;
    e->inputs = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    e->targets = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    e->from = (int*)xmalloc(sizeof(int) * (size_t)B);
    e->to = (int*)xmalloc(sizeof(int) * (size_t)B);
    e->scores = (double*)xmalloc(sizeof(double) * 8 * (size_t)e->set.num_examples);
    return 0;
}

static void eval_run_free(EvalRun* e) {
    evalset_free(&e->set);
    free(e->inputs);
    free(e->targets);
    free(e->from);
    free(e->to);
    free(e->scores);
    memset(e, 0, sizeof(*e));
}

/* Row `row` of this rank's rows (4e + k from its first example `lo`) into
 * inputs/targets (T each); returns where the scored targets start and end
 * ([*from, *to) in the row's positions). */
static void eval_row_fill(const EvalRun* e, int lo, int row, int* inputs, int* targets, int* from, int* to) {
    int T = e->T, ex = lo + row / EVAL_CHOICES, k = row % EVAL_CHOICES;
    const EvalSet* s = &e->set;
    const int* ctx = s->tokens + s->at[5 * (size_t)ex];
    const int* end = s->tokens + s->at[5 * (size_t)ex + 1 + k];
    int nc = s->len[5 * (size_t)ex], ne = s->len[5 * (size_t)ex + 1 + k];
    int n = nc + ne, keep = n < T ? n : T, skip = n - keep; /* the row is tokens [skip, n) of context + ending */
    for (int t = 0; t < T; t++) {
        int j = t + skip;
        inputs[t] = t >= keep ? 0 : j < nc ? ctx[j] : end[j - nc];
    }
    for (int t = 0; t < T; t++) targets[t] = t + 1 < keep ? inputs[t + 1] : 0;
    int first = nc - skip; /* the ending's first token's position in the row (<= 0: truncated away) */
    *from = (first > 1 ? first : 1) - 1; /* target t predicts the token at t + 1 */
    *to = keep - 1;
}

/* acc and acc_norm from e->scores (per example: the four endings' loss sums,
 * then their token counts): the pick is the ending of least summed loss
 * (acc), or of least loss per token (acc_norm, llm.c's HellaSwag figure).
 * Shared by train_gpt and the CUDA twin. */
static void eval_picks(const EvalRun* e, int N, EvalResult* out) {
    memset(out, 0, sizeof(*out));
    out->examples = N;
    for (int ex = 0; ex < N; ex++) {
        const double* sc = e->scores + 8 * (size_t)ex; /* sum_0..3, count_0..3 */
        int pick = 0, pick_norm = 0;
        for (int k = 1; k < EVAL_CHOICES; k++) {
            if (sc[k] < sc[pick]) pick = k;
            if (sc[k] / sc[4 + k] < sc[pick_norm] / sc[4 + pick_norm]) pick_norm = k;
        }
        out->correct += pick == e->set.labels[ex];
        out->correct_norm += pick_norm == e->set.labels[ex];
    }
}

/* Score every example of the eval set (all ranks together): *out gets the
 * counts, e->scores every (sum_k, m_k). */
static void eval_choices(GPT2* model, EvalRun* e, const Dist* d, EvalResult* out) {
    int N = e->set.num_examples, B = e->B, T = e->T;
    int per = (N + d->world - 1) / d->world;
    int lo = d->rank * per < N ? d->rank * per : N;
    int hi = lo + per < N ? lo + per : N;
    int rows = EVAL_CHOICES * (hi - lo);
    memset(e->scores, 0, sizeof(double) * 8 * (size_t)N);
    int* from = e->from;
    int* to = e->to;
    int passes = d->zero == 3 ? EVAL_CHOICES * per : rows; /* ZeRO-3: as many forwards on every rank (they gather) */
    for (int r0 = 0; r0 < passes; r0 += B) {
        for (int b = 0; b < B; b++) {
            if (r0 + b < rows) eval_row_fill(e, lo, r0 + b, e->inputs + (size_t)b * T, e->targets + (size_t)b * T,
                                             &from[b], &to[b]);
            else { /* past this rank's last row: padding, not scored */
                memset(e->inputs + (size_t)b * T, 0, sizeof(int) * (size_t)T);
                memset(e->targets + (size_t)b * T, 0, sizeof(int) * (size_t)T);
            }
        }
        gpt2_forward(model, e->inputs, e->targets, B, T);
        for (int b = 0; b < B && r0 + b < rows; b++) {
            int ex = lo + (r0 + b) / EVAL_CHOICES, k = (r0 + b) % EVAL_CHOICES;
            double sum = 0.0;
            for (int t = from[b]; t < to[b]; t++) sum += model->acts.losses[(size_t)b * T + t];
            e->scores[8 * (size_t)ex + k] = sum;
            e->scores[8 * (size_t)ex + 4 + k] = to[b] - from[b];
        }
    }
    dist_sum_doubles(d, e->scores, 8 * (size_t)N);
    eval_picks(e, N, out);
}

/* --eval-detail: each example's scores and picks, one JSON line each. 0 or -1. */
static int eval_detail_write(const EvalRun* e, const char* path, int step) {
    FILE* f = fopen(path, "a");
    if (!f) {
        FILE_ERROR(path, "cannot open --eval-detail file: %s", strerror(errno));
        return -1;
    }
    for (int ex = 0; ex < e->set.num_examples; ex++) {
        const double* sc = e->scores + 8 * (size_t)ex;
        fprintf(f, "{\"step\": %d, \"example\": %d, \"label\": %d, \"sum\": [%.9g, %.9g, %.9g, %.9g], "
                "\"count\": [%.0f, %.0f, %.0f, %.0f]}\n", step, ex, e->set.labels[ex], sc[0], sc[1], sc[2], sc[3],
                sc[4], sc[5], sc[6], sc[7]);
    }
    if (fclose(f) != 0) {
        FILE_ERROR(path, "write failed: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* The accuracies printed and logged (the JSON keys scripts/plot_loss.py
 * reads), and --eval-detail written on rank 0; `where` ends the line
 * ("" or " on the GPU"). Shared by train_gpt and the CUDA twin. 0 or -1. */
static int eval_report(const EvalRun* e, const EvalResult* res, const Options* o, int rank, FILE* log, int step,
                       double ms, const char* where) {
    double acc = (double)res->correct / res->examples, acc_norm = (double)res->correct_norm / res->examples;
    printf("eval: acc_norm %.4f (%d/%d; llm.c's HellaSwag figure) | acc %.4f (%d/%d) | %.0f ms%s\n", acc_norm,
           res->correct_norm, res->examples, acc, res->correct, res->examples, ms, where);
    if (log) {
        fprintf(log, "{\"step\": %d, \"eval_acc_norm\": %.6f, \"eval_acc\": %.6f, \"eval_examples\": %d}\n", step,
                acc_norm, acc, res->examples);
        fflush(log);
    }
    if (o->eval_detail[0] && rank == 0) return eval_detail_write(e, o->eval_detail, step);
    return 0;
}

/* Score the eval set, print and log the accuracies (and --eval-detail). 0 or -1. */
static int eval_log(EvalRun* e, GPT2* model, const Options* o, const Dist* d, FILE* log, int step) {
    double t0 = time_ms();
    EvalResult res;
    eval_choices(model, e, d, &res);
    return eval_report(e, &res, o, d->rank, log, step, time_ms() - t0, "");
}
/* --steps 0 --eval-file F: the eval alone, on --model, at the run's (B, T),
 * on one process or several ranks. 0, or -1 after a message. */
static int eval_only(GPT2* model, const Options* o, const Dist* dist) {
    Dist alone; /* without one (the CUDA twin's host code): rank 0 of 1, no collectives */
    memset(&alone, 0, sizeof(alone));
    alone.world = 1;
    if (!dist) dist = &alone;
    if (o->seq_len > model->config.max_seq_len) {
        fprintf(stderr, "error: --seq-len %d exceeds the model's max_seq_len %d\n", o->seq_len, model->config.max_seq_len);
        return -1;
    }
    EvalRun e;
    if (eval_run_init(&e, o->eval_file, o->batch_size, o->seq_len, model->config.vocab_size) != 0) return -1;
    gpt2_alloc_training(model, o->batch_size, o->seq_len); /* (the activations; the gradients and moments go unused) */
    printf("eval: %s, %d multiple-choice examples, B=%d T=%d on %d rank(s)\n", o->eval_file, e.set.num_examples,
           o->batch_size, o->seq_len, dist->world);
    int rc = eval_log(&e, model, o, dist, NULL, 0);
    eval_run_free(&e);
    return rc;
}
#endif /* GPTC_EVAL_H */
