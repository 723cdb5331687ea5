/*
 * train_gpt.c — GPT-2 pretraining on the CPU, in one file.
 *
 * fp32 throughout, OpenMP for the cores. The file reads top to bottom as the
 * story of a training step: the layers, forward and backward; the model they
 * make; AdamW; the data; the ranks that train together; the sampler; the
 * loop that runs it all. The plumbing (checked calls, the GEMM engine, the
 * tokenizer, text to shards, flags, launch, training states and failover)
 * lives in the headers under gptc/, one include away: a student can skip it.
 *
 * Build and run (see the Makefile for every flag):
 *   make train_gpt
 *   ./train_gpt --data my_text.txt --model d4 --channels 192 --num-heads 4   # text in, model out
 *   ./train_gpt --model d12 --train-data "data/fineweb_train_*.bin" --steps 20
 *   ./train_gpt --model out/model.bin --prompt "Once upon a time"
 *   ./train_gpt --model gpt2_hf --convert gpt2_124M.bin  # a Hugging Face GPT-2 folder in, llm.c's file out
 *   ./train_gpt --help            # every flag with its default
 * It also compiles as C++17 (g++ -x c++), so that train_gpt.cu can #include
 * it for all host-side code.
 *
 * Left out on purpose: mixed precision (fp32 only here; bf16 lives in the
 * CUDA twin), flash-style attention (the T x T attention matrix is
 * materialised: at the sequence lengths a CPU trains on it is small next to
 * the logits), and any BLAS (the matmul is our own, gptc/gemm.h).
 *
 * Reading order (the banners below):
 *   1. Layers            forward/backward pairs: embeddings, LayerNorm, matmul,
 *                        attention, GELU, residual, softmax + cross-entropy
 *   2. Model files       configuration, parameter tensors, the llm.c checkpoint format
 *   3. Model             activations, init, gpt2_forward, gpt2_backward
 *   4. Optimizer         gradient norm and clipping, AdamW, schedules
 *   5. Data loader       token shards into micro-batches, per rank, per epoch
 *   6. Data parallel     MPI ranks: allreduce, ZeRO-1, ZeRO-2, overlap with backward
 *   7. Sampler           temperature / top-k / top-p; generation with a KV cache
 *   8. Training loop     evaluation (val loss, HellaSwag), samples, logging, train(), main
 * The headers, in the order they are included:
 *   gptc/util.h       checked calls, allocation, timing, file helpers, random numbers
 *   gptc/ledger.h     the allocation ledger: bytes by component, total, peak (checked by --plan)
 *   gptc/gemm.h       the packed, register-blocked GEMM every matmul runs on
 *   gptc/tokenizer.h  GPT-2's byte-level BPE (with the generated gptc/unicode_tables.h)
 *   gptc/json.h       the JSON reader: one field of a JSONL line, a safetensors header
 *   gptc/text_data.h  text, folders of .txt and JSONL into token shards
 *   gptc/eval_data.h  multiple-choice eval sets (HellaSwag) in llm.c's format
 *   gptc/eval.h       scoring them with the model: acc, acc_norm, the split over ranks (section 8)
 *   gptc/safetensors.h  Hugging Face GPT-2 checkpoints in and out (section 2)
 *   gptc/sample.h     temperature / top-k / top-p and the generation loop, shared with the twin (section 7)
 *   gptc/cli.h        the flag table, parsing, usage, checks; what the flags build (section 8)
 *   gptc/zero3.h      ZeRO-3's gathers, nodes (--topology), bytes per level, hierarchical reduction (section 6)
 *   gptc/zeropp.h     ZeRO++ on --zero 3: quantised gathers and reductions, hpZ (section 6)
 *   gptc/state.h      the training-state format, snapshot slots, bad-step detection  (section 8)
 *   gptc/run_lock.h   one trainer per run directory: the locks, a hot spare's inheritance (section 8)
 *   gptc/launch.h     ranks from the launcher; the rendezvous for NCCL; rank agreement (section 8)
 *   gptc/run.h        the training run's data, schedule, log and locks (TrainRun)        (section 8)
 *   gptc/test_hooks.h the faults tests plant (-DGPTC_TEST_HOOKS builds only)       (section 8)
 *   gptc/saver.h      snapshots, replicas, saves to disk, rollback               (section 8)
 *   gptc/resume.h     a resume: which copy of the state to continue from, checked (section 8)
 *   gptc/loop_tail.h  heartbeat, timing lines, the loop's tail train() shares     (section 8)
 *   gptc/standby.h    the hot spare (--standby)                                   (section 8)
 *   gptc/calib.h      the calibration: rates measured at start, cached            (section 8)
 *   gptc/runtime.h    the runtime model: a step's time (--plan, --auto)           (section 8)
 *   gptc/plan.h       the memory plan (--plan) the ledger is checked against        (section 8)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fileno, fsync, posix functions under -std=c11 */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <assert.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#include <float.h>
#include <glob.h>
#include <unistd.h>
#include <sys/stat.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "gptc/util.h"      /* defines: CHECK, ALWAYS, FILE_ERROR, xmalloc, time_ms, file helpers, Rng */
#include "gptc/ledger.h"    /* defines: ledger_floats, ledger_malloc, ledger_free: every big allocation, by component */
#include "gptc/gemm.h"      /* defines: gemm, the packed, register-blocked GEMM every matmul runs on */
#include "gptc/tokenizer.h" /* defines: Tokenizer, tokenizer_init, tokenizer_encode, tokenizer_decode */
#include "gptc/json.h"      /* defines: json_object_field, json_skip, JsonError: the JSON reader (JSONL, safetensors) */
#include "gptc/text_data.h" /* defines: SHARD_MAGIC, prepare_shards (text, folders, JSONL -> shards) */
#include "gptc/eval_data.h" /* defines: EvalSet, evalset_read: multiple-choice eval files (HellaSwag, llm.c's format) */

/* ------------------------------------------------------------------------ */
/* 1. Layers                                                                */
/* ------------------------------------------------------------------------ */
/* Each layer is a forward/backward pair with the same name stem and argument
 * order: outputs, then inputs, then sizes. Backward functions accumulate (+=)
 * into parameter gradients, so micro-batches add up; activation gradients
 * are written or accumulated as each comment says. Loops that reduce over
 * rows (bias and LayerNorm parameter gradients, embedding gradients) are
 * parallel over columns instead, so every sum is taken in the same order
 * whatever the thread count: results are bitwise reproducible. */

/* Columns are handed to threads in blocks of this many floats (one cache
 * line of 16 floats times 4), so threads never share a line. */
#define COLUMN_BLOCK 64

/* e^x in fp32, written so that gcc vectorises the loops calling it (libm's
 * expf is a scalar call, and the GELU and the softmaxes make tens of millions
 * of them per step). x = n ln2 + r with |r| <= ln2/2 (Cody-Waite: ln2 split in
 * a short high part, exact when multiplied by n, and a low correction), e^r by
 * its degree-7 Taylor polynomial (truncation error < 2e-9 relative, below
 * fp32's 6e-8 rounding), times 2^n built in the exponent bits. n is rounded
 * to nearest by adding and subtracting 1.5 * 2^23. Inputs are clamped to
 * [-87, 88], where 2^n stays a normal float: e^-87 = 1.6e-38 stands for 0; a NaN stays NaN. */
static inline float exp_fast(float x_in) {
    /* written so a NaN fails both tests and becomes -87 (no float-to-int
     * conversion of a NaN below, which is undefined); it comes back out as
     * NaN at the end, so the bad-step guard still sees it */
    float x = x_in > -87.0f ? x_in : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    const float round_magic = 12582912.0f; /* 1.5 * 2^23 */
    float n = (x * 1.44269504f + round_magic) - round_magic; /* round(x / ln2) */
    float r = x - n * 0.693359375f;                           /* ln2 high part */
    r = r - n * -2.12194440e-4f;                              /* ln2 low part */
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    return x_in != x_in ? x_in : p * scale;
}

/* dst(N) += sum over rows of src(M, N) */
static void column_sums_accumulate(float* RESTRICT dst, const float* RESTRICT src, int M, int N) {
    int nblocks = (N + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int j0 = blk * COLUMN_BLOCK, j1 = j0 + COLUMN_BLOCK < N ? j0 + COLUMN_BLOCK : N;
        float acc[COLUMN_BLOCK];
        for (int j = j0; j < j1; j++) acc[j - j0] = 0.0f;
        for (int i = 0; i < M; i++) {
            const float* row = src + (size_t)i * N;
            for (int j = j0; j < j1; j++) acc[j - j0] += row[j];
        }
        for (int j = j0; j < j1; j++) dst[j] += acc[j - j0];
    }
}

/* out(B,T,C) = wte[inp(B,T)] + wpe[t] */
static void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe,
                            int B, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        int t = bt % T;
        const float* te = wte + (size_t)inp[bt] * C;
        const float* pe = wpe + (size_t)t * C;
        float* o = out + (size_t)bt * C;
        for (int c = 0; c < C; c++) o[c] = te[c] + pe[c];
    }
}

/* dwte[inp] += dout, dwpe[t] += dout. Parallel over channel blocks so that
 * two positions holding the same token never race. */
static void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp,
                             int B, int T, int C) {
    int nblocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
        for (int bt = 0; bt < B * T; bt++) {
            const float* d = dout + (size_t)bt * C;
            float* te = dwte + (size_t)inp[bt] * C;
            float* pe = dwpe + (size_t)(bt % T) * C;
            for (int c = c0; c < c1; c++) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

/* out(N,C) = (inp - mean) * rstd * weight + bias, per row; rstd =
 * 1/sqrt(var + eps), eps = 1e-5 as in GPT-2 (torch.nn.LayerNorm default).
 * mean, rstd (N) are kept for backward. */
#define LAYERNORM_EPS 1e-5f /* (the CUDA twin's kernels use it too) */
static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) {
    const float eps = LAYERNORM_EPS;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        float* o = out + (size_t)i * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= C;
        float s = 1.0f / sqrtf(v + eps);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

/* With n = (x - mean) * rstd and y = n * w + b:
 *   dx += rstd * (dn - mean(dn) - n * mean(dn * n)),  dn = dy * w
 *   dw += sum_rows dy * n,  db += sum_rows dy
 * dinp is accumulated (it is the residual stream's gradient). */
static void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float* dy = dout + (size_t)i * C;
        const float* x = inp + (size_t)i * C;
        float* dx = dinp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dn_mean = 0.0f, dn_n_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * s;
            float dn = dy[c] * weight[c];
            dn_mean += dn;
            dn_n_mean += dn * n;
        }
        dn_mean /= C;
        dn_n_mean /= C;
        for (int c = 0; c < C; c++) {
            float n = (x[c] - m) * s;
            float dn = dy[c] * weight[c];
            dx[c] += s * (dn - dn_mean - n * dn_n_mean);
        }
    }
    int nblocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
        float dw[COLUMN_BLOCK], db[COLUMN_BLOCK];
        for (int c = c0; c < c1; c++) dw[c - c0] = db[c - c0] = 0.0f;
        for (int i = 0; i < N; i++) {
            const float* dy = dout + (size_t)i * C;
            const float* x = inp + (size_t)i * C;
            float m = mean[i], s = rstd[i];
            for (int c = c0; c < c1; c++) {
                dw[c - c0] += dy[c] * ((x[c] - m) * s);
                db[c - c0] += dy[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dweight[c] += dw[c - c0];
            dbias[c] += db[c - c0];
        }
    }
}

/* out(N,OC) = inp(N,C) . weight(OC,C)^T + bias(OC); bias may be NULL. */
static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    if (bias) {
#pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, sizeof(float) * (size_t)OC);
    }
    gemm(N, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != NULL, 1);
}

/* dinp(N,C) = dout(N,OC) . weight(OC,C)   (written, or added if accumulate)
 * dweight(OC,C) += dout^T . inp(N,C);  dbias(OC) += sum_rows dout */
static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC,
                            int accumulate) {
    gemm(N, C, OC, dout, OC, 1, weight, C, 1, dinp, C, accumulate, 1);
    gemm(OC, C, N, dout, 1, OC, inp, C, 1, dweight, C, 1, 1);
    if (dbias) column_sums_accumulate(dbias, dout, N, OC);
}

/* Causal self-attention, per (b, h) with hs = C / NH:
 *   S = Q K^T / sqrt(hs)   (T, T), masked to t2 <= t
 *   A = softmax_rows(S)    kept in att for backward
 *   Y = A V                (T, hs), written into out's head slice
 * q, k, v are the three C-wide slices of qkv (B, T, 3C). Each (b, h) is one
 * task: its small GEMMs run on the calling thread. */
static void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    long C3 = 3L * C;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float* q = qkv + (size_t)b * T * C3 + (size_t)h * hs; /* q(t, d) = q[t*3C + d] */
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* a = att + (size_t)bh * T * T; /* (T, T) */
        /* S = Q K^T: K^T(d, t2) = k[t2*3C + d] */
        gemm(T, T, hs, q, C3, 1, k, 1, C3, a, T, 0, 0);
        for (int t = 0; t < T; t++) {
            float* row = a + (size_t)t * T;
            float maxv = -FLT_MAX;
            for (int t2 = 0; t2 <= t; t2++) {
                row[t2] *= scale;
                if (row[t2] > maxv) maxv = row[t2];
            }
            float sum = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                row[t2] = exp_fast(row[t2] - maxv);
                sum += row[t2];
            }
            float inv = 1.0f / sum;
            for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
            for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f; /* masked: exactly zero */
        }
        /* Y = A V */
        gemm(T, hs, T, a, T, 1, v, C3, 1, out + (size_t)b * T * C + (size_t)h * hs, C, 0, 0);
    }
}

/* Backward of the above; dqkv is written (not accumulated). datt is scratch
 * of the same shape as att (B, NH, T, T).
 *   dA = dY V^T,  dV = A^T dY
 *   dS = A * (dA - rowsum(A * dA)) * scale     (softmax backward)
 *   dQ = dS K,    dK = dS^T Q */
static void attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv,
                               const float* att, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    long C3 = 3L * C;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t off = (size_t)b * T * C3 + (size_t)h * hs;
        const float* q = qkv + off;
        const float* k = q + C;
        const float* v = q + 2 * C;
        float* dq = dqkv + off;
        float* dk = dq + C;
        float* dv = dq + 2 * C;
        const float* a = att + (size_t)bh * T * T;
        float* da = datt + (size_t)bh * T * T;
        const float* dy = dout + (size_t)b * T * C + (size_t)h * hs; /* dy(t, d) = dy[t*C + d] */
        gemm(T, T, hs, dy, C, 1, v, 1, C3, da, T, 0, 0); /* dA = dY V^T */
        gemm(T, hs, T, a, 1, T, dy, C, 1, dv, C3, 0, 0); /* dV = A^T dY */
        for (int t = 0; t < T; t++) {
            const float* arow = a + (size_t)t * T;
            float* drow = da + (size_t)t * T;
            float dot = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) dot += arow[t2] * drow[t2];
            for (int t2 = 0; t2 <= t; t2++) drow[t2] = arow[t2] * (drow[t2] - dot) * scale;
            for (int t2 = t + 1; t2 < T; t2++) drow[t2] = 0.0f;
        }
        gemm(T, hs, T, da, T, 1, k, C3, 1, dq, C3, 0, 0); /* dQ = dS K */
        gemm(T, hs, T, da, 1, T, q, C3, 1, dk, C3, 0, 0); /* dK = dS^T Q */
    }
}

