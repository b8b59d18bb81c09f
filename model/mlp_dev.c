/* The MLP's forward and backward passes on a device (device/): GEMMs and kernels queued on the
 * workspace's stream, the loss and correct count left in device memory until the caller reads
 * them. Layers come from the flat parameters or from a source (--shard full). The backward pass
 * tells each finished layer (last first) as soon as its gradient is queued, so its copy out and
 * exchange can start behind the remaining layers. The host entry points (fl_mlp_grad, _eval)
 * run the same code on a cpu device over the caller's buffers, without copies. */
#include "fl_mlp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fl_mlp_ws {
    fl_dev_t *dev;
    fl_dev_t *own_dev; /* a host workspace's cpu device (fl_mlp_ws_create) */
    fl_stream_t *s;
    size_t batch;
    fl_dptr_t act[FL_MLP_MAX_LAYERS + 1]; /* act[l]: input of layer l after ReLU (act[0] unused:
                                            the caller's x); act[nlayers]: logits */
    fl_dptr_t dz;                         /* gradient of a layer's output, batch x widest */
    fl_dptr_t da;                         /* gradient of a layer's input, batch x widest */
    fl_dptr_t row_loss;                   /* batch doubles */
    fl_dptr_t out;                        /* loss sum and correct count */
    fl_dptr_t x;                          /* staging for evaluation: batch samples */
    fl_dptr_t y;
    fl_dptr_t slot[2]; /* layers copied in from a host source, alternately */
    size_t slot_cap;   /* floats per slot */
    double *hout;      /* the two results, read back */
};

static size_t widest(const fl_mlp_shape_t *m)
{
    size_t w = 0;
    for (int l = 0; l <= m->nlayers; l++)
        w = (size_t)m->sizes[l] > w ? (size_t)m->sizes[l] : w;
    return w;
}

int fl_mlp_ws_create_on(fl_dev_t *dev, const fl_mlp_shape_t *m, size_t batch, fl_mlp_ws_t **out)
{
    *out = NULL;
    if (batch == 0)
        return fl_fail(FL_EINVAL, "model: batch of 0");
    fl_mlp_ws_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return fl_fail(FL_ENOMEM, "model: out of memory");
    w->dev = dev;
    w->batch = batch;
    size_t wide = widest(m);
    size_t big = 0;
    for (int l = 0; l < m->nlayers; l++) {
        size_t n = (size_t)m->sizes[l + 1] * ((size_t)m->sizes[l] + 1);
        big = n > big ? n : big;
    }
    w->slot_cap = big;
    int rc = fl_stream_create(dev, &w->s);
    for (int l = 1; l <= m->nlayers && rc == FL_OK; l++)
        rc = fl_dev_alloc(dev, batch * (size_t)m->sizes[l] * sizeof(float), &w->act[l]);
    if (rc == FL_OK)
        rc = fl_dev_alloc(dev, batch * wide * sizeof(float), &w->dz);
    if (rc == FL_OK)
        rc = fl_dev_alloc(dev, batch * wide * sizeof(float), &w->da);
    if (rc == FL_OK)
        rc = fl_dev_alloc(dev, batch * sizeof(double), &w->row_loss);
    if (rc == FL_OK)
        rc = fl_dev_alloc(dev, 2 * sizeof(double), &w->out);
    if (rc == FL_OK)
        rc = fl_dev_host_alloc(dev, 2 * sizeof(double), (void **)&w->hout);
    if (rc != FL_OK) {
        fl_mlp_ws_destroy(&w);
        return fl_fail_ctx(rc, "model: activations for a batch of %zu", batch);
    }
    *out = w;
    return FL_OK;
}

int fl_mlp_ws_create(const fl_mlp_shape_t *m, size_t batch, fl_mlp_ws_t **out)
{
    *out = NULL;
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    fl_dev_t *d = NULL;
    int rc = fl_dev_create(&o, &d);
    if (rc == FL_OK && (rc = fl_mlp_ws_create_on(d, m, batch, out)) == FL_OK)
        (*out)->own_dev = d;
    else
        fl_dev_destroy(&d);
    return rc;
}

