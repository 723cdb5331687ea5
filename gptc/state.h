/*
 * gptc/state.h — one rank's training state, as a record: its format, its
 * checksums, its files on disk and its snapshot slots in memory; the
 * loss-spike detector whose window the state carries; run.id.
 *
 * Included by train_gpt.c after its model (a state records the GPT2Config),
 * before its training loop; gptc/saver.h and gptc/resume.h build on it. Defines: STATE_MAGIC,
 * STATE_VERSION, STATE_HEADER_BYTES, LOSS_WINDOW; crc32c, copy3_crc32c;
 * put_i64, get_i64; LossWatch (losswatch_spike, losswatch_accept); StateInfo,
 * state_bytes, state_path, state_header_make, state_header_parse,
 * state_read_header, state_read_arrays, state_load_record; Slot (slot_map,
 * slot_prepare, slot_unmap, slot_fill); state_differs; run_id_format, run_id_read;
 * run_tag; partial_saves_remove. (The run's locks: gptc/run_lock.h.)
 */
#ifndef GPTC_STATE_H
#define GPTC_STATE_H

#include "util.h"
#include "ledger.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/statvfs.h> /* fstatvfs: slot_shortfall */

/* A model file holds the weights only; resuming a run bit for bit needs the
 * rest too: the AdamW moments (this rank's shard under ZeRO), the step, the
 * data loader's position, the sampler's random state and the loss-spike
 * detector's window. One rank's training state is one record, laid out the
 * same everywhere it lives:
 *   - in memory, in a snapshot slot: a file in /dev/shm (--shm-dir), mapped,
 *     so it outlives a crashed process on that host; two slots, so a crash
 *     while one is being filled leaves the other intact;
 *   - in the neighbour's memory: rank (r+1) mod W keeps a byte copy of rank
 *     r's newest snapshot in its own /dev/shm (a replica, sent over MPI);
 *   - on disk: <dir>/state_<step>_rank<r>.bin, and once every rank's file is
 *     there rank 0 writes <dir>/state_<step>.complete: a step counts as saved
 *     on disk only with that marker.
 * Only one trainer writes them at a time (run_lock, at the end of this file):
 * rank 0 holds <dir>/.lock, and each rank its slots' lock in --shm-dir.
 * Format (all little-endian, fixed width, no raw structs):
 *   256 int32 header: [0] magic 20261103, [1] version 2, [2] step, [3] rank,
 *     [4] world, [5] zero, [6] B, [7] T, [8] total batch, [9] seed,
 *     [10] shuffle, [11] L, [12] C, [13] NH, [14] maxT, [15] V, [16] Vp,
 *     [17] data epoch, [18] data shard position, [20..21] data cursor,
 *     [22..23] P, [24..25] lo, [26..27] hi (the slice held: [lo, hi)),
 *     [28..29] sampler RNG state, [30] CRC32C of the weights, [31] of m,
 *     [32] of v, [33..34] the run's nonce (<dir>/run.id), [35..37] the loss
 *     window's count, next slot and current run of bad steps, [38] --steps, [40..103] its
 *     losses (float bits), [255] CRC32C of header words 0..254 (int64s as
 *     two int32, low first);
 *   then hi - lo floats of the weights, of m, of v: rank r's slice, the
 *   r-th of W equal ones (its shard under ZeRO; under plain data parallel,
 *   where every rank holds the same, each still saves only 1/W of it). A
 *   state is all the ranks' files together; loading gathers the slices.
 * Files are written to a temporary name, fsync'd and renamed (and the folder
 * fsync'd): a crash or a full disk leaves the previous state as it was. */

#define STATE_MAGIC 20261103
#define STATE_VERSION 2
#define STATE_HEADER_BYTES 1024
#define LOSS_WINDOW 64

/* CRC-32C (Castagnoli), reflected polynomial 0x82F63B78: with the SSE4.2
 * instruction where the build has it (about 20 GB/s, so checking a GPT-2
 * 124M state costs ~0.1 s), else bytewise from a table. */
#if defined(__SSE4_2__) && defined(__x86_64__)
#include <nmmintrin.h>
static uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    for (; n > 0; n--, p++) c32 = _mm_crc32_u8(c32, *p);
    return ~c32;
}
#else
static uint32_t crc32c_table[256];
static void crc32c_table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[i] = c;
    }
}
static uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc32c_table_init); /* the snapshot threads call this too */
    const unsigned char* p = (const unsigned char*)data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc32c_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
#endif

/* Copy three arrays of n floats, src[k] to dst[k], and take each one's
 * CRC32C on the way: one pass over the memory instead of a copy and then a
 * read, the three CRC chains interleaved so the instruction's latency is
 * hidden, and the stores non-temporal (a snapshot is not read again soon:
 * no need to pull it through the cache). */
