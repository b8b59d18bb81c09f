/* A shard's protocol: pushes (rank 0's initial parameters, gradients dense or sparse), pulls
 * answered at once or held until the consistency model allows them (or their deadline), and
 * the replies, sent without copying the parameters (a reference keeps them alive until ZeroMQ
 * is done; an update meanwhile works on a copy). Every refusal is an error reply naming the
 * problem, counted, and changes nothing; the shard keeps serving the others. */
#include "ps_shard_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_route(const fl_tp_route_t *a, const fl_tp_route_t *b)
{
    return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

static void params_release(void *data, void *hint)
{
    (void)data;
    fl_ps__params_unref(hint);
}

void fl_ps__lz4_release(void *data, void *hint)
{
    (void)data;
    ps_lz4_t *z = hint;
    if (atomic_fetch_sub(&z->refs, 1) == 1) {
        for (int c = 0; c < z->npieces; c++)
            free(z->data[c]);
        free(z);
    }
}

/* A push whose memory the state holds: the message (when the source points into its frame)
 * and what decoding allocated. */
typedef struct hold {
    fl_tp_msg_t *msg;
    void *owned;
} hold_t;

static void hold_release(void *ud)
{
    hold_t *h = ud;
    if (h->msg != NULL) {
        fl_tp_msg_close(h->msg);
        free(h->msg);
    }
    free(h->owned);
    free(h);
}

void fl_ps__shard_on_refused(ps_shard_t *sh)
{
    fl_tp_msg_t *m = sh->rx;
    sh->reply_seq = m->hdr.seq;
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", fl_last_error());
    atomic_fetch_add(&sh->n_refused, 1);
    if (m->route.len == 0)
        return;
    fl_ps__shard_error(sh, &m->route, FL_EPROTO, m->hdr.sender,
                       "refused a message from rank %d: %s", m->hdr.sender, detail);
}

/* The lz4 encoding of the current version, piece by piece, made once and shared by the
 * replies of that version. */
static ps_lz4_t *current_lz4(ps_shard_t *sh)
{
    uint64_t v = fl_ps__state_version(sh->state);
    if (sh->lz4 != NULL && sh->lz4->version == v)
        return sh->lz4;
    if (sh->lz4 != NULL)
        fl_ps__lz4_release(NULL, sh->lz4);
    sh->lz4 = calloc(1, sizeof *sh->lz4);
    if (sh->lz4 == NULL)
        return NULL;
    atomic_init(&sh->lz4->refs, 1);
    sh->lz4->version = v;
    const float *p = fl_ps__params_data(fl_ps__state_params(sh->state));
    uint64_t count = sh->conf.count, piece = fl_msg_ps_piece(count);
    for (uint64_t at = 0; at < count; at += piece) {
        int c = sh->lz4->npieces++;
        uint64_t n = count - at < piece ? count - at : piece;
        if (fl_ps__payload_lz4(p + at, n, &sh->lz4->data[c], &sh->lz4->len[c]) != FL_OK)
            sh->lz4->data[c] = NULL; /* out of memory: this piece goes raw */
    }
    return sh->lz4;
}

/* The parameters go in pieces of fl_msg_ps_piece, each without a copy (a reference keeps the
 * version alive until ZeroMQ is done), or lz4-encoded when asked and when that shrinks it. */
static void reply(ps_shard_t *sh, const fl_tp_route_t *to, int rank, bool lz4)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_PULL_REPLY, FL_MSG_SENDER_SERVER);
    h.seq = sh->reply_seq;
    h.u.pull_reply.shard = sh->index;
    h.u.pull_reply.offset = sh->conf.offset;
    h.u.pull_reply.count = sh->conf.count;
    h.u.pull_reply.version = fl_ps__state_version(sh->state);
    h.u.pull_reply.step = fl_ps__state_clock(sh->state, rank);
    h.u.pull_reply.min_step = fl_ps__state_min_clock(sh->state);
    uint64_t count = sh->conf.count, piece = fl_msg_ps_piece(count);
    fl_buf_t frames[FL_MSG_MAX_FRAMES];
    ps_lz4_t *z = lz4 && count > 0 ? current_lz4(sh) : NULL;
    ps_params_t *p = fl_ps__state_params(sh->state);
    size_t n = 0;
    for (uint64_t at = 0; at < count || n == 0; at += piece) {
        uint64_t len = count - at < piece ? count - at : piece;
        size_t raw = (size_t)len * sizeof(float);
        if (z != NULL && z->data[n] != NULL) {
            atomic_fetch_add(&z->refs, 1);
            frames[n] = (fl_buf_t){z->data[n], z->len[n], z, fl_ps__lz4_release};
            h.frames[n] = (fl_msg_frame_t){z->len[n], FL_FLOAT32, FL_CODEC_LZ4, raw};
        } else {
            fl_ps__params_ref(p);
            frames[n] = (fl_buf_t){(void *)(fl_ps__params_data(p) + at), raw, p, params_release};
            h.frames[n] = (fl_msg_frame_t){raw, FL_FLOAT32, FL_CODEC_RAW, raw};
        }
        n++;
        if (count == 0)
            break;
    }
    h.nframes = (uint32_t)n;
    int rc = fl_tp_send(sh->sock, to, &h, frames, n, fl_deadline_in(0));
    if (rc != FL_OK) {
        char who[FL_HOST_MAX + 32];
        FL_WARN(sh->ctx, "shard %u: reply to %s lost: %s", sh->index,
                fl_ps__shard_rank_name(sh, rank, who, sizeof who), fl_last_error());
        return;
    }
    atomic_fetch_add(&sh->n_pull, 1);
}

