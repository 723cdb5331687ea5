/*
 * gptc/loop_tail.h — what train() in train_gpt.c and gpu_train() in the
 * CUDA twin run the same way around each step: the signs of life a
 * supervisor reads (heartbeat, timing lines, the start-up split) and the
 * loop's tail (after an update: spikes, bad steps and rollbacks; at a step
 * boundary: stop, save, snapshot; at the end: the report and the final save).
 *
 * Included by train_gpt.c in section 8 after gptc/saver.h and
 * gptc/resume.h. Defines: heartbeat_write, plumbing_wanted, timing_print,
 * startup_print; StepOutcome, train_run_after_step; Boundary,
 * train_run_boundary, train_run_stop, train_run_report, train_run_final_save.
 */
#ifndef GPTC_LOOP_TAIL_H
#define GPTC_LOOP_TAIL_H

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

/* The start-up, from the process start to the first step done, split
 * (gptc/ledger.h's StartupClock): what the fast start measures.
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

/* ---- the loop's tail ---------------------------------------------------- */

/* How a step went: its loss (the ranks' mean), whether its gradients were
 * finite, whether its loss was a spike (z its z-score); either of the last
 * two skipped its update. */
typedef struct {
    double loss;
    int finite, spike;
    double z;
} StepOutcome;

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

#endif /* GPTC_LOOP_TAIL_H */
