/*
 * gptc/util.h — the small helpers everything else uses.
 *
 * Included by train_gpt.c (first) and by every other gptc/ header; a student
 * can skip it. Defines: MAYBE_UNUSED, RESTRICT; CHECK, ALWAYS, FILE_ERROR
 * (checked calls, named invariants, file errors); xmalloc, xmalloc_floats;
 * time_ms, unix_ms; num_threads; file_size, file_open_read, read_exact, file_read_all,
 * WriteChunk, write_file_atomic, mkdir_p, glob_pattern; FileLock
 * (file_lock, file_unlock: one process at a time); HEADER_INTS (the
 * 256-int32 header of every llm.c file); Rng with rng_init, rng_u32,
 * rng_uniform, rng_normal, rng_normal_of (seeded, one uint64 of state), rng_jump, rng_fill_normal
 * (rng_normal_fast, rng_fill_normal_lanes: the fast init)
 * (the same normals, drawn by all threads).
 */
#ifndef GPTC_UTIL_H
#define GPTC_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* fileno, fsync, posix functions under -std=c11 */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <errno.h>
#include <glob.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/file.h> /* flock */
#include <fcntl.h>
#ifdef _OPENMP
#include <omp.h>
#else /* built without OpenMP: one thread, and a parallel region's team queries say so */
static inline int omp_get_num_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
#endif

/* for the parts only train_gpt.cu and the tests call */
#define MAYBE_UNUSED __attribute__((unused))

#ifdef __cplusplus
#define RESTRICT __restrict__
#else
#define RESTRICT restrict
#endif

/* Fatal check for things that must not fail (memory, internal invariants):
 * prints the failed expression, where, and a hint, then exits. */
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "error: %s:%d: check failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                           \
            fprintf(stderr, "  " __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                              \
            exit(EXIT_FAILURE);                                                 \
        }                                                                       \
    } while (0)

/* An MPI call, checked: on failure the call, file and line and MPI's own
 * message, then MPI_Abort (a rank that stops alone would hang the others).
 * Used where mpi.h is included (USE_MPI: train_gpt.c's section 6,
 * gptc/quant.h, gptc/zero3.h). */
#define MPI_CHECK(call)                                                                 \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != MPI_SUCCESS) {                                                       \
            char msg_[MPI_MAX_ERROR_STRING];                                            \
            int len_ = 0;                                                               \
            MPI_Error_string(rc_, msg_, &len_);                                         \
            fprintf(stderr, "error: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, msg_); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                               \
        }                                                                               \
    } while (0)

/* "Cannot happen" conditions, named so a reader knows they are invariants. */
#define ALWAYS(cond) CHECK(cond, "internal invariant violated")

/* Recoverable errors in file handling: prints "error: <file>: <message>",
 * nothing more; the caller then frees what it owns and returns -1 itself
 * (every reader frees what it owns before failing). */
#define FILE_ERROR(path, ...)                                                   \
    do {                                                                        \
        fprintf(stderr, "error: %s: ", (path));                                 \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
    } while (0)

static void* xmalloc(size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    CHECK(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

/* 64-byte aligned allocation (one cache line, one AVX-512 vector). */
static float* xmalloc_floats(size_t n) {
    void* p = NULL;
    size_t bytes = (n ? n : 1) * sizeof(float);
    bytes = (bytes + 63) & ~(size_t)63;
    int rc = posix_memalign(&p, 64, bytes);
    CHECK(rc == 0 && p != NULL, "out of memory allocating %zu floats", n);
    return (float*)p;
}

static double time_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Wall-clock milliseconds since the epoch: comparable across processes, for
 * the recovery timings a supervisor reads (scripts/supervise.py). */
static double unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Size of an open file in bytes, or -1. */
static long long file_size(FILE* f) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0) return -1;
    return (long long)st.st_size;
}

/* Open a file to read it as `what` ("model file", "data shard", ...): it
 * must be a regular file (a folder opens too, and then reads as 4096 bytes
 * or as a size of 2^63). NULL after a message naming the file. */
static FILE* file_open_read(const char* path, const char* what) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        FILE_ERROR(path, "cannot open %s: %s", what, strerror(errno));
        return NULL;
    }
    struct stat st;
    memset(&st, 0, sizeof(st));
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        FILE_ERROR(path, "%s, not a %s: give the path of the file itself",
                   S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file", what);
        fclose(f);
        return NULL;
    }
    return f;
}

