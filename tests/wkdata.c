/* Helpers of the worker suites (see wkdata.h). */
#include "wkdata.h"

#include <check.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/coordinator.h>

#include "testutil.h"

void fl_test_clusters(fl_dataset_t *d, size_t n, uint64_t seed)
{
    enum { DIM = 6, CLASSES = 3 };
    memset(d, 0, sizeof *d);
    d->n = n;
    d->dim = DIM;
    d->classes = CLASSES;
    d->x = malloc(n * DIM * sizeof *d->x);
    d->y = malloc(n * sizeof *d->y);
    ck_assert(d->x != NULL && d->y != NULL);
    snprintf(d->source, sizeof d->source, "test clusters");
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        int c = (int)(i % CLASSES);
        d->y[i] = c;
        for (size_t j = 0; j < DIM; j++)
            d->x[i * DIM + j] =
                (float)((j % CLASSES == (size_t)c ? 1.5 : -0.5) + 0.8 * fl_test_uniform(&s));
    }
}

double fl_test_params_diff(const char *layers, const char *a, const char *b)
{
    fl_mlp_shape_t m;
    ck_assert(fl_mlp_parse(layers, &m) == FL_OK);
    size_t n = fl_mlp_nparams(&m);
    float *pa = malloc(n * sizeof *pa);
    float *pb = malloc(n * sizeof *pb);
    ck_assert(pa != NULL && pb != NULL);
    ck_assert_msg(fl_mlp_load(&m, pa, a) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_mlp_load(&m, pb, b) == FL_OK, "%s", fl_last_error());
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)pa[i] - pb[i]) / (1e-3 + fabs((double)pa[i]));
        worst = d > worst ? d : worst;
    }
    free(pa);
    free(pb);
    return worst;
}

void fl_test_params_close(const char *layers, const char *a, const char *b, const char *what)
{
    double worst = fl_test_params_diff(layers, a, b);
    ck_assert_msg(worst < 1e-4, "%s: parameters differ by %.3g (relative)", what, worst);
}

/* ---- W ranks as threads, each its own host address ---- */

typedef struct host_arg {
    fl_comm_opts_t co;
    char host[32];
    fl_wk_train_opts_t o;
    const fl_dataset_t *data;
    fl_wk_train_result_t res;
    int rc;
    char err[1024];
} host_arg_t;

static void *host_main(void *p)
{
    host_arg_t *a = p;
    fl_comm_t *comm = NULL;
    a->rc = fl_comm_init(&a->co, &comm);
    if (a->rc == FL_OK)
        a->rc = fl_wk_train(comm, a->data, a->data, &a->o, &a->res);
    if (a->rc != FL_OK)
        snprintf(a->err, sizeof a->err, "%s", fl_last_error());
    fl_comm_destroy(&comm);
    return NULL;
}

/* Trains on W "hosts" with the options o (replicas[r] devices on rank r when replicas is not
 * NULL); res[r] gets each rank's result. Returns the first error (its text in err). */
int fl_test_run_hosts(int W, const fl_wk_train_opts_t *o, const int *replicas,
                      const fl_dataset_t *d, fl_wk_train_result_t *res, char *err, size_t cap)
{
    fl_coord_t *coord = fl_test_coord(W, 0);
    static host_arg_t args[FL_TEST_MAX_HOSTS];
    pthread_t th[FL_TEST_MAX_HOSTS];
    for (int r = 0; r < W; r++) {
        host_arg_t *a = &args[r];
        memset(a, 0, sizeof *a);
        fl_test_comm_opts(&a->co, coord, r, W);
        snprintf(a->host, sizeof a->host, "127.0.0.%d", r + 1);
        a->co.host = a->host;
        a->co.timeout_ms = 15000;
        a->o = *o;
        if (replicas != NULL)
            a->o.replicas = replicas[r];
        a->data = d;
        ck_assert(pthread_create(&th[r], NULL, host_main, a) == 0);
    }
    for (int r = 0; r < W; r++)
        pthread_join(th[r], NULL);
    fl_coord_stop(coord);
    fl_coord_destroy(&coord);
    int rc = FL_OK;
    for (int r = 0; r < W; r++) {
        if (res != NULL)
            res[r] = args[r].res;
        if (args[r].rc != FL_OK && rc == FL_OK) {
            rc = args[r].rc;
            snprintf(err, cap, "rank %d: %s", r, args[r].err);
        }
    }
    return rc;
}
