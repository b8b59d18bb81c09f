/* Parameters resident on the devices (--policy sync): each device keeps its copy and an
 * optimizer over its range (the whole model under --shard none, its shard under hybrid and
 * grad), steps it from the averaged gradient on its own thread, and hands parameters and
 * optimizer state to and from the host for evaluation, saving and checkpoints. */
#include "devices_int.h"

#include <stdio.h>

int fl_wk_devices_keep(fl_wk_devices_t *d, const fl_opt_opts_t *opt, float *params,
                       const size_t *off, const size_t *len, bool keep_grad)
{
    if (keep_grad && d->n > 1)
        return fl_fail(FL_EINVAL, "a gradient kept on the device needs one device, not %d", d->n);
    d->shared = fl_dev_kind(fl_wk_rdev_dev(d->rep[0].rd)) == FL_DEV_CPU;
    for (int j = 0; j < d->n; j++) {
        replica_t *r = &d->rep[j];
        int rc = fl_wk_rdev_bind(r->rd);
        /* The whole model on every device (cpu: one copy, stepped by device 0), or device j's
         * range of it. */
        const fl_opt_opts_t *mine = off == NULL && d->shared && j > 0 ? NULL : opt;
        if (rc == FL_OK)
            rc = fl_wk_rdev_keep(r->rd, mine, off != NULL ? off[j] : 0,
                                 off != NULL ? len[j] : d->np, params);
        if (rc != FL_OK)
            return rc;
    }
    d->resident = true;
    d->keep_grad = keep_grad;
    return FL_OK;
}

fl_wk_rdev_t *fl_wk_devices_rdev(fl_wk_devices_t *d, int j)
{
    return j >= 0 && j < d->n ? d->rep[j].rd : NULL;
}

bool fl_wk_devices_keeps_grad(const fl_wk_devices_t *d)
{
    return d->keep_grad;
}

int fl_wk_devices_update(fl_wk_devices_t *d, const float *grad, double max_norm, double lr)
{
    d->updating = true;
    d->upd_grad = grad;
    d->upd_norm = max_norm;
    d->upd_lr = lr;
    fl_wk_devices_run_all(d);
    d->updating = false;
    for (int j = 0; j < d->n; j++)
        if (d->rep[j].rc != FL_OK)
            return fl_fail(d->rep[j].rc, "device %d: %s", j, d->rep[j].err);
    return FL_OK;
}

int fl_wk_devices_get_params(fl_wk_devices_t *d, float *params)
{
    int rc = fl_wk_rdev_bind(d->rep[0].rd);
    return rc == FL_OK ? fl_wk_rdev_get_params(d->rep[0].rd, params) : rc;
}

int fl_wk_devices_put_params(fl_wk_devices_t *d, const float *params)
{
    for (int j = 0; j < d->n; j++) {
        int rc = fl_wk_rdev_bind(d->rep[j].rd);
        if (rc == FL_OK)
            rc = fl_wk_rdev_put_params(d->rep[j].rd, params);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

int fl_wk_devices_put_columns(fl_wk_devices_t *d, const float *params, const size_t *off,
                              const size_t *len)
{
    for (int j = 0; j < d->n; j++) {
        int rc = fl_wk_rdev_bind(d->rep[j].rd);
        if (rc == FL_OK)
            rc = fl_wk_rdev_put_range(d->rep[j].rd, params, off[j], len[j]);
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "rank %d: device %d's column into the device", d->rank, j);
    }
    return fl_wk_rdev_bind(d->rep[0].rd);
}

void fl_wk_devices_mem_used(fl_wk_devices_t *d, uint64_t *used, uint64_t *total)
{
    *used = 0;
    *total = 0;
    for (int j = 0; j < d->n; j++) {
        fl_dev_t *dev = fl_wk_rdev_dev(d->rep[j].rd);
        size_t f = 0;
        size_t t = 0;
        if (fl_dev_kind(dev) == FL_DEV_CPU || fl_dev_mem_info(dev, &f, &t) != FL_OK || f > t)
            continue;
        if (t - f > *used) {
            *used = t - f;
            *total = t;
        }
    }
    /* Asking a GPU makes it current (cuda): the calling thread drives device 0. */
    fl_wk_rdev_bind(d->rep[0].rd);
}

bool fl_wk_devices_can_gather(const fl_wk_devices_t *d)
{
    return d->intra != NULL && d->resident && !d->shared && d->n > 1;
}

int fl_wk_devices_gather_ranges(fl_wk_devices_t *d, const size_t *off, const size_t *len)
{
    if (!fl_wk_devices_can_gather(d))
        return fl_fail(FL_EINVAL,
                       "rank %d: no all-gather on the devices (the first leg is in "
                       "host memory)",
                       d->rank);
    /* Each device's broadcast goes behind its update (on its compute stream), and no pass
     * reads the parameters until its compute stream has passed `gathered`. */
    fl_dptr_t bufs[FL_DEV_MAX_DEVICES] = {{0}};
    int rc = FL_OK;
    for (int j = 0; j < d->n && rc == FL_OK; j++) {
        rc = fl_event_record(d->updated[j], fl_wk_rdev_stream(d->rep[j].rd));
        if (rc == FL_OK)
            rc = fl_stream_wait(d->xs[j], d->updated[j]);
    }
    for (int root = 0; root < d->n && rc == FL_OK; root++) {
        if (len[root] == 0)
            continue;
        for (int j = 0; j < d->n; j++)
            bufs[j] = fl_dptr_f32(fl_wk_rdev_params_buf(d->rep[j].rd), off[root]);
        rc = fl_intra_broadcast(d->intra, bufs, len[root], root, d->xs, NULL);
    }
    for (int j = 0; j < d->n && rc == FL_OK; j++) {
        rc = fl_event_record(d->gathered[j], d->xs[j]);
        if (rc == FL_OK)
            rc = fl_stream_wait(fl_wk_rdev_stream(d->rep[j].rd), d->gathered[j]);
    }
    /* The calling thread drives device 0: current again after the others' streams. */
    int brc = fl_wk_rdev_bind(d->rep[0].rd);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "rank %d: the parameters' all-gather on the devices", d->rank);
    return brc;
}

int fl_wk_devices_opt_save(fl_wk_devices_t *d, int j, fl_opt_t *host)
{
    fl_wk_rdev_t *rd = d->rep[j].rd;
    int rc = fl_wk_rdev_bind(rd);
    return rc == FL_OK ? fl_dev_opt_save(fl_wk_rdev_opt(rd), fl_wk_rdev_stream(rd), host) : rc;
}

int fl_wk_devices_opt_load(fl_wk_devices_t *d, int only, const fl_opt_t *host)
{
    for (int j = 0; j < d->n; j++) {
        fl_wk_rdev_t *rd = d->rep[j].rd;
        if (fl_wk_rdev_opt(rd) == NULL || (only >= 0 && j != only))
            continue;
        int rc = fl_wk_rdev_bind(rd);
        if (rc == FL_OK)
            rc = fl_dev_opt_load(fl_wk_rdev_opt(rd), fl_wk_rdev_stream(rd), host);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}
