/* Transport sockets and messages (tp_sock.c, tp_msg.c): a header plus payload frames over
 * inproc, ipc and tcp for PUSH/PULL, DEALER/ROUTER and PAIR, with job stamps and counters;
 * zero-copy release hooks, also on failed sends; send and receive deadlines. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_tp.h"
#include "tputil.h"

static const char *const xp_names[XP_COUNT] = {"inproc", "ipc", "tcp"};

/* ---- sockets and links ---- */

static void unlink_ipc(void)
{
    for (int i = 0; i < nipc; i++)
        unlink(ipc_paths[i]);
    nipc = 0;
}

/* ---- the reference message: a chunk header and five payload frames ---- */

#define NF 5
static const size_t frame_len[NF] = {0, 7, 4096, 200000, 100};
static const uint32_t frame_dtype[NF] = {0, FL_UINT8, FL_FLOAT32, FL_FLOAT64, FL_FLOAT32};
static const uint32_t frame_codec[NF] = {FL_CODEC_RAW, FL_CODEC_RAW, FL_CODEC_RAW, FL_CODEC_RAW,
                                         FL_CODEC_LZ4};
#define LZ4_RAW_BYTES 400 /* what the lz4 frame claims to decode to */

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
            ck_abort_msg("frame %zu: %zu bytes, want %zu", i, fl_tp_msg_size(m, i), frame_len[i]);
        const uint8_t *d = fl_tp_msg_data(m, i);
        for (size_t j = 0; j < frame_len[i]; j++) {
            if (d[j] != pattern(salt, i, j))
                ck_abort_msg("frame %zu byte %zu: %u, want %u", i, j, d[j], pattern(salt, i, j));
        }
    }
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

static void teardown(void)
{
    unlink_ipc();
}

Suite *tp_patterns_suite(void);
Suite *tp_patterns_suite(void)
{
    Suite *s = suite_create("tp_patterns");
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
    return s;
}

int main(void)
{
    return fl_test_run(tp_patterns_suite());
}
