/* Private to worker/: the gradient exchange that the training loop drives. */
#ifndef FL_WK_INT_H
#define FL_WK_INT_H

#include <pthread.h>

#include "fl_wk.h"
#include "fl_obs.h"
#include "fl_intra.h"

/* Checks the model against the data (inputs; every label, of both splits, below its outputs)
 * and the test split against the training data: FL_EINVAL saying what differs (a label: its
 * file, index and value). */
int fl_wk_check_model(const fl_wk_mlp_shape_t *m, const fl_wk_dataset_t *train,
                      const fl_wk_dataset_t *test);

/* ---- one device (replica_dev.c): its streams, staging and the gradient's way out ---- */

typedef struct fl_wk_rdev fl_wk_rdev_t;

/* Opens device j of o (o->device, id o->gpus[j]) for batches of o->batch samples of dim
 * features. FL_OK, or the device's error (FL_EGPU, FL_EINVAL, FL_ENOMEM) naming device j. */
int fl_wk_rdev_create(const fl_wk_train_opts_t *o, int j, size_t dim, fl_wk_rdev_t **out);
void fl_wk_rdev_destroy(fl_wk_rdev_t **r);
fl_dev_t *fl_wk_rdev_dev(const fl_wk_rdev_t *r);
fl_wk_mlp_ws_t *fl_wk_rdev_ws(fl_wk_rdev_t *r);

/* Makes the device current for the calling thread (a thread that computes on it calls it). */
int fl_wk_rdev_bind(fl_wk_rdev_t *r);

/* No batch tag: stage now, keep nothing for later. */
#define FL_WK_NO_TAG (-2L)

/* Told that layer's gradient (weight and bias) has landed in host memory. */
typedef void (*fl_wk_rdev_layer_fn)(int layer, void *ud);

/* The gradient of batch `tag` (samples idx of data; staged now unless the last call staged it
 * as its next) into the host buffer grad (every parameter written; on cpu computed there), on the host
 * parameters params (copied in; NULL with src: the layers from src). tell (may be NULL) hears
 * each layer as its copy lands, last layer first, during the backward pass where it can. When
 * this returns every layer has landed and nothing queued touches grad any more. FL_OK, a bad
 * label (FL_EINVAL), a non-finite loss (FL_ENONFINITE), a source's or the device's error.
 * next (may be NULL): the samples of batch next_tag, staged on the copy stream while this one
 * computes (the batch after, one ahead). */
int fl_wk_rdev_grad(fl_wk_rdev_t *r, const float *params, const fl_wk_mlp_src_t *src,
                    const fl_wk_dataset_t *data, const uint32_t *idx, long tag,
                    const uint32_t *next, long next_tag, float *grad, fl_wk_rdev_layer_fn tell,
                    void *ud, double *loss, size_t *correct);

/* Keeps the parameters on the device from now on (a copy of params; on cpu params itself),
 * with an optimizer of opt there over [off, off + len) (opt NULL: none, for cpu devices
 * sharing another's parameters). A range short of the model is written back into params by
 * each update (the host all-gathers it). */
int fl_wk_rdev_keep(fl_wk_rdev_t *r, const fl_opt_opts_t *opt, size_t off, size_t len,
                    float *params);
/* The resident parameters from or to the host, waited for. */
int fl_wk_rdev_put_params(fl_wk_rdev_t *r, const float *params);
/* params[off, off + len) from the host into the resident parameters, queued on the device's
 * compute stream behind its update and not waited for: the caller leaves that host range
 * unchanged until the device's next pass has run (the next step's update writes it only after
 * the pass, which waits for this copy). */
int fl_wk_rdev_put_range(fl_wk_rdev_t *r, const float *params, size_t off, size_t len);
int fl_wk_rdev_get_params(fl_wk_rdev_t *r, float *params);
fl_dev_opt_t *fl_wk_rdev_opt(fl_wk_rdev_t *r);
fl_stream_t *fl_wk_rdev_stream(fl_wk_rdev_t *r);

/* Queues the optimizer step of the resident parameters at rate lr from the host's averaged
 * gradient grad, or (grad NULL) from the gradient the last pass kept on the device, checked for
 * NaN and Inf there (FL_ENONFINITE, nothing updated) and clipped to max_norm (0: not). */
int fl_wk_rdev_update(fl_wk_rdev_t *r, const float *grad, double max_norm, double lr);

/* The device's gradient buffer and the event recorded where the backward pass finished layer
 * (valid after fl_wk_rdev_grad, until the next). */
fl_dptr_t fl_wk_rdev_grad_buf(const fl_wk_rdev_t *r);
fl_event_t *fl_wk_rdev_layer_event(const fl_wk_rdev_t *r, int layer);

