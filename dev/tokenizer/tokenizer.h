// ----------------------------------------------------------------------------
// Tokenizer: GPT-2's byte-level BPE, encode and decode.
//
// A self-contained block meant to be pasted into train_gpt.c as its tokenizer
// section (and #included by dev/tokenizer/test_tokenizer.c and
// bench_tokenizer.c). Compiles as C11 and as C++17. Needs <stdint.h>,
// <stdio.h>, <stdlib.h>, <string.h>, <omp.h> only when _OPENMP, and the
// generated unicode_tables.h. Every name starts with tokenizer_, Tokenizer,
// tok_ or TOK_ (and unicode_/UNICODE_ in the tables).
//
// Files (written by scripts/tokenizer_files.js, formats documented there):
//   gpt2_tokenizer.bin  llm.c's decode table: magic 20240328, version 2
//   gpt2_merges.bin     our BPE merges:       magic 20261102, version 1
//
// Encoding is token-for-token the reference tokenizer (npm gpt-3-encoder's
// Encoder.js, a port of OpenAI's encoder.py) for every valid UTF-8 string:
//   1. pre-tokenise with GPT-2's regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with JavaScript's \s and node's Unicode tables (unicode_tables.h);
//   2. BPE each pre-token's UTF-8 bytes by merge rank.
// Invalid UTF-8 (no JS string exists for it) is defined as the reference
// would treat a lone surrogate in its place (Python's "surrogateescape"):
// each byte that does not start a valid UTF-8 sequence is one character of
// the [^\s\p{L}\p{N}] class, and keeps its raw byte. So every byte string
// encodes, and decode(encode(x)) == x for all x.
// There are no special tokens: the text "<|endoftext|>" encodes as ordinary
// text; put tok->eot_token between documents yourself.
//
// Thread safety: a loaded Tokenizer is read-only. Encoding needs a
// TokenizerWork (scratch + a cache of recent pre-tokens), one per thread.
// ----------------------------------------------------------------------------

#ifndef TOKENIZER_H
#define TOKENIZER_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "unicode_tables.h"   // pasted into train_gpt.c: "dev/tokenizer/unicode_tables.h"

#define TOKENIZER_MAGIC 20240328       // llm.c's decode file
#define TOKENIZER_VERSION 2
#define TOKENIZER_MERGES_MAGIC 20261102  // our merges file
#define TOKENIZER_MERGES_VERSION 1
#define TOKENIZER_HEADER_INTS 256
#define TOKENIZER_MAX_VOCAB 65536      // ids must fit the uint16 data shards
#define TOKENIZER_MAX_FILE (256u << 20)  // refuse larger files: not a tokenizer

// tokenizer_init's return values (0 = ok); each comes with a message on stderr
enum {
    TOKENIZER_OK = 0,
    TOKENIZER_ERR_OPEN = -1,       // cannot open or read the file
    TOKENIZER_ERR_MAGIC = -2,      // wrong magic number
    TOKENIZER_ERR_VERSION = -3,    // right magic, unsupported version
    TOKENIZER_ERR_TRUNCATED = -4,  // file ends early
    TOKENIZER_ERR_SIZE = -5,       // header sizes impossible or file too long
    TOKENIZER_ERR_RANGE = -6,      // an id out of range
    TOKENIZER_ERR_MISMATCH = -7,   // merges disagree with the decode table
};

#define TOK_HINT "HINT: re-run scripts/fetch_tokenizer.sh and node scripts/tokenizer_files.js\n"

// allocation that cannot fail quietly: print where and exit
#define TOK_CHECK_ALLOC(p) do { if ((p) == NULL) { \
    fprintf(stderr, "tokenizer: out of memory (%s) at %s:%d\n", #p, __FILE__, __LINE__); \
    exit(EXIT_FAILURE); } } while (0)

// merge table slot: (left, right) pair -> rank and merged token
typedef struct {
    uint32_t key;     // (left << 16) | right; TOK_EMPTY_KEY when unused
    int32_t rank;     // lower merges first
    int32_t merged;   // token id of left's bytes followed by right's bytes
} TokenizerPair;
#define TOK_EMPTY_KEY 0xFFFFFFFFu

