/*
 * gptc/eval_data.h — multiple-choice eval sets (HellaSwag and any set of the
 * same shape: a context, four endings, the index of the right one) in
 * llm.c's eval file format: read, write, and made from the dataset's JSONL
 * with our GPT-2 encoder.
 *
 * Included by train_gpt.c (section 8: --eval-file, scored by
 * gptc/eval.h's eval_choices) and by prepare_eval.c (JSONL -> eval file). Defines:
 * EVAL_MAGIC, EvalSet, evalset_free, evalset_read, evalset_write,
 * evalset_from_jsonl.
 *
 * The file (llm.c's, magic 20240522, version 1; the facts below are those of
 * llm.c's dev/data/hellaswag.py writer and llmc/dataloader.h reader):
 *   header: 256 little-endian int32: [0] magic, [1] version, [2] number of
 *           examples N, [3] the longest example in bytes; the rest 0.
 *   then N examples, each a run of little-endian uint16:
 *     65535                 the start-of-example delimiter
 *     bytes                 this example's size in bytes, these 3 header words included
 *     index                 0 .. N-1, in order
 *     label                 0 .. 3, the right ending
 *     4                     the number of endings
 *     n_ctx, ctx tokens     the shared context
 *     4 x (n_k, tokens)     each ending
 * A uint16 index caps a file at 65536 examples (HellaSwag's val has 10,042);
 * an example's bytes, at 65535. The reader checks every field, and that the
 * examples fill the file exactly.
 *
 * The tokens (what llm.c's preparer does, and prepare_eval does the same):
 * the context is encoded alone, each ending as " " + ending (the space that
 * joins them in the sentence belongs to the ending's first token), so the
 * tokens of context + ending are the concatenation of the two lists.
 */
#ifndef GPTC_EVAL_DATA_H
#define GPTC_EVAL_DATA_H

#include "util.h"
#include "tokenizer.h" /* Tokenizer, tokenizer_encode */
#include "json.h"      /* json_object_value, json_string: the JSONL fields */

#define EVAL_MAGIC 20240522
#define EVAL_VERSION 1
#define EVAL_CHOICES 4                  /* llm.c's files all have four endings */
#define EVAL_DELIMITER 65535            /* uint16 at the start of every example */
#define EVAL_MAX_EXAMPLES 65536         /* the index is a uint16 */
#define EVAL_MAX_EXAMPLE_BYTES 65535    /* the example's size is a uint16 */

/* A whole eval set in memory. Example i's context is tokens[at[5i] ..
 * at[5i] + len[5i]), its ending k (0..3) the same with 5i + 1 + k. */
typedef struct {
    int num_examples;   /* N */
    int longest_bytes;  /* header [3] */
    int* labels;        /* (N) the right ending, 0..3 */
    size_t* at;         /* (N, 5) where the context and the endings start in tokens */
    int* len;           /* (N, 5) their lengths in tokens */
    int* tokens;        /* every token, example after example */
    size_t num_tokens;
} EvalSet;

static void evalset_free(EvalSet* s) {
    free(s->labels);
    free(s->at);
    free(s->len);
    free(s->tokens);
    memset(s, 0, sizeof(*s));
}

/* Bytes example i takes in the file: 5 words (delimiter, bytes, index,
 * label, count) + 1 + n_ctx + 4 x (1 + n_k). */
static size_t evalset_example_bytes(const EvalSet* s, int i) {
    size_t words = 5;
    for (int k = 0; k < 1 + EVAL_CHOICES; k++) words += 1 + (size_t)s->len[5 * (size_t)i + k];
    return 2 * words;
}

#define EVAL_HINT "HINT: make the file with ./prepare_eval (or llm.c's dev/data/hellaswag.py)"

/* Read and check an eval file. 0, or -1 after a message naming the file and
 * the field (nothing allocated then). */
