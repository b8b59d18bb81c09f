/* Membership: the member side of the coordinator protocol, shared by ranks (the communicator,
 * the parameter-server client) and parameter-server processes. Join: register, heartbeat while
 * the others arrive, take the welcome (or the coordinator's refusal). Then a control thread
 * heartbeats with the owner's status, watches the coordinator's heartbeats, and turns what it
 * hears into events on a pipe the owner polls: a fatal error, the end of the job, and, for
 * members that reconnect, the loss of the coordinator and the welcome of its successor. */
#include "tp_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

enum { CMD_STOP = 1 };

/* Free text into a fixed field, cut at the field's size. */
static void put_text(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}


struct fl_tp_member {
    fl_ctx_t *ctx;
    char coordinator[FL_ENDPOINT_MAX];
    char job_id[FL_JOB_MAX];
    char name[96];
    int32_t sender;
    int rendezvous_timeout_ms;
    int reconnect_timeout_ms;

    fl_msg_hdr_t reg; /* the registration, kept for reconnects */
    bool have_reg;

    /* From the latest welcome. */
    uint64_t generation;
    int hb_ms;
    int hb_timeout_ms;

    fl_tp_sock_t *coord; /* DEALER; owned by the control thread once it runs */
    fl_tp_sock_t *ev_tx, *ev_rx;
    fl_tp_sock_t *cmd_tx, *cmd_rx;
    pthread_mutex_t cmd_lock; /* cmd_tx is used by cancel (any thread) and stop */
    pthread_t thread;
    bool started;

    /* Taps: more event pipes (sub-communicators, one per thread) that hear the fatal events.
     * The control thread sends on them under tap_lock; the owners read their own rx end. */
    pthread_mutex_t tap_lock;
    fl_tp_sock_t *tap_tx[FL_TP_MEMBER_MAX_TAPS];
    fl_tp_sock_t *tap_rx[FL_TP_MEMBER_MAX_TAPS];
    fl_msg_hdr_t fatal; /* the first fatal event posted, replayed to later taps */
    bool have_fatal;
    unsigned tap_serial;

    fl_tp_status_t status;
};

void fl_tp_member_opts_init(fl_tp_member_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->job_id = "flodl";
    o->name = "member";
    o->sender = -1;
    o->rendezvous_timeout_ms = 300000;
}

static int make_pipe(fl_tp_member_t *m, const char *what, fl_tp_sock_t **rx, fl_tp_sock_t **tx)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://flodl-member-%s-%p", what, (void *)m);
    int rc = fl_tp_sock_create(m->ctx, FL_TP_PAIR, &t, what, rx);
    if (rc == FL_OK)
        rc = fl_tp_sock_bind(*rx, ep, NULL, 0);
    if (rc == FL_OK)
        rc = fl_tp_sock_create(m->ctx, FL_TP_PAIR, &t, what, tx);
    if (rc == FL_OK)
        rc = fl_tp_sock_connect(*tx, ep);
    return rc;
}

