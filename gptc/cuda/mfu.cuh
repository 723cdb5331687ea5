/* gptc/cuda/mfu.cuh: throughput and model FLOPs utilisation on the GPU.
 * Included by train_gpt.cu before its training loop. Defines gpu_peak_tflops,
 * flops_per_token, mfu_format and gpu_device_print. */
#ifndef GPTC_CUDA_MFU_CUH
#define GPTC_CUDA_MFU_CUH

/* Peak dense bf16 TFLOP/s by device name (datasheets); 0 = unknown, and
 * then MFU is printed as n/a, never guessed. */
static double gpu_peak_tflops(const char* name) {
    if (strstr(name, "H100") && strstr(name, "PCIe")) return 756.0;
    if (strstr(name, "H100") || strstr(name, "H200") || strstr(name, "H800")) return 989.0;
    if (strstr(name, "A100") || strstr(name, "A800")) return 312.0;
    return 0.0;
}

/* Training FLOPs per token: 6 P + 6 L C T (DESIGN.md; forward + backward). */
static double flops_per_token(const GPT2Config* c, size_t P, int T) {
    return 6.0 * (double)P + 6.0 * c->num_layers * (double)c->channels * T;
}

/* " | MFU 41.2%" or " | MFU n/a" */
static void mfu_format(char* out, size_t cap, double tokens_per_s, double fpt, double peak_tflops) {
    if (peak_tflops <= 0.0 || !(tokens_per_s > 0.0)) snprintf(out, cap, " | MFU n/a");
    else snprintf(out, cap, " | MFU %.1f%%", 100.0 * tokens_per_s * fpt / (peak_tflops * 1e12));
}


/* The device, and its peak bf16 TFLOP/s (0: unknown). */
static double gpu_device_print(void) {
    int dev;
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    double peak = gpu_peak_tflops(prop.name);
    char peak_s[64];
    if (peak > 0) snprintf(peak_s, sizeof(peak_s), "%.0f TFLOP/s (datasheet)", peak);
    else snprintf(peak_s, sizeof(peak_s), "unknown (MFU n/a)");
    printf("device: %s, %.1f GB, compute capability %d.%d, peak dense bf16 %s\n", prop.name,
           prop.totalGlobalMem / 1e9, prop.major, prop.minor, peak_s);
    return peak;
}

#endif /* GPTC_CUDA_MFU_CUH */