/* on: the gradient stays on the device for the exchange to compress there (xchg_dev.c); tell
 * hears each layer as soon as it is queued, and the host's gradient buffer is not written. */
void fl_wk_rdev_set_compress(fl_wk_rdev_t *r, bool on);
/* The gradient stays in the device's gradient buffer (fl_wk_rdev_grad_buf, padded to
 * fl_intra_padded(np, replicas)) when grad is NULL, for the intra-host collectives, without
 * resident parameters; tell (when given) hears each layer as soon as its event
 * (fl_wk_rdev_layer_event) is recorded, for work queued behind it. */
void fl_wk_rdev_set_intra(fl_wk_rdev_t *r, bool on);

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

/* ---- El Che's clock (batch_clock.c): device time between two points of its compute stream */

typedef struct fl_wk_bclock {
    fl_event_t *t0, *t1; /* timed events, made at the first start */
} fl_wk_bclock_t;

/* start records the start on rd's compute stream; stop records the end, waits for it and gives
 * the device's seconds between the two. The device's error, FL_ENOMEM. One thread at a time
 * (the device's). deinit: NULL-safe, after the device's last use of them. */
int fl_wk_bclock_start(fl_wk_bclock_t *c, fl_wk_rdev_t *rd);
int fl_wk_bclock_stop(fl_wk_bclock_t *c, fl_wk_rdev_t *rd, double *seconds);
void fl_wk_bclock_deinit(fl_wk_bclock_t *c);

/* ---- the process's devices (devices.c) ---- */

typedef struct fl_wk_devices fl_wk_devices_t;

/* Told that device `device`'s gradient of parameters [from, n) is complete (or, with
 * FL_WK_LOCAL_SHARDS, that its shard of the local mean starting at `from` is). */
typedef void (*fl_wk_ready_fn)(int device, size_t from, void *ud);

/* What the devices of a process do with their gradients before the exchange across hosts. */
typedef enum fl_wk_local {
    FL_WK_LOCAL_MEAN = 0,   /* their mean lands in grad (device 0 tells, after the mean) */
    FL_WK_LOCAL_SHARDS = 1, /* reduce-scatter: device j writes shard j of the mean into grad and
                               tells; the caller exchanges each shard on its own connection, and
                               every device sees the whole of grad after (all-gather in shared
                               memory) */
    FL_WK_LOCAL_NONE = 2,   /* each device keeps its own gradient (device 0's is grad) and tells
                               layer by layer during its backward pass: every device is a member
                               of the flat exchange */
} fl_wk_local_t;

/* o->replicas CPU devices of rank (of world ranks) on the training data, device 0 writing its
 * gradient into grad (n parameters). FL_OK, FL_EINVAL (replicas out of range, a batch larger
 * than a replica's share), FL_ENOMEM. */
int fl_wk_devices_create(const fl_wk_mlp_shape_t *m, const fl_wk_dataset_t *train,
                         const fl_wk_train_opts_t *o, int rank, int world, fl_wk_local_t local,
                         float *grad, fl_wk_devices_t **out);
void fl_wk_devices_destroy(fl_wk_devices_t **d);

void fl_wk_devices_set_epoch(fl_wk_devices_t *d, long epoch);
size_t fl_wk_devices_batches(const fl_wk_devices_t *d);

/* A workspace for evaluation (device 0's). */
fl_wk_mlp_ws_t *fl_wk_devices_ws(fl_wk_devices_t *d);

/* The devices' memory as they count it (fl_dev_mem_info): the most any device has in use
 * (total - free) and that device's total; both 0 on cpu, whose "device" is the host. */
void fl_wk_devices_mem_used(fl_wk_devices_t *d, uint64_t *used, uint64_t *total);

/* FL_WK_LOCAL_SHARDS on the intra-host collectives, after the pass (not overlapped): whether
 * the devices can keep the reduced shards, and then keep them: after the reduce-scatter each
 * device j holds shard j of the mean (fl_shard_offset's layout: the few elements below the
 * reduce-scatter's own shard come from the device that reduced them) in its gradient buffer,
 * and nothing is copied to the host; the exchange compresses there (fl_wk_xchg_on_device). */
bool fl_wk_devices_can_keep_shards(const fl_wk_devices_t *d);
void fl_wk_devices_shards_on_devices(fl_wk_devices_t *d);

/* Device j's gradient buffer (device 0's is the caller's grad). */
float *fl_wk_devices_grad(fl_wk_devices_t *d, int j);

/* Every device computes the gradient of its batch batch_index on params, then does what its
 * fl_wk_local_t says; ready (may be NULL) hears which gradients are complete: with one device
 * layer by layer during the backward pass. Mean loss and correct predictions of the step.
 * FL_OK or the model's error (no ready call for a step that failed before its reduction). */
