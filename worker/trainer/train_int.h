/* worker/trainer: the training loop (train.c, the parts of its step in train_ops.c;
 * train_ps.c), its setup (train_setup.c), its local-SGD policies (train_policy.c, async.c), its
 * metrics and progress line (wk_obs.c, report.c), and the trainer, the state of one fl_wk_train
 * call. */
#ifndef FL_WK_TRAIN_INT_H
#define FL_WK_TRAIN_INT_H

#include <stdio.h>

#include "fl_obs.h"
#include "wk_ckpt.h"

/* Checks the model against the data (inputs; every label, of both splits, below its outputs)
 * and the test split against the training data: FL_EINVAL saying what differs (a label: its
 * file, index and value). */
int fl_wk_check_model(const fl_mlp_shape_t *m, const fl_dataset_t *train, const fl_dataset_t *test);

/* ---- what a step reports (report.c): the metrics line and rank 0's progress line ---- */

/* The loop that reports: each prints its own fields. */
typedef enum fl_wk_loop {
    FL_WK_LOOP_SYNC,  /* a synchronous step over the exchange (train.c) */
    FL_WK_LOOP_PS,    /* a push and pull against the parameter server (train_ps.c) */
    FL_WK_LOOP_ASYNC, /* an averaging of --policy async (train_policy.c) */
} fl_wk_loop_t;

/* The progress line's figures: the epoch's so far, and per step of this run. */
typedef struct fl_wk_progress {
    long at, of;      /* "step at/of" (of 0: not shown); async: the averaging */
    double done;      /* the job's share done (0..1), for the ETA */
    double start;     /* the share done when this run started (a resumed run) */
    double elapsed_s; /* this run's seconds */
    double loss, acc; /* the epoch's so far */
    double samples_per_s;
    double compute_ms, exchange_ms, exposed_ms; /* per step of this run */
} fl_wk_progress_t;

typedef struct fl_wk_report {
    fl_wk_loop_t loop;
    FILE *metrics;           /* the metrics line goes there (NULL: none) */
    bool progress;           /* the progress line is due (rank 0, not quiet, its interval passed) */
    int rank, epoch, epochs; /* epoch from 0 */
    long step;               /* the metrics line's step */
    double loss, acc;        /* the step's */
    double lr, density, compute_ms, exchange_ms, wait_ms, job_batches, divergence;
    uint64_t sent, raw; /* the exchange's bytes so far, and a dense ring's */
    fl_wk_progress_t p;
} fl_wk_report_t;

/* --metrics: the file this rank writes its lines to (PATH, or PATH.rank<r> with several ranks;
 * *out NULL without --metrics). FL_OK, or FL_EIO naming the path. */
int fl_wk_report_open(const fl_wk_train_opts_t *o, int rank, int world, FILE **out);
/* Writes r's metrics line and, when due, its progress line (stdout, flushed). */
void fl_wk_report_step(const fl_wk_report_t *r);
/* Rank 0's line after an epoch's evaluation (epoch from 0; secs since the run started). */
void fl_wk_report_epoch(int epoch, int epochs, const fl_wk_train_result_t *res, double secs);

/* ---- --policy async (async.c): local SGD with bounded run-ahead ---- */

typedef struct fl_wk_async fl_wk_async_t;

typedef struct fl_wk_async_avg { /* one averaging */
    long index;                  /* in the epoch */
    double job_batches;          /* the job's batches it averaged */
    double host_batches;         /* of which this host's */
    double loss;                 /* their mean loss (this host's) */
    size_t correct;              /* their correct predictions (this host's) */
    double exchange_s;           /* its allreduce */
    double wait_s;               /* the training thread's wait for this host's devices */
    double divergence; /* ||before - after|| / ||after||, this host's device that strayed most */
} fl_wk_async_avg_t;

typedef struct fl_wk_async_stats {
    long averagings;
    int max_lead;          /* most rounds a device started ahead of the last completed averaging */
    long throttles;        /* round starts that waited at the run-ahead bound */
    double throttled_s;    /* the devices' time waiting there, summed */
    double busy_s;         /* the devices' time computing, summed */
    double exchange_s;     /* the averagings' allreduces */
    uint64_t sent, remote; /* their bytes, and of them to other hosts */
} fl_wk_async_stats_t;

typedef void (*fl_wk_async_fn)(const fl_wk_async_avg_t *avg, void *ud);

/* The devices of d (made with o->max_anchor > 0), each with its own parameters and optimizer
 * (o->opt), averaging over comm (NULL: one host) with at most o->run_ahead rounds in flight,
 * in rounds of cad's counts (re-planned every o->replan_every averagings; borrowed). */
