/* Encoding: fl_msg_hdr_t -> protobuf-c structs -> bytes in memory the caller hands out.
 * Bounds are checked here too, so a sender fails loudly instead of emitting a header that
 * every receiver would refuse; free text is escaped rather than refused (fl_msg_encode). */
#include "fl_msg.h"
#include "msg_int.h"

#include <stdlib.h>
#include <string.h>

static int check_str(const char *what, const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    if (n >= cap)
        return fl_fail(FL_EINVAL, "encode: %s is not terminated within %zu bytes", what, cap);
    const char *why;
    size_t at = fl_text_scan(s, n, &why);
    if (at != n)
        return fl_fail(FL_EINVAL, "encode: %s has %s at byte %zu of %zu", what, why, at, n);
    return FL_OK;
}

/* Free text: terminated within cap (a bound, as for identifiers), then escaped into out (cap
 * bytes) when it is not wire text. */
static int escape_text(const char *what, const char *s, size_t cap, char *out, char **dst)
{
    if (strnlen(s, cap) >= cap)
        return fl_fail(FL_EINVAL, "encode: %s is not terminated within %zu bytes", what, cap);
    *dst = (char *)fl_text_escape(s, out, cap);
    return FL_OK;
}

static int fill_endpoints(char **dst, const char (*src)[FL_ENDPOINT_MAX], uint32_t n)
{
    if (n > FL_MSG_MAX_STRIPES)
        return fl_fail(FL_EINVAL, "encode: %u endpoints, at most %d", n, FL_MSG_MAX_STRIPES);
    for (uint32_t i = 0; i < n; i++) {
        int rc = check_str("endpoint", src[i], FL_ENDPOINT_MAX);
        if (rc != FL_OK)
            return rc;
        dst[i] = (char *)src[i];
    }
    return FL_OK;
}

/* Everything the protobuf-c view of one header points at, so encode needs one allocation at
 * most (the welcome peer table). */
typedef struct pb_view {
    Flodl__Header h;
    Flodl__FrameDesc frame_store[FL_MSG_MAX_FRAMES];
    Flodl__FrameDesc *frames[FL_MSG_MAX_FRAMES];
    Flodl__Register reg;
    char *reg_eps[FL_MSG_MAX_STRIPES];
    char **reg_shard_eps;
    Flodl__Welcome welcome;
    Flodl__Peer *peer_store;
    Flodl__Peer **peers;
    char **peer_eps;
    Flodl__Shard *shard_store;
    Flodl__Shard **shards;
    char text[FL_MSG_TEXT_MAX];       /* an error's or a goodbye's text, escaped */
    char missing[FL_MSG_MISSING_MAX]; /* a heartbeat's missing ranks, escaped */
    Flodl__Barrier barrier;
    Flodl__Heartbeat heartbeat;
    Flodl__Error error;
    Flodl__Shutdown shutdown;
    Flodl__Chunk chunk;
    Flodl__Push push;
    Flodl__PushAck push_ack;
    Flodl__Pull pull;
    Flodl__PullReply pull_reply;
} pb_view_t;

static int build_shards(pb_view_t *v, const fl_msg_welcome_t *w)
{
    int rc;
    if (w->nshards > FL_MSG_MAX_SHARDS)
        return fl_fail(FL_EINVAL, "encode: %u shards, at most %d", w->nshards,
                       FL_MSG_MAX_SHARDS);
    if (w->nshards > 0) {
        v->shard_store = calloc(w->nshards, sizeof *v->shard_store);
        v->shards = calloc(w->nshards, sizeof *v->shards);
        if (v->shard_store == NULL || v->shards == NULL)
            return fl_fail(FL_ENOMEM, "encode: out of memory for %u shards", w->nshards);
    }
    for (uint32_t i = 0; i < w->nshards; i++) {
        const fl_msg_shard_t *p = &w->shards[i];
        Flodl__Shard *q = &v->shard_store[i];
        flodl__shard__init(q);
        q->index = p->index;
        q->offset = p->offset;
        q->count = p->count;
        if ((rc = check_str("shard endpoint", p->endpoint, FL_ENDPOINT_MAX)) != FL_OK ||
            (rc = check_str("shard host", p->host, FL_HOST_MAX)) != FL_OK)
            return rc;
        q->endpoint = (char *)p->endpoint;
        q->host = (char *)p->host;
        v->shards[i] = q;
    }
    v->welcome.n_shards = w->nshards;
    v->welcome.shards = v->shards;
    return FL_OK;
}

