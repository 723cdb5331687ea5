// test_cuda_cpu.cpp — self-test of the kernel-execution core (cuda_cpu.h).
// Build and run: make test-cuda-cpu  (g++ only, no GPU, a few seconds).
//
// Part 1 runs correct kernels against CPU references: block reduction in
// shared memory, warp reduction by __shfl_xor_sync, shuffles with width,
// ballot/any/all, dynamic shared memory, a 3-D grid, atomics.
// Part 2 plants one bug per check and requires the core to catch it: a
// missing __syncthreads (seeds disagree), shuffle masks that leave a lane
// out, a lane that exits before a shuffle its mask expects, mismatched masks,
// a thread leaving a barrier, dynamic shared memory over 48 KB without the
// attribute (and the same launch with it), 1025 threads, grid.y = 65536.
// Last line: "N passed, N failed"; exit status 1 on any failure.
#include "dev/cuda/cpu/cuda_cpu.h"  // defines: cpu_launch, __syncthreads, __shfl_*_sync, __ballot_sync, atomics

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

static int passed = 0, failed = 0;
static void check(bool ok, const char* what) {
    printf("%s  %s\n", ok ? "ok  " : "FAIL", what);
    (ok ? passed : failed)++;
}
// A launch that must fail with `expect`, its message naming `kernel` and saying `says`.
static void check_error(cpu_error got, cpu_error expect, const char* kernel, const char* says, const char* what) {
    const cpu_error last = cpu_get_last_error();
    const char* msg = cpu_last_error_message();
    check(got == expect && last == expect && strstr(msg, kernel) && strstr(msg, says), what);
    if (got != expect) printf("      got %d (%s), expected %d\n", got, cpu_get_error_string(got), expect);
}
static bool close_to(float a, float b, float tol) { return fabsf(a - b) <= tol * (1.0f + fabsf(b)); }

// ---- part 1: correct kernels ----------------------------------------------------------

