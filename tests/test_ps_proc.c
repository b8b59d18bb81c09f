/* flodl-ps and flodl-worker --mode ps as real processes on 127.0.0.1: a job trained through
 * the parameter server; shards split over two flodl-ps processes; flodl-ps killed with
 * SIGKILL mid-training and restarted with --resume on the same port, the workers rejoining and
 * finishing from the last checkpoint (losing at most the steps since it); and every new flag
 * refused with one line when wrong. Every child is killed and reaped by PID on every path. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testproc.h"
#include "testutil.h"

#define PS_BIN FLODL_BIN_DIR "/server/flodl-ps"
#define WK_BIN FLODL_BIN_DIR "/worker/flodl-worker"

#define ASSERT_HAS(text, needle)                                                                   \
    ck_assert_msg(strstr((text), (needle)) != NULL, "\"%s\" does not mention \"%s\"", (text),      \
                  (needle))

static void start_worker(proc_t *p, const char *ep, int rank, int world, const char *epochs,
                         const char *const *more)
{
    char r[16], w[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(w, sizeof w, "%d", world);
    const char *argv[MAX_ARGS] = {WK_BIN,  "--mode",       "ps",        "--rank",
                                  r,       "--world-size", w,           "--coordinator",
                                  ep,      "--host",       "127.0.0.1", "--epochs",
                                  epochs,  "--progress",   "1000",      "--rendezvous-timeout",
                                  "30000", "--timeout",    "30000"};
    size_t a = 19;
    for (size_t i = 0; more != NULL && more[i] != NULL && a + 1 < MAX_ARGS; i++)
        argv[a++] = more[i];
    argv[a] = NULL;
    proc_start(p, WK_BIN, argv, NULL);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Writes an --init file for the worker's default model (64,256,128,10): zeros in PyTorch's
 * names and shapes, except value nan_at of tensor nan_tensor (-1: none) set to NaN, and layer
 * 0's weight declared [in, out] instead of [out, in] when transposed. */
static void write_init(const char *path, int nan_tensor, size_t nan_at, bool transposed)
{
    static const uint64_t sizes[] = {64, 256, 128, 10};
    fl_st_tensor_t t[6];
    char names[6][32];
    float *data[6];
    for (int l = 0; l < 3; l++) {
        uint64_t in = sizes[l], out = sizes[l + 1];
        snprintf(names[2 * l], sizeof names[0], "layers.%d.weight", l);
        snprintf(names[2 * l + 1], sizeof names[0], "layers.%d.bias", l);
        data[2 * l] = calloc(in * out, sizeof(float));
        data[2 * l + 1] = calloc(out, sizeof(float));
        ck_assert(data[2 * l] != NULL && data[2 * l + 1] != NULL);
        bool tr = transposed && l == 0;
        t[2 * l] = (fl_st_tensor_t){names[2 * l],
                                    FL_FLOAT32,
                                    2,
                                    {tr ? in : out, tr ? out : in},
                                    data[2 * l],
                                    in * out * sizeof(float)};
        t[2 * l + 1] = (fl_st_tensor_t){names[2 * l + 1], FL_FLOAT32,         1, {out},
                                        data[2 * l + 1],  out * sizeof(float)};
    }
    if (nan_tensor >= 0)
        data[nan_tensor][nan_at] = NAN;
    ck_assert_msg(fl_st_write(path, t, 6, NULL, 0) == FL_OK, "%s", fl_last_error());
    for (int i = 0; i < 6; i++)
        free(data[i]);
}

/* The test accuracy rank 0 printed at the end, or -1. */
static double final_accuracy(const proc_t *p)
{
    const char *s = strstr(p->buf[0], "rank 0 summary:");
    const char *a = s ? strstr(s, "test accuracy ") : NULL;
    return a ? atof(a + strlen("test accuracy ")) : -1.0;
}

