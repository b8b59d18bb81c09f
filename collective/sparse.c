/* Sparse allreduce: each rank's top-k pairs, encoded as one sparse block, go round the ring
 * (an all-gather of variable-size blocks, forwarded as they arrive); every rank adds the N
 * blocks into the dense output in rank order 0..N-1, each as soon as it and those before it
 * have arrived, so every rank computes the same bits. When
 * the gathered pairs would outweigh a dense ring (N * k * bytes-per-pair > 2 * n * 4), each rank
 * scatters its own (already rounded) pairs into the output and the dense ring runs instead. */
#include "comm_int.h"

#include <stdlib.h>
#include <string.h>

#include "fl_cmp.h"

/* Bytes a pair costs on the wire, for the dense-or-sparse decision: the value plus a
 * generous index (varint deltas take 1 to 5 bytes; 4 keeps the estimate on the safe side). */
#define PAIR_INDEX_BYTES 4

void fl_sparse_opts_init(fl_sparse_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->values = FL_FLOAT32;
    o->lz4 = 1;
    o->allow_dense = 1;
}

static int get_ws(fl_comm_t *c, fl_cmp_ws_t **ws)
{
    if (c->cmp_ws == NULL) {
        int rc = fl_cmp_ws_create(&c->cmp_ws);
        if (rc != FL_OK)
            return rc;
    }
    *ws = c->cmp_ws;
    return FL_OK;
}

/* The ring all-gather of the encoded blocks, then the rank-ordered sum into out. */
static int gather_blocks(coll_op_t *op, fl_cmp_ws_t *ws, const uint8_t *mine, size_t mine_len,
                         float *out, size_t n, uint64_t *ktot)
{
    fl_comm_t *c = op->c;
    int nr = c->size;
    int r = c->rank;
    int left = fl_ring_mod((long)r - 1, nr);
    int right = fl_ring_mod((long)r + 1, nr);
    fl_tp_msg_t *got = calloc((size_t)nr, sizeof *got);
    bool *have = calloc((size_t)nr, sizeof *have);
    if (got == NULL || have == NULL) {
        free(got);
        free(have);
        return fl_coll__fail(op, FL_ENOMEM, "out of memory for %d blocks", nr);
    }
    int rc = FL_OK;
    op->phase = FL_PHASE_AG;
    op->waiting_on = left;
    op->msgs_expected = (size_t)nr - 1;
    fl_msg_chunk_t ck = {0};
    ck.phase = FL_PHASE_AG;
    ck.seg = (uint32_t)r; /* whose block */
    ck.count = n;
    if (nr > 1)
        rc = fl_coll__send_block(op, right, &ck, mine, mine_len);
    /* The output's zeros and the sums go in while blocks are still on their way: blocks are
     * added in rank order 0..N-1 (the same bits on every rank) as soon as each one and all
     * before it are here. The caller's buffer is output only; a failure leaves it undefined. */
    if (rc == FL_OK)
        memset(out, 0, n * sizeof *out);
    int next = 0; /* the next rank whose block is to be added */
    uint64_t sum = 0;
    for (;;) {
        while (rc == FL_OK && next < nr && (next == r || have[next])) {
            const void *blk = next == r ? (const void *)mine : fl_tp_msg_data(&got[next], 0);
            size_t len = next == r ? mine_len : fl_tp_msg_size(&got[next], 0);
            size_t kq;
            if ((rc = fl_cmp_sparse_accumulate(ws, blk, len, out, n, &kq)) != FL_OK)
                rc = fl_coll__fail(op, FL_EPROTO, "sparse block of rank %d: %s", next,
                                   fl_last_error());
            sum += kq;
            next++;
        }
        if (rc != FL_OK || op->msgs_got >= op->msgs_expected)
            break;
        fl_tp_msg_t m;
        if ((rc = fl_coll__recv(op, &m)) != FL_OK)
            break;
        const fl_msg_chunk_t *in = &m.hdr.u.chunk;
        int owner = fl_ring_mod((long)r - (long)in->step - 1, nr);
        fl_cmp_sparse_info_t info;
        if (m.hdr.sender != left || in->phase != FL_PHASE_AG || in->step >= (uint32_t)nr - 1 ||
            in->seg != (uint32_t)owner || have[owner]) {
            rc = fl_coll__fail(op, FL_EPROTO,
                               "unexpected sparse block step %u of rank %u from "
                               "rank %d",
                               in->step, in->seg, m.hdr.sender);
        } else if (m.nframes != 1 || m.hdr.frames[0].codec != FL_CODEC_SPARSE ||
                   fl_cmp_sparse_peek(fl_tp_msg_data(&m, 0), fl_tp_msg_size(&m, 0), &info) !=
                       FL_OK ||
                   info.n != n) {
            rc =
                fl_coll__fail(op, FL_EPROTO, "bad sparse block of rank %d (from rank %d): %s",
                              owner, m.hdr.sender, m.nframes == 1 ? fl_last_error() : "no payload");
        }
        if (rc != FL_OK) {
            fl_tp_msg_close(&m);
            break;
        }
        op->step = in->step;
        op->msgs_got++;
        /* Forward before keeping: the right neighbour needs it next step. */
        if (in->step + 1 < (uint32_t)nr - 1) {
            fl_msg_chunk_t fw = *in;
            fw.step = in->step + 1;
            rc = fl_coll__send_block(op, right, &fw, fl_tp_msg_data(&m, 0), fl_tp_msg_size(&m, 0));
        }
        got[owner] = m;
        have[owner] = true;
    }
    if (rc == FL_OK)
        *ktot = sum;
    for (int q = 0; q < nr; q++)
        if (have[q])
            fl_tp_msg_close(&got[q]);
    free(got);
    free(have);
    return rc;
}