static int build_welcome(pb_view_t *v, const fl_msg_welcome_t *w)
{
    int rc;
    flodl__welcome__init(&v->welcome);
    if (w->npeers > FL_MSG_MAX_PEERS)
        return fl_fail(FL_EINVAL, "encode: %u peers, at most %d", w->npeers, FL_MSG_MAX_PEERS);
    if (w->npeers > 0) {
        v->peer_store = calloc(w->npeers, sizeof *v->peer_store);
        v->peers = calloc(w->npeers, sizeof *v->peers);
        v->peer_eps = calloc((size_t)w->npeers * FL_MSG_MAX_STRIPES, sizeof *v->peer_eps);
        if (v->peer_store == NULL || v->peers == NULL || v->peer_eps == NULL)
            return fl_fail(FL_ENOMEM, "encode: out of memory for %u peers", w->npeers);
    }
    for (uint32_t i = 0; i < w->npeers; i++) {
        const fl_msg_peer_t *p = &w->peers[i];
        Flodl__Peer *q = &v->peer_store[i];
        flodl__peer__init(q);
        q->rank = p->rank;
        if ((rc = check_str("peer host", p->host, FL_HOST_MAX)) != FL_OK)
            return rc;
        q->host = (char *)p->host;
        char **eps = &v->peer_eps[(size_t)i * FL_MSG_MAX_STRIPES];
        if ((rc = fill_endpoints(eps, p->endpoints, p->nendpoints)) != FL_OK)
            return rc;
        q->n_endpoints = p->nendpoints;
        q->endpoints = eps;
        q->pid = p->pid;
        v->peers[i] = q;
    }
    v->welcome.n_peers = w->npeers;
    v->welcome.peers = v->peers;
    v->welcome.heartbeat_ms = w->heartbeat_ms;
    v->welcome.heartbeat_timeout_ms = w->heartbeat_timeout_ms;
    if ((rc = build_shards(v, w)) != FL_OK)
        return rc;
    v->welcome.param_count = w->param_count;
    v->welcome.consistency = (Flodl__Consistency)w->consistency;
    v->welcome.staleness = w->staleness;
    v->welcome.resume = w->resume;
    v->welcome.resume_step = w->resume_step;
    v->welcome.checkpoint_every_steps = w->ckpt_every_steps;
    v->welcome.checkpoint_every_ms = w->ckpt_every_ms;
    v->h.welcome = &v->welcome;
    return FL_OK;
}

static int build_register(pb_view_t *v, const fl_msg_register_t *r)
{
    int rc;
    flodl__register__init(&v->reg);
    v->reg.rank = r->rank;
    v->reg.world_size = r->world_size;
    if ((rc = check_str("host", r->host, FL_HOST_MAX)) != FL_OK)
        return rc;
    v->reg.host = (char *)r->host;
    if ((rc = fill_endpoints(v->reg_eps, r->endpoints, r->nendpoints)) != FL_OK)
        return rc;
    v->reg.n_endpoints = r->nendpoints;
    v->reg.endpoints = v->reg_eps;
    v->reg.pid = r->pid;
    v->reg.model_signature = r->model_signature;
    if ((rc = check_str("tuning", r->tuning, FL_MSG_TUNING_MAX)) != FL_OK)
        return rc;
    v->reg.tuning = (char *)r->tuning;
    if ((rc = check_str("settings", r->settings, FL_MSG_SETTINGS_MAX)) != FL_OK ||
        (rc = fl_settings_check(r->settings, FL_MSG_SETTINGS_MAX)) != FL_OK)
        return rc;
    v->reg.settings = (char *)r->settings;
    if ((rc = check_str("model shapes", r->model_shapes, FL_MODEL_SHAPES_MAX)) != FL_OK)
        return rc;
    v->reg.model_shapes = (char *)r->model_shapes;
    v->reg.role = (Flodl__Role)r->role;
    v->reg.param_count = r->param_count;
    v->reg.shard_count = r->shard_count;
    v->reg.num_shards = r->num_shards;
    if (r->nshard_eps > FL_MSG_MAX_SHARDS)
        return fl_fail(FL_EINVAL, "encode: %u shard endpoints, at most %d", r->nshard_eps,
                       FL_MSG_MAX_SHARDS);
    if (r->nshard_eps > 0) {
        v->reg_shard_eps = calloc(r->nshard_eps, sizeof *v->reg_shard_eps);
        if (v->reg_shard_eps == NULL)
            return fl_fail(FL_ENOMEM, "encode: out of memory for %u endpoints", r->nshard_eps);
    }
    for (uint32_t i = 0; i < r->nshard_eps; i++) {
        if ((rc = check_str("shard endpoint", r->shard_eps[i], FL_ENDPOINT_MAX)) != FL_OK)
            return rc;
        v->reg_shard_eps[i] = (char *)r->shard_eps[i];
    }
    v->reg.n_shard_endpoints = r->nshard_eps;
    v->reg.shard_endpoints = v->reg_shard_eps;
    if (r->ncheckpoints > FL_MSG_MAX_CHECKPOINTS)
        return fl_fail(FL_EINVAL, "encode: %u checkpoints, at most %d", r->ncheckpoints,
                       FL_MSG_MAX_CHECKPOINTS);
    v->reg.n_checkpoints = r->ncheckpoints;
    v->reg.checkpoints = (uint64_t *)r->checkpoints;
    v->reg.consistency = (Flodl__Consistency)r->consistency;
    v->reg.staleness = r->staleness;
    v->reg.checkpoint_every_steps = r->ckpt_every_steps;
    v->reg.checkpoint_every_ms = r->ckpt_every_ms;
    v->h.reg = &v->reg;
    return FL_OK;
}

