/* The coordinator (server/coord*.c) in-process on 127.0.0.1, with ranks played by bare DEALER
 * sockets: registration and the peer table, every refusal (duplicate, range, world size, job,
 * tuning, late), hostile bytes, drops and timeouts of the rendezvous, death of a silent rank,
 * leaving and stopping, option checks; then real communicators that are refused, find no
 * coordinator or miss a rank. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "testutil.h"

#define JOB "coord-test"
#define TUNING "seg=1048576,small=65536,algo=0"
#define MAX_FAKES 12

/* Fails with both strings shown unless text contains needle. */
#define ASSERT_HAS(text, needle)                                                               \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text), \
                  (needle))
#define ASSERT_HASNT(text, needle)                                                             \
    ck_assert_msg(strstr((text), (needle)) == NULL, "\"%s\" reveals \"%s\"", (text), (needle))

typedef struct env {
    fl_coord_t *coord;
    fl_ctx_t *ctx; /* the fake ranks' context */
    fl_tp_sock_t *fakes[MAX_FAKES];
    int nfakes;
} env_t;

/* A coordinator for `world` ranks of JOB logging at `level`; 0 keeps an option's default. */
static void env_start_log(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms,
                          fl_log_level_t level)
{
    memset(e, 0, sizeof *e);
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = world;
    o.job_id = JOB;
    o.heartbeat_ms = hb_ms;
    o.heartbeat_timeout_ms = hb_timeout_ms > 0 ? hb_timeout_ms : 3000;
    o.rendezvous_timeout_ms = rdv_ms > 0 ? rdv_ms : 30000;
    o.log_level = level;
    int rc = fl_coord_create(&o, &e->coord);
    ck_assert_msg(rc == FL_OK, "coordinator: %s", fl_last_error());
    rc = fl_coord_start(e->coord);
    ck_assert_msg(rc == FL_OK, "coordinator start: %s", fl_last_error());
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    co.log_name = "fake rank";
    rc = fl_ctx_create(&co, &e->ctx);
    ck_assert_msg(rc == FL_OK, "context: %s", fl_last_error());
}

static void env_start(env_t *e, int world, int hb_ms, int hb_timeout_ms, int rdv_ms)
{
    env_start_log(e, world, hb_ms, hb_timeout_ms, rdv_ms, FL_LOG_OFF);
}

static void env_end(env_t *e)
{
    for (int i = 0; i < e->nfakes; i++)
        fl_tp_sock_destroy(&e->fakes[i]);
    fl_ctx_destroy(&e->ctx);
    fl_coord_stop(e->coord);
    fl_coord_destroy(&e->coord);
}

/* A new connection to the coordinator, as a restarted or hostile process would open. */
static fl_tp_sock_t *fake_open(env_t *e)
{
    ck_assert(e->nfakes < MAX_FAKES);
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    int rc = fl_tp_sock_create(e->ctx, FL_TP_DEALER, &t, "fake", &s);
    ck_assert_msg(rc == FL_OK, "fake socket: %s", fl_last_error());
    rc = fl_tp_sock_connect(s, fl_coord_endpoint(e->coord));
    ck_assert_msg(rc == FL_OK, "fake connect: %s", fl_last_error());
    e->fakes[e->nfakes++] = s;
    return s;
}

typedef struct reg_spec {
    int rank;
    int world;
    const char *job;
    const char *host; /* NULL: "host-<rank>" */
    int pid;
    const char *tuning;
    int nendpoints;
    const char *settings;
} reg_spec_t;

#define SETTINGS "optimizer=sgd;lr=0.05;batch-size=64 per device"

static reg_spec_t spec_of(int rank, int world)
{
    reg_spec_t r = {rank, world, JOB, NULL, 1000 + rank, TUNING, 1 + (rank & 1), SETTINGS};
    return r;
}

/* The data endpoint a fake rank advertises on stripe k. */
static void endpoint_of(int rank, int k, char *out, size_t cap)
{
    snprintf(out, cap, "tcp://10.0.0.%d:%d", (rank & 127) + 1, 20000 + rank * 10 + k);
}

static void build_register(fl_msg_hdr_t *h, const reg_spec_t *r)
{
    fl_msg_hdr_init(h, FL_MSG_REGISTER, r->rank);
    snprintf(h->job_id, sizeof h->job_id, "%s", r->job);
    h->u.reg.rank = r->rank;
    h->u.reg.world_size = r->world;
    if (r->host != NULL)
        snprintf(h->u.reg.host, sizeof h->u.reg.host, "%s", r->host);
    else
        snprintf(h->u.reg.host, sizeof h->u.reg.host, "host-%d", r->rank);
    h->u.reg.pid = r->pid;
    snprintf(h->u.reg.tuning, sizeof h->u.reg.tuning, "%s", r->tuning);
    snprintf(h->u.reg.settings, sizeof h->u.reg.settings, "%s", r->settings);
    h->u.reg.nendpoints = (uint32_t)r->nendpoints;
    for (int k = 0; k < r->nendpoints; k++)
        endpoint_of(r->rank, k, h->u.reg.endpoints[k], sizeof h->u.reg.endpoints[k]);
}

static void send_spec(fl_tp_sock_t *s, const reg_spec_t *r)
{
    fl_msg_hdr_t h;
    build_register(&h, r);
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "register rank %d: %s", r->rank, fl_last_error());
}

static void send_reg(fl_tp_sock_t *s, int rank, int world)
{
    reg_spec_t r = spec_of(rank, world);
    send_spec(s, &r);
}

static void send_ctl(fl_tp_sock_t *s, fl_msg_type_t type, int sender)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, type, sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    if (type == FL_MSG_SHUTDOWN)
        snprintf(h.u.shutdown.text, sizeof h.u.shutdown.text, "rank %d leaves", sender);
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "%s from %d: %s", fl_msg_type_name(type), sender, fl_last_error());
}

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

#define describe fl_test_describe_msg
#define expect_msg fl_test_expect_msg

