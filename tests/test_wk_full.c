/* --shard full (ZeRO-3): parameters sharded over every device of every host, each layer
 * gathered only while the devices compute with it. It trains the same parameters as --shard
 * none (2 hosts x 2 devices, SGD with momentum and clipped Adam; one host of 3 devices); a model
 * whose layers are smaller than the device count is padded, not refused; a device owns
 * 1/(W L) of parameters and optimizer state, and at most two layers are gathered at once; the
 * gathers follow the program the devices ask in, and a step whose devices stop early ends
 * without waiting, naming the device's own error. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_wk.h"
#include "train_int.h"
#include "testutil.h"
#include "wkdata.h"

#define N 512

static char dir[64];

static void base_opts(fl_wk_train_opts_t *o, const char *layers)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse(layers, &o->shape);
    o->mode = FL_WK_MODE_RING;
    o->epochs = 2;
    o->shuffle = false;
    o->seed = 5;
    o->batch = 8;
    o->lr.lr = 0.1;
    o->quiet = true;
}

/* Parameters a device owns under --shard full: its piece of every layer, padding included. */
static size_t pieces_of(const fl_mlp_shape_t *m, int W, int L)
{
    size_t sum = 0;
    for (int u = 0; u < m->nlayers; u++) {
        size_t n;
        size_t c;
        fl_wk_full_layout(m, W, L, u, &n, &c);
        ck_assert_uint_eq(c, (n + (size_t)(W * L) - 1) / (size_t)(W * L));
        sum += c;
    }
    return sum;
}

/* The two largest neighbouring layers of the gathers' order, padded: the most a step may hold
 * gathered at once with one layer of prefetch. */
static size_t two_layers(const fl_mlp_shape_t *m, int W, int L)
{
    size_t most = 0;
    for (int u = 0; u < m->nlayers; u++) {
        size_t n0, c0, n1 = 0, c1 = 0;
        fl_wk_full_layout(m, W, L, u, &n0, &c0);
        if (u + 1 < m->nlayers)
            fl_wk_full_layout(m, W, L, u + 1, &n1, &c1);
        size_t b = (c0 + c1) * (size_t)(W * L) * sizeof(float);
        most = b > most ? b : most;
    }
    return most;
}

/* W hosts x L devices (W 1: one process, no network) under --shard none and full: the same
 * parameters; full's memory per device as its layout says. */
static void check_full(int W, int L, const char *layers, fl_opt_kind_t kind, double lr,
                       double max_norm)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, layers);
    if (W == 1)
        o.mode = FL_WK_MODE_LOCAL;
    o.replicas = L;
    o.opt.kind = kind;
    if (kind != FL_OPT_SGD)
        o.opt.momentum = 0;
    o.lr.lr = lr;
    o.max_norm = max_norm;
    char path[2][128];
    char err[1200] = "";
    fl_wk_train_result_t rr[FL_TEST_MAX_HOSTS];
    const fl_wk_shard_t modes[2] = {FL_WK_SHARD_NONE, FL_WK_SHARD_FULL};
    for (int k = 0; k < 2; k++) {
        snprintf(path[k], sizeof path[k], "%s/%s.safetensors", dir, fl_wk_shard_name(modes[k]));
        o.shard = modes[k];
        o.save_path = path[k];
        int rc = W == 1 ? fl_wk_train(NULL, &d, &d, &o, &rr[0])
                        : fl_test_run_hosts(W, &o, NULL, &d, rr, err, sizeof err);
        if (W == 1)
            snprintf(err, sizeof err, "%s", fl_last_error());
        ck_assert_msg(rc == FL_OK, "--shard %s: %s: %s", fl_wk_shard_name(modes[k]),
                      fl_strerror(rc), err);
        ck_assert_msg(rr[0].test_acc > 0.5, "--shard %s learned nothing: %.3f",
                      fl_wk_shard_name(modes[k]), rr[0].test_acc);
    }
    char what[128];
    snprintf(what, sizeof what, "--shard full vs none (%d x %d, %s)", W, L, layers);
    fl_test_params_close(layers, path[0], path[1], what);
    /* Memory per device: 1/(W L) of optimizer state and parameters, plus what is gathered. */
    size_t per_param = kind == FL_OPT_SGD ? 1 : 2;
    size_t pieces = pieces_of(&o.shape, W, L);
    ck_assert_uint_eq(rr[0].mem_opt_state, per_param * pieces * sizeof(float));
    size_t gathered = rr[0].mem_params - pieces * sizeof(float);
    ck_assert_msg(gathered > 0 && gathered <= two_layers(&o.shape, W, L),
                  "gathered at once: %zu bytes, two layers %zu", gathered,
                  two_layers(&o.shape, W, L));
    ck_assert_msg(rr[0].gathers > 0, "no layer gathered");
    unlink(path[0]);
    unlink(path[1]);
    fl_dataset_free(&d);
}

