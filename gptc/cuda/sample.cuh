/*
 * gptc/cuda/sample.cuh — generation on the GPU with a KV cache: samples at
 * the training boundary and --prompt, without copying the weights back.
 *
 * Included by train_gpt.cu in G7, after the model (GpuGPT2, ParameterTensorsX,
 * carve, the kernels and cuBLASLt's wrapper). Uses gptc/sample.h (through
 * train_gpt.c): this file's GpuSampler is a Decoder, and generate_tokens
 * draws the tokens with sample_token on the host, so the choice of a token
 * (temperature, top-k, top-p over the V logits) is written once for both
 * trainers and uses the same random numbers.
 * Defines: kv_append_kernel, attention_decode_kernel, GpuSampler,
 * gpu_sampler_init, gpu_sampler_init_host, gpu_sampler_free, gpu_prompt.
 *
 * One step runs one new token at position pos (B = 1, one row):
 *   x = wte[token] + wpe[pos]
 *   per layer: ln = LN1(x); qkv = ln . qkvw^T + qkvb; K, V cache[pos] = qkv's k, v;
 *              y = attention of q over cache[0..pos]; x2 = x + y . attprojw^T + attprojb;
 *              ln = LN2(x2); h = GELU(ln . fcw^T + fcb); x = x2 + h . fcprojw^T + fcprojb
 *   logits = LNF(x) . wte^T (Vp, bf16), then fp32, the first V copied to the host.
 * The same kernels as the training forward (encoder, layernorm, matmul through
 * cuBLASLt, GELU), with N = 1; only the attention is its own, for one query
 * reading the cache. A prompt goes through the same step, token by token
 * (simple; a prompt is short next to the generation). Precision as training:
 * bf16 weights, activations and cache, fp32 LayerNorm statistics, scores and
 * softmax.
 */
#ifndef GPTC_CUDA_SAMPLE_CUH
#define GPTC_CUDA_SAMPLE_CUH

#define DECODE_ATTN_THREADS 128 /* 4 warps per head; a head of hs <= ATTN_MAX_HS = 128 fits one pass */

/* Position pos's key and value into the layer's cache: kc, vc (NH, maxT, hs),
 * from qkv (3C: q, k, v, each NH heads of hs). One thread per channel. */
__global__ void kv_append_kernel(floatX* kc, floatX* vc, const floatX* qkv, int pos, int maxT, int NH, int hs) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, C = NH * hs;
    if (c >= C) return;
    size_t at = ((size_t)(c / hs) * maxT + pos) * hs + c % hs;
    kc[at] = qkv[C + c];
    vc[at] = qkv[2 * C + c];
}

/* One query against the cache, block h for head h (Vaswani et al. 2017, eq. 1):
 *   s_t = q . K[t] / sqrt(hs) for t < n;  p_t = exp(s_t - max s);  y = sum_t p_t V[t] / sum_t p_t
 * q: qkv's head h (the query of the new position); kc, vc: the layer's cache
 * (NH, maxT, hs); y (C): head h's hs outputs. n = pos + 1 positions (the new
 * one included). Shared: the scores (maxT floats), then the partial sums of
 * y (DECODE_ATTN_THREADS floats), then 32 for the reductions. */