/* GELU, tanh form (Hendrycks & Gimpel 2016, sec. 2; PyTorch approximate='tanh'):
 *   y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
 * computed as y = x * s with s = sigmoid(2u) = 1 / (1 + e^(-2u)), the same
 * function (0.5 (1 + tanh u) = sigmoid(2u)) with one exp and no cancellation
 * when tanh(u) is near -1. */
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
static void gelu_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + exp_fast(-2.0f * u));
    }
}

/* dinp = dout * gelu'(inp), gelu'(x) = s + x s (1 - s) 2 du/dx; written, and
 * may alias dout (elementwise). */
static void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float s = 1.0f / (1.0f + exp_fast(-2.0f * u));
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (s + x * s * (1.0f - s) * 2.0f * du);
    }
}

/* out = a + b (the residual connection); its backward is the identity,
 * folded into the callers. */
static void residual_forward(float* out, const float* a, const float* b, size_t N) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

/* In place over logits (N, Vp): probabilities over the first V columns (the
 * pad columns are set to 0: they are never predicted), and
 * losses(N) = logsumexp(logits[:V]) - logits[target]. */
static void crossentropy_softmax_forward(float* logits, float* losses, const int* targets,
                                         int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float* row = logits + (size_t)i * Vp;
        float maxv = -FLT_MAX;
#pragma omp simd reduction(max : maxv)
        for (int v = 0; v < V; v++) maxv = row[v] > maxv ? row[v] : maxv;
        float target_logit = row[targets[i]];
        for (int v = 0; v < V; v++) row[v] = exp_fast(row[v] - maxv);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += row[v];
        float inv = (float)(1.0 / sum);
        for (int v = 0; v < V; v++) row[v] *= inv;
        for (int v = V; v < Vp; v++) row[v] = 0.0f;
        losses[i] = (float)((double)maxv + log(sum) - (double)target_logit);
    }
}

/* In place over probs: dlogits = (probs - onehot(target)) * dloss, with
 * dloss = d(mean loss)/d(loss_i) times any accumulation scale. */
static void crossentropy_softmax_backward(float* probs, const int* targets, int N, int Vp, float dloss) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float* row = probs + (size_t)i * Vp;
        for (int v = 0; v < Vp; v++) row[v] *= dloss;
        row[targets[i]] -= dloss;
    }
}

/* ------------------------------------------------------------------------ */
/* 2. Model files (llm.c format)                                            */
/* ------------------------------------------------------------------------ */
/* Header: 256 little-endian int32. [0] magic 20240326, [1] version (3 = fp32
 * params, 5 = bf16 params), [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp.
 * Then the 16 parameter tensors below, in this order, each concatenated over
 * layers. Weights are (out, in), row-major. */

#define MODEL_MAGIC 20240326
#define MODEL_VERSION_FP32 3
#define MODEL_VERSION_BF16 5

typedef struct {
    int max_seq_len;       /* maxT: longest sequence the position table holds */
    int vocab_size;        /* V: real tokens (50257 for GPT-2) */
    int padded_vocab_size; /* Vp: V rounded up to a multiple of 128 (50304) */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C */
} GPT2Config;

#define NUM_PARAMETER_TENSORS 16
static const char* const PARAMETER_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
/* The tensors with a layer dimension: ln1w .. fcprojb, indices [2, 14). */
#define LAYER_TENSORS_BEGIN 2
#define LAYER_TENSORS_END 14

/* Which tensors are 2-D matmul/embedding weights: the ones weight decay
 * applies to by default (biases and LayerNorm parameters are not decayed,
 * as in GPT-2/nanoGPT practice). */
static const int PARAMETER_IS_MATRIX[NUM_PARAMETER_TENSORS] = {
    1, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0};

typedef struct {
    float* wte;      /* (Vp, C) token embedding, also the LM head */
    float* wpe;      /* (maxT, C) position embedding */
    float* ln1w;     /* (L, C) */
    float* ln1b;     /* (L, C) */
    float* qkvw;     /* (L, 3C, C) */
    float* qkvb;     /* (L, 3C) */
    float* attprojw; /* (L, C, C) */
    float* attprojb; /* (L, C) */
    float* ln2w;     /* (L, C) */
    float* ln2b;     /* (L, C) */
    float* fcw;      /* (L, 4C, C) */
    float* fcb;      /* (L, 4C) */
    float* fcprojw;  /* (L, C, 4C) */
    float* fcprojb;  /* (L, C) */
    float* lnfw;     /* (C) */
    float* lnfb;     /* (C) */
} ParameterTensors;
/* The struct is carved from one buffer by walking it as an array of
 * pointers, in the table's order. */
static_assert(sizeof(ParameterTensors) == NUM_PARAMETER_TENSORS * sizeof(float*),
              "ParameterTensors must hold exactly the 16 tensors of the table");

static void parameter_sizes(size_t sizes[NUM_PARAMETER_TENSORS], const GPT2Config* c) {
    size_t Vp = c->padded_vocab_size, C = c->channels, maxT = c->max_seq_len, L = c->num_layers;
    sizes[0] = Vp * C;          /* wte */
    sizes[1] = maxT * C;        /* wpe */
    sizes[2] = L * C;           /* ln1w */
    sizes[3] = L * C;           /* ln1b */
    sizes[4] = L * 3 * C * C;   /* qkvw */
    sizes[5] = L * 3 * C;       /* qkvb */
    sizes[6] = L * C * C;       /* attprojw */
    sizes[7] = L * C;           /* attprojb */
    sizes[8] = L * C;           /* ln2w */
    sizes[9] = L * C;           /* ln2b */
    sizes[10] = L * 4 * C * C;  /* fcw */
    sizes[11] = L * 4 * C;      /* fcb */
    sizes[12] = L * C * 4 * C;  /* fcprojw */
    sizes[13] = L * C;          /* fcprojb */
    sizes[14] = C;              /* lnfw */
    sizes[15] = C;              /* lnfb */
}

static size_t parameter_count(const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0;
    parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) n += sizes[i];
    return n;
}

/* Point 16 tensor pointers into one flat buffer, in file order, for
 * elements of elem_bytes: float here, bf16 for train_gpt.cu's weights
 * (parameters_point_x), so the two layouts cannot drift apart. */
static void parameters_point_bytes(void** ptrs, char* mem, size_t elem_bytes, const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ptrs[i] = mem;
        mem += sizes[i] * elem_bytes;
    }
}

static void parameters_point(ParameterTensors* p, float* mem, const GPT2Config* c) {
    parameters_point_bytes((void**)p, (char*)mem, sizeof(float), c);
}

static int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

/* Bounds a config must satisfy before anything is allocated from it. They
 * are generous (a 1.5B model is L=48, C=1600) but stop a corrupt header from
 * asking for terabytes. Returns NULL when valid, else what is wrong. */
static const char* config_problem(const GPT2Config* c) {
    if (c->num_layers < 1 || c->num_layers > 1024) return "num_layers must be in 1..1024";
    if (c->channels < 1 || c->channels > 65536) return "channels must be in 1..65536";
    if (c->num_heads < 1 || c->num_heads > c->channels) return "num_heads must be in 1..channels";
    if (c->channels % c->num_heads != 0) return "channels must be a multiple of num_heads";
    if (c->max_seq_len < 1 || c->max_seq_len > 1 << 20) return "max_seq_len must be in 1..1048576";
    if (c->vocab_size < 1 || c->vocab_size > 1 << 24) return "vocab_size must be in 1..16777216";
    if (c->padded_vocab_size < c->vocab_size || c->padded_vocab_size > (1 << 24) + 128)
        return "padded_vocab_size must be >= vocab_size";
    double P = (double)parameter_count(c);
    if (P > 64e9) return "the model would have more than 64 billion parameters";
    return NULL;
}

/* Architectures by depth, as GPT-2 published them: d12 = 124M, d24 = 350M,
 * d36 = 774M, d48 = 1.5B. Any other depth dN gets C = 64 N, NH = N. */
static GPT2Config config_from_depth(int depth) {
    GPT2Config c;
    c.num_layers = depth;
    c.max_seq_len = 1024;
    c.vocab_size = 50257;
    c.padded_vocab_size = 50304;
    switch (depth) {
        case 12: c.channels = 768; c.num_heads = 12; break;
        case 24: c.channels = 1024; c.num_heads = 16; break;
        case 36: c.channels = 1280; c.num_heads = 20; break;
        case 48: c.channels = 1600; c.num_heads = 25; break;
        default: c.channels = 64 * depth; c.num_heads = depth; break;
    }
    return c;
}

/* bf16 -> fp32 is exact: bf16 is the top half of an fp32. */
static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Check a checkpoint's header h against the file's size: magic, version,
 * a possible model, and exactly the bytes it implies. Fills *config and
 * returns the bytes per parameter (4: fp32, 2: bf16), or -1 after a message. */
static int model_header_check(const char* path, const int32_t* h, long long fsize, GPT2Config* config) {
    if (h[0] != MODEL_MAGIC) {
        FILE_ERROR(path, "bad magic %d, expected %d: this is not an llm.c model file "
                   "(a data shard or tokenizer file passed as --model?)", h[0], MODEL_MAGIC);
        return -1;
    }
    if (h[1] != MODEL_VERSION_FP32 && h[1] != MODEL_VERSION_BF16) {
        FILE_ERROR(path, "model file version %d; this build reads %d (fp32) and %d (bf16)",
                   h[1], MODEL_VERSION_FP32, MODEL_VERSION_BF16);
        return -1;
    }
    GPT2Config c;
    c.max_seq_len = h[2];
    c.vocab_size = h[3];
    c.num_layers = h[4];
    c.num_heads = h[5];
    c.channels = h[6];
    c.padded_vocab_size = h[7];
    const char* problem = config_problem(&c);
    if (problem) {
        FILE_ERROR(path, "header describes an impossible model (L=%d C=%d NH=%d maxT=%d V=%d Vp=%d): %s",
                   c.num_layers, c.channels, c.num_heads, c.max_seq_len, c.vocab_size,
                   c.padded_vocab_size, problem);
        return -1;
    }
    size_t n = parameter_count(&c);
    int elem = h[1] == MODEL_VERSION_FP32 ? 4 : 2;
    long long expected = (long long)HEADER_INTS * 4 + (long long)(n * elem);
    if (fsize != expected) {
        FILE_ERROR(path, "file is %lld bytes but its header (L=%d C=%d Vp=%d maxT=%d, %s) implies %lld: "
                   "truncated or not written completely",
                   fsize, c.num_layers, c.channels, c.padded_vocab_size, c.max_seq_len,
                   elem == 4 ? "fp32" : "bf16", expected);
        return -1;
    }
    *config = c;
    return elem;
}

/* Read n parameters of `elem` bytes each (4: fp32; 2: bf16, widened) from
 * f into a fresh fp32 buffer, all of them finite. The buffer, or NULL after a message. */
static float* model_params_read(FILE* f, const char* path, size_t n, int elem) {
    float* params = (float*)malloc(n * sizeof(float)); /* not xmalloc: a model too big for this machine is named */
    if (!params) {
        FILE_ERROR(path, "its %zu parameters need %.1f GB as fp32, more than this machine can allocate now: free "
                   "memory, or use a machine with more", n, n * 4.0 / 1e9);
        return NULL;
    }
    if (elem == 4) {
        if (read_exact(f, params, n * 4, path) != 0) { free(params); return NULL; }
    } else {
        /* bf16: read in chunks and widen */
        size_t chunk = 1 << 20;
        uint16_t* buf = (uint16_t*)xmalloc(chunk * 2);
        for (size_t i = 0; i < n; i += chunk) {
            size_t m = n - i < chunk ? n - i : chunk;
            if (read_exact(f, buf, m * 2, path) != 0) { free(buf); free(params); return NULL; }
            for (size_t j = 0; j < m; j++) params[i + j] = bf16_to_float(buf[j]);
        }
        free(buf);
    }
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(params[i])) {
            FILE_ERROR(path, "parameter %zu is %f: the checkpoint holds non-finite weights", i, params[i]);
            free(params);
            return NULL;
        }
    }
    return params;
}

/* Read an llm.c checkpoint. On success fills *config and returns a freshly
 * allocated fp32 parameter buffer (parameter_count floats) in *params_out.
 * On any problem prints what is wrong with which file and returns -1. */
static int model_file_read(const char* path, GPT2Config* config, float** params_out) {
    *params_out = NULL;
    FILE* f = file_open_read(path, "model file");
    if (!f) return -1;
    int32_t h[HEADER_INTS];
    long long fsize = file_size(f);
    GPT2Config c;
    int elem = -1;
    if (fsize < (long long)sizeof(h))
        FILE_ERROR(path, "file is %lld bytes, shorter than the 1024-byte header: not a model file", fsize);
    else if (read_exact(f, h, sizeof(h), path) == 0)
        elem = model_header_check(path, h, fsize, &c);
    float* params = elem > 0 ? model_params_read(f, path, parameter_count(&c), elem) : NULL;
    fclose(f);
    if (!params) return -1;
    *config = c;
    *params_out = params;
    return 0;
}

/* Write an fp32 (version 3) llm.c checkpoint, atomically. */
static int model_file_write(const char* path, const GPT2Config* c, const float* params) {
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = MODEL_MAGIC;
    h[1] = MODEL_VERSION_FP32;
    h[2] = c->max_seq_len;
    h[3] = c->vocab_size;
    h[4] = c->num_layers;
    h[5] = c->num_heads;
    h[6] = c->channels;
    h[7] = c->padded_vocab_size;
    WriteChunk chunks[2];
    chunks[0].data = h;
    chunks[0].bytes = sizeof(h);
    chunks[1].data = params;
    chunks[1].bytes = parameter_count(c) * sizeof(float);
    return write_file_atomic(path, chunks, 2);
}

/* Hugging Face's GPT-2 checkpoints (config.json + model.safetensors), read
 * into and written from the 16 tensors above: the plumbing is in the header. */
#include "gptc/safetensors.h" /* defines: hf_is_checkpoint, hf_checkpoint_read, hf_checkpoint_write, model_convert */

