/* The two-level exchange's first leg overlapped with the backward pass: every device tells each
 * layer as its pass finishes it (last layer first), the last device to finish a layer makes the
 * parameters from there on ready for every shard reaching there, and each shard's exchange
 * thread calls fl_wk_devices_reduce_range on a bucket just before sending it, while the devices
 * compute the earlier layers. Two legs, the same bits as the reduction after the whole pass:
 * - host memory (cpu replicas, and devices whose layers are copied out behind their events):
 *   the exchange thread reduces the bucket across the devices' host buffers itself, with the
 *   arithmetic of the barrier's reduction;
 * - the intra-host collectives (sim's device copies, NCCL): the last device to finish layer l
 *   queues that layer's reduce-scatter (one fl_intra call per layer bucket) on the devices' own
 *   streams behind every device's event for the layer, then each device's reduced piece's copy
 *   to the host and an event; the exchange thread waits for those events. Bucket edges are the
 *   layers' starts rounded up to a multiple of L, so no bucket but the last has padding, and the
 *   last one's is the gradient buffers' zero padding. */
#include "devices_int.h"

#include <pthread.h>
#include <stdio.h>

static size_t round_up(size_t x, size_t L)
{
    return (x + L - 1) / L * L;
}

static void leg_destroy(fl_wk_devices_t *d)
{
    for (int l = 0; l < FL_MLP_MAX_LAYERS; l++)
        for (int j = 0; j < d->n; j++)
            fl_event_destroy(&d->landed[l][j]);
    if (d->have_leg_mu)
        pthread_mutex_destroy(&d->leg_mu);
    d->have_leg_mu = false;
}

/* The buckets of the intra-host leg and an event per bucket and device. */
static int leg_create(fl_wk_devices_t *d)
{
    int nl = d->m->nlayers;
    size_t L = (size_t)d->n;
    d->leg_edge[0] = 0;
    for (int l = 1; l < nl; l++) {
        size_t e = round_up(fl_mlp_weight_at(d->m, l), L);
        d->leg_edge[l] = e < d->np ? e : d->np;
    }
    d->leg_edge[nl] = d->np;
    pthread_mutex_init(&d->leg_mu, NULL);
    d->have_leg_mu = true;
    int rc = FL_OK;
    for (int l = 0; l < nl && rc == FL_OK; l++)
        for (int j = 0; j < d->n && rc == FL_OK; j++)
            rc = fl_event_create(fl_wk_rdev_dev(d->rep[j].rd), &d->landed[l][j]);
    /* The calling thread drives device 0: current again after the others' events. */
    int brc = fl_wk_rdev_bind(d->rep[0].rd);
    if (rc == FL_OK)
        rc = brc;
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "rank %d: the overlapped first leg", d->rank);
    return FL_OK;
}

int fl_wk_devices_set_overlap(fl_wk_devices_t *d, bool on)
{
    d->overlap = on && d->n > 1 && d->local == FL_WK_LOCAL_SHARDS;
    if (!d->overlap || d->intra == NULL || d->have_leg_mu)
        return FL_OK;
    int rc = leg_create(d);
    if (rc != FL_OK) {
        leg_destroy(d);
        d->overlap = false;
    }
    return rc;
}

void fl_wk_devices_leg_destroy(fl_wk_devices_t *d)
{
    leg_destroy(d);
}

bool fl_wk_devices_overlapped(const fl_wk_devices_t *d)
{
    return d->overlap && !d->cadence;
}

const char *fl_wk_devices_first_leg(const fl_wk_devices_t *d, bool *overlapped)
{
    *overlapped = false;
    if (d->n < 2 || d->local == FL_WK_LOCAL_NONE)
        return "";
    *overlapped = fl_wk_devices_overlapped(d);
    return d->intra != NULL ? fl_intra_impl_name(fl_intra_impl(d->intra)) : "host";
}

int fl_wk_devices_leg_begin(fl_wk_devices_t *d)
{
    if (!d->reducing || d->intra == NULL)
        return FL_OK;
    /* The last step's reduce-scatters read every device's gradient buffer, which this step's
     * passes rewrite: their streams must have run past them (they have, once the exchange
     * waited for every bucket; this bounds the case where it did not). */
    int rc = FL_OK;
    for (int j = 0; j < d->n && rc == FL_OK; j++)
        rc = fl_stream_sync(d->xs[j], 0);
    int brc = fl_wk_rdev_bind(d->rep[0].rd);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "rank %d: the first leg of the last step", d->rank);
    d->leg_next = d->m->nlayers;
    d->leg_rc = FL_OK;
    d->leg_err[0] = '\0';
    return brc;
}

