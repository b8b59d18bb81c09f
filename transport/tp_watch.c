/* Socket monitors: ZeroMQ's events about a socket's connections, read from an inproc pipe, and
 * the handshake watch of a connecting socket, which turns a server's refusal into an error at
 * once (instead of ZeroMQ retrying until the caller's deadline). What libzmq 4.3 gives (checked
 * with Debian 12's 4.3.4): ACCEPTED, LISTENING and DISCONNECTED carry the descriptor; a failed
 * handshake carries ZAP's status (HANDSHAKE_FAILED_AUTH: 400 for a key not allowed) or a
 * ZMQ_PROTOCOL_ERROR_* code (HANDSHAKE_FAILED_PROTOCOL: MECHANISM_MISMATCH for plain text
 * against CURVE), HANDSHAKE_SUCCEEDED nothing; every event names the socket's endpoint, never
 * the peer's. */
#include "tp_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fl_tp_monitor_open(void *zctx, void *zs, int events, void **pair)
{
    *pair = NULL;
    char ep[96];
    snprintf(ep, sizeof ep, "inproc://flodl-monitor-%p-%lld", zs, (long long)fl_now_ns());
    if (zmq_socket_monitor(zs, ep, events) != 0)
        return fl_fail(FL_EIO, "socket monitor: %s", zmq_strerror(zmq_errno()));
    void *p = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    /* Unbounded: ZeroMQ's I/O thread sends events without ZMQ_DONTWAIT, so a full pipe would
     * stall every connection of the context. Connected before anything can happen on zs. */
    if (p == NULL || zmq_setsockopt(p, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(p, ZMQ_LINGER, &zero, sizeof zero) != 0 || zmq_connect(p, ep) != 0) {
        int rc = fl_fail(FL_EIO, "socket monitor: pipe: %s", zmq_strerror(zmq_errno()));
        zmq_socket_monitor(zs, NULL, 0);
        if (p != NULL)
            zmq_close(p);
        return rc;
    }
    *pair = p;
    return FL_OK;
}

void fl_tp_monitor_stop(void *zs)
{
    zmq_socket_monitor(zs, NULL, 0);
}

void fl_tp_monitor_close(void *zs, void **pair)
{
    if (*pair == NULL)
        return;
    fl_tp_monitor_stop(zs);
    zmq_close(*pair);
    *pair = NULL;
}

int fl_tp_monitor_read(void *pair, fl_tp_event_t *ev)
{
    zmq_msg_t head;
    zmq_msg_init(&head);
    if (zmq_msg_recv(&head, pair, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&head);
        if (e == EAGAIN)
            return 0;
        return fl_fail(FL_EIO, "socket monitor: %s", zmq_strerror(e));
    }
    int rc = 1;
    if (zmq_msg_size(&head) == 6) {
        uint16_t type;
        memcpy(&type, zmq_msg_data(&head), sizeof type);
        memcpy(&ev->value, (const char *)zmq_msg_data(&head) + 2, sizeof ev->value);
        ev->type = type;
    } else {
        ev->type = 0; /* not a version 1 event: ignored */
        ev->value = 0;
    }
    bool more = zmq_msg_more(&head);
    zmq_msg_close(&head);
    while (more) { /* the endpoint: the socket's own, of no use */
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, pair, 0) < 0)
            more = false;
        else
            more = zmq_msg_more(&part);
        zmq_msg_close(&part);
    }
    return rc;
}

int fl_tp_sock_watch(fl_tp_sock_t *s, fl_tp_sock_t **pipe)
{
    *pipe = NULL;
    if (s->watch == NULL) {
        fl_tp_sock_t *w = calloc(1, sizeof *w);
        if (w == NULL)
            return fl_fail(FL_ENOMEM, "%s socket: out of memory", s->name);
        w->ctx = s->ctx;
        w->kind = FL_TP_PAIR;
        snprintf(w->name, sizeof w->name, "%.40s handshakes", s->name);
        int rc = fl_tp_monitor_open(fl_ctx_zmq(s->ctx), s->zs,
                                    ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                        ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                        ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                    &w->zs);
        if (rc != FL_OK) {
            free(w);
            return fl_fail_ctx(rc, "%s socket", s->name);
        }
        s->watch = w;
    }
    *pipe = s->watch;
    return FL_OK;
}

/* The refusal an event means, or FL_OK. */
static int refusal(fl_tp_sock_t *s, const char *endpoint, const fl_tp_event_t *ev)
{
    bool curve = fl_tp_curve_on(s->ctx);
    if (ev->type == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && ev->value == 400)
        return fl_fail(FL_EPEER,
                       "%s: this process's CURVE key %s was refused by the server's "
                       "allowlist (add its client .pub to the server's authorized/ "
                       "directory)",
                       endpoint, fl_tp_curve_client_key(s->ctx));
    if (ev->type == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return fl_fail(FL_EPEER, "%s: refused by the server's authentication (ZAP status %u)",
                       endpoint, ev->value);
    if (ev->type == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        ev->value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return fl_fail(FL_EPEER, "%s: the server %s while this process %s", endpoint,
                       curve ? "speaks plain text (--insecure)" : "requires CURVE keys",
                       curve ? "uses CURVE keys (--curve-dir)" : "speaks plain text (--insecure)");
    if (ev->type == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        ev->value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC && curve)
        return fl_fail(FL_EPEER,
                       "%s: the CURVE handshake failed: the server's key is not the "
                       "server.key of this process's key directory",
                       endpoint);
    return FL_OK;
}

int fl_tp_sock_handshake_check(fl_tp_sock_t *s, const char *endpoint)
{
    if (s->watch == NULL)
        return FL_OK;
    for (;;) {
        fl_tp_event_t ev;
        int n = fl_tp_monitor_read(s->watch->zs, &ev);
        if (n < 0)
            return fl_fail_ctx(n, "%s socket", s->name);
        if (n == 0)
            return FL_OK;
        /* A reset in the handshake: the server closed it (its guard), or went away. */
        if (ev.type == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            s->handshakes_closed++;
        int rc = refusal(s, endpoint, &ev);
        if (rc != FL_OK)
            return rc;
    }
}

int fl_tp_sock_handshakes_closed(const fl_tp_sock_t *s)
{
    return s->handshakes_closed;
}
