/* Private to worker/: the gradient exchange that the training loop drives. */
#ifndef FL_WK_INT_H
#define FL_WK_INT_H

#include <pthread.h>

#include "fl_wk.h"

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
