/* Transport messages refused (tp_msg.c): every kind of bad message, each counted and followed by
 * a good one on the same socket; frame limits, also ones too large to double; a frame far over
 * the limit dropping its connection only; a ROUTER filling the route of a refused message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fl_tp.h"
#include "tputil.h"

/* ---- sockets and links ---- */

static void stats_snap(const fl_ctx_t *ctx, uint64_t *st)
{
    for (int i = 0; i < FL_STAT_COUNT; i++)
        st[i] = fl_ctx_stat(ctx, (fl_stat_t)i);
}

/* ---- refused messages ---- */

typedef struct rig {
    fl_ctx_t *ctx;
    fl_tp_sock_t *rx;
    fl_tp_sock_t *tx;
    char ep[FL_ENDPOINT_MAX]; /* where rx is bound */
} rig_t;

static void rig_open(rig_t *g, int xp, fl_tp_kind_t rx_kind, fl_tp_kind_t tx_kind,
                     size_t max_msg_bytes)
{
    fl_tp_opts_t o;
    opts_test(&o);
    o.max_msg_bytes = max_msg_bytes;
    g->ctx = ctx_new();
    g->rx = sock_new(g->ctx, rx_kind, "rx", &o);
    g->tx = sock_new(g->ctx, tx_kind, "tx", NULL);
    link_to(xp, g->rx, g->tx, g->ep);
}

static void rig_close(rig_t *g)
{
    fl_tp_sock_destroy(&g->tx);
    fl_tp_sock_destroy(&g->rx);
    fl_ctx_destroy(&g->ctx);
}

/* Receives one message that must be refused with FL_EPROTO, counted under stat (and under
 * nothing else), with needle in the detail. m is left for the caller to inspect and close. */
static void expect_refused(rig_t *g, fl_tp_msg_t *m, fl_stat_t stat, const char *needle)
{
    uint64_t before[FL_STAT_COUNT];
    uint64_t after[FL_STAT_COUNT];
    stats_snap(g->ctx, before);
    int rc = fl_tp_recv(g->rx, m, fl_deadline_in(WAIT_MS));
    if (rc != FL_EPROTO)
        ck_abort_msg("want FL_EPROTO (%s), got %d: %s", fl_stat_name(stat), rc, fl_last_error());
    if (needle != NULL && strstr(fl_last_error(), needle) == NULL)
        ck_abort_msg("%s: detail '%s' lacks '%s'", fl_stat_name(stat), fl_last_error(), needle);
    ck_assert_uint_eq(m->nframes, 0);
    stats_snap(g->ctx, after);
    for (int i = 0; i < FL_STAT_COUNT; i++) {
        uint64_t want = before[i] + (i == (int)stat ? 1 : 0);
        if (after[i] != want)
            ck_abort_msg("counter %s: %llu, want %llu", fl_stat_name((fl_stat_t)i),
                         (unsigned long long)after[i], (unsigned long long)want);
    }
}

/* The next good message on the same socket is received normally. */
static void good_after(rig_t *g, uint64_t marker)
{
    send_small(g->tx, NULL, marker);
    recv_small(g->rx, marker);
}

typedef struct enc_buf {
    uint8_t data[4096];
} enc_buf_t;

static void *enc_alloc(size_t len, void *ud)
{
    enc_buf_t *b = ud;
    return len <= sizeof b->data ? b->data : NULL;
}

static size_t encode(const fl_msg_hdr_t *h, enc_buf_t *b)
{
    size_t len = 0;
    int rc = fl_msg_encode(h, enc_alloc, b, &len);
    ck_assert_msg(rc == FL_OK, "fl_msg_encode: %s", fl_last_error());
    return len;
}

/* A valid version-1 chunk header declaring n raw frames of the given sizes. */
static void raw_hdr(fl_msg_hdr_t *h, uint32_t n, const size_t *sizes)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, 9);
    h->seq = 555;
    h->nframes = n;
    for (uint32_t i = 0; i < n; i++) {
        h->frames[i].bytes = sizes[i];
        h->frames[i].raw_bytes = sizes[i];
    }
}

static void send_raw_ok(fl_tp_sock_t *s, const void *const *parts, const size_t *sizes, size_t n)
{
    int rc = fl_tp_send_raw(s, parts, sizes, n);
    ck_assert_msg(rc == FL_OK, "send_raw: %s", fl_last_error());
}

