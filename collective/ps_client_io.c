/* One exchange of a parameter-server client with every non-empty shard: the push (the
 * caller's gradient slice sent without a copy when it travels as float32; converted, lz4'd or
 * top-k-encoded into the shard's staging buffer otherwise), the pull right behind it on the
 * same connection (so the shard handles the push first), then the acks and replies, matched
 * by request number, checked, and copied (or lz4-decoded) straight into the caller's
 * parameters. A lost coordinator turns into a wait for its successor and FL_ERESYNC. */
#include "ps_client_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long after its own wait a shard's error about a held pull may take to arrive. */
#define REPLY_MARGIN_MS 5000

static int grow(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return FL_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, need ? need : 64) != 0)
        return fl_fail(FL_ENOMEM, "ps client: out of memory for %zu bytes", need);
    free(*buf);
    *buf = p;
    *cap = need;
    return FL_OK;
}

/* The first sparse pair at or after index `at` (pairs ascending). */
static size_t lower_bound(const uint32_t *idx, size_t k, uint64_t at)
{
    size_t lo = 0, hi = k;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (idx[mid] < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Splits n elements of es bytes at src into pieces of fl_msg_ps_piece: frames without a copy
 * (the caller's memory, held until ZeroMQ lets go), or lz4-encoded into the shard's staging
 * buffer piece by piece when asked and when that shrinks the piece. Returns the frame count. */
static size_t dense_frames(fl_ps_client_t *cl, cl_shard_t *sh, const void *src, size_t es,
                           uint32_t dtype, bool lz4, fl_msg_hdr_t *h, fl_buf_t *frames)
{
    uint64_t count = sh->count, piece = fl_msg_ps_piece(count);
    size_t npieces = (size_t)((count + piece - 1) / piece);
    size_t cap = lz4 ? fl_cmp_lz4_bound((size_t)(piece * es)) : 0;
    if (cap > 0 && grow(&sh->stage, &sh->stage_cap, cap * npieces) != FL_OK)
        cap = 0; /* no memory to compress: send raw */
    size_t n = 0;
    for (uint64_t at = 0; at < count; at += piece, n++) {
        uint64_t len = count - at < piece ? count - at : piece;
        size_t raw = (size_t)(len * es);
        const uint8_t *from = (const uint8_t *)src + at * es;
        uint8_t *to = (uint8_t *)sh->stage + n * cap;
        size_t z = 0;
        if (cap > 0 && fl_cmp_lz4_compress(from, raw, to, cap, &z) == FL_OK && z < raw) {
            frames[n] = (fl_buf_t){to, z, &cl->inflight, fl_rel_hook};
            h->frames[n] = (fl_msg_frame_t){z, dtype, FL_CODEC_LZ4, raw};
        } else {
            frames[n] = (fl_buf_t){(void *)from, raw, &cl->inflight, fl_rel_hook};
            h->frames[n] = (fl_msg_frame_t){raw, dtype, FL_CODEC_RAW, raw};
        }
    }
    return n;
}

/* Builds and sends the push to one shard. */
static int send_push(fl_ps_client_t *cl, cl_shard_t *sh, const fl_ps_grad_t *g, const float *init,
                     bool mark, uint64_t seq, int64_t deadline)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_PUSH, cl->o.rank);
    h.seq = seq;
    fl_msg_push_t *p = &h.u.push;
    p->shard = sh->index;
    p->offset = sh->offset;
    p->count = sh->count;
    p->step = cl->step;
    p->kind = init != NULL ? FL_PUSH_INIT : FL_PUSH_GRADIENT;
    p->batch = init != NULL ? 1 : g->batch;
    p->checkpoint = mark;
    size_t raw = (size_t)sh->count * sizeof(float);
    fl_buf_t frames[FL_MSG_MAX_FRAMES];
    size_t n = 0;
    int rc;
    if (init != NULL) {
        /* The caller's buffer receives the replies of this very exchange: send a copy. */
        if ((rc = grow(&sh->stage, &sh->stage_cap, raw)) != FL_OK)
            return rc;
        memcpy(sh->stage, init + sh->offset, raw);
        n = dense_frames(cl, sh, sh->stage, 4, FL_FLOAT32, false, &h, frames);
    } else if (g->batch == 0) {
        n = 0; /* skipping the step: no gradient travels */
    } else if (g->dense == NULL) {
        size_t lo = lower_bound(g->idx, g->k, sh->offset);
        size_t hi = lower_bound(g->idx, g->k, sh->offset + sh->count);
        size_t k = hi - lo;
        if ((rc = grow((void **)&sh->rel_idx, &sh->rel_cap, (k + 1) * sizeof(uint32_t))) != FL_OK ||
            (rc = grow(&sh->stage, &sh->stage_cap, fl_cmp_sparse_bound(k, cl->o.values))) != FL_OK)
            return rc;
        for (size_t i = 0; i < k; i++)
            sh->rel_idx[i] = (uint32_t)(g->idx[lo + i] - sh->offset);
        fl_cmp_sparse_opts_t so;
        fl_cmp_sparse_opts_init(&so);
        so.values = cl->o.values;
        so.lz4 = cl->o.lz4 != 0;
        size_t len;
        if ((rc = fl_cmp_sparse_encode(cl->ws, sh->rel_idx, g->val + lo, k, (size_t)sh->count, &so,
                                       sh->stage, sh->stage_cap, &len)) != FL_OK)
            return fl_fail_ctx(rc, "rank %d: push to shard %u", cl->o.rank, sh->index);
        frames[0] = (fl_buf_t){sh->stage, len, &cl->inflight, fl_rel_hook};
        h.frames[0] = (fl_msg_frame_t){len, cl->o.values, FL_CODEC_SPARSE, len};
        n = 1;
    } else if (cl->o.values != FL_FLOAT32) {
        size_t cnt = (size_t)sh->count;
        size_t need = cnt * 2;
        uint16_t *d;
        /* The narrow copy goes after the room the lz4 pieces would take. */
        if ((rc = grow(&sh->stage, &sh->stage_cap, need)) != FL_OK)
            return rc;
        d = sh->stage;
        const float *x = g->dense + sh->offset;
        for (size_t i = 0; i < cnt; i++)
            d[i] = cl->o.values == FL_FLOAT16 ? fl_f32_to_f16(x[i]) : fl_f32_to_bf16(x[i]);
        n = dense_frames(cl, sh, d, 2, cl->o.values, false, &h, frames);
    } else {
        n = dense_frames(cl, sh, g->dense + sh->offset, 4, FL_FLOAT32, cl->o.lz4 != 0, &h, frames);
    }
    h.nframes = (uint32_t)n;
    size_t sent = 0; /* the transport takes the frames */
    for (size_t f = 0; f < n; f++)
        sent += frames[f].len;
    fl_rel_add(&cl->inflight, (int64_t)n);
    rc = fl_tp_send(sh->sock, NULL, &h, n > 0 ? frames : NULL, n, deadline);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "rank %d: push to shard %u (%s)", cl->o.rank, sh->index, sh->host);
    cl->stats.bytes_sent += sent;
    cl->stats.raw_bytes += init != NULL ? 0 : raw;
    return FL_OK;
}

