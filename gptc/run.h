/*
 * gptc/run.h — a training run's bookkeeping, apart from the model and its
 * arithmetic: the TrainRun (data loaders for train, val and the eval set,
 * the batch and step counts, the schedule and AdamW settings, the log, the
 * run's locks), its set-up and release, when the val loss, the eval and the
 * samples are due, and the progress line and JSONL record of each step.
 *
 * Included by train_gpt.c in section 8, before gptc/saver.h, gptc/resume.h
 * and gptc/loop_tail.h (which work on the TrainRun); train() there and gpu_train() in
 * train_gpt.cu share it. Defines: TrainRun, train_run_claim,
 * train_run_init, train_run_free, train_run_val_due, train_run_eval_due,
 * train_run_sample_due, train_run_log_val, train_run_log_step.
 */
#ifndef GPTC_RUN_H
#define GPTC_RUN_H

/* Everything a training loop needs besides the model and its arithmetic:
 * the data, the step count, the schedule and optimizer settings, the log.
 * train() below and gpu_train() in train_gpt.cu share it, so both print the
 * same lines and write the same JSONL. */
typedef struct {
    DataLoader train, val;
    int use_val;
    EvalRun eval;     /* --eval-file */
    int use_eval;
    int B, T, total, grad_accum, steps;
    LRSchedule sched;
    AdamWConfig opt;
    Rng sample_rng;
    FILE* log;
    double start_ms;
    int rank, world;
    uint64_t nonce;   /* this run's (gptc/state.h) */
    LossWatch watch;  /* the loss-spike detector */
    int rollbacks;    /* rollbacks to a snapshot so far (gptc/saver.h) */
    int nan_upto, spike_upto; /* the test hooks' (gptc/test_hooks.h): the last step each planted a fault at */
    RunLock lock;     /* this process's hold on the run's folders (gptc/run_lock.h) */
    double mfu;       /* the last step's model FLOPs utilisation in %, for the log (the CUDA twin's); 0 = none */
} TrainRun;

/* The run is this process's now: its locks (one trainer per run directory:
 * refused here, before anything is written, the log included), what a dead
 * writer left half-written removed, then its log. 0, or -1 after a message. */
