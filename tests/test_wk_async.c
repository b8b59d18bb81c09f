/* --policy async: local SGD whose devices and hosts go on while a round is averaged. With a
 * run-ahead bound of 0 it is --policy cadence (the same parameters); with a bound of 2 and a
 * device three times slower, devices start rounds beyond the last completed averaging but never
 * more than the bound, the job learns, and both hosts end with the same parameters; a device
 * failing midway ends the run with its error instead of a hang, on its host and the others;
 * bad combinations are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "wkdata.h"
#include "train_int.h"

#define LAYERS "6,16,3"

static void base_opts(fl_wk_train_opts_t *o)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse(LAYERS, &o->shape);
    o->mode = FL_WK_MODE_RING;
    o->batch = 8;
    o->replicas = 2;
    o->epochs = 2;
    o->quiet = true;
    o->max_anchor = 3;
    o->replan_every = 0; /* the first plan stays: both runs see the same rounds */
    o->policy = FL_WK_POLICY_ASYNC;
}

START_TEST(test_run_ahead_zero_is_cadence)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 1024, 11);
    char dir[] = "/tmp/flodl-async-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char a[96], b[96], err[1200] = "";
    snprintf(a, sizeof a, "%s/cadence.safetensors", dir);
    snprintf(b, sizeof b, "%s/async.safetensors", dir);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.lr.warmup_steps = 20; /* the schedule must follow the job's batches alike */
    o.speed_hint[0] = 2.0;  /* device 0 does twice the batches of device 1 */
    fl_wk_train_result_t rc_res[FL_TEST_MAX_HOSTS];
    fl_wk_train_result_t ra_res[FL_TEST_MAX_HOSTS];
    o.policy = FL_WK_POLICY_CADENCE;
    o.save_path = a;
    int rc = fl_test_run_hosts(2, &o, NULL, &d, rc_res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "cadence: %s", err);
    o.policy = FL_WK_POLICY_ASYNC;
    o.run_ahead = 0;
    o.save_path = b;
    rc = fl_test_run_hosts(2, &o, NULL, &d, ra_res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "async: %s", err);
    ck_assert_int_eq(rc_res[0].steps, ra_res[0].steps);
    fl_test_params_close(LAYERS, a, b, "--policy async --run-ahead 0 vs cadence");
    ck_assert_int_eq(ra_res[0].run_ahead_max, 0);
    ck_assert_msg(fabs(ra_res[0].divergence - rc_res[0].divergence) <
                      1e-3 * rc_res[0].divergence + 1e-9,
                  "divergence %g vs %g", ra_res[0].divergence, rc_res[0].divergence);
    unlink(a);
    unlink(b);
    rmdir(dir);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_devices_run_ahead_within_the_bound)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 1024, 11);
    char err[1200] = "";
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.epochs = 3;
    o.run_ahead = 2;
    o.throttle[1] = 3.0; /* device 1 of every host three times slower */
    fl_wk_train_result_t res[FL_TEST_MAX_HOSTS];
    int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(res[r].run_ahead_max >= 1 && res[r].run_ahead_max <= 2,
                      "rank %d: devices started %d rounds ahead (bound 2)", r,
                      res[r].run_ahead_max);
        ck_assert_msg(res[r].divergence > 0 && res[r].divergence < 1, "divergence %g",
                      res[r].divergence);
    }
    ck_assert_msg(res[0].test_acc > 0.9, "async reached %.1f%%", 100 * res[0].test_acc);
    /* Every averaging leaves both hosts with the same parameters: the same evaluation. */
    ck_assert(res[0].test_loss == res[1].test_loss);
    /* The averaging's bytes are counted. */
    ck_assert_uint_gt(res[0].bytes_sent, 0);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_one_host_async_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 1024, 11);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.mode = FL_WK_MODE_LOCAL;
    o.replicas = 3;
    o.run_ahead = 1;
    o.replan_every = 4;
    fl_wk_train_result_t r;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &r) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(r.test_acc > 0.9, "async reached %.1f%%", 100 * r.test_acc);
    ck_assert_int_le(r.run_ahead_max, 1);
    fl_dataset_free(&d);
}
END_TEST

/* A label out of range in the data: the device that meets it fails; the run ends with its
 * error, not at a deadline. */
START_TEST(test_failing_device_ends_the_run)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 512, 11);
    d.y[300] = 7; /* the model has 3 classes */
    d.classes = 3;
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.mode = FL_WK_MODE_LOCAL;
    o.run_ahead = 2;
    o.shuffle = false;
    fl_wk_train_result_t r;
    int64_t t0 = fl_now_ns();
    int rc = fl_wk_train(NULL, &d, NULL, &o, &r);
    ck_assert_int_eq(rc, FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "label 7") != NULL, "%s", fl_last_error());
    ck_assert_msg(fl_now_ns() - t0 < 10000000000LL, "took %lld ns", (long long)(fl_now_ns() - t0));
    fl_dataset_free(&d);
}
END_TEST

/* The same across hosts: the host whose device fails tells the others through the
 * averaging, and both stop at once (not at the communicator's 15 s deadline). */
START_TEST(test_failure_on_one_host_stops_both)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 1024, 11);
    d.y[700] = 7;
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.run_ahead = 1;
    o.shuffle = false;
    char err[1200] = "";
    fl_wk_train_result_t res[FL_TEST_MAX_HOSTS];
    int64_t t0 = fl_now_ns();
    int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    double secs = (double)(fl_now_ns() - t0) / 1e9;
    /* Neither host finished its first epoch. */
    ck_assert_int_eq(res[0].epochs, 0);
    ck_assert_int_eq(res[1].epochs, 0);
    ck_assert_msg(rc == FL_EINVAL || rc == FL_EPEER, "%s: %s", fl_strerror(rc), err);
    ck_assert_msg(strstr(err, "label 7") != NULL || strstr(err, "another rank") != NULL, "%s", err);
    ck_assert_msg(secs < 10.0, "stopping took %.1f s", secs);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_async_combinations_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 512, 11);
    fl_wk_train_opts_t o;
    base_opts(&o);
    o.mode = FL_WK_MODE_LOCAL;
    fl_wk_train_result_t r;
    o.max_anchor = 0;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--max-anchor") != NULL, "%s", fl_last_error());
    o.max_anchor = 2;
    o.shard = FL_WK_SHARD_HYBRID;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--shard") != NULL, "%s", fl_last_error());
    o.shard = FL_WK_SHARD_NONE;
    o.topk = 0.1;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--topk") != NULL, "%s", fl_last_error());
    o.topk = 0;
    o.run_ahead = 17;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--run-ahead") != NULL, "%s", fl_last_error());
    /* --checkpoint is accepted: test_wk_ckpt.c resumes an async run. */
    fl_dataset_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("wk_async");
    TCase *t = tcase_create("async");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, test_run_ahead_zero_is_cadence);
    tcase_add_test(t, test_devices_run_ahead_within_the_bound);
    tcase_add_test(t, test_one_host_async_learns);
    tcase_add_test(t, test_failing_device_ends_the_run);
    tcase_add_test(t, test_failure_on_one_host_stops_both);
    tcase_add_test(t, test_async_combinations_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