static void ack(ps_shard_t *sh, const fl_tp_route_t *to, uint64_t step, bool ignored)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_PUSH_ACK, FL_MSG_SENDER_SERVER);
    h.seq = sh->reply_seq;
    h.u.push_ack.shard = sh->index;
    h.u.push_ack.step = step;
    h.u.push_ack.version = fl_ps__state_version(sh->state);
    h.u.push_ack.ignored = ignored;
    if (fl_tp_send(sh->sock, to, &h, NULL, 0, fl_deadline_in(0)) != FL_OK)
        FL_WARN(sh->ctx, "shard %u: ack lost: %s", sh->index, fl_last_error());
}

/* The payload of a push message as a source (fl_ps__payload_decode over its frames). */
static int decode(ps_shard_t *sh, fl_tp_msg_t *m, ps_src_t *src, void **owned)
{
    const void *data[FL_MSG_MAX_FRAMES];
    size_t bytes[FL_MSG_MAX_FRAMES];
    for (size_t f = 0; f < m->nframes; f++) {
        data[f] = fl_tp_msg_data(m, f);
        bytes[f] = fl_tp_msg_size(m, f);
    }
    return fl_ps__payload_decode(sh->ws, data, bytes, m->hdr.frames, m->nframes, sh->conf.count,
                                 src, owned);
}

/* The range a message names must be this shard's, as the shard map says. */
static bool range_ok(ps_shard_t *sh, fl_tp_msg_t *m, uint32_t shard, uint64_t off, uint64_t count,
                     int rank)
{
    if (shard == sh->index && off == sh->conf.offset && count == sh->conf.count)
        return true;
    fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                       "%s from rank %d names shard %u, parameters %" PRIu64 "+%" PRIu64
                       "; this is shard %u with parameters %" PRIu64 "+%" PRIu64
                       " (is the rank using another shard map?)",
                       fl_msg_type_name(m->hdr.type), rank, shard, off, count, sh->index,
                       sh->conf.offset, sh->conf.count);
    return false;
}

static void maybe_checkpoint(ps_shard_t *sh)
{
    if (sh->ckpt_due == 0)
        return;
    uint64_t done = sh->conf.state.consistency == FL_PS_SYNC ? fl_ps__state_min_clock(sh->state)
                                                             : fl_ps__state_clock(sh->state, 0);
    if (done < sh->ckpt_due)
        return;
    fl_ps__shard_checkpoint(sh, sh->ckpt_due);
    sh->ckpt_due = 0;
}

