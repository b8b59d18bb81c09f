/* Recursive-doubling allreduce for small buffers: log2(P) rounds in which partners swap their
 * whole partial result, P the largest power of two <= N. The first 2*(N-P) ranks pair up
 * before (odd ranks absorb their even neighbour) and after (odd ranks hand the result back).
 * Partners combine the same two operands (a+b on one side, b+a on the other: IEEE addition is
 * commutative), so every rank ends with the same bits. Sends are copies: the buffer changes
 * right after each send. */
#include "comm_int.h"

#include <stdlib.h>
#include <string.h>

#define RD_MAX_ROUNDS 32
#define SLOT_PRE RD_MAX_ROUNDS
#define SLOT_POST (RD_MAX_ROUNDS + 1)
#define NSLOTS (RD_MAX_ROUNDS + 2)

typedef struct rd {
    coll_op_t *op;
    fl_tp_msg_t pending[NSLOTS];
    bool have[NSLOTS];
    int rem;
    int p;
} rd_t;

static int real_rank(const rd_t *d, int newrank)
{
    return newrank < d->rem ? newrank * 2 + 1 : newrank + d->rem;
}

static int slot_of(const fl_msg_chunk_t *ck)
{
    if (ck->phase == FL_PHASE_RD_PRE)
        return SLOT_PRE;
    if (ck->phase == FL_PHASE_RD_POST)
        return SLOT_POST;
    if (ck->phase == FL_PHASE_RD && ck->step < RD_MAX_ROUNDS)
        return (int)ck->step;
    return -1;
}

/* Which peer may legitimately send into a slot, from this rank's point of view. */
static int expected_sender(const rd_t *d, int slot)
{
    int r = d->op->c->rank;
    if (slot == SLOT_PRE)
        return r < 2 * d->rem && (r & 1) ? r - 1 : -1;
    if (slot == SLOT_POST)
        return r < 2 * d->rem && !(r & 1) ? r + 1 : -1;
    int newrank = r < 2 * d->rem ? ((r & 1) ? r / 2 : -1) : r - d->rem;
    if (newrank < 0 || (1 << slot) >= d->p)
        return -1;
    return real_rank(d, newrank ^ (1 << slot));
}

/* The message for slot, taking it from the ones that arrived early or waiting for it. */
static int rd_get(rd_t *d, int want, fl_tp_msg_t *out)
{
    coll_op_t *op = d->op;
    op->waiting_on = expected_sender(d, want);
    while (!d->have[want]) {
        fl_tp_msg_t m;
        int rc = fl_coll__recv(op, &m);
        if (rc != FL_OK)
            return rc;
        int slot = slot_of(&m.hdr.u.chunk);
        if (slot < 0 || expected_sender(d, slot) != m.hdr.sender || d->have[slot]) {
            rc = fl_coll__fail(op, FL_EPROTO, "unexpected %s step %u from rank %d",
                               fl_coll_phase_name((int)m.hdr.u.chunk.phase), m.hdr.u.chunk.step,
                               m.hdr.sender);
            fl_tp_msg_close(&m);
            return rc;
        }
        if ((rc = fl_coll__check_payload(op, &m, fl_acc_dtype(op->dtype), op->count)) != FL_OK) {
            fl_tp_msg_close(&m);
            return rc;
        }
        op->msgs_got++;
        d->pending[slot] = m;
        d->have[slot] = true;
    }
    *out = d->pending[want];
    d->have[want] = false;
    return FL_OK;
}

static int rd_send(rd_t *d, int peer, uint32_t phase, uint32_t step, const void *work)
{
    fl_msg_chunk_t ck = {0};
    ck.phase = phase;
    ck.step = step;
    ck.count = d->op->count;
    fl_dtype_t acc = fl_acc_dtype(d->op->dtype);
    return fl_coll__send(d->op, peer, &ck, work, d->op->count * fl_dtype_size(acc), acc, -1);
}

static int rd_run(rd_t *d, uint8_t *work)
{
    coll_op_t *op = d->op;
    int r = op->c->rank;
    fl_dtype_t acc = fl_acc_dtype(op->dtype);
    fl_tp_msg_t m;
    int rc;
    int newrank;

    op->phase = FL_PHASE_RD_PRE;
    if (r < 2 * d->rem) {
        if (!(r & 1)) {
            if ((rc = rd_send(d, r + 1, FL_PHASE_RD_PRE, 0, work)) != FL_OK)
                return rc;
            newrank = -1;
        } else {
            if ((rc = rd_get(d, SLOT_PRE, &m)) != FL_OK)
                return rc;
            fl_reduce_combine(op->op, acc, work, work, fl_tp_msg_data(&m, 0), op->count);
            fl_tp_msg_close(&m);
            newrank = r / 2;
        }
    } else {
        newrank = r - d->rem;
    }

    op->phase = FL_PHASE_RD;
    if (newrank >= 0) {
        for (int k = 0; (1 << k) < d->p; k++) {
            op->step = (uint32_t)k;
            int partner = real_rank(d, newrank ^ (1 << k));
            if ((rc = rd_send(d, partner, FL_PHASE_RD, (uint32_t)k, work)) != FL_OK ||
                (rc = rd_get(d, k, &m)) != FL_OK)
                return rc;
            fl_reduce_combine(op->op, acc, work, work, fl_tp_msg_data(&m, 0), op->count);
            fl_tp_msg_close(&m);
        }
    }

    op->phase = FL_PHASE_RD_POST;
    op->step = 0;
    if (r < 2 * d->rem) {
        if (r & 1)
            return rd_send(d, r - 1, FL_PHASE_RD_POST, 0, work);
        if ((rc = rd_get(d, SLOT_POST, &m)) != FL_OK)
            return rc;
        memcpy(work, fl_tp_msg_data(&m, 0), op->count * fl_dtype_size(acc));
        fl_tp_msg_close(&m);
    }
    return FL_OK;
}

int fl_rd_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf)
{
    fl_comm_t *c = op->c;
    rd_t d;
    memset(&d, 0, sizeof d);
    d.op = op;
    d.p = 1;
    while (d.p * 2 <= c->size)
        d.p *= 2;
    d.rem = c->size - d.p;
    op->msgs_expected = 0;

    fl_dtype_t acc = fl_acc_dtype(op->dtype);
    uint8_t *work = recvbuf;
    if (acc != op->dtype) {
        void *scratch;
        int rc = fl_comm_scratch(c, op->count * fl_dtype_size(acc), &scratch);
        if (rc != FL_OK)
            return fl_coll__fail(op, rc, "%s", fl_last_error());
        work = scratch;
    }
    fl_reduce_widen(op->dtype, work, sendbuf, op->count);
    int rc = rd_run(&d, work);
    for (int i = 0; i < NSLOTS; i++) {
        if (d.have[i])
            fl_tp_msg_close(&d.pending[i]);
    }
    if (rc == FL_OK)
        fl_reduce_finish(op->op, op->dtype, recvbuf, work, op->count, c->size);
    return rc;
}
