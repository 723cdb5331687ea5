// counters.cpp — what a profiler counts, counted by the CPU execution layer
// (CUDA_CPU_COUNT=1; see dev/cuda/cpu/README.md, "Counters").
//
// Built into the layer (cpu.mk's CPU_LAYER, and test_cuda_cpu); called by
// runtime.cpp's access hooks (count_access), by cuda_cpu.cpp's scheduler
// (count_block_start, count_flush at every barrier and block end,
// count_barrier, count_mma, count_wmma_memory) and at a launch
// (count_launch). Declared in cuda_cpu.h, section 6.
//
// The threads of a block run as fibers one at a time between barriers, so a
// warp's memory instruction is never seen at once: each lane's access is
// recorded with the hook's return address (the instruction) and that lane's
// occurrence count at that address, and at the next barrier (or the block's
// end) the records are grouped by (warp, address, occurrence): one group is
// one warp-level request, whatever order the lanes ran in and however
// divergent lanes skipped iterations of other instructions.
//
// Per group:
//   global  1 request; sectors = distinct 32-byte segments its lanes touch
//   shared  1 request; wavefronts: 4-byte (and narrower) accesses as one phase
//           of 32 lanes, 8-byte as two phases of 16 lanes, 16-byte as four
//           of 8; per phase, the most distinct 4-byte words any one of the 32
//           banks (word address mod 32) is asked for (lanes asking the same
//           word share it: a broadcast); the phases' wavefronts add up
//   atomic  1 request per group, whatever it touches
// and per launch the distinct 32-byte global sectors all its requests touch
// (the traffic DRAM must serve at least once, with every re-read a cache hit).
//
// Round trips (the latency a warp waits for, in program order): a thread's
// global loads form batches that can be in flight together; a batch ends at
// a global store or atomic (nothing says the next load does not alias it, so
// the compiler cannot hoist the load above it, and the store waits for the
// loads it is computed from), at a barrier, and when an instruction would
// run a fifth time in it (nvcc unrolls a loop of unknown trip count by 4).
// A warp's k-th batch is a DRAM round trip when any lane's loads in it touch
// a sector this launch had not touched yet, a cache round trip otherwise.
// This is the compiler's freedom as the source gives it, not the schedule
// ptxas chose; a load whose address comes from an earlier load (a gather)
// is not seen as dependent.
#include "cuda_cpu.h"

#include <algorithm>      // sort
#include <cstdio>         // fprintf, fopen
#include <cstdlib>        // getenv, atexit
#include <map>            // per kernel, in name order
#include <string>
#include <unordered_map>  // per-lane occurrence counts
#include <unordered_set>  // the distinct sectors of a launch
#include <vector>

