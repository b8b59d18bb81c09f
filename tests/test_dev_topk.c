/* The device layer's error feedback and top-k, run for every backend (test_dev_topk for cpu and
 * sim, test_dev_topk_gpu for cuda, skipped without a GPU), against what compression's
 * fl_cmp_ef_step does on the host: the residuals of compression/ef.c, and top-k the same set as
 * compression's exact mode (ties included). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/compress.h>

#include "fl_dev.h"
#include "devutil.h"

START_TEST(test_ef_topk_match_compression)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t n = 30011;
    size_t k = 300;
    int wires[] = {FL_WIRE_F32, FL_WIRE_F16, FL_WIRE_BF16};
    fl_dtype_t dts[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16};
    for (int w = 0; w < 3; w++) {
        fl_cmp_ef_opts_t eo;
        fl_cmp_ef_opts_init(&eo);
        eo.n = n;
        eo.momentum = w == 1 ? 0.9f : 0.0f;
        eo.wire = dts[w];
        fl_cmp_ef_t *ef = NULL;
        fl_cmp_ws_t *ws = NULL;
        OK(fl_cmp_ef_create(&eo, &ef));
        OK(fl_cmp_ws_create(&ws));
        fl_dev_topk_t *tk = NULL;
        OK(fl_dev_topk_create(b.d, n, &tk));
        fl_dptr_t v;
        fl_dptr_t u = fl_dptr_null();
        fl_dptr_t pg;
        fl_dptr_t pi;
        fl_dptr_t pv;
        fl_dptr_t po;
        OK(fl_dev_alloc(b.d, n * 4, &v));
        OK(fl_dev_memset(b.s, v, 0, n * 4));
        if (eo.momentum > 0) {
            OK(fl_dev_alloc(b.d, n * 4, &u));
            OK(fl_dev_memset(b.s, u, 0, n * 4));
        }
        OK(fl_dev_alloc(b.d, n * 4, &pg));
        OK(fl_dev_alloc(b.d, k * 4, &pi));
        OK(fl_dev_alloc(b.d, k * 4, &pv));
        OK(fl_dev_alloc(b.d, 16, &po));
        uint32_t hidx[300];
        float hval[300];
        uint32_t didx[300];
        float dval[300];
        for (int step = 0; step < 3; step++) {
            float *g = randv(n, 200 + (uint64_t)(w * 10 + step), 1.0);
            g[17] = g[18] = g[19] = 5.0f; /* ties, broken by index */
            fl_cmp_topk_opts_t to;
            fl_cmp_topk_opts_init(&to);
            to.k = k;
            size_t kout = 0;
            OK(fl_cmp_ef_step(ef, ws, g, &to, hidx, hval, &kout, NULL));
            ck_assert_uint_eq(kout, k);
            OK(fl_dev_h2d(b.s, pg, g, n * 4));
            OK(fl_dev_ef_accum(b.s, v, u, pg, n, eo.momentum, 1.0f));
            OK(fl_dev_topk(b.s, tk, v, n, k, pi, pv, po));
            OK(fl_dev_ef_sent(b.s, v, u, pi, pv, k, n, wires[w]));
            int64_t out[2];
            OK(fl_dev_d2h(b.s, didx, pi, k * 4));
            OK(fl_dev_d2h(b.s, dval, pv, k * 4));
            down(&b, out, po, sizeof out);
            ck_assert_int_eq(out[0], (int64_t)k);
            ck_assert_int_eq(out[1], -1);
            ck_assert_msg(memcmp(hidx, didx, sizeof hidx) == 0, "wire %d step %d: indices", w,
                          step);
            expect_bits("sent values", dval, hval, k);
            free(g);
        }
        const float *res;
        const float *vel;
        size_t rn;
        fl_cmp_ef_state(ef, &res, &vel, &rn);
        float *dres = malloc(n * 4);
        down(&b, dres, v, n * 4);
        expect_bits("residual", dres, res, n);
        /* A NaN: nothing selected, its index reported. */
        float bad[5] = {1, 2, NAN, 4, INFINITY};
        OK(fl_dev_h2d(b.s, pg, bad, sizeof bad));
        OK(fl_dev_topk(b.s, tk, pg, 5, 2, pi, pv, po));
        int64_t out[2];
        down(&b, out, po, sizeof out);
        ck_assert_int_eq(out[0], 0);
        ck_assert_int_eq(out[1], 2);
        free(dres);
        fl_dptr_t ps[] = {v, u, pg, pi, pv, po};
        for (size_t i = 0; i < 6; i++)
            fl_dev_free(b.d, &ps[i]);
        fl_dev_topk_destroy(&tk);
        fl_cmp_ef_destroy(&ef);
        fl_cmp_ws_destroy(&ws);
    }
    close_bench(&b);
}
END_TEST

START_TEST(test_topk_sets)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t n = 200003;
    float *x = randv(n, 300, 1.0);
    for (size_t i = 0; i < n; i += 3)
        x[i] = (i % 2 ? 0.25f : -0.25f); /* many equal magnitudes at the threshold */
    fl_dev_topk_t *tk = NULL;
    OK(fl_dev_topk_create(b.d, n, &tk));
    fl_cmp_ws_t *ws = NULL;
    OK(fl_cmp_ws_create(&ws));
    size_t ks[] = {1, 7, 2000, 90000, n};
    uint32_t *hi = malloc(n * 4);
    float *hv = malloc(n * 4);
    uint32_t *di = malloc(n * 4);
    float *dv = malloc(n * 4);
    fl_dptr_t px = up(&b, x, n * 4);
    fl_dptr_t pi;
    fl_dptr_t pv;
    fl_dptr_t po;
    OK(fl_dev_alloc(b.d, n * 4, &pi));
    OK(fl_dev_alloc(b.d, n * 4, &pv));
    OK(fl_dev_alloc(b.d, 16, &po));
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        fl_cmp_topk_opts_t to;
        fl_cmp_topk_opts_init(&to);
        to.k = ks[t];
        size_t kh = 0;
        OK(fl_cmp_topk(ws, x, n, &to, hi, hv, &kh));
        OK(fl_dev_topk(b.s, tk, px, n, ks[t], pi, pv, po));
        int64_t out[2];
        OK(fl_dev_d2h(b.s, di, pi, ks[t] * 4));
        OK(fl_dev_d2h(b.s, dv, pv, ks[t] * 4));
        down(&b, out, po, sizeof out);
        ck_assert_int_eq(out[0], (int64_t)kh);
        ck_assert_msg(memcmp(hi, di, kh * 4) == 0, "k %zu: another set", ks[t]);
        expect_bits("top-k values", dv, hv, kh);
    }
    fl_dptr_t ps[] = {px, pi, pv, po};
    for (size_t i = 0; i < 4; i++)
        fl_dev_free(b.d, &ps[i]);
    fl_dev_topk_destroy(&tk);
    fl_cmp_ws_destroy(&ws);
    free(x);
    free(hi);
    free(hv);
    free(di);
    free(dv);
    close_bench(&b);
}
END_TEST

Suite *dev_topk_suite(void);
Suite *dev_topk_suite(void)
{
    Suite *s = suite_create("dev_topk");
    TCase *t = tcase_create("conformance");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_ef_topk_match_compression, 0, NKINDS);
    tcase_add_loop_test(t, test_topk_sets, 0, NKINDS);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return dev_test_main(dev_topk_suite);
}
