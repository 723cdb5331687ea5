/*
 * gptc/launch.h — where this process stands among the ranks, the
 * rendezvous that hands rank 0's NCCL id to every rank without MPI, and the
 * check, before the first step, that every rank was launched alike.
 *
 * Included by train_gpt.c in section 8 (the check hashes the model, the
 * options and the data loader's files, and gathers over the Dist ranks, all
 * defined before it); train_gpt.cu uses it for NCCL's set-up, test_gpt.c
 * tests it. The rendezvous is plain POSIX (files and TCP sockets), so the
 * CPU tests run it. Defines: launch_rank_world (Slurm, Open MPI, PMI or
 * RANK/WORLD_SIZE); Rendezvous, rendezvous_parse ("file:PATH" or
 * "tcp:HOST:PORT"), rendezvous_share; RENDEZVOUS_MAGIC, RENDEZVOUS_MAX_BYTES;
 * run_fingerprint, fingerprints_differ, dist_check_agreement.
 */
#ifndef GPTC_LAUNCH_H
#define GPTC_LAUNCH_H

#include "util.h"
#include "cli.h"
#include <fcntl.h>
#include <poll.h>
#include <netdb.h>
#include <sys/socket.h>
#include <netinet/in.h>

/* Rendezvous without MPI. NCCL (train_gpt.cu) needs every rank to hold the
 * same 128-byte unique id, made by rank 0 (ncclGetUniqueId). Under mpirun,
 * or srun with PMIx, it travels by MPI_Bcast; on a cluster without PMIx the
 * ranks meet through a file on a filesystem they all see, or a TCP socket
 * on rank 0's host:
 *   file:PATH      rank 0 writes PATH (temporary name, then rename), each
 *                  other rank reads it and answers with PATH.ack<r>; rank 0
 *                  removes them all once every rank has answered.
 *   tcp:HOST:PORT  rank 0 listens on PORT; the others connect to HOST:PORT
 *                  (retrying until rank 0 is up), say who they are, and
 *                  receive the bytes.
 * Both carry a run id (GPTC_RUN_ID, else Slurm's job.step.restart-count), so
 * a file or a connection left by an earlier launch is never taken for this
 * one's, and both give up after a timeout with a message that names the
 * ranks that never came. The code is plain POSIX, so the CPU tests run it. */

#define RENDEZVOUS_MAGIC "GPTCRDV1"
#define RENDEZVOUS_MAX_BYTES 4096

typedef enum { RENDEZVOUS_FILE, RENDEZVOUS_TCP } RendezvousKind;
typedef struct {
    RendezvousKind kind;
    char path[4096];  /* file: on a filesystem every rank sees */
    char host[256];   /* tcp: rank 0's host name or address */
    int port;         /* tcp */
    double timeout_s; /* give up after this long */
    char run_id[256]; /* this launch's name; NUL-padded on the wire */
} Rendezvous;

/* Where this process stands among the ranks, from the launcher's
 * environment: Slurm, Open MPI, PMI, or plain RANK/WORLD_SIZE/LOCAL_RANK.
 * 0, or -1 when no launcher says. */
