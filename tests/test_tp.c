/* Transport sockets, messages and endpoints (tp_sock.c, tp_msg.c, tp_endpoint.c): a header
 * plus payload frames over inproc, ipc and tcp for PUSH/PULL, DEALER/ROUTER and PAIR, with job
 * stamps and counters; zero-copy release hooks, also on failed sends; send and receive
 * deadlines; every kind of refused message, each followed by a good one on the same socket;
 * poll; endpoint parsing, advertising and the local-address lookup; bind and create errors. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_tp.h"
#include "testutil.h"

enum { XP_INPROC, XP_IPC, XP_TCP, XP_COUNT };
static const char *const xp_names[XP_COUNT] = {"inproc", "ipc", "tcp"};

#define WAIT_MS 5000 /* deadline of operations that should succeed at once */

/* ---- sockets and links ---- */

/* ipc socket files made by this test process, removed by the teardown. */
static char ipc_paths[8][128];
static int nipc;

static void unlink_ipc(void)
{
    for (int i = 0; i < nipc; i++)
        unlink(ipc_paths[i]);
    nipc = 0;
}

/* A context with the default limits, or at most max_frames payload frames when non-zero. */
static fl_ctx_t *ctx_new_frames(size_t max_frames)
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

static fl_ctx_t *ctx_new(void)
{
    return ctx_new_frames(0);
}

/* Test defaults: linger 0 so that closing with unread messages never waits. */
static void opts_test(fl_tp_opts_t *o)
{
    fl_tp_opts_init(o);
    o->linger_ms = 0;
}

static fl_tp_sock_t *sock_new(fl_ctx_t *ctx, fl_tp_kind_t kind, const char *name,
                              const fl_tp_opts_t *opts)
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

/* Binds a to a fresh endpoint of transport xp and connects b to the endpoint actually bound,
 * which goes to out (FL_ENDPOINT_MAX bytes) unless that is NULL. */
static void link_to(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b, char *out)
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
    default:
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:0");
        break;
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

static void link_socks(int xp, fl_tp_sock_t *a, fl_tp_sock_t *b)
{
    link_to(xp, a, b, NULL);
}

static void stats_snap(const fl_ctx_t *ctx, uint64_t *st)
{
    for (int i = 0; i < FL_STAT_COUNT; i++)
        st[i] = fl_ctx_stat(ctx, (fl_stat_t)i);
}

/* ---- the reference message: a chunk header and five payload frames ---- */

#define NF 5
static const size_t frame_len[NF] = {0, 7, 4096, 200000, 100};
static const uint32_t frame_dtype[NF] = {0, FL_UINT8, FL_FLOAT32, FL_FLOAT64, FL_FLOAT32};
static const uint32_t frame_codec[NF] = {FL_CODEC_RAW, FL_CODEC_RAW, FL_CODEC_RAW, FL_CODEC_RAW,
                                         FL_CODEC_LZ4};
#define LZ4_RAW_BYTES 400 /* what the lz4 frame claims to decode to */

static uint8_t pattern(uint64_t salt, size_t frame, size_t j)
{
    return (uint8_t)(salt * 131u + frame * 31u + j * 7u + 1u);
}

static size_t chunk_total_bytes(void)
{
    size_t t = 0;
    for (int i = 0; i < NF; i++)
        t += frame_len[i];
    return t;
}

static void chunk_hdr(fl_msg_hdr_t *h, uint64_t salt)
{
    fl_msg_hdr_init(h, FL_MSG_CHUNK, 0);
    h->seq = 1000 + salt;
    h->step = 77 + salt;
    h->u.chunk.coll = 2;
    h->u.chunk.phase = 1;
    h->u.chunk.step = 3 + (uint32_t)salt;
    h->u.chunk.seg = 4;
    h->u.chunk.offset = (1ull << 40) + salt;
    h->u.chunk.count = 12345;
    h->u.chunk.op = FL_SUM;
    h->u.chunk.total = (1ull << 41) + 7;
    for (int i = 0; i < NF; i++) {
        h->frames[i].dtype = frame_dtype[i];
        h->frames[i].codec = frame_codec[i];
        h->frames[i].raw_bytes = frame_codec[i] == FL_CODEC_LZ4 ? LZ4_RAW_BYTES : 0;
    }
}

/* Sends the reference chunk from caller-owned (copied) buffers. */
static void send_chunk(fl_tp_sock_t *s, const fl_tp_route_t *to, uint64_t salt)
{
    uint8_t *bufs[NF];
    fl_buf_t frames[NF];
    fl_msg_hdr_t h;
    chunk_hdr(&h, salt);
    memset(frames, 0, sizeof frames);
    for (int i = 0; i < NF; i++) {
        bufs[i] = malloc(frame_len[i] + 1);
        ck_assert_ptr_nonnull(bufs[i]);
        for (size_t j = 0; j < frame_len[i]; j++)
            bufs[i][j] = pattern(salt, (size_t)i, j);
        frames[i].data = bufs[i];
        frames[i].len = frame_len[i];
    }
    int rc = fl_tp_send(s, to, &h, frames, NF, fl_deadline_in(WAIT_MS));
    ck_assert_msg(rc == FL_OK, "send chunk %llu: %s", (unsigned long long)salt, fl_last_error());
    for (int i = 0; i < NF; i++)
        free(bufs[i]);
}

