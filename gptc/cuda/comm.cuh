/* gptc/cuda/comm.cuh: the ranks' start-up and their NCCL communicator.
 * Included by train_gpt.cu at its data-parallel section. Defines DP_SCALARS,
 * gpu_comm_slots, GpuLevels, GpuComm, the exit handler that aborts the
 * communicator, launcher_env_present, gpu_comm_init, gpu_comm_free,
 * gpu_comm_sum, gpu_comm_check_agreement and (MPI builds) gpu_comm_mpi_alone.
 * The levels of the machine are levels.cuh. */
#ifndef GPTC_CUDA_COMM_CUH
#define GPTC_CUDA_COMM_CUH

#define DP_SCALARS 16 /* the communicator's 8-byte slots for sums; 3 W more for the fingerprints */
static size_t gpu_comm_slots(int world) { return DP_SCALARS + 3 * (size_t)world; }

/* The levels of the machine (levels.cuh; scripts/tests/test_cuda_levels.sh): train_gpt.c's (gptc/zero3.h)
 * on NCCL. Nodes: --topology NxK (rank r on node r / K), else the ranks on
 * one host (by host name). Bytes each rank sends per level; --hierarchical's
 * communicators (see "levels" below). */
typedef struct {
    int nodes, per_node;     /* per_node: ranks in every node, 0 when the nodes differ in size */
    int node, local;         /* this rank's node and its index inside it */
    int* node_of;            /* (W) each rank's node */
    int* local_of;           /* (W) each rank's index inside its node */
    int hierarchical;        /* reductions by level (several ranks only) */
    int by_host;             /* the nodes are the hosts (no --topology) */
    int report;              /* --comm-levels 1: a line per step */
    int counting;            /* inside a training step (dp_zero_grad .. gpu_levels_step_end) */
    double sent[NUM_LEVELS]; /* bytes this rank sent at each level in this step */
    double sent_run[NUM_LEVELS];
    int steps;
    ncclComm_t intra;        /* hierarchical: this node's ranks, ranked by index (ncclCommSplit) */
    ncclComm_t inter;        /* hierarchical: the ranks with this index, one per node, ranked by node */
} GpuLevels;

typedef struct {
    int rank, world, local_rank, device;
    char how[300];       /* how the ranks met, for the log */
    int mpi;             /* MPI was started here (finalised, or aborted on failure, at the end) */
    ncclComm_t nccl;     /* NULL: one GPU, plain */
    cudaStream_t stream; /* the communication stream */
    uint64_t* d_slots;   /* device (DP_SCALARS + 3 W) */
    uint64_t* h_slots;   /* pinned host twin */
    Dist dist;           /* the same rank/world for train_gpt.c's helpers: timing lines, the --data barrier (MPI) */
    size_t free_at_start; /* device bytes free once the context exists, before the communicator */
    GpuLevels lv;        /* nodes, bytes per level, the communicators per level (gpu_levels_init) */
} GpuComm;

#ifdef USE_MPI
static int gpu_mpi_live = 0; /* MPI_Init done and MPI_Finalize not yet */
#endif

/* Runs at every exit(); does something only when the exit is not the clean
 * one (gpu_comm_free clears both flags): a CUDA_CHECK, NCCL_CHECK or CHECK
 * failed with the communicator up. Abort it, so the other ranks' collectives
 * fail instead of waiting for this rank forever; under MPI take the job down. */
static void gpu_comm_exit_handler(void) {
    if (gpu_watched_comm) {
        ncclComm_t c = gpu_watched_comm;
        gpu_watched_comm = NULL;
        fprintf(stderr, "error: exiting with the communicator up: aborting it, so the other ranks stop too\n");
        ncclResult_t r = ncclCommAbort(c);
        if (r != ncclSuccess) fprintf(stderr, "error: ncclCommAbort failed: %s\n", ncclGetErrorString(r));
    }
#ifdef USE_MPI
    if (gpu_mpi_live) {
        gpu_mpi_live = 0;
        MPI_Abort(MPI_COMM_WORLD, 1); /* no MPI_CHECK: it does not return, and must not recurse into exit */
    }
#endif
}

