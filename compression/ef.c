/* Error feedback: what top-k did not send stays in a residual and joins the next gradient, so
 * nothing is lost, only delayed (DGC). With momentum correction the velocity accumulates
 * instead (u = m*u + g; v += u), and the sent entries of both are cleared (momentum factor
 * masking). Values leave rounded to the wire type; the residual keeps the rounding error. A
 * gradient with a NaN or Inf never reaches the residual. Also the density warm-up schedule and
 * the clipping factor. */
#include "cmp_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fl_cmp_ef {
    size_t n;
    char name[64];
    float momentum;
    double max_norm;
    fl_cmp_nonfinite_t on_nonfinite;
    fl_dtype_t wire;
    float *residual; /* v */
    float *velocity; /* u, only with momentum */
};

void fl_cmp_ef_opts_init(fl_cmp_ef_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->name = "gradient";
    o->on_nonfinite = FL_NONFINITE_FAIL;
    o->wire = FL_FLOAT32;
}

int fl_cmp_ef_create(const fl_cmp_ef_opts_t *o, fl_cmp_ef_t **out)
{
    *out = NULL;
    const char *name = o->name != NULL ? o->name : "gradient";
    if (o->n == 0 || o->n > UINT32_MAX)
        return fl_fail(FL_EINVAL, "error feedback for '%s': n = %zu must be 1..2^32-1", name, o->n);
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f))
        return fl_fail(FL_EINVAL, "error feedback for '%s': momentum %g is outside [0, 1)", name,
                       (double)o->momentum);
    if (!(o->max_norm >= 0.0) || isinf(o->max_norm))
        return fl_fail(FL_EINVAL, "error feedback for '%s': max_norm %g must be finite and >= 0",
                       name, o->max_norm);
    if (o->wire != FL_FLOAT32 && o->wire != FL_FLOAT16 && o->wire != FL_BFLOAT16)
        return fl_fail(FL_EINVAL,
                       "error feedback for '%s': wire type %s is not float32, "
                       "float16 or bfloat16",
                       name, fl_dtype_name(o->wire));
    if (o->on_nonfinite != FL_NONFINITE_FAIL && o->on_nonfinite != FL_NONFINITE_SKIP)
        return fl_fail(FL_EINVAL, "error feedback for '%s': on_nonfinite %d unknown", name,
                       (int)o->on_nonfinite);
    fl_cmp_ef_t *e = calloc(1, sizeof *e);
    if (e == NULL)
        return fl_fail(FL_ENOMEM, "error feedback for '%s': out of memory", name);
    e->n = o->n;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->momentum = o->momentum;
    e->max_norm = o->max_norm;
    e->on_nonfinite = o->on_nonfinite;
    e->wire = o->wire;
    e->residual = calloc(o->n, sizeof *e->residual);
    if (o->momentum > 0.0f)
        e->velocity = calloc(o->n, sizeof *e->velocity);
    if (e->residual == NULL || (o->momentum > 0.0f && e->velocity == NULL)) {
        fl_cmp_ef_destroy(&e);
        return fl_fail(FL_ENOMEM, "error feedback for '%s': out of memory for %zu entries", name,
                       o->n);
    }
    *out = e;
    return FL_OK;
}

void fl_cmp_ef_destroy(fl_cmp_ef_t **ef)
{
    if (ef == NULL || *ef == NULL)
        return;
    free((*ef)->residual);
    free((*ef)->velocity);
    free(*ef);
    *ef = NULL;
}

static double l2norm(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * (double)g[i];
    return sqrt(s);
}

double fl_cmp_clip_factor(double norm, double max_norm)
{
    if (max_norm <= 0.0 || !(norm > max_norm))
        return 1.0;
    return max_norm / norm;
}

