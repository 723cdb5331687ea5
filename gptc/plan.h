/*
 * gptc/plan.h — the CPU trainer's memory plan: the bytes each rank will
 * hold, by component, in closed form over the knobs (the model's L, C, NH,
 * V, Vp, maxT; B and T; the ranks and the ZeRO stage; the saver's slots;
 * sampling; the data's shards), computed with the size functions the
 * allocators call themselves (parameter_count, dist_geometry,
 * activation_sizes, backward_sizes, tensors_floats, dataloader_order_bytes,
 * state_bytes and dist_slice with the saver's OWN_SLOTS/HELD_SLOTS,
 * kvcache_sizes), so the plan and the allocation cannot drift apart; the
 * allocation ledger (gptc/ledger.h) proves it byte for byte (--plan-check 1,
 * scripts/tests/test_plan.sh).
 *
 * --plan prints the plan for the flags given, checks it against
 * --memory-budget, and lists candidate configurations for the global batch
 * (micro-batch B from the divisors, gradient accumulation making up the
 * rest; with several ranks ZeRO 0, 1, 2 and 3, and with several nodes on
 * ZeRO 3 hpZ, and with --auto-quantise 1 qwZ INT8 + hpZ and qwZ INT8 + hpZ +
 * qgZ INT4: PLAN_MODES) with their peak bytes, the bytes they send per step
 * at each level and their step time from the runtime model
 * (gptc/runtime.h, with the links measured or stated by --link-gbs),
 * chooses the fastest that fits, then exits; --auto 1 trains with that
 * choice (B, the total, --zero and ZeRO++'s flags set in the options as if
 * given, before zeropp_init reads them), and --snapshot-every auto sets the
 * Young/Daly interval (plan_runtime). With several nodes of equal size and
 * --hierarchical -1 (auto, the default) every mode whose reduction it
 * changes (all but qgZ's, which has its own two hops) is weighed twice,
 * hierarchical and flat ("+flat" in the table), and --auto 1 sets the
 * winner's --hierarchical; --hierarchical 0 or 1 given is kept as given.
 *
 * Bytes are allocated bytes, and they are also resident bytes: every buffer
 * in the plan is written in full at setup (zeroed or copied), in the first
 * step (activations, scratch, the sampler's buffers when it runs) or, for
 * the snapshot slots, page by page behind the first steps (the fast start's
 * preparer: --plan-check waits for it), so after that the resident
 * memory is the plan plus what the process holds besides (program, libc,
 * OpenMP and MPI, the GEMM's packing buffers: estimated here, one per
 * thread). The peak is the largest of: the total after setup plus the
 * sampler's buffers (rank 0, while it samples), and under ZeRO the moment
 * the weights are copied into their padded buffer (both copies and the
 * loaders held then). Left out: a resume's transient read buffer (12 bytes
 * per parameter of the rank's slice, gptc/saver.h) and the tokenizer.
 *
 * Included by train_gpt.c in section 8, after gptc/saver.h and
 * gptc/runtime.h. Defines: PlanKnobs, CpuMemoryPlan, cpu_memory_plan,
 * plan_after_setup, plan_check, PlanChoice, PLAN_MODES, plan_comm_knobs,
 * plan_mode_name, plan_choose, snapshot_auto_say, plan_runtime,
 * train_memory_print, train_comm_print.
 */
#ifndef GPTC_PLAN_H
#define GPTC_PLAN_H

#include "util.h"
#include "ledger.h"
#include "runtime.h"

/* What the plan depends on, for one rank. */
typedef struct {
    GPT2Config config;
    int B, T;
    int rank, world, zero;
    int saving;          /* --output-dir given: the saver maps its slot(s); rank 0 keeps a copy of the weights */
    int snapshots;       /* --snapshot-every > 0: three own slots in shm, two replica slots with several ranks */
    int sampling;        /* --sample-every > 0: rank 0 samples (sample_length tokens) */
    int sample_length;
    int threads;         /* for the GEMM estimate */
    int nodes;           /* --topology's N (1 without one); ZeRO++'s flags (gptc/zeropp.h's buffers) */
    int qwz, qgz, qgz_feedback, hpz, quant_block;
    int loaders;         /* 1, or 2 with validation data */
    int shards[2];       /* per loader (train, val): shards, and the largest one's tokens */
    long long max_tokens[2];
} PlanKnobs;

typedef struct {
    size_t setup[MEM_COMPONENTS]; /* held once training is set up, by component (gptc/ledger.h's names) */
    size_t setup_total;
    size_t sampler;               /* held besides while rank 0 samples */
    size_t repad;                 /* ZeRO: held while the weights are copied into their padded buffer */
    size_t peak;                  /* the most held at once */
    size_t gemm;                  /* an estimate outside the ledger: one GEMM packing buffer per thread */
} CpuMemoryPlan;