__global__ void __launch_bounds__(DECODE_ATTN_THREADS) attention_decode_kernel(floatX* y, const floatX* qkv,
                                                                               const floatX* kc, const floatX* vc,
                                                                               int n, int maxT, int NH, int hs) {
    extern __shared__ float smem[];
    float* score = smem;            /* (maxT) */
    float* part = smem + maxT;      /* (DECODE_ATTN_THREADS) */
    float* red = part + DECODE_ATTN_THREADS; /* (32) */
    int h = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const floatX* q = qkv + (size_t)h * hs;
    const floatX* K = kc + (size_t)h * maxT * hs;
    const floatX* V = vc + (size_t)h * maxT * hs;
    float scale = rsqrtf((float)hs);
    /* s_t: a warp per position, its lanes along the head (consecutive bf16: coalesced) */
    for (int t = warp; t < n; t += warps) {
        float d = 0.0f;
        for (int i = lane; i < hs; i += 32) d += __bfloat162float(q[i]) * __bfloat162float(K[(size_t)t * hs + i]);
        d = warp_sum(d);
        if (lane == 0) score[t] = d * scale;
    }
    __syncthreads(); /* every score is written */
    /* m = max_t s_t */
    float m = -FLT_MAX;
    for (int t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, score[t]);
    m = warp_max(m);
    if (lane == 0) red[warp] = m;
    __syncthreads(); /* every warp's maximum is in red */
    m = red[0];
    for (int w = 1; w < warps; w++) m = fmaxf(m, red[w]); /* (block_sum's first barrier keeps red until all read it) */
    /* p_t = exp(s_t - m) in place; l = sum_t p_t */
    float l = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float p = expf(score[t] - m);
        score[t] = p;
        l += p;
    }
    l = block_sum(l, red); /* (its barriers also make every p_t visible) */
    /* y_i = sum_t p_t V[t][i] / l: G groups of hs threads, group g over t = g, g + G, ..., thread i of a group
     * reading element i of the row (coalesced); then thread i sums the G partials, in g order */
    int G = blockDim.x / hs, g = threadIdx.x / hs, i = threadIdx.x % hs;
    float acc = 0.0f;
    if (g < G)
        for (int t = g; t < n; t += G) acc += score[t] * __bfloat162float(V[(size_t)t * hs + i]);
    part[threadIdx.x] = acc;
    __syncthreads(); /* every group's partial is written */
    if ((int)threadIdx.x < hs) {
        float sum = 0.0f;
        for (int k = 0; k < G; k++) sum += part[k * hs + threadIdx.x];
        y[(size_t)h * hs + threadIdx.x] = __float2bfloat16(sum / l);
    }
}

/* The sampler's device tensors, carved in this order from one allocation
 * (gpu_sampler_sizes). */
#define NUM_SAMPLER_TENSORS 13
typedef struct {
    floatX* k;        /* (L, NH, maxT, hs) the KV cache: keys of every position so far */
    floatX* v;        /* (L, NH, maxT, hs) values */
    floatX* x;        /* (C) the residual stream: a layer's input and output */
    floatX* x2;       /* (C) after the attention half */
    floatX* ln;       /* (C) a LayerNorm's output */
    floatX* qkv;      /* (3C) */
    floatX* y;        /* (C) attention output */
    floatX* fch;      /* (4C) before GELU */
    floatX* fch_gelu; /* (4C) */
    floatX* logits;   /* (Vp) */
    float* stats;     /* (2) LayerNorm mean and rstd (written, not used) */
    float* logits_f;  /* (Vp) the logits in fp32 */
    int* token;       /* (1) the token at the new position */
} SamplerTensors;
static_assert(sizeof(SamplerTensors) == NUM_SAMPLER_TENSORS * sizeof(void*), "SamplerTensors must match its table");

static void gpu_sampler_sizes(size_t n[NUM_SAMPLER_TENSORS], size_t bytes[NUM_SAMPLER_TENSORS], const GPT2Config* c) {
    size_t C = c->channels, L = c->num_layers, maxT = c->max_seq_len, Vp = c->padded_vocab_size;
    size_t e[NUM_SAMPLER_TENSORS] = {L * maxT * C, L * maxT * C, C, C, C, 3 * C, C, 4 * C, 4 * C, Vp, 2, Vp, 1};
    for (int i = 0; i < NUM_SAMPLER_TENSORS; i++) {
        n[i] = e[i];
        bytes[i] = i < 10 ? sizeof(floatX) : 4;
    }
}

typedef struct {
    Decoder d;               /* what generate_tokens drives (self: this) */
    GPT2Config config;
    size_t param_sizes[NUM_PARAMETER_TENSORS];
    ParameterTensorsX params; /* whole bf16 weights on the device: the trainer's, or own_params */
    floatX* own_params;      /* --prompt: uploaded here (P); NULL when the trainer's are used */
    LtContext* lt;           /* the trainer's cuBLASLt context, or own_lt */
    LtContext own_lt;
    cudaStream_t stream;
    int own_stream;
    int len;                 /* positions cached */
    int plant;               /* GPTC_SAMPLE_PLANT=last (test builds): the attention leaves out the newest position */
    void* memory;            /* SamplerTensors' allocation (transient: a sample takes it and gives it back) */
    SamplerTensors t;
    int* h_token;            /* (1) host */
    float* h_logits;         /* (V) host: the row sample_token reads */
} GpuSampler;

