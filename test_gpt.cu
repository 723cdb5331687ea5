/*
 * test_gpt.cu — checks train_gpt.cu against the CPU trainer (in this same
 * binary) and against the PyTorch reference fixture.
 *
 * STATUS: 197 passed on one H200 on 2026-11-30 (dev/cuda/RESULTS.md, with
 * the errors it measured: activations and gradients 2e-3 to 9e-3 of the
 * largest reference value, 4-6x inside the tolerances below); runs on the
 * CPU in every make test too (make test_gpt_cu_cpu: dev/cuda/cpu).
 *
 *   make test_gpt_cu                                (the Makefile's CUDA section: flags, NCCL)
 *   ./test_gpt_cu                                   # tiny fixture in dev/fixtures
 *   ./test_gpt_cu --host-only                       # only what runs without a GPU (make check-cuda)
 *   ./test_gpt_cu --ref MODEL REF                   # another reference (scripts/gpt2_reference.py)
 *   ./test_gpt_cu --binary ./train_gpt_cu           # also the trainer's bad-input errors and training states
 *   ./test_gpt_cu --binary ./train_gpt_cu --cpu-binary ./train_gpt   # and a GPU state resumed on the CPU
 *
 * What is checked:
 *   - the checker itself (a planted wrong value must be rejected);
 *   - host-only pieces (they run without a GPU; --host-only runs only these,
 *     make check-cuda does): the encoder's token buckets, the MFU formatting
 *     (n/a for an unknown GPU, never negative), cuBLASLt's decisions on the
 *     tiny fixture's shapes (bias alignment, cache key, fused or not), the
 *     start-up memory check (headroom);
 *   - layer by layer, every activation of the GPU forward against the CPU's
 *     (so one run names every mismatching layer), logits and loss against
 *     PyTorch, with the GELU in the cuBLASLt epilogue and in our kernels,
 *     and with every epilogue unfused (a plain GEMM, our bias and GELU);
 *   - every parameter gradient against the CPU and PyTorch; gradients bitwise
 *     identical on a second run (no order-dependent atomics), which creates
 *     no cuBLASLt descriptors (G3 caches them with the algorithm);
 *   - 10 AdamW steps (clipping, weight decay, warmup + cosine): losses, norms
 *     and the final weights against PyTorch;
 *   - steps of 2 micro-batches launched as gpu_train launches them, the
 *     update gated on the device, and captured in CUDA graphs and replayed:
 *     the same bits as host-decided launches; a replayed NaN step skipped;
 *   - the encoder backward's chunks (a frequent token summed by several
 *     blocks): against train_gpt.c's encoder_backward, the bounds that size
 *     them reached, and captured on uniform tokens then replayed on
 *     frequent ones: the same bits as plain launches;
 *   - stochastic rounding is unbiased;
 *   - cuBLASLt's cache when full (the last slot's descriptors remade);
 *   - flash attention (G2) forward and backward against train_gpt.c's
 *     attention at T 1, 7, 64, 129 and head sizes 32, 64, 128 (and 9), the
 *     log-sum-exp against float64 (tolerances TOL_ATTN_*);
 *   - with --binary: training states (save, stop, resume from disk and from
 *     memory: the final weights bit for bit the uninterrupted run's; a
 *     snapshot every step changes nothing; with --cpu-binary the CPU
 *     trainer continues a GPU state; a --zero 1 state resumes bit for bit
 *     under --zero 1 and continues under --zero 0).
 * Exit status non-zero on any failure; the last line is "N passed, N failed".
 * Without a GPU the GPU checks are skipped, said so, and the exit status is 77.
 */
#define GPTC_NO_MAIN
#include "train_gpt.cu"

/* ---- tolerances (bf16 activations; relative to the largest |reference|) -- */
#define TOL_ACTIVATION 3e-2 /* each stored activation vs the CPU's fp32 */
#define TOL_LOGITS 2e-2     /* issue: ~1e-2 relative */
#define TOL_LOSS 1e-2       /* relative */
#define TOL_GRAD 5e-2       /* per tensor, vs CPU and PyTorch */
#define TOL_STEP_LOSS 1e-2  /* the 10 AdamW losses */
#define TOL_STEP_NORM 5e-2  /* their gradient norms */
#define TOL_FINAL 1e-1      /* ||w - w_ref|| / ||w_ref - w_init|| per tensor */
/* flash attention against train_gpt.c's attention, on the same bf16-rounded
 * inputs (relative to the largest |reference|, as above). bf16 keeps 8
 * significant bits (a rounding error up to 2^-9 = 2.0e-3 relative), and the
 * kernels round P and dS to bf16 before their products, so: */
#define TOL_ATTN_OUT 1e-2   /* out (bf16): about 2.5 bf16 steps of the largest value */
#define TOL_ATTN_LSE 1e-5   /* log-sum-exp (fp32 throughout: 1e-7 on the CPU; room for the tensor cores' fp32) */
#define TOL_ATTN_GRAD 2e-2  /* dq, dk, dv (bf16, from bf16 P and dS) */

#include "test_common.h" /* check, tensor_close, the PyTorch reference reader */

/* ---- host-only checks --------------------------------------------------- */

static void test_the_tester(void) {
    float want[4] = {1.0f, -2.0f, 3.0f, 4.0f}, wrong[4] = {1.0f, -2.0f, 3.5f, 4.0f};
    float nan_[4] = {1.0f, NAN, 3.0f, 4.0f};
    char d[256];
    check(!tensor_close(wrong, want, 4, TOL_GRAD, d, sizeof(d)), "checker rejects a planted wrong value", d);
    check(!tensor_close(nan_, want, 4, TOL_GRAD, d, sizeof(d)), "checker rejects a NaN", d);
    check(tensor_close(want, want, 4, 0.0, d, sizeof(d)), "checker accepts an exact match", d);
}

static void test_buckets(void) {
    int inp[10] = {5, 2, 5, 0, 2, 5, 7, 0, 9, 2}, V = 10;
    int count[10], tok[10], start[11], pos[10];
    int nb = encoder_buckets_build(inp, 10, V, count, tok, start, pos);
    int ok = nb == 5;
    int want_tok[5] = {0, 2, 5, 7, 9}, want_start[6] = {0, 2, 5, 8, 9, 10};
    int want_pos[10] = {3, 7, 1, 4, 9, 0, 2, 5, 6, 8};
    for (int i = 0; ok && i < 5; i++) ok = tok[i] == want_tok[i];
    for (int i = 0; ok && i < 6; i++) ok = start[i] == want_start[i];
    for (int i = 0; ok && i < 10; i++) ok = pos[i] == want_pos[i];
    check(ok, "encoder buckets: tokens ascending, positions ascending within a token", "");
}

/* The encoder's chunks where they are most: three tokens of ENC_CHUNK + 1
 * positions each (interleaved), so three tokens of two chunks, and six
 * partial rows, the bounds of 3 (ENC_CHUNK + 1) positions; and the bounds
 * of GPT-2 at B = 64, T = 1024 (the figures in train_gpt.cu). */
static void test_encoder_chunks_host(void) {
    enum { K1 = ENC_CHUNK + 1, N = 3 * K1, V = 50 };
    int inp[N], count[V], tok[N], start[N + 1], pos[N];
    for (int i = 0; i < N; i++) inp[i] = 10 * (i % 3) + 7;
    int nb = encoder_buckets_build(inp, N, V, count, tok, start, pos);
    size_t n[NUM_STEP_INPUTS], bytes[NUM_STEP_INPUTS];
    gpu_step_input_sizes(n, bytes, 1, N, V);
    EncoderChunks e;
    int** ep = (int**)&e;
    for (int i = 0; i < NUM_ENCODER_CHUNKS; i++) ep[i] = (int*)xmalloc(n[2 + i] * sizeof(int));
    memcpy(e.bucket_pos, pos, sizeof(pos));
    encoder_chunks_build(e, tok, start, nb, N, V);
    int ok = nb == 3 && e.num_chunks[0] == 6 && e.num_long[0] == 3 && e.num_long[0] == encoder_max_long(N) &&
             e.long_slot[3] == encoder_max_partials(N) && e.chunk_start[6] == N;
    for (int k = 0; ok && k < 6; k++) /* token b's chunks 2b (64 positions) and 2b + 1 (1), partial rows in order */
        ok = e.chunk_token[k] == 10 * (k / 2) + 7 && e.chunk_start[k] == K1 * (k / 2) + (k % 2) * ENC_CHUNK &&
             e.chunk_slot[k] == k && e.long_slot[k / 2] == 2 * (k / 2) && e.long_token[k / 2] == 10 * (k / 2) + 7;
    char d[200];
    snprintf(d, sizeof(d), "%d chunks, %d tokens of several (bound %d), %d partial rows (bound %d)", e.num_chunks[0],
             e.num_long[0], encoder_max_long(N), e.long_slot[e.num_long[0]], encoder_max_partials(N));
    check(ok, "encoder chunks: 3 tokens of ENC_CHUNK + 1 positions reach the bounds on tokens of several chunks and "
          "partial rows", d);
    for (int i = 0; i < NUM_ENCODER_CHUNKS; i++) free(ep[i]);
    int BT = 64 * 1024;
    snprintf(d, sizeof(d), "chunks <= %d, tokens of several <= %d, partial rows <= %d", encoder_max_chunks(BT, 50257),
             encoder_max_long(BT), encoder_max_partials(BT));
    check(ENC_CHUNK == 64 && encoder_max_chunks(BT, 50257) == 1024 + 50257 && encoder_max_long(BT) == 1008 &&
          encoder_max_partials(BT) == 2016, "encoder chunks: the bounds at B*T = 65536, V = 50257", d);
}

