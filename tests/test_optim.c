/* Optimizers and learning-rate schedules: SGD (momentum, dampening, Nesterov, weight decay),
 * Adam and AdamW against arithmetic written out by hand, against PyTorch 1.13 trajectories
 * pinned bit for bit (tests/gen_optim_ref.py), refusals, state save and restore, and the
 * warm-up, step and cosine schedules. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ---- */

static fl_opt_t *make_opt(const fl_opt_opts_t *o, size_t n)
{
    fl_opt_t *opt = NULL;
    int rc = fl_opt_create(o, n, &opt);
    if (rc != FL_OK)
        ck_abort_msg("fl_opt_create: %s: %s", fl_strerror(rc), fl_last_error());
    return opt;
}

static void step_ok(fl_opt_t *opt, float *p, const float *g, double lr)
{
    int rc = fl_opt_step(opt, p, g, lr);
    if (rc != FL_OK)
        ck_abort_msg("fl_opt_step: %s: %s", fl_strerror(rc), fl_last_error());
}

/* Distance in units in the last place between two finite floats of any sign. */
static int64_t ulps(float a, float b)
{
    int32_t ia;
    int32_t ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia;
    int64_t ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return oa > ob ? oa - ob : ob - oa;
}

/* The same bits (so -0 differs from +0, as torch's would). */
static void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            ck_abort_msg("%s[%zu] = %a, expected %a", what, i, (double)got[i], (double)want[i]);
    }
}

/* Within rel of a double computed independently (a few float roundings apart). */
static void expect_near(const char *what, const float *got, const double *want, size_t n,
                        double rel)
{
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)got[i] - want[i]) <= rel * fabs(want[i])))
            ck_abort_msg("%s[%zu] = %.9g, expected %.9g (rel %g)", what, i, (double)got[i], want[i],
                         rel);
    }
}

static void expect_detail(const char *needle)
{
    if (strstr(fl_last_error(), needle) == NULL)
        ck_abort_msg("detail '%s' does not name '%s'", fl_last_error(), needle);
}

/* ---- SGD by hand: dyadic numbers, so every result is exact ---- */

START_TEST(test_sgd_plain)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    ck_assert_int_eq(o.kind, FL_OPT_SGD);
    fl_opt_t *opt = make_opt(&o, 2);
    float p[2] = {1.0f, -2.0f};
    const float g[2] = {0.5f, 0.25f};

    step_ok(opt, p, g, 0.25); /* p -= 0.25 * g */
    const float one[2] = {1.0f - 0.125f, -2.0f - 0.0625f};
    expect_bits("p after 1", p, one, 2);
    step_ok(opt, p, g, 0.25);
    step_ok(opt, p, g, 0.25);
    const float three[2] = {1.0f - 3 * 0.125f, -2.0f - 3 * 0.0625f};
    expect_bits("p after 3", p, three, 2);

    const float *b1 = (const float *)1;
    const float *b2 = (const float *)1;
    uint64_t steps = 0;
    fl_opt_state(opt, &b1, &b2, &steps);
    ck_assert_ptr_null(b1); /* plain SGD keeps no state */
    ck_assert_ptr_null(b2);
    ck_assert_uint_eq(steps, 3);
    ck_assert_uint_eq(fl_opt_steps(opt), 3);

    /* lr = 0 leaves the parameters alone but still counts the step. */
    step_ok(opt, p, g, 0.0);
    expect_bits("p after lr 0", p, three, 2);
    ck_assert_uint_eq(fl_opt_steps(opt), 4);
    fl_opt_destroy(&opt);
    ck_assert_ptr_null(opt);
    fl_opt_destroy(&opt);
    fl_opt_destroy(NULL);
}
END_TEST

START_TEST(test_sgd_weight_decay)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.weight_decay = 0.5;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    const float g = 0.5f;
    step_ok(opt, &p, &g, 0.25); /* d = 0.5 + 0.5 * 1 = 1; p = 1 - 0.25 * 1 */
    ck_assert_float_eq(p, 0.75f);
    step_ok(opt, &p, &g, 0.25); /* d = 0.5 + 0.5 * 0.75 = 0.875; p = 0.75 - 0.21875 */
    ck_assert_float_eq(p, 0.53125f);
    fl_opt_destroy(&opt);
}
END_TEST

/* momentum 0.5, lr 0.25, p = 1, g = 0.5 on every step; the first step copies d into the buffer
 * (no dampening, no zero start). */
START_TEST(test_sgd_momentum)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.momentum = 0.5;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    const float g = 0.5f;
    const float *buf = NULL;
    const float *b2 = (const float *)1;

    step_ok(opt, &p, &g, 0.25); /* buf = 0.5; p = 1 - 0.125 */
    fl_opt_state(opt, &buf, &b2, NULL);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_null(b2);
    ck_assert_float_eq(buf[0], 0.5f);
    ck_assert_float_eq(p, 0.875f);
    step_ok(opt, &p, &g, 0.25); /* buf = 0.25 + 0.5 = 0.75; p = 0.875 - 0.1875 */
    ck_assert_float_eq(buf[0], 0.75f);
    ck_assert_float_eq(p, 0.6875f);
    step_ok(opt, &p, &g, 0.25); /* buf = 0.375 + 0.5 = 0.875; p = 0.6875 - 0.21875 */
    ck_assert_float_eq(buf[0], 0.875f);
    ck_assert_float_eq(p, 0.46875f);
    fl_opt_destroy(&opt);

    /* With weight decay 0.5: d = 0.5 + 0.5 p goes into the buffer. */
    o.weight_decay = 0.5;
    opt = make_opt(&o, 1);
    p = 1.0f;
    step_ok(opt, &p, &g, 0.25); /* d = 1; buf = 1; p = 0.75 */
    ck_assert_float_eq(p, 0.75f);
    step_ok(opt, &p, &g, 0.25); /* d = 0.875; buf = 0.5 + 0.875 = 1.375; p = 0.75 - 0.34375 */
    fl_opt_state(opt, &buf, NULL, NULL);
    ck_assert_float_eq(buf[0], 1.375f);
    ck_assert_float_eq(p, 0.40625f);
    fl_opt_destroy(&opt);
}
END_TEST

