// test_nccl_mpi.cpp — the self-test of nccl_mpi.cpp (NCCL over MPI for the CPU
// layer). Every collective and datatype is checked against values this file
// computes on its own, on every rank; each rank prints one line per check
// ("ok ..." or "FAIL ..."), and exits non-zero after any failure.
//
// Run through dev/cuda/cpu/test_nccl_mpi.sh (make test-nccl-cpu), which runs
// it alone, under mpirun -np 2 and -np 3, and the planted bugs:
//   test_nccl_mpi [--app-mpi | --id-dir DIR] [--log-dir DIR] [MODE]
//     --app-mpi   the test starts MPI itself and passes the ids by MPI_Bcast
//                 (as train_gpt_cu_mpi does); otherwise nccl_mpi.cpp starts
//                 MPI, and rank 0 passes the ids through files in DIR
//     --log-dir   each rank writes its lines to DIR/rank.R instead of stdout
//     MODE        checks (default) | mismatch (rank 0 calls an all-reduce of
//                 1024 floats, the others 1000: must end with status 86) |
//                 kill (the last rank dies of SIGKILL while the others enter a
//                 collective: the job must end, not hang) | plant-wrong (one
//                 expected value is wrong: the check must say FAIL) |
//                 p2p-mismatch (rank 0 sends 100 floats, rank 1 receives 90:
//                 status 86) | abort (rank 0 aborts while the others wait in a
//                 collective: the job must end)
// Device memory is host memory here (device_stub.cpp, a test double of
// the layer's runtime), so nccl_mpi.cpp is tested alone.
//
// Sections: helpers (values, comparison, ids) → the checks → main.

#include <mpi.h>   // defines: MPI_Init, MPI_Bcast (the --app-mpi path only)
#include <nccl.h>  // defines: the NCCL API under test, __nv_bfloat16, __half

#include <signal.h>  // raise, SIGKILL (mode kill)
#include <unistd.h>  // usleep, access

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device.h"  // defines: cuda_cpu::Range (what the stub recorded)

namespace cuda_cpu {  // recorded by device_stub.cpp: the last enqueued operation
extern std::string stub_last_name;
extern std::vector<Range> stub_last_ranges;
}  // namespace cuda_cpu

// ============================================================================
// helpers: the run, the checks' bookkeeping, values, ids
// ============================================================================

static int g_rank = 0, g_world = 1, g_failed = 0;
static bool g_app_mpi = false, g_plant_wrong = false;
static const char* g_id_dir = nullptr;
static FILE* g_out = stdout;  // --log-dir: this rank's own file (mpirun may split long lines of several ranks)

static void check(bool ok, const std::string& what) {
    fprintf(g_out, "%s [np=%d rank %d] %s\n", ok ? "ok" : "FAIL", g_world, g_rank, what.c_str());
    fflush(g_out);
    if (!ok) g_failed++;
}

