/* The device layer's kernels, run for every backend: built as test_dev_kernels for cpu and sim
 * (always), and as test_dev_kernels_gpu (label gpu) for cuda, which skips when no GPU is usable
 * (fails instead with FLODL_REQUIRE_GPU=1). Copies; elementwise kernels and optimizer steps
 * must give the host loops' bits; GEMMs and reductions agree within 1e-5 relative. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fl_dev.h"
#include "devutil.h"

static void expect_rel(const char *what, const float *got, const double *want, size_t n, double rel)
{
    double scale = 0.0;
    for (size_t i = 0; i < n; i++)
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= rel * scale + 1e-30))
            ck_abort_msg("%s[%zu] = %.9g, want %.9g (rel %g of %g)", what, i, (double)got[i],
                         want[i], rel, scale);
}

/* ---- memory and copies ---- */

START_TEST(test_copies)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t n = 100003;
    float *h = randv(n, 1, 1.0);
    float *back = calloc(n, sizeof *back);
    fl_dptr_t a = up(&b, h, n * sizeof(float));
    fl_dptr_t c;
    OK(fl_dev_alloc(b.d, n * sizeof(float), &c));
    OK(fl_dev_d2d(b.s, c, a, n * sizeof(float)));
    OK(fl_dev_memset(b.s, fl_dptr_f32(c, 10), 0, 5 * sizeof(float)));
    down(&b, back, c, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(back[i] == (i >= 10 && i < 15 ? 0.0f : h[i]), "element %zu", i);
    size_t fr;
    size_t tot;
    OK(fl_dev_mem_info(b.d, &fr, &tot));
    ck_assert(tot > 0 && fr <= tot);
    fl_dev_free(b.d, &a);
    fl_dev_free(b.d, &c);
    ck_assert(fl_dptr_is_null(a));
    fl_dev_free(b.d, &a); /* null-safe */
    free(h);
    free(back);
    close_bench(&b);
}
END_TEST

/* The bias gradient of a rows x cols random matrix against the host's loop, bit for bit. */
static void bias_grad_bits(bench_t *b, size_t rows, size_t cols, uint64_t seed, double scale,
                           const char *what)
{
    float *z = randv(rows * cols, seed, scale);
    float *got = malloc(cols * sizeof *got);
    float *want = malloc(cols * sizeof *want);
    ck_assert(got != NULL && want != NULL);
    fl_dptr_t dz = up(b, z, rows * cols * sizeof(float));
    fl_dptr_t db;
    OK(fl_dev_alloc(b->d, cols * sizeof(float), &db));
    OK(fl_dev_bias_grad(b->s, db, dz, rows, cols));
    down(b, got, db, cols * sizeof(float));
    for (size_t j = 0; j < cols; j++) {
        want[j] = 0.0f;
        for (size_t r = 0; r < rows; r++)
            want[j] += z[r * cols + j];
    }
    expect_bits(what, got, want, cols);
    fl_dev_free(b->d, &dz);
    fl_dev_free(b->d, &db);
    free(z);
    free(got);
    free(want);
}

/* ---- elementwise kernels: the host loops' bits ---- */

