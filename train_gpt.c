/*
 * train_gpt.c — GPT-2 pretraining on the CPU, in one file.
 *
 * fp32 throughout, OpenMP for the cores. The file reads top to bottom as the
 * story of a training step: load weights and data, run the layers forward,
 * run them backward, update with AdamW, print what the model writes.
 *
 * Build and run (see the Makefile for every flag):
 *   make train_gpt
 *   ./train_gpt --data my_text.txt --model d4 --channels 192 --num-heads 4   # text in, model out
 *   ./train_gpt --model d12 --train-data "data/fineweb_train_*.bin" --steps 20
 *   ./train_gpt --model out/model.bin --prompt "Once upon a time"
 *   ./train_gpt --help            # every flag with its default
 * It also compiles as C++17 (g++ -x c++), so that train_gpt.cu can #include
 * it for all host-side code.
 *
 * Left out on purpose: mixed precision (fp32 only here; bf16 lives in the
 * CUDA twin), flash-style attention (the T x T attention matrix is
 * materialised: at the sequence lengths a CPU trains on it is small next to
 * the logits), and any BLAS (the matmul below is our own).
 *
 * Banners, in order:
 *   1. Utilities         checked calls, timing, random numbers
 *   2. Model files       the llm.c checkpoint format, read and write
 *   3. Tokenizer         GPT-2 byte-level BPE: encode and decode
 *   4. Data              token shards, the data loader; text to shards
 *   5. Matmul            the packed, register-blocked GEMM every layer uses
 *   6. Layers            forward/backward pairs
 *   7. Model             parameters, activations, forward, backward
 *   8. Optimizer         gradient norm and clipping, AdamW, schedules
 *   9. Data parallel     MPI ranks: allreduce, ZeRO-1, ZeRO-2; a rendezvous for NCCL
 *  10. Checkpoints       training states, memory snapshots and replicas, bad steps
 *  11. Sampler           temperature / top-k / top-p; generation with a KV cache
 *  12. CLI               flags, usage, validation
 *  13. main              --data, --prompt, saving and resuming, the training loop
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
#include <sys/mman.h>   /* snapshot slots (section 10) */
#include <fcntl.h>
#include <poll.h>       /* the rendezvous (section 9) */
#include <netdb.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* for the parts only train_gpt.cu and the tests call */
#define MAYBE_UNUSED __attribute__((unused))

#ifdef __cplusplus
#define RESTRICT __restrict__
#else
#define RESTRICT restrict
#endif

/* ------------------------------------------------------------------------ */
/* 1. Utilities                                                             */
/* ------------------------------------------------------------------------ */

/* Fatal check for things that must not fail (memory, internal invariants):
 * prints the failed expression, where, and a hint, then exits. */
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "error: %s:%d: check failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                           \
            fprintf(stderr, "  " __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                              \
            exit(EXIT_FAILURE);                                                 \
        }                                                                       \
    } while (0)

/* "Cannot happen" conditions, named so a reader knows they are invariants. */
#define ALWAYS(cond) CHECK(cond, "internal invariant violated")

/* Recoverable errors in file handling: print "error: <file>: <message>" and
 * return -1 from the enclosing function (which cleans up via goto-free code
 * paths: every reader below frees what it owns before failing). */
#define FILE_ERROR(path, ...)                                                   \
    do {                                                                        \
        fprintf(stderr, "error: %s: ", (path));                                 \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
    } while (0)

static void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

/* 64-byte aligned allocation (one cache line, one AVX-512 vector). */
static float* xmalloc_floats(size_t n) {
    void* p = NULL;
    size_t bytes = (n ? n : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    int rc = posix_memalign(&p, 64, bytes);
    CHECK(rc == 0 && p != NULL, "out of memory allocating %zu floats", n);
    return (float*)p;
}

static double time_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Wall-clock milliseconds since the epoch: comparable across processes, for
 * the recovery timings a supervisor reads (scripts/supervise.py). */
static double unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Size of an open file in bytes, or -1. */
static long long file_size(FILE* f) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return -1;
    return (long long)st.st_size;
}

/* Open a file to read it as `what` ("model file", "data shard", ...): it
 * must be a regular file (a folder opens too, and then reads as 4096 bytes
 * or as a size of 2^63). NULL after a message naming the file. */
static FILE* file_open_read(const char* path, const char* what) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        FILE_ERROR(path, "cannot open %s: %s", what, strerror(errno));
        return NULL;
    }
    struct stat st;
    memset(&st, 0, sizeof(st));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        FILE_ERROR(path, "%s, not a %s: give the path of the file itself",
                   S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file", what);
        fclose(f);
        return NULL;
    }
    return f;
}

/* Read exactly n bytes or report which file came up short. */
static int read_exact(FILE* f, void* dst, size_t n, const char* path) {
    if (fread(dst, 1, n, f) != n) {
        FILE_ERROR(path, "read failed after %ld bytes (wanted %zu more): %s",
                   ftell(f), n, ferror(f) ? strerror(errno) : "unexpected end of file");
        return -1;
    }
    return 0;
}

/* Write a whole file atomically: to "<path>.tmp", fsync, then rename over
 * <path>. A crash or a full disk leaves the previous <path> untouched. */
typedef struct {
    const void* data;
    size_t bytes;
} WriteChunk;

static int write_file_atomic(const char* path, const WriteChunk* chunks, int nchunks) {
    size_t len = strlen(path);
    char* tmp = (char*)xmalloc(len + 5);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE* f = fopen(tmp, "wb");
    if (!f) {
        FILE_ERROR(tmp, "cannot create: %s", strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < nchunks && ok; i++) {
        if (fwrite(chunks[i].data, 1, chunks[i].bytes, f) != chunks[i].bytes) ok = 0;
    }
    if (ok && fflush(f) != 0) ok = 0;
    if (ok && fsync(fileno(f)) != 0) ok = 0;
    int saved_errno = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        FILE_ERROR(path, "write failed (%s); the previous file, if any, is untouched",
                   strerror(saved_errno ? saved_errno : errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        FILE_ERROR(path, "cannot rename %s into place: %s", tmp, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* mkdir -p: create `path` and any missing parents. Returns 0 or -1 (errno set). */
static int mkdir_p(const char* path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) { errno = ENAMETOOLONG; return -1; }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            buf[i] = saved;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

/* A glob pattern for the files `literal` + `wild` (wild: "*.txt", ...):
 * the literal part, a folder the user named ("runs/lr[3e-4]"), has its
 * glob characters escaped, so it matches only itself. */
static void glob_pattern(char* out, size_t cap, const char* literal, const char* wild) {
    size_t n = 0;
    for (const char* p = literal; *p && n + 2 < cap; p++) {
        if (strchr("*?[]\\", *p)) out[n++] = '\\';
        out[n++] = *p;
    }
    snprintf(out + n, cap - n, "%s", wild);
}

/* Random numbers: xorshift64* for bits, Box-Muller for normals. Seeded, so a
 * run is reproducible; the state is one uint64 (easy to checkpoint). */
typedef struct {
    uint64_t state;
} Rng;

static void rng_init(Rng* rng, uint64_t seed) {
    /* splitmix64 of the seed, so nearby seeds give unrelated streams and the
     * state is never zero (xorshift's fixed point). */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    rng->state = z ? z : 0x2545F4914F6CDD1Dull;
}

static uint32_t rng_u32(Rng* rng) {
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

/* uniform in [0, 1) with 24 random bits */
static float rng_uniform(Rng* rng) { return (rng_u32(rng) >> 8) / 16777216.0f; }

/* standard normal, computed in double */
static double rng_normal(Rng* rng) {
    double u1 = ((rng_u32(rng) >> 8) + 1.0) / 16777217.0; /* (0, 1] */
    double u2 = (rng_u32(rng) >> 8) / 16777216.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
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
#define HEADER_INTS 256

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

/* Point the 16 tensor pointers into one flat buffer, in file order. */
static void parameters_point(ParameterTensors* p, float* mem, const GPT2Config* c) {
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    float** ptrs = (float**)p;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        ptrs[i] = mem;
        mem += sizes[i];
    }
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

/* Read an llm.c checkpoint. On success fills *config and returns a freshly
 * allocated fp32 parameter buffer (parameter_count floats) in *params_out.
 * On any problem prints what is wrong with which file and returns -1. */
static int model_file_read(const char* path, GPT2Config* config, float** params_out) {
    *params_out = NULL;
    FILE* f = file_open_read(path, "model file");
    if (!f) return -1;
    int32_t h[HEADER_INTS];
    long long fsize = file_size(f);
    if (fsize < (long long)sizeof(h)) {
        FILE_ERROR(path, "file is %lld bytes, shorter than the 1024-byte header: not a model file", fsize);
        fclose(f);
        return -1;
    }
    if (read_exact(f, h, sizeof(h), path) != 0) { fclose(f); return -1; }
    if (h[0] != MODEL_MAGIC) {
        FILE_ERROR(path, "bad magic %d, expected %d: this is not an llm.c model file "
                   "(a data shard or tokenizer file passed as --model?)", h[0], MODEL_MAGIC);
        fclose(f);
        return -1;
    }
    if (h[1] != MODEL_VERSION_FP32 && h[1] != MODEL_VERSION_BF16) {
        FILE_ERROR(path, "model file version %d; this build reads %d (fp32) and %d (bf16)",
                   h[1], MODEL_VERSION_FP32, MODEL_VERSION_BF16);
        fclose(f);
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
        fclose(f);
        return -1;
    }
    size_t n = parameter_count(&c);
    size_t elem = h[1] == MODEL_VERSION_FP32 ? 4 : 2;
    long long expected = (long long)sizeof(h) + (long long)(n * elem);
    if (fsize != expected) {
        FILE_ERROR(path, "file is %lld bytes but its header (L=%d C=%d Vp=%d maxT=%d, %s) implies %lld: "
                   "truncated or not written completely",
                   fsize, c.num_layers, c.channels, c.padded_vocab_size, c.max_seq_len,
                   elem == 4 ? "fp32" : "bf16", expected);
        fclose(f);
        return -1;
    }
    float* params = (float*)malloc(n * sizeof(float)); /* not xmalloc: a model too big for this machine is named */
    if (!params) {
        FILE_ERROR(path, "its %zu parameters need %.1f GB as fp32, more than this machine can allocate now: free "
                   "memory, or use a machine with more", n, n * 4.0 / 1e9);
        fclose(f);
        return -1;
    }
    if (elem == 4) {
        if (read_exact(f, params, n * 4, path) != 0) { free(params); fclose(f); return -1; }
    } else {
        /* bf16: read in chunks and widen */
        size_t chunk = 1 << 20;
        uint16_t* buf = (uint16_t*)xmalloc(chunk * 2);
        for (size_t i = 0; i < n; i += chunk) {
            size_t m = n - i < chunk ? n - i : chunk;
            if (read_exact(f, buf, m * 2, path) != 0) { free(buf); free(params); fclose(f); return -1; }
            for (size_t j = 0; j < m; j++) params[i + j] = bf16_to_float(buf[j]);
        }
        free(buf);
    }
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(params[i])) {
            FILE_ERROR(path, "parameter %zu is %f: the checkpoint holds non-finite weights", i, params[i]);
            free(params);
            return -1;
        }
    }
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

/* ------------------------------------------------------------------------ */
/* 3. Tokenizer                                                             */
/* ------------------------------------------------------------------------ */
// ----------------------------------------------------------------------------
// Tokenizer: GPT-2's byte-level BPE, encode and decode.
//
// dev/tokenizer/test_tokenizer.c and bench_tokenizer.c include this file to
// test and time this section. The Unicode classes come from the generated
// unicode_tables.h. Every name starts with tokenizer_, Tokenizer, tok_ or
// TOK_ (and unicode_/UNICODE_ in the tables).
//
// Files (written by scripts/tokenizer_files.js, formats documented there):
//   gpt2_tokenizer.bin  llm.c's decode table: magic 20240328, version 2
//   gpt2_merges.bin     our BPE merges:       magic 20261102, version 1
//
// Encoding is token-for-token the reference tokenizer (npm gpt-3-encoder's
// Encoder.js, a port of OpenAI's encoder.py) for every valid UTF-8 string:
//   1. pre-tokenise with GPT-2's regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with JavaScript's \s and node's Unicode tables (unicode_tables.h);
//   2. BPE each pre-token's UTF-8 bytes by merge rank.
// Invalid UTF-8 (no JS string exists for it) is defined as the reference
// would treat a lone surrogate in its place (Python's "surrogateescape"):
// each byte that does not start a valid UTF-8 sequence is one character of
// the [^\s\p{L}\p{N}] class, and keeps its raw byte. So every byte string
// encodes, and decode(encode(x)) == x for all x.
// There are no special tokens: the text "<|endoftext|>" encodes as ordinary
// text; put tok->eot_token between documents yourself.
//
// Thread safety: a loaded Tokenizer is read-only. Encoding needs a
// TokenizerWork (scratch + a cache of recent pre-tokens), one per thread.
// ----------------------------------------------------------------------------

#include "unicode_tables.h" /* generated by scripts/gen_unicode_tables.js */

#define TOKENIZER_MAGIC 20240328       // llm.c's decode file
#define TOKENIZER_VERSION 2
#define TOKENIZER_MERGES_MAGIC 20261102  // our merges file
#define TOKENIZER_MERGES_VERSION 1
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_MAX_VOCAB 65536      // ids must fit the uint16 data shards
#define TOKENIZER_MAX_FILE (256u << 20)  // refuse larger files: not a tokenizer

// tokenizer_init's return values (0 = ok); each comes with a message on stderr
enum {
    TOKENIZER_OK = 0,
    TOKENIZER_ERR_OPEN = -1,       // cannot open or read the file
    TOKENIZER_ERR_MAGIC = -2,      // wrong magic number
    TOKENIZER_ERR_VERSION = -3,    // right magic, unsupported version
    TOKENIZER_ERR_TRUNCATED = -4,  // file ends early
    TOKENIZER_ERR_SIZE = -5,       // header sizes impossible or file too long
    TOKENIZER_ERR_RANGE = -6,      // an id out of range
    TOKENIZER_ERR_MISMATCH = -7,   // merges disagree with the decode table
};

#define TOK_HINT "HINT: re-run scripts/fetch_tokenizer.sh and node scripts/tokenizer_files.js\n"

// allocation that cannot fail quietly: print where and exit
#define TOK_CHECK_ALLOC(p) do { if ((p) == NULL) { \
    fprintf(stderr, "tokenizer: out of memory (%s) at %s:%d\n", #p, __FILE__, __LINE__); \
    exit(EXIT_FAILURE); } } while (0)

// merge table slot: (left, right) pair -> rank and merged token
typedef struct {
    uint32_t key;     // (left << 16) | right: every 32-bit value is a possible pair (ids < 65536)
    int32_t rank;     // lower merges first; TOK_EMPTY_RANK when the slot is unused
    int32_t merged;   // token id of left's bytes followed by right's bytes
} TokenizerPair;
#define TOK_EMPTY_RANK (-1) // ranks are < num_merges <= 65536, never negative

typedef struct {
    // decode table
    uint32_t vocab_size;        // V (50257)
    uint32_t eot_token;         // <|endoftext|> (50256)
    uint32_t* token_offset;     // (V+1) offsets into token_bytes
    char* token_bytes;          // every token's bytes, each followed by a NUL
    // encode tables (can_encode == 0 when no merges file was given)
    int can_encode;
    uint32_t num_merges;        // 50000
    int32_t byte_token[256];    // the one-byte token of each byte value
    TokenizerPair* pairs;       // open addressing, linear probing
    uint32_t pair_mask;         // number of slots - 1 (a power of two)
} Tokenizer;

// ---- small helpers ----

static inline uint32_t tok_read_u32le(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Reads the whole file; returns its size via *size, or prints and returns NULL.
static inline unsigned char* tok_read_file(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { fprintf(stderr, "tokenizer: cannot open %s\n" TOK_HINT, path); return NULL; }
    struct stat st;
    memset(&st, 0, sizeof(st));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fprintf(stderr, "tokenizer: %s %s, not a tokenizer file: give the path of the file itself\n", path,
                S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file");
        fclose(f); return NULL;
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "tokenizer: cannot find the size of %s\n", path); fclose(f); return NULL;
    }
    if ((unsigned long)n > TOKENIZER_MAX_FILE) {
        fprintf(stderr, "tokenizer: %s is %ld bytes, more than any tokenizer file (%u)\n" TOK_HINT,
                path, n, TOKENIZER_MAX_FILE);
        fclose(f); return NULL;
    }
    unsigned char* buf = (unsigned char*)malloc((size_t)n + 1);
    TOK_CHECK_ALLOC(buf);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        fprintf(stderr, "tokenizer: read %zu of %ld bytes of %s\n", got, n, path); free(buf); return NULL;
    }
    *size = (size_t)n;
    return buf;
}

static inline uint32_t tok_pair_hash(uint32_t key, uint32_t mask) {
    return (key * 0x9E3779B1u) >> 7 & mask;   // Fibonacci hashing, mid bits
}

// Slot holding (left, right), or NULL.
static inline const TokenizerPair* tok_pair_find(const Tokenizer* t, uint32_t left, uint32_t right) {
    uint32_t key = left << 16 | right;
    for (uint32_t i = tok_pair_hash(key, t->pair_mask);; i = (i + 1) & t->pair_mask) {
        const TokenizerPair* p = &t->pairs[i];
        if (p->rank == TOK_EMPTY_RANK) return NULL;
        if (p->key == key) return p;
    }
}

// ---- loading ----

static inline void tokenizer_free(Tokenizer* t) {
    free(t->token_offset);
    free(t->token_bytes);
    free(t->pairs);
    memset(t, 0, sizeof(*t));
}

// Checks a 256-int header: file at least 1024 bytes, magic, version.
static inline int tok_check_header(const char* path, const unsigned char* buf, size_t size,
                            uint32_t magic, uint32_t version, const char* what) {
    if (size < 4 * TOKENIZER_HEADER_INTS) {
        fprintf(stderr, "tokenizer: %s is %zu bytes, shorter than the 1024-byte header of a %s file\n" TOK_HINT,
                path, size, what);
        return TOKENIZER_ERR_TRUNCATED;
    }
    uint32_t m = tok_read_u32le(buf), v = tok_read_u32le(buf + 4);
    if (m != magic) {
        fprintf(stderr, "tokenizer: %s has magic %u, a %s file has %u\n" TOK_HINT, path, m, what, magic);
        return TOKENIZER_ERR_MAGIC;
    }
    if (v != version) {
        fprintf(stderr, "tokenizer: %s has version %u, this build reads %s version %u\n" TOK_HINT,
                path, v, what, version);
        return TOKENIZER_ERR_VERSION;
    }
    return TOKENIZER_OK;
}

static inline int tok_load_decode(Tokenizer* t, const char* path, const unsigned char* buf, size_t size) {
    int err = tok_check_header(path, buf, size, TOKENIZER_MAGIC, TOKENIZER_VERSION, "tokenizer (decode)");
    if (err) return err;
    uint32_t n = tok_read_u32le(buf + 8), eot = tok_read_u32le(buf + 12);
    if (n < 256 || n > TOKENIZER_MAX_VOCAB) {
        fprintf(stderr, "tokenizer: %s says %u tokens; need 256..%d (ids are stored as uint16)\n" TOK_HINT,
                path, n, TOKENIZER_MAX_VOCAB);
        return TOKENIZER_ERR_SIZE;
    }
    if (eot >= n) {
        fprintf(stderr, "tokenizer: %s: end-of-text id %u is not below the %u tokens\n" TOK_HINT, path, eot, n);
        return TOKENIZER_ERR_RANGE;
    }
    // one pass to find the total length and check the file ends where it should
    size_t off = 4 * TOKENIZER_HEADER_INTS, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (off >= size) {
            fprintf(stderr, "tokenizer: %s is truncated: it ends at token %u of %u\n" TOK_HINT, path, i, n);
            return TOKENIZER_ERR_TRUNCATED;
        }
        size_t len = buf[off];
        if (len == 0) {
            fprintf(stderr, "tokenizer: %s: token %u has length 0\n" TOK_HINT, path, i);
            return TOKENIZER_ERR_SIZE;
        }
        if (off + 1 + len > size) {
            fprintf(stderr, "tokenizer: %s is truncated inside token %u of %u\n" TOK_HINT, path, i, n);
            return TOKENIZER_ERR_TRUNCATED;
        }
        off += 1 + len;
        total += len + 1;
    }
    if (off != size) {
        fprintf(stderr, "tokenizer: %s has %zu bytes after its %u tokens\n" TOK_HINT, path, size - off, n);
        return TOKENIZER_ERR_SIZE;
    }
    t->vocab_size = n;
    t->eot_token = eot;
    t->token_offset = (uint32_t*)malloc(((size_t)n + 1) * sizeof(uint32_t));
    t->token_bytes = (char*)malloc(total);
    TOK_CHECK_ALLOC(t->token_offset);
    TOK_CHECK_ALLOC(t->token_bytes);
    off = 4 * TOKENIZER_HEADER_INTS;
    uint32_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = buf[off];
        t->token_offset[i] = pos;
        memcpy(t->token_bytes + pos, buf + off + 1, len);
        t->token_bytes[pos + len] = '\0';
        pos += (uint32_t)len + 1;
        off += 1 + len;
    }
    t->token_offset[n] = pos;
    return TOKENIZER_OK;
}

static inline uint32_t tok_token_len(const Tokenizer* t, uint32_t id) {
    return t->token_offset[id + 1] - t->token_offset[id] - 1;
}

// Adds (left, right) -> (rank, merged) after checking it against the vocab.
static inline int tok_add_pair(Tokenizer* t, const char* path, const char* what, uint32_t index,
                        uint32_t left, uint32_t right, uint32_t merged, uint32_t rank) {
    uint32_t n = t->vocab_size;
    if (left >= n || right >= n || merged >= n || rank >= t->num_merges) {
        fprintf(stderr, "tokenizer: %s: %s %u is (%u, %u) -> %u rank %u; ids must be below %u and ranks below %u\n" TOK_HINT,
                path, what, index, left, right, merged, rank, n, t->num_merges);
        return TOKENIZER_ERR_RANGE;
    }
    uint32_t ll = tok_token_len(t, left), lr = tok_token_len(t, right);
    const char* b = t->token_bytes;
    if (tok_token_len(t, merged) != ll + lr ||
        memcmp(b + t->token_offset[merged], b + t->token_offset[left], ll) != 0 ||
        memcmp(b + t->token_offset[merged] + ll, b + t->token_offset[right], lr) != 0) {
        fprintf(stderr, "tokenizer: %s: %s %u joins tokens %u and %u into %u, whose bytes are not theirs: "
                "the merges file does not belong to this decode file\n" TOK_HINT, path, what, index, left, right, merged);
        return TOKENIZER_ERR_MISMATCH;
    }
    uint32_t key = left << 16 | right, i = tok_pair_hash(key, t->pair_mask);
    while (t->pairs[i].rank != TOK_EMPTY_RANK) {
        if (t->pairs[i].key == key) {
            fprintf(stderr, "tokenizer: %s: %s %u repeats the pair (%u, %u)\n" TOK_HINT, path, what, index, left, right);
            return TOKENIZER_ERR_MISMATCH;
        }
        i = (i + 1) & t->pair_mask;
    }
    t->pairs[i].key = key;
    t->pairs[i].rank = (int32_t)rank;
    t->pairs[i].merged = (int32_t)merged;
    return TOKENIZER_OK;
}

static inline int tok_load_merges(Tokenizer* t, const char* path, const unsigned char* buf, size_t size) {
    if (path == NULL) path = "(merges)"; /* never NULL; says so to gcc's -Wformat-overflow */
    int err = tok_check_header(path, buf, size, TOKENIZER_MERGES_MAGIC, TOKENIZER_MERGES_VERSION, "merges");
    if (err) return err;
    uint32_t n = tok_read_u32le(buf + 8), m = tok_read_u32le(buf + 12);
    uint32_t eot = tok_read_u32le(buf + 16), a = tok_read_u32le(buf + 20);
    if (n != t->vocab_size || eot != t->eot_token) {
        fprintf(stderr, "tokenizer: %s is for %u tokens with end-of-text %u, the decode file has %u and %u\n" TOK_HINT,
                path, n, eot, t->vocab_size, t->eot_token);
        return TOKENIZER_ERR_MISMATCH;
    }
    if (m == 0 || m > n || a > m) {
        fprintf(stderr, "tokenizer: %s says %u merges and %u aliases for %u tokens; impossible\n" TOK_HINT, path, m, a, n);
        return TOKENIZER_ERR_SIZE;
    }
    size_t want = 4 * TOKENIZER_HEADER_INTS + 12 * (size_t)m + 16 * (size_t)a;
    if (size != want) {
        fprintf(stderr, "tokenizer: %s is %zu bytes; %u merges and %u aliases need exactly %zu\n" TOK_HINT,
                path, size, m, a, want);
        return size < want ? TOKENIZER_ERR_TRUNCATED : TOKENIZER_ERR_SIZE;
    }
    // the one-byte tokens start every BPE
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    for (uint32_t id = 0; id < n; id++) {
        if (tok_token_len(t, id) != 1) continue;
        unsigned char b = (unsigned char)t->token_bytes[t->token_offset[id]];
        if (t->byte_token[b] >= 0) {
            fprintf(stderr, "tokenizer: the decode file loaded with %s has tokens %d and %u that are both the byte "
                    "0x%02x\n" TOK_HINT, path, t->byte_token[b], id, b);
            return TOKENIZER_ERR_MISMATCH;
        }
        t->byte_token[b] = (int32_t)id;
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_token[b] < 0) {
            fprintf(stderr, "tokenizer: the decode file loaded with %s has no token that is the single byte 0x%02x; "
                    "cannot encode every byte string\n" TOK_HINT, path, b);
            return TOKENIZER_ERR_MISMATCH;
        }
    }
    t->num_merges = m;
    uint32_t slots = 1;
    while (slots < 2 * (m + a)) slots *= 2;   // load factor <= 1/2
    t->pairs = (TokenizerPair*)malloc(slots * sizeof(TokenizerPair));
    TOK_CHECK_ALLOC(t->pairs);
    for (uint32_t i = 0; i < slots; i++) t->pairs[i].rank = TOK_EMPTY_RANK;
    t->pair_mask = slots - 1;
    const unsigned char* p = buf + 4 * TOKENIZER_HEADER_INTS;
    for (uint32_t r = 0; r < m; r++, p += 12) {
        err = tok_add_pair(t, path, "merge", r, tok_read_u32le(p), tok_read_u32le(p + 4), tok_read_u32le(p + 8), r);
        if (err) return err;
    }
    for (uint32_t i = 0; i < a; i++, p += 16) {
        err = tok_add_pair(t, path, "alias", i, tok_read_u32le(p), tok_read_u32le(p + 4), tok_read_u32le(p + 8),
                           tok_read_u32le(p + 12));
        if (err) return err;
    }
    t->can_encode = 1;
    return TOKENIZER_OK;
}

// Loads the decode table and, when merges_path is not NULL, the merges.
// Returns TOKENIZER_OK or a negative TOKENIZER_ERR_* after printing why;
// on error *t is left empty (tokenizer_free is harmless).
static inline int tokenizer_init(Tokenizer* t, const char* decode_path, const char* merges_path) {
    memset(t, 0, sizeof(*t));
    size_t size = 0;
    unsigned char* buf = tok_read_file(decode_path, &size);
    if (buf == NULL) return TOKENIZER_ERR_OPEN;
    int err = tok_load_decode(t, decode_path, buf, size);
    free(buf);
    if (err == TOKENIZER_OK && merges_path != NULL) {
        buf = tok_read_file(merges_path, &size);
        if (buf == NULL) err = TOKENIZER_ERR_OPEN;
        else { err = tok_load_merges(t, merges_path, buf, size); free(buf); }
    }
    if (err != TOKENIZER_OK) tokenizer_free(t);
    return err;
}

// ---- decode ----

// The bytes of token id (NUL-terminated for convenience, but a token may be
// the byte 0 itself, so use *len); NULL and *len = 0 for an unknown id.
static inline const char* tokenizer_decode(const Tokenizer* t, uint32_t id, size_t* len) {
    if (id >= t->vocab_size) { if (len) *len = 0; return NULL; }
    if (len) *len = tok_token_len(t, id);
    return t->token_bytes + t->token_offset[id];
}

// Concatenated bytes of ids[0..n) into out (at most cap bytes written).
// Returns the total length (which may exceed cap: then out holds a prefix),
// or -1 if an id is out of range.
static inline int64_t tokenizer_decode_many(const Tokenizer* t, const int* ids, size_t n, unsigned char* out, size_t cap) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size) return -1;
        uint32_t len = tok_token_len(t, (uint32_t)ids[i]);
        if (total + len <= cap) memcpy(out + total, t->token_bytes + t->token_offset[ids[i]], len);
        else if (total < cap) memcpy(out + total, t->token_bytes + t->token_offset[ids[i]], cap - total);
        total += len;
    }
    return (int64_t)total;
}