/* ------------------------------------------------------------------------ */
/* 3. Model                                                                 */
/* ------------------------------------------------------------------------ */
#define NUM_ACTIVATION_TENSORS 19
typedef struct {
    float* encoded;   /* (B, T, C) embeddings: the residual stream entering layer 0 */
    float* ln1;       /* (L, B, T, C) */
    float* ln1_mean;  /* (L, B, T) */
    float* ln1_rstd;  /* (L, B, T) */
    float* qkv;       /* (L, B, T, 3C) */
    float* atty;      /* (L, B, T, C) attention output, before the projection */
    float* att;       /* (L, B, NH, T, T) softmax probabilities */
    float* residual2; /* (L, B, T, C) residual + attention projection */
    float* ln2;       /* (L, B, T, C) */
    float* ln2_mean;  /* (L, B, T) */
    float* ln2_rstd;  /* (L, B, T) */
    float* fch;       /* (L, B, T, 4C) */
    float* fch_gelu;  /* (L, B, T, 4C) */
    float* residual3; /* (L, B, T, C) residual2 + MLP projection: the block's output */
    float* lnf;       /* (B, T, C) */
    float* lnf_mean;  /* (B, T) */
    float* lnf_rstd;  /* (B, T) */
    float* logits;    /* (B, T, Vp) logits; probabilities after the loss; then dlogits */
    float* losses;    /* (B, T) */
} ActivationTensors;
static_assert(sizeof(ActivationTensors) == NUM_ACTIVATION_TENSORS * sizeof(float*),
              "ActivationTensors must match its size table");

static void activation_sizes(size_t s[NUM_ACTIVATION_TENSORS], const GPT2Config* c, int B, int T) {
    size_t C = c->channels, L = c->num_layers, NH = c->num_heads, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T;
    s[0] = BT * C;            /* encoded */
    s[1] = L * BT * C;        /* ln1 */
    s[2] = L * BT;            /* ln1_mean */
    s[3] = L * BT;            /* ln1_rstd */
    s[4] = L * BT * 3 * C;    /* qkv */
    s[5] = L * BT * C;        /* atty */
    s[6] = L * B * NH * T * T; /* att */
    s[7] = L * BT * C;        /* residual2 */
    s[8] = L * BT * C;        /* ln2 */
    s[9] = L * BT;            /* ln2_mean */
    s[10] = L * BT;           /* ln2_rstd */
    s[11] = L * BT * 4 * C;   /* fch */
    s[12] = L * BT * 4 * C;   /* fch_gelu */
    s[13] = L * BT * C;       /* residual3 */
    s[14] = BT * C;           /* lnf */
    s[15] = BT;               /* lnf_mean */
    s[16] = BT;               /* lnf_rstd */
    s[17] = BT * Vp;          /* logits */
    s[18] = BT;               /* losses */
}

/* Gradients of activations are needed one layer at a time, so backward
 * keeps only these, reused by every layer (llm.c keeps a full copy of the
 * activations instead; this is L times smaller). */
#define NUM_BACKWARD_TENSORS 5
typedef struct {
    float* dresidual; /* (B, T, C) gradient of the residual stream */
    float* dbt_c;     /* (B, T, C) dln1, dln2, datty, dlnf in turn */
    float* dqkv;      /* (B, T, 3C) */
    float* dfch;      /* (B, T, 4C) d(fch_gelu), then d(fch) in place */
    float* datt;      /* (B, NH, T, T) */
} BackwardScratch;
static_assert(sizeof(BackwardScratch) == NUM_BACKWARD_TENSORS * sizeof(float*),
              "BackwardScratch must match its size table");

static void backward_sizes(size_t s[NUM_BACKWARD_TENSORS], const GPT2Config* c, int B, int T) {
    size_t C = c->channels, NH = c->num_heads, BT = (size_t)B * T;
    s[0] = BT * C;
    s[1] = BT * C;
    s[2] = BT * 3 * C;
    s[3] = BT * 4 * C;
    s[4] = (size_t)B * NH * T * T;
}

/* The floats of `n` tensors carved from one buffer, each rounded up to 16
 * floats to stay 64B aligned (tensors_alloc and the memory plan). */
static size_t tensors_floats(const size_t* sizes, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15;
    return total;
}

/* Carve `n` pointers (a struct of float*) out of one allocation, recorded in
 * the ledger as `component`. */
static float* tensors_alloc(MemComponent component, float** ptrs, const size_t* sizes, int n, size_t* total_out) {
    size_t total = tensors_floats(sizes, n);
    float* mem = ledger_floats(component, total);
    float* p = mem;
    for (int i = 0; i < n; i++) {
        ptrs[i] = p;
        p += (sizes[i] + 15) & ~(size_t)15;
    }
    if (total_out) *total_out = total;
    return mem;
}

typedef struct {
    GPT2Config config;
    /* weights and their gradients, each one flat buffer in file order */
    ParameterTensors params;
    ParameterTensors grads;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    size_t num_parameters;
    float* params_memory;
    float* grads_memory;    /* NULL until training is set up */
    size_t num_grads;       /* its floats: num_parameters, fewer under ZeRO-2 (section 6) */
    /* AdamW moments */
    float* m_memory;
    float* v_memory;
    /* activations for a batch of up to B x T */
    int batch_size, seq_len;
    ActivationTensors acts;
    float* acts_memory;
    size_t num_activations;
    BackwardScratch scratch;
    float* scratch_memory;
    size_t num_scratch;
    /* optional: called by gpt2_backward when layer l's parameter gradients are
     * final (l = L-1 down to 0), so data parallelism can start reducing them
     * while backward goes on (section 6) */
    void (*on_layer_grads)(void* ctx, int layer);
    /* optional: where backward writes layer l's parameter gradients (NULL:
     * the flat buffer); ZeRO-2 hands out a zeroed one-layer bucket */
    float* (*layer_grad_bucket)(void* ctx, int layer);
    /* optional: where forward/backward read layer l's weights (NULL: the
     * flat buffer); ZeRO-3 gathers them (layer -1: the head, before forward) */
    float* (*layer_weights)(void* ctx, int layer, int backward);
    void* on_layer_grads_ctx;
    /* a random init put off (model_from_options) until train() knows no
     * training state will replace it; the weights are zero meanwhile */
    int init_deferred;
    uint64_t init_seed;
    /* the last forward pass */
    int last_B, last_T;
    const int* last_inputs;
    const int* last_targets;
    float mean_loss;
} GPT2;

/* Take ownership of `params` (parameter_count floats) for `config`. */
static void gpt2_init_with(GPT2* model, const GPT2Config* config, float* params) {
    memset(model, 0, sizeof(*model));
    model->config = *config;
    parameter_sizes(model->param_sizes, config);
    model->num_parameters = parameter_count(config);
    model->params_memory = params;
    parameters_point(&model->params, params, config);
    ledger_record(MEM_PARAMETERS, params, model->num_parameters * sizeof(float));
}

/* GPT-2's initialisation (Radford et al. 2019, sec. 2.3, and its released
 * code): weights N(0, 0.02); the two projections that write into the
 * residual stream (attprojw, fcprojw) scaled by 1/sqrt(2L); biases 0;
 * LayerNorm weights 1, biases 0. The pad rows of wte are zero, so the pad
 * logits are exactly 0 and never matter. Deterministic for a given seed.
 * Writes the flat range [lo, hi) to dst (ZeRO-3: a rank's shard), drawing
 * the same numbers whatever the range. */
static void gpt2_fill_random_range(const GPT2* model, uint64_t seed, float* dst, size_t lo, size_t hi) {
    const GPT2Config* config = &model->config;
    Rng rng;
    rng_init(&rng, seed);
    double residual_std = 0.02 / sqrt(2.0 * config->num_layers);
    size_t at = 0, pad_from = (size_t)config->vocab_size * config->channels; /* wte's pad rows: zero */
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = model->param_sizes[i];
        const char* name = PARAMETER_NAMES[i];
        int is_ln_weight = !strcmp(name, "ln1w") || !strcmp(name, "ln2w") || !strcmp(name, "lnfw");
        size_t a = at > lo ? at : lo, b = at + n < hi ? at + n : hi; /* this tensor's part of [lo, hi) */
        if (PARAMETER_IS_MATRIX[i]) {
            double std = (!strcmp(name, "attprojw") || !strcmp(name, "fcprojw")) ? residual_std : 0.02;
            if (a < b) {
                Rng r = rng;
                rng_jump(&r, 2 * (uint64_t)(a - at)); /* (two draws a normal) */
                rng_fill_normal(&r, dst + (a - lo), b - a, std); /* all threads, the same numbers as one (gptc/util.h) */
            }
            rng_jump(&rng, 2 * (uint64_t)n);
        } else {
            for (size_t j = a; j < b; j++) dst[j - lo] = is_ln_weight ? 1.0f : 0.0f;
        }
        if (i == 0)
            for (size_t j = a > pad_from ? a : pad_from; j < b; j++) dst[j - lo] = 0.0f;
        at += n;
    }
}
static void gpt2_fill_random(GPT2* model, uint64_t seed) {
    gpt2_fill_random_range(model, seed, model->params_memory, 0, model->num_parameters);
}

static void gpt2_init_random(GPT2* model, const GPT2Config* config, uint64_t seed) {
    float* params = ledger_floats(MEM_PARAMETERS, parameter_count(config)); /* (huge pages: gptc/ledger.h) */
    gpt2_init_with(model, config, params);
    gpt2_fill_random(model, seed);
}

/* Load an llm.c model file, or a Hugging Face GPT-2 checkpoint (a folder, or
 * its model.safetensors): both give the same fp32 parameters. */
static int gpt2_load(GPT2* model, const char* path) {
    GPT2Config config;
    float* params;
    int rc = hf_is_checkpoint(path) ? hf_checkpoint_read(path, &config, &params)
                                    : model_file_read(path, &config, &params);
    if (rc != 0) return -1;
    gpt2_init_with(model, &config, params);
    return 0;
}

static int gpt2_save(const GPT2* model, const char* path) {
    return model_file_write(path, &model->config, model->params_memory);
}

/* Allocate activations for batches up to B x T, gradients and AdamW state
 * (the gradients and moments of one process: P floats each; under ZeRO,
 * dist_setup_model, called first, has made its own already). */
static void gpt2_alloc_training(GPT2* model, int B, int T) {
    ALWAYS(model->acts_memory == NULL);
    ALWAYS(T <= model->config.max_seq_len);
    model->batch_size = B;
    model->seq_len = T;
    size_t sizes[NUM_ACTIVATION_TENSORS > NUM_BACKWARD_TENSORS ? NUM_ACTIVATION_TENSORS : NUM_BACKWARD_TENSORS];
    activation_sizes(sizes, &model->config, B, T);
    model->acts_memory = tensors_alloc(MEM_ACTIVATIONS, (float**)&model->acts, sizes, NUM_ACTIVATION_TENSORS,
                                       &model->num_activations);
    backward_sizes(sizes, &model->config, B, T);
    model->scratch_memory = tensors_alloc(MEM_SCRATCH, (float**)&model->scratch, sizes, NUM_BACKWARD_TENSORS,
                                          &model->num_scratch);
    if (model->grads_memory) return; /* ZeRO's, sharded (section 6) */
    size_t n = model->num_parameters;
    /* zero and every page committed from the start (ledger_floats): the
     * memory plan's bytes are resident bytes (gptc/plan.h) */
    model->grads_memory = ledger_floats(MEM_GRADIENTS, n);
    model->m_memory = ledger_floats(MEM_ADAMW, n);
    model->v_memory = ledger_floats(MEM_ADAMW, n);
    model->num_grads = n;
    parameters_point(&model->grads, model->grads_memory, &model->config);
}

static void gpt2_free(GPT2* model) {
    ledger_free(model->params_memory);
    ledger_free(model->grads_memory);
    ledger_free(model->m_memory);
    ledger_free(model->v_memory);
    ledger_free(model->acts_memory);
    ledger_free(model->scratch_memory);
    memset(model, 0, sizeof(*model));
}

/* Layer l's activations for a batch of (B, T): an ActivationTensors whose
 * per-layer tensors, ln1 .. residual3 (each (L, ...), so l * size / L
 * elements in), point at layer l's slice; the rest are unchanged. Forward
 * and backward both index the layer through it. */
#define ACTS_LAYER_BEGIN 1 /* ln1 */
#define ACTS_LAYER_END 14  /* one past residual3 */
static ActivationTensors layer_acts(const GPT2* model, int l, int B, int T) {
    ActivationTensors a = model->acts;
    float** ap = (float**)&a;
    size_t sizes[NUM_ACTIVATION_TENSORS], L = (size_t)model->config.num_layers;
    activation_sizes(sizes, &model->config, B, T);
    for (int k = ACTS_LAYER_BEGIN; k < ACTS_LAYER_END; k++) ap[k] += (size_t)l * (sizes[k] / L);
    return a;
}

/* Layer l's parameter gradients (or weights): a ParameterTensors whose
 * per-layer tensors point at layer l's slice, in the flat buffer or, when
 * the data parallel hook hands one out (ZeRO-2's gradients, ZeRO-3's
 * gathered weights: section 6), in a one-layer bucket holding the 12 slices
 * back to back in file order. */
static ParameterTensors layer_slices(const GPT2* model, ParameterTensors g, float* bucket, int l) {
    float** gp = (float**)&g;
    size_t L = (size_t)model->config.num_layers, at = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = model->param_sizes[k] / L;
        gp[k] = bucket ? bucket + at : gp[k] + (size_t)l * per_layer;
        at += per_layer;
    }
    return g;
}
static ParameterTensors layer_grads(GPT2* model, int l) {
    float* bucket = model->layer_grad_bucket ? model->layer_grad_bucket(model->on_layer_grads_ctx, l) : NULL;
    return layer_slices(model, model->grads, bucket, l);
}
static ParameterTensors layer_params(GPT2* model, int l, int backward) {
    float* bucket = model->layer_weights ? model->layer_weights(model->on_layer_grads_ctx, l, backward) : NULL;
    return layer_slices(model, model->params, bucket, l);
}

/* Forward pass over inputs (B, T) with B, T no larger than allocated. With
 * targets, returns the mean loss and leaves probabilities in acts.logits;
 * without (targets == NULL), leaves the raw logits and returns -1. The
 * activations of a smaller batch use a prefix of each buffer with the smaller strides. */
