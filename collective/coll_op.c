/* The op engine: what every collective shares. Numbering and deadline, receiving the next
 * message of this op (from the stash, or the socket while watching the control thread's abort
 * pipe), sends with zero-copy release tracking, and the failure path that names the op, the
 * progress and the peer waited for, then breaks the communicator. */
#include "comm_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STASH_MIN_CAP ((size_t)256 << 20)

static size_t op_bytes(const coll_op_t *op)
{
    return op->count * fl_dtype_size(op->dtype);
}

int fl_coll__fail(coll_op_t *op, int code, const char *fmt, ...)
{
    char cause[768];
    char size[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof cause, fmt, ap);
    va_end(ap);
    fl_fmt_bytes(op_bytes(op), size, sizeof size);
    const fl_comm_t *c = op->c;
    char who[FL_HOST_MAX + 96];
    if (c->tapped != NULL) /* a sub-communicator: its rank alone would not name the process */
        snprintf(who, sizeof who, "rank %d (%s; rank %d of %d of a sub-communicator)", c->job_rank,
                 c->host, c->rank, c->size);
    else
        snprintf(who, sizeof who, "rank %d (%s)", c->rank, c->host);
    if (op->phase != 0)
        return fl_fail(code, "%s: %s #%llu (%zu x %s, %s) in %s step %u: %s", who,
                       fl_coll_kind_name(op->kind), (unsigned long long)op->seq, op->count,
                       fl_dtype_name(op->dtype), size, fl_coll_phase_name(op->phase), op->step,
                       cause);
    return fl_fail(code, "%s: %s #%llu (%zu x %s, %s): %s", who, fl_coll_kind_name(op->kind),
                   (unsigned long long)op->seq, op->count, fl_dtype_name(op->dtype), size, cause);
}

/* Reads one failure event from the control thread and fails the op with it. */
static int take_event(coll_op_t *op)
{
    fl_tp_msg_t ev;
    int rc = fl_tp_recv(op->c->events, &ev, fl_deadline_in(0));
    if (rc != FL_OK)
        return fl_coll__fail(op, FL_EPEER, "aborted by the control thread (event unreadable)");
    int code =
        ev.hdr.type == FL_MSG_ERROR && ev.hdr.u.error.code < 0 ? ev.hdr.u.error.code : FL_EPEER;
    char waiting[FL_HOST_MAX + 32] = "";
    if (op->waiting_on >= 0) {
        char name[FL_HOST_MAX + 32];
        snprintf(waiting, sizeof waiting, " (waiting for %s)",
                 fl_comm_peer_name(op->c, op->waiting_on, name, sizeof name));
    }
    rc = fl_coll__fail(op, code, "%s%s", ev.hdr.u.error.text, waiting);
    fl_tp_msg_close(&ev);
    return rc;
}

/* True when the control thread has posted a failure (a dead peer, a silent coordinator). */
static bool event_pending(fl_comm_t *c)
{
    bool ready = false;
    fl_tp_sock_t *ev = c->events;
    return fl_tp_poll(&ev, 1, 0, &ready) > 0 && ready;
}

int fl_coll__begin(fl_comm_t *c, coll_op_t *op, fl_coll_kind_t kind, size_t count, fl_dtype_t dtype,
                   fl_op_t rop, int root)
{
    memset(op, 0, sizeof *op);
    op->c = c;
    op->kind = kind;
    op->count = count;
    op->dtype = dtype;
    op->op = rop;
    op->root = root;
    op->waiting_on = -1;
    if (c->broken_rc != FL_OK)
        return fl_fail(FL_ECLOSED, "rank %d (%s): communicator broken by an earlier failure: %s",
                       c->rank, c->host, c->broken_text);
    op->seq = ++c->seq;
    op->deadline = fl_deadline_in(c->timeout_ms);
    atomic_store(&c->status->op, (uint32_t)kind);
    atomic_store(&c->status->seq, op->seq);
    atomic_store(&c->status->step, 0);
    atomic_store(&c->status->waiting_on, -1);

    /* A peer may have died while no collective was running. Until the control thread has
     * posted anything, skip the poll (two system calls); a later blocking wait in the op
     * watches the events pipe anyway. */
    if (atomic_load_explicit(&c->status->posted, memory_order_acquire) != 0 && event_pending(c))
        return fl_coll__end(op, take_event(op));
    return FL_OK;
}

/* How long a receive waits in the data socket alone before it looks for the control thread's
 * events again: an abort is seen within this much. */
#define RECV_SLICE_MS 100

