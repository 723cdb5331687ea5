/*
 * gptc/cli.h — the command line: one table of flags drives the parser, the
 * defaults and the usage text; the checks on flags; and the set-up the
 * flags ask for (the model, the sampling settings, the tokenizer files,
 * --data's shard cache).
 *
 * Included by train_gpt.c in section 8, before its training loop: besides
 * the flags it builds what they ask for from what train_gpt.c defined above
 * (ScheduleKind, the GPT2 model and its init, SamplingConfig); train_gpt.cu
 * and test_gpt.c use it through train_gpt.c. Defines: Options, verbose_flag,
 * OptSpec, OPTION_SPECS, usage, option_set, option_find, options_parse,
 * schedule_parse, depth_from_name, link_rates_parse, options_problem, options_cpu_problem
 * (the GPU-only flags are in the one table, marked); config_from_options, model_from_options,
 * sampling_from_options, tokenizer_setup, data_stamp, data_from_text.
 */
#ifndef GPTC_CLI_H
#define GPTC_CLI_H

#include "util.h"
#include "tokenizer.h"
#include "text_data.h"

/* One table drives the parser, the defaults and the usage text, so they
 * cannot drift apart. Each flag has a long name; llm.c's one-letter flags
 * are accepted as aliases where llm.c has them. */

typedef struct {
    /* files */
    const char* train_data;
    const char* val_data;
    const char* model;
    const char* output_dir;
    const char* tokenizer;
    const char* merges;
    const char* data;
    const char* prompt;
    const char* convert;
    const char* log_file;
    const char* heartbeat;
    /* model shape overrides for a random init from a depth */
    int num_layers, channels, num_heads, max_seq_len, vocab_size;
    /* batch */
    int batch_size, seq_len, total_batch_size, steps;
    /* schedule and optimizer */
    float lr;
    int warmup_steps;
    float final_lr_frac;
    const char* lr_schedule;
    float decay_frac;
    float weight_decay;
    int decay_all;
    float beta1, beta2, eps, grad_clip;
    /* evaluation and sampling */
    int val_every, val_batches;
    const char* eval_file;   /* multiple choice (HellaSwag): gptc/eval_data.h */
    int eval_every;
    const char* eval_detail;
    int sample_every, sample_length;
    float temperature;
    int top_k;
    float top_p;
    /* run */
    int save_every, seed, shuffle, threads;
    int zero, overlap;
    const char* topology; /* "NxK" nodes x ranks, "" = the shared-memory nodes (gptc/zero3.h) */
    int hierarchical, comm_levels;
    int qwz, qgz, qgz_feedback, hpz, quant_block; /* ZeRO++ on --zero 3 (gptc/zeropp.h) */
    int resume, stop_at, keep_last, keep_every;
    int snapshot_every, save_async, rollback_after;
    const char* shm_dir;
    const char* standby; /* a hot spare's FIFO (scripts/supervise.py --spare 1) */
    float spike_z;
    int verbose;
    /* the memory plan (gptc/plan.h) */
    int plan, plan_check;
    const char* memory_budget;
    /* the runtime model (gptc/runtime.h) */
    int auto_plan;
    int auto_quantise;   /* --auto-quantise 1: --plan/--auto may choose ZeRO++'s quantised collectives */
    const char* link_gbs; /* --link-gbs "INTRA,INTER": stated link rates (GB/s) over the measured ones */
    int snapshot_auto;   /* --snapshot-every auto: snapshot_every is set at start (plan_runtime) */
    double mtbf;
    /* GPU only (train_gpt_cu: train_gpt refuses them, options_cpu_problem) */
    int gelu_fusion, recompute, cuda_graphs;
    int offload;         /* --offload 1: the GPU's optimizer on the host (train_gpt.cu G8) */
    const char* init;
    double init_timeout, comm_timeout;
    const char* gpu_flag; /* the first GPU-only flag given, or NULL */
} Options;

/* --verbose 1 or a --heartbeat: say the plumbing (see plumbing_wanted) */
static int verbose_flag = 0;

typedef enum { OPT_INT, OPT_FLOAT, OPT_DOUBLE, OPT_STRING } OptType;
typedef struct {
    const char* name;  /* --long-name */
    const char* alias; /* llm.c's -x, or NULL */
    OptType type;
    size_t offset;
    const char* def;
    const char* help;
    int gpu;           /* 1: a flag of train_gpt_cu only */
} OptSpec;