START_TEST(test_sgd_dampening)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.momentum = 0.5;
    o.dampening = 0.5;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    const float g = 0.5f;
    const float *buf = NULL;
    step_ok(opt, &p, &g, 0.25); /* first step: buf = d = 0.5, undamped; p = 0.875 */
    fl_opt_state(opt, &buf, NULL, NULL);
    ck_assert_float_eq(buf[0], 0.5f);
    ck_assert_float_eq(p, 0.875f);
    step_ok(opt, &p, &g, 0.25); /* buf = 0.5 * 0.5 + (1 - 0.5) * 0.5 = 0.5; p = 0.75 */
    ck_assert_float_eq(buf[0], 0.5f);
    ck_assert_float_eq(p, 0.75f);
    step_ok(opt, &p, &g, 0.25);
    ck_assert_float_eq(p, 0.625f);
    fl_opt_destroy(&opt);
}
END_TEST

START_TEST(test_sgd_nesterov)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.momentum = 0.5;
    o.nesterov = true;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    const float g = 0.5f;
    const float *buf = NULL;
    step_ok(opt, &p, &g, 0.25); /* buf = 0.5; d = 0.5 + 0.5 * 0.5 = 0.75; p = 1 - 0.1875 */
    ck_assert_float_eq(p, 0.8125f);
    step_ok(opt, &p, &g, 0.25); /* buf = 0.75; d = 0.5 + 0.375 = 0.875; p -= 0.21875 */
    ck_assert_float_eq(p, 0.59375f);
    step_ok(opt, &p, &g, 0.25); /* buf = 0.875; d = 0.5 + 0.4375 = 0.9375; p -= 0.234375 */
    ck_assert_float_eq(p, 0.359375f);
    fl_opt_state(opt, &buf, NULL, NULL);
    ck_assert_float_eq(buf[0], 0.875f); /* the buffer holds the plain momentum sum */
    fl_opt_destroy(&opt);
}
END_TEST

/* ---- Adam and AdamW by hand ---- */

/* beta1 = 0.5, beta2 = 0.75, eps = 0, lr = 0.125, p = 1, g = 0.5: at t = 1, m = 0.25,
 * v = 0.0625, bias1 = 0.5, bias2 = 0.25, so p -= (0.125 / 0.5) * 0.25 / (0.25 / 0.5): exact. */
START_TEST(test_adam_first_step)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    ck_assert(o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8);
    o.kind = FL_OPT_ADAM;
    o.beta1 = 0.5;
    o.beta2 = 0.75;
    o.eps = 0.0;
    fl_opt_t *opt = make_opt(&o, 2);
    float p[2] = {1.0f, 1.0f};
    const float g[2] = {0.5f, -0.5f};
    step_ok(opt, p, g, 0.125);
    ck_assert_float_eq(p[0], 0.875f);
    ck_assert_float_eq(p[1], 1.125f);
    const float *m = NULL;
    const float *v = NULL;
    uint64_t t = 0;
    fl_opt_state(opt, &m, &v, &t);
    ck_assert_uint_eq(t, 1);
    ck_assert_float_eq(m[0], 0.25f);
    ck_assert_float_eq(m[1], -0.25f);
    ck_assert_float_eq(v[0], 0.0625f);
    ck_assert_float_eq(v[1], 0.0625f);
    fl_opt_destroy(&opt);

    /* L2 weight decay 0.5 enters the moments: g' = 0.5 + 0.5 * 1 = 1, m = 0.5, v = 0.25,
     * p -= 0.25 * 0.5 / (0.5 / 0.5). */
    o.weight_decay = 0.5;
    opt = make_opt(&o, 1);
    p[0] = 1.0f;
    step_ok(opt, p, g, 0.125);
    fl_opt_state(opt, &m, &v, NULL);
    ck_assert_float_eq(m[0], 0.5f);
    ck_assert_float_eq(v[0], 0.25f);
    ck_assert_float_eq(p[0], 0.875f);
    fl_opt_destroy(&opt);
}
END_TEST

/* Bias correction at t = 1, 2, 3 with a changing gradient, against the textbook form
 * p -= lr * m_hat / (sqrt(v_hat) + eps) evaluated in double. */
START_TEST(test_adam_bias_correction)
{
    const double b1 = 0.5;
    const double b2 = 0.75;
    const double eps = 1e-3;
    const double lr = 0.125;
    const float gs[3] = {0.5f, -0.25f, 1.0f};
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAM;
    o.beta1 = b1;
    o.beta2 = b2;
    o.eps = eps;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    double m = 0.0;
    double v = 0.0;
    double want = 1.0;
    for (int t = 1; t <= 3; t++) {
        step_ok(opt, &p, &gs[t - 1], lr);
        const double g = gs[t - 1];
        m = b1 * m + (1 - b1) * g;
        v = b2 * v + (1 - b2) * g * g;
        const double m_hat = m / (1 - pow(b1, t)); /* 1 - b1^t: 0.5, 0.75, 0.875 */
        const double v_hat = v / (1 - pow(b2, t)); /* 1 - b2^t: 0.25, 0.4375, 0.578125 */
        want -= lr * m_hat / (sqrt(v_hat) + eps);
        char what[32];
        snprintf(what, sizeof what, "p at t=%d", t);
        expect_near(what, &p, &want, 1, 4e-7);
    }
    /* t = 1: m = 0.25, v = 0.0625; t = 2: m = 0.125 - 0.125 = 0, v = 0.046875 + 0.015625 =
     * 0.0625; t = 3: m = 0.5, v = 0.046875 + 0.25 = 0.296875: all exact in float. */
    const float *mb = NULL;
    const float *vb = NULL;
    fl_opt_state(opt, &mb, &vb, NULL);
    ck_assert_float_eq(mb[0], 0.5f);
    ck_assert_float_eq(vb[0], 0.296875f);
    ck_assert_uint_eq(fl_opt_steps(opt), 3);
    fl_opt_destroy(&opt);
}
END_TEST

/* AdamW: p *= 1 - lr * wd first, then Adam without the L2 term. With beta1 = 0.5, beta2 = 0.75,
 * eps = 0, lr = 0.125, wd = 0.5, p = 1, g = 0.5: p = 0.9375, then - 0.125 as in Adam's first
 * step; the moments see the raw gradient (m = 0.25, not Adam-with-L2's 0.5). */