// ---- encode: pre-tokenisation ----

// One character: its length in bytes and its class (UNICODE_L/N/SPACE/OTHER).
// A byte that does not start a valid UTF-8 sequence (RFC 3629: shortest
// form, no surrogates, at most U+10FFFF) is one OTHER character.
typedef struct { uint32_t len; uint32_t cls; } TokenizerChar;

static inline uint32_t tok_class_of(uint32_t cp) {
    // binary search for the last run starting at or before cp
    uint32_t lo = 0, hi = UNICODE_NUM_RUNS;   // unicode_runs[0] starts at U+0080
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if ((unicode_runs[mid] >> 2) <= cp) lo = mid; else hi = mid;
    }
    return unicode_runs[lo] & 3;
}

static inline TokenizerChar tok_next_char(const unsigned char* s, size_t n) {
    TokenizerChar c = { 1, UNICODE_OTHER };
    unsigned char b = s[0];
    if (b < 0x80) { c.cls = unicode_ascii_class[b]; return c; }
    uint32_t cp, len;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; cp = b & 0x1Fu; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; cp = b & 0x0Fu; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; cp = b & 0x07u; }
    else return c;                                   // stray continuation, C0, C1, F5..FF
    if (n < len) return c;
    for (uint32_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return c;
        cp = cp << 6 | (s[k] & 0x3Fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||   // overlong, surrogate
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return c;          // overlong, too big
    c.len = len;
    c.cls = tok_class_of(cp);
    return c;
}

// Length in bytes of the pre-token starting at s[0] (n > 0 bytes left):
// GPT-2's regex alternatives tried in order, as the JS regex engine would.
static inline size_t tok_pretoken(const unsigned char* s, size_t n) {
    // 's|'t|'re|'ve|'m|'ll|'d   (lowercase only, like the reference)
    if (s[0] == '\'' && n >= 2) {
        unsigned char a = s[1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (n >= 3 && ((a == 'r' && s[2] == 'e') || (a == 'v' && s[2] == 'e') || (a == 'l' && s[2] == 'l'))) return 3;
    }
    // ' ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+': an optional ' ' then a run of one class
    size_t i = 0;
    TokenizerChar c = tok_next_char(s, n);
    if (s[0] == ' ' && n > 1) {
        TokenizerChar d = tok_next_char(s + 1, n - 1);
        if (d.cls != UNICODE_SPACE) { i = 1; c = d; }
    }
    if (c.cls != UNICODE_SPACE) {
        uint32_t cls = c.cls;
        i += c.len;
        while (i < n) {
            TokenizerChar d = tok_next_char(s + i, n - i);
            if (d.cls != cls) break;
            i += d.len;
        }
        return i;
    }
    // \s+(?!\S) | \s+ : the whole white-space run if it ends the text, else all
    // of it but its last character (which then leads the next pre-token),
    // or just the one character if the run is a single one.
    size_t last = 0;
    while (i < n) {
        TokenizerChar d = tok_next_char(s + i, n - i);
        if (d.cls != UNICODE_SPACE) break;
        last = i;
        i += d.len;
    }
    if (i == n || last == 0) return i;
    return last;
}

// ---- encode: byte-level BPE ----

// A cache of recent short pre-tokens -> ids, direct-mapped (a new entry
// evicts the old one in its slot). Prose repeats its words, so most
// pre-tokens are found here and never reach the BPE loop.
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_WORD 22    // longest cached pre-token, in bytes
typedef struct {
    uint8_t len;                       // 0 = empty
    uint8_t num_ids;
    unsigned char bytes[TOK_CACHE_WORD];
    uint16_t ids[TOK_CACHE_WORD];
} TokenizerCacheEntry;

// heap entry: a candidate merge of symbol pos with the symbol after it
typedef struct { int32_t rank; int32_t pos; int32_t left; int32_t right; } TokenizerCand;

// Per-thread scratch for encoding.
typedef struct {
    TokenizerCacheEntry* cache;        // TOK_CACHE_SLOTS entries
    int32_t* sym;                      // symbol ids, indexed by the byte where the symbol starts
    int32_t* next;                     // next symbol's start, or -1
    int32_t* prev;                     // previous symbol's start, or -1
    TokenizerCand* heap;               // candidate merges, min-heap by (rank, pos)
    TokenizerCand* round;              // the candidates of the current rank
    size_t cap;                        // bytes the arrays above can hold
} TokenizerWork;

static inline void tokenizer_work_init(TokenizerWork* w) {
    memset(w, 0, sizeof(*w));
    w->cache = (TokenizerCacheEntry*)calloc(TOK_CACHE_SLOTS, sizeof(TokenizerCacheEntry));
    TOK_CHECK_ALLOC(w->cache);
}

static inline void tokenizer_work_free(TokenizerWork* w) {
    free(w->cache); free(w->sym); free(w->next); free(w->prev); free(w->heap); free(w->round);
    memset(w, 0, sizeof(*w));
}

static inline void tok_work_reserve(TokenizerWork* w, size_t n) {
    if (n <= w->cap) return;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    free(w->sym); free(w->next); free(w->prev); free(w->heap); free(w->round);
    w->sym = (int32_t*)malloc(cap * sizeof(int32_t));
    w->next = (int32_t*)malloc(cap * sizeof(int32_t));
    w->prev = (int32_t*)malloc(cap * sizeof(int32_t));
    // at most n-1 initial candidates + 2 per merge (n-1 merges)
    w->heap = (TokenizerCand*)malloc(3 * cap * sizeof(TokenizerCand));
    w->round = (TokenizerCand*)malloc(cap * sizeof(TokenizerCand));
    TOK_CHECK_ALLOC(w->sym); TOK_CHECK_ALLOC(w->next); TOK_CHECK_ALLOC(w->prev);
    TOK_CHECK_ALLOC(w->heap); TOK_CHECK_ALLOC(w->round);
    w->cap = cap;
}

static inline int tok_cand_less(const TokenizerCand* a, const TokenizerCand* b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static inline void tok_heap_push(TokenizerCand* h, size_t* n, TokenizerCand c) {
    size_t i = (*n)++;
    while (i > 0 && tok_cand_less(&c, &h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = c;
}

static inline TokenizerCand tok_heap_pop(TokenizerCand* h, size_t* n) {
    TokenizerCand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && tok_cand_less(&h[c + 1], &h[c])) c++;
        if (!tok_cand_less(&h[c], &last)) break;
        h[i] = h[c]; i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

// Pushes the merge of symbol pos with its successor, if that pair has a rank.
static inline void tok_push_pair(const Tokenizer* t, TokenizerWork* w, size_t* nheap, int32_t pos) {
    if (pos < 0 || w->next[pos] < 0) return;
    int32_t nx = w->next[pos];
    const TokenizerPair* p = tok_pair_find(t, (uint32_t)w->sym[pos], (uint32_t)w->sym[nx]);
    if (p == NULL) return;
    TokenizerCand c = { p->rank, pos, w->sym[pos], w->sym[nx] };
    tok_heap_push(w->heap, nheap, c);
}

// Is candidate c still the pair at its position?
static inline int tok_cand_valid(const TokenizerWork* w, const TokenizerCand* c) {
    int32_t nx = w->next[c->pos];
    return w->sym[c->pos] == c->left && nx >= 0 && w->sym[nx] == c->right;
}

// BPE of one pre-token s[0..n), appending ids to out; returns how many.
//
// The reference repeats rounds until no adjacent pair has a rank: find the
// lowest rank among the adjacent pairs; if several different pairs share it
// (only the alias pairs, see scripts/tokenizer_files.js) take the rightmost;
// replace every occurrence of that pair, left to right, without overlaps.
// Done here with a heap of candidate pairs keyed by (rank, position), so a
// long pre-token (a page of CJK, a run of '=') costs O(n log n), not O(n^2).
// Where the time goes: the heap, and one hash probe per new adjacent pair.
static inline size_t tok_bpe(const Tokenizer* t, TokenizerWork* w, const unsigned char* s, size_t n, int* out) {
    tok_work_reserve(w, n);
    for (size_t i = 0; i < n; i++) {
        w->sym[i] = t->byte_token[s[i]];
        w->next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        w->prev[i] = (int32_t)i - 1;
    }
    size_t nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) tok_push_pair(t, w, &nheap, (int32_t)i);
    while (nheap > 0) {
        // gather the still-valid candidates of the lowest rank, in position order
        int32_t rank = w->heap[0].rank;
        size_t nround = 0;
        while (nheap > 0 && w->heap[0].rank == rank) {
            TokenizerCand c = tok_heap_pop(w->heap, &nheap);
            if (tok_cand_valid(w, &c)) w->round[nround++] = c;
        }
        if (nround == 0) continue;
        // the pair to merge this round: the rightmost one (they are the same
        // pair unless an alias shares the rank; the others wait a round)
        int32_t left = w->round[nround - 1].left, right = w->round[nround - 1].right;
        const TokenizerPair* p = tok_pair_find(t, (uint32_t)left, (uint32_t)right);
        for (size_t k = 0; k < nround; k++) {
            TokenizerCand c = w->round[k];
            if (c.left != left || c.right != right) { tok_heap_push(w->heap, &nheap, c); continue; }
            if (!tok_cand_valid(w, &c)) continue;      // overlapped by the previous merge ("aaa")
            int32_t nx = w->next[c.pos];
            w->sym[c.pos] = p->merged;
            w->sym[nx] = -1;                           // absorbed
            w->next[c.pos] = w->next[nx];
            if (w->next[nx] >= 0) w->prev[w->next[nx]] = c.pos;
            // new neighbours; their ranks differ from this one (the merged
            // token is longer than either half), so they wait for later rounds
            tok_push_pair(t, w, &nheap, w->prev[c.pos]);
            tok_push_pair(t, w, &nheap, c.pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = w->next[i]) out[k++] = w->sym[i];
    return k;
}

static inline uint32_t tok_hash_bytes(const unsigned char* s, size_t n) {
    uint32_t h = 2166136261u;                          // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

// Encodes one pre-token, through the cache when it is short.
static inline size_t tok_encode_pretoken(const Tokenizer* t, TokenizerWork* w, const unsigned char* s, size_t n, int* out) {
    if (n == 1) { out[0] = t->byte_token[s[0]]; return 1; }
    if (n > TOK_CACHE_WORD) return tok_bpe(t, w, s, n, out);
    TokenizerCacheEntry* e = &w->cache[tok_hash_bytes(s, n) & (TOK_CACHE_SLOTS - 1)];
    if (e->len == n && memcmp(e->bytes, s, n) == 0) {
        for (size_t i = 0; i < e->num_ids; i++) out[i] = e->ids[i];
        return e->num_ids;
    }
    size_t k = tok_bpe(t, w, s, n, out);
    e->len = (uint8_t)n;
    e->num_ids = (uint8_t)k;
    memcpy(e->bytes, s, n);
    for (size_t i = 0; i < k; i++) e->ids[i] = (uint16_t)out[i];
    return k;
}

// Encodes text[0..len) (any bytes) into out, writing at most cap ids.
// Returns the number of ids the text encodes to; when that exceeds cap only
// the first cap were written (call again with more room). A text never needs
// more ids than it has bytes, so cap = len always suffices.
// w: this thread's TokenizerWork, or NULL to use a temporary one (slower).
static inline size_t tokenizer_encode(const Tokenizer* t, TokenizerWork* w, const unsigned char* text, size_t len,
                               int* out, size_t cap) {
    if (!t->can_encode) {
        fprintf(stderr, "tokenizer: encode needs the merges file; pass it to tokenizer_init\n" TOK_HINT);
        exit(EXIT_FAILURE);
    }
    TokenizerWork tmp;
    if (w == NULL) { tokenizer_work_init(&tmp); w = &tmp; }
    int small[TOK_CACHE_WORD];   // ids of a short pre-token, when out is nearly full
    size_t count = 0;
    for (size_t i = 0; i < len;) {
        size_t n = tok_pretoken(text + i, len - i);
        if (count + n <= cap) {
            count += tok_encode_pretoken(t, w, text + i, n, out + count);
        } else {
            // out may be too small: go through a buffer sized for the pre-token
            int* ids = n <= TOK_CACHE_WORD ? small : (int*)malloc(n * sizeof(int));
            TOK_CHECK_ALLOC(ids);
            size_t k = tok_encode_pretoken(t, w, text + i, n, ids);
            for (size_t j = 0; j < k; j++) if (count + j < cap) out[count + j] = ids[j];
            count += k;
            if (ids != small) free(ids);
        }
        i += n;
    }
    if (w == &tmp) tokenizer_work_free(&tmp);
    return count;
}

// Encodes ndocs documents in parallel (OpenMP over documents, one
// TokenizerWork per thread): document d is texts[d][0..lens[d]) and goes to
// outs[d] (room for caps[d] ids); counts[d] gets its tokenizer_encode result.
// No end-of-text tokens are added.
static inline void tokenizer_encode_many(const Tokenizer* t, size_t ndocs, const unsigned char* const* texts,
                                  const size_t* lens, int* const* outs, const size_t* caps, size_t* counts) {
#ifdef _OPENMP
    #pragma omp parallel
#endif
    {
        TokenizerWork w;
        tokenizer_work_init(&w);
#ifdef _OPENMP
        #pragma omp for schedule(dynamic, 16)
#endif
        for (long long d = 0; d < (long long)ndocs; d++) {
            counts[d] = tokenizer_encode(t, &w, texts[d], lens[d], outs[d], caps[d]);
        }
        tokenizer_work_free(&w);
    }
}

// Print a token's bytes, replacing control bytes (except whitespace) so a
// random model cannot garble the terminal.
static void tokenizer_print(const Tokenizer* t, int id) {
    size_t len = 0;
    const char* s = id >= 0 ? tokenizer_decode(t, (uint32_t)id, &len) : NULL;
    if (!s) {
        printf("<%d>", id);
        return;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 32 && ch != '\n' && ch != '\t' && ch != '\r') putchar('?');
        else putchar(ch);
    }
}

/* ------------------------------------------------------------------------ */
/* 4. Data                                                                  */
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

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1

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
    free(d->shard_tokens);
    free(d->tokens);
    free(d->shard_order);
    free(d->sample_order);
    free(d->inputs);
    free(d->targets);
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
    free(d->tokens);
    d->tokens = (uint16_t*)xmalloc((size_t)n * 2);
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
    free(d->sample_order);
    d->sample_order = (long long*)xmalloc(sizeof(long long) * (size_t)(d->num_samples > 0 ? d->num_samples : 1));
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
    d->shard_tokens = (long long*)xmalloc(sizeof(long long) * (size_t)d->num_shards);
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
    d->shard_order = (int*)xmalloc(sizeof(int) * (size_t)d->num_shards);
    d->inputs = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    d->targets = (int*)xmalloc(sizeof(int) * (size_t)B * T);
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

/* ---- Text to shards ---------------------------------------------------- */
/* Turning raw text into the shards above. Inputs:
 *   - a .jsonl file: one JSON object per line, the document is its "text"
 *     string field (a line without one is an error naming the line);
 *   - a directory: every *.txt file in it (sorted by name), each split as below;
 *   - any other file, as text: documents are separated by two or more
 *     consecutive blank lines (a blank line holds only spaces, tabs or \r);
 *     a single blank line is a paragraph break inside a document. A file
 *     without such a gap is one document.
 * Every document is encoded (in parallel) and preceded by the end-of-text
 * token. The validation split is the first documents of the stream, up to
 * the first document boundary at or after val_fraction of all tokens (5% by
 * default); when that boundary lies beyond twice val_fraction (one long
 * document, say), the split is exactly at val_fraction of the tokens. Shards hold shard_tokens
 * tokens each (the last one the rest), named <prefix>_val_000000.bin and
 * <prefix>_train_000000.bin, _000001, ... */

typedef struct {
    char* text;  /* owned */
    size_t len;
} Document;

typedef struct {
    Document* docs;
    size_t n, cap;
} DocumentList;

static void documents_add(DocumentList* l, const char* text, size_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->docs = (Document*)realloc(l->docs, l->cap * sizeof(Document));
        CHECK(l->docs != NULL, "out of memory for %zu documents", l->cap);
    }
    Document* d = &l->docs[l->n++];
    d->text = (char*)xmalloc(len + 1);
    memcpy(d->text, text, len);
    d->text[len] = '\0';
    d->len = len;
}

static void documents_free(DocumentList* l) {
    for (size_t i = 0; i < l->n; i++) free(l->docs[i].text);
    free(l->docs);
    memset(l, 0, sizeof(*l));
}

/* Whole file into memory (NUL-terminated). NULL after a message on failure. */
static char* file_read_all(const char* path, size_t* len) {
    FILE* f = file_open_read(path, "file");
    if (!f) return NULL;
    long long size = file_size(f);
    if (size < 0) {
        FILE_ERROR(path, "cannot stat: %s", strerror(errno));
        fclose(f);
        return NULL;
    }
    char* buf = (char*)xmalloc((size_t)size + 1);
    if (read_exact(f, buf, (size_t)size, path) != 0) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[size] = '\0';
    *len = (size_t)size;
    return buf;
}

static int line_is_blank(const char* s, const char* end) {
    for (; s < end; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r') return 0;
    return 1;
}

/* Split text into documents at runs of >= 2 blank lines (see above). */
static void documents_split_text(DocumentList* l, const char* text, size_t len) {
    const char* end = text + len;
    const char* doc_start = NULL; /* first non-blank line of the current document */
    const char* doc_end = NULL;   /* end of its last non-blank line */
    int blank_run = 0;
    for (const char* line = text; line < end;) {
        const char* nl = (const char*)memchr(line, '\n', (size_t)(end - line));
        const char* line_end = nl ? nl : end;
        if (line_is_blank(line, line_end)) {
            blank_run++;
        } else {
            if (doc_start && blank_run >= 2) {
                documents_add(l, doc_start, (size_t)(doc_end - doc_start));
                doc_start = NULL;
            }
            if (!doc_start) doc_start = line;
            doc_end = line_end;
            blank_run = 0;
        }
        line = nl ? nl + 1 : end;
    }
    if (doc_start) documents_add(l, doc_start, (size_t)(doc_end - doc_start));
}

/* Append the UTF-8 encoding of code point cp. */
static size_t utf8_put(char* out, uint32_t cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | cp >> 6); out[1] = (char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12); out[1] = (char)(0x80 | ((cp >> 6) & 63)); out[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18); out[1] = (char)(0x80 | ((cp >> 12) & 63));
    out[2] = (char)(0x80 | ((cp >> 6) & 63)); out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static int hex4(const char* s, uint32_t* v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* A small JSON reader, enough to find one string field of an object on one
 * line: it skips any other value (nested objects, arrays, numbers, literals)
 * and decodes the field's string with all escapes (\uXXXX with surrogate
 * pairs; a lone surrogate becomes U+FFFD). *p walks [*p, end). */
static void json_space(const char** p, const char* end) {
    while (*p < end && (**p == ' ' || **p == '\t' || **p == '\r' || **p == '\n')) (*p)++;
}

/* Parse a string at *p (which must point at its opening quote). If out is
 * not NULL, writes the decoded bytes (at most the raw length). Returns the
 * decoded length, or -1 if malformed. */
static long json_string(const char** p, const char* end, char* out) {
    const char* s = *p;
    if (s >= end || *s != '"') return -1;
    s++;
    long n = 0;
    while (s < end && *s != '"') {
        if ((unsigned char)*s < 0x20) return -1;
        if (*s != '\\') {
            if (out) out[n] = *s;
            n++;
            s++;
            continue;
        }
        if (++s >= end) return -1;
        char c = *s++;
        const char* simple = strchr("\"\\/bfnrt", c);
        if (simple && c) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            if (out) out[n] = decoded[simple - "\"\\/bfnrt"];
            n++;
        } else if (c == 'u') {
            uint32_t cp;
            if (end - s < 4 || hex4(s, &cp) != 0) return -1;
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && end - s >= 6 && s[0] == '\\' && s[1] == 'u') {
                uint32_t lo;
                if (hex4(s + 2, &lo) == 0 && lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    s += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* lone surrogate */
            char buf[4];
            size_t k = utf8_put(buf, cp);
            if (out) memcpy(out + n, buf, k);
            n += (long)k;
        } else {
            return -1;
        }
    }
    if (s >= end) return -1;
    *p = s + 1;
    return n;
}

/* Why the line is not valid JSON, for the error message: the first
 * problem found (static text), and where (*at). */
typedef struct {
    const char* why;
    const char* at;
} JsonError;

static int json_fail(JsonError* e, const char* why, const char* at) {
    if (!e->why) { e->why = why; e->at = at; }
    return -1;
}

/* A number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int json_number(const char** p, const char* end) {
    const char* s = *p;
    if (s < end && *s == '-') s++;
    if (s < end && *s == '0') s++;
    else if (s < end && *s >= '1' && *s <= '9') while (s < end && *s >= '0' && *s <= '9') s++;
    else return -1;
    if (s < end && *s == '.') {
        if (++s >= end || *s < '0' || *s > '9') return -1;
        while (s < end && *s >= '0' && *s <= '9') s++;
    }
    if (s < end && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < end && (*s == '+' || *s == '-')) s++;
        if (s >= end || *s < '0' || *s > '9') return -1;
        while (s < end && *s >= '0' && *s <= '9') s++;
    }
    *p = s;
    return 0;
}

#define JSON_MAX_DEPTH 64

/* Skip one JSON value of any kind. 0 on success, -1 (and *e) if malformed. */
static int json_skip(const char** p, const char* end, int depth, JsonError* e) {
    json_space(p, end);
    if (*p >= end) return json_fail(e, "a value is missing", *p);
    if (depth > JSON_MAX_DEPTH) return json_fail(e, "objects and arrays nested too deep (more than 64 levels)", *p);
    char c = **p;
    if (c == '"') return json_string(p, end, NULL) < 0 ? json_fail(e, "a string is malformed or unterminated", *p) : 0;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        (*p)++;
        json_space(p, end);
        if (*p < end && **p == close) { (*p)++; return 0; }
        for (;;) {
            if (c == '{') {
                json_space(p, end);
                if (json_string(p, end, NULL) < 0) return json_fail(e, "a key is not a string", *p);
                json_space(p, end);
                if (*p >= end || **p != ':') return json_fail(e, "a ':' is missing after a key", *p);
                (*p)++;
            }
            if (json_skip(p, end, depth + 1, e) != 0) return -1;
            json_space(p, end);
            if (*p < end && **p == ',') { (*p)++; continue; }
            if (*p < end && **p == close) { (*p)++; return 0; }
            return json_fail(e, c == '{' ? "a ',' or '}' is missing" : "a ',' or ']' is missing", *p);
        }
    }
    static const char* const literals[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(literals[i]);
        if ((size_t)(end - *p) >= k && memcmp(*p, literals[i], k) == 0) { *p += k; return 0; }
    }
    if (json_number(p, end) == 0) return 0;
    return json_fail(e, "a value is not JSON (a string, number, object, array, true, false or null)", *p);
}

/* Read the line [line, end) as exactly one JSON object (nothing but white
 * space after it) and find its string field `key`. Returns the field's
 * decoded length and a malloc'd copy in *value; -1 (and *e) if the line is
 * not one valid JSON object; -2 if the object has no such string field. */
static long json_object_field(const char* line, const char* end, const char* key, char** value, JsonError* e) {
    const char* p = line;
    *value = NULL;
    json_space(&p, end);
    if (p >= end || *p != '{') return json_fail(e, "the line does not start a JSON object ('{')", p);
    p++;
    json_space(&p, end);
    size_t klen = strlen(key);
    long found = -2;
    if (p < end && *p == '}') p++;
    else for (;;) {
        json_space(&p, end);
        const char* kstart = p;
        char kbuf[64];
        long kl = json_string(&p, end, NULL);
        if (kl < 0) { json_fail(e, "a key is not a string", kstart); goto bad; }
        int match = 0;
        if ((size_t)kl == klen && kl < (long)sizeof(kbuf)) {
            const char* q = kstart;
            json_string(&q, end, kbuf);
            match = memcmp(kbuf, key, klen) == 0;
        }
        json_space(&p, end);
        if (p >= end || *p != ':') { json_fail(e, "a ':' is missing after a key", p); goto bad; }
        p++;
        json_space(&p, end);
        if (match && found >= 0) { json_fail(e, "the field appears twice", kstart); goto bad; }
        int was_string = p < end && *p == '"';
        if (match && p < end && *p == '"') {
            const char* q = p;
            long n = json_string(&q, end, NULL);
            if (n < 0) { json_fail(e, "a string is malformed or unterminated", p); goto bad; }
            *value = (char*)xmalloc((size_t)n + 1);
            json_string(&p, end, *value);
            (*value)[n] = '\0';
            found = n;
        } else if (json_skip(&p, end, 1, e) != 0) {
            goto bad;
        }
        json_space(&p, end);
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') { p++; break; }
        /* after a string, most often a '"' inside the text that was not escaped as \" */
        json_fail(e, p >= end     ? "the object is not closed on this line ('}' missing)"
                     : was_string ? "a ',' or '}' is missing after a string (an unescaped '\"' inside it?)"
                                  : "a ',' or '}' is missing after a value", p);
        goto bad;
    }
    json_space(&p, end);
    if (p < end) { json_fail(e, "more follows the object on the same line (one object per line)", p); goto bad; }
    return found;
bad:
    free(*value);
    *value = NULL;
    return -1;
}

static int ends_with(const char* s, const char* suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Read the documents of `path` (a .jsonl file, a directory of .txt files,
 * or a text file). Returns 0, or -1 after a message. */
static int documents_read(DocumentList* l, const char* path) {
    memset(l, 0, sizeof(*l));
    struct stat st;
    if (stat(path, &st) != 0) {
        FILE_ERROR(path, "cannot read: %s", strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char pattern[8300];
        glob_pattern(pattern, sizeof(pattern), path, "/*.txt");
        glob_t g;
        if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
            FILE_ERROR(path, "directory holds no .txt files");
            return -1;
        }
        for (size_t i = 0; i < g.gl_pathc; i++) {
            size_t len;
            char* text = file_read_all(g.gl_pathv[i], &len);
            if (!text) { globfree(&g); documents_free(l); return -1; }
            documents_split_text(l, text, len);
            free(text);
        }
        globfree(&g);
    } else {
        size_t len;
        char* text = file_read_all(path, &len);
        if (!text) return -1;
        if (ends_with(path, ".jsonl")) {
            long line_no = 0;
            for (const char* line = text; line < text + len;) {
                const char* nl = (const char*)memchr(line, '\n', (size_t)(text + len - line));
                const char* line_end = nl ? nl : text + len;
                line_no++;
                if (!line_is_blank(line, line_end)) {
                    char* value = NULL;
                    JsonError e = {NULL, NULL};
                    long n = json_object_field(line, line_end, "text", &value, &e);
                    if (n < 0) {
                        if (n == -1)
                            fprintf(stderr, "error: %s:%ld: column %ld: %s; each line must be one JSON object with a "
                                    "\"text\" string field\n", path, line_no, (long)(e.at - line) + 1, e.why);
                        else
                            fprintf(stderr, "error: %s:%ld: the object has no \"text\" string field (each line needs "
                                    "one)\n", path, line_no);
                        free(text);
                        documents_free(l);
                        return -1;
                    }
                    documents_add(l, value, (size_t)n);
                    free(value);
                }
                line = nl ? nl + 1 : text + len;
            }
        } else {
            documents_split_text(l, text, len);
        }
        free(text);
    }
    if (l->n == 0) {
        FILE_ERROR(path, "holds no text (empty, or only blank lines)");
        documents_free(l);
        return -1;
    }
    return 0;
}

/* Encode every document, each preceded by the end-of-text token, into one
 * token stream (uint16: the vocabulary must fit). Documents are encoded in
 * parallel. Returns the stream (malloc'd) and its length; *doc_starts gets
 * the stream index where each document's EOT sits (ndocs + 1 entries, the
 * last = length). */
static uint16_t* documents_encode(const Tokenizer* tok, const DocumentList* l, size_t* ntokens, size_t** doc_starts) {
    CHECK(tok->vocab_size <= 65536, "a vocabulary of %u does not fit uint16 shards", tok->vocab_size);
    size_t n = l->n;
    const unsigned char** texts = (const unsigned char**)xmalloc(n * sizeof(*texts));
    size_t* lens = (size_t*)xmalloc(n * sizeof(size_t));
    int** outs = (int**)xmalloc(n * sizeof(int*));
    size_t* counts = (size_t*)xmalloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        texts[i] = (const unsigned char*)l->docs[i].text;
        lens[i] = l->docs[i].len;
        outs[i] = (int*)xmalloc((lens[i] ? lens[i] : 1) * sizeof(int)); /* never more ids than bytes */
    }
    tokenizer_encode_many(tok, n, texts, lens, outs, lens, counts);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += 1 + counts[i];
    uint16_t* stream = (uint16_t*)xmalloc(total * sizeof(uint16_t));
    size_t* starts = (size_t*)xmalloc((n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        ALWAYS(counts[i] <= lens[i]);
        starts[i] = k;
        stream[k++] = (uint16_t)tok->eot_token;
        for (size_t j = 0; j < counts[i]; j++) stream[k++] = (uint16_t)outs[i][j];
        free(outs[i]);
    }
    starts[n] = k;
    free(texts); free(lens); free(outs); free(counts);
    *ntokens = total;
    *doc_starts = starts;
    return stream;
}

/* Write tokens[0..n) as one llm.c shard, atomically. */
static int shard_write(const char* path, const uint16_t* tokens, size_t n) {
    CHECK(n <= 0x7FFFFFFF, "shard of %zu tokens: the header holds an int32", n);
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = SHARD_MAGIC;
    h[1] = SHARD_VERSION;
    h[2] = (int32_t)n;
    WriteChunk chunks[2];
    chunks[0].data = h;
    chunks[0].bytes = sizeof(h);
    chunks[1].data = tokens;
    chunks[1].bytes = n * sizeof(uint16_t);
    return write_file_atomic(path, chunks, 2);
}

typedef struct {
    size_t val_tokens, train_tokens;
    int val_shards, train_shards;
    size_t documents;
} ShardStats;

/* The whole preparation: read, encode, split, write. 0 or -1. */
static int prepare_shards(const char* input, const char* prefix, const Tokenizer* tok, double val_fraction,
                          size_t shard_tokens, ShardStats* stats) {
    memset(stats, 0, sizeof(*stats));
    if (!tok->can_encode) {
        fprintf(stderr, "error: preparing data needs the tokenizer's merges file\n" TOK_HINT);
        return -1;
    }
    DocumentList docs;
    if (documents_read(&docs, input) != 0) return -1;
    size_t n = 0, *starts = NULL;
    uint16_t* stream = documents_encode(tok, &docs, &n, &starts);
    /* validation split: first boundary at or after val_fraction of the tokens */
    size_t want = (size_t)ceil(val_fraction * (double)n), cut = n;
    for (size_t i = 1; i < docs.n; i++)
        if (starts[i] >= want) { cut = starts[i]; break; }
    if (cut > 2 * want) cut = want; /* no boundary near: cut inside a document */
    if (val_fraction <= 0.0) cut = 0;
    stats->documents = docs.n;
    documents_free(&docs);
    free(starts);
    int rc = 0;
    char path[4400];
    if (cut > 0) {
        snprintf(path, sizeof(path), "%s_val_%06d.bin", prefix, 0);
        rc |= shard_write(path, stream, cut);
        stats->val_shards = 1;
        stats->val_tokens = cut;
    }
    for (size_t at = cut; at < n && rc == 0; at += shard_tokens) {
        size_t m = n - at < shard_tokens ? n - at : shard_tokens;
        snprintf(path, sizeof(path), "%s_train_%06d.bin", prefix, stats->train_shards);
        rc |= shard_write(path, stream + at, m);
        stats->train_shards++;
        stats->train_tokens += m;
    }
    free(stream);
    return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* 5. Matmul                                                                */
/* ------------------------------------------------------------------------ */
// ----------------------------------------------------------------------------
// matmul: one fp32 GEMM engine for every product in the model
//
//   C(M,N) = (accumulate ? C : 0) + A(M,K) . B(K,N)
//
// Every operand is addressed by a row stride and a column stride, so the
// transposes of the forward and backward passes are only swapped strides:
//   A(i,k) = A[i*a_rs + k*a_cs]   B(k,j) = B[k*b_rs + j*b_cs]   C(i,j) = C[i*ldc + j]
//
// The layout follows Goto & van de Geijn, "Anatomy of High-Performance Matrix
// Multiplication" (ACM TOMS 2008), and the BLIS papers (Van Zee & van de Geijn
// 2015, Low et al. 2016); the code is our own. Five loops around a micro-kernel:
//   jc over N in NC-column panels
//    pc over K in KC-deep slices:   pack B(pc:+KC, jc:+NC) -> Bp   (L3)
//     ic over M in MC-row blocks:   pack A(ic:+MC, pc:+KC) -> Ap   (L2)
//      ir over MR-row micro-panels of Ap                           (L1)
//       jr over NR-column micro-panels of Bp                       (streamed)
//        micro-kernel: an MR x NR tile of C held in registers, KC rank-1 updates
// Packing copies any strided layout into contiguous, 64-byte aligned panels,
// zero-padded to whole micro-panels, so the micro-kernel is one code path for
// every shape and transpose, and reads memory strictly sequentially.
//
// Determinism: threads split the *output* (rows or columns of C), never K.
// Each C(i,j) is the same chain of fmaf()s in the same order whichever thread
// computes it, so results are bitwise identical for any thread count.
//
// Where the time goes: in gemm_kernel's k loop, 16 vfmadd231ps zmm per step
// (MR=8 broadcasts of A times NR/16=2 vectors of B), 85-95% of the time.
// Packing is O(MK + KN) against O(MNK) FLOPs: the rest.
// ----------------------------------------------------------------------------

#ifdef _OPENMP
#endif

// Micro-tile: MR rows x NR columns of C, held in MR*NR/16 = 16 zmm registers,
// plus 2 for the B vectors and 1 for the A broadcast. NR runs along the
// contiguous dimension of C, so it is a multiple of the 16-float vector.
// 8 x 32 divides every GPT-2 size (C, 3C, 4C, Vp, T, hs = 64), so no tile is
// padding. Measured on Zen 4: as fast as 8 x 48 (24 accumulators) on the big
// products, and 1.35x faster where N = hs = 64 (8 x 48 pads 64 to 96).
#ifndef GEMM_MR
#define GEMM_MR 8
#endif
#ifndef GEMM_NR
#define GEMM_NR 32
#endif
// Cache blocks (Zen 4: 32 KiB L1 and 1 MiB L2 per core, 32 MiB shared L3):
// an A micro-panel (KC*MR*4 = 12 KiB) stays in L1 while the kernel streams the
// B panel (KC*NC*4 = 4.5 MiB) from L3 in address order, which the prefetchers
// keep up with. A large NC means A is repacked only N/NC times; measured
// faster than an L2-sized B panel (NC = 480) by 3-10% on the GPT-2 shapes.
#ifndef GEMM_KC
#define GEMM_KC 384
#endif
#ifndef GEMM_MC
#define GEMM_MC 192                  // multiple of MR
#endif
#ifndef GEMM_NC
#define GEMM_NC 3072                 // multiple of NR
#endif
#if GEMM_NR % 16 || GEMM_MC % GEMM_MR || GEMM_NC % GEMM_NR
#error "gemm: NR must be a multiple of 16 floats, MC of MR, NC of NR"
#endif
// Below this many multiply-adds a thread team costs more than it saves.
#define GEMM_MIN_PARALLEL_MACS (1L << 18)

// fmaf(a, b, c) = a*b + c with one rounding. gcc vectorizes it to vfmadd231ps
// where the target has FMA (-march=native); without FMA hardware it would be a
// libm call per element, so there we fall back to a multiply and an add.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define GEMM_FMA(a, b, c) fmaf(a, b, c)
#else
#define GEMM_FMA(a, b, c) ((a) * (b) + (c))
#endif

#ifdef __cplusplus
#define GEMM_THREAD_LOCAL thread_local
#else
#define GEMM_THREAD_LOCAL _Thread_local
#endif

static int gemm_min(int a, int b) { return a < b ? a : b; }

// Per-thread packing buffers (KC*(MC+NC)*4 = 4.8 MB), allocated on a thread's
// first call and reused by all its later calls for the life of the process
// (OpenMP keeps its threads alive). Thread-local, so concurrent calls with
// threaded=0 never share a buffer.
static float* gemm_buffers(void) {
    static GEMM_THREAD_LOCAL float* buf = NULL;
    if (buf == NULL) {
        size_t bytes = sizeof(float) * (size_t)GEMM_KC * (GEMM_MC + GEMM_NC);
        buf = (float*)aligned_alloc(64, bytes);  // bytes is a multiple of 64
        if (buf == NULL) {
            fprintf(stderr, "gemm: cannot allocate %zu bytes of packing buffer "
                            "(out of memory?)\n", bytes);
            exit(EXIT_FAILURE);
        }
    }
    return buf;
}

// Packing reads each operand along its contiguous dimension. Where that is
// across the packed layout (a transpose), it goes in chunks of 16 k: one
// cache line of each source row, and a few lines of the panel, stay in L1.
// (Measured: 1.3x faster packing than whole rows; transposes are most of the
// packing time, and packing is 5-15% of the total on the shapes of GPT-2.)
#define GEMM_KCHUNK 16

// Ap (mc/MR micro-panels, each kc x MR) <- A(0:mc, 0:kc); rows past mc are 0.
// Inside a micro-panel, Ap[k*MR + r] = A(r, k): the MR values the kernel
// broadcasts at step k are adjacent.
static void gemm_pack_A(int mc, int kc, const float* A, long a_rs, long a_cs, float* Ap) {
    for (int i0 = 0; i0 < mc; i0 += GEMM_MR, Ap += (long)kc * GEMM_MR) {
        int mr = gemm_min(GEMM_MR, mc - i0);
        const float* a = A + i0 * a_rs;
        if (a_cs == 1) {  // rows of A contiguous (inp, dout): a transpose
            for (int k0 = 0; k0 < kc; k0 += GEMM_KCHUNK)
                for (int r = 0; r < mr; r++)
                    for (int k = k0; k < gemm_min(kc, k0 + GEMM_KCHUNK); k++)
                        Ap[k * GEMM_MR + r] = a[r * a_rs + k];
        } else {          // columns of A contiguous (dout^T): MR-float copies
            for (int k = 0; k < kc; k++)
                for (int r = 0; r < mr; r++) Ap[k * GEMM_MR + r] = a[r * a_rs + k * a_cs];
        }
        for (int k = 0; k < kc; k++)
            for (int r = mr; r < GEMM_MR; r++) Ap[k * GEMM_MR + r] = 0.0f;
    }
}

// Bp (nc/NR micro-panels, each kc x NR) <- B(0:kc, 0:nc); columns past nc are 0.
// Inside a micro-panel, Bp[k*NR + c] = B(k, c): the kernel's vector loads.
static void gemm_pack_B(int kc, int nc, const float* B, long b_rs, long b_cs, float* Bp) {
    for (int j0 = 0; j0 < nc; j0 += GEMM_NR, Bp += (long)kc * GEMM_NR) {
        int nr = gemm_min(GEMM_NR, nc - j0);
        const float* b = B + j0 * b_cs;
        if (b_cs == 1) {  // rows of B contiguous (W, inp): NR-float copies
            for (int k = 0; k < kc; k++)
                for (int c = 0; c < nr; c++) Bp[k * GEMM_NR + c] = b[k * b_rs + c];
        } else {          // columns of B contiguous (W^T in the forward): a transpose
            for (int k0 = 0; k0 < kc; k0 += GEMM_KCHUNK)
                for (int c = 0; c < nr; c++)
                    for (int k = k0; k < gemm_min(kc, k0 + GEMM_KCHUNK); k++)
                        Bp[k * GEMM_NR + c] = b[k * b_rs + c * b_cs];
        }
        for (int k = 0; k < kc; k++)
            for (int c = nr; c < GEMM_NR; c++) Bp[k * GEMM_NR + c] = 0.0f;
    }
}

// C(0:mr, 0:nr) = (add ? C : 0) + Ap . Bp over kc steps, mr <= MR, nr <= NR.
// acc[][] has fixed size, so gcc keeps it in 16 zmm registers and turns each
// fmaf() row into vfmadd231ps (fmaf, not a*b+c: in ISO mode, -std=c11, gcc
// does not contract a*b+c into an FMA; one rounding is also more accurate).
static void gemm_kernel(int kc, const float* Ap, const float* Bp,
                        float* C, long ldc, int mr, int nr, int add) {
    float acc[GEMM_MR][GEMM_NR] = {{0.0f}};
    for (int k = 0; k < kc; k++, Ap += GEMM_MR, Bp += GEMM_NR) {
        for (int r = 0; r < GEMM_MR; r++) {
            float a = Ap[r];
            for (int c = 0; c < GEMM_NR; c++)
                acc[r][c] = GEMM_FMA(a, Bp[c], acc[r][c]);
        }
    }
    if (mr == GEMM_MR && nr == GEMM_NR) {  // full tile: fixed bounds, vector stores
        for (int r = 0; r < GEMM_MR; r++)
            for (int c = 0; c < GEMM_NR; c++)
                C[r * ldc + c] = (add ? C[r * ldc + c] : 0.0f) + acc[r][c];
    } else {                               // edge tile: same sums, fewer stores
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++)
                C[r * ldc + c] = (add ? C[r * ldc + c] : 0.0f) + acc[r][c];
    }
}

// Block size for splitting n into ceil(n/max) nearly equal blocks, rounded up
// to a multiple of unit (K = 1000 with KC = 384 gives 3 x 334, not 384+384+232).
// Only the K blocking changes the arithmetic (each K slice is summed, then
// added onto C), and it depends on K alone, never on how threads split C.
static int gemm_block(int n, int max, int unit) {
    int nblocks = (n + max - 1) / max;
    int b = (n + nblocks - 1) / nblocks;
    return (b + unit - 1) / unit * unit;
}

// The five loops on the calling thread, for the whole of (M, N).
static void gemm_serial(int M, int N, int K, const float* A, long a_rs, long a_cs,
                        const float* B, long b_rs, long b_cs, float* C, long ldc, int accumulate) {
    float* Ap = gemm_buffers();                  // (MC, KC) in MR micro-panels
    float* Bp = Ap + (long)GEMM_MC * GEMM_KC;    // (KC, NC) in NR micro-panels
    int NCb = gemm_block(N, GEMM_NC, GEMM_NR), KCb = gemm_block(K, GEMM_KC, 1);
    int MCb = gemm_block(M, GEMM_MC, GEMM_MR);
    for (int jc = 0; jc < N; jc += NCb) {
        int nc = gemm_min(NCb, N - jc);
        for (int pc = 0; pc < K; pc += KCb) {
            int kc = gemm_min(KCb, K - pc);
            int add = accumulate || pc > 0;      // later K slices add onto C
            gemm_pack_B(kc, nc, B + pc * b_rs + jc * b_cs, b_rs, b_cs, Bp);
            for (int ic = 0; ic < M; ic += MCb) {
                int mc = gemm_min(MCb, M - ic);
                gemm_pack_A(mc, kc, A + ic * a_rs + pc * a_cs, a_rs, a_cs, Ap);
                for (int ir = 0; ir < mc; ir += GEMM_MR)
                    for (int jr = 0; jr < nc; jr += GEMM_NR)
                        gemm_kernel(kc, Ap + (long)ir * kc, Bp + (long)jr * kc,
                                    C + (ic + ir) * ldc + jc + jr, ldc,
                                    gemm_min(GEMM_MR, mc - ir), gemm_min(GEMM_NR, nc - jr), add);
            }
        }
    }
}

// C(M,N) = (accumulate ? C : 0) + A(M,K) . B(K,N), all fp32 (strides above).
// threaded: 1 = use OpenMP threads inside (call from serial code); 0 = run on
// the calling thread only (safe inside an omp parallel region, e.g. one call
// per (batch, head) in attention).
static void gemm(int M, int N, int K, const float* A, long a_rs, long a_cs,
                 const float* B, long b_rs, long b_cs, float* C, long ldc,
                 int accumulate, int threaded) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // empty sum: C = C or C = 0
        if (!accumulate)
            for (int i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * N);
        return;
    }
#ifdef _OPENMP
    if (threaded && (long)M * N * K >= GEMM_MIN_PARALLEL_MACS && omp_get_max_threads() > 1) {
        #pragma omp parallel
        {
            // Split C into a tm x tn grid of nearly equal blocks, one per
            // thread, in whole micro-tiles. Pick the grid that packs least:
            // each thread packs its rows of A and its columns of B, so
            // minimise M/tm + N/tn (small M: split N; small N: split M).
            int nt = omp_get_num_threads(), t = omp_get_thread_num();
            int tm = 1;
            for (int d = 1; d <= nt; d++)
                if (nt % d == 0 && (double)M / d + (double)N * d / nt
                                 < (double)M / tm + (double)N * tm / nt) tm = d;
            int tn = nt / tm, ti = t / tn, tj = t % tn;
            int pm = (M + GEMM_MR - 1) / GEMM_MR, pn = (N + GEMM_NR - 1) / GEMM_NR;
            int i0 = gemm_min(M, (int)((long)pm * ti / tm) * GEMM_MR);
            int i1 = gemm_min(M, (int)((long)pm * (ti + 1) / tm) * GEMM_MR);
            int j0 = gemm_min(N, (int)((long)pn * tj / tn) * GEMM_NR);
            int j1 = gemm_min(N, (int)((long)pn * (tj + 1) / tn) * GEMM_NR);
            if (i0 < i1 && j0 < j1)
                gemm_serial(i1 - i0, j1 - j0, K, A + i0 * a_rs, a_rs, a_cs,
                            B + j0 * b_cs, b_rs, b_cs, C + i0 * ldc + j0, ldc, accumulate);
        }
        return;
    }
#endif
    (void)threaded;
    gemm_serial(M, N, K, A, a_rs, a_cs, B, b_rs, b_cs, C, ldc, accumulate);
}

/* ------------------------------------------------------------------------ */
/* 6. Layers                                                                */
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
 * [-87, 88], where 2^n stays a normal float: e^-87 = 1.6e-38 stands for 0;
 * a NaN stays NaN. */
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

/* out(N,C) = (inp - mean) * rstd * weight + bias, per row; eps = 1e-5 as in
 * GPT-2 (torch.nn.LayerNorm default). mean, rstd (N) are kept for backward. */
static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) {
    const float eps = 1e-5f;
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
/* 7. Model                                                                 */
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

/* Carve `n` pointers (a struct of float*) out of one allocation. */
static float* tensors_alloc(float** ptrs, const size_t* sizes, int n, size_t* total_out) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15; /* keep each 64B aligned */
    float* mem = xmalloc_floats(total);
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
    size_t num_grads;       /* its floats: num_parameters, fewer under ZeRO-2 (section 9) */
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
     * while backward goes on (section 9) */
    void (*on_layer_grads)(void* ctx, int layer);
    /* optional: where backward writes layer l's parameter gradients (NULL:
     * the flat buffer); ZeRO-2 hands out a zeroed one-layer bucket */
    float* (*layer_grad_bucket)(void* ctx, int layer);
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
}

/* GPT-2's initialisation (Radford et al. 2019, sec. 2.3, and its released
 * code): weights N(0, 0.02); the two projections that write into the
 * residual stream (attprojw, fcprojw) scaled by 1/sqrt(2L); biases 0;
 * LayerNorm weights 1, biases 0. The pad rows of wte are zero, so the pad
 * logits are exactly 0 and never matter. Deterministic for a given seed. */
static void gpt2_fill_random(GPT2* model, uint64_t seed) {
    const GPT2Config* config = &model->config;
    Rng rng;
    rng_init(&rng, seed);
    float** ptrs = (float**)&model->params;
    double residual_std = 0.02 / sqrt(2.0 * config->num_layers);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        float* p = ptrs[i];
        size_t n = model->param_sizes[i];
        const char* name = PARAMETER_NAMES[i];
        int is_ln_weight = !strcmp(name, "ln1w") || !strcmp(name, "ln2w") || !strcmp(name, "lnfw");
        if (PARAMETER_IS_MATRIX[i]) {
            double std = (!strcmp(name, "attprojw") || !strcmp(name, "fcprojw")) ? residual_std : 0.02;
            for (size_t j = 0; j < n; j++) p[j] = (float)(std * rng_normal(&rng));
        } else {
            for (size_t j = 0; j < n; j++) p[j] = is_ln_weight ? 1.0f : 0.0f;
        }
    }
    size_t C = config->channels;
    memset(model->params.wte + (size_t)config->vocab_size * C, 0,
           sizeof(float) * (size_t)(config->padded_vocab_size - config->vocab_size) * C);
}

static void gpt2_init_random(GPT2* model, const GPT2Config* config, uint64_t seed) {
    float* params = xmalloc_floats(parameter_count(config));
    gpt2_init_with(model, config, params);
    gpt2_fill_random(model, seed);
}

static int gpt2_load(GPT2* model, const char* path) {
    GPT2Config config;
    float* params;
    if (model_file_read(path, &config, &params) != 0) return -1;
    gpt2_init_with(model, &config, params);
    return 0;
}

static int gpt2_save(const GPT2* model, const char* path) {
    return model_file_write(path, &model->config, model->params_memory);
}

/* Allocate activations for batches up to B x T, gradients and AdamW state. */
static void gpt2_alloc_training(GPT2* model, int B, int T) {
    ALWAYS(model->acts_memory == NULL);
    ALWAYS(T <= model->config.max_seq_len);
    model->batch_size = B;
    model->seq_len = T;
    size_t sizes[NUM_ACTIVATION_TENSORS > NUM_BACKWARD_TENSORS ? NUM_ACTIVATION_TENSORS : NUM_BACKWARD_TENSORS];
    activation_sizes(sizes, &model->config, B, T);
    model->acts_memory = tensors_alloc((float**)&model->acts, sizes, NUM_ACTIVATION_TENSORS, &model->num_activations);
    backward_sizes(sizes, &model->config, B, T);
    model->scratch_memory = tensors_alloc((float**)&model->scratch, sizes, NUM_BACKWARD_TENSORS, &model->num_scratch);
    size_t n = model->num_parameters;
    model->grads_memory = xmalloc_floats(n);
    /* calloc: the kernel hands out zero pages lazily, so moments that ZeRO-1
     * replaces by shard-sized ones (dist_setup_model) never take memory */
    model->m_memory = (float*)calloc(n, sizeof(float));
    model->v_memory = (float*)calloc(n, sizeof(float));
    CHECK(model->m_memory && model->v_memory, "out of memory for the AdamW moments (%zu floats each)", n);
    memset(model->grads_memory, 0, n * sizeof(float));
    model->num_grads = n;
    parameters_point(&model->grads, model->grads_memory, &model->config);
}

static void gpt2_free(GPT2* model) {
    free(model->params_memory);
    free(model->grads_memory);
    free(model->m_memory);
    free(model->v_memory);
    free(model->acts_memory);
    free(model->scratch_memory);
    memset(model, 0, sizeof(*model));
}

/* Forward pass over inputs (B, T) with B, T no larger than allocated. With
 * targets, returns the mean loss and leaves probabilities in acts.logits;
 * without (targets == NULL), leaves the raw logits and returns -1. The
 * activations of a smaller batch use a prefix of each buffer with the
 * smaller strides. */
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
    ParameterTensors p = model->params;
    ActivationTensors a = model->acts;
    size_t BT = (size_t)B * T;
    encoder_forward(a.encoded, inputs, p.wte, p.wpe, B, T, C);
    for (int l = 0; l < L; l++) {
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
        float* ln1 = a.ln1 + l * BT * C;
        float* ln1_mean = a.ln1_mean + l * BT;
        float* ln1_rstd = a.ln1_rstd + l * BT;
        float* qkv = a.qkv + l * BT * 3 * C;
        float* atty = a.atty + l * BT * C;
        float* att = a.att + (size_t)l * B * NH * T * T;
        float* residual2 = a.residual2 + l * BT * C;
        float* ln2 = a.ln2 + l * BT * C;
        float* ln2_mean = a.ln2_mean + l * BT;
        float* ln2_rstd = a.ln2_rstd + l * BT;
        float* fch = a.fch + l * BT * 4 * C;
        float* fch_gelu = a.fch_gelu + l * BT * 4 * C;
        float* residual3 = a.residual3 + l * BT * C;
        layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, p.ln1w + l * C, p.ln1b + l * C, BT, C);
        matmul_forward(qkv, ln1, p.qkvw + (size_t)l * 3 * C * C, p.qkvb + l * 3 * C, BT, C, 3 * C);
        attention_forward(atty, att, qkv, B, T, C, NH);
        /* residual2 = residual + atty . attprojw^T + attprojb */
        matmul_forward(residual2, atty, p.attprojw + (size_t)l * C * C, p.attprojb + l * C, BT, C, C);
        residual_forward(residual2, residual2, residual, BT * C);
        layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, p.ln2w + l * C, p.ln2b + l * C, BT, C);
        matmul_forward(fch, ln2, p.fcw + (size_t)l * 4 * C * C, p.fcb + l * 4 * C, BT, C, 4 * C);
        gelu_forward(fch_gelu, fch, BT * 4 * C);
        /* residual3 = residual2 + fch_gelu . fcprojw^T + fcprojb */
        matmul_forward(residual3, fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, p.fcprojb + l * C, BT, 4 * C, C);
        residual_forward(residual3, residual3, residual2, BT * C);
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

/* Layer l's parameter gradients: a ParameterTensors whose per-layer tensors
 * point at layer l's slice, in the flat gradient buffer or, when the data
 * parallel hook hands one out (ZeRO-2, section 9), in a one-layer bucket
 * holding the 12 slices back to back in file order. */
static ParameterTensors layer_grads(GPT2* model, int l) {
    ParameterTensors g = model->grads;
    float** gp = (float**)&g;
    float* bucket = model->layer_grad_bucket ? model->layer_grad_bucket(model->on_layer_grads_ctx, l) : NULL;
    size_t L = (size_t)model->config.num_layers, at = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) {
        size_t per_layer = model->param_sizes[k] / L;
        gp[k] = bucket ? bucket + at : gp[k] + (size_t)l * per_layer;
        at += per_layer;
    }
    return g;
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
        const float* ln1 = a.ln1 + l * BT * C;
        const float* qkv = a.qkv + l * BT * 3 * C;
        const float* atty = a.atty + l * BT * C;
        const float* att = a.att + (size_t)l * B * NH * T * T;
        const float* residual2 = a.residual2 + l * BT * C;
        const float* ln2 = a.ln2 + l * BT * C;
        const float* fch = a.fch + l * BT * 4 * C;
        const float* fch_gelu = a.fch_gelu + l * BT * 4 * C;
        ParameterTensors lg = layer_grads(model, l); /* layer l's slices */
        /* MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
        matmul_backward(s.dfch, lg.fcprojw, lg.fcprojb, s.dresidual,
                        fch_gelu, p.fcprojw + (size_t)l * C * 4 * C, BT, 4 * C, C, 0);
        gelu_backward(s.dfch, fch, s.dfch, BT * 4 * C);
        matmul_backward(s.dbt_c, lg.fcw, lg.fcb, s.dfch, ln2,
                        p.fcw + (size_t)l * 4 * C * C, BT, C, 4 * C, 0);
        layernorm_backward(s.dresidual, lg.ln2w, lg.ln2b, s.dbt_c, residual2,
                           p.ln2w + l * C, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, BT, C);
        /* attention: residual2 = residual + attproj(attn(ln1(residual))) */
        matmul_backward(s.dbt_c, lg.attprojw, lg.attprojb, s.dresidual, atty,
                        p.attprojw + (size_t)l * C * C, BT, C, C, 0);
        attention_backward(s.dqkv, s.datt, s.dbt_c, qkv, att, B, T, C, NH);
        matmul_backward(s.dbt_c, lg.qkvw, lg.qkvb, s.dqkv, ln1,
                        p.qkvw + (size_t)l * 3 * C * C, BT, C, 3 * C, 0);
        layernorm_backward(s.dresidual, lg.ln1w, lg.ln1b, s.dbt_c, residual,
                           p.ln1w + l * C, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, BT, C);
        if (model->on_layer_grads) model->on_layer_grads(model->on_layer_grads_ctx, l);
    }
    encoder_backward(g.wte, g.wpe, s.dresidual, model->last_inputs, B, T, C);
}

