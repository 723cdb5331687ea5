/*
 * fuzz/fuzz_tokenizer.c — libFuzzer harness for the tokenizer's decode file
 * (llm.c's gpt2_tokenizer.bin, magic 20240328, version 2), read by
 * gptc/tokenizer.h's tokenizer_init without a merges file.
 *
 *   make fuzz/.build/fuzz_tokenizer    (or make fuzz, make test-fuzz)
 *
 * The input is the file. Oracles for a file that loads: the decode table
 * written back in the same format (by the harness: magic, version, count,
 * end-of-text id, then a length byte and the bytes of each token) is the
 * input byte for byte, header words 4..255 aside (unused, not read); every
 * token decodes alone to its bytes in the file; decoding all ids at once
 * gives their concatenation; an id past the table decodes to nothing.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("tokenizer");
    const char* in = fuzz_write("vocab.bin", data, size);
    Tokenizer t;
    if (tokenizer_init(&t, in, NULL) != TOKENIZER_OK) return fuzz_refused();
    FUZZ_ORACLE(t.vocab_size >= 256 && t.vocab_size <= TOKENIZER_MAX_VOCAB && t.eot_token < t.vocab_size,
                "%u tokens, end-of-text %u", t.vocab_size, t.eot_token);
    unsigned char* out = (unsigned char*)calloc(1, size + 1);
    uint32_t hw[4] = {TOKENIZER_MAGIC, TOKENIZER_VERSION, t.vocab_size, t.eot_token};
    memcpy(out, hw, sizeof(hw)); /* little-endian host, as the format */
    memcpy(out + 16, data + 16, 1024 - 16);
    size_t at = 1024;
    int* ids = (int*)malloc(sizeof(int) * t.vocab_size);
    for (uint32_t i = 0; i < t.vocab_size; i++) {
        size_t len = 0;
        const char* b = tokenizer_decode(&t, i, &len);
        FUZZ_ORACLE(b && len >= 1 && len <= 255 && at + 1 + len <= size, "token %u: %zu bytes at %zu", i, len, at);
        out[at] = (unsigned char)len;
        memcpy(out + at + 1, b, len);
        at += 1 + len;
        ids[i] = (int)i;
    }
    FUZZ_ORACLE(at == size, "the table written back is %zu bytes, the file %zu", at, size);
    FUZZ_ORACLE(memcmp(out, data, size) == 0, "the table written back differs from the file");
    size_t body = size - 1024 - t.vocab_size;
    unsigned char* all = (unsigned char*)malloc(body + 1);
    FUZZ_ORACLE(tokenizer_decode_many(&t, ids, t.vocab_size, all, body) == (int64_t)body,
                "decoding every id does not give %zu bytes", body);
    for (size_t i = 0, p = 1024, k = 0; i < t.vocab_size; i++) {
        size_t len = data[p];
        FUZZ_ORACLE(memcmp(all + k, data + p + 1, len) == 0, "token %zu decodes to other bytes than the file's", i);
        p += 1 + len;
        k += len;
    }
    size_t len = 7;
    FUZZ_ORACLE(tokenizer_decode(&t, t.vocab_size, &len) == NULL && len == 0, "an id past the table decodes");
    int past = (int)t.vocab_size;
    FUZZ_ORACLE(tokenizer_decode_many(&t, &past, 1, all, body) == -1, "decode_many takes an id past the table");
    free(all);
    free(ids);
    free(out);
    tokenizer_free(&t);
    return 0;
}
