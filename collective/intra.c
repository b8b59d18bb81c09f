/* The intra-host collectives' front end: picks the implementation, checks every call's
 * arguments before anything is queued, records the per-device events fl_intra_wait polls, and
 * bounds that wait (an implementation with asynchronous errors, NCCL, is polled and aborted at
 * the deadline). The work itself is queued by intra_copy.c, intra_host.c or intra_nccl.c. */
#include "intra_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *fl_intra_impl_name(fl_intra_impl_t impl)
{
    static const char *const names[] = {"auto", "nccl", "copy", "host"};
    return (unsigned)impl < 4 ? names[impl] : "unknown";
}

const char *fl_intra_op_name(intra_op_t op)
{
    static const char *const names[] = {"reduce-scatter", "all-gather", "broadcast"};
    return (unsigned)op < 3 ? names[op] : "unknown";
}

void fl_intra_opts_init(fl_intra_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->impl = FL_INTRA_AUTO;
    o->timeout_ms = 600000;
}

size_t fl_intra_shard_len(size_t count, int L)
{
    return L > 0 ? (count + (size_t)L - 1) / (size_t)L : 0;
}

size_t fl_intra_padded(size_t count, int L)
{
    return fl_intra_shard_len(count, L) * (size_t)(L > 0 ? L : 0);
}

/* NCCL refuses a communicator with one GPU twice (--gpus 0,0): those go through copies. */
static bool distinct_gpus(fl_dev_t *const *devs, int L)
{
    for (int j = 0; j < L; j++)
        for (int k = 0; k < j; k++)
            if (fl_dev_id(devs[j]) == fl_dev_id(devs[k]))
                return false;
    return true;
}

static fl_intra_impl_t pick(fl_dev_t *const *devs, int L)
{
    switch (fl_dev_kind(devs[0])) {
    case FL_DEV_CPU: return FL_INTRA_HOST;
    case FL_DEV_CUDA:
        return fl_intra_nccl_built() && distinct_gpus(devs, L) ? FL_INTRA_NCCL : FL_INTRA_COPY;
    default: return FL_INTRA_COPY;
    }
}

int fl_intra_create(fl_dev_t *const *devs, int L, const fl_intra_opts_t *o, fl_intra_t **out)
{
    *out = NULL;
    if (L < 1 || L > FL_INTRA_MAX_DEVICES)
        return fl_fail(FL_EINVAL, "intra-host collectives: %d devices (1..%d)", L,
                       FL_INTRA_MAX_DEVICES);
    if (o->timeout_ms <= 0)
        return fl_fail(FL_EINVAL, "intra-host collectives: timeout_ms %d must be positive",
                       o->timeout_ms);
    for (int j = 0; j < L; j++) {
        if (devs[j] == NULL)
            return fl_fail(FL_EINVAL, "intra-host collectives: device %d is missing", j);
        if (fl_dev_kind(devs[j]) != fl_dev_kind(devs[0]))
            return fl_fail(FL_EINVAL,
                           "intra-host collectives: device %d (%s) and device 0 (%s) "
                           "are of different kinds",
                           j, fl_dev_name(devs[j]), fl_dev_name(devs[0]));
    }
    fl_intra_impl_t kind = o->impl == FL_INTRA_AUTO ? pick(devs, L) : o->impl;
    const intra_backend_t *be = NULL;
    switch (kind) {
    case FL_INTRA_NCCL: be = &fl_intra_nccl_backend; break;
    case FL_INTRA_COPY: be = &fl_intra_copy_backend; break;
    case FL_INTRA_HOST: be = &fl_intra_host_backend; break;
    default: return fl_fail(FL_EINVAL, "intra-host collectives: implementation %d", (int)o->impl);
    }
    char host[128];
    if (o->host != NULL)
        snprintf(host, sizeof host, "%s", o->host);
    else
        fl_hostname(host, sizeof host);
    fl_intra_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return fl_fail(FL_ENOMEM, "host %s: intra-host collectives: out of memory", host);
    x->be = be;
    x->kind = kind;
    x->L = L;
    x->timeout_ms = o->timeout_ms;
    memcpy(x->host, host, sizeof host);
    memcpy(x->devs, devs, (size_t)L * sizeof *devs);
    int rc = FL_OK;
    for (int j = 0; j < L && rc == FL_OK; j++)
        rc = fl_event_create(devs[j], &x->fin[j]);
    if (rc == FL_OK && (rc = be->open(x)) != FL_OK)
        x->be = NULL; /* nothing of the implementation to close */
    if (rc != FL_OK) {
        fl_intra_destroy(&x);
        return fl_fail_ctx(rc, "host %s: intra-host collectives (%s) over %d %s device(s): ", host,
                           fl_intra_impl_name(kind), L, fl_dev_kind_name(fl_dev_kind(devs[0])));
    }
    *out = x;
    return FL_OK;
}