#define OPT(name, alias, type, field, def, help) {name, alias, type, offsetof(Options, field), def, help, 0}
#define GPU_OPT(name, type, field, def, help) {name, NULL, type, offsetof(Options, field), def, help, 1}
static const OptSpec OPTION_SPECS[] = {
    OPT("--train-data", "-i", OPT_STRING, train_data, "data/*_train_*.bin", "training token shards (a file or a quoted glob)"),
    OPT("--val-data", "-j", OPT_STRING, val_data, "", "validation token shards; empty = no validation"),
    OPT("--model", "-e", OPT_STRING, model, "d12", "llm.c checkpoint to load; a Hugging Face GPT-2 folder (config.json + model.safetensors) or its .safetensors file; or dN for a random GPT-2 of depth N (d12 = 124M, d24, d36, d48)"),
    OPT("--output-dir", "-o", OPT_STRING, output_dir, "", "where checkpoints go (created if missing); empty = save nothing"),
    OPT("--data", NULL, OPT_STRING, data, "", "train on a text file, a folder of .txt files or a .jsonl file: tokenized once into <data>.gptc/ beside it; replaces --train-data/--val-data"),
    OPT("--convert", NULL, OPT_STRING, convert, "", "write --model to this path and exit: NAME.bin = llm.c fp32 model file, else a folder for Hugging Face's config.json + model.safetensors"),
    OPT("--prompt", NULL, OPT_STRING, prompt, "", "generate a continuation of this text with --model and exit (no training)"),
    OPT("--tokenizer", NULL, OPT_STRING, tokenizer, "data/tokenizer/gpt2_tokenizer.bin", "llm.c tokenizer file (decode), for samples"),
    OPT("--merges", NULL, OPT_STRING, merges, "data/tokenizer/gpt2_merges.bin", "BPE merges file (encode), for --data and --prompt"),
    OPT("--log-file", NULL, OPT_STRING, log_file, "", "JSONL log: one line per step and per evaluation; empty = none"),
    OPT("--heartbeat", NULL, OPT_STRING, heartbeat, "", "rank 0 rewrites this file after every step (step, time): a supervisor that sees it go stale knows the run hangs; empty = none"),
    OPT("--num-layers", NULL, OPT_INT, num_layers, "0", "random init: override L of the dN config (0 = keep)"),
    OPT("--channels", NULL, OPT_INT, channels, "0", "random init: override C (0 = keep)"),
    OPT("--num-heads", NULL, OPT_INT, num_heads, "0", "random init: override NH (0 = keep)"),
    OPT("--max-seq-len", NULL, OPT_INT, max_seq_len, "0", "random init: override maxT (0 = keep, 1024)"),
    OPT("--vocab-size", NULL, OPT_INT, vocab_size, "0", "random init: override V (0 = keep, 50257); Vp = V rounded up to 128"),
    OPT("--batch-size", "-b", OPT_INT, batch_size, "4", "B: sequences per micro-batch, per process (rank)"),
    OPT("--seq-len", "-t", OPT_INT, seq_len, "64", "T: tokens per sequence (<= the model's maxT)"),
    OPT("--total-batch-size", "-d", OPT_INT, total_batch_size, "-1", "tokens per optimizer step over all ranks; a multiple of B*T*ranks (gradient accumulation); -1 = B*T*ranks"),
    OPT("--steps", "-x", OPT_INT, steps, "-1", "optimizer steps; -1 = one epoch of the training data; 0 = write the initial (untrained) model to --output-dir and stop"),
    OPT("--lr", "-l", OPT_FLOAT, lr, "3e-4", "peak learning rate"),
    OPT("--warmup-steps", "-u", OPT_INT, warmup_steps, "0", "linear warmup steps"),
    OPT("--final-lr-frac", "-q", OPT_FLOAT, final_lr_frac, "1.0", "final learning rate as a fraction of the peak"),
    OPT("--lr-schedule", NULL, OPT_STRING, lr_schedule, "cosine", "after warmup: cosine, linear, constant or wsd (warmup-stable-decay)"),
    OPT("--decay-frac", NULL, OPT_FLOAT, decay_frac, "0.2", "wsd: fraction of all steps spent decaying at the end"),
    OPT("--weight-decay", "-c", OPT_FLOAT, weight_decay, "0.0", "AdamW weight decay"),
    OPT("--decay-all", NULL, OPT_INT, decay_all, "0", "1 = decay every tensor; 0 = only 2-D weights (not biases, LayerNorms)"),
    OPT("--beta1", NULL, OPT_FLOAT, beta1, "0.9", "AdamW beta1"),
    OPT("--beta2", NULL, OPT_FLOAT, beta2, "0.95", "AdamW beta2"),
    OPT("--eps", NULL, OPT_FLOAT, eps, "1e-8", "AdamW epsilon"),
    OPT("--grad-clip", NULL, OPT_FLOAT, grad_clip, "1.0", "clip gradients to this global norm; 0 = off"),
    OPT("--val-every", "-v", OPT_INT, val_every, "20", "validate every this many steps (and at the end); 0 = never"),
    OPT("--val-batches", "-m", OPT_INT, val_batches, "20", "micro-batches per validation"),
    OPT("--eval-file", NULL, OPT_STRING, eval_file, "", "multiple-choice eval set in llm.c's format (HellaSwag: ./prepare_eval); accuracy in the log; with --steps 0: score --model and stop"),
    OPT("--eval-every", NULL, OPT_INT, eval_every, "0", "score --eval-file every this many steps (and at the first and last); 0 = at the first and last only"),
    OPT("--eval-detail", NULL, OPT_STRING, eval_detail, "", "rank 0 appends each example's four ending losses and picks here (JSONL, per evaluation); empty = none"),
    OPT("--sample-every", "-s", OPT_INT, sample_every, "20", "print a sample every this many steps; 0 = never"),
    OPT("--sample-length", "-g", OPT_INT, sample_length, "64", "tokens generated per sample and after --prompt (stops early at end-of-text or maxT)"),
    OPT("--temperature", NULL, OPT_FLOAT, temperature, "1.0", "sampling temperature; 0 = greedy"),
    OPT("--top-k", NULL, OPT_INT, top_k, "0", "sample among the k most likely tokens; 0 = all"),
    OPT("--top-p", NULL, OPT_FLOAT, top_p, "1.0", "nucleus sampling mass; 1 = off"),
    OPT("--save-every", "-n", OPT_INT, save_every, "0", "write a checkpoint (model + training state) every this many steps (and at the end) to --output-dir; 0 = only at the end"),
    OPT("--resume", NULL, OPT_INT, resume, "0", "1 = continue bit for bit from the freshest state of this run (own memory snapshot, the neighbour's replica, or disk in --output-dir); none = start fresh"),
    OPT("--keep-last", NULL, OPT_INT, keep_last, "2", "keep the training states of the last this many saves (and every --keep-every-th); 0 = keep all"),
    OPT("--keep-every", NULL, OPT_INT, keep_every, "0", "also keep the training state of every step that is a multiple of this; 0 = none"),
    OPT("--stop-at", NULL, OPT_INT, stop_at, "0", "stop after this step, saving the state, without changing the schedule (for time-limited jobs); 0 = run all --steps"),
    OPT("--snapshot-every", NULL, OPT_INT, snapshot_every, "0", "copy the training state into memory (--shm-dir, and a replica at the next rank) every this many steps: a crash then costs at most this many; 0 = off; auto = the Young/Daly interval sqrt(2 x snapshot cost x --mtbf), from the calibrated runtime model"),
    OPT("--shm-dir", NULL, OPT_STRING, shm_dir, "/dev/shm", "where memory snapshots live, created if missing (a tmpfs outlives the process, not the host)"),
    OPT("--standby", NULL, OPT_STRING, standby, "", "a hot spare (scripts/supervise.py --spare 1): do all the set-up (model, memory, data, snapshot slots), then wait, taking no lock and writing nothing, until the line 'go' arrives on this FIFO; then take the run's locks, resume and train. Another line or its end: exit 0. Several ranks: rank 0 reads the FIFO, the whole job stands by (with --resume 1, --output-dir); empty = none"),
    OPT("--save-async", NULL, OPT_INT, save_async, "1", "1 = copy snapshots while the next step computes and write them in the background; 0 = all at the step boundary"),
    OPT("--spike-z", NULL, OPT_FLOAT, spike_z, "0", "skip the update when the loss is this many standard deviations above the last 64 steps' mean; 0 = off"),
    OPT("--rollback-after", NULL, OPT_INT, rollback_after, "3", "after this many bad steps in a row (non-finite or spike), go back to the last memory snapshot, skipping the batches since; 0 = never"),
    OPT("--seed", NULL, OPT_INT, seed, "1337", "seed for the random init, shuffling and sampling"),
    OPT("--shuffle", NULL, OPT_INT, shuffle, "0", "1 = shuffle shards and samples each epoch (seeded)"),
    OPT("--threads", NULL, OPT_INT, threads, "0", "OpenMP threads; 0 = all cores"),
    OPT("--zero", NULL, OPT_INT, zero, "0", "data parallel: 0 = plain (allreduce), 1 = ZeRO-1 (AdamW state sharded over the ranks), 2 = ZeRO-2 (gradients sharded too), 3 = ZeRO-3 (weights sharded too, gathered layer by layer; on GPUs not yet run on one: checked on the CPU execution layer); on GPUs 1-3 also run on one GPU, as one rank of the sharded code"),
    OPT("--topology", NULL, OPT_STRING, topology, "", "data parallel: the ranks as N nodes of K (NxK, e.g. 2x2 for 4 ranks; rank r on node r / K): emulates several nodes on one machine; empty = the nodes MPI sees (ranks sharing memory; on GPUs the ranks on one host)"),
    OPT("--hierarchical", NULL, OPT_INT, hierarchical, "-1", "data parallel: 1 = reduce gradients by level (inside the node, across nodes on 1/K of the data, inside the node again; blocking on CPUs, on GPUs overlapped with backward, a communicator per level by ncclCommSplit, NCCL >= 2.18), 0 = flat, -1 = 1 when there is more than one node (--plan and --auto 1 weigh it against 0, and --auto 1 keeps the faster)"),
    OPT("--qwz", NULL, OPT_INT, qwz, "0", "ZeRO++ (--zero 3 only): 8 (or 4) = gather the weights as INT8 (INT4) blocks, one fp32 scale per block, dequantised on arrival (qwZ); the master weights stay fp32; 0 = fp32"),
    OPT("--qgz", NULL, OPT_INT, qgz, "0", "ZeRO++ (--zero 3 only): 4 or 8 = reduce the gradients as INT4/INT8 blocks by all-to-all inside the node, then across nodes, summed in fp32 at each hop (qgZ); 0 = fp32"),
    OPT("--qgz-feedback", NULL, OPT_INT, qgz_feedback, "0", "ZeRO++ (--qgz only): 1 = error feedback, what each hop's quantisation lost is added to the next step's (reset to 0 on resume)"),
    OPT("--hpz", NULL, OPT_INT, hpz, "0", "ZeRO++ (--zero 3 only): 1 = keep a secondary copy of the weights sharded over the ranks of the node, cut from each step's first forward gather; the other gathers (backward, later micro-batches) stay inside the node (hpZ)"),
    OPT("--quant-block", NULL, OPT_INT, quant_block, "256", "ZeRO++: elements per quantisation block (one fp32 scale each; even for INT4)"),
    OPT("--comm-levels", NULL, OPT_INT, comm_levels, "0", "1 = print the bytes each level (intra-node, inter-node) carried, every step (the totals per step are printed at the end anyway)"),
    OPT("--overlap", NULL, OPT_INT, overlap, "1", "data parallel: 1 = reduce each layer's gradients during backward, 0 = after it (ZeRO-2: always during)"),
    OPT("--verbose", NULL, OPT_INT, verbose, "0", "1 = also print start-up timing and the data-parallel layout (printed anyway with several ranks, --heartbeat, or under scripts/supervise.py)"),
    OPT("--plan", NULL, OPT_INT, plan, "0", "1 = print the memory plan (bytes per rank by component, from the same size functions the allocators use) and a table of micro-batch / ZeRO 0-3 candidates (with several nodes, ZeRO++'s --hpz/--qwz/--qgz on ZeRO 3: see --auto-quantise) for --total-batch-size with their peak bytes, bytes sent per level and predicted step time (a calibrated runtime model, --link-gbs), and the fastest that fits in 95% of --memory-budget, then exit without training (train_gpt_cu: device bytes by component, candidates over ZeRO 0-3, --recompute 0-3 and --offload, step times from a calibration on the GPU: docs/gpu.md)"),
    OPT("--memory-budget", NULL, OPT_STRING, memory_budget, "auto", "bytes per rank --plan checks against (a number, or with a K/M/G suffix: powers of 1024); auto = MemAvailable of /proc/meminfo divided by the ranks on this node"),
    OPT("--auto", NULL, OPT_INT, auto_plan, "0", "1 = train with --plan's choice: the micro-batch (and so the gradient accumulation) and, with several ranks, the ZeRO stage (and ZeRO++'s flags) predicted fastest for --total-batch-size among those that fit in 95% of --memory-budget (says so in one line); train_gpt_cu: -b, --zero 0-3, --recompute and --offload, ZeRO++ as given"),
    OPT("--auto-quantise", NULL, OPT_INT, auto_quantise, "0", "1 = --plan and --auto (the CPU trainer's planner) may also choose ZeRO++'s quantised collectives (--qwz 8, --qgz 4: they change the numerics; with more than one node, on --zero 3); 0 = only exact configurations (ZeRO 0-3, --hpz 1)"),
    OPT("--link-gbs", NULL, OPT_STRING, link_gbs, "", "INTRA,INTER: the link rates the CPU trainer's --plan and --auto assume, GB/s a rank sends inside a node and across nodes (e.g. 50,12.5), over the ones measured at start (how to plan for a cluster from one machine: with --topology NxK); empty = measured"),
    OPT("--mtbf", NULL, OPT_DOUBLE, mtbf, "86400", "mean time between failures of the job in seconds, for --snapshot-every auto (24 h: one shared node; a 16,384-GPU job saw one every ~3 h, Llama 3 paper sec. 3.3.4)"),
    OPT("--plan-check", NULL, OPT_INT, plan_check, "0", "1 = at the end of training, compare the allocation ledger with the memory plan, byte for byte, and the peak resident memory (VmHWM) with the plan's peak; exit non-zero on a mismatch (scripts/tests/test_plan.sh)"),
    GPU_OPT("--gelu-fusion", OPT_INT, gelu_fusion, "1", "1 = GELU in the cuBLASLt epilogues (GELU_AUX_BIAS / DGELU); 0 = own kernels"),
    GPU_OPT("--recompute", OPT_INT, recompute, "0", "activations backward recomputes instead of keeping them from the forward: 0 = none, 1 = GELU's output, 2 = GELU's and the LayerNorms' outputs, 3 = the whole block (keeps each layer's input only); the loss and weights are bitwise the same at every level (the memory plan printed at start says what each keeps)"),
    GPU_OPT("--offload", OPT_INT, offload, "0", "1 = optimizer offload (ZeRO-Offload, one GPU or --zero 0): the fp32 master weights and AdamW moments stay in pinned host memory, each step's gradients are copied to the host, updated by the CPU's OpenMP AdamW in the order the next forward reads them and the bf16 weights copied back, while that forward runs (each layer waits for its own); the device saves 12 bytes per parameter (not run on a GPU; checked on the CPU execution layer)"),
    GPU_OPT("--cuda-graphs", OPT_INT, cuda_graphs, "1", "1 = capture the training step (forward, backward, update) in CUDA graphs after the first step and replay them (one GPU, no --spike-z); 0 = launch every kernel each step"),
    GPU_OPT("--init", OPT_STRING, init, "auto", "one process per GPU: how the ranks meet: mpi (a build with MPI, make train_gpt_cu_mpi; under mpirun or srun --mpi=pmix), file:PATH (a path every rank sees) or tcp:HOST:PORT (rank 0's host and a free port), with rank and size from the launcher (Slurm, Open MPI, PMI, or RANK/WORLD_SIZE/LOCAL_RANK) and a run id (GPTC_RUN_ID, or Slurm's job and step); auto = mpi in an MPI build started as several ranks, else one GPU"),
    GPU_OPT("--init-timeout", OPT_DOUBLE, init_timeout, "300", "seconds to wait for every rank at a file: or tcp: rendezvous"),
    GPU_OPT("--comm-timeout", OPT_DOUBLE, comm_timeout, "1800", "several ranks: stop when a wait on a collective lasts this many seconds (a rank hung or died)"),
};
#undef OPT
#undef GPU_OPT
#define NUM_OPTIONS ((int)(sizeof(OPTION_SPECS) / sizeof(OPTION_SPECS[0])))