static float gpt2_forward(GPT2* model, const int* inputs, const int* targets, int B, int T) {
    const GPT2Config* cfg = &model->config;
    ALWAYS(model->acts_memory != NULL && B <= model->batch_size && T <= model->seq_len);
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, V = cfg->vocab_size;
    int Vp = cfg->padded_vocab_size;
    for (int i = 0; i < B * T; i++) {
        CHECK(inputs[i] >= 0 && inputs[i] < V, "input token %d at %d out of range [0, %d)", inputs[i], i, V);
        if (targets)
            CHECK(targets[i] >= 0 && targets[i] < V, "target token %d at %d out of range [0, %d)", targets[i], i, V);
    }
    if (model->layer_weights) model->layer_weights(model->on_layer_grads_ctx, -1, 0); /* ZeRO-3: the head */
    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    size_t BT = (size_t)B * T;
    encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        ActivationTensors al = layer_acts(model, l, B, T); /* layer l's slices */
        ParameterTensors lp = layer_params(model, l, 0);
        layernorm_forward(al.ln1, al.ln1_mean, al.ln1_rstd, residual, lp.ln1w, lp.ln1b, BT, C);
        matmul_forward(al.qkv, al.ln1, lp.qkvw, lp.qkvb, BT, C, 3 * C);
        attention_forward(al.atty, al.att, al.qkv, B, T, C, NH);
        /* residual2 = residual + atty . attprojw^T + attprojb */
        matmul_forward(al.residual2, al.atty, lp.attprojw, lp.attprojb, BT, C, C);
        residual_forward(al.residual2, al.residual2, residual, BT * C);
        layernorm_forward(al.ln2, al.ln2_mean, al.ln2_rstd, al.residual2, lp.ln2w, lp.ln2b, BT, C);
        matmul_forward(al.fch, al.ln2, lp.fcw, lp.fcb, BT, C, 4 * C);
        gelu_forward(al.fch_gelu, al.fch, BT * 4 * C);
        /* residual3 = residual2 + fch_gelu . fcprojw^T + fcprojb */
        matmul_forward(al.residual3, al.fch_gelu, lp.fcprojw, lp.fcprojb, BT, 4 * C, C);
        residual_forward(al.residual3, al.residual3, al.residual2, BT * C);
    }
    const float* last = a.residual3 + (L - 1) * BT * C;
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, BT, C);
    /* the LM head is the token embedding, transposed: logits = lnf . wte^T */
    matmul_forward(a.logits, a.lnf, p.wte, NULL, BT, C, Vp);
    model->last_B = B;
    model->last_T = T;
    model->last_inputs = inputs;
    model->last_targets = targets;
    if (!targets) {
        model->mean_loss = -1.0f;
        return -1.0f;
    }
    crossentropy_softmax_forward(a.logits, a.losses, targets, BT, V, Vp);
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += a.losses[i];
    model->mean_loss = (float)(sum / BT);
    return model->mean_loss;
}

static void gpt2_zero_grad(GPT2* model) {
    memset(model->grads_memory, 0, model->num_grads * sizeof(float));
}

/* Backward pass of the last forward (which must have had targets): adds
 * d(loss_scale * mean loss)/d(params) into the gradients. loss_scale is
 * 1 / (micro-batches per step) when gradients are accumulated. */
static void gpt2_backward(GPT2* model, float loss_scale) {
    const GPT2Config* cfg = &model->config;
    ALWAYS(model->grads_memory != NULL && model->last_targets != NULL);
    int B = model->last_B, T = model->last_T;
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, Vp = cfg->padded_vocab_size;
    size_t BT = (size_t)B * T;
    ParameterTensors p = model->params, g = model->grads;
    ActivationTensors a = model->acts;
    BackwardScratch s = model->scratch;

    crossentropy_softmax_backward(a.logits, model->last_targets, BT, Vp, loss_scale / BT);
    /* dlnf = dlogits . wte; dwte += dlogits^T . lnf */
    matmul_backward(s.dbt_c, g.wte, NULL, a.logits, a.lnf, p.wte, BT, C, Vp, 0);
    memset(s.dresidual, 0, BT * C * sizeof(float));
    const float* last = a.residual3 + (L - 1) * BT * C;
    layernorm_backward(s.dresidual, g.lnfw, g.lnfb, s.dbt_c, last, p.lnfw, a.lnf_mean, a.lnf_rstd, BT, C);

    for (int l = L - 1; l >= 0; l--) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        ActivationTensors al = layer_acts(model, l, B, T); /* layer l's slices */
        ParameterTensors lg = layer_grads(model, l), lp = layer_params(model, l, 1);
        /* MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
        matmul_backward(s.dfch, lg.fcprojw, lg.fcprojb, s.dresidual,
                        al.fch_gelu, lp.fcprojw, BT, 4 * C, C, 0);
        gelu_backward(s.dfch, al.fch, s.dfch, BT * 4 * C);
        matmul_backward(s.dbt_c, lg.fcw, lg.fcb, s.dfch, al.ln2,
                        lp.fcw, BT, C, 4 * C, 0);
        layernorm_backward(s.dresidual, lg.ln2w, lg.ln2b, s.dbt_c, al.residual2,
                           lp.ln2w, al.ln2_mean, al.ln2_rstd, BT, C);
        /* attention: residual2 = residual + attproj(attn(ln1(residual))) */
        matmul_backward(s.dbt_c, lg.attprojw, lg.attprojb, s.dresidual, al.atty,
                        lp.attprojw, BT, C, C, 0);
        attention_backward(s.dqkv, s.datt, s.dbt_c, al.qkv, al.att, B, T, C, NH);
        matmul_backward(s.dbt_c, lg.qkvw, lg.qkvb, s.dqkv, al.ln1,
                        lp.qkvw, BT, C, 3 * C, 0);
        layernorm_backward(s.dresidual, lg.ln1w, lg.ln1b, s.dbt_c, residual,
                           lp.ln1w, al.ln1_mean, al.ln1_rstd, BT, C);
        if (model->on_layer_grads) model->on_layer_grads(model->on_layer_grads_ctx, l);
    }
    encoder_backward(g.wte, g.wpe, s.dresidual, model->last_inputs, B, T, C);
}

/* ------------------------------------------------------------------------ */
/* 4. Optimizer and schedules                                               */
/* ------------------------------------------------------------------------ */
/* Sums over large arrays are taken in fixed chunks (partial sums in double,
 * added in chunk order), so the result does not depend on the thread count. */
#define REDUCE_CHUNK 65536

/* sum g^2 over n floats */
static double sum_squares(const float* g, size_t n) {
    size_t nchunks = (n + REDUCE_CHUNK - 1) / REDUCE_CHUNK;
    double* partial = (double*)xmalloc(sizeof(double) * (nchunks ? nchunks : 1));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t i0 = c * REDUCE_CHUNK, i1 = i0 + REDUCE_CHUNK < n ? i0 + REDUCE_CHUNK : n;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (size_t i = i0; i < i1; i++) acc += (double)g[i] * g[i];
        partial[c] = acc;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += partial[c];
    free(partial);
    return total;
}

static void scale_floats(float* x, size_t n, float s) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* Clip by global norm (as torch.nn.utils.clip_grad_norm_): if the norm
 * exceeds max_norm, scale every gradient by max_norm / (norm + 1e-6).
 * max_norm <= 0 disables clipping. The rule for n gradients whose global
 * norm is already known (under ZeRO-1 a rank holds a shard of them): */
static void gradients_clip_to(float* g, size_t n, double norm, double max_norm) {
    if (max_norm > 0.0 && isfinite(norm)) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) scale_floats(g, n, (float)coef);
    }
}

/* Clip all of a model's gradients; returns the norm before clipping. */
static double gradients_clip(GPT2* model, double max_norm) {
    double norm = sqrt(sum_squares(model->grads_memory, model->num_parameters));
    gradients_clip_to(model->grads_memory, model->num_parameters, norm, max_norm);
    return norm;
}

typedef struct {
    float beta1, beta2, eps;
    float weight_decay;
    int decay_all; /* 1: decay every tensor; 0: only the 2-D weights */
} AdamWConfig;

/* AdamW (Loshchilov & Hutter 2019, Alg. 2; PyTorch's torch.optim.AdamW),
 * step t counted from 1:
 *   p -= lr * wd * p                      (decoupled weight decay)
 *   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
 *   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 * over the parameters [lo, hi) of the flat buffer; params, g, m, v hold
 * exactly that range (g[0] is parameter lo's gradient). One process updates
 * everything; under ZeRO each rank updates its shard. Weight decay follows
 * the tensor each parameter belongs to. */
static void adamw_update_slice(GPT2* model, const AdamWConfig* opt, float lr, int t, size_t lo, size_t hi,
                               float* params, const float* grads, float* m_mem, float* v_mem) {
    float bc1 = 1.0f - (float)pow(opt->beta1, t);
    float bc2 = 1.0f - (float)pow(opt->beta2, t);
    float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    size_t start = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        size_t end = start + model->param_sizes[k];
        size_t i0 = start > lo ? start : lo, i1 = end < hi ? end : hi; /* this tensor's part of the range */
        float wd = (opt->decay_all || PARAMETER_IS_MATRIX[k]) ? opt->weight_decay : 0.0f;
        if (i0 < i1) {
            float* RESTRICT p = params + (i0 - lo);
            const float* RESTRICT g = grads + (i0 - lo);
            float* RESTRICT m = m_mem + (i0 - lo);
            float* RESTRICT v = v_mem + (i0 - lo);
            size_t n = i1 - i0;
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < n; i++) {
                float gi = g[i];
                float mi = b1 * m[i] + (1.0f - b1) * gi;
                float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
                m[i] = mi;
                v[i] = vi;
                float pi = p[i] - lr * wd * p[i];
                p[i] = pi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
            }
        }
        start = end;
    }
}

static void adamw_update_range(GPT2* model, const AdamWConfig* opt, float lr, int t, size_t lo, size_t hi,
                               const float* grads, float* m_mem, float* v_mem) {
    adamw_update_slice(model, opt, lr, t, lo, hi, model->params_memory + lo, grads, m_mem, v_mem);
}

static void adamw_update(GPT2* model, const AdamWConfig* opt, float lr, int t) {
    adamw_update_range(model, opt, lr, t, 0, model->num_parameters, model->grads_memory, model->m_memory,
                       model->v_memory);
}

typedef enum { SCHEDULE_COSINE, SCHEDULE_LINEAR, SCHEDULE_CONSTANT, SCHEDULE_WSD } ScheduleKind;
static const char* const SCHEDULE_NAMES[] = {"cosine", "linear", "constant", "wsd"};

typedef struct {
    ScheduleKind kind;
    double max_lr;
    int warmup_steps;
    int total_steps;
    double final_frac; /* the lr decays to max_lr * final_frac */
    double decay_frac; /* wsd: the last decay_frac of steps decay linearly */
} LRSchedule;

/* Learning rate at step (0-based): linear warmup over warmup_steps (step s
 * gets max_lr (s+1)/warmup), then cosine / linear / constant / warmup-stable-
 * decay down to max_lr * final_frac at the last step. */
static double lr_at(const LRSchedule* s, int step) {
    double max_lr = s->max_lr, min_lr = s->max_lr * s->final_frac;
    if (step < s->warmup_steps) return max_lr * (step + 1) / s->warmup_steps;
    int span = s->total_steps - s->warmup_steps;
    double r = span > 0 ? (double)(step - s->warmup_steps) / span : 0.0;
    if (r > 1.0) r = 1.0;
    switch (s->kind) {
        case SCHEDULE_COSINE: return min_lr + 0.5 * (1.0 + cos(M_PI * r)) * (max_lr - min_lr);
        case SCHEDULE_LINEAR: return max_lr - r * (max_lr - min_lr);
        case SCHEDULE_CONSTANT: return max_lr;
        case SCHEDULE_WSD: {
            int decay_steps = (int)(s->decay_frac * s->total_steps + 0.5);
            int decay_start = s->total_steps - decay_steps;
            if (step < decay_start || decay_steps <= 0) return max_lr;
            double d = (double)(step - decay_start) / decay_steps;
            return max_lr - d * (max_lr - min_lr);
        }
    }
    return max_lr;
}

/* ------------------------------------------------------------------------ */
/* 5. Data loader                                                           */
/* ------------------------------------------------------------------------ */
/* Token shard (llm.c format): 256 int32 header ([0] magic 20240520, [1]
 * version 1, [2] number of tokens n), then n uint16 tokens; the file is
 * exactly 1024 + 2n bytes. Documents are separated by end-of-text tokens.
 *
 * The loader cuts each shard into samples of T+1 tokens that overlap by one
 * (sample i covers tokens [iT, iT+T], inputs are its first T, targets its
 * last T). A micro-batch is B consecutive samples of the shard's sample order
 * (identity, or a seeded permutation per epoch with --shuffle). With several
 * processes, rank r of W takes samples [cursor + rB, cursor + rB + B) and the
 * cursor advances by W·B, so the ranks together read exactly what one
 * process with batch W·B would. When a shard has fewer than W·B samples left
 * the loader moves to the next shard; after the last, a new epoch begins. */

/* SHARD_MAGIC and SHARD_VERSION: gptc/text_data.h, which writes shards. */

typedef struct {
    /* configuration */
    int B, T;
    int rank, world;
    int shuffle;
    uint64_t seed;
    int vocab_size;      /* tokens must be < this */
    /* files */
    glob_t files;
    int num_shards;
    long long* shard_tokens; /* (num_shards) tokens per shard, from headers */
    /* position: everything needed to resume exactly */
    int epoch;
    int shard_pos;       /* index into shard_order */
    long long cursor;    /* next sample, index into sample_order */
    /* the loaded shard */
    int loaded_shard;    /* file index, -1 if none */
    int loaded_epoch;    /* the epoch whose sample order is loaded */
    uint16_t* tokens;    /* (n) */
    long long num_tokens;
    long long num_samples;
    int* shard_order;    /* (num_shards) */
    long long* sample_order; /* (num_samples) */
    /* output of the last load */
    int* inputs;         /* (B, T) */
    int* targets;        /* (B, T) */
} DataLoader;

/* Read and check a shard header against its file size. */
static int shard_header(const char* path, long long* num_tokens) {
    FILE* f = file_open_read(path, "data shard");
    if (!f) return -1;
    int32_t h[HEADER_INTS];
    long long fsize = file_size(f);
    if (fsize < (long long)sizeof(h) || read_exact(f, h, sizeof(h), path) != 0) {
        FILE_ERROR(path, "file is %lld bytes, shorter than the 1024-byte header: not a token shard", fsize);
        fclose(f);
        return -1;
    }
    fclose(f);
    if (h[0] != SHARD_MAGIC) {
        FILE_ERROR(path, "bad magic %d, expected %d: not an llm.c token shard", h[0], SHARD_MAGIC);
        return -1;
    }
    if (h[1] != SHARD_VERSION) {
        FILE_ERROR(path, "shard version %d, this build reads version %d (uint16 tokens)", h[1], SHARD_VERSION);
        return -1;
    }
    if (h[2] < 0 || fsize != (long long)sizeof(h) + 2LL * h[2]) {
        FILE_ERROR(path, "header says %d tokens, so the file should be %lld bytes, but it is %lld: "
                   "truncated or corrupt; re-create it", h[2], (long long)sizeof(h) + 2LL * h[2], fsize);
        return -1;
    }
    *num_tokens = h[2];
    return 0;
}

static void dataloader_free(DataLoader* d) {
    if (d->num_shards > 0) globfree(&d->files);
    ledger_free(d->shard_tokens);
    ledger_free(d->tokens);
    ledger_free(d->shard_order);
    ledger_free(d->sample_order);
    ledger_free(d->inputs);
    ledger_free(d->targets);
    memset(d, 0, sizeof(*d));
}

