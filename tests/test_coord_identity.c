/* Who may be a rank (server/coord_handle.c, in-process on 127.0.0.1, ranks played by bare
 * DEALER sockets): a stranger with the holder's host and pid never takes a rank over, whether
 * the holder is heard from or stalled for any part of the heartbeat timeout, in plain text and
 * under CURVE with the job's own client key; the holder that lost its connection comes back
 * with the token of its welcome; a rank that left frees its identity. The server role's
 * counterpart is in test_coord_ps.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_coll.h"
#include "fl_msg.h"
#include "fl_ps.h"
#include "fl_tp.h"
#include "coordutil.h"

#define ASSERT_HASNT(text, needle)                                                                 \
    ck_assert_msg(strstr((text), (needle)) == NULL, "\"%s\" reveals \"%s\"", (text), (needle))

/* A stranger who claims a running rank with the holder's host and pid, from a
 * connection of its own, is refused; the holder keeps its rank and the job goes on. The
 * holder itself may move to a new connection (it lost the coordinator and reconnected),
 * giving the token of its welcome; a stranger quiet as long with host and pid alone may not. */
START_TEST(test_running_rank_cannot_be_taken_over)
{
    enum { HB = 100, TIMEOUT = 1500 };
    env_t e;
    env_start(&e, 2, HB, TIMEOUT, 0);
    fl_tp_sock_t *s[2];
    char token[2][FL_MSG_TOKEN_MAX];
    for (int r = 0; r < 2; r++) {
        s[r] = fake_open(&e);
        send_reg(s[r], r, 2);
    }
    for (int r = 0; r < 2; r++)
        expect_welcome_token(s[r], 2, token[r]);
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
    /* Quiet for three heartbeats: host and pid, or another member's token, are still not
     * the holder; its own token is, and it is let in. */
    ck_assert_uint_eq(strlen(token[0]), FL_MSG_TOKEN_MAX - 1);
    ck_assert_str_ne(token[0], token[1]);
    usleep(3 * HB * 1000);
    send_ctl(s[1], FL_MSG_HEARTBEAT, 1);
    fl_tp_sock_t *again = fake_open(&e);
    reg_spec_t own = spec_of(0, 2);
    send_spec(again, &own);
    fl_msg_error_t err;
    expect_error(again, FL_EINVAL, 2000, &err);
    own.token = token[1];
    send_spec(again, &own);
    expect_error(again, FL_EINVAL, 2000, &err);
    own.token = token[0];
    send_spec(again, &own);
    expect_welcome(again, 2, NULL);
    ck_assert_int_eq(fl_coord_active(e.coord), 2);
    /* A rank that left frees its identity: its token proves nothing any more. */
    send_ctl(again, FL_MSG_SHUTDOWN, 0);
    ck_assert_int_eq(wait_count(e.coord, fl_coord_active, 1, 2000), 1);
    fl_tp_sock_t *after = fake_open(&e);
    send_spec(after, &own);
    expect_error(after, FL_EINVAL, 2000, &err);
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
    ck_assert_msg(dir == NULL || fl_tp_curve_use(ctx, dir, NULL) == FL_OK, "%s", fl_last_error());
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

/* The keys of a job under root/keys (server key, one client key every rank holds, allowed)
 * and of another allowed client under root/b, as fl_tp_curve_use reads them. */
static void make_keys(const char *root)
{
    char path[256], cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/keys/authorized %s/b/authorized", root, root);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/keys/server", root);
    ck_assert(fl_tp_curve_keygen(path, "job server", FL_TP_KEY_ANY) == FL_OK);
    snprintf(path, sizeof path, "%s/keys/client", root);
    ck_assert(fl_tp_curve_keygen(path, "host a", FL_TP_KEY_ANY) == FL_OK);
    snprintf(path, sizeof path, "%s/b/client", root);
    ck_assert(fl_tp_curve_keygen(path, "host b", FL_TP_KEY_ANY) == FL_OK);
    snprintf(cmd, sizeof cmd,
             "cp %s/keys/client.pub %s/keys/authorized/a.pub && cp "
             "%s/b/client.pub %s/keys/authorized/b.pub && cp %s/b/client.pub "
             "%s/b/authorized/ && cp %s/keys/server.key %s/b/",
             root, root, root, root, root, root, root, root);
    ck_assert_int_eq(system(cmd), 0);
}

/* With CURVE a rank is bound to the client key it registered with, not only to its
 * connection: another allowed key cannot move it, even giving the holder's host, pid and
 * token while the holder's connection is quiet, and cannot speak for it by reusing its routing
 * id. The holder's own key and token on a new connection still can (a process that lost its
 * connection). */