int fl_cmp_ef_step(fl_cmp_ef_t *e, fl_cmp_ws_t *ws, const float *grad,
                   const fl_cmp_topk_opts_t *topk, uint32_t *idx, float *val, size_t *k_out,
                   bool *skipped)
{
    if (skipped != NULL)
        *skipped = false;
    *k_out = 0;
    fl_cmp_topk_opts_t o = *topk;
    o.name = e->name;
    size_t k;
    int rc = fl_cmp_topk_check(e->n, &o, &k);
    if (rc != FL_OK)
        return rc;
    /* Check before touching the state: a bad gradient must never reach the residual. */
    if ((rc = fl_cmp_nonfinite_at(grad, e->n, e->name)) != FL_OK) {
        if (e->on_nonfinite == FL_NONFINITE_SKIP) {
            if (skipped != NULL)
                *skipped = true;
            return FL_OK;
        }
        return rc;
    }
    float scale =
        (float)fl_cmp_clip_factor(e->max_norm > 0.0 ? l2norm(grad, e->n) : 0.0, e->max_norm);
    float *v = e->residual;
    /* fl_ef_accum is the device kernels' body too (fl_math.h). */
    if (e->velocity != NULL) {
        for (size_t i = 0; i < e->n; i++)
            fl_ef_accum(&v[i], &e->velocity[i], grad[i], e->momentum, scale, true);
    } else {
        float unused = 0.0f; /* no velocity: fl_ef_accum leaves it alone */
        for (size_t i = 0; i < e->n; i++)
            fl_ef_accum(&v[i], &unused, grad[i], e->momentum, scale, false);
    }
    if ((rc = fl_cmp_topk(ws, v, e->n, &o, idx, val, k_out)) != FL_OK)
        return rc; /* only a non-finite residual (overflow) gets here; the detail says where */
    for (size_t j = 0; j < *k_out; j++) {
        uint32_t i = idx[j];
        float sent = fl_cmp_round(val[j], e->wire);
        val[j] = sent;
        v[i] -= sent; /* zero, or the rounding error the wire type could not carry */
        if (e->velocity != NULL)
            e->velocity[i] = 0.0f;
    }
    return FL_OK;
}

void fl_cmp_ef_state(const fl_cmp_ef_t *e, const float **residual, const float **velocity,
                     size_t *n)
{
    *residual = e->residual;
    *velocity = e->velocity;
    *n = e->n;
}

int fl_cmp_ef_restore(fl_cmp_ef_t *e, const float *residual, const float *velocity, size_t n)
{
    if (n != e->n)
        return fl_fail(FL_EINVAL,
                       "error feedback for '%s': saved state has %zu entries, the "
                       "tensor %zu",
                       e->name, n, e->n);
    int rc = fl_cmp_nonfinite_at(residual, n, e->name);
    if (rc == FL_OK && velocity != NULL)
        rc = fl_cmp_nonfinite_at(velocity, n, e->name);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "error feedback: restoring saved state");
    memcpy(e->residual, residual, n * sizeof *residual);
    if (e->velocity != NULL) {
        if (velocity != NULL)
            memcpy(e->velocity, velocity, n * sizeof *velocity);
        else
            memset(e->velocity, 0, n * sizeof *e->velocity);
    }
    return FL_OK;
}

double fl_cmp_ef_residual_norm(const fl_cmp_ef_t *e)
{
    return l2norm(e->residual, e->n);
}

void fl_cmp_schedule_init(fl_cmp_schedule_t *s)
{
    s->density = 0.001;
    s->warmup_epochs = 4;
}

double fl_cmp_schedule_density(const fl_cmp_schedule_t *s, double epoch)
{
    if (s->warmup_epochs <= 0 || epoch >= (double)s->warmup_epochs)
        return s->density;
    if (epoch < 0.0)
        epoch = 0.0;
    /* DGC: 25%, 6.25%, 1.56%, 0.4%, then 0.1% is 0.001^(1/5), ^(2/5), ... per epoch. */
    double e = floor(epoch);
    return pow(s->density, (e + 1.0) / ((double)s->warmup_epochs + 1.0));
}