MAYBE_UNUSED static int launch_rank_world(int* rank, int* world, int* local_rank) {
    /* Open MPI first: under mpirun inside a Slurm allocation, the SLURM_ ones
     * describe mpirun's daemons, not the ranks */
    static const char* const vars[4][3] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                                           {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
                                           {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
                                           {"RANK", "WORLD_SIZE", "LOCAL_RANK"}};
    for (int i = 0; i < 4; i++) {
        const char* r = getenv(vars[i][0]);
        const char* w = getenv(vars[i][1]);
        if (!r || !w) continue;
        const char* l = getenv(vars[i][2]);
        *rank = atoi(r);
        *world = atoi(w);
        *local_rank = l ? atoi(l) : 0;
        if (*world < 1 || *rank < 0 || *rank >= *world) {
            fprintf(stderr, "error: %s=%s and %s=%s do not describe a rank of a job\n", vars[i][0], r, vars[i][1], w);
            return -1;
        }
        return 0;
    }
    return -1;
}

/* "file:PATH" or "tcp:HOST:PORT" into *rv. NULL, or what is wrong. */
MAYBE_UNUSED static const char* rendezvous_parse(Rendezvous* rv, const char* spec, double timeout_s) {
    memset(rv, 0, sizeof(*rv));
    rv->timeout_s = timeout_s;
    if (!(timeout_s > 0)) return "the rendezvous timeout must be > 0 seconds";
    if (!strncmp(spec, "file:", 5)) {
        rv->kind = RENDEZVOUS_FILE;
        if (!spec[5] || strlen(spec + 5) >= sizeof(rv->path) - 16) return "file: needs a path (on a filesystem every rank sees)";
        snprintf(rv->path, sizeof(rv->path), "%s", spec + 5);
    } else if (!strncmp(spec, "tcp:", 4)) {
        rv->kind = RENDEZVOUS_TCP;
        const char* colon = strrchr(spec + 4, ':');
        char* end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || colon == spec + 4 || (size_t)(colon - spec - 4) >= sizeof(rv->host) || *end || port < 1 || port > 65535)
            return "tcp: needs HOST:PORT, rank 0's host and a free port in 1..65535 (e.g. tcp:node001:29500)";
        memcpy(rv->host, spec + 4, (size_t)(colon - spec - 4));
        rv->port = (int)port;
    } else {
        return "the rendezvous is file:PATH or tcp:HOST:PORT";
    }
    const char* id = getenv("GPTC_RUN_ID");
    const char* job = getenv("SLURM_JOB_ID");
    if (id && id[0]) {
        snprintf(rv->run_id, sizeof(rv->run_id), "%s", id);
    } else if (job && job[0]) {
        const char* step = getenv("SLURM_STEP_ID");
        const char* restart = getenv("SLURM_RESTART_COUNT");
        snprintf(rv->run_id, sizeof(rv->run_id), "slurm-%s.%s.%s", job, step ? step : "0", restart ? restart : "0");
    } else {
        return "the rendezvous needs a run id unique to this launch: set GPTC_RUN_ID (scripts/supervise.py does; "
               "under Slurm the job and step ids serve)";
    }
    return NULL;
}

/* The record rank 0 publishes: magic, run id, world, length, bytes. A raw
 * struct on purpose: it lives for seconds and only the same binary reads it. */
typedef struct {
    char magic[8];
    char run_id[256];
    int32_t world, bytes;
    unsigned char blob[RENDEZVOUS_MAX_BYTES];
} RendezvousRecord;