static void shuffle_ints(int* a, int n, Rng* rng) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_u32(rng) % (uint32_t)(i + 1));
        int t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

static void shuffle_longs(long long* a, long long n, Rng* rng) {
    for (long long i = n - 1; i > 0; i--) {
        uint64_t r = ((uint64_t)rng_u32(rng) << 32) | rng_u32(rng);
        long long j = (long long)(r % (uint64_t)(i + 1));
        long long t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

/* The bytes a loaded shard of n tokens takes, besides its tokens (2n): its
 * sample order, one long long per sample of T + 1 tokens (the memory plan uses it too). */
static size_t dataloader_order_bytes(long long n, int T) {
    long long samples = (n - 1) / T;
    return sizeof(long long) * (size_t)(samples > 0 ? samples : 1);
}

/* Order of shards for the current epoch. */
static void dataloader_order_shards(DataLoader* d) {
    for (int i = 0; i < d->num_shards; i++) d->shard_order[i] = i;
    if (d->shuffle) {
        Rng rng;
        rng_init(&rng, d->seed * 1000003ull + (uint64_t)d->epoch);
        shuffle_ints(d->shard_order, d->num_shards, &rng);
    }
}

/* Load the shard at shard_pos into memory (validating every token) and set
 * its sample order. */
static int dataloader_load_shard(DataLoader* d) {
    int file = d->shard_order[d->shard_pos];
    /* the sample order depends on the epoch: a shard loaded in an earlier
     * epoch (one shard, or the last of one epoch is the first of the next)
     * must be reshuffled, or epochs repeat and a resume sees other batches */
    if (file == d->loaded_shard && (!d->shuffle || d->epoch == d->loaded_epoch)) return 0;
    const char* path = d->files.gl_pathv[file];
    long long n = d->shard_tokens[file];
    FILE* f = file_open_read(path, "data shard");
    if (!f) return -1;
    ledger_free(d->tokens);
    d->tokens = (uint16_t*)ledger_malloc(MEM_DATA, (size_t)n * 2);
    if (fseek(f, HEADER_INTS * 4, SEEK_SET) != 0 || read_exact(f, d->tokens, (size_t)n * 2, path) != 0) {
        fclose(f);
        d->loaded_shard = -1;
        return -1;
    }
    fclose(f);
    for (long long i = 0; i < n; i++) {
        if (d->tokens[i] >= d->vocab_size) {
            FILE_ERROR(path, "token %u at position %lld is out of range for a vocabulary of %d: "
                       "the shard was made with a different tokenizer than the model's",
                       d->tokens[i], i, d->vocab_size);
            d->loaded_shard = -1;
            return -1;
        }
    }
    d->loaded_shard = file;
    d->loaded_epoch = d->epoch;
    d->num_tokens = n;
    d->num_samples = (n - 1) / d->T;
    ledger_free(d->sample_order);
    d->sample_order = (long long*)ledger_malloc(MEM_DATA, dataloader_order_bytes(n, d->T));
    for (long long i = 0; i < d->num_samples; i++) d->sample_order[i] = i;
    if (d->shuffle) {
        Rng rng;
        rng_init(&rng, d->seed * 1000003ull + (uint64_t)d->epoch * 7919ull + (uint64_t)file + 1);
        shuffle_longs(d->sample_order, d->num_samples, &rng);
    }
    return 0;
}

/* Open every file matching `pattern` and check their headers. A shard must
 * hold at least one full global micro-batch (W·B samples). */
static int dataloader_init(DataLoader* d, const char* pattern, int B, int T, int rank, int world,
                           int vocab_size, int shuffle, uint64_t seed) {
    memset(d, 0, sizeof(*d));
    d->B = B; d->T = T; d->rank = rank; d->world = world;
    d->vocab_size = vocab_size; d->shuffle = shuffle; d->seed = seed;
    d->loaded_shard = -1;
    int rc = glob(pattern, 0, NULL, &d->files);
    if (rc == GLOB_NOMATCH && access(pattern, F_OK) == 0) { /* a file named corpus[1].bin: itself, not a glob */
        char literal[8300];
        glob_pattern(literal, sizeof(literal), pattern, "");
        rc = glob(literal, 0, NULL, &d->files);
    }
    if (rc != 0 || d->files.gl_pathc == 0) {
        if (rc == 0) globfree(&d->files);
        FILE_ERROR(pattern, "no data files match this pattern (quote it so the shell does not expand it)");
        return -1;
    }
    CHECK(d->files.gl_pathc < (1u << 30), "too many shards");
    d->num_shards = (int)d->files.gl_pathc;
    d->shard_tokens = (long long*)ledger_malloc(MEM_DATA, sizeof(long long) * (size_t)d->num_shards);
    long long need = (long long)world * B * T + 1;
    for (int i = 0; i < d->num_shards; i++) {
        if (shard_header(d->files.gl_pathv[i], &d->shard_tokens[i]) != 0) { dataloader_free(d); return -1; }
        if (d->shard_tokens[i] < need) {
            FILE_ERROR(d->files.gl_pathv[i], "has %lld tokens, fewer than one batch needs "
                       "(world %d x B %d x T %d + 1 = %lld): use a smaller --batch-size/--seq-len or more data",
                       d->shard_tokens[i], world, B, T, need);
            dataloader_free(d);
            return -1;
        }
    }
    d->shard_order = (int*)ledger_malloc(MEM_DATA, sizeof(int) * (size_t)d->num_shards);
    d->inputs = (int*)ledger_malloc(MEM_DATA, sizeof(int) * (size_t)B * T);
    d->targets = (int*)ledger_malloc(MEM_DATA, sizeof(int) * (size_t)B * T);
    dataloader_order_shards(d);
    if (dataloader_load_shard(d) != 0) {
        dataloader_free(d);
        return -1;
    }
    return 0;
}

/* Go back to the first batch of epoch 0 (used for validation). */
static int dataloader_reset(DataLoader* d) {
    d->epoch = 0;
    d->shard_pos = 0;
    d->cursor = 0;
    dataloader_order_shards(d);
    return dataloader_load_shard(d);
}

/* Put the loader where a saved run left it (a state checkpoint's epoch,
 * shard position and cursor). 0, or -1 if the position cannot exist. */
static int dataloader_seek(DataLoader* d, int epoch, int shard_pos, long long cursor) {
    if (epoch < 0 || shard_pos < 0 || shard_pos >= d->num_shards || cursor < 0) return -1;
    d->epoch = epoch;
    d->shard_pos = shard_pos;
    d->cursor = cursor;
    dataloader_order_shards(d);
    if (dataloader_load_shard(d) != 0) return -1;
    return cursor <= d->num_samples ? 0 : -1;
}

/* Fill inputs/targets (B, T) with this rank's next micro-batch. */
static int dataloader_next(DataLoader* d) {
    long long per_step = (long long)d->world * d->B;
    if (d->cursor + per_step > d->num_samples) {
        d->cursor = 0;
        d->shard_pos++;
        if (d->shard_pos == d->num_shards) {
            d->shard_pos = 0;
            d->epoch++;
            dataloader_order_shards(d);
        }
        if (dataloader_load_shard(d) != 0) return -1;
    }
    int T = d->T;
    for (int b = 0; b < d->B; b++) {
        long long sample = d->sample_order[d->cursor + (long long)d->rank * d->B + b];
        const uint16_t* src = d->tokens + sample * T;
        for (int t = 0; t < T; t++) {
            d->inputs[b * T + t] = src[t];
            d->targets[b * T + t] = src[t + 1];
        }
    }
    d->cursor += per_step;
    return 0;
}

/* Entropy (nats) of the unigram distribution of the loaded shard's tokens:
 * the loss of the best model that ignores context, a baseline to beat. */
static double dataloader_unigram_entropy(const DataLoader* d) {
    double* count = (double*)xmalloc(sizeof(double) * (size_t)d->vocab_size);
    memset(count, 0, sizeof(double) * (size_t)d->vocab_size);
    for (long long i = 0; i < d->num_tokens; i++) count[d->tokens[i]] += 1.0;
    double h = 0.0, n = (double)d->num_tokens;
    for (int v = 0; v < d->vocab_size; v++)
        if (count[v] > 0) h -= count[v] / n * log(count[v] / n);
    free(count);
    return h;
}

/* Micro-batches in one pass over all shards (for a default of one epoch). */
static long long dataloader_batches_per_epoch(const DataLoader* d) {
    long long n = 0, per_step = (long long)d->world * d->B;
    for (int i = 0; i < d->num_shards; i++) n += ((d->shard_tokens[i] - 1) / d->T) / per_step;
    return n;
}

/* ------------------------------------------------------------------------ */
/* 6. Data parallel                                                         */
/* ------------------------------------------------------------------------ */
/* One process per socket (or per machine), launched by mpirun or srun; the
 * build links MPI when USE_MPI is defined (make train_gpt_mpi). Each rank
 * reads its own slice of the global batch (the data loader's rank/world),
 * runs forward and backward on it, and then:
 *   --zero 0  plain data parallel: the gradients are summed over the ranks
 *             (allreduce) and every rank runs the same AdamW on all weights;
 *   --zero 1  ZeRO-1 (Rajbhandari et al. 2020, sec. 5.1): rank r owns the
 *             r-th of W equal slices of the flat parameter buffer (padded
 *             with zeros up to W x shard), holds AdamW moments for that shard
 *             only (8 bytes per parameter / W instead of 8), receives the
 *             summed gradient of its shard, updates its shard of the weights,
 *             and all-gathers the weights;
 *   --zero 2  ZeRO-2 (sec. 5.2): as ZeRO-1, and the gradients are not kept
 *             whole either: backward writes each layer's gradients into one
 *             of two one-layer buckets, which are summed to their owners
 *             while backward goes on (every micro-batch); the owner adds its
 *             part into its shard. Only the embedding and final-LayerNorm
 *             gradients stay whole (backward writes wte's at both its ends).
 *   --zero 3  ZeRO-3 (sec. 5.3): as ZeRO-2, and each rank keeps only its
 *             shard of the weights; each layer's are gathered before its
 *             forward and its backward (gptc/zero3.h, with the levels of
 *             the machine, bytes per level and hierarchical reduction).
 * With --overlap 1 (the default; ZeRO-2 always) each layer's gradients are
 * sent as soon as backward has finished that layer (non-blocking: an
 * allreduce per tensor slice, or under ZeRO a reduce of each slice to the
 * ranks that own it), hidden behind the layers still to go. The global
 * gradient norm for clipping comes from the shards (one summed double).
 * Communication: every parameter is reduced once and gathered once per
 * step, 2P floats (Psi in the paper's words: 2 Psi for all three), of which
 * a ring or tree sends (W - 1) / W per rank; ZeRO-2 reduces the layers once
 * per micro-batch. The counts are kept (reduced, gathered) and checked by
 * scripts/tests/test_dp.sh. The loss is scaled by 1/W before the sum, so the
 * result is the mean gradient of the global batch, equal to one process's
 * up to the order of the sums (fp32 round-off). --zero also runs on one
 * process (the same arithmetic, bitwise equal to plain: tested). */

#ifdef USE_MPI
#include <mpi.h>
#endif

typedef struct {
    int rank, world;
    int zero;            /* 0: plain data parallel, 1: ZeRO-1, 2: ZeRO-2, 3: ZeRO-3 */
    int overlap;         /* reduce each layer's gradients as backward finishes them */
    size_t shard;        /* parameters per rank: ceil(P / W) */
    size_t lo, hi;       /* the moments this rank holds: [lo, hi) of the real parameters (all under plain) */
    size_t save_lo, save_hi; /* the slice of weights and moments it snapshots and saves (its shard in every mode) */
    size_t offsets[NUM_PARAMETER_TENSORS]; /* each tensor's place in the flat buffer */
    size_t layer_floats; /* one layer's parameters: its 12 slices */
    size_t head_floats;  /* wte, wpe, lnfw, lnfb */
    float* grad_shard;   /* (shard) ZeRO: the summed gradient of this rank's shard */
    float* buckets[2];   /* ZeRO-2: (layer_floats) each; backward fills one while the other's sums are in flight */
    size_t grad_floats;  /* gradient floats this rank holds (printed, and checked by scripts/tests/test_dp.sh) */
    size_t param_floats, grad_alloc, moment_floats; /* the weights', the gradient buffer's and each moment's floats */
    double reduced;      /* floats this rank handed to reductions in the last step */
    double gathered;     /* floats it received from all-gathers (an allreduce counts in both) */
    double comm_ms;      /* time spent in gradient/weight collectives, summed over steps */
    double exposed_ms;   /* of which after backward, not hidden behind it */
    GPT2* model;         /* whose layer gradients the backward hooks reduce */
    double t_start, t_comm; /* unix_ms() at process start and when the communicator was ready */
    struct Levels* lv;   /* nodes, bytes per level, hierarchical reduction, ZeRO-3's gathers (gptc/zero3.h) */
#ifdef USE_MPI
    MPI_Request* requests; /* collectives in flight */
    float** owned;         /* per request: ZeRO-2, this rank's summed part to add into grad_shard (or NULL) */
    size_t* owned_at;      /* per request: where in grad_shard */
    int* owned_count;
    int* group;            /* per request: bucket 0 or 1, or 2 for the rest */
    int num_requests, cap_requests;
#endif
} Dist;

/* Sum a double over the ranks (losses, squared norms). */
static double dist_sum(const Dist* d, double x) {
#ifdef USE_MPI
    if (d->world > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
#else
    (void)d;
#endif
    return x;
}

#include "gptc/zero3.h" /* defines: Levels, levels_init, levels_allreduce, levels_reduce_to, zero3_setup, ... */
#include "gptc/zeropp.h" /* defines: zeropp_init (--qwz, --qgz, --hpz: ZeRO++ on --zero 3), zeropp_sizes */

/* Start MPI (when built with it) and learn rank and world size. */
static void dist_init(Dist* d, int* argc, char*** argv) {
    memset(d, 0, sizeof(*d));
    d->t_start = unix_ms();
    d->world = 1;
#ifdef USE_MPI
    int provided = 0;
    StartupMark mark = startup_begin();
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
    startup_end(SU_COMM, mark);
#else
    (void)argc;
    (void)argv;
#endif
    d->t_comm = unix_ms();
}

/* End MPI. After a failure with several ranks, abort the whole job: the
 * other ranks may be waiting in a collective this rank will never join. */
static void dist_finish(Dist* d, int failed) {
    levels_free(d, failed);
    ledger_free(d->grad_shard);
    ledger_free(d->buckets[0]);
    ledger_free(d->buckets[1]);
    d->grad_shard = d->buckets[0] = d->buckets[1] = NULL;
#ifdef USE_MPI
    free(d->requests);
    free(d->owned);
    free(d->owned_at);
    free(d->owned_count);
    free(d->group);
    d->requests = NULL;
    if (failed && d->world > 1) {
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_CHECK(MPI_Finalize());
#else
    (void)failed;
#endif
}

static uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* Rank `rank`'s slice [lo, hi) of the P parameters: the r-th of W equal
 * slices (the last one shorter, or empty). Under ZeRO its shard; in every
 * mode the part of the weights and moments it snapshots and saves. */
static void dist_slice(const Dist* d, size_t P, int rank, size_t* lo, size_t* hi) {
    size_t W = (size_t)d->world, shard = (P + W - 1) / W;
    *lo = (size_t)rank * shard < P ? (size_t)rank * shard : P;
    *hi = *lo + shard < P ? *lo + shard : P;
}

/* Every rank holds its slice of `full` (P floats): give every rank all of
 * it (MPI_Allgatherv, in place). */
static void dist_allgather_slices(const Dist* d, float* full, size_t P) {
#ifdef USE_MPI
    if (d->world == 1) return;
    int* counts = (int*)xmalloc(sizeof(int) * 2 * (size_t)d->world);
    for (int q = 0; q < d->world; q++) {
        size_t lo, hi;
        dist_slice(d, P, q, &lo, &hi);
        counts[q] = (int)(hi - lo);
        counts[d->world + q] = (int)lo;
    }
    MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full, counts, counts + d->world, MPI_FLOAT,
                             MPI_COMM_WORLD));
    free(counts);
#else
    (void)d;
    (void)full;
    (void)P;
#endif
}

/* Where this rank's saved slice [save_lo, save_hi) begins in its moments
 * arrays: at 0 under ZeRO (they hold the shard only), at save_lo under
 * plain data parallel (they hold everything). */
static size_t dist_moments_at(const Dist* d) { return d->zero ? 0 : d->save_lo; }

/* After each rank loaded only its slice of a state: the weights, and under
 * plain data parallel (every rank holds them all) the moments, gathered. */
static void dist_allgather_state(const Dist* d, GPT2* model) {
    if (d->zero != 3) dist_allgather_slices(d, model->params_memory, model->num_parameters); /* ZeRO-3: a slice */
    if (!d->zero) {
        dist_allgather_slices(d, model->m_memory, model->num_parameters);
        dist_allgather_slices(d, model->v_memory, model->num_parameters);
    }
}

/* Shard geometry from the config alone (dist_setup_model and the memory
 * plan, gptc/plan.h): tensor offsets in the flat buffer, one layer's and the
 * head's floats, the shard, this rank's moments [lo, hi) and saved slice
 * [save_lo, save_hi), and the floats of each buffer the mode keeps: params P,
 * padded to W x shard under ZeRO (the pad stays zero, so the all-gather is
 * one call); grads P, ZeRO-1 the padded buffer, ZeRO-2 the head's only
 * (backward writes wte's at both its ends: final only at the very end);
 * moments P each, a shard each under ZeRO; ZeRO: grad_shard, this rank's
 * summed gradient; ZeRO-2: two one-layer buckets. */
static void dist_geometry(Dist* d, const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS], P = parameter_count(c), W = (size_t)d->world, L = (size_t)c->num_layers;
    parameter_sizes(sizes, c);
    size_t at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        d->offsets[k] = at;
        at += sizes[k];
    }
    d->layer_floats = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) d->layer_floats += sizes[k] / L;
    d->head_floats = P - L * d->layer_floats;
    d->shard = (P + W - 1) / W;
    d->lo = d->zero ? (size_t)d->rank * d->shard : 0;
    d->hi = d->zero ? (d->lo + d->shard < P ? d->lo + d->shard : P) : P;
    if (d->lo > P) d->lo = P;
    dist_slice(d, P, d->rank, &d->save_lo, &d->save_hi);
    d->param_floats = d->zero == 3 ? d->shard : d->zero ? d->shard * W : P;
    d->grad_alloc = d->zero >= 2 ? d->head_floats : d->param_floats;
    d->moment_floats = d->zero ? d->shard : P;
    d->grad_floats = d->zero == 0 ? P : d->zero == 1 ? d->param_floats + d->shard
                                                     : d->head_floats + 2 * d->layer_floats + d->shard;
}

