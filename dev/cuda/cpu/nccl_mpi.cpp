// nccl_mpi.cpp — NCCL for the CPU execution layer (issue 11): each emulated
// GPU is one MPI rank, and the NCCL calls the project makes are implemented
// here against NCCL's own header (nccl.h), with MPI underneath. See NCCL.md.
//
// Build (host C++; libnccl is not linked):
//   g++ -std=c++17 -DOMPI_SKIP_MPICXX -I/usr/local/cuda/include $(mpicc --showme:compile) -c nccl_mpi.cpp
//   ... link with $(mpicc --showme:link) and the layer's runtime (device.h)
// Run N emulated GPUs:  mpirun -np N ./program     (one process needs no mpirun)
//
// Every collective is a device operation: it is enqueued on its stream with
// cuda_cpu::enqueue, declaring exactly the bytes it reads and writes, and runs
// before the call returns (run_now), after what precedes it on its stream. So
// the ranks meet in program order and the MPI calls are plain blocking ones.
// Before each collective the ranks compare what they called (operation,
// count, datatype, op, root, sequence number); a mismatch ends every rank
// through cuda_cpu::fatal with a message naming what each rank called.
//
// Left out on purpose: NCCL's algorithms (rings, trees, channels) and their
// reduction order (here: rank 0, 1, 2, ... in the accumulation type, the same
// result on every rank), bf16/fp16 rounding (summed in fp32, rounded once per
// element), timing, NCCL_* environment variables, fp8 types, user-defined
// reduction ops, non-blocking communicators. ncclCommSplit (NCCL >= 2.18) is
// MPI_Comm_split of the parent's ranks, with a NULL config only.
//
// Reading order (banners):
//   1. errors: the last-error text and the checking macro
//   2. datatypes and reductions
//   3. MPI: start, exit, element types
//   4. communicators: ids, init, destroy, abort
//   5. operations and their argument checks
//   6. the handshake: collectives must match across ranks
//   7. running one operation (collectives, point-to-point)
//   8. groups
//   9. the NCCL API

#include <mpi.h>   // defines: MPI_* (Open MPI or MPICH)
#include <nccl.h>  // defines: ncclResult_t, ncclComm_t, ncclDataType_t, ...; brings cuda_bf16.h, cuda_fp16.h

#include <unistd.h>  // getpid

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "device.h"  // defines: cuda_cpu::enqueue, Range, device_range_problem, fatal

// ============================================================================
// 1. errors: the last-error text and the checking macro
// ============================================================================

static std::string g_last_error;  // ncclGetLastError's text (not cleared by reading, as in NCCL)

// Record why a call failed and return the code, for `return fail(...)`.
static ncclResult_t fail(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t code, const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_last_error = buf;
    return code;
}

