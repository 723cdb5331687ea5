/*
 * fuzz/fuzz_common.h — what every libFuzzer harness in fuzz/ shares: the
 * trainer's code (train_gpt.c without its main), a private temporary folder
 * for parsers that take a path, the oracle check, and the strict switch.
 *
 * Included first by each fuzz/fuzz_<parser>.c. Defines: fuzz_dir,
 * fuzz_init, fuzz_path, fuzz_write, fuzz_write2, FUZZ_ORACLE, FUZZ_STRICT,
 * fuzz_log.
 *
 * A harness is built with clang -fsanitize=fuzzer,address,undefined
 * -fno-sanitize-recover=undefined (fuzz/fuzz.mk). The parsers report bad
 * input by returning an error after a message; they never exit on it. So
 * the harness calls them directly, in process: an exit() during a run is a
 * finding that libFuzzer itself reports ("fuzz target exited") and saves,
 * as it saves a sanitizer report, a timeout and an oracle's abort().
 */
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H
#define GPTC_NO_MAIN
#include "../train_gpt.c"
#include <sys/types.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>

/* FUZZ_STRICT=1 (make fuzz FUZZ_STRICT=1): also the oracles a harness
 * keeps under `if (FUZZ_STRICT)` for what a parser must refuse and does not
 * yet, while fuzz/pending/ holds an input for it (none at present: every
 * oracle is on by default); 0: only what the current parsers promise. */
#ifndef FUZZ_STRICT
#define FUZZ_STRICT 0
#endif

/* The harness's own messages. The parsers' messages go to stderr, which
 * make fuzz closes (-close_fd_mask=2) for speed; this is a copy of it taken
 * before, so an oracle's report is always seen. */
static FILE* fuzz_log;

/* An oracle: a property every input that parses must have. On failure:
 * the property, where, and abort(), which libFuzzer records as a crash
 * with the input that broke it. */
#define FUZZ_ORACLE(cond, ...)                                                   \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(fuzz_log ? fuzz_log : stderr, "fuzz oracle failed: %s:%d: %s\n  ", \
                    __FILE__, __LINE__, #cond);                                  \
            fprintf(fuzz_log ? fuzz_log : stderr, __VA_ARGS__);                  \
            fprintf(fuzz_log ? fuzz_log : stderr, "\n");                         \
            fflush(fuzz_log ? fuzz_log : stderr);                                \
            abort();                                                             \
        }                                                                        \
    } while (0)

/* This process's temporary folder, <base>/gptc-fuzz-<harness>-<pid>, made on
 * the first call, removed at exit with what is in it. <base>: $FUZZ_TMPDIR,
 * else /dev/shm where it can be written (memory: the writers the oracles call
 * fsync, which costs milliseconds on a disk and nothing there), else /tmp. */
static char fuzz_dir[256];

static void fuzz_dir_remove(void) {
    if (!fuzz_dir[0]) return;
    DIR* d = opendir(fuzz_dir);
    if (d) {
        struct dirent* e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[600];
            snprintf(p, sizeof(p), "%s/%s", fuzz_dir, e->d_name);
            if (unlink(p) != 0) { /* a folder a harness made (a checkpoint): one level */
                DIR* s = opendir(p);
                struct dirent* f;
                while (s && (f = readdir(s)) != NULL) {
                    char q[900];
                    snprintf(q, sizeof(q), "%s/%s", p, f->d_name);
                    if (strcmp(f->d_name, ".") && strcmp(f->d_name, "..")) unlink(q);
                }
                if (s) closedir(s);
                rmdir(p);
            }
        }
        closedir(d);
    }
    rmdir(fuzz_dir);
}

/* FUZZ_EXPECT_ACCEPT=1 in the environment: every input must parse (the
 * seeds are valid files: make test-fuzz checks that each is accepted, so
 * the oracles run on them). */
static int fuzz_expect_accept;

/* libFuzzer calls this before it closes stderr (-close_fd_mask=2). */
int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc; (void)argv;
    int fd = dup(2);
    fuzz_log = fd >= 0 ? fdopen(fd, "w") : stderr;
    setvbuf(fuzz_log, NULL, _IONBF, 0);
    const char* e = getenv("FUZZ_EXPECT_ACCEPT");
    fuzz_expect_accept = e && atoi(e) == 1;
    return 0;
}

/* What a harness returns when the parser refused its input. */
static int fuzz_refused(void) {
    FUZZ_ORACLE(!fuzz_expect_accept, "FUZZ_EXPECT_ACCEPT=1: the parser refused this input (a seed that is no longer valid?)");
    return 0;
}