START_TEST(test_train_through_the_ps)
{
    proc_t ps[3];
    memset(ps, 0, sizeof ps);
    char ep[FL_ENDPOINT_MAX], out[8192];
    static const char *const extra[] = {"--shards",      "2",    "--host",      "127.0.0.1",
                                        "--lr",          "0.05", "--momentum",  "0.9",
                                        "--consistency", "ssp",  "--staleness", "2",
                                        "--held-max",    "1M",   NULL};
    ck_assert(start_ps(&ps[0], 2, extra, NULL, ep, sizeof ep, 1));
    start_worker(&ps[1], ep, 0, 2, "1", NULL);
    static const char *const topk[] = {"--topk", "0.05", NULL};
    start_worker(&ps[2], ep, 1, 2, "1", topk);
    bool done = procs_wait(ps, 3, fl_deadline_in(120000));
    procs_stop(ps, 3);
    show(ps, 3, out, sizeof out);
    ck_assert_msg(done, "did not finish:%s", out);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(proc_code(&ps[i]) == 0, "process %d:%s", i, out);
    ASSERT_HAS(ps[1].buf[0], "parameter server (2 shards, ssp)");
    /* A bound below what the pushes need (2 ranks x 2 shards of 25,413 parameters) is raised to
     * it, or the job's own pushes would be cut. */
    ASSERT_HAS(ps[0].buf[1], "raised from 1 to 2 MiB: twice 2 ranks' pushes to shards 0..1");
    double acc = final_accuracy(&ps[1]);
    ck_assert_msg(acc > 80.0, "accuracy %.2f%% after one epoch:%s", acc, out);
    procs_free(ps, 3);
}
END_TEST

/* Two flodl-ps processes: the coordinator serving shard 0, another serving shard 1. */
START_TEST(test_shards_over_two_processes)
{
    proc_t ps[4];
    memset(ps, 0, sizeof ps);
    char ep[FL_ENDPOINT_MAX], out[8192];
    static const char *const first[] = {"--num-shards", "2",         "--shards", "1",
                                        "--host",       "127.0.0.1", "--lr",     "0.05",
                                        "--momentum",   "0.9",       NULL};
    ck_assert(start_ps(&ps[0], 2, first, NULL, ep, sizeof ep, 2));
    const char *second[] = {
        PS_BIN,   "--coordinator", ep,     "--num-shards", "2",          "--shard-index", "1",
        "--host", "127.0.0.1",     "--lr", "0.05",         "--momentum", "0.9",           NULL};
    proc_start(&ps[1], PS_BIN, second, NULL);
    start_worker(&ps[2], ep, 0, 2, "1", NULL);
    start_worker(&ps[3], ep, 1, 2, "1", NULL);
    bool done = procs_wait(ps, 4, fl_deadline_in(120000));
    procs_stop(ps, 4);
    show(ps, 4, out, sizeof out);
    ck_assert_msg(done, "did not finish:%s", out);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(proc_code(&ps[i]) == 0, "process %d:%s", i, out);
    ASSERT_HAS(ps[1].buf[1], "shard 1: parameters");
    ck_assert_msg(final_accuracy(&ps[2]) > 80.0, "%s", out);
    procs_free(ps, 4);
}
END_TEST

/* The step a worker says it went on from after the restart, or -1. */
static long resumed_step(const proc_t *p)
{
    const char *s = strstr(p->buf[0], "going on from step ");
    return s ? atol(s + strlen("going on from step ")) : -1;
}

