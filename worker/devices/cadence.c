/* El Che's cadence, as pure logic: how many batches each device of a host does between two
 * synchronisations. The slowest device of the whole job does `anchor` batches; every device
 * gets the batches that fit in the same time (its EMA of seconds per batch), and at least 5% of
 * its host's work. The anchor is the smallest that keeps the exchange under the overhead target
 * (exchange time <= overhead x compute time of a sync), bounded by max_anchor. The figures that
 * decide (slowest device, exchange time) are the job's maxima, the same on every rank, so every
 * host plans for the same sync time. */
#include "wk_devices.h"

#include <math.h>
#include <string.h>

#define EMA_WEIGHT 0.3 /* of the newest observation */
#define MIN_SHARE 0.05 /* of the host's batches, for any device */

void fl_wk_cadence_init(fl_wk_cadence_t *c, int n, int max_anchor, double overhead,
                        const double *hint)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->max_anchor = max_anchor;
    c->overhead = overhead;
    c->anchor = 1;
    c->slowest_s = 0.0;
    for (int j = 0; j < n; j++) {
        /* A hint is a relative speed: 2 means twice as fast as a device of speed 1. */
        double h = hint != NULL && hint[j] > 0 ? hint[j] : 1.0;
        c->hint[j] = h;
        c->ema_s[j] = 0.0;
    }
    fl_wk_cadence_plan(c, 0.0, 0.0);
}

void fl_wk_cadence_observe(fl_wk_cadence_t *c, const double *batch_s)
{
    for (int j = 0; j < c->n; j++) {
        if (!(batch_s[j] > 0))
            continue; /* no batch this sync: nothing learnt */
        c->ema_s[j] =
            c->ema_s[j] > 0 ? (1 - EMA_WEIGHT) * c->ema_s[j] + EMA_WEIGHT * batch_s[j] : batch_s[j];
    }
}

double fl_wk_cadence_slowest(const fl_wk_cadence_t *c)
{
    double s = 0.0;
    for (int j = 0; j < c->n; j++)
        s = c->ema_s[j] > s ? c->ema_s[j] : s;
    return s;
}

/* Seconds per batch of device j: measured, else from the hints relative to the fastest. */
static double batch_time(const fl_wk_cadence_t *c, int j, double slowest)
{
    if (c->ema_s[j] > 0)
        return c->ema_s[j];
    double hmin = c->hint[0];
    for (int k = 1; k < c->n; k++)
        hmin = c->hint[k] < hmin ? c->hint[k] : hmin;
    double base = slowest > 0 ? slowest : 1.0;
    return base * hmin / c->hint[j];
}

void fl_wk_cadence_plan(fl_wk_cadence_t *c, double job_slowest_s, double job_exchange_s)
{
    if (c->max_anchor <= 0) {
        c->anchor = 1;
        for (int j = 0; j < c->n; j++)
            c->counts[j] = 1;
        return;
    }
    c->slowest_s = job_slowest_s;
    if (job_slowest_s > 0 && job_exchange_s > 0 && c->overhead > 0) {
        double a = ceil(job_exchange_s / (c->overhead * job_slowest_s));
        c->anchor = a < 1 ? 1 : a > c->max_anchor ? c->max_anchor : (int)a;
    }
    /* The sync lasts what the job's slowest device needs for anchor batches. */
    double slowest = job_slowest_s;
    if (!(slowest > 0))
        for (int j = 0; j < c->n; j++)
            slowest = batch_time(c, j, 0.0) > slowest ? batch_time(c, j, 0.0) : slowest;
    double budget = c->anchor * slowest;
    int total = 0;
    for (int j = 0; j < c->n; j++) {
        double t = batch_time(c, j, job_slowest_s);
        double k = floor(budget / t + 1e-9);
        int cap = c->anchor * 64; /* a device 64x faster than the slowest is not believable */
        c->counts[j] = k < 1 ? 1 : k > cap ? cap : (int)k;
        total += c->counts[j];
    }
    int floor_count = (int)ceil(MIN_SHARE * total);
    for (int j = 0; j < c->n; j++)
        if (c->counts[j] < floor_count)
            c->counts[j] = floor_count;
}

/* El Che: the plan cut to the batches the host has left, in proportion. Returns the total. */
size_t fl_wk_fit_counts(const int *plan, int n, size_t left, int *out)
{
    size_t want = 0;
    for (int j = 0; j < n; j++)
        want += (size_t)plan[j];
    size_t total = 0;
    for (int j = 0; j < n; j++) {
        out[j] = want <= left ? plan[j] : (int)((size_t)plan[j] * left / want);
        total += (size_t)out[j];
    }
    for (int j = 0; total < left && total < want; j = (j + 1) % n) {
        if (out[j] < plan[j]) {
            out[j]++;
            total++;
        }
    }
    return total;
}