#define NCCL_OK(call)                                                                                \
    do {                                                                                             \
        ncclResult_t r_ = (call);                                                                    \
        if (r_ != ncclSuccess) {                                                                     \
            fprintf(stderr, "test_nccl_mpi:%d: %s failed: %s (%s)\n", __LINE__, #call,               \
                    ncclGetErrorString(r_), ncclGetLastError(NULL));                                 \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define MPI_OK(call)                                                                   \
    do {                                                                               \
        if ((call) != MPI_SUCCESS) {                                                   \
            fprintf(stderr, "test_nccl_mpi:%d: %s failed\n", __LINE__, #call);         \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

// Conversions between the element types and double, for computing expectations.
template <typename T> static T from_d(double x) { return (T)x; }
template <> __nv_bfloat16 from_d<__nv_bfloat16>(double x) { return __float2bfloat16((float)x); }
template <> __half from_d<__half>(double x) { return __float2half((float)x); }
template <typename T> static double to_d(T x) { return (double)x; }
template <> double to_d<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> double to_d<__half>(__half x) { return __half2float(x); }

// Small integers: exact in every type (sums over 3 ranks stay under 127).
static double value_int(int r, size_t i) { return (r + 1) * (double)(i % 13 + 1) + (double)(i % 5); }
static double value_prod(int r, size_t i) { return (double)((i + r) % 2 + 1); }

// Compare `n` elements against `want`; tol is relative (0: exact).
template <typename T>
static bool same(const T* got, const std::vector<double>& want, double tol, std::string* why) {
    for (size_t i = 0; i < want.size(); i++) {
        double g = to_d(got[i]), w = want[i];
        if (std::fabs(g - w) > tol * std::fabs(w) || std::isnan(g)) {
            char buf[160];
            snprintf(buf, sizeof(buf), " (element %zu: got %.9g, want %.9g, tolerance %.1e relative)", i, g, w, tol);
            *why = buf;
            return false;
        }
    }
    return true;
}

// The id of communicator k, from rank 0 to everyone: MPI_Bcast, or a file
// written whole (rename) and polled for.
static ncclUniqueId share_id(int k) {
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (g_world == 1) {
        NCCL_OK(ncclGetUniqueId(&id));
        return id;
    }
    if (g_app_mpi) {
        if (g_rank == 0) NCCL_OK(ncclGetUniqueId(&id));
        MPI_OK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
        return id;
    }
    std::string path = std::string(g_id_dir) + "/id" + std::to_string(k), tmp = path + ".tmp";
    if (g_rank == 0) {
        NCCL_OK(ncclGetUniqueId(&id));
        FILE* f = fopen(tmp.c_str(), "wb");
        if (!f || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
            fprintf(stderr, "test_nccl_mpi: cannot write %s\n", path.c_str());
            exit(1);
        }
        return id;
    }
    for (int tries = 0; tries < 3000; tries++) {  // 30 s
        FILE* f = fopen(path.c_str(), "rb");
        if (f) {
            size_t got = fread(&id, sizeof(id), 1, f);
            fclose(f);
            if (got == 1) return id;
        }
        usleep(10000);
    }
    fprintf(stderr, "test_nccl_mpi: rank %d: no id in %s after 30 s\n", g_rank, path.c_str());
    exit(1);
}

static const char* op_text(ncclRedOp_t op) {
    static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
    return names[op];
}

// ============================================================================
// the checks
// ============================================================================

// All-reduce of small integers (exact in every type), out of place.
template <typename T>
static void check_allreduce(ncclComm_t comm, ncclDataType_t dt, const char* tname, ncclRedOp_t op, double tol) {
    const size_t n = 1000;
    std::vector<T> send(n), recv(n);
    auto val = op == ncclProd ? value_prod : value_int;
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++) {
        send[i] = from_d<T>(val(g_rank, i));
        double acc = val(0, i);
        for (int r = 1; r < g_world; r++) {
            double v = val(r, i);
            acc = op == ncclSum || op == ncclAvg ? acc + v : op == ncclProd ? acc * v : op == ncclMax ? std::max(acc, v) : std::min(acc, v);
        }
        if (op == ncclAvg) acc = std::is_integral<T>::value ? std::floor(acc / g_world) : acc / g_world;
        want[i] = acc;
    }
    if (g_plant_wrong && op == ncclSum && dt == ncclInt32) want[7] += 1;  // planted: this check must fail
    NCCL_OK(ncclAllReduce(send.data(), recv.data(), n, dt, op, comm, 0));
    std::string why;
    bool ok = same(recv.data(), want, tol, &why);
    check(ok, std::string("ncclAllReduce ") + tname + " " + op_text(op) + " of " + std::to_string(n) + why);
}

static void check_allreduce_all_types(ncclComm_t comm) {
    check_allreduce<int8_t>(comm, ncclInt8, "int8", ncclSum, 0);
    check_allreduce<uint8_t>(comm, ncclUint8, "uint8", ncclSum, 0);
    check_allreduce<int32_t>(comm, ncclInt32, "int32", ncclSum, 0);
    check_allreduce<uint32_t>(comm, ncclUint32, "uint32", ncclSum, 0);
    check_allreduce<int64_t>(comm, ncclInt64, "int64", ncclSum, 0);
    check_allreduce<uint64_t>(comm, ncclUint64, "uint64", ncclSum, 0);
    check_allreduce<__half>(comm, ncclFloat16, "half", ncclSum, 0);
    check_allreduce<float>(comm, ncclFloat, "float", ncclSum, 0);
    check_allreduce<double>(comm, ncclDouble, "double", ncclSum, 0);
    check_allreduce<__nv_bfloat16>(comm, ncclBfloat16, "bf16", ncclSum, 0);
    for (ncclRedOp_t op : {ncclProd, ncclMax, ncclMin}) {
        check_allreduce<int32_t>(comm, ncclInt32, "int32", op, 0);
        check_allreduce<float>(comm, ncclFloat, "float", op, 0);
        check_allreduce<__nv_bfloat16>(comm, ncclBfloat16, "bf16", op, 0);
    }
    check_allreduce<int32_t>(comm, ncclInt32, "int32", ncclAvg, 0);     // integer division
    check_allreduce<double>(comm, ncclDouble, "double", ncclAvg, 1e-15);
    check_allreduce<float>(comm, ncclFloat, "float", ncclAvg, 1e-6);     // one fp32 division
    check_allreduce<__nv_bfloat16>(comm, ncclBfloat16, "bf16", ncclAvg, 1.0 / 256);  // one bf16 rounding
}

// Inexact values: float within 1e-6 relative of the exact sum; bf16 equal,
// bit for bit, to the documented choice (fp32 sum in rank order, rounded
// once), and within one bf16 rounding (2^-8 relative) of the exact sum.
static void check_allreduce_rounding(ncclComm_t comm) {
    const size_t n = 4096;
    std::vector<float> fs(n), fr(n);
    std::vector<__nv_bfloat16> bs(n), br(n);
    std::vector<double> fwant(n, 0.0), bexact(n, 0.0), bchoice(n);
    for (size_t i = 0; i < n; i++) {
        float facc = 0.0f;
        for (int r = 0; r < g_world; r++) {
            float f = 0.1f * (float)(r + 1) + 0.001f * (float)i;
            float b = __bfloat162float(__float2bfloat16(0.37f * (float)(r + 1) + 0.013f * (float)i));
            fwant[i] += f;
            bexact[i] += b;
            facc += b;
            if (r == g_rank) fs[i] = f, bs[i] = __float2bfloat16(b);
        }
        bchoice[i] = __bfloat162float(__float2bfloat16(facc));
    }
    NCCL_OK(ncclAllReduce(fs.data(), fr.data(), n, ncclFloat, ncclSum, comm, 0));
    NCCL_OK(ncclAllReduce(bs.data(), br.data(), n, ncclBfloat16, ncclSum, comm, 0));
    std::string why;
    bool ok = same(fr.data(), fwant, 1e-6, &why);
    check(ok, "ncclAllReduce float sum of inexact values, within 1e-6 relative" + why);
    ok = same(br.data(), bchoice, 0, &why);
    check(ok, "ncclAllReduce bf16 sum == bf16(fp32 sum in rank order), bit for bit" + why);
    ok = same(br.data(), bexact, 1.0 / 256, &why);
    check(ok, "ncclAllReduce bf16 sum within 2^-8 relative of the exact sum" + why);
}

static void check_allreduce_in_place(ncclComm_t comm) {
    const size_t n = 777;
    std::vector<float> buf(n);
    std::vector<double> want(n, 0.0);
    for (size_t i = 0; i < n; i++) {
        buf[i] = (float)value_int(g_rank, i);
        for (int r = 0; r < g_world; r++) want[i] += value_int(r, i);
    }
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), n, ncclFloat, ncclSum, comm, 0));
    std::string why;
    check(same(buf.data(), want, 0, &why), "ncclAllReduce float sum in place" + why);
}

// Rank r's piece: element i of piece p is the sum over ranks of value_int(r, p*n + i).
template <typename T>
static void check_reduce_scatter(ncclComm_t comm, ncclDataType_t dt, const char* tname, bool in_place) {
    const size_t n = 300;
    std::vector<T> send(n * g_world), recv(n);
    std::vector<double> want(n, 0.0);
    for (size_t j = 0; j < send.size(); j++) send[j] = from_d<T>(value_int(g_rank, j));
    for (size_t i = 0; i < n; i++)
        for (int r = 0; r < g_world; r++) want[i] += value_int(r, (size_t)g_rank * n + i);
    T* out = in_place ? send.data() + (size_t)g_rank * n : recv.data();
    NCCL_OK(ncclReduceScatter(send.data(), out, n, dt, ncclSum, comm, 0));
    std::string why;
    bool ok = same(out, want, 0, &why);
    check(ok, std::string("ncclReduceScatter ") + tname + " sum" + (in_place ? " in place" : "") + why);
    if (!in_place) {
        auto& rg = cuda_cpu::stub_last_ranges;
        bool ranges = rg.size() == 2 && !rg[0].write && rg[0].p == send.data() &&
                      rg[0].bytes == n * g_world * sizeof(T) && rg[1].write && rg[1].p == recv.data() &&
                      rg[1].bytes == n * sizeof(T);
        check(ranges, "ncclReduceScatter declares reading W*recvcount and writing recvcount elements");
    }
}

template <typename T>
static void check_all_gather(ncclComm_t comm, ncclDataType_t dt, const char* tname, bool in_place,
                             double (*val)(int, size_t)) {
    const size_t n = 257;
    std::vector<T> send(n), recv(n * g_world);
    std::vector<double> want(n * g_world);
    for (int r = 0; r < g_world; r++)
        for (size_t i = 0; i < n; i++) want[(size_t)r * n + i] = val(r, i);
    T* in = in_place ? recv.data() + (size_t)g_rank * n : send.data();
    for (size_t i = 0; i < n; i++) in[i] = from_d<T>(val(g_rank, i));
    NCCL_OK(ncclAllGather(in, recv.data(), n, dt, comm, 0));
    std::string why;
    bool ok = same(recv.data(), want, 0, &why);
    check(ok, std::string("ncclAllGather ") + tname + (in_place ? " in place" : "") + why);
    if (!in_place) {
        auto& rg = cuda_cpu::stub_last_ranges;
        bool ranges = rg.size() == 2 && !rg[0].write && rg[0].bytes == n * sizeof(T) && rg[1].write &&
                      rg[1].bytes == n * g_world * sizeof(T);
        check(ranges, "ncclAllGather declares reading sendcount and writing W*sendcount elements");
    }
}

static double value_big(int r, size_t i) { return (double)(((uint64_t)(r + 1) << 40) + i); }

static void check_broadcast(ncclComm_t comm, bool in_place) {
    const size_t n = 100;
    const int root = g_world - 1;
    std::vector<double> send(n, -1.0), recv(n, -2.0), want(n);
    for (size_t i = 0; i < n; i++) want[i] = 0.5 * (double)i + 1000.0 * root;
    if (g_rank == root) (in_place ? recv : send) = want;
    NCCL_OK(ncclBroadcast(in_place ? recv.data() : send.data(), recv.data(), n, ncclDouble, root, comm, 0));
    std::string why;
    check(same(recv.data(), want, 0, &why), std::string("ncclBroadcast double from the last rank") +
                                                (in_place ? " in place" : "") + why);
}

static void check_reduce(ncclComm_t comm) {
    const size_t n = 50;
    std::vector<int32_t> send(n), recv(n, -7);
    std::vector<double> want(n, 0.0), untouched(n, -7.0);
    for (size_t i = 0; i < n; i++) {
        send[i] = (int32_t)value_int(g_rank, i);
        for (int r = 0; r < g_world; r++) want[i] += value_int(r, i);
    }
    NCCL_OK(ncclReduce(send.data(), recv.data(), n, ncclInt32, ncclSum, 0, comm, 0));
    std::string why;
    bool ok = same(recv.data(), g_rank == 0 ? want : untouched, 0, &why);
    check(ok, "ncclReduce int32 sum to rank 0 (others' recvbuff untouched)" + why);
}

// As train_gpt.cu's --zero 0: a group of in-place all-reduces over slices.
static void check_group_allreduce(ncclComm_t comm) {
    const size_t cuts[] = {0, 100, 350, 1000};
    std::vector<float> buf(1000);
    std::vector<double> want(1000, 0.0);
    for (size_t i = 0; i < 1000; i++) {
        buf[i] = (float)value_int(g_rank, i);
        for (int r = 0; r < g_world; r++) want[i] += value_int(r, i);
    }
    NCCL_OK(ncclGroupStart());
    for (int k = 0; k < 3; k++)
        NCCL_OK(ncclAllReduce(buf.data() + cuts[k], buf.data() + cuts[k], cuts[k + 1] - cuts[k], ncclFloat, ncclSum,
                              comm, 0));
    bool deferred = buf[0] == (float)value_int(g_rank, 0);  // nothing ran before ncclGroupEnd
    NCCL_OK(ncclGroupEnd());
    std::string why;
    check(deferred || g_world == 1, "ncclGroupStart defers the collectives to ncclGroupEnd");
    check(same(buf.data(), want, 0, &why), "a group of 3 in-place ncclAllReduce over slices" + why);
}

// Every rank sends to the next and receives from the previous, in one group.
static void check_ring(ncclComm_t comm) {
    const size_t n = 5000;
    int next = (g_rank + 1) % g_world, prev = (g_rank + g_world - 1) % g_world;
    std::vector<float> send(n), recv(n, -1.0f);
    std::vector<double> want(n);
    for (size_t i = 0; i < n; i++) send[i] = (float)value_int(g_rank, i), want[i] = value_int(prev, i);
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(send.data(), n, ncclFloat, next, comm, 0));
    NCCL_OK(ncclRecv(recv.data(), n, ncclFloat, prev, comm, 0));
    NCCL_OK(ncclGroupEnd());
    std::string why;
    check(same(recv.data(), want, 0, &why), "ncclSend/ncclRecv around a ring in one group" + why);
}