typedef struct {
    // decode table
    uint32_t vocab_size;        // V (50257)
    uint32_t eot_token;         // <|endoftext|> (50256)
    uint32_t* token_offset;     // (V+1) offsets into token_bytes
    char* token_bytes;          // every token's bytes, each followed by a NUL
    // encode tables (can_encode == 0 when no merges file was given)
    int can_encode;
    uint32_t num_merges;        // 50000
    int32_t byte_token[256];    // the one-byte token of each byte value
    TokenizerPair* pairs;       // open addressing, linear probing
    uint32_t pair_mask;         // number of slots - 1 (a power of two)
} Tokenizer;

// ---- small helpers ----

static inline uint32_t tok_read_u32le(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Reads the whole file; returns its size via *size, or prints and returns NULL.
static inline unsigned char* tok_read_file(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { fprintf(stderr, "tokenizer: cannot open %s\n" TOK_HINT, path); return NULL; }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "tokenizer: cannot find the size of %s\n", path); fclose(f); return NULL;
    }
    if ((unsigned long)n > TOKENIZER_MAX_FILE) {
        fprintf(stderr, "tokenizer: %s is %ld bytes, more than any tokenizer file (%u)\n" TOK_HINT,
                path, n, TOKENIZER_MAX_FILE);
        fclose(f); return NULL;
    }
    unsigned char* buf = (unsigned char*)malloc((size_t)n + 1);
    TOK_CHECK_ALLOC(buf);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        fprintf(stderr, "tokenizer: read %zu of %ld bytes of %s\n", got, n, path); free(buf); return NULL;
    }
    *size = (size_t)n;
    return buf;
}

static inline uint32_t tok_pair_hash(uint32_t key, uint32_t mask) {
    return (key * 0x9E3779B1u) >> 7 & mask;   // Fibonacci hashing, mid bits
}

// Slot holding (left, right), or NULL.
static inline const TokenizerPair* tok_pair_find(const Tokenizer* t, uint32_t left, uint32_t right) {
    uint32_t key = left << 16 | right;
    for (uint32_t i = tok_pair_hash(key, t->pair_mask);; i = (i + 1) & t->pair_mask) {
        const TokenizerPair* p = &t->pairs[i];
        if (p->key == key) return p;
        if (p->key == TOK_EMPTY_KEY) return NULL;
    }
}

// ---- loading ----

static inline void tokenizer_free(Tokenizer* t) {
    free(t->token_offset);
    free(t->token_bytes);
    free(t->pairs);
    memset(t, 0, sizeof(*t));
}

// Checks a 256-int header: file at least 1024 bytes, magic, version.
static inline int tok_check_header(const char* path, const unsigned char* buf, size_t size,
                            uint32_t magic, uint32_t version, const char* what) {
    if (size < 4 * TOKENIZER_HEADER_INTS) {
        fprintf(stderr, "tokenizer: %s is %zu bytes, shorter than the 1024-byte header of a %s file\n" TOK_HINT,
                path, size, what);
        return TOKENIZER_ERR_TRUNCATED;
    }
    uint32_t m = tok_read_u32le(buf), v = tok_read_u32le(buf + 4);
    if (m != magic) {
        fprintf(stderr, "tokenizer: %s has magic %u, a %s file has %u\n" TOK_HINT, path, m, what, magic);
        return TOKENIZER_ERR_MAGIC;
    }
    if (v != version) {
        fprintf(stderr, "tokenizer: %s has version %u, this build reads %s version %u\n" TOK_HINT,
                path, v, what, version);
        return TOKENIZER_ERR_VERSION;
    }
    return TOKENIZER_OK;
}