START_TEST(test_refuse_garbage_header)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    static const char payload[] = "payload after a bad header";
    const void *parts[2] = {junk, payload};
    size_t sizes[2] = {sizeof junk, sizeof payload};
    send_raw_ok(g.tx, parts, sizes, 2);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_BAD_HEADER, "do not parse");
    fl_tp_msg_close(&m);
    good_after(&g, 1);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_bad_magic)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    fl_msg_hdr_t h;
    raw_hdr(&h, 0, NULL);
    enc_buf_t b;
    size_t len = encode(&h, &b);
    /* Field 1 (fixed32 magic) comes first: tag 0x0d, then "FLDL" little-endian. */
    ck_assert_uint_ge(len, 5);
    ck_assert_uint_eq(b.data[0], 0x0d);
    ck_assert_uint_eq(b.data[1], 'F');
    b.data[1] = 'X';
    const void *parts[1] = {b.data};
    send_raw_ok(g.tx, parts, &len, 1);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_BAD_MAGIC, "magic");
    fl_tp_msg_close(&m);
    good_after(&g, 2);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_version)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    size_t psize = 5;
    fl_msg_hdr_t h;
    raw_hdr(&h, 1, &psize);
    h.version = 2;
    enc_buf_t b;
    size_t sizes[2] = {encode(&h, &b), psize};
    const void *parts[2] = {b.data, "12345"};
    send_raw_ok(g.tx, parts, sizes, 2);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_BAD_VERSION, "version 2");
    /* Enough of the header for an answer. */
    ck_assert_uint_eq(m.hdr.version, 2);
    ck_assert_int_eq(m.hdr.type, FL_MSG_CHUNK);
    ck_assert_int_eq(m.hdr.sender, 9);
    fl_tp_msg_close(&m);
    good_after(&g, 3);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_frame_mismatch)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    fl_msg_hdr_t h;
    enc_buf_t b;
    fl_tp_msg_t m;

    /* Declares 2 frames, 1 arrives. */
    size_t declared[2] = {8, 8};
    raw_hdr(&h, 2, declared);
    size_t sizes[2] = {encode(&h, &b), 8};
    const void *parts[2] = {b.data, "12345678"};
    send_raw_ok(g.tx, parts, sizes, 2);
    expect_refused(&g, &m, FL_STAT_BAD_FRAMES, "declares 2 payload frames but 1 arrived");
    fl_tp_msg_close(&m);
    good_after(&g, 4);

    /* Declares 8 bytes, 9 arrive. */
    raw_hdr(&h, 1, declared);
    sizes[0] = encode(&h, &b);
    sizes[1] = 9;
    parts[1] = "123456789";
    send_raw_ok(g.tx, parts, sizes, 2);
    expect_refused(&g, &m, FL_STAT_BAD_FRAMES, "declares 8 bytes but 9 arrived");
    fl_tp_msg_close(&m);
    good_after(&g, 5);

    /* Declares 1 frame, 2 arrive. */
    raw_hdr(&h, 1, declared);
    size_t sizes3[3] = {encode(&h, &b), 8, 8};
    const void *parts3[3] = {b.data, "12345678", "abcdefgh"};
    send_raw_ok(g.tx, parts3, sizes3, 3);
    expect_refused(&g, &m, FL_STAT_BAD_FRAMES, "declares 1 payload frames but 2 arrived");
    fl_tp_msg_close(&m);
    good_after(&g, 6);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_too_many_frames)
{
    enum { NRAW = 21 };
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);

    /* 16 frames is the limit, and fine. */
    uint8_t bytes[FL_MSG_MAX_FRAMES][8];
    fl_buf_t frames[FL_MSG_MAX_FRAMES];
    for (int i = 0; i < FL_MSG_MAX_FRAMES; i++) {
        memset(bytes[i], i, sizeof bytes[i]);
        frames[i] = (fl_buf_t){.data = bytes[i], .len = sizeof bytes[i]};
    }
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, frames, FL_MSG_MAX_FRAMES, fl_deadline_in(WAIT_MS)),
                     FL_OK);
    fl_tp_msg_t m;
    recv_ok(g.rx, &m);
    ck_assert_uint_eq(m.nframes, FL_MSG_MAX_FRAMES);
    ck_assert_uint_eq(((const uint8_t *)fl_tp_msg_data(&m, 15))[7], 15);
    fl_tp_msg_close(&m);

    /* 21 raw frames after a header declaring none: refused, and all of them drained. */
    raw_hdr(&h, 0, NULL);
    enc_buf_t b;
    const void *parts[NRAW + 1];
    size_t sizes[NRAW + 1];
    sizes[0] = encode(&h, &b);
    parts[0] = b.data;
    for (int i = 1; i <= NRAW; i++) {
        parts[i] = "abcdefgh";
        sizes[i] = 8;
    }
    send_raw_ok(g.tx, parts, sizes, NRAW + 1);
    expect_refused(&g, &m, FL_STAT_BAD_FRAMES, "more than 16 frames");
    fl_tp_msg_close(&m);
    good_after(&g, 7);
    good_after(&g, 8);
    rig_close(&g);
}
END_TEST

