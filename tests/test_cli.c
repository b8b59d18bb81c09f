/* The real binaries, run as child processes with captured stdout/stderr: flodl-ps and
 * flodl-worker refuse bad flags and environment values (exit 2, one line naming the flag),
 * take rank/world/coordinator from flodl's, torchrun's and Kubernetes' variables, run a job end
 * to end, report a worker killed mid-job, and stop cleanly on SIGTERM during the rendezvous.
 * Every child is killed and reaped by PID on every path; every wait has a deadline. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testproc.h"
#include "testutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"

/* ---- bad flags and environment ---- */

START_TEST(test_ps_bad_flags)
{
    static const bad_case_t cases[] = {
        {{"--bind", "tcp://127.0.0.1:0", NULL}, {NULL}, {"--world-size", "missing", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "0", NULL},
         {NULL},
         {"--world-size", "out of range", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "abc", NULL},
         {NULL},
         {"--world-size", "'abc' is not an integer", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "2", "--frobnicate", NULL},
         {NULL},
         {"--frobnicate", "unknown", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "2", "--heartbeat-timeout", "5", NULL},
         {NULL},
         {"--heartbeat-timeout", "out of range", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "2", "--log-level", "loud", NULL},
         {NULL},
         {"--log-level", "'loud'", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "2", "extra", NULL},
         {NULL},
         {"'extra'", "unexpected", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", NULL},
         {NULL},
         {"--world-size", "incomplete", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "1", "--held-max", "512K", NULL},
         {NULL},
         {"--held-max", "524288 bytes is out of range 1048576..", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "1", "--held-max", "1T", NULL},
         {NULL},
         {"--held-max", "'1T' has an unknown suffix (K, M or G)", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", "--world-size", "1", "--held-max", "-5M", NULL},
         {NULL},
         {"--held-max", "negative", NULL}},
        {{"--bind", "tcp://127.0.0.1:0", NULL},
         {"FLODL_WORLD_SIZE=two", NULL},
         {"FLODL_WORLD_SIZE", "'two'", NULL}},
        /* An address this host does not have: what a bind takes, not "No such device". */
        {{"--bind", "tcp://nosuchhost.invalid:29999", "--world-size", "1", NULL},
         {NULL},
         {"'nosuchhost.invalid' is not an address or interface of this host", "0.0.0.0", NULL}},
        {{"--bind", "tcp://192.0.2.1:29999", "--world-size", "1", NULL},
         {NULL},
         {"'192.0.2.1' is not an address or interface of this host", NULL}},
    };
    check_bad(PS_BIN, cases, sizeof cases / sizeof cases[0]);
}
END_TEST

/* Every case but the one under test is valid, so the flag named is the flag at fault. The
 * coordinator port is a closed one with a short rendezvous: a case wrongly accepted fails
 * fast instead of joining anything. */
#define WK_OK "--rendezvous-timeout", "1000", "--coordinator", "tcp://127.0.0.1:1"

START_TEST(test_worker_bad_flags)
{
    static const bad_case_t cases[] = {
        {{"--rank", "0", "--world-size", "2", "--rendezvous-timeout", "1000", NULL},
         {NULL},
         {"--coordinator", "missing", NULL}},
        {{"--world-size", "2", WK_OK, NULL}, {NULL}, {"--rank", "missing", NULL}},
        {{"--rank", "4", "--world-size", "4", WK_OK, NULL},
         {NULL},
         {"--rank", "not below --world-size 4", NULL}},
        {{"--rank", "0", "--world-size", "0", WK_OK, NULL},
         {NULL},
         {"--world-size", "out of range", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--size", "12Q", NULL},
         {NULL},
         {"--size", "'12Q'", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--dtype", "int8", NULL},
         {NULL},
         {"--dtype", "'int8'", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--op", "prod", NULL},
         {NULL},
         {"--op", "'prod'", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--stripes", "9", NULL},
         {NULL},
         {"--stripes", "out of range", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--algo", "fast", NULL},
         {NULL},
         {"--algo", "'fast'", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "--turbo", NULL},
         {NULL},
         {"--turbo", "unknown", NULL}},
        {{"--rank", "0", "--world-size", "2", WK_OK, "stray", NULL},
         {NULL},
         {"'stray'", "unexpected", NULL}},
        {{"--world-size", "2", WK_OK, NULL}, {"FLODL_RANK=x", NULL}, {"FLODL_RANK", "'x'", NULL}},
        {{"--rank", "0", "--world-size", "2", NULL},
         {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=99999", NULL},
         {"MASTER_PORT", "99999", NULL}},
    };
    check_bad(WK_BIN, cases, sizeof cases / sizeof cases[0]);
}
END_TEST

/* flodl-keygen into a directory it cannot make, or with flags that do not hold, says why (exit
 * 2, one line). */
START_TEST(test_keygen_unmakeable_dir)
{
    static const bad_case_t cases[] = {
        {{"/proc/flodl-no/keys", NULL},
         {NULL},
         {"cannot make /proc/flodl-no/keys", "No such file", NULL}},
        {{"--ranks", "0", "/tmp/flodl-no-keys", NULL}, {NULL}, {"--ranks", "out of range", NULL}},
        {{"--rank", "x", "/tmp/flodl-no-keys", NULL}, {NULL}, {"--rank", "'x'", NULL}},
        {{"--rank", "1", "--client", "a", "/tmp/flodl-no-keys", NULL},
         {NULL},
         {"one of --client, --rank and --ranks", NULL}},
        {{"--client", "rank-1", "/tmp/flodl-no-keys", NULL},
         {NULL},
         {"'rank-1'", "per-member", NULL}},
    };
    check_bad(FLODL_BIN_DIR "/server/flodl-keygen", cases, sizeof cases / sizeof cases[0]);
}
END_TEST

START_TEST(test_help)
{
    static const char *const bins[] = {PS_BIN, WK_BIN};
    static const char *const names[] = {"usage: flodl-ps", "usage: flodl-worker"};
    for (int b = 0; b < 2; b++) {
        const char *argv[] = {bins[b], "--help", NULL};
        proc_t p;
        run_sync(&p, bins[b], argv, NULL);
        if (proc_code(&p) != 0 || strncmp(p.buf[0], names[b], strlen(names[b])) != 0 ||
            count_of(p.buf[0], "\n") < 5 || p.len[1] != 0)
            ck_abort_msg("%s --help: exit %d, stdout '%s', stderr '%s'", bins[b], proc_code(&p),
                         p.buf[0], p.buf[1]);
        procs_free(&p, 1);
    }
}
END_TEST

/* --version: one line on stdout naming the binary and the version, exit 0, and nothing else
 * (flodl-launch starts no job). The running library says the same version as the header. */
START_TEST(test_version)
{
    ck_assert_str_eq(fl_version(), FL_VERSION_STRING);
    ck_assert_int_eq(fl_version_code(),
                     FL_VERSION_MAJOR * 10000 + FL_VERSION_MINOR * 100 + FL_VERSION_PATCH);
    static const char *const bins[] = {PS_BIN, WK_BIN, FLODL_BIN_DIR "/launch/flodl-launch",
                                       FLODL_BIN_DIR "/server/flodl-keygen"};
    static const char *const names[] = {"flodl-ps ", "flodl-worker ", "flodl-launch ",
                                        "flodl-keygen "};
    for (int b = 0; b < 4; b++) {
        const char *argv[] = {bins[b], "--version", NULL};
        proc_t p;
        run_sync(&p, bins[b], argv, NULL);
        char want[64];
        snprintf(want, sizeof want, "%s%s (libflodl %s; built with ", names[b], FL_VERSION_STRING,
                 fl_version());
        if (proc_code(&p) != 0 || strncmp(p.buf[0], want, strlen(want)) != 0 ||
            count_of(p.buf[0], "\n") != 1 || p.len[1] != 0)
            ck_abort_msg("%s --version: exit %d, stdout '%s', stderr '%s'", bins[b], proc_code(&p),
                         p.buf[0], p.buf[1]);
        procs_free(&p, 1);
    }
}
END_TEST

/* A worker whose coordinator does not answer says so after a second, naming the address and
 * how long it waited, instead of staying silent until its rendezvous deadline (3.5 s): the word
 * comes before the final error. The test's own deadlines are loose, since a sanitized build on
 * a loaded machine can take seconds to start. */
START_TEST(test_waiting_worker_says_so)
{
    int port = free_port(); /* nothing listens there */
    char coord[64];
    snprintf(coord, sizeof coord, "tcp://127.0.0.1:%d", port);
    const char *argv[] = {WK_BIN, "--rank",        "0",   "--world-size",
                          "2",    "--coordinator", coord, "--rendezvous-timeout",
                          "3500", "--epochs",      "1",   NULL};
    proc_t p;
    memset(&p, 0, sizeof p);
    proc_start(&p, WK_BIN, argv, NULL);
    char want[128];
    snprintf(want, sizeof want, "no answer yet from the coordinator at %s after 1 s", coord);
    bool said = proc_wait_text(&p, 1, 0, 1, want, 1, fl_deadline_in(15000));
    bool done = procs_wait(&p, 1, fl_deadline_in(15000));
    procs_stop(&p, 1);
    ck_assert_msg(said, "no word while waiting: '%s'", p.buf[1]);
    ck_assert_msg(done && proc_code(&p) == 1, "exit %d: '%s'", proc_code(&p), p.buf[1]);
    const char *word = strstr(p.buf[1], want);
    const char *last = strstr(p.buf[1], "no answer from the coordinator at");
    ck_assert_msg(last != NULL && word != NULL && word < last,
                  "the word must come before the final error: '%s'", p.buf[1]);
    procs_free(&p, 1);
}
END_TEST

/* ---- jobs ---- */

/* Starts a worker; an argument "@EP", or an environment entry ending in "=@EP", gets the
 * coordinator's endpoint instead. */
static void start_worker(proc_t *p, const char *ep, const char *const *args, const char *const *env)
{
    const char *argv[MAX_ARGS] = {WK_BIN};
    size_t a = 1;
    for (size_t i = 0; args != NULL && args[i] != NULL && a + 1 < MAX_ARGS; i++)
        argv[a++] = strcmp(args[i], "@EP") == 0 ? ep : args[i];
    argv[a] = NULL;
    char envbuf[MAX_ENV][320]; /* copied into the child by fork */
    const char *envp[MAX_ENV + 1];
    size_t e = 0;
    for (size_t i = 0; env != NULL && env[i] != NULL && e < MAX_ENV; i++) {
        const char *at = strstr(env[i], "=@EP");
        if (at != NULL && at[4] == '\0') {
            snprintf(envbuf[e], sizeof envbuf[e], "%.*s=%s", (int)(at - env[i]), env[i], ep);
            envp[e] = envbuf[e];
            e++;
        } else {
            envp[e++] = env[i];
        }
    }
    envp[e] = NULL;
    proc_start(p, WK_BIN, argv, envp);
}

/* Waits for flodl-ps (ps[0]) and n workers to end; all must exit 0 and worker i must print its
 * summary line as rank want_rank[i]. */
static void expect_clean_job(proc_t *ps, int n, bool up, const int *want_rank)
{
    bool all = up && procs_wait(ps, (size_t)n + 1, fl_deadline_in(30000));
    procs_stop(ps, (size_t)n + 1);
    char info[8192];
    show(ps, (size_t)n + 1, info, sizeof info);
    ck_assert_msg(up, "flodl-ps did not start: %s", info);
    ck_assert_msg(all, "the job did not end within 30 s: %s", info);
    for (int i = 0; i <= n; i++)
        if (proc_code(&ps[i]) != 0)
            ck_abort_msg("process %d exited %d: %s", i, proc_code(&ps[i]), info);
    for (int i = 0; i < n; i++) {
        char want[64];
        snprintf(want, sizeof want, "rank %d summary: ", want_rank[i]);
        if (strstr(ps[1 + i].buf[0], want) == NULL)
            ck_abort_msg("worker %d printed no '%s': %s", i, want, info);
    }
}

START_TEST(test_end_to_end)
{
    proc_t ps[4];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    static const char *const ps_extra[] = {"--heartbeat-timeout", "3000", "--log-level", "info",
                                           NULL};
    bool up = start_ps(&ps[0], 3, ps_extra, NULL, ep, sizeof ep, 1);
    static const char *const ranks[3] = {"0", "1", "2"};
    for (int r = 0; up && r < 3; r++) {
        const char *args[] = {"--rank",  ranks[r], "--world-size", "3",      "--coordinator",
                              "@EP",     "--mode", "drill",        "--size", "1M",
                              "--steps", "3",      "--timeout",    "20000",  "--rendezvous-timeout",
                              "20000",   NULL};
        start_worker(&ps[1 + r], ep, args, NULL);
    }
    static const int want[] = {0, 1, 2};
    expect_clean_job(ps, 3, up, want);
    char info[8192];
    show(ps, 4, info, sizeof info);
    ck_assert_msg(count_of(ps[1].buf[0], "verified\n") == 3 &&
                      count_of(ps[1].buf[0], "MISMATCH") == 0,
                  "rank 0 should print 3 verified steps: %s", info);
    for (int r = 0; r < 3; r++) {
        char line[64];
        snprintf(line, sizeof line, "rank %d summary: 3 steps of 1 MiB verified", r);
        if (strstr(ps[1 + r].buf[0], line) == NULL)
            ck_abort_msg("worker %d printed no '%s': %s", r, line, info);
    }
    ck_assert_msg(strstr(ps[0].buf[1], "all 3 ranks left") != NULL, "flodl-ps: %s", info);
    procs_free(ps, 4);
}
END_TEST

/* A drill worker's fixed memory: its summary line gives its anonymous resident memory, which
 * for a 4 KiB allreduce must stay under 24 MiB (256 ranks on a 24 GiB host). A build with CUDA
 * linked cuBLAS at start, whose initialisers alone took 90 MB in every rank. */
START_TEST(test_drill_anonymous_memory)
{
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    bool up = start_ps(&ps[0], 2, NULL, NULL, ep, sizeof ep, 1);
    static const char *const ranks[2] = {"0", "1"};
    for (int r = 0; up && r < 2; r++) {
        const char *args[] = {"--rank",  ranks[r], "--world-size", "2",      "--coordinator",
                              "@EP",     "--mode", "drill",        "--size", "4K",
                              "--steps", "3",      "--timeout",    "20000",  "--rendezvous-timeout",
                              "20000",   NULL};
        start_worker(&ps[1 + r], ep, args, NULL);
    }
    static const int want[] = {0, 1};
    expect_clean_job(ps, 2, up, want);
    char info[8192];
    show(ps, 3, info, sizeof info);
    for (int r = 0; r < 2; r++) {
        const char *m = strstr(ps[1 + r].buf[0], "; anonymous memory ");
        double mib = -1;
        ck_assert_msg(m != NULL && sscanf(m, "; anonymous memory %lf MiB", &mib) == 1,
                      "rank %d's summary line gives no anonymous memory: %s", r, info);
        ck_assert_msg(mib > 0 && mib < 24,
                      "expected a 4 KiB drill worker to hold under 24 MiB of anonymous memory, "
                      "rank %d holds %.1f MiB: %s",
                      r, mib, info);
    }
    procs_free(ps, 3);
}
END_TEST

static const char *const small_drill[] = {"--mode",    "drill",   "--size",
                                          "64K",       "--steps", "2",
                                          "--timeout", "20000",   "--rendezvous-timeout",
                                          "20000",     NULL};

START_TEST(test_env_flodl)
{
    static const char *const ps_env[] = {"FLODL_WORLD_SIZE=2", NULL};
    static const char *const env[2][4] = {
        {"FLODL_RANK=1", "FLODL_WORLD_SIZE=2", "FLODL_COORDINATOR=@EP", NULL},
        {"FLODL_RANK=0", "FLODL_WORLD_SIZE=2", "FLODL_COORDINATOR=@EP", NULL},
    };
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    bool up = start_ps(&ps[0], 0, NULL, ps_env, ep, sizeof ep, 2);
    for (int i = 0; up && i < 2; i++)
        start_worker(&ps[1 + i], ep, small_drill, env[i]);
    static const int want[] = {1, 0};
    expect_clean_job(ps, 2, up, want);
    procs_free(ps, 3);
}
END_TEST

/* torchrun's variables alone: flodl-ps (no --bind) listens on MASTER_PORT, and workers with
 * only RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT join it. */
START_TEST(test_env_torchrun)
{
    int port = free_port();
    char mport[32];
    snprintf(mport, sizeof mport, "MASTER_PORT=%d", port);
    const char *env[2][5] = {
        {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", mport, NULL},
        {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", mport, NULL},
    };
    char epfile[128];
    epfile_path(epfile, sizeof epfile, 3);
    unlink(epfile);
    const char *ps_argv[] = {PS_BIN, "--endpoint-file", epfile, NULL};
    const char *ps_env[] = {"WORLD_SIZE=2", mport, NULL};
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    proc_start(&ps[0], PS_BIN, ps_argv, ps_env);
    char ep[256] = "";
    bool up = read_epfile(&ps[0], epfile, ep, sizeof ep, fl_deadline_in(10000));
    unlink(epfile);
    char want_ep[64];
    snprintf(want_ep, sizeof want_ep, ":%d", port);
    ck_assert_msg(!up || strstr(ep, want_ep) != NULL, "flodl-ps listens on %s, not MASTER_PORT %d",
                  ep, port);
    for (int i = 0; up && i < 2; i++)
        start_worker(&ps[1 + i], "", small_drill, env[i]);
    static const int want[] = {1, 0};
    expect_clean_job(ps, 2, up, want);
    procs_free(ps, 3);
}
END_TEST

START_TEST(test_env_job_index)
{
    static const char *const env[2][4] = {
        {"JOB_COMPLETION_INDEX=1", "FLODL_WORLD_SIZE=2", "FLODL_COORDINATOR=@EP", NULL},
        {"JOB_COMPLETION_INDEX=0", "FLODL_WORLD_SIZE=2", "FLODL_COORDINATOR=@EP", NULL},
    };
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    bool up = start_ps(&ps[0], 2, NULL, NULL, ep, sizeof ep, 4);
    for (int i = 0; up && i < 2; i++)
        start_worker(&ps[1 + i], ep, small_drill, env[i]);
    static const int want[] = {1, 0};
    expect_clean_job(ps, 2, up, want);
    procs_free(ps, 3);
}
END_TEST

/* A job id is an opaque identifier: one holding '%' must work when both sides agree. */
START_TEST(test_job_id_with_percent)
{
    static const char *const ps_extra[] = {"--job-id", "run%%7", "--rendezvous-timeout", "5000",
                                           NULL};
    static const char *const args[] = {
        "--rank", "0",        "--world-size", "1",      "--coordinator",
        "@EP",    "--job-id", "run%%7",       "--mode", "drill",
        "--size", "4K",       "--steps",      "1",      "--rendezvous-timeout",
        "5000",   NULL};
    proc_t ps[2];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    bool up = start_ps(&ps[0], 1, ps_extra, NULL, ep, sizeof ep, 5);
    if (up)
        start_worker(&ps[1], ep, args, NULL);
    static const int want[] = {0};
    expect_clean_job(ps, 1, up, want);
    procs_free(ps, 2);
}
END_TEST

/* A registration whose job id holds printf directives must be refused like any other job id;
 * flodl-ps keeps serving and the real job runs to its end. */
START_TEST(test_hostile_job_id)
{
    char hostile[64] = "";
    for (int i = 0; i < 30; i++)
        strcat(hostile, "%s");
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    static const char *const ps_extra[] = {"--rendezvous-timeout", "20000", NULL};
    bool up = start_ps(&ps[0], 1, ps_extra, NULL, ep, sizeof ep, 6);
    const char *bad[] = {"--rank", "0",        "--world-size", "1",      "--coordinator",
                         "@EP",    "--job-id", hostile,        "--mode", "drill",
                         "--size", "4K",       "--steps",      "1",      "--rendezvous-timeout",
                         "3000",   NULL};
    if (up) {
        start_worker(&ps[1], ep, bad, NULL);
        procs_wait(&ps[1], 1, fl_deadline_in(10000));
        procs_pump(ps, 1, 100);
    }
    bool ps_alive = up && !ps[0].reaped;
    static const char *const good[] = {
        "--rank", "0",  "--world-size", "1", "--coordinator",        "@EP",  "--mode", "drill",
        "--size", "4K", "--steps",      "1", "--rendezvous-timeout", "5000", NULL};
    if (ps_alive)
        start_worker(&ps[2], ep, good, NULL);
    bool all = up && procs_wait(ps, 3, fl_deadline_in(20000));
    procs_stop(ps, 3);
    char info[8192];
    show(ps, 3, info, sizeof info);
    ck_assert_msg(up, "flodl-ps did not start: %s", info);
    ck_assert_msg(ps_alive, "flodl-ps died (exit %d) on a registration with job id '%s': %s",
                  proc_code(&ps[0]), hostile, info);
    ck_assert_msg(all, "job did not end: %s", info);
    /* A refusal by the coordinator is a configuration error: exit 2. */
    ck_assert_msg(proc_code(&ps[1]) == 2 && strstr(ps[1].buf[1], "refused") != NULL,
                  "the hostile worker should be refused (exit 2): %s", info);
    ck_assert_msg(proc_code(&ps[2]) == 0 && proc_code(&ps[0]) == 0, "%s", info);
    procs_free(ps, 3);
}
END_TEST

/* ---- failures ---- */

/* A word-bounded "rank K" in text. */
static bool names_rank(const char *text, int k)
{
    char want[32];
    snprintf(want, sizeof want, "rank %d", k);
    for (const char *s = strstr(text, want); s != NULL; s = strstr(s + 1, want))
        if (s[strlen(want)] < '0' || s[strlen(want)] > '9')
            return true;
    return false;
}

START_TEST(test_worker_killed)
{
    enum { HB = 1500 };
    proc_t ps[4];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    static const char *const ps_extra[] = {"--heartbeat-timeout", "1500", NULL};
    bool up = start_ps(&ps[0], 3, ps_extra, NULL, ep, sizeof ep, 6);
    char rank[3][8];
    for (int r = 0; up && r < 3; r++) {
        snprintf(rank[r], sizeof rank[r], "%d", r);
        const char *argv[] = {WK_BIN,      "--rank",
                              rank[r],     "--world-size",
                              "3",         "--coordinator",
                              ep,          "--mode",
                              "drill",     "--size",
                              "2M",        "--steps",
                              "100000000", "--timeout",
                              "30000",     "--rendezvous-timeout",
                              "20000",     NULL};
        proc_start(&ps[1 + r], WK_BIN, argv, NULL);
    }
    bool running = up && proc_wait_text(ps, 4, 1, 0, "verified", 3, fl_deadline_in(30000));
    int64_t killed = fl_now_ms();
    if (running)
        kill(ps[3].pid, SIGKILL);
    bool all = running && procs_wait(ps, 4, fl_deadline_in(HB + 15000));
    procs_stop(ps, 4);
    char info[8192];
    show(ps, 4, info, sizeof info);
    ck_assert_msg(running, "the job never got going: %s", info);
    ck_assert_msg(all, "processes still running %d ms after the kill: %s", HB + 15000, info);
    ck_assert_msg(proc_code(&ps[3]) == 128 + SIGKILL, "%s", info);
    ck_assert_msg(proc_code(&ps[0]) == 1, "flodl-ps should exit 1: %s", info);
    ck_assert_msg(names_rank(ps[0].buf[1], 2) && strstr(ps[0].buf[1], "dead") != NULL,
                  "flodl-ps should name the dead rank 2: %s", info);
    for (int r = 0; r < 2; r++) {
        if (proc_code(&ps[1 + r]) != 1 || !names_rank(ps[1 + r].buf[1], 2))
            ck_abort_msg("worker %d should exit 1 naming rank 2: %s", r, info);
        if (ps[1 + r].end_ms - killed > HB + 5000)
            ck_abort_msg("worker %d took %lld ms after the kill to exit: %s", r,
                         (long long)(ps[1 + r].end_ms - killed), info);
    }
    procs_free(ps, 4);
}
END_TEST

START_TEST(test_ps_sigterm_in_rendezvous)
{
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    static const char *const ps_extra[] = {"--log-level", "info", NULL};
    bool up = start_ps(&ps[0], 3, ps_extra, NULL, ep, sizeof ep, 7);
    char rank[2][8];
    for (int r = 0; up && r < 2; r++) {
        snprintf(rank[r], sizeof rank[r], "%d", r);
        const char *argv[] = {WK_BIN,  "--rank",
                              rank[r], "--world-size",
                              "3",     "--coordinator",
                              ep,      "--mode",
                              "drill", "--size",
                              "4K",    "--steps",
                              "1",     "--rendezvous-timeout",
                              "60000", NULL};
        proc_start(&ps[1 + r], WK_BIN, argv, NULL);
    }
    bool waiting = up && proc_wait_text(ps, 3, 0, 1, "registered from", 2, fl_deadline_in(20000));
    int64_t sent = fl_now_ms();
    if (waiting)
        kill(ps[0].pid, SIGTERM);
    bool all = waiting && procs_wait(ps, 3, fl_deadline_in(15000));
    procs_stop(ps, 3);
    char info[8192];
    show(ps, 3, info, sizeof info);
    ck_assert_msg(waiting, "the two workers never registered: %s", info);
    ck_assert_msg(all, "processes still running 15 s after SIGTERM: %s", info);
    ck_assert_msg(proc_code(&ps[0]) == 1 && strstr(ps[0].buf[1], "stopped by signal") != NULL,
                  "flodl-ps should exit 1, stopped by signal: %s", info);
    for (int r = 0; r < 2; r++) {
        const char *err = ps[1 + r].buf[1];
        int code = proc_code(&ps[1 + r]);
        if (code == 0 || code > 128 ||
            (strstr(err, "shutting down") == NULL && strstr(err, "silent") == NULL))
            ck_abort_msg("worker %d should fail saying the coordinator is shutting down or "
                         "silent: %s",
                         r, info);
        if (ps[1 + r].end_ms - sent > 5000)
            ck_abort_msg("worker %d took %lld ms after SIGTERM to exit: %s", r,
                         (long long)(ps[1 + r].end_ms - sent), info);
    }
    procs_free(ps, 3);
}
END_TEST

Suite *cli_suite(void);
Suite *cli_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *t = tcase_create("flags");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_ps_bad_flags);
    tcase_add_test(t, test_worker_bad_flags);
    tcase_add_test(t, test_help);
    tcase_add_test(t, test_keygen_unmakeable_dir);
    tcase_add_test(t, test_version);
    tcase_add_test(t, test_waiting_worker_says_so);
    suite_add_tcase(s, t);
    t = tcase_create("jobs");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_end_to_end);
    tcase_add_test(t, test_drill_anonymous_memory);
    tcase_add_test(t, test_env_flodl);
    tcase_add_test(t, test_env_torchrun);
    tcase_add_test(t, test_env_job_index);
    tcase_add_test(t, test_job_id_with_percent);
    tcase_add_test(t, test_hostile_job_id);
    suite_add_tcase(s, t);
    t = tcase_create("failures");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_worker_killed);
    tcase_add_test(t, test_ps_sigterm_in_rendezvous);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cli_suite());
}