static void rendezvous_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Read a whole small file into buf; bytes read, or -1. */
static long rendezvous_slurp(const char* path, void* buf, size_t cap) {
    FILE* f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

static int rendezvous_file(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    char ack[4200];
    RendezvousRecord rec;
    double deadline = time_ms() + rv->timeout_s * 1000.0;
    if (rank == 0) {
        memset(&rec, 0, sizeof(rec));
        memcpy(rec.magic, RENDEZVOUS_MAGIC, 8);
        memcpy(rec.run_id, rv->run_id, sizeof(rec.run_id));
        rec.world = world;
        rec.bytes = (int32_t)bytes;
        memcpy(rec.blob, blob, bytes);
        remove(rv->path); /* an earlier launch's: the others ignore it anyway (its run id differs) */
        WriteChunk chunk = {&rec, sizeof(rec)};
        if (write_file_atomic(rv->path, &chunk, 1) != 0) return -1;
        int missing = world - 1;
        while (missing > 0 && time_ms() < deadline) {
            missing = 0;
            for (int r = 1; r < world; r++) {
                char id[256] = {0};
                snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, r);
                if (rendezvous_slurp(ack, id, sizeof(id)) != (long)sizeof(id) || memcmp(id, rv->run_id, sizeof(id)))
                    missing++;
            }
            if (missing) rendezvous_sleep_ms(20);
        }
        for (int r = 0; r < world; r++) {
            char id[256] = {0};
            snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, r);
            int arrived = r == 0 || (rendezvous_slurp(ack, id, sizeof(id)) == (long)sizeof(id) &&
                                     !memcmp(id, rv->run_id, sizeof(id)));
            if (!arrived)
                fprintf(stderr, "error: rendezvous %s: rank %d of %d never answered within %.0f s (run id %s): is it "
                        "running, with the same GPTC_RUN_ID and a path it can see?\n", rv->path, r, world,
                        rv->timeout_s, rv->run_id);
            if (r > 0) remove(ack);
        }
        remove(rv->path);
        return missing ? -1 : 0;
    }
    int stale = 0;
    for (;;) {
        long n = rendezvous_slurp(rv->path, &rec, sizeof(rec));
        if (n == (long)sizeof(rec) && !memcmp(rec.magic, RENDEZVOUS_MAGIC, 8)) {
            if (!memcmp(rec.run_id, rv->run_id, sizeof(rec.run_id))) break;
            stale = 1;
        }
        if (time_ms() >= deadline) {
            fprintf(stderr, "error: rendezvous %s: rank %d found no record from rank 0 of run %s within %.0f s%s: "
                    "is rank 0 running, with the same GPTC_RUN_ID and path?\n", rv->path, rank, rv->run_id,
                    rv->timeout_s, stale ? " (only one of another run, ignored)" : "");
            return -1;
        }
        rendezvous_sleep_ms(20);
    }
    if (rec.world != world || rec.bytes != (int32_t)bytes) {
        fprintf(stderr, "error: rendezvous %s: rank 0 launched %d ranks with %d bytes, rank %d has %d ranks and %zu "
                "bytes: launch every rank alike\n", rv->path, rec.world, rec.bytes, rank, world, bytes);
        return -1;
    }
    memcpy(blob, rec.blob, bytes);
    snprintf(ack, sizeof(ack), "%s.ack%d", rv->path, rank);
    WriteChunk chunk = {rv->run_id, sizeof(rv->run_id)};
    return write_file_atomic(ack, &chunk, 1);
}

