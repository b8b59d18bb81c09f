/* The binaries with CurveZMQ: a job whose flodl-ps and workers share keys trains; a worker with
 * a key nobody allowed and a plain-text worker get nothing through (they fail at once saying
 * why, well before their rendezvous deadline; flodl-ps logs and counts both) while the job goes
 * on with an allowed one; unsafe keys and a missing security choice are refused at start; with
 * per-member keys each rank must hold its own. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fl_core.h"
#include "obsutil.h"
#include "testproc.h"
#include "testutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"
#define KEYGEN_BIN FLODL_BIN_DIR "/server/flodl-keygen"

static char root[64];
static char keys[96];
static char strange[96];

static void sys(const char *cmd)
{
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/flodl-curvep-XXXXXX");
    ck_assert(mkdtemp(root) != NULL);
    snprintf(keys, sizeof keys, "%s/keys", root);
    snprintf(strange, sizeof strange, "%s/strange", root);
    char cmd[1024];
    /* The job's keys from flodl-keygen; the stranger made its own and copied the server's. */
    snprintf(cmd, sizeof cmd, "%s %s > /dev/null && %s %s > /dev/null && cp %s/server.key %s/",
             KEYGEN_BIN, keys, KEYGEN_BIN, strange, keys, strange);
    sys(cmd);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    sys(cmd);
}

static const char *const secure_env[] = {"FLODL_INSECURE=0", NULL};

static void start_worker(proc_t *p, const char *ep, const char *rank, const char *sec,
                         const char *dir, const char *rdv_ms)
{
    const char *argv[MAX_ARGS] = {WK_BIN,      "--mode",
                                  "ring",      "--rank",
                                  rank,        "--world-size",
                                  "2",         "--coordinator",
                                  ep,          "--host",
                                  "127.0.0.1", "--epochs",
                                  "1",         "--progress",
                                  "1000",      "--rendezvous-timeout",
                                  rdv_ms,      sec,
                                  dir,         NULL};
    proc_start(p, WK_BIN, argv, secure_env);
}

/* Connects to ep and sends a whole ZMTP 3.0 greeting of the NULL mechanism (plain text), then
 * waits for the caller to close it. */
static int plain_greeting(const char *ep)
{
    struct sockaddr_in to = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons((uint16_t)atoi(strrchr(ep, ':') + 1));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    uint8_t g[64];
    memset(g, 0, sizeof g);
    g[0] = 0xff;
    g[9] = 0x7f;
    g[10] = 3; /* version 3.0 */
    memcpy(g + 12, "NULL", 4);
    if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof to) != 0 ||
        write(fd, g, sizeof g) != (ssize_t)sizeof g) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

START_TEST(test_strangers_get_nothing_through)
{
    proc_t p[5];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[16384];
    int mport = free_port();
    char mp[16];
    snprintf(mp, sizeof mp, "%d", mport);
    const char *extra[] = {
        "--curve-dir",    keys,        "--log-level", "warn", "--metrics-port", mp,
        "--metrics-bind", "127.0.0.1", NULL};
    ck_assert(start_ps(&p[0], 2, extra, secure_env, ep, sizeof ep, 3));
    start_worker(&p[1], ep, "0", "--curve-dir", keys, "30000");
    /* Rank 1 first as a stranger, then in plain text: both refused at once, well before their
     * rendezvous deadline (120 s). */
    start_worker(&p[2], ep, "1", "--curve-dir", strange, "120000");
    const char *argv[MAX_ARGS] = {WK_BIN,      "--mode",
                                  "ring",      "--rank",
                                  "1",         "--world-size",
                                  "2",         "--coordinator",
                                  ep,          "--host",
                                  "127.0.0.1", "--epochs",
                                  "1",         "--rendezvous-timeout",
                                  "120000",    "--insecure",
                                  NULL};
    proc_start(&p[3], WK_BIN, argv, NULL);
    bool ended = procs_wait(&p[2], 2, fl_deadline_in(20000));
    show(p, 4, out, sizeof out);
    ck_assert_msg(ended && proc_code(&p[2]) == 1 &&
                      strstr(p[2].buf[1], "refused by the server's allowlist"),
                  "expected the worker with a key not allowed to fail at once, refused by the "
                  "server's allowlist:%s",
                  out);
    ck_assert_msg(ended && proc_code(&p[3]) == 1 && strstr(p[3].buf[1], "requires CURVE keys"),
                  "expected the plain-text worker to fail at once, the server requiring CURVE "
                  "keys:%s",
                  out);
    /* Whichever side sees the mechanisms differ closes first, so the server cannot always tell
     * the worker's plain text from a plain disconnect; a client that sent its whole plain-text
     * greeting and waits is always told apart. */
    int fd = plain_greeting(ep);
    bool logged = proc_wait_text(p, 1, 0, 1, "not in the allowlist", 1, fl_deadline_in(5000)) &&
                  proc_wait_text(p, 1, 0, 1, "it speaks plain text", 1, fl_deadline_in(5000));
    if (fd >= 0)
        close(fd);
    show(p, 4, out, sizeof out);
    ck_assert_msg(logged && strstr(p[0].buf[1], "CURVE: refused a connection") != NULL,
                  "expected flodl-ps to log both refusals, the key and the plain text:%s", out);
    /* ... and counts both where monitoring sees them (the coordinator publishes its counters
     * on its tick). */
    char *body = NULL;
    double refused = 0;
    for (int64_t until = fl_deadline_in(5000); !(refused >= 2) && fl_now_ms() < until;) {
        free(body);
        body = NULL;
        ck_assert_int_eq(fl_test_http_get(mport, "/metrics", &body), 200);
        refused = fl_test_metric_value(body, "flodl_ps_auth_refused_total");
        struct timespec tick = {0, 100 * 1000000L};
        nanosleep(&tick, NULL);
    }
    ck_assert_msg(refused >= 2,
                  "expected flodl_ps_auth_refused_total >= 2 (a key, plain text), "
                  "got %g:\n%s",
                  refused, body);
    free(body);
    /* The job goes on with the allowed rank 1. */
    start_worker(&p[4], ep, "1", "--curve-dir", keys, "30000");
    bool done = procs_wait(p, 5, fl_deadline_in(90000));
    procs_stop(p, 5);
    show(p, 5, out, sizeof out);
    ck_assert_msg(done && proc_code(&p[0]) == 0 && proc_code(&p[1]) == 0 && proc_code(&p[4]) == 0,
                  "the allowed job did not finish:%s", out);
    ck_assert_msg(strstr(p[1].buf[0], "rank 0 summary:") != NULL, "%s", out);
    procs_free(p, 5);
}
END_TEST

