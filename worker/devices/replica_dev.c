/* One device of a worker: the device itself (cpu, sim or cuda), its model workspace and three
 * streams (compute, copies in, copies out), and the buffers a gradient needs there. A batch is
 * staged through page-locked host memory on the copy stream, one batch ahead when the caller
 * says which comes next (two slots, events in both directions). The gradient leaves layer by
 * layer: an event where the backward pass finished a layer, a copy to the host on the out
 * stream behind it, and the caller told in layer order as each copy lands. On cpu every device
 * buffer is the host's own, so the copies cost nothing. devices.c drives the replicas. */
#include "wk_devices.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    float *hx; /* page-locked host staging */
    int32_t *hy;
    fl_dptr_t dx; /* on the device */
    fl_dptr_t dy;
    fl_event_t *staged;   /* the copy in has run */
    fl_event_t *consumed; /* the compute that read it has run */
    long tag;             /* which batch it holds (-1: none) */
} slot_t;

struct fl_wk_rdev {
    const fl_mlp_shape_t *m;
    size_t batch;
    size_t dim;
    size_t np;
    int j;
    fl_dev_t *dev;
    fl_mlp_ws_t *ws;
    fl_stream_t *cs;  /* compute: the workspace's stream */
    fl_stream_t *in;  /* copies to the device */
    fl_stream_t *out; /* gradient copies to the host */
    fl_dptr_t dparams;
    fl_dptr_t gbuf;  /* the device's gradient buffer (on cpu only while it stays there) */
    fl_dptr_t dgrad; /* where the pass in flight writes its gradient */
    slot_t slot[2];
    int cur;             /* the slot the next step computes from */
    fl_event_t *grad_in; /* the averaged gradient's copy in has run */
    fl_event_t *layer_done[FL_MLP_MAX_LAYERS];
    fl_event_t *copied[FL_MLP_MAX_LAYERS];
    /* the gradient in flight: where it goes and whom to tell */
    float *host_grad;
    fl_wk_rdev_layer_fn tell;
    void *ud;
    int pending[FL_MLP_MAX_LAYERS]; /* layers copied out or being copied, in order */
    int npending;
    int told;
    int rc; /* a failure inside the done callback */
    /* Resident parameters (fl_wk_rdev_keep): they stay on the device between steps and the
     * optimizer steps them there; on cpu they are the host's buffer itself. */
    bool resident;
    bool compress; /* the exchange compresses on the device: layers are told when queued */
    bool intra;    /* the gradient stays in gbuf for the intra-host collectives */
    fl_dev_opt_t *opt;
    size_t opt_off; /* the range the optimizer steps: [opt_off, opt_off + opt_len) */
    size_t opt_len;
    float *host_params; /* the host's parameters (a sharded update writes its range back) */
    fl_dptr_t scratch;  /* the update's norm and non-finite index */
    double *hscratch;
};

/* What a device holds, estimated before anything is allocated: parameters, gradient and the
 * optimizer's state buffers, the activations and gradients of a batch, the staged batches. */
static size_t bytes_needed(const fl_wk_train_opts_t *o, size_t dim)
{
    const fl_mlp_shape_t *m = &o->shape;
    size_t np = fl_mlp_nparams(m);
    size_t state = o->opt.kind != FL_OPT_SGD ? 2 : o->opt.momentum != 0.0 ? 1 : 0;
    size_t acts = 0;
    size_t wide = 0;
    for (int l = 0; l <= m->nlayers; l++) {
        acts += l > 0 ? (size_t)m->sizes[l] : 0;
        wide = (size_t)m->sizes[l] > wide ? (size_t)m->sizes[l] : wide;
    }
    size_t f = sizeof(float);
    size_t residual = o->topk > 0 ? np * f : 0; /* top-k's error feedback on the device */
    return np * f * (2 + state) + residual + o->batch * (acts + 2 * wide) * f +
           o->batch * sizeof(double) + 2 * o->batch * (dim * f + sizeof(int32_t));
}

/* Refuses a model the device cannot hold, before training starts. The host (cpu) is left to
 * its allocations: its parameters are the host's own buffers, and free memory there is a
 * poor guess (the page cache counts as used). */
