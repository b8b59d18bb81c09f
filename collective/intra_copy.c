/* The intra-host collectives by device copies and a sum kernel, for devices NCCL cannot serve:
 * sim (CI), and logical devices sharing one GPU (--gpus 0,0). Device j gathers what it needs
 * from its peers' buffers with peer copies on its own stream, behind the peers' entry events,
 * and reduces with fl_dev_sum_rows (device order: the fixed sum of fl_intra.h). Every stream
 * then waits for the others' reads to be done, so that a stream past the call means its buffer
 * is free again, as with NCCL. */
#include "intra_int.h"

#include <stdlib.h>

typedef struct copy_impl {
    fl_event_t *ready[FL_INTRA_MAX_DEVICES]; /* device j's buffer is ready to be read */
    fl_event_t *read[FL_INTRA_MAX_DEVICES];  /* device j has read what it needs of the others */
    fl_dptr_t scratch[FL_INTRA_MAX_DEVICES]; /* L shards gathered, one row each */
    size_t cap;                              /* floats of each scratch */
} copy_impl_t;

static void close_copy(fl_intra_t *x)
{
    copy_impl_t *c = x->impl;
    if (c == NULL)
        return;
    for (int j = 0; j < x->L; j++) {
        fl_event_destroy(&c->ready[j]);
        fl_event_destroy(&c->read[j]);
        fl_dev_free(x->devs[j], &c->scratch[j]);
    }
    free(c);
    x->impl = NULL;
}

static int open_copy(fl_intra_t *x)
{
    copy_impl_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return fl_fail(FL_ENOMEM, "out of memory");
    x->impl = c;
    int rc = FL_OK;
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        rc = fl_event_create(x->devs[j], &c->ready[j]);
        if (rc == FL_OK)
            rc = fl_event_create(x->devs[j], &c->read[j]);
    }
    if (rc != FL_OK)
        close_copy(x);
    return rc;
}

/* Scratch of at least n floats on every device. Growing frees the old scratch, which the last
 * call may still be using: its work is waited for first (growth happens in the first steps
 * only, never inside a steady state). */
static int reserve(fl_intra_t *x, size_t n)
{
    copy_impl_t *c = x->impl;
    if (n <= c->cap)
        return FL_OK;
    for (int j = 0; j < x->L; j++) {
        int rc = fl_event_sync(x->fin[j], x->timeout_ms);
        if (rc != FL_OK)
            return rc;
    }
    for (int j = 0; j < x->L; j++) {
        fl_dev_free(x->devs[j], &c->scratch[j]);
        int rc = fl_dev_alloc(x->devs[j], n * sizeof(float), &c->scratch[j]);
        if (rc != FL_OK) {
            c->cap = 0;
            return rc;
        }
    }
    c->cap = n;
    return FL_OK;
}

