/* Joining the coordinator: register, heartbeat while the others arrive, take the welcome (or
 * the coordinator's refusal); the same again, with the token of the welcome, when a member
 * that reconnects lost its coordinator. What follows the join is tp_member.c's. */
#include "tp_member_int.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/types.h>

/* Often enough for any coordinator heartbeat timeout above ~0.5 s, which members cannot know
 * before the welcome. */
#define JOIN_HEARTBEAT_MS 200
/* A member that has heard nothing from the coordinator registers again (a duplicate
 * registration from the same connection is ignored by the coordinator), after 250 ms, then
 * backing off by doubling up to 4 s while the silence lasts; once heard from, after 4 s of
 * silence. */
#define JOIN_NOTE_MS 10000 /* how often a waiting member says so */
#define JOIN_RESEND_MIN_MS 250
#define JOIN_RESEND_MAX_MS 4000
#define COORD_MAX_MSG ((size_t)64 << 20)
/* After the coordinator closed a connection in its handshake (its guard, while it is busy or
 * flooded), ZeroMQ connects again after this, doubled at each closing up to the max. */
#define JOIN_RECONNECT_MS 100
#define JOIN_RECONNECT_MAX_MS 3200

/* 16 random bytes in hex, or "" when the system gives none. */
static void random_id(char out[33])
{
    uint8_t r[16];
    out[0] = '\0';
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof r; i++) {
        out[2 * i] = hex[r[i] >> 4];
        out[2 * i + 1] = hex[r[i] & 15];
    }
    out[2 * sizeof r] = '\0';
}

static int open_coord(fl_tp_member_t *m)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.max_msg_bytes = COORD_MAX_MSG;
    t.linger_ms = 1000;
    /* The coordinator knows a member by its routing id. ZeroMQ gives each connection a new one
     * unless the socket sets its own, so when a connection drops (ZMTP's heartbeat timing out
     * on a host short of CPU, a path that died) and ZeroMQ connects again by itself, the
     * coordinator would ignore the member's heartbeats and send to a route that is gone until
     * both sides time out. A random id, known to nobody else, keeps the route across the
     * socket's reconnects; a new socket gets a new one. Without random bytes, ZeroMQ's. */
    char id[33];
    random_id(id);
    if (id[0] != '\0')
        t.routing_id = id;
    else
        FL_WARN(m->ctx,
                "%s: no random bytes for a routing id (%s): a dropped connection to "
                "the coordinator will not keep this member's identity",
                m->name, strerror(errno));
    if (m->coord != NULL) {
        fl_tp_sock_set_linger(m->coord, 0);
        fl_tp_sock_destroy(&m->coord);
    }
    int rc = fl_tp_sock_create(m->ctx, FL_TP_DEALER, &t, "coordinator", &m->coord);
    fl_tp_sock_t *watch;
    if (rc == FL_OK) /* a refusal by the server ends the join at once */
        rc = fl_tp_sock_watch(m->coord, &watch);
    if (rc == FL_OK)
        rc = fl_tp_sock_connect(m->coord, m->coordinator);
    return rc;
}

static int send_register(fl_tp_member_t *m)
{
    fl_msg_hdr_t h = m->reg; /* shallow: the tables stay m->reg's */
    h.generation = 0;
    return fl_tp_send(m->coord, NULL, &h, NULL, 0, fl_deadline_in(1000));
}

/* Checks the welcome's heartbeat settings and adopts its generation. */
static int take_welcome(fl_tp_member_t *m, const fl_msg_hdr_t *h)
{
    const fl_msg_welcome_t *w = &h->u.welcome;
    if (w->heartbeat_ms < 1 || w->heartbeat_timeout_ms <= w->heartbeat_ms)
        return fl_fail(FL_EPROTO, "%s: coordinator %s sent heartbeat %u ms, timeout %u ms", m->name,
                       m->coordinator, w->heartbeat_ms, w->heartbeat_timeout_ms);
    m->generation = h->generation;
    /* Kept in memory only: it proves this member, and no other process, should the connection
     * be lost and the member register again (a restarted coordinator gives a new one). */
    snprintf(m->reg.u.reg.token, sizeof m->reg.u.reg.token, "%s", w->token);
    m->hb_ms = (int)w->heartbeat_ms;
    m->hb_timeout_ms = (int)w->heartbeat_timeout_ms;
    fl_tp_sock_set_stamp(m->coord, m->job_id, m->generation, m->sender);
    fl_tp_sock_set_reconnect_ivl(m->coord, JOIN_RECONNECT_MS); /* joined: no backoff left */
    fl_tp_sock_set_expect(m->coord, m->job_id, m->generation);
    return FL_OK;
}

/* A join's progress: what the coordinator said so far, and when to beat, to register again and
 * to tell the operator. */
typedef struct join {
    int64_t deadline;
    int timeout_ms;
    int64_t next_hb;
    int64_t last_heard;
    int resend_ms;
    bool heard;
    char progress[FL_MSG_MISSING_MAX + 64];
    int64_t started;
    int64_t next_note;
    int closed; /* connections the coordinator closed in their handshake, so far */
} join_t;

