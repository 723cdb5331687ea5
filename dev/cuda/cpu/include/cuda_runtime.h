// cuda_runtime.h — what `#include <cuda_runtime.h>` finds when the CPU
// execution layer builds CUDA sources with the host compiler (dev/cuda/cpu/cpu.mk
// puts dev/cuda/cpu/include before CUDA's own include folder). It stands in
// for CUDA's cuda_runtime.h, which only nvcc can read:
//   - CUDA's own cuda_runtime_api.h: every runtime function, type and enum,
//     exactly as the real library declares them (implemented in runtime.cpp);
//   - cuda_cpu.h: kernels' built-in variables, __syncthreads, warp operations,
//     atomics, __shared__;
//   - CPU_LAUNCH, which translate.py writes for `k<<<grid, block, smem, stream>>>(args)`;
//   - the few device intrinsics the project's kernels use, as host functions.
#pragma once

#include <cuda_runtime_api.h>  // CUDA's own: cudaMalloc, cudaStream_t, cudaError_t, ...

#include "../cuda_cpu.h"

#include <cuda_bf16.h>  // CUDA's own, as host C++; included here so the wrappers below follow it

#include <cmath>   // expf, tanhf, sqrtf: device math is the host's
#include <memory>  // std::shared_ptr: a launch's arguments live until it runs
#include <type_traits>  // std::common_type_t: min, max

// ---- the special-function unit's work, counted (CUDA_CPU_COUNT=1) -------------------
// A GPU computes these through its SFU (MUFU: 16 results per clock per SM on
// sm_80/sm_90), which bounds softmax-heavy kernels. With counting on, each call
// a kernel's thread makes is one SFU operation (counters.cpp, count_sfu); host
// code calling them is not counted. std::expf and the like are not used, so
// function-like macros catch every call.
namespace cuda_cpu {
void count_sfu();  // in the layer (not instrumented): tests count_on there, as a kernel cannot read a host variable
}  // namespace cuda_cpu
inline float cuda_cpu_sfu(float r) {
    cuda_cpu::count_sfu();
    return r;
}
#define expf(x) cuda_cpu_sfu(::expf(x))
#define exp2f(x) cuda_cpu_sfu(::exp2f(x))
#define logf(x) cuda_cpu_sfu(::logf(x))
#define log2f(x) cuda_cpu_sfu(::log2f(x))
#define tanhf(x) cuda_cpu_sfu(::tanhf(x))
#define sinf(x) cuda_cpu_sfu(::sinf(x))
#define cosf(x) cuda_cpu_sfu(::cosf(x))
#define sqrtf(x) cuda_cpu_sfu(::sqrtf(x))
#define powf(x, y) cuda_cpu_sfu(::powf(x, y))

// ---- device intrinsics, as host functions ------------------------------------------
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
}
inline float __expf(float x) { return expf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// IEEE round-to-nearest fp32 arithmetic that nvcc never fuses into an FMA (the host
// compiler does not either: -std=c++17 turns contraction off), for code whose bits must
// match a CPU reference (train_gpt.cu's ZeRO++ kernels).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
template <typename T> inline T __ldg(const T* p) { return *p; }
// CUDA's min and max for mixed integer and float arguments (nvcc's math headers declare them for host code too).
template <typename A, typename B> inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B> inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

// ---- launches ----------------------------------------------------------------------
namespace cuda_cpu {
// Checks the configuration now (the error goes to cudaGetLastError, as a
// launch's does), and enqueues the grid on `stream`; runtime.cpp.
void launch_enqueue(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                    std::function<void()> body);

template <typename T> struct same { using type = T; };  // keeps P from being deduced from the arguments

// The arguments convert to the kernel's parameter types at the call, as
// nvcc's launch does (NULL to a pointer, int to long long).
template <typename... P>
void launch_on(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
               typename same<P>::type... args) {
    // Copied at the launch, as CUDA copies a launch's arguments; the grid runs later.
    auto params = std::make_shared<std::tuple<std::decay_t<P>...>>(args...);
    launch_enqueue(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream,
                   [kernel, params] { std::apply(kernel, *params); });
}
}  // namespace cuda_cpu

#define CPU_LAUNCH(name, kernel, grid, block, shared_bytes, stream, ...) \
    ::cuda_cpu::launch_on(name, kernel, grid, block, shared_bytes, stream, ##__VA_ARGS__)

// CUDA's cuda_runtime.h overloads this for a kernel; the C form takes const void*.
template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// CUDA's cuda_runtime.h lets these take any T** (as nvcc builds see them).
template <typename T> inline cudaError_t cudaMalloc(T** p, size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
template <typename T> inline cudaError_t cudaMallocHost(T** p, size_t bytes) {
    return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}

// CUDA's cuda_runtime.h keeps the old 5-argument cudaGraphInstantiate (error
// node, log buffer) for C++, forwarding to the 3-argument C form; so do we.
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, cudaGraphNode_t* error_node,
                                        char* log, size_t log_bytes) {
    (void)error_node;
    if (log && log_bytes) log[0] = 0;
    return cudaGraphInstantiate(exec, graph, 0ull);
}

// ---- stores of bf16 results, made visible -----------------------------------------
// GCC's -fsanitize=thread does not instrument a store that is a call's own
// result (`out[i] = __float2bfloat16(x)`, the function returning the struct
// straight into memory): the layer would not see the write. Passing the
// result through an always-inlined identity makes it an ordinary store, which
// is instrumented. These are cuda_bf16.h's functions that return a bf16
// value; a kernel storing another struct-returning call straight into device
// memory is still not seen (a later read then reports "never written").
namespace cuda_cpu {
template <typename T> __attribute__((always_inline)) inline T stored(T v) { return v; }
}  // namespace cuda_cpu
#define __float2bfloat16(x) ::cuda_cpu::stored(__float2bfloat16(x))
#define __float2bfloat16_rn(x) ::cuda_cpu::stored(__float2bfloat16_rn(x))
#define __float2bfloat16_rz(x) ::cuda_cpu::stored(__float2bfloat16_rz(x))
#define __float2bfloat16_rd(x) ::cuda_cpu::stored(__float2bfloat16_rd(x))
#define __float2bfloat16_ru(x) ::cuda_cpu::stored(__float2bfloat16_ru(x))
#define __double2bfloat16(x) ::cuda_cpu::stored(__double2bfloat16(x))
#define __floats2bfloat162_rn(a, b) ::cuda_cpu::stored(__floats2bfloat162_rn(a, b))
#define __float22bfloat162_rn(x) ::cuda_cpu::stored(__float22bfloat162_rn(x))
#define __float2bfloat162_rn(x) ::cuda_cpu::stored(__float2bfloat162_rn(x))
#define __hadd(a, b) ::cuda_cpu::stored(__hadd(a, b))
#define __hsub(a, b) ::cuda_cpu::stored(__hsub(a, b))
#define __hmul(a, b) ::cuda_cpu::stored(__hmul(a, b))
#define __hfma(a, b, c) ::cuda_cpu::stored(__hfma(a, b, c))
#define __hadd2(a, b) ::cuda_cpu::stored(__hadd2(a, b))
#define __hmul2(a, b) ::cuda_cpu::stored(__hmul2(a, b))
#define __hfma2(a, b, c) ::cuda_cpu::stored(__hfma2(a, b, c))