static int evalset_read(EvalSet* s, const char* path) {
    memset(s, 0, sizeof(*s));
    FILE* f = file_open_read(path, "eval file");
    if (!f) return -1;
    long long size = file_size(f);
    int32_t h[HEADER_INTS];
    if (size < (long long)sizeof(h)) {
        FILE_ERROR(path, "%lld bytes, shorter than the 1024-byte header: not an eval file. " EVAL_HINT, size);
        fclose(f);
        return -1;
    }
    if (read_exact(f, h, sizeof(h), path) != 0) { fclose(f); return -1; }
    if (h[0] != EVAL_MAGIC || h[1] != EVAL_VERSION) {
        FILE_ERROR(path, "magic %d version %d, expected %d version %d (llm.c's eval format). " EVAL_HINT,
                   h[0], h[1], EVAL_MAGIC, EVAL_VERSION);
        fclose(f);
        return -1;
    }
    long long body = size - (long long)sizeof(h);
    if (h[2] < 1 || h[2] > EVAL_MAX_EXAMPLES || h[3] < 20 || h[3] > EVAL_MAX_EXAMPLE_BYTES || body % 2 != 0 ||
        body < 20LL * h[2] || body > (long long)h[2] * h[3]) {
        FILE_ERROR(path, "header says %d examples of at most %d bytes, the file holds %lld bytes after it: "
                   "a damaged or truncated file. " EVAL_HINT, h[2], h[3], body);
        fclose(f);
        return -1;
    }
    size_t words = (size_t)body / 2;
    uint16_t* w = (uint16_t*)xmalloc((size_t)body);
    if (read_exact(f, w, (size_t)body, path) != 0) { free(w); fclose(f); return -1; }
    fclose(f);
    int N = h[2];
    s->num_examples = N;
    s->longest_bytes = h[3];
    s->labels = (int*)xmalloc(sizeof(int) * (size_t)N);
    s->at = (size_t*)xmalloc(sizeof(size_t) * 5 * (size_t)N);
    s->len = (int*)xmalloc(sizeof(int) * 5 * (size_t)N);
    s->tokens = (int*)xmalloc(sizeof(int) * words); /* more than enough: tokens are a subset of the words */
    size_t p = 0; /* the word being read */
    const char* why = NULL;
    char found[160] = ""; /* what the file holds where `why` says it is wrong */
    int i = 0;
    for (; i < N; i++) { /* i moves only after example i has passed every check */
        size_t start = p;
        if (words - p < 5) {
            why = "the file ends inside an example's header";
            snprintf(found, sizeof(found), "%zu of its 5 header words are left", words - p);
            break;
        }
        if (w[p] != EVAL_DELIMITER) {
            why = "the start-of-example delimiter is missing";
            snprintf(found, sizeof(found), "expected 65535 at word %zu, found %u", p, w[p]);
            break;
        }
        size_t bytes = w[p + 1];
        if (w[p + 2] != (uint16_t)i) {
            why = "the example index is out of order";
            snprintf(found, sizeof(found), "expected %d, found %u", i, w[p + 2]);
            break;
        }
        if (bytes < 20 || bytes % 2 != 0 || bytes > (size_t)h[3] || bytes / 2 > words - p) {
            why = "the example's size is out of range";
            snprintf(found, sizeof(found), "expected an even size of 20..%d bytes within the %zu bytes left, found %zu",
                     h[3], 2 * (words - p), bytes);
            break;
        }
        if (w[p + 3] >= EVAL_CHOICES) {
            why = "the label is out of range";
            snprintf(found, sizeof(found), "expected 0..3, found %u", w[p + 3]);
            break;
        }
        if (w[p + 4] != EVAL_CHOICES) {
            why = "the number of endings is wrong";
            snprintf(found, sizeof(found), "expected 4, found %u", w[p + 4]);
            break;
        }
        s->labels[i] = w[p + 3];
        size_t end = start + bytes / 2;
        p += 5;
        for (int k = 0; k < 1 + EVAL_CHOICES; k++) {
            if (p >= end || w[p] == 0 || w[p] > end - p - 1) {
                why = k == 0 ? "the context is empty or runs past the example's end"
                             : "an ending is empty or runs past the example's end";
                char part[16] = "context";
                if (k) snprintf(part, sizeof(part), "ending %d", k - 1);
                if (p >= end) snprintf(found, sizeof(found), "%s: no token count left in the example", part);
                else snprintf(found, sizeof(found), "%s: expected 1..%zu tokens, found %u", part,
                              end > p + 1 ? end - p - 1 : 0, w[p]);
                break;
            }
            size_t n = w[p++];
            s->at[5 * (size_t)i + k] = s->num_tokens;
            s->len[5 * (size_t)i + k] = (int)n;
            for (size_t j = 0; j < n; j++) s->tokens[s->num_tokens++] = w[p++];
        }
        if (!why && p != end) {
            why = "the example's size does not match its contents";
            snprintf(found, sizeof(found), "its size says %zu bytes, its context and endings take %zu",
                     bytes, 2 * (p - start));
        }
        if (why) break;
    }
    if (!why && p != words) {
        why = "bytes follow the last example";
        snprintf(found, sizeof(found), "%zu bytes after example %d", 2 * (words - p), N - 1);
        i = N - 1;
    }
    free(w);
    if (why) {
        FILE_ERROR(path, "example %d: %s (%s): a damaged file. " EVAL_HINT, i, why, found);
        evalset_free(s);
        return -1;
    }
    return 0;
}

