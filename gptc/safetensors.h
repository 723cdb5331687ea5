/*
 * gptc/safetensors.h — GPT-2 weights from and to Hugging Face, without
 * Python: a checkpoint folder (config.json + model.safetensors) read into our
 * 16 parameter tensors, and our parameters written as such a folder, which
 * transformers' GPT2LMHeadModel.from_pretrained loads.
 *
 * Included by train_gpt.c at the end of section 2 (Model files): it uses
 * GPT2Config, parameter_sizes, config_problem, round_up, bf16_to_float and
 * model_file_write from there, and the JSON primitives of text_data.h.
 * Defines: hf_is_checkpoint, hf_checkpoint_read, hf_checkpoint_config (the shape
 * alone, for --plan), hf_checkpoint_write,
 * model_convert (--convert); beneath them HfConfig and hf_config_read
 * (config.json), SafeTensor and st_header_read (the header), st_read_floats
 * (a tensor's values, converted and transposed).
 *
 * The formats, as this file reads and writes them:
 *   model.safetensors (github.com/huggingface/safetensors, "Format"): an
 *     unsigned little-endian uint64 N; N bytes of JSON, one object
 *     {"<name>": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [b, e]},
 *      ..., "__metadata__": {"format": "pt"}} (a writer pads it with spaces
 *     to a multiple of 8 bytes); then the data buffer: each tensor the bytes
 *     [b, e) of it, row-major, little-endian, contiguous, no holes or
 *     overlaps. The format caps the header at 100 MB.
 *   config.json: transformers' GPT2Config: n_layer (L), n_embd (C), n_head
 *     (NH), n_positions (maxT), vocab_size (V), model_type "gpt2",
 *     activation_function "gelu_new" (the tanh GELU we compute).
 *   Names: GPT2Model's state dict: wte.weight (V, C), wpe.weight (maxT, C),
 *     h.{i}.ln_1.weight/bias (C), h.{i}.attn.c_attn.weight (C, 3C) and
 *     .bias (3C), h.{i}.attn.c_proj.weight (C, C), h.{i}.ln_2.*,
 *     h.{i}.mlp.c_fc.weight (C, 4C), h.{i}.mlp.c_proj.weight (4C, C) and
 *     their biases, ln_f.weight/bias. GPT2LMHeadModel prefixes each with
 *     "transformer." and adds lm_head.weight, tied to wte (save_pretrained
 *     leaves the tied copy out). The causal-mask buffers h.{i}.attn.bias and
 *     .masked_bias are not weights.
 *   Layouts: HF's Conv1D computes y = x W + b with W stored (in, out); our
 *     matmuls take W as (out, in), so the four Conv1D weights per layer are
 *     transposed both ways. HF has V embedding rows; we keep Vp =
 *     round_up(V, 128) (cli.h's rule for a new model), the pad rows zero.
 *
 * Read: F32, F16, BF16 and F64, converted to fp32 exactly where fp32 holds
 * the value (F64 rounds). Written: F32 only, so ours -> HF -> ours gives back
 * the same bytes (the pad rows, never used, must be zero: they are in every
 * model we make). Everything read from a file is bounded before it is used:
 * header size, names, dimensions, tensor count, offsets inside the file.
 * Left out: sharded checkpoints (model.safetensors.index.json; GPT-2 up to
 * 1.5B is one file) and pytorch_model.bin (a pickle).
 */
#ifndef GPTC_SAFETENSORS_H
#define GPTC_SAFETENSORS_H

#include "util.h"
#include "json.h" /* json_space, json_string, json_skip, json_number */

#define ST_MAX_HEADER 100000000LL /* the format's own limit on the JSON header */
#define ST_MAX_TENSORS 65536
#define ST_NAME_MAX 256           /* bytes of a tensor name, with its '\0' */
#define ST_MAX_DIMS 8

/* ---- config.json -------------------------------------------------------- */

/* An unsigned JSON integer at *p, at most 2^53: 0, or -1 if not one. */
static int json_uint(const char** p, const char* end, long long* v) {
    const char* s = *p;
    long long x = 0;
    if (s >= end || *s < '0' || *s > '9') return -1;
    if (*s == '0' && s + 1 < end && s[1] >= '0' && s[1] <= '9') return -1; /* JSON writes no leading zeros */
    while (s < end && *s >= '0' && *s <= '9') {
        if (x > (1LL << 53) / 10) return -1;
        x = x * 10 + (*s++ - '0');
    }
    if (s < end && (*s == '.' || *s == 'e' || *s == 'E')) return -1; /* 12.0 is not a size */
    *p = s;
    *v = x;
    return 0;
}

/* A string value at *p into out (cap bytes with its '\0'): 0, or -1. */
static int json_string_into(const char** p, const char* end, char* out, size_t cap) {
    const char* q = *p;
    long n = json_string(&q, end, NULL);
    if (n < 0 || (size_t)n >= cap) return -1;
    json_string(p, end, out);
    out[n] = '\0';
    return 0;
}

typedef struct {
    long long n_layer, n_embd, n_head, n_positions, vocab_size, n_inner; /* -1: absent (n_inner: null) */
    char model_type[32], activation[32];
    int have_model_type, have_activation;  /* 1: the key is present ("" is a value) */
    double layer_norm_epsilon;
    int have_layer_norm_epsilon;
    int tie_word_embeddings;               /* -1: absent, else 0/1 */
    int scale_attn_weights;                /* -1: absent, else 0/1 (GPT-2: true) */
    int scale_attn_by_inverse_layer_idx;   /* -1: absent, else 0/1 (GPT-2: false) */
    int add_cross_attention;               /* -1: absent, else 0/1 (GPT-2: false) */
} HfConfig;

/* An HfConfig with every field absent. */
static HfConfig hf_config_absent(void) {
    HfConfig h;
    memset(&h, 0, sizeof(h));
    h.n_layer = h.n_embd = h.n_head = h.n_positions = h.vocab_size = h.n_inner = -1;
    h.tie_word_embeddings = h.scale_attn_weights = h.scale_attn_by_inverse_layer_idx = h.add_cross_attention = -1;
    return h;
}

/* A JSON true or false at *p: 1 or 0, or -1 if neither. */
static int json_bool(const char** p, const char* end) {
    if (end - *p >= 4 && !memcmp(*p, "true", 4)) { *p += 4; return 1; }
    if (end - *p >= 5 && !memcmp(*p, "false", 5)) { *p += 5; return 0; }
    return -1;
}