static void test_mfu_format(void) {
    char s[64];
    mfu_format(s, sizeof(s), 1e6, 1e9, 0.0);
    check(!strcmp(s, " | MFU n/a"), "MFU of an unknown GPU is n/a", s);
    mfu_format(s, sizeof(s), -5.0, 1e9, 989.0);
    check(!strcmp(s, " | MFU n/a"), "MFU of a non-positive rate is n/a, never negative", s);
    mfu_format(s, sizeof(s), 494.5e3, 1e9, 989.0);
    check(!strcmp(s, " | MFU 50.0%"), "MFU = tokens/s x FLOPs/token / peak", s);
    check(gpu_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0 && gpu_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0 &&
              gpu_peak_tflops("NVIDIA H200") == 989.0 && gpu_peak_tflops("Tesla T4") == 0.0,
          "peak table: H100, H200, A100 known; others unknown", "");
}

/* G3's decisions on the tiny fixture's shapes (C = 36, B = 3, T = 9), with
 * the pointers cudaMalloc would give (256-byte aligned) and the parameters
 * carved from them as gpu_model_init carves them: some bias slices are only
 * 8-byte aligned, and none may reach a fused epilogue so. */
static void test_lt_decisions(const char* model_path) {
    GPT2 m;
    if (gpt2_load(&m, model_path) != 0) { check(0, "load model", model_path); return; }
    const GPT2Config* c = &m.config;
    int C = c->channels, L = c->num_layers, BT = 3 * 9;
    floatX* base = (floatX*)(uintptr_t)0x7f0000000000ull;  /* the bf16 parameters */
    floatX* copy = (floatX*)(uintptr_t)0x7f1000000000ull;  /* LtContext's bias copy */
    floatX* acts = (floatX*)(uintptr_t)0x7f2000000000ull;  /* an activation (A, D) */
    ParameterTensorsX p;
    parameters_point_x(&p, base, c);
    int under = 0, placed_ok = 1, slices = 0;
    for (int l = 0; l < L; l++) {
        const floatX* biases[4] = {p.qkvb + l * 3 * C, p.attprojb + l * C, p.fcb + l * 4 * C, p.fcprojb + l * C};
        for (int i = 0; i < 4; i++, slices++) {
            int al = ptr_alignment(biases[i]);
            under += al < LT_EPILOGUE_ALIGN;
            const floatX* placed = lt_bias_placed(biases[i], copy);
            placed_ok &= ptr_alignment(placed) >= LT_EPILOGUE_ALIGN && (placed == biases[i]) == (al >= LT_EPILOGUE_ALIGN);
        }
    }
    char d[320];
    snprintf(d, sizeof(d), "C=%d: layer 0's qkvb %d-byte aligned; %d of %d bias slices under %d bytes", C,
             ptr_alignment(p.qkvb), under, slices, LT_EPILOGUE_ALIGN);
    check(ptr_alignment(p.qkvb) == 8 && under > 0, "lt: the tiny fixture has under-aligned bias slices", d);
    check(placed_ok, "lt: every bias slice reaches cuBLASLt 16-byte aligned (the under-aligned through the copy)", d);

    /* the qkv GEMM of layer 0 (BIAS epilogue), with its bias as it is and as placed */
    LtKey k8 = lt_key_make(acts, CUDA_R_16BF, NULL, p.qkvw, 1, acts, 0, 3 * C, BT, C, C, C, 3 * C, 0.0f, p.qkvb,
                           CUBLASLT_EPILOGUE_BIAS, NULL, 1, 0, 0, 0);
    LtKey k256 = lt_key_make(acts, CUDA_R_16BF, NULL, p.qkvw, 1, acts, 0, 3 * C, BT, C, C, C, 3 * C, 0.0f,
                             lt_bias_placed(p.qkvb, copy), CUBLASLT_EPILOGUE_BIAS, NULL, 1, 0, 0, 0);
    snprintf(d, sizeof(d), "bias alignment in the keys: %d and %d", k8.align_bias, k256.align_bias);
    check(memcmp(&k8, &k256, sizeof(LtKey)) != 0 && k8.align_bias == 8 && k256.align_bias == 256,
          "lt: the algorithm cache key holds the bias's alignment", d);
    check(lt_route(&k8, CUBLAS_STATUS_SUCCESS, 1) == LT_UNFUSED,
          "lt: an 8-byte-aligned bias is never fused, whatever the heuristic found", "");
    check(lt_route(&k256, CUBLAS_STATUS_SUCCESS, 1) == LT_FUSED, "lt: an aligned bias with an algorithm: fused", "");
    check(lt_route(&k256, CUBLAS_STATUS_NOT_SUPPORTED, 0) == LT_UNFUSED,
          "lt: heuristic NOT_SUPPORTED for BIAS: unfused (our bias kernel), not an exit", "");
    check(lt_route(&k256, CUBLAS_STATUS_SUCCESS, 0) == LT_UNFUSED, "lt: no algorithm found for BIAS: unfused", "");

    /* layer 0's fc GEMM with GELU_AUX_BIAS (aux = fch, ld 4C), and DGELU */
    LtKey kg = lt_key_make(acts, CUDA_R_16BF, NULL, p.fcw, 1, acts, 0, 4 * C, BT, C, C, C, 4 * C, 0.0f,
                           lt_bias_placed(p.fcb, copy), CUBLASLT_EPILOGUE_GELU_AUX_BIAS, acts, 1, 0, 0, 0);
    check(lt_route(&kg, CUBLAS_STATUS_NOT_SUPPORTED, 0) == LT_UNFUSED && lt_route(&kg, CUBLAS_STATUS_SUCCESS, 1) == LT_FUSED,
          "lt: GELU_AUX_BIAS without an algorithm: unfused; with one: fused", "");
    LtKey kd = lt_key_make(acts, CUDA_R_16BF, NULL, p.fcprojw, 0, acts, 0, 4 * C, BT, C, 4 * C, C, 4 * C, 0.0f, NULL,
                           CUBLASLT_EPILOGUE_DGELU, acts + 4, 1, 0, 0, 0);
    check(kd.align_aux == 8 && lt_route(&kd, CUBLAS_STATUS_SUCCESS, 1) == LT_UNFUSED,
          "lt: an 8-byte-aligned GELU aux matrix is never fused", "");
    LtKey kp = lt_key_make(acts, CUDA_R_16BF, NULL, p.qkvw, 1, acts, 0, 3 * C, BT, C, C, C, 3 * C, 0.0f, NULL,
                           CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    check(lt_route(&kp, CUBLAS_STATUS_NOT_SUPPORTED, 0) == LT_NONE && lt_route(&kp, CUBLAS_STATUS_SUCCESS, 1) == LT_FUSED,
          "lt: a plain GEMM without an algorithm stops the run (naming the shape); with one it runs", "");
    lt_key_describe(&k8, d, sizeof(d));
    check(strstr(d, "m=108 n=27 k=36") && strstr(d, "epilogue BIAS") && strstr(d, "bias 8 "),
          "lt: the no-algorithm message names the shape, the epilogue and the alignments", d);
    gpt2_free(&m);
}

/* The start-up memory check (G4's memory_check): the plan must leave the
 * headroom free, or the run would pass the check and run out mid-step. */
static void test_memory_check(void) {
    size_t MB = (size_t)1 << 20, GB = (size_t)1 << 30, room = memory_allowance(1) + 200 * MB;
    char msg[512], d[640];
    int fits = memory_check(80 * GB - 512 * MB, 80 * GB, room, msg, sizeof(msg));
    check(!fits, "memory: a plan 512 MB short of free memory is refused (headroom 840 MB)", msg);
    snprintf(d, sizeof(d), "%s", msg);
    check(strstr(msg, "headroom of 840 MB") != NULL, "memory: the refusal names the headroom", d);
    fits = memory_check(70 * GB, 80 * GB, room, msg, sizeof(msg));
    check(fits && strstr(msg, "headroom 840 MB"), "memory: a plan with the headroom to spare fits, saying so", msg);
    check(memory_check(80 * GB - room, 80 * GB, room, msg, sizeof(msg)) &&
              !memory_check(80 * GB - room + 1, 80 * GB, room, msg, sizeof(msg)),
          "memory: plan + headroom = free fits; one byte more does not", "");
    check(!memory_check(81 * GB, 80 * GB, 0, msg, sizeof(msg)), "memory: a plan beyond free memory is refused (no wrap)",
          msg);
    snprintf(d, sizeof(d), "allowance %zu MB alone, %zu MB with a communicator", memory_allowance(0) / MB,
             memory_allowance(1) / MB);
    check(memory_allowance(0) >= 256 * MB && memory_allowance(1) > memory_allowance(0),
          "memory: an allowance for lazily loaded kernels, more with NCCL", d);
}

/* The memory plan of GPT-2 124M at B = 16, T = 1024: attention keeps the
 * log-sum-exp, L B NH T fp32 (9 MB), where the materialised variant kept
 * L B NH T^2 bf16 probabilities (4.5 GB), and the scratch is less than that
 * variant's fp32 scores alone (B NH T^2, 768 MB). */
static void test_memory_plan_attention(void) {
    GPT2Config c = {1024, 50257, 50304, 12, 12, 768};
    int B = 16, T = 1024;
    MemoryPlan p = gpu_memory_plan(&c, B, T, 0);
    size_t lse = (size_t)12 * B * 12 * T * 4, probs = (size_t)12 * B * 12 * T * T * 2;
    size_t scores = (size_t)B * 12 * T * T * 4;
    char d[240];
    snprintf(d, sizeof(d), "attention %.1f MB, activations %.0f MB (the T x T probabilities were %.0f MB more), "
             "scratch %.0f MB", p.attention / 1048576.0, p.bytes[GMEM_ACTS] / 1048576.0, (probs - lse) / 1048576.0,
             p.bytes[GMEM_SCRATCH] / 1048576.0);
    check(p.attention == lse && p.bytes[GMEM_SCRATCH] < scores, "memory plan: attention keeps B NH T statistics per layer, "
          "nothing T x T", d);
}

/* The memory plan of each --recompute level for GPT-2 124M at B = 16,
 * T = 1024: the activations kept strictly decrease from level 0 to 3, and
 * what a level saves is more than the one layer's working set it adds to
 * the scratch. Level 3 keeps about one residual stream (B T C bf16) per
 * layer, plus the non-layer tensors (encoded, lnf, the logits). */
static void test_memory_plan_recompute(void) {
    GPT2Config c = {1024, 50257, 50304, 12, 12, 768};
    int B = 16, T = 1024;
    MemoryPlan p[RECOMPUTE_LEVELS];
    char d[400];
    int at = 0;
    for (int r = 0; r < RECOMPUTE_LEVELS; r++) {
        p[r] = gpu_memory_plan(&c, B, T, r);
        at += snprintf(d + at, sizeof(d) - (size_t)at, "%slevel %d: activations %.0f MB + working set %.0f MB",
                       r ? "; " : "", r, p[r].bytes[GMEM_ACTS] / 1048576.0, p[r].work / 1048576.0);
    }
    int falls = 1, pays = 1, same = 1;
    for (int r = 1; r < RECOMPUTE_LEVELS; r++) {
        falls &= p[r].bytes[GMEM_ACTS] < p[r - 1].bytes[GMEM_ACTS];
        pays &= p[r].bytes[GMEM_ACTS] + p[r].bytes[GMEM_SCRATCH] < p[0].bytes[GMEM_ACTS] + p[0].bytes[GMEM_SCRATCH];
    }
    for (int r = 0; r < RECOMPUTE_LEVELS; r++) same &= p[0].activations_at[r] == p[r].bytes[GMEM_ACTS];
    check(falls && same, "memory plan: activations strictly decrease from --recompute 0 to 3 (GPT-2 124M, B=16 T=1024)",
          d);
    check(pays, "memory plan: each level's activations + scratch below level 0's", "");
    size_t stream = (size_t)12 * B * T * 768 * 2, rest = p[3].bytes[GMEM_ACTS] - stream;
    snprintf(d, sizeof(d), "level 3: residual stream %.0f MB + encoded, lnf, logits, losses %.0f MB",
             stream / 1048576.0, rest / 1048576.0);
    check(p[3].bytes[GMEM_ACTS] >= stream && rest < (size_t)B * T * (2 * 768 * 2 + 50304 * 2 + 4 * 4) + 8 * 256,
          "memory plan: level 3 keeps one residual stream per layer", d);
}

/* The memory plan's model state against DESIGN.md's bytes per parameter
 * (GPT-2 124M, P = 124,475,904): one GPU 18 P (bf16 weights, fp32 master,
 * gradients, m, v); --offload 1 moves the master and the moments (12 P) to
 * the host and pins 4 P of gradients there, the rest unchanged; ZeRO-1 on 4
 * ranks: the whole bf16 weights 2 P, the gradient buckets 4 P' (P' = W S,
 * P' - P under (L + 1) W 64 elements of pad), and per shard of S: 4 S
 * summed gradient, 4 S master, 8 S moments, 2 S bf16 (+ the shard map). */
static void test_memory_plan_state(void) {
    GPT2Config c = {1024, 50257, 50304, 12, 12, 768};
    size_t P = 124475904;
    GpuPlanKnobs k = {16, 1024, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1};
    MemoryPlan one = gpu_memory_plan_for(&c, &k);
    k.offload = 1;
    MemoryPlan off = gpu_memory_plan_for(&c, &k);
    GpuPlanKnobs z = {16, 1024, 0, 1, 3, 4, 1, 0, 0, 0, 0, 0, 0, 1};
    MemoryPlan zero = gpu_memory_plan_for(&c, &z);
    size_t state1 = one.bytes[GMEM_PARAMS] + one.bytes[GMEM_MASTER] + one.bytes[GMEM_GRADS] + one.bytes[GMEM_ADAMW];
    size_t Pp = zero.bytes[GMEM_GRADS] / 4 * 4 / 5; /* grads = 4 (W S + S), W = 4: 4 W S = 4/5 of it */
    size_t S = Pp / 4;
    char d[300];
    snprintf(d, sizeof(d), "one GPU %zu bytes of state = %.2f P; offload %.0f MB less on the device, %.0f MB more "
             "pinned; ZeRO-1 x4: S = %zu, pad %zu", state1, (double)state1 / (double)P,
             ((double)memory_plan_total(&one) - (double)memory_plan_total(&off)) / 1048576.0,
             ((double)memory_plan_pinned(&off) - (double)memory_plan_pinned(&one)) / 1048576.0, S, Pp - P);
    check(state1 == 18 * P && memory_plan_total(&one) - memory_plan_total(&off) == 12 * P &&
              memory_plan_pinned(&off) - memory_plan_pinned(&one) == 4 * P && off.offloaded == 12 * P &&
              zero.bytes[GMEM_MASTER] == 4 * S && zero.bytes[GMEM_ADAMW] == 8 * S &&
              zero.bytes[GMEM_ZERO] == 2 * S + sizeof(ShardMap) && zero.bytes[GMEM_PARAMS] == 2 * P && Pp >= P &&
              Pp - P < (size_t)13 * 4 * 64 && zero.bytes[GMEM_COMM] == (16 + 3 * 4) * 8,
          "memory plan: model state 18 P on one GPU, --offload 1 moves 12 P to the host, ZeRO-1 shards it", d);
}

/* ---- GPU checks --------------------------------------------------------- */

/* h (n) rounded to bf16 in place; returns the device copy (bf16). */
static floatX* attn_test_upload(float* h, size_t n) {
    floatX* tmp = (floatX*)xmalloc(n * sizeof(floatX));
    for (size_t i = 0; i < n; i++) {
        tmp[i] = __float2bfloat16(h[i]);
        h[i] = __bfloat162float(tmp[i]);
    }
    floatX* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(floatX)));
    CUDA_CHECK(cudaMemcpy(d, tmp, n * sizeof(floatX), cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

static float* attn_test_download(const void* d, size_t n, int is_bf16) {
    float* h = xmalloc_floats(n);
    CUDA_CHECK(cudaDeviceSynchronize());
    if (is_bf16) {
        floatX* tmp = (floatX*)xmalloc(n * sizeof(floatX));
        CUDA_CHECK(cudaMemcpy(tmp, d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++) h[i] = __bfloat162float(tmp[i]);
        free(tmp);
    } else {
        CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return h;
}

/* G3's cache when full: LT_CACHE_SIZE + 2 distinct problems (D(8, n) =
 * A(8, 8) B(8, n) for n = 1 .. LT_CACHE_SIZE + 2, all ones: D = 8), then the
 * one evicted from the last slot again. The last slot is reused: its
 * descriptor and layouts destroyed and made anew (the CPU layer refuses a
 * destroyed descriptor, so a stale one stops the run through CUBLAS_CHECK). */
static void test_lt_cache_full(void) {
    const int m = 8, k = 8, nmax = LT_CACHE_SIZE + 2;
    LtContext lt;
    lt_init(&lt, (size_t)1 << 20, 1);
    float* ones = xmalloc_floats((size_t)k * nmax);
    for (int i = 0; i < k * nmax; i++) ones[i] = 1.0f;
    floatX* A = attn_test_upload(ones, (size_t)m * k);
    floatX* B = attn_test_upload(ones, (size_t)k * nmax);
    float* D;
    CUDA_CHECK(cudaMalloc((void**)&D, (size_t)m * nmax * sizeof(float)));
    for (int n = 1; n <= nmax; n++)
        lt_matmul(&lt, 0, D, CUDA_R_32F, NULL, A, 0, B, 0, m, n, k, m, k, m, 1.0f, 0.0f, NULL,
                  CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0);
    CUDA_CHECK(cudaMemset(D, 0, (size_t)m * nmax * sizeof(float)));
    lt_matmul(&lt, 0, D, CUDA_R_32F, NULL, A, 0, B, 0, m, nmax - 1, k, m, k, m, 1.0f, 0.0f, NULL,
              CUBLASLT_EPILOGUE_DEFAULT, NULL, 1, 0, 0, 0); /* evicted by n = nmax: made again */
    float* h = attn_test_download(D, (size_t)m * nmax, 0);
    int right = 1;
    for (int i = 0; i < m * nmax; i++) right &= h[i] == (i < m * (nmax - 1) ? (float)k : 0.0f);
    char detail[160];
    snprintf(detail, sizeof(detail), "%d slots, %lld calls, %lld descriptors created, result %s", lt.cached, lt.calls,
             lt.created, right ? "right" : "wrong");
    check(lt.cached == LT_CACHE_SIZE && lt.calls == nmax + 1 && lt.created == nmax + 1 && right,
          "lt: a full cache reuses its last slot (descriptors remade), and computes right", detail);
    free(h);
    free(ones);
    CUDA_CHECK(cudaFree(A));
    CUDA_CHECK(cudaFree(B));
    CUDA_CHECK(cudaFree(D));
    lt_free(&lt);
}

/* Flash attention (G2) forward and backward at one shape against
 * train_gpt.c's attention_forward/attention_backward, on the same bf16
 * inputs: q, k in [-2, 2] (scores with a spread of about 1.3, so the softmax
 * is neither flat nor one-hot), v and dout in [-1, 1]. The log-sum-exp
 * against float64 sums over the same scores. Returns nothing; checks. */
static void test_attention_case(int B, int T, int NH, int hs, uint64_t seed) {
    int C = NH * hs;
    size_t BT = (size_t)B * T, nqkv = BT * 3 * C, nout = BT * C, nlse = (size_t)B * NH * T;
    Rng rng;
    rng_init(&rng, seed);
    float* qkv = xmalloc_floats(nqkv);
    float* dout = xmalloc_floats(nout);
    for (size_t i = 0; i < nqkv; i++) /* q and k (the first 2C of each row) in [-2, 2], v in [-1, 1] */
        qkv[i] = (i % (3 * C) < (size_t)2 * C ? 4.0f : 2.0f) * (rng_uniform(&rng) - 0.5f);
    for (size_t i = 0; i < nout; i++) dout[i] = 2.0f * rng_uniform(&rng) - 1.0f;
    floatX* d_qkv = attn_test_upload(qkv, nqkv);
    floatX* d_dout = attn_test_upload(dout, nout);
    floatX *d_out, *d_dqkv;
    float *d_lse, *d_D;
    CUDA_CHECK(cudaMalloc((void**)&d_out, nout * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&d_dqkv, nqkv * sizeof(floatX)));
    CUDA_CHECK(cudaMalloc((void**)&d_lse, nlse * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void**)&d_D, nlse * sizeof(float)));

    /* CPU: fp32, probabilities materialised */
    float* out = xmalloc_floats(nout);
    float* att = xmalloc_floats((size_t)B * NH * T * T);
    float* datt = xmalloc_floats((size_t)B * NH * T * T);
    float* dqkv = xmalloc_floats(nqkv);
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    float* lse = xmalloc_floats(nlse);
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                double mx = -INFINITY, sum = 0.0, s[1024];
                ALWAYS(T <= 1024);
                for (int u = 0; u <= t; u++) {
                    const float* k = qkv + ((size_t)b * T + u) * 3 * C + C + (size_t)h * hs;
                    double dot = 0.0;
                    for (int d = 0; d < hs; d++) dot += (double)q[d] * k[d];
                    s[u] = dot * scale;
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++) sum += exp(s[u] - mx);
                lse[((size_t)b * NH + h) * T + t] = (float)(mx + log(sum));
            }

    attention_forward_gpu(d_out, d_lse, d_qkv, B, T, NH, hs, 0);
    attention_backward_gpu(d_dqkv, d_D, d_dout, d_qkv, d_out, d_lse, B, T, NH, hs, 0);
    float* g_out = attn_test_download(d_out, nout, 1);
    float* g_lse = attn_test_download(d_lse, nlse, 0);
    float* g_dqkv = attn_test_download(d_dqkv, nqkv, 1);
    char what[160];
    snprintf(what, sizeof(what), "flash attention B=%d T=%d NH=%d hs=%d: out vs CPU", B, T, NH, hs);
    check_close(what, g_out, out, nout, TOL_ATTN_OUT);
    snprintf(what, sizeof(what), "flash attention B=%d T=%d NH=%d hs=%d: log-sum-exp vs float64", B, T, NH, hs);
    check_close(what, g_lse, lse, nlse, TOL_ATTN_LSE);
    /* dq, dk, dv separately: the slices of each row of dqkv */
    const char* part[3] = {"dq", "dk", "dv"};
    float* g = xmalloc_floats(nout);
    float* w = xmalloc_floats(nout);
    for (int p = 0; p < 3; p++) {
        for (size_t bt = 0; bt < BT; bt++)
            for (int c = 0; c < C; c++) {
                g[bt * C + c] = g_dqkv[bt * 3 * C + (size_t)p * C + c];
                w[bt * C + c] = dqkv[bt * 3 * C + (size_t)p * C + c];
            }
        snprintf(what, sizeof(what), "flash attention B=%d T=%d NH=%d hs=%d: %s vs CPU", B, T, NH, hs, part[p]);
        check_close(what, g, w, nout, TOL_ATTN_GRAD);
    }
    free(g); free(w);
    free(qkv); free(dout); free(out); free(att); free(datt); free(dqkv); free(lse);
    free(g_out); free(g_lse); free(g_dqkv);
    CUDA_CHECK(cudaFree(d_qkv)); CUDA_CHECK(cudaFree(d_dout)); CUDA_CHECK(cudaFree(d_out));
    CUDA_CHECK(cudaFree(d_dqkv)); CUDA_CHECK(cudaFree(d_lse)); CUDA_CHECK(cudaFree(d_D));
}

/* T in {1, 7, 64, 129} (one key, part of a tile, one whole tile, two tiles
 * and a row past them) and hs in {32, 64, 128}, plus an odd head size (the
 * tiny fixture's kind, zero-padded to 16) over two query tiles. B and NH
 * small, as the CPU execution computes every 64 x 64 tile in full (about
 * 5 s for all of them): several batch rows and heads at T = 1, 7 and 70,
 * several heads at 64. */
static void test_attention(void) {
    static const int Ts[4] = {1, 7, 64, 129}, Bs[4] = {2, 2, 1, 1}, NHs[4] = {2, 1, 2, 1}, hss[3] = {32, 64, 128};
    uint64_t seed = 7;
    for (int ti = 0; ti < 4; ti++)
        for (int hi = 0; hi < 3; hi++) test_attention_case(Bs[ti], Ts[ti], NHs[ti], hss[hi], seed++);
    test_attention_case(2, 70, 2, 9, seed++);
}

/* Copy a device tensor (bf16 or fp32) to a fresh host float array. */
static float* device_to_host(GpuGPT2* g, const void* dev, size_t n, int is_bf16) {
    float* h = xmalloc_floats(n);
    if (is_bf16) gpu_bf16_to_host(g, h, (const floatX*)dev, n);
    else {
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        CUDA_CHECK(cudaMemcpy(h, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return h;
}

/* Every activation of the GPU forward against the CPU's, tensor by tensor. */
static void compare_activations(GpuGPT2* g, const GPT2* cpu, const char* label) {
    size_t n[NUM_GPU_ACTIVATIONS], bytes[NUM_GPU_ACTIVATIONS];
    gpu_activation_sizes(n, bytes, &g->config, g->B, g->T, g->recompute);
    const char* const* names = GPU_ACTIVATION_NAMES;
    void** gp = (void**)&g->acts;
    float* const* cp = (float* const*)&cpu->acts;
    for (int i = 0; i < NUM_GPU_ACTIVATIONS - 1; i++) { /* losses: only with targets, checked as the loss */
        if (i == 6) continue; /* lse: the CPU keeps probabilities instead (test_attention checks the lse) */
        float* h = device_to_host(g, gp[i], n[i], bytes[i] == 2);
        char what[160];
        snprintf(what, sizeof(what), "%s: activation %s vs CPU", label, names[i]);
        check_close(what, h, cp[i], n[i], i == 17 ? TOL_LOGITS : TOL_ACTIVATION);
        free(h);
    }
}

/* Forward, loss and gradients on the reference batch, against the CPU
 * trainer and PyTorch. */
static void test_forward_backward(const char* model_path, const Reference* ref, int gelu_fusion, int no_epilogues) {
    char label[64], what[200];
    snprintf(label, sizeof(label), "gelu-fusion %d%s", gelu_fusion, no_epilogues ? ", epilogues unfused" : "");
    GPT2 cpu;
    if (gpt2_load(&cpu, model_path) != 0) { check(0, "load model", model_path); return; }
    int B = ref->B, T = ref->T, Vp = cpu.config.padded_vocab_size;
    size_t BT = (size_t)B * T, P = cpu.num_parameters;
    gpt2_alloc_training(&cpu, B, T);
    GpuGPT2 g;
    gpu_model_init(&g, &cpu, B, T, gelu_fusion);
    g.lt.no_epilogues = no_epilogues;
    if (gelu_fusion && !g.gelu_fusion) printf("     (GELU fusion not possible for C=%d: own kernels)\n", cpu.config.channels);

    /* raw logits and every activation */
    gpt2_forward(&cpu, ref->x, NULL, B, T);
    gpu_forward(&g, ref->x, NULL, B, T, 0.0f, 0);
    compare_activations(&g, &cpu, label);
    float* logits = device_to_host(&g, g.acts.logits, BT * Vp, 1);
    snprintf(what, sizeof(what), "%s: logits vs PyTorch", label);
    check_close(what, logits, ref->logits, BT * Vp, TOL_LOGITS);
    free(logits);

    /* loss, then gradients */
    float cpu_loss = gpt2_forward(&cpu, ref->x, ref->y, B, T);
    gpt2_zero_grad(&cpu);
    gpt2_backward(&cpu, 1.0f);
    gpu_zero_grad(&g);
    gpu_forward(&g, ref->x, ref->y, B, T, 1.0f / BT, 0);
    gpu_backward(&g);
    double loss = gpu_losses_fetch(&g, 1);
    snprintf(what, sizeof(what), "%s: loss %.6f vs PyTorch %.6f (CPU %.6f)", label, loss, ref->loss, cpu_loss);
    check(fabs(loss - ref->loss) <= TOL_LOSS * fabs(ref->loss), what, "");
    float* grads = device_to_host(&g, g.grads_memory, P, 0);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        snprintf(what, sizeof(what), "%s: gradient %s vs PyTorch", label, PARAMETER_NAMES[i]);
        check_close(what, grads + off, ref->grads + off, g.param_sizes[i], TOL_GRAD);
        snprintf(what, sizeof(what), "%s: gradient %s vs CPU", label, PARAMETER_NAMES[i]);
        check_close(what, grads + off, cpu.grads_memory + off, g.param_sizes[i], TOL_GRAD);
        off += g.param_sizes[i];
    }
    /* again: bitwise the same, and every GEMM's cuBLASLt descriptor and layouts from G3's cache */
    long long calls0 = g.lt.calls, created0 = g.lt.created;
    gpu_zero_grad(&g);
    gpu_forward(&g, ref->x, ref->y, B, T, 1.0f / BT, 0);
    gpu_backward(&g);
    float* grads2 = device_to_host(&g, g.grads_memory, P, 0);
    snprintf(what, sizeof(what), "%s: gradients bitwise identical on a second run", label);
    check(!memcmp(grads, grads2, P * sizeof(float)), what, "");
    char detail[160];
    snprintf(detail, sizeof(detail), "%lld GEMMs, %lld descriptors created (warm-up: %lld for %lld GEMMs)",
             g.lt.calls - calls0, g.lt.created - created0, created0, calls0);
    snprintf(what, sizeof(what), "%s: a repeated forward+backward creates no cuBLASLt descriptors", label);
    check(g.lt.created == created0 && g.lt.calls > calls0, what, detail);
    free(grads);
    free(grads2);
    gpu_model_free(&g);
    gpt2_free(&cpu);
}

/* The tiny fixture has C = 36, which takes the LayerNorm kernels' scalar-load
 * path; this model (C = 320 = 40 packs of 8: two per lane for 8 lanes, the
 * 16-byte path; 160 rows: three blocks of the LayerNorm backward; Vp = 128:
 * the 16-byte classifier) checks the vector paths against the CPU trainer,
 * on random weights with LayerNorm weights and biases away from 1 and 0. */
static void test_forward_backward_wide(void) {
    GPT2Config config = {48, 100, 128, 2, 5, 320}; /* maxT V Vp L NH C */
    const int B = 4, T = 40;
    GPT2 cpu;
    gpt2_init_random(&cpu, &config, 11);
    Rng rng;
    rng_init(&rng, 12);
    float* ln[6] = {cpu.params.ln1w, cpu.params.ln1b, cpu.params.ln2w, cpu.params.ln2b, cpu.params.lnfw,
                    cpu.params.lnfb};
    size_t ln_n[6] = {2 * 320, 2 * 320, 2 * 320, 2 * 320, 320, 320};
    for (int i = 0; i < 6; i++)
        for (size_t j = 0; j < ln_n[i]; j++) ln[i][j] = (float)((i % 2 ? 0.0 : 1.0) + 0.2 * rng_normal(&rng));
    int x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(rng_u32(&rng) % (uint32_t)config.vocab_size);
        y[i] = (int)(rng_u32(&rng) % (uint32_t)config.vocab_size);
    }
    size_t BT = (size_t)B * T, P = cpu.num_parameters;
    gpt2_alloc_training(&cpu, B, T);
    GpuGPT2 g;
    gpu_model_init(&g, &cpu, B, T, 1);
    gpt2_forward(&cpu, x, NULL, B, T);
    gpu_forward(&g, x, NULL, B, T, 0.0f, 0);
    compare_activations(&g, &cpu, "C=320 (16-byte paths)");
    float cpu_loss = gpt2_forward(&cpu, x, y, B, T);
    gpt2_zero_grad(&cpu);
    gpt2_backward(&cpu, 1.0f);
    gpu_zero_grad(&g);
    gpu_forward(&g, x, y, B, T, 1.0f / BT, 0);
    gpu_backward(&g);
    double loss = gpu_losses_fetch(&g, 1);
    char what[200];
    snprintf(what, sizeof(what), "C=320 (16-byte paths): loss %.6f vs CPU %.6f", loss, cpu_loss);
    check(fabs(loss - cpu_loss) <= TOL_LOSS * fabs(cpu_loss), what, "");
    float* grads = device_to_host(&g, g.grads_memory, P, 0);
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        snprintf(what, sizeof(what), "C=320 (16-byte paths): gradient %s vs CPU", PARAMETER_NAMES[i]);
        check_close(what, grads + off, cpu.grads_memory + off, g.param_sizes[i], TOL_GRAD);
        off += g.param_sizes[i];
    }
    gpu_zero_grad(&g);
    gpu_forward(&g, x, y, B, T, 1.0f / BT, 0);
    gpu_backward(&g);
    float* grads2 = device_to_host(&g, g.grads_memory, P, 0);
    check(!memcmp(grads, grads2, P * sizeof(float)), "C=320 (16-byte paths): gradients bitwise identical on a second run", "");
    free(grads);
    free(grads2);
    gpu_model_free(&g);
    gpt2_free(&cpu);
}

/* Loss and gradients of one forward + backward at --recompute `level`, as
 * host arrays (the caller frees). `x`, `y`: (B, T). */
static float* recompute_grads(const GPT2* cpu, const int* x, const int* y, int B, int T, int gelu_fusion, int level,
                              double* loss) {
    GpuGPT2 g;
    gpu_model_init_level(&g, cpu, B, T, gelu_fusion, level);
    gpu_zero_grad(&g);
    gpu_forward(&g, x, y, B, T, 1.0f / (B * T), 0);
    gpu_backward(&g);
    *loss = gpu_losses_fetch(&g, 1);
    float* grads = device_to_host(&g, g.grads_memory, g.num_parameters, 0);
    gpu_model_free(&g);
    return grads;
}

/* --recompute 1..3 against 0: the loss and every gradient bitwise the
 * same, under --gelu-fusion 0 at every level and under 1 at level 3 (see
 * above gpu_activation_sizes: levels 1 and 2 run GELU with our kernel). */
static void test_recompute_case(const char* label, const GPT2* cpu, const int* x, const int* y, int B, int T) {
    for (int fusion = 0; fusion <= 1; fusion++) {
        double loss0;
        float* g0 = recompute_grads(cpu, x, y, B, T, fusion, 0, &loss0);
        for (int level = fusion ? 3 : 1; level < RECOMPUTE_LEVELS; level++) {
            double loss;
            float* gl = recompute_grads(cpu, x, y, B, T, fusion, level, &loss);
            char what[200], detail[120];
            snprintf(what, sizeof(what), "%s, gelu-fusion %d: --recompute %d loss and gradients bitwise those of 0",
                     label, fusion, level);
            snprintf(detail, sizeof(detail), "loss %.9g vs %.9g", loss, loss0);
            check(loss == loss0 && !memcmp(gl, g0, cpu->num_parameters * sizeof(float)), what, detail);
            free(gl);
        }
        free(g0);
    }
}

/* A few AdamW steps at each level: the losses and the final master weights
 * bitwise those of level 0 (--gelu-fusion 0). */
static void test_recompute_steps(const char* model_path, const Reference* ref) {
    GPT2 cpu;
    if (gpt2_load(&cpu, model_path) != 0) { check(0, "load model", model_path); return; }
    int B = ref->B, T = ref->T, steps = 3;
    size_t P = cpu.num_parameters;
    AdamWConfig opt;
    opt.beta1 = ref->beta1; opt.beta2 = ref->beta2; opt.eps = ref->eps;
    opt.weight_decay = ref->weight_decay; opt.decay_all = 0;
    float* w[RECOMPUTE_LEVELS];
    double losses[RECOMPUTE_LEVELS][3];
    for (int level = 0; level < RECOMPUTE_LEVELS; level++) {
        GpuGPT2 g;
        gpu_model_init_level(&g, &cpu, B, T, 0, level);
        for (int s = 0; s < steps; s++) {
            gpu_zero_grad(&g);
            gpu_forward(&g, ref->x, ref->y, B, T, 1.0f / (B * T), 0);
            gpu_backward(&g);
            gpu_grad_norm(&g);
            losses[level][s] = gpu_losses_fetch(&g, 1);
            gpu_adamw_update(&g, &opt, (float)ref->lr, s + 1, ref->grad_clip, 99u + (uint32_t)s);
        }
        w[level] = device_to_host(&g, g.master_memory, P, 0);
        gpu_model_free(&g);
    }
    for (int level = 1; level < RECOMPUTE_LEVELS; level++) {
        char what[160], detail[120];
        snprintf(what, sizeof(what), "%d AdamW steps at --recompute %d: losses and master weights bitwise those of 0",
                 steps, level);
        snprintf(detail, sizeof(detail), "last loss %.9g vs %.9g", losses[level][steps - 1], losses[0][steps - 1]);
        check(!memcmp(losses[level], losses[0], sizeof(losses[0])) && !memcmp(w[level], w[0], P * sizeof(float)),
              what, detail);
    }
    for (int level = 0; level < RECOMPUTE_LEVELS; level++) free(w[level]);
    gpt2_free(&cpu);
}

/* The recompute levels on the tiny fixture (C = 36) and on a C = 320 model
 * (the 16-byte paths, GELU fusion possible). */
static void test_recompute(const char* model_path, const Reference* ref) {
    GPT2 cpu;
    if (gpt2_load(&cpu, model_path) != 0) { check(0, "load model", model_path); return; }
    test_recompute_case("tiny fixture", &cpu, ref->x, ref->y, ref->B, ref->T);
    gpt2_free(&cpu);
    GPT2Config config = {48, 100, 128, 2, 5, 320}; /* maxT V Vp L NH C */
    const int B = 4, T = 40;
    gpt2_init_random(&cpu, &config, 21);
    Rng rng;
    rng_init(&rng, 22);
    int x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(rng_u32(&rng) % (uint32_t)config.vocab_size);
        y[i] = (int)(rng_u32(&rng) % (uint32_t)config.vocab_size);
    }
    test_recompute_case("C=320", &cpu, x, y, B, T);
    gpt2_free(&cpu);
    test_recompute_steps(model_path, ref);
}

/* 10 AdamW steps on the reference batch, as test_gpt.c runs them on the CPU. */
static void test_adamw_steps(const char* model_path, const Reference* ref) {
    GPT2 cpu;
    if (gpt2_load(&cpu, model_path) != 0) { check(0, "load model", model_path); return; }
    int B = ref->B, T = ref->T, steps = ref->steps;
    size_t P = cpu.num_parameters;
    GpuGPT2 g;
    gpu_model_init(&g, &cpu, B, T, 1);
    LRSchedule sched;
    sched.kind = SCHEDULE_COSINE;
    sched.max_lr = ref->lr;
    sched.warmup_steps = ref->warmup;
    sched.total_steps = ref->steps;
    sched.final_frac = ref->final_lr_frac;
    sched.decay_frac = 0.0;
    AdamWConfig opt;
    opt.beta1 = ref->beta1; opt.beta2 = ref->beta2; opt.eps = ref->eps;
    opt.weight_decay = ref->weight_decay; opt.decay_all = 0;
    float* losses = xmalloc_floats((size_t)steps);
    float* norms = xmalloc_floats((size_t)steps);
    for (int s = 0; s < steps; s++) {
        gpu_zero_grad(&g);
        gpu_forward(&g, ref->x, ref->y, B, T, 1.0f / (B * T), 0);
        gpu_backward(&g);
        norms[s] = (float)gpu_grad_norm(&g);
        losses[s] = (float)gpu_losses_fetch(&g, 1);
        gpu_adamw_update(&g, &opt, (float)lr_at(&sched, s), s + 1, ref->grad_clip, 1234u + (uint32_t)s);
    }
    char what[160];
    snprintf(what, sizeof(what), "losses of %d AdamW steps vs PyTorch", steps);
    check_close(what, losses, ref->losses, (size_t)steps, TOL_STEP_LOSS);
    snprintf(what, sizeof(what), "gradient norms of %d AdamW steps vs PyTorch", steps);
    check_close(what, norms, ref->norms, (size_t)steps, TOL_STEP_NORM);
    /* final master weights: error of the total update per tensor (see test_gpt.c
     * for why elementwise is the wrong yardstick); the key bias, whose
     * gradient is round-off only, is left out as there. */
    float* w = device_to_host(&g, g.master_memory, P, 0);
    int C = cpu.config.channels;
    size_t qkvb_off = 0;
    for (int i = 0; i < 5; i++) qkvb_off += g.param_sizes[i];
    for (int l = 0; l < cpu.config.num_layers; l++)
        for (int c = 0; c < C; c++) {
            size_t j = qkvb_off + (size_t)l * 3 * C + C + c;
            w[j] = ref->final_params[j];
        }
    double worst = -1.0;
    char detail[200] = "";
    size_t off = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        double err = 0.0, upd = 0.0;
        for (size_t j = off; j < off + g.param_sizes[i]; j++) {
            double d = (double)w[j] - ref->final_params[j], u = (double)ref->final_params[j] - cpu.params_memory[j];
            err += d * d;
            upd += u * u;
        }
        double rel = upd > 0.0 ? sqrt(err / upd) : sqrt(err);
        if (!(rel <= worst)) {
            worst = rel;
            snprintf(detail, sizeof(detail), "worst %s: ||error|| / ||update|| = %.2e (tol %.0e)", PARAMETER_NAMES[i],
                     rel, TOL_FINAL);
        }
        off += g.param_sizes[i];
    }
    snprintf(what, sizeof(what), "master weights after %d AdamW steps vs PyTorch", steps);
    check(worst <= TOL_FINAL, what, detail);
    free(w);
    free(losses);
    free(norms);
    gpu_model_free(&g);
    gpt2_free(&cpu);
}