/* Geometry and, under ZeRO, the sharded buffers (plain data parallel keeps
 * gpt2_alloc_training's, so call this first). */
static void dist_setup_model(Dist* d, GPT2* model) {
    size_t P = model->num_parameters, W = (size_t)d->world;
    CHECK(d->world == 1 || P + W <= (size_t)INT32_MAX,
          "MPI counts are int: %zu parameters are too many for one collective (chunking is not implemented)", P);
    dist_geometry(d, &model->config);
    d->model = model;
    if (!d->zero) return;
    size_t from = d->zero == 3 ? d->lo : 0, n = d->zero == 3 ? d->hi - d->lo : P; /* ZeRO-3: the shard only */
    float* params = ledger_floats(MEM_PARAMETERS, d->param_floats); /* zero: the padding stays so */
    memcpy(params, model->params_memory + from, n * sizeof(float));
    ledger_free(model->params_memory);
    model->params_memory = params;
    if (d->zero == 3) zero3_setup(d, model); /* the weights point into the gathered buffers */
    else parameters_point(&model->params, params, &model->config);
    ledger_free(model->grads_memory);
    model->grads_memory = ledger_floats(MEM_GRADIENTS, d->grad_alloc);
    if (d->zero == 1) {
        parameters_point(&model->grads, model->grads_memory, &model->config);
    } else {
        /* the head's gradients, in one buffer: [wte | wpe | lnfw | lnfb] */
        size_t C = (size_t)model->config.channels;
        memset(&model->grads, 0, sizeof(model->grads)); /* the layers' gradients live in the buckets */
        model->grads.wte = model->grads_memory;
        model->grads.wpe = model->grads.wte + model->param_sizes[0];
        model->grads.lnfw = model->grads.wpe + model->param_sizes[1];
        model->grads.lnfb = model->grads.lnfw + C;
        for (int b = 0; b < 2; b++) d->buckets[b] = ledger_floats(MEM_ZERO, d->layer_floats);
    }
    model->num_grads = d->zero == 1 ? P : d->head_floats;
    /* AdamW moments for the shard only */
    ledger_free(model->m_memory);
    ledger_free(model->v_memory);
    model->m_memory = ledger_floats(MEM_ADAMW, d->moment_floats);
    model->v_memory = ledger_floats(MEM_ADAMW, d->moment_floats);
    d->grad_shard = ledger_floats(MEM_ZERO, d->shard);
}

/* Wait until every rank gets here. */
static void dist_barrier(const Dist* d) {
#ifdef USE_MPI
    if (d->world > 1) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
#else
    (void)d;
#endif
}

/* Sum n doubles over the ranks, in place (the eval's per-example scores). */
static void dist_sum_doubles(const Dist* d, double* x, size_t n) {
#ifdef USE_MPI
    ALWAYS(n <= (size_t)INT32_MAX);
    if (d->world > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
#else
    (void)d;
    (void)x;
    (void)n;
#endif
}

/* ZeRO-2: this rank's part of a sum, now complete, goes into its shard. */
static void dist_add_to_shard(Dist* d, const float* part, size_t shard_at, size_t n) {
    float* RESTRICT dst = d->grad_shard + shard_at;
    for (size_t i = 0; i < n; i++) dst[i] += part[i];
}

#ifdef USE_MPI
/* A slot for one more collective in flight, of `group`: its index. */
static int dist_request(Dist* d, int group) {
    if (d->num_requests == d->cap_requests) {
        int cap = d->cap_requests ? 2 * d->cap_requests : 256;
        d->requests = (MPI_Request*)realloc(d->requests, sizeof(MPI_Request) * (size_t)cap);
        d->owned = (float**)realloc(d->owned, sizeof(float*) * (size_t)cap);
        d->owned_at = (size_t*)realloc(d->owned_at, sizeof(size_t) * (size_t)cap);
        d->owned_count = (int*)realloc(d->owned_count, sizeof(int) * (size_t)cap);
        d->group = (int*)realloc(d->group, sizeof(int) * (size_t)cap);
        CHECK(d->requests && d->owned && d->owned_at && d->owned_count && d->group,
              "out of memory for %d requests in flight", cap);
        d->cap_requests = cap;
    }
    int i = d->num_requests++;
    d->owned[i] = NULL;
    d->group[i] = group;
    return i;
}
#endif

/* ZeRO: start summing the gradients of the flat range [at, at + n), whose
 * local values are in src, over the ranks; each part of the range goes to
 * the rank whose shard holds it (MPI_Ireduce with that rank as root; the
 * root's sum lands in place, in its part of src). A tree or ring reduction
 * has each rank send about (W - 1) / W of what it hands in, as a
 * reduce-scatter does. Under ZeRO-2 the owner adds its part into grad_shard
 * when the request completes (dist_wait); `group` says which bucket src is. */
static void dist_reduce_to_owners(Dist* d, float* src, size_t at, size_t n, int group) {
    d->reduced += (double)n;
    if (d->lv && d->lv->hooks.reduce) { /* qgZ (gptc/zeropp.h): blocking, this rank's sum added into grad_shard */
        d->lv->hooks.reduce(d->lv->hooks.ctx, src, at, n);
        return;
    }
    if (!d->lv || !d->lv->hierarchical) levels_count(d, at, n, d->shard, 1, 0);
    for (size_t a = at, end = at + n; a < end;) {
        int owner = (int)(a / d->shard);
        size_t b = (size_t)(owner + 1) * d->shard < end ? (size_t)(owner + 1) * d->shard : end;
        float* part = src + (a - at);
        int mine = owner == d->rank;
#ifdef USE_MPI
        if (d->world > 1 && d->lv->hierarchical) levels_reduce_to(d, part, b - a, owner); /* blocking */
        else if (d->world > 1) {
            int i = dist_request(d, group);
            MPI_CHECK(MPI_Ireduce(mine ? MPI_IN_PLACE : part, mine ? part : NULL, (int)(b - a), MPI_FLOAT, MPI_SUM,
                                  owner, MPI_COMM_WORLD, &d->requests[i]));
            d->owned[i] = mine && d->zero >= 2 ? part : NULL;
            d->owned_at[i] = a - d->lo;
            d->owned_count[i] = (int)(b - a);
            a = b;
            continue;
        }
#endif
        (void)group;
        if (mine && d->zero >= 2) dist_add_to_shard(d, part, a - d->lo, b - a); /* one rank: the sum is its own */
        a = b;
    }
}

/* Wait for the collectives in flight of `group` (-1: all), finishing each
 * (ZeRO-2: the owner's part into grad_shard). */
static void dist_wait(Dist* d, int group) {
#ifdef USE_MPI
    int kept = 0;
    for (int i = 0; i < d->num_requests; i++) {
        if (group >= 0 && d->group[i] != group) {
            d->requests[kept] = d->requests[i];
            d->owned[kept] = d->owned[i];
            d->owned_at[kept] = d->owned_at[i];
            d->owned_count[kept] = d->owned_count[i];
            d->group[kept++] = d->group[i];
            continue;
        }
        MPI_CHECK(MPI_Wait(&d->requests[i], MPI_STATUS_IGNORE));
        if (d->owned[i]) dist_add_to_shard(d, d->owned[i], d->owned_at[i], (size_t)d->owned_count[i]);
    }
    d->num_requests = kept;
#else
    (void)d;
    (void)group;
#endif
}

/* Let MPI progress what is in flight (Open MPI moves non-blocking
 * collectives only inside MPI calls). */
static void dist_progress(Dist* d) {
#ifdef USE_MPI
    int done = 0;
    if (d->num_requests) MPI_CHECK(MPI_Testall(d->num_requests, d->requests, &done, MPI_STATUSES_IGNORE));
    if (done) { /* all complete (and freed by MPI_Testall): finish them */
        for (int i = 0; i < d->num_requests; i++)
            if (d->owned[i]) dist_add_to_shard(d, d->owned[i], d->owned_at[i], (size_t)d->owned_count[i]);
        d->num_requests = 0;
    }
#else
    (void)d;
#endif
}

/* The backward hook: layer l's gradients are final (for this micro-batch),
 * so start summing them: plain, one non-blocking allreduce per tensor slice;
 * ZeRO-1, each slice to its owners; ZeRO-2, the bucket backward just filled,
 * to its owners. */
static void dist_layer_grads(void* ctx, int layer) {
    Dist* d = (Dist*)ctx;
    GPT2* model = d->model;
    size_t L = (size_t)model->config.num_layers, at = 0;
    double t0 = time_ms();
    /* ZeRO-1: finish the sums of layer l + 2 first (Open MPI moves
     * non-blocking reductions along only inside MPI calls; waiting here, two
     * layers behind, makes them run while backward goes on, as ZeRO-2's
     * bucket turns do) */
    if (d->zero == 1) dist_wait(d, layer % 2);
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = model->param_sizes[k] / L, flat = d->offsets[k] + (size_t)layer * per_layer;
        if (d->zero >= 2) {
            dist_reduce_to_owners(d, d->buckets[layer % 2] + at, flat, per_layer, layer % 2);
        } else if (d->zero == 1) {
            dist_reduce_to_owners(d, model->grads_memory + flat, flat, per_layer, layer % 2);
        } else {
            d->reduced += (double)per_layer;
            d->gathered += (double)per_layer;
            levels_count(d, 0, per_layer, (per_layer + d->world - 1) / d->world, 1, 1);
#ifdef USE_MPI
            int i = dist_request(d, 2);
            float** g = (float**)&model->grads;
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, g[k] + (size_t)layer * per_layer, (int)per_layer, MPI_FLOAT,
                                     MPI_SUM, MPI_COMM_WORLD, &d->requests[i]));
#endif
        }
        at += per_layer;
    }
    dist_progress(d);
    d->comm_ms += time_ms() - t0;
}

/* ZeRO-2's other hook: before backward writes layer l, hand it a bucket
 * whose previous sums (layer l + 2, or the last micro-batch's) are done. */
static float* dist_layer_bucket(void* ctx, int layer) {
    Dist* d = (Dist*)ctx;
    double t0 = time_ms();
    dist_wait(d, layer % 2);
    d->comm_ms += time_ms() - t0;
    memset(d->buckets[layer % 2], 0, d->layer_floats * sizeof(float));
    return d->buckets[layer % 2];
}

/* Before each micro-batch's backward: arm the hooks. ZeRO-2 reduces every
 * micro-batch's layer gradients (its buckets cannot hold a sum over
 * micro-batches); plain and ZeRO-1 only the last one's, when the
 * accumulated gradients are final. */
static void dist_backward_begin(Dist* d, GPT2* model, int micro, int last_micro_batch) {
    (void)micro; /* (the step's counts and grad_shard were zeroed by dist_step_begin) */
    int on = d->zero >= 2 || (d->world > 1 && d->overlap && last_micro_batch && (d->zero || !d->lv->hierarchical));
    model->on_layer_grads = on ? dist_layer_grads : NULL;
    model->layer_grad_bucket = d->zero >= 2 ? dist_layer_bucket : NULL;
    model->on_layer_grads_ctx = d;
    d->model = model;
}