START_TEST(test_curve_rank_bound_to_its_key)
{
    char root[] = "/tmp/flodl-coordkey-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    make_keys(root);
    char cmd[256];
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
    char token[FL_MSG_TOKEN_MAX];
    expect_welcome_token(a0, 2, token);
    expect_welcome(a1, 2, NULL);

    /* Rank 0 goes quiet past two heartbeats; rank 1 keeps beating. */
    for (int i = 0; i < 5; i++) {
        send_ctl(a1, FL_MSG_HEARTBEAT, 1);
        usleep(100 * 1000);
    }
    fl_tp_sock_t *b = curve_open(cb, ep);
    reg_spec_t claim = spec_of(0, 2); /* host-0, pid 1000: the holder's */
    claim.token = token;              /* and even its token, but key b */
    send_spec(b, &claim);
    fl_msg_error_t err;
    expect_error(b, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, "already registered");
    /* The holder's own key on a new connection, with its token, may move it. */
    fl_tp_sock_t *a0b = curve_open(ca, ep);
    send_spec(a0b, &claim);
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

static fl_coord_t *coord_start(int hb_ms, int timeout_ms, const char *curve_dir)
{
    fl_coord_opts_t o;
    fl_coord_opts_init(&o);
    o.bind = "tcp://127.0.0.1:0";
    o.world_size = 2;
    o.job_id = JOB;
    o.heartbeat_ms = hb_ms;
    o.heartbeat_timeout_ms = timeout_ms;
    o.curve_dir = curve_dir;
    o.log_level = FL_LOG_OFF;
    fl_coord_t *coord = NULL;
    ck_assert_msg(fl_coord_create(&o, &coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(coord) == FL_OK);
    return coord;
}

/* Keeps rank 1 beating until `until`, every quarter period. */
static void beat_until(fl_tp_sock_t *s, int64_t until, int hb)
{
    while (fl_now_ms() < until) {
        send_ctl(s, FL_MSG_HEARTBEAT, 1);
        int64_t left = until - fl_now_ms();
        int64_t nap = left < hb / 4 ? left : hb / 4;
        if (nap > 0)
            usleep((useconds_t)nap * 1000);
    }
}

/* One stranger's claim on stalled rank 0: the holder's host and pid on a new connection. It is
 * refused, and the refusal tells nothing of the holder nor the job's generation. */
static void claim_refused(fl_ctx_t *ctx, const char *ep, int quiet_periods)
{
    fl_tp_sock_t *x = curve_open(ctx, ep);
    send_reg(x, 0, 2); /* host-0, pid 1000: the holder's */
    fl_tp_msg_t m;
    fl_test_expect_msg(x, FL_MSG_ERROR, 2000, &m); /* a welcome fails here */
    fl_msg_error_t err = m.hdr.u.error;
    uint64_t gen = m.hdr.generation;
    fl_tp_msg_close(&m);
    fl_tp_sock_destroy(&x);
    ck_assert_msg(err.code == FL_EINVAL, "after %d periods: %s", quiet_periods, err.text);
    ck_assert_msg(gen == 0, "after %d periods the refusal carries generation %llu", quiet_periods,
                  (unsigned long long)gen);
    ASSERT_HAS(err.text, "already registered");
    ASSERT_HASNT(err.text, "10.0.0.1"); /* the holder's data endpoint */
}

/* Rank 0 stalls (sends nothing) while rank 1 beats. After 0, 1, 2, ... heartbeat periods of
 * quiet, up to the timeout, a stranger claims it with its host and pid: every claim is refused
 * and the job goes on. Then the holder, which really lost its connection, comes back on a new
 * one with its token, before the timeout, and is let in. */
static void stalled_rank_kept(const char *curve_dir)
{
    enum { HB = 100, TIMEOUT = 1000 };
    fl_coord_t *coord = coord_start(HB, TIMEOUT, curve_dir);
    fl_ctx_t *ctx = curve_ctx(curve_dir);
    const char *ep = fl_coord_endpoint(coord);
    fl_tp_sock_t *s0 = curve_open(ctx, ep), *s1 = curve_open(ctx, ep);
    send_reg(s0, 0, 2);
    send_reg(s1, 1, 2);
    char token[FL_MSG_TOKEN_MAX];
    expect_welcome_token(s0, 2, token);
    expect_welcome(s1, 2, NULL);
    int64_t stalled = fl_now_ms();
    int k = 0;
    for (; (k + 2) * HB <= TIMEOUT; k++) {
        beat_until(s1, stalled + (int64_t)k * HB, HB);
        claim_refused(ctx, ep, k);
    }
    ck_assert_int_ge(k, 9);
    ck_assert_uint_eq(strlen(token), FL_MSG_TOKEN_MAX - 1);
    ck_assert_int_eq(fl_coord_active(coord), 2);
    ck_assert_int_eq(fl_coord_wait(coord, 0), FL_ETIMEDOUT);
    fl_tp_sock_t *back = curve_open(ctx, ep);
    reg_spec_t own = spec_of(0, 2);
    own.token = token;
    send_spec(back, &own);
    expect_welcome(back, 2, NULL);
    for (int i = 0; i < 3; i++) {
        send_ctl(back, FL_MSG_HEARTBEAT, 0);
        beat_until(s1, fl_now_ms() + HB, HB);
    }
    ck_assert_int_eq(fl_coord_active(coord), 2);
    ck_assert_int_eq(fl_coord_wait(coord, 0), FL_ETIMEDOUT);
    fl_tp_sock_destroy(&s0);
    fl_tp_sock_destroy(&s1);
    fl_tp_sock_destroy(&back);
    fl_ctx_destroy(&ctx);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}

START_TEST(test_stalled_rank_plain)
{
    stalled_rank_kept(NULL);
}
END_TEST

START_TEST(test_stalled_rank_curve)
{
    char root[] = "/tmp/flodl-stallkey-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    make_keys(root);
    char keys[128], cmd[256];
    snprintf(keys, sizeof keys, "%s/keys", root);
    stalled_rank_kept(keys); /* the stranger holds the job's own client key */
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A context with the key of a member (self: "rank-0", "ps") from dir. */
static fl_ctx_t *member_ctx(const char *dir, const char *self)
{
    fl_ctx_opts_t co;
    fl_ctx_opts_init(&co);
    co.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&co, &ctx) == FL_OK);
    ck_assert_msg(fl_tp_curve_use(ctx, dir, self) == FL_OK, "%s", fl_last_error());
    return ctx;
}

/* A parameter-server process's registration for shard 0 of 1. */
static void send_server_reg(fl_tp_sock_t *s)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_REGISTER, FL_MSG_SENDER_SERVER);
    snprintf(h.job_id, sizeof h.job_id, "%s", JOB);
    fl_msg_register_t *r = &h.u.reg;
    r->role = FL_ROLE_SERVER;
    r->rank = 0;
    r->shard_count = 1;
    r->num_shards = 1;
    snprintf(r->host, sizeof r->host, "ps-0");
    r->pid = 2000;
    r->param_count = 1000;
    ck_assert(fl_msg_register_alloc_shards(r, 1) == FL_OK);
    snprintf(r->shard_eps[0], FL_ENDPOINT_MAX, "tcp://10.9.0.1:7000");
    ck_assert(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(2000)) == FL_OK);
    fl_msg_hdr_free_tables(&h);
}

