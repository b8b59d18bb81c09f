/* The intra-host collectives in host memory, for cpu replicas: their device memory is host
 * memory and their streams run every operation when it is issued, so the collectives are plain
 * loops on the calling thread, with no copies and no scratch (what the worker's shared-memory
 * leg does: device j's shard summed from every replica's buffer in device order). The same
 * bits as the copy implementation, which gathers the shards first. */
#include "intra_int.h"

#include <string.h>

static int open_host(fl_intra_t *x)
{
    for (int j = 0; j < x->L; j++)
        if (fl_dev_kind(x->devs[j]) != FL_DEV_CPU)
            return fl_fail(FL_EINVAL, "the host-memory implementation serves cpu devices, not %s",
                           fl_dev_name(x->devs[j]));
    return FL_OK;
}

static void close_host(fl_intra_t *x)
{
    (void)x;
}

/* The host addresses of the buffers (cpu: fl_dev_unwrap cannot fail). */
static int host_bufs(fl_intra_t *x, const fl_dptr_t *bufs, float **out)
{
    for (int j = 0; j < x->L; j++) {
        void *p = NULL;
        int rc = fl_dev_unwrap(x->devs[j], bufs[j], &p);
        if (rc != FL_OK)
            return rc;
        out[j] = p;
    }
    return FL_OK;
}

static int host_rs(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_op_t op,
                   fl_stream_t *const *st)
{
    (void)st;
    float *b[FL_INTRA_MAX_DEVICES];
    int L = x->L;
    int rc = host_bufs(x, bufs, b);
    if (rc != FL_OK || L == 1)
        return rc;
    float alpha = op == FL_AVG ? 1.0f / (float)L : 1.0f;
    for (int j = 0; j < L; j++) {
        size_t end = ((size_t)j + 1) * S;
        /* Device j writes only its shard, which no other device's sum reads. */
        for (size_t i = (size_t)j * S; i < end; i++) {
            float s = b[0][i];
            for (int k = 1; k < L; k++)
                s += b[k][i];
            b[j][i] = alpha != 1.0f ? s * alpha : s; /* fl_sum_rows's form */
        }
    }
    return FL_OK;
}

static int host_ag(fl_intra_t *x, const fl_dptr_t *bufs, size_t S, fl_stream_t *const *st)
{
    (void)st;
    float *b[FL_INTRA_MAX_DEVICES];
    int rc = host_bufs(x, bufs, b);
    for (int j = 0; j < x->L && rc == FL_OK; j++)
        for (int k = 0; k < x->L; k++)
            if (k != j)
                memcpy(b[j] + (size_t)k * S, b[k] + (size_t)k * S, S * sizeof(float));
    return rc;
}

static int host_bcast(fl_intra_t *x, const fl_dptr_t *bufs, size_t count, int root,
                      fl_stream_t *const *st)
{
    (void)st;
    float *b[FL_INTRA_MAX_DEVICES];
    int rc = host_bufs(x, bufs, b);
    for (int j = 0; j < x->L && rc == FL_OK; j++)
        if (j != root && b[j] != b[root])
            memcpy(b[j], b[root], count * sizeof(float));
    return rc;
}

const intra_backend_t fl_intra_host_backend = {
    .name = "host",
    .open = open_host,
    .close = close_host,
    .reduce_scatter = host_rs,
    .allgather = host_ag,
    .broadcast = host_bcast,
};