static void recv_ok(fl_tp_sock_t *s, fl_tp_msg_t *m)
{
    int rc = fl_tp_recv(s, m, fl_deadline_in(WAIT_MS));
    ck_assert_msg(rc == FL_OK, "recv on %s: %d %s", fl_tp_sock_name(s), rc, fl_last_error());
}

/* Checks every header field and payload byte of a received reference chunk. */
static void check_chunk(fl_tp_msg_t *m, uint64_t salt)
{
    const fl_msg_hdr_t *h = &m->hdr;
    ck_assert_uint_eq(h->version, FL_MSG_VERSION);
    ck_assert_int_eq(h->type, FL_MSG_CHUNK);
    ck_assert_uint_eq(h->seq, 1000 + salt);
    ck_assert_uint_eq(h->step, 77 + salt);
    ck_assert_uint_eq(h->u.chunk.coll, 2);
    ck_assert_uint_eq(h->u.chunk.phase, 1);
    ck_assert_uint_eq(h->u.chunk.step, 3 + salt);
    ck_assert_uint_eq(h->u.chunk.seg, 4);
    ck_assert_uint_eq(h->u.chunk.offset, (1ull << 40) + salt);
    ck_assert_uint_eq(h->u.chunk.count, 12345);
    ck_assert_uint_eq(h->u.chunk.op, FL_SUM);
    ck_assert_uint_eq(h->u.chunk.total, (1ull << 41) + 7);
    ck_assert_uint_eq(h->nframes, NF);
    ck_assert_uint_eq(m->nframes, NF);
    for (size_t i = 0; i < NF; i++) {
        uint64_t raw = frame_codec[i] == FL_CODEC_LZ4 ? LZ4_RAW_BYTES : frame_len[i];
        if (h->frames[i].bytes != frame_len[i] || h->frames[i].dtype != frame_dtype[i] ||
            h->frames[i].codec != frame_codec[i] || h->frames[i].raw_bytes != raw)
            ck_abort_msg("frame %zu described as bytes %llu dtype %u codec %u raw %llu", i,
                         (unsigned long long)h->frames[i].bytes, h->frames[i].dtype,
                         h->frames[i].codec, (unsigned long long)h->frames[i].raw_bytes);
        if (fl_tp_msg_size(m, i) != frame_len[i])
            ck_abort_msg("frame %zu: %zu bytes, want %zu", i, fl_tp_msg_size(m, i),
                         frame_len[i]);
        const uint8_t *d = fl_tp_msg_data(m, i);
        for (size_t j = 0; j < frame_len[i]; j++) {
            if (d[j] != pattern(salt, i, j))
                ck_abort_msg("frame %zu byte %zu: %u, want %u", i, j, d[j], pattern(salt, i, j));
        }
    }
}

/* ---- small messages: one 1000-byte frame, the marker in seq ---- */

#define SMALL_LEN 1000

static void send_small(fl_tp_sock_t *s, const fl_tp_route_t *to, uint64_t marker)
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

static void check_small(fl_tp_msg_t *m, uint64_t marker)
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

static void recv_small(fl_tp_sock_t *s, uint64_t marker)
{
    fl_tp_msg_t m;
    recv_ok(s, &m);
    check_small(&m, marker);
    fl_tp_msg_close(&m);
}

/* ---- PUSH/PULL, DEALER/ROUTER, PAIR over each transport ---- */