int fl_wk_devices_leg_end(const fl_wk_devices_t *d)
{
    if (d->leg_rc != FL_OK)
        return fl_fail(d->leg_rc, "%s", d->leg_err);
    /* Every device told every layer: each bucket was queued (else the exchange would wait
     * for a bucket nobody made ready). */
    if (d->leg_next != 0)
        return fl_fail(FL_EIO,
                       "the first leg inside the host: layers 0..%d were not reduced "
                       "(a device did not tell them)",
                       d->leg_next - 1);
    return FL_OK;
}

/* Queues bucket l on the devices: its reduce-scatter behind every device's event for layer l,
 * then device j's reduced piece to the host (device 0's buffer, where the exchange reads) and
 * landed[l][j] on device j's stream. Under leg_mu (one thread at a time calls d->intra). */
static int leg_queue(fl_wk_devices_t *d, int l)
{
    int L = d->n;
    size_t lo = d->leg_edge[l];
    size_t hi = d->leg_edge[l + 1];
    if (hi == lo)
        return FL_OK; /* a layer of fewer parameters than devices: in its neighbour's bucket */
    fl_dptr_t bufs[FL_DEV_MAX_DEVICES] = {{0}};
    for (int j = 0; j < L; j++)
        bufs[j] = fl_dptr_f32(fl_wk_rdev_grad_buf(d->rep[j].rd), lo);
    int rc = FL_OK;
    for (int j = 0; j < L && rc == FL_OK; j++)
        rc = fl_stream_wait(d->xs[j], fl_wk_rdev_layer_event(d->rep[j].rd, l));
    if (rc == FL_OK)
        rc = fl_intra_reduce_scatter(d->intra, bufs, hi - lo, FL_AVG, d->xs, NULL);
    size_t S = fl_intra_shard_len(hi - lo, L);
    float *grad = d->rep[0].grad;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        size_t from = lo + (size_t)j * S;
        size_t n = from < hi ? (hi - from < S ? hi - from : S) : 0;
        if (n > 0)
            rc = fl_dev_d2h(d->xs[j], grad + from, fl_dptr_f32(bufs[j], (size_t)j * S),
                            n * sizeof(float));
        if (rc == FL_OK)
            rc = fl_event_record(d->landed[l][j], d->xs[j]);
    }
    return rc;
}

static bool told_by_all(fl_wk_devices_t *d, int layer)
{
    pthread_mutex_lock(&d->mu);
    bool all = d->layer_told[layer] == d->n;
    pthread_mutex_unlock(&d->mu);
    return all;
}

/* Layer(s) done on every device: queue their buckets in order (the last layer first, as the
 * exchange takes them), then tell every shard that reaches them. */
static void leg_layers_done(fl_wk_devices_t *d, replica_t *r)
{
    pthread_mutex_lock(&d->leg_mu);
    int before = d->leg_next;
    while (d->leg_rc == FL_OK && d->leg_next > 0 && told_by_all(d, d->leg_next - 1)) {
        int l = d->leg_next - 1;
        int rc = leg_queue(d, l);
        if (rc != FL_OK) {
            d->leg_rc = fl_fail_ctx(rc,
                                    "the first leg inside the host (reduce-scatter on the "
                                    "devices) of layer %d",
                                    l);
            snprintf(d->leg_err, sizeof d->leg_err, "%s", fl_last_error());
            break;
        }
        d->leg_next = l;
    }
    int now = d->leg_next;
    pthread_mutex_unlock(&d->leg_mu);
    /* The queueing made the other devices current on this thread: its own device again (a
     * failure fails the step through leg_rc: the pass in flight overwrites r->rc). */
    int brc = fl_wk_rdev_bind(r->rd);
    pthread_mutex_lock(&d->leg_mu);
    if (brc != FL_OK && d->leg_rc == FL_OK) {
        d->leg_rc = brc;
        snprintf(d->leg_err, sizeof d->leg_err, "%s", fl_last_error());
    }
    bool ok = d->leg_rc == FL_OK;
    pthread_mutex_unlock(&d->leg_mu);
    if (!ok || now == before)
        return;
    size_t from = d->leg_edge[now];
    for (int j = 0; j < d->n; j++) {
        size_t off = fl_shard_offset(d->np, d->n, j);
        size_t cnt = fl_shard_count(d->np, d->n, j);
        if (cnt > 0 && off + cnt > from)
            d->ready(j, from > off ? from : off, d->ud);
    }
}

