/* One device of a worker: the device itself (cpu, sim or cuda), its model workspace and three
 * streams (compute, copies in, copies out), and the buffers a gradient needs there. A batch is
 * staged through page-locked host memory on the copy stream, one batch ahead when the caller
 * says which comes next (two slots, events in both directions). The gradient leaves layer by
 * layer: an event where the backward pass finished a layer, a copy to the host on the out
 * stream behind it, and the caller told in layer order as each copy lands. On cpu every device
 * buffer is the host's own, so the copies cost nothing. devices.c drives the replicas. */
#include "wk_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    float *hx;         /* page-locked host staging */
    int32_t *hy;
    fl_dptr_t dx;      /* on the device */
    fl_dptr_t dy;
    fl_event_t *staged;   /* the copy in has run */
    fl_event_t *consumed; /* the compute that read it has run */
    long tag;          /* which batch it holds (-1: none) */
} slot_t;

struct fl_wk_rdev {
    const fl_wk_mlp_shape_t *m;
    size_t batch;
    size_t dim;
    size_t np;
    int j;
    fl_dev_t *dev;
    fl_wk_mlp_ws_t *ws;
    fl_stream_t *cs; /* compute: the workspace's stream */
    fl_stream_t *in; /* copies to the device */
    fl_stream_t *out;/* gradient copies to the host */
    fl_dptr_t dparams;
    fl_dptr_t dgrad;
    slot_t slot[2];
    int cur;         /* the slot the next step computes from */
    fl_event_t *layer_done[FL_WK_MAX_LAYERS];
    fl_event_t *copied[FL_WK_MAX_LAYERS];
    /* the gradient in flight: where it goes and whom to tell */
    float *host_grad;
    fl_wk_rdev_layer_fn tell;
    void *ud;
    int pending[FL_WK_MAX_LAYERS]; /* layers copied out or being copied, in order */
    int npending;
    int told;
    int rc;          /* a failure inside the done callback */
};

int fl_wk_rdev_create(const fl_wk_train_opts_t *o, int j, size_t dim, fl_wk_rdev_t **out)
{
    *out = NULL;
    fl_wk_rdev_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return fl_fail(FL_ENOMEM, "device %d: out of memory", j);
    r->m = &o->shape;
    r->batch = o->batch;
    r->dim = dim;
    r->np = fl_wk_mlp_nparams(&o->shape);
    r->j = j;
    fl_dev_opts_t dop;
    fl_dev_opts_init(&dop);
    dop.kind = o->device;
    dop.id = o->device == FL_DEV_CPU ? 0 : o->gpus[j];
    dop.sim_jitter_us = o->sim_jitter_us;
    if (o->sim_mem_bytes > 0)
        dop.mem_bytes = o->sim_mem_bytes;
    int rc = fl_dev_create(&dop, &r->dev);
    if (rc == FL_OK)
        rc = fl_dev_bind(r->dev);
    if (rc == FL_OK)
        rc = fl_wk_mlp_ws_create_on(r->dev, r->m, r->batch, &r->ws);
    if (rc == FL_OK) {
        r->cs = fl_wk_mlp_ws_stream(r->ws);
        rc = fl_stream_create(r->dev, &r->in);
    }
    if (rc == FL_OK)
        rc = fl_stream_create(r->dev, &r->out);
    /* On cpu the parameters and gradients are the host's (wrapped per call). */
    bool cpu = o->device == FL_DEV_CPU;
    if (rc == FL_OK && !cpu)
        rc = fl_dev_alloc(r->dev, r->np * sizeof(float), &r->dparams);
    if (rc == FL_OK && !cpu)
        rc = fl_dev_alloc(r->dev, r->np * sizeof(float), &r->dgrad);
    for (int s = 0; s < 2 && rc == FL_OK; s++) {
        slot_t *sl = &r->slot[s];
        sl->tag = -1;
        size_t xb = r->batch * dim * sizeof(float);
        size_t yb = r->batch * sizeof(int32_t);
        if ((rc = fl_dev_host_alloc(r->dev, xb, (void **)&sl->hx)) == FL_OK &&
            (rc = fl_dev_host_alloc(r->dev, yb, (void **)&sl->hy)) == FL_OK &&
            (rc = fl_dev_mirror(r->dev, sl->hx, xb, &sl->dx)) == FL_OK &&
            (rc = fl_dev_mirror(r->dev, sl->hy, yb, &sl->dy)) == FL_OK &&
            (rc = fl_event_create(r->dev, &sl->staged)) == FL_OK)
            rc = fl_event_create(r->dev, &sl->consumed);
    }
    for (int l = 0; l < o->shape.nlayers && rc == FL_OK; l++)
        if ((rc = fl_event_create(r->dev, &r->layer_done[l])) == FL_OK)
            rc = fl_event_create(r->dev, &r->copied[l]);
    if (rc != FL_OK) {
        fl_wk_rdev_destroy(&r);
        return fl_fail_ctx(rc, "device %d: ", j);
    }
    *out = r;
    return FL_OK;
}

