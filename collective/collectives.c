/* The public collectives: argument checks, the degenerate cases (one rank, no elements), the
 * choice of algorithm, and the op's begin/end around it. */
#include "comm_int.h"

#include <string.h>

static int check(fl_comm_t *c, const char *what, const void *a, const void *b, size_t count,
                 fl_dtype_t dtype)
{
    if (c == NULL)
        return fl_fail(FL_EINVAL, "%s: communicator is NULL", what);
    size_t esz = fl_dtype_size(dtype);
    if (esz == 0)
        return fl_fail(FL_EINVAL, "rank %d: %s: unknown dtype %d", c->rank, what, (int)dtype);
    if (count > SIZE_MAX / 8)
        return fl_fail(FL_EINVAL, "rank %d: %s: count %zu is too large", c->rank, what, count);
    if (count > 0 && (a == NULL || b == NULL))
        return fl_fail(FL_EINVAL, "rank %d: %s: NULL buffer for %zu elements", c->rank, what,
                       count);
    return FL_OK;
}

/* True when [a, a+alen) and [b, b+blen) share a byte. */
static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a;
    uintptr_t y = (uintptr_t)b;
    return alen > 0 && blen > 0 && x < y + blen && y < x + alen;
}

/* Buffers may be the same (in place) or apart; any other overlap would read data already
 * overwritten, so it is refused. `at` is the one offset into `big` where `small` may sit. */
static int check_overlap(fl_comm_t *c, const char *what, const void *big, size_t big_bytes,
                         const void *small, size_t small_bytes, size_t at)
{
    if (!overlaps(big, big_bytes, small, small_bytes) || (const uint8_t *)big + at == small)
        return FL_OK;
    return fl_fail(FL_EINVAL,
                   "rank %d: %s: the buffers overlap; they must be the same (in "
                   "place: the shard at element offset %zu) or apart",
                   c->rank, what, at);
}

static int check_op(fl_comm_t *c, const char *what, fl_dtype_t dtype, fl_op_t op)
{
    if (!fl_op_supports(op, dtype))
        return fl_fail(FL_EINVAL, "rank %d: %s: operator %s (%d) is not defined on %s", c->rank,
                       what, fl_op_name(op), (int)op, fl_dtype_name(dtype));
    return FL_OK;
}

int fl_allreduce(fl_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, fl_dtype_t dtype,
                 fl_op_t op)
{
    return fl_allreduce_algo(c, sendbuf, recvbuf, count, dtype, op,
                             c != NULL ? c->algo : FL_ALGO_AUTO);
}

int fl_allreduce_algo(fl_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                      fl_dtype_t dtype, fl_op_t op, fl_algo_t algo)
{
    int rc = check(c, "allreduce", sendbuf, recvbuf, count, dtype);
    if (rc == FL_OK)
        rc = check_op(c, "allreduce", dtype, op);
    if (rc == FL_OK)
        rc = check_overlap(c, "allreduce", sendbuf, count * fl_dtype_size(dtype), recvbuf,
                           count * fl_dtype_size(dtype), 0);
    if (rc != FL_OK)
        return rc;
    if (fl_comm_on_device(c, sendbuf, recvbuf))
        return fl_staged_allreduce(c, sendbuf, recvbuf, count, dtype, op);
    coll_op_t o;
    if ((rc = fl_coll__begin(c, &o, FL_COLL_ALLREDUCE, count, dtype, op, 0)) != FL_OK)
        return rc;
    size_t bytes = count * fl_dtype_size(dtype);
    if (count == 0)
        return fl_coll__end(&o, FL_OK);
    if (c->size == 1) {
        if (sendbuf != recvbuf)
            memmove(recvbuf, sendbuf, bytes);
        return fl_coll__end(&o, FL_OK);
    }
    if (algo == FL_ALGO_AUTO)
        algo = fl_allreduce_pick(c->size, bytes, c->small_bytes);
    c->last_algo = algo;
    if (algo == FL_ALGO_DIRECT)
        rc = fl_direct_allreduce(&o, sendbuf, recvbuf);
    else if (algo == FL_ALGO_RD)
        rc = fl_rd_allreduce(&o, sendbuf, recvbuf);
    else
        rc = fl_ring_allreduce(&o, sendbuf, recvbuf);
    return fl_coll__end(&o, rc);
}

