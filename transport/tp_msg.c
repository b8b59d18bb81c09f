/* Messages on a socket: header frame + payload frames out (zero-copy when the payload carries a
 * release hook), and in, with the header validated against the frames before the caller sees
 * anything. Refused messages are drained completely, counted and logged. */
#include "tp_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *alloc_in_msg(size_t len, void *ud)
{
    zmq_msg_t *m = ud;
    if (zmq_msg_init_size(m, len) != 0)
        return NULL;
    return zmq_msg_data(m);
}

/* Waits until the socket accepts a message or the deadline passes. */
static int wait_writable(fl_tp_sock_t *s, int64_t deadline_ms)
{
    for (;;) {
        zmq_pollitem_t it = {s->zs, 0, ZMQ_POLLOUT, 0};
        int left = fl_deadline_left_ms(deadline_ms);
        int rc = zmq_poll(&it, 1, left);
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (rc < 0)
            return fl_fail(FL_EIO, "%s socket: poll: %s", s->name, zmq_strerror(zmq_errno()));
        if (rc > 0 && (it.revents & ZMQ_POLLOUT))
            return FL_OK;
        if (left == 0)
            return fl_fail(FL_ETIMEDOUT, "%s socket: send queue full until the deadline", s->name);
    }
}

static void release_all(fl_buf_t *frames, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fl_buf_release(&frames[i]);
}

/* Stamps the header (job, generation, sender on a stamped socket), sets its version and frame
 * table from the payload. Returns the payload's bytes. */
static uint64_t fill_header(const fl_tp_sock_t *s, fl_msg_hdr_t *h, const fl_buf_t *frames,
                            size_t n)
{
    if (s->stamped) {
        snprintf(h->job_id, sizeof h->job_id, "%s", s->job_id);
        h->generation = s->generation;
        h->sender = s->sender;
    }
    h->version = FL_MSG_VERSION;
    h->nframes = (uint32_t)n;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        h->frames[i].bytes = frames[i].len;
        if (h->frames[i].codec != FL_CODEC_LZ4)
            h->frames[i].raw_bytes = frames[i].len;
        bytes += frames[i].len;
    }
    return bytes;
}

/* Queues the first part (a ROUTER's routing id, else the header) once there is room, then the
 * header behind a routing id. FL_OK, or the failure (hdr is then still the caller's). */
static int send_head(fl_tp_sock_t *s, const fl_tp_route_t *to, zmq_msg_t *hdr, size_t n,
                     int64_t deadline_ms)
{
    /* Wait for room before the first frame: once it is queued, ZeroMQ accepts the rest of the
     * message without checking the high-water mark again, so parts never split. */
    int flags = ZMQ_DONTWAIT;
    for (;;) {
        int rc;
        if (to != NULL)
            rc = zmq_send(s->zs, to->id, to->len, flags | ZMQ_SNDMORE);
        else
            rc = zmq_msg_send(hdr, s->zs, flags | (n > 0 ? ZMQ_SNDMORE : 0));
        if (rc >= 0)
            break;
        int e = zmq_errno();
        /* A ROUTER serves many peers: one that does not read must not stall the others, and its
         * POLLOUT says nothing about this peer. */
        if (e == EAGAIN && s->kind == FL_TP_ROUTER)
            return fl_fail(FL_ETIMEDOUT, "%s socket: the peer's queue is full", s->name);
        if (e == EAGAIN) {
            if ((rc = wait_writable(s, deadline_ms)) != FL_OK)
                return rc;
            continue;
        }
        if (e == EHOSTUNREACH)
            return fl_fail(FL_EPEER, "%s socket: peer is not connected", s->name);
        return fl_fail(FL_EIO, "%s socket: send: %s", s->name, zmq_strerror(e));
    }
    if (to != NULL && zmq_msg_send(hdr, s->zs, flags | (n > 0 ? ZMQ_SNDMORE : 0)) < 0)
        return fl_fail(FL_EIO, "%s socket: send header: %s", s->name, zmq_strerror(zmq_errno()));
    return FL_OK;
}

