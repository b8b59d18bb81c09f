/* The intra-host collectives over NCCL: one communicator per GPU of the host, made in one group
 * (ncclCommInitRankConfig per device, non-blocking), each operation's L calls grouped
 * (ncclGroupStart/End), queued on the callers' streams. Non-blocking communicators never block
 * a host thread: what is in progress is polled with ncclCommGetAsyncError up to a deadline,
 * and a deadline or an asynchronous error aborts every communicator (ncclCommAbort), so no GPU
 * stays blocked in a collective; the handle then stays failed. Errors name the host, the
 * device, the operation and NCCL's text. Built only with CUDA and NCCL (intra_nonccl.c else). */
#include "intra_int.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct nccl_impl {
    ncclComm_t comm[FL_INTRA_MAX_DEVICES];
    int made; /* communicators made (the first `made` of comm) */
    bool aborted;
} nccl_impl_t;

bool fl_intra_nccl_built(void)
{
    return true;
}

/* FL_EGPU "host H: device D: NCCL <what>: <ncclGetErrorString> (<ncclGetLastError>)". */
static int nccl_fail(fl_intra_t *x, int j, const char *what, ncclResult_t r)
{
    nccl_impl_t *n = x->impl;
    const char *last = n != NULL && j >= 0 && j < n->made ? ncclGetLastError(n->comm[j]) : NULL;
    bool more = last != NULL && last[0] != '\0';
    return fl_fail(FL_EGPU, "host %s: device %s: NCCL %s: %s%s%s%s", x->host,
                   j >= 0 ? fl_dev_name(x->devs[j]) : "(all)", what, ncclGetErrorString(r),
                   more ? " (" : "", more ? last : "", more ? ")" : "");
}

static void abort_all(fl_intra_t *x)
{
    nccl_impl_t *n = x->impl;
    if (n == NULL || n->aborted)
        return;
    /* Abort frees the communicator: nothing of it is touched again. */
    for (int j = 0; j < n->made; j++)
        ncclCommAbort(n->comm[j]);
    n->aborted = true;
}

/* Waits until no communicator is in progress (a non-blocking init or group end), bounded by
 * the handle's timeout; aborts everything on a failure or the deadline. */
static int settle(fl_intra_t *x, const char *what)
{
    nccl_impl_t *n = x->impl;
    int64_t deadline = fl_now_ms() + x->timeout_ms;
    long pause_us = 20;
    for (;;) {
        /* The clock before the communicators: one that settled by the deadline is seen by the
         * look that follows, so the wait never times out with nothing in progress. */
        bool late = fl_now_ms() >= deadline;
        bool busy = false;
        for (int j = 0; j < n->made; j++) {
            ncclResult_t st = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(n->comm[j], &st);
            if (r != ncclSuccess)
                st = r;
            if (st == ncclInProgress) {
                busy = true;
            } else if (st != ncclSuccess) {
                int rc = nccl_fail(x, j, what, st);
                abort_all(x);
                return fl_intra_set_failed(x, rc);
            }
        }
        if (!busy)
            return FL_OK;
        if (late) {
            int rc = fl_fail(FL_ETIMEDOUT,
                             "host %s: NCCL %s: still in progress after %d ms: "
                             "communicators aborted",
                             x->host, what, x->timeout_ms);
            abort_all(x);
            return fl_intra_set_failed(x, rc);
        }
        struct timespec ts = {0, pause_us * 1000L};
        nanosleep(&ts, NULL);
        pause_us = pause_us * 2 > 1000 ? 1000 : pause_us * 2;
    }
}

static void close_nccl(fl_intra_t *x)
{
    nccl_impl_t *n = x->impl;
    if (n == NULL)
        return;
    if (!n->aborted)
        for (int j = 0; j < n->made; j++)
            if (fl_dev_bind(x->devs[j]) == FL_OK)
                ncclCommDestroy(n->comm[j]);
    free(n);
    x->impl = NULL;
}