int fl_reduce_scatter(fl_comm_t *c, const void *sendbuf, void *recvbuf, size_t count,
                      fl_dtype_t dtype, fl_op_t op)
{
    int rc = check(c, "reduce-scatter", sendbuf, sendbuf, count, dtype);
    if (rc == FL_OK)
        rc = check_op(c, "reduce-scatter", dtype, op);
    if (rc != FL_OK)
        return rc;
    size_t mine = fl_shard_count(count, c->size, c->rank);
    size_t esz = fl_dtype_size(dtype);
    if (mine > 0 && recvbuf == NULL)
        return fl_fail(FL_EINVAL, "rank %d: reduce-scatter: NULL recvbuf for %zu elements", c->rank,
                       mine);
    if ((rc = check_overlap(c, "reduce-scatter", sendbuf, count * esz, recvbuf, mine * esz,
                            fl_shard_offset(count, c->size, c->rank) * esz)) != FL_OK)
        return rc;
    if (fl_comm_on_device(c, sendbuf, recvbuf))
        return fl_staged_reduce_scatter(c, sendbuf, recvbuf, count, dtype, op);
    coll_op_t o;
    if ((rc = fl_coll__begin(c, &o, FL_COLL_REDUCE_SCATTER, count, dtype, op, 0)) != FL_OK)
        return rc;
    if (count == 0)
        return fl_coll__end(&o, FL_OK);
    if (c->size == 1) {
        if (sendbuf != recvbuf)
            memmove(recvbuf, sendbuf, count * esz);
        return fl_coll__end(&o, FL_OK);
    }
    return fl_coll__end(&o, fl_ring_reduce_scatter(&o, sendbuf, recvbuf));
}

int fl_allgather(fl_comm_t *c, const void *sendbuf, void *recvbuf, size_t count, fl_dtype_t dtype)
{
    int rc = check(c, "all-gather", recvbuf, recvbuf, count, dtype);
    if (rc != FL_OK)
        return rc;
    size_t mine = fl_shard_count(count, c->size, c->rank);
    size_t esz = fl_dtype_size(dtype);
    if (mine > 0 && sendbuf == NULL)
        return fl_fail(FL_EINVAL, "rank %d: all-gather: NULL sendbuf for %zu elements", c->rank,
                       mine);
    if ((rc = check_overlap(c, "all-gather", recvbuf, count * esz, sendbuf, mine * esz,
                            fl_shard_offset(count, c->size, c->rank) * esz)) != FL_OK)
        return rc;
    if (fl_comm_on_device(c, sendbuf, recvbuf))
        return fl_staged_allgather(c, sendbuf, recvbuf, count, dtype);
    coll_op_t o;
    if ((rc = fl_coll__begin(c, &o, FL_COLL_ALLGATHER, count, dtype, FL_SUM, 0)) != FL_OK)
        return rc;
    if (count == 0)
        return fl_coll__end(&o, FL_OK);
    if (c->size == 1) {
        if (sendbuf != recvbuf)
            memmove(recvbuf, sendbuf, count * esz);
        return fl_coll__end(&o, FL_OK);
    }
    return fl_coll__end(&o, fl_ring_allgather(&o, sendbuf, recvbuf));
}

int fl_broadcast(fl_comm_t *c, void *buf, size_t count, fl_dtype_t dtype, int root)
{
    int rc = check(c, "broadcast", buf, buf, count, dtype);
    if (rc != FL_OK)
        return rc;
    if (root < 0 || root >= c->size)
        return fl_fail(FL_EINVAL, "rank %d: broadcast: root %d out of range 0..%d", c->rank, root,
                       c->size - 1);
    if (fl_comm_on_device(c, buf, buf))
        return fl_staged_broadcast(c, buf, count, dtype, root);
    coll_op_t o;
    if ((rc = fl_coll__begin(c, &o, FL_COLL_BROADCAST, count, dtype, FL_SUM, root)) != FL_OK)
        return rc;
    if (count == 0 || c->size == 1)
        return fl_coll__end(&o, FL_OK);
    return fl_coll__end(&o, fl_bcast(&o, buf));
}

int fl_barrier(fl_comm_t *c)
{
    if (c == NULL)
        return fl_fail(FL_EINVAL, "barrier: communicator is NULL");
    coll_op_t o;
    int rc = fl_coll__begin(c, &o, FL_COLL_BARRIER, 0, FL_UINT8, FL_SUM, 0);
    if (rc != FL_OK)
        return rc;
    if (c->size == 1)
        return fl_coll__end(&o, FL_OK);
    return fl_coll__end(&o, fl_dissem_barrier(&o));
}
