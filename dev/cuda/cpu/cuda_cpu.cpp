// cuda_cpu.cpp — the scheduler behind cuda_cpu.h: fibers, barriers, warp
// operations, launch checks and errors. Build: g++ -std=c++17 with this file
// beside the code that includes cuda_cpu.h (see dev/cuda/cpu/README.md).
//
// Reading order:
//   1. state: errors, seed, the running block
//   2. fibers and their stacks
//   3. device side: arriving at a barrier or a warp operation, faults
//   4. the block scheduler: rounds, warp exchanges, barrier release, diagnosis
//   4b. WMMA: the fragment mappings, the checks of load/store, mma_sync's arithmetic
//   5. launch: the driver's checks, then the grid
#include "cuda_cpu.h"

#include <sys/mman.h>   // mmap, mprotect: fiber stacks with a guard page
#include <unistd.h>     // sysconf: the page size
#include <cstdarg>      // va_list: fault messages
#include <cstdio>       // fprintf, vsnprintf
#include <cstdlib>      // getenv, strtoull, abort
#include <map>          // per-kernel dynamic shared limits
#include <string>       // error messages
#include <vector>       // fibers, stacks

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

// The linker defines these around the cuda_cpu_shared section that __shared__
// puts variables in; weak, so a program without __shared__ links (both null).
extern char __start_cuda_cpu_shared[] __attribute__((weak));
extern char __stop_cuda_cpu_shared[] __attribute__((weak));
// The program's writable static storage (.data, cuda_cpu_shared, .bss): glibc's crt1 and the linker define these.
extern char __data_start[];
extern char _end[];

// "Cannot happen" checks of the scheduler's own invariants.
#define CPU_ALWAYS(cond) do { if (!(cond)) { fprintf(stderr, "cuda_cpu: internal error: %s (%s:%d)\n", #cond, __FILE__, __LINE__); abort(); } } while (0)
// Every system call goes through this.
#define CPU_SYSCHECK(call) do { if ((call) != 0) { perror(#call); fprintf(stderr, "cuda_cpu: %s failed at %s:%d\n", #call, __FILE__, __LINE__); abort(); } } while (0)

namespace cuda_cpu {

// ---- 1. state: errors, seed, the running block ----------------------------------------

static cpu_error last_error = CPU_SUCCESS;
static std::string last_message;
static bool seed_set = false;
static uint64_t seed_value = 1;
static std::map<const void*, size_t> max_dynamic_shared;  // per kernel, by cpu_func_set_max_dynamic_shared

static void record_error(cpu_error e, const std::string& msg) {
    last_error = e;
    last_message = msg;
    fprintf(stderr, "%s\n", msg.c_str());
}

static uint64_t current_seed() {
    if (!seed_set) {
        const char* s = getenv("CUDA_CPU_SEED");
        if (s && *s) seed_value = strtoull(s, nullptr, 0);
        seed_set = true;
    }
    return seed_value;
}

// splitmix64 (Steele, Lea, Flood 2014): the order of fibers, the same on every libc.
static uint64_t splitmix64(uint64_t* state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

enum fiber_state { FIBER_RUNNABLE, FIBER_BARRIER, FIBER_WARP, FIBER_DONE, FIBER_FAULT };

struct warp_call {
    warp_op op;
    unsigned mask;
    uint64_t value;   // this lane's value (bits), or its predicate
    int arg;          // source lane, lane mask or delta
    int width;
    uint64_t result;  // filled in when the whole mask has arrived
    uint64_t tag;     // WMMA: the fragment kinds (and memory layout), which every lane must agree on
    uint64_t extra;   // WMMA load/store: ldm
};

struct async_copy {  // a cp.async in flight (section 4c)
    void* dst;
    uint8_t bytes[16];
    uint32_t group;   // the commit group it belongs to: the number of commits before it
};

struct fiber {
    void* sp;          // its saved stack pointer while it does not run
    fiber_state state;
    uint3 tid;
    warp_call call;
    std::vector<async_copy> async;  // its cp.async copies not yet waited for
    uint32_t commits;               // its cp.async.commit_group count
};

struct block_run {
    const char* kernel;
    const std::function<void()>* body;
    std::vector<fiber> fibers;  // by linear thread id: x fastest, then y, then z
    void* scheduler;            // the scheduler's saved stack pointer while a fiber runs
    int current;                // the running fiber, -1 in the scheduler
    bool fault;
    std::string message;
    uint32_t epoch;                    // barriers completed
    std::vector<uint32_t> warp_epochs; // warp operations completed, per warp
};

thread_local exec_point exec = {false, false, 0, 0, 0, 0, nullptr};
thread_local uintptr_t shared_static_lo = 0, shared_static_bytes = 0, shared_dynamic_lo = 0, shared_dynamic_bytes = 0;

bool race_check_enabled() {
    static int on = -1;
    if (on < 0) {
        const char* s = getenv("CUDA_CPU_RACE_CHECK");
        on = !(s && s[0] == '0');
    }
    return on;
}

static thread_local block_run* running = nullptr;   // the block this OS thread runs now
static thread_local std::vector<unsigned char> dyn_shared_buf;
static thread_local void* dyn_shared_ptr = nullptr;

static const char* op_name(warp_op op) {
    switch (op) {
        case WARP_SYNC: return "__syncwarp";
        case WARP_SHFL_IDX: return "__shfl_sync";
        case WARP_SHFL_XOR: return "__shfl_xor_sync";
        case WARP_SHFL_DOWN: return "__shfl_down_sync";
        case WARP_SHFL_UP: return "__shfl_up_sync";
        case WARP_BALLOT: return "__ballot_sync";
        case WARP_ANY: return "__any_sync";
        case WARP_ALL: return "__all_sync";
        case WARP_WMMA_FILL: return "wmma::fill_fragment";
        case WARP_WMMA_LOAD: return "wmma::load_matrix_sync";
        case WARP_WMMA_STORE: return "wmma::store_matrix_sync";
        case WARP_WMMA_MMA: return "wmma::mma_sync";
        case WARP_MMA_16816: return "mma.sync.m16n8k16";
        case WARP_LDMATRIX: return "ldmatrix";
    }
    return "?";
}

// "kernel 'name' block (x,y,z) thread (x,y,z) [lane l of warp w]: " then the text.
static std::string where(const block_run& r, int t) {
    char buf[256];
    const uint3 tid = r.fibers[t].tid;
    snprintf(buf, sizeof buf, "cuda_cpu: kernel '%s' block (%u,%u,%u) thread (%u,%u,%u) [lane %d of warp %d]%s%s: ",
             r.kernel, blockIdx.x, blockIdx.y, blockIdx.z, tid.x, tid.y, tid.z, t % 32, t / 32,
             t == r.current && exec.call ? " in " : "", t == r.current && exec.call ? exec.call : "");
    return buf;
}

static std::string format(const char* fmt, va_list ap) {
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}

__attribute__((format(printf, 1, 2))) static std::string format_msg(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = format(fmt, ap);
    va_end(ap);
    return s;
}

// ---- 2. fibers and their stacks -------------------------------------------------------
// 256 KB of address space per fiber (CUDA_CPU_STACK_KB to change), mapped
// lazily by the kernel, so only the pages a thread touches cost memory; below
// each stack one PROT_NONE page turns an overflow into a SIGSEGV. Stacks are
// kept per OS thread and reused by every block and launch.

static size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }

static size_t stack_bytes() {
    static size_t bytes = 0;
    if (bytes == 0) {
        const char* s = getenv("CUDA_CPU_STACK_KB");
        size_t kb = (s && *s) ? strtoull(s, nullptr, 10) : 256;
        if (kb < 16) kb = 16;
        const size_t page = page_size();
        bytes = (kb * 1024 + page - 1) / page * page;
    }
    return bytes;
}

static thread_local std::vector<char*> stacks;  // each: guard page, then stack_bytes()

static char* fiber_stack(size_t i) {
    while (stacks.size() <= i) {
        const size_t page = page_size();
        void* p = mmap(nullptr, page + stack_bytes(), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); fprintf(stderr, "cuda_cpu: cannot map a fiber stack: lower CUDA_CPU_STACK_KB\n"); abort(); }
        CPU_SYSCHECK(mprotect(p, page, PROT_NONE));
        stacks.push_back(static_cast<char*>(p));
    }
    return stacks[i] + page_size();
}