static void expect_error(fl_tp_sock_t *s, int code, int timeout_ms, fl_msg_error_t *out)
{
    fl_tp_msg_t m;
    expect_msg(s, FL_MSG_ERROR, timeout_ms, &m);
    *out = m.hdr.u.error;
    fl_tp_msg_close(&m);
    ck_assert_msg(out->code == code, "error code %d, expected %d (%s): %s", out->code, code,
                  fl_strerror(code), out->text);
}

/* Fails when anything but a heartbeat arrives within ms. */
static void expect_quiet(fl_tp_sock_t *s, int ms)
{
    int64_t deadline = fl_deadline_in(ms);
    for (;;) {
        fl_tp_msg_t m;
        int rc = fl_tp_recv(s, &m, deadline);
        if (rc == FL_ETIMEDOUT)
            return;
        if (rc != FL_OK)
            continue;
        char got[FL_MSG_TEXT_MAX + 64];
        describe(&m, got, sizeof got);
        bool beat = m.hdr.type == FL_MSG_HEARTBEAT;
        fl_tp_msg_close(&m);
        if (!beat)
            ck_abort_msg("expected no answer, got %s", got);
    }
}

static void expect_welcome(fl_tp_sock_t *s, int world, uint64_t *generation)
{
    fl_tp_msg_t m;
    expect_msg(s, FL_MSG_WELCOME, 2000, &m);
    uint32_t n = m.hdr.u.welcome.npeers;
    if (generation != NULL)
        *generation = m.hdr.generation;
    fl_tp_msg_close(&m);
    ck_assert_int_eq(n, world);
}

/* Polls fn(coord) until it equals want or timeout_ms passes; returns the last value. */
static int wait_count(const fl_coord_t *c, int (*fn)(const fl_coord_t *), int want,
                      int timeout_ms)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    int v = fn(c);
    while (v != want && fl_now_ms() < deadline) {
        usleep(2000);
        v = fn(c);
    }
    return v;
}

static uint64_t wait_stat(const fl_coord_t *c, fl_stat_t st, uint64_t want, int timeout_ms)
{
    int64_t deadline = fl_deadline_in(timeout_ms);
    uint64_t v = fl_coord_stat(c, st);
    while (v < want && fl_now_ms() < deadline) {
        usleep(2000);
        v = fl_coord_stat(c, st);
    }
    return v;
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

/* ---- rendezvous ---- */

/* First mismatch between a welcome's peer table and what spec_of() registered, or "". */
static void check_peers(const fl_msg_welcome_t *w, int world, char *out, size_t cap)
{
    out[0] = '\0';
    if (w->npeers != (uint32_t)world) {
        snprintf(out, cap, "%u peers for world %d", w->npeers, world);
        return;
    }
    for (int i = 0; i < world; i++) {
        const fl_msg_peer_t *p = &w->peers[i];
        reg_spec_t want = spec_of(i, world);
        char host[32];
        snprintf(host, sizeof host, "host-%d", i);
        if (p->rank != i || strcmp(p->host, host) != 0 || p->pid != want.pid ||
            p->nendpoints != (uint32_t)want.nendpoints) {
            snprintf(out, cap, "entry %d: rank %d host %.64s pid %d with %u endpoints", i, p->rank,
                     p->host, p->pid, p->nendpoints);
            return;
        }
        for (int k = 0; k < want.nendpoints; k++) {
            char ep[64];
            endpoint_of(i, k, ep, sizeof ep);
            if (strcmp(p->endpoints[k], ep) != 0) {
                snprintf(out, cap, "entry %d endpoint %d: %.64s, expected %.64s", i, k,
                         p->endpoints[k], ep);
                return;
            }
        }
    }
}

START_TEST(test_welcome_peer_table)
{
    env_t e;
    env_start(&e, 4, 150, 3000, 0);
    static const int order[4] = {3, 1, 0, 2};
    fl_tp_sock_t *s[4];
    for (int i = 0; i < 4; i++) {
        s[order[i]] = fake_open(&e);
        send_reg(s[order[i]], order[i], 4);
        ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, i + 1, 2000), i + 1);
        if (i == 2)
            expect_quiet(s[3], 100); /* no welcome while a rank is missing */
    }
    uint64_t gen0 = 0;
    for (int r = 0; r < 4; r++) {
        fl_tp_msg_t m;
        expect_msg(s[r], FL_MSG_WELCOME, 2000, &m);
        char bad[256];
        check_peers(&m.hdr.u.welcome, 4, bad, sizeof bad);
        uint32_t hb = m.hdr.u.welcome.heartbeat_ms;
        uint32_t hbt = m.hdr.u.welcome.heartbeat_timeout_ms;
        uint64_t gen = m.hdr.generation;
        char job[FL_JOB_MAX];
        snprintf(job, sizeof job, "%s", m.hdr.job_id);
        fl_tp_msg_close(&m);
        ck_assert_msg(bad[0] == '\0', "rank %d's peer table: %s", r, bad);
        ck_assert_msg(hb == 150 && hbt == 3000, "rank %d: heartbeat %u / %u ms", r, hb, hbt);
        ck_assert_msg(gen != 0 && (r == 0 || gen == gen0), "rank %d: generation %llu vs %llu",
                      r, (unsigned long long)gen, (unsigned long long)gen0);
        ck_assert_str_eq(job, JOB);
        gen0 = gen;
    }
    ck_assert_int_eq(fl_coord_registered(e.coord), 4);
    ck_assert_int_eq(fl_coord_active(e.coord), 4);
    ck_assert_int_eq(fl_coord_wait(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
}
END_TEST

START_TEST(test_duplicate_rank)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    reg_spec_t ra = spec_of(0, 2);
    ra.host = "host-a";
    ra.pid = 1111;
    send_spec(a, &ra);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    reg_spec_t rb = ra;
    rb.host = "host-b";
    rb.pid = 2222;
    send_spec(b, &rb);
    fl_msg_error_t err;
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 0");
    ASSERT_HASNT(err.text, "host-a"); /* nothing a stranger could use to claim the rank */
    ASSERT_HASNT(err.text, "1111");
    ASSERT_HAS(err.text, "host-b");
    ASSERT_HAS(err.text, "2222");
    ck_assert_int_eq(err.about_rank, 0);
    ck_assert_int_eq(fl_coord_registered(e.coord), 1);

    send_reg(c, 1, 2);
    fl_tp_msg_t m;
    expect_msg(a, FL_MSG_WELCOME, 2000, &m);
    char host0[FL_HOST_MAX];
    snprintf(host0, sizeof host0, "%s", m.hdr.u.welcome.peers[0].host);
    int pid0 = m.hdr.u.welcome.peers[0].pid;
    fl_tp_msg_close(&m);
    ck_assert_str_eq(host0, "host-a");
    ck_assert_int_eq(pid0, 1111);
    expect_welcome(c, 2, NULL);
    expect_quiet(b, 200);
    env_end(&e);
}
END_TEST