static int train_run_claim(TrainRun* r, const Options* o) {
    if (run_lock(&r->lock, o->output_dir, o->snapshot_every > 0 ? o->shm_dir : NULL, r->rank) != 0) return -1;
    partial_saves_remove(o->output_dir, r->rank);
    if (o->log_file[0] && r->rank == 0 && !(r->log = fopen(o->log_file, o->resume ? "a" : "w"))) {
        FILE_ERROR(o->log_file, "cannot open log file: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* rank/world: this process's place among the data-parallel ranks (0, 1 alone). */
static int train_run_init(TrainRun* r, const GPT2Config* c, const Options* o, const char* train_pattern,
                          const char* val_pattern, int rank, int world) {
    memset(r, 0, sizeof(*r));
    r->lock.dir.fd = r->lock.shm.fd = -1; /* (not held yet: a standby takes it later) */
    r->rank = rank;
    r->world = world;
    r->B = o->batch_size;
    r->T = o->seq_len;
    r->total = o->total_batch_size > 0 ? o->total_batch_size : r->B * r->T * world;
    if (r->total % (r->B * r->T * world) != 0) {
        fprintf(stderr, "error: --total-batch-size %d is not a multiple of B*T*ranks = %d*%d*%d\n", r->total, r->B,
                r->T, world);
        return -1;
    }
    r->grad_accum = r->total / (r->B * r->T * world);
    printf("batch: B=%d T=%d on %d rank(s), %d tokens per step (%d micro-batches)\n", r->B, r->T, world, r->total,
           r->grad_accum);
    StartupMark mark = startup_begin();
    if (dataloader_init(&r->train, train_pattern, r->B, r->T, rank, world, c->vocab_size, o->shuffle,
                        (uint64_t)o->seed) != 0)
        return -1;
    r->use_val = val_pattern[0] != '\0' && o->val_every > 0;
    if (r->use_val && dataloader_init(&r->val, val_pattern, r->B, r->T, rank, world, c->vocab_size, 0, 0) != 0) {
        dataloader_free(&r->train);
        return -1;
    }
    r->use_eval = o->eval_file[0] != '\0';
    if (r->use_eval && eval_run_init(&r->eval, o->eval_file, r->B, r->T, c->vocab_size) != 0) {
        if (r->use_val) dataloader_free(&r->val);
        dataloader_free(&r->train);
        return -1;
    }
    if (r->use_eval)
        printf("eval: %s, %d multiple-choice examples, scored every %d steps on %d rank(s)\n", o->eval_file,
               r->eval.set.num_examples, o->eval_every, world);
    if (r->use_val)
        printf("val data: unigram entropy %.3f nats (a model that ignores context can do no better)\n",
               dataloader_unigram_entropy(&r->val));
    startup_end(SU_DATA, mark);
    r->steps = o->steps;
    if (r->steps < 0) r->steps = (int)(dataloader_batches_per_epoch(&r->train) / r->grad_accum);
    if (r->steps < 1) r->steps = 1;
    printf("data: %d train shard(s), %lld micro-batches per epoch; %d steps\n", r->train.num_shards,
           dataloader_batches_per_epoch(&r->train), r->steps);
    if (o->output_dir[0] && mkdir_p(o->output_dir) != 0) {
        FILE_ERROR(o->output_dir, "cannot create output directory: %s", strerror(errno));
        return -1;
    }
    if (o->output_dir[0] && o->snapshot_every > 0 && mkdir_p(o->shm_dir) != 0) {
        FILE_ERROR(o->shm_dir, "cannot create the --shm-dir folder for memory snapshots: %s", strerror(errno));
        return -1;
    }
    if (!o->standby[0] && train_run_claim(r, o) != 0) return -1; /* (a standby: once promoted, train_setup) */
    ALWAYS(schedule_parse(o->lr_schedule, &r->sched.kind) == 0);
    r->sched.max_lr = o->lr;
    r->sched.warmup_steps = o->warmup_steps;
    r->sched.total_steps = r->steps;
    r->sched.final_frac = o->final_lr_frac;
    r->sched.decay_frac = o->decay_frac;
    r->opt.beta1 = o->beta1;
    r->opt.beta2 = o->beta2;
    r->opt.eps = o->eps;
    r->opt.weight_decay = o->weight_decay;
    r->opt.decay_all = o->decay_all;
    rng_init(&r->sample_rng, (uint64_t)o->seed + 1);
    r->start_ms = time_ms();
    return 0;
}

static void train_run_free(TrainRun* r) {
    run_unlock(&r->lock, 0); /* (the slots' lock file goes with the slots: saver_free) */
    if (r->log) fclose(r->log);
    if (r->use_val) dataloader_free(&r->val);
    if (r->use_eval) eval_run_free(&r->eval);
    dataloader_free(&r->train);
    memset(r, 0, sizeof(*r));
}

static int train_run_val_due(const TrainRun* r, const Options* o, int step) {
    return r->use_val && (step % o->val_every == 0 || step == r->steps);
}

static int train_run_eval_due(const TrainRun* r, const Options* o, int step) {
    return r->use_eval && (step == 0 || step == r->steps || (o->eval_every > 0 && step % o->eval_every == 0));
}

static int train_run_sample_due(const TrainRun* r, const Options* o, int step) {
    return o->sample_every > 0 && step > 0 && (step % o->sample_every == 0 || step == r->steps);
}

static void train_run_log_val(TrainRun* r, int step, float val_loss) {
    printf("val loss %.4f\n", val_loss);
    if (r->log) fprintf(r->log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, val_loss);
}

/* The progress line and the JSONL record of a finished step (0-based);
 * `extra` is inserted after tokens/s (the CUDA twin's MFU). */
static void train_run_log_step(TrainRun* r, int step, double loss, float lr, double norm, double ms, int finite,
                               const char* extra) {
    double elapsed = (time_ms() - r->start_ms) / 1000.0;
    double eta = elapsed / (step + 1) * (r->steps - step - 1);
    printf("step %5d/%d | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | eta %dm%02ds%s\n", step + 1,
           r->steps, loss, lr, norm, ms, r->total / (ms / 1000.0), extra, (int)eta / 60, (int)eta % 60,
           finite ? "" : " | non-finite: update skipped");
    fflush(stdout);
    if (r->log) {
        char mfu[48] = "";
        if (r->mfu > 0.0) snprintf(mfu, sizeof(mfu), ", \"mfu\": %.2f", r->mfu);
        fprintf(r->log, "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6e, \"norm\": %.6f, \"ms\": %.2f, \"unix_ms\": %.0f, "
                "\"tokens_per_s\": %.0f%s}\n", step + 1, loss, lr, norm, ms, unix_ms(), r->total / (ms / 1000.0), mfu);
        fflush(r->log);
    }
}

#endif /* GPTC_RUN_H */
