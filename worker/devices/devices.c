/* The devices of one worker process (cpu replicas, simulated or CUDA GPUs), each driven by one
 * thread for the whole run (device 0 by the training loop's, the others by their own): each
 * draws its batch from the distributed sampler (device j of rank k is data-parallel replica
 * k * L + j of world * L) and computes its gradient on its device (replica_dev.c), which lands
 * in host memory layer by layer; then the first level of the exchange, inside the host: their
 * mean (for the parameter server), a reduce-scatter in shared memory (device j sums shard j of
 * all devices' gradients, for the two-level exchange), or nothing (every device a member of the
 * flat exchange, telling layer by layer). Both training loops use it. */
#include "devices_int.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define BARRIER_S 600 /* the devices' own timeout, fl_dev_opts_init's */

static int device_job(int j, void *ud);

/* The reduce-scatter among the devices (sim: device copies; cuda: NCCL, or copies for GPUs
 * listed twice), each device's gradient kept on it for that. */
static int intra_create(fl_wk_devices_t *d, int timeout_ms)
{
    fl_dev_t *devs[FL_DEV_MAX_DEVICES];
    int rc = FL_OK;
    for (int j = 0; j < d->n && rc == FL_OK; j++) {
        devs[j] = fl_wk_rdev_dev(d->rep[j].rd);
        rc = fl_stream_create(devs[j], &d->xs[j]);
        if (rc == FL_OK)
            rc = fl_event_create(devs[j], &d->computed[j]);
        if (rc == FL_OK)
            rc = fl_event_create(devs[j], &d->gathered[j]);
        if (rc == FL_OK)
            rc = fl_event_create(devs[j], &d->reduced[j]);
        if (rc == FL_OK)
            rc = fl_event_create(devs[j], &d->updated[j]);
        fl_wk_rdev_set_intra(d->rep[j].rd, true);
    }
    char host[32];
    snprintf(host, sizeof host, "rank %d", d->rank);
    fl_intra_opts_t io;
    fl_intra_opts_init(&io);
    io.host = host; /* copied by the handle */
    if (timeout_ms > 0)
        io.timeout_ms = timeout_ms;
    if (rc == FL_OK)
        rc = fl_intra_create(devs, d->n, &io, &d->intra);
    /* The calling thread drives device 0: current again after the others' streams. */
    int brc = fl_wk_rdev_bind(d->rep[0].rd);
    return rc != FL_OK ? rc : brc;
}

static void intra_destroy(fl_wk_devices_t *d)
{
    if (d->intra != NULL)
        fl_intra_wait(d->intra, 0);
    fl_wk_devices_leg_destroy(d);
    fl_intra_destroy(&d->intra);
    for (int j = 0; j < d->n; j++) {
        fl_stream_destroy(&d->xs[j]);
        fl_event_destroy(&d->computed[j]);
        fl_event_destroy(&d->gathered[j]);
        fl_event_destroy(&d->reduced[j]);
        fl_event_destroy(&d->updated[j]);
    }
}

bool fl_wk_devices_can_keep_shards(const fl_wk_devices_t *d)
{
    return d->intra != NULL && d->local == FL_WK_LOCAL_SHARDS && d->n > 1;
}

void fl_wk_devices_shards_on_devices(fl_wk_devices_t *d)
{
    d->keep_shards = fl_wk_devices_can_keep_shards(d);
}

/* keep_shards: the reduce-scatter leaves device j [j S, (j + 1) S) of the mean, the exchange's
 * shard j is [off_j, off_j + cnt_j) (fl_shard_offset: balanced), which starts at most L - 1
 * elements lower and never ends higher: those first elements come from the devices that
 * reduced them, on stream j behind their streams' end of the reduce-scatter. */