static inline int tok_load_decode(Tokenizer* t, const char* path, const unsigned char* buf, size_t size) {
    int err = tok_check_header(path, buf, size, TOKENIZER_MAGIC, TOKENIZER_VERSION, "tokenizer (decode)");
    if (err) return err;
    uint32_t n = tok_read_u32le(buf + 8), eot = tok_read_u32le(buf + 12);
    if (n < 256 || n > TOKENIZER_MAX_VOCAB) {
        fprintf(stderr, "tokenizer: %s says %u tokens; need 256..%d (ids are stored as uint16)\n" TOK_HINT,
                path, n, TOKENIZER_MAX_VOCAB);
        return TOKENIZER_ERR_SIZE;
    }
    if (eot >= n) {
        fprintf(stderr, "tokenizer: %s: end-of-text id %u is not below the %u tokens\n" TOK_HINT, path, eot, n);
        return TOKENIZER_ERR_RANGE;
    }
    // one pass to find the total length and check the file ends where it should
    size_t off = 4 * TOKENIZER_HEADER_INTS, total = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (off >= size) {
            fprintf(stderr, "tokenizer: %s is truncated: it ends at token %u of %u\n" TOK_HINT, path, i, n);
            return TOKENIZER_ERR_TRUNCATED;
        }
        size_t len = buf[off];
        if (len == 0) {
            fprintf(stderr, "tokenizer: %s: token %u has length 0\n" TOK_HINT, path, i);
            return TOKENIZER_ERR_SIZE;
        }
        if (off + 1 + len > size) {
            fprintf(stderr, "tokenizer: %s is truncated inside token %u of %u\n" TOK_HINT, path, i, n);
            return TOKENIZER_ERR_TRUNCATED;
        }
        off += 1 + len;
        total += len + 1;
    }
    if (off != size) {
        fprintf(stderr, "tokenizer: %s has %zu bytes after its %u tokens\n" TOK_HINT, path, size - off, n);
        return TOKENIZER_ERR_SIZE;
    }
    t->vocab_size = n;
    t->eot_token = eot;
    t->token_offset = (uint32_t*)malloc(((size_t)n + 1) * sizeof(uint32_t));
    t->token_bytes = (char*)malloc(total);
    TOK_CHECK_ALLOC(t->token_offset);
    TOK_CHECK_ALLOC(t->token_bytes);
    off = 4 * TOKENIZER_HEADER_INTS;
    uint32_t pos = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = buf[off];
        t->token_offset[i] = pos;
        memcpy(t->token_bytes + pos, buf + off + 1, len);
        t->token_bytes[pos + len] = '\0';
        pos += (uint32_t)len + 1;
        off += 1 + len;
    }
    t->token_offset[n] = pos;
    return TOKENIZER_OK;
}

static inline uint32_t tok_token_len(const Tokenizer* t, uint32_t id) {
    return t->token_offset[id + 1] - t->token_offset[id] - 1;
}

// Adds (left, right) -> (rank, merged) after checking it against the vocab.
static inline int tok_add_pair(Tokenizer* t, const char* path, const char* what, uint32_t index,
                        uint32_t left, uint32_t right, uint32_t merged, uint32_t rank) {
    uint32_t n = t->vocab_size;
    if (left >= n || right >= n || merged >= n || rank >= t->num_merges) {
        fprintf(stderr, "tokenizer: %s: %s %u is (%u, %u) -> %u rank %u; ids must be below %u and ranks below %u\n" TOK_HINT,
                path, what, index, left, right, merged, rank, n, t->num_merges);
        return TOKENIZER_ERR_RANGE;
    }
    uint32_t ll = tok_token_len(t, left), lr = tok_token_len(t, right);
    const char* b = t->token_bytes;
    if (tok_token_len(t, merged) != ll + lr ||
        memcmp(b + t->token_offset[merged], b + t->token_offset[left], ll) != 0 ||
        memcmp(b + t->token_offset[merged] + ll, b + t->token_offset[right], lr) != 0) {
        fprintf(stderr, "tokenizer: %s: %s %u joins tokens %u and %u into %u, whose bytes are not theirs: "
                "the merges file does not belong to this decode file\n" TOK_HINT, path, what, index, left, right, merged);
        return TOKENIZER_ERR_MISMATCH;
    }
    uint32_t key = left << 16 | right, i = tok_pair_hash(key, t->pair_mask);
    while (t->pairs[i].key != TOK_EMPTY_KEY) {
        if (t->pairs[i].key == key) {
            fprintf(stderr, "tokenizer: %s: %s %u repeats the pair (%u, %u)\n" TOK_HINT, path, what, index, left, right);
            return TOKENIZER_ERR_MISMATCH;
        }
        i = (i + 1) & t->pair_mask;
    }
    t->pairs[i].key = key;
    t->pairs[i].rank = (int32_t)rank;
    t->pairs[i].merged = (int32_t)merged;
    return TOKENIZER_OK;
}