/* #18 item 7: a stranger who claims a running rank with the holder's host and pid, from a
 * connection of its own, is refused while the holder is heard from; the holder keeps its rank
 * and the job goes on. The holder itself, once its old connection went quiet, may move to a
 * new one (it lost the coordinator and reconnected). */
START_TEST(test_running_rank_cannot_be_taken_over)
{
    enum { HB = 100, TIMEOUT = 1500 };
    env_t e;
    env_start(&e, 2, HB, TIMEOUT, 0);
    fl_tp_sock_t *s[2];
    for (int r = 0; r < 2; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, 2);
    }
    for (int r = 0; r < 2; r++)
        expect_welcome(s[r], 2, NULL);
    /* The stranger, knowing the holder's host and pid, tries twice. */
    fl_tp_sock_t *x = fake_open(&e);
    reg_spec_t claim = spec_of(0, 2);
    int64_t until = fl_deadline_in(TIMEOUT + 1000);
    int refused = 0;
    while (fl_now_ms() < until) {
        for (int r = 0; r < 2; r++)
            send_ctl(s[r], FL_MSG_HEARTBEAT, r);
        if (refused < 2) {
            send_spec(x, &claim);
            fl_msg_error_t err;
            expect_error(x, FL_EINVAL, 2000, &err);
            ASSERT_HAS(err.text, "already registered by another process");
            refused++;
        }
        fl_tp_msg_t m;
        for (int r = 0; r < 2; r++)
            while (fl_tp_recv(s[r], &m, fl_deadline_in(10)) == FL_OK) {
                ck_assert_msg(m.hdr.type != FL_MSG_ERROR, "rank %d got an error: %s", r,
                              m.hdr.u.error.text);
                fl_tp_msg_close(&m);
            }
        usleep(HB * 1000 / 2);
    }
    /* Past the heartbeat timeout: the holder was never displaced nor declared dead. */
    ck_assert_int_eq(fl_coord_active(e.coord), 2);
    /* From the holder's own connection, a goodbye of another job or generation is refused:
     * the rank stays. */
    for (int bad = 0; bad < 2; bad++) {
        fl_msg_hdr_t h;
        fl_msg_hdr_init(&h, FL_MSG_SHUTDOWN, 1);
        snprintf(h.job_id, sizeof h.job_id, "%s", bad == 0 ? "other" : JOB);
        h.generation = bad == 0 ? 0 : 99;
        ck_assert_int_eq(fl_tp_send(s[1], NULL, &h, NULL, 0, fl_deadline_in(1000)), FL_OK);
        fl_msg_error_t err;
        expect_error(s[1], FL_EPROTO, 2000, &err);
        ASSERT_HAS(err.text, bad == 0 ? "job 'other'" : "generation 99");
    }
    ck_assert_int_eq(fl_coord_active(e.coord), 2);
    ck_assert_int_eq(fl_coord_wait(e.coord, 10), FL_ETIMEDOUT);
    /* The holder goes quiet, then comes back on a new connection: it is let in. */
    usleep(3 * HB * 1000);
    send_ctl(s[1], FL_MSG_HEARTBEAT, 1);
    fl_tp_sock_t *again = fake_open(&e);
    send_reg(again, 0, 2);
    expect_welcome(again, 2, NULL);
    env_end(&e);
}
END_TEST

/* A context whose sockets use the CURVE keys of dir. */
static fl_ctx_t *curve_ctx(const char *dir)
{
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&co, &ctx) == FL_OK);
    ck_assert_msg(fl_tp_curve_use(ctx, dir) == FL_OK, "%s", fl_last_error());
    return ctx;
}

static fl_tp_sock_t *curve_open(fl_ctx_t *ctx, const char *endpoint)
{
    fl_tp_opts_t t;
    fl_tp_opts_init(&t);
    t.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    ck_assert(fl_tp_sock_create(ctx, FL_TP_DEALER, &t, "fake", &s) == FL_OK);
    ck_assert(fl_tp_sock_connect(s, endpoint) == FL_OK);
    return s;
}

/* With CURVE a rank is bound to the client key it registered with, not only to its
 * connection: another allowed key cannot move it, even giving the holder's host and pid while
 * the holder's connection is quiet, and cannot speak for it by reusing its routing id. The
 * holder's own key on a new connection still can (a process that lost its connection). */
