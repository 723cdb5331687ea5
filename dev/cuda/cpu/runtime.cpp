// runtime.cpp — the CUDA runtime of the CPU execution layer: device memory,
// streams, events, launches, errors, and the checks that run on every byte a
// device operation touches. Implements CUDA's own cuda_runtime_api.h (the
// subset the project calls) and dev/cuda/cpu/device.h for the cuBLASLt and
// NCCL stand-ins. See dev/cuda/cpu/README.md for what it models.
//
// Reading order:
//   1. state: the arena, allocations, streams, operations, errors
//   2. reports: naming an address, fatal
//   3. the arena: reserve, allocate, the shadow bytes, host/device mode
//   4. checks on every access: bounds, never-written reads, races between streams
//   5. the scheduler: enqueue, dependencies, running what a wait needs; stream
//      capture's rules and where an operation goes (queued, or into a graph)
//   6. the API: memory, copies, streams, events, graphs, device, errors, launches
//
// How device memory is checked. The application's code is compiled with
// GCC's -fsanitize=thread, so every load and store it makes calls
// __tsan_readN/__tsan_writeN(address) (libtsan is not linked): those land in
// section 4.
// Device memory is one arena of address space that nothing else uses, so one
// compare tells device addresses from host ones. For each device byte a
// shadow byte says: not allocated (a red zone between allocations), freed,
// allocated but never written, written. For every 2 bytes a second shadow
// keeps the last operation that wrote them and the last that read them, and
// an access races when that operation is on another stream and not ordered
// before the current one (vector clocks over streams, below). Outside device
// operations the whole arena is PROT_NONE, so host code that touches device
// memory faults even where it is not instrumented (libc's memcpy, fwrite).
#include "device.h"

#include <cuda_runtime_api.h>

#include "cuda_cpu.h"

#include <signal.h>     // sigaction: host dereferences of device memory
#include <sys/mman.h>   // mmap, mprotect: the arena
#include <unistd.h>     // write, _exit
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#define RT_ALWAYS(cond) do { if (!(cond)) { fprintf(stderr, "cuda_cpu: internal error: %s (%s:%d)\n", #cond, __FILE__, __LINE__); abort(); } } while (0)
#define RT_SYSCHECK(call) do { if ((call) != 0) { perror(#call); fprintf(stderr, "cuda_cpu: %s failed at %s:%d\n", #call, __FILE__, __LINE__); abort(); } } while (0)

namespace cuda_cpu {

// ---- 1. state ---------------------------------------------------------------------------

// The arena: [arena_lo, arena_lo + arena_reserved) reserved; allocations are
// carved upwards from arena_lo, each page-aligned, with at least one page of
// red zone after it, never reused (a freed range stays "freed").
static uintptr_t arena_lo = 0;
static uintptr_t arena_used = 0;        // bytes from arena_lo that allocations have reached (hooks compare with it)
static size_t arena_reserved = 0;
static size_t arena_committed = 0;      // shadows made accessible up to here
static uint8_t* shadow = nullptr;       // one byte per arena byte: SH_*
static uint32_t* last_writer = nullptr; // per 2-byte granule: operation id, 0 none
static uint32_t* last_reader = nullptr;
static uint64_t* writer_who = nullptr;  // per granule, inside that operation (a kernel): who_now() of the access
static uint64_t* reader_who = nullptr;  // the earliest read not ordered before the newest
static uint64_t* reader2_who = nullptr; // the latest read from another (block, warp) than reader_who's
constexpr size_t GRANULE = 2;
enum : uint8_t { SH_NONE = 0, SH_FREED = 1, SH_FRESH = 2, SH_WRITTEN = 3 };
static int device_mode = 0;             // > 0 while device operations run: the arena is readable and writable

struct Allocation {
    uintptr_t start;
    size_t bytes;
    int number;   // cudaMalloc #number, from 1
    bool live;
};
static std::map<uintptr_t, Allocation> allocations;  // by start
static int allocations_made = 0;
static size_t bytes_live = 0;

struct PinnedRange { uintptr_t start; size_t bytes; bool ours; };  // ours: cudaMallocHost, else cudaHostRegister
static std::map<uintptr_t, PinnedRange> pinned;

// Operations: every kernel, copy, set, matmul, collective, event record and
// stream wait. `vc` is its vector clock: vc[s] = the last sequence number of
// stream s that happens before it (its own stream: itself).
struct Dep { int stream; uint64_t seq; };
struct Op {
    uint32_t id;
    int stream;
    uint64_t seq;
    const char* name;
    std::vector<Range> ranges;
    std::function<void()> body;
    std::vector<Dep> deps;
    std::vector<uint64_t> vc;
};
struct OpRecord { const char* name; int stream; uint64_t seq; };  // kept for every operation, for reports
static std::vector<OpRecord> op_records(1, OpRecord{"(none)", -1, 0});

struct Stream {
    bool live = true;
    bool blocking = true;    // synchronises with the legacy default stream
    int priority = 0;
    uint64_t last_seq = 0;   // the last enqueued
    uint64_t done_seq = 0;   // every operation up to here has run
    std::deque<std::unique_ptr<Op>> pending;
    std::vector<uint64_t> tail_vc;  // the vector clock after its last enqueued operation
    int capture = 0;                // the stream capture it takes part in (captures[]), 0 none
    std::vector<int> frontier;      // while capturing: the graph nodes its next operation depends on
    int exec = 0;                   // a graph's own stream (replays one branch of execs[exec]), 0 for the program's
};
static std::deque<Stream> streams;  // (a deque: never relocated) index 0: the legacy default stream
// cudaStream_t values are indices in disguise, offset past CUDA's special
// handles (0 and cudaStreamLegacy = 1: the legacy stream; cudaStreamPerThread = 2).
constexpr uintptr_t STREAM_BASE = 0x1000;
static cudaStream_t stream_handle(int i) { return reinterpret_cast<cudaStream_t>(STREAM_BASE + (uintptr_t)i); }

struct Event {
    bool live = true;
    bool timing = true;
    bool recorded = false;
    int stream = 0;
    uint64_t seq = 0;
    std::vector<uint64_t> vc;
    std::shared_ptr<double> ms;  // host time when its marker ran
    int capture = 0;             // last recorded in this stream capture (captures[], even once ended), 0 not
    std::vector<int> nodes;      // then: the graph nodes it stands for
};
static std::vector<Event> events(1);  // 0 unused: a null event is an error

// CUDA graphs, made by stream capture (section 6, "graphs"). While a stream
// captures, an operation on it becomes a node of the capture's graph instead
// of being enqueued; an event recorded there stands for the stream's
// frontier, and a stream that waits for such an event joins the capture (a
// fork). cudaGraphLaunch enqueues the nodes again, each time, with the
// dependencies they were captured with.
struct GraphNode {
    const char* name;
    std::vector<Range> ranges;
    std::function<void()> body;  // as enqueue() got it: a kernel's arguments, copied at capture
    bool run_now;                // enqueue()'s run_now (NCCL): kept for each replay
    int lane;                    // the stream it was captured on: one graph stream per such stream at replay
    std::vector<int> deps;       // nodes before it (indices: nodes are in capture order, a topological one)
};
struct Capture {
    bool active = true;
    bool invalidated = false;    // a prohibited call: cudaStreamEndCapture fails and returns no graph
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    int origin = 0;              // the stream that began it (and must end it)
    std::vector<int> members;    // every stream in it, origin first
    std::vector<GraphNode> nodes;
};
static std::vector<Capture> captures(1);  // 0 unused: "not capturing"
struct Graph { bool live = true; std::vector<GraphNode> nodes; };
struct GraphExec {
    bool live = true;
    std::vector<GraphNode> nodes;
    std::vector<int> lane_streams;  // lane -> the stream its nodes replay on (made at instantiation)
    int launches = 0;
    std::vector<Dep> last_end;      // the end marker of its last launch: the next launch comes after it
    std::vector<uint64_t> last_end_vc;
};
static std::vector<Graph> graphs(1);    // cudaGraph_t = the index (0: null)
static std::vector<GraphExec> execs(1); // cudaGraphExec_t = the index
static cudaStreamCaptureMode thread_capture_mode = cudaStreamCaptureModeGlobal;  // cudaThreadExchangeStreamCaptureMode

static std::vector<uint64_t> host_vc;  // what the host has waited for
static const Op* current = nullptr;    // the operation running now
static int host_fn_stream = -1;        // a cudaLaunchHostFunc function runs now, on this stream (-1: none)
static const char* last_api = "(none)";
static cudaError_t last_error = cudaSuccess;
static cudaError_t sticky_error = cudaSuccess;  // a kernel that failed: every later call returns it
static uint64_t rng_state = 0;
static bool rng_ready = false;

static void vc_join(std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); i++) a[i] = std::max(a[i], b[i]);
}
static uint64_t vc_at(const std::vector<uint64_t>& v, int s) { return (size_t)s < v.size() ? v[s] : 0; }

