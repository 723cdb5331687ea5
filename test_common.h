/*
 * test_common.h — what test_gpt.c and test_gpt.cu share: the check counter,
 * the tensor comparison, the reader of the PyTorch reference file written
 * by scripts/gpt2_reference.py (format documented there), and the helpers of
 * the tests that run the trainer binaries (files, shards, commands). Include
 * it after train_gpt.c (it uses read_exact, xmalloc_floats, file_size,
 * FILE_ERROR, SHARD_MAGIC). The check counter itself is test_check.h.
 */
#ifndef TEST_COMMON_H
#define TEST_COMMON_H
#include <sys/wait.h> /* run_capture's exit status */
#include "test_check.h" /* defines: check, checkf, tests_passed, tests_failed */

/* Compare a tensor to its reference: the worst element's error relative to
 * the reference tensor's largest magnitude must be <= tol. Fills `detail`
 * with the worst element. Returns 1 if within tolerance. */
/* The worst element's error relative to the reference's largest magnitude;
 * infinite when `got` holds a NaN or an infinity. *at gets its index. */
static double tensor_worst(const float* got, const float* want, size_t n, size_t* at, double* maxref_out) {
    double maxref = 0.0, worst = 0.0;
    *at = 0;
    for (size_t i = 0; i < n; i++) { /* not fmax: gcc 12's aarch64 vectoriser fails on that reduction */
        double a = fabs((double)want[i]);
        if (a > maxref) maxref = a; /* a NaN is passed over, as fmax does */
    }
    if (maxref == 0.0) maxref = 1.0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        double e = isfinite(got[i]) ? fabs((double)got[i] - (double)want[i]) / maxref : INFINITY;
        if (e > worst) { worst = e; best = i; } /* the first infinity wins over every finite error */
    }
    *at = best;
    if (maxref_out) *maxref_out = maxref;
    return worst;
}

/* Is the worst element within tol? Fills `detail` with it. */
static int tensor_close(const float* got, const float* want, size_t n, double tol, char* detail, size_t cap) {
    size_t at;
    double maxref;
    double worst = tensor_worst(got, want, n, &at, &maxref);
    snprintf(detail, cap, "worst rel err %.2e (tol %.0e) at [%zu]: got %.9g want %.9g (max|ref| %.3g)",
             worst, tol, at, n ? got[at] : 0.0f, n ? want[at] : 0.0f, maxref);
    return worst <= tol;
}

static void check_close(const char* what, const float* got, const float* want, size_t n, double tol) {
    char detail[256];
    int ok = tensor_close(got, want, n, tol, detail, sizeof(detail));
    check(ok, what, detail);
}

/* ---------------------------------------------------------------------- */
/* The PyTorch reference file (see scripts/gpt2_reference.py)             */
/* ---------------------------------------------------------------------- */
#define REF_MAGIC 20261101
typedef struct {
    int B, T, steps, V, Vp, warmup, schedule;
    long long P;
    float lr, beta1, beta2, eps, weight_decay, grad_clip, final_lr_frac;
    int* x;          /* (B, T) */
    int* y;          /* (B, T) */
    float* logits;   /* (B, T, Vp) */
    float loss;
    float* grads;    /* (P) */
    float* losses;   /* (steps) */
    float* norms;    /* (steps) */
    float* final_params; /* (P) */
} Reference;

