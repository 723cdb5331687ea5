/*
 * fuzz/fuzz_model_bf16.c — libFuzzer harness for llm.c's bf16 model file
 * (version 5), read by train_gpt.c's model_file_read (widened to fp32).
 *
 *   make fuzz/.build/fuzz_model_bf16    (or make fuzz, make test-fuzz)
 *
 * The input is the file; seeded with bf16 files, so the mutations explore
 * the version-5 path. Oracle for a file that parses: every weight is
 * finite and re-encodes to the file's bf16 word (widening is exact: the low
 * 16 bits are zero); a bf16 file written from those weights (here, by the
 * harness, independently of the reader) reads back the same config and
 * weights bit for bit.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("model_bf16");
    const char* in = fuzz_write("model.bin", data, size);
    GPT2Config c;
    float* params = NULL;
    if (model_file_read(in, &c, &params) != 0) return fuzz_refused();
    size_t n = parameter_count(&c);
    int32_t h[HEADER_INTS];
    memcpy(h, data, sizeof(h));
    if (h[1] != MODEL_VERSION_BF16) { free(params); return 0; } /* fp32: fuzz_model's */
    FUZZ_ORACLE(size == HEADER_INTS * 4 + 2 * n, "a bf16 file of %zu bytes for %zu weights", size, n);
    uint16_t* words = (uint16_t*)malloc(2 * n + 1);
    const uint16_t* w = (const uint16_t*)(data + HEADER_INTS * 4);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &params[i], 4);
        FUZZ_ORACLE(isfinite(params[i]), "weight %zu is not finite", i);
        FUZZ_ORACLE((bits & 0xFFFF) == 0 && (uint16_t)(bits >> 16) == w[i],
                    "weight %zu: file word 0x%04x read as float bits 0x%08x", i, w[i], bits);
        words[i] = (uint16_t)(bits >> 16);
    }
    /* the harness's own bf16 writer: the header words 0..7, zeros, the words */
    int32_t out_h[HEADER_INTS];
    memset(out_h, 0, sizeof(out_h));
    out_h[0] = MODEL_MAGIC; out_h[1] = MODEL_VERSION_BF16;
    out_h[2] = c.max_seq_len; out_h[3] = c.vocab_size; out_h[4] = c.num_layers;
    out_h[5] = c.num_heads; out_h[6] = c.channels; out_h[7] = c.padded_vocab_size;
    FUZZ_ORACLE(memcmp(out_h, h, 8 * 4) == 0, "header words 0..7 are not what was read");
    const char* out = fuzz_path("again.bin");
    FILE* f = fopen(out, "wb");
    FUZZ_ORACLE(f && fwrite(out_h, 4, HEADER_INTS, f) == HEADER_INTS && fwrite(words, 2, n, f) == n &&
                fclose(f) == 0, "cannot write %s", out);
    fuzz_reads_back(model_file_read, out, &c, params, n, "a second reading of the bf16 file");
    free(words);
    free(params);
    return 0;
}