/* Parse config.json's text into *h: the fields above, any others skipped.
 * NULL, or why not (static text) and where (*at, a byte offset). */
static const char* hf_config_parse(const char* text, size_t len, HfConfig* h, long* at) {
    const char *p = text, *end = text + len;
    struct { const char* key; long long* v; } ints[] = {
        {"n_layer", &h->n_layer}, {"n_embd", &h->n_embd}, {"n_head", &h->n_head},
        {"n_positions", &h->n_positions}, {"vocab_size", &h->vocab_size}};
    static char said[160]; /* a message naming the field, returned as the "static text" */
#define HF_CONFIG_FAIL(why) do { *at = (long)(p - text); return (why); } while (0)
#define HF_CONFIG_FAIL_FIELD(fmt) do { snprintf(said, sizeof(said), fmt, key); HF_CONFIG_FAIL(said); } while (0)
    json_space(&p, end);
    if (p >= end || *p != '{') HF_CONFIG_FAIL("it does not start a JSON object ('{')");
    p++;
    json_space(&p, end);
    if (p < end && *p == '}') return NULL;
    for (;;) {
        char key[64];
        json_space(&p, end);
        if (p >= end || *p != '"') HF_CONFIG_FAIL("a key is not a string");
        if (json_string_into(&p, end, key, sizeof(key)) != 0) {
            JsonError e = {NULL, NULL};
            if (json_skip(&p, end, 1, &e) != 0) HF_CONFIG_FAIL("a key is not a string");
            key[0] = '\0'; /* a long key is no key of ours */
        }
        json_space(&p, end);
        if (p >= end || *p != ':') HF_CONFIG_FAIL("a ':' is missing after a key");
        p++;
        json_space(&p, end);
        int done = 0;
        for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
            if (strcmp(key, ints[i].key) != 0) continue;
            if (json_uint(&p, end, ints[i].v) != 0) HF_CONFIG_FAIL_FIELD("%s: expected a whole number >= 0 (a size)");
            done = 1;
        }
        if (!strcmp(key, "model_type") || !strcmp(key, "activation_function")) {
            int is_type = key[0] == 'm';
            char* dst = is_type ? h->model_type : h->activation;
            if (json_string_into(&p, end, dst, 32) != 0) HF_CONFIG_FAIL_FIELD("%s: expected a string of at most 31 bytes");
            *(is_type ? &h->have_model_type : &h->have_activation) = 1;
            done = 1;
        } else if (!strcmp(key, "n_inner") && end - p >= 4 && !memcmp(p, "null", 4)) {
            p += 4;
            done = 1;
        } else if (!strcmp(key, "n_inner")) {
            if (json_uint(&p, end, &h->n_inner) != 0) HF_CONFIG_FAIL("n_inner: expected null or a whole number");
            done = 1;
        } else if (!strcmp(key, "layer_norm_epsilon")) {
            const char* s = p;
            char num[64];
            if (json_number(&p, end) != 0 || p - s >= (long)sizeof(num)) HF_CONFIG_FAIL("layer_norm_epsilon: expected a number");
            memcpy(num, s, (size_t)(p - s));
            num[p - s] = '\0';
            h->layer_norm_epsilon = strtod(num, NULL);
            h->have_layer_norm_epsilon = 1;
            done = 1;
        } else {
            struct { const char* key; int* v; } bools[] = {
                {"tie_word_embeddings", &h->tie_word_embeddings}, {"scale_attn_weights", &h->scale_attn_weights},
                {"scale_attn_by_inverse_layer_idx", &h->scale_attn_by_inverse_layer_idx},
                {"add_cross_attention", &h->add_cross_attention}};
            for (size_t i = 0; i < sizeof(bools) / sizeof(bools[0]); i++) {
                if (strcmp(key, bools[i].key) != 0) continue;
                if ((*bools[i].v = json_bool(&p, end)) < 0) HF_CONFIG_FAIL_FIELD("%s: expected true or false");
                done = 1;
            }
        }
        JsonError e = {NULL, NULL};
        if (!done && json_skip(&p, end, 1, &e) != 0) { p = e.at ? e.at : p; HF_CONFIG_FAIL(e.why); }
        json_space(&p, end);
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') { p++; break; }
        HF_CONFIG_FAIL(p >= end ? "the object is not closed ('}' missing): truncated?" : "a ',' or '}' is missing after a value");
    }
    json_space(&p, end);
    if (p < end) HF_CONFIG_FAIL("more follows the object");
    return NULL;
#undef HF_CONFIG_FAIL_FIELD
#undef HF_CONFIG_FAIL
}

#define HF_CONFIG_MAX_BYTES (1 << 20) /* GPT-2's config.json is under 1 KB */

/* Read config.json into *out: GPT-2's fields, checked to describe a model
 * this trainer computes (Vp = V rounded up to 128). 0, or -1 after a
 * message naming the file. */