/* How long one sleep of a release wait may last: short enough to notice an abort. */
static int slice_ms(int64_t deadline)
{
    int left = fl_deadline_left_ms(deadline);
    return left < 10 ? left : 10;
}

/* wait_slices' answer when the control thread posted a failure. */
#define EVENT_POSTED 1

/* Waits in slices until ZeroMQ has released every send counted in cnt, so that an abort posted
 * meanwhile (watch_events) is seen within one. FL_OK; FL_ETIMEDOUT at the deadline, or
 * EVENT_POSTED, both with no text set. Once a slice has timed out, the count is looked at
 * again after the deadline or the event was seen: a release that came in the meantime makes the
 * wait a success, never a timeout or a failure. */
static int wait_slices(coll_op_t *op, fl_rel_t *cnt, int64_t deadline, bool watch_events)
{
    while (!fl_rel_wait(cnt, slice_ms(deadline))) {
        bool late = fl_deadline_left_ms(deadline) == 0;
        bool posted = !late && watch_events && event_pending(op->c);
        if (!late && !posted)
            continue;
        if (fl_rel_wait(cnt, 0))
            return FL_OK;
        return late ? FL_ETIMEDOUT : EVENT_POSTED;
    }
    return FL_OK;
}

/* Waits until ZeroMQ has released every zero-copy send of the op. A send queued to a peer that
 * died is never released (ZeroMQ keeps it for a reconnect), so the wait also watches the
 * abort pipe. Returns FL_OK, FL_ETIMEDOUT at the deadline, or the posted failure. */
static int wait_released(coll_op_t *op, int64_t deadline, bool watch_events)
{
    fl_comm_t *c = op->c;
    for (int r = 0; r <= c->size; r++) {
        int rc = wait_slices(op, &c->inflight[r], deadline, watch_events);
        if (rc == FL_ETIMEDOUT)
            return fl_fail(FL_ETIMEDOUT,
                           "%lld zero-copy sends from region %d still held by "
                           "ZeroMQ",
                           (long long)fl_rel_held(&c->inflight[r]), r);
        if (rc == EVENT_POSTED)
            return take_event(op);
    }
    return FL_OK;
}

int fl_coll__end(coll_op_t *op, int rc)
{
    fl_comm_t *c = op->c;
    if (rc == FL_OK) {
        /* The caller may reuse its buffers as soon as we return. */
        rc = wait_released(op, op->deadline, true);
        if (rc == FL_ETIMEDOUT)
            rc = fl_coll__fail(op, FL_ETIMEDOUT, "sends to peers not completed by the deadline: %s",
                               fl_last_error());
    }
    if (rc != FL_OK) {
        /* Drop whatever is still queued to peers (linger 0), so ZeroMQ lets go of the
         * caller's memory, and make every later call fail fast. */
        for (int p = 0; p < c->size; p++) {
            if (c->data_out[p] != NULL) {
                fl_tp_sock_set_linger(c->data_out[p], 0);
                fl_tp_sock_destroy(&c->data_out[p]);
            }
        }
        char cause[1024];
        snprintf(cause, sizeof cause, "%s", fl_last_error());
        if (wait_released(op, fl_deadline_in(2000), false) != FL_OK)
            FL_ERROR(c->ctx, "after a failure: %s", fl_last_error());
        fl_fail(rc, "%s", cause);
        if (c->broken_rc == FL_OK) {
            c->broken_rc = rc;
            snprintf(c->broken_text, sizeof c->broken_text, "%s", fl_last_error());
        }
    } else {
        c->ops++;
    }
    atomic_store(&c->status->op, 0);
    atomic_store(&c->status->waiting_on, -1);
    return rc;
}

static void stash_push(fl_comm_t *c, stash_ent_t *e)
{
    e->next = NULL;
    stash_ent_t **p = &c->stash;
    while (*p != NULL)
        p = &(*p)->next;
    *p = e;
}

static bool stash_take(fl_comm_t *c, uint64_t seq, fl_tp_msg_t *m)
{
    for (stash_ent_t **p = &c->stash; *p != NULL; p = &(*p)->next) {
        if ((*p)->msg.hdr.seq == seq) {
            stash_ent_t *e = *p;
            *p = e->next;
            *m = e->msg;
            for (size_t i = 0; i < m->nframes; i++)
                c->stash_bytes -= fl_tp_msg_size(m, i);
            free(e);
            return true;
        }
    }
    return false;
}

/* Checks a message of this op's sequence number against the op: a peer in another collective,
 * or with another count, type or operator, is a programming error on some rank, reported as
 * such rather than as corrupt data. */