/* The refusal a registration from ctx gets; rank < 0: as a parameter-server process. */
static void key_refused(fl_ctx_t *ctx, const char *ep, int rank, const char *want)
{
    fl_tp_sock_t *x = curve_open(ctx, ep);
    if (rank < 0)
        send_server_reg(x);
    else
        send_reg(x, rank, 2);
    fl_msg_error_t err;
    expect_error(x, FL_EINVAL, 2000, &err);
    ASSERT_HAS(err.text, want);
    fl_tp_sock_destroy(&x);
}

/* Per-member keys (flodl-keygen --ranks): a key bound to a rank registers that rank only, the
 * parameter servers' key a server only; the job's shared key, where the allowlist still has
 * it, anything. */
START_TEST(test_member_keys_hold_members_to_their_binding)
{
    char root[] = "/tmp/flodl-memberkey-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    char keys[128], path[256], cmd[512];
    snprintf(keys, sizeof keys, "%s/keys", root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/authorized", keys);
    ck_assert_int_eq(system(cmd), 0);
    static const char *const names[] = {"server", "client", "rank-0", "rank-1", "ps"};
    static const int bound[] = {FL_TP_KEY_ANY, FL_TP_KEY_ANY, 0, 1, FL_TP_KEY_SERVER};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", keys, names[i]);
        ck_assert(fl_tp_curve_keygen(path, names[i], bound[i]) == FL_OK);
        snprintf(cmd, sizeof cmd, "cp %s.pub %s/authorized/", path, keys);
        ck_assert_int_eq(i == 0 ? 0 : system(cmd), 0);
    }
    fl_coord_t *coord = coord_start(100, 5000, keys);
    const char *ep = fl_coord_endpoint(coord);
    fl_ctx_t *r0 = member_ctx(keys, "rank-0"), *r1 = member_ctx(keys, "rank-1");
    fl_ctx_t *ps = member_ctx(keys, "ps"), *shared = member_ctx(keys, NULL);
    key_refused(r1, ep, 0,
                "a registration as rank 0 (host host-0) came with the client key of rank 1");
    key_refused(ps, ep, 0, "with the client key of the parameter-server processes");
    key_refused(r0, ep, -1,
                "a registration as a parameter-server process (host ps-0) came with the client "
                "key of rank 0");
    /* Each with its own key, or the shared one, is let in. */
    fl_tp_sock_t *a = curve_open(r0, ep), *b = curve_open(shared, ep);
    send_reg(a, 0, 2);
    send_reg(b, 1, 2);
    expect_welcome(a, 2, NULL);
    expect_welcome(b, 2, NULL);
    ck_assert_int_eq(fl_coord_active(coord), 2);
    fl_tp_sock_destroy(&a);
    fl_tp_sock_destroy(&b);
    fl_ctx_t *all[] = {r0, r1, ps, shared};
    for (int i = 0; i < 4; i++)
        fl_ctx_destroy(&all[i]);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Makes a key pair at dir/name bound to `bound`. */
static void key_at(const char *dir, const char *name, int bound)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert(fl_tp_curve_keygen(path, name, bound) == FL_OK);
}

