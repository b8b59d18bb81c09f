/* The device layer's conformance suite, run for every backend: built as test_dev for cpu and
 * sim (always), and as test_dev_gpu (label gpu) for cuda, which skips when no GPU is usable
 * (fails instead with FLODL_REQUIRE_GPU=1). Elementwise kernels and optimizer steps must give
 * the host loops' bits; GEMMs and reductions agree within 1e-5 relative; top-k picks the set of
 * compression's exact mode. Then the ordering language (streams, events, deadlines, sticky
 * errors) and sim's own checks (an address outside device memory, a full arena). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <flodl/compress.h>

#include "fl_dev.h"
#include "testutil.h"

#ifdef DEV_TEST_CUDA
static const fl_dev_kind_t kinds[] = {FL_DEV_CUDA};
#else
static const fl_dev_kind_t kinds[] = {FL_DEV_CPU, FL_DEV_SIM};
#endif
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

typedef struct bench {
    fl_dev_t *d;
    fl_stream_t *s;
} bench_t;

static bench_t open_kind(fl_dev_kind_t k, int jitter_us)
{
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = k;
    o.sim_jitter_us = jitter_us;
    bench_t b = {0};
    int rc = fl_dev_create(&o, &b.d);
    ck_assert_msg(rc == FL_OK, "%s: %s", fl_dev_kind_name(k), fl_last_error());
    rc = fl_stream_create(b.d, &b.s);
    ck_assert_msg(rc == FL_OK, "stream: %s", fl_last_error());
    return b;
}

static void close_bench(bench_t *b)
{
    fl_stream_destroy(&b->s);
    fl_dev_destroy(&b->d);
}

#define OK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        ck_assert_msg(rc_ == FL_OK, "%s: %s: %s", #call, fl_strerror(rc_), fl_last_error());       \
    } while (0)

/* A device buffer holding host data. */
static fl_dptr_t up(bench_t *b, const void *h, size_t bytes)
{
    fl_dptr_t p;
    OK(fl_dev_alloc(b->d, bytes, &p));
    OK(fl_dev_h2d(b->s, p, h, bytes));
    return p;
}

static void down(bench_t *b, void *h, fl_dptr_t p, size_t bytes)
{
    OK(fl_dev_d2h(b->s, h, p, bytes));
    OK(fl_stream_sync(b->s, 10000));
}

static float *randv(size_t n, uint64_t seed, double scale)
{
    float *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(fl_test_uniform(&seed) * scale);
    return v;
}

static void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            ck_abort_msg("%s[%zu] = %a, the host loop gives %a", what, i, (double)got[i],
                         (double)want[i]);
}

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

/* ---- error feedback and top-k: what compression's fl_cmp_ef_step does on the host ---- */

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

/* ---- ordering: events hand work between streams; waits are bounded ---- */