/* The usage text: the flags of both trainers, then those of train_gpt_cu
 * only (which train_gpt refuses). */
static void usage(FILE* out, const char* prog) {
    fprintf(out, "usage: %s [flags]\n\nTrain GPT-2 (train_gpt on the CPU, train_gpt_cu on a GPU). Flags (default in brackets):\n", prog);
    for (int gpu = 0; gpu < 2; gpu++) {
        if (gpu) fprintf(out, "GPU only (train_gpt_cu; train_gpt refuses them):\n");
        for (int i = 0; i < NUM_OPTIONS; i++) {
            const OptSpec* s = &OPTION_SPECS[i];
            if (s->gpu != gpu) continue;
            char names[64];
            snprintf(names, sizeof(names), "%s%s%s", s->name, s->alias ? ", " : "", s->alias ? s->alias : "");
            fprintf(out, "  %-24s %s [%s]\n", names, s->help, s->def[0] ? s->def : "\"\"");
        }
        if (!gpu) fprintf(out, "  %-24s %s\n", "--help, -h", "print this text");
    }
}

/* Store `value` into the field of `spec`. Returns 0, or -1 with a message. */
static int option_set(Options* o, const OptSpec* spec, const char* value) {
    char* field = (char*)o + spec->offset;
    char* end = NULL;
    errno = 0;
    if (spec->type == OPT_INT) {
        long v = strtol(value, &end, 10);
        if (end == value || *end != '\0' || errno != 0 || v < -2147483647L || v > 2147483647L) {
            fprintf(stderr, "error: %s expects an integer, got \"%s\"\n", spec->name, value);
            return -1;
        }
        int iv = (int)v;
        memcpy(field, &iv, sizeof(int));
    } else if (spec->type == OPT_FLOAT || spec->type == OPT_DOUBLE) { /* (a float read as a float: no double rounding) */
        double v = spec->type == OPT_FLOAT ? (double)strtof(value, &end) : strtod(value, &end);
        if (end == value || *end != '\0' || errno != 0 || !isfinite(v)) {
            fprintf(stderr, "error: %s expects a number, got \"%s\"\n", spec->name, value);
            return -1;
        }
        if (spec->type == OPT_FLOAT) {
            float f = (float)v; /* exact: it was a float */
            memcpy(field, &f, sizeof(float));
        } else {
            memcpy(field, &v, sizeof(double));
        }
    } else {
        memcpy(field, &value, sizeof(const char*));
    }
    return 0;
}

