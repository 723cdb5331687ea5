/*
 * fuzz/fuzz_text.c — libFuzzer harness for prepare_data's and --data's text
 * inputs, read by gptc/text_data.h's documents_read (a .txt file split into
 * documents at two or more blank lines; a .jsonl file, one object a line,
 * its "text" field) and encoded by documents_encode with a fixed tokenizer
 * (fuzz/fuzz_vocab.h).
 *
 *   make fuzz/.build/fuzz_text    (or make fuzz, make test-fuzz)
 *
 * The input: one byte, whose low bit chooses .jsonl (1) or .txt (0), then
 * the file. Oracles for a file that reads:
 *   .txt:   the documents are non-empty pieces of the file, in order, not
 *           overlapping, that start and end on a non-blank line, and
 *           together hold every non-blank line of the file;
 *   .jsonl: one document per non-blank line; each written back as
 *           {"text": "..."} by the harness's own JSON escaper and read again
 *           gives the same documents, byte for byte;
 *   both:   the token stream has an end-of-text before each document and
 *           each document's ids decode to its bytes.
 */
#include "fuzz_common.h"
#include "fuzz_vocab.h"

static Tokenizer fuzz_tok;

static int fuzz_blank(const char* s, const char* e) {
    for (; s < e; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r') return 0;
    return 1;
}

static size_t fuzz_nonblank_lines(const char* s, size_t n) {
    size_t count = 0;
    for (const char *line = s, *end = s + n; line < end;) {
        const char* nl = (const char*)memchr(line, '\n', (size_t)(end - line));
        const char* le = nl ? nl : end;
        count += !fuzz_blank(line, le);
        line = nl ? nl + 1 : end;
    }
    return count;
}

/* JSON string escaping, written for this oracle: quote, backslash and
 * control bytes escaped, every other byte as it is. */
static size_t fuzz_json_escape(char* out, const char* s, size_t n) {
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { out[k++] = '\\'; out[k++] = (char)c; }
        else if (c < 0x20) k += (size_t)sprintf(out + k, "\\u%04x", c);
        else out[k++] = (char)c;
    }
    out[k++] = '"';
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("text");
    if (!fuzz_tok.can_encode && fuzz_vocab_tokenizer(&fuzz_tok, fuzz_dir) != 0) abort();
    if (size < 1) return fuzz_refused();
    int jsonl = data[0] & 1;
    const char* text = (const char*)data + 1;
    size_t n = size - 1;
    const char* in = fuzz_write(jsonl ? "input.jsonl" : "input.txt", text, n);
    DocumentList l;
    if (documents_read(&l, in) != 0) return fuzz_refused();
    FUZZ_ORACLE(l.n >= 1, "a file read as no documents");
    if (!jsonl) {
        const char* at = text;
        size_t lines = 0;
        for (size_t i = 0; i < l.n; i++) {
            const Document* d = &l.docs[i];
            FUZZ_ORACLE(d->len > 0, "document %zu is empty", i);
            const char* found = NULL;
            for (const char* p = at; p + d->len <= text + n; p++)
                if (memcmp(p, d->text, d->len) == 0) { found = p; break; }
            FUZZ_ORACLE(found, "document %zu is not a piece of the file after document %zu", i, i - 1);
            FUZZ_ORACLE(found == text || found[-1] == '\n', "document %zu does not start a line", i);
            FUZZ_ORACLE(found + d->len == text + n || found[d->len] == '\n', "document %zu does not end a line", i);
            lines += fuzz_nonblank_lines(d->text, d->len);
            at = found + d->len;
        }
        FUZZ_ORACLE(lines == fuzz_nonblank_lines(text, n), "the documents hold %zu non-blank lines, the file %zu",
                    lines, fuzz_nonblank_lines(text, n));
    } else {
        size_t cap = 16;
        for (size_t i = 0; i < l.n; i++) cap += 12 + 6 * l.docs[i].len + 4;
        char* again = (char*)malloc(cap);
        size_t k = 0;
        for (size_t i = 0; i < l.n; i++) {
            k += (size_t)sprintf(again + k, "{\"text\": ");
            k += fuzz_json_escape(again + k, l.docs[i].text, l.docs[i].len);
            k += (size_t)sprintf(again + k, "}\n");
        }
        DocumentList l2;
        FUZZ_ORACLE(documents_read(&l2, fuzz_write("again.jsonl", again, k)) == 0, "the documents written back are refused");
        FUZZ_ORACLE(l2.n == l.n, "%zu documents read back, %zu written", l2.n, l.n);
        for (size_t i = 0; i < l.n; i++)
            FUZZ_ORACLE(l2.docs[i].len == l.docs[i].len && memcmp(l2.docs[i].text, l.docs[i].text, l.docs[i].len) == 0,
                        "document %zu differs after a round trip", i);
        documents_free(&l2);
        free(again);
    }
    size_t ntok = 0, *starts = NULL;
    uint16_t* stream = documents_encode(&fuzz_tok, &l, &ntok, &starts);
    FUZZ_ORACLE(starts[l.n] == ntok, "the last start is not the stream's end");
    for (size_t i = 0; i < l.n; i++) {
        size_t a = starts[i], b = starts[i + 1];
        FUZZ_ORACLE(a < b && stream[a] == FUZZ_EOT, "document %zu is not preceded by end-of-text", i);
        size_t len = l.docs[i].len;
        int* ids = (int*)malloc(sizeof(int) * (b - a));
        for (size_t j = a + 1; j < b; j++) ids[j - a - 1] = stream[j];
        unsigned char* back = (unsigned char*)malloc(len + 1);
        FUZZ_ORACLE(tokenizer_decode_many(&fuzz_tok, ids, b - a - 1, back, len) == (int64_t)len &&
                    memcmp(back, l.docs[i].text, len) == 0, "document %zu does not decode back to its text", i);
        free(back);
        free(ids);
    }
    free(stream);
    free(starts);
    documents_free(&l);
    return 0;
}
