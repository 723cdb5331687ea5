/*
 * gptc/ledger.h — the allocation ledger: every big buffer of the CPU trainer
 * is recorded here by component (bytes now, the running total, its peak),
 * so the memory plan (gptc/plan.h, --plan) can be checked against what the
 * trainer really allocated, to the byte (--plan-check 1, scripts/tests/test_plan.sh).
 *
 * Included by train_gpt.c after gptc/util.h, before the model, whose
 * allocation sites call it (one call per site: ledger_floats, ledger_malloc,
 * ledger_free; the snapshot slots, mapped in gptc/state.h, ledger_record and
 * ledger_release). Defines: MemComponent, MEM_NAMES, Ledger, ledger,
 * ledger_record, ledger_release, ledger_floats, ledger_malloc, ledger_free,
 * ledger_mark_setup, ledger_print; big_alloc, big_touch, huge_pages_mode
 * (the fast start: big buffers on huge pages, first-touched in parallel),
 * big_write_all (a hot spare's pages written before a failure);
 * StartupClock, startup, StartupMark, startup_begin, startup_end, startup_loaded,
 * process_cpu_ms.
 *
 * What it counts: the bytes asked of the allocator (n floats = 4n bytes;
 * xmalloc_floats's rounding to 64 bytes and malloc's own headers are left
 * out: under 64 bytes a buffer). What it leaves out on purpose: small
 * buffers that do not grow with the model, the batch or the data (a few
 * ints per rank or per shard name, MPI's request arrays), the GEMM's
 * per-thread packing buffers (thread-local, allocated by whichever threads
 * get work: the plan estimates them beside the ledger), transient buffers of
 * a resume (gptc/resume.h) and of the start-up print of the data's entropy.
 * The main thread records; the saver's threads allocate nothing here.
 */
#ifndef GPTC_LEDGER_H
#define GPTC_LEDGER_H

#include "util.h"
#include <sys/mman.h> /* mmap, madvise: big_alloc */
#include <sys/resource.h> /* getrusage: startup_loaded */