int fl_wk_devices_step(fl_wk_devices_t *d, const float *params, size_t batch_index,
                       fl_wk_ready_fn ready, void *ud, double *loss, size_t *correct);

/* FL_WK_LOCAL_SHARDS overlapped with the backward pass (on: the caller's exchanges reduce):
 * each step's devices tell every layer as it is done, ready hears each shard's range grow as
 * the last device finishes a layer, and the exchange calls fl_wk_devices_reduce_range on each
 * bucket before sending it, so the exchange starts during the backward pass. In host memory
 * (cpu replicas, and devices without the intra-host leg) that call reduces the bucket across
 * the devices itself; on the intra-host leg (devices_overlap.c) the last device to finish a
 * layer queues that layer's reduce-scatter on the devices and its copy to the host behind the
 * devices' layer events, and the call waits for the copies. The same bits as the reduction
 * after the pass either way. Nothing on other configurations. FL_OK, or the devices' error
 * making the leg's events (overlap then stays off). */
int fl_wk_devices_set_overlap(fl_wk_devices_t *d, bool on);
/* grad[start, start + len) = the devices' mean, during an overlapped step (else nothing); from
 * the exchange's thread, after ready named the range. FL_OK, or the devices' error (the
 * reduce-scatter or the copy failed, or did not finish within the devices' timeout: the
 * detail names the rank, the device and the operation). */
int fl_wk_devices_reduce_range(fl_wk_devices_t *d, size_t start, size_t len);
/* The first leg of the step's exchange: "host" (host memory), or the intra-host collectives'
 * implementation ("copy", "nccl"); "" with one device or no exchange inside the host.
 * *overlapped: whether it goes bucket by bucket during the backward pass. */
const char *fl_wk_devices_first_leg(const fl_wk_devices_t *d, bool *overlapped);

/* ---- El Che's cadence (cadence.c): batches per device between synchronisations ---- */

typedef struct fl_wk_cadence {
    int n;            /* devices of this host */
    int max_anchor;   /* 0: off (one batch per device per sync) */
    double overhead;  /* exchange time target, as a share of a sync's compute time */
    int anchor;       /* batches of the job's slowest device per sync */
    double slowest_s; /* the job's slowest seconds per batch at the last plan */
    double hint[64];  /* relative speeds seeding the first plan */
    double ema_s[64]; /* seconds per batch, per device (0: not measured yet) */
    int counts[64];   /* the plan: batches per device per sync */
} fl_wk_cadence_t;

/* n devices; hint (may be NULL) gives relative speeds (2: twice as fast) for the first plan. */
void fl_wk_cadence_init(fl_wk_cadence_t *c, int n, int max_anchor, double overhead,
                        const double *hint);

/* Folds one sync's mean seconds per batch of each device (0: it did none) into the EMAs. */
void fl_wk_cadence_observe(fl_wk_cadence_t *c, const double *batch_s);

/* This host's slowest device's EMA of seconds per batch. */
double fl_wk_cadence_slowest(const fl_wk_cadence_t *c);

/* Plans counts from the job's slowest seconds per batch and its longest exchange of a sync
 * (both the same on every rank; 0 when unknown): anchor = the smallest that keeps the exchange
 * under overhead x compute, within 1..max_anchor; each device the batches that fit in anchor x
 * the slowest time, at least 5% of the host's total. */
void fl_wk_cadence_plan(fl_wk_cadence_t *c, double job_slowest_s, double job_exchange_s);

/* The plan (n devices' counts) cut to the `left` batches the host has, in proportion, into
 * out. Returns the total. */
size_t fl_wk_fit_counts(const int *plan, int n, size_t left, int *out);

/* El Che (o->max_anchor > 0): the host's batches per epoch, one sequence for all its devices
 * (rank's share of the epoch, as a sampler of world ranks with the per-device batch). */
size_t fl_wk_devices_host_batches(const fl_wk_devices_t *d);

/* El Che's step: device j does counts[j] batches (0 allowed) of the host's sequence, taking
 * them after devices 0..j-1's, from batch `first`; each sums its gradients (its mean clipped
 * per device to o->max_norm when set). batch_s[j]: its mean seconds per batch (0 when it did
 * none). Loss: mean per batch; correct: over all batches. Then fl_wk_devices_combine. */
int fl_wk_devices_cadence_step(fl_wk_devices_t *d, const float *params, const int *counts,
                               size_t first, double *batch_s, double *loss, size_t *correct);

/* grad = scale x the sum of the devices' gradient sums (scale: world / the job's batches this
 * sync, so that the exchange's average over ranks weighs every batch alike); then tells ready
 * (every shard with FL_WK_LOCAL_SHARDS, else device 0 from 0). */