static void copy3_crc32c(float* const dst[3], const float* const src[3], size_t n, uint32_t crc[3]) {
#if defined(__SSE4_2__) && defined(__x86_64__)
    const unsigned char* in[3] = {(const unsigned char*)src[0], (const unsigned char*)src[1], (const unsigned char*)src[2]};
    unsigned char* out[3] = {(unsigned char*)dst[0], (unsigned char*)dst[1], (unsigned char*)dst[2]};
    uint64_t c0 = 0xFFFFFFFFu, c1 = 0xFFFFFFFFu, c2 = 0xFFFFFFFFu;
    size_t bytes = n * sizeof(float), words = bytes / 8, i = 0;
    int aligned = ((uintptr_t)out[0] | (uintptr_t)out[1] | (uintptr_t)out[2]) % 8 == 0;
    for (; aligned && i < words; i++) {
        long long w0, w1, w2;
        memcpy(&w0, in[0] + 8 * i, 8);
        memcpy(&w1, in[1] + 8 * i, 8);
        memcpy(&w2, in[2] + 8 * i, 8);
        c0 = _mm_crc32_u64(c0, (uint64_t)w0);
        c1 = _mm_crc32_u64(c1, (uint64_t)w1);
        c2 = _mm_crc32_u64(c2, (uint64_t)w2);
        _mm_stream_si64((long long*)(out[0] + 8 * i), w0);
        _mm_stream_si64((long long*)(out[1] + 8 * i), w1);
        _mm_stream_si64((long long*)(out[2] + 8 * i), w2);
    }
    _mm_sfence(); /* the streamed stores are visible before whatever follows */
    uint32_t cs[3] = {(uint32_t)c0, (uint32_t)c1, (uint32_t)c2};
    for (int k = 0; k < 3; k++) {
        memcpy(out[k] + 8 * i, in[k] + 8 * i, bytes - 8 * i);
        for (size_t j = 8 * i; j < bytes; j++) cs[k] = _mm_crc32_u8(cs[k], in[k][j]);
        crc[k] = ~cs[k];
    }
#else
    for (int k = 0; k < 3; k++) {
        memcpy(dst[k], src[k], n * sizeof(float));
        crc[k] = crc32c(0, src[k], n * sizeof(float));
    }
#endif
}

static void put_i64(int32_t* h, int at, int64_t v) {
    h[at] = (int32_t)(uint32_t)((uint64_t)v & 0xFFFFFFFFu);
    h[at + 1] = (int32_t)(uint32_t)((uint64_t)v >> 32);
}

static int64_t get_i64(const int32_t* h, int at) {
    return (int64_t)(((uint64_t)(uint32_t)h[at + 1] << 32) | (uint32_t)h[at]);
}

/* Bad steps: a step whose loss or gradient norm is not finite, or whose loss
 * is a spike, more than z standard deviations above the mean of the last
 * LOSS_WINDOW accepted losses (once 16 are in), has its update skipped. */
typedef struct {
    float recent[LOSS_WINDOW]; /* ring of the last accepted losses */
    int count;                 /* how many are in it */
    int next;                  /* where the next one goes */
    int bad_run;               /* consecutive bad steps so far */
} LossWatch;

/* Is `loss` a spike against the window? (z <= 0: never.) */
static int losswatch_spike(const LossWatch* w, double loss, double z, double* zscore) {
    *zscore = 0.0;
    if (z <= 0.0 || w->count < 16) return 0;
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < w->count; i++) mean += w->recent[i];
    mean /= w->count;
    for (int i = 0; i < w->count; i++) var += (w->recent[i] - mean) * (w->recent[i] - mean);
    double sd = sqrt(var / (w->count - 1));
    *zscore = (loss - mean) / (sd > 1e-6 ? sd : 1e-6);
    return *zscore > z;
}

static void losswatch_accept(LossWatch* w, float loss) {
    w->recent[w->next] = loss;
    w->next = (w->next + 1) % LOSS_WINDOW;
    if (w->count < LOSS_WINDOW) w->count++;
    w->bad_run = 0;
}

/* What a state pins down besides the arrays. */
typedef struct {
    int step, rank, world, zero, B, T, total, seed, shuffle;
    GPT2Config config;
    int epoch, shard_pos;
    long long cursor;
    size_t P, lo, hi;
    uint64_t sample_rng;
    uint64_t nonce;  /* the run's (<dir>/run.id): memory from another run is never taken */
    int steps;       /* --steps of the run that wrote it (a change is allowed, and said) */
    LossWatch watch;
} StateInfo;

static size_t state_bytes(size_t n) { return STATE_HEADER_BYTES + 3 * n * sizeof(float); }

static void state_path(char* out, size_t cap, const char* dir, int step, int rank) {
    if (rank >= 0) snprintf(out, cap, "%s/state_%08d_rank%d.bin", dir, step, rank);
    else snprintf(out, cap, "%s/state_%08d.complete", dir, step);
}