typedef enum {
    MEM_PARAMETERS,  /* the weights: P floats, padded to W x shard under ZeRO; the shard only under ZeRO-3 */
    MEM_GRADIENTS,   /* P floats; the padded buffer under ZeRO-1; the head's only under ZeRO-2 and 3 */
    MEM_ADAMW,       /* the moments m and v: P floats each, a shard each under ZeRO */
    MEM_ZERO,        /* ZeRO: the summed gradient of this rank's shard; ZeRO-2/3's two one-layer buckets;
                      * ZeRO-3's gathered weights: the head and two layers (gptc/zero3.h) */
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
    size_t mapped; /* big_alloc's mapping (munmap'd by ledger_free); 0: malloc's */
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

/* ---- The fast start: big buffers ----
 * A trainer's start-up on these VMs is page faults, not work: the first
 * touch of fresh memory runs at ~0.35 GB/s, a second pass at ~20 GB/s, and
 * GPT-2 124M's weights, gradients, moments and activations are ~2.5 GB. So
 * every buffer of BIG_ALLOC_MIN bytes or more (each one the ledger counts
 * for the weights, gradients, moments, ZeRO buffers, activations, scratch,
 * the saver's model copy) is:
 *   - mmap'd on its own, its start 2 MB-aligned (over-mapped, then the
 *     excess unmapped), its length rounded to 4 KB only: the kernel backs
 *     each whole aligned 2 MB inside it with one huge page and the tail
 *     with small ones, so resident bytes stay the ledger's (gptc/plan.h's
 *     RSS check) within 4 KB a buffer;
 *   - with GPTC_HUGE_PAGES=1, madvise(MADV_HUGEPAGE)'d, which transparent
 *     huge pages honour in the "madvise" and "always" modes (/sys/kernel/
 *     mm/transparent_hugepage/enabled; "never": small pages, same code):
 *     512x fewer faults, but slower here (huge_pages_wanted says why);
 *   - first-touched by the OpenMP threads, page by page, each thread the
 *     pages of its static share: the kernel's page clearing runs on every
 *     core, and on a NUMA host each page lands on the node of a thread that
 *     then uses it (the layers' loops split the same rows statically);
 *   - zero (fresh anonymous memory is), so callers never memset it.
 * Smaller buffers keep malloc: their faults are noise. */
#define BIG_ALLOC_MIN ((size_t)2 << 20)
#define HUGE_PAGE_BYTES ((size_t)2 << 20)

/* The transparent huge page mode, as the kernel says it ("always",
 * "madvise", "never"; "unknown" where the file is missing). */
static int huge_pages_wanted(void);

static const char* huge_pages_mode(void) {
    static char mode[16] = "";
    if (mode[0]) return mode;
    snprintf(mode, sizeof(mode), "unknown");
    FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return mode;
    char line[128] = "";
    if (fgets(line, sizeof(line), f)) {
        char* a = strchr(line, '[');
        char* b = a ? strchr(a, ']') : NULL;
        if (a && b && b - a - 1 < (long)sizeof(mode)) {
            memcpy(mode, a + 1, (size_t)(b - a - 1));
            mode[b - a - 1] = '\0';
        }
    }
    fclose(f);
    return mode;
}

/* GPTC_HUGE_PAGES=1 in the environment: ask for huge pages (above); else
 * small pages. Opt-in: in the "madvise" defrag mode a fault in such a
 * region compacts memory directly, which on a busy host costs more than
 * the huge pages save (the first touch of 1 GiB about three times slower
 * than with small pages on a loaded 2-core VM). */
static int huge_pages_wanted(void) {
    const char* v = getenv("GPTC_HUGE_PAGES");
    return v && atoi(v) == 1;
}

/* Touch one byte of every 4 KB page of p[0, bytes), the pages split among
 * the OpenMP threads statically; `write`: fault them in writable (fresh
 * memory), else read them (a shared mapping another process writes: a
 * write of what was read could undo its write). */
static void big_touch(void* p, size_t bytes, int write) {
    const long pages = (long)((bytes + 4095) / 4096);
    volatile unsigned char* base = (volatile unsigned char*)p;
    unsigned sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (long i = 0; i < pages; i++) {
        if (write) base[(size_t)i * 4096] = 0;
        else sum += base[(size_t)i * 4096];
    }
    (void)sum;
}

/* How big_populate faulted the pages in: 1 MADV_POPULATE_WRITE, 0 a touch
 * per page (a kernel before 5.14, or a refusal), -1 not yet asked. */
static int big_populate_how = -1;

/* Fault the fresh pages of p[0, bytes) in, writable, each OpenMP thread its
 * static share (the split big_touch makes, and the layers' loops: on a NUMA
 * host a page lands on the node of the thread that uses it), in one
 * madvise(MADV_POPULATE_WRITE) a thread (Linux 5.14): the kernel maps the
 * share in one call instead of one trap per page, an order of magnitude
 * faster for the same page faults and the same zeroed pages. (What the
 * populate does not pay, the hypervisor's own backing of a guest page
 * never used before, is paid by the first real write instead: the init,
 * the first step.) Where madvise
 * refuses (EINVAL: an older kernel; anything else), the share is touched
 * page by page, as before. */
static void big_populate(void* p, size_t bytes) {
    unsigned char* base = (unsigned char*)p;
    const size_t pages = (bytes + 4095) / 4096;
    int touched = 0;
#pragma omp parallel reduction(+ : touched)
    {
        size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = pages / nt * t + (t < pages % nt ? t : pages % nt), hi = lo + pages / nt + (t < pages % nt);
        int done = 0;
#ifdef MADV_POPULATE_WRITE
        if (hi > lo && big_populate_how != 0) {
            size_t end = hi * 4096 < bytes ? hi * 4096 : bytes;
            done = madvise(base + lo * 4096, end - lo * 4096, MADV_POPULATE_WRITE) == 0;
        }
#endif
        if (!done && hi > lo) {
            volatile unsigned char* v = base;
            for (size_t i = lo; i < hi; i++) v[i * 4096] = 0;
            touched = 1;
        }
    }
    if (bytes >= 4096) big_populate_how = touched ? 0 : 1;
}

/* A hot spare has the time before a failure: every page of its big
 * buffers is written once now (each page's first byte, with its own value:
 * nothing changes), so that neither the state load nor the first step after
 * its promotion pays what big_populate leaves to the first write (without
 * it, GPT-2 124M's state load writes 1.5 GB of pages for the first time:
 * scripts/bench/bench_failover.sh --gpt2 --sources spare). Private anonymous
 * memory that no other thread uses yet (the spare is still waiting). */
static void big_write_all(void) {
    for (int i = 0; i < ledger.num_live; i++) {
        const LedgerEntry* e = &ledger.live[i];
        if (!e->mapped) continue;
        volatile unsigned char* base = (volatile unsigned char*)e->p;
        const long pages = (long)(e->mapped / 4096);
#pragma omp parallel for schedule(static)
        for (long k = 0; k < pages; k++) base[(size_t)k * 4096] = base[(size_t)k * 4096];
    }
}

/* Where the start-up's time went, printed after the first step
 * (gptc/loop_tail.h's startup_print): big_alloc's own time and bytes, and each
 * phase's time without the allocations inside it (startup_begin/_end). */
enum { SU_COMM, SU_DEVICE, SU_MODEL, SU_DATA, SU_SLOTS, SU_WAIT, SU_LOAD, SU_PHASES };
static const char* const SU_NAMES[SU_PHASES] = {"communicator", "device set-up", "model init/load",
                                               "tokenizer + data", "snapshot slots", "standby wait", "state load"};
/* the phases every start-up line names, 0 ms or not (the others: only when they took time; the communicator is
 * MPI_Init under MPI, and the GPU trainer's NCCL (the rendezvous and ncclCommInitRank, the levels' splits); the
 * device set-up is the GPU trainer's: its CUDA context, its memory, cuBLASLt, the communication buffers) */
static const unsigned char SU_ALWAYS[SU_PHASES] = {0, 0, 1, 1, 1, 0, 1};
typedef struct {
    double alloc_ms;   /* in big_alloc: mmap, madvise, the first touch */
    double alloc_cpu;  /* ...its CPU time (the process's, all threads: what the load of other jobs does not move) */
    size_t alloc_bytes;
    double phase_ms[SU_PHASES];
    double phase_cpu[SU_PHASES];
    double loaded_ms;  /* time_ms() when the state was loaded (the first step starts) */
    double loaded_cpu; /* the process's CPU time by then */
    long loaded_faults, loaded_major; /* the process's page faults (minor, major) by then */
} StartupClock;

static StartupClock startup;

/* The CPU time this process has used so far, all its threads, user and
 * kernel (the page faults' clearing is kernel time), in ms. */
static double process_cpu_ms(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0.0;
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-3;
}

/* The state is loaded: the first step starts now (its time and its page
 * faults are counted from here: a first step that faults much more than
 * the next ones touches memory the set-up did not). */
static void startup_loaded(void) {
    struct rusage ru;
    startup.loaded_ms = time_ms();
    startup.loaded_cpu = process_cpu_ms();
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        startup.loaded_faults = ru.ru_minflt;
        startup.loaded_major = ru.ru_majflt;
    }
}

