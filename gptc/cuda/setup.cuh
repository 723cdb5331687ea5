/* gptc/cuda/setup.cuh: setting up a training run on the GPU, before its first step.
 * Included by train_gpt.cu after GpuTrainState, for main and gpu_train_setup.
 * Defines gpu_options_problem (what this build cannot do),
 * gpu_train_states_decide, gpu_train_build (the memory check, the model and
 * the data-parallel buffers on the device), gpu_memory_after_first_step,
 * gpu_standby and gpu_train_resume. */
#ifndef GPTC_CUDA_SETUP_CUH
#define GPTC_CUDA_SETUP_CUH

/* What the flags ask that this build cannot do (checked before any GPU is
 * touched). The GPU's own flags are in train_gpt.c's one table (gptc/cli.h). */
static const char* gpu_options_problem(const Options* o) {
    if (o->offload && o->zero > 0) /* (G8: the host updates the whole flat state) */
        return "--offload 1 keeps the whole optimizer state on the host: use it with --zero 0 (one GPU or plain data "
               "parallel), or drop it and shard the state across GPUs with --zero 1|2";
    /* a hot spare (gpu_train_resume) stands by as one process or as a whole job under mpirun: rank 0 reads the
     * FIFO and its word reaches the other ranks through MPI (standby_wait_ranks), which ranks that met through a
     * file or a TCP port do not share (gpu_train_states_decide catches the rest: no states, no standby) */
    if (o->standby[0] && (!strncmp(o->init, "file:", 5) || !strncmp(o->init, "tcp:", 4)))
        return "--standby with ranks that meet through --init file:/tcp: cannot stand by together (rank 0's 'go' "
               "reaches the other ranks through MPI): run the spare as one process, or build train_gpt_cu_mpi and "
               "start the whole standby job under mpirun (--init mpi)";
    /* (a build with NCCL and MPI asks nothing more of it: every flag, --zero and states included, is for it) */
#if !GPU_HAVE_NCCL
    /* without NCCL: one process on one GPU, plain (--zero 1|2 run through a communicator even alone) */
    int env_rank = 0, env_world = 1, env_local = 0;
    if (strcmp(o->init, "auto"))
        return "--init: the ranks meet to build an NCCL communicator, and " GPU_NO_NCCL_HINT;
    if (launcher_env_present() && (launch_rank_world(&env_rank, &env_world, &env_local) != 0 || env_world > 1))
        return "the launcher's environment describes several ranks, which need NCCL, and " GPU_NO_NCCL_HINT;
    if (o->zero > 0)
        return "--zero 1|2 run the sharded optimizer through an NCCL communicator (even on one GPU), and "
               GPU_NO_NCCL_HINT "; or train with --zero 0";
#endif
#ifndef USE_MPI
    if (!strcmp(o->init, "mpi"))
        return "--init mpi needs a build with MPI: make train_gpt_cu_mpi (Open MPI's mpicc); this build meets through "
               "--init file:PATH or --init tcp:HOST:PORT";
#endif
    return NULL;
}

/* Whether this run keeps training states (st->states), or why not; an
 * error when the flags ask for them anyway. 0 or -1. */
static int gpu_train_states_decide(GpuTrainState* st, const GpuComm* comm, const Options* o) {
    const char* no_states = o->output_dir[0] ? gpu_states_problem(comm, o) : "no --output-dir";
    st->states = no_states == NULL;
    if (!st->states && o->standby[0]) { /* (a spare takes the run over from its newest state: none, nothing to do) */
        fprintf(stderr, "error: --standby: a hot spare takes the run over from its training states, which this run "
                "cannot keep (%s): run the spare as one process, or as a standby job under mpirun (train_gpt_cu_mpi "
                "--init mpi)\n", no_states);
        return -1;
    }
    if (!st->states && (o->resume || o->stop_at || o->snapshot_every)) {
        fprintf(stderr, "error: --resume, --stop-at and --snapshot-every need training states, which this run cannot "
                "keep: %s\n", no_states);
        return -1;
    }
    if (!st->states && o->output_dir[0]) printf("training states: off (%s); --save-every writes model files only\n", no_states);
    return 0;
}