START_TEST(test_full_trains_the_same_parameters_across_hosts)
{
    check_full(2, 2, "6,16,16,16,3", FL_OPT_SGD, 0.1, 0.0);
    check_full(2, 2, "6,16,16,16,3", FL_OPT_ADAM, 0.01, 0.5); /* clipped by the global norm */
}
END_TEST

START_TEST(test_full_on_one_host)
{
    check_full(1, 3, "6,32,16,3", FL_OPT_SGD, 0.1, 0.0);
}
END_TEST

/* Layers of 7 and 6 parameters over 2 hosts x 4 devices: every device owns one element of each,
 * some only padding; it trains as --shard none does. */
START_TEST(test_layers_smaller_than_the_devices_are_padded)
{
    check_full(2, 4, "6,1,3", FL_OPT_SGD, 0.1, 0.0);
}
END_TEST

/* A deep model (16 layers): the parameters a device holds (its quarter and two gathered
 * layers) are less than half the model. */
START_TEST(test_full_holds_less_than_the_model)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,32,32,32,32,32,32,32,32,32,32,32,32,32,32,32,3");
    o.mode = FL_WK_MODE_LOCAL;
    o.epochs = 1;
    o.replicas = 4;
    o.shard = FL_WK_SHARD_FULL;
    fl_wk_train_result_t r;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &r) == FL_OK, "%s", fl_last_error());
    size_t whole = fl_mlp_nparams(&o.shape) * sizeof(float);
    ck_assert_msg(r.mem_params < whole / 2, "--shard full holds %llu of %zu bytes",
                  (unsigned long long)r.mem_params, whole);
    ck_assert_uint_eq(r.mem_grads, whole); /* the backward pass's gradient is still whole */
    fl_dataset_free(&d);
}
END_TEST

/* ---- the gathers themselves ---- */

typedef struct dev_arg {
    fl_wk_full_t *z;
    const fl_mlp_shape_t *m;
    const float *params;
    int t;
    int stop_after; /* gets before the device "fails" (-1: the whole program) */
    int bad;        /* layers whose gathered values differed */
} dev_arg_t;

/* The order fl_mlp_grad_src asks in, checking every layer against the flat parameters. */
static void *device_main(void *p)
{
    dev_arg_t *a = p;
    const fl_mlp_src_t *src = fl_wk_full_src(a->z, a->t);
    int n = a->m->nlayers;
    int order[2 * FL_MLP_MAX_LAYERS];
    int k = 0;
    for (int u = 0; u < n; u++)
        order[k++] = u;
    for (int u = n - 2; u >= 1; u--)
        order[k++] = u;
    for (int i = 0; i < k && (a->stop_after < 0 || i < a->stop_after); i++) {
        int u = order[i];
        if (i == n) /* the backward pass is done with the last layer before it asks for more */
            src->put(src->ud, n - 1);
        const float *w = NULL;
        if (src->get(src->ud, u, &w) != FL_OK) {
            a->bad++;
            break;
        }
        size_t at = fl_mlp_weight_at(a->m, u);
        size_t len = fl_mlp_weight_at(a->m, u + 1) - at;
        if (memcmp(w, a->params + at, len * sizeof(float)) != 0)
            a->bad++;
        usleep(1000);
        if (i != n - 1) /* the last layer stays held into the backward pass */
            src->put(src->ud, u);
    }
    fl_wk_full_device_done(a->z, a->t);
    return NULL;
}

static void run_devices(fl_wk_full_t *z, const fl_mlp_shape_t *m, const float *params, int L,
                        int stop_after, int *bad)
{
    pthread_t th[4];
    dev_arg_t a[4];
    for (int t = 0; t < L; t++) {
        a[t] = (dev_arg_t){z, m, params, t, stop_after, 0};
        ck_assert_int_eq(pthread_create(&th[t], NULL, device_main, &a[t]), 0);
    }
    *bad = 0;
    for (int t = 0; t < L; t++) {
        pthread_join(th[t], NULL);
        *bad += a[t].bad;
    }
}