static int fetch_shard_heads(fl_wk_devices_t *d, const fl_dptr_t *bufs, size_t S)
{
    int rc = FL_OK;
    for (int k = 0; k < d->n && rc == FL_OK; k++)
        rc = fl_event_record(d->reduced[k], d->xs[k]); /* k's part of the mean is done */
    for (int j = 0; j < d->n && rc == FL_OK; j++) {
        size_t i = fl_shard_offset(d->np, d->n, j);
        size_t end = i + fl_shard_count(d->np, d->n, j);
        size_t own = (size_t)j * S;
        while (i < end && i < own && rc == FL_OK) {
            int k = (int)(i / S);
            size_t stop = (size_t)(k + 1) * S;
            stop = stop < own ? stop : own;
            stop = stop < end ? stop : end;
            rc = fl_stream_wait(d->xs[j], d->reduced[k]);
            if (rc == FL_OK)
                rc = fl_dev_peer_copy(d->xs[j], fl_dptr_f32(bufs[j], i),
                                      fl_wk_rdev_dev(d->rep[k].rd), fl_dptr_f32(bufs[k], i),
                                      (stop - i) * sizeof(float));
            i = stop;
        }
    }
    return rc;
}

/* After every device computed (their compute streams hold the passes): the devices' mean
 * reduce-scattered on the devices, each shard copied into device 0's host buffer, as
 * reduce_shard would have left it there (the same sum, in device order, the same bits), or
 * (keep_shards) left on the devices for the exchange's top-k there. */
static int intra_reduce(fl_wk_devices_t *d)
{
    int L = d->n;
    fl_dptr_t bufs[FL_DEV_MAX_DEVICES];
    size_t S = fl_intra_shard_len(d->np, L);
    int rc = FL_OK;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        bufs[j] = fl_wk_rdev_grad_buf(d->rep[j].rd);
        rc = fl_stream_wait(d->xs[j], d->computed[j]);
    }
    if (rc == FL_OK)
        rc = fl_intra_reduce_scatter(d->intra, bufs, d->np, FL_AVG, d->xs, NULL);
    if (rc == FL_OK && d->keep_shards)
        rc = fetch_shard_heads(d, bufs, S);
    float *grad = d->rep[0].grad;
    for (int j = 0; j < L && rc == FL_OK && !d->keep_shards; j++) {
        size_t from = (size_t)j * S;
        size_t n = from < d->np ? (d->np - from < S ? d->np - from : S) : 0;
        if (n > 0)
            rc = fl_dev_d2h(d->xs[j], grad + from, fl_dptr_f32(bufs[j], from), n * sizeof(float));
    }
    if (rc == FL_OK)
        rc = fl_intra_wait(d->intra, 0);
    for (int j = 0; j < L && rc == FL_OK; j++)
        rc = fl_stream_sync(d->xs[j], 0);
    int brc = fl_wk_rdev_bind(d->rep[0].rd); /* this thread drives device 0 */
    return rc != FL_OK ? rc : brc;
}

/* Device j: its sampler (device j of rank k is replica k * L + j of world * L), its device, its
 * batch indices and its gradient buffer (device 0's is the caller's), page-locked. */