static uint64_t next_random() {  // splitmix64, seeded by CUDA_CPU_SEED (as the fibers' order)
    if (!rng_ready) {
        const char* s = getenv("CUDA_CPU_SEED");
        rng_state = (s && *s) ? strtoull(s, nullptr, 0) : 1;
        rng_state ^= 0x5bd1e9955bd1e995ull;
        rng_ready = true;
    }
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// ---- 2. reports -------------------------------------------------------------------------

static std::string printf_string(const char* fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    return buf;
}
__attribute__((format(printf, 1, 2))) static std::string str(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = printf_string(fmt, ap);
    va_end(ap);
    return s;
}

static std::string op_label(uint32_t id) {
    const OpRecord& r = op_records[id];
    if (r.stream >= 0 && streams[r.stream].exec)
        return str("'%s' (a node of cudaGraphExec #%d, replayed on its stream %d, operation #%u)", r.name,
                   streams[r.stream].exec, r.stream, id);
    return str("'%s' (stream %d, operation #%u)", r.name, r.stream, id);
}

// "offset 12 of cudaMalloc #3 (4096 bytes)", "8 bytes past the end of ...", "... (freed)".
static std::string describe_address(uintptr_t a) {
    if (a < arena_lo || a >= arena_lo + arena_reserved) return str("0x%lx (not device memory)", (unsigned long)a);
    auto it = allocations.upper_bound(a);
    std::string before;
    if (it != allocations.end())
        before = str("; %zu bytes before the start of cudaMalloc #%d (%zu bytes)", it->first - a, it->second.number,
                     it->second.bytes);
    if (it == allocations.begin()) return str("device address 0x%lx, in no allocation%s", (unsigned long)a, before.c_str());
    --it;
    const Allocation& al = it->second;
    if (a < al.start + al.bytes)
        return str("device address 0x%lx, offset %zu of cudaMalloc #%d (%zu bytes%s)", (unsigned long)a, a - al.start,
                   al.number, al.bytes, al.live ? "" : ", FREED by cudaFree");
    return str("device address 0x%lx, %zu bytes past the end of cudaMalloc #%d (%zu bytes%s)%s", (unsigned long)a,
               a - (al.start + al.bytes), al.number, al.bytes, al.live ? "" : ", freed", before.c_str());
}

void fatal(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string msg = printf_string(fmt, ap);
    va_end(ap);
    fflush(stdout);
    std::string where = where_now();
    fprintf(stderr, "cuda_cpu: %s%s\n", where.empty() ? "" : where.substr(10).c_str(), msg.c_str());
    if (current) fprintf(stderr, "cuda_cpu:   while running %s\n", op_label(current->id).c_str());
    fprintf(stderr, "cuda_cpu:   the last CUDA call of the program: %s\n", last_api);
    fflush(stderr);
    _exit(FATAL_EXIT);
}

// ---- 3. the arena ---------------------------------------------------------------------------

static size_t page_size() { return (size_t)sysconf(_SC_PAGESIZE); }
static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static size_t device_memory_bytes() {
    const char* s = getenv("CUDA_CPU_MEMORY_MB");
    size_t mb = (s && *s) ? strtoull(s, nullptr, 10) : 4096;  // the tests need well under 1 GB
    if (mb < 64) mb = 64;
    return mb << 20;
}

static void on_segv(int sig, siginfo_t* info, void* ctx);

static void arena_init() {
    if (arena_lo) return;
    arena_reserved = device_memory_bytes() * 2;  // room for red zones
    void* p = mmap(nullptr, arena_reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* sh = mmap(nullptr, arena_reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    const size_t granules = arena_reserved / GRANULE * sizeof(uint32_t);
    void* w = mmap(nullptr, granules, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* r = mmap(nullptr, granules, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* ww = mmap(nullptr, granules * 2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* rw = mmap(nullptr, granules * 2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* rw2 = mmap(nullptr, granules * 2, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED || sh == MAP_FAILED || w == MAP_FAILED || r == MAP_FAILED || ww == MAP_FAILED || rw == MAP_FAILED ||
        rw2 == MAP_FAILED) {
        fprintf(stderr, "cuda_cpu: cannot reserve %zu MB of address space for device memory: lower CUDA_CPU_MEMORY_MB\n",
                arena_reserved >> 20);
        exit(1);
    }
    arena_lo = (uintptr_t)p;
    shadow = (uint8_t*)sh;
    last_writer = (uint32_t*)w;
    last_reader = (uint32_t*)r;
    writer_who = (uint64_t*)ww;
    reader_who = (uint64_t*)rw;
    reader2_who = (uint64_t*)rw2;
    streams.resize(1);  // the legacy default stream
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    RT_SYSCHECK(sigaction(SIGSEGV, &sa, nullptr));
    static std::vector<char> altstack(64 * 1024);  // a report from a fiber whose stack overflowed
    stack_t ss;
    ss.ss_sp = altstack.data();
    ss.ss_size = altstack.size();
    ss.ss_flags = 0;
    RT_SYSCHECK(sigaltstack(&ss, nullptr));
}

// The shadows cover the arena up to `end`, made accessible as it grows.
static void shadow_commit(size_t end) {
    if (end <= arena_committed) return;
    const size_t page = page_size();
    size_t to = round_up(end, page * GRANULE);
    RT_SYSCHECK(mprotect(shadow + arena_committed, to - arena_committed, PROT_READ | PROT_WRITE));
    const size_t g0 = arena_committed / GRANULE, g1 = to / GRANULE;
    RT_SYSCHECK(mprotect(last_writer + g0, (g1 - g0) * sizeof(uint32_t), PROT_READ | PROT_WRITE));
    RT_SYSCHECK(mprotect(last_reader + g0, (g1 - g0) * sizeof(uint32_t), PROT_READ | PROT_WRITE));
    RT_SYSCHECK(mprotect(writer_who + g0, (g1 - g0) * sizeof(uint64_t), PROT_READ | PROT_WRITE));
    RT_SYSCHECK(mprotect(reader_who + g0, (g1 - g0) * sizeof(uint64_t), PROT_READ | PROT_WRITE));
    RT_SYSCHECK(mprotect(reader2_who + g0, (g1 - g0) * sizeof(uint64_t), PROT_READ | PROT_WRITE));
    arena_committed = to;
}

// Device mode: the arena's allocated part is readable and writable while
// operations run (or the layer itself touches it), PROT_NONE otherwise.
static void device_mode_enter() {
    if (device_mode++ == 0 && arena_used)
        RT_SYSCHECK(mprotect((void*)arena_lo, round_up(arena_used, page_size()), PROT_READ | PROT_WRITE));
}
static void device_mode_leave() {
    RT_ALWAYS(device_mode > 0);
    if (--device_mode == 0 && arena_used)
        RT_SYSCHECK(mprotect((void*)arena_lo, round_up(arena_used, page_size()), PROT_NONE));
}

static void on_segv(int, siginfo_t* info, void*) {
    uintptr_t a = (uintptr_t)info->si_addr;
    if (arena_lo && a >= arena_lo && a < arena_lo + arena_reserved) {
        std::string what = describe_address(a);
        if (device_mode == 0)
            fatal("host code touched %s outside any device operation: device memory is not host memory "
                  "(copy it with cudaMemcpy; a real GPU would crash here too, or read garbage)", what.c_str());
        fatal("%s touched %s, out of its bounds (code the layer's checks do not instrument)",
              current ? op_label(current->id).c_str() : "the layer", what.c_str());
    }
    // Not ours: the default action (a core dump, as without the layer).
    signal(SIGSEGV, SIG_DFL);
}

static cudaError_t arena_alloc(void** out, size_t bytes) {
    arena_init();
    const size_t page = page_size();
    const size_t start = round_up(arena_used, page) + page;  // at least one page of red zone before
    const size_t end = start + bytes;
    if (end + page > arena_reserved || bytes_live + bytes > device_memory_bytes()) return cudaErrorMemoryAllocation;
    shadow_commit(end + page);
    memset(shadow + start, SH_FRESH, bytes);
    Allocation al{arena_lo + start, bytes, ++allocations_made, true};
    allocations[al.start] = al;
    // The poison (0xFF bytes) is written lazily, by the first operation that
    // reads a byte never written (section 4): so pages nobody touches (a
    // workspace cuBLASLt does not need) stay unpopulated and cost nothing.
    const bool was = device_mode > 0;
    if (was) device_mode_leave();  // the new pages join the toggled range
    arena_used = end + page;       // the red zone after it belongs to the checked range
    if (was) device_mode_enter();
    bytes_live += bytes;
    *out = (void*)al.start;
    return cudaSuccess;
}

static const Allocation* allocation_of(const void* p) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin()) return nullptr;
    --it;
    if (a >= it->second.start + it->second.bytes) return nullptr;
    return &it->second;
}

bool is_device_pointer(const void* p) {
    uintptr_t a = (uintptr_t)p;
    return arena_lo && a >= arena_lo && a < arena_lo + arena_reserved;
}

std::string device_range_problem(const void* p, size_t bytes) {
    if (!is_device_pointer(p)) return str("%p is not device memory (not from cudaMalloc)", p);
    const Allocation* al = allocation_of(p);
    if (!al) return describe_address((uintptr_t)p);
    if (!al->live) return describe_address((uintptr_t)p);
    uintptr_t end = (uintptr_t)p + bytes;
    if (end > al->start + al->bytes)
        return str("%zu bytes from offset %zu of cudaMalloc #%d (%zu bytes) run %zu bytes past its end", bytes,
                   (uintptr_t)p - al->start, al->number, al->bytes, end - (al->start + al->bytes));
    return "";
}

static bool pinned_host(const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = pinned.upper_bound(a);
    if (it == pinned.begin()) return false;
    --it;
    return a + bytes <= it->second.start + it->second.bytes;
}

// ---- 4. checks on every access ------------------------------------------------------------

// Is operation `id` ordered before the current one?
static bool ordered_before(uint32_t id) {
    const OpRecord& r = op_records[id];
    return vc_at(current->vc, r.stream) >= r.seq;
}

static void race(uint32_t other, bool other_wrote, bool writing, uintptr_t a) {
    fatal("race between streams: %s %s %s, which %s %s, and nothing orders the two (no event wait, no "
          "synchronisation between them): make one wait for the other (cudaEventRecord + cudaStreamWaitEvent)",
          op_label(current->id).c_str(), writing ? "writes" : "reads", describe_address(a).c_str(),
          op_label(other).c_str(), other_wrote ? "wrote" : "read");
}

// For a read of never-written memory: work enqueued earlier on other streams
// that has not run and is not ordered before this operation; the likely
// writer, whose wait is missing.
static std::string unordered_pending() {
    std::string list;
    for (size_t s = 0; s < streams.size(); s++)
        for (const auto& op : streams[s].pending)
            if (op->id < current->id && (int)s != current->stream && !ordered_before(op->id))
                list += "\ncuda_cpu:   " + op_label(op->id);
    if (list.empty()) return "";
    return "; enqueued earlier on other streams, not run yet, and not ordered before it (a race between streams, "
           "if one of them writes it: a missing cudaStreamWaitEvent?):" + list;
}

// Inside one kernel: who made an access (block, thread, barrier and warp
// epochs; cuda_cpu.h's exec_point), and whether two accesses are ordered.
static uint64_t who_now() {
    return (uint64_t)exec.block << 32 | (uint64_t)exec.thread << 22 | (exec.epoch & 0x7ff) << 11 | (exec.warp_epoch & 0x7ff);
}
constexpr uint64_t NO_ONE = ~0ull;
static uint64_t who_group(uint64_t w) { return w >> 27; }  // (block, warp)
static bool who_ordered(uint64_t a, uint64_t b) {
    if ((a >> 32) != (b >> 32)) return false;                           // two blocks: never ordered
    const uint32_t ta = (uint32_t)(a >> 22) & 0x3ff, tb = (uint32_t)(b >> 22) & 0x3ff;
    if (ta == tb) return true;                                          // one thread
    if (((a >> 11) & 0x7ff) != ((b >> 11) & 0x7ff)) return true;        // a barrier between them
    return ta / 32 == tb / 32 && (a & 0x7ff) != (b & 0x7ff);           // one warp, a warp operation between them
}

static void race_inside(uint64_t other, bool other_wrote, bool writing, uintptr_t a) {
    const unsigned ob = (unsigned)(other >> 32), ot = (unsigned)(other >> 22) & 0x3ff;
    if (ob != exec.block)
        fatal("race between blocks: this thread %s %s, which thread %u of block %u (linear) %s in the same kernel; "
              "blocks run in any order and nothing orders them inside a kernel (split the kernel, or use atomics)",
              writing ? "writes" : "reads", describe_address(a).c_str(), ot, ob, other_wrote ? "wrote" : "read");
    fatal("race inside the block: this thread %s %s, which thread %u of the block %s with no __syncthreads "
          "between (a missing barrier)", writing ? "writes" : "reads", describe_address(a).c_str(), ot,
          other_wrote ? "wrote" : "read");
}

// Records one access of the current operation to [a, a + n), checking it.
// `kernel`: a kernel's own access (bounds and never-written reads are checked
// byte by byte); otherwise a declared range of a copy, matmul or collective.
static void access(uintptr_t a, size_t n, bool write, bool kernel) {
    const size_t off = a - arena_lo;
    const uint32_t me = current->id;
    for (size_t i = 0; i < n; i++) {
        uint8_t& s = shadow[off + i];
        if (s < SH_FRESH)
            fatal("%s of %zu bytes at %s: out of bounds", write ? "write" : "read", n, describe_address(a + i).c_str());
        if (write) s = SH_WRITTEN;
        else if (s == SH_FRESH && !kernel) *(uint8_t*)(a + i) = 0xFF;  // the poison, on first read (NaN as float, bf16, double)
        else if (s == SH_FRESH && kernel)
            fatal("read of %zu bytes at %s, which nothing has written since cudaMalloc (fresh device memory is "
                  "garbage on a GPU; here it is 0xFF bytes: NaN)%s", n, describe_address(a + i).c_str(),
                  unordered_pending().c_str());
    }
    const bool inside = kernel && race_check_enabled() && !exec.in_atomic;
    const uint64_t who = inside ? who_now() : 0;
    for (size_t g = off / GRANULE; g <= (off + n - 1) / GRANULE; g++) {
        uint32_t w = last_writer[g];
        if (w && w != me && !ordered_before(w)) race(w, true, write, arena_lo + g * GRANULE);
        if (inside && w == me && !who_ordered(writer_who[g], who)) race_inside(writer_who[g], true, write, arena_lo + g * GRANULE);
        if (write) {
            uint32_t r = last_reader[g];
            if (r && r != me && !ordered_before(r)) race(r, false, true, arena_lo + g * GRANULE);
            if (inside && r == me) {
                if (!who_ordered(reader_who[g], who)) race_inside(reader_who[g], false, true, arena_lo + g * GRANULE);
                if (reader2_who[g] != NO_ONE && !who_ordered(reader2_who[g], who))
                    race_inside(reader2_who[g], false, true, arena_lo + g * GRANULE);
            }
            last_writer[g] = me;
            writer_who[g] = who;
        } else if (last_reader[g] != me || !inside) {  // this operation's first read of it
            last_reader[g] = me;
            reader_who[g] = who;
            reader2_who[g] = NO_ONE;
        } else if (who_ordered(reader_who[g], who)) {  // a read ordered after the recorded one supersedes it
            reader_who[g] = who;
            if (reader2_who[g] != NO_ONE && who_ordered(reader2_who[g], who)) reader2_who[g] = NO_ONE;
        } else if (who_group(reader_who[g]) != who_group(who)) {
            reader2_who[g] = who;  // concurrent with the recorded read, from another warp
        }
    }
}

// An instrumented access: from a kernel, or from host code (an error).
__attribute__((noinline)) static void hooked(uintptr_t a, size_t n, bool write) {
    if (host_fn_stream >= 0)
        fatal("a host function (cudaLaunchHostFunc, stream %d) %s %zu bytes at %s: it runs on the host, where device "
              "memory is not host memory (copy the data to pinned host memory on the stream before it)",
              host_fn_stream, write ? "writes" : "reads", n, describe_address(a).c_str());
    if (!current)
        fatal("host code %s %zu bytes at %s: device memory is not host memory (copy it with cudaMemcpy)",
              write ? "writes" : "reads", n, describe_address(a).c_str());
    access(a, n, write, true);
}

}  // namespace cuda_cpu

// GCC's -fsanitize=thread instruments every load and store of the
// application's code with a call to __tsan_readN / __tsan_writeN (and
// atomics with __tsan_atomic*); without libtsan linked, these are ours. (Not
// -fsanitize=address: its pass merges the check of a load with that of the
// store to the same address, so `x += v` would never be seen writing.)
// Device memory, then the running block's shared memory (static, dynamic).
static inline void on_access(uintptr_t a, size_t n, bool write, void* ret) {
    using namespace cuda_cpu;
    if (a - arena_lo < arena_used) {
        hooked(a, n, write);
        if (count_on) count_access(a, n, write, false, ret);
    } else if (a - shared_static_lo < shared_static_bytes || a - shared_dynamic_lo < shared_dynamic_bytes) {
        shared_access(a, n, write);
        if (count_on) count_access(a, n, write, true, ret);
    }
}
// (the return address: the instrumented instruction, for the counters' warp requests)
#define CPU_RET __builtin_return_address(0)
#define CPU_HOOK(n)                                                                                   \
    extern "C" void __tsan_read##n(void* a) { on_access((uintptr_t)a, n, false, CPU_RET); }           \
    extern "C" void __tsan_write##n(void* a) { on_access((uintptr_t)a, n, true, CPU_RET); }           \
    extern "C" void __tsan_unaligned_read##n(void* a) { on_access((uintptr_t)a, n, false, CPU_RET); } \
    extern "C" void __tsan_unaligned_write##n(void* a) { on_access((uintptr_t)a, n, true, CPU_RET); }
CPU_HOOK(1)
CPU_HOOK(2)
CPU_HOOK(4)
CPU_HOOK(8)
CPU_HOOK(16)
extern "C" void __tsan_read_range(void* a, unsigned long n) {
    if (n) on_access((uintptr_t)a, n, false, CPU_RET);
}
extern "C" void __tsan_write_range(void* a, unsigned long n) {
    if (n) on_access((uintptr_t)a, n, true, CPU_RET);
}
extern "C" void __tsan_vptr_update(void** p, void*) { on_access((uintptr_t)p, sizeof(void*), true, CPU_RET); }
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_init() {}

// Atomics: the operation itself, and the access, marked atomic (atomics of
// one kernel do not race with each other). `mo` is the memory order; every
// one is done sequentially consistent here, which is at least as strong.
struct atomic_mark {
    bool was;
    atomic_mark() : was(cuda_cpu::exec.in_atomic) { cuda_cpu::exec.in_atomic = true; }
    ~atomic_mark() { cuda_cpu::exec.in_atomic = was; }
};
#define CPU_ATOMICS(bits, T)                                                                                   \
    extern "C" T __tsan_atomic##bits##_load(const volatile T* a, int) {                                       \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), false, CPU_RET);                                                    \
        return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                                           \
    }                                                                                                          \
    extern "C" void __tsan_atomic##bits##_store(volatile T* a, T v, int) {                                    \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                              \
    }                                                                                                          \
    extern "C" T __tsan_atomic##bits##_fetch_add(volatile T* a, T v, int) {                                   \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                     \
    }                                                                                                          \
    extern "C" T __tsan_atomic##bits##_fetch_sub(volatile T* a, T v, int) {                                   \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                     \
    }                                                                                                          \
    extern "C" T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) {                                    \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                    \
    }                                                                                                          \
    extern "C" int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {        \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
    }                                                                                                          \
    extern "C" int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {          \
        atomic_mark m;                                                                                         \
        on_access((uintptr_t)a, sizeof(T), true, CPU_RET);                                                     \
        return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                 \
    }
