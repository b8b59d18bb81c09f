/* The devices' side of El Che and local SGD: each device's batches of a sync taken from the
 * host's one sequence (its count of them, from its first), their gradients summed or, under
 * --policy cadence, its own parameters stepped by its own optimizer; the device clocks and the
 * single batches --policy async drives. The plan of the counts is cadence.c's. */
#include "devices_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double l2(const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

/* El Che: r->count batches of the host's sequence from r->first, their gradients summed into
 * r->grad (the device's mean clipped to max_norm first, when set), loss and correct summed. */
void fl_wk_devices_cadence_batches(fl_wk_devices_t *d, replica_t *r)
{
    r->loss = 0.0;
    r->correct = 0;
    r->batch_s = 0.0;
    r->rc = FL_OK;
    if (d->local_sgd)
        memcpy(r->own, d->round_start, d->np * sizeof(float));
    if (r->count == 0) {
        memset(r->grad, 0, d->np * sizeof(float));
        if (d->local_sgd)
            memset(r->own, 0, d->np * sizeof(float));
        return;
    }
    if (r->count > 1 && r->one == NULL && (r->one = malloc(d->np * sizeof(float))) == NULL) {
        r->rc = fl_fail(FL_ENOMEM, "device %d: out of memory", r->j);
        snprintf(r->err, sizeof r->err, "%s", fl_last_error());
        return;
    }
    r->rc = fl_wk_bclock_start(&r->clock, r->rd);
    for (int b = 0; b < r->count && r->rc == FL_OK; b++) {
        int64_t t0 = fl_now_ns();
        fl_sampler_batch(&d->host, r->first + (size_t)b, r->idx);
        float *g = b == 0 || d->local_sgd ? r->grad : r->one;
        double loss = 0.0;
        size_t correct = 0;
        r->rc = fl_wk_rdev_grad(r->rd, d->local_sgd ? r->own : d->params, NULL, d->train, r->idx,
                                FL_WK_NO_TAG, NULL, 0, g, NULL, NULL, &loss, &correct);
        fl_obs_timeline_span(d->tl, FL_WK_TRACK_DEVICE + r->j, "compute", "device", t0,
                             fl_now_ns());
        if (r->rc == FL_OK && d->local_sgd) {
            if (d->max_norm > 0.0) {
                double f = fl_cmp_clip_factor(l2(g, d->np), d->max_norm);
                for (size_t i = 0; f != 1.0 && i < d->np; i++)
                    g[i] *= (float)f;
            }
            r->rc = fl_opt_step(r->opt, r->own, g, fl_lr_at(d->sched, (long)(d->step0 + b)));
        }
        fl_wk_devices_throttle(r, t0);
        r->loss += loss;
        r->correct += correct;
        if (b > 0 && !d->local_sgd)
            for (size_t i = 0; i < d->np; i++)
                r->grad[i] += g[i];
    }
    if (d->local_sgd && r->rc == FL_OK) {
        /* The device's delta from the round's start, and count x delta for the average. */
        for (size_t i = 0; i < d->np; i++) {
            r->own[i] -= d->round_start[i];
            r->grad[i] = r->own[i] * (float)r->count;
        }
    }
    /* The end is recorded after the last --throttle sleep: a throttled device is slower. */
    double secs = 0.0;
    if (r->rc == FL_OK)
        r->rc = fl_wk_bclock_stop(&r->clock, r->rd, &secs);
    if (r->rc != FL_OK) {
        snprintf(r->err, sizeof r->err, "%s", fl_last_error());
        return;
    }
    r->batch_s = secs / r->count;
    if (d->max_norm > 0.0 && !d->local_sgd) {
        double f = fl_cmp_clip_factor(l2(r->grad, d->np) / r->count, d->max_norm);
        for (size_t i = 0; f != 1.0 && i < d->np; i++)
            r->grad[i] *= (float)f;
    }
}

int fl_wk_devices_cadence_step(fl_wk_devices_t *d, const float *params, const int *counts,
                               size_t first, double *batch_s, double *loss, size_t *correct)
{
    if (!d->have_host)
        return fl_fail(FL_EINVAL, "devices made without a cadence (max_anchor 0)");
    size_t at = first;
    for (int j = 0; j < d->n; j++) {
        d->rep[j].count = counts[j];
        d->rep[j].first = at;
        at += (size_t)counts[j];
    }
    d->cadence = true;
    fl_wk_local_t keep = d->local;
    d->local = FL_WK_LOCAL_MEAN; /* no reduction inside the step: fl_wk_devices_combine does it */
    int rc = fl_wk_devices_step(d, params, 0, NULL, NULL, loss, correct);
    d->local = keep;
    d->cadence = false;
    size_t total = at - first;
    /* fl_wk_devices_step averaged the devices' loss sums: make it the mean per batch. */
    *loss = total ? *loss * d->n / (double)total : 0.0;
    for (int j = 0; j < d->n; j++)
        batch_s[j] = d->rep[j].batch_s;
    return rc;
}

