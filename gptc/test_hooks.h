/*
 * gptc/test_hooks.h — the faults the tests plant in a run, to show that the
 * checks catch them ("test the tester"). Compiled in only with
 * -DGPTC_TEST_HOOKS: the Makefile's test builds (test_gpt, test_gpt_asan,
 * train_gpt_hooks, train_gpt_mpi_hooks, the CPU execution layer's builds of
 * the CUDA twin). Without it (train_gpt, train_gpt_mpi, train_gpt_cu) each
 * hook is a trivial inline that returns 0 or does nothing, so a user's
 * binary reads none of these variables and holds none of their names.
 *
 * Included by train_gpt.c in section 8 after gptc/run.h (the step hooks keep
 * their marks in the TrainRun), before the headers that call the hooks;
 * train_gpt.cu calls test_hook_spike and test_hooks_print through it.
 * Defines: test_hook_nan, test_hook_spike, test_hooks_print (GPTC_INJECT_NAN,
 * GPTC_INJECT_SPIKE: the bad-step tests of test_gpt.c and test_zero3.sh);
 * test_hook_standby_setup (GPTC_STANDBY_SETUP_MS: a hot spare still setting
 * up when it is needed, test_failover.sh, test_spare_ranks.sh);
 * test_hook_plan_error (GPTC_INJECT_PLAN_ERROR), test_hook_runtime_error
 * (GPTC_INJECT_RUNTIME_ERROR), test_hook_calib_slow (GPTC_CALIB_PLANT_SLOW):
 * scripts/tests/test_plan.sh's planted faults in the memory plan, the runtime
 * model and the calibration; test_hook_gpu_runtime (GPTC_GPU_RUNTIME_PLANT):
 * scripts/tests/test_gpu_runtime.sh's in the GPU's runtime model. (GPTC_ZEROPP_DUMP, a record of ZeRO++'s wire
 * rather than a fault, is gptc/zeropp.h's, under the same switch.)
 */
#ifndef GPTC_TEST_HOOKS_H
#define GPTC_TEST_HOOKS_H

#ifdef GPTC_TEST_HOOKS

/* GPTC_INJECT_NAN and GPTC_INJECT_SPIKE list steps (1-based,
 * comma-separated) at which rank 0 puts a NaN into its gradients, or at
 * which the loss the spike detector sees is raised by 100; each step once,
 * though a rollback replays it. */
static int inject_at(const char* var, int step, int* done_upto) {
    const char* list = getenv(var);
    if (!list || step <= *done_upto) return 0; /* once per step: a rollback replays step numbers */
    for (const char* p = list; *p;) {
        char* end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        if (v == step) {
            *done_upto = step;
            return 1;
        }
        p = *end == ',' ? end + 1 : end;
        if (end == p) break;
    }
    return 0;
}

/* Is `step` (1-based) one at which a test hook plants its fault? These
 * two calls are the only places the loops meet GPTC_INJECT_*. */
static int test_hook_nan(TrainRun* r, int step) { return inject_at("GPTC_INJECT_NAN", step, &r->nan_upto); }
static double test_hook_spike(TrainRun* r, int step) {
    return inject_at("GPTC_INJECT_SPIKE", step, &r->spike_upto) ? 100.0 : 0.0; /* added to the loss the rule sees */
}

/* Said once at the start when a step hook is set. `nan_works` 0: the
 * trainer cannot plant NaN gradients (the CUDA twin). */
static void test_hooks_print(int nan_works) {
    const char *nan = getenv("GPTC_INJECT_NAN"), *spike = getenv("GPTC_INJECT_SPIKE");
    if (nan_works && (nan || spike))
        printf("test hooks: NaN gradients at steps [%s], loss spikes at steps [%s]\n", nan ? nan : "", spike ? spike : "");
    if (!nan_works && spike) printf("test hooks: loss spikes at steps [%s]\n", spike);
    if (!nan_works && nan) printf("test hooks: GPTC_INJECT_NAN is not implemented on the GPU (ignored)\n");
}

/* GPTC_STANDBY_SETUP_MS=N makes a standby's set-up N ms longer. */
static void test_hook_standby_setup(void) {
    const char* delay = getenv("GPTC_STANDBY_SETUP_MS");
    if (!delay || atoi(delay) <= 0) return;
    printf("standby: test hook GPTC_STANDBY_SETUP_MS: %d ms more set-up\n", atoi(delay));
    fflush(stdout);
    struct timespec ts = {atoi(delay) / 1000, (long)(atoi(delay) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* GPTC_INJECT_PLAN_ERROR=k (a component's index) plants one byte more in
 * the plan's component k, which plan_check must catch. */
static void test_hook_plan_error(size_t setup[MEM_COMPONENTS]) {
    const char* plant = getenv("GPTC_INJECT_PLAN_ERROR");
    if (plant && atoi(plant) >= 0 && atoi(plant) < MEM_COMPONENTS) setup[atoi(plant)] += 1;
}

/* GPTC_INJECT_RUNTIME_ERROR=k plants a wrong coefficient in runtime_step
 * that scripts/tests/test_plan.sh's closed form must catch: 1, the inter-node
 * link's bytes counted 25% high; 2, ZeRO-3's backward gathers left out of
 * one level's time. 0: none. */
static int test_hook_runtime_error(void) {
    const char* v = getenv("GPTC_INJECT_RUNTIME_ERROR");
    return v ? atoi(v) : 0;
}

/* GPTC_CALIB_PLANT_SLOW=r: is this rank the one made the slowest in the
 * calibration (its GEMMs 3x, its attention marked 12.345 ms)? */
static int test_hook_calib_slow(int rank) {
    const char* plant = getenv("GPTC_CALIB_PLANT_SLOW");
    return plant && plant[0] && atoi(plant) == rank;
}

/* GPTC_GPU_RUNTIME_PLANT=k plants a wrong term in train_gpt_cu's runtime
 * model (gptc/cuda/runtime.cuh) that scripts/tests/test_gpu_runtime.sh's
 * predicted-against-measured check must catch: 1, a step's micro-batches
 * counted once. 0: none. */
__attribute__((unused)) static int test_hook_gpu_runtime(void) { /* (read by train_gpt.cu only) */
    const char* v = getenv("GPTC_GPU_RUNTIME_PLANT");
    return v ? atoi(v) : 0;
}

#else /* a user's build: no hook reads anything */

static inline int test_hook_nan(TrainRun* r, int step) { (void)r, (void)step; return 0; }
static inline double test_hook_spike(TrainRun* r, int step) { (void)r, (void)step; return 0.0; }
static inline void test_hooks_print(int nan_works) { (void)nan_works; }
static inline void test_hook_standby_setup(void) {}
static inline void test_hook_plan_error(size_t setup[MEM_COMPONENTS]) { (void)setup; }
static inline int test_hook_runtime_error(void) { return 0; }
static inline int test_hook_calib_slow(int rank) { (void)rank; return 0; }
static inline int test_hook_gpu_runtime(void) { return 0; }

#endif /* GPTC_TEST_HOOKS */

#endif /* GPTC_TEST_HOOKS_H */