// Every MPI call goes through this. Our communicators return errors
// (MPI_ERRORS_RETURN), so a failure is reported here with the call and line.
#define MPI_CHECK(call)                                                                                \
    do {                                                                                               \
        int mc_ = (call);                                                                              \
        if (mc_ != MPI_SUCCESS) {                                                                      \
            char ms_[MPI_MAX_ERROR_STRING];                                                            \
            int ml_ = 0;                                                                               \
            MPI_Error_string(mc_, ms_, &ml_);                                                          \
            cuda_cpu::fatal("nccl_mpi.cpp:%d: %s failed: %s (under the CPU layer NCCL runs over MPI; " \
                            "another rank may have died)",                                             \
                            __LINE__, #call, ms_);                                                     \
        }                                                                                              \
    } while (0)

// ============================================================================
// 2. datatypes and reductions
// ============================================================================

// Element size in bytes, 0 for a type this emulation does not model.
static size_t dtype_size(ncclDataType_t t) {
    switch (t) {
        case ncclInt8: case ncclUint8: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;  // fp8 and anything out of range
    }
}

static const char* dtype_name(int t) {
    switch (t) {
        case ncclInt8: return "int8";
        case ncclUint8: return "uint8";
        case ncclInt32: return "int32";
        case ncclUint32: return "uint32";
        case ncclInt64: return "int64";
        case ncclUint64: return "uint64";
        case ncclFloat16: return "half";
        case ncclFloat32: return "float";
        case ncclFloat64: return "double";
        case ncclBfloat16: return "bf16";
        case ncclFloat8e4m3: return "fp8e4m3";
        case ncclFloat8e5m2: return "fp8e5m2";
        default: return "?";
    }
}

static const char* redop_name(int op) {
    switch (op) {
        case ncclSum: return "sum";
        case ncclProd: return "prod";
        case ncclMax: return "max";
        case ncclMin: return "min";
        case ncclAvg: return "avg";
        default: return "?";
    }
}

// Loading to and storing from the accumulation type: bf16 and half
// accumulate in fp32 and round once per element (our choice; NCCL's own
// order and rounding for 16-bit types are not modelled); the rest in their
// own type.
template <typename T> static inline T acc_load(T x) { return x; }
static inline float acc_load(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float acc_load(__half x) { return __half2float(x); }
template <typename T, typename A> static inline T acc_store(A a) { return (T)a; }
template <> inline __nv_bfloat16 acc_store<__nv_bfloat16, float>(float a) { return __float2bfloat16(a); }
template <> inline __half acc_store<__half, float>(float a) { return __float2half(a); }

template <typename A> static inline A combine(A a, A b, ncclRedOp_t op) {
    switch (op) {
        case ncclProd: return a * b;
        case ncclMax: return b > a ? b : a;
        case ncclMin: return b < a ? b : a;
        default: return a + b;  // sum, avg (divided at the end)
    }
}

// out[i] = blocks[0][i] op blocks[1][i] op ... in rank order; `blocks` holds
// nblocks runs of `count` elements. The same on every rank: a deterministic
// stand-in for NCCL's reduction.
template <typename T, typename A>
static void reduce_typed(void* out, const void* blocks, size_t count, int nblocks, ncclRedOp_t op) {
    const T* in = (const T*)blocks;
    T* o = (T*)out;
    for (size_t i = 0; i < count; i++) {
        A acc = (A)acc_load(in[i]);
        for (int r = 1; r < nblocks; r++) acc = combine<A>(acc, (A)acc_load(in[(size_t)r * count + i]), op);
        if (op == ncclAvg) acc = acc / (A)nblocks;
        o[i] = acc_store<T, A>(acc);
    }
}

static void reduce_blocks(void* out, const void* blocks, size_t count, int nblocks, ncclDataType_t t,
                          ncclRedOp_t op) {
    switch (t) {
        case ncclInt8: reduce_typed<int8_t, int8_t>(out, blocks, count, nblocks, op); break;
        case ncclUint8: reduce_typed<uint8_t, uint8_t>(out, blocks, count, nblocks, op); break;
        case ncclInt32: reduce_typed<int32_t, int32_t>(out, blocks, count, nblocks, op); break;
        case ncclUint32: reduce_typed<uint32_t, uint32_t>(out, blocks, count, nblocks, op); break;
        case ncclInt64: reduce_typed<int64_t, int64_t>(out, blocks, count, nblocks, op); break;
        case ncclUint64: reduce_typed<uint64_t, uint64_t>(out, blocks, count, nblocks, op); break;
        case ncclFloat16: reduce_typed<__half, float>(out, blocks, count, nblocks, op); break;
        case ncclFloat32: reduce_typed<float, float>(out, blocks, count, nblocks, op); break;
        case ncclFloat64: reduce_typed<double, double>(out, blocks, count, nblocks, op); break;
        case ncclBfloat16: reduce_typed<__nv_bfloat16, float>(out, blocks, count, nblocks, op); break;
        default: cuda_cpu::fatal("nccl_mpi: reduce_blocks reached with datatype %d (cannot happen: checked at the call)", (int)t);
    }
}

// ============================================================================
// 3. MPI: start, exit, element types
// ============================================================================

static bool g_mpi_ours = false;          // this file called MPI_Init_thread (so it finalises at exit)
static std::atomic<int> g_live_comms{0};  // communicators made and not yet destroyed or aborted
static bool g_fatal_pending = false;     // a handshake mismatch is ending this rank (exit status 86)

// At exit: finalise MPI if we started it, but only when no communicator is
// left. A process leaving with a communicator up is failing; MPI_Finalize
// could then wait for ranks blocked in a collective with it, so we leave
// without it and mpirun ends the job ("exited without calling finalize").
static void mpi_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (g_mpi_ours && !fin && g_live_comms.load() == 0) MPI_Finalize();
}

// Whether a launcher (mpirun, srun with PMI/PMIx) started this process.
static bool launched_by_mpi(void) {
    static const char* const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (const char* v : vars)
        if (getenv(v)) return true;
    return false;
}

// MPI is up when this returns: started here if the application has not.
static void mpi_ensure(void) {
    int up = 0;
    MPI_CHECK(MPI_Initialized(&up));
    if (up) return;
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    g_mpi_ours = true;
    if (atexit(mpi_at_exit) != 0) cuda_cpu::fatal("nccl_mpi: cannot register the MPI exit handler");
}

// A contiguous MPI type of one element of `bytes` bytes, so counts are in
// elements (up to INT_MAX of them per rank and call).
static MPI_Datatype mpi_elem_type(size_t bytes) {
    static MPI_Datatype types[9] = {};
    if (!types[bytes]) {
        MPI_CHECK(MPI_Type_contiguous((int)bytes, MPI_BYTE, &types[bytes]));
        MPI_CHECK(MPI_Type_commit(&types[bytes]));
    }
    return types[bytes];
}

static int mpi_count(size_t n, const char* what) {
    if (n > (size_t)INT_MAX)
        cuda_cpu::fatal("nccl_mpi: %s of %zu elements per rank: over INT_MAX, which this emulation does not model",
                        what, n);
    return (int)n;
}

// ============================================================================
// 4. communicators: ids, init, destroy, abort
// ============================================================================

struct ncclComm {
    int rank, nranks;
    MPI_Comm mpi;           // MPI_COMM_NULL with one rank: then no MPI at all
    unsigned long long seq;  // collectives issued on it so far (the handshake's #)
    ncclResult_t async;      // ncclCommGetAsyncError's answer
    ncclUniqueId id;
};

static const char kIdMagic[] = "gpt.c cpu-nccl id";

// 31 bits of FNV-1a over the id: the colour for MPI_Comm_split.
static int id_colour(const ncclUniqueId& id) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof(id.internal); i++) h = (h ^ (uint8_t)id.internal[i]) * 16777619u;
    return (int)(h & 0x7fffffffu);
}