// A second communicator with the ranks reversed, used between calls on the first.
static void check_two_comms(ncclComm_t a) {
    ncclUniqueId id = share_id(1);
    ncclComm_t b = nullptr;
    int brank = g_world - 1 - g_rank;
    NCCL_OK(ncclCommInitRank(&b, g_world, id, brank));
    int urank = -1;
    NCCL_OK(ncclCommUserRank(b, &urank));
    check(urank == brank, "a second communicator with the ranks reversed: this rank is " + std::to_string(brank));
    std::vector<int32_t> mine(4, brank), all(4 * g_world, -1);
    std::vector<double> want(4 * g_world);
    for (size_t j = 0; j < want.size(); j++) want[j] = (double)(j / 4);
    int32_t one = 1, total = 0;
    NCCL_OK(ncclAllGather(mine.data(), all.data(), 4, ncclInt32, b, 0));
    NCCL_OK(ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, a, 0));
    std::string why;
    check(same(all.data(), want, 0, &why), "ncclAllGather on the reversed communicator orders by its ranks" + why);
    check(total == g_world, "ncclAllReduce on the first communicator between calls on the second");
    NCCL_OK(ncclCommDestroy(b));
}

// ncclCommSplit as train_gpt.cu uses it (one communicator per level): by
// parity, keys reversed, so the new ranks run the other way; a collective on
// each part sums only its members, between calls on the parent; then the last
// rank stays out (NCCL_SPLIT_NOCOLOR: NULL) and the others form one.
static void check_split(ncclComm_t parent) {
    int colour = g_rank % 2, members = 0, below = 0;
    for (int q = 0; q < g_world; q++)
        if (q % 2 == colour) members++, below += q > g_rank;
    ncclComm_t part = nullptr;
    NCCL_OK(ncclCommSplit(parent, colour, -g_rank, &part, NULL));
    int count = -1, urank = -1;
    NCCL_OK(ncclCommCount(part, &count));
    NCCL_OK(ncclCommUserRank(part, &urank));
    check(count == members && urank == below, "ncclCommSplit by parity, keys reversed: " + std::to_string(count) +
          " rank(s), this one " + std::to_string(urank) + " (want " + std::to_string(members) + ", " +
          std::to_string(below) + ")");
    int32_t mine = g_rank + 1, total = 0, all = 0, one = 1;
    int32_t want = 0;
    for (int q = 0; q < g_world; q++) want += q % 2 == colour ? q + 1 : 0;
    NCCL_OK(ncclAllReduce(&mine, &total, 1, ncclInt32, ncclSum, part, 0));
    NCCL_OK(ncclAllReduce(&one, &all, 1, ncclInt32, ncclSum, parent, 0));
    check(total == want && all == g_world, "ncclAllReduce on the split part sums its members only (" +
          std::to_string(total) + ", want " + std::to_string(want) + "), then on the parent all of them");
    NCCL_OK(ncclCommDestroy(part));
    ncclComm_t rest = nullptr;
    bool out = g_world > 1 && g_rank == g_world - 1;
    NCCL_OK(ncclCommSplit(parent, out ? NCCL_SPLIT_NOCOLOR : 0, 0, &rest, NULL));
    if (out) {
        check(rest == nullptr, "ncclCommSplit with NCCL_SPLIT_NOCOLOR gives no communicator");
    } else {
        NCCL_OK(ncclCommCount(rest, &count));
        NCCL_OK(ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, rest, 0));
        int others = g_world > 1 ? g_world - 1 : 1;
        check(count == others && total == others, "ncclCommSplit without the last rank: " + std::to_string(count) +
              " rank(s), all-reduce " + std::to_string(total));
        NCCL_OK(ncclCommDestroy(rest));
    }
}