static int replica_init(fl_wk_devices_t *d, const fl_wk_train_opts_t *o, int j, int world,
                        float *grad)
{
    replica_t *r = &d->rep[j];
    int L = d->n;
    r->d = d;
    r->j = j;
    r->throttle = o->throttle[j];
    int rc;
    if ((rc = fl_sampler_init(&r->smp, d->train->n, world * L, d->rank * L + j, o->batch,
                              o->shuffle, o->seed)) != FL_OK ||
        (rc = fl_wk_rdev_create(o, j, d->train->dim, &r->rd)) != FL_OK)
        return rc;
    r->idx = malloc(o->batch * sizeof *r->idx);
    r->next_idx = malloc(o->batch * sizeof *r->next_idx);
    r->grad = j == 0 ? grad : calloc(d->np, sizeof(float));
    if (r->idx == NULL || r->next_idx == NULL || r->grad == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for device %d", j);
    /* Page-locked, so that the layers' copies out stay asynchronous on a GPU. */
    if ((rc = fl_dev_host_register(fl_wk_rdev_dev(r->rd), r->grad, d->np * sizeof(float))) != FL_OK)
        return rc;
    r->registered = true;
    return FL_OK;
}

/* The first leg inside the host on the devices (fl_intra) when it is asked for or is the
 * default; otherwise it stays in host memory. */
static int first_leg_create(fl_wk_devices_t *d, const fl_wk_train_opts_t *o)
{
    int L = d->n;
    /* By default sim only: on cuda the same code (NCCL, or copies for --gpus 0,0) has been
     * compiled but not yet run on a GPU (tests/test_intra.c's gpu build, the worker's in
     * scripts/gpu-check.sh), so GPUs keep the host-memory leg unless --first-leg devices asks.
     * With --overlap the leg goes bucket by bucket behind the layers' events
     * (devices_overlap.c). */
    if (o->first_leg == FL_WK_LEG_DEVICES && o->device == FL_DEV_CPU && L > 1)
        return fl_fail(FL_EINVAL, "--first-leg devices: cpu replicas reduce in host memory (it "
                                  "takes --device sim or cuda)");
    if (o->first_leg == FL_WK_LEG_DEVICES && d->local == FL_WK_LOCAL_NONE && L > 1)
        return fl_fail(FL_EINVAL, "--first-leg devices: --hierarchy flat has no first leg "
                                  "(every device is a member of the exchange across hosts)");
    bool on_devices = o->first_leg == FL_WK_LEG_DEVICES ||
                      (o->first_leg == FL_WK_LEG_AUTO && o->device == FL_DEV_SIM);
    if (d->local == FL_WK_LOCAL_SHARDS && L > 1 && on_devices)
        return intra_create(d, o->device_timeout_ms);
    return FL_OK;
}

int fl_wk_devices_create(const fl_mlp_shape_t *m, const fl_dataset_t *train,
                         const fl_wk_train_opts_t *o, int rank, int world, fl_wk_local_t local,
                         float *grad, fl_wk_devices_t **out)
{
    *out = NULL;
    int L = o->replicas;
    if (L < 1 || L > FL_DEV_MAX_DEVICES)
        return fl_fail(FL_EINVAL, "--cpu-replicas: %d is outside 1..%d", L, FL_DEV_MAX_DEVICES);
    fl_wk_devices_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for the devices");
    d->m = m;
    d->train = train;
    d->batch = o->batch;
    d->n = L;
    d->rank = rank;
    d->np = fl_mlp_nparams(m);
    d->local = local;
    d->max_norm = o->max_norm;
    d->tl = o->timeline;
    if (local == FL_WK_LOCAL_SHARDS && (size_t)L > d->np) {
        free(d);
        return fl_fail(FL_EINVAL, "%d devices cannot share %zu parameters", L, d->np);
    }
    int rc = FL_OK;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    d->have_barrier = true;
    for (int j = 0; j < L && rc == FL_OK; j++)
        rc = replica_init(d, o, j, world, grad);
    /* Device 0 is driven by the caller's thread (the training loop's, for the whole run), the
     * others by threads of their own: with one device no step hands work to another thread. */
    char what[48];
    snprintf(what, sizeof what, "rank %d: the devices", rank);
    if (rc == FL_OK)
        rc = fl_fanout_create(L, 1, device_job, d, what, &d->pool);
    if (rc == FL_OK)
        rc = first_leg_create(d, o);
    if (rc == FL_OK && o->max_anchor > 0 &&
        (rc = fl_sampler_init(&d->host, train->n, world, rank, o->batch, o->shuffle, o->seed)) ==
            FL_OK)
        d->have_host = true;
    if (rc != FL_OK) {
        fl_wk_devices_destroy(&d);
        return rc;
    }
    *out = d;
    return FL_OK;
}

static void wk_devices_destroy(fl_wk_devices_t **pd)
{
    if (pd == NULL || *pd == NULL)
        return;
    fl_wk_devices_t *d = *pd;
    fl_fanout_destroy(&d->pool);
    intra_destroy(d);
    for (int j = 0; j < d->n; j++) {
        replica_t *r = &d->rep[j];
        fl_sampler_deinit(&r->smp);
        if (r->registered)
            fl_dev_host_unregister(fl_wk_rdev_dev(r->rd), r->grad);
        fl_wk_bclock_deinit(&r->clock);
        fl_wk_rdev_destroy(&r->rd);
        free(r->idx);
        free(r->next_idx);
        if (j > 0)
            free(r->grad);
        free(r->one);
        free(r->own);
        fl_opt_destroy(&r->opt);
    }
    if (d->have_host)
        fl_sampler_deinit(&d->host);
    if (d->have_barrier) {
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
    }
    free(d);
    *pd = NULL;
}

void fl_wk_devices_destroy(fl_wk_devices_t **pd)
{
    fl_error_keep_begin();
    wk_devices_destroy(pd);
    fl_error_keep_end();
}

void fl_wk_devices_set_epoch(fl_wk_devices_t *d, long epoch)
{
    d->epoch = epoch;
    for (int j = 0; j < d->n; j++)
        fl_sampler_set_epoch(&d->rep[j].smp, epoch);
    if (d->have_host)
        fl_sampler_set_epoch(&d->host, epoch);
}

size_t fl_wk_devices_host_batches(const fl_wk_devices_t *d)
{
    return d->have_host ? fl_sampler_batches(&d->host) : 0;
}

size_t fl_wk_devices_batches(const fl_wk_devices_t *d)
{
    return fl_sampler_batches(&d->rep[0].smp);
}

fl_mlp_ws_t *fl_wk_devices_ws(fl_wk_devices_t *d)
{
    fl_wk_rdev_bind(d->rep[0].rd);
    return fl_wk_rdev_ws(d->rep[0].rd);
}

float *fl_wk_devices_grad(fl_wk_devices_t *d, int j)
{
    return j >= 0 && j < d->n ? d->rep[j].grad : NULL;
}

/* A layer of the device's gradient has landed: the exchange may take it. */
static void layer_tell(int layer, void *ud)
{
    replica_t *r = ud;
    r->d->ready(r->j, fl_mlp_weight_at(r->d->m, layer), r->d->ud);
}

/* A batch's tag: its epoch and index, so a batch staged ahead is never used in another epoch. */
static long batch_tag(long epoch, size_t index)
{
    return (long)(((uint64_t)epoch << 32) | (uint64_t)index);
}

/* Device j's shard of the devices' mean into device 0's buffer (grad), summed in device order
 * so every rank adds alike. Device 0 reads and writes the same elements only. */
static void reduce_shard(fl_wk_devices_t *d, int j)
{
    int L = d->n;
    size_t from = fl_shard_offset(d->np, L, j);
    size_t end = from + fl_shard_count(d->np, L, j);
    float inv = 1.0f / (float)L;
    float *grad = d->rep[0].grad;
    for (size_t i = from; i < end; i++) {
        float s = grad[i];
        for (int k = 1; k < L; k++)
            s += d->rep[k].grad[i];
        grad[i] = s * inv;
    }
}

/* Waits until all devices computed their gradients. False when the step was aborted. */
static bool all_computed(fl_wk_devices_t *d)
{
    /* Bounded like every wait: the others' passes end within the devices' own deadlines. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += BARRIER_S;
    int w = 0;
    pthread_mutex_lock(&d->mu);
    d->arrived++;
    if (d->arrived == d->n)
        pthread_cond_broadcast(&d->cv);
    while (d->arrived < d->n && !d->aborted && w != ETIMEDOUT)
        w = pthread_cond_timedwait(&d->cv, &d->mu, &dl);
    if (d->arrived < d->n) {
        d->aborted = true; /* timed out: the others must not wait for the missing one either */
        pthread_cond_broadcast(&d->cv);
    }
    bool ok = !d->aborted;
    pthread_mutex_unlock(&d->mu);
    return ok;
}

