/* Private to worker/: the gradient exchange that the training loop drives. */
#ifndef FL_WK_INT_H
#define FL_WK_INT_H

#include <pthread.h>

#include "fl_wk.h"

/* Checks the model against the data (inputs, classes) and the test split against the training
 * data: FL_EINVAL saying what differs. */
int fl_wk_check_model(const fl_wk_mlp_shape_t *m, const fl_wk_dataset_t *train,
                      const fl_wk_dataset_t *test);

/* ---- the process's devices (devices.c) ---- */

typedef struct fl_wk_devices fl_wk_devices_t;

/* Told that the gradient of parameters [from, n) is complete. */
typedef void (*fl_wk_ready_fn)(size_t from, void *ud);

/* o->replicas CPU devices of rank (of world ranks) on the training data, device 0 writing its
 * gradient (the mean of all devices, after a step) into grad (n parameters). FL_OK,
 * FL_EINVAL (replicas out of range, a batch larger than a replica's share), FL_ENOMEM. */
int fl_wk_devices_create(const fl_wk_mlp_shape_t *m, const fl_wk_dataset_t *train,
                         const fl_wk_train_opts_t *o, int rank, int world, float *grad,
                         fl_wk_devices_t **out);
void fl_wk_devices_destroy(fl_wk_devices_t **d);

void fl_wk_devices_set_epoch(fl_wk_devices_t *d, long epoch);
size_t fl_wk_devices_batches(const fl_wk_devices_t *d);

/* A workspace for evaluation (device 0's). */
fl_wk_mlp_ws_t *fl_wk_devices_ws(fl_wk_devices_t *d);

/* Every device computes the gradient of its batch batch_index on params; the mean lands in
 * grad. ready (may be NULL) hears which parameters' gradients are complete: layer by layer
 * during the backward pass with one device, all at once after the mean with several. Mean loss
 * and correct predictions of the step. FL_OK or the model's error. */
int fl_wk_devices_step(fl_wk_devices_t *d, const float *params, size_t batch_index,
                       fl_wk_ready_fn ready, void *ud, double *loss, size_t *correct);

/* The flat gradient cut into buckets, ordered the way the backward pass fills them: bucket 0
 * holds the last parameters. An exchange thread owns the communicator and exchanges a bucket
 * as soon as it is queued (dense allreduce, or top-k with error feedback then sparse
 * allreduce), averaging across ranks in place. */
typedef struct fl_wk_xchg fl_wk_xchg_t;

typedef struct fl_wk_xchg_stats {
    uint64_t bytes_sent; /* this rank, all buckets, since creation */
    uint64_t raw_bytes;  /* what dense ring exchange would have sent */
    double busy_ms;      /* time spent exchanging, since creation */
} fl_wk_xchg_stats_t;

/* comm NULL: no exchange (local mode); the buckets still pass through in order. */
int fl_wk_xchg_create(fl_comm_t *comm, const fl_wk_mlp_shape_t *m, const fl_wk_train_opts_t *o,
                      float *grad, fl_wk_xchg_t **out);
void fl_wk_xchg_destroy(fl_wk_xchg_t **x);

/* Starts a step with top-k density d (ignored when dense). */
void fl_wk_xchg_begin(fl_wk_xchg_t *x, double density);

/* The parameters from index `from` on have their gradient: queue every bucket they complete. */
void fl_wk_xchg_ready_from(fl_wk_xchg_t *x, size_t from);

/* Waits until every bucket of the step is exchanged (bounded by the collectives' own
 * deadlines). Returns the first error of the step (its detail in fl_last_error). */
int fl_wk_xchg_wait(fl_wk_xchg_t *x);

void fl_wk_xchg_stats(const fl_wk_xchg_t *x, fl_wk_xchg_stats_t *out);

#endif