/* The header of a state whose arrays (its slices of the weights, m and v,
 * hi - lo floats each) have the CRC32Cs crc[0..2]. */
static void state_header_make(int32_t* h, const StateInfo* s, const uint32_t crc[3]) {
    memset(h, 0, STATE_HEADER_BYTES);
    h[0] = STATE_MAGIC; h[1] = STATE_VERSION; h[2] = s->step; h[3] = s->rank; h[4] = s->world; h[5] = s->zero;
    h[6] = s->B; h[7] = s->T; h[8] = s->total; h[9] = s->seed; h[10] = s->shuffle;
    h[11] = s->config.num_layers; h[12] = s->config.channels; h[13] = s->config.num_heads;
    h[14] = s->config.max_seq_len; h[15] = s->config.vocab_size; h[16] = s->config.padded_vocab_size;
    h[17] = s->epoch; h[18] = s->shard_pos;
    put_i64(h, 20, s->cursor);
    put_i64(h, 22, (int64_t)s->P);
    put_i64(h, 24, (int64_t)s->lo);
    put_i64(h, 26, (int64_t)s->hi);
    put_i64(h, 28, (int64_t)s->sample_rng);
    h[30] = (int32_t)crc[0];
    h[31] = (int32_t)crc[1];
    h[32] = (int32_t)crc[2];
    put_i64(h, 33, (int64_t)s->nonce);
    h[35] = s->watch.count; h[36] = s->watch.next; h[37] = s->watch.bad_run; h[38] = s->steps;
    memcpy(h + 40, s->watch.recent, sizeof(s->watch.recent));
    h[255] = (int32_t)crc32c(0, h, 255 * sizeof(int32_t));
}

/* A header whose checksum matches can still contradict itself (a writer
 * with a bug, or a header rebuilt by hand): every field that follows from
 * the others is checked against them, and the unused words must be 0, so
 * that nothing in a state is taken unless the trainer could have written
 * it. 0, or -1 after a message naming the field, what it holds and what the
 * rest of the header implies. */
static int state_header_consistent(const int32_t* h, const StateInfo* s, const char* path) {
    char field[48] = "", want[160] = "";
    long long found = 0;
    long long per_pass = (long long)s->B * s->T * s->world; /* tokens per micro-batch over all ranks */
    size_t shard = (s->P + (size_t)s->world - 1) / (size_t)s->world; /* rank r holds [r shard, (r+1) shard) of P */
    size_t lo = (size_t)s->rank * shard < s->P ? (size_t)s->rank * shard : s->P;
    size_t hi = lo + shard < s->P ? lo + shard : s->P;
    for (int i = 19; i < HEADER_INTS - 1 && !field[0]; i++)
        if ((i == 19 || i == 39 || i >= 40 + LOSS_WINDOW) && h[i] != 0) {
            snprintf(field, sizeof(field), "word %d (unused)", i);
            found = h[i];
            snprintf(want, sizeof(want), "0");
        }
    if (field[0]) {
        /* an unused word set: said below */
    } else if (s->total % per_pass != 0) {
        snprintf(field, sizeof(field), "tokens per step ([8])");
        found = s->total;
        snprintf(want, sizeof(want), "a multiple of B x T x ranks = %d x %d x %d = %lld", s->B, s->T, s->world, per_pass);
    } else if (s->lo != lo || s->hi != hi) {
        snprintf(field, sizeof(field), s->lo != lo ? "slice start ([24..25])" : "slice end ([26..27])");
        found = (long long)(s->lo != lo ? s->lo : s->hi);
        snprintf(want, sizeof(want), "%zu (rank %d's slice of %zu parameters over %d ranks: [%zu, %zu))",
                 s->lo != lo ? lo : hi, s->rank, s->P, s->world, lo, hi);
    } else if (s->step > s->steps) {
        snprintf(field, sizeof(field), "step ([2])");
        found = s->step;
        snprintf(want, sizeof(want), "at most the run's --steps, %d ([38])", s->steps);
    } else if (s->watch.count < LOSS_WINDOW && s->watch.next != s->watch.count) {
        snprintf(field, sizeof(field), "loss window's next slot ([36])");
        found = s->watch.next;
        snprintf(want, sizeof(want), "%d (the window holds %d losses and is not yet full)", s->watch.count,
                 s->watch.count);
    } else {
        for (int i = 0; i < LOSS_WINDOW && !field[0]; i++) {
            float x = s->watch.recent[i];
            int held = i < s->watch.count;
            if (held ? !(isfinite(x) && x >= 0.0f) : x != 0.0f) {
                snprintf(field, sizeof(field), "loss window's entry %d ([%d])", i, 40 + i);
                found = h[40 + i];
                if (held) snprintf(want, sizeof(want), "a finite loss >= 0 (found %g)", (double)x);
                else snprintf(want, sizeof(want), "0.0, past the %d losses held (found %g)", s->watch.count, (double)x);
            }
        }
    }
    if (!field[0]) return 0;
    FILE_ERROR(path, "header field %s holds %lld, expected %s: the header contradicts itself (a state written by "
               "another program, or corrupt); resume from another step or remove this one", field, found, want);
    return -1;
}