void fl_wk_devices_combine(fl_wk_devices_t *d, float scale, fl_wk_ready_fn ready, void *ud);

/* ---- the optimizer state as --shard splits it (shard.c) ---- */

typedef struct fl_wk_shards fl_wk_shards_t;

/* o->shard over np parameters for rank of world; cols: device t's column communicator across
 * hosts (o->replicas of them; NULL on one host), borrowed until destroy. FL_OK, FL_EINVAL (a
 * device would own nothing), FL_ENOMEM. */
int fl_wk_shards_create(const fl_wk_train_opts_t *o, size_t np, int rank, int world,
                        fl_comm_t **cols, fl_wk_shards_t **out);
void fl_wk_shards_destroy(fl_wk_shards_t **s);
const char *fl_wk_shard_name(fl_wk_shard_t m);

/* Progress line pieces (progress.c): "42% ETA 1m23s" for a job `done` (0..1) of the way, this
 * run having started at `start` and run elapsed_s; "sent 1.2 MiB (9.8x less than dense)" or
 * "nothing exchanged". */
void fl_wk_progress_eta(char *out, size_t cap, double done, double start, double elapsed_s);
void fl_wk_progress_sent(char *out, size_t cap, uint64_t sent, uint64_t raw);

/* True when gradients and parameters travel as pieces across hosts (--shard grad). */
bool fl_wk_shards_across_hosts(const fl_wk_shards_t *s);

/* --shard grad: each column reduce-scatters its device's shard of grad (averaged) in place,
 * so this host holds its pieces; nothing otherwise. Collective errors. */
int fl_wk_shards_reduce(fl_wk_shards_t *s, float *grad);

/* Clips the averaged gradient by its global norm, computed from the owned pieces. */
int fl_wk_shards_clip(fl_wk_shards_t *s, float *grad, double max_norm);

/* Whether every owned piece of grad is finite, agreed across hosts when pieces travel (one
 * allreduce): FL_OK, or FL_ENONFINITE naming the index (or another rank's piece). */
int fl_wk_shards_check(fl_wk_shards_t *s, const float *grad);

/* The optimizer step on every owned piece (all or nothing: FL_ENONFINITE naming the index). */
int fl_wk_shards_step(fl_wk_shards_t *s, float *params, const float *grad, double lr);

/* --shard grad: each column all-gathers its device's shard of params from the pieces. */
int fl_wk_shards_gather(fl_wk_shards_t *s, float *params);

/* Optimizer-state bytes of the device that holds the most. */
size_t fl_wk_shards_state_bytes(const fl_wk_shards_t *s);

/* Bytes the column legs sent, and of them to other hosts. */
void fl_wk_shards_bytes(const fl_wk_shards_t *s, uint64_t *sent, uint64_t *remote);

/* The owned ranges: how many, range t's [off, off + len), its optimizer. */
int fl_wk_shards_count(const fl_wk_shards_t *s);
void fl_wk_shards_range(const fl_wk_shards_t *s, int t, size_t *off, size_t *len);
/* Device t's shard [off, off + len): the column it reduces and gathers across hosts (--shard
 * grad), the range it owns otherwise. */
void fl_wk_shards_column(const fl_wk_shards_t *s, int t, size_t *off, size_t *len);
fl_opt_t *fl_wk_shards_opt(fl_wk_shards_t *s, int t);

/* Range t of rank (of world ranks exchanging pieces; 1 on one host) under o->shard: a pure
 * function, so rank 0 can name every rank's ranges. */
void fl_wk_shards_layout(const fl_wk_train_opts_t *o, size_t np, int world, int rank, int t,
                         size_t *off, size_t *len);

/* ---- --shard full (shard_full.c): parameters sharded too (ZeRO-3) ---- */

typedef struct fl_wk_full fl_wk_full_t;

typedef struct fl_wk_full_stats {
    uint64_t sent, remote; /* bytes of the gathers and reduce-scatters, and to other hosts */
    uint64_t gets;         /* layers the devices asked for */
    uint64_t ready;        /* of which the gather had finished before (the prefetch hid it) */
    double wait_s;         /* devices' time waiting for gathers, summed */
    size_t peak_gathered;  /* most bytes of gathered layers alive at once */
    size_t pieces;         /* parameters a device owns (its pieces, padding included) */
} fl_wk_full_stats_t;

/* Layer `unit`'s elements and the piece each of world x replicas devices owns (padded up). */
void fl_wk_full_layout(const fl_wk_mlp_shape_t *m, int world, int replicas, int unit,
                       size_t *count, size_t *piece);

