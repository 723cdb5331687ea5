/*
 * gptc/run_lock.h — one trainer per run directory: the locks a trainer
 * holds on its --output-dir and on its snapshot slots in --shm-dir, and how
 * a promoted hot spare inherits them from a trainer still being torn down.
 *
 * Included by train_gpt.c in section 8 after gptc/state.h (run_tag names
 * the slots' lock); gptc/run.h's train_run_claim takes the locks, and
 * gptc/saver.h removes the slots' lock file with the slots. Defines:
 * RunLock, process_exiting, run_lock, run_lock_path, run_lock_settle,
 * run_unlock.
 */
#ifndef GPTC_RUN_LOCK_H
#define GPTC_RUN_LOCK_H

#include "util.h"  /* FileLock, file_lock, file_unlock */
#include "state.h" /* run_tag */

/* One trainer per run directory. Two trainers on one --output-dir (a second
 * launch while the first runs, a standby woken too early) would overwrite
 * each other's run.id, states and snapshots, and the survivor would then
 * call fine states corrupt. So each process locks, before it writes
 * anything, exactly what it could overwrite:
 *   - rank 0, the output folder: <dir>/.lock. Every rank writes its state
 *     files there, but the ranks of one job start, write and die together
 *     (a failed rank ends the job: MPI_Abort, mpirun), so the job is one
 *     holder, and rank 0 stands for it; a second job's rank 0 is refused and
 *     its ranks stop together before any of them writes (train_run_init
 *     takes the locks before the log, the slots and run.id);
 *   - each rank with memory snapshots, its slots in --shm-dir:
 *     <shm>/gptc-<tag>-at<r>.lock covers every slot rank r keeps (its own
 *     and its neighbour's replicas, "-at<r>-"). /dev/shm is per host, so
 *     this also holds where the output folder's file system has no locks.
 * A lock is an flock (util.h's file_lock): the kernel drops it when the
 * process dies, so a restart under scripts/supervise.py or Slurm, which
 * waits for the old processes to end, gets it at once. (A standby trainer
 * that does its set-up ahead of a failure, once there is one, must take it
 * only when it is promoted: the set-up before train_run_init writes nothing.) */
typedef struct {
    FileLock dir, shm;
    /* a promoted standby (--standby) inherits: a lock held by a process on
     * this host that is already exiting (SIGKILLed: process_exiting) counts
     * as ours at once, and a thread takes it for real when the kernel drops
     * it (run_lock_settle). The kernel frees a dead process's memory before
     * it closes its files, so for a GPT-2 124M trainer the lock comes free
     * ~0.3-1 s after the kill (gptc/README: failover): time the spare spends
     * loading the state and taking its first step instead. */
    int heir;
    int waiting[2];      /* dir, shm: a thread is waiting for the lock */
    pthread_t waiter[2];
} RunLock;

/* Is process `pid` on its way out: exiting (PF_EXITING in /proc/PID/stat's
 * flags: a fatal signal, or exit) or a zombie? Such a process never runs
 * its own code again, so nothing it holds can be written by it any more.
 * 0 for a live process, or one that is gone (then its locks are free, or
 * held by someone new). */
static int process_exiting(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char* p = strrchr(buf, ')'); /* after "pid (comm)": the comm may hold anything */
    char state = '?';
    int ppid, pgrp, session, tty, tpgid;
    unsigned flags = 0;
    if (!p || sscanf(p + 1, " %c %d %d %d %d %d %u", &state, &ppid, &pgrp, &session, &tty, &tpgid, &flags) != 7)
        return 0;
    return state == 'Z' || state == 'X' || (flags & 0x4u); /* 0x4: PF_EXITING */
}

/* The pid in a lock's holder line ("pid N on host H (started ...)", util.h's
 * file_lock) when H is this host; 0 otherwise. */
static int lock_holder_local_pid(const char* holder) {
    int pid = 0;
    char host[256], me[256];
    if (sscanf(holder, "pid %d on host %255s", &pid, host) != 2 || gethostname(me, sizeof(me)) != 0) return 0;
    me[sizeof(me) - 1] = '\0';
    return strcmp(host, me) == 0 ? pid : 0;
}

/* A heir's thread: take the lock once the exiting holder's kernel teardown
 * lets it go (polled every ms, at most 60 s). */