/* A phase begins: its mark (now, less the allocations so far); its CPU
 * mark likewise (startup_end takes both: the phase's own time in each). */
typedef struct {
    double ms, cpu;
} StartupMark;
static StartupMark startup_begin(void) {
    StartupMark m = {time_ms() - startup.alloc_ms, process_cpu_ms() - startup.alloc_cpu};
    return m;
}

/* ...and ends: its time, less the allocations inside it. */
static void startup_end(int phase, StartupMark mark) {
    startup.phase_ms[phase] += time_ms() - startup.alloc_ms - mark.ms;
    startup.phase_cpu[phase] += process_cpu_ms() - startup.alloc_cpu - mark.cpu;
}

/* `bytes` of zeroed memory, 2 MB-aligned, on huge pages where the kernel
 * offers them, first-touched in parallel (above). *mapped: the length to
 * munmap. */
static void* big_alloc(size_t bytes, size_t* mapped) {
    double t0 = time_ms(), c0 = process_cpu_ms();
    size_t len = (bytes + 4095) & ~(size_t)4095;
    size_t over = len + HUGE_PAGE_BYTES;
    unsigned char* raw = (unsigned char*)mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(raw != (unsigned char*)MAP_FAILED, "out of memory mapping %zu bytes: %s", bytes, strerror(errno));
    /* trim to the 2 MB boundary at or after raw, and to len after it */
    size_t head = (HUGE_PAGE_BYTES - ((uintptr_t)raw & (HUGE_PAGE_BYTES - 1))) & (HUGE_PAGE_BYTES - 1);
    unsigned char* p = raw + head;
    if (head) CHECK(munmap(raw, head) == 0, "munmap: %s", strerror(errno));
    if (over - head > len) CHECK(munmap(p + len, over - head - len) == 0, "munmap: %s", strerror(errno));
#ifdef MADV_HUGEPAGE
    if (len >= HUGE_PAGE_BYTES && huge_pages_wanted()) (void)madvise(p, len, MADV_HUGEPAGE); /* refused where THP is off */
#endif
    big_populate(p, len);
    *mapped = len;
    startup.alloc_ms += time_ms() - t0;
    startup.alloc_cpu += process_cpu_ms() - c0;
    startup.alloc_bytes += len;
    return p;
}