/* Read exactly n bytes or report which file came up short. */
static int read_exact(FILE* f, void* dst, size_t n, const char* path) {
    if (fread(dst, 1, n, f) != n) {
        FILE_ERROR(path, "read failed after %ld bytes (wanted %zu more): %s",
                   ftell(f), n, ferror(f) ? strerror(errno) : "unexpected end of file");
        return -1;
    }
    return 0;
}

/* Write a whole file atomically: to "<path>.tmp", fsync, then rename over
 * <path>. A crash or a full disk leaves the previous <path> untouched. */
/* Whole file into memory (NUL-terminated). NULL after a message on failure. */
static char* file_read_all(const char* path, size_t* len) {
    FILE* f = file_open_read(path, "file");
    if (!f) return NULL;
    long long size = file_size(f);
    if (size < 0) {
        FILE_ERROR(path, "cannot stat: %s", strerror(errno));
        fclose(f);
        return NULL;
    }
    char* buf = (char*)xmalloc((size_t)size + 1);
    if (read_exact(f, buf, (size_t)size, path) != 0) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[size] = '\0';
    *len = (size_t)size;
    return buf;
}

typedef struct {
    const void* data;
    size_t bytes;
} WriteChunk;

static int write_file_atomic(const char* path, const WriteChunk* chunks, int nchunks) {
    size_t len = strlen(path);
    char* tmp = (char*)xmalloc(len + 5);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE* f = fopen(tmp, "wb");
    if (!f) {
        FILE_ERROR(tmp, "cannot create: %s", strerror(errno));
        free(tmp);
        return -1;
    }
    int ok = 1;
    for (int i = 0; i < nchunks && ok; i++) {
        if (fwrite(chunks[i].data, 1, chunks[i].bytes, f) != chunks[i].bytes) ok = 0;
    }
    if (ok && fflush(f) != 0) ok = 0;
    if (ok && fsync(fileno(f)) != 0) ok = 0;
    int saved_errno = errno;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        FILE_ERROR(path, "write failed (%s); the previous file, if any, is untouched",
                   strerror(saved_errno ? saved_errno : errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        FILE_ERROR(path, "cannot rename %s into place: %s", tmp, strerror(errno));
        remove(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* mkdir -p: create `path` and any missing parents. Returns 0 or -1 (errno set). */
static int mkdir_p(const char* path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(buf)) { errno = ENAMETOOLONG; return -1; }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            buf[i] = saved;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
    return 0;
}

/* One process at a time: an exclusive flock(2) on a small file. The kernel
 * drops it when the holder's last descriptor closes, which happens however
 * the process ends (exit, crash, SIGKILL, a node's reboot for a local file),
 * so a dead holder never leaves a stale lock behind and its successor gets
 * the lock at once. The holder writes one line into the file, "pid N on host
 * H (started T)", so whoever is refused can say who holds it. (flock works
 * across hosts on NFS, which Linux emulates with byte-range locks; a file
 * system without locks says so, and the caller decides.) */
typedef struct {
    int fd;           /* -1: not held */
    char path[4400];
} FileLock;

enum { LOCK_TAKEN = 0, LOCK_HELD = 1, LOCK_UNSUPPORTED = 2, LOCK_FAILED = -1 };

/* Take the lock on `path` (created if missing), without waiting. Returns
 * LOCK_TAKEN; LOCK_HELD with the holder's line in `holder`; LOCK_UNSUPPORTED
 * (the file system has no locks; reason in `holder`); or LOCK_FAILED (said). */
static int file_lock(FileLock* l, const char* path, char* holder, size_t cap) {
    l->fd = -1;
    snprintf(l->path, sizeof(l->path), "%s", path);
    holder[0] = '\0';
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* CLOEXEC: no child inherits it */
        if (fd < 0) {
            FILE_ERROR(path, "cannot create the lock file: %s", strerror(errno));
            return LOCK_FAILED;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e == EWOULDBLOCK) { /* its line (the holder may not have written it yet: a few us) */
                ssize_t n = pread(fd, holder, cap - 1, 0);
                holder[n > 0 ? n : 0] = '\0';
                for (char* c = holder; *c; c++)
                    if (*c == '\n') *c = '\0';
                    else if ((unsigned char)*c < 32) *c = '?';
                if (!holder[0]) snprintf(holder, cap, "another process (it has not said which yet)");
            } else {
                snprintf(holder, cap, "%s", strerror(e));
            }
            close(fd);
            if (e == EWOULDBLOCK) return LOCK_HELD;
            if (e == ENOLCK || e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) return LOCK_UNSUPPORTED;
            FILE_ERROR(path, "cannot lock: %s", strerror(e));
            return LOCK_FAILED;
        }
        /* a holder that finished may have removed the file between our open
         * and our flock: then we hold a lock on a name nobody sees. Again. */
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            char host[256] = "?", line[512];
            if (gethostname(host, sizeof(host)) != 0) snprintf(host, sizeof(host), "?");
            host[sizeof(host) - 1] = '\0';
            time_t now = time(NULL);
            struct tm t;
            char when[64] = "?";
            if (gmtime_r(&now, &t)) strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", &t);
            int n = snprintf(line, sizeof(line), "pid %d on host %s (started %s)\n", (int)getpid(), host, when);
            /* a sign for the refused, not a record: unchecked beyond a warning */
            if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
                fprintf(stderr, "warning: %s: cannot write the holder's pid into the lock file\n", path);
            l->fd = fd;
            return LOCK_TAKEN;
        }
        close(fd);
    }
    FILE_ERROR(path, "cannot lock: the lock file keeps being removed and created again");
    return LOCK_FAILED;
}

