/* worker/devices: the devices of a worker process: one device with its streams and staging
 * (replica_dev.c), the pool that drives them all (devices.c, devices_keep.c), the first leg
 * inside the host overlapped with the backward pass (devices_overlap.c), El Che's clock and
 * cadence (batch_clock.c, cadence.c) and its steps on the devices (devices_cadence.c), and the
 * choice of devices (device_select.c). */
#ifndef FL_WK_DEVICES_H
#define FL_WK_DEVICES_H

#include "fl_intra.h"
#include "fl_obs.h"
#include "wk_shard.h"

/* Timeline tracks: device j, exchange j, and the step's own (the training thread). */
#define FL_WK_TRACK_DEVICE 0
#define FL_WK_TRACK_EXCHANGE 100
#define FL_WK_TRACK_STEP 1000

/* ---- one device (replica_dev.c): its streams, staging and the gradient's way out ---- */

typedef struct fl_wk_rdev fl_wk_rdev_t;

/* Opens device j of o (o->device, id o->gpus[j]) for batches of o->batch samples of dim
 * features. FL_OK, or the device's error (FL_EGPU, FL_EINVAL, FL_ENOMEM) naming device j. */
int fl_wk_rdev_create(const fl_wk_train_opts_t *o, int j, size_t dim, fl_wk_rdev_t **out);
void fl_wk_rdev_destroy(fl_wk_rdev_t **r);
fl_dev_t *fl_wk_rdev_dev(const fl_wk_rdev_t *r);
fl_mlp_ws_t *fl_wk_rdev_ws(fl_wk_rdev_t *r);

/* Makes the device current for the calling thread (a thread that computes on it calls it). */
int fl_wk_rdev_bind(fl_wk_rdev_t *r);

/* No batch tag: stage now, keep nothing for later. */
#define FL_WK_NO_TAG (-2L)

/* Told that layer's gradient (weight and bias) has landed in host memory. */
typedef void (*fl_wk_rdev_layer_fn)(int layer, void *ud);

/* The gradient of batch `tag` (samples idx of data; staged now unless the last call staged it
 * as its next) into the host buffer grad (every parameter written; on cpu computed there), on the
 * host parameters params (copied in; NULL with src: the layers from src). tell (may be NULL) hears
 * each layer as its copy lands, last layer first, during the backward pass where it can. When
 * this returns every layer has landed and nothing queued touches grad any more. FL_OK, a bad
 * label (FL_EINVAL), a non-finite loss (FL_ENONFINITE), a source's or the device's error.
 * next (may be NULL): the samples of batch next_tag, staged on the copy stream while this one
 * computes (the batch after, one ahead). */
int fl_wk_rdev_grad(fl_wk_rdev_t *r, const float *params, const fl_mlp_src_t *src,
                    const fl_dataset_t *data, const uint32_t *idx, long tag, const uint32_t *next,
                    long next_tag, float *grad, fl_wk_rdev_layer_fn tell, void *ud, double *loss,
                    size_t *correct);

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
int fl_wk_devices_create(const fl_mlp_shape_t *m, const fl_dataset_t *train,
                         const fl_wk_train_opts_t *o, int rank, int world, fl_wk_local_t local,
                         float *grad, fl_wk_devices_t **out);
void fl_wk_devices_destroy(fl_wk_devices_t **d);

void fl_wk_devices_set_epoch(fl_wk_devices_t *d, long epoch);
size_t fl_wk_devices_batches(const fl_wk_devices_t *d);

/* A workspace for evaluation (device 0's). */
fl_mlp_ws_t *fl_wk_devices_ws(fl_wk_devices_t *d);

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
    int n;                           /* devices of this host */
    int max_anchor;                  /* 0: off (one batch per device per sync) */
    double overhead;                 /* exchange time target, as a share of a sync's compute time */
    int anchor;                      /* batches of the job's slowest device per sync */
    double slowest_s;                /* the job's slowest seconds per batch at the last plan */
    double hint[FL_DEV_MAX_DEVICES]; /* relative speeds seeding the first plan */
    double ema_s[FL_DEV_MAX_DEVICES]; /* seconds per batch, per device (0: not measured yet) */
    int counts[FL_DEV_MAX_DEVICES];   /* the plan: batches per device per sync */
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

/* Local SGD's optimizer of device j (NULL before fl_wk_devices_local_create). */
fl_opt_t *fl_wk_devices_local_opt(struct fl_wk_devices *d, int j);

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

/* Device j's device (for fl_wk_xchg_on_device). */
fl_wk_rdev_t *fl_wk_devices_rdev(fl_wk_devices_t *d, int j);

#endif
