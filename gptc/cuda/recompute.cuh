/* gptc/cuda/recompute.cuh: which activations each --recompute level keeps.
 * Included by train_gpt.cu after GpuActivations, whose order the tables follow.
 * Defines RECOMPUTE_LEVELS, GPU_ACTS_LAYER_BEGIN/END, GPU_ACTIVATION_NAMES,
 * GPU_ACT_RECOMPUTED_FROM, gpu_act_kept, gpu_activation_sizes and
 * gpu_layer_work_sizes; the recompute itself is train_gpt.cu's
 * gpu_layer_recompute. */
#ifndef GPTC_CUDA_RECOMPUTE_CUH
#define GPTC_CUDA_RECOMPUTE_CUH

/* Recomputation (--recompute N). Backward reads each
 * layer's activations; a level keeps fewer of them from the forward and
 * recomputes the rest, layer by layer in backward, into one layer's working
 * set (the scratch's `work`, carved as GpuGPT2's `work`):
 *   level  keeps per layer                       recomputes in backward
 *   0      all 13 per-layer tensors              nothing
 *   1      all but fch_gelu                      fch_gelu = GELU(fch)
 *   2      all but fch_gelu, ln1, ln2            + ln1, ln2 (LayerNorm again)
 *   3      residual3 only (the next layer's      the layer's forward but its last
 *          input, so each layer's input)         GEMM (fcproj, whose output is kept)
 * Level 1 keeps fch (GELU's input) and drops fch_gelu: backward needs both
 * (fch for GELU's derivative, fch_gelu for fcprojw's gradient), and
 * fch_gelu = GELU(fch) is one elementwise pass, while fch from fch_gelu is
 * not to be had (GELU is not one-to-one below its minimum) but by the fc
 * GEMM again (8 B T C^2 flops). Level 2 drops the LayerNorm outputs, whose
 * inputs (the layer's input, residual2) are kept; level 3 everything but the
 * residual stream: about B T C bf16 per layer.
 * Bitwise the same at every level: a recompute runs the kernel the forward
 * ran on the same inputs (train_gpt.cu's gpu_layer_recompute calls the
 * forward's own halves and kernels), LayerNorm included:
 * it runs layernorm_forward_gpu again, writing the kept mean and rstd with
 * the same bits, rather than a second kernel that would apply them. The
 * exception would be the GELU of the cuBLASLt epilogue (--gelu-fusion 1),
 * which is cuBLASLt's arithmetic and not our elementwise kernel's: so at
 * levels 1 and 2 the forward's GELU is our kernel, whatever --gelu-fusion
 * says (gpu_gelu_in_epilogue; the backward's DGELU epilogue stays, its
 * input fch is kept), and level 3 reruns the fc GEMM, epilogue and all.
 * Levels 0 and 3 are therefore bitwise the same under either --gelu-fusion;
 * 1 and 2 equal them with --gelu-fusion 0, and each other always. (On a
 * GPU that also takes cuBLASLt choosing the same algorithm for a GEMM on
 * the working set as on a layer's slice: lt_matmul's key has the pointers'
 * alignment, 256 for the working set and for every slice when B T C is a
 * multiple of 128, as for GPT-2 at any B and T = 1024.) */
#define RECOMPUTE_LEVELS 4
#define GPU_ACTS_LAYER_BEGIN 1 /* ln1 */
#define GPU_ACTS_LAYER_END 14  /* one past residual3 */
static const char* const GPU_ACTIVATION_NAMES[NUM_GPU_ACTIVATIONS] = {
    "encoded", "ln1", "ln1_mean", "ln1_rstd", "qkv", "atty", "lse", "residual2", "ln2", "ln2_mean",
    "ln2_rstd", "fch", "fch_gelu", "residual3", "lnf", "lnf_mean", "lnf_rstd", "logits", "losses"};
/* The level from which activation i is recomputed instead of kept (4: kept at every level). */
static const int GPU_ACT_RECOMPUTED_FROM[NUM_GPU_ACTIVATIONS] = {
    4, 2, 3, 3, 3, 3, 3, 3, 2, 3, 3, 3, 1, 4, 4, 4, 4, 4, 4};

static int gpu_act_kept(int i, int recompute) { return recompute < GPU_ACT_RECOMPUTED_FROM[i]; }

/* The activations kept at level `recompute` (elements, element bytes): a
 * per-layer tensor recomputed at that level has 0 elements here and one
 * layer's in gpu_layer_work_sizes. */
static void gpu_activation_sizes(size_t n[NUM_GPU_ACTIVATIONS], size_t bytes[NUM_GPU_ACTIVATIONS],
                                 const GPT2Config* c, int B, int T, int recompute) {
    size_t C = c->channels, L = c->num_layers, NH = c->num_heads, Vp = c->padded_vocab_size, BT = (size_t)B * T;
    size_t e[NUM_GPU_ACTIVATIONS] = {BT * C, L * BT * C, L * BT, L * BT, L * BT * 3 * C, L * BT * C,
                                     L * B * NH * T, L * BT * C, L * BT * C, L * BT, L * BT,
                                     L * BT * 4 * C, L * BT * 4 * C, L * BT * C, BT * C, BT, BT, BT * Vp, BT};
    int is_float[NUM_GPU_ACTIVATIONS] = {0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1};
    for (int i = 0; i < NUM_GPU_ACTIVATIONS; i++) {
        n[i] = gpu_act_kept(i, recompute) ? e[i] : 0;
        bytes[i] = is_float[i] ? 4 : 2;
    }
}

/* One layer's working set of what level `recompute` does not keep: the
 * per-layer tensors gpu_activation_sizes leaves out, one layer of each. */
static void gpu_layer_work_sizes(size_t n[NUM_GPU_ACTIVATIONS], size_t bytes[NUM_GPU_ACTIVATIONS],
                                 const GPT2Config* c, int B, int T, int recompute) {
    gpu_activation_sizes(n, bytes, c, B, T, 0);
    for (int i = 0; i < NUM_GPU_ACTIVATIONS; i++)
        n[i] = gpu_act_kept(i, recompute) ? 0 : n[i] / (size_t)c->num_layers;
}

#endif /* GPTC_CUDA_RECOMPUTE_CUH */