/* --throttle: the device takes `throttle` times its compute time (a slower device). */
void fl_wk_devices_throttle(const replica_t *r, int64_t t0)
{
    if (r->throttle <= 1.0)
        return;
    double ns = (double)(fl_now_ns() - t0) * (r->throttle - 1.0);
    struct timespec ts = {(time_t)(ns / 1e9), (long)fmod(ns, 1e9)};
    nanosleep(&ts, NULL);
}

/* One device's step: its gradient, then its part of the reduction inside the host. */
static void replica_step(replica_t *r)
{
    fl_wk_devices_t *d = r->d;
    if (d->cadence) {
        fl_wk_devices_cadence_batches(d, r);
        return;
    }
    bool tell = d->ready != NULL && (d->n == 1 || d->local == FL_WK_LOCAL_NONE);
    bool overlap = fl_wk_devices_overlapped(d);
    fl_wk_rdev_layer_fn tell_fn = overlap ? fl_wk_devices_layer_told : tell ? layer_tell : NULL;
    int64_t t0 = fl_now_ns();
    fl_sampler_batch(&r->smp, d->cur_batch, r->idx);
    bool ahead = d->cur_batch + 1 < fl_sampler_batches(&r->smp);
    if (ahead)
        fl_sampler_batch(&r->smp, d->cur_batch + 1, r->next_idx);
    long tag = batch_tag(d->epoch, d->cur_batch);
    const fl_mlp_src_t *src = d->full != NULL ? fl_wk_full_src(d->full, r->j) : NULL;
    bool on_device = d->keep_grad || d->intra != NULL;
    r->rc = fl_wk_rdev_grad(r->rd, src != NULL ? NULL : d->params, src, d->train, r->idx, tag,
                            ahead ? r->next_idx : NULL, tag + 1, on_device ? NULL : r->grad,
                            tell_fn, r, &r->loss, &r->correct);
    /* The pass's end, for the reduce-scatter queued after every device's (the compute stream
     * is this thread's). */
    if (r->rc == FL_OK && d->intra != NULL)
        r->rc = fl_event_record(d->computed[r->j], fl_wk_rdev_stream(r->rd));
    if (d->full != NULL)
        fl_wk_full_device_done(d->full, r->j);
    fl_obs_timeline_span(d->tl, FL_WK_TRACK_DEVICE + r->j, "compute", "device", t0, fl_now_ns());
    fl_wk_devices_throttle(r, t0);
    if (r->rc != FL_OK)
        snprintf(r->err, sizeof r->err, "%s", fl_last_error());
    if (d->n == 1 || d->local != FL_WK_LOCAL_SHARDS || d->intra != NULL || overlap)
        return;
    if (!all_computed(d))
        return;
    for (int k = 0; k < d->n; k++)
        if (d->rep[k].rc != FL_OK)
            return; /* the step failed: no reduction, nothing to exchange */
    reduce_shard(d, r->j);
    if (d->ready != NULL)
        d->ready(r->j, fl_shard_offset(d->np, d->n, r->j), d->ud);
}