static void fuzz_init(const char* harness) {
    if (fuzz_dir[0]) return;
    const char* base = getenv("FUZZ_TMPDIR");
    if (!base || !base[0]) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir, sizeof(fuzz_dir), "%s/gptc-fuzz-%s-%d", base, harness, (int)getpid());
    if (mkdir(fuzz_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(fuzz_log, "fuzz: cannot create %s: %s\n", fuzz_dir, strerror(errno));
        abort();
    }
    atexit(fuzz_dir_remove);
}

/* The path of `name` in the folder. */
static const char* fuzz_path(const char* name) {
    static char buf[8][600];
    static int next;
    char* p = buf[next++ & 7];
    snprintf(p, sizeof(buf[0]), "%s/%s", fuzz_dir, name);
    return p;
}

/* Write data[0..n) to `name` in the folder (replacing it); its path. */
static const char* fuzz_write(const char* name, const void* data, size_t n) {
    const char* path = fuzz_path(name);
    FILE* f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(fuzz_log, "fuzz: cannot write %s: %s\n", path, strerror(errno));
        abort();
    }
    return path;
}

/* Read all of `path` (which the harness wrote): its bytes, or NULL. */
static unsigned char* fuzz_read(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* b = (unsigned char*)malloc((size_t)len + 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) { free(b); fclose(f); return NULL; }
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Two files in one input: a little-endian uint16 k, then k bytes of the
 * first (fewer when the input is shorter), then the second. */
static void fuzz_split2(const uint8_t* data, size_t size, const uint8_t** a, size_t* na, const uint8_t** b,
                        size_t* nb) {
    size_t k = size >= 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
    size_t rest = size >= 2 ? size - 2 : 0;
    if (k > rest) k = rest;
    *a = data + (size >= 2 ? 2 : size);
    *na = k;
    *b = *a + k;
    *nb = rest - k;
}

/* Bit-for-bit equality of float arrays (NaN payloads included). */
static int fuzz_same_floats(const float* x, const float* y, size_t n) {
    return n == 0 || memcmp(x, y, n * sizeof(float)) == 0;
}

static int fuzz_same_config(const GPT2Config* a, const GPT2Config* b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels &&
           a->padded_vocab_size == b->padded_vocab_size;
}

/* The oracle of the model harnesses: the file written back at `path` is read
 * again by `read` (model_file_read or hf_checkpoint_read) and gives the same
 * config and bit for bit the same n weights. `what` names the round trip. */
static void fuzz_reads_back(int (*read)(const char*, GPT2Config*, float**), const char* path, const GPT2Config* c,
                            const float* params, size_t n, const char* what) {
    GPT2Config c2;
    float* again = NULL;
    FUZZ_ORACLE(read(path, &c2, &again) == 0, "%s: the file written back is refused", what);
    FUZZ_ORACLE(fuzz_same_config(c, &c2) && fuzz_same_floats(params, again, n), "%s: the config or the weights differ",
                what);
    free(again);
}


/* A training state record (gptc/state.h) as the state and slot harnesses
 * take it: one flag byte, then the record. Flag bit 1: the harness sets
 * the three array checksums (header words 30..32) to the arrays' CRC32C;
 * bit 0: the header checksum (word 255) to that of words 0..254. Without
 * them nearly every mutant would stop at a checksum; with them the
 * mutations reach the header's fields. *rec: a malloc'd copy, *n bytes. */
static unsigned char* fuzz_state_record(const uint8_t* data, size_t size, size_t* n) {
    if (size < 1) return NULL;
    *n = size - 1;
    unsigned char* rec = (unsigned char*)malloc(*n + 1);
    memcpy(rec, data + 1, *n);
    if (*n >= STATE_HEADER_BYTES) {
        int32_t h[HEADER_INTS];
        memcpy(h, rec, sizeof(h));
        int64_t lo = get_i64(h, 24), hi = get_i64(h, 26);
        size_t floats = (*n - STATE_HEADER_BYTES) / 4;
        if ((data[0] & 2) && lo >= 0 && hi >= lo && (uint64_t)(hi - lo) * 3 <= floats) {
            size_t k = (size_t)(hi - lo);
            for (int a = 0; a < 3; a++) h[30 + a] = (int32_t)crc32c(0, rec + STATE_HEADER_BYTES + 4 * k * (size_t)a, 4 * k);
        }
        if (data[0] & 1) h[255] = (int32_t)crc32c(0, h, 255 * sizeof(int32_t));
        memcpy(rec, h, sizeof(h));
    }
    return rec;
}

/* Header words 0..254 (all but the checksum that covers them) equal in a
 * and b: state_header_make writes the unused ones 0, and a header whose
 * unused words are not 0 is refused, so a header read is rebuilt exactly. */
static int fuzz_same_state_words(const int32_t* a, const int32_t* b) {
    for (int i = 0; i < 255; i++) /* (the unused words included: a header read has them 0) */
        if (a[i] != b[i]) return 0;
    return 1;
}

#endif /* FUZZ_COMMON_H */