/* Write an eval set (atomically: gptc/util.h). 0, or -1 after a message. */
MAYBE_UNUSED static int evalset_write(const EvalSet* s, const char* path) {
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = EVAL_MAGIC;
    h[1] = EVAL_VERSION;
    h[2] = s->num_examples;
    size_t words = 0, longest = 0;
    for (int i = 0; i < s->num_examples; i++) {
        size_t b = evalset_example_bytes(s, i);
        if (b > EVAL_MAX_EXAMPLE_BYTES) {
            FILE_ERROR(path, "example %d takes %zu bytes, the format's limit is %d (its size is a uint16)", i, b,
                       EVAL_MAX_EXAMPLE_BYTES);
            return -1;
        }
        longest = b > longest ? b : longest;
        words += b / 2;
    }
    if (s->num_examples < 1 || s->num_examples > EVAL_MAX_EXAMPLES) {
        FILE_ERROR(path, "%d examples: the format holds 1..%d (the index is a uint16)", s->num_examples,
                   EVAL_MAX_EXAMPLES);
        return -1;
    }
    h[3] = (int32_t)longest;
    uint16_t* w = (uint16_t*)xmalloc(2 * words);
    size_t p = 0;
    for (int i = 0; i < s->num_examples; i++) {
        w[p++] = EVAL_DELIMITER;
        w[p++] = (uint16_t)evalset_example_bytes(s, i);
        w[p++] = (uint16_t)i;
        w[p++] = (uint16_t)s->labels[i];
        w[p++] = EVAL_CHOICES;
        for (int k = 0; k < 1 + EVAL_CHOICES; k++) {
            size_t at = s->at[5 * (size_t)i + k];
            int n = s->len[5 * (size_t)i + k];
            w[p++] = (uint16_t)n;
            for (int j = 0; j < n; j++) {
                ALWAYS(s->tokens[at + j] >= 0 && s->tokens[at + j] < EVAL_DELIMITER);
                w[p++] = (uint16_t)s->tokens[at + j];
            }
        }
    }
    ALWAYS(p == words);
    WriteChunk chunks[2] = {{h, sizeof(h)}, {w, 2 * words}};
    int rc = write_file_atomic(path, chunks, 2);
    free(w);
    return rc;
}

/* ---- JSONL -> eval set (prepare_eval) ---- */

/* Append the tokens of `text` (len bytes) to s, as entry k of example i. */
static void evalset_add_text(EvalSet* s, size_t* cap, const Tokenizer* tok, TokenizerWork* work, int i, int k,
                             const char* text, size_t len) {
    /* a BPE token covers at least one byte: len + 1 ids always suffice */
    while (s->num_tokens + len + 1 > *cap) {
        *cap = *cap * 2 + len + 1;
        int* grown = (int*)realloc(s->tokens, sizeof(int) * *cap);
        CHECK(grown != NULL, "out of memory growing the eval tokens to %zu", *cap);
        s->tokens = grown;
    }
    size_t n = tokenizer_encode(tok, work, (const unsigned char*)text, len, s->tokens + s->num_tokens, len + 1);
    s->at[5 * (size_t)i + k] = s->num_tokens;
    s->len[5 * (size_t)i + k] = (int)n;
    s->num_tokens += n;
}

/* One line's "label": a number 0..3 (HellaSwag's own files), or a string "0".."3".
 * -1 if it is neither. */
static int eval_label_of(const char* p, const char* end) {
    json_space(&p, end);
    int quoted = p < end && *p == '"';
    if (quoted) p++;
    if (p >= end || *p < '0' || *p > '3') return -1;
    int label = *p++ - '0';
    if (quoted && (p >= end || *p++ != '"')) return -1;
    json_space(&p, end);
    return p < end && *p != ',' && *p != '}' ? -1 : label;
}