static int check_fits(fl_dev_t *dev, const fl_wk_train_opts_t *o, size_t dim)
{
    if (fl_dev_kind(dev) == FL_DEV_CPU)
        return FL_OK;
    size_t free_b = 0;
    size_t total = 0;
    int rc = fl_dev_mem_info(dev, &free_b, &total);
    size_t need = bytes_needed(o, dim);
    if (rc == FL_OK && total > 0 && need > free_b)
        return fl_fail(FL_EINVAL,
                       "device %s: the model needs %.1f MiB (parameters, gradient, "
                       "optimizer state, a batch of %zu), %.1f MiB of %.1f MiB are "
                       "free",
                       fl_dev_name(dev), need / 1048576.0, o->batch, free_b / 1048576.0,
                       total / 1048576.0);
    return rc;
}

int fl_wk_rdev_create(const fl_wk_train_opts_t *o, int j, size_t dim, fl_wk_rdev_t **out)
{
    *out = NULL;
    fl_wk_rdev_t *r = calloc(1, sizeof *r);
    if (r == NULL)
        return fl_fail(FL_ENOMEM, "device %d: out of memory", j);
    r->m = &o->shape;
    r->batch = o->batch;
    r->dim = dim;
    r->np = fl_mlp_nparams(&o->shape);
    r->j = j;
    fl_dev_opts_t dop;
    fl_dev_opts_init(&dop);
    dop.kind = o->device;
    dop.id = o->device == FL_DEV_CPU ? 0 : o->gpus[j];
    dop.sim_jitter_us = o->sim_jitter_us;
    dop.sim_late_done = o->sim_late_done;
    if (o->sim_fail_device == j && o->sim_fail_op[0] != '\0') {
        dop.sim_fail_op = o->sim_fail_op;
        dop.sim_fail_after = o->sim_fail_after;
        dop.sim_stall_ms = o->sim_stall_ms;
    }
    if (o->sim_mem_bytes > 0)
        dop.mem_bytes = o->sim_mem_bytes;
    int rc = fl_dev_create(&dop, &r->dev);
    if (rc == FL_OK)
        rc = fl_dev_bind(r->dev);
    if (rc == FL_OK)
        rc = check_fits(r->dev, o, dim);
    if (rc == FL_OK)
        rc = fl_mlp_ws_create_on(r->dev, r->m, r->batch, &r->ws);
    if (rc == FL_OK) {
        r->cs = fl_mlp_ws_stream(r->ws);
        rc = fl_stream_create(r->dev, &r->in);
    }
    if (rc == FL_OK)
        rc = fl_stream_create(r->dev, &r->out);
    /* On cpu the parameters and gradients are the host's (wrapped per call). */
    bool cpu = o->device == FL_DEV_CPU;
    if (rc == FL_OK && !cpu)
        rc = fl_dev_alloc(r->dev, r->np * sizeof(float), &r->dparams);
    /* Padded for the intra-host collectives (fl_intra.h): a multiple of the devices, the
     * padding zero for good (no pass writes past np). */
    size_t gn = fl_intra_padded(r->np, o->replicas > 0 ? o->replicas : 1);
    if (rc == FL_OK && !cpu)
        rc = fl_dev_alloc(r->dev, gn * sizeof(float), &r->gbuf);
    if (rc == FL_OK && !cpu && gn > r->np)
        rc = fl_dev_memset(r->cs, fl_dptr_f32(r->gbuf, r->np), 0, (gn - r->np) * sizeof(float));
    if (rc == FL_OK && !cpu)
        rc = fl_stream_sync(r->cs, 0);
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
    if (rc == FL_OK)
        rc = fl_event_create(r->dev, &r->grad_in);
    for (int l = 0; l < o->shape.nlayers && rc == FL_OK; l++)
        if ((rc = fl_event_create(r->dev, &r->layer_done[l])) == FL_OK)
            rc = fl_event_create(r->dev, &r->copied[l]);
    if (rc != FL_OK) {
        fl_wk_rdev_destroy(&r);
        return rc; /* the detail names the device */
    }
    *out = r;
    return FL_OK;
}

