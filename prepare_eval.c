/*
 * prepare_eval.c — a multiple-choice eval set (HellaSwag's JSONL, or any
 * file of the same shape) in, llm.c's eval file out (magic 20240522, the
 * format is in gptc/eval_data.h), tokenized with the GPT-2 encoder of
 * train_gpt.c: the context as it is, each ending as " " + ending, as
 * llm.c's dev/data/hellaswag.py does.
 *
 *   make prepare_eval
 *   scripts/fetch_hellaswag.sh data/hellaswag          # hellaswag_val.jsonl (10,042 examples)
 *   ./prepare_eval data/hellaswag/hellaswag_val.jsonl data/hellaswag/hellaswag_val.bin
 *   ./train_gpt ... --eval-file data/hellaswag/hellaswag_val.bin --eval-every 250
 *
 * Each line of the JSONL is one object with "ctx" (a string), "endings"
 * (an array of 4 strings) and "label" (0..3, a number or a string of one
 * digit); other fields are ignored, blank lines skipped.
 */
#include "gptc/eval_data.h" /* defines: EvalSet, evalset_from_jsonl, evalset_write; with gptc/tokenizer.h: tokenizer_init */

static void prepare_eval_usage(FILE* out) {
    fprintf(out, "usage: prepare_eval INPUT.jsonl OUTPUT.bin [--tokenizer FILE (data/tokenizer/gpt2_tokenizer.bin)]\n"
                 "                    [--merges FILE (data/tokenizer/gpt2_merges.bin)]\n"
                 "INPUT.jsonl: one example a line: {\"ctx\": \"...\", \"endings\": [4 strings], \"label\": 0..3}\n"
                 "(HellaSwag's hellaswag_val.jsonl: scripts/fetch_hellaswag.sh). OUTPUT.bin: llm.c's eval format.\n");
}

int main(int argc, char** argv) {
    const char* input = NULL;
    const char* output = NULL;
    const char* tokenizer = "data/tokenizer/gpt2_tokenizer.bin";
    const char* merges = "data/tokenizer/gpt2_merges.bin";
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { prepare_eval_usage(stdout); return 0; }
        else if (!strcmp(a, "--tokenizer") && has_value) tokenizer = argv[++i];
        else if (!strcmp(a, "--merges") && has_value) merges = argv[++i];
        else if (a[0] == '-') {
            fprintf(stderr, "error: unknown flag or missing value: %s\n", a);
            prepare_eval_usage(stderr);
            return EXIT_FAILURE;
        } else if (!input) input = a;
        else if (!output) output = a;
        else {
            fprintf(stderr, "error: unexpected argument %s\n", a);
            prepare_eval_usage(stderr);
            return EXIT_FAILURE;
        }
    }
    if (!input || !output) {
        prepare_eval_usage(stderr);
        return EXIT_FAILURE;
    }
    Tokenizer tok;
    if (tokenizer_init(&tok, tokenizer, merges) != 0) return EXIT_FAILURE;
    double t0 = time_ms();
    EvalSet s;
    int rc = evalset_from_jsonl(&s, input, &tok);
    tokenizer_free(&tok);
    if (rc == 0) rc = evalset_write(&s, output);
    if (rc != 0) return EXIT_FAILURE;
    int counts[EVAL_CHOICES] = {0};
    size_t longest = 0;
    int longest_row = 0; /* context + ending, in tokens: --seq-len above it scores every row whole */
    for (int i = 0; i < s.num_examples; i++) {
        counts[s.labels[i]]++;
        for (int k = 0; k < EVAL_CHOICES; k++) {
            int row = s.len[5 * (size_t)i] + s.len[5 * (size_t)i + 1 + k];
            longest_row = row > longest_row ? row : longest_row;
        }
        size_t b = evalset_example_bytes(&s, i);
        longest = b > longest ? b : longest;
    }
    printf("%s: %d examples, %zu tokens (labels 0/1/2/3: %d/%d/%d/%d), longest example %zu bytes -> %s, %.1f s\n",
           input, s.num_examples, s.num_tokens, counts[0], counts[1], counts[2], counts[3], longest,
           output, (time_ms() - t0) / 1000.0);
    printf("longest row (context + ending): %d tokens; train_gpt --eval-file scores every row whole at --seq-len >= %d "
           "(longer rows lose the start of their context)\n", longest_row, longest_row);
    evalset_free(&s);
    return 0;
}