START_TEST(test_push_pull)
{
    const int xp = _i;
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "rx", NULL);
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "tx", NULL);
    link_socks(xp, rx, tx);
    fl_tp_sock_set_stamp(tx, "job-pp", 5, 3);
    for (uint64_t k = 1; k <= 3; k++)
        send_chunk(tx, NULL, k);
    for (uint64_t k = 1; k <= 3; k++) {
        fl_tp_msg_t m;
        recv_ok(rx, &m);
        check_chunk(&m, k);
        ck_assert_str_eq(m.hdr.job_id, "job-pp");
        ck_assert_uint_eq(m.hdr.generation, 5);
        ck_assert_int_eq(m.hdr.sender, 3);
        ck_assert_uint_eq(m.route.len, 0);
        fl_tp_msg_close(&m);
        fl_tp_msg_close(&m); /* idempotent */
    }
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), 3);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_RECV), 3);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_SENT), 3 * chunk_total_bytes());
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_RECV), 3 * chunk_total_bytes());
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BAD_HEADER), 0);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&rx);
    ck_assert_ptr_null(rx);
    fl_tp_sock_destroy(&rx); /* NULL-safe */
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_dealer_router)
{
    const int xp = _i;
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *router = sock_new(ctx, FL_TP_ROUTER, "coord", NULL);
    fl_tp_sock_t *dealer = sock_new(ctx, FL_TP_DEALER, "rank", NULL);
    link_socks(xp, router, dealer);
    fl_tp_sock_set_stamp(dealer, "job-dr", 9, 2);
    fl_tp_sock_set_stamp(router, "job-dr", 9, -1);

    send_chunk(dealer, NULL, 1);
    fl_tp_msg_t m;
    recv_ok(router, &m);
    check_chunk(&m, 1);
    ck_assert_int_eq(m.hdr.sender, 2);
    ck_assert_uint_gt(m.route.len, 0);
    fl_tp_route_t route = m.route;
    fl_tp_msg_close(&m);

    /* The reply to that route reaches the dealer. */
    send_chunk(router, &route, 2);
    recv_ok(dealer, &m);
    check_chunk(&m, 2);
    ck_assert_int_eq(m.hdr.sender, -1);
    ck_assert_str_eq(m.hdr.job_id, "job-dr");
    fl_tp_msg_close(&m);

    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), 2);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_RECV), 2);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_SENT), 2 * chunk_total_bytes());
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_RECV), 2 * chunk_total_bytes());
    fl_tp_sock_destroy(&dealer);
    fl_tp_sock_destroy(&router);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_pair)
{
    const int xp = _i;
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *a = sock_new(ctx, FL_TP_PAIR, "pipe-a", NULL);
    fl_tp_sock_t *b = sock_new(ctx, FL_TP_PAIR, "pipe-b", NULL);
    link_socks(xp, a, b);
    fl_tp_sock_set_stamp(a, "job-pair", 1, 10);
    fl_tp_sock_set_stamp(b, "job-pair", 1, 11);
    send_chunk(a, NULL, 4);
    send_chunk(b, NULL, 5);
    fl_tp_msg_t m;
    recv_ok(b, &m);
    check_chunk(&m, 4);
    ck_assert_int_eq(m.hdr.sender, 10);
    fl_tp_msg_close(&m);
    recv_ok(a, &m);
    check_chunk(&m, 5);
    ck_assert_int_eq(m.hdr.sender, 11);
    fl_tp_msg_close(&m);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), 2);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_RECV), 2);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_RECV), 2 * chunk_total_bytes());
    fl_tp_sock_destroy(&a);
    fl_tp_sock_destroy(&b);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_stamp)
{
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "rx", NULL);
    fl_tp_sock_t *plain = sock_new(ctx, FL_TP_PUSH, "plain", NULL);
    fl_tp_sock_t *stamped = sock_new(ctx, FL_TP_PUSH, "stamped", NULL);
    link_socks(XP_INPROC, rx, plain);
    fl_tp_sock_set_stamp(stamped, "job-7", 42, 3);

    /* Without a stamp, the caller's job, generation and sender go out as they are. */
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_BARRIER, 99);
    snprintf(h.job_id, sizeof h.job_id, "caller-job");
    h.generation = 5;
    h.u.barrier.id = 123;
    h.u.barrier.round = 4;
    ck_assert_int_eq(fl_tp_send(plain, NULL, &h, NULL, 0, fl_deadline_in(WAIT_MS)), FL_OK);
    fl_tp_msg_t m;
    recv_ok(rx, &m);
    ck_assert_int_eq(m.hdr.type, FL_MSG_BARRIER);
    ck_assert_str_eq(m.hdr.job_id, "caller-job");
    ck_assert_uint_eq(m.hdr.generation, 5);
    ck_assert_int_eq(m.hdr.sender, 99);
    ck_assert_uint_eq(m.hdr.u.barrier.id, 123);
    ck_assert_uint_eq(m.hdr.u.barrier.round, 4);
    ck_assert_uint_eq(m.nframes, 0);
    fl_tp_msg_close(&m);

    /* With a stamp, the socket's values replace the caller's. */
    char bound[FL_ENDPOINT_MAX];
    fl_tp_sock_t *rx2 = sock_new(ctx, FL_TP_PULL, "rx2", NULL);
    ck_assert_int_eq(fl_tp_sock_bind(rx2, "inproc://tp-stamp", bound, sizeof bound), FL_OK);
    ck_assert_int_eq(fl_tp_sock_connect(stamped, bound), FL_OK);
    fl_msg_hdr_init(&h, FL_MSG_BARRIER, 99);
    snprintf(h.job_id, sizeof h.job_id, "caller-job");
    h.generation = 5;
    ck_assert_int_eq(fl_tp_send(stamped, NULL, &h, NULL, 0, fl_deadline_in(WAIT_MS)), FL_OK);
    recv_ok(rx2, &m);
    ck_assert_str_eq(m.hdr.job_id, "job-7");
    ck_assert_uint_eq(m.hdr.generation, 42);
    ck_assert_int_eq(m.hdr.sender, 3);
    fl_tp_msg_close(&m);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), 2);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_BYTES_SENT), 0);

    ck_assert_str_eq(fl_tp_sock_name(stamped), "stamped");
    ck_assert_ptr_eq(fl_tp_sock_ctx(stamped), ctx);
    fl_tp_sock_destroy(&stamped);
    fl_tp_sock_destroy(&plain);
    fl_tp_sock_destroy(&rx2);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* Identifiers and texts are data: a '%' in them must arrive as it was sent. */
