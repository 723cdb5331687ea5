/*
 * gptc/cuda/eval.cuh — the multiple-choice eval (--eval-file: HellaSwag, or
 * any set of its shape) scored on the GPU: the eval set's rows in (B, T)
 * batches through the training forward pass, each ending's loss summed on
 * the device from the classifier's per-position losses, the (N, 8) scores
 * summed over the ranks by NCCL, then acc and acc_norm on the host.
 *
 * Included by train_gpt.cu in G7, after gpu_evaluate (GpuGPT2, gpu_forward,
 * GpuComm and the ledger come before it). Uses train_gpt.c's gptc/eval.h
 * for everything that is not the device's: EvalRun and its buffers (set up
 * by train_run_init), eval_row_fill (a row's tokens and its scored span),
 * eval_detail_write (--eval-detail). Defines: eval_sums_kernel,
 * gpu_eval_choices, gpu_eval_log, gpu_eval_only.
 *
 * The arithmetic is train_gpt's (gptc/eval.h says it in full): ending k of
 * example e is row 4e + k, context then ending, its score the sum of the
 * losses of the ending's scored targets [from, to) and their count; the
 * pick for acc is argmin of the sums, for acc_norm argmin of sum / count,
 * the lowest k on a tie. The losses differ from train_gpt's by bf16's
 * rounding only (bf16 weights and activations, fp32 softmax): picks agree
 * where the two best endings are not a bf16 near-tie.
 */
#ifndef GPTC_CUDA_EVAL_CUH
#define GPTC_CUDA_EVAL_CUH

#define EVAL_SUM_THREADS 32

/* One thread per row b of a pass: the row is this rank's row r0 + b, its
 * losses losses[b * T ...]; span (rows, 3) holds each row's slot in scores
 * (8e + k), and its scored targets' [from, to). Writes
 *   scores[slot]     = sum over t in [from, to) of losses[b, t]   (in fp64, t ascending: train_gpt's order)
 *   scores[slot + 4] = to - from
 * Rows past `rows` (a rank's padding) are not scored. */
__global__ void eval_sums_kernel(double* scores, const float* losses, const int* span, int r0, int rows, int B, int T) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B || r0 + b >= rows) return;
    const int* sp = span + 3 * (size_t)(r0 + b);
    const float* row = losses + (size_t)b * T;
    double sum = 0.0;
    for (int t = sp[1]; t < sp[2]; t++) sum += (double)row[t];
    scores[sp[0]] = sum;
    scores[sp[0] + 4] = (double)(sp[2] - sp[1]);
}

/* Score every example (all ranks together): *out gets the counts, e->scores
 * (host, (N, 8)) every (sum_k, m_k). Rank r scores examples [r * ceil(N/W),
 * ...) as train_gpt does, and every rank runs the same number of forwards
 * (ceil(4 ceil(N/W) / B): ZeRO-3's forwards gather the weights from all).
 * Device memory for the spans and scores is taken for the call and given
 * back (the ledger's "transient"). Nothing here changes training: the
 * forward is the validation one (no dlogits, no random number), and the
 * next step's forward overwrites the activations. */
