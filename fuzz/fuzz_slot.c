/*
 * fuzz/fuzz_slot.c — libFuzzer harness for a memory snapshot slot (a state
 * record in a file of --shm-dir, mapped), read as a resume reads its own
 * slot: gptc/state.h's slot_map of the existing file (its contents kept),
 * then state_load_record.
 *
 *   make fuzz/.build/fuzz_slot    (or make fuzz, make test-fuzz)
 *
 * The input: a flag byte that may set the checksums (fuzz_state_record),
 * then the slot's bytes. Oracles for a record that loads: the slot is
 * exactly the header and three slices; the header made again from what
 * was parsed is the slot's (unused words aside); the weights land at
 * [lo, hi) of the whole-model buffer and nowhere else, m and v are the
 * slot's floats; every checksum matches what was copied.
 */
#include "fuzz_common.h"

#define FUZZ_SLOT_MAX_P ((size_t)1 << 22) /* a whole-model buffer the harness allocates */

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("slot");
    size_t n = 0;
    unsigned char* rec = fuzz_state_record(data, size, &n);
    if (!rec || n < STATE_HEADER_BYTES) { free(rec); return fuzz_refused(); }
    /* the whole-model buffer a resume hands in holds P floats: the harness
     * bounds P before it allocates (the parser checks P against the config) */
    int32_t h[HEADER_INTS];
    memcpy(h, rec, sizeof(h));
    int64_t P = get_i64(h, 22);
    if (P < 0 || (uint64_t)P > FUZZ_SLOT_MAX_P) { free(rec); return fuzz_refused(); }
    const char* in = fuzz_write("slot0", rec, n);
    Slot sl;
    FUZZ_ORACLE(slot_map(&sl, in, n, 0, NULL) == 0, "cannot map a slot file of %zu bytes", n);
    FUZZ_ORACLE(memcmp(sl.base, rec, n) == 0, "mapping the slot changed its contents");
    size_t k = n > STATE_HEADER_BYTES ? (n - STATE_HEADER_BYTES) / 12 : 0;
    float* full = (float*)malloc(sizeof(float) * ((size_t)P + 2));
    for (size_t i = 0; i < (size_t)P + 2; i++) full[i] = -7.0f; /* a value no record holds here */
    float* m = (float*)malloc(sizeof(float) * (k + 1));
    float* v = (float*)malloc(sizeof(float) * (k + 1));
    StateInfo s;
    if (state_load_record(sl.base, sl.bytes, "slot", &s, full + 1, m, v) == 0) {
        FUZZ_ORACLE(s.P == (size_t)P && s.lo <= s.hi && s.hi <= s.P && n == STATE_HEADER_BYTES + 12 * (s.hi - s.lo),
                    "[%zu, %zu) of %zu in a slot of %zu bytes", s.lo, s.hi, s.P, n);
        k = s.hi - s.lo;
        uint32_t crc[3] = {(uint32_t)h[30], (uint32_t)h[31], (uint32_t)h[32]};
        int32_t again[HEADER_INTS];
        state_header_make(again, &s, crc);
        FUZZ_ORACLE(fuzz_same_state_words(h, again), "the header made from what was parsed differs from the slot's");
        const unsigned char* a = rec + STATE_HEADER_BYTES;
        FUZZ_ORACLE(k == 0 || (memcmp(full + 1 + s.lo, a, 4 * k) == 0 && memcmp(m, a + 4 * k, 4 * k) == 0 &&
                               memcmp(v, a + 8 * k, 4 * k) == 0), "the arrays loaded are not the slot's");
        for (size_t i = 0; i < (size_t)P + 2; i++)
            if (i < 1 + s.lo || i >= 1 + s.hi) FUZZ_ORACLE(full[i] == -7.0f, "weight %zu outside [lo, hi) written", i - 1);
        FUZZ_ORACLE(crc32c(0, a, 4 * k) == crc[0] && crc32c(0, a + 4 * k, 4 * k) == crc[1] &&
                    crc32c(0, a + 8 * k, 4 * k) == crc[2], "a record whose checksums do not match was taken");
    }
    slot_unmap(&sl, 1);
    free(full);
    free(m);
    free(v);
    free(rec);
    return 0;
}