/* Queues the payload frames behind the header: zero-copy where a frame carries a release hook
 * (the hook then belongs to ZeroMQ's message), copied otherwise. On a failure the frames not
 * yet handed to ZeroMQ are released. */
static int send_frames(fl_tp_sock_t *s, fl_buf_t *frames, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        zmq_msg_t part;
        int more = i + 1 < n ? ZMQ_SNDMORE : 0;
        if (frames[i].release != NULL) {
            if (zmq_msg_init_data(&part, frames[i].data, frames[i].len, frames[i].release,
                                  frames[i].hint) != 0) {
                int rc = fl_fail(FL_ENOMEM, "%s socket: zmq_msg_init_data", s->name);
                release_all(&frames[i], n - i);
                return rc;
            }
            /* The hook now belongs to ZeroMQ's message: it runs when that message closes. */
            memset(&frames[i], 0, sizeof frames[i]);
        } else {
            if (zmq_msg_init_size(&part, frames[i].len) != 0) {
                int rc = fl_fail(FL_ENOMEM, "%s socket: no memory for a %zu-byte frame", s->name,
                                 frames[i].len);
                release_all(&frames[i], n - i);
                return rc;
            }
            if (frames[i].len > 0)
                memcpy(zmq_msg_data(&part), frames[i].data, frames[i].len);
        }
        if (zmq_msg_send(&part, s->zs, ZMQ_DONTWAIT | more) < 0) {
            int rc = fl_fail(FL_EIO, "%s socket: send frame %zu: %s", s->name, i,
                             zmq_strerror(zmq_errno()));
            zmq_msg_close(&part);
            release_all(&frames[i + 1], n - i - 1);
            return rc;
        }
    }
    return FL_OK;
}

int fl_tp_send(fl_tp_sock_t *s, const fl_tp_route_t *to, fl_msg_hdr_t *h, fl_buf_t *frames,
               size_t n, int64_t deadline_ms)
{
    if (n > FL_MSG_MAX_FRAMES) {
        release_all(frames, n);
        return fl_fail(FL_EINVAL, "%s socket: %zu payload frames, at most %d", s->name, n,
                       FL_MSG_MAX_FRAMES);
    }
    uint64_t bytes = fill_header(s, h, frames, n);
    zmq_msg_t hdr;
    size_t hlen = 0;
    int rc = fl_msg_encode(h, alloc_in_msg, &hdr, &hlen);
    if (rc != FL_OK) {
        release_all(frames, n);
        return fl_fail_ctx(rc, "%s socket: send %s", s->name, fl_msg_type_name(h->type));
    }
    if ((rc = send_head(s, to, &hdr, n, deadline_ms)) != FL_OK) {
        zmq_msg_close(&hdr);
        release_all(frames, n);
        return rc;
    }
    rc = send_frames(s, frames, n);
    zmq_msg_close(&hdr);
    if (rc != FL_OK)
        return rc;
    fl_ctx_count(s->ctx, FL_STAT_MSGS_SENT, 1);
    fl_ctx_count(s->ctx, FL_STAT_BYTES_SENT, bytes);
    return FL_OK;
}

static fl_stat_t fault_stat(fl_msg_fault_t f)
{
    switch (f) {
    case FL_FAULT_MAGIC: return FL_STAT_BAD_MAGIC;
    case FL_FAULT_VERSION: return FL_STAT_BAD_VERSION;
    case FL_FAULT_FRAMES: return FL_STAT_BAD_FRAMES;
    case FL_FAULT_SIZE: return FL_STAT_OVERSIZED;
    default: return FL_STAT_BAD_HEADER;
    }
}

void fl_tp_msg_close(fl_tp_msg_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->nframes; i++)
        zmq_msg_close(&m->frames[i]);
    m->nframes = 0;
    fl_msg_hdr_deinit(&m->hdr);
}

/* What one message took off a guarded socket, for its guard's count of the bytes a peer makes
 * the process hold (tp_guard.c). */