/* The memory plan checked against the free memory, then the model and
 * the data-parallel buffers on the device. 0 or -1. */
static int gpu_train_build(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm) {
    const GPT2Config* c = &host->config;
    int B = st->r.B, T = st->r.T;
    dp_layout(&st->dp, comm, c, o->zero, o->overlap);
    dp_zeropp_flags(&st->dp, o);
    const char* zpp = gpu_zeropp_problem(comm, o);
    if (zpp) {
        if (comm->rank == 0) fprintf(stderr, "error: %s\n", zpp);
        return -1;
    }
    GpuPlanKnobs k = gpu_plan_knobs(o, B, T, comm);
    st->plan = gpu_memory_plan_for(c, &k);
    memory_plan_print(&st->plan);
    st->free0 = gpu_memory_headroom(comm, &st->room);
    memory_headroom_print(&st->room);
    char verdict[512];
    if (!memory_check(memory_plan_total(&st->plan), st->free0, memory_headroom_total(&st->room), verdict,
                      sizeof(verdict))) {
        fprintf(stderr, "error: rank %d: %s: lower --batch-size, raise --recompute%s, or --offload 1 (--plan 1 lists "
                "what fits)\n", comm->rank, verdict, comm->world > 1 && o->zero < 3 ? ", raise --zero" : "");
        return -1;
    }
    printf("%s\n", verdict);
    size_t weights = st->dp.active ? dp_weight_elems(&st->dp.map, o->zero, host->num_parameters) : host->num_parameters;
    gpu_model_init_with(&st->g, host, B, T, o->gelu_fusion, o->recompute, o->zero == 0 || !st->dp.active, o->offload,
                        weights);
    st->have_model = 1;
    dp_init(&st->dp, &st->g, host);
    st->have_dp = 1;
    if (o->plan_check && gpu_plan_check(&st->plan, comm, "after setup") != 0) return -1;
    size_t free1, total_mem;
    CUDA_CHECK(cudaMemGetInfo(&free1, &total_mem));
    printf("memory: cudaMemGetInfo says %.0f MB taken since the context (the plan: %.0f MB; the difference is "
           "NCCL, cuBLASLt and allocator rounding), %.0f MB free\n",
           ((double)st->free0 - (double)free1) / 1048576.0, memory_plan_total(&st->plan) / 1048576.0, free1 / 1048576.0);
    printf("GELU: %s\n", st->g.gelu_fusion ? "cuBLASLt epilogues" : "own kernels");
    /* graphs capture one GPU's step; with several ranks the step meets the others' (NCCL in the hooks, the
     * loss summed on the host) and a spike rule needs the loss on the host before the update */
    const char* no_graphs = !o->cuda_graphs ? "--cuda-graphs 0"
                            : st->dp.active ? "several GPUs (not yet captured)"
                            : o->zero != 0  ? "--zero 1, 2 or 3 (not yet captured)"
                            : o->spike_z > 0.0f ? "--spike-z (the host decides each update)"
                            : o->offload ? "--offload 1: the forward waits for the host's update layer by layer, on "
                                           "events a capture cannot wait for" : NULL;
    st->graphs = no_graphs == NULL;
    if (no_graphs) printf("CUDA graphs: off (%s)\n", no_graphs);
    else printf("CUDA graphs: the step captured after the first and replayed (not yet run on a GPU; --cuda-graphs 0 "
                "turns them off)\n");
    dp_print(&st->dp, host->num_parameters, st->r.grad_accum);
    return 0;
}