static int build_body(pb_view_t *v, const fl_msg_hdr_t *m)
{
    int rc;
    switch (m->type) {
    case FL_MSG_REGISTER:
        return build_register(v, &m->u.reg);
    case FL_MSG_WELCOME:
        return build_welcome(v, &m->u.welcome);
    case FL_MSG_BARRIER:
        flodl__barrier__init(&v->barrier);
        v->barrier.id = m->u.barrier.id;
        v->barrier.round = m->u.barrier.round;
        v->h.barrier = &v->barrier;
        return FL_OK;
    case FL_MSG_HEARTBEAT:
        flodl__heartbeat__init(&v->heartbeat);
        v->heartbeat.op = m->u.heartbeat.op;
        v->heartbeat.op_seq = m->u.heartbeat.op_seq;
        v->heartbeat.op_step = m->u.heartbeat.op_step;
        v->heartbeat.waiting_on = m->u.heartbeat.waiting_on;
        v->heartbeat.registered = m->u.heartbeat.registered;
        if ((rc = escape_text("missing", m->u.heartbeat.missing, FL_MSG_MISSING_MAX,
                              v->missing, &v->heartbeat.missing)) != FL_OK)
            return rc;
        v->h.heartbeat = &v->heartbeat;
        return FL_OK;
    case FL_MSG_ERROR:
        flodl__error__init(&v->error);
        v->error.code = m->u.error.code;
        v->error.about_rank = m->u.error.about_rank;
        if ((rc = check_str("error host", m->u.error.host, FL_HOST_MAX)) != FL_OK ||
            (rc = escape_text("error text", m->u.error.text, FL_MSG_TEXT_MAX, v->text,
                              &v->error.text)) != FL_OK)
            return rc;
        v->error.host = (char *)m->u.error.host;
        v->h.error = &v->error;
        return FL_OK;
    case FL_MSG_SHUTDOWN:
        flodl__shutdown__init(&v->shutdown);
        v->shutdown.code = m->u.shutdown.code;
        if ((rc = escape_text("shutdown text", m->u.shutdown.text, FL_MSG_TEXT_MAX, v->text,
                              &v->shutdown.text)) != FL_OK)
            return rc;
        v->h.shutdown = &v->shutdown;
        return FL_OK;
    case FL_MSG_CHUNK:
        flodl__chunk__init(&v->chunk);
        v->chunk.coll = m->u.chunk.coll;
        v->chunk.phase = m->u.chunk.phase;
        v->chunk.step = m->u.chunk.step;
        v->chunk.seg = m->u.chunk.seg;
        v->chunk.offset = m->u.chunk.offset;
        v->chunk.count = m->u.chunk.count;
        v->chunk.op = m->u.chunk.op;
        v->chunk.total = m->u.chunk.total;
        v->chunk.dtype = m->u.chunk.dtype;
        v->h.chunk = &v->chunk;
        return FL_OK;
    case FL_MSG_PUSH:
        flodl__push__init(&v->push);
        v->push.shard = m->u.push.shard;
        v->push.offset = m->u.push.offset;
        v->push.count = m->u.push.count;
        v->push.step = m->u.push.step;
        v->push.batch = m->u.push.batch;
        v->push.kind = (Flodl__PushKind)m->u.push.kind;
        v->push.checkpoint = m->u.push.checkpoint;
        v->h.push = &v->push;
        return FL_OK;
    case FL_MSG_PUSH_ACK:
        flodl__push_ack__init(&v->push_ack);
        v->push_ack.shard = m->u.push_ack.shard;
        v->push_ack.step = m->u.push_ack.step;
        v->push_ack.version = m->u.push_ack.version;
        v->push_ack.ignored = m->u.push_ack.ignored;
        v->h.push_ack = &v->push_ack;
        return FL_OK;
    case FL_MSG_PULL:
        flodl__pull__init(&v->pull);
        v->pull.shard = m->u.pull.shard;
        v->pull.offset = m->u.pull.offset;
        v->pull.count = m->u.pull.count;
        v->pull.step = m->u.pull.step;
        v->pull.latest = m->u.pull.latest;
        v->pull.wait_ms = m->u.pull.wait_ms;
        v->pull.lz4 = m->u.pull.lz4;
        v->h.pull = &v->pull;
        return FL_OK;
    case FL_MSG_PULL_REPLY:
        flodl__pull_reply__init(&v->pull_reply);
        v->pull_reply.shard = m->u.pull_reply.shard;
        v->pull_reply.offset = m->u.pull_reply.offset;
        v->pull_reply.count = m->u.pull_reply.count;
        v->pull_reply.version = m->u.pull_reply.version;
        v->pull_reply.step = m->u.pull_reply.step;
        v->pull_reply.min_step = m->u.pull_reply.min_step;
        v->h.pull_reply = &v->pull_reply;
        return FL_OK;
    default:
        return fl_fail(FL_EINVAL, "encode: unknown message type %d", (int)m->type);
    }
}