static LedgerEntry* ledger_find(const void* p) {
    for (int i = 0; p && i < ledger.num_live; i++)
        if (ledger.live[i].p == p) return &ledger.live[i];
    return NULL;
}

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
static void ledger_record(MemComponent c, void* p, size_t bytes) { /* (p not const: gcc warns of a fresh, unwritten buffer passed as const) */
    if (!p) return;
    LedgerEntry* old = ledger_find(p);
    size_t mapped = old ? old->mapped : 0; /* re-recorded (gpt2_init_with): still big_alloc's */
    ledger_release(p);
    CHECK(ledger.num_live < LEDGER_ENTRIES, "the allocation ledger is full (%d live buffers): raise LEDGER_ENTRIES",
          LEDGER_ENTRIES);
    LedgerEntry e = {p, bytes, (int)c, mapped};
    ledger.live[ledger.num_live++] = e;
    ledger.now[c] += bytes;
    ledger.total += bytes;
    if (ledger.total > ledger.peak) ledger.peak = ledger.total;
}

/* n zeroed floats, recorded as 4n bytes: 64-byte aligned (xmalloc_floats,
 * then memset: small), or from BIG_ALLOC_MIN bytes on big_alloc's (huge
 * pages, touched in parallel, zero without a memset). */
static float* ledger_floats(MemComponent c, size_t n) {
    size_t bytes = n * sizeof(float), mapped = 0;
    float* p;
    if (bytes >= BIG_ALLOC_MIN) {
        p = (float*)big_alloc(bytes, &mapped);
    } else {
        p = xmalloc_floats(n);
        memset(p, 0, bytes);
    }
    ledger_record(c, p, bytes);
    ledger_find(p)->mapped = mapped;
    return p;
}

static void* ledger_malloc(MemComponent c, size_t bytes) {
    void* p = xmalloc(bytes);
    ledger_record(c, p, bytes);
    return p;
}

static void ledger_free(void* p) {
    LedgerEntry* e = ledger_find(p);
    size_t mapped = e ? e->mapped : 0;
    ledger_release(p);
    if (mapped) CHECK(munmap(p, mapped) == 0, "munmap: %s", strerror(errno));
    else free(p);
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