/* CUDA graphs: `steps` steps of 2 micro-batches (the reference batch twice),
 * three ways from the same weights: (0) launched and decided by the host as
 * test_adamw_steps does, (1) as gpu_train runs them without graphs (tokens
 * uploaded, gpu_micro_batch, the update gated on the device), (2) the same
 * with graphs from the second step (captured once, then replayed). The
 * losses, norms and master weights must be the same bits. Then a step whose
 * loss is NaN (a bf16 weight set to NaN), replayed from the graph: the
 * device's gate must skip the update (master unchanged). */
static void test_graph_steps(const char* model_path, const Reference* ref) {
    GPT2 cpu;
    if (gpt2_load(&cpu, model_path) != 0) { check(0, "load model", model_path); return; }
    int B = ref->B, T = ref->T, BT = B * T;
    enum { STEPS = 4, MICRO = 2 };
    size_t P = cpu.num_parameters;
    AdamWConfig opt;
    opt.beta1 = ref->beta1; opt.beta2 = ref->beta2; opt.eps = ref->eps;
    opt.weight_decay = ref->weight_decay; opt.decay_all = 0;
    float max_norm = (float)ref->grad_clip, dloss = 1.0f / (float)(MICRO * BT);
    double losses[3][STEPS], norms[3][STEPS];
    float* w[3];
    for (int way = 0; way < 3; way++) {
        GpuGPT2 g;
        gpu_model_init(&g, &cpu, B, T, 1);
        for (int s = 0; s < STEPS; s++) {
            float lr = (float)ref->lr * (s + 1) / STEPS;
            uint32_t seed = 77u + (uint32_t)s;
            gpu_zero_grad(&g);
            g.graphs = way == 2 && s > 0;
            for (int micro = 0; micro < MICRO; micro++) {
                if (way == 0) {
                    gpu_forward(&g, ref->x, ref->y, B, T, dloss, micro);
                    gpu_backward(&g);
                } else {
                    gpu_tokens_upload(&g, ref->x, ref->y, BT, micro);
                    gpu_micro_batch(&g, B, T, dloss);
                }
            }
            if (way == 0) {
                norms[way][s] = gpu_grad_norm(&g);
                losses[way][s] = gpu_losses_fetch(&g, MICRO);
                gpu_adamw_update(&g, &opt, lr, s + 1, max_norm, seed);
            } else {
                norms[way][s] = gpu_update_gated(&g, &opt, lr, s + 1, max_norm, seed, MICRO, &losses[way][s]);
            }
        }
        w[way] = device_to_host(&g, g.master_memory, P, 0);
        if (way == 2) { /* a NaN loss: a bf16 weight of the final LayerNorm set to NaN, the step replayed */
            uint16_t nan_bf16 = 0x7FC0;
            CUDA_CHECK(cudaMemcpy(g.params.lnfw, &nan_bf16, sizeof(nan_bf16), cudaMemcpyHostToDevice));
            gpu_zero_grad(&g);
            for (int micro = 0; micro < MICRO; micro++) {
                gpu_tokens_upload(&g, ref->x, ref->y, BT, micro);
                gpu_micro_batch(&g, B, T, dloss);
            }
            double loss;
            double norm = gpu_update_gated(&g, &opt, (float)ref->lr, STEPS + 1, max_norm, 99u, MICRO, &loss);
            float* after = device_to_host(&g, g.master_memory, P, 0);
            char detail[120];
            snprintf(detail, sizeof(detail), "loss %g, norm %g", loss, norm);
            check(!isfinite(loss) && !memcmp(after, w[way], P * sizeof(float)),
                  "graphs: a step with a NaN loss replayed, the device's gate skips the update (master unchanged)",
                  detail);
            free(after);
        }
        gpu_model_free(&g);
    }
    for (int way = 1; way < 3; way++) {
        char what[200], detail[120];
        snprintf(what, sizeof(what), "%d steps of %d micro-batches %s: losses, norms, master weights bitwise the "
                 "host-decided launches'", STEPS, MICRO, way == 1 ? "gated on the device" : "from CUDA graphs (replayed)");
        snprintf(detail, sizeof(detail), "last loss %.9g vs %.9g, norm %.9g vs %.9g", losses[way][STEPS - 1],
                 losses[0][STEPS - 1], norms[way][STEPS - 1], norms[0][STEPS - 1]);
        check(!memcmp(losses[way], losses[0], sizeof(losses[0])) && !memcmp(norms[way], norms[0], sizeof(norms[0])) &&
                  !memcmp(w[way], w[0], P * sizeof(float)),
              what, detail);
    }
    for (int way = 0; way < 3; way++) free(w[way]);
    gpt2_free(&cpu);
}