static float float_from_bits(int32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static int reference_read(Reference* r, const char* path) {
    memset(r, 0, sizeof(*r));
    FILE* f = fopen(path, "rb");
    if (!f) { FILE_ERROR(path, "cannot open reference: %s", strerror(errno)); return -1; }
    int32_t h[256];
    if (read_exact(f, h, sizeof(h), path) != 0) { fclose(f); return -1; }
    if (h[0] != REF_MAGIC || h[1] != 1) {
        FILE_ERROR(path, "not a reference file (magic %d version %d)", h[0], h[1]);
        fclose(f);
        return -1;
    }
    r->B = h[2]; r->T = h[3]; r->steps = h[4]; r->V = h[5]; r->Vp = h[6]; r->P = h[7];
    r->warmup = h[8]; r->schedule = h[9];
    r->lr = float_from_bits(h[16]); r->beta1 = float_from_bits(h[17]); r->beta2 = float_from_bits(h[18]);
    r->eps = float_from_bits(h[19]); r->weight_decay = float_from_bits(h[20]);
    r->grad_clip = float_from_bits(h[21]); r->final_lr_frac = float_from_bits(h[22]);
    size_t BT = (size_t)r->B * r->T;
    long long expect = 1024 + 8LL * BT + 4LL * (long long)BT * r->Vp + 4 + 4LL * r->P * 2 + 8LL * r->steps;
    if (file_size(f) != expect || r->B < 1 || r->T < 1 || r->steps < 1 || r->P < 1) {
        FILE_ERROR(path, "size %lld does not match its header (expected %lld)", file_size(f), expect);
        fclose(f);
        return -1;
    }
    r->x = (int*)xmalloc(4 * BT);
    r->y = (int*)xmalloc(4 * BT);
    r->logits = xmalloc_floats(BT * r->Vp);
    r->grads = xmalloc_floats((size_t)r->P);
    r->losses = xmalloc_floats((size_t)r->steps);
    r->norms = xmalloc_floats((size_t)r->steps);
    r->final_params = xmalloc_floats((size_t)r->P);
    int rc = read_exact(f, r->x, 4 * BT, path) || read_exact(f, r->y, 4 * BT, path) ||
             read_exact(f, r->logits, 4 * BT * r->Vp, path) || read_exact(f, &r->loss, 4, path) ||
             read_exact(f, r->grads, 4 * (size_t)r->P, path) || read_exact(f, r->losses, 4 * (size_t)r->steps, path) ||
             read_exact(f, r->norms, 4 * (size_t)r->steps, path) ||
             read_exact(f, r->final_params, 4 * (size_t)r->P, path);
    fclose(f);
    return rc ? -1 : 0;
}

static void reference_free(Reference* r) {
    free(r->x); free(r->y); free(r->logits); free(r->grads); free(r->losses); free(r->norms);
    free(r->final_params);
}


/* ---- files and commands, for the tests that run the trainer binaries ---- */

/* A whole file, NUL-terminated so that text files can be searched with strstr
 * (*n excludes the terminator). NULL if it cannot be opened. */
static unsigned char* read_all(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    long long sz = file_size(f);
    unsigned char* buf = (unsigned char*)xmalloc((size_t)(sz < 0 ? 0 : sz) + 1);
    *n = sz < 0 ? 0 : fread(buf, 1, (size_t)sz, f);
    buf[*n] = 0;
    fclose(f);
    return buf;
}

static int files_equal(const char* a, const char* b) {
    size_t na = 0, nb = 0;
    unsigned char* x = read_all(a, &na);
    unsigned char* y = read_all(b, &nb);
    int eq = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return eq;
}

/* Write a shard of `n` tokens: token i = (i * 7 + seed) % V */
static void write_shard(const char* path, int n, int V, int seed, int32_t magic, int version, int claimed) {
    int32_t h[256];
    memset(h, 0, sizeof(h));
    h[0] = magic;
    h[1] = version;
    h[2] = claimed;
    uint16_t* tok = (uint16_t*)xmalloc(2 * (size_t)n);
    for (int i = 0; i < n; i++) tok[i] = (uint16_t)((i * 7 + seed) % V);
    FILE* f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    CHECK(fwrite(h, 4, 256, f) == 256 && fwrite(tok, 2, (size_t)n, f) == (size_t)n && fclose(f) == 0, "write %s", path);
    free(tok);
}

/* Run a shell command, capture stdout+stderr into out (truncated), return
 * its exit status. */
static int run_capture(const char* cmd, char* out, size_t cap) {
    char full[2048];
    snprintf(full, sizeof(full), "%s 2>&1", cmd);
    FILE* p = popen(full, "r");
    if (!p) return -1;
    size_t n = 0;
    int ch;
    while ((ch = fgetc(p)) != EOF) {
        if (n + 1 == cap) { /* keep the tail: the end of a run is what the checks read */
            memmove(out, out + cap / 2, n - cap / 2);
            n -= cap / 2;
        }
        out[n++] = (char)ch;
    }
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif /* TEST_COMMON_H */
