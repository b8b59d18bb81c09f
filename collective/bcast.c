/* Broadcast: a binomial tree for small buffers (log2(N) hops), a pipelined chain for large
 * ones (root -> root+1 -> ...; each segment is forwarded as soon as it arrives, so the time
 * approaches one buffer transfer rather than N-1). */
#include "comm_int.h"

#include <stdlib.h>
#include <string.h>

static int bcast_tree(coll_op_t *op, uint8_t *buf, size_t bytes)
{
    fl_comm_t *c = op->c;
    int n = c->size;
    int v = fl_ring_mod((long)c->rank - op->root, n);
    int mask = 1;
    int rc;
    op->phase = FL_PHASE_BCAST;
    while (mask < n) {
        if (v & mask) {
            int src = fl_ring_mod((long)v - mask + op->root, n);
            op->waiting_on = src;
            op->msgs_expected = 1;
            fl_tp_msg_t m;
            if ((rc = fl_coll__recv(op, &m)) != FL_OK)
                return rc;
            if (m.hdr.sender != src || m.hdr.u.chunk.phase != FL_PHASE_BCAST)
                rc = fl_coll__fail(op, FL_EPROTO,
                                   "unexpected broadcast data from rank %d (parent "
                                   "is rank %d)",
                                   m.hdr.sender, src);
            else
                rc = fl_coll__check_payload(op, &m, op->dtype, op->count);
            if (rc == FL_OK)
                memcpy(buf, fl_tp_msg_data(&m, 0), bytes);
            fl_tp_msg_close(&m);
            if (rc != FL_OK)
                return rc;
            op->msgs_got = 1;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while (mask > 0) {
        if (v + mask < n) {
            fl_msg_chunk_t ck = {0};
            ck.phase = FL_PHASE_BCAST;
            ck.step = (uint32_t)mask;
            ck.count = op->count;
            int dst = fl_ring_mod((long)v + mask + op->root, n);
            /* buf is not written again in this op: send it without a copy. */
            if ((rc = fl_coll__send(op, dst, &ck, buf, bytes, op->dtype, c->size)) != FL_OK)
                return rc;
        }
        mask >>= 1;
    }
    return FL_OK;
}

static int bcast_chain(coll_op_t *op, uint8_t *buf)
{
    fl_comm_t *c = op->c;
    int n = c->size;
    int v = fl_ring_mod((long)c->rank - op->root, n);
    int prev = fl_ring_mod((long)c->rank - 1, n);
    int next = fl_ring_mod((long)c->rank + 1, n);
    size_t esz = fl_dtype_size(op->dtype);
    size_t segn = fl_ring_segn(op->count, esz, c->segment_bytes);
    uint32_t nseg = fl_ring_nseg(op->count, segn);
    int rc = FL_OK;
    op->phase = FL_PHASE_BCAST;

    if (v == 0) {
        for (uint32_t s = 0; s < nseg && rc == FL_OK; s++) {
            fl_msg_chunk_t ck = {0};
            ck.phase = FL_PHASE_BCAST;
            ck.seg = s;
            ck.offset = (size_t)s * segn;
            ck.count = op->count - ck.offset < segn ? op->count - ck.offset : segn;
            rc = fl_coll__send(op, next, &ck, buf + ck.offset * esz, ck.count * esz, op->dtype,
                               c->size);
        }
        return rc;
    }
    uint8_t *seen = calloc(nseg ? nseg : 1, 1);
    if (seen == NULL)
        return fl_coll__fail(op, FL_ENOMEM, "out of memory for the segment table");
    op->waiting_on = prev;
    op->msgs_expected = nseg;
    while (rc == FL_OK && op->msgs_got < nseg) {
        fl_tp_msg_t m;
        if ((rc = fl_coll__recv(op, &m)) != FL_OK)
            break;
        fl_msg_chunk_t ck = m.hdr.u.chunk;
        size_t off = (size_t)ck.seg * segn;
        size_t cnt = ck.seg < nseg ? (op->count - off < segn ? op->count - off : segn) : 0;
        if (m.hdr.sender != prev || ck.phase != FL_PHASE_BCAST || ck.seg >= nseg || seen[ck.seg] ||
            ck.offset != off || ck.count != cnt)
            rc = fl_coll__fail(op, FL_EPROTO,
                               "unexpected broadcast segment %u [%llu, +%llu) from "
                               "rank %d (chain predecessor is rank %d)",
                               ck.seg, (unsigned long long)ck.offset, (unsigned long long)ck.count,
                               m.hdr.sender, prev);
        else
            rc = fl_coll__check_payload(op, &m, op->dtype, cnt);
        if (rc == FL_OK) {
            seen[ck.seg] = 1;
            memcpy(buf + off * esz, fl_tp_msg_data(&m, 0), cnt * esz);
            op->msgs_got++;
            if (v < n - 1)
                rc = fl_coll__send(op, next, &ck, buf + off * esz, cnt * esz, op->dtype, c->size);
        }
        fl_tp_msg_close(&m);
    }
    free(seen);
    return rc;
}

/* The tree up to this size at most, whatever small_bytes (sized for allreduce) says. */
#define TREE_MAX_BYTES ((size_t)64 << 10)

int fl_bcast(coll_op_t *op, void *buf)
{
    size_t bytes = op->count * fl_dtype_size(op->dtype);
    size_t tree_max = op->c->small_bytes < TREE_MAX_BYTES ? op->c->small_bytes : TREE_MAX_BYTES;
    if (bytes <= tree_max)
        return bcast_tree(op, buf, bytes);
    return bcast_chain(op, buf);
}