/* flodl-ps killed and restarted under workers with `more` flags. */
static void kill_and_resume(const char *const *slow)
{
    char dir[] = "/tmp/flodl-ps-kill-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    int port = free_port();
    char bind[64], ep[64], out[12000];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", port);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    const char *ps_argv[] = {PS_BIN,      "--bind",
                             bind,        "--world-size",
                             "2",         "--shards",
                             "2",         "--host",
                             "127.0.0.1", "--checkpoint-dir",
                             dir,         "--checkpoint-every",
                             "100",       "--heartbeat-timeout",
                             "1000",      "--lr",
                             "0.05",      "--momentum",
                             "0.9",       "--resume",
                             NULL};
    proc_t p[3];
    memset(p, 0, sizeof p);
    proc_start(&p[0], PS_BIN, ps_argv, NULL);
    start_worker(&p[1], ep, 0, 2, "3", slow);
    start_worker(&p[2], ep, 1, 2, "3", slow);
    /* Once a checkpoint past step 200 is on disk, kill the parameter server outright. */
    bool ckpt =
        proc_wait_text(p, 3, 0, 1, "checkpoint of step 300 written", 2, fl_deadline_in(60000));
    show(p, 3, out, sizeof out);
    if (!ckpt) {
        procs_stop(p, 3);
        remove_tree(dir);
        ck_abort_msg("no checkpoint before the kill:%s", out);
    }
    kill(p[0].pid, SIGKILL);
    procs_wait(p, 1, fl_deadline_in(5000));
    ck_assert_int_eq(proc_code(&p[0]), 128 + SIGKILL);
    procs_free(p, 1);
    /* The same command line again: --resume finds the checkpoints. */
    proc_start(&p[0], PS_BIN, ps_argv, NULL);
    bool done = procs_wait(p, 3, fl_deadline_in(120000));
    procs_stop(p, 3);
    show(p, 3, out, sizeof out);
    remove_tree(dir);
    ck_assert_msg(done, "did not finish after the restart:%s", out);
    for (int i = 0; i < 3; i++)
        ck_assert_msg(proc_code(&p[i]) == 0, "process %d:%s", i, out);
    ASSERT_HAS(p[0].buf[1], "resumed from");
    long s1 = resumed_step(&p[1]), s2 = resumed_step(&p[2]);
    /* Both went on from the same checkpoint, a multiple of 100 at or after step 300: at most
     * the steps since it were lost. */
    ck_assert_msg(s1 == s2 && s1 >= 300 && s1 % 100 == 0, "resumed at %ld and %ld:%s", s1, s2, out);
    ck_assert_msg(final_accuracy(&p[1]) > 85.0, "%s", out);
    procs_free(p, 3);
}

START_TEST(test_kill_and_resume)
{
    static const char *const slow[] = {"--reconnect-timeout", "60000", NULL};
    kill_and_resume(slow);
}
END_TEST

/* The same with 2 devices per host, a client per device (the same global batch): the devices'
 * clients stop when the parameter server is lost, the host rejoins the restarted one and
 * splits again. */
START_TEST(test_kill_and_resume_device_clients)
{
    static const char *const slow[] = {
        "--reconnect-timeout", "60000", "--cpu-replicas", "2", "--batch-size", "32", NULL};
    kill_and_resume(slow);
}
END_TEST

/* 2 hosts x 2 CPU replicas, a client per device: the host killed mid-run fails the job, and
 * the other host's devices, waiting on their own connections, stop with an error naming it
 * (not the deadline of a pull). */
START_TEST(test_device_clients_host_killed)
{
    proc_t p[3];
    memset(p, 0, sizeof p);
    char ep[FL_ENDPOINT_MAX], out[12000];
    static const char *const extra[] = {
        "--shards", "2", "--host", "127.0.0.1", "--heartbeat-timeout", "1000", NULL};
    ck_assert(start_ps(&p[0], 2, extra, NULL, ep, sizeof ep, 1));
    static const char *const dev[] = {
        "--cpu-replicas", "2", "--batch-size", "16", "--progress", "0.2", NULL};
    start_worker(&p[1], ep, 0, 2, "50", dev);
    start_worker(&p[2], ep, 1, 2, "50", dev);
    bool going = proc_wait_text(p, 3, 1, 0, "push+pull", 1, fl_deadline_in(60000));
    show(p, 3, out, sizeof out);
    if (!going) {
        procs_stop(p, 3);
        ck_abort_msg("the job did not start training:%s", out);
    }
    ASSERT_HAS(p[1].buf[0], "a client per device");
    kill(p[2].pid, SIGKILL);
    bool ended = procs_wait(p, 2, fl_deadline_in(60000));
    procs_stop(p, 3);
    show(p, 3, out, sizeof out);
    ck_assert_msg(ended, "rank 0 and flodl-ps did not stop after rank 1 was killed:%s", out);
    ck_assert_msg(proc_code(&p[1]) != 0, "rank 0 exited 0 without its peer:%s", out);
    ASSERT_HAS(p[1].buf[1], "rank 1");
    ck_assert_msg(strstr(p[1].buf[1], "not ready after") == NULL,
                  "rank 0 waited for a pull's deadline instead of hearing rank 1 died:%s", out);
    procs_free(p, 3);
}
END_TEST

