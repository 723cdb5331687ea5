// mma.h — what `#include <mma.h>` finds when the CPU execution layer builds
// CUDA sources (dev/cuda/cpu/cpu.mk puts dev/cuda/cpu/include before CUDA's own
// include folder). CUDA's mma.h declares nvcuda::wmma only for nvcc; this is
// the same API for kernels run as fibers, on the layer's warp machinery
// (cuda_cpu.h section 3b, cuda_cpu.cpp section 4b):
//
//   namespace nvcuda::wmma: row_major, col_major, matrix_a, matrix_b, accumulator,
//   layout_t (mem_row_major, mem_col_major), fragment<Use, 16, 16, 16, T, Layout>
//   with num_elements and x[], fill_fragment, load_matrix_sync, store_matrix_sync, mma_sync.
//
// The shape m16n16k16 with bf16 (__nv_bfloat16) or half (__half) matrix_a/b
// and float accumulators, plus half accumulators for half inputs (CUDA has
// none for bf16). num_elements are CUDA 13's: 8 for bf16 matrix_a/b and for
// accumulators, 16 for half matrix_a/b. Other shapes (m32n8k16, m8n32k16),
// int8, tf32, fp64 and the sub-byte types are not modelled: a kernel using
// them does not compile here (the fragment class is undefined).
//
// What it checks, and what only a GPU shows: dev/cuda/cpu/README.md, "Tensor cores (WMMA)".
#pragma once

#include <cuda_runtime.h>  // the layer: cuda_cpu::wmma_memory, wmma_fill, wmma_mma, wmma_position
#include <cuda_fp16.h>     // __half (CUDA's own, as host C++), as CUDA's mma.h includes it
#include <cuda_bf16.h>     // __nv_bfloat16

#include <cstddef>      // size_t
#include <type_traits>  // std::is_same

