// device.h — the CPU execution layer's inside: what its runtime (runtime.cpp)
// gives the library modules that stand in for cuBLASLt (cublaslt.cpp) and
// NCCL (nccl_mpi.cpp). Application code never includes this; it sees CUDA's
// own headers (cuda_runtime_api.h, cublasLt.h, nccl.h) and cuda_cpu.h.
//
// The model: device memory is one arena of this process; every device
// operation (a kernel, a copy, a matmul, a collective) is enqueued on a
// stream and runs later, on the host thread, when the scheduler picks it or
// a synchronisation forces it. While an operation runs, the layer knows which
// one it is, so it can check and record every byte it touches: bounds,
// never-written reads, and races with unordered operations on other streams.
#pragma once

#include <driver_types.h>  // cudaError_t, cudaStream_t: CUDA's own types

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace cuda_cpu {

// Bytes a device operation reads or writes: `rows` runs of `bytes` each,
// `stride` bytes apart (a column-major matrix: rows = columns, bytes = rows *
// element size, stride = ld * element size). rows = 1 is one plain range.
struct Range {
    const void* p;
    size_t bytes;
    bool write;
    size_t rows = 1;
    size_t stride = 0;
};

// Where [p, p + bytes) lies: "" when it is inside one live device allocation,
// else what is wrong, in words ("0x... is not device memory", "... 12 bytes
// past the end of the 4096-byte allocation made by cudaMalloc #7", "... was
// freed"). For argument checks before an operation is enqueued.
std::string device_range_problem(const void* p, size_t bytes);
bool is_device_pointer(const void* p);

// Enqueue a device operation on stream s (nullptr: the legacy default
// stream). `name` says what it is in reports ("cublasLtMatmul", "ncclAllReduce").
// `ranges` are exactly the bytes it reads and writes: at run time the layer
// checks them (every read byte must have been written before: else a report),
// marks the written bytes initialised, and records them for the race check.
// `body` runs on the host thread with device memory accessible; it must touch
// device memory only inside `ranges`.
// run_now: run it before returning (with whatever it depends on by stream
// order and events, in the scheduler's order); for NCCL, whose collectives
// meet the other ranks' in program order.
// Returns cudaSuccess, or cudaErrorInvalidResourceHandle for a destroyed stream.
cudaError_t enqueue(cudaStream_t s, const char* name, std::vector<Range> ranges, std::function<void()> body,
                    bool run_now = false);

// A misuse the layer cannot turn into an error code (the run cannot go on
// meaningfully): prints "cuda_cpu: " + the message, the operation running (or
// the last API call), and exits with status 86, the layer's own exit status,
// so tests can tell its reports from the program's own failures.
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
constexpr int FATAL_EXIT = 86;

}  // namespace cuda_cpu