/* ------------------------------------------------------------------------ */
/* 8. Optimizer and schedules                                               */
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
 * over the parameters [lo, hi) of the flat buffer; g, m, v hold exactly that
 * range (g[0] is parameter lo's gradient). One process updates everything;
 * under ZeRO-1 each rank updates its shard. Weight decay follows the tensor
 * each parameter belongs to. */
static void adamw_update_range(GPT2* model, const AdamWConfig* opt, float lr, int t, size_t lo, size_t hi,
                               const float* grads, float* m_mem, float* v_mem) {
    float bc1 = 1.0f - (float)pow(opt->beta1, t);
    float bc2 = 1.0f - (float)pow(opt->beta2, t);
    float b1 = opt->beta1, b2 = opt->beta2, eps = opt->eps;
    size_t start = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        size_t end = start + model->param_sizes[k];
        size_t i0 = start > lo ? start : lo, i1 = end < hi ? end : hi; /* this tensor's part of the range */
        float wd = (opt->decay_all || PARAMETER_IS_MATRIX[k]) ? opt->weight_decay : 0.0f;
        if (i0 < i1) {
            float* RESTRICT p = model->params_memory + i0;
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
/* 9. Data parallel                                                         */
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
 * With --overlap 1 (the default; ZeRO-2 always) each layer's gradients are
 * sent as soon as backward has finished that layer (non-blocking: an
 * allreduce per tensor slice, or under ZeRO a reduce of each slice to the
 * ranks that own it), hidden behind the layers still to go. The global
 * gradient norm for clipping comes from the shards (one summed double).
 * Communication: every parameter is reduced once and gathered once per
 * step, 2P floats (Psi in the paper's words: 2 Psi for all three), of which
 * a ring or tree sends (W - 1) / W per rank; ZeRO-2 reduces the layers once
 * per micro-batch. The counts are kept (reduced, gathered) and checked by
 * scripts/test_dp.sh. The loss is scaled by 1/W before the sum, so the
 * result is the mean gradient of the global batch, equal to one process's
 * up to the order of the sums (fp32 round-off). --zero also runs on one
 * process (the same arithmetic, bitwise equal to plain: tested). */

#ifdef USE_MPI
#include <mpi.h>
#define MPI_CHECK(call)                                                                 \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != MPI_SUCCESS) {                                                       \
            char msg_[MPI_MAX_ERROR_STRING];                                            \
            int len_ = 0;                                                               \
            MPI_Error_string(rc_, msg_, &len_);                                         \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, msg_); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                               \
        }                                                                               \
    } while (0)
#endif

typedef struct {
    int rank, world;
    int zero;            /* 0: plain data parallel, 1: ZeRO-1, 2: ZeRO-2 */
    int overlap;         /* reduce each layer's gradients as backward finishes them */
    size_t shard;        /* parameters per rank: ceil(P / W) */
    size_t lo, hi;       /* the moments this rank holds: [lo, hi) of the real parameters (all under plain) */
    size_t save_lo, save_hi; /* the slice of weights and moments it snapshots and saves (its shard in every mode) */
    size_t offsets[NUM_PARAMETER_TENSORS]; /* each tensor's place in the flat buffer */
    size_t layer_floats; /* one layer's parameters: its 12 slices */
    size_t head_floats;  /* wte, wpe, lnfw, lnfb */
    float* grad_shard;   /* (shard) ZeRO: the summed gradient of this rank's shard */
    float* buckets[2];   /* ZeRO-2: (layer_floats) each; backward fills one while the other's sums are in flight */
    size_t grad_floats;  /* gradient floats this rank holds (printed, and checked by scripts/test_dp.sh) */
    double reduced;      /* floats this rank handed to reductions in the last step */
    double gathered;     /* floats it received from all-gathers (an allreduce counts in both) */
    double comm_ms;      /* time spent in gradient/weight collectives, summed over steps */
    double exposed_ms;   /* of which after backward, not hidden behind it */
    GPT2* model;         /* whose layer gradients the backward hooks reduce */
    double t_start, t_comm; /* unix_ms() at process start and when the communicator was ready */
#ifdef USE_MPI
    MPI_Request* requests; /* collectives in flight */
    float** owned;         /* per request: ZeRO-2, this rank's summed part to add into grad_shard (or NULL) */
    size_t* owned_at;      /* per request: where in grad_shard */
    int* owned_count;
    int* group;            /* per request: bucket 0 or 1, or 2 for the rest */
    int num_requests, cap_requests;
#endif
} Dist;

/* Start MPI (when built with it) and learn rank and world size. */
static void dist_init(Dist* d, int* argc, char*** argv) {
    memset(d, 0, sizeof(*d));
    d->t_start = unix_ms();
    d->world = 1;
#ifdef USE_MPI
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &d->rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &d->world));
#else
    (void)argc;
    (void)argv;