START_TEST(test_curve_rank_bound_to_its_key)
{
    char root[] = "/tmp/flodl-coordkey-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    char path[256], cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/keys/authorized %s/b/authorized", root, root);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/keys/server", root);
    ck_assert(fl_tp_curve_keygen(path, "job server") == FL_OK);
    snprintf(path, sizeof path, "%s/keys/client", root);
    ck_assert(fl_tp_curve_keygen(path, "host a") == FL_OK);
    snprintf(path, sizeof path, "%s/b/client", root);
    ck_assert(fl_tp_curve_keygen(path, "host b") == FL_OK);
    snprintf(cmd, sizeof cmd, "cp %s/keys/client.pub %s/keys/authorized/a.pub && cp "
                              "%s/b/client.pub %s/keys/authorized/b.pub && cp %s/b/client.pub "
                              "%s/b/authorized/ && cp %s/keys/server.key %s/b/",
             root, root, root, root, root, root, root, root);
    ck_assert_int_eq(system(cmd), 0);

    char keys[128], bkeys[128];
    snprintf(keys, sizeof keys, "%s/keys", root);
    snprintf(bkeys, sizeof bkeys, "%s/b", root);
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = 2;
    o.job_id = JOB;
    o.heartbeat_ms = 100;
    o.heartbeat_timeout_ms = 5000;
    o.curve_dir = keys;
    o.log_level = FL_LOG_OFF;
    fl_coord_t *coord = NULL;
    ck_assert_msg(fl_coord_create(&o, &coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(coord) == FL_OK);
    fl_ctx_t *ca = curve_ctx(keys);
    fl_ctx_t *cb = curve_ctx(bkeys);
    const char *ep = fl_coord_endpoint(coord);
    fl_tp_sock_t *a0 = curve_open(ca, ep), *a1 = curve_open(ca, ep);
    send_reg(a0, 0, 2);
    send_reg(a1, 1, 2);
    expect_welcome(a0, 2, NULL);
    expect_welcome(a1, 2, NULL);

    /* Rank 0 goes quiet past two heartbeats; rank 1 keeps beating. */
    for (int i = 0; i < 5; i++) {
        send_ctl(a1, FL_MSG_HEARTBEAT, 1);
        usleep(100 * 1000);
    }
    fl_tp_sock_t *b = curve_open(cb, ep);
    send_reg(b, 0, 2); /* host-0, pid 1000: the holder's, but key b */
    fl_msg_error_t err;
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "already registered");
    /* The holder's own key on a new connection may move it. */
    fl_tp_sock_t *a0b = curve_open(ca, ep);
    send_reg(a0b, 0, 2);
    expect_welcome(a0b, 2, NULL);
    ck_assert_int_eq(fl_coord_active(coord), 2);

    fl_tp_sock_destroy(&a0);
    fl_tp_sock_destroy(&a1);
    fl_tp_sock_destroy(&a0b);
    fl_tp_sock_destroy(&b);
    fl_ctx_destroy(&ca);
    fl_ctx_destroy(&cb);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(test_refusals_keep_serving)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    fl_msg_error_t err;

    reg_spec_t r = spec_of(7, 3);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 7");
    ASSERT_HAS(err.text, "0..2");
    ASSERT_HAS(err.text, "world size 3");
    ck_assert_int_eq(err.about_rank, 7);

    r = spec_of(-1, 3);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank -1");

    r = spec_of(1, 5);
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "world size 5");
    ASSERT_HAS(err.text, "expects 3");

    r = spec_of(1, 3);
    r.job = "other-job";
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "'other-job'");
    ASSERT_HAS(err.text, "'" JOB "'");
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_BAD_JOB, 1, 1000), 1); /* counted, not lost */

    r = spec_of(1, 3);
    r.nendpoints = 0;
    send_spec(x, &r);
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "endpoint");

    ck_assert_int_eq(fl_coord_registered(e.coord), 1);
    /* The coordinator counts an error once sent, so the reply may arrive first. */
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_ERRORS_SENT, 5, 1000), 5);

    /* The refused socket may still register a valid rank, and the job starts. */
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(x, 1, 3);
    send_reg(c, 2, 3);
    expect_welcome(a, 3, NULL);
    expect_welcome(x, 3, NULL);
    expect_welcome(c, 3, NULL);

    /* After the start: a newcomer for a taken rank, and one out of range. */
    fl_tp_sock_t *d = fake_open(&e);
    r = spec_of(1, 3);
    r.host = "late-host";
    r.pid = 4242;
    send_spec(d, &r);
    expect_error(d, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 1");
    ASSERT_HASNT(err.text, "host-1");
    ASSERT_HAS(err.text, "late-host");
    ASSERT_HAS(err.text, "4242");
    r = spec_of(3, 3);
    send_spec(d, &r);
    expect_error(d, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 3");
    ASSERT_HAS(err.text, "0..2");

    /* A rank that lost its welcome asks again and is answered again. */
    send_reg(a, 0, 3);
    expect_welcome(a, 3, NULL);
    ck_assert_int_eq(fl_coord_registered(e.coord), 3);
    ck_assert_int_eq(fl_coord_active(e.coord), 3);
    ck_assert_int_eq(fl_coord_wait(e.coord, 50), FL_ETIMEDOUT);
    env_end(&e);
}
END_TEST

/* Ranks that disagree on what they must share (a declared setting, the collective settings,
 * the model) end the rendezvous at once: the newcomer and every registered rank hear the
 * setting and both values, and the job fails instead of waiting for a rank to be fixed. */
static void disagree_case(const char *what, reg_spec_t bad, const char *const *want)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *x = fake_open(&e);
    send_reg(a, 0, 3);
    send_reg(b, 2, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 2, 2000), 2);
    int64_t t0 = fl_now_ms();
    send_spec(x, &bad);
    fl_msg_error_t err[3];
    expect_error(x, FL_EINVAL, 1000, &err[0]);
    expect_error(a, FL_EINVAL, 1000, &err[1]);
    expect_error(b, FL_EINVAL, 1000, &err[2]);
    for (int i = 0; i < 3; i++) {
        for (int k = 0; want[k] != NULL; k++)
            ck_assert_msg(strstr(err[i].text, want[k]) != NULL, "%s: '%s' lacks '%s'", what,
                          err[i].text, want[k]);
        ck_assert_int_eq(err[i].about_rank, 1);
    }
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EINVAL);
    ck_assert_msg(fl_now_ms() - t0 < 1000, "%s: refused after %lld ms", what,
                  (long long)(fl_now_ms() - t0));
    ASSERT_HAS(fl_last_error(), "cannot start");
    char outcome[2048];
    fl_coord_outcome(e.coord, outcome, sizeof outcome);
    ASSERT_HAS(outcome, "rank 1 refused");
    ASSERT_HAS(outcome, "rank 0 registered; the job did not start");
    /* Too late for anyone now: the job failed. */
    fl_tp_sock_t *y = fake_open(&e);
    send_reg(y, 1, 3);
    fl_msg_error_t late;
    expect_error(y, FL_EINVAL, 1000, &late);
    ASSERT_HAS(late.text, "failed");
    env_end(&e);
}

