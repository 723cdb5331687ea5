/*
 * gptc/resume.h — a resume, in one place: which copy of the training state
 * a run continues from, and what is checked before it does.
 *
 * The walk (state_resume, at the end): read run.id (this run's nonce);
 * gather from every rank the steps its memory slots hold for this run
 * (state_memory_gather) and list the complete states on disk
 * (state_complete_steps); then, newest step first (state_candidates): where
 * each rank would get it (state_source_of: its own snapshot in /dev/shm,
 * the replica its neighbour keeps, disk), skipped unless every rank can;
 * a state on disk of an earlier run passed over, one of this run that
 * cannot continue it refused (state_disk_check); a step past --steps
 * refused; then loaded (state_replica_exchange, state_load_from; from disk:
 * state_load_disk, which reshards) and the data loader put at its
 * position. A copy unreadable on any rank falls back to the step before;
 * none at all is a fresh start or a clear error (state_resume_none).
 * train_run_resume wraps it for the loops: a new run's nonce, the slots of
 * later steps forgotten.
 *
 * Included by train_gpt.c in section 8 after gptc/saver.h (the Saver, its
 * slots); the record's format and its checks are gptc/state.h's. train() and
 * train_gpt.cu's gpu_train call train_run_resume. Defines: run_nonce,
 * state_load_disk; StateSource, SOURCE_NAMES, MEMORY_SLOTS;
 * state_memory_gather, state_candidates, state_source_of, state_disk_check,
 * state_replica_exchange, state_load_into, state_load_from,
 * state_resume_none, state_sources_print, state_resume; train_run_resume.
 */
#ifndef GPTC_RESUME_H
#define GPTC_RESUME_H

/* This run's nonce, from <output-dir>/run.id; `create`: rank 0 writes a new
 * one first (a new run). 0 when there is none. Collective. */
static uint64_t run_nonce(const Dist* d, const Options* o, int create) {
    char path[4400];
    snprintf(path, sizeof(path), "%s/run.id", o->output_dir);
    if (create && d->rank == 0) {
        unsigned long long nonce = ((uint64_t)unix_ms() << 20) ^ (uint64_t)getpid() ^ ((uint64_t)rand() << 40);
        char text[64];
        run_id_format(text, sizeof(text), nonce);
        WriteChunk c = {text, strlen(text)};
        if (write_file_atomic(path, &c, 1) != 0) fprintf(stderr, "warning: %s not written\n", path);
    }
    dist_barrier(d);
    uint64_t nonce;
    if (run_id_read(o->output_dir, &nonce) < 0) nonce = 0; /* (state_resume refuses a damaged one) */
    return nonce;
}

/* Load a state from disk: every rank reads every file of the step, taking
 * each file's slice of the weights and the part of its moments this rank
 * holds (all of them under plain data parallel, its shard under ZeRO). So
 * a state saved by another number of ranks, another --zero or another B
 * (the same tokens per step) loads the same way: resharding. */
static int state_load_disk(TrainRun* r, const Dist* d, GPT2* model, const Options* o, int step, StateInfo* out,
                           float* params_full) {
    char path[4400];
    int32_t h[HEADER_INTS];
    StateInfo s0, s;
    StateInfo now = state_info_of(r, d, model, o, step);
    state_path(path, sizeof(path), o->output_dir, step, 0);
    if (state_read_header(path, &s0, h, 0) != 0) return -1;
    if (d->rank == 0 && (s0.world != now.world || s0.zero != now.zero || s0.B != now.B))
        printf("resume: resharding the state of %d rank(s) (--zero %d, B=%d) onto %d (--zero %d, B=%d)\n", s0.world,
               s0.zero, s0.B, now.world, now.zero, now.B);
    size_t covered = 0;
    for (int j = 0; j < s0.world; j++) {
        state_path(path, sizeof(path), o->output_dir, step, j);
        if (state_read_header(path, &s, h, 0) != 0) return -1;
        /* every rank's file must be of this run and this step: its size and
         * slice are trusted below (a file of another model would write past
         * the weights) */
        const char* differs = state_differs(&s, &now, 0);
        const char* mixed = s.step != step                    ? "the step inside it differs from the one in its name"
                            : s.rank != j                      ? "the rank inside it differs from the one in its name"
                            : s.world != s0.world              ? "it was written by another number of ranks than rank 0's"
                            : s.nonce != s0.nonce              ? "its run.id nonce differs from rank 0's (another run)"
                            : differs                          ? differs
                            : s.hi > model->num_parameters     ? "its slice ends past the model's parameters"
                            : s.lo != covered                  ? "its slice does not begin where the previous rank's ends"
                            : s.epoch != s0.epoch || s.shard_pos != s0.shard_pos || s.cursor != s0.cursor
                                                               ? "its data position differs from rank 0's" : NULL;
        if (mixed) {
            FILE_ERROR(path, "cannot be part of the state of step %d beside %s/state_%08d_rank0.bin: %s%s (holds "
                       "step %d, rank %d of %d, parameters [%zu, %zu)); remove the step's files or restore them",
                       step, o->output_dir, step, mixed, differs && mixed == differs ? " differs" : "", s.step, s.rank,
                       s.world, s.lo, s.hi);
            return -1;
        }
        covered = s.hi;
        if (state_read_arrays(path, &s, h, params_full, model->m_memory, model->v_memory, d->lo, d->hi) != 0)
            return -1;
    }
    if (covered != model->num_parameters) {
        FILE_ERROR(path, "the state's files cover %zu of %zu parameters", covered, model->num_parameters);
        return -1;
    }
    *out = s0;
    return 0;
}

