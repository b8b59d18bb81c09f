/* El Che's cadence: the plan (counts in proportion to speed, the anchor from the overhead
 * target and its bound, hints, the 5% floor), a cadence step's gradient (the weighted mean of
 * every batch the devices did, each batch weighing the same), and training with a device slowed
 * on purpose: the slow device does fewer batches, the job syncs less often, and it learns. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "wkdata.h"
#include "train_int.h"

START_TEST(test_plan_follows_speed)
{
    fl_wk_cadence_t c;
    fl_wk_cadence_init(&c, 4, 8, 0.1, NULL);
    /* Unmeasured, no hints: one batch each (the anchor starts at 1). */
    for (int j = 0; j < 4; j++)
        ck_assert_int_eq(c.counts[j], 1);
    double t[4] = {0.01, 0.01, 0.01, 0.03}; /* device 3 three times slower */
    fl_wk_cadence_observe(&c, t);
    ck_assert(fabs(fl_wk_cadence_slowest(&c) - 0.03) < 1e-12);
    /* An exchange cheap enough for anchor 1: the others do 3 in the slow one's time. */
    fl_wk_cadence_plan(&c, 0.03, 0.001);
    ck_assert_int_eq(c.anchor, 1);
    int want[4] = {3, 3, 3, 1};
    for (int j = 0; j < 4; j++)
        ck_assert_int_eq(c.counts[j], want[j]);
    /* An exchange of 11.5 ms against 30 ms of the slowest device's compute per batch: anchor
     * ceil(11.5 / (0.1 x 30)) = 4 keeps it under 10%. */
    fl_wk_cadence_plan(&c, 0.03, 0.0115);
    ck_assert_int_eq(c.anchor, 4);
    ck_assert_int_eq(c.counts[3], 4);
    ck_assert_int_eq(c.counts[0], 12);
    /* A slower device on another host sets the time: everyone here does more. */
    fl_wk_cadence_plan(&c, 0.06, 0.0115);
    ck_assert_int_eq(c.anchor, 2);
    ck_assert_int_eq(c.counts[3], 4);
    ck_assert_int_eq(c.counts[0], 12);
    /* The bound holds however slow the exchange. */
    fl_wk_cadence_plan(&c, 0.03, 10.0);
    ck_assert_int_eq(c.anchor, 8);
    ck_assert_int_eq(c.counts[3], 8);
}
END_TEST

START_TEST(test_plan_floor_hints_and_off)
{
    fl_wk_cadence_t c;
    /* A device 100x slower still gets 5% of the host's batches. */
    fl_wk_cadence_init(&c, 2, 4, 0.1, NULL);
    double t[2] = {0.001, 0.1};
    fl_wk_cadence_observe(&c, t);
    fl_wk_cadence_plan(&c, 0.1, 0.0);
    ck_assert_int_eq(c.counts[0], 64); /* capped at 64x the anchor */
    ck_assert_int_eq(c.counts[1], 4);  /* ceil(5% of 65) */
    /* Hints seed the first plan: device 0 said to be twice as fast. */
    double hint[2] = {2.0, 1.0};
    fl_wk_cadence_init(&c, 2, 4, 0.1, hint);
    ck_assert_int_eq(c.counts[0], 2);
    ck_assert_int_eq(c.counts[1], 1);
    /* max_anchor 0: El Che off, one batch each whatever the speeds. */
    fl_wk_cadence_init(&c, 2, 0, 0.1, hint);
    fl_wk_cadence_observe(&c, t);
    fl_wk_cadence_plan(&c, 0.1, 1.0);
    ck_assert_int_eq(c.counts[0], 1);
    ck_assert_int_eq(c.counts[1], 1);
}
END_TEST