START_TEST(test_events_order_streams)
{
    /* sim with jitter: without the event, the copy would race the long chain of updates. */
    bench_t b = open_kind(kinds[_i], 200);
    fl_stream_t *s2 = NULL;
    fl_event_t *e = NULL;
    OK(fl_stream_create(b.d, &s2));
    OK(fl_event_create(b.d, &e));
    ck_assert(fl_event_done(e)); /* never recorded */
    size_t n = 1 << 16;
    float *h = calloc(n, sizeof *h);
    float *one = malloc(n * sizeof *one);
    for (size_t i = 0; i < n; i++)
        one[i] = 1.0f;
    fl_dptr_t acc = up(&b, h, n * 4);
    fl_dptr_t ones = up(&b, one, n * 4);
    fl_dptr_t snap;
    OK(fl_dev_alloc(b.d, n * 4, &snap));
    for (int r = 0; r < 20; r++)
        OK(fl_dev_axpy(b.s, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_d2d(s2, snap, acc, n * 4));
    OK(fl_dev_d2h(s2, h, snap, n * 4));
    OK(fl_event_record(e, s2));
    OK(fl_event_sync(e, 10000));
    ck_assert(fl_event_done(e));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(h[i] == 20.0f, "element %zu = %g: the copy ran before the updates", i,
                      (double)h[i]);
    fl_dptr_t ps[] = {acc, ones, snap};
    for (size_t i = 0; i < 3; i++)
        fl_dev_free(b.d, &ps[i]);
    fl_event_destroy(&e);
    fl_stream_destroy(&s2);
    free(h);
    free(one);
    close_bench(&b);
}
END_TEST

/* Timed events: the time between two records' completions (cuda's cudaEventElapsedTime, the
 * host clock at completion on cpu and sim), for El Che's batch times; refused for an event
 * without timing, never recorded, or of another device. */
START_TEST(test_event_elapsed)
{
    bench_t b = open_kind(kinds[_i], 200);
    fl_event_t *t0 = NULL;
    fl_event_t *t1 = NULL;
    fl_event_t *plain = NULL;
    OK(fl_event_create_timed(b.d, &t0));
    OK(fl_event_create_timed(b.d, &t1));
    OK(fl_event_create(b.d, &plain));
    double ms = -1.0;
    ck_assert_int_eq(fl_event_elapsed_ms(t0, t1, &ms), FL_EINVAL); /* never recorded */
    size_t n = 1 << 16;
    float *h = calloc(n, sizeof *h);
    fl_dptr_t acc = up(&b, h, n * 4);
    OK(fl_event_record(t0, b.s));
    for (int r = 0; r < 20; r++)
        OK(fl_dev_axpy(b.s, acc, acc, n, 1.0f));
    OK(fl_event_record(t1, b.s));
    OK(fl_event_record(plain, b.s));
    OK(fl_event_sync(t1, 10000));
    OK(fl_event_elapsed_ms(t0, t1, &ms));
    ck_assert_msg(ms >= 0.0 && ms < 1e7, "elapsed %g ms", ms); /* end after start */
    OK(fl_event_elapsed_ms(t1, t1, &ms));
    ck_assert(ms == 0.0);
    ck_assert_int_eq(fl_event_elapsed_ms(t0, plain, &ms), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "timing") != NULL, "%s", fl_last_error());
    fl_dev_free(b.d, &acc);
    fl_event_destroy(&t0);
    fl_event_destroy(&t1);
    fl_event_destroy(&plain);
    free(h);
    close_bench(&b);
}
END_TEST

/* ---- between the devices of one host: a peer copy behind another device's event, and the
 *      intra-host reduction's kernel (rows summed in order: the host loop's bits) ---- */

