/* The MLP on the CPU: parsing and the flat parameter layout (PyTorch's order), initialisation
 * bounds, the analytic gradient against central finite differences (in double, on a small
 * model), the layer-done callback order, evaluation, and the safetensors round trip with its
 * refusals (missing tensor, wrong shape, wrong dtype, extra tensors). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_wk.h"
#include "testutil.h"

START_TEST(test_parse_and_layout)
{
    fl_mlp_shape_t m;
    ck_assert_int_eq(fl_mlp_parse("784,512,256,10", &m), FL_OK);
    ck_assert_int_eq(m.nlayers, 3);
    /* PyTorch order: w0 [512,784], b0 [512], w1 [256,512], b1, w2 [10,256], b2 */
    ck_assert_uint_eq(fl_mlp_weight_at(&m, 0), 0);
    ck_assert_uint_eq(fl_mlp_bias_at(&m, 0), 512 * 784);
    ck_assert_uint_eq(fl_mlp_weight_at(&m, 1), 512 * 784 + 512);
    ck_assert_uint_eq(fl_mlp_bias_at(&m, 2), 512 * 785 + 256 * 513 + 10 * 256);
    ck_assert_uint_eq(fl_mlp_nparams(&m), 512 * 785 + 256 * 513 + 10 * 257);

    static const char *const bad[] = {
        "",      "10",  "10,",
        "10,,5", "0,5", "-3,5",
        "10;5",  "a,b", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (fl_mlp_parse(bad[i], &m) != FL_EINVAL)
            ck_abort_msg("'%s' parsed", bad[i]);
    }
    ck_assert_int_eq(fl_mlp_parse("1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", &m), FL_OK);
}
END_TEST

START_TEST(test_signature)
{
    fl_mlp_shape_t a, b, c;
    fl_mlp_parse("64,256,128,10", &a);
    fl_mlp_parse("64,256,128,10", &b);
    fl_mlp_parse("64,128,256,10", &c);
    ck_assert(fl_mlp_signature(&a) == fl_mlp_signature(&b));
    ck_assert(fl_mlp_signature(&a) != fl_mlp_signature(&c));
    ck_assert(fl_mlp_signature(&a) != 0);
}
END_TEST

START_TEST(test_init)
{
    fl_mlp_shape_t m;
    fl_mlp_parse("100,50,10", &m);
    size_t n = fl_mlp_nparams(&m);
    float *p = malloc(n * sizeof *p);
    float *q = malloc(n * sizeof *q);
    fl_mlp_init(&m, p, 7);
    fl_mlp_init(&m, q, 7);
    ck_assert(memcmp(p, q, n * sizeof *p) == 0);
    fl_mlp_init(&m, q, 8);
    ck_assert(memcmp(p, q, n * sizeof *p) != 0);
    /* nn.Linear's default: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias */
    for (int l = 0; l < m.nlayers; l++) {
        double bound = 1.0 / sqrt((double)m.sizes[l]);
        size_t from = fl_mlp_weight_at(&m, l);
        size_t to = fl_mlp_weight_at(&m, l + 1);
        double mean = 0;
        double sq = 0;
        for (size_t i = from; i < to; i++) {
            if (fabs(p[i]) > bound)
                ck_abort_msg("layer %d: %g beyond %g", l, (double)p[i], bound);
            mean += p[i];
            sq += (double)p[i] * p[i];
        }
        mean /= (double)(to - from);
        double var = sq / (double)(to - from);
        /* uniform on [-b, b]: mean 0, variance b^2 / 3 */
        ck_assert_msg(fabs(mean) < 0.05 * bound, "layer %d mean %g", l, mean);
        ck_assert_msg(fabs(var / (bound * bound / 3.0) - 1.0) < 0.1, "layer %d var %g", l, var);
    }
    free(p);
    free(q);
}
END_TEST

static int order[FL_MLP_MAX_LAYERS];
static int norder;

static void record(int layer, void *ud)
{
    (void)ud;
    order[norder++] = layer;
}

