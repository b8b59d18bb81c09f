/* The coordinator against hostile and malformed messages (bare DEALER sockets): bad versions,
 * garbage, payload and oversized frames, strangers' heartbeats; and text from the wire (host
 * names, job ids, goodbyes) that must neither forge a log line nor break a welcome, with the
 * warnings for a flood rate-limited. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "coordutil.h"

typedef struct raw_out {
    void *data;
} raw_out_t;

static void *raw_alloc(size_t len, void *ud)
{
    raw_out_t *o = ud;
    o->data = malloc(len > 0 ? len : 1);
    return o->data;
}

/* Sends h as encoded, bypassing fl_tp_send (which would stamp the current version). */
static void send_encoded(fl_tp_sock_t *s, const fl_msg_hdr_t *h)
{
    raw_out_t o = {NULL};
    size_t len = 0;
    int rc = fl_msg_encode(h, raw_alloc, &o, &len);
    ck_assert_msg(rc == FL_OK, "encode: %s", fl_last_error());
    const void *parts[1] = {o.data};
    size_t sizes[1] = {len};
    rc = fl_tp_send_raw(s, parts, sizes, 1);
    free(o.data);
    ck_assert_msg(rc == FL_OK, "raw send: %s", fl_last_error());
}

static void send_bytes(fl_tp_sock_t *s, const void *data, size_t len)
{
    const void *parts[1] = {data};
    size_t sizes[1] = {len};
    int rc = fl_tp_send_raw(s, parts, sizes, 1);
    ck_assert_msg(rc == FL_OK, "raw send: %s", fl_last_error());
}

/* Registers every rank from fresh sockets and expects each to be welcomed. */
static void assert_still_serves(env_t *e, int world)
{
    fl_tp_sock_t *s[MAX_FAKES];
    for (int r = 0; r < world; r++) {
        s[r] = fake_open(e);
        send_reg(s[r], r, world);
    }
    for (int r = 0; r < world; r++)
        expect_welcome(s[r], world, NULL);
    ck_assert_int_eq(fl_coord_registered(e->coord), world);
}

/* ---- hostile and malformed messages ---- */

START_TEST(test_bad_version)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    build_register(&h, &r);
    h.version = 2;
    send_encoded(x, &h);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "protocol version 2");
    ASSERT_HAS(err.text, "protocol version 1");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_VERSION), 1);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

START_TEST(test_garbage_and_bad_magic)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    static const uint8_t garbage[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    send_bytes(x, garbage, sizeof garbage);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "refused");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);

    /* Header field 1 (fixed32 magic) = 0x11223344. */
    static const uint8_t magic[5] = {0x0d, 0x44, 0x33, 0x22, 0x11};
    send_bytes(x, magic, sizeof magic);
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "magic");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_MAGIC), 1);
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

START_TEST(test_payload_frames_refused)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    build_register(&h, &r);
    char payload[16] = "sixteen bytes...";
    fl_buf_t f = {payload, sizeof payload, NULL, NULL};
    ck_assert_int_eq(fl_tp_send(x, NULL, &h, &f, 1, fl_deadline_in(1000)), FL_OK);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "register");
    ASSERT_HAS(err.text, "payload frame");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_UNEXPECTED), 1);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

START_TEST(test_oversized_frame)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    size_t len = FL_COORD_MAX_MSG + FL_COORD_MAX_MSG / 2;
    char *big = calloc(1, len);
    ck_assert(big != NULL);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, 0);
    fl_buf_t f = {big, len, NULL, NULL};
    ck_assert_int_eq(fl_tp_send(x, NULL, &h, &f, 1, fl_deadline_in(1000)), FL_OK);
    free(big);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 3000, &err);
    ASSERT_HAS(err.text, "limit");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_OVERSIZED), 1);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

START_TEST(test_huge_frame_drops_connection)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    size_t len = (size_t)64 << 20;
    char *big = calloc(1, len);
    ck_assert(big != NULL);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    build_register(&h, &r);
    fl_buf_t f = {big, len, NULL, NULL};
    ck_assert_int_eq(fl_tp_send(x, NULL, &h, &f, 1, fl_deadline_in(1000)), FL_OK);
    free(big);
    /* Over the coordinator's bound on what a peer makes it hold (17 MiB): ZeroMQ closes the
     * connection before the coordinator sees anything, no answer, no count (libzmq 4.3's
     * monitor does not tell this from a disconnect). */
    expect_quiet(x, 500);
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_OVERSIZED), 0);
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_ERRORS_SENT), 0);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