int fl_wk_async_create(fl_wk_devices_t *d, const fl_wk_train_opts_t *o, fl_comm_t *comm, size_t np,
                       fl_wk_cadence_t *cad, fl_wk_async_t **out);
void fl_wk_async_destroy(fl_wk_async_t **a);

/* One epoch from params (the job's, the same on every rank); params end as the last averaging
 * left them and *samples counts the job's samples. on_avg hears every averaging (on the calling
 * thread). FL_OK, a device's error, a collective's error, FL_EPEER when another host failed
 * (every host stops at the same averaging). */
int fl_wk_async_epoch(fl_wk_async_t *a, float *params, const fl_lr_sched_t *sched, double *samples,
                      fl_wk_async_fn on_avg, void *ud);

/* The epoch's mean loss per batch, correct predictions and batches of this host. */
void fl_wk_async_epoch_figures(const fl_wk_async_t *a, double *loss, size_t *correct,
                               size_t *batches);
void fl_wk_async_stats(const fl_wk_async_t *a, fl_wk_async_stats_t *out);

/* s for a rank training with o: its nx exchanges (borrowed), and under --policy cadence or
 * async every device's own optimizer (dev's, or async's when not NULL). */
void fl_wk_rank_state_of(const fl_wk_train_opts_t *o, int nx, struct fl_wk_xchg *const *xchg,
                         struct fl_wk_devices *dev, struct fl_wk_async *async,
                         fl_wk_rank_state_t *s);

/* --policy async: device j's own optimizer. */
fl_opt_t *fl_wk_async_opt(struct fl_wk_async *a, int j);

/* ---- metrics and timeline of the training (wk_obs.c) ---- */

typedef struct fl_wk_obs {
    fl_obs_t *obs; /* NULL: nothing is recorded */
    char labels[32];
    int steps, samples, sent, remote, recv, ratio, residual, loss, sps, compute, exposed, last,
        epoch, divergence, errors;
    int step_h, wait_h;     /* histograms of step and exchange-wait times */
    int bad[FL_STAT_COUNT]; /* refused messages by kind (the bad_* stats); -1 for the others */
} fl_wk_obs_t;

typedef struct fl_wk_obs_step {
    double samples; /* the job's, so far */
    uint64_t sent, remote, recv, raw;
    double residual;
    double loss;
    double samples_per_s;
    double compute_s;
    double exposed_s;
    double divergence;
    const fl_ctx_t *ctx; /* the communicator's, for its counters by kind (NULL: none) */
} fl_wk_obs_step_t;

/* Registers the series (labelled with the rank) in obs (NULL: a no-op recorder). */
void fl_wk_obs_init(fl_wk_obs_t *m, fl_obs_t *obs, int rank);
void fl_wk_obs_step(fl_wk_obs_t *m, const fl_wk_obs_step_t *s);
void fl_wk_obs_epoch(fl_wk_obs_t *m, int epochs);
void fl_wk_obs_error(fl_wk_obs_t *m);

typedef struct trainer {
    const fl_wk_train_opts_t *o;
    const fl_mlp_shape_t *m;
    const fl_dataset_t *train;
    fl_comm_t *comm;
    int rank;
    int world;
    size_t np;
    float *params;
    float *grad;
    fl_wk_devices_t *dev;
    int nx; /* exchanges: one, or one per device (its own connection) */
    int nsubs;
    fl_comm_t *subs[FL_DEV_MAX_DEVICES]; /* their sub-communicators, when nx > 1 */
    fl_wk_xchg_t *xchg[FL_DEV_MAX_DEVICES];
    fl_wk_shards_t *shards;
    fl_wk_full_t *full;       /* --shard full: the parameters' pieces (NULL otherwise) */
    fl_wk_async_t *async;     /* --policy async (NULL otherwise) */
    bool resident;            /* parameters and optimizer on the devices (--policy sync) */
    bool resident_ranges;     /* ... each device stepping its range (--shard hybrid, grad) */
    bool keep_grad;           /* ... and the gradient too (one device, no exchange) */
    bool gathered_on_devices; /* ... the ranges all-gathered on the devices (train_ops.c) */
    FILE *metrics;
    /* El Che (o->max_anchor > 0) */
    fl_wk_cadence_t cad;
    size_t next;       /* the host's next batch this epoch */
    double exch_ema_s; /* exchange seconds per sync */
    long syncs;
    const fl_lr_sched_t *sched;
    double samples; /* the job's, trained on */
    fl_wk_obs_t obs;
} trainer_t;