START_TEST(test_peer_and_sum_rows)
{
    /* Two devices of the kind (cuda: both on GPU 0, as --gpus 0,0), jitter on sim. */
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = kinds[_i];
    o.sim_jitter_us = 200;
    fl_dev_t *d1 = NULL;
    bench_t b = open_kind(kinds[_i], 200);
    if (o.kind == FL_DEV_SIM)
        o.id = 1;
    OK(fl_dev_create(&o, &d1));
    fl_stream_t *s1 = NULL;
    fl_event_t *e1 = NULL;
    OK(fl_stream_create(d1, &s1));
    OK(fl_event_create(d1, &e1));
    size_t cols = 1001;
    size_t rows = 3;
    size_t n = cols * rows;
    float *h = randv(n, 11, 5.0);
    float *one = malloc(cols * sizeof *one);
    for (size_t i = 0; i < cols; i++)
        one[i] = 1.0f;
    /* Device 1 writes its row slowly; device 0 copies it behind the event. */
    fl_dptr_t src;
    fl_dptr_t ones;
    OK(fl_dev_alloc(d1, cols * 4, &src));
    OK(fl_dev_alloc(d1, cols * 4, &ones));
    OK(fl_dev_h2d(s1, src, h + cols, cols * 4));
    OK(fl_dev_h2d(s1, ones, one, cols * 4));
    for (int r = 0; r < 8; r++)
        OK(fl_dev_axpy(s1, src, ones, cols, 1.0f));
    OK(fl_event_record(e1, s1));
    fl_dptr_t in = up(&b, h, n * 4);
    OK(fl_stream_wait(b.s, e1));
    OK(fl_dev_peer_copy(b.s, fl_dptr_f32(in, cols), d1, src, cols * 4));
    /* What the rows hold then (h itself stays as the queued copies read it). */
    float *rowv = malloc(n * sizeof *rowv);
    memcpy(rowv, h, n * sizeof *rowv);
    for (size_t i = 0; i < cols; i++)
        for (int r = 0; r < 8; r++)
            rowv[cols + i] += 1.0f;
    fl_dptr_t out;
    OK(fl_dev_alloc(b.d, cols * 4, &out));
    float *got = malloc(cols * sizeof *got);
    float *want = malloc(cols * sizeof *want);
    float alphas[] = {1.0f, 1.0f / 3.0f};
    for (int a = 0; a < 2; a++) {
        OK(fl_dev_sum_rows(b.s, out, in, cols, rows, alphas[a]));
        down(&b, got, out, cols * 4);
        for (size_t i = 0; i < cols; i++) {
            float sum = (rowv[i] + rowv[cols + i]) + rowv[2 * cols + i];
            want[i] = a == 0 ? sum : sum * alphas[a];
            ck_assert_msg(fl_sum_rows(rowv, cols, rows, i, alphas[a]) == want[i], "fl_sum_rows");
        }
        expect_bits("sum of rows", got, want, cols);
    }
    /* One row is a copy; zero columns queue nothing; zero rows are refused. */
    OK(fl_dev_sum_rows(b.s, out, in, cols, 1, 1.0f));
    down(&b, got, out, cols * 4);
    expect_bits("sum of one row", got, rowv, cols);
    OK(fl_dev_sum_rows(b.s, out, in, 0, rows, 1.0f));
    ck_assert_int_eq(fl_dev_sum_rows(b.s, out, in, cols, 0, 1.0f), FL_EINVAL);
    if (kinds[_i] == FL_DEV_SIM) {
        /* The source checked against the peer's memory: device 0's own address is not in it. */
        OK(fl_dev_peer_copy(b.s, out, d1, in, 16));
        ck_assert_int_eq(fl_stream_sync(b.s, 10000), FL_EINVAL);
        ck_assert_msg(strstr(fl_last_error(), "device peer copy") &&
                          strstr(fl_last_error(), "outside device memory of sim:1"),
                      "%s", fl_last_error());
    }
    fl_dev_free(b.d, &in);
    fl_dev_free(b.d, &out);
    fl_dev_free(d1, &src);
    fl_dev_free(d1, &ones);
    fl_event_destroy(&e1);
    fl_stream_destroy(&s1);
    close_bench(&b);
    fl_dev_destroy(&d1);
    free(h);
    free(rowv);
    free(one);
    free(got);
    free(want);
}
END_TEST

#ifndef DEV_TEST_CUDA
/* Devices of different kinds share no memory and no events. */
START_TEST(test_peer_refusals)
{
    bench_t c = open_kind(FL_DEV_CPU, 0);
    bench_t s = open_kind(FL_DEV_SIM, 0);
    fl_event_t *e = NULL;
    OK(fl_event_create(c.d, &e));
    ck_assert_int_eq(fl_stream_wait(s.s, e), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "an event of cpu") != NULL, "%s", fl_last_error());
    fl_dptr_t p;
    OK(fl_dev_alloc(s.d, 64, &p));
    ck_assert_int_eq(fl_dev_peer_copy(s.s, p, c.d, p, 64), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "another kind") != NULL, "%s", fl_last_error());
    void *host = NULL;
    ck_assert_int_eq(fl_dev_unwrap(s.d, p, &host), FL_EINVAL);
    float x[2];
    fl_dptr_t w;
    OK(fl_dev_wrap(c.d, x, &w));
    OK(fl_dev_unwrap(c.d, w, &host));
    ck_assert_ptr_eq(host, x);
    ck_assert_ptr_null(fl_stream_native(s.s));
    fl_dev_free(s.d, &p);
    fl_event_destroy(&e);
    close_bench(&s);
    close_bench(&c);
}
END_TEST
#endif

