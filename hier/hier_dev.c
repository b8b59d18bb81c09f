/* Top-k with error feedback on a device: each bucket's residual (this rank's shard of it under
 * hybrid) lives in device memory; the gradient part is accumulated (clipped first when max_norm
 * is set), its top-k selected and the residual reduced by what was sent, on the engine's
 * stream; only the k pairs come back to the host for the sparse allreduce. The arithmetic is
 * compression/ef.c's (fl_math.h's bodies), so pairs and residuals equal the host engine's bit
 * for bit. With FL_HIER_MEM_SIM the bucket is host memory, staged into the simulated device's
 * arena: the device code paths run in CI, under ThreadSanitizer. */
#include "hier_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int wire_of(fl_dtype_t t)
{
    return t == FL_FLOAT16 ? FL_WIRE_F16 : t == FL_BFLOAT16 ? FL_WIRE_BF16 : FL_WIRE_F32;
}

static int alloc_all(hier_dev_t *d, size_t widest, size_t kmax, size_t nres)
{
    int rc = fl_stream_create(d->dev, &d->s);
    if (rc == FL_OK)
        rc = fl_event_create(d->dev, &d->done);
    if (rc == FL_OK)
        rc = fl_dev_topk_create(d->dev, widest, &d->topk);
    if (rc == FL_OK)
        rc = fl_dev_alloc(d->dev, widest * sizeof(float), &d->grad);
    if (rc == FL_OK)
        rc = fl_dev_alloc(d->dev, nres * sizeof(float), &d->residual);
    if (rc == FL_OK)
        rc = fl_dev_memset(d->s, d->residual, 0, nres * sizeof(float));
    if (rc == FL_OK)
        rc = fl_dev_alloc(d->dev, kmax * sizeof(uint32_t), &d->idx);
    if (rc == FL_OK)
        rc = fl_dev_alloc(d->dev, kmax * sizeof(float), &d->val);
    if (rc == FL_OK)
        rc = fl_dev_alloc(d->dev, 4 * sizeof(int64_t), &d->out);
    if (rc == FL_OK)
        rc = fl_dev_host_alloc(d->dev, 4 * sizeof(int64_t), (void **)&d->hout);
    if (rc == FL_OK)
        rc = fl_stream_sync(d->s, 0);
    return rc;
}

int fl_hier_dev_setup(fl_hier_t *h, fl_dev_kind_t kind, int id)
{
    size_t widest = 1, kmax = 1, nres = 1;
    for (size_t i = 0; i < h->nbuckets; i++) {
        hier_bucket_t *b = &h->b[i];
        b->res_off = nres - 1;
        nres += b->shard_len;
        widest = b->shard_len > widest ? b->shard_len : widest;
        kmax = b->k > kmax ? b->k : kmax;
    }
    hier_dev_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return fl_fail(FL_ENOMEM, "hier: out of memory");
    h->dev = d;
    d->wire = wire_of(h->values);
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = kind;
    o.id = id;
    int rc = fl_dev_create(&o, &d->dev);
    if (rc == FL_OK)
        rc = fl_dev_bind(d->dev);
    if (rc == FL_OK)
        rc = alloc_all(d, widest, kmax, nres);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "hier: top-k on device %s %d", fl_dev_kind_name(kind), id);
    return FL_OK;
}

void fl_hier_dev_destroy(hier_dev_t **pd)
{
    hier_dev_t *d = *pd;
    if (d == NULL)
        return;
    fl_error_keep_begin();
    fl_stream_destroy(&d->s);
    fl_event_destroy(&d->done);
    fl_dev_topk_destroy(&d->topk);
    fl_dptr_t *bufs[] = {&d->grad, &d->residual, &d->idx, &d->val, &d->out};
    for (size_t i = 0; d->dev != NULL && i < sizeof bufs / sizeof bufs[0]; i++)
        fl_dev_free(d->dev, bufs[i]);
    if (d->dev != NULL)
        fl_dev_host_free(d->dev, d->hout);
    fl_dev_destroy(&d->dev);
    free(d);
    *pd = NULL;
    fl_error_keep_end();
}