static const OptSpec* option_find(const char* arg) {
    for (int i = 0; i < NUM_OPTIONS; i++) {
        const OptSpec* s = &OPTION_SPECS[i];
        if (!strcmp(arg, s->name) || (s->alias && !strcmp(arg, s->alias))) return s;
    }
    return NULL;
}

/* Parse argv into *o (defaults first). Returns 0 to run, 1 for --help,
 * -1 on an error (already printed). Accepts "--flag value" and "--flag=value". */
static int options_parse(Options* o, int argc, char** argv) {
    memset(o, 0, sizeof(*o));
    for (int i = 0; i < NUM_OPTIONS; i++) ALWAYS(option_set(o, &OPTION_SPECS[i], OPTION_SPECS[i].def) == 0);
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) return 1;
        const char* value = NULL;
        char name[64];
        const char* eq = strchr(arg, '=');
        if (eq && arg[0] == '-' && arg[1] == '-' && (size_t)(eq - arg) < sizeof(name)) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
            arg = name;
        }
        const OptSpec* spec = option_find(arg);
        if (!spec) {
            fprintf(stderr, "error: unknown flag \"%s\"; run with --help for the list\n", argv[i]);
            return -1;
        }
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "error: %s needs a value\n", spec->name);
                return -1;
            }
            value = argv[++i];
        }
        if (!strcmp(spec->name, "--snapshot-every") && !strcmp(value, "auto")) {
            o->snapshot_auto = 1; /* the interval is set at start (plan_runtime); 1 until then, for the checks */
            o->snapshot_every = 1;
            continue;
        }
        if (option_set(o, spec, value) != 0) return -1;
        if (spec->gpu && !o->gpu_flag) o->gpu_flag = spec->name;
    }
    verbose_flag = o->verbose == 1 || o->heartbeat[0] != '\0';
    return 0;
}