static inline int tok_load_merges(Tokenizer* t, const char* path, const unsigned char* buf, size_t size) {
    int err = tok_check_header(path, buf, size, TOKENIZER_MERGES_MAGIC, TOKENIZER_MERGES_VERSION, "merges");
    if (err) return err;
    uint32_t n = tok_read_u32le(buf + 8), m = tok_read_u32le(buf + 12);
    uint32_t eot = tok_read_u32le(buf + 16), a = tok_read_u32le(buf + 20);
    if (n != t->vocab_size || eot != t->eot_token) {
        fprintf(stderr, "tokenizer: %s is for %u tokens with end-of-text %u, the decode file has %u and %u\n" TOK_HINT,
                path, n, eot, t->vocab_size, t->eot_token);
        return TOKENIZER_ERR_MISMATCH;
    }
    if (m == 0 || m > n || a > m) {
        fprintf(stderr, "tokenizer: %s says %u merges and %u aliases for %u tokens; impossible\n" TOK_HINT, path, m, a, n);
        return TOKENIZER_ERR_SIZE;
    }
    size_t want = 4 * TOKENIZER_HEADER_INTS + 12 * (size_t)m + 16 * (size_t)a;
    if (size != want) {
        fprintf(stderr, "tokenizer: %s is %zu bytes; %u merges and %u aliases need exactly %zu\n" TOK_HINT,
                path, size, m, a, want);
        return size < want ? TOKENIZER_ERR_TRUNCATED : TOKENIZER_ERR_SIZE;
    }
    // the one-byte tokens start every BPE
    for (int b = 0; b < 256; b++) t->byte_token[b] = -1;
    for (uint32_t id = 0; id < n; id++) {
        if (tok_token_len(t, id) != 1) continue;
        unsigned char b = (unsigned char)t->token_bytes[t->token_offset[id]];
        if (t->byte_token[b] >= 0) {
            fprintf(stderr, "tokenizer: tokens %d and %u are both the byte 0x%02x\n" TOK_HINT, t->byte_token[b], id, b);
            return TOKENIZER_ERR_MISMATCH;
        }
        t->byte_token[b] = (int32_t)id;
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_token[b] < 0) {
            fprintf(stderr, "tokenizer: no token is the single byte 0x%02x; cannot encode every byte string\n" TOK_HINT, b);
            return TOKENIZER_ERR_MISMATCH;
        }
    }
    t->num_merges = m;
    uint32_t slots = 1;
    while (slots < 2 * (m + a)) slots *= 2;   // load factor <= 1/2
    t->pairs = (TokenizerPair*)malloc(slots * sizeof(TokenizerPair));
    TOK_CHECK_ALLOC(t->pairs);
    for (uint32_t i = 0; i < slots; i++) t->pairs[i].key = TOK_EMPTY_KEY;
    t->pair_mask = slots - 1;
    const unsigned char* p = buf + 4 * TOKENIZER_HEADER_INTS;
    for (uint32_t r = 0; r < m; r++, p += 12) {
        err = tok_add_pair(t, path, "merge", r, tok_read_u32le(p), tok_read_u32le(p + 4), tok_read_u32le(p + 8), r);
        if (err) return err;
    }
    for (uint32_t i = 0; i < a; i++, p += 16) {
        err = tok_add_pair(t, path, "alias", i, tok_read_u32le(p), tok_read_u32le(p + 4), tok_read_u32le(p + 8),
                           tok_read_u32le(p + 12));
        if (err) return err;
    }
    t->can_encode = 1;
    return TOKENIZER_OK;
}