START_TEST(test_cadence_step_weighs_every_batch_alike)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 480, 11);
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    fl_mlp_parse("6,16,3", &o.shape);
    o.batch = 8;
    o.replicas = 2;
    o.max_anchor = 4;
    o.seed = 3;
    size_t np = fl_mlp_nparams(&o.shape);
    float *params = malloc(np * sizeof *params);
    float *grad = calloc(np, sizeof *grad);
    fl_mlp_init(&o.shape, params, 3);
    fl_wk_devices_t *dev = NULL;
    ck_assert_msg(fl_wk_devices_create(&o.shape, &d, &o, 0, 1, FL_WK_LOCAL_MEAN, grad, &dev) ==
                      FL_OK,
                  "%s", fl_last_error());
    fl_wk_devices_set_epoch(dev, 0);
    ck_assert_uint_eq(fl_wk_devices_host_batches(dev), 480 / 8);
    /* Device 0 does batches 5 and 6 of the host's sequence, device 1 batch 7. */
    int counts[2] = {2, 1};
    double batch_s[2];
    double loss;
    size_t correct;
    ck_assert(fl_wk_devices_cadence_step(dev, params, counts, 5, batch_s, &loss, &correct) ==
              FL_OK);
    ck_assert(batch_s[0] > 0 && batch_s[1] > 0);
    fl_wk_devices_combine(dev, 1.0f / 3.0f, NULL, NULL);

    /* The same three batches by hand, from a sampler of the host's share. */
    fl_mlp_ws_t *ws = NULL;
    ck_assert(fl_mlp_ws_create(&o.shape, 8, &ws) == FL_OK);
    float *g = malloc(np * sizeof *g);
    double *want = calloc(np, sizeof *want);
    double want_loss = 0;
    fl_sampler_t smp;
    ck_assert(fl_sampler_init(&smp, 480, 1, 0, 8, o.shuffle, o.seed) == FL_OK);
    fl_sampler_set_epoch(&smp, 0);
    for (size_t b = 5; b < 8; b++) {
        uint32_t idx[8];
        float x[8 * 6];
        int32_t y[8];
        fl_sampler_batch(&smp, b, idx);
        for (int t = 0; t < 8; t++) {
            memcpy(x + t * 6, d.x + idx[t] * 6, 6 * sizeof(float));
            y[t] = d.y[idx[t]];
        }
        double l;
        size_t ok;
        ck_assert(fl_mlp_grad(&o.shape, ws, params, x, y, 8, g, &l, &ok, NULL, NULL) == FL_OK);
        want_loss += l / 3;
        for (size_t i = 0; i < np; i++)
            want[i] += g[i] / 3.0;
    }
    for (size_t i = 0; i < np; i++)
        ck_assert_msg(fabs(grad[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])),
                      "parameter %zu: %g, expected %g", i, grad[i], want[i]);
    ck_assert_msg(fabs(loss - want_loss) < 1e-5, "loss %g, expected %g", loss, want_loss);
    fl_sampler_deinit(&smp);
    fl_mlp_ws_destroy(&ws);
    fl_wk_devices_destroy(&dev);
    free(g);
    free(want);
    free(params);
    free(grad);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_slow_device_does_fewer_batches_and_the_job_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 3072, 11);
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    fl_mlp_parse("6,64,3", &o.shape);
    o.batch = 16;
    o.replicas = 4;
    o.epochs = 3;
    o.quiet = true;
    o.lr.lr = 0.05;
    o.throttle[3] = 3.0;
    fl_wk_train_result_t sync;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &sync) == FL_OK, "%s", fl_last_error());
    o.max_anchor = 4;
    fl_wk_train_result_t che;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &che) == FL_OK, "%s", fl_last_error());
    /* Per-batch sync: 4 batches a step. El Che: the three fast devices do about 3 batches in
     * the slow one's time, so a sync holds about 10 and there are far fewer syncs. */
    ck_assert_int_eq(sync.steps, 3 * (3072 / 16 / 4));
    ck_assert_msg(che.steps * 3 < sync.steps * 2, "El Che synced %ld times, per-batch %ld",
                  che.steps, sync.steps);
    ck_assert_msg(che.test_acc > 0.9 && che.test_acc > sync.test_acc - 0.02,
                  "El Che reached %.1f%%, per-batch sync %.1f%%", 100 * che.test_acc,
                  100 * sync.test_acc);
    fl_dataset_free(&d);
}
END_TEST

