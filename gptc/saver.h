/*
 * gptc/saver.h — failover: snapshots in memory and their replicas, saves to
 * disk on a background thread, resume, rollback after bad steps, and what a
 * supervisor reads (heartbeat, timings).
 *
 * Included by train_gpt.c just before its training loop: it works on the
 * model, the data-parallel ranks (Dist), the options and the TrainRun defined
 * there; train_gpt.cu's gpu_train uses the same calls. Defines:
 * state_info_of, state_complete_steps, state_prune, slot_path; shm_dir_check;
 * Saver (saver_init, saver_forget_after, saver_before_update, saver_stall_close,
 * saver_mark, saver_poll, saver_snapshot, saver_restore_newest,
 * saver_abandon, saver_free); train_run_bad_step; checkpoint_save;
 * run_nonce; state_load_disk; StateSource, state_resume (and its steps:
 * state_memory_gather, state_candidates, state_source_of, state_disk_check,
 * state_replica_exchange, state_load_from, state_resume_none,
 * state_sources_print); heartbeat_write,
 * plumbing_wanted, timing_print; standby_wait, standby_wait_ranks (a hot spare's wait, --standby: one
 * process, or every rank of a standby job), standby_take_over; saver_prepare_finish; startup_print;
 * inject_at, test_hook_nan, test_hook_spike, test_hooks_print (the test hooks GPTC_INJECT_*); and the loop's tail that
 * train() and gpu_train() share: train_run_resume, StepOutcome,
 * train_run_after_step, Boundary, train_run_boundary, train_run_stop,
 * train_run_report, train_run_final_save.
 */
#ifndef GPTC_SAVER_H
#define GPTC_SAVER_H

#include "util.h"
#include "state.h"
#include "cli.h"
#include <pthread.h>
#include <sys/vfs.h> /* statfs: shm_dir_check */

static StateInfo state_info_of(const TrainRun* r, const Dist* d, const GPT2* model, const Options* o, int step) {
    StateInfo s;
    memset(&s, 0, sizeof(s));
    s.step = step; s.rank = d->rank; s.world = d->world; s.zero = d->zero;
    s.B = r->B; s.T = r->T; s.total = r->total; s.seed = o->seed; s.shuffle = r->train.shuffle;
    s.config = model->config;
    s.epoch = r->train.epoch; s.shard_pos = r->train.shard_pos; s.cursor = r->train.cursor;
    s.P = model->num_parameters; s.lo = d->save_lo; s.hi = d->save_hi;
    s.sample_rng = r->sample_rng.state;
    s.nonce = r->nonce;
    s.steps = r->steps;
    s.watch = r->watch;
    return s;
}

static int int_compare(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

/* The steps with a state_<step>.complete marker in `dir`, ascending; the
 * count, or 0. Caller frees *steps. */
static int state_complete_steps(const char* dir, int** steps) {
    char pattern[8300];
    glob_pattern(pattern, sizeof(pattern), dir, "/state_*.complete");
    glob_t g;
    int n = 0;
    *steps = NULL;
    if (glob(pattern, 0, NULL, &g) == 0) {
        *steps = (int*)xmalloc(sizeof(int) * g.gl_pathc);
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char* base = strrchr(g.gl_pathv[i], '/');
            (*steps)[n++] = atoi((base ? base + 1 : g.gl_pathv[i]) + 6);
        }
        globfree(&g);
        qsort(*steps, (size_t)n, sizeof(int), int_compare);
    }
    return n;
}

/* Retention: keep the newest --keep-last complete states and every step
 * that is a multiple of --keep-every; remove the rest. Markers go first (so
 * a half-removed step is never taken for complete), then, after every rank
 * has seen the same list, each rank's own files. */
static void state_prune(const Dist* d, const Options* o) {
    if (o->keep_last <= 0) return;
    char path[4400];
    int* steps;
    dist_barrier(d); /* rank 0's newest marker is on disk before anyone lists */
    int n = state_complete_steps(o->output_dir, &steps);
    dist_barrier(d); /* everyone has the list before a marker goes */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n - o->keep_last; i++) {
            if (o->keep_every > 0 && steps[i] % o->keep_every == 0) continue;
            if (pass == 0 && d->rank == 0) {
                state_path(path, sizeof(path), o->output_dir, steps[i], -1);
                remove(path);
            } else if (pass == 1) {
                state_path(path, sizeof(path), o->output_dir, steps[i], d->rank);
                remove(path);
            }
        }
        if (pass == 0) dist_barrier(d);
    }
    free(steps);
}

/* Where the snapshot slots of this run live: <shm-dir>/gptc-<tag>-state<of>-at<at>-<k>.bin,
 * the state of rank `of` kept by rank `at` (its own when of == at, else the
 * replica of its neighbour's), slot k; tag = a hash of the output folder's
 * absolute path, so a restarted run finds its memory and two runs never
 * share it. */