/* The encoder backward's chunks (train_gpt.cu: a token of more than
 * ENC_CHUNK positions summed by several blocks, its partials added in
 * order). On a C = 320 model at B = 4, T = 40 (160 positions, so at most
 * 2 tokens of several chunks), three batches: tokens uniform (every token
 * one chunk), one token at 9 positions of 10 (144: chunks of 64, 64, 16),
 * two tokens at 70 positions each (two chunks each). Checked:
 *   (a) encoder_backward_wte_gpu alone on a random dout against
 *       train_gpt.c's encoder_backward; captured in a CUDA graph on the
 *       uniform batch and replayed on the others (the counts change, the
 *       launches do not): the same bits as its plain launches;
 *   (b) a whole micro-batch (forward + backward) captured on the uniform
 *       batch and replayed on the frequent-token one: every gradient the
 *       same bits as plain launches, wte's against the CPU trainer. */
typedef struct {
    float* dwte;
    const floatX* dout;
} EncoderTestArgs;

static void encoder_test_work(GpuGPT2* g, const void* arg) {
    const EncoderTestArgs* a = (const EncoderTestArgs*)arg;
    encoder_backward_wte_gpu(a->dwte, g->scratch.enc_partial, a->dout, g->dev.enc, g->B * g->T,
                             g->config.vocab_size, g->config.channels, g->stream);
}

