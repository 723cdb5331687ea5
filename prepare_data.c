/*
 * prepare_data.c — text in, llm.c token shards out, with the GPT-2 tokenizer
 * of train_gpt.c (it includes only the headers it needs: gptc/text_data.h,
 * which brings gptc/tokenizer.h and gptc/util.h).
 *
 *   make prepare_data
 *   ./prepare_data INPUT OUTPUT_PREFIX [--val-fraction 0.05] [--shard-tokens 100000000]
 *                  [--tokenizer data/tokenizer/gpt2_tokenizer.bin] [--merges data/tokenizer/gpt2_merges.bin]
 *
 * INPUT is a .jsonl file (a "text" field per line), a directory of .txt
 * files, or a text file whose documents are separated by two or more blank
 * lines (the rules are in gptc/text_data.h). Writes
 * OUTPUT_PREFIX_val_000000.bin and OUTPUT_PREFIX_train_000000.bin, ...
 * Every document is preceded by the end-of-text token. Train on them with
 *   ./train_gpt --train-data "OUTPUT_PREFIX_train_*.bin" --val-data "OUTPUT_PREFIX_val_*.bin"
 */
#include "gptc/text_data.h" /* defines: prepare_shards, ShardStats; with gptc/tokenizer.h: Tokenizer, tokenizer_init */

static void prepare_usage(FILE* out) {
    fprintf(out, "usage: prepare_data INPUT OUTPUT_PREFIX [--val-fraction F (0.05)] [--shard-tokens N (100000000)]\n"
                 "                    [--tokenizer FILE (data/tokenizer/gpt2_tokenizer.bin)]\n"
                 "                    [--merges FILE (data/tokenizer/gpt2_merges.bin)]\n"
                 "INPUT: a .jsonl file with a \"text\" field per line, a directory of .txt files, or a text file\n"
                 "whose documents are separated by two or more blank lines.\n");
}

int main(int argc, char** argv) {
    const char* input = NULL;
    const char* prefix = NULL;
    const char* tokenizer = "data/tokenizer/gpt2_tokenizer.bin";
    const char* merges = "data/tokenizer/gpt2_merges.bin";
    double val_fraction = 0.05;
    long long shard_tokens = 100000000;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        int has_value = i + 1 < argc;
        char* end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { prepare_usage(stdout); return 0; }
        else if (!strcmp(a, "--val-fraction") && has_value) {
            val_fraction = strtod(argv[++i], &end);
            if (*end || !(val_fraction >= 0.0 && val_fraction < 1.0)) {
                fprintf(stderr, "error: --val-fraction must be a number in [0, 1)\n");
                return EXIT_FAILURE;
            }
        } else if (!strcmp(a, "--shard-tokens") && has_value) {
            shard_tokens = strtoll(argv[++i], &end, 10);
            if (*end || shard_tokens < 1 || shard_tokens > 0x7FFFFFFF) {
                fprintf(stderr, "error: --shard-tokens must be an integer in 1..2147483647\n");
                return EXIT_FAILURE;
            }
        } else if (!strcmp(a, "--tokenizer") && has_value) tokenizer = argv[++i];
        else if (!strcmp(a, "--merges") && has_value) merges = argv[++i];
        else if (a[0] == '-') {
            fprintf(stderr, "error: unknown flag or missing value: %s\n", a);
            prepare_usage(stderr);
            return EXIT_FAILURE;
        } else if (!input) input = a;
        else if (!prefix) prefix = a;
        else {
            fprintf(stderr, "error: unexpected argument %s\n", a);
            prepare_usage(stderr);
            return EXIT_FAILURE;
        }
    }
    if (!input || !prefix) {
        prepare_usage(stderr);
        return EXIT_FAILURE;
    }
    Tokenizer tok;
    if (tokenizer_init(&tok, tokenizer, merges) != 0) return EXIT_FAILURE;
    double t0 = time_ms();
    ShardStats st;
    int rc = prepare_shards(input, prefix, &tok, val_fraction, (size_t)shard_tokens, &st);
    tokenizer_free(&tok);
    if (rc != 0) return EXIT_FAILURE;
    printf("%s: %zu documents -> %zu val tokens in %d shard(s), %zu train tokens in %d shard(s) (%s_*.bin), %.1f s\n",
           input, st.documents, st.val_tokens, st.val_shards, st.train_tokens, st.train_shards, prefix,
           (time_ms() - t0) / 1000.0);
    return 0;
}