static void intra_destroy(fl_intra_t **px)
{
    if (px == NULL || *px == NULL)
        return;
    fl_intra_t *x = *px;
    if (x->be != NULL)
        x->be->close(x);
    for (int j = 0; j < x->L; j++)
        fl_event_destroy(&x->fin[j]);
    free(x);
    *px = NULL;
}

void fl_intra_destroy(fl_intra_t **px)
{
    fl_error_keep_begin();
    intra_destroy(px);
    fl_error_keep_end();
}

fl_intra_impl_t fl_intra_impl(const fl_intra_t *x)
{
    return x->kind;
}

int fl_intra_size(const fl_intra_t *x)
{
    return x->L;
}

int fl_intra_set_failed(fl_intra_t *x, int rc)
{
    if (x->rc == FL_OK) {
        x->rc = rc;
        snprintf(x->err, sizeof x->err, "%s", fl_last_error());
    }
    return rc;
}

/* The checks every operation shares: the handle has not failed, stream j is device j's. */
static int check_call(fl_intra_t *x, intra_op_t op, const fl_dptr_t *bufs, size_t count,
                      fl_stream_t *const *st, fl_event_t *const *done)
{
    if (x->rc != FL_OK)
        return fl_fail(x->rc, "%s", x->err);
    if (count > SIZE_MAX / sizeof(float) - (size_t)x->L)
        return fl_fail(FL_EINVAL, "host %s: intra-host %s: %zu elements overflow", x->host,
                       fl_intra_op_name(op), count);
    for (int j = 0; j < x->L; j++) {
        if (st[j] == NULL || fl_stream_dev(st[j]) != x->devs[j])
            return fl_fail(FL_EINVAL, "host %s: intra-host %s: stream %d is not one of device %s",
                           x->host, fl_intra_op_name(op), j, fl_dev_name(x->devs[j]));
        if (count > 0 && fl_dptr_is_null(bufs[j]))
            return fl_fail(FL_EINVAL, "host %s: intra-host %s: the buffer of device %s is null",
                           x->host, fl_intra_op_name(op), fl_dev_name(x->devs[j]));
        if (done != NULL && (done[j] == NULL))
            return fl_fail(FL_EINVAL, "host %s: intra-host %s: done event %d is missing", x->host,
                           fl_intra_op_name(op), j);
    }
    return FL_OK;
}

/* After the implementation queued op: the events wait polls, and the caller's. */
static int finish_call(fl_intra_t *x, intra_op_t op, int rc, fl_stream_t *const *st,
                       fl_event_t *const *done)
{
    x->last = op;
    x->queued = true;
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        rc = fl_event_record(x->fin[j], st[j]);
        if (rc == FL_OK && done != NULL)
            rc = fl_event_record(done[j], st[j]);
    }
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "host %s: intra-host %s: ", x->host, fl_intra_op_name(op));
    return FL_OK;
}

int fl_intra_reduce_scatter(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, fl_op_t op,
                            fl_stream_t *const *streams, fl_event_t *const *done)
{
    int rc = check_call(x, INTRA_RS, bufs, count, streams, done);
    if (rc != FL_OK)
        return rc;
    if (op != FL_SUM && op != FL_AVG)
        return fl_fail(FL_EINVAL, "host %s: intra-host reduce-scatter: operator %s (sum or avg)",
                       x->host, fl_op_name(op));
    size_t S = fl_intra_shard_len(count, x->L);
    rc = S > 0 ? x->be->reduce_scatter(x, bufs, S, op, streams) : FL_OK;
    return finish_call(x, INTRA_RS, rc, streams, done);
}