/* join_take's and join_read's answer while the welcome is still to come. */
#define JOIN_WAITING 1

/* One message from the coordinator: JOIN_WAITING, or how the join ends (FL_OK with *welcome
 * filled, or the refusal). Closes msg. */
static int join_take(fl_tp_member_t *m, join_t *j, fl_tp_msg_t *msg, fl_msg_hdr_t *welcome)
{
    int rc = JOIN_WAITING;
    j->heard = true;
    j->last_heard = fl_now_ms();
    /* Registered: the coordinator beats to us now, so only a long silence means it forgot us
     * (it restarted). */
    j->resend_ms = JOIN_RESEND_MAX_MS;
    switch (msg->hdr.type) {
    case FL_MSG_WELCOME:
        rc = take_welcome(m, &msg->hdr);
        if (rc == FL_OK) {
            *welcome = msg->hdr; /* the tables move to the caller; the token stays here */
            memset(welcome->u.welcome.token, 0, sizeof welcome->u.welcome.token);
            memset(&msg->hdr, 0, sizeof msg->hdr);
        }
        break;
    case FL_MSG_ERROR: {
        int code = msg->hdr.u.error.code < 0 ? msg->hdr.u.error.code : FL_EPEER;
        rc = fl_fail(code, "%s: coordinator %s refused: %s", m->name, m->coordinator,
                     msg->hdr.u.error.text);
        break;
    }
    case FL_MSG_SHUTDOWN:
        rc = fl_fail(FL_EPEER, "%s: coordinator %s is shutting down: %s", m->name, m->coordinator,
                     msg->hdr.u.shutdown.text);
        break;
    case FL_MSG_HEARTBEAT:
        if (m->reg.u.reg.role == FL_ROLE_WORKER)
            snprintf(j->progress, sizeof j->progress, "%u of %d ranks registered, missing %s",
                     msg->hdr.u.heartbeat.registered, m->reg.u.reg.world_size,
                     msg->hdr.u.heartbeat.missing);
        else
            snprintf(j->progress, sizeof j->progress, "%u ranks registered, missing %s",
                     msg->hdr.u.heartbeat.registered, msg->hdr.u.heartbeat.missing);
        break;
    default: break;
    }
    fl_tp_msg_close(msg);
    return rc;
}

/* Everything queued from the coordinator: JOIN_WAITING, or how the join ends. */
static int join_read(fl_tp_member_t *m, join_t *j, fl_msg_hdr_t *welcome)
{
    for (;;) {
        fl_tp_msg_t msg;
        int rc = fl_tp_try_recv(m->coord, &msg);
        if (rc == FL_ETIMEDOUT)
            return JOIN_WAITING;
        if (rc == FL_EPROTO)
            continue;
        if (rc != FL_OK)
            return fl_fail_ctx(rc, "%s: rendezvous", m->name);
        if ((rc = join_take(m, j, &msg, welcome)) != JOIN_WAITING)
            return rc;
    }
}

/* Waits on the coordinator's socket, its handshake watch and the command pipe (socks[2], when
 * there is one) until the next heartbeat or the deadline. FL_OK, a refused handshake, or
 * FL_ECLOSED for a stop command. */
static int join_poll(fl_tp_member_t *m, const join_t *j, fl_tp_sock_t **socks, bool *ready)
{
    int64_t now = fl_now_ms();
    int64_t wake = j->next_hb < j->deadline ? j->next_hb : j->deadline;
    int n = fl_tp_poll(socks, socks[2] != NULL ? 3 : 2, (int)(wake > now ? wake - now : 0), ready);
    if (n < 0)
        return fl_fail_ctx(n, "%s: rendezvous", m->name);
    int rc;
    if (ready[1] && (rc = fl_tp_sock_handshake_check(m->coord, m->coordinator)) != FL_OK)
        return fl_fail_ctx(rc, "%s: register with coordinator", m->name);
    if (ready[2]) {
        fl_tp_msg_t c;
        if (fl_tp_recv(socks[2], &c, fl_deadline_in(0)) == FL_OK) {
            bool stop = c.hdr.type == FL_MSG_SHUTDOWN;
            fl_tp_msg_close(&c);
            if (stop)
                return fl_fail(FL_ECLOSED, "%s: stopped while joining", m->name);
        }
    }
    return FL_OK;
}

/* An operator watching a member wait hears why: after a second without an answer, then every
 * JOIN_NOTE_MS. */
static void join_note(fl_tp_member_t *m, join_t *j, int64_t now)
{
    if (now < j->next_note || now >= j->deadline)
        return;
    if (!j->heard)
        FL_WARN(m->ctx,
                "%s: no answer yet from the coordinator at %s after %lld s "
                "(waiting up to %d s: is flodl-ps running there?)",
                m->name, m->coordinator, (long long)((now - j->started) / 1000),
                j->timeout_ms / 1000);
    else
        FL_WARN(m->ctx,
                "%s: registered with the coordinator at %s, waiting for the "
                "others for %lld s: %s",
                m->name, m->coordinator, (long long)((now - j->started) / 1000),
                j->progress[0] ? j->progress : "no word yet");
    j->next_note = now + JOIN_NOTE_MS;
}