START_TEST(test_adamw_decoupled)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAMW;
    o.beta1 = 0.5;
    o.beta2 = 0.75;
    o.eps = 0.0;
    o.weight_decay = 0.5;
    fl_opt_t *opt = make_opt(&o, 1);
    float p = 1.0f;
    const float g = 0.5f;
    step_ok(opt, &p, &g, 0.125);
    ck_assert_float_eq(p, 0.8125f);
    const float *m = NULL;
    const float *v = NULL;
    fl_opt_state(opt, &m, &v, NULL);
    ck_assert_float_eq(m[0], 0.25f);
    ck_assert_float_eq(v[0], 0.0625f);

    /* A constant gradient makes m_hat / sqrt(v_hat) = 1: each step moves by lr after the
     * decay, up to the rounding of sqrt and the bias factors. */
    step_ok(opt, &p, &g, 0.125);
    step_ok(opt, &p, &g, 0.125);
    double want = 0.8125;
    want = want * (1 - 0.125 * 0.5) - 0.125;
    want = want * (1 - 0.125 * 0.5) - 0.125;
    expect_near("p at t=3", &p, &want, 1, 4e-7);
    fl_opt_destroy(&opt);

    /* Weight decay 0 makes AdamW and Adam identical, bit for bit. */
    o.weight_decay = 0.0;
    o.eps = 1e-8;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    fl_opt_t *w = make_opt(&o, 3);
    o.kind = FL_OPT_ADAM;
    fl_opt_t *a = make_opt(&o, 3);
    float pw[3] = {0.3f, -1.7f, 2.5f};
    float pa[3] = {0.3f, -1.7f, 2.5f};
    const float gg[3][3] = {{0.1f, -0.2f, 0.3f}, {0.7f, 0.0f, -0.3f}, {-1e-3f, 5.0f, 0.3f}};
    for (int t = 0; t < 3; t++) {
        step_ok(w, pw, gg[t], 0.01);
        step_ok(a, pa, gg[t], 0.01);
    }
    expect_bits("adamw(wd 0) vs adam", pw, pa, 3);
    fl_opt_destroy(&w);
    fl_opt_destroy(&a);
}
END_TEST

/* ---- PyTorch 1.13 reference trajectories ---- */

#define REF_N 20
#define REF_STEPS 5

/* Inputs shared with tests/gen_optim_ref.py: dyadic rationals, exact in float. */
static float ref_param0(int i)
{
    return (float)((double)(((i * 37) % 19) - 9) / 8.0 * ldexp(1.0, (i % 5) - 2));
}

static float ref_grad(int step, int i)
{
    return (float)((double)(((i * 13 + step * 7) % 23) - 11) / 16.0 * ldexp(1.0, (i % 3) - 1));
}

typedef struct ref_cfg {
    const char *name;
    fl_opt_kind_t kind;
    double momentum;
    double dampening;
    bool nesterov;
    double weight_decay;
    double beta1;
    double beta2;
    double eps;
    double lr[REF_STEPS];
    float want[REF_N]; /* torch's parameters after REF_STEPS steps */
} ref_cfg_t;