static int hf_config_read(const char* path, GPT2Config* out) {
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_size > HF_CONFIG_MAX_BYTES) {
        FILE_ERROR(path, "is %lld bytes; a GPT-2 config.json is under 1 KB: not a config.json", (long long)sb.st_size);
        return -1;
    }
    size_t len;
    char* text = file_read_all(path, &len);
    if (!text) {
        fprintf(stderr, "  a Hugging Face GPT-2 checkpoint is a folder with config.json and model.safetensors "
                        "(from huggingface.co/openai-community/gpt2)\n");
        return -1;
    }
    HfConfig h = hf_config_absent();
    long at = 0;
    const char* why = hf_config_parse(text, len, &h, &at);
    if (why) FILE_ERROR(path, "not valid JSON at byte %ld: %s", at, why);
    free(text);
    if (why) return -1;
    struct { const char* key; long long v; } ints[] = {
        {"n_layer", h.n_layer}, {"n_embd", h.n_embd}, {"n_head", h.n_head},
        {"n_positions", h.n_positions}, {"vocab_size", h.vocab_size}};
    if (h.have_model_type && strcmp(h.model_type, "gpt2") != 0) {
        FILE_ERROR(path, "model_type is \"%s\", not \"gpt2\": gpt.c reads GPT-2 checkpoints only "
                   "(gpt2, gpt2-medium, gpt2-large, gpt2-xl and models of their shape)", h.model_type);
        return -1;
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        if (ints[i].v < 0) {
            FILE_ERROR(path, "no \"%s\": not a GPT-2 config.json (it needs n_layer, n_embd, n_head, "
                       "n_positions and vocab_size, as transformers' GPT2Config writes them)", ints[i].key);
            return -1;
        }
    }
    if (h.have_activation && strcmp(h.activation, "gelu_new") != 0) {
        FILE_ERROR(path, "activation_function is \"%s\"; gpt.c computes GPT-2's tanh GELU (\"gelu_new\") only", h.activation);
        return -1;
    }
    if (h.have_layer_norm_epsilon && !(fabs(h.layer_norm_epsilon - 1e-5) <= 1e-12)) {
        FILE_ERROR(path, "layer_norm_epsilon is %g; gpt.c's LayerNorm uses GPT-2's 1e-5", h.layer_norm_epsilon);
        return -1;
    }
    if (h.n_inner >= 0 && h.n_inner != 4 * h.n_embd) {
        FILE_ERROR(path, "n_inner is %lld; gpt.c's MLP is 4 x n_embd = %lld wide (n_inner null)", h.n_inner, 4 * h.n_embd);
        return -1;
    }
    if (h.tie_word_embeddings == 0) {
        FILE_ERROR(path, "tie_word_embeddings is false; gpt.c ties the LM head to wte, as GPT-2 does");
        return -1;
    }
    /* the attention's arithmetic: GPT-2 divides the scores by sqrt(head size), nothing else */
    if (h.scale_attn_weights == 0) {
        FILE_ERROR(path, "scale_attn_weights is false, expected true (or absent): gpt.c's attention divides the scores "
                   "by sqrt(n_embd / n_head), as GPT-2 does, and computes no other attention");
        return -1;
    }
    if (h.scale_attn_by_inverse_layer_idx == 1) {
        FILE_ERROR(path, "scale_attn_by_inverse_layer_idx is true, expected false (or absent): gpt.c does not divide "
                   "layer i's attention scores by i + 1 (GPT-2 does not)");
        return -1;
    }
    if (h.add_cross_attention == 1) {
        FILE_ERROR(path, "add_cross_attention is true, expected false (or absent): gpt.c is a decoder only, "
                   "with no cross-attention layers");
        return -1;
    }
    GPT2Config c;
    long long big = 1LL << 30; /* beyond any bound of config_problem: keeps the int conversion defined */
    c.num_layers = (int)(h.n_layer < big ? h.n_layer : big);
    c.channels = (int)(h.n_embd < big ? h.n_embd : big);
    c.num_heads = (int)(h.n_head < big ? h.n_head : big);
    c.max_seq_len = (int)(h.n_positions < big ? h.n_positions : big);
    c.vocab_size = (int)(h.vocab_size < big ? h.vocab_size : big);
    c.padded_vocab_size = c.vocab_size < big ? round_up(c.vocab_size, 128) : c.vocab_size;
    const char* problem = config_problem(&c);
    if (problem) {
        FILE_ERROR(path, "describes an impossible model (n_layer=%lld n_embd=%lld n_head=%lld n_positions=%lld "
                   "vocab_size=%lld): %s", h.n_layer, h.n_embd, h.n_head, h.n_positions, h.vocab_size, problem);
        return -1;
    }
    *out = c;
    return 0;
}

/* ---- The safetensors header --------------------------------------------- */

typedef enum { ST_F32, ST_F16, ST_BF16, ST_F64 } StDtype;
static const char* const ST_DTYPE_NAMES[4] = {"F32", "F16", "BF16", "F64"};
static const int ST_DTYPE_BYTES[4] = {4, 2, 2, 8};

typedef struct {
    char name[ST_NAME_MAX];
    StDtype dtype;
    int ndim;
    long long shape[ST_MAX_DIMS];
    unsigned long long begin, end; /* bytes [begin, end) of the data buffer */
} SafeTensor;

typedef struct {
    SafeTensor* t;
    int n;
    long long data_start; /* 8 + N: where the data buffer begins in the file */
    long long data_bytes; /* the buffer's size: the rest of the file */
} StHeader;

/* Parse one tensor's entry {"dtype": .., "shape": [..], "data_offsets": [b, e]}
 * at *p into *t. NULL, or why not (a static text; *dtype_out names an
 * unsupported dtype). */
static const char* st_entry_parse(const char** p, const char* end, SafeTensor* t, char* dtype_out) {
    int have_dtype = 0, have_shape = 0, have_offsets = 0;
    if (*p >= end || **p != '{') return "a tensor's entry is not an object";
    (*p)++;
    json_space(p, end);
    if (*p < end && **p == '}') return "a tensor's entry is empty (needs dtype, shape, data_offsets)";
    for (;;) {
        char key[32];
        json_space(p, end);
        if (*p >= end || **p != '"') return "a key is not a string";
        if (json_string_into(p, end, key, sizeof(key)) != 0) key[0] = '\0';
        json_space(p, end);
        if (*p >= end || **p != ':') return "a ':' is missing after a key";
        (*p)++;
        json_space(p, end);
        if ((!strcmp(key, "dtype") && have_dtype) || (!strcmp(key, "shape") && have_shape) ||
            (!strcmp(key, "data_offsets") && have_offsets))
            return "a tensor's entry names dtype, shape or data_offsets twice";
        if (!strcmp(key, "dtype")) {
            if (json_string_into(p, end, dtype_out, 32) != 0) return "a dtype is not a short string";
            int k = -1;
            for (int i = 0; i < 4; i++) if (!strcmp(dtype_out, ST_DTYPE_NAMES[i])) k = i;
            if (k < 0) return "unsupported dtype";
            t->dtype = (StDtype)k;
            have_dtype = 1;
        } else if (!strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
            int is_shape = key[0] == 's';
            long long v[ST_MAX_DIMS];
            int n = 0;
            if (*p >= end || **p != '[') return "shape or data_offsets is not an array";
            (*p)++;
            json_space(p, end);
            if (*p < end && **p == ']') (*p)++;
            else for (;;) {
                json_space(p, end);
                if (n == ST_MAX_DIMS) return "an array has more than 8 entries";
                if (json_uint(p, end, &v[n++]) != 0) return "shape or data_offsets holds something other than a whole number below 2^53";
                json_space(p, end);
                if (*p < end && **p == ',') { (*p)++; continue; }
                if (*p < end && **p == ']') { (*p)++; break; }
                return "a ',' or ']' is missing in an array";
            }
            if (is_shape) {
                t->ndim = n;
                memcpy(t->shape, v, sizeof(long long) * (size_t)n);
                have_shape = 1;
            } else {
                if (n != 2) return "data_offsets must be [begin, end]";
                t->begin = (unsigned long long)v[0];
                t->end = (unsigned long long)v[1];
                have_offsets = 1;
            }
        } else {
            JsonError e = {NULL, NULL};
            if (json_skip(p, end, 2, &e) != 0) return e.why;
        }
        json_space(p, end);
        if (*p < end && **p == ',') { (*p)++; continue; }
        if (*p < end && **p == '}') { (*p)++; break; }
        return "a ',' or '}' is missing in a tensor's entry";
    }
    if (!have_dtype || !have_shape || !have_offsets) return "a tensor's entry lacks dtype, shape or data_offsets";
    return NULL;
}