static void finish_stats(fl_comm_t *c, size_t n, uint64_t sent_before, uint64_t k_total, bool dense,
                         fl_sparse_stats_t *st)
{
    if (st == NULL)
        return;
    st->dense = dense;
    st->k_total = k_total;
    st->raw_bytes =
        c->size > 1 ? (uint64_t)(2.0 * (c->size - 1) / c->size * (double)n * sizeof(float)) : 0;
    st->wire_bytes = c->bytes_sent - sent_before;
    st->ratio = st->wire_bytes > 0 ? (double)st->raw_bytes / (double)st->wire_bytes : 0.0;
}

/* The caller's arguments, before anything is sent: a refused call must not have communicated. */
static int check_args(const fl_comm_t *c, const uint32_t *idx, const float *val, size_t k,
                      const float *out, size_t n, fl_op_t op)
{
    if (op != FL_SUM && op != FL_AVG)
        return fl_fail(FL_EINVAL, "rank %d: sparse allreduce: operator %s, only sum and avg",
                       c->rank, fl_op_name(op));
    if (n == 0 || n > UINT32_MAX || k > n || out == NULL || (k > 0 && (idx == NULL || val == NULL)))
        return fl_fail(FL_EINVAL,
                       "rank %d: sparse allreduce: %zu pairs of a tensor of %zu "
                       "entries (or a NULL buffer)",
                       c->rank, k, n);
    return FL_OK;
}

/* Every rank must take the same path: agree on the largest k, given or gathered, and choose
 * sparse or dense by it. *ktot gets the pairs of all ranks where this already tells them. */
static int agree_path(fl_comm_t *c, size_t k, size_t n, const fl_sparse_opts_t *opts, bool *dense,
                      uint64_t *ktot)
{
    uint64_t kmax = opts->k_max;
    int rc;
    *ktot = 0;
    bool agreed = kmax == 0; /* kmax comes from the ranks, not the options */
    if (agreed) {
        /* The path needs only the largest k: one small allreduce (one hop for a few ranks,
         * the same 8 bytes to each peer a ring all-gather of the ks sends over N-1 hops). */
        int64_t km = (int64_t)k;
        if ((rc = fl_allreduce(c, &km, &km, 1, FL_INT64, FL_MAX)) != FL_OK)
            return rc;
        kmax = (uint64_t)km;
    }
    size_t vsize = fl_dtype_size(opts->values);
    *dense = opts->allow_dense && c->size > 1 &&
             (double)c->size * (double)kmax * (double)(vsize + PAIR_INDEX_BYTES) >
                 2.0 * (double)n * sizeof(float);
    if (c->size == 1)
        *ktot = k;
    if (*dense && agreed) {
        /* The dense path's stats count every rank's pairs. */
        int64_t kt = (int64_t)k;
        if ((rc = fl_allreduce(c, &kt, &kt, 1, FL_INT64, FL_SUM)) != FL_OK)
            return rc;
        *ktot = (uint64_t)kt;
    }
    return FL_OK;
}