// The switch between fibers: save the callee-saved registers on this stack,
// store the stack pointer in *save, load `to`, restore its registers, return
// into it. What ucontext's swapcontext does, without its two system calls
// (the signal mask) per switch, which made kernels ten times slower. The
// caller-saved registers are saved by the compiler around the call, as for
// any call; the floating-point control words are never changed by kernels.
#if !defined(__x86_64__)
#error "cuda_cpu.cpp: the fiber switch is written for x86-64 (the SysV ABI); port cuda_cpu_fiber_switch"
#endif
extern "C" void cuda_cpu_fiber_switch(void** save, void* to);
asm(R"(
    .text
    .globl cuda_cpu_fiber_switch
    .type cuda_cpu_fiber_switch, @function
cuda_cpu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_cpu_fiber_switch, .-cuda_cpu_fiber_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
static inline void fiber_switch(void** save, void* to) { cuda_cpu_fiber_switch(save, to); }

// Where every fiber starts: run the kernel body, then hand back for good.
static void fiber_main() {
    block_run* r = running;
    (*r->body)();
    r->fibers[r->current].state = FIBER_DONE;
    fiber_switch(&r->fibers[r->current].sp, r->scheduler);
    CPU_ALWAYS(!"a finished fiber was resumed");
}

// ---- 3. device side: arriving at a barrier or a warp operation, faults ------------------

static fiber& self(const char* what) {
    if (!running || running->current < 0) {
        fprintf(stderr, "cuda_cpu: %s called outside a kernel launched by cpu_launch\n", what);
        abort();
    }
    return running->fibers[running->current];
}

static void yield_to_scheduler(fiber& f) {
    fiber_switch(&f.sp, running->scheduler);
    asm volatile("" ::: "memory");  // what other fibers wrote is in memory, not in our registers
}

// Stops the launch: the message names kernel, block and thread; the fiber is
// never resumed (what lives on its stack is abandoned, not destroyed).
[[noreturn]] __attribute__((format(printf, 2, 3))) static void fault(fiber& f, const char* fmt, ...) {
    block_run* r = running;
    va_list ap;
    va_start(ap, fmt);
    r->message = where(*r, r->current) + format(fmt, ap);
    va_end(ap);
    r->fault = true;
    f.state = FIBER_FAULT;
    fiber_switch(&f.sp, r->scheduler);
    CPU_ALWAYS(!"a faulted fiber was resumed");
    abort();
}

void* dynamic_shared() { return dyn_shared_ptr; }

uint64_t warp_arrive(warp_op op, unsigned mask, uint64_t value, int arg, int width) {
    fiber& f = self(op_name(op));
    const int t = running->current;
    const int lane = t % 32, warp_base = t - lane;
    const int n = (int)running->fibers.size();
    if (!(mask & (1u << lane)))
        fault(f, "%s with mask 0x%08x, which leaves out the calling lane %d", op_name(op), mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        fault(f, "%s with width %d: it must be a power of 2 from 1 to 32", op_name(op), width);
    for (int l = 0; l < 32; l++)
        if ((mask & (1u << l)) && warp_base + l >= n)
            fault(f, "%s with mask 0x%08x names lane %d, which does not exist (the block has %d threads)",
                  op_name(op), mask, l, n);
    f.call = warp_call{op, mask, value, arg, width, 0, 0, 0};
    f.state = FIBER_WARP;
    yield_to_scheduler(f);
    return f.call.result;
}

}  // namespace cuda_cpu

void __syncthreads() {
    cuda_cpu::fiber& f = cuda_cpu::self("__syncthreads");
    f.state = cuda_cpu::FIBER_BARRIER;
    cuda_cpu::yield_to_scheduler(f);
}

namespace cuda_cpu {

// ---- shared memory: never-written reads and races between the block's threads ----
// One record per byte of the block's shared memory (static, then dynamic):
// the block generation it belongs to (older ones read as "never written"),
// its last writer and last reader as (thread, barrier epoch, warp epoch).
// Two readers: a write races with any earlier unordered read, and keeping
// only the last reader would lose them (the last is often the writer's own
// warp). `reader` is the earliest read not yet ordered before the newest,
// `reader2` the latest read from another warp than `reader`'s.
struct shared_record { uint32_t gen, writer, reader, reader2; };
static std::vector<shared_record> shared_shadow;
static uint32_t shared_gen = 0;
constexpr uint32_t NOBODY = 0xffffffffu;

static void shared_block_start() {
    const size_t bytes = shared_static_bytes + shared_dynamic_bytes;
    if (shared_shadow.size() < bytes) shared_shadow.resize(bytes, shared_record{0, NOBODY, NOBODY, NOBODY});
    if (++shared_gen == 0) {  // wrapped: start the records over
        for (shared_record& x : shared_shadow) x = shared_record{0, NOBODY, NOBODY, NOBODY};
        shared_gen = 1;
    }
}

static uint32_t shared_who() {
    return exec.thread << 22 | (exec.epoch & 0x7ff) << 11 | (exec.warp_epoch & 0x7ff);
}

// Are the accesses of `a` (earlier) and `b` (now, by the running thread) ordered?
static bool shared_ordered(uint32_t a, uint32_t b) {
    const uint32_t ta = a >> 22, tb = b >> 22;
    if (ta == tb) return true;                                          // one thread
    if (((a >> 11) & 0x7ff) != ((b >> 11) & 0x7ff)) return true;        // a barrier between them
    return ta / 32 == tb / 32 && (a & 0x7ff) != (b & 0x7ff);           // a warp operation between them
}

void shared_access(uintptr_t a, size_t n, bool write) {
    fiber& f = self("a shared-memory access");
    size_t off;
    const char* kind;
    if (a - shared_static_lo < shared_static_bytes) { off = a - shared_static_lo; kind = "__shared__ (static storage)"; }
    else { off = shared_static_bytes + (a - shared_dynamic_lo); kind = "dynamic shared memory"; }
    const uint32_t me = shared_who();
    for (size_t i = 0; i < n && off + i < shared_shadow.size(); i++) {
        shared_record& x = shared_shadow[off + i];
        if (x.gen != shared_gen) x = shared_record{shared_gen, NOBODY, NOBODY, NOBODY};
        if (!write && x.writer == NOBODY)
            fault(f, "reads %s at %p, which no thread of this block has written (shared memory starts as garbage, "
                  "and a host variable cannot be read from a kernel)", kind, (void*)(a + i));
        if (!race_check_enabled() || exec.in_atomic) {
            if (write) x.writer = me;
            continue;
        }
        if (x.writer != NOBODY && !shared_ordered(x.writer, me))
            fault(f, "race inside the block on %s at %p: thread %u wrote it and this thread %s it with no "
                  "__syncthreads between (a missing barrier)", kind, (void*)(a + i), x.writer >> 22, write ? "writes" : "reads");
        for (uint32_t rd : {x.reader, x.reader2})
            if (write && rd != NOBODY && !shared_ordered(rd, me))
                fault(f, "race inside the block on %s at %p: thread %u read it and this thread writes it with no "
                      "__syncthreads between (a missing barrier)", kind, (void*)(a + i), rd >> 22);
        if (write) {
            x.writer = me;
        } else if (x.reader == NOBODY || shared_ordered(x.reader, me)) {
            x.reader = me;
            if (x.reader2 != NOBODY && shared_ordered(x.reader2, me)) x.reader2 = NOBODY;
        } else if ((x.reader >> 22) / 32 != (me >> 22) / 32) {
            x.reader2 = me;
        }
    }
}

// ---- 4. the block scheduler --------------------------------------------------------------

// The lane whose value lane `lane` receives, by PTX's shfl rules (the
// segment is the lane's group of `width`); -1: its own value.
static int shfl_source(const warp_call& c, int lane) {
    const int seg_lo = lane & ~(c.width - 1), seg_hi = seg_lo + c.width - 1;
    switch (c.op) {
        case WARP_SHFL_IDX: return seg_lo + (c.arg & (c.width - 1));
        case WARP_SHFL_XOR: { int s = lane ^ c.arg; return s > seg_hi ? -1 : s; }  // earlier segments are reachable
        case WARP_SHFL_DOWN: { int s = lane + c.arg; return s > seg_hi ? -1 : s; }
        case WARP_SHFL_UP: { int s = lane - c.arg; return s < seg_lo ? -1 : s; }
        default: return -1;
    }
}

static bool same_call(const warp_call& a, const warp_call& b) {
    return a.op == b.op && a.mask == b.mask && a.width == b.width && a.tag == b.tag;
}

static bool wmma_complete(block_run& r, int base);  // section 4b

// Completes every warp operation whose whole mask has arrived at a matching
// call; returns whether any did. Sets r.fault when an exchange reads a lane
// outside the mask (undefined in CUDA).
static bool complete_warp_ops(block_run& r) {
    const int n = (int)r.fibers.size();
    bool progress = false;
    for (int t = 0; t < n && !r.fault; t++) {
        fiber& f = r.fibers[t];
        if (f.state != FIBER_WARP) continue;
        const int base = t - t % 32;
        const warp_call c = f.call;
        bool ready = true;
        for (int l = 0; l < 32 && ready; l++)
            if (c.mask & (1u << l))
                ready = r.fibers[base + l].state == FIBER_WARP && same_call(r.fibers[base + l].call, c);
        if (!ready) continue;
        if (c.op >= WARP_WMMA_FILL) {  // section 4b: checks, mma_sync's arithmetic
            if (!wmma_complete(r, base)) return progress;
            for (int l = 0; l < 32; l++) r.fibers[base + l].state = FIBER_RUNNABLE;
            if (c.op != WARP_WMMA_FILL) r.warp_epochs[base / 32]++;  // fill_fragment orders nothing
            progress = true;
            continue;
        }
        uint64_t ballot = 0;
        for (int l = 0; l < 32; l++)
            if ((c.mask & (1u << l)) && r.fibers[base + l].call.value) ballot |= 1ull << l;
        for (int l = 0; l < 32; l++) {
            if (!(c.mask & (1u << l))) continue;
            fiber& g = r.fibers[base + l];
            switch (c.op) {
                case WARP_SYNC: g.call.result = 0; break;
                case WARP_BALLOT: g.call.result = ballot; break;
                case WARP_ANY: g.call.result = ballot != 0; break;
                case WARP_ALL: g.call.result = ballot == c.mask; break;
                default: {
                    const int s = shfl_source(c, l);
                    if (s >= 0 && !(c.mask & (1u << s))) {
                        r.message = where(r, base + l) + format_msg("%s(mask 0x%08x, arg %d, width %d) reads lane %d, which is not in the mask",
                                                                    op_name(c.op), c.mask, c.arg, c.width, s);
                        r.fault = true;
                        return progress;
                    }
                    g.call.result = s < 0 ? g.call.value : r.fibers[base + s].call.value;
                }
            }
        }
        for (int l = 0; l < 32; l++)
            if (c.mask & (1u << l)) r.fibers[base + l].state = FIBER_RUNNABLE;
        r.warp_epochs[base / 32]++;
        progress = true;
    }
    return progress;
}

// Nothing can run and a warp operation is stuck: say why, for the first one.
static void diagnose_warp(block_run& r) {
    const int n = (int)r.fibers.size();
    for (int t = 0; t < n; t++) {
        const fiber& f = r.fibers[t];
        if (f.state != FIBER_WARP) continue;
        const int base = t - t % 32;
        const warp_call& c = f.call;
        for (int l = 0; l < 32; l++) {
            if (!(c.mask & (1u << l))) continue;
            const fiber& g = r.fibers[base + l];
            const char* why = nullptr;
            char buf[160];
            if (g.state == FIBER_DONE) why = "has exited";
            else if (g.state == FIBER_BARRIER) why = "waits at __syncthreads instead";
            else if (g.state == FIBER_WARP && g.call.op == c.op && g.call.op >= WARP_WMMA_FILL && g.call.tag != c.tag) {
                snprintf(buf, sizeof buf, "called %s on another kind of fragment (type, use or layout) instead", op_name(g.call.op));
                why = buf;
            } else if (g.state == FIBER_WARP && !same_call(g.call, c)) {
                if (g.call.op >= WARP_WMMA_FILL) snprintf(buf, sizeof buf, "called %s instead", op_name(g.call.op));
                else snprintf(buf, sizeof buf, "called %s with mask 0x%08x width %d instead", op_name(g.call.op), g.call.mask, g.call.width);
                why = buf;
            }
            if (why) {
                if (c.op >= WARP_WMMA_FILL)  // WMMA calls take no mask: the whole warp
                    r.message = where(r, t) + format_msg("%s (a call of the whole warp) waits for lane %d, which %s", op_name(c.op), l, why);
                else
                    r.message = where(r, t) + format_msg("%s with mask 0x%08x waits for lane %d, which %s",
                                                         op_name(c.op), c.mask, l, why);
                r.fault = true;
                return;
            }
        }
    }
    CPU_ALWAYS(!"a stuck warp operation without a reason");
}

// Thread t of the block, at the start of the kernel. Its own function:
static void fiber_init(fiber& f, int t) {
    const unsigned u = (unsigned)t;
    f.state = FIBER_RUNNABLE;
    f.tid = uint3{u % blockDim.x, (u / blockDim.x) % blockDim.y, u / (blockDim.x * blockDim.y)};
    f.async.clear();
    f.commits = 0;
    // The first switch to it "returns" into fiber_main with the six saved
    // registers zero, on a 16-byte aligned stack as the ABI wants at a call.
    uintptr_t top = ((uintptr_t)fiber_stack(t) + stack_bytes()) & ~(uintptr_t)15;
    void** frame = reinterpret_cast<void**>(top);
    frame[-1] = nullptr;                                  // fiber_main's return address: it never returns
    frame[-2] = reinterpret_cast<void*>(&fiber_main);     // where fiber_switch's ret goes
    for (int k = 3; k <= 8; k++) frame[-k] = nullptr;     // rbp rbx r12 r13 r14 r15
    f.sp = frame - 8;
}

// Runs one block to its end or its first fault.
static void run_block(block_run& r, uint64_t block_seed) {
    const int n = (int)r.fibers.size();
    for (int t = 0; t < n; t++) fiber_init(r.fibers[t], t);
    r.epoch = 0;
    r.warp_epochs.assign((size_t)(n + 31) / 32, 0);
    shared_block_start();
    if (count_on) count_block_start();
    uint64_t rng = block_seed;
    std::vector<int> order;
    for (;;) {
        // One round: every runnable fiber, in a seeded permutation (Fisher-Yates),
        // runs until it reaches a barrier, a warp operation or its end.
        order.clear();
        for (int t = 0; t < n; t++)
            if (r.fibers[t].state == FIBER_RUNNABLE) order.push_back(t);
        for (size_t i = order.size(); i > 1; i--) std::swap(order[i - 1], order[splitmix64(&rng) % i]);
        for (int t : order) {
            r.current = t;
            threadIdx = r.fibers[t].tid;
            exec.thread = (uint32_t)t;
            exec.epoch = r.epoch;
            exec.warp_epoch = r.warp_epochs[t / 32];
            exec.call = nullptr;  // a WMMA call's accesses never span a switch
            fiber_switch(&r.scheduler, r.fibers[t].sp);
            r.current = -1;
            if (r.fault) return;
        }
        // Nothing runnable: complete warp operations, then the barrier.
        if (complete_warp_ops(r)) continue;
        if (r.fault) return;
        int at_barrier = 0, done = 0, at_warp = 0;
        for (const fiber& f : r.fibers) {
            at_barrier += f.state == FIBER_BARRIER;
            done += f.state == FIBER_DONE;
            at_warp += f.state == FIBER_WARP;
        }
        if (count_on) count_flush();
        if (done == n) return;
        if (at_warp > 0) { diagnose_warp(r); return; }
        CPU_ALWAYS(at_barrier + done == n && at_barrier > 0);
        if (done > 0) {
            int t = 0;
            while (r.fibers[t].state != FIBER_DONE) t++;
            r.message = where(r, t) + format_msg("exited while %d threads of its block wait at __syncthreads "
                                                 "(undefined in CUDA: every thread must reach the barrier)", at_barrier);
            r.fault = true;
            return;
        }
        for (fiber& f : r.fibers) f.state = FIBER_RUNNABLE;
        r.epoch++;
        if (count_on) count_barrier();
    }
}

// ---- 4b. WMMA: the fragment mappings, the checks of load/store, mma_sync's arithmetic ----
// cuda_cpu.h (section 3b) says what is modelled; include/mma.h is the API.

static wmma_map wmma_maps[WMMA_KINDS];  // per kind; set at every launch from the seed

// Each kind's scramble from the seed: mul odd in 3..253 (never the identity
// nor its mirror), add any; splitmix64 so nearby seeds give unrelated maps.
static void wmma_seed_maps(uint64_t seed) {
    uint64_t s = seed ^ 0x5bd1e9955bd1e995ull;
    for (int k = 0; k < WMMA_KINDS; k++) {
        const uint64_t h = splitmix64(&s);
        wmma_maps[k] = wmma_map{(uint32_t)(3 + 2 * (h % 126)), (uint32_t)((h >> 8) & 255), 0};
    }
}

static int wmma_type_of(int kind) { return kind / 3 % 3; }
static int wmma_use_of(int kind) { return kind / 9; }
static size_t wmma_bytes(int kind) { return wmma_type_of(kind) == WMMA_FLOAT ? 4 : 2; }
// CUDA's num_elements: 16 for half matrix_a/b (each position in two lanes), 8 otherwise.
static int wmma_per_lane(int kind) { return wmma_use_of(kind) != WMMA_ACC && wmma_type_of(kind) == WMMA_HALF ? 16 : 8; }
static const char* wmma_type_name(int kind) {
    switch (wmma_type_of(kind)) { case WMMA_BF16: return "__nv_bfloat16"; case WMMA_HALF: return "__half"; default: return "float"; }
}

// The warp must be whole: a WMMA call names all 32 lanes.
static void wmma_need_whole_warp(fiber& f, warp_op op) {
    const int t = running->current, base = t - t % 32, n = (int)running->fibers.size();
    if (base + 32 > n)
        fault(f, "%s in a warp of %d threads: WMMA calls need all 32 lanes (the block has %d threads)", op_name(op), n - base, n);
}

static void wmma_wait(fiber& f, warp_op op, uint64_t value, uint64_t tag, uint64_t extra) {
    f.call = warp_call{op, 0xffffffffu, value, 0, 32, 0, tag, extra};
    f.state = FIBER_WARP;
    yield_to_scheduler(f);
}

wmma_map wmma_memory(warp_op op, int kind, const void* p, unsigned ldm, int mem_layout) {
    fiber& f = self(op_name(op));
    wmma_need_whole_warp(f, op);
    // CUDA Programming Guide, WMMA (load_matrix_sync, store_matrix_sync):
    // "mptr must be a 256-bit aligned pointer ... ldm ... must be a multiple
    // of 8 for __half element type or multiple of 4 for float element type
    // (i.e., multiple of 16 bytes in both cases)"; bf16 is 2 bytes as __half.
    if ((uintptr_t)p % 32 != 0)
        fault(f, "%s with pointer %p, which is not 256-bit (32-byte) aligned (it is %zu bytes past a 32-byte boundary): "
              "CUDA requires mptr to be", op_name(op), p, (size_t)((uintptr_t)p % 32));
    if ((size_t)ldm * wmma_bytes(kind) % 16 != 0)
        fault(f, "%s with ldm %u, which is not a multiple of %zu (16 bytes of %s): CUDA requires it to be",
              op_name(op), ldm, 16 / wmma_bytes(kind), wmma_type_name(kind));
    if (mem_layout != 0 && mem_layout != 1)
        fault(f, "%s with layout %d: it must be mem_row_major or mem_col_major", op_name(op), mem_layout);
    wmma_wait(f, op, (uint64_t)(uintptr_t)p, (uint64_t)kind << 8 | (uint64_t)mem_layout, ldm);
    exec.call = op_name(op);
    wmma_map m = wmma_maps[kind];
    m.lane = running->current % 32;
    if (count_on && m.lane == 0) {
        const uintptr_t a = (uintptr_t)p;
        const bool shared = a - shared_static_lo < shared_static_bytes || a - shared_dynamic_lo < shared_dynamic_bytes;
        count_wmma_memory(op == WARP_WMMA_STORE, shared, p, ldm, wmma_bytes(kind));
    }
    return m;
}

void wmma_fill(int tag) {
    fiber& f = self(op_name(WARP_WMMA_FILL));
    wmma_need_whole_warp(f, WARP_WMMA_FILL);
    wmma_wait(f, WARP_WMMA_FILL, 0, (uint64_t)tag, 0);
}

struct wmma_operands {  // one lane's, on its stack while it waits
    void* d;
    const void* a;
    const void* b;
    const void* c;
};

void wmma_mma(int kind_d, int kind_a, int kind_b, int kind_c, void* d, const void* a, const void* b, const void* c) {
    fiber& f = self(op_name(WARP_WMMA_MMA));
    wmma_need_whole_warp(f, WARP_WMMA_MMA);
    wmma_operands ops{d, a, b, c};
    wmma_wait(f, WARP_WMMA_MMA, (uint64_t)(uintptr_t)&ops,
              (uint64_t)kind_d << 24 | (uint64_t)kind_a << 16 | (uint64_t)kind_b << 8 | (uint64_t)kind_c, 0);
}

static float wmma_get(int kind, const void* frag, int i) {
    switch (wmma_type_of(kind)) {
        case WMMA_BF16: {  // the upper 16 bits of a float
            uint16_t h;
            memcpy(&h, (const char*)frag + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            float x;
            memcpy(&x, &u, 4);
            return x;
        }
        case WMMA_HALF: {
            _Float16 h;  // IEEE binary16, as __half; GCC converts exactly
            memcpy(&h, (const char*)frag + 2 * i, 2);
            return (float)h;
        }
        default: {
            float x;
            memcpy(&x, (const char*)frag + 4 * i, 4);
            return x;
        }
    }
}

static void wmma_put(int kind, void* frag, int i, float v) {
    if (wmma_type_of(kind) == WMMA_HALF) {
        const _Float16 h = (_Float16)v;  // round to nearest even, as the tensor core's half output
        memcpy((char*)frag + 2 * i, &h, 2);
    } else {
        CPU_ALWAYS(wmma_type_of(kind) == WMMA_FLOAT);
        memcpy((char*)frag + 4 * i, &v, 4);
    }
}

// The whole warp has arrived at the same WMMA call (same kinds): check what
// must agree between lanes, and for mma_sync compute every lane's d. Returns
// false after setting r.fault.
static bool ptx_complete(block_run& r, int base);  // section 4c

static bool wmma_complete(block_run& r, int base) {
    const warp_call& c0 = r.fibers[base].call;
    if (c0.op == WARP_MMA_16816 || c0.op == WARP_LDMATRIX) return ptx_complete(r, base);
    if (c0.op == WARP_WMMA_LOAD || c0.op == WARP_WMMA_STORE) {
        // "The values of mptr, ldm, layout and all template parameters ... must be the same for all threads in the warp."
        for (int l = 1; l < 32; l++) {
            const warp_call& c = r.fibers[base + l].call;
            if (c.value != c0.value || c.extra != c0.extra) {
                r.message = where(r, base + l) + format_msg("%s with pointer %p and ldm %u, but lane 0 of the warp passed %p and ldm %u: "
                                                            "the pointer, ldm and layout must be the same for every lane",
                                                            op_name(c0.op), (void*)(uintptr_t)c.value, (unsigned)c.extra,
                                                            (void*)(uintptr_t)c0.value, (unsigned)c0.extra);
                r.fault = true;
                return false;
            }
        }
        return true;
    }
    if (c0.op != WARP_WMMA_MMA) return true;  // fill_fragment: arriving is all
    if (count_on) count_mma();
    const int kd = (int)(c0.tag >> 24 & 255), ka = (int)(c0.tag >> 16 & 255), kb = (int)(c0.tag >> 8 & 255), kc = (int)(c0.tag & 255);
    // Gather the three matrices from the lanes' fragments ([row][col], 16x16).
    float A[256], B[256], C[256], D[256];
    for (int l = 0; l < 32; l++) {
        const wmma_operands* ops = reinterpret_cast<const wmma_operands*>((uintptr_t)r.fibers[base + l].call.value);
        struct { int kind; const void* frag; float* to; } in[3] = {{ka, ops->a, A}, {kb, ops->b, B}, {kc, ops->c, C}};
        for (const auto& x : in) {
            wmma_map m = wmma_maps[x.kind];
            m.lane = l;
            const int e = wmma_per_lane(x.kind);
            for (int i = 0; i < e; i++) x.to[wmma_position(m, i, e)] = wmma_get(x.kind, x.frag, i);
        }
    }
    // D = A B + C, m16n16k16: each product of two bf16 or half values is
    // exact in fp32 (8 or 11 significant bits each); the sum over k is fp32,
    // in k order from C (the hardware's order and internal rounding are its own).
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float acc = C[i * 16 + j];
            for (int k = 0; k < 16; k++) acc += A[i * 16 + k] * B[k * 16 + j];
            D[i * 16 + j] = acc;
        }
    // Scatter D to the lanes' d fragments (after all reads: d may be c).
    for (int l = 0; l < 32; l++) {
        const wmma_operands* ops = reinterpret_cast<const wmma_operands*>((uintptr_t)r.fibers[base + l].call.value);
        wmma_map m = wmma_maps[kd];
        m.lane = l;
        for (int i = 0; i < wmma_per_lane(kd); i++) wmma_put(kd, ops->d, i, D[wmma_position(m, i, wmma_per_lane(kd))]);
    }
    return true;
}

// ---- 4c. mma.sync m16n8k16, ldmatrix, cp.async (cuda_cpu.h section 3c) -----------------
// The fragments of mma.m16n8k16 with .bf16 inputs, as PTX ISA documents them
// (groupID g = lane / 4, t = lane % 4; a register holds two bf16, the lower
// index in its low half):
//   A (16 x 16, row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16 x 8, col):  b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C, D (16 x 8):    d[0], d[1] = (g, 2t), (g, 2t+1); d[2], d[3] = (g+8, 2t), (g+8, 2t+1)
// ldmatrix.m8n8: lane l receives from matrix i the elements (l / 4, 2 (l % 4))
// and (l / 4, 2 (l % 4) + 1), or with .trans (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4).
struct mma_operands { float* d; const uint32_t* a; const uint32_t* b; };

static float bf16_bits(uint32_t w, int high) {
    const uint32_t u = high ? (w & 0xffff0000u) : (w << 16);
    float x;
    memcpy(&x, &u, 4);
    return x;
}

void mma_16816(float* d, const uint32_t* a, const uint32_t* b) {
    fiber& f = self(op_name(WARP_MMA_16816));
    wmma_need_whole_warp(f, WARP_MMA_16816);
    mma_operands ops{d, a, b};
    wmma_wait(f, WARP_MMA_16816, (uint64_t)(uintptr_t)&ops, 0, 0);
}

// Each warp's last completed ldmatrix: its lanes' addresses, read by every lane after it (per warp: the warps of
// a block complete their calls in one pass of the scheduler, before any lane runs on).
static thread_local uintptr_t ldm_rows[MAX_THREADS_PER_BLOCK / 32][32];

const uintptr_t* ldmatrix_rows(const void* row, int count, bool trans) {
    fiber& f = self(op_name(WARP_LDMATRIX));
    wmma_need_whole_warp(f, WARP_LDMATRIX);
    const int lane = running->current % 32;
    if (count != 1 && count != 2 && count != 4) fault(f, "ldmatrix of %d matrices: .x1, .x2 or .x4", count);
    const uintptr_t a = (uintptr_t)row;
    if (lane < 8 * count) {
        const bool shared = a - shared_static_lo < shared_static_bytes || a - shared_dynamic_lo < shared_dynamic_bytes;
        if (!shared) fault(f, "ldmatrix with row address %p (lane %d), which is not in this block's shared memory", row, lane);
        if (a % 16 != 0)
            fault(f, "ldmatrix with row address %p (lane %d), which is not 16-byte aligned (%zu bytes past): each row "
                  "of 8 b16 must be", row, lane, (size_t)(a % 16));
    }
    wmma_wait(f, WARP_LDMATRIX, a, (uint64_t)count | (uint64_t)trans << 8, 0);
    exec.call = op_name(WARP_LDMATRIX);
    return ldm_rows[running->current / 32];
}

static bool ptx_complete(block_run& r, int base) {
    const warp_call& c0 = r.fibers[base].call;
    if (c0.op == WARP_LDMATRIX) {
        uintptr_t* rows = ldm_rows[base / 32];
        for (int l = 0; l < 32; l++) rows[l] = (uintptr_t)r.fibers[base + l].call.value;
        if (count_on) count_rows_memory(rows, (int)(c0.tag & 255));
        return true;
    }
    if (count_on) count_mma_16816();
    float A[16][16], B[16][8], D[16][8];
    for (int l = 0; l < 32; l++) {
        const mma_operands* o = reinterpret_cast<const mma_operands*>((uintptr_t)r.fibers[base + l].call.value);
        const int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = bf16_bits(o->a[0], h);
            A[g + 8][2 * t + h] = bf16_bits(o->a[1], h);
            A[g][2 * t + 8 + h] = bf16_bits(o->a[2], h);
            A[g + 8][2 * t + 8 + h] = bf16_bits(o->a[3], h);
            B[2 * t + h][g] = bf16_bits(o->b[0], h);
            B[2 * t + 8 + h][g] = bf16_bits(o->b[1], h);
            D[g][2 * t + h] = o->d[h];
            D[g + 8][2 * t + h] = o->d[2 + h];
        }
    }
    for (int i = 0; i < 16; i++)  // each product exact in fp32 (8 significant bits each), summed in k order
        for (int j = 0; j < 8; j++) {
            float acc = D[i][j];
            for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];
            D[i][j] = acc;
        }
    for (int l = 0; l < 32; l++) {
        const mma_operands* o = reinterpret_cast<const mma_operands*>((uintptr_t)r.fibers[base + l].call.value);
        const int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; h++) {
            o->d[h] = D[g][2 * t + h];
            o->d[2 + h] = D[g + 8][2 * t + h];
        }
    }
    return true;
}