typedef struct tally {
    int fd; /* the connection it came from (ZMQ_SRCFD), -1 when unknown */
    uint64_t bytes;
    uint64_t frames;
    char addr[48]; /* its address, for a cut (tp_refuse.c) */
    fl_stat_t why; /* the refusal's kind, FL_STAT_COUNT when taken */
} tally_t;

static void tally_add(tally_t *t, const zmq_msg_t *part)
{
    t->bytes += zmq_msg_size((zmq_msg_t *)part);
    t->frames++;
}

/* Reads the remaining parts of a message that is being refused, one at a time (each closed at
 * once), so the next receive starts at a message boundary. */
static void drain(void *zs, tally_t *t)
{
    int more = 1;
    size_t len = sizeof more;
    while (zmq_getsockopt(zs, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, zs, 0) < 0) {
            zmq_msg_close(&part);
            return;
        }
        tally_add(t, &part);
        zmq_msg_close(&part);
        len = sizeof more;
    }
}

static bool has_more(void *zs)
{
    int more = 0;
    size_t len = sizeof more;
    zmq_getsockopt(zs, ZMQ_RCVMORE, &more, &len);
    return more != 0;
}

static int refuse(fl_tp_sock_t *s, fl_tp_msg_t *m, tally_t *t, fl_stat_t stat, int rc)
{
    fl_ctx_count(s->ctx, stat, 1);
    t->why = stat;
    FL_DEBUG(s->ctx, "%s socket: refused a message (%s): %s", s->name, fl_stat_name(stat),
             fl_last_error());
    for (size_t i = 0; i < m->nframes; i++)
        zmq_msg_close(&m->frames[i]);
    m->nframes = 0;
    fl_msg_hdr_free_tables(&m->hdr);
    return rc;
}

/* Status of read_message when no message is waiting (not an error, and no detail text). */
#define NOT_READY 1

/* The ZAP handler names an authenticated peer by its key and binding (tp_curve.c), on the
 * sockets that bind: a router's and a data socket's. */
static void peer_of(const fl_tp_sock_t *s, zmq_msg_t *hdr, fl_tp_msg_t *m)
{
    if ((s->kind != FL_TP_ROUTER && s->kind != FL_TP_PULL) || fl_ctx_security(s->ctx) == NULL)
        return;
    const char *user = zmq_msg_gets(hdr, "User-Id");
    if (user != NULL)
        m->peer_bound = fl_tp_user_bound(user, m->peer_key, sizeof m->peer_key);
}

/* Reads one message if one is waiting (the first part without blocking, or with wait up to the
 * socket's RCVTIMEO; the rest of a message is always there once its first part is, ZeroMQ
 * delivers messages whole). */