START_TEST(test_elementwise_bits)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t rows = 37;
    size_t cols = 129;
    size_t n = rows * cols;
    float *z = randv(n, 2, 3.0);
    float *a = randv(n, 3, 1.0);
    float *bias = randv(cols, 4, 1.0);
    float *got = malloc(n * sizeof *got);
    float *want = malloc(n * sizeof *want);
    fl_dptr_t dz = up(&b, z, n * sizeof(float));
    fl_dptr_t da = up(&b, a, n * sizeof(float));
    fl_dptr_t db = up(&b, bias, cols * sizeof(float));

    OK(fl_dev_relu(b.s, dz, n));
    down(&b, got, dz, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        want[i] = z[i] > 0.0f ? z[i] : 0.0f;
    expect_bits("relu", got, want, n);

    OK(fl_dev_h2d(b.s, dz, z, n * sizeof(float)));
    OK(fl_dev_relu_back(b.s, dz, da, n));
    down(&b, got, dz, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        want[i] = a[i] <= 0.0f ? 0.0f : z[i];
    expect_bits("relu backward", got, want, n);

    OK(fl_dev_bias_rows(b.s, dz, db, rows, cols));
    down(&b, got, dz, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        want[i] = bias[i % cols];
    expect_bits("bias rows", got, want, n);

    bias_grad_bits(&b, rows, cols, 2, 3.0, "bias gradient");
    /* Rows over several of cuda's tiles (64 rows, 32 columns), neither a multiple: the sum
     * still runs over the rows in order. */
    bias_grad_bits(&b, 600, 45, 5, 2.0, "bias gradient over tiles");

    OK(fl_dev_h2d(b.s, dz, z, n * sizeof(float)));
    OK(fl_dev_scale(b.s, dz, n, 0.37f));
    OK(fl_dev_axpy(b.s, dz, da, n, -1.7f));
    OK(fl_dev_axpy(b.s, dz, da, n, 1.0f));
    down(&b, got, dz, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        want[i] = z[i] * 0.37f;
        want[i] += -1.7f * a[i];
        want[i] += a[i];
    }
    expect_bits("scale and axpy", got, want, n);

    fl_dev_free(b.d, &dz);
    fl_dev_free(b.d, &da);
    fl_dev_free(b.d, &db);
    free(z);
    free(a);
    free(bias);
    free(got);
    free(want);
    close_bench(&b);
}
END_TEST

/* ---- GEMMs and reductions: within 1e-5 relative of double ---- */

START_TEST(test_gemm)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t B = 33;
    size_t O = 65;
    size_t I = 47;
    float *x = randv(B * I, 5, 1.0);
    float *w = randv(O * I, 6, 1.0);
    float *dz = randv(B * O, 7, 1.0);
    float *z0 = randv(B * O, 8, 1.0);
    double *want = malloc(B * O * I * sizeof *want);
    float *got = malloc(B * O * I * sizeof *got);
    fl_dptr_t px = up(&b, x, B * I * 4);
    fl_dptr_t pw = up(&b, w, O * I * 4);
    fl_dptr_t pdz = up(&b, dz, B * O * 4);
    fl_dptr_t pz = up(&b, z0, B * O * 4);
    fl_dptr_t pgw;
    fl_dptr_t pda;
    OK(fl_dev_alloc(b.d, O * I * 4, &pgw));
    OK(fl_dev_alloc(b.d, B * I * 4, &pda));

    OK(fl_dev_gemm_fwd(b.s, B, O, I, px, pw, 1.0f, pz));
    down(&b, got, pz, B * O * 4);
    for (size_t r = 0; r < B; r++)
        for (size_t o = 0; o < O; o++) {
            double s = z0[r * O + o];
            for (size_t i = 0; i < I; i++)
                s += (double)x[r * I + i] * w[o * I + i];
            want[r * O + o] = s;
        }
    expect_rel("forward", got, want, B * O, 1e-5);

    OK(fl_dev_gemm_wgrad(b.s, B, O, I, pdz, px, pgw));
    down(&b, got, pgw, O * I * 4);
    for (size_t o = 0; o < O; o++)
        for (size_t i = 0; i < I; i++) {
            double s = 0.0;
            for (size_t r = 0; r < B; r++)
                s += (double)dz[r * O + o] * x[r * I + i];
            want[o * I + i] = s;
        }
    expect_rel("weight gradient", got, want, O * I, 1e-5);

    OK(fl_dev_gemm_igrad(b.s, B, O, I, pdz, pw, pda));
    down(&b, got, pda, B * I * 4);
    for (size_t r = 0; r < B; r++)
        for (size_t i = 0; i < I; i++) {
            double s = 0.0;
            for (size_t o = 0; o < O; o++)
                s += (double)dz[r * O + o] * w[o * I + i];
            want[r * I + i] = s;
        }
    expect_rel("input gradient", got, want, B * I, 1e-5);

    fl_dptr_t ps[] = {px, pw, pdz, pz, pgw, pda};
    for (size_t i = 0; i < 6; i++)
        fl_dev_free(b.d, &ps[i]);
    free(x);
    free(w);
    free(dz);
    free(z0);
    free(want);
    free(got);
    close_bench(&b);
}
END_TEST

START_TEST(test_xent_and_reductions)
{
    bench_t b = open_kind(kinds[_i], 0);
    size_t rows = 70;
    size_t c = 10;
    float *logits = randv(rows * c, 9, 4.0);
    int32_t y[70];
    for (size_t r = 0; r < rows; r++)
        y[r] = (int32_t)((r * 7) % c);
    fl_dptr_t pl = up(&b, logits, rows * c * 4);
    fl_dptr_t py = up(&b, y, sizeof y);
    fl_dptr_t pdz;
    fl_dptr_t prow;
    fl_dptr_t pout;
    OK(fl_dev_alloc(b.d, rows * c * 4, &pdz));
    OK(fl_dev_alloc(b.d, rows * sizeof(double), &prow));
    OK(fl_dev_alloc(b.d, 2 * sizeof(double), &pout));
    OK(fl_dev_xent(b.s, pl, py, rows, c, pdz, prow, pout));
    double out[2];
    float dz[700];
    OK(fl_dev_d2h(b.s, dz, pdz, sizeof dz));
    down(&b, out, pout, sizeof out);
    double sum = 0.0;
    double ok = 0.0;
    double want_dz[700];
    for (size_t r = 0; r < rows; r++) {
        const float *z = logits + r * c;
        size_t arg = 0;
        for (size_t j = 1; j < c; j++)
            arg = z[j] > z[arg] ? j : arg;
        ok += arg == (size_t)y[r];
        double se = 0.0;
        for (size_t j = 0; j < c; j++)
            se += exp((double)z[j] - z[arg]);
        double lse = log(se) + z[arg];
        sum += lse - z[y[r]];
        for (size_t j = 0; j < c; j++)
            want_dz[r * c + j] = (exp(z[j] - lse) - (j == (size_t)y[r])) / (double)rows;
    }
    ck_assert_msg(fabs(out[0] - sum) <= 1e-5 * fabs(sum), "loss %.12g, want %.12g", out[0], sum);
    ck_assert_msg(out[1] == ok, "correct %g, want %g", out[1], ok);
    expect_rel("cross-entropy gradient", dz, want_dz, rows * c, 1e-5);

    /* Sum of squares and the first non-finite entry. */
    size_t n = 50001;
    float *x = randv(n, 10, 2.0);
    fl_dptr_t px = up(&b, x, n * 4);
    fl_dptr_t pr;
    OK(fl_dev_alloc(b.d, 16, &pr));
    OK(fl_dev_sumsq(b.s, px, n, pr));
    double ss;
    down(&b, &ss, pr, sizeof ss);
    double want = 0.0;
    for (size_t i = 0; i < n; i++)
        want += (double)x[i] * x[i];
    ck_assert_msg(fabs(ss - want) <= 1e-5 * want, "sum of squares %.12g, want %.12g", ss, want);
    int64_t at;
    OK(fl_dev_nonfinite(b.s, px, n, pr));
    down(&b, &at, pr, sizeof at);
    ck_assert_int_eq(at, -1);
    x[40000] = INFINITY;
    x[31234] = NAN;
    OK(fl_dev_h2d(b.s, px, x, n * 4));
    OK(fl_dev_nonfinite(b.s, px, n, pr));
    down(&b, &at, pr, sizeof at);
    ck_assert_int_eq(at, 31234);
    fl_dptr_t ps[] = {pl, py, pdz, prow, pout, px, pr};
    for (size_t i = 0; i < 7; i++)
        fl_dev_free(b.d, &ps[i]);
    free(logits);
    free(x);
    close_bench(&b);
}
END_TEST

/* ---- the optimizer on a device: fl_opt_step's bits, step after step, saved and loaded ---- */

static void opt_case(bench_t *b, const fl_opt_opts_t *oo, const char *what)
{
    size_t n = 4099;
    float *p = randv(n, 11, 1.0);
    float *hp = malloc(n * sizeof *hp);
    float *got = malloc(n * sizeof *got);
    memcpy(hp, p, n * sizeof *hp);
    fl_opt_t *host = NULL;
    fl_dev_opt_t *dop = NULL;
    OK(fl_opt_create(oo, n, &host));
    OK(fl_dev_opt_create(b->d, oo, n, &dop));
    fl_dptr_t pp = up(b, p, n * 4);
    fl_dptr_t pg;
    OK(fl_dev_alloc(b->d, n * 4, &pg));
    for (int step = 0; step < 5; step++) {
        float *g = randv(n, 100 + (uint64_t)step, 0.5);
        double lr = 0.05 / (step + 1);
        OK(fl_opt_step(host, hp, g, lr));
        OK(fl_dev_h2d(b->s, pg, g, n * 4));
        OK(fl_dev_opt_step(dop, b->s, pp, pg, lr));
        down(b, got, pp, n * 4);
        free(g);
        char name[96];
        snprintf(name, sizeof name, "%s step %d", what, step);
        expect_bits(name, got, hp, n);
        if (step == 2) {
            /* Through a checkpoint: saved into a fresh host optimizer, loaded into a fresh
             * device one, the trajectory goes on unchanged. */
            fl_opt_t *mid = NULL;
            fl_dev_opt_t *d2 = NULL;
            OK(fl_opt_create(oo, n, &mid));
            OK(fl_dev_opt_save(dop, b->s, mid));
            ck_assert_int_eq(fl_opt_steps(mid), 3);
            OK(fl_dev_opt_create(b->d, oo, n, &d2));
            OK(fl_dev_opt_load(d2, b->s, mid));
            fl_dev_opt_destroy(&dop);
            dop = d2;
            fl_opt_destroy(&mid);
        }
    }
    ck_assert_int_eq(fl_dev_opt_step(dop, b->s, pp, pg, -1.0), FL_EINVAL);
    fl_dev_free(b->d, &pp);
    fl_dev_free(b->d, &pg);
    fl_dev_opt_destroy(&dop);
    fl_opt_destroy(&host);
    free(p);
    free(hp);
    free(got);
}

START_TEST(test_optimizers_bits)
{
    bench_t b = open_kind(kinds[_i], 0);
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    opt_case(&b, &o, "sgd");
    o.momentum = 0.9;
    o.weight_decay = 1e-4;
    o.dampening = 0.1;
    opt_case(&b, &o, "sgd momentum dampening decay");
    o.dampening = 0.0;
    o.nesterov = true;
    opt_case(&b, &o, "sgd nesterov");
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAM;
    o.weight_decay = 0.01;
    opt_case(&b, &o, "adam");
    o.kind = FL_OPT_ADAMW;
    opt_case(&b, &o, "adamw");
    close_bench(&b);
}
END_TEST

Suite *dev_kernels_suite(void);
Suite *dev_kernels_suite(void)
{
    Suite *s = suite_create("dev_kernels");
    TCase *t = tcase_create("conformance");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_copies, 0, NKINDS);
    tcase_add_loop_test(t, test_elementwise_bits, 0, NKINDS);
    tcase_add_loop_test(t, test_gemm, 0, NKINDS);
    tcase_add_loop_test(t, test_xent_and_reductions, 0, NKINDS);
    tcase_add_loop_test(t, test_optimizers_bits, 0, NKINDS);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return dev_test_main(dev_kernels_suite);
}
