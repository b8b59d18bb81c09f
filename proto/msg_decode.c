/* Decoding: bytes -> protobuf-c -> validated fl_msg_hdr_t. Everything that can be checked
 * without knowing the receiver's state is checked here, so no caller ever sees a header with
 * an unterminated string, text that is not wire text (msg_wire.c: not UTF-8, a control
 * character, a NUL inside), an unknown type, a missing body or an impossible frame list. */
#include "fl_msg.h"
#include "msg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(fl_msg_fault_t *fault, fl_msg_fault_t why, const char *fmt, ...) FL_PRINTF(3, 4);

static int bad(fl_msg_fault_t *fault, fl_msg_fault_t why, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    *fault = why;
    return fl_fail(FL_EPROTO, "%s", text);
}

/* Copies a protobuf string into a fixed field; a string that does not fit is refused, not
 * truncated, because identifiers (hosts, endpoints, job ids) must survive intact. */
static int copy_id(char *dst, size_t cap, const char *src, const char *what,
                   fl_msg_fault_t *fault)
{
    size_t n = strlen(src);
    if (n >= cap)
        return bad(fault, FL_FAULT_HEADER, "header: %s of %zu bytes is too long", what, n);
    memcpy(dst, src, n + 1);
    return FL_OK;
}

/* Free text (error and shutdown messages) is truncated instead, between two characters so
 * that what is kept is still wire text. */
