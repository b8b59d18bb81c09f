/* One-shot allreduce for small buffers: every rank sends its whole contribution to every other
 * rank and reduces the N contributions itself, in rank order 0..N-1 so that every rank computes
 * the same bits. One network hop instead of log2(N) (recursive doubling) or 2(N-1) (ring); it
 * sends (N-1) times the buffer, which is what small buffers can afford. Sends are copies: the
 * result may overwrite the caller's buffer while they are still queued. */
#include "comm_int.h"

#include <stdlib.h>
#include <string.h>

int fl_direct_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf)
{
    fl_comm_t *c = op->c;
    int n = c->size;
    fl_dtype_t acc = fl_acc_dtype(op->dtype);
    size_t asz = fl_dtype_size(acc);
    size_t bytes = op->count * asz;
    int rc;

    /* scratch: [0, bytes) our contribution widened, [bytes, 2 bytes) the running result */
    uint8_t *scratch;
    if ((rc = fl_comm_scratch(c, 2 * bytes, (void **)&scratch)) != FL_OK)
        return fl_coll__fail(op, rc, "%s", fl_last_error());
    uint8_t *mine = scratch;
    uint8_t *work = scratch + bytes;
    fl_reduce_widen(op->dtype, mine, sendbuf, op->count);

    fl_tp_msg_t *got = calloc((size_t)n, sizeof *got);
    bool *have = calloc((size_t)n, sizeof *have);
    if (got == NULL || have == NULL) {
        free(got);
        free(have);
        return fl_coll__fail(op, FL_ENOMEM, "out of memory for %d messages", n);
    }
    op->phase = FL_PHASE_DIRECT;
    op->msgs_expected = (size_t)n - 1;
    fl_msg_chunk_t ck = {0};
    ck.phase = FL_PHASE_DIRECT;
    ck.count = op->count;
    for (int k = 1; k < n && rc == FL_OK; k++)
        rc = fl_coll__send(op, fl_ring_mod((long)c->rank + k, n), &ck, mine, bytes, acc, -1);

    while (rc == FL_OK && op->msgs_got < op->msgs_expected) {
        for (int k = 1; k < n; k++) {
            int q = fl_ring_mod((long)c->rank - k, n);
            if (!have[q]) {
                op->waiting_on = q;
                break;
            }
        }
        fl_tp_msg_t m;
        if ((rc = fl_coll__recv(op, &m)) != FL_OK)
            break;
        int q = m.hdr.sender;
        if (m.hdr.u.chunk.phase != FL_PHASE_DIRECT || have[q]) {
            rc = fl_coll__fail(op, FL_EPROTO, "unexpected %s message from rank %d%s",
                               fl_coll_phase_name((int)m.hdr.u.chunk.phase), q,
                               have[q] ? " (its contribution arrived twice)" : "");
            fl_tp_msg_close(&m);
            break;
        }
        if ((rc = fl_coll__check_payload(op, &m, acc, op->count)) != FL_OK) {
            fl_tp_msg_close(&m);
            break;
        }
        got[q] = m;
        have[q] = true;
        op->msgs_got++;
    }
    if (rc == FL_OK) {
        /* Rank order, the same on every rank: ((x0 op x1) op x2) ... */
        const void *first = c->rank == 0 ? (const void *)mine : fl_tp_msg_data(&got[0], 0);
        memcpy(work, first, bytes);
        for (int q = 1; q < n; q++) {
            const void *x = q == c->rank ? (const void *)mine : fl_tp_msg_data(&got[q], 0);
            fl_reduce_combine(op->op, acc, work, work, x, op->count);
        }
        fl_reduce_finish(op->op, op->dtype, recvbuf, work, op->count, n);
    }
    for (int q = 0; q < n; q++)
        if (have[q])
            fl_tp_msg_close(&got[q]);
    free(got);
    free(have);
    return rc;
}