static int match_op(coll_op_t *op, fl_tp_msg_t *m)
{
    char who[FL_HOST_MAX + 32];
    fl_comm_peer_name(op->c, m->hdr.sender, who, sizeof who);
    if (op->kind == FL_COLL_BARRIER) {
        if (m->hdr.type != FL_MSG_BARRIER)
            return fl_coll__fail(op, FL_EPROTO,
                                 "%s is in %s #%llu, not in a barrier: collectives "
                                 "called in a different order on different ranks",
                                 who, fl_coll_kind_name((int)m->hdr.u.chunk.coll),
                                 (unsigned long long)m->hdr.seq);
        return FL_OK;
    }
    if (m->hdr.type != FL_MSG_CHUNK)
        return fl_coll__fail(op, FL_EPROTO,
                             "%s is in a barrier #%llu, not in %s: collectives "
                             "called in a different order on different ranks",
                             who, (unsigned long long)m->hdr.seq, fl_coll_kind_name(op->kind));
    const fl_msg_chunk_t *ck = &m->hdr.u.chunk;
    if (ck->coll != (uint32_t)op->kind)
        return fl_coll__fail(op, FL_EPROTO,
                             "%s is in %s #%llu, not in %s: collectives called in a "
                             "different order on different ranks",
                             who, fl_coll_kind_name((int)ck->coll), (unsigned long long)m->hdr.seq,
                             fl_coll_kind_name(op->kind));
    if (ck->dtype != (uint32_t)op->dtype)
        return fl_coll__fail(op, FL_EPROTO, "%s called %s with %s data, this rank with %s", who,
                             fl_coll_kind_name(op->kind), fl_dtype_name((fl_dtype_t)ck->dtype),
                             fl_dtype_name(op->dtype));
    if (ck->total != op->count)
        return fl_coll__fail(op, FL_EPROTO, "%s called %s with %llu elements, this rank with %zu",
                             who, fl_coll_kind_name(op->kind), (unsigned long long)ck->total,
                             op->count);
    uint32_t want_op = op->kind == FL_COLL_BROADCAST ? (uint32_t)op->root : (uint32_t)op->op;
    if (ck->op != want_op)
        return fl_coll__fail(op, FL_EPROTO, "%s called %s with %s %u, this rank with %u", who,
                             fl_coll_kind_name(op->kind),
                             op->kind == FL_COLL_BROADCAST ? "root" : "operator", ck->op, want_op);
    return FL_OK;
}

static int classify(coll_op_t *op, fl_tp_msg_t *m, bool *keep)
{
    fl_comm_t *c = op->c;
    *keep = false;
    if ((m->hdr.type != FL_MSG_CHUNK && m->hdr.type != FL_MSG_BARRIER) || m->hdr.sender < 0 ||
        m->hdr.sender >= c->size || m->hdr.sender == c->rank) {
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        FL_WARN(c->ctx, "dropped a %s message claiming sender %d on the data socket",
                fl_msg_type_name(m->hdr.type), m->hdr.sender);
        fl_tp_msg_close(m);
        return FL_OK;
    }
    /* With per-rank keys a rank speaks only for itself. A sub-communicator numbers its
     * members its own way, so only a communicator of its own can tell. */
    if (m->peer_bound != FL_TP_KEY_ANY && c->tapped == NULL && m->peer_bound != m->hdr.sender) {
        fl_ctx_count(c->ctx, FL_STAT_AUTH_REFUSED, 1);
        FL_WARN(c->ctx, "dropped a %s message claiming sender %d from a connection with %s key",
                fl_msg_type_name(m->hdr.type), m->hdr.sender,
                m->peer_bound >= 0 ? "another rank's" : "a parameter server's");
        fl_tp_msg_close(m);
        return FL_OK;
    }
    if (m->hdr.seq < op->seq) {
        fl_ctx_count(c->ctx, FL_STAT_UNEXPECTED, 1);
        FL_WARN(c->ctx, "dropped a stale message of collective #%llu from rank %d during #%llu",
                (unsigned long long)m->hdr.seq, m->hdr.sender, (unsigned long long)op->seq);
        fl_tp_msg_close(m);
        return FL_OK;
    }
    if (m->hdr.seq > op->seq) {
        size_t bytes = 0;
        for (size_t i = 0; i < m->nframes; i++)
            bytes += fl_tp_msg_size(m, i);
        size_t cap = 2 * op_bytes(op) > STASH_MIN_CAP ? 2 * op_bytes(op) : STASH_MIN_CAP;
        if (c->stash_bytes + bytes > cap) {
            fl_tp_msg_close(m);
            return fl_coll__fail(op, FL_EPROTO, "rank %d sent over %zu bytes for later collectives",
                                 m->hdr.sender, cap);
        }
        stash_ent_t *e = malloc(sizeof *e);
        if (e == NULL) {
            fl_tp_msg_close(m);
            return fl_coll__fail(op, FL_ENOMEM, "out of memory stashing an early message");
        }
        e->msg = *m;
        c->stash_bytes += bytes;
        stash_push(c, e);
        return FL_OK;
    }
    int rc = match_op(op, m);
    if (rc != FL_OK) {
        fl_tp_msg_close(m);
        return rc;
    }
    *keep = true;
    return FL_OK;
}

