/* What the containers run besides training (deploy/compose.yaml, deploy/k8s), as child
 * processes: flodl-health (exit 0 on /healthz 200, 1 on no answer or another status, 2 on bad
 * arguments), flodl-keygen --if-missing (makes the keys once, keeps them on a rerun), and
 * flodl-worker --resume-if-any (a fresh start without a checkpoint, a resume with one). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fl_core.h"
#include "testproc.h"
#include "testutil.h"

#define HEALTH_BIN FLODL_BIN_DIR "/observe/flodl-health"
#define KEYGEN_BIN FLODL_BIN_DIR "/server/flodl-keygen"
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"

static int health(const char *arg, char *err, size_t cap)
{
    const char *argv[] = {HEALTH_BIN, "--timeout-ms", "2000", arg, NULL};
    proc_t p;
    run_sync(&p, HEALTH_BIN, argv, NULL);
    int code = proc_code(&p);
    snprintf(err, cap, "%s", p.buf[1] ? p.buf[1] : "");
    procs_free(&p, 1);
    return code;
}

START_TEST(test_health)
{
    char err[512];
    char port[16];
    snprintf(port, sizeof port, "%d", free_port()); /* nothing listens there */
    ck_assert_int_eq(health(port, err, sizeof err), 1);
    ck_assert_msg(strstr(err, "connect") != NULL, "%s", err);

    proc_t ps;
    char ep[128];
    char hport[16]; /* the health listener, what deploy/compose.yaml's checks read */
    snprintf(hport, sizeof hport, "%d", free_port());
    const char *extra[] = {"--metrics-port", port, "--health-port", hport, "--metrics-bind",
                           "127.0.0.1",      NULL};
    ck_assert(start_ps(&ps, 2, extra, NULL, ep, sizeof ep, 1));
    /* The metrics endpoint starts with the coordinator; give it a moment to listen. */
    int code = 1;
    for (int i = 0; i < 50 && code != 0; i++) {
        code = health(port, err, sizeof err);
        if (code != 0)
            usleep(100000);
    }
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%s/metrics", port);
    int metrics = health(url, err, sizeof err);
    int listener = health(hport, err, sizeof err);
    ck_assert_msg(listener == 0, "flodl-health %s (--health-port): exit %d (%s)", hport, listener,
                  err);
    snprintf(url, sizeof url, "http://127.0.0.1:%s/nope", port);
    int missing = health(url, err, sizeof err);
    procs_stop(&ps, 1);
    procs_free(&ps, 1);
    ck_assert_msg(code == 0, "flodl-health %s: exit %d (%s)", port, code, err);
    ck_assert_int_eq(metrics, 0);
    ck_assert_int_eq(missing, 1);
    ck_assert_msg(strstr(err, "404") != NULL, "%s", err);

    const char *bad[] = {"--frobnicate", "http://:80/healthz"};
    for (int i = 0; i < 2; i++)
        ck_assert_msg(health(bad[i], err, sizeof err) == 2, "%s: %s", bad[i], err);
}
END_TEST

static int keygen(const char *dir, bool if_missing, char *out, size_t cap)
{
    const char *argv[] = {KEYGEN_BIN, if_missing ? "--if-missing" : dir, if_missing ? dir : NULL,
                          NULL};
    proc_t p;
    run_sync(&p, KEYGEN_BIN, argv, NULL);
    int code = proc_code(&p);
    snprintf(out, cap, "%s%s", p.buf[0] ? p.buf[0] : "", p.buf[1] ? p.buf[1] : "");
    procs_free(&p, 1);
    return code;
}

START_TEST(test_keygen_if_missing)
{
    char dir[] = "/tmp/flodl-keys-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char keys[64];
    snprintf(keys, sizeof keys, "%s/keys", dir);
    char out[1024];
    ck_assert_msg(keygen(keys, true, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "authorized/client.pub") != NULL, "%s", out);
    struct stat st;
    char path[128];
    snprintf(path, sizeof path, "%s/server.key", keys);
    ck_assert(stat(path, &st) == 0);
    time_t made = st.st_mtime;
    ino_t ino = st.st_ino;
    /* A rerun keeps them; plain flodl-keygen still refuses to overwrite. */
    ck_assert_msg(keygen(keys, true, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "already") != NULL, "%s", out);
    ck_assert(stat(path, &st) == 0 && st.st_ino == ino && st.st_mtime == made);
    ck_assert_int_eq(keygen(keys, false, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "exists") != NULL, "%s", out);
    /* A partial set is not completed: that would pair a new client key with old servers. */
    snprintf(path, sizeof path, "%s/client.key", keys);
    ck_assert(unlink(path) == 0);
    ck_assert_int_eq(keygen(keys, true, out, sizeof out), 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert(system(cmd) == 0);
}
END_TEST

static int train(const char *ckpt, const char *epochs, char *out, size_t cap)
{
    const char *argv[] = {WK_BIN, "--epochs",        epochs, "--checkpoint",
                          ckpt,   "--resume-if-any", ckpt,   NULL};
    proc_t p;
    run_sync(&p, WK_BIN, argv, NULL);
    int code = proc_code(&p);
    snprintf(out, cap, "%s%s", p.buf[0] ? p.buf[0] : "", p.buf[1] ? p.buf[1] : "");
    procs_free(&p, 1);
    return code;
}

START_TEST(test_resume_if_any)
{
    char dir[] = "/tmp/flodl-ckpt-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char ckpt[64];
    snprintf(ckpt, sizeof ckpt, "%s/ring", dir);
    static char out[65536];
    ck_assert_msg(train(ckpt, "1", out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "no checkpoint in") && strstr(out, "starting fresh"), "%s", out);
    ck_assert_msg(train(ckpt, "2", out, sizeof out) == 0, "%s", out);
    char want[128];
    snprintf(want, sizeof want, "resumed from %s: step ", ckpt);
    ck_assert_msg(strstr(out, want) && strstr(out, "1 epoch(s) done"), "%s", out);
    ck_assert_msg(strstr(out, "epoch 2/2 done") && !strstr(out, "epoch 1/2 done"), "%s", out);

    const char *argv[] = {WK_BIN, "--resume", ckpt, "--resume-if-any", ckpt, NULL};
    proc_t p;
    run_sync(&p, WK_BIN, argv, NULL);
    ck_assert_msg(proc_code(&p) == 2 && strstr(p.buf[1], "give one"), "%s", p.buf[1]);
    procs_free(&p, 1);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert(system(cmd) == 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("deploy_tools");
    TCase *t = tcase_create("tools");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_health);
    tcase_add_test(t, test_keygen_if_missing);
    tcase_add_test(t, test_resume_if_any);
    suite_add_tcase(s, t);
    return fl_test_run(s);
}