static void cpu_memory_plan(CpuMemoryPlan* p, const PlanKnobs* k) {
    const GPT2Config* c = &k->config;
    memset(p, 0, sizeof(*p));
    Dist d;
    memset(&d, 0, sizeof(d));
    d.rank = k->rank;
    d.world = k->world;
    d.zero = k->zero;
    dist_geometry(&d, c);
    size_t P = parameter_count(c), F = sizeof(float);
    p->setup[MEM_PARAMETERS] = d.param_floats * F;
    p->setup[MEM_GRADIENTS] = d.grad_alloc * F;
    p->setup[MEM_ADAMW] = 2 * d.moment_floats * F;
    p->setup[MEM_ZERO] = d.zero ? (d.shard + (d.zero >= 2 ? 2 * d.layer_floats : 0)) * F : 0;
    if (d.zero == 3) p->setup[MEM_ZERO] += (d.head_floats + 2 * d.layer_floats) * F; /* gathered (gptc/zero3.h) */
    ZeroPPSizes zpp = zeropp_sizes(&d, c, k->nodes, k->qwz, k->qgz, k->qgz_feedback, k->hpz, k->quant_block);
    p->setup[MEM_ZERO] += (zpp.secondary + zpp.residual + zpp.partial) * F + zpp.slot_buffers * zpp.slots +
                          zpp.gather; /* ZeRO++ */
    size_t sizes[NUM_ACTIVATION_TENSORS > NUM_KVCACHE_TENSORS ? NUM_ACTIVATION_TENSORS : NUM_KVCACHE_TENSORS];
    activation_sizes(sizes, c, k->B, k->T);
    p->setup[MEM_ACTIVATIONS] = tensors_floats(sizes, NUM_ACTIVATION_TENSORS) * F;
    backward_sizes(sizes, c, k->B, k->T);
    p->setup[MEM_SCRATCH] = tensors_floats(sizes, NUM_BACKWARD_TENSORS) * F;
    for (int l = 0; l < k->loaders; l++) /* dataloader_init: shard table, order, inputs, targets; one shard loaded */
        p->setup[MEM_DATA] += (sizeof(long long) + sizeof(int)) * (size_t)k->shards[l] +
                              2 * sizeof(int) * (size_t)k->B * k->T + 2 * (size_t)k->max_tokens[l] +
                              dataloader_order_bytes(k->max_tokens[l], k->T);
    if (k->saving) { /* saver_init */
        p->setup[MEM_SNAPSHOTS] = (k->snapshots ? OWN_SLOTS : 1) * state_bytes(d.save_hi - d.save_lo);
        if (k->snapshots && k->world > 1) {
            size_t lo, hi;
            dist_slice(&d, P, (k->rank + k->world - 1) % k->world, &lo, &hi);
            p->setup[MEM_SNAPSHOTS] += HELD_SLOTS * state_bytes(hi - lo);
        }
        if (k->rank == 0) p->setup[MEM_SNAPSHOTS] += P * F;
    }
    for (int m = 0; m < MEM_COMPONENTS; m++) p->setup_total += p->setup[m];
    if (k->sampling && k->rank == 0) { /* sample_print, gpt2_generate: out, the KV cache, the sort buffer */
        kvcache_sizes(sizes, c);
        p->sampler = sizeof(int) * (size_t)k->sample_length + tensors_floats(sizes, NUM_KVCACHE_TENSORS) * F +
                     sizeof(ScoredToken) * (size_t)c->vocab_size;
        if (k->zero == 3) p->sampler += P * F; /* the weights gathered while it samples (gptc/zero3.h) */
    }
    if (d.zero) p->repad = P * F + d.param_floats * F + p->setup[MEM_DATA]; /* dist_setup_model, first in train_setup */
    p->peak = p->setup_total + p->sampler > p->repad ? p->setup_total + p->sampler : p->repad;
    p->gemm = (size_t)k->threads * sizeof(float) * (size_t)GEMM_KC * (GEMM_MC + GEMM_NC);
}

/* The knobs of this run (B, T from the options; the shards as given). */
static PlanKnobs plan_knobs(const GPT2Config* c, const Options* o, int B, int rank, int world, int zero) {
    PlanKnobs k;
    memset(&k, 0, sizeof(k));
    k.config = *c;
    k.B = B;
    k.T = o->seq_len;
    k.rank = rank;
    k.world = world;
    k.zero = zero;
    k.saving = o->output_dir[0] != '\0';
    k.snapshots = k.saving && o->snapshot_every > 0;
    k.sampling = o->sample_every > 0;
    k.sample_length = o->sample_length;
    k.threads = num_threads();
    k.nodes = 1; /* (without --topology the nodes MPI sees: one machine here, as a planned run would be) */
    if (o->topology[0] && sscanf(o->topology, "%d", &k.nodes) != 1) k.nodes = 1;
    k.qwz = o->qwz, k.qgz = o->qgz, k.qgz_feedback = o->qgz_feedback, k.hpz = o->hpz, k.quant_block = o->quant_block;
    return k;
}