/* The pull behind a push asks for the parameters of the step after the one pushed. */
static int send_pull(fl_ps_client_t *cl, cl_shard_t *sh, uint64_t step, bool latest, uint64_t seq,
                     int64_t deadline)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_PULL, cl->o.rank);
    h.seq = seq;
    h.u.pull = (fl_msg_pull_t){sh->index,     sh->offset, sh->count,
                               step,          latest,     (uint32_t)cl->o.timeout_ms,
                               cl->o.lz4 != 0};
    int rc = fl_tp_send(sh->sock, NULL, &h, NULL, 0, deadline);
    return rc == FL_OK ? FL_OK
                       : fl_fail_ctx(rc, "rank %d: pull from shard %u (%s)", cl->o.rank, sh->index,
                                     sh->host);
}

/* What one exchange waits for and has got. */
typedef struct xchg {
    bool push, pull, latest;
    uint64_t seq;
    int acks, replies, want;
    bool *acked, *replied;
    uint64_t reply_step; /* the largest step the shards gave (latest pulls) */
} xchg_t;

/* Checks a reply and puts its parameters in place, piece by piece. */
static int take_reply(fl_ps_client_t *cl, cl_shard_t *sh, fl_tp_msg_t *m, float *params)
{
    const fl_msg_pull_reply_t *r = &m->hdr.u.pull_reply;
    uint64_t raw = sh->count * sizeof(float), got = 0;
    if (r->shard != sh->index || r->offset != sh->offset || r->count != sh->count || m->nframes < 1)
        return fl_fail(FL_EPROTO,
                       "rank %d: shard %u (%s) replied with parameters %" PRIu64 "+%" PRIu64
                       " of shard %u in %zu frames; expected %" PRIu64 "+%" PRIu64,
                       cl->o.rank, sh->index, sh->host, r->offset, r->count, r->shard, m->nframes,
                       sh->offset, sh->count);
    uint8_t *dst = (uint8_t *)(params + sh->offset);
    for (size_t f = 0; f < m->nframes; f++) {
        const fl_msg_frame_t *d = &m->hdr.frames[f];
        if (d->dtype != FL_FLOAT32 || d->raw_bytes > raw - got || d->raw_bytes % 4 != 0)
            return fl_fail(FL_EPROTO,
                           "rank %d: shard %u (%s) replied with a frame of %" PRIu64
                           " bytes past %" PRIu64 " of %" PRIu64,
                           cl->o.rank, sh->index, sh->host, d->raw_bytes, got, raw);
        if (d->codec == FL_CODEC_LZ4) {
            int rc = fl_cmp_lz4_decompress(fl_tp_msg_data(m, f), fl_tp_msg_size(m, f), dst + got,
                                           (size_t)d->raw_bytes);
            if (rc != FL_OK)
                return fl_fail_ctx(rc, "rank %d: reply of shard %u", cl->o.rank, sh->index);
        } else if (d->codec == FL_CODEC_RAW) {
            memcpy(dst + got, fl_tp_msg_data(m, f), (size_t)d->raw_bytes);
        } else {
            return fl_fail(FL_EPROTO, "rank %d: shard %u replied with codec %u", cl->o.rank,
                           sh->index, d->codec);
        }
        got += d->raw_bytes;
        cl->stats.bytes_recv += fl_tp_msg_size(m, f);
    }
    if (got != raw)
        return fl_fail(FL_EPROTO,
                       "rank %d: shard %u (%s) replied with %" PRIu64 " of %" PRIu64 " bytes",
                       cl->o.rank, sh->index, sh->host, got, raw);
    return FL_OK;
}