START_TEST(test_percent_in_strings)
{
    static const char job[] = "run-100%%-a";
    static const char text[] = "at 50%% done";
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "rx", NULL);
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "tx", NULL);
    link_socks(XP_INPROC, rx, tx);
    fl_tp_sock_set_stamp(tx, job, 1, 0);

    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_ERROR, 0);
    h.u.error.code = FL_EPEER;
    snprintf(h.u.error.text, sizeof h.u.error.text, "%s", text);
    ck_assert_int_eq(fl_tp_send(tx, NULL, &h, NULL, 0, fl_deadline_in(WAIT_MS)), FL_OK);
    fl_tp_msg_t m;
    recv_ok(rx, &m);
    char got_job[FL_JOB_MAX];
    char got_text[FL_MSG_TEXT_MAX];
    snprintf(got_job, sizeof got_job, "%s", m.hdr.job_id);
    snprintf(got_text, sizeof got_text, "%s", m.hdr.u.error.text);
    fl_tp_msg_close(&m);
    if (strcmp(got_job, job) != 0 || strcmp(got_text, text) != 0)
        ck_abort_msg("sent job id '%s' and error text '%s', received '%s' and '%s' (the "
                     "decoder uses them as printf formats)",
                     job, text, got_job, got_text);

    /* A receiver expecting that very job must accept it. */
    fl_tp_sock_set_expect(rx, job, 1);
    send_small(tx, NULL, 1);
    int rc = fl_tp_recv(rx, &m, fl_deadline_in(WAIT_MS));
    ck_assert_msg(rc == FL_OK, "message of job '%s' refused by a socket expecting it: %s", job,
                  fl_last_error());
    fl_tp_msg_close(&m);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* ---- zero copy ---- */

typedef struct hook_rec {
    atomic_int calls;
    void *data_seen; /* written before calls is incremented */
    void *hint_seen;
} hook_rec_t;

/* Frees the payload like a real owner would, so ASan sees any use after the release. */
static void hook_free(void *data, void *hint)
{
    hook_rec_t *r = hint;
    r->data_seen = data;
    r->hint_seen = hint;
    free(data);
    atomic_fetch_add(&r->calls, 1);
}

static void hook_init(hook_rec_t *r)
{
    atomic_init(&r->calls, 0);
    r->data_seen = NULL;
    r->hint_seen = NULL;
}

/* Waits (bounded) until the hook ran at least want times, then a little longer to catch a
 * second call; true when it ran exactly want times. */
static bool hook_settles(hook_rec_t *r, int want)
{
    int64_t deadline = fl_deadline_in(3000);
    while (atomic_load(&r->calls) < want && fl_now_ms() < deadline)
        usleep(1000);
    usleep(20000);
    return atomic_load(&r->calls) == want;
}

static uint8_t *pattern_buf(size_t len, uint64_t salt, size_t frame)
{
    uint8_t *b = malloc(len);
    ck_assert_ptr_nonnull(b);
    for (size_t j = 0; j < len; j++)
        b[j] = pattern(salt, frame, j);
    return b;
}