/* ---- misuse is refused with a clear error ---- */

START_TEST(test_refusals)
{
    bench_t b = open_kind(kinds[_i], 0);
    fl_dptr_t p;
    OK(fl_dev_alloc(b.d, 64, &p));
    ck_assert_int_eq(fl_dev_relu(b.s, fl_dptr_null(), 4), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "null") != NULL);
    fl_dev_topk_t *tk = NULL;
    ck_assert_int_eq(fl_dev_topk_create(b.d, 0, &tk), FL_EINVAL);
    OK(fl_dev_topk_create(b.d, 16, &tk));
    ck_assert_int_eq(fl_dev_topk(b.s, tk, p, 17, 1, p, p, p), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "workspace for 16") != NULL);
    ck_assert_int_eq(fl_dev_ef_sent(b.s, p, fl_dptr_null(), p, p, 1, 16, 7), FL_EINVAL);
    fl_dev_topk_destroy(&tk);
    fl_dev_free(b.d, &p);
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = kinds[_i];
    o.timeout_ms = 0;
    fl_dev_t *d = NULL;
    ck_assert_int_eq(fl_dev_create(&o, &d), FL_EINVAL);
    ck_assert(strstr(fl_last_error(), "timeout_ms") != NULL);
    close_bench(&b);
}
END_TEST

#ifndef DEV_TEST_CUDA
/* sim checks every address against its arena: an overrun fails the stream, sticky, and says
 * which operation and address; a full arena says how much was asked and is free. */
START_TEST(test_sim_guards)
{
    fl_dev_opts_t o;
    fl_dev_opts_init(&o);
    o.kind = FL_DEV_SIM;
    o.mem_bytes = 1 << 20;
    fl_dev_t *d = NULL;
    OK(fl_dev_create(&o, &d));
    ck_assert_str_eq(fl_dev_name(d), "sim:0");
    fl_stream_t *s = NULL;
    OK(fl_stream_create(d, &s));
    fl_dptr_t p;
    OK(fl_dev_alloc(d, 1000, &p));
    fl_dptr_t q;
    ck_assert_int_eq(fl_dev_alloc(d, 1 << 20, &q), FL_ENOMEM);
    ck_assert_msg(strstr(fl_last_error(), "1048576 bytes asked") != NULL, "%s", fl_last_error());
    OK(fl_dev_relu(s, fl_dptr_at(p, 512), 200)); /* 800 bytes from 512: past the end */
    OK(fl_dev_memset(s, p, 0, 1000));            /* skipped: the stream already failed */
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "ReLU") && strstr(fl_last_error(), "outside device"),
                  "%s", fl_last_error());
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL); /* sticky */
    fl_stream_destroy(&s);
    /* A host buffer passed as device memory is refused too. */
    OK(fl_stream_create(d, &s));
    float host[4] = {0};
    fl_dptr_t fake = {host};
    OK(fl_dev_relu(s, fake, 4));
    ck_assert_int_eq(fl_stream_sync(s, 5000), FL_EINVAL);
    fl_stream_destroy(&s);
    fl_dev_free(d, &p);
    size_t fr;
    size_t tot;
    OK(fl_dev_mem_info(d, &fr, &tot));
    ck_assert_uint_eq(fr, tot);
    fl_dev_destroy(&d);
}
END_TEST
#endif

#ifndef DEV_TEST_CUDA
/* sim's events as CUDA's: a failure on the recording stream reaches the streams waiting for
 * it; a record moved to another stream does not release the waits of the first one early; an
 * event destroyed with a wait still queued on another stream is kept until the wait ran. */