/* Handles one message from shard s. FL_OK, or the failure the exchange ends with. */
static int on_reply(fl_ps_client_t *cl, xchg_t *x, int s, fl_tp_msg_t *m, float *params)
{
    cl_shard_t *sh = &cl->shards[s];
    if (m->hdr.seq != x->seq)
        return FL_OK; /* the answer to an earlier exchange that failed: stale */
    switch (m->hdr.type) {
    case FL_MSG_ERROR: {
        int code = m->hdr.u.error.code < 0 ? m->hdr.u.error.code : FL_EPEER;
        return fl_fail(code, "rank %d: %s (%s)", cl->o.rank, m->hdr.u.error.text, sh->host);
    }
    case FL_MSG_PUSH_ACK:
        if (!x->push || x->acked[s])
            return FL_OK;
        x->acked[s] = true;
        x->acks++;
        return FL_OK;
    case FL_MSG_PULL_REPLY: {
        if (!x->pull || x->replied[s])
            return FL_OK;
        int rc = take_reply(cl, sh, m, params);
        if (rc != FL_OK)
            return fl_psc__break(cl, rc);
        if (m->hdr.u.pull_reply.step > x->reply_step)
            x->reply_step = m->hdr.u.pull_reply.step;
        x->replied[s] = true;
        x->replies++;
        return FL_OK;
    }
    default: return FL_OK;
    }
}