// out[b] = sum of in[b*256 .. b*256+255]: a tree in shared memory.
__global__ void block_sum(const float* in, float* out) {
    __shared__ float s[256];
    const int t = threadIdx.x;
    s[t] = in[blockIdx.x * blockDim.x + t];
    __syncthreads();  // every s[t] written before any is read
    for (int stride = 128; stride > 0; stride /= 2) {
        if (t < stride) s[t] += s[t + stride];
        __syncthreads();  // this level's sums written before the next level reads them
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

// out[w] = sum over warp w's 32 values, by butterfly; every lane ends with the sum.
__global__ void warp_sum(const float* in, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = in[i];
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    out[i] = v;
}

// Shuffles within segments of 8: down, up, and an index broadcast.
__global__ void shfl_width(const int* in, int* down, int* up, int* idx) {
    const int t = threadIdx.x;
    down[t] = __shfl_down_sync(0xffffffffu, in[t], 3, 8);
    up[t] = __shfl_up_sync(0xffffffffu, in[t], 2, 8);
    idx[t] = __shfl_sync(0xffffffffu, in[t], 5, 8);
}

// ballot of (value odd), any of (value == 7), all of (value >= 0), per warp.
__global__ void votes(const int* in, unsigned* ballot, int* any, int* all) {
    const int t = threadIdx.x, w = t / 32;
    const unsigned b = __ballot_sync(0xffffffffu, in[t] & 1);
    const int a = __any_sync(0xffffffffu, in[t] == 7);
    const int l = __all_sync(0xffffffffu, in[t] >= 0);
    __syncwarp();
    if (t % 32 == 0) { ballot[w] = b; any[w] = a; all[w] = l; }
}

// Reverses each block's n floats through dynamic shared memory.
__global__ void reverse_dynamic(const float* in, float* out, int n) {
    CPU_EXTERN_SHARED(float, buf);  // extern __shared__ float buf[];
    const int t = threadIdx.x;
    buf[t] = in[blockIdx.x * n + t];
    __syncthreads();  // all of buf written before reading another thread's entry
    out[blockIdx.x * n + t] = buf[n - 1 - t];
}

// Each thread of a 3-D grid of 3-D blocks writes its global linear id at its place.
__global__ void grid3d(int* out) {
    const int bx = blockIdx.x, by = blockIdx.y, bz = blockIdx.z;
    const int block_id = (bz * gridDim.y + by) * gridDim.x + bx;
    const int tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    const int nthreads = blockDim.x * blockDim.y * blockDim.z;
    out[block_id * nthreads + tid] += 1000 * block_id + tid;  // += : a thread run twice would show
}

__global__ void atomics(float* fsum, int* isum, unsigned* usum, int* imax, int* cas_winner) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(fsum, 0.5f);
    atomicAdd(isum, i);
    atomicAdd(usum, 2u);
    atomicMax(imax, (i * 37) % 1000);
    atomicCAS(cas_winner, -1, i);  // exactly one thread wins
}

static void test_correct_kernels() {
    {
        const int B = 8, T = 256;
        std::vector<float> in(B * T), out(B, 0.0f);
        for (int i = 0; i < B * T; i++) in[i] = (float)((i * 7919) % 101) / 101.0f - 0.5f;
        cpu_error e = cpu_launch(block_sum, dim3(B), dim3(T), 0, in.data(), out.data());
        bool ok = e == CPU_SUCCESS;
        for (int b = 0; b < B; b++) {
            double ref = 0;
            for (int t = 0; t < T; t++) ref += in[b * T + t];
            ok = ok && close_to(out[b], (float)ref, 1e-5f);
        }
        check(ok, "block reduction in __shared__ with __syncthreads matches the CPU sum");
    }
    {
        const int N = 4 * 96;  // blocks of 96 threads: three warps each
        std::vector<float> in(N), out(N);
        for (int i = 0; i < N; i++) in[i] = (float)(i % 13) - 6.0f;
        cpu_error e = cpu_launch(warp_sum, dim3(4), dim3(96), 0, in.data(), out.data());
        bool ok = e == CPU_SUCCESS;
        for (int i = 0; i < N; i++) {
            float ref = 0;
            for (int l = 0; l < 32; l++) ref += in[i / 32 * 32 + l];
            ok = ok && close_to(out[i], ref, 1e-6f);
        }
        check(ok, "warp reduction with __shfl_xor_sync: every lane holds its warp's sum");
    }
    {
        std::vector<int> in(64), down(64), up(64), idx(64);
        for (int i = 0; i < 64; i++) in[i] = 100 + i;
        cpu_error e = cpu_launch(shfl_width, dim3(1), dim3(64), 0, in.data(), down.data(), up.data(), idx.data());
        bool ok = e == CPU_SUCCESS;
        for (int i = 0; i < 64; i++) {
            const int seg = i / 8 * 8;
            ok = ok && down[i] == (i + 3 < seg + 8 ? in[i + 3] : in[i]);
            ok = ok && up[i] == (i - 2 >= seg ? in[i - 2] : in[i]);
            ok = ok && idx[i] == in[seg + 5];
        }
        check(ok, "__shfl_down_sync, __shfl_up_sync, __shfl_sync with width 8 follow CUDA's segment rules");
    }
    {
        std::vector<int> in(64);
        std::vector<unsigned> ballot(2);
        std::vector<int> any(2), all(2);
        for (int i = 0; i < 64; i++) in[i] = (i * 5) % 11;  // warp 0 holds a 7 (i = 8), warp 1 too (i = 52)
        in[40] = -1;                                         // warp 1: not all >= 0
        cpu_error e = cpu_launch(votes, dim3(1), dim3(64), 0, in.data(), ballot.data(), any.data(), all.data());
        bool ok = e == CPU_SUCCESS;
        for (int w = 0; w < 2; w++) {
            unsigned ref = 0;
            int ref_any = 0, ref_all = 1;
            for (int l = 0; l < 32; l++) {
                ref |= (unsigned)(in[w * 32 + l] & 1) << l;
                ref_any |= in[w * 32 + l] == 7;
                ref_all &= in[w * 32 + l] >= 0;
            }
            ok = ok && ballot[w] == ref && any[w] == ref_any && all[w] == ref_all;
        }
        check(ok && all[0] == 1 && all[1] == 0, "__ballot_sync, __any_sync, __all_sync per warp");
    }
    {
        const int B = 3, n = 200;
        std::vector<float> in(B * n), out(B * n);
        for (int i = 0; i < B * n; i++) in[i] = (float)i;
        cpu_error e = cpu_launch(reverse_dynamic, dim3(B), dim3(n), n * sizeof(float), in.data(), out.data(), n);
        bool ok = e == CPU_SUCCESS;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < n; t++) ok = ok && out[b * n + t] == in[b * n + n - 1 - t];
        check(ok, "dynamic shared memory of the launch's size: reversal per block");
    }
    {
        const dim3 g(3, 4, 2), b(4, 2, 3);
        const int nthreads = 24, nblocks = 24;
        std::vector<int> out(nblocks * nthreads, 0);
        cpu_error e = cpu_launch(grid3d, g, b, 0, out.data());
        bool ok = e == CPU_SUCCESS;
        for (int blk = 0; blk < nblocks; blk++)
            for (int t = 0; t < nthreads; t++) ok = ok && out[blk * nthreads + t] == 1000 * blk + t;
        check(ok, "3-D grid of 3-D blocks: every thread once, at its place");
    }
    {
        float fsum = 0;
        int isum = 0, imax = -1, winner = -1;
        unsigned usum = 0;
        cpu_error e = cpu_launch(atomics, dim3(4), dim3(128), 0, &fsum, &isum, &usum, &imax, &winner);
        int ref_max = -1;
        for (int i = 0; i < 512; i++) ref_max = std::max(ref_max, (i * 37) % 1000);
        check(e == CPU_SUCCESS && fsum == 256.0f && isum == 511 * 512 / 2 && usum == 1024 && imax == ref_max &&
                  winner >= 0 && winner < 512,
              "atomicAdd (float, int, unsigned), atomicMax, atomicCAS over 512 threads");
    }
}