#endif
    d->t_comm = unix_ms();
}

/* End MPI. After a failure with several ranks, abort the whole job: the
 * other ranks may be waiting in a collective this rank will never join. */
static void dist_finish(Dist* d, int failed) {
    free(d->grad_shard);
    free(d->buckets[0]);
    free(d->buckets[1]);
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
    dist_allgather_slices(d, model->params_memory, model->num_parameters);
    if (!d->zero) {
        dist_allgather_slices(d, model->m_memory, model->num_parameters);
        dist_allgather_slices(d, model->v_memory, model->num_parameters);
    }
}

/* Shard geometry and buffers. Under ZeRO the parameters are padded to
 * W x shard floats (the pad stays zero and is never updated), so the
 * all-gather is one call. ZeRO-1 keeps the full (padded) gradient buffer;
 * ZeRO-2 keeps the embedding and final-LayerNorm gradients (backward writes
 * wte's at both its ends, so they are final only at the very end), two
 * one-layer buckets and its shard. */
static void dist_setup_model(Dist* d, GPT2* model) {
    size_t P = model->num_parameters, W = (size_t)d->world, L = (size_t)model->config.num_layers;
    CHECK(d->world == 1 || P + W <= (size_t)INT32_MAX,
          "MPI counts are int: %zu parameters are too many for one collective (chunking is not implemented)", P);
    size_t at = 0;
    for (int k = 0; k < NUM_PARAMETER_TENSORS; k++) {
        d->offsets[k] = at;
        at += model->param_sizes[k];
    }
    d->layer_floats = 0;
    for (int k = LAYER_TENSORS_BEGIN; k < LAYER_TENSORS_END; k++) d->layer_floats += model->param_sizes[k] / L;
    d->head_floats = P - L * d->layer_floats;
    d->shard = (P + W - 1) / W;
    d->lo = d->zero ? (size_t)d->rank * d->shard : 0;
    d->hi = d->zero ? (d->lo + d->shard < P ? d->lo + d->shard : P) : P;
    if (d->lo > P) d->lo = P;
    dist_slice(d, P, d->rank, &d->save_lo, &d->save_hi);
    d->model = model;
    d->grad_floats = P;
    if (!d->zero) return;
    size_t padded = d->shard * W;
    float* params = xmalloc_floats(padded);
    memcpy(params, model->params_memory, P * sizeof(float));
    memset(params + P, 0, (padded - P) * sizeof(float));
    free(model->params_memory);
    model->params_memory = params;
    parameters_point(&model->params, params, &model->config);
    free(model->grads_memory);
    if (d->zero == 1) {
        model->grads_memory = xmalloc_floats(padded);
        memset(model->grads_memory, 0, padded * sizeof(float));
        parameters_point(&model->grads, model->grads_memory, &model->config);
        d->grad_floats = padded + d->shard;
    } else {
        /* the head's gradients, in one buffer: [wte | wpe | lnfw | lnfb] */
        size_t C = (size_t)model->config.channels;
        model->grads_memory = xmalloc_floats(d->head_floats);
        memset(model->grads_memory, 0, d->head_floats * sizeof(float));
        memset(&model->grads, 0, sizeof(model->grads)); /* the layers' gradients live in the buckets */
        model->grads.wte = model->grads_memory;
        model->grads.wpe = model->grads.wte + model->param_sizes[0];
        model->grads.lnfw = model->grads.wpe + model->param_sizes[1];
        model->grads.lnfb = model->grads.lnfw + C;
        for (int b = 0; b < 2; b++) d->buckets[b] = xmalloc_floats(d->layer_floats);
        d->grad_floats = d->head_floats + 2 * d->layer_floats + d->shard;
    }
    model->num_grads = d->zero == 1 ? P : d->head_floats;
    /* AdamW moments for the shard only */
    free(model->m_memory);
    free(model->v_memory);
    model->m_memory = xmalloc_floats(d->shard);
    model->v_memory = xmalloc_floats(d->shard);
    memset(model->m_memory, 0, d->shard * sizeof(float));
    memset(model->v_memory, 0, d->shard * sizeof(float));
    d->grad_shard = xmalloc_floats(d->shard);
    memset(d->grad_shard, 0, d->shard * sizeof(float));
}

/* Wait until every rank gets here. */
static void dist_barrier(const Dist* d) {
#ifdef USE_MPI
    if (d->world > 1) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
#else
    (void)d;
#endif
}

/* Sum a double over the ranks (losses, squared norms). */
static double dist_sum(const Dist* d, double x) {
#ifdef USE_MPI
    if (d->world > 1) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
#else
    (void)d;
#endif
    return x;
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
    for (size_t a = at, end = at + n; a < end;) {
        int owner = (int)(a / d->shard);
        size_t b = (size_t)(owner + 1) * d->shard < end ? (size_t)(owner + 1) * d->shard : end;
        float* part = src + (a - at);
        int mine = owner == d->rank;
#ifdef USE_MPI
        if (d->world > 1) {
            int i = dist_request(d, group);
            MPI_CHECK(MPI_Ireduce(mine ? MPI_IN_PLACE : part, mine ? part : NULL, (int)(b - a), MPI_FLOAT, MPI_SUM,
                                  owner, MPI_COMM_WORLD, &d->requests[i]));
            d->owned[i] = mine && d->zero == 2 ? part : NULL;
            d->owned_at[i] = a - d->lo;
            d->owned_count[i] = (int)(b - a);
            a = b;
            continue;
        }
#endif
        (void)group;
        if (mine && d->zero == 2) dist_add_to_shard(d, part, a - d->lo, b - a); /* one rank: the sum is its own */
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
        if (d->zero == 2) {
            dist_reduce_to_owners(d, d->buckets[layer % 2] + at, flat, per_layer, layer % 2);
        } else if (d->zero == 1) {
            dist_reduce_to_owners(d, model->grads_memory + flat, flat, per_layer, layer % 2);
        } else {
            d->reduced += (double)per_layer;
            d->gathered += (double)per_layer;
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
    if (micro == 0) {
        d->reduced = d->gathered = 0.0;
        if (d->zero) memset(d->grad_shard, 0, d->shard * sizeof(float));
    }
    int on = d->zero == 2 || (d->world > 1 && d->overlap && last_micro_batch);
    model->on_layer_grads = on ? dist_layer_grads : NULL;
    model->layer_grad_bucket = d->zero == 2 ? dist_layer_bucket : NULL;
    model->on_layer_grads_ctx = d;
    d->model = model;
}

/* After backward: finish the sums, clip by the global norm, AdamW, and
 * (ZeRO) gather the updated weights. Returns the norm before clipping; the
 * update is skipped (on every rank alike) when it or the loss is not
 * finite, or the loss is a spike (section 10). */
static double dist_step(Dist* d, GPT2* model, const AdamWConfig* opt, double max_norm, float lr, int t, double loss,
                        int spike, int* finite) {
    double norm, t0 = time_ms();
    size_t P = model->num_parameters, C = (size_t)model->config.channels;
    size_t embed = model->param_sizes[0] + model->param_sizes[1]; /* wte, wpe: [0, embed) */
    if (!d->zero) {
        size_t rest = d->world > 1 && d->overlap ? embed : P; /* the layers' slices are in flight already */
        d->reduced += (double)(rest + (rest < P ? 2 * C : 0));
        d->gathered += (double)(rest + (rest < P ? 2 * C : 0));
#ifdef USE_MPI
        if (d->world > 1) {
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, model->grads_memory, (int)rest, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
            if (rest < P)
                MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, model->grads.lnfw, (int)(2 * C), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
            dist_wait(d, -1);
        }
#endif
        d->exposed_ms += time_ms() - t0;
        d->comm_ms += time_ms() - t0;
        norm = gradients_clip(model, max_norm);
        *finite = isfinite(loss) && isfinite(norm);
        if (*finite && !spike) adamw_update(model, opt, lr, t);
        return norm;
    }
    /* ZeRO: the sums of this rank's shard into grad_shard */
    if (d->zero == 2 || (d->world > 1 && d->overlap)) {
        dist_reduce_to_owners(d, model->grads.wte, 0, embed, 2);          /* wte, wpe */
        dist_reduce_to_owners(d, model->grads.lnfw, P - 2 * C, 2 * C, 2); /* lnfw, lnfb */
        dist_wait(d, -1);
        if (d->zero == 1) memcpy(d->grad_shard, model->grads_memory + d->lo, (d->hi - d->lo) * sizeof(float));
    } else { /* ZeRO-1 after backward: one reduce-scatter of the padded buffer */
        d->reduced = (double)(d->shard * d->world);
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
    if (*finite && !spike) adamw_update_range(model, opt, lr, t, d->lo, d->hi, d->grad_shard, model->m_memory, model->v_memory);
    t0 = time_ms();
    d->gathered = (double)(d->shard * d->world);
#ifdef USE_MPI
    if (d->world > 1)
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, model->params_memory, (int)d->shard, MPI_FLOAT,
                                MPI_COMM_WORLD));
#endif
    d->comm_ms += time_ms() - t0;
    d->exposed_ms += time_ms() - t0;
    return norm;
}

/* Rendezvous without MPI. NCCL (train_gpt.cu) needs every rank to hold the
 * same 128-byte unique id, made by rank 0 (ncclGetUniqueId). Under mpirun,
 * or srun with PMIx, it travels by MPI_Bcast; on a cluster without PMIx the
 * ranks meet through a file on a filesystem they all see, or a TCP socket
 * on rank 0's host:
 *   file:PATH      rank 0 writes PATH (temporary name, then rename), each
 *                  other rank reads it and answers with PATH.ack<r>; rank 0
 *                  removes them all once every rank has answered.
 *   tcp:HOST:PORT  rank 0 listens on PORT; the others connect to HOST:PORT
 *                  (retrying until rank 0 is up), say who they are, and
 *                  receive the bytes.
 * Both carry a run id (GPTC_RUN_ID, else Slurm's job.step.restart-count), so
 * a file or a connection left by an earlier launch is never taken for this
 * one's, and both give up after a timeout with a message that names the
 * ranks that never came. The code is plain POSIX, so the CPU tests run it. */

#define RENDEZVOUS_MAGIC "GPTCRDV1"
#define RENDEZVOUS_MAX_BYTES 4096

typedef enum { RENDEZVOUS_FILE, RENDEZVOUS_TCP } RendezvousKind;
typedef struct {
    RendezvousKind kind;
    char path[4096];  /* file: on a filesystem every rank sees */
    char host[256];   /* tcp: rank 0's host name or address */
    int port;         /* tcp */
    double timeout_s; /* give up after this long */
    char run_id[256]; /* this launch's name; NUL-padded on the wire */
} Rendezvous;

/* Where this process stands among the ranks, from the launcher's
 * environment: Slurm, Open MPI, PMI, or plain RANK/WORLD_SIZE/LOCAL_RANK.
 * 0, or -1 when no launcher says. */
MAYBE_UNUSED static int launch_rank_world(int* rank, int* world, int* local_rank) {
    /* Open MPI first: under mpirun inside a Slurm allocation, the SLURM_ ones
     * describe mpirun's daemons, not the ranks */
    static const char* const vars[4][3] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                                           {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                                           {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
                                           {"RANK", "WORLD_SIZE", "LOCAL_RANK"}};
    for (int i = 0; i < 4; i++) {
        const char* r = getenv(vars[i][0]);
        const char* w = getenv(vars[i][1]);
        if (!r || !w) continue;
        const char* l = getenv(vars[i][2]);
        *rank = atoi(r);
        *world = atoi(w);
        *local_rank = l ? atoi(l) : 0;
        if (*world < 1 || *rank < 0 || *rank >= *world) {
            fprintf(stderr, "error: %s=%s and %s=%s do not describe a rank of a job\n", vars[i][0], r, vars[i][1], w);
            return -1;
        }
        return 0;
    }
    return -1;
}

/* "file:PATH" or "tcp:HOST:PORT" into *rv. NULL, or what is wrong. */
MAYBE_UNUSED static const char* rendezvous_parse(Rendezvous* rv, const char* spec, double timeout_s) {
    memset(rv, 0, sizeof(*rv));
    rv->timeout_s = timeout_s;
    if (!(timeout_s > 0)) return "the rendezvous timeout must be > 0 seconds";
    if (!strncmp(spec, "file:", 5)) {
        rv->kind = RENDEZVOUS_FILE;
        if (!spec[5] || strlen(spec + 5) >= sizeof(rv->path) - 16) return "file: needs a path (on a filesystem every rank sees)";
        snprintf(rv->path, sizeof(rv->path), "%s", spec + 5);
    } else if (!strncmp(spec, "tcp:", 4)) {
        rv->kind = RENDEZVOUS_TCP;
        const char* colon = strrchr(spec + 4, ':');
        char* end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == spec + 4 || (size_t)(colon - spec - 4) >= sizeof(rv->host) || *end || port < 1 || port > 65535)
            return "tcp: needs HOST:PORT, rank 0's host and a free port in 1..65535 (e.g. tcp:node001:29500)";
        memcpy(rv->host, spec + 4, (size_t)(colon - spec - 4));
        rv->port = (int)port;
    } else {
        return "the rendezvous is file:PATH or tcp:HOST:PORT";
    }
    const char* id = getenv("GPTC_RUN_ID");
    const char* job = getenv("SLURM_JOB_ID");
    if (id && id[0]) {
        snprintf(rv->run_id, sizeof(rv->run_id), "%s", id);
    } else if (job && job[0]) {
        const char* step = getenv("SLURM_STEP_ID");
        const char* restart = getenv("SLURM_RESTART_COUNT");
        snprintf(rv->run_id, sizeof(rv->run_id), "slurm-%s.%s.%s", job, step ? step : "0", restart ? restart : "0");
    } else {
        return "the rendezvous needs a run id unique to this launch: set GPTC_RUN_ID (scripts/supervise.py does; "
               "under Slurm the job and step ids serve)";
    }
    return NULL;
}

/* The record rank 0 publishes: magic, run id, world, length, bytes. A raw
 * struct on purpose: it lives for seconds and only the same binary reads it. */
typedef struct {
    char magic[8];
    char run_id[256];
    int32_t world, bytes;
    unsigned char blob[RENDEZVOUS_MAX_BYTES];
} RendezvousRecord;

static void rendezvous_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Read a whole small file into buf; bytes read, or -1. */
static long rendezvous_slurp(const char* path, void* buf, size_t cap) {
    FILE* f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

static int rendezvous_file(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    char ack[4200];
    RendezvousRecord rec;
    double deadline = time_ms() + rv->timeout_s * 1000.0;
    if (rank == 0) {
        memset(&rec, 0, sizeof(rec));
        memcpy(rec.magic, RENDEZVOUS_MAGIC, 8);
        memcpy(rec.run_id, rv->run_id, sizeof(rec.run_id));
        rec.world = world;
        rec.bytes = (int32_t)bytes;
        memcpy(rec.blob, blob, bytes);
        remove(rv->path); /* an earlier launch's: the others ignore it anyway (its run id differs) */
        WriteChunk chunk = {&rec, sizeof(rec)};
        if (write_file_atomic(rv->path, &chunk, 1) != 0) return -1;
        int missing = world - 1;
        while (missing > 0 && time_ms() < deadline) {
            missing = 0;
            for (int r = 1; r < world; r++) {
                char id[256] = {0};
                snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, r);
                if (rendezvous_slurp(ack, id, sizeof(id)) != (long)sizeof(id) || memcmp(id, rv->run_id, sizeof(id)))
                    missing++;
            }
            if (missing) rendezvous_sleep_ms(20);
        }
        for (int r = 0; r < world; r++) {
            char id[256] = {0};
            snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, r);
            int arrived = r == 0 || (rendezvous_slurp(ack, id, sizeof(id)) == (long)sizeof(id) &&
                                     !memcmp(id, rv->run_id, sizeof(id)));
            if (!arrived)
                fprintf(stderr, "error: rendezvous %s: rank %d of %d never answered within %.0f s (run id %s): is it "
                        "running, with the same GPTC_RUN_ID and a path it can see?\n", rv->path, r, world,
                        rv->timeout_s, rv->run_id);
            if (r > 0) remove(ack);
        }
        remove(rv->path);
        return missing ? -1 : 0;
    }
    int stale = 0;
    for (;;) {
        long n = rendezvous_slurp(rv->path, &rec, sizeof(rec));
        if (n == (long)sizeof(rec) && !memcmp(rec.magic, RENDEZVOUS_MAGIC, 8)) {
            if (!memcmp(rec.run_id, rv->run_id, sizeof(rec.run_id))) break;
            stale = 1;
        }
        if (time_ms() >= deadline) {
            fprintf(stderr, "error: rendezvous %s: rank %d found no record from rank 0 of run %s within %.0f s%s: "
                    "is rank 0 running, with the same GPTC_RUN_ID and path?\n", rv->path, rank, rv->run_id,
                    rv->timeout_s, stale ? " (only one of another run, ignored)" : "");
            return -1;
        }
        rendezvous_sleep_ms(20);
    }
    if (rec.world != world || rec.bytes != (int32_t)bytes) {
        fprintf(stderr, "error: rendezvous %s: rank 0 launched %d ranks with %d bytes, rank %d has %d ranks and %zu "
                "bytes: launch every rank alike\n", rv->path, rec.world, rec.bytes, rank, world, bytes);
        return -1;
    }
    memcpy(blob, rec.blob, bytes);
    snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, rank);
    WriteChunk chunk = {rv->run_id, sizeof(rv->run_id)};
    return write_file_atomic(ack, &chunk, 1);
}

/* Whole reads and writes on a socket with a deadline (poll), 0 or -1. */
static int socket_io(int fd, void* buf, size_t n, int writing, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        int left = (int)(deadline - time_ms());
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* What a rank says when it connects, and what rank 0 answers. */
typedef struct {
    char magic[8];
    char run_id[256];
    int32_t rank, world;
} RendezvousHello;

static int rendezvous_tcp(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    double deadline = time_ms() + rv->timeout_s * 1000.0;
    char port[16];
    snprintf(port, sizeof(port), "%d", rv->port);
    if (rank == 0) {
        int fd = socket(AF_INET6, SOCK_STREAM, 0), yes = 1, no = 0;
        int v6 = fd >= 0;
        if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            fprintf(stderr, "error: rendezvous: cannot create a socket: %s\n", strerror(errno));
            return -1;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no)); /* IPv4 clients too */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof(a6));
        memset(&a4, 0, sizeof(a4));
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)rv->port);
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        a4.sin_port = htons((uint16_t)rv->port);
        int rc = v6 ? bind(fd, (struct sockaddr*)&a6, sizeof(a6)) : bind(fd, (struct sockaddr*)&a4, sizeof(a4));
        if (rc != 0 || listen(fd, world) != 0) {
            fprintf(stderr, "error: rendezvous: rank 0 cannot listen on port %d: %s; choose another port "
                    "(tcp:HOST:PORT)\n", rv->port, strerror(errno));
            close(fd);
            return -1;
        }
        char* arrived = (char*)calloc((size_t)world, 1);
        ALWAYS(arrived != NULL);
        int count = 1;
        arrived[0] = 1;
        while (count < world) {
            int left = (int)(deadline - time_ms());
            struct pollfd pfd = {fd, POLLIN, 0};
            if (left <= 0 || poll(&pfd, 1, left) <= 0) break;
            int c = accept(fd, NULL, NULL);
            if (c < 0) continue;
            RendezvousHello hello;
            int32_t status = 0; /* 0: welcome; 1: another run; 2: world or rank wrong or taken */
            double until = time_ms() + 5000.0 < deadline ? time_ms() + 5000.0 : deadline;
            if (socket_io(c, &hello, sizeof(hello), 0, until) != 0 || memcmp(hello.magic, RENDEZVOUS_MAGIC, 8)) {
                close(c); /* not one of ours (a port scan, a dead client) */
                continue;
            }
            if (memcmp(hello.run_id, rv->run_id, sizeof(hello.run_id))) status = 1;
            else if (hello.world != world || hello.rank < 1 || hello.rank >= world || arrived[hello.rank]) status = 2;
            int32_t reply[2] = {status, (int32_t)bytes};
            if (socket_io(c, reply, sizeof(reply), 1, until) == 0 && status == 0 &&
                socket_io(c, blob, bytes, 1, until) == 0) {
                arrived[hello.rank] = 1;
                count++;
            } else if (status) {
                hello.run_id[sizeof(hello.run_id) - 1] = '\0';
                fprintf(stderr, "warning: rendezvous: turned away a connection claiming rank %d of %d of run %s\n",
                        hello.rank, hello.world, hello.run_id);
            }
            close(c);
        }
        close(fd);
        for (int r = 1; r < world; r++)
            if (!arrived[r])
                fprintf(stderr, "error: rendezvous tcp: rank %d of %d never connected to port %d within %.0f s (run "
                        "id %s): is it running, with the same GPTC_RUN_ID and tcp:HOST:PORT?\n", r, world, rv->port,
                        rv->timeout_s, rv->run_id);
        free(arrived);
        return count == world ? 0 : -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(rv->host, port, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "error: rendezvous: cannot resolve rank 0's host \"%s\": %s\n", rv->host, gai_strerror(gai));
        return -1;
    }
    RendezvousHello hello;
    memset(&hello, 0, sizeof(hello));
    memcpy(hello.magic, RENDEZVOUS_MAGIC, 8);
    memcpy(hello.run_id, rv->run_id, sizeof(hello.run_id));
    hello.rank = rank;
    hello.world = world;
    int32_t reply[2] = {-1, 0};
    int done = 0;
    while (!done && time_ms() < deadline) { /* rank 0 may not be listening yet: retry */
        for (struct addrinfo* a = res; a && !done; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && socket_io(fd, &hello, sizeof(hello), 1, deadline) == 0 &&
                socket_io(fd, reply, sizeof(reply), 0, deadline) == 0)
                done = reply[0] != 0 || (reply[1] == (int32_t)bytes && socket_io(fd, blob, bytes, 0, deadline) == 0) ? 1 : 0;
            close(fd);
        }
        if (!done) rendezvous_sleep_ms(100);
    }
    freeaddrinfo(res);
    if (!done) {
        fprintf(stderr, "error: rendezvous tcp: rank %d reached no rank 0 at %s:%d within %.0f s: is rank 0 running "
                "there, and the port open?\n", rank, rv->host, rv->port, rv->timeout_s);
        return -1;
    }
    if (reply[0] != 0) {
        fprintf(stderr, "error: rendezvous tcp: rank 0 at %s:%d turned rank %d away: %s\n", rv->host, rv->port, rank,
                reply[0] == 1 ? "it belongs to another run (GPTC_RUN_ID differs)"
                              : "the number of ranks differs, or another process already claimed this rank");
        return -1;
    }
    return 0;
}

/* Give every rank rank 0's `bytes` bytes of `blob` (at most
 * RENDEZVOUS_MAX_BYTES). 0 on every rank, or -1 after a message. */
MAYBE_UNUSED static int rendezvous_share(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    ALWAYS(bytes <= RENDEZVOUS_MAX_BYTES && rank >= 0 && rank < world);
    if (world == 1) return 0;
    return rv->kind == RENDEZVOUS_FILE ? rendezvous_file(rv, rank, world, blob, bytes)
                                       : rendezvous_tcp(rv, rank, world, blob, bytes);
}