static void mlp_ws_destroy(fl_mlp_ws_t **ws)
{
    if (ws == NULL || *ws == NULL)
        return;
    fl_mlp_ws_t *w = *ws;
    fl_stream_destroy(&w->s); /* waits for what is queued before the memory goes */
    for (int l = 0; l <= FL_MLP_MAX_LAYERS; l++)
        fl_dev_free(w->dev, &w->act[l]);
    fl_dptr_t *bufs[] = {&w->dz, &w->da, &w->row_loss, &w->out,
                         &w->x,  &w->y,  &w->slot[0],  &w->slot[1]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        fl_dev_free(w->dev, bufs[i]);
    fl_dev_host_free(w->dev, w->hout);
    fl_dev_destroy(&w->own_dev);
    free(w);
    *ws = NULL;
}

void fl_mlp_ws_destroy(fl_mlp_ws_t **ws)
{
    fl_error_keep_begin();
    mlp_ws_destroy(ws);
    fl_error_keep_end();
}

fl_dev_t *fl_mlp_ws_dev(const fl_mlp_ws_t *ws)
{
    return ws->dev;
}

fl_stream_t *fl_mlp_ws_stream(const fl_mlp_ws_t *ws)
{
    return ws->s;
}

int fl_mlp_check_labels(const fl_mlp_shape_t *m, const int32_t *y, size_t b)
{
    int c = m->sizes[m->nlayers];
    for (size_t r = 0; r < b; r++)
        if (y[r] < 0 || y[r] >= c)
            return fl_fail(FL_EINVAL, "model: label %d of sample %zu is outside 0..%d", y[r], r,
                           c - 1);
    return FL_OK;
}

/* Layer l's weight (bias after it) from the flat parameters or the source. */
typedef struct layers {
    const fl_mlp_shape_t *m;
    fl_dptr_t flat;
    const fl_mlp_dsrc_t *src;
    fl_dptr_t last; /* the last layer, held from the forward pass into the backward */
} layers_t;

static int get_layer(const layers_t *p, int l, fl_dptr_t *w)
{
    if (p->src == NULL) {
        *w = fl_dptr_f32(p->flat, fl_mlp_weight_at(p->m, l));
        return FL_OK;
    }
    int rc = p->src->get(p->src->ud, l, w);
    return rc == FL_OK ? FL_OK : fl_fail_ctx(rc, "model: layer %d's parameters", l);
}

static void put_layer(const layers_t *p, int l)
{
    if (p->src != NULL)
        p->src->put(p->src->ud, l);
}

/* act[l+1] = act[l] W_l^T + b_l, with ReLU except after the last layer, whose weights stay
 * held (the backward pass starts with them). */
static int forward(layers_t *p, fl_mlp_ws_t *ws, fl_dptr_t x, size_t b)
{
    const fl_mlp_shape_t *m = p->m;
    for (int l = 0; l < m->nlayers; l++) {
        size_t in = (size_t)m->sizes[l];
        size_t out = (size_t)m->sizes[l + 1];
        fl_dptr_t a = l == 0 ? x : ws->act[l];
        fl_dptr_t w;
        int rc = get_layer(p, l, &w);
        if (rc != FL_OK)
            return rc;
        fl_dptr_t z = ws->act[l + 1];
        if ((rc = fl_dev_bias_rows(ws->s, z, fl_dptr_f32(w, out * in), b, out)) != FL_OK ||
            (rc = fl_dev_gemm_fwd(ws->s, b, out, in, a, w, 1.0f, z)) != FL_OK)
            return rc;
        if (l + 1 < m->nlayers) {
            if ((rc = fl_dev_relu(ws->s, z, b * out)) != FL_OK)
                return rc;
            put_layer(p, l);
        } else {
            p->last = w;
        }
    }
    return FL_OK;
}

static int backward(layers_t *p, fl_mlp_ws_t *ws, fl_dptr_t x, size_t b, fl_dptr_t grad,
                    fl_mlp_layer_done_fn done, void *ud)
{
    const fl_mlp_shape_t *m = p->m;
    fl_dptr_t dz = ws->dz;
    fl_dptr_t da = ws->da;
    int rc = FL_OK;
    for (int l = m->nlayers - 1; l >= 0 && rc == FL_OK; l--) {
        size_t in = (size_t)m->sizes[l];
        size_t out = (size_t)m->sizes[l + 1];
        fl_dptr_t a = l == 0 ? x : ws->act[l];
        fl_dptr_t gw = fl_dptr_f32(grad, fl_mlp_weight_at(m, l));
        fl_dptr_t gb = fl_dptr_f32(grad, fl_mlp_bias_at(m, l));
        if ((rc = fl_dev_gemm_wgrad(ws->s, b, out, in, dz, a, gw)) != FL_OK ||
            (rc = fl_dev_bias_grad(ws->s, gb, dz, b, out)) != FL_OK)
            break;
        /* The layer's gradient is queued: its copy out may start behind it. */
        if (done != NULL)
            done(l, ud);
        if (l > 0) {
            /* da = dz W, then zero where the ReLU was off. The last layer is still held from
             * the forward pass. */
            fl_dptr_t w = p->last;
            if (l != m->nlayers - 1 && (rc = get_layer(p, l, &w)) != FL_OK)
                break;
            if ((rc = fl_dev_gemm_igrad(ws->s, b, out, in, dz, w, da)) != FL_OK ||
                (rc = fl_dev_relu_back(ws->s, da, a, b * in)) != FL_OK)
                break;
            fl_dptr_t t = dz;
            dz = da;
            da = t;
        }
        if (l > 0 || m->nlayers == 1)
            put_layer(p, l);
    }
    return rc;
}

int fl_mlp_dgrad(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, fl_dptr_t params,
                 const fl_mlp_dsrc_t *src, fl_dptr_t x, fl_dptr_t y, size_t b, fl_dptr_t grad,
                 fl_mlp_layer_done_fn done, void *ud)
{
    if (b == 0 || b > ws->batch)
        return fl_fail(FL_EINVAL, "model: batch of %zu samples, the workspace holds %zu", b,
                       ws->batch);
    layers_t p = {.m = m, .flat = params, .src = src};
    int rc = forward(&p, ws, x, b);
    if (rc == FL_OK)
        rc = fl_dev_xent(ws->s, ws->act[m->nlayers], y, b, (size_t)m->sizes[m->nlayers], ws->dz,
                         ws->row_loss, ws->out);
    if (rc == FL_OK)
        rc = backward(&p, ws, x, b, grad, done, ud);
    return rc;
}

/* Reads the loss sum and correct count of the last pass over b samples. */
static int result(fl_mlp_ws_t *ws, size_t b, double *sum, size_t *correct)
{
    int rc = fl_dev_d2h(ws->s, ws->hout, ws->out, 2 * sizeof(double));
    if (rc == FL_OK)
        rc = fl_stream_sync(ws->s, 0);
    if (rc != FL_OK)
        return rc;
    double mean = ws->hout[0] / (double)b;
    if (!isfinite(mean))
        return fl_fail(FL_ENONFINITE,
                       "model: the loss is %g (diverged: lower the learning rate "
                       "or clip gradients)",
                       mean);
    *sum = ws->hout[0];
    *correct = (size_t)ws->hout[1];
    return FL_OK;
}

int fl_mlp_dresult(fl_mlp_ws_t *ws, size_t b, double *loss, size_t *correct)
{
    double sum = 0.0;
    int rc = result(ws, b, &sum, correct);
    if (rc == FL_OK)
        *loss = sum / (double)b;
    return rc;
}

/* Host samples as device memory: the buffer itself on cpu, else copied into slot (made on first
 * use for the workspace's batch). */
static int stage(fl_mlp_ws_t *ws, fl_dptr_t *slot, const void *host, size_t bytes,
                 size_t slot_bytes, fl_dptr_t *out)
{
    if (fl_dev_kind(ws->dev) == FL_DEV_CPU)
        return fl_dev_wrap(ws->dev, host, out);
    int rc = fl_dptr_is_null(*slot) ? fl_dev_alloc(ws->dev, slot_bytes, slot) : FL_OK;
    if (rc == FL_OK)
        rc = fl_dev_h2d(ws->s, *slot, host, bytes);
    *out = *slot;
    return rc;
}

int fl_mlp_deval(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, fl_dptr_t params, const float *x,
                 const int32_t *y, size_t n, double *loss, size_t *correct)
{
    double sum = 0.0;
    size_t ok = 0;
    size_t dim = (size_t)m->sizes[0];
    for (size_t at = 0; at < n; at += ws->batch) {
        size_t b = n - at < ws->batch ? n - at : ws->batch;
        fl_dptr_t dx;
        fl_dptr_t dy;
        layers_t p = {.m = m, .flat = params};
        double l = 0.0;
        size_t c = 0;
        int rc = fl_mlp_check_labels(m, y + at, b);
        if (rc == FL_OK)
            rc = stage(ws, &ws->x, x + at * dim, b * dim * sizeof(float),
                       ws->batch * dim * sizeof(float), &dx);
        if (rc == FL_OK)
            rc = stage(ws, &ws->y, y + at, b * sizeof(int32_t), ws->batch * sizeof(int32_t), &dy);
        if (rc == FL_OK)
            rc = forward(&p, ws, dx, b);
        if (rc == FL_OK)
            rc = fl_dev_xent(ws->s, ws->act[m->nlayers], dy, b, (size_t)m->sizes[m->nlayers],
                             fl_dptr_null(), ws->row_loss, ws->out);
        /* The read waits for the chunk, so the staging slots are free for the next. */
        if (rc == FL_OK)
            rc = fl_mlp_dresult(ws, b, &l, &c);
        if (rc != FL_OK)
            return rc;
        sum += l * (double)b;
        ok += c;
    }
    *loss = n > 0 ? sum / (double)n : 0.0;
    *correct = ok;
    return FL_OK;
}

/* ---- the host entry points: host buffers on the workspace's device ---- */

/* A host source's layer on the device: wrapped on cpu, else copied into the next slot and
 * waited for, so that the source may reuse its buffer as soon as the layer is put back. The
 * copy is queued behind the work that used the slot two layers ago. */
typedef struct host_src {
    const fl_mlp_shape_t *m;
    const fl_mlp_src_t *src;
    fl_mlp_ws_t *ws;
    int next;
} host_src_t;

static int host_get(void *ud, int layer, fl_dptr_t *w)
{
    host_src_t *h = ud;
    const float *hw = NULL;
    int rc = h->src->get(h->src->ud, layer, &hw);
    if (rc != FL_OK)
        return rc;
    fl_mlp_ws_t *ws = h->ws;
    if (fl_dev_kind(ws->dev) == FL_DEV_CPU)
        return fl_dev_wrap(ws->dev, hw, w);
    fl_dptr_t *slot = &ws->slot[h->next];
    h->next ^= 1;
    size_t n = (size_t)h->m->sizes[layer + 1] * ((size_t)h->m->sizes[layer] + 1);
    if (fl_dptr_is_null(*slot))
        rc = fl_dev_alloc(ws->dev, ws->slot_cap * sizeof(float), slot);
    if (rc == FL_OK)
        rc = fl_dev_h2d(ws->s, *slot, hw, n * sizeof(float));
    if (rc == FL_OK)
        rc = fl_stream_sync(ws->s, 0);
    *w = *slot;
    return rc;
}

static void host_put(void *ud, int layer)
{
    host_src_t *h = ud;
    h->src->put(h->src->ud, layer);
}

int fl_mlp_dgrad_hsrc(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const fl_mlp_src_t *src,
                      fl_dptr_t x, fl_dptr_t y, size_t b, fl_dptr_t grad, fl_mlp_layer_done_fn done,
                      void *ud)
{
    host_src_t hs = {.m = m, .src = src, .ws = ws};
    fl_mlp_dsrc_t ds = {host_get, host_put, &hs};
    return fl_mlp_dgrad(m, ws, fl_dptr_null(), &ds, x, y, b, grad, done, ud);
}

/* fl_mlp_grad's body on host buffers; src NULL: the flat params. */
static int host_grad(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const float *params,
                     const fl_mlp_src_t *src, const float *x, const int32_t *y, size_t b,
                     float *grad, double *loss, size_t *correct, fl_mlp_layer_done_fn done,
                     void *ud)
{
    if (b == 0 || b > ws->batch)
        return fl_fail(FL_EINVAL, "model: batch of %zu samples, the workspace holds %zu", b,
                       ws->batch);
    int rc = fl_mlp_check_labels(m, y, b);
    if (rc != FL_OK)
        return rc;
    if (fl_dev_kind(ws->dev) != FL_DEV_CPU)
        return fl_fail(FL_EINVAL, "model: host buffers on device %s: use fl_mlp_dgrad",
                       fl_dev_name(ws->dev));
    fl_dptr_t dp = fl_dptr_null();
    fl_dptr_t dx;
    fl_dptr_t dy;
    fl_dptr_t dg;
    host_src_t hs = {.m = m, .src = src, .ws = ws};
    fl_mlp_dsrc_t ds = {host_get, host_put, &hs};
    if ((params != NULL && (rc = fl_dev_wrap(ws->dev, params, &dp)) != FL_OK) ||
        (rc = fl_dev_wrap(ws->dev, x, &dx)) != FL_OK ||
        (rc = fl_dev_wrap(ws->dev, y, &dy)) != FL_OK ||
        (rc = fl_dev_wrap(ws->dev, grad, &dg)) != FL_OK)
        return rc;
    rc = fl_mlp_dgrad(m, ws, dp, src != NULL ? &ds : NULL, dx, dy, b, dg, done, ud);
    if (rc == FL_OK)
        rc = fl_mlp_dresult(ws, b, loss, correct);
    return rc;
}

int fl_mlp_grad(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const float *params, const float *x,
                const int32_t *y, size_t b, float *grad, double *loss, size_t *correct,
                fl_mlp_layer_done_fn done, void *ud)
{
    return host_grad(m, ws, params, NULL, x, y, b, grad, loss, correct, done, ud);
}

int fl_mlp_grad_src(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const fl_mlp_src_t *src,
                    const float *x, const int32_t *y, size_t b, float *grad, double *loss,
                    size_t *correct, fl_mlp_layer_done_fn done, void *ud)
{
    return host_grad(m, ws, NULL, src, x, y, b, grad, loss, correct, done, ud);
}

int fl_mlp_eval(const fl_mlp_shape_t *m, fl_mlp_ws_t *ws, const float *params, const float *x,
                const int32_t *y, size_t n, double *loss, size_t *correct)
{
    /* Host parameters on the workspace's device: as they are on cpu, else a copy. */
    size_t bytes = fl_mlp_nparams(m) * sizeof(float);
    fl_dptr_t dp;
    int rc = fl_dev_mirror(ws->dev, (void *)params, bytes, &dp);
    if (rc == FL_OK)
        rc = fl_dev_h2d(ws->s, dp, params, bytes);
    if (rc == FL_OK)
        rc = fl_mlp_deval(m, ws, dp, x, y, n, loss, correct);
    fl_stream_sync(ws->s, 0); /* nothing queued may still read dp */
    fl_dev_unmirror(ws->dev, &dp);
    return rc;
}