// NCCL's argument checks: the code, and ncclGetLastError's text.
static void check_error(ncclResult_t got, ncclResult_t want, const char* word, const char* what) {
    const char* text = ncclGetLastError(NULL);
    bool ok = got == want && strstr(text, word) != nullptr;
    check(ok, std::string(what) + " -> " + ncclGetErrorString(got) + " (\"" + text + "\")");
}

static void check_errors(ncclComm_t comm) {
    std::vector<float> buf(64 * g_world);
    float* p = buf.data();
    check_error(ncclAllReduce(p, p, 8, ncclFloat, ncclSum, nullptr, 0), ncclInvalidArgument, "NULL",
                "ncclAllReduce with a NULL communicator");
    check_error(ncclAllReduce(p, p, 8, ncclNumTypes, ncclSum, comm, 0), ncclInvalidArgument, "datatype",
                "ncclAllReduce with datatype ncclNumTypes");
    check_error(ncclAllReduce(p, p, 8, ncclFloat, ncclNumOps, comm, 0), ncclInvalidArgument, "reduction op",
                "ncclAllReduce with op ncclNumOps");
    check_error(ncclAllReduce(nullptr, p, 8, ncclFloat, ncclSum, comm, 0), ncclInvalidArgument, "sendbuff",
                "ncclAllReduce with a NULL sendbuff");
    check_error(ncclBroadcast(p, p, 8, ncclFloat, g_world, comm, 0), ncclInvalidArgument, "root",
                "ncclBroadcast with root == nranks");
    check_error(ncclAllGather(p, p, SIZE_MAX / 2, ncclFloat, comm, 0), ncclInvalidArgument, "overflows",
                "ncclAllGather of SIZE_MAX/2 floats");
    check_error(ncclAllReduce(p, p + 1, 8, ncclFloat, ncclSum, comm, 0), ncclInvalidArgument, "in-place",
                "ncclAllReduce with buffers overlapping one element apart");
    check_error(ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart", "ncclGroupEnd without ncclGroupStart");
    ncclComm_t sub = nullptr;
    check_error(ncclCommSplit(comm, -5, 0, &sub, NULL), ncclInvalidArgument, "color", "ncclCommSplit with color -5");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    check_error(ncclCommSplit(comm, 0, 0, &sub, &config), ncclInvalidUsage, "config",
                "ncclCommSplit with a config (not modelled)");
    ncclResult_t async = ncclInternalError;
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    check(async == ncclSuccess, "ncclCommGetAsyncError reports no error");
}

// Alone, several ranks cannot be emulated: a clear error, and MPI untouched.
static void check_no_mpirun(void) {
    ncclUniqueId id;
    NCCL_OK(ncclGetUniqueId(&id));
    ncclComm_t c = nullptr;
    check_error(ncclCommInitRank(&c, 2, id, 0), ncclInvalidUsage, "mpirun",
                "ncclCommInitRank(nranks 2) in a process not started by mpirun");
    int up = 1;
    MPI_OK(MPI_Initialized(&up));
    check(!up, "a 1-rank communicator and that refusal did not start MPI");
}

static void run_checks(void) {
    int v = 0;
    NCCL_OK(ncclGetVersion(&v));
    check(v == NCCL_VERSION_CODE, "ncclGetVersion gives nccl.h's NCCL_VERSION_CODE " + std::to_string(v));
    ncclUniqueId id = share_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, g_world, id, g_rank));
    int count = 0, urank = -1;
    NCCL_OK(ncclCommCount(comm, &count));
    NCCL_OK(ncclCommUserRank(comm, &urank));
    check(count == g_world && urank == g_rank, "ncclCommCount and ncclCommUserRank");
    check_allreduce_all_types(comm);
    check_allreduce_rounding(comm);
    check_allreduce_in_place(comm);
    for (bool in_place : {false, true}) {
        check_reduce_scatter<float>(comm, ncclFloat, "float", in_place);
        check_reduce_scatter<__nv_bfloat16>(comm, ncclBfloat16, "bf16", in_place);
        check_all_gather<uint64_t>(comm, ncclUint64, "uint64", in_place, value_big);
        check_all_gather<__nv_bfloat16>(comm, ncclBfloat16, "bf16", in_place, value_int);
        check_broadcast(comm, in_place);
    }
    check_reduce(comm);
    check_group_allreduce(comm);
    check_ring(comm);
    check_two_comms(comm);
    check_split(comm);
    check_errors(comm);
    if (g_world == 1 && !g_app_mpi) check_no_mpirun();
    NCCL_OK(ncclCommDestroy(comm));
}