/* Whole reads and writes on a socket with a deadline (poll), 0 or -1. */
static int socket_io(int fd, void* buf, size_t n, int writing, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        int left = (int)(deadline - time_ms());
        struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
        if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* What a rank says when it connects, and what rank 0 answers. */
typedef struct {
    char magic[8];
    char run_id[256];
    int32_t rank, world;
} RendezvousHello;

static int rendezvous_tcp(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    double deadline = time_ms() + rv->timeout_s * 1000.0;
    char port[16];
    snprintf(port, sizeof(port), "%d", rv->port);
    if (rank == 0) {
        int fd = socket(AF_INET6, SOCK_STREAM, 0), yes = 1, no = 0;
        int v6 = fd >= 0;
        if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) {
            fprintf(stderr, "error: rendezvous: cannot create a socket: %s\n", strerror(errno));
            return -1;
        }
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        if (v6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no)); /* IPv4 clients too */
        struct sockaddr_in6 a6;
        struct sockaddr_in a4;
        memset(&a6, 0, sizeof(a6));
        memset(&a4, 0, sizeof(a4));
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t)rv->port);
        a4.sin_family = AF_INET;
        a4.sin_addr.s_addr = htonl(INADDR_ANY);
        a4.sin_port = htons((uint16_t)rv->port);
        int rc = v6 ? bind(fd, (struct sockaddr*)&a6, sizeof(a6)) : bind(fd, (struct sockaddr*)&a4, sizeof(a4));
        if (rc != 0 || listen(fd, world) != 0) {
            fprintf(stderr, "error: rendezvous: rank 0 cannot listen on port %d: %s; choose another port "
                    "(tcp:HOST:PORT)\n", rv->port, strerror(errno));
            close(fd);
            return -1;
        }
        char* arrived = (char*)calloc((size_t)world, 1);
        CHECK(arrived != NULL, "out of memory allocating %d bytes", world);
        int count = 1;
        arrived[0] = 1;
        while (count < world) {
            int left = (int)(deadline - time_ms());
            struct pollfd pfd = {fd, POLLIN, 0};
            if (left <= 0 || poll(&pfd, 1, left) <= 0) break;
            int c = accept(fd, NULL, NULL);
            if (c < 0) continue;
            RendezvousHello hello;
            int32_t status = 0; /* 0: welcome; 1: another run; 2: world or rank wrong or taken */
            double until = time_ms() + 5000.0 < deadline ? time_ms() + 5000.0 : deadline;
            if (socket_io(c, &hello, sizeof(hello), 0, until) != 0 || memcmp(hello.magic, RENDEZVOUS_MAGIC, 8)) {
                close(c); /* not one of ours (a port scan, a dead client) */
                continue;
            }
            if (memcmp(hello.run_id, rv->run_id, sizeof(hello.run_id))) status = 1;
            else if (hello.world != world || hello.rank < 1 || hello.rank >= world || arrived[hello.rank]) status = 2;
            int32_t reply[2] = {status, (int32_t)bytes};
            if (socket_io(c, reply, sizeof(reply), 1, until) == 0 && status == 0 &&
                socket_io(c, blob, bytes, 1, until) == 0) {
                arrived[hello.rank] = 1;
                count++;
            } else if (status) {
                hello.run_id[sizeof(hello.run_id) - 1] = '\0';
                fprintf(stderr, "warning: rendezvous: turned away a connection claiming rank %d of %d of run %s\n",
                        hello.rank, hello.world, hello.run_id);
            }
            close(c);
        }
        close(fd);
        for (int r = 1; r < world; r++)
            if (!arrived[r])
                fprintf(stderr, "error: rendezvous tcp: rank %d of %d never connected to port %d within %.0f s (run "
                        "id %s): is it running, with the same GPTC_RUN_ID and tcp:HOST:PORT?\n", r, world, rv->port,
                        rv->timeout_s, rv->run_id);
        free(arrived);
        return count == world ? 0 : -1;
    }
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(rv->host, port, &hints, &res);
    if (gai != 0) {
        fprintf(stderr, "error: rendezvous: cannot resolve rank 0's host \"%s\": %s\n", rv->host, gai_strerror(gai));
        return -1;
    }
    RendezvousHello hello;
    memset(&hello, 0, sizeof(hello));
    memcpy(hello.magic, RENDEZVOUS_MAGIC, 8);
    memcpy(hello.run_id, rv->run_id, sizeof(hello.run_id));
    hello.rank = rank;
    hello.world = world;
    int32_t reply[2] = {-1, 0};
    int done = 0;
    while (!done && time_ms() < deadline) { /* rank 0 may not be listening yet: retry */
        for (struct addrinfo* a = res; a && !done; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && socket_io(fd, &hello, sizeof(hello), 1, deadline) == 0 &&
                socket_io(fd, reply, sizeof(reply), 0, deadline) == 0)
                done = reply[0] != 0 || (reply[1] == (int32_t)bytes && socket_io(fd, blob, bytes, 0, deadline) == 0) ? 1 : 0;
            close(fd);
        }
        if (!done) rendezvous_sleep_ms(100);
    }
    freeaddrinfo(res);
    if (!done) {
        fprintf(stderr, "error: rendezvous tcp: rank %d reached no rank 0 at %s:%d within %.0f s: is rank 0 running "
                "there, and the port open?\n", rank, rv->host, rv->port, rv->timeout_s);
        return -1;
    }
    if (reply[0] != 0) {
        fprintf(stderr, "error: rendezvous tcp: rank 0 at %s:%d turned rank %d away: %s\n", rv->host, rv->port, rank,
                reply[0] == 1 ? "it belongs to another run (GPTC_RUN_ID differs)"
                              : "the number of ranks differs, or another process already claimed this rank");
        return -1;
    }
    return 0;
}

/* Give every rank rank 0's `bytes` bytes of `blob` (at most
 * RENDEZVOUS_MAX_BYTES). 0 on every rank, or -1 after a message. */