// Split MPI_COMM_WORLD by the id (every process of the job must take part,
// once per communicator) and check that the members are exactly ranks
// 0..nranks-1 holding the same id.
static ncclResult_t comm_build_mpi(ncclComm* c, int nranks, const ncclUniqueId& id, int rank) {
    if (!launched_by_mpi()) {
        int up = 0;
        MPI_CHECK(MPI_Initialized(&up));
        if (!up)
            return fail(ncclInvalidUsage,
                        "ncclCommInitRank: nranks %d, but this process was not started by mpirun: under the CPU layer "
                        "each emulated GPU is one MPI rank; run mpirun -np %d ./program (one GPU needs no mpirun)",
                        nranks, nranks);
    }
    mpi_ensure();
    int world = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    if (world < nranks)
        return fail(ncclInvalidUsage,
                    "ncclCommInitRank: nranks %d, but the MPI job has %d process(es): start it with mpirun -np %d",
                    nranks, world, nranks);
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, id_colour(id), rank, &c->mpi));
    MPI_CHECK(MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN));
    int size = 0;
    MPI_CHECK(MPI_Comm_size(c->mpi, &size));
    struct Member { int rank; ncclUniqueId id; } me{rank, id};
    std::vector<Member> all(size);
    MPI_CHECK(MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all.data(), (int)sizeof(me), MPI_BYTE, c->mpi));
    bool ok = size == nranks;
    for (int i = 0; ok && i < size; i++)
        ok = all[i].rank == i && memcmp(&all[i].id, &id, sizeof(id)) == 0;
    if (!ok) {
        MPI_CHECK(MPI_Comm_free(&c->mpi));
        return fail(ncclInvalidUsage,
                    "ncclCommInitRank: %d process(es) called with this id but nranks is %d, or two of them gave the "
                    "same rank: every rank 0..nranks-1 must call ncclCommInitRank once with the same id",
                    size, nranks);
    }
    return ncclSuccess;
}

// ============================================================================
// 5. operations and their argument checks
// ============================================================================

// (kSplit: no operation, only ncclCommSplit's turn in the handshake, so that a
// split met by another call on some rank fails loudly instead of hanging)
enum OpKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kReduce, kSend, kRecv, kSplit };

static const char* kind_name(int k) {
    static const char* const names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast",
                                        "ncclReduce",    "ncclSend",          "ncclRecv",      "ncclCommSplit"};
    return k >= 0 && k <= kSplit ? names[k] : "?";
}

// One NCCL call, as queued in a group or run at once.
struct Op {
    OpKind kind;
    const void* send;
    void* recv;
    size_t count;  // per rank: the receive count of ReduceScatter, the send count of AllGather
    ncclDataType_t dt;
    ncclRedOp_t red;
    int root;  // Broadcast/Reduce: the root; Send/Recv: the peer
    ncclComm* comm;
    cudaStream_t stream;
};