/* Shards matching `pattern` and the largest one's tokens (0, 0 when none). */
static void plan_shards(const char* pattern, int* shards, long long* max_tokens) {
    glob_t g;
    *shards = 0;
    *max_tokens = 0;
    if (!pattern[0] || glob(pattern, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        long long n = 0;
        if (shard_header(g.gl_pathv[i], &n) != 0) continue;
        (*shards)++;
        if (n > *max_tokens) *max_tokens = n;
    }
    globfree(&g);
}

/* The plan's peak for every rank's knobs, the largest (rank 0's, or the
 * first ZeRO shard's), with the GEMM estimate. */
static size_t plan_peak_over_ranks(PlanKnobs k) {
    size_t worst = 0;
    for (int r = 0; r < k.world; r++) {
        CpuMemoryPlan p;
        k.rank = r;
        cpu_memory_plan(&p, &k);
        if (p.peak + p.gemm > worst) worst = p.peak + p.gemm;
    }
    return worst;
}

/* "/proc/meminfo"'s or "/proc/self/status"'s field `key` (in kB), in bytes; 0 if absent. */
static size_t plan_proc_kb(const char* path, const char* key) {
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, n = strlen(key);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            kb = (size_t)strtoull(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb * 1024;
}

/* Ranks on this node: the launcher's count (Open MPI, MPICH, Slurm, torchrun
 * style), else all of them. */
static int plan_local_ranks(int world) {
    static const char* const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE",
                                       "LOCAL_WORLD_SIZE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char* v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return world;
}

/* --memory-budget: bytes per rank, or 0 after a message. */
static size_t plan_budget(const char* s, int world, const char** how) {
    if (!strcmp(s, "auto")) {
        int local = plan_local_ranks(world);
        *how = "auto: MemAvailable / ranks on this node";
        return plan_proc_kb("/proc/meminfo", "MemAvailable") / (size_t)local;
    }
    char* end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    double scale = *end == 'K' || *end == 'k' ? 1024.0 : *end == 'M' || *end == 'm' ? 1048576.0
                 : *end == 'G' || *end == 'g' ? 1073741824.0 : 1.0;
    if (scale > 1.0) end++;
    if (end == s || *end != '\0' || errno != 0 || !(v >= 1.0) || v * scale > 1e18) {
        fprintf(stderr, "error: --memory-budget expects auto or a number of bytes (K/M/G suffixes), got \"%s\"\n", s);
        return 0;
    }
    *how = "--memory-budget";
    return (size_t)(v * scale);
}

static void plan_print(const CpuMemoryPlan* p, const PlanKnobs* k) {
    double mb = 1.0 / (1024.0 * 1024.0);
    printf("memory plan, rank %d of %d (bytes allocated, all of them written at setup or in the first step, so "
           "resident):\n", k->rank, k->world);
    for (int m = 0; m < MEM_COMPONENTS; m++)
        if (p->setup[m]) printf("  %-18s %14zu  (%.1f MB)\n", MEM_NAMES[m], p->setup[m], p->setup[m] * mb);
    printf("  %-18s %14zu  (%.1f MB)\n", "total after setup", p->setup_total, p->setup_total * mb);
    if (p->sampler) printf("  %-18s %14zu  (%.1f MB) more while rank 0 samples\n", MEM_NAMES[MEM_SAMPLER], p->sampler,
                           p->sampler * mb);
    if (p->repad) printf("  %-18s %14zu  (%.1f MB) while ZeRO pads the weights (two copies)\n", "repad", p->repad,
                         p->repad * mb);
    printf("  %-18s %14zu  (%.1f MB)\n", "peak (the ledger's)", p->peak, p->peak * mb);
    printf("  %-18s %14zu  (%.1f MB) estimate, outside the ledger: %d thread(s) x one GEMM packing buffer\n", "+ gemm",
           p->gemm, p->gemm * mb, k->threads);
    printf("  %-18s %14zu  (%.1f MB)\n", "predicted peak", p->peak + p->gemm, (p->peak + p->gemm) * mb);
}

/* Training is set up: the ledger keeps what each component holds now
 * (plan_check compares it), and --verbose 1 prints it. */
static void plan_after_setup(const Dist* d) {
    ledger_mark_setup();
    if (verbose_flag && d->rank == 0) ledger_print(stdout, "allocation ledger after setup, rank 0");
}

/* --plan-check 1, at the end of a run: the ledger against the plan, byte
 * for byte (each component after setup, and the peak), on every rank, and
 * the peak resident memory against the plan's. 0, or -1 after a message.
 * A test build's test_hook_plan_error plants one wrong byte in the plan,
 * which the check must catch (scripts/tests/test_plan.sh). */
static int plan_check(const TrainRun* r, const Options* o, const Dist* d, const GPT2* model) {
    PlanKnobs k = plan_knobs(&model->config, o, r->B, d->rank, d->world, d->zero);
    if (d->lv && d->lv->per_node > 0) k.nodes = d->lv->nodes; /* (the nodes zeropp_init saw, --topology or MPI's) */
    k.loaders = r->use_val ? 2 : 1;
    const DataLoader* dl[2] = {&r->train, &r->val};
    for (int l = 0; l < k.loaders; l++) {
        k.shards[l] = dl[l]->num_shards;
        for (int i = 0; i < dl[l]->num_shards; i++)
            if (dl[l]->shard_tokens[i] > k.max_tokens[l]) k.max_tokens[l] = dl[l]->shard_tokens[i];
    }
    CpuMemoryPlan p;
    cpu_memory_plan(&p, &k);
    test_hook_plan_error(p.setup); /* (test builds: test the tester, one byte more in a component) */
    int bad = !ledger.setup_marked;
    for (int m = 0; m < MEM_COMPONENTS; m++)
        if (ledger.setup[m] != p.setup[m]) {
            fprintf(stderr, "plan check, rank %d: %s: the ledger holds %zu bytes after setup, the plan says %zu\n",
                    d->rank, MEM_NAMES[m], ledger.setup[m], p.setup[m]);
            bad = 1;
        }
    if (ledger.peak != p.peak) {
        fprintf(stderr, "plan check, rank %d: peak: the ledger's is %zu bytes, the plan says %zu\n", d->rank,
                ledger.peak, p.peak);
        bad = 1;
    }
    size_t hwm = plan_proc_kb("/proc/self/status", "VmHWM"), predicted = p.peak + p.gemm;
    double dev = predicted ? 100.0 * ((double)hwm - (double)predicted) / (double)predicted : 0.0;
    /* every rank says it (rank 0's stdout is the log; the others' is closed) */
    fprintf(stderr, "plan check, rank %d: ledger %s plan: after setup %zu bytes, peak %zu; peak RSS (VmHWM) %zu, "
            "predicted %zu (+gemm estimate): %+.2f%%\n", d->rank, bad ? "!=" : "==", ledger.setup_total, ledger.peak,
            hwm, predicted, dev);
    return bad ? -1 : 0;
}

/* The model's shape from the flags: --model dN (with the shape flags), a
 * Hugging Face checkpoint's config.json (a folder or its .safetensors file,
 * as gpt2_load takes them), or an llm.c model file's header (fp32 or bf16).
 * 0, or -1 after a message. */
static int plan_config(const Options* o, GPT2Config* c) {
    if (depth_from_name(o->model)) {
        if (config_from_options(c, o) != 0) return -1;
    } else if (hf_is_checkpoint(o->model)) {
        if (hf_checkpoint_config(o->model, c) != 0) return -1;
    } else { /* a model file: its header is enough */
        FILE* f = file_open_read(o->model, "model file");
        int32_t h[HEADER_INTS];
        int ok = f && read_exact(f, h, sizeof(h), o->model) == 0 && model_header_check(o->model, h, file_size(f), c) > 0;
        if (f) fclose(f);
        if (!ok) return -1;
    }
    if (o->seq_len > c->max_seq_len) {
        fprintf(stderr, "error: --seq-len %d exceeds the model's max_seq_len %d\n", o->seq_len, c->max_seq_len);
        return -1;
    }
    return 0;
}

/* A candidate fits when its predicted peak is within this share of the
 * budget: the rest is for what the plan does not see (the program, libc,
 * OpenMP's stacks, Open MPI's buffers: ~43 MB per rank measured). */
#define PLAN_HEADROOM 0.95

typedef struct {
    int B, zero;
    int qwz, hpz, qgz;   /* ZeRO++ on ZeRO 3 (gptc/zeropp.h's flags) */
    int hier;            /* --hierarchical: reductions by level (several nodes) */
    long long accum, total;
    size_t need;
    double ms;
    double sent[NUM_LEVELS]; /* bytes sent per step by level, summed over the ranks (predicted) */
    StepTime st;             /* the runtime model's parts (gptc/runtime.h) */
} PlanChoice;

/* The modes --plan weighs with several ranks: ZeRO 0-3; on ZeRO 3 with
 * several nodes, hpZ alone (exact: the same floats gathered), and with
 * --auto-quantise 1 qwZ INT8 + hpZ, and qwZ INT8 + hpZ + qgZ INT4 (ZeRO++'s
 * configuration). {zero, qwz, hpz, qgz}, quantised last. */
static const int PLAN_MODES[][4] = {{0, 0, 0, 0}, {1, 0, 0, 0}, {2, 0, 0, 0}, {3, 0, 0, 0},
                                    {3, 0, 1, 0}, {3, 8, 1, 0}, {3, 8, 1, 4}};
#define PLAN_EXACT_MODES 5

/* The comm knobs of a candidate: the levels as this run has them (gptc/zero3.h: nodes of equal size, else one),
 * reduced by level when `hier`. */
static CommKnobs plan_comm_knobs(const Options* o, const Dist* d, int zero, int qwz, int hpz, int qgz, int hier) {
    CommKnobs k = comm_knobs_flat(d->world, zero, o->overlap);
    if (d->lv && d->lv->per_node > 0) {
        k.nodes = d->lv->nodes;
        k.per_node = d->lv->per_node;
        k.hierarchical = hier;
    }
    k.qwz = qwz, k.hpz = hpz, k.qgz = qgz, k.block = o->quant_block;
    return k;
}

/* "--zero 3 --hpz 1 --qwz 8 --qgz 4" (or "" on one rank) into buf, and " --hierarchical 0|1" when the planner
 * weighed both (`hier` 0 or 1; -1: it did not); `compact`: "3+hpZ+qwZ8+qgZ4" for the table, "+flat" when a flat
 * reduction was weighed beside the hierarchical one and this is it. */
static const char* plan_mode_name(char* buf, size_t size, int world, int zero, int qwz, int hpz, int qgz, int hier,
                                  int compact) {
    if (compact) snprintf(buf, size, "%d%s%s%s%s", zero, qwz ? (qwz == 8 ? "+qwZ8" : "+qwZ4") : "", hpz ? "+hpZ" : "",
                          qgz ? (qgz == 8 ? "+qgZ8" : "+qgZ4") : "", hier == 0 ? "+flat" : "");
    else if (world <= 1) snprintf(buf, size, "%s", "");
    else snprintf(buf, size, " --zero %d%s%s%s%s", zero, hpz ? " --hpz 1" : "", qwz ? (qwz == 8 ? " --qwz 8" : " --qwz 4") : "",
                  qgz ? (qgz == 8 ? " --qgz 8" : " --qgz 4") : "", hier < 0 ? "" : hier ? " --hierarchical 1" : " --hierarchical 0");
    return buf;
}

/* Whether --plan weighs flat and hierarchical reduction for this mode: several nodes of equal size, --hierarchical
 * -1 (auto), and a reduction that it changes (qgZ reduces by its own two hops either way). */
static int plan_weighs_hier(const Options* o, const Dist* d, int qgz) {
    return d->world > 1 && d->lv && d->lv->per_node > 0 && d->lv->nodes > 1 && o->hierarchical < 0 && !qgz;
}

/* A candidate's step time by part (--plan): what a measured step is compared with, part by part. */
static void plan_parts_print(const char* what, const PlanChoice* ch, int world) {
    const StepTime* t = &ch->st;
    char mode[64];
    double compute = ch->accum * (t->gemm + t->attention + t->elementwise + t->softmax + t->zero_buffers) +
                     t->optimizer + t->quant;
    printf("step by part, %s (B=%d, ZeRO %s), ms on an idle machine: GEMMs %.2f (of which fixed %.2f), attention "
           "%.2f, elementwise %.2f, cross-entropy %.2f, ZeRO buffers %.2f (each x %lld micro-batches), optimizer %.2f, "
           "quantising %.2f, collectives %.2f; at the speed now, collectives %.2f\n", what, ch->B,
           plan_mode_name(mode, sizeof(mode), world, ch->zero, ch->qwz, ch->hpz, ch->qgz, ch->hier, 1), t->gemm,
           t->weights, t->attention, t->elementwise, t->softmax, t->zero_buffers, ch->accum, t->optimizer, t->quant,
           t->idle - compute, t->comm);
}

/* --plan (print everything), --auto 1 (choose), and the runtime model's
 * candidates: rank 0 plans for every rank; the choice goes to all. Each
 * candidate splits the global batch into micro-batches of B (a divisor of
 * the sequences per rank) and, with several ranks, takes a ZeRO stage; its
 * peak bytes come from the memory plan, its step time from the runtime
 * model (gptc/runtime.h); the fastest that fits wins. 0, or -1 when nothing
 * fits (or the flags are wrong). */
static int plan_choose(const Options* o, const Dist* d, const GPT2Config* cp, const Calibration* cal, int print,
                       PlanChoice* out) {
    GPT2Config c = *cp;
    memset(out, 0, sizeof(*out));
    const char* how = "";
    size_t budget = plan_budget(o->memory_budget, d->world, &how);
    if (!budget) return -1;
    size_t usable = (size_t)(PLAN_HEADROOM * (double)budget);
    PlanKnobs k = plan_knobs(&c, o, o->batch_size, 0, d->world, o->zero);
    if (d->lv && d->lv->per_node > 0) k.nodes = d->lv->nodes;
    char train[8600], val[8600];
    snprintf(train, sizeof(train), "%s", o->train_data);
    snprintf(val, sizeof(val), "%s", o->val_data);
    if (o->data[0]) { /* --data's shard cache, when it was made (data_from_text) */
        char prefix[4200];
        snprintf(prefix, sizeof(prefix), "%s.gptc/shard", o->data);
        glob_pattern(train, sizeof(train), prefix, "_train_*.bin");
        glob_pattern(val, sizeof(val), prefix, "_val_*.bin");
    }
    plan_shards(train, &k.shards[0], &k.max_tokens[0]);
    plan_shards(val, &k.shards[1], &k.max_tokens[1]);
    k.loaders = k.shards[1] > 0 && o->val_every > 0 ? 2 : 1;
    double mb = 1.0 / (1024.0 * 1024.0);
    long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * o->seq_len * d->world;
    long long per_rank = (long long)o->seq_len * d->world;
    if (print) {
        printf("plan: model L=%d C=%d NH=%d maxT=%d V=%d Vp=%d, %zu parameters; B=%d T=%d, %d rank(s), ZeRO %d%s%s\n",
               c.num_layers, c.channels, c.num_heads, c.max_seq_len, c.vocab_size, c.padded_vocab_size,
               parameter_count(&c), k.B, k.T, k.world, k.zero, k.snapshots ? ", memory snapshots" : "",
               k.saving ? "" : ", no --output-dir (no saver buffers)");
        if (!k.shards[0])
            printf("data: no shards match %s (yet): the data loader's shard buffers are not counted\n", train);
        CpuMemoryPlan p;
        k.rank = 0;
        cpu_memory_plan(&p, &k);
        plan_print(&p, &k);
        size_t need = plan_peak_over_ranks(k);
        printf("budget: %zu bytes (%.1f MB) per rank (%s), %.0f%% of it usable (%.1f MB); this configuration needs "
               "%zu (%.1f MB, the largest rank's): %s\n", budget, budget * mb, how, 100 * PLAN_HEADROOM, usable * mb,
               need, need * mb, need <= usable ? "fits" : "does NOT fit");
    }
    if (total % per_rank != 0) {
        fprintf(stderr, "error: --total-batch-size %lld is not a multiple of T x ranks = %lld\n", total, per_rank);
        return -1;
    }
    long long S = total / per_rank; /* sequences per rank per step */
    int nodes = d->lv && d->lv->per_node > 0 ? d->lv->nodes : 1;
    int modes = d->world <= 1 ? 1 : nodes > 1 ? (o->auto_quantise ? (int)(sizeof(PLAN_MODES) / sizeof(PLAN_MODES[0]))
                                                                    : PLAN_EXACT_MODES) : 4;
    if (print) {
        printf("candidates for %lld tokens per step (%lld sequences of %d per rank per step), %.1f MB usable per rank; "
               "step time from the runtime model (gptc/runtime.h), at the speed measured now and on an idle machine; "
               "bytes sent per step by level, summed over the ranks:\n", total, S, o->seq_len, usable * mb);
        if (d->world > 1 && nodes > 1 && !o->auto_quantise)
            printf("  (ZeRO++'s quantised collectives, qwZ and qgZ, change the numerics: not candidates; --auto-quantise 1 "
                   "allows them)\n");
        else if (d->world > 1 && nodes > 1)
            printf("  (--auto-quantise 1: ZeRO++'s quantised candidates change the numerics: weights gathered as INT8, "
                   "gradients reduced as INT4)\n");
        else if (d->world > 1)
            printf("  (one node: ZeRO++ is for several, --topology NxK; %s reduction)\n",
                   d->lv && d->lv->hierarchical ? "hierarchical" : "flat");
        printf("  %8s %8s %-16s %14s %10s %5s %10s %10s %10s %13s %13s\n", "B", "accum", "ZeRO", "peak bytes", "MB", "fits",
               "ms/step", "tok/s", "idle ms", "intra bytes", "inter bytes");
    }
    PlanChoice small, given;
    memset(&small, 0, sizeof(small));
    memset(&given, 0, sizeof(given));
    for (long long B = 1; B <= S; B++) {
        if (S % B || B > INT32_MAX) continue;
        for (int mh = 0; mh < 2 * modes; mh++) { /* each mode, hierarchical (as the levels resolved it), then flat */
            int m = mh / 2, flat = mh % 2;
            int z = d->world > 1 ? PLAN_MODES[m][0] : o->zero, qwz = PLAN_MODES[m][1], hpz = PLAN_MODES[m][2];
            int qgz = PLAN_MODES[m][3];
            if (o->quant_block % 2 && (qwz == 4 || qgz == 4)) continue; /* (INT4 packs pairs: an even block) */
            int weigh = plan_weighs_hier(o, d, qgz);
            if (flat && !weigh) continue;
            int hier = flat ? 0 : d->lv && d->lv->per_node > 0 ? d->lv->hierarchical : 0;
            PlanKnobs kc = k;
            kc.B = (int)B;
            kc.zero = z;
            kc.nodes = nodes;
            kc.qwz = qwz, kc.hpz = hpz, kc.qgz = qgz, kc.qgz_feedback = qgz ? o->qgz_feedback : 0;
            if (d->world <= 1) kc.qwz = o->qwz, kc.hpz = o->hpz, kc.qgz = o->qgz; /* (one rank: the flags as given) */
            size_t n = plan_peak_over_ranks(kc);
            int fits = n <= usable;
            CommKnobs ck = plan_comm_knobs(o, d, z, kc.qwz, kc.hpz, kc.qgz, hier);
            StepTime st = runtime_step(cal, &c, (int)B, o->seq_len, (int)(S / B), &ck);
            char name[64];
            if (print)
                printf("  %8lld %8lld %-16s %14zu %10.1f %5s %10.1f %10.0f %10.2f %13.0f %13.0f\n", B, S / B,
                       plan_mode_name(name, sizeof(name), d->world, z, kc.qwz, kc.hpz, kc.qgz, weigh ? hier : -1, 1),
                       n, n * mb, fits ? "yes" : "no", st.step, total / (st.step / 1e3), st.idle, st.sent[0], st.sent[1]);
            PlanChoice cand = {(int)B, z, kc.qwz, kc.hpz, kc.qgz, weigh ? hier : -1, S / B, total, n, st.step,
                               {st.sent[0], st.sent[1]}, st};
            if (fits && (out->B == 0 || st.step < out->ms)) *out = cand;
            if (!given.B && B == o->batch_size && z == o->zero && kc.qwz == o->qwz && kc.hpz == o->hpz && kc.qgz == o->qgz)
                given = cand; /* (the flags' own configuration, when it is a candidate: its parts are printed) */
            if (!small.B || n < small.need) small = cand;
        }
    }
    char flags[96];
    if (out->B == 0) {
        fprintf(stderr, "error: nothing fits in %.0f%% of %zu bytes per rank (%s): the smallest configuration, B=%d "
                "with %lld micro-batches%s%s, needs %zu bytes (%.1f MB) per rank; give more memory (--memory-budget), "
                "more ranks with ZeRO, a shorter --seq-len or a smaller model\n", 100 * PLAN_HEADROOM, budget, how,
                small.B, small.accum, d->world > 1 ? " and" : "",
                plan_mode_name(flags, sizeof(flags), d->world, small.zero, small.qwz, small.hpz, small.qgz, small.hier, 0),
                small.need, small.need * mb);
        return -1;
    }
    if (print)
        printf("choice: --batch-size %d --total-batch-size %lld%s (%lld micro-batches per step): predicted %.1f ms "
               "per step, %.0f tokens/s, peak %.1f MB per rank (the fastest that fits); bytes sent per step: %s %.0f, "
               "%s %.0f summed over the ranks\n", out->B, total,
               plan_mode_name(flags, sizeof(flags), d->world, out->zero, out->qwz, out->hpz, out->qgz, out->hier, 0), out->accum,
               out->ms, total / (out->ms / 1e3), out->need * mb, LEVEL_NAMES[0], out->sent[0], LEVEL_NAMES[1],
               out->sent[1]);
    if (print) {
        plan_parts_print("the choice", out, d->world);
        if (given.B) plan_parts_print("as given (-b, --zero)", &given, d->world);
    }
    return 0;
}

/* --snapshot-every auto's line, for both trainers: the interval `every` (in
 * steps of step_ms), the snapshot's predicted cost snap_ms (`cost` says
 * what it counts) and --mtbf, with the expected loss and overhead. */
static void snapshot_auto_say(int every, double step_ms, double snap_ms, double mtbf_s, const char* cost) {
    double period_s = every * step_ms / 1e3;
    printf("snapshots: --snapshot-every auto = %d steps (%.1f s): Young/Daly sqrt(2 C MTBF) with a snapshot cost C "
           "= %.3g ms (predicted: %s) and --mtbf %.0f s, at %.1f ms per step (predicted); expected loss per failure "
           "%.1f s of work (half an interval), overhead %.3g%% (snapshots) + %.3g%% (lost work)\n", every, period_s,
           snap_ms, cost, mtbf_s, step_ms, period_s / 2, 100.0 * snap_ms / 1e3 / period_s, 100.0 * period_s / 2 / mtbf_s);
}

/* Before anything is built: --plan (print, choose, and the caller exits),
 * --auto 1 (set B, the total and the ZeRO stage to the choice), and
 * --snapshot-every auto (the Young/Daly interval). Every rank calls it (the
 * calibration pings the network); rank 0 chooses, and its choice is
 * everyone's. 0, or -1 after a message. */
static int plan_runtime(Options* o, Dist* d) {
    GPT2Config c;
    int ok = plan_config(o, &c) == 0;
    if (dist_sum(d, ok) < d->world - 0.5) return -1; /* (each rank that failed said why) */
    Calibration cal;
    calibration_get(&cal, &c, o->seq_len, o->output_dir, d, o->link_gbs);
    if (d->rank == 0) calibration_print(&cal);
    PlanChoice ch;
    memset(&ch, 0, sizeof(ch));
    int rc = 0;
    if (o->plan || o->auto_plan) rc = d->rank == 0 ? plan_choose(o, d, &c, &cal, o->plan, &ch) : 0;
    if (dist_sum(d, rc) < -0.5) return -1;
    if (o->plan) return 0;
    if (o->auto_plan) { /* rank 0's choice, for every rank */
        int* knobs[6] = {&ch.B, &ch.zero, &ch.qwz, &ch.hpz, &ch.qgz, &ch.hier};
        for (int i = 0; i < 6; i++) *knobs[i] = (int)dist_sum(d, d->rank == 0 ? *knobs[i] : 0);
        ch.total = (long long)dist_sum(d, d->rank == 0 ? (double)ch.total : 0.0);
        char flags[96];
        printf("auto: --batch-size %d --total-batch-size %lld%s (%lld micro-batches): predicted %.1f ms per step, "
               "%.0f tokens/s, peak %.1f MB per rank, the fastest of the candidates that fit in %.0f%% of "
               "--memory-budget %s (--plan 1 lists them); bytes sent per step: %s %.0f, %s %.0f summed over the "
               "ranks\n", ch.B, ch.total, plan_mode_name(flags, sizeof(flags), d->world, ch.zero, ch.qwz, ch.hpz, ch.qgz, ch.hier, 0),
               ch.accum, ch.ms, ch.total / (ch.ms / 1e3), ch.need / (1024.0 * 1024.0), 100 * PLAN_HEADROOM,
               o->memory_budget, LEVEL_NAMES[0], ch.sent[0], LEVEL_NAMES[1], ch.sent[1]);
        o->batch_size = ch.B; /* as if given as flags (zeropp_init reads the ZeRO++ ones next, train_gpt.c's main) */
        o->total_batch_size = (int)ch.total;
        if (d->world > 1) {
            o->zero = d->zero = ch.zero;
            o->qwz = ch.qwz, o->hpz = ch.hpz, o->qgz = ch.qgz;
            if (!o->qgz) o->qgz_feedback = 0;
            if (ch.hier >= 0) o->hierarchical = d->lv->hierarchical = ch.hier; /* (weighed: several equal nodes) */
        }
    }
    if (o->snapshot_auto) {
        long long total = o->total_batch_size > 0 ? o->total_batch_size : (long long)o->batch_size * o->seq_len * d->world;
        int accum = (int)(total / ((long long)o->batch_size * o->seq_len * d->world));
        CommKnobs ck = plan_comm_knobs(o, d, o->zero, o->qwz, o->hpz, o->qgz, d->lv && d->lv->hierarchical);
        StepTime st = runtime_step(&cal, &c, o->batch_size, o->seq_len, accum < 1 ? 1 : accum, &ck);
        double snap = runtime_snapshot_ms(&cal, &c, d->world, o->zero), interval = 0.0;
        int every = young_daly_steps(snap, o->mtbf, st.step, &interval);
        every = (int)dist_sum(d, d->rank == 0 ? every : 0); /* rank 0's figure, for all */
        o->snapshot_every = every;
        snapshot_auto_say(every, st.step, snap, o->mtbf, "the state's bytes over the calibrated bandwidth");
    }
    return 0;
}

/* The start-up and final lines of train() and gpu_train(): the memory
 * each rank holds, and what the collectives cost per step. */
/* What each rank holds, and how the ranks share the work. */
static void train_memory_print(const GPT2* model, const Dist* dist) {
    double mb = 1.0 / (1024.0 * 1024.0), P = (double)model->num_parameters;
    double opt_floats = dist->zero ? 2.0 * dist->shard : 2.0 * P, W = dist->zero == 3 ? (double)dist->shard : P;
    static const char* const modes[4] = {"allreduce", "ZeRO-1: AdamW state sharded", "ZeRO-2: AdamW state and gradients sharded",
                                         "ZeRO-3: AdamW state, gradients and weights sharded"};
    printf("memory per rank: parameters %.0f MB, gradients %.0f MB, AdamW %.0f MB, activations %.0f MB, "
           "backward scratch %.0f MB\n", W * 4 * mb, dist->grad_floats * 4 * mb, opt_floats * 4 * mb,
           model->num_activations * 4 * mb, model->num_scratch * 4 * mb);
    if (plumbing_wanted(dist) || dist->zero) printf("data parallel: %d rank(s), %s; shard %zu parameters (padded to %zu); per rank: AdamW state %.0f floats, "
           "gradients %zu floats, weights %zu floats (%zu gathered)\n", dist->world, modes[dist->zero], dist->shard,
           dist->shard * dist->world, opt_floats, dist->grad_floats, dist->param_floats,
           dist->zero == 3 ? dist->head_floats + 2 * dist->layer_floats : 0);
}

/* What the collectives cost per step, over the run (several ranks only). */
static void train_comm_print(const GPT2* model, const Dist* dist, int steps) {
    if (dist->world <= 1) return;
    double W = dist->world, wire = (W - 1) / W * (dist->reduced + dist->gathered) * sizeof(float);
    printf("communication per step: %.0f floats reduced + %.0f gathered (P = %zu), about %.0f bytes sent per rank; "
           "%.1f ms inside collectives, %.1f ms of it after backward (%.0f%% hidden)\n", dist->reduced,
           dist->gathered, model->num_parameters, wire, dist->comm_ms / steps, dist->exposed_ms / steps,
           dist->comm_ms > 0 ? fmax(0.0, 100.0 * (1.0 - dist->exposed_ms / dist->comm_ms)) : 0.0);
}

#endif /* GPTC_PLAN_H */
