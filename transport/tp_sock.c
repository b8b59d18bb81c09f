/* Socket lifetime: creation with every limit applied (size, queues, heartbeats, linger,
 * ROUTER_MANDATORY), bind with the chosen port read back, connect, and the job stamp. */
#include "tp_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fl_tp_opts_init(fl_tp_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->sndhwm = 4096;
    opts->rcvhwm = 4096;
    opts->linger_ms = 2000;
    opts->zmtp_hb_ivl_ms = 1000;
    opts->zmtp_hb_timeout_ms = 5000;
}

static int setopt_int(fl_tp_sock_t *s, int opt, int v, const char *what)
{
    if (zmq_setsockopt(s->zs, opt, &v, sizeof v) != 0)
        return fl_fail(FL_EIO, "%s socket: set %s=%d: %s", s->name, what, v,
                       zmq_strerror(zmq_errno()));
    return FL_OK;
}

static int apply_opts(fl_tp_sock_t *s, const fl_tp_opts_t *o)
{
    int rc;
    /* Frames up to twice the limit are still read so the application can refuse them with an
     * answer and a count; beyond that ZeroMQ drops the connection to protect memory. A limit
     * too large to double means none (-1). */
    int64_t hard = s->max_msg_bytes > (size_t)(INT64_MAX / 2) ? -1 : (int64_t)s->max_msg_bytes * 2;
    if (zmq_setsockopt(s->zs, ZMQ_MAXMSGSIZE, &hard, sizeof hard) != 0)
        return fl_fail(FL_EIO, "%s socket: set MAXMSGSIZE: %s", s->name, zmq_strerror(zmq_errno()));
    if ((rc = setopt_int(s, ZMQ_SNDHWM, o->sndhwm, "SNDHWM")) != FL_OK ||
        (rc = setopt_int(s, ZMQ_RCVHWM, o->rcvhwm, "RCVHWM")) != FL_OK ||
        (rc = setopt_int(s, ZMQ_LINGER, o->linger_ms, "LINGER")) != FL_OK)
        return rc;
    if (o->zmtp_hb_ivl_ms > 0 && s->kind != FL_TP_PAIR) {
        if ((rc = setopt_int(s, ZMQ_HEARTBEAT_IVL, o->zmtp_hb_ivl_ms, "HEARTBEAT_IVL")) != FL_OK ||
            (rc = setopt_int(s, ZMQ_HEARTBEAT_TIMEOUT, o->zmtp_hb_timeout_ms,
                             "HEARTBEAT_TIMEOUT")) != FL_OK ||
            (rc = setopt_int(s, ZMQ_HEARTBEAT_TTL, o->zmtp_hb_timeout_ms, "HEARTBEAT_TTL")) !=
                FL_OK)
            return rc;
    }
    if (o->sndbuf > 0 && (rc = setopt_int(s, ZMQ_SNDBUF, o->sndbuf, "SNDBUF")) != FL_OK)
        return rc;
    if (o->rcvbuf > 0 && (rc = setopt_int(s, ZMQ_RCVBUF, o->rcvbuf, "RCVBUF")) != FL_OK)
        return rc;
    if (o->immediate && (rc = setopt_int(s, ZMQ_IMMEDIATE, 1, "IMMEDIATE")) != FL_OK)
        return rc;
    if (o->backlog > 0 && (rc = setopt_int(s, ZMQ_BACKLOG, o->backlog, "BACKLOG")) != FL_OK)
        return rc;
    if (s->kind == FL_TP_ROUTER &&
        (rc = setopt_int(s, ZMQ_ROUTER_MANDATORY, 1, "ROUTER_MANDATORY")) != FL_OK)
        return rc;
    if (s->kind == FL_TP_ROUTER && o->router_handover &&
        (rc = setopt_int(s, ZMQ_ROUTER_HANDOVER, 1, "ROUTER_HANDOVER")) != FL_OK)
        return rc;
    if (o->routing_id != NULL) {
        size_t n = strlen(o->routing_id);
        if (n == 0 || n > 255)
            return fl_fail(FL_EINVAL, "%s socket: routing id of %zu bytes (1..255)", s->name, n);
        if (zmq_setsockopt(s->zs, ZMQ_ROUTING_ID, o->routing_id, n) != 0)
            return fl_fail(FL_EIO, "%s socket: set ROUTING_ID: %s", s->name,
                           zmq_strerror(zmq_errno()));
    }
    return FL_OK;
}