/* The trainer's parts from its options (model, devices, exchanges, shards, El Che, metrics):
 * FL_OK, or the first error with its detail (the options named); fl_wk_trainer_teardown frees
 * what was made either way, keeping the thread's error text. A training that failed (rc, why:
 * its detail) leaves the job with the error (fl_comm_abort) once its threads are stopped and
 * before its devices are freed. */
int fl_wk_trainer_setup(trainer_t *tr);
void fl_wk_trainer_teardown(trainer_t *tr, int rc, const char *why);

/* Device t's optimizer, whichever --shard holds it (checkpoints); NULL past the last. */
void fl_wk_trainer_optimizers(trainer_t *tr, fl_opt_t **opts);

/* The parameters (and with them the optimizer) go to the devices and stay there under
 * --policy sync (opts: a resumed optimizer state, loaded with them). FL_OK or the devices'
 * error. */
int fl_wk_trainer_keep(trainer_t *tr, fl_opt_t *const *opts);

/* El Che's learning rate: the schedule follows the job's batches in units of a per-batch
 * sync's, a sync of r times more batches stepping sqrt(r) times further. */
double fl_wk_cadence_lr(const trainer_t *tr, const fl_lr_sched_t *sched, double samples_before,
                        double job_batches);
/* El Che after a sync: the exchange time folded in, and every few syncs a new plan (the same on
 * every rank). FL_OK or the allreduce's error. */
int fl_wk_cadence_after(trainer_t *tr, double exchange_s);

/* ---- the parts of a step (train_ops.c), called by the loop in train.c ---- */

/* What one step computed. */
typedef struct step_out {
    double loss;
    size_t correct;
    size_t host_batches; /* this host's batches in the step */
    double job_batches;  /* the whole job's */
} step_out_t;

/* The step's exchanges: begin, wait (the first error), and their figures summed. */
void fl_wk_tr_xchg_begin(trainer_t *tr, double density);
int fl_wk_tr_xchg_wait(trainer_t *tr);
void fl_wk_tr_xchg_stats(trainer_t *tr, fl_wk_xchg_stats_t *out);
/* Hosts that exchange pieces (1 on one host): the layouts' world. */
int fl_wk_tr_piece_world(const trainer_t *tr);
/* The whole model into tr->params (a collective under --shard full). */
int fl_wk_tr_materialize(trainer_t *tr);
/* What the rank holds beyond the ranges, for its checkpoint. */
void fl_wk_tr_rank_state(trainer_t *tr, fl_wk_rank_state_t *s);
/* The devices' optimizer state into opts, for a checkpoint. */
int fl_wk_tr_save_device_state(trainer_t *tr, fl_opt_t *const *opts);
/* After a sharded update on the devices: the whole model on every device. */
int fl_wk_tr_gather_ranges(trainer_t *tr);
/* The step's update at learning rate lr: on the devices, or on the host's shards. */
int fl_wk_tr_update(trainer_t *tr, double lr);
/* The model to --save, its metadata naming the step and epoch. */
int fl_wk_tr_save(trainer_t *tr, long step, int epoch);
/* rc, agreed among the ranks: FL_OK only when every rank's was (one small allreduce). */
int fl_wk_tr_agree(trainer_t *tr, int rc);
/* One step's compute into *so, from batch *bi of nbatches (or El Che's sync); *more false when
 * the epoch is over, *t1 when the compute ended. */
int fl_wk_tr_compute(trainer_t *tr, size_t *bi, size_t nbatches, step_out_t *so, bool *more,
                     int64_t *t1);
/* The memory per device of res, as --shard and the exchange split it. */
void fl_wk_tr_memory(const trainer_t *tr, fl_wk_train_result_t *res);
/* The step's figures into the metrics registry. */
void fl_wk_tr_observe_step(trainer_t *tr, const fl_wk_xchg_stats_t *xs, double loss, double c_ms,
                           double x_ms, double divergence, int64_t t_start);

/* --policy async: what the averagings of an epoch report to. */
typedef struct async_ctx {
    trainer_t *tr;
    int ep;
    long *step;
    long first_step;
    int64_t t_start;
    int64_t t_last;
    double first_samples;
    double comm_ms;
    double divergence;
} async_ctx_t;

/* --policy async: one epoch, reported through c; the epoch's mean loss, correct count and this
 * host's batches. */
int fl_wk_async_epoch_run(trainer_t *tr, async_ctx_t *c, double *loss, size_t *correct,
                          size_t *batches);

#endif