/* Check a header read from a file of `size` bytes and unpack it. 0, or -1
 * after a message naming `path`. */
static int state_header_parse(const int32_t* h, long long size, const char* path, StateInfo* s) {
    if (h[0] != STATE_MAGIC) {
        FILE_ERROR(path, "bad magic %d, expected %d: not a gpt.c training state (or one being written when the "
                   "run stopped)", h[0], STATE_MAGIC);
        return -1;
    }
    if (h[1] != STATE_VERSION) {
        FILE_ERROR(path, "training state of version %d; this build reads version %d: resume with the build that "
                   "wrote it, or start a new --output-dir", h[1], STATE_VERSION);
        return -1;
    }
    if ((uint32_t)h[255] != crc32c(0, h, 255 * sizeof(int32_t))) {
        FILE_ERROR(path, "header checksum mismatch: the file is corrupt");
        return -1;
    }
    memset(s, 0, sizeof(*s));
    s->step = h[2]; s->rank = h[3]; s->world = h[4]; s->zero = h[5]; s->B = h[6]; s->T = h[7];
    s->total = h[8]; s->seed = h[9]; s->shuffle = h[10];
    s->config.num_layers = h[11]; s->config.channels = h[12]; s->config.num_heads = h[13];
    s->config.max_seq_len = h[14]; s->config.vocab_size = h[15]; s->config.padded_vocab_size = h[16];
    s->epoch = h[17]; s->shard_pos = h[18]; s->cursor = get_i64(h, 20);
    s->P = (size_t)get_i64(h, 22); s->lo = (size_t)get_i64(h, 24); s->hi = (size_t)get_i64(h, 26);
    s->sample_rng = (uint64_t)get_i64(h, 28);
    s->nonce = (uint64_t)get_i64(h, 33);
    s->watch.count = h[35]; s->watch.next = h[36]; s->watch.bad_run = h[37]; s->steps = h[38];
    memcpy(s->watch.recent, h + 40, sizeof(s->watch.recent));
    if (config_problem(&s->config) || s->P != parameter_count(&s->config) || s->lo > s->hi || s->hi > s->P ||
        s->watch.count < 0 || s->watch.count > LOSS_WINDOW || s->watch.next < 0 || s->watch.next >= LOSS_WINDOW ||
        size != (long long)state_bytes(s->hi - s->lo)) {
        FILE_ERROR(path, "sizes in the header do not match the file (%lld bytes): truncated or corrupt", size);
        return -1;
    }
    /* every counter in range, so the next step cannot overflow one (the
     * header checksum guards against damage, not against a bad writer) */
    const char* bad = s->step < 1 || s->step >= INT32_MAX - 1     ? "step"
                      : s->world < 1 || s->world > (1 << 20)      ? "world size"
                      : s->rank < 0 || s->rank >= s->world        ? "rank"
                      : s->zero < 0 || s->zero > 3                ? "ZeRO stage"
                      : s->B < 1 || s->T < 1 || s->T > s->config.max_seq_len ? "batch shape (B, T)"
                      : s->total < 1 || s->total % s->T != 0      ? "tokens per step"
                      : s->shuffle < 0 || s->shuffle > 1          ? "shuffle flag"
                      : s->epoch < 0 || s->epoch > (1 << 30)      ? "epoch"
                      : s->shard_pos < 0 || s->cursor < 0         ? "data position"
                      : s->steps < 1 || s->steps >= INT32_MAX - 1 ? "--steps"
                      : s->watch.bad_run < 0 || s->watch.bad_run > s->step ? "bad-step count" : NULL;
    if (bad) {
        FILE_ERROR(path, "the %s recorded in the header is out of range: a state written by another program, "
                   "or corrupt", bad);
        return -1;
    }
    return state_header_consistent(h, s, path);
}

/* Read a state file's header and check it and its size. 0, or -1 after a
 * message (a missing file is quiet when `quiet_missing`). */
static int state_read_header(const char* path, StateInfo* s, int32_t* h, int quiet_missing) {
    if (quiet_missing && access(path, F_OK) != 0) return -1;
    FILE* f = file_open_read(path, "training state file");
    if (!f) return -1;
    long long size = file_size(f);
    int rc = size >= STATE_HEADER_BYTES ? read_exact(f, h, STATE_HEADER_BYTES, path) : -1;
    fclose(f);
    if (rc != 0) {
        FILE_ERROR(path, "%lld bytes: shorter than a training state's header (truncated?)", size);
        return -1;
    }
    return state_header_parse(h, size, path, s);
}