int fl_coll__recv(coll_op_t *op, fl_tp_msg_t *m)
{
    fl_comm_t *c = op->c;
    atomic_store_explicit(&c->status->step, op->step, memory_order_relaxed);
    atomic_store_explicit(&c->status->waiting_on, op->waiting_on, memory_order_relaxed);
    if (stash_take(c, op->seq, m)) {
        int rc = match_op(op, m);
        if (rc != FL_OK) {
            fl_tp_msg_close(m);
            return rc;
        }
        for (size_t i = 0; i < m->nframes; i++)
            c->bytes_recv += fl_tp_msg_size(m, i);
        return FL_OK;
    }
    fl_tp_sock_t *socks[2] = {c->data_in, c->events};
    for (;;) {
        /* While the control thread has posted nothing, wait in the data socket's own receive,
         * in slices, looking at its count between them: a poll over the data and events
         * sockets costs several system calls more per message. Once it has posted, take what
         * is waiting without a wait, and poll both only when the socket is empty (an abort
         * matters only once data stops coming). */
        int left = fl_deadline_left_ms(op->deadline);
        bool quiet =
            left > 0 && atomic_load_explicit(&c->status->posted, memory_order_acquire) == 0;
        int rc = quiet ? fl_tp_recv_for(c->data_in, m, left < RECV_SLICE_MS ? left : RECV_SLICE_MS)
                       : fl_tp_try_recv(c->data_in, m);
        if (quiet && rc == FL_ETIMEDOUT)
            continue; /* the slice ended: look again */
        if (rc == FL_OK) {
            bool keep;
            if ((rc = classify(op, m, &keep)) != FL_OK)
                return rc;
            if (keep) {
                for (size_t i = 0; i < m->nframes; i++)
                    c->bytes_recv += fl_tp_msg_size(m, i);
                return FL_OK;
            }
            continue;
        }
        if (rc == FL_EPROTO)
            continue; /* refused and counted by the transport */
        if (rc != FL_ETIMEDOUT)
            return fl_coll__fail(op, rc, "%s", fl_last_error());
        bool ready[2] = {false, false};
        int n = fl_tp_poll(socks, 2, left, ready);
        if (n < 0)
            return fl_coll__fail(op, n, "%s", fl_last_error());
        /* Data that came with the event is taken first: it may be what completes the op. */
        if (ready[1] && !ready[0])
            return take_event(op);
        if (n > 0)
            continue;
        if (left == 0) {
            char who[FL_HOST_MAX + 32] = "any peer";
            if (op->waiting_on >= 0)
                fl_comm_peer_name(c, op->waiting_on, who, sizeof who);
            return fl_coll__fail(op, FL_ETIMEDOUT,
                                 "no data from %s within %d ms (%zu of %zu "
                                 "messages received)",
                                 who, c->timeout_ms, op->msgs_got, op->msgs_expected);
        }
    }
}

/* Counts payload sent to peer, and apart what crossed to another host (another address). */
static void count_sent(fl_comm_t *c, int peer, size_t bytes)
{
    c->bytes_sent += bytes;
    if (strcmp(c->peers[peer].host, c->host) != 0)
        c->bytes_sent_remote += bytes;
}

