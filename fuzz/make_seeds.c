/*
 * fuzz/make_seeds.c — writes the seed corpus of every harness in fuzz/:
 * small valid files of each format, made by the project's own writers
 * (model_file_write, shard_write, hf_checkpoint_write, evalset_write,
 * state_header_make, calib_save) so a seed is what the trainer itself
 * writes; the bf16 model, the tokenizer files and the JSONL lines, which
 * the project reads but does not write, by the format.
 *
 *   make -f fuzz/fuzz.mk fuzz/.build/make_seeds && fuzz/.build/make_seeds DIR
 *      (make fuzz and make test-fuzz run it): DIR/<harness>/<seed>
 *
 * Deterministic: the same seeds on every run (a fixed Rng seed).
 */
#define GPTC_NO_MAIN
#include "../train_gpt.c"
#include "fuzz_vocab.h"

static const char* seeds_root;

static void seed_write(const char* harness, const char* name, const void* data, size_t n) {
    char dir[4400], path[4600];
    snprintf(dir, sizeof(dir), "%s/%s", seeds_root, harness);
    CHECK(mkdir_p(dir) == 0, "cannot create %s", dir);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE* f = fopen(path, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

static unsigned char* slurp(const char* path, size_t* n) {
    char* b = file_read_all(path, n);
    CHECK(b != NULL, "cannot read %s", path);
    return (unsigned char*)b;
}

/* Small random models: maxT V Vp L NH C (the configs' field order). */
static const GPT2Config CONFIGS[] = {{2, 3, 4, 1, 1, 4}, {3, 5, 8, 2, 2, 4}};
#define NUM_CONFIGS ((int)(sizeof(CONFIGS) / sizeof(CONFIGS[0])))

static float* random_params(const GPT2Config* c, uint64_t seed) {
    size_t n = parameter_count(c);
    float* p = xmalloc_floats(n);
    Rng rng;
    rng_init(&rng, seed);
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform(&rng) - 0.5f;
    /* wte's pad rows are zero in every model the trainer makes */
    for (size_t i = (size_t)c->vocab_size * c->channels; i < (size_t)c->padded_vocab_size * c->channels; i++) p[i] = 0;
    return p;
}

static void seeds_models(const char* tmp) {
    for (int k = 0; k < NUM_CONFIGS; k++) {
        const GPT2Config* c = &CONFIGS[k];
        float* p = random_params(c, 1337 + (uint64_t)k);
        size_t n = parameter_count(c), len;
        char path[4400], name[64];
        snprintf(path, sizeof(path), "%s/model.bin", tmp);
        CHECK(model_file_write(path, c, p) == 0, "model_file_write");
        unsigned char* b = slurp(path, &len);
        snprintf(name, sizeof(name), "fp32_L%d_C%d.bin", c->num_layers, c->channels);
        seed_write("model", name, b, len);
        /* bf16: the same header with version 5, each weight's top half */
        int32_t h[HEADER_INTS];
        memcpy(h, b, sizeof(h));
        h[1] = MODEL_VERSION_BF16;
        unsigned char* bf = (unsigned char*)xmalloc(sizeof(h) + 2 * n);
        memcpy(bf, h, sizeof(h));
        for (size_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &p[i], 4);
            uint16_t top = (uint16_t)(bits >> 16);
            memcpy(bf + sizeof(h) + 2 * i, &top, 2);
        }
        snprintf(name, sizeof(name), "bf16_L%d_C%d.bin", c->num_layers, c->channels);
        seed_write("model_bf16", name, bf, sizeof(h) + 2 * n);
        free(bf);
        free(b);
        /* a Hugging Face folder: config.json and model.safetensors in one input */
        char dir[4400], cp[4500], sp[4500];
        snprintf(dir, sizeof(dir), "%s/hf%d", tmp, k);
        CHECK(hf_checkpoint_write(dir, c, p) == 0, "hf_checkpoint_write");
        snprintf(cp, sizeof(cp), "%s/config.json", dir);
        snprintf(sp, sizeof(sp), "%s/model.safetensors", dir);
        size_t nc, ns;
        unsigned char* cb = slurp(cp, &nc);
        unsigned char* sb = slurp(sp, &ns);
        CHECK(nc < 65536, "config.json of %zu bytes", nc);
        unsigned char* both = (unsigned char*)xmalloc(2 + nc + ns);
        both[0] = (unsigned char)nc;
        both[1] = (unsigned char)(nc >> 8);
        memcpy(both + 2, cb, nc);
        memcpy(both + 2 + nc, sb, ns);
        snprintf(name, sizeof(name), "hf_L%d_C%d.bin", c->num_layers, c->channels);
        seed_write("safetensors", name, both, 2 + nc + ns);
        free(both); free(cb); free(sb);
        free(p);
    }
}

static void seeds_shards(const char* tmp) {
    static const int counts[] = {5, 9, 33};
    for (int k = 0; k < 3; k++) {
        uint16_t t[33];
        for (int i = 0; i < counts[k]; i++) t[i] = (uint16_t)(i == 0 ? 50256 : (i * 7919) % 50257);
        char path[4400], name[64];
        snprintf(path, sizeof(path), "%s/shard.bin", tmp);
        CHECK(shard_write(path, t, (size_t)counts[k]) == 0, "shard_write");
        size_t len;
        unsigned char* b = slurp(path, &len);
        snprintf(name, sizeof(name), "tokens_%d.bin", counts[k]);
        seed_write("shard", name, b, len);
        free(b);
    }
}

static void seeds_tokenizer(void) {
    size_t n;
    unsigned char* b = fuzz_vocab_decode_file(&n);
    seed_write("tokenizer", "vocab.bin", b, n);
    free(b);
    b = fuzz_vocab_merges_file(&n);
    seed_write("merges", "merges.bin", b, n);
    /* with an alias: (t, he) -> the at the rank of (th, e) */
    unsigned char* a = (unsigned char*)xmalloc(n + 16);
    memcpy(a, b, n);
    uint32_t one = 1, al[4] = {'t', 257, 258, 2};
    memcpy(a + 20, &one, 4);
    memcpy(a + n, al, 16);
    seed_write("merges", "merges_alias.bin", a, n + 16);
    free(a);
    free(b);
}

static void seeds_text(void) {
    static const char txt[] = "\0The first document.\nIts second line.\n\n\n\nThe second, after a gap;\n\n"
                              "a paragraph break inside it.\n \t\n\r\nthe third one\n";
    seed_write("text", "docs.txt", txt, sizeof(txt) - 1);
    static const char jsonl[] = "\1{\"text\": \"the weather and the wording\"}\n\n"
                                "{\"id\": 2, \"text\": \"caf\\u00e9 \\\"quoted\\\" \\ud83d\\ude00\\n\", \"meta\": [1, {\"a\": null}]}\n"
                                "  {\"text\":\"\\t\\b\\f\\r\\/\"}  \n";
    seed_write("text", "docs.jsonl", jsonl, sizeof(jsonl) - 1);
}

static void seeds_eval(const char* tmp) {
    static const char jsonl[] =
        "{\"ctx\": \"the man and the dog\", \"endings\": [\"ran\", \"the thing\", \"in an or\", \"wor\"], \"label\": 2}\n"
        "{\"ind\": 7, \"ctx\": \"A caf\\u00e9\", \"label\": \"0\", \"endings\": [\"x\", \"yy\", \"\", \"\\n\"], \"split\": \"val\"}\n";
    seed_write("eval_jsonl", "two.jsonl", jsonl, sizeof(jsonl) - 1);
    Tokenizer tok;
    CHECK(fuzz_vocab_tokenizer(&tok, tmp) == 0, "the fuzz vocabulary does not load");
    char path[4400];
    snprintf(path, sizeof(path), "%s/two.jsonl", tmp);
    FILE* f = fopen(path, "wb");
    CHECK(f && fwrite(jsonl, 1, sizeof(jsonl) - 1, f) == sizeof(jsonl) - 1 && fclose(f) == 0, "write %s", path);
    EvalSet s;
    CHECK(evalset_from_jsonl(&s, path, &tok) == 0, "evalset_from_jsonl of the seed");
    snprintf(path, sizeof(path), "%s/eval.bin", tmp);
    CHECK(evalset_write(&s, path) == 0, "evalset_write");
    size_t len;
    unsigned char* b = slurp(path, &len);
    seed_write("eval", "two.bin", b, len);
    free(b);
    evalset_free(&s);
    tokenizer_free(&tok);
}

/* One rank's record: flag byte 0 (the checksums are right) and the state. */
static void seeds_state(void) {
    const GPT2Config* c = &CONFIGS[1];
    size_t P = parameter_count(c);
    for (int world = 1; world <= 2; world++) {
        int rank = world - 1;
        StateInfo s;
        memset(&s, 0, sizeof(s));
        s.step = 3; s.rank = rank; s.world = world; s.zero = world > 1; s.B = 2; s.T = 3;
        s.total = 2 * 3 * world; s.seed = 42; s.shuffle = 1; s.config = *c;
        s.epoch = 1; s.shard_pos = 0; s.cursor = 4;
        s.P = P; s.lo = (size_t)rank * (P / 2); s.hi = world == 1 ? P : (size_t)(rank + 1) * (P / 2);
        s.sample_rng = 0x1234567890abcdefull; s.nonce = 0xfeedfacecafebeefull; s.steps = 10;
        s.watch.count = 3; s.watch.next = 3; s.watch.bad_run = 0;
        s.watch.recent[0] = 5.5f; s.watch.recent[1] = 5.25f; s.watch.recent[2] = 5.0f;
        size_t n = s.hi - s.lo;
        float* arrays = xmalloc_floats(3 * n);
        for (size_t i = 0; i < 3 * n; i++) arrays[i] = (float)i * 0.001f - (i >= 2 * n ? 0 : 0.5f);
        uint32_t crc[3];
        for (int a = 0; a < 3; a++) crc[a] = crc32c(0, arrays + (size_t)a * n, 4 * n);
        int32_t h[HEADER_INTS];
        state_header_make(h, &s, crc);
        size_t bytes = 1 + STATE_HEADER_BYTES + 12 * n;
        unsigned char* rec = (unsigned char*)xmalloc(bytes);
        rec[0] = 0;
        memcpy(rec + 1, h, STATE_HEADER_BYTES);
        memcpy(rec + 1 + STATE_HEADER_BYTES, arrays, 12 * n);
        char name[64];
        snprintf(name, sizeof(name), "rank%d_of%d.bin", rank, world);
        seed_write("state", name, rec, bytes);
        seed_write("slot", name, rec, bytes);
        rec[0] = 3; /* the same with the harness's checksum fix-up on */
        snprintf(name, sizeof(name), "rank%d_of%d_fix.bin", rank, world);
        seed_write("state", name, rec, bytes);
        seed_write("slot", name, rec, bytes);
        free(rec);
        free(arrays);
    }
}

/* A cache as calib_save writes it, with fuzz_calib.c's key and another. */
static void seeds_calib(const char* tmp) {
    Calibration cal;
    memset(&cal, 0, sizeof(cal));
    snprintf(cal.path, sizeof(cal.path), "%s/cache/calibration.txt", tmp);
    snprintf(cal.key, sizeof(cal.key), "cpu=other threads=2 ranks=1 build=9.9 C=768 NH=12 Vp=50304 Tc=128");
    double* v[CALIB_NUMBERS];
    calib_numbers(&cal, v);
    for (int i = 0; i < CALIB_NUMBERS; i++) *v[i] = 0.001 * (i + 1);
    calib_gemm_rows(768, 50304, cal.rows); /* the row counts calib_load expects for the key's shape */
    cal.layer_factor = 1.1; cal.ms = 250;
    calib_save(&cal);
    snprintf(cal.key, sizeof(cal.key), "cpu=fuzz threads=1 ranks=1 build=1.1 C=32 NH=2 Vp=128 Tc=16");
    calib_gemm_rows(32, 128, cal.rows);
    cal.elem_gbs = 12.5; cal.ce_gbs = 8.25; cal.adamw_gbs = 20; cal.share_gflops = 150;
    calib_save(&cal);
    size_t len;
    unsigned char* b = slurp(cal.path, &len);
    seed_write("calib", "calibration.txt", b, len);
    free(b);
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR   (writes DIR/<harness>/<seed>)\n", argv[0]);
        return 1;
    }
    seeds_root = argv[1];
    char tmp[4400];
    snprintf(tmp, sizeof(tmp), "%s/.work", seeds_root);
    CHECK(mkdir_p(tmp) == 0, "cannot create %s", tmp);
    seeds_models(tmp);
    seeds_shards(tmp);
    seeds_tokenizer();
    seeds_text();
    seeds_eval(tmp);
    seeds_state();
    seeds_calib(tmp);
    printf("make_seeds: seeds in %s\n", seeds_root);
    return 0;
}