static bool is_p2p(const Op& op) { return op.kind == kSend || op.kind == kRecv; }
static bool reduces(const Op& op) { return op.kind == kAllReduce || op.kind == kReduceScatter || op.kind == kReduce; }

// Bytes of the send and receive buffers this rank's call touches.
static size_t send_elems(const Op& op) {
    if (op.kind == kRecv) return 0;
    if (op.kind == kBroadcast && op.comm->rank != op.root) return 0;  // used on the root only
    return op.kind == kReduceScatter ? op.count * op.comm->nranks : op.count;
}
static size_t recv_elems(const Op& op) {
    if (op.kind == kSend) return 0;
    if (op.kind == kReduce && op.comm->rank != op.root) return 0;
    return op.kind == kAllGather ? op.count * op.comm->nranks : op.count;
}

// Overlapping buffers are allowed only in NCCL's in-place forms (NCCL's
// "In-place Operations": sendbuff == recvbuff, and for ReduceScatter and
// AllGather the per-rank piece at rank * count of the whole buffer).
// NCCL does not check this; anything else would be garbage on a GPU, so it
// is refused here.
static const char* overlap_problem(const Op& op) {
    size_t sz = dtype_size(op.dt), sb = send_elems(op) * sz, rb = recv_elems(op) * sz;
    const char* s = (const char*)op.send;
    const char* r = (const char*)op.recv;
    if (!sb || !rb || s + sb <= r || r + rb <= s) return nullptr;
    size_t piece = op.count * sz * (size_t)op.comm->rank;
    if (op.kind == kReduceScatter && r == s + piece) return nullptr;
    if (op.kind == kAllGather && s == r + piece) return nullptr;
    if (op.kind != kReduceScatter && op.kind != kAllGather && s == r) return nullptr;
    return "the send and receive buffers overlap but are not NCCL's in-place form (sendbuff == recvbuff; "
           "ReduceScatter: recvbuff == sendbuff + rank * recvcount; AllGather: sendbuff == recvbuff + rank * sendcount)";
}

static ncclResult_t check_buffer(const Op& op, const void* p, size_t elems, const char* which) {
    if (!elems) return ncclSuccess;
    std::string why = cuda_cpu::device_range_problem(p, elems * dtype_size(op.dt));
    if (!why.empty())
        return fail(ncclInvalidArgument, "%s: %s (%zu elements of %s): %s", kind_name(op.kind), which, elems,
                    dtype_name(op.dt), why.c_str());
    return ncclSuccess;
}

// NCCL's argument checks, at the call (inside a group too).
static ncclResult_t op_check(const Op& op) {
    const char* name = kind_name(op.kind);
    if (!op.comm) return fail(ncclInvalidArgument, "%s: the communicator is NULL", name);
    if (dtype_size(op.dt) == 0)
        return fail(ncclInvalidArgument, "%s: datatype %d (%s) is not one this emulation models (int8/uint8, "
                    "int32/uint32, int64/uint64, half, float, double, bf16)", name, (int)op.dt, dtype_name(op.dt));
    if (reduces(op) && (op.red < ncclSum || op.red > ncclAvg))
        return fail(ncclInvalidArgument, "%s: reduction op %d is not a built-in one (sum, prod, max, min, avg)",
                    name, (int)op.red);
    bool rooted = op.kind == kBroadcast || op.kind == kReduce || is_p2p(op);
    if (rooted && (op.root < 0 || op.root >= op.comm->nranks))
        return fail(ncclInvalidArgument, "%s: %s %d is not a rank of this %d-rank communicator", name,
                    is_p2p(op) ? "peer" : "root", op.root, op.comm->nranks);
    if (op.count > SIZE_MAX / dtype_size(op.dt) / (size_t)op.comm->nranks)
        return fail(ncclInvalidArgument, "%s: count %zu of %s times %d ranks overflows the byte count", name,
                    op.count, dtype_name(op.dt), op.comm->nranks);
    ncclResult_t r = check_buffer(op, op.send, send_elems(op), "sendbuff");
    if (r == ncclSuccess) r = check_buffer(op, op.recv, recv_elems(op), "recvbuff");
    if (r != ncclSuccess) return r;
    if (const char* why = overlap_problem(op)) return fail(ncclInvalidArgument, "%s: %s", name, why);
    return ncclSuccess;
}

// The bytes the operation reads and writes, for the layer's checks.
static std::vector<cuda_cpu::Range> op_ranges(const Op& op) {
    std::vector<cuda_cpu::Range> ranges;
    size_t sz = dtype_size(op.dt);
    if (send_elems(op)) ranges.push_back({op.send, send_elems(op) * sz, false});
    if (recv_elems(op)) ranges.push_back({op.recv, recv_elems(op) * sz, true});
    return ranges;
}