/* The context's max_frames is a receive limit too, when below the protocol's 16. */
START_TEST(test_refuse_over_ctx_max_frames)
{
    fl_ctx_t *ctx = ctx_new_frames(4);
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "rx", NULL);
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "tx", NULL);
    link_socks(XP_INPROC, rx, tx);
    uint8_t bytes[5] = {1, 2, 3, 4, 5};
    fl_buf_t frames[5];
    for (int i = 0; i < 5; i++)
        frames[i] = (fl_buf_t){.data = &bytes[i], .len = 1};
    fl_msg_hdr_t h;
    fl_tp_msg_t m;
    for (size_t n = 4; n <= 5; n++) {
        fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
        ck_assert_int_eq(fl_tp_send(tx, NULL, &h, frames, n, fl_deadline_in(WAIT_MS)), FL_OK);
    }
    recv_ok(rx, &m);
    ck_assert_uint_eq(m.nframes, 4);
    fl_tp_msg_close(&m);
    ck_assert_int_eq(fl_tp_recv(rx, &m, fl_deadline_in(WAIT_MS)), FL_EPROTO);
    ck_assert_msg(strstr(fl_last_error(), "more than 4 frames") != NULL, "detail: %s",
                  fl_last_error());
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BAD_FRAMES), 1);
    fl_tp_msg_close(&m);
    send_small(tx, NULL, 9);
    recv_small(rx, 9);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* fl_tp_recv's FL_EPROTO leaves nothing for the caller to free (fl_tp.h asks for a close only
 * after FL_OK, and server/coord.c reuses m without one). A welcome is the header whose decoding
 * allocates (the peer table); refused after decoding, it must not leak. Only LeakSanitizer
 * (the ASan build) can see this one fail. */
START_TEST(test_refused_welcome_no_leak)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_WELCOME, -1);
    ck_assert_int_eq(fl_msg_welcome_alloc(&h, 3), FL_OK);
    for (int i = 0; i < 3; i++) {
        fl_msg_peer_t *p = &h.u.welcome.peers[i];
        p->rank = i;
        snprintf(p->host, sizeof p->host, "host-%d", i);
        p->nendpoints = 1;
        snprintf(p->endpoints[0], sizeof p->endpoints[0], "tcp://host-%d:4000", i);
    }
    h.nframes = 1; /* declared, never sent */
    h.frames[0].bytes = 8;
    h.frames[0].raw_bytes = 8;
    enc_buf_t b;
    size_t len = encode(&h, &b);
    fl_msg_hdr_deinit(&h);
    const void *parts[1] = {b.data};
    send_raw_ok(g.tx, parts, &len, 1);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_BAD_FRAMES, "declares 1 payload frames but 0 arrived");
    ck_assert_int_eq(m.hdr.type, FL_MSG_WELCOME);
    ck_assert_int_eq(m.hdr.sender, -1);
    /* No close here: m is reused for the next message, as the coordinator does. */
    send_small(g.tx, NULL, 60);
    recv_ok(g.rx, &m);
    check_small(&m, 60);
    fl_tp_msg_close(&m);
    rig_close(&g);
}
END_TEST

/* A limit too large to double ("no limit" for practical purposes) must not turn into a small
 * one: frames of a few hundred KiB still arrive over tcp. */