// Loads the decode table and, when merges_path is not NULL, the merges.
// Returns TOKENIZER_OK or a negative TOKENIZER_ERR_* after printing why;
// on error *t is left empty (tokenizer_free is harmless).
static inline int tokenizer_init(Tokenizer* t, const char* decode_path, const char* merges_path) {
    memset(t, 0, sizeof(*t));
    size_t size = 0;
    unsigned char* buf = tok_read_file(decode_path, &size);
    if (buf == NULL) return TOKENIZER_ERR_OPEN;
    int err = tok_load_decode(t, decode_path, buf, size);
    free(buf);
    if (err == TOKENIZER_OK && merges_path != NULL) {
        buf = tok_read_file(merges_path, &size);
        if (buf == NULL) err = TOKENIZER_ERR_OPEN;
        else { err = tok_load_merges(t, merges_path, buf, size); free(buf); }
    }
    if (err != TOKENIZER_OK) tokenizer_free(t);
    return err;
}

// ---- decode ----

// The bytes of token id (NUL-terminated for convenience, but a token may be
// the byte 0 itself, so use *len); NULL and *len = 0 for an unknown id.
static inline const char* tokenizer_decode(const Tokenizer* t, uint32_t id, size_t* len) {
    if (id >= t->vocab_size) { if (len) *len = 0; return NULL; }
    if (len) *len = tok_token_len(t, id);
    return t->token_bytes + t->token_offset[id];
}

// Concatenated bytes of ids[0..n) into out (at most cap bytes written).
// Returns the total length (which may exceed cap: then out holds a prefix),
// or -1 if an id is out of range.
static inline int64_t tokenizer_decode_many(const Tokenizer* t, const int* ids, size_t n, unsigned char* out, size_t cap) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->vocab_size) return -1;
        uint32_t len = tok_token_len(t, (uint32_t)ids[i]);
        if (total + len <= cap) memcpy(out + total, t->token_bytes + t->token_offset[ids[i]], len);
        else if (total < cap) memcpy(out + total, t->token_bytes + t->token_offset[ids[i]], cap - total);
        total += len;
    }
    return (int64_t)total;
}

// ---- encode: pre-tokenisation ----

// One character: its length in bytes and its class (UNICODE_L/N/SPACE/OTHER).
// A byte that does not start a valid UTF-8 sequence (RFC 3629: shortest
// form, no surrogates, at most U+10FFFF) is one OTHER character.
typedef struct { uint32_t len; uint32_t cls; } TokenizerChar;

static inline uint32_t tok_class_of(uint32_t cp) {
    // binary search for the last run starting at or before cp
    uint32_t lo = 0, hi = UNICODE_NUM_RUNS;   // unicode_runs[0] starts at U+0080
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if ((unicode_runs[mid] >> 2) <= cp) lo = mid; else hi = mid;
    }
    return unicode_runs[lo] & 3;
}

static inline TokenizerChar tok_next_char(const unsigned char* s, size_t n) {
    TokenizerChar c = { 1, UNICODE_OTHER };
    unsigned char b = s[0];
    if (b < 0x80) { c.cls = unicode_ascii_class[b]; return c; }
    uint32_t cp, len;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; cp = b & 0x1Fu; }
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; cp = b & 0x0Fu; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; cp = b & 0x07u; }
    else return c;                                   // stray continuation, C0, C1, F5..FF
    if (n < len) return c;
    for (uint32_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return c;
        cp = cp << 6 | (s[k] & 0x3Fu);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||   // overlong, surrogate
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return c;          // overlong, too big
    c.len = len;
    c.cls = tok_class_of(cp);
    return c;
}