namespace cuda_cpu {

bool count_on_value() {
    const char* s = getenv("CUDA_CPU_COUNT");
    return s && s[0] && s[0] != '0';
}
bool count_on = count_on_value();

namespace {

struct record {
    uint64_t ret;    // the hook's return address: the instruction
    uint32_t occ;    // this lane's how-many-th execution of it
    uint16_t warp;
    uint8_t lane;
    uint8_t kind;    // space and direction, below
    uintptr_t addr;
    uint32_t bytes;
};
enum { K_GLOBAL_LOAD, K_GLOBAL_STORE, K_SHARED_LOAD, K_SHARED_STORE, K_ATOMIC };

std::map<std::string, kernel_counts> table;
kernel_counts* now = nullptr;                  // the running launch's kernel
std::vector<record> records;                   // since the last flush
std::unordered_map<uint64_t, uint32_t> occurrences;  // (thread << 48 | ret) -> executions so far, this block
std::unordered_set<uintptr_t> launch_sectors;       // distinct 32-byte sectors of global memory this launch touches

constexpr unsigned UNROLL = 4;  // loads of one instruction a batch holds at most (nvcc's default unrolling)

// A warp's round trips in one barrier interval, from its lanes' records in
// each lane's program order (the push order of that lane's records). Every
// global sector touched goes into launch_sectors here.
struct lane_state {
    bool open;
    unsigned n_in_batch;
    std::pair<uint64_t, unsigned> in_batch[16];  // instruction -> its loads in the open batch (the first 16)
    std::vector<uint8_t> dram;                   // per batch: touched a sector new to the launch
};
std::vector<lane_state> lanes;  // per thread of the block, reused

void count_round_trips(kernel_counts& k) {
    unsigned nthreads = 0;
    for (const record& r : records) nthreads = std::max(nthreads, 32u * r.warp + r.lane + 1);
    if (lanes.size() < nthreads) lanes.resize(nthreads);
    for (unsigned t = 0; t < nthreads; t++) {
        lanes[t].open = false;
        lanes[t].n_in_batch = 0;
        lanes[t].dram.clear();
    }
    for (const record& r : records) {
        if (r.kind == K_SHARED_LOAD || r.kind == K_SHARED_STORE) continue;
        lane_state& l = lanes[32u * r.warp + r.lane];
        bool fresh = false;
        for (uintptr_t sec = r.addr / 32; sec <= (r.addr + r.bytes - 1) / 32; sec++) fresh |= launch_sectors.insert(sec).second;
        if (r.kind != K_GLOBAL_LOAD) {  // a store or an atomic ends the batch
            l.open = false;
            continue;
        }
        unsigned i = 0;
        while (i < l.n_in_batch && l.in_batch[i].first != r.ret) i++;
        if (!l.open || (i < l.n_in_batch && l.in_batch[i].second >= UNROLL)) {
            l.open = true;
            l.n_in_batch = 0;
            l.dram.push_back(0);
            i = 0;
        }
        if (i == l.n_in_batch && i < 16) l.in_batch[l.n_in_batch++] = {r.ret, 0};
        if (i < l.n_in_batch) l.in_batch[i].second++;
        if (fresh) l.dram.back() = 1;
    }
    for (unsigned w = 0; 32 * w < nthreads; w++) {
        size_t n = 0;
        for (unsigned t = 32 * w; t < std::min(nthreads, 32 * w + 32); t++) n = std::max(n, lanes[t].dram.size());
        for (size_t b = 0; b < n; b++) {
            bool d = false;
            for (unsigned t = 32 * w; t < std::min(nthreads, 32 * w + 32); t++) d |= b < lanes[t].dram.size() && lanes[t].dram[b];
            if (d) k.dram_round_trips++;
            else k.cache_round_trips++;
        }
    }
}

// Wavefronts of one phase: the most distinct words any bank is asked for;
// *ideal the least any layout of them would need (32 words a wavefront).
uint64_t phase_wavefronts(std::vector<uintptr_t>& w, unsigned long long* ideal) {  // sorts w
    if (w.empty()) return 0;
    std::sort(w.begin(), w.end());
    w.erase(std::unique(w.begin(), w.end()), w.end());
    *ideal += (w.size() + 31) / 32;
    unsigned per_bank[32] = {0};
    unsigned most = 0;
    for (uintptr_t x : w) most = std::max(most, ++per_bank[x % 32]);
    return most;
}

// One warp-level request: the records [b, e) of one (warp, ret, occ).
void count_group(kernel_counts& k, const record* b, const record* e) {
    const int kind = b->kind;
    if (kind == K_ATOMIC) { k.atomic_requests++; return; }
    if (kind == K_GLOBAL_LOAD || kind == K_GLOBAL_STORE) {
        static std::vector<uintptr_t> sectors;  // reused: this runs for every request
        sectors.clear();
        for (const record* r = b; r != e; r++)
            for (uintptr_t s = r->addr / 32; s <= (r->addr + r->bytes - 1) / 32; s++) sectors.push_back(s);
        std::sort(sectors.begin(), sectors.end());
        const uint64_t n = (uint64_t)(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
        if (kind == K_GLOBAL_LOAD) { k.global_load_requests++; k.global_load_sectors += n; }
        else { k.global_store_requests++; k.global_store_sectors += n; }
        return;
    }
    // shared: lanes per phase by the access width (the widest lane decides)
    uint32_t width = 0;
    for (const record* r = b; r != e; r++) width = std::max(width, r->bytes);
    const int lanes_per_phase = width >= 16 ? 8 : width >= 8 ? 16 : 32;
    uint64_t wavefronts = 0;
    for (int p = 0; p < 32 / lanes_per_phase; p++) {
        static std::vector<uintptr_t> words;
        words.clear();
        for (const record* r = b; r != e; r++)
            if (r->lane / lanes_per_phase == p)
                for (uintptr_t w = r->addr / 4; w <= (r->addr + r->bytes - 1) / 4; w++) words.push_back(w);
        wavefronts += phase_wavefronts(words, &k.shared_ideal_wavefronts);
    }
    if (kind == K_SHARED_LOAD) { k.shared_load_requests++; k.shared_load_wavefronts += wavefronts; }
    else { k.shared_store_requests++; k.shared_store_wavefronts += wavefronts; }
}

void write_table() {
    const char* path = getenv("CUDA_CPU_COUNT_FILE");
    FILE* f = path && *path ? fopen(path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "cuda_cpu: CUDA_CPU_COUNT_FILE=%s cannot be opened for writing: the counts go to stderr\n", path);
        f = stderr;
    }
    count_launch_end();
    fprintf(f, "%s\n", count_header());
    for (const auto& kv : table) fprintf(f, "%s\n", count_row(kv.first.c_str(), kv.second).c_str());
    if (f != stderr) fclose(f);
}

}  // namespace

const char* count_header() {
    return "kernel\tlaunches\tblocks\tthreads_per_block\tdynamic_smem\tglobal_load_requests\tglobal_load_sectors"
           "\tglobal_store_requests\tglobal_store_sectors\tshared_load_requests\tshared_load_wavefronts"
           "\tshared_store_requests\tshared_store_wavefronts\tatomic_requests\tbarriers\tmma_instructions\ttensor_flops\tdistinct_sectors"
           "\tdram_round_trips\tcache_round_trips\tsfu_ops\tshared_ideal_wavefronts";
}
std::string count_row(const char* name, const kernel_counts& k) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu",
             name, (unsigned long long)k.launches, (unsigned long long)k.blocks, (unsigned long long)k.threads_per_block,
             (unsigned long long)k.dynamic_smem, (unsigned long long)k.global_load_requests,
             (unsigned long long)k.global_load_sectors, (unsigned long long)k.global_store_requests,
             (unsigned long long)k.global_store_sectors, (unsigned long long)k.shared_load_requests,
             (unsigned long long)k.shared_load_wavefronts, (unsigned long long)k.shared_store_requests,
             (unsigned long long)k.shared_store_wavefronts, (unsigned long long)k.atomic_requests,
             (unsigned long long)k.barriers, (unsigned long long)k.mma_instructions, (unsigned long long)k.tensor_flops,
             (unsigned long long)k.distinct_sectors, (unsigned long long)k.dram_round_trips,
             (unsigned long long)k.cache_round_trips, (unsigned long long)k.sfu_ops,
             (unsigned long long)k.shared_ideal_wavefronts);
    return buf;
}