/* Queues, waits for and reads back what the stream computed into hout. */
static int read_out(hier_dev_t *d, size_t bytes)
{
    int rc = fl_dev_d2h(d->s, d->hout, d->out, bytes);
    if (rc == FL_OK)
        rc = fl_event_record(d->done, d->s);
    return rc == FL_OK ? fl_event_sync(d->done, 0) : rc;
}

/* A NaN or Inf is refused before the residual is touched, as the host's error feedback does;
 * with clipping the part's norm comes back with the check. */
static int check_part(fl_hier_t *h, hier_bucket_t *b, fl_dptr_t g, double *scale)
{
    hier_dev_t *d = h->dev;
    size_t len = b->shard_len;
    int rc = fl_dev_nonfinite(d->s, g, len, d->out);
    if (rc == FL_OK && h->max_norm > 0.0)
        rc = fl_dev_sumsq(d->s, g, len, fl_dptr_at(d->out, sizeof(int64_t)));
    if (rc == FL_OK)
        rc = read_out(d, 2 * sizeof(int64_t));
    if (rc != FL_OK)
        return rc;
    if (d->hout[0] >= 0)
        return fl_fail(FL_ENONFINITE, "error feedback for '%s': gradient[%lld] is not finite",
                       b->name, (long long)(b->shard_off + (size_t)d->hout[0]));
    *scale = 1.0;
    if (h->max_norm > 0.0) {
        double ss;
        memcpy(&ss, &d->hout[1], sizeof ss);
        *scale = fl_cmp_clip_factor(sqrt(ss), h->max_norm);
    }
    return FL_OK;
}

int fl_hier_dev_topk(fl_hier_t *h, hier_bucket_t *b, const float *part, size_t *k)
{
    hier_dev_t *d = h->dev;
    size_t len = b->shard_len;
    fl_dptr_t v = fl_dptr_f32(d->residual, b->res_off);
    double scale = 1.0;
    int rc = fl_dev_bind(d->dev);
    if (rc == FL_OK)
        rc = fl_dev_h2d(d->s, d->grad, part, len * sizeof(float));
    if (rc == FL_OK)
        rc = check_part(h, b, d->grad, &scale);
    /* The selection is read before the residual is reduced by it: a residual that overflowed
     * selects nothing, and nothing may then be subtracted. */
    if (rc == FL_OK)
        rc = fl_dev_ef_accum(d->s, v, fl_dptr_null(), d->grad, len, 0.0f, (float)scale);
    if (rc == FL_OK)
        rc = fl_dev_topk(d->s, d->topk, v, len, b->k, d->idx, d->val, d->out);
    if (rc == FL_OK)
        rc = read_out(d, 2 * sizeof(int64_t));
    if (rc != FL_OK)
        return rc;
    if (d->hout[1] >= 0)
        return fl_fail(FL_ENONFINITE, "error feedback for '%s': the residual of [%lld] overflowed",
                       b->name, (long long)(b->shard_off + (size_t)d->hout[1]));
    rc = fl_dev_ef_sent(d->s, v, fl_dptr_null(), d->idx, d->val, b->k, len, d->wire);
    if (rc == FL_OK)
        rc = fl_dev_d2h(d->s, b->idx, d->idx, b->k * sizeof(uint32_t));
    if (rc == FL_OK)
        rc = fl_dev_d2h(d->s, b->val, d->val, b->k * sizeof(float));
    if (rc == FL_OK)
        rc = fl_event_record(d->done, d->s);
    if (rc == FL_OK)
        rc = fl_event_sync(d->done, 0);
    *k = b->k;
    return rc;
}

/* The residual crosses to and from the host on the engine's stream, waited for. */
int fl_hier_dev_residual(fl_hier_t *h, size_t b, float *out, const float *in)
{
    hier_dev_t *d = h->dev;
    fl_dptr_t v = fl_dptr_f32(d->residual, h->b[b].res_off);
    size_t bytes = h->b[b].shard_len * sizeof(float);
    int rc = fl_dev_bind(d->dev);
    if (rc == FL_OK)
        rc = out != NULL ? fl_dev_d2h(d->s, out, v, bytes) : fl_dev_h2d(d->s, v, in, bytes);
    if (rc == FL_OK)
        rc = fl_event_record(d->done, d->s);
    return rc == FL_OK ? fl_event_sync(d->done, 0) : rc;
}