void fl_wk_rdev_destroy(fl_wk_rdev_t **pr)
{
    if (pr == NULL || *pr == NULL)
        return;
    fl_wk_rdev_t *r = *pr;
    /* Streams first: they wait for what is queued, which may still use the buffers. */
    fl_stream_destroy(&r->in);
    fl_stream_destroy(&r->out);
    fl_wk_mlp_ws_destroy(&r->ws);
    for (int s = 0; s < 2; s++) {
        slot_t *sl = &r->slot[s];
        fl_event_destroy(&sl->staged);
        fl_event_destroy(&sl->consumed);
        if (r->dev != NULL) {
            fl_dev_unmirror(r->dev, &sl->dx);
            fl_dev_unmirror(r->dev, &sl->dy);
            fl_dev_host_free(r->dev, sl->hx);
            fl_dev_host_free(r->dev, sl->hy);
        }
    }
    for (int l = 0; l < FL_WK_MAX_LAYERS; l++) {
        fl_event_destroy(&r->layer_done[l]);
        fl_event_destroy(&r->copied[l]);
    }
    if (r->dev != NULL) {
        fl_dev_free(r->dev, &r->dparams);
        fl_dev_free(r->dev, &r->dgrad);
    }
    fl_dev_destroy(&r->dev);
    free(r);
    *pr = NULL;
}

fl_dev_t *fl_wk_rdev_dev(const fl_wk_rdev_t *r)
{
    return r->dev;
}

fl_wk_mlp_ws_t *fl_wk_rdev_ws(fl_wk_rdev_t *r)
{
    return r->ws;
}

int fl_wk_rdev_bind(fl_wk_rdev_t *r)
{
    return fl_dev_bind(r->dev);
}

/* Copies the batch `tag` (samples idx of data) into the slot: the host staging may be
 * rewritten only once the slot's last copy in has run, and the device side only once the
 * compute that read it has (the copy stream waits for that). */
static int stage(fl_wk_rdev_t *r, slot_t *sl, const fl_wk_dataset_t *data, const uint32_t *idx,
                 long tag)
{
    int rc = fl_event_sync(sl->staged, 0);
    if (rc != FL_OK)
        return rc;
    size_t b = r->batch;
    for (size_t t = 0; t < b; t++) {
        memcpy(sl->hx + t * data->dim, data->x + (size_t)idx[t] * data->dim,
               data->dim * sizeof(float));
        sl->hy[t] = data->y[idx[t]];
    }
    sl->tag = -1;
    if ((rc = fl_wk_mlp_check_labels(r->m, sl->hy, b)) != FL_OK)
        return rc;
    if ((rc = fl_stream_wait(r->in, sl->consumed)) != FL_OK ||
        (rc = fl_dev_h2d(r->in, sl->dx, sl->hx, b * data->dim * sizeof(float))) != FL_OK ||
        (rc = fl_dev_h2d(r->in, sl->dy, sl->hy, b * sizeof(int32_t))) != FL_OK ||
        (rc = fl_event_record(sl->staged, r->in)) != FL_OK)
        return rc;
    sl->tag = tag;
    return FL_OK;
}

/* Tells, in layer order, every layer whose copy to the host has landed; waits for them when
 * `wait`. */