/* Run `token` at position len; the logits of the next token, V floats on the host. */
static const float* gpu_sampler_step(void* self, int token) {
    GpuSampler* sp = (GpuSampler*)self;
    const GPT2Config* c = &sp->config;
    int C = c->channels, L = c->num_layers, NH = c->num_heads, hs = C / NH, maxT = c->max_seq_len;
    int V = c->vocab_size, Vp = c->padded_vocab_size, pos = sp->len;
    CHECK(pos < maxT && token >= 0 && token < V, "sampler: token %d at position %d (vocabulary %d, context %d)",
          token, pos, V, maxT);
    cudaStream_t s = sp->stream;
    SamplerTensors& t = sp->t;
    const ParameterTensorsX& p = sp->params;
    /* (the previous step's copies are done: gpu_wait below, so the host token is free) */
    sp->h_token[0] = token;
    CUDA_CHECK(cudaMemcpyAsync(t.token, sp->h_token, sizeof(int), cudaMemcpyHostToDevice, s));
    encoder_forward_gpu(t.x, t.token, p.wte, p.wpe + (size_t)pos * C, 1, 1, C, s); /* wpe from row pos */
    size_t smem = ((size_t)maxT + DECODE_ATTN_THREADS + 32) * sizeof(float);
    int n = sp->plant && pos > 0 ? pos : pos + 1; /* the plant: the newest position left out */
    for (int l = 0; l < L; l++) {
        ParameterTensorsX lp = p; /* layer l's slices of the whole weights */
        floatX** rp = (floatX**)&lp;
        for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) rp[k] += (size_t)l * (sp->param_sizes[k] / L);
        floatX* kc = t.k + (size_t)l * NH * maxT * hs; /* (NH, maxT, hs) */
        floatX* vc = t.v + (size_t)l * NH * maxT * hs;
        layernorm_forward_gpu(t.ln, t.stats, t.stats + 1, t.x, lp.ln1w, lp.ln1b, 1, C, s);
        matmul_forward_gpu(sp->lt, s, t.qkv, t.ln, lp.qkvw, lp.qkvb, NULL, NULL, 1, C, 3 * C);
        kv_append_kernel<<<ceil_div(C, 256), 256, 0, s>>>(kc, vc, t.qkv, pos, maxT, NH, hs);
        KERNEL_CHECK();
        attention_decode_kernel<<<NH, DECODE_ATTN_THREADS, smem, s>>>(t.y, t.qkv, kc, vc, n, maxT, NH, hs);
        KERNEL_CHECK();
        matmul_forward_gpu(sp->lt, s, t.x2, t.y, lp.attprojw, lp.attprojb, t.x, NULL, 1, C, C); /* + residual x */
        layernorm_forward_gpu(t.ln, t.stats, t.stats + 1, t.x2, lp.ln2w, lp.ln2b, 1, C, s);
        matmul_forward_gpu(sp->lt, s, t.fch, t.ln, lp.fcw, lp.fcb, NULL, NULL, 1, C, 4 * C);
        gelu_forward_gpu(t.fch_gelu, t.fch, 4 * (long long)C, s);
        matmul_forward_gpu(sp->lt, s, t.x, t.fch_gelu, lp.fcprojw, lp.fcprojb, t.x2, NULL, 1, 4 * C, C); /* + x2 */
    }
    layernorm_forward_gpu(t.ln, t.stats, t.stats + 1, t.x, p.lnfw, p.lnfb, 1, C, s);
    matmul_forward_gpu(sp->lt, s, t.logits, t.ln, p.wte, NULL, NULL, NULL, 1, C, Vp);
    bf16_to_float_kernel<<<ceil_div(Vp, 256), 256, 0, s>>>(t.logits_f, t.logits, (size_t)Vp);
    KERNEL_CHECK();
    CUDA_CHECK(cudaMemcpyAsync(sp->h_logits, t.logits_f, sizeof(float) * (size_t)V, cudaMemcpyDeviceToHost, s));
    gpu_wait(s, NULL);
    sp->len++;
    return sp->h_logits;
}

static void gpu_sampler_reset(void* self) { ((GpuSampler*)self)->len = 0; }

/* A sampler over whole bf16 weights already on the device (`params`, the
 * trainer's), with the trainer's cuBLASLt context and stream. Takes the
 * cache and its buffers (transient device memory: give them back with
 * gpu_sampler_free before the next step). */