START_TEST(test_unregistered_heartbeat_and_shutdown)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 2);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    send_ctl(x, FL_MSG_HEARTBEAT, 0);
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_UNEXPECTED, 1, 2000), 1);
    expect_quiet(x, 100);
    send_ctl(x, FL_MSG_SHUTDOWN, 0);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "unregistered");
    ASSERT_HAS(err.text, "rank 0");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_UNEXPECTED), 2);
    /* The real rank 0 keeps its slot: an impostor's shutdown does not free it. */
    ck_assert_int_eq(fl_coord_registered(e.coord), 1);
    ck_assert_int_eq(fl_coord_active(e.coord), 1);
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(b, 1, 2);
    expect_welcome(a, 2, NULL);
    expect_welcome(b, 2, NULL);
    env_end(&e);
}
END_TEST

/* ---- text from the wire ---- */

/* Sends h encoded, with the bytes `find` (once in the encoding) replaced by `repl` of the same
 * length: how a hostile peer puts text on the wire that the encoder refuses to write. */
static void send_patched(fl_tp_sock_t *s, const fl_msg_hdr_t *h, const char *find, const char *repl,
                         size_t n)
{
    raw_out_t o = {NULL};
    size_t len = 0;
    int rc = fl_msg_encode(h, raw_alloc, &o, &len);
    ck_assert_msg(rc == FL_OK, "encode: %s", fl_last_error());
    uint8_t *at = memmem(o.data, len, find, n);
    ck_assert_msg(at != NULL, "'%s' not in the encoding", find);
    memcpy(at, repl, n);
    send_bytes(s, o.data, len);
    free(o.data);
}

/* The coordinator's log goes to a file from here on (this case runs in its own process). */
static void log_to(char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/flodl-coord-log-%d.txt", (int)getpid());
    fflush(stderr);
    ck_assert_ptr_nonnull(freopen(path, "w", stderr));
}

/* Fails if a line of the log was written by the text of a message: one that starts like the
 * coordinator's own lines but says what the hostile text said. */
static void assert_log_unforged(const char *path, const char *forged)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        n++;
        if (strstr(line, forged) != NULL) {
            fclose(f);
            unlink(path);
            ck_abort_msg("log line %d was written by a peer: %s", n, line);
        }
    }
    fclose(f);
    unlink(path);
    ck_assert_msg(n > 0, "nothing logged");
}

#define FORGED "[0.000 ps] error: rank 1 (host-1, pid 1001) declared dead"

/* Lines of the log file at path holding needle (the file stays). */
static int log_count(const char *path, const char *needle)
{
    fflush(stderr);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A flood of bad messages gives a few warnings, not one line each: the rest are counted (and
 * summed up once the window ends); the counters still see every one. From 40 connections of
 * 25 each: one connection's 33rd within 10 s would reset it (test_header_flood_heartbeats). */
START_TEST(test_bad_message_warnings_rate_limited)
{
    char log[128];
    log_to(log, sizeof log);
    env_t e;
    env_start_log(&e, 2, 0, 0, 0, FL_LOG_WARN);
    static const uint8_t garbage[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    void *zs[40];
    int zero = 0;
    for (int c = 0; c < 40; c++) {
        zs[c] = zmq_socket(fl_ctx_zmq(e.ctx), ZMQ_DEALER);
        zmq_setsockopt(zs[c], ZMQ_LINGER, &zero, sizeof zero);
        ck_assert_int_eq(zmq_connect(zs[c], fl_coord_endpoint(e.coord)), 0);
        for (int i = 0; i < 25; i++)
            ck_assert_int_eq(zmq_send(zs[c], garbage, sizeof garbage, 0), (int)sizeof garbage);
    }
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_BAD_HEADER, 1000, 10000), 1000);
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_CONN_CUT), 0);
    for (int c = 0; c < 40; c++)
        zmq_close(zs[c]);
    assert_still_serves(&e, 2);
    int lines = log_count(log, "refused a message");
    ck_assert_msg(lines >= 1 && lines <= 10,
                  "%d warning lines for 1000 bad "
                  "messages",
                  lines);
    env_end(&e);
    unlink(log);
}
END_TEST

/* Every refused registration is logged at warn with both sides' values, not only answered. */
START_TEST(test_refused_registrations_logged)
{
    char log[128];
    log_to(log, sizeof log);
    env_t e;
    env_start_log(&e, 3, 0, 0, 0, FL_LOG_WARN);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_error_t err;
    reg_spec_t r = spec_of(1, 5);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    r = spec_of(7, 3);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    r = spec_of(1, 3);
    r.job = "other-job";
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    env_end(&e);
    ck_assert_int_eq(log_count(log, "expects world size 5, the coordinator expects 3"), 1);
    ck_assert_int_eq(log_count(log, "rank 7 (host host-7) is out of range 0..2"), 1);
    ck_assert_int_eq(log_count(log, "of job 'other-job': this is job '" JOB "'"), 1);
    unlink(log);
}
END_TEST

