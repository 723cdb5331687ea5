// cuda_cpu.h — the kernel-execution core of the CPU execution layer for CUDA
// code (see dev/cuda/cpu/README.md).
//
// Included by: include/cuda_runtime.h (so by every .cu file the layer builds:
// train_gpt.cu, test_gpt.cu, dev/cuda/*.cu), runtime.cpp, test_cuda_cpu.cpp.
// Implemented in: dev/cuda/cpu/cuda_cpu.cpp (the scheduler, fibers, warp ops).
//
// What it gives a kernel written for CUDA:
//   dim3, uint3, gridDim, blockDim, blockIdx, threadIdx, warpSize
//   __global__ __device__ __host__ __forceinline__ __constant__ __launch_bounds__ (defined away)
//   __shared__ (static, poisoned with 0xFF bytes = NaN at every block start)
//   CPU_EXTERN_SHARED(T, name)  stands for `extern __shared__ T name[];`
//   __syncthreads, __syncwarp, __shfl_sync, __shfl_xor_sync, __shfl_down_sync,
//   __shfl_up_sync, __ballot_sync, __any_sync, __all_sync
//   atomicAdd (float, int, unsigned, unsigned long long), atomicMax, atomicCAS
//   the warp-collective core of nvcuda::wmma (include/mma.h builds the API on it)
// and to the host:
//   cpu_launch(kernel, grid, block, shared_bytes, args...)   for k<<<grid, block, shared_bytes>>>(args...)
//   cpu_func_set_max_dynamic_shared(kernel, bytes)           for cudaFuncSetAttribute(k, MaxDynamicSharedMemorySize, bytes)
//   cpu_get_last_error / cpu_peek_at_last_error / cpu_get_error_string / cpu_last_error_message
//   cpu_set_seed(seed)  (or env CUDA_CPU_SEED): the order fibers run in each barrier interval
//
// Every CUDA thread is a fiber (a hand-written x86-64 switch) with its own mmap'd stack and a guard
// page; one OS thread runs one block at a time, its fibers in a seeded order,
// each until it reaches a barrier, a warp operation or its end. Misuse that
// CUDA leaves undefined (a thread leaving a block whose other threads wait at
// __syncthreads, warp masks that cannot be met) stops the launch with an error
// that names the kernel, the block and the thread.
//
// The runtime API (memory, streams, events, launches on streams: runtime.cpp),
// cuBLASLt, NCCL and the launch-syntax translation (translate.py) build on it.
#pragma once
#define CUDA_CPU_LAYER 1 /* dev/cuda/common.h prints the counters beside a variant's time */

#include <cstddef>      // size_t
#include <cstdint>      // uint64_t
#include <cstring>      // memcpy: values through warp exchanges
#include <functional>   // std::function: the launch body
#include <string>       // where_now
#include <tuple>        // std::tuple, std::apply: kernel arguments, copied once per launch
#include <type_traits>  // std::decay_t, std::is_trivially_copyable
#include <utility>      // std::forward

// ---- banners, in reading order -----------------------------------------------
//   1. CUDA's built-in types and variables
//   2. qualifiers defined away, shared memory
//   3. barriers and warp operations
//   3b. tensor cores: the warp-collective WMMA calls
//   4. atomics
//   5. errors and launch

// ---- 1. CUDA's built-in types and variables ------------------------------------

// uint3 and dim3 are CUDA's own (vector_types.h compiles as host C++), so
// code written for nvcc sees the same types; its __host__/__device__ markers
// are redefined below.
#include <vector_types.h>

// Per OS thread; the scheduler sets threadIdx each time it resumes a fiber,
// and blockIdx/blockDim/gridDim when a block starts on this OS thread.
extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace cuda_cpu {
// Who is running, for the race checks inside a kernel (runtime.cpp): the
// block (linear), the thread in it, and how many barriers the block and
// warp syncs its warp have completed. Two accesses by different threads of
// one block are ordered only if a barrier (or, within a warp, a warp
// operation) completed between them; accesses of different blocks never are.
struct exec_point {
    bool in_kernel;
    bool in_atomic;       // inside atomicAdd and friends: unordered atomics do not race
    uint32_t block;       // linear block index
    uint32_t thread;      // linear thread index in the block
    uint32_t epoch;       // barriers the block has completed
    uint32_t warp_epoch;  // warp operations this thread's warp has completed
    const char* call;     // the warp-collective call whose memory accesses run now (wmma::load_matrix_sync), or null
};
extern thread_local exec_point exec;  // (per OS thread: others, like a saver thread, are never in a kernel)
// The block's shared memory, static and dynamic: the runtime's hooks send
// accesses there to shared_access, which checks never-written reads and
// races between threads of the block (state reset at every block start).
extern thread_local uintptr_t shared_static_lo, shared_static_bytes, shared_dynamic_lo, shared_dynamic_bytes;
void shared_access(uintptr_t a, size_t n, bool write);
// Off (CUDA_CPU_RACE_CHECK=0): races inside a kernel then show only as
// results that differ between seeds.
bool race_check_enabled();
}  // namespace cuda_cpu

