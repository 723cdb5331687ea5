/*
 * fuzz/fuzz_merges.c — libFuzzer harness for the tokenizer's merges file
 * (ours, magic 20261102, version 1), read by gptc/tokenizer.h's
 * tokenizer_init beside a fixed decode file (fuzz/fuzz_vocab.h's
 * vocabulary: 256 bytes, 16 merges, end-of-text).
 *
 *   make fuzz/.build/fuzz_merges    (or make fuzz, make test-fuzz)
 *
 * The input is the merges file. Oracles for one that loads: every merge
 * and alias of the file is found in the table with its rank and merged
 * id; and byte-level BPE is lossless whatever the merges, so encoding
 * texts (fixed ones and the input's own bytes, any bytes) gives ids below
 * the vocabulary, no more ids than bytes, that decode to the text.
 */
#include "fuzz_common.h"
#include "fuzz_vocab.h"

static const char* fuzz_decode_path;

static void fuzz_roundtrip(const Tokenizer* t, const unsigned char* s, size_t n) {
    int* ids = (int*)malloc(sizeof(int) * (n + 1));
    size_t k = tokenizer_encode(t, NULL, s, n, ids, n + 1);
    FUZZ_ORACLE(k <= n, "%zu bytes encode to %zu ids", n, k);
    for (size_t i = 0; i < k; i++) FUZZ_ORACLE(ids[i] >= 0 && (uint32_t)ids[i] < t->vocab_size, "id %d", ids[i]);
    unsigned char* back = (unsigned char*)malloc(n + 1);
    FUZZ_ORACLE(tokenizer_decode_many(t, ids, k, back, n) == (int64_t)n && (n == 0 || memcmp(back, s, n) == 0),
                "a text of %zu bytes does not decode back to itself", n);
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("merges");
    if (!fuzz_decode_path) {
        size_t n;
        unsigned char* b = fuzz_vocab_decode_file(&n);
        fuzz_decode_path = strdup(fuzz_write("vocab.bin", b, n));
        free(b);
    }
    const char* in = fuzz_write("merges.bin", data, size);
    Tokenizer t;
    if (tokenizer_init(&t, fuzz_decode_path, in) != TOKENIZER_OK) return fuzz_refused();
    FUZZ_ORACLE(t.can_encode, "merges loaded but the tokenizer cannot encode");
    uint32_t m = tok_read_u32le(data + 12), a = tok_read_u32le(data + 20);
    FUZZ_ORACLE(size == 1024 + 12 * (size_t)m + 16 * (size_t)a, "%u merges and %u aliases in %zu bytes", m, a, size);
    for (uint32_t r = 0; r < m + a; r++) {
        const unsigned char* p = r < m ? data + 1024 + 12 * (size_t)r : data + 1024 + 12 * (size_t)m + 16 * (size_t)(r - m);
        const TokenizerPair* q = tok_pair_find(&t, tok_read_u32le(p), tok_read_u32le(p + 4));
        uint32_t rank = r < m ? r : tok_read_u32le(p + 12);
        FUZZ_ORACLE(q && (uint32_t)q->rank == rank && (uint32_t)q->merged == tok_read_u32le(p + 8),
                    "entry %u of the file is not in the table as written", r);
    }
    static const char* const texts[] = {"the", " the weather and the wording", "thing in an and", "",
                                        "\xff\xfe bytes \x80 not UTF-8", "  \n\n\t  tabs", "héllo wörld 123'''s"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        fuzz_roundtrip(&t, (const unsigned char*)texts[i], strlen(texts[i]));
    fuzz_roundtrip(&t, data, size < 4096 ? size : 4096);
    tokenizer_free(&t);
    return 0;
}