/* o->replicas devices of rank (of world hosts) own their pieces of params (the same on every
 * rank); cols: device t's column across hosts (NULL on one host), borrowed until destroy. */
int fl_wk_full_create(const fl_wk_train_opts_t *o, int rank, int world, fl_comm_t **cols,
                      const float *params, fl_wk_full_t **out);
void fl_wk_full_destroy(fl_wk_full_t **z);

/* Replaces the pieces with params' (a resumed or loaded model). */
void fl_wk_full_scatter(fl_wk_full_t *z, const float *params);

/* Device t's layers for fl_wk_mlp_grad_src during a step. */
const fl_wk_mlp_src_t *fl_wk_full_src(fl_wk_full_t *z, int t);

/* A step: begin starts the gathers (a thread per column, at most one layer ahead of what every
 * device put back); each device calls device_done when its pass ended, failed or not; end waits
 * for the gathers and returns the first error (FL_ECLOSED when the devices stopped early). */
int fl_wk_full_begin(fl_wk_full_t *z);
void fl_wk_full_device_done(fl_wk_full_t *z, int t);
/* The device whose early end stopped the step, or -1 (after fl_wk_full_end). */
int fl_wk_full_first_failed(const fl_wk_full_t *z);
int fl_wk_full_end(fl_wk_full_t *z);

/* grad (the host's mean gradient, flat): each column reduce-scatters its shard of every layer
 * across hosts (averaged) into its device's gradient pieces. */
int fl_wk_full_reduce(fl_wk_full_t *z, const float *grad);

/* Clips the pieces by the global norm of the averaged gradient. */
int fl_wk_full_clip(fl_wk_full_t *z, double max_norm);

/* Every device steps its pieces (all or nothing across hosts, as fl_wk_shards_step). */
int fl_wk_full_step(fl_wk_full_t *z, double lr);

/* Every layer gathered into the flat params (evaluation, saving): every rank calls it. */
int fl_wk_full_materialize(fl_wk_full_t *z, float *params);

/* Per device: parameter bytes (its pieces plus the most gathered at once), optimizer state. */
void fl_wk_full_memory(const fl_wk_full_t *z, size_t *params, size_t *state);
void fl_wk_full_stats(const fl_wk_full_t *z, fl_wk_full_stats_t *out);

/* Parameters resident on the devices (--policy sync): each device keeps its copy of params and
 * an optimizer of opt over range j of off/len (NULL: the whole model on every device, --shard
 * none; on cpu, where the devices share host memory, params is that copy and device 0 alone
 * steps it); fl_wk_devices_step and _cadence_step then take NULL parameters. keep_grad (one
 * device, no exchange): the gradient never leaves the device. */
int fl_wk_devices_keep(fl_wk_devices_t *d, const fl_opt_opts_t *opt, float *params,
                       const size_t *off, const size_t *len, bool keep_grad);
bool fl_wk_devices_keeps_grad(const fl_wk_devices_t *d);

/* Every device steps its parameters from grad (the host's average; NULL with keep_grad), on its
 * own thread. The first device error. */
int fl_wk_devices_update(fl_wk_devices_t *d, const float *grad, double max_norm, double lr);

/* The resident parameters to the host (device 0's), or from it (every device). */
int fl_wk_devices_get_params(fl_wk_devices_t *d, float *params);
int fl_wk_devices_put_params(fl_wk_devices_t *d, const float *params);

/* Resident ranges (--shard hybrid, every range on this host): true when the devices can
 * all-gather the ranges among themselves (the first leg on the devices: the intra-host
 * collectives). fl_wk_devices_gather_ranges then sends device j's updated range [off[j],
 * off[j] + len[j]) to every other device (one broadcast per range: NCCL's, or device copies),
 * queued on the devices' intra-host streams after the update, and makes each compute stream
 * wait for them before the next pass: no host copy of the whole model per device. FL_OK or the
 * devices' error (queued work fails the next step on the device, naming it). */
bool fl_wk_devices_can_gather(const fl_wk_devices_t *d);
int fl_wk_devices_gather_ranges(fl_wk_devices_t *d, const size_t *off, const size_t *len);
/* --shard grad, pieces across hosts: device j's column [off[j], off[j] + len[j]), gathered
 * across hosts into params (host memory), copied into device j alone; the broadcasts of
 * fl_wk_devices_gather_ranges then give it to the others (the model crosses from the host to
 * the devices once, not once per device). Not waited for (fl_wk_rdev_put_range). */
int fl_wk_devices_put_columns(fl_wk_devices_t *d, const float *params, const size_t *off,
                              const size_t *len);
/* Device j's parameter buffer (resident parameters). */
fl_dptr_t fl_wk_rdev_params_buf(const fl_wk_rdev_t *r);

