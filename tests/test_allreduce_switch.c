/* The allreduce size switch: at each point where AUTO changes algorithm (fl_allreduce_pick with
 * the default small_bytes: one-shot to recursive doubling, recursive doubling to the ring) and
 * one element on either side, every algorithm the switch can pick (forced), and AUTO itself,
 * must give the same bits on every rank, for every dtype and operator it supports, over 2, 3
 * and 4 ranks. The data are small integers, exact in every type, so any order of additions gives
 * one result: sums, maxima and minima are also checked against the exact reference, averages
 * across algorithms and ranks (by a hash of the bytes). AUTO must report the algorithm the
 * switch names. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAX_CASES 256
#define MAX_RANKS 4
#define NALGOS 4

static const fl_dtype_t dtypes[] = {FL_FLOAT32, FL_FLOAT16, FL_BFLOAT16, FL_FLOAT64,
                                    FL_INT32,   FL_UINT8,   FL_INT64};
static const fl_op_t ops[] = {FL_SUM, FL_AVG, FL_MAX, FL_MIN};
static const fl_algo_t algos[NALGOS] = {FL_ALGO_DIRECT, FL_ALGO_RD, FL_ALGO_RING, FL_ALGO_AUTO};

typedef struct sw_case {
    fl_dtype_t dt;
    fl_op_t op;
    size_t count;
} sw_case_t;

typedef struct sw_arg {
    fl_algo_t algo;
    size_t small_bytes;
    int ncases;
    sw_case_t cases[MAX_CASES];
    uint64_t hash[MAX_CASES][MAX_RANKS];
    char why[512]; /* the first wrong element, for the failure message */
} sw_arg_t;

/* Rank r's element i: an integer in 0..4 (uint8) or -2..2, exact in every type. */
static int value(int r, size_t i, fl_dtype_t dt)
{
    int v = (int)((i * 7 + (size_t)r * 3 + i / 13) % 5);
    return dt == FL_UINT8 ? v : v - 2;
}