int fl_msg_encode(const fl_msg_hdr_t *m, void *(*alloc)(size_t len, void *ud), void *ud,
                  size_t *len)
{
    pb_view_t v;
    int rc;

    memset(&v, 0, sizeof v);
    flodl__header__init(&v.h);
    v.h.magic = FL_MSG_MAGIC;
    v.h.version = m->version;
    if ((rc = check_str("job id", m->job_id, FL_JOB_MAX)) != FL_OK)
        return rc;
    v.h.job_id = (char *)m->job_id;
    v.h.generation = m->generation;
    v.h.type = (Flodl__MsgType)m->type;
    v.h.sender = m->sender;
    v.h.seq = m->seq;
    v.h.step = m->step;
    if (m->nframes > FL_MSG_MAX_FRAMES)
        return fl_fail(FL_EINVAL, "encode: %u frames, at most %d", m->nframes, FL_MSG_MAX_FRAMES);
    for (uint32_t i = 0; i < m->nframes; i++) {
        Flodl__FrameDesc *f = &v.frame_store[i];
        flodl__frame_desc__init(f);
        f->bytes = m->frames[i].bytes;
        f->dtype = (Flodl__DType)m->frames[i].dtype;
        f->codec = (Flodl__Codec)m->frames[i].codec;
        f->raw_bytes = m->frames[i].raw_bytes;
        v.frames[i] = f;
    }
    v.h.n_frames = m->nframes;
    v.h.frames = v.frames;

    rc = build_body(&v, m);
    /* build_body pointed the union member at the body; the case says which one it is, and
     * protobuf-c packs that member even when every field in it is at its default. */
    v.h.body_case = fl_msg_body_case(m->type);
    if (rc == FL_OK) {
        size_t n = protobuf_c_message_get_packed_size(&v.h.base);
        uint8_t *out = alloc(n, ud);
        if (out == NULL) {
            rc = fl_fail(FL_ENOMEM, "encode: no memory for a %zu-byte header", n);
        } else {
            protobuf_c_message_pack(&v.h.base, out);
            *len = n;
        }
    }
    free(v.peer_store);
    free(v.peers);
    free(v.peer_eps);
    free(v.shard_store);
    free(v.shards);
    free(v.reg_shard_eps);
    return rc;
}