void fl_wk_devices_combine(fl_wk_devices_t *d, float scale, fl_wk_ready_fn ready, void *ud)
{
    float *grad = d->rep[0].grad;
    for (size_t i = 0; i < d->np; i++) {
        float s = grad[i];
        for (int k = 1; k < d->n; k++)
            s += d->rep[k].grad[i];
        grad[i] = s * scale;
    }
    if (ready == NULL)
        return;
    if (d->local == FL_WK_LOCAL_SHARDS && d->n > 1)
        for (int j = 0; j < d->n; j++)
            ready(j, fl_shard_offset(d->np, d->n, j), ud);
    else
        ready(0, 0, ud);
}

int fl_wk_devices_clock_start(fl_wk_devices_t *d, int j)
{
    return fl_wk_bclock_start(&d->rep[j].clock, d->rep[j].rd);
}

int fl_wk_devices_clock_stop(fl_wk_devices_t *d, int j, double *seconds)
{
    return fl_wk_bclock_stop(&d->rep[j].clock, d->rep[j].rd, seconds);
}

int fl_wk_devices_host_batch(fl_wk_devices_t *d, int j, const float *params, size_t index,
                             float *grad, double *loss, size_t *correct)
{
    if (!d->have_host)
        return fl_fail(FL_EINVAL, "devices made without a cadence (max_anchor 0)");
    replica_t *r = &d->rep[j];
    int64_t t0 = fl_now_ns();
    fl_sampler_batch(&d->host, index, r->idx);
    /* The calling thread (--policy async's, device j's) computes on the device. */
    int rc = fl_wk_rdev_bind(r->rd);
    if (rc == FL_OK)
        rc = fl_wk_rdev_grad(r->rd, params, NULL, d->train, r->idx, FL_WK_NO_TAG, NULL, 0, grad,
                             NULL, NULL, loss, correct);
    fl_obs_timeline_span(d->tl, FL_WK_TRACK_DEVICE + j, "compute", "device", t0, fl_now_ns());
    fl_wk_devices_throttle(r, t0);
    if (rc == FL_OK && d->max_norm > 0.0) {
        double f = fl_cmp_clip_factor(l2(grad, d->np), d->max_norm);
        for (size_t i = 0; f != 1.0 && i < d->np; i++)
            grad[i] *= (float)f;
    }
    return rc;
}

int fl_wk_devices_local_create(fl_wk_devices_t *d, const fl_opt_opts_t *opt)
{
    for (int j = 0; j < d->n; j++) {
        replica_t *r = &d->rep[j];
        if ((r->own = malloc(d->np * sizeof(float))) == NULL)
            return fl_fail(FL_ENOMEM, "device %d: out of memory for its parameters", j);
        int rc = fl_opt_create(opt, d->np, &r->opt);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

fl_opt_t *fl_wk_devices_local_opt(fl_wk_devices_t *d, int j)
{
    return j >= 0 && j < d->n ? d->rep[j].opt : NULL;
}

int fl_wk_devices_local_round(fl_wk_devices_t *d, const float *start, const int *counts,
                              size_t first, const fl_lr_sched_t *sched, double step0,
                              double *batch_s, double *loss, size_t *correct)
{
    d->local_sgd = true;
    d->round_start = start;
    d->sched = sched;
    d->step0 = step0;
    int rc = fl_wk_devices_cadence_step(d, start, counts, first, batch_s, loss, correct);
    d->local_sgd = false;
    return rc;
}

double fl_wk_devices_divergence(const fl_wk_devices_t *d, const float *params,
                                const float *avg_delta)
{
    double norm = l2(params, d->np);
    double worst = 0.0;
    for (int j = 0; j < d->n; j++) {
        const replica_t *r = &d->rep[j];
        if (r->count == 0)
            continue;
        double s = 0.0;
        for (size_t i = 0; i < d->np; i++) {
            double x = (double)r->own[i] - avg_delta[i];
            s += x * x;
        }
        double v = norm > 0 ? sqrt(s) / norm : 0.0;
        worst = v > worst ? v : worst;
    }
    return worst;
}