static int wait_released(fl_ps_client_t *cl, int64_t deadline)
{
    if (!fl_rel_wait(&cl->inflight, fl_deadline_left_ms(deadline)))
        return fl_fail(FL_ETIMEDOUT,
                       "rank %d: pushes still held by ZeroMQ at the "
                       "deadline",
                       cl->o.rank);
    return FL_OK;
}

/* Rank 0 asks for a checkpoint with the push that ends an interval. */
static bool checkpoint_mark_at(fl_ps_client_t *cl, uint64_t step)
{
    if (cl->o.rank != 0)
        return false;
    bool mark = cl->ckpt_every_steps > 0 && (step + 1) % cl->ckpt_every_steps == 0;
    int64_t now = fl_now_ms();
    if (cl->ckpt_every_ms > 0 && now - cl->last_mark_ms >= (int64_t)cl->ckpt_every_ms)
        mark = true;
    if (mark)
        cl->last_mark_ms = now;
    return mark;
}

bool fl_psc__checkpoint_mark(fl_ps_client_t *cl)
{
    fl_ps_client_t *p = cl->parent;
    if (p == NULL)
        return checkpoint_mark_at(cl, cl->step);
    /* A time-based mark read by each part on its own clock could fall on different steps for
     * different shards: the first part at a step decides for all (parts go step by step). */
    pthread_mutex_lock(&p->mark_mu);
    if (p->mark_step != cl->step) {
        p->mark_step = cl->step;
        p->mark_val = checkpoint_mark_at(p, cl->step);
    }
    bool mark = p->mark_val;
    pthread_mutex_unlock(&p->mark_mu);
    return mark;
}

static int check_grad(const fl_ps_client_t *cl, const fl_ps_grad_t *g)
{
    /* A NaN or Inf found by one shard after others took their part would leave the step half
     * pushed: nothing leaves before the whole gradient is known finite. */
    /* A part pushes its keys [lo, hi) only, and checks those. */
    if (g->batch > 0 && g->dense != NULL &&
        fl_f32_max_abs_bits(g->dense + cl->lo, (size_t)(cl->hi - cl->lo)) >= 0x7f800000u) {
        for (size_t i = (size_t)cl->lo; i < (size_t)cl->hi; i++)
            if (!isfinite(g->dense[i]))
                return fl_fail(FL_ENONFINITE,
                               "rank %d: the gradient of step %llu holds %s at "
                               "index %zu: nothing pushed",
                               cl->o.rank, (unsigned long long)cl->step,
                               isnan(g->dense[i]) ? "NaN" : "Inf", i);
    }
    if (g->batch > 0 && g->dense == NULL) {
        if (g->k > 0 && (g->idx == NULL || g->val == NULL))
            return fl_fail(FL_EINVAL, "rank %d: sparse gradient without indices or values",
                           cl->o.rank);
        int rc = fl_cmp_sparse_check(g->idx, g->k, (size_t)cl->n, cl->o.values);
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "rank %d: push", cl->o.rank);
        for (size_t i = 0; i < g->k; i++)
            if (!isfinite(g->val[i]))
                return fl_fail(FL_ENONFINITE,
                               "rank %d: the gradient of step %llu holds %s at "
                               "index %u: nothing pushed",
                               cl->o.rank, (unsigned long long)cl->step,
                               isnan(g->val[i]) ? "NaN" : "Inf", g->idx[i]);
    }
    return FL_OK;
}

/* The coordinator's socket this client listens to: its own; for part 0 its parent's (part 0
 * runs on the thread that owns the parent); none for the other parts. */
static fl_tp_sock_t *events_of(const fl_ps_client_t *cl)
{
    if (cl->parent == NULL)
        return cl->events;
    return cl->part == 0 ? cl->parent->events : NULL;
}