/* A host name that is not UTF-8 would be copied into every rank's welcome, which protobuf's
 * decoders in other languages refuse: the registration is refused as malformed instead. */
START_TEST(test_host_not_utf8)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    r.host = "node-~~";
    build_register(&h, &r);
    send_patched(x, &h, "node-~~", "node-\xff\xfe", 7);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "Register.host");
    ASSERT_HAS(err.text, "not UTF-8");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

/* A newline in a host name would start a line of the coordinator's log that the peer wrote. */
START_TEST(test_newline_in_host)
{
    char log[128];
    log_to(log, sizeof log);
    env_t e;
    env_start_log(&e, 2, 0, 0, 0, FL_LOG_INFO);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    r.host = "evil~" FORGED;
    build_register(&h, &r);
    send_patched(x, &h, "evil~", "evil\n", 5);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "Register.host has a control character at byte 4");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
    assert_log_unforged(log, "declared dead");
}
END_TEST

/* So would a newline in a rank's goodbye: refused, and the rank has not left. */
START_TEST(test_newline_in_shutdown_text)
{
    char log[128];
    log_to(log, sizeof log);
    env_t e;
    env_start_log(&e, 2, 0, 0, 0, FL_LOG_INFO);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(a, 0, 2);
    send_reg(b, 1, 2);
    uint64_t gen = 0;
    expect_welcome(a, 2, &gen);
    expect_welcome(b, 2, NULL);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, 0);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    h.generation = gen;
    snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "bye~%s", FORGED);
    send_patched(a, &h, "bye~", "bye\n", 4);
    fl_msg_error_t err;
    expect_error(a, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "Shutdown.text has a control character at byte 3");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);
    ck_assert_int_eq(fl_coord_active(e.coord), 2);
    ck_assert_int_eq(fl_coord_wait(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
    assert_log_unforged(log, "declared dead");
}
END_TEST

/* protobuf-c hands strings over NUL-terminated: a job id "coord-test\0evil" would be taken for
 * "coord-test". It is refused. */
START_TEST(test_nul_in_job_id)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    fl_msg_hdr_t h;
    reg_spec_t r = spec_of(0, 2);
    r.job = JOB "~evil";
    build_register(&h, &r);
    send_patched(x, &h, JOB "~", JOB "\0", sizeof JOB);
    fl_msg_error_t err;
    expect_error(x, FL_EPROTO, 2000, &err);
    ASSERT_HAS(err.text, "Header.job_id has a NUL byte at byte 10");
    ck_assert_uint_eq(fl_coord_stat(e.coord, FL_STAT_BAD_HEADER), 1);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    assert_still_serves(&e, 2);
    env_end(&e);
}
END_TEST

/* Identifiers are carried verbatim (proto/msg_decode.c refuses rather than truncates them),
 * so a job id with percent signs must come back as sent. */
START_TEST(test_percent_in_job_id)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *x = fake_open(&e);
    reg_spec_t r = spec_of(0, 2);
    r.job = "job%%%%%%%%x";
    send_spec(x, &r);
    fl_msg_error_t err;
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "'job%%%%%%%%x'");
    env_end(&e);
}
END_TEST

/* Error texts travel intact too: a host name with percent signs, quoted in a refusal. */
START_TEST(test_percent_in_error_text)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 2);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    reg_spec_t r = spec_of(0, 2);
    r.host = "node%%%%1";
    send_spec(x, &r);
    fl_msg_error_t err;
    expect_error(x, FL_EINVAL, 2000, &err);
    ck_assert_str_eq(err.host, "node%%%%1");
    ASSERT_HAS(err.text, "node%%%%1");
    env_end(&e);
}
END_TEST

/* ---- a flood of headers declaring huge frame counts ---- */

typedef struct flood {
    void *zs;
    int64_t until_ms;
    _Atomic uint64_t sent;
} flood_t;

/* Heartbeat headers of about 800 KB, each declaring 200,000 frames, as fast as the socket
 * takes them (a reset connection is opened again by ZeroMQ, as a client's would be). */
static void *flood_main(void *arg)
{
    flood_t *f = arg;
    static const uint8_t head[] = {0x0d, 0x46, 0x4c, 0x44, 0x4c, 0x10, 0x01, 0x1a, 0x0a, 'c', 'o',
                                   'o',  'r',  'd',  '-',  't',  'e',  's',  't',  0x28, 0x04};
    static const uint8_t frame[] = {0x4a, 0x02, 0x08, 0x01};
    size_t n = 200000;
    size_t len = sizeof head + n * sizeof frame;
    uint8_t *buf = malloc(len);
    if (buf == NULL)
        return NULL;
    memcpy(buf, head, sizeof head);
    for (size_t i = 0; i < n; i++)
        memcpy(buf + sizeof head + i * sizeof frame, frame, sizeof frame);
    while (fl_now_ms() < f->until_ms) {
        if (zmq_send(f->zs, buf, len, ZMQ_DONTWAIT) >= 0)
            atomic_fetch_add(&f->sent, 1);
        else if (zmq_errno() == EAGAIN)
            usleep(500);
    }
    free(buf);
    return NULL;
}