static void copy_text(char *dst, size_t cap, const char *src)
{
    size_t n = fl_text_cut(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int copy_eps(char (*dst)[FL_ENDPOINT_MAX], uint32_t *n, char **src, size_t nsrc,
                    fl_msg_fault_t *fault)
{
    if (nsrc > FL_MSG_MAX_STRIPES)
        return bad(fault, FL_FAULT_HEADER, "header: %s list of %zu entries is too long",
                   "endpoint", nsrc);
    for (size_t i = 0; i < nsrc; i++) {
        int rc = copy_id(dst[i], FL_ENDPOINT_MAX, src[i], "endpoint", fault);
        if (rc != FL_OK)
            return rc;
    }
    *n = (uint32_t)nsrc;
    return FL_OK;
}

static int decode_welcome(const Flodl__Welcome *w, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    if (w->n_peers > FL_MSG_MAX_PEERS)
        return bad(fault, FL_FAULT_HEADER, "header: %s table of %zu entries is too long",
                   "peer", w->n_peers);
    if (fl_msg_welcome_alloc(out, (uint32_t)w->n_peers) != FL_OK)
        return FL_ENOMEM;
    for (size_t i = 0; i < w->n_peers; i++) {
        const Flodl__Peer *p = w->peers[i];
        fl_msg_peer_t *q = &out->u.welcome.peers[i];
        int rc;
        q->rank = p->rank;
        q->pid = p->pid;
        if ((rc = copy_id(q->host, sizeof q->host, p->host, "peer host", fault)) != FL_OK ||
            (rc = copy_eps(q->endpoints, &q->nendpoints, p->endpoints, p->n_endpoints,
                           fault)) != FL_OK)
            return rc;
    }
    out->u.welcome.heartbeat_ms = w->heartbeat_ms;
    out->u.welcome.heartbeat_timeout_ms = w->heartbeat_timeout_ms;
    if (w->n_shards > FL_MSG_MAX_SHARDS)
        return bad(fault, FL_FAULT_HEADER, "header: %s table of %zu entries is too long",
                   "shard", w->n_shards);
    if (w->consistency > FLODL__CONSISTENCY__CONSISTENCY_SSP)
        return bad(fault, FL_FAULT_HEADER, "header: unknown consistency %d",
                   (int)w->consistency);
    if (fl_msg_welcome_alloc_shards(out, (uint32_t)w->n_shards) != FL_OK)
        return FL_ENOMEM;
    for (size_t i = 0; i < w->n_shards; i++) {
        const Flodl__Shard *p = w->shards[i];
        fl_msg_shard_t *q = &out->u.welcome.shards[i];
        int rc;
        q->index = p->index;
        q->offset = p->offset;
        q->count = p->count;
        if ((rc = copy_id(q->endpoint, sizeof q->endpoint, p->endpoint, "shard endpoint",
                          fault)) != FL_OK ||
            (rc = copy_id(q->host, sizeof q->host, p->host, "shard host", fault)) != FL_OK)
            return rc;
    }
    out->u.welcome.param_count = w->param_count;
    out->u.welcome.consistency = (uint32_t)w->consistency;
    out->u.welcome.staleness = w->staleness;
    out->u.welcome.resume = w->resume;
    out->u.welcome.resume_step = w->resume_step;
    out->u.welcome.ckpt_every_steps = w->checkpoint_every_steps;
    out->u.welcome.ckpt_every_ms = w->checkpoint_every_ms;
    return FL_OK;
}

static int decode_register(const Flodl__Register *r, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    fl_msg_register_t *q = &out->u.reg;
    int rc;
    q->rank = r->rank;
    q->world_size = r->world_size;
    q->pid = r->pid;
    q->model_signature = r->model_signature;
    if ((rc = copy_id(q->host, sizeof q->host, r->host, "host", fault)) != FL_OK ||
        (rc = copy_id(q->tuning, sizeof q->tuning, r->tuning, "tuning", fault)) != FL_OK ||
        (rc = copy_id(q->settings, sizeof q->settings, r->settings, "settings", fault)) !=
            FL_OK ||
        (rc = copy_id(q->model_shapes, sizeof q->model_shapes, r->model_shapes, "model shapes",
                      fault)) != FL_OK ||
        (rc = copy_eps(q->endpoints, &q->nendpoints, r->endpoints, r->n_endpoints, fault)) !=
            FL_OK)
        return rc;
    if (r->role != FLODL__ROLE__ROLE_WORKER && r->role != FLODL__ROLE__ROLE_SERVER)
        return bad(fault, FL_FAULT_HEADER, "header: unknown role %d", (int)r->role);
    if (r->consistency > FLODL__CONSISTENCY__CONSISTENCY_SSP)
        return bad(fault, FL_FAULT_HEADER, "header: unknown consistency %d",
                   (int)r->consistency);
    if (fl_settings_check(q->settings, sizeof q->settings) != FL_OK)
        return bad(fault, FL_FAULT_HEADER, "header: %s", fl_last_error());
    q->role = (fl_msg_role_t)r->role;
    q->param_count = r->param_count;
    q->shard_count = r->shard_count;
    q->num_shards = r->num_shards;
    q->consistency = (uint32_t)r->consistency;
    q->staleness = r->staleness;
    q->ckpt_every_steps = r->checkpoint_every_steps;
    q->ckpt_every_ms = r->checkpoint_every_ms;
    if (r->n_checkpoints > FL_MSG_MAX_CHECKPOINTS)
        return bad(fault, FL_FAULT_HEADER, "header: %s list of %zu entries is too long",
                   "checkpoint", r->n_checkpoints);
    for (size_t i = 0; i < r->n_checkpoints; i++)
        q->checkpoints[i] = r->checkpoints[i];
    q->ncheckpoints = (uint32_t)r->n_checkpoints;
    if (r->n_shard_endpoints > FL_MSG_MAX_SHARDS)
        return bad(fault, FL_FAULT_HEADER, "header: %s list of %zu entries is too long",
                   "shard endpoint", r->n_shard_endpoints);
    if (fl_msg_register_alloc_shards(q, (uint32_t)r->n_shard_endpoints) != FL_OK)
        return FL_ENOMEM;
    for (size_t i = 0; i < r->n_shard_endpoints; i++) {
        if ((rc = copy_id(q->shard_eps[i], FL_ENDPOINT_MAX, r->shard_endpoints[i],
                          "shard endpoint", fault)) != FL_OK)
            return rc;
    }
    return FL_OK;
}

static int decode_body(const Flodl__Header *h, unsigned nbodies, fl_msg_hdr_t *out,
                       fl_msg_fault_t *fault)
{
    Flodl__Header__BodyCase want = fl_msg_body_case((int)h->type);
    if (want == FLODL__HEADER__BODY__NOT_SET)
        return bad(fault, FL_FAULT_HEADER, "header: unknown message type %llu",
                   (unsigned long long)h->type);
    /* protobuf-c keeps the last of several bodies; the wire walk counted them all. */
    if (nbodies > 1)
        return bad(fault, FL_FAULT_HEADER, "header: %s message with %u bodies",
                   fl_msg_type_name((int)h->type), nbodies);
    if (h->body_case == FLODL__HEADER__BODY__NOT_SET)
        return bad(fault, FL_FAULT_HEADER, "header: %s message without its body (type %llu)",
                   fl_msg_type_name((int)h->type), (unsigned long long)h->type);
    if (h->body_case != want)
        return bad(fault, FL_FAULT_HEADER, "header: %s message with a %s body (field %d)",
                   fl_msg_type_name((int)h->type),
                   fl_msg_type_name(fl_msg_type_of_body(h->body_case)), (int)h->body_case);

    switch (h->type) {
    case FLODL__MSG_TYPE__MSG_REGISTER:
        return decode_register(h->reg, out, fault);
    case FLODL__MSG_TYPE__MSG_WELCOME:
        return decode_welcome(h->welcome, out, fault);
    case FLODL__MSG_TYPE__MSG_BARRIER:
        out->u.barrier.id = h->barrier->id;
        out->u.barrier.round = h->barrier->round;
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_HEARTBEAT:
        out->u.heartbeat.op = h->heartbeat->op;
        out->u.heartbeat.op_seq = h->heartbeat->op_seq;
        out->u.heartbeat.op_step = h->heartbeat->op_step;
        out->u.heartbeat.waiting_on = h->heartbeat->waiting_on;
        out->u.heartbeat.registered = h->heartbeat->registered;
        copy_text(out->u.heartbeat.missing, sizeof out->u.heartbeat.missing,
                  h->heartbeat->missing);
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_ERROR:
        out->u.error.code = h->error->code;
        out->u.error.about_rank = h->error->about_rank;
        copy_text(out->u.error.host, sizeof out->u.error.host, h->error->host);
        copy_text(out->u.error.text, sizeof out->u.error.text, h->error->text);
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_SHUTDOWN:
        out->u.shutdown.code = h->shutdown->code;
        copy_text(out->u.shutdown.text, sizeof out->u.shutdown.text, h->shutdown->text);
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_CHUNK:
        out->u.chunk.coll = h->chunk->coll;
        out->u.chunk.phase = h->chunk->phase;
        out->u.chunk.step = h->chunk->step;
        out->u.chunk.seg = h->chunk->seg;
        out->u.chunk.offset = h->chunk->offset;
        out->u.chunk.count = h->chunk->count;
        out->u.chunk.op = h->chunk->op;
        out->u.chunk.total = h->chunk->total;
        out->u.chunk.dtype = h->chunk->dtype;
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_PUSH:
        if (h->push->kind != FLODL__PUSH_KIND__PUSH_GRADIENT &&
            h->push->kind != FLODL__PUSH_KIND__PUSH_INIT)
            return bad(fault, FL_FAULT_HEADER, "header: unknown push kind %d",
                       (int)h->push->kind);
        out->u.push.shard = h->push->shard;
        out->u.push.offset = h->push->offset;
        out->u.push.count = h->push->count;
        out->u.push.step = h->push->step;
        out->u.push.batch = h->push->batch;
        out->u.push.kind = (fl_msg_push_kind_t)h->push->kind;
        out->u.push.checkpoint = h->push->checkpoint;
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_PUSH_ACK:
        out->u.push_ack.shard = h->push_ack->shard;
        out->u.push_ack.step = h->push_ack->step;
        out->u.push_ack.version = h->push_ack->version;
        out->u.push_ack.ignored = h->push_ack->ignored;
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_PULL:
        out->u.pull.shard = h->pull->shard;
        out->u.pull.offset = h->pull->offset;
        out->u.pull.count = h->pull->count;
        out->u.pull.step = h->pull->step;
        out->u.pull.latest = h->pull->latest;
        out->u.pull.wait_ms = h->pull->wait_ms;
        out->u.pull.lz4 = h->pull->lz4;
        return FL_OK;
    case FLODL__MSG_TYPE__MSG_PULL_REPLY:
        out->u.pull_reply.shard = h->pull_reply->shard;
        out->u.pull_reply.offset = h->pull_reply->offset;
        out->u.pull_reply.count = h->pull_reply->count;
        out->u.pull_reply.version = h->pull_reply->version;
        out->u.pull_reply.step = h->pull_reply->step;
        out->u.pull_reply.min_step = h->pull_reply->min_step;
        return FL_OK;
    default:
        return FL_OK;
    }
}

static int decode_frames(const Flodl__Header *h, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    if (h->n_frames > FL_MSG_MAX_FRAMES)
        return bad(fault, FL_FAULT_FRAMES, "header: declares %llu frames, at most 16",
                   (unsigned long long)h->n_frames);
    for (size_t i = 0; i < h->n_frames; i++) {
        const Flodl__FrameDesc *f = h->frames[i];
        if (f->dtype != 0 && !fl_dtype_is_valid((int)f->dtype))
            return bad(fault, FL_FAULT_FRAMES, "header: frame with unknown dtype %llu",
                       (unsigned long long)f->dtype);
        if (f->codec != FLODL__CODEC__CODEC_RAW && f->codec != FLODL__CODEC__CODEC_LZ4 &&
            f->codec != FLODL__CODEC__CODEC_SPARSE)
            return bad(fault, FL_FAULT_FRAMES, "header: frame with unknown codec %llu",
                       (unsigned long long)f->codec);
        if (f->codec != FLODL__CODEC__CODEC_LZ4 && f->raw_bytes != f->bytes)
            return bad(fault, FL_FAULT_FRAMES,
                       "header: raw frame declares %llu decoded bytes unlike its size",
                       (unsigned long long)f->raw_bytes);
        if (f->dtype != 0 && f->codec != FLODL__CODEC__CODEC_SPARSE &&
            f->raw_bytes % fl_dtype_size((fl_dtype_t)f->dtype) != 0)
            return bad(fault, FL_FAULT_FRAMES,
                       "header: %s frame of %llu bytes is not a whole number of elements",
                       fl_dtype_name((fl_dtype_t)f->dtype), (unsigned long long)f->raw_bytes);
        out->frames[i].bytes = f->bytes;
        out->frames[i].dtype = (uint32_t)f->dtype;
        out->frames[i].codec = (uint32_t)f->codec;
        out->frames[i].raw_bytes = f->raw_bytes;
    }
    out->nframes = (uint32_t)h->n_frames;
    return FL_OK;
}

int fl_msg_decode(const void *data, size_t len, fl_msg_hdr_t *out, fl_msg_fault_t *fault)
{
    memset(out, 0, sizeof *out);
    *fault = FL_FAULT_NONE;

    Flodl__Header *h = flodl__header__unpack(NULL, len, data);
    if (h == NULL)
        return bad(fault, FL_FAULT_HEADER, "header: %llu bytes do not parse as a header",
                   (unsigned long long)len);
    int rc = FL_OK;
    unsigned nbodies = 0;
    if (h->magic != FL_MSG_MAGIC) {
        rc = bad(fault, FL_FAULT_MAGIC, "header: bad magic 0x%08llx",
                 (unsigned long long)h->magic);
        goto out;
    }
    /* Fill what a refusal needs before any further check can fail. */
    out->version = h->version;
    out->type = (fl_msg_type_t)h->type;
    out->sender = h->sender;
    out->generation = h->generation;
    out->seq = h->seq;
    out->step = h->step;
    if (h->version != FL_MSG_VERSION) {
        rc = bad(fault, FL_FAULT_VERSION, "header: protocol version %llu, expected 1",
                 (unsigned long long)h->version);
        goto out;
    }
    /* Every string at its wire length, before any is copied: protobuf-c's copies stop at a
     * NUL inside and are not checked for UTF-8. */
    if ((rc = fl_msg_wire_check(data, len, &nbodies, fault)) != FL_OK)
        goto out;
    if (strlen(h->job_id) >= FL_JOB_MAX) {
        rc = bad(fault, FL_FAULT_HEADER, "header: job id of %llu bytes is too long",
                 (unsigned long long)strlen(h->job_id));
        goto out;
    }
    memcpy(out->job_id, h->job_id, strlen(h->job_id) + 1);
    if ((rc = decode_frames(h, out, fault)) != FL_OK)
        goto out;
    rc = decode_body(h, nbodies, out, fault);
out:
    if (rc != FL_OK && rc != FL_EPROTO && *fault == FL_FAULT_NONE)
        *fault = FL_FAULT_HEADER;
    if (rc != FL_OK)
        fl_msg_hdr_free_tables(out);
    flodl__header__free_unpacked(h, NULL);
    return rc;
}
