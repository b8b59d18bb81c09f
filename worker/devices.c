/* The devices of one worker process (CPU replicas, as threads): each draws its batch from the
 * distributed sampler (device j of rank k is data-parallel replica k * L + j of world * L),
 * computes its gradient, and the process keeps their mean. With a single device, the caller
 * hears as each layer's gradient completes, so the exchange can start during the backward
 * pass. Both training loops (collectives and parameter server) use it. */
#include "wk_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 64

typedef struct replica {
    fl_wk_sampler_t smp;
    fl_wk_mlp_ws_t *ws;
    uint32_t *idx;
    float *x;
    int32_t *y;
    float *grad; /* device 0 writes straight into the caller's gradient */
    double loss;
    size_t correct;
    int rc;
    char err[512];
} replica_t;

struct fl_wk_devices {
    const fl_wk_mlp_shape_t *m;
    const fl_wk_dataset_t *train;
    size_t batch;
    int n;
    int rank;
    size_t np;
    replica_t rep[MAX_DEVICES];
    /* the step in progress */
    const float *params;
    size_t cur_batch;
    fl_wk_ready_fn ready;
    void *ud;
};

int fl_wk_devices_create(const fl_wk_mlp_shape_t *m, const fl_wk_dataset_t *train,
                         const fl_wk_train_opts_t *o, int rank, int world, float *grad,
                         fl_wk_devices_t **out)
{
    *out = NULL;
    int L = o->replicas;
    if (L < 1 || L > MAX_DEVICES)
        return fl_fail(FL_EINVAL, "--cpu-replicas: %d is outside 1..%d", L, MAX_DEVICES);
    fl_wk_devices_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return fl_fail(FL_ENOMEM, "out of memory for the devices");
    d->m = m;
    d->train = train;
    d->batch = o->batch;
    d->n = L;
    d->rank = rank;
    d->np = fl_wk_mlp_nparams(m);
    int rc = FL_OK;
    for (int j = 0; j < L; j++) {
        replica_t *r = &d->rep[j];
        if ((rc = fl_wk_sampler_init(&r->smp, train->n, world * L, rank * L + j, o->batch,
                                     o->shuffle, o->seed)) != FL_OK ||
            (rc = fl_wk_mlp_ws_create(m, o->batch, &r->ws)) != FL_OK)
            goto fail;
        r->idx = malloc(o->batch * sizeof *r->idx);
        r->x = malloc(o->batch * train->dim * sizeof *r->x);
        r->y = malloc(o->batch * sizeof *r->y);
        r->grad = j == 0 ? grad : calloc(d->np, sizeof(float));
        if (r->idx == NULL || r->x == NULL || r->y == NULL || r->grad == NULL) {
            rc = fl_fail(FL_ENOMEM, "out of memory for device %d", j);
            goto fail;
        }
    }
    *out = d;
    return FL_OK;
fail:
    fl_wk_devices_destroy(&d);
    return rc;
}

void fl_wk_devices_destroy(fl_wk_devices_t **pd)
{
    if (pd == NULL || *pd == NULL)
        return;
    fl_wk_devices_t *d = *pd;
    for (int j = 0; j < d->n; j++) {
        replica_t *r = &d->rep[j];
        fl_wk_sampler_deinit(&r->smp);
        fl_wk_mlp_ws_destroy(&r->ws);
        free(r->idx);
        free(r->x);
        free(r->y);
        if (j > 0)
            free(r->grad);
    }
    free(d);
    *pd = NULL;
}

void fl_wk_devices_set_epoch(fl_wk_devices_t *d, long epoch)
{
    for (int j = 0; j < d->n; j++)
        fl_wk_sampler_set_epoch(&d->rep[j].smp, epoch);
}

size_t fl_wk_devices_batches(const fl_wk_devices_t *d)
{
    return fl_wk_sampler_batches(&d->rep[0].smp);
}

fl_wk_mlp_ws_t *fl_wk_devices_ws(fl_wk_devices_t *d)
{
    return d->rep[0].ws;
}

/* Copies the batch's samples next to each other for the GEMMs. */
static void gather(const fl_wk_dataset_t *data, const uint32_t *idx, size_t b, float *x,
                   int32_t *y)
{
    for (size_t t = 0; t < b; t++) {
        memcpy(x + t * data->dim, data->x + (size_t)idx[t] * data->dim,
               data->dim * sizeof(float));
        y[t] = data->y[idx[t]];
    }
}

static void layer_done(int layer, void *ud)
{
    fl_wk_devices_t *d = ud;
    d->ready(fl_wk_mlp_weight_at(d->m, layer), d->ud);
}

static int replica_step(fl_wk_devices_t *d, replica_t *r, bool overlap)
{
    fl_wk_sampler_batch(&r->smp, d->cur_batch, r->idx);
    gather(d->train, r->idx, d->batch, r->x, r->y);
    return fl_wk_mlp_grad(d->m, r->ws, d->params, r->x, r->y, d->batch, r->grad, &r->loss,
                          &r->correct, overlap && d->ready != NULL ? layer_done : NULL, d);
}

typedef struct rep_arg {
    fl_wk_devices_t *d;
    replica_t *r;
} rep_arg_t;

static void *replica_main(void *p)
{
    rep_arg_t *a = p;
    a->r->rc = replica_step(a->d, a->r, false);
    if (a->r->rc != FL_OK)
        snprintf(a->r->err, sizeof a->r->err, "%s", fl_last_error());
    return NULL;
}

int fl_wk_devices_step(fl_wk_devices_t *d, const float *params, size_t batch_index,
                       fl_wk_ready_fn ready, void *ud, double *loss, size_t *correct)
{
    d->params = params;
    d->cur_batch = batch_index;
    d->ready = ready;
    d->ud = ud;
    int L = d->n;
    if (L == 1) {
        int rc = replica_step(d, &d->rep[0], true);
        *loss = d->rep[0].loss;
        *correct = d->rep[0].correct;
        return rc;
    }
    pthread_t th[MAX_DEVICES];
    rep_arg_t args[MAX_DEVICES];
    for (int j = 1; j < L; j++) {
        args[j] = (rep_arg_t){d, &d->rep[j]};
        if (pthread_create(&th[j], NULL, replica_main, &args[j]) != 0) {
            for (int k = 1; k < j; k++)
                pthread_join(th[k], NULL);
            return fl_fail(FL_EIO, "rank %d: cannot start CPU replica %d", d->rank, j);
        }
    }
    int rc = replica_step(d, &d->rep[0], false);
    for (int j = 1; j < L; j++)
        pthread_join(th[j], NULL);
    *loss = 0.0;
    *correct = 0;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        if (d->rep[j].rc != FL_OK)
            return fl_fail(d->rep[j].rc, "replica %d: %s", j, d->rep[j].err);
        *loss += d->rep[j].loss / L;
        *correct += d->rep[j].correct;
    }
    if (rc != FL_OK)
        return rc;
    /* The replicas' mean, summed in replica order so every rank adds alike. */
    float inv = 1.0f / (float)L;
    float *grad = d->rep[0].grad;
    for (size_t i = 0; i < d->np; i++) {
        float s = grad[i];
        for (int j = 1; j < L; j++)
            s += d->rep[j].grad[i];
        grad[i] = s * inv;
    }
    if (ready != NULL)
        ready(0, ud);
    return FL_OK;
}