int fl_coll__send(coll_op_t *op, int peer, const fl_msg_chunk_t *ck, const void *data, size_t bytes,
                  fl_dtype_t wire, int region)
{
    fl_comm_t *c = op->c;
    fl_tp_sock_t *s;
    int rc = fl_comm_peer_sock(c, peer, &s);
    if (rc != FL_OK)
        return fl_coll__fail(op, rc, "%s", fl_last_error());
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, c->rank);
    h.seq = op->seq;
    h.u.chunk = *ck;
    h.u.chunk.coll = (uint32_t)op->kind;
    h.u.chunk.total = op->count;
    h.u.chunk.dtype = (uint32_t)op->dtype;
    h.u.chunk.op = op->kind == FL_COLL_BROADCAST ? (uint32_t)op->root : (uint32_t)op->op;
    h.frames[0].dtype = (uint32_t)wire;
    h.frames[0].codec = FL_CODEC_RAW;
    fl_buf_t b = {(void *)data, bytes, NULL, NULL};
    if (region >= 0) {
        fl_rel_add(&c->inflight[region], 1);
        b.hint = &c->inflight[region];
        b.release = fl_rel_hook;
    }
    rc = fl_tp_send(s, NULL, &h, &b, 1, op->deadline);
    if (rc != FL_OK) {
        char who[FL_HOST_MAX + 32];
        return fl_coll__fail(op, rc, "send to %s: %s", fl_comm_peer_name(c, peer, who, sizeof who),
                             fl_last_error());
    }
    count_sent(c, peer, bytes);
    return FL_OK;
}

int fl_coll__send_block(coll_op_t *op, int peer, const fl_msg_chunk_t *ck, const void *data,
                        size_t bytes)
{
    fl_comm_t *c = op->c;
    fl_tp_sock_t *s;
    int rc = fl_comm_peer_sock(c, peer, &s);
    if (rc != FL_OK)
        return fl_coll__fail(op, rc, "%s", fl_last_error());
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, c->rank);
    h.seq = op->seq;
    h.u.chunk = *ck;
    h.u.chunk.coll = (uint32_t)op->kind;
    h.u.chunk.total = op->count;
    h.u.chunk.dtype = (uint32_t)op->dtype;
    h.u.chunk.op = (uint32_t)op->op;
    h.frames[0].dtype = 0;
    h.frames[0].codec = FL_CODEC_SPARSE;
    fl_buf_t b = {(void *)data, bytes, NULL, NULL};
    if ((rc = fl_tp_send(s, NULL, &h, &b, 1, op->deadline)) != FL_OK) {
        char who[FL_HOST_MAX + 32];
        return fl_coll__fail(op, rc, "send to %s: %s", fl_comm_peer_name(c, peer, who, sizeof who),
                             fl_last_error());
    }
    count_sent(c, peer, bytes);
    return FL_OK;
}

int fl_coll__send_empty(coll_op_t *op, int peer, fl_msg_type_t type, const fl_msg_barrier_t *b)
{
    fl_comm_t *c = op->c;
    fl_tp_sock_t *s;
    int rc = fl_comm_peer_sock(c, peer, &s);
    if (rc != FL_OK)
        return fl_coll__fail(op, rc, "%s", fl_last_error());
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, type, c->rank);
    h.seq = op->seq;
    if (type == FL_MSG_BARRIER && b != NULL)
        h.u.barrier = *b;
    rc = fl_tp_send(s, NULL, &h, NULL, 0, op->deadline);
    if (rc != FL_OK) {
        char who[FL_HOST_MAX + 32];
        return fl_coll__fail(op, rc, "send to %s: %s", fl_comm_peer_name(c, peer, who, sizeof who),
                             fl_last_error());
    }
    return FL_OK;
}

int fl_coll__wait_region(coll_op_t *op, int region)
{
    /* A send to a dead peer is never released: watch for the abort too. */
    int rc = wait_slices(op, &op->c->inflight[region], op->deadline, true);
    if (rc == FL_ETIMEDOUT)
        return fl_coll__fail(op, FL_ETIMEDOUT, "earlier sends from chunk %d never completed",
                             region);
    if (rc == EVENT_POSTED)
        return take_event(op);
    return FL_OK;
}

int fl_coll__check_payload(coll_op_t *op, fl_tp_msg_t *m, fl_dtype_t wire, size_t count)
{
    if (m->nframes != 1 || m->hdr.frames[0].dtype != (uint32_t)wire ||
        m->hdr.frames[0].codec != FL_CODEC_RAW ||
        fl_tp_msg_size(m, 0) != count * fl_dtype_size(wire))
        return fl_coll__fail(op, FL_EPROTO,
                             "rank %d sent %zu frame(s) of %zu bytes (%s), expected "
                             "one raw frame of %zu x %s",
                             m->hdr.sender, m->nframes, m->nframes ? fl_tp_msg_size(m, 0) : 0,
                             fl_dtype_name((fl_dtype_t)m->hdr.frames[0].dtype), count,
                             fl_dtype_name(wire));
    return FL_OK;
}
