/* gptc/cuda/graphs.cuh: a training micro-batch and one GPU's update, captured as CUDA graphs and replayed.
 * Included by train_gpt.cu after the model's update and the offload. Defines
 * gpu_graph_run, gpu_micro_batch (forward + backward of a micro-batch whose
 * tokens are on the device) and gpu_update_gated (the norm and AdamW, gated
 * on the device). MicroBatchShape and UpdateShape, GpuGPT2's members, are
 * train_gpt.cu's. */
#ifndef GPTC_CUDA_GRAPHS_CUH
#define GPTC_CUDA_GRAPHS_CUH

/* ---- CUDA graphs ----------------------------------------------------------
 * A step of GPT-2 124M launches about 400 kernels and GEMMs; launched one
 * by one, each costs the host a few microseconds and the GPU a gap. A CUDA
 * graph records the launches once (stream capture) and replays them as one.
 * What a replay cannot change are the launches' arguments: so everything
 * that varies from step to step is read by the kernels from device memory
 * that the host fills before each launch (StepInputs: the tokens, the
 * encoder's chunks and their counts, the micro-batch's loss slot, the
 * update's AdamWStep), and the encoder's grids are fixed. Nothing in a
 * captured piece may wait for the GPU (CUDA refuses it during capture).
 * The CPU execution layer models capture and replay (dev/cuda/cpu/README.md). */

/* Runs `work(g, arg)` on the stream: with g->graphs set, captured into
 * *exec the first time and replayed after (the caller makes sure `arg` is
 * the same each time); else as ordinary launches. */
static void gpu_graph_run(GpuGPT2* g, cudaGraphExec_t* exec, void (*work)(GpuGPT2*, const void*), const void* arg) {
    if (!g->graphs) {
        work(g, arg);
        return;
    }
    if (!*exec) {
        cudaGraph_t graph;
        CUDA_CHECK(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
        work(g, arg);
        CUDA_CHECK(cudaStreamEndCapture(g->stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
    }
    CUDA_CHECK(cudaGraphLaunch(*exec, g->stream));
}

static void gpu_micro_batch_work(GpuGPT2* g, const void* arg) {
    const MicroBatchShape* mb = (const MicroBatchShape*)arg;
    gpu_forward_run(g, mb->B, mb->T, 1, mb->dloss);
    gpu_backward(g);
}

/* A training micro-batch whose tokens gpu_tokens_upload has sent: forward
 * with the loss scale dloss, then backward (captured and replayed under
 * graphs). */
static void gpu_micro_batch(GpuGPT2* g, int B, int T, float dloss) {
    MicroBatchShape mb;
    memset(&mb, 0, sizeof(mb)); /* (memcmp'd) */
    mb.B = B;
    mb.T = T;
    mb.dloss = dloss;
    if (g->graph_micro) ALWAYS(!memcmp(&mb, &g->graph_micro_shape, sizeof(mb)));
    g->graph_micro_shape = mb;
    gpu_graph_run(g, &g->graph_micro, gpu_micro_batch_work, &mb);
    g->last_B = B; /* (what the forward's host code sets; a replay runs no host code) */
    g->last_T = T;
    g->has_targets = 1;
}

static void gpu_update_work(GpuGPT2* g, const void* arg) {
    const UpdateShape* u = (const UpdateShape*)arg;
    gpu_grad_norm_run(g);
    gpu_update_run(g, u->opt, u->max_norm, u->micro_batches);
}

/* One GPU: the norm and the update, gated on the device (update_gate_kernel),
 * so the host launches it right after the backward without waiting; then
 * waits for the step and returns the norm before clipping, with the mean
 * loss in *loss. */
static double gpu_update_gated(GpuGPT2* g, const AdamWConfig* opt, float lr, int t, float max_norm, uint32_t seed,
                               int micro_batches, double* loss) {
    UpdateShape u;
    memset(&u, 0, sizeof(u));
    u.opt = opt;
    u.max_norm = max_norm;
    u.micro_batches = micro_batches;
    if (g->graph_update) ALWAYS(!memcmp(&u, &g->graph_update_shape, sizeof(u)));
    g->graph_update_shape = u;
    gpu_update_values_set(g, opt, lr, t, seed);
    gpu_graph_run(g, &g->graph_update, gpu_update_work, &u);
    CUDA_CHECK(cudaEventRecord(g->update_sent, g->stream));
    double norm = gpu_grad_norm_fetch(g);
    *loss = gpu_losses_fetch(g, micro_batches);
    return norm;
}

#endif /* GPTC_CUDA_GRAPHS_CUH */