int fl_tp_member_create(fl_ctx_t *ctx, const fl_tp_member_opts_t *o, fl_tp_member_t **out)
{
    *out = NULL;
    fl_tp_endpoint_t ep;
    if (o->coordinator == NULL)
        return fl_fail(FL_EINVAL, "%s: no coordinator endpoint given", o->name);
    if (fl_tp_endpoint_parse(o->coordinator, &ep) != FL_OK)
        return fl_fail_ctx(FL_EINVAL, "%s: coordinator", o->name);
    if (o->job_id == NULL || o->job_id[0] == '\0' || strlen(o->job_id) >= FL_JOB_MAX)
        return fl_fail(FL_EINVAL, "%s: job id must be 1..%d bytes", o->name, FL_JOB_MAX - 1);
    if (o->rendezvous_timeout_ms < 1 || o->reconnect_timeout_ms < 0)
        return fl_fail(FL_EINVAL, "%s: rendezvous timeout must be positive and the reconnect "
                                  "timeout not negative",
                       o->name);
    fl_tp_member_t *m = calloc(1, sizeof *m);
    if (m == NULL)
        return fl_fail(FL_ENOMEM, "%s: out of memory", o->name);
    m->ctx = ctx;
    pthread_mutex_init(&m->cmd_lock, NULL);
    pthread_mutex_init(&m->tap_lock, NULL);
    snprintf(m->coordinator, sizeof m->coordinator, "%s", o->coordinator);
    snprintf(m->job_id, sizeof m->job_id, "%s", o->job_id);
    snprintf(m->name, sizeof m->name, "%s", o->name);
    m->sender = o->sender;
    m->rendezvous_timeout_ms = o->rendezvous_timeout_ms;
    m->reconnect_timeout_ms = o->reconnect_timeout_ms;
    atomic_store(&m->status.waiting_on, -1);
    int rc;
    if ((rc = make_pipe(m, "events", &m->ev_rx, &m->ev_tx)) != FL_OK ||
        (rc = make_pipe(m, "commands", &m->cmd_rx, &m->cmd_tx)) != FL_OK) {
        fl_tp_member_destroy(&m);
        return rc;
    }
    *out = m;
    return FL_OK;
}

static int open_coord(fl_tp_member_t *m)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.max_msg_bytes = COORD_MAX_MSG;
    t.linger_ms = 1000;
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

static void send_heartbeat(fl_tp_member_t *m)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, m->sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", m->job_id);
    h.u.heartbeat.op = atomic_load_explicit(&m->status.op, memory_order_relaxed);
    h.u.heartbeat.op_seq = atomic_load_explicit(&m->status.seq, memory_order_relaxed);
    h.u.heartbeat.op_step = atomic_load_explicit(&m->status.step, memory_order_relaxed);
    h.u.heartbeat.waiting_on = atomic_load_explicit(&m->status.waiting_on, memory_order_relaxed);
    /* A full queue means the coordinator is not reading; dropping a heartbeat is right then. */
    fl_tp_send(m->coord, NULL, &h, NULL, 0, fl_deadline_in(0));
}

/* Checks the welcome's heartbeat settings and adopts its generation. */
static int take_welcome(fl_tp_member_t *m, const fl_msg_hdr_t *h)
{
    const fl_msg_welcome_t *w = &h->u.welcome;
    if (w->heartbeat_ms < 1 || w->heartbeat_timeout_ms <= w->heartbeat_ms)
        return fl_fail(FL_EPROTO, "%s: coordinator %s sent heartbeat %u ms, timeout %u ms",
                       m->name, m->coordinator, w->heartbeat_ms, w->heartbeat_timeout_ms);
    m->generation = h->generation;
    m->hb_ms = (int)w->heartbeat_ms;
    m->hb_timeout_ms = (int)w->heartbeat_timeout_ms;
    fl_tp_sock_set_stamp(m->coord, m->job_id, m->generation, m->sender);
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
            *welcome = msg->hdr; /* the tables move to the caller */
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
        rc = fl_fail(FL_EPEER, "%s: coordinator %s is shutting down: %s", m->name,
                     m->coordinator, msg->hdr.u.shutdown.text);
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
    default:
        break;
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
    int n = fl_tp_poll(socks, socks[2] != NULL ? 3 : 2, (int)(wake > now ? wake - now : 0),
                       ready);
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
        FL_WARN(m->ctx, "%s: no answer yet from the coordinator at %s after %lld s "
                        "(waiting up to %d s: is flodl-ps running there?)",
                m->name, m->coordinator, (long long)((now - j->started) / 1000),
                j->timeout_ms / 1000);
    else
        FL_WARN(m->ctx, "%s: registered with the coordinator at %s, waiting for the "
                        "others for %lld s: %s",
                m->name, m->coordinator, (long long)((now - j->started) / 1000),
                j->progress[0] ? j->progress : "no word yet");
    j->next_note = now + JOIN_NOTE_MS;
}