static int schedule_parse(const char* name, ScheduleKind* kind) {
    for (int i = 0; i < 4; i++) {
        if (!strcmp(name, SCHEDULE_NAMES[i])) {
            *kind = (ScheduleKind)i;
            return 0;
        }
    }
    return -1;
}

/* "d12" -> 12; anything else -> 0 (a file path). */
static int depth_from_name(const char* name) {
    if (name[0] != 'd' || name[1] < '1' || name[1] > '9') return 0;
    char* end;
    long d = strtol(name + 1, &end, 10);
    return (*end == '\0' && d > 0 && d <= 1024) ? (int)d : 0;
}

/* Checks that need no files: ranges and combinations of flags. Returns NULL
 * if all is well, else a message naming the flags involved. */
/* --link-gbs "INTRA,INTER" into gbs[2] (when not NULL): 1 when well formed, else 0. */
static int link_rates_parse(const char* s, double* gbs) {
    char* end = NULL;
    double v[2];
    v[0] = strtod(s, &end);
    if (end == s || *end != ',') return 0;
    const char* at = end + 1;
    v[1] = strtod(at, &end);
    if (end == at || *end != '\0' || !(v[0] > 0.0 && v[0] < 1e9) || !(v[1] > 0.0 && v[1] < 1e9)) return 0;
    if (gbs) gbs[0] = v[0], gbs[1] = v[1];
    return 1;
}

