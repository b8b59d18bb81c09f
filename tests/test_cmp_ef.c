/* compression: error feedback (ef.c). Nothing is lost: the sent values plus the final residual
 * add up to the sum of the gradients, and each step sends the exact top-k of residual plus
 * gradient; momentum correction against a double-precision replica; float16/bfloat16 rounding
 * kept in the residual; clipping; NaN/Inf gradients that never touch the state; checkpoint
 * state round trips; option validation; the DGC density warm-up schedule. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fl_cmp.h"
#include "testutil.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static fl_cmp_ws_t *new_ws(void)
{
    fl_cmp_ws_t *ws = NULL;
    ck_assert_int_eq(fl_cmp_ws_create(&ws), FL_OK);
    return ws;
}

static fl_cmp_ef_t *make_ef(size_t n, float momentum, double max_norm, fl_dtype_t wire,
                            fl_cmp_nonfinite_t on_nonfinite, const char *name)
{
    fl_cmp_ef_opts_t o;
    fl_cmp_ef_opts_init(&o);
    o.n = n;
    o.momentum = momentum;
    o.max_norm = max_norm;
    o.wire = wire;
    o.on_nonfinite = on_nonfinite;
    if (name != NULL)
        o.name = name;
    fl_cmp_ef_t *ef = NULL;
    int rc = fl_cmp_ef_create(&o, &ef);
    ck_assert_msg(rc == FL_OK && ef != NULL, "create: %s", fl_last_error());
    return ef;
}

static fl_cmp_topk_opts_t topk_opts(size_t k, double density)
{
    fl_cmp_topk_opts_t o;
    fl_cmp_topk_opts_init(&o);
    o.k = k;
    o.density = density;
    return o;
}

/* Gradients with magnitudes spread over 10^-3..10^3, so values both accumulate for many steps
 * and get sent at once. */
static void gen_grad(float *g, size_t n, uint64_t seed, int step)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)step * 7919u + 1;
    for (size_t i = 0; i < n; i++) {
        double scale = pow(10.0, (double)(i % 7) - 3.0);
        g[i] = (float)(fl_test_uniform(&s) * scale);
    }
}

static bool same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* The residual of ef, and its velocity into *vel. */
static const float *state(const fl_cmp_ef_t *ef, const float **vel)
{
    const float *res = NULL;
    const float *u = NULL;
    size_t n = 0;
    fl_cmp_ef_state(ef, &res, &u, &n);
    if (vel != NULL)
        *vel = u;
    return res;
}

typedef struct work {
    float *g;
    uint32_t *idx;
    float *val;
    uint32_t *ridx;
    float *rval;
    float *mine;
    float *save_r;
    float *save_u;
    uint32_t *idx2;
    float *val2;
} work_t;

/* One zeroed block for all of it. */
static void work_alloc(work_t *w, size_t n)
{
    float *p = calloc(10 * n, sizeof(float));
    ck_assert_ptr_nonnull(p);
    w->g = p;
    w->val = p + n;
    w->rval = p + 2 * n;
    w->mine = p + 3 * n;
    w->save_r = p + 4 * n;
    w->save_u = p + 5 * n;
    w->idx = (uint32_t *)(void *)(p + 6 * n);
    w->ridx = (uint32_t *)(void *)(p + 7 * n);
    w->idx2 = (uint32_t *)(void *)(p + 8 * n);
    w->val2 = p + 9 * n;
}

static void work_free(work_t *w)
{
    free(w->g);
}

static const fl_dtype_t wires[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16};

/* Sum of everything sent plus the final residual equals the sum of the gradients. */
START_TEST(test_conservation)
{
    const size_t n = 10000;
    const int steps = 50;
    fl_dtype_t wire = wires[_i];
    work_t w;
    work_alloc(&w, n);
    double *sum_g = calloc(n, sizeof *sum_g);
    double *sum_abs = calloc(n, sizeof *sum_abs);
    double *sent = calloc(n, sizeof *sent);
    ck_assert(sum_g && sum_abs && sent);
    fl_cmp_ef_t *ef = make_ef(n, 0.0f, 0.0, wire, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.01);
    for (int t = 0; t < steps; t++) {
        gen_grad(w.g, n, 1, t);
        size_t k_out = 0;
        bool skipped = true;
        if (fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, &skipped) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        if (k_out != 100 || skipped)
            ck_abort_msg("step %d: k_out %zu skipped %d", t, k_out, (int)skipped);
        for (size_t i = 0; i < n; i++) {
            sum_g[i] += w.g[i];
            sum_abs[i] += fabs((double)w.g[i]);
        }
        for (size_t j = 0; j < k_out; j++)
            sent[w.idx[j]] += w.val[j];
    }
    const float *res = NULL;
    const float *vel = NULL;
    size_t sn = 0;
    fl_cmp_ef_state(ef, &res, &vel, &sn);
    ck_assert_uint_eq(sn, n);
    ck_assert_ptr_null(vel);
    size_t nsent = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = steps * (double)FLT_EPSILON * sum_abs[i];
        if (!(fabs(sent[i] + res[i] - sum_g[i]) <= tol))
            ck_abort_msg("wire %s: entry %zu: sent %.9g + residual %.9g != sum %.9g (tol %g)",
                         fl_dtype_name(wire), i, sent[i], (double)res[i], sum_g[i], tol);
        nsent += sent[i] != 0.0;
    }
    ck_assert_msg(nsent > 500, "only %zu entries were ever sent", nsent);
    fl_cmp_ef_destroy(&ef);
    ck_assert_ptr_null(ef);
    fl_cmp_ef_destroy(&ef); /* NULL-safe */
    fl_cmp_ws_destroy(&ws);
    free(sum_g);
    free(sum_abs);
    free(sent);
    work_free(&w);
}
END_TEST