/* ------------------------------------------------------------------------ */
/* 10. Checkpoints and failover                                             */
/* ------------------------------------------------------------------------ */
/* A model file holds the weights only; resuming a run bit for bit needs the
 * rest too: the AdamW moments (this rank's shard under ZeRO), the step, the
 * data loader's position, the sampler's random state and the loss-spike
 * detector's window. One rank's training state is one record, laid out the
 * same everywhere it lives:
 *   - in memory, in a snapshot slot: a file in /dev/shm (--shm-dir), mapped,
 *     so it outlives a crashed process on that host; two slots, so a crash
 *     while one is being filled leaves the other intact;
 *   - in the neighbour's memory: rank (r+1) mod W keeps a byte copy of rank
 *     r's newest snapshot in its own /dev/shm (a replica, sent over MPI);
 *   - on disk: <dir>/state_<step>_rank<r>.bin, and once every rank's file is
 *     there rank 0 writes <dir>/state_<step>.complete: a step counts as saved
 *     on disk only with that marker.
 * Format (all little-endian, fixed width, no raw structs):
 *   256 int32 header: [0] magic 20261103, [1] version 2, [2] step, [3] rank,
 *     [4] world, [5] zero, [6] B, [7] T, [8] total batch, [9] seed,
 *     [10] shuffle, [11] L, [12] C, [13] NH, [14] maxT, [15] V, [16] Vp,
 *     [17] data epoch, [18] data shard position, [20..21] data cursor,
 *     [22..23] P, [24..25] lo, [26..27] hi (the slice held: [lo, hi)),
 *     [28..29] sampler RNG state, [30] CRC32C of the weights, [31] of m,
 *     [32] of v, [33..34] the run's nonce (<dir>/run.id), [35..37] the loss
 *     window's count, next slot and current run of bad steps, [38] --steps, [40..103] its
 *     losses (float bits), [255] CRC32C of header words 0..254 (int64s as
 *     two int32, low first);
 *   then hi - lo floats of the weights, of m, of v: rank r's slice, the
 *   r-th of W equal ones (its shard under ZeRO; under plain data parallel,
 *   where every rank holds the same, each still saves only 1/W of it). A
 *   state is all the ranks' files together; loading gathers the slices.
 * Files are written to a temporary name, fsync'd and renamed (and the folder
 * fsync'd): a crash or a full disk leaves the previous state as it was. */

#define STATE_MAGIC 20261103
#define STATE_VERSION 2
#define STATE_HEADER_BYTES 1024
#define LOSS_WINDOW 64

/* CRC-32C (Castagnoli), reflected polynomial 0x82F63B78: with the SSE4.2
 * instruction where the build has it (about 20 GB/s, so checking a GPT-2
 * 124M state costs ~0.1 s), else bytewise from a table. */
#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
static uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n > 0; n--, p++) c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}
#else
static uint32_t crc32c_table[256];
static void crc32c_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[i] = c;
    }
}
static uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc32c_table_init); /* the snapshot threads call this too */
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc32c_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
#endif

/* Copy three arrays of n floats, src[k] to dst[k], and take each one's
 * CRC32C on the way: one pass over the memory instead of a copy and then a
 * read, the three CRC chains interleaved so the instruction's latency is
 * hidden, and the stores non-temporal (a snapshot is not read again soon:
 * no need to pull it through the cache). */
static void copy3_crc32c(float* const dst[3], const float* const src[3], size_t n, uint32_t crc[3]) {
#if defined(__SSE4_2__) && defined(__x86_64__)
    const unsigned char* in[3] = {(const unsigned char*)src[0], (const unsigned char*)src[1], (const unsigned char*)src[2]};
    unsigned char* out[3] = {(unsigned char*)dst[0], (unsigned char*)dst[1], (unsigned char*)dst[2]};
    uint64_t c0 = 0xFFFFFFFFu, c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
    size_t bytes = n * sizeof(float), words = bytes / 8, i = 0;
    int aligned = ((uintptr_t)out[0] | (uintptr_t)out[1] | (uintptr_t)out[2]) % 8 == 0;
    for (; aligned && i < words; i++) {
        long long w0, w1, w2;
        memcpy(&w0, in[0] + 8 * i, 8);
        memcpy(&w1, in[1] + 8 * i, 8);
        memcpy(&w2, in[2] + 8 * i, 8);
        c0 = _mm_crc32_u64(c0, (uint64_t)w0);
        c1 = _mm_crc32_u64(c1, (uint64_t)w1);
        c2 = _mm_crc32_u64(c2, (uint64_t)w2);
        _mm_stream_si64((long long*)(out[0] + 8 * i), w0);
        _mm_stream_si64((long long*)(out[1] + 8 * i), w1);
        _mm_stream_si64((long long*)(out[2] + 8 * i), w2);
    }
    _mm_sfence(); /* the streamed stores are visible before whatever follows */
    uint32_t cs[3] = {(uint32_t)c0, (uint32_t)c1, (uint32_t)c2};
    for (int k = 0; k < 3; k++) {
        memcpy(out[k] + 8 * i, in[k] + 8 * i, bytes - 8 * i);
        for (size_t j = 8 * i; j < bytes; j++) cs[k] = _mm_crc32_u8(cs[k], in[k][j]);
        crc[k] = ~cs[k];
    }
#else
    for (int k = 0; k < 3; k++) {
        memcpy(dst[k], src[k], n * sizeof(float));
        crc[k] = crc32c(0, src[k], n * sizeof(float));
    }
#endif
}

static void put_i64(int32_t* h, int at, int64_t v) {
    h[at] = (int32_t)(uint32_t)((uint64_t)v & 0xFFFFFFFFu);
    h[at + 1] = (int32_t)(uint32_t)((uint64_t)v >> 32);
}

static int64_t get_i64(const int32_t* h, int at) {
    return (int64_t)(((uint64_t)(uint32_t)h[at + 1] << 32) | (uint32_t)h[at]);
}

/* Bad steps: a step whose loss or gradient norm is not finite, or whose loss
 * is a spike, more than z standard deviations above the mean of the last
 * LOSS_WINDOW accepted losses (once 16 are in), has its update skipped. */
typedef struct {
    float recent[LOSS_WINDOW]; /* ring of the last accepted losses */
    int count;                 /* how many are in it */
    int next;                  /* where the next one goes */
    int bad_run;               /* consecutive bad steps so far */
} LossWatch;

/* Is `loss` a spike against the window? (z <= 0: never.) */
static int losswatch_spike(const LossWatch* w, double loss, double z, double* zscore) {
    *zscore = 0.0;
    if (z <= 0.0 || w->count < 16) return 0;
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < w->count; i++) mean += w->recent[i];
    mean /= w->count;
    for (int i = 0; i < w->count; i++) var += (w->recent[i] - mean) * (w->recent[i] - mean);
    double sd = sqrt(var / (w->count - 1));
    *zscore = (loss - mean) / (sd > 1e-6 ? sd : 1e-6);
    return *zscore > z;
}

static void losswatch_accept(LossWatch* w, float loss) {
    w->recent[w->next] = loss;
    w->next = (w->next + 1) % LOSS_WINDOW;
    if (w->count < LOSS_WINDOW) w->count++;
    w->bad_run = 0;
}

/* What a state pins down besides the arrays. */
typedef struct {
    int step, rank, world, zero, B, T, total, seed, shuffle;
    GPT2Config config;
    int epoch, shard_pos;
    long long cursor;
    size_t P, lo, hi;
    uint64_t sample_rng;
    uint64_t nonce;  /* the run's (<dir>/run.id): memory from another run is never taken */
    int steps;       /* --steps of the run that wrote it (a change is allowed, and said) */
    LossWatch watch;
} StateInfo;

static size_t state_bytes(size_t n) { return STATE_HEADER_BYTES + 3 * n * sizeof(float); }

static void state_path(char* out, size_t cap, const char* dir, int step, int rank) {
    if (rank >= 0) snprintf(out, cap, "%s/state_%08d_rank%d.bin", dir, step, rank);
    else snprintf(out, cap, "%s/state_%08d.complete", dir, step);
}

/* The header of a state whose arrays (its slices of the weights, m and v,
 * hi - lo floats each) have the CRC32Cs crc[0..2]. */
static void state_header_make(int32_t* h, const StateInfo* s, const uint32_t crc[3]) {
    memset(h, 0, STATE_HEADER_BYTES);
    h[0] = STATE_MAGIC; h[1] = STATE_VERSION; h[2] = s->step; h[3] = s->rank; h[4] = s->world; h[5] = s->zero;
    h[6] = s->B; h[7] = s->T; h[8] = s->total; h[9] = s->seed; h[10] = s->shuffle;
    h[11] = s->config.num_layers; h[12] = s->config.channels; h[13] = s->config.num_heads;
    h[14] = s->config.max_seq_len; h[15] = s->config.vocab_size; h[16] = s->config.padded_vocab_size;
    h[17] = s->epoch; h[18] = s->shard_pos;
    put_i64(h, 20, s->cursor);
    put_i64(h, 22, (int64_t)s->P);
    put_i64(h, 24, (int64_t)s->lo);
    put_i64(h, 26, (int64_t)s->hi);
    put_i64(h, 28, (int64_t)s->sample_rng);
    h[30] = (int32_t)crc[0];
    h[31] = (int32_t)crc[1];
    h[32] = (int32_t)crc[2];
    put_i64(h, 33, (int64_t)s->nonce);
    h[35] = s->watch.count; h[36] = s->watch.next; h[37] = s->watch.bad_run; h[38] = s->steps;
    memcpy(h + 40, s->watch.recent, sizeof(s->watch.recent));
    h[255] = (int32_t)crc32c(0, h, 255 * sizeof(int32_t));
}

/* Check a header read from a file of `size` bytes and unpack it. 0, or -1
 * after a message naming `path`. */
static int state_header_parse(const int32_t* h, long long size, const char* path, StateInfo* s) {
    if (h[0] != STATE_MAGIC) {
        FILE_ERROR(path, "bad magic %d, expected %d: not a gpt.c training state (or one being written when the "
                   "run stopped)", h[0], STATE_MAGIC);
        return -1;
    }
    if (h[1] != STATE_VERSION) {
        FILE_ERROR(path, "training state of version %d; this build reads version %d: resume with the build that "
                   "wrote it, or start a new --output-dir", h[1], STATE_VERSION);
        return -1;
    }
    if ((uint32_t)h[255] != crc32c(0, h, 255 * sizeof(int32_t))) {
        FILE_ERROR(path, "header checksum mismatch: the file is corrupt");
        return -1;
    }
    memset(s, 0, sizeof(*s));
    s->step = h[2]; s->rank = h[3]; s->world = h[4]; s->zero = h[5]; s->B = h[6]; s->T = h[7];
    s->total = h[8]; s->seed = h[9]; s->shuffle = h[10];
    s->config.num_layers = h[11]; s->config.channels = h[12]; s->config.num_heads = h[13];
    s->config.max_seq_len = h[14]; s->config.vocab_size = h[15]; s->config.padded_vocab_size = h[16];
    s->epoch = h[17]; s->shard_pos = h[18]; s->cursor = get_i64(h, 20);
    s->P = (size_t)get_i64(h, 22); s->lo = (size_t)get_i64(h, 24); s->hi = (size_t)get_i64(h, 26);
    s->sample_rng = (uint64_t)get_i64(h, 28);
    s->nonce = (uint64_t)get_i64(h, 33);
    s->watch.count = h[35]; s->watch.next = h[36]; s->watch.bad_run = h[37]; s->steps = h[38];
    memcpy(s->watch.recent, h + 40, sizeof(s->watch.recent));
    if (config_problem(&s->config) || s->P != parameter_count(&s->config) || s->lo > s->hi || s->hi > s->P ||
        s->watch.count < 0 || s->watch.count > LOSS_WINDOW || s->watch.next < 0 || s->watch.next >= LOSS_WINDOW ||
        size != (long long)state_bytes(s->hi - s->lo)) {
        FILE_ERROR(path, "sizes in the header do not match the file (%lld bytes): truncated or corrupt", size);
        return -1;
    }
    /* every counter in range, so the next step cannot overflow one (the
     * header checksum guards against damage, not against a bad writer) */
    const char* bad = s->step < 1 || s->step >= INT32_MAX - 1     ? "step"
                      : s->world < 1 || s->world > (1 << 20)      ? "world size"
                      : s->rank < 0 || s->rank >= s->world        ? "rank"
                      : s->zero < 0 || s->zero > 2                ? "ZeRO stage"
                      : s->B < 1 || s->T < 1 || s->T > s->config.max_seq_len ? "batch shape (B, T)"
                      : s->total < 1 || s->total % s->T != 0      ? "tokens per step"
                      : s->shuffle < 0 || s->shuffle > 1          ? "shuffle flag"
                      : s->epoch < 0 || s->epoch > (1 << 30)      ? "epoch"
                      : s->shard_pos < 0 || s->cursor < 0         ? "data position"
                      : s->steps < 1 || s->steps >= INT32_MAX - 1 ? "--steps"
                      : s->watch.bad_run < 0 || s->watch.bad_run > s->step ? "bad-step count" : NULL;
    if (bad) {
        FILE_ERROR(path, "the %s recorded in the header is out of range: a state written by another program, "
                   "or corrupt", bad);
        return -1;
    }
    return 0;
}

/* Read a state file's header and check it and its size. 0, or -1 after a
 * message (a missing file is quiet when `quiet_missing`). */
static int state_read_header(const char* path, StateInfo* s, int32_t* h, int quiet_missing) {
    if (quiet_missing && access(path, F_OK) != 0) return -1;
    FILE* f = file_open_read(path, "training state file");
    if (!f) return -1;
    long long size = file_size(f);
    int rc = size >= STATE_HEADER_BYTES ? read_exact(f, h, STATE_HEADER_BYTES, path) : -1;
    fclose(f);
    if (rc != 0) {
        FILE_ERROR(path, "%lld bytes: shorter than a training state's header (truncated?)", size);
        return -1;
    }
    return state_header_parse(h, size, path, s);
}

/* Read the arrays of a state file whose header `h` was checked, verifying
 * each section's checksum. Its slice [lo, hi) of the weights goes into
 * params_full (P floats; NULL: skipped); of its moments, the part inside
 * [want_lo, want_hi) goes into m and v, which hold that range (NULL:
 * skipped). 0 or -1. */
static int state_read_arrays(const char* path, const StateInfo* s, const int32_t* h, float* params_full, float* m,
                             float* v, size_t want_lo, size_t want_hi) {
    FILE* f = file_open_read(path, "training state file");
    if (!f) return -1;
    size_t n = s->hi - s->lo;
    float* arrays = xmalloc_floats(3 * n); /* weights, m, v */
    int rc = fseek(f, STATE_HEADER_BYTES, SEEK_SET) != 0 || read_exact(f, arrays, 3 * n * 4, path) != 0;
    fclose(f);
    const char* bad = rc ? NULL
                      : (uint32_t)h[30] != crc32c(0, arrays, n * 4)         ? "weights"
                      : (uint32_t)h[31] != crc32c(0, arrays + n, n * 4)     ? "first moments"
                      : (uint32_t)h[32] != crc32c(0, arrays + 2 * n, n * 4) ? "second moments" : NULL;
    if (bad) FILE_ERROR(path, "checksum mismatch in the %s: the file is corrupt", bad);
    if (!rc && !bad) {
        if (params_full) memcpy(params_full + s->lo, arrays, n * sizeof(float));
        size_t a = want_lo > s->lo ? want_lo : s->lo, b = want_hi < s->hi ? want_hi : s->hi;
        if (m && a < b) {
            memcpy(m + (a - want_lo), arrays + n + (a - s->lo), (b - a) * sizeof(float));
            memcpy(v + (a - want_lo), arrays + 2 * n + (a - s->lo), (b - a) * sizeof(float));
        }
    }
    free(arrays);
    return rc || bad ? -1 : 0;
}

/* Load this rank's slice from a state record in memory (a mapped slot, or
 * a replica received): check the header, copy the arrays out while taking
 * their CRC32Cs, compare. The weights go to params_full + lo, the moments
 * to m and v (which hold [lo, hi)). 0, or -1 after a message. */
static int state_load_record(const unsigned char* base, size_t bytes, const char* what, StateInfo* s, float* params_full,
                             float* m, float* v) {
    int32_t h[HEADER_INTS];
    if (bytes < STATE_HEADER_BYTES) {
        FILE_ERROR(what, "%zu bytes: shorter than a training state's header", bytes);
        return -1;
    }
    memcpy(h, base, STATE_HEADER_BYTES);
    if (state_header_parse(h, (long long)bytes, what, s) != 0) return -1;
    size_t n = s->hi - s->lo;
    const float* arrays = (const float*)(base + STATE_HEADER_BYTES);
    float* const to[3] = {params_full + s->lo, m, v};
    const float* const from[3] = {arrays, arrays + n, arrays + 2 * n};
    uint32_t crc[3];
    copy3_crc32c(to, from, n, crc);
    static const char* const names[3] = {"weights", "first moments", "second moments"};
    for (int k = 0; k < 3; k++)
        if (crc[k] != (uint32_t)h[30 + k]) {
            FILE_ERROR(what, "checksum mismatch in the %s: the copy is corrupt", names[k]);
            return -1;
        }
    return 0;
}

/* A snapshot slot: one state record in memory, backed by a file in
 * /dev/shm (or anonymous memory when snapshots stay private), mapped and
 * reserved up front (posix_fallocate: a full /dev/shm is an error now, not
 * a SIGBUS mid-run) and touched once, so taking a snapshot never faults. */
typedef struct {
    char path[4400];     /* "" = anonymous */
    unsigned char* base; /* (bytes) the record */
    size_t bytes;
} Slot;

static int slot_map(Slot* sl, const char* path, size_t bytes) {
    memset(sl, 0, sizeof(*sl));
    sl->bytes = bytes;
    if (!path) {
        sl->base = (unsigned char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        snprintf(sl->path, sizeof(sl->path), "%s", path);
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        if (fd < 0) {
            FILE_ERROR(path, "cannot create a snapshot slot: %s", strerror(errno));
            return -1;
        }
        struct stat st;
        int rc = fstat(fd, &st) == 0 && (size_t)st.st_size != bytes ? ftruncate(fd, (off_t)bytes) : 0;
        if (rc == 0) rc = posix_fallocate(fd, 0, (off_t)bytes);
        if (rc != 0) {
            FILE_ERROR(path, "cannot reserve %.2f GB for a snapshot slot (%s): free space there, point --shm-dir "
                       "elsewhere, or run with --snapshot-every 0", bytes / 1e9, strerror(rc > 0 ? rc : errno));
            close(fd);
            remove(path);
            return -1;
        }
        sl->base = (unsigned char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    if (sl->base == (unsigned char*)MAP_FAILED) {
        sl->base = NULL;
        fprintf(stderr, "error: cannot map %.2f GB for a snapshot slot: %s\n", bytes / 1e9, strerror(errno));
        return -1;
    }
    /* touch every page now (a file slot keeps its contents: a snapshot from
     * before a crash must survive until it is replaced) */
    long page = sysconf(_SC_PAGESIZE);
    for (size_t at = 0; at < bytes; at += (size_t)page) {
        volatile unsigned char* p = sl->base + at;
        *p = *p;
    }
    return 0;
}

static void slot_unmap(Slot* sl, int remove_file) {
    if (sl->base) munmap(sl->base, sl->bytes);
    if (remove_file && sl->path[0]) remove(sl->path);
    memset(sl, 0, sizeof(*sl));
}

/* Fill a slot with a state: invalidate it, copy the slices (and, when
 * model_copy is given, all the weights for the model file; then set
 * *copied), then write the header with its checksums, the magic last (a
 * crash in between leaves a slot that reads as empty). Runs on a background
 * thread while the trainer's next forward and backward only read the
 * arrays. */
static void slot_fill(Slot* sl, const StateInfo* s, const float* params, const float* m, const float* v, int* copied,
                      const float* model_params, float* model_copy) {
    __atomic_store_n((int32_t*)sl->base, 0, __ATOMIC_RELEASE);
    size_t n = s->hi - s->lo;
    float* dst = (float*)(sl->base + STATE_HEADER_BYTES);
    uint32_t crc[3];
    float* const to[3] = {dst, dst + n, dst + 2 * n};
    const float* const from[3] = {params, m, v};
    copy3_crc32c(to, from, n, crc);
    if (model_copy) memcpy(model_copy, model_params, s->P * sizeof(float)); /* all the weights, for the model file */
    __atomic_store_n(copied, 1, __ATOMIC_RELEASE); /* the trainer may change its arrays now */
    int32_t h[HEADER_INTS];
    state_header_make(h, s, crc);
    memcpy(sl->base + sizeof(int32_t), h + 1, STATE_HEADER_BYTES - sizeof(int32_t));
    __atomic_store_n((int32_t*)sl->base, h[0], __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------------------ */
/* 11. Sampler                                                              */
/* ------------------------------------------------------------------------ */

typedef struct {
    float value;
    int index;
} ScoredToken;

static int scored_desc(const void* a, const void* b) {
    float x = ((const ScoredToken*)a)->value, y = ((const ScoredToken*)b)->value;
    return (x < y) - (x > y);
}

/* Draw a token from raw logits (the first V of them): softmax(logits / T),
 * keep the top_k most likely (0 = all) and the smallest set whose mass
 * reaches top_p (1 = all), renormalise, sample with `coin` in [0, 1).
 * temperature 0 means greedy. `work` holds V ScoredTokens. */
static int sample_token(const float* logits, int V, float temperature, int top_k, float top_p,
                        float coin, ScoredToken* work) {
    int best = 0;
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (temperature <= 0.0f) return best;
    double sum = 0.0;
    for (int v = 0; v < V; v++) {
        work[v].value = expf((logits[v] - logits[best]) / temperature);
        work[v].index = v;
        sum += work[v].value;
    }
    int n = V;
    if ((top_k > 0 && top_k < V) || top_p < 1.0f) {
        qsort(work, (size_t)V, sizeof(ScoredToken), scored_desc);
        if (top_k > 0 && top_k < n) n = top_k;
        double kept = 0.0;
        for (int i = 0; i < n; i++) kept += work[i].value;
        if (top_p < 1.0f) {
            double mass = 0.0;
            for (int i = 0; i < n; i++) {
                mass += work[i].value;
                if (mass >= top_p * kept) { n = i + 1; break; }
            }
        }
        sum = 0.0;
        for (int i = 0; i < n; i++) sum += work[i].value;
    }
    double target = coin * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += work[i].value;
        if (target < acc) return work[i].index;
    }
    return work[n - 1].index; /* rounding: the last kept token */
}

/* Generation with a KV cache: each new token runs the model for one
 * position only, attending to the keys and values of all earlier positions,
 * kept per layer. It calls the same layer functions as training, with N = 1
 * row; only attention is written out here, for a single query. */
typedef struct {
    int len;       /* positions cached so far */
    int max_len;   /* maxT */
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

static void kvcache_init(KVCache* kv, const GPT2Config* c) {
    size_t C = c->channels, L = c->num_layers, maxT = c->max_seq_len;
    memset(kv, 0, sizeof(*kv));
    kv->max_len = (int)maxT;
    kv->k = xmalloc_floats(L * maxT * C);
    kv->v = xmalloc_floats(L * maxT * C);
    kv->x = xmalloc_floats(C);
    kv->ln = xmalloc_floats(C);
    kv->stats = xmalloc_floats(2);
    kv->qkv = xmalloc_floats(3 * C);
    kv->y = xmalloc_floats(C);
    kv->h = xmalloc_floats(4 * C);
    kv->h2 = xmalloc_floats(4 * C);
    kv->scores = xmalloc_floats(maxT);
    kv->logits = xmalloc_floats((size_t)c->padded_vocab_size);
}

static void kvcache_free(KVCache* kv) {
    free(kv->k); free(kv->v); free(kv->x); free(kv->ln); free(kv->stats); free(kv->qkv);
    free(kv->y); free(kv->h); free(kv->h2); free(kv->scores); free(kv->logits);
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

typedef struct {
    float temperature;
    int top_k;
    float top_p;
} SamplingConfig;

/* Feed prompt[0..n) (n >= 1), then sample up to max_new tokens into out,
 * stopping after an end-of-text token (`eot`, or -1 for none) or at maxT.
 * on_token, if given, is called with each new token as it is drawn.
 * Returns the number of tokens generated. */
static int gpt2_generate(const GPT2* model, const int* prompt, int n, int max_new, const SamplingConfig* s,
                         Rng* rng, int eot, int* out, void (*on_token)(int, void*), void* ctx) {
    int V = model->config.vocab_size;
    KVCache kv;
    kvcache_init(&kv, &model->config);
    ScoredToken* work = (ScoredToken*)xmalloc(sizeof(ScoredToken) * (size_t)V);
    const float* logits = NULL;
    for (int i = 0; i < n && kv.len < kv.max_len; i++) logits = gpt2_forward_cached(model, &kv, prompt[i]);
    int made = 0;
    while (logits && made < max_new) {
        int next = sample_token(logits, V, s->temperature, s->top_k, s->top_p, rng_uniform(rng), work);
        out[made++] = next;
        if (on_token) on_token(next, ctx);
        if (next == eot || kv.len >= kv.max_len) break;
        logits = gpt2_forward_cached(model, &kv, next);
    }
    free(work);
    kvcache_free(&kv);
    return made;
}

/* ------------------------------------------------------------------------ */
/* 12. CLI                                                                  */
/* ------------------------------------------------------------------------ */
/* One table drives the parser, the defaults and the usage text, so they
 * cannot drift apart. Each flag has a long name; llm.c's one-letter flags
 * are accepted as aliases where llm.c has them. */

typedef struct {
    /* files */
    const char* train_data;
    const char* val_data;
    const char* model;
    const char* output_dir;
    const char* tokenizer;
    const char* merges;
    const char* data;
    const char* prompt;
    const char* log_file;
    const char* heartbeat;
    /* model shape overrides for a random init from a depth */
    int num_layers, channels, num_heads, max_seq_len, vocab_size;
    /* batch */
    int batch_size, seq_len, total_batch_size, steps;
    /* schedule and optimizer */
    float lr;
    int warmup_steps;
    float final_lr_frac;
    const char* lr_schedule;
    float decay_frac;
    float weight_decay;
    int decay_all;
    float beta1, beta2, eps, grad_clip;
    /* evaluation and sampling */
    int val_every, val_batches;
    int sample_every, sample_length;
    float temperature;
    int top_k;
    float top_p;
    /* run */
    int save_every, seed, shuffle, threads;
    int zero, overlap;
    int resume, stop_at, keep_last, keep_every;
    int snapshot_every, save_async, rollback_after;
    const char* shm_dir;
    float spike_z;
    int verbose;
} Options;

/* --verbose 1 or a --heartbeat: say the plumbing (see plumbing_wanted) */
static int verbose_flag = 0;

typedef enum { OPT_INT, OPT_FLOAT, OPT_STRING } OptType;
typedef struct {
    const char* name;  /* --long-name */
    const char* alias; /* llm.c's -x, or NULL */
    OptType type;
    size_t offset;
    const char* def;
    const char* help;
} OptSpec;

#define OPT(name, alias, type, field, def, help) {name, alias, type, offsetof(Options, field), def, help}
static const OptSpec OPTION_SPECS[] = {
    OPT("--train-data", "-i", OPT_STRING, train_data, "data/*_train_*.bin", "training token shards (a file or a quoted glob)"),
    OPT("--val-data", "-j", OPT_STRING, val_data, "", "validation token shards; empty = no validation"),
    OPT("--model", "-e", OPT_STRING, model, "d12", "llm.c checkpoint to load, or dN for a random GPT-2 of depth N (d12 = 124M, d24, d36, d48)"),
    OPT("--output-dir", "-o", OPT_STRING, output_dir, "", "where checkpoints go (created if missing); empty = save nothing"),
    OPT("--data", NULL, OPT_STRING, data, "", "train on a text file, a folder of .txt files or a .jsonl file: tokenized once into <data>.gptc/ beside it; replaces --train-data/--val-data"),
    OPT("--prompt", NULL, OPT_STRING, prompt, "", "generate a continuation of this text with --model and exit (no training)"),
    OPT("--tokenizer", NULL, OPT_STRING, tokenizer, "data/tokenizer/gpt2_tokenizer.bin", "llm.c tokenizer file (decode), for samples"),
    OPT("--merges", NULL, OPT_STRING, merges, "data/tokenizer/gpt2_merges.bin", "BPE merges file (encode), for --data and --prompt"),
    OPT("--log-file", NULL, OPT_STRING, log_file, "", "JSONL log: one line per step and per evaluation; empty = none"),
    OPT("--heartbeat", NULL, OPT_STRING, heartbeat, "", "rank 0 rewrites this file after every step (step, time): a supervisor that sees it go stale knows the run hangs; empty = none"),
    OPT("--num-layers", NULL, OPT_INT, num_layers, "0", "random init: override L of the dN config (0 = keep)"),
    OPT("--channels", NULL, OPT_INT, channels, "0", "random init: override C (0 = keep)"),
    OPT("--num-heads", NULL, OPT_INT, num_heads, "0", "random init: override NH (0 = keep)"),
    OPT("--max-seq-len", NULL, OPT_INT, max_seq_len, "0", "random init: override maxT (0 = keep, 1024)"),
    OPT("--vocab-size", NULL, OPT_INT, vocab_size, "0", "random init: override V (0 = keep, 50257); Vp = V rounded up to 128"),
    OPT("--batch-size", "-b", OPT_INT, batch_size, "4", "B: sequences per micro-batch, per process (rank)"),
    OPT("--seq-len", "-t", OPT_INT, seq_len, "64", "T: tokens per sequence (<= the model's maxT)"),
    OPT("--total-batch-size", "-d", OPT_INT, total_batch_size, "-1", "tokens per optimizer step over all ranks; a multiple of B*T*ranks (gradient accumulation); -1 = B*T*ranks"),
    OPT("--steps", "-x", OPT_INT, steps, "-1", "optimizer steps; -1 = one epoch of the training data; 0 = write the initial (untrained) model to --output-dir and stop"),
    OPT("--lr", "-l", OPT_FLOAT, lr, "3e-4", "peak learning rate"),
    OPT("--warmup-steps", "-u", OPT_INT, warmup_steps, "0", "linear warmup steps"),
    OPT("--final-lr-frac", "-q", OPT_FLOAT, final_lr_frac, "1.0", "final learning rate as a fraction of the peak"),
    OPT("--lr-schedule", NULL, OPT_STRING, lr_schedule, "cosine", "after warmup: cosine, linear, constant or wsd (warmup-stable-decay)"),
    OPT("--decay-frac", NULL, OPT_FLOAT, decay_frac, "0.2", "wsd: fraction of all steps spent decaying at the end"),
    OPT("--weight-decay", "-c", OPT_FLOAT, weight_decay, "0.0", "AdamW weight decay"),
    OPT("--decay-all", NULL, OPT_INT, decay_all, "0", "1 = decay every tensor; 0 = only 2-D weights (not biases, LayerNorms)"),
    OPT("--beta1", NULL, OPT_FLOAT, beta1, "0.9", "AdamW beta1"),
    OPT("--beta2", NULL, OPT_FLOAT, beta2, "0.95", "AdamW beta2"),
    OPT("--eps", NULL, OPT_FLOAT, eps, "1e-8", "AdamW epsilon"),
    OPT("--grad-clip", NULL, OPT_FLOAT, grad_clip, "1.0", "clip gradients to this global norm; 0 = off"),
    OPT("--val-every", "-v", OPT_INT, val_every, "20", "validate every this many steps (and at the end); 0 = never"),
    OPT("--val-batches", "-m", OPT_INT, val_batches, "20", "micro-batches per validation"),
    OPT("--sample-every", "-s", OPT_INT, sample_every, "20", "print a sample every this many steps; 0 = never"),
    OPT("--sample-length", "-g", OPT_INT, sample_length, "64", "tokens generated per sample and after --prompt (stops early at end-of-text or maxT)"),
    OPT("--temperature", NULL, OPT_FLOAT, temperature, "1.0", "sampling temperature; 0 = greedy"),
    OPT("--top-k", NULL, OPT_INT, top_k, "0", "sample among the k most likely tokens; 0 = all"),
    OPT("--top-p", NULL, OPT_FLOAT, top_p, "1.0", "nucleus sampling mass; 1 = off"),
    OPT("--save-every", "-n", OPT_INT, save_every, "0", "write a checkpoint (model + training state) every this many steps (and at the end) to --output-dir; 0 = only at the end"),
    OPT("--resume", NULL, OPT_INT, resume, "0", "1 = continue bit for bit from the freshest state of this run (own memory snapshot, the neighbour's replica, or disk in --output-dir); none = start fresh"),
    OPT("--keep-last", NULL, OPT_INT, keep_last, "2", "keep the training states of the last this many saves (and every --keep-every-th); 0 = keep all"),
    OPT("--keep-every", NULL, OPT_INT, keep_every, "0", "also keep the training state of every step that is a multiple of this; 0 = none"),
    OPT("--stop-at", NULL, OPT_INT, stop_at, "0", "stop after this step, saving the state, without changing the schedule (for time-limited jobs); 0 = run all --steps"),
    OPT("--snapshot-every", NULL, OPT_INT, snapshot_every, "0", "copy the training state into memory (--shm-dir, and a replica at the next rank) every this many steps: a crash then costs at most this many; 0 = off"),
    OPT("--shm-dir", NULL, OPT_STRING, shm_dir, "/dev/shm", "where memory snapshots live, created if missing (a tmpfs outlives the process, not the host)"),
    OPT("--save-async", NULL, OPT_INT, save_async, "1", "1 = copy snapshots while the next step computes and write them in the background; 0 = all at the step boundary"),
    OPT("--spike-z", NULL, OPT_FLOAT, spike_z, "0", "skip the update when the loss is this many standard deviations above the last 64 steps' mean; 0 = off"),
    OPT("--rollback-after", NULL, OPT_INT, rollback_after, "3", "after this many bad steps in a row (non-finite or spike), go back to the last memory snapshot, skipping the batches since; 0 = never"),
    OPT("--seed", NULL, OPT_INT, seed, "1337", "seed for the random init, shuffling and sampling"),
    OPT("--shuffle", NULL, OPT_INT, shuffle, "0", "1 = shuffle shards and samples each epoch (seeded)"),
    OPT("--threads", NULL, OPT_INT, threads, "0", "OpenMP threads; 0 = all cores"),
    OPT("--zero", NULL, OPT_INT, zero, "0", "data parallel: 0 = plain (allreduce), 1 = ZeRO-1 (AdamW state sharded over the ranks), 2 = ZeRO-2 (gradients sharded too)"),
    OPT("--overlap", NULL, OPT_INT, overlap, "1", "data parallel: 1 = reduce each layer's gradients during backward, 0 = after it (ZeRO-2: always during)"),
    OPT("--verbose", NULL, OPT_INT, verbose, "0", "1 = also print start-up timing and the data-parallel layout (printed anyway with several ranks, --heartbeat, or under scripts/supervise.py)"),
};
#undef OPT
#define NUM_OPTIONS ((int)(sizeof(OPTION_SPECS) / sizeof(OPTION_SPECS[0])))

static void usage(FILE* out, const char* prog) {
    fprintf(out, "usage: %s [flags]\n\nTrain GPT-2 (train_gpt on the CPU, train_gpt_cu on a GPU). Flags (default in brackets):\n", prog);
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptSpec* s = &OPTION_SPECS[i];
        char names[64];
        snprintf(names, sizeof(names), "%s%s%s", s->name, s->alias ? ", " : "", s->alias ? s->alias : "");
        fprintf(out, "  %-24s %s [%s]\n", names, s->help, s->def[0] ? s->def : "\"\"");
    }
    fprintf(out, "  %-24s %s\n", "--help, -h", "print this text");
}

/* Store `value` into the field of `spec`. Returns 0, or -1 with a message. */
static int option_set(Options* o, const OptSpec* spec, const char* value) {
    char* field = (char*)o + spec->offset;
    char* end = NULL;
    errno = 0;
    if (spec->type == OPT_INT) {
        long v = strtol(value, &end, 10);
        if (end == value || *end != '\0' || errno != 0 || v < -2147483647L || v > 2147483647L) {
            fprintf(stderr, "error: %s expects an integer, got \"%s\"\n", spec->name, value);
            return -1;
        }
        int iv = (int)v;
        memcpy(field, &iv, sizeof(int));
    } else if (spec->type == OPT_FLOAT) {
        float v = strtof(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(v)) {
            fprintf(stderr, "error: %s expects a number, got \"%s\"\n", spec->name, value);
            return -1;
        }
        memcpy(field, &v, sizeof(float));
    } else {
        memcpy(field, &value, sizeof(const char*));
    }
    return 0;
}

static const OptSpec* option_find(const char* arg) {
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptSpec* s = &OPTION_SPECS[i];
        if (!strcmp(arg, s->name) || (s->alias && !strcmp(arg, s->alias))) return s;
    }
    return NULL;
}

/* Parse argv into *o (defaults first). Returns 0 to run, 1 for --help,
 * -1 on an error (already printed). Accepts "--flag value" and "--flag=value". */
static int options_parse(Options* o, int argc, char** argv) {
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < NUM_OPTIONS; i++) ALWAYS(option_set(o, &OPTION_SPECS[i], OPTION_SPECS[i].def) == 0);
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) return 1;
        const char* value = NULL;
        char name[64];
        const char* eq = strchr(arg, '=');
        if (eq && arg[0] == '-' && arg[1] == '-' && (size_t)(eq - arg) < sizeof(name)) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
            arg = name;
        }
        const OptSpec* spec = option_find(arg);
        if (!spec) {
            fprintf(stderr, "error: unknown flag \"%s\"; run with --help for the list\n", argv[i]);
            return -1;
        }
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: %s needs a value\n", spec->name);
                return -1;
            }
            value = argv[++i];
        }
        if (option_set(o, spec, value) != 0) return -1;
    }
    verbose_flag = o->verbose == 1 || o->heartbeat[0] != '\0';
    return 0;
}