/* While one connection floods the coordinator with such headers for 3 s, a registered rank
 * heartbeating every 100 ms still hears the coordinator's heartbeats without a gap near the
 * 2 s timeout, is not declared dead, and the flood is refused, counted, and its connection cut
 * (the refusal costs a scan of the bytes, not an unpack). */
START_TEST(test_header_flood_heartbeats)
{
    env_t e;
    env_start(&e, 1, 100, 2000, 0);
    fl_tp_sock_t *r0 = fake_open(&e);
    send_reg(r0, 0, 1);
    expect_welcome(r0, 1, NULL);
    /* Its own ZeroMQ context: the rank's I/O thread is not the one copying the flood. */
    void *zctx = zmq_ctx_new();
    void *zs = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(zs, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(zs, fl_coord_endpoint(e.coord)), 0);
    flood_t f = {zs, fl_now_ms() + 3000, 0};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, flood_main, &f), 0);
    int64_t last = fl_now_ms();
    int64_t next_beat = 0;
    int64_t worst = 0;
    int beats = 0;
    while (fl_now_ms() < f.until_ms + 500) {
        int64_t now = fl_now_ms();
        if (now >= next_beat) {
            send_ctl(r0, FL_MSG_HEARTBEAT, 0);
            next_beat = now + 100;
        }
        fl_tp_msg_t m;
        if (fl_tp_recv(r0, &m, fl_deadline_in(20)) != FL_OK)
            continue;
        ck_assert_msg(m.hdr.type == FL_MSG_HEARTBEAT, "rank 0 got a %s: %s",
                      fl_msg_type_name(m.hdr.type),
                      m.hdr.type == FL_MSG_ERROR ? m.hdr.u.error.text : "");
        now = fl_now_ms();
        worst = now - last > worst ? now - last : worst;
        last = now;
        beats++;
        fl_tp_msg_close(&m);
    }
    worst = fl_now_ms() - last > worst ? fl_now_ms() - last : worst;
    pthread_join(t, NULL);
    zmq_close(zs);
    zmq_ctx_term(zctx);
    uint64_t refused = fl_coord_stat(e.coord, FL_STAT_BAD_FRAMES);
    uint64_t cut = fl_coord_stat(e.coord, FL_STAT_CONN_CUT);
    fprintf(stderr,
            "header flood: %llu headers sent, %llu refused, %llu connections cut; %d coordinator "
            "heartbeats, the longest gap %lld ms\n",
            (unsigned long long)atomic_load(&f.sent), (unsigned long long)refused,
            (unsigned long long)cut, beats, (long long)worst);
    ck_assert_msg(worst < 1500 && beats >= 10,
                  "the coordinator was silent for %lld ms (timeout 2000), %d heartbeats in 3.5 s",
                  (long long)worst, beats);
    ck_assert_int_eq(fl_coord_active(e.coord), 1);
    ck_assert_msg(refused > 32, "only %llu headers refused", (unsigned long long)refused);
    ck_assert_msg(cut >= 1, "the flood's connection was never cut");
    env_end(&e);
}
END_TEST

Suite *coord_hostile_suite(void);
Suite *coord_hostile_suite(void)
{
    Suite *s = suite_create("coord_hostile");
    TCase *t = tcase_create("hostile");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_bad_version);
    tcase_add_test(t, test_garbage_and_bad_magic);
    tcase_add_test(t, test_bad_message_warnings_rate_limited);
    tcase_add_test(t, test_refused_registrations_logged);
    tcase_add_test(t, test_payload_frames_refused);
    tcase_add_test(t, test_oversized_frame);
    tcase_add_test(t, test_huge_frame_drops_connection);
    tcase_add_test(t, test_unregistered_heartbeat_and_shutdown);
    tcase_add_test(t, test_host_not_utf8);
    tcase_add_test(t, test_newline_in_host);
    tcase_add_test(t, test_newline_in_shutdown_text);
    tcase_add_test(t, test_nul_in_job_id);
    tcase_add_test(t, test_percent_in_job_id);
    tcase_add_test(t, test_percent_in_error_text);
    tcase_add_test(t, test_header_flood_heartbeats);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_hostile_suite());
}
