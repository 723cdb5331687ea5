// device_stub.cpp — a test double for the CPU layer's runtime (runtime.cpp):
// just enough of device.h for test_cublaslt.cpp and test_nccl_mpi.cpp to test
// cublaslt.cpp and nccl_mpi.cpp alone. Not part of the layer (test_layer.cu,
// test_gpt_cu_cpu and gpu_check_dp on emulated GPUs test both through the
// real runtime).
//
// Device memory here is ordinary host memory. Allocations made through
// stub_device_alloc() are remembered, so device_range_problem() can say that a
// pointer is not device memory or that a range runs past its allocation (the
// real runtime says more: freed memory, which cudaMalloc); a test that makes
// none (test_nccl_mpi) has every non-null pointer count. enqueue() runs the
// body at once (one stream: every operation ordered after the previous one)
// and keeps the name and ranges of the last operation for the test to check.
// With stub_defer set it holds the bodies instead, until stub_run_deferred():
// a stream the device has not reached yet (test_cublaslt checks that what a
// call was given is what its body uses, whatever the host does meanwhile).
#include "device.h"  // defines: Range, device_range_problem, is_device_pointer, enqueue, fatal

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace cuda_cpu {

static std::map<uintptr_t, size_t> stub_allocations;  // start -> bytes
std::vector<Range> stub_last_ranges;                  // the ranges of the last enqueue (tests read them)
std::string stub_last_name;
bool stub_defer = false;                              // hold enqueued bodies until stub_run_deferred()
static std::vector<std::function<void()>> stub_deferred;

// Memory the stub counts as device memory: 256-byte aligned like cudaMalloc,
// filled with 0xFF bytes (NaN for float and bf16) like the runtime's poison.
void* stub_device_alloc(size_t bytes) {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) fatal("stub_device_alloc(%zu): out of memory", bytes);
    memset(p, 0xFF, bytes);
    stub_allocations[(uintptr_t)p] = bytes;
    return p;
}

void stub_device_free(void* p) {
    stub_allocations.erase((uintptr_t)p);
    free(p);
}

std::string device_range_problem(const void* p, size_t bytes) {
    char msg[160];
    if (!p) return "a null pointer is not device memory";
    // A test that never calls stub_device_alloc (test_nccl_mpi: plain malloc)
    // has every non-null pointer count as device memory.
    if (stub_allocations.empty()) return "";
    uintptr_t a = (uintptr_t)p;
    auto it = stub_allocations.upper_bound(a);
    if (it == stub_allocations.begin()) {
        snprintf(msg, sizeof(msg), "%p is not device memory", p);
        return msg;
    }
    --it;
    uintptr_t end = it->first + it->second;
    if (a >= end) {
        snprintf(msg, sizeof(msg), "%p is not device memory", p);
        return msg;
    }
    if (a + bytes > end) {
        snprintf(msg, sizeof(msg), "[%p, +%zu) runs %zu bytes past the end of the %zu-byte allocation", p, bytes,
                 (size_t)(a + bytes - end), it->second);
        return msg;
    }
    return "";
}

bool is_device_pointer(const void* p) { return p && device_range_problem(p, 1).empty(); }

cudaError_t enqueue(cudaStream_t, const char* name, std::vector<Range> ranges, std::function<void()> body, bool) {
    stub_last_name = name;
    stub_last_ranges = std::move(ranges);
    if (stub_defer) stub_deferred.push_back(std::move(body));
    else body();
    return cudaSuccess;
}

// Runs the held bodies in order; how many there were.
int stub_run_deferred() {
    std::vector<std::function<void()>> bodies;
    bodies.swap(stub_deferred);
    for (auto& b : bodies) b();
    return (int)bodies.size();
}

void fatal(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda_cpu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    _Exit(FATAL_EXIT);
}

}  // namespace cuda_cpu
