/* Training end to end on a small dataset: the data-parallel equivalence (W ranks with batch b,
 * or L CPU replicas with batch b, train the same parameters as one worker with batch W*b, to
 * float32 tolerance), top-k training that learns, the per-step metrics file, a model that does
 * not fit the data, and a rank whose model differs from the others' refused at rendezvous. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_wk.h"
#include "testutil.h"
#include "wkdata.h"

#define N 512

static char dir[64];

static void base_opts(fl_wk_train_opts_t *o, const char *save)
{
    fl_wk_train_opts_init(o);
    fl_mlp_parse("6,16,3", &o->shape);
    o->epochs = 2;
    o->shuffle = false;
    o->seed = 3;
    o->lr.lr = 0.1;
    o->quiet = true;
    o->save_path = save;
    o->bucket_bytes = 256; /* several buckets, exchanged while the backward pass runs */
}

typedef struct ring_arg {
    fl_wk_train_opts_t o;
    fl_dataset_t *data;
    double test_acc;
} ring_arg_t;

static int ring_rank(fl_comm_t *comm, void *p)
{
    ring_arg_t *a = p;
    fl_wk_train_result_t res;
    int rc = fl_wk_train(comm, a->data, a->data, &a->o, &res);
    if (rc == FL_OK && fl_comm_rank(comm) == 0)
        a->test_acc = res.test_acc;
    return rc;
}

START_TEST(test_data_parallel_equivalence)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char one[128], ring[128], reps[128];
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(ring, sizeof ring, "%s/ring.safetensors", dir);
    snprintf(reps, sizeof reps, "%s/reps.safetensors", dir);

    /* one worker, batch 32 */
    fl_wk_train_opts_t o;
    base_opts(&o, one);
    o.batch = 32;
    fl_wk_train_result_t res;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    ck_assert_int_eq(res.steps, 2 * (N / 32));

    /* two ranks, batch 16 each, dense ring */
    ring_arg_t a;
    base_opts(&a.o, ring);
    a.o.mode = FL_WK_MODE_RING;
    a.o.batch = 16;
    a.data = &d;
    char err[512] = "";
    ck_assert_msg(fl_test_run_ranks(2, NULL, ring_rank, &a, err, sizeof err) == FL_OK, "%s", err);
    fl_test_params_close("6,16,3", one, ring, "2 ranks x batch 16 vs 1 x 32");

    /* one process, two CPU replicas of batch 16 */
    base_opts(&o, reps);
    o.batch = 16;
    o.replicas = 2;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    fl_test_params_close("6,16,3", one, reps, "2 replicas x batch 16 vs 1 x 32");

    /* four ranks of batch 8 with Adam, against one of 32 */
    base_opts(&o, one);
    o.batch = 32;
    o.opt.kind = FL_OPT_ADAM;
    o.opt.momentum = 0;
    o.lr.lr = 0.01;
    ck_assert_msg(fl_wk_train(NULL, &d, &d, &o, &res) == FL_OK, "%s", fl_last_error());
    base_opts(&a.o, ring);
    a.o.mode = FL_WK_MODE_RING;
    a.o.batch = 8;
    a.o.opt.kind = FL_OPT_ADAM;
    a.o.opt.momentum = 0;
    a.o.lr.lr = 0.01;
    ck_assert_msg(fl_test_run_ranks(4, NULL, ring_rank, &a, err, sizeof err) == FL_OK, "%s", err);
    fl_test_params_close("6,16,3", one, ring, "Adam, 4 ranks x batch 8 vs 1 x 32");
    unlink(one);
    unlink(ring);
    unlink(reps);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_topk_learns)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    ring_arg_t a;
    base_opts(&a.o, NULL);
    a.o.mode = FL_WK_MODE_RING;
    a.o.batch = 16;
    a.o.epochs = 8;
    a.o.shuffle = true;
    a.o.topk = 0.1;
    a.o.topk_values = FL_FLOAT16;
    a.data = &d;
    a.test_acc = 0;
    char err[512] = "";
    ck_assert_msg(fl_test_run_ranks(3, NULL, ring_rank, &a, err, sizeof err) == FL_OK, "%s", err);
    /* chance is 33%; the clusters are easy */
    ck_assert_msg(a.test_acc > 0.9, "top-k training reached only %.1f%%", 100 * a.test_acc);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_metrics_file)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    fl_wk_train_opts_t o;
    base_opts(&o, NULL);
    o.batch = 64;
    o.metrics_path = path;
    fl_wk_train_result_t res;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &res), FL_OK);
    FILE *f = fopen(path, "r");
    ck_assert(f != NULL);
    char line[1024];
    long lines = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (line[0] != '{' || strstr(line, "\"loss\":") == NULL ||
            strstr(line, "\"step\":") == NULL)
            ck_abort_msg("not a metrics line: %s", line);
        lines++;
    }
    fclose(f);
    ck_assert_int_eq(lines, res.steps);
    unlink(path);
    fl_dataset_free(&d);
}
END_TEST