static void wk_rdev_destroy(fl_wk_rdev_t **pr)
{
    if (pr == NULL || *pr == NULL)
        return;
    fl_wk_rdev_t *r = *pr;
    /* Streams first: they wait for what is queued, which may still use the buffers. */
    fl_stream_destroy(&r->in);
    fl_stream_destroy(&r->out);
    fl_mlp_ws_destroy(&r->ws);
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
    fl_event_destroy(&r->grad_in);
    for (int l = 0; l < FL_MLP_MAX_LAYERS; l++) {
        fl_event_destroy(&r->layer_done[l]);
        fl_event_destroy(&r->copied[l]);
    }
    fl_dev_opt_destroy(&r->opt);
    if (r->dev != NULL) {
        if (fl_dev_kind(r->dev) != FL_DEV_CPU)
            fl_dev_free(r->dev, &r->dparams); /* on cpu the host's */
        fl_dev_free(r->dev, &r->gbuf);
        fl_dev_free(r->dev, &r->scratch);
        fl_dev_host_free(r->dev, r->hscratch);
    }
    fl_dev_destroy(&r->dev);
    free(r);
    *pr = NULL;
}

void fl_wk_rdev_destroy(fl_wk_rdev_t **pr)
{
    fl_error_keep_begin();
    wk_rdev_destroy(pr);
    fl_error_keep_end();
}

fl_dev_t *fl_wk_rdev_dev(const fl_wk_rdev_t *r)
{
    return r->dev;
}