/* Read the arrays of a state file whose header `h` was checked, verifying
 * each section's checksum. Its slice [lo, hi) of the weights goes into
 * params_full (P floats; NULL: skipped); of its moments, the part inside
 * [want_lo, want_hi) goes into m and v, which hold that range (NULL:
 * skipped). 0 or -1. */
static int state_read_arrays(const char* path, const StateInfo* s, const int32_t* h, float* params_full, float* m,
                             float* v, size_t want_lo, size_t want_hi) {
    FILE* f = file_open_read(path, "training state file");
    if (!f) return -1;
    size_t n = s->hi - s->lo;
    float* arrays = xmalloc_floats(3 * n); /* weights, m, v */
    int rc = fseek(f, STATE_HEADER_BYTES, SEEK_SET) != 0 || read_exact(f, arrays, 3 * n * 4, path) != 0;
    fclose(f);
    const char* bad = rc ? NULL
                      : (uint32_t)h[30] != crc32c(0, arrays, n * 4)         ? "weights"
                      : (uint32_t)h[31] != crc32c(0, arrays + n, n * 4)     ? "first moments"
                      : (uint32_t)h[32] != crc32c(0, arrays + 2 * n, n * 4) ? "second moments" : NULL;
    if (bad) FILE_ERROR(path, "checksum mismatch in the %s: the file is corrupt", bad);
    if (!rc && !bad) {
        if (params_full) memcpy(params_full + s->lo, arrays, n * sizeof(float));
        size_t a = want_lo > s->lo ? want_lo : s->lo, b = want_hi < s->hi ? want_hi : s->hi;
        if (m && a < b) {
            memcpy(m + (a - want_lo), arrays + n + (a - s->lo), (b - a) * sizeof(float));
            memcpy(v + (a - want_lo), arrays + 2 * n + (a - s->lo), (b - a) * sizeof(float));
        }
    }
    free(arrays);
    return rc || bad ? -1 : 0;
}

/* Load this rank's slice from a state record in memory (a mapped slot, or
 * a replica received): check the header, copy the arrays out while taking
 * their CRC32Cs, compare. The weights go to params_full + lo, the moments
 * to m and v (which hold [lo, hi)). 0, or -1 after a message. */
static int state_load_record(const unsigned char* base, size_t bytes, const char* what, StateInfo* s, float* params_full,
                             float* m, float* v) {
    int32_t h[HEADER_INTS];
    if (bytes < STATE_HEADER_BYTES) {
        FILE_ERROR(what, "%zu bytes: shorter than a training state's header", bytes);
        return -1;
    }
    memcpy(h, base, STATE_HEADER_BYTES);
    if (state_header_parse(h, (long long)bytes, what, s) != 0) return -1;
    size_t n = s->hi - s->lo;
    const float* arrays = (const float*)(base + STATE_HEADER_BYTES);
    float* const to[3] = {params_full + s->lo, m, v};
    const float* const from[3] = {arrays, arrays + n, arrays + 2 * n};
    uint32_t crc[3];
    copy3_crc32c(to, from, n, crc);
    static const char* const names[3] = {"weights", "first moments", "second moments"};
    for (int k = 0; k < 3; k++)
        if (crc[k] != (uint32_t)h[30 + k]) {
            FILE_ERROR(what, "checksum mismatch in the %s: the copy is corrupt", names[k]);
            return -1;
        }
    return 0;
}

/* A snapshot slot: one state record in memory, backed by a file in
 * /dev/shm (or anonymous memory when snapshots stay private), mapped at
 * start, its pages faulted in (reserved: a full /dev/shm is an error, not
 * a SIGBUS mid-run) before anything writes them, so taking a snapshot never
 * faults. Fault them in all at start (slot_map's `defer` 0) or later
 * (`defer` 1: the fast start): then slot_prepare faults them in,
 * in chunks that any number of threads take in turn (a background thread
 * while the first steps run, and whoever needs the slot first: the copier
 * before it fills it, a resume before it reads it), and waits for the
 * chunks others took. */
#define SLOT_CHUNK ((size_t)32 << 20) /* 32 MiB per madvise */
typedef struct {
    char path[4400];     /* "" = anonymous */
    unsigned char* base; /* (bytes) the record */
    size_t bytes;
    long chunks;         /* its SLOT_CHUNK-sized chunks; slot_prepare's counters (atomic): */
    long next;           /* the next chunk to fault in */
    long done;           /* chunks faulted in (or failed): all of them = prepared */
    int err;             /* the errno of a chunk that could not be had (a full /dev/shm), 0 */
} Slot;

/* Fault chunk c of the slot in, writable, keeping what the file holds: 0,
 * or the errno (EINVAL: a kernel before 5.14; EFAULT, ENOMEM: the pages
 * cannot be had, a full /dev/shm). */
