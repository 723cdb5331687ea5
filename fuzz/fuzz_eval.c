/*
 * fuzz/fuzz_eval.c — libFuzzer harness for the eval set file (llm.c's
 * HellaSwag format, magic 20240522), read by gptc/eval_data.h's
 * evalset_read (--eval-file).
 *
 *   make fuzz/.build/fuzz_eval    (or make fuzz, make test-fuzz)
 *
 * The input is the file. Oracles for a file that reads: labels 0..3,
 * every context and ending non-empty and inside the token array; written
 * back by evalset_write, the examples are the file's words exactly and the
 * header's words 0..2 the same (word 3, the longest example, may be any
 * bound the reader accepts: the writer puts the true one), and a second
 * reading gives the same set.
 */
#include "fuzz_common.h"

static int fuzz_same_set(const EvalSet* a, const EvalSet* b) {
    if (a->num_examples != b->num_examples || a->num_tokens != b->num_tokens) return 0;
    size_t N = (size_t)a->num_examples;
    return memcmp(a->labels, b->labels, N * sizeof(int)) == 0 && memcmp(a->at, b->at, 5 * N * sizeof(size_t)) == 0 &&
           memcmp(a->len, b->len, 5 * N * sizeof(int)) == 0 &&
           memcmp(a->tokens, b->tokens, a->num_tokens * sizeof(int)) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("eval");
    const char* in = fuzz_write("eval.bin", data, size);
    EvalSet s;
    if (evalset_read(&s, in) != 0) return fuzz_refused();
    FUZZ_ORACLE(s.num_examples >= 1 && s.num_examples <= EVAL_MAX_EXAMPLES, "%d examples", s.num_examples);
    int delimiter_token = 0;
    for (int i = 0; i < s.num_examples; i++) {
        FUZZ_ORACLE(s.labels[i] >= 0 && s.labels[i] < EVAL_CHOICES, "example %d: label %d", i, s.labels[i]);
        for (int k = 0; k < 1 + EVAL_CHOICES; k++) {
            size_t at = s.at[5 * (size_t)i + k];
            int n = s.len[5 * (size_t)i + k];
            FUZZ_ORACLE(n >= 1 && at + (size_t)n <= s.num_tokens, "example %d part %d: %d tokens at %zu of %zu", i, k,
                        n, at, s.num_tokens);
            for (int j = 0; j < n; j++) delimiter_token |= s.tokens[at + j] == EVAL_DELIMITER;
        }
    }
    /* a token 65535 (the delimiter's value) is read, as llm.c reads it, but
     * our writer refuses to write one: no round trip then */
    if (!delimiter_token) {
        const char* out = fuzz_path("again.bin");
        FUZZ_ORACLE(evalset_write(&s, out) == 0, "cannot write back what was read");
        size_t m = 0;
        unsigned char* back = fuzz_read(out, &m);
        FUZZ_ORACLE(back && m == size, "written back: %zu bytes, read: %zu", m, size);
        FUZZ_ORACLE(memcmp(back, data, 12) == 0, "header words 0..2 differ after a round trip");
        FUZZ_ORACLE(memcmp(back + 1024, data + 1024, size - 1024) == 0, "the examples differ after a round trip");
        int32_t longest;
        memcpy(&longest, back + 12, 4);
        int32_t bound;
        memcpy(&bound, data + 12, 4);
        FUZZ_ORACLE(longest <= bound, "the file says examples of at most %d bytes, one has %d", bound, longest);
        free(back);
        EvalSet again;
        FUZZ_ORACLE(evalset_read(&again, out) == 0, "the file written back is refused");
        FUZZ_ORACLE(fuzz_same_set(&s, &again), "a second reading differs from the first");
        evalset_free(&again);
    }
    evalset_free(&s);
    return 0;
}