// Length in bytes of the pre-token starting at s[0] (n > 0 bytes left):
// GPT-2's regex alternatives tried in order, as the JS regex engine would.
static inline size_t tok_pretoken(const unsigned char* s, size_t n) {
    // 's|'t|'re|'ve|'m|'ll|'d   (lowercase only, like the reference)
    if (s[0] == '\'' && n >= 2) {
        unsigned char a = s[1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (n >= 3 && ((a == 'r' && s[2] == 'e') || (a == 'v' && s[2] == 'e') || (a == 'l' && s[2] == 'l'))) return 3;
    }
    // ' ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+': an optional ' ' then a run of one class
    size_t i = 0;
    TokenizerChar c = tok_next_char(s, n);
    if (s[0] == ' ' && n > 1) {
        TokenizerChar d = tok_next_char(s + 1, n - 1);
        if (d.cls != UNICODE_SPACE) { i = 1; c = d; }
    }
    if (c.cls != UNICODE_SPACE) {
        uint32_t cls = c.cls;
        i += c.len;
        while (i < n) {
            TokenizerChar d = tok_next_char(s + i, n - i);
            if (d.cls != cls) break;
            i += d.len;
        }
        return i;
    }
    // \s+(?!\S) | \s+ : the whole white-space run if it ends the text, else all
    // of it but its last character (which then leads the next pre-token),
    // or just the one character if the run is a single one.
    size_t last = 0;
    while (i < n) {
        TokenizerChar d = tok_next_char(s + i, n - i);
        if (d.cls != UNICODE_SPACE) break;
        last = i;
        i += d.len;
    }
    if (i == n || last == 0) return i;
    return last;
}

// ---- encode: byte-level BPE ----

// A cache of recent short pre-tokens -> ids, direct-mapped (a new entry
// evicts the old one in its slot). Prose repeats its words, so most
// pre-tokens are found here and never reach the BPE loop.
#define TOK_CACHE_SLOTS 8192
#define TOK_CACHE_WORD 22    // longest cached pre-token, in bytes
typedef struct {
    uint8_t len;                       // 0 = empty
    uint8_t num_ids;
    unsigned char bytes[TOK_CACHE_WORD];
    uint16_t ids[TOK_CACHE_WORD];
} TokenizerCacheEntry;

// heap entry: a candidate merge of symbol pos with the symbol after it
typedef struct { int32_t rank; int32_t pos; int32_t left; int32_t right; } TokenizerCand;

// Per-thread scratch for encoding.
typedef struct {
    TokenizerCacheEntry* cache;        // TOK_CACHE_SLOTS entries
    int32_t* sym;                      // symbol ids, indexed by the byte where the symbol starts
    int32_t* next;                     // next symbol's start, or -1
    int32_t* prev;                     // previous symbol's start, or -1
    TokenizerCand* heap;               // candidate merges, min-heap by (rank, pos)
    TokenizerCand* round;              // the candidates of the current rank
    size_t cap;                        // bytes the arrays above can hold
} TokenizerWork;

static inline void tokenizer_work_init(TokenizerWork* w) {
    memset(w, 0, sizeof(*w));
    w->cache = (TokenizerCacheEntry*)calloc(TOK_CACHE_SLOTS, sizeof(TokenizerCacheEntry));
    TOK_CHECK_ALLOC(w->cache);
}

static inline void tokenizer_work_free(TokenizerWork* w) {
    free(w->cache); free(w->sym); free(w->next); free(w->prev); free(w->heap); free(w->round);
    memset(w, 0, sizeof(*w));
}

static inline void tok_work_reserve(TokenizerWork* w, size_t n) {
    if (n <= w->cap) return;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < n) cap *= 2;
    free(w->sym); free(w->next); free(w->prev); free(w->heap); free(w->round);
    w->sym = (int32_t*)malloc(cap * sizeof(int32_t));
    w->next = (int32_t*)malloc(cap * sizeof(int32_t));
    w->prev = (int32_t*)malloc(cap * sizeof(int32_t));
    // at most n-1 initial candidates + 2 per merge (n-1 merges)
    w->heap = (TokenizerCand*)malloc(3 * cap * sizeof(TokenizerCand));
    w->round = (TokenizerCand*)malloc(cap * sizeof(TokenizerCand));
    TOK_CHECK_ALLOC(w->sym); TOK_CHECK_ALLOC(w->next); TOK_CHECK_ALLOC(w->prev);
    TOK_CHECK_ALLOC(w->heap); TOK_CHECK_ALLOC(w->round);
    w->cap = cap;
}

