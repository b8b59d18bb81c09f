/* A rank that stops on an error of its own ends the whole job at once, with the real binaries:
 * it says why in its goodbye, the coordinator passes that on to every other rank (each exits
 * 1 within seconds, naming the failed rank, instead of waiting out its 300 s collective
 * deadline and blaming another), and flodl-ps exits 1 with a line saying how each rank ended.
 * Also: a job whose ranks all finish still ends with exit 0 and every rank "done". */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testproc.h"
#include "testutil.h"

#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"
#define W 4

/* A CSV of n samples with 4 features whose labels cycle through `classes`. */
static void write_csv(const char *path, int n, int classes)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        int y = i % classes;
        fprintf(f, "%d,%g,%g,%g,%g\n", y, y == 0 ? 1.0 : -0.5, y == 1 ? 1.0 : -0.5,
                y == 2 ? 1.0 : -0.5, 0.01 * (i % 7));
    }
    ck_assert_int_eq(fclose(f), 0);
}

/* Starts flodl-ps and W workers, worker r with its own extra flags (NULL-terminated). The
 * flags are not const char *const: before C2x, ISO C does not convert a pointer to an array
 * into one whose elements are more qualified, and the callers fill their arrays. */
static bool start_job(proc_t *ps, const char *extra[W][10], int n)
{
    char ep[256] = "";
    static const char *const ps_extra[] = {"--heartbeat-timeout", "5000", NULL};
    if (!start_ps(&ps[0], W, ps_extra, NULL, ep, sizeof ep, n))
        return false;
    static char rank[W][8];
    for (int r = 0; r < W; r++) {
        snprintf(rank[r], sizeof rank[r], "%d", r);
        const char *argv[24] = {WK_BIN,          "--rank", rank[r],   "--world-size", "4",
                                "--coordinator", ep,       "--quiet", "--timeout",    "300000"};
        int a = 10;
        for (int e = 0; e < 10 && extra[r][e] != NULL && a < 23; e++)
            argv[a++] = extra[r][e];
        argv[a] = NULL;
        proc_start(&ps[1 + r], WK_BIN, argv, NULL);
    }
    return true;
}

/* Every process ended; the failing one first, the others within `within_ms` of it, each
 * exiting non-zero and naming a rank that failed (or, alt when not NULL, having met the fault
 * itself); flodl-ps exit 1 with its outcome line. */
static void expect_job_failed(proc_t *ps, int culprit, int within_ms, const char *alt)
{
    bool all = procs_wait(ps, 1 + W, fl_deadline_in(60000));
    procs_stop(ps, 1 + W);
    char info[16384];
    show(ps, 1 + W, info, sizeof info);
    ck_assert_msg(all,
                  "processes still running a minute on (the others waited for the failed "
                  "rank): %s",
                  info);
    int64_t first = ps[1 + culprit].end_ms;
    for (int r = 0; r < W; r++) {
        int code = proc_code(&ps[1 + r]);
        ck_assert_msg(code == 1 || code == 2, "worker %d exited %d: %s", r, code, info);
        ck_assert_msg(ps[1 + r].end_ms - first <= within_ms,
                      "worker %d ended %lld ms after the failing rank %d (bound %d ms): %s", r,
                      (long long)(ps[1 + r].end_ms - first), culprit, within_ms, info);
        const char *e = ps[1 + r].buf[1];
        if (r != culprit)
            ck_assert_msg(strstr(e, "failed") != NULL || (alt != NULL && strstr(e, alt) != NULL),
                          "worker %d does not say a rank failed: %s", r, info);
    }
    const char *err = ps[0].buf[1];
    ck_assert_msg(proc_code(&ps[0]) == 1, "flodl-ps should exit 1: %s", info);
    ck_assert_msg(strstr(err, "flodl-ps: outcome: ") != NULL && strstr(err, " failed: ") != NULL,
                  "flodl-ps prints no outcome line naming the failure: %s", info);
    ck_assert_msg(strstr(err, "job failed") != NULL, "%s", info);
}

/* Rank 2's --init file cannot be read (a per-rank path, so not a setting the ranks must
 * share): it stops right after the rendezvous, before any collective, while the others wait
 * for it in their first allreduce. */