static void test_encoder_chunks(void) {
    GPT2Config config = {48, 100, 128, 2, 5, 320}; /* maxT V Vp L NH C */
    enum { B = 4, T = 40, BT = B * T, NBATCH = 3 };
    int V = config.vocab_size, C = config.channels;
    GPT2 cpu;
    gpt2_init_random(&cpu, &config, 31);
    Rng rng;
    rng_init(&rng, 32);
    static int x[NBATCH][BT], y[BT];
    for (int i = 0; i < BT; i++) {
        int r = (int)(rng_u32(&rng) % (uint32_t)V);
        x[0][i] = r;
        x[1][i] = i % 10 == 9 ? r : V - 1;            /* 144 x the last token (GPT-2's end of text) */
        x[2][i] = i < 70 ? 5 : i < 140 ? 6 : r % 5;   /* 70 x 5, 70 x 6 (+ a few of r % 5 < 5) */
        y[i] = (int)(rng_u32(&rng) % (uint32_t)V);
    }
    const char* names[NBATCH] = {"uniform", "one token 9/10", "two tokens 70+"};
    size_t VC = (size_t)V * C;
    float* dout = xmalloc_floats((size_t)BT * C); /* (rounded to bf16 by the upload) */
    float* dwte0 = xmalloc_floats(VC);
    for (size_t i = 0; i < (size_t)BT * C; i++) dout[i] = 2.0f * rng_uniform(&rng) - 1.0f;
    for (size_t i = 0; i < VC; i++) dwte0[i] = 2.0f * rng_uniform(&rng) - 1.0f;
    floatX* d_dout = attn_test_upload(dout, (size_t)BT * C);
    float* dwpe = xmalloc_floats((size_t)T * C);
    gpt2_alloc_training(&cpu, B, T);
    GpuGPT2 g;
    gpu_model_init(&g, &cpu, B, T, 1);
    float* d_dwte;
    CUDA_CHECK(cudaMalloc((void**)&d_dwte, VC * sizeof(float)));
    EncoderTestArgs args = {d_dwte, d_dout};
    float* eager[NBATCH];
    char what[200], detail[200];

    /* (a) plain launches against the CPU, then the graph captured on batch 0 */
    for (int k = 0; k < NBATCH; k++) {
        gpu_tokens_upload(&g, x[k], y, BT, 0);
        int nch = g.host.enc.num_chunks[0], nl = g.host.enc.num_long[0];
        CUDA_CHECK(cudaMemcpyAsync(d_dwte, dwte0, VC * sizeof(float), cudaMemcpyHostToDevice, g.stream));
        encoder_test_work(&g, &args);
        eager[k] = device_to_host(&g, d_dwte, VC, 0);
        float* want = xmalloc_floats(VC);
        memcpy(want, dwte0, VC * sizeof(float));
        memset(dwpe, 0, (size_t)T * C * sizeof(float));
        encoder_backward(want, dwpe, dout, x[k], B, T, C);
        snprintf(what, sizeof(what), "encoder chunks, %s (%d distinct tokens, %d chunks, %d tokens of several): "
                 "dwte vs train_gpt.c's encoder_backward", names[k], g.num_buckets, nch, nl);
        check_close(what, eager[k], want, VC, 1e-5);
        if (k > 0) {
            snprintf(detail, sizeof(detail), "%d tokens of several chunks (%d chunks)", nl, nch);
            check(nl == k, k == 1 ? "encoder chunks: one token of 144 positions is 3 chunks (the test exercises "
                  "the partials)" : "encoder chunks: two tokens of 70 positions, two chunks each", detail);
            if (k == 1) check(nch == g.num_buckets + 2, "encoder chunks: 144 positions = 64 + 64 + 16", detail);
        }
        free(want);
    }
    g.graphs = 1;
    cudaGraphExec_t exec = NULL;
    int order[NBATCH + 1] = {0, 1, 2, 0};
    int same = 1;
    for (int j = 0; j < NBATCH + 1; j++) {
        int k = order[j];
        gpu_tokens_upload(&g, x[k], y, BT, 0);
        CUDA_CHECK(cudaMemcpyAsync(d_dwte, dwte0, VC * sizeof(float), cudaMemcpyHostToDevice, g.stream));
        gpu_graph_run(&g, &exec, encoder_test_work, &args); /* j = 0: captured, then launched */
        float* got = device_to_host(&g, d_dwte, VC, 0);
        same &= !memcmp(got, eager[k], VC * sizeof(float));
        free(got);
    }
    check(same, "encoder chunks: captured on uniform tokens, replayed on 1 and 2 frequent tokens (and back): dwte "
          "bitwise the plain launches'", "");
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    g.graphs = 0;

    /* (b) a whole micro-batch: plain, then replayed from a graph captured on batch 0 */
    float dloss = 1.0f / BT;
    gpu_zero_grad(&g);
    gpu_tokens_upload(&g, x[1], y, BT, 0);
    gpu_micro_batch(&g, B, T, dloss);
    float* plain = device_to_host(&g, g.grads_memory, g.num_parameters, 0);
    g.graphs = 1;
    gpu_zero_grad(&g);
    gpu_tokens_upload(&g, x[0], y, BT, 0);
    gpu_micro_batch(&g, B, T, dloss); /* captured on the uniform batch */
    gpu_zero_grad(&g);
    gpu_tokens_upload(&g, x[1], y, BT, 0);
    gpu_micro_batch(&g, B, T, dloss); /* replayed on the frequent token */
    float* replayed = device_to_host(&g, g.grads_memory, g.num_parameters, 0);
    check(!memcmp(plain, replayed, g.num_parameters * sizeof(float)),
          "encoder chunks: a micro-batch captured on uniform tokens, replayed on one token at 9/10 of the "
          "positions: every gradient bitwise the plain launches'", "");
    gpt2_forward(&cpu, x[1], y, B, T);
    gpt2_zero_grad(&cpu);
    gpt2_backward(&cpu, 1.0f);
    check_close("encoder chunks: wte gradient (one token at 9/10 of the positions, replayed) vs CPU", replayed,
                cpu.grads.wte, g.param_sizes[0], TOL_GRAD);
    free(plain);
    free(replayed);
    for (int k = 0; k < NBATCH; k++) free(eager[k]);
    CUDA_CHECK(cudaFree(d_dwte));
    CUDA_CHECK(cudaFree(d_dout));
    free(dout); free(dwte0); free(dwpe);
    gpu_model_free(&g);
    gpt2_free(&cpu);
}