/* Generated by tests/gen_optim_ref.py (torch 1.13, AVX2 kernels); the rows keep its layout. */
/* clang-format off */
static const ref_cfg_t refs[] = {
    {"sgd", FL_OPT_SGD, 0, 0, false, 0, 0.9, 0.999, 1e-8,
     {0.1, 0.1, 0.1, 0.1, 0.1},
     {
         -0x1.066666p-2f, 0x1.f9999cp-2f, 0x1.333334p+0f, 0x1.bd999ap+0f,
         0x1.80ccccp+1f, 0x1.cp-3f, 0x1.1cccccp-2f, 0x1.4p-2f,
         0x1.b33334p-2f, 0x1.21999ap-1f, -0x1.0ccccep-3f, 0x1.99999ap-7f,
         -0x1.c00002p-3f, -0x1.9cccccp-1f, -0x1.08p+1f, -0x1.466666p-3f,
         -0x1.6cccccp-2f, -0x1.133334p+0f, -0x1.f73332p+0f, -0x1.233332p+2f,
     }},
    {"sgd_wd", FL_OPT_SGD, 0, 0, false, 0.01, 0.9, 0.999, 1e-8,
     {0.1, 0.1, 0.1, 0.1, 0.1},
     {
         -0x1.051734p-2f, 0x1.f6dc28p-2f, 0x1.31d13p+0f, 0x1.bb599ep+0f,
         0x1.7ee1a6p+1f, 0x1.beb5b6p-3f, 0x1.1b763ap-2f, 0x1.3e5a32p-2f,
         0x1.b0c92p-2f, 0x1.2040fep-1f, -0x1.0c469ep-3f, 0x1.9e813ep-7f,
         -0x1.bd6eb6p-3f, -0x1.9ad458p-1f, -0x1.06abe4p+1f, -0x1.44cbfep-3f,
         -0x1.6b134ep-2f, -0x1.11fbb2p+0f, -0x1.f4a9dap+0f, -0x1.21c42p+2f,
     }},
    {"sgd_mom", FL_OPT_SGD, 0.9, 0, false, 0, 0.9, 0.999, 1e-8,
     {0.1, 0.1, 0.1, 0.1, 0.1},
     {
         -0x1.4ee60cp-3f, 0x1.921ab6p-2f, 0x1.863514p+0f, 0x1.c9feacp+0f,
         0x1.820188p+1f, 0x1.b6556p-4f, 0x1.514bfp-2f, 0x1.a9b332p-4f,
         0x1.4c7404p-2f, 0x1.58225ep-1f, -0x1.5623e2p-2f, 0x1.10ae5p-3f,
         -0x1.c51608p-3f, -0x1.cc1926p-1f, -0x1.305cfap+1f, -0x1.45a6b4p-3f,
         -0x1.c60aaap-3f, -0x1.61024ep+0f, -0x1.e8f6a2p+0f, -0x1.2042ap+2f,
     }},
    {"sgd_damp_wd", FL_OPT_SGD, 0.9, 0.5, false, 0.01, 0.9, 0.999, 1e-8,
     {0.05, 0.05, 0.05, 0.05, 0.05},
     {
         -0x1.b953c2p-3f, 0x1.027ec6p-1f, 0x1.3a9a9p+0f, 0x1.bc7a26p+0f,
         0x1.82efbcp+1f, 0x1.5049a6p-5f, 0x1.19c28ap-2f, 0x1.e2096ap-3f,
         0x1.c3dd3p-2f, 0x1.23a436p-1f, -0x1.be9f8ap-4f, 0x1.03634cp-4f,
         -0x1.0e6f38p-2f, -0x1.878c6cp-1f, -0x1.1b56aep+1f, -0x1.40061ap-3f,
         -0x1.15b7aep-2f, -0x1.0914dcp+0f, -0x1.f25056p+0f, -0x1.214772p+2f,
     }},
    {"sgd_nesterov", FL_OPT_SGD, 0.9, 0, true, 0.001, 0.9, 0.999, 1e-8,
     {0.1, 0.1, 0.1, 0.1, 0.1},
     {
         -0x1.3316fep-3f, 0x1.5c3d76p-2f, 0x1.ab785ap+0f, 0x1.c5d5cp+0f,
         0x1.81f452p+1f, 0x1.6505e8p-3f, 0x1.658196p-2f, 0x1.16fbc8p-4f,
         0x1.10e3a2p-2f, 0x1.706fbp-1f, -0x1.ba1f8ap-2f, 0x1.82179ep-3f,
         -0x1.8a1508p-3f, -0x1.e09e6p-1f, -0x1.330e0ap+1f, -0x1.4aeb96p-3f,
         -0x1.be2872p-3f, -0x1.86da0ap+0f, -0x1.e19f2cp+0f, -0x1.22f34ap+2f,
     }},
    {"adam", FL_OPT_ADAM, 0, 0, false, 0, 0.9, 0.999, 1e-8,
     {0.01, 0.01, 0.01, 0.01, 0.01},
     {
         -0x1.0688ecp-2f, 0x1.131dcap-1f, 0x1.072b3cp+0f, 0x1.bfff86p+0f,
         0x1.814bf8p+1f, 0x1.2e918p-3f, 0x1.124ef2p-2f, 0x1.6759f4p-2f,
         0x1.eba4bp-2f, 0x1.10829p-1f, -0x1.13713ep-5f, -0x1.75b7aep-5f,
         -0x1.0309cap-2f, -0x1.82135ap-1f, -0x1.02792p+1f, -0x1.487b6p-3f,
         -0x1.6aa97ap-2f, -0x1.cf3f28p-1f, -0x1.fa24dcp+0f, -0x1.205266p+2f,
     }},
    {"adam_wd", FL_OPT_ADAM, 0, 0, false, 0.1, 0.8, 0.99, 1e-6,
     {0.01, 0.02, 0.03, 0.02, 0.01},
     {
         -0x1.e708fap-3f, 0x1.095acep-1f, 0x1.07b6cap+0f, 0x1.b5d97p+0f,
         0x1.79b38ep+1f, 0x1.32942ep-3f, 0x1.137588p-2f, 0x1.55441ap-2f,
         0x1.e18ccep-2f, 0x1.1060bep-1f, -0x1.b2d086p-5f, -0x1.7a69f4p-5f,
         -0x1.e20d18p-3f, -0x1.847208p-1f, -0x1.013cb8p+1f, -0x1.294deap-3f,
         -0x1.5d28p-2f, -0x1.d3e234p-1f, -0x1.edb28cp+0f, -0x1.1b588cp+2f,
     }},
    {"adamw", FL_OPT_ADAMW, 0, 0, false, 0.01, 0.9, 0.999, 1e-8,
     {0.01, 0.01, 0.01, 0.01, 0.01},
     {
         -0x1.06661p-2f, 0x1.12f9d8p-1f, 0x1.070a04p+0f, 0x1.bfc648p+0f,
         0x1.811aaep+1f, 0x1.2e6a8ep-3f, 0x1.122d1ep-2f, 0x1.672a6ap-2f,
         0x1.eb64d6p-2f, 0x1.1060dp-1f, -0x1.136068p-5f, -0x1.758144p-5f,
         -0x1.02e83cp-2f, -0x1.81e272p-1f, -0x1.02582ep+1f, -0x1.485186p-3f,
         -0x1.6a7a34p-2f, -0x1.cf04d2p-1f, -0x1.f9e3bcp+0f, -0x1.202d8p+2f,
     }},
    {"adamw_wd", FL_OPT_ADAMW, 0, 0, false, 0.3, 0.5, 0.9, 1e-4,
     {0.1, 0.05, 0.025, 0.0125, 0.1},
     {
         -0x1.ea9b3ap-4f, 0x1.4ac39p-2f, 0x1.1871a8p+0f, 0x1.7ddb7cp+0f,
         0x1.6bec9ap+1f, 0x1.ef2e88p-4f, 0x1.4e83dep-2f, 0x1.faeb84p-3f,
         0x1.265382p-2f, 0x1.500c5ap-1f, -0x1.cd45f4p-3f, 0x1.1d75bap-4f,
         -0x1.d51ff4p-3f, -0x1.53038ap-1f, -0x1.e785b6p+0f, -0x1.8efefep-3f,
         -0x1.cf682ep-3f, -0x1.033378p+0f, -0x1.ad67e2p+0f, -0x1.1061p+2f,
     }},
};
/* clang-format on */

/* Bit-exact: flodl performs torch's operations in torch's order with torch's roundings,
 * including the FMAs of its vectorised kernels (see core/optim.c), so anything short of equal
 * bits is a divergence that the parameter server and workers would accumulate. */
START_TEST(test_torch_reference)
{
    for (size_t c = 0; c < NELEM(refs); c++) {
        const ref_cfg_t *r = &refs[c];
        fl_opt_opts_t o;
        fl_opt_opts_init(&o);
        o.kind = r->kind;
        o.momentum = r->momentum;
        o.dampening = r->dampening;
        o.nesterov = r->nesterov;
        o.weight_decay = r->weight_decay;
        o.beta1 = r->beta1;
        o.beta2 = r->beta2;
        o.eps = r->eps;
        fl_opt_t *opt = make_opt(&o, REF_N);
        float p[REF_N];
        float g[REF_N];
        for (int i = 0; i < REF_N; i++)
            p[i] = ref_param0(i);
        for (int s = 0; s < REF_STEPS; s++) {
            for (int i = 0; i < REF_N; i++)
                g[i] = ref_grad(s, i);
            step_ok(opt, p, g, r->lr[s]);
        }
        for (int i = 0; i < REF_N; i++) {
            if (memcmp(&p[i], &r->want[i], sizeof(float)) != 0)
                ck_abort_msg("%s: p[%d] = %a, torch %a (%lld ulp)", r->name, i, (double)p[i],
                             (double)r->want[i], (long long)ulps(p[i], r->want[i]));
        }
        fl_opt_destroy(&opt);
    }
}
END_TEST