/* A part's view of the job: part 0 handles the parent's event. A failure stops every part of
 * the rank with it; a lost coordinator stops them with FL_ERESYNC: the caller destroys the
 * parts, rejoins with the parent (fl_ps_client_pull) and splits it again. */
static int part_event(fl_ps_client_t *cl)
{
    fl_ps_client_t *p = cl->parent;
    int rc = fl_psc__on_event(p);
    if (rc == FL_OK && !p->lost)
        return FL_OK;
    if (rc == FL_OK || rc == FL_ERESYNC) {
        snprintf(p->stop_text, sizeof p->stop_text,
                 "rank %d: the parameter server was lost: "
                 "rejoin it, then split again",
                 cl->o.rank);
        rc = FL_ERESYNC;
    } else {
        snprintf(p->stop_text, sizeof p->stop_text, "%s", fl_last_error());
    }
    p->stop_rc = rc;
    atomic_store(&p->parts_stop, 1);
    return fl_fail(rc, "%s", p->stop_text);
}

/* The rank's parts were stopped (part_event): why. */
static int part_stopped(const fl_ps_client_t *cl)
{
    const fl_ps_client_t *p = cl->parent;
    if (p == NULL || !atomic_load(&p->parts_stop))
        return FL_OK;
    return fl_fail(p->stop_rc, "%s", p->stop_text);
}

int fl_ps_client_part_listen(fl_ps_client_t *cl, int timeout_ms)
{
    int rc = part_stopped(cl);
    fl_tp_sock_t *ev = events_of(cl);
    if (rc != FL_OK || ev == NULL || cl->parent == NULL)
        return rc;
    bool ready = false;
    if (fl_tp_poll(&ev, 1, timeout_ms, &ready) > 0 && ready)
        return part_event(cl);
    return FL_OK;
}

/* The push (and pull behind it) to every shard that holds part of the model. */
static int send_requests(fl_ps_client_t *cl, const xchg_t *x, const fl_ps_grad_t *grad,
                         const float *init, bool mark, int64_t deadline)
{
    int rc = FL_OK;
    for (int s = 0; s < cl->nshards && rc == FL_OK; s++) {
        cl_shard_t *sh = &cl->shards[s];
        if (sh->count == 0)
            continue;
        if (x->push)
            rc = send_push(cl, sh, grad, init, mark, x->seq, deadline);
        if (rc == FL_OK && x->pull)
            rc = send_pull(cl, sh, cl->step + (grad != NULL ? 1 : 0), x->latest, x->seq, deadline);
    }
    return rc;
}

/* What an exchange waits on: the shards' sockets (which[i]: whose), then the coordinator's
 * events where this client listens to them. */
typedef struct waitset {
    fl_tp_sock_t **socks;
    int *which;
    bool *ready;
    int np;    /* shard sockets */
    int nwait; /* np, and one more with the events */
} waitset_t;

static int waitset_init(fl_ps_client_t *cl, waitset_t *w)
{
    int n = cl->nshards + 1;
    w->socks = calloc((size_t)n, sizeof *w->socks);
    w->which = calloc((size_t)n, sizeof *w->which);
    w->ready = calloc((size_t)n, sizeof *w->ready);
    if (w->socks == NULL || w->which == NULL || w->ready == NULL)
        return fl_fail(FL_ENOMEM, "rank %d: out of memory", cl->o.rank);
    w->np = 0;
    for (int s = 0; s < cl->nshards; s++)
        if (cl->shards[s].sock != NULL) {
            w->socks[w->np] = cl->shards[s].sock;
            w->which[w->np++] = s;
        }
    w->socks[w->np] = events_of(cl);
    w->nwait = w->socks[w->np] != NULL ? w->np + 1 : w->np;
    return FL_OK;
}

static void waitset_free(waitset_t *w)
{
    free(w->socks);
    free(w->which);
    free(w->ready);
}

