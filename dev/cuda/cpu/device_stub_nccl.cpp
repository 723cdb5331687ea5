// device_stub_nccl.cpp — a test double for the CPU layer's runtime (device.h),
// for test_nccl_mpi, which tests nccl_mpi.cpp alone (train_gpt_cu_cpu on
// emulated GPUs tests it through the real runtime).
//
// Device memory is ordinary host memory: every non-null pointer counts as
// device memory, and enqueue runs the operation at once (one stream, so
// every operation is ordered after the previous one). It records the last
// operation's name and ranges, so the test can check what each collective
// declares it reads and writes.
#include "device.h"  // defines: the interface implemented here

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace cuda_cpu {

std::string device_range_problem(const void* p, size_t bytes) {
    (void)bytes;
    if (!p) return "a null pointer is not device memory";
    return "";
}

bool is_device_pointer(const void* p) { return p != nullptr; }

// What the test reads back: the last enqueued operation.
std::string stub_last_name;
std::vector<Range> stub_last_ranges;

cudaError_t enqueue(cudaStream_t s, const char* name, std::vector<Range> ranges, std::function<void()> body,
                    bool run_now) {
    (void)s;
    (void)run_now;  // everything runs now here
    stub_last_name = name;
    stub_last_ranges = ranges;
    body();
    return cudaSuccess;
}

void fatal(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda_cpu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    exit(FATAL_EXIT);
}

}  // namespace cuda_cpu
