/*
 * fuzz/fuzz_state.c — libFuzzer harness for a training state file on disk
 * (<dir>/state_<step>_rank<r>.bin, magic 20261103, version 2), read as a
 * resume reads it: gptc/state.h's state_read_header, then
 * state_read_arrays.
 *
 *   make fuzz/.build/fuzz_state    (or make fuzz, make test-fuzz)
 *
 * The input: a flag byte that may set the checksums (fuzz_state_record),
 * then the file. Oracles for a state that reads: its header made again by
 * state_header_make from what was parsed is the file's, word for word (the
 * unused words aside); the file is exactly the header and three slices of
 * hi - lo floats; the weights, m and v read are the file's floats, in
 * place; a header checksum that does not match is never taken.
 */
#include "fuzz_common.h"

#define FUZZ_STATE_MAX_P ((size_t)1 << 22) /* a whole-model buffer the harness allocates */

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("state");
    size_t n = 0;
    unsigned char* rec = fuzz_state_record(data, size, &n);
    if (!rec) return fuzz_refused();
    const char* in = fuzz_write("state_00000001_rank0.bin", rec, n);
    StateInfo s;
    int32_t h[HEADER_INTS];
    if (state_read_header(in, &s, h, 0) != 0) { free(rec); return fuzz_refused(); }
    FUZZ_ORACLE((uint32_t)h[255] == crc32c(0, h, 255 * 4), "a header whose checksum does not match was taken");
    uint32_t crc[3] = {(uint32_t)h[30], (uint32_t)h[31], (uint32_t)h[32]};
    int32_t again[HEADER_INTS];
    state_header_make(again, &s, crc);
    FUZZ_ORACLE(fuzz_same_state_words(h, again), "the header made from what was parsed differs from the file's");
    size_t k = s.hi - s.lo;
    FUZZ_ORACLE(s.lo <= s.hi && s.hi <= s.P && n == STATE_HEADER_BYTES + 12 * k, "[%zu, %zu) of %zu in %zu bytes", s.lo,
                s.hi, s.P, n);
    if (s.P <= FUZZ_STATE_MAX_P) {
        float* full = (float*)calloc(s.P + 1, sizeof(float));
        float* m = (float*)malloc(sizeof(float) * (k + 1));
        float* v = (float*)malloc(sizeof(float) * (k + 1));
        if (state_read_arrays(in, &s, h, full, m, v, s.lo, s.hi) == 0) {
            const unsigned char* a = rec + STATE_HEADER_BYTES;
            FUZZ_ORACLE(crc32c(0, a, 4 * k) == crc[0] && crc32c(0, a + 4 * k, 4 * k) == crc[1] &&
                        crc32c(0, a + 8 * k, 4 * k) == crc[2], "arrays whose checksums do not match were taken");
            FUZZ_ORACLE(k == 0 || (memcmp(full + s.lo, a, 4 * k) == 0 && memcmp(m, a + 4 * k, 4 * k) == 0 &&
                                   memcmp(v, a + 8 * k, 4 * k) == 0), "the arrays read are not the file's");
        }
        free(full);
        free(m);
        free(v);
    }
    free(rec);
    return 0;
}