// ============================================================================
// main: the run's shape, then the mode
// ============================================================================

// Planted: rank 0 all-reduces 1024 floats, the others 1000 (after one that matches).
static void run_mismatch(void) {
    ncclUniqueId id = share_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, g_world, id, g_rank));
    std::vector<float> buf(1024, 1.0f);
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat, ncclSum, comm, 0));
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), g_rank == 0 ? 1024 : 1000, ncclFloat, ncclSum, comm, 0));
    printf("FAIL [np=%d rank %d] a mismatched ncclAllReduce returned\n", g_world, g_rank);
    exit(1);
}

// Planted: the last rank dies mid-run; the others enter a collective with it.
static void run_kill(void) {
    ncclUniqueId id = share_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, g_world, id, g_rank));
    std::vector<float> buf(256, 1.0f);
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), 256, ncclFloat, ncclSum, comm, 0));
    if (g_rank == g_world - 1) raise(SIGKILL);
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), 256, ncclFloat, ncclSum, comm, 0));
    printf("FAIL [np=%d rank %d] an all-reduce with a dead rank returned\n", g_world, g_rank);
    exit(1);
}

// Planted: rank 0 sends 100 floats to rank 1, which asks for 90.
static void run_p2p_mismatch(void) {
    ncclUniqueId id = share_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, g_world, id, g_rank));
    std::vector<float> buf(100, 1.0f);
    if (g_rank == 0) NCCL_OK(ncclSend(buf.data(), 100, ncclFloat, 1, comm, 0));
    if (g_rank == 1) NCCL_OK(ncclRecv(buf.data(), 90, ncclFloat, 0, comm, 0));
    NCCL_OK(ncclAllReduce(buf.data(), buf.data(), 1, ncclFloat, ncclSum, comm, 0));  // rank 0 waits here
    printf("FAIL [np=%d rank %d] a mismatched ncclSend/ncclRecv went unnoticed\n", g_world, g_rank);
    exit(1);
}