static int join_timeout(fl_tp_member_t *m, const join_t *j)
{
    if (j->heard)
        return fl_fail(FL_ETIMEDOUT, "%s: rendezvous with coordinator %s timed out after %d ms: "
                                     "%s",
                       m->name, m->coordinator, j->timeout_ms, j->progress);
    return fl_fail(FL_ETIMEDOUT, "%s: no answer from the coordinator at %s within %d "
                                 "ms (is flodl-ps running and reachable, and does its "
                                 "security match: this process uses %s?)",
                   m->name, m->coordinator, j->timeout_ms,
                   fl_tp_curve_on(m->ctx) ? "CURVE keys whose client key must be in "
                                            "its allowlist"
                                          : "plain text");
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
        send_heartbeat(m);
        j->next_hb = now + JOIN_HEARTBEAT_MS;
    }
}

/* Registers and waits for the welcome until deadline. With cmd set, a stop command ends the
 * wait (FL_ECLOSED). Returns FL_OK with *welcome filled, or the refusal / timeout. */
static int join_loop(fl_tp_member_t *m, int64_t deadline, int timeout_ms, fl_tp_sock_t *cmd,
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
    return join_loop(m, fl_deadline_in(m->rendezvous_timeout_ms), m->rendezvous_timeout_ms,
                     m->cmd_rx, welcome);
}

void fl_tp_member_cancel(fl_tp_member_t *m)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, m->sender);
    h.u.shutdown.code = 1;
    put_text(h.u.shutdown.text, sizeof h.u.shutdown.text, "cancelled");
    pthread_mutex_lock(&m->cmd_lock);
    fl_tp_send(m->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(1000));
    pthread_mutex_unlock(&m->cmd_lock);
}

static bool is_fatal(const fl_msg_hdr_t *h)
{
    return h->type == FL_MSG_ERROR || (h->type == FL_MSG_SHUTDOWN && h->u.shutdown.code == 0);
}

static void post(fl_tp_member_t *m, fl_msg_hdr_t *h)
{
    atomic_fetch_add(&m->status.posted, 1);
    if (fl_tp_send(m->ev_tx, NULL, h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
        FL_ERROR(m->ctx, "%s: could not pass on a %s event: %s", m->name,
                 fl_msg_type_name(h->type), fl_last_error());
    if (!is_fatal(h))
        return;
    pthread_mutex_lock(&m->tap_lock);
    if (!m->have_fatal) {
        m->fatal = *h; /* error and shutdown events own no heap memory */
        m->have_fatal = true;
    }
    for (int t = 0; t < FL_TP_MEMBER_MAX_TAPS; t++)
        if (m->tap_tx[t] != NULL)
            fl_tp_send(m->tap_tx[t], NULL, h, NULL, 0, fl_deadline_in(1000));
    pthread_mutex_unlock(&m->tap_lock);
}

int fl_tp_member_tap(fl_tp_member_t *m, fl_tp_sock_t **out)
{
    *out = NULL;
    pthread_mutex_lock(&m->tap_lock);
    int t = 0;
    while (t < FL_TP_MEMBER_MAX_TAPS && m->tap_tx[t] != NULL)
        t++;
    if (t == FL_TP_MEMBER_MAX_TAPS) {
        pthread_mutex_unlock(&m->tap_lock);
        return fl_fail(FL_EINVAL, "%s: more than %d taps on the control thread's events",
                       m->name, FL_TP_MEMBER_MAX_TAPS);
    }
    char what[32];
    snprintf(what, sizeof what, "tap-%u", m->tap_serial++);
    int rc = make_pipe(m, what, &m->tap_rx[t], &m->tap_tx[t]);
    if (rc == FL_OK && m->have_fatal)
        rc = fl_tp_send(m->tap_tx[t], NULL, &m->fatal, NULL, 0, fl_deadline_in(1000));
    if (rc != FL_OK) {
        fl_tp_sock_destroy(&m->tap_rx[t]);
        fl_tp_sock_destroy(&m->tap_tx[t]);
    } else {
        *out = m->tap_rx[t];
    }
    pthread_mutex_unlock(&m->tap_lock);
    return rc;
}

void fl_tp_member_untap(fl_tp_member_t *m, fl_tp_sock_t **tap)
{
    if (tap == NULL || *tap == NULL)
        return;
    pthread_mutex_lock(&m->tap_lock);
    for (int t = 0; t < FL_TP_MEMBER_MAX_TAPS; t++) {
        if (m->tap_rx[t] == *tap) {
            fl_tp_sock_destroy(&m->tap_tx[t]);
            fl_tp_sock_destroy(&m->tap_rx[t]);
        }
    }
    pthread_mutex_unlock(&m->tap_lock);
    *tap = NULL;
}

static void post_error(fl_tp_member_t *m, int code, int about, const char *host,
                       const char *text)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, m->sender);
    h.u.error.code = code;
    h.u.error.about_rank = about;
    put_text(h.u.error.host, sizeof h.u.error.host, host ? host : "");
    put_text(h.u.error.text, sizeof h.u.error.text, text);
    post(m, &h);
}