// ---- part 2: planted bugs ---------------------------------------------------------------

// BUG: thread 0 sums s[] without a barrier after the writes; what it reads
// depends on which threads have run, i.e. on the schedule.
__global__ void sum_missing_sync(const float* in, float* out) {
    __shared__ float s[8];
    s[threadIdx.x] = in[threadIdx.x];
    // __syncthreads() belongs here
    if (threadIdx.x == 0) {
        float acc = 0;
        for (int i = 0; i < 8; i++) acc += s[i];
        out[0] = acc;
    }
}

// BUG: lanes 16..31 call with a mask that leaves them out.
__global__ void shfl_mask_excludes_caller(float* out) {
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (float)threadIdx.x, 1);
}

// BUG: lane 3 reads lane 19, which its mask leaves out.
__global__ void shfl_reads_outside_mask(float* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, (float)threadIdx.x, threadIdx.x + 16);
}

// BUG: lanes 0..7 return before the full-mask shuffle the others wait in.
__global__ void shfl_after_early_exit(float* out) {
    if (threadIdx.x < 8) return;
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (float)threadIdx.x, 1);
}

// BUG: lanes 0..15 pass the full mask, lanes 16..31 one without lane 0, to the same shuffle.
__global__ void shfl_mismatched_masks(float* out) {
    const unsigned mask = threadIdx.x < 16 ? 0xffffffffu : 0xfffffffeu;
    out[threadIdx.x] = __shfl_xor_sync(mask, (float)threadIdx.x, 1);
}