/* Device j's optimizer state into host (checkpoints), or host's into device j (resume; j -1:
 * every device, --shard none). */
int fl_wk_devices_opt_save(fl_wk_devices_t *d, int j, fl_opt_t *host);
int fl_wk_devices_opt_load(fl_wk_devices_t *d, int j, const fl_opt_t *host);

/* Devices compute their steps from z's gathered layers instead of a flat buffer (NULL: flat). */
void fl_wk_devices_set_full(fl_wk_devices_t *d, fl_wk_full_t *z);

/* Device j's El Che clock (batch_clock.c), for a caller driving its batches (--policy async). */
int fl_wk_devices_clock_start(fl_wk_devices_t *d, int j);
int fl_wk_devices_clock_stop(fl_wk_devices_t *d, int j, double *seconds);

/* Device j computes the gradient of the host's batch `index` (El Che's sequence) on params
 * into grad, clipped to o->max_norm when set (its workspace; --throttle applies). */
int fl_wk_devices_host_batch(fl_wk_devices_t *d, int j, const float *params, size_t index,
                             float *grad, double *loss, size_t *correct);

/* ---- --policy async (async.c): local SGD with bounded run-ahead ---- */

typedef struct fl_wk_async fl_wk_async_t;

typedef struct fl_wk_async_avg { /* one averaging */
    long index;          /* in the epoch */
    double job_batches;  /* the job's batches it averaged */
    double host_batches; /* of which this host's */
    double loss;         /* their mean loss (this host's) */
    size_t correct;      /* their correct predictions (this host's) */
    double exchange_s;   /* its allreduce */
    double wait_s;       /* the training thread's wait for this host's devices */
    double divergence;   /* ||before - after|| / ||after||, this host's device that strayed most */
} fl_wk_async_avg_t;

typedef struct fl_wk_async_stats {
    long averagings;
    int max_lead;        /* most rounds a device started ahead of the last completed averaging */
    long throttles;      /* round starts that waited at the run-ahead bound */
    double throttled_s;  /* the devices' time waiting there, summed */
    double busy_s;       /* the devices' time computing, summed */
    double exchange_s;   /* the averagings' allreduces */
    uint64_t sent, remote; /* their bytes, and of them to other hosts */
} fl_wk_async_stats_t;

typedef void (*fl_wk_async_fn)(const fl_wk_async_avg_t *avg, void *ud);

/* The devices of d (made with o->max_anchor > 0), each with its own parameters and optimizer
 * (o->opt), averaging over comm (NULL: one host) with at most o->run_ahead rounds in flight,
 * in rounds of cad's counts (re-planned every o->replan_every averagings; borrowed). */
int fl_wk_async_create(fl_wk_devices_t *d, const fl_wk_train_opts_t *o, fl_comm_t *comm,
                       size_t np, fl_wk_cadence_t *cad, fl_wk_async_t **out);
void fl_wk_async_destroy(fl_wk_async_t **a);

/* One epoch from params (the job's, the same on every rank); params end as the last averaging
 * left them and *samples counts the job's samples. on_avg hears every averaging (on the calling
 * thread). FL_OK, a device's error, a collective's error, FL_EPEER when another host failed
 * (every host stops at the same averaging). */
int fl_wk_async_epoch(fl_wk_async_t *a, float *params, const fl_lr_sched_t *sched,
                      double *samples, fl_wk_async_fn on_avg, void *ud);

/* The epoch's mean loss per batch, correct predictions and batches of this host. */
void fl_wk_async_epoch_figures(const fl_wk_async_t *a, double *loss, size_t *correct,
                               size_t *batches);
void fl_wk_async_stats(const fl_wk_async_t *a, fl_wk_async_stats_t *out);

/* ---- a rank's own state in checkpoints (ckpt_rank.c) ---- */

/* What a rank holds that no range file does: the error-feedback residuals of its exchanges
 * (top-k), and local SGD's optimizer of each device (--policy cadence and async). */
typedef struct fl_wk_rank_state {
    int nx;
    struct fl_wk_xchg *const *xchg; /* nx exchanges (those without residuals are skipped) */
    int nopt;
    fl_opt_t *opt[64];         /* nopt devices' own optimizers (0: none) */
} fl_wk_rank_state_t;

/* Writes s to dir/state-s<step>-r<rank>.safetensors (nothing when s holds nothing), with the
 * layout it was taken in (hosts: world, devices, hierarchy). FL_OK or FL_EIO naming the path. */
int fl_wk_ckpt_rank_save(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, const fl_wk_rank_state_t *s);

/* Restores s from the file of rank and step in dir when it was taken in this layout (the same
 * hosts, devices, hierarchy and exchange ranges); otherwise (another layout, an older
 * checkpoint without the file) s keeps its fresh state, and *restored says which. FL_OK,
 * FL_EPROTO (a corrupt file), FL_ENONFINITE, the device's error. */