static int read_parts(fl_tp_sock_t *s, fl_tp_msg_t *m, tally_t *t, bool wait)
{
    zmq_msg_t hdr;
    int rc;
    fl_msg_fault_t fault = FL_FAULT_NONE;

    memset(&m->route, 0, sizeof m->route);
    m->peer_key[0] = '\0';
    m->peer_bound = FL_TP_KEY_ANY;
    m->nframes = 0;
    if (s->kind == FL_TP_ROUTER) {
        int n = zmq_recv(s->zs, m->route.id, sizeof m->route.id, ZMQ_DONTWAIT);
        if (n < 0 && zmq_errno() == EAGAIN)
            return NOT_READY;
        if (n < 0)
            return fl_fail(FL_EIO, "%s socket: recv identity: %s", s->name,
                           zmq_strerror(zmq_errno()));
        m->route.len = (size_t)n > sizeof m->route.id ? sizeof m->route.id : (size_t)n;
        if (!has_more(s->zs))
            return refuse(s, m, t, FL_STAT_BAD_HEADER,
                          fl_fail(FL_EPROTO, "%s socket: message without a header frame", s->name));
    }
    zmq_msg_init(&hdr);
    if (zmq_msg_recv(&hdr, s->zs, s->kind == FL_TP_ROUTER || wait ? 0 : ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&hdr);
        if (e == EAGAIN || (wait && e == EINTR))
            return NOT_READY;
        return fl_fail(FL_EIO, "%s socket: recv header: %s", s->name, zmq_strerror(e));
    }
    if (s->guard != NULL) {
        t->fd = zmq_msg_get(&hdr, ZMQ_SRCFD);
        const char *addr = zmq_msg_gets(&hdr, "Peer-Address");
        snprintf(t->addr, sizeof t->addr, "%s", addr != NULL ? addr : "");
        tally_add(t, &hdr);
    }
    /* What strangers send a bound socket is bounded before it is parsed: no member's header
     * (the largest, a server's registration) comes near FL_MSG_HDR_MAX_IN. */
    if (s->kind == FL_TP_ROUTER && zmq_msg_size(&hdr) > FL_MSG_HDR_MAX_IN) {
        rc = fl_fail(FL_EPROTO, "%s socket: a header frame of %zu bytes, at most %d", s->name,
                     zmq_msg_size(&hdr), FL_MSG_HDR_MAX_IN);
        fault = FL_FAULT_SIZE;
        memset(&m->hdr, 0, sizeof m->hdr);
    } else {
        rc = fl_msg_decode(zmq_msg_data(&hdr), zmq_msg_size(&hdr), &m->hdr, &fault);
    }
    peer_of(s, &hdr, m);
    zmq_msg_close(&hdr);

    /* Take the payload frames even when the header was bad, up to the limit, then drain. */
    size_t sizes[FL_MSG_MAX_FRAMES];
    size_t arrived = 0;
    bool too_many = false;
    while (has_more(s->zs)) {
        if (m->nframes >= FL_MSG_MAX_FRAMES || m->nframes >= fl_ctx_max_frames(s->ctx)) {
            too_many = true;
            drain(s->zs, t);
            break;
        }
        zmq_msg_t *f = &m->frames[m->nframes];
        zmq_msg_init(f);
        if (zmq_msg_recv(f, s->zs, 0) < 0) {
            zmq_msg_close(f);
            refuse(s, m, t, FL_STAT_BAD_FRAMES, FL_EIO);
            return fl_fail(FL_EIO, "%s socket: recv frame: %s", s->name, zmq_strerror(zmq_errno()));
        }
        sizes[m->nframes] = zmq_msg_size(f);
        tally_add(t, f);
        m->nframes++;
        arrived++;
    }
    if (rc != FL_OK)
        return refuse(s, m, t, fault_stat(fault), rc);
    if (too_many)
        return refuse(s, m, t, FL_STAT_BAD_FRAMES,
                      fl_fail(FL_EPROTO, "%s socket: %s message from %d has more than %zu frames",
                              s->name, fl_msg_type_name(m->hdr.type), m->hdr.sender,
                              fl_ctx_max_frames(s->ctx)));
    if ((rc = fl_msg_check_frames(&m->hdr, sizes, arrived, s->max_msg_bytes, &fault)) != FL_OK)
        return refuse(s, m, t, fault_stat(fault),
                      fl_fail_ctx(rc, "%s socket: from sender %d", s->name, m->hdr.sender));
    if (s->expect_set &&
        (strcmp(m->hdr.job_id, s->expect_job) != 0 || m->hdr.generation != s->expect_gen))
        return refuse(s, m, t, FL_STAT_BAD_JOB,
                      fl_fail(FL_EPROTO,
                              "%s socket: %s message from sender %d of job '%s' generation %llu; "
                              "this is job '%s' generation %llu",
                              s->name, fl_msg_type_name(m->hdr.type), m->hdr.sender, m->hdr.job_id,
                              (unsigned long long)m->hdr.generation, s->expect_job,
                              (unsigned long long)s->expect_gen));
    uint64_t bytes = 0;
    for (size_t i = 0; i < arrived; i++)
        bytes += sizes[i];
    fl_ctx_count(s->ctx, FL_STAT_MSGS_RECV, 1);
    fl_ctx_count(s->ctx, FL_STAT_BYTES_RECV, bytes);
    return FL_OK;
}