START_TEST(test_disagreement_fails_rendezvous)
{
    reg_spec_t r = spec_of(1, 3);
    r.settings = "optimizer=sgd;lr=0.1;batch-size=64 per device";
    static const char *const lr[] = {"disagree on lr", "'0.1' on rank 1", "'0.05' on rank 0",
                                     "host-1", "host-0", NULL};
    disagree_case("lr", r, lr);

    r = spec_of(1, 3);
    r.settings = "optimizer=sgd;lr=0.05";
    static const char *const missing[] = {"disagree on batch-size", "'(not set)' on rank 1",
                                          "'64 per device' on rank 0", NULL};
    disagree_case("missing setting", r, missing);

    r = spec_of(1, 3);
    r.tuning = "seg=4096,small=0,algo=1";
    static const char *const tuning[] = {"'seg=4096,small=0,algo=1'", "'" TUNING "'", "host-0",
                                         NULL};
    disagree_case("tuning", r, tuning);
}
END_TEST

START_TEST(test_rendezvous_timeout)
{
    env_t e;
    int64_t t0 = fl_now_ms();
    env_start(&e, 3, 100, 3000, 600);
    fl_tp_sock_t *a = fake_open(&e);
    send_reg(a, 0, 3);
    /* Progress heartbeats first: how many are in, who is missing. */
    fl_tp_msg_t m;
    expect_msg(a, FL_MSG_HEARTBEAT, 1000, &m);
    uint32_t nreg = m.hdr.u.heartbeat.registered;
    char missing[FL_MSG_MISSING_MAX];
    snprintf(missing, sizeof missing, "%s", m.hdr.u.heartbeat.missing);
    fl_tp_msg_close(&m);
    ck_assert_uint_eq(nreg, 1);
    ck_assert_str_eq(missing, "1,2");

    fl_msg_error_t err;
    expect_error(a, FL_ETIMEDOUT, 3000, &err);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(took >= 550, "rendezvous failed after %lld ms, its timeout is 600",
                  (long long)took);
    ASSERT_HAS(err.text, "timed out");
    ASSERT_HAS(err.text, "1 of 3");
    ASSERT_HAS(err.text, "missing 1,2");

    ck_assert_int_eq(fl_coord_wait(e.coord, 2000), FL_EPEER);
    ASSERT_HAS(fl_last_error(), "missing 1,2");

    /* Too late now: the failed job refuses the missing rank. */
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(b, 1, 3);
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "rank 1");
    ASSERT_HAS(err.text, "failed");
    env_end(&e);
}
END_TEST

START_TEST(test_rendezvous_drops_silent_rank)
{
    env_t e;
    env_start(&e, 2, 60, 300, 0);
    fl_tp_sock_t *a = fake_open(&e);
    reg_spec_t ra = spec_of(0, 2);
    ra.host = "host-old";
    int64_t t0 = fl_now_ms();
    send_spec(a, &ra);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    /* a never beats: dropped once silent for 300 ms, not before. */
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 0, 2000), 0);
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(took >= 250, "dropped after %lld ms of a 300 ms timeout", (long long)took);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);

    /* Its late heartbeat is counted, not answered. */
    send_ctl(a, FL_MSG_HEARTBEAT, 0);
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_UNEXPECTED, 1, 2000), 1);

    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(b, 0, 2);
    send_reg(c, 1, 2);
    fl_tp_msg_t m;
    expect_msg(b, FL_MSG_WELCOME, 2000, &m);
    char host0[FL_HOST_MAX];
    snprintf(host0, sizeof host0, "%s", m.hdr.u.welcome.peers[0].host);
    fl_tp_msg_close(&m);
    ck_assert_str_eq(host0, "host-0");
    expect_welcome(c, 2, NULL);
    expect_quiet(a, 150);
    env_end(&e);
}
END_TEST

/* A rank that leaves during the rendezvous frees its slot; whoever takes it must be watched
 * like any other rank once the job runs. */
START_TEST(test_rendezvous_leave_then_rejoin_is_watched)
{
    env_t e;
    env_start(&e, 2, 50, 400, 0);
    fl_tp_sock_t *a = fake_open(&e);
    send_reg(a, 0, 2);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 1, 2000), 1);
    send_ctl(a, FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 0, 2000), 0);

    fl_tp_sock_t *b = fake_open(&e);
    fl_tp_sock_t *c = fake_open(&e);
    send_reg(b, 0, 2);
    send_reg(c, 1, 2);
    expect_welcome(b, 2, NULL);
    expect_welcome(c, 2, NULL);
    /* c beats, b (the new rank 0) goes silent. */
    int64_t deadline = fl_deadline_in(400 + 2000);
    bool got = false;
    fl_msg_error_t err;
    while (!got && fl_now_ms() < deadline) {
        send_ctl(c, FL_MSG_HEARTBEAT, 1);
        fl_tp_msg_t m;
        int64_t slice = fl_deadline_in(40);
        while (!got && fl_tp_recv(c, &m, slice) == FL_OK) {
            if (m.hdr.type == FL_MSG_ERROR) {
                err = m.hdr.u.error;
                got = true;
            }
            fl_tp_msg_close(&m);
        }
    }
    ck_assert_msg(got, "rank 0 re-registered after leaving the rendezvous was silent for "
                       "2.4 s and never declared dead (liveness still says it left)");
    ck_assert_int_eq(err.code, FL_EPEER);
    ck_assert_int_eq(err.about_rank, 0);
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EPEER);
    env_end(&e);
}
END_TEST

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
static void send_patched(fl_tp_sock_t *s, const fl_msg_hdr_t *h, const char *find,
                         const char *repl, size_t n)
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
 * summed up once the window ends); the counters still see every one. */
