/*
 * fuzz/fuzz_eval_jsonl.c — libFuzzer harness for the eval set's JSONL
 * (HellaSwag's: "ctx", "endings", "label" a line), read and tokenized by
 * gptc/eval_data.h's evalset_from_jsonl (prepare_eval) with a fixed
 * tokenizer (fuzz/fuzz_vocab.h).
 *
 *   make fuzz/.build/fuzz_eval_jsonl    (or make fuzz, make test-fuzz)
 *
 * The input is the file. Oracles for one that reads: one example per
 * non-blank line at most; labels 0..3; every context decodes to a
 * non-empty text and every ending to one that starts with the space
 * llm.c's preparer puts before it; evalset_write then evalset_read gives
 * the same set.
 */
#include "fuzz_common.h"
#include "fuzz_vocab.h"

static Tokenizer fuzz_tok;

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("eval_jsonl");
    if (!fuzz_tok.can_encode && fuzz_vocab_tokenizer(&fuzz_tok, fuzz_dir) != 0) abort();
    const char* in = fuzz_write("eval.jsonl", data, size);
    EvalSet s;
    if (evalset_from_jsonl(&s, in, &fuzz_tok) != 0) return fuzz_refused();
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += data[i] == '\n';
    FUZZ_ORACLE(s.num_examples >= 1 && (size_t)s.num_examples <= lines, "%d examples from %zu lines",
                s.num_examples, lines);
    for (int i = 0; i < s.num_examples; i++) {
        FUZZ_ORACLE(s.labels[i] >= 0 && s.labels[i] < EVAL_CHOICES, "example %d: label %d", i, s.labels[i]);
        for (int k = 0; k < 1 + EVAL_CHOICES; k++) {
            size_t at = s.at[5 * (size_t)i + k];
            int n = s.len[5 * (size_t)i + k];
            FUZZ_ORACLE(n >= 1 && at + (size_t)n <= s.num_tokens, "example %d part %d: %d tokens", i, k, n);
            unsigned char first[1];
            int64_t bytes = tokenizer_decode_many(&fuzz_tok, s.tokens + at, (size_t)n, first, 1);
            FUZZ_ORACLE(bytes >= 1, "example %d part %d decodes to nothing", i, k);
            FUZZ_ORACLE(k == 0 || first[0] == ' ', "example %d: ending %d does not start with a space", i, k - 1);
        }
    }
    const char* out = fuzz_path("again.bin");
    if (evalset_write(&s, out) == 0) { /* (an example of more than 65535 bytes is refused by the format) */
        EvalSet again;
        FUZZ_ORACLE(evalset_read(&again, out) == 0, "the set written back is refused");
        FUZZ_ORACLE(again.num_examples == s.num_examples && again.num_tokens == s.num_tokens &&
                    memcmp(again.labels, s.labels, sizeof(int) * (size_t)s.num_examples) == 0 &&
                    memcmp(again.len, s.len, sizeof(int) * 5 * (size_t)s.num_examples) == 0 &&
                    memcmp(again.tokens, s.tokens, sizeof(int) * s.num_tokens) == 0,
                    "the set read back differs from the one written");
        evalset_free(&again);
    }
    evalset_free(&s);
    return 0;
}