typedef enum { SOURCE_NONE, SOURCE_OWN, SOURCE_REPLICA, SOURCE_DISK } StateSource;
static const char* const SOURCE_NAMES[4] = {"nowhere", "its own snapshot in memory", "the neighbour's replica",
                                            "disk"};
#define MEMORY_SLOTS (OWN_SLOTS + HELD_SLOTS) /* per rank: its own snapshots, then its predecessor's replicas */

/* The steps every rank holds in memory for this run, gathered from all:
 * all[q * MEMORY_SLOTS + k] is the step in rank q's slot k (-1: none, or
 * not this run's, or not one this run can continue). Collective; caller frees. */
static int* state_memory_gather(const TrainRun* r, const Dist* d, const Options* o, const StateInfo* now) {
    int W = d->world, me = d->rank, prev = (me + W - 1) % W;
    int32_t h[HEADER_INTS];
    char path[4400];
    StateInfo s;
    int mine[MEMORY_SLOTS];
    for (int k = 0; k < MEMORY_SLOTS; k++) {
        int own = k < OWN_SLOTS;
        slot_path(path, sizeof(path), o, own ? me : prev, me, own ? k : k - OWN_SLOTS);
        mine[k] = -1;
        int32_t magic = 0;
        FILE* f = fopen(path, "rb");
        if (f) { /* a slot that was being filled when the run stopped reads as empty: skip it quietly */
            if (fread(&magic, sizeof(magic), 1, f) != 1) magic = 0;
            fclose(f);
        }
        if (magic == STATE_MAGIC && state_read_header(path, &s, h, 1) == 0 && r->nonce && s.nonce == r->nonce &&
            s.rank == (own ? me : prev) && !state_differs(&s, now, 0) && s.world == W && s.zero == now->zero &&
            s.B == now->B)
            mine[k] = s.step;
    }
    int* all = (int*)xmalloc(sizeof(int) * MEMORY_SLOTS * (size_t)W);
#ifdef USE_MPI
    MPI_CHECK(MPI_Allgather(mine, MEMORY_SLOTS, MPI_INT, all, MEMORY_SLOTS, MPI_INT, MPI_COMM_WORLD));
#else
    memcpy(all, mine, sizeof(mine));
#endif
    return all;
}

/* Every step anyone could offer (in memory anywhere, complete on disk),
 * ascending, repeats included; their count. Caller frees *cand. */
static int state_candidates(const int* all, int W, const int* disk, int ndisk, int** cand) {
    int n = 0;
    *cand = (int*)xmalloc(sizeof(int) * (MEMORY_SLOTS * (size_t)W + (size_t)ndisk + 1));
    for (int i = 0; i < MEMORY_SLOTS * W; i++)
        if (all[i] > 0) (*cand)[n++] = all[i];
    for (int i = 0; i < ndisk; i++) (*cand)[n++] = disk[i];
    qsort(*cand, (size_t)n, sizeof(int), int_compare);
    return n;
}

/* Where this rank would get `step` from, in order of preference: its own
 * slot (*own_slot), the replica its neighbour (r+1) mod W holds, disk. */