namespace nvcuda {
namespace wmma {

// ---- tags and layouts, as CUDA names them ----------------------------------------
struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };

// ---- fragments -------------------------------------------------------------------
// One lane's share of a 16x16 matrix: x[i] is some element, which one is the
// layer's secret (cuda_cpu.h, section 3b). cpu_kind names use, type and layout.
template <typename T, int size, int kind>
struct alignas(8) __frag_base {
    enum { num_elements = size, num_storage_elements = size };
    typedef T element_type;
    typedef T storage_element_type;
    static constexpr int cpu_kind = kind;
    T x[size];
};

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;  // others: not modelled

namespace cpu_detail {
using namespace ::cuda_cpu;
template <typename T> struct type_code;
template <> struct type_code<__nv_bfloat16> { static constexpr int value = WMMA_BF16; };
template <> struct type_code<__half> { static constexpr int value = WMMA_HALF; };
template <> struct type_code<float> { static constexpr int value = WMMA_FLOAT; };
template <typename L> struct layout_code { static constexpr int value = WMMA_NONE; };
template <> struct layout_code<row_major> { static constexpr int value = WMMA_ROW; };
template <> struct layout_code<col_major> { static constexpr int value = WMMA_COL; };
template <typename T, typename L> constexpr int kind_a = wmma_kind(WMMA_A, type_code<T>::value, layout_code<L>::value);
template <typename T, typename L> constexpr int kind_b = wmma_kind(WMMA_B, type_code<T>::value, layout_code<L>::value);
template <typename T> constexpr int kind_acc = wmma_kind(WMMA_ACC, type_code<T>::value, WMMA_NONE);
template <typename T> struct same { using type = T; };  // keeps fill_fragment's value from deducing T
}  // namespace cpu_detail

// clang-format off
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8, cpu_detail::kind_a<__nv_bfloat16, row_major>> {};
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8, cpu_detail::kind_a<__nv_bfloat16, col_major>> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public __frag_base<__nv_bfloat16, 8, cpu_detail::kind_b<__nv_bfloat16, row_major>> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public __frag_base<__nv_bfloat16, 8, cpu_detail::kind_b<__nv_bfloat16, col_major>> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, row_major> : public __frag_base<__half, 16, cpu_detail::kind_a<__half, row_major>> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, col_major> : public __frag_base<__half, 16, cpu_detail::kind_a<__half, col_major>> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, row_major> : public __frag_base<__half, 16, cpu_detail::kind_b<__half, row_major>> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, col_major> : public __frag_base<__half, 16, cpu_detail::kind_b<__half, col_major>> {};
template <> class fragment<accumulator, 16, 16, 16, float> : public __frag_base<float, 8, cpu_detail::kind_acc<float>> {};
template <> class fragment<accumulator, 16, 16, 16, __half> : public __frag_base<__half, 8, cpu_detail::kind_acc<__half>> {};
// clang-format on

// ---- the warp-collective calls ----------------------------------------------------
// Each lane arrives (the layer checks the call and waits for all 32), then
// moves its own elements: position p of the 16x16 matrix is row p / 16,
// column p % 16, at p[row * ldm + col] in a row-major layout, p[col * ldm + row]
// in a column-major one. These loads and stores are this file's own code,
// compiled with the application (-fsanitize=thread), so the layer checks
// each one for bounds, never-written bytes and races.

template <typename T, int size, int kind>
inline void fill_fragment(__frag_base<T, size, kind>& f, const typename cpu_detail::same<T>::type& v) {
    cuda_cpu::wmma_fill(kind);
    for (int i = 0; i < size; i++) f.x[i] = v;
}

namespace cpu_detail {
template <typename T, int size, int kind>
inline void load(__frag_base<T, size, kind>& f, const T* p, unsigned ldm, int mem_layout) {
    const wmma_map m = wmma_memory(WARP_WMMA_LOAD, kind, p, ldm, mem_layout);
    for (int i = 0; i < size; i++) {
        const int pos = wmma_position(m, i, size), row = pos / 16, col = pos % 16;
        f.x[i] = p[mem_layout == 0 ? (size_t)row * ldm + col : (size_t)col * ldm + row];
    }
    wmma_leave();
}
template <typename T, int size, int kind>
inline void store(T* p, const __frag_base<T, size, kind>& f, unsigned ldm, int mem_layout) {
    const wmma_map m = wmma_memory(WARP_WMMA_STORE, kind, p, ldm, mem_layout);
    for (int i = 0; i < size; i++) {
        const int pos = wmma_position(m, i, size), row = pos / 16, col = pos % 16;
        p[mem_layout == 0 ? (size_t)row * ldm + col : (size_t)col * ldm + row] = f.x[i];
    }
    wmma_leave();
}
}  // namespace cpu_detail

// matrix_a (16 x k) and matrix_b (k x 16): the fragment's Layout says how they lie in memory.
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value,
                  "an accumulator is loaded with its memory layout: load_matrix_sync(f, p, ldm, mem_row_major)");
    cpu_detail::load(f, p, ldm, std::is_same<Layout, row_major>::value ? 0 : 1);
}
template <typename T>
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& f, const T* p, unsigned ldm, layout_t layout) {
    cpu_detail::load(f, p, ldm, (int)layout);
}
template <typename T>
inline void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm, layout_t layout) {
    cpu_detail::store(p, f, ldm, (int)layout);
}

// d = a * b + c. Exact products, fp32 sums over k (cuda_cpu.cpp, wmma_complete).
template <typename TD, typename T, typename LA, typename LB, typename TC>
inline void mma_sync(fragment<accumulator, 16, 16, 16, TD>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, TC>& c) {
    static_assert(!std::is_same<T, __nv_bfloat16>::value || (std::is_same<TC, float>::value && std::is_same<TD, float>::value),
                  "bf16 products accumulate in float only (CUDA's mma.h has no half accumulator for bf16 inputs)");
    using namespace cpu_detail;
    cuda_cpu::wmma_mma(kind_acc<TD>, kind_a<T, LA>, kind_b<T, LB>, kind_acc<TC>, d.x, a.x, b.x, c.x);
}

}  // namespace wmma
}  // namespace nvcuda
