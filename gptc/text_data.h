/*
 * gptc/text_data.h — text into llm.c token shards.
 *
 * Included by train_gpt.c (--data) and prepare_data.c. Defines: SHARD_MAGIC,
 * SHARD_VERSION (the shard format train_gpt.c's data loader reads);
 * DocumentList (documents_add, documents_split_text, documents_read,
 * documents_encode, documents_free); shard_write; ShardStats and
 * prepare_shards (read, encode, split, write).
 */
#ifndef GPTC_TEXT_DATA_H
#define GPTC_TEXT_DATA_H

#include "util.h"      /* file_read_all, xmalloc, FILE_ERROR */
#include "tokenizer.h" /* Tokenizer, tokenizer_encode */
#include "json.h"      /* json_object_field: the "text" of a JSONL line */

/* Token shard format (llm.c), read by train_gpt.c's data loader, written below. */
#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1

/* ---- Text to shards ---------------------------------------------------- */
/* Turning raw text into the shards above. Inputs:
 *   - a .jsonl file: one JSON object per line, the document is its "text"
 *     string field (a line without one is an error naming the line);
 *   - a directory: every *.txt file in it (sorted by name), each split as below;
 *   - any other file, as text: documents are separated by two or more
 *     consecutive blank lines (a blank line holds only spaces, tabs or \r);
 *     a single blank line is a paragraph break inside a document. A file
 *     without such a gap is one document.
 * Every document is encoded (in parallel) and preceded by the end-of-text
 * token. The validation split is the first documents of the stream, up to
 * the first document boundary at or after val_fraction of all tokens (5% by
 * default); when that boundary lies beyond twice val_fraction (one long
 * document, say), the split is exactly at val_fraction of the tokens. Shards hold shard_tokens
 * tokens each (the last one the rest), named <prefix>_val_000000.bin and
 * <prefix>_train_000000.bin, _000001, ... */

typedef struct {
    char* text;  /* owned */
    size_t len;
} Document;

typedef struct {
    Document* docs;
    size_t n, cap;
} DocumentList;

static void documents_add(DocumentList* l, const char* text, size_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->docs = (Document*)realloc(l->docs, l->cap * sizeof(Document));
        CHECK(l->docs != NULL, "out of memory for %zu documents", l->cap);
    }
    Document* d = &l->docs[l->n++];
    d->text = (char*)xmalloc(len + 1);
    memcpy(d->text, text, len);
    d->text[len] = '\0';
    d->len = len;
}

static void documents_free(DocumentList* l) {
    for (size_t i = 0; i < l->n; i++) free(l->docs[i].text);
    free(l->docs);
    memset(l, 0, sizeof(*l));
}

