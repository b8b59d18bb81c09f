/* Helpers of the worker suites (see wkdata.h). */
#include "wkdata.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

void fl_test_clusters(fl_wk_dataset_t *d, size_t n, uint64_t seed)
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
            d->x[i * DIM + j] = (float)((j % CLASSES == (size_t)c ? 1.5 : -0.5) +
                                        0.8 * fl_test_uniform(&s));
    }
}

double fl_test_params_diff(const char *layers, const char *a, const char *b)
{
    fl_wk_mlp_shape_t m;
    ck_assert(fl_wk_mlp_parse(layers, &m) == FL_OK);
    size_t n = fl_wk_mlp_nparams(&m);
    float *pa = malloc(n * sizeof *pa);
    float *pb = malloc(n * sizeof *pb);
    ck_assert(pa != NULL && pb != NULL);
    ck_assert_msg(fl_wk_mlp_load(&m, pa, a) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_wk_mlp_load(&m, pb, b) == FL_OK, "%s", fl_last_error());
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