static bool answered(const xchg_t *x)
{
    return (!x->push || x->acks >= x->want) && (!x->pull || x->replies >= x->want);
}

/* The deadline passed: names the first shard that did not answer. */
static int no_answer(const fl_ps_client_t *cl, const xchg_t *x)
{
    int s = 0;
    while (s < cl->nshards &&
           (cl->shards[s].count == 0 || ((!x->push || x->acked[s]) && (!x->pull || x->replied[s]))))
        s++;
    return fl_fail(FL_ETIMEDOUT,
                   "rank %d: no answer from shard %d (%s, %s) within %d ms "
                   "(%d of %d acks, %d of %d replies)",
                   cl->o.rank, s, s < cl->nshards ? cl->shards[s].host : "?",
                   s < cl->nshards ? cl->shards[s].endpoint : "?",
                   cl->o.timeout_ms + REPLY_MARGIN_MS, x->acks, x->push ? x->want : 0, x->replies,
                   x->pull ? x->want : 0);
}

/* What the coordinator's control thread posted: a part hands it to its siblings, a whole
 * client waits out a lost coordinator's successor. */
static int take_event(fl_ps_client_t *cl)
{
    if (cl->parent != NULL)
        return part_event(cl);
    int rc = fl_psc__on_event(cl);
    if (rc == FL_OK && cl->lost)
        rc = fl_psc__wait_rejoin(cl);
    return rc;
}

/* Every answer queued on the shard sockets the poll found ready. */
static int take_answers(fl_ps_client_t *cl, xchg_t *x, const waitset_t *w, float *params)
{
    int rc = FL_OK;
    for (int i = 0; i < w->np && rc == FL_OK; i++) {
        if (!w->ready[i])
            continue;
        fl_tp_msg_t m;
        while (rc == FL_OK) {
            int r = fl_tp_try_recv(w->socks[i], &m);
            if (r == FL_ETIMEDOUT)
                break;
            if (r != FL_OK)
                continue; /* refused and counted by the transport */
            rc = on_reply(cl, x, w->which[i], &m, params);
            fl_tp_msg_close(&m);
        }
    }
    return rc;
}

/* Waits for the acks and replies until the deadline. The time is read before each look, so
 * the last look comes at or after the deadline (a poll without a wait), and the answers it
 * finds are taken before the events and the siblings' news: answers that came in the last
 * slice end the exchange, neither a timeout nor a failure heard meanwhile (the next exchange
 * hears that). */
static int collect(fl_ps_client_t *cl, xchg_t *x, waitset_t *w, float *params, int64_t deadline)
{
    while (!answered(x)) {
        int left = fl_deadline_left_ms(deadline);
        /* Parts look at their siblings' news between slices of the wait. */
        int got = fl_tp_poll(w->socks, (size_t)w->nwait,
                             cl->parent != NULL && left > 200 ? 200 : left, w->ready);
        if (got < 0)
            return got;
        int rc = take_answers(cl, x, w, params);
        if (rc != FL_OK || answered(x))
            return rc;
        if ((rc = part_stopped(cl)) != FL_OK)
            return rc;
        if (w->socks[w->np] != NULL && w->ready[w->np] && (rc = take_event(cl)) != FL_OK)
            return rc;
        if (left == 0)
            return no_answer(cl, x);
    }
    return FL_OK;
}

/* Sends the requests and collects the answers. */
static int run(fl_ps_client_t *cl, xchg_t *x, const fl_ps_grad_t *grad, const float *init,
               float *params)
{
    int64_t deadline = fl_deadline_in(cl->o.timeout_ms + REPLY_MARGIN_MS);
    bool mark = grad != NULL && fl_psc__checkpoint_mark(cl);
    /* What the heartbeats say this rank is doing (the coordinator names it should the rank
     * die): the call and its step. */
    atomic_store(&cl->status->seq, (uint64_t)cl->step);
    atomic_store(&cl->status->op, x->push && x->pull ? FL_MSG_OP_PUSH_PULL
                                  : x->push          ? FL_MSG_OP_PUSH
                                                     : FL_MSG_OP_PULL);
    int rc = send_requests(cl, x, grad, init, mark, deadline);
    if (rc == FL_OK) {
        waitset_t w = {0};
        if ((rc = waitset_init(cl, &w)) == FL_OK)
            rc = collect(cl, x, &w, params, deadline);
        waitset_free(&w);
    }
    atomic_store(&cl->status->op, FL_MSG_OP_NONE);
    return rc;
}

