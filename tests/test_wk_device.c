/* The worker on devices: training on simulated GPUs gives the cpu path's parameters bit for bit
 * in every mode (sim runs the same host code, so any difference is an ordering or copy bug of
 * the device path), the choice of devices (--device, --gpus) refuses what cannot work with one
 * line, and a model that does not fit a device is refused before training. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "train_int.h"
#include "wkdata.h"

#define N 384
#define LAYERS "6,16,3"

static char dir[64];

static void setup_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-wk-dev-XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
}

static void teardown_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
}

typedef struct wk_mode {
    const char *name;
    int hosts;
    int devices;
    fl_wk_shard_t shard;
    fl_wk_policy_t policy;
    fl_opt_kind_t opt;
    double topk;
    double max_norm;
    int max_anchor;
    fl_wk_hier_t hierarchy;
} wk_mode_t;

static void base_opts(fl_wk_train_opts_t *o, const wk_mode_t *m, const char *save)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse(LAYERS, &o->shape);
    o->mode = m->hosts > 1 ? FL_WK_MODE_RING : FL_WK_MODE_LOCAL;
    o->epochs = 2;
    o->seed = 3;
    o->batch = 8;
    o->quiet = true;
    o->replicas = m->devices;
    o->shard = m->shard;
    o->policy = m->policy;
    o->opt.kind = m->opt;
    if (m->opt != FL_OPT_SGD) {
        o->opt.momentum = 0;
        o->lr.lr = 0.01;
    }
    o->topk = m->topk;
    o->max_norm = m->max_norm;
    o->max_anchor = m->max_anchor;
    o->hierarchy = m->hierarchy;
    o->replan_every = 0; /* El Che's plan from the hints only: the same on both runs */
    o->save_path = save;
}

static void train(const wk_mode_t *m, fl_dev_kind_t kind, const fl_dataset_t *d, const char *save)
{
    fl_wk_train_opts_t o;
    base_opts(&o, m, save);
    o.device = kind;
    o.sim_jitter_us = kind == FL_DEV_SIM ? 30 : 0;
    char err[1200] = "";
    int rc;
    if (m->hosts > 1) {
        rc = fl_test_run_hosts(m->hosts, &o, NULL, d, NULL, err, sizeof err);
    } else {
        fl_wk_train_result_t res;
        rc = fl_wk_train(NULL, d, d, &o, &res);
        snprintf(err, sizeof err, "%s", fl_last_error());
    }
    ck_assert_msg(rc == FL_OK, "%s on %s: %s", m->name, fl_dev_kind_name(kind), err);
}

static const wk_mode_t modes[] = {
    {"one device, SGD, clipped (the gradient never leaves it)", 1, 1, FL_WK_SHARD_NONE,
     FL_WK_POLICY_SYNC, FL_OPT_SGD, 0, 0.5, 0, FL_WK_HIER_HYBRID},
    {"one device, Adam", 1, 1, FL_WK_SHARD_NONE, FL_WK_POLICY_SYNC, FL_OPT_ADAM, 0, 0, 0,
     FL_WK_HIER_HYBRID},
    {"2 hosts x 2 devices, hybrid, dense", 2, 2, FL_WK_SHARD_NONE, FL_WK_POLICY_SYNC, FL_OPT_SGD, 0,
     0, 0, FL_WK_HIER_HYBRID},
    {"2 hosts x 1 device, top-k (on the device), clipped", 2, 1, FL_WK_SHARD_NONE,
     FL_WK_POLICY_SYNC, FL_OPT_SGD, 0.1, 0.3, 0, FL_WK_HIER_HYBRID},
    {"2 hosts x 2 devices, flat, top-k (on the devices)", 2, 2, FL_WK_SHARD_NONE, FL_WK_POLICY_SYNC,
     FL_OPT_SGD, 0.05, 0, 0, FL_WK_HIER_FLAT},
    {"2 hosts x 2 devices, hybrid, top-k (of the host's shards)", 2, 2, FL_WK_SHARD_NONE,
     FL_WK_POLICY_SYNC, FL_OPT_ADAM, 0.1, 0, 0, FL_WK_HIER_HYBRID},
    {"2 hosts x 2 devices, --shard grad", 2, 2, FL_WK_SHARD_GRAD, FL_WK_POLICY_SYNC, FL_OPT_ADAM, 0,
     0, 0, FL_WK_HIER_HYBRID},
    {"2 hosts x 2 devices, --shard full", 2, 2, FL_WK_SHARD_FULL, FL_WK_POLICY_SYNC, FL_OPT_SGD, 0,
     0, 0, FL_WK_HIER_HYBRID},
    {"1 host x 3 devices, El Che", 1, 3, FL_WK_SHARD_NONE, FL_WK_POLICY_SYNC, FL_OPT_SGD, 0, 0, 2,
     FL_WK_HIER_HYBRID},
    {"2 hosts x 2 devices, local SGD", 2, 2, FL_WK_SHARD_NONE, FL_WK_POLICY_CADENCE, FL_OPT_SGD, 0,
     0, 2, FL_WK_HIER_HYBRID},
};

