/* Membership: the member side of the coordinator protocol, shared by ranks (the communicator,
 * the parameter-server client) and parameter-server processes. After the join (tp_join.c) a
 * control thread heartbeats with the owner's status, watches the coordinator's heartbeats, and
 * turns what it hears into events on a pipe the owner polls: a fatal error, the end of the job,
 * and, for members that reconnect, the loss of the coordinator and the welcome of its
 * successor. */
#include "tp_member_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CMD_STOP = 1 };

/* Free text into a fixed field, cut at the field's size. */
static void put_text(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

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
        return fl_fail(FL_EINVAL,
                       "%s: rendezvous timeout must be positive and the reconnect "
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

void fl_tp_member__heartbeat(fl_tp_member_t *m)
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
        FL_ERROR(m->ctx, "%s: could not pass on a %s event: %s", m->name, fl_msg_type_name(h->type),
                 fl_last_error());
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
        return fl_fail(FL_EINVAL, "%s: more than %d taps on the control thread's events", m->name,
                       FL_TP_MEMBER_MAX_TAPS);
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

static void post_error(fl_tp_member_t *m, int code, int about, const char *host, const char *text)
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
    int rc = fl_tp_member__join_loop(m, fl_deadline_in(m->reconnect_timeout_ms),
                                     m->reconnect_timeout_ms, m->cmd_rx, &welcome);
    if (rc == FL_OK) {
        FL_INFO(m->ctx, "%s: rejoined coordinator %s (generation %llx)", m->name, m->coordinator,
                (unsigned long long)m->generation);
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
    snprintf(text, sizeof text,
             "%s declared dead by the coordinator: this process was frozen "
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
            fl_tp_member__heartbeat(m);
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
                           msg.hdr.u.error.about_rank, msg.hdr.u.error.host, msg.hdr.u.error.text);
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
        default: break; /* heartbeats: their arrival is what counts */
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

static void tp_member_destroy(fl_tp_member_t **pm)
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

void fl_tp_member_destroy(fl_tp_member_t **pm)
{
    fl_error_keep_begin();
    tp_member_destroy(pm);
    fl_error_keep_end();
}