/* Entry: every device's buffer is ready once its stream reached the call. */
static int enter(fl_intra_t *x, fl_stream_t *const *st)
{
    copy_impl_t *c = x->impl;
    for (int j = 0; j < x->L; j++) {
        int rc = fl_event_record(c->ready[j], st[j]);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* Stream j waits for the entry of every device it reads from (all others). */
static int wait_peers(fl_intra_t *x, fl_event_t *const *ev, int j, fl_stream_t *const *st)
{
    for (int k = 0; k < x->L; k++) {
        if (k == j)
            continue;
        int rc = fl_stream_wait(st[j], ev[k]);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* Exit: each device has recorded `read` after its gathers; stream j waits for the others'
 * `read`, so it passes the call only once nobody reads its buffer any more. Every stream
 * waits, or (only_reader_of >= 0) only that device's, the one buffer that was read. */
static int leave(fl_intra_t *x, fl_stream_t *const *st, int only_reader_of)
{
    copy_impl_t *c = x->impl;
    for (int j = 0; j < x->L; j++) {
        if (only_reader_of >= 0 && j != only_reader_of)
            continue;
        int rc = wait_peers(x, c->read, j, st);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

static int copy_rs(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_op_t op,
                   fl_stream_t *const *st)
{
    copy_impl_t *c = x->impl;
    int L = x->L;
    if (L == 1)
        return FL_OK; /* the sum of one device is its shard; 1/1 would change nothing */
    int rc = reserve(x, (size_t)L * S);
    if (rc == FL_OK)
        rc = enter(x, st);
    size_t bytes = S * sizeof(float);
    float alpha = op == FL_AVG ? 1.0f / (float)L : 1.0f;
    for (int j = 0; j < L && rc == FL_OK; j++) {
        fl_dev_t *d = x->devs[j];
        rc = wait_peers(x, c->ready, j, st);
        /* Row k of the scratch: shard j of device k, its own included, so that the kernel
         * adds in device order. */
        for (int k = 0; k < L && rc == FL_OK; k++) {
            fl_dptr_t row = fl_dptr_f32(c->scratch[j], (size_t)k * S);
            fl_dptr_t src = fl_dptr_f32(bufs[k], (size_t)j * S);
            rc = k == j ? fl_dev_d2d(st[j], row, src, bytes)
                        : fl_dev_peer_copy(st[j], row, x->devs[k], src, bytes);
        }
        if (rc == FL_OK)
            rc = fl_event_record(c->read[j], st[j]);
        if (rc == FL_OK)
            rc = fl_dev_sum_rows(st[j], fl_dptr_f32(bufs[j], (size_t)j * S), c->scratch[j], S,
                                 (size_t)L, alpha);
        if (rc != FL_OK)
            rc = fl_fail_ctx(rc, "device %s: ", fl_dev_name(d));
    }
    return rc == FL_OK ? leave(x, st, -1) : rc;
}

static int copy_ag(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_stream_t *const *st)
{
    copy_impl_t *c = x->impl;
    int L = x->L;
    if (L == 1)
        return FL_OK;
    int rc = enter(x, st);
    size_t bytes = S * sizeof(float);
    /* Device j writes shards k != j of its buffer and the others read only shard j of it. */
    for (int j = 0; j < L && rc == FL_OK; j++) {
        rc = wait_peers(x, c->ready, j, st);
        for (int k = 0; k < L && rc == FL_OK; k++)
            if (k != j)
                rc = fl_dev_peer_copy(st[j], fl_dptr_f32(bufs[j], (size_t)k * S), x->devs[k],
                                      fl_dptr_f32(bufs[k], (size_t)k * S), bytes);
        if (rc == FL_OK)
            rc = fl_event_record(c->read[j], st[j]);
        if (rc != FL_OK)
            rc = fl_fail_ctx(rc, "device %s: ", fl_dev_name(x->devs[j]));
    }
    return rc == FL_OK ? leave(x, st, -1) : rc;
}

static int copy_bcast(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                      fl_stream_t *const *st)
{
    copy_impl_t *c = x->impl;
    int L = x->L;
    if (L == 1)
        return FL_OK;
    int rc = fl_event_record(c->ready[root], st[root]);
    for (int j = 0; j < L && rc == FL_OK; j++) {
        if (j == root)
            continue;
        rc = fl_stream_wait(st[j], c->ready[root]);
        if (rc == FL_OK)
            rc = fl_dev_peer_copy(st[j], bufs[j], x->devs[root], bufs[root], count * sizeof(float));
        if (rc == FL_OK)
            rc = fl_event_record(c->read[j], st[j]);
        if (rc != FL_OK)
            rc = fl_fail_ctx(rc, "device %s: ", fl_dev_name(x->devs[j]));
    }
    /* Only the root's buffer was read: its stream waits for every reader. */
    return rc == FL_OK ? leave(x, st, root) : rc;
}

const intra_backend_t fl_intra_copy_backend = {
    .name = "copy",
    .open = open_copy,
    .close = close_copy,
    .reduce_scatter = copy_rs,
    .allgather = copy_ag,
    .broadcast = copy_bcast,
};