/* Local SGD with a period of one batch and plain SGD is the synchronous step: every device
 * steps from the same parameters, and the average of P - lr g_j is P - lr mean(g_j). */
START_TEST(test_local_sgd_of_one_batch_is_the_sync_step)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 512, 11);
    char dir[] = "/tmp/flodl-cadence-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char a[96], b[96];
    snprintf(a, sizeof a, "%s/sync.safetensors", dir);
    snprintf(b, sizeof b, "%s/local.safetensors", dir);
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    fl_mlp_parse("6,16,3", &o.shape);
    o.batch = 8;
    o.replicas = 2;
    o.epochs = 2;
    o.quiet = true;
    o.opt.momentum = 0;
    o.lr.lr = 0.1;
    o.max_anchor = 1;
    o.replan_every = 0; /* one batch per device per round, whatever the timings */
    fl_wk_train_result_t ra;
    fl_wk_train_result_t rb;
    o.save_path = a;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &ra) == FL_OK, "%s", fl_last_error());
    o.save_path = b;
    o.policy = FL_WK_POLICY_CADENCE;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &rb) == FL_OK, "%s", fl_last_error());
    ck_assert_int_eq(ra.steps, rb.steps);
    fl_test_params_close("6,16,3", a, b, "local SGD of one batch vs the sync step");
    ck_assert_msg(rb.divergence > 0 && rb.divergence < 1, "divergence %g", rb.divergence);
    unlink(a);
    unlink(b);
    rmdir(dir);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_local_sgd_across_hosts_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 1024, 11);
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    fl_mlp_parse("6,16,3", &o.shape);
    o.mode = FL_WK_MODE_RING;
    o.batch = 8;
    o.replicas = 2;
    o.epochs = 3;
    o.quiet = true;
    o.policy = FL_WK_POLICY_CADENCE;
    o.max_anchor = 4;
    o.replan_every = 0;
    char err[1200] = "";
    fl_wk_train_result_t res[FL_TEST_MAX_HOSTS];
    int rc = fl_test_run_hosts(2, &o, NULL, &d, res, err, sizeof err);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_strerror(rc), err);
    /* 1024 samples, 4 devices of batch 8, 4 batches each per round: 8 rounds an epoch. */
    ck_assert_int_eq(res[0].steps, 3 * 8);
    ck_assert_msg(res[0].test_acc > 0.9, "local SGD reached %.1f%%", 100 * res[0].test_acc);
    ck_assert_msg(res[0].divergence > 0 && res[0].divergence < 1, "divergence %g",
                  res[0].divergence);
    /* Both hosts hold the same parameters after every averaging: the same evaluation. */
    ck_assert(res[0].test_loss == res[1].test_loss);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_policy_combinations_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, 512, 11);
    fl_wk_train_opts_t o;
    fl_wk_train_opts_init(&o);
    fl_mlp_parse("6,16,3", &o.shape);
    o.batch = 8;
    o.replicas = 2;
    o.quiet = true;
    fl_wk_train_result_t r;
    o.policy = FL_WK_POLICY_CADENCE;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--max-anchor") != NULL, "%s", fl_last_error());
    o.max_anchor = 2;
    o.shard = FL_WK_SHARD_HYBRID;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &r), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "--shard") != NULL, "%s", fl_last_error());
    fl_dataset_free(&d);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("wk_cadence");
    TCase *t = tcase_create("cadence");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, test_plan_follows_speed);
    tcase_add_test(t, test_plan_floor_hints_and_off);
    tcase_add_test(t, test_cadence_step_weighs_every_batch_alike);
    tcase_add_test(t, test_slow_device_does_fewer_batches_and_the_job_learns);
    tcase_add_test(t, test_local_sgd_of_one_batch_is_the_sync_step);
    tcase_add_test(t, test_local_sgd_across_hosts_learns);
    tcase_add_test(t, test_policy_combinations_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