/* Whether a launcher's rank and size variables are set (the pairs
 * launch_rank_world reads): then its -1 means they are wrong, not absent. */
static int launcher_env_present(void) {
    static const char* const pairs[4][2] = {{"SLURM_PROCID", "SLURM_NTASKS"},
                                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                            {"PMI_RANK", "PMI_SIZE"},
                                            {"RANK", "WORLD_SIZE"}};
    for (int i = 0; i < 4; i++)
        if (getenv(pairs[i][0]) && getenv(pairs[i][1])) return 1;
    return 0;
}

/* Rank and world: from MPI (--init mpi), or from the launcher's environment
 * for a rendezvous through *rv (--init file:PATH or tcp:HOST:PORT), or one
 * process. 0, or -1 after a message. */
static int gpu_comm_meet(GpuComm* cm, const char* init, double init_timeout, Rendezvous* rv, int* argc,
                         char*** argv) {
    int env_rank = 0, env_world = 1, env_local = 0;
    int launched = launch_rank_world(&env_rank, &env_world, &env_local) == 0;
    if (!launched && launcher_env_present()) return -1; /* launch_rank_world said what is wrong */
    if (!launched) {
        env_rank = 0;
        env_world = 1;
        env_local = 0;
    }
    if (!strcmp(init, "auto")) {
#ifdef USE_MPI
        init = env_world > 1 ? "mpi" : "none";
#else
        if (env_world > 1) {
            fprintf(stderr, "error: the launcher started %d ranks (this is rank %d), but this build has no MPI for them "
                    "to meet through: pass --init file:PATH (a path every rank sees) or --init tcp:HOST:PORT (rank "
                    "0's host), or build train_gpt_cu_mpi and pass --init mpi\n", env_world, env_rank);
            return -1;
        }
        init = "none";
#endif
    }
    memset(rv, 0, sizeof(*rv));
    if (!strcmp(init, "none")) {
        snprintf(cm->how, sizeof(cm->how), "one process");
    } else if (!strcmp(init, "mpi")) {
#ifdef USE_MPI
        dist_init(&cm->dist, argc, argv); /* MPI_Init_thread, rank and size */
        cm->mpi = gpu_mpi_live = 1;
        cm->rank = cm->dist.rank;
        cm->world = cm->dist.world;
        /* srun without PMI starts each process as an MPI world of its own (under mpirun inside an
         * allocation the Slurm variables describe mpirun's daemons, so only this case is checked) */
        if (cm->world == 1 && env_world > 1) {
            fprintf(stderr, "error: MPI sees 1 rank but the launcher's environment says %d: under Slurm launch with "
                    "srun --mpi=pmix (scripts/slurm_gpu_pmix.sbatch), or without PMIx use --init tcp:HOST:PORT "
                    "(scripts/slurm_gpu_tcp.sbatch); for one GPU inside an allocation, run srun -n 1\n", env_world);
            return -1;
        }
        MPI_Comm node; /* the ranks on this machine: the local rank picks the GPU */
        MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, cm->rank, MPI_INFO_NULL, &node));
        MPI_CHECK(MPI_Comm_rank(node, &cm->local_rank));
        MPI_CHECK(MPI_Comm_free(&node));
        snprintf(cm->how, sizeof(cm->how), "MPI");
#else
        (void)argc;
        (void)argv;
        fprintf(stderr, "error: --init mpi needs a build with MPI: make train_gpt_cu_mpi (Open MPI's mpicc); this "
                "build meets through --init file:PATH or --init tcp:HOST:PORT\n");
        return -1;
#endif
    } else {
        const char* problem = rendezvous_parse(rv, init, init_timeout);
        if (problem) {
            fprintf(stderr, "error: --init %s: %s\n", init, problem);
            return -1;
        }
        if (!launched) {
            fprintf(stderr, "error: --init %s: this process does not know its rank: start one process per GPU with "
                    "srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or mpirun, or set RANK, WORLD_SIZE and "
                    "LOCAL_RANK\n", init);
            return -1;
        }
        cm->rank = env_rank;
        cm->world = env_world;
        cm->local_rank = env_local;
        snprintf(cm->how, sizeof(cm->how), "%s", init);
    }
    cm->dist.rank = cm->rank;
    cm->dist.world = cm->world;
    return 0;
}