// ============================================================================
// 6. the handshake: collectives must match across ranks
// ============================================================================

struct Signature {
    int32_t kind, dt, red, root;
    uint64_t count, seq;
};

static std::string signature_text(const Signature& s) {
    char buf[160];
    if (s.kind == kAllReduce || s.kind == kReduceScatter)
        snprintf(buf, sizeof(buf), "%s count %llu %s %s", kind_name(s.kind), (unsigned long long)s.count,
                 dtype_name(s.dt), redop_name(s.red));
    else if (s.kind == kReduce)
        snprintf(buf, sizeof(buf), "%s count %llu %s %s root %d", kind_name(s.kind), (unsigned long long)s.count,
                 dtype_name(s.dt), redop_name(s.red), s.root);
    else if (s.kind == kBroadcast)
        snprintf(buf, sizeof(buf), "%s count %llu %s root %d", kind_name(s.kind), (unsigned long long)s.count,
                 dtype_name(s.dt), s.root);
    else
        snprintf(buf, sizeof(buf), "%s count %llu %s", kind_name(s.kind), (unsigned long long)s.count,
                 dtype_name(s.dt));
    return buf;
}

// Every rank learns what every rank called; on any difference all of them
// stop with the same message (no hang, no silent corruption).
static void handshake(const Op& op) {
    ncclComm* c = op.comm;
    Signature me{(int32_t)op.kind, (int32_t)op.dt, reduces(op) ? (int32_t)op.red : 0,
                 (op.kind == kBroadcast || op.kind == kReduce) ? op.root : 0, op.count, ++c->seq};
    if (c->nranks == 1) return;
    std::vector<Signature> all(c->nranks);
    MPI_CHECK(MPI_Allgather(&me, (int)sizeof(me), MPI_BYTE, all.data(), (int)sizeof(me), MPI_BYTE, c->mpi));
    bool same = true;
    for (const Signature& s : all) same = same && memcmp(&s, &all[0], sizeof(s)) == 0;
    if (same) return;
    std::string msg = std::string(kind_name(op.kind)) + " #" + std::to_string(me.seq) + ":";
    for (int r = 0; r < c->nranks; r++)
        msg += (r ? ", rank " : " rank ") + std::to_string(r) + " " + signature_text(all[r]) +
               (all[r].seq != me.seq ? " (its #" + std::to_string(all[r].seq) + ")" : "");
    msg += " — collectives must match across ranks (same call, count, datatype, op and root, in the same order)";
    g_fatal_pending = true;
    cuda_cpu::fatal("%s", msg.c_str());
}

// ============================================================================
// 7. running one operation (collectives, point-to-point)
// ============================================================================

// Everything here runs inside the operation's enqueued body, so it may touch
// exactly the ranges op_ranges declared. The scratch buffers are host memory.

static void run_allreduce(const Op& op, size_t sz) {
    ncclComm* c = op.comm;
    std::vector<char> all(op.count * sz * c->nranks);
    if (c->nranks == 1) memcpy(all.data(), op.send, op.count * sz);
    else MPI_CHECK(MPI_Allgather(op.send, mpi_count(op.count, "ncclAllReduce"), mpi_elem_type(sz), all.data(),
                                 (int)op.count, mpi_elem_type(sz), c->mpi));
    reduce_blocks(op.recv, all.data(), op.count, c->nranks, op.dt, op.red);
}

static void run_reduce(const Op& op, size_t sz) {
    ncclComm* c = op.comm;
    std::vector<char> all(c->rank == op.root ? op.count * sz * c->nranks : 0);
    if (c->nranks == 1) memcpy(all.data(), op.send, op.count * sz);
    else MPI_CHECK(MPI_Gather(op.send, mpi_count(op.count, "ncclReduce"), mpi_elem_type(sz), all.data(),
                              (int)op.count, mpi_elem_type(sz), op.root, c->mpi));
    if (c->rank == op.root) reduce_blocks(op.recv, all.data(), op.count, c->nranks, op.dt, op.red);
}

static void run_reduce_scatter(const Op& op, size_t sz) {
    ncclComm* c = op.comm;
    std::vector<char> mine(op.count * sz * c->nranks);  // piece `rank` of every rank's send buffer
    if (c->nranks == 1) memcpy(mine.data(), op.send, op.count * sz);
    else MPI_CHECK(MPI_Alltoall(op.send, mpi_count(op.count, "ncclReduceScatter"), mpi_elem_type(sz), mine.data(),
                                (int)op.count, mpi_elem_type(sz), c->mpi));
    reduce_blocks(op.recv, mine.data(), op.count, c->nranks, op.dt, op.red);
}