START_TEST(test_huge_limit_not_wrapped)
{
    static const size_t limits[2] = {SIZE_MAX, SIZE_MAX / 2 + 1};
    enum { LEN = 200 * 1024 };
    uint8_t *buf = pattern_buf(LEN, 8, 0);
    for (int k = 0; k < 2; k++) {
        rig_t g;
        rig_open(&g, XP_TCP, FL_TP_PULL, FL_TP_PUSH, limits[k]);
        fl_buf_t f = {.data = buf, .len = LEN};
        fl_msg_hdr_t h;
        fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
        ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, &f, 1, fl_deadline_in(WAIT_MS)), FL_OK);
        fl_tp_msg_t m;
        int rc = fl_tp_recv(g.rx, &m, fl_deadline_in(1500));
        if (rc != FL_OK)
            ck_abort_msg("max_msg_bytes %zu: a %d-byte frame did not arrive: %d %s", limits[k], LEN,
                         rc, fl_last_error());
        ck_assert_uint_eq(fl_tp_msg_size(&m, 0), LEN);
        fl_tp_msg_close(&m);
        rig_close(&g);
    }
    free(buf);
}
END_TEST

START_TEST(test_refuse_oversized)
{
    enum { LIMIT = 64 * 1024 };
    rig_t g;
    rig_open(&g, XP_TCP, FL_TP_PULL, FL_TP_PUSH, LIMIT);
    uint8_t *big = pattern_buf(100 * 1024, 5, 0);
    fl_msg_hdr_t h;
    fl_tp_msg_t m;

    /* Exactly the limit is accepted. */
    fl_buf_t f = {.data = big, .len = LIMIT};
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, &f, 1, fl_deadline_in(WAIT_MS)), FL_OK);
    recv_ok(g.rx, &m);
    ck_assert_uint_eq(fl_tp_msg_size(&m, 0), LIMIT);
    fl_tp_msg_close(&m);

    /* One byte more, and 100 KiB, are refused and counted. */
    static const size_t over[2] = {LIMIT + 1, 100 * 1024};
    for (int k = 0; k < 2; k++) {
        f = (fl_buf_t){.data = big, .len = over[k]};
        fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
        ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, &f, 1, fl_deadline_in(WAIT_MS)), FL_OK);
        expect_refused(&g, &m, FL_STAT_OVERSIZED, "limit");
        fl_tp_msg_close(&m);
        good_after(&g, 10 + (uint64_t)k);
    }
    free(big);
    rig_close(&g);
}
END_TEST

/* A frame far over the limit makes ZeroMQ drop that connection; the socket goes on serving
 * other senders, and the dropped one once it has reconnected. */
START_TEST(test_oversized_drops_connection)
{
    enum { LIMIT = 64 * 1024, BIG = 4 * LIMIT };
    rig_t g;
    rig_open(&g, XP_TCP, FL_TP_PULL, FL_TP_PUSH, LIMIT);
    fl_tp_sock_set_stamp(g.tx, "", 0, 1);
    uint8_t *huge = pattern_buf(BIG, 6, 0);
    fl_buf_t f = {.data = huge, .len = BIG};
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, &f, 1, fl_deadline_in(WAIT_MS)), FL_OK);
    free(huge);
    fl_tp_msg_t m;
    int rc = fl_tp_recv(g.rx, &m, fl_deadline_in(500));
    ck_assert_msg(rc == FL_ETIMEDOUT, "the %d-byte frame was not dropped: rc %d, %s", BIG, rc,
                  fl_last_error());

    ck_assert_uint_eq(fl_ctx_stat(g.ctx, FL_STAT_MSGS_RECV), 0);
    ck_assert_uint_eq(fl_ctx_stat(g.ctx, FL_STAT_OVERSIZED), 0);

    fl_tp_sock_t *other = sock_new(g.ctx, FL_TP_PUSH, "other-tx", NULL);
    fl_tp_sock_set_stamp(other, "", 0, 2);
    ck_assert_int_eq(fl_tp_sock_connect(other, g.ep), FL_OK);
    send_small(other, NULL, 50);
    recv_ok(g.rx, &m);
    check_small(&m, 50);
    ck_assert_int_eq(m.hdr.sender, 2);
    fl_tp_msg_close(&m);

    /* ZeroMQ reconnects the dropped sender; its next message gets through. */
    send_small(g.tx, NULL, 51);
    recv_ok(g.rx, &m);
    check_small(&m, 51);
    ck_assert_int_eq(m.hdr.sender, 1);
    fl_tp_msg_close(&m);
    fl_tp_sock_destroy(&other);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_job)
{
    rig_t g;
    rig_open(&g, XP_INPROC, FL_TP_PULL, FL_TP_PUSH, 0);
    fl_tp_sock_set_expect(g.rx, "job-a", 7);
    fl_tp_msg_t m;

    fl_tp_sock_set_stamp(g.tx, "job-b", 7, 4);
    send_small(g.tx, NULL, 20);
    expect_refused(&g, &m, FL_STAT_BAD_JOB, "job 'job-b' generation 7");
    ck_assert_int_eq(m.hdr.sender, 4);
    ck_assert_str_eq(m.hdr.job_id, "job-b");
    fl_tp_msg_close(&m);

    fl_tp_sock_set_stamp(g.tx, "job-a", 8, 4);
    send_small(g.tx, NULL, 21);
    expect_refused(&g, &m, FL_STAT_BAD_JOB, "generation 8");
    ck_assert_uint_eq(m.hdr.generation, 8);
    fl_tp_msg_close(&m);

    fl_tp_sock_set_stamp(g.tx, "job-a", 7, 4);
    good_after(&g, 22);

    /* Expecting no job in particular accepts any. */
    fl_tp_sock_set_expect(g.rx, NULL, 0);
    fl_tp_sock_set_stamp(g.tx, "job-z", 99, 4);
    good_after(&g, 23);
    rig_close(&g);
}
END_TEST