static void post_shutdown(fl_tp_member_t *m, int code, const char *text)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, m->sender);
    h.u.shutdown.code = code;
    put_text(h.u.shutdown.text, sizeof h.u.shutdown.text, text);
    post(m, &h);
}

static void leave(fl_tp_member_t *m, int code, const char *text)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, m->sender);
    h.u.shutdown.code = code;
    put_text(h.u.shutdown.text, sizeof h.u.shutdown.text, text);
    if (fl_tp_send(m->coord, NULL, &h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
        FL_WARN(m->ctx, "%s: could not tell the coordinator we leave: %s", m->name,
                fl_last_error());
}

/* The coordinator is gone (why). Members that reconnect register again until the reconnect
 * deadline; the others fail. Returns true when the control loop goes on (rejoined). */
static bool coordinator_lost(fl_tp_member_t *m, const char *why, bool *stop)
{
    char text[2400];
    if (m->reconnect_timeout_ms <= 0) {
        FL_ERROR(m->ctx, "%s", why);
        post_error(m, FL_EPEER, -1, "", why);
        return false;
    }
    snprintf(text, sizeof text, "%s; registering again for up to %d ms", why,
             m->reconnect_timeout_ms);
    FL_WARN(m->ctx, "%s", text);
    post_shutdown(m, FL_TP_MEMBER_LOST, text);
    fl_msg_hdr_t welcome;
    int rc = join_loop(m, fl_deadline_in(m->reconnect_timeout_ms), m->reconnect_timeout_ms,
                       m->cmd_rx, &welcome);
    if (rc == FL_OK) {
        FL_INFO(m->ctx, "%s: rejoined coordinator %s (generation %llx)", m->name,
                m->coordinator, (unsigned long long)m->generation);
        post(m, &welcome);
        fl_msg_hdr_deinit(&welcome);
        return true;
    }
    if (rc == FL_ECLOSED) {
        *stop = true;
        return false;
    }
    snprintf(text, sizeof text, "%s; not back: %s", why, fl_last_error());
    FL_ERROR(m->ctx, "%s", text);
    post_error(m, rc == FL_ETIMEDOUT ? FL_EPEER : rc, -1, "", text);
    return false;
}

/* This thread did not run for `gap` ms, past the coordinator's heartbeat timeout: the process
 * was frozen (SIGSTOP, a paused VM, a swapped-out host), so the coordinator has declared it
 * dead and the job went on or failed without it. Registering again would only wait for a
 * coordinator whose job is over: the owner hears that it was declared dead (the coordinator's
 * own words when they are queued on the socket) and fails. */
static void frozen(fl_tp_member_t *m, int64_t gap)
{
    char text[FL_MSG_TEXT_MAX];
    snprintf(text, sizeof text, "%s declared dead by the coordinator: this process was frozen "
                                "for %lld ms, past the heartbeat timeout (%d ms)",
             m->name, (long long)gap, m->hb_timeout_ms);
    /* What arrived while frozen is still reaching the socket: read for a moment. */
    int64_t until = fl_deadline_in(300);
    fl_tp_msg_t msg;
    while (fl_tp_recv(m->coord, &msg, until) == FL_OK) {
        bool about_us = msg.hdr.type == FL_MSG_ERROR && msg.hdr.u.error.about_rank == m->sender &&
                        strstr(msg.hdr.u.error.text, "declared dead") != NULL;
        if (about_us)
            snprintf(text, sizeof text, "%.400s (this process was frozen for %lld ms)",
                     msg.hdr.u.error.text, (long long)gap);
        fl_tp_msg_close(&msg);
        if (about_us)
            break;
    }
    FL_ERROR(m->ctx, "%s", text);
    post_error(m, FL_EPEER, m->sender, "", text);
}

/* Whether the coordinator's socket holds a message not read yet: it ends a silence that the
 * clock alone would call too long. */
static bool coord_waiting(fl_tp_member_t *m)
{
    fl_tp_sock_t *s = m->coord;
    bool ready = false;
    return fl_tp_poll(&s, 1, 0, &ready) > 0 && ready;
}

static void *member_main(void *arg)
{
    fl_tp_member_t *m = arg;
    int64_t last_coord = fl_now_ms();
    int64_t last_turn = last_coord; /* this loop's last turn: a gap means we were frozen */
    int64_t next_hb = 0;
    bool failed = false; /* a fatal event was posted: nothing more to report */
    bool stop = false;
    int leave_code = 0;
    char leave_text[FL_MSG_TEXT_MAX] = "";
    while (!stop) {
        int64_t now = fl_now_ms();
        if (!failed && now - last_turn > m->hb_timeout_ms) {
            frozen(m, now - last_turn);
            failed = true;
        }
        last_turn = now;
        if (now >= next_hb) {
            send_heartbeat(m);
            next_hb = now + m->hb_ms;
        }
        /* What came while the last slice ended is read before the silence counts. */
        if (!failed && now - last_coord > m->hb_timeout_ms && !coord_waiting(m)) {
            char why[1200];
            snprintf(why, sizeof why, "%s: coordinator %s silent for %lld ms (timeout %d ms)",
                     m->name, m->coordinator, (long long)(now - last_coord), m->hb_timeout_ms);
            failed = !coordinator_lost(m, why, &stop);
            last_coord = last_turn = fl_now_ms();
            continue;
        }
        fl_tp_sock_t *socks[2] = {m->coord, m->cmd_rx};
        bool ready[2] = {false, false};
        int wait = (int)(next_hb - now);
        if (fl_tp_poll(socks, 2, wait > 0 ? wait : 0, ready) < 0) {
            FL_ERROR(m->ctx, "%s: control thread: %s", m->name, fl_last_error());
            usleep(10000); /* never spin on a failing poll */
            continue;
        }
        if (ready[1]) {
            fl_tp_msg_t c;
            if (fl_tp_recv(m->cmd_rx, &c, fl_deadline_in(0)) == FL_OK) {
                if (c.hdr.type == FL_MSG_SHUTDOWN) {
                    leave_code = c.hdr.u.shutdown.code;
                    put_text(leave_text, sizeof leave_text, c.hdr.u.shutdown.text);
                    stop = true;
                }
                fl_tp_msg_close(&c);
            }
            if (stop) {
                /* Say goodbye even after a failure, so the coordinator does not count a
                 * member that left as one more death. */
                leave(m, leave_code, leave_text);
                break;
            }
        }
        if (!ready[0])
            continue;
        fl_tp_msg_t msg;
        if (fl_tp_recv(m->coord, &msg, fl_deadline_in(0)) != FL_OK)
            continue;
        last_coord = fl_now_ms();
        char why[1200];
        switch (msg.hdr.type) {
        case FL_MSG_ERROR:
            if (!failed)
                post_error(m, msg.hdr.u.error.code < 0 ? msg.hdr.u.error.code : FL_EPEER,
                           msg.hdr.u.error.about_rank, msg.hdr.u.error.host,
                           msg.hdr.u.error.text);
            failed = true;
            FL_ERROR(m->ctx, "coordinator: %s", msg.hdr.u.error.text);
            break;
        case FL_MSG_SHUTDOWN:
            if (failed)
                break;
            if (msg.hdr.u.shutdown.code == 0) {
                post_shutdown(m, 0, msg.hdr.u.shutdown.text);
                failed = true; /* the job is over: nothing more to watch */
                break;
            }
            snprintf(why, sizeof why, "%s: coordinator ended the job: %s", m->name,
                     msg.hdr.u.shutdown.text);
            fl_tp_msg_close(&msg);
            failed = !coordinator_lost(m, why, &stop);
            last_coord = last_turn = fl_now_ms();
            continue;
        default:
            break; /* heartbeats: their arrival is what counts */
        }
        fl_tp_msg_close(&msg);
    }
    /* This thread owns the coordinator socket: close it here, lingering for the goodbye. */
    fl_tp_sock_destroy(&m->coord);
    return NULL;
}

int fl_tp_member_start(fl_tp_member_t *m)
{
    if (m->started)
        return FL_OK;
    if (m->coord == NULL || m->hb_ms < 1)
        return fl_fail(FL_EINVAL, "%s: start before a successful join", m->name);
    if (pthread_create(&m->thread, NULL, member_main, m) != 0)
        return fl_fail(FL_EIO, "%s: cannot start the control thread", m->name);
    m->started = true;
    return FL_OK;
}

fl_tp_sock_t *fl_tp_member_events(fl_tp_member_t *m)
{
    return m->ev_rx;
}

fl_tp_status_t *fl_tp_member_status(fl_tp_member_t *m)
{
    return &m->status;
}

uint64_t fl_tp_member_generation(const fl_tp_member_t *m)
{
    return m->generation;
}

void fl_tp_member_stop(fl_tp_member_t *m, int code, const char *text)
{
    if (m == NULL || !m->started)
        return;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, m->sender);
    h.u.shutdown.code = code;
    put_text(h.u.shutdown.text, sizeof h.u.shutdown.text, text ? text : "");
    pthread_mutex_lock(&m->cmd_lock);
    int rc = fl_tp_send(m->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(5000));
    pthread_mutex_unlock(&m->cmd_lock);
    if (rc != FL_OK)
        FL_ERROR(m->ctx, "%s: could not stop the control thread: %s", m->name, fl_last_error());
    pthread_join(m->thread, NULL);
    m->started = false;
}

void fl_tp_member_destroy(fl_tp_member_t **pm)
{
    if (pm == NULL || *pm == NULL)
        return;
    fl_tp_member_t *m = *pm;
    fl_tp_member_stop(m, 1, "destroyed");
    /* Still here only when the control thread never ran: drop a queued registration rather
     * than wait for a coordinator that never answered. */
    if (m->coord != NULL)
        fl_tp_sock_set_linger(m->coord, 0);
    fl_tp_sock_destroy(&m->coord);
    fl_tp_sock_destroy(&m->ev_rx);
    fl_tp_sock_destroy(&m->ev_tx);
    fl_tp_sock_destroy(&m->cmd_rx);
    fl_tp_sock_destroy(&m->cmd_tx);
    for (int t = 0; t < FL_TP_MEMBER_MAX_TAPS; t++) {
        fl_tp_sock_destroy(&m->tap_tx[t]);
        fl_tp_sock_destroy(&m->tap_rx[t]);
    }
    fl_msg_hdr_deinit(&m->reg);
    pthread_mutex_destroy(&m->cmd_lock);
    pthread_mutex_destroy(&m->tap_lock);
    free(m);
    *pm = NULL;
}