// BUG: thread 5 leaves while the others wait at the barrier.
__global__ void exit_before_barrier(float* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ void touch_dynamic(int n, int* ran) {
    CPU_EXTERN_SHARED(unsigned char, buf);
    buf[threadIdx.x] = 1;
    buf[n - 1] = 2;  // the last byte of the launch's size is there
    if (threadIdx.x == 0) *ran = 1;
}

__global__ void mark_ran(int* ran) { *ran = 1; }

static void test_planted_bugs() {
    {
        // Thread 0 reads the poison (NaN) of every thread that has not run yet:
        // only the seeds that run it last get the right sum, 8.
        std::vector<float> in(8, 1.0f);
        int poisoned = 0, right = 0;
        for (uint64_t seed = 1; seed <= 32; seed++) {
            float out = 0;
            cpu_set_seed(seed);
            cpu_launch(sum_missing_sync, dim3(1), dim3(8), 0, in.data(), &out);
            poisoned += std::isnan(out);
            right += out == 8.0f;
        }
        cpu_set_seed(1);
        printf("      missing __syncthreads, seeds 1..32: %d read poison (NaN), %d got 8\n", poisoned, right);
        check(poisoned > 0 && right > 0 && poisoned + right == 32, "missing __syncthreads: seeds disagree (the race shows)");
        // And the correct kernel agrees under every seed.
        bool same = true;
        std::vector<float> big(256, 1.0f), out(1);
        for (uint64_t seed = 1; seed <= 8; seed++) {
            cpu_set_seed(seed);
            cpu_launch(block_sum, dim3(1), dim3(256), 0, big.data(), out.data());
            same = same && out[0] == 256.0f;
        }
        cpu_set_seed(1);
        check(same, "with its __syncthreads, block_sum gives 256 under every seed");
    }
    std::vector<float> out(64);
    check_error(cpu_launch(shfl_mask_excludes_caller, dim3(1), dim3(32), 0, out.data()), CPU_ERROR_LAUNCH_FAILURE,
                "shfl_mask_excludes_caller", "leaves out the calling lane", "shuffle mask that excludes a calling lane: launch failure naming the kernel");
    check_error(cpu_launch(shfl_reads_outside_mask, dim3(1), dim3(32), 0, out.data()), CPU_ERROR_LAUNCH_FAILURE,
                "shfl_reads_outside_mask", "not in the mask", "shuffle reading a lane outside its mask: launch failure");
    check_error(cpu_launch(shfl_after_early_exit, dim3(1), dim3(32), 0, out.data()), CPU_ERROR_LAUNCH_FAILURE,
                "shfl_after_early_exit", "has exited", "lane exits before a __shfl_down_sync its mask expects: launch failure");
    check_error(cpu_launch(shfl_mismatched_masks, dim3(1), dim3(32), 0, out.data()), CPU_ERROR_LAUNCH_FAILURE,
                "shfl_mismatched_masks", "instead", "lanes passing different masks to one shuffle: launch failure");
    check_error(cpu_launch(exit_before_barrier, dim3(1), dim3(32), 0, out.data()), CPU_ERROR_LAUNCH_FAILURE,
                "exit_before_barrier", "wait at __syncthreads", "thread exits while the block waits at __syncthreads: launch failure");
    {
        int ran = 0;
        const int n = 64 * 1024;
        check_error(cpu_launch(touch_dynamic, dim3(1), dim3(32), n, n, &ran), CPU_ERROR_INVALID_VALUE,
                    "touch_dynamic", "cpu_func_set_max_dynamic_shared", "64 KB dynamic shared without the attribute: invalid value");
        check(ran == 0, "... and the kernel did not run");
        check(cpu_func_set_max_dynamic_shared(touch_dynamic, n) == CPU_SUCCESS, "attribute set to 64 KB");
        check(cpu_launch(touch_dynamic, dim3(1), dim3(32), n, n, &ran) == CPU_SUCCESS && ran == 1 &&
                  cpu_get_last_error() == CPU_SUCCESS,
              "the same launch succeeds with the attribute");
        check_error(cpu_func_set_max_dynamic_shared(touch_dynamic, 232448 + 1), CPU_ERROR_INVALID_VALUE,
                    "touch_dynamic", "232448", "attribute over 227 KB (232448 bytes): invalid value");
    }
    {
        int ran = 0;
        check_error(cpu_launch(mark_ran, dim3(1), dim3(1025), 0, &ran), CPU_ERROR_INVALID_CONFIGURATION,
                    "mark_ran", "1024 threads", "1025 threads per block: invalid configuration");
        check_error(cpu_launch(mark_ran, dim3(1, 65536), dim3(1), 0, &ran), CPU_ERROR_INVALID_CONFIGURATION,
                    "mark_ran", "65535", "grid.y = 65536: invalid configuration");
        check(ran == 0, "... and neither ran");
        check(cpu_launch(mark_ran, dim3(1), dim3(32, 32), 0, &ran) == CPU_SUCCESS && ran == 1,
              "1024 threads per block (32x32) run");
    }
    {
        // After all the failures, a correct launch reports success.
        int ran = 0;
        cpu_error e = cpu_launch(mark_ran, dim3(1), dim3(1), 0, &ran);
        check(e == CPU_SUCCESS && cpu_get_last_error() == CPU_SUCCESS, "a good launch after the failures: no error left over");
    }
}

int main() {
    printf("== correct kernels (reference: plain loops on the host)\n");
    test_correct_kernels();
    printf("== planted bugs (each must be caught; their messages on stderr are expected)\n");
    test_planted_bugs();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
