/* Top-k with error feedback on the device that computed the gradient: the residuals live
 * there, each bucket is accumulated (clipped first when --max-grad-norm is set, as DGC does),
 * selected and reduced by what was sent on a stream of the exchange's own, behind the event of
 * the layer that completed the bucket; only the k pairs come back to the host for the sparse
 * allreduce. The same arithmetic as compression/ef.c (fl_math.h's bodies), so the pairs and
 * residuals equal the host's bit for bit. exchange.c decides when to use it. */
#include "wk_xchg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fl_wk_dcmp {
    fl_wk_rdev_t *rd;
    fl_dev_t *dev;
    const fl_mlp_shape_t *m;
    fl_stream_t *s;
    fl_event_t *done;
    fl_dev_topk_t *topk;
    fl_dptr_t residual; /* one per parameter of the range, bucket b at its offset */
    fl_dptr_t idx;      /* the widest bucket's k pairs */
    fl_dptr_t val;
    fl_dptr_t out; /* top-k's count and first bad index, then the bucket's norm */
    size_t from;   /* the range's first parameter */
    size_t n;
    double max_norm;
    int wire;
    uint32_t *hidx; /* page-locked copies of the pairs */
    float *hval;
    int64_t *hout;
};

static int wire_of(fl_dtype_t t)
{
    return t == FL_FLOAT16 ? FL_WIRE_F16 : t == FL_BFLOAT16 ? FL_WIRE_BF16 : FL_WIRE_F32;
}

int fl_wk_dcmp_create(fl_wk_rdev_t *rd, const fl_wk_train_opts_t *o, size_t from, size_t n,
                      size_t widest, fl_wk_dcmp_t **out)
{
    *out = NULL;
    fl_wk_dcmp_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "exchange: out of memory");
    c->rd = rd;
    c->dev = fl_wk_rdev_dev(rd);
    c->m = &o->shape;
    c->from = from;
    c->n = n;
    c->max_norm = o->max_norm;
    c->wire = wire_of(o->topk_values);
    int rc = fl_dev_bind(c->dev);
    if (rc == FL_OK)
        rc = fl_stream_create(c->dev, &c->s);
    if (rc == FL_OK)
        rc = fl_event_create(c->dev, &c->done);
    if (rc == FL_OK)
        rc = fl_dev_topk_create(c->dev, widest, &c->topk);
    if (rc == FL_OK)
        rc = fl_dev_alloc(c->dev, n * sizeof(float), &c->residual);
    if (rc == FL_OK)
        rc = fl_dev_memset(c->s, c->residual, 0, n * sizeof(float));
    if (rc == FL_OK)
        rc = fl_dev_alloc(c->dev, widest * sizeof(uint32_t), &c->idx);
    if (rc == FL_OK)
        rc = fl_dev_alloc(c->dev, widest * sizeof(float), &c->val);
    if (rc == FL_OK)
        rc = fl_dev_alloc(c->dev, 4 * sizeof(int64_t), &c->out);
    if (rc == FL_OK)
        rc = fl_dev_host_alloc(c->dev, widest * sizeof(uint32_t), (void **)&c->hidx);
    if (rc == FL_OK)
        rc = fl_dev_host_alloc(c->dev, widest * sizeof(float), (void **)&c->hval);
    if (rc == FL_OK)
        rc = fl_dev_host_alloc(c->dev, 4 * sizeof(int64_t), (void **)&c->hout);
    if (rc == FL_OK)
        rc = fl_stream_sync(c->s, 0);
    if (rc != FL_OK) {
        fl_wk_dcmp_destroy(&c);
        return fl_fail_ctx(rc, "exchange: top-k on device %s", fl_dev_name(fl_wk_rdev_dev(rd)));
    }
    *out = c;
    return FL_OK;
}