void count_launch(const char* name, unsigned long long blocks, unsigned long long threads, size_t dynamic_smem) {
    static bool registered = false;
    if (!registered) { atexit(write_table); registered = true; }
    count_launch_end();
    kernel_counts& k = table[name];
    k.launches++;
    k.blocks += blocks;
    k.threads_per_block = threads;
    k.dynamic_smem = dynamic_smem;
    now = &k;
}

void count_launch_end() {
    if (now) now->distinct_sectors += launch_sectors.size();
    launch_sectors.clear();
    now = nullptr;
}

void count_block_start() {
    records.clear();
    occurrences.clear();
}

void count_access(uintptr_t a, size_t n, bool write, bool shared, void* ret) {
    if (!now || !exec.in_kernel || exec.call) return;  // a WMMA call's element moves: count_wmma_memory counts it
    if (exec.in_atomic && !write) return;             // an atomic's read-modify-write: counted once, at its write
    uint32_t& occ = occurrences[(uint64_t)exec.thread << 48 | (uint64_t)(uintptr_t)ret];
    const uint8_t kind = exec.in_atomic ? K_ATOMIC : shared ? (write ? K_SHARED_STORE : K_SHARED_LOAD)
                                                             : (write ? K_GLOBAL_STORE : K_GLOBAL_LOAD);
    records.push_back(record{(uint64_t)(uintptr_t)ret, occ++, (uint16_t)(exec.thread / 32), (uint8_t)(exec.thread % 32),
                             kind, a, (uint32_t)n});
}