/* Stochastic rounding: the mean of many roundings of x is x. */
__global__ void stochastic_rounding_test_kernel(float* out, float x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(bf16_round_stochastic(x, hash_u32((uint32_t)i * 2654435761u)));
}

static void test_stochastic_rounding(void) {
    const int n = 1 << 20;
    const float x = 1.0f + 0.3f / 128.0f; /* 30% of the way from 1 to the next bf16 (1 + 2^-7) */
    float* d;
    CUDA_CHECK(cudaMalloc((void**)&d, n * sizeof(float)));
    stochastic_rounding_test_kernel<<<ceil_div(n, 256), 256>>>(d, x, n);
    KERNEL_CHECK();
    float* h = xmalloc_floats(n);
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double mean = 0.0;
    int only_neighbours = 1;
    for (int i = 0; i < n; i++) {
        mean += h[i];
        if (h[i] != 1.0f && h[i] != 1.0f + 1.0f / 128.0f) only_neighbours = 0;
    }
    mean /= n;
    char detail[128];
    snprintf(detail, sizeof(detail), "mean %.7f, x %.7f", mean, x);
    check(only_neighbours && fabs(mean - x) < 2e-5, "stochastic rounding: only the two neighbours, unbiased", detail);
    free(h);
    CUDA_CHECK(cudaFree(d));
}