static void* run_lock_waiter(void* arg) {
    FileLock* l = (FileLock*)arg;
    char path[4400], holder[512];
    snprintf(path, sizeof(path), "%s", l->path);
    struct timespec ms = {0, 1000000L};
    for (int i = 0; i < 60000; i++) {
        FileLock got;
        if (file_lock(&got, path, holder, sizeof(holder)) == LOCK_TAKEN) {
            l->fd = got.fd;
            return NULL;
        }
        nanosleep(&ms, NULL);
    }
    return NULL;
}

/* A heir's locks, held for real: wait for its threads (after the first
 * step: the teardown is long over). A lock still not free then, a minute
 * after its holder began to exit, is a machine in trouble: say so and exit
 * (the supervisor restarts the run, which then waits for the lock). */
static void run_lock_settle(RunLock* l) {
    for (int which = 0; which < 2; which++) {
        if (!l->waiting[which]) continue;
        pthread_join(l->waiter[which], NULL);
        l->waiting[which] = 0;
        FileLock* f = which == 0 ? &l->dir : &l->shm;
        CHECK(f->fd >= 0, "%s is still held a minute after its holder began to exit; this process stops (a restart "
              "waits for the lock): look at what holds it (cat %s)", f->path, f->path);
    }
}

/* The lock file of `which` (0: the output folder's, 1: rank's slots'). */
static void run_lock_path(char* out, size_t cap, const char* output_dir, const char* shm_dir, int rank, int which) {
    if (which == 0) snprintf(out, cap, "%s/.lock", output_dir);
    else snprintf(out, cap, "%s/gptc-%016llx-at%d.lock", shm_dir, (unsigned long long)run_tag(output_dir), rank);
}

/* The end of the run: give the locks back (`remove_shm`: the slots are
 * gone, so is their lock file; the output folder's stays, it is tiny). */
static void run_unlock(RunLock* l, int remove_shm) {
    run_lock_settle(l);
    file_unlock(&l->shm, remove_shm);
    file_unlock(&l->dir, 0);
}

/* Lock the run's folders for this process (above): `shm_dir` NULL when the
 * run keeps no memory snapshots. 0, or -1 after a message that names the
 * holder: exit then, before touching anything. Under MPI the ranks decide
 * together (every refused rank says why before any of them aborts, so rank
 * 0's word on the output folder is never cut short by another rank's
 * abort); elsewhere, each rank for itself. */
static int run_lock(RunLock* l, const char* output_dir, const char* shm_dir, int rank) {
    l->dir.fd = l->shm.fd = -1;
    if (!output_dir[0]) return 0;
    int refused = 0;
    for (int which = 0; which < 2 && !refused; which++) {
        if ((which == 0 && rank != 0) || (which == 1 && !shm_dir)) continue;
        char path[4400], holder[512];
        run_lock_path(path, sizeof(path), output_dir, shm_dir, rank, which);
        FileLock* f = which == 0 ? &l->dir : &l->shm;
        int rc = file_lock(f, path, holder, sizeof(holder));
        int dying = rc == LOCK_HELD && l->heir ? lock_holder_local_pid(holder) : 0;
        if (dying && process_exiting(dying)) { /* a promoted standby: see RunLock */
            printf("standby: %s is held by %s, which is exiting: taken over now, the lock follows when the kernel "
                   "lets it go\n", path, holder);
            snprintf(f->path, sizeof(f->path), "%s", path);
            f->fd = -1;
            CHECK(pthread_create(&l->waiter[which], NULL, run_lock_waiter, f) == 0, "cannot start a thread");
            l->waiting[which] = 1;
            continue;
        }
        if (rc == LOCK_HELD && which == 0)
            fprintf(stderr, "error: --output-dir %s is in use by %s: wait for it, or use another --output-dir\n",
                    output_dir, holder);
        if (rc == LOCK_HELD && which == 1)
            fprintf(stderr, "error: rank %d: --shm-dir %s holds the memory snapshots of --output-dir %s, in use by %s: "
                    "wait for it, or use another --output-dir\n", rank, shm_dir, output_dir, holder);
        if (rc == LOCK_UNSUPPORTED)
            fprintf(stderr, "warning: rank %d: cannot lock %s (%s): nothing stops a second trainer on this run from "
                    "overwriting its states; start one at a time\n", rank, path, holder);
        refused = rc == LOCK_HELD || rc == LOCK_FAILED;
    }
#ifdef USE_MPI
    int up = 0, down = 0;
    MPI_CHECK(MPI_Initialized(&up));
    MPI_CHECK(MPI_Finalized(&down));
    if (up && !down) MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &refused, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
#endif
    if (!refused) return 0;
    run_unlock(l, 0);
    return -1;
}

#endif /* GPTC_RUN_LOCK_H */