/* Each step sends exactly fl_cmp_topk of (previous residual + gradient), kept here in a copy,
 * with the density following the warm-up schedule; the residual stays bit-identical to it. */
START_TEST(test_sends_topk_of_residual)
{
    const size_t n = 10000;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ef_t *ef = make_ef(n, 0.0f, 0.0, FL_FLOAT32, FL_NONFINITE_FAIL, "fc.weight");
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_ws_t *ws2 = new_ws();
    fl_cmp_schedule_t sch = {.density = 0.002, .warmup_epochs = 3};
    for (int t = 0; t < 50; t++) {
        fl_cmp_topk_opts_t o = topk_opts(0, fl_cmp_schedule_density(&sch, t / 10.0));
        gen_grad(w.g, n, 2, t);
        for (size_t i = 0; i < n; i++)
            w.mine[i] += w.g[i];
        size_t k_out = 0;
        size_t rk = 0;
        if (fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL) != FL_OK ||
            fl_cmp_topk(ws2, w.mine, n, &o, w.ridx, w.rval, &rk) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        if (k_out != rk || memcmp(w.idx, w.ridx, rk * sizeof *w.idx) != 0 ||
            !same_bits(w.val, w.rval, rk))
            ck_abort_msg("step %d: sent %zu pairs differ from the top %zu of the residual", t,
                         k_out, rk);
        for (size_t j = 0; j < rk; j++)
            w.mine[w.ridx[j]] -= w.rval[j];
        const float *res = state(ef, NULL);
        if (!same_bits(res, w.mine, n))
            ck_abort_msg("step %d: residual differs from the replica", t);
    }
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
    fl_cmp_ws_destroy(&ws2);
    work_free(&w);
}
END_TEST