int fl_tp_sock_create(fl_ctx_t *ctx, fl_tp_kind_t kind, const fl_tp_opts_t *opts, const char *name,
                      fl_tp_sock_t **out)
{
    *out = NULL;
    if (opts->sndhwm < 0 || opts->rcvhwm < 0 || opts->linger_ms < -1)
        return fl_fail(FL_EINVAL, "%s socket: negative high-water mark or linger", name);
    if (opts->handshake_ivl_ms < 0 || opts->pending_max < 0 || opts->pending_per_addr < 0)
        return fl_fail(FL_EINVAL, "%s socket: negative handshake interval or pending cap", name);
    fl_tp_sock_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return fl_fail(FL_ENOMEM, "%s socket: out of memory", name);
    s->ctx = ctx;
    s->kind = kind;
    s->sender = -1;
    s->rcvtimeo = -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->max_msg_bytes = opts->max_msg_bytes ? opts->max_msg_bytes : fl_ctx_max_msg_bytes(ctx);
    s->handshake_ivl_ms = opts->handshake_ivl_ms;
    s->pending_max = opts->pending_max;
    s->pending_per_addr = opts->pending_per_addr;
    s->hold_max_bytes = opts->hold_max_bytes;
    s->zs = zmq_socket(fl_ctx_zmq(ctx), (int)kind);
    if (s->zs == NULL) {
        int rc = fl_fail(FL_EIO, "%s socket: zmq_socket: %s", name, zmq_strerror(zmq_errno()));
        free(s);
        return rc;
    }
    int rc = apply_opts(s, opts);
    if (rc != FL_OK) {
        zmq_close(s->zs);
        free(s);
        return rc;
    }
    *out = s;
    return FL_OK;
}

static void tp_sock_destroy(fl_tp_sock_t **sock)
{
    if (sock == NULL || *sock == NULL)
        return;
    fl_tp_sock_t *s = *sock;
    fl_tp_guard_stop(s);
    fl_tp_refuse_forget(s);
    if (s->watch != NULL) {
        fl_tp_monitor_close(s->zs, &s->watch->zs);
        free(s->watch);
    }
    zmq_close(s->zs);
    free(*sock);
    *sock = NULL;
}

void fl_tp_sock_destroy(fl_tp_sock_t **sock)
{
    fl_error_keep_begin();
    tp_sock_destroy(sock);
    fl_error_keep_end();
}

void fl_tp_sock_set_linger(fl_tp_sock_t *s, int linger_ms)
{
    zmq_setsockopt(s->zs, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
}

void fl_tp_sock_set_reconnect_ivl(fl_tp_sock_t *s, int ms)
{
    zmq_setsockopt(s->zs, ZMQ_RECONNECT_IVL, &ms, sizeof ms);
}

int fl_tp_sock_bind(fl_tp_sock_t *s, const char *endpoint, char *bound, size_t cap)
{
    fl_tp_endpoint_t ep;
    int rc = fl_tp_endpoint_parse(endpoint, &ep);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "%s socket: bind", s->name);
    if ((rc = fl_tp_curve_server(s->zs, s->ctx, endpoint)) != FL_OK ||
        (rc = fl_tp_guard_start(s, endpoint)) != FL_OK)
        return fl_fail_ctx(rc, "%s socket: bind %s", s->name, endpoint);
    if (zmq_bind(s->zs, endpoint) != 0) {
        int e = zmq_errno();
        /* A bad address is the caller's configuration: say what a bind takes. */
        if (e == ENODEV || e == EADDRNOTAVAIL)
            return fl_fail(FL_EINVAL,
                           "%s socket: bind %s: '%s' is not an address or interface "
                           "of this host (%s; give one of its IP addresses, an "
                           "interface name such as eth0, or 0.0.0.0 for all)",
                           s->name, endpoint, ep.host, zmq_strerror(e));
        if (e == EADDRINUSE)
            return fl_fail(FL_EIO,
                           "%s socket: bind %s: the port is in use by another process "
                           "(%s)",
                           s->name, endpoint, zmq_strerror(e));
        return fl_fail(FL_EIO, "%s socket: bind %s: %s", s->name, endpoint, zmq_strerror(e));
    }
    if (bound != NULL && cap > 0) {
        size_t len = cap;
        if (zmq_getsockopt(s->zs, ZMQ_LAST_ENDPOINT, bound, &len) != 0)
            return fl_fail(FL_EIO, "%s socket: read bound endpoint: %s", s->name,
                           zmq_strerror(zmq_errno()));
    }
    return FL_OK;
}

int fl_tp_sock_connect(fl_tp_sock_t *s, const char *endpoint)
{
    fl_tp_endpoint_t ep;
    int rc = fl_tp_endpoint_parse(endpoint, &ep);
    if (rc != FL_OK)
        return fl_fail_ctx(rc, "%s socket: connect", s->name);
    if ((rc = fl_tp_curve_client(s->zs, s->ctx, endpoint)) != FL_OK)
        return fl_fail_ctx(rc, "%s socket: connect %s", s->name, endpoint);
    if (zmq_connect(s->zs, endpoint) != 0)
        return fl_fail(FL_EIO, "%s socket: connect %s: %s", s->name, endpoint,
                       zmq_strerror(zmq_errno()));
    return FL_OK;
}

void fl_tp_sock_set_stamp(fl_tp_sock_t *s, const char *job_id, uint64_t generation, int32_t sender)
{
    s->stamped = true;
    snprintf(s->job_id, sizeof s->job_id, "%s", job_id ? job_id : "");
    s->generation = generation;
    s->sender = sender;
}

void fl_tp_sock_set_expect(fl_tp_sock_t *s, const char *job_id, uint64_t generation)
{
    s->expect_set = job_id != NULL;
    snprintf(s->expect_job, sizeof s->expect_job, "%s", job_id ? job_id : "");
    s->expect_gen = generation;
}

const char *fl_tp_sock_name(const fl_tp_sock_t *s)
{
    return s->name;
}

fl_ctx_t *fl_tp_sock_ctx(const fl_tp_sock_t *s)
{
    return s->ctx;
}