/* flodl-ps --init with a NaN is refused at start with one line naming the tensor and the
 * index, before the coordinator binds (no endpoint file is written); a worker pointed at it
 * gives up after its --rendezvous-timeout. It was found only after the rendezvous, and the
 * workers then waited up to --reconnect-timeout (10 minutes) for a parameter-server restart. */
START_TEST(test_init_with_nan_refused_at_start)
{
    char dir[] = "/tmp/flodl-ps-nan-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char init[128], epf[128], bind[64], out[12000];
    snprintf(init, sizeof init, "%s/init.safetensors", dir);
    snprintf(epf, sizeof epf, "%s/ep", dir);
    write_init(init, 3, 7, false); /* layers.1.bias[7] */
    int port = free_port();
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", port);
    const char *ps_argv[] = {PS_BIN,      "--bind",
                             bind,        "--world-size",
                             "1",         "--shards",
                             "1",         "--host",
                             "127.0.0.1", "--init",
                             init,        "--endpoint-file",
                             epf,         "--rendezvous-timeout",
                             "20000",     NULL};
    proc_t p[2];
    memset(p, 0, sizeof p);
    proc_start(&p[0], PS_BIN, ps_argv, NULL);
    static const char *const quick[] = {"--rendezvous-timeout", "3000", NULL};
    start_worker(&p[1], bind, 0, 1, "1", quick);
    bool done = procs_wait(p, 2, fl_deadline_in(30000));
    procs_stop(p, 2);
    show(p, 2, out, sizeof out);
    bool bound = access(epf, F_OK) == 0;
    remove_tree(dir);
    ck_assert_msg(done, "still running after 30 s:%s", out);
    ck_assert_msg(proc_code(&p[0]) == 2, "flodl-ps:%s", out);
    ck_assert_msg(count_of(p[0].buf[1], "\n") == 1 && p[0].len[0] == 0, "not one line:%s", out);
    ASSERT_HAS(p[0].buf[1], "init.safetensors: tensor 'layers.1.bias' holds NaN at index 7");
    ck_assert_msg(!bound, "the coordinator bound before the refusal:%s", out);
    ck_assert_msg(proc_code(&p[1]) != 0, "the worker:%s", out);
    ASSERT_HAS(p[1].buf[1], "no answer from the coordinator");
    procs_free(p, 2);
}
END_TEST

/* flodl-ps --init with layer 0's weight declared [64,256] instead of [256,64] (the same
 * parameter count, so it once trained) fails the rendezvous: the worker and flodl-ps
 * both exit 2 with the line naming the tensor, both shapes and the file. */
START_TEST(test_init_of_another_shape_refused)
{
    char dir[] = "/tmp/flodl-ps-shape-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char init[128], ep[FL_ENDPOINT_MAX], out[12000];
    snprintf(init, sizeof init, "%s/init.safetensors", dir);
    write_init(init, -1, 0, true);
    const char *extra[] = {"--shards", "1", "--host", "127.0.0.1", "--init", init, NULL};
    proc_t p[2];
    memset(p, 0, sizeof p);
    bool up = start_ps(&p[0], 1, extra, NULL, ep, sizeof ep, 5);
    if (up)
        start_worker(&p[1], ep, 0, 1, "1", NULL);
    bool done = up && procs_wait(p, 2, fl_deadline_in(60000));
    procs_stop(p, 2);
    show(p, 2, out, sizeof out);
    remove_tree(dir);
    ck_assert_msg(done, "did not end:%s", out);
    static const char *const want[] = {"different models: tensor 'layers.0.weight' is [256,64] "
                                       "on rank 0",
                                       "[64,256] in ",
                                       "init.safetensors (the --init file of "
                                       "the parameter server",
                                       NULL};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(proc_code(&p[i]) == 2, "process %d:%s", i, out);
        for (int k = 0; want[k] != NULL; k++)
            ASSERT_HAS(p[i].buf[1], want[k]);
    }
    ASSERT_HAS(p[0].buf[1], "flodl-ps: job failed: job 'flodl' cannot start: different models");
    procs_free(p, 2);
}
END_TEST

