/*
 * bench_train.c — times GPT-2 training steps of train_gpt.c (forward,
 * backward, clipping, AdamW) on random tokens, with a breakdown by phase.
 *
 *   make dev/cpu/bench_train && dev/cpu/bench_train 4 64 3 [L]
 *   args: B T steps [num_layers, default 12 = GPT-2 124M]
 * Prints one parseable line (scripts/bench.sh reads it):
 *   gptc B=4 T=64 ms/step=... gflops=... peak_rss_gb=... threads=2
 * FLOPs per step = B*T*(6P + 6*L*C*T), the same formula as bench_torch.py.
 */
#define TESTING
#include "train_gpt.c"
#include <sys/resource.h>

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s B T steps [num_layers]\n", argv[0]);
        return EXIT_FAILURE;
    }
    int B = atoi(argv[1]), T = atoi(argv[2]), steps = atoi(argv[3]);
    int L = argc > 4 ? atoi(argv[4]) : 12;
    CHECK(B > 0 && T > 0 && T <= 1024 && steps > 0 && L > 0, "bad arguments");
    GPT2Config c = config_from_depth(12);
    c.num_layers = L;
    GPT2 model;
    gpt2_init_random(&model, &c, 1337);
    gpt2_alloc_training(&model, B, T);
    int* x = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    int* y = (int*)xmalloc(sizeof(int) * (size_t)B * T);
    Rng rng;
    rng_init(&rng, 42);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int)(rng_u32(&rng) % (uint32_t)c.vocab_size);
        y[i] = (int)(rng_u32(&rng) % (uint32_t)c.vocab_size);
    }
    AdamWConfig opt = {0.9f, 0.95f, 1e-8f, 0.1f, 0};
    double best = 1e30, fwd = 0, bwd = 0, upd = 0;
    for (int s = 0; s <= steps; s++) { /* step 0 is a warmup, not timed */
        double t0 = time_ms();
        float loss = gpt2_forward(&model, x, y, B, T);
        double t1 = time_ms();
        gpt2_zero_grad(&model);
        gpt2_backward(&model, 1.0f);
        double t2 = time_ms();
        double norm = gradients_clip(&model, 1.0);
        adamw_update(&model, &opt, 1e-4f, s + 1);
        double t3 = time_ms();
        printf("step %d: loss %.4f norm %.3f | forward %.0f ms, backward %.0f ms, clip+adamw %.0f ms, total %.0f ms\n",
               s, loss, norm, t1 - t0, t2 - t1, t3 - t2, t3 - t0);
        if (s > 0 && t3 - t0 < best) { best = t3 - t0; fwd = t1 - t0; bwd = t2 - t1; upd = t3 - t2; }
    }
    double P = (double)model.num_parameters;
    double flops = (double)B * T * (6.0 * P + 6.0 * L * c.channels * T);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("best step: forward %.0f ms, backward %.0f ms, clip+adamw %.0f ms\n", fwd, bwd, upd);
    printf("gptc B=%d T=%d ms/step=%.1f gflops=%.1f peak_rss_gb=%.2f threads=%d\n", B, T, best,
           flops / (best * 1e-3) / 1e9, ru.ru_maxrss / 1048576.0, num_threads());
    free(x);
    free(y);
    gpt2_free(&model);
    return 0;
}
