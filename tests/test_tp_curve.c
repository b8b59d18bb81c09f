/* CurveZMQ in transport/: an allowed client's messages arrive (over TCP, encrypted); a client
 * with an unknown key, with no key, or in plain text gets nothing through, is counted, and the
 * server keeps serving the allowed one; key directories that are unsafe or incomplete are
 * refused naming the file; per-member keys are picked by each member and their bindings reach
 * the server with every message. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_core.h"
#include "fl_tp.h"
#include "testutil.h"

static char root[64];

/* Runs a shell command made from a format and the root directory (as often as it appears). */
#define SH(fmt, ...)                                                                               \
    do {                                                                                           \
        char cmd_[512];                                                                            \
        snprintf(cmd_, sizeof cmd_, fmt, __VA_ARGS__);                                             \
        ck_assert_msg(system(cmd_) == 0, "%s", cmd_);                                              \
    } while (0)

/* root/keys: server.key, client.key (allowed) and authorized/client.pub; root/stranger.key. */
static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/flodl-curve-XXXXXX");
    ck_assert(mkdtemp(root) != NULL);
    SH("mkdir -p %s/keys/authorized %s/strange/authorized", root, root);
    char base[128];
    snprintf(base, sizeof base, "%s/keys/server", root);
    ck_assert(fl_tp_curve_keygen(base, "job server", FL_TP_KEY_ANY) == FL_OK);
    snprintf(base, sizeof base, "%s/keys/client", root);
    ck_assert(fl_tp_curve_keygen(base, "rank 0", FL_TP_KEY_ANY) == FL_OK);
    SH("cp %s/keys/client.pub %s/keys/authorized/", root, root);
    /* The stranger knows the server's public key but holds a key nobody allowed. */
    snprintf(base, sizeof base, "%s/strange/client", root);
    ck_assert(fl_tp_curve_keygen(base, "stranger", FL_TP_KEY_ANY) == FL_OK);
    SH("cp %s/keys/server.key %s/strange/ && cp %s/strange/client.pub %s/strange/authorized/", root,
       root, root, root);
}

static void teardown(void)
{
    SH("rm -rf %s", root);
}

static fl_ctx_t *ctx_with(const char *keys)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    o.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&o, &ctx) == FL_OK);
    if (keys != NULL) {
        char dir[128];
        snprintf(dir, sizeof dir, "%s/%s", root, keys);
        fl_tp_curve_t *c = NULL;
        ck_assert_msg(fl_tp_curve_load(dir, NULL, &c) == FL_OK, "%s", fl_last_error());
        ck_assert(fl_tp_curve_attach(ctx, c) == FL_OK);
        ck_assert(fl_tp_curve_on(ctx));
    }
    return ctx;
}

static fl_tp_sock_t *sock(fl_ctx_t *ctx, fl_tp_kind_t kind, const char *name)
{
    fl_tp_opts_t o;
    fl_tp_opts_init(&o);
    o.linger_ms = 0;
    fl_tp_sock_t *s = NULL;
    ck_assert(fl_tp_sock_create(ctx, kind, &o, name, &s) == FL_OK);
    return s;
}

static void send_barrier(fl_tp_sock_t *s, int32_t sender)
{
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_BARRIER, sender);
    ck_assert(fl_tp_send(s, NULL, &h, NULL, 0, fl_deadline_in(2000)) == FL_OK);
}

/* The next message's sender, or -100 when nothing came within ms. */
static int recv_sender(fl_tp_sock_t *s, int ms)
{
    fl_tp_msg_t m;
    if (fl_tp_recv(s, &m, fl_deadline_in(ms)) != FL_OK)
        return -100;
    int who = m.hdr.sender;
    fl_tp_msg_close(&m);
    return who;
}

