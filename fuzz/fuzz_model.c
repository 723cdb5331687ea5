/*
 * fuzz/fuzz_model.c — libFuzzer harness for llm.c's fp32 model file
 * (version 3), read by train_gpt.c's model_file_read.
 *
 *   make fuzz/.build/fuzz_model    (or make fuzz, make test-fuzz)
 *
 * The input is the file. Oracle for a file that parses: model_file_write
 * of what was read gives the same bytes (header words 0..7 and every
 * weight; words 8..255 are unused, written as zero, and not compared), and
 * a second reading of that file gives the same config and weights bit for
 * bit.
 */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("model");
    const char* in = fuzz_write("model.bin", data, size);
    GPT2Config c;
    float* params = NULL;
    if (model_file_read(in, &c, &params) != 0) {
        FUZZ_ORACLE(params == NULL, "a refused file left a buffer behind");
        return fuzz_refused();
    }
    size_t n = parameter_count(&c);
#ifdef FUZZ_PLANT_ORACLE
    /* make test-fuzz's planted bug: a reader that rounds a weight (one ulp
     * off); the round trip must catch it on the first seed */
    if (n > 0) params[0] = nextafterf(params[0], INFINITY);
#endif
    int32_t h[HEADER_INTS];
    memcpy(h, data, sizeof(h));
    FUZZ_ORACLE(h[1] == MODEL_VERSION_FP32 || h[1] == MODEL_VERSION_BF16, "version %d accepted", h[1]);
    if (h[1] == MODEL_VERSION_FP32) {
        const char* out = fuzz_path("again.bin");
        FUZZ_ORACLE(model_file_write(out, &c, params) == 0, "cannot write back what was read");
        size_t m = 0;
        unsigned char* back = fuzz_read(out, &m);
        FUZZ_ORACLE(back && m == size, "written back: %zu bytes, read: %zu", m, size);
        FUZZ_ORACLE(memcmp(back, data, 8 * 4) == 0, "header words 0..7 differ after a round trip");
        FUZZ_ORACLE(memcmp(back + HEADER_INTS * 4, data + HEADER_INTS * 4, n * 4) == 0,
                    "the weights differ after a round trip");
        free(back);
        fuzz_reads_back(model_file_read, out, &c, params, n, "a second reading");
    } else {
        /* bf16 read by the fp32 seeds' mutants: widening is exact, so the
         * top halves of the floats are the file's words */
        const uint16_t* w = (const uint16_t*)(data + HEADER_INTS * 4);
        for (size_t i = 0; i < n; i++) {
            uint32_t bits;
            memcpy(&bits, &params[i], 4);
            FUZZ_ORACLE((bits & 0xFFFF) == 0 && (uint16_t)(bits >> 16) == w[i], "bf16 weight %zu widened wrong", i);
        }
    }
    for (size_t i = 0; i < n; i++) FUZZ_ORACLE(isfinite(params[i]), "weight %zu is not finite", i);
    free(params);
    return 0;
}