/* The trainer binary refuses bad input with a message, before touching the GPU. */
static void test_binary(const char* binary) {
    const char* cases[][2] = {
        {"--gelu-fusion 7", "--gelu-fusion must be 0 or 1"},
        {"--no-such-flag 1", "unknown flag"},
        {"--batch-size 0", "--batch-size must be >= 1"},
        {"--model /nonexistent.bin --steps 1", "cannot open model file"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[1024], out[8192];
        snprintf(cmd, sizeof(cmd), "%s %s 2>&1", binary, cases[i][0]);
        FILE* p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof(out) - 1, p) : 0;
        out[n] = '\0';
        int rc = p ? pclose(p) : -1;
        char what[256];
        snprintf(what, sizeof(what), "train_gpt_cu %s: exits non-zero with \"%s\"", cases[i][0], cases[i][1]);
        check(rc != 0 && strstr(out, cases[i][1]) != NULL, what, "");
    }
}

/* ---- training states through the trainer binary (test_gpt.c's test_resume) */

/* Save, stop, resume, continue: the final weights bit for bit the
 * uninterrupted run's (from disk, and from the snapshot in memory); taking a
 * snapshot every step changes nothing; the CPU trainer (cpu_binary, when
 * given) continues a state the GPU wrote; a --zero 1 state (one rank's
 * shards gathered into the flat format) resumes bit for bit under --zero 1
 * and continues under --zero 0. */