static StateSource state_source_of(const int* all, const Dist* d, const int* disk, int ndisk, int step, int* own_slot) {
    int W = d->world, me = d->rank, next = (me + 1) % W, held_by_next = 0, on_disk = 0;
    *own_slot = -1;
    for (int k = 0; k < OWN_SLOTS; k++)
        if (all[me * MEMORY_SLOTS + k] == step) *own_slot = k;
    for (int k = OWN_SLOTS; k < MEMORY_SLOTS; k++)
        if (W > 1 && all[next * MEMORY_SLOTS + k] == step) held_by_next = 1;
    for (int i = 0; i < ndisk; i++) on_disk |= disk[i] == step;
    return *own_slot >= 0 ? SOURCE_OWN : held_by_next ? SOURCE_REPLICA : on_disk ? SOURCE_DISK : SOURCE_NONE;
}

/* A state on disk: of an earlier run in this folder (one started afresh
 * since, with a new run.id: *earlier, to be passed over), or of this run
 * but unable to continue it (said here; returns what differs). */
static const char* state_disk_check(const TrainRun* r, const Options* o, const StateInfo* now, int step, int* earlier) {
    char path[4400];
    int32_t h[HEADER_INTS];
    StateInfo s;
    const char* differs = NULL;
    *earlier = 0;
    state_path(path, sizeof(path), o->output_dir, step, 0);
    if (state_read_header(path, &s, h, 1) == 0) {
        *earlier = r->nonce && s.nonce != r->nonce;
        if (!*earlier && (differs = state_differs(&s, now, 0)))
            fprintf(stderr, "error: %s was written by an incompatible run: %s differs; start a new --output-dir or run "
                    "with the same settings\n", path, differs);
    }
    return differs;
}

#ifdef USE_MPI
/* A replica travels back to its owner. A rank may both need its replica
 * and hold the one its predecessor needs (each lost its newest own
 * snapshot): both directions are posted non-blocking, sizes first, so no
 * pair of sends can wait on each other. Returns this rank's replica (its
 * float count in *floats) when `need`, else NULL. Collective. */
static float* state_replica_exchange(const Dist* d, const Options* o, const int* all, int step, int need,
                                     long long* floats) {
    int W = d->world, me = d->rank, next = (me + 1) % W, prev = (me + W - 1) % W;
    int* needs = (int*)xmalloc(sizeof(int) * (size_t)W);
    MPI_CHECK(MPI_Allgather(&need, 1, MPI_INT, needs, 1, MPI_INT, MPI_COMM_WORLD));
    int prev_needs = W > 1 && needs[prev];
    free(needs);
    char* out = NULL;               /* the replica of prev's state that this rank holds */
    long long out_floats = 0;
    float* replica = NULL;          /* the replica of this rank's state, from its neighbour */
    MPI_Request rq[2];
    int nrq = 0;
    *floats = 0;
    if (prev_needs) {
        int k = OWN_SLOTS;
        while (all[me * MEMORY_SLOTS + k] != step) k++;
        char path[4400];
        slot_path(path, sizeof(path), o, prev, me, k - OWN_SLOTS);
        size_t bytes = 0;
        out = file_read_all(path, &bytes);
        out_floats = out ? (long long)bytes / 4 : 0;
    }
    if (need) MPI_CHECK(MPI_Irecv(floats, 1, MPI_LONG_LONG, next, 8, MPI_COMM_WORLD, &rq[nrq++]));
    if (prev_needs) MPI_CHECK(MPI_Isend(&out_floats, 1, MPI_LONG_LONG, prev, 8, MPI_COMM_WORLD, &rq[nrq++]));
    MPI_CHECK(MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE));
    nrq = 0;
    if (need) replica = xmalloc_floats(*floats ? (size_t)*floats : 1);
    if (need && *floats) MPI_CHECK(MPI_Irecv(replica, (int)*floats, MPI_FLOAT, next, 9, MPI_COMM_WORLD, &rq[nrq++]));
    if (prev_needs && out_floats)
        MPI_CHECK(MPI_Isend(out, (int)out_floats, MPI_FLOAT, prev, 9, MPI_COMM_WORLD, &rq[nrq++]));
    MPI_CHECK(MPI_Waitall(nrq, rq, MPI_STATUSES_IGNORE));
    free(out);
    return replica;
}
#endif

/* Load `step` from `src` into `full` (the weights, or ZeRO-3's temporary)
 * and this rank's slice of the moments, and its record into *s (a replica:
 * `replica`, `floats` long). 1 if it worked. */