START_TEST(test_zero_copy)
{
    const int xp = _i;
    enum { LEN0 = 4096, LEN1 = 1000, LEN2 = 150000 };
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "rx", NULL);
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "tx", NULL);
    link_socks(xp, rx, tx);

    hook_rec_t r0;
    hook_rec_t r2;
    hook_init(&r0);
    hook_init(&r2);
    uint8_t *d0 = pattern_buf(LEN0, 7, 0);
    uint8_t *d1 = pattern_buf(LEN1, 7, 1);
    uint8_t *d2 = pattern_buf(LEN2, 7, 2);
    fl_buf_t frames[3] = {
        {.data = d0, .len = LEN0, .hint = &r0, .release = hook_free},
        {.data = d1, .len = LEN1}, /* no hook: copied */
        {.data = d2, .len = LEN2, .hint = &r2, .release = hook_free},
    };
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    ck_assert_int_eq(fl_tp_send(tx, NULL, &h, frames, 3, fl_deadline_in(WAIT_MS)), FL_OK);
    /* The copied frame's buffer is the caller's again at once. */
    memset(d1, 0xEE, LEN1);
    if (xp == XP_INPROC) {
        /* inproc moves the message itself: the receiver still holds the sender's memory. */
        ck_assert_int_eq(atomic_load(&r0.calls), 0);
        ck_assert_int_eq(atomic_load(&r2.calls), 0);
    }

    fl_tp_msg_t m;
    recv_ok(rx, &m);
    ck_assert_uint_eq(m.nframes, 3);
    static const size_t lens[3] = {LEN0, LEN1, LEN2};
    for (size_t i = 0; i < 3; i++) {
        if (fl_tp_msg_size(&m, i) != lens[i])
            ck_abort_msg("frame %zu: %zu bytes, want %zu", i, fl_tp_msg_size(&m, i), lens[i]);
        const uint8_t *d = fl_tp_msg_data(&m, i);
        for (size_t j = 0; j < lens[i]; j++) {
            if (d[j] != pattern(7, i, j))
                ck_abort_msg("%s: frame %zu byte %zu is %u, want %u", xp_names[xp], i, j, d[j],
                             pattern(7, i, j));
        }
    }
    ck_assert_ptr_ne(fl_tp_msg_data(&m, 1), d1);
    if (xp == XP_INPROC) {
        ck_assert_ptr_eq(fl_tp_msg_data(&m, 0), d0);
        ck_assert_ptr_eq(fl_tp_msg_data(&m, 2), d2);
        ck_assert_int_eq(atomic_load(&r0.calls), 0);
    }
    fl_tp_msg_close(&m);

    ck_assert_msg(hook_settles(&r0, 1), "%s: hook of frame 0 ran %d times", xp_names[xp],
                  atomic_load(&r0.calls));
    ck_assert_msg(hook_settles(&r2, 1), "%s: hook of frame 2 ran %d times", xp_names[xp],
                  atomic_load(&r2.calls));
    ck_assert_ptr_eq(r0.data_seen, d0);
    ck_assert_ptr_eq(r0.hint_seen, &r0);
    ck_assert_ptr_eq(r2.data_seen, d2);
    ck_assert_ptr_eq(r2.hint_seen, &r2);
    free(d1);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_zero_copy_failed_send)
{
    enum { NH = 17 };
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *router = sock_new(ctx, FL_TP_ROUTER, "coord", NULL);
    char bound[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_bind(router, "tcp://127.0.0.1:0", bound, sizeof bound), FL_OK);

    /* ROUTER to a route nobody has: FL_EPEER, and every hook has run when the call returns. */
    hook_rec_t r[NH];
    fl_buf_t frames[NH];
    void *datas[NH];
    for (int i = 0; i < 3; i++) {
        hook_init(&r[i]);
        datas[i] = pattern_buf(256, 1, (size_t)i);
        frames[i] = (fl_buf_t){.data = datas[i], .len = 256, .hint = &r[i], .release = hook_free};
    }
    fl_tp_route_t nobody = {.len = 6};
    memcpy(nobody.id, "nobody", 6);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, -1);
    int rc = fl_tp_send(router, &nobody, &h, frames, 3, fl_deadline_in(WAIT_MS));
    ck_assert_int_eq(rc, FL_EPEER);
    ck_assert_msg(strstr(fl_last_error(), "coord") != NULL, "detail: %s", fl_last_error());
    for (int i = 0; i < 3; i++) {
        if (atomic_load(&r[i].calls) != 1 || r[i].data_seen != datas[i] || r[i].hint_seen != &r[i])
            ck_abort_msg("frame %d: hook ran %d times, data %p hint %p", i,
                         atomic_load(&r[i].calls), r[i].data_seen, r[i].hint_seen);
    }

    /* Too many frames: FL_EINVAL, and again every hook ran exactly once. */
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "tx", NULL);
    ck_assert_int_eq(fl_tp_sock_connect(tx, bound), FL_OK);
    for (int i = 0; i < NH; i++) {
        hook_init(&r[i]);
        datas[i] = pattern_buf(16, 2, (size_t)i);
        frames[i] = (fl_buf_t){.data = datas[i], .len = 16, .hint = &r[i], .release = hook_free};
    }
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    rc = fl_tp_send(tx, NULL, &h, frames, NH, fl_deadline_in(WAIT_MS));
    ck_assert_int_eq(rc, FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "17") != NULL, "detail: %s", fl_last_error());
    for (int i = 0; i < NH; i++) {
        if (atomic_load(&r[i].calls) != 1 || r[i].data_seen != datas[i])
            ck_abort_msg("frame %d of 17: hook ran %d times", i, atomic_load(&r[i].calls));
    }
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), 0);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&router);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* ---- deadlines ---- */

START_TEST(test_recv_deadline)
{
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "quiet-rx", NULL);
    ck_assert_int_eq(fl_tp_sock_bind(rx, "tcp://127.0.0.1:0", NULL, 0), FL_OK);
    fl_tp_msg_t m;
    int64_t t0 = fl_now_ms();
    int rc = fl_tp_recv(rx, &m, fl_deadline_in(300));
    int64_t took = fl_now_ms() - t0;
    ck_assert_int_eq(rc, FL_ETIMEDOUT);
    ck_assert_msg(took >= 300 && took <= 1300, "timed out after %lld ms, want 300",
                  (long long)took);
    ck_assert_msg(strstr(fl_last_error(), "quiet-rx") != NULL, "detail: %s", fl_last_error());

    /* A deadline already past: at once. */
    t0 = fl_now_ms();
    rc = fl_tp_recv(rx, &m, fl_now_ms() - 10);
    took = fl_now_ms() - t0;
    ck_assert_int_eq(rc, FL_ETIMEDOUT);
    ck_assert_int_le(took, 200);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* The peer never reads and the queues hold one message: sends fill everything there is, then
 * time out at their deadline (and still release their zero-copy frames). */