CPU_ATOMICS(8, unsigned char)
CPU_ATOMICS(16, unsigned short)
CPU_ATOMICS(32, int)
CPU_ATOMICS(64, long)
extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

namespace cuda_cpu {

// CUDA's documentation of cudaLaunchHostFunc: "The host function must not
// make any CUDA API calls" (a GPU may answer cudaErrorNotPermitted, or
// deadlock: the function holds the stream the call may wait for). The layer
// reports every call made from inside one, whatever it is.
static void host_fn_check(const char* call) {
    if (host_fn_stream >= 0)
        fatal("%s called from inside a host function (cudaLaunchHostFunc on stream %d): CUDA forbids any CUDA call "
              "there; do it on the host thread, ordered after the function by an event recorded behind it",
              call, host_fn_stream);
}

// ---- 5. the scheduler ----------------------------------------------------------------------

static int stream_index(cudaStream_t s) {
    uintptr_t v = (uintptr_t)s;
    if (v == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread) return 0;
    v -= STREAM_BASE;
    if (v == 0 || v >= streams.size() || !streams[v].live) return -1;
    return (int)v;
}

static bool dep_done(const Dep& d) { return streams[d.stream].done_seq >= d.seq; }

static void run_op(std::unique_ptr<Op> op) {
    Stream& st = streams[op->stream];
    device_mode_enter();
    current = op.get();
    for (const Range& r : op->ranges) {
        for (size_t row = 0; row < r.rows; row++) {
            const void* p = (const char*)r.p + row * r.stride;
            std::string problem = device_range_problem(p, r.bytes);
            if (!problem.empty()) fatal("%s: %s", r.write ? "writes" : "reads", problem.c_str());
            if (r.bytes) access((uintptr_t)p, r.bytes, r.write, false);
        }
    }
    if (op->body) op->body();
    current = nullptr;
    device_mode_leave();
    st.done_seq = op->seq;
}

// Runs operations, in a seeded order among those that are ready, until every
// target (stream, seq) has run. Only what the targets depend on runs: other
// streams are delayed until something needs them, which is what exposes a
// missing wait.
static void run_until(std::vector<Dep> targets) {
    for (;;) {
        std::vector<uint64_t> need(streams.size(), 0);
        std::vector<Dep> work;
        for (const Dep& t : targets)
            if (!dep_done(t)) work.push_back(t);
        if (work.empty()) return;
        while (!work.empty()) {
            Dep d = work.back();
            work.pop_back();
            if (d.seq <= need[d.stream]) continue;
            need[d.stream] = d.seq;
            for (const auto& op : streams[d.stream].pending) {
                if (op->seq > d.seq) break;
                for (const Dep& e : op->deps)
                    if (!dep_done(e) && e.seq > need[e.stream]) work.push_back(e);
            }
        }
        std::vector<int> ready;
        for (size_t s = 0; s < streams.size(); s++) {
            if (streams[s].pending.empty()) continue;
            const Op& head = *streams[s].pending.front();
            if (head.seq > need[s]) continue;
            bool ok = true;
            for (const Dep& e : head.deps) ok = ok && dep_done(e);
            if (ok) ready.push_back((int)s);
        }
        RT_ALWAYS(!ready.empty());
        int s = ready[next_random() % ready.size()];
        std::unique_ptr<Op> op = std::move(streams[s].pending.front());
        streams[s].pending.pop_front();
        run_op(std::move(op));
    }
}

static void sync_stream(int s) {
    run_until({Dep{s, streams[s].last_seq}});
    vc_join(host_vc, streams[s].tail_vc);
}

static void sync_device() {
    std::vector<Dep> all;
    for (size_t s = 0; s < streams.size(); s++) all.push_back(Dep{(int)s, streams[s].last_seq});
    run_until(all);
    for (const Stream& st : streams) vc_join(host_vc, st.tail_vc);
}

// Appends an operation to stream s; returns its (stream, seq).
static Dep push_op(int s, const char* name, std::vector<Range> ranges, std::function<void()> body,
                   std::vector<Dep> deps = {}, const std::vector<uint64_t>* extra_vc = nullptr) {
    Stream& st = streams[s];
    auto op = std::make_unique<Op>();
    op->stream = s;
    op->seq = ++st.last_seq;
    op->name = name;
    op->ranges = std::move(ranges);
    op->body = std::move(body);
    op->deps = std::move(deps);
    op->vc = st.tail_vc;
    vc_join(op->vc, host_vc);
    if (extra_vc) vc_join(op->vc, *extra_vc);
    // The legacy default stream: its work waits for every blocking stream's,
    // and theirs for its (CUDA's "legacy default stream" semantics).
    if (s == 0) {
        for (size_t o = 1; o < streams.size(); o++)
            if (streams[o].live && streams[o].blocking && streams[o].last_seq) {
                op->deps.push_back(Dep{(int)o, streams[o].last_seq});
                vc_join(op->vc, streams[o].tail_vc);
            }
    } else if (st.blocking && streams[0].last_seq) {
        op->deps.push_back(Dep{0, streams[0].last_seq});
        vc_join(op->vc, streams[0].tail_vc);
    }
    if (op->vc.size() <= (size_t)s) op->vc.resize(s + 1, 0);
    op->vc[s] = op->seq;
    op->id = (uint32_t)op_records.size();
    op_records.push_back(OpRecord{name, s, op->seq});
    st.tail_vc = op->vc;
    Dep at{s, op->seq};
    st.pending.push_back(std::move(op));
    return at;
}

// ---- stream capture: the rules, and where an operation goes ----
//
// CUDA Programming Guide, "Stream Capture" and its "Prohibited and Unhandled
// Operations": a capturing stream, or an event recorded in a capture, may not
// be synchronised or queried, nor the device; while a blocking stream
// captures, the legacy default stream (which synchronises with it) may not be
// used at all, so neither may the synchronous copies and sets; calls the
// runtime calls "potentially unsafe" (cudaMalloc's kind) are refused unless
// the capture or the thread is in relaxed mode. A refused call returns its
// error and invalidates the capture: cudaStreamEndCapture then fails.

static Capture* capture_of(int s) { return streams[s].capture ? &captures[streams[s].capture] : nullptr; }

static void capture_invalidate(int c, const std::string& why) {
    if (!captures[c].active || captures[c].invalidated) return;
    captures[c].invalidated = true;
    fprintf(stderr, "cuda_cpu: %s: the stream capture begun on stream %d is invalidated (cudaStreamEndCapture will "
            "return cudaErrorStreamCaptureInvalidated and no graph)\n", why.c_str(), captures[c].origin);
}

// A use of the legacy default stream (s == 0): refused while any capture
// holds a blocking stream, whose work the legacy stream would join.
static cudaError_t legacy_check(int s, const char* call) {
    if (s != 0) return cudaSuccess;
    bool hit = false;
    for (size_t c = 1; c < captures.size(); c++) {
        if (!captures[c].active) continue;
        for (int m : captures[c].members)
            if (streams[m].blocking) {
                capture_invalidate((int)c, str("%s uses the legacy default stream while blocking stream %d captures "
                                               "(use a stream made with cudaStreamNonBlocking, or move the call out "
                                               "of the capture)", call, m));
                hit = true;
                break;
            }
    }
    return hit ? cudaErrorStreamCaptureImplicit : cudaSuccess;
}

// A "potentially unsafe" call (cudaMalloc, cudaFree, cudaMallocHost,
// cudaFreeHost, synchronous copies and sets): refused while a capture not
// begun in relaxed mode is active, unless this thread's mode is relaxed. One
// host thread here, so the global and thread-local modes agree.
static cudaError_t unsafe_check(const char* call) {
    if (thread_capture_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    bool hit = false;
    for (size_t c = 1; c < captures.size(); c++)
        if (captures[c].active && captures[c].mode != cudaStreamCaptureModeRelaxed) {
            capture_invalidate((int)c, str("%s during stream capture (not allowed unless the capture is begun with "
                                           "cudaStreamCaptureModeRelaxed)", call));
            hit = true;
        }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

// Stream s about to be synchronised or queried. A stream outside the capture
// counts as a "potentially unsafe" call: the documentation names cudaMalloc
// only; PyTorch meets cudaEventQuery of an ordinary event refused in global
// mode (pytorch/pytorch#146924), so the layer refuses every synchronous query.
static cudaError_t sync_check(int s, const char* call) {
    cudaError_t e = legacy_check(s, call);
    if (e != cudaSuccess) return e;
    if (streams[s].capture) {
        capture_invalidate(streams[s].capture, str("%s on stream %d, which is capturing (its work is a graph's, not "
                                                   "queued: nothing to wait for)", call, s));
        return cudaErrorStreamCaptureUnsupported;
    }
    return unsafe_check(call);  // another stream: a synchronous call, "potentially unsafe" (the stricter reading)
}

// The whole device about to be synchronised: every active capture is in it.
static cudaError_t device_sync_check(const char* call) {
    bool hit = false;
    for (size_t c = 1; c < captures.size(); c++)
        if (captures[c].active) {
            capture_invalidate((int)c, str("%s during stream capture", call));
            hit = true;
        }
    return hit ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

// An event about to be synchronised or queried: one last recorded in a capture stands for graph nodes, not work.
static cudaError_t event_check(const Event& ev, const char* call) {
    if (!ev.capture) return unsafe_check(call);  // an ordinary event: still a synchronous call (the stricter reading)
    capture_invalidate(ev.capture, str("%s on an event last recorded in a stream capture", call));
    fprintf(stderr, "cuda_cpu: %s: the event was last recorded in the capture begun on stream %d: record it again "
            "outside the capture to wait for it\n", call, captures[ev.capture].origin);
    return cudaErrorCapturedEvent;
}

// Every device operation on stream s comes here: recorded into the graph
// when s is capturing (it does not run, and NCCL's run_now is kept for the
// replays), else enqueued (and run at once when run_now). *at: where it was
// enqueued ({s, 0} when captured).
static cudaError_t submit(int s, const char* name, std::vector<Range> ranges, std::function<void()> body,
                          bool run_now, Dep* at = nullptr) {
    cudaError_t e = legacy_check(s, name);
    if (e != cudaSuccess) return e;
    if (at) *at = Dep{s, 0};
    if (Capture* c = capture_of(s)) {
        if (c->invalidated) return cudaErrorStreamCaptureInvalidated;
        c->nodes.push_back(GraphNode{name, std::move(ranges), std::move(body), run_now, s, streams[s].frontier});
        streams[s].frontier = {(int)c->nodes.size() - 1};
        return cudaSuccess;
    }
    Dep d = push_op(s, name, std::move(ranges), std::move(body));
    if (run_now) run_until({d});
    if (at) *at = d;
    return cudaSuccess;
}

cudaError_t enqueue(cudaStream_t stream, const char* name, std::vector<Range> ranges, std::function<void()> body,
                    bool run_now) {
    arena_init();
    host_fn_check(name);
    int s = stream_index(stream);
    if (s < 0) return cudaErrorInvalidResourceHandle;
    return submit(s, name, std::move(ranges), std::move(body), run_now);
}

// ---- kernels -------------------------------------------------------------------------------------

static cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

void launch_enqueue(const char* name, const void* key, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                    std::function<void()> body) {
    arena_init();
    last_api = name;
    host_fn_check(name);
    int s = stream_index(stream);
    if (s < 0) {
        fprintf(stderr, "cuda_cpu: kernel '%s' launched on a stream that is not live (destroyed or never created)\n", name);
        set_error(cudaErrorInvalidResourceHandle);
        return;
    }
    cpu_error e = launch_check(name, key, grid, block, shared_bytes);
    if (e != CPU_SUCCESS) {
        cpu_get_last_error();  // taken over by the runtime's own last error
        set_error((cudaError_t)e);
        // In a capture, the failed launch also invalidates it (the stricter
        // reading: CUDA's guide says an invalid operation invalidates a capture).
        if (streams[s].capture) capture_invalidate(streams[s].capture, str("kernel '%s': a failed launch", name));
        return;
    }
    set_error(submit(s, name, {}, [name, grid, block, shared_bytes, body] {
        cpu_error r = launch_run(name, grid, block, shared_bytes, body);
        if (r != CPU_SUCCESS) {
            cpu_get_last_error();
            sticky_error = (cudaError_t)r;
            last_error = (cudaError_t)r;
        }
    }, false));
}

}  // namespace cuda_cpu

// ---- 6. the API ----------------------------------------------------------------------------------
using namespace cuda_cpu;

// Every API call: name it for reports, and return a failed kernel's error as CUDA does (sticky).
#define API(name)                                   \
    arena_init();                                   \
    last_api = name;                                \
    host_fn_check(name);                            \
    if (sticky_error != cudaSuccess) return sticky_error

// ---- memory ----

cudaError_t cudaMalloc(void** p, size_t bytes) {
    API("cudaMalloc");
    if (!p) return set_error(cudaErrorInvalidValue);
    if (cudaError_t e = unsafe_check("cudaMalloc")) return set_error(e);
    if (bytes == 0) { *p = nullptr; return cudaSuccess; }
    return set_error(arena_alloc(p, bytes));
}

cudaError_t cudaFree(void* p) {
    API("cudaFree");
    if (!p) return cudaSuccess;  // also how programs create the context
    if (cudaError_t e = unsafe_check("cudaFree")) return set_error(e);
    sync_device();               // cudaFree waits for the device, as CUDA's does
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end() || !it->second.live) {
        fprintf(stderr, "cuda_cpu: cudaFree(%p): %s\n", p,
                it == allocations.end() ? "not the start of a cudaMalloc allocation" : "already freed");
        return set_error(cudaErrorInvalidValue);
    }
    Allocation& al = it->second;
    memset(shadow + (al.start - arena_lo), SH_FREED, al.bytes);
    // Give its pages back (they stay reserved, never reused: a late access is
    // "freed", not someone else's data); unpopulated pages also keep the
    // host/device protection switch cheap.
    const size_t page = page_size();
    RT_SYSCHECK(madvise((void*)al.start, round_up(al.bytes, page), MADV_DONTNEED));
    al.live = false;
    bytes_live -= al.bytes;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
    API("cudaMallocHost");
    if (!p) return set_error(cudaErrorInvalidValue);
    if (cudaError_t e = unsafe_check("cudaMallocHost")) return set_error(e);
    void* q = nullptr;
    if (posix_memalign(&q, 4096, bytes ? bytes : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    memset(q, 0xFF, bytes);
    pinned[(uintptr_t)q] = PinnedRange{(uintptr_t)q, bytes, true};
    *p = q;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
    API("cudaFreeHost");
    if (!p) return cudaSuccess;
    if (cudaError_t e = unsafe_check("cudaFreeHost")) return set_error(e);
    sync_device();
    auto it = pinned.find((uintptr_t)p);
    if (it == pinned.end() || !it->second.ours) return set_error(cudaErrorInvalidValue);
    pinned.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
    API("cudaHostRegister");
    if (!p || bytes == 0 || is_device_pointer(p)) return set_error(cudaErrorInvalidValue);
    if (pinned.count((uintptr_t)p)) return set_error(cudaErrorHostMemoryAlreadyRegistered);
    pinned[(uintptr_t)p] = PinnedRange{(uintptr_t)p, bytes, false};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
    API("cudaHostUnregister");
    auto it = pinned.find((uintptr_t)p);
    if (it == pinned.end() || it->second.ours) return set_error(cudaErrorHostMemoryNotRegistered);
    sync_device();
    pinned.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
    API("cudaMemGetInfo");
    if (free_bytes) *free_bytes = device_memory_bytes() - bytes_live;
    if (total) *total = device_memory_bytes();
    return cudaSuccess;
}

// ---- copies and sets ----

// The kind a copy really is, from the pointers (as UVA lets cudaMemcpyDefault do).
static cudaError_t copy_check(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const char* call) {
    const bool dd = is_device_pointer(dst), sd = is_device_pointer(src);
    cudaMemcpyKind real = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                             : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    if (kind != cudaMemcpyDefault && kind != real) {
        fprintf(stderr, "cuda_cpu: %s(dst %p, src %p, %zu bytes): kind %d, but the pointers make it kind %d "
                "(1 = host to device, 2 = device to host, 3 = device to device)\n", call, dst, src, n, (int)kind, (int)real);
        return cudaErrorInvalidValue;
    }
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    for (int side = 0; side < 2; side++) {
        const void* p = side ? src : dst;
        if (!is_device_pointer(p)) continue;
        std::string problem = device_range_problem(p, n);
        if (!problem.empty()) {
            fprintf(stderr, "cuda_cpu: %s, %s: %s\n", call, side ? "source" : "destination", problem.c_str());
            return cudaErrorInvalidValue;
        }
    }
    return cudaSuccess;
}

// Enqueues a copy on stream s and says whether the host must wait for it
// (CUDA's rules: a copy to pageable host memory returns when done; from
// pageable host memory, the source is staged at the call). Captured: only
// device and pinned memory, which each replay reads or writes then (so a
// program may change a pinned input between launches).
static cudaError_t copy_enqueue(void* dst, const void* src, size_t n, cudaMemcpyKind kind, int s, bool async,
                                const char* call) {
    cudaError_t e = copy_check(dst, src, n, kind, call);
    if (e != cudaSuccess || n == 0) return set_error(e);
    const bool dd = is_device_pointer(dst), sd = is_device_pointer(src);
    if (!async && (e = legacy_check(0, call)) == cudaSuccess) e = unsafe_check(call);
    if (e != cudaSuccess) return set_error(e);
    if (streams[s].capture && !captures[streams[s].capture].invalidated &&
        ((!sd && !pinned_host(src, n)) || (!dd && !pinned_host(dst, n)))) {
        // Stricter than the guide, which is silent: a graph node cannot stage
        // pageable memory at each replay, nor make the host wait for it.
        capture_invalidate(streams[s].capture, str("%s of %zu bytes %s pageable host memory %p during stream capture "
                                                   "(use cudaMallocHost or cudaHostRegister memory)", call, n,
                                                   sd ? "to" : "from", sd ? dst : src));
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    std::vector<Range> ranges;
    if (sd) ranges.push_back(Range{src, n, false});
    if (dd) ranges.push_back(Range{dst, n, true});
    std::function<void()> body;
    if (!sd && !pinned_host(src, n)) {  // pageable source: staged now
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + n);
        body = [dst, staged, n] { memcpy(dst, staged->data(), n); };
    } else if (sd && dd) {
        body = [dst, src, n] {
            memmove(dst, src, n);
            memcpy(shadow + ((uintptr_t)dst - arena_lo), shadow + ((uintptr_t)src - arena_lo), n);  // garbage stays garbage
        };
    } else {
        body = [dst, src, n] { memcpy(dst, src, n); };
    }
    Dep at;
    if ((e = submit(s, call, std::move(ranges), std::move(body), false, &at)) != cudaSuccess) return set_error(e);
    const bool wait = !async ? !(sd && dd) : (!dd && !pinned_host(dst, n));
    if (wait && at.seq) {
        run_until({at});
        vc_join(host_vc, streams[s].tail_vc);
        return sticky_error;  // a kernel before it failed: the copy reports it, as CUDA's does
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
    API("cudaMemcpy");
    return copy_enqueue(dst, src, n, kind, 0, false, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
    API("cudaMemcpyAsync");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    return copy_enqueue(dst, src, n, kind, s, true, "cudaMemcpyAsync");
}

static cudaError_t memset_enqueue(void* p, int value, size_t n, int s, bool async, const char* call) {
    if (n == 0) return cudaSuccess;
    std::string problem = device_range_problem(p, n);
    if (!problem.empty()) {
        fprintf(stderr, "cuda_cpu: %s(%p, %d, %zu): %s\n", call, p, value, n, problem.c_str());
        return set_error(cudaErrorInvalidValue);
    }
    cudaError_t e = async ? cudaSuccess : legacy_check(0, call);
    if (e == cudaSuccess && !async) e = unsafe_check(call);
    if (e == cudaSuccess) e = submit(s, call, {Range{p, n, true}}, [p, value, n] { memset(p, value, n); }, false);
    return set_error(e);
}

cudaError_t cudaMemset(void* p, int value, size_t n) {
    API("cudaMemset");
    return memset_enqueue(p, value, n, 0, false, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
    API("cudaMemsetAsync");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    return memset_enqueue(p, value, n, s, true, "cudaMemsetAsync");
}

// ---- streams ----

static cudaError_t stream_create(cudaStream_t* out, unsigned flags, int priority) {
    if (!out) return set_error(cudaErrorInvalidValue);
    Stream st;
    st.blocking = !(flags & cudaStreamNonBlocking);
    st.priority = priority;
    st.tail_vc = host_vc;
    streams.push_back(std::move(st));
    *out = stream_handle((int)streams.size() - 1);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    API("cudaStreamCreate");
    return stream_create(s, cudaStreamDefault, 0);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    API("cudaStreamCreateWithFlags");
    return stream_create(s, flags, 0);
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
    API("cudaStreamCreateWithPriority");
    return stream_create(s, flags, priority);
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
    API("cudaDeviceGetStreamPriorityRange");
    if (least) *least = 0;        // H100/H200's range
    if (greatest) *greatest = -5;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    API("cudaStreamDestroy");
    int s = stream_index(stream);
    if (s <= 0) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = sync_check(s, "cudaStreamDestroy")) return set_error(e);
    sync_stream(s);  // its work still completes, as CUDA's does
    streams[s].live = false;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    API("cudaStreamSynchronize");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = sync_check(s, "cudaStreamSynchronize")) return set_error(e);
    sync_stream(s);
    return sticky_error;
}

// Not done yet: run one operation it needs (so a loop over this makes
// progress), and say cudaErrorNotReady.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    API("cudaStreamQuery");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = sync_check(s, "cudaStreamQuery")) return set_error(e);
    if (streams[s].done_seq == streams[s].last_seq) {
        vc_join(host_vc, streams[s].tail_vc);
        return cudaSuccess;
    }
    if (next_random() % 2) run_until({Dep{s, streams[s].done_seq + 1}});
    return cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    API("cudaDeviceSynchronize");
    if (cudaError_t e = device_sync_check("cudaDeviceSynchronize")) return set_error(e);
    sync_device();
    return sticky_error;
}

// A host function in stream order (cudaLaunchHostFunc's documentation): an
// operation like any other, so it runs after the work enqueued before it on
// the stream (and what that waited for) and before the work after it; other
// streams are not ordered with it except through events. It runs on the host
// thread when a synchronisation needs it, as any operation here, with the
// arena PROT_NONE (host code: device memory is not host memory; an
// instrumented access is reported as the host function's) and every CUDA call
// from inside it reported (host_fn_check). Not called after a kernel failed
// (a sticky error), as CUDA does not call it "in the event of an error in the
// CUDA context". Not modelled in a stream capture (a host node): fatal.
cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
    API("cudaLaunchHostFunc");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (!fn) return set_error(cudaErrorInvalidValue);
    if (streams[s].capture)
        fatal("cudaLaunchHostFunc during stream capture (a host node) is not modelled by the CPU layer");
    return set_error(submit(s, "cudaLaunchHostFunc", {}, [fn, user_data, s] {
        if (sticky_error != cudaSuccess) return;
        device_mode_leave();  // (run_op entered it: the function is host code)
        const Op* op = current;
        current = nullptr;
        host_fn_stream = s;
        fn(user_data);
        host_fn_stream = -1;
        current = op;
        device_mode_enter();
    }, false));
}

// ---- events ----

static Event* event_of(cudaEvent_t e) {
    uintptr_t v = (uintptr_t)e;
    if (v == 0 || v >= events.size() || !events[v].live) return nullptr;
    return &events[v];
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    API("cudaEventCreate");
    if (!e) return set_error(cudaErrorInvalidValue);
    events.push_back(Event());
    *e = reinterpret_cast<cudaEvent_t>((uintptr_t)(events.size() - 1));
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
    cudaError_t r = cudaEventCreate(e);
    last_api = "cudaEventCreateWithFlags";
    if (r == cudaSuccess) events.back().timing = !(flags & cudaEventDisableTiming);
    return r;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    API("cudaEventDestroy");
    Event* ev = event_of(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    ev->live = false;
    return cudaSuccess;
}

static double host_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
    API("cudaEventRecord");
    Event* ev = event_of(e);
    int s = stream_index(stream);
    if (!ev || s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t e = legacy_check(s, "cudaEventRecord")) return set_error(e);
    if (Capture* c = capture_of(s)) {  // captured: the event stands for the stream's frontier in the graph
        if (c->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
        ev->recorded = true;
        ev->capture = streams[s].capture;
        ev->nodes = streams[s].frontier;
        ev->ms = nullptr;
        return cudaSuccess;
    }
    auto ms = std::make_shared<double>(-1.0);
    Dep at = push_op(s, "cudaEventRecord", {}, [ms] { *ms = host_ms(); });
    ev->recorded = true;
    ev->stream = s;
    ev->seq = at.seq;
    ev->vc = streams[s].tail_vc;
    ev->ms = ms;
    ev->capture = 0;
    ev->nodes.clear();
    return cudaSuccess;
}

// In a capture (CUDA Programming Guide, "Cross-stream Dependencies and
// Events"): waiting for an event recorded in the capture adds its nodes to
// the stream's frontier, and a stream not capturing joins the capture (a
// fork). A capturing stream may not wait for an event from outside its
// capture (cudaErrorStreamCaptureIsolation; from another capture, ...Merge).
static cudaError_t capture_wait(int s, const Event& ev, unsigned flags) {
    Capture* mine = capture_of(s);
    if (mine && mine->invalidated) return cudaErrorStreamCaptureInvalidated;
    if (flags & cudaEventWaitExternal)
        fatal("cudaStreamWaitEvent with cudaEventWaitExternal during stream capture (an external event node) is not "
              "modelled by the CPU layer");
    if (!ev.capture || !captures[ev.capture].active) {
        if (ev.capture) {  // recorded in a capture that has ended: it stands for nodes of a graph, not work
            fprintf(stderr, "cuda_cpu: cudaStreamWaitEvent on stream %d: the event was last recorded in a stream "
                    "capture that has ended: record it again outside the capture\n", s);
            if (mine) capture_invalidate(streams[s].capture, "cudaStreamWaitEvent on a captured event of an ended capture");
            return cudaErrorCapturedEvent;
        }
        // Stricter than CUDA for a never-recorded event (which waits for nothing): refused here too.
        capture_invalidate(streams[s].capture, str("cudaStreamWaitEvent on capturing stream %d for an event %s outside "
                                                   "the capture (record it inside the capture)", s,
                                                   ev.recorded ? "recorded" : "never recorded, or recorded"));
        return cudaErrorStreamCaptureIsolation;
    }
    Capture& theirs = captures[ev.capture];
    if (mine && mine != &theirs) {
        capture_invalidate(streams[s].capture, "cudaStreamWaitEvent would merge two stream captures");
        capture_invalidate(ev.capture, "cudaStreamWaitEvent would merge two stream captures");
        return cudaErrorStreamCaptureMerge;
    }
    if (theirs.invalidated) return cudaErrorStreamCaptureInvalidated;
    if (!mine && s == 0) return cudaErrorStreamCaptureImplicit;  // the legacy stream cannot capture
    if (!mine) {  // the fork: s joins the capture, and depends on the event's nodes only
        streams[s].capture = ev.capture;
        streams[s].frontier.clear();
        theirs.members.push_back(s);
    }
    for (int n : ev.nodes) {
        bool have = false;
        for (int f : streams[s].frontier) have = have || f == n;
        if (!have) streams[s].frontier.push_back(n);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int flags) {
    API("cudaStreamWaitEvent");
    Event* ev = event_of(e);
    int s = stream_index(stream);
    if (!ev || s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = legacy_check(s, "cudaStreamWaitEvent")) return set_error(r);
    if (streams[s].capture || ev->capture) return set_error(capture_wait(s, *ev, flags));
    if (!ev->recorded) return cudaSuccess;  // waiting for a never-recorded event waits for nothing
    std::vector<uint64_t> vc = ev->vc;
    push_op(s, "cudaStreamWaitEvent", {}, nullptr, {Dep{ev->stream, ev->seq}}, &vc);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    API("cudaEventSynchronize");
    Event* ev = event_of(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = event_check(*ev, "cudaEventSynchronize")) return set_error(r);
    if (!ev->recorded) return cudaSuccess;
    run_until({Dep{ev->stream, ev->seq}});
    vc_join(host_vc, ev->vc);
    return sticky_error;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    API("cudaEventQuery");
    Event* ev = event_of(e);
    if (!ev) return set_error(cudaErrorInvalidResourceHandle);
    if (cudaError_t r = event_check(*ev, "cudaEventQuery")) return set_error(r);
    if (!ev->recorded || dep_done(Dep{ev->stream, ev->seq})) {
        if (ev->recorded) vc_join(host_vc, ev->vc);
        return cudaSuccess;
    }
    if (next_random() % 2) run_until({Dep{ev->stream, streams[ev->stream].done_seq + 1}});
    return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    API("cudaEventElapsedTime");
    Event* a = event_of(start);
    Event* b = event_of(end);
    if (!ms || !a || !b) return set_error(cudaErrorInvalidResourceHandle);
    if (!a->timing || !b->timing) return set_error(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return set_error(cudaErrorInvalidResourceHandle);
    if (a->capture || b->capture) return set_error(cudaErrorCapturedEvent);
    if (!dep_done(Dep{a->stream, a->seq}) || !dep_done(Dep{b->stream, b->seq})) return cudaErrorNotReady;
    *ms = (float)(*b->ms - *a->ms);
    return cudaSuccess;
}

// ---- graphs: stream capture, instantiation, launch ----
//
// STATUS: written against CUDA 13's cuda_runtime_api.h and the Programming
// Guide; not yet run on a GPU (what a GPU adds: README, "Graphs").

static cudaGraph_t graph_handle(int i) { return reinterpret_cast<cudaGraph_t>((uintptr_t)i); }
static Graph* graph_of(cudaGraph_t g) {
    uintptr_t v = (uintptr_t)g;
    return v && v < graphs.size() && graphs[v].live ? &graphs[v] : nullptr;
}
static GraphExec* exec_of(cudaGraphExec_t x) {
    uintptr_t v = (uintptr_t)x;
    return v && v < execs.size() && execs[v].live ? &execs[v] : nullptr;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    API("cudaStreamBeginCapture");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return set_error(cudaErrorInvalidValue);
    if (s == 0) {  // also cudaStreamPerThread, which this layer maps to the legacy stream
        fprintf(stderr, "cuda_cpu: cudaStreamBeginCapture on the legacy default stream: capture needs a stream of "
                "its own (cudaStreamCreateWithFlags)\n");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    if (streams[s].capture) return set_error(cudaErrorIllegalState);
    Capture c;
    c.mode = mode;
    c.origin = s;
    c.members = {s};
    captures.push_back(std::move(c));
    streams[s].capture = (int)captures.size() - 1;
    streams[s].frontier.clear();
    return cudaSuccess;
}

// Ends the capture begun on `stream`; every stream that joined it leaves it.
// Each must have been joined back into the origin: the nodes its frontier
// holds must be ancestors of (or in) the origin's frontier.
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    API("cudaStreamEndCapture");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (!graph) return set_error(cudaErrorInvalidValue);
    if (!streams[s].capture) return set_error(cudaErrorIllegalState);
    const int ci = streams[s].capture;
    Capture& c = captures[ci];
    if (c.origin != s) {
        capture_invalidate(ci, str("cudaStreamEndCapture on stream %d, which joined the capture but did not begin it", s));
        return set_error(cudaErrorStreamCaptureUnmatched);
    }
    *graph = nullptr;
    std::vector<char> joined(c.nodes.size(), 0);  // ancestors of the origin's frontier, and it
    std::vector<int> work = streams[s].frontier;
    while (!work.empty()) {
        int n = work.back();
        work.pop_back();
        if (joined[n]) continue;
        joined[n] = 1;
        for (int d : c.nodes[n].deps) work.push_back(d);
    }
    int unjoined = -1;
    for (int m : c.members) {
        for (int n : streams[m].frontier)
            if (!joined[n] && unjoined < 0) unjoined = m;
        streams[m].capture = 0;
        streams[m].frontier.clear();
    }
    c.active = false;
    if (c.invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
    if (unjoined >= 0) {
        fprintf(stderr, "cuda_cpu: cudaStreamEndCapture on stream %d: stream %d joined the capture and its last work "
                "was not joined back (record an event on it after its last work, and make stream %d wait for it)\n",
                s, unjoined, s);
        return set_error(cudaErrorStreamCaptureUnjoined);
    }
    graphs.push_back(Graph());
    graphs.back().nodes = std::move(c.nodes);
    *graph = graph_handle((int)graphs.size() - 1);
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    API("cudaStreamIsCapturing");
    int s = stream_index(stream);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (!status) return set_error(cudaErrorInvalidValue);
    if (cudaError_t e = legacy_check(s, "cudaStreamIsCapturing")) return set_error(e);
    const Capture* c = capture_of(s);
    *status = !c ? cudaStreamCaptureStatusNone
                 : c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

// The status and the capture's id; the graph and dependencies it can also return are not modelled.
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status, unsigned long long* id,
                                     cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                     size_t* ndeps) {
    if (graph || deps || edges || ndeps)
        fatal("cudaStreamGetCaptureInfo: only the status and the id are modelled by the CPU layer (the graph being "
              "captured and its dependencies are not)");
    cudaError_t e = cudaStreamIsCapturing(stream, status);
    last_api = "cudaStreamGetCaptureInfo";
    if (e == cudaSuccess && id) *id = (unsigned long long)streams[stream_index(stream)].capture;
    return e;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
    API("cudaThreadExchangeStreamCaptureMode");
    if (!mode || (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
                  *mode != cudaStreamCaptureModeRelaxed))
        return set_error(cudaErrorInvalidValue);
    std::swap(*mode, thread_capture_mode);
    return cudaSuccess;
}

// The executable graph: the nodes, copied (the graph may be destroyed), and
// one stream of its own per stream the capture used, so that its branches
// are as unordered as they were captured and the race checks see them.
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* out, cudaGraph_t graph, unsigned long long flags) {
    API("cudaGraphInstantiate");
    Graph* g = graph_of(graph);
    if (!out || !g) return set_error(cudaErrorInvalidValue);
    if (flags != 0) {
        fprintf(stderr, "cuda_cpu: cudaGraphInstantiate flags %llu: only 0 is modelled\n", flags);
        return set_error(cudaErrorInvalidValue);
    }
    GraphExec x;
    x.nodes = g->nodes;
    std::vector<int> lane_of_stream;  // captured stream -> lane
    for (GraphNode& n : x.nodes) {
        int lane = -1;
        for (size_t l = 0; l < lane_of_stream.size(); l++)
            if (lane_of_stream[l] == n.lane) lane = (int)l;
        if (lane < 0) {
            lane = (int)lane_of_stream.size();
            lane_of_stream.push_back(n.lane);
        }
        n.lane = lane;
    }
    execs.push_back(std::move(x));
    const int xi = (int)execs.size() - 1;
    for (size_t l = 0; l < lane_of_stream.size(); l++) {
        cudaStream_t st;
        RT_ALWAYS(stream_create(&st, cudaStreamNonBlocking, 0) == cudaSuccess);
        streams.back().exec = xi;
        execs[xi].lane_streams.push_back((int)streams.size() - 1);
    }
    *out = reinterpret_cast<cudaGraphExec_t>((uintptr_t)xi);
    return cudaSuccess;
}

// The graph runs after the work before it on `stream` and before the work
// after it: a start marker on the stream, the nodes on the graph's own
// streams (each after the nodes it was captured after, the roots after the
// marker), and an end marker on the stream after every node. Every node goes
// through the layer's checks as any operation does; an NCCL node runs before
// this returns, as the uncaptured call does, so ranks meet in program order.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    API("cudaGraphLaunch");
    GraphExec* x = exec_of(exec);
    int s = stream_index(stream);
    if (!x) return set_error(cudaErrorInvalidValue);
    if (s < 0) return set_error(cudaErrorInvalidResourceHandle);
    if (streams[s].capture)
        fatal("cudaGraphLaunch into a capturing stream (a child graph node) is not modelled by the CPU layer");
    if (cudaError_t e = legacy_check(s, "cudaGraphLaunch")) return set_error(e);
    x->launches++;
    // "Each launch is ordered behind both any previous work in stream and any
    // previous launches of graphExec" (cudaGraphLaunch's documentation).
    const Dep start = push_op(s, "cudaGraphLaunch", {}, nullptr, x->last_end, &x->last_end_vc);
    const std::vector<uint64_t> start_vc = streams[s].tail_vc;
    std::vector<Dep> at(x->nodes.size());
    std::vector<std::vector<uint64_t>> vc_after(x->nodes.size());
    std::vector<uint64_t> end_vc = start_vc;
    std::vector<Dep> end_deps;
    for (size_t i = 0; i < x->nodes.size(); i++) {
        const GraphNode& n = x->nodes[i];
        std::vector<Dep> deps;
        std::vector<uint64_t> vc;
        if (n.deps.empty()) {
            deps.push_back(start);
            vc = start_vc;
        }
        for (int d : n.deps) {
            deps.push_back(at[d]);
            vc_join(vc, vc_after[d]);
        }
        const int lane = x->lane_streams[n.lane];
        at[i] = push_op(lane, n.name, n.ranges, n.body, std::move(deps), &vc);
        vc_after[i] = streams[lane].tail_vc;
        vc_join(end_vc, vc_after[i]);
        end_deps.push_back(at[i]);
        if (n.run_now) run_until({at[i]});
    }
    x->last_end = {push_op(s, "cudaGraphLaunch (end)", {}, nullptr, std::move(end_deps), &end_vc)};
    x->last_end_vc = streams[s].tail_vc;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    API("cudaGraphExecDestroy");
    GraphExec* x = exec_of(exec);
    if (!x) return set_error(cudaErrorInvalidValue);
    x->live = false;  // its launches still complete: their operations are queued on its streams
    x->nodes.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    API("cudaGraphDestroy");
    Graph* g = graph_of(graph);
    if (!g) return set_error(cudaErrorInvalidValue);
    g->live = false;
    g->nodes.clear();
    return cudaSuccess;
}

// ---- device ----

cudaError_t cudaGetDeviceCount(int* n) {
    API("cudaGetDeviceCount");
    if (!n) return set_error(cudaErrorInvalidValue);
    *n = 1;  // one emulated GPU per process; several GPUs are several processes (NCCL over MPI)
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    API("cudaSetDevice");
    return d == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice);
}
cudaError_t cudaGetDevice(int* d) {
    API("cudaGetDevice");
    if (!d) return set_error(cudaErrorInvalidValue);
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
    API("cudaGetDeviceProperties");
    if (!p) return set_error(cudaErrorInvalidValue);
    if (d != 0) return set_error(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    // Not a GPU's name, so nothing computes an MFU against a datasheet for it.
    snprintf(p->name, sizeof p->name, "CPU execution layer (sm_90 limits)");
    p->totalGlobalMem = device_memory_bytes();
    p->sharedMemPerBlock = 48 * 1024;
    p->sharedMemPerBlockOptin = OPTIN_MAX_DYNAMIC_SHARED;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = MAX_THREADS_PER_BLOCK;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = MAX_BLOCK_Z;
    p->maxGridSize[0] = (int)MAX_GRID_X;
    p->maxGridSize[1] = MAX_GRID_YZ;
    p->maxGridSize[2] = MAX_GRID_YZ;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->maxThreadsPerMultiProcessor = 2048;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}

// The versions of the headers the layer is built against (no driver: the layer is its own).
cudaError_t cudaDriverGetVersion(int* v) {
    API("cudaDriverGetVersion");
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
    API("cudaRuntimeGetVersion");
    if (!v) return set_error(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int d) {
    API("cudaDeviceGetAttribute");
    if (!v) return set_error(cudaErrorInvalidValue);
    if (d != 0) return set_error(cudaErrorInvalidDevice);
    switch (attr) {
        case cudaDevAttrL2CacheSize: *v = 50 * 1024 * 1024; return cudaSuccess;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)OPTIN_MAX_DYNAMIC_SHARED; return cudaSuccess;
        case cudaDevAttrMultiProcessorCount: *v = 132; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; return cudaSuccess;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; return cudaSuccess;
        default: break;
    }
    // Memory clock and bus width have no meaning here: say so as an error, which the lab handles.
    return set_error(cudaErrorInvalidValue);
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attr, int value) {
    API("cudaFuncSetAttribute");
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0) return set_error(cudaErrorInvalidValue);
    return set_error((cudaError_t)set_max_dynamic_shared(kernel, "kernel", (size_t)value));
}

// ---- errors ----

cudaError_t cudaGetLastError(void) {
    cudaError_t e = sticky_error != cudaSuccess ? sticky_error : last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return sticky_error != cudaSuccess ? sticky_error : last_error; }

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorLaunchFailure: return "unspecified launch failure";
        case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
        case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
        case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
        case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
        case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
        case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
        case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
        case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
        case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
        case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
        case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
        default: return "unknown error (the CPU execution layer has no text for it)";
    }
}
const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        case cudaErrorIllegalState: return "cudaErrorIllegalState";
        case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
        case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
        case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
        case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
        case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
        case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
        case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
        case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
        default: return "cudaError";
    }
}