static void run_all_gather(const Op& op, size_t sz) {
    ncclComm* c = op.comm;
    std::vector<char> piece((const char*)op.send, (const char*)op.send + op.count * sz);  // in place: a copy first
    if (c->nranks == 1) memcpy(op.recv, piece.data(), piece.size());
    else MPI_CHECK(MPI_Allgather(piece.data(), mpi_count(op.count, "ncclAllGather"), mpi_elem_type(sz), op.recv,
                                 (int)op.count, mpi_elem_type(sz), c->mpi));
}

static void run_broadcast(const Op& op, size_t sz) {
    ncclComm* c = op.comm;
    if (c->rank == op.root && op.send != op.recv) memcpy(op.recv, op.send, op.count * sz);
    if (c->nranks > 1)
        MPI_CHECK(MPI_Bcast(op.recv, mpi_count(op.count, "ncclBroadcast"), mpi_elem_type(sz), op.root, c->mpi));
}

static void run_collective(const Op& op) {
    handshake(op);
    size_t sz = dtype_size(op.dt);
    switch (op.kind) {
        case kAllReduce: run_allreduce(op, sz); break;
        case kReduce: run_reduce(op, sz); break;
        case kReduceScatter: run_reduce_scatter(op, sz); break;
        case kAllGather: run_all_gather(op, sz); break;
        case kBroadcast: run_broadcast(op, sz); break;
        default: cuda_cpu::fatal("nccl_mpi: run_collective given %s (cannot happen)", kind_name(op.kind));
    }
}

// One rank's communicator alone: sends to itself meet its receives in order.
static void run_p2p_self(const std::vector<Op>& ops) {
    std::vector<const Op*> sends, recvs;
    for (const Op& op : ops) (op.kind == kSend ? sends : recvs).push_back(&op);
    if (sends.size() != recvs.size())
        cuda_cpu::fatal("nccl_mpi: a group on a 1-rank communicator has %zu ncclSend and %zu ncclRecv to itself: "
                        "they must pair up", sends.size(), recvs.size());
    for (size_t i = 0; i < sends.size(); i++) {
        size_t sb = sends[i]->count * dtype_size(sends[i]->dt), rb = recvs[i]->count * dtype_size(recvs[i]->dt);
        if (sb != rb)
            cuda_cpu::fatal("nccl_mpi: ncclSend of %zu bytes to itself met an ncclRecv of %zu bytes", sb, rb);
        memmove(recvs[i]->recv, sends[i]->send, sb);
    }
}

static int mpi_bytes(const Op& op) {
    size_t b = op.count * dtype_size(op.dt);
    if (b > (size_t)INT_MAX)
        cuda_cpu::fatal("nccl_mpi: %s of %zu bytes: over INT_MAX, which this emulation does not model",
                        kind_name(op.kind), b);
    return (int)b;
}

// Point-to-point operations all posted at once, then waited for, so a ring
// of sends and receives cannot deadlock. A receive must get exactly the bytes
// it asked for (NCCL would hang or corrupt on a mismatch).
static void run_p2p(const std::vector<Op>& ops) {
    std::vector<Op> self, remote;
    for (const Op& op : ops) (op.comm->nranks == 1 ? self : remote).push_back(op);
    if (!self.empty()) run_p2p_self(self);
    std::vector<MPI_Request> reqs(remote.size());
    for (size_t i = 0; i < remote.size(); i++) {
        const Op& op = remote[i];
        if (op.kind == kSend)
            MPI_CHECK(MPI_Isend(op.send, mpi_bytes(op), MPI_BYTE, op.root, 0, op.comm->mpi, &reqs[i]));
        else
            MPI_CHECK(MPI_Irecv(op.recv, mpi_bytes(op), MPI_BYTE, op.root, 0, op.comm->mpi, &reqs[i]));
    }
    std::vector<MPI_Status> st(remote.size());
    int rc = remote.empty() ? MPI_SUCCESS : MPI_Waitall((int)reqs.size(), reqs.data(), st.data());
    for (size_t i = 0; i < remote.size(); i++) {
        const Op& op = remote[i];
        int got = 0;
        if (op.kind == kRecv && rc == MPI_SUCCESS) MPI_CHECK(MPI_Get_count(&st[i], MPI_BYTE, &got));
        bool truncated = rc == MPI_ERR_IN_STATUS && st[i].MPI_ERROR == MPI_ERR_TRUNCATE;
        if (op.kind == kRecv && (truncated || (rc == MPI_SUCCESS && got != mpi_bytes(op))))
            cuda_cpu::fatal("ncclRecv from rank %d on rank %d: it sent %s bytes, this rank asked for %d (%zu %s) — "
                            "ncclSend and ncclRecv must agree on count and datatype",
                            op.root, op.comm->rank, truncated ? "more" : std::to_string(got).c_str(),
                            mpi_bytes(op), op.count, dtype_name(op.dt));
    }
    MPI_CHECK(rc);
}