/* The same rounded values the sparse path would add, straight into the output, then the ring
 * (unless another algorithm is forced): the fallback is taken when the pairs would outweigh
 * it, and the stats compare against its bytes. */
static int run_dense(fl_comm_t *c, const uint32_t *idx, const float *val, size_t k, float *out,
                     size_t n, fl_op_t op, const fl_sparse_opts_t *opts)
{
    memset(out, 0, n * sizeof *out);
    for (size_t j = 0; j < k; j++)
        out[idx[j]] = fl_cmp_round(val[j], opts->values);
    fl_algo_t algo = c->algo == FL_ALGO_AUTO ? FL_ALGO_RING : c->algo;
    if (c->size > 1)
        return fl_allreduce_algo(c, out, out, n, FL_FLOAT32, op, algo);
    return FL_OK;
}

/* This rank's block round the ring and every block added into out. *gathered: all pairs. */
static int run_sparse(fl_comm_t *c, fl_cmp_ws_t *ws, const uint32_t *idx, const float *val,
                      size_t k, float *out, size_t n, fl_op_t op, const fl_sparse_opts_t *opts,
                      uint64_t *gathered)
{
    /* The block is what travels; decoding it back gives this rank the same rounded values
     * every other rank adds. */
    fl_cmp_sparse_opts_t so;
    fl_cmp_sparse_opts_init(&so);
    so.values = opts->values;
    so.lz4 = opts->lz4 != 0;
    size_t cap = fl_cmp_sparse_bound(k, opts->values);
    uint8_t *mine = malloc(cap);
    if (mine == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: sparse allreduce: no memory for a %zu-byte block",
                       c->rank, cap);
    size_t mine_len = 0;
    int rc = fl_cmp_sparse_encode(ws, idx, val, k, n, &so, mine, cap, &mine_len);
    if (rc != FL_OK) {
        free(mine);
        return fl_fail_ctx(rc, "rank %d: sparse allreduce", c->rank);
    }
    coll_op_t o;
    if ((rc = fl_coll__begin(c, &o, FL_COLL_SPARSE_ALLREDUCE, n, FL_FLOAT32, op, 0)) != FL_OK) {
        free(mine);
        return rc;
    }
    rc = gather_blocks(&o, ws, mine, mine_len, out, n, gathered);
    if (rc == FL_OK && op == FL_AVG) {
        float d = (float)c->size;
        for (size_t i = 0; i < n; i++)
            out[i] /= d;
    }
    rc = fl_coll__end(&o, rc);
    free(mine);
    return rc;
}

int fl_sparse_allreduce(fl_comm_t *c, const uint32_t *idx, const float *val, size_t k, float *out,
                        size_t n, fl_op_t op, const fl_sparse_opts_t *opts,
                        fl_sparse_stats_t *stats)
{
    fl_sparse_opts_t dflt;
    if (opts == NULL) {
        fl_sparse_opts_init(&dflt);
        opts = &dflt;
    }
    if (c == NULL)
        return fl_fail(FL_EINVAL, "sparse allreduce: communicator is NULL");
    int rc = check_args(c, idx, val, k, out, n, op);
    if (rc != FL_OK)
        return rc;
    fl_cmp_ws_t *ws;
    if ((rc = get_ws(c, &ws)) != FL_OK)
        return rc;
    uint64_t sent_before = c->bytes_sent;
    if ((rc = fl_cmp_sparse_check(idx, k, n, opts->values)) != FL_OK)
        return fl_fail_ctx(rc, "rank %d: sparse allreduce", c->rank);
    if (opts->k_max > 0 && k > opts->k_max)
        return fl_fail(FL_EINVAL, "rank %d: sparse allreduce: %zu pairs, more than k_max %zu",
                       c->rank, k, opts->k_max);
    bool dense = false;
    uint64_t ktot = 0;
    if ((rc = agree_path(c, k, n, opts, &dense, &ktot)) != FL_OK)
        return rc;
    if (dense || c->size == 1) {
        if ((rc = run_dense(c, idx, val, k, out, n, op, opts)) != FL_OK)
            return rc;
        finish_stats(c, n, sent_before, ktot, dense, stats);
        return FL_OK;
    }
    uint64_t gathered = 0;
    rc = run_sparse(c, ws, idx, val, k, out, n, op, opts, &gathered);
    if (rc == FL_OK)
        finish_stats(c, n, sent_before, gathered, false, stats);
    return rc;
}
