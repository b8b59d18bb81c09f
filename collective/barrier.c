/* Dissemination barrier: in round k every rank signals rank + 2^k and waits for rank - 2^k;
 * after ceil(log2 N) rounds each rank has heard, directly or not, from every other. */
#include "comm_int.h"

int fl_dissem_barrier(coll_op_t *op)
{
    fl_comm_t *c = op->c;
    int n = c->size;
    uint64_t arrived = 0; /* bit k: round k's signal is in */
    int rounds = 0;
    while ((1 << rounds) < n)
        rounds++;
    op->msgs_expected = (size_t)rounds;
    for (int k = 0; k < rounds; k++) {
        int to = fl_ring_mod((long)c->rank + (1L << k), n);
        int from = fl_ring_mod((long)c->rank - (1L << k), n);
        fl_msg_barrier_t b = {.id = op->seq, .round = (uint32_t)k};
        op->step = (uint32_t)k;
        int rc = fl_coll__send_empty(op, to, FL_MSG_BARRIER, &b);
        if (rc != FL_OK)
            return rc;
        op->waiting_on = from;
        while (!(arrived & (1ULL << k))) {
            fl_tp_msg_t m;
            if ((rc = fl_coll__recv(op, &m)) != FL_OK)
                return rc;
            uint32_t round = m.hdr.u.barrier.round;
            int sender = m.hdr.sender;
            bool ok = m.nframes == 0 && round < (uint32_t)rounds &&
                      sender == fl_ring_mod((long)c->rank - (1L << round), n) &&
                      !(arrived & (1ULL << round));
            fl_tp_msg_close(&m);
            if (!ok)
                return fl_coll__fail(op, FL_EPROTO, "unexpected barrier round %u from rank %d",
                                     round, sender);
            arrived |= 1ULL << round;
            op->msgs_got++;
        }
    }
    return FL_OK;
}