/* Central differences of the loss computed through fl_mlp_eval, parameter by parameter. */
START_TEST(test_gradient_check)
{
    fl_mlp_shape_t m;
    fl_mlp_parse("9,7,5,4", &m);
    size_t n = fl_mlp_nparams(&m);
    const size_t b = 8;
    float *p = malloc(n * sizeof *p);
    float *g = malloc(n * sizeof *g);
    float x[8 * 9];
    int32_t y[8];
    uint64_t s = 3;
    fl_mlp_init(&m, p, 11);
    for (size_t i = 0; i < b * 9; i++)
        x[i] = (float)fl_test_uniform(&s) * 2.0f;
    for (size_t i = 0; i < b; i++)
        y[i] = (int32_t)(i % 4);
    fl_mlp_ws_t *ws;
    ck_assert_int_eq(fl_mlp_ws_create(&m, b, &ws), FL_OK);
    double loss;
    size_t correct;
    norder = 0;
    ck_assert_int_eq(fl_mlp_grad(&m, ws, p, x, y, b, g, &loss, &correct, record, NULL), FL_OK);
    ck_assert_int_eq(norder, 3);
    ck_assert(order[0] == 2 && order[1] == 1 && order[2] == 0); /* last layer first */
    ck_assert(isfinite(loss) && loss > 0.0);

    /* Central differences at two step sizes: where they disagree, a step crossed a ReLU kink
     * for some sample and the difference quotient means nothing there; such parameters are
     * skipped, and there must be few. */
    double worst = 0.0;
    size_t at = 0;
    size_t kinks = 0;
    for (size_t i = 0; i < n; i++) {
        double fd[2];
        const float hs[2] = {4e-3f, 2e-3f};
        for (int k = 0; k < 2; k++) {
            float orig = p[i];
            double lp, lm;
            size_t c;
            p[i] = orig + hs[k];
            fl_mlp_eval(&m, ws, p, x, y, b, &lp, &c);
            p[i] = orig - hs[k];
            fl_mlp_eval(&m, ws, p, x, y, b, &lm, &c);
            p[i] = orig;
            fd[k] = (lp - lm) / (2.0 * (double)hs[k]);
        }
        double scale = fabs(fd[1]) + fabs((double)g[i]) + 1e-2;
        if (fabs(fd[0] - fd[1]) > 0.05 * scale) {
            kinks++;
            continue;
        }
        double err = fabs(fd[1] - (double)g[i]) / scale;
        if (err > worst) {
            worst = err;
            at = i;
        }
    }
    ck_assert_msg(kinks <= n / 10, "%zu of %zu parameters sit at a kink", kinks, n);
    ck_assert_msg(worst < 1e-2, "parameter %zu: analytic and numeric gradients differ by %.3g", at,
                  worst);
    /* The same data through eval gives the same loss as grad. */
    double le;
    size_t ce;
    fl_mlp_eval(&m, ws, p, x, y, b, &le, &ce);
    ck_assert(fabs(le - loss) < 1e-6 * (1.0 + loss));
    ck_assert_uint_eq(ce, correct);
    /* Bad labels and oversized batches are refused. */
    y[3] = 4;
    ck_assert_int_eq(fl_mlp_grad(&m, ws, p, x, y, b, g, &loss, &correct, NULL, NULL), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "label 4") != NULL, "%s", fl_last_error());
    y[3] = 3;
    ck_assert_int_eq(fl_mlp_grad(&m, ws, p, x, y, b + 1, g, &loss, &correct, NULL, NULL),
                     FL_EINVAL);
    fl_mlp_ws_destroy(&ws);
    free(p);
    free(g);
}
END_TEST

START_TEST(test_save_load)
{
    char dir[] = "/tmp/flodl-mlp-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    fl_mlp_shape_t m, other;
    fl_mlp_parse("12,8,3", &m);
    size_t n = fl_mlp_nparams(&m);
    float *p = malloc(n * sizeof *p);
    float *q = calloc(n, sizeof *q);
    fl_mlp_init(&m, p, 5);
    fl_st_meta_t meta = {"flodl.step", "42"};
    ck_assert_msg(fl_mlp_save(&m, p, path, &meta, 1) == FL_OK, "%s", fl_last_error());
    ck_assert_msg(fl_mlp_load(&m, q, path) == FL_OK, "%s", fl_last_error());
    ck_assert(memcmp(p, q, n * sizeof *p) == 0);

    fl_st_file_t *f;
    ck_assert_int_eq(fl_st_open(path, 0, &f), FL_OK);
    const fl_st_tensor_t *w0 = fl_st_find(f, "layers.0.weight");
    ck_assert(w0 != NULL && w0->ndim == 2 && w0->shape[0] == 8 && w0->shape[1] == 12);
    ck_assert(fl_st_find(f, "layers.1.bias") != NULL);
    ck_assert_str_eq(fl_st_meta_get(f, "flodl.step"), "42");
    fl_st_close(&f);

    /* Another model: the shape mismatch names the tensor and both shapes. */
    fl_mlp_parse("12,9,3", &other);
    float *r = calloc(fl_mlp_nparams(&other), sizeof *r);
    ck_assert_int_eq(fl_mlp_load(&other, r, path), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "layers.0.weight") && strstr(fl_last_error(), "8,12"),
                  "%s", fl_last_error());
    fl_mlp_parse("12,8,3,2", &other);
    free(r);
    r = calloc(fl_mlp_nparams(&other), sizeof *r);
    ck_assert_int_eq(fl_mlp_load(&other, r, path), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "layers.2.weight"), "%s", fl_last_error());
    fl_mlp_parse("12,3", &other);
    ck_assert_int_eq(fl_mlp_load(&other, r, path), FL_EINVAL); /* extra tensors */

    /* float64 weights are refused, naming the dtype. */
    double wd[8 * 12] = {0};
    fl_st_tensor_t t[4] = {
        {"layers.0.weight", FL_FLOAT64, 2, {8, 12}, wd, sizeof wd},
        {"layers.0.bias", FL_FLOAT32, 1, {8}, p, 8 * sizeof(float)},
        {"layers.1.weight", FL_FLOAT32, 2, {3, 8}, p, 24 * sizeof(float)},
        {"layers.1.bias", FL_FLOAT32, 1, {3}, p, 3 * sizeof(float)},
    };
    ck_assert_int_eq(fl_st_write(path, t, 4, NULL, 0), FL_OK);
    ck_assert_int_eq(fl_mlp_load(&m, q, path), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "float64"), "%s", fl_last_error());
    unlink(path);
    ck_assert_int_eq(fl_mlp_load(&m, q, path), FL_EIO);
    rmdir(dir);
    free(p);
    free(q);
    free(r);
}
END_TEST

Suite *wk_mlp_suite(void);
Suite *wk_mlp_suite(void)
{
    Suite *s = suite_create("wk_mlp");
    TCase *t = tcase_create("mlp");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, test_parse_and_layout);
    tcase_add_test(t, test_signature);
    tcase_add_test(t, test_init);
    tcase_add_test(t, test_gradient_check);
    tcase_add_test(t, test_save_load);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(wk_mlp_suite());
}