/* Give the lock back; `remove_file`: remove the file first (while still
 * holding it, so a process that opened it meanwhile sees it gone and tries
 * again on the new one). */
static void file_unlock(FileLock* l, int remove_file) {
    if (l->fd < 0) return;
    if (remove_file) unlink(l->path);
    close(l->fd); /* the lock goes with the last descriptor */
    l->fd = -1;
}

/* A glob pattern for the files `literal` + `wild` (wild: "*.txt", ...):
 * the literal part, a folder the user named ("runs/lr[3e-4]"), has its
 * glob characters escaped, so it matches only itself. */
static void glob_pattern(char* out, size_t cap, const char* literal, const char* wild) {
    size_t n = 0;
    for (const char* p = literal; *p && n + 2 < cap; p++) {
        if (strchr("*?[]\\", *p)) out[n++] = '\\';
        out[n++] = *p;
    }
    snprintf(out + n, cap - n, "%s", wild);
}

/* Random numbers: xorshift64* for bits, Box-Muller for normals. Seeded, so a
 * run is reproducible; the state is one uint64 (easy to checkpoint). */
typedef struct {
    uint64_t state;
} Rng;

static void rng_init(Rng* rng, uint64_t seed) {
    /* splitmix64 of the seed, so nearby seeds give unrelated streams and the
     * state is never zero (xorshift's fixed point). */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    rng->state = z ? z : 0x2545F4914F6CDD1Dull;
}

static uint32_t rng_u32(Rng* rng) {
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return (uint32_t)((x * 0x2545F4914F6CDD1Dull) >> 32);
}

/* uniform in [0, 1) with 24 random bits */
static float rng_uniform(Rng* rng) { return (rng_u32(rng) >> 8) / 16777216.0f; }