START_TEST(test_bad_message_warnings_rate_limited)
{
    char log[128];
    log_to(log, sizeof log);
    env_t e;
    env_start_log(&e, 2, 0, 0, 0, FL_LOG_WARN);
    fl_tp_sock_t *x = fake_open(&e);
    static const uint8_t garbage[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    for (int i = 0; i < 1000; i++)
        send_bytes(x, garbage, sizeof garbage);
    ck_assert_uint_eq(wait_stat(e.coord, FL_STAT_BAD_HEADER, 1000, 10000), 1000);
    assert_still_serves(&e, 2);
    int lines = log_count(log, "refused a message");
    ck_assert_msg(lines >= 1 && lines <= 10, "%d warning lines for 1000 bad "
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

/* ---- liveness and the end of a job ---- */

/* A heartbeat reporting operation op #seq, waiting for rank `waiting` (-1: none). */
static void send_hb(fl_tp_sock_t *s, int sender, uint32_t op, uint64_t seq, int waiting)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_HEARTBEAT, sender);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    h.u.heartbeat.op = op;
    h.u.heartbeat.op_seq = seq;
    h.u.heartbeat.waiting_on = waiting;
    int rc = fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(1000));
    ck_assert_msg(rc == FL_OK, "heartbeat from %d: %s", sender, fl_last_error());
}

START_TEST(test_silent_rank_declared_dead)
{
    enum { WORLD = 3, DEAD = 2, TIMEOUT = 500 };
    env_t e;
    env_start(&e, WORLD, 0, TIMEOUT, 0);
    fl_tp_sock_t *s[WORLD];
    int64_t t0 = fl_now_ms(); /* the coordinator last hears DEAD after this */
    for (int r = 0; r < WORLD; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, WORLD);
    }
    for (int r = 0; r < WORLD; r++)
        expect_welcome(s[r], WORLD, NULL);
    ck_assert_int_eq(fl_coord_active(e.coord), WORLD);
    /* Its last word: in allreduce #7. The others then wait for it in #8. */
    send_hb(s[DEAD], DEAD, FL_MSG_OP_ALLREDUCE, 7, -1);
    usleep(50 * 1000);
    int64_t deadline = fl_deadline_in(TIMEOUT + 2000);
    bool got[WORLD] = {false};
    fl_msg_error_t err[WORLD];
    int ngot = 0;
    while (ngot < WORLD - 1 && fl_now_ms() < deadline) {
        for (int r = 0; r < WORLD; r++)
            if (r != DEAD && !got[r])
                send_hb(s[r], r, FL_MSG_OP_ALLREDUCE, 8, r == 0 ? DEAD : -1);
        int64_t slice = fl_deadline_in(50);
        for (int r = 0; r < WORLD; r++) {
            fl_tp_msg_t m;
            while (r != DEAD && !got[r] && fl_tp_recv(s[r], &m, slice) == FL_OK) {
                if (m.hdr.type == FL_MSG_ERROR) {
                    err[r] = m.hdr.u.error;
                    got[r] = true;
                    ngot++;
                }
                fl_tp_msg_close(&m);
            }
        }
    }
    int64_t took = fl_now_ms() - t0;
    ck_assert_msg(ngot == WORLD - 1, "%d of %d survivors told within %d ms", ngot, WORLD - 1,
                  TIMEOUT + 2000);
    ck_assert_msg(took >= TIMEOUT, "declared dead after %lld ms of a %d ms timeout",
                  (long long)took, TIMEOUT);
    for (int r = 0; r < WORLD; r++) {
        if (r == DEAD)
            continue;
        ck_assert_msg(err[r].code == FL_EPEER && err[r].about_rank == DEAD &&
                          strcmp(err[r].host, "host-2") == 0,
                      "rank %d got code %d about rank %d (%s)", r, err[r].code,
                      err[r].about_rank, err[r].host);
        ASSERT_HAS(err[r].text, "rank 2");
        ASSERT_HAS(err[r].text, "host-2");
        ASSERT_HAS(err[r].text, "pid 1002");
        ASSERT_HAS(err[r].text, "silent");
        /* The operation by name, and the newest collective the others wait for it in. */
        ASSERT_HAS(err[r].text, "in allreduce #7");
        ASSERT_HAS(err[r].text, "rank 0 waits for it in allreduce #8");
    }
    /* The dead rank is told too (should it only be frozen). */
    fl_tp_msg_t own;
    expect_msg(s[DEAD], FL_MSG_ERROR, 2000, &own);
    ck_assert_int_eq(own.hdr.u.error.about_rank, DEAD);
    ASSERT_HAS(own.hdr.u.error.text, "rank 2 declared dead by the coordinator at ");
    fl_tp_msg_close(&own);
    ck_assert_int_eq(fl_coord_wait(e.coord, 1000), FL_EPEER);
    ASSERT_HAS(fl_last_error(), "rank 2");
    ASSERT_HAS(fl_last_error(), "host-2");
    ASSERT_HAS(fl_last_error(), "silent");
    ck_assert_int_eq(fl_coord_active(e.coord), WORLD - 1);
    env_end(&e);
}
END_TEST