static inline int tok_cand_less(const TokenizerCand* a, const TokenizerCand* b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static inline void tok_heap_push(TokenizerCand* h, size_t* n, TokenizerCand c) {
    size_t i = (*n)++;
    while (i > 0 && tok_cand_less(&c, &h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = c;
}

static inline TokenizerCand tok_heap_pop(TokenizerCand* h, size_t* n) {
    TokenizerCand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && tok_cand_less(&h[c + 1], &h[c])) c++;
        if (!tok_cand_less(&h[c], &last)) break;
        h[i] = h[c]; i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

// Pushes the merge of symbol pos with its successor, if that pair has a rank.
static inline void tok_push_pair(const Tokenizer* t, TokenizerWork* w, size_t* nheap, int32_t pos) {
    if (pos < 0 || w->next[pos] < 0) return;
    int32_t nx = w->next[pos];
    const TokenizerPair* p = tok_pair_find(t, (uint32_t)w->sym[pos], (uint32_t)w->sym[nx]);
    if (p == NULL) return;
    TokenizerCand c = { p->rank, pos, w->sym[pos], w->sym[nx] };
    tok_heap_push(w->heap, nheap, c);
}

// Is candidate c still the pair at its position?
static inline int tok_cand_valid(const TokenizerWork* w, const TokenizerCand* c) {
    int32_t nx = w->next[c->pos];
    return w->sym[c->pos] == c->left && nx >= 0 && w->sym[nx] == c->right;
}

// BPE of one pre-token s[0..n), appending ids to out; returns how many.
//
// The reference repeats rounds until no adjacent pair has a rank: find the
// lowest rank among the adjacent pairs; if several different pairs share it
// (only the alias pairs, see scripts/tokenizer_files.js) take the rightmost;
// replace every occurrence of that pair, left to right, without overlaps.
// Done here with a heap of candidate pairs keyed by (rank, position), so a
// long pre-token (a page of CJK, a run of '=') costs O(n log n), not O(n^2).
// Where the time goes: the heap, and one hash probe per new adjacent pair.
static inline size_t tok_bpe(const Tokenizer* t, TokenizerWork* w, const unsigned char* s, size_t n, int* out) {
    tok_work_reserve(w, n);
    for (size_t i = 0; i < n; i++) {
        w->sym[i] = t->byte_token[s[i]];
        w->next[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        w->prev[i] = (int32_t)i - 1;
    }
    size_t nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) tok_push_pair(t, w, &nheap, (int32_t)i);
    while (nheap > 0) {
        // gather the still-valid candidates of the lowest rank, in position order
        int32_t rank = w->heap[0].rank;
        size_t nround = 0;
        while (nheap > 0 && w->heap[0].rank == rank) {
            TokenizerCand c = tok_heap_pop(w->heap, &nheap);
            if (tok_cand_valid(w, &c)) w->round[nround++] = c;
        }
        if (nround == 0) continue;
        // the pair to merge this round: the rightmost one (they are the same
        // pair unless an alias shares the rank; the others wait a round)
        int32_t left = w->round[nround - 1].left, right = w->round[nround - 1].right;
        const TokenizerPair* p = tok_pair_find(t, (uint32_t)left, (uint32_t)right);
        for (size_t k = 0; k < nround; k++) {
            TokenizerCand c = w->round[k];
            if (c.left != left || c.right != right) { tok_heap_push(w->heap, &nheap, c); continue; }
            if (!tok_cand_valid(w, &c)) continue;      // overlapped by the previous merge ("aaa")
            int32_t nx = w->next[c.pos];
            w->sym[c.pos] = p->merged;
            w->sym[nx] = -1;                           // absorbed
            w->next[c.pos] = w->next[nx];
            if (w->next[nx] >= 0) w->prev[w->next[nx]] = c.pos;
            // new neighbours; their ranks differ from this one (the merged
            // token is longer than either half), so they wait for later rounds
            tok_push_pair(t, w, &nheap, w->prev[c.pos]);
            tok_push_pair(t, w, &nheap, c.pos);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = w->next[i]) out[k++] = w->sym[i];
    return k;
}

static inline uint32_t tok_hash_bytes(const unsigned char* s, size_t n) {
    uint32_t h = 2166136261u;                          // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

// Encodes one pre-token, through the cache when it is short.
static inline size_t tok_encode_pretoken(const Tokenizer* t, TokenizerWork* w, const unsigned char* s, size_t n, int* out) {
    if (n == 1) { out[0] = t->byte_token[s[0]]; return 1; }
    if (n > TOK_CACHE_WORD) return tok_bpe(t, w, s, n, out);
    TokenizerCacheEntry* e = &w->cache[tok_hash_bytes(s, n) & (TOK_CACHE_SLOTS - 1)];
    if (e->len == n && memcmp(e->bytes, s, n) == 0) {
        for (size_t i = 0; i < e->num_ids; i++) out[i] = e->ids[i];
        return e->num_ids;
    }
    size_t k = tok_bpe(t, w, s, n, out);
    e->len = (uint8_t)n;
    e->num_ids = (uint8_t)k;
    memcpy(e->bytes, s, n);
    for (size_t i = 0; i < k; i++) e->ids[i] = (uint16_t)out[i];
    return k;
}

// Encodes text[0..len) (any bytes) into out, writing at most cap ids.
// Returns the number of ids the text encodes to; when that exceeds cap only
// the first cap were written (call again with more room). A text never needs
// more ids than it has bytes, so cap = len always suffices.
// w: this thread's TokenizerWork, or NULL to use a temporary one (slower).
static inline size_t tokenizer_encode(const Tokenizer* t, TokenizerWork* w, const unsigned char* text, size_t len,
                               int* out, size_t cap) {
    if (!t->can_encode) {
        fprintf(stderr, "tokenizer: encode needs the merges file; pass it to tokenizer_init\n" TOK_HINT);
        exit(EXIT_FAILURE);
    }
    TokenizerWork tmp;
    if (w == NULL) { tokenizer_work_init(&tmp); w = &tmp; }
    int small[TOK_CACHE_WORD];   // ids of a short pre-token, when out is nearly full
    size_t count = 0;
    for (size_t i = 0; i < len;) {
        size_t n = tok_pretoken(text + i, len - i);
        if (count + n <= cap) {
            count += tok_encode_pretoken(t, w, text + i, n, out + count);
        } else {
            // out may be too small: go through a buffer sized for the pre-token
            int* ids = n <= TOK_CACHE_WORD ? small : (int*)malloc(n * sizeof(int));
            TOK_CHECK_ALLOC(ids);
            size_t k = tok_encode_pretoken(t, w, text + i, n, ids);
            for (size_t j = 0; j < k; j++) if (count + j < cap) out[count + j] = ids[j];
            count += k;
            if (ids != small) free(ids);
        }
        i += n;
    }
    if (w == &tmp) tokenizer_work_free(&tmp);
    return count;
}

// Encodes ndocs documents in parallel (OpenMP over documents, one
// TokenizerWork per thread): document d is texts[d][0..lens[d]) and goes to
// outs[d] (room for caps[d] ids); counts[d] gets its tokenizer_encode result.
// No end-of-text tokens are added.
static inline void tokenizer_encode_many(const Tokenizer* t, size_t ndocs, const unsigned char* const* texts,
                                  const size_t* lens, int* const* outs, const size_t* caps, size_t* counts) {
#ifdef _OPENMP
    #pragma omp parallel
#endif
    {
        TokenizerWork w;
        tokenizer_work_init(&w);
#ifdef _OPENMP
        #pragma omp for schedule(dynamic, 16)
#endif
        for (long long d = 0; d < (long long)ndocs; d++) {
            counts[d] = tokenizer_encode(t, &w, texts[d], lens[d], outs[d], caps[d]);
        }
        tokenizer_work_free(&w);
    }
}

#endif // TOKENIZER_H