static int state_load_into(StateSource src, TrainRun* r, const Dist* d, GPT2* model, const Options* o,
                           Saver* sv, int step, int own_slot, const float* replica, long long floats,
                           StateInfo* s, float* full) {
    char path[4400];
    int32_t h[HEADER_INTS];
    float* m_at = model->m_memory + dist_moments_at(d); /* where this rank's slice of the moments goes */
    float* v_at = model->v_memory + dist_moments_at(d);
    if (src == SOURCE_DISK) return state_load_disk(r, d, model, o, step, s, full) == 0;
    if (src == SOURCE_OWN && sv->memory) { /* the slot is mapped already: straight from memory */
        slot_path(path, sizeof(path), o, d->rank, d->rank, own_slot);
        slot_ready(&sv->own[own_slot], 1); /* its pages, by all threads, before the copy reads them */
        return state_load_record(sv->own[own_slot].base, sv->own[own_slot].bytes, path, s, full, m_at,
                                 v_at) == 0 && s->step == step;
    }
    if (src == SOURCE_OWN) { /* (this run takes no memory snapshots: read the file) */
        slot_path(path, sizeof(path), o, d->rank, d->rank, own_slot);
        return state_read_header(path, s, h, 0) == 0 && s->step == step &&
               state_read_arrays(path, s, h, full, model->m_memory, model->v_memory, d->lo, d->hi) == 0;
    }
    return replica && state_load_record((const unsigned char*)replica, (size_t)floats * 4, "the neighbour's replica", s,
                                        full, m_at, v_at) == 0 && s->step == step;
}
static int state_load_from(StateSource src, TrainRun* r, const Dist* d, GPT2* model, const Options* o,
                           Saver* sv, int step, int own_slot, const float* replica, long long floats,
                           StateInfo* s) {
    float* full = dist_params_full(d, model);
    int ok = state_load_into(src, r, d, model, o, sv, step, own_slot, replica, floats, s, full);
    dist_params_keep(d, model, full);
    return ok;
}

/* No state was loaded (result 0): an error when states exist that are not
 * this run's, or are this run's but unreadable (never start over them
 * silently). 0 (a fresh start, said) or -1. */
static int state_resume_none(const TrainRun* r, const Dist* d, const Options* o, int passed_over, int unreadable) {
    if (passed_over > 0 && unreadable == 0) { /* states exist, none of this run */
        if (d->rank == 0)
            fprintf(stderr, "error: every training state in %s belongs to another run than %s/run.id names (nonce "
                    "%016llx): if they are this run's and run.id was replaced, remove run.id and resume again; to "
                    "start a new run, use a new --output-dir (or run without --resume)\n", o->output_dir,
                    o->output_dir, (unsigned long long)r->nonce);
        return -1;
    }
    if (unreadable > 0) { /* states of this run exist, none could be read */
        fprintf(stderr, "error: no usable training state in %s (or in memory): repair or remove them, or start a new "
                "--output-dir\n", o->output_dir);
        return -1;
    }
    if (d->rank == 0) printf("resume: no training state in %s or in memory: starting from step 0\n", o->output_dir);
    return 0;
}

/* Say where each rank's state came from. Collective. */
static void state_sources_print(const Dist* d, StateSource src, int step) {
    int W = d->world;
    int* srcs = (int*)xmalloc(sizeof(int) * (size_t)W);
    int mine = (int)src;
#ifdef USE_MPI
    MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, srcs, 1, MPI_INT, MPI_COMM_WORLD));
#else
    srcs[0] = mine;
#endif
    printf("resume: continuing after step %d;", step);
    for (int q = 0; q < W; q++) printf(" rank %d from %s%s", q, SOURCE_NAMES[srcs[q]], q + 1 < W ? "," : "\n");
    free(srcs);
}

/* Continue from the freshest state that every rank can get, in order of
 * preference: its own snapshot in memory (/dev/shm, survives the process),
 * the replica its neighbour (r+1) mod W keeps of it, the newest complete
 * state on disk. The ranks first agree on the newest step complete
 * everywhere, then load; a corrupt or missing copy falls back to the next
 * step, with a warning. Returns the step to continue from (0 when there is
 * none), or -1 when a state of this run cannot continue it (a clear error:
 * what differs). Collective. */
