/*
 * gptc/saver.h — snapshots and saves: each rank's training state copied
 * into memory in the background, replicated to its neighbour, written to
 * disk on a second thread; retention; the rollback to the newest snapshot
 * after bad steps.
 *
 * Included by train_gpt.c in section 8 after gptc/run.h (it works on the
 * model, the data-parallel ranks (Dist), the options and the TrainRun);
 * gptc/resume.h and gptc/loop_tail.h build on it, and train_gpt.cu's
 * gpu_train uses the same calls. The record itself (its format, checksums,
 * files and slots) is gptc/state.h's. Defines: state_info_of,
 * state_complete_steps, state_prune, slot_path; OWN_SLOTS, HELD_SLOTS;
 * shm_dir_check; Saver (saver_init, saver_prepare_start,
 * saver_prepare_finish, saver_forget_after, saver_before_update,
 * saver_stall_close, saver_mark, saver_poll, saver_snapshot,
 * saver_restore_newest, saver_abandon, saver_free); train_run_bad_step;
 * checkpoint_save.
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
    char lock_file[4400];  /* the slots' lock (gptc/run_lock.h), removed with them */
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

#endif /* GPTC_SAVER_H */