fl_mlp_ws_t *fl_wk_rdev_ws(fl_wk_rdev_t *r)
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
static int stage(fl_wk_rdev_t *r, slot_t *sl, const fl_dataset_t *data, const uint32_t *idx,
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
    if ((rc = fl_mlp_check_labels(r->m, sl->hy, b)) != FL_OK)
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

/* The backward pass queued layer l's gradient: copy it out behind an event (or, when the
 * exchange compresses on the device or the gradient stays there for the intra-host leg, only
 * record the event and tell at once: the listener queues its own work behind the event). */
static void layer_queued(int l, void *ud)
{
    fl_wk_rdev_t *r = ud;
    if (r->rc != FL_OK)
        return;
    if (r->compress || r->host_grad == NULL) {
        r->rc = fl_event_record(r->layer_done[l], r->cs);
        if (r->rc == FL_OK && r->tell != NULL)
            r->tell(l, r->ud);
        return;
    }
    size_t from = fl_mlp_weight_at(r->m, l);
    size_t n = fl_mlp_weight_at(r->m, l + 1) - from;
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

/* fl_wk_rdev_grad's body; on failure the caller drains the streams. */
static int grad_pass(fl_wk_rdev_t *r, const float *params, const fl_mlp_src_t *src,
                     const fl_dataset_t *data, const uint32_t *idx, long tag, const uint32_t *next,
                     long next_tag, float *grad, fl_wk_rdev_layer_fn tell, void *ud, double *loss,
                     size_t *correct)
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
    if (params == NULL && src == NULL && !r->resident)
        return fl_fail(FL_EINVAL, "device %d: no parameters on the device", r->j);
    if (params != NULL) {
        rc = cpu ? fl_dev_wrap(r->dev, params, &dp)
                 : fl_dev_h2d(r->cs, dp, params, r->np * sizeof(float));
        if (rc != FL_OK)
            return rc;
    }
    /* grad NULL: the gradient stays on the device (for fl_wk_rdev_update), nothing copied. */
    bool keep = grad == NULL;
    if (keep && !r->resident && !r->intra)
        return fl_fail(FL_EINVAL,
                       "device %d: a gradient kept on a device without parameters "
                       "there",
                       r->j);
    r->dgrad = r->gbuf;
    if (cpu && !keep && (rc = fl_dev_wrap(r->dev, grad, &r->dgrad)) != FL_OK)
        return rc;
    r->host_grad = grad;
    r->tell = tell;
    r->ud = ud;
    r->npending = 0;
    r->told = 0;
    r->rc = FL_OK;
    if ((rc = fl_stream_wait(r->cs, sl->staged)) != FL_OK)
        return rc;
    /* A gradient kept for the intra-host leg is still told layer by layer when someone
     * listens (--overlap: each bucket's reduce-scatter queued behind its layer's event). */
    fl_mlp_layer_done_fn out = keep && !(r->intra && tell != NULL) ? NULL : layer_queued;
    if (src != NULL)
        rc = fl_mlp_dgrad_hsrc(r->m, r->ws, src, sl->dx, sl->dy, r->batch, r->dgrad, out, r);
    else
        rc = fl_mlp_dgrad(r->m, r->ws, dp, NULL, sl->dx, sl->dy, r->batch, r->dgrad, out, r);
    if (rc == FL_OK)
        rc = fl_event_record(sl->consumed, r->cs);
    sl->tag = -1; /* consumed: a later step stages it again */
    if (rc == FL_OK)
        rc = r->rc;
    /* The next batch goes in while this one computes. */
    if (rc == FL_OK && next != NULL)
        rc = stage(r, &r->slot[r->cur ^ 1], data, next, next_tag);
    if (rc == FL_OK)
        rc = fl_mlp_dresult(r->ws, r->batch, loss, correct);
    if (rc == FL_OK && !r->compress)
        rc = drain(r, true);
    return rc;
}

int fl_wk_rdev_grad(fl_wk_rdev_t *r, const float *params, const fl_mlp_src_t *src,
                    const fl_dataset_t *data, const uint32_t *idx, long tag, const uint32_t *next,
                    long next_tag, float *grad, fl_wk_rdev_layer_fn tell, void *ud, double *loss,
                    size_t *correct)
{
    int rc =
        grad_pass(r, params, src, data, idx, tag, next, next_tag, grad, tell, ud, loss, correct);
    if (rc != FL_OK) {
        /* Nothing queued may go on reading the caller's parameters or samples, or writing its
         * gradient, after we return; the first error is the one to report. */
        fl_error_keep_begin();
        fl_stream_sync(r->cs, 0);
        fl_stream_sync(r->out, 0);
        fl_stream_sync(r->in, 0);
        fl_error_keep_end();
    }
    r->dgrad = fl_dptr_null();
    return rc;
}

/* ---- resident parameters and the update on the device ---- */

int fl_wk_rdev_keep(fl_wk_rdev_t *r, const fl_opt_opts_t *opt, size_t off, size_t len,
                    float *params)
{
    if (off > r->np || len > r->np - off)
        return fl_fail(FL_EINVAL, "device %d: optimizer range [%zu, +%zu) past %zu parameters",
                       r->j, off, len, r->np);
    r->opt_off = off;
    r->opt_len = len;
    r->host_params = params;
    int rc = opt != NULL ? fl_dev_opt_create(r->dev, opt, len, &r->opt) : FL_OK;
    if (rc == FL_OK && r->hscratch == NULL)
        rc = fl_dev_host_alloc(r->dev, 2 * sizeof(double), (void **)&r->hscratch);
    if (rc == FL_OK && fl_dptr_is_null(r->scratch))
        rc = fl_dev_alloc(r->dev, 2 * sizeof(double), &r->scratch);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "device %d", r->j);
    if (fl_dev_kind(r->dev) == FL_DEV_CPU) {
        /* The host's parameters are the device's; its gradient buffer is the device's own
         * while the gradient stays there. */
        fl_dev_wrap(r->dev, params, &r->dparams);
        if ((rc = fl_dev_alloc(r->dev, r->np * sizeof(float), &r->gbuf)) != FL_OK)
            return rc;
    }
    r->resident = true;
    return fl_wk_rdev_put_params(r, params);
}

int fl_wk_rdev_put_params(fl_wk_rdev_t *r, const float *params)
{
    /* Waited for: the host may change its buffer as soon as this returns. */
    int rc = fl_dev_h2d(r->cs, r->dparams, params, r->np * sizeof(float));
    return rc == FL_OK ? fl_stream_sync(r->cs, 0) : rc;
}

int fl_wk_rdev_put_range(fl_wk_rdev_t *r, const float *params, size_t off, size_t len)
{
    if (off > r->np || len > r->np - off)
        return fl_fail(FL_EINVAL, "device %d: parameter range [%zu, +%zu) past %zu parameters",
                       r->j, off, len, r->np);
    return len == 0
               ? FL_OK
               : fl_dev_h2d(r->cs, fl_dptr_f32(r->dparams, off), params + off, len * sizeof(float));
}