/* ---- refusals ---- */

START_TEST(test_nonfinite_gradient)
{
    static const fl_opt_kind_t kinds[] = {FL_OPT_SGD, FL_OPT_ADAM, FL_OPT_ADAMW};
    for (size_t k = 0; k < NELEM(kinds); k++) {
        fl_opt_opts_t o;
        fl_opt_opts_init(&o);
        o.kind = kinds[k];
        o.momentum = kinds[k] == FL_OPT_SGD ? 0.9 : 0.0;
        o.weight_decay = 0.1;
        fl_opt_t *opt = make_opt(&o, 4);
        float p[4] = {1.0f, 2.0f, 3.0f, 4.0f};
        const float good[4] = {0.1f, 0.2f, 0.3f, 0.4f};
        step_ok(opt, p, good, 0.1);
        float p_saved[4];
        memcpy(p_saved, p, sizeof p);
        const float *b1 = NULL;
        const float *b2 = NULL;
        fl_opt_state(opt, &b1, &b2, NULL);
        float b1_saved[4];
        float b2_saved[4] = {0};
        memcpy(b1_saved, b1, sizeof b1_saved);
        if (b2 != NULL)
            memcpy(b2_saved, b2, sizeof b2_saved);

        const float nan_at2[4] = {0.1f, 0.2f, NAN, INFINITY};
        const float inf_at0[4] = {-INFINITY, 0.2f, 0.3f, 0.4f};
        int rc = fl_opt_step(opt, p, nan_at2, 0.1);
        if (rc != FL_ENONFINITE || strstr(fl_last_error(), "index 2 of 4") == NULL ||
            strstr(fl_last_error(), "NaN") == NULL)
            ck_abort_msg("%s: NaN at 2: rc %d, '%s'", fl_opt_kind_name(kinds[k]), rc,
                         fl_last_error());
        rc = fl_opt_step(opt, p, inf_at0, 0.1);
        if (rc != FL_ENONFINITE || strstr(fl_last_error(), "index 0 of 4") == NULL ||
            strstr(fl_last_error(), "Inf") == NULL)
            ck_abort_msg("%s: Inf at 0: rc %d, '%s'", fl_opt_kind_name(kinds[k]), rc,
                         fl_last_error());
        expect_bits("params after refusals", p, p_saved, 4);
        expect_bits("buf1 after refusals", b1, b1_saved, 4);
        if (b2 != NULL)
            expect_bits("buf2 after refusals", b2, b2_saved, 4);
        if (fl_opt_steps(opt) != 1)
            ck_abort_msg("%s: a refused step was counted", fl_opt_kind_name(kinds[k]));

        /* A negative or non-finite rate is refused the same way: nothing moves. */
        if (fl_opt_step(opt, p, good, -0.1) != FL_EINVAL ||
            fl_opt_step(opt, p, good, NAN) != FL_EINVAL)
            ck_abort_msg("%s: a bad lr was accepted", fl_opt_kind_name(kinds[k]));
        expect_detail("lr");
        expect_bits("params after bad lr", p, p_saved, 4);
        if (fl_opt_steps(opt) != 1)
            ck_abort_msg("%s: a refused lr was counted", fl_opt_kind_name(kinds[k]));
        fl_opt_destroy(&opt);
    }
}
END_TEST

START_TEST(test_bad_options)
{
    static const struct {
        const char *field; /* what the detail must name */
        int which;
        double value;
    } cases[] = {
        {"momentum", 0, -0.1},      {"momentum", 0, NAN},     {"momentum", 0, INFINITY},
        {"weight_decay", 1, -1e-4}, {"weight_decay", 1, NAN}, {"eps", 2, -1e-8},
        {"beta1", 3, 1.0},          {"beta1", 3, -0.1},       {"beta1", 3, NAN},
        {"beta2", 4, 1.0},          {"beta2", 4, 1.5},        {"beta2", 4, -1e-9},
        {"dampening", 5, NAN},
    };
    for (size_t c = 0; c < NELEM(cases); c++) {
        fl_opt_opts_t o;
        fl_opt_opts_init(&o);
        o.kind = FL_OPT_ADAM;
        double *fields[] = {&o.momentum, &o.weight_decay, &o.eps, &o.beta1, &o.beta2, &o.dampening};
        *fields[cases[c].which] = cases[c].value;
        fl_opt_t *opt = (fl_opt_t *)1;
        fl_error_clear();
        int rc = fl_opt_create(&o, 8, &opt);
        if (rc != FL_EINVAL || opt != NULL || strstr(fl_last_error(), cases[c].field) == NULL)
            ck_abort_msg("%s = %g: rc %d, out %p, '%s'", cases[c].field, cases[c].value, rc,
                         (void *)opt, fl_last_error());
    }

    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    fl_opt_t *opt = NULL;
    o.nesterov = true; /* momentum 0 */
    ck_assert_int_eq(fl_opt_create(&o, 8, &opt), FL_EINVAL);
    expect_detail("nesterov");
    o.momentum = 0.9;
    o.dampening = 0.1;
    ck_assert_int_eq(fl_opt_create(&o, 8, &opt), FL_EINVAL);
    expect_detail("nesterov");
    o.dampening = 0.0;
    opt = make_opt(&o, 8); /* the valid Nesterov configuration */
    fl_opt_destroy(&opt);

    fl_opt_opts_init(&o);
    ck_assert_int_eq(fl_opt_create(&o, 0, &opt), FL_EINVAL);
    expect_detail("n = 0");
    ck_assert_ptr_null(opt);
    o.kind = (fl_opt_kind_t)7;
    ck_assert_int_eq(fl_opt_create(&o, 8, &opt), FL_EINVAL);
    expect_detail("kind");
    o.kind = (fl_opt_kind_t)-1;
    ck_assert_int_eq(fl_opt_create(&o, 8, &opt), FL_EINVAL);
    expect_detail("kind");

    /* Boundaries that are allowed: beta 0, eps 0, weight decay 0, momentum 0. */
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAMW;
    o.beta1 = 0.0;
    o.beta2 = 0.0;
    o.eps = 0.0;
    opt = make_opt(&o, 1);
    fl_opt_destroy(&opt);
}
END_TEST