static void on_init(ps_shard_t *sh, fl_tp_msg_t *m, int rank)
{
    if (rank != 0) {
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                           "rank %d pushed initial parameters; only rank 0 does", rank);
        return;
    }
    if (fl_ps__state_ready(sh->state)) {
        ack(sh, &m->route, 0, true); /* --init, a checkpoint or an earlier push won */
        return;
    }
    if (m->nframes < 1 || m->hdr.frames[0].dtype != FL_FLOAT32 ||
        m->hdr.frames[0].codec == FL_CODEC_SPARSE) {
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                           "initial parameters must be dense float32");
        return;
    }
    ps_src_t src;
    void *owned = NULL;
    int rc = decode(sh, m, &src, &owned);
    float *flat = NULL;
    if (rc == FL_OK && src.chunk_elems != 0) {
        /* In pieces: the state takes one contiguous vector. */
        flat = malloc(sh->conf.count > 0 ? (size_t)sh->conf.count * sizeof(float) : 1);
        if (flat == NULL)
            rc = fl_fail(FL_ENOMEM, "out of memory for the initial parameters");
        for (uint64_t at = 0; flat != NULL && at < sh->conf.count; at += src.chunk_elems) {
            uint64_t n =
                sh->conf.count - at < src.chunk_elems ? sh->conf.count - at : src.chunk_elems;
            memcpy(flat + at, ps_src_at(&src, at, 4), (size_t)n * sizeof(float));
        }
    }
    if (rc == FL_OK)
        rc = fl_ps__state_init(sh->state, flat != NULL ? flat : src.dense, m->hdr.u.push.step);
    free(flat);
    free(owned);
    if (rc != FL_OK) {
        fl_ps__shard_error(sh, &m->route, rc, rank, "initial parameters refused: %s",
                           fl_last_error());
        return;
    }
    FL_INFO(sh->ctx, "shard %u: initial parameters from rank 0", sh->index);
    ack(sh, &m->route, m->hdr.u.push.step, false);
}

static void on_gradient(ps_shard_t *sh, fl_tp_msg_t *m, int rank)
{
    const fl_msg_push_t *p = &m->hdr.u.push;
    char why[FL_MSG_TEXT_MAX];
    int ck = fl_ps__state_check_push(sh->state, rank, p->step, why, sizeof why);
    if (ck == PS_PUSH_DUPLICATE) {
        ack(sh, &m->route, p->step, true); /* a retry of a push already taken */
        return;
    }
    if (ck != FL_OK) {
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank, "push refused: %s", why);
        return;
    }
    ps_src_t src;
    void *owned = NULL;
    if (p->batch == 0) {
        if (m->nframes != 0) {
            fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                               "a push that skips its step (batch 0) carries no gradient");
            return;
        }
        memset(&src, 0, sizeof src);
    } else {
        int rc = decode(sh, m, &src, &owned);
        if (rc != FL_OK) {
            fl_ps__shard_error(sh, &m->route, rc == FL_ENONFINITE ? rc : FL_EINVAL, rank,
                               "gradient of step %" PRIu64 " from rank %d refused: %s", p->step,
                               rank, fl_last_error());
            return;
        }
    }
    src.batch = p->batch;
    /* The state may keep the source (sync): it keeps the memory with it. */
    hold_t *h = calloc(1, sizeof *h);
    if (h == NULL) {
        free(owned);
        fl_ps__shard_error(sh, &m->route, FL_ENOMEM, rank, "out of memory");
        return;
    }
    h->owned = owned;
    if (src.kind != PS_SRC_SPARSE && owned == NULL && p->batch > 0) {
        h->msg = sh->rx; /* the source points into this message's frame */
        sh->rx = NULL;
    }
    src.release = hold_release;
    src.ud = h;
    uint64_t step = p->step;
    bool want_ckpt = p->checkpoint && rank == 0;
    const fl_tp_route_t route = m->route;
    bool updated = false;
    int rc = fl_ps__state_push(sh->state, rank, step, &src, &updated);
    atomic_fetch_add(&sh->n_push, 1);
    if (rc != FL_OK) /* taken, but the update was skipped (overflow, no memory): said loudly */
        FL_ERROR(sh->ctx, "shard %u: %s", sh->index, fl_last_error());
    ack(sh, &route, step, rc != FL_OK);
    if (want_ckpt)
        sh->ckpt_due = step + 1;
    if (updated || want_ckpt)
        maybe_checkpoint(sh);
}