// ---- 2. qualifiers defined away, shared memory ----------------------------------

#undef __global__
#undef __device__
#undef __host__
#undef __constant__
#undef __forceinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __launch_bounds__(...)

// A block runs on one OS thread at a time, and every block runs on the same
// OS thread (cuda_cpu.cpp runs the grid in order), so a plain static is shared
// by the fibers of a block, which is what __shared__ means. The named section
// lets the scheduler poison all of them (0xFF bytes: NaN as float, bf16 and
// double; -1 as int) at every block start, so a read before the write shows.
// If blocks later run on several OS threads, this becomes per-thread storage.
#undef __shared__
#define __shared__ __attribute__((section("cuda_cpu_shared"), used)) static

// `extern __shared__ T name[];` cannot be a macro of __shared__ (extern static
// is not C++); translate.py rewrites it to this. All
// such arrays alias the launch's dynamic shared memory, 128-byte aligned and
// poisoned like the static kind.
#define CPU_EXTERN_SHARED(T, name) T* name = reinterpret_cast<T*>(cuda_cpu::dynamic_shared())

namespace cuda_cpu {
void* dynamic_shared();  // this block's dynamic shared memory (nullptr when the launch asked for 0 bytes)
}

// ---- 3. barriers and warp operations ----------------------------------------------

// A fiber arrives and yields until every thread of the block has arrived.
void __syncthreads();

namespace cuda_cpu {
enum warp_op {
    WARP_SYNC, WARP_SHFL_IDX, WARP_SHFL_XOR, WARP_SHFL_DOWN, WARP_SHFL_UP,
    WARP_BALLOT, WARP_ANY, WARP_ALL,
    WARP_WMMA_FILL, WARP_WMMA_LOAD, WARP_WMMA_STORE, WARP_WMMA_MMA,  // section 3b
    WARP_MMA_16816, WARP_LDMATRIX,                                   // section 3c
};
// The calling lane arrives at a warp operation with its mask and value; it
// yields until every lane in the mask has arrived with the same operation,
// mask and width, then gets its result (the exchanged value's bits, or the
// ballot). Out-of-line in cuda_cpu.cpp, so shared memory is reloaded after it.
uint64_t warp_arrive(warp_op op, unsigned mask, uint64_t value, int arg, int width);

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                  "warp shuffles move values of at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T> inline T from_bits(uint64_t b, T like) {
    std::memcpy(&like, &b, sizeof(T));
    return like;
}
}  // namespace cuda_cpu