static void slot_path(char* out, size_t cap, const Options* o, int of, int at, int k) {
    snprintf(out, cap, "%s/gptc-%016llx-state%d-at%d-%d.bin", o->shm_dir, (unsigned long long)run_tag(o->output_dir),
             of, at, k);
}

/* Snapshots and saving, in two phases (CheckFreq, Mohan et al. 2021):
 * at a step boundary a background thread copies the weights and moments
 * into a snapshot slot while the next step's forward and backward run (they
 * only read them); the trainer waits for the copy only before its next
 * update, so the stall is what the copy did not hide (measured and
 * printed). The same thread then writes the record's checksums. Next:
 *   - every --snapshot-every steps the record stays in /dev/shm (three
 *     slots: two taking turns, one more for the disk writer to hold) and is
 *     sent to rank (r+1) mod W, which keeps it in one of two replica slots
 *     (non-blocking MPI, progressed by the step's own collectives);
 *   - every --save-every steps a second thread writes it to disk (state file
 *     per rank, model file by rank 0); when every rank's write succeeded,
 *     rank 0 writes state_<step>.complete. The ranks compare notes on the
 *     main thread at step boundaries (MPI is only called from there). A
 *     failed write (disk full...) leaves the previous complete state the
 *     newest, with a warning, and training continues (protected by the
 *     memory snapshots when they are on).
 * With --save-async 0 everything happens at the step boundary instead, the
 * usual synchronous way (for comparison: make bench-failover). */
#define OWN_SLOTS 3
#define HELD_SLOTS 2
typedef struct {
    int memory;            /* --snapshot-every > 0: slots in shm, replicas */
    int nslots;            /* own slots in use: OWN_SLOTS, or 1 when only saving to disk */
    Slot own[OWN_SLOTS];
    Slot held[HELD_SLOTS]; /* replicas of rank (r - 1) mod W */
    int newest;            /* own slot with the newest complete snapshot, -1 none */
    int held_next;         /* the held slot the next replica goes to */
    /* the copier (phase one) */
    pthread_t copier;
    int copier_busy;       /* a thread was started and not joined */
    int copied;            /* set by the copier once the arrays are copied */
    int confirmed;         /* the trainer saw `copied` (so every rank joins the copier at the same boundary) */
    int fill;              /* the slot it fills */
    int fill_save;         /* that snapshot also goes to disk */
    StateInfo info;
    const float *params, *m, *v; /* this rank's slices of the trainer's arrays */
    const float* all_params;     /* rank 0, saving: all the weights, copied to model_params */
    float* model_params;         /* (P) rank 0: the weights the model file is written from */
    double t_snap;         /* when the snapshot began */
    /* the disk writer (phase two) */
    pthread_t writer;
    int writer_busy;
    int written;           /* set by the writer when done */
    int write_result;      /* 0 = ok */
    int pinned;            /* the slot it reads, -1 none */
    int write_step;
    char state_file[4400], model_file[4400];
    GPT2Config config;
    /* figures */
    double stall_ms, disk_wait_ms, max_stall_ms; /* over all snapshots, and the worst one */
    double snap_stall;     /* the stall of the snapshot in progress so far */
    int snapshots;
    int last_failed;       /* the last disk write failed on some rank */
    char lock_file[4400];  /* the slots' lock (gptc/state.h's run_lock), removed with them */
    /* the fast start: own slots mapped at start, their pages faulted in
     * after the first step by this thread (and by the copier, the resume:
     * whoever needs a slot first; gptc/state.h's slot_prepare) */
    pthread_t preparer;
    int preparer_busy;     /* started and not joined */
    int preparer_stop;     /* (atomic) saver_free: end now */
#ifdef USE_MPI
    MPI_Request send[OWN_SLOTS];  /* replica of own slot k on its way to rank r + 1 */
    MPI_Request recv[HELD_SLOTS]; /* replica arriving from rank r - 1 */
#endif
} Saver;

/* A slot's pages are all there, or the run cannot go on: an error that
 * says what to do (one that would have been a SIGBUS mid-copy). */
static void slot_ready(Slot* sl, int parallel) {
    int err = slot_prepare(sl, parallel);
    CHECK(err == 0, "cannot reserve %.2f GB for the snapshot slot %s (%s): its file system filled up since the start; "
          "free space there (or point --shm-dir elsewhere, or run with --snapshot-every 0) and run again with "
          "--resume 1", sl->bytes / 1e9, sl->path[0] ? sl->path : "(anonymous)", strerror(err == EFAULT ? ENOSPC : err));
}

static void* saver_copier_main(void* arg) {
    Saver* sv = (Saver*)arg;
    slot_ready(&sv->own[sv->fill], 0); /* (prepared at the first snapshot; at once after) */
    slot_fill(&sv->own[sv->fill], &sv->info, sv->params, sv->m, sv->v, &sv->copied, sv->all_params,
              sv->all_params ? sv->model_params : NULL);
    return NULL;
}