static int line_is_blank(const char* s, const char* end) {
    for (; s < end; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r') return 0;
    return 1;
}

/* Split text into documents at runs of >= 2 blank lines (see above). */
static void documents_split_text(DocumentList* l, const char* text, size_t len) {
    const char* end = text + len;
    const char* doc_start = NULL; /* first non-blank line of the current document */
    const char* doc_end = NULL;   /* end of its last non-blank line */
    int blank_run = 0;
    for (const char* line = text; line < end;) {
        const char* nl = (const char*)memchr(line, '\n', (size_t)(end - line));
        const char* line_end = nl ? nl : end;
        if (line_is_blank(line, line_end)) {
            blank_run++;
        } else {
            if (doc_start && blank_run >= 2) {
                documents_add(l, doc_start, (size_t)(doc_end - doc_start));
                doc_start = NULL;
            }
            if (!doc_start) doc_start = line;
            doc_end = line_end;
            blank_run = 0;
        }
        line = nl ? nl + 1 : end;
    }
    if (doc_start) documents_add(l, doc_start, (size_t)(doc_end - doc_start));
}

static int ends_with(const char* s, const char* suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Read the documents of `path` (a .jsonl file, a directory of .txt files,
 * or a text file). Returns 0, or -1 after a message. */
static int documents_read(DocumentList* l, const char* path) {
    memset(l, 0, sizeof(*l));
    struct stat st;
    if (stat(path, &st) != 0) {
        FILE_ERROR(path, "cannot read: %s", strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        char pattern[8300];
        glob_pattern(pattern, sizeof(pattern), path, "/*.txt");
        glob_t g;
        if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
            FILE_ERROR(path, "directory holds no .txt files");
            return -1;
        }
        for (size_t i = 0; i < g.gl_pathc; i++) {
            size_t len;
            char* text = file_read_all(g.gl_pathv[i], &len);
            if (!text) { globfree(&g); documents_free(l); return -1; }
            documents_split_text(l, text, len);
            free(text);
        }
        globfree(&g);
    } else {
        size_t len;
        char* text = file_read_all(path, &len);
        if (!text) return -1;
        if (ends_with(path, ".jsonl")) {
            long line_no = 0;
            for (const char* line = text; line < text + len;) {
                const char* nl = (const char*)memchr(line, '\n', (size_t)(text + len - line));
                const char* line_end = nl ? nl : text + len;
                line_no++;
                if (!line_is_blank(line, line_end)) {
                    char* value = NULL;
                    JsonError e = {NULL, NULL};
                    long n = json_object_field(line, line_end, "text", &value, &e);
                    if (n < 0) {
                        if (n == -1)
                            fprintf(stderr, "error: %s:%ld: column %ld: %s; each line must be one JSON object with a "
                                    "\"text\" string field\n", path, line_no, (long)(e.at - line) + 1, e.why);
                        else
                            fprintf(stderr, "error: %s:%ld: the object has no \"text\" string field (each line needs "
                                    "one)\n", path, line_no);
                        free(text);
                        documents_free(l);
                        return -1;
                    }
                    documents_add(l, value, (size_t)n);
                    free(value);
                }
                line = nl ? nl + 1 : text + len;
            }
        } else {
            documents_split_text(l, text, len);
        }
        free(text);
    }
    if (l->n == 0) {
        FILE_ERROR(path, "holds no text (empty, or only blank lines)");
        documents_free(l);
        return -1;
    }
    return 0;
}

/* Encode every document, each preceded by the end-of-text token, into one
 * token stream (uint16: the vocabulary must fit). Documents are encoded in
 * parallel. Returns the stream (malloc'd) and its length; *doc_starts gets
 * the stream index where each document's EOT sits (ndocs + 1 entries, the
 * last = length). */
static uint16_t* documents_encode(const Tokenizer* tok, const DocumentList* l, size_t* ntokens, size_t** doc_starts) {
    CHECK(tok->vocab_size <= 65536, "a vocabulary of %u does not fit uint16 shards", tok->vocab_size);
    size_t n = l->n;
    const unsigned char** texts = (const unsigned char**)xmalloc(n * sizeof(*texts));
    size_t* lens = (size_t*)xmalloc(n * sizeof(size_t));
    int** outs = (int**)xmalloc(n * sizeof(int*));
    size_t* counts = (size_t*)xmalloc(n * sizeof(size_t));
    for (size_t i = 0; i < n; i++) {
        texts[i] = (const unsigned char*)l->docs[i].text;
        lens[i] = l->docs[i].len;
        outs[i] = (int*)xmalloc((lens[i] ? lens[i] : 1) * sizeof(int)); /* never more ids than bytes */
    }
    tokenizer_encode_many(tok, n, texts, lens, outs, lens, counts);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += 1 + counts[i];
    uint16_t* stream = (uint16_t*)xmalloc(total * sizeof(uint16_t));
    size_t* starts = (size_t*)xmalloc((n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        ALWAYS(counts[i] <= lens[i]);
        starts[i] = k;
        stream[k++] = (uint16_t)tok->eot_token;
        for (size_t j = 0; j < counts[i]; j++) stream[k++] = (uint16_t)outs[i][j];
        free(outs[i]);
    }
    starts[n] = k;
    free(texts); free(lens); free(outs); free(counts);
    *ntokens = total;
    *doc_starts = starts;
    return stream;
}

/* Write tokens[0..n) as one llm.c shard, atomically. */
static int shard_write(const char* path, const uint16_t* tokens, size_t n) {
    CHECK(n <= 0x7FFFFFFF, "shard of %zu tokens: the header holds an int32", n);
    int32_t h[HEADER_INTS];
    memset(h, 0, sizeof(h));
    h[0] = SHARD_MAGIC;
    h[1] = SHARD_VERSION;
    h[2] = (int32_t)n;
    WriteChunk chunks[2];
    chunks[0].data = h;
    chunks[0].bytes = sizeof(h);
    chunks[1].data = tokens;
    chunks[1].bytes = n * sizeof(uint16_t);
    return write_file_atomic(path, chunks, 2);
}

typedef struct {
    size_t val_tokens, train_tokens;
    int val_shards, train_shards;
    size_t documents;
} ShardStats;

/* The whole preparation: read, encode, split, write. 0 or -1. */
static int prepare_shards(const char* input, const char* prefix, const Tokenizer* tok, double val_fraction,
                          size_t shard_tokens, ShardStats* stats) {
    memset(stats, 0, sizeof(*stats));
    if (!tok->can_encode) {
        fprintf(stderr, "error: preparing data needs the tokenizer's merges file\n" TOK_HINT);
        return -1;
    }
    DocumentList docs;
    if (documents_read(&docs, input) != 0) return -1;
    size_t n = 0, *starts = NULL;
    uint16_t* stream = documents_encode(tok, &docs, &n, &starts);
    /* validation split: first boundary at or after val_fraction of the tokens */
    size_t want = (size_t)ceil(val_fraction * (double)n), cut = n;
    for (size_t i = 1; i < docs.n; i++)
        if (starts[i] >= want) { cut = starts[i]; break; }
    if (cut > 2 * want) cut = want; /* no boundary near: cut inside a document */
    if (val_fraction <= 0.0) cut = 0;
    stats->documents = docs.n;
    documents_free(&docs);
    free(starts);
    int rc = 0;
    char path[4400];
    if (cut > 0) {
        snprintf(path, sizeof(path), "%s_val_%06d.bin", prefix, 0);
        rc |= shard_write(path, stream, cut);
        stats->val_shards = 1;
        stats->val_tokens = cut;
    }
    for (size_t at = cut; at < n && rc == 0; at += shard_tokens) {
        size_t m = n - at < shard_tokens ? n - at : shard_tokens;
        snprintf(path, sizeof(path), "%s_train_%06d.bin", prefix, stats->train_shards);
        rc |= shard_write(path, stream + at, m);
        stats->train_shards++;
        stats->train_tokens += m;
    }
    free(stream);
    return rc ? -1 : 0;
}

#endif /* GPTC_TEXT_DATA_H */
