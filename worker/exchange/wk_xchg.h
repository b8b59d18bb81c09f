/* worker/exchange: the gradient exchange across hosts that the training loop drives: buckets
 * over the ring, dense or top-k (exchange.c), top-k with error feedback on a device
 * (xchg_dev.c), and --mode ps with a client per device (ps_devices.c). */
#ifndef FL_WK_XCHG_H
#define FL_WK_XCHG_H

#include "wk_devices.h"

/* ---- top-k with error feedback on the device (xchg_dev.c) ---- */

typedef struct fl_wk_dcmp fl_wk_dcmp_t;

/* Residuals for parameters [from, from + n) of device rd's gradient, buckets up to widest. */
int fl_wk_dcmp_create(fl_wk_rdev_t *rd, const fl_wk_train_opts_t *o, size_t from, size_t n,
                      size_t widest, fl_wk_dcmp_t **out);
void fl_wk_dcmp_destroy(fl_wk_dcmp_t **c);
/* Makes the device current for the calling thread (the exchange's). */
int fl_wk_dcmp_bind(fl_wk_dcmp_t *c);

/* The k pairs of parameters [start, start + len) after error feedback, into page-locked host
 * memory (*idx relative to start, valid until the next call), once the layer holding start was
 * computed. FL_ENONFINITE (a NaN or Inf in the gradient, or a residual that overflowed), or the
 * device's error. */
int fl_wk_dcmp_bucket(fl_wk_dcmp_t *c, size_t start, size_t len, size_t k, uint32_t **idx,
                      float **val);
double fl_wk_dcmp_residual_norm(fl_wk_dcmp_t *c);
/* The residuals (n floats of the range) to or from the host, waited for; between steps only
 * (checkpoints). The device's error; FL_ENONFINITE for a restored value that is not finite. */
int fl_wk_dcmp_residual_get(fl_wk_dcmp_t *c, float *out);
int fl_wk_dcmp_residual_put(fl_wk_dcmp_t *c, const float *in);

/* ---- --mode ps with several devices: a client per device (ps_devices.c) ---- */
typedef struct fl_wk_psdev fl_wk_psdev_t;
struct fl_ps_client;
/* parts clients split from cl (after fl_ps_client_init; parts <= its shards), each on its own
 * thread but part 0 (the caller's), with a top-k residual of its keys when o->topk > 0. FL_OK,
 * or the split's error. Destroy before cl. */
int fl_wk_psdev_create(struct fl_ps_client *cl, int parts, const fl_wk_train_opts_t *o,
                       fl_wk_psdev_t **out);
void fl_wk_psdev_destroy(fl_wk_psdev_t **x);
/* Every part pushes its keys of grad (the host's mean: dense, or its top-k at density) with
 * the host's batch and pulls its keys of params, in parallel; returns when all have, with the
 * first part's error (named: device, keys). */
int fl_wk_psdev_push_pull(fl_wk_psdev_t *x, const float *grad, uint32_t batch, double density,
                          float *params);
/* After FL_ERESYNC from fl_wk_psdev_push_pull (the parameter server was lost): the parts'
 * clients destroyed, cl rejoins the restarted server (params and its step restored) and is
 * split again into the same ranges; the residuals stay. FL_OK, or why not. */
int fl_wk_psdev_rejoin(fl_wk_psdev_t *x, struct fl_ps_client *cl, float *params);
int fl_wk_psdev_parts(const fl_wk_psdev_t *x);
uint64_t fl_wk_psdev_step(const fl_wk_psdev_t *x);
/* Part j's residual (NULL: dense). */
fl_cmp_ef_t *fl_wk_psdev_ef(fl_wk_psdev_t *x, int j);
/* The parts' bytes summed; pushes and pulls counted once per step. */
void fl_wk_psdev_stats(const fl_wk_psdev_t *x, struct fl_ps_client_stats *sum);

/* The flat gradient cut into buckets, ordered the way the backward pass fills them: bucket 0
 * holds the last parameters. An exchange thread owns the communicator and exchanges a bucket
 * as soon as it is queued (dense allreduce, or top-k with error feedback then sparse
 * allreduce), averaging across ranks in place. */
typedef struct fl_wk_xchg fl_wk_xchg_t;

typedef struct fl_wk_xchg_stats {
    uint64_t bytes_sent;   /* this rank, all buckets, since creation */
    uint64_t remote_bytes; /* of which to other hosts */
    uint64_t raw_bytes;    /* what dense ring exchange would have sent */
    double busy_ms;        /* time spent exchanging, since creation */
} fl_wk_xchg_stats_t;

/* Exchanges grad[from, from + n) (buckets planned over that range). comm NULL: no exchange
 * (local mode); the buckets still pass through in order. */
int fl_wk_xchg_create(fl_comm_t *comm, const fl_wk_train_opts_t *o, float *grad, size_t from,
                      size_t n, fl_wk_xchg_t **out);
void fl_wk_xchg_destroy(fl_wk_xchg_t **x);

/* Starts a step with top-k density d (ignored when dense). */
void fl_wk_xchg_begin(fl_wk_xchg_t *x, double density);

/* The parameters from index `from` on have their gradient: queue every bucket they complete. */
void fl_wk_xchg_ready_from(fl_wk_xchg_t *x, size_t from);

/* Waits until every bucket of the step is exchanged (bounded by the collectives' own
 * deadlines). Returns the first error of the step (its detail in fl_last_error). */
int fl_wk_xchg_wait(fl_wk_xchg_t *x);

void fl_wk_xchg_stats(const fl_wk_xchg_t *x, fl_wk_xchg_stats_t *out);

/* The L2 norm of the error-feedback residuals (0 when dense). Between steps only. */
double fl_wk_xchg_residual_norm(const fl_wk_xchg_t *x);

/* Whether the exchange keeps error-feedback residuals (top-k), and the range it exchanges. */
bool fl_wk_xchg_has_residual(const fl_wk_xchg_t *x);
void fl_wk_xchg_range(const fl_wk_xchg_t *x, size_t *from, size_t *n);

/* The residuals of the range (n floats, parameter from first; wherever they live, host or
 * device) into out, or restored from in. Between steps only. FL_OK, FL_EINVAL (dense), the
 * device's error, FL_ENONFINITE (a restored value that is not finite). */
int fl_wk_xchg_residual_get(fl_wk_xchg_t *x, float *out);
int fl_wk_xchg_residual_put(fl_wk_xchg_t *x, const float *in);

/* Compresses on device rd instead of the host (top-k only): the buckets come from rd's
 * gradient, which must be the range's (one device, or --hierarchy flat). */
int fl_wk_xchg_on_device(fl_wk_xchg_t *x, fl_wk_rdev_t *rd);
/* Whether it does (fl_wk_xchg_on_device succeeded on a top-k exchange). */
bool fl_wk_xchg_on_device_p(const fl_wk_xchg_t *x);

/* Called on the exchange's thread with each bucket's range before it is exchanged (the
 * devices' reduction of an overlapped step, fl_wk_devices_reduce_range). Set before the first
 * step. A code other than FL_OK fails the step's exchange with it (the bucket is not sent). */
typedef int (*fl_wk_xchg_prepare_fn)(size_t start, size_t len, void *ud);
void fl_wk_xchg_set_prepare(fl_wk_xchg_t *x, fl_wk_xchg_prepare_fn fn, void *ud);

/* Records each bucket's exchange on timeline track tid (o->timeline). */
void fl_wk_xchg_set_track(fl_wk_xchg_t *x, int tid);

#endif