/* The byte offset of the first invalid UTF-8 sequence in [s, s + n) (an
 * overlong form, a surrogate, a code point past U+10FFFF, a stray or missing
 * continuation byte), or -1 if it is all valid (RFC 3629). */
static long utf8_invalid_at(const unsigned char* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 9;
        if (k == 9 || k > n - i - 1) return (long)i; /* not a lead byte, or the sequence is cut off */
        uint32_t cp = k == 0 ? c : k == 1 ? c & 0x1F : k == 2 ? c & 0x0F : c & 0x07;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return (long)i;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000}; /* below these, the form is overlong */
        if (cp < least[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return (long)i;
        i += k + 1;
    }
    return -1;
}

/* The __metadata__ value at *p: an object whose values are strings, as the
 * format defines it (a map of string to string). NULL, or why not. */
static const char* st_metadata_parse(const char** p, const char* end) {
    if (*p >= end || **p != '{') return "__metadata__ is not an object (expected {\"key\": \"text\", ...})";
    (*p)++;
    json_space(p, end);
    if (*p < end && **p == '}') { (*p)++; return NULL; }
    for (;;) {
        json_space(p, end);
        if (json_string(p, end, NULL) < 0) return "a key of __metadata__ is not a string";
        json_space(p, end);
        if (*p >= end || **p != ':') return "a ':' is missing after a key of __metadata__";
        (*p)++;
        json_space(p, end);
        if (*p >= end || **p != '"' || json_string(p, end, NULL) < 0)
            return "a value of __metadata__ is not a string (the format allows strings only)";
        json_space(p, end);
        if (*p < end && **p == ',') { (*p)++; continue; }
        if (*p < end && **p == '}') { (*p)++; return NULL; }
        return "a ',' or '}' is missing in __metadata__";
    }
}