START_TEST(test_all_leave_cleanly)
{
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *s[3];
    for (int r = 0; r < 3; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, 3);
    }
    for (int r = 0; r < 3; r++)
        expect_welcome(s[r], 3, NULL);
    send_ctl(s[1], FL_MSG_SHUTDOWN, 1);
    send_ctl(s[0], FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_active, 1, 2000), 1);
    ck_assert_int_eq(fl_coord_wait(e.coord, 100), FL_ETIMEDOUT);
    ASSERT_HAS(fl_last_error(), "running");
    send_ctl(s[2], FL_MSG_SHUTDOWN, 2);
    ck_assert_int_eq(fl_coord_wait(e.coord, 3000), FL_OK);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);
    ck_assert_int_eq(fl_coord_registered(e.coord), 3);
    env_end(&e);
}
END_TEST

START_TEST(test_stop_says_goodbye)
{
    /* During the rendezvous: both registered ranks are told. */
    env_t e;
    env_start(&e, 3, 0, 0, 0);
    fl_tp_sock_t *a = fake_open(&e);
    fl_tp_sock_t *b = fake_open(&e);
    send_reg(a, 0, 3);
    send_reg(b, 1, 3);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_registered, 2, 2000), 2);
    fl_coord_stop(e.coord);
    fl_tp_sock_t *both[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        fl_tp_msg_t m;
        expect_msg(both[i], FL_MSG_SHUTDOWN, 2000, &m);
        int code = m.hdr.u.shutdown.code;
        char text[FL_MSG_TEXT_MAX];
        snprintf(text, sizeof text, "%s", m.hdr.u.shutdown.text);
        fl_tp_msg_close(&m);
        ck_assert_msg(code != 0, "goodbye %d has code 0 (clean)", i);
        ASSERT_HAS(text, "stopped");
    }
    env_end(&e);

    /* While running: only the rank still there is told. */
    env_start(&e, 2, 0, 0, 0);
    a = fake_open(&e);
    b = fake_open(&e);
    send_reg(a, 0, 2);
    send_reg(b, 1, 2);
    expect_welcome(a, 2, NULL);
    expect_welcome(b, 2, NULL);
    send_ctl(a, FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_active, 1, 2000), 1);
    fl_coord_stop(e.coord);
    fl_tp_msg_t m;
    expect_msg(b, FL_MSG_SHUTDOWN, 2000, &m);
    fl_tp_msg_close(&m);
    expect_quiet(a, 200);
    env_end(&e);
}
END_TEST

/* ---- options ---- */

static int try_create(const fl_coord_opts_t *o)
{
    static char sentinel;
    fl_coord_t *c = (fl_coord_t *)&sentinel; /* create must reset it to NULL on failure */
    int rc = fl_coord_create(o, &c);
    if (rc == FL_OK) {
        fl_coord_destroy(&c);
        return FL_OK;
    }
    ck_assert_msg(c == NULL, "failed create left *out set");
    return rc;
}

static void base_opts(fl_coord_opts_t *o)
{
    fl_coord_opts_init(o);
    o->bind = "tcp://127.0.0.1:0";
    o->world_size = 2;
    o->log_level = FL_LOG_OFF;
}

START_TEST(test_opts_validation)
{
    fl_coord_opts_t o;
    base_opts(&o);
    o.bind = NULL;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");

    base_opts(&o);
    o.bind = "tcp://127.0.0.1";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");
    o.bind = "smtp://127.0.0.1:25";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "bind");

    base_opts(&o);
    o.world_size = 0;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "world_size");

    base_opts(&o);
    o.job_id = "";
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "job_id");
    o.job_id = "job\nx"; /* every message carries it: it must be wire text */
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "control characters");

    base_opts(&o);
    o.heartbeat_timeout_ms = 500;
    o.heartbeat_ms = 500;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_ms");
    o.heartbeat_ms = 900;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_ms");

    base_opts(&o);
    o.heartbeat_timeout_ms = 5;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "heartbeat_timeout_ms");

    base_opts(&o);
    o.rendezvous_timeout_ms = 0;
    ck_assert_int_eq(try_create(&o), FL_EINVAL);
    ASSERT_HAS(fl_last_error(), "rendezvous_timeout_ms");

    base_opts(&o);
    ck_assert_int_eq(try_create(&o), FL_OK);
}
END_TEST

START_TEST(test_bind_in_use)
{
    fl_coord_opts_t o;
    base_opts(&o);
    fl_coord_t *first = NULL;
    ck_assert_int_eq(fl_coord_create(&o, &first), FL_OK);
    char ep[FL_ENDPOINT_MAX];
    snprintf(ep, sizeof ep, "%s", fl_coord_endpoint(first));
    ck_assert_msg(strncmp(ep, "tcp://127.0.0.1:", 16) == 0 && atoi(ep + 16) > 0,
                  "bound endpoint %s", ep);
    o.bind = ep;
    ck_assert_int_eq(try_create(&o), FL_EIO);
    ASSERT_HAS(fl_last_error(), ep);
    fl_coord_destroy(&first);
    ck_assert_ptr_null(first);
}
END_TEST

/* ---- real communicators against the coordinator ---- */

typedef struct comm_try {
    fl_comm_opts_t opts;
    int rc;
    int64_t ms;
    char err[1024];
} comm_try_t;

static void *comm_try_main(void *p)
{
    comm_try_t *t = p;
    fl_comm_t *comm = NULL;
    int64_t t0 = fl_now_ms();
    t->rc = fl_comm_init(&t->opts, &comm);
    t->ms = fl_now_ms() - t0;
    snprintf(t->err, sizeof t->err, "%s", t->rc == FL_OK ? "" : fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

START_TEST(test_comm_wrong_job)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    comm_try_t t;
    fl_test_comm_opts(&t.opts, e.coord, 0, 2);
    t.opts.job_id = "other-job";
    comm_try_main(&t);
    ck_assert_msg(t.rc == FL_EINVAL, "rc %d: %s", t.rc, t.err);
    ASSERT_HAS(t.err, "refused");
    ASSERT_HAS(t.err, "'other-job'");
    ASSERT_HAS(t.err, "'" JOB "'");
    ck_assert_msg(t.ms < 5000, "refusal took %lld ms", (long long)t.ms);
    ck_assert_int_eq(fl_coord_registered(e.coord), 0);
    env_end(&e);
}
END_TEST

START_TEST(test_comm_world_mismatch)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    comm_try_t t;
    fl_test_comm_opts(&t.opts, e.coord, 2, 3);
    t.opts.job_id = JOB;
    comm_try_main(&t);
    ck_assert_msg(t.rc == FL_EINVAL, "rc %d: %s", t.rc, t.err);
    ASSERT_HAS(t.err, "refused");
    ASSERT_HAS(t.err, "world size 3");
    ASSERT_HAS(t.err, "expects 2");
    env_end(&e);
}
END_TEST