inline void __syncwarp(unsigned mask = 0xffffffffu) {
    cuda_cpu::warp_arrive(cuda_cpu::WARP_SYNC, mask, 0, 0, 32);
}
template <typename T> inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
    return cuda_cpu::from_bits(cuda_cpu::warp_arrive(cuda_cpu::WARP_SHFL_IDX, mask, cuda_cpu::to_bits(var), src_lane, width), var);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
    return cuda_cpu::from_bits(cuda_cpu::warp_arrive(cuda_cpu::WARP_SHFL_XOR, mask, cuda_cpu::to_bits(var), lane_mask, width), var);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cuda_cpu::from_bits(cuda_cpu::warp_arrive(cuda_cpu::WARP_SHFL_DOWN, mask, cuda_cpu::to_bits(var), (int)delta, width), var);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
    return cuda_cpu::from_bits(cuda_cpu::warp_arrive(cuda_cpu::WARP_SHFL_UP, mask, cuda_cpu::to_bits(var), (int)delta, width), var);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    return (unsigned)cuda_cpu::warp_arrive(cuda_cpu::WARP_BALLOT, mask, predicate != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int predicate) {
    return (int)cuda_cpu::warp_arrive(cuda_cpu::WARP_ANY, mask, predicate != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int predicate) {
    return (int)cuda_cpu::warp_arrive(cuda_cpu::WARP_ALL, mask, predicate != 0, 0, 32);
}

// ---- 3b. tensor cores: the warp-collective WMMA calls ----------------------------------
// include/mma.h gives kernels CUDA's nvcuda::wmma API (fragments,
// fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync) on these.
//
// A 16x16 fragment is spread over the 32 lanes of a warp, as on the GPU:
// lane l holds `per_lane` elements x[0..per_lane), element i being the matrix
// position wmma_position(map, i, per_lane) = row * 16 + col (row = m and
// col = k for matrix_a, k and n for matrix_b, m and n for an accumulator).
// CUDA leaves that mapping unspecified, so the layer picks one no code can
// rely on: an affine scramble of lane * per_lane + i, different for each kind
// of fragment (use, type, layout) and for each seed (CUDA_CPU_SEED). Code that
// assumes a mapping (the GPU's, or that an accumulator's elements line up with
// a matrix_a's) computes wrong values here, and different ones under another
// seed. Half matrix_a/b fragments hold 16 elements per lane, each position
// twice (in two lanes), as CUDA's num_elements says.
//
// Every call is warp-collective: all 32 lanes arrive at the same call with the
// same fragment kind (load and store: the same pointer, ldm and layout), or the
// launch fails (719), naming the lane that is missing. load, store and mma
// complete like a warp operation (they order the lanes' accesses as
// __syncwarp does; the loads and stores happen after it, each lane its own
// elements, through the instrumented code, so bounds and race checks see
// them); fill_fragment only checks that all lanes arrive, and orders nothing
// (on a GPU it is a register move).
namespace cuda_cpu {
enum wmma_use { WMMA_A, WMMA_B, WMMA_ACC };
enum wmma_type { WMMA_BF16, WMMA_HALF, WMMA_FLOAT };
enum wmma_layout { WMMA_ROW, WMMA_COL, WMMA_NONE };  // a fragment's own layout (matrix_a, matrix_b) or none (accumulator)
constexpr int wmma_kind(int use, int type, int layout) { return use * 9 + type * 3 + layout; }
constexpr int WMMA_KINDS = 27;
struct wmma_map {
    uint32_t mul, add;  // position = (mul * (lane * per_lane + i) + add) mod 256; mul odd: a permutation
    int lane;
};
inline int wmma_position(wmma_map m, int i, int per_lane) {
    return (int)((m.mul * (uint32_t)(m.lane * per_lane + i) + m.add) & 255u);
}
// load_matrix_sync (op WARP_WMMA_LOAD) and store_matrix_sync (WARP_WMMA_STORE):
// checks p and ldm, waits for the warp, returns this lane's mapping; the
// caller then moves its elements and calls wmma_leave. mem_layout: 0 row-major, 1 column-major.
wmma_map wmma_memory(warp_op op, int kind, const void* p, unsigned ldm, int mem_layout);
inline void wmma_leave() { exec.call = nullptr; }
// fill_fragment: every lane must arrive (`tag` names the fragment's type); orders nothing.
void wmma_fill(int tag);
// mma_sync: d = a * b + c, each lane passing its own fragments' elements;
// the products are exact, summed in fp32 over k in order from c (half d: rounded to nearest at the end).
void wmma_mma(int kind_d, int kind_a, int kind_b, int kind_c, void* d, const void* a, const void* b, const void* c);
}  // namespace cuda_cpu

// ---- 3c. PTX's warp-level tensor-core instructions and asynchronous copies -------------
// gptc/cuda/ptx.cuh gives kernels small device functions for
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, ldmatrix.sync.aligned
// .m8n8.{x1,x2,x4}[.trans].shared.b16 and cp.async.cg.shared.global (16
// bytes) with commit_group and wait_group: inline PTX on a GPU, these on the
// layer. Unlike WMMA's, these fragments' layouts are PTX's documented ones
// (PTX ISA, "Matrix Fragments for mma.m16n8k16", ldmatrix), which kernels
// rely on; so the layer implements exactly them, and a kernel that assumes
// another layout computes wrong values here as on a GPU.
//   mma_16816: d += a * b for a warp, each lane passing its 4 + 2 registers
//     of bf16 pairs and its 4 fp32 accumulators (products exact, the sum
//     over k in fp32 in k order from d). All 32 lanes, or the launch fails.
//   ldmatrix_rows: the calling lane's row address for an ldmatrix of `count`
//     8x8 matrices (lanes 8i..8i+7 name the rows of matrix i); checks every
//     used lane's address (shared memory, 16-byte aligned), waits for the
//     warp, and returns the warp's 32 addresses, from which ptx.cuh reads
//     this lane's elements (through the instrumented code, so the race and
//     never-written checks see them); ldmatrix_leave after.
//   async_issue / async_commit / async_take: cp.async's copy is modelled as
//     one completed at the wait: issue records the 16 bytes read from global
//     now (they must not change before the wait: they do not in a kernel),
//     nothing reaches shared memory until a cp.async.wait_group N takes every
//     copy of a group older than the newest N committed; ptx.cuh then stores
//     them, as the calling thread, at that point. A read of the destination
//     before its wait sees what was there before (never-written memory
//     faults), as a missing wait may on a GPU.
namespace cuda_cpu {
void mma_16816(float* d, const uint32_t* a, const uint32_t* b);
const uintptr_t* ldmatrix_rows(const void* row, int count, bool trans);
inline void ldmatrix_leave() { exec.call = nullptr; }
void async_issue(void* dst, const void* bytes16);
void async_commit();
bool async_take(int keep, void** dst, void* bytes16);  // one copy of a group older than the newest `keep`, or false
}  // namespace cuda_cpu

// ---- 4. atomics ---------------------------------------------------------------------
// The fibers of a block share one OS thread and blocks run one after another,
// so plain read-modify-writes would do today; GCC's __atomic builtins keep
// them right if blocks later run on several OS threads. Each returns the old
// value, as CUDA's do.

// Each marks itself atomic for the race checks (cuda_cpu::exec.in_atomic).
namespace cuda_cpu {
struct atomic_scope {
    atomic_scope() { exec.in_atomic = true; }
    ~atomic_scope() { exec.in_atomic = false; }
};
}  // namespace cuda_cpu
inline int atomicAdd(int* a, int v) { cuda_cpu::atomic_scope s; return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { cuda_cpu::atomic_scope s; return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
    cuda_cpu::atomic_scope s;
    return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* a, float v) {
    cuda_cpu::atomic_scope s;
    float old, sum;  // a compare-and-swap loop: x86 has no float fetch-add
    __atomic_load(a, &old, __ATOMIC_RELAXED);
    do { sum = old + v; } while (!__atomic_compare_exchange(a, &old, &sum, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
inline int atomicMax(int* a, int v) {
    cuda_cpu::atomic_scope s;
    int old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
inline int atomicCAS(int* a, int compare, int v) {
    cuda_cpu::atomic_scope s;
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;  // the old value, whether or not it was swapped
}
inline unsigned atomicCAS(unsigned* a, unsigned compare, unsigned v) {
    cuda_cpu::atomic_scope s;
    __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}

// ---- 5. errors and launch ------------------------------------------------------------

// The numbers are cudaError_t's, so the runtime layer can pass them through.
enum cpu_error {
    CPU_SUCCESS = 0,
    CPU_ERROR_INVALID_VALUE = 1,           // cudaErrorInvalidValue: dynamic shared memory over the kernel's limit
    CPU_ERROR_INVALID_CONFIGURATION = 9,   // cudaErrorInvalidConfiguration: grid or block dimensions
    CPU_ERROR_LAUNCH_FAILURE = 719,        // cudaErrorLaunchFailure: what the kernel did (barrier, warp misuse)
};
// Like cudaGetLastError: the last error since the previous call, then reset.
cpu_error cpu_get_last_error();
cpu_error cpu_peek_at_last_error();
const char* cpu_get_error_string(cpu_error e);
// The full text of the last error: kernel, block, thread and what went wrong.
const char* cpu_last_error_message();
// The seed of the order fibers run in; the default is CUDA_CPU_SEED from the
// environment, else 1. Block b of a launch uses its own stream seeded by (seed, b).
void cpu_set_seed(uint64_t seed);

namespace cuda_cpu {
// The driver's limits (H100/H200, compute capability 9.0).
constexpr unsigned MAX_THREADS_PER_BLOCK = 1024;
constexpr unsigned MAX_BLOCK_Z = 64;
constexpr unsigned MAX_GRID_YZ = 65535;
constexpr unsigned MAX_GRID_X = 2147483647u;
constexpr size_t DEFAULT_MAX_DYNAMIC_SHARED = 48 * 1024;  // without the attribute
constexpr size_t OPTIN_MAX_DYNAMIC_SHARED = 232448;      // 227 KB, with it

// Checks the configuration and runs the grid; returns and records the error.
cpu_error launch_body(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes,
                      const std::function<void()>& body);
cpu_error set_max_dynamic_shared(const void* key, const char* name, size_t bytes);
// The two halves of launch_body, for the runtime's streams: the driver's
// checks at the launch call, the grid later when the stream runs it.
cpu_error launch_check(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes);
cpu_error launch_run(const char* name, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);
// "cuda_cpu: kernel 'k' block (x,y,z) thread (x,y,z) [lane l of warp w]: " inside a kernel, else "".
std::string where_now();


template <typename... P, typename... A>
cpu_error launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "cpu_launch: the kernel takes a different number of arguments");
    // Copied once per launch, as CUDA copies a launch's arguments; each thread
    // gets its own by-value copy when std::apply calls the kernel.
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    return launch_body(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes,
                       [&] { std::apply(kernel, params); });
}
template <typename... P>
cpu_error func_set_max_dynamic_shared(const char* name, void (*kernel)(P...), size_t bytes) {
    return set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), name, bytes);
}
}  // namespace cuda_cpu

// k<<<grid, block, shared_bytes>>>(args...) becomes cpu_launch(k, grid, block, shared_bytes, args...).
// A template kernel goes in parentheses: cpu_launch((k<float, 4>), ...). The
// stream argument comes with the streams layer.
#define cpu_launch(kernel, ...) ::cuda_cpu::launch(#kernel, kernel, __VA_ARGS__)
#define cpu_func_set_max_dynamic_shared(kernel, bytes) ::cuda_cpu::func_set_max_dynamic_shared(#kernel, kernel, bytes)

// ---- 6. counters: what a profiler counts (counters.cpp) --------------------------------
// On with CUDA_CPU_COUNT=1 (off: one test of a bool per access). Per kernel
// name, summed over its launches; written at exit as a TSV table to
// CUDA_CPU_COUNT_FILE (else stderr). How requests, sectors and wavefronts
// are reconstructed from the lanes' accesses: counters.cpp's header and README.md.
namespace cuda_cpu {
struct kernel_counts {
    unsigned long long launches, blocks, threads_per_block, dynamic_smem;
    unsigned long long global_load_requests, global_load_sectors, global_store_requests, global_store_sectors;
    unsigned long long shared_load_requests, shared_load_wavefronts, shared_store_requests, shared_store_wavefronts;
    unsigned long long atomic_requests, barriers, mma_instructions, tensor_flops;
    unsigned long long distinct_sectors;  // per launch, summed: the global 32-byte sectors it touches at least once
    unsigned long long dram_round_trips, cache_round_trips;  // per warp, summed: batches of loads waited for in turn
    unsigned long long sfu_ops;  // per thread: exp, log, tanh, sqrt, sin, cos, pow calls (the SFU's work)
    unsigned long long shared_ideal_wavefronts;  // loads and stores: the wavefronts without bank conflicts (each
                                                 // phase's distinct bytes / 128, at least 1)
};
extern bool count_on;
void count_launch(const char* name, unsigned long long blocks, unsigned long long threads, size_t dynamic_smem);
void count_launch_end();  // a launch's distinct sectors into its kernel's counts
void count_block_start();
void count_access(uintptr_t a, size_t n, bool write, bool shared, void* ret);
void count_flush();    // at every barrier and block end: the lanes' records become warp requests
void count_barrier();  // one block-wide barrier completed
void count_sfu();      // one special-function call of a kernel's thread
void count_mma();      // one warp's mma_sync
void count_mma_16816(); // one warp's mma.sync.m16n8k16
void count_rows_memory(const uintptr_t* rows, int count); // an ldmatrix of `count` 8x8 matrices (8 rows of 16 bytes each)
void count_wmma_memory(bool store, bool shared, const void* p, unsigned ldm, size_t element_bytes);
kernel_counts count_get(const char* name);  // zeros for a kernel never launched
void count_mark();                           // count_summary_since_mark() counts from here
std::string count_summary_since_mark();      // one line: what the launches since count_mark() did
void count_reset();
const char* count_header();
std::string count_row(const char* name, const kernel_counts& k);
}  // namespace cuda_cpu