/* After backward: finish the sums, clip by the global norm, AdamW, and
 * (ZeRO) gather the updated weights. Returns the norm before clipping; the
 * update is skipped (on every rank alike) when it or the loss is not
 * finite, or the loss is a spike (gptc/state.h). */
static double dist_step(Dist* d, GPT2* model, const AdamWConfig* opt, double max_norm, float lr, int t, double loss,
                        int spike, int* finite) {
    double norm, t0 = time_ms();
    size_t P = model->num_parameters, C = (size_t)model->config.channels;
    size_t embed = model->param_sizes[0] + model->param_sizes[1]; /* wte, wpe: [0, embed) */
    if (!d->zero) {
        size_t rest = d->world > 1 && d->overlap && !d->lv->hierarchical ? embed : P; /* the layers' are in flight */
        levels_allreduce(d, model->grads_memory, rest);
        if (rest < P) levels_allreduce(d, model->grads.lnfw, 2 * C);
        dist_wait(d, -1);
        d->exposed_ms += time_ms() - t0;
        d->comm_ms += time_ms() - t0;
        norm = gradients_clip(model, max_norm);
        *finite = isfinite(loss) && isfinite(norm);
        if (*finite && !spike) adamw_update(model, opt, lr, t);
        return norm;
    }
    /* ZeRO: the sums of this rank's shard into grad_shard */
    if (d->zero >= 2 || (d->world > 1 && d->overlap)) {
        dist_reduce_to_owners(d, model->grads.wte, 0, embed, 2);          /* wte, wpe */
        dist_reduce_to_owners(d, model->grads.lnfw, P - 2 * C, 2 * C, 2); /* lnfw, lnfb */
        dist_wait(d, -1);
        if (d->zero == 1) memcpy(d->grad_shard, model->grads_memory + d->lo, (d->hi - d->lo) * sizeof(float));
    } else if (d->world > 1 && d->lv->hierarchical) { /* ZeRO-1 after backward, by level */
        dist_reduce_to_owners(d, model->grads_memory, 0, d->shard * d->world, 2);
        memcpy(d->grad_shard, model->grads_memory + d->lo, d->shard * sizeof(float));
    } else { /* ZeRO-1 after backward: one reduce-scatter of the padded buffer */
        d->reduced = (double)(d->shard * d->world);
        levels_count(d, 0, d->shard * d->world, d->shard, 1, 0);
#ifdef USE_MPI
        MPI_CHECK(MPI_Reduce_scatter_block(model->grads_memory, d->grad_shard, (int)d->shard, MPI_FLOAT, MPI_SUM,
                                           MPI_COMM_WORLD));
#else
        memcpy(d->grad_shard, model->grads_memory, d->shard * sizeof(float));
#endif
    }
    d->comm_ms += time_ms() - t0;
    d->exposed_ms += time_ms() - t0;
    size_t n = d->hi - d->lo; /* the real parameters of this shard (the pad has zero gradient) */
    norm = sqrt(dist_sum(d, sum_squares(d->grad_shard, n)));
    gradients_clip_to(d->grad_shard, n, norm, max_norm);
    *finite = isfinite(loss) && isfinite(norm);
    if (*finite && !spike)
        adamw_update_slice(model, opt, lr, t, d->lo, d->hi, model->params_memory + (d->zero == 3 ? 0 : d->lo),
                           d->grad_shard, model->m_memory, model->v_memory);
    t0 = time_ms();
    levels_allgather_params(d, model); /* ZeRO-3: none (gathered layer by layer at the next forward) */
    d->comm_ms += time_ms() - t0;
    d->exposed_ms += time_ms() - t0;
    return norm;
}

/* ------------------------------------------------------------------------ */
/* 7. Sampler                                                               */
/* ------------------------------------------------------------------------ */
#include "gptc/sample.h"   /* defines: sample_token (temperature, top-k, top-p), SamplingConfig, Decoder, generate_tokens */

/* Generation with a KV cache: each new token runs the model for one
 * position only, attending to the keys and values of all earlier positions,
 * kept per layer. It calls the same layer functions as training, with N = 1
 * row; only attention is written out here, for a single query. */
#define NUM_KVCACHE_TENSORS 11
typedef struct {
    int len;       /* positions cached so far */
    int max_len;   /* maxT */
    float* memory; /* the one buffer the tensors below are carved from */
    float* k;      /* (L, maxT, C) keys of every position so far */
    float* v;      /* (L, maxT, C) values */
    float* x;      /* (C) the residual stream of the current position */
    float* ln;     /* (C) */
    float* stats;  /* (2) LayerNorm mean and rstd (unused here) */
    float* qkv;    /* (3C) */
    float* y;      /* (C) attention output */
    float* h;      /* (4C) MLP hidden */
    float* h2;     /* (4C) MLP hidden after GELU */
    float* scores; /* (maxT) one head's attention weights */
    float* logits; /* (Vp) */
} KVCache;

static_assert(offsetof(KVCache, logits) - offsetof(KVCache, k) == (NUM_KVCACHE_TENSORS - 1) * sizeof(float*),
              "KVCache's tensors must match its size table");

static void kvcache_sizes(size_t s[NUM_KVCACHE_TENSORS], const GPT2Config* c) {
    size_t C = c->channels, L = c->num_layers, maxT = c->max_seq_len;
    s[0] = s[1] = L * maxT * C;  /* k, v */
    s[2] = s[3] = s[6] = C;      /* x, ln, y */
    s[4] = 2;                    /* stats */
    s[5] = 3 * C;                /* qkv */
    s[7] = s[8] = 4 * C;         /* h, h2 */
    s[9] = maxT;                 /* scores */
    s[10] = (size_t)c->padded_vocab_size; /* logits */
}

static void kvcache_init(KVCache* kv, const GPT2Config* c) {
    size_t sizes[NUM_KVCACHE_TENSORS];
    memset(kv, 0, sizeof(*kv));
    kv->max_len = c->max_seq_len;
    kvcache_sizes(sizes, c);
    kv->memory = tensors_alloc(MEM_SAMPLER, &kv->k, sizes, NUM_KVCACHE_TENSORS, NULL);
}

static void kvcache_free(KVCache* kv) {
    ledger_free(kv->memory);
    memset(kv, 0, sizeof(*kv));
}

/* Run `token` at position kv->len and return the logits (Vp) for the next
 * token. The cache must have room (len < maxT). */
static const float* gpt2_forward_cached(const GPT2* model, KVCache* kv, int token) {
    const GPT2Config* cfg = &model->config;
    int C = cfg->channels, L = cfg->num_layers, NH = cfg->num_heads, hs = C / NH, pos = kv->len;
    ALWAYS(pos < kv->max_len && token >= 0 && token < cfg->vocab_size);
    ParameterTensors p = model->params;
    float scale = 1.0f / sqrtf((float)hs);
    for (int c = 0; c < C; c++) kv->x[c] = p.wte[(size_t)token * C + c] + p.wpe[(size_t)pos * C + c];
    for (int l = 0; l < L; l++) {
        float* kl = kv->k + (size_t)l * kv->max_len * C; /* (maxT, C) */
        float* vl = kv->v + (size_t)l * kv->max_len * C;
        layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, p.ln1w + l * C, p.ln1b + l * C, 1, C);
        matmul_forward(kv->qkv, kv->ln, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, 1, C, 3 * C);
        memcpy(kl + (size_t)pos * C, kv->qkv + C, C * sizeof(float));
        memcpy(vl + (size_t)pos * C, kv->qkv + 2 * C, C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            /* scores = softmax(q . k[t2] / sqrt(hs)) over t2 <= pos; y = sum scores v[t2] */
            const float* q = kv->qkv + h * hs;
            float maxv = -FLT_MAX, sum = 0.0f;
            for (int t2 = 0; t2 <= pos; t2++) {
                const float* k = kl + (size_t)t2 * C + h * hs;
                float d = 0.0f;
                for (int i = 0; i < hs; i++) d += q[i] * k[i];
                kv->scores[t2] = d * scale;
                maxv = kv->scores[t2] > maxv ? kv->scores[t2] : maxv;
            }
            for (int t2 = 0; t2 <= pos; t2++) {
                kv->scores[t2] = exp_fast(kv->scores[t2] - maxv);
                sum += kv->scores[t2];
            }
            float* y = kv->y + h * hs;
            for (int i = 0; i < hs; i++) y[i] = 0.0f;
            for (int t2 = 0; t2 <= pos; t2++) {
                const float* v = vl + (size_t)t2 * C + h * hs;
                float w = kv->scores[t2] / sum;
                for (int i = 0; i < hs; i++) y[i] += w * v[i];
            }
        }
        /* x += attproj(y); x += fcproj(gelu(fc(ln2(x)))) */
        matmul_forward(kv->ln, kv->y, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, 1, C, C);
        residual_forward(kv->x, kv->x, kv->ln, C);
        layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, p.ln2w + l * C, p.ln2b + l * C, 1, C);
        matmul_forward(kv->h, kv->ln, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, 1, C, 4 * C);
        gelu_forward(kv->h2, kv->h, 4 * (size_t)C);
        matmul_forward(kv->ln, kv->h2, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, 1, 4 * C, C);
        residual_forward(kv->x, kv->x, kv->ln, C);
    }
    layernorm_forward(kv->ln, kv->stats, kv->stats + 1, kv->x, p.lnfw, p.lnfb, 1, C);
    matmul_forward(kv->logits, kv->ln, p.wte, NULL, 1, C, cfg->padded_vocab_size);
    kv->len++;
    return kv->logits;
}

/* The CPU model as generate_tokens' Decoder: each step one position through
 * gpt2_forward_cached, the cache kept here. */
typedef struct {
    Decoder d;
    const GPT2* model;
    KVCache kv;
} CpuDecoder;

static void cpu_decoder_reset(void* self) { ((CpuDecoder*)self)->kv.len = 0; }
static const float* cpu_decoder_step(void* self, int token) {
    CpuDecoder* c = (CpuDecoder*)self;
    return gpt2_forward_cached(c->model, &c->kv, token);
}
static const Decoder* cpu_decoder_open(CpuDecoder* c, const GPT2* model) {
    c->model = model;
    kvcache_init(&c->kv, &model->config);
    Decoder d = {c, model->config.max_seq_len, model->config.vocab_size, cpu_decoder_reset, cpu_decoder_step};
    c->d = d;
    return &c->d;
}
static void cpu_decoder_close(CpuDecoder* c) { kvcache_free(&c->kv); }

/* generate_tokens on the CPU model (its arguments and result). */
MAYBE_UNUSED static int gpt2_generate(const GPT2* model, const int* prompt, int n, int max_new, const SamplingConfig* s,
                         Rng* rng, int eot, int* out, void (*on_token)(int, void*), void* ctx) {
    CpuDecoder c;
    int made = generate_tokens(cpu_decoder_open(&c, model), prompt, n, max_new, s, rng, eot, out, on_token, ctx);
    cpu_decoder_close(&c);
    return made;
}

/* ------------------------------------------------------------------------ */
/* 8. Training loop and main                                                */
/* ------------------------------------------------------------------------ */
/* The plumbing of a run, one include away: gptc/cli.h, gptc/state.h and
 * gptc/launch.h use the model, the schedules and the ranks defined above;
 * gptc/saver.h, gptc/resume.h and gptc/loop_tail.h, below, the TrainRun too. */
#include "gptc/cli.h"       /* defines: Options, options_parse, usage, options_problem, model_from_options, data_from_text */
#include "gptc/state.h"     /* defines: StateInfo, the state format, LossWatch, Slot, run.id */
#include "gptc/run_lock.h"  /* defines: RunLock, run_lock, run_unlock: one trainer per run directory */
#include "gptc/launch.h"    /* defines: launch_rank_world, Rendezvous, rendezvous_share, dist_check_agreement */

/* Mean loss over up to `batches` micro-batches from the start of the val
 * data (never counting one twice). */
static float evaluate(GPT2* model, DataLoader* val, int batches) {
    if (dataloader_reset(val) != 0) exit(EXIT_FAILURE);
    long long available = dataloader_batches_per_epoch(val);
    if (batches > available) batches = (int)available;
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        if (dataloader_next(val) != 0) exit(EXIT_FAILURE);
        sum += gpt2_forward(model, val->inputs, val->targets, val->B, val->T);
    }
    return (float)(sum / batches);
}

#include "gptc/eval.h"      /* defines: EvalRun, eval_run_init, eval_choices, eval_log, eval_only (--eval-file) */

/* Print a generated token as text (or as an id without a tokenizer). */
static void print_token(int id, void* ctx) {
    const Tokenizer* tok = (const Tokenizer*)ctx;
    if (tok->vocab_size) tokenizer_print(tok, id);
    else printf("%d ", id);
    fflush(stdout);
}

/* A sample from nothing: generation after a single end-of-text token, by
 * any Decoder (the CPU model's, or the GPU's in train_gpt.cu). */
static void sample_print(const Decoder* d, const Tokenizer* tok, const Options* o, Rng* rng) {
    int eot = tok->vocab_size ? (int)tok->eot_token : d->V - 1;
    int* out = (int*)ledger_malloc(MEM_SAMPLER, sizeof(int) * (size_t)o->sample_length);
    SamplingConfig s = sampling_from_options(o);
    printf("sample: ");
    generate_tokens(d, &eot, 1, o->sample_length, &s, rng, eot, out, print_token, (void*)tok);
    printf("\n");
    ledger_free(out);
}

/* --prompt: encode the prompt, generate with the KV cache, print. */
static int generate_from_prompt(const Decoder* d, const Tokenizer* tok, const Options* o) {
    size_t len = strlen(o->prompt);
    int* ids = (int*)xmalloc(sizeof(int) * (len + 1));
    int n = (int)tokenizer_encode(tok, NULL, (const unsigned char*)o->prompt, len, ids, len);
    if (n == 0) ids[n++] = (int)tok->eot_token;
    if (n >= d->max_len) {
        fprintf(stderr, "error: the prompt is %d tokens, the model's context is %d\n", n, d->max_len);
        free(ids);
        return -1;
    }
    int* out = (int*)xmalloc(sizeof(int) * (size_t)o->sample_length);
    SamplingConfig s = sampling_from_options(o);
    Rng rng;
    rng_init(&rng, (uint64_t)o->seed + 1);
    printf("%s", o->prompt);
    fflush(stdout);
    double t0 = time_ms();
    int made = generate_tokens(d, ids, n, o->sample_length, &s, &rng, (int)tok->eot_token, out, print_token, (void*)tok);
    double ms = time_ms() - t0;
    printf("\n[%d prompt tokens, %d generated in %.0f ms: %.1f tokens/s]\n", n, made, ms, made / (ms / 1000.0));
    free(out);
    free(ids);
    return 0;
}