int fl_wk_ckpt_rank_load(const char *dir, int rank, int world, const fl_wk_train_opts_t *o,
                         long step, fl_wk_rank_state_t *s, bool *restored);

/* s for a rank training with o: its nx exchanges (borrowed), and under --policy cadence or
 * async every device's own optimizer (dev's, or async's when not NULL). */
void fl_wk_rank_state_of(const fl_wk_train_opts_t *o, int nx, struct fl_wk_xchg *const *xchg,
                         struct fl_wk_devices *dev, struct fl_wk_async *async,
                         fl_wk_rank_state_t *s);

/* --resume: fl_wk_ckpt_rank_load from o->resume_dir, rank 0 saying so (unless quiet) when what s
 * holds starts afresh. Its errors. */
int fl_wk_ckpt_rank_resume(const fl_wk_train_opts_t *o, int rank, int world, long step,
                           fl_wk_rank_state_t *s);

/* Local SGD's optimizer of device j (NULL before fl_wk_devices_local_create). */
fl_opt_t *fl_wk_devices_local_opt(struct fl_wk_devices *d, int j);
fl_opt_t *fl_wk_async_opt(struct fl_wk_async *a, int j);

/* --mode ps (ckpt_rank.c): the worker's residual of its pushes at `step` (the server's), in
 * dir/state-s<step>-r<rank>.safetensors, this rank's files of other steps but `keep` removed;
 * and restored from the file of `step` when there is one of this length (*restored says). FL_OK,
 * FL_EIO naming the path, FL_EPROTO (a corrupt file), FL_ENONFINITE. */
int fl_wk_ckpt_ef_save(const char *dir, int rank, long step, long keep, const fl_cmp_ef_t *ef);
int fl_wk_ckpt_ef_load(const char *dir, int rank, long step, fl_cmp_ef_t *ef, bool *restored);
/* The same with nef residuals, one per device client (ef.0 .. ef.<nef-1>, and the file says
 * how many and where each starts): restored only into the same split (*restored false
 * otherwise, and then nothing changed). nef 1 is the file of the two calls above. */
int fl_wk_ckpt_efs_save(const char *dir, int rank, long step, long keep,
                        const fl_cmp_ef_t *const *ef, int nef);
int fl_wk_ckpt_efs_load(const char *dir, int rank, long step, fl_cmp_ef_t *const *ef, int nef,
                        bool *restored);

/* ---- --mode ps with several devices: a client per device (ps_devices.c) ---- */
#define FL_WK_PSDEV_MAX 64
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

/* mkdir -p: 0, or -1 with errno. */
int fl_wk_ckpt_mkdirs(const char *dir);

/* ---- sharded checkpoints (shard_ckpt.c) ---- */

/* A range of the flat parameters a rank owns with its optimizer state, as checkpoints name
 * them: under --shard none, grad and hybrid one per device; under full one per device and
 * layer (the padding left out). */
typedef struct fl_wk_range {
    int id;          /* its file in a checkpoint */
    int dev;         /* the device whose optimizer holds its state */
    size_t off;      /* [off, off + len) of the flat parameters */
    size_t len;
    size_t at;       /* where it starts in that optimizer's buffers */
    size_t opt_len;  /* the optimizer's length */
} fl_wk_range_t;
#define FL_WK_MAX_RANGES (64 * FL_WK_MAX_LAYERS)

/* Rank's ranges under o->shard (world: hosts exchanging pieces, 1 on one host), into out
 * (FL_WK_MAX_RANGES entries): how many. A pure function, so rank 0 can name every rank's. */
int fl_wk_ranges(const fl_wk_train_opts_t *o, size_t np, int world, int rank, fl_wk_range_t *out);

/* Writes this rank's ranges (parameters from params, optimizer state from opts[device]) to
 * dir/shard-s<step>-r<rank>-d<id>.safetensors, then (after every rank wrote, comm may be NULL on
 * one host) rank 0 writes dir/manifest.safetensors naming every range of the job and the job's
 * samples so far (the schedule's position), atomically; rank 0 then removes older steps' files,
 * the previous step's kept. own (may be NULL): this rank's own state, written beside its ranges
 * (fl_wk_ckpt_rank_save). Every rank learns whether every rank succeeded. FL_OK, FL_EIO naming
 * the path, or a collective's error. */
int fl_wk_ckpt_save(const char *dir, fl_comm_t *comm, int rank, int world,
                    const fl_wk_train_opts_t *o, const float *params, fl_opt_t *const *opts,
                    const fl_wk_rank_state_t *own, long step, int epoch, double samples);