void count_flush() {
    if (!now || records.empty()) return;
    count_round_trips(*now);  // before the grouping: it needs each lane's program order
    // group by (warp, instruction, occurrence) with a counting sort: per (warp,
    // instruction) the occurrences in this interval are a dense range
    static std::vector<uint64_t> rets;  // the interval's instructions: few, found by a linear search
    static std::vector<uint32_t> ids, lo, hi, base, fill;
    static std::vector<record> sorted;
    rets.clear();
    ids.resize(records.size());
    unsigned warps = 0;
    uint64_t last = 0;
    uint32_t last_id = 0;
    for (size_t i = 0; i < records.size(); i++) {
        const record& r = records[i];
        if (i == 0 || r.ret != last) {
            last_id = (uint32_t)(std::find(rets.begin(), rets.end(), r.ret) - rets.begin());
            if (last_id == rets.size()) rets.push_back(r.ret);
            last = r.ret;
        }
        ids[i] = last_id;
        warps = std::max(warps, (unsigned)r.warp + 1);
    }
    const size_t nwr = (size_t)warps * rets.size();  // (warp, instruction) pairs
    lo.assign(nwr, UINT32_MAX);
    hi.assign(nwr, 0);
    for (size_t i = 0; i < records.size(); i++) {
        const size_t wr = (size_t)records[i].warp * rets.size() + ids[i];
        lo[wr] = std::min(lo[wr], records[i].occ);
        hi[wr] = std::max(hi[wr], records[i].occ + 1);
    }
    base.assign(nwr + 1, 0);
    for (size_t wr = 0; wr < nwr; wr++) base[wr + 1] = base[wr] + (lo[wr] == UINT32_MAX ? 0 : hi[wr] - lo[wr]);
    fill.assign(base[nwr] + 1, 0);  // per group: records, then (prefix sums) where it starts
    for (size_t i = 0; i < records.size(); i++) {
        const size_t wr = (size_t)records[i].warp * rets.size() + ids[i];
        fill[base[wr] + records[i].occ - lo[wr] + 1]++;
    }
    for (size_t g = 1; g < fill.size(); g++) fill[g] += fill[g - 1];
    sorted.resize(records.size());
    for (size_t i = 0; i < records.size(); i++) {
        const size_t wr = (size_t)records[i].warp * rets.size() + ids[i];
        sorted[fill[base[wr] + records[i].occ - lo[wr]]++] = records[i];
    }
    // fill[g] is now where group g + 1 starts: group g is [g ? fill[g - 1] : 0, fill[g])
    for (size_t g = 0, start = 0; g + 1 < fill.size(); start = fill[g], g++)
        if (fill[g] > start) count_group(*now, &sorted[start], sorted.data() + fill[g]);
    records.clear();
}

void count_sfu() {
    if (count_on && now && exec.in_kernel && !exec.call) now->sfu_ops++;
}

void count_barrier() {
    if (now) now->barriers++;
}

void count_mma() {
    if (!now) return;
    now->mma_instructions++;
    now->tensor_flops += 2ull * 16 * 16 * 16;  // m16n16k16: a multiply and an add per (m, n, k)
}

void count_mma_16816() {
    if (!now) return;
    now->mma_instructions++;
    now->tensor_flops += 2ull * 16 * 8 * 16;
}

// An ldmatrix: one request of the `count` x 8 rows of 16 bytes (lanes 8i..8i+7
// name matrix i's), as the hardware reads them, a phase of 8 rows at a time.
void count_rows_memory(const uintptr_t* rows, int count) {
    if (!now) return;
    std::vector<record> req;
    for (int i = 0; i < 8 * count; i++) req.push_back(record{0, 0, 0, (uint8_t)i, K_SHARED_LOAD, rows[i], 16});
    count_group(*now, req.data(), req.data() + req.size());
}