static int st_by_begin(const void* a, const void* b) {
    const SafeTensor* x = *(const SafeTensor* const*)a;
    const SafeTensor* y = *(const SafeTensor* const*)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Read and check the header of the open file f (size fsize): every entry's
 * dtype, shape and offsets inside the data buffer, no two overlapping. 0
 * and *h (free h->t), or -1 after a message naming the file. */
static int st_header_read(FILE* f, const char* path, long long fsize, StHeader* h) {
    memset(h, 0, sizeof(*h));
    unsigned char len8[8];
    if (fsize < 8) {
        FILE_ERROR(path, "file is %lld bytes, shorter than the 8-byte header length that opens a safetensors "
                   "file: truncated (download it again)", fsize);
        return -1;
    }
    if (read_exact(f, len8, 8, path) != 0) return -1;
    unsigned long long n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i]; /* little-endian */
    if (n > (unsigned long long)(fsize - 8)) {
        FILE_ERROR(path, "header length %llu runs past the end of the file (%lld bytes): truncated, or not a "
                   "safetensors file (download it again)", n, fsize);
        return -1;
    }
    if (n < 2 || (long long)n > ST_MAX_HEADER) {
        FILE_ERROR(path, "header length %llu is outside 2..%lld bytes: not a safetensors file", n, ST_MAX_HEADER);
        return -1;
    }
    char* text = (char*)xmalloc((size_t)n);
    if (read_exact(f, text, (size_t)n, path) != 0) { free(text); return -1; }
    const char *p = text, *end = text + n, *why = NULL;
    char dtype[32] = "";
    int cap = 0, have_metadata = 0;
    h->data_start = 8 + (long long)n;
    h->data_bytes = fsize - h->data_start;
    long bad_utf8 = utf8_invalid_at((const unsigned char*)text, (size_t)n);
    if (bad_utf8 >= 0) {
        FILE_ERROR(path, "the safetensors header (%llu bytes) is not valid UTF-8 at byte %ld (0x%02x), as the format "
                   "requires: corrupt (download it again)", n, bad_utf8, (unsigned char)text[bad_utf8]);
        goto fail;
    }
    /* the format: the header's first byte is '{' (no white space before it); white space may pad its end */
    if (*p != '{') { why = "expected '{' as the header's first byte (the format allows no white space before it)"; goto bad; }
    p++;
    json_space(&p, end);
    if (p < end && *p == '}') p++;
    else for (;;) {
        char name[ST_NAME_MAX];
        json_space(&p, end);
        if (p >= end || *p != '"' || json_string_into(&p, end, name, sizeof(name)) != 0) {
            why = "a tensor name is not a string of at most 255 bytes";
            goto bad;
        }
        json_space(&p, end);
        if (p >= end || *p != ':') { why = "a ':' is missing after a name"; goto bad; }
        p++;
        json_space(&p, end);
        if (!strcmp(name, "__metadata__")) {
            if (have_metadata) { why = "__metadata__ appears twice"; goto bad; }
            have_metadata = 1;
            if ((why = st_metadata_parse(&p, end)) != NULL) goto bad;
        } else {
            if (h->n == ST_MAX_TENSORS) { why = "more than 65536 tensors"; goto bad; }
            if (h->n == cap) {
                cap = cap ? 2 * cap : 64;
                SafeTensor* grown = (SafeTensor*)realloc(h->t, sizeof(SafeTensor) * (size_t)cap);
                CHECK(grown != NULL, "out of memory for %d tensor entries", cap);
                h->t = grown;
            }
            SafeTensor* t = &h->t[h->n];
            memset(t, 0, sizeof(*t));
            memcpy(t->name, name, sizeof(name));
            why = st_entry_parse(&p, end, t, dtype);
            if (why && !strcmp(why, "unsupported dtype")) {
                FILE_ERROR(path, "tensor %s has dtype %s; gpt.c reads F32, F16, BF16 and F64 (convert the checkpoint "
                           "to one of them, e.g. torch: model.float(), then save_pretrained)", name, dtype);
                free(text); free(h->t); h->t = NULL;
                return -1;
            }
            if (why) goto bad;
            for (int i = 0; i < h->n; i++)
                if (!strcmp(h->t[i].name, name)) { why = "a tensor name appears twice"; goto bad; }
            h->n++;
        }
        json_space(&p, end);
        if (p < end && *p == ',') { p++; continue; }
        if (p < end && *p == '}') { p++; break; }
        why = "a ',' or '}' is missing after an entry";
        goto bad;
    }
    json_space(&p, end);
    if (p < end) { why = "more follows the header's object"; goto bad; }
    free(text);
    text = NULL;
    /* every tensor's bytes are its shape times its dtype, inside the buffer */
    for (int i = 0; i < h->n; i++) {
        SafeTensor* t = &h->t[i];
        unsigned long long bytes = (unsigned long long)ST_DTYPE_BYTES[t->dtype];
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] != 0 && bytes > (1ULL << 62) / (unsigned long long)t->shape[d]) bytes = 1ULL << 62;
            else bytes *= (unsigned long long)t->shape[d];
        }
        if (t->begin > t->end || t->end > (unsigned long long)h->data_bytes) {
            FILE_ERROR(path, "tensor %s: data_offsets [%llu, %llu] fall outside the data buffer of %lld bytes: "
                       "truncated or corrupt (download it again)", t->name, t->begin, t->end, h->data_bytes);
            goto fail;
        }
        if (t->end - t->begin != bytes) {
            FILE_ERROR(path, "tensor %s: data_offsets [%llu, %llu] hold %llu bytes, its shape and dtype %s need %llu: corrupt",
                       t->name, t->begin, t->end, t->end - t->begin, ST_DTYPE_NAMES[t->dtype], bytes);
            goto fail;
        }
    }
    {
        /* the format: sorted by offset, the tensors tile the data buffer: the
         * first begins at 0, each begins where the one before it ends (no
         * holes, no overlaps), the last ends at the end of the file */
        size_t count = h->n > 0 ? (size_t)h->n : 1;
        SafeTensor** order = (SafeTensor**)xmalloc(sizeof(SafeTensor*) * count);
        for (int i = 0; i < h->n; i++) order[i] = &h->t[i];
        qsort(order, (size_t)h->n, sizeof(SafeTensor*), st_by_begin);
        unsigned long long at = 0;
        const SafeTensor* prev = NULL;
        for (int i = 0; i < h->n; i++) {
            const SafeTensor* t = order[i];
            if (t->begin != at) {
                if (prev) FILE_ERROR(path, "tensor %s begins at byte %llu of the data buffer, expected %llu, where %s [%llu, %llu] "
                                     "ends: the tensors %s; the format stores them back to back: corrupt",
                                     t->name, t->begin, at, prev->name, prev->begin, prev->end,
                                     t->begin < at ? "overlap" : "leave a hole");
                else FILE_ERROR(path, "the first tensor by offset, %s, begins at byte %llu of the data buffer, expected 0: "
                                "the format leaves no hole before it: corrupt", t->name, t->begin);
                free(order);
                goto fail;
            }
            at = t->end;
            prev = t;
        }
        free(order);
        if (at != (unsigned long long)h->data_bytes) {
            FILE_ERROR(path, "the tensors end at byte %llu of the data buffer, the file holds %lld: %lld bytes follow the "
                       "last tensor, and the format allows none: corrupt, or not a safetensors file (download it again)",
                       at, h->data_bytes, h->data_bytes - (long long)at);
            goto fail;
        }
    }
    return 0;
bad:
    FILE_ERROR(path, "the safetensors header (%llu bytes of JSON) is malformed at byte %ld: %s%s", n,
               (long)(p - text), why, p >= end ? " (it ends early: truncated?)" : "");
fail:
    free(text);
    free(h->t);
    h->t = NULL;
    return -1;
}

static const SafeTensor* st_find(const StHeader* h, const char* name) {
    for (int i = 0; i < h->n; i++) if (!strcmp(h->t[i].name, name)) return &h->t[i];
    return NULL;
}

/* IEEE half -> float, exactly (every half is a float). */
static float f16_to_float(uint16_t v) {
    uint32_t sign = (uint32_t)(v & 0x8000) << 16, e = (v >> 10) & 0x1F, m = v & 0x3FF, bits;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        float x = ldexpf((float)m, -24);
        return sign ? -x : x;
    }
    bits = e == 31 ? sign | 0x7F800000u | m << 13 : sign | (e + 112) << 23 | m << 13;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Read tensor t's elements (rows x cols of them) as fp32 into dst:
 * (rows, cols) as stored, or transposed to (cols, rows). Every value must be
 * finite. 0, or -1 after a message. */
static int st_read_floats(FILE* f, const char* path, const StHeader* h, const SafeTensor* t, float* dst,
                          size_t rows, size_t cols, int transpose) {
    size_t n = rows * cols, eb = (size_t)ST_DTYPE_BYTES[t->dtype];
    unsigned char* raw = (unsigned char*)xmalloc(n * eb);
    if (fseeko(f, (off_t)(h->data_start + (long long)t->begin), SEEK_SET) != 0 || read_exact(f, raw, n * eb, path) != 0) {
        FILE_ERROR(path, "cannot read tensor %s", t->name);
        free(raw);
        return -1;
    }
    float* vals = transpose ? xmalloc_floats(n) : dst;
    for (size_t i = 0; i < n; i++) {
        const unsigned char* b = raw + i * eb; /* little-endian on disk, assembled byte by byte */
        if (t->dtype == ST_F32 || t->dtype == ST_F64) {
            uint64_t bits = 0;
            for (size_t k = eb; k-- > 0;) bits = bits << 8 | b[k];
            if (eb == 4) { uint32_t u = (uint32_t)bits; memcpy(&vals[i], &u, 4); }
            else { double d; memcpy(&d, &bits, 8); vals[i] = (float)d; }
        } else {
            uint16_t u = (uint16_t)(b[0] | b[1] << 8);
            vals[i] = t->dtype == ST_F16 ? f16_to_float(u) : bf16_to_float(u);
        }
    }
    free(raw);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!isfinite(vals[i])) {
            FILE_ERROR(path, "tensor %s element %zu is %f: the checkpoint holds non-finite weights", t->name, i, vals[i]);
            rc = -1;
        }
    }
    if (transpose) {
        for (size_t r = 0; r < rows; r++)
            for (size_t c = 0; c < cols; c++) dst[c * rows + r] = vals[r * cols + c];
        free(vals);
    }
    return rc;
}