/* The work of the current run on device r (a step, or the update). */
static void run_one(replica_t *r)
{
    fl_wk_devices_t *d = r->d;
    if (r->brc != FL_OK) {
        r->rc = r->brc;
        memcpy(r->err, r->berr, sizeof r->err);
        /* What the step would have told the others: its layers are not needed, and it has
         * arrived at the barrier (they then see its error and reduce nothing). */
        if (!d->updating && !d->cadence && d->full != NULL)
            fl_wk_full_device_done(d->full, r->j);
        if (!d->updating && !d->cadence && d->n > 1 && d->local == FL_WK_LOCAL_SHARDS &&
            d->intra == NULL && !fl_wk_devices_overlapped(d))
            all_computed(d);
    } else if (d->updating) {
        r->rc = fl_wk_rdev_update(r->rd, d->upd_grad, d->upd_norm, d->upd_lr);
        if (r->rc != FL_OK)
            snprintf(r->err, sizeof r->err, "%s", fl_last_error());
    } else {
        replica_step(r);
    }
}

/* Device j's part of a run. The device is current on its thread: bound once on a thread of its
 * own, which is the device's for the run (CUDA), and each time on the caller's (device 0). */
static int device_job(int j, void *ud)
{
    fl_wk_devices_t *d = ud;
    replica_t *r = &d->rep[j];
    if (j == 0 || !r->bound) {
        r->brc = fl_wk_rdev_bind(r->rd);
        snprintf(r->berr, sizeof r->berr, "%s", r->brc != FL_OK ? fl_last_error() : "");
        r->bound = true;
    }
    run_one(r);
    return r->rc;
}