START_TEST(test_gathers_follow_the_devices)
{
    fl_wk_train_opts_t o;
    base_opts(&o, "5,9,7,4,3");
    o.replicas = 3;
    size_t np = fl_mlp_nparams(&o.shape);
    float *params = malloc(np * sizeof(float));
    float *back = calloc(np, sizeof(float));
    fl_mlp_init(&o.shape, params, 3);
    fl_wk_full_t *z;
    ck_assert_int_eq(fl_wk_full_create(&o, 0, 1, NULL, params, &z), FL_OK);
    /* Every layer reaches every device whole, whatever the pieces. */
    ck_assert_int_eq(fl_wk_full_begin(z), FL_OK);
    int bad;
    run_devices(z, &o.shape, params, 3, -1, &bad);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(fl_wk_full_end(z), FL_OK);
    fl_wk_full_stats_t st;
    fl_wk_full_stats(z, &st);
    ck_assert_uint_eq(st.gets, 3 * (2 * 4 - 2));
    ck_assert_uint_le(st.peak_gathered, two_layers(&o.shape, 1, 3));
    /* The pieces gather back into the model. */
    ck_assert_int_eq(fl_wk_full_materialize(z, back), FL_OK);
    ck_assert_int_eq(memcmp(back, params, np * sizeof(float)), 0);
    /* Devices that stop after two layers: the step ends at once, saying so. */
    ck_assert_int_eq(fl_wk_full_begin(z), FL_OK);
    int64_t t0 = fl_now_ns();
    run_devices(z, &o.shape, params, 3, 2, &bad);
    ck_assert_int_eq(fl_wk_full_end(z), FL_ECLOSED);
    ck_assert_msg(fl_now_ns() - t0 < 5000000000LL, "the stopped step took %lld ns",
                  (long long)(fl_now_ns() - t0));
    /* And the next step works again. */
    ck_assert_int_eq(fl_wk_full_begin(z), FL_OK);
    run_devices(z, &o.shape, params, 3, -1, &bad);
    ck_assert_int_eq(bad, 0);
    ck_assert_int_eq(fl_wk_full_end(z), FL_OK);
    fl_wk_full_destroy(&z);
    free(params);
    free(back);
}
END_TEST

/* A device that meets a bad label stops the step midway (the others were gathering ahead):
 * the run ends with that device's error, at once. */
START_TEST(test_failing_device_names_its_error)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    d.y[300] = 7; /* the model has 3 classes */
    fl_wk_train_opts_t o;
    base_opts(&o, "6,16,16,16,3");
    o.mode = FL_WK_MODE_LOCAL;
    o.replicas = 3;
    o.shard = FL_WK_SHARD_FULL;
    fl_wk_train_result_t r;
    int64_t t0 = fl_now_ns();
    int rc = fl_wk_train(NULL, &d, NULL, &o, &r);
    ck_assert_int_eq(rc, FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "label 7") != NULL, "%s", fl_last_error());
    ck_assert_msg(fl_now_ns() - t0 < 10000000000LL, "took %lld ns", (long long)(fl_now_ns() - t0));
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_full_combinations_refused)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 7);
    fl_wk_train_opts_t o;
    base_opts(&o, "6,16,3");
    o.replicas = 2;
    o.shard = FL_WK_SHARD_FULL;
    char err[1200] = "";
    o.topk = 0.1;
    int rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--topk") != NULL, "%s", err);
    o.topk = 0;
    o.max_anchor = 2;
    rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--max-anchor") != NULL, "%s", err);
    o.max_anchor = 0;
    o.hierarchy = FL_WK_HIER_FLAT;
    rc = fl_test_run_hosts(2, &o, NULL, &d, NULL, err, sizeof err);
    ck_assert_msg(rc == FL_EINVAL && strstr(err, "--hierarchy hybrid") != NULL, "%s", err);
    fl_dataset_free(&d);
}
END_TEST

static void setup_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-wk-full-XXXXXX");
    ck_assert(mkdtemp(dir) != NULL);
}

static void teardown_dir(void)
{
    rmdir(dir);
}

static Suite *suite(void)
{
    Suite *s = suite_create("wk_full");
    TCase *t = tcase_create("full");
    tcase_set_timeout(t, 240);
    tcase_add_checked_fixture(t, setup_dir, teardown_dir);
    tcase_add_test(t, test_full_trains_the_same_parameters_across_hosts);
    tcase_add_test(t, test_full_on_one_host);
    tcase_add_test(t, test_layers_smaller_than_the_devices_are_padded);
    tcase_add_test(t, test_full_holds_less_than_the_model);
    tcase_add_test(t, test_gathers_follow_the_devices);
    tcase_add_test(t, test_failing_device_names_its_error);
    tcase_add_test(t, test_full_combinations_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(suite());
}