/* A hand-computed momentum run in exact binary fractions (m = 0.5, k = 1). */
START_TEST(test_momentum_by_hand)
{
    fl_cmp_ef_t *ef = make_ef(2, 0.5f, 0.0, FL_FLOAT32, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(1, 0.01);
    const float g[3][2] = {{1.0f, 0.25f}, {0.125f, 1.0f}, {0.0f, 0.0f}};
    const uint32_t want_idx[3] = {0, 1, 0};
    const float want_val[3] = {1.0f, 1.375f, 0.1875f};
    const float want_u[3][2] = {{0.0f, 0.25f}, {0.125f, 0.0f}, {0.0f, 0.0f}};
    const float want_v[3][2] = {{0.0f, 0.25f}, {0.125f, 0.0f}, {0.0f, 0.0f}};
    for (int t = 0; t < 3; t++) {
        uint32_t idx = 9;
        float val = 0.0f;
        size_t k_out = 0;
        ck_assert_int_eq(fl_cmp_ef_step(ef, ws, g[t], &o, &idx, &val, &k_out, NULL), FL_OK);
        ck_assert_uint_eq(k_out, 1);
        ck_assert_uint_eq(idx, want_idx[t]);
        ck_assert_float_eq(val, want_val[t]);
        const float *vel = NULL;
        const float *res = state(ef, &vel);
        ck_assert_ptr_nonnull(vel);
        ck_assert_msg(res[0] == want_v[t][0] && res[1] == want_v[t][1] && vel[0] == want_u[t][0] &&
                          vel[1] == want_u[t][1],
                      "step %d: v (%g, %g) u (%g, %g)", t, (double)res[0], (double)res[1],
                      (double)vel[0], (double)vel[1]);
    }
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

/* Momentum correction against a double replica (u = m*u + g; v += u; both cleared where sent),
 * within float rounding bounded by a replica of magnitudes; the sent pairs are the top-k of
 * the accumulated v. */
START_TEST(test_momentum_replica)
{
    const size_t n = 4000;
    const int steps = 40;
    const float m = 0.9f;
    work_t w;
    work_alloc(&w, n);
    double *ud = calloc(4 * n, sizeof *ud);
    ck_assert_ptr_nonnull(ud);
    double *vd = ud + n;
    double *ua = vd + n; /* the same recurrences over |g|: the scale of the rounding error */
    double *va = ua + n;
    uint8_t *sent = malloc(n);
    ck_assert_ptr_nonnull(sent);
    fl_cmp_ef_t *ef = make_ef(n, m, 0.0, FL_FLOAT32, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.02);
    for (int t = 0; t < steps; t++) {
        gen_grad(w.g, n, 3, t);
        size_t k_out = 0;
        if (fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        for (size_t i = 0; i < n; i++) {
            ud[i] = (double)m * ud[i] + w.g[i];
            vd[i] += ud[i];
            ua[i] = (double)m * ua[i] + fabs((double)w.g[i]);
            va[i] += ua[i];
        }
        const float *vel = NULL;
        const float *res = state(ef, &vel);
        /* v before the send: the residual, and the sent value where one left */
        memcpy(w.mine, res, n * sizeof *res);
        memset(sent, 0, n);
        for (size_t j = 0; j < k_out; j++) {
            uint32_t i = w.idx[j];
            if (res[i] != 0.0f || vel[i] != 0.0f)
                ck_abort_msg("step %d: sent entry %u keeps v %g u %g", t, i, (double)res[i],
                             (double)vel[i]);
            w.mine[i] = w.val[j];
            sent[i] = 1;
        }
        for (size_t i = 0; i < n; i++) {
            double tv = 4.0 * steps * (double)FLT_EPSILON * va[i] + 1e-30;
            double tu = 4.0 * steps * (double)FLT_EPSILON * ua[i] + 1e-30;
            if (!(fabs(w.mine[i] - vd[i]) <= tv) || (!sent[i] && !(fabs(vel[i] - ud[i]) <= tu)))
                ck_abort_msg("step %d entry %zu: v %.9g u %.9g, replica v %.9g u %.9g", t, i,
                             (double)w.mine[i], (double)vel[i], vd[i], ud[i]);
        }
        size_t rk = 0;
        if (fl_cmp_topk(ws, w.mine, n, &o, w.ridx, w.rval, &rk) != FL_OK || rk != k_out ||
            memcmp(w.ridx, w.idx, rk * sizeof *w.idx) != 0 || !same_bits(w.rval, w.val, rk))
            ck_abort_msg("step %d: the sent pairs are not the top-k of v", t);
        for (size_t j = 0; j < k_out; j++) {
            uint32_t i = w.idx[j];
            ud[i] = vd[i] = ua[i] = va[i] = 0.0;
        }
    }
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
    free(ud);
    free(sent);
    work_free(&w);
}
END_TEST

static float round_trip(float v, fl_dtype_t wire)
{
    return wire == FL_FLOAT16 ? fl_f16_to_f32(fl_f32_to_f16(v)) : fl_bf16_to_f32(fl_f32_to_bf16(v));
}

/* float16/bfloat16 on the wire: values rounded to nearest, exactly representable, and the
 * residual keeps exactly what the wire type could not carry. */
START_TEST(test_wire_rounding)
{
    const size_t n = 5000;
    fl_dtype_t wire = _i ? FL_BFLOAT16 : FL_FLOAT16;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ef_t *ef = make_ef(n, 0.0f, 0.0, wire, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.05);
    size_t inexact = 0;
    for (int t = 0; t < 20; t++) {
        gen_grad(w.g, n, 4, t);
        const float *vel = NULL;
        const float *res = state(ef, &vel);
        for (size_t i = 0; i < n; i++)
            w.mine[i] = res[i] + w.g[i]; /* v after accumulation, as ef computes it */
        size_t k_out = 0;
        size_t rk = 0;
        if (fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL) != FL_OK ||
            fl_cmp_topk(ws, w.mine, n, &o, w.ridx, w.rval, &rk) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        if (rk != k_out || memcmp(w.ridx, w.idx, rk * sizeof *w.idx) != 0)
            ck_abort_msg("step %d: selection differs from the top-k of v", t);
        res = state(ef, &vel);
        for (size_t j = 0; j < k_out; j++) {
            uint32_t i = w.idx[j];
            float v = w.mine[i];
            float s = w.val[j];
            if (round_trip(s, wire) != s || s != round_trip(v, wire) || res[i] != v - s)
                ck_abort_msg("%s step %d entry %u: v %a sent %a residual %a", fl_dtype_name(wire),
                             t, i, (double)v, (double)s, (double)res[i]);
            inexact += s != v;
            w.mine[i] = res[i];
        }
        if (!same_bits(res, w.mine, n))
            ck_abort_msg("step %d: unsent entries of the residual changed", t);
    }
    ck_assert_msg(inexact > 100, "only %zu values needed rounding", inexact);
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

/* A value beyond the wire type's range (float16 above 65504, bfloat16 near FLT_MAX) must not
 * go out as Inf nor leave -Inf in the residual: the state stays finite and sent + residual
 * still holds the accumulated value. */
START_TEST(test_wire_overflow)
{
    fl_dtype_t wire = _i ? FL_BFLOAT16 : FL_FLOAT16;
    const float big = _i ? FLT_MAX : 1.0e5f;
    fl_cmp_ef_t *ef = make_ef(4, 0.0f, 0.0, wire, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(1, 0.01);
    const float g[4] = {0.5f, -big, 0.25f, 0.0f};
    uint32_t idx = 9;
    float val = 0.0f;
    size_t k_out = 0;
    int rc = fl_cmp_ef_step(ef, ws, g, &o, &idx, &val, &k_out, NULL);
    const float *res = state(ef, NULL);
    ck_assert_msg(isfinite(res[0]) && isfinite(res[1]) && isfinite(res[2]) && isfinite(res[3]),
                  "%s: residual (%g, %g, %g, %g) after sending %g (rc %d)", fl_dtype_name(wire),
                  (double)res[0], (double)res[1], (double)res[2], (double)res[3], (double)val, rc);
    if (rc == FL_OK) {
        ck_assert_uint_eq(k_out, 1);
        ck_assert_uint_eq(idx, 1);
        ck_assert_msg(isfinite(val) && round_trip(val, wire) == val, "sent %g", (double)val);
        ck_assert_msg((double)val + (double)res[1] == (double)-big, "sent %g + residual %g",
                      (double)val, (double)res[1]);
    }
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

START_TEST(test_clipping)
{
    const size_t n = 1000;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(1, 0.01);
    uint64_t s = 5;
    for (size_t i = 0; i < n; i++)
        w.g[i] = (float)fl_test_uniform(&s);
    double norm = 0.0;
    for (size_t i = 0; i < n; i++)
        norm += (double)w.g[i] * w.g[i];
    norm = sqrt(norm); /* about 18 */
    const float *res = NULL;
    const float *vel = NULL;
    size_t k_out = 0;
    /* too large: scaled to norm 1, with and without momentum */
    for (int mom = 0; mom < 2; mom++) {
        fl_cmp_ef_t *ef = make_ef(n, mom ? 0.5f : 0.0f, 1.0, FL_FLOAT32, FL_NONFINITE_FAIL, NULL);
        ck_assert_int_eq(fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL), FL_OK);
        res = state(ef, &vel);
        double total = (double)w.val[0] * w.val[0];
        for (size_t i = 0; i < n; i++) {
            double want = (double)w.g[i] / norm;
            double got = i == w.idx[0] ? w.val[0] : res[i];
            double tol = 2.0 * FLT_EPSILON * fabs(want);
            if (!(fabs(got - want) <= tol) ||
                (mom && i != w.idx[0] && !(fabs(vel[i] - want) <= tol)))
                ck_abort_msg("momentum %d entry %zu: %.9g, want %.9g", mom, i, got, want);
            total += (double)res[i] * res[i];
        }
        ck_assert_msg(fabs(sqrt(total) - 1.0) < 1e-5, "clipped norm %.9g", sqrt(total));
        fl_cmp_ef_destroy(&ef);
    }
    /* within the limit, or no limit: untouched bit for bit */
    const double limits[] = {norm * 1.01, 0.0};
    for (size_t l = 0; l < NELEM(limits); l++) {
        fl_cmp_ef_t *ef = make_ef(n, 0.0f, limits[l], FL_FLOAT32, FL_NONFINITE_FAIL, NULL);
        ck_assert_int_eq(fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL), FL_OK);
        res = state(ef, NULL);
        memcpy(w.mine, res, n * sizeof *res);
        w.mine[w.idx[0]] = w.val[0];
        ck_assert_msg(same_bits(w.mine, w.g, n), "max_norm %g changed the gradient", limits[l]);
        fl_cmp_ef_destroy(&ef);
    }
    ck_assert(fl_cmp_clip_factor(10.0, 1.0) == 0.1);
    ck_assert(fl_cmp_clip_factor(4.0, 2.0) == 0.5);
    ck_assert(fl_cmp_clip_factor(0.5, 1.0) == 1.0);
    ck_assert(fl_cmp_clip_factor(1.0, 1.0) == 1.0);
    ck_assert(fl_cmp_clip_factor(0.0, 1.0) == 1.0);
    ck_assert(fl_cmp_clip_factor(5.0, 0.0) == 1.0);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

/* A gradient with NaN or Inf never reaches the state: FAIL names the tensor and the first bad
 * index, SKIP reports a skipped step; afterwards the run matches one that never saw it. */
START_TEST(test_nonfinite_gradient)
{
    const size_t n = 3000;
    fl_cmp_nonfinite_t policy = _i ? FL_NONFINITE_SKIP : FL_NONFINITE_FAIL;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ef_t *ef = make_ef(n, 0.5f, 0.0, FL_FLOAT16, policy, "enc.layer0");
    fl_cmp_ef_t *clean = make_ef(n, 0.5f, 0.0, FL_FLOAT16, policy, "enc.layer0");
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.01);
    size_t k_out = 0;
    size_t k2 = 0;
    bool skipped = false;
    const float bad[] = {NAN, INFINITY, -INFINITY, -NAN};
    const size_t pos[] = {1234, 0, n - 1, 17};
    for (int t = 0; t < 12; t++) {
        gen_grad(w.g, n, 6, t);
        if (t % 3 == 2) { /* a bad step */
            const float *vel = NULL;
            const float *res = state(ef, &vel);
            memcpy(w.save_r, res, n * sizeof *res);
            memcpy(w.save_u, vel, n * sizeof *vel);
            size_t b = (size_t)(t / 3);
            w.g[pos[b]] = bad[b];
            w.g[n - 1] = NAN; /* a later one is not the one named */
            if (pos[b] == n - 1)
                w.g[n - 1] = bad[b];
            int rc = fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, &skipped);
            const char *msg = fl_last_error();
            char want[64];
            snprintf(want, sizeof want, "index %zu ", pos[b]);
            if (policy == FL_NONFINITE_FAIL && (rc != FL_ENONFINITE || skipped ||
                                                !strstr(msg, "enc.layer0") || !strstr(msg, want)))
                ck_abort_msg("step %d: rc %d skipped %d: %s", t, rc, (int)skipped, msg);
            if (policy == FL_NONFINITE_SKIP && (rc != FL_OK || k_out != 0 || !skipped))
                ck_abort_msg("step %d: rc %d k_out %zu skipped %d", t, rc, k_out, (int)skipped);
            res = state(ef, &vel);
            if (!same_bits(res, w.save_r, n) || !same_bits(vel, w.save_u, n))
                ck_abort_msg("step %d: the bad gradient changed the state", t);
            if (policy == FL_NONFINITE_SKIP) {
                ck_assert_int_eq(fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL),
                                 FL_OK);
                ck_assert_uint_eq(k_out, 0);
            }
            continue;
        }
        skipped = true;
        if (fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, &skipped) != FL_OK ||
            fl_cmp_ef_step(clean, ws, w.g, &o, w.idx2, w.val2, &k2, NULL) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        if (skipped || k_out != k2 || memcmp(w.idx, w.idx2, k2 * sizeof *w.idx2) != 0 ||
            !same_bits(w.val, w.val2, k2))
            ck_abort_msg("step %d: differs from the run without bad steps", t);
    }
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ef_destroy(&clean);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

/* Save (residual, velocity), restore into a fresh object, continue both: bit-identical. */
START_TEST(test_state_round_trip)
{
    const size_t n = 3000;
    const float m = _i ? 0.9f : 0.0f;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ef_t *a = make_ef(n, m, 5.0, FL_BFLOAT16, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.02);
    size_t k_out = 0;
    size_t k2 = 0;
    for (int t = 0; t < 10; t++) {
        gen_grad(w.g, n, 8, t);
        ck_assert_int_eq(fl_cmp_ef_step(a, ws, w.g, &o, w.idx, w.val, &k_out, NULL), FL_OK);
    }
    const float *res = NULL;
    const float *vel = NULL;
    size_t sn = 0;
    fl_cmp_ef_state(a, &res, &vel, &sn);
    ck_assert_uint_eq(sn, n);
    ck_assert(m > 0.0f ? vel != NULL : vel == NULL);
    memcpy(w.save_r, res, n * sizeof *res);
    if (vel != NULL)
        memcpy(w.save_u, vel, n * sizeof *vel);
    fl_cmp_ef_t *b = make_ef(n, m, 5.0, FL_BFLOAT16, FL_NONFINITE_FAIL, NULL);
    ck_assert_int_eq(fl_cmp_ef_restore(b, w.save_r, vel != NULL ? w.save_u : NULL, n), FL_OK);
    for (int t = 10; t < 20; t++) {
        gen_grad(w.g, n, 8, t);
        if (fl_cmp_ef_step(a, ws, w.g, &o, w.idx, w.val, &k_out, NULL) != FL_OK ||
            fl_cmp_ef_step(b, ws, w.g, &o, w.idx2, w.val2, &k2, NULL) != FL_OK)
            ck_abort_msg("step %d: %s", t, fl_last_error());
        if (k_out != k2 || memcmp(w.idx, w.idx2, k2 * sizeof *w.idx2) != 0 ||
            !same_bits(w.val, w.val2, k2))
            ck_abort_msg("step %d: the restored copy sends other pairs", t);
    }
    const float *res_b = NULL;
    const float *vel_b = NULL;
    fl_cmp_ef_state(a, &res, &vel, &sn);
    fl_cmp_ef_state(b, &res_b, &vel_b, &sn);
    ck_assert(same_bits(res, res_b, n));
    ck_assert(vel == NULL || same_bits(vel, vel_b, n));

    /* refused restores leave the state as it was */
    memcpy(w.save_r, res_b, n * sizeof *res_b);
    memcpy(w.mine, res_b, n * sizeof *res_b);
    ck_assert_int_eq(fl_cmp_ef_restore(b, w.mine, NULL, n + 1), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "3001") && strstr(fl_last_error(), "3000"), "%s",
                  fl_last_error());
    w.mine[2999] = NAN;
    ck_assert_int_eq(fl_cmp_ef_restore(b, w.mine, NULL, n), FL_ENONFINITE);
    ck_assert_msg(strstr(fl_last_error(), "index 2999"), "%s", fl_last_error());
    w.mine[2999] = 0.0f;
    if (m > 0.0f) {
        memset(w.save_u, 0, n * sizeof *w.save_u);
        w.save_u[5] = -INFINITY;
        ck_assert_int_eq(fl_cmp_ef_restore(b, w.mine, w.save_u, n), FL_ENONFINITE);
        ck_assert_msg(strstr(fl_last_error(), "index 5 "), "%s", fl_last_error());
    }
    fl_cmp_ef_state(b, &res_b, &vel_b, &sn);
    ck_assert(same_bits(res_b, w.save_r, n));
    /* velocity NULL restores zeros */
    ck_assert_int_eq(fl_cmp_ef_restore(b, w.mine, NULL, n), FL_OK);
    fl_cmp_ef_state(b, &res_b, &vel_b, &sn);
    for (size_t i = 0; vel_b != NULL && i < n; i++)
        if (vel_b[i] != 0.0f)
            ck_abort_msg("velocity[%zu] = %g after a restore without velocity", i,
                         (double)vel_b[i]);
    fl_cmp_ef_destroy(&a);
    fl_cmp_ef_destroy(&b);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

/* The residual is part of a rank's state: it goes into a checkpoint file (safetensors, as the
 * worker writes them) and comes back; a rank resumed from the file sends exactly what the
 * uninterrupted one sends. */
START_TEST(test_state_through_checkpoint_file)
{
    const size_t n = 5000;
    const float m = 0.9f;
    work_t w;
    work_alloc(&w, n);
    fl_cmp_ef_t *a = make_ef(n, m, 0.0, FL_FLOAT16, FL_NONFINITE_FAIL, NULL);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(0, 0.01);
    size_t k_out = 0;
    size_t k2 = 0;
    for (int t = 0; t < 8; t++) {
        gen_grad(w.g, n, 11, t);
        ck_assert_int_eq(fl_cmp_ef_step(a, ws, w.g, &o, w.idx, w.val, &k_out, NULL), FL_OK);
    }
    const float *res = NULL;
    const float *vel = NULL;
    size_t sn = 0;
    fl_cmp_ef_state(a, &res, &vel, &sn);
    char dir[] = "/tmp/flodl-ef-XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/rank0.safetensors", dir);
    fl_st_tensor_t t[2] = {
        {"ef.gradient.residual", FL_FLOAT32, 1, {n}, res, n * sizeof(float)},
        {"ef.gradient.velocity", FL_FLOAT32, 1, {n}, vel, n * sizeof(float)},
    };
    fl_st_meta_t meta = {"flodl.step", "8"};
    ck_assert_msg(fl_st_write(path, t, 2, &meta, 1) == FL_OK, "%s", fl_last_error());

    fl_st_file_t *f = NULL;
    ck_assert_msg(fl_st_open(path, 0, &f) == FL_OK, "%s", fl_last_error());
    ck_assert(fl_st_verified(f));
    const fl_st_tensor_t *r = fl_st_find(f, "ef.gradient.residual");
    const fl_st_tensor_t *u = fl_st_find(f, "ef.gradient.velocity");
    ck_assert(r != NULL && u != NULL && r->shape[0] == n && u->shape[0] == n);
    fl_cmp_ef_t *b = make_ef(n, m, 0.0, FL_FLOAT16, FL_NONFINITE_FAIL, NULL);
    ck_assert_int_eq(fl_cmp_ef_restore(b, r->data, u->data, n), FL_OK);
    fl_st_close(&f);
    unlink(path);
    rmdir(dir);
    for (int s = 8; s < 16; s++) {
        gen_grad(w.g, n, 11, s);
        if (fl_cmp_ef_step(a, ws, w.g, &o, w.idx, w.val, &k_out, NULL) != FL_OK ||
            fl_cmp_ef_step(b, ws, w.g, &o, w.idx2, w.val2, &k2, NULL) != FL_OK)
            ck_abort_msg("step %d: %s", s, fl_last_error());
        if (k_out != k2 || memcmp(w.idx, w.idx2, k2 * sizeof *w.idx2) != 0 ||
            !same_bits(w.val, w.val2, k2))
            ck_abort_msg("step %d: the rank resumed from the file sends other pairs", s);
    }
    fl_cmp_ef_destroy(&a);
    fl_cmp_ef_destroy(&b);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

static void expect_create_einval(const fl_cmp_ef_opts_t *o, const char *field)
{
    static char dummy;
    fl_cmp_ef_t *ef = (fl_cmp_ef_t *)(void *)&dummy; /* not NULL: create must clear it */
    int rc = fl_cmp_ef_create(o, &ef);
    if (rc != FL_EINVAL || ef != NULL || strstr(fl_last_error(), field) == NULL)
        ck_abort_msg("want FL_EINVAL naming '%s': rc %d: %s", field, rc, fl_last_error());
}

START_TEST(test_create_validation)
{
    fl_cmp_ef_opts_t o;
    fl_cmp_ef_opts_init(&o);
    ck_assert_uint_eq(o.n, 0);
    ck_assert(o.momentum == 0.0f && o.max_norm == 0.0);
    ck_assert_int_eq(o.wire, FL_FLOAT32);
    ck_assert_int_eq(o.on_nonfinite, FL_NONFINITE_FAIL);
    o.name = "emb";
    expect_create_einval(&o, "n = 0");
    ck_assert_msg(strstr(fl_last_error(), "emb"), "%s", fl_last_error());
#if SIZE_MAX > UINT32_MAX
    o.n = (size_t)UINT32_MAX + 1;
    expect_create_einval(&o, "4294967296");
#endif
    o.n = 10;
    const float moms[] = {-0.1f, 1.0f, 1.5f, NAN};
    for (size_t i = 0; i < NELEM(moms); i++) {
        o.momentum = moms[i];
        expect_create_einval(&o, "momentum");
    }
    o.momentum = 0.0f;
    const double norms[] = {-1.0, INFINITY, NAN};
    for (size_t i = 0; i < NELEM(norms); i++) {
        o.max_norm = norms[i];
        expect_create_einval(&o, "max_norm");
    }
    o.max_norm = 0.0;
    o.wire = FL_INT32;
    expect_create_einval(&o, "wire");
    o.wire = FL_FLOAT64;
    expect_create_einval(&o, "wire");
    o.wire = FL_BFLOAT16;
    o.on_nonfinite = (fl_cmp_nonfinite_t)3;
    expect_create_einval(&o, "on_nonfinite");
    o.on_nonfinite = FL_NONFINITE_SKIP;
    o.momentum = 0.999f;
    o.max_norm = 1e30;
    fl_cmp_ef_t *ef = NULL;
    ck_assert_int_eq(fl_cmp_ef_create(&o, &ef), FL_OK);
    /* a bad top-k request is refused before the state is touched */
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t t = topk_opts(11, 0.01);
    const float g[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    uint32_t idx[11];
    float val[11];
    size_t k_out = 5;
    ck_assert_int_eq(fl_cmp_ef_step(ef, ws, g, &t, idx, val, &k_out, NULL), FL_EINVAL);
    ck_assert_msg(strstr(fl_last_error(), "11"), "%s", fl_last_error());
    ck_assert(fl_cmp_ef_residual_norm(ef) == 0.0);
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
}
END_TEST

START_TEST(test_residual_norm)
{
    fl_cmp_ef_t *ef = make_ef(3, 0.0f, 0.0, FL_FLOAT32, FL_NONFINITE_FAIL, NULL);
    ck_assert(fl_cmp_ef_residual_norm(ef) == 0.0);
    fl_cmp_ws_t *ws = new_ws();
    fl_cmp_topk_opts_t o = topk_opts(1, 0.01);
    const float g[3] = {3.0f, -4.0f, 12.0f};
    uint32_t idx[3];
    float val[3];
    size_t k_out = 0;
    ck_assert_int_eq(fl_cmp_ef_step(ef, ws, g, &o, idx, val, &k_out, NULL), FL_OK);
    ck_assert_uint_eq(idx[0], 2);
    ck_assert(fl_cmp_ef_residual_norm(ef) == 5.0); /* (3, -4, 0) */
    fl_cmp_ef_destroy(&ef);

    const size_t n = 2000;
    work_t w;
    work_alloc(&w, n);
    ef = make_ef(n, 0.5f, 0.0, FL_FLOAT16, FL_NONFINITE_FAIL, NULL);
    o = topk_opts(0, 0.05);
    for (int t = 0; t < 5; t++) {
        gen_grad(w.g, n, 9, t);
        ck_assert_int_eq(fl_cmp_ef_step(ef, ws, w.g, &o, w.idx, w.val, &k_out, NULL), FL_OK);
    }
    const float *res = state(ef, NULL);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++)
        sum += (double)res[i] * res[i];
    double got = fl_cmp_ef_residual_norm(ef);
    ck_assert_msg(sum > 0.0 && fabs(got - sqrt(sum)) <= 1e-12 * sqrt(sum), "norm %.17g vs %.17g",
                  got, sqrt(sum));
    fl_cmp_ef_destroy(&ef);
    fl_cmp_ws_destroy(&ws);
    work_free(&w);
}
END_TEST

static bool close_rel(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fabs(b);
}

START_TEST(test_schedule)
{
    fl_cmp_schedule_t s;
    fl_cmp_schedule_init(&s);
    ck_assert(s.density == 0.001 && s.warmup_epochs == 4);
    /* DGC: 25%, 6.25%, 1.56%, 0.4%, then 0.1% */
    const double want[] = {0.25118864315095801,
                           0.063095734448019331,
                           0.015848931924611134,
                           0.0039810717055349725,
                           0.001,
                           0.001};
    const double epochs[] = {0, 1, 2, 3, 4, 10};
    for (size_t i = 0; i < NELEM(want); i++) {
        double d = fl_cmp_schedule_density(&s, epochs[i]);
        if (!close_rel(d, want[i], 1e-12) ||
            !close_rel(d, pow(0.001, fmin(epochs[i] + 1.0, 5.0) / 5.0), 1e-12))
            ck_abort_msg("epoch %g: density %.17g, want %.17g", epochs[i], d, want[i]);
    }
    /* fractional epochs count whole epochs; negative ones are epoch 0 */
    ck_assert(fl_cmp_schedule_density(&s, 2.7) == fl_cmp_schedule_density(&s, 2.0));
    ck_assert(fl_cmp_schedule_density(&s, 3.999) == fl_cmp_schedule_density(&s, 3.0));
    ck_assert(fl_cmp_schedule_density(&s, 0.5) == fl_cmp_schedule_density(&s, 0.0));
    ck_assert(fl_cmp_schedule_density(&s, -1.0) == fl_cmp_schedule_density(&s, 0.0));
    ck_assert(fl_cmp_schedule_density(&s, -0.5) == fl_cmp_schedule_density(&s, 0.0));
    ck_assert(fl_cmp_schedule_density(&s, 4.5) == 0.001);
    double prev = 1.0;
    for (int e10 = -10; e10 < 80; e10++) {
        double d = fl_cmp_schedule_density(&s, e10 / 10.0);
        if (!(d <= prev && d >= 0.001))
            ck_abort_msg("epoch %g: density %g after %g", e10 / 10.0, d, prev);
        prev = d;
    }
    /* no warm-up: the final density from the start */
    s.warmup_epochs = 0;
    s.density = 0.01;
    ck_assert(fl_cmp_schedule_density(&s, 0.0) == 0.01);
    ck_assert(fl_cmp_schedule_density(&s, -3.0) == 0.01);
    ck_assert(fl_cmp_schedule_density(&s, 7.5) == 0.01);
    s.warmup_epochs = 1;
    ck_assert(close_rel(fl_cmp_schedule_density(&s, 0.0), 0.1, 1e-12));
    ck_assert(fl_cmp_schedule_density(&s, 1.0) == 0.01);
}
END_TEST

Suite *cmp_ef_suite(void);
Suite *cmp_ef_suite(void)
{
    Suite *s = suite_create("cmp_ef");
    TCase *t = tcase_create("feedback");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_conservation, 0, (int)NELEM(wires));
    tcase_add_test(t, test_sends_topk_of_residual);
    tcase_add_test(t, test_momentum_by_hand);
    tcase_add_test(t, test_momentum_replica);
    tcase_add_loop_test(t, test_wire_rounding, 0, 2);
    tcase_add_loop_test(t, test_wire_overflow, 0, 2);
    tcase_add_test(t, test_clipping);
    suite_add_tcase(s, t);

    t = tcase_create("state");
    tcase_set_timeout(t, 60);
    tcase_add_loop_test(t, test_nonfinite_gradient, 0, 2);
    tcase_add_loop_test(t, test_state_round_trip, 0, 2);
    tcase_add_test(t, test_state_through_checkpoint_file);
    tcase_add_test(t, test_create_validation);
    tcase_add_test(t, test_residual_norm);
    suite_add_tcase(s, t);

    t = tcase_create("schedule");
    tcase_add_test(t, test_schedule);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(cmp_ef_suite());
}