static void test_resume(const char* binary, const char* cpu_binary) {
    char dir[] = "/tmp/gptc_cu_resume_XXXXXX";
    if (!mkdtemp(dir)) { check(0, "make a temporary folder", strerror(errno)); return; }
    char shard[600], common[2400], cmd[3000], a[700], b[700];
    static char out[1 << 16];
    snprintf(shard, sizeof(shard), "%s/rs_train_000.bin", dir);
    write_shard(shard, 6000, 50, 3, SHARD_MAGIC, 1, 6000);
    snprintf(common, sizeof(common),
             "--model d2 --channels 64 --num-heads 4 --max-seq-len 32 --vocab-size 50 -i %s -j %s -b 4 -t 16 -x 12 "
             "--lr 3e-3 --warmup-steps 2 --weight-decay 0.1 --val-every 5 --val-batches 2 --sample-every 0 --shuffle 1 "
             "--save-every 4", shard, shard);
    snprintf(a, sizeof(a), "%s/rsA/model_00000012.bin", dir);
    /* A: uninterrupted */
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsA", binary, common, dir);
    int rc = run_capture(cmd, out, sizeof(out));
    char state8[700];
    snprintf(state8, sizeof(state8), "%s/rsA/state_00000008.complete", dir);
    check(rc == 0 && access(a, F_OK) == 0 && access(state8, F_OK) == 0,
          "GPU states: a run with --save-every 4 writes its model files and complete training states", rc ? out : "");
    /* B: stopped at 6, resumed from disk */
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsB --stop-at 6", binary, common, dir);
    rc = run_capture(cmd, out, sizeof(out));
    int stopped = strstr(out, "stopping after step 6") != NULL;
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsB --resume 1", binary, common, dir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsB/model_00000012.bin", dir);
    check(rc == 0 && stopped && strstr(out, "continuing after step 6") && strstr(out, "rank 0 from disk") &&
              files_equal(a, b),
          "GPU resume: stopped at step 6 and resumed from disk, the final weights are bit for bit the uninterrupted "
          "run's", rc ? out : "");
    /* C: a snapshot in memory every step (the side-stream copies), stopped at 6, resumed from its memory */
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsC --snapshot-every 1 --stop-at 6", binary, common, dir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsC --snapshot-every 1 --resume 1", binary, common, dir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsC/model_00000012.bin", dir);
    check(rc == 0 && strstr(out, "continuing after step 6") && strstr(out, "its own snapshot in memory") &&
              strstr(out, "snapshots: ") && files_equal(a, b),
          "GPU resume: snapshots every step change nothing, and a run resumed from its memory snapshot continues bit "
          "for bit", rc ? out : "");
    /* D: the CPU trainer continues the GPU's state (not bit for bit: fp32 against bf16) */
    if (cpu_binary) {
        snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsB --resume 1 --threads 2", cpu_binary, common, dir);
        snprintf(b, sizeof(b), "%s/rsB/state_00000012.complete", dir);
        remove(b); /* so that the CPU continues from step 8, the newest state before the end */
        rc = run_capture(cmd, out, sizeof(out));
        check(rc == 0 && strstr(out, "continuing after step 8") && access(b, F_OK) == 0,
              "GPU -> CPU: train_gpt continues a training state written by train_gpt_cu (the same format)", rc ? out : "");
    }
    /* E: ZeRO (one GPU: a one-rank communicator, the sharded code): the shards gathered into the flat state
     * and packed out of it again; resumed from step 8 under --zero 1, bit for bit; under --zero 0, it continues */
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsE --zero 1", binary, common, dir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(a, sizeof(a), "%s/rsE/model_00000012.bin", dir);
    snprintf(cmd, sizeof(cmd), "cp -r %s/rsE %s/rsF && cp -r %s/rsE %s/rsG && rm %s/rsF/state_00000012.complete "
             "%s/rsF/model_00000012.bin %s/rsG/state_00000012.complete %s/rsG/model_00000012.bin", dir, dir, dir, dir,
             dir, dir, dir, dir);
    rc |= system(cmd);
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsF --zero 1 --resume 1", binary, common, dir);
    rc |= run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsF/model_00000012.bin", dir);
    check(rc == 0 && strstr(out, "continuing after step 8") && files_equal(a, b),
          "GPU --zero 1 states: saved at step 8 and resumed, the final weights bit for bit the uninterrupted run's",
          rc ? out : "");
    snprintf(cmd, sizeof(cmd), "%s %s -o %s/rsG --zero 0 --resume 1", binary, common, dir);
    rc = run_capture(cmd, out, sizeof(out));
    snprintf(b, sizeof(b), "%s/rsG/model_00000012.bin", dir);
    check(rc == 0 && strstr(out, "continuing after step 8") && access(b, F_OK) == 0,
          "GPU --zero 1 state resumed under --zero 0 (the flat path) continues to the end", rc ? out : "");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

int main(int argc, char** argv) {
    const char* model_path = "dev/fixtures/tiny_model.bin";
    const char* ref_path = "dev/fixtures/tiny_ref.bin";
    const char* binary = NULL;
    const char* cpu_binary = NULL;
    int host_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ref") && i + 2 < argc) { model_path = argv[++i]; ref_path = argv[++i]; }
        else if (!strcmp(argv[i], "--host-only")) host_only = 1;
        else if (!strcmp(argv[i], "--binary") && i + 1 < argc) binary = argv[++i];
        else if (!strcmp(argv[i], "--cpu-binary") && i + 1 < argc) cpu_binary = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--host-only] [--ref MODEL REF] [--binary ./train_gpt_cu [--cpu-binary ./train_gpt]]\n",
                    argv[0]);
            return 2;
        }
    }
    test_the_tester();
    test_buckets();
    test_encoder_chunks_host();
    test_mfu_format();
    test_lt_decisions(model_path);
    test_memory_check();
    test_memory_plan_attention();
    test_memory_plan_recompute();
    test_memory_plan_state();
    if (host_only) { /* (make check-cuda: no GPU needed) */
        printf("host-only: %d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed ? 1 : 0;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device: the GPU checks were not run\n%d passed, %d failed\n", tests_passed, tests_failed);
        return tests_failed ? 1 : 77;
    }
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s\n", prop.name);
    if (binary) test_binary(binary);
    if (binary) test_resume(binary, cpu_binary);
    test_stochastic_rounding();
    test_lt_cache_full();
    test_attention();
    Reference ref;
    if (reference_read(&ref, ref_path) != 0) {
        check(0, "read the reference", ref_path);
    } else {
        test_forward_backward(model_path, &ref, 1, 0);
        test_forward_backward(model_path, &ref, 0, 0);
        test_forward_backward(model_path, &ref, 1, 1); /* the fallback when cuBLASLt has no algorithm (G3) */
        test_adamw_steps(model_path, &ref);
        test_graph_steps(model_path, &ref);
        test_recompute(model_path, &ref);
        reference_free(&ref);
    }
    test_forward_backward_wide();
    test_encoder_chunks();
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