typedef struct forge_rank {
    fl_comm_opts_t o;
    int rc;
    uint64_t refused;
} forge_rank_t;

static void *forge_rank_main(void *p)
{
    forge_rank_t *a = p;
    fl_comm_t *comm = NULL;
    a->rc = fl_comm_init(&a->o, &comm);
    float x[64] = {1}, y[64];
    if (a->rc == FL_OK)
        a->rc = fl_allreduce(comm, x, y, 64, FL_FLOAT32, FL_SUM);
    if (comm != NULL)
        a->refused = fl_ctx_stat(fl_comm_ctx(comm), FL_STAT_AUTH_REFUSED);
    fl_comm_destroy(&comm);
    return NULL;
}

/* On the data sockets a rank's key speaks for that rank alone. Rank 1 holds a key rank 0's
 * allowlist binds to rank 2 (the coordinator's allowlist binds it to nobody, so it registers):
 * rank 0 drops its data, counted, and the allreduce fails instead of taking it as rank 1's. */
START_TEST(test_data_from_another_ranks_key_dropped)
{
    char root[] = "/tmp/flodl-forge-XXXXXX";
    ck_assert(mkdtemp(root) != NULL);
    char cmd[2048], a[96], b[96], c[96];
    snprintf(a, sizeof a, "%s/coord", root);
    snprintf(b, sizeof b, "%s/r0", root);
    snprintf(c, sizeof c, "%s/r1", root);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/authorized %s/authorized %s/authorized", a, b, c);
    ck_assert_int_eq(system(cmd), 0);
    key_at(a, "server", FL_TP_KEY_ANY);
    key_at(b, "rank-0", 0);
    key_at(c, "rank-1", 2);
    /* The coordinator and rank 1 allow both keys unbound; rank 0 allows them bound. */
    snprintf(cmd, sizeof cmd,
             "A=%s B=%s C=%s; cp -p $A/server.key $B/ && cp -p $A/server.key $C/ && "
             "cp $B/rank-0.pub $C/rank-1.pub $B/authorized/ && "
             "for d in $A $C; do for k in $B/rank-0.pub $C/rank-1.pub; do "
             "grep -v 'rank =' $k > $d/authorized/$(basename $k); done; done",
             a, b, c);
    ck_assert_int_eq(system(cmd), 0);
    fl_coord_opts_t co;
    fl_coord_opts_init(&co);
    co.bind = "tcp://127.0.0.1:0";
    co.world_size = 2;
    co.curve_dir = a;
    co.log_level = FL_LOG_OFF;
    fl_coord_t *coord = NULL;
    ck_assert_msg(fl_coord_create(&co, &coord) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_coord_start(coord) == FL_OK);
    forge_rank_t r[2];
    pthread_t t[2];
    for (int k = 0; k < 2; k++) {
        memset(&r[k], 0, sizeof r[k]);
        fl_test_comm_opts(&r[k].o, coord, k, 2);
        r[k].o.curve_dir = k == 0 ? b : c;
        r[k].o.timeout_ms = 3000;
        r[k].o.log_level = FL_LOG_OFF;
        ck_assert(pthread_create(&t[k], NULL, forge_rank_main, &r[k]) == 0);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    ck_assert_msg(r[0].rc != FL_OK, "rank 0 took rank 1's data sent with rank 2's key");
    ck_assert_uint_ge(r[0].refused, 1);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *coord_identity_suite(void);
Suite *coord_identity_suite(void)
{
    Suite *s = suite_create("coord_identity");
    TCase *t = tcase_create("identity");
    tcase_set_timeout(t, 20);
    tcase_add_test(t, test_running_rank_cannot_be_taken_over);
    tcase_add_test(t, test_curve_rank_bound_to_its_key);
    tcase_add_test(t, test_stalled_rank_plain);
    tcase_add_test(t, test_stalled_rank_curve);
    tcase_add_test(t, test_member_keys_hold_members_to_their_binding);
    tcase_add_test(t, test_data_from_another_ranks_key_dropped);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(coord_identity_suite());
}