#define OPTIONS_PROBLEM(cond, msg) do { if (cond) return (msg); } while (0)
static const char* options_problem(const Options* o) {
    OPTIONS_PROBLEM(o->batch_size < 1, "--batch-size must be >= 1");
    OPTIONS_PROBLEM(o->seq_len < 1, "--seq-len must be >= 1");
    OPTIONS_PROBLEM(o->total_batch_size != -1 && o->total_batch_size < 1, "--total-batch-size must be >= 1 or -1");
    OPTIONS_PROBLEM(o->total_batch_size > 0 && o->total_batch_size % (o->batch_size * o->seq_len) != 0,
                    "--total-batch-size must be a multiple of --batch-size x --seq-len (it sets the gradient accumulation)");
    OPTIONS_PROBLEM(o->steps < -1, "--steps must be >= 1, -1 for one epoch, or 0 to write the initial model");
    OPTIONS_PROBLEM(o->steps == 0 && !o->output_dir[0] && !o->eval_file[0],
                    "--steps 0 writes the initial model: give --output-dir (or --eval-file, to score --model)");
    OPTIONS_PROBLEM(o->steps == 0 && (o->resume || o->stop_at), "--steps 0 writes the initial model: it takes no --resume or --stop-at");
    OPTIONS_PROBLEM(o->eval_every < 0, "--eval-every must be >= 0");
    OPTIONS_PROBLEM(o->eval_detail[0] && !o->eval_file[0], "--eval-detail needs --eval-file");
    OPTIONS_PROBLEM(o->eval_file[0] && o->seq_len < 2, "--eval-file needs --seq-len >= 2 (a context token and an ending token)");
    OPTIONS_PROBLEM(o->verbose != 0 && o->verbose != 1, "--verbose must be 0 or 1");
    OPTIONS_PROBLEM(o->plan != 0 && o->plan != 1, "--plan must be 0 or 1");
    OPTIONS_PROBLEM(o->standby[0] && (!o->resume || !o->output_dir[0]),
                    "--standby waits to take over a run: it needs --resume 1 and the run's --output-dir");
    OPTIONS_PROBLEM(o->plan_check != 0 && o->plan_check != 1, "--plan-check must be 0 or 1");
    OPTIONS_PROBLEM(o->auto_plan != 0 && o->auto_plan != 1, "--auto must be 0 or 1");
    OPTIONS_PROBLEM(o->auto_quantise != 0 && o->auto_quantise != 1, "--auto-quantise must be 0 or 1");
    OPTIONS_PROBLEM(o->link_gbs[0] && !link_rates_parse(o->link_gbs, NULL),
                    "--link-gbs must be two rates in GB/s, INTRA,INTER (e.g. 50,12.5), each > 0");
    OPTIONS_PROBLEM(!(o->mtbf > 0.0), "--mtbf must be a number of seconds > 0");
    OPTIONS_PROBLEM(!(o->lr >= 0.0f), "--lr must be >= 0");
    OPTIONS_PROBLEM(o->warmup_steps < 0, "--warmup-steps must be >= 0");
    OPTIONS_PROBLEM(!(o->final_lr_frac >= 0.0f && o->final_lr_frac <= 1.0f), "--final-lr-frac must be in [0, 1]");
    OPTIONS_PROBLEM(!(o->decay_frac >= 0.0f && o->decay_frac <= 1.0f), "--decay-frac must be in [0, 1]");
    OPTIONS_PROBLEM(!(o->weight_decay >= 0.0f), "--weight-decay must be >= 0");
    OPTIONS_PROBLEM(o->decay_all != 0 && o->decay_all != 1, "--decay-all must be 0 or 1");
    OPTIONS_PROBLEM(!(o->beta1 >= 0.0f && o->beta1 < 1.0f), "--beta1 must be in [0, 1)");
    OPTIONS_PROBLEM(!(o->beta2 >= 0.0f && o->beta2 < 1.0f), "--beta2 must be in [0, 1)");
    OPTIONS_PROBLEM(!(o->eps > 0.0f), "--eps must be > 0");
    OPTIONS_PROBLEM(!(o->grad_clip >= 0.0f), "--grad-clip must be >= 0");
    OPTIONS_PROBLEM(o->val_every < 0, "--val-every must be >= 0");
    OPTIONS_PROBLEM(o->val_batches < 1, "--val-batches must be >= 1");
    OPTIONS_PROBLEM(o->sample_every < 0, "--sample-every must be >= 0");
    OPTIONS_PROBLEM(o->sample_length < 1, "--sample-length must be >= 1");
    OPTIONS_PROBLEM(!(o->temperature >= 0.0f), "--temperature must be >= 0");
    OPTIONS_PROBLEM(o->top_k < 0, "--top-k must be >= 0");
    OPTIONS_PROBLEM(!(o->top_p > 0.0f && o->top_p <= 1.0f), "--top-p must be in (0, 1]");
    OPTIONS_PROBLEM(o->save_every < 0, "--save-every must be >= 0");
    OPTIONS_PROBLEM(o->resume != 0 && o->resume != 1, "--resume must be 0 or 1");
    OPTIONS_PROBLEM(o->resume && !o->output_dir[0], "--resume needs --output-dir (where the states are)");
    OPTIONS_PROBLEM(o->stop_at < 0, "--stop-at must be >= 0");
    OPTIONS_PROBLEM(o->keep_last < 0 || o->keep_every < 0, "--keep-last and --keep-every must be >= 0");
    OPTIONS_PROBLEM(o->stop_at > 0 && !o->output_dir[0], "--stop-at needs --output-dir (to save the state)");
    OPTIONS_PROBLEM(o->snapshot_every < 0, "--snapshot-every must be >= 0");
    OPTIONS_PROBLEM(o->snapshot_every > 0 && !o->output_dir[0], "--snapshot-every needs --output-dir (the run's memory is named after it)");
    OPTIONS_PROBLEM(o->save_async != 0 && o->save_async != 1, "--save-async must be 0 or 1");
    OPTIONS_PROBLEM(!(o->spike_z >= 0.0f), "--spike-z must be >= 0");
    OPTIONS_PROBLEM(o->rollback_after < 0, "--rollback-after must be >= 0");
    OPTIONS_PROBLEM(o->shuffle != 0 && o->shuffle != 1, "--shuffle must be 0 or 1");
    OPTIONS_PROBLEM(o->threads < 0, "--threads must be >= 0");
    OPTIONS_PROBLEM(o->zero < 0 || o->zero > 3, "--zero must be 0, 1, 2 or 3");
    OPTIONS_PROBLEM(o->hierarchical < -1 || o->hierarchical > 1, "--hierarchical must be -1, 0 or 1");
    OPTIONS_PROBLEM(o->comm_levels != 0 && o->comm_levels != 1, "--comm-levels must be 0 or 1");
    OPTIONS_PROBLEM(o->qwz != 0 && o->qwz != 4 && o->qwz != 8, "--qwz must be 0, 4 or 8 (bits of the weights' gather)");
    OPTIONS_PROBLEM(o->qgz != 0 && o->qgz != 4 && o->qgz != 8, "--qgz must be 0, 4 or 8 (bits of the gradients' reduction)");
    OPTIONS_PROBLEM(o->hpz != 0 && o->hpz != 1, "--hpz must be 0 or 1");
    OPTIONS_PROBLEM(o->qgz_feedback != 0 && o->qgz_feedback != 1, "--qgz-feedback must be 0 or 1");
    OPTIONS_PROBLEM(o->qgz_feedback && !o->qgz, "--qgz-feedback 1 needs --qgz 4 or 8 (it feeds back qgZ's quantisation error)");
    OPTIONS_PROBLEM((o->qwz || o->qgz || o->hpz) && o->zero != 3,
                    "--qwz, --qgz and --hpz are ZeRO++, which plugs into ZeRO-3's gathers and reductions: add --zero 3");
    OPTIONS_PROBLEM(o->quant_block < 1 || ((o->qwz == 4 || o->qgz == 4) && o->quant_block % 2),
                    "--quant-block must be >= 1, and even with INT4 (two codes a byte)");
    OPTIONS_PROBLEM(o->overlap != 0 && o->overlap != 1, "--overlap must be 0 or 1");
    OPTIONS_PROBLEM(o->num_layers < 0 || o->channels < 0 || o->num_heads < 0 || o->max_seq_len < 0 || o->vocab_size < 0,
                    "--num-layers/--channels/--num-heads/--max-seq-len/--vocab-size must be >= 0");
    int overrides = o->num_layers || o->channels || o->num_heads || o->max_seq_len || o->vocab_size;
    OPTIONS_PROBLEM(overrides && !depth_from_name(o->model),
                    "--num-layers/--channels/--num-heads/--max-seq-len/--vocab-size apply to a random init "
                    "(--model dN), not to a checkpoint file, whose shape is fixed");
    ScheduleKind kind;
    OPTIONS_PROBLEM(schedule_parse(o->lr_schedule, &kind) != 0, "--lr-schedule must be cosine, linear, constant or wsd");
    OPTIONS_PROBLEM(o->gelu_fusion != 0 && o->gelu_fusion != 1, "--gelu-fusion must be 0 or 1");
    OPTIONS_PROBLEM(o->recompute < 0 || o->recompute > 3, "--recompute must be 0, 1, 2 or 3");
    OPTIONS_PROBLEM(o->offload != 0 && o->offload != 1, "--offload must be 0 or 1");
    OPTIONS_PROBLEM(o->cuda_graphs != 0 && o->cuda_graphs != 1, "--cuda-graphs must be 0 or 1");
    OPTIONS_PROBLEM(strcmp(o->init, "auto") && strcmp(o->init, "mpi") && strncmp(o->init, "file:", 5) &&
                    strncmp(o->init, "tcp:", 4), "--init must be auto, mpi, file:PATH or tcp:HOST:PORT");
    OPTIONS_PROBLEM(!(o->init_timeout > 0.0), "--init-timeout must be a number of seconds > 0");
    OPTIONS_PROBLEM(!(o->comm_timeout > 0.0), "--comm-timeout must be a number of seconds > 0");
    return NULL;
}
#undef OPTIONS_PROBLEM