void fl_wk_devices_layer_told(int layer, void *ud)
{
    replica_t *r = ud;
    fl_wk_devices_t *d = r->d;
    pthread_mutex_lock(&d->mu);
    /* Each device tells its layers in order, so when layer l's count is full every later
     * layer's is too: the ready range only grows downwards. */
    bool last = ++d->layer_told[layer] == d->n;
    pthread_mutex_unlock(&d->mu);
    if (!last || d->ready == NULL)
        return;
    if (d->intra != NULL) {
        leg_layers_done(d, r);
        return;
    }
    size_t from = fl_mlp_weight_at(d->m, layer);
    for (int j = 0; j < d->n; j++) {
        size_t off = fl_shard_offset(d->np, d->n, j);
        size_t cnt = fl_shard_count(d->np, d->n, j);
        if (cnt > 0 && off + cnt > from)
            d->ready(j, from > off ? from : off, d->ud);
    }
}

/* Waits for e, a bucket's copy to the host, in slices of POLL_MS, polling the collectives'
 * asynchronous errors between them as fl_intra_wait does (an NCCL failure on one GPU can keep
 * the others blocked forever, and only the poll sees it), up to the handle's deadline; a
 * failure or the deadline aborts the collectives (NCCL: every communicator) so that nothing
 * stays blocked on the devices. */
#define POLL_MS 10
static int leg_wait_event(fl_wk_devices_t *d, fl_event_t *e, int layer)
{
    int ms = fl_intra_timeout_ms(d->intra);
    int64_t deadline = fl_now_ms() + ms;
    for (;;) {
        int rc = fl_event_sync(e, POLL_MS);
        /* Done after the slice timed out: the timeout is stale, the event's own status is
         * the answer (the device's bound, which a completed event does not wait out). */
        if (rc == FL_ETIMEDOUT && fl_event_done(e))
            rc = fl_event_sync(e, 0);
        if (rc == FL_OK)
            return FL_OK;
        /* Its record ran and brought its stream's error: it names the device that failed (a
         * peer's fault reaches every stream that waited for it). */
        if (rc != FL_ETIMEDOUT)
            return fl_fail_ctx(rc,
                               "the first leg inside the host (reduce-scatter on the "
                               "devices) of layer %d",
                               layer);
        pthread_mutex_lock(&d->leg_mu);
        rc = fl_intra_poll(d->intra);
        if (rc == FL_OK && fl_now_ms() >= deadline)
            rc = fl_fail(FL_ETIMEDOUT, "not done in %d ms (the devices' deadline, --timeout)", ms);
        if (rc != FL_OK)
            rc = fl_intra_abort(d->intra, rc);
        pthread_mutex_unlock(&d->leg_mu);
        if (rc != FL_OK)
            return fl_fail_ctx(rc,
                               "the first leg inside the host (reduce-scatter on the "
                               "devices) of layer %d",
                               layer);
    }
}

/* The intra-host leg: the copies of every bucket that holds part of [start, start + len) have
 * landed. */
static int leg_wait(fl_wk_devices_t *d, size_t start, size_t len)
{
    pthread_mutex_lock(&d->leg_mu);
    int rc = d->leg_rc;
    char err[512];
    snprintf(err, sizeof err, "%s", d->leg_err);
    pthread_mutex_unlock(&d->leg_mu);
    if (rc != FL_OK)
        return fl_fail(rc, "%s", err);
    for (int l = 0; l < d->m->nlayers; l++) {
        size_t lo = d->leg_edge[l];
        size_t hi = d->leg_edge[l + 1];
        if (hi == lo || hi <= start || lo >= start + len)
            continue;
        for (int j = 0; j < d->n; j++)
            if ((rc = leg_wait_event(d, d->landed[l][j], l)) != FL_OK)
                return rc;
    }
    return FL_OK;
}

int fl_wk_devices_reduce_range(fl_wk_devices_t *d, size_t start, size_t len)
{
    /* Only during an overlapped step: El Che's steps combine on the training thread. */
    if (!d->reducing)
        return FL_OK;
    if (d->intra != NULL)
        return leg_wait(d, start, len);
    int L = d->n;
    float inv = 1.0f / (float)L;
    float *grad = d->rep[0].grad;
    for (size_t i = start; i < start + len; i++) {
        float s = grad[i];
        for (int k = 1; k < L; k++)
            s += d->rep[k].grad[i];
        grad[i] = s * inv;
    }
    return FL_OK;
}
