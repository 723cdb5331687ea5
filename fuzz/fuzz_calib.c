/*
 * fuzz/fuzz_calib.c — libFuzzer harness for the calibration cache
 * (<cache>/calibration.txt, "gptc calibration v4": a header line, then
 * key|numbers lines), read by gptc/calib.h's calib_load (--plan, --auto,
 * --snapshot-every auto, every start).
 *
 *   make fuzz/.build/fuzz_calib    (or make fuzz, make test-fuzz)
 *
 * The input is the file; the harness looks up one fixed key (a small model
 * on one thread and one rank). Oracles for a line that is taken: written
 * back by calib_save into a fresh cache and read again, every figure is the
 * same to the 6 significant digits the cache keeps (NaN as NaN, an
 * infinity as itself); and the key and path are left as they were.
 * And what a cache must be to be believed: every figure taken finite and
 * not negative, the row counts within what a calibration measures
 * (16..512), and the runtime model's step time from them finite and
 * positive.
 */
#include "fuzz_common.h"

#define FUZZ_CALIB_KEY "cpu=fuzz threads=1 ranks=1 build=1.1 C=32 NH=2 Vp=128 Tc=16"

static void fuzz_calib_blank(Calibration* cal, const char* path) {
    memset(cal, 0, sizeof(*cal));
    cal->C = 32; cal->NH = 2; cal->Vp = 128; cal->Tc = 16;
    snprintf(cal->key, sizeof(cal->key), "%s", FUZZ_CALIB_KEY);
    snprintf(cal->path, sizeof(cal->path), "%s", path);
}

static int fuzz_close6(double a, double b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    if (isinf(a) || isinf(b)) return a == b;
    return fabs(a - b) <= 1e-5 * fabs(a) + 1e-300 || (fabs(a) < 1e-300 && fabs(b) < 1e-300);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_init("calib");
    const char* in = fuzz_write("calibration.txt", data, size);
    Calibration cal;
    fuzz_calib_blank(&cal, in);
    if (!calib_load(&cal)) return fuzz_refused();
    FUZZ_ORACLE(!strcmp(cal.key, FUZZ_CALIB_KEY) && !strcmp(cal.path, in), "the key or the path changed");
    const char* out = fuzz_path("again/calibration.txt");
    remove(out);
    Calibration w = cal;
    snprintf(w.path, sizeof(w.path), "%s", out);
    calib_save(&w);
    Calibration back;
    fuzz_calib_blank(&back, out);
    FUZZ_ORACLE(calib_load(&back), "a cache written from what was read has no line for the key");
    double *v1[CALIB_NUMBERS], *v2[CALIB_NUMBERS];
    calib_numbers(&cal, v1);
    calib_numbers(&back, v2);
    for (int i = 0; i < CALIB_NUMBERS; i++)
        FUZZ_ORACLE(fuzz_close6(*v1[i], *v2[i]), "figure %d: %.17g read, %.17g after a round trip", i, *v1[i], *v2[i]);
    {
        for (int i = 0; i < CALIB_NUMBERS; i++)
            FUZZ_ORACLE(isfinite(*v1[i]) && *v1[i] >= 0, "figure %d is %g: a cache must not be believed", i, *v1[i]);
        FUZZ_ORACLE(cal.rows[0] >= 16 && cal.rows[1] <= 512 && cal.rows[0] < cal.rows[1], "rows %g, %g", cal.rows[0],
                    cal.rows[1]);
        GPT2Config c = {16, 100, 128, 2, 2, 32}; /* maxT V Vp L NH C */
        CommKnobs k = comm_knobs_flat(1, 0, 0);
        cal.share = 1.0;
        StepTime t = runtime_step(&cal, &c, 2, 16, 1, &k);
        FUZZ_ORACLE(isfinite(t.step) && t.step > 0, "a step of the cached rates is predicted %g ms", t.step);
    }
    return 0;
}