int fl_intra_allgather(fl_intra_t *x, const fl_dptr_t *bufs, size_t count,
                       fl_stream_t *const *streams, fl_event_t *const *done)
{
    int rc = check_call(x, INTRA_AG, bufs, count, streams, done);
    if (rc != FL_OK)
        return rc;
    size_t S = fl_intra_shard_len(count, x->L);
    rc = S > 0 ? x->be->allgather(x, bufs, S, streams) : FL_OK;
    return finish_call(x, INTRA_AG, rc, streams, done);
}

int fl_intra_broadcast(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                       fl_stream_t *const *streams, fl_event_t *const *done)
{
    int rc = check_call(x, INTRA_BCAST, bufs, count, streams, done);
    if (rc != FL_OK)
        return rc;
    if (root < 0 || root >= x->L)
        return fl_fail(FL_EINVAL, "host %s: intra-host broadcast: root %d is not a device (0..%d)",
                       x->host, root, x->L - 1);
    rc = count > 0 ? x->be->broadcast(x, bufs, count, root, streams) : FL_OK;
    return finish_call(x, INTRA_BCAST, rc, streams, done);
}

int fl_intra_wait(fl_intra_t *x, int timeout_ms)
{
    if (x->rc != FL_OK)
        return fl_fail(x->rc, "%s", x->err);
    if (!x->queued)
        return FL_OK;
    int ms = timeout_ms > 0 ? timeout_ms : x->timeout_ms;
    const char *op = fl_intra_op_name(x->last);
    int64_t deadline = fl_now_ms() + ms;
    long pause_us = 20;
    bool done[FL_INTRA_MAX_DEVICES] = {false};
    /* Polled rather than waited for device by device: an NCCL failure on one GPU can keep the
     * others blocked forever, and only the poll sees it. */
    for (;;) {
        /* The clock before the events: a device that finished by the deadline is seen by the
         * look that follows, so the wait never times out with every device done. */
        bool late = fl_now_ms() >= deadline;
        int left = 0;
        for (int j = 0; j < x->L; j++)
            if (!done[j] && !(done[j] = fl_event_done(x->fin[j])))
                left++;
        int rc = x->be->poll != NULL ? x->be->poll(x) : FL_OK;
        if (rc != FL_OK) {
            if (x->be->abort != NULL)
                x->be->abort(x);
            return fl_intra_set_failed(x, rc);
        }
        if (left == 0)
            break;
        if (late) {
            char names[256] = "";
            size_t at = 0;
            for (int j = 0; j < x->L && at < sizeof names; j++)
                if (!done[j])
                    at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "",
                                           fl_dev_name(x->devs[j]));
            rc = fl_fail(FL_ETIMEDOUT, "host %s: intra-host %s (%s) not done in %d ms on %s%s",
                         x->host, op, fl_intra_impl_name(x->kind), ms, names,
                         x->be->abort != NULL ? ": aborted" : "");
            if (x->be->abort != NULL) {
                x->be->abort(x);
                return fl_intra_set_failed(x, rc);
            }
            return rc;
        }
        struct timespec ts = {0, pause_us * 1000L};
        nanosleep(&ts, NULL);
        pause_us = pause_us * 2 > 1000 ? 1000 : pause_us * 2;
    }
    x->queued = false;
    /* Every record has run: the streams' errors, if any, come with them. */
    for (int j = 0; j < x->L; j++) {
        int rc = fl_event_sync(x->fin[j], ms);
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "host %s: intra-host %s on %s: ", x->host, op,
                               fl_dev_name(x->devs[j]));
    }
    return FL_OK;
}

int fl_intra_poll(fl_intra_t *x)
{
    if (x->rc != FL_OK)
        return fl_fail(x->rc, "%s", x->err);
    return x->be->poll != NULL ? x->be->poll(x) : FL_OK;
}

int fl_intra_abort(fl_intra_t *x, int rc)
{
    if (x->be->abort != NULL)
        x->be->abort(x);
    return x->rc != FL_OK ? fl_fail(x->rc, "%s", x->err) : fl_intra_set_failed(x, rc);
}

int fl_intra_timeout_ms(const fl_intra_t *x)
{
    return x->timeout_ms;
}