static int open_nccl(fl_intra_t *x)
{
    for (int j = 0; j < x->L; j++) {
        if (fl_dev_kind(x->devs[j]) != FL_DEV_CUDA)
            return fl_fail(FL_EINVAL, "NCCL serves cuda devices, not %s", fl_dev_name(x->devs[j]));
        for (int k = 0; k < j; k++)
            if (fl_dev_id(x->devs[k]) == fl_dev_id(x->devs[j]))
                return fl_fail(FL_EINVAL,
                               "GPU %d is listed twice (devices %d and %d): NCCL "
                               "refuses that, use the copy implementation",
                               fl_dev_id(x->devs[j]), k, j);
    }
    nccl_impl_t *n = calloc(1, sizeof *n);
    if (n == NULL)
        return fl_fail(FL_ENOMEM, "out of memory");
    x->impl = n;
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        int rc = nccl_fail(x, -1, "unique id", r);
        close_nccl(x);
        return rc;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* never block a host thread: settle() polls, with a deadline */
    int rc = FL_OK;
    ncclGroupStart();
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        rc = fl_dev_bind(x->devs[j]);
        if (rc != FL_OK)
            break;
        r = ncclCommInitRankConfig(&n->comm[j], x->L, id, j, &cfg);
        if (r != ncclSuccess && r != ncclInProgress)
            rc = nccl_fail(x, j, "communicator init", r);
        else
            n->made = j + 1;
    }
    r = ncclGroupEnd();
    if (rc == FL_OK && r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(x, -1, "communicator init (group end)", r);
    if (rc == FL_OK)
        rc = settle(x, "communicator init");
    if (rc != FL_OK) {
        abort_all(x);
        close_nccl(x);
    }
    return rc;
}

/* Ends the group of one operation's calls: failures name the device whose call failed. */
static int end_group(fl_intra_t *x, intra_op_t op, int rc)
{
    ncclResult_t r = ncclGroupEnd();
    if (rc == FL_OK && r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(x, -1, fl_intra_op_name(op), r);
    if (rc == FL_OK)
        rc = settle(x, fl_intra_op_name(op));
    if (rc != FL_OK) {
        abort_all(x);
        fl_intra_set_failed(x, rc);
    }
    return rc;
}

static int usable(fl_intra_t *x)
{
    nccl_impl_t *n = x->impl;
    return n->aborted ? fl_fail(FL_EGPU, "host %s: NCCL communicators were aborted", x->host)
                      : FL_OK;
}

static cudaStream_t native(fl_stream_t *s)
{
    return (cudaStream_t)fl_stream_native(s);
}

static int nccl_rs(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_op_t op,
                   fl_stream_t *const *st)
{
    nccl_impl_t *n = x->impl;
    int rc = usable(x);
    if (rc != FL_OK)
        return rc;
    ncclRedOp_t red = op == FL_AVG ? ncclAvg : ncclSum;
    ncclGroupStart();
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        float *b = fl_dptr_native(bufs[j]);
        /* In place: NCCL's receive buffer is the send buffer at the rank's shard. */
        ncclResult_t r =
            ncclReduceScatter(b, b + (size_t)j * S, S, ncclFloat32, red, n->comm[j], native(st[j]));
        if (r != ncclSuccess && r != ncclInProgress)
            rc = nccl_fail(x, j, "reduce-scatter", r);
    }
    return end_group(x, INTRA_RS, rc);
}

static int nccl_ag(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_stream_t *const *st)
{
    nccl_impl_t *n = x->impl;
    int rc = usable(x);
    if (rc != FL_OK)
        return rc;
    ncclGroupStart();
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        float *b = fl_dptr_native(bufs[j]);
        ncclResult_t r =
            ncclAllGather(b + (size_t)j * S, b, S, ncclFloat32, n->comm[j], native(st[j]));
        if (r != ncclSuccess && r != ncclInProgress)
            rc = nccl_fail(x, j, "all-gather", r);
    }
    return end_group(x, INTRA_AG, rc);
}

static int nccl_bcast(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                      fl_stream_t *const *st)
{
    nccl_impl_t *n = x->impl;
    int rc = usable(x);
    if (rc != FL_OK)
        return rc;
    ncclGroupStart();
    for (int j = 0; j < x->L && rc == FL_OK; j++) {
        void *b = fl_dptr_native(bufs[j]);
        ncclResult_t r = ncclBroadcast(b, b, count, ncclFloat32, root, n->comm[j], native(st[j]));
        if (r != ncclSuccess && r != ncclInProgress)
            rc = nccl_fail(x, j, "broadcast", r);
    }
    return end_group(x, INTRA_BCAST, rc);
}

/* fl_intra_wait's poll: an asynchronous error on any communicator (a GPU that failed, a peer
 * that died) fails the wait at once instead of leaving the others blocked. */
static int nccl_poll(fl_intra_t *x)
{
    nccl_impl_t *n = x->impl;
    if (n->aborted)
        return usable(x);
    for (int j = 0; j < n->made; j++) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(n->comm[j], &st);
        if (r != ncclSuccess)
            st = r;
        if (st != ncclSuccess && st != ncclInProgress)
            return nccl_fail(x, j, fl_intra_op_name(x->last), st);
    }
    return FL_OK;
}

const intra_backend_t fl_intra_nccl_backend = {
    .name = "nccl",
    .open = open_nccl,
    .close = close_nccl,
    .reduce_scatter = nccl_rs,
    .allgather = nccl_ag,
    .broadcast = nccl_bcast,
    .poll = nccl_poll,
    .abort = abort_all,
};