static void* saver_writer_main(void* arg) {
    Saver* sv = (Saver*)arg;
    const Slot* sl = &sv->own[sv->pinned];
    WriteChunk chunk = {sl->base, sl->bytes};
    int rc = write_file_atomic(sv->state_file, &chunk, 1);
    if (rc == 0 && sv->model_file[0])
        rc = model_file_write(sv->model_file, &sv->config, sv->model_params);
    sv->write_result = rc;
    __atomic_store_n(&sv->written, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Snapshot slots are files in --shm-dir, mapped shared: on a tmpfs they
 * are memory; on a disk file system every snapshot's pages are written
 * back to disk and write-protected again, so the next snapshot faults them
 * all anew (measured, GPT-2 124M: ~200,000 page faults and 1.5 GB written
 * per step). Said once, at start: a warning, not an error (it still
 * works). */
static void shm_dir_check(const char* shm_dir, int rank) {
    struct statfs fs;
    if (rank != 0 || statfs(shm_dir, &fs) != 0) return;
    unsigned long type = (unsigned long)fs.f_type;
    if (type != 0x01021994UL /* TMPFS_MAGIC */ && type != 0x858458f6UL /* RAMFS_MAGIC */)
        fprintf(stderr, "warning: --shm-dir %s is not in memory (not a tmpfs): each memory snapshot is also written "
                "back to its disk, a cost of about the snapshot's size in disk writes and page faults per snapshot; "
                "point --shm-dir at a tmpfs such as /dev/shm\n", shm_dir);
}

/* The own slots' pages, one after the other, on a background thread
 * started after the first step (saver_prepare_start). */
static void* saver_preparer_main(void* arg) {
    Saver* sv = (Saver*)arg;
    for (int k = 0; k < sv->nslots; k++) {
        slot_prepare_work(&sv->own[k], &sv->preparer_stop);
        if (__atomic_load_n(&sv->preparer_stop, __ATOMIC_ACQUIRE)) break;
    }
    return NULL;
}

/* The first step is done: fault the rest of the own slots in, in the
 * background (the fast start: nothing of it before the first step). */
static void saver_prepare_start(Saver* sv) {
    int todo = 0;
    for (int k = 0; k < sv->nslots; k++) todo |= sv->own[k].base && sv->own[k].next < sv->own[k].chunks;
    if (!todo || sv->preparer_busy) return;
    sv->preparer_stop = 0;
    CHECK(pthread_create(&sv->preparer, NULL, saver_preparer_main, sv) == 0, "cannot start the slot preparer thread");
    sv->preparer_busy = 1;
}

/* Stop the preparer (what it left undone is done by whoever needs a slot). */
static void saver_prepare_stop(Saver* sv) {
    if (!sv->preparer_busy) return;
    __atomic_store_n(&sv->preparer_stop, 1, __ATOMIC_RELEASE);
    CHECK(pthread_join(sv->preparer, NULL) == 0, "cannot join the slot preparer thread");
    sv->preparer_busy = 0;
}

/* Let the preparer finish: every own slot's pages in (--plan-check, which
 * counts them resident, waits for this after a run of a step or two). */
static void saver_prepare_finish(Saver* sv) {
    if (!sv->preparer_busy) return;
    CHECK(pthread_join(sv->preparer, NULL) == 0, "cannot join the slot preparer thread");
    sv->preparer_busy = 0;
}

/* Map the slots (what an earlier process left in them stays, for
 * state_resume to read). The own slots' pages are faulted in later (the
 * fast start: after the first step, or when a resume reads one), except
 * for a standby, which has the time now. Returns 0 or -1 (with a message
 * on this rank; collective). */
static int saver_init(Saver* sv, const Dist* d, const GPT2* model, const Options* o) {
    memset(sv, 0, sizeof(*sv));
    sv->newest = sv->pinned = -1;
#ifdef USE_MPI
    for (int k = 0; k < OWN_SLOTS; k++) sv->send[k] = MPI_REQUEST_NULL;
    for (int k = 0; k < HELD_SLOTS; k++) sv->recv[k] = MPI_REQUEST_NULL;
#endif
    if (!o->output_dir[0]) return 0;
    sv->memory = o->snapshot_every > 0;
    sv->nslots = sv->memory ? OWN_SLOTS : 1;
    size_t bytes = state_bytes(d->save_hi - d->save_lo);
    CHECK(d->world == 1 || bytes / 4 <= (size_t)INT32_MAX, "a state of %zu bytes is too large for one MPI message", bytes);
    int ok = 1, defer = !o->standby[0];
    size_t pending = 0; /* the deferred slots' bytes, for the room check */
    char path[4400];
    for (int k = 0; k < sv->nslots && ok; k++) {
        slot_path(path, sizeof(path), o, d->rank, d->rank, k);
        ok = slot_map(&sv->own[k], sv->memory ? path : NULL, bytes, defer, &pending) == 0;
    }
    for (int k = 0; k < HELD_SLOTS && ok && sv->memory && d->world > 1; k++) {
        int of = (d->rank + d->world - 1) % d->world;
        slot_path(path, sizeof(path), o, of, d->rank, k);
        size_t lo, hi;
        dist_slice(d, model->num_parameters, of, &lo, &hi);
        ok = slot_map(&sv->held[k], path, state_bytes(hi - lo), 0, &pending) == 0; /* (MPI writes them: at once) */
    }
    if (sv->memory && ok) shm_dir_check(o->shm_dir, d->rank); /* (the folder exists by now) */
    if (sv->memory) run_lock_path(sv->lock_file, sizeof(sv->lock_file), o->output_dir, o->shm_dir, d->rank, 1);
    if (d->rank == 0) sv->model_params = ledger_floats(MEM_SNAPSHOTS, model->num_parameters);
    if (dist_sum(d, ok) < d->world) return -1;
    if (sv->memory)
        printf("snapshots: every %d step(s) to %s (%d slots of %.2f GB%s)%s\n", o->snapshot_every, o->shm_dir,
               sv->nslots, bytes / 1e9, d->world > 1 ? ", and a replica at rank (r+1) mod W" : "",
               o->save_async ? "" : "; synchronous (--save-async 0)");
    return 0;
}

/* After resuming at `start`: a slot left by an earlier process that holds
 * a later step (some rank lacked it, so the run went back further) is
 * cleared, so it can never be mixed with this run's later snapshots. */
static void saver_forget_after(Saver* sv, int start) {
    for (int k = 0; k < OWN_SLOTS + HELD_SLOTS; k++) {
        Slot* sl = k < OWN_SLOTS ? &sv->own[k] : &sv->held[k - OWN_SLOTS];
        int32_t* h = (int32_t*)sl->base;
        if (h && h[0] == STATE_MAGIC && h[2] > start) h[0] = 0;
    }
}

/* The previous snapshot's copy must be done before the trainer changes its
 * weights: call before each update. The wait is the snapshot's stall. */
static void saver_before_update(Saver* sv) {
    if (!sv->copier_busy) return;
    sv->confirmed = 1;
    if (__atomic_load_n(&sv->copied, __ATOMIC_ACQUIRE)) return;
    double t0 = time_ms();
    while (!__atomic_load_n(&sv->copied, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 20000}; /* 20 us */
        nanosleep(&ts, NULL);
    }
    sv->snap_stall += time_ms() - t0;
}

/* The snapshot in progress is done stalling: count it. */
static void saver_stall_close(Saver* sv) {
    sv->stall_ms += sv->snap_stall;
    if (sv->snap_stall > sv->max_stall_ms) sv->max_stall_ms = sv->snap_stall;
    sv->snap_stall = 0.0;
}

/* The disk writer is done: every rank's result decides the marker. */
static void saver_mark(Saver* sv, const Dist* d, const Options* o) {
    CHECK(pthread_join(sv->writer, NULL) == 0, "cannot join the state writer thread");
    sv->writer_busy = 0;
    sv->pinned = -1;
    int step = sv->write_step;
    sv->last_failed = dist_sum(d, sv->write_result == 0) < d->world;
    if (sv->last_failed) {
        fprintf(stderr, "warning: rank %d: the training state of step %d is incomplete on disk; the previous one stays "
                "the newest there, training continues%s\n", d->rank, step,
                sv->memory ? " (protected by the memory snapshots)" : "");
        return;
    }
    if (d->rank == 0) {
        char path[4400];
        state_path(path, sizeof(path), o->output_dir, step, -1);
        WriteChunk c = {"complete\n", 9};
        if (write_file_atomic(path, &c, 1) == 0)
            printf("saved step %d: training state complete on disk (%.0f ms after its snapshot), model in %s\n", step,
                   time_ms() - sv->t_snap, sv->model_file);
    }
    state_prune(d, o);
}

/* At a step boundary: finish what the background threads have finished.
 * `wait`: wait for all of it (the end of the run). Collective. */
static void saver_poll(Saver* sv, const Dist* d, const Options* o, int wait) {
    if (sv->copier_busy && (wait || sv->confirmed)) {
        /* the copy is done; the checksums take a little longer (counted in the stall) */
        double t0 = time_ms();
        CHECK(pthread_join(sv->copier, NULL) == 0, "cannot join the snapshot thread");
        if (o->save_async) sv->snap_stall += time_ms() - t0;
        sv->copier_busy = 0;
        int k = sv->fill;
        sv->newest = k;
        sv->snapshots++;
#ifdef USE_MPI
        if (sv->memory && d->world > 1) { /* the replica: to r + 1, from r - 1 */
            int to = (d->rank + 1) % d->world, from = (d->rank + d->world - 1) % d->world;
            int j = sv->held_next;
            sv->held_next = (j + 1) % HELD_SLOTS;
            MPI_CHECK(MPI_Wait(&sv->recv[j], MPI_STATUS_IGNORE));
            MPI_CHECK(MPI_Irecv(sv->held[j].base, (int)(sv->held[j].bytes / 4), MPI_FLOAT, from, 7, MPI_COMM_WORLD,
                                &sv->recv[j]));
            MPI_CHECK(MPI_Isend(sv->own[k].base, (int)(sv->own[k].bytes / 4), MPI_FLOAT, to, 7, MPI_COMM_WORLD,
                                &sv->send[k]));
        }
#endif
        if (sv->fill_save) { /* phase two: to disk, by the writer, from this slot */
            if (sv->writer_busy) { /* the disk is slower than the saves: wait (bounded memory) */
                double t0 = time_ms();
                while (!__atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) {
                    struct timespec ts = {0, 1000000};
                    nanosleep(&ts, NULL);
                }
                saver_mark(sv, d, o);
                sv->disk_wait_ms += time_ms() - t0;
            }
            sv->pinned = k;
            sv->write_step = sv->info.step;
            sv->written = 0;
            sv->write_result = -1;
            state_path(sv->state_file, sizeof(sv->state_file), o->output_dir, sv->info.step, d->rank);
            sv->model_file[0] = '\0';
            if (d->rank == 0)
                snprintf(sv->model_file, sizeof(sv->model_file), "%s/model_%08d.bin", o->output_dir, sv->info.step);
            sv->config = sv->info.config;
            CHECK(pthread_create(&sv->writer, NULL, saver_writer_main, sv) == 0, "cannot start the state writer thread");
            sv->writer_busy = 1;
        }
    }
    if (sv->writer_busy) { /* every rank's write done? (decided together) */
        if (wait)
            while (!__atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        if (dist_sum(d, __atomic_load_n(&sv->written, __ATOMIC_ACQUIRE)) == d->world) saver_mark(sv, d, o);
    }
#ifdef USE_MPI
    if (wait) {
        MPI_CHECK(MPI_Waitall(OWN_SLOTS, sv->send, MPI_STATUSES_IGNORE));
        MPI_CHECK(MPI_Waitall(HELD_SLOTS, sv->recv, MPI_STATUSES_IGNORE));
    }
#endif
}

/* Phase one, at the boundary after step `step`: start copying the state
 * into a free slot. `save`: it also goes to disk. */
static void saver_snapshot(Saver* sv, const TrainRun* r, const Dist* d, const GPT2* model, const Options* o, int step,
                           int save) {
    if (!o->output_dir[0]) return;
    saver_poll(sv, d, o, 0);
    if (sv->copier_busy) { /* snapshots closer together than a copy takes */
        saver_before_update(sv);
        saver_poll(sv, d, o, 0);
    }
    int k = 0;
    while (k < sv->nslots && (k == sv->newest || k == sv->pinned)) k++;
    if (k == sv->nslots) { /* one slot (disk only): it is pinned by the writer, wait for it */
        saver_poll(sv, d, o, 1);
        k = 0;
    }
#ifdef USE_MPI
    MPI_CHECK(MPI_Wait(&sv->send[k], MPI_STATUS_IGNORE)); /* its last replica has left */
#endif
    sv->fill = k;
    sv->fill_save = save;
    sv->info = state_info_of(r, d, model, o, step);
    size_t at = dist_moments_at(d);
    sv->params = model->params_memory + (d->zero == 3 ? 0 : d->save_lo); /* (ZeRO-3 holds its slice only) */
    sv->m = model->m_memory + at;
    sv->v = model->v_memory + at;
    sv->all_params = save && d->rank == 0 && d->zero != 3 ? model->params_memory : NULL;
    if (save && d->zero == 3) zero3_gather_model(d, model, sv->model_params); /* collective (gptc/zero3.h) */
    saver_stall_close(sv); /* the previous snapshot's stall is all counted by now */
    sv->copied = sv->confirmed = 0;
    sv->t_snap = time_ms();
    CHECK(pthread_create(&sv->copier, NULL, saver_copier_main, sv) == 0, "cannot start the snapshot thread");
    sv->copier_busy = 1;
    if (!o->save_async) { /* the synchronous way: all of it now */
        double t0 = time_ms();
        saver_poll(sv, d, o, 1);
        sv->snap_stall += time_ms() - t0;
    }
}

/* Take back the newest snapshot in memory (a rollback): weights, moments
 * and the sampler; the data loader stays where it is, so the batches since
 * are skipped. Returns its step, or -1 when there is none. Collective. */
static int saver_restore_newest(Saver* sv, TrainRun* r, const Dist* d, GPT2* model, const Options* o) {
    saver_before_update(sv);
    saver_poll(sv, d, o, 0);
    StateInfo s;
    size_t at = dist_moments_at(d);
    float* full = dist_params_full(d, model); /* the weights, or ZeRO-3's temporary */
    int ok = sv->newest >= 0 && state_load_record(sv->own[sv->newest].base, sv->own[sv->newest].bytes,
                                                  "the newest memory snapshot", &s, full,
                                                  model->m_memory + at, model->v_memory + at) == 0;
    dist_params_keep(d, model, full);
    if (dist_sum(d, ok) < d->world) return -1; /* (every rank takes its snapshots at the same steps) */
    dist_allgather_state(d, model);
    r->sample_rng.state = s.sample_rng;
    return s.step;
}

/* A bad step (non-finite, or a loss spike) was skipped: count it, and after
 * --rollback-after in a row go back to the newest memory snapshot (weights,
 * moments, sampler; the data loader stays, so the batches since are
 * skipped). Returns the snapshot's step, where the loop continues, or -1.
 * `can_restore` 0: this run keeps no snapshot to go back to. Collective. */
static int train_run_bad_step(TrainRun* r, Saver* sv, const Dist* d, GPT2* model, const Options* o, int step,
                              int can_restore) {
    if (++r->watch.bad_run < o->rollback_after || o->rollback_after == 0) return -1;
    int back = can_restore ? saver_restore_newest(sv, r, d, model, o) : -1;
    if (back < 0) {
        printf("rollback: %d bad steps in a row but no snapshot in memory (--snapshot-every): skipping on\n",
               r->watch.bad_run);
        return -1;
    }
    printf("rollback: %d bad steps in a row; weights and moments back to the snapshot of step %d, skipping the "
           "batches of steps %d..%d\n", r->watch.bad_run, back, back + 1, step + 1);
    r->watch.bad_run = 0;
    return back;
}

/* On an error: let the background threads finish (no collectives: the
 * other ranks may be gone), keep the memory snapshots for a resume. */
static void saver_abandon(Saver* sv) {
    saver_prepare_stop(sv);
    if (sv->copier_busy) CHECK(pthread_join(sv->copier, NULL) == 0, "cannot join the snapshot thread");
    if (sv->writer_busy) CHECK(pthread_join(sv->writer, NULL) == 0, "cannot join the state writer thread");
    sv->copier_busy = sv->writer_busy = 0;
}

static void saver_free(Saver* sv, int remove_memory) {
    saver_prepare_stop(sv);
    ledger_free(sv->model_params);
    for (int k = 0; k < OWN_SLOTS; k++) slot_unmap(&sv->own[k], remove_memory);
    for (int k = 0; k < HELD_SLOTS; k++) slot_unmap(&sv->held[k], remove_memory);
    if (remove_memory && sv->lock_file[0]) unlink(sv->lock_file); /* still held (the TrainRun's): safe to remove */
    memset(sv, 0, sizeof(*sv));
}

/* A model file (no training state) at `step`, for train_gpt.cu's gpu_train. */
MAYBE_UNUSED static void checkpoint_save(const GPT2* model, const Options* o, int step) {
    if (!o->output_dir[0]) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/model_%08d.bin", o->output_dir, step);
    if (gpt2_save(model, path) == 0) printf("saved %s\n", path);
    else fprintf(stderr, "warning: checkpoint at step %d not written; training continues\n", step);
}

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

/* --heartbeat: after every step rank 0 rewrites a small file with the step
 * and the time, so a supervisor can tell a hung run (the file goes stale)
 * from a slow one. Not fsync'd: it is a sign of life, not a record. */
static void heartbeat_write(const Options* o, int rank, int step) {
    if (!o->heartbeat[0] || rank != 0) return;
    char tmp[4400];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->heartbeat);
    FILE* f = fopen(tmp, "w");
    if (!f) return; /* a missing heartbeat is the supervisor's to notice */
    fprintf(f, "step %d %.0f\n", step, unix_ms());
    if (fclose(f) == 0) rename(tmp, o->heartbeat); /* never seen half-written */
}

/* Lines for a supervisor or for several ranks (start-up timing, the
 * data-parallel layout) are noise to a newcomer's single run: they print
 * with several ranks, a --heartbeat, under scripts/supervise.py (which sets
 * GPTC_ATTEMPT) or with --verbose 1. options_parse sets the flag. */
static int plumbing_wanted(const Dist* d) {
    return verbose_flag || d->world > 1 || getenv("GPTC_ATTEMPT") != NULL;
}

/* Where a (re)start spent its time, in wall-clock ms since the process
 * began: scripts/supervise.py reads these lines to split a recovery into
 * launch, communicator, state load and first step. */
static void timing_print(const Dist* d, const char* what, double unix_now) {
    if (!plumbing_wanted(d)) return;
    printf("timing: %s at %.0f (+%.0f ms since process start %.0f)\n", what, unix_now, unix_now - d->t_start, d->t_start);
    fflush(stdout);
}

/* ---- the loop's tail: train() in train_gpt.c and gpu_train() in the CUDA
 * twin run the same code after each update and at the end ---------------- */

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

/* How a step went: its loss (the ranks' mean), whether its gradients were
 * finite, whether its loss was a spike (z its z-score); either of the last
 * two skipped its update. */
typedef struct {
    double loss;
    int finite, spike;
    double z;
} StepOutcome;

/* A hot spare (--standby FIFO, issue 17): its set-up is done (model, the
 * training memory faulted in, tokenizer and data open, the snapshot slots
 * mapped: read, never written), and it holds no lock: it waits here for a
 * line on the FIFO, which scripts/supervise.py writes when the trainer it
 * stands behind has died. Returns 1 for "go", 0 for anything else or the
 * FIFO's end (the supervisor went away, or wants it gone), -1 when the FIFO
 * cannot be read (said). (Several ranks: standby_wait_ranks.) */
static int standby_wait(const Options* o) {
    printf("standby: ready; waiting for 'go' on %s (no lock taken, nothing written)\n", o->standby);
    fflush(stdout);
    int fd = open(o->standby, O_RDONLY | O_CLOEXEC); /* blocks until a writer opens it (supervise: already) */
    if (fd < 0) {
        FILE_ERROR(o->standby, "cannot open the standby FIFO: %s", strerror(errno));
        return -1;
    }
    char line[64];
    size_t n = 0;
    while (n + 1 < sizeof(line)) {
        ssize_t got = read(fd, line + n, 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0 || line[n] == '\n') break;
        n++;
    }
    close(fd);
    line[n] = '\0';
    return strcmp(line, "go") == 0;
}

/* A standby JOB (several ranks: supervise.py --spare 1 around mpirun, a
 * second `mpirun -np N` beside the active one): Open MPI cannot put a new
 * process in one dead rank's place, so the whole job stands by, and the
 * whole job is promoted when any rank of the active one dies. Rank 0 waits
 * on the FIFO (standby_wait); the others wait for its word in a
 * non-blocking broadcast, tested every 2 ms (a blocking one would spin a
 * core for as long as the spare waits). Returns standby_wait's verdict on
 * every rank. Collective. */
static int standby_wait_ranks(const Options* o, const Dist* d) {
    int go = d->rank == 0 ? standby_wait(o) : 0;
#ifdef USE_MPI
    if (d->world > 1) {
        MPI_Request req;
        MPI_CHECK(MPI_Ibcast(&go, 1, MPI_INT, 0, MPI_COMM_WORLD, &req));
        for (int done = 0; !done;) {
            MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
            struct timespec ts = {0, 2000000L};
            if (!done) nanosleep(&ts, NULL);
        }
    }
#else
    (void)d;
#endif
    return go;
}

/* A hot spare's turn, after its set-up (train_setup in train_gpt.c,
 * gpu_standby in the CUDA twin): its big buffers' pages written now, not
 * after the failure (gptc/ledger.h), then the wait; promoted, it takes the
 * run's locks as the heir of the trainer that died (a lock its dying
 * holder's kernel teardown still keeps counts as ours: gptc/state.h).
 * Returns 1 promoted, 0 dismissed (said: nothing was written), -1 after a
 * message. */
static int standby_take_over(TrainRun* r, const Options* o, const Dist* d) {
    big_write_all();
    test_hook_standby_setup();
    timing_print(d, "standby ready", unix_ms()); /* (supervise.py: promotable from here) */
    StartupMark mark = startup_begin();
    int go = standby_wait_ranks(o, d); /* (several ranks: the whole job stands by) */
    startup_end(SU_WAIT, mark);
    if (go <= 0) {
        if (go == 0) printf("standby: dismissed (no 'go' on %s): exiting, the run untouched\n", o->standby);
        return go;
    }
    printf("standby: promoted: taking the run over\n");
    r->lock.heir = 1;
    return train_run_claim(r, o) == 0 ? 1 : -1;
}

/* The start-up, from the process start to the first step done, split
 * (gptc/ledger.h's StartupClock): what the fast start (issue 17) measures.
 * Two lines: the wall clock, and the process's CPU time in the same phases
 * (all threads, user + kernel: on a shared machine the wall clock moves
 * with the other jobs' load, the CPU time much less). */
static void startup_print(const Dist* d) {
    if (d->rank != 0) return;
    double total = unix_ms() - d->t_start, first = time_ms() - startup.loaded_ms, rest = total - first;
    double cpu_first = process_cpu_ms() - startup.loaded_cpu;
    char line[1024], cpu[512];
    int n = snprintf(line, sizeof(line), "start-up: %.0f ms from process start to the first step done: allocate + "
                     "first touch %.0f ms (%.2f GB, %d threads, %s; huge pages %s, transparent huge pages: %s)", total,
                     startup.alloc_ms, startup.alloc_bytes / 1e9, num_threads(),
                     big_populate_how == 1 ? "MADV_POPULATE_WRITE" : big_populate_how == 0 ? "a write per page" : "none",
                     huge_pages_wanted() ? "asked" : "not asked (GPTC_HUGE_PAGES=1 asks)", huge_pages_mode());
    int m = snprintf(cpu, sizeof(cpu), "start-up CPU time (the process's, all threads, user + kernel): allocate + first "
                     "touch %.0f ms", startup.alloc_cpu);
    rest -= startup.alloc_ms;
    for (int k = 0; k < SU_PHASES; k++) {
        if (SU_ALWAYS[k] || startup.phase_ms[k] >= 0.5) { /* (printed as 1 ms or more) */
            n += snprintf(line + n, sizeof(line) - (size_t)n, ", %s %.0f ms", SU_NAMES[k], startup.phase_ms[k]);
            m += snprintf(cpu + m, sizeof(cpu) - (size_t)m, ", %s %.0f ms", SU_NAMES[k], startup.phase_cpu[k]);
        }
        rest -= startup.phase_ms[k];
    }
    struct rusage ru;
    long minor = 0, major = 0;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        minor = ru.ru_minflt - startup.loaded_faults;
        major = ru.ru_majflt - startup.loaded_major;
    }
    printf("%s, first step %.0f ms (%ld page faults, %ld from disk), other %.0f ms; random init: %zu normals drawn\n",
           line, first, minor, major, rest, rng_normals_filled);
    printf("%s, first step %.0f ms; before the first step %.0f ms in all\n", cpu, cpu_first, startup.loaded_cpu);
}

/* After step `step`'s update (0-based; the run started at `start`): say a
 * spike, the first step's time and the heartbeat; take a good loss into the
 * spike window, or count a bad step, which after --rollback-after in a row
 * goes back to the newest snapshot (`can_restore` 0: none is kept). Returns
 * the step the loop continues after (a rollback), or -1. Collective. */
static int train_run_after_step(TrainRun* r, Saver* sv, const Dist* d, GPT2* model, const Options* o, int step,
                                int start, const StepOutcome* s, int can_restore) {
    if (s->spike)
        printf("step %d: loss %.4f is a spike (z = %.1f > %.1f): update skipped\n", step + 1, s->loss, s->z, o->spike_z);
    if (step == start) {
        run_lock_settle(&r->lock); /* a promoted standby: the locks it inherited, held for real by now */
        timing_print(d, "first step done", unix_ms());
        startup_print(d);
        saver_prepare_start(sv); /* the snapshot slots' pages, from now on, in the background */
    }
    heartbeat_write(o, r->rank, step + 1);
    if (s->finite && !s->spike) {
        losswatch_accept(&r->watch, (float)s->loss);
        return -1;
    }
    int back = train_run_bad_step(r, sv, d, model, o, step, can_restore);
    if (back >= 0) r->rollbacks++;
    return back;
}

/* What the boundary after `done` steps asks for (never at the end, which
 * saves anyway): --stop-at, a save (--save-every, or the stop's), a
 * snapshot (a save's, or --snapshot-every's; none inside a run of bad steps). */
typedef struct {
    int done, stop, save, snapshot;
} Boundary;

static Boundary train_run_boundary(const TrainRun* r, const Options* o, int done) {
    Boundary b;
    b.done = done;
    b.stop = o->stop_at > 0 && done == o->stop_at && done < r->steps;
    b.save = (o->save_every > 0 && done % o->save_every == 0 && done < r->steps) || b.stop;
    int snap = o->snapshot_every > 0 && done % o->snapshot_every == 0 && done < r->steps;
    b.snapshot = (b.save || snap) && r->watch.bad_run == 0;
    return b;
}

/* --stop-at: wait for the last snapshot to reach its slot and the disk. */
static void train_run_stop(Saver* sv, const Dist* d, const Options* o, int done) {
    saver_before_update(sv);
    saver_poll(sv, d, o, 1);
    printf("stopping after step %d (--stop-at); continue with --resume 1\n", done);
}

/* The end of the loop: what the snapshots cost, and the rollbacks. */
static void train_run_report(const TrainRun* r, Saver* sv) {
    saver_stall_close(sv);
    if (sv->snapshots > 0)
        printf("snapshots: %d taken, stall %.2f ms per snapshot on average (worst %.1f ms); waits for the disk %.0f ms "
               "in all\n", sv->snapshots, sv->stall_ms / sv->snapshots, sv->max_stall_ms, sv->disk_wait_ms);
    if (r->rollbacks) printf("rollbacks: %d\n", r->rollbacks);
}

/* The final snapshot is handed to the Saver: wait until it is on disk.
 * 0, or -1 (said) when it could not be written. Collective. */
static int train_run_final_save(Saver* sv, const Dist* d, const Options* o) {
    saver_before_update(sv);
    saver_poll(sv, d, o, 1);
    if (!sv->last_failed) return 0;
    fprintf(stderr, "error: the final model and training state could not be written (see above); make room in %s and "
            "run again with --resume 1 to write them%s\n", o->output_dir,
            sv->memory ? " (from the memory snapshots, still in place)" : "");
    return -1;
}

#endif /* GPTC_SAVER_H */