START_TEST(test_bad_restore)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAM;
    fl_opt_t *opt = make_opt(&o, 4);
    float p[4] = {1, 2, 3, 4};
    const float g[4] = {0.5f, -0.5f, 0.25f, 0};
    step_ok(opt, p, g, 0.01);
    const float *m = NULL;
    const float *v = NULL;
    fl_opt_state(opt, &m, &v, NULL);
    float m_saved[4];
    float v_saved[4];
    memcpy(m_saved, m, sizeof m_saved);
    memcpy(v_saved, v, sizeof v_saved);

    const float good[5] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
    ck_assert_int_eq(fl_opt_restore(opt, good, good, 5, 7), FL_EINVAL);
    expect_detail("5");
    expect_detail("4");
    ck_assert_int_eq(fl_opt_restore(opt, good, good, 3, 7), FL_EINVAL);
    const float nan_m[4] = {0.1f, 0.2f, 0.3f, NAN};
    ck_assert_int_eq(fl_opt_restore(opt, nan_m, good, 4, 7), FL_ENONFINITE);
    expect_detail("index 3");
    const float inf_v[4] = {0.1f, INFINITY, 0.3f, 0.4f};
    ck_assert_int_eq(fl_opt_restore(opt, good, inf_v, 4, 7), FL_ENONFINITE);
    expect_detail("second moment");
    expect_detail("index 1");
    const float neg_v[4] = {0.1f, 0.2f, -0.3f, 0.4f};
    ck_assert_int_eq(fl_opt_restore(opt, good, neg_v, 4, 7), FL_EINVAL);
    expect_detail("index 2");
    /* Nothing changed. */
    fl_opt_state(opt, &m, &v, NULL);
    expect_bits("m after refusals", m, m_saved, 4);
    expect_bits("v after refusals", v, v_saved, 4);
    ck_assert_uint_eq(fl_opt_steps(opt), 1);

    /* NULL buffers restore zeros. */
    ck_assert_int_eq(fl_opt_restore(opt, NULL, NULL, 4, 0), FL_OK);
    const float zeros[4] = {0};
    expect_bits("m zeroed", m, zeros, 4);
    expect_bits("v zeroed", v, zeros, 4);
    ck_assert_uint_eq(fl_opt_steps(opt), 0);
    fl_opt_destroy(&opt);
}
END_TEST

/* ---- state round trip ---- */

static void round_trip(const fl_opt_opts_t *o, const char *name)
{
    enum { N = 37 };
    float pa[N];
    float pb[N];
    float g[N];
    uint64_t rng = 42;
    for (int i = 0; i < N; i++)
        pa[i] = (float)fl_test_uniform(&rng);
    fl_opt_t *a = make_opt(o, N);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)fl_test_uniform(&rng);
        step_ok(a, pa, g, 0.05);
    }
    /* Save: copies, as a checkpoint would hold them. */
    const float *b1 = NULL;
    const float *b2 = NULL;
    uint64_t steps = 0;
    fl_opt_state(a, &b1, &b2, &steps);
    float s1[N];
    float s2[N];
    if (b1 != NULL)
        memcpy(s1, b1, sizeof s1);
    if (b2 != NULL)
        memcpy(s2, b2, sizeof s2);
    memcpy(pb, pa, sizeof pb);

    fl_opt_t *b = make_opt(o, N);
    int rc = fl_opt_restore(b, b1 ? s1 : NULL, b2 ? s2 : NULL, N, steps);
    if (rc != FL_OK)
        ck_abort_msg("%s: restore: %s", name, fl_last_error());
    if (fl_opt_steps(b) != 3)
        ck_abort_msg("%s: restored %llu steps", name, (unsigned long long)fl_opt_steps(b));
    /* A fresh optimizer fed the same steps shows what the restore is worth. */
    fl_opt_t *fresh = make_opt(o, N);
    float pf[N];
    memcpy(pf, pa, sizeof pf);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)fl_test_uniform(&rng);
        step_ok(a, pa, g, 0.05);
        step_ok(b, pb, g, 0.05);
        step_ok(fresh, pf, g, 0.05);
    }
    if (memcmp(pa, pb, sizeof pa) != 0)
        ck_abort_msg("%s: the restored optimizer diverged", name);
    if (b1 != NULL && memcmp(pa, pf, sizeof pa) == 0)
        ck_abort_msg("%s: a fresh optimizer matched: the state was not exercised", name);
    const float *a1 = NULL;
    const float *bb1 = NULL;
    fl_opt_state(a, &a1, NULL, NULL);
    fl_opt_state(b, &bb1, NULL, NULL);
    if (a1 != NULL && memcmp(a1, bb1, N * sizeof(float)) != 0)
        ck_abort_msg("%s: buffers diverged", name);
    fl_opt_destroy(&a);
    fl_opt_destroy(&b);
    fl_opt_destroy(&fresh);
}

START_TEST(test_state_round_trip)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    round_trip(&o, "sgd");
    o.momentum = 0.9;
    o.weight_decay = 1e-4;
    round_trip(&o, "sgd momentum");
    o.dampening = 0.3;
    round_trip(&o, "sgd dampening");
    o.dampening = 0.0;
    o.nesterov = true;
    round_trip(&o, "sgd nesterov");
    fl_opt_opts_init(&o);
    o.kind = FL_OPT_ADAM;
    o.weight_decay = 0.01;
    round_trip(&o, "adam");
    o.kind = FL_OPT_ADAMW;
    round_trip(&o, "adamw");
}
END_TEST

/* SGD's first-step rule must not fire again after a restore: a momentum buffer of 1 and
 * steps 1 give buf = 0.5 * 1 + 0.5 = 1 on the next step, not buf = d = 0.5. */
START_TEST(test_restore_momentum_continues)
{
    fl_opt_opts_t o;
    fl_opt_opts_init(&o);
    o.momentum = 0.5;
    fl_opt_t *opt = make_opt(&o, 1);
    const float buf = 1.0f;
    ck_assert_int_eq(fl_opt_restore(opt, &buf, NULL, 1, 1), FL_OK);
    float p = 1.0f;
    const float g = 0.5f;
    step_ok(opt, &p, &g, 0.25);
    const float *b = NULL;
    fl_opt_state(opt, &b, NULL, NULL);
    ck_assert_float_eq(b[0], 1.0f);
    ck_assert_float_eq(p, 0.75f);
    ck_assert_uint_eq(fl_opt_steps(opt), 2);

    /* steps = 0 starts afresh: the buffer becomes d. */
    ck_assert_int_eq(fl_opt_restore(opt, &buf, NULL, 1, 0), FL_OK);
    step_ok(opt, &p, &g, 0.25);
    ck_assert_float_eq(b[0], 0.5f);
    ck_assert_float_eq(p, 0.625f);
    fl_opt_destroy(&opt);
}
END_TEST

