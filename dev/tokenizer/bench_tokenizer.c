/* bench_tokenizer.c — encode speed of train_gpt.c's tokenizer (gptc/tokenizer.h) in MB/s on the
 * ~1 MB of mixed documents in dev/fixtures/tokenizer/expected.bin.
 * Run through dev/tokenizer/bench_tokenizer.sh, which also times the
 * reference JS tokenizer on the same documents and prints the ratio.
 *   gcc -std=c11 -O3 -march=native -fopenmp dev/tokenizer/bench_tokenizer.c -o bench_tokenizer
 *   ./bench_tokenizer [--dir data/tokenizer] [--fixture dev/fixtures/tokenizer/expected.bin]
 * Variants timed (best of 5 after nothing warmed):
 *   cold   one thread, a fresh TokenizerWork (empty pre-token cache) per pass
 *   warm   one thread, the cache kept from the previous pass
 *   many   tokenizer_encode_many, OpenMP over documents, 1 and 2 threads
 *          (each thread starts with an empty cache every pass)
 * Last line: "c_mbps_1thread=X c_mbps_2threads=Y" for the script. */
#include "gptc/tokenizer.h" /* first: its gptc/util.h sets _GNU_SOURCE */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }

int main(int argc, char** argv) {
    const char* dir = "data/tokenizer";
    const char* fixture = "dev/fixtures/tokenizer/expected.bin";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(argv[i], "--fixture") == 0) fixture = argv[i + 1];
        else { fprintf(stderr, "usage: %s [--dir DIR] [--fixture FILE]\n", argv[0]); return 2; }
    }
    char dp[512], mp[512];
    snprintf(dp, sizeof(dp), "%s/gpt2_tokenizer.bin", dir);
    snprintf(mp, sizeof(mp), "%s/gpt2_merges.bin", dir);
    Tokenizer t;
    if (tokenizer_init(&t, dp, mp) != TOKENIZER_OK) return 1;

    /* the mixed documents (kind 2) of the fixture, rebuilt from their parts */
    size_t size;
    unsigned char* b = tok_read_file(fixture, &size);
    if (b == NULL || size < 1024 || tok_read_u32le(b) != 20261103) { fprintf(stderr, "bad fixture %s\n", fixture); return 1; }
    uint32_t n = tok_read_u32le(b + 8);
    unsigned char** text = (unsigned char**)calloc(n, sizeof(*text));
    size_t* len = (size_t*)calloc(n, sizeof(size_t));
    int* kind = (int*)calloc(n, sizeof(int));
    TOK_CHECK_ALLOC(text); TOK_CHECK_ALLOC(len); TOK_CHECK_ALLOC(kind);
    size_t off = 1024, ndocs = 0, total = 0;
    for (uint32_t i = 0; i < n; i++) {   /* the fixture was checked by test_tokenizer; trust its sizes */
        kind[i] = (int)tok_read_u32le(b + off);
        uint32_t n2 = tok_read_u32le(b + off + 8);
        off += 12;
        if (kind[i] == 2) {
            for (uint32_t k = 0; k < n2; k++) len[i] += len[b[off + 2 * k] | b[off + 2 * k + 1] << 8];
            text[i] = (unsigned char*)malloc(len[i] + 1); TOK_CHECK_ALLOC(text[i]);
            size_t p = 0;
            for (uint32_t k = 0; k < n2; k++) {
                uint32_t c = b[off + 2 * k] | b[off + 2 * k + 1] << 8;
                memcpy(text[i] + p, text[c], len[c]); p += len[c];
            }
            off += 2 * n2;
        } else {
            text[i] = (unsigned char*)malloc(n2 + 1); TOK_CHECK_ALLOC(text[i]);
            memcpy(text[i], b + off, n2); len[i] = n2; off += n2;
        }
        off += 4 + 2 * (size_t)tok_read_u32le(b + off);
    }
    free(b);
    const unsigned char** docs = (const unsigned char**)malloc(n * sizeof(*docs));
    size_t* dlen = (size_t*)malloc(n * sizeof(size_t));
    int** outs = (int**)malloc(n * sizeof(int*));
    size_t* counts = (size_t*)malloc(n * sizeof(size_t));
    TOK_CHECK_ALLOC(docs); TOK_CHECK_ALLOC(dlen); TOK_CHECK_ALLOC(outs); TOK_CHECK_ALLOC(counts);
    for (uint32_t i = 0; i < n; i++) {
        if (kind[i] != 2) continue;
        docs[ndocs] = text[i]; dlen[ndocs] = len[i];
        outs[ndocs] = (int*)malloc((len[i] + 1) * sizeof(int)); TOK_CHECK_ALLOC(outs[ndocs]);
        total += len[i]; ndocs++;
    }
    printf("input: %zu documents, %zu bytes\n", ndocs, total);

    enum { REPS = 5 };
    double best_cold = 1e9, best_warm = 1e9;
    size_t ntok = 0;
    TokenizerWork warm;
    tokenizer_work_init(&warm);
    for (int r = 0; r < REPS; r++) {
        TokenizerWork w;
        double t0 = now();
        tokenizer_work_init(&w);
        ntok = 0;
        for (size_t d = 0; d < ndocs; d++) ntok += tokenizer_encode(&t, &w, docs[d], dlen[d], outs[d], dlen[d]);
        tokenizer_work_free(&w);
        double t1 = now();
        for (size_t d = 0; d < ndocs; d++) tokenizer_encode(&t, &warm, docs[d], dlen[d], outs[d], dlen[d]);
        double t2 = now();
        if (t1 - t0 < best_cold) best_cold = t1 - t0;
        if (r > 0 && t2 - t1 < best_warm) best_warm = t2 - t1;
    }
    tokenizer_work_free(&warm);
    printf("C cold cache, 1 thread : %8.2f MB/s (%zu tokens, %.1f ms)\n", total / best_cold / 1e6, ntok, best_cold * 1e3);
    printf("C warm cache, 1 thread : %8.2f MB/s\n", total / best_warm / 1e6);
    double mbps[3] = {0, 0, 0};
    for (int threads = 1; threads <= 2; threads++) {
#ifdef _OPENMP
        omp_set_num_threads(threads);
#else
        if (threads > 1) { printf("built without OpenMP: no 2-thread figure\n"); break; }
#endif
        double best = 1e9;
        for (int r = 0; r < REPS; r++) {
            double t0 = now();
            tokenizer_encode_many(&t, ndocs, docs, dlen, outs, dlen, counts);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        mbps[threads] = total / best / 1e6;
        printf("C encode_many, %d thread%s: %8.2f MB/s\n", threads, threads > 1 ? "s" : " ", mbps[threads]);
    }
    printf("c_mbps_1thread=%.3f c_mbps_2threads=%.3f\n", mbps[1], mbps[2]);
    for (uint32_t i = 0; i < n; i++) free(text[i]);
    for (size_t d = 0; d < ndocs; d++) free(outs[d]);
    free(text); free(len); free(kind); free(docs); free(dlen); free(outs); free(counts);
    tokenizer_free(&t);
    return 0;
}
