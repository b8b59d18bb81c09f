/* The control thread of a rank: it owns the coordinator socket after the rendezvous, sends a
 * heartbeat every hb_ms carrying the collective in flight, watches for the coordinator's
 * heartbeats, and turns a dead peer, an aborted job or a silent coordinator into one event on
 * the caller's abort pipe. Leaving the job (fl_comm_destroy) goes through it too. */
#include "comm_int.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { CMD_STOP = 1 };

static void forward(fl_comm_t *c, int code, int about, const char *host, const char *text)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, c->rank);
    h.u.error.code = code;
    h.u.error.about_rank = about;
    snprintf(h.u.error.host, sizeof h.u.error.host, "%s", host ? host : "");
    snprintf(h.u.error.text, sizeof h.u.error.text, "%s", text);
    if (fl_tp_send(c->ev_tx, NULL, &h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
        FL_ERROR(c->ctx, "could not pass on '%s': %s", text, fl_last_error());
}

static void send_heartbeat(fl_comm_t *c)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, c->rank);
    h.u.heartbeat.op = atomic_load_explicit(&c->cur_coll, memory_order_relaxed);
    h.u.heartbeat.op_seq = atomic_load_explicit(&c->cur_seq, memory_order_relaxed);
    h.u.heartbeat.op_step = atomic_load_explicit(&c->cur_step, memory_order_relaxed);
    h.u.heartbeat.waiting_on = atomic_load_explicit(&c->cur_waiting, memory_order_relaxed);
    /* A full queue means the coordinator is not reading; dropping a heartbeat is right then. */
    fl_tp_send(c->coord, NULL, &h, NULL, 0, fl_deadline_in(0));
}

static void leave(fl_comm_t *c, bool failed)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, c->rank);
    h.u.shutdown.code = failed ? 1 : 0;
    snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "rank %d leaves after %llu "
                                                          "collectives%s",
             c->rank, (unsigned long long)c->seq, failed ? " (after a failure)" : "");
    if (fl_tp_send(c->coord, NULL, &h, NULL, 0, fl_deadline_in(1000)) != FL_OK)
        FL_WARN(c->ctx, "could not tell the coordinator we leave: %s", fl_last_error());
}

static void on_coord_msg(fl_comm_t *c, fl_tp_msg_t *m, bool *failed)
{
    char text[FL_MSG_TEXT_MAX + 64];
    switch (m->hdr.type) {
    case FL_MSG_ERROR:
        if (!*failed)
            forward(c, m->hdr.u.error.code < 0 ? m->hdr.u.error.code : FL_EPEER,
                    m->hdr.u.error.about_rank, m->hdr.u.error.host, m->hdr.u.error.text);
        *failed = true;
        FL_ERROR(c->ctx, "coordinator: %s", m->hdr.u.error.text);
        break;
    case FL_MSG_SHUTDOWN:
        snprintf(text, sizeof text, "coordinator ended the job: %s", m->hdr.u.shutdown.text);
        if (!*failed && m->hdr.u.shutdown.code != 0)
            forward(c, FL_EPEER, -1, "", text);
        *failed = *failed || m->hdr.u.shutdown.code != 0;
        break;
    default:
        break; /* heartbeats: their arrival is what counts */
    }
}

static void *ctrl_main(void *arg)
{
    fl_comm_t *c = arg;
    fl_tp_sock_t *socks[2] = {c->coord, c->cmd_rx};
    int64_t last_coord = fl_now_ms();
    int64_t next_hb = 0;
    bool failed = false;
    for (;;) {
        int64_t now = fl_now_ms();
        if (now >= next_hb) {
            send_heartbeat(c);
            next_hb = now + c->hb_ms;
        }
        if (!failed && now - last_coord > c->hb_timeout_ms) {
            char text[FL_MSG_TEXT_MAX];
            snprintf(text, sizeof text, "coordinator %s silent for %lld ms (timeout %d ms)",
                     c->coordinator, (long long)(now - last_coord), c->hb_timeout_ms);
            FL_ERROR(c->ctx, "%s", text);
            forward(c, FL_EPEER, -1, "", text);
            failed = true;
        }
        bool ready[2] = {false, false};
        int wait = (int)(next_hb - now);
        if (fl_tp_poll(socks, 2, wait > 0 ? wait : 0, ready) < 0) {
            FL_ERROR(c->ctx, "control thread: %s", fl_last_error());
            usleep(10000); /* never spin on a failing poll */
            continue;
        }
        if (ready[1]) {
            fl_tp_msg_t m;
            if (fl_tp_recv(c->cmd_rx, &m, fl_deadline_in(0)) == FL_OK) {
                bool stop = m.hdr.type == FL_MSG_SHUTDOWN;
                fl_tp_msg_close(&m);
                if (stop) {
                    /* Say goodbye even after a failure, so the coordinator does not count a
                     * rank that left as one more death. */
                    leave(c, failed);
                    break;
                }
            }
        }
        if (ready[0]) {
            fl_tp_msg_t m;
            int rc = fl_tp_recv(c->coord, &m, fl_deadline_in(0));
            if (rc == FL_OK) {
                last_coord = fl_now_ms();
                on_coord_msg(c, &m, &failed);
                fl_tp_msg_close(&m);
            }
        }
    }
    /* This thread owns the coordinator socket: close it here, lingering for the goodbye. */
    fl_tp_sock_destroy(&c->coord);
    return NULL;
}

int fl_comm_ctrl_start(fl_comm_t *c)
{
    if (pthread_create(&c->ctrl, NULL, ctrl_main, c) != 0)
        return fl_fail(FL_EIO, "rank %d: cannot start the control thread", c->rank);
    c->ctrl_started = true;
    return FL_OK;
}

void fl_comm_ctrl_stop(fl_comm_t *c)
{
    if (!c->ctrl_started)
        return;
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, c->rank);
    h.u.shutdown.code = CMD_STOP;
    if (fl_tp_send(c->cmd_tx, NULL, &h, NULL, 0, fl_deadline_in(5000)) != FL_OK)
        FL_ERROR(c->ctx, "could not stop the control thread: %s", fl_last_error());
    pthread_join(c->ctrl, NULL);
    c->ctrl_started = false;
}