/* Stepping in blocks (what the parameter server does) gives the same bits as one step. */
START_TEST(test_range_steps_match)
{
    enum { N = 1000, STEPS = 4 };
    fl_opt_opts_t cases[4];
    for (int c = 0; c < 4; c++)
        fl_opt_opts_init(&cases[c]);
    cases[0].momentum = 0.9, cases[0].nesterov = true, cases[0].weight_decay = 0.01;
    cases[1].kind = FL_OPT_ADAM, cases[1].weight_decay = 0.001;
    cases[2].kind = FL_OPT_ADAMW, cases[2].weight_decay = 0.1;
    cases[3].momentum = 0.5, cases[3].dampening = 0.3;
    uint64_t seed = 99;
    int differ = 0;
    for (int c = 0; c < 4; c++) {
        fl_opt_t *a = make_opt(&cases[c], N), *b = make_opt(&cases[c], N);
        float pa[N], pb[N], g[N];
        for (int i = 0; i < N; i++)
            pa[i] = pb[i] = (float)fl_test_uniform(&seed);
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < N; i++)
                g[i] = (float)fl_test_uniform(&seed);
            double lr = 0.01 * (s + 1);
            step_ok(a, pa, g, lr);
            ck_assert_int_eq(fl_opt_step_begin(b, lr), FL_OK);
            size_t off = 0;
            while (off < N) {
                size_t len = 1 + (size_t)(fl_test_rand(&seed) % 97);
                if (len > N - off)
                    len = N - off;
                fl_opt_step_range(b, pb + off, g + off, off, len);
                off += len;
            }
        }
        differ += memcmp(pa, pb, sizeof pa) != 0;
        ck_assert_uint_eq(fl_opt_steps(b), STEPS);
        ck_assert_uint_eq(fl_opt_size(b), N);
        fl_opt_destroy(&a);
        fl_opt_destroy(&b);
    }
    ck_assert_int_eq(differ, 0);
    fl_opt_t *o = make_opt(&cases[0], 4);
    ck_assert_int_eq(fl_opt_step_begin(o, -1.0), FL_EINVAL);
    ck_assert_int_eq(fl_opt_step_begin(o, NAN), FL_EINVAL);
    ck_assert_uint_eq(fl_opt_steps(o), 0);
    fl_opt_destroy(&o);
}
END_TEST

START_TEST(test_opt_kind_parse)
{
    fl_opt_kind_t k = FL_OPT_SGD;
    ck_assert_int_eq(fl_opt_kind_parse("adam", &k), FL_OK);
    ck_assert_int_eq(k, FL_OPT_ADAM);
    ck_assert_int_eq(fl_opt_kind_parse("AdamW", &k), FL_OK);
    ck_assert_int_eq(k, FL_OPT_ADAMW);
    ck_assert_int_eq(fl_opt_kind_parse("sgd", &k), FL_OK);
    ck_assert_int_eq(k, FL_OPT_SGD);
    ck_assert_int_eq(fl_opt_kind_parse("rmsprop", &k), FL_EINVAL);
    expect_detail("rmsprop");
    ck_assert_int_eq(k, FL_OPT_SGD);
    ck_assert_int_eq(fl_opt_kind_parse("", &k), FL_EINVAL);
    ck_assert_int_eq(fl_opt_kind_parse("adam ", &k), FL_EINVAL);
    ck_assert_int_eq(fl_opt_kind_parse(NULL, &k), FL_EINVAL);
    ck_assert_str_eq(fl_opt_kind_name(FL_OPT_SGD), "sgd");
    ck_assert_str_eq(fl_opt_kind_name(FL_OPT_ADAM), "adam");
    ck_assert_str_eq(fl_opt_kind_name(FL_OPT_ADAMW), "adamw");
    ck_assert_str_eq(fl_opt_kind_name((fl_opt_kind_t)9), "unknown");
}
END_TEST

/* ---- learning-rate schedules ---- */

START_TEST(test_lr_warmup)
{
    fl_lr_sched_t s;
    fl_lr_sched_init(&s, 0.1);
    ck_assert(s.lr == 0.1 && s.kind == FL_LR_CONSTANT && s.warmup_steps == 0 && s.gamma == 0.1 &&
              s.min_lr == 0.0);
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.1);
    ck_assert_double_eq(fl_lr_at(&s, 1000000), 0.1);
    s.warmup_steps = 4;
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.1 * 1 / 4); /* lr * (step + 1) / warmup */
    ck_assert_double_eq(fl_lr_at(&s, 1), 0.1 * 2 / 4);
    ck_assert_double_eq(fl_lr_at(&s, 2), 0.1 * 3 / 4);
    ck_assert_double_eq(fl_lr_at(&s, 3), 0.1);
    ck_assert_double_eq(fl_lr_at(&s, 4), 0.1);
    ck_assert_double_eq(fl_lr_at(&s, 99), 0.1);
    /* Degenerate: a negative step is step 0, a negative warm-up none. */
    ck_assert_double_eq(fl_lr_at(&s, -5), 0.025);
    s.warmup_steps = -3;
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.1);
}
END_TEST