// Rank 0 aborts its communicator while the others wait in a collective:
// the job must end (MPI_Abort), not hang.
static void run_abort(void) {
    ncclUniqueId id = share_id(0);
    ncclComm_t comm = nullptr;
    NCCL_OK(ncclCommInitRank(&comm, g_world, id, g_rank));
    std::vector<float> buf(16, 1.0f);
    if (g_rank == 0) NCCL_OK(ncclCommAbort(comm));
    else NCCL_OK(ncclAllReduce(buf.data(), buf.data(), 16, ncclFloat, ncclSum, comm, 0));
    printf("FAIL [np=%d rank %d] still running after ncclCommAbort\n", g_world, g_rank);
    exit(1);
}

int main(int argc, char** argv) {
    const char* mode = "checks";
    const char* log_dir = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--app-mpi")) g_app_mpi = true;
        else if (!strcmp(argv[i], "--id-dir") && i + 1 < argc) g_id_dir = argv[++i];
        else if (!strcmp(argv[i], "--log-dir") && i + 1 < argc) log_dir = argv[++i];
        else if (argv[i][0] != '-') mode = argv[i];
        else {
            fprintf(stderr, "usage: test_nccl_mpi [--app-mpi | --id-dir DIR] [--log-dir DIR] "
                            "[checks|mismatch|kill|plant-wrong|p2p-mismatch|abort]\n");
            return 2;
        }
    }
    if (g_app_mpi) {
        MPI_OK(MPI_Init(&argc, &argv));
        MPI_OK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
        MPI_OK(MPI_Comm_size(MPI_COMM_WORLD, &g_world));
    } else {
        const char* r = getenv("OMPI_COMM_WORLD_RANK");
        const char* w = getenv("OMPI_COMM_WORLD_SIZE");
        if (r && w) g_rank = atoi(r), g_world = atoi(w);
        if (g_world > 1 && !g_id_dir) {
            fprintf(stderr, "test_nccl_mpi: several ranks without --app-mpi need --id-dir DIR\n");
            return 2;
        }
    }
    if (log_dir) {
        std::string path = std::string(log_dir) + "/rank." + std::to_string(g_rank);
        g_out = fopen(path.c_str(), "w");
        if (!g_out) {
            fprintf(stderr, "test_nccl_mpi: cannot write %s\n", path.c_str());
            return 1;
        }
    }
    g_plant_wrong = !strcmp(mode, "plant-wrong");
    if (!strcmp(mode, "mismatch")) run_mismatch();
    else if (!strcmp(mode, "kill")) run_kill();
    else if (!strcmp(mode, "p2p-mismatch")) run_p2p_mismatch();
    else if (!strcmp(mode, "abort")) run_abort();
    else if (!strcmp(mode, "checks") || g_plant_wrong) run_checks();
    else {
        fprintf(stderr, "test_nccl_mpi: unknown mode %s\n", mode);
        return 2;
    }
    if (g_app_mpi) MPI_OK(MPI_Finalize());
    return g_failed ? 1 : 0;
}