START_TEST(test_own_error_before_any_collective)
{
    char dir[] = "/tmp/flodl-failproc-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char good[128];
    char missing[160];
    snprintf(good, sizeof good, "%s/good.csv", dir);
    snprintf(missing, sizeof missing, "%s/no-such-init.safetensors", dir);
    write_csv(good, 400, 3);
    const char *extra[W][10];
    for (int r = 0; r < W; r++) {
        const char *e[10] = {
            "--train-csv", good, "--layers", "4,8,3", "--epochs", "50", r == 2 ? "--init" : NULL,
            missing};
        memcpy(extra[r], e, sizeof e);
    }
    proc_t ps[1 + W];
    memset(ps, 0, sizeof ps);
    ck_assert(start_job(ps, extra, 21));
    expect_job_failed(ps, 2, 3000, NULL);
    ck_assert_msg(strstr(ps[0].buf[1], "rank 2 failed") != NULL, "%s", ps[0].buf[1]);
    ck_assert_msg(strstr(ps[0].buf[1], "no-such-init") != NULL, "the reason is lost: %s",
                  ps[0].buf[1]);
    for (int r = 0; r < W; r++)
        if (r != 2)
            ck_assert_msg(strstr(ps[1 + r].buf[1], "rank 2") != NULL,
                          "worker %d does not name rank 2: %s", r, ps[1 + r].buf[1]);
    procs_free(ps, 1 + W);
    unlink(good);
    rmdir(dir);
}
END_TEST

/* Rank 2 cannot make its --checkpoint directory (a file stands where it should be) at the end
 * of epoch 1: every rank hears so in the same agreement and leaves at once, so the goodbyes
 * race to the coordinator. Only rank 2's says its own error: flodl-ps and every other rank
 * name rank 2 and its reason, in each of 2 runs (before the fix, whichever goodbye came first
 * was blamed: 3 of 4 runs named an innocent rank). */