static int schedule_parse(const char* name, ScheduleKind* kind) {
    for (int i = 0; i < 4; i++) {
        if (!strcmp(name, SCHEDULE_NAMES[i])) {
            *kind = (ScheduleKind)i;
            return 0;
        }
    }
    return -1;
}

/* "d12" -> 12; anything else -> 0 (a file path). */
static int depth_from_name(const char* name) {
    if (name[0] != 'd' || name[1] < '1' || name[1] > '9') return 0;
    char* end;
    long d = strtol(name + 1, &end, 10);
    return (*end == '\0' && d > 0 && d <= 1024) ? (int)d : 0;
}

/* Checks that need no files: ranges and combinations of flags. Returns NULL
 * if all is well, else a message naming the flags involved. */
#define OPTIONS_PROBLEM(cond, msg) do { if (cond) return (msg); } while (0)
static const char* options_problem(const Options* o) {
    OPTIONS_PROBLEM(o->batch_size < 1, "--batch-size must be >= 1");
    OPTIONS_PROBLEM(o->seq_len < 1, "--seq-len must be >= 1");
    OPTIONS_PROBLEM(o->total_batch_size != -1 && o->total_batch_size < 1, "--total-batch-size must be >= 1 or -1");
    OPTIONS_PROBLEM(o->total_batch_size > 0 && o->total_batch_size % (o->batch_size * o->seq_len) != 0,
                    "--total-batch-size must be a multiple of --batch-size x --seq-len (it sets the gradient accumulation)");
    OPTIONS_PROBLEM(o->steps < -1, "--steps must be >= 1, -1 for one epoch, or 0 to write the initial model");
    OPTIONS_PROBLEM(o->steps == 0 && !o->output_dir[0], "--steps 0 writes the initial model: give --output-dir");
    OPTIONS_PROBLEM(o->steps == 0 && (o->resume || o->stop_at), "--steps 0 writes the initial model: it takes no --resume or --stop-at");
    OPTIONS_PROBLEM(o->verbose != 0 && o->verbose != 1, "--verbose must be 0 or 1");
    OPTIONS_PROBLEM(!(o->lr >= 0.0f), "--lr must be >= 0");
    OPTIONS_PROBLEM(o->warmup_steps < 0, "--warmup-steps must be >= 0");
    OPTIONS_PROBLEM(!(o->final_lr_frac >= 0.0f && o->final_lr_frac <= 1.0f), "--final-lr-frac must be in [0, 1]");
    OPTIONS_PROBLEM(!(o->decay_frac >= 0.0f && o->decay_frac <= 1.0f), "--decay-frac must be in [0, 1]");
    OPTIONS_PROBLEM(!(o->weight_decay >= 0.0f), "--weight-decay must be >= 0");
    OPTIONS_PROBLEM(o->decay_all != 0 && o->decay_all != 1, "--decay-all must be 0 or 1");
    OPTIONS_PROBLEM(!(o->beta1 >= 0.0f && o->beta1 < 1.0f), "--beta1 must be in [0, 1)");
    OPTIONS_PROBLEM(!(o->beta2 >= 0.0f && o->beta2 < 1.0f), "--beta2 must be in [0, 1)");
    OPTIONS_PROBLEM(!(o->eps > 0.0f), "--eps must be > 0");
    OPTIONS_PROBLEM(!(o->grad_clip >= 0.0f), "--grad-clip must be >= 0");
    OPTIONS_PROBLEM(o->val_every < 0, "--val-every must be >= 0");
    OPTIONS_PROBLEM(o->val_batches < 1, "--val-batches must be >= 1");
    OPTIONS_PROBLEM(o->sample_every < 0, "--sample-every must be >= 0");
    OPTIONS_PROBLEM(o->sample_length < 1, "--sample-length must be >= 1");
    OPTIONS_PROBLEM(!(o->temperature >= 0.0f), "--temperature must be >= 0");
    OPTIONS_PROBLEM(o->top_k < 0, "--top-k must be >= 0");
    OPTIONS_PROBLEM(!(o->top_p > 0.0f && o->top_p <= 1.0f), "--top-p must be in (0, 1]");
    OPTIONS_PROBLEM(o->save_every < 0, "--save-every must be >= 0");
    OPTIONS_PROBLEM(o->resume != 0 && o->resume != 1, "--resume must be 0 or 1");
    OPTIONS_PROBLEM(o->resume && !o->output_dir[0], "--resume needs --output-dir (where the states are)");
    OPTIONS_PROBLEM(o->stop_at < 0, "--stop-at must be >= 0");
    OPTIONS_PROBLEM(o->keep_last < 0 || o->keep_every < 0, "--keep-last and --keep-every must be >= 0");
    OPTIONS_PROBLEM(o->stop_at > 0 && !o->output_dir[0], "--stop-at needs --output-dir (to save the state)");
    OPTIONS_PROBLEM(o->snapshot_every < 0, "--snapshot-every must be >= 0");
    OPTIONS_PROBLEM(o->snapshot_every > 0 && !o->output_dir[0], "--snapshot-every needs --output-dir (the run's memory is named after it)");
    OPTIONS_PROBLEM(o->save_async != 0 && o->save_async != 1, "--save-async must be 0 or 1");
    OPTIONS_PROBLEM(!(o->spike_z >= 0.0f), "--spike-z must be >= 0");
    OPTIONS_PROBLEM(o->rollback_after < 0, "--rollback-after must be >= 0");
    OPTIONS_PROBLEM(o->shuffle != 0 && o->shuffle != 1, "--shuffle must be 0 or 1");
    OPTIONS_PROBLEM(o->threads < 0, "--threads must be >= 0");
    OPTIONS_PROBLEM(o->zero < 0 || o->zero > 2, "--zero must be 0, 1 or 2");
    OPTIONS_PROBLEM(o->overlap != 0 && o->overlap != 1, "--overlap must be 0 or 1");
    OPTIONS_PROBLEM(o->num_layers < 0 || o->channels < 0 || o->num_heads < 0 || o->max_seq_len < 0 || o->vocab_size < 0,
                    "--num-layers/--channels/--num-heads/--max-seq-len/--vocab-size must be >= 0");
    int overrides = o->num_layers || o->channels || o->num_heads || o->max_seq_len || o->vocab_size;
    OPTIONS_PROBLEM(overrides && !depth_from_name(o->model),
                    "--num-layers/--channels/--num-heads/--max-seq-len/--vocab-size apply to a random init "
                    "(--model dN), not to a checkpoint file, whose shape is fixed");
    ScheduleKind kind;
    OPTIONS_PROBLEM(schedule_parse(o->lr_schedule, &kind) != 0, "--lr-schedule must be cosine, linear, constant or wsd");
    return NULL;
}
#undef OPTIONS_PROBLEM