START_TEST(test_only_allowed_clients_get_through)
{
    fl_ctx_t *sctx = ctx_with("keys");
    fl_tp_sock_t *server = sock(sctx, FL_TP_ROUTER, "server");
    char ep[FL_ENDPOINT_MAX];
    ck_assert(fl_tp_sock_bind(server, "tcp://127.0.0.1:0", ep, sizeof ep) == FL_OK);

    fl_ctx_t *actx = ctx_with("keys");
    fl_tp_sock_t *allowed = sock(actx, FL_TP_DEALER, "allowed");
    ck_assert(fl_tp_sock_connect(allowed, ep) == FL_OK);
    send_barrier(allowed, 1);
    ck_assert_int_eq(recv_sender(server, 5000), 1);

    /* An unknown key, and a plain-text client: nothing arrives, the refusal is counted. */
    fl_ctx_t *xctx = ctx_with("strange");
    fl_tp_sock_t *stranger = sock(xctx, FL_TP_DEALER, "stranger");
    ck_assert(fl_tp_sock_connect(stranger, ep) == FL_OK);
    send_barrier(stranger, 2);
    fl_ctx_t *pctx = ctx_with(NULL);
    fl_tp_sock_t *plain = sock(pctx, FL_TP_DEALER, "plain");
    ck_assert(fl_tp_sock_connect(plain, ep) == FL_OK);
    send_barrier(plain, 3);
    ck_assert_int_eq(recv_sender(server, 1500), -100);
    ck_assert_uint_ge(fl_ctx_stat(sctx, FL_STAT_AUTH_REFUSED), 1);

    /* The allowed client is still served. */
    send_barrier(allowed, 1);
    ck_assert_int_eq(recv_sender(server, 5000), 1);
    ck_assert_int_eq(recv_sender(server, 300), -100);

    fl_tp_sock_destroy(&plain);
    fl_tp_sock_destroy(&stranger);
    fl_tp_sock_destroy(&allowed);
    fl_tp_sock_destroy(&server);
    fl_ctx_destroy(&pctx);
    fl_ctx_destroy(&xctx);
    fl_ctx_destroy(&actx);
    fl_ctx_destroy(&sctx);
}
END_TEST

/* A CURVE client against a plain-text server gets nowhere either. */
START_TEST(test_curve_client_and_plain_server_do_not_talk)
{
    fl_ctx_t *pctx = ctx_with(NULL);
    fl_tp_sock_t *server = sock(pctx, FL_TP_PULL, "plain server");
    char ep[FL_ENDPOINT_MAX];
    ck_assert(fl_tp_sock_bind(server, "tcp://127.0.0.1:0", ep, sizeof ep) == FL_OK);
    fl_ctx_t *cctx = ctx_with("keys");
    fl_tp_sock_t *client = sock(cctx, FL_TP_PUSH, "curve client");
    ck_assert(fl_tp_sock_connect(client, ep) == FL_OK);
    fl_msg_hdr_t h;
    fl_msg_hdr_init(&h, FL_MSG_BARRIER, 4);
    fl_tp_send(client, NULL, &h, NULL, 0, fl_deadline_in(300));
    ck_assert_int_eq(recv_sender(server, 1000), -100);
    fl_tp_sock_destroy(&client);
    fl_tp_sock_destroy(&server);
    fl_ctx_destroy(&cctx);
    fl_ctx_destroy(&pctx);
}
END_TEST

static void expect_refused(const char *want)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/keys", root);
    fl_tp_curve_t *c = NULL;
    ck_assert_int_eq(fl_tp_curve_load(dir, NULL, &c), FL_EINVAL);
    ck_assert(c == NULL);
    ck_assert_msg(strstr(fl_last_error(), want) != NULL, "'%s' does not say '%s'", fl_last_error(),
                  want);
}

START_TEST(test_unsafe_or_incomplete_keys_refused)
{
    char path[160];
    snprintf(path, sizeof path, "%s/keys/client.key", root);
    ck_assert(chmod(path, 0644) == 0);
    expect_refused("readable by others");
    ck_assert(chmod(path, 0600) == 0);
    /* Whoever may write the allowlist decides who gets in. */
    char auth[160];
    snprintf(auth, sizeof auth, "%s/keys/authorized", root);
    ck_assert(chmod(auth, 0777) == 0);
    expect_refused("writable by its group or others");
    ck_assert(chmod(auth, 0755) == 0);
    snprintf(auth, sizeof auth, "%s/keys/authorized/client.pub", root);
    ck_assert(chmod(auth, 0666) == 0);
    expect_refused("client.pub decides who may connect");
    ck_assert(chmod(auth, 0644) == 0);
    SH("rm %s/keys/authorized/client.pub", root);
    expect_refused("holds no *.pub key");
    SH("rmdir %s/keys/authorized", root);
    expect_refused("no allowlist");
    SH("mkdir %s/keys/authorized && cp %s/keys/client.pub %s/keys/authorized/", root, root, root);
    SH("echo 'public-key = \"short\"' > %s/keys/authorized/bad.pub", root);
    expect_refused("bad.pub has no valid public-key");
    SH("rm %s/keys/authorized/bad.pub && rm %s/keys/server.key", root, root);
    expect_refused("server.key");
}
END_TEST