/* ---- Names and shapes: HF's tensors onto our 16 ------------------------- */

/* Tensor i of ours (PARAMETER_NAMES order) is HF's HF_NAMES[i], with "{i}"
 * the layer for the layer tensors; HF_CONV1D marks the (in, out) weights. */
static const char* const HF_NAMES[NUM_PARAMETER_TENSORS] = {
    "wte.weight", "wpe.weight", "h.%d.ln_1.weight", "h.%d.ln_1.bias",
    "h.%d.attn.c_attn.weight", "h.%d.attn.c_attn.bias", "h.%d.attn.c_proj.weight", "h.%d.attn.c_proj.bias",
    "h.%d.ln_2.weight", "h.%d.ln_2.bias", "h.%d.mlp.c_fc.weight", "h.%d.mlp.c_fc.bias",
    "h.%d.mlp.c_proj.weight", "h.%d.mlp.c_proj.bias", "ln_f.weight", "ln_f.bias"};
static const int HF_CONV1D[NUM_PARAMETER_TENSORS] = {0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0};

/* HF's shape of our tensor i for one layer: rows x cols as stored (rows = 1
 * for a vector); wte has V rows, not Vp. Returns the rank, 1 or 2: a matrix
 * with one row (n_positions or vocab_size 1) is still a matrix. */
static int hf_shape(int i, const GPT2Config* c, size_t* rows, size_t* cols) {
    size_t C = (size_t)c->channels;
    static const int out_mult[NUM_PARAMETER_TENSORS] = {0, 0, 1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1, 1, 1};
    static const int in_mult[NUM_PARAMETER_TENSORS] = {0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0, 0, 0};
    if (i == 0) { *rows = (size_t)c->vocab_size; *cols = C; return 2; }
    if (i == 1) { *rows = (size_t)c->max_seq_len; *cols = C; return 2; }
    if (!in_mult[i]) { *rows = 1; *cols = out_mult[i] * C; return 1; } /* a vector */
    *rows = in_mult[i] * C;  /* Conv1D: (in, out) */
    *cols = out_mult[i] * C;
    return 2;
}

static void hf_name(char* out, size_t cap, const char* prefix, int i, int layer) {
    char base[64];
    snprintf(base, sizeof(base), HF_NAMES[i], layer);
    snprintf(out, cap, "%s%s", prefix, base);
}

/* Which names the file holds, for an error: the first few. */
static void st_names_print(const StHeader* h) {
    fprintf(stderr, "  the file has %d tensors:", h->n);
    for (int i = 0; i < h->n && i < 8; i++) fprintf(stderr, " %s", h->t[i].name);
    fprintf(stderr, "%s\n", h->n > 8 ? " ..." : "");
}

/* A name we know and do not need: the tied head and the attention masks. */
static int hf_name_ignored(const char* name) {
    const char* s = !strncmp(name, "transformer.", 12) ? name + 12 : name;
    if (!strcmp(name, "lm_head.weight")) return 1;
    size_t n = strlen(s);
    int layer_buffer = !strncmp(s, "h.", 2) && ((n > 10 && !strcmp(s + n - 10, ".attn.bias")) ||
                                                (n > 17 && !strcmp(s + n - 17, ".attn.masked_bias")));
    return layer_buffer;
}

/* A path is a Hugging Face checkpoint if it is a folder or a .safetensors file. */
static int hf_is_checkpoint(const char* path) {
    struct stat st;
    size_t n = strlen(path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 1;
    return n > 12 && !strcmp(path + n - 12, ".safetensors");
}

/* ---- Read --------------------------------------------------------------- */

/* Read a Hugging Face GPT-2 checkpoint: a folder holding config.json and
 * model.safetensors, or the .safetensors file with config.json beside it.
 * Fills *config (Vp = V rounded up to 128) and a fresh fp32 parameter buffer
 * in our layout; -1 after a message naming the file, the problem and what
 * to do. */
/* The two files of checkpoint `path` (a folder, or its .safetensors file
 * with config.json beside it) into st_path and cfg_path (4400 bytes each);
 * 0, or -1 after a message when model.safetensors is not there. */
static int hf_checkpoint_paths(const char* path, char* st_path, char* cfg_path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(st_path, 4400, "%s/model.safetensors", path);
        snprintf(cfg_path, 4400, "%s/config.json", path);
    } else {
        const char* slash = strrchr(path, '/');
        snprintf(st_path, 4400, "%s", path);
        snprintf(cfg_path, 4400, "%.*sconfig.json", slash ? (int)(slash - path + 1) : 0, path);
    }
    if (access(st_path, F_OK) != 0) {
        char index[4450];
        snprintf(index, sizeof(index), "%s.index.json", st_path);
        FILE_ERROR(st_path, "%s", access(index, F_OK) == 0
                   ? "this checkpoint is sharded (model.safetensors.index.json); gpt.c reads one model.safetensors"
                   : "no such file: a Hugging Face GPT-2 checkpoint folder holds model.safetensors and config.json "
                     "(pytorch_model.bin is not read: download model.safetensors)");
        return -1;
    }
    return 0;
}

/* The model's shape from checkpoint `path` without reading its weights
 * (--plan): config.json checked as hf_checkpoint_read checks it, and the
 * safetensors header read and checked. 0, or -1 after a message. */