START_TEST(test_send_deadline)
{
    const int xp = _i == 0 ? XP_INPROC : XP_TCP;
    enum { LEN = 64 * 1024, MAX_SENDS = 4000 };
    fl_ctx_t *ctx = ctx_new();
    fl_tp_opts_t o;
    opts_test(&o);
    o.sndhwm = 1;
    o.rcvhwm = 1;
    o.sndbuf = 4096;
    o.rcvbuf = 4096;
    fl_tp_sock_t *rx = sock_new(ctx, FL_TP_PULL, "deaf-rx", &o);
    fl_tp_sock_t *tx = sock_new(ctx, FL_TP_PUSH, "stuck-tx", &o);
    link_socks(xp, rx, tx);

    uint8_t *buf = pattern_buf(LEN, 3, 0);
    int sent = 0;
    int rc = FL_OK;
    fl_msg_hdr_t h;
    while (sent < MAX_SENDS) {
        fl_buf_t f = {.data = buf, .len = LEN};
        fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
        rc = fl_tp_send(tx, NULL, &h, &f, 1, fl_deadline_in(100));
        if (rc != FL_OK)
            break;
        sent++;
    }
    ck_assert_msg(rc == FL_ETIMEDOUT, "%s: after %d sends: rc %d (%s)", xp_names[xp], sent, rc,
                  fl_last_error());
    ck_assert_int_ge(sent, 1);

    /* Now full: a timed send waits for its whole deadline, then releases its frame. */
    hook_rec_t r;
    hook_init(&r);
    fl_buf_t f = {.data = pattern_buf(LEN, 4, 0), .len = LEN, .hint = &r, .release = hook_free};
    void *data = f.data;
    fl_msg_hdr_init(&h, FL_MSG_CHUNK, 0);
    int64_t t0 = fl_now_ms();
    rc = fl_tp_send(tx, NULL, &h, &f, 1, fl_deadline_in(300));
    int64_t took = fl_now_ms() - t0;
    ck_assert_int_eq(rc, FL_ETIMEDOUT);
    ck_assert_msg(took >= 300 && took <= 1300, "timed out after %lld ms, want 300",
                  (long long)took);
    ck_assert_msg(strstr(fl_last_error(), "stuck-tx") != NULL, "detail: %s", fl_last_error());
    ck_assert_int_eq(atomic_load(&r.calls), 1);
    ck_assert_ptr_eq(r.data_seen, data);
    ck_assert_uint_eq(fl_ctx_stat(ctx, FL_STAT_MSGS_SENT), (uint64_t)sent);
    free(buf);
    fl_tp_sock_destroy(&tx);
    fl_tp_sock_destroy(&rx);
    fl_ctx_destroy(&ctx);
}
END_TEST

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

static void send_raw_ok(fl_tp_sock_t *s, const void *const *parts, const size_t *sizes,
                        size_t n)
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
    ck_assert_int_eq(fl_tp_send(g.tx, NULL, &h, frames, FL_MSG_MAX_FRAMES,
                                fl_deadline_in(WAIT_MS)),
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
            ck_abort_msg("max_msg_bytes %zu: a %d-byte frame did not arrive: %d %s", limits[k],
                         LEN, rc, fl_last_error());
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

/* ---- poll ---- */

START_TEST(test_poll)
{
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *a = sock_new(ctx, FL_TP_PULL, "a", NULL);
    fl_tp_sock_t *b = sock_new(ctx, FL_TP_PULL, "b", NULL);
    fl_tp_sock_t *ta = sock_new(ctx, FL_TP_PUSH, "ta", NULL);
    fl_tp_sock_t *tb = sock_new(ctx, FL_TP_PUSH, "tb", NULL);
    link_socks(XP_INPROC, a, ta);
    link_socks(XP_TCP, b, tb);
    fl_tp_sock_t *const socks[2] = {a, b};
    bool ready[2] = {true, true};

    int64_t t0 = fl_now_ms();
    ck_assert_int_eq(fl_tp_poll(socks, 2, 150, ready), 0);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(!ready[0] && !ready[1], "ready %d %d on timeout", ready[0], ready[1]);
    ck_assert_msg(took >= 140 && took <= 1150, "poll timed out after %lld ms, want 150",
                  (long long)took);

    send_small(tb, NULL, 40);
    ck_assert_int_eq(fl_tp_poll(socks, 2, WAIT_MS, ready), 1);
    ck_assert_msg(!ready[0] && ready[1], "ready %d %d, want 0 1", ready[0], ready[1]);

    send_small(ta, NULL, 41);
    ck_assert_int_eq(fl_tp_poll(socks, 2, WAIT_MS, ready), 2);
    ck_assert_msg(ready[0] && ready[1], "ready %d %d, want 1 1", ready[0], ready[1]);

    recv_small(a, 41);
    recv_small(b, 40);
    ck_assert_int_eq(fl_tp_poll(socks, 2, 0, ready), 0);
    ck_assert_msg(!ready[0] && !ready[1], "ready %d %d after draining", ready[0], ready[1]);

    fl_tp_sock_destroy(&ta);
    fl_tp_sock_destroy(&tb);
    fl_tp_sock_destroy(&a);
    fl_tp_sock_destroy(&b);
    fl_ctx_destroy(&ctx);
}
END_TEST

/* ---- endpoints ---- */

START_TEST(test_endpoint_parse_valid)
{
    static const struct {
        const char *ep;
        fl_tp_scheme_t scheme;
        const char *host;
        int port;
    } ok[] = {
        {"tcp://host:1234", FL_TP_TCP, "host", 1234},
        {"tcp://*:0", FL_TP_TCP, "*", 0},
        {"tcp://10.1.2.3:65535", FL_TP_TCP, "10.1.2.3", 65535},
        {"tcp://[::1]:5555", FL_TP_TCP, "::1", 5555},
        {"tcp://[fe80::1:2]:1", FL_TP_TCP, "fe80::1:2", 1},
        {"ipc:///tmp/x", FL_TP_IPC, "/tmp/x", 0},
        {"inproc://name", FL_TP_INPROC, "name", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        fl_tp_endpoint_t e;
        int rc = fl_tp_endpoint_parse(ok[i].ep, &e);
        if (rc != FL_OK)
            ck_abort_msg("parse '%s': %d %s", ok[i].ep, rc, fl_last_error());
        if (e.scheme != ok[i].scheme || strcmp(e.host, ok[i].host) != 0 || e.port != ok[i].port)
            ck_abort_msg("parse '%s': scheme %d host '%s' port %d", ok[i].ep, (int)e.scheme,
                         e.host, e.port);
    }
}
END_TEST

START_TEST(test_endpoint_parse_invalid)
{
    static const char *const bad[] = {
        "udp://x:1",      "tcp://host",  "tcp://host:70000", "tcp://:5",
        "tcp://host:abc", "tcp://host:", "tcp://host:-1",    "tcp://[::1]",
        "tcp://[::1:5",   "ipc://",      "inproc://",        "host:5",
    };
    fl_tp_endpoint_t e;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fl_error_clear();
        int rc = fl_tp_endpoint_parse(bad[i], &e);
        if (rc != FL_EINVAL)
            ck_abort_msg("parse '%s': %d, want FL_EINVAL", bad[i], rc);
        if (strstr(fl_last_error(), bad[i]) == NULL)
            ck_abort_msg("parse '%s': detail '%s' does not name it", bad[i], fl_last_error());
    }
    ck_assert_int_eq(fl_tp_endpoint_parse("", &e), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "empty") != NULL, "detail: %s", fl_last_error());
    ck_assert_int_eq(fl_tp_endpoint_parse(NULL, &e), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "empty") != NULL, "detail: %s", fl_last_error());

    char lng[FL_ENDPOINT_MAX + 16];
    memset(lng, 'a', sizeof lng);
    memcpy(lng, "tcp://", 6);
    snprintf(lng + FL_ENDPOINT_MAX, sizeof lng - FL_ENDPOINT_MAX, ":1234");
    ck_assert_int_eq(fl_tp_endpoint_parse(lng, &e), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "tcp://aaaaaaaa") != NULL &&
                      strstr(fl_last_error(), "longer") != NULL,
                  "detail: %s", fl_last_error());
    /* The longest that fits is fine. */
    memset(lng, 'a', sizeof lng);
    memcpy(lng, "inproc://", 9);
    lng[FL_ENDPOINT_MAX - 1] = '\0';
    ck_assert_int_eq(fl_tp_endpoint_parse(lng, &e), FL_OK);
}
END_TEST