/* Loads root/keys: FL_OK expected. */
static void expect_loaded(void)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/keys", root);
    fl_tp_curve_t *c = NULL;
    ck_assert_msg(fl_tp_curve_load(dir, NULL, &c) == FL_OK, "%s", fl_last_error());
    fl_tp_curve_free(c);
}

/* A secret key: nothing for others, no group write, group read only for the process's own
 * group (Kubernetes' fsGroup); the key directory not writable by group or others. Each
 * refusal names the file and its mode. */
START_TEST(test_key_modes)
{
    char key[160];
    char dir[128];
    snprintf(key, sizeof key, "%s/keys/server.key", root);
    snprintf(dir, sizeof dir, "%s/keys", root);
    ck_assert(chmod(key, 0604) == 0);
    expect_refused("server.key holds a secret key and is readable by others (mode 604)");
    ck_assert(chmod(key, 0620) == 0);
    expect_refused("server.key holds a secret key and is writable by its group (mode 620)");
    ck_assert(chmod(key, 0640) == 0);
    ck_assert(chown(key, (uid_t)-1, getegid()) == 0);
    expect_loaded(); /* its group is this process's own */
    /* Another group: only root may give the file one this process is not in. */
    gid_t other = 54321;
    if (geteuid() == 0 && getegid() != other) {
        ck_assert(chown(key, (uid_t)-1, other) == 0);
        expect_refused("server.key holds a secret key and is readable by group 54321, not this "
                       "process's (mode 640)");
        ck_assert(chown(key, (uid_t)-1, getegid()) == 0);
    }
    ck_assert(chmod(key, 0600) == 0);
    ck_assert(chmod(dir, 0777) == 0);
    expect_refused("keys holds the keys and is writable by its group or others (mode 777)");
    ck_assert(chmod(dir, 0770) == 0);
    expect_refused("keys holds the keys and is writable by its group or others (mode 770)");
    ck_assert(chmod(dir, 0750) == 0);
    expect_loaded();
}
END_TEST

/* Like ctx_with, with the client key of a member (self: "rank-3", "ps") where it has one. */
static fl_ctx_t *ctx_as(const char *self)
{
    fl_ctx_opts_t o;
    fl_ctx_opts_init(&o);
    o.log_level = FL_LOG_OFF;
    fl_ctx_t *ctx = NULL;
    ck_assert(fl_ctx_create(&o, &ctx) == FL_OK);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/keys", root);
    ck_assert_msg(fl_tp_curve_use(ctx, dir, self) == FL_OK, "%s", fl_last_error());
    return ctx;
}

/* Adds root/keys/NAME.key bound to `bound`, allowed in. */
static void member_key(const char *name, int bound)
{
    char base[128];
    snprintf(base, sizeof base, "%s/keys/%s", root, name);
    ck_assert(fl_tp_curve_keygen(base, name, bound) == FL_OK);
    SH("cp %s/keys/%s.pub %s/keys/authorized/", root, name, root);
}

/* What a barrier from a client of cctx arrives with at server: its key's binding, and whether
 * the key is the one in root/keys/NAME.pub. */
