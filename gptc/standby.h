/*
 * gptc/standby.h — the hot spare (--standby FIFO): a second trainer, set up
 * in full beside the active one, that waits for scripts/supervise.py's
 * word and takes the run over from the newest snapshot when the active
 * one dies; with several ranks the whole standby job waits and is promoted.
 *
 * Included by train_gpt.c in section 8 after gptc/loop_tail.h
 * (timing_print); train_setup there and gpu_standby in train_gpt.cu call
 * standby_take_over. Defines: standby_wait, standby_wait_ranks,
 * standby_take_over.
 */
#ifndef GPTC_STANDBY_H
#define GPTC_STANDBY_H

/* A hot spare (--standby FIFO): its set-up is done (model, the
 * training memory faulted in, tokenizer and data open, the snapshot slots
 * mapped: read, never written), and it holds no lock: it waits here for a
 * line on the FIFO, which scripts/supervise.py writes when the trainer it
 * stands behind has died. Returns 1 for "go", 0 for anything else or the
 * FIFO's end (the supervisor went away, or wants it gone), -1 when the FIFO
 * cannot be read (said). (Several ranks: standby_wait_ranks.) */
static int standby_wait(const Options* o) {
    struct stat sb;
    if (stat(o->standby, &sb) == 0 && S_ISDIR(sb.st_mode)) { /* open() of a folder succeeds, its read() fails */
        FILE_ERROR(o->standby, "--standby: expected a FIFO (mkfifo PATH; scripts/supervise.py --spare 1 makes one), "
                   "found a directory");
        return -1;
    }
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
        if (got < 0) { /* a read error is no word from the supervisor: said, not taken for the FIFO's end */
            FILE_ERROR(o->standby, "cannot read the standby FIFO: %s", strerror(errno));
            close(fd);
            return -1;
        }
        if (got == 0 || line[n] == '\n') break;
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
 * holder's kernel teardown still keeps counts as ours: gptc/run_lock.h).
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

#endif /* GPTC_STANDBY_H */
