/* Ring collectives: reduce-scatter, all-gather, and allreduce as the two back to back.
 * Each chunk is cut into segments that flow independently: a segment received in step s is
 * reduced and sent on as step s+1 at once, so sending, receiving and reducing overlap, and the
 * last reduce-scatter segment of the owned chunk starts the all-gather before the rest of the
 * chunk has arrived. Segments may arrive in any order (stripes), so each is checked on its own:
 * sender, phase, step, segment number, offset, count and size, and no segment twice. */
#include "comm_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct ring {
    coll_op_t *op;
    int n;
    int r;
    int left;
    int right;
    fl_dtype_t dt;  /* the caller's type */
    fl_dtype_t acc; /* the type partial sums travel in */
    size_t esz;
    size_t asz;
    size_t segn;
    const uint8_t *local; /* this rank's contribution, dt */
    uint8_t *work;        /* partial sums, acc; may be the caller's buffer */
    bool work_is_out;     /* work and out are the same memory (acc == dt, allreduce) */
    uint8_t *out;         /* final values, dt, indexed from out_base */
    size_t out_base;
    bool rs;
    bool ag;
    uint8_t *seen; /* [phase][step][seg]: a segment accepted twice would be reduced twice */
    uint32_t maxseg;
} ring_t;

static void seg_range(const ring_t *g, int chunk, uint32_t seg, size_t *off, size_t *cnt)
{
    size_t c0 = fl_shard_offset(g->op->count, g->n, chunk);
    size_t cn = fl_shard_count(g->op->count, g->n, chunk);
    size_t s0 = (size_t)seg * g->segn;
    *off = c0 + s0;
    *cnt = cn - s0 < g->segn ? cn - s0 : g->segn;
}

static uint32_t chunk_nseg(const ring_t *g, int chunk)
{
    return fl_ring_nseg(fl_shard_count(g->op->count, g->n, chunk), g->segn);
}

/* Zero-copy tracking regions: sends from the caller's output buffer are tracked per chunk,
 * because all-gather overwrites chunks that reduce-scatter sent from; everything else (the
 * caller's input, scratch) shares region n, released by the end of the op. */
static int send_seg(ring_t *g, uint32_t phase, int step, int chunk, uint32_t seg)
{
    size_t off;
    size_t cnt;
    seg_range(g, chunk, seg, &off, &cnt);
    fl_msg_chunk_t ck = {0};
    ck.phase = phase;
    ck.step = (uint32_t)step;
    ck.seg = seg;
    ck.offset = off;
    ck.count = cnt;
    if (phase == FL_PHASE_RS) {
        const uint8_t *src;
        int region;
        if (step == 0 && g->acc == g->dt) {
            /* Nothing reduced yet: send the caller's contribution as it is. */
            src = g->local + off * g->esz;
            region = g->local == g->work && g->work_is_out ? chunk : g->n;
        } else {
            if (step == 0)
                fl_reduce_widen(g->dt, g->work + off * g->asz, g->local + off * g->esz, cnt);
            src = g->work + off * g->asz;
            region = g->work_is_out ? chunk : g->n;
        }
        return fl_coll__send(g->op, g->right, &ck, src, cnt * g->asz, g->acc, region);
    }
    return fl_coll__send(g->op, g->right, &ck, g->out + (off - g->out_base) * g->esz, cnt * g->esz,
                         g->dt, chunk);
}

static int send_chunk(ring_t *g, uint32_t phase, int step, int chunk)
{
    uint32_t ns = chunk_nseg(g, chunk);
    for (uint32_t s = 0; s < ns; s++) {
        int rc = send_seg(g, phase, step, chunk, s);
        if (rc != FL_OK)
            return rc;
    }
    return FL_OK;
}

/* A reduce-scatter segment of the owned chunk is complete: finish it into the output and, for
 * allreduce, start its all-gather. */
static int owned_seg_done(ring_t *g, uint32_t seg)
{
    size_t off;
    size_t cnt;
    seg_range(g, g->r, seg, &off, &cnt);
    fl_reduce_finish(g->op->op, g->dt, g->out + (off - g->out_base) * g->esz,
                     g->work + off * g->asz, cnt, g->n);
    if (g->ag && g->n > 1)
        return send_seg(g, FL_PHASE_AG, 0, g->r, seg);
    return FL_OK;
}