/* train_gpt (the CPU trainer) refuses the flags of train_gpt_cu: a
 * message naming the first one given, or NULL. */
static const char* options_cpu_problem(const Options* o) {
    static char msg[160];
    if (!o->gpu_flag) return NULL;
    snprintf(msg, sizeof(msg), "%s is a flag of train_gpt_cu (the GPU trainer); train_gpt trains on the CPU: drop it",
             o->gpu_flag);
    return msg;
}

/* The config of --model dN with the shape flags applied (model_from_options,
 * and --plan, which needs no weights). 0, or -1 after a message. */
static int config_from_options(GPT2Config* out, const Options* o) {
    GPT2Config c = config_from_depth(depth_from_name(o->model));
    if (o->num_layers) c.num_layers = o->num_layers;
    if (o->channels) c.channels = o->channels;
    if (o->num_heads) c.num_heads = o->num_heads;
    if (o->max_seq_len) c.max_seq_len = o->max_seq_len;
    if (o->vocab_size) c.vocab_size = o->vocab_size;
    c.padded_vocab_size = round_up(c.vocab_size, 128);
    const char* problem = config_problem(&c);
    if (problem) {
        fprintf(stderr, "error: model L=%d C=%d NH=%d maxT=%d V=%d: %s\n", c.num_layers, c.channels,
                c.num_heads, c.max_seq_len, c.vocab_size, problem);
        return -1;
    }
    *out = c;
    return 0;
}

/* Build the model the options ask for: a checkpoint, or a random init. */
static int model_from_options(GPT2* model, const Options* o) {
    int depth = depth_from_name(o->model);
    if (!depth) return gpt2_load(model, o->model);
    GPT2Config c;
    if (config_from_options(&c, o) != 0) return -1;
    char run_id[4400];
    snprintf(run_id, sizeof(run_id), "%s/run.id", o->output_dir);
    if (o->resume && o->output_dir[0] && access(run_id, F_OK) == 0) {
        /* resuming a run that exists: its state will replace the weights, so
         * the random init (seconds for GPT-2 124M) waits until train() knows
         * whether there is one; zeros meanwhile, the same on every rank */
        float* params = ledger_floats(MEM_PARAMETERS, parameter_count(&c)); /* zero, on huge pages */
        gpt2_init_with(model, &c, params);
        model->init_deferred = 1;
        model->init_seed = (uint64_t)o->seed;
        return 0;
    }
    gpt2_init_random(model, &c, (uint64_t)o->seed);
    return 0;
}