void async_issue(void* dst, const void* bytes16) {
    fiber& f = self("cp.async");
    const uintptr_t a = (uintptr_t)dst;
    const bool shared = a - shared_static_lo < shared_static_bytes || a - shared_dynamic_lo < shared_dynamic_bytes;
    if (!shared) fault(f, "cp.async to %p, which is not in this block's shared memory", dst);
    if (a % 16 != 0) fault(f, "cp.async of 16 bytes to %p, which is not 16-byte aligned", dst);
    async_copy c;
    c.dst = dst;
    memcpy(c.bytes, bytes16, 16);
    c.group = f.commits;
    f.async.push_back(c);
}

void async_commit() { self("cp.async.commit_group").commits++; }

bool async_take(int keep, void** dst, void* bytes16) {
    fiber& f = self("cp.async.wait_group");
    for (size_t i = 0; i < f.async.size(); i++)
        if (f.async[i].group + (uint32_t)keep < f.commits) {  // committed, and older than the newest `keep` groups
            *dst = f.async[i].dst;
            memcpy(bytes16, f.async[i].bytes, 16);
            f.async.erase(f.async.begin() + (long)i);
            return true;
        }
    return false;
}

// ---- 5. launch ----------------------------------------------------------------------------

cpu_error launch_check(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes) {
    char buf[400];
    if (running) {
        snprintf(buf, sizeof buf, "cuda_cpu: kernel '%s' launched from inside kernel '%s': dynamic parallelism is not modelled", name, running->kernel);
        record_error(CPU_ERROR_LAUNCH_FAILURE, buf);
        return CPU_ERROR_LAUNCH_FAILURE;
    }
    // The driver's checks, before anything runs.
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const char* bad = nullptr;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) bad = "a zero dimension";
    else if (threads > MAX_THREADS_PER_BLOCK) bad = "more than 1024 threads per block";
    else if (block.x > 1024 || block.y > 1024 || block.z > MAX_BLOCK_Z) bad = "block.x or block.y over 1024, or block.z over 64";
    else if (grid.x > MAX_GRID_X || grid.y > MAX_GRID_YZ || grid.z > MAX_GRID_YZ) bad = "grid.x over 2^31-1, or grid.y or grid.z over 65535";
    if (bad) {
        snprintf(buf, sizeof buf, "cuda_cpu: kernel '%s' not launched: invalid configuration, grid (%u,%u,%u) block (%u,%u,%u): %s",
                 name, grid.x, grid.y, grid.z, block.x, block.y, block.z, bad);
        record_error(CPU_ERROR_INVALID_CONFIGURATION, buf);
        return CPU_ERROR_INVALID_CONFIGURATION;
    }
    auto it = max_dynamic_shared.find(key);
    const size_t limit = it == max_dynamic_shared.end() ? DEFAULT_MAX_DYNAMIC_SHARED : it->second;
    if (shared_bytes > limit) {
        snprintf(buf, sizeof buf, "cuda_cpu: kernel '%s' not launched: %zu bytes of dynamic shared memory, over its limit of %zu%s",
                 name, shared_bytes, limit,
                 it == max_dynamic_shared.end() ? " (call cpu_func_set_max_dynamic_shared, i.e. cudaFuncSetAttribute(k, "
                                                  "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), for up to 232448)" : "");
        record_error(CPU_ERROR_INVALID_VALUE, buf);
        return CPU_ERROR_INVALID_VALUE;
    }
    return CPU_SUCCESS;
}