START_TEST(test_own_error_mid_job_names_the_culprit)
{
    char dir[] = "/tmp/flodl-failproc-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char good[128];
    char ckpt[128];
    char blocked[160];
    snprintf(good, sizeof good, "%s/good.csv", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    snprintf(blocked, sizeof blocked, "%s/good.csv/ckpt", dir);
    write_csv(good, 400, 3);
    for (int run = 0; run < 2; run++) {
        const char *extra[W][10];
        for (int r = 0; r < W; r++) {
            const char *e[10] = {"--train-csv", good, "--layers",     "4,8,3",
                                 "--epochs",    "2",  "--checkpoint", r == 2 ? blocked : ckpt};
            memcpy(extra[r], e, sizeof e);
        }
        proc_t ps[1 + W];
        memset(ps, 0, sizeof ps);
        ck_assert(start_job(ps, extra, 25));
        expect_job_failed(ps, 2, 3000, NULL);
        ck_assert_msg(strstr(ps[0].buf[1], "rank 2 failed: --checkpoint: cannot make") != NULL,
                      "run %d: flodl-ps does not blame rank 2: %s", run, ps[0].buf[1]);
        for (int r = 0; r < W; r++)
            if (r != 2)
                ck_assert_msg(strstr(ps[1 + r].buf[1], "rank 2 (host") != NULL &&
                                  strstr(ps[1 + r].buf[1], "good.csv/ckpt") != NULL,
                              "run %d: worker %d does not name rank 2 and its reason: %s", run, r,
                              ps[1 + r].buf[1]);
        procs_free(ps, 1 + W);
    }
    unlink(good);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Settings that must agree, given differently to one rank (the cases: --lr trained
 * silently into diverged replicas, --topk failed at the first collective, --batch-size at step
 * 235): the job is refused at the rendezvous (test_coord: in under a second), every process
 * ends within seconds of the first, a rank that registers after the refusal included, and
 * each names the setting and both values in words. */
START_TEST(test_settings_disagree_at_rendezvous)
{
    static const struct {
        const char *flag, *value, *name, *mine, *theirs;
    } cases[] = {
        {"--lr", "0.1", "lr", "'0.1'", "'0.05'"},
        {"--batch-size", "32", "batch-size", "'32 per device'", "'64 per device'"},
        {"--topk", "0.01", "topk", "'0.01'", "'0'"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *extra[W][10];
        for (int r = 0; r < W; r++) {
            const char *e[10] = {"--epochs", "1", r == 3 ? cases[c].flag : NULL, cases[c].value,
                                 NULL};
            memcpy(extra[r], e, sizeof e);
        }
        proc_t ps[1 + W];
        memset(ps, 0, sizeof ps);
        ck_assert(start_job(ps, extra, 22 + (int)c));
        bool all = procs_wait(ps, 1 + W, fl_deadline_in(60000));
        procs_stop(ps, 1 + W);
        char info[16384];
        show(ps, 1 + W, info, sizeof info);
        ck_assert_msg(all, "%s: processes still running a minute on: %s", cases[c].flag, info);
        int64_t first = ps[0].end_ms;
        for (int p = 1; p <= W; p++)
            first = ps[p].end_ms < first ? ps[p].end_ms : first;
        for (int p = 0; p <= W; p++) {
            ck_assert_msg(proc_code(&ps[p]) == 2, "%s: process %d exited %d: %s", cases[c].flag, p,
                          proc_code(&ps[p]), info);
            ck_assert_msg(ps[p].end_ms - first <= 5000,
                          "%s: process %d ended %lld ms after the "
                          "first: %s",
                          cases[c].flag, p, (long long)(ps[p].end_ms - first), info);
            const char *e = ps[p].buf[1];
            char on[64];
            snprintf(on, sizeof on, "disagree on %s:", cases[c].name);
            ck_assert_msg(strstr(e, on) != NULL && strstr(e, cases[c].mine) != NULL &&
                              strstr(e, cases[c].theirs) != NULL,
                          "%s: process %d does not name the setting and both values: %s",
                          cases[c].flag, p, info);
        }
        ck_assert_msg(strstr(ps[0].buf[1], "refused: ") != NULL, "%s: no outcome: %s",
                      cases[c].flag, info);
        procs_free(ps, 1 + W);
    }
}
END_TEST

/* A rank frozen past the heartbeat timeout (SIGSTOP here; a paused VM or a swapped-out host
 * alike) is declared dead and the job fails without it. On waking it must say so and exit 1,
 * in ring and parameter-server modes alike, instead of registering again for up to its
 * reconnect timeout with a coordinator whose job is over. */
static void frozen_case(bool ps_mode, int n)
{
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[256] = "";
    const char *ps_extra[] = {"--heartbeat-timeout",       "2000", "--log-level", "info",
                              ps_mode ? "--shards" : NULL, "1",    NULL};
    ck_assert(start_ps(&ps[0], 2, ps_extra, NULL, ep, sizeof ep, n));
    for (int r = 0; r < 2; r++) {
        const char *argv[16] = {
            WK_BIN, "--rank",  r ? "1" : "0", "--world-size", "2",      "--coordinator",
            ep,     "--quiet", "--epochs",    "1000",         "--mode", ps_mode ? "ps" : "ring",
            NULL};
        proc_start(&ps[1 + r], WK_BIN, argv, NULL);
    }
    char info[16384];
    bool running = proc_wait_text(ps, 3, 0, 1, "job 'flodl' running", 1, fl_deadline_in(30000));
    usleep(300 * 1000); /* a few steps in */
    show(ps, 3, info, sizeof info);
    ck_assert_msg(running, "the job did not start: %s", info);
    ck_assert_int_eq(kill(ps[2].pid, SIGSTOP), 0);
    /* flodl-ps declares it dead, fails the job and exits; rank 0 exits. */
    bool others = procs_wait(ps, 2, fl_deadline_in(20000));
    ck_assert_int_eq(kill(ps[2].pid, SIGCONT), 0);
    int64_t woke = fl_now_ms();
    bool all = procs_wait(ps, 3, fl_deadline_in(15000));
    procs_stop(ps, 3);
    show(ps, 3, info, sizeof info);
    ck_assert_msg(others, "flodl-ps and rank 0 did not end while rank 1 was frozen: %s", info);
    ck_assert_msg(all, "rank 1 still running 15 s after it woke: %s", info);
    ck_assert_msg(ps[2].end_ms - woke < 8000, "rank 1 took %lld ms to exit after waking: %s",
                  (long long)(ps[2].end_ms - woke), info);
    ck_assert_msg(proc_code(&ps[2]) == 1, "rank 1 exited %d: %s", proc_code(&ps[2]), info);
    ck_assert_msg(strstr(ps[2].buf[1], "declared dead by the coordinator") != NULL,
                  "rank 1 does not say it was declared dead: %s", info);
    ck_assert_msg(strstr(ps[2].buf[1], "registering again") == NULL,
                  "rank 1 tried to register again: %s", info);
    procs_free(ps, 3);
}

START_TEST(test_frozen_rank_wakes_and_exits_ring)
{
    frozen_case(false, 27);
}
END_TEST

START_TEST(test_frozen_rank_wakes_and_exits_ps)
{
    frozen_case(true, 28);
}
END_TEST

/* flodl-ps and W workers with 2 simulated GPUs each (model 4,8,3, batch 4, 50 epochs of a
 * 400-sample CSV written in dir, the job's good file): env for every worker, --timeout
 * timeout2 on rank 2 and timeout elsewhere, --overlap when asked. dir is a mkdtemp template. */
static void start_sim_job(proc_t *ps, char *dir, char *good, size_t cap, const char *const *env,
                          const char *timeout, const char *timeout2, bool overlap, int slot)
{
    ck_assert(mkdtemp(dir) != NULL);
    snprintf(good, cap, "%s/good.csv", dir);
    write_csv(good, 400, 3);
    char ep[256] = "";
    static const char *const ps_extra[] = {"--heartbeat-timeout", "5000", NULL};
    memset(ps, 0, sizeof *ps * (1 + W));
    ck_assert(start_ps(&ps[0], W, ps_extra, NULL, ep, sizeof ep, slot));
    char rank[W][8];
    for (int r = 0; r < W; r++) {
        snprintf(rank[r], sizeof rank[r], "%d", r);
        const char *argv[] = {WK_BIN,
                              "--rank",
                              rank[r],
                              "--world-size",
                              "4",
                              "--coordinator",
                              ep,
                              "--quiet",
                              "--timeout",
                              r == 2 ? timeout2 : timeout,
                              "--train-csv",
                              good,
                              "--layers",
                              "4,8,3",
                              "--batch-size",
                              "4",
                              "--epochs",
                              "50",
                              "--device",
                              "sim",
                              "--gpus",
                              "0,1",
                              overlap ? "--overlap" : NULL,
                              NULL};
        proc_start(&ps[1 + r], WK_BIN, argv, env);
    }
}

/* A device fault mid-step (the simulated GPU's FLODL_SIM_FAIL: rank 2's device 1 fails the
 * 41st run of an operation it runs twice a step, in step 21) stops every host in that step:
 * each exits non-zero within seconds naming the step, and the message names the host, the
 * device, the operation and the error, on the failing rank and, passed on, on the others. */
static void device_fault_case(const char *op, bool overlap)
{
    char dir[] = "/tmp/flodl-failproc-XXXXXX";
    char good[128];
    char fail[96];
    snprintf(fail, sizeof fail, "FLODL_SIM_FAIL=2:1:41:%s", op);
    const char *const env[] = {fail, NULL};
    proc_t ps[1 + W];
    start_sim_job(ps, dir, good, sizeof good, env, "300000", "300000", overlap, 24);
    expect_job_failed(ps, 2, 5000, NULL);
    const char *mine = ps[1 + 2].buf[1];
    const char *want[] = {"rank 2 (host 127.0.0.", "step 21:", "device sim:1", op,
                          "illegal memory access"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(mine, want[i]) != NULL, "rank 2 does not say '%s': %s", want[i], mine);
    for (int r = 0; r < W; r++) {
        const char *e = ps[1 + r].buf[1];
        ck_assert_msg(strstr(e, "step 21:") != NULL && strstr(e, "device sim:1") != NULL &&
                          strstr(e, op) != NULL && strstr(e, "rank 2 (host") != NULL,
                      "worker %d does not name the step, host, device and operation: %s", r, e);
    }
    procs_free(ps, 1 + W);
    unlink(good);
    rmdir(dir);
}

START_TEST(test_device_fault_stops_every_host_in_its_step)
{
    device_fault_case("GEMM (weight gradient)", false);
}
END_TEST

/* The same in the first leg inside the host, overlapped with the backward pass (--overlap:
 * each layer's reduce-scatter on the devices, whose sum kernel fails on device 1): the error
 * surfaces in an exchange thread's wait for the bucket, and still stops every host in step
 * 21 with the device and operation named. */
START_TEST(test_device_fault_in_the_overlapped_first_leg)
{
    device_fault_case("sum of rows", true);
}
END_TEST

/* A kernel that hangs in the overlapped first leg (FLODL_SIM_STALL_MS: rank 2's device 1 stalls
 * its 41st sum of rows, in step 21, for 15 s): rank 2's exchange gives up at its own deadline
 * (--timeout 2000 there, 30000 on the others, so their own waits cannot be what stops them),
 * names the layer and the deadline, and leaves the job at once; the others hear it from the
 * coordinator and exit within seconds, long before the stall ends. */
START_TEST(test_hung_kernel_in_the_overlapped_first_leg)
{
    char dir[] = "/tmp/flodl-failproc-XXXXXX";
    char good[128];
    static const char *const env[] = {"FLODL_SIM_FAIL=2:1:41:sum of rows",
                                      "FLODL_SIM_STALL_MS=15000", NULL};
    proc_t ps[1 + W];
    int64_t t0 = fl_now_ms();
    start_sim_job(ps, dir, good, sizeof good, env, "30000", "2000", true, 26);
    bool all = procs_wait(ps, 1 + W, fl_deadline_in(60000));
    procs_stop(ps, 1 + W);
    char info[16384];
    show(ps, 1 + W, info, sizeof info);
    ck_assert_msg(all, "processes still running a minute on: %s", info);
    for (int r = 0; r < W; r++) {
        const char *e = ps[1 + r].buf[1];
        ck_assert_msg(proc_code(&ps[1 + r]) == 1, "worker %d exited %d: %s", r,
                      proc_code(&ps[1 + r]), info);
        ck_assert_msg(strstr(e, "rank 2 (host") != NULL && strstr(e, "step 21:") != NULL &&
                          strstr(e, "the first leg inside the host") != NULL &&
                          strstr(e, "not done in 2000 ms") != NULL,
                      "worker %d does not name rank 2, the step, the leg and its deadline: %s", r,
                      e);
        /* The stall ends 15 s after step 21 began: the others must not have waited for it. */
        if (r != 2)
            ck_assert_msg(ps[1 + r].end_ms - t0 < 12000,
                          "worker %d ended %lld ms after the start (the stall takes 15 s): %s", r,
                          (long long)(ps[1 + r].end_ms - t0), info);
    }
    ck_assert_msg(strstr(ps[0].buf[1], "job failed") != NULL, "%s", info);
    procs_free(ps, 1 + W);
    unlink(good);
    rmdir(dir);
}
END_TEST

/* Nothing changes for a job that succeeds: exit 0 and every rank done. */
START_TEST(test_clean_job_outcome)
{
    const char *extra[W][10];
    for (int r = 0; r < W; r++) {
        const char *e[10] = {"--epochs", "1", NULL};
        memcpy(extra[r], e, sizeof e);
    }
    proc_t ps[1 + W];
    memset(ps, 0, sizeof ps);
    ck_assert(start_job(ps, extra, 23));
    bool all = procs_wait(ps, 1 + W, fl_deadline_in(90000));
    procs_stop(ps, 1 + W);
    char info[16384];
    show(ps, 1 + W, info, sizeof info);
    ck_assert_msg(all, "%s", info);
    for (int i = 0; i <= W; i++)
        ck_assert_msg(proc_code(&ps[i]) == 0, "process %d exited %d: %s", i, proc_code(&ps[i]),
                      info);
    ck_assert_msg(strstr(ps[0].buf[1], "outcome: rank 0 done; rank 1 done; rank 2 done; rank 3 "
                                       "done") != NULL,
                  "%s", info);
    procs_free(ps, 1 + W);
}
END_TEST

Suite *fail_proc_suite(void);
Suite *fail_proc_suite(void)
{
    Suite *s = suite_create("fail_proc");
    TCase *t = tcase_create("own error");
    tcase_set_timeout(t, 150);
    tcase_add_test(t, test_own_error_before_any_collective);
    tcase_add_test(t, test_own_error_mid_job_names_the_culprit);
    tcase_add_test(t, test_settings_disagree_at_rendezvous);
    tcase_add_test(t, test_frozen_rank_wakes_and_exits_ring);
    tcase_add_test(t, test_frozen_rank_wakes_and_exits_ps);
    tcase_add_test(t, test_device_fault_stops_every_host_in_its_step);
    tcase_add_test(t, test_device_fault_in_the_overlapped_first_leg);
    tcase_add_test(t, test_hung_kernel_in_the_overlapped_first_leg);
    tcase_add_test(t, test_clean_job_outcome);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(fail_proc_suite());
}