/* What the headroom's allowance is for, measured after the first step. */
static void gpu_memory_after_first_step(const GpuTrainState* st) {
    size_t free1, total_mem;
    CUDA_CHECK(cudaMemGetInfo(&free1, &total_mem));
    printf("memory after the first step: %.0f MB taken beyond the plan (the headroom kept %.0f MB)\n",
           ((double)st->free0 - (double)free1 - (double)memory_plan_total(&st->plan)) / 1048576.0,
           memory_headroom_total(&st->room) / 1048576.0);
}

/* A hot spare (--standby FIFO; scripts/tests/test_cuda_spare.sh), as train_gpt.c's
 * train_setup: everything is set up by now (the device memory, cuBLASLt's
 * handles, the kernels, the NCCL communicator, the data, the snapshot slots
 * mapped: read, never written) and no lock is held; it waits for 'go' on
 * the FIFO (several ranks under mpirun: the whole job, standby_wait_ranks),
 * then takes the run's locks, and gpu_train_resume loads the newest state.
 * (On a GPU the spare holds a second copy of the run's device memory: the
 * memory check in gpu_train_build counts what the active trainer holds, so
 * a GPU without room for both refuses the spare before it waits.) 1:
 * promoted, 0: dismissed (said), -1 after a message. Collective. */
static int gpu_standby(GpuTrainState* st, const Options* o, Dist* dist) {
    ALWAYS(st->states); /* (gpu_train_states_decide refused a standby without) */
    return standby_take_over(&st->r, o, dist); /* (gptc/saver.h, as train_gpt.c's train_setup) */
}

/* The Saver, a hot spare's wait (--standby: gpu_standby), the state to
 * resume from (with training states), the random init put off until now,
 * and the weights on the device. The step to start from, -1 after a
 * message, or STANDBY_DISMISSED (train_gpt.c). */
static int gpu_train_resume(GpuTrainState* st, GPT2* host, const Options* o, GpuComm* comm) {
    Dist* dist = &comm->dist; /* rank and world for train_gpt.c's helpers; with states, the slices too */
    timing_print(dist, "communicator ready", dist->t_comm);
    st->saver.newest = st->saver.pinned = -1; /* (without states only saver_before_update sees it: a no-op then) */
    if (st->states) {
#ifdef USE_MPI
        gpu_comm_mpi_alone(comm);
#endif
        dist->zero = 0;
        dist_setup_model(dist, host); /* each rank's slice of the state: [save_lo, save_hi) */
        StartupMark mark = startup_begin();
        gpu_snapshots_init(&st->gs, host, st->g.offload);
        if (saver_init(&st->saver, dist, host, o) != 0) return -1;
        startup_end(SU_SLOTS, mark);
        st->have_saver = 1;
    }
    if (o->standby[0]) {
        int go = gpu_standby(st, o, dist);
        if (go <= 0) return go == 0 ? STANDBY_DISMISSED : -1;
    }
    timing_print(dist, "model ready", unix_ms()); /* built, its memory and the snapshot slots mapped */
    StartupMark mark = startup_begin();
    int start = st->states ? train_run_resume(&st->r, &st->saver, dist, host, o) : 0; /* as train() */
    if (start < 0) return -1;
    if (start > 0) /* the state's weights and moments; bf16 as the update of step start - 1 rounded them */
        dp_state_upload(&st->dp, host->params_memory, host->m_memory, host->v_memory, o->seed, start - 1);
    startup_end(SU_LOAD, mark);
    mark = startup_begin();
    ALWAYS(!host->init_deferred || st->states); /* (deferred only under --resume) */
    if (start == 0 && host->init_deferred) { /* no state: the init after all, and its weights to the device */
        gpt2_fill_random(host, host->init_seed);
        dp_state_upload(&st->dp, host->params_memory, NULL, NULL, o->seed, -1);
    }
    host->init_deferred = 0;
    startup_end(SU_MODEL, mark);
    timing_print(dist, "state loaded", unix_ms());
    startup_loaded(); /* (the start-up line's first step is counted from here, as train_gpt.c's) */
    heartbeat_write(o, comm->rank, start);
    return start;
}

#endif /* GPTC_CUDA_SETUP_CUH */