cpu_error launch_run(const char* name, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    block_run r;
    r.kernel = name;
    r.body = &body;
    r.fibers.resize(threads);
    r.current = -1;
    r.fault = false;
    // 128-byte aligned: a GPU's dynamic shared memory starts at least that
    // aligned when the kernel has no static __shared__ (WMMA asks 32 bytes).
    dyn_shared_buf.assign(shared_bytes + 128, 0);
    dyn_shared_ptr = shared_bytes ? (void*)(((uintptr_t)dyn_shared_buf.data() + 127) & ~(uintptr_t)127) : nullptr;
    // Static storage, all of it: the cuda_cpu_shared section holds the
    // __shared__ variables, except those of template kernels, which GCC puts
    // in .bss whatever their section attribute says. A kernel can reach no
    // other static storage (host globals are not device memory), so every
    // access a kernel makes to the program's writable data is shared memory.
    shared_static_lo = (uintptr_t)__data_start;
    shared_static_bytes = (uintptr_t)(_end - __data_start);
    shared_dynamic_lo = (uintptr_t)dyn_shared_ptr;
    shared_dynamic_bytes = shared_bytes;
    gridDim = grid;
    blockDim = block;
    running = &r;
    const uint64_t seed = current_seed();
    wmma_seed_maps(seed);
    // Blocks run one at a time, in a seeded order: CUDA promises none, and
    // the race checks see accesses of different blocks as unordered anyway.
    const unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    std::vector<unsigned long long> order(nblocks);
    for (unsigned long long i = 0; i < nblocks; i++) order[i] = i;
    uint64_t shuffle = seed ^ 0xa0761d6478bd642full;
    if (seed != 1)  // seed 1 keeps the natural order, the easiest to follow in a debugger
        for (unsigned long long i = nblocks; i > 1; i--) std::swap(order[i - 1], order[splitmix64(&shuffle) % i]);
    if (count_on) count_launch(name, nblocks, threads, shared_bytes);
    exec.in_kernel = true;
    for (unsigned long long k = 0; k < nblocks && !r.fault; k++) {
        const unsigned long long linear = order[k];
        blockIdx = uint3{(unsigned)(linear % grid.x), (unsigned)(linear / grid.x % grid.y),
                         (unsigned)(linear / ((unsigned long long)grid.x * grid.y))};
        exec.block = (uint32_t)linear;
        // Poison: shared memory is uninitialised at every block start.
        if (__start_cuda_cpu_shared) memset(__start_cuda_cpu_shared, 0xFF, __stop_cuda_cpu_shared - __start_cuda_cpu_shared);
        if (shared_bytes) memset(dyn_shared_ptr, 0xFF, shared_bytes);
        uint64_t block_seed = seed ^ (linear * 0xd1342543de82ef95ull);
        run_block(r, splitmix64(&block_seed));
    }
    exec.in_kernel = false;
    if (count_on) count_launch_end();
    running = nullptr;
    shared_static_bytes = shared_dynamic_bytes = 0;  // outside a kernel nothing is shared memory
    if (r.fault) {
        record_error(CPU_ERROR_LAUNCH_FAILURE, r.message);
        return CPU_ERROR_LAUNCH_FAILURE;
    }
    return CPU_SUCCESS;
}

