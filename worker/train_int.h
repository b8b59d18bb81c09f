/* Private to the training loop (train.c), its setup (train_setup.c) and its local-SGD policies
 * (train_policy.c): the trainer, the state of one fl_wk_train call. */
#ifndef FL_WK_TRAIN_INT_H
#define FL_WK_TRAIN_INT_H

#include <stdio.h>

#include "wk_int.h"

typedef struct trainer {
    const fl_wk_train_opts_t *o;
    const fl_wk_mlp_shape_t *m;
    const fl_wk_dataset_t *train;
    fl_comm_t *comm;
    int rank;
    int world;
    size_t np;
    float *params;
    float *grad;
    fl_wk_devices_t *dev;
    int nx;                    /* exchanges: one, or one per device (its own connection) */
    int nsubs;
    fl_comm_t *subs[64];       /* their sub-communicators, when nx > 1 */
    fl_wk_xchg_t *xchg[64];
    fl_wk_shards_t *shards;
    fl_wk_full_t *full;        /* --shard full: the parameters' pieces (NULL otherwise) */
    fl_wk_async_t *async;      /* --policy async (NULL otherwise) */
    bool resident;             /* parameters and optimizer on the devices (--policy sync) */
    bool resident_ranges;      /* ... each device stepping its range (--shard hybrid, grad) */
    bool keep_grad;            /* ... and the gradient too (one device, no exchange) */
    bool gathered_on_devices;  /* ... the ranges all-gathered on the devices (gather_ranges) */
    FILE *metrics;
    /* El Che (o->max_anchor > 0) */
    fl_wk_cadence_t cad;
    size_t next;        /* the host's next batch this epoch */
    double exch_ema_s;  /* exchange seconds per sync */
    long syncs;
    const fl_lr_sched_t *sched;
    double samples;     /* the job's, trained on */
    fl_wk_obs_t obs;
} trainer_t;

/* The trainer's parts from its options (model, devices, exchanges, shards, El Che, metrics):
 * FL_OK, or the first error with its detail (the options named); fl_wk_trainer_teardown frees
 * what was made either way. A training that failed (rc, why: its detail) leaves the job with
 * the error (fl_comm_abort) once its threads are stopped and before its devices are freed. */
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