// Enqueue on the operation's stream, running now, in program order.
static ncclResult_t enqueue_now(cudaStream_t s, const char* name, std::vector<cuda_cpu::Range> ranges,
                                std::function<void()> body) {
    cudaError_t e = cuda_cpu::enqueue(s, name, std::move(ranges), std::move(body), /*run_now=*/true);
    if (e != cudaSuccess)
        return fail(ncclUnhandledCudaError, "%s: the stream cannot take work (CUDA error %d; destroyed?)", name, (int)e);
    return ncclSuccess;
}

static ncclResult_t issue_collective(const Op& op) {
    return enqueue_now(op.stream, kind_name(op.kind), op_ranges(op), [op] { run_collective(op); });
}

// The point-to-point part of a group, as one operation: it waits for every
// stream the group uses (each joins with an empty operation, run now), then
// runs on the last of them, declaring every buffer. (NCCL also makes every
// stream of the group wait for the group's end; the race checker does not
// see that here: the project's groups use one stream.)
static ncclResult_t issue_p2p(const std::vector<Op>& ops) {
    if (ops.empty()) return ncclSuccess;
    std::vector<cuda_cpu::Range> ranges;
    std::vector<cudaStream_t> streams;
    for (const Op& op : ops) {
        for (const cuda_cpu::Range& r : op_ranges(op)) ranges.push_back(r);
        bool seen = false;
        for (cudaStream_t s : streams) seen = seen || s == op.stream;
        if (!seen) streams.push_back(op.stream);
    }
    for (size_t i = 0; i + 1 < streams.size(); i++) {
        ncclResult_t r = enqueue_now(streams[i], "ncclGroupEnd (stream joins the group)", {}, [] {});
        if (r != ncclSuccess) return r;
    }
    const char* name = ops.size() == 1 ? kind_name(ops[0].kind) : "ncclGroupEnd (ncclSend/ncclRecv)";
    return enqueue_now(streams.back(), name, std::move(ranges), [ops] { run_p2p(ops); });
}

// ============================================================================
// 8. groups
// ============================================================================

static int g_group_depth = 0;
static std::vector<Op> g_group_ops;  // queued by calls inside ncclGroupStart..End

// The group's end: point-to-point operations first (every rank reorders the
// same way, so they still meet), then the collectives in program order.
static ncclResult_t group_flush(void) {
    std::vector<Op> ops;
    ops.swap(g_group_ops);
    std::vector<Op> p2p;
    for (const Op& op : ops)
        if (is_p2p(op)) p2p.push_back(op);
    ncclResult_t r = issue_p2p(p2p);
    for (const Op& op : ops)
        if (r == ncclSuccess && !is_p2p(op)) r = issue_collective(op);
    return r;
}

// Check, then queue (inside a group) or issue now.
static ncclResult_t op_submit(const Op& op) {
    ncclResult_t r = op_check(op);
    if (r != ncclSuccess) return r;
    if (g_group_depth > 0) {
        g_group_ops.push_back(op);
        return ncclSuccess;
    }
    return is_p2p(op) ? issue_p2p({op}) : issue_collective(op);
}

// ============================================================================
// 9. the NCCL API
// ============================================================================

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;  // the header's, so the application sees the NCCL it was built against
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

const char* ncclGetLastError(ncclComm_t) { return g_last_error.c_str(); }