static int state_resume(TrainRun* r, const Dist* d, GPT2* model, const Options* o, Saver* sv) {
    int W = d->world;
    StateInfo now = state_info_of(r, d, model, o, 0), s;
    uint64_t id;
    if (dist_sum(d, run_id_read(o->output_dir, &id) < 0) > 0) return -1;
    int* all = state_memory_gather(r, d, o, &now);
    int *disk, *cand;
    int ndisk = state_complete_steps(o->output_dir, &disk);
    int ncand = state_candidates(all, W, disk, ndisk, &cand);
    int result = 0, unreadable = 0, passed_over = 0;
    StateSource src = SOURCE_NONE;
    for (int c = ncand - 1; c >= 0; c--) { /* newest first */
        int step = cand[c], own_slot = -1;
        if (c < ncand - 1 && cand[c + 1] == step) continue; /* tried */
        src = state_source_of(all, d, disk, ndisk, step, &own_slot);
        if (dist_sum(d, src == SOURCE_NONE) > 0) continue; /* not complete everywhere */
        int earlier = 0;
        const char* differs = src == SOURCE_DISK ? state_disk_check(r, o, &now, step, &earlier) : NULL;
        if (dist_sum(d, earlier) > 0) { /* passed over, together */
            char path[4400];
            state_path(path, sizeof(path), o->output_dir, step, 0);
            if (d->rank == 0)
                fprintf(stderr, "warning: %s belongs to an earlier run in this folder (its run.id differs): passed over\n",
                        path);
            passed_over++;
            continue;
        }
        if (dist_sum(d, differs != NULL) > 0) { /* refused, together */
            result = -1;
            break;
        }
        if (step > r->steps) { /* running on would save this later state's weights under an earlier step's name */
            if (d->rank == 0)
                fprintf(stderr, "error: the newest training state in %s is at step %d, past --steps %d: resume with "
                        "--steps %d or more, or use a new --output-dir\n", o->output_dir, step, r->steps, step);
            result = -1;
            break;
        }
        long long floats = 0;
        float* replica = NULL;
#ifdef USE_MPI
        replica = state_replica_exchange(d, o, all, step, src == SOURCE_REPLICA, &floats);
#endif
        int ok = state_load_from(src, r, d, model, o, sv, step, own_slot, replica, floats, &s);
        free(replica);
        if (dist_sum(d, src != SOURCE_DISK) > 0 && dist_sum(d, ok) == W) dist_allgather_state(d, model); /* memory holds slices */
        int position_missing = ok && dataloader_seek(&r->train, s.epoch, s.shard_pos, s.cursor) != 0;
        if (dist_sum(d, position_missing) > 0) { /* the state is fine: the data is not the run's */
            if (d->rank == 0)
                fprintf(stderr, "error: the training state of step %d in %s was saved at data position epoch %d, "
                        "shard %d of that epoch's order, sample %lld, which the training data given (%d shard(s), "
                        "%s first) does not have: resume with the data the run was trained on, or start a new "
                        "--output-dir\n", step, o->output_dir, s.epoch, s.shard_pos, s.cursor, r->train.num_shards,
                        r->train.files.gl_pathv[0]);
            result = -1;
            break;
        }
        if (dist_sum(d, ok) == W) {
            if (s.steps != r->steps && d->rank == 0)
                printf("resume: --steps is %d, the state's run had %d: allowed; the schedule follows the new count\n",
                       r->steps, s.steps);
            r->sample_rng.state = s.sample_rng;
            r->watch = s.watch;
            result = step;
            break;
        }
        fprintf(stderr, "warning: rank %d: the training state of step %d is not usable on every rank (this rank: %s, "
                "%s); trying the one before\n", d->rank, step, SOURCE_NAMES[src], ok ? "fine" : "unreadable");
        src = SOURCE_NONE;
        unreadable++;
    }
    if (result == 0) result = state_resume_none(r, d, o, passed_over, unreadable);
    if (result > 0) state_sources_print(d, src, result);
    free(cand);
    free(disk);
    free(all);
    return result;
}

/* A new run or a resumed one: the run's nonce (run.id), the newest state
 * every rank can get (state_resume), and the memory slots of steps after it
 * forgotten. The step to start from (0: a new run), or -1. Collective. */
static int train_run_resume(TrainRun* r, Saver* sv, const Dist* d, GPT2* model, const Options* o) {
    int start = 0;
    if (o->output_dir[0]) r->nonce = run_nonce(d, o, 0);
    if (o->resume && (start = state_resume(r, d, model, o, sv)) < 0) return -1;
    if (o->output_dir[0] && start == 0) r->nonce = run_nonce(d, o, 1); /* a new run: a new nonce */
    saver_forget_after(sv, start);
    return start;
}

#endif /* GPTC_RESUME_H */