/* Take GPU local_rank % (visible GPUs) and create its context; the free
 * bytes after it are where the memory check starts. */
static void gpu_comm_device(GpuComm* cm) {
    StartupMark mark = startup_begin(); /* the CUDA context: the start-up line's "device set-up" */
    int ndev = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ndev));
    cm->device = cm->local_rank % ndev;
    CUDA_CHECK(cudaSetDevice(cm->device));
    size_t total_mem = 0;
    CUDA_CHECK(cudaFree(0)); /* the context, now: the memory check starts from what is free after it */
    CUDA_CHECK(cudaMemGetInfo(&cm->free_at_start, &total_mem));
    startup_end(SU_DEVICE, mark);
}

/* The NCCL communicator: rank 0's id reaches the others by MPI_Bcast or the
 * rendezvous rv; then the communication stream and the scalar slots. 0 or -1. */
static int gpu_comm_nccl(GpuComm* cm, Rendezvous* rv) {
    StartupMark mark = startup_begin(); /* NCCL, the id's exchange included: the start-up line's "communicator" (with MPI_Init:
                             * dist_init) */
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    if (cm->rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
#ifdef USE_MPI
    if (cm->mpi) MPI_CHECK(MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
#endif
    if (!cm->mpi && cm->world > 1 && rendezvous_share(rv, cm->rank, cm->world, &id, sizeof(id)) != 0) return -1;
    NCCL_CHECK(ncclCommInitRank(&cm->nccl, cm->world, id, cm->rank));
    gpu_watched_comm = cm->nccl;
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&cm->stream, cudaStreamNonBlocking, greatest));
    size_t slots = gpu_comm_slots(cm->world);
    cm->d_slots = (uint64_t*)gpu_alloc(slots * sizeof(uint64_t), GMEM_COMM);
    cm->h_slots = (uint64_t*)gpu_alloc_host(slots * sizeof(uint64_t), GMEM_HOST_COMM);
    cm->dist.t_comm = unix_ms();
    startup_end(SU_COMM, mark);
    return 0;
}

/* Learn rank and world, take a GPU, and (with several ranks, or sharding on
 * one) build the NCCL communicator. `init`: auto, mpi, file:PATH or
 * tcp:HOST:PORT (--init). 0, or -1 after a message (then gpu_comm_free). */
static int gpu_comm_init(GpuComm* cm, const char* init, double init_timeout, int sharded, int* argc, char*** argv) {
    memset(cm, 0, sizeof(*cm));
    cm->world = 1;
    cm->dist.world = 1;
    cm->dist.t_start = unix_ms();
    static int handler_set = 0;
    if (!handler_set) {
        CHECK(atexit(gpu_comm_exit_handler) == 0, "cannot register the exit handler");
        handler_set = 1;
    }
    Rendezvous rv;
    if (gpu_comm_meet(cm, init, init_timeout, &rv, argc, argv) != 0) return -1;
    gpu_comm_device(cm);
    if (cm->world == 1 && !sharded) {
        cm->dist.t_comm = unix_ms();
        return 0;
    }
#if !GPU_HAVE_NCCL /* (gpu_options_problem refused this already) */
    fprintf(stderr, "error: %d rank(s)%s need an NCCL communicator, and %s\n", cm->world,
            sharded ? " under --zero 1|2" : "", GPU_NO_NCCL_HINT);
    return -1;
#endif
    return gpu_comm_nccl(cm, &rv);
}

/* End the communicator and MPI. After a failure with several ranks, abort:
 * the others may wait in a collective this rank will never join. */