START_TEST(test_ps_flags_refused)
{
    static const bad_case_t cases[] = {
        {{"--world-size", "2", "--shards", "1", "--consistency", "eventual", NULL},
         {NULL},
         {"--consistency", "'eventual'", NULL}},
        {{"--world-size", "2", "--shards", "1", "--staleness", "2", NULL},
         {NULL},
         {"--staleness", "ssp", NULL}},
        {{"--coordinator", "tcp://127.0.0.1:1", NULL}, {NULL}, {"--num-shards", NULL}},
        {{"--world-size", "2", "--shards", "3", "--num-shards", "2", NULL},
         {NULL},
         {"--num-shards 2", NULL}},
        {{"--world-size", "2", "--shards", "1", "--checkpoint-every", "0", NULL},
         {NULL},
         {"--checkpoint-every", NULL}},
        {{"--world-size", "2", "--shards", "1", "--checkpoint-every", "5x", NULL},
         {NULL},
         {"--checkpoint-every", "'5x'", NULL}},
        {{"--world-size", "2", "--shards", "1", "--resume", NULL},
         {NULL},
         {"--checkpoint-dir", NULL}},
        {{"--world-size", "2", "--shards", "1", "--lr", "-1", NULL}, {NULL}, {"--lr", NULL}},
        {{"--world-size", "2", "--shards", "1", "--lr-schedule", "step", NULL},
         {NULL},
         {"--lr-step-size", NULL}},
        {{"--world-size", "2", "--shards", "1", "--optimizer", "adam", "--momentum", "0.9", NULL},
         {NULL},
         {"--momentum", "adam", NULL}},
        {{"--world-size", "2", "--consistency", "async", NULL}, {NULL}, {"--shards", NULL}},
        {{"--world-size", "2", "--shards", "1", "--init", "/nonexistent.safetensors", NULL},
         {NULL},
         {"/nonexistent.safetensors", NULL}},
        {{"--coordinator", "tcp://127.0.0.1:1", "--num-shards", "1", "--world-size", "2", NULL},
         {NULL},
         {"--world-size", "coordinator", NULL}},
    };
    check_bad(PS_BIN, cases, sizeof cases / sizeof cases[0]);
    static const bad_case_t wk[] = {
        {{"--mode", "ps", "--rank", "0", "--world-size", "2", "--coordinator", "tcp://127.0.0.1:1",
          "--lr", "0.1", NULL},
         {NULL},
         {"--lr", "flodl-ps", NULL}},
        {{"--mode", "ring", "--rank", "0", "--world-size", "2", "--coordinator",
          "tcp://127.0.0.1:1", "--lz4", NULL},
         {NULL},
         {"--lz4", "--mode ps", NULL}},
    };
    check_bad(WK_BIN, wk, sizeof wk / sizeof wk[0]);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ps_proc");
    TCase *t = tcase_create("processes");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, test_train_through_the_ps);
    tcase_add_test(t, test_shards_over_two_processes);
    tcase_add_test(t, test_kill_and_resume);
    tcase_add_test(t, test_device_clients_host_killed);
    tcase_add_test(t, test_kill_and_resume_device_clients);
    tcase_add_test(t, test_ps_flags_refused);
    tcase_add_test(t, test_init_with_nan_refused_at_start);
    tcase_add_test(t, test_init_of_another_shape_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