static void gpu_sampler_init(GpuSampler* sp, const GPT2Config* c, const size_t* param_sizes,
                             const ParameterTensorsX* params, LtContext* lt, cudaStream_t stream) {
    memset(sp, 0, sizeof(*sp));
    int hs = c->channels / c->num_heads;
    CHECK(hs <= DECODE_ATTN_THREADS && hs <= ATTN_MAX_HS, "sampler: head size %d is over the %d the decode "
          "attention handles: use more heads", hs, DECODE_ATTN_THREADS);
    sp->config = *c;
    memcpy(sp->param_sizes, param_sizes, sizeof(sp->param_sizes));
    sp->params = *params;
    sp->lt = lt;
    sp->stream = stream;
#ifdef GPTC_TEST_HOOKS
    /* GPTC_SAMPLE_PLANT=last: a planted bug for the tests to catch, the attention without the newest position */
    const char* plant = getenv("GPTC_SAMPLE_PLANT");
    sp->plant = plant && !strcmp(plant, "last");
    if (sp->plant) fprintf(stderr, "sample: GPTC_SAMPLE_PLANT=last: the newest position left out (a planted bug)\n");
#endif
    size_t n[NUM_SAMPLER_TENSORS], bytes[NUM_SAMPLER_TENSORS];
    gpu_sampler_sizes(n, bytes, c);
    sp->memory = gpu_alloc(carve_bytes(n, bytes, NUM_SAMPLER_TENSORS), GMEM_TRANSIENT);
    carve((void**)&sp->t, (char*)sp->memory, n, bytes, NUM_SAMPLER_TENSORS);
    sp->h_token = (int*)ledger_malloc(MEM_SAMPLER, sizeof(int));
    sp->h_logits = (float*)ledger_malloc(MEM_SAMPLER, sizeof(float) * (size_t)c->vocab_size);
    Decoder d = {sp, c->max_seq_len, c->vocab_size, gpu_sampler_reset, gpu_sampler_step};
    sp->d = d;
}

/* --prompt: a sampler with its own bf16 weights (the host model's fp32,
 * rounded to nearest on the device), cuBLASLt context and stream; no
 * training state. */
static void gpu_sampler_init_host(GpuSampler* sp, const GPT2* host) {
    const GPT2Config* c = &host->config;
    size_t P = host->num_parameters;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreate(&s));
    floatX* w = (floatX*)gpu_alloc(P * sizeof(floatX), GMEM_PARAMS);
    float* staged = (float*)gpu_alloc(P * sizeof(float), GMEM_TRANSIENT);
    CUDA_CHECK(cudaMemcpyAsync(staged, host->params_memory, P * sizeof(float), cudaMemcpyHostToDevice, s));
    float_to_bf16_kernel<<<ceil_div((long long)P, 256), 256, 0, s>>>(w, staged, P);
    KERNEL_CHECK();
    gpu_wait(s, NULL);
    gpu_release(staged);
    ParameterTensorsX p;
    parameters_point_x(&p, w, c);
    LtContext lt;
    lt_init(&lt, LT_WORKSPACE_BYTES, LT_BIAS_COPY_ELEMS(c));
    gpu_sampler_init(sp, c, host->param_sizes, &p, NULL, s);
    sp->own_lt = lt;
    sp->lt = &sp->own_lt;
    sp->own_params = w;
    sp->own_stream = 1;
}

static void gpu_sampler_free(GpuSampler* sp) {
    gpu_wait(sp->stream, NULL);
    gpu_release(sp->memory);
    ledger_free(sp->h_token);
    ledger_free(sp->h_logits);
    if (sp->own_params) {
        gpu_release(sp->own_params);
        lt_free(&sp->own_lt);
    }
    if (sp->own_stream) CUDA_CHECK(cudaStreamDestroy(sp->stream));
    memset(sp, 0, sizeof(*sp));
}

/* --prompt on the GPU (gptc_run's PromptFn; ctx: the GpuComm): rank 0
 * generates, the other ranks have nothing to do. 0 or -1. */
static int gpu_prompt(const GPT2* model, const Tokenizer* tok, const Options* o, void* ctx) {
    const GpuComm* cm = (const GpuComm*)ctx;
    if (cm && cm->rank != 0) return 0;
    GpuSampler sp;
    gpu_sampler_init_host(&sp, model);
    int rc = generate_from_prompt(&sp.d, tok, o);
    gpu_sampler_free(&sp);
    return rc;
}

#endif /* GPTC_CUDA_SAMPLE_CUH */