static int join_timeout(fl_tp_member_t *m, const join_t *j)
{
    if (j->heard)
        return fl_fail(FL_ETIMEDOUT,
                       "%s: rendezvous with coordinator %s timed out after %d ms: "
                       "%s",
                       m->name, m->coordinator, j->timeout_ms, j->progress);
    return fl_fail(FL_ETIMEDOUT,
                   "%s: no answer from the coordinator at %s within %d "
                   "ms (is flodl-ps running and reachable, and does its "
                   "security match: this process uses %s?)",
                   m->name, m->coordinator, j->timeout_ms,
                   fl_tp_curve_on(m->ctx) ? "CURVE keys whose client key must be in "
                                            "its allowlist"
                                          : "plain text");
}

/* A connection closed in its handshake: ZeroMQ connects again by itself; the wait before it
 * grows, so that many ranks do not press a busy coordinator in step. Said once. */
static void join_backoff(fl_tp_member_t *m, join_t *j)
{
    int closed = fl_tp_sock_handshakes_closed(m->coord);
    if (closed == j->closed)
        return;
    if (j->closed == 0)
        FL_WARN(m->ctx,
                "%s: the coordinator at %s closed this connection in its handshake (busy, or "
                "flooded with connections); trying again with backoff until the rendezvous "
                "deadline (%d s)",
                m->name, m->coordinator, j->timeout_ms / 1000);
    j->closed = closed;
    int ivl = JOIN_RECONNECT_MS;
    for (int i = 1; i < closed && ivl < JOIN_RECONNECT_MAX_MS; i++)
        ivl *= 2;
    fl_tp_sock_set_reconnect_ivl(m->coord,
                                 ivl < JOIN_RECONNECT_MAX_MS ? ivl : JOIN_RECONNECT_MAX_MS);
}

/* Registers again after a silence, and beats while waiting. */
static void join_keepalive(fl_tp_member_t *m, join_t *j, int64_t now)
{
    if (now - j->last_heard >= j->resend_ms) {
        /* A coordinator that restarted has forgotten us; one that is merely slow ignores the
         * repeat. */
        send_register(m);
        j->last_heard = now;
        j->resend_ms =
            j->resend_ms * 2 > JOIN_RESEND_MAX_MS ? JOIN_RESEND_MAX_MS : j->resend_ms * 2;
    }
    if (now >= j->next_hb) {
        fl_tp_member__heartbeat(m);
        j->next_hb = now + JOIN_HEARTBEAT_MS;
    }
}

/* Registers and waits for the welcome until deadline. With cmd set, a stop command ends the
 * wait (FL_ECLOSED). Returns FL_OK with *welcome filled, or the refusal / timeout. */
int fl_tp_member__join_loop(fl_tp_member_t *m, int64_t deadline, int timeout_ms, fl_tp_sock_t *cmd,
                            fl_msg_hdr_t *welcome)
{
    int rc = open_coord(m);
    if (rc == FL_OK)
        rc = send_register(m);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "%s: register with coordinator %s", m->name, m->coordinator);
    join_t j = {.deadline = deadline, .timeout_ms = timeout_ms};
    j.next_hb = fl_now_ms() + JOIN_HEARTBEAT_MS;
    j.last_heard = fl_now_ms();
    j.resend_ms = JOIN_RESEND_MIN_MS;
    j.started = fl_now_ms();
    j.next_note = j.started + 1000;
    fl_tp_sock_t *socks[3] = {m->coord, NULL, cmd};
    if ((rc = fl_tp_sock_watch(m->coord, &socks[1])) != FL_OK)
        return fl_fail_ctx(rc, "%s: rendezvous", m->name);
    for (;;) {
        /* The time before the look: past the deadline the poll does not wait but still takes
         * what came, so a welcome that came in the last slice is not a timeout. */
        bool late = fl_now_ms() >= deadline;
        bool ready[3] = {false, false, false};
        if ((rc = join_poll(m, &j, socks, ready)) != FL_OK)
            return rc;
        join_backoff(m, &j);
        if (ready[0] && (rc = join_read(m, &j, welcome)) != JOIN_WAITING)
            return rc;
        int64_t now = fl_now_ms();
        join_note(m, &j, now);
        if (late)
            return join_timeout(m, &j);
        join_keepalive(m, &j, now);
    }
}

int fl_tp_member_join(fl_tp_member_t *m, const fl_msg_register_t *reg, fl_msg_hdr_t *welcome)
{
    memset(welcome, 0, sizeof *welcome);
    if (m->started)
        return fl_fail(FL_EINVAL, "%s: already joined", m->name);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, m->sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", m->job_id);
    h.u.reg = *reg;
    fl_msg_hdr_deinit(&m->reg);
    if (fl_msg_hdr_copy(&m->reg, &h) != FL_OK)
        return fl_fail(FL_ENOMEM, "%s: out of memory for the registration", m->name);
    m->have_reg = true;
    return fl_tp_member__join_loop(m, fl_deadline_in(m->rendezvous_timeout_ms),
                                   m->rendezvous_timeout_ms, m->cmd_rx, welcome);
}