static int hf_checkpoint_config(const char* path, GPT2Config* config) {
    char st_path[4400], cfg_path[4400];
    if (hf_checkpoint_paths(path, st_path, cfg_path) != 0 || hf_config_read(cfg_path, config) != 0) return -1;
    FILE* f = file_open_read(st_path, "safetensors file");
    if (!f) return -1;
    StHeader h;
    int rc = st_header_read(f, st_path, file_size(f), &h);
    fclose(f);
    if (rc == 0) free(h.t);
    return rc;
}

/* Tensor i of layer l (0 for a tensor outside the layers) as config.json's
 * model needs it: found in the header and of the shape that model implies
 * (by rank, so a one-row matrix is still a matrix). The tensor, its
 * rows x cols as stored; NULL after a message. */
static const SafeTensor* hf_tensor_of(const StHeader* h, const char* st_path, const char* prefix, const GPT2Config* c,
                                      int i, int l, size_t* rows, size_t* cols) {
    char name[ST_NAME_MAX];
    hf_name(name, sizeof(name), prefix, i, l);
    int is_vector = hf_shape(i, c, rows, cols) == 1;
    const SafeTensor* t = st_find(h, name);
    if (!t) {
        FILE_ERROR(st_path, "no tensor %s (GPT-2 with n_layer=%d, as config.json says, needs it): not a GPT-2 "
                   "checkpoint, or config.json belongs to another model", name, c->num_layers);
        st_names_print(h);
        return NULL;
    }
    int shape_ok = is_vector ? t->ndim == 1 && (size_t)t->shape[0] == *cols
                             : t->ndim == 2 && (size_t)t->shape[0] == *rows && (size_t)t->shape[1] == *cols;
    if (shape_ok) return t;
    char got[160] = "";
    size_t k = 0;
    for (int d = 0; d < t->ndim && k < sizeof(got) - 24; d++)
        k += (size_t)snprintf(got + k, sizeof(got) - k, "%s%lld", d ? ", " : "", t->shape[d]);
    if (is_vector) FILE_ERROR(st_path, "tensor %s has shape [%s], config.json (n_embd=%d) implies [%zu]", name, got,
                              c->channels, *cols);
    else FILE_ERROR(st_path, "tensor %s has shape [%s], config.json (n_embd=%d, vocab_size=%d, n_positions=%d) "
                    "implies [%zu, %zu]", name, got, c->channels, c->vocab_size, c->max_seq_len, *rows, *cols);
    fprintf(stderr, "  config.json and model.safetensors must come from the same model\n");
    return NULL;
}

static int hf_checkpoint_read(const char* path, GPT2Config* config, float** params_out) {
    *params_out = NULL;
    char st_path[4400], cfg_path[4400];
    if (hf_checkpoint_paths(path, st_path, cfg_path) != 0) return -1;
    GPT2Config c;
    if (hf_config_read(cfg_path, &c) != 0) return -1;
    FILE* f = file_open_read(st_path, "safetensors file");
    if (!f) return -1;
    StHeader h;
    if (st_header_read(f, st_path, file_size(f), &h) != 0) { fclose(f); return -1; }
    const char* prefix = st_find(&h, "wte.weight") || !st_find(&h, "transformer.wte.weight") ? "" : "transformer.";
    /* every tensor config.json's model needs, found and of its shape, before anything is sized by config.json:
     * the header's tensors tile the file, so the fp32 weights allocated below are at most twice its size (16-bit
     * tensors), the pad rows of wte aside */
    int rc = 0;
    size_t rows, cols;
    for (int i = 0; i < NUM_PARAMETER_TENSORS && rc == 0; i++) {
        int layered = i >= LAYER_TENSORS_BEGIN && i < LAYER_TENSORS_END;
        for (int l = 0; l < (layered ? c.num_layers : 1) && rc == 0; l++)
            if (!hf_tensor_of(&h, st_path, prefix, &c, i, l, &rows, &cols)) rc = -1;
    }
    size_t n = parameter_count(&c);
    float* params = rc ? NULL : (float*)malloc(n * sizeof(float));
    if (rc == 0 && !params) {
        FILE_ERROR(st_path, "its %zu parameters need %.1f GB as fp32, more than this machine can allocate now",
                   n, n * 4.0 / 1e9);
        rc = -1;
    }
    if (rc != 0) { free(h.t); fclose(f); return -1; }
    memset(params, 0, n * sizeof(float)); /* the pad rows of wte stay zero */
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, &c);
    float* dst = params;
    char* used = (char*)xmalloc((size_t)(h.n ? h.n : 1));
    memset(used, 0, (size_t)(h.n ? h.n : 1));
    for (int i = 0; i < NUM_PARAMETER_TENSORS && rc == 0; i++) {
        int layered = i >= LAYER_TENSORS_BEGIN && i < LAYER_TENSORS_END;
        for (int l = 0; l < (layered ? c.num_layers : 1) && rc == 0; l++) {
            const SafeTensor* t = hf_tensor_of(&h, st_path, prefix, &c, i, l, &rows, &cols); /* (checked above) */
            used[t - h.t] = 1;
            rc = st_read_floats(f, st_path, &h, t, dst + (size_t)l * rows * cols, rows, cols, HF_CONV1D[i]);
        }
        dst += sizes[i];
    }
    /* the head must be the embedding (we tie them); the masks are not weights */
    const SafeTensor* head = st_find(&h, "lm_head.weight");
    if (rc == 0 && head) {
        size_t V = (size_t)c.vocab_size, C = (size_t)c.channels;
        float* hw = head->ndim == 2 && (size_t)head->shape[0] == V && (size_t)head->shape[1] == C ? xmalloc_floats(V * C) : NULL;
        if (!hw || st_read_floats(f, st_path, &h, head, hw, V, C, 0) != 0 || memcmp(hw, params, V * C * 4) != 0) {
            FILE_ERROR(st_path, "lm_head.weight is not a copy of wte.weight: gpt.c ties the LM head to the token "
                       "embedding, as GPT-2 does; this checkpoint's head is untied");
            rc = -1;
        }
        free(hw);
    }
    int unknown = 0;
    for (int i = 0; i < h.n && rc == 0; i++) {
        if (used[i] || hf_name_ignored(h.t[i].name)) continue;
        if (unknown++ < 4) fprintf(stderr, "warning: %s: tensor %s is not part of GPT-2: ignored\n", st_path, h.t[i].name);
    }
    if (unknown > 4) fprintf(stderr, "warning: %s: %d more tensors ignored\n", st_path, unknown - 4);
    free(used);
    free(h.t);
    fclose(f);
    if (rc != 0) { free(params); return -1; }
    *config = c;
    *params_out = params;
    return 0;
}