static int read_message(fl_tp_sock_t *s, fl_tp_msg_t *m, bool wait)
{
    tally_t t = {.fd = -1, .bytes = 0, .frames = 0, .addr = "", .why = FL_STAT_COUNT};
    int rc = read_parts(s, m, &t, wait);
    if (s->guard != NULL && t.fd >= 0)
        fl_tp_guard_taken(s->guard, t.fd, t.bytes, t.frames);
    if (s->guard != NULL && t.why != FL_STAT_COUNT)
        fl_tp_refuse_note(s, t.fd, t.addr, t.why);
    return rc;
}

int fl_tp_recv(fl_tp_sock_t *s, fl_tp_msg_t *m, int64_t deadline_ms)
{
    m->nframes = 0;
    for (;;) {
        /* Try first: when a message is waiting (the common case in a busy collective) this
         * costs no poll system call. */
        int rc = read_message(s, m, false);
        if (rc != NOT_READY)
            return rc;
        zmq_pollitem_t it = {s->zs, 0, ZMQ_POLLIN, 0};
        int left = fl_deadline_left_ms(deadline_ms);
        rc = zmq_poll(&it, 1, left);
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (rc < 0)
            return fl_fail(FL_EIO, "%s socket: poll: %s", s->name, zmq_strerror(zmq_errno()));
        if (rc == 0 && left == 0)
            return fl_fail(FL_ETIMEDOUT, "%s socket: no message before the deadline", s->name);
    }
}

int fl_tp_try_recv(fl_tp_sock_t *s, fl_tp_msg_t *m)
{
    m->nframes = 0;
    int rc = read_message(s, m, false);
    return rc == NOT_READY ? FL_ETIMEDOUT : rc;
}

int fl_tp_recv_for(fl_tp_sock_t *s, fl_tp_msg_t *m, int timeout_ms)
{
    if (s->kind == FL_TP_ROUTER)
        return fl_tp_recv(s, m, fl_deadline_in(timeout_ms));
    m->nframes = 0;
    if (timeout_ms < 0)
        timeout_ms = 0;
    if (s->rcvtimeo != timeout_ms) {
        /* Only the header's receive waits: the rest of a message is there with it. */
        if (zmq_setsockopt(s->zs, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) != 0)
            return fl_fail(FL_EIO, "%s socket: set RCVTIMEO: %s", s->name,
                           zmq_strerror(zmq_errno()));
        s->rcvtimeo = timeout_ms;
    }
    int rc = read_message(s, m, true);
    return rc == NOT_READY ? FL_ETIMEDOUT : rc;
}

int fl_tp_poll(fl_tp_sock_t *const *socks, size_t n, int timeout_ms, bool *ready)
{
    zmq_pollitem_t stack[16];
    zmq_pollitem_t *items = stack;
    if (n > FL_TP_POLL_MAX)
        return fl_fail(FL_EINVAL, "poll: %zu sockets, at most %d", n, FL_TP_POLL_MAX);
    if (n > 16 && (items = malloc(n * sizeof *items)) == NULL)
        return fl_fail(FL_ENOMEM, "poll: out of memory for %zu sockets", n);
    int64_t deadline = fl_deadline_in(timeout_ms);
    int rc;
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            items[i].socket = socks[i]->zs;
            items[i].fd = 0;
            items[i].events = ZMQ_POLLIN;
            items[i].revents = 0;
        }
        rc = zmq_poll(items, (int)n, fl_deadline_left_ms(deadline));
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (rc < 0) {
            rc = fl_fail(FL_EIO, "poll: %s", zmq_strerror(zmq_errno()));
            break;
        }
        for (size_t i = 0; i < n; i++)
            ready[i] = (items[i].revents & ZMQ_POLLIN) != 0;
        break;
    }
    if (items != stack)
        free(items);
    return rc;
}

int fl_tp_send_raw(fl_tp_sock_t *s, const void *const *parts, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (zmq_send(s->zs, parts[i], sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return fl_fail(FL_EIO, "%s socket: raw send: %s", s->name, zmq_strerror(zmq_errno()));
    }
    return FL_OK;
}