/* standard normal, computed in double, from two draws a and b (Box-Muller) */
static double rng_normal_of(uint32_t a, uint32_t b) {
    double u1 = ((a >> 8) + 1.0) / 16777217.0; /* (0, 1) */
    double u2 = (b >> 8) / 16777216.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static double rng_normal(Rng* rng) {
    uint32_t a = rng_u32(rng);
    return rng_normal_of(a, rng_u32(rng));
}

/* Jump ahead: the state `draws` rng_u32 calls later, in about 64 x 64 bit
 * operations per set bit of `draws`. xorshift64's step (x ^= x >> 12,
 * x ^= x << 25, x ^= x >> 27) is linear over GF(2), so k steps are one 64x64
 * bit matrix M^k applied to the state; M^(2^j) are kept (column i: the image
 * of bit i) and multiplied in for each bit j of `draws`. The same numbers as
 * drawing them one by one, which test_gpt checks. */
typedef struct {
    uint64_t col[64][64]; /* col[j][i]: M^(2^j) applied to 1 << i */
} RngJumpTable;

static uint64_t rng_matvec(const uint64_t* col, uint64_t x) {
    uint64_t y = 0;
    for (int i = 0; x; i++, x >>= 1)
        if (x & 1) y ^= col[i];
    return y;
}

static const RngJumpTable* rng_jump_table(void) {
    static RngJumpTable t;
    static int ready = 0;
#pragma omp critical(gptc_rng_jump_table)
    if (!ready) {
        for (int i = 0; i < 64; i++) { /* M: one step of rng_u32's state */
            uint64_t x = 1ull << i;
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            t.col[0][i] = x;
        }
        for (int j = 1; j < 64; j++) /* M^(2^j) = M^(2^(j-1)) squared */
            for (int i = 0; i < 64; i++) t.col[j][i] = rng_matvec(t.col[j - 1], t.col[j - 1][i]);
        ready = 1;
    }
    return &t;
}

static void rng_jump(Rng* rng, uint64_t draws) {
    const RngJumpTable* t = rng_jump_table();
    for (int j = 0; draws; j++, draws >>= 1)
        if (draws & 1) rng->state = rng_matvec(t->col[j], rng->state);
}

/* The fast init: (float)(std * rng_normal) for n normals from
 * `start`, into p[0, n), the same bits as the loop of rng_normal, about
 * twice as fast. GPT-2 124M's init is 124M normals, each a log, a cos and a
 * sqrt of glibc's in double: seconds of the start at that size. Here RNG_LANES streams
 * (each jumped to the start of its n/RNG_LANES normals) are drawn side by
 * side, so the compiler's vector instructions do them together, and the
 * log and the cos are our own, in plain arithmetic:
 *   log(u1) = e ln2 + 2 atanh(t), u1 = 2^e m, m in [sqrt(1/2), sqrt(2)),
 *     t = (m - 1)/(m + 1) (|t| < 0.172), atanh's series to t^21 (its
 *     next term < 2^-55 of it), ln2 in two parts (fdlibm's: e ln2_hi exact);
 *   cos(x), x = 2 pi u2 in [0, 2 pi): x = k pi/2 + r, |r| <= pi/4, r by
 *     fma with pi/2 in three parts (Cody-Waite; k <= 4: the first product
 *     and difference exact), then +-cos r or +-sin r by Taylor to r^16 /
 *     r^17 (next terms < 2^-55 of them).
 * Each differs from glibc's by a few units of the last place (2^-50 at
 * most, glibc's own error included), so the double std * rad * cos
 * differs from the reference's by far less than 2^-40 of it: where
 * rounding it to float gives the same float at both ends of +-2^-40, the
 * reference rounds to that float too. Where not (~2 in 10^5 normals: a
 * double near the middle of two floats), that normal is recomputed with
 * rng_normal_of itself. test_gpt checks the bits against the serial loop. */
#define RNG_LANES 8
static double rng_bits_to_double(uint64_t u) {
    double x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

static uint64_t rng_double_bits(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

/* std * (our normal) from draws a, b, as a double (see above). */
static inline double rng_normal_fast(uint32_t a, uint32_t b, double std) {
    double u1 = ((a >> 8) + 1.0) / 16777217.0, u2 = (b >> 8) / 16777216.0; /* as rng_normal_of */
    /* log(u1), u1 in (0, 1), always normal */
    uint64_t bits = rng_double_bits(u1);
    double e = (double)((int64_t)(bits >> 52) - 1023);
    double m = rng_bits_to_double((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull); /* [1, 2) */
    int high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    e = high ? e + 1.0 : e;
    double t = (m - 1.0) / (m + 1.0), z = t * t;
    double q = 1.0 / 21;
    q = q * z + 1.0 / 19; q = q * z + 1.0 / 17; q = q * z + 1.0 / 15; q = q * z + 1.0 / 13;
    q = q * z + 1.0 / 11; q = q * z + 1.0 / 9; q = q * z + 1.0 / 7; q = q * z + 1.0 / 5; q = q * z + 1.0 / 3;
    double log_m = 2.0 * t + 2.0 * t * (z * q);
    double lg = e * 6.93147180369123816490e-01 + (e * 1.90821492927058770002e-10 + log_m);
    double rad = sqrt(-2.0 * lg);
    /* cos(x): the x of rng_normal_of, bit for bit */
    double x = 2.0 * M_PI * u2;
    double k = (x * 0.63661977236758134308 + 6755399441055744.0) - 6755399441055744.0; /* nearest integer to x/(pi/2) */
    double r = fma(-k, 1.57079632679489655800e+00, x);
    r = fma(-k, 6.12323399573676603587e-17, r);
    r = fma(-k, -1.49738490485916983962e-33, r);
    double rr = r * r;
    double S = 1.0 / 355687428096000.0; /* sin r = r - r^3/3! + ... + r^17/17! */
    S = S * rr - 1.0 / 1307674368000.0; S = S * rr + 1.0 / 6227020800.0; S = S * rr - 1.0 / 39916800.0;
    S = S * rr + 1.0 / 362880.0; S = S * rr - 1.0 / 5040.0; S = S * rr + 1.0 / 120.0; S = S * rr - 1.0 / 6.0;
    double sin_r = r + r * (rr * S);
    double C = 1.0 / 20922789888000.0; /* cos r = 1 - r^2/2! + ... + r^16/16! */
    C = C * rr - 1.0 / 87178291200.0; C = C * rr + 1.0 / 479001600.0; C = C * rr - 1.0 / 3628800.0;
    C = C * rr + 1.0 / 40320.0; C = C * rr - 1.0 / 720.0; C = C * rr + 1.0 / 24.0; C = C * rr - 0.5;
    double cos_r = 1.0 + rr * C;
    int quadrant = (int)k & 3; /* cos(r + k pi/2) */
    double c = quadrant == 0 ? cos_r : quadrant == 1 ? -sin_r : quadrant == 2 ? -cos_r : sin_r;
    return std * (rad * c);
}

/* p[0, n) from `start`, on the calling thread (above). Returns how many
 * normals were recomputed the reference's way. */
static size_t rng_fill_normal_lanes(Rng start, float* p, size_t n, double std) {
    const size_t per = n / RNG_LANES; /* lane l: p[l per, (l + 1) per); the rest after, one by one */
    uint64_t state[RNG_LANES];
    for (int l = 0; l < RNG_LANES; l++) {
        state[l] = start.state;
        rng_jump(&start, 2 * (uint64_t)per);
    }
    size_t redone = 0;
    for (size_t i = 0; i < per; i++) {
        uint32_t a[RNG_LANES], b[RNG_LANES];
        float f[RNG_LANES];
        int sure[RNG_LANES];
#pragma omp simd
        for (int l = 0; l < RNG_LANES; l++) { /* two rng_u32 draws a lane */
            uint64_t s = state[l];
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            a[l] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 32);
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            b[l] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 32);
            state[l] = s;
        }
#pragma omp simd
        for (int l = 0; l < RNG_LANES; l++) {
            double v = rng_normal_fast(a[l], b[l], std);
            f[l] = (float)v;
            sure[l] = (float)(v * (1.0 - 0x1p-40)) == (float)(v * (1.0 + 0x1p-40));
        }
        for (int l = 0; l < RNG_LANES; l++) {
            if (!sure[l]) {
                f[l] = (float)(std * rng_normal_of(a[l], b[l]));
                redone++;
            }
            p[(size_t)l * per + i] = f[l];
        }
    }
    for (size_t j = RNG_LANES * per; j < n; j++) p[j] = (float)(std * rng_normal(&start));
    return redone;
}

/* p[0..n) = std * rng_normal, the numbers a loop of rng_normal would give
 * from `rng` (which ends n normals, 2n draws, further on), computed by all
 * threads: each jumps to the start of its share, and draws it the fast way
 * (rng_fill_normal_lanes). */
static size_t rng_normals_filled; /* by rng_fill_normal, in all (the start-up line: 0 on a resume) */
static void rng_fill_normal(Rng* rng, float* p, size_t n, double std) {
    Rng start = *rng;
    rng_normals_filled += n;
#pragma omp parallel
    {
        size_t T = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = n / T * t + (t < n % T ? t : n % T), hi = lo + n / T + (t < n % T);
        Rng r = start;
        rng_jump(&r, 2 * (uint64_t)lo);
        (void)rng_fill_normal_lanes(r, p + lo, hi - lo, std);
    }
    rng_jump(rng, 2 * (uint64_t)n);
}

/* Every llm.c file (model, tokenizer, token shard) and our training state
 * opens with a header of 256 little-endian int32. */
#define HEADER_INTS 256

#endif /* GPTC_UTIL_H */