START_TEST(test_unsafe_keys_and_no_choice_refused)
{
    char path[160];
    snprintf(path, sizeof path, "%s/client.key", keys);
    ck_assert(chmod(path, 0644) == 0);
    proc_t p;
    const char *a[] = {PS_BIN,        "--world-size", "1", "--bind", "tcp://127.0.0.1:0",
                       "--curve-dir", keys,           NULL};
    run_sync(&p, PS_BIN, a, secure_env);
    ck_assert_msg(proc_code(&p) == 2 && strstr(p.buf[1], "readable by others"), "%d: %s",
                  proc_code(&p), p.buf[1]);
    procs_free(&p, 1);
    ck_assert(chmod(path, 0600) == 0);
    /* Neither keys nor --insecure: refused, saying how to choose. */
    const char *b[] = {PS_BIN, "--world-size", "1", "--bind", "tcp://127.0.0.1:0", NULL};
    run_sync(&p, PS_BIN, b, secure_env);
    ck_assert_msg(proc_code(&p) == 2 && strstr(p.buf[1], "flodl-keygen") &&
                      strstr(p.buf[1], "--insecure"),
                  "%d: %s", proc_code(&p), p.buf[1]);
    procs_free(&p, 1);
    const char *c[] = {
        WK_BIN, "--rank", "0", "--world-size", "2", "--coordinator", "tcp://127.0.0.1:1", NULL};
    run_sync(&p, WK_BIN, c, secure_env);
    ck_assert_msg(proc_code(&p) == 2 && strstr(p.buf[1], "--curve-dir"), "%d: %s", proc_code(&p),
                  p.buf[1]);
    procs_free(&p, 1);
    /* Both: refused too. */
    const char *d[] = {PS_BIN, "--world-size", "1", "--curve-dir", keys, "--insecure", NULL};
    run_sync(&p, PS_BIN, d, secure_env);
    ck_assert_msg(proc_code(&p) == 2 && strstr(p.buf[1], "choose one"), "%d: %s", proc_code(&p),
                  p.buf[1]);
    procs_free(&p, 1);
}
END_TEST

/* Per-member keys (flodl-keygen --ranks): the job trains with each rank on its own key, and a
 * rank holding another rank's key is refused at once, saying whose key it holds. */
START_TEST(test_member_keys_job)
{
    proc_t p[4];
    memset(p, 0, sizeof p);
    char pr[128], swap[128], cmd[1024], ep[FL_ENDPOINT_MAX], out[16384];
    snprintf(pr, sizeof pr, "%s/members", root);
    snprintf(swap, sizeof swap, "%s/swapped", root);
    snprintf(cmd, sizeof cmd,
             "%s --ranks 2 %s > /dev/null && test ! -e %s/client.key && cp -rp %s %s && "
             "cp -p %s/rank-0.key %s/rank-1.key",
             KEYGEN_BIN, pr, pr, pr, swap, pr, swap);
    sys(cmd);
    const char *extra[] = {"--curve-dir", pr, "--log-level", "warn", NULL};
    ck_assert(start_ps(&p[0], 2, extra, secure_env, ep, sizeof ep, 3));
    start_worker(&p[1], ep, "0", "--curve-dir", pr, "30000");
    start_worker(&p[2], ep, "1", "--curve-dir", swap, "120000");
    bool ended = procs_wait(&p[2], 1, fl_deadline_in(20000));
    show(p, 3, out, sizeof out);
    ck_assert_msg(ended && proc_code(&p[2]) != 0 &&
                      strstr(p[2].buf[1], "came with the client key of rank 0"),
                  "expected rank 1 with rank 0's key to be refused at once:%s", out);
    start_worker(&p[3], ep, "1", "--curve-dir", pr, "30000");
    bool done = procs_wait(p, 4, fl_deadline_in(90000));
    procs_stop(p, 4);
    show(p, 4, out, sizeof out);
    ck_assert_msg(done && proc_code(&p[0]) == 0 && proc_code(&p[1]) == 0 && proc_code(&p[3]) == 0,
                  "the job on per-member keys did not finish:%s", out);
    procs_free(p, 4);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("curve_proc");
    TCase *t = tcase_create("curve_proc");
    tcase_set_timeout(t, 150);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_strangers_get_nothing_through);
    tcase_add_test(t, test_unsafe_keys_and_no_choice_refused);
    tcase_add_test(t, test_member_keys_job);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