static int on_segment(ring_t *g, fl_tp_msg_t *m)
{
    coll_op_t *op = g->op;
    const fl_msg_chunk_t *ck = &m->hdr.u.chunk;
    bool is_rs = ck->phase == FL_PHASE_RS && g->rs;
    bool is_ag = ck->phase == FL_PHASE_AG && g->ag;
    if (m->hdr.sender != g->left || (!is_rs && !is_ag) || ck->step >= (uint32_t)(g->n - 1))
        return fl_coll__fail(op, FL_EPROTO,
                             "unexpected %s step %u segment %u from rank %d (the "
                             "ring's left neighbour is rank %d)",
                             fl_coll_phase_name((int)ck->phase), ck->step, ck->seg, m->hdr.sender,
                             g->left);
    int step = (int)ck->step;
    int chunk =
        is_rs ? fl_ring_rs_recv_chunk(g->r, step, g->n) : fl_ring_ag_recv_chunk(g->r, step, g->n);
    if (ck->seg >= chunk_nseg(g, chunk))
        return fl_coll__fail(op, FL_EPROTO, "rank %d sent segment %u of chunk %d, which has %u",
                             m->hdr.sender, ck->seg, chunk, chunk_nseg(g, chunk));
    size_t off;
    size_t cnt;
    seg_range(g, chunk, ck->seg, &off, &cnt);
    if (ck->offset != off || ck->count != cnt)
        return fl_coll__fail(op, FL_EPROTO,
                             "rank %d sent elements [%llu, +%llu) as segment %u of "
                             "chunk %d, expected [%zu, +%zu)",
                             m->hdr.sender, (unsigned long long)ck->offset,
                             (unsigned long long)ck->count, ck->seg, chunk, off, cnt);
    size_t idx =
        ((size_t)(is_ag ? 1 : 0) * (size_t)(g->n - 1) + (size_t)step) * g->maxseg + ck->seg;
    if (g->seen[idx])
        return fl_coll__fail(op, FL_EPROTO, "rank %d sent %s step %d segment %u twice",
                             m->hdr.sender, fl_coll_phase_name((int)ck->phase), step, ck->seg);
    int rc = fl_coll__check_payload(op, m, is_rs ? g->acc : g->dt, cnt);
    if (rc != FL_OK)
        return rc;
    g->seen[idx] = 1;
    op->phase = ck->phase;
    op->step = ck->step;
    const void *in = fl_tp_msg_data(m, 0);

    if (is_rs) {
        fl_reduce_combine(op->op, g->dt, g->work + off * g->asz, g->local + off * g->esz, in, cnt);
        if (step < g->n - 2)
            return send_seg(g, FL_PHASE_RS, step + 1, chunk, ck->seg);
        return owned_seg_done(g, ck->seg);
    }
    /* All-gather overwrites memory that reduce-scatter may still be sending from. */
    if ((rc = fl_coll__wait_region(op, chunk)) != FL_OK)
        return rc;
    memcpy(g->out + (off - g->out_base) * g->esz, in, cnt * g->esz);
    if (step < g->n - 2)
        return send_seg(g, FL_PHASE_AG, step + 1, chunk, ck->seg);
    return FL_OK;
}

static int ring_run(ring_t *g)
{
    coll_op_t *op = g->op;
    int rc = FL_OK;
    g->maxseg = chunk_nseg(g, 0);
    size_t expected = 0;
    for (int s = 0; s < g->n - 1; s++) {
        if (g->rs)
            expected += chunk_nseg(g, fl_ring_rs_recv_chunk(g->r, s, g->n));
        if (g->ag)
            expected += chunk_nseg(g, fl_ring_ag_recv_chunk(g->r, s, g->n));
    }
    op->msgs_expected = expected;
    g->seen = calloc((size_t)2 * (size_t)(g->n - 1) * (g->maxseg ? g->maxseg : 1), 1);
    if (g->seen == NULL)
        return fl_coll__fail(op, FL_ENOMEM, "out of memory for the segment table");

    op->waiting_on = g->left;
    if (g->rs) {
        op->phase = FL_PHASE_RS;
        rc = send_chunk(g, FL_PHASE_RS, 0, fl_ring_rs_send_chunk(g->r, 0, g->n));
    } else {
        op->phase = FL_PHASE_AG;
        rc = send_chunk(g, FL_PHASE_AG, 0, g->r);
    }
    while (rc == FL_OK && op->msgs_got < expected) {
        fl_tp_msg_t m;
        if ((rc = fl_coll__recv(op, &m)) != FL_OK)
            break;
        rc = on_segment(g, &m);
        fl_tp_msg_close(&m);
        op->msgs_got++;
    }
    free(g->seen);
    g->seen = NULL;
    return rc;
}

static void ring_init(ring_t *g, coll_op_t *op)
{
    memset(g, 0, sizeof *g);
    fl_comm_t *c = op->c;
    g->op = op;
    g->n = c->size;
    g->r = c->rank;
    g->left = fl_ring_mod((long)c->rank - 1, c->size);
    g->right = fl_ring_mod((long)c->rank + 1, c->size);
    g->dt = op->dtype;
    g->acc = fl_acc_dtype(op->dtype);
    g->esz = fl_dtype_size(g->dt);
    g->asz = fl_dtype_size(g->acc);
    g->segn = fl_ring_segn(fl_shard_count(op->count, c->size, 0), g->asz, c->segment_bytes);
}

int fl_ring_allreduce(coll_op_t *op, const void *sendbuf, void *recvbuf)
{
    ring_t g;
    ring_init(&g, op);
    g.local = sendbuf;
    g.out = recvbuf;
    g.rs = true;
    g.ag = true;
    if (g.acc == g.dt) {
        g.work = recvbuf;
        g.work_is_out = true;
    } else {
        void *scratch;
        int rc = fl_comm_scratch(op->c, op->count * g.asz, &scratch);
        if (rc != FL_OK)
            return fl_coll__fail(op, rc, "%s", fl_last_error());
        g.work = scratch;
    }
    return ring_run(&g);
}

int fl_ring_reduce_scatter(coll_op_t *op, const void *sendbuf, void *recvbuf)
{
    ring_t g;
    ring_init(&g, op);
    void *scratch;
    int rc = fl_comm_scratch(op->c, op->count * g.asz, &scratch);
    if (rc != FL_OK)
        return fl_coll__fail(op, rc, "%s", fl_last_error());
    g.local = sendbuf;
    g.work = scratch;
    g.out = recvbuf;
    g.out_base = fl_shard_offset(op->count, g.n, g.r);
    g.rs = true;
    return ring_run(&g);
}

int fl_ring_allgather(coll_op_t *op, const void *sendbuf, void *recvbuf)
{
    ring_t g;
    ring_init(&g, op);
    size_t off = fl_shard_offset(op->count, g.n, g.r);
    size_t cnt = fl_shard_count(op->count, g.n, g.r);
    uint8_t *own = (uint8_t *)recvbuf + off * g.esz;
    if (cnt > 0 && (const void *)own != sendbuf)
        memmove(own, sendbuf, cnt * g.esz);
    g.out = recvbuf;
    g.ag = true;
    return ring_run(&g);
}
