/*
 * gptc/ledger.h — the allocation ledger: every big buffer of the CPU trainer
 * is recorded here by component (bytes now, the running total, its peak),
 * so the memory plan (gptc/plan.h, --plan) can be checked against what the
 * trainer really allocated, to the byte (--plan-check 1, scripts/test_plan.sh).
 *
 * Included by train_gpt.c after gptc/util.h, before the model, whose
 * allocation sites call it (one call per site: ledger_floats, ledger_malloc,
 * ledger_free; the snapshot slots, mapped in gptc/state.h, ledger_record and
 * ledger_release). Defines: MemComponent, MEM_NAMES, Ledger, ledger,
 * ledger_record, ledger_release, ledger_floats, ledger_malloc, ledger_free,
 * ledger_mark_setup, ledger_print.
 *
 * What it counts: the bytes asked of the allocator (n floats = 4n bytes;
 * xmalloc_floats's rounding to 64 bytes and malloc's own headers are left
 * out: under 64 bytes a buffer). What it leaves out on purpose: small
 * buffers that do not grow with the model, the batch or the data (a few
 * ints per rank or per shard name, MPI's request arrays), the GEMM's
 * per-thread packing buffers (thread-local, allocated by whichever threads
 * get work: the plan estimates them beside the ledger), transient buffers of
 * a resume (gptc/saver.h) and of the start-up print of the data's entropy.
 * The main thread records; the saver's threads allocate nothing here.
 */
#ifndef GPTC_LEDGER_H
#define GPTC_LEDGER_H

#include "util.h"

typedef enum {
    MEM_PARAMETERS,  /* the weights: P floats, padded to W x shard under ZeRO */
    MEM_GRADIENTS,   /* P floats; the padded buffer under ZeRO-1; the head's only under ZeRO-2 */
    MEM_ADAMW,       /* the moments m and v: P floats each, a shard each under ZeRO */
    MEM_ZERO,        /* ZeRO: the summed gradient of this rank's shard; ZeRO-2's two one-layer buckets */
    MEM_ACTIVATIONS, /* activation_sizes, for a batch of B x T */
    MEM_SCRATCH,     /* backward_sizes: activation gradients, one layer at a time */
    MEM_DATA,        /* the data loaders: a shard's tokens and sample order, one micro-batch of inputs/targets */
    MEM_SNAPSHOTS,   /* the saver: snapshot slots (own, replicas), rank 0's copy of the weights for model files */
    MEM_SAMPLER,     /* generation: the KV cache, the sort buffer, the tokens drawn (while sampling only) */
    MEM_COMPONENTS
} MemComponent;

static const char* const MEM_NAMES[MEM_COMPONENTS] = {
    "parameters", "gradients", "AdamW moments", "ZeRO buffers", "activations",
    "backward scratch", "data loader", "snapshots", "sampler"};

/* Live buffers at most (a model, its training state, two loaders, the
 * saver's slots and a KV cache take about 30). */
#define LEDGER_ENTRIES 256

typedef struct {
    const void* p;
    size_t bytes;
    int component;
} LedgerEntry;

typedef struct {
    LedgerEntry live[LEDGER_ENTRIES];
    int num_live;
    size_t now[MEM_COMPONENTS];   /* bytes held now, by component */
    size_t total, peak;           /* bytes held now, and the most ever held at once */
    size_t setup[MEM_COMPONENTS]; /* `now` when training was set up (ledger_mark_setup) */
    size_t setup_total;
    int setup_marked;
} Ledger;

static Ledger ledger;

/* Forget p: the bytes it held (0 when it was not recorded). */
static size_t ledger_release(const void* p) {
    if (!p) return 0;
    for (int i = 0; i < ledger.num_live; i++) {
        LedgerEntry* e = &ledger.live[i];
        if (e->p != p) continue;
        size_t bytes = e->bytes;
        ALWAYS(ledger.now[e->component] >= bytes && ledger.total >= bytes);
        ledger.now[e->component] -= bytes;
        ledger.total -= bytes;
        *e = ledger.live[--ledger.num_live];
        return bytes;
    }
    return 0;
}

/* p (bytes) now belongs to `c`. An address recorded before and freed
 * without the ledger (a test swapping buffers) is replaced, not doubled. */
static void ledger_record(MemComponent c, const void* p, size_t bytes) {
    if (!p) return;
    ledger_release(p);
    CHECK(ledger.num_live < LEDGER_ENTRIES, "the allocation ledger is full (%d live buffers): raise LEDGER_ENTRIES",
          LEDGER_ENTRIES);
    LedgerEntry e = {p, bytes, (int)c};
    ledger.live[ledger.num_live++] = e;
    ledger.now[c] += bytes;
    ledger.total += bytes;
    if (ledger.total > ledger.peak) ledger.peak = ledger.total;
}

/* n floats, 64-byte aligned (xmalloc_floats), recorded as 4n bytes. */
static float* ledger_floats(MemComponent c, size_t n) {
    float* p = xmalloc_floats(n);
    ledger_record(c, p, n * sizeof(float));
    return p;
}

static void* ledger_malloc(MemComponent c, size_t bytes) {
    void* p = xmalloc(bytes);
    ledger_record(c, p, bytes);
    return p;
}

static void ledger_free(void* p) {
    ledger_release(p);
    free(p);
}

/* Training is set up: keep what each component holds now (the plan's
 * "after setup" column is checked against it). */
static void ledger_mark_setup(void) {
    memcpy(ledger.setup, ledger.now, sizeof(ledger.now));
    ledger.setup_total = ledger.total;
    ledger.setup_marked = 1;
}

/* The ledger as a table (--verbose 1, --plan-check 1). */
static void ledger_print(FILE* out, const char* title) {
    double mb = 1.0 / (1024.0 * 1024.0);
    fprintf(out, "%s (bytes this rank allocated, by component):\n", title);
    for (int c = 0; c < MEM_COMPONENTS; c++)
        if (ledger.now[c]) fprintf(out, "  %-18s %14zu  (%.1f MB)\n", MEM_NAMES[c], ledger.now[c], ledger.now[c] * mb);
    fprintf(out, "  %-18s %14zu  (%.1f MB); peak so far %zu (%.1f MB)\n", "total", ledger.total, ledger.total * mb,
            ledger.peak, ledger.peak * mb);
}

#endif /* GPTC_LEDGER_H */
