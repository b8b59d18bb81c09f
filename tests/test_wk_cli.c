/* flodl-worker's training entry point as users meet it: a local run that learns (and writes
 * a checkpoint readable again with --init), and the configuration errors that must exit 2 with
 * one line saying what and where: layers that do not fit the data or the init file, a batch
 * larger than a rank's share, unknown flags, bad data files. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fl_dev.h"
#include "testutil.h"
#include "fl_wk.h"

#define WORKER FLODL_BIN_DIR "/worker/flodl-worker"

typedef struct run {
    int status; /* exit code, or -1 when killed */
    char out[16384];
    char err[4096];
} run_t;

/* Runs the worker with argv (NULL-terminated, without the program name), bounded in time. */
static void run(const char *const *args, int timeout_s, run_t *r)
{
    char outp[] = "/tmp/flodl-wkcli-out-XXXXXX";
    char errp[] = "/tmp/flodl-wkcli-err-XXXXXX";
    int fo = mkstemp(outp);
    int fe = mkstemp(errp);
    ck_assert(fo >= 0 && fe >= 0);
    const char *argv[64];
    int n = 0;
    argv[n++] = WORKER;
    for (int i = 0; args[i] != NULL && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fo, 1);
        dup2(fe, 2);
        alarm((unsigned)timeout_s); /* the child dies if it outlives the test's bound */
        execv(WORKER, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    memset(r->out, 0, sizeof r->out);
    memset(r->err, 0, sizeof r->err);
    lseek(fo, 0, SEEK_SET);
    lseek(fe, 0, SEEK_SET);
    ssize_t k = read(fo, r->out, sizeof r->out - 1);
    ssize_t e = read(fe, r->err, sizeof r->err - 1);
    (void)k;
    (void)e;
    close(fo);
    close(fe);
    unlink(outp);
    unlink(errp);
}

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Exit 2, exactly one line on stderr, containing want. */
static void expect_usage_error(const char *const *args, const char *want)
{
    run_t r;
    run(args, 60, &r);
    ck_assert_msg(r.status == 2, "exit %d for '%s' (stderr: %s)", r.status, want, r.err);
    ck_assert_msg(lines(r.err) == 1, "stderr is not one line: %s", r.err);
    ck_assert_msg(strstr(r.err, want) != NULL, "stderr '%s' does not say '%s'", r.err, want);
}

START_TEST(test_local_training_and_checkpoint)
{
    char dir[] = "/tmp/flodl-wkcli-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char save[128];
    snprintf(save, sizeof save, "%s/model.safetensors", dir);
    const char *a[] = {"--mode", "local", "--epochs", "2", "--save", save, NULL};
    run_t r;
    run(a, 120, &r);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    const char *s = strstr(r.out, "test accuracy ");
    ck_assert_msg(s != NULL, "%s", r.out);
    double acc = atof(strstr(r.out, "summary")
                          ? strstr(strstr(r.out, "summary"), "accuracy ") + strlen("accuracy ")
                          : "0");
    ck_assert_msg(acc > 85.0, "local training reached only %.2f%%:\n%s", acc, r.out);
    ck_assert(access(save, R_OK) == 0);

    /* The checkpoint starts a new run: one more epoch from it is already accurate. */
    const char *b[] = {"--mode", "local", "--epochs", "1", "--init", save, NULL};
    run(b, 120, &r);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    /* A model that does not fit the checkpoint: exit 2 naming the tensor. */
    const char *c[] = {"--mode",    "local",  "--epochs", "1", "--layers",
                       "64,200,10", "--init", save,       NULL};
    expect_usage_error(c, "layers.0.weight");
    /* A checkpoint holding a NaN is refused before training, naming the tensor and index,
     * instead of training on it and saving it again. */
    fl_mlp_shape_t m;
    ck_assert(fl_mlp_parse("64,256,128,10", &m) == FL_OK);
    size_t np = fl_mlp_nparams(&m);
    float *p = malloc(np * sizeof *p);
    ck_assert(p != NULL);
    ck_assert_msg(fl_mlp_load(&m, p, save) == FL_OK, "%s", fl_last_error());
    p[fl_mlp_bias_at(&m, 1) + 7] = NAN;
    char nan_path[160];
    snprintf(nan_path, sizeof nan_path, "%s/nan.safetensors", dir);
    ck_assert_msg(fl_mlp_save(&m, p, nan_path, NULL, 0) == FL_OK, "%s", fl_last_error());
    free(p);
    const char *d[] = {"--mode", "local", "--epochs", "1", "--init", nan_path, NULL};
    expect_usage_error(d, "tensor 'layers.1.bias' holds NaN at index 7");
    unlink(nan_path);

    /* A PyTorch nn.Sequential's state dict (Linear, ReLU, Linear, ReLU, Linear under "net."):
     * its Linear modules map to the layers in order; a missing tensor is named as expected. */
    p = malloc(np * sizeof *p);
    ck_assert(p != NULL);
    ck_assert_msg(fl_mlp_load(&m, p, save) == FL_OK, "%s", fl_last_error());
    char seq[160];
    snprintf(seq, sizeof seq, "%s/seq.safetensors", dir);
    static const char *const names[] = {"net.4.weight", "net.4.bias",   "net.0.weight",
                                        "net.0.bias",   "net.2.weight", "net.2.bias"};
    static const int layer_of[] = {2, 2, 0, 0, 1, 1};
    fl_st_tensor_t t[6];
    for (int i = 0; i < 6; i++) {
        int l = layer_of[i];
        uint64_t out = (uint64_t)m.sizes[l + 1], in = (uint64_t)m.sizes[l];
        bool w = i % 2 == 0;
        t[i] = (fl_st_tensor_t){names[i],
                                FL_FLOAT32,
                                w ? 2u : 1u,
                                {out, w ? in : 0},
                                p + (w ? fl_mlp_weight_at(&m, l) : fl_mlp_bias_at(&m, l)),
                                (w ? out * in : out) * sizeof(float)};
    }
    ck_assert_msg(fl_st_write(seq, t, 6, NULL, 0) == FL_OK, "%s", fl_last_error());
    float *q = calloc(np, sizeof *q);
    ck_assert(q != NULL);
    ck_assert_msg(fl_mlp_load(&m, q, seq) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(memcmp(p, q, np * sizeof *p) == 0, "nn.Sequential names mapped out of order");
    const char *e[] = {"--mode", "local", "--epochs", "1", "--init", seq, NULL};
    run(e, 120, &r);
    ck_assert_msg(r.status == 0, "exit %d: %.300s", r.status, r.err);
    ck_assert_msg(fl_st_write(seq, t, 5, NULL, 0) == FL_OK, "%s", fl_last_error());
    expect_usage_error(e, "no tensor 'net.2.bias', which the model expects");
    unlink(seq);
    free(q);
    free(p);
    unlink(save);
    rmdir(dir);
}
END_TEST

START_TEST(test_configuration_errors)
{
    const char *a[] = {"--mode", "local", "--layers", "32,16,10", NULL};
    expect_usage_error(a, "64 features");
    const char *b[] = {"--mode", "local", "--layers", "64,16,5", NULL};
    expect_usage_error(b, "10 classes");
    const char *c[] = {"--mode", "local", "--batch-size", "70000", NULL};
    expect_usage_error(c, "batch size 70000");
    const char *d[] = {"--mode", "local", "--frobnicate", NULL};
    expect_usage_error(d, "--frobnicate");
    const char *e[] = {"--mode", "local", "--layers", "64,x,10", NULL};
    expect_usage_error(e, "layers");
    const char *f[] = {"--mode", "local", "--optimizer", "lion", NULL};
    expect_usage_error(f, "lion");
    const char *g[] = {"--mode", "local", "--topk", "2", NULL};
    expect_usage_error(g, "--topk");
    const char *h[] = {"--mode", "local", "--device", "tpu", NULL};
    expect_usage_error(h, "--device");
    const char *hh[] = {"--mode", "local", "--hierarchy", "tree", NULL};
    expect_usage_error(hh, "hybrid|flat");
    const char *fl[] = {"--mode", "local", "--first-leg", "nvlink", NULL};
    expect_usage_error(fl, "auto|devices|host");
    const char *fc[] = {"--mode",   "local",       "--cpu-replicas",
                        "2",        "--first-leg", "devices",
                        "--epochs", "1",           NULL};
    expect_usage_error(fc, "--first-leg devices: cpu replicas reduce in host memory");
    const char *sh[] = {"--mode", "local", "--shard", "zero", NULL};
    expect_usage_error(sh, "none|grad|full|hybrid");
    const char *ps[] = {"--mode", "ps", "--shard", "grad", NULL};
    expect_usage_error(ps, "parameter server");
    const char *th[] = {"--mode", "local", "--throttle", "3", NULL};
    expect_usage_error(th, "DEVICE:RATIO");
    const char *ma[] = {"--mode", "local", "--max-anchor", "-1", NULL};
    expect_usage_error(ma, "--max-anchor");
    const char *i[] = {"--mode", "ring", NULL};
    expect_usage_error(i, "--world-size");
    const char *mo[] = {"--mode", "local", "--optimizer", "adam", "--momentum", "0.5", NULL};
    expect_usage_error(mo, "SGD's");
    /* Test-set flags alone, or without their training set, are refused, not ignored. */
    const char *t1[] = {
        "--mode", "local", "--train-images", "x", "--train-labels", "y", "--test-images",
        "z",      NULL};
    expect_usage_error(t1, "--test-images and --test-labels go together");
    const char *t2[] = {"--mode", "local", "--test-labels", "z", NULL};
    expect_usage_error(t2, "--test-images and --test-labels go together");
    const char *t3[] = {"--mode", "local", "--test-images", "z", "--test-labels", "w", NULL};
    expect_usage_error(t3, "need --train-images and --train-labels");
    const char *t4[] = {"--mode", "local", "--test-csv", "z", NULL};
    expect_usage_error(t4, "--test-csv needs --train-csv");
}
END_TEST

/* Without a test set the summary says there is none, instead of "test accuracy 0.00%", and a
 * run that exchanged nothing says so instead of "0.0x less"; rank 0's progress line says the
 * step out of the total, how far the job is and when it will end. */
START_TEST(test_no_test_set_and_progress)
{
    char dir[] = "/tmp/flodl-wkcli-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char csv[128];
    snprintf(csv, sizeof csv, "%s/train.csv", dir);
    FILE *fp = fopen(csv, "w");
    ck_assert_ptr_nonnull(fp);
    for (int i = 0; i < 4000; i++)
        fprintf(fp, "%d,%g,%g,%g\n", i % 3, (i % 3) == 0 ? 1.0 : 0.0, (i % 3) == 1 ? 1.0 : 0.0,
                0.001 * (i % 11));
    fclose(fp);
    const char *a[] = {"--mode",   "local", "--train-csv",  csv,   "--layers",   "3,8,3",
                       "--epochs", "2",     "--batch-size", "200", "--progress", "0",
                       NULL};
    run_t r;
    run(a, 120, &r);
    ck_assert_msg(r.status == 0, "exit %d: %.300s", r.status, r.err);
    const char *sum = strstr(r.out, "rank 0 summary:");
    ck_assert_msg(sum != NULL, "no summary in %zu bytes of output", strlen(r.out));
    ck_assert_msg(strstr(sum, "no test set") != NULL && strstr(sum, "0.00%") == NULL, "%.400s",
                  sum);
    ck_assert_msg(strstr(sum, "nothing exchanged") != NULL && strstr(sum, "0.0x") == NULL, "%.400s",
                  sum);
    ck_assert_msg(strstr(r.out, "ratio") == NULL, "a progress line still says ratio");
    const char *half = strstr(r.out, "step 20/40 (50% ETA ");
    ck_assert_msg(half != NULL, "no 'step 20/40 (50%% ETA' line: %.300s", r.out);
    unlink(csv);
    rmdir(dir);
}
END_TEST

/* The devices a worker trains on, as docs/gpus.md runs them: simulated GPUs train;
 * a GPU that is not there, an id beyond the host's and a model too big for a device are
 * refused before training with one line. */
START_TEST(test_devices)
{
    const char *a[] = {"--mode", "local",       "--device", "sim",  "--gpus", "0,1", "--epochs",
                       "1",      "--optimizer", "adam",     "--lr", "0.001",  NULL};
    run_t r;
    run(a, 120, &r);
    ck_assert_msg(r.status == 0, "exit %d: %s", r.status, r.err);
    ck_assert_msg(strstr(r.out, "2 device(s) (sim:0, ...)") != NULL, "%s", r.out);
    char why[256];
    if (fl_dev_count(FL_DEV_CUDA, why, sizeof why) == 0) {
        const char *b[] = {"--mode", "local", "--device", "cuda", NULL};
        expect_usage_error(b, "--device cuda: no usable GPU");
    } else {
        const char *b[] = {"--mode", "local", "--device", "cuda", "--gpus", "1000", NULL};
        expect_usage_error(b, "GPU 1000 does not exist");
    }
    const char *c[] = {"--mode", "local", "--device", "cpu", "--gpus", "0", NULL};
    expect_usage_error(c, "--gpus applies to --device cuda or sim");
    setenv("FLODL_SIM_MEM", "1000000", 1);
    const char *d[] = {"--mode", "local", "--device", "sim", "--layers", "64,1024,1024,10", NULL};
    expect_usage_error(d, "the model needs");
    unsetenv("FLODL_SIM_MEM");
}
END_TEST

START_TEST(test_bad_data_files)
{
    char dir[] = "/tmp/flodl-wkcli-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char csv[128];
    snprintf(csv, sizeof csv, "%s/bad.csv", dir);
    FILE *fp = fopen(csv, "w");
    fprintf(fp, "1,0.5,0.25\n0,0.1\n");
    fclose(fp);
    const char *a[] = {"--mode", "local", "--train-csv", csv, NULL};
    run_t r;
    run(a, 60, &r);
    ck_assert_msg(r.status != 0, "a bad CSV trained");
    ck_assert_msg(strstr(r.err, "bad.csv") && strstr(r.err, "line 2"), "%s", r.err);
    const char *b[] = {"--mode",
                       "local",
                       "--train-images",
                       "/nonexistent/img.idx",
                       "--train-labels",
                       "/nonexistent/lab.idx",
                       NULL};
    run(b, 60, &r);
    ck_assert_msg(r.status != 0 && strstr(r.err, "/nonexistent/"), "%d %s", r.status, r.err);
    unlink(csv);
    rmdir(dir);
}
END_TEST

Suite *wk_cli_suite(void);
Suite *wk_cli_suite(void)
{
    Suite *s = suite_create("wk_cli");
    TCase *t = tcase_create("worker");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, test_local_training_and_checkpoint);
    tcase_add_test(t, test_configuration_errors);
    tcase_add_test(t, test_no_test_set_and_progress);
    tcase_add_test(t, test_devices);
    tcase_add_test(t, test_bad_data_files);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(wk_cli_suite());
}