static void wk_dcmp_destroy(fl_wk_dcmp_t **pc)
{
    if (pc == NULL || *pc == NULL)
        return;
    fl_wk_dcmp_t *c = *pc;
    fl_stream_destroy(&c->s);
    fl_event_destroy(&c->done);
    fl_dev_topk_destroy(&c->topk);
    fl_dptr_t *bufs[] = {&c->residual, &c->idx, &c->val, &c->out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        fl_dev_free(c->dev, bufs[i]);
    fl_dev_host_free(c->dev, c->hidx);
    fl_dev_host_free(c->dev, c->hval);
    fl_dev_host_free(c->dev, c->hout);
    free(c);
    *pc = NULL;
}

void fl_wk_dcmp_destroy(fl_wk_dcmp_t **pc)
{
    fl_error_keep_begin();
    wk_dcmp_destroy(pc);
    fl_error_keep_end();
}

int fl_wk_dcmp_bind(fl_wk_dcmp_t *c)
{
    return fl_dev_bind(c->dev);
}

/* The layer whose completion completes parameters from `at` on: the one holding `at`. */
static int layer_of(const fl_mlp_shape_t *m, size_t at)
{
    int l = 0;
    while (l + 1 < m->nlayers && fl_mlp_weight_at(m, l + 1) <= at)
        l++;
    return l;
}

/* Queues, waits for and reads back what the stream computed into out. */
static int read_out(fl_wk_dcmp_t *c, size_t bytes)
{
    int rc = fl_dev_d2h(c->s, c->hout, c->out, bytes);
    if (rc == FL_OK)
        rc = fl_event_record(c->done, c->s);
    return rc == FL_OK ? fl_event_sync(c->done, 0) : rc;
}

int fl_wk_dcmp_bucket(fl_wk_dcmp_t *c, size_t start, size_t len, size_t k, uint32_t **idx,
                      float **val)
{
    fl_dptr_t g = fl_dptr_f32(fl_wk_rdev_grad_buf(c->rd), start);
    fl_dptr_t v = fl_dptr_f32(c->residual, start - c->from);
    int rc = fl_stream_wait(c->s, fl_wk_rdev_layer_event(c->rd, layer_of(c->m, start)));
    if (rc != FL_OK)
        return rc;
    /* A NaN or Inf in the gradient is refused before anything else is read back (the host's
     * error feedback checks first too); with clipping the bucket's norm comes with it. */
    double scale = 1.0;
    if ((rc = fl_dev_nonfinite(c->s, g, len, c->out)) != FL_OK ||
        (c->max_norm > 0.0 &&
         (rc = fl_dev_sumsq(c->s, g, len, fl_dptr_at(c->out, sizeof(int64_t)))) != FL_OK) ||
        (rc = read_out(c, 2 * sizeof(int64_t))) != FL_OK)
        return rc;
    if (c->hout[0] >= 0)
        return fl_fail(FL_ENONFINITE,
                       "device %s: top-k of the gradient: parameter %lld is not "
                       "finite",
                       fl_dev_name(c->dev), (long long)(start + (size_t)c->hout[0]));
    if (c->max_norm > 0.0) {
        double ss;
        memcpy(&ss, &c->hout[1], sizeof ss);
        scale = fl_cmp_clip_factor(sqrt(ss), c->max_norm);
    }
    /* The selection is read before the residual is reduced by it: a residual that overflowed
     * selects nothing, and nothing may then be subtracted. */
    if ((rc = fl_dev_ef_accum(c->s, v, fl_dptr_null(), g, len, 0.0f, (float)scale)) != FL_OK ||
        (rc = fl_dev_topk(c->s, c->topk, v, len, k, c->idx, c->val, c->out)) != FL_OK ||
        (rc = read_out(c, 2 * sizeof(int64_t))) != FL_OK)
        return rc;
    if (c->hout[1] >= 0)
        return fl_fail(FL_ENONFINITE,
                       "device %s: top-k of the gradient: the residual of "
                       "parameter %lld overflowed",
                       fl_dev_name(c->dev), (long long)(start + (size_t)c->hout[1]));
    if ((rc = fl_dev_ef_sent(c->s, v, fl_dptr_null(), c->idx, c->val, k, len, c->wire)) != FL_OK ||
        (rc = fl_dev_d2h(c->s, c->hidx, c->idx, k * sizeof(uint32_t))) != FL_OK ||
        (rc = fl_dev_d2h(c->s, c->hval, c->val, k * sizeof(float))) != FL_OK ||
        (rc = fl_event_record(c->done, c->s)) != FL_OK || (rc = fl_event_sync(c->done, 0)) != FL_OK)
        return rc;
    *idx = c->hidx;
    *val = c->hval;
    return FL_OK;
}

double fl_wk_dcmp_residual_norm(fl_wk_dcmp_t *c)
{
    double ss = 0.0;
    if (fl_dev_bind(c->dev) != FL_OK || fl_dev_sumsq(c->s, c->residual, c->n, c->out) != FL_OK ||
        read_out(c, sizeof(double)) != FL_OK)
        return NAN;
    memcpy(&ss, &c->hout[0], sizeof ss);
    return sqrt(ss);
}

/* The residual crosses to and from the host on the exchange's stream, waited for: between
 * steps nothing else is queued on it. */
int fl_wk_dcmp_residual_get(fl_wk_dcmp_t *c, float *out)
{
    int rc = fl_dev_bind(c->dev);
    if (rc == FL_OK)
        rc = fl_dev_d2h(c->s, out, c->residual, c->n * sizeof(float));
    if (rc == FL_OK)
        rc = fl_event_record(c->done, c->s);
    return rc == FL_OK ? fl_event_sync(c->done, 0) : rc;
}

int fl_wk_dcmp_residual_put(fl_wk_dcmp_t *c, const float *in)
{
    for (size_t i = 0; i < c->n; i++)
        if (!isfinite(in[i]))
            return fl_fail(FL_ENONFINITE, "device %s: a restored residual is not finite at %zu",
                           fl_dev_name(c->dev), c->from + i);
    int rc = fl_dev_bind(c->dev);
    if (rc == FL_OK)
        rc = fl_dev_h2d(c->s, c->residual, in, c->n * sizeof(float));
    if (rc == FL_OK)
        rc = fl_event_record(c->done, c->s);
    return rc == FL_OK ? fl_event_sync(c->done, 0) : rc;
}
