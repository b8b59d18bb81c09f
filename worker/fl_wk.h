/* worker: flodl-worker, what runs on each GPU host: datasets and the distributed sampler, the
 * MLP (CPU with OpenBLAS; CUDA with cuBLAS), the training loop with its gradient exchange, and
 * the gradient-exchange drill (a verified allreduce benchmark). */
#ifndef FL_WK_H
#define FL_WK_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include <flodl/comm.h>
#include <flodl/compress.h>
#include <flodl/ps.h>

#include "fl_core.h"
#include "fl_dev.h"

#ifdef __cplusplus
extern "C" {
#endif

#include "fl_data.h"
#include "fl_mlp.h"

/* ---- training (train.c, exchange.c) ---- */

typedef enum fl_wk_mode {
    FL_WK_MODE_LOCAL = 0, /* one process, no network */
    FL_WK_MODE_RING = 1,  /* gradients averaged across ranks (dense or top-k), local update */
    FL_WK_MODE_PS = 2,    /* push gradients, pull parameters (the parameter server) */
    FL_WK_MODE_DRILL = 3, /* flodl-worker's gradient-exchange drill (fl_wk_drill_run): no
                             training, so fl_wk_train and fl_wk_settings never get it */
} fl_wk_mode_t;

/* How the devices of several hosts exchange (--hierarchy). */
typedef enum fl_wk_hier {
    FL_WK_HIER_HYBRID = 0, /* two levels: reduce-scatter inside the host, device j's shard
                              across hosts on its own connection, all-gather inside the host */
    FL_WK_HIER_FLAT = 1,   /* every device its own member of one exchange across all hosts */
} fl_wk_hier_t;

/* Where several devices of a host reduce their gradients (the first leg, --first-leg). */
typedef enum fl_wk_leg {
    FL_WK_LEG_AUTO = 0,    /* the devices on sim; host memory on cpu, and on cuda until the
                              NCCL leg has run on a GPU (scripts/gpu-check.sh) */
    FL_WK_LEG_DEVICES = 1, /* the intra-host collectives on the devices (fl_intra.h: NCCL
                              between distinct GPUs, device copies on sim and for a GPU listed
                              twice); sim and cuda only */
    FL_WK_LEG_HOST = 2,    /* each device's gradient copied to host memory and reduced there */
} fl_wk_leg_t;

/* How optimizer state is split among the devices (--shard). */
typedef enum fl_wk_shard {
    FL_WK_SHARD_NONE = 0,   /* every device holds all of it (DDP) */
    FL_WK_SHARD_GRAD = 1,   /* gradients reduce-scattered, optimizer state 1/(W L) per device
                               across all hosts, updated parameters all-gathered (ZeRO-2) */
    FL_WK_SHARD_HYBRID = 2, /* 1/L per device inside the host, replicated across hosts
                               (FSDP's HYBRID_SHARD) */
    FL_WK_SHARD_FULL = 3,   /* parameters sharded too (ZeRO-3): each layer padded and split
                               over all devices of all hosts, gathered only while it computes
                               (the next layer's gather overlapping the current one) */
} fl_wk_shard_t;

/* When the devices' work is combined (--policy). */
typedef enum fl_wk_policy {
    FL_WK_POLICY_SYNC = 0,    /* gradients averaged every step (El Che's counts with anchor) */
    FL_WK_POLICY_CADENCE = 1, /* local SGD: each device trains its own copy, parameters averaged
                                 every round of El Che's counts (the anchor: --max-anchor) */
    FL_WK_POLICY_ASYNC = 2,   /* local SGD whose devices and hosts go on while a round is
                                 averaged, at most run_ahead rounds ahead of the last completed
                                 averaging */
} fl_wk_policy_t;

typedef struct fl_wk_train_opts {
    fl_wk_mode_t mode;
    fl_wk_shard_t shard;
    fl_wk_policy_t policy;
    int run_ahead;          /* --policy async: rounds a device may start beyond the last
                               completed averaging (default 1; 0: --policy cadence) */
    int replan_every;       /* El Che re-plans every this many syncs (default 4; 0: never, the
                               first plan stays: for tests) */
    fl_wk_hier_t hierarchy; /* with several devices per process (--mode ring) */
    bool ps_host_client;    /* --mode ps, several devices: the host's mean over one client
                               (--ps-clients host) instead of a client per device (false) */
    int max_anchor;         /* El Che: > 0 lets faster devices do more batches between syncs
                               (the slowest does up to max_anchor); 0: one batch each */
    double overhead_target; /* El Che: exchange time / compute time to stay under (0.1) */
    /* El Che: relative speed per device for the first plan (0: 1) */
    double speed_hint[FL_DEV_MAX_DEVICES];
    /* testing: device j takes this many times its compute time per batch (a sleep after each;
     * 0 or 1: none) */
    double throttle[FL_DEV_MAX_DEVICES];
    fl_mlp_shape_t shape;
    size_t batch; /* per device */
    int epochs;
    bool shuffle;
    uint64_t seed;        /* initialisation and sampling */
    int replicas;         /* devices of this process, each with a thread (default 1) */
    fl_dev_kind_t device; /* what they are: cpu (default), sim or cuda */
    /* sim and cuda: device j's id (default j; --gpus 0,0 gives two logical devices on one GPU) */
    int gpus[FL_DEV_MAX_DEVICES];
    int sim_jitter_us;     /* sim: random delay before each device operation (tests) */
    int device_timeout_ms; /* deadline of the collectives among the devices (fl_intra; the
                              worker's --timeout; 0: fl_intra's default, 600 s) */
    size_t sim_mem_bytes;  /* sim: each device's memory (0: the default) */
    int sim_fail_device;   /* sim, fault injection (tests): this device's sim_fail_after-th run
                              of operation sim_fail_op fails (fl_dev_opts_t); -1: none */
    char sim_fail_op[48];
    long sim_fail_after;
    int sim_stall_ms;   /* ... that run stalls this long instead of failing (a hung kernel) */
    bool sim_late_done; /* sim (tests): every poll slice times out as its event completes
                           (fl_dev_opts_t) */
    fl_opt_opts_t opt;
    fl_lr_sched_t lr;
    bool scale_lr;          /* linear scaling rule: lr * global batch / batch */
    fl_wk_leg_t first_leg;  /* several devices: where they reduce (default FL_WK_LEG_AUTO) */
    bool overlap;           /* two levels: reduce (in host memory) and exchange bucket by bucket
                               during the backward pass instead of after it (the same bits;
                               off by default: docs/two-level.md, "Overlap with the backward
                               pass") */
    double max_norm;        /* gradient clipping by global L2 norm (0: off) */
    double topk;            /* density of top-k with error feedback (0: dense) */
    int topk_warmup;        /* epochs of DGC density warm-up (0: none) */
    fl_dtype_t topk_values; /* values on the wire for top-k (float32/float16/bfloat16) */
    size_t bucket_bytes;    /* gradient buckets exchanged as the backward pass fills them */
    const char *init_path;  /* parameters to start from (NULL: seeded init) */
    const char *save_path;  /* parameters written at the end (and every save_every steps) */
    long save_every;
    const char *checkpoint_dir;       /* sharded training state written after every epoch */
    const char *resume_dir;           /* ... and read back, into any hosts, devices and --shard */
    const char *metrics_path;         /* one JSON line per step */
    struct fl_obs *obs;               /* Prometheus series updated every step (NULL: none) */
    struct fl_obs_timeline *timeline; /* phases of every device, exchange and step (NULL) */
    double progress_s;                /* seconds between progress lines (rank 0) */
    bool quiet;
} fl_wk_train_opts_t;

void fl_wk_train_opts_init(fl_wk_train_opts_t *o);

/* Resolves --device (NULL: auto) and --gpus (NULL: not given) into o->device, o->replicas and
 * o->gpus; replicas_given: --cpu-replicas was (o->replicas holds it). FL_OK, or FL_EINVAL with
 * one line naming the flag and what is missing (no GPU and why, an id beyond the host's
 * count, flags that do not go together). */
int fl_wk_device_select(const char *device, const char *gpus, bool replicas_given,
                        fl_wk_train_opts_t *o);

typedef struct fl_wk_train_result {
    int epochs;
    long steps;
    double train_loss; /* mean over the last epoch */
    double test_loss;
    double test_acc; /* after the last epoch */
    double seconds;
    double samples_per_s;  /* of the whole job */
    uint64_t bytes_sent;   /* gradient exchange, this rank (all its devices) */
    uint64_t remote_bytes; /* of which to other hosts (another host address) */
    uint64_t raw_bytes;    /* what dense exchange would have sent */
    double comm_ms;        /* per step: time spent exchanging */
    double exposed_ms;     /* per step: of which the compute did not hide */
    double compute_ms;     /* per step */
    /* Memory per device, bytes (the largest device's): parameters it holds for compute, its
     * gradient buffer, its optimizer state, its error-feedback residuals. */
    uint64_t mem_params;
    uint64_t mem_grads;
    uint64_t mem_opt_state;
    uint64_t mem_residual;
    /* ... and as the device itself counts it (fl_dev_mem_info: total - free, the largest over
     * the devices and over the samples at each epoch's end; sim: its allocations; cuda: the
     * whole GPU's, the CUDA context and other processes included). 0 on cpu. */
    uint64_t mem_device_used;
    uint64_t mem_device_total;
    double divergence;      /* --policy cadence: the last averaging's ||before - after|| /
                               ||after|| (the device that strayed most) */
    uint64_t gathers;       /* --shard full: layers the devices asked for */
    uint64_t gathers_ready; /* of which already gathered (the prefetch hid the gather) */
    double gather_wait_ms;  /* per step: the devices' wait for the others (summed) */
    int run_ahead_max;      /* --policy async: most rounds a device started beyond the last
                               completed averaging */
    long throttles;         /* ... round starts that waited at the bound */
    double throttled_ms;    /* ... and their wait, summed over devices */
    /* Several devices per host: where their gradients were reduced inside the host, "host"
     * (host memory) or the intra-host collectives' "copy" or "nccl" ("" with one device or a
     * flat exchange; a static string), and whether bucket by bucket during the backward pass
     * (--overlap) rather than after it. */
    const char *first_leg;
    bool first_leg_overlapped;
    bool params_gathered_on_devices; /* --shard hybrid|grad: the updated ranges went from
                                        device to device (the same leg), not each device's
                                        whole model from the host */
    bool topk_on_devices;            /* top-k with error feedback ran on the devices that hold the
                                        gradient (residuals there, only the pairs copied out) */
} fl_wk_train_result_t;

/* The settings every rank of the job must share (model, optimizer and schedule, batch per
 * device and device count, top-k, mode, hierarchy, shard, policy, El Che, epochs, seed, the
 * training data's sizes and a hash of its first samples), as the list fl_comm_opts_t.settings
 * takes (FL_SETTINGS_MAX bytes). FL_OK, or FL_EINVAL when it does not fit. */
int fl_wk_settings(const fl_wk_train_opts_t *t, const fl_dataset_t *train, char *out, size_t cap);

/* Trains on train and evaluates on test each epoch. comm is NULL for FL_WK_MODE_LOCAL.
 * Checks the model against the data (inputs, classes) and the init file first: FL_EINVAL with
 * the detail saying what and where. FL_OK, or a collective's, optimizer's or I/O error. */
int fl_wk_train(fl_comm_t *comm, const fl_dataset_t *train, const fl_dataset_t *test,
                const fl_wk_train_opts_t *o, fl_wk_train_result_t *res);

/* The same training against the parameter server (train_ps.c): the server holds the
 * parameters and runs the optimizer (o->opt and o->lr are not used); the worker pushes its
 * devices' mean gradient (dense, or top-k with error feedback when o->topk > 0, each rank's
 * gradient clipped by o->max_norm before it leaves) and pulls the next step's parameters. The
 * step comes from the server, also after it restarted from a checkpoint. rank and world are
 * the client's. Errors as fl_wk_train, plus the client's. */
int fl_wk_train_ps(fl_ps_client_t *client, int rank, int world, const fl_dataset_t *train,
                   const fl_dataset_t *test, const fl_wk_train_opts_t *o,
                   fl_wk_train_result_t *res);

/* ---- the gradient-exchange drill (drill.c) ---- */

typedef struct fl_wk_drill_opts {
    size_t bytes;     /* buffer size (default 64 MiB) */
    int steps;        /* allreduces to run (default 20) */
    fl_dtype_t dtype; /* default float32 */
    fl_op_t op;       /* default FL_AVG */
    bool quiet;       /* summary only */
} fl_wk_drill_opts_t;

void fl_wk_drill_opts_init(fl_wk_drill_opts_t *opts);

/* Fills a rank's step-s contribution: values k/8 with |k| < 32, so that sums over up to 2^16
 * ranks are exact in float32 whatever the order, and the check needs no tolerance. */
void fl_wk_drill_fill(void *buf, size_t count, fl_dtype_t dtype, int rank, int step);

/* Element i of the exact reduction over nranks, in float64. */
double fl_wk_drill_expected(size_t i, int nranks, int step, fl_op_t op);

/* Runs the drill on comm, printing per-step lines (rank 0, unless quiet) and a summary line.
 * Returns FL_OK, a collective's error, or FL_EPROTO when a result differs (the detail names
 * the step, element, got and expected). */
int fl_wk_drill_run(fl_comm_t *comm, const fl_wk_drill_opts_t *opts);

#ifdef __cplusplus
}
#endif

#endif