START_TEST(test_endpoint_advertise)
{
    static const struct {
        const char *bound;
        const char *host;
        const char *want;
    } cases[] = {
        {"tcp://0.0.0.0:4242", "node7", "tcp://node7:4242"},
        {"tcp://*:4242", "10.1.2.3", "tcp://10.1.2.3:4242"},
        {"tcp://0.0.0.0:4242", "fe80::1", "tcp://[fe80::1]:4242"},
        {"tcp://[::]:4243", "::1", "tcp://[::1]:4243"},
        {"ipc:///tmp/flodl.sock", "node7", "ipc:///tmp/flodl.sock"},
        {"inproc://data-0", "node7", "inproc://data-0"},
    };
    char out[FL_ENDPOINT_MAX];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = fl_tp_endpoint_advertise(cases[i].bound, cases[i].host, out, sizeof out);
        if (rc != FL_OK || strcmp(out, cases[i].want) != 0)
            ck_abort_msg("advertise(%s, %s): %d '%s', want '%s'", cases[i].bound, cases[i].host,
                         rc, rc == FL_OK ? out : fl_last_error(), cases[i].want);
    }
    ck_assert_int_eq(fl_tp_endpoint_advertise("udp://x:1", "h", out, sizeof out), FL_EINVAL);
    char small[12];
    ck_assert_int_eq(fl_tp_endpoint_advertise("tcp://0.0.0.0:4242", "node7", small, sizeof small),
                     FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "node7") != NULL, "detail: %s", fl_last_error());
}
END_TEST

START_TEST(test_local_addr_towards)
{
    char out[64];
    ck_assert_int_eq(fl_tp_local_addr_towards("tcp://127.0.0.1:1", out, sizeof out), FL_OK);
    ck_assert_str_eq(out, "127.0.0.1");
    memset(out, 0, sizeof out);
    ck_assert_int_eq(fl_tp_local_addr_towards("ipc:///tmp/x", out, sizeof out), FL_OK);
    ck_assert_str_eq(out, "127.0.0.1");
    memset(out, 0, sizeof out);
    ck_assert_int_eq(fl_tp_local_addr_towards("inproc://x", out, sizeof out), FL_OK);
    ck_assert_str_eq(out, "127.0.0.1");
    int rc = fl_tp_local_addr_towards("tcp://no-such-host.invalid:1", out, sizeof out);
    ck_assert_int_eq(rc, FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "no-such-host.invalid") != NULL, "detail: %s",
                  fl_last_error());
    ck_assert_int_eq(fl_tp_local_addr_towards("tcp://host", out, sizeof out), FL_EINVAL);
}
END_TEST