// A WMMA load or store of the whole warp, counted as the 16-byte requests
// that move its 16 lines of 16 elements (ldm apart): 32 lanes x 16 bytes per
// request, lane i taking the next 16-byte piece in line order, as ldmatrix's
// eight row addresses per phase do.
void count_wmma_memory(bool store, bool shared, const void* p, unsigned ldm, size_t element_bytes) {
    if (!now) return;
    const size_t line = 16 * element_bytes, pieces_per_line = line / 16;
    std::vector<record> req;
    for (size_t j = 0; j < 16; j++)
        for (size_t c = 0; c < pieces_per_line; c++) {
            const uint8_t kind = shared ? (store ? K_SHARED_STORE : K_SHARED_LOAD) : (store ? K_GLOBAL_STORE : K_GLOBAL_LOAD);
            req.push_back(record{0, 0, 0, (uint8_t)(req.size() % 32), kind, (uintptr_t)p + j * ldm * element_bytes + c * 16, 16});
            if (!shared) launch_sectors.insert(req.back().addr / 32);  // 16 bytes, 16-aligned: one sector
            if (req.size() == 32) { count_group(*now, req.data(), req.data() + 32); req.clear(); }
        }
    if (!req.empty()) count_group(*now, req.data(), req.data() + req.size());
}

namespace {
std::map<std::string, kernel_counts> marked;  // the table at count_mark()
}
void count_mark() {
    count_launch_end();
    marked = table;
}
// One line per kernel launched since count_mark(): its requests, sectors and
// wavefronts per request, round trips per warp (dev/cuda/common.h prints them
// beside a lab variant's time).
std::string count_summary_since_mark() {
    count_launch_end();
    std::string out;
    for (const auto& kv : table) {
        const kernel_counts& a = kv.second;
        const kernel_counts b = marked.count(kv.first) ? marked[kv.first] : kernel_counts{};
        if (a.launches == b.launches) continue;
        const unsigned long long g = a.global_load_requests + a.global_store_requests - b.global_load_requests - b.global_store_requests;
        const unsigned long long gs = a.global_load_sectors + a.global_store_sectors - b.global_load_sectors - b.global_store_sectors;
        const unsigned long long sh = a.shared_load_requests + a.shared_store_requests - b.shared_load_requests - b.shared_store_requests;
        const unsigned long long sw = a.shared_load_wavefronts + a.shared_store_wavefronts - b.shared_load_wavefronts - b.shared_store_wavefronts;
        const unsigned long long si = a.shared_ideal_wavefronts - b.shared_ideal_wavefronts;
        const unsigned long long warps = (a.blocks - b.blocks) * ((a.threads_per_block + 31) / 32);
        char buf[700];
        snprintf(buf, sizeof buf,
                 "%s%s x%llu: global %llu requests, %.2f sectors each, %.2f MB distinct; shared %llu requests, %.2f "
                 "wavefronts each (%.2f x the conflict-free); per warp %.1f DRAM + %.1f cache round trips; %llu atomics; %.3g tensor FLOPs; "
                 "%llu SFU operations",
                 out.empty() ? "" : "\n", kv.first.c_str(), a.launches - b.launches, g, g ? (double)gs / g : 0.0,
                 (a.distinct_sectors - b.distinct_sectors) * 32 / 1e6, sh, sh ? (double)sw / sh : 0.0,
                 si ? (double)sw / si : 0.0,
                 warps ? (double)(a.dram_round_trips - b.dram_round_trips) / warps : 0.0,
                 warps ? (double)(a.cache_round_trips - b.cache_round_trips) / warps : 0.0,
                 a.atomic_requests - b.atomic_requests, (double)(a.tensor_flops - b.tensor_flops), a.sfu_ops - b.sfu_ops);
        out += buf;
    }
    return out.empty() ? "no kernel launched (a library's work, cuBLASLt's, is not counted)" : out;
}

kernel_counts count_get(const char* name) {
    count_launch_end();
    auto it = table.find(name);
    return it == table.end() ? kernel_counts{} : it->second;
}
void count_reset() {
    count_launch_end();
    table.clear();
    now = nullptr;
}

}  // namespace cuda_cpu