static int slot_chunk_populate(const Slot* sl, long c) {
    size_t off = (size_t)c * SLOT_CHUNK, len = sl->bytes - off < SLOT_CHUNK ? sl->bytes - off : SLOT_CHUNK;
#ifdef MADV_POPULATE_WRITE
    return madvise(sl->base + off, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
#else
    (void)len;
    return EINVAL;
#endif
}

/* Take chunks of the slot and fault them in until none is left (or *stop
 * is set: the background thread told to end). */
static void slot_prepare_work(Slot* sl, const int* stop) {
    for (;;) {
        if (stop && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) return;
        long c = __atomic_fetch_add(&sl->next, 1, __ATOMIC_ACQ_REL);
        if (c >= sl->chunks) return;
        int err = slot_chunk_populate(sl, c);
        if (err) __atomic_store_n(&sl->err, err, __ATOMIC_RELEASE);
        __atomic_fetch_add(&sl->done, 1, __ATOMIC_ACQ_REL);
    }
}

/* The slot's pages are faulted in when this returns: what is left of them
 * by the calling thread (`parallel`: and the OpenMP threads), then a wait
 * for the chunks other threads took. 0, or the errno of a chunk that could
 * not be had. Cheap once prepared (two loads). */
static int slot_prepare(Slot* sl, int parallel) {
    if (!sl->base) return 0;
    if (__atomic_load_n(&sl->done, __ATOMIC_ACQUIRE) < sl->chunks) {
        if (parallel) {
#pragma omp parallel
            slot_prepare_work(sl, NULL);
        } else {
            slot_prepare_work(sl, NULL);
        }
        while (__atomic_load_n(&sl->done, __ATOMIC_ACQUIRE) < sl->chunks) {
            struct timespec ts = {0, 50000}; /* 50 us: a chunk takes milliseconds */
            nanosleep(&ts, NULL);
        }
    }
    return __atomic_load_n(&sl->err, __ATOMIC_ACQUIRE);
}

/* Map `bytes` of the file slot `fd` shared at *base and fault every page
 * in, writable, by all threads, keeping what the file holds (`defer`: the
 * first page only, the rest left to slot_prepare). 0; 1 when the kernel
 * lacks MADV_POPULATE_WRITE (nothing mapped: the caller reserves the pages
 * another way); -1 (errno set) when the pages cannot be had: a full
 * /dev/shm is an error now, not a SIGBUS mid-run. */
static int slot_populate(Slot* sl, int fd, int defer) {
#ifdef MADV_POPULATE_WRITE
    sl->base = (unsigned char*)mmap(NULL, sl->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sl->base == (unsigned char*)MAP_FAILED) {
        sl->base = NULL;
        return -1;
    }
    int err = slot_chunk_populate(sl, 0); /* (also asks whether the kernel can) */
    sl->next = sl->done = 1;
    if (err == 0) err = defer ? 0 : slot_prepare(sl, 1);
    if (err == 0) return 0;
    munmap(sl->base, sl->bytes);
    sl->base = NULL;
    if (err == EINVAL) return 1; /* a kernel before 5.14 */
    errno = err;
    return -1;
#else
    (void)sl; (void)fd; (void)defer;
    return 1;
#endif
}

/* How many bytes short the file system holding slot file `fd` is of what a
 * slot of `bytes` still needs (its file's blocks are its already) plus
 * *pending, what the slots deferred before it need (increased by this
 * one's): 0 when there is room or it cannot be told. A deferred slot
 * reserves its pages as they are faulted in, so the room is checked at
 * start instead: a full /dev/shm still says so at once in the usual case
 * (and, filled meanwhile by another process, when the slot is prepared). */
static size_t slot_shortfall(int fd, size_t bytes, size_t* pending) {
    struct statvfs fs;
    struct stat st;
    if (fstatvfs(fd, &fs) != 0 || fstat(fd, &st) != 0) return 0;
    size_t have = (size_t)st.st_blocks * 512, need = (bytes > have ? bytes - have : 0) + *pending;
    size_t avail = (size_t)fs.f_bavail * (size_t)fs.f_frsize;
    *pending = need;
    return need > avail ? need - avail : 0;
}

/* Map a slot of `bytes` (path NULL: anonymous). `defer` 1: only map it
 * (and check the room for it and for the slots deferred before it: their
 * bytes in *pending), its pages left to slot_prepare. 0, or -1 after a
 * message. */
static int slot_map(Slot* sl, const char* path, size_t bytes, int defer, size_t* pending) {
    memset(sl, 0, sizeof(*sl));
    sl->bytes = bytes;
    sl->chunks = (long)((bytes + SLOT_CHUNK - 1) / SLOT_CHUNK);
    if (!path) {
        sl->base = (unsigned char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    } else {
        snprintf(sl->path, sizeof(sl->path), "%s", path);
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        if (fd < 0) {
            FILE_ERROR(path, "cannot create a snapshot slot: %s", strerror(errno));
            return -1;
        }
        struct stat st;
        int rc = fstat(fd, &st) == 0 && (size_t)st.st_size != bytes ? ftruncate(fd, (off_t)bytes) : 0;
        size_t short_by = rc == 0 && defer ? slot_shortfall(fd, bytes, pending) : 0;
        if (short_by) {
            FILE_ERROR(path, "no room for the snapshot slots (%.2f GB each; %.2f GB short): free space there, "
                       "point --shm-dir elsewhere, or run with --snapshot-every 0", bytes / 1e9, short_by / 1e9);
            close(fd);
            remove(path);
            return -1;
        }
        /* a standby maps the slots the active trainer writes, and a file slot
         * keeps its contents (a snapshot from before a crash must survive
         * until it is replaced): the pages are reserved and mapped without
         * writing them. All threads fault them in (MADV_POPULATE_WRITE,
         * Linux 5.14: as a write would, without writing), which is what
         * slot set-up costs: on these VMs a fresh page is ~10 us */
        int pop = rc == 0 ? slot_populate(sl, fd, defer) : -1;
        if (pop == 0) {
            close(fd);
            ledger_record(MEM_SNAPSHOTS, sl->base, bytes);
            return 0;
        }
        if (pop == 1) rc = posix_fallocate(fd, 0, (off_t)bytes); /* (an older kernel: one thread reserves them) */
        else if (rc == 0) rc = errno == EFAULT ? ENOSPC : errno; /* (a fault that would have been a SIGBUS: full) */
        if (rc != 0) {
            FILE_ERROR(path, "cannot reserve %.2f GB for a snapshot slot (%s): free space there, point --shm-dir "
                       "elsewhere, or run with --snapshot-every 0", bytes / 1e9, strerror(rc > 0 ? rc : errno));
            close(fd);
            remove(path);
            return -1;
        }
        /* MAP_POPULATE: the kernel maps every page now, in one call */
        sl->base = (unsigned char*)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        sl->next = sl->done = sl->chunks; /* prepared */
        close(fd);
    }
    if (sl->base == (unsigned char*)MAP_FAILED) {
        sl->base = NULL;
        fprintf(stderr, "error: cannot map %.2f GB for a snapshot slot: %s\n", bytes / 1e9, strerror(errno));
        return -1;
    }
    if (!path) { /* fresh memory: huge pages, faulted in by chunks (now, or by slot_prepare) */
#ifdef MADV_HUGEPAGE
        (void)madvise(sl->base, bytes, MADV_HUGEPAGE);
#endif
        int err = slot_chunk_populate(sl, 0);
        if (err == EINVAL) { /* a kernel before 5.14: touched in parallel now (gptc/ledger.h) */
            big_touch(sl->base, bytes, 1);
            sl->next = sl->done = sl->chunks;
        } else {
            if (err) __atomic_store_n(&sl->err, err, __ATOMIC_RELEASE);
            sl->next = sl->done = 1;
            if (!defer) (void)slot_prepare(sl, 1);
        }
    }
    ledger_record(MEM_SNAPSHOTS, sl->base, bytes);
    return 0;
}

static void slot_unmap(Slot* sl, int remove_file) {
    ledger_release(sl->base);
    if (sl->base) munmap(sl->base, sl->bytes);
    if (remove_file && sl->path[0]) remove(sl->path);
    memset(sl, 0, sizeof(*sl));
}

/* Fill a slot with a state: invalidate it, copy the slices (and, when
 * model_copy is given, all the weights for the model file; then set
 * *copied), then write the header with its checksums, the magic last (a
 * crash in between leaves a slot that reads as empty). Runs on a background
 * thread while the trainer's next forward and backward only read the
 * arrays. */
static void slot_fill(Slot* sl, const StateInfo* s, const float* params, const float* m, const float* v, int* copied,
                      const float* model_params, float* model_copy) {
    __atomic_store_n((int32_t*)sl->base, 0, __ATOMIC_RELEASE);
    size_t n = s->hi - s->lo;
    float* dst = (float*)(sl->base + STATE_HEADER_BYTES);
    uint32_t crc[3];
    float* const to[3] = {dst, dst + n, dst + 2 * n};
    const float* const from[3] = {params, m, v};
    copy3_crc32c(to, from, n, crc);
    if (model_copy) memcpy(model_copy, model_params, s->P * sizeof(float)); /* all the weights, for the model file */
    __atomic_store_n(copied, 1, __ATOMIC_RELEASE); /* the trainer may change its arrays now */
    int32_t h[HEADER_INTS];
    state_header_make(h, s, crc);
    memcpy(sl->base + sizeof(int32_t), h + 1, STATE_HEADER_BYTES - sizeof(int32_t));
    __atomic_store_n((int32_t*)sl->base, h[0], __ATOMIC_RELEASE);
}

/* Why a state `s` cannot continue this run (`now`), or NULL. A state from
 * another number of ranks or another --zero is fine from disk (every rank
 * reads the parts of the moments its shard needs: resharding) as long as
 * the tokens per step and T are the same; a snapshot in memory is one
 * rank's and needs the same layout. */
static const char* state_differs(const StateInfo* s, const StateInfo* now, int same_layout) {
    return memcmp(&s->config, &now->config, sizeof(GPT2Config)) ? "the model's shape"
           : s->T != now->T ? "--seq-len"
           : s->total != now->total ? "--total-batch-size (tokens per step)"
           : s->seed != now->seed ? "--seed"
           : s->shuffle != now->shuffle ? "--shuffle"
           : same_layout && (s->world != now->world || s->zero != now->zero || s->B != now->B ||
                             s->lo != now->lo || s->hi != now->hi) ? "the ranks' layout" : NULL;
}

/* The run's nonce: <dir>/run.id, written (by rank 0) when a run starts from
 * step 0. States and snapshots carry it, so those left by another run in
 * the same folder (wiped and restarted) are never taken for this one's.
 * The file is one line, "<nonce, 16 hex digits> <CRC32C of those 16
 * characters, 8 hex digits>": a changed digit is caught, not taken for
 * another run. (Files of 17 bytes, the nonce alone, are read as before.) */
static void run_id_format(char* out, size_t cap, unsigned long long nonce) {
    char hex[17];
    snprintf(hex, sizeof(hex), "%016llx", nonce);
    snprintf(out, cap, "%s %08x\n", hex, crc32c(0, hex, 16));
}

/* 1 and *nonce when <dir>/run.id is there and intact, 0 when there is none,
 * -1 (after a message) when it is damaged. */
static int run_id_read(const char* dir, uint64_t* nonce) {
    char path[4400], text[64] = {0}, want[64];
    snprintf(path, sizeof(path), "%s/run.id", dir);
    *nonce = 0;
    FILE* f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    unsigned long long v = 0;
    int legacy = n == 17 && sscanf(text, "%16llx", &v) == 1 && text[16] == '\n';
    if (!legacy && (n != 26 || sscanf(text, "%16llx", &v) != 1 || (run_id_format(want, sizeof(want), v),
                                                                   memcmp(text, want, 26) != 0))) {
        FILE_ERROR(path, "damaged (%zu bytes; expected a 16-digit run nonce and its 8-digit checksum): the states in "
                   "this folder cannot be matched to it. If they are this run's, remove run.id and resume again (the "
                   "newest complete state is then taken); to start a new run, use a new --output-dir", n);
        return -1;
    }
    *nonce = v;
    return 1;
}

/* The tag that names a run's snapshot slots and their lock in --shm-dir: a
 * hash of the output folder's absolute path, so a restarted run finds its
 * memory and two runs never share it (gptc/saver.h's slot_path). */
static uint64_t run_tag(const char* output_dir) {
    char real[4096];
    const char* dir = realpath(output_dir, real) ? real : output_dir;
    return fnv1a(0xCBF29CE484222325ull, dir, strlen(dir));
}

/* A save cut short by a crash leaves its "<file>.tmp" (write_file_atomic):
 * never a state, never removed by retention (--keep-last lists complete
 * steps), it would stay on disk for good (1.5 GB a crash for GPT-2 124M),
 * and the kernel would go on writing its dirty pages back while the next
 * trainer's first steps run. Once the run is this job's (run_lock: no
 * other trainer can be writing), each rank removes its own state files';
 * rank 0 every rank's (those of a run resumed on fewer ranks), the steps'
 * "complete" markers' and the model files' (a marker cut short leaves an
 * empty .tmp; test_failover's kills land there too). (A file another rank
 * removed first is no error.) */
static void partial_saves_remove(const char* output_dir, int rank) {
    if (!output_dir[0]) return;
    static const char* const rank0_wild[] = {"/state_*_rank*.bin.tmp", "/state_*.complete.tmp", "/model_*.bin.tmp"};
    for (int which = 0; which < 3 && (which == 0 || rank == 0); which++) {
        char wild[64], pattern[8400];
        if (rank > 0) snprintf(wild, sizeof(wild), "/state_*_rank%d.bin.tmp", rank);
        else snprintf(wild, sizeof(wild), "%s", rank0_wild[which]);
        glob_pattern(pattern, sizeof(pattern), output_dir, wild);
        glob_t g;
        if (glob(pattern, 0, NULL, &g) != 0) continue;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat st;
            double gb = stat(g.gl_pathv[i], &st) == 0 ? st.st_size / 1e9 : 0.0;
            if (remove(g.gl_pathv[i]) == 0)
                printf("resume: removed %s (%.2f GB): a save cut short when the process writing it died\n",
                       g.gl_pathv[i], gb);
            else if (errno != ENOENT)
                fprintf(stderr, "warning: cannot remove %s, a save cut short when its process died (%s): remove it "
                        "by hand, it is not a state\n", g.gl_pathv[i], strerror(errno));
        }
        globfree(&g);
    }
}

#endif /* GPTC_STATE_H */