/* The CPU model's sample at a boundary, and its --prompt (a PromptFn, below). */
static void cpu_sample_print(const GPT2* model, const Tokenizer* tok, const Options* o, Rng* rng) {
    CpuDecoder c;
    sample_print(cpu_decoder_open(&c, model), tok, o, rng);
    cpu_decoder_close(&c);
}
static int prompt_cpu(const GPT2* model, const Tokenizer* tok, const Options* o, void* ctx) {
    (void)ctx;
    CpuDecoder c;
    int rc = generate_from_prompt(cpu_decoder_open(&c, model), tok, o);
    cpu_decoder_close(&c);
    return rc;
}

#include "gptc/run.h"       /* defines: TrainRun, train_run_init, train_run_free, train_run_log_step, the *_due checks */
#include "gptc/test_hooks.h" /* defines: test_hook_nan, test_hook_spike, test_hooks_print, ... (-DGPTC_TEST_HOOKS only) */
#include "gptc/saver.h"     /* defines: Saver, saver_init, saver_snapshot, saver_poll, train_run_bad_step (rollback) */
#include "gptc/resume.h"    /* defines: state_resume, train_run_resume: which copy a run continues from */
#include "gptc/loop_tail.h" /* defines: heartbeat_write, timing_print, train_run_after_step, train_run_boundary, ... */
#include "gptc/standby.h"   /* defines: standby_take_over (--standby: the hot spare) */
#include "gptc/calib.h"     /* defines: Calibration, calibration_get, calibration_print: the rates, measured and cached */
#include "gptc/runtime.h"   /* defines: StepTime, runtime_step, runtime_traffic, young_daly_steps: the step-time model */
#include "gptc/plan.h"      /* defines: cpu_memory_plan, plan_after_setup, plan_check, plan_runtime (--plan, --auto), train_memory_print */

/* Before the first step: the ranks agree, the training memory, the Saver,
 * and the state to resume from (or the random init put off until now); a
 * standby waits between the last two. Returns the step to start from, -1
 * after a message, or STANDBY_DISMISSED. */
#define STANDBY_DISMISSED (-2)
static int train_setup(TrainRun* r, Saver* saver, GPT2* model, const Options* o, Dist* dist) {
    if (dist_check_agreement(dist, model, o, &r->train) != 0) return -1;
    dist_setup_model(dist, model); /* first: under ZeRO it makes the sharded gradients and moments */
    gpt2_alloc_training(model, r->B, r->T);
    train_memory_print(model, dist);
    test_hooks_print(1);
    timing_print(dist, "communicator ready", dist->t_comm);
    StartupMark mark = startup_begin();
    if (saver_init(saver, dist, model, o) != 0) return -1;
    startup_end(SU_SLOTS, mark);
    plan_after_setup(dist); /* the allocation ledger, complete now (printed with --verbose 1) */
    if (o->standby[0]) { /* a hot spare: set up, it waits here (gptc/standby.h) */
        int go = standby_take_over(r, o, dist);
        if (go <= 0) return go == 0 ? STANDBY_DISMISSED : -1;
    }
    timing_print(dist, "model ready", unix_ms()); /* built, its memory and the snapshot slots mapped */
    mark = startup_begin();
    int start = train_run_resume(r, saver, dist, model, o);
    if (start < 0) return -1;
    startup_end(SU_LOAD, mark);
    mark = startup_begin();
    if (start == 0 && model->init_deferred) dist_fill_random(dist, model, model->init_seed); /* no state: the init after all */
    model->init_deferred = 0;
    startup_end(SU_MODEL, mark);
    timing_print(dist, "state loaded", unix_ms());
    startup_loaded();
    heartbeat_write(o, r->rank, start);
    return start;
}

/* Is this step's loss a spike (--spike-z)? Also where the test hooks plant
 * their faults: a NaN gradient, a loss raised for the spike rule. */
static int train_spike(TrainRun* r, GPT2* model, const Options* o, int step, double loss, double* z) {
    if (test_hook_nan(r, step + 1) && r->rank == 0) model->grads_memory[0] = NAN;
    return losswatch_spike(&r->watch, loss + test_hook_spike(r, step + 1), o->spike_z, z);
}

/* After the last step: what the run cost, and the final state and model.
 * 0, or -1 when they could not be written. */
static int train_finish(TrainRun* r, Saver* saver, GPT2* model, const Options* o, Dist* dist) {
    train_comm_print(model, dist, r->steps);
    levels_print(dist);
    train_run_report(r, saver);
    if (!o->output_dir[0]) return 0;
    saver_snapshot(saver, r, dist, model, o, r->steps, 1); /* the final state and model */
    return train_run_final_save(saver, dist, o);
}

/* The steps of a run, from the set-up to the final save (train() below
 * owns the TrainRun and the Saver). 0, or -1 after a message. */
static int train_steps(TrainRun* r, Saver* saver, GPT2* model, const Options* o, const Tokenizer* tok, Dist* dist,
                       int* remove_memory) {
    int start = train_setup(r, saver, model, o, dist);
    if (start == STANDBY_DISMISSED) return 0; /* a spare not needed: nothing was written, the memory stays */
    if (start < 0) return -1;
    for (int step = start; step <= r->steps; step++) {
        /* at the boundary before step `step`: validation and a sample */
        if (train_run_val_due(r, o, step) && (step > start || start == 0))
            train_run_log_val(r, step, (float)(dist_sum(dist, evaluate(model, &r->val, o->val_batches)) / r->world));
        if (train_run_eval_due(r, o, step) && (step > start || start == 0) &&
            eval_log(&r->eval, model, o, dist, r->log, step) != 0)
            return -1;
        if (train_run_sample_due(r, o, step)) {
            float* whole = zero3_sample_begin(dist, model); /* ZeRO-3: the weights on rank 0 meanwhile */
            if (r->rank == 0) cpu_sample_print(model, tok, o, &r->sample_rng);
            zero3_sample_end(dist, model, whole);
        }
        if (step == r->steps) break;
        /* the step: gradients of grad_accum micro-batches, summed over the ranks; then AdamW */
        double t0 = time_ms();
        dist_step_begin(dist, model); /* zero the gradients (and the step's traffic counts) */
        StepOutcome s = {0.0, 0, 0, 0.0};
        for (int micro = 0; micro < r->grad_accum; micro++) {
            if (dataloader_next(&r->train) != 0) return -1;
            s.loss += gpt2_forward(model, r->train.inputs, r->train.targets, r->B, r->T) / r->grad_accum;
            dist_backward_begin(dist, model, micro, micro == r->grad_accum - 1);
            gpt2_backward(model, 1.0f / ((float)r->grad_accum * r->world));
        }
        s.loss = dist_sum(dist, s.loss) / r->world;
        s.spike = train_spike(r, model, o, step, s.loss, &s.z);
        float lr = (float)lr_at(&r->sched, step);
        saver_before_update(saver); /* the last snapshot's copy must be done before the weights change */
        double norm = dist_step(dist, model, &r->opt, o->grad_clip, lr, step + 1, s.loss, s.spike, &s.finite);
        levels_step_end(dist, step + 1); /* bytes per level (gptc/zero3.h) */
        train_run_log_step(r, step, s.loss, lr, norm, time_ms() - t0, s.finite, "");
        /* after the step: a rollback, a snapshot or save, --stop-at (gptc/loop_tail.h) */
        int back = train_run_after_step(r, saver, dist, model, o, step, start, &s, 1);
        if (back >= 0) {
            step = back - 1; /* the loop's step++ continues after the snapshot's step */
            continue;
        }
        Boundary b = train_run_boundary(r, o, step + 1);
        if (b.snapshot) saver_snapshot(saver, r, dist, model, o, b.done, b.save);
        else saver_poll(saver, dist, o, 0);
        if (b.stop) {
            train_run_stop(saver, dist, o, b.done);
            *remove_memory = 0; /* the memory stays for the next job on this host */
            return 0;
        }
    }
    int rc = train_finish(r, saver, model, o, dist);
    *remove_memory = rc == 0; /* the run is over: its memory snapshots go (kept if the last write failed) */
    return rc;
}

/* The training loop, with validation, samples, logging, snapshots and
 * checkpoints, on one process or as one rank of several (section 6). Every
 * way out of train_steps comes back here to free what it made. */
static int train(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                 const char* val_pattern, Dist* dist) {
    TrainRun r;
    Saver saver;
    if (train_run_init(&r, &model->config, o, train_pattern, val_pattern, dist->rank, dist->world) != 0) return -1;
    memset(&saver, 0, sizeof(saver)); /* (saver_free of a zeroed Saver frees nothing) */
    int remove_memory = 0;
    int rc = train_steps(&r, &saver, model, o, tok, dist, &remove_memory);
    if (rc == 0 && o->plan_check) { /* the ledger == the memory plan, once the snapshot slots' pages are all in */
        saver_prepare_finish(&saver); /* (the fast start faults them in behind the first steps) */
        rc = plan_check(&r, o, dist, model);
    }
    if (rc != 0) saver_abandon(&saver); /* an error, said where it happened: no collectives from here */
    saver_free(&saver, rc == 0 && remove_memory);
    train_run_free(&r);
    return rc;
}

/* A training loop: train() here, gpu_train() in the CUDA twin; and --prompt: prompt_cpu, gpu_prompt. */
typedef int (*TrainFn)(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                       const char* val_pattern, void* ctx);
typedef int (*PromptFn)(const GPT2* model, const Tokenizer* tok, const Options* o, void* ctx);

static int train_cpu(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                     const char* val_pattern, void* ctx) {
    return train(model, o, tok, train_pattern, val_pattern, (Dist*)ctx);
}

/* Everything after the flags, shared with train_gpt.cu: build the model,
 * load the tokenizer, then generate from --prompt with `prompt_fn`, or
 * tokenize --data and train with `train_fn` (both get ctx). With several ranks (dist, or NULL), rank 0
 * tokenizes --data while the others wait, then they reuse its cache.
 * Returns 0 or -1. */
static int gptc_run(const Options* o, TrainFn train_fn, PromptFn prompt_fn, void* ctx, const Dist* dist) {
    GPT2 model;
    StartupMark mark = startup_begin();
    if (model_from_options(&model, o) != 0) return -1;
    startup_end(SU_MODEL, mark);
    const GPT2Config* c = &model.config;
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d Vp=%d, %zu parameters (%s)\n", c->num_layers, c->channels,
           c->num_heads, c->max_seq_len, c->vocab_size, c->padded_vocab_size, model.num_parameters,
           depth_from_name(o->model) ? "random init" : o->model);
    int rc = 0;
    if (o->convert[0]) { /* --convert: the model in another format, and stop */
        if (!dist || dist->rank == 0) rc = model_convert(o->convert, c, model.params_memory);
        gpt2_free(&model);
        return rc;
    }
    if (o->steps == 0 && o->eval_file[0] && !o->prompt[0]) { /* --eval-file alone: score --model and stop */
        rc = eval_only(&model, o, dist);
        gpt2_free(&model);
        return rc;
    }
    if (o->steps == 0 && !o->prompt[0]) { /* the untrained model, to compare inits or hand to llm.c/PyTorch */
        if (!dist || dist->rank == 0) {
            char path[4400];
            snprintf(path, sizeof(path), "%s/model_%08d.bin", o->output_dir, 0);
            if (mkdir_p(o->output_dir) != 0) {
                FILE_ERROR(o->output_dir, "cannot create output directory: %s", strerror(errno));
                rc = -1;
            } else if ((rc = gpt2_save(&model, path)) == 0) {
                printf("--steps 0: wrote the initial model (seed %d, no training) to %s\n", o->seed, path);
            }
        }
        gpt2_free(&model);
        return rc;
    }
    Tokenizer tok;
    if (!o->prompt[0] && o->seq_len > c->max_seq_len) {
        fprintf(stderr, "error: --seq-len %d exceeds the model's max_seq_len %d\n", o->seq_len, c->max_seq_len);
        rc = -1;
    } else if ((mark = startup_begin(), tokenizer_setup(&tok, o, c->vocab_size)) != 0) {
        rc = -1;
    } else {
        startup_end(SU_DATA, mark);
        if (o->prompt[0]) {
            rc = prompt_fn(&model, &tok, o, ctx);
        } else {
            char train_pattern[8600], val_pattern[8600];
            snprintf(train_pattern, sizeof(train_pattern), "%s", o->train_data);
            snprintf(val_pattern, sizeof(val_pattern), "%s", o->val_data);
            if (o->data[0]) {
                if (dist && dist->rank != 0) dist_barrier(dist);
                rc = data_from_text(o, &tok, train_pattern, val_pattern, sizeof(train_pattern));
                if (dist && dist->rank == 0) dist_barrier(dist);
            }
            if (rc == 0) rc = train_fn(&model, o, &tok, train_pattern, val_pattern, ctx);
        }
        tokenizer_free(&tok);
    }
    gpt2_free(&model);
    return rc;
}

#ifndef GPTC_NO_MAIN /* the tests, train_gpt.cu and dev/ include this file for its functions: no main */
int main(int argc, char** argv) {
    Dist dist;
    dist_init(&dist, &argc, &argv);
    /* ranks other than 0 train silently: their errors still go to stderr */
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) fprintf(stderr, "warning: rank %d prints\n", dist.rank);
    Options o;
    int rc = options_parse(&o, argc, argv);
    const char* problem = rc == 0 ? options_problem(&o) : NULL;
    if (rc == 0 && !problem) problem = options_cpu_problem(&o); /* a flag of train_gpt_cu */
    if (rc != 0 || problem) {
        if (rc != 0) usage(rc == 1 ? stdout : stderr, argv[0]);
        if (problem) fprintf(stderr, "error: %s\n", problem);
        dist_finish(&dist, rc != 1);
        return rc == 1 ? 0 : EXIT_FAILURE;
    }
    dist.zero = o.zero;
    dist.overlap = o.overlap;
    rc = levels_init(&dist, o.topology, o.hierarchical, o.comm_levels); /* nodes, bytes per level (gptc/zero3.h) */
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
    printf("threads: %d (OpenMP)%s\n", num_threads(), dist.world > 1 ? " per rank" : "");
#else
    printf("threads: 1 (built without OpenMP: see the Makefile)\n");
#endif
    if (rc == 0 && (o.plan || o.auto_plan || o.snapshot_auto)) rc = plan_runtime(&o, &dist); /* calibrated; may set B, ZeRO, ZeRO++ */
    if (rc == 0) rc = zeropp_init(&dist, o.qwz, o.qgz, o.qgz_feedback, o.hpz, o.quant_block); /* gptc/zeropp.h */
    if (rc == 0 && !o.plan) rc = gptc_run(&o, train_cpu, prompt_cpu, &dist, &dist);
    dist_finish(&dist, rc != 0);
    return rc == 0 ? 0 : EXIT_FAILURE;
}
#endif /* !GPTC_NO_MAIN */