/* Read a JSONL file of examples — "ctx" (a string), "endings" (an array of
 * four strings), "label" (0..3), other fields ignored — and tokenize it:
 * the context as it is, each ending as " " + ending. 0, or -1 after a
 * message naming the line. */
MAYBE_UNUSED static int evalset_from_jsonl(EvalSet* s, const char* path, const Tokenizer* tok) {
    memset(s, 0, sizeof(*s));
    size_t size = 0;
    char* text = file_read_all(path, &size);
    if (!text) return -1;
    size_t lines = 1;
    for (size_t j = 0; j < size; j++) lines += text[j] == '\n';
    s->labels = (int*)xmalloc(sizeof(int) * lines);
    s->at = (size_t*)xmalloc(sizeof(size_t) * 5 * lines);
    s->len = (int*)xmalloc(sizeof(int) * 5 * lines);
    size_t cap = 0;
    TokenizerWork work;
    tokenizer_work_init(&work);
    const char* p = text;
    const char* file_end = text + size;
    int rc = 0;
    for (long lineno = 1; p < file_end && rc == 0; lineno++) {
        const char* line = p;
        const char* end = (const char*)memchr(p, '\n', (size_t)(file_end - p));
        if (!end) end = file_end;
        p = end < file_end ? end + 1 : end;
        const char* q = line;
        json_space(&q, end);
        if (q == end) continue; /* a blank line */
        if (s->num_examples >= EVAL_MAX_EXAMPLES) {
            FILE_ERROR(path, "more than %d examples: the eval format numbers them with a uint16; split the file",
                       EVAL_MAX_EXAMPLES);
            rc = -1;
            break;
        }
        JsonError e = {NULL, NULL};
        const char* ctx_at = NULL;
        const char* endings_at = NULL;
        const char* label_at = NULL;
        if (json_object_value(line, end, "ctx", &ctx_at, &e) < 0 ||
            json_object_value(line, end, "endings", &endings_at, &e) < 0 ||
            json_object_value(line, end, "label", &label_at, &e) < 0) {
            if (e.why) FILE_ERROR(path, "line %ld, column %ld: %s", lineno, (long)(e.at - line) + 1, e.why);
            else FILE_ERROR(path, "line %ld: an example needs \"ctx\", \"endings\" and \"label\" (HellaSwag's fields)",
                            lineno);
            rc = -1;
            break;
        }
        int i = s->num_examples;
        int label = eval_label_of(label_at, end);
        const char* c = ctx_at;
        long n = json_string(&c, end, NULL);
        if (label < 0 || n <= 0) {
            FILE_ERROR(path, "line %ld: %s", lineno, label < 0 ? "\"label\" must be 0, 1, 2 or 3"
                                                                : "\"ctx\" must be a non-empty string");
            rc = -1;
            break;
        }
        char* buf = (char*)xmalloc((size_t)n + 1);
        c = ctx_at;
        json_string(&c, end, buf);
        evalset_add_text(s, &cap, tok, &work, i, 0, buf, (size_t)n);
        free(buf);
        /* "endings": [ "..", "..", "..", ".." ] */
        const char* a = endings_at;
        int k = 0;
        int ok = a < end && *a++ == '[';
        for (; ok && k < EVAL_CHOICES; k++) {
            json_space(&a, end);
            const char* str = a;
            long m = json_string(&a, end, NULL);
            if (m < 0) { ok = 0; break; }
            char* ending = (char*)xmalloc((size_t)m + 2);
            ending[0] = ' '; /* llm.c's preparer: " " + ending */
            json_string(&str, end, ending + 1);
            evalset_add_text(s, &cap, tok, &work, i, 1 + k, ending, (size_t)m + 1);
            free(ending);
            json_space(&a, end);
            if (k < EVAL_CHOICES - 1) ok = a < end && *a++ == ',';
        }
        json_space(&a, end);
        if (!ok || a >= end || *a != ']') {
            FILE_ERROR(path, "line %ld: \"endings\" must be an array of exactly 4 strings", lineno);
            rc = -1;
            break;
        }
        s->labels[i] = label;
        s->num_examples++;
    }
    tokenizer_work_free(&work);
    free(text);
    if (rc == 0 && s->num_examples == 0) {
        FILE_ERROR(path, "no examples (one JSON object a line, with \"ctx\", \"endings\", \"label\")");
        rc = -1;
    }
    if (rc != 0) evalset_free(s);
    return rc;
}

#endif /* GPTC_EVAL_DATA_H */