static int drain(fl_wk_rdev_t *r, bool wait)
{
    while (r->told < r->npending) {
        fl_event_t *e = r->copied[r->pending[r->told]];
        if (wait) {
            int rc = fl_event_sync(e, 0);
            if (rc != FL_OK)
                return rc;
        } else if (!fl_event_done(e)) {
            break;
        }
        if (r->tell != NULL)
            r->tell(r->pending[r->told], r->ud);
        r->told++;
    }
    return FL_OK;
}

/* The backward pass queued layer l's gradient: copy it out behind an event. */
static void layer_queued(int l, void *ud)
{
    fl_wk_rdev_t *r = ud;
    if (r->rc != FL_OK)
        return;
    size_t from = fl_wk_mlp_weight_at(r->m, l);
    size_t n = fl_wk_mlp_weight_at(r->m, l + 1) - from;
    fl_dptr_t src = fl_dptr_f32(r->dgrad, from);
    int rc;
    if ((rc = fl_event_record(r->layer_done[l], r->cs)) != FL_OK ||
        (rc = fl_stream_wait(r->out, r->layer_done[l])) != FL_OK ||
        (rc = fl_dev_d2h(r->out, r->host_grad + from, src, n * sizeof(float))) != FL_OK ||
        (rc = fl_event_record(r->copied[l], r->out)) != FL_OK) {
        r->rc = rc;
        return;
    }
    r->pending[r->npending++] = l;
    r->rc = drain(r, false);
}

int fl_wk_rdev_grad(fl_wk_rdev_t *r, const float *params, const fl_wk_mlp_src_t *src,
                    const fl_wk_dataset_t *data, const uint32_t *idx, long tag,
                    const uint32_t *next, long next_tag, float *grad, fl_wk_rdev_layer_fn tell,
                    void *ud, double *loss, size_t *correct)
{
    int rc = FL_OK;
    slot_t *sl = &r->slot[r->cur];
    if (sl->tag != tag) {
        slot_t *other = &r->slot[r->cur ^ 1];
        if (other->tag == tag) { /* staged ahead */
            r->cur ^= 1;
            sl = other;
        } else if ((rc = stage(r, sl, data, idx, tag)) != FL_OK) {
            return rc;
        }
    }
    fl_dptr_t dp = r->dparams;
    bool cpu = fl_dev_kind(r->dev) == FL_DEV_CPU;
    if (params != NULL) {
        rc = cpu ? fl_dev_wrap(r->dev, params, &dp)
                 : fl_dev_h2d(r->cs, dp, params, r->np * sizeof(float));
        if (rc != FL_OK)
            return rc;
    }
    if (cpu && (rc = fl_dev_wrap(r->dev, grad, &r->dgrad)) != FL_OK)
        return rc;
    r->host_grad = grad;
    r->tell = tell;
    r->ud = ud;
    r->npending = 0;
    r->told = 0;
    r->rc = FL_OK;
    if ((rc = fl_stream_wait(r->cs, sl->staged)) != FL_OK)
        return rc;
    if (src != NULL)
        rc = fl_wk_mlp_dgrad_hsrc(r->m, r->ws, src, sl->dx, sl->dy, r->batch, r->dgrad,
                                  layer_queued, r);
    else
        rc = fl_wk_mlp_dgrad(r->m, r->ws, dp, NULL, sl->dx, sl->dy, r->batch, r->dgrad,
                             layer_queued, r);
    if (rc == FL_OK)
        rc = fl_event_record(sl->consumed, r->cs);
    sl->tag = -1; /* consumed: a later step stages it again */
    if (rc == FL_OK)
        rc = r->rc;
    /* The next batch goes in while this one computes. */
    if (rc == FL_OK && next != NULL)
        rc = stage(r, &r->slot[r->cur ^ 1], data, next, next_tag);
    if (rc == FL_OK)
        rc = fl_wk_mlp_dresult(r->ws, r->batch, loss, correct);
    if (rc == FL_OK)
        rc = drain(r, true);
    if (rc != FL_OK) {
        /* Nothing queued may go on writing the caller's gradient after we return. */
        fl_stream_sync(r->cs, 0);
        fl_stream_sync(r->out, 0);
    }
    if (cpu)
        r->dgrad = fl_dptr_null();
    return rc;
}
