/* The gradient exchange of the training loop. The flat gradient is cut into buckets (as PyTorch
 * DDP's buckets and Horovod's tensor fusion), ordered the way the backward pass fills them (last
 * parameters first). A thread that owns the communicator exchanges each bucket as soon as it
 * is queued, while the backward pass goes on with earlier layers: a dense average, or top-k with
 * error feedback (a residual per bucket) and a sparse allreduce. The training thread only
 * queues buckets and waits for the step's end, through a mutex and condition variable. */
#include "wk_xchg.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_core.h"

struct fl_wk_xchg {
    fl_comm_t *comm;
    const fl_wk_train_opts_t *o;
    float *grad;
    size_t nb;
    size_t *start; /* bucket b covers [start[b], start[b] + len[b]) */
    size_t *len;
    /* top-k */
    fl_cmp_ef_t **ef;
    fl_cmp_ws_t *cws;
    uint32_t *kidx;
    float *kval;
    double density;
    fl_wk_dcmp_t *dcmp; /* top-k on the device that computed the gradient (NULL: the host) */
    bool bound;         /* the exchange thread made that device current */
    /* the thread and what it shares with the training thread (under mu) */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t queued; /* buckets queued this step */
    size_t done;   /* buckets exchanged this step */
    bool stop;
    int rc;
    char err[1024];
    fl_wk_xchg_stats_t st;
    int tid;
    fl_wk_xchg_prepare_fn prepare; /* fills a bucket before it is sent (NULL: it is filled) */
    void *prepare_ud;
};

/* Exchanges one bucket in place. Runs on the exchange thread only. */
static int exchange(fl_wk_xchg_t *x, size_t b, fl_wk_xchg_stats_t *st)
{
    float *g = x->grad + x->start[b];
    size_t n = x->len[b];
    int world = fl_comm_size(x->comm);
    st->raw_bytes =
        world > 1 ? (uint64_t)(2.0 * (world - 1) / world * (double)n * sizeof(float)) : 0;
    fl_comm_stats_t s0;
    fl_comm_stats_t s1;
    fl_comm_get_stats(x->comm, &s0);
    int rc;
    if (x->ef == NULL) {
        rc = fl_allreduce(x->comm, g, g, n, FL_FLOAT32, FL_AVG);
    } else {
        fl_cmp_topk_opts_t to;
        fl_cmp_topk_opts_init(&to);
        to.density = x->density;
        size_t k = 0;
        int64_t tc = fl_now_ns();
        const uint32_t *kidx = x->kidx;
        const float *kval = x->kval;
        if (x->dcmp != NULL) {
            uint32_t *di = NULL;
            float *dv = NULL;
            rc = x->bound ? FL_OK : fl_wk_dcmp_bind(x->dcmp);
            x->bound = rc == FL_OK;
            if (rc == FL_OK)
                rc = fl_cmp_topk_count(n, &to, &k);
            if (rc == FL_OK)
                rc = fl_wk_dcmp_bucket(x->dcmp, x->start[b], n, k, &di, &dv);
            kidx = di;
            kval = dv;
        } else {
            rc = fl_cmp_ef_step(x->ef[b], x->cws, g, &to, x->kidx, x->kval, &k, NULL);
        }
        fl_obs_timeline_span(x->o->timeline, x->tid, "compress (top-k, error feedback)", "exchange",
                             tc, fl_now_ns());
        if (rc == FL_OK) {
            fl_sparse_opts_t so;
            fl_sparse_opts_init(&so);
            so.values = x->o->topk_values;
            so.k_max = k; /* every rank asks for the same density: the same k, no round */
            int64_t ts = fl_now_ns();
            rc = fl_sparse_allreduce(x->comm, kidx, kval, k, g, n, FL_AVG, &so, NULL);
            fl_obs_timeline_span(x->o->timeline, x->tid, "sparse allreduce", "exchange", ts,
                                 fl_now_ns());
        }
    }
    fl_comm_get_stats(x->comm, &s1);
    st->bytes_sent = s1.bytes_sent - s0.bytes_sent;
    st->remote_bytes = s1.bytes_sent_remote - s0.bytes_sent_remote;
    return rc;
}