START_TEST(test_model_must_fit_data)
{
    fl_dataset_t d;
    fl_test_clusters(&d, N, 99);
    fl_wk_train_opts_t o;
    base_opts(&o, NULL);
    fl_mlp_parse("7,16,3", &o.shape);
    fl_wk_train_result_t res;
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &res), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "7 inputs") && strstr(fl_last_error(), "6 features"),
                  "%s", fl_last_error());
    fl_mlp_parse("6,16,2", &o.shape);
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &res), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "3 classes"), "%s", fl_last_error());
    fl_mlp_parse("6,16,3", &o.shape);
    o.batch = N + 1; /* more than the replica's share */
    ck_assert_int_eq(fl_wk_train(NULL, &d, &d, &o, &res), FL_EINVAL);
    fl_dataset_free(&d);
}
END_TEST

/* Rank 1 runs another model: the coordinator refuses whichever registers second, naming both
 * signatures; the other one then waits for a rank that never comes (short deadline). */
typedef struct sig_arg {
    fl_comm_opts_t o;
    int rc;
    char err[512];
} sig_arg_t;

static void *sig_main(void *p)
{
    sig_arg_t *a = p;
    fl_comm_t *c = NULL;
    a->rc = fl_comm_init(&a->o, &c);
    snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_comm_destroy(&c);
    return NULL;
}

START_TEST(test_model_signature_refused)
{
    fl_coord_t *coord = fl_test_coord(2, 0);
    sig_arg_t a[2];
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        fl_test_comm_opts(&a[r].o, coord, r, 2);
        a[r].o.model_signature = r == 0 ? 0x1111 : 0x2222;
        a[r].o.rendezvous_timeout_ms = 3000;
        pthread_create(&th[r], NULL, sig_main, &a[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    int refused = -1;
    for (int r = 0; r < 2; r++)
        if (a[r].rc == FL_EINVAL && strstr(a[r].err, "different models") != NULL)
            refused = r;
    ck_assert_msg(refused >= 0, "neither rank was refused: %d '%s' / %d '%s'", a[0].rc, a[0].err,
                  a[1].rc, a[1].err);
    ck_assert_msg(strstr(a[refused].err, "0x0000000000001111") &&
                      strstr(a[refused].err, "0x0000000000002222"),
                  "%s", a[refused].err);
    ck_assert_int_ne(a[1 - refused].rc, FL_OK);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
}
END_TEST

Suite *wk_train_suite(void);
Suite *wk_train_suite(void)
{
    Suite *s = suite_create("wk_train");
    TCase *t = tcase_create("train");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, test_data_parallel_equivalence);
    tcase_add_test(t, test_topk_learns);
    tcase_add_test(t, test_metrics_file);
    tcase_add_test(t, test_model_must_fit_data);
    tcase_add_test(t, test_model_signature_refused);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/flodl-train-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 1;
    int rc = fl_test_run(wk_train_suite());
    rmdir(dir);
    return rc;
}