/* ---- Write -------------------------------------------------------------- */

/* Write `dir`/config.json and `dir`/model.safetensors (F32, names of
 * GPT2LMHeadModel: transformer.*, no lm_head: tied) from our parameters.
 * Each file is written to a temporary name, synced, then renamed. 0, or -1
 * after a message. */
static int hf_checkpoint_write(const char* dir, const GPT2Config* c, const float* params) {
    if (mkdir_p(dir) != 0) {
        FILE_ERROR(dir, "cannot create the folder: %s", strerror(errno));
        return -1;
    }
    size_t C = (size_t)c->channels, V = (size_t)c->vocab_size;
    for (size_t i = V * C; i < (size_t)c->padded_vocab_size * C; i++) {
        if (params[i] != 0.0f) {
            fprintf(stderr, "warning: wte's pad rows (tokens %d..%d) are not zero; Hugging Face's file has V = %d rows, "
                    "they are dropped (no token uses them), and a re-import gives zeros there\n",
                    c->vocab_size, c->padded_vocab_size - 1, c->vocab_size);
            break;
        }
    }
    /* the header: every tensor's entry, offsets in the order written */
    size_t cap = 4096 + (size_t)c->num_layers * 12 * 160, len = 0;
    char* header = (char*)xmalloc(cap);
    unsigned long long offset = 0;
    len += (size_t)snprintf(header + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    size_t sizes[NUM_PARAMETER_TENSORS];
    parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int layered = i >= LAYER_TENSORS_BEGIN && i < LAYER_TENSORS_END;
        size_t rows, cols;
        int is_vector = hf_shape(i, c, &rows, &cols) == 1;
        for (int l = 0; l < (layered ? c->num_layers : 1); l++) {
            char name[ST_NAME_MAX], shape[64];
            hf_name(name, sizeof(name), "transformer.", i, l);
            if (is_vector) snprintf(shape, sizeof(shape), "[%zu]", cols);
            else snprintf(shape, sizeof(shape), "[%zu,%zu]", rows, cols);
            unsigned long long bytes = (unsigned long long)rows * cols * 4;
            len += (size_t)snprintf(header + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                                    name, shape, offset, offset + bytes);
            ALWAYS(len + 200 < cap);
            offset += bytes;
        }
    }
    header[len++] = '}';
    while ((8 + len) % 8 != 0) header[len++] = ' '; /* the data buffer starts 8-byte aligned */
    unsigned char len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (unsigned char)((unsigned long long)len >> (8 * k));

    char path[4400], tmp[4410];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f) {
        FILE_ERROR(tmp, "cannot create: %s", strerror(errno));
        free(header);
        return -1;
    }
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len;
    free(header);
    float* row = xmalloc_floats(4 * C); /* one (in) column of a Conv1D weight at a time, at most 4C */
    const float* src = params;
    for (int i = 0; i < NUM_PARAMETER_TENSORS && ok; i++) {
        int layered = i >= LAYER_TENSORS_BEGIN && i < LAYER_TENSORS_END;
        size_t rows, cols;
        hf_shape(i, c, &rows, &cols);
        for (int l = 0; l < (layered ? c->num_layers : 1) && ok; l++) {
            const float* w = src + (size_t)l * rows * cols;
            if (!HF_CONV1D[i]) { /* stored as ours (wte: its first V rows); little-endian, as this machine */
                ok = fwrite(w, 4, rows * cols, f) == rows * cols;
                continue;
            }
            /* ours (out = cols, in = rows) -> HF (in, out): row r of HF is column r of ours */
            for (size_t r = 0; r < rows && ok; r++) {
                for (size_t o = 0; o < cols; o++) row[o] = w[o * rows + r];
                ok = fwrite(row, 4, cols, f) == cols;
            }
        }
        src += sizes[i];
    }
    free(row);
    if (ok && fflush(f) != 0) ok = 0;
    if (ok && fsync(fileno(f)) != 0) ok = 0;
    int saved_errno = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        FILE_ERROR(path, "write failed (%s); the previous file, if any, is untouched", strerror(saved_errno ? saved_errno : errno));
        remove(tmp);
        return -1;
    }
    /* config.json: what GPT2Config needs; the rest are transformers' defaults */
    char cfg[2048], cfg_path[4400];
    int k = snprintf(cfg, sizeof(cfg),
        "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n"
        "  \"n_layer\": %d,\n  \"n_embd\": %d,\n  \"n_head\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n"
        "  \"vocab_size\": %d,\n  \"n_inner\": null,\n  \"activation_function\": \"gelu_new\",\n"
        "  \"layer_norm_epsilon\": 1e-05,\n  \"tie_word_embeddings\": true,\n"
        "  \"bos_token_id\": %d,\n  \"eos_token_id\": %d,\n  \"torch_dtype\": \"float32\"\n}\n",
        c->num_layers, c->channels, c->num_heads, c->max_seq_len, c->max_seq_len, c->vocab_size,
        c->vocab_size - 1, c->vocab_size - 1); /* GPT-2's <|endoftext|> is its last token, 50256 */
    ALWAYS(k > 0 && (size_t)k < sizeof(cfg));
    snprintf(cfg_path, sizeof(cfg_path), "%s/config.json", dir);
    WriteChunk chunk = {cfg, (size_t)k};
    return write_file_atomic(cfg_path, &chunk, 1);
}

/* --convert OUT: write the model to OUT and stop: OUT ending in .bin gets an
 * llm.c fp32 model file, anything else is a folder for config.json and
 * model.safetensors. */
static int model_convert(const char* out, const GPT2Config* c, const float* params) {
    size_t n = strlen(out);
    int to_llmc = n > 4 && !strcmp(out + n - 4, ".bin");
    int rc = to_llmc ? model_file_write(out, c, params) : hf_checkpoint_write(out, c, params);
    if (rc == 0)
        printf("--convert: wrote %s%s\n", out, to_llmc ? " (llm.c model file, fp32)"
                                                       : "/{config.json,model.safetensors} (Hugging Face GPT-2, F32)");
    return rc;
}

#endif /* GPTC_SAFETENSORS_H */
