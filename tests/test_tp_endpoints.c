/* Transport poll and endpoints (tp_sock.c, tp_endpoint.c): poll; endpoint parsing, advertising
 * and the local-address lookup; bind and create errors. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fl_tp.h"
#include "tputil.h"

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
            ck_abort_msg("parse '%s': scheme %d host '%s' port %d", ok[i].ep, (int)e.scheme, e.host,
                         e.port);
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
            ck_abort_msg("advertise(%s, %s): %d '%s', want '%s'", cases[i].bound, cases[i].host, rc,
                         rc == FL_OK ? out : fl_last_error(), cases[i].want);
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
    static const char *const yes[] = {
        "127.0.0.1", "0.0.0.0", "10.1.2.3", "::1", "::", "fe80::1", "2001:db8::8a2e:370:7334"};
    static const char *const no[] = {"",      "localhost", "host-1",    "1.2.3", "256.1.1.1",
                                     "[::1]", "*",         "1.2.3.4:5", "::1:::"};
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
            ck_abort_msg("case %d: detail '%s' does not name the socket", which, fl_last_error());
    }
    fl_ctx_destroy(&ctx);
}
END_TEST

/* Voluntary context switches of this process's threads other than the caller's, in all. */
static long others_switches(void)
{
    char self[64];
    snprintf(self, sizeof self, "%ld", (long)gettid());
    DIR *d = opendir("/proc/self/task");
    ck_assert_ptr_nonnull(d);
    long sum = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, self) == 0)
            continue;
        char path[300];
        char line[128];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        FILE *f = fopen(path, "r");
        long n = 0;
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1)
                break;
        if (f != NULL)
            fclose(f);
        sum += n;
    }
    closedir(d);
    return sum;
}

/* A bound ROUTER on TCP with a hold bound and no connection: its guard sleeps until one comes
 * (it used to look at the memory every 20 ms, 50 wakeups a second in every idle process). */
START_TEST(test_idle_guard_sleeps)
{
    fl_ctx_t *ctx = ctx_new();
    fl_tp_opts_t o;
    opts_test(&o);
    o.hold_max_bytes = (size_t)64 << 20;
    fl_tp_sock_t *r = sock_new(ctx, FL_TP_ROUTER, "idle", &o);
    char bound[FL_ENDPOINT_MAX];
    ck_assert_int_eq(fl_tp_sock_bind(r, "tcp://127.0.0.1:0", bound, sizeof bound), FL_OK);
    usleep(300 * 1000); /* the bind's events are read */
    long before = others_switches();
    usleep(2000 * 1000);
    long woke = others_switches() - before;
    ck_assert_msg(woke < 20, "the idle socket's threads woke %ld times in 2 s (want < 20)", woke);
    fl_tp_sock_destroy(&r);
    fl_ctx_destroy(&ctx);
}
END_TEST

Suite *tp_endpoints_suite(void);
Suite *tp_endpoints_suite(void)
{
    Suite *s = suite_create("tp_endpoints");
    TCase *t = tcase_create("poll");
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
    tcase_add_test(t, test_idle_guard_sleeps);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(tp_endpoints_suite());
}