// Magic, process id, time and a counter: distinct across ids of one job.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (!id) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    static unsigned long long counter = 0;
    memset(id, 0, sizeof(*id));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long fields[4] = {(unsigned long long)getpid(), (unsigned long long)ts.tv_sec,
                                    (unsigned long long)ts.tv_nsec, ++counter};
    memcpy(id->internal, kIdMagic, sizeof(kIdMagic));
    memcpy(id->internal + sizeof(kIdMagic), fields, sizeof(fields));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = nullptr;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of nranks %d (rank must be in 0..nranks-1)",
                    rank, nranks);
    if (memcmp(id.internal, kIdMagic, sizeof(kIdMagic)) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId (or did not "
                    "reach this rank intact)");
    if (g_group_depth > 0)
        return fail(ncclInvalidUsage, "ncclCommInitRank inside ncclGroupStart..End is not modelled");
    ncclComm* c = new ncclComm{rank, nranks, MPI_COMM_NULL, 0, ncclSuccess, id};
    if (nranks > 1) {
        ncclResult_t r = comm_build_mpi(c, nranks, id, rank);
        if (r != ncclSuccess) {
            delete c;
            return r;
        }
    }
    g_live_comms++;
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t comm_release(ncclComm* c, const char* name) {
    if (!c) return fail(ncclInvalidArgument, "%s: comm is NULL", name);
    for (const Op& op : g_group_ops)
        if (op.comm == c)
            return fail(ncclInvalidUsage, "%s: the communicator has operations queued in an open group", name);
    if (c->mpi != MPI_COMM_NULL) MPI_CHECK(MPI_Comm_free(&c->mpi));
    delete c;
    g_live_comms--;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_release(comm, "ncclCommDestroy"); }

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    return comm ? ncclSuccess : fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
}

// Alone, the communicator just goes. With other ranks, they may be blocked
// in a collective with this one, which MPI cannot cancel: the whole job ends
// (MPI_Abort), with status 86 when a handshake mismatch is being reported.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;  // NCCL accepts a NULL comm here
    if (comm->nranks == 1) {
        delete comm;
        g_live_comms--;
        return ncclSuccess;
    }
    fprintf(stderr, "cuda_cpu: ncclCommAbort on rank %d of %d: ending the MPI job (the other ranks may be waiting "
            "in a collective with this one)\n", comm->rank, comm->nranks);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, g_fatal_pending ? cuda_cpu::FATAL_EXIT : 1);  // does not return
    return ncclInternalError;
}

// A dead peer ends the job through mpirun, so no error arrives here later.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async) {
    if (!comm || !async) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    *async = comm->async;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (!comm || !count) return fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

// NCCL >= 2.18: a collective over comm's ranks; those giving the same colour
// form a new communicator, ranked by key, ties by their rank in comm (as
// MPI_Comm_split, which it is here); NCCL_SPLIT_NOCOLOR: *newcomm = NULL.
// Only config == NULL (the parent's, blocking) is modelled.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
    if (!comm || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: comm or newcomm is NULL");
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return fail(ncclInvalidArgument, "ncclCommSplit: color %d (must be >= 0 or NCCL_SPLIT_NOCOLOR)", color);
    if (config)
        return fail(ncclInvalidUsage, "ncclCommSplit: a config is not modelled by the CPU layer: pass NULL (the "
                    "parent's, blocking)");
    if (g_group_depth > 0) return fail(ncclInvalidUsage, "ncclCommSplit inside ncclGroupStart..End is not modelled");
    Op turn{kSplit, nullptr, nullptr, 0, ncclInt8, ncclSum, 0, comm, nullptr};
    handshake(turn);  // every rank of comm is here, not in some other call
    ncclComm* c = new ncclComm{0, 1, MPI_COMM_NULL, 0, ncclSuccess, comm->id};
    if (comm->nranks > 1) {
        MPI_Comm sub = MPI_COMM_NULL;
        MPI_CHECK(MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &sub));
        if (sub != MPI_COMM_NULL) {
            MPI_CHECK(MPI_Comm_rank(sub, &c->rank));
            MPI_CHECK(MPI_Comm_size(sub, &c->nranks));
            MPI_CHECK(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
            if (c->nranks > 1) c->mpi = sub;  // (one rank: no MPI, as ncclCommInitRank's)
            else MPI_CHECK(MPI_Comm_free(&sub));
        }
    }
    if (color == NCCL_SPLIT_NOCOLOR) {
        delete c;
        return ncclSuccess;
    }
    g_live_comms++;
    *newcomm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (!comm || !rank) return fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
    g_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (g_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart");
    if (--g_group_depth > 0) return ncclSuccess;
    return group_flush();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return op_submit({kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream});
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    return op_submit({kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    return op_submit({kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return op_submit({kAllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    return op_submit({kBroadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return op_submit({kSend, sendbuff, nullptr, count, datatype, ncclSum, peer, comm, stream});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return op_submit({kRecv, nullptr, recvbuff, count, datatype, ncclSum, peer, comm, stream});
}

}  // extern "C"