/* A ROUTER fills the route of a refused message, so the caller can answer it. */
/* A bound socket refuses a header frame larger than any member sends before parsing it:
 * counted as oversized (not as a header that does not parse), the route kept for an answer. */
START_TEST(test_refuse_router_big_header)
{
    rig_t g;
    rig_open(&g, XP_TCP, FL_TP_ROUTER, FL_TP_DEALER, 0);
    size_t size = (size_t)FL_MSG_HDR_MAX_IN + 1;
    uint8_t *big = calloc(1, size);
    ck_assert_ptr_nonnull(big);
    const void *parts[1] = {big};
    send_raw_ok(g.tx, parts, &size, 1);
    free(big);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_OVERSIZED, "header frame of");
    ck_assert_uint_gt(m.route.len, 0);
    fl_tp_msg_close(&m);
    good_after(&g, 32);
    rig_close(&g);
}
END_TEST

START_TEST(test_refuse_router_route)
{
    rig_t g;
    rig_open(&g, XP_TCP, FL_TP_ROUTER, FL_TP_DEALER, 0);
    static const uint8_t junk[] = {0xff, 0xff, 0xff};
    const void *parts[1] = {junk};
    size_t size = sizeof junk;
    send_raw_ok(g.tx, parts, &size, 1);
    fl_tp_msg_t m;
    expect_refused(&g, &m, FL_STAT_BAD_HEADER, NULL);
    ck_assert_uint_gt(m.route.len, 0);
    fl_tp_route_t route = m.route;
    fl_tp_msg_close(&m);
    send_small(g.rx, &route, 30);
    recv_small(g.tx, 30);

    /* Also for another protocol version, with the sender's type and rank. */
    fl_msg_hdr_t h;
    raw_hdr(&h, 0, NULL);
    h.version = 2;
    enc_buf_t b;
    size = encode(&h, &b);
    parts[0] = b.data;
    send_raw_ok(g.tx, parts, &size, 1);
    expect_refused(&g, &m, FL_STAT_BAD_VERSION, "version");
    ck_assert_uint_eq(m.route.len, route.len);
    ck_assert_mem_eq(m.route.id, route.id, route.len);
    ck_assert_int_eq(m.hdr.sender, 9);
    fl_tp_msg_close(&m);
    good_after(&g, 31);
    rig_close(&g);
}
END_TEST

Suite *tp_refused_suite(void);
Suite *tp_refused_suite(void)
{
    Suite *s = suite_create("tp_refused");
    TCase *t = tcase_create("refused");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_refuse_garbage_header);
    tcase_add_test(t, test_refuse_bad_magic);
    tcase_add_test(t, test_refuse_version);
    tcase_add_test(t, test_refuse_frame_mismatch);
    tcase_add_test(t, test_refuse_too_many_frames);
    tcase_add_test(t, test_refuse_over_ctx_max_frames);
    tcase_add_test(t, test_refused_welcome_no_leak);
    tcase_add_test(t, test_refuse_oversized);
    tcase_add_test(t, test_huge_limit_not_wrapped);
    tcase_add_test(t, test_oversized_drops_connection);
    tcase_add_test(t, test_refuse_job);
    tcase_add_test(t, test_refuse_router_route);
    tcase_add_test(t, test_refuse_router_big_header);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(tp_refused_suite());
}