MAYBE_UNUSED static int rendezvous_share(const Rendezvous* rv, int rank, int world, void* blob, size_t bytes) {
    ALWAYS(bytes <= RENDEZVOUS_MAX_BYTES && rank >= 0 && rank < world);
    if (world == 1) return 0;
    return rv->kind == RENDEZVOUS_FILE ? rendezvous_file(rv, rank, world, blob, bytes)
                                       : rendezvous_tcp(rv, rank, world, blob, bytes);
}

/* Before the first step: every rank must hold the same configuration, the
 * same initial weights and the same data files, or the run would silently
 * train nonsense (or hang in a collective of the wrong size). Each rank
 * hashes the three; all compare with rank 0; on a mismatch every rank says
 * what differs and the run stops, on every rank, with no hang. */
/* The fingerprints the ranks compare: [0] the configuration (model shape
 * and training flags), [1] the initial weights, [2] the training data
 * files (names and sizes). Shared with train_gpt.cu. */
MAYBE_UNUSED static void run_fingerprint(const GPT2* model, const Options* o, int zero, int overlap,
                                         const DataLoader* train, uint64_t h[3]) {
    h[0] = h[1] = h[2] = 0xCBF29CE484222325ull;
    h[0] = fnv1a(h[0], &model->config, sizeof(GPT2Config));
    int ints[] = {o->batch_size, o->seq_len, o->total_batch_size, o->steps, o->warmup_steps, o->seed, o->shuffle,
                  o->decay_all, zero, overlap, o->hierarchical, o->qwz, o->qgz, o->qgz_feedback, o->hpz,
                  o->quant_block};
    float floats[] = {o->lr, o->final_lr_frac, o->decay_frac, o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_clip};
    h[0] = fnv1a(h[0], ints, sizeof(ints));
    h[0] = fnv1a(h[0], floats, sizeof(floats));
    h[0] = fnv1a(h[0], o->lr_schedule, strlen(o->lr_schedule));
    h[0] = fnv1a(h[0], o->topology, strlen(o->topology)); /* (gptc/zero3.h's levels) */
    h[1] = fnv1a(h[1], model->params_memory, model->num_parameters * sizeof(float));
    for (int i = 0; i < train->num_shards; i++) {
        const char* name = train->files.gl_pathv[i];
        h[2] = fnv1a(h[2], name, strlen(name));
        h[2] = fnv1a(h[2], &train->shard_tokens[i], sizeof(long long));
    }
}

/* Every rank's fingerprints (`all`: world x 3, gathered): rank 0 and each
 * rank that differs from it say what differs. 1 if any does. */
MAYBE_UNUSED static int fingerprints_differ(const uint64_t* all, int rank, int world) {
    static const char* const what[3] = {"configuration (model shape or training flags)", "initial weights",
                                        "training data (shard names or sizes)"};
    int bad = 0;
    for (int r = 1; r < world; r++)
        for (int k = 0; k < 3; k++)
            if (all[3 * r + k] != all[k]) {
                if (rank == 0 || rank == r)
                    fprintf(stderr, "error: rank %d: its %s differs from rank 0's: launch every rank with the same "
                            "flags and files\n", r, what[k]);
                bad = 1;
            }
    return bad;
}

static int dist_check_agreement(const Dist* d, const GPT2* model, const Options* o, const DataLoader* train) {
    if (d->world == 1) return 0; /* (hashing GPT-2 124M's weights takes half a second) */
    uint64_t h[3];
    run_fingerprint(model, o, d->zero, d->overlap, train, h);
#ifdef USE_MPI
    uint64_t* all = (uint64_t*)xmalloc(sizeof(uint64_t) * 3 * (size_t)d->world);
    MPI_CHECK(MPI_Allgather(h, 3, MPI_UINT64_T, all, 3, MPI_UINT64_T, MPI_COMM_WORLD));
    int bad = fingerprints_differ(all, d->rank, d->world);
    free(all);
    if (bad && d->rank != 0) fprintf(stderr, "error: rank %d: the ranks disagree (see rank 0's message); stopping\n", d->rank);
    return bad ? -1 : 0;
#else
    (void)d;
    return 0;
#endif
}

#endif /* GPTC_LAUNCH_H */