static int bound_at_server(fl_tp_sock_t *server, const char *ep, fl_ctx_t *cctx, const char *name)
{
    fl_tp_sock_t *c = sock(cctx, FL_TP_DEALER, "member");
    ck_assert(fl_tp_sock_connect(c, ep) == FL_OK);
    send_barrier(c, 1);
    fl_tp_msg_t m;
    ck_assert(fl_tp_recv(server, &m, fl_deadline_in(5000)) == FL_OK);
    int bound = m.peer_bound;
    char path[160], text[512];
    snprintf(path, sizeof path, "%s/keys/%s.pub", root, name);
    FILE *f = fopen(path, "r");
    ck_assert(f != NULL);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    ck_assert_uint_eq(strlen(m.peer_key), 40);
    ck_assert_msg(strstr(text, m.peer_key) != NULL, "%s is not %s's key", m.peer_key, name);
    fl_tp_msg_close(&m);
    fl_tp_sock_destroy(&c);
    return bound;
}

/* Per-member keys: each process picks its own (rank-K.key, ps.key) over the shared client.key,
 * and a server learns the member each message's key is bound to. */
START_TEST(test_member_keys_and_bindings)
{
    member_key("rank-3", 3);
    member_key("ps", FL_TP_KEY_SERVER);
    fl_ctx_t *sctx = ctx_with("keys");
    fl_tp_sock_t *server = sock(sctx, FL_TP_ROUTER, "server");
    char ep[FL_ENDPOINT_MAX];
    ck_assert(fl_tp_sock_bind(server, "tcp://127.0.0.1:0", ep, sizeof ep) == FL_OK);
    fl_ctx_t *ctx[3] = {ctx_as("rank-3"), ctx_as("ps"), ctx_as("rank-4")};
    ck_assert_int_eq(bound_at_server(server, ep, ctx[0], "rank-3"), 3);
    ck_assert_int_eq(bound_at_server(server, ep, ctx[1], "ps"), FL_TP_KEY_SERVER);
    ck_assert_int_eq(bound_at_server(server, ep, ctx[2], "client"), FL_TP_KEY_ANY);
    for (int i = 0; i < 3; i++)
        fl_ctx_destroy(&ctx[i]);
    fl_tp_sock_destroy(&server);
    fl_ctx_destroy(&sctx);

    /* Without the shared key, a member needs its own; a process that only binds needs none,
     * and says so if it connects after all. */
    SH("rm %s/keys/client.key %s/keys/authorized/client.pub", root, root);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/keys", root);
    fl_tp_curve_t *c = NULL;
    ck_assert_int_eq(fl_tp_curve_load(dir, "rank-4", &c), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "neither rank-4.key") != NULL, "%s", fl_last_error());
    fl_ctx_t *bind_only = ctx_as(NULL);
    fl_tp_sock_t *s = sock(bind_only, FL_TP_DEALER, "dealer");
    ck_assert_int_eq(fl_tp_sock_connect(s, ep), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "no client key") != NULL, "%s", fl_last_error());
    fl_tp_sock_destroy(&s);
    fl_ctx_destroy(&bind_only);
}
END_TEST

/* A binding that cannot be read, or a key listed twice, is refused naming the file: read as no
 * binding, it would let the key be any member. */
START_TEST(test_bad_bindings_refused)
{
    static const char *const bad[][2] = {
        {"    rank = 3", "the binding is not rank"},
        {"    rank = \"x\"", "the binding is not rank"},
        {"    rank = \"65536\"", "the binding is not rank"},
        {"    role = \"admin\"", "the binding is not role"},
        {"    rank = \"1\"\n    role = \"server\"", "the binding is not role"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        SH("(echo metadata; echo '%s'; grep public-key %s/keys/client.pub) > "
           "%s/keys/authorized/m.pub",
           bad[i][0], root, root);
        char want[160];
        snprintf(want, sizeof want, "m.pub: %s", bad[i][1]);
        expect_refused(want);
    }
    SH("cp %s/keys/client.pub %s/keys/authorized/m.pub", root, root);
    expect_refused("is in the allowlist twice");
    SH("rm %s/keys/authorized/m.pub", root);
    expect_loaded();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tp_curve");
    TCase *t = tcase_create("curve");
    tcase_set_timeout(t, 60);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_only_allowed_clients_get_through);
    tcase_add_test(t, test_curve_client_and_plain_server_do_not_talk);
    tcase_add_test(t, test_unsafe_or_incomplete_keys_refused);
    tcase_add_test(t, test_key_modes);
    tcase_add_test(t, test_member_keys_and_bindings);
    tcase_add_test(t, test_bad_bindings_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