static void gpu_eval_choices(GpuGPT2* g, EvalRun* e, GpuComm* cm, EvalResult* out) {
    int N = e->set.num_examples, B = e->B, T = e->T;
    int world = cm ? cm->world : 1, rank = cm ? cm->rank : 0;
    ALWAYS(B == g->B && T == g->T);
    int per = (N + world - 1) / world;
    int lo = rank * per < N ? rank * per : N;
    int hi = lo + per < N ? lo + per : N;
    int rows = EVAL_CHOICES * (hi - lo), passes = EVAL_CHOICES * per;
#ifdef GPTC_TEST_HOOKS
    /* GPTC_EVAL_PLANT=whole: a planted bug for the tests to catch, every ending scored over its whole row
     * (the context's targets too), i.e. the loss of the whole sequence instead of the ending's tokens */
    const char* plant = getenv("GPTC_EVAL_PLANT");
    int whole = plant && !strcmp(plant, "whole");
    if (whole) printf("eval: GPTC_EVAL_PLANT=whole: every row scored from its first target (a planted bug)\n");
#else
    const int whole = 0;
#endif
    /* each row's slot and scored span, on the host once (they depend on T, not on the weights), then uploaded */
    int* span = (int*)xmalloc(sizeof(int) * 3 * (size_t)(rows > 0 ? rows : 1)); /* (rows, 3) */
    for (int i = 0; i < rows; i++) {
        int ex = lo + i / EVAL_CHOICES, k = i % EVAL_CHOICES;
        span[3 * i] = 8 * ex + k;
        eval_row_fill(e, lo, i, e->inputs, e->targets, &span[3 * i + 1], &span[3 * i + 2]);
        if (whole) span[3 * i + 1] = 0;
    }
    int* d_span = (int*)gpu_alloc(sizeof(int) * 3 * (size_t)rows, GMEM_TRANSIENT);            /* (rows, 3) */
    double* d_scores = (double*)gpu_alloc(sizeof(double) * 8 * (size_t)N, GMEM_TRANSIENT);  /* (N, 8) */
    cudaStream_t s = g->stream;
    if (rows > 0)
        CUDA_CHECK(cudaMemcpyAsync(d_span, span, sizeof(int) * 3 * (size_t)rows, cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemsetAsync(d_scores, 0, sizeof(double) * 8 * (size_t)N, s)); /* other ranks' examples: 0 */
    for (int r0 = 0; r0 < passes; r0 += B) {
        for (int b = 0; b < B; b++) {
            int* in = e->inputs + (size_t)b * T;
            int* tg = e->targets + (size_t)b * T;
            if (r0 + b < rows) {
                int from, to;
                eval_row_fill(e, lo, r0 + b, in, tg, &from, &to);
            } else { /* past this rank's last row: padding, not scored */
                memset(in, 0, sizeof(int) * (size_t)T);
                memset(tg, 0, sizeof(int) * (size_t)T);
            }
        }
        /* (gpu_forward copies the tokens into its pinned buffers: e->inputs is free again when it returns) */
        gpu_forward(g, e->inputs, e->targets, B, T, 0.0f, 0); /* acts.losses (B, T): each position's loss */
        if (r0 < rows) {
            eval_sums_kernel<<<ceil_div(B, EVAL_SUM_THREADS), EVAL_SUM_THREADS, 0, s>>>(d_scores, g->acts.losses,
                                                                                       d_span, r0, rows, B, T);
            KERNEL_CHECK();
        }
    }
    if (cm && cm->nccl && world > 1) { /* every rank's scores, summed: each rank then holds all of them */
        gpu_wait(s, NULL); /* the scores are written before the communication stream reads them */
        NCCL_CHECK(ncclAllReduce(d_scores, d_scores, 8 * (size_t)N, ncclFloat64, ncclSum, cm->nccl, cm->stream));
        s = cm->stream;
    }
    CUDA_CHECK(cudaMemcpyAsync(e->scores, d_scores, sizeof(double) * 8 * (size_t)N, cudaMemcpyDeviceToHost, s));
    gpu_wait(s, NULL);
    gpu_release(d_span);
    gpu_release(d_scores);
    free(span);
    eval_picks(e, N, out);
}

/* Score the eval set, print and log the accuracies as train_gpt's eval_log
 * does (the same line, the same JSON keys: scripts/plot_loss.py reads
 * them), and --eval-detail on rank 0. 0 or -1 (collective: every rank
 * calls it). */
static int gpu_eval_log(GpuGPT2* g, EvalRun* e, const Options* o, GpuComm* cm, FILE* log, int step) {
    double t0 = time_ms();
    EvalResult res;
    gpu_eval_choices(g, e, cm, &res);
    return eval_report(e, &res, o, cm ? cm->rank : 0, log, step, time_ms() - t0, " on the GPU");
}

/* --steps 0 --eval-file F: score --model alone on the GPU(s), at --batch-size
 * and --seq-len, and stop (train_gpt's eval_only, on the device). The model
 * takes its whole training state on the device (gpu_model_init): simple,
 * and it fits wherever one step of training at this B, T would. 0 or -1. */
static int gpu_eval_only(const Options* o, GpuComm* cm) {
    GPT2 host;
    if (model_from_options(&host, o) != 0) return -1;
    const GPT2Config* c = &host.config;
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d Vp=%d, %zu parameters (%s)\n", c->num_layers, c->channels,
           c->num_heads, c->max_seq_len, c->vocab_size, c->padded_vocab_size, host.num_parameters,
           depth_from_name(o->model) ? "random init" : o->model);
    int rc = -1;
    EvalRun e;
    if (o->seq_len > c->max_seq_len) {
        fprintf(stderr, "error: --seq-len %d exceeds the model's max_seq_len %d\n", o->seq_len, c->max_seq_len);
    } else if (eval_run_init(&e, o->eval_file, o->batch_size, o->seq_len, c->vocab_size) == 0) {
        GpuGPT2 g;
        gpu_model_init_level(&g, &host, o->batch_size, o->seq_len, o->gelu_fusion, 0);
        printf("eval: %s, %d multiple-choice examples, B=%d T=%d on %d GPU(s)\n", o->eval_file, e.set.num_examples,
               o->batch_size, o->seq_len, cm->world);
        rc = gpu_eval_log(&g, &e, o, cm, NULL, 0);
        gpu_model_free(&g);
        eval_run_free(&e);
    }
    gpt2_free(&host);
    return rc;
}

#endif /* GPTC_CUDA_EVAL_CUH */