START_TEST(test_sim_events)
{
    bench_t b = open_kind(FL_DEV_SIM, 300);
    fl_stream_t *s2 = NULL;
    fl_stream_t *s3 = NULL;
    fl_event_t *e = NULL;
    OK(fl_stream_create(b.d, &s2));
    OK(fl_stream_create(b.d, &s3));
    OK(fl_event_create(b.d, &e));
    size_t n = 1 << 14;
    float *h = calloc(n, sizeof *h);
    float *one = malloc(n * sizeof *one);
    for (size_t i = 0; i < n; i++)
        one[i] = 1.0f;
    fl_dptr_t acc = up(&b, h, n * 4);
    fl_dptr_t ones = up(&b, one, n * 4);
    OK(fl_stream_sync(b.s, 10000));
    for (int r = 0; r < 30; r++)
        OK(fl_dev_axpy(b.s, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_d2h(s2, h, acc, n * 4));
    OK(fl_event_record(e, s3)); /* moved to an idle stream at once */
    OK(fl_stream_sync(s2, 10000));
    ck_assert_msg(h[0] == 30.0f && h[n - 1] == 30.0f, "the wait passed early: %g",
                  (double)h[0]);

    /* A failure on the recording stream. */
    float host[4] = {0};
    fl_dptr_t fake = {host};
    OK(fl_dev_relu(s3, fake, 4));
    OK(fl_event_record(e, s3));
    OK(fl_stream_wait(s2, e));
    OK(fl_dev_memset(s2, acc, 0, 4));
    ck_assert_int_eq(fl_stream_sync(s2, 10000), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "outside device memory") != NULL, "%s",
                  fl_last_error());

    /* Destroyed with a wait queued behind other work on another stream. */
    fl_stream_t *s4 = NULL;
    OK(fl_stream_create(b.d, &s4));
    for (int r = 0; r < 10; r++)
        OK(fl_dev_axpy(s4, acc, ones, n, 1.0f));
    OK(fl_event_record(e, b.s));
    OK(fl_stream_wait(s4, e));
    fl_event_destroy(&e);
    OK(fl_stream_sync(s4, 10000));
    fl_stream_destroy(&s4);
    fl_stream_destroy(&s2);
    fl_stream_destroy(&s3);
    fl_dev_free(b.d, &acc);
    fl_dev_free(b.d, &ones);
    free(h);
    free(one);
    close_bench(&b);
}
END_TEST
#endif

Suite *dev_suite(void);
Suite *dev_suite(void)
{
    Suite *s = suite_create("dev");
    TCase *t = tcase_create("conformance");
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, test_copies, 0, NKINDS);
    tcase_add_loop_test(t, test_elementwise_bits, 0, NKINDS);
    tcase_add_loop_test(t, test_gemm, 0, NKINDS);
    tcase_add_loop_test(t, test_xent_and_reductions, 0, NKINDS);
    tcase_add_loop_test(t, test_optimizers_bits, 0, NKINDS);
    tcase_add_loop_test(t, test_ef_topk_match_compression, 0, NKINDS);
    tcase_add_loop_test(t, test_topk_sets, 0, NKINDS);
    tcase_add_loop_test(t, test_events_order_streams, 0, NKINDS);
    tcase_add_loop_test(t, test_event_elapsed, 0, NKINDS);
    tcase_add_loop_test(t, test_refusals, 0, NKINDS);
    tcase_add_loop_test(t, test_peer_and_sum_rows, 0, NKINDS);
#ifndef DEV_TEST_CUDA
    tcase_add_test(t, test_peer_refusals);
    tcase_add_test(t, test_sim_guards);
    tcase_add_test(t, test_sim_events);
#endif
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
#ifdef DEV_TEST_CUDA
    int probe = fl_test_gpu_probe("device conformance (cuda)");
    if (probe != 0)
        return probe;
#endif
    return fl_test_run(dev_suite());
}