/* Build the model the options ask for: a checkpoint, or a random init. */
static int model_from_options(GPT2* model, const Options* o) {
    int depth = depth_from_name(o->model);
    if (!depth) return gpt2_load(model, o->model);
    GPT2Config c = config_from_depth(depth);
    if (o->num_layers) c.num_layers = o->num_layers;
    if (o->channels) c.channels = o->channels;
    if (o->num_heads) c.num_heads = o->num_heads;
    if (o->max_seq_len) c.max_seq_len = o->max_seq_len;
    if (o->vocab_size) c.vocab_size = o->vocab_size;
    c.padded_vocab_size = round_up(c.vocab_size, 128);
    const char* problem = config_problem(&c);
    if (problem) {
        fprintf(stderr, "error: model L=%d C=%d NH=%d maxT=%d V=%d: %s\n", c.num_layers, c.channels,
                c.num_heads, c.max_seq_len, c.vocab_size, problem);
        return -1;
    }
    char run_id[4400];
    snprintf(run_id, sizeof(run_id), "%s/run.id", o->output_dir);
    if (o->resume && o->output_dir[0] && access(run_id, F_OK) == 0) {
        /* resuming a run that exists: its state will replace the weights, so
         * the random init (seconds for GPT-2 124M) waits until train() knows
         * whether there is one; zeros meanwhile, the same on every rank */
        float* params = xmalloc_floats(parameter_count(&c));
        memset(params, 0, parameter_count(&c) * sizeof(float));
        gpt2_init_with(model, &c, params);
        model->init_deferred = 1;
        model->init_seed = (uint64_t)o->seed;
        return 0;
    }
    gpt2_init_random(model, &c, (uint64_t)o->seed);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* 13. main                                                                 */
/* ------------------------------------------------------------------------ */

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

/* Print a generated token as text (or as an id without a tokenizer). */
static void print_token(int id, void* ctx) {
    const Tokenizer* tok = (const Tokenizer*)ctx;
    if (tok->vocab_size) tokenizer_print(tok, id);
    else printf("%d ", id);
    fflush(stdout);
}

static SamplingConfig sampling_from_options(const Options* o) {
    SamplingConfig s;
    s.temperature = o->temperature;
    s.top_k = o->top_k;
    s.top_p = o->top_p;
    return s;
}

/* A sample from nothing: generation after a single end-of-text token. */
static void sample_print(const GPT2* model, const Tokenizer* tok, const Options* o, Rng* rng) {
    int V = model->config.vocab_size;
    int eot = tok->vocab_size ? (int)tok->eot_token : V - 1;
    int* out = (int*)xmalloc(sizeof(int) * (size_t)o->sample_length);
    SamplingConfig s = sampling_from_options(o);
    printf("sample: ");
    gpt2_generate(model, &eot, 1, o->sample_length, &s, rng, eot, out, print_token, (void*)tok);
    printf("\n");
    free(out);
}

MAYBE_UNUSED static void checkpoint_save(const GPT2* model, const Options* o, int step) {
    if (!o->output_dir[0]) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/model_%08d.bin", o->output_dir, step);
    if (gpt2_save(model, path) == 0) printf("saved %s\n", path);
    else fprintf(stderr, "warning: checkpoint at step %d not written; training continues\n", step);
}

/* Load the tokenizer: with the merges when text must be encoded (--data,
 * --prompt: then a missing file is an error), else decode only for samples
 * (a missing file just means samples print ids). */
static int tokenizer_setup(Tokenizer* tok, const Options* o, int vocab_size) {
    memset(tok, 0, sizeof(*tok));
    int need_encode = o->data[0] || o->prompt[0];
    if (!need_encode && o->sample_every == 0) return 0;
    if (!need_encode && access(o->tokenizer, R_OK) != 0) {
        printf("tokenizer %s not found: samples print token ids (make tokenizer fetches it)\n", o->tokenizer);
        return 0;
    }
    if (tokenizer_init(tok, o->tokenizer, need_encode ? o->merges : NULL) != 0) return -1;
    if ((int)tok->vocab_size != vocab_size) {
        fprintf(stderr, "%s: tokenizer %s has %u tokens, the model (--model %s) %d: give the tokenizer the model "
                "was trained with (--tokenizer, --merges)\n", need_encode ? "error" : "warning", o->tokenizer,
                tok->vocab_size, o->model, vocab_size);
        tokenizer_free(tok);
        if (need_encode) return -1;
        printf("samples print token ids\n");
    }
    return 0;
}

/* A fingerprint of the --data input (each file's path, size and mtime) and
 * of the tokenizer: the shard cache is reused only when it matches. */
static void data_stamp(const char* input, const Tokenizer* tok, char* out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "gptc data cache v1\ntokenizer %u tokens, %u merges, eot %u\n",
                                tok->vocab_size, tok->num_merges, tok->eot_token);
    struct stat st;
    glob_t g;
    memset(&g, 0, sizeof(g));
    const char* one[1] = {input};
    char** files = (char**)one;
    size_t nfiles = 1;
    if (stat(input, &st) == 0 && S_ISDIR(st.st_mode)) {
        char pattern[8300];
        glob_pattern(pattern, sizeof(pattern), input, "/*.txt");
        if (glob(pattern, 0, NULL, &g) == 0) { files = g.gl_pathv; nfiles = g.gl_pathc; }
    }
    for (size_t i = 0; i < nfiles && n < cap; i++) {
        if (stat(files[i], &st) != 0) continue;
        n += (size_t)snprintf(out + n, cap - n, "%s %lld %lld.%09ld\n", files[i], (long long)st.st_size,
                              (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    }
    if (g.gl_pathc) globfree(&g);
}

/* --data: tokenize the text once into <data>.gptc/ and point the train and
 * val patterns there. Reuses the cache when its stamp matches. */
static int data_from_text(const Options* o, const Tokenizer* tok, char* train_pattern, char* val_pattern, size_t cap) {
    char dir[4096], stamp_path[4200], prefix[4200], stamp[16384];
    snprintf(dir, sizeof(dir), "%s.gptc", o->data);
    snprintf(stamp_path, sizeof(stamp_path), "%s/stamp.txt", dir);
    snprintf(prefix, sizeof(prefix), "%s/shard", dir);
    glob_pattern(train_pattern, cap, prefix, "_train_*.bin"); /* <data> may hold glob characters: in[1].txt */
    glob_pattern(val_pattern, cap, prefix, "_val_*.bin");
    data_stamp(o->data, tok, stamp, sizeof(stamp));
    size_t len = 0;
    FILE* f = fopen(stamp_path, "rb");
    char* old = NULL;
    if (f) { fclose(f); old = file_read_all(stamp_path, &len); }
    int fresh = old && len == strlen(stamp) && memcmp(old, stamp, len) == 0;
    free(old);
    if (fresh) {
        printf("data: %s tokenized earlier, reusing %s\n", o->data, dir);
        return 0;
    }
    if (mkdir_p(dir) != 0) {
        FILE_ERROR(dir, "cannot create the token cache: %s", strerror(errno));
        return -1;
    }
    remove(stamp_path); /* invalid until the new shards are complete */
    char cmd[8500];
    glob_t g;
    glob_pattern(cmd, sizeof(cmd), prefix, "_*.bin");
    if (glob(cmd, 0, NULL, &g) == 0) { /* stale shards of an earlier input */
        for (size_t i = 0; i < g.gl_pathc; i++) remove(g.gl_pathv[i]);
        globfree(&g);
    }
    double t0 = time_ms();
    ShardStats st;
    if (prepare_shards(o->data, prefix, tok, 0.05, 100000000, &st) != 0) return -1;
    if (st.train_tokens == 0) { /* (the stamp stays absent: the next run tokenizes again) */
        FILE_ERROR(o->data, "gives %zu tokens in all, every one of them taken for the validation split: too little "
                   "text to train on; give more text", st.val_tokens);
        return -1;
    }
    printf("data: tokenized %s in %.1f s: %zu documents, %zu train + %zu val tokens (cached in %s)\n", o->data,
           (time_ms() - t0) / 1000.0, st.documents, st.train_tokens, st.val_tokens, dir);
    WriteChunk chunk;
    chunk.data = stamp;
    chunk.bytes = strlen(stamp);
    return write_file_atomic(stamp_path, &chunk, 1);
}

/* --prompt: encode the prompt, generate with the KV cache, print. */
static int generate_from_prompt(const GPT2* model, const Tokenizer* tok, const Options* o) {
    size_t len = strlen(o->prompt);
    int* ids = (int*)xmalloc(sizeof(int) * (len + 1));
    int n = (int)tokenizer_encode(tok, NULL, (const unsigned char*)o->prompt, len, ids, len);
    if (n == 0) ids[n++] = (int)tok->eot_token;
    if (n >= model->config.max_seq_len) {
        fprintf(stderr, "error: the prompt is %d tokens, the model's context is %d\n", n, model->config.max_seq_len);
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
    int made = gpt2_generate(model, ids, n, o->sample_length, &s, &rng, (int)tok->eot_token, out, print_token, (void*)tok);
    double ms = time_ms() - t0;
    printf("\n[%d prompt tokens, %d generated in %.0f ms: %.1f tokens/s]\n", n, made, ms, made / (ms / 1000.0));
    free(out);
    free(ids);
    return 0;
}

/* Everything a training loop needs besides the model and its arithmetic:
 * the data, the step count, the schedule and optimizer settings, the log.
 * train() below and gpu_train() in train_gpt.cu share it, so both print the
 * same lines and write the same JSONL. */
typedef struct {
    DataLoader train, val;
    int use_val;
    int B, T, total, grad_accum, steps;
    LRSchedule sched;
    AdamWConfig opt;
    Rng sample_rng;
    FILE* log;
    double start_ms;
    int rank, world;
    uint64_t nonce;   /* this run's (section 10) */
    LossWatch watch;  /* the loss-spike detector */
} TrainRun;

/* rank/world: this process's place among the data-parallel ranks (0, 1 alone). */
static int train_run_init(TrainRun* r, const GPT2Config* c, const Options* o, const char* train_pattern,
                          const char* val_pattern, int rank, int world) {
    memset(r, 0, sizeof(*r));
    r->rank = rank;
    r->world = world;
    r->B = o->batch_size;
    r->T = o->seq_len;
    r->total = o->total_batch_size > 0 ? o->total_batch_size : r->B * r->T * world;
    if (r->total % (r->B * r->T * world) != 0) {
        fprintf(stderr, "error: --total-batch-size %d is not a multiple of B*T*ranks = %d*%d*%d\n", r->total, r->B,
                r->T, world);
        return -1;
    }
    r->grad_accum = r->total / (r->B * r->T * world);
    printf("batch: B=%d T=%d on %d rank(s), %d tokens per step (%d micro-batches)\n", r->B, r->T, world, r->total,
           r->grad_accum);
    if (dataloader_init(&r->train, train_pattern, r->B, r->T, rank, world, c->vocab_size, o->shuffle,
                        (uint64_t)o->seed) != 0)
        return -1;
    r->use_val = val_pattern[0] != '\0' && o->val_every > 0;
    if (r->use_val && dataloader_init(&r->val, val_pattern, r->B, r->T, rank, world, c->vocab_size, 0, 0) != 0) {
        dataloader_free(&r->train);
        return -1;
    }
    if (r->use_val)
        printf("val data: unigram entropy %.3f nats (a model that ignores context can do no better)\n",
               dataloader_unigram_entropy(&r->val));
    r->steps = o->steps;
    if (r->steps < 0) r->steps = (int)(dataloader_batches_per_epoch(&r->train) / r->grad_accum);
    if (r->steps < 1) r->steps = 1;
    printf("data: %d train shard(s), %lld micro-batches per epoch; %d steps\n", r->train.num_shards,
           dataloader_batches_per_epoch(&r->train), r->steps);
    if (o->output_dir[0] && mkdir_p(o->output_dir) != 0) {
        FILE_ERROR(o->output_dir, "cannot create output directory: %s", strerror(errno));
        return -1;
    }
    if (o->output_dir[0] && o->snapshot_every > 0 && mkdir_p(o->shm_dir) != 0) {
        FILE_ERROR(o->shm_dir, "cannot create the --shm-dir folder for memory snapshots: %s", strerror(errno));
        return -1;
    }
    if (o->log_file[0] && rank == 0 && !(r->log = fopen(o->log_file, o->resume ? "a" : "w"))) {
        FILE_ERROR(o->log_file, "cannot open log file: %s", strerror(errno));
        return -1;
    }
    ALWAYS(schedule_parse(o->lr_schedule, &r->sched.kind) == 0);
    r->sched.max_lr = o->lr;
    r->sched.warmup_steps = o->warmup_steps;
    r->sched.total_steps = r->steps;
    r->sched.final_frac = o->final_lr_frac;
    r->sched.decay_frac = o->decay_frac;
    r->opt.beta1 = o->beta1;
    r->opt.beta2 = o->beta2;
    r->opt.eps = o->eps;
    r->opt.weight_decay = o->weight_decay;
    r->opt.decay_all = o->decay_all;
    rng_init(&r->sample_rng, (uint64_t)o->seed + 1);
    r->start_ms = time_ms();
    return 0;
}

static void train_run_free(TrainRun* r) {
    if (r->log) fclose(r->log);
    if (r->use_val) dataloader_free(&r->val);
    dataloader_free(&r->train);
    memset(r, 0, sizeof(*r));
}

static int train_run_val_due(const TrainRun* r, const Options* o, int step) {
    return r->use_val && (step % o->val_every == 0 || step == r->steps);
}

static int train_run_sample_due(const TrainRun* r, const Options* o, int step) {
    return o->sample_every > 0 && step > 0 && (step % o->sample_every == 0 || step == r->steps);
}

static void train_run_log_val(TrainRun* r, int step, float val_loss) {
    printf("val loss %.4f\n", val_loss);
    if (r->log) fprintf(r->log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, val_loss);
}

/* The progress line and the JSONL record of a finished step (0-based);
 * `extra` is inserted after tokens/s (the CUDA twin's MFU). */
static void train_run_log_step(TrainRun* r, int step, double loss, float lr, double norm, double ms, int finite,
                               const char* extra) {
    double elapsed = (time_ms() - r->start_ms) / 1000.0;
    double eta = elapsed / (step + 1) * (r->steps - step - 1);
    printf("step %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | eta %dm%02ds%s\n", step + 1,
           r->steps, loss, lr, norm, ms, r->total / (ms / 1000.0), extra, (int)eta / 60, (int)eta % 60,
           finite ? "" : " | non-finite: update skipped");
    fflush(stdout);
    if (r->log) {
        fprintf(r->log, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"norm\": %.6f, \"ms\": %.2f, \"unix_ms\": %.0f}\n",
                step + 1, loss, lr, norm, ms, unix_ms());
        fflush(r->log);
    }
}

/* Before the first step: every rank must hold the same configuration, the
 * same initial weights and the same data files, or the run would silently
 * train nonsense (or hang in a collective of the wrong size). Each rank
 * hashes the three; all compare with rank 0; on a mismatch every rank says
 * what differs and the run stops, on every rank, with no hang. */
/* The fingerprints the ranks compare: [0] the configuration (model shape
 * and training flags), [1] the initial weights, [2] the training data
 * files (names and sizes). Shared with train_gpt.cu. */
MAYBE_UNUSED static void run_fingerprint(const GPT2* model, const Options* o, int zero, int overlap,
                                         const DataLoader* train, uint64_t h[3]) {
    h[0] = h[1] = h[2] = 0xCBF29CE484222325ull;
    h[0] = fnv1a(h[0], &model->config, sizeof(GPT2Config));
    int ints[] = {o->batch_size, o->seq_len, o->total_batch_size, o->steps, o->warmup_steps, o->seed, o->shuffle,
                  o->decay_all, zero, overlap};
    float floats[] = {o->lr, o->final_lr_frac, o->decay_frac, o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_clip};
    h[0] = fnv1a(h[0], ints, sizeof(ints));
    h[0] = fnv1a(h[0], floats, sizeof(floats));
    h[0] = fnv1a(h[0], o->lr_schedule, strlen(o->lr_schedule));
    h[1] = fnv1a(h[1], model->params_memory, model->num_parameters * sizeof(float));
    for (int i = 0; i < train->num_shards; i++) {
        const char* name = train->files.gl_pathv[i];
        h[2] = fnv1a(h[2], name, strlen(name));
        h[2] = fnv1a(h[2], &train->shard_tokens[i], sizeof(long long));
    }
}

/* Every rank's fingerprints (`all`: world x 3, gathered): rank 0 and each
 * rank that differs from it say what differs. 1 if any does. */
MAYBE_UNUSED static int fingerprints_differ(const uint64_t* all, int rank, int world) {
    static const char* const what[3] = {"configuration (model shape or training flags)", "initial weights",
                                        "training data (shard names or sizes)"};
    int bad = 0;
    for (int r = 1; r < world; r++)
        for (int k = 0; k < 3; k++)
            if (all[3 * r + k] != all[k]) {
                if (rank == 0 || rank == r)
                    fprintf(stderr, "error: rank %d: its %s differs from rank 0's: launch every rank with the same "
                            "flags and files\n", r, what[k]);
                bad = 1;
            }
    return bad;
}

static int dist_check_agreement(const Dist* d, const GPT2* model, const Options* o, const DataLoader* train) {
    if (d->world == 1) return 0; /* (hashing GPT-2 124M's weights takes half a second) */
    uint64_t h[3];
    run_fingerprint(model, o, d->zero, d->overlap, train, h);
#ifdef USE_MPI
    uint64_t* all = (uint64_t*)xmalloc(sizeof(uint64_t) * 3 * (size_t)d->world);
    MPI_CHECK(MPI_Allgather(h, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD));
    int bad = fingerprints_differ(all, d->rank, d->world);
    free(all);
    if (bad && d->rank != 0) fprintf(stderr, "error: rank %d: the ranks disagree (see rank 0's message); stopping\n", d->rank);
    return bad ? -1 : 0;
#else
    (void)d;
    return 0;
#endif
}

static StateInfo state_info_of(const TrainRun* r, const Dist* d, const GPT2* model, const Options* o, int step) {
    StateInfo s;
    memset(&s, 0, sizeof(s));
    s.step = step; s.rank = d->rank; s.world = d->world; s.zero = d->zero;
    s.B = r->B; s.T = r->T; s.total = r->total; s.seed = o->seed; s.shuffle = r->train.shuffle;
    s.config = model->config;
    s.epoch = r->train.epoch; s.shard_pos = r->train.shard_pos; s.cursor = r->train.cursor;
    s.P = model->num_parameters; s.lo = d->save_lo; s.hi = d->save_hi;
    s.sample_rng = r->sample_rng.state;
    s.nonce = r->nonce;
    s.steps = r->steps;
    s.watch = r->watch;
    return s;
}

static int int_compare(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

/* The steps with a state_<step>.complete marker in `dir`, ascending; the
 * count, or 0. Caller frees *steps. */
static int state_complete_steps(const char* dir, int** steps) {
    char pattern[8300];
    glob_pattern(pattern, sizeof(pattern), dir, "/state_*.complete");
    glob_t g;
    int n = 0;
    *steps = NULL;
    if (glob(pattern, 0, NULL, &g) == 0) {
        *steps = (int*)xmalloc(sizeof(int) * g.gl_pathc);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char* base = strrchr(g.gl_pathv[i], '/');
            (*steps)[n++] = atoi((base ? base + 1 : g.gl_pathv[i]) + 6);
        }
        globfree(&g);
        qsort(*steps, (size_t)n, sizeof(int), int_compare);
    }
    return n;
}

/* Retention: keep the newest --keep-last complete states and every step
 * that is a multiple of --keep-every; remove the rest. Markers go first (so
 * a half-removed step is never taken for complete), then, after every rank
 * has seen the same list, each rank's own files. */
static void state_prune(const Dist* d, const Options* o) {
    if (o->keep_last <= 0) return;
    char path[4400];
    int* steps;
    dist_barrier(d); /* rank 0's newest marker is on disk before anyone lists */
    int n = state_complete_steps(o->output_dir, &steps);
    dist_barrier(d); /* everyone has the list before a marker goes */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n - o->keep_last; i++) {
            if (o->keep_every > 0 && steps[i] % o->keep_every == 0) continue;
            if (pass == 0 && d->rank == 0) {
                state_path(path, sizeof(path), o->output_dir, steps[i], -1);
                remove(path);
            } else if (pass == 1) {
                state_path(path, sizeof(path), o->output_dir, steps[i], d->rank);
                remove(path);
            }
        }
        if (pass == 0) dist_barrier(d);
    }
    free(steps);
}

/* Where the snapshot slots of this run live: <shm-dir>/gptc-<tag>-state<of>-at<at>-<k>.bin,
 * the state of rank `of` kept by rank `at` (its own when of == at, else the
 * replica of its neighbour's), slot k; tag = a hash of the output folder's
 * absolute path, so a restarted run finds its memory and two runs never
 * share it. */
static void slot_path(char* out, size_t cap, const Options* o, int of, int at, int k) {
    char real[4096];
    const char* dir = realpath(o->output_dir, real) ? real : o->output_dir;
    uint64_t tag = fnv1a(0xCBF29CE484222325ull, dir, strlen(dir));
    snprintf(out, cap, "%s/gptc-%016llx-state%d-at%d-%d.bin", o->shm_dir, (unsigned long long)tag, of, at, k);
}

/* Snapshots and saving, in two phases (CheckFreq, Mohan et al. 2021):
 * at a step boundary a background thread copies the weights and moments
 * into a snapshot slot while the next step's forward and backward run (they
 * only read them); the trainer waits for the copy only before its next
 * update, so the stall is what the copy did not hide (measured and
 * printed). The same thread then writes the record's checksums. Next:
 *   - every --snapshot-every steps the record stays in /dev/shm (three
 *     slots: two taking turns, one more for the disk writer to hold) and is
 *     sent to rank (r+1) mod W, which keeps it in one of two replica slots
 *     (non-blocking MPI, progressed by the step's own collectives);
 *   - every --save-every steps a second thread writes it to disk (state file
 *     per rank, model file by rank 0); when every rank's write succeeded,
 *     rank 0 writes state_<step>.complete. The ranks compare notes on the
 *     main thread at step boundaries (MPI is only called from there). A
 *     failed write (disk full...) leaves the previous complete state the
 *     newest, with a warning, and training continues (protected by the
 *     memory snapshots when they are on).
 * With --save-async 0 everything happens at the step boundary instead, the
 * usual synchronous way (for comparison: make bench-failover). */
#define OWN_SLOTS 3
#define HELD_SLOTS 2
typedef struct {
    int memory;            /* --snapshot-every > 0: slots in shm, replicas */
    int nslots;            /* own slots in use: OWN_SLOTS, or 1 when only saving to disk */
    Slot own[OWN_SLOTS];
    Slot held[HELD_SLOTS]; /* replicas of rank (r - 1) mod W */
    int newest;            /* own slot with the newest complete snapshot, -1 none */
    int held_next;         /* the held slot the next replica goes to */
    /* the copier (phase one) */
    pthread_t copier;
    int copier_busy;       /* a thread was started and not joined */
    int copied;            /* set by the copier once the arrays are copied */
    int confirmed;         /* the trainer saw `copied` (so every rank joins the copier at the same boundary) */
    int fill;              /* the slot it fills */
    int fill_save;         /* that snapshot also goes to disk */
    StateInfo info;
    const float *params, *m, *v; /* this rank's slices of the trainer's arrays */
    const float* all_params;     /* rank 0, saving: all the weights, copied to model_params */
    float* model_params;         /* (P) rank 0: the weights the model file is written from */
    double t_snap;         /* when the snapshot began */
    /* the disk writer (phase two) */
    pthread_t writer;
    int writer_busy;
    int written;           /* set by the writer when done */
    int write_result;      /* 0 = ok */
    int pinned;            /* the slot it reads, -1 none */
    int write_step;
    char state_file[4400], model_file[4400];
    GPT2Config config;
    /* figures */
    double stall_ms, disk_wait_ms, max_stall_ms; /* over all snapshots, and the worst one */
    double snap_stall;     /* the stall of the snapshot in progress so far */
    int snapshots;
    int last_failed;       /* the last disk write failed on some rank */
#ifdef USE_MPI
    MPI_Request send[OWN_SLOTS];  /* replica of own slot k on its way to rank r + 1 */
    MPI_Request recv[HELD_SLOTS]; /* replica arriving from rank r - 1 */
#endif
} Saver;

static void* saver_copier_main(void* arg) {
    Saver* sv = (Saver*)arg;
    slot_fill(&sv->own[sv->fill], &sv->info, sv->params, sv->m, sv->v, &sv->copied, sv->all_params,
              sv->all_params ? sv->model_params : NULL);
    return NULL;
}

static void* saver_writer_main(void* arg) {
    Saver* sv = (Saver*)arg;
    const Slot* sl = &sv->own[sv->pinned];
    WriteChunk chunk = {sl->base, sl->bytes};
    int rc = write_file_atomic(sv->state_file, &chunk, 1);
    if (rc == 0 && sv->model_file[0])
        rc = model_file_write(sv->model_file, &sv->config, sv->model_params);
    sv->write_result = rc;
    __atomic_store_n(&sv->written, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Map the slots (what an earlier process left in them stays, for
 * state_resume to read). Returns 0 or -1 (with a message on this rank;
 * collective). */
static int saver_init(Saver* sv, const Dist* d, const GPT2* model, const Options* o) {
    memset(sv, 0, sizeof(*sv));
    sv->newest = sv->pinned = -1;
#ifdef USE_MPI
    for (int k = 0; k < OWN_SLOTS; k++) sv->send[k] = MPI_REQUEST_NULL;
    for (int k = 0; k < HELD_SLOTS; k++) sv->recv[k] = MPI_REQUEST_NULL;
#endif
    if (!o->output_dir[0]) return 0;
    sv->memory = o->snapshot_every > 0;
    sv->nslots = sv->memory ? OWN_SLOTS : 1;
    size_t bytes = state_bytes(d->save_hi - d->save_lo);
    CHECK(d->world == 1 || bytes / 4 <= (size_t)INT32_MAX, "a state of %zu bytes is too large for one MPI message", bytes);
    int ok = 1;
    char path[4400];
    for (int k = 0; k < sv->nslots && ok; k++) {
        slot_path(path, sizeof(path), o, d->rank, d->rank, k);
        ok = slot_map(&sv->own[k], sv->memory ? path : NULL, bytes) == 0;
    }
    for (int k = 0; k < HELD_SLOTS && ok && sv->memory && d->world > 1; k++) {
        int of = (d->rank + d->world - 1) % d->world;
        slot_path(path, sizeof(path), o, of, d->rank, k);
        size_t lo, hi;
        dist_slice(d, model->num_parameters, of, &lo, &hi);
        ok = slot_map(&sv->held[k], path, state_bytes(hi - lo)) == 0;
    }
    if (d->rank == 0) sv->model_params = xmalloc_floats(model->num_parameters);
    if (dist_sum(d, ok) < d->world) return -1;
    if (sv->memory)
        printf("snapshots: every %d step(s) to %s (%d slots of %.2f GB%s)%s\n", o->snapshot_every, o->shm_dir,
               sv->nslots, bytes / 1e9, d->world > 1 ? ", and a replica at rank (r+1) mod W" : "",
               o->save_async ? "" : "; synchronous (--save-async 0)");
    return 0;
}

/* After resuming at `start`: a slot left by an earlier process that holds
 * a later step (some rank lacked it, so the run went back further) is
 * cleared, so it can never be mixed with this run's later snapshots. */
static void saver_forget_after(Saver* sv, int start) {
    for (int k = 0; k < OWN_SLOTS + HELD_SLOTS; k++) {
        Slot* sl = k < OWN_SLOTS ? &sv->own[k] : &sv->held[k - OWN_SLOTS];
        int32_t* h = (int32_t*)sl->base;
        if (h && h[0] == STATE_MAGIC && h[2] > start) h[0] = 0;
    }
}

/* The previous snapshot's copy must be done before the trainer changes its
 * weights: call before each update. The wait is the snapshot's stall. */
static void saver_before_update(Saver* sv) {
    if (!sv->copier_busy) return;
    sv->confirmed = 1;
    if (__atomic_load_n(&sv->copied, __ATOMIC_ACQUIRE)) return;
    double t0 = time_ms();
    while (!__atomic_load_n(&sv->copied, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 20000}; /* 20 us */
        nanosleep(&ts, NULL);
    }
    sv->snap_stall += time_ms() - t0;
}

/* The snapshot in progress is done stalling: count it. */
static void saver_stall_close(Saver* sv) {
    sv->stall_ms += sv->snap_stall;
    if (sv->snap_stall > sv->max_stall_ms) sv->max_stall_ms = sv->snap_stall;
    sv->snap_stall = 0.0;
}

/* The disk writer is done: every rank's result decides the marker. */
static void saver_mark(Saver* sv, const Dist* d, const Options* o) {
    CHECK(pthread_join(sv->writer, NULL) == 0, "cannot join the state writer thread");
    sv->writer_busy = 0;
    sv->pinned = -1;
    int step = sv->write_step;
    sv->last_failed = dist_sum(d, sv->write_result == 0) < d->world;
    if (sv->last_failed) {
        fprintf(stderr, "warning: rank %d: the training state of step %d is incomplete on disk; the previous one stays "
                "the newest there, training continues%s\n", d->rank, step,
                sv->memory ? " (protected by the memory snapshots)" : "");
        return;
    }
    if (d->rank == 0) {
        char path[4400];
        state_path(path, sizeof(path), o->output_dir, step, -1);
        WriteChunk c = {"complete\n", 9};
        if (write_file_atomic(path, &c, 1) == 0)
            printf("saved step %d: training state complete on disk (%.0f ms after its snapshot), model in %s\n", step,
                   time_ms() - sv->t_snap, sv->model_file);
    }
    state_prune(d, o);
}

/* At a step boundary: finish what the background threads have finished.
 * `wait`: wait for all of it (the end of the run). Collective. */
static void saver_poll(Saver* sv, const Dist* d, const Options* o, int wait) {
    if (sv->copier_busy && (wait || sv->confirmed)) {
        /* the copy is done; the checksums take a little longer (counted in the stall) */
        double t0 = time_ms();
        CHECK(pthread_join(sv->copier, NULL) == 0, "cannot join the snapshot thread");
        if (o->save_async) sv->snap_stall += time_ms() - t0;
        sv->copier_busy = 0;
        int k = sv->fill;
        sv->newest = k;
        sv->snapshots++;
#ifdef USE_MPI
        if (sv->memory && d->world > 1) { /* the replica: to r + 1, from r - 1 */
            int to = (d->rank + 1) % d->world, from = (d->rank + d->world - 1) % d->world;
            int j = sv->held_next;
            sv->held_next = (j + 1) % HELD_SLOTS;
            MPI_CHECK(MPI_Wait(&sv->recv[j], MPI_STATUS_IGNORE));
            MPI_CHECK(MPI_Irecv(sv->held[j].base, (int)(sv->held[j].bytes / 4), MPI_FLOAT, from, 7, MPI_COMM_WORLD,
                                &sv->recv[j]));
            MPI_CHECK(MPI_Isend(sv->own[k].base, (int)(sv->own[k].bytes / 4), MPI_FLOAT, to, 7, MPI_COMM_WORLD,
                                &sv->send[k]));
        }
#endif
        if (sv->fill_save) { /* phase two: to disk, by the writer, from this slot */
            if (sv->writer_busy) { /* the disk is slower than the saves: wait (bounded memory) */
                double t0 = time_ms();
                while (!__atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) {
                    struct timespec ts = {0, 1000000};
                    nanosleep(&ts, NULL);
                }
                saver_mark(sv, d, o);
                sv->disk_wait_ms += time_ms() - t0;
            }
            sv->pinned = k;
            sv->write_step = sv->info.step;
            sv->written = 0;
            sv->write_result = -1;
            state_path(sv->state_file, sizeof(sv->state_file), o->output_dir, sv->info.step, d->rank);
            sv->model_file[0] = '\0';
            if (d->rank == 0)
                snprintf(sv->model_file, sizeof(sv->model_file), "%s/model_%08d.bin", o->output_dir, sv->info.step);
            sv->config = sv->info.config;
            CHECK(pthread_create(&sv->writer, NULL, saver_writer_main, sv) == 0, "cannot start the state writer thread");
            sv->writer_busy = 1;
        }
    }
    if (sv->writer_busy) { /* every rank's write done? (decided together) */
        if (wait)
            while (!__atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        if (dist_sum(d, __atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) == d->world) saver_mark(sv, d, o);
    }
#ifdef USE_MPI
    if (wait) {
        MPI_CHECK(MPI_Waitall(OWN_SLOTS, sv->send, MPI_STATUSES_IGNORE));
        MPI_CHECK(MPI_Waitall(HELD_SLOTS, sv->recv, MPI_STATUSES_IGNORE));
    }
#endif
}

/* Phase one, at the boundary after step `step`: start copying the state
 * into a free slot. `save`: it also goes to disk. */
static void saver_snapshot(Saver* sv, const TrainRun* r, const Dist* d, const GPT2* model, const Options* o, int step,
                           int save) {
    if (!o->output_dir[0]) return;
    saver_poll(sv, d, o, 0);
    if (sv->copier_busy) { /* snapshots closer together than a copy takes */
        saver_before_update(sv);
        saver_poll(sv, d, o, 0);
    }
    int k = 0;
    while (k < sv->nslots && (k == sv->newest || k == sv->pinned)) k++;
    if (k == sv->nslots) { /* one slot (disk only): it is pinned by the writer, wait for it */
        saver_poll(sv, d, o, 1);
        k = 0;
    }
#ifdef USE_MPI
    MPI_CHECK(MPI_Wait(&sv->send[k], MPI_STATUS_IGNORE)); /* its last replica has left */
#endif
    sv->fill = k;
    sv->fill_save = save;
    sv->info = state_info_of(r, d, model, o, step);
    size_t at = dist_moments_at(d);
    sv->params = model->params_memory + d->save_lo;
    sv->m = model->m_memory + at;
    sv->v = model->v_memory + at;
    sv->all_params = save && d->rank == 0 ? model->params_memory : NULL;
    saver_stall_close(sv); /* the previous snapshot's stall is all counted by now */
    sv->copied = sv->confirmed = 0;
    sv->t_snap = time_ms();
    CHECK(pthread_create(&sv->copier, NULL, saver_copier_main, sv) == 0, "cannot start the snapshot thread");
    sv->copier_busy = 1;
    if (!o->save_async) { /* the synchronous way: all of it now */
        double t0 = time_ms();
        saver_poll(sv, d, o, 1);
        sv->snap_stall += time_ms() - t0;
    }
}

/* Take back the newest snapshot in memory (a rollback): weights, moments
 * and the sampler; the data loader stays where it is, so the batches since
 * are skipped. Returns its step, or -1 when there is none. Collective. */
static int saver_restore_newest(Saver* sv, TrainRun* r, const Dist* d, GPT2* model, const Options* o) {
    saver_before_update(sv);
    saver_poll(sv, d, o, 0);
    StateInfo s;
    size_t at = dist_moments_at(d);
    int ok = sv->newest >= 0 && state_load_record(sv->own[sv->newest].base, sv->own[sv->newest].bytes,
                                                  "the newest memory snapshot", &s, model->params_memory,
                                                  model->m_memory + at, model->v_memory + at) == 0;
    if (dist_sum(d, ok) < d->world) return -1; /* (every rank takes its snapshots at the same steps) */
    dist_allgather_state(d, model);
    r->sample_rng.state = s.sample_rng;
    return s.step;
}

/* A bad step (non-finite, or a loss spike) was skipped: count it, and after
 * --rollback-after in a row go back to the newest memory snapshot (weights,
 * moments, sampler; the data loader stays, so the batches since are
 * skipped). Returns the snapshot's step, where the loop continues, or -1.
 * `can_restore` 0: this run keeps no snapshot to go back to. Collective. */
static int train_run_bad_step(TrainRun* r, Saver* sv, const Dist* d, GPT2* model, const Options* o, int step,
                              int can_restore) {
    if (++r->watch.bad_run < o->rollback_after || o->rollback_after == 0) return -1;
    int back = can_restore ? saver_restore_newest(sv, r, d, model, o) : -1;
    if (back < 0) {
        printf("rollback: %d bad steps in a row but no snapshot in memory (--snapshot-every): skipping on\n",
               r->watch.bad_run);
        return -1;
    }
    printf("rollback: %d bad steps in a row; weights and moments back to the snapshot of step %d, skipping the "
           "batches of steps %d..%d\n", r->watch.bad_run, back, back + 1, step + 1);
    r->watch.bad_run = 0;
    return back;
}

/* On an error: let the background threads finish (no collectives: the
 * other ranks may be gone), keep the memory snapshots for a resume. */
static void saver_abandon(Saver* sv) {
    if (sv->copier_busy) CHECK(pthread_join(sv->copier, NULL) == 0, "cannot join the snapshot thread");
    if (sv->writer_busy) CHECK(pthread_join(sv->writer, NULL) == 0, "cannot join the state writer thread");
    sv->copier_busy = sv->writer_busy = 0;
}

static void saver_free(Saver* sv, int remove_memory) {
    free(sv->model_params);
    for (int k = 0; k < OWN_SLOTS; k++) slot_unmap(&sv->own[k], remove_memory);
    for (int k = 0; k < HELD_SLOTS; k++) slot_unmap(&sv->held[k], remove_memory);
    memset(sv, 0, sizeof(*sv));
}

/* Why a state `s` cannot continue this run (`now`), or NULL. A state from
 * another number of ranks or another --zero is fine from disk (every rank
 * reads the parts of the moments its shard needs: resharding) as long as
 * the tokens per step and T are the same; a snapshot in memory is one
 * rank's and needs the same layout. */
static const char* state_differs(const StateInfo* s, const StateInfo* now, int same_layout) {
    return memcmp(&s->config, &now->config, sizeof(GPT2Config)) ? "the model's shape"
           : s->T != now->T ? "--seq-len"
           : s->total != now->total ? "--total-batch-size (tokens per step)"
           : s->seed != now->seed ? "--seed"
           : s->shuffle != now->shuffle ? "--shuffle"
           : same_layout && (s->world != now->world || s->zero != now->zero || s->B != now->B ||
                             s->lo != now->lo || s->hi != now->hi) ? "the ranks' layout" : NULL;
}

/* The run's nonce: <dir>/run.id, written (by rank 0) when a run starts from
 * step 0. States and snapshots carry it, so those left by another run in
 * the same folder (wiped and restarted) are never taken for this one's.
 * The file is one line, "<nonce, 16 hex digits> <CRC32C of those 16
 * characters, 8 hex digits>": a changed digit is caught, not taken for
 * another run. (Files of 17 bytes, the nonce alone, are read as before.) */
static void run_id_format(char* out, size_t cap, unsigned long long nonce) {
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", nonce);
    snprintf(out, cap, "%s %08x\n", hex, crc32c(0, hex, 16));
}

/* 1 and *nonce when <dir>/run.id is there and intact, 0 when there is none,
 * -1 (after a message) when it is damaged. */
static int run_id_read(const char* dir, uint64_t* nonce) {
    char path[4400], text[64] = {0}, want[64];
    snprintf(path, sizeof(path), "%s/run.id", dir);
    *nonce = 0;
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    unsigned long long v = 0;
    int legacy = n == 17 && sscanf(text, "%16llx", &v) == 1 && text[16] == '\n';
    if (!legacy && (n != 26 || sscanf(text, "%16llx", &v) != 1 || (run_id_format(want, sizeof(want), v),
                                                                   memcmp(text, want, 26) != 0))) {
        FILE_ERROR(path, "damaged (%zu bytes; expected a 16-digit run nonce and its 8-digit checksum): the states in "
                   "this folder cannot be matched to it. If they are this run's, remove run.id and resume again (the "
                   "newest complete state is then taken); to start a new run, use a new --output-dir", n);
        return -1;
    }
    *nonce = v;
    return 1;
}

static uint64_t run_nonce(const Dist* d, const Options* o, int create) {
    char path[4400];
    snprintf(path, sizeof(path), "%s/run.id", o->output_dir);
    if (create && d->rank == 0) {
        unsigned long long nonce = ((uint64_t)unix_ms() << 20) ^ (uint64_t)getpid() ^ ((uint64_t)rand() << 40);
        char text[64];
        run_id_format(text, sizeof(text), nonce);
        WriteChunk c = {text, strlen(text)};
        if (write_file_atomic(path, &c, 1) != 0) fprintf(stderr, "warning: %s not written\n", path);
    }
    dist_barrier(d);
    uint64_t nonce;
    if (run_id_read(o->output_dir, &nonce) < 0) nonce = 0; /* (state_resume refuses a damaged one) */
    return nonce;
}

/* Load a state from disk: every rank reads every file of the step, taking
 * each file's slice of the weights and the part of its moments this rank
 * holds (all of them under plain data parallel, its shard under ZeRO). So
 * a state saved by another number of ranks, another --zero or another B
 * (the same tokens per step) loads the same way: resharding. */
static int state_load_disk(TrainRun* r, const Dist* d, GPT2* model, const Options* o, int step, StateInfo* out) {
    char path[4400];
    int32_t h[HEADER_INTS];
    StateInfo s0, s;
    StateInfo now = state_info_of(r, d, model, o, step);
    state_path(path, sizeof(path), o->output_dir, step, 0);
    if (state_read_header(path, &s0, h, 0) != 0) return -1;
    if (d->rank == 0 && (s0.world != now.world || s0.zero != now.zero || s0.B != now.B))
        printf("resume: resharding the state of %d rank(s) (--zero %d, B=%d) onto %d (--zero %d, B=%d)\n", s0.world,
               s0.zero, s0.B, now.world, now.zero, now.B);
    size_t covered = 0;
    for (int j = 0; j < s0.world; j++) {
        state_path(path, sizeof(path), o->output_dir, step, j);
        if (state_read_header(path, &s, h, 0) != 0) return -1;
        /* every rank's file must be of this run and this step: its size and
         * slice are trusted below (a file of another model would write past
         * the weights) */
        const char* differs = state_differs(&s, &now, 0);
        const char* mixed = s.step != step                    ? "the step inside it differs from the one in its name"
                            : s.rank != j                      ? "the rank inside it differs from the one in its name"
                            : s.world != s0.world              ? "it was written by another number of ranks than rank 0's"
                            : s.nonce != s0.nonce              ? "its run.id nonce differs from rank 0's (another run)"
                            : differs                          ? differs
                            : s.hi > model->num_parameters     ? "its slice ends past the model's parameters"
                            : s.lo != covered                  ? "its slice does not begin where the previous rank's ends"
                            : s.epoch != s0.epoch || s.shard_pos != s0.shard_pos || s.cursor != s0.cursor
                                                               ? "its data position differs from rank 0's" : NULL;
        if (mixed) {
            FILE_ERROR(path, "cannot be part of the state of step %d beside %s/state_%08d_rank0.bin: %s%s (holds "
                       "step %d, rank %d of %d, parameters [%zu, %zu)); remove the step's files or restore them",
                       step, o->output_dir, step, mixed, differs && mixed == differs ? " differs" : "", s.step, s.rank,
                       s.world, s.lo, s.hi);
            return -1;
        }
        covered = s.hi;
        if (state_read_arrays(path, &s, h, model->params_memory, model->m_memory, model->v_memory, d->lo, d->hi) != 0)
            return -1;
    }
    if (covered != model->num_parameters) {
        FILE_ERROR(path, "the state's files cover %zu of %zu parameters", covered, model->num_parameters);
        return -1;
    }
    *out = s0;
    return 0;
}

/* Continue from the freshest state that every rank can get, in order of
 * preference: its own snapshot in memory (/dev/shm, survives the process),
 * the replica its neighbour (r+1) mod W keeps of it, the newest complete
 * state on disk. The ranks first agree on the newest step complete
 * everywhere, then load; a corrupt or missing copy falls back to the next
 * step, with a warning. Returns the step to continue from (0 when there is
 * none), or -1 when a state of this run cannot continue it (a clear error:
 * what differs). Collective. */
typedef enum { SOURCE_NONE, SOURCE_OWN, SOURCE_REPLICA, SOURCE_DISK } StateSource;
static const char* const SOURCE_NAMES[4] = {"nowhere", "its own snapshot in memory", "the neighbour's replica",
                                            "disk"};

static int state_resume(TrainRun* r, const Dist* d, GPT2* model, const Options* o, const Saver* sv,
                        StateSource* source_out) {
    int W = d->world, me = d->rank, next = (me + 1) % W, prev = (me + W - 1) % W;
    StateInfo now = state_info_of(r, d, model, o, 0), s;
    uint64_t id;
    if (dist_sum(d, run_id_read(o->output_dir, &id) < 0) > 0) return -1;
    int32_t h[HEADER_INTS];
    char path[4400];
    /* what each rank holds in memory: 3 own slots, 2 replicas of its predecessor */
    int mine[OWN_SLOTS + HELD_SLOTS];
    for (int k = 0; k < OWN_SLOTS + HELD_SLOTS; k++) {
        int own = k < OWN_SLOTS;
        slot_path(path, sizeof(path), o, own ? me : prev, me, own ? k : k - OWN_SLOTS);
        mine[k] = -1;
        int32_t magic = 0;
        FILE* f = fopen(path, "rb");
        if (f) { /* a slot that was being filled when the run stopped reads as empty: skip it quietly */
            if (fread(&magic, sizeof(magic), 1, f) != 1) magic = 0;
            fclose(f);
        }
        if (magic == STATE_MAGIC && state_read_header(path, &s, h, 1) == 0 && r->nonce && s.nonce == r->nonce &&
            s.rank == (own ? me : prev) && !state_differs(&s, &now, 0) && s.world == W && s.zero == now.zero && s.B == now.B)
            mine[k] = s.step;
    }
    int* all = (int*)xmalloc(sizeof(int) * (OWN_SLOTS + HELD_SLOTS) * (size_t)W);
#ifdef USE_MPI
    MPI_CHECK(MPI_Allgather(mine, OWN_SLOTS + HELD_SLOTS, MPI_INT, all, OWN_SLOTS + HELD_SLOTS, MPI_INT, MPI_COMM_WORLD));
#else
    memcpy(all, mine, sizeof(mine));
#endif
    int* disk;
    int ndisk = state_complete_steps(o->output_dir, &disk);
    /* every step anyone could offer, newest first */
    int ncand = 0, *cand = (int*)xmalloc(sizeof(int) * ((OWN_SLOTS + HELD_SLOTS) * (size_t)W + (size_t)ndisk + 1));
    for (int i = 0; i < (OWN_SLOTS + HELD_SLOTS) * W; i++)
        if (all[i] > 0) cand[ncand++] = all[i];
    for (int i = 0; i < ndisk; i++) cand[ncand++] = disk[i];
    qsort(cand, (size_t)ncand, sizeof(int), int_compare);
    int result = 0, unreadable = 0, passed_over = 0;
    StateSource src = SOURCE_NONE;
    for (int c = ncand - 1; c >= 0; c--) {
        int step = cand[c];
        if (c < ncand - 1 && cand[c + 1] == step) continue; /* tried */
        int own_slot = -1, held_by_next = 0, on_disk = 0;
        for (int k = 0; k < OWN_SLOTS; k++)
            if (all[me * (OWN_SLOTS + HELD_SLOTS) + k] == step) own_slot = k;
        for (int k = OWN_SLOTS; k < OWN_SLOTS + HELD_SLOTS; k++)
            if (W > 1 && all[next * (OWN_SLOTS + HELD_SLOTS) + k] == step) held_by_next = 1;
        for (int i = 0; i < ndisk; i++) on_disk |= disk[i] == step;
        src = own_slot >= 0 ? SOURCE_OWN : held_by_next ? SOURCE_REPLICA : on_disk ? SOURCE_DISK : SOURCE_NONE;
        if (dist_sum(d, src == SOURCE_NONE) > 0) continue; /* not complete everywhere */
        /* a disk state of an earlier run in this folder (one started afresh
         * since, with a new run.id) is passed over; one of this run that
         * cannot continue it is refused, together */
        const char* differs = NULL;
        int earlier = 0;
        if (src == SOURCE_DISK) {
            state_path(path, sizeof(path), o->output_dir, step, 0);
            if (state_read_header(path, &s, h, 1) == 0) {
                earlier = r->nonce && s.nonce != r->nonce;
                if (!earlier && (differs = state_differs(&s, &now, 0)))
                    fprintf(stderr, "error: %s was written by an incompatible run: %s differs; start a new "
                            "--output-dir or run with the same settings\n", path, differs);
            }
        }
        if (dist_sum(d, earlier) > 0) {
            if (d->rank == 0)
                fprintf(stderr, "warning: %s belongs to an earlier run in this folder (its run.id differs): passed over\n",
                        path);
            passed_over++;
            continue;
        }
        if (dist_sum(d, differs != NULL) > 0) {
            result = -1;
            break;
        }
        if (step > r->steps) { /* running on would save this later state's weights under an earlier step's name */
            if (d->rank == 0)
                fprintf(stderr, "error: the newest training state in %s is at step %d, past --steps %d: resume with "
                        "--steps %d or more, or use a new --output-dir\n", o->output_dir, step, r->steps, step);
            result = -1;
            break;
        }
        /* a replica travels back to its owner: who needs one? */
#ifdef USE_MPI
        int need = src == SOURCE_REPLICA, prev_needs = 0;
        int* needs = (int*)xmalloc(sizeof(int) * (size_t)W);
        MPI_CHECK(MPI_Allgather(&need, 1, MPI_INT, needs, 1, MPI_INT, MPI_COMM_WORLD));
        prev_needs = W > 1 && needs[prev];
        free(needs);
        /* a rank may both need its replica and hold the one its predecessor
         * needs (each lost its newest own snapshot): both directions are
         * posted non-blocking, sizes first, so no pair of sends can wait on
         * each other */
        char* out = NULL;               /* the replica of prev's state that this rank holds */
        long long out_floats = 0, replica_floats = 0;
        float* replica = NULL;          /* the replica of this rank's state, from its neighbour */
        MPI_Request rq[2];
        int nrq = 0;
        if (prev_needs) {
            int k = OWN_SLOTS;
            while (all[me * (OWN_SLOTS + HELD_SLOTS) + k] != step) k++;
            slot_path(path, sizeof(path), o, prev, me, k - OWN_SLOTS);
            size_t bytes = 0;
            out = file_read_all(path, &bytes);
            out_floats = out ? (long long)bytes / 4 : 0;
        }
        if (need) MPI_CHECK(MPI_Irecv(&replica_floats, 1, MPI_LONG_LONG, next, 8, MPI_COMM_WORLD, &rq[nrq++]));
        if (prev_needs) MPI_CHECK(MPI_Isend(&out_floats, 1, MPI_LONG_LONG, prev, 8, MPI_COMM_WORLD, &rq[nrq++]));
        MPI_CHECK(MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE));
        nrq = 0;
        if (need) replica = xmalloc_floats(replica_floats ? (size_t)replica_floats : 1);
        if (need && replica_floats)
            MPI_CHECK(MPI_Irecv(replica, (int)replica_floats, MPI_FLOAT, next, 9, MPI_COMM_WORLD, &rq[nrq++]));
        if (prev_needs && out_floats)
            MPI_CHECK(MPI_Isend(out, (int)out_floats, MPI_FLOAT, prev, 9, MPI_COMM_WORLD, &rq[nrq++]));
        MPI_CHECK(MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE));
        free(out);
#endif
        int ok;
        float* m_at = model->m_memory + dist_moments_at(d); /* where this rank's slice of the moments goes */
        float* v_at = model->v_memory + dist_moments_at(d);
        if (src == SOURCE_DISK) {
            ok = state_load_disk(r, d, model, o, step, &s) == 0;
        } else if (src == SOURCE_OWN && sv->memory) { /* the slot is mapped already: straight from memory */
            slot_path(path, sizeof(path), o, me, me, own_slot);
            ok = state_load_record(sv->own[own_slot].base, sv->own[own_slot].bytes, path, &s, model->params_memory, m_at,
                                   v_at) == 0 && s.step == step;
        } else if (src == SOURCE_OWN) { /* (this run takes no memory snapshots: read the file) */
            slot_path(path, sizeof(path), o, me, me, own_slot);
            ok = state_read_header(path, &s, h, 0) == 0 && s.step == step &&
                 state_read_arrays(path, &s, h, model->params_memory, model->m_memory, model->v_memory, d->lo, d->hi) == 0;
        } else {
#ifdef USE_MPI
            ok = state_load_record((const unsigned char*)replica, (size_t)replica_floats * 4, "the neighbour's replica",
                                   &s, model->params_memory, m_at, v_at) == 0 && s.step == step;
            free(replica);
#else
            ok = 0;
#endif
        }
        if (dist_sum(d, src != SOURCE_DISK) > 0 && dist_sum(d, ok) == W) dist_allgather_state(d, model); /* memory holds slices */
        int position_missing = ok && dataloader_seek(&r->train, s.epoch, s.shard_pos, s.cursor) != 0;
        if (dist_sum(d, position_missing) > 0) { /* the state is fine: the data is not the run's */
            if (d->rank == 0)
                fprintf(stderr, "error: the training state of step %d in %s was saved at data position epoch %d, "
                        "shard %d of that epoch's order, sample %lld, which the training data given (%d shard(s), "
                        "%s first) does not have: resume with the data the run was trained on, or start a new "
                        "--output-dir\n", step, o->output_dir, s.epoch, s.shard_pos, s.cursor, r->train.num_shards,
                        r->train.files.gl_pathv[0]);
            result = -1;
            break;
        }
        if (dist_sum(d, ok) == W) {
            if (s.steps != r->steps && d->rank == 0)
                printf("resume: --steps is %d, the state's run had %d: allowed; the schedule follows the new count\n",
                       r->steps, s.steps);
            r->sample_rng.state = s.sample_rng;
            r->watch = s.watch;
            result = step;
            break;
        }
        fprintf(stderr, "warning: rank %d: the training state of step %d is not usable on every rank (this rank: %s, "
                "%s); trying the one before\n", me, step, SOURCE_NAMES[src], ok ? "fine" : "unreadable");
        src = SOURCE_NONE;
        unreadable++;
    }
    if (result == 0 && passed_over > 0 && unreadable == 0) { /* states exist, none of this run: never start over them */
        if (d->rank == 0)
            fprintf(stderr, "error: every training state in %s belongs to another run than %s/run.id names (nonce "
                    "%016llx): if they are this run's and run.id was replaced, remove run.id and resume again; to "
                    "start a new run, use a new --output-dir (or run without --resume)\n", o->output_dir,
                    o->output_dir, (unsigned long long)r->nonce);
        result = -1;
    }
    if (result == 0 && unreadable > 0) { /* states of this run exist, none could be read: do not start over silently */
        fprintf(stderr, "error: no usable training state in %s (or in memory): repair or remove them, or start a new "
                "--output-dir\n", o->output_dir);
        result = -1;
    }
    if (result == 0 && d->rank == 0) printf("resume: no training state in %s or in memory: starting from step 0\n", o->output_dir);
    if (result > 0) { /* say where each rank's state came from */
        int* srcs = (int*)xmalloc(sizeof(int) * (size_t)W);
        int mine_src = (int)src;
#ifdef USE_MPI
        MPI_CHECK(MPI_Allgather(&mine_src, 1, MPI_INT, srcs, 1, MPI_INT, MPI_COMM_WORLD));
#else
        srcs[0] = mine_src;
#endif
        printf("resume: continuing after step %d;", result);
        for (int q = 0; q < W; q++) printf(" rank %d from %s%s", q, SOURCE_NAMES[srcs[q]], q + 1 < W ? "," : "\n");
        free(srcs);
    }
    *source_out = src;
    free(cand);
    free(disk);
    free(all);
    return result;
}

/* --heartbeat: after every step rank 0 rewrites a small file with the step
 * and the time, so a supervisor can tell a hung run (the file goes stale)
 * from a slow one. Not fsync'd: it is a sign of life, not a record. */
static void heartbeat_write(const Options* o, int rank, int step) {
    if (!o->heartbeat[0] || rank != 0) return;
    char tmp[4400];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->heartbeat);
    FILE* f = fopen(tmp, "w");
    if (!f) return; /* a missing heartbeat is the supervisor's to notice */
    fprintf(f, "step %d %.0f\n", step, unix_ms());
    if (fclose(f) == 0) rename(tmp, o->heartbeat); /* never seen half-written */
}

/* Lines for a supervisor or for several ranks (start-up timing, the
 * data-parallel layout) are noise to a newcomer's single run: they print
 * with several ranks, a --heartbeat, under scripts/supervise.py (which sets
 * GPTC_ATTEMPT) or with --verbose 1. options_parse sets the flag. */
static int plumbing_wanted(const Dist* d) {
    return verbose_flag || d->world > 1 || getenv("GPTC_ATTEMPT") != NULL;
}

/* Where a (re)start spent its time, in wall-clock ms since the process
 * began: scripts/supervise.py reads these lines to split a recovery into
 * launch, communicator, state load and first step. */
static void timing_print(const Dist* d, const char* what, double unix_now) {
    if (!plumbing_wanted(d)) return;
    printf("timing: %s at %.0f (+%.0f ms since process start %.0f)\n", what, unix_now, unix_now - d->t_start, d->t_start);
    fflush(stdout);
}

/* Test hooks (test_gpt.c's bad-step tests): GPTC_INJECT_NAN and
 * GPTC_INJECT_SPIKE list steps (1-based, comma-separated) at which rank 0
 * puts a NaN into its gradients, or at which the loss the spike detector
 * sees is raised by 100 (each step once, though a rollback replays it).
 * Said aloud when set. */
static int inject_at(const char* var, int step, int* done_upto) {
    const char* list = getenv(var);
    if (!list || step <= *done_upto) return 0; /* once per step: a rollback replays step numbers */
    for (const char* p = list; *p;) {
        char* end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (v == step) {
            *done_upto = step;
            return 1;
        }
        p = *end == ',' ? end + 1 : end;
        if (end == p) break;
    }
    return 0;
}

/* The steps of a run, from the set-up to the final save (train() below
 * owns the TrainRun and the Saver). 0, or -1 after a message. */
static int train_steps(TrainRun* r, Saver* saver, GPT2* model, const Options* o, const Tokenizer* tok, Dist* dist,
                       int* remove_memory) {
    if (dist_check_agreement(dist, model, o, &r->train) != 0) return -1;
    gpt2_alloc_training(model, r->B, r->T);
    dist_setup_model(dist, model);
    double mb = 1.0 / (1024.0 * 1024.0), P = (double)model->num_parameters;
    double opt_floats = dist->zero ? 2.0 * dist->shard : 2.0 * P;
    static const char* const modes[3] = {"allreduce", "ZeRO-1: AdamW state sharded", "ZeRO-2: AdamW state and gradients sharded"};
    printf("memory per rank: parameters %.0f MB, gradients %.0f MB, AdamW %.0f MB, activations %.0f MB, "
           "backward scratch %.0f MB\n", P * 4 * mb, dist->grad_floats * 4 * mb, opt_floats * 4 * mb,
           model->num_activations * 4 * mb, model->num_scratch * 4 * mb);
    if (plumbing_wanted(dist) || dist->zero) printf("data parallel: %d rank(s), %s; shard %zu parameters (padded to %zu); per rank: AdamW state %.0f floats, "
           "gradients %zu floats\n", dist->world, modes[dist->zero], dist->shard, dist->shard * dist->world, opt_floats,
           dist->grad_floats);
    if (getenv("GPTC_INJECT_NAN") || getenv("GPTC_INJECT_SPIKE"))
        printf("test hooks: NaN gradients at steps [%s], loss spikes at steps [%s]\n",
               getenv("GPTC_INJECT_NAN") ? getenv("GPTC_INJECT_NAN") : "", getenv("GPTC_INJECT_SPIKE") ? getenv("GPTC_INJECT_SPIKE") : "");
    timing_print(dist, "communicator ready", dist->t_comm);
    if (saver_init(saver, dist, model, o) != 0) return -1;
    timing_print(dist, "model ready", unix_ms()); /* built, its memory and the snapshot slots mapped */
    int start = 0;
    StateSource source = SOURCE_NONE;
    if (o->output_dir[0]) r->nonce = run_nonce(dist, o, 0);
    if (o->resume && (start = state_resume(r, dist, model, o, saver, &source)) < 0) return -1;
    if (o->output_dir[0] && start == 0) r->nonce = run_nonce(dist, o, 1); /* a new run: a new nonce */
    saver_forget_after(saver, start);
    if (start == 0 && model->init_deferred) gpt2_fill_random(model, model->init_seed); /* no state: the init after all */
    model->init_deferred = 0;
    timing_print(dist, "state loaded", unix_ms());
    heartbeat_write(o, r->rank, start);
    int rollbacks = 0, nan_upto = 0, spike_upto = 0;
    for (int step = start; step <= r->steps; step++) {
        if (train_run_val_due(r, o, step) && (step > start || start == 0))
            train_run_log_val(r, step, (float)(dist_sum(dist, evaluate(model, &r->val, o->val_batches)) / r->world));
        if (train_run_sample_due(r, o, step) && r->rank == 0) sample_print(model, tok, o, &r->sample_rng);
        if (step == r->steps) break;
        double t0 = time_ms();
        gpt2_zero_grad(model);
        double loss = 0.0;
        for (int micro = 0; micro < r->grad_accum; micro++) {
            if (dataloader_next(&r->train) != 0) return -1;
            loss += gpt2_forward(model, r->train.inputs, r->train.targets, r->B, r->T) / r->grad_accum;
            dist_backward_begin(dist, model, micro, micro == r->grad_accum - 1);
            gpt2_backward(model, 1.0f / ((float)r->grad_accum * r->world));
        }
        loss = dist_sum(dist, loss) / r->world;
        if (inject_at("GPTC_INJECT_NAN", step + 1, &nan_upto) && r->rank == 0) model->grads_memory[0] = NAN;
        double z = 0.0;
        int spike = losswatch_spike(&r->watch, loss + (inject_at("GPTC_INJECT_SPIKE", step + 1, &spike_upto) ? 100.0 : 0.0),
                                    o->spike_z, &z);
        float lr = (float)lr_at(&r->sched, step);
        int finite = 0;
        saver_before_update(saver); /* the last snapshot's copy must be done before the weights change */
        double norm = dist_step(dist, model, &r->opt, o->grad_clip, lr, step + 1, loss, spike, &finite);
        train_run_log_step(r, step, loss, lr, norm, time_ms() - t0, finite, "");
        if (spike) printf("step %d: loss %.4f is a spike (z = %.1f > %.1f): update skipped\n", step + 1, loss, z, o->spike_z);
        if (step == start) timing_print(dist, "first step done", unix_ms());
        heartbeat_write(o, r->rank, step + 1);
        int back = -1;
        if (finite && !spike) losswatch_accept(&r->watch, (float)loss);
        else back = train_run_bad_step(r, saver, dist, model, o, step, 1);
        if (back >= 0) {
            rollbacks++;
            step = back - 1; /* the loop's step++ continues after the snapshot's step */
            continue;
        }
        int done = step + 1;
        int stop = o->stop_at > 0 && done == o->stop_at && done < r->steps;
        int save = (o->save_every > 0 && done % o->save_every == 0 && done < r->steps) || stop;
        int snap = o->snapshot_every > 0 && done % o->snapshot_every == 0 && done < r->steps;
        if ((save || snap) && r->watch.bad_run == 0) saver_snapshot(saver, r, dist, model, o, done, save);
        else saver_poll(saver, dist, o, 0);
        if (stop) {
            saver_before_update(saver);
            saver_poll(saver, dist, o, 1);
            printf("stopping after step %d (--stop-at); continue with --resume 1\n", done);
            *remove_memory = 0; /* the memory stays for the next job on this host */
            return 0;
        }
    }
    if (dist->world > 1) {
        double W = dist->world, wire = (W - 1) / W * (dist->reduced + dist->gathered) * sizeof(float);
        printf("communication per step: %.0f floats reduced + %.0f gathered (P = %zu), about %.0f bytes sent per rank; "
               "%.1f ms inside collectives, %.1f ms of it after backward (%.0f%% hidden)\n", dist->reduced,
               dist->gathered, model->num_parameters, wire, dist->comm_ms / r->steps, dist->exposed_ms / r->steps,
               dist->comm_ms > 0 ? fmax(0.0, 100.0 * (1.0 - dist->exposed_ms / dist->comm_ms)) : 0.0);
    }
    saver_stall_close(saver);
    if (saver->snapshots > 0)
        printf("snapshots: %d taken, stall %.2f ms per snapshot on average (worst %.1f ms); waits for the disk %.0f ms "
               "in all\n", saver->snapshots, saver->stall_ms / saver->snapshots, saver->max_stall_ms, saver->disk_wait_ms);
    if (rollbacks) printf("rollbacks: %d\n", rollbacks);
    int rc = 0;
    if (o->output_dir[0]) {
        saver_snapshot(saver, r, dist, model, o, r->steps, 1); /* the final state and model */
        saver_before_update(saver);
        saver_poll(saver, dist, o, 1);
        if (saver->last_failed) {
            fprintf(stderr, "error: the final model and training state could not be written (see above); make room "
                    "in %s and run again with --resume 1 to write them%s\n", o->output_dir,
                    saver->memory ? " (from the memory snapshots, still in place)" : "");
            rc = -1;
        }
    }
    *remove_memory = rc == 0; /* the run is over: its memory snapshots go (kept if the last write failed) */
    return rc;
}

/* The training loop, with validation, samples, logging, snapshots and
 * checkpoints, on one process or as one rank of several (section 9). Every
 * way out of train_steps comes back here to free what it made. */
static int train(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                 const char* val_pattern, Dist* dist) {
    TrainRun r;
    Saver saver;
    if (train_run_init(&r, &model->config, o, train_pattern, val_pattern, dist->rank, dist->world) != 0) return -1;
    memset(&saver, 0, sizeof(saver)); /* (saver_free of a zeroed Saver frees nothing) */
    int remove_memory = 0;
    int rc = train_steps(&r, &saver, model, o, tok, dist, &remove_memory);
    if (rc != 0) saver_abandon(&saver); /* an error, said where it happened: no collectives from here */
    saver_free(&saver, rc == 0 && remove_memory);
    train_run_free(&r);
    return rc;
}

/* A training loop: train() here, gpu_train() in the CUDA twin. */
typedef int (*TrainFn)(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                       const char* val_pattern, void* ctx);

static int train_cpu(GPT2* model, const Options* o, const Tokenizer* tok, const char* train_pattern,
                     const char* val_pattern, void* ctx) {
    return train(model, o, tok, train_pattern, val_pattern, (Dist*)ctx);
}

/* Everything after the flags, shared with train_gpt.cu: build the model,
 * load the tokenizer, then generate from --prompt, or tokenize --data and
 * train with `train_fn`. With several ranks (dist, or NULL), rank 0
 * tokenizes --data while the others wait, then they reuse its cache.
 * Returns 0 or -1. */
static int gptc_run(const Options* o, TrainFn train_fn, void* ctx, const Dist* dist) {
    GPT2 model;
    if (model_from_options(&model, o) != 0) return -1;
    const GPT2Config* c = &model.config;
    printf("model: L=%d C=%d NH=%d maxT=%d V=%d Vp=%d, %zu parameters (%s)\n", c->num_layers, c->channels,
           c->num_heads, c->max_seq_len, c->vocab_size, c->padded_vocab_size, model.num_parameters,
           depth_from_name(o->model) ? "random init" : o->model);
    int rc = 0;
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
    } else if (tokenizer_setup(&tok, o, c->vocab_size) != 0) {
        rc = -1;
    } else {
        if (o->prompt[0]) {
            rc = generate_from_prompt(&model, &tok, o);
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

#if !defined(TESTING) && !defined(GPTC_LIBRARY) /* included for its functions: no main */
int main(int argc, char** argv) {
    Dist dist;
    dist_init(&dist, &argc, &argv);
    /* ranks other than 0 train silently: their errors still go to stderr */
    if (dist.rank != 0 && !freopen("/dev/null", "w", stdout)) fprintf(stderr, "warning: rank %d prints\n", dist.rank);
    Options o;
    int rc = options_parse(&o, argc, argv);
    const char* problem = rc == 0 ? options_problem(&o) : NULL;
    if (rc != 0 || problem) {
        if (rc != 0) usage(rc == 1 ? stdout : stderr, argv[0]);
        if (problem) fprintf(stderr, "error: %s\n", problem);
        dist_finish(&dist, rc != 1);
        return rc == 1 ? 0 : EXIT_FAILURE;
    }
    dist.zero = o.zero;
    dist.overlap = o.overlap;
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads(o.threads);
    printf("threads: %d (OpenMP)%s\n", num_threads(), dist.world > 1 ? " per rank" : "");
#else
    printf("threads: 1 (built without OpenMP: see the Makefile)\n");
#endif
    rc = gptc_run(&o, train_cpu, &dist, &dist);
    dist_finish(&dist, rc != 0);
    return rc == 0 ? 0 : EXIT_FAILURE;
}
#endif /* !TESTING && !GPTC_LIBRARY */