START_TEST(test_comm_no_coordinator)
{
    enum { RDV = 800 };
    /* A port that was bound a moment ago and is closed now, and an ipc path nobody binds. */
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    fl_ctx_t *ctx = NULL;
    ck_assert_int_eq(fl_ctx_create(&co, &ctx), FL_OK);
    fl_tp_opts_t to;
    fl_tp_opts_init(&to);
    fl_tp_sock_t *s = NULL;
    char tcp[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_create(ctx, FL_TP_ROUTER, &to, "gone", &s), FL_OK);
    ck_assert_int_eq(fl_tp_sock_bind(s, "tcp://127.0.0.1:0", tcp, sizeof tcp), FL_OK);
    fl_tp_sock_destroy(&s);
    fl_ctx_destroy(&ctx);
    char ipc[128];
    snprintf(ipc, sizeof ipc, "ipc:///tmp/flodl-test-coord-%d-nobody", (int)getpid());
    const char *eps[2] = {tcp, ipc};
    comm_try_t t[2];
    for (int i = 0; i < 2; i++) {
        fl_comm_opts_init(&t[i].opts);
        t[i].opts.rank = 0;
        t[i].opts.world_size = 2;
        t[i].opts.coordinator = eps[i];
        t[i].opts.host = "127.0.0.1";
        t[i].opts.rendezvous_timeout_ms = RDV;
        t[i].opts.log_level = FL_LOG_OFF;
        comm_try_main(&t[i]);
    }
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(t[i].rc == FL_ETIMEDOUT, "%s: rc %d: %s", eps[i], t[i].rc, t[i].err);
        ASSERT_HAS(t[i].err, "no answer");
        ASSERT_HAS(t[i].err, eps[i]);
    }
    /* The deadline is the rendezvous timeout: giving up must not wait for the unsent
     * registration to linger on top of it. */
    for (int i = 0; i < 2; i++)
        ck_assert_msg(t[i].ms >= RDV - 50 && t[i].ms <= RDV + 500,
                      "%s: fl_comm_init gave up after %lld ms with a %d ms rendezvous timeout "
                      "(tcp: %lld ms, ipc: %lld ms)",
                      eps[i], (long long)t[i].ms, RDV, (long long)t[0].ms, (long long)t[1].ms);
}
END_TEST

START_TEST(test_comm_missing_rank)
{
    env_t e;
    env_start(&e, 3, 100, 3000, 0);
    comm_try_t t[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        fl_test_comm_opts(&t[r].opts, e.coord, r, 3);
        t[r].opts.job_id = JOB;
        t[r].opts.rendezvous_timeout_ms = 1500;
        t[r].opts.log_level = FL_LOG_OFF;
        ck_assert_int_eq(pthread_create(&th[r], NULL, comm_try_main, &t[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(t[r].rc == FL_ETIMEDOUT, "rank %d: rc %d: %s", r, t[r].rc, t[r].err);
        ASSERT_HAS(t[r].err, "2 of 3");
        ASSERT_HAS(t[r].err, "missing 2");
    }
    env_end(&e);
}
END_TEST

static int barrier_rank(fl_comm_t *comm, void *arg)
{
    (void)arg;
    return fl_barrier(comm);
}

START_TEST(test_comm_job_ends_cleanly)
{
    env_t e;
    env_start(&e, 2, 0, 0, 0);
    fl_comm_opts_t o;
    fl_test_comm_opts(&o, e.coord, 0, 2);
    o.job_id = JOB;
    char err[1024] = "";
    int rc = fl_test_run_ranks(2, &o, barrier_rank, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s", err);
    ck_assert_int_eq(fl_coord_wait(e.coord, 5000), FL_OK);
    ck_assert_int_eq(fl_coord_active(e.coord), 0);
    env_end(&e);
}
END_TEST

Suite *coord_suite(void);
Suite *coord_suite(void)
{
    Suite *s = suite_create("coord");
    TCase *t = tcase_create("rendezvous");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_welcome_peer_table);
    tcase_add_test(t, test_duplicate_rank);
    tcase_add_test(t, test_running_rank_cannot_be_taken_over);
    tcase_add_test(t, test_curve_rank_bound_to_its_key);
    tcase_add_test(t, test_refusals_keep_serving);
    tcase_add_test(t, test_disagreement_fails_rendezvous);
    tcase_add_test(t, test_rendezvous_timeout);
    tcase_add_test(t, test_rendezvous_drops_silent_rank);
    tcase_add_test(t, test_rendezvous_leave_then_rejoin_is_watched);
    suite_add_tcase(s, t);

    t = tcase_create("hostile");
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
    suite_add_tcase(s, t);

    t = tcase_create("liveness");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_silent_rank_declared_dead);
    tcase_add_test(t, test_all_leave_cleanly);
    tcase_add_test(t, test_stop_says_goodbye);
    suite_add_tcase(s, t);

    t = tcase_create("options");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_opts_validation);
    tcase_add_test(t, test_bind_in_use);
    suite_add_tcase(s, t);

    t = tcase_create("comm");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_comm_wrong_job);
    tcase_add_test(t, test_comm_world_mismatch);
    tcase_add_test(t, test_comm_no_coordinator);
    tcase_add_test(t, test_comm_missing_rank);
    tcase_add_test(t, test_comm_job_ends_cleanly);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_suite());
}