START_TEST(test_is_ip_literal)
{
    static const char *const yes[] = {"127.0.0.1", "0.0.0.0", "10.1.2.3", "::1", "::",
                                      "fe80::1",   "2001:db8::8a2e:370:7334"};
    static const char *const no[] = {"", "localhost", "host-1", "1.2.3", "256.1.1.1", "[::1]",
                                     "*", "1.2.3.4:5", "::1:::"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        if (!fl_tp_is_ip_literal(yes[i]))
            ck_abort_msg("'%s' is an IP literal", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        if (fl_tp_is_ip_literal(no[i]))
            ck_abort_msg("'%s' is not an IP literal", no[i]);
    }
}
END_TEST

/* ---- bind and create errors ---- */

START_TEST(test_bind_errors)
{
    fl_ctx_t *ctx = ctx_new();
    fl_tp_sock_t *a = sock_new(ctx, FL_TP_PULL, "first", NULL);
    fl_tp_sock_t *b = sock_new(ctx, FL_TP_PULL, "second", NULL);
    char bound[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_bind(a, "tcp://127.0.0.1:0", bound, sizeof bound), FL_OK);
    int rc = fl_tp_sock_bind(b, bound, NULL, 0);
    ck_assert_int_eq(rc, FL_EIO);
    ck_assert_msg(strstr(fl_last_error(), bound) != NULL &&
                      strstr(fl_last_error(), "second") != NULL,
                  "detail '%s' should name %s and the socket", fl_last_error(), bound);

    ck_assert_int_eq(fl_tp_sock_bind(a, "inproc://tp-taken", NULL, 0), FL_OK);
    ck_assert_int_eq(fl_tp_sock_bind(b, "inproc://tp-taken", NULL, 0), FL_EIO);
    ck_assert_msg(strstr(fl_last_error(), "inproc://tp-taken") != NULL, "detail: %s",
                  fl_last_error());

    ck_assert_int_eq(fl_tp_sock_bind(b, "udp://127.0.0.1:0", NULL, 0), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "udp://127.0.0.1:0") != NULL &&
                      strstr(fl_last_error(), "bind") != NULL,
                  "detail: %s", fl_last_error());
    ck_assert_int_eq(fl_tp_sock_connect(b, "tcp://127.0.0.1"), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "tcp://127.0.0.1") != NULL &&
                      strstr(fl_last_error(), "connect") != NULL,
                  "detail: %s", fl_last_error());
    fl_tp_sock_destroy(&a);
    fl_tp_sock_destroy(&b);
    fl_ctx_destroy(&ctx);
}
END_TEST

START_TEST(test_create_errors)
{
    fl_ctx_t *ctx = ctx_new();
    for (int which = 0; which < 3; which++) {
        fl_tp_opts_t o;
        opts_test(&o);
        if (which == 0)
            o.sndhwm = -1;
        else if (which == 1)
            o.rcvhwm = -5;
        else
            o.linger_ms = -2;
        static char not_null;
        fl_tp_sock_t *s = (fl_tp_sock_t *)&not_null;
        int rc = fl_tp_sock_create(ctx, FL_TP_PUSH, &o, "bad-opts", &s);
        if (rc != FL_EINVAL || s != NULL)
            ck_abort_msg("case %d: rc %d out %p, want FL_EINVAL and NULL", which, rc, (void *)s);
        if (strstr(fl_last_error(), "bad-opts") == NULL)
            ck_abort_msg("case %d: detail '%s' does not name the socket", which,
                         fl_last_error());
    }
    fl_ctx_destroy(&ctx);
}
END_TEST

static void teardown(void)
{
    unlink_ipc();
}

Suite *tp_suite(void);
Suite *tp_suite(void)
{
    Suite *s = suite_create("tp");
    TCase *t = tcase_create("patterns");
    tcase_set_timeout(t, 30);
    tcase_add_checked_fixture(t, NULL, teardown);
    tcase_add_loop_test(t, test_push_pull, 0, XP_COUNT);
    tcase_add_loop_test(t, test_dealer_router, 0, XP_COUNT);
    tcase_add_loop_test(t, test_pair, 0, XP_COUNT);
    tcase_add_test(t, test_stamp);
    tcase_add_test(t, test_percent_in_strings);
    suite_add_tcase(s, t);

    t = tcase_create("zero_copy");
    tcase_set_timeout(t, 30);
    tcase_add_checked_fixture(t, NULL, teardown);
    tcase_add_loop_test(t, test_zero_copy, 0, XP_COUNT);
    tcase_add_test(t, test_zero_copy_failed_send);
    suite_add_tcase(s, t);

    t = tcase_create("deadlines");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_recv_deadline);
    tcase_add_loop_test(t, test_send_deadline, 0, 2);
    suite_add_tcase(s, t);

    t = tcase_create("refused");
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
    suite_add_tcase(s, t);

    t = tcase_create("poll");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_poll);
    suite_add_tcase(s, t);

    t = tcase_create("endpoints");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_endpoint_parse_valid);
    tcase_add_test(t, test_endpoint_parse_invalid);
    tcase_add_test(t, test_endpoint_advertise);
    tcase_add_test(t, test_local_addr_towards);
    tcase_add_test(t, test_is_ip_literal);
    tcase_add_test(t, test_bind_errors);
    tcase_add_test(t, test_create_errors);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(tp_suite());
}
