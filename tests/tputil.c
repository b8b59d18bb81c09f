/* Helpers shared by the transport suites: sockets, links, payload patterns, small messages. */
#include "tputil.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

char ipc_paths[8][128];
int nipc;

fl_ctx_t *ctx_new_frames(size_t max_frames)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    if (max_frames > 0)
        o.max_frames = max_frames;
    o.log_level = FL_LOG_ERROR;
    o.log_name = "test_tp";
    fl_ctx_t *ctx = NULL;
    int rc = fl_ctx_create(&o, &ctx);
    ck_assert_msg(rc == FL_OK, "fl_ctx_create: %s", fl_last_error());
    return ctx;
}

fl_ctx_t *ctx_new(void)
{
    return ctx_new_frames(0);
}

void opts_test(fl_tp_opts_t *o)
{
    fl_tp_opts_init(o);
    o->linger_ms = 0;
}

fl_tp_sock_t *sock_new(fl_ctx_t *ctx, fl_tp_kind_t kind, const char *name, const fl_tp_opts_t *opts)
{
    fl_tp_opts_t o;
    if (opts == NULL) {
        opts_test(&o);
        opts = &o;
    }
    fl_tp_sock_t *s = NULL;
    int rc = fl_tp_sock_create(ctx, kind, opts, name, &s);
    ck_assert_msg(rc == FL_OK, "create %s: %s", name, fl_last_error());
    return s;
}

void link_to(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b, char *out)
{
    static int serial;
    char ep[FL_ENDPOINT_MAX];
    char bound[FL_ENDPOINT_MAX];
    switch (xp) {
    case XP_INPROC:
        snprintf(ep, sizeof ep, "inproc://tp-test-%d-%d", (int)getpid(), serial++);
        break;
    case XP_IPC:
        ck_assert_int_lt(nipc, 8);
        snprintf(ipc_paths[nipc], sizeof ipc_paths[nipc], "/tmp/flodl-tp-test-%d-%d.sock",
                 (int)getpid(), serial++);
        snprintf(ep, sizeof ep, "ipc://%s", ipc_paths[nipc]);
        nipc++;
        break;
    default: snprintf(ep, sizeof ep, "tcp://127.0.0.1:0"); break;
    }
    int rc = fl_tp_sock_bind(a, ep, bound, sizeof bound);
    ck_assert_msg(rc == FL_OK, "bind %s: %s", ep, fl_last_error());
    if (xp == XP_TCP) {
        fl_tp_endpoint_t parsed;
        ck_assert_int_eq(fl_tp_endpoint_parse(bound, &parsed), FL_OK);
        ck_assert_msg(parsed.port > 0, "bound '%s' has no real port", bound);
        ck_assert_str_eq(parsed.host, "127.0.0.1");
    } else {
        ck_assert_str_eq(bound, ep);
    }
    rc = fl_tp_sock_connect(b, bound);
    ck_assert_msg(rc == FL_OK, "connect %s: %s", bound, fl_last_error());
    if (out != NULL)
        snprintf(out, FL_ENDPOINT_MAX, "%s", bound);
}

void link_socks(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b)
{
    link_to(xp, a, b, NULL);
}

uint8_t pattern(uint64_t salt, size_t frame, size_t j)
{
    return (uint8_t)(salt * 131u + frame * 31u + j * 7u + 1u);
}

void recv_ok(fl_tp_sock_t *s, fl_tp_msg_t *m)
{
    int rc = fl_tp_recv(s, m, fl_deadline_in(WAIT_MS));
    ck_assert_msg(rc == FL_OK, "recv on %s: %d %s", fl_tp_sock_name(s), rc, fl_last_error());
}

#define SMALL_LEN 1000

void send_small(fl_tp_sock_t *s, const fl_tp_route_t *to, uint64_t marker)
{
    uint8_t buf[SMALL_LEN];
    for (size_t j = 0; j < sizeof buf; j++)
        buf[j] = pattern(marker, 0, j);
    fl_buf_t f = {.data = buf, .len = sizeof buf};
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    h.seq = marker;
    int rc = fl_tp_send(s, to, &h, &f, 1, fl_deadline_in(WAIT_MS));
    ck_assert_msg(rc == FL_OK, "send small %llu on %s: %s", (unsigned long long)marker,
                  fl_tp_sock_name(s), fl_last_error());
}

void check_small(fl_tp_msg_t *m, uint64_t marker)
{
    ck_assert_int_eq(m->hdr.type, FL_MSG_CHUNK);
    ck_assert_uint_eq(m->hdr.seq, marker);
    ck_assert_uint_eq(m->nframes, 1);
    ck_assert_uint_eq(fl_tp_msg_size(m, 0), SMALL_LEN);
    const uint8_t *d = fl_tp_msg_data(m, 0);
    for (size_t j = 0; j < SMALL_LEN; j++) {
        if (d[j] != pattern(marker, 0, j))
            ck_abort_msg("small message %llu: byte %zu differs", (unsigned long long)marker, j);
    }
}

void recv_small(fl_tp_sock_t *s, uint64_t marker)
{
    fl_tp_msg_t m;
    recv_ok(s, &m);
    check_small(&m, marker);
    fl_tp_msg_close(&m);
}

uint8_t *pattern_buf(size_t len, uint64_t salt, size_t frame)
{
    uint8_t *b = malloc(len);
    ck_assert_ptr_nonnull(b);
    for (size_t j = 0; j < len; j++)
        b[j] = pattern(salt, frame, j);
    return b;
}
