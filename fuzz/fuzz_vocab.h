/*
 * fuzz/fuzz_vocab.h — a small byte-level BPE vocabulary, written in the
 * tokenizer's two file formats (gptc/tokenizer.h): the decode file (llm.c's,
 * magic 20240328) and the merges file (ours, magic 20261102). The
 * tokenizer, merges, text and eval JSONL harnesses load it; make_seeds
 * writes it as their seeds.
 *
 * Included by fuzz/fuzz_tokenizer.c, fuzz_merges.c, fuzz_text.c,
 * fuzz_eval_jsonl.c and fuzz/make_seeds.c, after the trainer. Defines:
 * FUZZ_MERGES, fuzz_vocab_decode_file, fuzz_vocab_merges_file,
 * fuzz_vocab_tokenizer.
 *
 * Ids 0..255 are the bytes themselves, then one token per merge below (in
 * rank order), then <|endoftext|>.
 */
#ifndef FUZZ_VOCAB_H
#define FUZZ_VOCAB_H

static const char* const FUZZ_MERGES[][2] = {
    {"t", "h"}, {"h", "e"}, {"th", "e"}, {" ", "t"}, {" t", "he"}, {"i", "n"}, {"in", "g"}, {"a", "n"},
    {"an", "d"}, {" ", "a"}, {" a", "n"}, {" an", "d"}, {"e", "r"}, {" ", "w"}, {"o", "r"}, {" w", "or"},
};
#define FUZZ_NUM_MERGES ((int)(sizeof(FUZZ_MERGES) / sizeof(FUZZ_MERGES[0])))
#define FUZZ_VOCAB (256 + FUZZ_NUM_MERGES + 1)
#define FUZZ_EOT (FUZZ_VOCAB - 1)

static void fuzz_put_u32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

/* Token id of the bytes s (an id built so far), or -1. */
static int fuzz_vocab_id(const char* s, int built) {
    if (strlen(s) == 1) return (unsigned char)s[0];
    for (int r = 0; r < built; r++) {
        char joined[64];
        snprintf(joined, sizeof(joined), "%s%s", FUZZ_MERGES[r][0], FUZZ_MERGES[r][1]);
        if (!strcmp(joined, s)) return 256 + r;
    }
    return -1;
}

/* The decode file: a malloc'd buffer of *n bytes. */
static unsigned char* fuzz_vocab_decode_file(size_t* n) {
    unsigned char* b = (unsigned char*)calloc(1, 1024 + 256 * 2 + FUZZ_NUM_MERGES * 64 + 64);
    fuzz_put_u32(b, TOKENIZER_MAGIC);
    fuzz_put_u32(b + 4, TOKENIZER_VERSION);
    fuzz_put_u32(b + 8, FUZZ_VOCAB);
    fuzz_put_u32(b + 12, FUZZ_EOT);
    size_t at = 1024;
    for (int i = 0; i < 256; i++) { b[at++] = 1; b[at++] = (unsigned char)i; }
    for (int r = 0; r < FUZZ_NUM_MERGES; r++) {
        size_t k = strlen(FUZZ_MERGES[r][0]) + strlen(FUZZ_MERGES[r][1]);
        b[at++] = (unsigned char)k;
        memcpy(b + at, FUZZ_MERGES[r][0], strlen(FUZZ_MERGES[r][0]));
        memcpy(b + at + strlen(FUZZ_MERGES[r][0]), FUZZ_MERGES[r][1], strlen(FUZZ_MERGES[r][1]));
        at += k;
    }
    const char* eot = "<|endoftext|>";
    b[at++] = (unsigned char)strlen(eot);
    memcpy(b + at, eot, strlen(eot));
    at += strlen(eot);
    *n = at;
    return b;
}

/* The merges file: a malloc'd buffer of *n bytes. */
static unsigned char* fuzz_vocab_merges_file(size_t* n) {
    size_t size = 1024 + 12 * (size_t)FUZZ_NUM_MERGES;
    unsigned char* b = (unsigned char*)calloc(1, size);
    fuzz_put_u32(b, TOKENIZER_MERGES_MAGIC);
    fuzz_put_u32(b + 4, TOKENIZER_MERGES_VERSION);
    fuzz_put_u32(b + 8, FUZZ_VOCAB);
    fuzz_put_u32(b + 12, FUZZ_NUM_MERGES);
    fuzz_put_u32(b + 16, FUZZ_EOT);
    fuzz_put_u32(b + 20, 0);
    for (int r = 0; r < FUZZ_NUM_MERGES; r++) {
        int l = fuzz_vocab_id(FUZZ_MERGES[r][0], r), rr = fuzz_vocab_id(FUZZ_MERGES[r][1], r);
        if (l < 0 || rr < 0) { fprintf(stderr, "fuzz_vocab: merge %d uses an unknown token\n", r); abort(); }
        fuzz_put_u32(b + 1024 + 12 * (size_t)r, (uint32_t)l);
        fuzz_put_u32(b + 1024 + 12 * (size_t)r + 4, (uint32_t)rr);
        fuzz_put_u32(b + 1024 + 12 * (size_t)r + 8, 256u + (uint32_t)r);
    }
    *n = size;
    return b;
}

/* The vocabulary loaded into *t through the files (dir/vocab.bin,
 * dir/merges.bin) the way the trainer loads GPT-2's; 0 or -1. */
static int fuzz_vocab_tokenizer(Tokenizer* t, const char* dir) {
    char dp[600], mp[600];
    snprintf(dp, sizeof(dp), "%s/vocab.bin", dir);
    snprintf(mp, sizeof(mp), "%s/merges.bin", dir);
    size_t n;
    unsigned char* b = fuzz_vocab_decode_file(&n);
    FILE* f = fopen(dp, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) return -1;
    free(b);
    b = fuzz_vocab_merges_file(&n);
    f = fopen(mp, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) return -1;
    free(b);
    return tokenizer_init(t, dp, mp);
}

#endif /* FUZZ_VOCAB_H */