int fl_psc__exchange(fl_ps_client_t *cl, const fl_ps_grad_t *grad, bool init, float *params,
                     bool latest)
{
    if (cl->broken_rc != FL_OK)
        return fl_fail(FL_ECLOSED,
                       "rank %d: parameter-server client broken by an earlier "
                       "failure: %s",
                       cl->o.rank, cl->broken_text);
    /* What happened while the caller computed. */
    bool ready = false;
    fl_tp_sock_t *ev = events_of(cl);
    while (ev != NULL && fl_tp_poll(&ev, 1, 0, &ready) > 0 && ready) {
        int rc = take_event(cl);
        if (rc != FL_OK)
            return rc;
        ready = false;
    }
    int rc = part_stopped(cl);
    if (rc != FL_OK)
        return rc;
    if (grad != NULL && (rc = check_grad(cl, grad)) != FL_OK)
        return rc;
    int64_t t0 = fl_now_ns();
    xchg_t x;
    memset(&x, 0, sizeof x);
    x.push = grad != NULL || (init && params != NULL);
    x.pull = params != NULL;
    x.latest = latest;
    x.seq = ++cl->seq;
    for (int s = 0; s < cl->nshards; s++)
        x.want += cl->shards[s].count > 0;
    x.acked = calloc((size_t)cl->nshards, sizeof *x.acked);
    x.replied = calloc((size_t)cl->nshards, sizeof *x.replied);
    if (x.acked == NULL || x.replied == NULL) {
        rc = fl_fail(FL_ENOMEM, "rank %d: out of memory", cl->o.rank);
    } else {
        rc = run(cl, &x, grad, init && params != NULL ? params : NULL, params);
        if (rc != FL_OK && rc != FL_ERESYNC && cl->broken_rc == FL_OK) {
            /* Whatever is queued or still coming belongs to this failed exchange. */
            char detail[1024];
            snprintf(detail, sizeof detail, "%s", fl_last_error());
            if (fl_psc__reset_shards(cl) != FL_OK)
                fl_psc__break(cl, FL_EIO);
            fl_fail(rc, "%s", detail);
        }
        /* The caller's buffers are free to reuse only once ZeroMQ let go of them. A part that
         * lost the parameter server leaves its queued pushes to its destruction, which drops
         * them (they sit on the parent's connections to the lost server: waiting here for them
         * would time out and turn the rejoin into a failure). */
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", fl_last_error());
        int wr = rc == FL_ERESYNC && cl->parent != NULL
                     ? FL_OK
                     : wait_released(cl, fl_deadline_in(rc == FL_OK ? cl->o.timeout_ms : 5000));
        if (wr != FL_OK)
            rc = fl_psc__break(cl, wr);
        else if (rc != FL_OK)
            fl_fail(rc, "%s", detail);
    }
    free(x.acked);
    free(x.replied);
    /* Every shard took the push: the step is done even when the pull behind it failed (an
     * SSP bound that held past the deadline), so a retried pull asks for the next step. */
    if (grad != NULL && (x.want > 0 || cl->parent != NULL) && x.acks == x.want &&
        rc != FL_ERESYNC) {
        cl->step++;
        cl->stats.pushes++;
    }
    if (rc != FL_OK)
        return rc;
    if (x.pull) {
        cl->stats.pulls++;
        if (latest)
            cl->step = x.reply_step;
    }
    cl->stats.wait_ms += (double)(fl_now_ns() - t0) / 1e6;
    return FL_OK;
}
