/* flodl-ps and the limit on open files (#18 item 4): the soft limit is raised to the hard one
 * at start and both are logged. The test stops only the processes it started, by PID. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fl_core.h"
#include "obsutil.h"
#include "testproc.h"
#include "testutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"
#define KEYGEN_BIN FLODL_BIN_DIR "/server/flodl-keygen"

static char root[64];
static char keys[96];

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/flodl-guardp-XXXXXX");
    ck_assert(mkdtemp(root) != NULL);
    snprintf(keys, sizeof keys, "%s/keys", root);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s > /dev/null", KEYGEN_BIN, keys);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    ck_assert(system(cmd) == 0);
}

/* Starts flodl-ps under `ulimit` (sh execs it: the PID is flodl-ps's) and reads its endpoint. */
static bool start_ps_limited(proc_t *p, const char *limits, const char *const *flags,
                             const char *const *env, char *ep, size_t cap)
{
    char path[128];
    char script[256];
    epfile_path(path, sizeof path, 7);
    unlink(path);
    snprintf(script, sizeof script, "%s && exec \"$0\" \"$@\"", limits);
    const char *argv[MAX_ARGS] = {
        "/bin/sh", "-c", script, PS_BIN, "--bind", "tcp://127.0.0.1:0", "--endpoint-file", path};
    size_t a = 8;
    for (size_t i = 0; flags[i] != NULL && a + 1 < MAX_ARGS; i++)
        argv[a++] = flags[i];
    argv[a] = NULL;
    proc_start(p, "/bin/sh", argv, env);
    bool ok = read_epfile(p, path, ep, cap, fl_deadline_in(10000));
    unlink(path);
    return ok;
}

START_TEST(test_soft_fd_limit_raised_at_start)
{
    proc_t p;
    char ep[FL_ENDPOINT_MAX];
    const char *flags[] = {"--world-size", "1", "--insecure", NULL};
    ck_assert(
        start_ps_limited(&p, "ulimit -S -n 1024 && ulimit -H -n 4096", flags, NULL, ep, sizeof ep));
    char path[64];
    char line[256];
    snprintf(path, sizeof path, "/proc/%d/limits", (int)p.pid);
    FILE *f = fopen(path, "r");
    unsigned long long soft = 0;
    unsigned long long hard = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "Max open files", 14) == 0) sscanf(line + 14, "%llu %llu", &soft, &hard);
    if (f != NULL) fclose(f);
    procs_stop(&p, 1);
    ck_assert_msg(soft == 4096 && hard == 4096,
                  "expected flodl-ps's soft limit on open files raised to its hard limit 4096, "
                  "got soft %llu hard %llu",
                  soft, hard);
    ck_assert_msg(strstr(p.buf[1], "open files: soft limit 1024 raised to the hard limit 4096"),
                  "expected flodl-ps to log both limits: %s", p.buf[1]);
    procs_free(&p, 1);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tp_guard_proc");
    TCase *t = tcase_create("tp_guard_proc");
    tcase_set_timeout(t, 200);
    tcase_add_checked_fixture(t, setup, teardown);
    tcase_add_test(t, test_soft_fd_limit_raised_at_start);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