START_TEST(test_lr_step_decay)
{
    fl_lr_sched_t s;
    fl_lr_sched_init(&s, 1.0);
    s.kind = FL_LR_STEP;
    s.step_size = 10;
    s.gamma = 0.5;
    ck_assert_double_eq(fl_lr_at(&s, 0), 1.0);
    ck_assert_double_eq(fl_lr_at(&s, 9), 1.0);
    ck_assert_double_eq(fl_lr_at(&s, 10), 0.5);
    ck_assert_double_eq(fl_lr_at(&s, 19), 0.5);
    ck_assert_double_eq(fl_lr_at(&s, 20), 0.25);
    ck_assert_double_eq(fl_lr_at(&s, 35), 0.125);
    /* The decay counts from the end of the warm-up. */
    s.warmup_steps = 5;
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.2);
    ck_assert_double_eq(fl_lr_at(&s, 4), 1.0);
    ck_assert_double_eq(fl_lr_at(&s, 14), 1.0);
    ck_assert_double_eq(fl_lr_at(&s, 15), 0.5);
    ck_assert_double_eq(fl_lr_at(&s, 25), 0.25);
    /* Default gamma 0.1; step_size <= 0 means no decay. */
    fl_lr_sched_init(&s, 0.4);
    s.kind = FL_LR_STEP;
    s.step_size = 3;
    ck_assert_double_eq_tol(fl_lr_at(&s, 3), 0.04, 1e-17);
    ck_assert_double_eq_tol(fl_lr_at(&s, 6), 0.004, 1e-18);
    s.step_size = 0;
    ck_assert_double_eq(fl_lr_at(&s, 1000), 0.4);
    s.step_size = -2;
    ck_assert_double_eq(fl_lr_at(&s, 1000), 0.4);
}
END_TEST

START_TEST(test_lr_cosine)
{
    fl_lr_sched_t s;
    fl_lr_sched_init(&s, 1.0);
    s.kind = FL_LR_COSINE;
    s.warmup_steps = 10;
    s.total_steps = 100;
    s.min_lr = 0.1;
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.1);             /* warm-up: 1 * 1 / 10 */
    ck_assert_double_eq(fl_lr_at(&s, 9), 1.0);             /* end of warm-up */
    ck_assert_double_eq_tol(fl_lr_at(&s, 10), 1.0, 1e-15); /* start: cos 0 = 1 */
    ck_assert_double_eq_tol(fl_lr_at(&s, 35), 0.1 + 0.9 * (1 + cos(M_PI / 4)) / 2, 1e-15);
    ck_assert_double_eq_tol(fl_lr_at(&s, 60), 0.55, 1e-15); /* middle: cos(pi/2) = 0 */
    ck_assert_double_eq(fl_lr_at(&s, 110), 0.1);            /* end: cos(pi) = -1 */
    ck_assert_double_eq(fl_lr_at(&s, 111), 0.1);            /* after the end: held */
    ck_assert_double_eq(fl_lr_at(&s, 100000), 0.1);
    /* Monotone non-increasing over the decay. */
    double prev = fl_lr_at(&s, 10);
    for (long k = 11; k <= 120; k++) {
        double cur = fl_lr_at(&s, k);
        if (cur > prev || cur < 0.1)
            ck_abort_msg("step %ld: %.17g after %.17g", k, cur, prev);
        prev = cur;
    }
    /* min_lr 0 and no warm-up. */
    s.min_lr = 0.0;
    s.warmup_steps = 0;
    ck_assert_double_eq(fl_lr_at(&s, 0), 1.0);
    ck_assert_double_eq_tol(fl_lr_at(&s, 50), 0.5, 1e-15);
    ck_assert_double_eq(fl_lr_at(&s, 100), 0.0);
    /* total_steps <= 0: constant after the warm-up. */
    s.total_steps = 0;
    ck_assert_double_eq(fl_lr_at(&s, 77), 1.0);
    s.total_steps = -1;
    s.warmup_steps = 2;
    ck_assert_double_eq(fl_lr_at(&s, 0), 0.5);
    ck_assert_double_eq(fl_lr_at(&s, 77), 1.0);
    /* An unknown kind is constant. */
    s.kind = (fl_lr_kind_t)42;
    ck_assert_double_eq(fl_lr_at(&s, 77), 1.0);
}
END_TEST

START_TEST(test_lr_scaled_and_parse)
{
    ck_assert_double_eq(fl_lr_scaled(0.1, 1024, 256), 0.1 * 1024 / 256);
    ck_assert_double_eq_tol(fl_lr_scaled(0.1, 1024, 256), 0.4, 1e-16);
    ck_assert_double_eq(fl_lr_scaled(0.1, 256, 256), 0.1);
    ck_assert_double_eq(fl_lr_scaled(0.2, 128, 256), 0.1);
    ck_assert_double_eq(fl_lr_scaled(0.1, 1024, 0), 0.1); /* degenerate: unscaled */
    ck_assert_double_eq(fl_lr_scaled(0.1, 0, 256), 0.1);

    fl_lr_kind_t k = FL_LR_CONSTANT;
    ck_assert_int_eq(fl_lr_kind_parse("cosine", &k), FL_OK);
    ck_assert_int_eq(k, FL_LR_COSINE);
    ck_assert_int_eq(fl_lr_kind_parse("STEP", &k), FL_OK);
    ck_assert_int_eq(k, FL_LR_STEP);
    ck_assert_int_eq(fl_lr_kind_parse("constant", &k), FL_OK);
    ck_assert_int_eq(k, FL_LR_CONSTANT);
    ck_assert_int_eq(fl_lr_kind_parse("linear", &k), FL_EINVAL);
    expect_detail("linear");
    ck_assert_int_eq(k, FL_LR_CONSTANT);
    ck_assert_int_eq(fl_lr_kind_parse(NULL, &k), FL_EINVAL);
}
END_TEST

static Suite *optim_suite(void)
{
    Suite *s = suite_create("optim");
    TCase *t = tcase_create("by_hand");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_sgd_plain);
    tcase_add_test(t, test_sgd_weight_decay);
    tcase_add_test(t, test_sgd_momentum);
    tcase_add_test(t, test_sgd_dampening);
    tcase_add_test(t, test_sgd_nesterov);
    tcase_add_test(t, test_adam_first_step);
    tcase_add_test(t, test_adam_bias_correction);
    tcase_add_test(t, test_adamw_decoupled);
    suite_add_tcase(s, t);

    t = tcase_create("torch");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_torch_reference);
    suite_add_tcase(s, t);

    t = tcase_create("refusals");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_nonfinite_gradient);
    tcase_add_test(t, test_bad_options);
    tcase_add_test(t, test_bad_restore);
    tcase_add_test(t, test_opt_kind_parse);
    tcase_add_test(t, test_range_steps_match);
    suite_add_tcase(s, t);

    t = tcase_create("state");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_state_round_trip);
    tcase_add_test(t, test_restore_momentum_continues);
    suite_add_tcase(s, t);

    t = tcase_create("lr");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, test_lr_warmup);
    tcase_add_test(t, test_lr_step_decay);
    tcase_add_test(t, test_lr_cosine);
    tcase_add_test(t, test_lr_scaled_and_parse);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(optim_suite());
}
