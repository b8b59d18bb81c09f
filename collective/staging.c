/* Collectives on CUDA device buffers: staged through host memory (copy in, run the host
 * collective, copy out). Across hosts every byte crosses host memory and TCP anyway, so the
 * cost is one PCIe copy each way; device-side reduction with NCCL inside a host comes with
 * hybrid sharding. Without CUDA, or without a device, nothing here runs. */
#include "comm_int.h"

#include <stdlib.h>

/* The comm's host staging area, grown on demand (separate from scratch, which the host
 * collective itself uses). */
static int stage(fl_comm_t *c, size_t bytes, uint8_t **out)
{
    if (bytes > c->stage_cap) {
        void *p = NULL;
        if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
            return fl_fail(FL_ENOMEM,
                           "rank %d: no host memory to stage %zu bytes of device "
                           "data",
                           c->rank, bytes);
        free(c->stage);
        c->stage = p;
        c->stage_cap = bytes;
    }
    *out = c->stage;
    return FL_OK;
}

bool fl_comm_on_device(const fl_comm_t *c, const void *a, const void *b)
{
    (void)c;
    return fl_gpu_is_device_ptr(a) || fl_gpu_is_device_ptr(b);
}

/* Copies n bytes from src (device or host) into dst (host), skipping host-to-same-host. */
static int copy(void *dst, const void *src, size_t n)
{
    if (n == 0 || dst == src)
        return FL_OK;
    return fl_gpu_memcpy(dst, src, n);
}

int fl_staged_allreduce(fl_comm_t *c, const void *send, void *recv, size_t count, fl_dtype_t dt,
                        fl_op_t op)
{
    size_t bytes = count * fl_dtype_size(dt);
    uint8_t *h = NULL; /* set by stage() when it succeeds; NULL keeps -O2 -Werror quiet */
    int rc = stage(c, bytes, &h);
    if (rc == FL_OK)
        rc = copy(h, send, bytes);
    if (rc == FL_OK)
        rc = fl_allreduce(c, h, h, count, dt, op);
    if (rc == FL_OK)
        rc = copy(recv, h, bytes);
    return rc;
}

int fl_staged_reduce_scatter(fl_comm_t *c, const void *send, void *recv, size_t count,
                             fl_dtype_t dt, fl_op_t op)
{
    size_t esz = fl_dtype_size(dt);
    size_t mine = fl_shard_count(count, c->size, c->rank) * esz;
    uint8_t *h = NULL; /* set by stage() when it succeeds; NULL keeps -O2 -Werror quiet */
    int rc = stage(c, count * esz + mine, &h);
    if (rc == FL_OK)
        rc = copy(h, send, count * esz);
    if (rc == FL_OK)
        rc = fl_reduce_scatter(c, h, h + count * esz, count, dt, op);
    if (rc == FL_OK)
        rc = copy(recv, h + count * esz, mine);
    return rc;
}

int fl_staged_allgather(fl_comm_t *c, const void *send, void *recv, size_t count, fl_dtype_t dt)
{
    size_t esz = fl_dtype_size(dt);
    size_t off = fl_shard_offset(count, c->size, c->rank) * esz;
    size_t mine = fl_shard_count(count, c->size, c->rank) * esz;
    uint8_t *h = NULL; /* set by stage() when it succeeds; NULL keeps -O2 -Werror quiet */
    int rc = stage(c, count * esz, &h);
    if (rc == FL_OK)
        rc = copy(h + off, send, mine);
    if (rc == FL_OK)
        rc = fl_allgather(c, h + off, h, count, dt);
    if (rc == FL_OK)
        rc = copy(recv, h, count * esz);
    return rc;
}

int fl_staged_broadcast(fl_comm_t *c, void *buf, size_t count, fl_dtype_t dt, int root)
{
    size_t bytes = count * fl_dtype_size(dt);
    uint8_t *h = NULL; /* set by stage() when it succeeds; NULL keeps -O2 -Werror quiet */
    int rc = stage(c, bytes, &h);
    if (rc == FL_OK && c->rank == root)
        rc = copy(h, buf, bytes);
    if (rc == FL_OK)
        rc = fl_broadcast(c, h, count, dt, root);
    if (rc == FL_OK)
        rc = copy(buf, h, bytes);
    return rc;
}