/* Every device runs the run's work once; returns when all have. Each step's own waits are
 * bounded (the devices' and the collectives' deadlines), so this one is too. */
void fl_wk_devices_run_all(fl_wk_devices_t *d)
{
    /* The callers read each device's own code and text: which failure a step reports first is
     * theirs to choose (fl_wk_devices_step). */
    (void)fl_fanout_run(d->pool);
}

int fl_wk_devices_step(fl_wk_devices_t *d, const float *params, size_t batch_index,
                       fl_wk_ready_fn ready, void *ud, double *loss, size_t *correct)
{
    d->params = params;
    d->cur_batch = batch_index;
    d->ready = ready;
    d->ud = ud;
    int L = d->n;
    d->arrived = 0;
    d->aborted = false;
    memset(d->layer_told, 0, sizeof d->layer_told);
    d->reducing = fl_wk_devices_overlapped(d) && ready != NULL;
    int rc = d->full != NULL && !d->cadence ? fl_wk_full_begin(d->full) : FL_OK;
    if (rc == FL_OK)
        rc = fl_wk_devices_leg_begin(d);
    if (rc != FL_OK)
        return rc;
    fl_wk_devices_run_all(d);
    if (d->full != NULL && !d->cadence && (rc = fl_wk_full_end(d->full)) != FL_OK) {
        /* The device that stopped the step says why (the others only saw it stopped); a
         * gather's own failure says it itself. */
        int f = fl_wk_full_first_failed(d->full);
        if (f >= 0 && d->rep[f].rc != FL_OK)
            return fl_fail(d->rep[f].rc, "replica %d: %s", f, d->rep[f].err);
        return rc;
    }
    *loss = 0.0;
    *correct = 0;
    for (int j = 0; j < L; j++) {
        if (d->rep[j].rc != FL_OK)
            return fl_fail(d->rep[j].rc, "replica %d: %s", j, d->rep[j].err);
        *loss += d->rep[j].loss / L;
        *correct += d->rep[j].correct;
    }
    if (d->reducing && d->intra != NULL)
        return fl_wk_devices_leg_end(d);
    if (d->intra != NULL && d->local == FL_WK_LOCAL_SHARDS && !d->cadence) {
        if ((rc = intra_reduce(d)) != FL_OK)
            return rc;
        for (int j = 0; ready != NULL && j < L; j++)
            ready(j, fl_shard_offset(d->np, L, j), ud);
    }
    if (L > 1 && d->local == FL_WK_LOCAL_MEAN && !d->cadence) {
        for (int j = 0; j < L; j++)
            reduce_shard(d, j);
        if (ready != NULL)
            ready(0, 0, ud);
    }
    return FL_OK;
}

void fl_wk_devices_set_full(fl_wk_devices_t *d, fl_wk_full_t *z)
{
    d->full = z;
}