static void gpu_levels_free(GpuComm* cm, int failed);
static void gpu_comm_free(GpuComm* cm, int failed) {
    gpu_levels_free(cm, failed);
    if (cm->nccl) {
        gpu_watched_comm = NULL;
        if (failed) {
            NCCL_CHECK(ncclCommAbort(cm->nccl));
        } else {
            CUDA_CHECK(cudaStreamSynchronize(cm->stream));
            NCCL_CHECK(ncclCommDestroy(cm->nccl));
            CUDA_CHECK(cudaStreamDestroy(cm->stream));
            gpu_release(cm->d_slots);
            gpu_release_host(cm->h_slots);
        }
        cm->nccl = NULL;
    }
#ifdef USE_MPI
    if (cm->mpi) {
        gpu_mpi_live = 0;
        dist_finish(&cm->dist, failed); /* MPI_Abort after a failure with several ranks, else MPI_Finalize */
        cm->mpi = 0;
    }
#endif
}

/* Sum n doubles over the ranks, in place (the host waits). */
static void gpu_comm_sum(GpuComm* cm, double* x, int n) {
    if (!cm->nccl || cm->world == 1) return;
    ALWAYS(n <= DP_SCALARS);
    memcpy(cm->h_slots, x, (size_t)n * sizeof(double));
    CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, (size_t)n * 8, cudaMemcpyHostToDevice, cm->stream));
    NCCL_CHECK(ncclAllReduce(cm->d_slots, cm->d_slots, (size_t)n, ncclFloat64, ncclSum, cm->nccl, cm->stream));
    CUDA_CHECK(cudaMemcpyAsync(cm->h_slots, cm->d_slots, (size_t)n * 8, cudaMemcpyDeviceToHost, cm->stream));
    gpu_wait(cm->stream, NULL);
    memcpy(x, cm->h_slots, (size_t)n * sizeof(double));
}

/* Before the first step, as train_gpt.c's dist_check_agreement (its
 * run_fingerprint and fingerprints_differ, through NCCL): every rank must hold the same configuration, initial
 * weights and data files, or the run would train nonsense or hang in a
 * collective of the wrong size. All ranks compare all fingerprints, so they
 * all stop together on a mismatch. */
static int gpu_comm_check_agreement(GpuComm* cm, const GPT2* model, const Options* o, int zero,
                                    const DataLoader* train) {
    if (!cm->nccl || cm->world == 1) return 0;
    uint64_t h[3];
    run_fingerprint(model, o, zero, o->overlap, train, h);
    uint64_t* all = cm->h_slots + DP_SCALARS;
    memcpy(cm->h_slots, h, sizeof(h));
    CUDA_CHECK(cudaMemcpyAsync(cm->d_slots, cm->h_slots, sizeof(h), cudaMemcpyHostToDevice, cm->stream));
    NCCL_CHECK(ncclAllGather(cm->d_slots, cm->d_slots + DP_SCALARS, 3, ncclUint64, cm->nccl, cm->stream));
    CUDA_CHECK(cudaMemcpyAsync(all, cm->d_slots + DP_SCALARS, 3 * sizeof(uint64_t) * (size_t)cm->world,
                               cudaMemcpyDeviceToHost, cm->stream));
    gpu_wait(cm->stream, NULL);
    int bad = fingerprints_differ(all, cm->rank, cm->world);
    return bad ? -1 : 0;
}


#ifdef USE_MPI
/* One process of an MPI build, not started as MPI ranks: the Saver and
 * state_resume call MPI even alone, so start it as a world of one
 * (gpu_comm_free finalises it). */
static void gpu_comm_mpi_alone(GpuComm* cm) {
    if (cm->mpi) return;
    double t_start = cm->dist.t_start, t_comm = cm->dist.t_comm;
    int up = 0;
    MPI_CHECK(MPI_Initialized(&up));
    if (up) { /* started already by another part of the process (the CPU execution's NCCL over MPI, --zero 1|2) */
        memset(&cm->dist, 0, sizeof(cm->dist));
        MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &cm->dist.rank));
        MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &cm->dist.world));
    } else {
        dist_init(&cm->dist, NULL, NULL);
    }
    cm->dist.t_start = t_start; /* the process's start and its communicator's, as gpu_comm_init measured them */
    cm->dist.t_comm = t_comm;
    cm->mpi = gpu_mpi_live = 1;
    CHECK(cm->dist.world == 1 && cm->dist.rank == 0, "MPI started for one process sees %d ranks", cm->dist.world);
}
#endif

#endif /* GPTC_CUDA_COMM_CUH */