int fl_wk_rdev_get_params(fl_wk_rdev_t *r, float *params)
{
    int rc = fl_dev_d2h(r->cs, params, r->dparams, r->np * sizeof(float));
    return rc == FL_OK ? fl_stream_sync(r->cs, 0) : rc;
}

fl_dev_opt_t *fl_wk_rdev_opt(fl_wk_rdev_t *r)
{
    return r->opt;
}

fl_stream_t *fl_wk_rdev_stream(fl_wk_rdev_t *r)
{
    return r->cs;
}

fl_dptr_t fl_wk_rdev_params_buf(const fl_wk_rdev_t *r)
{
    return r->dparams;
}

fl_dptr_t fl_wk_rdev_grad_buf(const fl_wk_rdev_t *r)
{
    return r->gbuf;
}

fl_event_t *fl_wk_rdev_layer_event(const fl_wk_rdev_t *r, int layer)
{
    return r->layer_done[layer];
}

void fl_wk_rdev_set_compress(fl_wk_rdev_t *r, bool on)
{
    r->compress = on;
}

void fl_wk_rdev_set_intra(fl_wk_rdev_t *r, bool on)
{
    r->intra = on;
}

int fl_wk_rdev_update(fl_wk_rdev_t *r, const float *grad, double max_norm, double lr)
{
    if (r->opt == NULL)
        return FL_OK; /* a cpu device whose parameters another device steps */
    int rc = FL_OK;
    bool cpu = fl_dev_kind(r->dev) == FL_DEV_CPU;
    size_t off = r->opt_off;
    size_t len = r->opt_len;
    bool part = len < r->np;
    fl_dptr_t g = r->gbuf;
    if (grad != NULL && cpu) {
        rc = fl_dev_wrap(r->dev, grad, &g);
    } else if (grad != NULL) {
        /* The averaged gradient in (the device's range of it), waited for: the host buffer is
         * device 0's gradient, which its next step overwrites, and only device 0's own copies
         * are ordered behind this. */
        rc = fl_dev_h2d(r->cs, fl_dptr_f32(g, off), grad + off, len * sizeof(float));
        if (rc == FL_OK)
            rc = fl_event_record(r->grad_in, r->cs);
        if (rc == FL_OK)
            rc = fl_event_sync(r->grad_in, 0);
    } else {
        /* Kept on the device: the checks the host would have made, made here. */
        rc = fl_dev_nonfinite(r->cs, g, r->np, r->scratch);
        if (rc == FL_OK && max_norm > 0.0)
            rc = fl_dev_sumsq(r->cs, g, r->np, fl_dptr_at(r->scratch, sizeof(double)));
        if (rc == FL_OK)
            rc = fl_dev_d2h(r->cs, r->hscratch, r->scratch, 2 * sizeof(double));
        if (rc == FL_OK)
            rc = fl_stream_sync(r->cs, 0);
        if (rc != FL_OK)
            return rc;
        int64_t bad;
        memcpy(&bad, &r->hscratch[0], sizeof bad);
        if (bad >= 0)
            return fl_fail(FL_ENONFINITE, "gradient %lld is not finite: no parameter updated",
                           (long long)bad);
        double f = max_norm > 0.0 ? fl_cmp_clip_factor(sqrt(r->hscratch[1]), max_norm) : 1.0;
        if (f != 1.0)
            rc = fl_dev_scale(r->cs, g, r->np, (float)f);
    }
    if (rc == FL_OK)
        rc = fl_dev_opt_step(r->opt, r->cs, fl_dptr_f32(r->dparams, off), fl_dptr_f32(g, off), lr);
    /* A range of the parameters: it goes back to the host, where the all-gather takes it (on
     * cpu it is the host's already). */
    if (rc == FL_OK && part && !cpu)
        rc = fl_dev_d2h(r->cs, r->host_params + off, fl_dptr_f32(r->dparams, off),
                        len * sizeof(float));
    if (rc == FL_OK && part && !cpu)
        rc = fl_stream_sync(r->cs, 0);
    return rc;
}