/* Removes the temporary files that writers of this rank's checkpoint files (rank 0: and of
 * the manifest) left in dir when they were killed, unless their pid runs (fl_st_clean_tmp),
 * saying so on stdout unless quiet. Called at start, before this rank writes or reads there;
 * other ranks' files are theirs to clean (on shared storage their writers' pids are not ours
 * to check). */
void fl_wk_ckpt_clean(const char *dir, int rank, bool quiet);

/* Loads the checkpoint in dir into another layout if need be (other hosts, devices or
 * --shard): all parameters, and the optimizer state of this rank's ranges (opts[device])
 * assembled from the saved ranges that overlap them. *step, *epoch and *samples: where it was
 * taken. FL_OK; FL_EINVAL (a model or optimizer that differs, naming both); FL_EPROTO (a missing
 * or corrupt file, ranges that do not cover the parameters); FL_EIO. */
int fl_wk_ckpt_load(const char *dir, const fl_wk_train_opts_t *o, int world, int rank,
                    float *params, fl_opt_t *const *opts, long *step, int *epoch,
                    double *samples);

/* Device t's optimizer under --shard full (over its pieces, padding included). */
fl_opt_t *fl_wk_full_opt(fl_wk_full_t *z, int t);

/* --policy cadence (local SGD): every device gets its own parameters and optimizer. */
int fl_wk_devices_local_create(fl_wk_devices_t *d, const fl_opt_opts_t *opt);

/* A local round: device j starts from `start`, trains counts[j] batches of the host's sequence
 * (from batch `first`, after devices 0..j-1's) with its own optimizer at the schedule's rate of
 * step step0 + its batch index, and ends holding its delta from start; its gradient buffer gets
 * counts[j] x delta, for fl_wk_devices_combine to weigh the average. Other results as
 * fl_wk_devices_cadence_step. */
int fl_wk_devices_local_round(fl_wk_devices_t *d, const float *start, const int *counts,
                              size_t first, const fl_lr_sched_t *sched, double step0,
                              double *batch_s, double *loss, size_t *correct);

/* After the round's average (params, the averaged delta avg_delta): the weight-space divergence
 * ||before - after|| / ||after|| of the device that strayed most. */
double fl_wk_devices_divergence(const fl_wk_devices_t *d, const float *params,
                                const float *avg_delta);

/* ---- metrics and timeline of the training (wk_obs.c) ---- */

/* Timeline tracks: device j, exchange j, and the step's own (the training thread). */
#define FL_WK_TRACK_DEVICE 0
#define FL_WK_TRACK_EXCHANGE 100
#define FL_WK_TRACK_STEP 1000

typedef struct fl_wk_obs {
    fl_obs_t *obs; /* NULL: nothing is recorded */
    char labels[32];
    int steps, samples, sent, remote, recv, ratio, residual, loss, sps, compute, exposed, last,
        epoch, divergence, errors;
    int step_h, wait_h; /* histograms of step and exchange-wait times */
    int bad[FL_STAT_COUNT]; /* refused messages by kind (the bad_* stats); -1 for the others */
} fl_wk_obs_t;

typedef struct fl_wk_obs_step {
    double samples;       /* the job's, so far */
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

/* The flat gradient cut into buckets, ordered the way the backward pass fills them: bucket 0
 * holds the last parameters. An exchange thread owns the communicator and exchanges a bucket
 * as soon as it is queued (dense allreduce, or top-k with error feedback then sparse
 * allreduce), averaging across ranks in place. */
typedef struct fl_wk_xchg fl_wk_xchg_t;

typedef struct fl_wk_xchg_stats {
    uint64_t bytes_sent; /* this rank, all buckets, since creation */
    uint64_t remote_bytes; /* of which to other hosts */
    uint64_t raw_bytes;  /* what dense ring exchange would have sent */
    double busy_ms;      /* time spent exchanging, since creation */
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

/* Device j's device (for fl_wk_xchg_on_device). */
fl_wk_rdev_t *fl_wk_devices_rdev(fl_wk_devices_t *d, int j);

/* Called on the exchange's thread with each bucket's range before it is exchanged (the
 * devices' reduction of an overlapped step, fl_wk_devices_reduce_range). Set before the first
 * step. A code other than FL_OK fails the step's exchange with it (the bucket is not sent). */
typedef int (*fl_wk_xchg_prepare_fn)(size_t start, size_t len, void *ud);
void fl_wk_xchg_set_prepare(fl_wk_xchg_t *x, fl_wk_xchg_prepare_fn fn, void *ud);

/* Records each bucket's exchange on timeline track tid (o->timeline). */
void fl_wk_xchg_set_track(fl_wk_xchg_t *x, int tid);

#endif