START_TEST(test_sim_equals_cpu)
{
    const wk_mode_t *m = &modes[_i];
    fl_dataset_t d;
    fl_test_clusters(&d, N, 21);
    char a[128];
    char b[128];
    snprintf(a, sizeof a, "%s/cpu.safetensors", dir);
    snprintf(b, sizeof b, "%s/sim.safetensors", dir);
    train(m, FL_DEV_CPU, &d, a);
    train(m, FL_DEV_SIM, &d, b);
    double diff = fl_test_params_diff(LAYERS, a, b);
    ck_assert_msg(diff == 0.0, "%s: sim differs from cpu by %.3g (relative)", m->name, diff);
    fl_dataset_free(&d);
}
END_TEST

/* Two logical devices on one GPU id: the same training as two separate ids. */
START_TEST(test_repeated_id_is_two_devices)
{
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    ck_assert_int_eq(fl_wk_device_select("sim", "0,0", false, &o), FL_OK);
    ck_assert_int_eq(o.replicas, 2);
    ck_assert_int_eq(o.gpus[0], 0);
    ck_assert_int_eq(o.gpus[1], 0);
    fl_dataset_t d;
    fl_test_clusters(&d, N, 22);
    fl_mlp_parse(LAYERS, &o.shape);
    o.epochs = 1;
    o.batch = 8;
    o.quiet = true;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    ck_assert(res.test_acc > 0.8);
    fl_dataset_free(&d);
}
END_TEST

static void refused(const char *device, const char *gpus, bool replicas, const char *says)
{
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    o.replicas = 2;
    int rc = fl_wk_device_select(device, gpus, replicas, &o);
    ck_assert_msg(rc == FL_EINVAL, "--device %s --gpus %s: accepted", device ? device : "auto",
                  gpus ? gpus : "-");
    ck_assert_msg(strstr(fl_last_error(), says) != NULL, "'%s' does not say '%s'", fl_last_error(),
                  says);
}

START_TEST(test_device_choice_refusals)
{
    refused("tpu", NULL, false, "not one of auto|cpu|sim|cuda");
    refused("cpu", "0", false, "--gpus applies to --device cuda or sim");
    refused("sim", "0,x", false, "entry 2 is not a device id");
    refused("sim", "0", true, "give one of them");
    refused("cuda", NULL, true, "--cpu-replicas is for --device cpu");
    char why[256];
    if (fl_dev_count(FL_DEV_CUDA, why, sizeof why) == 0) {
        /* No GPU here: cuda is refused naming why, and auto falls back to the CPU. */
        refused("cuda", NULL, false, "no usable GPU");
        refused(NULL, "0", false, "no usable GPU on this host");
        fl_wk_train_opts_t o;
        fl_wk_train_opts_init(&o);
        ck_assert_int_eq(fl_wk_device_select(NULL, NULL, false, &o), FL_OK);
        ck_assert_int_eq(o.device, FL_DEV_CPU);
    } else {
        refused("cuda", "1023", false, "GPU 1023 does not exist");
    }
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    o.replicas = 3;
    ck_assert_int_eq(fl_wk_device_select("sim", NULL, true, &o), FL_OK);
    ck_assert_int_eq(o.replicas, 3);
    ck_assert_int_eq(o.gpus[2], 2);
}
END_TEST

/* A model larger than the device is refused before training, with the bytes needed and free. */
START_TEST(test_model_too_big_refused)
{
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    o.device = FL_DEV_SIM;
    o.sim_mem_bytes = 1 << 20;
    fl_mlp_parse("6,512,512,3", &o.shape);
    o.quiet = true;
    fl_dataset_t d;
    fl_test_clusters(&d, N, 23);
    fl_wk_train_result_t res;
    int rc = fl_wk_train(NULL, &d, &d, &o, &res);
    ck_assert_int_eq(rc, FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "the model needs") != NULL &&
                      strstr(fl_last_error(), "1.0 MiB are free") != NULL,
                  "%s", fl_last_error());
    fl_dataset_free(&d);
}
END_TEST

Suite *wk_device_suite(void);
Suite *wk_device_suite(void)
{
    Suite *s = suite_create("wk_device");
    TCase *t = tcase_create("device");
    tcase_set_timeout(t, 240);
    tcase_add_checked_fixture(t, setup_dir, teardown_dir);
    tcase_add_loop_test(t, test_sim_equals_cpu, 0, (int)(sizeof modes / sizeof modes[0]));
    tcase_add_test(t, test_repeated_id_is_two_devices);
    tcase_add_test(t, test_device_choice_refusals);
    tcase_add_test(t, test_model_too_big_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(wk_device_suite());
}
