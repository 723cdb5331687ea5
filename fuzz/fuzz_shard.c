/*
 * fuzz/fuzz_shard.c — libFuzzer harness for llm.c's token shard (magic
 * 20240520), read by train_gpt.c's data loader: shard_header, then
 * dataloader_init (which loads it and checks every token against the
 * vocabulary) and a few dataloader_next batches.
 *
 *   make fuzz/.build/fuzz_shard    (or make fuzz, make test-fuzz)
 *
 * The input is the file. Loader settings: B=1, T=4, one rank, vocabulary
 * 50257, not shuffled. Oracles for a file that loads: its size is exactly
 * 1024 + 2 x the header's count; the loaded tokens are the file's words;
 * every token is below the vocabulary; each batch's inputs are the tokens
 * at its sample's place and its targets the same shifted by one; a second
 * reading of the file gives the same tokens.
 */
#include "fuzz_common.h"

#define FUZZ_SHARD_V 50257
#define FUZZ_SHARD_T 4

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("shard");
    const char* in = fuzz_write("shard.bin", data, size);
    long long n = -1;
    int header_ok = shard_header(in, &n) == 0;
    DataLoader d;
    if (dataloader_init(&d, in, 1, FUZZ_SHARD_T, 0, 1, FUZZ_SHARD_V, 0, 1) != 0) return fuzz_refused();
    FUZZ_ORACLE(header_ok, "the loader took a file whose header shard_header refuses");
    FUZZ_ORACLE(n >= FUZZ_SHARD_T + 1 && (long long)size == 1024 + 2 * n, "%lld tokens in a file of %zu bytes", n, size);
    FUZZ_ORACLE(d.num_tokens == n, "loaded %lld tokens, the header says %lld", d.num_tokens, n);
    FUZZ_ORACLE(memcmp(d.tokens, data + 1024, (size_t)n * 2) == 0, "the loaded tokens are not the file's");
    for (long long i = 0; i < n; i++) FUZZ_ORACLE(d.tokens[i] < FUZZ_SHARD_V, "token %lld is %u", i, d.tokens[i]);
#ifdef FUZZ_PLANT_OVERFLOW
    /* make test-fuzz's planted bug: a read past the tokens when the shard
     * has token 4660 second (no seed has); coverage-guided
     * fuzzing must find it, and AddressSanitizer report it */
    if (d.tokens[1] == 4660) {
        uint16_t* copy = (uint16_t*)malloc((size_t)n * 2);
        memcpy(copy, d.tokens, (size_t)n * 2);
        FUZZ_ORACLE(copy[n] != 0xFFFF, "(planted)"); /* one past the end */
        free(copy);
    }
#endif
    for (int step = 0; step < 3; step++) {
        long long cursor = d.cursor >= d.num_samples ? 0 : d.cursor;
        FUZZ_ORACLE(dataloader_next(&d) == 0, "batch %d of a loaded shard failed", step);
        long long sample = d.sample_order[cursor];
        FUZZ_ORACLE(sample >= 0 && (sample + 1) * FUZZ_SHARD_T < n + 1, "sample %lld past the shard", sample);
        for (int t = 0; t < FUZZ_SHARD_T; t++) {
            uint16_t x, y;
            memcpy(&x, data + 1024 + 2 * (size_t)(sample * FUZZ_SHARD_T + t), 2);
            memcpy(&y, data + 1024 + 2 * (size_t)(sample * FUZZ_SHARD_T + t + 1), 2);
            FUZZ_ORACLE(d.inputs[t] == x && d.targets[t] == y, "batch %d position %d: (%d, %d), the file has (%u, %u)",
                        step, t, d.inputs[t], d.targets[t], x, y);
        }
    }
    DataLoader again;
    FUZZ_ORACLE(dataloader_init(&again, in, 1, FUZZ_SHARD_T, 0, 1, FUZZ_SHARD_V, 0, 1) == 0, "a second reading failed");
    FUZZ_ORACLE(again.num_tokens == n && memcmp(again.tokens, d.tokens, (size_t)n * 2) == 0,
                "a second reading differs");
    dataloader_free(&again);
    dataloader_free(&d);
    return 0;
}