static void *xchg_main(void *arg)
{
    fl_wk_xchg_t *x = arg;
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while (!x->stop && x->done == x->queued)
            pthread_cond_wait(&x->cv, &x->mu);
        if (x->stop)
            break;
        size_t b = x->done;
        bool failed = x->rc != FL_OK;
        pthread_mutex_unlock(&x->mu);

        int rc = FL_OK;
        fl_wk_xchg_stats_t one = {0};
        int64_t t0 = fl_now_ns();
        /* After a failure the communicator is broken: the rest of the step is skipped. */
        if (!failed && x->prepare != NULL)
            rc = x->prepare(x->start[b], x->len[b], x->prepare_ud);
        if (!failed && rc == FL_OK)
            rc = exchange(x, b, &one);
        int64_t t1 = fl_now_ns();
        double ms = (double)(t1 - t0) / 1e6;
        if (!failed && x->ef == NULL) /* top-k's phases are recorded in exchange() */
            fl_obs_timeline_span(x->o->timeline, x->tid, "allreduce", "exchange", t0, t1);

        pthread_mutex_lock(&x->mu);
        if (rc != FL_OK && x->rc == FL_OK) {
            x->rc = rc;
            snprintf(x->err, sizeof x->err, "%s", fl_last_error());
        }
        x->st.bytes_sent += one.bytes_sent;
        x->st.remote_bytes += one.remote_bytes;
        x->st.raw_bytes += one.raw_bytes;
        x->st.busy_ms += ms;
        x->done++;
        pthread_cond_broadcast(&x->cv);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

/* Bucket boundaries: from the end of the range backwards, bucket_bytes each (a single
 * bucket when 0), so that the first bucket is complete as soon as the last layer is. */
static int plan(fl_wk_xchg_t *x, size_t from, size_t np, size_t bucket_bytes)
{
    size_t per = bucket_bytes / sizeof(float);
    if (per == 0 || per > np)
        per = np;
    x->nb = np ? (np + per - 1) / per : 0;
    x->start = calloc(x->nb + 1, sizeof *x->start);
    x->len = calloc(x->nb + 1, sizeof *x->len);
    if (x->start == NULL || x->len == NULL)
        return fl_fail(FL_ENOMEM, "exchange: out of memory for %zu buckets", x->nb);
    size_t end = from + np;
    for (size_t b = 0; b < x->nb; b++) {
        size_t s = end - from > per ? end - per : from;
        x->start[b] = s;
        x->len[b] = end - s;
        end = s;
    }
    return FL_OK;
}

static int setup_topk(fl_wk_xchg_t *x)
{
    size_t widest = 0;
    x->ef = calloc(x->nb + 1, sizeof *x->ef);
    if (x->ef == NULL)
        return fl_fail(FL_ENOMEM, "exchange: out of memory");
    for (size_t b = 0; b < x->nb; b++) {
        fl_cmp_ef_opts_t eo;
        fl_cmp_ef_opts_init(&eo);
        eo.n = x->len[b];
        eo.name = "gradient bucket";
        eo.wire = x->o->topk_values;
        eo.max_norm = x->o->max_norm; /* DGC clips locally, before accumulation */
        int rc = fl_cmp_ef_create(&eo, &x->ef[b]);
        if (rc != FL_OK)
            return rc;
        widest = x->len[b] > widest ? x->len[b] : widest;
    }
    int rc = fl_cmp_ws_create(&x->cws);
    if (rc != FL_OK)
        return rc;
    x->kidx = malloc(widest * sizeof *x->kidx);
    x->kval = malloc(widest * sizeof *x->kval);
    if (x->kidx == NULL || x->kval == NULL)
        return fl_fail(FL_ENOMEM, "exchange: out of memory for %zu pairs", widest);
    return FL_OK;
}

int fl_wk_xchg_create(fl_comm_t *comm, const fl_wk_train_opts_t *o, float *grad, size_t from,
                      size_t n, fl_wk_xchg_t **out)
{
    *out = NULL;
    fl_wk_xchg_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return fl_fail(FL_ENOMEM, "exchange: out of memory");
    x->comm = comm;
    x->o = o;
    x->grad = grad;
    x->density = o->topk;
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    int rc = plan(x, from, n, o->bucket_bytes);
    if (rc == FL_OK && comm != NULL && o->topk > 0.0)
        rc = setup_topk(x);
    if (rc == FL_OK && comm != NULL) {
        if (pthread_create(&x->thread, NULL, xchg_main, x) != 0)
            rc = fl_fail(FL_EIO, "exchange: cannot start its thread");
        else
            x->started = true;
    }
    if (rc != FL_OK) {
        fl_wk_xchg_destroy(&x);
        return rc;
    }
    *out = x;
    return FL_OK;
}

static void wk_xchg_destroy(fl_wk_xchg_t **px)
{
    if (px == NULL || *px == NULL)
        return;
    fl_wk_xchg_t *x = *px;
    if (x->started) {
        pthread_mutex_lock(&x->mu);
        x->stop = true;
        pthread_cond_broadcast(&x->cv);
        pthread_mutex_unlock(&x->mu);
        pthread_join(x->thread, NULL);
    }
    if (x->ef != NULL)
        for (size_t b = 0; b < x->nb; b++)
            fl_cmp_ef_destroy(&x->ef[b]);
    free(x->ef);
    fl_wk_dcmp_destroy(&x->dcmp);
    fl_cmp_ws_destroy(&x->cws);
    free(x->kidx);
    free(x->kval);
    free(x->start);
    free(x->len);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    free(x);
    *px = NULL;
}

void fl_wk_xchg_destroy(fl_wk_xchg_t **px)
{
    fl_error_keep_begin();
    wk_xchg_destroy(px);
    fl_error_keep_end();
}

void fl_wk_xchg_begin(fl_wk_xchg_t *x, double density)
{
    pthread_mutex_lock(&x->mu);
    x->queued = 0;
    x->done = 0;
    x->density = density;
    pthread_mutex_unlock(&x->mu);
}

void fl_wk_xchg_ready_from(fl_wk_xchg_t *x, size_t from)
{
    pthread_mutex_lock(&x->mu);
    size_t q = x->queued;
    while (q < x->nb && x->start[q] >= from)
        q++;
    if (x->comm == NULL) {
        /* Local: nothing to exchange, the bucket is done as soon as it is ready. */
        x->queued = q;
        x->done = q;
    } else if (q != x->queued) {
        x->queued = q;
        pthread_cond_broadcast(&x->cv);
    }
    pthread_mutex_unlock(&x->mu);
}

int fl_wk_xchg_wait(fl_wk_xchg_t *x)
{
    pthread_mutex_lock(&x->mu);
    /* Every exchange has its own deadline (the communicator's timeout), so this ends. */
    while (x->done < x->nb && x->comm != NULL)
        pthread_cond_wait(&x->cv, &x->mu);
    int rc = x->rc;
    char err[1024];
    snprintf(err, sizeof err, "%s", x->err);
    pthread_mutex_unlock(&x->mu);
    if (rc != FL_OK)
        fl_fail(rc, "%s", err);
    return rc;
}

void fl_wk_xchg_stats(const fl_wk_xchg_t *x, fl_wk_xchg_stats_t *out)
{
    fl_wk_xchg_t *m = (fl_wk_xchg_t *)x;
    pthread_mutex_lock(&m->mu);
    *out = m->st;
    pthread_mutex_unlock(&m->mu);
}

int fl_wk_xchg_on_device(fl_wk_xchg_t *x, fl_wk_rdev_t *rd)
{
    if (x->ef == NULL)
        return FL_OK; /* dense: the gradient comes to the host anyway */
    size_t widest = 0;
    for (size_t b = 0; b < x->nb; b++)
        widest = x->len[b] > widest ? x->len[b] : widest;
    size_t from = x->nb > 0 ? x->start[x->nb - 1] : 0;
    int rc = fl_wk_dcmp_create(rd, x->o, from, x->start[0] + x->len[0] - from, widest, &x->dcmp);
    if (rc == FL_OK)
        fl_wk_rdev_set_compress(rd, true);
    return rc;
}

bool fl_wk_xchg_on_device_p(const fl_wk_xchg_t *x)
{
    return x->dcmp != NULL;
}

double fl_wk_xchg_residual_norm(const fl_wk_xchg_t *x)
{
    if (x->dcmp != NULL)
        return fl_wk_dcmp_residual_norm(x->dcmp);
    double s = 0.0;
    for (size_t b = 0; x->ef != NULL && b < x->nb; b++) {
        double r = fl_cmp_ef_residual_norm(x->ef[b]);
        s += r * r;
    }
    return sqrt(s);
}

void fl_wk_xchg_set_prepare(fl_wk_xchg_t *x, fl_wk_xchg_prepare_fn fn, void *ud)
{
    x->prepare = fn;
    x->prepare_ud = ud;
}

void fl_wk_xchg_set_track(fl_wk_xchg_t *x, int tid)
{
    x->tid = tid;
}

bool fl_wk_xchg_has_residual(const fl_wk_xchg_t *x)
{
    return x->ef != NULL;
}

void fl_wk_xchg_range(const fl_wk_xchg_t *x, size_t *from, size_t *n)
{
    *from = x->nb > 0 ? x->start[x->nb - 1] : 0;
    *n = x->nb > 0 ? x->start[0] + x->len[0] - *from : 0;
}

int fl_wk_xchg_residual_get(fl_wk_xchg_t *x, float *out)
{
    if (x->ef == NULL)
        return fl_fail(FL_EINVAL, "exchange: a dense exchange has no residual");
    if (x->dcmp != NULL)
        return fl_wk_dcmp_residual_get(x->dcmp, out);
    size_t from = x->start[x->nb - 1];
    for (size_t b = 0; b < x->nb; b++) {
        const float *r;
        const float *v;
        size_t n;
        fl_cmp_ef_state(x->ef[b], &r, &v, &n);
        memcpy(out + (x->start[b] - from), r, n * sizeof(float));
    }
    return FL_OK;
}

int fl_wk_xchg_residual_put(fl_wk_xchg_t *x, const float *in)
{
    if (x->ef == NULL)
        return fl_fail(FL_EINVAL, "exchange: a dense exchange has no residual");
    if (x->dcmp != NULL)
        return fl_wk_dcmp_residual_put(x->dcmp, in);
    size_t from = x->start[x->nb - 1];
    int rc = FL_OK;
    for (size_t b = 0; b < x->nb && rc == FL_OK; b++)
        rc = fl_cmp_ef_restore(x->ef[b], in + (x->start[b] - from), NULL, x->len[b]);
    return rc;
}