static void put(void *buf, size_t i, fl_dtype_t dt, int v)
{
    switch (dt) {
    case FL_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case FL_FLOAT64: ((double *)buf)[i] = v; break;
    case FL_FLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_f16((float)v); break;
    case FL_BFLOAT16: ((uint16_t *)buf)[i] = fl_f32_to_bf16((float)v); break;
    case FL_INT32: ((int32_t *)buf)[i] = v; break;
    case FL_INT64: ((int64_t *)buf)[i] = v; break;
    case FL_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static double get(const void *buf, size_t i, fl_dtype_t dt)
{
    switch (dt) {
    case FL_FLOAT32: return ((const float *)buf)[i];
    case FL_FLOAT64: return ((const double *)buf)[i];
    case FL_FLOAT16: return fl_f16_to_f32(((const uint16_t *)buf)[i]);
    case FL_BFLOAT16: return fl_bf16_to_f32(((const uint16_t *)buf)[i]);
    case FL_INT32: return ((const int32_t *)buf)[i];
    case FL_INT64: return (double)((const int64_t *)buf)[i];
    case FL_UINT8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

static uint64_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* The switch points in bytes, for n ranks and the default small_bytes: every size where the
 * pick differs from the pick one byte below. */
static int switch_points(int n, size_t small_bytes, size_t *out, int cap)
{
    int k = 0;
    size_t cand[] = {FL_DIRECT_MAX_BYTES, small_bytes};
    for (size_t j = 0; j < sizeof cand / sizeof cand[0]; j++)
        if (fl_allreduce_pick(n, cand[j], small_bytes) !=
                fl_allreduce_pick(n, cand[j] + 1, small_bytes) &&
            k < cap)
            out[k++] = cand[j];
    return k;
}

static void make_cases(sw_arg_t *a, int n)
{
    size_t pts[4];
    int np = switch_points(n, a->small_bytes, pts, 4);
    a->ncases = 0;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        size_t esz = fl_dtype_size(dtypes[d]);
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            if (!fl_op_supports(ops[o], dtypes[d]))
                continue;
            for (int p = 0; p < np; p++) {
                for (int delta = -1; delta <= 1; delta++) {
                    ck_assert(a->ncases < MAX_CASES);
                    sw_case_t *c = &a->cases[a->ncases++];
                    c->dt = dtypes[d];
                    c->op = ops[o];
                    c->count = (size_t)((long)(pts[p] / esz) + delta);
                }
            }
        }
    }
}

static double reference(fl_op_t op, fl_dtype_t dt, int n, size_t i)
{
    double acc = value(0, i, dt);
    for (int r = 1; r < n; r++) {
        double v = value(r, i, dt);
        acc = op == FL_MAX ? fmax(acc, v) : op == FL_MIN ? fmin(acc, v) : acc + v;
    }
    return acc;
}

static int sw_rank(fl_comm_t *comm, void *arg)
{
    sw_arg_t *a = arg;
    int r = fl_comm_rank(comm);
    int n = fl_comm_size(comm);
    size_t cap = 0;
    for (int k = 0; k < a->ncases; k++) {
        size_t b = a->cases[k].count * fl_dtype_size(a->cases[k].dt);
        cap = b > cap ? b : cap;
    }
    uint8_t *in = malloc(cap + 8);
    uint8_t *out = malloc(cap + 8);
    ck_assert(in != NULL && out != NULL);
    int rc = FL_OK;
    for (int k = 0; k < a->ncases && rc == FL_OK; k++) {
        const sw_case_t *c = &a->cases[k];
        size_t bytes = c->count * fl_dtype_size(c->dt);
        for (size_t i = 0; i < c->count; i++)
            put(in, i, c->dt, value(r, i, c->dt));
        /* Every other case in place, the others into a separate buffer. */
        void *dst = k % 2 ? (void *)in : (void *)out;
        rc = fl_allreduce(comm, in, dst, c->count, c->dt, c->op);
        if (rc != FL_OK)
            break;
        fl_comm_stats_t st;
        fl_comm_get_stats(comm, &st);
        fl_algo_t want =
            a->algo == FL_ALGO_AUTO ? fl_allreduce_pick(n, bytes, a->small_bytes) : a->algo;
        if (st.last_algo != want) {
            snprintf(a->why, sizeof a->why, "rank %d, %zu x %s: ran algorithm %d, want %d", r,
                     c->count, fl_dtype_name(c->dt), (int)st.last_algo, (int)want);
            rc = FL_EINVAL;
            break;
        }
        for (size_t i = 0; i < c->count && c->op != FL_AVG; i++) {
            double got = get(dst, i, c->dt);
            double ref = reference(c->op, c->dt, n, i);
            if (got != ref) {
                snprintf(a->why, sizeof a->why,
                         "rank %d, algorithm %d, %zu x %s %s: element "
                         "%zu is %g, want %g",
                         r, (int)a->algo, c->count, fl_dtype_name(c->dt), fl_op_name(c->op), i, got,
                         ref);
                rc = FL_EINVAL;
                break;
            }
        }
        a->hash[k][r] = fnv(dst, bytes);
    }
    free(in);
    free(out);
    return rc;
}

START_TEST(test_switch_points_agree)
{
    int n = 2 + _i;
    static sw_arg_t runs[NALGOS];
    fl_comm_opts_t dflt;
    fl_comm_opts_init(&dflt);
    for (int a = 0; a < NALGOS; a++) {
        memset(&runs[a], 0, sizeof runs[a]);
        runs[a].algo = algos[a];
        runs[a].small_bytes = dflt.small_bytes;
        make_cases(&runs[a], n);
        ck_assert_msg(runs[a].ncases > 0, "%d ranks: no switch points", n);
        fl_comm_opts_t o;
        fl_comm_opts_init(&o);
        o.host = "127.0.0.1";
        o.timeout_ms = 30000;
        o.rendezvous_timeout_ms = 20000;
        o.log_level = FL_LOG_ERROR;
        o.algo = algos[a];
        char err[1024] = "";
        int rc = fl_test_run_ranks(n, &o, sw_rank, &runs[a], err, sizeof err);
        ck_assert_msg(rc == FL_OK, "%d ranks, algorithm %d: %s %s", n, (int)algos[a], err,
                      runs[a].why);
    }
    for (int k = 0; k < runs[0].ncases; k++) {
        const sw_case_t *c = &runs[0].cases[k];
        for (int a = 0; a < NALGOS; a++) {
            for (int r = 0; r < n; r++) {
                if (runs[a].hash[k][r] != runs[0].hash[k][0])
                    ck_abort_msg("%d ranks, %zu x %s %s: algorithm %d on rank %d gives other "
                                 "bits than one-shot on rank 0",
                                 n, c->count, fl_dtype_name(c->dt), fl_op_name(c->op),
                                 (int)algos[a], r);
            }
        }
    }
}
END_TEST

START_TEST(test_switch_points_exist)
{
    /* Up to FL_DIRECT_MAX_RANKS ranks all three algorithms are picked; beyond, two. */
    fl_comm_opts_t o;
    fl_comm_opts_init(&o);
    size_t pts[4];
    ck_assert_int_eq(switch_points(4, o.small_bytes, pts, 4), 2);
    ck_assert_int_eq(fl_allreduce_pick(4, pts[0], o.small_bytes), FL_ALGO_DIRECT);
    ck_assert_int_eq(fl_allreduce_pick(4, pts[0] + 1, o.small_bytes), FL_ALGO_RD);
    ck_assert_int_eq(fl_allreduce_pick(4, pts[1], o.small_bytes), FL_ALGO_RD);
    ck_assert_int_eq(fl_allreduce_pick(4, pts[1] + 1, o.small_bytes), FL_ALGO_RING);
    ck_assert_int_eq(switch_points(FL_DIRECT_MAX_RANKS + 1, o.small_bytes, pts, 4), 1);
    ck_assert_int_eq(fl_allreduce_pick(FL_DIRECT_MAX_RANKS + 1, 1, o.small_bytes), FL_ALGO_RD);
    /* small_bytes below the one-shot limit: one-shot up to it, then the ring. */
    ck_assert_int_eq(fl_allreduce_pick(4, 4096, 4096), FL_ALGO_DIRECT);
    ck_assert_int_eq(fl_allreduce_pick(4, 4097, 4096), FL_ALGO_RING);
    ck_assert_int_eq(fl_allreduce_pick(4, 1, 0), FL_ALGO_RING);
}
END_TEST

Suite *allreduce_switch_suite(void);
Suite *allreduce_switch_suite(void)
{
    Suite *s = suite_create("allreduce_switch");
    TCase *t = tcase_create("switch");
    tcase_set_timeout(t, 240);
    tcase_add_test(t, test_switch_points_exist);
    tcase_add_loop_test(t, test_switch_points_agree, 0, 3);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    return fl_test_run(allreduce_switch_suite());
}