static SamplingConfig sampling_from_options(const Options* o) {
    SamplingConfig s;
    s.temperature = o->temperature;
    s.top_k = o->top_k;
    s.top_p = o->top_p;
    return s;
}

/* Load the tokenizer: with the merges when text must be encoded (--data,
 * --prompt: then a missing file is an error), else decode only for samples
 * (a missing file just means samples print ids). */
static int tokenizer_setup(Tokenizer* tok, const Options* o, int vocab_size) {
    memset(tok, 0, sizeof(*tok));
    int need_encode = o->data[0] || o->prompt[0];
    if (!need_encode && o->sample_every == 0) return 0;
    if (!need_encode && access(o->tokenizer, R_OK) != 0) {
        printf("tokenizer %s not found: samples print token ids (make tokenizer fetches it)\n", o->tokenizer);
        return 0;
    }
    if (tokenizer_init(tok, o->tokenizer, need_encode ? o->merges : NULL) != 0) return -1;
    if ((int)tok->vocab_size != vocab_size) {
        fprintf(stderr, "%s: tokenizer %s has %u tokens, the model (--model %s) %d: give the tokenizer the model "
                "was trained with (--tokenizer, --merges)\n", need_encode ? "error" : "warning", o->tokenizer,
                tok->vocab_size, o->model, vocab_size);
        tokenizer_free(tok);
        if (need_encode) return -1;
        printf("samples print token ids\n");
    }
    return 0;
}

/* A fingerprint of the --data input (each file's path, size and mtime) and
 * of the tokenizer: the shard cache is reused only when it matches. */
static void data_stamp(const char* input, const Tokenizer* tok, char* out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "gptc data cache v1\ntokenizer %u tokens, %u merges, eot %u\n",
                                tok->vocab_size, tok->num_merges, tok->eot_token);
    struct stat st;
    glob_t g;
    memset(&g, 0, sizeof(g));
    const char* one[1] = {input};
    char** files = (char**)one;
    size_t nfiles = 1;
    if (stat(input, &st) == 0 && S_ISDIR(st.st_mode)) {
        char pattern[8300];
        glob_pattern(pattern, sizeof(pattern), input, "/*.txt");
        if (glob(pattern, 0, NULL, &g) == 0) { files = g.gl_pathv; nfiles = g.gl_pathc; }
    }
    for (size_t i = 0; i < nfiles && n < cap; i++) {
        if (stat(files[i], &st) != 0) continue;
        n += (size_t)snprintf(out + n, cap - n, "%s %lld %lld.%09ld\n", files[i], (long long)st.st_size,
                              (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    }
    if (g.gl_pathc) globfree(&g);
}

/* --data: tokenize the text once into <data>.gptc/ and point the train and
 * val patterns there. Reuses the cache when its stamp matches. */
static int data_from_text(const Options* o, const Tokenizer* tok, char* train_pattern, char* val_pattern, size_t cap) {
    char dir[4096], stamp_path[4200], prefix[4200], stamp[16384];
    snprintf(dir, sizeof(dir), "%s.gptc", o->data);
    snprintf(stamp_path, sizeof(stamp_path), "%s/stamp.txt", dir);
    snprintf(prefix, sizeof(prefix), "%s/shard", dir);
    glob_pattern(train_pattern, cap, prefix, "_train_*.bin"); /* <data> may hold glob characters: in[1].txt */
    glob_pattern(val_pattern, cap, prefix, "_val_*.bin");
    data_stamp(o->data, tok, stamp, sizeof(stamp));
    size_t len = 0;
    FILE* f = fopen(stamp_path, "rb");
    char* old = NULL;
    if (f) { fclose(f); old = file_read_all(stamp_path, &len); }
    int fresh = old && len == strlen(stamp) && memcmp(old, stamp, len) == 0;
    free(old);
    if (fresh) {
        printf("data: %s tokenized earlier, reusing %s\n", o->data, dir);
        return 0;
    }
    if (mkdir_p(dir) != 0) {
        FILE_ERROR(dir, "cannot create the token cache: %s", strerror(errno));
        return -1;
    }
    remove(stamp_path); /* invalid until the new shards are complete */
    char cmd[8500];
    glob_t g;
    glob_pattern(cmd, sizeof(cmd), prefix, "_*.bin");
    if (glob(cmd, 0, NULL, &g) == 0) { /* stale shards of an earlier input */
        for (size_t i = 0; i < g.gl_pathc; i++) remove(g.gl_pathv[i]);
        globfree(&g);
    }
    double t0 = time_ms();
    ShardStats st;
    if (prepare_shards(o->data, prefix, tok, 0.05, 100000000, &st) != 0) return -1;
    if (st.train_tokens == 0) { /* (the stamp stays absent: the next run tokenizes again) */
        FILE_ERROR(o->data, "gives %zu tokens in all, every one of them taken for the validation split: too little "
                   "text to train on; give more text", st.val_tokens);
        return -1;
    }
    printf("data: tokenized %s in %.1f s: %zu documents, %zu train + %zu val tokens (cached in %s)\n", o->data,
           (time_ms() - t0) / 1000.0, st.documents, st.train_tokens, st.val_tokens, dir);
    WriteChunk chunk;
    chunk.data = stamp;
    chunk.bytes = strlen(stamp);
    return write_file_atomic(stamp_path, &chunk, 1);
}

#endif /* GPTC_CLI_H */