static void on_push(ps_shard_t *sh, fl_tp_msg_t *m, int rank)
{
    const fl_msg_push_t *p = &m->hdr.u.push;
    if (!range_ok(sh, m, p->shard, p->offset, p->count, rank))
        return;
    if (p->kind == FL_PUSH_INIT)
        on_init(sh, m, rank);
    else
        on_gradient(sh, m, rank);
}

static int add_pending(ps_shard_t *sh, const fl_tp_route_t *to, int rank, const fl_msg_pull_t *p)
{
    size_t cap = 4 * (size_t)sh->conf.state.world;
    if (sh->npending >= cap)
        return fl_fail(FL_EINVAL, "%zu pulls are waiting already", sh->npending);
    if (sh->npending == sh->pending_cap) {
        size_t nc = sh->pending_cap ? sh->pending_cap * 2 : 8;
        ps_pending_t *np = realloc(sh->pending, nc * sizeof *np);
        if (np == NULL)
            return fl_fail(FL_ENOMEM, "out of memory for a waiting pull");
        sh->pending = np;
        sh->pending_cap = nc;
    }
    uint32_t wait = p->wait_ms;
    if (sh->conf.max_wait_ms > 0 && wait > (uint32_t)sh->conf.max_wait_ms)
        wait = (uint32_t)sh->conf.max_wait_ms;
    int64_t now = fl_now_ms();
    sh->pending[sh->npending++] =
        (ps_pending_t){*to, sh->reply_seq, rank, p->step, p->latest, p->lz4, now + wait, now};
    return FL_OK;
}

static void on_pull(ps_shard_t *sh, fl_tp_msg_t *m, int rank)
{
    const fl_msg_pull_t *p = &m->hdr.u.pull;
    if (!range_ok(sh, m, p->shard, p->offset, p->count, rank))
        return;
    if (m->nframes != 0) {
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank, "a pull carries no payload");
        return;
    }
    int blocker;
    uint64_t bstep;
    char why[FL_MSG_TEXT_MAX];
    int rc = fl_ps__state_check_pull(sh->state, rank, p->step, p->latest, &blocker, &bstep, why,
                                     sizeof why);
    if (rc == FL_OK) {
        reply(sh, &m->route, rank, p->lz4);
        return;
    }
    if (rc != FL_ETIMEDOUT) {
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank, "pull refused: %s", why);
        return;
    }
    if ((rc = add_pending(sh, &m->route, rank, p)) != FL_OK)
        fl_ps__shard_error(sh, &m->route, rc, rank, "pull refused: %s", fl_last_error());
}

void fl_ps__shard_on_message(ps_shard_t *sh)
{
    fl_tp_msg_t *m = sh->rx;
    int rank = m->hdr.sender;
    int world = sh->conf.state.world;
    sh->reply_seq = m->hdr.seq;
    if (rank < 0 || rank >= world) {
        fl_ctx_count(sh->ctx, FL_STAT_UNEXPECTED, 1);
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                           "%s from rank %d, which is not a rank of this job (0..%d)",
                           fl_msg_type_name(m->hdr.type), rank, world - 1);
    } else if (m->peer_bound != FL_TP_KEY_ANY && m->peer_bound != rank) {
        /* With per-rank keys a connection speaks for the rank of its key alone. */
        fl_ctx_count(sh->ctx, FL_STAT_AUTH_REFUSED, 1);
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                           "%s claiming rank %d came with the client key of another member",
                           fl_msg_type_name(m->hdr.type), rank);
    } else if (sh->route_known[rank] && !same_route(&sh->routes[rank], &m->route)) {
        fl_ctx_count(sh->ctx, FL_STAT_UNEXPECTED, 1);
        fl_ps__shard_error(sh, &m->route, FL_EINVAL, rank,
                           "%s claiming rank %d from another connection than rank %d's: two "
                           "processes run as rank %d?",
                           fl_msg_type_name(m->hdr.type), rank, rank, rank);
    } else if (sh->failed[0] != '\0') {
        fl_ps__shard_error(sh, &m->route, sh->failed_code, rank, "%s", sh->failed);
    } else {
        sh->routes[rank] = m->route;
        sh->route_known[rank] = true;
        switch (m->hdr.type) {
        case FL_MSG_PUSH: on_push(sh, m, rank); break;
        case FL_MSG_PULL: on_pull(sh, m, rank); break;
        default:
            fl_ctx_count(sh->ctx, FL_STAT_UNEXPECTED, 1);
            fl_ps__shard_error(sh, &m->route, FL_EPROTO, rank, "unexpected %s message",
                               fl_msg_type_name(m->hdr.type));
        }
    }
    if (sh->rx != NULL)
        fl_tp_msg_close(sh->rx);
}