cpu_error launch_body(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes,
                      const std::function<void()>& body) {
    cpu_error e = launch_check(name, key, grid, block, shared_bytes);
    return e != CPU_SUCCESS ? e : launch_run(name, grid, block, shared_bytes, body);
}

std::string where_now() {
    if (!running || running->current < 0) return "";
    return where(*running, running->current);
}

cpu_error set_max_dynamic_shared(const void* key, const char* name, size_t bytes) {
    if (bytes > OPTIN_MAX_DYNAMIC_SHARED) {
        char buf[300];
        snprintf(buf, sizeof buf, "cuda_cpu: cpu_func_set_max_dynamic_shared(%s, %zu): over the device's %zu bytes",
                 name, bytes, OPTIN_MAX_DYNAMIC_SHARED);
        record_error(CPU_ERROR_INVALID_VALUE, buf);
        return CPU_ERROR_INVALID_VALUE;
    }
    max_dynamic_shared[key] = bytes;
    return CPU_SUCCESS;
}

}  // namespace cuda_cpu

cpu_error cpu_get_last_error() {
    cpu_error e = cuda_cpu::last_error;
    cuda_cpu::last_error = CPU_SUCCESS;
    return e;
}
cpu_error cpu_peek_at_last_error() { return cuda_cpu::last_error; }
const char* cpu_last_error_message() { return cuda_cpu::last_message.c_str(); }
void cpu_set_seed(uint64_t seed) {
    cuda_cpu::seed_value = seed;
    cuda_cpu::seed_set = true;
}
const char* cpu_get_error_string(cpu_error e) {
    switch (e) {
        case CPU_SUCCESS: return "no error";
        case CPU_ERROR_INVALID_VALUE: return "invalid argument";
        case CPU_ERROR_INVALID_CONFIGURATION: return "invalid configuration argument";
        case CPU_ERROR_LAUNCH_FAILURE: return "unspecified launch failure";
    }
    return "unknown error";
}