static void timed_out(ps_shard_t *sh, const ps_pending_t *q, int64_t now)
{
    char who[FL_HOST_MAX + 32], slow[FL_HOST_MAX + 32];
    int blocker;
    uint64_t bstep;
    char why[FL_MSG_TEXT_MAX];
    fl_ps__state_check_pull(sh->state, q->rank, q->step, q->latest, &blocker, &bstep, why,
                            sizeof why);
    fl_ps__shard_rank_name(sh, q->rank, who, sizeof who);
    fl_ps__shard_rank_name(sh, blocker, slow, sizeof slow);
    atomic_fetch_add(&sh->n_timeouts, 1);
    if (!fl_ps__state_ready(sh->state)) {
        fl_ps__shard_error(sh, &q->route, FL_ETIMEDOUT, 0,
                           "no parameters after %lld ms: waiting for %s to push its initial "
                           "parameters",
                           (long long)(now - q->since), slow);
        return;
    }
    fl_ps__shard_error(sh, &q->route, FL_ETIMEDOUT, blocker,
                       "the parameters of step %" PRIu64 " for %s not ready after %lld ms: "
                       "waiting for %s, which has completed %" PRIu64 " steps (%s%s)",
                       q->step, who, (long long)(now - q->since), slow, bstep,
                       fl_ps_consistency_name(sh->conf.state.consistency),
                       sh->conf.state.consistency == FL_PS_SSP ? ", staleness bound applies" : "");
}

void fl_ps__shard_serve_pending(ps_shard_t *sh, int64_t now)
{
    size_t keep = 0;
    for (size_t i = 0; i < sh->npending; i++) {
        ps_pending_t q = sh->pending[i];
        sh->reply_seq = q.seq;
        int blocker;
        uint64_t bstep;
        char why[FL_MSG_TEXT_MAX];
        int rc = fl_ps__state_check_pull(sh->state, q.rank, q.step, q.latest, &blocker, &bstep, why,
                                         sizeof why);
        if (rc == FL_OK)
            reply(sh, &q.route, q.rank, q.lz4);
        else if (rc != FL_ETIMEDOUT)
            fl_ps__shard_error(sh, &q.route, FL_EINVAL, q.rank, "pull refused: %s", why);
        else if (now >= q.deadline)
            timed_out(sh, &q, now);
        else
            sh->pending[keep++] = q;
    }
    sh->npending = keep;
}

void fl_ps__shard_fail_pending(ps_shard_t *sh)
{
    for (size_t i = 0; i < sh->npending; i++) {
        sh->reply_seq = sh->pending[i].seq;
        fl_ps__shard_error(sh, &sh->pending[i].route, sh->failed_code, sh->pending[i].rank, "%s",
                           sh->failed);
    }
    sh->npending = 0;
}

int64_t fl_ps__shard_next_deadline(const ps_shard_t *sh)
{
    int64_t next = INT64_MAX;
    for (size_t i = 0; i < sh->npending; i++)
        next = sh->pending[i].deadline < next ? sh->pending[i].deadline : next;
    return next;
}
